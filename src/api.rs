//! The safe Rust API: device → protection domain → memory region →
//! completion queue → queue pair, generic over the backend that provides
//! the control path ([`Backend`]). The data path is the crate's mlx5 core
//! for every backend that hands out mlx5 queues (the software HCA now; a
//! ConnectX NIC through `mlx5dv_init_obj` later): posting and polling
//! allocate nothing, lock nothing and make no calls into the backend.
//!
//! ```
//! use rdma_direct::api::*;
//! use rdma_direct::soft::SoftDevice;
//! use rdma_direct::{SendOp, SendFlags, RecvWr};
//!
//! let dev = Device::new(SoftDevice::new(Default::default()));
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(256)?;
//! let mut cq2 = dev.create_cq(256)?;
//! let mut a = pd.create_qp(&cq, &cq, &QpInit::default())?;
//! let mut b = pd.create_qp(&cq2, &cq2, &QpInit::default())?;
//! let (ia, ib) = (a.info(), b.info());
//! a.connect(&ib, &ConnectAttr::default())?;
//! b.connect(&ia, &ConnectAttr::default())?;
//! let mut src = pd.register(64, Access::NONE)?;
//! let mut dst = pd.register(64, Access::LOCAL_WRITE)?;
//! src.as_mut_slice()[..5].copy_from_slice(b"hello");
//! b.post_recv(&[RecvWr { wr_id: 1, sges: &[dst.sge(0, 64)] }])?;
//! a.post_send(&[rdma_direct::SendWr::new(2, SendOp::Send, &[src.sge(0, 5)], SendFlags::SIGNALED)])?;
//! dev.backend().run_until_idle(16);
//! let mut wc = [Wc::default(); 4];
//! assert_eq!(cq2.poll(&mut b, &mut wc)?, 1);
//! assert_eq!(&dst.as_slice()[..5], b"hello");
//! # Ok::<(), rdma_direct::Error>(())
//! ```

use std::any::Any;
use std::boxed::Box;
use std::sync::Arc;
use std::vec;

use core::ptr::NonNull;
use std::time::{Duration, Instant};

pub use crate::event::{Adaptive, AdaptiveConfig, WaitMode};

use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::{
    CompletionQueue, CqRoute, CqRouteTo, Mlx5dvCq, Mlx5dvQp, QpQueues, RecvQueue, Retired,
    SendQueue, SharedSendQueue, SharedStorage, SqConfig, SqRetire, WrSlot,
};
use crate::sync::{AtomicU32, Ordering};
use crate::util::AlignedBuf;
use crate::wr::{QpCaps, RecvWr, Remote, SendWr, Sge};

pub use crate::provider::mlx5::{QpState, Wc, WcOpcode, WcStatus};
pub use crate::soft::{Access, AddressVector, QpInit, QpModify};

/// A data path other than the crate's mlx5 core, for the send and
/// receive queues of one QP: libibverbs' `ibv_post_send` /
/// `ibv_post_recv` on providers without a direct path (rxe, siw, ...).
///
/// Implementations validate every WR with the crate's rules (same typed
/// errors as the direct path) before handing it to the provider, and stop
/// at the first refused WR like [`Qp::post_send`].
pub trait PortableQp: Send {
    /// Posts send WRs, batching them into as few provider calls as it can.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError>;
    /// Posts receive WRs.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError>;
    /// Send WRs that can be posted now without overflowing the SQ.
    fn send_space(&self) -> u32;
    /// The QP's state as the data path knows it (error completions move it
    /// to ERROR).
    fn state(&self) -> QpState;
    /// The first WR that failed since creation or the last RESET, as it
    /// was posted (see [`crate::wr::FailedWr`]).
    fn failure(&self) -> Option<crate::wr::FailedWr> {
        None
    }
    /// Send and receive WRs posted and not yet completed.
    fn outstanding(&self) -> u64;
    /// How many send and receive WRs the queues can hold at once.
    fn capacity(&self) -> (u32, u32);
    /// Called after a successful state change (so the data path can refuse
    /// posts the state forbids, and reset its counters on RESET).
    fn state_changed(&mut self, state: QpState);
}

/// The completion side of a portable data path: polls one CQ and reports
/// completions with the user's wr_ids.
pub trait PortableCq: Send {
    /// Polls up to `out.len()` completions.
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize>;
    /// Entries the CQ holds.
    fn depth(&self) -> u32;
    /// Requests an event for the next completion.
    fn arm(&mut self) -> Result<()>;
    /// Requests an event for the next solicited (or error) completion.
    fn arm_solicited(&mut self) -> Result<()> {
        Err(Error::Unsupported)
    }
}

/// The queues of a CQ as a backend hands them out.
pub enum RawCqPath {
    /// mlx5 CQ memory, polled by the crate's core.
    Mlx5(Mlx5dvCq),
    /// A provider-polled CQ.
    Portable(Box<dyn PortableCq>),
}

/// What a backend hands out for a CQ: its queues plus whatever keeps the
/// memory alive.
pub struct RawCq {
    /// The queues.
    pub path: RawCqPath,
    /// CQ number (a backend-chosen handle).
    pub cqn: u32,
    /// Keeps the queue memory alive while any handle exists.
    pub keep: Arc<dyn Any + Send + Sync>,
}

/// The queues of a QP as a backend hands them out.
pub enum RawQpPath {
    /// mlx5 queue memory (`mlx5dv_qp` fields), written by the crate's core.
    Mlx5(Mlx5dvQp),
    /// A provider-posted QP.
    Portable(Box<dyn PortableQp>),
}

/// What a backend hands out for a QP.
pub struct RawQp {
    /// The queues.
    pub path: RawQpPath,
    /// QP number.
    pub qpn: u32,
    /// Granted capabilities.
    pub caps: QpCaps,
    /// This QP's initial send PSN (24 bits), given to the peer.
    pub psn: u32,
    /// Keeps the queue memory alive.
    pub keep: Arc<dyn Any + Send + Sync>,
}

/// The keys of a registered region. They differ on some devices; use the
/// lkey in local SGEs and hand the rkey to peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrKeys {
    /// Local key.
    pub lkey: u32,
    /// Remote key (meaningless when no remote access was granted).
    pub rkey: u32,
}

