//! Recovering a QP after an error: draining its outstanding work
//! ([`Qp::drain_and_reset`]) and reconnecting ([`Qp::recover`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sync::Ordering;

use super::cq::Cq;
use super::qp::{Qp, QpPath};
use super::{Backend, ConnectAttr, QpInfo, QpModify, QpState, Wc};

/// What [`Qp::drain_and_reset`] and [`Qp::recover`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The WR that broke the QP, as posted (if a WR failed).
    pub failure: Option<crate::wr::FailedWr>,
    /// Completions handed to the callback while draining.
    pub reported: usize,
}

impl<B: Backend> Qp<B> {
    /// Work posted and not yet completed: send-queue basic blocks (mlx5) or
    /// send WRs (a driver path), plus receives.
    pub fn outstanding(&self) -> u64 {
        match &self.path {
            QpPath::Mlx5(q) => {
                u64::from(q.sq.producer().wrapping_sub(q.sq.retired()))
                    + u64::from(q.rq.head().wrapping_sub(q.rq.tail()))
            }
            QpPath::Driver(p) => p.outstanding(),
        }
    }

    /// Recovery's drain marker, in ERROR: one internal signaled WR after
    /// all send work, whose completion retires it (see
    /// [`SendQueue::post_drain_marker`](crate::provider::mlx5::SendQueue::post_drain_marker)
    /// and [`QpDriver::post_drain_marker`](super::QpDriver::post_drain_marker)).
    fn post_drain_marker(&mut self) -> Result<bool> {
        match &mut self.path {
            QpPath::Mlx5(q) => q.sq.post_drain_marker(),
            QpPath::Driver(p) => p.post_drain_marker(),
        }
    }

