//! Routing a CQE to its queues: the send-queue side the poller needs
//! ([`SqRetire`]) and the QP-number routes ([`CqRoute`], [`CqRouteTo`]).

use crate::provider::mlx5::completion::{QpState, Retired, Wc};
use crate::provider::mlx5::rq::RecvQueue;
use crate::provider::mlx5::sq::SendQueue;
use crate::provider::mlx5::srq::Srq;

/// What the completion poller needs from a send queue: in-order
/// retirement, the WQE's local buffers (for scatter-to-CQE) and the error
/// state. Implemented by the single-owner [`SendQueue`] and by the retire
/// handle of a [`super::super::shared::SharedSendQueue`].
pub trait SqRetire {
    /// Retires the WQE at 16-bit index `counter` and everything before it
    /// (see [`SendQueue::retire`]).
    fn retire(&mut self, counter: u16) -> Option<Retired>;
    /// Calls `f(addr, len)` for the local data segments of the READ or
    /// atomic WQE at BB `start`.
    fn for_each_data_seg(&self, start: u32, f: impl FnMut(u64, u32) -> bool);
    /// Records that the QP entered the error state.
    fn set_error(&mut self);
    /// Records the failure of the WQE at BB `start` (cold path).
    fn record_failure(&mut self, start: u32, wc: &Wc) {
        let _ = (start, wc);
    }
    /// The WQE at BB `start` is recovery's drain marker
    /// ([`SendQueue::post_drain_marker`]), whose completion is never
    /// reported (cold path: asked for error completions only). The
    /// default is `false`: queues that post no markers.
    fn is_drain_marker(&self, start: u32) -> bool {
        let _ = start;
        false
    }
}

impl SqRetire for SendQueue {
    #[inline(always)]
    fn retire(&mut self, counter: u16) -> Option<Retired> {
        SendQueue::retire(self, counter)
    }
    fn for_each_data_seg(&self, start: u32, f: impl FnMut(u64, u32) -> bool) {
        SendQueue::for_each_data_seg(self, start, f)
    }
    fn set_error(&mut self) {
        self.set_state(QpState::Error);
    }
    fn record_failure(&mut self, start: u32, wc: &Wc) {
        SendQueue::record_failure(self, start, wc)
    }
    fn is_drain_marker(&self, start: u32) -> bool {
        SendQueue::is_drain_marker(self, start)
    }
}

/// The send and receive queue of one QP, as the poller sees them.
pub struct QpQueues<'q, S: ?Sized = SendQueue> {
    /// Send queue (or its retire handle).
    pub sq: &'q mut S,
    /// Receive queue.
    pub rq: &'q mut RecvQueue,
}

/// Finds the queues a CQE belongs to, by QP number.
pub trait CqRoute {
    /// The queues of QP `qpn`, if this route owns it.
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>>;
    /// True if the last [`CqRoute::route`] answered `None` because the QP
    /// is this route's but its queues are in use elsewhere at the moment
    /// (a route that takes each QP only when a completion for it arrives,
    /// as the C object level's `rdd_cq_poll_n` does). The poller then stops
    /// in front of that entry and leaves it for a later poll, instead of
    /// consuming it as a stale entry. The default is `false`.
    #[inline(always)]
    fn busy(&self) -> bool {
        false
    }
    /// The SRQ that owns a responder or receive-error completion of QP
    /// `qpn` whose CQE carries `srqn_uidx` (its low 24 bits: the SRQ
    /// number with CQE version 0, the QP's user index with version 1;
    /// docs/spec/mlx5.md §11), if the QP receives through one. The default,
    /// for routes without SRQs, is `None` (the check then compiles away).
    #[inline(always)]
    fn srq_for(&mut self, qpn: u32, srqn_uidx: u32) -> Option<&mut Srq> {
        let _ = (qpn, srqn_uidx);
        None
    }
}

/// The general form of [`CqRoute`]: routes to any kind of send queue
/// ([`SqRetire`]). Every [`CqRoute`] is a `CqRouteTo<SendQueue>`.
pub trait CqRouteTo<S: SqRetire + ?Sized> {
    /// The queues of QP `qpn`, if this route owns it.
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, S>>;
    /// As [`CqRoute::busy`].
    #[inline(always)]
    fn busy(&self) -> bool {
        false
    }
    /// As [`CqRoute::srq_for`].
    #[inline(always)]
    fn srq_for(&mut self, qpn: u32, srqn_uidx: u32) -> Option<&mut Srq> {
        let _ = (qpn, srqn_uidx);
        None
    }
}

impl<R: CqRoute + ?Sized> CqRouteTo<SendQueue> for R {
    #[inline(always)]
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, SendQueue>> {
        self.route(qpn)
    }
    #[inline(always)]
    fn busy(&self) -> bool {
        CqRoute::busy(self)
    }
    #[inline(always)]
    fn srq_for(&mut self, qpn: u32, srqn_uidx: u32) -> Option<&mut Srq> {
        CqRoute::srq_for(self, qpn, srqn_uidx)
    }
}

/// One QP's queues: the route for a CQ that serves a single QP.
pub struct Mlx5Qp {
    /// Send queue.
    pub sq: SendQueue,
    /// Receive queue.
    pub rq: RecvQueue,
}

impl CqRoute for Mlx5Qp {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        if qpn == self.sq.qpn() {
            Some(QpQueues {
                sq: &mut self.sq,
                rq: &mut self.rq,
            })
        } else {
            None
        }
    }
}

impl CqRoute for [Mlx5Qp] {
    #[inline]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.iter_mut()
            .find(|q| q.sq.qpn() == qpn)
            .map(|q| QpQueues {
                sq: &mut q.sq,
                rq: &mut q.rq,
            })
    }
}
