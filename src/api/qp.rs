//! A queue pair ([`Qp`], RC, or UD through `api::ud`): its data path,
//! state changes, connecting and posting, and the CQ routes to its queues.

use std::any::Any;
use std::boxed::Box;
use std::sync::Arc;
use std::vec;

use core::ptr::NonNull;

use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::rq::AbsentRq;
use crate::provider::mlx5::{CqRoute, Mlx5dvQp, QpQueues, RecvQueue, SendQueue, SqConfig, WrSlot};
use crate::sync::Ordering;
use crate::wr::{QpCaps, RecvWr, SendWr};

use super::connect::checked_connect_steps;
use super::cq::{CqDemand, CqInner};
use super::device::PdInner;
use super::srq::SrqInner;
use super::{
    connect_steps_for, fitting_prefix, signaled, Backend, ConnectAttr, QpConnection, QpDriver,
    QpInfo, QpModify, QpState, Transport,
};

/// A queue pair: RC ([`super::Pd::create_qp`]) or UD
/// ([`super::Pd::create_ud_qp`]). Posting needs `&mut`: one owner posts (later issues
/// add lock-free sharing).
pub struct Qp<B: Backend> {
    pub(super) demand: CqDemand,
    pub(super) pd: Arc<PdInner<B>>,
    pub(super) _send_cq: Arc<CqInner<B>>,
    pub(super) _recv_cq: Arc<CqInner<B>>,
    pub(super) qpn: u32,
    pub(super) caps: QpCaps,
    pub(super) psn: u32,
    pub(super) path: QpPath,
    /// What the last successful [`Qp::connect`] used (cleared by RESET).
    pub(super) connection: Option<QpConnection>,
    /// The SRQ this QP takes its receives from ([`QpInit::srq`](super::QpInit::srq)).
    pub(super) srq: Option<Arc<SrqInner<B>>>,
    /// A UD QP's message limit, the port's MTU at creation (0: an RC QP).
    pub(super) ud_mtu: u32,
    pub(super) _keep: Arc<dyn Any + Send + Sync>,
}

/// The data path behind a [`Qp`]. The mlx5 queues stay inline (no extra
/// pointer chase on the post path), hence the size difference.
#[allow(clippy::large_enum_variant)]
pub(super) enum QpPath {
    /// The crate's mlx5 core.
    Mlx5(Mlx5Queues),
    /// A provider-posted QP.
    Driver(Box<dyn QpDriver>),
}

/// The mlx5 queues of a QP.
pub(super) struct Mlx5Queues {
    pub(super) sq: SendQueue,
    pub(super) rq: RecvQueue,
    // Side tables the queues point into; boxed so moves keep them put.
    _sq_wrid: Box<[WrSlot]>,
    pub(super) _rq_wrid: Box<[u64]>,
    pub(super) dv: Mlx5dvQp,
    /// For a QP on an SRQ, which has no receive queue: the memory of the
    /// one-entry stand-in `rq` (never posted to, never seen by the device),
    /// so the CQ routes keep their shape.
    pub(super) _no_rq: Option<Box<AbsentRq>>,
}

// SAFETY: the raw queue descriptor (`dv`) only names memory kept alive by
// `_keep`; the queues inside are `Send`, and a Qp is used by one thread at
// a time (`&mut` for every data-path call).
unsafe impl<B: Backend> Send for Qp<B> {}

impl Mlx5Queues {
    /// Builds the core's queues over a backend's mlx5 descriptor.
    pub(super) fn new(dv: Mlx5dvQp, qpn: u32, caps: QpCaps, ud: bool) -> Result<Mlx5Queues> {
        Self::build(dv, qpn, caps, None, ud)
    }

    /// Builds the queues of a QP on an SRQ: the descriptor has no receive
    /// queue (`rq_wqe_cnt` 0), so the core's `rq` is the stand-in
    /// [`AbsentRq`] over private memory. [`Qp::post_recv`] refuses before
    /// reaching it, and the device never reads it.
    pub(super) fn new_on_srq(dv: Mlx5dvQp, qpn: u32, caps: QpCaps, ud: bool) -> Result<Mlx5Queues> {
        Self::build(dv, qpn, caps, Some(Box::new(AbsentRq::new())), ud)
    }

