//! `cqe_one` (lean): one arbitrary 64- or 128-byte CQE polled against a
//! fixed set of outstanding work.
//!
//! The work (built once per CQE size and rebuilt only after an input
//! consumed some of it): a 16-BB send queue with four one-BB sends posted
//! from counter 0xfffe, so their indices cross the 16-bit wrap (SEND,
//! inline WRITE unsignaled, READ, FETCH_ADD; SGEs in an arena between
//! guard bytes), and a 4-entry receive queue with three receives from
//! 0xfffe. Each input writes one CQE image, its bytes taken from the input,
//! at CQ slot 0 (consumer index 0) and polls it, twice.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! geo      u8   bit 0: 128-byte CQEs, bit 1: scatter-to-CQE off
//! aim      u8   bit 0: QPN field := the QP's, bit 1: owner bit := software,
//!               bit 2: wqe_counter := an outstanding index (bits 3-5: one
//!               of the 4 sends or 3 receives; bits 6-7 add 0..3)
//! batch    u8   poll batch 1..4
//! cqe           64 or 128 bytes
//! ```
//!
//! Checked: the poll returns completions that name outstanding work (a
//! requester completion of success a signaled outstanding send, an error
//! one any outstanding send, a responder one an outstanding receive, each
//! at most once and with the QP's number), `CqeCorrupt`, `CqeCompressed`,
//! or nothing; never another error, never an out-of-bounds access (the
//! build is sanitised). Counters move only forward and never past the
//! producer / head, no arena byte outside the posted buffers changes, and
//! the second poll returns nothing.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use rdma_direct::provider::mlx5::{
    CompletionQueue, Mlx5Qp, QpState, SqConfig, Wc, WcOpcode, WcStatus, WrSlot,
};
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct::{Error, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};
use rdma_direct_fuzz::{pattern, Bytes};

const QPN: u32 = 0x0abc;
const ARENA: usize = 1024;
/// Start counters of the sends and receives (16-bit indices wrap inside).
const SQ_PI: u32 = 0xfffe;
const RQ_HEAD: u32 = 0xfffe;

/// Posted buffer ranges in the arena: (offset, length); the inline WRITE
/// has none.
const SEND_BUF: [(usize, u32); 4] = [(16, 16), (0, 0), (64, 32), (128, 8)];
const RECV_BUF: [(usize, u32); 3] = [(256, 48), (384, 48), (512, 48)];
/// Send ids; which are signaled.
const SEND_ID: [u64; 4] = [0x5e00, 0x5e01, 0x5e02, 0x5e03];
const SIGNALED: [bool; 4] = [true, false, true, true];
const RECV_ID: [u64; 3] = [0x4e00, 0x4e01, 0x4e02];

/// The fake memory, its queues with the outstanding work, and the arena.
struct Setup {
    f: FakeMlx5,
    qp: Mlx5Qp,
    cq: CompletionQueue,
    arena: AlignedBuf,
    /// The arena's pattern.
    pristine: Vec<u8>,
    /// First BB index of each send.
    starts: [u16; 4],
    /// Index of each receive.
    recv_index: [u16; 3],
}

/// Queue counters and states that only consuming work changes (an error
/// CQE that moves the receive queue to the error state also retires or
/// completes work, so it shows here too).
fn state(qp: &Mlx5Qp) -> (u32, u32, QpState, u32, u32, bool, bool) {
    (
        qp.sq.producer(),
        qp.sq.retired(),
        qp.sq.state(),
        qp.rq.head(),
        qp.rq.tail(),
        qp.sq.failure().is_none(),
        qp.rq.failure().is_none(),
    )
}

fn setup(size: u32) -> Setup {
    let f = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: 16,
        rq_wqe_cnt: 4,
        rq_stride: 32,
        bf_size: 64,
        cqe_cnt: 4,
        cqe_size: size,
        qpn: QPN,
        cqn: 3,
    });
    let mut arena = AlignedBuf::new(ARENA);
    pattern::fill(arena.bytes_mut(), 0x3c);
    let pristine = arena.bytes().to_vec();
    post_work(f, arena, pristine)
}

