//! The completion-queue calls: init, fini, poll (through a one-QP route),
//! arm, event consumed.

use core::slice;

use super::check_array;
use super::desc::{rdd_mlx5dv_cq, RDD_MLX5_CQ_ARM_SOLICITED};
use super::storage::{
    cq_binding, rdd_mlx5_cq_storage, rdd_mlx5_rq_storage, rdd_mlx5_sq_storage, CqBinding,
};
use super::wc::rdd_wc;
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::provider::mlx5::{CompletionQueue, CqRoute, QpQueues, RecvQueue, SendQueue, Wc};

// ---------------------------------------------------------------------
// Completion queue
// ---------------------------------------------------------------------

/// The route of a CQ that serves one QP, borrowing its two queues.
pub(super) struct SingleQp<'q> {
    pub(super) sq: &'q mut SendQueue,
    pub(super) rq: &'q mut RecvQueue,
}

impl CqRoute for SingleQp<'_> {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        if qpn == self.sq.qpn() {
            Some(QpQueues {
                sq: &mut *self.sq,
                rq: &mut *self.rq,
            })
        } else {
            None
        }
    }
}

/// Initialises a completion-queue handle in `cq` over the CQ `dv`
/// describes, with consumer index 0 (a CQ that nothing has polled yet;
/// its entries must be in their creation state: opcode INVALID, owner 0)
/// and no queues bound (`rdd_mlx5_cq_bind`). Same storage and error rules
/// as `rdd_mlx5_sq_init`.
///
/// # Safety
/// `cq` is valid for writes of one `rdd_mlx5_cq_storage`; `dv` is valid
/// for reads. The CQ buffer, its doorbell record and (if not NULL) the UAR
/// page stay valid, and the record is written by no one else, until
/// `rdd_mlx5_cq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_init(
    cq: *mut rdd_mlx5_cq_storage,
    dv: *const rdd_mlx5dv_cq,
) -> rdd_status {
    ffi_boundary!({
        non_null!(cq, dv);
        // SAFETY: non-NULL and readable (caller contract).
        let dv = unsafe { dv.read_unaligned() };
        // SAFETY: the memory contract is the caller's (see `# Safety`).
        let queue = match unsafe { CompletionQueue::from_raw(&dv.to_core()) } {
            Ok(q) => q,
            Err(e) => return e.into(),
        };
        // SAFETY: `cq` is non-NULL and valid for writes (caller contract).
        try_status!(unsafe { handle::install(cq, queue) });
        // SAFETY: `cq` is non-NULL, aligned (`install` checked) and valid
        // for writes; the binding lies after the handle's slot.
        unsafe { cq_binding(cq).write(CqBinding::none()) };
        rdd_status::Ok
    })
}

/// Finalises a completion-queue handle (see `rdd_mlx5_sq_fini`); this
/// also releases the queues bound to it (`rdd_mlx5_cq_bind`).
///
/// # Safety
/// `cq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_cq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_fini(cq: *mut rdd_mlx5_cq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(cq) });
        rdd_status::Ok
    })
}

/// Polls up to `n` completions of the QP whose queues are `sq` and `rq`
/// into `out[0..n]`, then updates the CQ's consumer-index record.
///
/// On `RDD_STATUS_OK`, `*out_count` (0..n) entries of `out` were written.
/// CQEs of other QP numbers are consumed and skipped (stale entries of a
/// destroyed QP); unsignaled send WQEs retire without an entry.
/// On `CQE_CORRUPT` (the first CQE was inconsistent; it was consumed) and
/// `CQE_COMPRESSED` (the CQ uses compression, unsupported; nothing
/// consumed) neither `out` nor `*out_count` is written; a corrupt CQE after
/// good ones is left for the next call, so no completion is lost.
///
/// # Safety
/// - `cq`, `sq`, `rq` as for their `_fini`; all three are used by this
///   call and must not be in use by another thread.
/// - `out` is valid for writes of `n` `rdd_wc`; `out_count` for a write.
/// - Scatter-to-CQE data is copied into the buffers of the completed
///   requests, which must still be valid (the posting contract).
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_poll(
    cq: *mut rdd_mlx5_cq_storage,
    sq: *mut rdd_mlx5_sq_storage,
    rq: *mut rdd_mlx5_rq_storage,
    out: *mut rdd_wc,
    n: usize,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        // SAFETY: caller contract on the three handles. They are distinct
        // objects: each storage kind has its own tag, so no two of these
        // references can alias.
        let (cq, sq, rq) = unsafe {
            (
                try_status!(handle::get(cq)),
                try_status!(handle::get(sq)),
                try_status!(handle::get(rq)),
            )
        };
        try_status!(check_array(out.cast_const(), n));
        // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
        // (checked / caller contract); `rdd_wc` has the layout of `Wc`
        // (asserted) and every bit pattern is a valid `Wc` (integers only).
        let out_wc = unsafe { slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let mut route = SingleQp { sq, rq };
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

/// Arms the CQ: requests an event for the next completion, or with
/// `RDD_MLX5_CQ_ARM_SOLICITED` the next solicited one. Fails with
/// `INVALID_GEOMETRY` if the CQ was initialised without a UAR page, and
/// `INVALID_ARGUMENT` for unknown flag bits.
///
/// # Safety
/// As for `rdd_mlx5_cq_fini`; the UAR page given at init is still mapped.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_arm(cq: *mut rdd_mlx5_cq_storage, flags: u32) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let cq = try_status!(unsafe { handle::get(cq) });
        if flags & !RDD_MLX5_CQ_ARM_SOLICITED != 0 {
            return rdd_status::InvalidArgument;
        }
        match cq.arm(flags & RDD_MLX5_CQ_ARM_SOLICITED != 0) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}

/// Records that a completion event of this CQ was consumed (after
/// `ibv_get_cq_event`), so the next `rdd_mlx5_cq_arm` uses the next arm
/// sequence number.
///
/// # Safety
/// As for `rdd_mlx5_cq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_event_consumed(cq: *mut rdd_mlx5_cq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let cq = try_status!(unsafe { handle::get(cq) });
        cq.event_consumed();
        rdd_status::Ok
    })
}