    /// The first half of recovery: moves the QP to ERROR (if it is not
    /// there already), polls `send_cq` (and `recv_cq`, if it is a different
    /// CQ) until every outstanding WR has completed, handing each
    /// completion to `on_wc` exactly once (flushed WRs included, unsignaled
    /// ones too; only successful unsignaled WRs stay silent, as always),
    /// then moves the QP through RESET, which resynchronises the queue
    /// counters. Afterwards the QP is in RESET, ready for
    /// [`Qp::connect`] or an rdma_cm reconnect.
    ///
    /// Recovery always finishes, whatever mix of signaled, unsignaled,
    /// executed and outstanding work the QP holds: an unsignaled WR the
    /// device executed has no completion of its own, so with send work
    /// outstanding a *drain marker* is posted once the QP is in ERROR (a
    /// signaled NOP on mlx5 and the software device, a zero-length
    /// signaled RDMA WRITE on rxe and the verbs fallback, a marker the
    /// poller completes itself on siw, whose kernel never reads what is
    /// posted in ERROR). The device flushes it after everything before it,
    /// and its completion retires every earlier send. It is recognised by
    /// its position in the queue (never by its wr_id) and is not reported
    /// to `on_wc` or counted in [`Recovery::reported`]. If the send queue
    /// is full, the marker is posted as soon as polling has freed room
    /// (the signalling guard guarantees that it will). Receives need no
    /// marker: every posted receive is flushed individually.
    ///
    /// The CQs must serve only this QP (other QPs' completions would be
    /// consumed): otherwise [`Error::ResourceBusy`]. Gives up with
    /// [`Error::Timeout`] after `timeout`.
    ///
    /// Not yet for a UD QP, nor for a QP on an SRQ ([`Error::Unsupported`],
    /// nothing done; move a UD QP to ERROR and RESET with [`Qp::modify`]).
    /// For a QP on an SRQ:
    /// its receive completions need the SRQ's route. Move it to ERROR and
    /// RESET with [`Qp::modify`] after polling its CQs through
    /// [`super::Srq::route`].
    pub fn drain_and_reset(
        &mut self,
        send_cq: &mut Cq<B>,
        mut recv_cq: Option<&mut Cq<B>>,
        timeout: Duration,
        mut on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
        if self.srq.is_some() || self.is_ud() {
            return Err(Error::Unsupported);
        }
        let own_send = Arc::ptr_eq(&send_cq.inner, &self._send_cq);
        let own_recv = match &recv_cq {
            Some(c) => Arc::ptr_eq(&c.inner, &self._recv_cq),
            None => Arc::ptr_eq(&self._recv_cq, &self._send_cq),
        };
        if !own_send || !own_recv {
            return Err(Error::InvalidAttribute);
        }
        let users = |c: &Cq<B>| c.inner.users.load(Ordering::Relaxed);
        // One QP: 2 uses of a shared send/recv CQ, or 1 of each.
        let alone = match &recv_cq {
            Some(r) => users(send_cq) == 1 && users(r) == 1,
            None => users(send_cq) == 2,
        };
        if !alone {
            return Err(Error::ResourceBusy);
        }
        // Always through the device, even if a completion already showed
        // the QP in ERROR: the device's own state may lag (iWARP after a
        // dropped connection), and the data path takes back work the
        // device will never complete (see `verbs::direct`).
        self.modify(&QpModify::to(QpState::Error))?;
        // Sends a driver deferred (`Qp::post_send_deferred`) reach the
        // device now, so it flushes them even when the ring has no room
        // left for the drain marker (which would ring them too). A failed
        // system call leaves them owed to the marker.
        if let QpPath::Driver(p) = &mut self.path {
            let _ = p.ring();
        }
        let deadline = Instant::now() + timeout;
        let mut reported = 0usize;
        let mut out = [Wc::default(); 32];
        let mut marker = false;
        while self.outstanding() != 0 {
            if !marker {
                // A full queue takes the marker once polling frees room.
                marker = match self.post_drain_marker() {
                    Ok(_) => true,
                    Err(Error::SqFull) => false,
                    Err(e) => return Err(e),
                };
            }
            let mut n = send_cq.poll(self, &mut out)?;
            for w in &out[..n] {
                on_wc(w);
            }
            if let Some(r) = recv_cq.as_deref_mut() {
                let m = r.poll(self, &mut out)?;
                for w in &out[..m] {
                    on_wc(w);
                }
                n += m;
            }
            reported += n;
            if n == 0 {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout);
                }
                std::thread::yield_now();
            }
        }
        // After the drain: the failed WR's completion may have been among
        // those drained (recovery driven by an async event). RESET clears
        // the record.
        let failure = self.failure();
        self.modify(&QpModify::to(QpState::Reset))?;
        Ok(Recovery { failure, reported })
    }

    /// One-call recovery after an error completion or a fatal QP event:
    /// [`Qp::drain_and_reset`], then INIT → RTR → RTS towards `peer` (the
    /// peer recovers its own QP the same way and the two exchange fresh
    /// [`Qp::info`]). iWARP QPs reconnect through rdma_cm instead: this
    /// returns [`Error::Unsupported`] for them after the reset. `peer` and
    /// `attr` are checked first, as [`Qp::connect`] checks them: refused
    /// ([`Error::InvalidAttribute`]) before anything is drained.
    pub fn recover(
        &mut self,
        send_cq: &mut Cq<B>,
        recv_cq: Option<&mut Cq<B>>,
        peer: &QpInfo,
        attr: &ConnectAttr,
        timeout: Duration,
        on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
        // Bad reconnect inputs are refused before anything is drained, so
        // a refused call leaves the QP as it was (iWARP's Unsupported still
        // comes after the reset, as documented).
        let port = self.pd.b.port();
        if port.transport != super::Transport::Iwarp {
            super::checked_connect_steps(&port, self.psn, peer, attr)?;
        }
        let r = self.drain_and_reset(send_cq, recv_cq, timeout, on_wc)?;
        self.connect(peer, attr)?;
        Ok(r)
    }
}
