//! UD send and SRQ receive post cost, run by `scripts/bench.sh` under
//! callgrind (rows `uds:*`; results in `docs/benchmarks.md`), beside the
//! RC rows of `benches/post_poll.rs`.
//!
//! Measured functions (each `#[inline(never)]`, `#[no_mangle]`):
//! - `uds_ud_post_1` / `uds_ud_post_16`: typed Rust, UD SEND of 8 bytes
//!   with one SGE, signaled, through `SendQueue::post_ud` and one doorbell
//!   per call (16: each WR to its own destination QP, one doorbell);
//! - `uds_abi_ud_1` / `uds_abi_ud_16`: the same through the C ABI
//!   (`rdd_mlx5_sq_send_ud`; 16: 15 with `RDD_SEND_DEFER_DOORBELL`, the last
//!   one ringing);
//! - `uds_srq_post_1` / `uds_srq_post_16`: typed Rust, one-SGE receives
//!   into an SRQ (`Srq::post`, then `Srq::ring`: the doorbell record);
//! - `uds_abi_srq_1` / `uds_abi_srq_16`: the same through
//!   `rdd_mlx5_srq_recv` (16: 15 deferred, the last publishing);
//! - `uds_rq_post_1` / `uds_rq_post_16`: the RC comparison for receives,
//!   a QP's own receive queue (`RecvQueue::post`, then `ring`).
//!
//! The send rows compare with `post_1` / `post_16` (RC RDMA WRITE) and
//! `abi_op_post_1` / `abi_op_post_16`. Every field of every request is a
//! runtime value. The driver loops, outside the measured functions, keep
//! the queues going: the typed send queue retires what was posted, the C
//! UD handle is initialised again over the same memory after each call
//! (so its posts start at basic block 0; the encoder's work per WQE does
//! not depend on the position); both SRQs get a completion for every WQE
//! a call filled (the C one through `rdd_mlx5_cq_poll_srq`), so both
//! relink completed WQEs when their free list runs short, as a live SRQ
//! does.
//!
//! Usage: `ud_srq [BENCH...] [--iters N]`; BENCH one of `ud_post_1`,
//! `ud_post_16`, `abi_ud_1`, `abi_ud_16`, `srq_post_1`, `srq_post_16`,
//! `abi_srq_1`, `abi_srq_16`, `rq_post_1`, `rq_post_16` (default: all).
//! Each prints `bench=<bench> fn=<function> calls=<n> ops_per_call=<k>`.

use std::hint::black_box;
use std::ptr::NonNull;

use rdma_direct::ffi::mlx5::{
    rdd_mlx5_av, rdd_mlx5_cq_init, rdd_mlx5_cq_poll_srq, rdd_mlx5_cq_storage, rdd_mlx5_sq_init,
    rdd_mlx5_sq_init_ud, rdd_mlx5_sq_send_ud, rdd_mlx5_sq_storage, rdd_mlx5_srq_geometry,
    rdd_mlx5_srq_init, rdd_mlx5_srq_recv, rdd_mlx5_srq_storage, rdd_mlx5dv_cq, rdd_mlx5dv_qp,
    rdd_qp_caps, rdd_wc, RDD_MLX5_SQ_BF_NEVER, RDD_SEND_DEFER_DOORBELL,
};
use rdma_direct::ffi::rdd_status;
use rdma_direct::provider::mlx5::{
    AhAttr, BfPolicy, LinkLayer, Mlx5Av, RecvQueue, SendQueue, SqConfig, Srq, SrqGeometry, SrqSlot,
    UdDest,
};
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct::{QpCaps, RecvWr, Result, SendFlags, SendOp, SendWr, Sge};

/// Requests per call in the batched rows.
const BATCH: usize = 16;
const DEFAULT_ITERS: u64 = 10_000;
/// SRQ size: WQEs in the free list (one stays unused).
const SRQ_WQES: u32 = 256;

/// One UD send as the application knows it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UdDesc {
    wr_id: u64,
    laddr: u64,
    len: u32,
    lkey: u32,
    remote_qpn: u32,
    qkey: u32,
}

