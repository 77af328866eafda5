//! [`CreditQp`]: the QP wrapper that posts, polls, re-posts and grants.

use std::boxed::Box;
use std::time::{Duration, Instant};
use std::vec;

use super::config::{threshold_for, CreditConfig, CreditStats};
use super::fifo::Fifo;
use super::wire::{CreditImm, CreditInfo};
use super::{MAX_GRANT, MAX_RECV_DEPTH, MAX_SEND_SLOTS, RESERVED_CREDITS};
use crate::api::{
    Access, Backend, Cq, Mr, Pd, Qp, QpState, Transport, WaitMode, Wc, WcOpcode, WcStatus,
};
use crate::completion::wc_flags;
use crate::error::{Error, Result};
use crate::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

/// Work-request ids: the kind in bits 62..63, a value below.
const KIND_SHIFT: u32 = 62;
const VALUE_MASK: u64 = (1 << KIND_SHIFT) - 1;
/// A data SEND; the value is its sequence number.
const KIND_DATA: u64 = 1;
/// A credit-only SEND.
const KIND_CREDIT: u64 = 2;
/// A receive; the value is its buffer slot.
const KIND_RECV: u64 = 3;

/// Completions taken per poll.
const POLL_BATCH: usize = 32;
/// Polls per progress call at most (bounds its latency).
const POLL_ROUNDS: usize = 4;
/// Receives re-posted per doorbell-record update.
const REPOST_BATCH: usize = 16;
/// Longest single wait on the CQ; longer waits loop (so a huge timeout
/// never overflows a deadline).
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Buffer alignment inside the rings (one cache line).
const SLOT_ALIGN: usize = 64;

/// An RC QP with credit-based flow control on its SEND/RECV traffic (see
/// the [module documentation](super)). It owns the QP, the CQ that serves
/// it and the buffer rings. Like a [`Qp`], it is used by one thread at a
/// time (`Send`, `&mut self` for every call).
pub struct CreditQp<B: Backend> {
    // Declared first, so dropped first: the QP is destroyed, and the device
    // stops touching the rings, before the buffers are deregistered.
    qp: Qp<B>,
    cq: Cq<B>,
    recv_mr: Mr<B>,
    send_mr: Mr<B>,
    /// One SGE per receive buffer.
    recv_sges: Box<[Sge]>,
    /// Which receive buffers are posted (a completion naming one that is
    /// not is corrupt).
    posted: Box<[bool]>,
    /// Data messages received and not yet handed out: (slot, length).
    ready: Fifo<(u32, u32)>,
    /// Buffers waiting to be posted again.
    repost: Fifo<u32>,
    /// Bytes between buffers in both rings.
    stride: usize,
    msg_size: u32,
    recv_depth: u32,
    threshold: u32,
    /// Send buffers (a power of two).
    send_slots: u64,
    signal_every: u64,
    /// Data messages posted.
    seq: u64,
    /// Data messages whose send completed (their buffers are free).
    retired: u64,
    /// SENDs we may still post (data messages leave the reserve).
    credits: u32,
    /// Receives re-posted and not yet reported to the peer.
    owed: u32,
    peer: Option<CreditInfo>,
    /// Why this CreditQp no longer works, once it does not.
    broken: Option<Error>,
    /// The first failed completion's status (a real error before a flush).
    status: Option<WcStatus>,
    wait_mode: WaitMode,
    stats: CreditStats,
}

/// Errors after which flow control cannot continue (anything but the
/// retryable conditions and caller mistakes).
fn is_fatal(e: Error) -> bool {
    !matches!(
        e,
        Error::NoCredits | Error::SqFull | Error::CqFull | Error::Timeout | Error::LengthOverflow
    )
}

impl<B: Backend> CreditQp<B> {
    /// Checks that `qp` and `cfg` can make a [`CreditQp`], without taking
    /// the QP: [`Error::Unsupported`] on iWARP (no immediate data),
    /// [`Error::InvalidQpState`] unless the QP is in INIT, RTR or RTS,
    /// [`Error::InvalidAttribute`] for a configuration out of range.
    pub fn check(qp: &Qp<B>, cfg: &CreditConfig) -> Result<()> {
        if qp.backend().port().transport == Transport::Iwarp {
            return Err(Error::Unsupported);
        }
        if !matches!(qp.state(), QpState::Init | QpState::Rtr | QpState::Rts) {
            return Err(Error::InvalidQpState);
        }
        threshold_for(cfg)?;
        if cfg.msg_size == 0 || cfg.send_slots == 0 || cfg.send_slots > MAX_SEND_SLOTS {
            return Err(Error::InvalidAttribute);
        }
        Ok(())
    }

