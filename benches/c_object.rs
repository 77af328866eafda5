//! The C object level's post and poll cost: the per-opcode posts
//! (`rdd_qp_write`, with and without `RDD_SEND_DEFER_DOORBELL` +
//! `rdd_qp_ring`) and the one-handle poll (`rdd_cq_poll_n`) against the
//! generic calls (`rdd_qp_post_send` of `rdd_wr`s, `rdd_cq_poll` with the
//! list of the CQ's QPs), all on the software device in step mode.
//!
//! Every measured call sits in an `#[inline(never)]`, `#[no_mangle]`
//! function below, which does what a C caller does for it: reads its
//! operands from a descriptor in memory (the generic rows also fill the
//! `rdd_wr` there, as the caller must) and calls the exported function.
//! Count its instructions with callgrind, as `scripts/bench.sh` does for
//! its rows:
//!
//! ```sh
//! cargo bench --no-run --bench c_object        # prints the binary
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect=<fn> \
//!     <binary> <bench> --iters 2000
//! ```
//!
//! and divide callgrind's total by `calls × ops_per_call` from the line
//! the program prints (`bench=<bench> fn=<fn> calls=<n> ops_per_call=<k>`).
//! `scripts/bench.sh` measures the rows `write_1`, `write_16`, `poll_n_1`
//! and `poll_n_16` this way in its main table, which
//! `scripts/bench-gate.sh` gates; the others are measured by hand.
//! Executing the WRs (`rdd_device_step`), polling what the post rows
//! produced and posting what the poll rows consume happen outside the
//! measured functions.
//!
//! Rows: `write_1` (`rdd_qp_write`, one WR and its doorbell),
//! `write_16` (15 deferred `rdd_qp_write` + one ringing),
//! `write_16_defer` (16 deferred `rdd_qp_write` + `rdd_qp_ring`),
//! `post_send_1`, `post_send_16` (`rdd_qp_post_send` of 1 / 16 `rdd_wr`),
//! `poll_n_1`, `poll_n_16`, `poll_n_empty` (`rdd_cq_poll_n`),
//! `cq_poll_1`, `cq_poll_16`, `cq_poll_empty` (`rdd_cq_poll`, list of one
//! QP), and for comparison the typed Rust API on the same device:
//! `api_post_1` (`Qp::post_send_one`), `api_post_16` (`Qp::post_send`
//! of 16), `api_poll_1`, `api_poll_16` (`Cq::poll`). The WR is the one of `benches/post_poll.rs`: RC RDMA WRITE, 8
//! bytes, one SGE, signaled.

use std::hint::black_box;
use std::ptr::{null, null_mut};

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, Wc};
use rdma_direct::ffi::mlx5::rdd_wc;
use rdma_direct::ffi::object::*;
use rdma_direct::ffi::status::rdd_status;
use rdma_direct::ffi::wr::{
    rdd_sge, rdd_wr, RDD_SEND_DEFER_DOORBELL, RDD_SEND_SIGNALED, RDD_WR_RDMA_WRITE,
};
use rdma_direct::soft::SoftDevice;
use rdma_direct::{Remote, SendFlags, SendOp, SendWr, Sge};

/// WRs per doorbell in the batched rows, CQEs per call in the batched polls.
const BATCH: usize = 16;
const DEFAULT_ITERS: u64 = 2000;

#[path = "support/write_desc.rs"]
mod write_desc;
use write_desc::WriteDesc as Desc;

// ---------------------------------------------------------------------
// Measured functions
// ---------------------------------------------------------------------

/// One RDMA WRITE and its doorbell through the per-opcode call.
#[no_mangle]
#[inline(never)]
fn obj_write_1(qp: *mut rdd_qp, d: &Desc) -> rdd_status {
    // SAFETY: the descriptor names the bench's registered buffers.
    unsafe {
        rdd_qp_write(
            qp, d.wr_id, d.laddr, d.len, d.lkey, d.raddr, d.rkey, d.flags,
        )
    }
}

/// [`BATCH`] deferred RDMA WRITEs and one `rdd_qp_ring`.
#[no_mangle]
#[inline(never)]
fn obj_write_16_defer(qp: *mut rdd_qp, ds: &[Desc; BATCH]) -> rdd_status {
    for d in ds {
        let f = d.flags | RDD_SEND_DEFER_DOORBELL;
        // SAFETY: as in `obj_write_1`.
        let s = unsafe { rdd_qp_write(qp, d.wr_id, d.laddr, d.len, d.lkey, d.raddr, d.rkey, f) };
        if s != rdd_status::Ok {
            return s;
        }
    }
    rdd_qp_ring(qp)
}

