//! The per-opcode posts and the bound poll, against the generic `rdd_wr`
//! entry points on twin fake queues.

use super::*;
use crate::ffi::handle;
use crate::ffi::wr::{
    rdd_recv_wr, rdd_sge, rdd_wr, RDD_SEND_FENCE, RDD_SEND_INLINE, RDD_SEND_SIGNALED,
    RDD_SEND_SOLICITED, RDD_WR_ATOMIC_CMP_AND_SWP, RDD_WR_ATOMIC_FETCH_AND_ADD, RDD_WR_RDMA_READ,
    RDD_WR_RDMA_WRITE, RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_SEND, RDD_WR_SEND_WITH_IMM,
};
use crate::provider::mlx5::{QpState, WrSlot};
use crate::testutil::{FakeGeometry, FakeMlx5};
use core::ffi::c_void;
use core::ptr;
use std::boxed::Box;
use std::vec::Vec;

fn zeroed<T>() -> Box<T> {
    // SAFETY: the storage types are byte arrays: all zeroes is valid.
    unsafe { Box::new(core::mem::zeroed()) }
}

/// The QP buffer, both side tables, the doorbell records and the register.
type State = (Vec<u8>, Vec<WrSlot>, Vec<u64>, Vec<u8>, Vec<u8>);

/// One fake QP and CQ with live raw handles over them.
struct Raw {
    f: FakeMlx5,
    sq: Box<rdd_mlx5_sq_storage>,
    rq: Box<rdd_mlx5_rq_storage>,
    cq: Box<rdd_mlx5_cq_storage>,
}

impl Raw {
    fn new(sq_wqe_cnt: u32, sq_flags: u32) -> Raw {
        let geo = FakeGeometry {
            sq_wqe_cnt,
            ..FakeGeometry::default()
        };
        let mut r = Raw {
            f: FakeMlx5::new(geo),
            sq: zeroed(),
            rq: zeroed(),
            cq: zeroed(),
        };
        let qp: rdd_mlx5dv_qp = r.f.dv_qp().into();
        let cqd: rdd_mlx5dv_cq = r.f.dv_cq().into();
        let caps = rdd_qp_caps {
            max_send_sge: 4,
            max_inline_data: 60,
            max_recv_sge: geo.rq_stride / 16,
        };
        let n = r.f.sq_wrid.len();
        let wrid = r.f.sq_wrid.as_mut_ptr().cast::<rdd_mlx5_sq_slot>();
        let m = r.f.rq_wrid.len();
        let rwrid = r.f.rq_wrid.as_mut_ptr();
        // SAFETY: the fake's memory and tables outlive the handles (the
        // fake is dropped after them: no handle owns anything).
        unsafe {
            let s = rdd_mlx5_sq_init(&mut *r.sq, &qp, geo.qpn, &caps, sq_flags, wrid, n);
            assert_eq!(s, rdd_status::Ok);
            assert_eq!(
                rdd_mlx5_rq_init(&mut *r.rq, &qp, &caps, rwrid, m),
                rdd_status::Ok
            );
            assert_eq!(rdd_mlx5_cq_init(&mut *r.cq, &cqd), rdd_status::Ok);
        }
        r
    }

    /// Everything a post may write: ring, side table, records, register.
    fn state(&self) -> State {
        (
            self.f.qp_buf.bytes().to_vec(),
            self.f.sq_wrid.clone(),
            self.f.rq_wrid.clone(),
            self.f.dbrec.bytes().to_vec(),
            self.f.bf.bytes().to_vec(),
        )
    }
}

/// A per-opcode call and its `rdd_wr` equivalent.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    WriteImm(u32),
    Read,
    Send,
    SendImm(u32),
    WriteInline,
    SendInline,
    FetchAdd(u64),
    CmpSwap(u64, u64),
}

const RADDR: u64 = 0x7e00_1122_0040;
const RKEY: u32 = 0x0bad_cafe;
const PAYLOAD: [u8; 61] = [0x5a; 61];

