//! The committed seed corpora, written from code so they stay readable.
//!
//! `cargo +"$RDD_NIGHTLY" test` (in `fuzz/`; `RDD_NIGHTLY` is the pinned
//! nightly of `scripts/toolchains.sh`) checks that `seeds/<target>/*` match
//! what this file generates; `RDD_WRITE_SEEDS=1 cargo +"$RDD_NIGHTLY" test`
//! rewrites them. Each seed is a scenario in the input format documented
//! at the top of the target; none of them may fail on a correct crate.

use std::path::PathBuf;

use rdma_direct::{Remote, SendOp};

use crate::SeedWriter;

mod recover;
mod submit;
mod ud_srq;

/// Op codes of `wqe_encode` (the op byte is taken modulo 16).
mod wqe_op {
    pub const POST: u8 = 0;
    pub const RING: u8 = 8;
    pub const RETIRE: u8 = 10;
    pub const RETIRE_ANY: u8 = 12;
    pub const POST_LIST: u8 = 13;
    pub const RESET: u8 = 14;
    pub const STATE: u8 = 15;
}

/// Op codes of `cqe_decode`.
mod cqe_op {
    pub const SEND: u8 = 0;
    pub const RECV: u8 = 4;
    pub const RING_SQ: u8 = 6;
    pub const RING_RQ: u8 = 7;
    pub const CQE: u8 = 8;
    pub const RAW: u8 = 11;
    pub const PATCH: u8 = 12;
    pub const POLL: u8 = 13;
    pub const MISC: u8 = 15;
}

/// A seed SGE: (length, address, lkey). Lengths 0, 8 or below 256.
type SeedSge = (u32, u64, u32);

const R: Remote = Remote {
    addr: 0x7f00_0000_1000,
    rkey: 0x1234,
};

fn op_kind(op: &SendOp) -> u8 {
    match op {
        SendOp::Send => 0,
        SendOp::SendImm { .. } => 1,
        SendOp::SendInv { .. } => 2,
        SendOp::Write { .. } => 3,
        SendOp::WriteImm { .. } => 4,
        SendOp::Read { .. } => 5,
        SendOp::CompareSwap { .. } => 6,
        SendOp::FetchAdd { .. } => 7,
        SendOp::Nop => 8,
        SendOp::BindMw(_) => 9,
        SendOp::LocalInv { .. } => 10,
    }
}

/// The fields `send::read_op` reads for `op`.
fn op_fields(w: &mut SeedWriter, op: &SendOp) {
    match *op {
        SendOp::Send | SendOp::Nop => {}
        SendOp::SendImm { imm } => {
            w.u32(imm);
        }
        SendOp::SendInv { rkey } | SendOp::LocalInv { rkey } => {
            w.u32(rkey);
        }
        SendOp::BindMw(b) => {
            w.u64(b.addr);
            w.u64(b.len);
            w.u32(b.mr_lkey);
            w.u32(b.mw_rkey);
            w.u32(b.new_rkey);
            w.u32(b.access);
        }
        SendOp::Write { remote } | SendOp::Read { remote } => {
            w.u64(remote.addr).u32(remote.rkey);
        }
        SendOp::WriteImm { remote, imm } => {
            w.u64(remote.addr).u32(remote.rkey).u32(imm);
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            w.u64(remote.addr).u32(remote.rkey).u64(compare).u64(swap);
        }
        SendOp::FetchAdd { remote, add } => {
            w.u64(remote.addr).u32(remote.rkey).u64(add);
        }
    }
}

/// Payload of a `wqe_encode` WR.
enum Pl<'a> {
    Sges(&'a [SeedSge]),
    Inline(&'a [&'a [u8]]),
}

/// One `wqe_encode` WR, as `send::read_wr` reads it.
fn wqe_wr(w: &mut SeedWriter, op: SendOp, flags: u32, wr_id: u64, pl: Pl<'_>) {
    let big = flags > 0x0f;
    w.u8(op_kind(&op) | if big { 0x20 } else { 0 });
    if big {
        w.u32(flags);
    } else {
        w.u8(flags as u8);
    }
    op_fields(w, &op);
    w.u64(wr_id);
    match pl {
        Pl::Sges(s) => {
            w.u8(s.len() as u8);
            for &(len, addr, lkey) in s {
                match len {
                    0 => w.u8(0),
                    8 => w.u8(1),
                    l if l < 256 => w.u8(3).u8(l as u8),
                    _ => panic!("seed SGE length {len}"),
                };
                w.u64(addr).u32(lkey);
            }
        }
        Pl::Inline(p) => {
            w.u8(0x80 | p.len() as u8);
            for piece in p {
                w.u8(piece.len() as u8).bytes(piece);
            }
        }
    }
}

fn wqe_post(w: &mut SeedWriter, op: SendOp, flags: u32, wr_id: u64, pl: Pl<'_>) {
    w.u8(wqe_op::POST);
    wqe_wr(w, op, flags, wr_id, pl);
}

/// `wqe_encode` header.
#[allow(clippy::too_many_arguments)]
fn wqe_header(
    log_bbs: u8,
    bf_policy: u8,
    sig_all: bool,
    bf: u8,
    max_send_sge: u8,
    max_inline: u8,
    qpn: u32,
    pi: u32,
) -> SeedWriter {
    let mut w = SeedWriter::new();
    w.u8(log_bbs | bf_policy << 3 | (sig_all as u8) << 5)
        .u8(bf)
        .u8(max_send_sge - 1)
        .u8(max_inline)
        .u8(0x3c)
        .u32(qpn)
        .u32(pi);
    w
}

