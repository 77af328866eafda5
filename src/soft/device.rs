//! The device handle and its control calls: protection domains, memory
//! regions, CQs, QPs and their state changes, asynchronous events and
//! fault injection.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::vec::Vec;

use super::config::{AsyncEvent, Fault, SoftConfig};
use super::mem::{CqMem, QpMem, SoftCq, SoftQp};
use super::mr::{Access, MrTable};
use super::state::{Cq, Engine, Qp, Scratch, Shared, CQN_BASE, QPN_BASE};
use super::{QpInit, QpModify};
use crate::completion::QpState;
use crate::error::{Error, Result};
use crate::mmio;
use crate::provider::mlx5::geometry::{max_wqe_bytes, pow2, queue_sizes};
use crate::provider::mlx5::layout::{Mlx5dvCq, Mlx5dvQp};
use crate::util::AlignedBuf;
use crate::wr::QpCaps;

/// Largest queue the device creates (BBs or entries).
const MAX_QUEUE: u32 = 1 << 15;

/// A software HCA. Cloning shares the device.
#[derive(Clone)]
pub struct SoftDevice {
    pub(super) shared: Arc<Shared>,
}

impl SoftDevice {
    /// A new device in step mode (no thread).
    pub fn new(cfg: SoftConfig) -> SoftDevice {
        if cfg.is_fabric() {
            // Segments left by processes that died before their peers
            // attached (docs/spec/fabric.md §2).
            super::fabric::link::sweep();
        }
        SoftDevice {
            shared: Arc::new(Shared {
                engine: Mutex::new(Engine {
                    scratch: Some(Scratch::new()),
                    cfg,
                    mrs: MrTable::default(),
                    qps: Vec::new(),
                    cqs: Vec::new(),
                    srqs: Vec::new(),
                    pds: Vec::new(),
                    events: VecDeque::new(),
                    events_fd: None,
                    faults: Vec::new(),
                    steps: 0,
                    threaded: false,
                    ud_drops: Default::default(),
                }),
                stop: AtomicBool::new(false),
                passes: AtomicU64::new(0),
                thread: Mutex::new(None),
            }),
        }
    }

