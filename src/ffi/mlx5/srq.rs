//! Shared receive queues at the raw-queue level: the handle over an mlx5
//! SRQ's memory, its receive posts, and the poll of a CQ whose QP
//! receives through it (docs/spec/mlx5.md §11).

use core::mem::{align_of, size_of};
use core::ptr::NonNull;
use core::slice;

use static_assertions::{const_assert, const_assert_eq};

use super::check_array;
use super::cq::SingleQp;
use super::rq::post_recv_each;
use super::storage::{rdd_mlx5_cq_storage, rdd_mlx5_rq_storage, rdd_mlx5_sq_storage};
use super::wc::rdd_wc;
use crate::ffi::handle::{self, HandleStorage, Slot};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{rdd_recv_wr, RDD_SEND_DEFER_DOORBELL};
use crate::provider::mlx5::cq::{CqRoute, QpQueues};
use crate::provider::mlx5::rq::AbsentRq;
use crate::provider::mlx5::{RecvQueue, Srq, SrqGeometry, SrqSlot, Wc};
use crate::wr::{RecvWr, Sge};

/// Size in bytes of `rdd_mlx5_srq_storage`.
pub const RDD_MLX5_SRQ_STORAGE_SIZE: usize = 128;
/// Alignment in bytes of `rdd_mlx5_srq_storage`.
pub const RDD_MLX5_SRQ_STORAGE_ALIGN: usize = 16;

/// Caller-provided storage for an SRQ handle (the rules of
/// `rdd_mlx5_sq_storage`: zero it, initialise it with
/// `rdd_mlx5_srq_init`, never copy or move it, end with
/// `rdd_mlx5_srq_fini`).
#[repr(C, align(16))]
pub struct rdd_mlx5_srq_storage {
    _opaque: [u8; RDD_MLX5_SRQ_STORAGE_SIZE],
}

const_assert_eq!(size_of::<rdd_mlx5_srq_storage>(), RDD_MLX5_SRQ_STORAGE_SIZE);
const_assert_eq!(
    align_of::<rdd_mlx5_srq_storage>(),
    RDD_MLX5_SRQ_STORAGE_ALIGN
);
const_assert!(size_of::<Slot<Srq>>() <= RDD_MLX5_SRQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<Srq>>() <= RDD_MLX5_SRQ_STORAGE_ALIGN);

// SAFETY: size and alignment are asserted above; the storage is a byte
// array; the tag is distinct from the other storages'.
unsafe impl HandleStorage for rdd_mlx5_srq_storage {
    type Value = Srq;
    const TAG: u64 = 0x4d35_5352; // "M5SR"
}

/// One entry of an SRQ's side table (one per WQE of its free list):
/// caller-provided memory the handle writes at post time and reads at
/// completion time. Its content is private.
#[repr(C)]
pub struct rdd_mlx5_srq_slot {
    _opaque: [u64; 2],
}

const_assert_eq!(size_of::<rdd_mlx5_srq_slot>(), size_of::<SrqSlot>());
const_assert!(align_of::<rdd_mlx5_srq_slot>() >= align_of::<SrqSlot>());

/// The memory of an mlx5 SRQ. From `mlx5dv_init_obj(MLX5DV_OBJ_SRQ)` on a
/// new SRQ: `buf`, `dbrec`, `stride` and `srqn` as given, `nwqes` =
/// `tail + 1` (libmlx5 starts with `head` 0 and `tail` the last WQE of
/// the list), and `max` the WQEs the buffer holds (`nwqes` when unknown:
/// the page-fault wait queue past the list is then left alone).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_mlx5_srq_geometry {
    /// The WQE buffer: `max * stride` bytes, 16-byte aligned.
    pub buf: *mut u8,
    /// The SRQ's doorbell-record word (big-endian count of posted WQEs).
    pub dbrec: *mut u32,
    /// Bytes per WQE: a power of two, at least 32 (16 of next-WQE segment,
    /// then `(stride - 16) / 16` data segments).
    pub stride: u32,
    /// WQEs in the free list: a power of two, at least 2.
    pub nwqes: u32,
    /// WQEs in the buffer, at least `nwqes`.
    pub max: u32,
    /// SRQ number (what a version-0 CQE carries for its receives).
    pub srqn: u32,
}

