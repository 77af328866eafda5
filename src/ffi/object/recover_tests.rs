//! Tests of `rdd_qp_recover` with work posted with
//! `RDD_SEND_DEFER_DOORBELL` and never rung (found by the `recover_ops`
//! fuzz target): the device does not know that work until a doorbell
//! publishes it, so recovery must ring it, or it would wait for ever.

use core::ffi::c_void;
use core::ptr::{null, null_mut};
use std::vec::Vec;

use super::*;
use crate::ffi::mlx5::{rdd_wc, RDD_WC_WR_FLUSH_ERR};
use crate::ffi::wr::RDD_SEND_DEFER_DOORBELL;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

/// A software device in step mode with two connected QPs of 4 send and 4
/// receive WRs, each on its own CQ, and one 4 KiB region.
struct Env {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: [*mut rdd_cq; 2],
    qp: [*mut rdd_qp; 2],
    mr: *mut rdd_mr,
    addr: u64,
    lkey: u32,
    rkey: u32,
}

fn env() -> Env {
    let mut e = Env {
        dev: null_mut(),
        pd: null_mut(),
        cq: [null_mut(); 2],
        qp: [null_mut(); 2],
        mr: null_mut(),
        addr: 0,
        lkey: 0,
        rkey: 0,
    };
    let init = rdd_qp_init {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        flags: 0,
    };
    let access = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
    let attr = rdd_connect_attr {
        access,
        rnr_retry: 7,
        retry_cnt: 7,
        traffic_class: 0,
        sl: 0,
    };
    // SAFETY: every out-parameter is a live local; `init` and `attr` are
    // live locals.
    unsafe {
        ok(rdd_device_open_soft(null(), &mut e.dev));
        ok(rdd_pd_alloc(e.dev, &mut e.pd));
        for i in 0..2 {
            ok(rdd_cq_create(e.dev, 64, &mut e.cq[i]));
            ok(rdd_qp_create(e.pd, e.cq[i], e.cq[i], &init, &mut e.qp[i]));
        }
        ok(rdd_mr_reg(e.pd, 4096, access, &mut e.mr));
        let mut a = null_mut();
        ok(rdd_mr_addr(e.mr, &mut a));
        e.addr = a as u64;
        ok(rdd_mr_lkey(e.mr, &mut e.lkey));
        ok(rdd_mr_rkey(e.mr, &mut e.rkey));
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
    }
    ok(rdd_mr_free(e.mr));
    ok(rdd_pd_free(e.pd));
    ok(rdd_device_close(e.dev));
}

/// # Safety
/// `ctx` is a `Vec<rdd_wc>` with spare capacity, `wc` a live completion.
unsafe extern "C" fn collect(ctx: *mut c_void, wc: *const rdd_wc) {
    // SAFETY: the caller's contract above.
    unsafe { (*ctx.cast::<Vec<rdd_wc>>()).push(*wc) };
}

/// Recovers QP 0 without a peer in step mode: calls with timeout 0 and a
/// device step after each `TIMEOUT`; returns the completions handed over
/// once a call finished, or `None` if four calls did not.
fn recover(e: &Env) -> Option<Vec<rdd_wc>> {
    let mut seen: Vec<rdd_wc> = Vec::with_capacity(16);
    for _ in 0..4 {
        let ctx = (&mut seen as *mut Vec<rdd_wc>).cast::<c_void>();
        // SAFETY: `collect` is safe to call with `ctx` (room for every
        // completion the QP can have).
        let st =
            unsafe { rdd_qp_recover(e.qp[0], null(), null(), 0, Some(collect), ctx, null_mut()) };
        if st == rdd_status::Ok {
            return Some(seen);
        }
        assert_eq!(st, rdd_status::Timeout);
        let mut work = 0;
        // SAFETY: out-parameter is a local.
        ok(unsafe { rdd_device_step(e.dev, &mut work) });
    }
    None
}

#[test]
fn recovery_flushes_a_deferred_receive() {
    let e = env();
    // SAFETY: the address is inside the env's region.
    ok(unsafe { rdd_qp_recv(e.qp[0], 7, e.addr, 8, e.lkey, RDD_SEND_DEFER_DOORBELL) });
    let seen = recover(&e).expect("recovery finishes");
    let got: Vec<(u64, u32)> = seen.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(7, RDD_WC_WR_FLUSH_ERR)]);
    close(e);
}

#[test]
fn recovery_flushes_a_send_queue_full_of_deferred_writes() {
    let e = env();
    for i in 0..4 {
        // SAFETY: the addresses are inside the env's region.
        ok(unsafe {
            rdd_qp_write(
                e.qp[0],
                i,
                e.addr,
                8,
                e.lkey,
                e.addr + 64,
                e.rkey,
                RDD_SEND_DEFER_DOORBELL,
            )
        });
    }
    // No room for the drain marker: only ringing the four lets the
    // device flush them.
    let seen = recover(&e).expect("recovery finishes");
    let got: Vec<(u64, u32)> = seen.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        (0..4).map(|i| (i, RDD_WC_WR_FLUSH_ERR)).collect::<Vec<_>>()
    );
    close(e);
}