/// Calls the per-opcode function for `op`.
///
/// # Safety
/// `sq` is a live handle over fake memory (SGEs are never dereferenced).
unsafe fn call(sq: *mut rdd_mlx5_sq_storage, op: Op, id: u64, len: u32, flags: u32) -> rdd_status {
    let (la, lk) = (0x7f5a_3c00_3000u64, 0x00a1_b2c3u32);
    let data = PAYLOAD.as_ptr().cast::<c_void>();
    // SAFETY: caller contract; the inline payload is a static array of
    // 61 bytes and `len` never exceeds it in these tests.
    unsafe {
        match op {
            Op::Write => rdd_mlx5_sq_write(sq, id, la, len, lk, RADDR, RKEY, flags),
            Op::WriteImm(i) => rdd_mlx5_sq_write_imm(sq, id, la, len, lk, RADDR, RKEY, i, flags),
            Op::Read => rdd_mlx5_sq_read(sq, id, la, len, lk, RADDR, RKEY, flags),
            Op::Send => rdd_mlx5_sq_send(sq, id, la, len, lk, flags),
            Op::SendImm(i) => rdd_mlx5_sq_send_imm(sq, id, la, len, lk, i, flags),
            Op::WriteInline => rdd_mlx5_sq_write_inline(sq, id, data, len, RADDR, RKEY, flags),
            Op::SendInline => rdd_mlx5_sq_send_inline(sq, id, data, len, flags),
            Op::FetchAdd(a) => rdd_mlx5_sq_fetch_add(sq, id, la, lk, RADDR, RKEY, a, flags),
            Op::CmpSwap(c, s) => rdd_mlx5_sq_cmp_swap(sq, id, la, lk, RADDR, RKEY, c, s, flags),
        }
    }
}

/// The `rdd_wr` (and its one SGE) that `call` stands for.
fn equivalent(op: Op, id: u64, len: u32, flags: u32) -> (rdd_wr, rdd_sge) {
    let mut sge = rdd_sge {
        addr: 0x7f5a_3c00_3000,
        length: len,
        lkey: 0x00a1_b2c3,
    };
    let mut w = rdd_wr {
        wr_id: id,
        sg_list: ptr::null(),
        num_sge: 1,
        opcode: RDD_WR_RDMA_WRITE,
        flags: flags & !RDD_SEND_DEFER_DOORBELL,
        imm_data: 0,
        remote_addr: RADDR,
        rkey: RKEY,
        invalidate_rkey: 0,
        compare_add: 0,
        swap: 0,
    };
    match op {
        Op::Write => {}
        Op::WriteImm(i) => (w.opcode, w.imm_data) = (RDD_WR_RDMA_WRITE_WITH_IMM, i),
        Op::Read => w.opcode = RDD_WR_RDMA_READ,
        Op::Send => w.opcode = RDD_WR_SEND,
        Op::SendImm(i) => (w.opcode, w.imm_data) = (RDD_WR_SEND_WITH_IMM, i),
        Op::WriteInline | Op::SendInline => {
            if let Op::SendInline = op {
                w.opcode = RDD_WR_SEND;
            }
            w.flags |= RDD_SEND_INLINE;
            sge = rdd_sge {
                addr: PAYLOAD.as_ptr() as u64,
                length: len,
                lkey: 0,
            };
        }
        Op::FetchAdd(a) => {
            (w.opcode, w.compare_add) = (RDD_WR_ATOMIC_FETCH_AND_ADD, a);
            sge.length = 8;
        }
        Op::CmpSwap(c, s) => {
            (w.opcode, w.compare_add, w.swap) = (RDD_WR_ATOMIC_CMP_AND_SWP, c, s);
            sge.length = 8;
        }
    }
    (w, sge)
}

const OPS: [Op; 9] = [
    Op::Write,
    Op::WriteImm(0xdead_beef),
    Op::Read,
    Op::Send,
    Op::SendImm(7),
    Op::WriteInline,
    Op::SendInline,
    Op::FetchAdd(0x0102_0304_0506_0708),
    Op::CmpSwap(1, 2),
];

