//! Post/poll cost benchmark, run by `scripts/bench.sh` under callgrind
//! (results in `docs/benchmarks.md`).
//!
//! Every measured operation lives in an `#[inline(never)]`, `#[no_mangle]`
//! function (`rdd_post_1`, `rdd_post_16`, `rdd_poll_1`, `rdd_poll_16`,
//! plus the extra `rdd_post_1_opaque`, `rdd_post_16_opaque`,
//! `rdd_shared_post_1`, `rdd_shared_post_16` and the C-ABI rows
//! `rdd_abi_post_1`, `rdd_abi_post_16`, `rdd_abi_poll`,
//! `rdd_abi_post_ring_1`, `rdd_abi_post_ring_16`, `rdd_abi_op_post_1`,
//! `rdd_abi_op_post_16`, `rdd_abi_poll_bound`), so that
//! `valgrind --tool=callgrind --toggle-collect=<name>` counts exactly the
//! instructions of those calls. Everything that keeps the queues going
//! (retiring posted work, posting the WRs that polled CQEs complete,
//! writing CQEs) happens in the driver loops, outside the measured
//! functions.
//!
//! The WR is the measured shape: RC RDMA_WRITE, 8 bytes, one SGE, signaled,
//! every field a runtime value read from a [`WriteDesc`] (the C reference
//! `benches/c/mlx5_ref.c` reads the same struct). Queues live in
//! [`FakeMlx5`] memory: a 256-BB send queue, a 256-entry CQ of 64-byte
//! CQEs, 256-byte BlueFlame buffers.
//!
//! Usage: `post_poll [BENCH...] [--iters N]`, BENCH one of `post_1`,
//! `post_16`, `post_bf`, `poll_1`, `poll_16`, `poll_empty`,
//! `post_1_opaque`, `post_16_opaque`, `shared_post_1`, `shared_post_16`
//! (a multi-producer queue, one thread), `abi_post_1`, `abi_post_16`,
//! `abi_poll_1`, `abi_poll_16`, `abi_post_ring_1`, `abi_post_ring_16`,
//! `abi_op_post_1`, `abi_op_post_16` (the per-opcode `rdd_mlx5_sq_write`:
//! one ringing call, or 15 deferred calls and one ringing),
//! `abi_poll_bound_1`, `abi_poll_bound_16` (`rdd_mlx5_cq_poll_bound` after
//! `rdd_mlx5_cq_bind`): the raw-queue C ABI, called as a C program would
//! (default: all; `--bench` from `cargo bench` is ignored). For every bench the program prints
//! `bench=<bench> fn=<function> calls=<n> ops_per_call=<k>`, then a
//! wall-clock estimate, which is noisy and secondary: the primary number is
//! the callgrind instruction count the script computes.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Instant;

use rdma_direct::ffi::mlx5::rdd_rdma_op;
use rdma_direct::ffi::mlx5::{
    rdd_mlx5_cq_bind, rdd_mlx5_cq_init, rdd_mlx5_cq_poll, rdd_mlx5_cq_poll_bound,
    rdd_mlx5_cq_storage, rdd_mlx5_rq_init, rdd_mlx5_rq_storage, rdd_mlx5_sq_init, rdd_mlx5_sq_post,
    rdd_mlx5_sq_post_ring, rdd_mlx5_sq_ring, rdd_mlx5_sq_slot, rdd_mlx5_sq_storage,
    rdd_mlx5_sq_write, rdd_mlx5_sq_write_burst, rdd_mlx5dv_cq, rdd_mlx5dv_qp, rdd_qp_caps, rdd_wc,
    RDD_MLX5_SQ_BF_NEVER, RDD_SEND_DEFER_DOORBELL,
};
use rdma_direct::ffi::rdd_status;
use rdma_direct::ffi::wr::{rdd_sge, rdd_wr, RDD_WR_RDMA_WRITE};
use rdma_direct::provider::mlx5::{
    BfPolicy, CompletionQueue, Mlx5Qp, SendQueue, SharedSendQueue, SharedStorage, SqConfig,
    SqRetire, Wc, WrSlot,
};
use rdma_direct::testutil::{FakeGeometry, FakeMlx5};
use rdma_direct::{Remote, Result, SendFlags, SendOp, SendWr, Sge};

/// WRs per doorbell in the batched post; CQEs per call in the batched poll.
const BATCH: usize = 16;
/// Default number of calls of each measured function.
const DEFAULT_ITERS: u64 = 10_000;
/// mlx5 opcode of RDMA_WRITE (docs/spec/mlx5.md §4), for the CQEs.
const MLX5_OPCODE_RDMA_WRITE: u32 = 0x08;

