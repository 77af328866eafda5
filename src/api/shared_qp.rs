//! A QP whose send queue many threads post to at once ([`SharedQp`]), and
//! the poller that owns its completion side ([`SharedQpPoller`]).

use std::any::Any;
use std::boxed::Box;
use std::sync::Arc;
use std::vec;

use core::ptr::NonNull;

use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::{
    CqRouteTo, QpQueues, RecvQueue, Retired, SharedSendQueue, SharedStorage, SqConfig, SqRetire,
    WrSlot,
};
use crate::sync::{AtomicU32, Ordering};
use crate::wr::{RecvWr, SendWr};

use super::cq::{Cq, CqDemand, CqInner, CqPath};
use super::device::PdInner;
use super::qp::{Mlx5Queues, Qp, QpPath};
use super::srq::SrqInner;
use super::{fitting_prefix, signaled, Backend, Wc};
use crate::provider::mlx5::rq::AbsentRq;

/// A QP whose send queue any number of threads post to at once, without a
/// lock (`Sync`; share it in an `Arc`). Made by [`Qp::into_shared`]; its
/// completions are polled through the matching [`SharedQpPoller`].
pub struct SharedQp<B: Backend> {
    sq: SharedSendQueue,
    qpn: u32,
    pd: Arc<PdInner<B>>,
    _send_cq: Arc<CqInner<B>>,
    _recv_cq: Arc<CqInner<B>>,
    /// The QP's share of its CQs' sizing guard, given back on drop.
    demand: CqDemand,
    /// The SRQ the QP takes its receives from, detached on drop.
    srq: Option<Arc<SrqInner<B>>>,
    _slots: Box<[WrSlot]>,
    _ready: Box<[AtomicU32]>,
    _keep: Arc<dyn Any + Send + Sync>,
}

/// The completion side of a [`SharedQp`]: it owns the receive queue and the
/// right to retire send-queue space, and is the route for the CQ(s) the QP
/// completes on. One per shared QP; keep it on the polling thread.
pub struct SharedQpPoller<B: Backend> {
    retire: SharedRetirer<B>,
    rq: RecvQueue,
    _rq_wrid: Box<[u64]>,
    /// For a QP on an SRQ: the memory of the stand-in `rq` (never posted
    /// to: [`SharedQpPoller::post_recv`] refuses), as in the QP it came
    /// from.
    _no_rq: Option<Box<AbsentRq>>,
    /// The QP is on an SRQ: its receives are posted to the SRQ.
    on_srq: bool,
}

/// The retire handle inside a [`SharedQpPoller`] (the send-queue side of
/// its CQ route). There is exactly one per shared QP.
pub struct SharedRetirer<B: Backend>(Arc<SharedQp<B>>);

impl<B: Backend> SqRetire for SharedRetirer<B> {
    #[inline(always)]
    fn retire(&mut self, counter: u16) -> Option<Retired> {
        // SAFETY: exactly one SharedRetirer exists per shared QP (made once in
        // `into_shared`, not Clone), so this is the only retirer.
        unsafe { self.0.sq.retirer() }.retire(counter)
    }
    fn for_each_data_seg(&self, start: u32, f: impl FnMut(u64, u32) -> bool) {
        // SAFETY: as above; this only reads the ring.
        unsafe { self.0.sq.retirer() }.for_each_data_seg(start, f)
    }
    fn set_error(&mut self) {}
}

impl<B: Backend> Qp<B> {
    /// Turns a connected QP with no outstanding sends into a shared one:
    /// a `Sync` posting handle and the poller that owns the completion
    /// side. Posting is lock-free from any number of threads; doorbells
    /// coalesce.
    ///
    /// Needs the mlx5 data path ([`Error::Unsupported`] otherwise, and for
    /// a UD QP, which has no shared UD post yet). A QP on an SRQ can be
    /// shared too: its poller then polls through
    /// [`Srq::route_shared`](super::Srq::route_shared), which completes the
    /// SRQ's receives.
    pub fn into_shared(self) -> Result<(Arc<SharedQp<B>>, SharedQpPoller<B>)> {
        if self.is_ud() {
            return Err(Error::Unsupported);
        }
        let QpPath::Mlx5(q) = &self.path else {
            return Err(Error::Unsupported);
        };
        if q.sq.producer() != q.sq.retired() || q.sq.pending() != 0 {
            return Err(Error::ResourceBusy);
        }
        let cnt = q.dv.sq_wqe_cnt as usize;
        let start = q.sq.producer();
        let mut slots = vec![WrSlot::default(); cnt].into_boxed_slice();
        let ready: Box<[AtomicU32]> = (0..cnt).map(|_| AtomicU32::new(start)).collect();
        let storage = SharedStorage {
            slots: NonNull::new(slots.as_mut_ptr()).ok_or(Error::InvalidGeometry)?,
            ready: NonNull::new(ready.as_ptr() as *mut AtomicU32).ok_or(Error::InvalidGeometry)?,
            len: cnt,
        };
        // SAFETY: the same queue memory the single-owner queue used (kept
        // alive by `_keep`), which stops being used here; the storage is
        // boxed and owned by the SharedQp; the SGE argument of the safe API
        // holds (see `Qp::post_send`).
        let mut sq = unsafe {
            SharedSendQueue::from_raw(
                &q.dv,
                self.qpn,
                self.caps,
                SqConfig::default(),
                storage,
                start,
            )
        }?;
        sq.set_state(q.sq.state());
        // Move the parts out of `self` without running its Drop (which
        // would destroy the QP).
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: each field is read exactly once and `this` is never used
        // or dropped afterwards.
        let (pd, send_cq, recv_cq, path, keep, demand, srq) = unsafe {
            (
                core::ptr::read(&this.pd),
                core::ptr::read(&this._send_cq),
                core::ptr::read(&this._recv_cq),
                core::ptr::read(&this.path),
                core::ptr::read(&this._keep),
                core::ptr::read(&this.demand),
                core::ptr::read(&this.srq),
            )
        };
        let on_srq = srq.is_some();
        let QpPath::Mlx5(Mlx5Queues {
            rq,
            _rq_wrid: rq_wrid,
            _no_rq: no_rq,
            ..
        }) = path
        else {
            // Checked on entry; the path cannot change in between.
            unreachable!("into_shared: path checked above")
        };
        let shared = Arc::new(SharedQp {
            sq,
            qpn: this.qpn,
            pd,
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            demand,
            srq,
            _slots: slots,
            _ready: ready,
            _keep: keep,
        });
        let poller = SharedQpPoller {
            retire: SharedRetirer(Arc::clone(&shared)),
            rq,
            _rq_wrid: rq_wrid,
            _no_rq: no_rq,
            on_srq,
        };
        Ok((shared, poller))
    }
}

