//! Tests of the submission service through its C calls, on the software
//! device (step mode, and thread mode with real threads).

use core::ptr::{self, null_mut};

use std::vec::Vec;

use super::calls::ServiceObj;
use super::*;
use crate::ffi::mlx5::{RDD_WC_REM_ACCESS_ERR, RDD_WC_SUCCESS, RDD_WC_WR_FLUSH_ERR};
use crate::ffi::object::*;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{RDD_SEND_INLINE, RDD_SEND_SOLICITED, RDD_WR_SEND};

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

const LEN: usize = 1 << 16;

/// A service QP `qp[0]` connected to a target QP `qp[1]` that lets it
/// write, a source region on the service side and a target region.
struct Env {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: [*mut rdd_cq; 2],
    qp: [*mut rdd_qp; 2],
    src: *mut rdd_mr,
    dst: *mut rdd_mr,
    src_addr: u64,
    dst_addr: u64,
    lkey: u32,
    rkey: u32,
}

fn env() -> Env {
    let mut e = Env {
        dev: null_mut(),
        pd: null_mut(),
        cq: [null_mut(); 2],
        qp: [null_mut(); 2],
        src: null_mut(),
        dst: null_mut(),
        src_addr: 0,
        dst_addr: 0,
        lkey: 0,
        rkey: 0,
    };
    // SAFETY: every out-parameter is a live local.
    unsafe {
        ok(rdd_device_open_soft(ptr::null(), &mut e.dev));
        ok(rdd_pd_alloc(e.dev, &mut e.pd));
        let init = rdd_qp_init {
            max_send_wr: 256,
            ..rdd_qp_init::default()
        };
        for i in 0..2 {
            ok(rdd_cq_create(e.dev, 1024, &mut e.cq[i]));
            ok(rdd_qp_create(e.pd, e.cq[i], e.cq[i], &init, &mut e.qp[i]));
        }
        ok(rdd_mr_reg(e.pd, LEN, RDD_ACCESS_LOCAL_WRITE, &mut e.src));
        let acc = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
        ok(rdd_mr_reg(e.pd, LEN, acc, &mut e.dst));
        let mut a = null_mut();
        ok(rdd_mr_addr(e.src, &mut a));
        e.src_addr = a as u64;
        ok(rdd_mr_addr(e.dst, &mut a));
        e.dst_addr = a as u64;
        ok(rdd_mr_lkey(e.src, &mut e.lkey));
        ok(rdd_mr_rkey(e.dst, &mut e.rkey));
        let mut info = [rdd_qp_info::default(); 2];
        ok(rdd_qp_query_info(e.qp[0], &mut info[0]));
        ok(rdd_qp_query_info(e.qp[1], &mut info[1]));
        let attr = rdd_connect_attr {
            access: RDD_ACCESS_REMOTE_WRITE,
            rnr_retry: 7,
            retry_cnt: 7,
            ..rdd_connect_attr::default()
        };
        ok(rdd_qp_connect(e.qp[0], &info[1], ptr::null()));
        ok(rdd_qp_connect(e.qp[1], &info[0], &attr));
        for i in 0..LEN {
            (e.src_addr as *mut u8).add(i).write((i * 7 + 1) as u8);
        }
    }
    e
}

fn teardown(e: Env) {
    for i in 0..2 {
        ok(rdd_qp_destroy(e.qp[i]));
        ok(rdd_cq_destroy(e.cq[i]));
    }
    ok(rdd_mr_free(e.src));
    ok(rdd_mr_free(e.dst));
    ok(rdd_pd_free(e.pd));
    ok(rdd_device_close(e.dev));
}

fn create(e: &Env, cfg: Option<rdd_submit_config>) -> *mut rdd_submit_service {
    let mut svc = null_mut();
    let c = cfg.as_ref().map_or(ptr::null(), |c| c as *const _);
    // SAFETY: `c` is NULL or a live local; `svc` is a local.
    ok(unsafe { rdd_submit_create(e.qp[0], e.cq[0], c, &mut svc) });
    svc
}