    fn build(
        dv: Mlx5dvQp,
        qpn: u32,
        caps: QpCaps,
        mut no_rq: Option<Box<AbsentRq>>,
        ud: bool,
    ) -> Result<Mlx5Queues> {
        let mut sq_wrid = vec![WrSlot::default(); dv.sq_wqe_cnt as usize].into_boxed_slice();
        // The stand-in has its own side-table slot.
        let rq_slots = if no_rq.is_some() { 0 } else { dv.rq_wqe_cnt };
        let mut rq_wrid = vec![0u64; rq_slots as usize].into_boxed_slice();
        let sq_slots = NonNull::new(sq_wrid.as_mut_ptr()).ok_or(Error::InvalidGeometry)?;
        // SAFETY: the descriptor names queue memory kept alive by the
        // backend's `keep` (held by the Qp next to these queues); the side
        // tables are boxed and owned alongside; SGEs posted through the safe
        // API are checked by the device against registered regions before
        // any access, and scatter-to-CQE is disabled on the pollers.
        let mut sq = unsafe {
            if ud {
                SendQueue::from_raw_ud(&dv, qpn, caps, SqConfig::default(), sq_slots, sq_wrid.len())
            } else {
                SendQueue::from_raw(&dv, qpn, caps, SqConfig::default(), sq_slots, sq_wrid.len())
            }
        }?;
        let mut rq = match no_rq.as_deref_mut() {
            // SAFETY: as above.
            None => unsafe {
                RecvQueue::from_raw(
                    &dv,
                    &caps,
                    NonNull::new(rq_wrid.as_mut_ptr()).ok_or(Error::InvalidGeometry)?,
                    rq_wrid.len(),
                )
            }?,
            // SAFETY: the stand-in's memory is boxed (it never moves) and
            // owned by the returned queues next to the queue made over it.
            Some(m) => unsafe { m.queue() }?,
        };
        sq.set_state(QpState::Reset);
        rq.set_state(QpState::Reset);
        Ok(Mlx5Queues {
            sq,
            rq,
            _sq_wrid: sq_wrid,
            _rq_wrid: rq_wrid,
            dv,
            _no_rq: no_rq,
        })
    }
}

