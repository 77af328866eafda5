//! Tests of the per-opcode posts and the one-handle poll that C cannot
//! stage: a QP held by another call while its completion is polled.

use super::objects::QpObj;
use super::*;
use crate::ffi::mlx5::{rdd_wc, RDD_WC_OP_RDMA_WRITE, RDD_WC_SUCCESS};
use crate::ffi::wr::{RDD_SEND_DEFER_DOORBELL, RDD_SEND_SIGNALED};
use core::ptr::null_mut;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

struct Env {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: [*mut rdd_cq; 2],
    qp: [*mut rdd_qp; 2],
    mr: [*mut rdd_mr; 2],
    addr: [u64; 2],
    lkey: [u32; 2],
    rkey: [u32; 2],
}

/// Two connected QPs with remote write, each on its own CQ, each with a
/// 4 KiB MR.
fn env() -> Env {
    let mut e = Env {
        dev: null_mut(),
        pd: null_mut(),
        cq: [null_mut(); 2],
        qp: [null_mut(); 2],
        mr: [null_mut(); 2],
        addr: [0; 2],
        lkey: [0; 2],
        rkey: [0; 2],
    };
    let attr = rdd_connect_attr {
        access: RDD_ACCESS_REMOTE_WRITE,
        rnr_retry: 7,
        retry_cnt: 7,
        traffic_class: 0,
        sl: 0,
    };
    // SAFETY: every out-parameter is a live local.
    unsafe {
        ok(rdd_device_open_soft(ptr::null(), &mut e.dev));
        ok(rdd_pd_alloc(e.dev, &mut e.pd));
        for i in 0..2 {
            ok(rdd_cq_create(e.dev, 256, &mut e.cq[i]));
            ok(rdd_qp_create(
                e.pd,
                e.cq[i],
                e.cq[i],
                ptr::null(),
                &mut e.qp[i],
            ));
            let access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
            ok(rdd_mr_reg(e.pd, 4096, access, &mut e.mr[i]));
            let mut a = null_mut();
            ok(rdd_mr_addr(e.mr[i], &mut a));
            e.addr[i] = a as u64;
            ok(rdd_mr_lkey(e.mr[i], &mut e.lkey[i]));
            ok(rdd_mr_rkey(e.mr[i], &mut e.rkey[i]));
        }
        let mut info = [rdd_qp_info::default(); 2];
        ok(rdd_qp_query_info(e.qp[0], &mut info[0]));
        ok(rdd_qp_query_info(e.qp[1], &mut info[1]));
        ok(rdd_qp_connect(e.qp[0], &info[1], &attr));
        ok(rdd_qp_connect(e.qp[1], &info[0], &attr));
    }
    e
}

fn close(e: Env) {
    for i in 0..2 {
        ok(rdd_qp_destroy(e.qp[i]));
        ok(rdd_cq_destroy(e.cq[i]));
        ok(rdd_mr_free(e.mr[i]));
    }
    ok(rdd_pd_free(e.pd));
    ok(rdd_device_close(e.dev));
}

fn step(e: &Env) -> usize {
    let mut work = 0;
    // SAFETY: out-parameter is a local.
    ok(unsafe { rdd_device_step(e.dev, &mut work) });
    work
}

fn write(e: &Env, wr_id: u64, flags: u32) -> rdd_status {
    // SAFETY: the addresses are inside the env's MRs.
    unsafe {
        rdd_qp_write(
            e.qp[0], wr_id, e.addr[0], 8, e.lkey[0], e.addr[1], e.rkey[1], flags,
        )
    }
}

fn poll_n(cq: *mut rdd_cq, wc: &mut [rdd_wc]) -> i32 {
    // SAFETY: `wc` is a live local array of that length.
    unsafe { rdd_cq_poll_n(cq, wc.as_mut_ptr(), wc.len() as u32) }
}