fn wqe_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let sg = |n: u64| -> [SeedSge; 3] {
        [
            (64, 0x10_0000 + n * 0x100, 0x11),
            (0, 0, 0),
            (200, 0x20_0000 + n * 0x100, 0x22),
        ]
    };
    let one8: [SeedSge; 1] = [(8, 0x30_0000, 0x33)];
    let text: &[u8] = b"inline payload spanning segments";
    let mut out = Vec::new();

    // Every operation once, signaled, on a 64-BB ring with BlueFlame.
    let mut w = wqe_header(6, 1, false, 3, 4, 64, 0x1c5, 0);
    let ops = [
        SendOp::Send,
        SendOp::SendImm { imm: 0xdead_beef },
        SendOp::SendInv { rkey: 0x4242 },
        SendOp::Write { remote: R },
        SendOp::WriteImm {
            remote: R,
            imm: 0x0102_0304,
        },
        SendOp::Read { remote: R },
    ];
    for (i, op) in ops.iter().enumerate() {
        let s = sg(i as u64);
        wqe_post(&mut w, *op, 2, 0x100 + i as u64, Pl::Sges(&s));
        w.u8(wqe_op::RING);
    }
    let cs = SendOp::CompareSwap {
        remote: R,
        compare: 1,
        swap: 2,
    };
    let fa = SendOp::FetchAdd { remote: R, add: 7 };
    wqe_post(&mut w, cs, 2, 0x200, Pl::Sges(&one8));
    wqe_post(&mut w, fa, 3, 0x201, Pl::Sges(&one8));
    wqe_post(&mut w, SendOp::Nop, 6, 0x202, Pl::Sges(&[]));
    w.u8(wqe_op::RING);
    wqe_post(
        &mut w,
        SendOp::Send,
        2,
        0x203,
        Pl::Inline(&[text, b"!".as_slice()]),
    );
    w.u8(wqe_op::RING);
    for _ in 0..4 {
        w.u8(wqe_op::RETIRE).u8(0);
    }
    out.push(("all_ops", w.finish()));

    // A 4-BB ring from just below a 16-bit wrap: inline WQEs that wrap the
    // ring end, unsignaled runs (forced CQEs), retire and re-post.
    let mut w = wqe_header(2, 2, false, 1, 2, 40, 0x00ab_cdef, 0xfffe);
    for i in 0..12u64 {
        let len = (i as usize * 7) % 41;
        let payload = [i as u8; 40];
        let pieces: [&[u8]; 2] = [&payload[..len / 2], &payload[len / 2..len]];
        let op = SendOp::Write { remote: R };
        wqe_post(&mut w, op, 0, 0x300 + i, Pl::Inline(&pieces));
        if i % 3 == 2 {
            w.u8(wqe_op::RING);
        }
        w.u8(wqe_op::RETIRE).u8(i as u8);
    }
    w.u8(wqe_op::RING);
    out.push(("wrap_inline", w.finish()));

    // Every rejection: too many SGEs, NOP with SGEs, atomic SGE length,
    // unaligned atomic, inline on READ and atomics, inline too large, bad
    // QP states, a full ring.
    let mut w = wqe_header(1, 0, true, 0, 2, 16, 7, 0x7fff_fffe);
    let three: [SeedSge; 3] = [(1, 1, 1), (2, 2, 2), (3, 3, 3)];
    wqe_post(&mut w, SendOp::Send, 0, 1, Pl::Sges(&three));
    wqe_post(&mut w, SendOp::Nop, 0, 2, Pl::Sges(&three[..1]));
    let short: [SeedSge; 1] = [(4, 0x40, 1)];
    wqe_post(&mut w, fa, 0, 3, Pl::Sges(&short));
    let unaligned = SendOp::CompareSwap {
        remote: Remote::new(0x1004, 1),
        compare: 0,
        swap: 0,
    };
    wqe_post(&mut w, unaligned, 0, 4, Pl::Sges(&one8));
    wqe_post(
        &mut w,
        SendOp::Read { remote: R },
        0,
        5,
        Pl::Inline(&[b"x"]),
    );
    wqe_post(&mut w, cs, 0, 6, Pl::Inline(&[b"12345678"]));
    wqe_post(&mut w, SendOp::Send, 0, 7, Pl::Inline(&[&[9u8; 17]]));
    for state in [0u8, 1, 2] {
        w.u8(wqe_op::STATE).u8(state);
        wqe_post(&mut w, SendOp::Send, 0, 8, Pl::Sges(&[]));
    }
    w.u8(wqe_op::STATE).u8(4); // error state still posts
    for i in 0..3 {
        wqe_post(&mut w, SendOp::Send, 0, 9 + i, Pl::Sges(&three[..2]));
    }
    w.u8(wqe_op::RING);
    w.u8(wqe_op::RETIRE_ANY).u8(0).u8(0).u16(0x1234);
    out.push(("rejections", w.finish()));

    // post_list stopping at an invalid WR; resets; retire by stale index.
    let mut w = wqe_header(3, 1, false, 2, 3, 100, 0x00ff_fffe, 40);
    w.u8(wqe_op::POST_LIST).u8(3);
    let s = sg(9);
    wqe_wr(&mut w, SendOp::Write { remote: R }, 2, 0x500, Pl::Sges(&s));
    wqe_wr(&mut w, SendOp::Send, 0, 0x501, Pl::Inline(&[&[5u8; 90]]));
    wqe_wr(&mut w, fa, 0, 0x502, Pl::Sges(&s));
    wqe_wr(&mut w, SendOp::Send, 0, 0x503, Pl::Sges(&[]));
    w.u8(wqe_op::RETIRE_ANY).u8(1).u8(0); // a BB inside an outstanding WQE
    w.u8(wqe_op::RETIRE).u8(1);
    w.u8(wqe_op::RESET).u8(1); // back to 0
    wqe_post(&mut w, SendOp::Send, 2, 0x504, Pl::Sges(&[]));
    w.u8(wqe_op::RESET).u8(0).u32(0xffff_fffd); // u32 wrap ahead
    for i in 0..3 {
        wqe_post(&mut w, SendOp::Send, 0, 0x505 + i, Pl::Inline(&[text]));
    }
    w.u8(wqe_op::RING);
    out.push(("post_list_reset", w.finish()));

    // The smallest ring: one BB, one SGE, 28 inline bytes.
    let mut w = wqe_header(0, 1, false, 1, 2, 28, 1, 3);
    for i in 0..6u64 {
        let op = if i % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::SendImm { imm: i as u32 }
        };
        let pl = [(16, 0x1000 * i, 9)];
        wqe_post(&mut w, op, 0, 0x600 + i, Pl::Sges(&pl));
        wqe_post(&mut w, op, 0, 0x700 + i, Pl::Sges(&pl)); // full
        w.u8(wqe_op::RING).u8(wqe_op::RETIRE).u8(0);
    }
    out.push(("one_bb", w.finish()));
    out
}

