//! The poll-mode side: drain and post, poll and route, flush, and the
//! counters.

use core::sync::atomic::Ordering;

use crate::ffi::object::{h, put, shared};
use crate::ffi::status::rdd_status;

use super::calls::ServiceObj;
use super::types::{rdd_submit_counters, rdd_submit_service};

/// Drains up to `max_batch` descriptors from the submission ring and posts
/// them to the service's QP as RDMA WRITEs with one `rdd_qp_post_send`
/// call: one doorbell for the batch. The batch's last WR (and any
/// descriptor with `RDD_SEND_SIGNALED`) asks for a completion; the ones
/// before it complete with it. `*out_posted` is the number of WRs posted
/// (0 when nothing was queued, or no room was left).
///
/// Posting stops at `max_outstanding` WRs in flight on the QP, and when
/// the QP's send queue (or an unguarded CQ) is full: what was drained and
/// not posted stays held inside the service, in order, and goes first in
/// the next drain (`qp_full` and `held` in the counters). A QP in ERROR
/// (after an error completion) still takes posts, and the device
/// completes them with `RDD_WC_WR_FLUSH_ERR`.
///
/// Call it from the poll-mode thread only. Errors (`*out_posted`
/// unwritten): `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY`
/// (another poll-mode call is running on this service, or another thread
/// is using its QP), `NO_SUCH_OBJECT` (the QP was destroyed: see
/// `rdd_submit_flush`), `INVALID_QP_STATE` (the QP is not connected yet).
/// Drained descriptors stay held on every error. A drain that has nothing
/// to post (or no room) does not touch the QP, so it reports neither of
/// the last two.
///
/// # Safety
/// `out_posted` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_drain(
    svc: *mut rdd_submit_service,
    out_posted: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_posted);
        let s = try_status!(shared::<ServiceObj>(h(svc)));
        let mut g = try_status!(s.core.claim_poller());
        let n = try_status!(g.drain());
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_posted, n) };
        rdd_status::Ok
    })
}

/// Polls the service's CQ once (up to `RDD_SUBMIT_POLL_BATCH` CQEs) and
/// hands every descriptor they complete to its submitter's completion
/// ring; `*out_completed` is how many descriptors were completed. One CQE
/// completes every WR up to its own (RC completes in order): the
/// unsignaled ones before it succeeded, unless the QP had already failed,
/// in which case they are `RDD_WC_WR_FLUSH_ERR`. Completions that are not
/// the service's (a receive, a WR it did not post) are skipped.
///
/// Call it from the poll-mode thread only. Errors (`*out_completed`
/// unwritten): `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY`
/// (another poll-mode call is running on this service, or another thread
/// is using its QP or CQ), `NO_SUCH_OBJECT` (the QP was destroyed: see
/// `rdd_submit_flush`), `INVALID_ARGUMENT` (another QP was created on the
/// CQ), `CQE_CORRUPT`.
///
/// # Safety
/// `out_completed` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_complete(
    svc: *mut rdd_submit_service,
    out_completed: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_completed);
        let s = try_status!(shared::<ServiceObj>(h(svc)));
        let mut g = try_status!(s.core.claim_poller());
        let n = try_status!(g.complete());
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_completed, n) };
        rdd_status::Ok
    })
}

/// For a service whose QP was destroyed first: completes every descriptor
/// the service still holds (posted and not completed, drained and not
/// posted, queued in the ring) with `RDD_WC_WR_FLUSH_ERR`;
/// `*out_flushed` is how many. After `rdd_qp_destroy` returns the device
/// touches none of their buffers, so they are safe to reuse once reaped;
/// the submitters then reap, unregister, and the service can be
/// destroyed. Descriptors submitted later are flushed by the next call
/// (`rdd_submit_drain` reports `NO_SUCH_OBJECT` from now on).
///
/// Call it from the poll-mode thread only. Errors (`*out_flushed`
/// unwritten, nothing flushed): `NULL_PARAMETER`, `INVALID_HANDLE`,
/// `RESOURCE_BUSY` (the QP still exists, or another poll-mode call is
/// running on this service).
///
/// # Safety
/// `out_flushed` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_flush(
    svc: *mut rdd_submit_service,
    out_flushed: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_flushed);
        let s = try_status!(shared::<ServiceObj>(h(svc)));
        let mut g = try_status!(s.core.claim_poller());
        let n = try_status!(g.flush());
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_flushed, n) };
        rdd_status::Ok
    })
}

/// The service's per-stage counters (see `rdd_submit_counters`), from any
/// thread, at any time: a relaxed snapshot that never waits for the
/// threads that update them.
///
/// Errors: `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (the
/// service is being destroyed).
///
/// # Safety
/// `out` is valid for a write of one `rdd_submit_counters`.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_stats(
    svc: *const rdd_submit_service,
    out: *mut rdd_submit_counters,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let s = try_status!(shared::<ServiceObj>(h(svc)));
        let core = &s.core;
        // Relaxed (every load): statistics, guarding no data.
        let ld = |a: &core::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let mut c = rdd_submit_counters::default();
        for st in core.sub_stats.iter() {
            c.submitted = c.submitted.wrapping_add(ld(&st.submitted));
            c.refused_ring_full = c.refused_ring_full.wrapping_add(ld(&st.ring_full));
            c.refused_no_credit = c.refused_no_credit.wrapping_add(ld(&st.no_credit));
            c.reaped = c.reaped.wrapping_add(ld(&st.reaped));
        }
        let p = &core.poll_stats;
        c.drained = ld(&p.drained);
        c.posted = ld(&p.posted);
        c.doorbells = ld(&p.doorbells);
        c.qp_full = ld(&p.qp_full);
        c.completed = ld(&p.completed);
        c.failed = ld(&p.failed);
        c.flushed = ld(&p.flushed);
        c.held = ld(&p.held);
        c.queued = core.svc().queued() as u64;
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, c) };
        rdd_status::Ok
    })
}
