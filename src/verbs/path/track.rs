//! [`QpTrack`]: the wr_id bookkeeping of one QP (its send and receive
//! slots), shared by the verbs fallback and the direct rxe/siw data paths.

use std::boxed::Box;
use std::sync::{Arc, Mutex};

use super::srq::SrqTrack;
use std::vec::Vec;

use crate::completion::{QpState, WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::wr::{validate_send, Payload, QpCaps, RecvWr, SendFlags, SendOp, SendWr};

/// wr_id bit that marks a receive.
pub(crate) const RECV_BIT: u64 = 1 << 63;
/// Slot flag: the user asked for a completion.
pub(crate) const USER_SIGNALED: u32 = 1;
/// Slot flag: the provider refused the WR (the user got a PostError). Some
/// providers (siw) may still have queued it and flush it later; its
/// completion, if one comes, is retired without being reported.
pub(crate) const REFUSED: u32 = 2;
/// Slot flag: the provider was asked for a completion (the user's or a
/// forced one): retirement waits for it.
pub(crate) const SIGNALED: u32 = 4;
/// Slot flag: its completion was seen (set by the poller).
const DONE: u32 = 8;
/// Slot flag: recovery's drain marker ([`QpTrack::mark_drain`]): signaled,
/// its completion retires the sends before it and is never reported.
pub(crate) const DRAIN: u32 = 16;

/// One posted WR: the user's wr_id, whether to report it, and what it was
/// (for [`crate::wr::FailedWr`]): first local buffer, remote address,
/// `length << 32 | lkey`, `rkey << 32 | opcode << 8 | inline`.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) wr_id: AtomicU64,
    pub(crate) flags: AtomicU32,
    detail: [AtomicU64; 4],
}

impl Slot {
    /// Stores the WR's shape (Relaxed: published with the slot by the
    /// Release store of the posted counter).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn describe(
        &self,
        laddr: u64,
        raddr: u64,
        len: u32,
        lkey: u32,
        rkey: u32,
        op: u32,
        inline: bool,
    ) {
        self.detail[0].store(laddr, Ordering::Relaxed);
        self.detail[1].store(raddr, Ordering::Relaxed);
        self.detail[2].store(u64::from(len) << 32 | u64::from(lkey), Ordering::Relaxed);
        self.detail[3].store(
            u64::from(rkey) << 32 | u64::from(op) << 8 | u64::from(inline),
            Ordering::Relaxed,
        );
    }

    /// The stored shape as a FailedWr (Relaxed: ordered by the poller's
    /// Acquire of the posted counter).
    fn failed(&self, user: u64, status: u32, vendor_err: u32, recv: bool) -> crate::wr::FailedWr {
        let d: [u64; 4] = core::array::from_fn(|i| self.detail[i].load(Ordering::Relaxed));
        crate::wr::FailedWr {
            wr_id: user,
            status: WcStatus(status),
            vendor_err,
            syndrome: 0,
            recv,
            opcode: WcOpcode(((d[3] >> 8) & 0xff) as u32),
            local_addr: d[0],
            length: (d[2] >> 32) as u32,
            lkey: d[2] as u32,
            remote_addr: d[1],
            rkey: (d[3] >> 32) as u32,
            inline: d[3] & 1 != 0,
        }
    }
}

