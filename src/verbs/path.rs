//! The portable data path: `ibv_post_send` / `ibv_post_recv` / `ibv_poll_cq`
//! on providers without a direct path (rxe, siw, ...), behind
//! [`PortableQp`] and [`PortableCq`].
//!
//! It keeps the direct path's guarantees where the provider would not:
//! * every WR is validated with the crate's rules first (same typed errors,
//!   nothing handed to the provider for a refused WR);
//! * WRs go to the provider as one chain per call (up to [`CHAIN`] WRs),
//!   built in scratch arrays the QP allocates once: no allocation, and a
//!   call writes only the entries it uses;
//! * the provider sees our own wr_ids (a sequence number per queue; bit 63
//!   marks receives), and a per-QP table ([`QpTrack`]) maps them back, so
//!   send-queue space is exact, and an unsignaled run is broken by a forced
//!   signal that the poller retires without reporting it (as the mlx5
//!   core does);
//! * provider-written completions are validated: a wr_id that does not
//!   name an outstanding WR of that QP is [`Error::CqeCorrupt`], never an
//!   out-of-bounds index.

use std::boxed::Box;
use std::collections::HashMap;
use std::sync::Mutex;
use std::vec::Vec;

use rdma_sys as sys;

use super::{fail, Raw};
use crate::api::{PortableCq, PortableQp};
use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::{QpState, Wc, WcOpcode, WcStatus};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::wr::{validate_recv, validate_send, Payload, QpCaps, RecvWr, SendFlags, SendOp, SendWr};
use std::sync::Arc;

/// WRs per provider call.
pub const CHAIN: usize = 32;
/// SGEs per provider call (all WRs of a chain together).
const SGES: usize = 128;
/// Completions fetched from the provider per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;
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

/// The wr_id bookkeeping of one QP, shared by its poster ([`VerbsQp`])
/// and the pollers of its CQs ([`VerbsCq`]).
///
/// Sequence numbers only grow. The poster writes a slot, then publishes
/// with a Release store of `*_posted` *before* handing the WR to the
/// provider, so a poller that sees the WR's completion (which cannot exist
/// before the provider call) and Acquire-loads `*_posted` sees the slot.
/// The poller publishes retirement with a Release store of `*_done`; the
/// poster Acquire-loads it before reusing slots.
pub struct QpTrack {
    qpn: u32,
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
        }
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
    fn take_stranded(&self, max: usize, out: &mut Vec<u64>) {
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
        if flags & REFUSED != 0 || (ok && flags & USER_SIGNALED == 0) {
            return Ok(None);
        }
        if !ok {
            self.record(slot, user, status, vendor_err, false);
        }
        Ok(Some(user))
    }
}

/// The CQ-side registry of the QPs completing on a CQ. Changed only by the
/// control path; the poller keeps a copy and refreshes it when the
/// generation moves, so polling takes no lock in steady state.
#[derive(Default)]
pub struct CqRegistry {
    gen: AtomicU64,
    qps: Mutex<Vec<Arc<QpTrack>>>,
}

impl CqRegistry {
    /// Adds a QP.
    pub fn add(&self, t: Arc<QpTrack>) {
        let mut v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
        if !v.iter().any(|x| Arc::ptr_eq(x, &t)) {
            v.push(t);
        }
        // Release: the list change happens before a poller that sees the new
        // generation re-reads the list (it also takes the lock).
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Removes a QP.
    pub fn remove(&self, t: &Arc<QpTrack>) {
        let mut v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|x| !Arc::ptr_eq(x, t));
        // Release: as in `add`.
        self.gen.fetch_add(1, Ordering::Release);
    }
}

/// Memory windows (by index, `rkey >> 8`, with their PD handle) and the
/// regions registered with `MW_BIND` (by lkey): libibverbs' BIND_MW work
/// request names both by pointer. Owned by the device, shared with its
/// portable QPs.
#[derive(Default)]
pub(crate) struct WindowTable {
    pub(crate) mws: HashMap<u32, (Raw<sys::ibv_mw>, u32)>,
    pub(crate) mrs: HashMap<u32, Raw<sys::ibv_mr>>,
}