#[path = "support/write_desc.rs"]
mod write_desc;
use write_desc::WriteDesc;

/// The descriptor's SGE.
#[inline(always)]
fn sge_of(d: &WriteDesc) -> [Sge; 1] {
    [Sge::new(d.laddr, d.len, d.lkey)]
}

/// The descriptor's typed WR (RDMA WRITE), gathering from `sge`.
#[inline(always)]
fn wr_of<'a>(d: &WriteDesc, sge: &'a [Sge; 1]) -> SendWr<'a> {
    SendWr::new(
        d.wr_id,
        SendOp::Write {
            remote: Remote::new(d.raddr, d.rkey),
        },
        sge,
        SendFlags(d.flags),
    )
}

/// Posts the descriptor's WR without a doorbell (the driver loops), the
/// typed WR built where it is posted, as application code does.
#[inline(always)]
fn post_desc(sq: &mut SendQueue, d: &WriteDesc) -> Result<()> {
    let sge = sge_of(d);
    let wr = wr_of(d, &sge);
    // SAFETY: the SGE names memory no device touches (the fake device
    // never reads the ring).
    unsafe { sq.post(&wr) }
}

/// One RDMA_WRITE and its doorbell, through `post_one` (the single-WR API).
#[no_mangle]
#[inline(never)]
pub fn rdd_post_1(sq: &mut SendQueue, d: &WriteDesc) -> Result<()> {
    let sge = sge_of(d);
    let wr = wr_of(d, &sge);
    // SAFETY: as in `post_desc`.
    unsafe { sq.post_one(&wr) }
}

/// [`BATCH`] RDMA_WRITEs and one doorbell, through a
/// [`SendBatch`](rdma_direct::provider::mlx5::SendBatch) (the
/// run-of-posts API `post_list` is built on; on an error, what was posted
/// is rung).
#[no_mangle]
#[inline(never)]
pub fn rdd_post_16(sq: &mut SendQueue, ds: &[WriteDesc; BATCH]) -> Result<()> {
    let mut b = sq.batch();
    for d in ds {
        let sge = sge_of(d);
        let wr = wr_of(d, &sge);
        // SAFETY: as in `post_desc`.
        if let Err(e) = unsafe { b.post(&wr) } {
            b.ring();
            return Err(e);
        }
    }
    b.ring();
    Ok(())
}

/// Extra: one WR the compiler cannot see into (a caller-built `SendWr`
/// behind a pointer, as a C entry point receives it): the generic encoder.
#[no_mangle]
#[inline(never)]
pub fn rdd_post_1_opaque(sq: &mut SendQueue, wr: &SendWr<'_>) -> Result<()> {
    // SAFETY: as in `post_desc`.
    unsafe { sq.post_one(wr) }
}

