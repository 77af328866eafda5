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

#[cfg(doc)]
use crate::api::{Cq, Qp};
#[cfg(doc)]
use crate::error::Error;

mod config;
mod fifo;
mod qp;
mod wire;

pub use config::{CreditConfig, CreditStats};
pub use qp::CreditQp;
pub use wire::{CreditImm, CreditInfo};

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