/// [`BATCH`] RDMA WRITEs, the first 15 with `RDD_SEND_DEFER_DOORBELL`, the
/// last one ringing for all of them (no `rdd_qp_ring` call).
#[no_mangle]
#[inline(never)]
fn obj_write_16(qp: *mut rdd_qp, ds: &[Desc; BATCH]) -> rdd_status {
    for (i, d) in ds.iter().enumerate() {
        let defer = if i + 1 < BATCH {
            RDD_SEND_DEFER_DOORBELL
        } else {
            0
        };
        let f = d.flags | defer;
        // SAFETY: as in `obj_write_1`.
        let s = unsafe { rdd_qp_write(qp, d.wr_id, d.laddr, d.len, d.lkey, d.raddr, d.rkey, f) };
        if s != rdd_status::Ok {
            return s;
        }
    }
    rdd_status::Ok
}

/// The C caller's `rdd_wr` for a descriptor.
#[inline(always)]
fn c_wr(d: &Desc, sge: *const rdd_sge) -> rdd_wr {
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

/// One RDMA WRITE through the generic post (the caller fills one `rdd_wr`
/// and its SGE).
#[no_mangle]
#[inline(never)]
fn obj_post_send_1(qp: *mut rdd_qp, d: &Desc) -> rdd_status {
    let sge = rdd_sge {
        addr: d.laddr,
        length: d.len,
        lkey: d.lkey,
    };
    let wr = c_wr(d, &sge);
    let mut bad = 0usize;
    // SAFETY: a live local WR and SGE naming the bench's buffers.
    unsafe { rdd_qp_post_send(qp, &wr, 1, &mut bad) }
}

/// [`BATCH`] RDMA WRITEs through one generic post.
#[no_mangle]
#[inline(never)]
fn obj_post_send_16(qp: *mut rdd_qp, ds: &[Desc; BATCH]) -> rdd_status {
    let sges: [rdd_sge; BATCH] = core::array::from_fn(|i| rdd_sge {
        addr: ds[i].laddr,
        length: ds[i].len,
        lkey: ds[i].lkey,
    });
    let wrs: [rdd_wr; BATCH] = core::array::from_fn(|i| c_wr(&ds[i], &sges[i]));
    let mut bad = 0usize;
    // SAFETY: live local WRs and SGEs naming the bench's buffers.
    unsafe { rdd_qp_post_send(qp, wrs.as_ptr(), BATCH, &mut bad) }
}

/// The one-handle poll of up to one completion.
#[no_mangle]
#[inline(never)]
fn obj_poll_n_1(cq: *mut rdd_cq, wc: &mut [rdd_wc; 1]) -> i32 {
    // SAFETY: `wc` is a live array of one entry.
    unsafe { rdd_cq_poll_n(cq, wc.as_mut_ptr(), 1) }
}

/// The one-handle poll of up to [`BATCH`] completions (also on an empty
/// CQ).
#[no_mangle]
#[inline(never)]
fn obj_poll_n_16(cq: *mut rdd_cq, wc: &mut [rdd_wc; BATCH]) -> i32 {
    // SAFETY: `wc` is a live array of BATCH entries.
    unsafe { rdd_cq_poll_n(cq, wc.as_mut_ptr(), BATCH as u32) }
}

/// The listed poll of up to one completion (the caller's list: one QP).
#[no_mangle]
#[inline(never)]
fn obj_cq_poll_1(cq: *mut rdd_cq, qps: &[*mut rdd_qp; 1], wc: &mut [rdd_wc; 1]) -> usize {
    let mut n = 0usize;
    // SAFETY: live arrays and out-parameter.
    let s = unsafe { rdd_cq_poll(cq, qps.as_ptr(), 1, wc.as_mut_ptr(), 1, &mut n) };
    if s == rdd_status::Ok {
        n
    } else {
        usize::MAX
    }
}

/// The listed poll of up to [`BATCH`] completions (also on an empty CQ).
#[no_mangle]
#[inline(never)]
fn obj_cq_poll_16(cq: *mut rdd_cq, qps: &[*mut rdd_qp; 1], wc: &mut [rdd_wc; BATCH]) -> usize {
    let mut n = 0usize;
    // SAFETY: live arrays and out-parameter.
    let s = unsafe { rdd_cq_poll(cq, qps.as_ptr(), 1, wc.as_mut_ptr(), BATCH, &mut n) };
    if s == rdd_status::Ok {
        n
    } else {
        usize::MAX
    }
}

/// The typed Rust API for comparison: one WRITE and its doorbell
/// (`Qp::post_send_one`), the WR built where it is posted.
#[no_mangle]
#[inline(never)]
pub fn api_post_1(qp: &mut Qp<SoftDevice>, d: &Desc) -> bool {
    let sge = [Sge::new(d.laddr, d.len, d.lkey)];
    let op = SendOp::Write {
        remote: Remote::new(d.raddr, d.rkey),
    };
    qp.post_send_one(&SendWr::new(d.wr_id, op, &sge, SendFlags(d.flags)))
        .is_ok()
}

/// The typed Rust API: [`BATCH`] WRITEs and one doorbell (`Qp::post_send`).
#[no_mangle]
#[inline(never)]
pub fn api_post_16(qp: &mut Qp<SoftDevice>, ds: &[Desc; BATCH]) -> bool {
    let sges: [[Sge; 1]; BATCH] =
        core::array::from_fn(|i| [Sge::new(ds[i].laddr, ds[i].len, ds[i].lkey)]);
    let wrs: [SendWr<'_>; BATCH] = core::array::from_fn(|i| {
        let op = SendOp::Write {
            remote: Remote::new(ds[i].raddr, ds[i].rkey),
        };
        SendWr::new(ds[i].wr_id, op, &sges[i], SendFlags(ds[i].flags))
    });
    qp.post_send(&wrs).is_ok()
}