fn register(svc: *mut rdd_submit_service) -> *mut rdd_submitter {
    let mut sub = null_mut();
    // SAFETY: `sub` is a local.
    ok(unsafe { rdd_submit_register(svc, &mut sub) });
    sub
}

/// A WRITE of `len` bytes at offset `off` of the source to the same
/// offset of the target.
fn write_desc(e: &Env, wr_id: u64, off: u64, len: u32) -> rdd_submit_desc {
    rdd_submit_desc {
        wr_id,
        local_addr: e.src_addr + off,
        remote_addr: e.dst_addr + off,
        length: len,
        lkey: e.lkey,
        rkey: e.rkey,
        ..rdd_submit_desc::default()
    }
}

fn post(sub: *mut rdd_submitter, d: &[rdd_submit_desc]) -> (rdd_status, usize) {
    let mut bad = usize::MAX;
    // SAFETY: `d` is a live slice; `bad` a local.
    let s = unsafe { rdd_submit_post(sub, d.as_ptr(), d.len(), &mut bad) };
    (s, bad)
}

fn drain(svc: *mut rdd_submit_service) -> usize {
    let mut n = 0;
    // SAFETY: `n` is a local.
    ok(unsafe { rdd_submit_drain(svc, &mut n) });
    n
}

fn complete(svc: *mut rdd_submit_service) -> usize {
    let mut n = 0;
    // SAFETY: `n` is a local.
    ok(unsafe { rdd_submit_complete(svc, &mut n) });
    n
}

fn reap(sub: *mut rdd_submitter) -> Vec<rdd_submit_completion> {
    let mut c = [rdd_submit_completion::default(); 64];
    let mut n = 0;
    // SAFETY: `c` and `n` are locals.
    ok(unsafe { rdd_submit_reap(sub, c.as_mut_ptr(), c.len(), &mut n) });
    c[..n].to_vec()
}

fn step(e: &Env) {
    let mut w = 0;
    for _ in 0..4 {
        // SAFETY: `w` is a local.
        ok(unsafe { rdd_device_step(e.dev, &mut w) });
    }
}

fn stats(svc: *mut rdd_submit_service) -> rdd_submit_counters {
    let mut c = rdd_submit_counters::default();
    // SAFETY: `c` is a local.
    ok(unsafe { rdd_submit_stats(svc, &mut c) });
    c
}

fn target(e: &Env, off: usize, len: usize) -> &'static [u8] {
    // SAFETY: inside the 64 KiB target region, which outlives the checks.
    unsafe { core::slice::from_raw_parts((e.dst_addr as *const u8).add(off), len) }
}

fn source(e: &Env, off: usize, len: usize) -> &'static [u8] {
    // SAFETY: as `target`.
    unsafe { core::slice::from_raw_parts((e.src_addr as *const u8).add(off), len) }
}