/// `cqe_decode` header.
fn cqe_header(geo: u8, rq: u8, qpn: u32, sq_pi: u32, rq_head: u32) -> SeedWriter {
    let mut w = SeedWriter::new();
    w.u8(geo)
        .u8(rq)
        .u8(3) // max_send_sge 4
        .u8(48) // max_inline 48
        .u8(0x77)
        .u32(qpn)
        .u32(sq_pi)
        .u32(rq_head);
    w
}

/// A `cqe_decode` send: `lens` are SGE lengths (0, 8 or < 64), or inline.
fn cqe_send(w: &mut SeedWriter, op: SendOp, signaled: bool, lens: &[u32], inline: Option<&[u8]>) {
    w.u8(cqe_op::SEND);
    let mut ctl = op_kind(&op) | 0x10;
    if signaled {
        ctl |= 0x20;
    }
    if inline.is_some() {
        ctl |= 0x80;
    }
    w.u8(ctl);
    op_fields(w, &op);
    match inline {
        Some(data) => {
            w.u8(1).u8(data.len() as u8).bytes(data);
        }
        None => {
            w.u8(lens.len() as u8);
            for &l in lens {
                sge_len(w, l);
            }
        }
    }
}

fn sge_len(w: &mut SeedWriter, len: u32) {
    match len {
        0 => w.u8(0),
        8 => w.u8(1),
        l => w.u8((l as u8) << 2 | 2),
    };
    w.u8(0x5a); // lkey
}

fn cqe_recv(w: &mut SeedWriter, lens: &[u32]) {
    w.u8(cqe_op::RECV).u8(lens.len() as u8);
    for &l in lens {
        sge_len(w, l);
    }
}

/// How a structured CQE picks its `wqe_counter`.
enum Counter {
    /// The outstanding send at this index (needs one outstanding).
    Send(u8),
    /// The RQ tail.
    RecvTail,
    /// A literal value.
    Raw(u16),
}

/// A structured CQE: `op` is a CQE opcode (any value), `format` 0..3.
fn cqe(w: &mut SeedWriter, op: u8, format: u8, counter: Counter, byte_cnt: u32, syndrome: u8) {
    let known = [0u8, 1, 2, 3, 4, 13, 14];
    let (sel_op, extra) = match known.iter().position(|&k| k == op) {
        Some(i) => (i as u8, None),
        None => (7, Some(op << 4)),
    };
    let mode = match counter {
        Counter::Send(_) => 0,
        Counter::RecvTail => 1,
        Counter::Raw(_) => 2,
    };
    w.u8(cqe_op::CQE).u8(sel_op | format << 3 | mode << 6);
    if let Some(e) = extra {
        w.u8(e);
    }
    w.u8(0); // QPN top byte (QPN is the harness's)
    match counter {
        Counter::Send(i) => w.u8(i),
        Counter::RecvTail => w.u8(1),
        Counter::Raw(c) => w.u16(c),
    };
    match byte_cnt {
        8 => w.u8(1),
        0 => w.u8(3),
        n => w.u8(2).u32(n),
    };
    w.u8(0x85) // ml_path
        .u16(0x0102) // slid
        .u32(0x1300_0abc) // flags_rqpn: GRH, SL 3, source QPN
        .u32(0xcafe_0007) // immediate / pkey
        .u8(0x33) // vendor syndrome
        .u8(syndrome)
        .u8(0); // no skip
    if format == 1 {
        w.bytes(&core::array::from_fn::<u8, 32, _>(|i| 0xc0 + i as u8));
    }
    if format == 2 {
        w.bytes(&core::array::from_fn::<u8, 64, _>(|i| 0x80 + i as u8));
    }
}

fn poll(w: &mut SeedWriter, batch: u8) {
    w.u8(cqe_op::POLL).u8(batch);
}