/// Extra: `post_list` over [`BATCH`] opaque WRs.
#[no_mangle]
#[inline(never)]
pub fn rdd_post_16_opaque(sq: &mut SendQueue, wrs: &[SendWr<'_>; BATCH]) -> bool {
    // SAFETY: as in `post_desc`.
    unsafe { sq.post_list(wrs) }.is_ok()
}

/// Polls at most one completion.
#[no_mangle]
#[inline(never)]
pub fn rdd_poll_1(cq: &mut CompletionQueue, qp: &mut Mlx5Qp, wc: &mut [Wc; 1]) -> Result<usize> {
    cq.poll(qp, wc)
}

/// Polls at most [`BATCH`] completions (also run on an empty CQ).
#[no_mangle]
#[inline(never)]
pub fn rdd_poll_16(
    cq: &mut CompletionQueue,
    qp: &mut Mlx5Qp,
    wc: &mut [Wc; BATCH],
) -> Result<usize> {
    cq.poll(qp, wc)
}

/// Extra: one WR into a multi-producer [`SharedSendQueue`], uncontended:
/// the reservation, publication and doorbell election of `SharedQp`.
#[no_mangle]
#[inline(never)]
pub fn rdd_shared_post_1(sq: &SharedSendQueue, d: &WriteDesc) -> Result<()> {
    let sge = sge_of(d);
    let wr = wr_of(d, &sge);
    // SAFETY: as in `post_desc`.
    unsafe { sq.post(&wr) }
}

/// Extra: a list of [`BATCH`] WRs into a multi-producer
/// [`SharedSendQueue`] (one reservation and one doorbell request for the
/// list). The `SendWr` array is built here, as a caller would.
#[no_mangle]
#[inline(never)]
pub fn rdd_shared_post_16(sq: &SharedSendQueue, ds: &[WriteDesc; BATCH]) -> bool {
    let sges: [[Sge; 1]; BATCH] = core::array::from_fn(|i| sge_of(&ds[i]));
    let wrs: [SendWr<'_>; BATCH] = core::array::from_fn(|i| wr_of(&ds[i], &sges[i]));
    // SAFETY: as in `post_desc`.
    unsafe { sq.post_list(&wrs) }.is_ok()
}

/// A C caller's request for the descriptor (what `rdd_mlx5_sq_post` reads).
#[inline(always)]
fn c_wr(d: &WriteDesc, sge: &rdd_sge) -> rdd_wr {
    rdd_wr {
        wr_id: d.wr_id,
        sg_list: sge,
        num_sge: 1,
        opcode: RDD_WR_RDMA_WRITE,
        flags: d.flags,
        imm_data: 0,
        remote_addr: d.raddr,
        rkey: d.rkey,
        invalidate_rkey: 0,
        compare_add: 0,
        swap: 0,
    }
}

/// The requests `post(array, n)` gets from a C caller posting `ds`, built
/// from the descriptors as a C program would (`rdd_sge`s and `rdd_wr`s on
/// the stack).
#[inline(always)]
fn with_c_wrs<const N: usize>(
    ds: &[WriteDesc; N],
    post: impl FnOnce(*const rdd_wr, usize) -> rdd_status,
) -> rdd_status {
    let sges: [rdd_sge; N] = core::array::from_fn(|i| rdd_sge {
        addr: ds[i].laddr,
        length: ds[i].len,
        lkey: ds[i].lkey,
    });
    let ws: [rdd_wr; N] = core::array::from_fn(|i| c_wr(&ds[i], &sges[i]));
    post(ws.as_ptr(), N)
}

/// `rdd_mlx5_sq_post`, then `rdd_mlx5_sq_ring` if it succeeded.
#[inline(always)]
fn c_post_then_ring(sq: &mut rdd_mlx5_sq_storage, ws: *const rdd_wr, n: usize) -> rdd_status {
    let mut bad = 0usize;
    // SAFETY: a live handle; `ws` holds `n` requests whose SGEs are
    // readable; SGEs are never dereferenced by the fake device.
    let s = unsafe { rdd_mlx5_sq_post(sq, ws, n, &mut bad) };
    if s != rdd_status::Ok {
        return s;
    }
    // SAFETY: as above.
    unsafe { rdd_mlx5_sq_ring(sq) }
}

/// `rdd_mlx5_sq_post_ring`.
#[inline(always)]
fn c_post_ring(sq: &mut rdd_mlx5_sq_storage, ws: *const rdd_wr, n: usize) -> rdd_status {
    let mut bad = 0usize;
    // SAFETY: as in `c_post_then_ring`.
    unsafe { rdd_mlx5_sq_post_ring(sq, ws, n, &mut bad) }
}

/// Extra: what a C program pays to post one WR through the C ABI
/// (`rdd_mlx5_sq_post` of one `rdd_wr`, then `rdd_mlx5_sq_ring`).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_post_1(sq: &mut rdd_mlx5_sq_storage, d: &WriteDesc) -> rdd_status {
    with_c_wrs(core::array::from_ref(d), |ws, n| {
        c_post_then_ring(sq, ws, n)
    })
}

/// Extra: [`BATCH`] WRs through the C ABI (one `rdd_mlx5_sq_post` of an
/// array, one `rdd_mlx5_sq_ring`).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_post_16(sq: &mut rdd_mlx5_sq_storage, ds: &[WriteDesc; BATCH]) -> rdd_status {
    with_c_wrs(ds, |ws, n| c_post_then_ring(sq, ws, n))
}

/// Extra: one WR through the C ABI's combined call (`rdd_mlx5_sq_post_ring`).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_post_ring_1(sq: &mut rdd_mlx5_sq_storage, d: &WriteDesc) -> rdd_status {
    with_c_wrs(core::array::from_ref(d), |ws, n| c_post_ring(sq, ws, n))
}

/// Extra: [`BATCH`] WRs through `rdd_mlx5_sq_post_ring`.
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_post_ring_16(sq: &mut rdd_mlx5_sq_storage, ds: &[WriteDesc; BATCH]) -> rdd_status {
    with_c_wrs(ds, |ws, n| c_post_ring(sq, ws, n))
}

/// Extra: one WR through the per-opcode C call (`rdd_mlx5_sq_write`
/// with the descriptor's scalars, ringing the doorbell).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_op_post_1(sq: &mut rdd_mlx5_sq_storage, d: &WriteDesc) -> rdd_status {
    // SAFETY: a live handle; the SGE is never dereferenced by the fake
    // device.
    unsafe {
        rdd_mlx5_sq_write(
            sq, d.wr_id, d.laddr, d.len, d.lkey, d.raddr, d.rkey, d.flags,
        )
    }
}