#[test]
fn per_opcode_posts_write_what_rdd_mlx5_sq_post_writes() {
    // Twin queues, with and without BlueFlame; every opcode with several
    // flag sets, lengths (0, a full SGE, inline sizes) and doorbell modes,
    // until the ring has wrapped twice.
    for sq_flags in [RDD_MLX5_SQ_BF_NEVER, 0, RDD_MLX5_SQ_SIG_ALL] {
        let mut a = Raw::new(16, sq_flags);
        let mut b = Raw::new(16, sq_flags);
        let flag_sets = [
            RDD_SEND_SIGNALED,
            0,
            RDD_SEND_FENCE | RDD_SEND_SOLICITED,
            RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL,
            RDD_SEND_DEFER_DOORBELL,
        ];
        let mut id = 0u64;
        for round in 0..4u32 {
            for (k, &op) in OPS.iter().enumerate() {
                let flags = flag_sets[(k + round as usize) % flag_sets.len()];
                let len = [0, 8, 60, 13][(k + round as usize) % 4];
                // Keep room: retire everything by resetting both queues
                // the same way when the ring is close to full.
                // SAFETY: live handles (whole loop); SGEs never read.
                unsafe {
                    let qa = handle::get(&mut *a.sq as *mut rdd_mlx5_sq_storage).unwrap();
                    if qa.free_bbs() < 4 {
                        let pi = qa.producer();
                        qa.ring();
                        qa.reset_counters(pi);
                        let qb = handle::get(&mut *b.sq as *mut rdd_mlx5_sq_storage).unwrap();
                        qb.ring();
                        qb.reset_counters(pi);
                    }
                    let got = call(&mut *a.sq, op, id, len, flags);
                    let (mut w, sge) = equivalent(op, id, len, flags);
                    w.sg_list = &sge;
                    let mut bad = usize::MAX;
                    let want = rdd_mlx5_sq_post(&mut *b.sq, &w, 1, &mut bad);
                    assert_eq!(got, want, "{op:?} len {len} flags {flags:#x}");
                    assert_eq!(want, rdd_status::Ok, "{op:?} len {len}");
                    if flags & RDD_SEND_DEFER_DOORBELL == 0 {
                        assert_eq!(rdd_mlx5_sq_ring(&mut *b.sq), rdd_status::Ok);
                    }
                }
                assert!(a.state() == b.state(), "{op:?} len {len} flags {flags:#x}");
                id += 1;
            }
        }
        // A final ring covers what is still deferred, on both.
        // SAFETY: live handles.
        unsafe {
            assert_eq!(rdd_mlx5_sq_ring(&mut *a.sq), rdd_status::Ok);
            assert_eq!(rdd_mlx5_sq_ring(&mut *b.sq), rdd_status::Ok);
        }
        assert!(a.state() == b.state());
    }
}

#[test]
fn deferred_posts_wait_for_the_ringing_call() {
    let mut a = Raw::new(16, RDD_MLX5_SQ_BF_NEVER);
    // SAFETY: a live handle over fake memory.
    unsafe {
        for i in 0..3 {
            let s = call(&mut *a.sq, Op::Write, i, 8, RDD_SEND_DEFER_DOORBELL);
            assert_eq!(s, rdd_status::Ok);
        }
        assert_eq!(a.f.dbrec_sq(), 0, "deferred: no doorbell record");
        assert!(a.f.bf.bytes().iter().all(|&b| b == 0), "no register write");
        // A refused request does not ring either.
        let s = call(&mut *a.sq, Op::FetchAdd(1), 9, 8, 0x10);
        assert_eq!(s, rdd_status::InvalidFlags);
        assert_eq!(a.f.dbrec_sq(), 0);
        assert_eq!(call(&mut *a.sq, Op::Send, 3, 8, 0), rdd_status::Ok);
        assert_eq!(a.f.dbrec_sq(), 4, "one doorbell for all four");
        // The 8-byte doorbell carries the last WQE's first 8 bytes.
        assert_eq!(a.f.bf.bytes()[..8], a.f.sq_bytes()[3 * 64..3 * 64 + 8]);
        // Receives the same way.
        for i in 0..2 {
            let s = rdd_mlx5_rq_recv(&mut *a.rq, i, 0x5000, 64, 5, RDD_SEND_DEFER_DOORBELL);
            assert_eq!(s, rdd_status::Ok);
        }
        assert_eq!(a.f.dbrec_rq(), 0);
        assert_eq!(rdd_mlx5_rq_ring(&mut *a.rq), rdd_status::Ok);
        assert_eq!(a.f.dbrec_rq(), 2);
        assert_eq!(
            rdd_mlx5_rq_recv(&mut *a.rq, 2, 0x5000, 64, 5, 0),
            rdd_status::Ok
        );
        assert_eq!(a.f.dbrec_rq(), 3);
    }
}

