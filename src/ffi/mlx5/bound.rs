//! One-handle polls: the SQ and RQ handles bound to a CQ handle once
//! (`rdd_mlx5_cq_bind`), then `rdd_mlx5_cq_poll_bound` with the CQ alone,
//! returning the count directly.
//!
//! # What a bound queue's finalisation does
//!
//! The binding records the two storage addresses in the CQ storage, with
//! the magic word each holds while live ([`CqBinding`]). Each bound poll
//! checks the CQ handle in full, then checks the magic word of both bound
//! storages again (one load and one compare with the recorded word each;
//! their NULL and alignment checks were done at bind time and cannot
//! change). A bound queue that was finalised (its storage is zeroed) or
//! re-initialised as another kind of handle is therefore refused with
//! `INVALID_HANDLE`, and one re-initialised as a queue of the same kind is
//! polled as that new queue: never undefined behaviour, provided the
//! storages stay allocated and in place while bound (the documented
//! contract).
//!
//! The alternative, refusing `_fini` of a bound queue with
//! `RESOURCE_BUSY`, would save those two compares per poll but needs a
//! bound count in the SQ/RQ storage that `_init` must keep: `_init` would
//! have to read storage it may legitimately receive uninitialised, and a
//! re-`_init` over a bound queue (allowed today) would reset the count and
//! let a later `_fini` leave the binding dangling. Letting `_fini` of a
//! bound queue unbind it from its CQs instead (the CQ's binding switched
//! to a sentinel, so a bound pointer is always live and the poll needs no
//! re-check) has the same flaw: the queue storage would have to name its
//! CQs, and that record could only be kept across a re-`_init` by trusting
//! storage `_init` may receive uninitialised (a stale image of an old
//! handle at a reused address would make a later `_fini` write into
//! memory that is no longer a CQ), nor cleared by a `rdd_mlx5_cq_init`
//! over a bound CQ, which cannot trust its old binding either; a CQ
//! storage freed while bound (not forbidden today) would be written by
//! the queue's `_fini`. The re-check is a few instructions (the
//! `abi_poll_bound_*` rows of `scripts/bench.sh`) and covers every misuse
//! short of freeing or moving the storage.

use core::mem::align_of;
use core::slice;

use super::check_array;
use super::cq::SingleQp;
use super::storage::{
    cq_binding, rdd_mlx5_cq_storage, rdd_mlx5_rq_storage, rdd_mlx5_sq_storage, CqBinding,
};
use super::wc::rdd_wc;
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::provider::mlx5::Wc;

/// A bound poll's error return: `-(int32_t)status`.
#[inline(always)]
const fn neg(s: rdd_status) -> i32 {
    // Statuses are below 2^31 (at most 2099), so the negation fits.
    -(s as u32 as i32)
}

/// Binds the send and receive queue handles of one QP to the CQ handle,
/// replacing any earlier binding, so that `rdd_mlx5_cq_poll_bound` needs
/// the CQ alone. The CQ keeps the two storage addresses: both storages
/// must stay allocated and in place (never freed, moved or copied) until
/// the binding ends, by `rdd_mlx5_cq_unbind`, another `rdd_mlx5_cq_bind`,
/// `rdd_mlx5_cq_init` or `rdd_mlx5_cq_fini` on the CQ. Finalising a bound
/// queue is allowed: later bound polls return `-RDD_STATUS_INVALID_HANDLE`
/// until it is initialised again (then they poll the new queue) or the CQ
/// is bound to other queues. One SQ/RQ pair may be bound to several CQs
/// (a QP whose send and receive CQs differ).
///
/// Statuses: `OK`; `NULL_PARAMETER` (any of the three NULL);
/// `INVALID_HANDLE` (any of the three not a live handle of its kind).
/// Nothing is changed on failure.
///
/// # Safety
/// `cq`, `sq`, `rq` as for their `_fini`; `sq` and `rq` stay valid for
/// reads and writes while bound, and are not used by another thread
/// during a bound poll (a bound poll uses all three, as
/// `rdd_mlx5_cq_poll` does).
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_bind(
    cq: *mut rdd_mlx5_cq_storage,
    sq: *mut rdd_mlx5_sq_storage,
    rq: *mut rdd_mlx5_rq_storage,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract on the three handles; each reference is
        // dropped before the next is made (only the checks matter here).
        unsafe {
            try_status!(handle::get(cq).map(|_| ()));
            try_status!(handle::get(sq).map(|_| ()));
            try_status!(handle::get(rq).map(|_| ()));
        }
        // SAFETY: `cq` is a live handle, so non-NULL and aligned; the
        // binding lies after the handle's slot.
        unsafe { cq_binding(cq).write(CqBinding::new(sq, rq)) };
        rdd_status::Ok
    })
}