/// One receive as the application knows it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecvDesc {
    wr_id: u64,
    laddr: u64,
    len: u32,
    lkey: u32,
}

fn ud_desc(i: u64) -> UdDesc {
    UdDesc {
        wr_id: i,
        laddr: 0x7f5a_3c00_3000,
        len: 8,
        lkey: 0x00a1_b2c3,
        remote_qpn: 0x100 + (i as u32 & 0xff),
        qkey: 0x1111_1111,
    }
}

fn recv_desc(i: u64) -> RecvDesc {
    RecvDesc {
        wr_id: i,
        // Unique per receive, so the driver can find which SRQ WQE holds it.
        laddr: 0x7f00_0000_0000 + (i << 12),
        len: 4096,
        lkey: 0x00d0_0d01,
    }
}

#[inline(always)]
fn post_ud_desc(sq: &mut SendQueue, av: &Mlx5Av, d: &UdDesc) -> Result<()> {
    let sge = [Sge::new(d.laddr, d.len, d.lkey)];
    let wr = SendWr::new(d.wr_id, SendOp::Send, &sge, SendFlags::SIGNALED);
    let dest = UdDest::new(av, d.remote_qpn, d.qkey);
    // SAFETY: nothing executes the WQEs (fake memory).
    unsafe { sq.post_ud(&wr, &dest) }
}

/// One UD SEND and its doorbell.
#[no_mangle]
#[inline(never)]
pub fn uds_ud_post_1(sq: &mut SendQueue, av: &Mlx5Av, d: &UdDesc) -> Result<()> {
    post_ud_desc(sq, av, d)?;
    sq.ring();
    Ok(())
}

/// [`BATCH`] UD SENDs and one doorbell.
#[no_mangle]
#[inline(never)]
pub fn uds_ud_post_16(sq: &mut SendQueue, av: &Mlx5Av, ds: &[UdDesc; BATCH]) -> Result<()> {
    for d in ds {
        if let Err(e) = post_ud_desc(sq, av, d) {
            sq.ring();
            return Err(e);
        }
    }
    sq.ring();
    Ok(())
}

/// One UD SEND through the C ABI (ringing).
#[no_mangle]
#[inline(never)]
pub fn uds_abi_ud_1(sq: &mut rdd_mlx5_sq_storage, av: &rdd_mlx5_av, d: &UdDesc) -> rdd_status {
    // SAFETY: a live handle; the SGE is never dereferenced.
    unsafe {
        rdd_mlx5_sq_send_ud(
            sq,
            av,
            d.remote_qpn,
            d.qkey,
            d.wr_id,
            d.laddr,
            d.len,
            d.lkey,
            2, // RDD_SEND_SIGNALED
        )
    }
}

/// [`BATCH`] UD SENDs through the C ABI: 15 deferred, the last ringing.
#[no_mangle]
#[inline(never)]
pub fn uds_abi_ud_16(
    sq: &mut rdd_mlx5_sq_storage,
    av: &rdd_mlx5_av,
    ds: &[UdDesc; BATCH],
) -> rdd_status {
    for (i, d) in ds.iter().enumerate() {
        let defer = if i + 1 < BATCH {
            RDD_SEND_DEFER_DOORBELL
        } else {
            0
        };
        // SAFETY: as in `uds_abi_ud_1`.
        let st = unsafe {
            rdd_mlx5_sq_send_ud(
                sq,
                av,
                d.remote_qpn,
                d.qkey,
                d.wr_id,
                d.laddr,
                d.len,
                d.lkey,
                2 | defer,
            )
        };
        if st != rdd_status::Ok {
            return st;
        }
    }
    rdd_status::Ok
}

/// One SRQ receive, published.
#[no_mangle]
#[inline(never)]
pub fn uds_srq_post_1(srq: &mut Srq, d: &RecvDesc) -> Result<()> {
    let sges = [Sge::new(d.laddr, d.len, d.lkey)];
    // SAFETY: nothing executes the WQEs.
    unsafe {
        srq.post(&RecvWr {
            wr_id: d.wr_id,
            sges: &sges,
        })
    }?;
    srq.ring();
    Ok(())
}