/// The wr_id bookkeeping of one QP, shared by its poster ([`VerbsQp`](super::VerbsQp))
/// and the pollers of its CQs ([`VerbsCq`](super::VerbsCq)).
///
/// Sequence numbers only grow. The poster writes a slot, then publishes
/// with a Release store of `*_posted` *before* handing the WR to the
/// provider, so a poller that sees the WR's completion (which cannot exist
/// before the provider call) and Acquire-loads `*_posted` sees the slot.
/// The poller publishes retirement with a Release store of `*_done`; the
/// poster Acquire-loads it before reusing slots.
pub struct QpTrack {
    pub(super) qpn: u32,
    pub(crate) sq: Box<[Slot]>,
    pub(crate) sq_mask: u64,
    pub(crate) sq_cap: u64,
    pub(crate) rq: Box<[Slot]>,
    pub(crate) rq_mask: u64,
    pub(crate) rq_cap: u64,
    pub(crate) sq_posted: AtomicU64,
    pub(crate) sq_done: AtomicU64,
    /// One past the newest send completion seen (poller only).
    pub(crate) sq_hi: AtomicU64,
    pub(crate) rq_posted: AtomicU64,
    pub(crate) rq_done: AtomicU64,
    state: AtomicU32,
    /// The first failed WR since creation or RESET (cold path).
    failure: Mutex<Option<crate::wr::FailedWr>>,
    /// Send WRs (our sequence numbers) the device will never complete,
    /// taken back from its ring: the poller reports them flushed (cold
    /// path; see `DirectQp`).
    stranded: Mutex<Vec<u64>>,
    /// `stranded` is not empty (checked by the poller without the lock).
    has_stranded: AtomicU32,
    /// The SRQ the QP takes its receives from ([`QpTrack::on_srq`]).
    pub(crate) srq: Option<Arc<SrqTrack>>,
    /// A UD QP's own Q_Key (set when it is made ready), for sends that
    /// ask for it ([`crate::api::OWN_QKEY`]): rxe sends the WR's value
    /// as it is.
    pub(crate) qkey: AtomicU32,
}

impl QpTrack {
    /// Tables for a QP that holds `sq_cap` sends and `rq_cap` receives.
    pub fn new(qpn: u32, sq_cap: u32, rq_cap: u32) -> QpTrack {
        let sq_n = u64::from(sq_cap.max(1)).next_power_of_two();
        let rq_n = u64::from(rq_cap.max(1)).next_power_of_two();
        QpTrack {
            qpn,
            sq: (0..sq_n).map(|_| Slot::default()).collect(),
            sq_mask: sq_n - 1,
            sq_cap: u64::from(sq_cap.max(1)),
            rq: (0..rq_n).map(|_| Slot::default()).collect(),
            rq_mask: rq_n - 1,
            rq_cap: u64::from(rq_cap.max(1)),
            sq_posted: AtomicU64::new(0),
            sq_done: AtomicU64::new(0),
            sq_hi: AtomicU64::new(0),
            rq_posted: AtomicU64::new(0),
            rq_done: AtomicU64::new(0),
            state: AtomicU32::new(QpState::Reset as u32),
            failure: Mutex::new(None),
            stranded: Mutex::new(Vec::new()),
            has_stranded: AtomicU32::new(0),
            srq: None,
            qkey: AtomicU32::new(0),
        }
    }

    /// The tables of a QP attached to an SRQ: no receive queue of its own
    /// (capacity 0), and its receive completions are mapped through the
    /// SRQ's table.
    pub fn on_srq(mut self, srq: Arc<SrqTrack>) -> QpTrack {
        self.rq_cap = 0;
        self.srq = Some(srq);
        self
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Records the QP's state (posting checks it).
    pub fn set_state(&self, st: QpState) {
        // Relaxed: a hint for early, typed refusals; the provider enforces
        // the real state.
        self.state.store(st as u32, Ordering::Relaxed);
    }

    pub(crate) fn state(&self) -> u32 {
        // Relaxed: see `set_state`.
        self.state.load(Ordering::Relaxed)
    }

    /// Marks the WRs `[from, to)` of one queue (`slots`, `mask`, its
    /// posted counter) as refused (see [`REFUSED`]).
    pub(crate) fn refuse(slots: &[Slot], mask: u64, posted: &AtomicU64, from: u64, to: u64) {
        for seq in from..to {
            // Relaxed, then a Release store of the posted counter (already
            // covering these) republishes the flags.
            slots[(seq & mask) as usize]
                .flags
                .store(REFUSED, Ordering::Relaxed);
        }
        posted.store(to, Ordering::Release);
    }

    /// Sends posted and not yet retired.
    pub fn sends_outstanding(&self) -> u64 {
        // Relaxed: a snapshot for reporting.
        self.sq_posted.load(Ordering::Relaxed) - self.sq_done.load(Ordering::Relaxed)
    }

    /// Maps a completion back to the user's wr_id; `None` for a forced
    /// signal the user did not ask for (retired silently).
    /// Records the first failure (not a flush).
    #[cold]
    fn record(&self, slot: &Slot, user: u64, status: u32, vendor_err: u32, recv: bool) {
        if status == WcStatus::WR_FLUSH_ERR.0 {
            return;
        }
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(slot.failed(user, status, vendor_err, recv));
        }
    }

