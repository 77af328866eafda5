//! Tests of the SRQ calls that C cannot reach: a poll meeting an SRQ that
//! another guard holds (the threading contract broken) stops in front of
//! the entry and loses nothing (`srq_route.rs`).

use super::srq::SrqObj;
use super::table::excl;
use super::*;
use crate::ffi::mlx5::{rdd_wc, RDD_WC_OP_RECV, RDD_WC_SUCCESS};
use crate::ffi::wr::{rdd_sge, rdd_wr, RDD_SEND_SIGNALED, RDD_WR_SEND};
use core::ptr::null_mut;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

#[test]
fn poll_stops_in_front_of_a_busy_srq() {
    let mut dev = null_mut();
    let mut pd = null_mut();
    let mut srq = null_mut();
    let (mut rcq, mut scq) = (null_mut(), null_mut());
    let (mut rqp, mut sqp) = (null_mut(), null_mut());
    let mut mr = null_mut();
    let (mut addr, mut lkey) = (null_mut(), 0u32);
    let init = rdd_srq_init {
        max_wr: 8,
        max_sge: 1,
        reserved: 0,
    };
    // SAFETY: every out-parameter is a live local; the SGEs name the MR.
    unsafe {
        ok(rdd_device_open_soft(ptr::null(), &mut dev));
        ok(rdd_pd_alloc(dev, &mut pd));
        ok(rdd_srq_create(pd, &init, &mut srq));
        ok(rdd_cq_create(dev, 256, &mut rcq));
        ok(rdd_cq_create(dev, 256, &mut scq));
        ok(rdd_qp_create_on_srq(
            pd,
            rcq,
            rcq,
            srq,
            ptr::null(),
            &mut rqp,
        ));
        ok(rdd_qp_create(pd, scq, scq, ptr::null(), &mut sqp));
        let (mut ri, mut si) = (rdd_qp_info::default(), rdd_qp_info::default());
        ok(rdd_qp_query_info(rqp, &mut ri));
        ok(rdd_qp_query_info(sqp, &mut si));
        ok(rdd_qp_connect(rqp, &si, ptr::null()));
        ok(rdd_qp_connect(sqp, &ri, ptr::null()));
        ok(rdd_mr_reg(pd, 4096, RDD_ACCESS_LOCAL_WRITE, &mut mr));
        ok(rdd_mr_addr(mr, &mut addr));
        ok(rdd_mr_lkey(mr, &mut lkey));
        ok(rdd_srq_recv(srq, 42, addr as u64, 64, lkey, 0));
        let src = rdd_sge {
            addr: addr as u64 + 1024,
            length: 8,
            lkey,
        };
        let w = rdd_wr {
            wr_id: 1,
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
        let mut bad = 0;
        ok(rdd_qp_post_send(sqp, &w, 1, &mut bad));
        let mut work = 0;
        for _ in 0..8 {
            ok(rdd_device_step(dev, &mut work));
        }
        let mut wc = [rdd_wc::default(); 4];
        {
            // Another holder of the SRQ: both polls stop in front of the
            // entry without consuming it.
            let held = excl::<SrqObj>(h(srq)).expect("SRQ is free");
            assert_eq!(
                rdd_cq_poll_n(rcq, wc.as_mut_ptr(), 4),
                -(rdd_status::ResourceBusy as u32 as i32)
            );
            let mut n = 7;
            assert_eq!(
                rdd_cq_poll(rcq, &rqp, 1, wc.as_mut_ptr(), 4, &mut n),
                rdd_status::ResourceBusy
            );
            assert_eq!(n, 7);
            drop(held);
        }
        // Released: the completion is still there, once.
        assert_eq!(rdd_cq_poll_n(rcq, wc.as_mut_ptr(), 4), 1);
        assert_eq!(wc[0].wr_id, 42);
        assert_eq!(wc[0].status, RDD_WC_SUCCESS);
        assert_eq!(wc[0].opcode, RDD_WC_OP_RECV);
        assert_eq!(wc[0].qp_num, ri.qpn);
        assert_eq!(rdd_cq_poll_n(rcq, wc.as_mut_ptr(), 4), 0);
        ok(rdd_qp_destroy(rqp));
        ok(rdd_qp_destroy(sqp));
        ok(rdd_srq_destroy(srq));
        ok(rdd_cq_destroy(rcq));
        ok(rdd_cq_destroy(scq));
        ok(rdd_mr_free(mr));
        ok(rdd_pd_free(pd));
        ok(rdd_device_close(dev));
    }
}
