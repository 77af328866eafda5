//! The rxe receive queue (docs/spec/rxe.md §2, §4); also an SRQ, which has
//! the same layout.
//!
//! The process produces, the kernel consumes when a receive completes.
//! Posting is writing the WQE and a release store of the producer index:
//! there is no doorbell, the kernel's responder looks at the queue when a
//! packet arrives.

use core::ptr;

use super::layout::{RxeRecvWqe, RECV_SGE_OFFSET, SGE_SIZE};
use super::{read_at, RxeQueue};
use crate::completion::{QpState, Wc, WcOpcode};
use crate::error::{Error, PostError, Result};
use crate::sync::Ordering;
use crate::wr::{FailedWr, QpCaps, RecvWr, Sge};

/// Element size an rxe receive queue needs for `caps` (docs/spec/rxe.md §4):
/// `40 + 16 * max_recv_sge`.
#[inline]
pub const fn required_elem_size(caps: &QpCaps) -> u64 {
    RECV_SGE_OFFSET as u64 + caps.max_recv_sge as u64 * SGE_SIZE as u64
}

/// An rxe receive queue (or SRQ) over the kernel's mapping.
#[derive(Debug)]
pub struct RxeRecvQueue {
    q: RxeQueue,
    /// Our producer index (masked).
    prod: u32,
    max_sge: u32,
    state: QpState,
    /// Slots written since construction or resync (saturates at `slots`).
    filled: u32,
}

impl RxeRecvQueue {
    /// Wraps the receive queue mapped at `ptr` (`len` bytes: the `size` of
    /// the create response's `rq_mi`, or of an SRQ's `mi`). The header is
    /// validated as in [`RxeQueue::new`], and the element must hold
    /// `caps.max_recv_sge` SGEs ([`required_elem_size`]); otherwise
    /// [`Error::InvalidGeometry`]. Starts in [`QpState::Rts`].
    ///
    /// # Safety
    /// - `ptr` points to the `len`-byte mapping of an rxe receive queue,
    ///   valid while this queue exists; only this queue writes its WQEs and
    ///   its producer index.
    /// - Every SGE later posted names memory the kernel may write until
    ///   the receive completes.
    pub unsafe fn new(ptr: *mut u8, len: usize, caps: &QpCaps) -> Result<RxeRecvQueue> {
        let need = usize::try_from(required_elem_size(caps)).map_err(|_| Error::InvalidGeometry)?;
        // SAFETY: forwarded contract.
        let q = unsafe { RxeQueue::new(ptr, len, need) }?;
        // Relaxed: the producer word is ours; nobody else writes it.
        let prod = q.producer().load(Ordering::Relaxed) & q.mask;
        Ok(RxeRecvQueue {
            q,
            prod,
            max_sge: caps.max_recv_sge,
            state: QpState::Rts,
            filled: 0,
        })
    }

