//! Routing SRQ receive completions at the object level: the SRQs a CQ
//! knows ([`BoundSrq`], bound by `rdd_qp_create_on_srq`, unbound by
//! `rdd_qp_destroy`) and the route wrapper ([`WithSrqs`]) that hands the
//! CQ poller an SRQ's free list for the entries that name it
//! (docs/spec/mlx5.md §11, as `api::Srq::route` does in Rust).
//!
//! A poll only builds the wrapper when its CQ has SRQs bound, so a CQ
//! without SRQ QPs polls through the very code it did before (the route
//! types without SRQs answer `srq_for` with `None` at compile time).
//!
//! Each SRQ is taken exclusively (one compare-and-swap on the slot the CQ
//! remembered) when the first entry naming it arrives in the call, and held
//! until the call returns. If another thread holds it at that moment (a
//! post to the SRQ in flight, or a poll of another CQ its QPs complete
//! on), the wrapper reports the entry busy and the poller stops in front
//! of it without consuming it, as `rdd_cq_poll_n` does for a busy QP:
//! nothing is lost, the next poll takes it.

use crate::ffi::status::rdd_status;
use crate::provider::mlx5::{self, CqRoute, QpQueues};

use super::srq::{SrqObj, SrqQueue};
use super::table::{excl_ref, Excl, SlotRef};

/// An SRQ whose QPs complete on a CQ, as the CQ knows it: its number (what
/// the CQE names), its slot, and how many of its QPs use the CQ for
/// receives.
pub(super) struct BoundSrq {
    pub(super) srqn: u32,
    pub(super) slot: SlotRef<SrqObj>,
    pub(super) qps: u32,
}

/// SRQs one poll keeps acquired at once; a further one evicts (releases)
/// the oldest, taken again if more of its entries follow.
const HELD: usize = 4;

/// A CQ route (`R`, the QPs) with the CQ's bound SRQs.
pub(super) struct WithSrqs<'a, R: CqRoute + ?Sized> {
    qps: &'a mut R,
    srqs: &'a [BoundSrq],
    held: [Option<(u32, Excl<SrqObj>)>; HELD],
    next: usize,
    /// The last `srq_for` found its SRQ in use by another thread.
    busy: bool,
}

impl<'a, R: CqRoute + ?Sized> WithSrqs<'a, R> {
    pub(super) fn new(qps: &'a mut R, srqs: &'a [BoundSrq]) -> Self {
        WithSrqs {
            qps,
            srqs,
            held: [const { None }; HELD],
            next: 0,
            busy: false,
        }
    }

    /// The held entry of SRQ `srqn`, acquiring it if needed. `None` if the
    /// CQ has no such SRQ bound, or it is in use elsewhere (`busy` set).
    fn acquire(&mut self, srqn: u32) -> Option<usize> {
        if let Some(i) = self
            .held
            .iter()
            .position(|e| e.as_ref().is_some_and(|(n, _)| *n == srqn))
        {
            return Some(i);
        }
        let b = self.srqs.iter().find(|b| b.srqn & 0x00ff_ffff == srqn)?;
        let g = match excl_ref(&b.slot) {
            Ok(g) => g,
            Err(rdd_status::ResourceBusy) => {
                self.busy = true;
                return None;
            }
            // A bound SRQ is live (it cannot be destroyed while QPs are
            // attached, and the CQ unbinds it with its last QP): not
            // reached; treated as not bound.
            Err(_) => return None,
        };
        let i = match self.held.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let i = self.next;
                self.next = (i + 1) % HELD;
                i
            }
        };
        // Replacing an entry drops (releases) the evicted guard; no borrow
        // of it is alive (the poller's borrow from the previous call ended).
        self.held[i] = Some((srqn, g));
        Some(i)
    }
}

impl<R: CqRoute + ?Sized> CqRoute for WithSrqs<'_, R> {
    #[inline]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        if self.busy {
            // The entry's SRQ is busy: no route, so the poller stops.
            return None;
        }
        self.qps.route(qpn)
    }

    #[inline]
    fn busy(&self) -> bool {
        self.busy || self.qps.busy()
    }

    #[inline]
    fn srq_for(&mut self, _qpn: u32, srqn_uidx: u32) -> Option<&mut mlx5::Srq> {
        self.busy = false;
        // CQE version 0: the entry names the SRQ, 0 for QPs without one
        // (docs/spec/mlx5.md §11); SRQ numbers are never 0.
        if srqn_uidx == 0 {
            return None;
        }
        let i = self.acquire(srqn_uidx)?;
        let (_, g) = self.held[i].as_mut()?;
        match g.q.get_mut() {
            SrqQueue::Mlx5 { q, .. } => Some(q),
            // A provider-posted SRQ is never bound to a CQ (its receives
            // complete on a driver CQ, which never asks the route).
            SrqQueue::Driver(_) => None,
        }
    }
}
