//! Credit-based flow control for SEND/RECV.
//!
//! A receiver that posts receives more slowly than its peer sends turns
//! every SEND beyond its posted receives into an RNR NAK: the requester
//! backs off for the RNR timer and retries, up to `rnr_retry` times, then
//! fails the QP with `RNR_RETRY_EXC_ERR` (on RoCE the retransmissions
//! also add to PFC pressure). [`CreditQp`] rules this out: a sender never
//! has more SENDs in flight than the peer has receives posted.
//!
//! # How it works
//!
//! A [`CreditQp`] wraps a connected RC [`Qp`] and the [`Cq`] that serves
//! it, and owns both sides of its message traffic:
//!
//! - **Receive side.** It registers a ring of `recv_depth` buffers of
//!   `msg_size` bytes and posts a receive into each. [`CreditQp::recv`]
//!   hands completed messages to a callback, in order, as payload slices.
//!   When the callback returns, the buffer is posted again, and that
//!   re-posted receive becomes a credit owed to the peer.
//! - **Send side.** Each side starts with the credits its peer announced
//!   ([`CreditQp::info`], exchanged out of band alongside the
//!   [`QpInfo`](crate::api::QpInfo), then given to [`CreditQp::set_peer`]).
//!   This is the number of receives the peer posted. Every SEND uses one
//!   credit. [`CreditQp::send`] copies the payload into a registered send
//!   buffer and posts it. With no credit left it returns
//!   [`Error::NoCredits`] at once and posts nothing.
//!   [`CreditQp::send_wait`] polls and waits for credits up to a timeout,
//!   then returns [`Error::Timeout`].
//! - **Credit return.** Every message is a SEND_WITH_IMM. Its immediate
//!   data carries the number of receives the sender has re-posted since
//!   its last report (the *grant*), so credits ride on reverse traffic for
//!   free. When there is no reverse traffic, a side that owes at least
//!   `grant_threshold` credits (by default half its receive window) sends
//!   an explicit *credit-only* message: a zero-length SEND_WITH_IMM with
//!   the credit-only bit set. The peer's layer re-posts that buffer at
//!   once and never shows it to the application. A one-way stream
//!   therefore never stalls.
//!
//! The layer has no thread of its own. Credits flow while both
//! applications keep calling into their `CreditQp`: [`CreditQp::recv`],
//! the send calls, or [`CreditQp::progress`]. A receiver that stops
//! consuming stops granting. That is the back-pressure working as meant,
//! not a failure.
//!
//! # Wire format of a credit grant
//!
//! Every SEND the layer posts is a SEND_WITH_IMM whose 32-bit immediate
//! value (host order in the API, big-endian on the wire as usual) is laid
//! out as follows ([`CreditImm`]):
//!
//! | bits  | field | meaning |
//! |-------|-------|---------|
//! | 31    | `C`   | 1: credit-only message (no application data, zero length); 0: data message |
//! | 24–30 | —     | reserved, sent as 0; a receiver refuses anything else with [`Error::ProtocolError`] (room for later versions) |
//! | 0–23  | grant | receives the sender re-posted since its previous report (0 to 2^24 − 1) |
//!
//! A credit-only message always grants at least one credit. A data message
//! may grant 0. Any other SEND, an RDMA WRITE with immediate, or a grant
//! that would give the sender more credits than the receiver announced is
//! a protocol error. Such an error breaks the `CreditQp`: flow control can
//! no longer be trusted.
//!
//! # Why it never RNRs
//!
//! Take one direction, A → B. Let `c` be A's credits, `f` the SENDs in
//! flight (posted by A and not yet landed in a receive at B), `o` the
//! receives B has re-posted and not yet reported, `g` the grants in flight
//! back to A, and `p` the receives B has posted. Every step keeps
//! `c + f + o + g = p`:
//!
//! - A sends: `c` − 1, `f` + 1.
//! - A message lands: `f` − 1, `p` − 1.
//! - B re-posts: `p` + 1, `o` + 1.
//! - B reports `n`: `o` − n, `g` + n.
//! - The report arrives: `g` − n, `c` + n.
//!
//! At the start `c = p` = B's announced receives. Since `o` and `g` are
//! never negative, `c + f ≤ p`: every SEND in flight, and every SEND A may
//! still post, finds a posted receive.
//!
//! # Why it cannot deadlock
//!
//! Credit-only messages are SENDs too: each one uses a receive at the peer
//! and so needs a credit. Without care, both sides could spend their last
//! credits on data. They would then owe each other credits with no way to
//! send them. Two rules prevent this:
//!
//! 1. **A reserved credit.** A data message may not use a side's last
//!    credit ([`RESERVED_CREDITS`] = 1); only a credit-only message may.
//!    A data message therefore leaves its sender with at least one credit.
//!    A credit-only message grants at least one, so it leaves its receiver
//!    with at least one. Either way, once traffic stops, the last message
//!    sent left a credit on some side: the two sides are never both at
//!    zero.
//! 2. **A threshold in `2 ..= recv_depth − 1`.** Suppose A is blocked
//!    (`c_A ≤ 1`) and B's application has consumed what arrived. By the
//!    identity above, B then owes at least `recv_depth_B − 1 ≥ threshold`,
//!    so B sends a credit-only message if it has a credit. If it has none
//!    (`c_B = 0`), A owes its whole window (`≥ threshold`) and, by rule 1,
//!    holds a credit. A then sends B a credit-only message, after which B
//!    can send its own.
//!
//! The threshold of at least 2 also stops credit-only messages from
//! bouncing back and forth forever. Each one costs its receiver one
//! receive, which is re-posted and owed back. But one owed credit alone
//! never reaches the threshold, so it never triggers a reply.
//! ([`CreditQp::flush_credits`] sends an explicit grant of any size; the
//! application decides when.) `recv_depth` must therefore be at least 3.
//!
//! Send buffers are recycled by send completions. Every `send_slots / 4`-th
//! data SEND is signaled. The buffer ring's size is a power of two, so a
//! full ring always ends in a signaled SEND, which frees it.
//!
//! # Transports
//!
//! iWARP (siw) has no immediate data, so [`CreditQp::new`] returns
//! [`Error::Unsupported`] on an iWARP port. The layer does not fall back to
//! a header in the payload: both sides would have to agree on it, and one
//! wire format is easier to reason about. InfiniBand, RoCE (rxe, mlx5) and
//! the software device are supported.
//!
//! # Costs
//!
//! Everything is allocated in [`CreditQp::new`]: two registered buffer
//! rings and small fixed tables. The data path (send, receive, polling,
//! re-posting, granting) allocates nothing and takes no lock. Receives are
//! re-posted in batches (one doorbell-record update per batch), and a
//! credit-only message is sent at most once per `grant_threshold`
//! re-posted receives.
//!
//! # Example
//!
//! ```
//! use rdma_direct::api::*;
//! use rdma_direct::credit::{CreditConfig, CreditQp};
//! use rdma_direct::soft::SoftDevice;
//!
//! let dev = Device::new(SoftDevice::new(Default::default()));
//! let pd = dev.alloc_pd()?;
//! let init = QpInit::default();
//! let depth = dev.cq_depth_for(&[&init]);
//! let (cq_a, cq_b) = (dev.create_cq(depth)?, dev.create_cq(depth)?);
//! let mut a = pd.create_qp(&cq_a, &cq_a, &init)?;
//! let mut b = pd.create_qp(&cq_b, &cq_b, &init)?;
//! let (ia, ib) = (a.info(), b.info());
//! a.connect(&ib, &ConnectAttr::default())?;
//! b.connect(&ia, &ConnectAttr::default())?;
//!
//! let cfg = CreditConfig::default();
//! let mut a = CreditQp::new(&pd, a, cq_a, &cfg)?;
//! let mut b = CreditQp::new(&pd, b, cq_b, &cfg)?;
//! // Exchange the announcements (out of band, next to the QpInfo).
//! let (ca, cb) = (a.info(), b.info());
//! a.set_peer(&cb)?;
//! b.set_peer(&ca)?;
//!
//! a.send(b"hello")?;
//! dev.backend().run_until_idle(16);
//! let mut got = Vec::new();
//! assert_eq!(b.recv(8, |msg| got.extend_from_slice(msg))?, 1);
//! assert_eq!(got, b"hello");
//! # Ok::<(), rdma_direct::Error>(())
//! ```

