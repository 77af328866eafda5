//! Posting: send and receive work requests on the mlx5 core and on
//! provider-posted QPs, with the unguarded CQs' headroom check.

use std::sync::Arc;

use crate::completion::QpState;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_recv, parse_send, rdd_recv_wr, rdd_wr, NO_PIECES};

use super::objects::{CqBudget, QpImpl, QpObj};
use super::table::excl;
use super::types::rdd_qp;
use super::{check_array, h, put};

/// WRs handed to a provider-posted QP per call.
const DRIVER_CHUNK: usize = 16;

/// `rdd_qp_post_send` on a provider-posted QP: the WRs go to the provider
/// in chains of up to [`DRIVER_CHUNK`] (one doorbell per chain on rxe
/// and siw). Returns the stopping index and status on failure (the WRs
/// before it are posted), and the number of provider calls made.
///
/// # Safety
/// As `rdd_qp_post_send` for `wrs[0..n]` (checked non-NULL and aligned).
/// Posts one WR the library built (the memory-window operations of
/// `ffi::expose`) on QP handle `qp`, which must be in the protection
/// domain `pd_link` names and in RTS (`INVALID_QP_STATE` otherwise): with
/// the same CQ headroom check as `rdd_qp_post_send`. The mlx5 core has no
/// window WQEs: `UNSUPPORTED`.
pub(in crate::ffi) fn post_library_wr(
    qp: usize,
    pd_link: &Arc<()>,
    wr: &crate::wr::SendWr<'_>,
) -> Result<(), rdd_status> {
    let mut q = excl::<QpObj>(qp)?;
    if !Arc::ptr_eq(&q._pd_link, pd_link) {
        return Err(rdd_status::InvalidArgument);
    }
    let meter = q.send_budget.metered().then(|| Arc::clone(&q.send_budget));
    let (called, r) = match q.q.get_mut() {
        QpImpl::Driver(p) if p.state() != QpState::Rts => return Err(rdd_status::InvalidQpState),
        QpImpl::Driver(p) => {
            post_send_metered(&mut **p, core::slice::from_ref(wr), meter.as_deref(), false)
        }
        QpImpl::Mlx5(_) => return Err(rdd_status::Unsupported),
    };
    q.doorbells += u64::from(called);
    r.map_err(|(_, s)| s)
}