    /// Wraps a connected RC QP (or one in INIT or RTR, to post the
    /// receives before the peer can send). `cq` must be the QP's send and
    /// receive CQ and serve no other QP (their completions would be taken
    /// and dropped), and `pd` the QP's protection domain (the buffers are
    /// registered in it).
    ///
    /// Registers the buffer rings and posts `recv_depth` receives, so the
    /// QP's receive queue must hold that many ([`Error::RqFull`]
    /// otherwise). The QP's receive queue and CQ then belong to the layer:
    /// post nothing else on them.
    ///
    /// Errors: as [`CreditQp::check`], plus registration and posting
    /// errors. On error the QP and CQ are dropped; call
    /// [`CreditQp::check`] first to keep a QP the layer cannot take.
    pub fn new(pd: &Pd<B>, qp: Qp<B>, cq: Cq<B>, cfg: &CreditConfig) -> Result<CreditQp<B>> {
        Self::check(&qp, cfg)?;
        let threshold = threshold_for(cfg)?;
        let depth = cfg.recv_depth;
        let stride = (cfg.msg_size as usize)
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or(Error::InvalidAttribute)?;
        let slots = cfg.send_slots.next_power_of_two();
        let recv_len = stride
            .checked_mul(depth as usize)
            .ok_or(Error::InvalidAttribute)?;
        let send_len = stride
            .checked_mul(slots as usize)
            .ok_or(Error::InvalidAttribute)?;
        let recv_mr = pd.register(recv_len, Access::LOCAL_WRITE)?;
        let send_mr = pd.register(send_len, Access::NONE)?;
        let recv_sges: Box<[Sge]> = (0..depth as usize)
            .map(|i| recv_mr.sge(i * stride, cfg.msg_size))
            .collect();
        let mut this = CreditQp {
            qp,
            cq,
            recv_mr,
            send_mr,
            recv_sges,
            posted: vec![false; depth as usize].into_boxed_slice(),
            ready: Fifo::new(depth as usize, (0, 0)),
            repost: Fifo::new(depth as usize, 0),
            stride,
            msg_size: cfg.msg_size,
            recv_depth: depth,
            threshold,
            send_slots: u64::from(slots),
            signal_every: u64::from((slots / 4).max(1)),
            seq: 0,
            retired: 0,
            credits: 0,
            owed: 0,
            peer: None,
            broken: None,
            status: None,
            wait_mode: cfg.wait_mode,
            stats: CreditStats::default(),
        };
        for slot in 0..depth {
            this.repost.push(slot)?;
        }
        this.repost_pending()?;
        if !this.repost.is_empty() {
            // The receive queue (or an unguarded CQ) had no room for the
            // whole window.
            return Err(Error::RqFull);
        }
        // The first window is announced by `info`, not granted.
        this.owed = 0;
        Ok(this)
    }

    /// What to announce to the peer: receives posted (its initial
    /// credits) and the largest message accepted.
    pub fn info(&self) -> CreditInfo {
        CreditInfo {
            credits: self.recv_depth,
            max_msg: self.msg_size,
        }
    }

    /// Starts sending: takes the peer's announcement (from its
    /// [`CreditQp::info`]). Until then sends return [`Error::NoCredits`];
    /// receiving works from creation. Announcing fewer than 2 credits, or
    /// more than [`MAX_RECV_DEPTH`], is [`Error::ProtocolError`]; a second
    /// call is [`Error::InvalidAttribute`].
    pub fn set_peer(&mut self, peer: &CreditInfo) -> Result<()> {
        if self.peer.is_some() {
            return Err(Error::InvalidAttribute);
        }
        if peer.credits <= RESERVED_CREDITS || peer.credits > MAX_RECV_DEPTH {
            return Err(Error::ProtocolError);
        }
        // Nothing can have been granted yet: grants return receives our
        // own messages used, and we could not send before now.
        if self.credits != 0 {
            return Err(Error::ProtocolError);
        }
        self.credits = peer.credits;
        self.peer = Some(*peer);
        Ok(())
    }