/// How a port moves RDMA traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// The in-process software HCA.
    #[default]
    Soft,
    /// InfiniBand: addressed by LID; GRH optional.
    InfiniBand,
    /// RoCE (InfiniBand transport over Ethernet; v2 over UDP/IP):
    /// addressed by GID, every packet carries a GRH.
    Roce,
    /// iWARP (over TCP): connections only through rdma_cm.
    Iwarp,
}

/// Port attributes used to connect QPs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (1-based).
    pub port_num: u8,
    /// Transport and link layer.
    pub transport: Transport,
    /// Local identifier (InfiniBand).
    pub lid: u16,
    /// GID table index QPs send from by default (on RoCE the RoCEv2 IPv4
    /// entry when there is one).
    pub gid_index: u8,
    /// The GID at `gid_index` (RoCE/iWARP addressing).
    pub gid: [u8; 16],
    /// Active MTU in bytes.
    pub mtu: u32,
}

/// The control path of a device. Implementations may allocate, lock and
/// make system calls; none of it is on the data path.
pub trait Backend: Send + Sync + 'static {
    /// A short name ("soft", "mlx5_0", ...).
    fn name(&self) -> &str;
    /// Port attributes.
    fn port(&self) -> PortInfo;
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<u32>;
    /// Frees a protection domain.
    fn dealloc_pd(&self, pd: u32) -> Result<()>;
    /// Registers memory with exactly `access`; returns its keys.
    ///
    /// # Safety
    /// The memory must stay valid until `dereg_mr` returns.
    unsafe fn reg_mr(&self, pd: u32, addr: u64, len: u64, access: Access) -> Result<MrKeys>;
    /// Deregisters the region with local key `lkey`; afterwards the device
    /// never touches the memory.
    fn dereg_mr(&self, lkey: u32) -> Result<()>;
    /// Allocates a type-2 memory window in `pd`, unbound; returns its key.
    /// [`Error::Unsupported`] where the device (or the data path in use)
    /// has no windows, which is the default.
    fn alloc_mw(&self, pd: u32) -> Result<u32> {
        let _ = pd;
        Err(Error::Unsupported)
    }
    /// Deallocates the window whose key (any generation: the upper 24 bits
    /// name it) is `rkey`. A bound window is invalidated at once: requests
    /// with its key fail from then on.
    fn dealloc_mw(&self, rkey: u32) -> Result<()> {
        let _ = rkey;
        Err(Error::Unsupported)
    }
    /// Creates a CQ with at least `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<RawCq>;
    /// Destroys a CQ.
    fn destroy_cq(&self, cqn: u32) -> Result<()>;
    /// Creates an RC QP in RESET.
    fn create_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<RawQp>;
    /// Changes a QP's state.
    fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()>;
    /// Destroys a QP.
    fn destroy_qp(&self, qpn: u32) -> Result<()>;
    /// The worst case of completions a QP created with `init` can put on
    /// its send and receive CQs (what its queues will hold), for sizing
    /// CQs before creating QPs; the guard in [`Pd::create_qp`] checks the
    /// exact figure. The default is the WR counts asked for.
    fn cq_demand(&self, init: &QpInit) -> (u32, u32) {
        (init.max_send_wr, init.max_recv_wr)
    }
    /// The fd that becomes readable when an armed CQ gets a completion.
    fn cq_event_fd(&self, cqn: u32) -> Result<i32> {
        let _ = cqn;
        Err(Error::Unsupported)
    }
    /// Takes the CQ's pending events without blocking; returns how many.
    fn cq_event_consume(&self, cqn: u32) -> Result<u32> {
        let _ = cqn;
        Err(Error::Unsupported)
    }
    /// Takes the next asynchronous device event without blocking.
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(None)
    }
    /// An fd that is readable while asynchronous events are pending.
    fn async_event_fd(&self) -> Result<i32> {
        Err(Error::Unsupported)
    }
}

