//! The siw send queue (docs/spec/siw.md §2–§4).
//!
//! An SQE may be written when its `flags` are 0; it is published by one
//! release store of its flags word with VALID set. The kernel copies the
//! SQE into private memory and clears `flags` when it *picks it up*,
//! before the operation completes, so a free slot says nothing about
//! completion. The doorbell (an empty `POST_SEND` command) is needed only
//! when the kernel's transmitter may be idle (docs/spec/siw.md §4).

use core::ptr;

use super::layout::{
    opcode, wqe_flags, wqe_word, wqe_word_fields, SiwSge, SiwSqe, MAX_INLINE, MAX_SGE, SGE_SIZE,
    SQE_INLINE_OFFSET, SQE_SGE_OFFSET,
};
use super::{read_at, write_at, Ring};
use crate::completion::{QpState, Wc, WcOpcode};
use crate::error::{Error, PostError, Result};
use crate::sync::Ordering;
use crate::wr::{FailedWr, Payload, QpCaps, SendFlags, SendOp, SendWr, Sge};

const SQE: usize = core::mem::size_of::<SiwSqe>();

/// What a send post did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Posted {
    /// WRs written and published by this call.
    pub count: usize,
    /// The caller must ring the doorbell now (docs/spec/siw.md §4). It covers this call's
    /// WRs and any earlier ones whose doorbell is still owed (see
    /// [`SiwSendQueue::take_doorbell`]).
    pub doorbell: bool,
}

/// What one WR becomes (validated).
#[derive(Clone, Copy)]
struct Plan {
    opcode: u8,
    flags: u16,
    num_sge: u8,
    rkey: u32,
    raddr: u64,
}

/// An siw send queue over the kernel's mapping.
#[derive(Debug)]
pub struct SiwSendQueue {
    ring: Ring<SQE>,
    /// Free-running producer counter (`sq_put`).
    put: u32,
    /// Slots written since construction (saturates at `n`).
    filled: u32,
    caps: QpCaps,
    sig_all: bool,
    state: QpState,
    doorbell_owed: bool,
    /// The counter of the first SQE posted since the last doorbell
    /// decision (`put` when there is none): SQEs from here were posted by
    /// [`SiwSendQueue::post_deferred`] and wait for
    /// [`SiwSendQueue::publish`].
    undecided: u32,
}