// `WriteDesc` is the C struct `rdd_rdma_op`, field for field: a C program
// keeps its operations in that struct and hands the array to the burst.
const _: () = assert!(
    std::mem::size_of::<WriteDesc>() == std::mem::size_of::<rdd_rdma_op>()
        && std::mem::offset_of!(WriteDesc, wr_id) == std::mem::offset_of!(rdd_rdma_op, wr_id)
        && std::mem::offset_of!(WriteDesc, laddr) == std::mem::offset_of!(rdd_rdma_op, laddr)
        && std::mem::offset_of!(WriteDesc, raddr) == std::mem::offset_of!(rdd_rdma_op, raddr)
        && std::mem::offset_of!(WriteDesc, len) == std::mem::offset_of!(rdd_rdma_op, length)
        && std::mem::offset_of!(WriteDesc, lkey) == std::mem::offset_of!(rdd_rdma_op, lkey)
        && std::mem::offset_of!(WriteDesc, rkey) == std::mem::offset_of!(rdd_rdma_op, rkey)
        && std::mem::offset_of!(WriteDesc, flags) == std::mem::offset_of!(rdd_rdma_op, flags)
);

/// Extra: one WR through the burst call (`rdd_mlx5_sq_write_burst` of
/// one descriptor, ringing the doorbell).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_burst_1(sq: &mut rdd_mlx5_sq_storage, d: &WriteDesc) -> rdd_status {
    // SAFETY: a live handle; one readable descriptor (same layout,
    // asserted above); the SGE is never dereferenced by the fake device.
    unsafe {
        rdd_mlx5_sq_write_burst(
            sq,
            (d as *const WriteDesc).cast::<rdd_rdma_op>(),
            1,
            std::ptr::null_mut(),
        )
    }
}

/// Extra: [`BATCH`] WRs in one burst call and one doorbell.
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_burst_16(sq: &mut rdd_mlx5_sq_storage, ds: &[WriteDesc; BATCH]) -> rdd_status {
    // SAFETY: as in `rdd_abi_burst_1`, for `BATCH` descriptors.
    unsafe {
        rdd_mlx5_sq_write_burst(
            sq,
            ds.as_ptr().cast::<rdd_rdma_op>(),
            BATCH as u32,
            std::ptr::null_mut(),
        )
    }
}

/// Extra: [`BATCH`] WRs through the per-opcode C call: the first 15 with
/// `RDD_SEND_DEFER_DOORBELL`, the last one ringing for all of them.
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_op_post_16(sq: &mut rdd_mlx5_sq_storage, ds: &[WriteDesc; BATCH]) -> rdd_status {
    for (i, d) in ds.iter().enumerate() {
        let defer = if i + 1 < BATCH {
            RDD_SEND_DEFER_DOORBELL
        } else {
            0
        };
        // SAFETY: as in `rdd_abi_op_post_1`.
        let s = unsafe {
            rdd_mlx5_sq_write(
                sq,
                d.wr_id,
                d.laddr,
                d.len,
                d.lkey,
                d.raddr,
                d.rkey,
                d.flags | defer,
            )
        };
        if s != rdd_status::Ok {
            return s;
        }
    }
    rdd_status::Ok
}

/// Extra: polling through the bound C call (`rdd_mlx5_cq_poll_bound` of
/// up to `n`, the SQ and RQ bound to the CQ beforehand).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_poll_bound(cq: &mut rdd_mlx5_cq_storage, out: &mut [rdd_wc; BATCH], n: u32) -> i32 {
    // SAFETY: a live, bound handle; `out` has room for n <= BATCH entries.
    let got = unsafe { rdd_mlx5_cq_poll_bound(cq, out.as_mut_ptr(), n) };
    assert!(got >= 0);
    got
}

/// Extra: polling through the C ABI (`rdd_mlx5_cq_poll` of up to `n`).
#[no_mangle]
#[inline(never)]
pub fn rdd_abi_poll(
    cq: &mut rdd_mlx5_cq_storage,
    sq: &mut rdd_mlx5_sq_storage,
    rq: &mut rdd_mlx5_rq_storage,
    out: &mut [rdd_wc; BATCH],
    n: usize,
) -> usize {
    let mut got = 0usize;
    // SAFETY: live handles; `out` has room for n <= BATCH entries.
    let s = unsafe { rdd_mlx5_cq_poll(cq, sq, rq, out.as_mut_ptr(), n, &mut got) };
    assert_eq!(s, rdd_status::Ok);
    got
}