#[test]
fn receives_write_what_rdd_mlx5_rq_post_writes() {
    let mut a = Raw::new(16, 0);
    let mut b = Raw::new(16, 0);
    for (i, len) in [0u32, 1, 4096, 0x7fff_ffff].into_iter().enumerate() {
        let sge = rdd_sge {
            addr: 0x9000 + i as u64,
            length: len,
            lkey: 0x77,
        };
        let w = rdd_recv_wr {
            wr_id: i as u64,
            sg_list: &sge,
            num_sge: 1,
            reserved: 0,
        };
        let mut bad = 0;
        // SAFETY: live handles; SGEs never dereferenced.
        unsafe {
            let got = rdd_mlx5_rq_recv(&mut *a.rq, i as u64, sge.addr, len, 0x77, 0);
            assert_eq!(got, rdd_status::Ok);
            assert_eq!(rdd_mlx5_rq_post(&mut *b.rq, &w, 1, &mut bad), got);
        }
        assert!(a.state() == b.state(), "receive of {len}");
    }
    // SAFETY: as above.
    unsafe {
        let before = a.state();
        let s = rdd_mlx5_rq_recv(&mut *a.rq, 9, 0x9000, 0x8000_0000, 1, 0);
        assert_eq!(s, rdd_status::LengthOverflow);
        let s = rdd_mlx5_rq_recv(&mut *a.rq, 9, 0x9000, 8, 1, RDD_SEND_SIGNALED);
        assert_eq!(s, rdd_status::InvalidFlags);
        assert!(a.state() == before);
    }
}

#[test]
fn a_queue_that_refuses_posts_changes_nothing() {
    // The raw C ABI has no state setter (raw queues start in RTS and stay
    // in a sending state), so the state is changed through the handle.
    let mut a = Raw::new(16, 0);
    // SAFETY: live handles over fake memory.
    unsafe {
        handle::get(&mut *a.sq as *mut rdd_mlx5_sq_storage)
            .unwrap()
            .set_state(QpState::Reset);
        handle::get(&mut *a.rq as *mut rdd_mlx5_rq_storage)
            .unwrap()
            .set_state(QpState::Reset);
        let before = a.state();
        for op in OPS {
            assert_eq!(
                call(&mut *a.sq, op, 1, 8, RDD_SEND_SIGNALED),
                rdd_status::InvalidQpState,
                "{op:?}"
            );
        }
        // The bursts, one-operation and batch paths: refused at index 0.
        let ops = [rdd_rdma_op {
            length: 8,
            ..rdd_rdma_op::default()
        }; 3];
        for n in [1, 3] {
            let mut posted = 99;
            let s = rdd_mlx5_sq_write_burst(&mut *a.sq, ops.as_ptr(), n, &mut posted);
            assert_eq!((s, posted), (rdd_status::InvalidQpState, 0));
            posted = 99;
            let s = rdd_mlx5_sq_read_burst(&mut *a.sq, ops.as_ptr(), n, &mut posted);
            assert_eq!((s, posted), (rdd_status::InvalidQpState, 0));
        }
        let s = rdd_mlx5_rq_recv(&mut *a.rq, 1, 0x9000, 8, 1, 0);
        assert_eq!(s, rdd_status::InvalidQpState);
        assert!(a.state() == before);
    }
}