/// The typed Rust API: polls up to one completion (`Cq::poll`).
#[no_mangle]
#[inline(never)]
pub fn api_poll_1(cq: &mut Cq<SoftDevice>, qp: &mut Qp<SoftDevice>, wc: &mut [Wc; 1]) -> usize {
    cq.poll(qp, wc).unwrap_or(usize::MAX)
}

/// The typed Rust API: polls up to [`BATCH`] completions.
#[no_mangle]
#[inline(never)]
pub fn api_poll_16(
    cq: &mut Cq<SoftDevice>,
    qp: &mut Qp<SoftDevice>,
    wc: &mut [Wc; BATCH],
) -> usize {
    cq.poll(qp, wc).unwrap_or(usize::MAX)
}

// ---------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------

fn ok(s: rdd_status, what: &str) {
    if s != rdd_status::Ok {
        eprintln!("{what} failed: {s:?}");
        std::process::exit(1);
    }
}

/// A software device in step mode with two connected QPs (remote write
/// granted), QP 0 on CQ 0 posting into QP 1's buffer.
struct Env {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: [*mut rdd_cq; 2],
    qp: [*mut rdd_qp; 2],
    mr: [*mut rdd_mr; 2],
    desc: Desc,
}

impl Env {
    fn new() -> Env {
        let mut e = Env {
            dev: null_mut(),
            pd: null_mut(),
            cq: [null_mut(); 2],
            qp: [null_mut(); 2],
            mr: [null_mut(); 2],
            desc: Desc::default(),
        };
        let mut addr = [null_mut(); 2];
        let (mut lkey, mut rkey) = (0u32, 0u32);
        // SAFETY: every out-parameter is a live local.
        unsafe {
            ok(rdd_device_open_soft(null(), &mut e.dev), "open");
            ok(rdd_pd_alloc(e.dev, &mut e.pd), "pd");
            let access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
            for (((cq, qp), mr), a) in e.cq.iter_mut().zip(&mut e.qp).zip(&mut e.mr).zip(&mut addr)
            {
                ok(rdd_cq_create(e.dev, 1024, cq), "cq");
                ok(rdd_qp_create(e.pd, *cq, *cq, null(), qp), "qp");
                ok(rdd_mr_reg(e.pd, 4096, access, mr), "mr");
                ok(rdd_mr_addr(*mr, a), "addr");
            }
            ok(rdd_mr_lkey(e.mr[0], &mut lkey), "lkey");
            ok(rdd_mr_rkey(e.mr[1], &mut rkey), "rkey");
            let mut info = [rdd_qp_info::default(); 2];
            ok(rdd_qp_query_info(e.qp[0], &mut info[0]), "info");
            ok(rdd_qp_query_info(e.qp[1], &mut info[1]), "info");
            let attr = rdd_connect_attr {
                access: RDD_ACCESS_REMOTE_WRITE,
                rnr_retry: 7,
                retry_cnt: 7,
                traffic_class: 0,
                sl: 0,
            };
            ok(rdd_qp_connect(e.qp[0], &info[1], &attr), "connect");
            ok(rdd_qp_connect(e.qp[1], &info[0], &attr), "connect");
        }
        e.desc = Desc {
            wr_id: 1,
            laddr: addr[0] as u64,
            raddr: addr[1] as u64,
            len: 8,
            lkey,
            rkey,
            flags: RDD_SEND_SIGNALED,
        };
        e
    }

