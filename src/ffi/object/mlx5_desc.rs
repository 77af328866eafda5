//! The raw-queue level over object-level queues: `rdd_qp_mlx5_desc` and
//! `rdd_cq_mlx5_desc` hand out the mlx5 queue descriptors of a QP or CQ
//! the library created, so that `rdd_mlx5_*` drives a software-device QP
//! exactly as it drives a ConnectX queue described by `mlx5dv_init_obj`
//! (docs/c-api-raw.md, "The raw-queue level on object-level queues").
//!
//! Who owns what after the hand-over: the raw handles the caller builds
//! over the descriptors own the queue counters (the SQ producer, the RQ
//! head, the CQ consumer index) from then on. The object level's own
//! copies of those counters stay where they were, so its post, per-opcode
//! post, ring, poll, wait and recover calls must not be used on that QP
//! or CQ any more; its control calls still are (connect, query, destroy).
//! Nothing checks this on the data path: the object level's post and poll
//! stay as they are (no flag to test per call).
//! The hand-over is refused unless the object level's queues are still in
//! their reset state, because the raw handles start from zero counters.

use crate::ffi::mlx5::{rdd_mlx5dv_cq, rdd_mlx5dv_qp, rdd_qp_caps};
use crate::ffi::status::rdd_status;

use super::objects::{CqImpl, CqObj, QpImpl, QpObj};
use super::table::excl;
use super::types::{rdd_cq, rdd_qp};
use super::{h, put};

/// The mlx5 queue descriptor of an object-level QP, for the raw-queue
/// level: `*out_qp` as `mlx5dv_init_obj(MLX5DV_OBJ_QP)` would describe the
/// QP (`rdd_mlx5_sq_init`, `rdd_mlx5_rq_init`), `*out_caps` the
/// capabilities it was created with (`rdd_qp_query_caps`) and `*out_qpn`
/// its number (the `qpn` of `rdd_mlx5_sq_init`).
///
/// From then on the raw handles own the queues: post and poll them only
/// through `rdd_mlx5_*`, and no longer with the object level's post,
/// poll, wait or recover calls on this QP (its control calls, such as
/// `rdd_qp_connect`, `rdd_qp_query_*` and `rdd_qp_destroy`, stay usable;
/// connecting does not reset the counters). A QP that went to ERROR
/// stays there at the raw level: the C API's only way back to RESET,
/// `rdd_qp_recover`, drains through the object level's queues, so make a
/// new QP. Finalise the raw handles before `rdd_qp_destroy` frees the
/// queue memory. The queue memory is the device's: the software device
/// consumes it as a ConnectX NIC would.
///
/// The call uses the QP exclusively and writes the outputs only on
/// success. Statuses: `NULL_PARAMETER` (`qp` or an output NULL),
/// `INVALID_HANDLE` (`qp` is not a live QP), `RESOURCE_BUSY` (another
/// call is using the QP), `UNSUPPORTED` (the QP's backend has no mlx5
/// queues: the rxe/siw rings and the verbs fallback), `INVALID_QP_STATE`
/// (something was posted through the object level since the QP was
/// created or last reset: the raw handles, which start from zero
/// counters, would not match the device).
///
/// # Safety
/// `out_qp`, `out_caps` and `out_qpn` are valid for a write of one
/// `rdd_mlx5dv_qp`, `rdd_qp_caps` and `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_mlx5_desc(
    qp: *mut rdd_qp,
    out_qp: *mut rdd_mlx5dv_qp,
    out_caps: *mut rdd_qp_caps,
    out_qpn: *mut u32,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_qp);
        non_null!(out_caps);
        non_null!(out_qpn);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        let Some(dv) = q.mlx5_dv.as_ref().map(|d| d.0) else {
            return rdd_status::Unsupported;
        };
        let fresh = match q.q.get_mut() {
            QpImpl::Mlx5(m) => m.sq.producer() == 0 && m.rq.head() == 0,
            QpImpl::Driver(_) => return rdd_status::Unsupported,
        };
        if !fresh {
            return rdd_status::InvalidQpState;
        }
        let caps = rdd_qp_caps {
            max_send_sge: q.caps.max_send_sge,
            max_inline_data: q.caps.max_inline_data,
            max_recv_sge: q.caps.max_recv_sge,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe {
            put(out_qp, rdd_mlx5dv_qp::from(dv));
            put(out_caps, caps);
            put(out_qpn, q.qpn);
        }
        rdd_status::Ok
    })
}

/// The mlx5 queue descriptor of an object-level CQ, for the raw-queue
/// level: `*out` as `mlx5dv_init_obj(MLX5DV_OBJ_CQ)` would describe it
/// (`rdd_mlx5_cq_init`).
///
/// From then on the raw CQ handle owns the consumer index: poll and arm
/// the CQ only through `rdd_mlx5_cq_*`, and no longer with `rdd_cq_poll`,
/// `rdd_cq_poll_n`, `rdd_cq_wait`, `rdd_cq_arm` or `rdd_qp_recover` on a
/// QP of this CQ. Finalise the raw handle before `rdd_cq_destroy`.
///
/// The call uses the CQ exclusively and writes `*out` only on success.
/// Statuses: `NULL_PARAMETER` (`cq` or `out` NULL), `INVALID_HANDLE` (`cq` is not
/// a live CQ), `RESOURCE_BUSY` (another call is using the CQ, or the
/// object level has already consumed completions from it: the raw handle
/// starts at consumer index 0), `UNSUPPORTED` (the CQ's backend has no
/// mlx5 CQ: the rxe/siw rings and the verbs fallback).
///
/// # Safety
/// `out` is valid for a write of one `rdd_mlx5dv_cq`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_mlx5_desc(cq: *mut rdd_cq, out: *mut rdd_mlx5dv_cq) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        let Some(dv) = c.mlx5_dv.as_ref().map(|d| d.0) else {
            return rdd_status::Unsupported;
        };
        match c.cq.get_mut() {
            CqImpl::Mlx5(m) if m.consumer_index() != 0 => return rdd_status::ResourceBusy,
            CqImpl::Mlx5(_) => {}
            CqImpl::Driver(_) => return rdd_status::Unsupported,
        }
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, rdd_mlx5dv_cq::from(dv)) };
        rdd_status::Ok
    })
}
