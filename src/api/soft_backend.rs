//! [`Backend`] for the in-process software HCA
//! ([`crate::soft::SoftDevice`]).

use crate::attr::AddressVector;
use crate::error::{Error, Result};
use crate::provider::mlx5::{AhAttr, GlobalRoute, LinkLayer, Mlx5Av};

use super::{
    Access, AsyncEvent, Backend, MrKeys, PortInfo, QpInit, QpModify, RawCq, RawCqPath, RawQp,
    RawQpPath, RawSrq, RawSrqPath, SrqAttr, Transport,
};

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
            gid: crate::soft::SoftDevice::gid(self),
            mtu: crate::soft::SoftDevice::mtu(self),
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
    fn create_ud_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<RawQp> {
        let q = crate::soft::SoftDevice::create_ud_qp(self, pd, send_cq, recv_cq, init)?;
        Ok(RawQp {
            path: RawQpPath::Mlx5(q.dv),
            qpn: q.qpn,
            caps: q.caps,
            psn: 0,
            keep: q.mem,
        })
    }
    fn ready_ud(&self, qpn: u32, qkey: u32) -> Result<()> {
        crate::soft::SoftDevice::ready_ud(self, qpn, qkey)
    }
    fn create_ah(&self, pd: u32, dest: &AddressVector) -> Result<Mlx5Av> {
        // The software port is InfiniBand-like: LID routed, GRH optional,
        // one GID (index 0).
        if dest.is_global && dest.sgid_index != 0 {
            return Err(Error::InvalidAttribute);
        }
        if !crate::soft::SoftDevice::pd_live(self, pd) {
            return Err(Error::NoSuchObject);
        }
        Mlx5Av::new(&AhAttr {
            link: LinkLayer::InfiniBand,
            dlid: dest.dlid,
            sl: dest.sl,
            src_path_bits: 0,
            mlx5_rate: 0,
            grh: dest.is_global.then_some(GlobalRoute {
                dgid: dest.dgid,
                sgid_index: dest.sgid_index,
                flow_label: dest.flow_label,
                hop_limit: dest.hop_limit,
                traffic_class: dest.traffic_class,
            }),
        })
    }
    fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<RawSrq> {
        let s = crate::soft::SoftDevice::create_srq(self, pd, max_wr, max_sge)?;
        Ok(RawSrq {
            path: RawSrqPath::Mlx5(s.geo),
            srqn: s.srqn,
            attr: SrqAttr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: 0,
            },
            keep: s.mem,
        })
    }
    fn destroy_srq(&self, srqn: u32) -> Result<()> {
        crate::soft::SoftDevice::destroy_srq(self, srqn)
    }
    fn arm_srq_limit(&self, srqn: u32, limit: u32) -> Result<()> {
        crate::soft::SoftDevice::arm_srq_limit(self, srqn, limit)
    }
    fn query_srq(&self, srqn: u32) -> Result<SrqAttr> {
        crate::soft::SoftDevice::query_srq(self, srqn)
    }
    fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()> {
        crate::soft::SoftDevice::modify_qp(self, qpn, m)
    }
    fn destroy_qp(&self, qpn: u32) -> Result<()> {
        crate::soft::SoftDevice::destroy_qp(self, qpn)
    }
    fn cq_demand(&self, init: &QpInit) -> (u32, u32) {
        let (s, r) = crate::provider::mlx5::geometry::queue_sizes(init);
        // A QP on an SRQ has no receive queue; the SRQ's receives are
        // counted once per CQ by `Pd::create_qp`.
        (s, if init.srq.is_some() { 0 } else { r })
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
                crate::soft::AsyncEvent::QpRequestError { qpn } => {
                    AsyncEvent::QpRequestError { qpn }
                }
                crate::soft::AsyncEvent::QpAccessError { qpn } => AsyncEvent::QpAccessError { qpn },
                crate::soft::AsyncEvent::SrqLimitReached { srqn } => {
                    AsyncEvent::SrqLimitReached { srqn }
                }
                crate::soft::AsyncEvent::LastWqeReached { qpn } => {
                    AsyncEvent::LastWqeReached { qpn }
                }
            }),
        )
    }
    fn async_event_fd(&self) -> Result<i32> {
        crate::soft::SoftDevice::async_event_fd(self)
    }
}