#[test]
fn two_submitters_one_batch_one_doorbell() {
    let e = env();
    let svc = create(&e, None);
    let (a, b) = (register(svc), register(svc));
    let (mut id, mut fl) = (9u32, 9usize);
    // SAFETY: out-parameters are locals.
    ok(unsafe { rdd_submit_query(b, &mut id, &mut fl) });
    assert_eq!((id, fl), (1, 0));
    let da: Vec<_> = (0..5)
        .map(|i| write_desc(&e, 100 + i, i * 64, 40))
        .collect();
    let db: Vec<_> = (5..8)
        .map(|i| write_desc(&e, 200 + i, i * 64, 64))
        .collect();
    assert_eq!(post(a, &da), (rdd_status::Ok, usize::MAX));
    assert_eq!(post(b, &db), (rdd_status::Ok, usize::MAX));
    assert_eq!(stats(svc).queued, 8);
    assert_eq!(drain(svc), 8);
    assert_eq!(drain(svc), 0);
    step(&e);
    assert_eq!(complete(svc), 8);
    let ra = reap(a);
    let rb = reap(b);
    let ids: Vec<u64> = ra.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [100, 101, 102, 103, 104]);
    assert_eq!(
        rb.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        [205, 206, 207]
    );
    assert!(ra.iter().chain(&rb).all(|c| c.status == RDD_WC_SUCCESS));
    assert_eq!(target(&e, 0, 40), source(&e, 0, 40));
    assert_eq!(target(&e, 40, 24), &[0u8; 24][..], "no byte past a WRITE");
    assert_eq!(target(&e, 7 * 64, 64), source(&e, 7 * 64, 64));
    let c = stats(svc);
    assert_eq!(
        (c.submitted, c.drained, c.posted, c.doorbells),
        (8, 8, 8, 1),
        "one drain, one doorbell"
    );
    assert_eq!((c.completed, c.failed, c.reaped, c.queued), (8, 0, 8, 0));
    let mut bells = 0;
    // SAFETY: `bells` is a local.
    ok(unsafe { rdd_qp_doorbells(e.qp[0], &mut bells) });
    assert_eq!(bells, 1);
    ok(rdd_submit_unregister(a));
    ok(rdd_submit_unregister(b));
    ok(rdd_submit_destroy(svc));
    teardown(e);
}

#[test]
fn back_pressure_is_a_status_and_counted() {
    let e = env();
    let cfg = rdd_submit_config {
        max_outstanding: 128,
        max_batch: 64,
        ..rdd_submit_config::default()
    };
    let svc = create(&e, Some(cfg));
    let subs: Vec<_> = (0..5).map(|_| register(svc)).collect();
    let d: Vec<_> = (0..RDD_SUBMIT_COMPLETION_RING_SIZE as u64)
        .map(|i| write_desc(&e, i, 0, 8))
        .collect();
    // Credits: one submitter may have RDD_SUBMIT_COMPLETION_RING_SIZE in
    // flight.
    assert_eq!(post(subs[0], &d), (rdd_status::Ok, usize::MAX));
    assert_eq!(post(subs[0], &d[..1]), (rdd_status::SqFull, 0));
    // The ring: four submitters fill its RDD_SUBMIT_RING_SIZE slots.
    for s in &subs[1..4] {
        assert_eq!(post(*s, &d), (rdd_status::Ok, usize::MAX));
    }
    assert_eq!(post(subs[4], &d[..3]), (rdd_status::SqFull, 0));
    let c = stats(svc);
    assert_eq!(c.submitted, RDD_SUBMIT_RING_SIZE as u64);
    assert_eq!((c.refused_no_credit, c.refused_ring_full), (1, 1));
    assert_eq!(c.queued, RDD_SUBMIT_RING_SIZE as u64);
    // Work outstanding: nothing can be torn down.
    assert_eq!(rdd_submit_unregister(subs[0]), rdd_status::ResourceBusy);
    assert_eq!(rdd_submit_destroy(svc), rdd_status::ResourceBusy);
    // Drain it all: max_outstanding bounds what is on the QP at once.
    let mut done = 0;
    while done < RDD_SUBMIT_RING_SIZE {
        let posted = drain(svc);
        assert!(posted <= 64);
        step(&e);
        done += complete(svc);
    }
    for s in &subs[..4] {
        let mut got = 0;
        loop {
            let r = reap(*s);
            if r.is_empty() {
                break;
            }
            assert!(r.iter().all(|c| c.status == RDD_WC_SUCCESS));
            assert!(r
                .iter()
                .enumerate()
                .all(|(i, c)| c.wr_id == (got + i) as u64));
            got += r.len();
        }
        assert_eq!(got, RDD_SUBMIT_COMPLETION_RING_SIZE);
    }
    let c = stats(svc);
    assert_eq!(c.reaped, RDD_SUBMIT_RING_SIZE as u64);
    assert!(c.doorbells >= RDD_SUBMIT_RING_SIZE as u64 / 64);
    for s in subs {
        ok(rdd_submit_unregister(s));
    }
    ok(rdd_submit_destroy(svc));
    teardown(e);
}

