//! What a QP can say about itself ([`Qp::query`]): its state, what it was
//! connected with, the work it has outstanding, and where it stands in a
//! recovery.

use super::qp::{Qp, QpPath};
use super::{Backend, QpConnection, QpState};

/// Where a QP stands with respect to recovery ([`QpQuery::recovery`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QpRecovery {
    /// Not in ERROR: nothing to recover.
    #[default]
    None,
    /// In ERROR with work outstanding: the device flushes it, and polling
    /// the QP's CQs (or [`Qp::recover`] / [`Qp::drain_and_reset`], which
    /// poll for you) takes the completions. Recovery is under way or
    /// still to do.
    Draining,
    /// In ERROR with nothing outstanding: every completion has been taken;
    /// move the QP through RESET (and reconnect) to finish.
    Drained,
}

/// A snapshot of a QP ([`Qp::query`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpQuery {
    /// The state as this handle knows it (error completions move it to
    /// ERROR; see [`Qp::state`]).
    pub state: QpState,
    /// What the last successful [`Qp::connect`] used; `None` in RESET,
    /// before any connect, and for QPs connected through rdma_cm.
    pub connection: Option<QpConnection>,
    /// Send work posted and not yet completed: 64-byte basic blocks on the
    /// mlx5 path (one per WR of up to 64 bytes), WRs on a driver path (the
    /// unit of [`Qp::send_space`]).
    pub send_outstanding: u32,
    /// Receives posted and not yet completed.
    pub recv_outstanding: u32,
    /// Where the QP stands with respect to recovery.
    pub recovery: QpRecovery,
}

/// The recovery phase of a QP in `state` with `outstanding` work.
pub(crate) fn recovery_phase(state: QpState, outstanding: u64) -> QpRecovery {
    match (state, outstanding) {
        (QpState::Error, 0) => QpRecovery::Drained,
        (QpState::Error, _) => QpRecovery::Draining,
        _ => QpRecovery::None,
    }
}

impl<B: Backend> Qp<B> {
    /// The QP's state, connection attributes, outstanding work and
    /// recovery phase. Asks the device nothing: everything comes from the
    /// handle (no system call).
    pub fn query(&self) -> QpQuery {
        let (send, recv) = match &self.path {
            QpPath::Mlx5(q) => (
                q.sq.producer().wrapping_sub(q.sq.retired()),
                q.rq.head().wrapping_sub(q.rq.tail()),
            ),
            QpPath::Driver(p) => {
                let send = p.capacity().0.saturating_sub(p.send_space());
                let recv = p.outstanding().saturating_sub(u64::from(send));
                (send, u32::try_from(recv).unwrap_or(u32::MAX))
            }
        };
        let state = self.state();
        QpQuery {
            state,
            connection: self.connection,
            send_outstanding: send,
            recv_outstanding: recv,
            recovery: recovery_phase(state, u64::from(send) + u64::from(recv)),
        }
    }
}