/// [`BATCH`] SRQ receives, one doorbell-record update.
#[no_mangle]
#[inline(never)]
pub fn uds_srq_post_16(srq: &mut Srq, ds: &[RecvDesc; BATCH]) -> Result<()> {
    for d in ds {
        let sges = [Sge::new(d.laddr, d.len, d.lkey)];
        // SAFETY: as above.
        if let Err(e) = unsafe {
            srq.post(&RecvWr {
                wr_id: d.wr_id,
                sges: &sges,
            })
        } {
            srq.ring();
            return Err(e);
        }
    }
    srq.ring();
    Ok(())
}

/// One SRQ receive through the C ABI.
#[no_mangle]
#[inline(never)]
pub fn uds_abi_srq_1(srq: &mut rdd_mlx5_srq_storage, d: &RecvDesc) -> rdd_status {
    // SAFETY: a live handle; the buffer is never written.
    unsafe { rdd_mlx5_srq_recv(srq, d.wr_id, d.laddr, d.len, d.lkey, 0) }
}

/// [`BATCH`] SRQ receives through the C ABI: 15 deferred, the last
/// publishing.
#[no_mangle]
#[inline(never)]
pub fn uds_abi_srq_16(srq: &mut rdd_mlx5_srq_storage, ds: &[RecvDesc; BATCH]) -> rdd_status {
    for (i, d) in ds.iter().enumerate() {
        let defer = if i + 1 < BATCH {
            RDD_SEND_DEFER_DOORBELL
        } else {
            0
        };
        // SAFETY: as in `uds_abi_srq_1`.
        let st = unsafe { rdd_mlx5_srq_recv(srq, d.wr_id, d.laddr, d.len, d.lkey, defer) };
        if st != rdd_status::Ok {
            return st;
        }
    }
    rdd_status::Ok
}

/// One receive on a QP's own receive queue, published (the RC row).
#[no_mangle]
#[inline(never)]
pub fn uds_rq_post_1(rq: &mut RecvQueue, d: &RecvDesc) -> Result<()> {
    let sges = [Sge::new(d.laddr, d.len, d.lkey)];
    // SAFETY: nothing executes the WQEs.
    unsafe {
        rq.post(&RecvWr {
            wr_id: d.wr_id,
            sges: &sges,
        })
    }?;
    rq.ring();
    Ok(())
}

/// [`BATCH`] receives on a QP's own receive queue, one record update.
#[no_mangle]
#[inline(never)]
pub fn uds_rq_post_16(rq: &mut RecvQueue, ds: &[RecvDesc; BATCH]) -> Result<()> {
    for d in ds {
        let sges = [Sge::new(d.laddr, d.len, d.lkey)];
        // SAFETY: as above.
        if let Err(e) = unsafe {
            rq.post(&RecvWr {
                wr_id: d.wr_id,
                sges: &sges,
            })
        } {
            rq.ring();
            return Err(e);
        }
    }
    rq.ring();
    Ok(())
}

fn geometry() -> FakeGeometry {
    FakeGeometry {
        sq_wqe_cnt: 256,
        rq_wqe_cnt: 256,
        rq_stride: 16,
        cqe_cnt: 256,
        bf_size: 256,
        ..FakeGeometry::default()
    }
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_sge: 1,
        max_inline_data: 28,
        max_recv_sge: 1,
    }
}

fn av() -> Mlx5Av {
    Mlx5Av::new(&AhAttr {
        link: LinkLayer::InfiniBand,
        dlid: 0x17,
        sl: 3,
        src_path_bits: 0,
        mlx5_rate: 0,
        grh: None,
    })
    .expect("address vector")
}

fn report(bench: &str, func: &str, calls: u64, per: usize) {
    println!("bench={bench} fn={func} calls={calls} ops_per_call={per}");
}