fn geometry() -> FakeGeometry {
    FakeGeometry {
        sq_wqe_cnt: 256,
        cqe_cnt: 256,
        bf_size: 256,
        ..FakeGeometry::default()
    }
}

fn new_sq(f: &mut FakeMlx5, bf_policy: BfPolicy) -> SendQueue {
    let caps = f.caps(4, 60);
    f.send_queue(
        caps,
        SqConfig {
            bf_policy,
            ..SqConfig::default()
        },
    )
    .expect("send queue")
}

fn desc(wr_id: u64) -> WriteDesc {
    WriteDesc {
        wr_id,
        laddr: 0x7f5a_3c00_3000,
        raddr: 0x7e00_1122_0000,
        len: 8,
        lkey: 0x00a1_b2c3,
        rkey: 0x0bad_cafe,
        flags: SendFlags::SIGNALED.0,
    }
}

/// A successful requester CQE for the WQE at 16-bit index `counter`.
fn req_cqe(qpn: u32, counter: u16) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[56..60].copy_from_slice(&(MLX5_OPCODE_RDMA_WRITE << 24 | qpn).to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c
}

struct Report {
    bench: &'static str,
    func: &'static str,
    calls: u64,
    ops_per_call: u64,
    start: Instant,
}

/// Reports a post bench that measured `names.0` (one WR per call) or, if
/// `batch`, `names.1` ([`BATCH`] WRs per call).
fn report_post(
    bench: &'static str,
    iters: u64,
    batch: bool,
    names: (&'static str, &'static str),
    start: Instant,
) {
    let (func, ops_per_call) = if batch {
        (names.1, BATCH as u64)
    } else {
        (names.0, 1)
    };
    Report {
        bench,
        func,
        calls: iters,
        ops_per_call,
        start,
    }
    .done();
}

impl Report {
    fn done(self) {
        println!(
            "bench={} fn={} calls={} ops_per_call={}",
            self.bench, self.func, self.calls, self.ops_per_call
        );
        let ns =
            self.start.elapsed().as_nanos() as f64 / (self.calls * self.ops_per_call.max(1)) as f64;
        println!("  wall clock (noisy, includes the driver loop): {ns:.1} ns/op");
    }
}

fn bench_post(bench: &'static str, iters: u64, policy: BfPolicy, batch: bool) {
    let mut f = FakeMlx5::new(geometry());
    let mut sq = new_sq(&mut f, policy);
    let start = Instant::now();
    let mut id = 0u64;
    for _ in 0..iters {
        if batch {
            let ds: [WriteDesc; BATCH] = core::array::from_fn(|i| desc(id + i as u64));
            rdd_post_16(black_box(&mut sq), black_box(&ds)).expect("post");
            id += BATCH as u64;
        } else {
            rdd_post_1(black_box(&mut sq), black_box(&desc(id))).expect("post");
            id += 1;
        }
        // Retire everything (outside the measured function).
        let last = sq.producer().wrapping_sub(1) as u16;
        sq.retire(last).expect("retire");
    }
    report_post(bench, iters, batch, ("rdd_post_1", "rdd_post_16"), start);
}

fn bench_post_opaque(bench: &'static str, iters: u64, batch: bool) {
    let mut f = FakeMlx5::new(geometry());
    let mut sq = new_sq(&mut f, BfPolicy::Never);
    let sge = [Sge::new(0x7f5a_3c00_3000, 8, 0x00a1_b2c3)];
    let start = Instant::now();
    for i in 0..iters {
        let wr = SendWr::new(
            i,
            SendOp::Write {
                remote: Remote::new(0x7e00_1122_0000, 0x0bad_cafe),
            },
            &sge,
            SendFlags::SIGNALED,
        );
        if batch {
            let wrs = [wr; BATCH];
            assert!(rdd_post_16_opaque(black_box(&mut sq), black_box(&wrs)));
        } else {
            rdd_post_1_opaque(black_box(&mut sq), black_box(&wr)).expect("post");
        }
        let last = sq.producer().wrapping_sub(1) as u16;
        sq.retire(last).expect("retire");
    }
    report_post(
        bench,
        iters,
        batch,
        ("rdd_post_1_opaque", "rdd_post_16_opaque"),
        start,
    );
}

