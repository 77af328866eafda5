//! How a device is opened ([`VerbsConfig`]), which data path it gives its
//! QPs and CQs ([`DataPath`]), and the device limits requests are checked
//! against ([`DeviceCaps`]).

use std::string::String;

use crate::error::{Error, Result};

/// How to open a device.
#[derive(Clone, Debug, Default)]
pub struct VerbsConfig {
    /// Device name (`None`: the first device).
    pub device: Option<String>,
    /// Port (1-based; 0 means 1).
    pub port: u8,
    /// GID index QPs send from (`None`: on RoCE the RoCEv2 IPv4 entry,
    /// else 0).
    pub gid_index: Option<u8>,
    /// Which data path QPs and CQs use.
    pub data_path: DataPath,
}

/// Which data path a [`VerbsDevice`](super::VerbsDevice) gives its QPs and CQs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataPath {
    /// The fastest the device has: the mlx5 core on ConnectX, the direct
    /// rxe/siw rings on the kernel's software devices, libibverbs
    /// otherwise. The environment variable `RDMA_DIRECT_DATA_PATH`
    /// (`fallback` or `direct`; `portable` is an older name of `fallback`)
    /// overrides it, so a whole program or test suite can be run on either
    /// path unchanged.
    #[default]
    Auto,
    /// The verbs fallback: libibverbs' own provider, `ibv_post_send` /
    /// `ibv_poll_cq` (any device).
    Fallback,
    /// rdma-direct's own WQEs, doorbells and completion polling: mlx5, rxe
    /// or siw; [`Error::Unsupported`] on other devices.
    Direct,
}

impl DataPath {
    /// `Auto` resolved through `RDMA_DIRECT_DATA_PATH`.
    pub(super) fn resolve(self) -> Result<DataPath> {
        if self != DataPath::Auto {
            return Ok(self);
        }
        match std::env::var("RDMA_DIRECT_DATA_PATH").as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(DataPath::Auto),
            Ok("fallback") | Ok("portable") => Ok(DataPath::Fallback),
            Ok("direct") => Ok(DataPath::Direct),
            Ok(_) => Err(Error::InvalidAttribute),
        }
    }
}

/// Device attributes the backend checks requests against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// WRs per queue.
    pub max_qp_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// CQ entries.
    pub max_cqe: u32,
    /// Outstanding RDMA READ/atomic per QP (responder).
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA READ/atomic per QP (initiator).
    pub max_qp_init_rd_atom: u32,
    /// WRs per shared receive queue (0: the device has no SRQs).
    pub max_srq_wr: u32,
    /// SGEs per SRQ receive.
    pub max_srq_sge: u32,
    /// RDMA atomics (`IBV_ATOMIC_HCA` or `_GLOB`).
    pub atomics: bool,
    /// The provider's mlx5 direct path is in use.
    pub direct_mlx5: bool,
    /// The device has type-2 memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2A`
    /// or `_2B`): rkeys that can be bound and invalidated without
    /// re-registering (see [`crate::expose`]).
    pub memory_windows: bool,
    /// The kernel driver retries forever when a QP's transport
    /// `retry_cnt` is 7 (rxe: its completer decrements the count only
    /// while it is not 7, `drivers/infiniband/sw/rxe/rxe_comp.c`), where
    /// the IB spec makes 7 seven retries and only `rnr_retry` 7 infinite.
    /// A peer that is gone is then never noticed. The crate asks such a
    /// device for 6 instead of 7, the nearest bounded count.
    pub retry7_unbounded: bool,
}

impl DeviceCaps {
    /// The largest transport retry count the crate gives a QP on this
    /// device: 7, or 6 where 7 would retry forever (`retry7_unbounded`).
    pub fn max_retry_cnt(&self) -> u8 {
        if self.retry7_unbounded {
            6
        } else {
            7
        }
    }
}
