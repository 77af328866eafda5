//! Tests of the UD calls' pure parts and of what C cannot reach: the
//! attribute translation (`ah_init_from`), and a send meeting an address
//! handle that another guard holds exclusively (the threading contract
//! broken: `RESOURCE_BUSY`, nothing written).

use super::table::excl;
use super::ud::{ah_init_from, AhObj};
use super::*;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

#[test]
fn ah_attr_translation() {
    let a = rdd_ah_attr {
        dgid: [7; 16],
        flow_label: 0xabcde,
        dlid: 0x1234,
        port_num: 1,
        sl: 9,
        is_global: 1,
        sgid_index: 2,
        hop_limit: 3,
        traffic_class: 4,
        reserved: 0,
    };
    let i = ah_init_from(&a).expect("valid");
    assert_eq!(i.port_num, 1);
    let d = i.dest;
    assert_eq!((d.dlid, d.sl, d.is_global), (0x1234, 9, true));
    assert_eq!((d.sgid_index, d.hop_limit, d.traffic_class), (2, 3, 4));
    assert_eq!((d.dgid, d.flow_label), ([7; 16], 0xabcde));
    let plain = ah_init_from(&rdd_ah_attr::default()).expect("valid");
    assert!(!plain.dest.is_global);
    for bad in [
        rdd_ah_attr { is_global: 2, ..a },
        rdd_ah_attr { reserved: 1, ..a },
    ] {
        assert_eq!(ah_init_from(&bad).err(), Some(rdd_status::InvalidArgument));
    }
}

#[test]
fn send_meets_a_held_ah() {
    let (mut dev, mut pd, mut cq, mut qp) = (null(), null(), null(), null());
    let (mut ah, mut mr, mut addr, mut lkey) = (null(), null(), core::ptr::null_mut(), 0u32);
    // SAFETY: every out-parameter is a live local; the SGE names the MR.
    unsafe {
        ok(rdd_device_open_soft(ptr::null(), &mut dev));
        ok(rdd_pd_alloc(dev, &mut pd));
        ok(rdd_cq_create(dev, 256, &mut cq));
        ok(rdd_qp_create_ud(pd, cq, cq, ptr::null(), &mut qp));
        ok(rdd_qp_ready_ud(qp, 1));
        ok(rdd_ah_create(pd, &rdd_ah_attr::default(), &mut ah));
        ok(rdd_mr_reg(pd, 4096, RDD_ACCESS_LOCAL_WRITE, &mut mr));
        ok(rdd_mr_addr(mr, &mut addr));
        ok(rdd_mr_lkey(mr, &mut lkey));
        let mut info = rdd_qp_info::default();
        ok(rdd_qp_query_info(qp, &mut info));
        let mut before = 0;
        ok(rdd_qp_doorbells(qp, &mut before));
        {
            let held = excl::<AhObj>(h(ah)).expect("AH is free");
            let s = rdd_qp_send_ud(qp, ah, info.qpn, 1, 1, addr as u64, 8, lkey, 0);
            assert_eq!(s, rdd_status::ResourceBusy);
            assert_eq!(rdd_ah_destroy(ah), rdd_status::ResourceBusy);
            drop(held);
        }
        let mut after = 0;
        ok(rdd_qp_doorbells(qp, &mut after));
        assert_eq!(before, after);
        ok(rdd_qp_send_ud(
            qp,
            ah,
            info.qpn,
            1,
            1,
            addr as u64,
            8,
            lkey,
            0,
        ));
        ok(rdd_ah_destroy(ah));
        ok(rdd_qp_destroy(qp));
        ok(rdd_cq_destroy(cq));
        ok(rdd_mr_free(mr));
        ok(rdd_pd_free(pd));
        ok(rdd_device_close(dev));
    }
}

fn null<T>() -> *mut T {
    core::ptr::null_mut()
}