/// New queues over `f` (side tables cleared) with the outstanding work
/// posted; the memory is reused, nothing is allocated but the queues'.
fn post_work(mut f: FakeMlx5, arena: AlignedBuf, pristine: Vec<u8>) -> Setup {
    f.sq_wrid.fill(WrSlot::default());
    f.rq_wrid.fill(0);
    let caps = f.caps(2, 32);
    let mut qp = Mlx5Qp {
        sq: f.send_queue(caps, SqConfig::default()).expect("sq"),
        rq: f.recv_queue(caps).expect("rq"),
    };
    let cq = f.completion_queue().expect("cq");
    qp.sq.reset_counters(SQ_PI);
    qp.rq.reset_counters(RQ_HEAD);
    let base = arena.ptr().expose_provenance() as u64;
    let sge = |(off, len): (usize, u32)| Sge::new(base + off as u64, len, 7);
    let remote = Remote::new(0x10_0000, 9);
    let mut starts = [0u16; 4];
    for k in 0..4 {
        starts[k] = qp.sq.producer() as u16;
        let one = [sge(SEND_BUF[k])];
        let inline: [&[u8]; 1] = [b"8 bytes!"];
        let flags = if SIGNALED[k] {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        let id = SEND_ID[k];
        let wr = match k {
            0 => SendWr::new(id, SendOp::Send, &one, flags),
            1 => SendWr::inline(id, SendOp::Write { remote }, &inline, flags),
            2 => SendWr::new(id, SendOp::Read { remote }, &one, flags),
            _ => SendWr::new(id, SendOp::FetchAdd { remote, add: 1 }, &one, flags),
        };
        // SAFETY: every SGE names a live arena buffer, which lives as long
        // as the queues (both in `Setup`); nothing else writes it.
        unsafe { qp.sq.post(&wr) }.expect("send");
    }
    qp.sq.ring();
    let mut recv_index = [0u16; 3];
    for k in 0..3 {
        recv_index[k] = qp.rq.head() as u16;
        let one = [sge(RECV_BUF[k])];
        let wr = RecvWr {
            wr_id: RECV_ID[k],
            sges: &one,
        };
        // SAFETY: as for the sends.
        unsafe { qp.rq.post(&wr) }.expect("recv");
    }
    qp.rq.ring();
    Setup {
        f,
        qp,
        cq,
        arena,
        pristine,
        starts,
        recv_index,
    }
}

thread_local! {
    /// One setup per CQE size, reused until an input consumes work.
    static SETUPS: RefCell<[Option<Setup>; 2]> = const { RefCell::new([None, None]) };
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let geo = r.u8();
    let aim = r.u8();
    let batch = 1 + (r.u8() % 4) as usize;
    let size = if geo & 1 != 0 { 128 } else { 64 };
    SETUPS.with_borrow_mut(|setups| {
        let slot = &mut setups[(size / 128) as usize];
        let s = slot.get_or_insert_with(|| setup(size));
        if one(s, &mut r, geo, aim, batch, size) {
            // Work was consumed: the next input gets the full set again.
            let old = slot.take().expect("set up above");
            *slot = Some(post_work(old.f, old.arena, old.pristine));
        }
    });
});

