//! The one-handle poll, `rdd_cq_poll_n`: the CQ knows its QPs (bound by
//! `rdd_qp_create`, unbound by `rdd_qp_destroy`), so the caller passes
//! only the CQ, and only the CQ's handle is checked per call.
//!
//! # Conflicting use stays detected
//!
//! Routing a completion retires work of the QP's queues (its send-queue
//! counters, its receive ring), state that a concurrent post to the same
//! QP also writes: an unsynchronised overlap would be a data race. So the
//! poll still uses each QP exclusively, as `rdd_cq_poll` does, but it
//! takes a QP's slot only when the first completion for that QP arrives
//! in the call ([`LazyRoute`]): one compare-and-swap on the slot the CQ
//! remembered (`SlotRef`: no handle decoding), kept for the rest of the
//! call. A QP without completions in this call is not touched at all, so
//! an empty poll costs the CQ's handle check only, and a CQ shared by many
//! QPs costs one acquisition per QP that actually completed something.
//!
//! If that QP is in use by another thread at that moment (a post in
//! flight), the route says so ([`CqRoute::busy`]) and the mlx5 poller
//! stops *in front of* that completion without consuming it: the call
//! returns the completions before it, or `-RDD_STATUS_RESOURCE_BUSY` when
//! it is the first, and the next call picks it up. Nothing is lost and no
//! queue is ever touched by two threads; no call waits.

use core::mem::MaybeUninit;

use crate::completion::Wc;
use crate::ffi::mlx5::rdd_wc;
use crate::ffi::status::rdd_status;
use crate::provider::mlx5::{CompletionQueue, CqRoute, QpQueues};

use super::objects::{BoundQp, CqBudget, CqImpl, CqObj, QpImpl, QpObj};
use super::srq_route::WithSrqs;
use super::table::{excl, excl_ref, Excl};
use super::types::rdd_cq;
use super::{check_array, h};

/// QPs one poll keeps acquired at once; a further QP evicts (releases) the
/// oldest, which is taken again if more of its completions follow.
const HELD: usize = 8;

/// The route of a one-handle poll: the CQ's bound QPs, each acquired
/// exclusively when a completion for it first arrives and held until the
/// poll returns (or evicted, see [`HELD`]).
struct LazyRoute<'a> {
    bound: &'a [BoundQp],
    /// `held[..len]` are initialised: a QP number and its guard.
    held: [MaybeUninit<(u32, Excl<QpObj>)>; HELD],
    len: usize,
    /// The entry the next eviction replaces.
    next: usize,
    /// The last `route` found the QP in use by another thread.
    busy: bool,
}

impl<'a> LazyRoute<'a> {
    #[inline(always)]
    fn new(bound: &'a [BoundQp]) -> Self {
        LazyRoute {
            bound,
            held: [const { MaybeUninit::uninit() }; HELD],
            len: 0,
            next: 0,
            busy: false,
        }
    }

    /// The held entry for `qpn`, or `len` if there is none.
    #[inline(always)]
    fn find(&self, qpn: u32) -> usize {
        let mut i = 0;
        // SAFETY: entries `..len` are initialised.
        while i < self.len && unsafe { self.held[i].assume_init_ref().0 } != qpn {
            i += 1;
        }
        i
    }

    /// Acquires bound QP `qpn` into a held entry. `None` if it is not
    /// bound here (a stale entry of a destroyed QP: skipped by the poller)
    /// or in use elsewhere (`busy` set: the poller stops).
    #[inline(always)]
    fn acquire(&mut self, qpn: u32) -> Option<usize> {
        let mut k = 0;
        while k < self.bound.len() && self.bound[k].qpn != qpn {
            k += 1;
        }
        let b = self.bound.get(k)?;
        let g = match excl_ref(&b.slot) {
            Ok(g) => g,
            Err(rdd_status::ResourceBusy) => {
                self.busy = true;
                return None;
            }
            // A bound QP is live (unbound before destruction, under this
            // CQ's exclusive use): not reached; treated as not bound.
            Err(_) => return None,
        };
        let i = if self.len < HELD {
            self.len += 1;
            self.len - 1
        } else {
            let i = self.next;
            self.next = (i + 1) % HELD;
            // SAFETY: entry `i < len` is initialised; no borrow of it is
            // alive (the poller's borrow from the previous `route` ended).
            unsafe { self.held[i].assume_init_drop() };
            i
        };
        self.held[i].write((qpn, g));
        Some(i)
    }
}

impl Drop for LazyRoute<'_> {
    fn drop(&mut self) {
        for e in &mut self.held[..self.len] {
            // SAFETY: initialised (`..len`), dropped once: releases the slot.
            unsafe { e.assume_init_drop() };
        }
    }
}

impl CqRoute for LazyRoute<'_> {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.busy = false;
        let mut i = self.find(qpn);
        if i == self.len {
            i = self.acquire(qpn)?;
        }
        // SAFETY: `i < len`: initialised.
        let g = unsafe { &mut self.held[i].assume_init_mut().1 };
        match g.q.get_mut() {
            QpImpl::Mlx5(o) => Some(QpQueues {
                sq: &mut o.sq,
                rq: &mut o.rq,
            }),
            QpImpl::Driver(_) => None,
        }
    }

    #[inline(always)]
    fn busy(&self) -> bool {
        self.busy
    }
}

