//! Recovering a QP after an error: draining its outstanding work
//! ([`Qp::drain_and_reset`]) and reconnecting ([`Qp::recover`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sync::Ordering;

use super::cq::Cq;
use super::qp::{Qp, QpPath};
use super::srq::Srq;
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
    /// A QP on an SRQ drains with [`Qp::drain_and_reset_on_srq`] (here
    /// [`Error::Unsupported`], nothing done: its receive completions need
    /// the SRQ's route). Not yet for a UD QP ([`Error::Unsupported`],
    /// nothing done; move it to ERROR and RESET with [`Qp::modify`]).
    pub fn drain_and_reset(
        &mut self,
        send_cq: &mut Cq<B>,
        recv_cq: Option<&mut Cq<B>>,
        timeout: Duration,
        on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
        if self.srq.is_some() || self.is_ud() {
            return Err(Error::Unsupported);
        }
        self.drain_with(None, send_cq, recv_cq, timeout, on_wc)
    }

    /// [`Qp::drain_and_reset`] for a QP on `srq` (the SRQ it was created
    /// on; another one, or a QP without an SRQ, is
    /// [`Error::InvalidAttribute`], nothing done). Completions are polled
    /// through [`Srq::route`], so receive completions of this QP (flushed
    /// ones included) give their SRQ receives back to the SRQ's free list.
    ///
    /// What an error does to the receives differs from a QP's own receive
    /// queue, as on hardware (IBA vol. 1 §10.2.9.5): only the receives this
    /// QP had taken from the SRQ and not completed are flushed; every
    /// receive still in the SRQ stays there for the other QPs, and for
    /// this one once it is connected again. So the drain waits for the
    /// send work as `drain_and_reset` does, then takes whatever receive
    /// completions the CQs hold before the reset. The same rule holds for
    /// the CQs: they must serve only this QP ([`Error::ResourceBusy`]).
    pub fn drain_and_reset_on_srq(
        &mut self,
        srq: &mut Srq<B>,
        send_cq: &mut Cq<B>,
        recv_cq: Option<&mut Cq<B>>,
        timeout: Duration,
        on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
        if self.srq.as_ref().map(|s| s.key) != Some(srq.id().key) {
            return Err(Error::InvalidAttribute);
        }
        if self.is_ud() {
            return Err(Error::Unsupported);
        }
        self.drain_with(Some(srq), send_cq, recv_cq, timeout, on_wc)
    }

    /// Polls `cq` into `out` through this QP, or through `srq`'s route
    /// over it.
    fn poll_own(
        &mut self,
        srq: Option<&mut Srq<B>>,
        cq: &mut Cq<B>,
        out: &mut [Wc],
    ) -> Result<usize> {
        match srq {
            None => cq.poll(self, out),
            Some(s) => cq.poll(&mut s.route(self), out),
        }
    }

    /// One poll of `send_cq` and (if given) `recv_cq` for this QP, each
    /// completion handed to `on_wc`; returns how many there were.
    fn poll_pair(
        &mut self,
        mut srq: Option<&mut Srq<B>>,
        send_cq: &mut Cq<B>,
        recv_cq: Option<&mut Cq<B>>,
        on_wc: &mut impl FnMut(&Wc),
    ) -> Result<usize> {
        let mut out = [Wc::default(); 32];
        let mut n = self.poll_own(srq.as_deref_mut(), send_cq, &mut out)?;
        out[..n].iter().for_each(&mut *on_wc);
        if let Some(r) = recv_cq {
            let m = self.poll_own(srq, r, &mut out)?;
            out[..m].iter().for_each(&mut *on_wc);
            n += m;
        }
        Ok(n)
    }

    /// The drain of [`Qp::drain_and_reset`] and
    /// [`Qp::drain_and_reset_on_srq`].
    fn drain_with(
        &mut self,
        mut srq: Option<&mut Srq<B>>,
        send_cq: &mut Cq<B>,
        mut recv_cq: Option<&mut Cq<B>>,
        timeout: Duration,
        mut on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
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
            let n = self.poll_pair(
                srq.as_deref_mut(),
                send_cq,
                recv_cq.as_deref_mut(),
                &mut on_wc,
            )?;
            reported += n;
            if n == 0 {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout);
                }
                std::thread::yield_now();
            }
        }
        // On an SRQ, receive completions the device wrote (flushed
        // receives this QP had taken) are not counted as outstanding: take
        // what the CQs hold now, before the reset, so none is left for a
        // reconnected QP to meet.
        if srq.is_some() {
            loop {
                let n = self.poll_pair(
                    srq.as_deref_mut(),
                    send_cq,
                    recv_cq.as_deref_mut(),
                    &mut on_wc,
                )?;
                reported += n;
                if n == 0 {
                    break;
                }
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
        self.check_reconnect(peer, attr)?;
        let r = self.drain_and_reset(send_cq, recv_cq, timeout, on_wc)?;
        self.connect(peer, attr)?;
        Ok(r)
    }

    /// [`Qp::recover`] for a QP on `srq`: [`Qp::drain_and_reset_on_srq`],
    /// then INIT → RTR → RTS towards `peer`, with the same checks first.
    #[allow(clippy::too_many_arguments)]
    pub fn recover_on_srq(
        &mut self,
        srq: &mut Srq<B>,
        send_cq: &mut Cq<B>,
        recv_cq: Option<&mut Cq<B>>,
        peer: &QpInfo,
        attr: &ConnectAttr,
        timeout: Duration,
        on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
        self.check_reconnect(peer, attr)?;
        let r = self.drain_and_reset_on_srq(srq, send_cq, recv_cq, timeout, on_wc)?;
        self.connect(peer, attr)?;
        Ok(r)
    }

    /// Bad reconnect inputs are refused before anything is drained, so a
    /// refused call leaves the QP as it was (iWARP's Unsupported still
    /// comes after the reset, as documented).
    fn check_reconnect(&self, peer: &QpInfo, attr: &ConnectAttr) -> Result<()> {
        let port = self.pd.b.port();
        if port.transport != super::Transport::Iwarp {
            super::checked_connect_steps(&port, self.psn, peer, attr)?;
        }
        Ok(())
    }
}