    /// Executes everything posted and consumes `want` completions of CQ 0
    /// (outside the measured functions).
    fn run_and_reap(&self, want: usize) {
        let mut wc = [rdd_wc::default(); BATCH];
        let mut got = 0usize;
        for _ in 0..100 {
            let mut work = 0;
            // SAFETY: out-parameter is a local.
            ok(unsafe { rdd_device_step(self.dev, &mut work) }, "step");
            // SAFETY: a live local array.
            let n = unsafe { rdd_cq_poll_n(self.cq[0], wc.as_mut_ptr(), BATCH as u32) };
            if n < 0 {
                eprintln!("poll failed: {n}");
                std::process::exit(1);
            }
            got += n as usize;
            if got >= want {
                return;
            }
        }
        eprintln!("only {got} of {want} completions");
        std::process::exit(1);
    }

    /// Posts `k` signaled WRITEs and executes them, so that `k` CQEs wait
    /// on CQ 0 (outside the measured functions).
    fn fill(&self, k: usize) {
        for i in 0..k {
            let d = Desc {
                wr_id: i as u64,
                ..self.desc
            };
            // SAFETY: the descriptor names the bench's buffers.
            let s = unsafe {
                rdd_qp_write(
                    self.qp[0], d.wr_id, d.laddr, d.len, d.lkey, d.raddr, d.rkey, d.flags,
                )
            };
            ok(s, "fill");
        }
        for _ in 0..2 {
            let mut work = 0;
            // SAFETY: out-parameter is a local.
            ok(unsafe { rdd_device_step(self.dev, &mut work) }, "step");
        }
    }

    fn close(self) {
        for i in 0..2 {
            ok(rdd_qp_destroy(self.qp[i]), "destroy qp");
            ok(rdd_cq_destroy(self.cq[i]), "destroy cq");
            ok(rdd_mr_free(self.mr[i]), "free mr");
        }
        ok(rdd_pd_free(self.pd), "free pd");
        ok(rdd_device_close(self.dev), "close");
    }
}

fn report(bench: &str, f: &str, calls: u64, per: usize) {
    println!("bench={bench} fn={f} calls={calls} ops_per_call={per}");
}

fn bench_post(bench: &str, iters: u64) {
    let e = Env::new();
    let d = e.desc;
    let ds = [d; BATCH];
    let qp = e.qp[0];
    let (f, per) = match bench {
        "write_1" => ("obj_write_1", 1),
        "write_16" => ("obj_write_16", BATCH),
        "write_16_defer" => ("obj_write_16_defer", BATCH),
        "post_send_1" => ("obj_post_send_1", 1),
        _ => ("obj_post_send_16", BATCH),
    };
    for _ in 0..iters {
        let s = match bench {
            "write_1" => obj_write_1(black_box(qp), black_box(&d)),
            "write_16" => obj_write_16(black_box(qp), black_box(&ds)),
            "write_16_defer" => obj_write_16_defer(black_box(qp), black_box(&ds)),
            "post_send_1" => obj_post_send_1(black_box(qp), black_box(&d)),
            _ => obj_post_send_16(black_box(qp), black_box(&ds)),
        };
        ok(s, f);
        e.run_and_reap(per);
    }
    report(bench, f, iters, per);
    e.close();
}

fn bench_poll(bench: &str, iters: u64) {
    let e = Env::new();
    let (cq, qps) = (e.cq[0], [e.qp[0]]);
    let k = match bench {
        "poll_n_1" | "cq_poll_1" => 1,
        "poll_n_16" | "cq_poll_16" => BATCH,
        _ => 0,
    };
    let f = match bench {
        "poll_n_1" => "obj_poll_n_1",
        "poll_n_16" | "poll_n_empty" => "obj_poll_n_16",
        "cq_poll_1" => "obj_cq_poll_1",
        _ => "obj_cq_poll_16",
    };
    let mut one = [rdd_wc::default(); 1];
    let mut many = [rdd_wc::default(); BATCH];
    for _ in 0..iters {
        e.fill(k);
        let n = match bench {
            "poll_n_1" => obj_poll_n_1(black_box(cq), black_box(&mut one)) as usize,
            "poll_n_16" | "poll_n_empty" => {
                obj_poll_n_16(black_box(cq), black_box(&mut many)) as usize
            }
            "cq_poll_1" => obj_cq_poll_1(black_box(cq), black_box(&qps), black_box(&mut one)),
            _ => obj_cq_poll_16(black_box(cq), black_box(&qps), black_box(&mut many)),
        };
        if n != k {
            eprintln!("{bench}: polled {n}, expected {k}");
            std::process::exit(1);
        }
    }
    report(bench, f, iters, k.max(1));
    e.close();
}

