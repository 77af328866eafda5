//! Lock-free ring algorithms, written once over the [`crate::sync`] shim so
//! the same code runs on hardware queues, the software device and loom's
//! model checker.
//!
//! - [`mp`]: multi-producer posting into one send queue: atomic
//!   reservation in basic blocks, in-order publication, a coalesced
//!   doorbell, and retirement by the completion poller on another thread.

pub mod mp;
