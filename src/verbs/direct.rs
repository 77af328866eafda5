//! The direct data paths on the kernel's software devices: rdma-direct
//! writes rxe and siw WQEs itself into rings it created and mapped
//! ([`super::uverbs`]), rings the doorbell itself (one empty POST_SEND per
//! batch, docs/spec/rxe.md §6 and docs/spec/siw.md §4), and polls the completion rings itself.
//! The kernel is the consumer; libibverbs' rxe/siw providers are not
//! involved beyond the PD and MRs.
//!
//! Behind [`QpDriver`]/[`CqDriver`], with the verbs fallback's
//! bookkeeping ([`QpTrack`], [`CqRegistry`]): the rings carry our own
//! wr_ids (a sequence number per queue; bit 63 marks receives), which the
//! poller maps back to the user's, so send-queue space is exact and an
//! unsignaled run is broken by a forced signal that is retired silently.
//! The codecs ([`crate::provider::rxe`], [`crate::provider::siw`])
//! validate the device-specific rules (siw: no atomics or immediate data,
//! READ with one SGE) and decode completions; kernel-written memory is
//! read once and validated there.

use std::sync::Arc;

use super::path::{CqRegistry, QpTrack, RegistryView, RECV_BIT};
use super::uverbs::{UverbsCq, UverbsQp};
use crate::api::{CqDriver, QpDriver};
use crate::completion::{QpState, Wc};
use crate::error::{Error, PostError, Result};
use crate::provider::{rxe, siw};
use crate::sync::Ordering;
use crate::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

/// WRs handed to a codec per call (one producer publication, at most one
/// doorbell).
pub(super) const BATCH: usize = 32;

/// The send ring of a direct QP.
pub(crate) enum SendRing {
    /// rxe (docs/spec/rxe.md §3).
    Rxe(rxe::RxeSendQueue),
    /// siw (docs/spec/siw.md §2).
    Siw(siw::SiwSendQueue),
}

/// The receive ring of a direct QP.
pub(crate) enum RecvRing {
    /// rxe (docs/spec/rxe.md §4).
    Rxe(rxe::RxeRecvQueue),
    /// siw (docs/spec/siw.md §2).
    Siw(siw::SiwRecvQueue),
}

/// The completion ring of a direct CQ.
pub(crate) enum CqRing {
    /// rxe (docs/spec/rxe.md §5).
    Rxe(rxe::RxeCq),
    /// siw (docs/spec/siw.md §2, §3).
    Siw(siw::SiwCq),
}

impl SendRing {
    /// With `ud`, each WR is a UD send there (rxe only; siw has no UD
    /// QPs, so it never gets one and refuses it).
    ///
    /// # Safety
    /// As the codecs' `post`.
    unsafe fn post(
        &mut self,
        wrs: &[SendWr<'_>],
        ud: Option<&rxe::RxeUdDest>,
    ) -> core::result::Result<bool, PostError> {
        // SAFETY: forwarded contract.
        unsafe {
            match (self, ud) {
                (SendRing::Rxe(q), None) => q.post(wrs).map(|p| p.doorbell),
                (SendRing::Rxe(q), Some(d)) => q.post_ud(wrs, d).map(|p| p.doorbell),
                (SendRing::Siw(q), None) => q.post(wrs).map(|p| p.doorbell),
                (SendRing::Siw(_), Some(_)) => Err(PostError {
                    index: 0,
                    error: Error::Unsupported,
                }),
            }
        }
    }
    /// # Safety
    /// As the codecs' `post_deferred`.
    unsafe fn post_deferred(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                SendRing::Rxe(q) => q.post_deferred(wrs).map(drop),
                SendRing::Siw(q) => q.post_deferred(wrs).map(drop),
            }
        }
    }
    /// Ends a deferred batch (rxe: the producer store; siw: the doorbell
    /// decision); returns how many WRs it covered.
    fn publish(&mut self) -> u32 {
        match self {
            SendRing::Rxe(q) => q.publish(),
            SendRing::Siw(q) => q.publish(),
        }
    }
    fn deferred(&self) -> u32 {
        match self {
            SendRing::Rxe(q) => q.deferred(),
            SendRing::Siw(q) => q.deferred(),
        }
    }
    fn take_doorbell(&mut self) -> bool {
        match self {
            SendRing::Rxe(q) => q.take_doorbell(),
            SendRing::Siw(q) => q.take_doorbell(),
        }
    }
    fn set_state(&mut self, s: QpState) {
        match self {
            SendRing::Rxe(q) => q.set_state(s),
            SendRing::Siw(q) => q.set_state(s),
        }
    }
    fn capacity(&self) -> u32 {
        match self {
            SendRing::Rxe(q) => q.capacity(),
            SendRing::Siw(q) => q.num_sqe(),
        }
    }
}

