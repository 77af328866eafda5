//! The raw-queue C ABI end to end on fake queue memory.

use super::*;
use crate::ffi::wr::{rdd_recv_wr, rdd_wr};
use crate::ffi::wr::{rdd_sge, RDD_SEND_INLINE, RDD_SEND_SIGNALED, RDD_WR_RDMA_WRITE, RDD_WR_SEND};
use crate::testutil::{decode_wqe, FakeGeometry, FakeMlx5};
use core::ptr;
use std::boxed::Box;
use std::vec;

fn dv_qp(f: &FakeMlx5) -> rdd_mlx5dv_qp {
    f.dv_qp().into()
}

fn dv_cq(f: &FakeMlx5) -> rdd_mlx5dv_cq {
    f.dv_cq().into()
}

fn zeroed<T>() -> Box<T> {
    // SAFETY: the storage types are byte arrays: all zeroes is valid.
    unsafe { Box::new(core::mem::zeroed()) }
}

fn send_wr(opcode: u32, flags: u32, sg: &[rdd_sge]) -> rdd_wr {
    rdd_wr {
        wr_id: 0x1004,
        sg_list: sg.as_ptr(),
        num_sge: sg.len() as u32,
        opcode,
        flags,
        imm_data: 0,
        remote_addr: 0x7e00_1122_0000,
        rkey: 0x0bad_cafe,
        invalidate_rkey: 0,
        compare_add: 0,
        swap: 0,
    }
}