fn cqe_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let cs = SendOp::CompareSwap {
        remote: R,
        compare: 5,
        swap: 6,
    };
    let fa = SendOp::FetchAdd { remote: R, add: 1 };

    // Sends of every kind and receives, each completed in order.
    // 16 SQ BBs, 64-byte CQEs, 8 CQEs; 4 RQ entries of 2 SGEs.
    let mut w = cqe_header(3 | 2 << 4, 2 | 1 << 3, 0x1c5, 0, 0);
    cqe_send(&mut w, SendOp::Send, true, &[16, 0, 20], None);
    cqe_send(&mut w, SendOp::SendImm { imm: 9 }, true, &[], Some(b"hi"));
    cqe_send(
        &mut w,
        SendOp::WriteImm { remote: R, imm: 3 },
        true,
        &[4],
        None,
    );
    cqe_send(&mut w, SendOp::Nop, true, &[], None);
    cqe_recv(&mut w, &[32, 16]);
    cqe_recv(&mut w, &[8]);
    w.u8(cqe_op::RING_SQ).u8(cqe_op::RING_RQ);
    cqe(&mut w, 0, 0, Counter::Send(0), 0, 0);
    cqe(&mut w, 0, 0, Counter::Send(1), 0, 0);
    cqe(&mut w, 2, 0, Counter::RecvTail, 48, 0);
    poll(&mut w, 8);
    cqe(&mut w, 3, 0, Counter::RecvTail, 8, 0);
    cqe(&mut w, 0, 0, Counter::Send(1), 0, 0);
    poll(&mut w, 1);
    poll(&mut w, 8);
    out.push(("send_recv", w.finish()));

    // Scatter-to-CQE: READ and atomics (format 1), receives with formats
    // 1 and 2 on 128-byte CQEs.
    let mut w = cqe_header(4 | 8 | 1 << 4, 2 | 2 << 3, 0x42, 0x1_0000 - 3, 0xffff);
    cqe_send(&mut w, SendOp::Read { remote: R }, true, &[12, 0, 40], None);
    cqe_send(&mut w, cs, true, &[8], None);
    cqe_send(&mut w, fa, false, &[8], None);
    cqe_send(&mut w, fa, true, &[8], None);
    cqe_recv(&mut w, &[10, 30, 60]);
    cqe_recv(&mut w, &[62]);
    cqe(&mut w, 0, 1, Counter::Send(0), 50, 0);
    cqe(&mut w, 0, 1, Counter::Send(0), 8, 0);
    cqe(&mut w, 0, 1, Counter::Send(1), 8, 0); // retires the unsignaled one too
    poll(&mut w, 8);
    cqe(&mut w, 4, 1, Counter::RecvTail, 70, 0);
    cqe(&mut w, 1, 2, Counter::RecvTail, 64, 0);
    poll(&mut w, 2);
    out.push(("scatter", w.finish()));

    // Errors and garbage: error CQEs, corrupt counters, compressed,
    // unknown opcodes, foreign QPNs, raw images with the wrong owner.
    let mut w = cqe_header(2, 1, 0x00ab_cdef, 100, 7); // 8 SQ BBs, 2 CQEs
    cqe_send(&mut w, SendOp::Write { remote: R }, true, &[16], None);
    cqe_send(&mut w, SendOp::Send, false, &[16], None);
    cqe_recv(&mut w, &[16]);
    cqe(&mut w, 0, 0, Counter::Raw(0x7777), 0, 0); // corrupt
    poll(&mut w, 4);
    cqe(&mut w, 13, 0, Counter::Send(1), 0, 0x15); // REQ_ERR
    poll(&mut w, 4);
    cqe(&mut w, 14, 0, Counter::RecvTail, 0, 0x05); // RESP_ERR
    cqe(&mut w, 5, 0, Counter::Raw(0), 0, 0); // resize: corrupt
    poll(&mut w, 4);
    cqe(&mut w, 0, 3, Counter::Raw(1), 0, 0); // compressed
    poll(&mut w, 2);
    poll(&mut w, 2);
    w.u8(cqe_op::RAW)
        .u8(0)
        .bytes(&core::array::from_fn::<u8, 64, _>(|i| (i * 37) as u8));
    w.u8(cqe_op::PATCH).u16(63).u8(1).u8(0x21);
    poll(&mut w, 3);
    w.u8(cqe_op::MISC).u8(2).u32(3); // SQ back to RTS
    cqe_send(&mut w, SendOp::Send, true, &[], None);
    poll(&mut w, 0);
    out.push(("errors", w.finish()));

    // A 2-entry CQ lapped several times; unsignaled runs; resets; states.
    let mut w = cqe_header(1 | 0x40, 0, 0x10, 0xfff0, 0);
    for i in 0..6u8 {
        cqe_send(&mut w, SendOp::Send, i % 2 == 1, &[], None);
        cqe(&mut w, 0, 0, Counter::Send(0), 0, 0);
        poll(&mut w, 1 + i % 3);
        cqe_recv(&mut w, &[8]);
        cqe(&mut w, 2, 0, Counter::RecvTail, 8, 0);
        poll(&mut w, 2);
    }
    w.u8(cqe_op::MISC).u8(1 << 2); // SQ reset to 0 (mode 1)
    w.u8(cqe_op::MISC).u8(3).u32(0); // RQ state RESET
    cqe_recv(&mut w, &[8]);
    w.u8(cqe_op::MISC).u8(3).u32(3);
    w.u8(cqe_op::MISC).u8(1 | 2 << 2).u8(1); // RQ reset a little behind
    cqe_recv(&mut w, &[0, 8]);
    w.u8(cqe_op::RING_RQ);
    poll(&mut w, 5);
    out.push(("lapped", w.finish()));
    out
}

