//! The mlx5 receive queue (docs/spec/mlx5.md §6): an array of data segments per
//! entry, an invalid-lkey terminator when fewer entries than the stride
//! holds are used, and a doorbell record but no MMIO doorbell.

use core::ptr::NonNull;

use super::layout::{Be32, Be64, DataSeg, Mlx5dvQp, INVALID_LKEY, RCV_DBR};
use crate::error::{Error, PostError, Result};
use crate::mmio;
use crate::wr::{QpCaps, RecvWr};

use super::completion::QpState;

/// An mlx5 (non-SRQ) receive queue over caller-provided memory.
pub struct RecvQueue {
    buf: NonNull<u8>,
    mask: u32,
    wqe_cnt: u32,
    /// log2 of the stride in bytes.
    stride_shift: u32,
    /// Free-running count of posted receives.
    head: u32,
    /// Free-running count of completed receives.
    tail: u32,
    /// `head` at the last doorbell-record update.
    rung: u32,
    dbrec: NonNull<u32>,
    max_sge: u32,
    state: QpState,
    wrid: NonNull<u64>,
    /// The first failed receive since the last reset (cold).
    failure: Option<crate::wr::FailedWr>,
}

// SAFETY: exclusive ownership of ring, side table and RQ dbrec word.
unsafe impl Send for RecvQueue {}

impl RecvQueue {
    /// Wraps the receive queue of `mlx5dv_init_obj` fields.
    ///
    /// # Safety
    /// - `qp.rq_buf` points to `rq_wqe_cnt * rq_stride` bytes only this
    ///   queue writes; `qp.dbrec[0]` is written only by this queue.
    /// - `wrid` points to `rq_wqe_cnt` slots owned by this queue.
    /// - Posted SGEs name memory the device may write until completion.
    pub unsafe fn from_raw(
        qp: &Mlx5dvQp,
        caps: &QpCaps,
        wrid: NonNull<u64>,
        wrid_len: usize,
    ) -> Result<RecvQueue> {
        let cnt = qp.rq_wqe_cnt;
        let stride = qp.rq_stride;
        if cnt == 0 || !cnt.is_power_of_two() || stride < 16 || !stride.is_power_of_two() {
            return Err(Error::InvalidGeometry);
        }
        let buf = NonNull::new(qp.rq_buf).ok_or(Error::InvalidGeometry)?;
        let dbrec = NonNull::new(qp.dbrec).ok_or(Error::InvalidGeometry)?;
        if buf.as_ptr() as usize % 16 != 0 || dbrec.as_ptr() as usize % 4 != 0 {
            return Err(Error::InvalidGeometry);
        }
        if caps.max_recv_sge > stride / 16 {
            return Err(Error::InvalidGeometry);
        }
        if wrid_len < cnt as usize {
            return Err(Error::StorageTooSmall);
        }
        Ok(RecvQueue {
            buf,
            mask: cnt - 1,
            wqe_cnt: cnt,
            stride_shift: stride.trailing_zeros(),
            head: 0,
            tail: 0,
            rung: 0,
            // SAFETY: the record has two words (contract); RCV_DBR = 0.
            dbrec: unsafe { dbrec.add(RCV_DBR) },
            max_sge: caps.max_recv_sge,
            state: QpState::Rts,
            wrid,
            failure: None,
        })
    }