/// Initialises an SRQ handle in `srq` over the memory `geo` describes,
/// with a side table `slots[0..nslots]` of at least `geo->nwqes` entries.
/// The free list is linked as libmlx5 links a new SRQ (only the link words
/// of the WQEs are written). The SRQ must be unused (as after creation).
///
/// On failure the storage is not written. Errors: `NULL_PARAMETER`;
/// `INVALID_ARGUMENT` (misaligned `srq` or `slots`); `INVALID_GEOMETRY`
/// (stride, counts, NULL or misaligned buffer or record);
/// `STORAGE_TOO_SMALL` (`nslots < nwqes`).
///
/// # Safety
/// - `srq` is valid for writes of one `rdd_mlx5_srq_storage`; `geo` is
///   valid for reads (copied; no alignment needed).
/// - The WQE buffer, the doorbell record and `slots[0..nslots]` stay
///   valid and are written by no one else (the device only reads the
///   WQEs) until `rdd_mlx5_srq_fini`.
/// - Every SGE posted later names memory the device may write until the
///   receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_srq_init(
    srq: *mut rdd_mlx5_srq_storage,
    geo: *const rdd_mlx5_srq_geometry,
    slots: *mut rdd_mlx5_srq_slot,
    nslots: usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(srq, geo);
        try_status!(check_array(slots.cast_const(), nslots));
        // SAFETY: non-NULL and readable (caller contract).
        let g = unsafe { geo.read_unaligned() };
        let Some(slots) = NonNull::new(slots.cast::<SrqSlot>()) else {
            return rdd_status::NullParameter;
        };
        let core = SrqGeometry {
            buf: g.buf,
            dbrec: g.dbrec,
            stride: g.stride,
            nwqes: g.nwqes,
            max: g.max,
            srqn: g.srqn,
        };
        // SAFETY: the memory contract is the caller's (see `# Safety`);
        // `rdd_mlx5_srq_slot` has the size of `SrqSlot` and at least its
        // alignment (asserted), and the pointer is aligned (checked).
        let queue = match unsafe { Srq::from_raw(&core, slots, nslots) } {
            Ok(q) => q,
            Err(e) => return e.into(),
        };
        // SAFETY: `srq` is non-NULL and valid for writes (caller contract).
        try_status!(unsafe { handle::install(srq, queue) });
        rdd_status::Ok
    })
}

/// Finalises an SRQ handle: the storage is zeroed and any further use is
/// `INVALID_HANDLE`. Receives still posted stay in the SRQ (the SRQ itself
/// is the caller's to destroy).
///
/// # Safety
/// `srq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_srq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_srq_fini(srq: *mut rdd_mlx5_srq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(srq) });
        rdd_status::Ok
    })
}

/// Posts one receive of one buffer (`laddr`, `length`, `lkey`) to the SRQ
/// and, unless `flags` has `RDD_SEND_DEFER_DOORBELL`, publishes every
/// receive posted so far in the doorbell record (receives have no MMIO
/// doorbell). Any other flag bit is `INVALID_FLAGS`.
///
/// Errors (nothing is written): `NULL_PARAMETER` / `INVALID_HANDLE`;
/// `INVALID_FLAGS`; `TOO_MANY_SGES` when the SRQ's WQEs hold no data
/// segment; `LENGTH_TOO_LARGE`; `RQ_FULL` when every WQE of the list is
/// posted and not completed.
///
/// # Safety
/// `srq` as for `rdd_mlx5_srq_fini`; the buffer is memory the device may
/// write until the receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_srq_recv(
    srq: *mut rdd_mlx5_srq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { handle::get(srq) });
        if flags & !RDD_SEND_DEFER_DOORBELL != 0 {
            return rdd_status::InvalidFlags;
        }
        let sges = [Sge::new(laddr, length, lkey)];
        let wr = RecvWr { wr_id, sges: &sges };
        // SAFETY: caller contract on the buffer.
        if let Err(e) = unsafe { queue.post(&wr) } {
            return e.into();
        }
        if flags & RDD_SEND_DEFER_DOORBELL == 0 {
            queue.ring();
        }
        rdd_status::Ok
    })
}

/// Publishes the receives posted with `RDD_SEND_DEFER_DOORBELL` (a no-op
/// when there are none).
///
/// # Safety
/// As for `rdd_mlx5_srq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_srq_ring(srq: *mut rdd_mlx5_srq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { handle::get(srq) });
        queue.ring();
        rdd_status::Ok
    })
}

