//! The C types and constants of the object API: the opaque handle types,
//! the configuration and connection structs, and the access bits.

use core::mem::size_of;

use static_assertions::const_assert_eq;

use crate::attr::Access;
use crate::ffi::mlx5::RDD_MLX5_CQ_ARM_SOLICITED;

// ---------------------------------------------------------------------
// C types
// ---------------------------------------------------------------------

/// A device (opaque handle). Open with `rdd_device_open_soft`, close with
/// `rdd_device_close`.
pub struct rdd_device {
    _private: [u8; 0],
}

/// A protection domain (opaque handle): `rdd_pd_alloc` / `rdd_pd_free`.
pub struct rdd_pd {
    _private: [u8; 0],
}

/// A registered memory region with a library-owned buffer (opaque handle):
/// `rdd_mr_reg` / `rdd_mr_free`.
pub struct rdd_mr {
    _private: [u8; 0],
}

/// A completion queue (opaque handle): `rdd_cq_create` / `rdd_cq_destroy`.
pub struct rdd_cq {
    _private: [u8; 0],
}

/// A queue pair (opaque handle), reliable-connected (`rdd_qp_create`) or
/// unreliable-datagram (`rdd_qp_create_ud`); `rdd_qp_destroy`.
pub struct rdd_qp {
    _private: [u8; 0],
}

/// Software-device configuration for `rdd_device_open_soft` (NULL there
/// means all defaults).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_soft_config {
    /// CQE size of new CQs: 64 or 128 (0: 64).
    pub cqe_size: u32,
    /// Delay in microseconds before an operation refused for lack of a
    /// posted receive (RNR) is retried, in thread mode (0: 20 us). In step
    /// mode every `rdd_device_step` is one retry.
    pub rnr_delay_us: u32,
}

/// `rdd_mr_reg` access bit: the device may write the region for local work
/// (receives, READ and atomic results). Numbered as `IBV_ACCESS_*`.
pub const RDD_ACCESS_LOCAL_WRITE: u32 = 0x1;
/// `rdd_mr_reg` / `rdd_connect_attr` access bit: peers may RDMA WRITE
/// (an MR with it needs `RDD_ACCESS_LOCAL_WRITE` too).
pub const RDD_ACCESS_REMOTE_WRITE: u32 = 0x2;
/// `rdd_mr_reg` / `rdd_connect_attr` access bit: peers may RDMA READ.
pub const RDD_ACCESS_REMOTE_READ: u32 = 0x4;
/// `rdd_mr_reg` / `rdd_connect_attr` access bit: peers may run atomics
/// (an MR with it needs `RDD_ACCESS_LOCAL_WRITE` too).
pub const RDD_ACCESS_REMOTE_ATOMIC: u32 = 0x8;
/// `rdd_mr_reg` access bit (regions only): memory windows may be bound to
/// the region, for `rdd_mr_expose_to`. Grants nothing by itself; devices
/// without windows ignore it.
pub const RDD_ACCESS_MW_BIND: u32 = 0x10;

const_assert_eq!(RDD_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE.0);
const_assert_eq!(RDD_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE.0);
const_assert_eq!(RDD_ACCESS_REMOTE_READ, Access::REMOTE_READ.0);
const_assert_eq!(RDD_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC.0);
const_assert_eq!(RDD_ACCESS_MW_BIND, Access::MW_BIND.0);
const_assert_eq!(
    RDD_ACCESS_LOCAL_WRITE
        | RDD_ACCESS_REMOTE_WRITE
        | RDD_ACCESS_REMOTE_READ
        | RDD_ACCESS_REMOTE_ATOMIC,
    Access::ALL.0
);

/// `rdd_qp_init.flags`: every send WR requests a completion (as if
/// `RDD_SEND_SIGNALED` were always set; `sq_sig_all` in verbs).
pub const RDD_QP_INIT_SIG_ALL: u32 = 0x1;

/// QP creation attributes for `rdd_qp_create` (NULL there means the
/// defaults: 64 send and 64 receive WRs, 4 SGEs each way, 64 inline
/// bytes). The device may grant more than asked: read the result with
/// `rdd_qp_query_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct rdd_qp_init {
    /// Send WRs the send queue must hold (at least 1).
    pub max_send_wr: u32,
    /// Receive WRs the receive queue must hold.
    pub max_recv_wr: u32,
    /// SGEs per send WR (at most 30).
    pub max_send_sge: u32,
    /// SGEs per receive WR (at most 64).
    pub max_recv_sge: u32,
    /// Inline payload bytes per send WR (at most 512).
    pub max_inline_data: u32,
    /// `RDD_QP_INIT_*` bits; unknown bits are `RDD_STATUS_INVALID_ARGUMENT`.
    pub flags: u32,
}

impl rdd_qp_init {
    /// The queue sizes as the Rust API's [`QpInit`] (the flags are the
    /// caller's to check).
    pub(super) fn queue_sizes(&self) -> crate::attr::QpInit {
        crate::attr::QpInit {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
            srq: None,
        }
    }
}

/// Connection data of a QP (`rdd_qp_query_info`), handed to the peer out of
/// band and passed to its `rdd_qp_connect`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_qp_info {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// Port LID (InfiniBand).
    pub lid: u16,
    /// Written as 0; ignored on input.
    pub reserved: u16,
    /// Port GID (RoCE).
    pub gid: [u8; 16],
    /// Path MTU in bytes.
    pub mtu: u32,
}

const_assert_eq!(size_of::<rdd_qp_info>(), 32);

/// Connection attributes for `rdd_qp_connect` (NULL there means no remote
/// access and infinite retries).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_connect_attr {
    /// Remote operations this QP executes for its peer
    /// (`RDD_ACCESS_REMOTE_*`; each is also checked against the target
    /// MR's access).
    pub access: u32,
    /// RNR retries, 0..7 (7 = infinite).
    pub rnr_retry: u8,
    /// Transport retries, 0..7 (as in the IB spec, 7 is seven retries,
    /// then the WR fails with `RDD_WC_RETRY_EXC_ERR`; rxe would retry
    /// forever at 7, so on rxe the QP is given 6).
    pub retry_cnt: u8,
    /// GRH traffic class: the DSCP/ECN byte on RoCEv2, so this QP's
    /// traffic can sit on its own PFC priority (0: default).
    pub traffic_class: u8,
    /// Service level (InfiniBand SL; VLAN priority on RoCE).
    pub sl: u8,
}

const_assert_eq!(size_of::<rdd_connect_attr>(), 8);

/// `rdd_cq_arm` flag: an event only for the next *solicited* completion.
pub const RDD_CQ_ARM_SOLICITED: u32 = 0x1;
const_assert_eq!(RDD_CQ_ARM_SOLICITED, RDD_MLX5_CQ_ARM_SOLICITED);

/// Most QPs that may complete on one CQ (each `rdd_cq_poll` passes all of
/// them).
pub const RDD_CQ_MAX_QPS: usize = 256;

/// Largest buffer `rdd_mr_reg` allocates (2^40 bytes).
pub const RDD_MR_MAX_LEN: usize = 0x100_0000_0000;