/// Polls one CQE against `s`; true when it consumed outstanding work.
fn one(s: &mut Setup, r: &mut Bytes<'_>, geo: u8, aim: u8, batch: usize, size: u32) -> bool {
    let tail = size as usize - 64;
    let mut cqe = [0u8; 128];
    let raw = r.take(size as usize);
    cqe[..raw.len()].copy_from_slice(raw);
    if aim & 1 != 0 {
        let b = QPN.to_be_bytes();
        cqe[tail + 57..tail + 60].copy_from_slice(&b[1..]);
    }
    if aim & 4 != 0 {
        let pick = ((aim >> 3) & 7) as usize;
        let index = match pick {
            0..=3 => s.starts[pick],
            4..=6 => s.recv_index[pick - 4],
            _ => SQ_PI as u16,
        };
        let counter = index.wrapping_add((aim >> 6) as u16);
        cqe[tail + 60..tail + 62].copy_from_slice(&counter.to_be_bytes());
    }
    if aim & 2 != 0 {
        // Pass 0 of the CQ: software owns entries whose owner bit is 0.
        cqe[tail + 63] &= !1;
    }
    // A fresh CQ view: every entry invalid, consumer index 0, then the CQE.
    // SAFETY: the CQ buffer is the fake's, sized for its entries.
    unsafe { CompletionQueue::init_buffer(s.f.cq_buf.ptr(), 4, size) };
    s.cq.set_consumer_index(0);
    s.cq.set_scatter_to_cqe(geo & 2 == 0);
    s.f.cq_buf.bytes_mut()[..size as usize].copy_from_slice(&cqe[..size as usize]);
    let before = state(&s.qp);
    let (pi, retired, _, head, tail_rq, ..) = before;

    let mut seen = [0u64; 2];
    let mut nseen = 0;
    for round in 0..2 {
        let mut out = [Wc::default(); 4];
        match s.cq.poll(&mut s.qp, &mut out[..batch]) {
            Ok(n) => {
                assert!(n <= 1, "{n} completions from one CQE");
                assert!(round == 0 || n == 0, "a second poll completed more");
                for wc in &out[..n] {
                    assert_eq!(wc.qp_num, QPN, "completion for another QP");
                    assert!(
                        !seen[..nseen].contains(&wc.wr_id),
                        "wr_id {:#x} completed twice",
                        wc.wr_id
                    );
                    seen[nseen] = wc.wr_id;
                    nseen += 1;
                    if wc.opcode.0 >= WcOpcode::RECV.0 {
                        assert!(
                            RECV_ID.contains(&wc.wr_id),
                            "receive completion names {:#x}, not outstanding",
                            wc.wr_id
                        );
                    } else if wc.status == WcStatus::SUCCESS {
                        assert!(
                            (0..4).any(|k| SEND_ID[k] == wc.wr_id && SIGNALED[k]),
                            "send completion names {:#x}, not a signaled outstanding send",
                            wc.wr_id
                        );
                    } else {
                        assert!(
                            SEND_ID.contains(&wc.wr_id),
                            "error completion names {:#x}, not outstanding",
                            wc.wr_id
                        );
                    }
                }
            }
            Err(Error::CqeCorrupt | Error::CqeCompressed) => {}
            Err(e) => panic!("poll returned {e:?}"),
        }
    }
    let qp = &s.qp;
    // Counters: only forward, never past the producer / head.
    assert_eq!(qp.sq.producer(), pi, "poll moved the SQ producer");
    assert_eq!(qp.rq.head(), head, "poll moved the RQ head");
    assert!(qp.sq.retired().wrapping_sub(retired) <= pi.wrapping_sub(retired));
    assert!(qp.rq.tail().wrapping_sub(tail_rq) <= head.wrapping_sub(tail_rq));
    // Scatter-to-CQE writes only into posted buffers.
    let now = s.arena.bytes();
    let mut at = 0;
    for &(o, l) in SEND_BUF.iter().chain(RECV_BUF.iter()).filter(|b| b.1 != 0) {
        assert!(
            now[at..o] == s.pristine[at..o],
            "arena bytes {at}..{o}, outside every posted buffer, written"
        );
        at = at.max(o + l as usize);
    }
    assert!(now[at..] == s.pristine[at..], "arena tail written");
    let consumed = nseen != 0 || state(qp) != before;
    if now != &s.pristine[..] {
        s.arena.bytes_mut().copy_from_slice(&s.pristine);
    }
    consumed
}