#[test]
fn a_busy_qp_stops_the_poll_in_front_of_its_completion() {
    let e = env();
    let mut wc = [rdd_wc::default(); 4];
    ok(write(&e, 1, RDD_SEND_SIGNALED));
    step(&e);
    {
        // Another call holds the QP: its completion is left in place.
        let _held = excl::<QpObj>(h(e.qp[0])).unwrap();
        assert_eq!(poll_n(e.cq[0], &mut wc), -(rdd_status::ResourceBusy as i32));
        assert_eq!(wc[0].wr_id, 0, "nothing written on failure");
    }
    // Released: the same completion arrives, exactly once.
    assert_eq!(poll_n(e.cq[0], &mut wc), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (1, RDD_WC_SUCCESS, RDD_WC_OP_RDMA_WRITE)
    );
    assert_eq!(poll_n(e.cq[0], &mut wc), 0);
    // An empty poll does not touch the QP: it works while the QP is held.
    {
        let _held = excl::<QpObj>(h(e.qp[0])).unwrap();
        assert_eq!(poll_n(e.cq[0], &mut wc), 0);
    }
    close(e);
}

#[test]
fn completions_before_a_busy_qp_are_returned() {
    let e = env();
    // A second pair: `x` completes on QP 0's CQ, `y` on QP 1's.
    let (mut x, mut y) = (null_mut(), null_mut());
    let mut info = [rdd_qp_info::default(); 2];
    let attr = rdd_connect_attr {
        access: RDD_ACCESS_REMOTE_WRITE,
        rnr_retry: 7,
        retry_cnt: 7,
        traffic_class: 0,
        sl: 0,
    };
    // SAFETY: out-parameters are locals.
    unsafe {
        ok(rdd_qp_create(e.pd, e.cq[0], e.cq[0], ptr::null(), &mut x));
        ok(rdd_qp_create(e.pd, e.cq[1], e.cq[1], ptr::null(), &mut y));
        ok(rdd_qp_query_info(x, &mut info[0]));
        ok(rdd_qp_query_info(y, &mut info[1]));
        ok(rdd_qp_connect(x, &info[1], &attr));
        ok(rdd_qp_connect(y, &info[0], &attr));
    }
    // QP 0's completion first, then x's.
    ok(write(&e, 1, RDD_SEND_SIGNALED));
    step(&e);
    // SAFETY: the addresses are inside the env's MRs.
    ok(unsafe {
        rdd_qp_write(
            x,
            2,
            e.addr[0],
            8,
            e.lkey[0],
            e.addr[1],
            e.rkey[1],
            RDD_SEND_SIGNALED,
        )
    });
    step(&e);
    let mut wc = [rdd_wc::default(); 4];
    {
        let _held = excl::<QpObj>(h(x)).unwrap();
        assert_eq!(poll_n(e.cq[0], &mut wc), 1, "stops in front of x's");
        assert_eq!(wc[0].wr_id, 1);
        assert_eq!(poll_n(e.cq[0], &mut wc), -(rdd_status::ResourceBusy as i32));
    }
    assert_eq!(poll_n(e.cq[0], &mut wc), 1);
    assert_eq!(wc[0].wr_id, 2);
    ok(rdd_qp_destroy(x));
    ok(rdd_qp_destroy(y));
    close(e);
}

#[test]
fn deferred_writes_wait_for_the_ring() {
    let e = env();
    let mut bells = 0;
    for i in 0..4 {
        ok(write(&e, i, RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    }
    // SAFETY: out-parameter is a local.
    ok(unsafe { rdd_qp_doorbells(e.qp[0], &mut bells) });
    assert_eq!(bells, 0);
    assert_eq!(step(&e), 0, "nothing executes before the doorbell");
    ok(rdd_qp_ring(e.qp[0]));
    ok(rdd_qp_ring(e.qp[0])); // nothing pending: no doorbell
                              // SAFETY: out-parameter is a local.
    ok(unsafe { rdd_qp_doorbells(e.qp[0], &mut bells) });
    assert_eq!(bells, 1);
    assert!(step(&e) > 0);
    let mut wc = [rdd_wc::default(); 8];
    assert_eq!(poll_n(e.cq[0], &mut wc), 4);
    let ids: std::vec::Vec<u64> = wc[..4].iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    close(e);
}