#[test]
fn bound_poll_uses_the_bound_queues_and_rechecks_them() {
    let mut a = Raw::new(16, 0);
    let qpn = a.f.geo.qpn;
    let mut wc = [rdd_wc::default(); 4];
    // One raw pointer per storage, used for every call, as a C caller
    // holds them: the binding keeps the SQ and RQ pointers, so a fresh
    // `&mut` reborrow of the Box later would invalidate them.
    let cq: *mut rdd_mlx5_cq_storage = &mut *a.cq;
    let sq: *mut rdd_mlx5_sq_storage = &mut *a.sq;
    let rq: *mut rdd_mlx5_rq_storage = &mut *a.rq;
    // SAFETY: live handles over fake memory; `wc` has room for 4.
    unsafe {
        assert_eq!(
            rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 4),
            -(rdd_status::NoSuchObject as i32)
        );
        assert_eq!(rdd_mlx5_cq_bind(cq, sq, rq), rdd_status::Ok);
        // Deferred (never rung): the poller retires them all the same, and
        // the test then runs under Miri too (no doorbell instructions).
        for i in 0..3 {
            let flags = RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL;
            assert_eq!(call(sq, Op::Write, 10 + i, 8, flags), rdd_status::Ok);
        }
        let mut cqe = [0u8; 64];
        for (ci, counter) in [(0u32, 0u16), (1, 1), (2, 2)] {
            cqe[56..60].copy_from_slice(&(0x0800_0000 | qpn).to_be_bytes());
            cqe[60..62].copy_from_slice(&counter.to_be_bytes());
            a.f.write_cqe(ci, &cqe);
        }
        assert_eq!(rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 1), 1);
        assert_eq!(wc[0].wr_id, 10);
        assert_eq!(rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 0), 0);
        assert_eq!(rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 4), 2);
        assert_eq!((wc[0].wr_id, wc[1].wr_id), (11, 12));
        assert_eq!(a.f.dbrec_cq_ci(), 3);
        assert_eq!(rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 4), 0);
        assert_eq!(
            rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 0x8000_0000),
            -(rdd_status::InvalidArgument as i32)
        );
        // A finalised bound queue is refused, never dereferenced as live.
        assert_eq!(rdd_mlx5_rq_fini(rq), rdd_status::Ok);
        assert_eq!(
            rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 4),
            -(rdd_status::InvalidHandle as i32)
        );
        assert_eq!(rdd_mlx5_cq_unbind(cq), rdd_status::Ok);
        assert_eq!(
            rdd_mlx5_cq_poll_bound(cq, wc.as_mut_ptr(), 4),
            -(rdd_status::NoSuchObject as i32)
        );
    }
}

#[test]
fn deferred_per_opcode_posts_match_without_any_doorbell() {
    // No doorbell is rung here (every call deferred, no ring), so this test
    // runs under Miri as well: the per-opcode paths, their inline payload
    // slices and the rdd_wr translation, with every pointer checked.
    let mut a = Raw::new(64, 0);
    let mut b = Raw::new(64, 0);
    let (sa, sb): (*mut rdd_mlx5_sq_storage, *mut rdd_mlx5_sq_storage) = (&mut *a.sq, &mut *b.sq);
    for (k, &op) in OPS.iter().enumerate() {
        let flags = RDD_SEND_DEFER_DOORBELL | [0, RDD_SEND_SIGNALED, RDD_SEND_FENCE][k % 3];
        let len = [8, 0, 60][k % 3];
        let (mut w, sge) = equivalent(op, k as u64, len, flags);
        w.sg_list = &sge;
        let mut bad = 0;
        // SAFETY: live handles over fake memory; SGEs never dereferenced.
        let (got, want) = unsafe {
            (
                call(sa, op, k as u64, len, flags),
                rdd_mlx5_sq_post(sb, &w, 1, &mut bad),
            )
        };
        assert_eq!((got, want), (rdd_status::Ok, rdd_status::Ok), "{op:?}");
        assert!(a.state() == b.state(), "{op:?}");
    }
    assert_eq!(a.f.dbrec_sq(), 0);
    let (ra, rb): (*mut rdd_mlx5_rq_storage, *mut rdd_mlx5_rq_storage) = (&mut *a.rq, &mut *b.rq);
    // SAFETY: as above.
    unsafe {
        let s = rdd_mlx5_rq_recv(ra, 1, 0x5000, 64, 9, RDD_SEND_DEFER_DOORBELL);
        assert_eq!(s, rdd_status::Ok);
        let s = rdd_mlx5_rq_recv(rb, 1, 0x5000, 64, 9, RDD_SEND_DEFER_DOORBELL);
        assert_eq!(s, rdd_status::Ok);
    }
    assert!(a.state() == b.state());
}