use std::boxed::Box;
use std::time::{Duration, Instant};
use std::vec;

use crate::api::{
    Access, Backend, Cq, Mr, Pd, Qp, QpState, Transport, WaitMode, Wc, WcOpcode, WcStatus,
};
use crate::error::{Error, Result};
use crate::provider::mlx5::cq::wc_flags;
use crate::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

/// Credits a data message may not use: they are kept for credit-only
/// messages, so that owed credits can always be returned (see the module
/// documentation, "Why it cannot deadlock").
pub const RESERVED_CREDITS: u32 = 1;

/// Largest grant one immediate value carries (24 bits).
pub const MAX_GRANT: u32 = 0x00ff_ffff;

/// Smallest receive window: a threshold of at least 2 that is below the
/// window needs 3 receives.
pub const MIN_RECV_DEPTH: u32 = 3;

/// Largest receive window (and largest announced credit count) accepted.
pub const MAX_RECV_DEPTH: u32 = 1 << 16;

/// Largest number of send buffers.
pub const MAX_SEND_SLOTS: u32 = 1 << 15;

/// Bit 31 of the immediate value: a credit-only message.
const IMM_CREDIT_ONLY: u32 = 1 << 31;
/// Bits 24..30 of the immediate value: reserved, zero.
const IMM_RESERVED: u32 = 0x7f00_0000;

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