/// Posts the receives `wrs[0..n]` to the SRQ and publishes them in the
/// doorbell record, as `ibv_post_srq_recv`. Stops at the first rejected
/// one with the rules of `rdd_mlx5_rq_post` (those before it are posted
/// and published; `*out_bad_index` is written as there).
///
/// # Safety
/// `srq` as for `rdd_mlx5_srq_fini`; `wrs` points to `n` readable
/// `rdd_recv_wr` whose `sg_list`s point to `num_sge` readable entries
/// naming memory the device may write until the receive completes;
/// `out_bad_index` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_srq_post(
    srq: *mut rdd_mlx5_srq_storage,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        // SAFETY: caller contract on `srq`.
        let queue = try_status!(unsafe { handle::get(srq) });
        // SAFETY: `Srq::post`'s contract is the caller's (the SGEs name
        // memory the device may write until the receive completes).
        let post = |w: &RecvWr<'_>| unsafe { queue.post(w) };
        // SAFETY: caller contract.
        let result = match unsafe { post_recv_each(wrs, n, out_bad_index, post) } {
            Ok(st) => st,
            Err(st) => return st,
        };
        queue.ring();
        result
    })
}

/// The route of `rdd_mlx5_cq_poll_srq`: one QP whose responder
/// completions carrying `key` belong to `srq`.
struct SrqQp<'q> {
    qp: SingleQp<'q>,
    srq: &'q mut Srq,
    key: u32,
}

impl CqRoute for SrqQp<'_> {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.qp.route(qpn)
    }
    #[inline(always)]
    fn srq_for(&mut self, qpn: u32, srqn_uidx: u32) -> Option<&mut Srq> {
        (qpn == self.qp.sq.qpn() && srqn_uidx == self.key).then_some(&mut *self.srq)
    }
}

/// Polls up to `n` completions of the QP whose send queue is `sq` and
/// which receives through `srq`, as `rdd_mlx5_cq_poll` does for a QP with
/// its own receive queue. A responder completion (receive, or a receive
/// error) of this QP whose 24-bit SRQ field equals `srq_key` completes
/// the SRQ WQE its counter names, in any order; `srq_key` is the SRQ
/// number (`rdd_mlx5_srq_geometry.srqn`) on a CQ with CQE version 0, the
/// QP's user index with version 1 (docs/spec/mlx5.md §11). The counter is
/// device-written: one outside the list or naming a WQE that is not
/// posted is `CQE_CORRUPT` (the entry is consumed, as every corrupt entry
/// is, and the SRQ is unchanged).
///
/// `rq` may be NULL (a QP attached to an SRQ has no receive queue of its
/// own): a responder completion of the QP that is not the SRQ's is then
/// `CQE_CORRUPT`. Otherwise it is the QP's receive queue, for completions
/// that do not carry `srq_key`.
///
/// Errors and `*out_count` as for `rdd_mlx5_cq_poll`.
///
/// # Safety
/// As for `rdd_mlx5_cq_poll`, and `srq` is valid for reads and writes of
/// one `rdd_mlx5_srq_storage`, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_poll_srq(
    cq: *mut rdd_mlx5_cq_storage,
    sq: *mut rdd_mlx5_sq_storage,
    rq: *mut rdd_mlx5_rq_storage,
    srq: *mut rdd_mlx5_srq_storage,
    srq_key: u32,
    out: *mut rdd_wc,
    n: usize,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        // SAFETY: caller contract on the handles; each storage kind has
        // its own tag, so no two of these references can alias.
        let (cq, sq, srq) = unsafe {
            (
                try_status!(handle::get(cq)),
                try_status!(handle::get(sq)),
                try_status!(handle::get(srq)),
            )
        };
        // A QP without a receive queue: the empty stand-in over local
        // memory, which refuses every completion routed to it.
        let mut absent = AbsentRq::new();
        let mut none_rq;
        let rq: &mut RecvQueue = if rq.is_null() {
            // SAFETY: `absent` is a local that outlives the queue, which
            // only this call uses; nothing is posted to it, so the device
            // never sees it.
            none_rq = try_status!(unsafe { absent.queue() }.map_err(rdd_status::from));
            &mut none_rq
        } else {
            // SAFETY: caller contract; a distinct storage kind.
            try_status!(unsafe { handle::get(rq) })
        };
        try_status!(check_array(out.cast_const(), n));
        // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
        // (checked / caller contract); `rdd_wc` has the layout of `Wc`.
        let out_wc = unsafe { slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let mut route = SrqQp {
            qp: SingleQp { sq, rq },
            srq,
            key: srq_key & 0x00ff_ffff,
        };
        match cq.poll(&mut route, out_wc) {
            Ok(count) => {
                // SAFETY: non-NULL (checked), valid for a write (contract).
                unsafe { out_count.write_unaligned(count) };
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}