/// The [`PortableQp`] methods a QP answers from its [`QpTrack`]
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

/// A portable QP: posts through libibverbs.
pub struct VerbsQp {
    qp: *mut sys::ibv_qp,
    track: Arc<QpTrack>,
    caps: QpCaps,
    atomics: bool,
    /// Unsignaled sends since the last signaled one.
    unsignaled: u64,
    /// The chains handed to the provider, reused by every call: a call
    /// resets and fills only the entries it links, so its cost follows its
    /// WRs (a fresh zeroed array per call stored 4 KiB of WRs and 2 KiB of
    /// SGEs even for a single WR).
    send_chain: Box<[sys::ibv_send_wr; CHAIN]>,
    recv_chain: Box<[sys::ibv_recv_wr; CHAIN]>,
    /// The SGEs the chains point into (one call at a time uses them:
    /// posting takes `&mut self`).
    sges: Box<[sys::ibv_sge; SGES]>,
    /// The device's windows and bindable regions (BIND_MW names them by
    /// pointer).
    windows: Arc<Mutex<WindowTable>>,
}

// SAFETY: the QP pointer is used only through `&mut self` (one thread at a
// time) and libibverbs QPs may be used from any thread. The chains' raw
// pointers point into the QP's own scratch arrays (and, during a call, at
// the caller's inline data); they are written and handed to the provider
// only inside a call through `&mut self`, and never read otherwise.
unsafe impl Send for VerbsQp {}

impl VerbsQp {
    /// Wraps a created QP.
    pub(crate) fn new(
        qp: *mut sys::ibv_qp,
        track: Arc<QpTrack>,
        caps: QpCaps,
        atomics: bool,
        windows: Arc<Mutex<WindowTable>>,
    ) -> VerbsQp {
        VerbsQp {
            qp,
            track,
            caps,
            atomics,
            windows,
            unsignaled: 0,
            send_chain: Box::new(core::array::from_fn(|_| blank_send())),
            recv_chain: Box::new(core::array::from_fn(|_| blank_recv())),
            sges: Box::new(
                [sys::ibv_sge {
                    addr: 0,
                    length: 0,
                    lkey: 0,
                }; SGES],
            ),
        }
    }
}