/// Hands `wrs` to a provider-posted QP in one call (with `defer`, to
/// `QpDriver::post_send_deferred`: no provider doorbell yet). With an
/// unguarded send CQ (`meter`), only the prefix whose completions fit its
/// headroom goes (the provider reports every completion it is asked for,
/// so no spare entry is kept, as in `api::Qp::post_send`), and the first
/// WR left out is `CQ_FULL`. Returns whether the provider was called, and
/// the index and status of the first WR not posted.
pub(super) fn post_send_metered(
    p: &mut dyn crate::api::QpDriver,
    wrs: &[crate::wr::SendWr<'_>],
    meter: Option<&CqBudget>,
    defer: bool,
) -> (bool, Result<(), (usize, rdd_status)>) {
    let want = crate::api::signaled(wrs);
    let reserved = meter.map_or(0, |b| b.headroom.reserve(want));
    let mut post = wrs.len();
    let mut refused = None;
    if meter.is_some() && reserved < want {
        post = crate::api::fitting_prefix(wrs, 0, reserved);
        refused = Some(rdd_status::CqFull);
    }
    let r = if post == 0 {
        Ok(())
    } else if defer {
        p.post_send_deferred(&wrs[..post])
    } else {
        p.post_send(&wrs[..post])
    };
    let posted = match &r {
        Ok(()) => post,
        Err(e) => e.index,
    };
    if let Some(b) = meter {
        b.headroom
            .unreserve(reserved.saturating_sub(crate::api::signaled(&wrs[..posted])));
    }
    let r = match (r, refused) {
        (Err(e), _) => Err((e.index, e.error.into())),
        (Ok(()), Some(s)) => Err((post, s)),
        (Ok(()), None) => Ok(()),
    };
    (post > 0, r)
}

unsafe fn post_send_driver(
    p: &mut dyn crate::api::QpDriver,
    wrs: *const rdd_wr,
    n: usize,
    meter: Option<&CqBudget>,
) -> (Result<(), (usize, rdd_status)>, u64) {
    let mut done = 0usize;
    let mut calls = 0u64;
    while done < n {
        let mut pieces = [NO_PIECES; DRIVER_CHUNK];
        let blank =
            crate::wr::SendWr::new(0, crate::wr::SendOp::Send, &[], crate::wr::SendFlags::NONE);
        let mut chunk = [blank; DRIVER_CHUNK];
        let mut k = 0usize;
        let mut refused = None;
        for (slot, pc) in chunk.iter_mut().zip(pieces.iter_mut()) {
            if done + k == n {
                break;
            }
            // SAFETY: `done + k < n`, inside the caller's array.
            let wr = unsafe { &*wrs.add(done + k) };
            // SAFETY: the SGE and inline-payload contract is the caller's.
            match unsafe { parse_send(wr, pc) } {
                Ok(w) => {
                    *slot = w;
                    k += 1;
                }
                Err(s) => {
                    refused = Some(s);
                    break;
                }
            }
        }
        let (called, r) = post_send_metered(p, &chunk[..k], meter, false);
        calls += u64::from(called);
        if let Err((i, s)) = r {
            return (Err((done + i, s)), calls);
        }
        done += k;
        if let Some(s) = refused {
            return (Err((done, s)), calls);
        }
    }
    (Ok(()), calls)
}

/// `rdd_qp_post_recv` on a provider-posted QP, in chains.
///
/// # Safety
/// As `rdd_qp_post_recv` for `wrs[0..n]` (checked non-NULL and aligned).
unsafe fn post_recv_driver(
    p: &mut dyn crate::api::QpDriver,
    wrs: *const rdd_recv_wr,
    n: usize,
    meter: Option<&CqBudget>,
) -> Result<(), (usize, rdd_status)> {
    let mut done = 0usize;
    while done < n {
        let none: &[crate::wr::Sge] = &[];
        let mut chunk = [crate::wr::RecvWr {
            wr_id: 0,
            sges: none,
        }; DRIVER_CHUNK];
        let mut k = 0usize;
        let mut refused = None;
        while k < DRIVER_CHUNK && done + k < n {
            // SAFETY: `done + k < n`, inside the caller's array; the SGE
            // contract is the caller's.
            match unsafe { parse_recv(&*wrs.add(done + k)) } {
                Ok(w) => {
                    chunk[k] = w;
                    k += 1;
                }
                Err(s) => {
                    refused = Some(s);
                    break;
                }
            }
        }
        let mut post = k;
        let reserved = meter.map_or(0, |b| b.headroom.reserve(k as u64));
        if meter.is_some() && (reserved as usize) < k {
            post = reserved as usize;
            refused = Some(rdd_status::CqFull);
        }
        let r = if post > 0 {
            p.post_recv(&chunk[..post])
        } else {
            Ok(())
        };
        let posted = match &r {
            Ok(()) => post,
            Err(e) => e.index,
        };
        if let Some(b) = meter {
            b.headroom.unreserve(reserved.saturating_sub(posted as u64));
        }
        if let Err(e) = r {
            return Err((done + e.index, e.error.into()));
        }
        done += post;
        if let Some(s) = refused {
            return Err((done, s));
        }
    }
    Ok(())
}

/// Posts send work requests `wrs[0..n]` and rings the doorbell once for
/// the batch.
///
/// Every request is validated before anything of it is written. The call
/// stops at the first rejected request: the ones before it are posted
/// *and rung*, the rejected one and those after it are not, and its status
/// is returned (a work-request status, `SQ_FULL`, `INVALID_QP_STATE`, or
/// `INVALID_ARGUMENT`). `*out_bad_index` is written exactly when such a
/// status is returned: the index of the first request not posted (0 when
/// the `wrs` array itself is misaligned or too large). It is not written
/// on `OK`, `NULL_PARAMETER`, `INVALID_HANDLE` and `RESOURCE_BUSY`, which
/// post nothing.
///
/// # Safety
/// `wrs` points to `n` readable `rdd_wr`, each `sg_list` to `num_sge`
/// readable entries; for `RDD_SEND_INLINE` the entries' `addr`/`length`
/// are readable payload bytes (copied before return). Other SGEs name
/// memory of this device's MRs; the device checks them, so a wrong one
/// fails the request's completion and cannot corrupt memory.
/// `out_bad_index` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_post_send(
    qp: *mut rdd_qp,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        // An unguarded send CQ: count each signaled WR's completion, and
        // one for a CQE the signalling guard may add at the doorbell,
        // against its headroom (as `api::Qp::post_send`).
        let meter = q.send_budget.metered().then(|| Arc::clone(&q.send_budget));
        if let QpImpl::Driver(p) = q.q.get_mut() {
            // SAFETY: the caller's contract on `wrs` (checked above).
            let (r, mut calls) = unsafe { post_send_driver(&mut **p, wrs, n, meter.as_deref()) };
            // WRs deferred by the per-opcode calls went out with the first
            // chain (a driver publishes them ahead of it); when nothing
            // reached the provider they are rung here, so none is left
            // waiting. A failed ring leaves them pending for the next one.
            if p.deferred() != 0 {
                calls += u64::from(p.ring().unwrap_or(false));
            }
            q.doorbells += calls;
            return match r {
                Ok(()) => rdd_status::Ok,
                Err((i, status)) => {
                    // SAFETY: non-NULL (checked), writable (caller contract).
                    unsafe { put(out_bad_index, i) };
                    status
                }
            };
        }
        let mut reserved = match &meter {
            Some(b) => b.headroom.reserve(1),
            None => 0,
        };
        let spare = reserved != 0;
        let sq = match q.q.get_mut() {
            QpImpl::Mlx5(o) => &mut o.sq,
            QpImpl::Driver(_) => return rdd_status::InvalidHandle,
        };
        let forced = sq.forced_signals();
        let mut pieces = NO_PIECES;
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned and holds `n` readable
            // requests (checked / caller contract).
            let wr = unsafe { &*wrs.add(i) };
            // SAFETY: the SGE and inline-payload contract is the caller's.
            let posted = match unsafe { parse_send(wr, &mut pieces) } {
                Ok(swr) => match &meter {
                    Some(_) if reserved == 0 => Err(rdd_status::CqFull),
                    Some(b)
                        if swr.flags.contains(crate::wr::SendFlags::SIGNALED)
                            && b.headroom.reserve(1) == 0 =>
                    {
                        Err(rdd_status::CqFull)
                    }
                    _ => {
                        // SAFETY: SGEs only reach the device, which checks
                        // each against its registered regions before any
                        // access.
                        let r = unsafe { sq.post(&swr) }.map_err(rdd_status::from);
                        if meter.is_some()
                            && r.is_err()
                            && swr.flags.contains(crate::wr::SendFlags::SIGNALED)
                        {
                            reserved += 1; // returned below
                        }
                        r
                    }
                },
                Err(s) => Err(s),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_bad_index, i) };
                result = status;
                break;
            }
        }
        // WQEs deferred by the per-opcode calls (`RDD_SEND_DEFER_DOORBELL`)
        // are rung too; on an unguarded CQ only with the spare entry in hand.
        if sq.pending() != 0 && (meter.is_none() || spare) {
            sq.ring();
            q.doorbells += 1;
        }
        if let Some(b) = &meter {
            // The guard's spare entry, unless the doorbell used it, and a
            // refused signaled WR's.
            let now = match q.q.get_mut() {
                QpImpl::Mlx5(o) => o.sq.forced_signals(),
                QpImpl::Driver(_) => forced,
            };
            let used = u64::from(now.wrapping_sub(forced));
            b.headroom.unreserve(reserved.saturating_sub(used));
        }
        result
    })
}

