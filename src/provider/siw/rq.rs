//! The siw receive queue (docs/spec/siw.md §2, §3); also an SRQ, which has
//! the same layout. No doorbell: the kernel looks for a VALID RQE when a
//! message arrives.

use core::ptr;

use super::layout::{
    wqe_flags, wqe_word, wqe_word_fields, SiwRqe, SiwSge, MAX_SGE, RQE_SGE_OFFSET, SGE_SIZE,
};
use super::{read_at, write_at, Ring};
use crate::completion::{QpState, Wc, WcOpcode};
use crate::error::{Error, PostError, Result};
use crate::sync::Ordering;
use crate::wr::{FailedWr, QpCaps, RecvWr, Sge};

const RQE: usize = core::mem::size_of::<SiwRqe>();

/// An siw receive queue (or SRQ) over the kernel's mapping.
#[derive(Debug)]
pub struct SiwRecvQueue {
    ring: Ring<RQE>,
    /// Free-running producer counter (`rq_put`).
    put: u32,
    /// Slots written since construction (saturates at `n`).
    filled: u32,
    max_sge: u32,
    state: QpState,
}

impl SiwRecvQueue {
    /// Wraps the receive queue mapped at `ptr` (`len` bytes) with `num_rqe`
    /// elements, as the create response reports it (the mapping is
    /// `num_rqe * 112` bytes at `rq_key`; an SRQ's at `srq_key`).
    ///
    /// Checks (else [`Error::InvalidGeometry`]): `ptr` non-null and
    /// 8-aligned, `num_rqe` a power of two in `1..=2^24`,
    /// `len >= num_rqe * 112`, `caps.max_recv_sge <= 6`. Starts in
    /// [`QpState::Rts`].
    ///
    /// # Safety
    /// - `ptr` points to the `len`-byte mapping of a new siw receive queue,
    ///   valid while this queue exists; only this queue posts to it.
    /// - Every SGE later posted names memory the kernel may write until
    ///   the receive completes.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        num_rqe: u32,
        caps: &QpCaps,
    ) -> Result<SiwRecvQueue> {
        if caps.max_recv_sge as usize > MAX_SGE {
            return Err(Error::InvalidGeometry);
        }
        Ok(SiwRecvQueue {
            ring: Ring::new(ptr, len, num_rqe, 0)?,
            put: 0,
            filled: 0,
            max_sge: caps.max_recv_sge,
            state: QpState::Rts,
        })
    }

    /// Elements in the ring (all usable).
    #[inline]
    pub fn num_rqe(&self) -> u32 {
        self.ring.len()
    }
    /// The free-running producer counter.
    #[inline]
    pub fn producer(&self) -> u32 {
        self.put
    }
    /// The QP state as the owner last reported it.
    #[inline]
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Records a QP state change: receives are refused in RESET.
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
    }

    #[inline(always)]
    fn posted(&self, c: u32, order: Ordering) -> bool {
        wqe_word_fields(self.ring.flags(c).load(order)).0 & wqe_flags::VALID != 0
    }

    /// RQEs that can be posted now (the run of free slots from the
    /// producer). Costs one load per free slot.
    pub fn free_slots(&self) -> u32 {
        let n = self.ring.len();
        // Relaxed: an estimate; `post` re-checks each slot with acquire.
        (0..n)
            .take_while(|&i| !self.posted(self.put.wrapping_add(i), Ordering::Relaxed))
            .count() as u32
    }

    /// Posts `wrs` in order, publishing each RQE with a release store of
    /// its flags (exactly VALID, as the kernel requires); returns how many
    /// were posted. Stops at the first refused WR (QP in RESET, too many
    /// SGEs, length overflow, [`Error::RqFull`] when the next slot is still
    /// VALID): the ones before it are published.
    ///
    /// # Safety
    /// Every SGE must name memory the kernel may write until the receive
    /// completes.
    pub unsafe fn post(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<usize, PostError> {
        let first = self.put;
        let mut put = first;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(error) = self.check(wr) {
                failed = Some(PostError { index, error });
                break;
            }
            // Acquire: pairs with the kernel's store clearing the flags
            // once it has taken the RQE (docs/spec/siw.md §3); its reads happen before our
            // writes.
            if self.posted(put, Ordering::Acquire) {
                failed = Some(PostError {
                    index,
                    error: Error::RqFull,
                });
                break;
            }
            let slot = self.ring.slot(put);
            // SAFETY: the slot is inside the mapping, 8-aligned and ours
            // (flags 0); at most 6 SGEs (`check`) fit from offset 16; the
            // caller's slice cannot overlap the mapping.
            unsafe {
                write_at(slot, 0, wr.wr_id);
                write_at(slot, 12, 0u32);
                ptr::copy_nonoverlapping(
                    wr.sges.as_ptr(),
                    slot.add(RQE_SGE_OFFSET).cast::<Sge>(),
                    wr.sges.len(),
                );
            }
            // Release: the RQE's fields are written before the kernel can
            // see VALID. The opcode byte is 0 (ignored from user space).
            self.ring.flags(put).store(
                wqe_word(wqe_flags::VALID, wr.sges.len() as u8, 0),
                Ordering::Release,
            );
            put = put.wrapping_add(1);
        }
        let count = put.wrapping_sub(first);
        self.put = put;
        self.filled = self.filled.saturating_add(count).min(self.ring.len());
        match failed {
            None => Ok(count as usize),
            Some(e) => Err(e),
        }
    }

    #[inline(always)]
    fn check(&self, wr: &RecvWr<'_>) -> Result<()> {
        if !self.state.can_recv() {
            return Err(Error::InvalidQpState);
        }
        // max_recv_sge <= 6 (constructor) bounds the count to the RQE's.
        if wr.sges.len() > self.max_sge as usize {
            return Err(Error::TooManySges);
        }
        crate::wr::total_length(wr.sges)?;
        Ok(())
    }

    /// Decodes the RQE in `slot` (masked): first buffer and total length.
    /// The kernel clears only the flags, so this is exact until the slot
    /// is reused.
    #[cold]
    pub fn describe(&self, slot: u32) -> FailedWr {
        let p = self.ring.slot(slot);
        // Relaxed: a diagnostic snapshot.
        let (_, num_sge, _) = wqe_word_fields(self.ring.flags(slot).load(Ordering::Relaxed));
        // SAFETY: offset 0 of the element, aligned.
        let id = unsafe { read_at::<u64>(p, 0) };
        let mut f = FailedWr {
            wr_id: id,
            recv: true,
            opcode: WcOpcode::RECV,
            ..FailedWr::default()
        };
        let n = (num_sge as usize).min(MAX_SGE);
        for i in 0..n {
            // SAFETY: SGE i < 6 lies inside the 112-byte element.
            let s = unsafe { read_at::<SiwSge>(p, RQE_SGE_OFFSET + i * SGE_SIZE) };
            if i == 0 {
                f.local_addr = s.laddr;
                f.lkey = s.lkey;
            }
            f.length = f.length.wrapping_add(s.length);
        }
        f
    }

    /// [`SiwRecvQueue::describe`] with the completion's status filled in.
    #[cold]
    pub fn failed_wr(&self, slot: u32, wc: &Wc) -> FailedWr {
        FailedWr {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
            ..self.describe(slot)
        }
    }

    /// The slot of the most recently posted RQE with `wr_id` that the
    /// kernel has taken and that is still intact (see
    /// [`super::SiwSendQueue::find`]).
    #[cold]
    pub fn find(&self, wr_id: u64) -> Option<u32> {
        let mask = self.ring.mask;
        (1..=self.filled)
            .map(|i| self.put.wrapping_sub(i))
            .filter(|&c| !self.posted(c, Ordering::Acquire))
            // SAFETY: offset 0 of an element inside the mapping, 8-aligned.
            .find(|&c| unsafe { read_at::<u64>(self.ring.slot(c), 0) } == wr_id)
            .map(|c| c & mask)
    }
}