#[test]
fn bad_descriptors_are_refused_before_queueing() {
    let e = env();
    let svc = create(&e, None);
    let sub = register(svc);
    let good = write_desc(&e, 1, 0, 8);
    let cases = [
        (
            rdd_submit_desc {
                opcode: RDD_WR_SEND,
                ..good
            },
            rdd_status::InvalidOpcode,
        ),
        (
            rdd_submit_desc {
                flags: RDD_SEND_SOLICITED,
                ..good
            },
            rdd_status::InvalidFlags,
        ),
        (
            rdd_submit_desc {
                reserved: 1,
                ..good
            },
            rdd_status::InvalidArgument,
        ),
        (
            rdd_submit_desc {
                length: 1 << 31,
                ..good
            },
            rdd_status::LengthOverflow,
        ),
        (
            rdd_submit_desc {
                flags: RDD_SEND_INLINE,
                length: 4096,
                ..good
            },
            rdd_status::InlineTooLarge,
        ),
        (
            rdd_submit_desc {
                flags: RDD_SEND_INLINE,
                local_addr: 0,
                ..good
            },
            rdd_status::NullPointer,
        ),
    ];
    for (d, want) in cases {
        assert_eq!(post(sub, &[good, d, good]), (want, 1), "{want:?}");
    }
    let c = stats(svc);
    assert_eq!(
        (c.submitted, c.queued),
        (cases.len() as u64, cases.len() as u64)
    );
    let mut done = 0;
    while done < cases.len() {
        drain(svc);
        step(&e);
        done += complete(svc);
    }
    assert_eq!(reap(sub).len(), cases.len());
    ok(rdd_submit_unregister(sub));
    ok(rdd_submit_destroy(svc));
    teardown(e);
}

#[test]
fn an_error_completion_flushes_what_follows() {
    let e = env();
    let svc = create(&e, None);
    let sub = register(svc);
    let mut d: Vec<_> = (0..6).map(|i| write_desc(&e, i, i * 64, 16)).collect();
    d[2].rkey ^= 0x5a5a; // not a key of the target
    assert_eq!(post(sub, &d[..4]), (rdd_status::Ok, usize::MAX));
    assert_eq!(drain(svc), 4);
    step(&e);
    let mut done = 0;
    for _ in 0..8 {
        done += complete(svc);
        step(&e);
    }
    assert_eq!(done, 4);
    // The QP is in error now: it still takes posts, which the device
    // flushes.
    assert_eq!(post(sub, &d[4..]), (rdd_status::Ok, usize::MAX));
    assert_eq!(drain(svc), 2);
    step(&e);
    assert_eq!(complete(svc), 2);
    let st: Vec<(u64, u32)> = reap(sub).iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        [
            (0, RDD_WC_SUCCESS),
            (1, RDD_WC_SUCCESS),
            (2, RDD_WC_REM_ACCESS_ERR),
            (3, RDD_WC_WR_FLUSH_ERR),
            (4, RDD_WC_WR_FLUSH_ERR),
            (5, RDD_WC_WR_FLUSH_ERR),
        ]
    );
    let c = stats(svc);
    assert_eq!((c.completed, c.failed, c.flushed), (6, 4, 0));
    ok(rdd_submit_unregister(sub));
    ok(rdd_submit_destroy(svc));
    teardown(e);
}

#[test]
fn one_poll_mode_call_at_a_time() {
    let e = env();
    let svc = create(&e, None);
    {
        let s = shared::<ServiceObj>(h(svc)).unwrap();
        let _held = s.core.claim_poller().unwrap();
        let mut n = 7;
        // SAFETY: `n` is a local.
        unsafe {
            assert_eq!(rdd_submit_drain(svc, &mut n), rdd_status::ResourceBusy);
            assert_eq!(rdd_submit_complete(svc, &mut n), rdd_status::ResourceBusy);
            assert_eq!(rdd_submit_flush(svc, &mut n), rdd_status::ResourceBusy);
        }
        assert_eq!(n, 7, "refused calls write nothing");
        assert_eq!(rdd_submit_destroy(svc), rdd_status::ResourceBusy);
    }
    assert_eq!(drain(svc), 0);
    ok(rdd_submit_destroy(svc));
    teardown(e);
}

