//! The device's shared receive queues (docs/spec/soft.md §2): creating
//! and destroying them, arming their limit, and taking a receive for a QP
//! attached to one.
//!
//! The ring is libmlx5's (docs/spec/mlx5.md §11): WQEs chained by their
//! `next_wqe_index`, a doorbell record holding the 16-bit count of posted
//! WQEs. The device keeps its own cursor into the chain (`next`, starting
//! at WQE 0 where the application's list starts) and its own count of
//! WQEs taken; a receive is available while the doorbell record's count is
//! ahead of that. The application only relinks WQEs it has not posted
//! (the tail and completed ones), so the link of a posted WQE is final
//! when the device reads it.

use std::sync::Arc;

use super::config::AsyncEvent;
use super::cqe::err_image;
use super::device::SoftDevice;
use super::mem::{SoftSrq, SrqMem};
use super::state::{Engine, RespEvent, SRQN_BASE};
use super::wqe::{self, Seg};
use crate::attr::SrqAttr;
use crate::error::{Error, Result};
use crate::mmio;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::geometry::pow2;
use crate::provider::mlx5::layout::cqe_opcode;
use crate::provider::mlx5::srq::SRQ_NEXT_SEG;
use crate::provider::mlx5::SrqGeometry;
use crate::util::AlignedBuf;

/// Most receives one SRQ holds (its free list is then 2^15 WQEs and its
/// buffer, with libmlx5's wait queue, 2^16: the core's limit).
pub(super) const MAX_SRQ_WR: u32 = (1 << 15) - 1;
/// Most scatter entries per SRQ receive (a 512-byte WQE).
pub(super) const MAX_SRQ_SGE: u32 = 31;

/// Device-side state of one SRQ.
pub(super) struct DevSrq {
    pub(super) pd: u32,
    /// Keeps the ring and doorbell record alive while the device uses them.
    pub(super) _mem: Arc<SrqMem>,
    pub(super) buf: *mut u8,
    pub(super) dbrec: *mut u32,
    pub(super) stride: u32,
    /// WQEs in the free list; a link at or past it is malformed.
    pub(super) nwqes: u32,
    pub(super) max_wr: u32,
    pub(super) max_sge: u32,
    /// The WQE the device takes next (follows the links).
    pub(super) next: u32,
    /// WQEs taken (free-running; compared in 16 bits with the doorbell
    /// record's count).
    pub(super) taken: u32,
    /// Armed limit (0: not armed).
    pub(super) limit: u32,
    /// QPs attached.
    pub(super) users: u32,
    /// A malformed WQE was met: the chain cannot be followed any more, and
    /// every later receive fails (an SRQ error, as hardware's).
    pub(super) broken: bool,
}

impl Engine {
    pub(super) fn srq_index(&self, srqn: u32) -> Option<usize> {
        let i = srqn.checked_sub(SRQN_BASE)? as usize;
        self.srqs.get(i)?.as_ref().map(|_| i)
    }