    /// Records send WRs (sequence numbers) the device will never complete;
    /// the poller of the send CQ reports them as flushed.
    pub(crate) fn add_stranded(&self, seqs: &[u64]) {
        if seqs.is_empty() {
            return;
        }
        let mut v = self.stranded.lock().unwrap_or_else(|p| p.into_inner());
        v.extend_from_slice(seqs);
        // Release: the list is filled before a poller that sees the flag
        // takes the lock (which orders it anyway).
        self.has_stranded.store(1, Ordering::Release);
    }

    /// Takes up to `max` stranded sequence numbers.
    pub(super) fn take_stranded(&self, max: usize, out: &mut Vec<u64>) {
        // Acquire: pairs with `add_stranded`.
        if self.has_stranded.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut v = self.stranded.lock().unwrap_or_else(|p| p.into_inner());
        let n = v.len().min(max);
        out.extend(v.drain(..n));
        if v.is_empty() {
            // Relaxed: under the lock.
            self.has_stranded.store(0, Ordering::Relaxed);
        }
    }

    /// The checks a send WR passes before a provider sees it: the crate's
    /// validation, atomics only where the device has them, known flags,
    /// and room (`queued` WRs not yet retired).
    pub(crate) fn check_send(
        &self,
        wr: &SendWr<'_>,
        caps: &QpCaps,
        atomics: bool,
        queued: u64,
    ) -> Result<()> {
        validate_send(wr, caps)?;
        self.check_send_unvalidated(wr, atomics, queued)
    }

    /// [`QpTrack::check_send`] without the crate's WR validation, for
    /// data paths whose encoder validates every WR itself before writing
    /// anything (the direct rxe/siw rings): atomics, flags and room only.
    pub(crate) fn check_send_unvalidated(
        &self,
        wr: &SendWr<'_>,
        atomics: bool,
        queued: u64,
    ) -> Result<()> {
        if wr.op.is_atomic() && !atomics {
            return Err(Error::Unsupported);
        }
        if wr.flags.0 & !SendFlags::ALL.0 != 0 {
            return Err(Error::InvalidFlags);
        }
        if queued >= self.sq_cap {
            return Err(Error::SqFull);
        }
        Ok(())
    }

    /// Records send WR `seq` in its slot (the user's wr_id, its shape for
    /// failed-WR reports, whether it is reported) and returns the flags the
    /// provider gets. A completion is forced when an unsignaled run
    /// (`unsignaled`, the poster's counter) would fill the queue, so
    /// unsignaled work cannot hold it forever: the WR in the last free slot
    /// asks for one. Earlier forcing would only add completions to users
    /// who signal one WR in N with N below the depth (perftest-style
    /// moderation).
    pub(crate) fn record_send(&self, seq: u64, wr: &SendWr<'_>, unsignaled: &mut u64) -> SendFlags {
        let user_signaled = wr.flags.contains(SendFlags::SIGNALED);
        let mut flags = SendFlags(
            wr.flags.0 & (SendFlags::FENCE.0 | SendFlags::SIGNALED.0 | SendFlags::SOLICITED.0),
        );
        *unsignaled += 1;
        let signaled = user_signaled || *unsignaled >= self.sq_cap.max(1);
        if signaled {
            flags = flags | SendFlags::SIGNALED;
            *unsignaled = 0;
        }
        let slot = &self.sq[(seq & self.sq_mask) as usize];
        describe_send(slot, wr);
        // Relaxed: published by the Release store of sq_posted.
        slot.wr_id.store(wr.wr_id, Ordering::Relaxed);
        slot.flags
            .store(slot_flags(user_signaled, signaled), Ordering::Relaxed);
        flags
    }