    /// Entries in the ring.
    #[inline]
    pub fn wqe_cnt(&self) -> u32 {
        self.wqe_cnt
    }
    /// Posted-receive counter.
    #[inline]
    pub fn head(&self) -> u32 {
        self.head
    }
    /// Completed-receive counter.
    #[inline]
    pub fn tail(&self) -> u32 {
        self.tail
    }
    /// Stride in bytes.
    #[inline]
    pub fn stride(&self) -> u32 {
        1 << self.stride_shift
    }
    /// Ring base.
    #[inline]
    pub fn ring_ptr(&self) -> *mut u8 {
        self.buf.as_ptr()
    }
    /// Records a state change made by the control path.
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
    }
    /// Resets both counters to `head` (after RESET, docs/spec/mlx5.md §7).
    pub fn reset_counters(&mut self, head: u32) {
        self.head = head;
        self.tail = head;
        self.rung = head;
        self.failure = None;
    }

    /// The first receive that failed (not counting flushes) since the queue
    /// was created or reset, with its scatter list's first entry and total
    /// length decoded from the WQE still in the ring.
    pub fn failure(&self) -> Option<crate::wr::FailedWr> {
        self.failure
    }

    /// Records the failure of the receive in ring entry `slot`.
    #[cold]
    pub(crate) fn record_failure(&mut self, slot: u32, wc: &super::completion::Wc) {
        if self.failure.is_some() || wc.status == super::completion::WcStatus::WR_FLUSH_ERR {
            return;
        }
        let mut f = crate::wr::FailedWr {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
            syndrome: wc.syndrome,
            recv: true,
            opcode: super::completion::WcOpcode::RECV,
            ..Default::default()
        };
        let mut first = true;
        self.for_each_sge(slot, |addr, len| {
            if first {
                f.local_addr = addr;
                first = false;
            }
            f.length = f.length.wrapping_add(len);
            true
        });
        self.failure = Some(f);
    }

    /// Writes one receive WQE; the doorbell record is updated by
    /// [`RecvQueue::ring`]. Nothing is written on error.
    ///
    /// # Safety
    /// Every SGE must name memory the device may write until completion.
    #[inline(always)]
    pub unsafe fn post(&mut self, wr: &RecvWr<'_>) -> Result<()> {
        if !self.state.can_recv() {
            return Err(Error::InvalidQpState);
        }
        if wr.sges.len() > self.max_sge as usize {
            return Err(Error::TooManySges);
        }
        crate::wr::total_length(wr.sges)?;
        if self.head.wrapping_sub(self.tail) >= self.wqe_cnt {
            return Err(Error::RqFull);
        }
        let slot = self.head & self.mask;
        // SAFETY: slot < wqe_cnt, so the entry is inside the ring.
        let base = unsafe { self.buf.as_ptr().add((slot as usize) << self.stride_shift) }
            .cast::<DataSeg>();
        let entries = 1usize << (self.stride_shift - 4);
        let mut n = 0usize;
        for s in wr.sges {
            if s.length == 0 {
                continue;
            }
            // SAFETY: n < max_sge <= entries (constructor), inside the entry.
            unsafe {
                base.add(n).write(DataSeg {
                    byte_count: Be32::new(s.length),
                    lkey: Be32::new(s.lkey),
                    addr: Be64::new(s.addr),
                })
            };
            n += 1;
        }
        if n < entries {
            // SAFETY: n < entries, inside the entry.
            unsafe {
                base.add(n).write(DataSeg {
                    byte_count: Be32::new(0),
                    lkey: Be32::new(INVALID_LKEY),
                    addr: Be64::new(0),
                })
            };
        }
        // SAFETY: slot < wqe_cnt <= wrid_len.
        unsafe { self.wrid.as_ptr().add(slot as usize).write(wr.wr_id) };
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Publishes posted receives: to-device barrier, then
    /// `dbrec[0] = head & 0xffff` (docs/spec/mlx5.md §6). No MMIO doorbell exists for
    /// receives.
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.rung == self.head {
            return;
        }
        // SAFETY: constructor contract on dbrec.
        unsafe { mmio::write_dbrec(self.dbrec.as_ptr(), self.head & 0xffff) };
        self.rung = self.head;
    }

    /// Posts a list and updates the doorbell record once. Stops at the
    /// first invalid WR (the earlier ones are posted).
    ///
    /// # Safety
    /// As for [`RecvQueue::post`].
    pub unsafe fn post_list(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: forwarded.
            if let Err(e) = unsafe { self.post(wr) } {
                self.ring();
                return Err(PostError { index: i, error: e });
            }
        }
        self.ring();
        Ok(())
    }

    /// Completes the receive at 16-bit index `wqe_counter`. Receives
    /// complete in order, so the counter must equal the tail's; anything
    /// else is a corrupt CQE and changes nothing.
    #[inline(always)]
    pub fn complete(&mut self, wqe_counter: u16) -> Option<(u64, u32)> {
        if self.head == self.tail || (self.tail & 0xffff) as u16 != wqe_counter {
            return None;
        }
        let slot = self.tail & self.mask;
        // SAFETY: slot < wqe_cnt <= wrid_len.
        let id = unsafe { self.wrid.as_ptr().add(slot as usize).read() };
        self.tail = self.tail.wrapping_add(1);
        Some((id, slot))
    }

    /// Calls `f(addr, len)` for each data segment of entry `slot` up to the
    /// terminator, for scatter-to-CQE copies.
    pub(crate) fn for_each_sge(&self, slot: u32, mut f: impl FnMut(u64, u32) -> bool) {
        let entries = 1usize << (self.stride_shift - 4);
        // SAFETY: slot & mask < wqe_cnt: the entry is inside the ring.
        let base = unsafe {
            self.buf
                .as_ptr()
                .add(((slot & self.mask) as usize) << self.stride_shift)
        }
        .cast::<DataSeg>();
        for i in 0..entries {
            // SAFETY: i < entries, inside the entry.
            let d = unsafe { base.add(i).read() };
            if d.lkey.get() == INVALID_LKEY && d.byte_count.get() == 0 {
                break;
            }
            if !f(d.addr.get(), d.byte_count.get()) {
                break;
            }
        }
    }
}