fn bench_shared(bench: &'static str, iters: u64, batch: bool) {
    // `f`, `slots` and `ready` outlive `sq` (declared before it).
    let f = FakeMlx5::new(geometry());
    let caps = f.caps(4, 60);
    let n = f.geo.sq_wqe_cnt as usize;
    let mut slots = vec![WrSlot::default(); n];
    let ready: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
    let storage = SharedStorage {
        slots: NonNull::new(slots.as_mut_ptr()).expect("slots"),
        ready: NonNull::new(ready.as_ptr() as *mut AtomicU32).expect("ready"),
        len: n,
    };
    // SAFETY: the fake's memory, the side table and the ready words (all 0,
    // the start counter) outlive the queue; SGEs are never dereferenced.
    let sq = unsafe {
        SharedSendQueue::from_raw(&f.dv_qp(), f.geo.qpn, caps, SqConfig::default(), storage, 0)
    }
    .expect("shared send queue");
    // SAFETY: the only retirer.
    let mut retirer = unsafe { sq.retirer() };
    let start = Instant::now();
    let mut id = 0u64;
    for _ in 0..iters {
        if batch {
            let ds: [WriteDesc; BATCH] = core::array::from_fn(|i| desc(id + i as u64));
            assert!(rdd_shared_post_16(black_box(&sq), black_box(&ds)));
            id += BATCH as u64;
        } else {
            rdd_shared_post_1(black_box(&sq), black_box(&desc(id))).expect("post");
            id += 1;
        }
        // Retire everything (outside the measured function): every WQE is
        // one BB, so the last one starts at BB id - 1.
        let r = retirer.retire((id - 1) as u16).expect("retire");
        assert_eq!(r.wr_id, id - 1);
    }
    assert_eq!(f.dbrec_sq(), (id & 0xffff) as u32, "every WQE rung");
    report_post(
        bench,
        iters,
        batch,
        ("rdd_shared_post_1", "rdd_shared_post_16"),
        start,
    );
}

/// Which C-ABI call a row measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Abi {
    /// `rdd_mlx5_sq_post` + `rdd_mlx5_sq_ring`.
    PostThenRing,
    /// `rdd_mlx5_sq_post_ring`.
    PostRing,
    /// `rdd_mlx5_sq_write` (deferred doorbells in a batch).
    Op,
    /// `rdd_mlx5_sq_write_burst`.
    Burst,
    /// `rdd_mlx5_cq_poll`.
    Poll,
    /// `rdd_mlx5_cq_poll_bound`.
    PollBound,
}