    /// The peer's announcement, once [`CreditQp::set_peer`] took it.
    pub fn peer(&self) -> Option<CreditInfo> {
        self.peer
    }

    /// Data messages that can be sent now without waiting (credits beyond
    /// the reserve; send buffers may still run out first).
    pub fn credits(&self) -> u32 {
        self.credits.saturating_sub(RESERVED_CREDITS)
    }

    /// All credits held, the reserved one included.
    pub fn raw_credits(&self) -> u32 {
        self.credits
    }

    /// Receives re-posted and not yet reported to the peer.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Messages received and not yet handed to the application (their
    /// buffers are not re-posted, so they are not yet credits).
    pub fn pending(&self) -> usize {
        self.ready.len()
    }

    /// The largest message [`CreditQp::send`] accepts: the smaller of our
    /// buffers and the peer's (0 before [`CreditQp::set_peer`]).
    pub fn max_message(&self) -> u32 {
        self.peer.map_or(0, |p| p.max_msg.min(self.msg_size))
    }

    /// Counters since creation.
    pub fn stats(&self) -> CreditStats {
        self.stats
    }

    /// The status of the first failed completion (an RNR, a transport or
    /// a remote error; a flush only if nothing else was seen). After one,
    /// every call returns [`Error::InvalidQpState`]; the QP needs recovery
    /// and a new `CreditQp` (see [`Qp::recover`]).
    pub fn failure(&self) -> Option<WcStatus> {
        self.status
    }

    /// Why this `CreditQp` stopped working, if it did: the error every
    /// call now returns.
    pub fn broken(&self) -> Option<Error> {
        self.broken
    }

    /// The wrapped QP (for its number, state, and
    /// [`Qp::failure`] after an error).
    pub fn qp(&self) -> &Qp<B> {
        &self.qp
    }

    /// Sends `payload` as one message: copies it into a registered send
    /// buffer and posts a SEND_WITH_IMM carrying the credits owed to the
    /// peer. Never waits.
    ///
    /// Errors, with nothing posted and no credit used:
    /// [`Error::NoCredits`] when the peer has no receive for it (or
    /// before [`CreditQp::set_peer`]); [`Error::SqFull`] when every send
    /// buffer (or the send queue) is still in use; [`Error::LengthOverflow`]
    /// when `payload` is longer than [`CreditQp::max_message`]. After a
    /// failed completion or a protocol error, that error (see
    /// [`CreditQp::broken`]).
    pub fn send(&mut self, payload: &[u8]) -> Result<()> {
        self.send_with(payload.len(), |buf| buf.copy_from_slice(payload))
    }

    /// As [`CreditQp::send`], but `fill` writes the `len`-byte message
    /// straight into the registered send buffer (no extra copy). `fill` is
    /// called only once the message can be sent.
    pub fn send_with<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<()> {
        self.check_ok()?;
        let r = self.send_inner(len, fill);
        self.note(r)
    }