#[test]
fn destroyed_qp_then_flush() {
    let e = env();
    let cfg = rdd_submit_config {
        max_outstanding: 4,
        max_batch: 2,
        ..rdd_submit_config::default()
    };
    let svc = create(&e, Some(cfg));
    let sub = register(svc);
    let d: Vec<_> = (0..10).map(|i| write_desc(&e, i, 0, 8)).collect();
    assert_eq!(post(sub, &d), (rdd_status::Ok, usize::MAX));
    let mut n = 0;
    // Four posted (max_outstanding), two held, four queued.
    assert_eq!([drain(svc), drain(svc), drain(svc)], [2, 2, 0]);
    let c = stats(svc);
    assert_eq!((c.posted, c.held, c.queued), (4, 2, 4));
    // SAFETY: `n` is a local.
    unsafe {
        assert_eq!(rdd_submit_flush(svc, &mut n), rdd_status::ResourceBusy);
    }
    ok(rdd_qp_destroy(e.qp[0]));
    // SAFETY: `n` is a local.
    unsafe {
        // No room for the held two: the drain does not reach the QP.
        ok(rdd_submit_drain(svc, &mut n));
        assert_eq!(n, 0);
        assert_eq!(rdd_submit_complete(svc, &mut n), rdd_status::NoSuchObject);
        ok(rdd_submit_flush(svc, &mut n));
    }
    assert_eq!(n, 10);
    let r = reap(sub);
    assert_eq!(r.len(), 10);
    assert!(r.iter().all(|c| c.status == RDD_WC_WR_FLUSH_ERR));
    ok(rdd_submit_unregister(sub));
    ok(rdd_submit_destroy(svc));
    // The rest of the environment.
    ok(rdd_qp_destroy(e.qp[1]));
    for cq in e.cq {
        ok(rdd_cq_destroy(cq));
    }
    ok(rdd_mr_free(e.src));
    ok(rdd_mr_free(e.dst));
    ok(rdd_pd_free(e.pd));
    ok(rdd_device_close(e.dev));
}

#[test]
fn bad_handles_and_arguments() {
    let e = env();
    let mut svc = null_mut();
    let mut n = 0;
    let bad_cfg = rdd_submit_config {
        max_batch: RDD_SUBMIT_MAX_BATCH + 1,
        ..rdd_submit_config::default()
    };
    // SAFETY: every pointer is a live local or NULL.
    unsafe {
        assert_eq!(
            rdd_submit_create(e.qp[0], e.cq[1], ptr::null(), &mut svc),
            rdd_status::InvalidArgument,
            "the CQ of another QP"
        );
        assert_eq!(
            rdd_submit_create(e.qp[0], e.cq[0], &bad_cfg, &mut svc),
            rdd_status::InvalidArgument
        );
        assert_eq!(
            rdd_submit_create(e.cq[0].cast(), e.cq[0], ptr::null(), &mut svc),
            rdd_status::InvalidHandle
        );
        assert!(svc.is_null(), "refused calls write nothing");
        let s = create(&e, None);
        // A QP handle is not a service, a service not a submitter.
        assert_eq!(
            rdd_submit_drain(e.qp[0].cast(), &mut n),
            rdd_status::InvalidHandle
        );
        let mut sub = null_mut();
        assert_eq!(
            rdd_submit_register(e.qp[0].cast(), &mut sub),
            rdd_status::InvalidHandle
        );
        assert_eq!(rdd_submit_unregister(s.cast()), rdd_status::InvalidHandle);
        let sub = register(s);
        ok(rdd_submit_unregister(sub));
        assert_eq!(rdd_submit_unregister(sub), rdd_status::InvalidHandle);
        assert_eq!(post(sub, &[]).0, rdd_status::InvalidHandle);
        ok(rdd_submit_destroy(s));
        assert_eq!(rdd_submit_destroy(s), rdd_status::InvalidHandle);
        assert_eq!(rdd_submit_drain(s, &mut n), rdd_status::InvalidHandle);
        assert_eq!(
            rdd_submit_destroy(0x4040 as *mut _),
            rdd_status::InvalidHandle
        );
    }
    teardown(e);
}

