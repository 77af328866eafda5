//! Seeds of `submit_ops` (the submission service's C calls): scenarios in
//! the input format documented at the top of
//! `fuzz_targets/submit_ops.rs`.

use crate::SeedWriter;

/// Op codes of `submit_ops` (the op byte is taken modulo 16).
mod op {
    pub const CREATE: u8 = 0;
    pub const REGISTER: u8 = 1;
    pub const UNREGISTER: u8 = 2;
    pub const POST: u8 = 3;
    pub const BURST: u8 = 4;
    pub const REAP: u8 = 5;
    pub const DRAIN: u8 = 6;
    pub const STEP: u8 = 7;
    pub const COMPLETE: u8 = 8;
    pub const PUMP: u8 = 9;
    pub const SETTLE: u8 = 10;
    pub const DESTROY: u8 = 11;
    pub const BAD_HANDLE: u8 = 12;
    pub const CONNECT: u8 = 13;
    pub const KILL_QP: u8 = 14;
    pub const FLUSH: u8 = 15;
}

/// Descriptor selector bits (`dsel`).
mod d {
    pub const BAD_LKEY: u8 = 1;
    pub const BAD_RKEY: u8 = 2;
    pub const INLINE: u8 = 4;
    pub const SIG: u8 = 8;
    pub const FENCE: u8 = 0x10;
}

/// The header byte: connect now or not, max_send_wr index (0..8:
/// 1, 2, 4, ... 128), max_inline_data index (0..4: 0, 8, 32, 64).
fn header(connect: bool, sq: u8, inline: u8) -> SeedWriter {
    let mut w = SeedWriter::new();
    w.u8(connect as u8 | sq << 1 | inline << 4);
    w
}

fn create(w: &mut SeedWriter, max_outstanding: u16, max_batch: u8, sel: u8) {
    w.u8(op::CREATE).u16(max_outstanding).u8(max_batch).u8(sel);
}

/// One descriptor of a post: `inv` 0 is valid (10..=15: a refusal).
fn desc(w: &mut SeedWriter, dsel: u8, inv: u8, len: u8, loff: u16, roff: u16) {
    w.u8(dsel).u8(inv).u8(len).u16(loff).u16(roff);
}

/// A good post of `descs` (dsel, len, offset) from submitter `pick`.
fn post(w: &mut SeedWriter, pick: u8, descs: &[(u8, u8, u16)]) {
    w.u8(op::POST).u8(pick).u8(7).u8(descs.len() as u8);
    for &(dsel, len, off) in descs {
        desc(w, dsel, 0, len, off, off);
    }
}

fn burst(w: &mut SeedWriter, pick: u8, n: u16, dsel: u8, len: u8, off: u16) {
    w.u8(op::BURST)
        .u8(pick)
        .u16(n)
        .u8(dsel)
        .u8(len)
        .u16(off)
        .u16(off);
}

fn reap(w: &mut SeedWriter, pick: u8, n: u8) {
    w.u8(op::REAP).u8(pick).u8(n).u8(7);
}

fn pump(w: &mut SeedWriter, rounds: u8) {
    w.u8(op::PUMP).u8(rounds - 1);
}