impl SiwSendQueue {
    /// Wraps the send queue mapped at `ptr` (`len` bytes) with `num_sqe`
    /// elements, as the create response reports it (`num_sqe`; the mapping
    /// is `num_sqe * 120` bytes at `sq_key`). `sig_all`: the QP was created
    /// with `sq_sig_all`, which siw leaves to user space, so every SQE is
    /// then marked SIGNALLED.
    ///
    /// Checks (else [`Error::InvalidGeometry`]): `ptr` non-null and
    /// 8-aligned, `num_sqe` a power of two in `1..=2^24`,
    /// `len >= num_sqe * 120`, `caps.max_send_sge <= 6`,
    /// `caps.max_inline_data <= 80`. The producer counter starts at 0, as
    /// the kernel's does. The queue starts in [`QpState::Rts`].
    ///
    /// # Safety
    /// - `ptr` points to the `len`-byte mapping of a new siw send queue
    ///   (every `flags` 0 or owned by the kernel), valid while this queue
    ///   exists; only this queue posts to it.
    /// - Every SGE later posted names memory the kernel may access as the
    ///   operation requires until the WR completes.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        num_sqe: u32,
        caps: QpCaps,
        sig_all: bool,
    ) -> Result<SiwSendQueue> {
        if caps.max_send_sge as usize > MAX_SGE || caps.max_inline_data as usize > MAX_INLINE {
            return Err(Error::InvalidGeometry);
        }
        Ok(SiwSendQueue {
            ring: Ring::new(ptr, len, num_sqe, 0)?,
            put: 0,
            filled: 0,
            caps,
            sig_all,
            state: QpState::Rts,
            doorbell_owed: false,
            undecided: 0,
        })
    }

    /// Elements in the ring (all usable).
    #[inline]
    pub fn num_sqe(&self) -> u32 {
        self.ring.len()
    }
    /// Capabilities WRs are validated against.
    #[inline]
    pub fn caps(&self) -> &QpCaps {
        &self.caps
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
    /// Records a QP state change: sends are refused with
    /// [`Error::InvalidQpState`] unless the state allows them.
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
    }
    /// True if published WRs are still waiting for a doorbell.
    #[inline]
    pub fn doorbell_owed(&self) -> bool {
        self.doorbell_owed
    }
    /// Whether a doorbell is owed, clearing the debt: call it after a post
    /// returned an error and ring if it says so.
    #[inline]
    pub fn take_doorbell(&mut self) -> bool {
        core::mem::take(&mut self.doorbell_owed)
    }
    /// SQEs posted by [`SiwSendQueue::post_deferred`] since the last
    /// doorbell decision.
    #[inline]
    pub fn deferred(&self) -> u32 {
        self.put.wrapping_sub(self.undecided)
    }
    /// Drops the deferred batch's doorbell decision: for after the QP left
    /// RTS (the kernel will not transmit the SQEs; see
    /// [`SiwSendQueue::reclaim`]).
    pub fn forget_deferred(&mut self) {
        self.undecided = self.put;
    }

    /// True if the slot of counter `c` is VALID (posted, not yet picked up
    /// by the kernel).
    #[inline(always)]
    fn posted(&self, c: u32, order: Ordering) -> bool {
        wqe_word_fields(self.ring.flags(c).load(order)).0 & wqe_flags::VALID != 0
    }

    /// Takes back the SQEs the kernel has not picked up (VALID still set),
    /// oldest first, calling `f` with each one's `id` (the wr_id posted);
    /// returns how many. For a QP in ERROR: siw flushes the SQ ring only
    /// when its transmit engine is busy (siw_qp.c, the CLOSING and
    /// TERMINATE transitions), so SQEs posted after the connection went
    /// down are never completed by the kernel, and the caller reports
    /// them flushed itself. An SQE the kernel takes at the same time (its
    /// flags change under the compare-and-swap) is left to the kernel.
    pub fn reclaim(&mut self, mut f: impl FnMut(u64)) -> u32 {
        let n = self.ring.len();
        let mut count = 0;
        for i in 0..n {
            let c = self.put.wrapping_sub(n).wrapping_add(i);
            let word = self.ring.flags(c);
            // Acquire: pairs with our own release publication; the id read
            // below is the one posted.
            let v = word.load(Ordering::Acquire);
            let (flags, num_sge, opcode) = wqe_word_fields(v);
            if flags & wqe_flags::VALID == 0 {
                continue;
            }
            // SAFETY: offset 0 of an element of the mapping; the element is
            // VALID, so the kernel has not picked it up and does not write
            // it.
            let id: u64 = unsafe { read_at(self.ring.slot(c), 0) };
            let cleared = wqe_word(flags & !wqe_flags::VALID, num_sge, opcode);
            // AcqRel: the kernel's pick-up (which clears the flags) and this
            // take-back exclude each other; whoever changes the word first
            // owns the SQE.
            if word
                .compare_exchange(v, cleared, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                f(id);
                count += 1;
            }
        }
        count
    }

    /// SQEs that can be posted now: the run of free slots from the
    /// producer (the kernel picks SQEs up in order). Costs one load per
    /// free slot.
    pub fn free_slots(&self) -> u32 {
        let n = self.ring.len();
        // Relaxed: an estimate; `post` re-checks each slot with acquire.
        (0..n)
            .take_while(|&i| !self.posted(self.put.wrapping_add(i), Ordering::Relaxed))
            .count() as u32
    }

    /// Validates one WR against the crate's rules and siw's (docs/spec/siw.md §2): no
    /// immediate data, no atomics, no NOP ([`Error::Unsupported`]); inline
    /// only on SEND and WRITE ([`Error::InlineNotAllowed`]), at most 80
    /// bytes; READ with exactly one SGE and without FENCE
    /// ([`Error::Unsupported`]).
    #[inline(always)]
    fn plan(&self, wr: &SendWr<'_>) -> Result<Plan> {
        let (op, rkey, raddr) = match wr.op {
            SendOp::Send => (opcode::SEND, 0, 0),
            // The kernel takes the STag to invalidate from `rkey` (docs/spec/siw.md §2).
            SendOp::SendInv { rkey } => (opcode::SEND_REMOTE_INV, rkey, 0),
            SendOp::Write { remote } => (opcode::WRITE, remote.rkey, remote.addr),
            SendOp::Read { remote } => (opcode::READ, remote.rkey, remote.addr),
            SendOp::SendImm { .. }
            | SendOp::WriteImm { .. }
            | SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
            | SendOp::Nop
            // siw has no memory windows (docs/spec/siw.md §2).
            | SendOp::BindMw(_)
            | SendOp::LocalInv { .. } => return Err(Error::Unsupported),
        };
        let shape = crate::wr::validate_send(wr, &self.caps)?;
        let mut flags = wqe_flags::VALID;
        if self.sig_all || wr.flags.contains(SendFlags::SIGNALED) {
            flags |= wqe_flags::SIGNALLED;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            flags |= wqe_flags::SOLICITED;
        }
        if wr.flags.contains(SendFlags::FENCE) {
            // The kernel refuses a fenced READ (docs/spec/siw.md §2).
            if op == opcode::READ {
                return Err(Error::Unsupported);
            }
            flags |= wqe_flags::READ_FENCE;
        }
        let num_sge = match wr.payload {
            Payload::Inline(_) => {
                if op != opcode::SEND && op != opcode::WRITE {
                    return Err(Error::InlineNotAllowed);
                }
                if shape.inline_len as usize > MAX_INLINE {
                    return Err(Error::InlineTooLarge);
                }
                flags |= wqe_flags::INLINE;
                // What the kernel normalises an inline SQE to.
                1
            }
            Payload::Sges(sges) => {
                if op == opcode::READ && sges.len() != 1 {
                    return Err(Error::Unsupported);
                }
                // max_send_sge <= 6 (constructor) bounds it.
                sges.len() as u8
            }
        };
        if !self.state.can_send() {
            return Err(Error::InvalidQpState);
        }
        Ok(Plan {
            opcode: op,
            flags,
            num_sge,
            rkey,
            raddr,
        })
    }

    /// Posts `wrs` in order, publishing each SQE with a release store of
    /// its flags. Stops at the first refused WR (invalid, not supported by
    /// siw, QP state, or [`Error::SqFull`] when the next slot is still
    /// VALID): the WRs before it are published, nothing of the refused one
    /// is written, and the error carries its index.
    ///
    /// On success, [`Posted::doorbell`] says whether the caller must ring
    /// the doorbell now (docs/spec/siw.md §4): when the SQE just before the
    /// first one posted here (or by [`SiwSendQueue::post_deferred`] since
    /// the last decision) has already been picked up by the kernel (its
    /// transmitter may be idle), when they filled the whole SQ, or when an
    /// earlier doorbell is still owed. After an error, call
    /// [`SiwSendQueue::take_doorbell`].
    ///
    /// # Safety
    /// Every SGE must name memory the kernel may access as the operation
    /// requires until the WR completes (see [`SiwSendQueue::new`]).
    pub unsafe fn post(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<Posted, PostError> {
        // SAFETY: forwarded contract.
        let (count, failed) = unsafe { self.write(wrs) };
        self.publish();
        match failed {
            None => Ok(Posted {
                count,
                doorbell: self.take_doorbell(),
            }),
            Some(e) => Err(e),
        }
    }

    /// Posts `wrs` as [`SiwSendQueue::post`] does and stops at the same
    /// WR, without the doorbell decision: that waits for
    /// [`SiwSendQueue::publish`] (or the next `post`), made once for the
    /// whole batch. siw has no producer index: each SQE is published by
    /// its own VALID store (docs/spec/siw.md §3), so a transmitter that is
    /// busy may take a deferred SQE before the batch ends; only the
    /// system call waits. Returns how many were posted.
    ///
    /// # Safety
    /// As [`SiwSendQueue::post`].
    pub unsafe fn post_deferred(
        &mut self,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<usize, PostError> {
        // SAFETY: forwarded contract.
        match unsafe { self.write(wrs) } {
            (n, None) => Ok(n),
            (_, Some(e)) => Err(e),
        }
    }

    /// Ends a deferred batch: the docs/spec/siw.md §4 decision for every
    /// SQE posted since the last one; when it says ring, the doorbell is
    /// owed ([`SiwSendQueue::take_doorbell`]). Returns how many SQEs it
    /// covered (0: nothing was pending, nothing decided).
    pub fn publish(&mut self) -> u32 {
        let first = self.undecided;
        let count = self.put.wrapping_sub(first);
        if count != 0 {
            self.undecided = self.put;
            if self.doorbell_decision(first, count) {
                self.doorbell_owed = true;
            }
        }
        count
    }

    /// Writes and publishes `wrs` from `put` on, stopping at the first
    /// refused WR; returns how many were posted and the refusal.
    ///
    /// # Safety
    /// As [`SiwSendQueue::post`].
    #[inline(always)]
    unsafe fn write(&mut self, wrs: &[SendWr<'_>]) -> (usize, Option<PostError>) {
        let first = self.put;
        let mut put = first;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            let plan = match self.plan(wr) {
                Ok(p) => p,
                Err(error) => {
                    failed = Some(PostError { index, error });
                    break;
                }
            };
            // Acquire: pairs with the kernel's store clearing `flags` when
            // it copied the SQE (docs/spec/siw.md §3); its reads of the old contents
            // happen before our writes below.
            if self.posted(put, Ordering::Acquire) {
                failed = Some(PostError {
                    index,
                    error: Error::SqFull,
                });
                break;
            }
            let slot = self.ring.slot(put);
            // SAFETY: the slot is inside the mapping, 8-aligned, and ours
            // (flags 0); the WR is valid (`plan`); the SGE contract is
            // forwarded.
            unsafe { write_sqe(slot, wr, &plan) };
            // Release: the SQE's fields are written before the kernel can
            // see VALID (it reads them after loading the flags, docs/spec/siw.md §3).
            self.ring.flags(put).store(
                wqe_word(plan.flags, plan.num_sge, plan.opcode),
                Ordering::Release,
            );
            put = put.wrapping_add(1);
        }
        let count = put.wrapping_sub(first);
        self.put = put;
        self.filled = self.filled.saturating_add(count).min(self.ring.len());
        (count as usize, failed)
    }

    /// The docs/spec/siw.md §4 rule for `count` SQEs just posted from counter `first`:
    /// ring if they refilled the whole SQ, or if the SQE before `first` has
    /// already been picked up (the kernel's transmitter may have gone idle
    /// before it saw ours). If that SQE is still VALID, the transmitter
    /// has not reached it yet and will continue into ours on its own.
    #[inline(always)]
    fn doorbell_decision(&self, first: u32, count: u32) -> bool {
        if count >= self.ring.len() {
            return true;
        }
        // SeqCst fence: a store-then-load ordering. Our VALID stores above
        // must be visible before we load the previous SQE's flags, or both
        // we (seeing it still VALID) and the kernel (which clears those
        // flags, then later looks at our first SQE) could miss each other
        // and nothing would ring. Acquire/release cannot order a store
        // before a later load; rdma-core gets the same from its sequentially
        // consistent C11 atomics, and the kernel from `smp_store_mb`.
        crate::mmio::store_load_barrier();
        // Relaxed: only the value matters, no data is read through it.
        !self.posted(first.wrapping_sub(1), Ordering::Relaxed)
    }

    /// Decodes the SQE in `slot` (masked) back into what was posted (docs/spec/siw.md §2).
    /// The kernel clears only the flags of a slot it picked up, so the rest
    /// stays exact until the slot is reused — which may happen as soon as
    /// it is picked up, before the WR completes. Once the flags are
    /// cleared the INLINE bit is gone; an SQE whose `sge[0]` has address
    /// and key 0 (no siw STag is 0) is then reported as inline.
    #[cold]
    pub fn describe(&self, slot: u32) -> FailedWr {
        let p = self.ring.slot(slot);
        // Relaxed: a diagnostic snapshot of the word.
        let (flags, num_sge, op) = wqe_word_fields(self.ring.flags(slot).load(Ordering::Relaxed));
        // SAFETY: fixed offsets inside the 120-byte element, aligned.
        let (id, rkey, raddr, s0) = unsafe {
            (
                read_at::<u64>(p, 0),
                read_at::<u32>(p, 12),
                read_at::<u64>(p, 16),
                read_at::<SiwSge>(p, SQE_SGE_OFFSET),
            )
        };
        let mut f = FailedWr {
            wr_id: id,
            opcode: match op {
                opcode::WRITE => WcOpcode::RDMA_WRITE,
                opcode::READ | opcode::READ_LOCAL_INV => WcOpcode::RDMA_READ,
                _ => WcOpcode::SEND,
            },
            ..FailedWr::default()
        };
        if matches!(op, opcode::WRITE | opcode::READ | opcode::READ_LOCAL_INV) {
            f.remote_addr = raddr;
            f.rkey = rkey;
        }
        let inline = flags & wqe_flags::INLINE != 0
            || (matches!(op, opcode::SEND | opcode::WRITE)
                && num_sge == 1
                && s0.laddr == 0
                && s0.lkey == 0);
        if inline {
            f.inline = true;
            f.length = s0.length;
            return f;
        }
        f.local_addr = s0.laddr;
        f.lkey = s0.lkey;
        let n = (num_sge as usize).min(MAX_SGE);
        for i in 0..n {
            // SAFETY: SGE i < 6 lies inside the element.
            let s = unsafe { read_at::<SiwSge>(p, SQE_SGE_OFFSET + i * SGE_SIZE) };
            f.length = f.length.wrapping_add(s.length);
        }
        f
    }

    /// [`SiwSendQueue::describe`] with the completion's status filled in.
    #[cold]
    pub fn failed_wr(&self, slot: u32, wc: &Wc) -> FailedWr {
        FailedWr {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
            ..self.describe(slot)
        }
    }

    /// The slot of the most recently posted SQE with `wr_id` that the
    /// kernel has picked up and that is still intact, for
    /// [`SiwSendQueue::describe`]. Call it when polling an error completion,
    /// before posting more; wr_ids should be unique.
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

/// Writes every field of an SQE except its flags word (docs/spec/siw.md §2).
///
/// # Safety
/// `slot` is a free (flags 0), 8-aligned SQE of the mapping; `wr` passed
/// [`SiwSendQueue::plan`].
#[inline(always)]
unsafe fn write_sqe(slot: *mut u8, wr: &SendWr<'_>, plan: &Plan) {
    // SAFETY: caller contract; fixed, aligned offsets inside the element;
    // the caller's slices cannot overlap the mapping.
    unsafe {
        write_at(slot, 0, wr.wr_id);
        write_at(slot, 12, plan.rkey);
        write_at(slot, 16, plan.raddr);
        match wr.payload {
            Payload::Sges(sges) => {
                // At most 6 (`plan`); `Sge` is `struct siw_sge`.
                ptr::copy_nonoverlapping(
                    sges.as_ptr(),
                    slot.add(SQE_SGE_OFFSET).cast::<Sge>(),
                    sges.len(),
                );
            }
            Payload::Inline(pieces) => {
                // Payload from sge[1] (offset 40), at most 80 bytes, so it
                // ends inside the element.
                let mut off = 0usize;
                for p in pieces {
                    ptr::copy_nonoverlapping(
                        p.as_ptr(),
                        slot.add(SQE_INLINE_OFFSET + off),
                        p.len(),
                    );
                    off += p.len();
                }
                // sge[0]: address and key 0 (unused; the kernel points it at
                // the payload), length = payload bytes.
                write_at(
                    slot,
                    SQE_SGE_OFFSET,
                    SiwSge {
                        laddr: 0,
                        length: off as u32,
                        lkey: 0,
                    },
                );
            }
        }
    }
}