/// The C-ABI rows: the post rows measure posting (a CQE per WQE is written
/// and polled outside the measured function), the poll rows measure
/// polling (posting outside).
fn bench_abi(bench: &'static str, iters: u64, what: Abi, per: usize) {
    let mut f = FakeMlx5::new(geometry());
    let qp = rdd_mlx5dv_qp::from(f.dv_qp());
    let cqd = rdd_mlx5dv_cq::from(f.dv_cq());
    let caps = rdd_qp_caps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: f.geo.rq_stride / 16,
    };
    let qpn = f.geo.qpn;
    // Raw pointers, as a C program holds its storages: the CQ binding keeps
    // the SQ and RQ pointers, which a later `&mut` reborrow of a `Box`
    // would invalidate; every `&mut` below is derived from these.
    // SAFETY: the storage types are plain byte arrays: zeroes are valid.
    let (sq, rq, cq): (
        *mut rdd_mlx5_sq_storage,
        *mut rdd_mlx5_rq_storage,
        *mut rdd_mlx5_cq_storage,
    ) = unsafe {
        (
            Box::into_raw(Box::new(std::mem::zeroed())),
            Box::into_raw(Box::new(std::mem::zeroed())),
            Box::into_raw(Box::new(std::mem::zeroed())),
        )
    };
    // SAFETY: the slot type is plain data: zeroes are valid.
    let mut slots: Vec<rdd_mlx5_sq_slot> = (0..f.geo.sq_wqe_cnt)
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    let mut rq_ids = vec![0u64; f.geo.rq_wqe_cnt as usize];
    // SAFETY: the fake's memory and the tables outlive the handles (all
    // dropped at the end of this function, handles first: they hold no
    // destructor, and nothing uses them after the loop).
    unsafe {
        let n = slots.len();
        // No BlueFlame, as in the `post_1` row.
        let s = rdd_mlx5_sq_init(
            sq,
            &qp,
            qpn,
            &caps,
            RDD_MLX5_SQ_BF_NEVER,
            slots.as_mut_ptr(),
            n,
        );
        assert_eq!(s, rdd_status::Ok);
        let n = rq_ids.len();
        assert_eq!(
            rdd_mlx5_rq_init(rq, &qp, &caps, rq_ids.as_mut_ptr(), n),
            rdd_status::Ok
        );
        assert_eq!(rdd_mlx5_cq_init(cq, &cqd), rdd_status::Ok);
        assert_eq!(rdd_mlx5_cq_bind(cq, sq, rq), rdd_status::Ok);
    }
    // SAFETY: the C completion entry is plain data: zeroes are valid.
    let mut out: [rdd_wc; BATCH] = unsafe { std::mem::zeroed() };
    let (mut id, mut ci, mut pi) = (0u64, 0u32, 0u32);
    let start = Instant::now();
    for _ in 0..iters {
        let ds: [WriteDesc; BATCH] = core::array::from_fn(|i| desc(id + i as u64));
        // SAFETY: the storages are live and used by nothing else now.
        let (sq, rq, cq) = unsafe { (&mut *sq, &mut *rq, &mut *cq) };
        let s = match (what, per) {
            (Abi::PostRing, 1) => rdd_abi_post_ring_1(black_box(&mut *sq), black_box(&ds[0])),
            (Abi::PostRing, _) => rdd_abi_post_ring_16(black_box(&mut *sq), black_box(&ds)),
            (Abi::Op, 1) => rdd_abi_op_post_1(black_box(&mut *sq), black_box(&ds[0])),
            (Abi::Op, _) => rdd_abi_op_post_16(black_box(&mut *sq), black_box(&ds)),
            (Abi::Burst, 1) => rdd_abi_burst_1(black_box(&mut *sq), black_box(&ds[0])),
            (Abi::Burst, _) => rdd_abi_burst_16(black_box(&mut *sq), black_box(&ds)),
            (_, 1) => rdd_abi_post_1(black_box(&mut *sq), black_box(&ds[0])),
            (_, _) => rdd_abi_post_16(black_box(&mut *sq), black_box(&ds)),
        };
        assert_eq!(s, rdd_status::Ok);
        // One CQE per (signaled) WQE, then the poll that retires them.
        for _ in 0..per {
            f.write_cqe(ci, &req_cqe(qpn, pi as u16));
            ci += 1;
            pi += 1;
        }
        let got = if what == Abi::PollBound {
            rdd_abi_poll_bound(black_box(&mut *cq), black_box(&mut out), per as u32) as usize
        } else {
            rdd_abi_poll(
                black_box(&mut *cq),
                black_box(&mut *sq),
                black_box(&mut *rq),
                black_box(&mut out),
                per,
            )
        };
        assert_eq!(got, per);
        assert_eq!(out[per - 1].wr_id, id + per as u64 - 1);
        id += per as u64;
    }
    assert_eq!(f.dbrec_sq(), pi & 0xffff, "every WQE rung");
    // SAFETY: from `Box::into_raw` above, not used after this (the handles
    // own nothing that needs finalising).
    unsafe {
        drop(Box::from_raw(sq));
        drop(Box::from_raw(rq));
        drop(Box::from_raw(cq));
    }
    let func = match (what, per) {
        (Abi::Poll, _) => "rdd_abi_poll",
        (Abi::PollBound, _) => "rdd_abi_poll_bound",
        (Abi::PostThenRing, 1) => "rdd_abi_post_1",
        (Abi::PostThenRing, _) => "rdd_abi_post_16",
        (Abi::PostRing, 1) => "rdd_abi_post_ring_1",
        (Abi::PostRing, _) => "rdd_abi_post_ring_16",
        (Abi::Op, 1) => "rdd_abi_op_post_1",
        (Abi::Op, _) => "rdd_abi_op_post_16",
        (Abi::Burst, 1) => "rdd_abi_burst_1",
        (Abi::Burst, _) => "rdd_abi_burst_16",
    };
    Report {
        bench,
        func,
        calls: iters,
        ops_per_call: per as u64,
        start,
    }
    .done();
}

fn bench_poll(bench: &'static str, iters: u64, per_call: usize) {
    let mut f = FakeMlx5::new(geometry());
    let sq = new_sq(&mut f, BfPolicy::Never);
    let caps = f.caps(4, 60);
    let rq = f.recv_queue(caps).expect("rq");
    let mut cq = f.completion_queue().expect("cq");
    let mut qp = Mlx5Qp { sq, rq };
    let qpn = qp.sq.qpn();
    let mut ci = 0u32;
    let mut id = 0u64;
    let mut wc1 = [Wc::default(); 1];
    let mut wc16 = [Wc::default(); BATCH];
    let start = Instant::now();
    for _ in 0..iters {
        // Post the WRs these CQEs complete and write the CQEs (not measured).
        for _ in 0..per_call {
            let pi = qp.sq.producer();
            post_desc(&mut qp.sq, &desc(id)).expect("post");
            f.write_cqe(ci, &req_cqe(qpn, pi as u16));
            ci += 1;
            id += 1;
        }
        qp.sq.ring();
        let n = if per_call == 1 {
            rdd_poll_1(black_box(&mut cq), black_box(&mut qp), black_box(&mut wc1)).expect("poll")
        } else {
            rdd_poll_16(black_box(&mut cq), black_box(&mut qp), black_box(&mut wc16)).expect("poll")
        };
        assert_eq!(n, per_call);
    }
    let func = if per_call == 1 {
        "rdd_poll_1"
    } else {
        "rdd_poll_16"
    };
    Report {
        bench,
        func,
        calls: iters,
        ops_per_call: per_call as u64,
        start,
    }
    .done();
}