fn bench_ud(bench: &str, iters: u64) {
    let batch = bench.ends_with("_16");
    let abi = bench.starts_with("abi_");
    let mut f = FakeMlx5::new(geometry());
    let av = av();
    let c_av = rdd_mlx5_av {
        // SAFETY: 48 bytes of plain integers.
        bytes: unsafe { std::mem::transmute::<Mlx5Av, [u8; 48]>(av) },
    };
    let qp = f.dv_qp();
    let n = f.sq_wrid.len();
    let cfg = SqConfig {
        bf_policy: BfPolicy::Never,
        ..SqConfig::default()
    };
    // SAFETY: the fake outlives the queue; nothing executes the WQEs.
    let mut sq = unsafe {
        SendQueue::from_raw_ud(
            &qp,
            f.geo.qpn,
            caps(),
            cfg,
            NonNull::new(f.sq_wrid.as_mut_ptr()).expect("table"),
            n,
        )
    }
    .expect("UD send queue");
    // The C handle over a second fake.
    let mut g = FakeMlx5::new(geometry());
    // SAFETY: a byte array: zeroes are valid.
    let mut storage: Box<rdd_mlx5_sq_storage> = Box::new(unsafe { std::mem::zeroed() });
    let dv: rdd_mlx5dv_qp = g.dv_qp().into();
    let ccaps = rdd_qp_caps {
        max_send_sge: 1,
        max_inline_data: 28,
        max_recv_sge: 1,
    };
    let gn = g.sq_wrid.len();
    // SAFETY: `g` outlives the handle (both live to the end of this function).
    let st = unsafe {
        rdd_mlx5_sq_init_ud(
            &mut *storage,
            &dv,
            g.geo.qpn,
            &ccaps,
            RDD_MLX5_SQ_BF_NEVER,
            g.sq_wrid.as_mut_ptr().cast(),
            gn,
        )
    };
    assert_eq!(st, rdd_status::Ok);
    let mut id = 0u64;
    let func = match (abi, batch) {
        (false, false) => "uds_ud_post_1",
        (false, true) => "uds_ud_post_16",
        (true, false) => "uds_abi_ud_1",
        (true, true) => "uds_abi_ud_16",
    };
    for _ in 0..iters {
        let ds: [UdDesc; BATCH] = core::array::from_fn(|i| ud_desc(id + i as u64));
        match (abi, batch) {
            (false, false) => uds_ud_post_1(black_box(&mut sq), &av, black_box(&ds[0])).unwrap(),
            (false, true) => uds_ud_post_16(black_box(&mut sq), &av, black_box(&ds)).unwrap(),
            (true, false) => assert_eq!(
                uds_abi_ud_1(black_box(&mut *storage), &c_av, black_box(&ds[0])),
                rdd_status::Ok
            ),
            (true, true) => assert_eq!(
                uds_abi_ud_16(black_box(&mut *storage), &c_av, black_box(&ds)),
                rdd_status::Ok
            ),
        }
        id += BATCH as u64;
        if abi {
            // Retire through a fresh handle: re-initialise over the same
            // memory (outside the measured function; the ring restarts).
            // SAFETY: as for the first init.
            let st = unsafe {
                rdd_mlx5_sq_init_ud(
                    &mut *storage,
                    &dv,
                    g.geo.qpn,
                    &ccaps,
                    RDD_MLX5_SQ_BF_NEVER,
                    g.sq_wrid.as_mut_ptr().cast(),
                    gn,
                )
            };
            assert_eq!(st, rdd_status::Ok);
        } else {
            // Every WQE here is two basic blocks (control + datagram
            // segment, one data segment): the last one starts two before
            // the producer.
            let last = sq.producer().wrapping_sub(2) as u16;
            sq.retire(last).expect("retire");
        }
    }
    report(bench, func, iters, if batch { BATCH } else { 1 });
}