    /// Marks send `seq`, just recorded and not yet published, as the drain
    /// marker (see [`DRAIN`]; identified by its position, not its wr_id).
    pub(crate) fn mark_drain(&self, seq: u64) {
        let slot = &self.sq[(seq & self.sq_mask) as usize];
        // Relaxed: published by the Release store of sq_posted.
        let f = slot.flags.load(Ordering::Relaxed);
        slot.flags.store(f | DRAIN, Ordering::Relaxed);
    }

    /// The last send posted is a drain marker that has not completed: a
    /// repeated recovery call adds no second one. Called by the poster.
    pub(crate) fn last_send_is_marker(&self) -> bool {
        // Relaxed: only the poster writes sq_posted.
        let p = self.sq_posted.load(Ordering::Relaxed);
        // Acquire: pairs with the poller's Release of sq_done.
        if p == self.sq_done.load(Ordering::Acquire) {
            return false;
        }
        // Relaxed: the poster wrote these flags itself (the poller adds
        // only DONE).
        let f = self.sq[((p - 1) & self.sq_mask) as usize]
            .flags
            .load(Ordering::Relaxed);
        f & DRAIN != 0
    }

    /// A drain marker that never reaches the provider, for devices that do
    /// not flush what is posted in ERROR (siw: an SQE written to a user
    /// ring after the connection went down is never picked up, see
    /// `DirectQp`): a send sequence number is taken as a signaled marker
    /// and handed straight to the poller as stranded, which reports it
    /// flushed after the completions already in the CQ ring. Its
    /// completion retires the sends before it except those still awaiting
    /// their own (signaled) completion. [`Error::SqFull`] if the tables
    /// have no free slot.
    pub(crate) fn post_stranded_marker(&self) -> Result<()> {
        // Relaxed: only the poster writes sq_posted.
        let seq = self.sq_posted.load(Ordering::Relaxed);
        // Acquire: pairs with the poller's Release of sq_done (the slot is
        // free once retired).
        if seq - self.sq_done.load(Ordering::Acquire) >= self.sq_cap {
            return Err(Error::SqFull);
        }
        let slot = &self.sq[(seq & self.sq_mask) as usize];
        slot.describe(0, 0, 0, 0, 0, WcOpcode::SEND.0, false);
        // Relaxed: published by the Release store of sq_posted below.
        slot.wr_id.store(0, Ordering::Relaxed);
        slot.flags.store(SIGNALED | DRAIN, Ordering::Relaxed);
        // Release: the slot before a poller may complete it.
        self.sq_posted.store(seq + 1, Ordering::Release);
        self.add_stranded(&[seq]);
        Ok(())
    }

    /// Records receive WR `seq` in its slot.
    pub(crate) fn record_recv(&self, seq: u64, wr: &RecvWr<'_>) {
        let slot = &self.rq[(seq & self.rq_mask) as usize];
        let (la, lk, len) = first_and_total(wr.sges);
        slot.describe(la, 0, len, lk, 0, WcOpcode::RECV.0, false);
        // Relaxed: published by the Release store of rq_posted.
        slot.wr_id.store(wr.wr_id, Ordering::Relaxed);
        slot.flags.store(0, Ordering::Relaxed);
    }

    /// Send WRs that can be posted now.
    pub(crate) fn send_space(&self) -> u32 {
        // Relaxed/Acquire: a snapshot; Acquire pairs with the poller's
        // Release of sq_done.
        let used = self.sq_posted.load(Ordering::Relaxed) - self.sq_done.load(Ordering::Acquire);
        self.sq_cap.saturating_sub(used) as u32
    }

