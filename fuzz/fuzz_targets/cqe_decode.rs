//! `cqe_decode`: arbitrary CQE images (structured and raw, any owner bits)
//! polled with arbitrary batch sizes, over a QP with real posted work.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! geo      u8   bits 0-2: log2 SQ BBs (% 6 + 1 -> 2..64), bit 3: 128-byte
//!               CQEs, bits 4-5: log2 CQEs - 1 (2..16), bit 6: sig_all,
//!               bit 7: scatter-to-CQE off
//! rq       u8   bits 0-2: log2 RQ entries (% 5 -> 1..16), bits 3-4:
//!               stride = 16 << n (max_recv_sge = stride / 16)
//! sge      u8   max_send_sge = 1 + sge % 4
//! inline   u8   max_inline_data = inline % 65
//! seed     u8   fill pattern
//! qpn      u32  masked to 24 bits
//! sq_pi    u32  start counters (reset_counters)
//! rq_head  u32
//! ops...        until the input ends (at most MAX_OPS) or the SGE arena
//!               is full: u8 code % 16, then its fields:
//!   0-3   send       a send WR of any kind (SGEs of 0, 8 or < 64 bytes, or
//!                    inline), signaled or not
//!   4-5   recv       a receive WR with 0..max_recv_sge+1 SGEs
//!   6, 7  ring       SQ / RQ doorbell
//!   8-10  CQE        a structured CQE written by `write_cqe` (opcode,
//!                    format, QPN, counter naming real or bogus work, byte
//!                    count, immediate, syndrome, scatter data)
//!   11    raw CQE    64 arbitrary bytes (owner bit included) at any slot
//!   12    patch      up to 16 arbitrary bytes anywhere in the CQ buffer
//!   13-14 poll       u8: batch of 0..8
//!   15    misc       reset SQ or RQ counters, or set SQ or RQ state
//! ```
//!
//! Every SGE of a posted WR names a real buffer in an arena, with pattern
//! guard bytes around it (the poller writes there for scatter-to-CQE).
//!
//! An independent model of the poller (owner bit, format, QPN route,
//! outstanding-WQE lookup, docs/spec/mlx5.md §8–§9 and the `poll` docs) predicts
//! every poll: the returned completions field by field, the error, the
//! consumer index and doorbell record, the queue counters and the exact
//! bytes scattered into posted buffers. Also checked: every completion
//! names a WR that was posted and not completed before; retire and tail
//! counters never pass the producer; the consumer index only moves
//! forward; polling never writes the CQ or the QP buffer; every arena byte
//! outside the scattered ranges (all guards) keeps its value.
#![no_main]

use std::collections::{HashSet, VecDeque};

use libfuzzer_sys::fuzz_target;
use rdma_direct::provider::mlx5::{Mlx5Qp, QpState, SqConfig};
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct_fuzz::send;
use rdma_direct_fuzz::{pattern, Bytes};

const MAX_OPS: usize = 2048;

#[path = "cqe_decode/harness.rs"]
mod harness;
#[path = "cqe_decode/model.rs"]
mod model;
use harness::{Harness, ARENA, MAX_BATCH};
use model::Model;

fn state_from(b: u8) -> QpState {
    match b % 5 {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        _ => QpState::Error,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let geo = r.u8();
    let rqb = r.u8();
    let max_send_sge = 1 + (r.u8() % 4) as u32;
    let max_inline_data = (r.u8() % 65) as u32;
    let seed = r.u8();
    let qpn = r.u32() & 0x00ff_ffff;
    let sq_pi = r.u32();
    let rq_head = r.u32();

    let sq_cnt = 1u32 << ((geo & 7) % 6 + 1);
    let rq_cnt = 1u32 << ((rqb & 7) % 5);
    let rq_stride = 16u32 << ((rqb >> 3) & 3);
    let sig_all = geo & 0x40 != 0;
    let mut f = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: sq_cnt,
        rq_wqe_cnt: rq_cnt,
        rq_stride,
        bf_size: 64,
        cqe_cnt: 2 << ((geo >> 4) & 3),
        cqe_size: if geo & 8 != 0 { 128 } else { 64 },
        qpn,
        cqn: 7,
    });
    pattern::fill(f.qp_buf.bytes_mut(), seed);
    let caps = f.caps(max_send_sge, max_inline_data);
    assert!(send::geometry_ok(&caps, sq_cnt), "harness geometry");
    let cfg = SqConfig {
        sig_all,
        ..SqConfig::default()
    };
    let sq = f.send_queue(caps, cfg).expect("send queue");
    let rq = f.recv_queue(caps).expect("recv queue");
    let mut cq = f.completion_queue().expect("completion queue");
    let scatter = geo & 0x80 == 0;
    cq.set_scatter_to_cqe(scatter);
    let mut arena = AlignedBuf::new(ARENA);
    pattern::fill(arena.bytes_mut(), seed ^ 0xa5);
    let arena_model = arena.bytes().to_vec();

    let mut h = Harness {
        f,
        qp: Mlx5Qp { sq, rq },
        cq,
        m: Model {
            sq_cnt,
            sq_pi,
            sq_retired: sq_pi,
            sq_batch: 0,
            sq_state: QpState::Rts,
            sends: VecDeque::new(),
            rq_cnt,
            rq_head,
            rq_tail: rq_head,
            rq_rung: rq_head,
            rq_state: QpState::Rts,
            recvs: VecDeque::new(),
            ci: 0,
            stale: 0,
            dbrec_sq: 0,
            dbrec_rq: 0,
            dbrec_cq: 0,
            arena: arena_model,
            completed: HashSet::new(),
        },
        caps,
        sig_all,
        scatter,
        qpn,
        arena,
        next_buf: 0,
        next_id: 0,
        dev: 0,
    };
    h.qp.sq.reset_counters(sq_pi);
    h.qp.rq.reset_counters(rq_head);
    h.check_state();

    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        let op = r.u8();
        let room = match op % 16 {
            0..=3 => h.post_send(&mut r),
            4 | 5 => h.post_recv(&mut r),
            6 => h.ring_sq(),
            7 => h.ring_rq(),
            8..=10 => h.write_structured(&mut r),
            11 => h.write_raw(&mut r),
            12 => h.patch(&mut r),
            13 | 14 => {
                let batch = r.u8() as usize % (MAX_BATCH + 1);
                h.poll(batch)
            }
            _ => {
                let b = r.u8();
                let v = match (b >> 2) % 3 {
                    0 => r.u32(),
                    1 => 0,
                    // A little behind the current counter.
                    _ => match b % 4 {
                        0 => h.m.sq_pi,
                        _ => h.m.rq_head,
                    }
                    .wrapping_sub(r.u8() as u32),
                };
                match b % 4 {
                    0 => {
                        h.qp.sq.reset_counters(v);
                        let m = &mut h.m;
                        m.sq_pi = v;
                        m.sq_retired = v;
                        m.sq_batch = 0;
                        m.sends.clear();
                    }
                    1 => {
                        h.qp.rq.reset_counters(v);
                        let m = &mut h.m;
                        m.rq_head = v;
                        m.rq_tail = v;
                        m.rq_rung = v;
                        m.recvs.clear();
                    }
                    2 => {
                        let s = state_from(v as u8);
                        h.qp.sq.set_state(s);
                        h.m.sq_state = s;
                    }
                    _ => {
                        let s = state_from(v as u8);
                        h.qp.rq.set_state(s);
                        h.m.rq_state = s;
                    }
                }
                Some(())
            }
        };
        if room.is_none() {
            // Arena exhausted: stop here (the rest of the input is unused).
            break;
        }
        h.check_state();
    }
});