/// The typed API's rows: the same pair of QPs through `rdma_direct::api`.
fn bench_api(bench: &str, iters: u64) {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().expect("pd");
    let mut cq0 = dev.create_cq(1024).expect("cq");
    let cq1 = dev.create_cq(1024).expect("cq");
    let init = QpInit::default();
    let mut a = pd.create_qp(&cq0, &cq0, &init).expect("qp");
    let mut b = pd.create_qp(&cq1, &cq1, &init).expect("qp");
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let ma: Mr<SoftDevice> = pd.register(4096, access).expect("mr");
    let mb: Mr<SoftDevice> = pd.register(4096, access).expect("mr");
    let attr = ConnectAttr {
        access: Access::REMOTE_WRITE,
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).expect("connect");
    b.connect(&ia, &attr).expect("connect");
    let d = Desc {
        wr_id: 1,
        laddr: ma.addr(),
        raddr: mb.addr(),
        len: 8,
        lkey: ma.lkey(),
        rkey: mb.rkey(),
        flags: RDD_SEND_SIGNALED,
    };
    let ds = [d; BATCH];
    let (f, per, poll) = match bench {
        "api_post_1" => ("api_post_1", 1, false),
        "api_post_16" => ("api_post_16", BATCH, false),
        "api_poll_1" => ("api_poll_1", 1, true),
        _ => ("api_poll_16", BATCH, true),
    };
    let mut one = [Wc::default(); 1];
    let mut many = [Wc::default(); BATCH];
    for _ in 0..iters {
        if !poll {
            let posted = if per == 1 {
                api_post_1(black_box(&mut a), black_box(&d))
            } else {
                api_post_16(black_box(&mut a), black_box(&ds))
            };
            assert!(posted, "{bench}: post refused");
        } else {
            // `per` signaled WRITEs for the poll to consume.
            let sges = [[Sge::new(d.laddr, 8, d.lkey)]; BATCH];
            let op = SendOp::Write {
                remote: Remote::new(d.raddr, d.rkey),
            };
            let wrs: [SendWr<'_>; BATCH] =
                core::array::from_fn(|i| SendWr::new(i as u64, op, &sges[i], SendFlags::SIGNALED));
            assert!(a.post_send(&wrs[..per]).is_ok(), "{bench}: fill refused");
        }
        for _ in 0..2 {
            dev.backend().step();
        }
        let n = if per == 1 && poll {
            api_poll_1(black_box(&mut cq0), black_box(&mut a), black_box(&mut one))
        } else if poll {
            api_poll_16(black_box(&mut cq0), black_box(&mut a), black_box(&mut many))
        } else {
            let mut got = 0;
            while got < per {
                got += cq0.poll(&mut a, &mut many).expect("poll");
            }
            got
        };
        assert_eq!(n, per, "{bench}: polled {n}");
    }
    report(bench, f, iters, per);
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
        "write_1",
        "write_16",
        "write_16_defer",
        "post_send_1",
        "post_send_16",
        "poll_n_1",
        "poll_n_16",
        "poll_n_empty",
        "cq_poll_1",
        "cq_poll_16",
        "cq_poll_empty",
        "api_post_1",
        "api_post_16",
        "api_poll_1",
        "api_poll_16",
    ];
    if benches.is_empty() {
        benches = all.iter().map(|s| s.to_string()).collect();
    }
    for b in &benches {
        match b.as_str() {
            "write_1" | "write_16" | "write_16_defer" | "post_send_1" | "post_send_16" => {
                bench_post(b, iters)
            }
            "poll_n_1" | "poll_n_16" | "poll_n_empty" | "cq_poll_1" | "cq_poll_16"
            | "cq_poll_empty" => bench_poll(b, iters),
            "api_post_1" | "api_post_16" | "api_poll_1" | "api_poll_16" => bench_api(b, iters),
            other => {
                eprintln!("unknown bench {other}; known: {}", all.join(" "));
                std::process::exit(2);
            }
        }
    }
}