/// Op codes of `raw_ops` (the op byte is taken modulo 17; 0..=8 are the
/// nine per-opcode sends in the target's `KINDS` order).
mod raw_op {
    pub const WRITE: u8 = 0;
    pub const WRITE_IMM: u8 = 1;
    pub const READ: u8 = 2;
    pub const SEND: u8 = 3;
    pub const SEND_IMM: u8 = 4;
    pub const WRITE_INLINE: u8 = 5;
    pub const SEND_INLINE: u8 = 6;
    pub const FETCH_ADD: u8 = 7;
    pub const CMP_SWAP: u8 = 8;
    pub const RECV: u8 = 9;
    pub const RING_SQ: u8 = 10;
    pub const RING_RQ: u8 = 11;
    pub const SEND_CQE: u8 = 12;
    pub const RECV_CQE: u8 = 13;
    pub const REINIT: u8 = 14;
    pub const BURST: u8 = 16;
}

/// `raw_ops` burst selector bits.
mod raw_burst {
    pub const READ: u8 = 0x01;
    pub const NULL: u8 = 0x02;
    pub const MISALIGNED: u8 = 0x04;
}

/// `raw_ops` flag selector bits (below 0x80).
mod raw_flag {
    pub const SIGNALED: u8 = 0x02;
    pub const FENCE: u8 = 0x01;
    pub const INLINE: u8 = 0x08;
    pub const DEFER: u8 = 0x10;
    pub const BAD: u8 = 0x20;
}

/// A `raw_ops` send: `len` as a `send::read_len` code of one byte (0: 0,
/// 1: 8; 3 then a byte: that length; 9: 2^31), `aligned` remote address;
/// inline sends point into the pool at offset 0 (or NULL).
fn raw_send(
    w: &mut SeedWriter,
    op: u8,
    fsel: u8,
    wr_id: u64,
    len: &[u8],
    aligned: bool,
    null: bool,
) {
    w.u8(op);
    raw_fields(w, op, fsel, wr_id, len, aligned, null);
}

/// The fields of a `raw_ops` send of opcode `op` (also a burst descriptor).
fn raw_fields(
    w: &mut SeedWriter,
    op: u8,
    fsel: u8,
    wr_id: u64,
    len: &[u8],
    aligned: bool,
    null: bool,
) {
    w.u8(fsel)
        .u64(wr_id)
        .u64(0x7f5a_3c00_3000)
        .bytes(len)
        .u32(0x00a1_b2c3);
    w.u64(if aligned {
        0x7e00_1122_0040
    } else {
        0x7e00_1122_0044
    });
    w.u8(0).u32(0x0bad_cafe).u32(0xdead_beef).u64(3).u64(4);
    if op == raw_op::WRITE_INLINE || op == raw_op::SEND_INLINE {
        w.u8(if null { 0 } else { 1 }).u16(0);
    }
}

/// A `raw_ops` burst: `sel` (raw_burst bits), then one descriptor per
/// (flag selector, read_len code) pair, wr_ids from `id`.
fn raw_burst(w: &mut SeedWriter, sel: u8, id: u64, descs: &[(u8, &[u8])]) {
    let op = if sel & raw_burst::READ != 0 {
        raw_op::READ
    } else {
        raw_op::WRITE
    };
    w.u8(raw_op::BURST).u8(sel).u8(descs.len() as u8);
    for (i, &(fsel, len)) in descs.iter().enumerate() {
        raw_fields(w, op, fsel, id + i as u64, len, true, false);
    }
}

/// A `raw_ops` receive of `len` (a read_len code) bytes.
fn raw_recv(w: &mut SeedWriter, fsel: u8, wr_id: u64, len: &[u8]) {
    w.u8(raw_op::RECV)
        .u8(fsel)
        .u64(wr_id)
        .u64(0x5000)
        .bytes(len)
        .u32(0x55);
}

/// A `raw_ops` CQE for the `pick`-th outstanding WQE (or the next
/// receive), then a poll of `n`.
fn raw_cqe(w: &mut SeedWriter, op: u8, pick: u8, status: u8, n: u8) {
    w.u8(op).u8(pick).u8(status).u8(n);
}