/// Posts receive work requests `wrs[0..n]` and publishes them to the
/// device once. Same stopping rule and `*out_bad_index` contract as
/// `rdd_qp_post_send` (`RQ_FULL` when the receive queue is full). A QP
/// created on an SRQ (`rdd_qp_create_on_srq`) has no receive queue: the
/// call is `INVALID_ATTRIBUTE`, posts nothing and leaves
/// `*out_bad_index` unwritten (post to the SRQ instead).
///
/// # Safety
/// `wrs` points to `n` readable `rdd_recv_wr`, each `sg_list` to `num_sge`
/// readable entries naming memory of this device's MRs (checked by the
/// device). `out_bad_index` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_post_recv(
    qp: *mut rdd_qp,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        if q.srq.is_some() {
            // Its receives go to the SRQ; nothing is posted or written.
            return rdd_status::InvalidAttribute;
        }
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        // An unguarded receive CQ: one completion per receive.
        let meter = q.recv_budget.metered().then(|| Arc::clone(&q.recv_budget));
        let rq = match q.q.get_mut() {
            QpImpl::Mlx5(o) => &mut o.rq,
            QpImpl::Driver(p) => {
                // SAFETY: the caller's contract on `wrs` (checked above).
                return match unsafe { post_recv_driver(&mut **p, wrs, n, meter.as_deref()) } {
                    Ok(()) => rdd_status::Ok,
                    Err((i, status)) => {
                        // SAFETY: non-NULL (checked), writable (caller
                        // contract).
                        unsafe { put(out_bad_index, i) };
                        status
                    }
                };
            }
        };
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned and holds `n` readable
            // requests (checked / caller contract).
            let wr = unsafe { &*wrs.add(i) };
            // SAFETY: the SGE contract is the caller's.
            let posted = match unsafe { parse_recv(wr) } {
                Ok(_) if meter.as_ref().is_some_and(|b| b.headroom.reserve(1) == 0) => {
                    Err(rdd_status::CqFull)
                }
                Ok(rwr) => {
                    // SAFETY: as in `rdd_qp_post_send`.
                    let r = unsafe { rq.post(&rwr) }.map_err(rdd_status::from);
                    if let (Some(b), Err(_)) = (&meter, &r) {
                        b.headroom.unreserve(1);
                    }
                    r
                }
                Err(s) => Err(s),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_bad_index, i) };
                result = status;
                break;
            }
        }
        rq.ring();
        result
    })
}
