//! The software fabric's low-level building blocks: two processes on one
//! host, each with its own [`SoftDevice`](crate::soft::SoftDevice),
//! exchange RC packets through POSIX shared memory. [`shm`] creates, opens
//! and maps the named segments; [`ring`] is the single-producer
//! single-consumer byte-record ring that lives in them. Everything the peer
//! process can write is untrusted: the consumer reads each shared word
//! once, validates it, and never forms a pointer outside the data area.

// Nothing outside the tests uses these until the fabric engine (link.rs,
// node.rs) lands; drop the allow then.
#[allow(dead_code)]
pub(crate) mod ring;
#[allow(dead_code)]
pub(crate) mod shm;