/// Fills `w` for one validated WR; SGEs go to `sges` from `*used`.
fn fill_send(
    w: &mut sys::ibv_send_wr,
    wr: &SendWr<'_>,
    sges: &mut [sys::ibv_sge; SGES],
    used: &mut usize,
    windows: &Mutex<WindowTable>,
) -> Result<()> {
    use sys::ibv_wr_opcode as O;
    let first = *used;
    match wr.payload {
        Payload::Sges(list) => {
            for s in list {
                sges[*used] = sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
                *used += 1;
            }
        }
        Payload::Inline(pieces) => {
            for p in pieces {
                sges[*used] = sys::ibv_sge {
                    addr: p.as_ptr() as u64,
                    length: p.len() as u32,
                    lkey: 0,
                };
                *used += 1;
            }
            w.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
    }
    w.sg_list = if *used > first {
        sges[first..].as_mut_ptr()
    } else {
        core::ptr::null_mut()
    };
    w.num_sge = (*used - first) as i32;
    match wr.op {
        SendOp::Send => w.opcode = O::IBV_WR_SEND,
        SendOp::SendImm { imm } => {
            w.opcode = O::IBV_WR_SEND_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOp::SendInv { rkey } => {
            w.opcode = O::IBV_WR_SEND_WITH_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
        SendOp::Write { remote } => {
            w.opcode = O::IBV_WR_RDMA_WRITE;
            w.wr.rdma = sys::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::WriteImm { remote, imm } => {
            w.opcode = O::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            w.wr.rdma = sys::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::Read { remote } => {
            w.opcode = O::IBV_WR_RDMA_READ;
            w.wr.rdma = sys::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            w.opcode = O::IBV_WR_ATOMIC_CMP_AND_SWP;
            w.wr.atomic = sys::atomic_t {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            };
        }
        SendOp::FetchAdd { remote, add } => {
            w.opcode = O::IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.wr.atomic = sys::atomic_t {
                remote_addr: remote.addr,
                compare_add: add,
                swap: 0,
                rkey: remote.rkey,
            };
        }
        // Standard verbs has no NOP work request.
        SendOp::Nop => return Err(Error::Unsupported),
        SendOp::BindMw(b) => {
            let table = windows.lock().unwrap_or_else(|p| p.into_inner());
            let mw = table.mws.get(&(b.mw_rkey >> 8)).map(|e| e.0 .0);
            let mr = table.mrs.get(&b.mr_lkey).map(|m| m.0);
            let (Some(mw), Some(mr)) = (mw, mr) else {
                return Err(Error::NoSuchObject);
            };
            // SAFETY: a live MW of this device (in the table until
            // dealloc_mw, which takes the same lock). The provider reads
            // the window's current key from `rkey`, which libibverbs only
            // caches: the crate tracks the key across binds and writes it.
            unsafe { (*mw).rkey = b.mw_rkey };
            w.opcode = O::IBV_WR_BIND_MW;
            w.bind_mw_tso_union.bind_mw = sys::bind_mw_t {
                mw,
                rkey: b.new_rkey,
                bind_info: sys::ibv_mw_bind_info {
                    mr,
                    addr: b.addr,
                    length: b.len,
                    mw_access_flags: b.access,
                },
            };
        }
        SendOp::LocalInv { rkey } => {
            w.opcode = O::IBV_WR_LOCAL_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
    }
    Ok(())
}

/// The first SGE's address and lkey, and the total length, of a list.
pub(crate) fn first_and_total(sges: &[crate::wr::Sge]) -> (u64, u32, u32) {
    let (addr, lkey) = sges.first().map_or((0, 0), |s| (s.addr, s.lkey));
    let len = sges.iter().fold(0u32, |a, s| a.wrapping_add(s.length));
    (addr, lkey, len)
}

/// Index in `chain` (of `n` linked WRs) of the WR the provider refused
/// (`bad`; NULL means it refused the whole chain).
fn bad_index<T>(bad: *mut T, chain: *const T, n: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    // SAFETY: the provider sets `bad` to an element of the chain it was
    // given, which lives in `chain`'s array; the result is clamped anyway.
    (unsafe { bad.cast_const().offset_from(chain) }).clamp(0, n as isize) as usize
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

/// Number of provider SGE entries a WR needs.
fn sge_count(wr: &SendWr<'_>) -> usize {
    match wr.payload {
        Payload::Sges(s) => s.len(),
        Payload::Inline(p) => p.len(),
    }
}

/// A zeroed send WR.
fn blank_send() -> sys::ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero fields).
    unsafe { core::mem::zeroed() }
}

/// An empty receive WR.
fn blank_recv() -> sys::ibv_recv_wr {
    sys::ibv_recv_wr {
        wr_id: 0,
        next: core::ptr::null_mut(),
        sg_list: core::ptr::null_mut(),
        num_sge: 0,
    }
}

impl PortableQp for VerbsQp {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let t = &*self.track;
        if !QpState::Rts.can_send()
            || !(t.state() == QpState::Rts as u32 || t.state() == QpState::Error as u32)
        {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        let mut done = 0usize;
        while done < wrs.len() {
            let chain = &mut *self.send_chain;
            let sges = &mut *self.sges;
            let mut used = 0usize;
            let mut n = 0usize;
            // Relaxed: this thread is the only writer of sq_posted.
            let base = t.sq_posted.load(Ordering::Relaxed);
            // Acquire: pairs with the poller's Release of sq_done, so the
            // slots it has read are free to overwrite.
            let retired = t.sq_done.load(Ordering::Acquire);
            let mut refused = None;
            while done + n < wrs.len() && n < CHAIN {
                let wr = &wrs[done + n];
                let check = t.check_send(wr, &self.caps, self.atomics, base + n as u64 - retired);
                if let Err(e) = check {
                    refused = Some(e);
                    break;
                }
                if used + sge_count(wr) > SGES {
                    if n == 0 {
                        refused = Some(Error::TooManySges);
                    }
                    break;
                }
                let seq = base + n as u64;
                let w = &mut chain[n];
                // Every field not set below is zero, and `next` is NULL
                // until the WR is linked to a following one.
                *w = blank_send();
                w.wr_id = seq;
                w.send_flags = t.record_send(seq, wr, &mut self.unsignaled).0;
                if let Err(e) = fill_send(w, wr, sges, &mut used, &self.windows) {
                    refused = Some(e);
                    break;
                }
                n += 1;
            }
            if n > 0 {
                for i in 0..n - 1 {
                    let next: *mut sys::ibv_send_wr = &mut chain[i + 1];
                    chain[i].next = next;
                }
                // Release: slots before the provider may complete them.
                t.sq_posted.store(base + n as u64, Ordering::Release);
                let mut bad: *mut sys::ibv_send_wr = core::ptr::null_mut();
                // SAFETY: live QP; the chain and its SGEs are this QP's
                // scratch arrays, borrowed for the call, and every linked
                // entry was written above (the last one's `next` is NULL);
                // inline data pointers are the caller's slices, copied by
                // the provider before it returns.
                let ret = unsafe { post_send_raw(self.qp, chain.as_mut_ptr(), &mut bad) };
                if ret != 0 {
                    let idx = bad_index(bad, chain.as_ptr(), n);
                    // The user is told WRs idx.. were not posted. Some
                    // providers queue them anyway and flush them later, so
                    // keep their sequence numbers and mark them: their
                    // completions (if any) are retired silently, and a
                    // later completion or a RESET retires them otherwise.
                    QpTrack::refuse(
                        &t.sq,
                        t.sq_mask,
                        &t.sq_posted,
                        base + idx as u64,
                        base + n as u64,
                    );
                    return Err(PostError {
                        index: done + idx,
                        error: fail("ibv_post_send", ret.abs()),
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

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let t = &*self.track;
        if t.state() == QpState::Reset as u32 {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        let mut done = 0usize;
        while done < wrs.len() {
            let chain = &mut *self.recv_chain;
            let sges = &mut *self.sges;
            let mut used = 0usize;
            let mut n = 0usize;
            // Relaxed: only this thread writes rq_posted.
            let base = t.rq_posted.load(Ordering::Relaxed);
            // Acquire: pairs with the poller's Release of rq_done.
            let retired = t.rq_done.load(Ordering::Acquire);
            let mut refused = None;
            while done + n < wrs.len() && n < CHAIN {
                let wr = &wrs[done + n];
                let check = validate_recv(wr, &self.caps).and_then(|_| {
                    if base + n as u64 - retired >= t.rq_cap {
                        return Err(Error::RqFull);
                    }
                    Ok(())
                });
                if let Err(e) = check {
                    refused = Some(e);
                    break;
                }
                if used + wr.sges.len() > SGES {
                    if n == 0 {
                        refused = Some(Error::TooManySges);
                    }
                    break;
                }
                let first = used;
                for s in wr.sges {
                    sges[used] = sys::ibv_sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    };
                    used += 1;
                }
                let seq = base + n as u64;
                chain[n] = sys::ibv_recv_wr {
                    wr_id: seq | RECV_BIT,
                    // NULL until linked to a following WR.
                    next: core::ptr::null_mut(),
                    sg_list: if used > first {
                        sges[first..].as_mut_ptr()
                    } else {
                        core::ptr::null_mut()
                    },
                    num_sge: (used - first) as i32,
                };
                t.record_recv(seq, wr);
                n += 1;
            }
            if n > 0 {
                for i in 0..n - 1 {
                    let next: *mut sys::ibv_recv_wr = &mut chain[i + 1];
                    chain[i].next = next;
                }
                // Release: slots before the provider may complete them.
                t.rq_posted.store(base + n as u64, Ordering::Release);
                let mut bad: *mut sys::ibv_recv_wr = core::ptr::null_mut();
                // SAFETY: live QP; chain and SGEs are this QP's scratch
                // arrays, borrowed for the call, every linked entry written
                // above.
                let ret = unsafe { post_recv_raw(self.qp, chain.as_mut_ptr(), &mut bad) };
                if ret != 0 {
                    let idx = bad_index(bad, chain.as_ptr(), n);
                    // As for sends.
                    QpTrack::refuse(
                        &t.rq,
                        t.rq_mask,
                        &t.rq_posted,
                        base + idx as u64,
                        base + n as u64,
                    );
                    return Err(PostError {
                        index: done + idx,
                        error: fail("ibv_post_recv", ret.abs()),
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

    track_accessors!();

    fn state_changed(&mut self, state: QpState) {
        self.track.set_state(state);
        if state == QpState::Reset {
            // The provider emptied both queues.
            self.track.reset();
            self.unsignaled = 0;
        }
    }
}

/// `ibv_post_send` through the context's ops table, without the panic of
/// an `unwrap` on a missing op.
///
/// # Safety
/// `qp` is live; the chain is valid for the call.
unsafe fn post_send_raw(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> i32 {
    // SAFETY: the caller's contract; `context` of a live QP is live.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: as above.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}

/// `ibv_post_recv` through the ops table.
///
/// # Safety
/// As [`post_send_raw`].
unsafe fn post_recv_raw(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> i32 {
    // SAFETY: the caller's contract.
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: as above.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}

/// A poller's lock-free view of a [`CqRegistry`]: a copy of its QP list,
/// refreshed when the generation moves.
pub(crate) struct RegistryView {
    registry: Arc<CqRegistry>,
    seen_gen: u64,
    qps: Vec<Arc<QpTrack>>,
}

impl RegistryView {
    /// A view of `registry` (filled on the first refresh).
    pub(crate) fn new(registry: Arc<CqRegistry>) -> RegistryView {
        RegistryView {
            registry,
            seen_gen: u64::MAX,
            qps: Vec::new(),
        }
    }

    /// Re-reads the QP list if it changed.
    pub(crate) fn refresh(&mut self) {
        // Acquire: pairs with the Release in `CqRegistry::add/remove`.
        let g = self.registry.gen.load(Ordering::Acquire);
        if g != self.seen_gen {
            let v = self.registry.qps.lock().unwrap_or_else(|p| p.into_inner());
            self.qps.clone_from(&v);
            self.seen_gen = g;
        }
    }

    fn track(&self, qpn: u32) -> Option<&QpTrack> {
        self.qps.iter().find(|t| t.qpn == qpn).map(|t| &**t)
    }

    /// Fills `out` with flush completions for send WRs the device will
    /// never complete ([`QpTrack::add_stranded`]); returns how many.
    pub(crate) fn stranded(&self, out: &mut [Wc]) -> Result<usize> {
        let mut n = 0usize;
        let mut seqs = Vec::new();
        for t in &self.qps {
            if n == out.len() {
                break;
            }
            seqs.clear();
            t.take_stranded(out.len() - n, &mut seqs);
            for &seq in &seqs {
                let mut w = Wc {
                    wr_id: seq,
                    status: WcStatus::WR_FLUSH_ERR,
                    opcode: WcOpcode::SEND,
                    qp_num: t.qpn,
                    ..Wc::default()
                };
                if self.finish(&mut w)? {
                    out[n] = w;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Turns a provider completion carrying one of our wr_ids (read once
    /// from provider memory into `w`) into the user's: `Ok(false)` for a
    /// completion that is not reported (a forced signal, a refused WR),
    /// [`Error::CqeCorrupt`] for a QP or wr_id that names nothing
    /// outstanding. On error completions the opcode is undefined: it is
    /// derived from the queue the WR came from, and the QP is recorded as
    /// in ERROR.
    pub(crate) fn finish(&self, w: &mut Wc) -> Result<bool> {
        let Some(track) = self.track(w.qp_num) else {
            return Err(Error::CqeCorrupt);
        };
        let recv = w.wr_id & RECV_BIT != 0;
        let Some(user) = track.complete(w.wr_id, w.status.0, w.vendor_err)? else {
            return Ok(false);
        };
        w.wr_id = user;
        if w.status != WcStatus::SUCCESS {
            w.opcode = if recv { WcOpcode::RECV } else { WcOpcode::SEND };
            track.set_state(QpState::Error);
        }
        Ok(true)
    }
}

/// A portable CQ: polls through libibverbs.
pub struct VerbsCq {
    cq: *mut sys::ibv_cq,
    view: RegistryView,
    depth: u32,
    /// Where the provider writes completions, reused by every poll (only
    /// the entries it reports are read).
    wcs: Box<[sys::ibv_wc; POLL_BATCH]>,
}

// SAFETY: used through `&mut self` only; libibverbs CQs may be polled from
// any thread.
unsafe impl Send for VerbsCq {}

impl VerbsCq {
    /// Wraps a created CQ.
    pub fn new(cq: *mut sys::ibv_cq, registry: Arc<CqRegistry>, depth: u32) -> VerbsCq {
        VerbsCq {
            cq,
            view: RegistryView::new(registry),
            depth,
            // SAFETY: all-zero is a valid ibv_wc.
            wcs: Box::new(unsafe { core::mem::zeroed() }),
        }
    }

    /// `ibv_req_notify_cq`: any completion, or only solicited ones.
    fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ; `context` of a live CQ is live.
        let op = unsafe { (*(*self.cq).context).ops.req_notify_cq };
        let Some(f) = op else {
            return Err(Error::Unsupported);
        };
        // SAFETY: live CQ; 0 = any completion, 1 = solicited only.
        let r = unsafe { f(self.cq, i32::from(solicited_only)) };
        super::check("ibv_req_notify_cq", r)
    }
}

/// `ibv_poll_cq` through the ops table.
///
/// # Safety
/// `cq` is live; `wc` holds `n` entries.
unsafe fn poll_raw(cq: *mut sys::ibv_cq, n: i32, wc: *mut sys::ibv_wc) -> i32 {
    // SAFETY: the caller's contract.
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: as above.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::ENOSYS,
    }
}

impl PortableCq for VerbsCq {
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        self.view.refresh();
        let mut filled = 0usize;
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            // SAFETY: live CQ; `wcs` holds `want` entries.
            let got = unsafe { poll_raw(self.cq, want as i32, self.wcs.as_mut_ptr()) };
            if got < 0 {
                return Err(fail("ibv_poll_cq", -got));
            }
            let got = (got as usize).min(want);
            for w in &self.wcs[..got] {
                // Read each provider-written field once, then validate.
                let flags = w.wc_flags;
                // SAFETY: reading a u32 union field; both variants are u32.
                let raw_imm = unsafe { w.imm_data_invalidated_rkey_union.imm_data };
                let imm = if flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                    u32::from_be(raw_imm)
                } else {
                    raw_imm
                };
                let mut wc = Wc {
                    wr_id: w.wr_id,
                    status: WcStatus(w.status),
                    opcode: WcOpcode(w.opcode),
                    vendor_err: w.vendor_err,
                    byte_len: w.byte_len,
                    imm_data: imm,
                    qp_num: w.qp_num,
                    src_qp: w.src_qp,
                    wc_flags: flags,
                    pkey_index: w.pkey_index,
                    slid: w.slid,
                    sl: w.sl,
                    dlid_path_bits: w.dlid_path_bits,
                    syndrome: 0,
                    reserved: 0,
                };
                if self.view.finish(&mut wc)? {
                    out[filled] = wc;
                    filled += 1;
                }
            }
            if got < want {
                break;
            }
        }
        Ok(filled)
    }

    fn depth(&self) -> u32 {
        self.depth
    }

    fn arm(&mut self) -> Result<()> {
        self.req_notify(false)
    }

    fn arm_solicited(&mut self) -> Result<()> {
        self.req_notify(true)
    }
}