impl RecvRing {
    /// # Safety
    /// As the codecs' `post`.
    pub(super) unsafe fn post(
        &mut self,
        wrs: &[RecvWr<'_>],
    ) -> core::result::Result<usize, PostError> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                RecvRing::Rxe(q) => q.post(wrs),
                RecvRing::Siw(q) => q.post(wrs),
            }
        }
    }
    fn set_state(&mut self, s: QpState) {
        match self {
            RecvRing::Rxe(q) => q.set_state(s),
            RecvRing::Siw(q) => q.set_state(s),
        }
    }
    pub(super) fn capacity(&self) -> u32 {
        match self {
            RecvRing::Rxe(q) => q.capacity(),
            RecvRing::Siw(q) => q.num_rqe(),
        }
    }
}

/// A QP on the direct path.
pub(crate) struct DirectQp {
    qp: Arc<UverbsQp>,
    /// The CQs outlive the QP in the kernel (a CQ with a QP on it cannot
    /// be destroyed).
    _cqs: [Arc<UverbsCq>; 2],
    sq: SendRing,
    rq: Option<RecvRing>,
    track: Arc<QpTrack>,
    atomics: bool,
    /// Unsignaled sends since the last signaled one.
    unsignaled: u64,
    /// A doorbell for deferred WRs failed: the next ring or post rings
    /// again, so they are not left waiting.
    ring_owed: bool,
    /// A UD QP (rxe): sends go through [`QpDriver::post_send_ud`] only.
    ud: bool,
}

impl DirectQp {
    /// Wraps a created QP and its mapped rings. `track` must hold the
    /// rings' capacities.
    pub(crate) fn new(
        qp: Arc<UverbsQp>,
        cqs: [Arc<UverbsCq>; 2],
        sq: SendRing,
        rq: Option<RecvRing>,
        track: Arc<QpTrack>,
        atomics: bool,
    ) -> DirectQp {
        let mut q = DirectQp {
            qp,
            _cqs: cqs,
            sq,
            rq,
            track,
            atomics,
            unsignaled: 0,
            ring_owed: false,
            ud: false,
        };
        q.state_changed(QpState::Reset);
        q
    }

    /// Marks the QP as a UD one (docs/spec/rxe.md §8): RC posts are
    /// refused, datagrams go through [`QpDriver::post_send_ud`].
    pub(crate) fn datagram(mut self) -> DirectQp {
        self.ud = true;
        self
    }

    /// The capacities a [`QpTrack`] for these rings needs.
    pub(crate) fn ring_capacity(sq: &SendRing, rq: Option<&RecvRing>) -> (u32, u32) {
        (sq.capacity(), rq.map_or(0, RecvRing::capacity))
    }

    /// Rings the doorbell (after WRs were published).
    fn doorbell(&self) -> Result<()> {
        self.qp.doorbell()
    }
}