/// Real threads: three submitters and the poll-mode thread, with the
/// device on its own thread; every WRITE lands and completes once, in
/// each submitter's order.
#[test]
fn threads_submit_poll_and_reap() {
    const PER: u64 = if cfg!(miri) { 20 } else { 3000 };
    const SUBS: u64 = 3;
    let e = env();
    ok(rdd_device_start(e.dev));
    let svc = create(&e, None);
    let (svc_h, src, dst, lkey, rkey) = (svc as usize, e.src_addr, e.dst_addr, e.lkey, e.rkey);
    let start = std::time::Instant::now();
    let deadline = std::time::Duration::from_secs(60);
    std::thread::scope(|s| {
        for k in 0..SUBS {
            s.spawn(move || {
                let sub = register(svc_h as *mut rdd_submit_service);
                let (mut next, mut done) = (0u64, 0u64);
                while done < PER {
                    assert!(start.elapsed() < deadline, "submitter {k} stuck at {done}");
                    if next < PER {
                        let off = (k * PER + next) % (LEN as u64 / 8) * 8;
                        let d = rdd_submit_desc {
                            wr_id: next,
                            local_addr: src + off,
                            remote_addr: dst + off,
                            length: 8,
                            lkey,
                            rkey,
                            ..rdd_submit_desc::default()
                        };
                        if post(sub, &[d]).0 == rdd_status::Ok {
                            next += 1;
                        }
                    }
                    for c in reap(sub) {
                        assert_eq!(c.wr_id, done, "in order");
                        assert_eq!(c.status, RDD_WC_SUCCESS);
                        done += 1;
                    }
                    std::thread::yield_now();
                }
                ok(rdd_submit_unregister(sub));
            });
        }
        s.spawn(move || {
            let svc = svc_h as *mut rdd_submit_service;
            let mut done = 0;
            while done < (SUBS * PER) as usize {
                assert!(start.elapsed() < deadline, "poller stuck at {done}");
                drain(svc);
                done += complete(svc);
                std::thread::yield_now();
            }
        });
    });
    let c = stats(svc);
    assert_eq!(c.submitted, SUBS * PER);
    assert_eq!(c.reaped, SUBS * PER);
    assert!(c.doorbells <= c.posted);
    ok(rdd_submit_destroy(svc));
    ok(rdd_device_stop(e.dev));
    teardown(e);
}

#[test]
fn one_service_per_qp() {
    let e = env();
    let svc = create(&e, None);
    let mut second = null_mut();
    // SAFETY: `second` is a local.
    let s = unsafe { rdd_submit_create(e.qp[0], e.cq[0], ptr::null(), &mut second) };
    assert_eq!(s, rdd_status::ResourceBusy);
    assert!(second.is_null(), "nothing written");
    ok(rdd_submit_destroy(svc));
    // The claim went with the service: a new one may drive the QP.
    let svc = create(&e, None);
    ok(rdd_submit_destroy(svc));
    // A refused create (bad config) leaves no claim behind.
    let bad = rdd_submit_config {
        max_batch: RDD_SUBMIT_MAX_BATCH + 1,
        ..rdd_submit_config::default()
    };
    // SAFETY: `bad` and `second` are locals.
    let s = unsafe { rdd_submit_create(e.qp[0], e.cq[0], &bad, &mut second) };
    assert_eq!(s, rdd_status::InvalidArgument);
    let svc = create(&e, None);
    ok(rdd_submit_destroy(svc));
}
