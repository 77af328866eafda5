//! Queue memory the device allocates for QPs and CQs, the descriptors
//! `create_qp`/`create_cq` hand out, and how queues are sized.

use std::sync::Arc;

use super::QpInit;
use crate::provider::mlx5::layout::{Mlx5dvCq, Mlx5dvQp};
use crate::util::AlignedBuf;
use crate::wr::QpCaps;

/// Memory the device allocated for a QP (the QP buffer, doorbell record
/// and doorbell register pair). Shared with the application's queue
/// objects, freed when both sides are done.
pub struct QpMem {
    pub(super) buf: AlignedBuf,
    pub(super) dbrec: AlignedBuf,
    pub(super) bf: AlignedBuf,
    pub(super) rq_bytes: usize,
}

/// Memory the device allocated for a CQ.
pub struct CqMem {
    pub(super) buf: AlignedBuf,
    pub(super) dbrec: AlignedBuf,
    pub(super) uar: AlignedBuf,
}

/// What `create_qp` returns: the raw queue descriptor for the core, the
/// QP number, the granted capabilities and the memory keep-alive.
pub struct SoftQp {
    /// Fields as `mlx5dv_init_obj` would return them.
    pub dv: Mlx5dvQp,
    /// QP number.
    pub qpn: u32,
    /// Granted capabilities.
    pub caps: QpCaps,
    /// Keeps the queue memory alive.
    pub mem: Arc<QpMem>,
}

/// What `create_cq` returns.
pub struct SoftCq {
    /// Fields as `mlx5dv_init_obj` would return them.
    pub dv: Mlx5dvCq,
    /// CQ number.
    pub cqn: u32,
    /// Keeps the CQ memory alive.
    pub mem: Arc<CqMem>,
}

/// Largest send WQE for `init`: atomics (64 B), ctrl + raddr + SGEs, or
/// ctrl + raddr + inline header + payload, rounded up to a BB.
pub(super) fn max_wqe_bytes(init: &QpInit) -> u32 {
    [
        64,
        32 + 16 * init.max_send_sge,
        32 + (4 + init.max_inline_data).div_ceil(16) * 16,
    ]
    .into_iter()
    .max()
    .unwrap_or(64)
    .next_multiple_of(64)
}

/// SQ basic blocks and RQ entries the device gives a QP created with
/// `init` (as rdma-core sizes mlx5 queues, reference §A.2, §A.6).
pub fn queue_sizes(init: &QpInit) -> (u32, u32) {
    (
        pow2(init.max_send_wr.saturating_mul(max_wqe_bytes(init)) / 64),
        pow2(init.max_recv_wr),
    )
}

pub(super) fn pow2(v: u32) -> u32 {
    v.max(1).next_power_of_two()
}

impl QpMem {
    /// Bytes of the RQ ring (the SQ follows it).
    pub fn rq_bytes(&self) -> usize {
        self.rq_bytes
    }
}

impl CqMem {
    /// The CQ's UAR page (arm register at +0x20).
    pub fn uar(&self) -> *mut u8 {
        self.uar.ptr()
    }
}
