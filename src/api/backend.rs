//! The control path a device runs on ([`Backend`]), the data-path driver
//! traits ([`QpDriver`], [`CqDriver`]), and the raw CQ and QP handles a backend hands out.

use std::any::Any;
use std::boxed::Box;
use std::sync::Arc;

use crate::attr::{AddressVector, SrqAttr};
use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::{Mlx5Av, Mlx5dvCq, Mlx5dvQp, SrqGeometry};
use crate::wr::{QpCaps, RecvWr, SendWr};

use super::{Access, AsyncEvent, QpInit, QpModify, QpState, Wc};

/// A data path other than the crate's mlx5 core, for the send and
/// receive queues of one QP: libibverbs' `ibv_post_send` /
/// `ibv_post_recv` on providers without a direct path (rxe, siw, ...).
///
/// Implementations validate every WR with the crate's rules (same typed
/// errors as the direct path) before handing it to the provider, and stop
/// at the first refused WR like [`super::Qp::post_send`].
pub trait QpDriver: Send {
    /// Posts send WRs, batching them into as few provider calls as it can.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError>;
    /// Posts send WRs as [`QpDriver::post_send`] does (same validation,
    /// same stopping rule, same errors; they count as outstanding at
    /// once), but may leave the provider's doorbell for later: a driver
    /// that can defer writes them into its queue and makes no provider
    /// call, and the next [`QpDriver::ring`] or `post_send` (and
    /// [`QpDriver::post_drain_marker`]) makes one for all of them, in
    /// posting order. The default posts and rings at once, so on a driver
    /// that cannot defer this is only a batching hint.
    fn post_send_deferred(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        self.post_send(wrs)
    }
    /// Rings for every WR posted with [`QpDriver::post_send_deferred`]
    /// since the last doorbell, in one provider call. `Ok(true)` if it
    /// made one, `Ok(false)` if nothing was pending (nothing happens). On
    /// an error the WRs stay pending and the next ring or post retries.
    /// The default has nothing to ring.
    fn ring(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Send WRs deferred and not yet rung (0 for a driver that cannot
    /// defer, the default).
    fn deferred(&self) -> u32 {
        0
    }
    /// Whether [`QpDriver::post_send_deferred`] really defers (false, the
    /// default: it posts and rings at once).
    fn can_defer(&self) -> bool {
        false
    }
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
    /// Recovery's drain marker, called in ERROR while send work is
    /// outstanding: posts one internal signaled WR after everything posted
    /// so far, whose completion (a flush) retires every earlier send, and
    /// which is never reported. It makes recovery finish when the last
    /// sends were unsignaled and the device executed them (they have no
    /// completion of their own). `Ok(true)` if a marker was posted,
    /// `Ok(false)` if none is needed (nothing outstanding, or the last send
    /// is a marker already); [`Error::SqFull`] when the queue has no room
    /// yet (poll, then call again). The default posts nothing: for a
    /// driver whose outstanding count reaches zero by itself.
    fn post_drain_marker(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Posts one datagram on a UD QP (SEND or SEND_WITH_IMM) to QP
    /// `remote_qpn` through the provider address handle `ah` (made by this
    /// driver's backend, [`Backend::create_driver_ah`], and alive for the
    /// call) with Q_Key `qkey`, validated as [`QpDriver::post_send`]
    /// validates. The default, for drivers without UD, is
    /// [`Error::Unsupported`].
    fn post_send_ud(
        &mut self,
        wr: &SendWr<'_>,
        ah: DriverAh,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<()> {
        let _ = (wr, ah, remote_qpn, qkey);
        Err(Error::Unsupported)
    }
}

/// A provider address handle ([`Backend::create_driver_ah`]): the
/// backend's handle for it and the token its QP drivers post with (on the
/// verbs fallback, the `ibv_ah` pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverAh {
    /// What [`Backend::destroy_driver_ah`] takes.
    pub handle: u32,
    /// What [`QpDriver::post_send_ud`] receives.
    pub token: u64,
}

/// The completion side of a data-path driver: polls one CQ and reports
/// completions with the user's wr_ids.
pub trait CqDriver: Send {
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
    Driver(Box<dyn CqDriver>),
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
    Driver(Box<dyn QpDriver>),
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

/// The queue of a shared receive queue as a backend hands it out.
pub enum RawSrqPath {
    /// An mlx5 SRQ ring (docs/spec/mlx5.md §11), written by the crate's
    /// core ([`crate::provider::mlx5::Srq`]).
    Mlx5(SrqGeometry),
}

/// What a backend hands out for a provider-posted shared receive queue
/// ([`Backend::create_driver_srq`]: the verbs fallback's
/// `ibv_post_srq_recv`). Its receives complete through a [`CqDriver`],
/// which reports their wr_ids itself.
///
/// A type of its own rather than a second [`RawSrqPath`] variant: every
/// [`RawSrq`] is an mlx5 ring, and a backend with only this kind answers
/// [`Backend::create_srq`] with [`Error::Unsupported`]; the Rust API and
/// the C object level (src/ffi/object/srq.rs, `SrqQueue::Driver`) then
/// ask for this one.
pub struct RawDriverSrq {
    /// The posting side.
    pub driver: Box<dyn SrqDriver>,
    /// SRQ number (a backend-chosen handle, never 0).
    pub srqn: u32,
    /// Granted sizes (the limit is 0: not armed).
    pub attr: SrqAttr,
    /// Keeps the device alive.
    pub keep: Arc<dyn Any + Send + Sync>,
}

/// The posting side of a provider-posted shared receive queue.
///
/// Implementations validate every WR with the crate's receive rules
/// (same typed errors as [`crate::provider::mlx5::Srq::post_list`]) before
/// handing it to the provider, and stop at the first refused WR.
pub trait SrqDriver: Send {
    /// Posts receive WRs to the SRQ.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError>;
}

/// What a backend hands out for a shared receive queue.
pub struct RawSrq {
    /// The queue.
    pub path: RawSrqPath,
    /// SRQ number (never 0 on the mlx5 path: a CQE's SRQ field is 0 for
    /// QPs without one).
    pub srqn: u32,
    /// Granted sizes (the limit is 0: not armed).
    pub attr: SrqAttr,
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
    /// Creates a shared receive queue in `pd` for at least `max_wr`
    /// receives of `max_sge` scatter entries. The default, for devices
    /// (or data paths) without SRQs, is [`Error::Unsupported`].
    fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<RawSrq> {
        let _ = (pd, max_wr, max_sge);
        Err(Error::Unsupported)
    }
    /// Creates a provider-posted SRQ (for backends whose SRQs are not
    /// mlx5 rings; [`Backend::create_srq`] is tried first and this only
    /// when that is [`Error::Unsupported`]). The default is
    /// [`Error::Unsupported`]. Every other SRQ call takes its `srqn`.
    fn create_driver_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<RawDriverSrq> {
        let _ = (pd, max_wr, max_sge);
        Err(Error::Unsupported)
    }
    /// Destroys an SRQ; one with QPs attached is [`Error::ResourceBusy`]
    /// and stays as it was.
    fn destroy_srq(&self, srqn: u32) -> Result<()> {
        let _ = srqn;
        Err(Error::Unsupported)
    }
    /// Arms the SRQ's limit (0 disarms; see [`SrqAttr::srq_limit`]).
    fn arm_srq_limit(&self, srqn: u32, limit: u32) -> Result<()> {
        let _ = (srqn, limit);
        Err(Error::Unsupported)
    }
    /// The SRQ's sizes and armed limit.
    fn query_srq(&self, srqn: u32) -> Result<SrqAttr> {
        let _ = srqn;
        Err(Error::Unsupported)
    }
    /// Creates an RC QP in RESET (on the SRQ [`QpInit::srq`] names, if
    /// set: backends without SRQs refuse that with
    /// [`Error::Unsupported`]).
    fn create_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<RawQp>;
    /// Creates an unreliable-datagram QP in RESET (`init` as for
    /// [`Backend::create_qp`]). The default, for backends without UD, is
    /// [`Error::Unsupported`].
    fn create_ud_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<RawQp> {
        let _ = (pd, send_cq, recv_cq, init);
        Err(Error::Unsupported)
    }
    /// Moves a UD QP from RESET to RTS with Q_Key `qkey` (a refused call
    /// changes nothing). Default: [`Error::Unsupported`].
    fn ready_ud(&self, qpn: u32, qkey: u32) -> Result<()> {
        let _ = (qpn, qkey);
        Err(Error::Unsupported)
    }
    /// Builds the mlx5 address vector of an address handle in `pd` to
    /// `dest` (the backend knows its link layer and GID table). Default:
    /// [`Error::Unsupported`].
    fn create_ah(&self, pd: u32, dest: &AddressVector) -> Result<Mlx5Av> {
        let _ = (pd, dest);
        Err(Error::Unsupported)
    }
    /// Creates a provider address handle in `pd` to `dest`, sent from
    /// `port_num` (for backends whose UD QPs are driver QPs;
    /// [`Backend::create_ah`] is tried first and this only when that is
    /// [`Error::Unsupported`]). Default: [`Error::Unsupported`].
    fn create_driver_ah(&self, pd: u32, port_num: u8, dest: &AddressVector) -> Result<DriverAh> {
        let _ = (pd, port_num, dest);
        Err(Error::Unsupported)
    }
    /// Destroys an address handle made by [`Backend::create_driver_ah`].
    fn destroy_driver_ah(&self, handle: u32) -> Result<()> {
        let _ = handle;
        Err(Error::Unsupported)
    }
    /// Changes a QP's state.
    fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()>;
    /// Destroys a QP.
    fn destroy_qp(&self, qpn: u32) -> Result<()>;
    /// The worst case of completions a QP created with `init` can put on
    /// its send and receive CQs (what its queues will hold), for sizing
    /// CQs before creating QPs; the guard in [`super::Pd::create_qp`] checks the
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