#[test]
fn post_ring_poll_through_the_c_abi() {
    let geo = FakeGeometry::default();
    let mut f = FakeMlx5::new(geo);
    let qp = dv_qp(&f);
    let cqd = dv_cq(&f);
    let caps = rdd_qp_caps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: geo.rq_stride / 16,
    };
    let mut sq = zeroed::<rdd_mlx5_sq_storage>();
    let mut rq = zeroed::<rdd_mlx5_rq_storage>();
    let mut cq = zeroed::<rdd_mlx5_cq_storage>();
    let mut slots: vec::Vec<rdd_mlx5_sq_slot> = (0..geo.sq_wqe_cnt)
        .map(|_| rdd_mlx5_sq_slot { _opaque: [0; 2] })
        .collect();
    let mut rq_ids = vec![0u64; geo.rq_wqe_cnt as usize];
    let mut bad = usize::MAX;
    let sge = [rdd_sge {
        addr: 0x7f5a_3c00_3000,
        length: 4096,
        lkey: 0xa1b2c3,
    }];
    let w = send_wr(RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &sge);

    // SAFETY: (whole test) every pointer is to live memory owned by
    // the test; `f` outlives the handles.
    unsafe {
        // Use before init.
        assert_eq!(
            rdd_mlx5_sq_post(&mut *sq, &w, 1, &mut bad),
            rdd_status::InvalidHandle
        );
        assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::InvalidHandle);
        assert_eq!(rdd_mlx5_sq_fini(&mut *sq), rdd_status::InvalidHandle);
        // Wrid table too small: storage untouched.
        let s = rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, 0, slots.as_mut_ptr(), 3);
        assert_eq!(s, rdd_status::StorageTooSmall);
        assert!(sq._opaque.iter().all(|&b| b == 0));
        let s = rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, 0x10, slots.as_mut_ptr(), 64);
        assert_eq!(s, rdd_status::InvalidArgument);
        let both = RDD_MLX5_SQ_BF_NEVER | RDD_MLX5_SQ_BF_INLINE_ONLY;
        let s = rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, both, slots.as_mut_ptr(), 64);
        assert_eq!(s, rdd_status::InvalidArgument);
        let s = rdd_mlx5_sq_init(
            &mut *sq,
            ptr::null(),
            geo.qpn,
            &caps,
            0,
            slots.as_mut_ptr(),
            64,
        );
        assert_eq!(s, rdd_status::NullParameter);

        let n = slots.len();
        assert_eq!(
            rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, 0, slots.as_mut_ptr(), n),
            rdd_status::Ok
        );
        let n = rq_ids.len();
        assert_eq!(
            rdd_mlx5_rq_init(&mut *rq, &qp, &caps, rq_ids.as_mut_ptr(), n),
            rdd_status::Ok
        );
        assert_eq!(rdd_mlx5_cq_init(&mut *cq, &cqd), rdd_status::Ok);

        // A good WR, then one with an unknown opcode: index 1 reported,
        // the first one posted.
        let mut ws = [w, w];
        ws[1].opcode = 7;
        assert_eq!(
            rdd_mlx5_sq_post(&mut *sq, ws.as_ptr(), 2, &mut bad),
            rdd_status::InvalidOpcode
        );
        assert_eq!(bad, 1);
        assert_eq!(f.dbrec_sq(), 0, "post does not ring");
        assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::Ok);
        assert_eq!(f.dbrec_sq(), 1);
        let d = decode_wqe(f.sq_bytes(), 0).unwrap();
        assert_eq!((d.opcode, d.ds, d.qpn), (0x08, 3, geo.qpn));
        assert_eq!(d.sges, vec![(0x7f5a_3c00_3000, 4096, 0xa1b2c3)]);

        // Inline SEND.
        let payload = *b"hello";
        let isg = [rdd_sge {
            addr: payload.as_ptr() as u64,
            length: 5,
            lkey: 0,
        }];
        let iw = send_wr(RDD_WR_SEND, RDD_SEND_INLINE, &isg);
        bad = usize::MAX;
        assert_eq!(rdd_mlx5_sq_post(&mut *sq, &iw, 1, &mut bad), rdd_status::Ok);
        assert_eq!(bad, usize::MAX, "not written on success");
        assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::Ok);
        let d = decode_wqe(f.sq_bytes(), 1).unwrap();
        assert_eq!(d.inline.as_deref(), Some(&b"hello"[..]));

        // A receive.
        let rsg = [rdd_sge {
            addr: 0x5000,
            length: 256,
            lkey: 3,
        }];
        let rw = rdd_recv_wr {
            wr_id: 77,
            sg_list: rsg.as_ptr(),
            num_sge: 1,
            reserved: 0,
        };
        assert_eq!(rdd_mlx5_rq_post(&mut *rq, &rw, 1, &mut bad), rdd_status::Ok);
        assert_eq!(f.dbrec_rq(), 1);

        // Requester CQE for WQE 0 and a responder SEND_WITH_IMM.
        let mut cqe = [0u8; 64];
        cqe[56..60].copy_from_slice(&(0x0800_0000 | geo.qpn).to_be_bytes());
        f.write_cqe(0, &cqe);
        let mut cqe = [0u8; 64];
        cqe[36..40].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        cqe[44..48].copy_from_slice(&5u32.to_be_bytes());
        cqe[56..60].copy_from_slice(&geo.qpn.to_be_bytes());
        cqe[63] = 0x30;
        f.write_cqe(1, &cqe);

        let mut wc = [rdd_wc::default(); 4];
        let mut count = usize::MAX;
        assert_eq!(
            rdd_mlx5_cq_poll(&mut *cq, &mut *sq, &mut *rq, wc.as_mut_ptr(), 4, &mut count),
            rdd_status::Ok
        );
        assert_eq!(count, 2);
        assert_eq!(
            (wc[0].wr_id, wc[0].opcode, wc[0].status),
            (0x1004, RDD_WC_OP_RDMA_WRITE, 0)
        );
        assert_eq!((wc[1].wr_id, wc[1].opcode), (77, RDD_WC_OP_RECV));
        assert_eq!((wc[1].imm_data, wc[1].byte_len), (0x1234_5678, 5));
        assert_eq!(wc[1].wc_flags, RDD_WC_FLAG_WITH_IMM);
        assert_eq!(f.dbrec_cq_ci(), 2);

        // Handles are not interchangeable, NULLs are caught.
        let sq_as_rq = (&mut *sq as *mut rdd_mlx5_sq_storage).cast::<rdd_mlx5_rq_storage>();
        assert_eq!(
            rdd_mlx5_cq_poll(&mut *cq, &mut *sq, sq_as_rq, wc.as_mut_ptr(), 4, &mut count),
            rdd_status::InvalidHandle
        );
        assert_eq!(
            rdd_mlx5_cq_poll(&mut *cq, &mut *sq, &mut *rq, ptr::null_mut(), 4, &mut count),
            rdd_status::NullParameter
        );
        assert_eq!(rdd_mlx5_cq_arm(&mut *cq, 2), rdd_status::InvalidArgument);
        assert_eq!(
            rdd_mlx5_cq_arm(&mut *cq, RDD_MLX5_CQ_ARM_SOLICITED),
            rdd_status::Ok
        );
        assert_eq!(rdd_mlx5_cq_event_consumed(&mut *cq), rdd_status::Ok);

        // A moved (copied) handle is rejected.
        let mut copy = zeroed::<rdd_mlx5_cq_storage>();
        ptr::copy_nonoverlapping(&*cq, &mut *copy, 1);
        assert_eq!(rdd_mlx5_cq_arm(&mut *copy, 0), rdd_status::InvalidHandle);

        // Fini, then every use fails.
        assert_eq!(rdd_mlx5_sq_fini(&mut *sq), rdd_status::Ok);
        assert!(sq._opaque.iter().all(|&b| b == 0));
        assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::InvalidHandle);
        assert_eq!(rdd_mlx5_sq_fini(&mut *sq), rdd_status::InvalidHandle);
        assert_eq!(rdd_mlx5_rq_fini(&mut *rq), rdd_status::Ok);
        assert_eq!(rdd_mlx5_cq_fini(&mut *cq), rdd_status::Ok);
        assert_eq!(rdd_mlx5_cq_fini(ptr::null_mut()), rdd_status::NullParameter);
    }
}
