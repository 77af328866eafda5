//! The twins of `raw_ops`: one fake QP + CQ with its handles, and the
//! snapshot a refused call's memory is compared with.

use rdma_direct::ffi::{
    rdd_mlx5_cq_fini, rdd_mlx5_cq_init, rdd_mlx5_cq_storage, rdd_mlx5_rq_fini, rdd_mlx5_rq_init,
    rdd_mlx5_rq_storage, rdd_mlx5_sq_fini, rdd_mlx5_sq_init, rdd_mlx5_sq_slot, rdd_mlx5_sq_storage,
    rdd_mlx5dv_cq, rdd_mlx5dv_qp, rdd_qp_caps, rdd_status,
};
use rdma_direct::provider::mlx5::WrSlot;
use rdma_direct::testutil::{FakeGeometry, FakeMlx5};
use rdma_direct_fuzz::pattern;

/// One fake QP + CQ and its three live handles (the CQ bound to the SQ and
/// RQ on the per-opcode side). The storages are held as raw pointers, as a
/// C caller holds them: a binding keeps the SQ and RQ pointers, which a
/// later `&mut` reborrow of a `Box` would invalidate.
pub(crate) struct Side {
    pub(crate) f: FakeMlx5,
    pub(crate) sq: *mut rdd_mlx5_sq_storage,
    pub(crate) rq: *mut rdd_mlx5_rq_storage,
    pub(crate) cq: *mut rdd_mlx5_cq_storage,
}

impl Side {
    pub(crate) fn new(geo: FakeGeometry, seed: u8) -> Side {
        let mut f = FakeMlx5::new(geo);
        pattern::fill(f.qp_buf.bytes_mut(), seed);
        pattern::fill(f.bf.bytes_mut(), seed ^ 0x5a);
        // SAFETY: the storages are byte arrays: all zeroes is valid.
        let (sq, rq, cq) = unsafe {
            (
                Box::into_raw(Box::<rdd_mlx5_sq_storage>::new_zeroed().assume_init()),
                Box::into_raw(Box::<rdd_mlx5_rq_storage>::new_zeroed().assume_init()),
                Box::into_raw(Box::<rdd_mlx5_cq_storage>::new_zeroed().assume_init()),
            )
        };
        Side { f, sq, rq, cq }
    }

    /// Initialises SQ and RQ (the CQ once, in `init_cq`).
    pub(crate) fn init_queues(
        &mut self,
        flags: u32,
        caps: &rdd_qp_caps,
    ) -> (rdd_status, rdd_status) {
        let dv: rdd_mlx5dv_qp = self.f.dv_qp().into();
        let n = self.f.sq_wrid.len();
        let wrid = self.f.sq_wrid.as_mut_ptr().cast::<rdd_mlx5_sq_slot>();
        let m = self.f.rq_wrid.len();
        let rwrid = self.f.rq_wrid.as_mut_ptr();
        // SAFETY: the storages are live Boxes; `dv` describes `self.f`'s
        // memory and the tables are its own (`rdd_mlx5_sq_slot` has the
        // layout of `WrSlot`); all outlive the handles (fini in Drop).
        unsafe {
            let _ = rdd_mlx5_sq_fini(self.sq);
            let _ = rdd_mlx5_rq_fini(self.rq);
            (
                rdd_mlx5_sq_init(self.sq, &dv, self.f.geo.qpn, caps, flags, wrid, n),
                rdd_mlx5_rq_init(self.rq, &dv, caps, rwrid, m),
            )
        }
    }

    pub(crate) fn init_cq(&mut self) {
        let dv: rdd_mlx5dv_cq = self.f.dv_cq().into();
        // SAFETY: as in `init_queues`.
        assert_eq!(unsafe { rdd_mlx5_cq_init(self.cq, &dv) }, rdd_status::Ok);
    }

    /// Copies everything but the RQ doorbell-record word, which a deferred
    /// receive leaves behind its twin's (checked on its own), into `s`,
    /// reusing its buffers.
    pub(crate) fn take(&self, s: &mut Snapshot) {
        copy_into(&mut s.qp, self.f.qp_buf.bytes());
        copy_into(&mut s.bf, self.f.bf.bytes());
        copy_into(&mut s.dbrec, &self.f.dbrec.bytes()[4..]);
        copy_into(&mut s.cq, self.f.cq_buf.bytes());
        copy_into(&mut s.sq, &self.f.sq_wrid);
        copy_into(&mut s.rq, &self.f.rq_wrid);
    }

    /// Whether this side's memory is what `s` holds (as [`Side::take`]
    /// copies it).
    pub(crate) fn matches(&self, s: &Snapshot) -> bool {
        self.f.qp_buf.bytes() == s.qp.as_slice()
            && self.f.bf.bytes() == s.bf.as_slice()
            && &self.f.dbrec.bytes()[4..] == s.dbrec.as_slice()
            && self.f.cq_buf.bytes() == s.cq.as_slice()
            && self.f.sq_wrid == s.sq
            && self.f.rq_wrid == s.rq
    }

    /// Whether both sides hold the same memory (as [`Side::take`] copies
    /// it), compared in place.
    pub(crate) fn same_as(&self, o: &Side) -> bool {
        self.f.qp_buf.bytes() == o.f.qp_buf.bytes()
            && self.f.bf.bytes() == o.f.bf.bytes()
            && self.f.dbrec.bytes()[4..] == o.f.dbrec.bytes()[4..]
            && self.f.cq_buf.bytes() == o.f.cq_buf.bytes()
            && self.f.sq_wrid == o.f.sq_wrid
            && self.f.rq_wrid == o.f.rq_wrid
    }
}

/// A copy of one side's memory, taken before a call that must change
/// nothing when it is refused. Its buffers are kept between calls, so a
/// check allocates nothing after the first (a fresh `Vec` per call was a
/// fifth of the target's time, in ASan's allocator).
#[derive(Default)]
pub(crate) struct Snapshot {
    qp: Vec<u8>,
    bf: Vec<u8>,
    dbrec: Vec<u8>,
    cq: Vec<u8>,
    sq: Vec<WrSlot>,
    rq: Vec<u64>,
}

fn copy_into<T: Copy>(v: &mut Vec<T>, from: &[T]) {
    v.clear();
    v.extend_from_slice(from);
}

impl Drop for Side {
    fn drop(&mut self) {
        // SAFETY: live (or zeroed) handles; fini of a zeroed one is an
        // error that touches nothing. The pointers came from
        // `Box::into_raw` and are not used after this.
        unsafe {
            let _ = rdd_mlx5_sq_fini(self.sq);
            let _ = rdd_mlx5_rq_fini(self.rq);
            let _ = rdd_mlx5_cq_fini(self.cq);
            drop(Box::from_raw(self.sq));
            drop(Box::from_raw(self.rq));
            drop(Box::from_raw(self.cq));
        }
    }
}
