//! What a protection domain makes: registered memory and queue pairs
//! (where the CQ sizing guard runs).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sync::Ordering;
use crate::util::AlignedBuf;

use super::cq::{Cq, CqDemand};
use super::device::Pd;
use super::mr::{Mr, RawMr};
use super::qp::{Mlx5Queues, Qp, QpPath};
use super::{Access, Backend, QpInit, RawQpPath};

impl<B: Backend> Pd<B> {
    /// The largest region [`Pd::register`] allocates (2^40 bytes, as the
    /// C API's `RDD_MR_MAX_LEN`).
    pub const MAX_REGISTER: usize = 1 << 40;

    /// Allocates `len` zeroed, page-aligned bytes and registers them with
    /// exactly `access` (least privilege: ask only for what peers need).
    ///
    /// `len` is 1..=[`Pd::MAX_REGISTER`] ([`Error::InvalidAttribute`]
    /// otherwise, before anything is allocated): an empty region is
    /// refused on every device, as some kernels refuse it and others
    /// register it, and nothing needs one (a zero-length SGE names no
    /// memory).
    pub fn register(&self, len: usize, access: Access) -> Result<Mr<B>> {
        if len == 0 || len > Self::MAX_REGISTER {
            return Err(Error::InvalidAttribute);
        }
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
    ///
    /// With [`QpInit::srq`] set ([`super::Srq::id`] of an SRQ of this PD)
    /// the QP takes its receives from that SRQ; an id that names no live
    /// SRQ of this PD is [`Error::NoSuchObject`]. The sizing guard counts
    /// the SRQ's `max_wr` once on each receive CQ its QPs use (every SRQ
    /// receive may complete on any of them, and a QP in ERROR flushes
    /// none of the SRQ's), the QP's own demand being its send queue only.
    pub fn create_qp(&self, send_cq: &Cq<B>, recv_cq: &Cq<B>, init: &QpInit) -> Result<Qp<B>> {
        self.create_qp_of(send_cq, recv_cq, init, false)
    }

    /// [`Pd::create_qp`] for an RC (`ud` false) or a UD QP
    /// ([`Pd::create_ud_qp`]).
    pub(super) fn create_qp_of(
        &self,
        send_cq: &Cq<B>,
        recv_cq: &Cq<B>,
        init: &QpInit,
        ud: bool,
    ) -> Result<Qp<B>> {
        let b = &self.inner.b;
        let srq = match init.srq {
            None => None,
            Some(id) => Some(self.find_srq(id)?),
        };
        // Held until the QP is attached, so a concurrent `Srq::destroy`
        // either finishes first or sees the QP.
        let mut uses = srq.as_ref().map(|s| s.lock());
        if uses.as_ref().is_some_and(|u| u.destroyed) {
            return Err(Error::NoSuchObject);
        }
        let (scq, rcq) = (send_cq.inner.cqn, recv_cq.inner.cqn);
        let raw = if ud {
            b.create_ud_qp(self.inner.pd, scq, rcq, init)?
        } else {
            b.create_qp(self.inner.pd, scq, rcq, init)?
        };
        let queues = |dv| match srq {
            None => Mlx5Queues::new(dv, raw.qpn, raw.caps, ud),
            Some(_) => Mlx5Queues::new_on_srq(dv, raw.qpn, raw.caps, ud),
        };
        let path = match raw.path {
            RawQpPath::Mlx5(dv) => match queues(dv) {
                Ok(q) => QpPath::Mlx5(q),
                Err(e) => {
                    let _ = b.destroy_qp(raw.qpn);
                    return Err(e);
                }
            },
            RawQpPath::Driver(p) => QpPath::Driver(p),
        };
        // The CQ sizing guard: every WR the queues can hold may complete
        // at once (a flush completes all of them, signaled or not), so
        // each CQ must hold the sum over its QPs.
        let (send_need, recv_need) = match &path {
            QpPath::Mlx5(q) => (q.dv.sq_wqe_cnt, q.dv.rq_wqe_cnt),
            QpPath::Driver(p) => p.capacity(),
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
        if let (Some(s), Some(u)) = (&srq, uses.as_deref_mut()) {
            if let Err(e) = s.attach(u, &recv_cq.inner) {
                demand.release(&send_cq.inner, &recv_cq.inner);
                drop(path);
                let _ = b.destroy_qp(raw.qpn);
                return Err(e);
            }
        }
        drop(uses);
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
            connection: None,
            srq,
            ud_mtu: if ud { b.port().mtu.max(256) } else { 0 },
            _keep: raw.keep,
        })
    }
}