/// An asynchronous event from the device (`ibv_async_event`; the software
/// device raises the QP and CQ ones). QP-fatal kinds mean the device moved
/// the QP to ERROR on its own: recover it with [`Qp::recover`] (or
/// [`Qp::drain_and_reset`]), which reports every outstanding WR once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A QP hit an error that prevented a completion (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// QP number.
        qpn: u32,
    },
    /// An invalid request arrived at a QP (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError {
        /// QP number.
        qpn: u32,
    },
    /// A remote access violation on a QP (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// QP number.
        qpn: u32,
    },
    /// The first message arrived on a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEstablished {
        /// QP number.
        qpn: u32,
    },
    /// A QP in SQD has no outstanding sends (`IBV_EVENT_SQ_DRAINED`).
    SqDrained {
        /// QP number.
        qpn: u32,
    },
    /// A QP on an SRQ in ERROR has no more receives to flush
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached {
        /// QP number.
        qpn: u32,
    },
    /// A CQ overran or failed (`IBV_EVENT_CQ_ERR`); its completions are
    /// no longer reliable.
    CqError {
        /// CQ number.
        cqn: u32,
    },
    /// A port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive {
        /// Port number.
        port: u8,
    },
    /// A port went down (`IBV_EVENT_PORT_ERR`): connections through it
    /// will fail with retry errors.
    PortError {
        /// Port number.
        port: u8,
    },
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`); close and reopen it.
    DeviceFatal,
    /// Any other event: its `ibv_event_type` value and raw element.
    Other {
        /// `ibv_event_type`.
        kind: u32,
        /// QP number, CQ number or port, as the kind implies.
        element: u32,
    },
}

impl AsyncEvent {
    /// The QP the event is about, if any.
    pub const fn qpn(&self) -> Option<u32> {
        match *self {
            AsyncEvent::QpFatal { qpn }
            | AsyncEvent::QpRequestError { qpn }
            | AsyncEvent::QpAccessError { qpn }
            | AsyncEvent::CommEstablished { qpn }
            | AsyncEvent::SqDrained { qpn }
            | AsyncEvent::LastWqeReached { qpn } => Some(qpn),
            _ => None,
        }
    }

    /// True for the events after which the QP is in ERROR and needs
    /// [`Qp::recover`]: fatal, request and access errors.
    pub const fn is_qp_fatal(&self) -> bool {
        matches!(
            self,
            AsyncEvent::QpFatal { .. }
                | AsyncEvent::QpRequestError { .. }
                | AsyncEvent::QpAccessError { .. }
        )
    }
}

impl Backend for crate::soft::SoftDevice {
    fn name(&self) -> &str {
        "soft"
    }
    fn port(&self) -> PortInfo {
        PortInfo {
            port_num: 1,
            transport: Transport::Soft,
            lid: 1,
            gid_index: 0,
            gid: [0; 16],
            mtu: 4096,
        }
    }
    fn alloc_pd(&self) -> Result<u32> {
        Ok(crate::soft::SoftDevice::alloc_pd(self))
    }
    fn dealloc_pd(&self, pd: u32) -> Result<()> {
        crate::soft::SoftDevice::dealloc_pd(self, pd)
    }
    unsafe fn reg_mr(&self, pd: u32, addr: u64, len: u64, access: Access) -> Result<MrKeys> {
        // SAFETY: forwarded contract.
        let key = unsafe { crate::soft::SoftDevice::reg_mr(self, pd, addr, len, access) }?;
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }
    fn dereg_mr(&self, lkey: u32) -> Result<()> {
        crate::soft::SoftDevice::dereg_mr(self, lkey)
    }
    fn create_cq(&self, depth: u32) -> Result<RawCq> {
        let c = crate::soft::SoftDevice::create_cq(self, depth)?;
        Ok(RawCq {
            path: RawCqPath::Mlx5(c.dv),
            cqn: c.cqn,
            keep: c.mem,
        })
    }
    fn destroy_cq(&self, cqn: u32) -> Result<()> {
        crate::soft::SoftDevice::destroy_cq(self, cqn)
    }
    fn create_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<RawQp> {
        let q = crate::soft::SoftDevice::create_qp(self, pd, send_cq, recv_cq, init)?;
        Ok(RawQp {
            path: RawQpPath::Mlx5(q.dv),
            qpn: q.qpn,
            caps: q.caps,
            psn: 0,
            keep: q.mem,
        })
    }
    fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()> {
        crate::soft::SoftDevice::modify_qp(self, qpn, m)
    }
    fn destroy_qp(&self, qpn: u32) -> Result<()> {
        crate::soft::SoftDevice::destroy_qp(self, qpn)
    }
    fn cq_demand(&self, init: &QpInit) -> (u32, u32) {
        crate::soft::queue_sizes(init)
    }
    fn cq_event_fd(&self, cqn: u32) -> Result<i32> {
        crate::soft::SoftDevice::cq_event_fd(self, cqn)
    }
    fn cq_event_consume(&self, cqn: u32) -> Result<u32> {
        crate::soft::SoftDevice::cq_event_consume(self, cqn)
    }
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(
            crate::soft::SoftDevice::poll_async_event(self).map(|e| match e {
                crate::soft::AsyncEvent::CqOverrun { cqn } => AsyncEvent::CqError { cqn },
                crate::soft::AsyncEvent::QpFatal { qpn } => AsyncEvent::QpFatal { qpn },
            }),
        )
    }
    fn async_event_fd(&self) -> Result<i32> {
        crate::soft::SoftDevice::async_event_fd(self)
    }
}

impl Default for QpInit {
    fn default() -> Self {
        QpInit {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// A device handle. Cloning shares it.
pub struct Device<B: Backend> {
    b: Arc<B>,
}

impl<B: Backend> Clone for Device<B> {
    fn clone(&self) -> Self {
        Device {
            b: Arc::clone(&self.b),
        }
    }
}

struct PdInner<B: Backend> {
    b: Arc<B>,
    pd: u32,
}

impl<B: Backend> Drop for PdInner<B> {
    fn drop(&mut self) {
        // Everything using the PD holds this Arc, so nothing is left.
        let _ = self.b.dealloc_pd(self.pd);
    }
}

/// A protection domain.
pub struct Pd<B: Backend> {
    inner: Arc<PdInner<B>>,
}

struct CqInner<B: Backend> {
    b: Arc<B>,
    cqn: u32,
    /// QPs whose send or receive completions land here (a QP using the
    /// CQ for both counts twice).
    users: AtomicU32,
    /// Entries the CQ holds.
    capacity: u32,
    /// Worst-case completions the attached QPs can have outstanding.
    committed: std::sync::Mutex<u64>,
    /// The owner moderates completions itself: no sizing guard.
    unguarded: core::sync::atomic::AtomicBool,
    /// The run-time headroom check of an unguarded CQ.
    headroom: Headroom,
    _keep: Arc<dyn Any + Send + Sync>,
}

impl<B: Backend> CqInner<B> {
    /// Whether posts must check this CQ's headroom (it opted out of the
    /// sizing guard, so its QPs could overrun it).
    #[inline(always)]
    fn metered(&self) -> bool {
        // Relaxed: a setting, changed on the control path.
        self.unguarded.load(Ordering::Relaxed)
    }

    fn reserve(&self, want: u64) -> u64 {
        self.headroom.reserve(want)
    }

    fn unreserve(&self, n: u64) {
        self.headroom.unreserve(n)
    }
}

/// Completions expected on a CQ that opted out of the sizing guard and
/// not yet polled: the run-time headroom check (shared with the C object
/// API). Counted only while the CQ is unguarded.
pub(crate) struct Headroom {
    capacity: u64,
    inflight: core::sync::atomic::AtomicU64,
}

impl Headroom {
    /// An empty account for a CQ of `capacity` entries.
    pub(crate) fn new(capacity: u64) -> Headroom {
        Headroom {
            capacity,
            inflight: core::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Reserves room for up to `want` completions; returns how many fit.
    pub(crate) fn reserve(&self, want: u64) -> u64 {
        let cap = self.capacity;
        // Relaxed throughout: the counter publishes no memory, it is only
        // arithmetic; the CAS keeps concurrent posters on one CQ from both
        // taking the last room.
        let mut cur = self.inflight.load(Ordering::Relaxed);
        loop {
            let got = want.min(cap.saturating_sub(cur));
            if got == 0 {
                return 0;
            }
            match self.inflight.compare_exchange_weak(
                cur,
                cur + got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return got,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back `n` completions' room (unused reservations, polled CQEs).
    /// Saturates at zero: a CQE nobody reserved (an error on an unsignaled
    /// WR) must not make later checks lenient.
    pub(crate) fn unreserve(&self, n: u64) {
        if n == 0 {
            return;
        }
        // Relaxed: as in `reserve`.
        let _ = self
            .inflight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(n))
            });
    }
}

/// Signaled WRs among `wrs` (each will produce a completion).
pub(crate) fn signaled(wrs: &[SendWr<'_>]) -> u64 {
    wrs.iter()
        .filter(|w| w.flags.contains(crate::wr::SendFlags::SIGNALED))
        .count() as u64
}

/// The longest prefix of `wrs` whose signaled WRs, plus `extra`, fit in
/// `room` completions.
pub(crate) fn fitting_prefix(wrs: &[SendWr<'_>], extra: u64, room: u64) -> usize {
    let mut used = extra;
    if used > room {
        return 0;
    }
    for (i, w) in wrs.iter().enumerate() {
        if w.flags.contains(crate::wr::SendFlags::SIGNALED) {
            used += 1;
            if used > room {
                return i;
            }
        }
    }
    wrs.len()
}

impl<B: Backend> Drop for CqInner<B> {
    fn drop(&mut self) {
        // Every QP on this CQ holds this Arc, so none is left.
        let _ = self.b.destroy_cq(self.cqn);
    }
}

/// A completion queue and its poller.
pub struct Cq<B: Backend> {
    inner: Arc<CqInner<B>>,
    cq: CqPath,
    adaptive: Adaptive,
}

/// The poller behind a [`Cq`].
enum CqPath {
    /// The crate's mlx5 core.
    Mlx5(CompletionQueue),
    /// A provider-polled CQ.
    Portable(Box<dyn PortableCq>),
}

/// A registered memory region that owns its buffer.
///
/// The device reads and writes the buffer on behalf of posted work and of
/// peers holding the rkey (as the access flags allow). As with every RDMA
/// API, the application orders its own accesses after the completions
/// that cover the device's.
pub struct Mr<B: Backend> {
    pd: Arc<PdInner<B>>,
    keys: MrKeys,
    access: Access,
    buf: AlignedBuf,
    len: usize,
}

/// Connection data of a QP, exchanged with the peer (out of band, or by a
/// connection manager).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID.
    pub gid: [u8; 16],
    /// Path MTU in bytes.
    pub mtu: u32,
}

/// Attributes for [`Qp::connect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectAttr {
    /// Remote operations this QP accepts (checked with the MR's flags).
    pub access: Access,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// Local ACK timeout (IB encoding: 4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Minimum RNR NAK timer (IB encoding; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// RDMA READs/atomics outstanding in each direction.
    pub max_rd_atomic: u8,
    /// GID index to send from (`None`: the port's default,
    /// [`PortInfo::gid_index`]).
    pub gid_index: Option<u8>,
    /// GRH hop limit (TTL on RoCEv2).
    pub hop_limit: u8,
    /// GRH traffic class: the DSCP/ECN byte on RoCEv2, so this QP's
    /// traffic can be mapped to its own PFC priority.
    pub traffic_class: u8,
    /// Service level (InfiniBand SL; VLAN priority on RoCE).
    pub sl: u8,
    /// Cap the path MTU below what both ports support (bytes, 0 = none).
    pub max_mtu: u32,
    /// Send rate limit in kbit/s (0: none), where the device paces packets
    /// (ConnectX through verbs); elsewhere connecting with a limit fails
    /// with [`Error::Unsupported`].
    pub rate_limit_kbps: u32,
}

