//! Tests of the object API through its C calls, and their fixture (a
//! connected pair of QPs).

use super::objects::{MrObj, QpObj};
use super::table::KIND_QP;
use super::*;
use crate::ffi::mlx5::{rdd_wc, RDD_WC_OP_RECV, RDD_WC_OP_SEND, RDD_WC_SUCCESS};
use crate::ffi::wr::{rdd_recv_wr, rdd_sge, rdd_wr, RDD_SEND_SIGNALED, RDD_WR_SEND};
use core::ptr::null_mut;
use std::vec::Vec;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

struct Pair {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: [*mut rdd_cq; 2],
    qp: [*mut rdd_qp; 2],
    mr: [*mut rdd_mr; 2],
}

/// Two connected QPs, each with its own CQ and a 4 KiB MR.
fn pair() -> Pair {
    let mut p = Pair {
        dev: null_mut(),
        pd: null_mut(),
        cq: [null_mut(); 2],
        qp: [null_mut(); 2],
        mr: [null_mut(); 2],
    };
    // SAFETY: every out-parameter is a live local.
    unsafe {
        ok(rdd_device_open_soft(ptr::null(), &mut p.dev));
        ok(rdd_pd_alloc(p.dev, &mut p.pd));
        for i in 0..2 {
            ok(rdd_cq_create(p.dev, 256, &mut p.cq[i]));
            ok(rdd_qp_create(
                p.pd,
                p.cq[i],
                p.cq[i],
                ptr::null(),
                &mut p.qp[i],
            ));
            ok(rdd_mr_reg(p.pd, 4096, RDD_ACCESS_LOCAL_WRITE, &mut p.mr[i]));
        }
        let mut info = [rdd_qp_info::default(); 2];
        ok(rdd_qp_query_info(p.qp[0], &mut info[0]));
        ok(rdd_qp_query_info(p.qp[1], &mut info[1]));
        ok(rdd_qp_connect(p.qp[0], &info[1], ptr::null()));
        ok(rdd_qp_connect(p.qp[1], &info[0], ptr::null()));
    }
    p
}

fn teardown(p: Pair) {
    for i in 0..2 {
        ok(rdd_qp_destroy(p.qp[i]));
        ok(rdd_cq_destroy(p.cq[i]));
        ok(rdd_mr_free(p.mr[i]));
    }
    ok(rdd_pd_free(p.pd));
    ok(rdd_device_close(p.dev));
}

fn sge(mr: *mut rdd_mr, len: u32) -> rdd_sge {
    let mut addr = null_mut();
    let mut lkey = 0;
    // SAFETY: out-parameters are locals.
    unsafe {
        ok(rdd_mr_addr(mr, &mut addr));
        ok(rdd_mr_lkey(mr, &mut lkey));
    }
    rdd_sge {
        addr: addr as u64,
        length: len,
        lkey,
    }
}

fn poll(cq: *mut rdd_cq, qp: *mut rdd_qp) -> Vec<rdd_wc> {
    let mut wc = [rdd_wc::default(); 8];
    let mut n = 0;
    // SAFETY: arrays and out-parameters are locals.
    ok(unsafe { rdd_cq_poll(cq, &qp, 1, wc.as_mut_ptr(), 8, &mut n) });
    wc[..n].to_vec()
}

#[test]
fn send_recv_round_trip() {
    let p = pair();
    let src = sge(p.mr[0], 5);
    let dst = sge(p.mr[1], 64);
    // SAFETY: the MR buffer is 4096 bytes.
    unsafe { ptr::copy_nonoverlapping(b"hello".as_ptr(), src.addr as *mut u8, 5) };
    let r = rdd_recv_wr {
        wr_id: 9,
        sg_list: &dst,
        num_sge: 1,
        reserved: 0,
    };
    let w = rdd_wr {
        wr_id: 8,
        sg_list: &src,
        num_sge: 1,
        opcode: RDD_WR_SEND,
        flags: RDD_SEND_SIGNALED,
        imm_data: 0,
        remote_addr: 0,
        rkey: 0,
        invalidate_rkey: 0,
        compare_add: 0,
        swap: 0,
    };
    let mut bad = usize::MAX;
    let mut work = 0;
    let mut bells = 0;
    // SAFETY: WRs and SGEs are live locals.
    unsafe {
        ok(rdd_qp_post_recv(p.qp[1], &r, 1, &mut bad));
        ok(rdd_qp_post_send(p.qp[0], &w, 1, &mut bad));
        ok(rdd_device_step(p.dev, &mut work));
        ok(rdd_qp_doorbells(p.qp[0], &mut bells));
    }
    assert_eq!(bad, usize::MAX);
    assert!(work > 0);
    assert_eq!(bells, 1);
    let s = poll(p.cq[0], p.qp[0]);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].wr_id, s[0].opcode, s[0].status),
        (8, RDD_WC_OP_SEND, RDD_WC_SUCCESS)
    );
    let r = poll(p.cq[1], p.qp[1]);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len),
        (9, RDD_WC_OP_RECV, 5)
    );
    // SAFETY: the MR buffer is 4096 bytes and the receive completed.
    let got = unsafe { core::slice::from_raw_parts(dst.addr as *const u8, 5) };
    assert_eq!(got, b"hello");
    teardown(p);
}