fn bench_srq(bench: &str, iters: u64) {
    let batch = bench.ends_with("_16");
    let abi = bench.starts_with("abi_");
    let stride = 32u32;
    let mut buf = AlignedBuf::new((2 * SRQ_WQES * stride) as usize);
    let mut db = AlignedBuf::new(64);
    let mut slots = vec![SrqSlot::default(); SRQ_WQES as usize];
    let geo = SrqGeometry {
        buf: buf.ptr(),
        dbrec: db.ptr().cast(),
        stride,
        nwqes: SRQ_WQES,
        max: 2 * SRQ_WQES,
        srqn: 0x51,
    };
    // SAFETY: the memory outlives the queue.
    let mut srq = unsafe {
        Srq::from_raw(
            &geo,
            NonNull::new(slots.as_mut_ptr()).expect("slots"),
            slots.len(),
        )
    }
    .expect("srq");
    let mut cbuf = AlignedBuf::new((2 * SRQ_WQES * stride) as usize);
    let mut cdb = AlignedBuf::new(64);
    let mut cslots = vec![SrqSlot::default(); SRQ_WQES as usize];
    // SAFETY: a byte array: zeroes are valid.
    let mut storage: Box<rdd_mlx5_srq_storage> = Box::new(unsafe { std::mem::zeroed() });
    let cgeo = rdd_mlx5_srq_geometry {
        buf: cbuf.ptr(),
        dbrec: cdb.ptr().cast(),
        stride,
        nwqes: SRQ_WQES,
        max: 2 * SRQ_WQES,
        srqn: 0x52,
    };
    // SAFETY: the memory outlives the handle.
    let st = unsafe {
        rdd_mlx5_srq_init(
            &mut *storage,
            &cgeo,
            cslots.as_mut_ptr().cast(),
            cslots.len(),
        )
    };
    assert_eq!(st, rdd_status::Ok);
    // A QP's send queue and a CQ for the C side's completions.
    let mut cq_fake = FakeMlx5::new(geometry());
    // SAFETY: byte arrays: zeroes are valid.
    let mut sq_storage: Box<rdd_mlx5_sq_storage> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: as above.
    let mut cq_storage: Box<rdd_mlx5_cq_storage> = Box::new(unsafe { std::mem::zeroed() });
    let dvq: rdd_mlx5dv_qp = cq_fake.dv_qp().into();
    let dvc: rdd_mlx5dv_cq = cq_fake.dv_cq().into();
    let ccaps = rdd_qp_caps {
        max_send_sge: 1,
        max_inline_data: 28,
        max_recv_sge: 1,
    };
    let qn = cq_fake.sq_wrid.len();
    // SAFETY: `cq_fake` outlives both handles (same scope, declared first).
    unsafe {
        assert_eq!(
            rdd_mlx5_sq_init(
                &mut *sq_storage,
                &dvq,
                cq_fake.geo.qpn,
                &ccaps,
                0,
                cq_fake.sq_wrid.as_mut_ptr().cast(),
                qn
            ),
            rdd_status::Ok
        );
        assert_eq!(rdd_mlx5_cq_init(&mut *cq_storage, &dvc), rdd_status::Ok);
    }
    let csq: *mut rdd_mlx5_sq_storage = &mut *sq_storage;
    let ccq: *mut rdd_mlx5_cq_storage = &mut *cq_storage;
    let mut cqes = 0u32;
    let func = match (abi, batch) {
        (false, false) => "uds_srq_post_1",
        (false, true) => "uds_srq_post_16",
        (true, false) => "uds_abi_srq_1",
        (true, true) => "uds_abi_srq_16",
    };
    let n = if batch { BATCH } else { 1 };
    let mut id = 0u64;
    for _ in 0..iters {
        let ds: [RecvDesc; BATCH] = core::array::from_fn(|i| recv_desc(id + i as u64));
        match (abi, batch) {
            (false, false) => uds_srq_post_1(black_box(&mut srq), black_box(&ds[0])).unwrap(),
            (false, true) => uds_srq_post_16(black_box(&mut srq), black_box(&ds)).unwrap(),
            (true, false) => assert_eq!(
                uds_abi_srq_1(black_box(&mut *storage), black_box(&ds[0])),
                rdd_status::Ok
            ),
            (true, true) => assert_eq!(
                uds_abi_srq_16(black_box(&mut *storage), black_box(&ds)),
                rdd_status::Ok
            ),
        }
        id += n as u64;
        if abi {
            // The device's side, not measured: a completion for each WQE
            // this call filled (found by its buffer address), polled
            // through `rdd_mlx5_cq_poll_srq`, so the C rows relink
            // completed WQEs as the Rust rows do.
            for w in 0..SRQ_WQES {
                let off = (w * stride) as usize + 16 + 8;
                let b = &cbuf.bytes()[off..off + 8];
                let addr = u64::from_be_bytes(b.try_into().expect("8 bytes"));
                let first = recv_desc(id - n as u64).laddr;
                if addr >= first && addr < first + ((n as u64) << 12) {
                    let mut c = [0u8; 64];
                    c[32..36].copy_from_slice(&0x52u32.to_be_bytes());
                    c[56..60].copy_from_slice(&cq_fake.geo.qpn.to_be_bytes());
                    c[60..62].copy_from_slice(&(w as u16).to_be_bytes());
                    c[63] = 0x20; // RESP_SEND
                    cq_fake.write_cqe(cqes, &c);
                    cqes += 1;
                }
            }
            let mut wc = [rdd_wc::default(); BATCH];
            let mut got = 0usize;
            // SAFETY: live handles, local outputs.
            let st = unsafe {
                rdd_mlx5_cq_poll_srq(
                    ccq,
                    csq,
                    std::ptr::null_mut(),
                    &mut *storage,
                    0x52,
                    wc.as_mut_ptr(),
                    BATCH,
                    &mut got,
                )
            };
            assert_eq!((st, got), (rdd_status::Ok, n), "completions");
        } else {
            // Complete every posted WQE (the device's side, not measured).
            for w in 0..SRQ_WQES {
                if srq.slot_state(w).map(|s| s.state) == Some(SrqSlot::POSTED) {
                    srq.complete(w as u16).expect("complete");
                }
            }
        }
    }
    let _ = (&mut buf, &mut db, &mut cbuf, &mut cdb);
    report(bench, func, iters, n);
}