impl Default for ConnectAttr {
    fn default() -> Self {
        ConnectAttr {
            access: Access::NONE,
            rnr_retry: 7,
            retry_cnt: 7,
            timeout: 14,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            gid_index: None,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            max_mtu: 0,
            rate_limit_kbps: 0,
        }
    }
}

/// An RC queue pair. Posting needs `&mut`: one owner posts (later issues
/// add lock-free sharing).
pub struct Qp<B: Backend> {
    demand: CqDemand,
    pd: Arc<PdInner<B>>,
    _send_cq: Arc<CqInner<B>>,
    _recv_cq: Arc<CqInner<B>>,
    qpn: u32,
    caps: QpCaps,
    psn: u32,
    path: QpPath,
    _keep: Arc<dyn Any + Send + Sync>,
}

/// The data path behind a [`Qp`]. The mlx5 queues stay inline (no extra
/// pointer chase on the post path), hence the size difference.
#[allow(clippy::large_enum_variant)]
enum QpPath {
    /// The crate's mlx5 core.
    Mlx5(Mlx5Queues),
    /// A provider-posted QP.
    Portable(Box<dyn PortableQp>),
}

/// The mlx5 queues of a QP.
struct Mlx5Queues {
    sq: SendQueue,
    rq: RecvQueue,
    // Side tables the queues point into; boxed so moves keep them put.
    _sq_wrid: Box<[WrSlot]>,
    _rq_wrid: Box<[u64]>,
    dv: Mlx5dvQp,
}

// SAFETY: the raw queue descriptor (`dv`) only names memory kept alive by
// `_keep`; the queues inside are `Send`, and a Qp is used by one thread at
// a time (`&mut` for every data-path call).
unsafe impl<B: Backend> Send for Qp<B> {}

impl<B: Backend> Device<B> {
    /// Wraps a backend.
    pub fn new(b: B) -> Device<B> {
        Device { b: Arc::new(b) }
    }

    /// Takes the next asynchronous event (QP errors, CQ overruns, port
    /// changes) without blocking. A QP-fatal event
    /// ([`AsyncEvent::is_qp_fatal`]) names a QP to [`Qp::recover`].
    pub fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.b.poll_async_event()
    }

    /// An fd that is readable while asynchronous events are pending, for
    /// the application's own epoll set.
    pub fn async_event_fd(&self) -> Result<i32> {
        self.b.async_event_fd()
    }

    /// Waits up to `timeout` for the next asynchronous event; `Ok(None)`
    /// when none came. Never blocks longer than `timeout`.
    pub fn wait_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.b.poll_async_event()? {
                return Ok(Some(e));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            crate::event::wait_readable(self.b.async_event_fd()?, left)?;
        }
    }

    /// The backend (for backend-specific control: stepping the software
    /// device, fault injection, ...).
    pub fn backend(&self) -> &B {
        &self.b
    }

    /// The CQ depth that QPs created with `inits` need if their send and
    /// receive completions all go to one CQ (the sizing guard's worst
    /// case: every WR their queues can hold). Pass it to
    /// [`Device::create_cq`].
    pub fn cq_depth_for(&self, inits: &[&QpInit]) -> u32 {
        inits
            .iter()
            .map(|i| {
                let (s, r) = self.b.cq_demand(i);
                s.saturating_add(r)
            })
            .fold(0u32, u32::saturating_add)
            .max(1)
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd<B>> {
        let pd = self.b.alloc_pd()?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                b: Arc::clone(&self.b),
                pd,
            }),
        })
    }

    /// Creates a CQ with room for at least `depth` completions.
    pub fn create_cq(&self, depth: u32) -> Result<Cq<B>> {
        let raw = self.b.create_cq(depth)?;
        let cq = match raw.path {
            RawCqPath::Mlx5(dv) => {
                // SAFETY: the backend guarantees the descriptor describes
                // live CQ memory kept alive by `raw.keep`, which `CqInner`
                // holds as long as the poller exists.
                match unsafe { CompletionQueue::from_raw(&dv) } {
                    Ok(mut cq) => {
                        cq.set_scatter_to_cqe(false);
                        CqPath::Mlx5(cq)
                    }
                    Err(e) => {
                        let _ = self.b.destroy_cq(raw.cqn);
                        return Err(e);
                    }
                }
            }
            RawCqPath::Portable(p) => CqPath::Portable(p),
        };
        let capacity = match &cq {
            CqPath::Mlx5(c) => c.cqe_cnt(),
            CqPath::Portable(p) => p.depth(),
        };
        Ok(Cq {
            adaptive: Adaptive::new(AdaptiveConfig::default()),
            inner: Arc::new(CqInner {
                b: Arc::clone(&self.b),
                cqn: raw.cqn,
                users: AtomicU32::new(0),
                capacity,
                committed: std::sync::Mutex::new(0),
                unguarded: core::sync::atomic::AtomicBool::new(false),
                headroom: Headroom::new(u64::from(capacity)),
                _keep: raw.keep,
            }),
            cq,
        })
    }
}

