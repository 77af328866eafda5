//! The message workload and the strict RNR attributes shared by the
//! credit flow-control tests (software device and rxe; included with
//! `#[path]`).

use rdma_direct::api::ConnectAttr;

/// Largest message of the workload.
pub const MSG_MAX: usize = 64;

/// Message `seq`: its number (little-endian) then a pattern, 8 to 64 bytes.
pub fn message(seq: u64, buf: &mut [u8; MSG_MAX]) -> usize {
    let len = 8 + (seq as usize * 7) % (MSG_MAX - 7);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[8..len].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    len
}

/// Checks that `msg` is message `seq`, byte for byte.
pub fn check(seq: u64, msg: &[u8]) {
    let mut want = [0u8; MSG_MAX];
    let len = message(seq, &mut want);
    assert_eq!(msg.len(), len, "message {seq}: length");
    assert_eq!(msg, &want[..len], "message {seq}: payload");
}

/// Any RNR NAK fails the requester's QP at once (`rnr_retry = 0`), with
/// the shortest RNR timer: any RNR at all shows up as an error.
pub fn strict() -> ConnectAttr {
    ConnectAttr {
        rnr_retry: 0,
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    }
}
