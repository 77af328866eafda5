//! One-call QP recovery: drain to ERROR, reset, optionally reconnect.

use core::ffi::c_void;
use core::mem::{size_of, MaybeUninit};

use std::sync::Arc;
use std::time::Duration;

use static_assertions::const_assert_eq;

use crate::attr::QpModify;
use crate::completion::{QpState, Wc};
use crate::ffi::mlx5::rdd_wc;
use crate::ffi::status::rdd_status;

use super::cq::{poll_counted, poll_counted_srqs, QpList};
use super::objects::{CqObj, QpObj};
use super::qp::{
    checked_steps, connect_attr_or_default, connect_obj, failed_wr_c, modify_obj, rdd_failed_wr,
};
use super::table::{excl, Excl};
use super::types::{rdd_connect_attr, rdd_qp, rdd_qp_info};
use super::{h, put};

/// A completion callback for `rdd_qp_recover`: called once per completion
/// drained, with the `ctx` given to `rdd_qp_recover`. It must not call back
/// into this QP or its CQs (they are held busy) and must not unwind.
pub type rdd_wc_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, wc: *const rdd_wc)>;

/// What `rdd_qp_recover` found and did.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdd_recovery {
    /// Completions handed to the callback while draining.
    pub reported: u64,
    /// 1 if `failure` holds the first WR that failed, else 0.
    pub has_failure: u32,
    /// Written as 0.
    pub reserved: u32,
    /// The first failed WR as posted (valid if `has_failure`).
    pub failure: rdd_failed_wr,
}

const_assert_eq!(size_of::<rdd_recovery>(), 72);