pub(super) fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use d::*;
    let mut out = Vec::new();

    // Two submitters, interleaved posts (SGE and inline, some signaled),
    // small batches, polled and reaped in pieces, then settled.
    let mut w = header(true, 4, 2);
    create(&mut w, 8, 3, 0);
    w.u8(op::REGISTER).u8(0).u8(op::REGISTER).u8(0);
    post(&mut w, 0, &[(0, 16, 0), (SIG, 8, 64), (INLINE, 20, 128)]);
    post(&mut w, 1, &[(FENCE, 32, 256), (INLINE | SIG, 0, 512)]);
    post(&mut w, 0, &[(0, 71, 1024), (0, 1, 2048)]);
    w.u8(op::DRAIN).u8(op::STEP).u8(1).u8(op::COMPLETE);
    reap(&mut w, 1, 1);
    pump(&mut w, 4);
    reap(&mut w, 0, 2);
    reap(&mut w, 1, 5);
    post(&mut w, 1, &[(SIG, 64, 3000)]);
    w.u8(op::SETTLE);
    out.push(("basic", w.finish()));

    // Device errors: a bad rkey in the middle of a batch (successes, one
    // error, flushes), then posts on the QP in ERROR; a bad lkey later.
    let mut w = header(true, 3, 0);
    create(&mut w, 0, 0, 4); // NULL config: defaults
    w.u8(op::REGISTER).u8(0);
    post(&mut w, 0, &[(0, 8, 0), (0, 8, 8)]);
    w.u8(op::POST).u8(0).u8(7).u8(3);
    desc(&mut w, 0, 0, 8, 16, 16);
    desc(&mut w, BAD_RKEY, 0, 8, 24, 24);
    desc(&mut w, 0, 0, 8, 32, 32);
    pump(&mut w, 3);
    post(&mut w, 0, &[(BAD_LKEY, 8, 40), (0, 70, 4090)]);
    pump(&mut w, 3);
    reap(&mut w, 0, 39);
    w.u8(op::SETTLE);
    out.push(("device_errors", w.finish()));

    // Every refusal: bad configs and a wrong CQ at create, every bad
    // descriptor, bad arrays and out-parameters, bad reap arguments, bad
    // handles for every call, unregister and destroy while busy.
    let mut w = header(true, 2, 1);
    create(&mut w, 8, 4, 1); // flags
    create(&mut w, 8, 4, 2); // reserved
    create(&mut w, 4097, 4, 0); // max_outstanding
    create(&mut w, 8, 65, 0); // max_batch
    create(&mut w, 8, 4, 8); // the peer's CQ
    create(&mut w, 8, 4, 0x10); // NULL out
    create(&mut w, 4, 2, 0);
    w.u8(op::REGISTER).u8(1); // NULL out
    w.u8(op::REGISTER).u8(0);
    for inv in 10..=15u8 {
        w.u8(op::POST).u8(0).u8(7).u8(2);
        desc(&mut w, SIG, 0, 8, 0, 0);
        desc(&mut w, INLINE, inv, 4, 0, 0);
    }
    for asel in 0..4u8 {
        w.u8(op::POST).u8(0).u8(asel).u8(1);
        desc(&mut w, 0, 0, 8, 0, 0);
    }
    for sel in 0..4u8 {
        w.u8(op::REAP).u8(0).u8(4).u8(sel);
    }
    w.u8(op::UNREGISTER).u8(0).u8(op::DESTROY);
    for call in 0..10u8 {
        w.u8(op::BAD_HANDLE).u8(call % 6).u8(call);
    }
    w.u8(op::FLUSH); // the QP is alive: RESOURCE_BUSY
    w.u8(op::SETTLE);
    for call in 0..10u8 {
        w.u8(op::BAD_HANDLE).u8(1 + call % 2).u8(call);
    }
    out.push(("refusals", w.finish()));

    // Never connected at first: drains refuse, then the QP connects
    // late; later it is destroyed with work queued and in flight, and
    // the flush completes everything.
    let mut w = header(false, 5, 3);
    create(&mut w, 16, 8, 0);
    w.u8(op::REGISTER).u8(0).u8(op::REGISTER).u8(0);
    post(&mut w, 0, &[(0, 8, 0), (INLINE, 60, 100)]);
    w.u8(op::DRAIN).u8(op::COMPLETE);
    w.u8(op::CONNECT);
    pump(&mut w, 2);
    burst(&mut w, 1, 40, SIG, 16, 200);
    w.u8(op::DRAIN);
    w.u8(op::KILL_QP);
    w.u8(op::DRAIN).u8(op::COMPLETE).u8(op::FLUSH);
    post(&mut w, 0, &[(0, 8, 8)]);
    w.u8(op::FLUSH);
    create(&mut w, 8, 4, 0); // the QP is gone
    reap(&mut w, 1, 39);
    w.u8(op::SETTLE);
    out.push(("late_connect_kill", w.finish()));

    // Back-pressure: one submitter past its credits, five filling the
    // ring, the QP's send queue smaller than max_outstanding; all settled.
    let mut w = header(true, 6, 0);
    create(&mut w, 128, 64, 0);
    for _ in 0..5 {
        w.u8(op::REGISTER).u8(0);
    }
    burst(&mut w, 0, 1100, 0, 8, 0);
    for s in 1..4u8 {
        burst(&mut w, s, 1024, 0, 8, 64 * s as u16);
    }
    burst(&mut w, 4, 8, 0, 8, 512);
    pump(&mut w, 8);
    burst(&mut w, 4, 8, 0, 8, 512);
    w.u8(op::SETTLE);
    out.push(("backpressure", w.finish()));

    // Services in sequence on one QP, each settled before the next; ids
    // reused after unregistering; one service destroyed with none left.
    let mut w = header(true, 1, 2);
    create(&mut w, 1, 1, 0);
    w.u8(op::REGISTER).u8(0).u8(op::REGISTER).u8(0);
    post(&mut w, 1, &[(0, 8, 0), (SIG, 8, 8), (0, 8, 16)]);
    pump(&mut w, 8);
    reap(&mut w, 1, 3);
    w.u8(op::UNREGISTER).u8(0).u8(op::REGISTER).u8(0);
    w.u8(op::SETTLE);
    create(&mut w, 0, 0, 0);
    w.u8(op::DESTROY);
    create(&mut w, 3, 2, 0);
    w.u8(op::REGISTER).u8(0);
    post(&mut w, 0, &[(INLINE, 32, 64), (0, 8, 24)]);
    w.u8(op::SETTLE);
    out.push(("sequence", w.finish()));
    out
}