    /// Takes the next receive of SRQ `srqn` for QP `bi` (docs/spec/soft.md
    /// §2), or reports RNR exactly as an empty RQ does. The WQE is copied
    /// out once and parsed by the device's own parser; its scatter list
    /// goes to `segs` (a local list when `segs` is empty: the WQE is
    /// checked whole either way). Returns the WQE's index, which is what
    /// the CQE's `wqe_counter` carries, and the number of entries. Raises
    /// `SrqLimitReached` (and disarms) when the receives left drop below
    /// the armed limit.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take_srq_recv(
        &mut self,
        bi: usize,
        srqn: u32,
        segs: &mut [Seg],
        entry: &mut [u8; 1024],
        now: std::time::Instant,
        rnr_delay: std::time::Duration,
        requester: super::exec::Requester,
    ) -> core::result::Result<(u16, usize), super::state::Outcome> {
        let Some(si) = self.srq_index(srqn) else {
            // Cannot happen (an SRQ with QPs attached is not destroyed);
            // treated as a broken SRQ.
            return Err(self.responder_fatal(bi, syndrome::REMOTE_OP, RespEvent::None));
        };
        let s = self.srqs[si].as_ref().expect("checked");
        if s.broken {
            return Err(self.responder_fatal(bi, syndrome::REMOTE_OP, RespEvent::None));
        }
        // SAFETY: the SRQ's doorbell-record word, kept alive by `s.mem`.
        let posted = unsafe { mmio::read_dbrec(s.dbrec) } & 0xffff;
        let avail = posted.wrapping_sub(s.taken) & 0xffff;
        if avail == 0 {
            return Err(self.rnr_nak(requester, now, rnr_delay));
        }
        let idx = s.next;
        let stride = s.stride as usize;
        let len = stride.min(entry.len());
        // SAFETY: idx < nwqes (checked when it was read as a link, 0 at
        // creation), so the WQE lies inside the buffer; it was published
        // by the doorbell record (acquire-loaded above).
        unsafe {
            core::ptr::copy_nonoverlapping(
                s.buf.add(idx as usize * stride),
                entry.as_mut_ptr(),
                len,
            )
        };
        let mut local = [Seg::default(); MAX_SRQ_SGE as usize];
        let out: &mut [Seg] = if segs.is_empty() { &mut local } else { segs };
        let parsed = wqe::parse_srq_recv(&entry[..len], out);
        let nwqes = s.nwqes;
        let b = self.qps[bi].as_ref().expect("checked");
        let (bqpn, bcq) = (b.qpn, b.recv_cq);
        if let super::exec::Requester::Local(a) = requester {
            self.qps[a].as_mut().expect("checked").rnr_wait = None;
        }
        let s = self.srqs[si].as_mut().expect("checked");
        s.taken = s.taken.wrapping_add(1);
        match parsed {
            Ok((next, n)) if u32::from(next) < nwqes => {
                s.next = u32::from(next);
                let fire = s.limit != 0 && avail - 1 < s.limit;
                if fire {
                    s.limit = 0;
                    self.push_event(AsyncEvent::SrqLimitReached { srqn });
                }
                Ok((idx as u16, if segs.is_empty() { 0 } else { n }))
            }
            Ok(_) | Err(_) => {
                s.broken = true;
                let mut img = err_image(
                    cqe_opcode::RESP_ERR,
                    0,
                    bqpn,
                    idx as u16,
                    syndrome::LOCAL_QP_OP,
                );
                set_srqn(&mut img, srqn);
                self.push_cqe(bcq, &img);
                self.set_error(bi);
                Err(super::state::Outcome::Fail(syndrome::REMOTE_OP))
            }
        }
    }

    /// An SRQ-attached QP in ERROR: it holds no receives of its own to
    /// flush (the SRQ's stay for the other QPs, and every receive it took
    /// was completed when it was taken), so it only raises
    /// `LastWqeReached`, once per entry into ERROR.
    pub(super) fn srq_qp_in_error(&mut self, qi: usize) -> usize {
        let q = self.qps[qi].as_mut().expect("checked");
        if q.last_wqe_raised {
            return 0;
        }
        q.last_wqe_raised = true;
        let qpn = q.qpn;
        self.push_event(AsyncEvent::LastWqeReached { qpn });
        1
    }
}

/// Puts the SRQ number into a responder CQE image (bytes 32..35,
/// `srqn_uidx`: CQE version 0, docs/spec/mlx5.md §11). For a QP without an
/// SRQ the number is 0 and the image does not change.
#[inline]
pub(super) fn set_srqn(img: &mut [u8; 64], srqn: u32) {
    img[32..36].copy_from_slice(&(srqn & 0x00ff_ffff).to_be_bytes());
}