/// The immediate value of a message sent by the layer: its grant and
/// whether it is credit-only. See the module documentation for the bit
/// layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditImm {
    /// Receives the sender re-posted since its previous report.
    pub grant: u32,
    /// No application data: the message exists to return credits.
    pub credit_only: bool,
}

impl CreditImm {
    /// The immediate value (the grant is cut to [`MAX_GRANT`]).
    pub const fn encode(self) -> u32 {
        let g = if self.grant > MAX_GRANT {
            MAX_GRANT
        } else {
            self.grant
        };
        if self.credit_only {
            IMM_CREDIT_ONLY | g
        } else {
            g
        }
    }

    /// Decodes an immediate value. Reserved bits set, or a credit-only
    /// message that grants nothing, are [`Error::ProtocolError`].
    pub const fn decode(imm: u32) -> Result<CreditImm> {
        if imm & IMM_RESERVED != 0 {
            return Err(Error::ProtocolError);
        }
        let credit_only = imm & IMM_CREDIT_ONLY != 0;
        let grant = imm & MAX_GRANT;
        if credit_only && grant == 0 {
            return Err(Error::ProtocolError);
        }
        Ok(CreditImm { grant, credit_only })
    }
}

/// What one side announces to its peer when connecting: exchange it out
/// of band with the [`QpInfo`](crate::api::QpInfo) and pass the peer's to
/// [`CreditQp::set_peer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditInfo {
    /// Receives posted: the peer's initial credits.
    pub credits: u32,
    /// Largest message accepted, in bytes (the receive buffer size).
    pub max_msg: u32,
}

impl CreditInfo {
    /// Bytes of [`CreditInfo::to_bytes`].
    pub const WIRE_LEN: usize = 8;

    /// The announcement as 8 bytes: `credits` then `max_msg`, each a
    /// big-endian u32.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..4].copy_from_slice(&self.credits.to_be_bytes());
        b[4..].copy_from_slice(&self.max_msg.to_be_bytes());
        b
    }

    /// Parses [`CreditInfo::to_bytes`] (values are checked by
    /// [`CreditQp::set_peer`]).
    pub fn from_bytes(b: &[u8; Self::WIRE_LEN]) -> CreditInfo {
        let [c0, c1, c2, c3, m0, m1, m2, m3] = *b;
        CreditInfo {
            credits: u32::from_be_bytes([c0, c1, c2, c3]),
            max_msg: u32::from_be_bytes([m0, m1, m2, m3]),
        }
    }
}

/// Configuration of a [`CreditQp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditConfig {
    /// Receive buffers posted: the credits announced to the peer
    /// ([`MIN_RECV_DEPTH`] to [`MAX_RECV_DEPTH`]). The QP's receive queue
    /// must hold this many ([`QpInit::max_recv_wr`](crate::api::QpInit)).
    pub recv_depth: u32,
    /// Bytes per buffer, at least 1: the largest message the peer may send
    /// us, and (with the peer's own `max_msg`) the largest we send.
    pub msg_size: u32,
    /// Registered send buffers, rounded up to a power of two (at most
    /// [`MAX_SEND_SLOTS`]): data messages posted and not yet completed.
    pub send_slots: u32,
    /// Re-posted receives owed before an explicit credit-only message is
    /// sent (when no data message carries them first). 0 means half the
    /// receive window (at least 2). Must lie in `2 ..= recv_depth − 1`.
    pub grant_threshold: u32,
    /// How [`CreditQp::send_wait`] and [`CreditQp::recv_wait`] wait for
    /// completions.
    pub wait_mode: WaitMode,
}

impl Default for CreditConfig {
    fn default() -> Self {
        CreditConfig {
            recv_depth: 32,
            msg_size: 1024,
            send_slots: 32,
            grant_threshold: 0,
            wait_mode: WaitMode::Adaptive,
        }
    }
}

/// Counters of one [`CreditQp`] since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditStats {
    /// Data messages posted.
    pub sent: u64,
    /// Data messages handed to the application.
    pub received: u64,
    /// Explicit credit-only messages posted.
    pub credit_msgs_sent: u64,
    /// Credit-only messages received from the peer.
    pub credit_msgs_received: u64,
    /// Credits returned to the peer on data messages.
    pub granted_piggyback: u64,
    /// Credits returned to the peer in credit-only messages.
    pub granted_explicit: u64,
    /// Credits the peer granted us (after its initial announcement).
    pub credits_received: u64,
    /// Send attempts refused with [`Error::NoCredits`] (each attempt of a
    /// waiting send counts).
    pub no_credit: u64,
}

