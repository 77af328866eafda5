//! Seeds of `recover_ops` (posts, failures and recovery on a connected QP
//! pair through the C object API): scenarios in the input format
//! documented at the top of `fuzz_targets/recover_ops.rs`.

use crate::SeedWriter;

/// Op codes of `recover_ops` (the low 4 bits of the op byte).
mod op {
    pub const WRITE: u8 = 0;
    pub const READ: u8 = 1;
    pub const SEND: u8 = 2;
    pub const RECV: u8 = 3;
    pub const LIST: u8 = 4;
    pub const RING: u8 = 5;
    pub const STEP: u8 = 6;
    pub const POLL_N: u8 = 7;
    pub const POLL: u8 = 8;
    pub const FAIL: u8 = 9;
    pub const RECOVER: u8 = 10;
    pub const RECOVER_PEER: u8 = 11;
    pub const CONNECT: u8 = 12;
    pub const HEAL: u8 = 13;
    pub const CONNECT_BAD: u8 = 14;
    pub const RECOVER_BAD: u8 = 15;
}

/// Bits of a post's `f` byte.
mod f {
    pub const SIG: u8 = 1;
    pub const NTH: u8 = 2;
    pub const DEFER: u8 = 4;
    pub const STRAY: u8 = 0x10;
    pub const LOCAL: u8 = 5 << 5;
    pub const REMOTE: u8 = 6 << 5;
    pub const REMOTE2: u8 = 7 << 5;
}

/// The cfg byte: max_send_wr and max_recv_wr indices (0..4: 4, 8, 16,
/// 32), finite RNR retries, the "every Nth" index (0..8: 1, 2, 3, 4, 8,
/// 16, 64, never).
fn cfg(sq: u8, rq: u8, rnr_finite: bool, every: u8) -> SeedWriter {
    let mut w = SeedWriter::new();
    w.u8(sq | rq << 2 | (rnr_finite as u8) << 4 | every << 5);
    w
}

fn o(w: &mut SeedWriter, code: u8, side: u8, arg: u8) {
    w.u8(code | side << 4 | arg << 5);
}

fn post(w: &mut SeedWriter, code: u8, side: u8, flags: u8) {
    o(w, code, side, 0);
    w.u8(flags);
}

fn step(w: &mut SeedWriter, n: u8) {
    o(w, op::STEP, 0, n - 1);
}

fn poll(w: &mut SeedWriter, side: u8, n: u8) {
    o(w, op::POLL_N, side, 0);
    w.u8(n);
}