fn bench_rq(bench: &str, iters: u64) {
    let batch = bench.ends_with("_16");
    let mut f = FakeMlx5::new(geometry());
    let mut rq = f.recv_queue(caps()).expect("receive queue");
    let n = if batch { BATCH } else { 1 };
    let mut id = 0u64;
    for _ in 0..iters {
        let ds: [RecvDesc; BATCH] = core::array::from_fn(|i| recv_desc(id + i as u64));
        if batch {
            uds_rq_post_16(black_box(&mut rq), black_box(&ds)).unwrap();
        } else {
            uds_rq_post_1(black_box(&mut rq), black_box(&ds[0])).unwrap();
        }
        for _ in 0..n {
            let c = (id & 0xffff) as u16;
            rq.complete(c).expect("complete");
            id += 1;
        }
    }
    let func = if batch {
        "uds_rq_post_16"
    } else {
        "uds_rq_post_1"
    };
    report(bench, func, iters, n);
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
        "ud_post_1",
        "ud_post_16",
        "abi_ud_1",
        "abi_ud_16",
        "srq_post_1",
        "srq_post_16",
        "abi_srq_1",
        "abi_srq_16",
        "rq_post_1",
        "rq_post_16",
    ];
    if benches.is_empty() {
        benches = all.iter().map(|s| s.to_string()).collect();
    }
    for b in &benches {
        match b.as_str() {
            "ud_post_1" | "ud_post_16" | "abi_ud_1" | "abi_ud_16" => bench_ud(b, iters),
            "srq_post_1" | "srq_post_16" | "abi_srq_1" | "abi_srq_16" => bench_srq(b, iters),
            "rq_post_1" | "rq_post_16" => bench_rq(b, iters),
            other => {
                eprintln!("unknown bench {other}; known: {}", all.join(" "));
                std::process::exit(2);
            }
        }
    }
}