impl<B: Backend> Pd<B> {
    /// Allocates `len` zeroed, page-aligned bytes and registers them with
    /// exactly `access` (least privilege: ask only for what peers need).
    pub fn register(&self, len: usize, access: Access) -> Result<Mr<B>> {
        let buf = AlignedBuf::new(len);
        // SAFETY: `buf` lives in the returned Mr, which deregisters before
        // freeing it (Drop order: key first, then the buffer).
        let keys = unsafe {
            self.inner
                .b
                .reg_mr(self.inner.pd, buf.ptr() as u64, len as u64, access)
        }?;
        Ok(Mr {
            pd: Arc::clone(&self.inner),
            keys,
            access,
            buf,
            len,
        })
    }

    /// Registers memory the caller owns (the buffer pool's region, see
    /// [`crate::pool`]) with exactly `access`. The returned [`RawMr`] keeps
    /// the PD alive and deregisters when dropped.
    ///
    /// # Safety
    /// `addr..addr + len` stays valid memory until the `RawMr` is dropped.
    pub(crate) unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr<B>> {
        // SAFETY: forwarded contract (valid until the RawMr deregisters).
        let keys = unsafe {
            self.inner
                .b
                .reg_mr(self.inner.pd, addr as u64, len as u64, access)
        }?;
        Ok(RawMr {
            pd: Arc::clone(&self.inner),
            keys,
        })
    }

    /// Creates an RC QP (in RESET) whose sends complete on `send_cq` and
    /// receives on `recv_cq`.
    pub fn create_qp(&self, send_cq: &Cq<B>, recv_cq: &Cq<B>, init: &QpInit) -> Result<Qp<B>> {
        let b = &self.inner.b;
        let raw = b.create_qp(self.inner.pd, send_cq.inner.cqn, recv_cq.inner.cqn, init)?;
        let path = match raw.path {
            RawQpPath::Mlx5(dv) => match Mlx5Queues::new(dv, raw.qpn, raw.caps) {
                Ok(q) => QpPath::Mlx5(q),
                Err(e) => {
                    let _ = b.destroy_qp(raw.qpn);
                    return Err(e);
                }
            },
            RawQpPath::Portable(p) => QpPath::Portable(p),
        };
        // The CQ sizing guard: every WR the queues can hold may complete
        // at once (a flush completes all of them, signaled or not), so
        // each CQ must hold the sum over its QPs.
        let (send_need, recv_need) = match &path {
            QpPath::Mlx5(q) => (q.dv.sq_wqe_cnt, q.dv.rq_wqe_cnt),
            QpPath::Portable(p) => p.capacity(),
        };
        let demand = CqDemand {
            send: u64::from(send_need),
            recv: u64::from(recv_need),
        };
        if let Err(e) = demand.commit(&send_cq.inner, &recv_cq.inner) {
            drop(path);
            let _ = b.destroy_qp(raw.qpn);
            return Err(e);
        }
        // Relaxed: a count read only by `Qp::drain_and_reset`'s check.
        send_cq.inner.users.fetch_add(1, Ordering::Relaxed);
        recv_cq.inner.users.fetch_add(1, Ordering::Relaxed);
        Ok(Qp {
            demand,
            pd: Arc::clone(&self.inner),
            _send_cq: Arc::clone(&send_cq.inner),
            _recv_cq: Arc::clone(&recv_cq.inner),
            qpn: raw.qpn,
            caps: raw.caps,
            psn: raw.psn & 0xff_ffff,
            path,
            _keep: raw.keep,
        })
    }
}

impl Mlx5Queues {
    /// Builds the core's queues over a backend's mlx5 descriptor.
    fn new(dv: Mlx5dvQp, qpn: u32, caps: QpCaps) -> Result<Mlx5Queues> {
        let mut sq_wrid = vec![WrSlot::default(); dv.sq_wqe_cnt as usize].into_boxed_slice();
        let mut rq_wrid = vec![0u64; dv.rq_wqe_cnt as usize].into_boxed_slice();
        // SAFETY: the descriptor names queue memory kept alive by the
        // backend's `keep` (held by the Qp next to these queues); the side
        // tables are boxed and owned alongside; SGEs posted through the safe
        // API are checked by the device against registered regions before
        // any access, and scatter-to-CQE is disabled on the pollers.
        let mut sq = unsafe {
            SendQueue::from_raw(
                &dv,
                qpn,
                caps,
                SqConfig::default(),
                NonNull::new(sq_wrid.as_mut_ptr()).ok_or(Error::InvalidGeometry)?,
                sq_wrid.len(),
            )
        }?;
        // SAFETY: as above.
        let mut rq = unsafe {
            RecvQueue::from_raw(
                &dv,
                &caps,
                NonNull::new(rq_wrid.as_mut_ptr()).ok_or(Error::InvalidGeometry)?,
                rq_wrid.len(),
            )
        }?;
        sq.set_state(QpState::Reset);
        rq.set_state(QpState::Reset);
        Ok(Mlx5Queues {
            sq,
            rq,
            _sq_wrid: sq_wrid,
            _rq_wrid: rq_wrid,
            dv,
        })
    }
}