    /// How many send and receive WRs the queues hold at once.
    pub(crate) fn capacity(&self) -> (u32, u32) {
        (self.sq_cap as u32, self.rq_cap as u32)
    }

    /// Send and receive WRs posted and not yet completed.
    pub(crate) fn outstanding(&self) -> u64 {
        // Acquire: pairs with the poller's Release stores of *_done.
        let s = self.sq_posted.load(Ordering::Relaxed) - self.sq_done.load(Ordering::Acquire);
        let r = self.rq_posted.load(Ordering::Relaxed) - self.rq_done.load(Ordering::Acquire);
        s + r
    }

    /// The QP's state as the data path knows it.
    pub(crate) fn qp_state(&self) -> QpState {
        match self.state() {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Error,
        }
    }

    /// After RESET: the device emptied both queues, nothing is outstanding
    /// and no failure is recorded. Called by the poster (Relaxed loads of
    /// the counters only it writes; no completions exist after RESET).
    pub(crate) fn reset(&self) {
        let p = self.sq_posted.load(Ordering::Relaxed);
        self.sq_done.store(p, Ordering::Release);
        self.sq_hi.store(p, Ordering::Relaxed);
        let r = self.rq_posted.load(Ordering::Relaxed);
        self.rq_done.store(r, Ordering::Release);
        self.clear_failure();
    }

    /// Forgets the recorded failure (after RESET).
    pub(crate) fn clear_failure(&self) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The first failed WR since creation or RESET.
    pub fn failure(&self) -> Option<crate::wr::FailedWr> {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn complete(&self, wr_id: u64, status: u32, vendor_err: u32) -> Result<Option<u64>> {
        let ok = status == 0;
        if wr_id & RECV_BIT != 0 {
            let seq = wr_id & !RECV_BIT;
            // Acquire: pairs with the poster's Release of rq_posted, so the
            // slot written before it is visible.
            let posted = self.rq_posted.load(Ordering::Acquire);
            // Relaxed: only this poller writes rq_done.
            let done = self.rq_done.load(Ordering::Relaxed);
            if seq < done || seq >= posted {
                return Err(Error::CqeCorrupt);
            }
            let slot = &self.rq[(seq & self.rq_mask) as usize];
            // Relaxed: ordered by the Acquire above.
            let user = slot.wr_id.load(Ordering::Relaxed);
            let flags = slot.flags.load(Ordering::Relaxed);
            // Release: the slot read above happens before the poster may
            // reuse it.
            self.rq_done.store(seq + 1, Ordering::Release);
            if flags & REFUSED != 0 {
                return Ok(None);
            }
            if !ok {
                self.record(slot, user, status, vendor_err, true);
            }
            return Ok(Some(user));
        }
        let seq = wr_id;
        // Acquire: as for receives.
        let posted = self.sq_posted.load(Ordering::Acquire);
        // Relaxed: only this poller writes sq_done.
        let done = self.sq_done.load(Ordering::Relaxed);
        if seq < done || seq >= posted {
            return Err(Error::CqeCorrupt);
        }
        let slot = &self.sq[(seq & self.sq_mask) as usize];
        // Relaxed: ordered by the Acquire above.
        let user = slot.wr_id.load(Ordering::Relaxed);
        let flags = slot.flags.load(Ordering::Relaxed);
        if flags & DONE != 0 {
            // A second completion for one WR.
            return Err(Error::CqeCorrupt);
        }
        // Relaxed: the poller's own mark, read only by the poller (the
        // poster rewrites the slot only after it is retired below).
        slot.flags.store(flags | DONE, Ordering::Relaxed);
        // On InfiniBand and RoCE an RC send queue completes in order, so
        // this completion retires every earlier (unsignaled) WR too. iWARP
        // (siw) reports a WRITE or SEND once it is on the wire, before the
        // response to an earlier READ: so retire the prefix up to the
        // newest completion seen, stopping at a WR that still awaits its
        // own completion.
        // Relaxed: only this poller uses sq_hi.
        let hi = self.sq_hi.load(Ordering::Relaxed).max(seq + 1);
        self.sq_hi.store(hi, Ordering::Relaxed);
        let mut d = done;
        while d < hi {
            // Relaxed: flags of posted slots, ordered by the Acquire above.
            let f = self.sq[(d & self.sq_mask) as usize]
                .flags
                .load(Ordering::Relaxed);
            if f & (DONE | REFUSED) == 0 && f & SIGNALED != 0 {
                break;
            }
            d += 1;
        }
        if d != done {
            // Release: the slot reads above happen before the poster may
            // reuse the slots.
            self.sq_done.store(d, Ordering::Release);
        }
        if flags & (REFUSED | DRAIN) != 0 || (ok && flags & USER_SIGNALED == 0) {
            return Ok(None);
        }
        if !ok {
            self.record(slot, user, status, vendor_err, false);
        }
        Ok(Some(user))
    }
}

/// The drain marker handed to a provider: a zero-length, signaled RDMA
/// WRITE, as the kernel's own `ib_drain_sq` posts (drivers/infiniband/core/
/// verbs.c). Posted in ERROR, it is flushed and never touches memory.
pub(crate) fn drain_marker_wr() -> SendWr<'static> {
    SendWr::new(
        0,
        SendOp::Write {
            remote: crate::wr::Remote::new(0, 0),
        },
        &[],
        SendFlags::SIGNALED,
    )
}