    /// The mapping's geometry.
    #[inline]
    pub fn queue(&self) -> &RxeQueue {
        &self.q
    }
    /// Slots in the ring.
    #[inline]
    pub fn slots(&self) -> u32 {
        self.q.slots()
    }
    /// Receives the ring holds at once (`slots - 1`).
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.q.capacity()
    }
    /// Our producer index (masked).
    #[inline]
    pub fn producer(&self) -> u32 {
        self.prod
    }
    /// The kernel's consumer index (masked): every receive before it has
    /// completed.
    #[inline]
    pub fn kernel_consumer(&self) -> u32 {
        // Acquire: pairs with the kernel's release store (docs/spec/rxe.md §2); its reads
        // of the WQEs before the index happen before we reuse the slots.
        self.q.consumer().load(Ordering::Acquire) & self.q.mask
    }
    /// Receives posted and not yet completed.
    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.prod.wrapping_sub(self.kernel_consumer()) & self.q.mask
    }
    /// Receives that can be posted now.
    #[inline]
    pub fn free_slots(&self) -> u32 {
        self.q.capacity() - self.outstanding()
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
    /// Re-reads the producer index after the kernel reset the queue.
    pub fn resync(&mut self) {
        // Relaxed: rewritten by the kernel inside the modify-QP command,
        // which the system call orders before this load.
        self.prod = self.q.producer().load(Ordering::Relaxed) & self.q.mask;
        self.filled = 0;
    }

    /// Posts `wrs` in order and publishes them with one release store of
    /// the producer index; returns how many were posted. Stops at the first
    /// refused WR (too many SGEs, length overflow, QP in RESET,
    /// [`Error::RqFull`]): the ones before it are published.
    ///
    /// # Safety
    /// Every SGE must name memory the kernel may write until the receive
    /// completes.
    pub unsafe fn post(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<usize, PostError> {
        let mask = self.q.mask;
        let mut prod = self.prod;
        let mut cons = self.kernel_consumer();
        let mut count = 0usize;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(error) = self.check(wr) {
                failed = Some(PostError { index, error });
                break;
            }
            let next = prod.wrapping_add(1) & mask;
            if next == cons {
                cons = self.kernel_consumer();
                if next == cons {
                    failed = Some(PostError {
                        index,
                        error: Error::RqFull,
                    });
                    break;
                }
            }
            // SAFETY: the slot is inside the mapping (masked) and free (the
            // consumer index has passed it); the SGEs fit the element
            // (constructor, `check`); the caller's slice cannot overlap the
            // mapping.
            unsafe { write_recv(self.q.slot_ptr(prod), wr) };
            prod = next;
            count += 1;
        }
        if count != 0 {
            // Release: the WQE stores happen before the kernel sees the new
            // index (it acquire-loads it, docs/spec/rxe.md §2).
            self.q.producer().store(prod, Ordering::Release);
            self.prod = prod;
            self.filled = self.filled.saturating_add(count as u32).min(self.q.slots());
        }
        match failed {
            None => Ok(count),
            Some(e) => Err(e),
        }
    }

    #[inline(always)]
    fn check(&self, wr: &RecvWr<'_>) -> Result<()> {
        // The order of mlx5's `RecvQueue::post`: state, then the WR.
        if !self.state.can_recv() {
            return Err(Error::InvalidQpState);
        }
        if wr.sges.len() > self.max_sge as usize {
            return Err(Error::TooManySges);
        }
        crate::wr::total_length(wr.sges)?;
        Ok(())
    }

    /// Decodes the receive WQE in `slot` (masked): first buffer and total
    /// length (docs/spec/rxe.md §4). Bounded by the element, never out of bounds.
    #[cold]
    pub fn describe(&self, slot: u32) -> FailedWr {
        let p = self.q.slot_ptr(slot);
        // SAFETY: offsets inside the 40-byte header of the element.
        let (wr_id, length, num_sge) = unsafe {
            (
                read_at::<u64>(p, 0),
                read_at::<u32>(p, 16),
                read_at::<u32>(p, 28),
            )
        };
        let mut f = FailedWr {
            wr_id,
            recv: true,
            opcode: WcOpcode::RECV,
            length,
            ..FailedWr::default()
        };
        if num_sge != 0 && self.q.elem_size() >= RECV_SGE_OFFSET + SGE_SIZE {
            // SAFETY: one SGE at offset 40 fits in the element (tested).
            let s = unsafe { read_at::<Sge>(p, RECV_SGE_OFFSET) };
            f.local_addr = s.addr;
            f.lkey = s.lkey;
        }
        f
    }

    /// [`RxeRecvQueue::describe`] with the completion's status filled in.
    #[cold]
    pub fn failed_wr(&self, slot: u32, wc: &Wc) -> FailedWr {
        FailedWr {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
            ..self.describe(slot)
        }
    }

    /// The slot of the most recently completed receive with `wr_id` still
    /// intact in the ring (see [`super::RxeSendQueue::find`]).
    #[cold]
    pub fn find(&self, wr_id: u64) -> Option<u32> {
        let mask = self.q.mask;
        let cons = self.kernel_consumer();
        let outstanding = self.prod.wrapping_sub(cons) & mask;
        let done = self.filled.saturating_sub(outstanding);
        (1..=done).map(|i| cons.wrapping_sub(i) & mask).find(|&s| {
            // SAFETY: offset 0 of an element of the mapping, 8-aligned.
            unsafe { read_at::<u64>(self.q.slot_ptr(s), 0) == wr_id }
        })
    }
}

/// Writes one checked receive WR at `slot` (docs/spec/rxe.md §4).
///
/// # Safety
/// `slot` is a free, 8-aligned element with room for `wr.sges` after the
/// 40-byte header.
#[inline(always)]
unsafe fn write_recv(slot: *mut u8, wr: &RecvWr<'_>) {
    let mut len = 0u32;
    for s in wr.sges {
        // Checked: the sum is at most 2^31.
        len = len.wrapping_add(s.length);
    }
    let n = wr.sges.len() as u32;
    let mut w = RxeRecvWqe {
        wr_id: wr.wr_id,
        reserved: n,
        ..RxeRecvWqe::default()
    };
    w.dma.length = len;
    w.dma.resid = len;
    w.dma.num_sge = n;
    // SAFETY: caller contract; `Sge` is `struct rxe_sge`.
    unsafe {
        slot.cast::<RxeRecvWqe>().write(w);
        ptr::copy_nonoverlapping(
            wr.sges.as_ptr(),
            slot.add(RECV_SGE_OFFSET).cast::<Sge>(),
            wr.sges.len(),
        );
    }
}