impl DirectQp {
    /// Posts send WRs; with `marker`, each is recorded as a drain marker
    /// (only ever one, from [`QpDriver::post_drain_marker`]). With `defer`
    /// they are written into the ring without the doorbell (rxe: without
    /// the producer store either), which [`QpDriver::ring`] or the next
    /// post without `defer` gives them and every WR deferred before.
    #[inline(always)]
    fn send_list(
        &mut self,
        wrs: &[SendWr<'_>],
        marker: bool,
        defer: bool,
        ud: Option<&rxe::RxeUdDest>,
    ) -> core::result::Result<(), PostError> {
        let t = &*self.track;
        if !(t.state() == QpState::Rts as u32 || t.state() == QpState::Error as u32) {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        // WRs deferred before this call: a failed doorbell leaves them
        // owed (they are published, and were accepted).
        let had_deferred = !defer && self.sq.deferred() != 0;
        let blank = SendWr::new(0, SendOp::Send, &[], SendFlags::NONE);
        let mut buf = [blank; BATCH];
        let mut done = 0usize;
        while done < wrs.len() {
            // Relaxed: this thread is the only writer of sq_posted.
            let base = t.sq_posted.load(Ordering::Relaxed);
            // Acquire: pairs with the poller's Release of sq_done, so the
            // slots it has read are free to overwrite.
            let retired = t.sq_done.load(Ordering::Acquire);
            let unsignaled_before = self.unsignaled;
            let mut n = 0usize;
            let mut refused = None;
            while done + n < wrs.len() && n < BATCH {
                let wr = &wrs[done + n];
                // The ring's encoder validates each WR (typed errors, before
                // writing anything), so only what it cannot know is checked
                // here; a WR it refuses comes back from `post` below.
                let check = t.check_send_unvalidated(wr, self.atomics, base + n as u64 - retired);
                if let Err(e) = check {
                    refused = Some(e);
                    break;
                }
                let seq = base + n as u64;
                buf[n] = SendWr {
                    wr_id: seq,
                    flags: t.record_send(seq, wr, &mut self.unsignaled),
                    ..*wr
                };
                if marker {
                    t.mark_drain(seq);
                }
                n += 1;
            }
            if n > 0 {
                // Release: the slots before the kernel may complete them.
                t.sq_posted.store(base + n as u64, Ordering::Release);
                // SAFETY: SGEs name memory registered with this device
                // (checked by the kernel against its MR table, lkey, PD
                // and access, before any access); inline payloads are the
                // caller's slices, copied into the WQE before return.
                let posted = unsafe {
                    if defer {
                        self.sq.post_deferred(&buf[..n]).map(|()| false)
                    } else {
                        self.sq.post(&buf[..n], ud)
                    }
                };
                match posted {
                    Ok(doorbell) => {
                        // A failed doorbell of deferred WRs is owed too.
                        let doorbell = doorbell | (!defer && core::mem::take(&mut self.ring_owed));
                        if doorbell {
                            if let Err(e) = self.doorbell() {
                                // Published but not rung: the kernel may
                                // still run or flush them. Their
                                // completions (if any) are retired
                                // silently; a later one or RESET retires
                                // them otherwise.
                                QpTrack::refuse(
                                    &t.sq,
                                    t.sq_mask,
                                    &t.sq_posted,
                                    base,
                                    base + n as u64,
                                );
                                self.ring_owed = had_deferred;
                                return Err(PostError {
                                    index: done,
                                    error: e,
                                });
                            }
                        }
                        done += n;
                    }
                    Err(e) => {
                        // WRs before `e.index` are published; the refused
                        // one and those after it were never written, so
                        // their sequence numbers are handed back (no
                        // completion can name them).
                        t.sq_posted.store(base + e.index as u64, Ordering::Release);
                        // The unsignaled run as it stood after the last
                        // published WR (`record_send` counted the refused
                        // ones too): replayed from the flags handed to the
                        // ring, forced signals included.
                        self.unsignaled = buf[..e.index].iter().fold(unsignaled_before, |u, w| {
                            if w.flags.contains(SendFlags::SIGNALED) {
                                0
                            } else {
                                u + 1
                            }
                        });
                        // Deferred: nothing is rung (the batch goes on).
                        let rung = if !defer && self.sq.take_doorbell() {
                            self.doorbell()
                        } else {
                            Ok(())
                        };
                        return Err(PostError {
                            index: done + e.index,
                            error: rung.err().unwrap_or(e.error),
                        });
                    }
                }
            }
            if let Some(e) = refused {
                return Err(PostError {
                    index: done,
                    error: e,
                });
            }
        }
        Ok(())
    }
}

impl DirectQp {
    /// An RC post on a UD QP: it has no address handle, so it is refused
    /// (as the fallback refuses it).
    #[inline(always)]
    fn refuse_on_ud(&self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        if self.ud && !wrs.is_empty() {
            return Err(PostError {
                index: 0,
                error: Error::InvalidAttribute,
            });
        }
        Ok(())
    }
}

impl QpDriver for DirectQp {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        self.refuse_on_ud(wrs)?;
        self.send_list(wrs, false, false, None)
    }

    fn post_send_deferred(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        self.refuse_on_ud(wrs)?;
        self.send_list(wrs, false, true, None)
    }

    fn post_send_ud(
        &mut self,
        wr: &SendWr<'_>,
        ah: crate::api::DriverAh,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<()> {
        super::ud::check_ud_send(self.ud, wr, remote_qpn)?;
        if self.track.state() != QpState::Rts as u32 {
            return Err(Error::InvalidQpState);
        }
        // IBA vol. 1 §10.2.4: a Q_Key with bit 31 set means the QP's own;
        // rxe puts the WQE's value in the DETH as it is (docs/spec/rxe.md
        // §8), so it is resolved here.
        let qkey = if qkey & crate::api::OWN_QKEY != 0 {
            // Relaxed: stored by this thread when the QP was made ready.
            self.track.qkey.load(Ordering::Relaxed)
        } else {
            qkey
        };
        // The token is the `ah_num` this backend's CREATE_AH answered
        // (`create_driver_ah`); the kernel checks it names an address
        // handle of this QP's PD when it sends.
        let dest = rxe::RxeUdDest {
            ah_num: u32::try_from(ah.token).map_err(|_| Error::InvalidAttribute)?,
            remote_qpn,
            qkey,
        };
        // Published at once with any WRs deferred before (none: a UD QP
        // refuses deferred posts), and rung.
        self.send_list(core::slice::from_ref(wr), false, false, Some(&dest))
            .map_err(|e| e.error)
    }

    fn ring(&mut self) -> Result<bool> {
        // rxe: one producer store for the batch; siw: one doorbell
        // decision (docs/spec/siw.md §4). Then at most one system call.
        let covered = self.sq.publish();
        let owed = self.sq.take_doorbell() | core::mem::take(&mut self.ring_owed);
        if owed {
            if let Err(e) = self.doorbell() {
                // Published and counted outstanding: ring again next time.
                self.ring_owed = true;
                return Err(e);
            }
        }
        Ok(covered != 0 || owed)
    }

    fn deferred(&self) -> u32 {
        self.sq.deferred()
    }

    fn can_defer(&self) -> bool {
        true
    }

    fn post_drain_marker(&mut self) -> Result<bool> {
        let t = &*self.track;
        if t.state() != QpState::Error as u32 {
            return Err(Error::InvalidQpState);
        }
        if t.sends_outstanding() == 0 || t.last_send_is_marker() {
            return Ok(false);
        }
        if self.ud {
            // A UD QP cannot carry the marker's RDMA WRITE: the poller
            // reports it, as on the fallback.
            t.post_stranded_marker()?;
            self.unsignaled = 0;
            return Ok(true);
        }
        if let SendRing::Siw(_) = self.sq {
            // siw never picks up what is written to a user SQ in ERROR
            // (see `state_changed`): the marker stays with the poller.
            t.post_stranded_marker()?;
            self.unsignaled = 0;
            return Ok(true);
        }
        // rxe flushes every WQE of its ring in ERROR, in order.
        let wr = super::path::drain_marker_wr();
        // Not deferred: it publishes and rings every WR deferred before it,
        // so the kernel flushes them in order ahead of it.
        self.send_list(core::slice::from_ref(&wr), true, false, None)
            .map_err(|e| e.error)?;
        Ok(true)
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let t = &*self.track;
        if t.state() == QpState::Reset as u32 {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        let Some(rq) = self.rq.as_mut() else {
            // A QP on an SRQ has no receive queue: refused as the software
            // device and the fallback refuse it (receives go to the SRQ).
            let error = if t.srq.is_some() {
                Error::InvalidAttribute
            } else {
                Error::RqFull
            };
            return Err(PostError { index: 0, error });
        };
        let none: &[Sge] = &[];
        let mut buf = [RecvWr {
            wr_id: 0,
            sges: none,
        }; BATCH];
        let mut done = 0usize;
        while done < wrs.len() {
            // Relaxed: only this thread writes rq_posted.
            let base = t.rq_posted.load(Ordering::Relaxed);
            // Acquire: pairs with the poller's Release of rq_done.
            let retired = t.rq_done.load(Ordering::Acquire);
            let mut n = 0usize;
            let mut refused = None;
            while done + n < wrs.len() && n < BATCH {
                let wr = &wrs[done + n];
                // Room only: the ring's encoder validates each WR before
                // writing anything, and a WR it refuses comes back from
                // `post` below (as for sends).
                if base + n as u64 - retired >= t.rq_cap {
                    refused = Some(Error::RqFull);
                    break;
                }
                let seq = base + n as u64;
                buf[n] = RecvWr {
                    wr_id: seq | RECV_BIT,
                    sges: wr.sges,
                };
                t.record_recv(seq, wr);
                n += 1;
            }
            if n > 0 {
                // Release: the slots before the kernel may complete them.
                t.rq_posted.store(base + n as u64, Ordering::Release);
                // SAFETY: as in `post_send` (the kernel checks every SGE
                // before writing). No system call: the kernel reads the
                // ring when a message arrives (docs/spec/rxe.md §4, docs/spec/siw.md §3).
                if let Err(e) = unsafe { rq.post(&buf[..n]) } {
                    t.rq_posted.store(base + e.index as u64, Ordering::Release);
                    return Err(PostError {
                        index: done + e.index,
                        error: e.error,
                    });
                }
                done += n;
            }
            if let Some(e) = refused {
                return Err(PostError {
                    index: done,
                    error: e,
                });
            }
        }
        Ok(())
    }

    super::path::track_accessors!();

    fn state_changed(&mut self, state: QpState) {
        self.track.set_state(state);
        if state == QpState::Error {
            if let SendRing::Siw(q) = &mut self.sq {
                // siw completes (flushes) only the SQEs its transmit
                // engine has picked up; after a dropped connection the rest
                // stay in the ring for good. Take them back and have the
                // poller report them flushed, so no WR is lost.
                // Deferred SQEs are VALID already (docs/spec/siw.md §3), so
                // they are taken back with the rest.
                let mut seqs = std::vec::Vec::new();
                q.reclaim(|id| seqs.push(id));
                seqs.sort_unstable();
                self.track.add_stranded(&seqs);
                q.forget_deferred();
                self.ring_owed = false;
            }
        }
        // The codecs refuse what the state forbids; ERROR still takes WRs
        // (the kernel flushes them), as the other paths do.
        let ring_state = if state == QpState::Error {
            QpState::Rts
        } else {
            state
        };
        self.sq.set_state(ring_state);
        if let Some(rq) = self.rq.as_mut() {
            rq.set_state(if state == QpState::Reset {
                QpState::Reset
            } else {
                QpState::Rts
            });
        }
        if state == QpState::Reset {
            // The kernel emptied the queues (rxe zeroes both indices).
            self.track.reset();
            self.unsignaled = 0;
            self.ring_owed = false;
            match &mut self.sq {
                // Deferred WQEs are dropped with the rest.
                SendRing::Rxe(q) => q.resync(),
                SendRing::Siw(q) => q.forget_deferred(),
            }
            if let Some(RecvRing::Rxe(q)) = &mut self.rq {
                q.resync();
            }
        }
    }
}

/// A CQ on the direct path.
pub(crate) struct DirectCq {
    cq: Arc<UverbsCq>,
    ring: CqRing,
    view: RegistryView,
}

impl DirectCq {
    /// Wraps a created CQ and its mapped ring.
    pub(crate) fn new(cq: Arc<UverbsCq>, ring: CqRing, registry: Arc<CqRegistry>) -> DirectCq {
        DirectCq {
            cq,
            ring,
            view: RegistryView::new(registry),
        }
    }

    /// Entries the ring holds.
    pub(crate) fn ring_depth(ring: &CqRing) -> u32 {
        match ring {
            CqRing::Rxe(c) => c.depth(),
            CqRing::Siw(c) => c.depth(),
        }
    }

    fn notify(&mut self, solicited_only: bool) -> Result<()> {
        match &mut self.ring {
            // rxe has no shared-memory arm: a REQ_NOTIFY_CQ command.
            CqRing::Rxe(_) => self.cq.req_notify(solicited_only),
            // siw arms through the control word after the ring (docs/spec/siw.md §3).
            CqRing::Siw(c) => {
                c.arm(solicited_only);
                Ok(())
            }
        }
    }
}

impl CqDriver for DirectCq {
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        self.view.refresh();
        let mut filled = 0usize;
        while filled < out.len() {
            let want = out.len() - filled;
            let dst = &mut out[filled..];
            let got = match &mut self.ring {
                CqRing::Rxe(c) => c.poll(dst),
                CqRing::Siw(c) => c.poll(dst),
            };
            let got = match got {
                Ok(n) => n.min(want),
                // A corrupt entry after good ones is left for the next
                // call by the codec; first in a call, it is reported.
                Err(e) if filled == 0 => return Err(e),
                Err(_) => break,
            };
            // Compact: keep the completions the user asked for.
            let mut kept = 0usize;
            for i in 0..got {
                let mut w = out[filled + i];
                if self.view.finish(&mut w)? {
                    out[filled + kept] = w;
                    kept += 1;
                }
            }
            filled += kept;
            if got < want {
                break;
            }
        }
        if filled < out.len() {
            // WRs the kernel will never complete (see `DirectQp`).
            filled += self.view.stranded(&mut out[filled..])?;
        }
        Ok(filled)
    }

    fn depth(&self) -> u32 {
        DirectCq::ring_depth(&self.ring)
    }

    fn arm(&mut self) -> Result<()> {
        self.notify(false)
    }

    fn arm_solicited(&mut self) -> Result<()> {
        self.notify(true)
    }
}