/// The [`QpDriver`] methods a QP answers from its [`QpTrack`]
/// (`self.track`): shared by the libibverbs QP and the direct rxe/siw QP.
macro_rules! track_accessors {
    () => {
        fn send_space(&self) -> u32 {
            self.track.send_space()
        }

        fn failure(&self) -> Option<crate::wr::FailedWr> {
            self.track.failure()
        }

        fn capacity(&self) -> (u32, u32) {
            self.track.capacity()
        }

        fn outstanding(&self) -> u64 {
            self.track.outstanding()
        }

        fn state(&self) -> QpState {
            self.track.qp_state()
        }
    };
}
pub(crate) use track_accessors;

/// The first SGE's address and lkey, and the total length, of a list.
pub(crate) fn first_and_total(sges: &[crate::wr::Sge]) -> (u64, u32, u32) {
    let (addr, lkey) = sges.first().map_or((0, 0), |s| (s.addr, s.lkey));
    let len = sges.iter().fold(0u32, |a, s| a.wrapping_add(s.length));
    (addr, lkey, len)
}

/// Stores a send WR's shape in its slot.
pub(crate) fn describe_send(slot: &Slot, wr: &SendWr<'_>) {
    let (raddr, rkey) = wr.op.remote().map_or((0, 0), |r| (r.addr, r.rkey));
    let op = match wr.op {
        SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RDMA_WRITE,
        SendOp::Read { .. } => WcOpcode::RDMA_READ,
        SendOp::CompareSwap { .. } => WcOpcode::COMP_SWAP,
        SendOp::FetchAdd { .. } => WcOpcode::FETCH_ADD,
        SendOp::BindMw(_) => WcOpcode::BIND_MW,
        SendOp::LocalInv { .. } => WcOpcode::LOCAL_INV,
        _ => WcOpcode::SEND,
    };
    match wr.payload {
        Payload::Sges(list) => {
            let (la, lk, len) = first_and_total(list);
            slot.describe(la, raddr, len, lk, rkey, op.0, false);
        }
        Payload::Inline(pieces) => {
            let len = pieces
                .iter()
                .fold(0u32, |a, p| a.wrapping_add(p.len() as u32));
            slot.describe(0, raddr, len, 0, rkey, op.0, true);
        }
    }
}

/// A send slot's flags for a WR the user did (not) ask a completion for,
/// and that the provider is (not) asked to complete.
pub(crate) fn slot_flags(user_signaled: bool, signaled: bool) -> u32 {
    (u32::from(user_signaled) * USER_SIGNALED) | (u32::from(signaled) * SIGNALED)
}