/// Ends the CQ handle's binding (`rdd_mlx5_cq_bind`); the queues may then
/// be freed. Unbinding a CQ with nothing bound is allowed and does
/// nothing. Statuses: `OK`, `NULL_PARAMETER`, `INVALID_HANDLE`.
///
/// # Safety
/// As for `rdd_mlx5_cq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_unbind(cq: *mut rdd_mlx5_cq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::get(cq) }.map(|_| ()));
        // SAFETY: a live handle: non-NULL, aligned, binding after the slot.
        unsafe { cq_binding(cq).write(CqBinding::none()) };
        rdd_status::Ok
    })
}

/// Polls up to `n` completions of the QP bound to `cq` (`rdd_mlx5_cq_bind`)
/// into `out[0..n]`, then updates the CQ's consumer-index record: the
/// one-handle form of `rdd_mlx5_cq_poll`, with the same completion rules
/// (CQEs of other QP numbers are consumed and skipped, unsignaled send
/// WQEs retire without an entry, a corrupt CQE after good ones is left for
/// the next call).
///
/// Returns the number of entries written, 0..=`n` (0: the CQ is empty or
/// `n` is 0), or a negative value `-(int32_t)s` for the `rdd_status` `s`
/// of the failure, in which case nothing was written to `out`:
/// - `-RDD_STATUS_NULL_PARAMETER`: `cq` or `out` is NULL (`out` must be
///   non-NULL even when `n` is 0);
/// - `-RDD_STATUS_INVALID_HANDLE`: `cq` is not a live CQ handle, or a
///   bound queue's storage no longer holds a live handle of its kind
///   (finalised, or re-initialised as another kind);
/// - `-RDD_STATUS_INVALID_ARGUMENT`: `out` is not aligned for `rdd_wc`,
///   or `n` is above `INT32_MAX`;
/// - `-RDD_STATUS_NO_SUCH_OBJECT`: nothing is bound to `cq`;
/// - `-RDD_STATUS_CQE_CORRUPT`: the first CQE was inconsistent (it was
///   consumed);
/// - `-RDD_STATUS_CQE_COMPRESSED`: the CQ uses compression (unsupported;
///   nothing consumed);
/// - `-RDD_STATUS_PANIC`: a caught panic (unwinding builds only).
///
/// Only the CQ handle is checked in full; the bound queues' magic words
/// are checked again (two compares), so a finalised bound queue is an
/// error, never undefined behaviour.
///
/// # Safety
/// - `cq` as for `rdd_mlx5_cq_fini`; the bound storages are still
///   allocated and in place (the `rdd_mlx5_cq_bind` contract); the CQ and
///   the bound queues are not in use by another thread.
/// - `out` is valid for writes of `n` `rdd_wc`.
/// - Scatter-to-CQE data is copied into the buffers of the completed
///   requests, which must still be valid (the posting contract).
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_poll_bound(
    cq: *mut rdd_mlx5_cq_storage,
    out: *mut rdd_wc,
    n: u32,
) -> i32 {
    ffi_boundary!({
        if n == 1 {
            // SAFETY: caller contract.
            if let Some(k) = unsafe { poll_one_bound(cq, out) } {
                return k;
            }
        }
        // SAFETY: caller contract.
        unsafe { poll_bound_slow(cq, out, n) }
    })
}

