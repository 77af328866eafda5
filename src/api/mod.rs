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

mod async_event;
mod backend;
mod connect;
mod cq;
mod device;
mod headroom;
mod mr;
mod pd;
mod qp;
mod qp_query;
mod recovery;
mod shared_qp;
mod soft_backend;
mod srq;
mod ud;

pub use crate::event::{Adaptive, AdaptiveConfig, WaitMode};

pub use crate::attr::{Access, AddressVector, QpInit, QpModify, SrqAttr, SrqId};
pub use crate::completion::{QpState, Wc, WcOpcode, WcStatus};

pub use async_event::AsyncEvent;
pub use backend::{
    Backend, CqDriver, DriverAh, MrKeys, PortInfo, QpDriver, RawCq, RawCqPath, RawDriverSrq, RawQp,
    RawQpPath, RawSrq, RawSrqPath, SrqDriver, Transport,
};
pub(crate) use connect::checked_connect_steps;
pub(crate) use connect::connect_steps_for;
pub use connect::{ConnectAttr, QpConnection, QpInfo};
pub use cq::Cq;
pub use device::{Device, Pd};
pub(crate) use headroom::{fitting_prefix, signaled, Headroom};
pub use mr::Mr;
pub(crate) use mr::RawMr;
pub use qp::Qp;
pub(crate) use qp_query::recovery_phase;
pub use qp_query::{QpQuery, QpRecovery};
pub use recovery::Recovery;
pub use shared_qp::{SharedQp, SharedQpPoller, SharedRetirer};
pub use srq::{Srq, SrqRoute, SrqSharedRoute};
pub use ud::{Ah, AhInit, OWN_QKEY};