impl<B: Backend> SharedQp<B> {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Free send-queue space in BBs (a snapshot).
    pub fn send_space(&self) -> u32 {
        self.sq.free_bbs()
    }
    /// Posts one send WR from any thread. A full queue is
    /// [`Error::SqFull`]; nothing blocks.
    #[inline]
    pub fn post_send_one(&self, wr: &SendWr<'_>) -> Result<()> {
        if self._send_cq.metered() {
            return self
                .post_send_metered(core::slice::from_ref(wr))
                .map_err(|e| e.error);
        }
        // SAFETY: as in `Qp::post_send`: the device checks every SGE.
        unsafe { self.sq.post(wr) }
    }
    /// Posts several send WRs (stops at the first refused one: the WRs
    /// before it are posted, and the error carries its index). Up to 16 WRs
    /// at a time are claimed with one reservation and covered by one
    /// doorbell request, so a list costs about as many shared atomic
    /// operations as a single WR; a list longer than the free space posts
    /// the prefix that fits and refuses the rest with [`Error::SqFull`].
    #[inline]
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        if self._send_cq.metered() {
            return self.post_send_metered(wrs);
        }
        // SAFETY: as in `Qp::post_send`.
        unsafe { self.sq.post_list(wrs) }
    }

    /// As `Qp::post_send_metered` (the shared ring never adds CQEs of its
    /// own: a WQE requests a CQE only if its WR is signaled).
    #[cold]
    fn post_send_metered(&self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let want = signaled(wrs);
        let got = self._send_cq.reserve(want);
        let n = if got == want {
            wrs.len()
        } else {
            fitting_prefix(wrs, 0, got)
        };
        // SAFETY: as in `Qp::post_send`.
        let r = unsafe { self.sq.post_list(&wrs[..n]) };
        let posted = match &r {
            Ok(()) => n,
            Err(e) => e.index,
        };
        self._send_cq
            .unreserve(got.saturating_sub(signaled(&wrs[..posted])));
        r?;
        if n < wrs.len() {
            return Err(PostError {
                index: n,
                error: Error::CqFull,
            });
        }
        Ok(())
    }
}

impl<B: Backend> Drop for SharedQp<B> {
    fn drop(&mut self) {
        // The last handle (poller included) is gone: destroy, then free,
        // and give back what the QP held, as `Qp`'s drop does.
        let _ = self.pd.b.destroy_qp(self.qpn);
        // Relaxed: see `Pd::create_qp`.
        self._send_cq.users.fetch_sub(1, Ordering::Relaxed);
        self._recv_cq.users.fetch_sub(1, Ordering::Relaxed);
        self.demand.release(&self._send_cq, &self._recv_cq);
        if let Some(s) = &self.srq {
            s.detach(&self._recv_cq);
        }
    }
}

impl<B: Backend> SharedQpPoller<B> {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.retire.0.qpn
    }
    /// Posts receive WRs (the receive queue belongs to the poller). A QP on
    /// an SRQ has none: [`Error::InvalidAttribute`] for the first WR,
    /// nothing posted (post to the SRQ), as [`Qp::post_recv`] says.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        if self.on_srq {
            return Err(PostError {
                index: 0,
                error: Error::InvalidAttribute,
            });
        }
        // SAFETY: as in `Qp::post_send`.
        unsafe { self.rq.post_list(wrs) }
    }
}

impl<B: Backend> CqRouteTo<SharedRetirer<B>> for SharedQpPoller<B> {
    #[inline(always)]
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, SharedRetirer<B>>> {
        if qpn == self.retire.0.qpn {
            Some(QpQueues {
                sq: &mut self.retire,
                rq: &mut self.rq,
            })
        } else {
            None
        }
    }
}

impl<B: Backend> CqRouteTo<SharedRetirer<B>> for [&mut SharedQpPoller<B>] {
    #[inline]
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, SharedRetirer<B>>> {
        self.iter_mut()
            .find(|p| p.retire.0.qpn == qpn)
            .map(|p| QpQueues {
                sq: &mut p.retire,
                rq: &mut p.rq,
            })
    }
}

impl<B: Backend> Cq<B> {
    /// Polls completions of shared QPs (one [`SharedQpPoller`] or a slice
    /// of them on this CQ). Allocation- and lock-free.
    #[inline]
    pub fn poll_shared<R: CqRouteTo<SharedRetirer<B>> + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
    ) -> Result<usize> {
        if self.inner.metered() {
            return self.poll_metered(|cq, out| cq.poll_to(route, out), out);
        }
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.poll_to(route, out),
            // Shared QPs exist only on the mlx5 path; a driver CQ has
            // none of their completions to route.
            CqPath::Driver(p) => p.poll(out),
        }
    }
}