fn bench_poll_empty(bench: &'static str, iters: u64) {
    let mut f = FakeMlx5::new(geometry());
    let sq = new_sq(&mut f, BfPolicy::Never);
    let caps = f.caps(4, 60);
    let rq = f.recv_queue(caps).expect("rq");
    let mut cq = f.completion_queue().expect("cq");
    let mut qp = Mlx5Qp { sq, rq };
    let mut wc16 = [Wc::default(); BATCH];
    let start = Instant::now();
    for _ in 0..iters {
        let n = rdd_poll_16(black_box(&mut cq), black_box(&mut qp), black_box(&mut wc16))
            .expect("poll");
        assert_eq!(n, 0);
    }
    // ops_per_call 1: the unit is one (empty) call.
    Report {
        bench,
        func: "rdd_poll_16",
        calls: iters,
        ops_per_call: 1,
        start,
    }
    .done();
}

fn main() {
    let mut iters = DEFAULT_ITERS;
    let mut benches: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => iters = args.next().and_then(|v| v.parse().ok()).expect("--iters N"),
            "--bench" => {}
            _ => benches.push(a),
        }
    }
    let all = [
        "post_1",
        "post_16",
        "post_bf",
        "poll_1",
        "poll_16",
        "poll_empty",
        "post_1_opaque",
        "post_16_opaque",
        "shared_post_1",
        "shared_post_16",
        "abi_post_1",
        "abi_post_16",
        "abi_poll_1",
        "abi_poll_16",
        "abi_post_ring_1",
        "abi_post_ring_16",
        "abi_op_post_1",
        "abi_op_post_16",
        "abi_burst_1",
        "abi_burst_16",
        "abi_poll_bound_1",
        "abi_poll_bound_16",
    ];
    if benches.is_empty() {
        benches = all.iter().map(|s| s.to_string()).collect();
    }
    for b in &benches {
        match b.as_str() {
            "post_1" => bench_post("post_1", iters, BfPolicy::Never, false),
            "post_16" => bench_post("post_16", iters, BfPolicy::Never, true),
            "post_bf" => bench_post("post_bf", iters, BfPolicy::SingleWqe, false),
            "poll_1" => bench_poll("poll_1", iters, 1),
            "poll_16" => bench_poll("poll_16", iters, BATCH),
            "poll_empty" => bench_poll_empty("poll_empty", iters),
            "post_1_opaque" => bench_post_opaque("post_1_opaque", iters, false),
            "post_16_opaque" => bench_post_opaque("post_16_opaque", iters, true),
            "shared_post_1" => bench_shared("shared_post_1", iters, false),
            "shared_post_16" => bench_shared("shared_post_16", iters, true),
            "abi_post_1" => bench_abi("abi_post_1", iters, Abi::PostThenRing, 1),
            "abi_post_16" => bench_abi("abi_post_16", iters, Abi::PostThenRing, BATCH),
            "abi_poll_1" => bench_abi("abi_poll_1", iters, Abi::Poll, 1),
            "abi_poll_16" => bench_abi("abi_poll_16", iters, Abi::Poll, BATCH),
            "abi_post_ring_1" => bench_abi("abi_post_ring_1", iters, Abi::PostRing, 1),
            "abi_post_ring_16" => bench_abi("abi_post_ring_16", iters, Abi::PostRing, BATCH),
            "abi_op_post_1" => bench_abi("abi_op_post_1", iters, Abi::Op, 1),
            "abi_op_post_16" => bench_abi("abi_op_post_16", iters, Abi::Op, BATCH),
            "abi_burst_1" => bench_abi("abi_burst_1", iters, Abi::Burst, 1),
            "abi_burst_16" => bench_abi("abi_burst_16", iters, Abi::Burst, BATCH),
            "abi_poll_bound_1" => bench_abi("abi_poll_bound_1", iters, Abi::PollBound, 1),
            "abi_poll_bound_16" => bench_abi("abi_poll_bound_16", iters, Abi::PollBound, BATCH),
            other => {
                eprintln!("unknown bench {other}; known: {}", all.join(" "));
                std::process::exit(2);
            }
        }
    }
}
