//! Queue memory the device allocates for QPs and CQs, the descriptors
//! `create_qp`/`create_cq` hand out.

use std::sync::Arc;

use crate::provider::mlx5::layout::{Mlx5dvCq, Mlx5dvQp};
use crate::provider::mlx5::SrqGeometry;
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

/// Memory the device allocated for a shared receive queue: the WQE
/// buffer and the doorbell record, shared with the application's queue.
pub struct SrqMem {
    pub(super) buf: AlignedBuf,
    pub(super) dbrec: AlignedBuf,
}

/// What `create_srq` returns: the queue's geometry for the core's
/// [`crate::provider::mlx5::Srq`], the granted sizes and the memory
/// keep-alive.
pub struct SoftSrq {
    /// Buffer, doorbell record, stride and list sizes, as libmlx5 lays
    /// them out (docs/spec/mlx5.md §11).
    pub geo: SrqGeometry,
    /// SRQ number (never 0).
    pub srqn: u32,
    /// Receives the SRQ holds at once (the free list's size minus the
    /// tail WQE the device never fills).
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// Keeps the queue memory alive.
    pub mem: Arc<SrqMem>,
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