fn raw_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let sends = [
        raw_op::WRITE,
        raw_op::WRITE_IMM,
        raw_op::READ,
        raw_op::SEND,
        raw_op::SEND_IMM,
        raw_op::WRITE_INLINE,
        raw_op::SEND_INLINE,
        raw_op::FETCH_ADD,
        raw_op::CMP_SWAP,
    ];

    // Every opcode once, signaled and rung, each completed and polled
    // (64 BBs, BlueFlame on, 4 SGEs, 60 inline bytes, 2 receive SGEs).
    let mut w = SeedWriter::new();
    w.u8(6).u8(3).u8(4).u8(60).u8(2).u8(0x11);
    for (i, &op) in sends.iter().enumerate() {
        raw_send(&mut w, op, raw_flag::SIGNALED, i as u64, &[1], true, false);
        raw_cqe(&mut w, raw_op::SEND_CQE, 0, 0, 1 + (i % 4) as u8);
    }
    raw_recv(&mut w, 0, 100, &[3, 64]);
    raw_cqe(&mut w, raw_op::RECV_CQE, 0, 64, 2);
    out.push(("every_op", w.finish()));

    // Deferred batches: sends and receives, closed by a ringing call and
    // by the ring calls; unsignaled work and a poll of 4.
    let mut w = SeedWriter::new();
    w.u8(5 | 0x10).u8(1).u8(2).u8(100).u8(1).u8(0x22);
    for i in 0..5u64 {
        raw_send(
            &mut w,
            raw_op::WRITE,
            raw_flag::DEFER,
            i,
            &[3, 32],
            true,
            false,
        );
    }
    raw_send(
        &mut w,
        raw_op::SEND,
        raw_flag::SIGNALED,
        5,
        &[1],
        true,
        false,
    );
    raw_cqe(&mut w, raw_op::SEND_CQE, 5, 0, 4);
    raw_send(
        &mut w,
        raw_op::SEND_INLINE,
        raw_flag::DEFER | raw_flag::SIGNALED,
        6,
        &[3, 90],
        true,
        false,
    );
    raw_send(
        &mut w,
        raw_op::FETCH_ADD,
        raw_flag::DEFER,
        7,
        &[1],
        true,
        false,
    );
    w.u8(raw_op::RING_SQ);
    for i in 0..3u64 {
        raw_recv(&mut w, 1, 200 + i, &[1]);
    }
    w.u8(raw_op::RING_RQ);
    raw_recv(&mut w, 0, 203, &[0]);
    raw_cqe(&mut w, raw_op::RECV_CQE, 0, 8, 4);
    raw_cqe(&mut w, raw_op::SEND_CQE, 1, 0, 0);
    raw_cqe(&mut w, raw_op::SEND_CQE, 0, 0, 4);
    out.push(("deferred", w.finish()));

    // Refusals on a 4-BB ring: bad flags, INLINE on an SGE op, lengths of
    // 2^31, inline too long and NULL, misaligned atomics, then a full ring.
    let mut w = SeedWriter::new();
    w.u8(2).u8(1).u8(1).u8(16).u8(1).u8(0x33);
    raw_send(&mut w, raw_op::WRITE, raw_flag::BAD, 1, &[1], true, false);
    raw_send(&mut w, raw_op::READ, raw_flag::INLINE, 2, &[1], true, false);
    raw_send(&mut w, raw_op::SEND, 0, 3, &[9], true, false);
    raw_send(&mut w, raw_op::SEND_INLINE, 0, 4, &[3, 17], true, false);
    raw_send(&mut w, raw_op::WRITE_INLINE, 0, 5, &[1], true, true);
    raw_send(&mut w, raw_op::CMP_SWAP, 0, 6, &[1], false, false);
    raw_send(
        &mut w,
        raw_op::FETCH_ADD,
        raw_flag::DEFER,
        7,
        &[1],
        false,
        false,
    );
    for i in 0..5u64 {
        raw_send(
            &mut w,
            raw_op::SEND,
            raw_flag::DEFER,
            10 + i,
            &[1],
            true,
            false,
        );
    }
    raw_recv(&mut w, 2, 20, &[1]);
    raw_recv(&mut w, 0, 21, &[9]);
    w.u8(raw_op::RING_SQ);
    raw_cqe(&mut w, raw_op::SEND_CQE, 0, 0, 1);
    raw_send(
        &mut w,
        raw_op::WRITE,
        raw_flag::SIGNALED | raw_flag::FENCE,
        30,
        &[0],
        true,
        false,
    );
    out.push(("refusals", w.finish()));

    // An error completion, a corrupt one, a re-initialisation under the
    // binding, and posts on the fresh queues.
    let mut w = SeedWriter::new();
    w.u8(4 | 0x08 | 0x40).u8(2).u8(3).u8(40).u8(2).u8(0x44);
    raw_send(&mut w, raw_op::WRITE_IMM, 0, 1, &[1], true, false);
    raw_send(
        &mut w,
        raw_op::READ,
        raw_flag::SIGNALED,
        2,
        &[1],
        true,
        false,
    );
    raw_cqe(&mut w, raw_op::SEND_CQE, 1, 0xc1, 2);
    raw_cqe(&mut w, raw_op::SEND_CQE, 0, 0, 2);
    raw_send(
        &mut w,
        raw_op::SEND,
        raw_flag::SIGNALED,
        3,
        &[1],
        true,
        false,
    );
    raw_recv(&mut w, 0, 4, &[1]);
    raw_cqe(&mut w, raw_op::RECV_CQE, 0, 0xc0, 3);
    w.u8(raw_op::REINIT);
    raw_send(
        &mut w,
        raw_op::CMP_SWAP,
        raw_flag::SIGNALED,
        5,
        &[1],
        true,
        false,
    );
    raw_cqe(&mut w, raw_op::SEND_CQE, 0, 0, 1);
    raw_recv(&mut w, 1, 6, &[1]);
    w.u8(raw_op::RING_RQ);
    out.push(("errors_reinit", w.finish()));

    // Bursts on a 64-BB ring: 16 WRITEs of mixed flags and lengths (0, 8,
    // 40, a DEFER in the middle), completed; then (a seed of its own) a
    // one-READ burst, n = 0 after deferred sends, a burst left pending by
    // its last descriptor.
    let mut w = SeedWriter::new();
    w.u8(6).u8(3).u8(4).u8(60).u8(2).u8(0x55);
    let flags = [
        0,
        raw_flag::SIGNALED,
        raw_flag::FENCE,
        raw_flag::DEFER,
        0x04, // SOLICITED
        raw_flag::SIGNALED | raw_flag::FENCE,
    ];
    let lens: [&[u8]; 4] = [&[1], &[0], &[8], &[3, 40]];
    let descs: Vec<(u8, &[u8])> = (0..16)
        .map(|i| (flags[i % 6], lens[i % 4]))
        .chain([(raw_flag::SIGNALED, &[1u8][..])])
        .skip(1)
        .collect();
    raw_burst(&mut w, 0, 1, &descs);
    raw_cqe(&mut w, raw_op::SEND_CQE, 15, 0, 4);
    out.push(("burst16", w.finish()));
    let mut w = SeedWriter::new();
    w.u8(6).u8(3).u8(4).u8(60).u8(2).u8(0x55);
    raw_burst(
        &mut w,
        raw_burst::READ,
        20,
        &[(raw_flag::SIGNALED, &[3, 64])],
    );
    raw_cqe(&mut w, raw_op::SEND_CQE, 0, 0, 1);
    for i in 0..2u64 {
        raw_send(
            &mut w,
            raw_op::SEND,
            raw_flag::DEFER,
            30 + i,
            &[1],
            true,
            false,
        );
    }
    raw_burst(&mut w, 0, 40, &[]);
    raw_burst(
        &mut w,
        raw_burst::READ,
        50,
        &[(0, &[1]), (raw_flag::SIGNALED | raw_flag::DEFER, &[8])],
    );
    w.u8(raw_op::RING_SQ);
    raw_cqe(&mut w, raw_op::SEND_CQE, 3, 0, 4);
    out.push(("bursts", w.finish()));

    // Burst refusals on an 8-BB ring: a bad flag bit, INLINE, a length of
    // 2^31 mid-burst (the ones before posted and rung), a NULL and a
    // misaligned array, a refused one-descriptor burst after a deferred
    // send (which stays pending for the ring).
    let mut w = SeedWriter::new();
    w.u8(3).u8(1).u8(1).u8(16).u8(1).u8(0x66);
    raw_burst(&mut w, 0, 1, &[(0, &[1]), (raw_flag::BAD, &[1]), (0, &[1])]);
    raw_burst(&mut w, raw_burst::READ, 4, &[(raw_flag::INLINE, &[1])]);
    raw_burst(&mut w, 0, 5, &[(0, &[1]), (0, &[9]), (0, &[1])]);
    raw_burst(&mut w, raw_burst::NULL, 8, &[(0, &[1])]);
    raw_burst(&mut w, raw_burst::NULL, 9, &[]);
    raw_burst(&mut w, raw_burst::MISALIGNED, 10, &[(0, &[1]), (0, &[1])]);
    raw_send(&mut w, raw_op::SEND, raw_flag::DEFER, 11, &[1], true, false);
    raw_burst(&mut w, 0, 12, &[(raw_flag::BAD | raw_flag::DEFER, &[1])]);
    w.u8(raw_op::RING_SQ);
    out.push(("burst_refusals", w.finish()));

    // SQ_FULL mid-burst on a fresh 8-BB ring (eight posted and rung), then
    // a burst after a completion frees room.
    let mut w = SeedWriter::new();
    w.u8(3).u8(1).u8(1).u8(16).u8(1).u8(0x68);
    let full: Vec<(u8, &[u8])> = (0..9).map(|_| (0, &[1u8][..])).collect();
    raw_burst(&mut w, 0, 20, &full);
    raw_cqe(&mut w, raw_op::SEND_CQE, 2, 0, 4);
    raw_burst(&mut w, raw_burst::READ, 30, &full[..3]);
    out.push(("burst_full", w.finish()));

    // A queue without SGEs: every burst descriptor is TOO_MANY_SGES.
    let mut w = SeedWriter::new();
    w.u8(4).u8(1).u8(0).u8(60).u8(1).u8(0x77);
    raw_burst(&mut w, 0, 1, &[(0, &[1]), (0, &[0])]);
    raw_burst(&mut w, raw_burst::READ, 3, &[(raw_flag::SIGNALED, &[0])]);
    raw_send(
        &mut w,
        raw_op::WRITE_INLINE,
        raw_flag::SIGNALED,
        4,
        &[3, 8],
        true,
        false,
    );
    raw_burst(&mut w, 0, 5, &[]);
    out.push(("burst_no_sge", w.finish()));
    out
}