#[test]
fn post_ring_of_one_writes_what_post_then_ring_writes() {
    // `rdd_mlx5_sq_post_ring` of one request (its one-request fast path
    // for the typed shapes) against `rdd_mlx5_sq_post` of the same request
    // then `rdd_mlx5_sq_ring`, whatever the request's status: the same
    // status, the same index and the same state. Each request follows a deferred SEND
    // left pending, which a refused request rings as well. The cases: every
    // opcode with SGE payload, a zero length, a length of 2^31 (refused
    // after the shape test), an immediate or a flag that leaves the typed
    // paths, a misaligned array, and a full ring (round 0 lets it fill).
    let cases: [(u32, u32, Option<u32>, bool); 6] = [
        (8, RDD_SEND_SIGNALED, None, false),
        (0, RDD_SEND_FENCE | RDD_SEND_SOLICITED, None, false),
        (1 << 31, RDD_SEND_SIGNALED, None, false),
        (8, RDD_SEND_SIGNALED, Some(5), false),
        (8, RDD_SEND_SIGNALED | 0x100, None, false),
        (8, RDD_SEND_SIGNALED, None, true),
    ];
    for sq_flags in [RDD_MLX5_SQ_BF_NEVER, 0] {
        let mut a = Raw::new(8, sq_flags);
        let mut b = Raw::new(8, sq_flags);
        let mut id = 0u64;
        for round in 0..3 {
            for op in OPS {
                if matches!(op, Op::WriteInline | Op::SendInline) {
                    continue;
                }
                for (len, flags, imm, misaligned) in cases {
                    // SAFETY: live handles (whole loop); SGEs never read;
                    // `buf` holds the request at `at`, inside it.
                    unsafe {
                        let qa = handle::get(&mut *a.sq as *mut rdd_mlx5_sq_storage).unwrap();
                        if round > 0 && qa.free_bbs() < 3 {
                            let pi = qa.producer();
                            qa.ring();
                            qa.reset_counters(pi);
                            let qb = handle::get(&mut *b.sq as *mut rdd_mlx5_sq_storage).unwrap();
                            qb.ring();
                            qb.reset_counters(pi);
                        }
                        let d = RDD_SEND_DEFER_DOORBELL;
                        let pa = call(&mut *a.sq, Op::Send, id, 4, d);
                        assert_eq!(pa, call(&mut *b.sq, Op::Send, id, 4, d));
                        let (mut w, sge) = equivalent(op, id + 1, len, flags);
                        w.sg_list = &sge;
                        if let Some(i) = imm {
                            w.imm_data = i;
                        }
                        let mut buf = [0u64; 9];
                        let at = buf
                            .as_mut_ptr()
                            .cast::<u8>()
                            .add(usize::from(misaligned) * 4);
                        at.cast::<rdd_wr>().write_unaligned(w);
                        let wr = at.cast::<rdd_wr>().cast_const();
                        let (mut bad_a, mut bad_b) = (usize::MAX, usize::MAX);
                        let got = rdd_mlx5_sq_post_ring(&mut *a.sq, wr, 1, &mut bad_a);
                        let want = rdd_mlx5_sq_post(&mut *b.sq, wr, 1, &mut bad_b);
                        // A refused array (not a refused request) is not
                        // rung, as for more requests.
                        if !misaligned {
                            assert_eq!(rdd_mlx5_sq_ring(&mut *b.sq), rdd_status::Ok);
                        }
                        let what =
                            std::format!("{op:?} len {len} flags {flags:#x} {imm:?} {misaligned}");
                        assert_eq!((got, bad_a), (want, bad_b), "{what}");
                        assert!(a.state() == b.state(), "{what}");
                    }
                    id += 2;
                }
            }
        }
        // The argument checks of a single request, on a queue with a
        // pending WQE: nothing written, nothing rung.
        // SAFETY: live handles; `w`'s SGE is never read.
        unsafe {
            let s = call(&mut *a.sq, Op::Send, id, 4, RDD_SEND_DEFER_DOORBELL);
            assert_eq!(s, rdd_status::Ok);
            let before = a.state();
            let (mut w, sge) = equivalent(Op::Write, id, 8, RDD_SEND_SIGNALED);
            w.sg_list = &sge;
            let null = ptr::null_mut();
            let s = rdd_mlx5_sq_post_ring(&mut *a.sq, &w, 1, null);
            assert_eq!(s, rdd_status::NullParameter);
            let mut bad = usize::MAX;
            let mut dead = zeroed::<rdd_mlx5_sq_storage>();
            let s = rdd_mlx5_sq_post_ring(&mut *dead, &w, 1, &mut bad);
            assert_eq!((s, bad), (rdd_status::InvalidHandle, usize::MAX));
            assert!(a.state() == before);
        }
    }
}
