//! The cross-process software fabric (docs/spec/fabric.md,
//! docs/architecture.md §9b): RC QPs of software devices in different
//! processes on one host, connected through shared-memory links.
//!
//! Each device that joins the fabric has a fabric GID (its port's GID
//! table entry 0) naming the process and the device. A QP moved to RTR
//! with a fabric GID other than its own device's is a *remote* QP: its
//! send WQEs are still copied out of the mlx5 ring and validated by the
//! device's own parser, but instead of executing them against a local QP
//! the device sends them as request packets through the QP's link, and
//! the peer's device executes them against its own memory-region table
//! and receive queues (the responder owns every check on its memory).
//! Responses come back through the same link and complete the WQEs in
//! order.
//!
//! Modules: [`shm`] maps named POSIX shared-memory segments; [`ring`] is
//! the single-producer byte-record ring inside them; [`wire`] encodes the
//! packets; [`link`] is one QP's pair of segments; [`peer`] tells whether
//! the process behind a fabric GID is still alive. The engine side lives
//! in [`requester`] (sending, completing, timeouts) and [`responder`]
//! (executing a peer's requests).

#[cfg(feature = "test-utils")]
pub mod fuzzing;
pub(crate) mod link;
pub(crate) mod peer;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod ring;
pub(crate) mod shm;
pub(crate) mod wire;

use core::sync::atomic::{AtomicU32, Ordering};

/// With `RDD_FABRIC_TRACE` set in the environment, says on stderr why
/// remote QP `qpn` of this process fails a WR or its link (a diagnostic
/// for tests and users chasing an unexpected error; off by default).
pub(crate) fn trace(qpn: u32, what: core::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("RDD_FABRIC_TRACE").is_some()) {
        std::eprintln!(
            "rdma-direct fabric: pid {} QP {qpn:#x}: {what}",
            std::process::id()
        );
    }
}

/// The first eight bytes of every fabric GID: a link-local prefix
/// (`fe80::`) followed by "rdfb" and the protocol version.
pub(crate) const GID_PREFIX: [u8; 8] = [0xfe, 0x80, b'r', b'd', b'f', b'b', 0, 1];

/// Whether `gid` is a fabric GID.
pub(crate) fn is_fabric_gid(gid: &[u8; 16]) -> bool {
    gid[..8] == GID_PREFIX
}

/// The process id a fabric GID names.
pub(crate) fn gid_pid(gid: &[u8; 16]) -> u32 {
    u32::from_be_bytes([gid[8], gid[9], gid[10], gid[11]])
}

/// A new fabric GID for a device of this process: the prefix, the
/// process id and a nonce that differs between the devices one process
/// makes (a counter) and between processes that reuse a pid (the clock).
pub(crate) fn new_gid() -> [u8; 16] {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    // Relaxed: the counter only has to hand out distinct values.
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u32);
    let nonce = t.rotate_left(8) ^ n.wrapping_mul(0x9e37_79b9);
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&GID_PREFIX);
    g[8..12].copy_from_slice(&std::process::id().to_be_bytes());
    g[12..16].copy_from_slice(&nonce.to_be_bytes());
    g
}

/// Hex of the part of a fabric GID that identifies the device (pid and
/// nonce), as segment names carry it.
pub(crate) fn gid_tag(gid: &[u8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, b) in gid[8..16].iter().enumerate() {
        out[2 * i] = hex(b >> 4);
        out[2 * i + 1] = hex(b & 15);
    }
    out
}

fn hex(n: u8) -> u8 {
    if n < 10 {
        b'0' + n
    } else {
        b'a' + n - 10
    }
}