pub(super) fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use f::*;
    let mut v = Vec::new();

    // "Signal every 4th" WRITEs, polled; recovery retires the executed
    // unsignaled tail (the drain marker), then a reconnect.
    let mut w = cfg(2, 1, false, 3);
    for _ in 0..10 {
        post(&mut w, op::WRITE, 0, NTH);
    }
    step(&mut w, 2);
    poll(&mut w, 0, 16);
    o(&mut w, op::RECOVER, 0, 0);
    o(&mut w, op::CONNECT, 0, 0);
    post(&mut w, op::WRITE, 0, SIG);
    step(&mut w, 1);
    poll(&mut w, 0, 4);
    v.push(("every-nth-then-recover", w.finish()));

    // A WRITE with a bad remote key between unsignaled ones: the error,
    // the flushes, the responder's end; both recovered by a heal.
    let mut w = cfg(1, 1, false, 7);
    post(&mut w, op::WRITE, 0, 0);
    post(&mut w, op::WRITE, 0, 0);
    o(&mut w, op::FAIL, 0, 0);
    post(&mut w, op::WRITE, 0, 0);
    post(&mut w, op::READ, 1, SIG);
    step(&mut w, 3);
    poll(&mut w, 0, 16);
    o(&mut w, op::POLL, 1, 0);
    w.u8(8);
    o(&mut w, op::HEAL, 0, 0);
    v.push(("remote-fault-heal", w.finish()));

    // Receives and SENDs both ways, one SEND too long for its receive.
    let mut w = cfg(1, 1, false, 0);
    for _ in 0..3 {
        post(&mut w, op::RECV, 1, 0);
        post(&mut w, op::RECV, 0, 0);
    }
    post(&mut w, op::SEND, 0, SIG);
    post(&mut w, op::SEND, 1, SIG);
    step(&mut w, 2);
    poll(&mut w, 0, 16);
    poll(&mut w, 1, 16);
    post(&mut w, op::SEND, 0, SIG | REMOTE);
    post(&mut w, op::SEND, 0, SIG);
    step(&mut w, 2);
    poll(&mut w, 1, 16);
    poll(&mut w, 0, 16);
    o(&mut w, op::RECOVER_PEER, 1, 0);
    o(&mut w, op::RECOVER_PEER, 0, 0);
    v.push(("send-recv-too-long", w.finish()));

    // Deferred doorbells: sends and receives never rung, then recovery
    // (it must ring them so the device flushes them).
    let mut w = cfg(0, 0, false, 7);
    for _ in 0..4 {
        post(&mut w, op::WRITE, 0, DEFER);
    }
    post(&mut w, op::RECV, 1, DEFER);
    post(&mut w, op::WRITE, 0, 0);
    o(&mut w, op::RECOVER, 0, 0);
    o(&mut w, op::RECOVER, 1, 0);
    o(&mut w, op::CONNECT, 1, 0);
    o(&mut w, op::CONNECT, 0, 0);
    post(&mut w, op::WRITE, 1, DEFER | SIG);
    o(&mut w, op::RING, 1, 0);
    step(&mut w, 1);
    poll(&mut w, 1, 2);
    v.push(("deferred-then-recover", w.finish()));

    // Lists through rdd_qp_post_send: mixed kinds, one with a stray flag
    // (stops there), one full queue.
    let mut w = cfg(0, 2, false, 1);
    o(&mut w, op::LIST, 0, 3);
    w.bytes(&[0, SIG, 1, NTH, 2, STRAY, 0, SIG]);
    post(&mut w, op::RECV, 1, 0);
    o(&mut w, op::LIST, 0, 3);
    w.bytes(&[0, 0, 1, 0, 0, 0, 1, SIG]);
    o(&mut w, op::LIST, 0, 1);
    w.bytes(&[0, SIG, 0, SIG]);
    step(&mut w, 2);
    poll(&mut w, 0, 16);
    poll(&mut w, 1, 16);
    v.push(("post-lists", w.finish()));

    // Local faults (bad lkey on WRITE, READ, SEND and a receive), a READ
    // past the end of the peer's region.
    let mut w = cfg(1, 1, true, 7);
    post(&mut w, op::RECV, 1, LOCAL);
    post(&mut w, op::WRITE, 0, SIG | LOCAL);
    step(&mut w, 1);
    poll(&mut w, 0, 4);
    o(&mut w, op::RECOVER_PEER, 0, 1);
    post(&mut w, op::READ, 0, REMOTE);
    post(&mut w, op::SEND, 1, REMOTE2);
    step(&mut w, 1);
    poll(&mut w, 1, 4);
    poll(&mut w, 0, 4);
    post(&mut w, op::READ, 1, LOCAL | SIG);
    o(&mut w, op::RECOVER, 1, 0);
    o(&mut w, op::HEAL, 0, 0);
    v.push(("faults", w.finish()));

    // Every refused connect and recover variant, in RTS and in RESET.
    let mut w = cfg(1, 1, false, 7);
    post(&mut w, op::WRITE, 0, 0);
    for arg in 0..8 {
        o(&mut w, op::CONNECT_BAD, arg & 1, arg);
        o(&mut w, op::RECOVER_BAD, arg & 1, arg);
    }
    o(&mut w, op::CONNECT, 0, 0);
    o(&mut w, op::RECOVER, 0, 0);
    for arg in 4..8 {
        o(&mut w, op::CONNECT, 0, arg);
    }
    o(&mut w, op::CONNECT, 0, 0);
    v.push(("refused-control", w.finish()));

    v
}