impl<B: Backend> Mr<B> {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    /// Remote key (give it to peers that need access).
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    /// Access flags the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.buf.ptr() as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Registers `len` bytes at `addr` (inside this region) once more, with
    /// `access` (for [`crate::expose`]).
    ///
    /// # Safety
    /// The range lies inside this region's buffer, and the registration is
    /// deregistered ([`Mr::deregister_range`]) before the buffer is freed.
    pub(crate) unsafe fn register_range(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MrKeys> {
        // SAFETY: forwarded contract.
        unsafe { self.pd.b.reg_mr(self.pd.pd, addr, len, access) }
    }

    /// Deregisters a registration made by [`Mr::register_range`].
    pub(crate) fn deregister_range(&self, keys: MrKeys) -> Result<()> {
        self.pd.b.dereg_mr(keys.lkey)
    }

    /// True if `qp` is in this region's protection domain.
    pub(crate) fn same_pd(&self, qp: &Qp<B>) -> bool {
        Arc::ptr_eq(&self.pd, &qp.pd)
    }

    /// Allocates a type-2 memory window in this region's PD (for
    /// [`crate::expose`]); returns its key.
    pub(crate) fn alloc_window(&self) -> Result<u32> {
        self.pd.b.alloc_mw(self.pd.pd)
    }

    /// Deallocates a window made by [`Mr::alloc_window`].
    pub(crate) fn dealloc_window(&self, rkey: u32) -> Result<()> {
        self.pd.b.dealloc_mw(rkey)
    }

    /// An SGE for `len` bytes at `offset` (bounds are checked by the
    /// device when the WR executes).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge::new(self.addr().wrapping_add(offset as u64), len, self.keys.lkey)
    }
    /// The remote address of byte `offset`, for a peer.
    pub fn remote(&self, offset: usize) -> Remote {
        Remote::new(self.addr().wrapping_add(offset as u64), self.keys.rkey)
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf.bytes()[..self.len]
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf.bytes_mut()[..len]
    }
    /// Reads the 8-byte word at `offset` atomically (host order): for
    /// counters that peers update with RDMA atomics.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        if offset % 8 != 0 || offset + 8 > self.len {
            return None;
        }
        // SAFETY: in bounds and 8-aligned (page-aligned base).
        let a =
            unsafe { core::sync::atomic::AtomicU64::from_ptr(self.buf.ptr().add(offset).cast()) };
        Some(a.load(core::sync::atomic::Ordering::SeqCst))
    }
}

impl<B: Backend> Drop for Mr<B> {
    fn drop(&mut self) {
        // Deregister before the buffer is freed (fields drop after this).
        let _ = self.pd.b.dereg_mr(self.keys.lkey);
    }
}

/// A registration of memory someone else owns ([`Pd::register_raw`]):
/// holds the PD and deregisters on drop; the owner frees the memory only
/// afterwards.
pub(crate) struct RawMr<B: Backend> {
    pd: Arc<PdInner<B>>,
    keys: MrKeys,
}

impl<B: Backend> RawMr<B> {
    /// The keys.
    pub(crate) fn keys(&self) -> MrKeys {
        self.keys
    }
}

impl<B: Backend> Drop for RawMr<B> {
    fn drop(&mut self) {
        let _ = self.pd.b.dereg_mr(self.keys.lkey);
    }
}

impl<B: Backend> Cq<B> {
    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.inner.cqn
    }
    /// Entries.
    pub fn depth(&self) -> u32 {
        match &self.cq {
            CqPath::Mlx5(cq) => cq.cqe_cnt(),
            CqPath::Portable(p) => p.depth(),
        }
    }
    /// Polls up to `out.len()` completions of the QPs in `route` (one
    /// [`Qp`], or a slice of `&mut Qp` sharing this CQ). Allocation- and
    /// lock-free.
    #[inline]
    ///
    /// On a portable CQ (provider-polled) the route is not needed: the
    /// provider retires queue space itself.
    pub fn poll<R: CqRoute + ?Sized>(&mut self, route: &mut R, out: &mut [Wc]) -> Result<usize> {
        if self.inner.metered() {
            return self.poll_metered(|cq, out| cq.poll(route, out), out);
        }
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.poll(route, out),
            CqPath::Portable(p) => p.poll(out),
        }
    }

    /// Polls an unguarded CQ and gives the consumed completions' room back
    /// to the posters' headroom check.
    #[cold]
    fn poll_metered(
        &mut self,
        mlx5: impl FnOnce(&mut CompletionQueue, &mut [Wc]) -> Result<usize>,
        out: &mut [Wc],
    ) -> Result<usize> {
        let (r, consumed) = match &mut self.cq {
            CqPath::Mlx5(cq) => {
                // Every CQE consumed counts (forced signals the poller
                // retires without reporting included): the consumer index.
                let ci = cq.consumer_index();
                let r = mlx5(cq, out);
                (r, cq.consumer_index().wrapping_sub(ci))
            }
            CqPath::Portable(p) => {
                // The portable path reports every completion it was asked
                // for (its own forced signals are neither counted at post
                // nor reported here).
                let r = p.poll(out);
                let n = *r.as_ref().unwrap_or(&0) as u32;
                (r, n)
            }
        };
        self.inner.unreserve(u64::from(consumed));
        r
    }
}

impl<B: Backend> Cq<B> {
    /// The fd that becomes readable when the armed CQ gets a completion
    /// (for the application's own epoll set; see [`Cq::arm`]).
    pub fn event_fd(&self) -> Result<i32> {
        self.inner.b.cq_event_fd(self.inner.cqn)
    }