/// One-call QP recovery (after an error completion or a fatal QP event).
///
/// Moves `qp` to ERROR (unless it is there), polls its CQ(s) until every
/// outstanding WR has completed, handing each completion to `on_wc`
/// exactly once (flushed WRs included, unsignaled ones too), then moves it
/// through RESET, which resynchronises the queue counters and the CQ
/// consumer state.
///
/// Recovery finishes whatever mix of signaled, unsignaled, executed and
/// outstanding work the QP holds: with send work outstanding it posts one
/// internal signaled *drain marker* after it once the QP is in ERROR (a
/// NOP on mlx5 and the software device; see docs/c-api.md for the other
/// devices), whose flush completion retires every earlier send, including
/// executed unsignaled ones, which have no completion of their own. The
/// marker is recognised by its position, never by its wr_id, and is not
/// passed to `on_wc` nor counted in `reported`. In step mode the device
/// must run for the marker to complete: a call that times out leaves the
/// marker posted, and a later call after `rdd_device_step` finishes
/// without posting another. With `peer` non-NULL it then reconnects (INIT → RTR →
/// RTS with `attr`, as `rdd_qp_connect`; the peer recovers its own QP the
/// same way and the two exchange fresh `rdd_qp_info`); with `peer` NULL the
/// QP is left in RESET. `peer` and `attr` are checked first, as
/// `rdd_qp_connect` checks them: a bad one is refused (`INVALID_ARGUMENT`,
/// `INVALID_ATTRIBUTE`) before anything is drained, and the QP is as it was.
///
/// The QP's CQs must serve only this QP (another QP's completions would be
/// consumed): otherwise `RESOURCE_BUSY`. A QP on an SRQ
/// (`rdd_qp_create_on_srq`) drains through its CQs' SRQs: only the
/// receives it had taken from the SRQ are flushed (reported to `on_wc`,
/// their WQEs back on the SRQ's free list), every other receive stays in
/// the SRQ; after the send work it takes the receive completions the CQs
/// hold before the reset. A UD QP is `UNSUPPORTED`, nothing changed.
/// Gives up with `TIMEOUT` after
/// `timeout_ns` nanoseconds of draining. `*out` (if non-NULL) receives the
/// count of completions reported and the first failed WR.
///
/// # Safety
/// `peer`, `attr` and `out` are NULL or valid; `on_wc` is NULL or a
/// function safe to call with `ctx` and a completion.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_recover(
    qp: *mut rdd_qp,
    peer: *const rdd_qp_info,
    attr: *const rdd_connect_attr,
    timeout_ns: u64,
    on_wc: rdd_wc_fn,
    ctx: *mut c_void,
    out: *mut rdd_recovery,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: NULL or readable (caller contract).
        let attr = unsafe { connect_attr_or_default(attr) };
        let peer = if peer.is_null() {
            None
        } else {
            // SAFETY: non-NULL and readable (caller contract).
            Some(unsafe { peer.read_unaligned() })
        };
        let g = try_status!(excl::<QpObj>(h(qp)));
        if g.ud_mtu != 0 {
            // A UD QP reconnects to nothing; it is not recovered yet (as
            // `api::Qp::drain_and_reset`): nothing changes.
            return rdd_status::Unsupported;
        }
        // A QP on an SRQ drains through its CQs' bound SRQs (as
        // `api::Qp::drain_and_reset_on_srq`).
        let on_srq = g.srq.is_some();
        if let Some(p) = &peer {
            // Bad reconnect inputs are refused before anything is drained
            // (a refused call changes nothing); iWARP's UNSUPPORTED still
            // comes after the reset, as documented.
            match checked_steps(&g, p, &attr) {
                Ok(_) | Err(rdd_status::Unsupported) => {}
                Err(s) => return s,
            }
        }
        let (scq_h, rcq_h) = (g.send_cq, g.recv_cq);
        let mut scq = try_status!(excl::<CqObj>(scq_h));
        let mut rcq = if rcq_h == scq_h {
            None
        } else {
            Some(try_status!(excl::<CqObj>(rcq_h)))
        };
        if scq.attached() != 1 || rcq.as_ref().is_some_and(|r| r.attached() != 1) {
            return rdd_status::ResourceBusy;
        }
        let mut list = QpList::new();
        list.push(g);
        // Always through the device (its state may lag ours; see
        // `api::Qp::drain_and_reset`).
        try_status!(modify_obj(
            &mut list.as_mut_slice()[0],
            &QpModify::to(QpState::Error)
        ));
        // Deferred work not rung yet would never be flushed: the device
        // sees only what the doorbell record publishes (docs/spec/mlx5.md
        // §6, §7). The drain marker's doorbell would cover deferred sends,
        // but a queue full of them has no room for the marker.
        list.as_mut_slice()[0].q.get_mut().ring_deferred();
        let outstanding = |l: &mut QpList| l.as_mut_slice()[0].q.get_mut().outstanding();
        let deadline = std::time::Instant::now() + Duration::from_nanos(timeout_ns);
        let mut reported = 0u64;
        let mut marker = false;
        while outstanding(&mut list) != 0 {
            if !marker {
                // The drain marker (see `api::Qp::drain_and_reset`); a
                // full queue takes it once polling frees room.
                marker = match list.as_mut_slice()[0].q.get_mut().post_drain_marker() {
                    Ok(_) => true,
                    Err(crate::error::Error::SqFull) => false,
                    Err(e) => return e.into(),
                };
            }
            let n = match poll_both(&mut list, &mut scq, rcq.as_mut(), on_wc, ctx) {
                Ok(n) => n,
                Err(s) => return s,
            };
            reported += n as u64;
            if n == 0 {
                if std::time::Instant::now() >= deadline {
                    return rdd_status::Timeout;
                }
                std::thread::yield_now();
            }
        }
        // On an SRQ, receive completions the device wrote (flushed
        // receives the QP had taken) are not counted as outstanding: take
        // what the CQs hold now, before the reset, so none is left for
        // the reconnected QP to meet.
        if on_srq {
            loop {
                match poll_both(&mut list, &mut scq, rcq.as_mut(), on_wc, ctx) {
                    Ok(0) => break,
                    Ok(n) => reported += n as u64,
                    Err(s) => return s,
                }
            }
        }
        // After the drain (the failed WR's completion may be among those
        // drained); RESET clears the record.
        let failure = list.as_mut_slice()[0].q.get_mut().failure();
        try_status!(modify_obj(
            &mut list.as_mut_slice()[0],
            &QpModify::to(QpState::Reset)
        ));
        if let Some(p) = &peer {
            try_status!(connect_obj(&mut list.as_mut_slice()[0], p, &attr));
        }
        if !out.is_null() {
            let r = rdd_recovery {
                reported,
                has_failure: failure.is_some() as u32,
                reserved: 0,
                failure: failure.as_ref().map_or(
                    // SAFETY: all-zero is a valid `rdd_failed_wr` (plain
                    // integers).
                    unsafe { MaybeUninit::<rdd_failed_wr>::zeroed().assume_init() },
                    failed_wr_c,
                ),
            };
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, r) };
        }
        rdd_status::Ok
    })
}

/// One poll of the recovering QP's send CQ and (if it has its own) receive
/// CQ, through their bound SRQs if any, each completion handed to `on_wc`.
/// Returns how many there were.
fn poll_both(
    list: &mut QpList,
    scq: &mut CqObj,
    rcq: Option<&mut Excl<CqObj>>,
    on_wc: rdd_wc_fn,
    ctx: *mut c_void,
) -> Result<usize, rdd_status> {
    let mut wc = [Wc::default(); 32];
    let mut n = 0;
    for co in core::iter::once(scq).chain(rcq.map(|r| &mut **r)) {
        let budget = Arc::clone(&co.budget);
        let m = if co.srqs.is_empty() {
            poll_counted(co.cq.get_mut(), &budget, list, &mut wc)
        } else {
            poll_counted_srqs(co.cq.get_mut(), &budget, list, &co.srqs, &mut wc)
        }
        .map_err(rdd_status::from)?;
        if let Some(f) = on_wc {
            for w in &wc[..m] {
                // SAFETY: the caller's contract on `on_wc`; `rdd_wc` has
                // the layout of `Wc` (asserted in the mlx5 module).
                unsafe { f(ctx, (w as *const Wc).cast::<rdd_wc>()) };
            }
        }
        n += m;
    }
    Ok(n)
}