/// Op codes of `obj_ops` (calls are 0..=9 in the target's order).
mod obj_op {
    pub const WRITE: u8 = 0;
    pub const WRITE_IMM: u8 = 1;
    pub const READ: u8 = 2;
    pub const SEND: u8 = 3;
    pub const SEND_IMM: u8 = 4;
    pub const WRITE_INLINE: u8 = 5;
    pub const SEND_INLINE: u8 = 6;
    pub const FETCH_ADD: u8 = 7;
    pub const CMP_SWAP: u8 = 8;
    pub const RECV: u8 = 9;
    pub const RING: u8 = 10;
    pub const STEP: u8 = 11;
    pub const BAD_HANDLE: u8 = 12;
}

/// `obj_ops` call flag selectors (`fsel`).
mod obj_f {
    pub const SIG: u8 = 0x02;
    pub const DEFER: u8 = 0x08;
    pub const INLINE: u8 = 0x10;
    pub const STRAY: u8 = 0x20;
}

/// One `obj_ops` call's fields after its op byte: flags, wr_id, length
/// selector, local and remote offsets, key selector, immediate, operands.
#[allow(clippy::too_many_arguments)]
fn obj_fields(w: &mut SeedWriter, fsel: u8, wr_id: u16, lsel: u8, loff: u16, roff: u16, ksel: u8) {
    w.u8(fsel).u16(wr_id).u8(lsel).u16(loff).u16(roff).u8(ksel);
    w.u32(0xabc0_0000 | wr_id as u32).u64(5).u64(0x1122_3344);
}

fn obj_call(w: &mut SeedWriter, op: u8, fsel: u8, wr_id: u16, lsel: u8, loff: u16, roff: u16) {
    w.u8(op);
    // Key selector 8: valid keys, remote offset aligned for atomics.
    obj_fields(w, fsel, wr_id, lsel, loff, roff, 8);
}