    /// Requests one event for the next completion. Poll once more after
    /// arming: a completion that arrived before the arm may not raise one.
    pub fn arm(&mut self) -> Result<()> {
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.arm(false),
            CqPath::Portable(p) => p.arm(),
        }
    }

    /// Requests one event for the next solicited completion (a SEND the
    /// peer posted with [`SendFlags::SOLICITED`](crate::SendFlags)) or
    /// error completion; other completions raise none. Poll once more
    /// after arming, as for [`Cq::arm`].
    pub fn arm_solicited(&mut self) -> Result<()> {
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.arm(true),
            CqPath::Portable(p) => p.arm_solicited(),
        }
    }

    /// Takes the pending events without blocking (after the fd became
    /// readable); returns how many.
    pub fn consume_events(&mut self) -> Result<u32> {
        let n = self.inner.b.cq_event_consume(self.inner.cqn)?;
        if let CqPath::Mlx5(cq) = &mut self.cq {
            // Each delivered event advances the arm sequence number.
            cq.events_consumed(n);
        }
        Ok(n)
    }

    /// Worst-case completions the QPs attached to this CQ can have
    /// outstanding (every WR their queues can hold).
    pub fn committed(&self) -> u64 {
        *self
            .inner
            .committed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// How deep this CQ would have to be for its QPs plus `extra` more
    /// worst-case completions (e.g. a QP that [`Pd::create_qp`] refused
    /// with [`Error::CqTooSmall`]: pass the send plus receive capacity it
    /// asked for, rounded up as the device rounds queue sizes).
    pub fn depth_needed(&self, extra: u64) -> u64 {
        self.committed() + extra
    }

    /// Opts this CQ out of the sizing guard: [`Pd::create_qp`] no longer
    /// refuses QPs that could overrun it. For owners that moderate
    /// completions themselves (signal rarely, never flush more than the
    /// CQ holds). A flush can then still overrun it and lose completions:
    /// the software device reports `CqOverrun`, hardware moves the CQ to an
    /// error state.
    ///
    /// In normal operation an unguarded CQ is still protected at run time:
    /// posts count the completions their WRs will produce (signaled sends,
    /// every receive, and a CQE the signalling guard may add) against the
    /// CQ's headroom, polls give the room back, and a WR whose completion
    /// might not fit is refused with [`Error::CqFull`] (the WRs before it
    /// are posted). Opt out before posting on the CQ's QPs: work posted
    /// while the CQ was guarded is not counted.
    pub fn set_unguarded(&self, unguarded: bool) {
        // Relaxed: a setting read on the control path.
        self.inner.unguarded.store(unguarded, Ordering::Relaxed);
    }

    /// Sets the adaptive waiter's spin range.
    pub fn set_adaptive(&mut self, cfg: AdaptiveConfig) {
        self.adaptive = Adaptive::new(cfg);
    }

    /// The adaptive waiter's current spin budget.
    pub fn spin_budget(&self) -> Duration {
        self.adaptive.budget()
    }

    /// Waits up to `timeout` for completions of the QPs in `route` and
    /// polls them into `out`: returns how many (at least one), or
    /// [`Error::Timeout`]. Never blocks longer than `timeout`.
    pub fn wait<R: CqRoute + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
        mode: WaitMode,
        timeout: Duration,
    ) -> Result<usize> {
        let mut adaptive = self.adaptive;
        let r = crate::event::wait(
            &mut RoutedCq { cq: self, route },
            out,
            mode,
            &mut adaptive,
            timeout,
        );
        self.adaptive = adaptive;
        r
    }
}

/// A CQ and the route its completions go to, as [`crate::event::wait`]
/// sees them.
struct RoutedCq<'a, B: Backend, R: CqRoute + ?Sized> {
    cq: &'a mut Cq<B>,
    route: &'a mut R,
}

impl<B: Backend, R: CqRoute + ?Sized> crate::event::Waitable for RoutedCq<'_, B, R> {
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        self.cq.poll(self.route, out)
    }
    fn arm(&mut self) -> Result<()> {
        self.cq.arm()
    }
    fn consume(&mut self) -> Result<u32> {
        self.cq.consume_events()
    }
    fn fd(&self) -> Result<i32> {
        self.cq.event_fd()
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
            QpPath::Portable(p) => p.state(),
        }
    }
    /// Free send-queue space: 64-byte basic blocks on the mlx5 path, WRs
    /// on the portable path (the unit a WR of the smallest shape uses).
    pub fn send_space(&self) -> u32 {
        match &self.path {
            QpPath::Mlx5(q) => q.sq.free_bbs(),
            QpPath::Portable(p) => p.send_space(),
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
            QpPath::Portable(p) => p.failure(),
        }
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
            QpPath::Portable(p) => p.state_changed(state),
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

    /// Moves the QP to `m.state` (validated by the device).
    pub fn modify(&mut self, m: &QpModify) -> Result<()> {
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
            QpPath::Portable(p) => p.state_changed(m.state),
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
    pub fn connect(&mut self, remote: &QpInfo, attr: &ConnectAttr) -> Result<()> {
        if self.pd.b.port().transport == Transport::Iwarp {
            return Err(Error::Unsupported);
        }
        for m in self.connect_steps(remote, attr) {
            self.modify(&m)?;
        }
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
            QpPath::Portable(p) => p.post_send(wrs),
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
            QpPath::Portable(p) => p.post_send(core::slice::from_ref(wr)).map_err(|e| e.error),
        }
    }

    /// Posts receive WRs with one doorbell-record update.
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
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
            QpPath::Portable(p) => p.post_recv(wrs),
        }
    }

    /// `post_send` on a QP whose send CQ opted out of the sizing guard:
    /// posts only the WRs whose completions fit in the CQ's headroom, and
    /// refuses the first one that does not with [`Error::CqFull`].
    #[cold]
    fn post_send_metered(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        // The mlx5 core may add one CQE of its own at the doorbell (the
        // signalling guard, §A.9); room for it is kept back.
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
            QpPath::Portable(p) => (p.post_send(&wrs[..n]), 0),
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
    }
}

/// What one QP may put on its CQs at worst.
#[derive(Clone, Copy, Debug)]
struct CqDemand {
    send: u64,
    recv: u64,
}

impl CqDemand {
    /// Adds this demand to the CQs, or fails with [`Error::CqTooSmall`]
    /// (and changes nothing) if a guarded CQ would be overcommitted.
    fn commit<B: Backend>(&self, scq: &CqInner<B>, rcq: &CqInner<B>) -> Result<()> {
        let same = core::ptr::eq(scq, rcq);
        let check = |c: &CqInner<B>, add: u64, total: u64| -> bool {
            // Relaxed: a setting read on the control path.
            c.unguarded.load(Ordering::Relaxed) || total + add <= u64::from(c.capacity)
        };
        if same {
            let mut g = lock(scq);
            if !check(scq, self.send + self.recv, *g) {
                return Err(Error::CqTooSmall);
            }
            *g += self.send + self.recv;
            return Ok(());
        }
        // Lock in address order, so two QPs attaching to the same pair of
        // CQs in opposite roles cannot deadlock.
        let (mut gs, mut gr) = if (scq as *const CqInner<B>) < (rcq as *const CqInner<B>) {
            let gs = lock(scq);
            (gs, lock(rcq))
        } else {
            let gr = lock(rcq);
            (lock(scq), gr)
        };
        if !check(scq, self.send, *gs) || !check(rcq, self.recv, *gr) {
            return Err(Error::CqTooSmall);
        }
        *gs += self.send;
        *gr += self.recv;
        Ok(())
    }

