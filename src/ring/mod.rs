//! Lock-free ring algorithms, written once over the `crate::sync` shim so
//! the same code runs on hardware queues, the software device and loom's
//! model checker.
//!
//! - [`mp`]: multi-producer posting into one send queue: atomic
//!   reservation in basic blocks, in-order publication, a coalesced
//!   doorbell, and retirement by the completion poller on another thread.
//! - [`submit`]: an MPSC submission ring for
//!   poll-mode services: many threads submit descriptors, one poll-mode
//!   thread drains them in batches and returns completions through
//!   per-submitter SPSC rings.

pub mod mp;
pub mod submit;