/// A fixed-capacity FIFO, allocated once.
struct Fifo<T: Copy> {
    buf: Box<[T]>,
    head: usize,
    len: usize,
}

impl<T: Copy> Fifo<T> {
    fn new(cap: usize, fill: T) -> Fifo<T> {
        Fifo {
            buf: vec![fill; cap].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `k`-th entry from the front.
    fn get(&self, k: usize) -> Option<T> {
        if k >= self.len {
            return None;
        }
        self.buf.get((self.head + k) % self.buf.len()).copied()
    }

    /// Appends; a full FIFO means the slot accounting broke, which only
    /// corrupt completions can cause.
    fn push(&mut self, v: T) -> Result<()> {
        let cap = self.buf.len();
        if self.len == cap {
            return Err(Error::CqeCorrupt);
        }
        let at = (self.head + self.len) % cap;
        let slot = self.buf.get_mut(at).ok_or(Error::CqeCorrupt)?;
        *slot = v;
        self.len += 1;
        Ok(())
    }

    fn pop(&mut self) -> Option<T> {
        let v = self.get(0)?;
        self.head = (self.head + 1) % self.buf.len();
        self.len -= 1;
        Some(v)
    }
}

/// An RC QP with credit-based flow control on its SEND/RECV traffic (see
/// the [module documentation](self)). It owns the QP, the CQ that serves
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

/// The grant threshold `cfg` asks for, checked (see the module
/// documentation for why `2 ..= recv_depth − 1`).
fn threshold_for(cfg: &CreditConfig) -> Result<u32> {
    let depth = cfg.recv_depth;
    if !(MIN_RECV_DEPTH..=MAX_RECV_DEPTH).contains(&depth) {
        return Err(Error::InvalidAttribute);
    }
    let t = if cfg.grant_threshold == 0 {
        (depth / 2).max(2)
    } else {
        cfg.grant_threshold
    };
    if t < 2 || t >= depth {
        return Err(Error::InvalidAttribute);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imm_round_trips() {
        for (grant, credit_only) in [(0, false), (1, false), (1, true), (MAX_GRANT, true)] {
            let c = CreditImm { grant, credit_only };
            assert_eq!(CreditImm::decode(c.encode()), Ok(c));
        }
        assert_eq!(
            CreditImm {
                grant: 5,
                credit_only: true
            }
            .encode(),
            0x8000_0005
        );
        // A grant above 24 bits is cut, never spilled into other fields.
        assert_eq!(
            CreditImm {
                grant: u32::MAX,
                credit_only: false
            }
            .encode(),
            MAX_GRANT
        );
    }

    #[test]
    fn imm_rejects_reserved_bits_and_empty_credit_messages() {
        assert_eq!(CreditImm::decode(0x0100_0000), Err(Error::ProtocolError));
        assert_eq!(CreditImm::decode(0x8000_0000), Err(Error::ProtocolError));
    }

    #[test]
    fn info_bytes_round_trip() {
        let i = CreditInfo {
            credits: 0x0102_0304,
            max_msg: 4096,
        };
        assert_eq!(i.to_bytes(), [1, 2, 3, 4, 0, 0, 0x10, 0]);
        assert_eq!(CreditInfo::from_bytes(&i.to_bytes()), i);
    }

    #[test]
    fn thresholds() {
        let cfg = |recv_depth, grant_threshold| CreditConfig {
            recv_depth,
            grant_threshold,
            ..CreditConfig::default()
        };
        assert_eq!(threshold_for(&cfg(32, 0)), Ok(16));
        assert_eq!(threshold_for(&cfg(3, 0)), Ok(2));
        assert_eq!(threshold_for(&cfg(8, 7)), Ok(7));
        assert_eq!(threshold_for(&cfg(2, 0)), Err(Error::InvalidAttribute));
        assert_eq!(threshold_for(&cfg(8, 8)), Err(Error::InvalidAttribute));
        assert_eq!(threshold_for(&cfg(8, 1)), Err(Error::InvalidAttribute));
    }

    #[test]
    fn fifo_wraps_and_refuses_overflow() {
        let mut f = Fifo::new(3, 0u32);
        for round in 0..5 {
            f.push(round).unwrap();
            f.push(round + 100).unwrap();
            assert_eq!(f.get(1), Some(round + 100));
            assert_eq!(f.pop(), Some(round));
            assert_eq!(f.pop(), Some(round + 100));
            assert_eq!(f.pop(), None);
        }
        f.push(1).unwrap();
        f.push(2).unwrap();
        f.push(3).unwrap();
        assert_eq!(f.push(4), Err(Error::CqeCorrupt));
        assert_eq!(f.len(), 3);
    }
}
