//! The twins of `ud_srq_ops`: each side's memory, the C side's handles,
//! the core's route, and building both sides from the input's `cfg`.

use std::collections::HashSet;
use std::ptr::NonNull;

use rdma_direct::ffi::mlx5::*;
use rdma_direct::ffi::rdd_status;
use rdma_direct::provider::mlx5::cq::{CqRoute, QpQueues};
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct::QpCaps;

use super::{Twins, MAX_WQES, NWQES, QPN, SRQN, STRIDE};

/// One side: fake QP and CQ memory, SRQ memory.
pub(crate) struct Mem {
    pub(crate) f: FakeMlx5,
    pub(crate) buf: AlignedBuf,
    pub(crate) db: AlignedBuf,
    pub(crate) slots: Vec<SrqSlot>,
}

impl Mem {
    pub(crate) fn new(sq_bbs: u32) -> Mem {
        let mut f = FakeMlx5::new(FakeGeometry {
            sq_wqe_cnt: sq_bbs,
            rq_wqe_cnt: 1,
            rq_stride: 16,
            bf_size: 256,
            cqe_cnt: 16,
            cqe_size: 64,
            qpn: QPN,
            cqn: 1,
        });
        f.qp_buf.fill(0xa5);
        f.bf.fill(0x5a);
        let mut buf = AlignedBuf::new((MAX_WQES * STRIDE) as usize);
        buf.fill(0x3c);
        Mem {
            f,
            buf,
            db: AlignedBuf::new(64),
            slots: vec![SrqSlot::default(); NWQES as usize],
        }
    }

    pub(crate) fn srq_geometry(&self) -> SrqGeometry {
        SrqGeometry {
            buf: self.buf.ptr(),
            dbrec: self.db.ptr().cast(),
            stride: STRIDE,
            nwqes: NWQES,
            max: MAX_WQES,
            srqn: SRQN,
        }
    }

    pub(crate) fn same(&self, o: &Mem) -> bool {
        self.f.qp_buf.bytes() == o.f.qp_buf.bytes()
            && self.f.bf.bytes() == o.f.bf.bytes()
            && self.f.dbrec.bytes() == o.f.dbrec.bytes()
            && self.f.sq_wrid == o.f.sq_wrid
            && self.buf.bytes() == o.buf.bytes()
            && self.db.bytes() == o.db.bytes()
            && self.slots == o.slots
    }

    pub(crate) fn snapshot(&self) -> Vec<u8> {
        let mut v = self.f.qp_buf.bytes().to_vec();
        v.extend_from_slice(self.f.bf.bytes());
        v.extend_from_slice(self.f.dbrec.bytes());
        v.extend_from_slice(self.buf.bytes());
        v.extend_from_slice(self.db.bytes());
        v
    }
}

/// The C side's handles (boxed: a handle is bound to its address).
pub(crate) struct CHandles {
    pub(crate) sq: Box<rdd_mlx5_sq_storage>,
    pub(crate) cq: Box<rdd_mlx5_cq_storage>,
    pub(crate) srq: Box<rdd_mlx5_srq_storage>,
}

pub(crate) fn zeroed<T>() -> Box<T> {
    // SAFETY: used for the C storage types only, byte arrays valid for
    // any bit pattern.
    Box::new(unsafe { std::mem::zeroed() })
}

/// The core's route: one QP receiving through one SRQ (its own receive
/// queue is empty, so any other responder completion is corrupt).
pub(crate) struct Route<'a> {
    pub(crate) sq: &'a mut SendQueue,
    pub(crate) rq: &'a mut RecvQueue,
    pub(crate) srq: &'a mut Srq,
}

impl CqRoute for Route<'_> {
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        (qpn == QPN).then_some(QpQueues {
            sq: &mut *self.sq,
            rq: &mut *self.rq,
        })
    }
    fn srq_for(&mut self, qpn: u32, key: u32) -> Option<&mut Srq> {
        (qpn == QPN && key == SRQN).then_some(&mut *self.srq)
    }
}

/// The QP's own (empty) receive queue on the core side.
fn empty_rq(f: &mut FakeMlx5) -> RecvQueue {
    f.recv_queue(QpCaps {
        max_send_sge: 1,
        max_inline_data: 0,
        max_recv_sge: 1,
    })
    .expect("receive queue")
}

fn attrs() -> [rdd_mlx5_ah_attr; 3] {
    let ib = rdd_mlx5_ah_attr {
        link_layer: RDD_MLX5_LINK_IB,
        dlid: 0x17,
        sl: 3,
        ..Default::default()
    };
    let grh = rdd_mlx5_ah_attr {
        is_global: 1,
        dgid: [0xfe; 16],
        flow_label: 0x1234,
        hop_limit: 9,
        ..ib
    };
    let roce = rdd_mlx5_ah_attr {
        link_layer: RDD_MLX5_LINK_ROCE_V2,
        dmac: [2, 0, 0, 0, 0, 1],
        ..grh
    };
    [ib, grh, roce]
}