    pub(super) fn engine(&self) -> MutexGuard<'_, Engine> {
        // A panic inside the engine would be a device bug; keep the
        // device usable for the rest of the program's teardown.
        self.shared.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Next asynchronous event, if any.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        let mut e = self.engine();
        let ev = e.events.pop_front();
        if e.events.is_empty() {
            if let Some(fd) = &e.events_fd {
                fd.drain();
            }
        }
        ev
    }

    /// An fd that is readable while asynchronous events are pending (for
    /// the application's epoll set); take them with
    /// [`SoftDevice::poll_async_event`].
    pub fn async_event_fd(&self) -> Result<i32> {
        let mut e = self.engine();
        if e.events_fd.is_none() {
            let fd = Arc::new(crate::event::EventFd::new()?);
            if !e.events.is_empty() {
                fd.signal();
            }
            e.events_fd = Some(fd);
        }
        Ok(e.events_fd.as_ref().map_or(-1, |f| f.fd()))
    }

    /// Adds a fault.
    pub fn inject(&self, f: Fault) {
        self.engine().faults.push(f);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.engine().faults.clear();
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> u32 {
        let mut e = self.engine();
        e.pds.push(true);
        e.pds.len() as u32
    }

    /// Frees a protection domain: [`Error::ResourceBusy`] (and the
    /// domain stays) while a QP, SRQ or memory region of it exists, as
    /// `ibv_dealloc_pd` refuses with `EBUSY`.
    pub fn dealloc_pd(&self, pd: u32) -> Result<()> {
        let mut e = self.engine();
        let busy = e.qps.iter().flatten().any(|q| q.pd == pd)
            || e.srqs.iter().flatten().any(|s| s.pd == pd)
            || e.mrs.any_in(pd);
        match e.pds.get_mut((pd as usize).wrapping_sub(1)) {
            Some(live @ true) => {
                if busy {
                    return Err(Error::ResourceBusy);
                }
                *live = false;
                Ok(())
            }
            _ => Err(Error::NoSuchObject),
        }
    }

    /// Registers `[addr, addr+len)` in `pd`; returns the key (lkey = rkey).
    ///
    /// # Safety
    /// The memory must stay valid, and not be freed, until
    /// [`SoftDevice::dereg_mr`] returns: the device reads and writes it on
    /// behalf of local and remote work.
    pub unsafe fn reg_mr(&self, pd: u32, addr: u64, len: u64, access: Access) -> Result<u32> {
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::InvalidAttribute);
        }
        if access.0 & !Access::MR_ALL.0 != 0 || addr.checked_add(len).is_none() {
            return Err(Error::InvalidAttribute);
        }
        let mut e = self.engine();
        if !e
            .pds
            .get((pd as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
        {
            return Err(Error::NoSuchObject);
        }
        Ok(e.mrs.insert(pd, addr, len, access))
    }

    /// Deregisters a region. After this returns the device never touches
    /// the memory again.
    pub fn dereg_mr(&self, key: u32) -> Result<()> {
        if self.engine().mrs.remove(key) {
            Ok(())
        } else {
            Err(Error::NoSuchObject)
        }
    }

    /// Creates a CQ with at least `depth` entries.
    pub fn create_cq(&self, depth: u32) -> Result<SoftCq> {
        if depth == 0 || depth >= MAX_QUEUE {
            return Err(Error::InvalidAttribute);
        }
        let mut e = self.engine();
        let cnt = pow2(depth + 1);
        let size = e.cfg.cqe_size;
        let mem = Arc::new(CqMem {
            buf: AlignedBuf::new((cnt * size) as usize),
            dbrec: AlignedBuf::new(64),
            uar: AlignedBuf::new(4096),
        });
        // SAFETY: fresh buffer of cnt × size bytes, no other users yet.
        unsafe { crate::provider::mlx5::CompletionQueue::init_buffer(mem.buf.ptr(), cnt, size) };
        let idx = match e.cqs.iter().position(|c| c.is_none()) {
            Some(i) => i,
            None => {
                e.cqs.push(None);
                e.cqs.len() - 1
            }
        };
        let cqn = CQN_BASE + idx as u32;
        let event = Arc::new(crate::event::EventFd::new()?);
        e.cqs[idx] = Some(Cq {
            mem: Arc::clone(&mem),
            cnt,
            size,
            pi: 0,
            overrun: false,
            users: 0,
            event,
            armed_ci: None,
            armed_solicited: false,
            last_solicited: None,
        });
        let dv = Mlx5dvCq {
            buf: mem.buf.ptr(),
            dbrec: mem.dbrec.ptr().cast(),
            cqe_cnt: cnt,
            cqe_size: size,
            cq_uar: mem.uar.ptr(),
            cqn,
            comp_mask: 0,
        };
        Ok(SoftCq { dv, cqn, mem })
    }

    /// Destroys a CQ (no QP may use it).
    pub fn destroy_cq(&self, cqn: u32) -> Result<()> {
        let mut e = self.engine();
        let Some(cq) = e.cq_mut(cqn) else {
            return Err(Error::NoSuchObject);
        };
        if cq.users != 0 {
            return Err(Error::ResourceBusy);
        }
        e.cqs[(cqn - CQN_BASE) as usize] = None;
        Ok(())
    }

    /// The fd that becomes readable when an armed CQ gets a completion.
    pub fn cq_event_fd(&self, cqn: u32) -> Result<i32> {
        let mut e = self.engine();
        let cq = e.cq_mut(cqn).ok_or(Error::NoSuchObject)?;
        Ok(cq.event.fd())
    }

    /// Takes the CQ's pending events (non-blocking); returns how many.
    pub fn cq_event_consume(&self, cqn: u32) -> Result<u32> {
        let ev = {
            let mut e = self.engine();
            Arc::clone(&e.cq_mut(cqn).ok_or(Error::NoSuchObject)?.event)
        };
        Ok(ev.drain().min(u64::from(u32::MAX)) as u32)
    }

    /// True if the CQ overran (the device dropped a completion).
    pub fn cq_overrun(&self, cqn: u32) -> bool {
        self.engine().cq_mut(cqn).is_some_and(|c| c.overrun)
    }

    /// Creates an RC QP in RESET, sized like rdma-core sizes mlx5 QPs
    /// (docs/spec/mlx5.md §2, §6).
    ///
    /// With [`QpInit::srq`] set the QP takes its receives from that SRQ
    /// (which must exist, [`Error::NoSuchObject`], and be in the same PD,
    /// [`Error::InvalidAttribute`]): it has no receive queue (the
    /// descriptor's `rq_wqe_cnt` and `rq_stride` are 0, as `mlx5dv_init_obj`
    /// reports for such a QP), and `max_recv_wr` / `max_recv_sge` are not
    /// used.
    pub fn create_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<SoftQp> {
        self.create_qp_of(pd, send_cq, recv_cq, init, false)
    }

    /// [`SoftDevice::create_qp`] for an RC (`ud` false) or a UD QP. A UD
    /// send WQE has a 64-byte header (control and datagram segments)
    /// where RC's largest has 32 before its data, so the WQE is sized on
    /// that (docs/spec/mlx5.md §11) and the granted caps follow from it.
    pub(super) fn create_qp_of(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        init: &QpInit,
        ud: bool,
    ) -> Result<SoftQp> {
        // A QP on an SRQ has no RQ: its receive sizes are not looked at.
        let rq_init = match init.srq {
            None => *init,
            Some(_) => QpInit {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..*init
            },
        };
        let init = &rq_init;
        if init.max_send_wr == 0
            || init.max_send_sge > 30
            || init.max_recv_sge > 64
            || init.max_inline_data > 512
            || init.max_send_wr > MAX_QUEUE
            || init.max_recv_wr > MAX_QUEUE
        {
            return Err(Error::InvalidAttribute);
        }
        let (wqe, hdr) = if ud {
            (super::ud::ud_wqe_bytes(init), 64)
        } else {
            (max_wqe_bytes(init), 32)
        };
        let (sq_cnt, rq_cnt_sized) = if ud {
            (
                pow2(init.max_send_wr.saturating_mul(wqe) / 64),
                pow2(init.max_recv_wr),
            )
        } else {
            queue_sizes(init)
        };
        if sq_cnt > MAX_QUEUE {
            return Err(Error::InvalidAttribute);
        }
        let caps = QpCaps {
            max_send_sge: (wqe - hdr) / 16,
            max_inline_data: wqe - hdr - 4,
            max_recv_sge: init.max_recv_sge.max(1),
        };
        let (rq_stride, rq_cnt) = match init.srq {
            None => (pow2(16 * caps.max_recv_sge).max(16), rq_cnt_sized),
            Some(_) => (0, 0),
        };
        let caps = QpCaps {
            max_recv_sge: rq_stride / 16,
            ..caps
        };
        let rq_bytes = ((rq_cnt * rq_stride) as usize).next_multiple_of(64);
        let mem = Arc::new(QpMem {
            buf: AlignedBuf::new(rq_bytes + sq_cnt as usize * 64),
            dbrec: AlignedBuf::new(64),
            bf: AlignedBuf::new(512),
            rq_bytes,
        });
        let mut e = self.engine();
        if !e
            .pds
            .get((pd as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
        {
            return Err(Error::NoSuchObject);
        }
        if e.cq_mut(send_cq).is_none() || e.cq_mut(recv_cq).is_none() {
            return Err(Error::NoSuchObject);
        }
        if let Some(id) = init.srq {
            let si = e.srq_index(id.srqn).ok_or(Error::NoSuchObject)?;
            let srq = e.srqs[si].as_mut().expect("checked");
            if srq.pd != pd {
                return Err(Error::InvalidAttribute);
            }
            srq.users += 1;
        }
        e.cq_mut(send_cq).expect("checked").users += 1;
        e.cq_mut(recv_cq).expect("checked").users += 1;
        let idx = match e.qps.iter().position(|q| q.is_none()) {
            Some(i) => i,
            None => {
                e.qps.push(None);
                e.qps.len() - 1
            }
        };
        let qpn = QPN_BASE + idx as u32;
        // SAFETY: offsets inside the QP buffer just allocated.
        let sq = unsafe { mem.buf.ptr().add(rq_bytes) };
        e.qps[idx] = Some(Qp {
            qpn,
            pd,
            state: QpState::Reset,
            mem: Arc::clone(&mem),
            sq,
            sq_cnt,
            sq_ci: 0,
            rq: mem.buf.ptr(),
            rq_cnt,
            rq_stride,
            rq_ci: 0,
            dbrec: mem.dbrec.ptr().cast(),
            send_cq,
            recv_cq,
            dest: 0,
            access: Access::NONE,
            rnr_retry: 7,
            rnr_attempts: 0,
            rnr_wait: None,
            rnr_step: 0,
            hold: None,
            srq: init.srq.map(|id| id.srqn),
            last_wqe_raised: false,
            ud,
            qkey: 0,
            remote: None,
        });
        let dv = Mlx5dvQp {
            dbrec: mem.dbrec.ptr().cast(),
            sq_buf: sq,
            sq_wqe_cnt: sq_cnt,
            sq_stride: 64,
            rq_buf: mem.buf.ptr(),
            rq_wqe_cnt: rq_cnt,
            rq_stride,
            bf_reg: mem.bf.ptr(),
            bf_size: 256,
            ..Mlx5dvQp::EMPTY
        };
        Ok(SoftQp { dv, qpn, caps, mem })
    }

    /// Changes a QP's state. Valid transitions: RESET→INIT→RTR→RTS, any
    /// state → ERROR, any state → RESET (which zeroes the device counters
    /// and both doorbell-record words, like libmlx5, docs/spec/mlx5.md §7).
    /// A UD QP takes only RESET and ERROR here ([`Error::InvalidAttribute`]
    /// otherwise, nothing changed): it is made ready with
    /// [`SoftDevice::ready_ud`].
    pub fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()> {
        let mut e = self.engine();
        let Some(i) = e.qp_index(qpn) else {
            return Err(Error::NoSuchObject);
        };
        let q = e.qps[i].as_mut().expect("checked");
        if q.ud && !matches!(m.state, QpState::Reset | QpState::Error) {
            // A UD QP is made ready with its Q_Key by `ready_ud`.
            return Err(Error::InvalidAttribute);
        }
        match (q.state, m.state) {
            (_, QpState::Reset) => {
                // A remote QP's link closes (the peer sees it) and what
                // was outstanding is discarded, as RESET discards a queue.
                q.remote = None;
                q.sq_ci = 0;
                q.rq_ci = 0;
                q.rnr_attempts = 0;
                q.rnr_wait = None;
                q.hold = None;
                q.last_wqe_raised = false;
                // SAFETY: both words of the QP's doorbell record.
                unsafe {
                    mmio::write_dbrec(q.dbrec, 0);
                    mmio::write_dbrec(q.dbrec.add(1), 0);
                }
            }
            (QpState::Reset, QpState::Init) | (QpState::Init, QpState::Init) => {
                if m.access.0 & !Access::ALL.0 != 0 {
                    return Err(Error::InvalidAttribute);
                }
                q.access = m.access;
            }
            (QpState::Init, QpState::Rtr) => {
                let me = e.cfg.gid;
                let dgid = m.av.dgid;
                let remote = if super::fabric::is_fabric_gid(&me)
                    && super::fabric::is_fabric_gid(&dgid)
                    && dgid != me
                {
                    // A QP of another process's device: its link is made
                    // now, before anything changes (docs/spec/fabric.md §2).
                    let ring = e.cfg.fabric_ring;
                    let out =
                        super::fabric::link::LinkOut::create(&me, qpn, &dgid, m.dest_qpn, ring)?;
                    Some(std::boxed::Box::new(super::fabric::requester::Remote::new(
                        dgid,
                        m.dest_qpn,
                        out,
                        std::time::Instant::now(),
                    )))
                } else {
                    None
                };
                let q = e.qps[i].as_mut().expect("checked");
                q.dest = m.dest_qpn;
                q.remote = remote;
            }
            (QpState::Rtr, QpState::Rts) => {
                if m.rnr_retry > 7 || m.retry_cnt > 7 || m.timeout > 31 {
                    return Err(Error::InvalidAttribute);
                }
                if m.rate_limit_kbps != 0 {
                    // No packet pacing here.
                    return Err(Error::Unsupported);
                }
                q.rnr_retry = m.rnr_retry;
                if let Some(r) = q.remote.as_deref_mut() {
                    r.set_timer(m.timeout, m.retry_cnt, m.rnr_retry);
                }
            }
            (_, QpState::Error) => {
                if let Some(r) = q.remote.as_deref_mut() {
                    r.flush_pending();
                }
            }
            _ => return Err(Error::InvalidQpState),
        }
        e.qps[i].as_mut().expect("checked").state = m.state;
        Ok(())
    }

    /// Current device-side state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Result<QpState> {
        let e = self.engine();
        let i = e.qp_index(qpn).ok_or(Error::NoSuchObject)?;
        Ok(e.qps[i].as_ref().expect("checked").state)
    }

    /// Destroys a QP. The device stops touching its queues at once.
    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        let mut e = self.engine();
        let Some(i) = e.qp_index(qpn) else {
            return Err(Error::NoSuchObject);
        };
        let q = e.qps[i].take().expect("checked");
        for cqn in [q.send_cq, q.recv_cq] {
            if let Some(c) = e.cq_mut(cqn) {
                c.users -= 1;
            }
        }
        if let Some(si) = q.srq.and_then(|n| e.srq_index(n)) {
            e.srqs[si].as_mut().expect("checked").users -= 1;
        }
        drop(q.mem);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A domain with a registered region is busy until the region goes,
    /// and the refused call changes nothing: the region still works.
    #[test]
    fn a_domain_with_a_region_is_busy() {
        let dev = SoftDevice::new(SoftConfig::default());
        let pd = dev.alloc_pd();
        let other = dev.alloc_pd();
        let buf = std::vec![0u8; 64];
        // SAFETY: `buf` outlives the region (deregistered below).
        let key = unsafe { dev.reg_mr(pd, buf.as_ptr() as u64, 64, Access::LOCAL_WRITE) }.unwrap();
        assert_eq!(dev.dealloc_pd(pd), Err(Error::ResourceBusy));
        assert_eq!(
            dev.dealloc_pd(other),
            Ok(()),
            "only the region's domain is busy"
        );
        assert!(
            dev.engine().mrs.get(key).is_some(),
            "the region survives the refusal"
        );
        dev.dereg_mr(key).unwrap();
        assert_eq!(dev.dealloc_pd(pd), Ok(()));
        assert_eq!(dev.dealloc_pd(pd), Err(Error::NoSuchObject));
    }
}