#[test]
fn handles_are_validated() {
    let p = pair();
    let mut lkey = 0;
    // Wrong kind, forged values, NULL.
    assert_eq!(rdd_pd_free(p.qp[0].cast()), rdd_status::InvalidHandle);
    assert_eq!(
        rdd_qp_destroy(as_handle(0x1234_5678_9abc_def5)),
        rdd_status::InvalidHandle
    );
    assert_eq!(
        rdd_qp_destroy(as_handle(KIND_QP as usize | 1 << 30)),
        rdd_status::InvalidHandle
    );
    assert_eq!(rdd_qp_destroy(null_mut()), rdd_status::NullParameter);
    // SAFETY: out-parameter is a local.
    let s = unsafe { rdd_mr_lkey(null_mut::<rdd_mr>(), &mut lkey) };
    assert_eq!(s, rdd_status::NullParameter);
    // Wrong destroy order.
    assert_eq!(rdd_device_close(p.dev), rdd_status::ResourceBusy);
    assert_eq!(rdd_pd_free(p.pd), rdd_status::ResourceBusy);
    assert_eq!(rdd_cq_destroy(p.cq[0]), rdd_status::ResourceBusy);
    // A handle held by another call is busy, not freed under it.
    {
        let _held = excl::<QpObj>(h(p.qp[0])).unwrap();
        assert_eq!(rdd_qp_destroy(p.qp[0]), rdd_status::ResourceBusy);
        let mut info = rdd_qp_info::default();
        // SAFETY: out-parameter is a local.
        let s = unsafe { rdd_qp_query_info(p.qp[0], &mut info) };
        assert_eq!(s, rdd_status::ResourceBusy);
    }
    {
        let _reader = shared::<MrObj>(h(p.mr[0])).unwrap();
        // SAFETY: out-parameter is a local.
        ok(unsafe { rdd_mr_lkey(p.mr[0], &mut lkey) });
        assert_eq!(rdd_mr_free(p.mr[0]), rdd_status::ResourceBusy);
    }
    let old_qp = p.qp[0];
    let old_mr = p.mr[0];
    teardown(p);
    // Use after destroy and double destroy.
    assert_eq!(rdd_qp_destroy(old_qp), rdd_status::InvalidHandle);
    // SAFETY: out-parameter is a local.
    let s = unsafe { rdd_mr_lkey(old_mr, &mut lkey) };
    assert_eq!(s, rdd_status::InvalidHandle);
    assert_eq!(rdd_mr_free(old_mr), rdd_status::InvalidHandle);
    // A reused slot gets a new generation: the old handle stays dead.
    let p = pair();
    assert_eq!(rdd_qp_destroy(old_qp), rdd_status::InvalidHandle);
    teardown(p);
}

#[test]
fn poll_list_must_name_every_qp_once() {
    let p = pair();
    let mut q2 = null_mut();
    // SAFETY: out-parameter is a local.
    ok(unsafe { rdd_qp_create(p.pd, p.cq[0], p.cq[1], ptr::null(), &mut q2) });
    let mut wc = [rdd_wc::default(); 4];
    let mut n = 77;
    let cases: [(&[*mut rdd_qp], rdd_status); 4] = [
        (&[p.qp[0]], rdd_status::InvalidArgument),
        (&[p.qp[0], p.qp[0]], rdd_status::InvalidArgument),
        (&[p.qp[0], p.qp[1]], rdd_status::InvalidArgument),
        (&[q2, p.qp[0]], rdd_status::Ok),
    ];
    for (list, want) in cases {
        // SAFETY: arrays and out-parameters are locals.
        let s = unsafe {
            rdd_cq_poll(
                p.cq[0],
                list.as_ptr(),
                list.len(),
                wc.as_mut_ptr(),
                4,
                &mut n,
            )
        };
        assert_eq!(s, want, "{list:?}");
    }
    assert_eq!(n, 0);
    // The send and receive CQs are both held by the new QP.
    assert_eq!(rdd_cq_destroy(p.cq[1]), rdd_status::ResourceBusy);
    ok(rdd_qp_destroy(q2));
    teardown(p);
}
