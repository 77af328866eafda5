//! Shared receive queues on the verbs backend: on the fallback data path
//! `ibv_create_srq`, `ibv_modify_srq` (the limit), `ibv_query_srq`,
//! `ibv_destroy_srq` ([`path::VerbsSrq`] posts to them); on the rxe/siw
//! direct rings our own uverbs SRQ (`super::direct_srq`, the same commands
//! written by [`super::uverbs::UverbsSrq`]).
//!
//! The mlx5 direct path has none: its core's SRQ ring is not wired to
//! libmlx5's SRQ objects. There every call here is [`Error::Unsupported`]
//! (docs/status.md); open the device with
//! [`DataPath::Fallback`](super::DataPath::Fallback) for SRQs.

use std::boxed::Box;
use std::sync::Arc;

use rdma_sys as sys;

use super::device::SrqEntry;
use super::{check, fail_errno, last_error, path, Raw, VerbsDevice};
use crate::api::RawDriverSrq;
use crate::attr::SrqAttr;
use crate::error::{Error, Result};

impl VerbsDevice {
    /// Whether this device's QPs use the fallback data path, the only one
    /// with SRQs and UD.
    pub(super) fn on_fallback(&self) -> bool {
        self.direct.is_none() && !self.caps.direct_mlx5
    }

    /// `Backend::create_driver_srq`.
    pub(super) fn srq_create(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<RawDriverSrq> {
        if self.caps.direct_mlx5 {
            return Err(Error::Unsupported);
        }
        let c = &self.caps;
        if max_wr == 0
            || max_sge == 0
            || (c.max_srq_wr != 0 && max_wr > c.max_srq_wr)
            || (c.max_srq_sge != 0 && max_sge > c.max_srq_sge)
            || max_wr > 1 << 24
        {
            return Err(Error::InvalidAttribute);
        }
        if c.max_srq_wr == 0 {
            // The device reports no SRQs (max_srq 0).
            return Err(Error::Unsupported);
        }
        if let Some((kind, _)) = self.direct {
            return self.create_direct_srq(kind, pd, max_wr, max_sge);
        }
        let mut t = self.lock();
        let pdp = t.pds.get(&pd).ok_or(Error::NoSuchObject)?.0 .0;
        let mut ia = sys::ibv_srq_init_attr {
            srq_context: core::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: a live PD; valid attributes.
        let srq = unsafe { sys::ibv_create_srq(pdp, &mut ia) };
        if srq.is_null() {
            return Err(fail_errno("ibv_create_srq"));
        }
        // The granted sizes: what the SRQ reports (rxe rounds up and does
        // not write them back at creation), else what ibv_create_srq wrote
        // back (libsiw has no query), never below the request.
        let mut q = ia.attr;
        // SAFETY: the live SRQ just created; a valid out-pointer.
        if unsafe { sys::ibv_query_srq(srq, &mut q) } != 0 {
            q = ia.attr;
        }
        let attr = SrqAttr {
            max_wr: q.max_wr.max(max_wr),
            max_sge: q.max_sge.max(max_sge),
            srq_limit: 0,
        };
        let track = Arc::new(path::SrqTrack::new(attr.max_wr));
        let driver = path::VerbsSrq::new(srq, Arc::clone(&track), attr.max_sge);
        let h = t.next;
        t.next += 1;
        t.srqs.insert(
            h,
            SrqEntry {
                srq: Raw(srq),
                direct: None,
                track,
                pd,
                qps: 0,
            },
        );
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 += 1;
        }
        Ok(RawDriverSrq {
            driver: Box::new(driver),
            srqn: h,
            attr,
            keep: self.ctx.clone(),
        })
    }

    /// `Backend::destroy_srq`.
    pub(super) fn srq_destroy(&self, srqn: u32) -> Result<()> {
        let mut t = self.lock();
        let e = t.srqs.get(&srqn).ok_or(Error::NoSuchObject)?;
        if e.qps != 0 {
            return Err(Error::ResourceBusy);
        }
        match &e.direct {
            // DESTROY_SRQ now; the ring unmaps when the poster (dropped by
            // the API with the handle) lets go of it.
            Some(d) => d.destroy()?,
            // SAFETY: a live SRQ with no QP attached; its poster is not
            // used again (the API drops it with the handle).
            None => check("ibv_destroy_srq", unsafe { sys::ibv_destroy_srq(e.srq.0) })?,
        }
        let pd = e.pd;
        t.srqs.remove(&srqn);
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 -= 1;
        }
        Ok(())
    }

    /// `Backend::arm_srq_limit`: `ibv_modify_srq` with `IBV_SRQ_LIMIT`
    /// (direct rings: MODIFY_SRQ with the limit alone).
    pub(super) fn srq_arm(&self, srqn: u32, limit: u32) -> Result<()> {
        let t = self.lock();
        let e = t.srqs.get(&srqn).ok_or(Error::NoSuchObject)?;
        if let Some(d) = &e.direct {
            return d.arm_limit(limit);
        }
        let mut a = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: a live SRQ; only the limit is named by the mask.
        check("ibv_modify_srq", unsafe {
            sys::ibv_modify_srq(
                e.srq.0,
                &mut a,
                sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        })
    }

    /// `Backend::query_srq`: [`Error::Unsupported`] where the provider has
    /// no `query_srq` (libsiw in rdma-core 44). The direct rings ask the
    /// kernel (QUERY_SRQ), which answers for both rxe and siw.
    pub(super) fn srq_query(&self, srqn: u32) -> Result<SrqAttr> {
        let t = self.lock();
        let e = t.srqs.get(&srqn).ok_or(Error::NoSuchObject)?;
        if let Some(d) = &e.direct {
            let q = d.query()?;
            return Ok(SrqAttr {
                max_wr: q.max_wr,
                max_sge: q.max_sge,
                srq_limit: q.srq_limit,
            });
        }
        let mut a = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 0,
        };
        // SAFETY: a live SRQ; a valid out-pointer.
        let r = check("ibv_query_srq", unsafe {
            sys::ibv_query_srq(e.srq.0, &mut a)
        });
        if r.is_err() && matches!(last_error().1, libc::EOPNOTSUPP | libc::ENOSYS) {
            // libsiw (rdma-core 44) has no query_srq.
            return Err(Error::Unsupported);
        }
        r?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    }

    /// The SRQ handle an async event's `ibv_srq` pointer names.
    pub(super) fn srq_handle(&self, srq: *mut sys::ibv_srq) -> Option<u32> {
        let t = self.lock();
        t.srqs.iter().find(|(_, e)| e.srq.0 == srq).map(|(h, _)| *h)
    }
}