fn obj_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use obj_f::*;
    use obj_op::*;
    let mut out = Vec::new();
    // Connected, 8 send and 8 receive WRs, 32 inline bytes: every call,
    // a deferred batch, steps.
    let mut w = SeedWriter::new();
    w.u8(0x29).u8(0).u8(32);
    obj_call(&mut w, RECV, 0, 1, 64, 2048, 0);
    obj_call(&mut w, RECV, DEFER, 2, 64, 2112, 0);
    for i in 0..3u16 {
        obj_call(&mut w, WRITE, SIG | DEFER, 10 + i, 16, 16 * i, 256 + 16 * i);
    }
    obj_call(&mut w, SEND_INLINE, SIG, 13, 5, 0, 0);
    w.u8(STEP).u8(2).u8(16);
    obj_call(&mut w, SEND_IMM, SIG, 14, 8, 32, 0);
    obj_call(&mut w, WRITE_IMM, SIG | DEFER, 15, 8, 40, 512);
    obj_call(&mut w, READ, SIG, 16, 32, 1024, 256);
    w.u8(STEP).u8(3).u8(16);
    obj_call(&mut w, FETCH_ADD, SIG | DEFER, 17, 8, 128, 8);
    obj_call(&mut w, CMP_SWAP, SIG, 18, 8, 136, 8);
    obj_call(&mut w, WRITE_INLINE, SIG, 19, 12, 0, 600);
    obj_call(&mut w, SEND, SIG, 20, 0, 0, 0);
    w.u8(RING);
    w.u8(STEP).u8(4).u8(8);
    out.push(("all_calls", w.finish()));

    // An unguarded 16-entry send CQ: signaled WRITEs until CQ_FULL, some
    // deferred, polled in small batches.
    let mut w = SeedWriter::new();
    w.u8(0x3f).u8(7).u8(16);
    for i in 0..18u16 {
        let f = if i % 3 == 0 { SIG } else { SIG | DEFER };
        obj_call(&mut w, WRITE, f, i, 8, 8 * i, 8 * i);
    }
    w.u8(STEP).u8(2).u8(5);
    obj_call(&mut w, WRITE, DEFER, 40, 8, 0, 0);
    w.u8(STEP).u8(2).u8(16);
    for i in 0..4u16 {
        obj_call(&mut w, READ, SIG | DEFER, 50 + i, 8, 512, 8 * i);
    }
    w.u8(RING).u8(STEP).u8(1).u8(16);
    out.push(("unguarded", w.finish()));

    // Refusals: bad flags, bad handles, misaligned atomics, inline too
    // large or NULL, length overflow; and one send queue slot.
    let mut w = SeedWriter::new();
    w.u8(0x01).u8(0).u8(8);
    obj_call(&mut w, WRITE, SIG | INLINE, 1, 8, 0, 0);
    obj_call(&mut w, SEND, STRAY, 2, 8, 0, 0);
    obj_call(&mut w, RECV, SIG, 3, 8, 0, 0);
    for which in 0..4u8 {
        w.u8(BAD_HANDLE).u8(which).u8(which * 2);
        obj_fields(&mut w, SIG, 4, 8, 0, 0, 8);
    }
    w.u8(FETCH_ADD);
    obj_fields(&mut w, SIG, 5, 8, 0, 4, 0);
    obj_call(&mut w, SEND_INLINE, SIG, 6, 9, 0, 0);
    w.u8(WRITE_INLINE);
    obj_fields(&mut w, SIG, 7, 4, 0, 0, 4 | 8);
    obj_call(&mut w, WRITE, SIG, 8, 245, 0, 0);
    for i in 0..4u16 {
        obj_call(&mut w, WRITE, DEFER, 9 + i, 8, 0, 0);
    }
    w.u8(STEP).u8(2).u8(4);
    out.push(("rejections", w.finish()));

    // Never connected: every call is INVALID_QP_STATE.
    let mut w = SeedWriter::new();
    w.u8(0x00).u8(0).u8(16);
    for op in [WRITE, SEND_INLINE, CMP_SWAP, RECV] {
        obj_call(&mut w, op, SIG | DEFER, op as u16, 8, 0, 0);
    }
    w.u8(RING).u8(STEP).u8(1).u8(4);
    out.push(("reset", w.finish()));
    out
}

/// Every seed: (target, name, bytes).
pub fn all() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    for (name, bytes) in wqe_seeds() {
        v.push(("wqe_encode", name, bytes));
    }
    for (name, bytes) in cqe_seeds() {
        v.push(("cqe_decode", name, bytes));
    }
    for (name, bytes) in raw_seeds() {
        v.push(("raw_ops", name, bytes));
    }
    for (name, bytes) in obj_seeds() {
        v.push(("obj_ops", name, bytes));
    }
    for (name, bytes) in submit::seeds() {
        v.push(("submit_ops", name, bytes));
    }
    for (name, bytes) in recover::seeds() {
        v.push(("recover_ops", name, bytes));
    }
    for (name, bytes) in ud_srq::seeds() {
        v.push(("ud_srq_ops", name, bytes));
    }
    v.extend(crate::seeds_lean::all());
    v
}

#[test]
fn seeds_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let write = std::env::var_os("RDD_WRITE_SEEDS").is_some();
    for (target, name, bytes) in all() {
        assert!(
            bytes.len() < 1024,
            "seed {target}/{name} is {} bytes",
            bytes.len()
        );
        let path = dir.join(target).join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let on_disk = std::fs::read(&path).unwrap_or_default();
            assert!(
                on_disk == bytes,
                "{} is stale: run `RDD_WRITE_SEEDS=1 cargo +$RDD_NIGHTLY test` in fuzz/ (scripts/toolchains.sh)",
                path.display()
            );
        }
    }
}