/// The memory of a receive queue that no WR is ever posted to and that the
/// device never sees: the core's stand-in for the receive queue of a QP on
/// a shared receive queue, whose `mlx5dv_qp` has none (`rq_wqe_cnt` 0),
/// so per-QP code and CQ routes keep one shape. One 16-byte entry, a
/// doorbell record and one side-table slot. The queue made over it takes
/// no SGE and stays empty, so a completion routed to it is `CqeCorrupt`;
/// callers refuse receives for such a QP before they would reach it.
#[repr(C, align(16))]
pub struct AbsentRq {
    ring: [u8; 16],
    dbrec: [u32; 2],
    wrid: [u64; 1],
}

impl Default for AbsentRq {
    fn default() -> AbsentRq {
        AbsentRq::new()
    }
}

impl AbsentRq {
    /// Zeroed memory for one stand-in queue.
    pub const fn new() -> AbsentRq {
        AbsentRq {
            ring: [0; 16],
            dbrec: [0; 2],
            wrid: [0; 1],
        }
    }

    /// The stand-in queue over this memory (in RTS, as every new queue).
    ///
    /// # Safety
    /// `self` must outlive the returned queue and not move while it exists
    /// (keep it boxed, or on the stack of the only code using the queue),
    /// and must back no other queue.
    pub unsafe fn queue(&mut self) -> Result<RecvQueue> {
        let dv = Mlx5dvQp {
            dbrec: self.dbrec.as_mut_ptr(),
            rq_buf: self.ring.as_mut_ptr().cast(),
            rq_wqe_cnt: 1,
            rq_stride: 16,
            ..Mlx5dvQp::EMPTY
        };
        let caps = QpCaps {
            max_send_sge: 0,
            max_inline_data: 0,
            max_recv_sge: 0,
        };
        let wrid = NonNull::from(&mut self.wrid).cast::<u64>();
        // SAFETY: the ring (16-byte aligned by the struct), the record and
        // the side-table slot are this struct's own, which the caller keeps
        // alive and in place for the queue's lifetime (contract); the queue
        // has no SGE, so nothing it holds names other memory.
        unsafe { RecvQueue::from_raw(&dv, &caps, wrid, 1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::Sge;

    #[test]
    fn absent_queue_is_empty_and_takes_no_sge() {
        let mut mem = AbsentRq::new();
        // SAFETY: `mem` outlives the queue and stays on this stack frame.
        let mut q = unsafe { mem.queue() }.unwrap();
        assert_eq!((q.wqe_cnt(), q.head(), q.tail()), (1, 0, 0));
        // Nothing outstanding: a completion routed here names no receive.
        assert_eq!(q.complete(0), None);
        let sge = [Sge {
            addr: 0x1000,
            length: 8,
            lkey: 1,
        }];
        let wr = RecvWr {
            wr_id: 7,
            sges: &sge,
        };
        // SAFETY: refused before anything is written (no SGE allowed).
        assert_eq!(unsafe { q.post(&wr) }, Err(Error::TooManySges));
        assert_eq!(q.head(), 0);
    }
}