    fn release<B: Backend>(&self, scq: &CqInner<B>, rcq: &CqInner<B>) {
        let mut g = lock(scq);
        *g = g.saturating_sub(self.send);
        drop(g);
        let mut g = lock(rcq);
        *g = g.saturating_sub(self.recv);
    }
}

/// Locks a CQ's committed-demand counter (a panic while holding it cannot
/// leave the number torn).
fn lock<B: Backend>(c: &CqInner<B>) -> std::sync::MutexGuard<'_, u64> {
    c.committed.lock().unwrap_or_else(|p| p.into_inner())
}

/// The three state changes that connect a QP with initial send PSN `psn`
/// on `port` to `remote`: INIT, RTR and RTS (shared by [`Qp::connect_steps`]
/// and the C ABI). On RoCE the GRH is always set (from `attr`'s GID index,
/// hop limit and traffic class); on InfiniBand only when the peer has no
/// LID.
pub(crate) fn connect_steps_for(
    port: &PortInfo,
    psn: u32,
    remote: &QpInfo,
    attr: &ConnectAttr,
) -> [QpModify; 3] {
    let mut init = QpModify::to(QpState::Init);
    init.access = attr.access;
    init.port_num = port.port_num.max(1);
    let mut rtr = QpModify::to(QpState::Rtr);
    rtr.port_num = init.port_num;
    rtr.dest_qpn = remote.qpn;
    rtr.rq_psn = remote.psn & 0xff_ffff;
    // A peer MTU of 0 means unknown (ibv_rc_pingpong's message carries
    // none): use this port's.
    let remote_mtu = if remote.mtu == 0 {
        port.mtu
    } else {
        remote.mtu.max(256)
    };
    let mut mtu = port.mtu.min(remote_mtu);
    if attr.max_mtu != 0 {
        mtu = mtu.min(attr.max_mtu);
    }
    rtr.path_mtu = mtu;
    rtr.max_dest_rd_atomic = attr.max_rd_atomic;
    rtr.min_rnr_timer = attr.min_rnr_timer;
    rtr.av = AddressVector {
        dlid: remote.lid,
        sl: attr.sl,
        is_global: port.transport == Transport::Roce || remote.lid == 0,
        dgid: remote.gid,
        sgid_index: attr.gid_index.unwrap_or(port.gid_index),
        hop_limit: attr.hop_limit,
        traffic_class: attr.traffic_class,
        flow_label: 0,
    };
    let mut rts = QpModify::to(QpState::Rts);
    rts.sq_psn = psn;
    rts.timeout = attr.timeout;
    rts.rnr_retry = attr.rnr_retry;
    rts.retry_cnt = attr.retry_cnt;
    rts.max_rd_atomic = attr.max_rd_atomic;
    rts.rate_limit_kbps = attr.rate_limit_kbps;
    [init, rtr, rts]
}

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
    /// send WRs (portable), plus receives.
    pub fn outstanding(&self) -> u64 {
        match &self.path {
            QpPath::Mlx5(q) => {
                u64::from(q.sq.producer().wrapping_sub(q.sq.retired()))
                    + u64::from(q.rq.head().wrapping_sub(q.rq.tail()))
            }
            QpPath::Portable(p) => p.outstanding(),
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
    /// The CQs must serve only this QP (other QPs' completions would be
    /// consumed): otherwise [`Error::ResourceBusy`]. Gives up with
    /// [`Error::Timeout`] after `timeout`.
    pub fn drain_and_reset(
        &mut self,
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
        let deadline = Instant::now() + timeout;
        let mut reported = 0usize;
        let mut out = [Wc::default(); 32];
        while self.outstanding() != 0 {
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
    /// returns [`Error::Unsupported`] for them after the reset.
    pub fn recover(
        &mut self,
        send_cq: &mut Cq<B>,
        recv_cq: Option<&mut Cq<B>>,
        peer: &QpInfo,
        attr: &ConnectAttr,
        timeout: Duration,
        on_wc: impl FnMut(&Wc),
    ) -> Result<Recovery> {
        let r = self.drain_and_reset(send_cq, recv_cq, timeout, on_wc)?;
        self.connect(peer, attr)?;
        Ok(r)
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

/// A QP whose send queue any number of threads post to at once, without a
/// lock (`Sync`; share it in an `Arc`). Made by [`Qp::into_shared`]; its
/// completions are polled through the matching [`SharedQpPoller`].
pub struct SharedQp<B: Backend> {
    sq: SharedSendQueue,
    qpn: u32,
    pd: Arc<PdInner<B>>,
    _send_cq: Arc<CqInner<B>>,
    _recv_cq: Arc<CqInner<B>>,
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
    /// Needs the mlx5 data path ([`Error::Unsupported`] otherwise).
    pub fn into_shared(self) -> Result<(Arc<SharedQp<B>>, SharedQpPoller<B>)> {
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
        let (pd, send_cq, recv_cq, path, keep) = unsafe {
            (
                core::ptr::read(&this.pd),
                core::ptr::read(&this._send_cq),
                core::ptr::read(&this._recv_cq),
                core::ptr::read(&this.path),
                core::ptr::read(&this._keep),
            )
        };
        let QpPath::Mlx5(Mlx5Queues {
            rq,
            _rq_wrid: rq_wrid,
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
            _slots: slots,
            _ready: ready,
            _keep: keep,
        });
        let poller = SharedQpPoller {
            retire: SharedRetirer(Arc::clone(&shared)),
            rq,
            _rq_wrid: rq_wrid,
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
        // The last handle (poller included) is gone: destroy, then free.
        let _ = self.pd.b.destroy_qp(self.qpn);
    }
}

impl<B: Backend> SharedQpPoller<B> {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.retire.0.qpn
    }
    /// Posts receive WRs (the receive queue belongs to the poller).
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
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
            // Shared QPs exist only on the mlx5 path; a portable CQ has
            // none of their completions to route.
            CqPath::Portable(p) => p.poll(out),
        }
    }
}