/// `rdd_cq_poll_n` on a CQ that QPs on SRQs receive on: their receives
/// complete through the SRQs (`srq_route.rs`), each taken as lazily as a
/// QP. Out of line and cold, so that the poll of a CQ without SRQs keeps
/// its code (one test of the SRQ count in front of it).
#[cold]
#[inline(never)]
fn poll_with_srqs(c: &mut CqObj, out: &mut [Wc]) -> i32 {
    let r = match c.cq.get_mut() {
        CqImpl::Mlx5(cq) => {
            let mut lazy = LazyRoute::new(&c.bound);
            let mut route = WithSrqs::new(&mut lazy, &c.srqs);
            poll_mlx5(cq, &c.budget, &mut route, out)
        }
        // Only mlx5 SRQs are bound to CQs: a provider-posted SRQ (the
        // verbs fallback) never is, its driver CQ maps its receives itself
        // (`rdd_qp_create_on_srq`). Not reached.
        CqImpl::Driver(_) => Err(crate::error::Error::Unsupported),
    };
    match r {
        // `k <= out.len() <= i32::MAX`.
        Ok(k) => k as i32,
        Err(e) => neg(e.into()),
    }
}

/// `-(int32_t)status`, the error form of `rdd_cq_poll_n`.
#[inline(always)]
fn neg(s: rdd_status) -> i32 {
    // Every status is below 2^31.
    -(s as u32 as i32)
}

/// Polls the mlx5 core's CQ, and on an unguarded CQ gives every consumed
/// CQE's room back to the posters' headroom check (as `rdd_cq_poll`).
#[inline(always)]
fn poll_mlx5<R: CqRoute + ?Sized>(
    cq: &mut CompletionQueue,
    budget: &CqBudget,
    route: &mut R,
    out: &mut [Wc],
) -> crate::error::Result<usize> {
    if !budget.metered() {
        return cq.poll(route, out);
    }
    let ci = cq.consumer_index();
    let r = cq.poll(route, out);
    budget
        .headroom
        .unreserve(u64::from(cq.consumer_index().wrapping_sub(ci)));
    r
}

/// Polls up to `n` completions of every QP that completes on `cq` into
/// `out[0..n]` and returns how many it wrote (0..n), or a negative
/// `-(int32_t)rdd_status` on failure, with `out` unwritten. At most
/// `INT32_MAX` are polled per call.
///
/// The CQ knows its QPs (each `rdd_qp_create` naming it as send or receive
/// CQ binds the QP, `rdd_qp_destroy` unbinds it), so unlike `rdd_cq_poll`
/// there is no list to pass and only the CQ handle is checked. The call
/// uses the CQ exclusively, and each QP exclusively from the first of its
/// completions in this call on (one compare-and-swap, only for QPs with
/// completions). If such a QP is in use by another thread (a post in
/// flight: a broken threading contract), the call stops in front of that
/// QP's completion without consuming it and returns the completions
/// before it, or `-RDD_STATUS_RESOURCE_BUSY` if there are none; nothing is
/// lost. Completions of destroyed QPs are discarded, and a failed
/// completion moves its QP to the error state, as with `rdd_cq_poll`.
/// Receives of QPs on an SRQ complete through the SRQ (its `wr_id`, the
/// QP's `qp_num`), the SRQ being taken like a QP: exclusively, from its
/// first entry in the call on, and a busy one stops the call in front of
/// that entry as a busy QP does.
///
/// Errors: `-RDD_STATUS_NULL_PARAMETER` (`cq` or `out` NULL, also for
/// `n` = 0); `-RDD_STATUS_INVALID_ARGUMENT` (`out` misaligned);
/// `-RDD_STATUS_INVALID_HANDLE` (destroyed, forged, not a CQ);
/// `-RDD_STATUS_RESOURCE_BUSY` (the CQ, or the QP of the first completion,
/// in use by another thread); `-RDD_STATUS_CQE_CORRUPT`,
/// `-RDD_STATUS_CQE_COMPRESSED` (a bad entry from the device); on a kernel
/// device also `-RDD_STATUS_PROVIDER_ERROR`. `n` = 0 checks the arguments
/// and returns 0.
///
/// # Safety
/// `out` is valid for writes of `n` `rdd_wc`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_poll_n(cq: *mut rdd_cq, out: *mut rdd_wc, n: u32) -> i32 {
    ffi_boundary!({
        let n = n.min(i32::MAX as u32) as usize;
        if let Err(s) = check_array(out.cast_const(), n) {
            return neg(s);
        }
        let mut g = match excl::<CqObj>(h(cq)) {
            Ok(g) => g,
            Err(s) => return neg(s),
        };
        // `n` = 0, or a CQ with SRQs (`srq_gate`): one comparison.
        if n <= g.srq_gate {
            if n == 0 {
                return 0;
            }
            // SAFETY: as below.
            let out_wc = unsafe { core::slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
            return poll_with_srqs(&mut g, out_wc);
        }
        // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
        // (checked / caller contract); `rdd_wc` has the layout of `Wc`
        // (asserted in the mlx5 module) and every bit pattern is valid.
        let out_wc = unsafe { core::slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let c: &mut CqObj = &mut g;
        let r = match c.cq.get_mut() {
            CqImpl::Mlx5(cq) => {
                let mut route = LazyRoute::new(&c.bound);
                poll_mlx5(cq, &c.budget, &mut route, out_wc)
            }
            CqImpl::Driver(p) => {
                // The provider retires its queues itself (its QP and CQ
                // sides share synchronised bookkeeping): no QP is used. It
                // reports every completion it was asked for.
                let r = p.poll(out_wc);
                if c.budget.metered() {
                    c.budget
                        .headroom
                        .unreserve(*r.as_ref().unwrap_or(&0) as u64);
                }
                r
            }
        };
        match r {
            // `k <= n <= i32::MAX`.
            Ok(k) => k as i32,
            Err(e) => neg(e.into()),
        }
    })
}