impl SoftDevice {
    /// Creates a shared receive queue in `pd` holding at least `max_wr`
    /// receives (1..=32767) of `max_sge` scatter entries (1..=31), laid
    /// out as libmlx5 lays it out (`mlx5_alloc_srq_buf`, docs/spec/mlx5.md
    /// §11): the stride is the next power of two of `16 + 16 · max_sge`
    /// (at least 32), the free list `pow2(max_wr + 1)` WQEs, the buffer
    /// `pow2(2 · max_wr + 1)`. The granted sizes come back in the result.
    /// Out-of-range sizes are [`Error::InvalidAttribute`], an unknown PD
    /// [`Error::NoSuchObject`]; nothing is created then.
    pub fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<SoftSrq> {
        if !(1..=MAX_SRQ_WR).contains(&max_wr) || !(1..=MAX_SRQ_SGE).contains(&max_sge) {
            return Err(Error::InvalidAttribute);
        }
        let stride = pow2(SRQ_NEXT_SEG + 16 * max_sge).max(32);
        let nwqes = pow2(max_wr + 1);
        let max = pow2(2 * max_wr + 1);
        let mut e = self.engine();
        if !e
            .pds
            .get((pd as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
        {
            return Err(Error::NoSuchObject);
        }
        let mem = Arc::new(SrqMem {
            buf: AlignedBuf::new((max * stride) as usize),
            dbrec: AlignedBuf::new(64),
        });
        let idx = match e.srqs.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None => {
                e.srqs.push(None);
                e.srqs.len() - 1
            }
        };
        let srqn = SRQN_BASE + idx as u32;
        let max_sge = (stride - SRQ_NEXT_SEG) / 16;
        e.srqs[idx] = Some(DevSrq {
            pd,
            _mem: Arc::clone(&mem),
            buf: mem.buf.ptr(),
            dbrec: mem.dbrec.ptr().cast(),
            stride,
            nwqes,
            max_wr: nwqes - 1,
            max_sge,
            next: 0,
            taken: 0,
            limit: 0,
            users: 0,
            broken: false,
        });
        let geo = SrqGeometry {
            buf: mem.buf.ptr(),
            dbrec: mem.dbrec.ptr().cast(),
            stride,
            nwqes,
            max,
            srqn,
        };
        Ok(SoftSrq {
            geo,
            srqn,
            max_wr: nwqes - 1,
            max_sge,
            mem,
        })
    }

    /// Destroys an SRQ. One that QPs are still attached to is refused with
    /// [`Error::ResourceBusy`] and stays as it was.
    pub fn destroy_srq(&self, srqn: u32) -> Result<()> {
        let mut e = self.engine();
        let i = e.srq_index(srqn).ok_or(Error::NoSuchObject)?;
        if e.srqs[i].as_ref().expect("checked").users != 0 {
            return Err(Error::ResourceBusy);
        }
        e.srqs[i] = None;
        Ok(())
    }

    /// Arms the SRQ's limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): one
    /// `SrqLimitReached` event is raised when a receive is taken and fewer
    /// than `limit` posted receives are left untaken; the event disarms
    /// the limit. 0 disarms it. A limit above the SRQ's `max_wr` is
    /// [`Error::InvalidAttribute`] (the kernel's mlx drivers refuse a limit
    /// at or above the free list's size) and changes nothing.
    pub fn arm_srq_limit(&self, srqn: u32, limit: u32) -> Result<()> {
        let mut e = self.engine();
        let i = e.srq_index(srqn).ok_or(Error::NoSuchObject)?;
        let s = e.srqs[i].as_mut().expect("checked");
        if limit > s.max_wr {
            return Err(Error::InvalidAttribute);
        }
        s.limit = limit;
        Ok(())
    }

    /// The SRQ's sizes and armed limit (0 once the limit event fired).
    pub fn query_srq(&self, srqn: u32) -> Result<SrqAttr> {
        let e = self.engine();
        let i = e.srq_index(srqn).ok_or(Error::NoSuchObject)?;
        let s = e.srqs[i].as_ref().expect("checked");
        Ok(SrqAttr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit,
        })
    }
}