    /// As [`CreditQp::send`], waiting up to `timeout` for a credit and a
    /// free send buffer (polling the CQ, processing what arrives, with the
    /// configured [`WaitMode`]). Returns [`Error::Timeout`] when none came
    /// in time. Never blocks longer than `timeout` plus one completion
    /// batch. Messages that arrive meanwhile are kept for
    /// [`CreditQp::recv`], which alone returns their credits.
    pub fn send_wait(&mut self, payload: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            match self.send(payload) {
                Err(Error::NoCredits | Error::SqFull | Error::CqFull) => {}
                r => return r,
            }
            let r = self.wait_cq(deadline);
            self.note(r)?;
        }
    }

    /// Waits up to `timeout` until a data message can be sent (a credit
    /// beyond the reserve and a free send buffer), then returns; or
    /// [`Error::Timeout`]. Useful before [`CreditQp::send_with`].
    pub fn wait_credit(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            self.check_ok()?;
            if self.peer.is_some() && self.can_send() {
                return Ok(());
            }
            let r = self.progress_inner();
            self.note(r)?;
            if self.peer.is_some() && self.can_send() {
                return Ok(());
            }
            let r = self.wait_cq(deadline);
            self.note(r)?;
        }
    }

    /// Hands up to `max` received messages to `f`, in order, as payload
    /// slices; each buffer is posted again as soon as `f` returns (so `f`
    /// decides how fast credits flow back). Polls the CQ first; never
    /// waits. Returns how many messages were handed out.
    ///
    /// After a failure, messages that arrived before it are still handed
    /// out; then the error is returned.
    pub fn recv<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> Result<usize> {
        if self.broken.is_none() {
            let r = self.progress_inner();
            // Recorded in `broken` if fatal; messages already received are
            // still handed out below.
            let _ = self.note(r);
        }
        let r = self.deliver(max, &mut f);
        let n = self.note(r)?;
        if n == 0 {
            self.check_ok()?;
        }
        Ok(n)
    }

    /// As [`CreditQp::recv`], waiting up to `timeout` for at least one
    /// message; [`Error::Timeout`] if none came.
    pub fn recv_wait<F: FnMut(&[u8])>(
        &mut self,
        max: usize,
        timeout: Duration,
        mut f: F,
    ) -> Result<usize> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let n = self.recv(max, &mut f)?;
            if n > 0 || max == 0 {
                return Ok(n);
            }
            let r = self.wait_cq(deadline);
            self.note(r)?;
        }
    }

    /// Polls the CQ and does the layer's housekeeping without handing out
    /// messages: takes credits the peer granted, frees send buffers,
    /// re-posts the buffers of credit-only messages, and sends an explicit
    /// grant if the threshold is reached. Call it when neither sending nor
    /// receiving for a while, so the peer keeps its credits flowing.
    pub fn progress(&mut self) -> Result<()> {
        self.check_ok()?;
        let r = self.progress_inner();
        self.note(r)
    }

    /// Returns every owed credit now, below the threshold too, in one
    /// credit-only message (when something is owed and a credit is
    /// available). `Ok(true)` if a message was posted. For the end of a
    /// stream, or before going quiet.
    pub fn flush_credits(&mut self) -> Result<bool> {
        self.check_ok()?;
        let r = self.progress_inner().and_then(|()| self.maybe_grant(1));
        self.note(r)
    }

    fn check_ok(&self) -> Result<()> {
        match self.broken {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Records a fatal error (the first one sticks).
    fn note<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if is_fatal(*e) && self.broken.is_none() {
                self.broken = Some(*e);
            }
        }
        r
    }

    /// Data messages posted whose buffers are not yet free.
    fn in_flight(&self) -> u64 {
        self.seq.wrapping_sub(self.retired)
    }

    fn can_send(&self) -> bool {
        self.credits > RESERVED_CREDITS && self.in_flight() < self.send_slots
    }

    fn send_inner<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<()> {
        let Some(peer) = self.peer else {
            self.stats.no_credit += 1;
            return Err(Error::NoCredits);
        };
        if len > peer.max_msg.min(self.msg_size) as usize {
            return Err(Error::LengthOverflow);
        }
        if !self.can_send() {
            // Only now is polling worth it: grants and freed buffers.
            self.poll_cq()?;
            self.repost_pending()?;
            self.check_ok()?;
        }
        if self.credits <= RESERVED_CREDITS {
            self.stats.no_credit += 1;
            return Err(Error::NoCredits);
        }
        if self.in_flight() >= self.send_slots {
            return Err(Error::SqFull);
        }
        let seq = self.seq;
        let off = (seq & (self.send_slots - 1)) as usize * self.stride;
        let buf = self
            .send_mr
            .as_mut_slice()
            .get_mut(off..off + len)
            .ok_or(Error::InvalidGeometry)?;
        fill(buf);
        let sge = [self.send_mr.sge(off, len as u32)];
        let flags = if (seq + 1) % self.signal_every == 0 {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        for attempt in 0..2 {
            // Computed at each attempt: polling in between may have
            // re-posted receives (more owed), never less.
            let grant = self.owed.min(MAX_GRANT);
            let imm = CreditImm {
                grant,
                credit_only: false,
            }
            .encode();
            let wr = SendWr::new(
                KIND_DATA << KIND_SHIFT | seq,
                SendOp::SendImm { imm },
                &sge,
                flags,
            );
            match self.qp.post_send_one(&wr) {
                Ok(()) => {
                    self.credits -= 1;
                    self.owed -= grant;
                    self.seq = seq + 1;
                    self.stats.sent += 1;
                    self.stats.granted_piggyback += u64::from(grant);
                    return Ok(());
                }
                Err(Error::SqFull | Error::CqFull) if attempt == 0 => {
                    // Send-queue space is retired by completions (credit-
                    // only WQEs included): poll once, retry once. Polling
                    // only adds credits and owed receives.
                    self.poll_cq()?;
                    self.repost_pending()?;
                    self.check_ok()?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::SqFull)
    }

    /// Polls, re-posts, and grants if the threshold is reached.
    fn progress_inner(&mut self) -> Result<()> {
        self.poll_cq()?;
        self.after_completions()
    }

    fn after_completions(&mut self) -> Result<()> {
        if self.broken.is_some() {
            return Ok(());
        }
        self.repost_pending()?;
        self.maybe_grant(self.threshold).map(|_| ())
    }

    /// Takes what the CQ holds (a bounded number of batches).
    fn poll_cq(&mut self) -> Result<()> {
        let mut out = [Wc::default(); POLL_BATCH];
        for _ in 0..POLL_ROUNDS {
            let n = self.cq.poll(&mut self.qp, &mut out)?;
            self.handle(out.get(..n).unwrap_or(&[]))?;
            if n < POLL_BATCH {
                break;
            }
        }
        Ok(())
    }

    /// Waits for completions until `deadline` (one slice of at most
    /// [`WAIT_SLICE`]) and processes them. [`Error::Timeout`] once the
    /// deadline has passed; `Ok` after a slice that saw nothing, so the
    /// caller re-checks its condition.
    fn wait_cq(&mut self, deadline: Option<Instant>) -> Result<()> {
        self.check_ok()?;
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => WAIT_SLICE,
        };
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        let mut out = [Wc::default(); POLL_BATCH];
        match self
            .cq
            .wait(&mut self.qp, &mut out, self.wait_mode, left.min(WAIT_SLICE))
        {
            Ok(n) => {
                self.handle(out.get(..n).unwrap_or(&[]))?;
                self.after_completions()
            }
            Err(Error::Timeout) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Processes completions. Failed ones are recorded (the QP is in
    /// ERROR); malformed ones are errors.
    fn handle(&mut self, wcs: &[Wc]) -> Result<()> {
        for wc in wcs {
            let value = wc.wr_id & VALUE_MASK;
            match wc.wr_id >> KIND_SHIFT {
                KIND_RECV => self.on_recv(wc, value)?,
                KIND_DATA => self.on_data_sent(wc, value)?,
                KIND_CREDIT => {
                    if wc.status != WcStatus::SUCCESS {
                        self.on_failed(wc.status);
                    }
                }
                _ => return Err(Error::CqeCorrupt),
            }
        }
        Ok(())
    }

    fn on_failed(&mut self, status: WcStatus) {
        let better = match self.status {
            None => true,
            Some(s) => s == WcStatus::WR_FLUSH_ERR && status != WcStatus::WR_FLUSH_ERR,
        };
        if better {
            self.status = Some(status);
        }
        if self.broken.is_none() {
            self.broken = Some(Error::InvalidQpState);
        }
    }

    fn on_recv(&mut self, wc: &Wc, slot: u64) -> Result<()> {
        let slot = u32::try_from(slot).map_err(|_| Error::CqeCorrupt)?;
        match self.posted.get_mut(slot as usize) {
            Some(p) if *p => *p = false,
            _ => return Err(Error::CqeCorrupt),
        }
        if wc.status != WcStatus::SUCCESS {
            self.on_failed(wc.status);
            return Ok(());
        }
        if wc.opcode != WcOpcode::RECV || wc.wc_flags & wc_flags::WITH_IMM == 0 {
            // A SEND without immediate data, or an RDMA WRITE with one:
            // not this protocol.
            return Err(Error::ProtocolError);
        }
        let imm = CreditImm::decode(wc.imm_data)?;
        self.take_grant(imm.grant)?;
        if imm.credit_only {
            if wc.byte_len != 0 {
                return Err(Error::ProtocolError);
            }
            self.stats.credit_msgs_received += 1;
            self.repost.push(slot)
        } else {
            if wc.byte_len > self.msg_size {
                // The device cannot scatter more than the buffer holds.
                return Err(Error::CqeCorrupt);
            }
            self.ready.push((slot, wc.byte_len))
        }
    }

    fn take_grant(&mut self, grant: u32) -> Result<()> {
        if grant == 0 {
            return Ok(());
        }
        let c = self
            .credits
            .checked_add(grant)
            .ok_or(Error::ProtocolError)?;
        // Credits never exceed the receives the peer announced (see
        // "Why it never RNRs"); before the announcement nothing is owed.
        match self.peer {
            Some(p) if c <= p.credits => {}
            _ => return Err(Error::ProtocolError),
        }
        self.credits = c;
        self.stats.credits_received += u64::from(grant);
        Ok(())
    }

    fn on_data_sent(&mut self, wc: &Wc, seq: u64) -> Result<()> {
        if wc.status != WcStatus::SUCCESS {
            self.on_failed(wc.status);
            return Ok(());
        }
        // A completion retires every earlier SEND; only signaled ones are
        // reported.
        if seq < self.retired || seq >= self.seq {
            return Err(Error::CqeCorrupt);
        }
        self.retired = seq + 1;
        Ok(())
    }

    /// Hands out up to `max` ready messages, then re-posts their buffers
    /// with one doorbell-record update per batch.
    fn deliver<F: FnMut(&[u8])>(&mut self, max: usize, f: &mut F) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let Some((slot, len)) = self.ready.pop() else {
                break;
            };
            let off = slot as usize * self.stride;
            let msg = self
                .recv_mr
                .as_slice()
                .get(off..off + len as usize)
                .ok_or(Error::CqeCorrupt)?;
            f(msg);
            n += 1;
            self.stats.received += 1;
            self.repost.push(slot)?;
        }
        if n > 0 && self.broken.is_none() {
            self.repost_pending()?;
            self.maybe_grant(self.threshold)?;
        }
        Ok(n)
    }

    /// Posts the buffers waiting in `repost`; each one posted is a credit
    /// owed to the peer. A full receive queue or CQ leaves the rest for
    /// the next call.
    fn repost_pending(&mut self) -> Result<()> {
        while !self.repost.is_empty() {
            let mut wrs = [RecvWr {
                wr_id: 0,
                sges: &[],
            }; REPOST_BATCH];
            let n = self.repost.len().min(REPOST_BATCH);
            for (k, wr) in wrs.iter_mut().enumerate().take(n) {
                let slot = self.repost.get(k).ok_or(Error::CqeCorrupt)?;
                let sge = self.recv_sges.get(slot as usize).ok_or(Error::CqeCorrupt)?;
                *wr = RecvWr {
                    wr_id: KIND_RECV << KIND_SHIFT | u64::from(slot),
                    sges: core::slice::from_ref(sge),
                };
            }
            let (done, err) = match self.qp.post_recv(wrs.get(..n).unwrap_or(&[])) {
                Ok(()) => (n, None),
                Err(e) => (e.index, Some(e.error)),
            };
            for _ in 0..done {
                let slot = self.repost.pop().ok_or(Error::CqeCorrupt)?;
                if let Some(p) = self.posted.get_mut(slot as usize) {
                    *p = true;
                }
            }
            // At most `recv_depth` (≤ MAX_RECV_DEPTH) receives are owed.
            self.owed += done as u32;
            match err {
                None => {}
                Some(Error::RqFull | Error::CqFull) => return Ok(()),
                Some(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends a credit-only message if at least `min` (≥ 1) credits are
    /// owed and a credit is available. `Ok(true)` if one was posted; a
    /// full send queue defers it to the next call.
    fn maybe_grant(&mut self, min: u32) -> Result<bool> {
        if self.owed < min.max(1) || self.credits == 0 || self.broken.is_some() {
            return Ok(false);
        }
        let grant = self.owed.min(MAX_GRANT);
        let imm = CreditImm {
            grant,
            credit_only: true,
        }
        .encode();
        // Zero-length and unsignaled: later completions (or the core's
        // signalling guard) retire its send-queue space.
        let wr = SendWr::new(
            KIND_CREDIT << KIND_SHIFT,
            SendOp::SendImm { imm },
            &[],
            SendFlags::NONE,
        );
        match self.qp.post_send_one(&wr) {
            Ok(()) => {
                self.credits -= 1;
                self.owed -= grant;
                self.stats.credit_msgs_sent += 1;
                self.stats.granted_explicit += u64::from(grant);
                Ok(true)
            }
            Err(Error::SqFull | Error::CqFull) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