/// The common one-entry case of [`rdd_mlx5_cq_poll_bound`] in
/// straight-line code, without the frame the loops need: `Some(k)` (0 or
/// 1, the call's result) when every check passed and the next entry was
/// a user-signaled successful requester CQE of the bound QP or none;
/// `None` with nothing changed otherwise, and then [`poll_bound_slow`]
/// makes every check again (they are cheap and pure) and handles the
/// entry, or names the failure.
///
/// # Safety
/// As for [`rdd_mlx5_cq_poll_bound`] with `n` = 1.
#[inline(always)]
unsafe fn poll_one_bound(cq: *mut rdd_mlx5_cq_storage, out: *mut rdd_wc) -> Option<i32> {
    // NULL and alignment of both pointers first; each failure is the slow
    // path's to name.
    // One test for both alignments: the CQ storage is 16-aligned exactly
    // when its address's low 4 bits are 0, and `out` (8-aligned) exactly
    // when bits 1..3 of twice its address are; OR-ed, the low 4 bits are
    // 0 exactly when both are aligned.
    const { assert!(align_of::<rdd_mlx5_cq_storage>() == 16 && align_of::<rdd_wc>() == 8) };
    let low = ((out as usize) << 1 | cq as usize) as u8 & 15;
    if cq.is_null() || out.is_null() || low != 0 {
        return None;
    }
    // SAFETY: non-NULL and aligned (checked), readable (caller contract).
    let queue = unsafe { handle::get_again(cq) }.ok()?;
    // SAFETY: `cq` is a live handle (non-NULL, aligned); the binding lies
    // after the handle's slot, apart from `queue`'s bytes.
    let b = unsafe { &*cq_binding(cq) };
    // Both bound handles are checked (a finalised one is refused by the
    // slow path, as for any `n`); only the send queue is used here: the
    // fast path takes requester entries alone. An unbound CQ names the
    // sentinels, whose magic words never match, so no NULL test is needed
    // first.
    // SAFETY: `b` is the binding of a live CQ handle: the storages bound
    // with `rdd_mlx5_cq_bind` (still allocated and in place: caller
    // contract) or the sentinels.
    if !unsafe { b.both_live() } {
        return None;
    }
    // SAFETY: the magic word of `b.sq` is live (just checked); the
    // reference is the only one into the SQ storage, which is not the
    // CQ's (its magic word is an SQ's).
    let sq = unsafe { handle::value_checked_by_caller(b.sq) };
    // SAFETY: `out` is non-NULL and aligned (checked) and valid for one
    // write (caller contract); `rdd_wc` has the layout of `Wc` (asserted)
    // and every bit pattern is a valid `Wc`.
    let w = unsafe { &mut *out.cast::<Wc>() };
    let k = queue.poll_one_fast(|qpn| (sq.qpn() == qpn).then_some(sq), w)?;
    // k <= 1.
    Some(k as i32)
}

/// Everything [`rdd_mlx5_cq_poll_bound`] does, for the cases its inline
/// one-entry path leaves: any `n` but 1, a refused argument, an entry
/// other than a user-signaled successful requester CQE.
///
/// # Safety
/// As for [`rdd_mlx5_cq_poll_bound`].
#[cold]
#[inline(never)]
unsafe fn poll_bound_slow(cq: *mut rdd_mlx5_cq_storage, out: *mut rdd_wc, n: u32) -> i32 {
    // SAFETY: caller contract.
    let queue = match unsafe { handle::get(cq) } {
        Ok(q) => q,
        Err(s) => return neg(s),
    };
    if n > i32::MAX as u32 {
        return neg(rdd_status::InvalidArgument);
    }
    if let Err(s) = check_array(out.cast_const(), n as usize) {
        return neg(s);
    }
    // SAFETY: `cq` is a live handle (non-NULL, aligned); the binding
    // lies after the handle's slot, apart from `queue`'s bytes.
    let b = unsafe { cq_binding(cq).read() };
    if b.is_none() {
        return neg(rdd_status::NoSuchObject);
    }
    // SAFETY: `rdd_mlx5_cq_bind` checked both pointers (non-NULL,
    // aligned) and they stay valid while bound (caller contract). The
    // three references do not alias: each storage holds the magic word
    // of its own kind (just checked), so they are distinct objects.
    let (sq, rq) = unsafe {
        match (handle::get_again(b.sq), handle::get_again(b.rq)) {
            (Ok(sq), Ok(rq)) => (sq, rq),
            _ => return neg(rdd_status::InvalidHandle),
        }
    };
    let mut route = SingleQp { sq, rq };
    // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
    // (checked / caller contract); `rdd_wc` has the layout of `Wc`
    // (asserted) and every bit pattern is a valid `Wc`.
    let all = unsafe { slice::from_raw_parts_mut(out.cast::<Wc>(), n as usize) };
    match queue.poll(&mut route, all) {
        // count <= n <= i32::MAX.
        Ok(count) => count as i32,
        Err(e) => neg(e.into()),
    }
}