/// Both sides for `cfg`, or `None` when the caps do not fit the ring
/// (both sides must refuse it alike).
pub(crate) fn build(cfg: u8) -> Option<Twins> {
    let bbs = [8u32, 16, 32, 64][(cfg & 3) as usize];
    let caps = QpCaps {
        max_send_sge: 1 + ((cfg >> 2) & 3) as u32,
        max_inline_data: [0u32, 12, 28, 44, 60, 92, 124, 188][((cfg >> 4) & 7) as usize],
        max_recv_sge: 1,
    };
    let mut c = Mem::new(bbs);
    let mut k = Mem::new(bbs);
    let mut h = CHandles {
        sq: zeroed(),
        cq: zeroed(),
        srq: zeroed(),
    };
    let ccaps = rdd_qp_caps {
        max_send_sge: caps.max_send_sge,
        max_inline_data: caps.max_inline_data,
        max_recv_sge: 1,
    };
    let dvq: rdd_mlx5dv_qp = c.f.dv_qp().into();
    let dvc: rdd_mlx5dv_cq = c.f.dv_cq().into();
    let g = c.srq_geometry();
    let cg = rdd_mlx5_srq_geometry {
        buf: g.buf,
        dbrec: g.dbrec,
        stride: g.stride,
        nwqes: g.nwqes,
        max: g.max,
        srqn: g.srqn,
    };
    let n = c.f.sq_wrid.len();
    // SAFETY: the memory outlives the handles (both in `Twins`; handles
    // are plain values, finalised by dropping their boxes).
    let st = unsafe {
        (
            rdd_mlx5_sq_init_ud(
                &mut *h.sq,
                &dvq,
                QPN,
                &ccaps,
                0,
                c.f.sq_wrid.as_mut_ptr().cast(),
                n,
            ),
            rdd_mlx5_cq_init(&mut *h.cq, &dvc),
            rdd_mlx5_srq_init(
                &mut *h.srq,
                &cg,
                c.slots.as_mut_ptr().cast(),
                NWQES as usize,
            ),
        )
    };
    // A geometry too small for the caps is refused on both sides alike.
    let qp = k.f.dv_qp();
    let kn = k.f.sq_wrid.len();
    // SAFETY: as above for the core's queues.
    let sq = unsafe {
        SendQueue::from_raw_ud(
            &qp,
            QPN,
            caps,
            SqConfig::default(),
            NonNull::new(k.f.sq_wrid.as_mut_ptr()).expect("table"),
            kn,
        )
    };
    assert_eq!(
        st.0,
        sq.as_ref()
            .map_or_else(|e| rdd_status::from(*e), |_| rdd_status::Ok),
        "init"
    );
    assert_eq!((st.1, st.2), (rdd_status::Ok, rdd_status::Ok));
    let Ok(sq) = sq else {
        // SAFETY: live handles, finalised once.
        unsafe {
            let _ = rdd_mlx5_cq_fini(&mut *h.cq);
            let _ = rdd_mlx5_srq_fini(&mut *h.srq);
        }
        return None;
    };
    let kg = k.srq_geometry();
    // SAFETY: as above.
    let srq = unsafe {
        Srq::from_raw(
            &kg,
            NonNull::new(k.slots.as_mut_ptr()).expect("slots"),
            NWQES as usize,
        )
    }
    .expect("srq");
    let cq = k.f.completion_queue().expect("cq");
    let qp_rq = empty_rq(&mut k.f);
    let c_avs: Vec<rdd_mlx5_av> = attrs()
        .iter()
        .map(|a| {
            let mut out = rdd_mlx5_av { bytes: [0; 48] };
            // SAFETY: live locals.
            assert_eq!(unsafe { rdd_mlx5_av_make(a, &mut out) }, rdd_status::Ok);
            out
        })
        .collect();
    let k_avs: Vec<Mlx5Av> = c_avs
        .iter()
        .map(|a: &rdd_mlx5_av| {
            // SAFETY: 48 bytes of plain integers either way.
            unsafe { std::mem::transmute::<[u8; 48], Mlx5Av>(a.bytes) }
        })
        .collect();
    Some(Twins {
        c,
        k,
        h,
        sq,
        qp_rq,
        srq,
        cq,
        c_avs,
        k_avs,
        cqes: 0,
        next_id: 1,
        outstanding: HashSet::new(),
    })
}