impl<B: Backend> Qp<B> {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Granted capabilities.
    pub fn caps(&self) -> &QpCaps {
        &self.caps
    }
    /// Current state as this handle knows it (on the mlx5 path, error
    /// completions move it to ERROR).
    pub fn state(&self) -> QpState {
        match &self.path {
            QpPath::Mlx5(q) => q.sq.state(),
            QpPath::Driver(p) => p.state(),
        }
    }
    /// Free send-queue space: 64-byte basic blocks on the mlx5 path, WRs
    /// on a driver path (the unit a WR of the smallest shape uses).
    pub fn send_space(&self) -> u32 {
        match &self.path {
            QpPath::Mlx5(q) => q.sq.free_bbs(),
            QpPath::Driver(p) => p.send_space(),
        }
    }
    /// The first WR that failed since the QP was created or last went
    /// through RESET, as it was posted (opcode, local and remote address,
    /// length, keys), with its status, vendor syndrome and
    /// [`FailedWr::likely_causes`](crate::wr::FailedWr::likely_causes).
    /// Flush errors do not count: this is the WR that broke the QP.
    pub fn failure(&self) -> Option<crate::wr::FailedWr> {
        match &self.path {
            QpPath::Mlx5(q) => q.sq.failure().or(q.rq.failure()),
            QpPath::Driver(p) => p.failure(),
        }
    }
    /// The SRQ this QP takes its receives from, if it was created on one.
    pub fn srqn(&self) -> Option<u32> {
        self.srq.as_ref().map(|s| s.srqn)
    }
    /// This QP's initial send PSN.
    pub fn psn(&self) -> u32 {
        self.psn
    }
    /// The device this QP lives on.
    pub fn backend(&self) -> &B {
        &self.pd.b
    }
    /// Records a state change made outside [`Qp::modify`] (rdma_cm moves
    /// QPs itself, and on iWARP the kernel does).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn set_known_state(&mut self, state: QpState) {
        match &mut self.path {
            QpPath::Mlx5(q) => {
                q.sq.set_state(state);
                q.rq.set_state(state);
            }
            QpPath::Driver(p) => p.state_changed(state),
        }
    }
    /// Connection data to give the peer.
    pub fn info(&self) -> QpInfo {
        let p = self.pd.b.port();
        QpInfo {
            qpn: self.qpn,
            psn: self.psn,
            lid: p.lid,
            gid: p.gid,
            mtu: p.mtu,
        }
    }

    /// Moves the QP to `m.state`. The attributes the target state uses are
    /// checked first ([`QpModify::validate`]), then by the device; a
    /// refused change leaves the QP as it was.
    pub fn modify(&mut self, m: &QpModify) -> Result<()> {
        m.validate()?;
        self.pd.b.modify_qp(self.qpn, m)?;
        match &mut self.path {
            QpPath::Mlx5(q) => {
                if m.state == QpState::Reset {
                    q.sq.reset_counters(0);
                    q.rq.reset_counters(0);
                }
                q.sq.set_state(m.state);
                q.rq.set_state(m.state);
            }
            QpPath::Driver(p) => p.state_changed(m.state),
        }
        if m.state == QpState::Reset {
            self.connection = None;
        }
        Ok(())
    }

    /// The three state changes of [`Qp::connect`], without applying them:
    /// INIT, RTR (towards `remote`) and RTS. On RoCE the GRH is always set
    /// (from `attr`'s GID index, hop limit and traffic class); on
    /// InfiniBand only when the peer has no LID.
    pub fn connect_steps(&self, remote: &QpInfo, attr: &ConnectAttr) -> [QpModify; 3] {
        connect_steps_for(&self.pd.b.port(), self.psn, remote, attr)
    }

    /// RESET → INIT → RTR → RTS towards `remote` (connection data
    /// exchanged out of band). iWARP QPs connect only through rdma_cm and
    /// get [`Error::Unsupported`] here.
    ///
    /// A refused connect changes nothing: `remote` and `attr` are checked
    /// in full first ([`QpInfo::validate`], [`ConnectAttr::validate`]:
    /// [`Error::InvalidAttribute`]), a QP not in RESET is
    /// [`Error::InvalidQpState`], and a step the device refuses part-way
    /// (a limit only it knows, such as a rate limit it cannot pace) moves
    /// the QP back to RESET before the error is returned. A UD QP
    /// connects to nothing ([`Error::InvalidAttribute`]; see
    /// [`Qp::ready_ud`]).
    pub fn connect(&mut self, remote: &QpInfo, attr: &ConnectAttr) -> Result<()> {
        if self.is_ud() {
            // A UD QP has no peer: `Qp::ready_ud`.
            return Err(Error::InvalidAttribute);
        }
        let port = self.pd.b.port();
        if port.transport == Transport::Iwarp {
            return Err(Error::Unsupported);
        }
        let steps = checked_connect_steps(&port, self.psn, remote, attr)?;
        if self.state() != QpState::Reset {
            return Err(Error::InvalidQpState);
        }
        for (i, m) in steps.iter().enumerate() {
            if let Err(e) = self.modify(m) {
                if i > 0 {
                    // Back to where the call started. RESET is always
                    // allowed; nothing was posted in between (`&mut self`).
                    let _ = self.modify(&QpModify::to(QpState::Reset));
                }
                return Err(e);
            }
        }
        self.connection = Some(QpConnection {
            remote: *remote,
            attr: *attr,
            path_mtu: steps[1].path_mtu,
            sq_psn: self.psn,
        });
        Ok(())
    }

    /// Posts send WRs with one doorbell. Stops at the first invalid WR:
    /// the ones before it are posted, and the error comes with the failed
    /// WR's index. Nothing is written for the failed WR.
    #[inline]
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        if self._send_cq.metered() {
            return self.post_send_metered(wrs);
        }
        match &mut self.path {
            // SAFETY: SGEs only reach the device, which checks every one
            // against registered regions (lkey, bounds, PD, access) before
            // any access; scatter-to-CQE is disabled on the API's pollers.
            QpPath::Mlx5(q) => unsafe { q.sq.post_list(wrs) },
            QpPath::Driver(p) => p.post_send(wrs),
        }
    }

    /// Posts send WRs as [`Qp::post_send`] does, leaving the doorbell for
    /// a later [`Qp::ring`] or `post_send` where the data path can defer:
    /// the direct rxe/siw rings ([`QpDriver::post_send_deferred`]; the
    /// WRs count as outstanding at once, and recovery flushes them). On
    /// the other paths, and with a send CQ outside the sizing guard, it is
    /// `post_send`: deferral is only a batching hint there.
    pub fn post_send_deferred(
        &mut self,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), PostError> {
        if !self._send_cq.metered() {
            if let QpPath::Driver(p) = &mut self.path {
                return p.post_send_deferred(wrs);
            }
        }
        self.post_send(wrs)
    }

    /// Rings for every WR [`Qp::post_send_deferred`] left pending, with
    /// one provider call: `Ok(true)` if it made one, `Ok(false)` if
    /// nothing was pending (nothing happens). See [`QpDriver::ring`].
    pub fn ring(&mut self) -> Result<bool> {
        match &mut self.path {
            QpPath::Driver(p) => p.ring(),
            QpPath::Mlx5(_) => Ok(false),
        }
    }

    /// Posts one send WR and rings the doorbell.
    #[inline]
    pub fn post_send_one(&mut self, wr: &SendWr<'_>) -> Result<()> {
        if self._send_cq.metered() {
            return self
                .post_send_metered(core::slice::from_ref(wr))
                .map_err(|e| e.error);
        }
        match &mut self.path {
            // SAFETY: as in `post_send`.
            QpPath::Mlx5(q) => unsafe { q.sq.post_one(wr) },
            QpPath::Driver(p) => p.post_send(core::slice::from_ref(wr)).map_err(|e| e.error),
        }
    }

    /// Posts receive WRs with one doorbell-record update.
    ///
    /// A QP created on an SRQ ([`QpInit::srq`](super::QpInit::srq)) has no
    /// receive queue of its own: its receives go to
    /// [`Srq::post_recv`](super::Srq::post_recv), and posting here is
    /// [`Error::InvalidAttribute`] with nothing written (as rxe's
    /// `EINVAL`).
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError {
                index: 0,
                error: Error::InvalidAttribute,
            });
        }
        if self._recv_cq.metered() {
            return self.post_recv_metered(wrs);
        }
        self.post_recv_raw(wrs)
    }

    #[inline(always)]
    fn post_recv_raw(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        match &mut self.path {
            // SAFETY: as in `post_send`.
            QpPath::Mlx5(q) => unsafe { q.rq.post_list(wrs) },
            QpPath::Driver(p) => p.post_recv(wrs),
        }
    }

    /// `post_send` on a QP whose send CQ opted out of the sizing guard:
    /// posts only the WRs whose completions fit in the CQ's headroom, and
    /// refuses the first one that does not with [`Error::CqFull`].
    #[cold]
    fn post_send_metered(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        // The mlx5 core may add one CQE of its own at the doorbell (the
        // signalling guard, docs/spec/mlx5.md §9); room for it is kept back.
        let extra = u64::from(matches!(self.path, QpPath::Mlx5(_)));
        let want = signaled(wrs) + extra;
        let cq = Arc::clone(&self._send_cq);
        let got = cq.reserve(want);
        let n = if got == want {
            wrs.len()
        } else {
            fitting_prefix(wrs, extra, got)
        };
        let (r, forced) = match &mut self.path {
            QpPath::Mlx5(q) => {
                let f = q.sq.forced_signals();
                // SAFETY: as in `post_send`.
                let r = unsafe { q.sq.post_list(&wrs[..n]) };
                (r, q.sq.forced_signals().wrapping_sub(f))
            }
            QpPath::Driver(p) => (p.post_send(&wrs[..n]), 0),
        };
        let posted = match &r {
            Ok(()) => n,
            Err(e) => e.index,
        };
        let used = signaled(&wrs[..posted]) + u64::from(forced);
        cq.unreserve(got.saturating_sub(used));
        r?;
        if n < wrs.len() {
            return Err(PostError {
                index: n,
                error: Error::CqFull,
            });
        }
        Ok(())
    }

    /// `post_recv` on a QP whose receive CQ opted out of the sizing guard
    /// (every receive completes once).
    #[cold]
    fn post_recv_metered(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let want = wrs.len() as u64;
        let cq = Arc::clone(&self._recv_cq);
        let got = cq.reserve(want);
        let n = got as usize;
        let r = self.post_recv_raw(&wrs[..n]);
        let posted = match &r {
            Ok(()) => n,
            Err(e) => e.index,
        };
        cq.unreserve(got - posted as u64);
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

impl<B: Backend> Drop for Qp<B> {
    fn drop(&mut self) {
        // Destroy first: the device stops touching the queues; the memory
        // and side tables are freed afterwards with the fields.
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

impl<B: Backend> CqRoute for Qp<B> {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        match &mut self.path {
            QpPath::Mlx5(q) if qpn == self.qpn => Some(QpQueues {
                sq: &mut q.sq,
                rq: &mut q.rq,
            }),
            _ => None,
        }
    }
}

impl<B: Backend> CqRoute for [&mut Qp<B>] {
    #[inline]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.iter_mut()
            .find(|q| q.qpn == qpn)
            .and_then(|q| q.route(qpn))
    }
}
