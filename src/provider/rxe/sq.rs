//! The rxe send queue (docs/spec/rxe.md §2, §3, §6).
//!
//! The process produces, the kernel consumes. A WQE is written in place
//! (header at offset 0, SGEs or inline payload at 208), then the producer
//! index is published with one release store per batch; the doorbell (an
//! empty `POST_SEND` command, docs/spec/rxe.md §6) is the caller's, once per non-empty
//! batch. The kernel advances the consumer index only when a WQE
//! *completes* (signaled or not), and uses the WQE memory as scratch until
//! then, so a slot is reused only after the consumer index has passed it:
//! the ring holds `slots - 1` WQEs.

use core::ptr;

use super::layout::{
    send_flags, wr_opcode, RxeAtomicWr, RxeMwWr, RxeRdmaWr, RxeSendWqe, RxeUdWr,
    SEND_PAYLOAD_OFFSET, SGE_SIZE,
};
use super::{read_at, RxeQueue};
use crate::completion::{QpState, Wc, WcOpcode};
use crate::error::{Error, PostError, Result};
use crate::sync::Ordering;
use crate::wr::{FailedWr, Payload, QpCaps, SendOp, SendWr, Sge};

/// What a send post did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Posted {
    /// WRs written and published by this call.
    pub count: usize,
    /// The caller must ring the doorbell now. It covers this call's WRs
    /// and any earlier ones whose doorbell is still owed (see
    /// [`RxeSendQueue::take_doorbell`]).
    pub doorbell: bool,
}

/// Where a UD send goes (docs/spec/rxe.md §8): the address handle's
/// number from CREATE_AH, the destination QP and the Q_Key as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxeUdDest {
    /// `ah_num` of an address handle of the QP's PD (not 0).
    pub ah_num: u32,
    /// Destination QP number (24 bits).
    pub remote_qpn: u32,
    /// The Q_Key the DETH carries (the kernel sends it as it is).
    pub qkey: u32,
}

/// Element size an rxe send queue needs for `caps` (docs/spec/rxe.md §3):
/// `208 + max(16 * max_send_sge, max_inline_data)`. The kernel rounds it up
/// to a power of two.
#[inline]
pub const fn required_elem_size(caps: &QpCaps) -> u64 {
    let sges = caps.max_send_sge as u64 * SGE_SIZE as u64;
    let inline = caps.max_inline_data as u64;
    SEND_PAYLOAD_OFFSET as u64 + if sges > inline { sges } else { inline }
}

/// An rxe send queue over the kernel's mapping.
#[derive(Debug)]
pub struct RxeSendQueue {
    q: RxeQueue,
    /// Our producer index (masked) as published; the header word is
    /// written only from it.
    prod: u32,
    /// The slot the next WQE is written to (masked): ahead of `prod` by
    /// the WQEs written by [`RxeSendQueue::post_deferred`] and not yet
    /// published.
    written: u32,
    caps: QpCaps,
    state: QpState,
    /// WRs were published whose doorbell the caller has not been told to
    /// ring yet (a post that stopped at a refused WR).
    doorbell_owed: bool,
    /// Slots written since construction or [`RxeSendQueue::resync`]
    /// (saturates at `slots`): the ones [`RxeSendQueue::find`] may read.
    filled: u32,
}

impl RxeSendQueue {
    /// Wraps the send queue mapped at `ptr` (`len` bytes: the `size` of the
    /// create response's `sq_mi`). The header is validated as in
    /// [`RxeQueue::new`], and the element must hold the largest WQE `caps`
    /// allows ([`required_elem_size`]); otherwise
    /// [`Error::InvalidGeometry`]. The producer index is adopted from the
    /// header (0 for a new queue). The queue starts in [`QpState::Rts`];
    /// the owner reports state changes with [`RxeSendQueue::set_state`].
    ///
    /// # Safety
    /// - `ptr` points to the `len`-byte mapping of an rxe send queue,
    ///   valid while this queue exists; only this queue writes its WQEs and
    ///   its producer index (the kernel reads them).
    /// - Every SGE later posted names memory the kernel may access as the
    ///   operation requires until the WR completes.
    pub unsafe fn new(ptr: *mut u8, len: usize, caps: QpCaps) -> Result<RxeSendQueue> {
        let need =
            usize::try_from(required_elem_size(&caps)).map_err(|_| Error::InvalidGeometry)?;
        // SAFETY: forwarded contract.
        let q = unsafe { RxeQueue::new(ptr, len, need) }?;
        // Relaxed: the producer word is ours; nobody else writes it.
        let prod = q.producer().load(Ordering::Relaxed) & q.mask;
        Ok(RxeSendQueue {
            q,
            prod,
            written: prod,
            caps,
            state: QpState::Rts,
            doorbell_owed: false,
            filled: 0,
        })
    }

    /// The mapping's geometry.
    #[inline]
    pub fn queue(&self) -> &RxeQueue {
        &self.q
    }
    /// Capabilities WRs are validated against.
    #[inline]
    pub fn caps(&self) -> &QpCaps {
        &self.caps
    }
    /// Slots in the ring.
    #[inline]
    pub fn slots(&self) -> u32 {
        self.q.slots()
    }
    /// WQEs the ring holds at once (`slots - 1`).
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.q.capacity()
    }
    /// Our producer index (masked) as published: the slot the next WQE
    /// goes to when nothing is deferred.
    #[inline]
    pub fn producer(&self) -> u32 {
        self.prod
    }
    /// The kernel's consumer index (masked): every WQE before it has
    /// completed.
    #[inline]
    pub fn kernel_consumer(&self) -> u32 {
        // Acquire: pairs with the kernel's release store of the consumer
        // index (docs/spec/rxe.md §2), so its last writes into the WQEs before it (status,
        // PSNs, cursors) happen before anything we do with those slots.
        self.q.consumer().load(Ordering::Acquire) & self.q.mask
    }
    /// WQEs written (published or deferred) and not yet completed by the
    /// kernel.
    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.written.wrapping_sub(self.kernel_consumer()) & self.q.mask
    }
    /// WQEs written by [`RxeSendQueue::post_deferred`] and not yet
    /// published.
    #[inline]
    pub fn deferred(&self) -> u32 {
        self.written.wrapping_sub(self.prod) & self.q.mask
    }
    /// WQEs that can be posted now.
    #[inline]
    pub fn free_slots(&self) -> u32 {
        self.q.capacity() - self.outstanding()
    }
    /// The QP state as the owner last reported it.
    #[inline]
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Records a QP state change made by the control path: sends are
    /// refused with [`Error::InvalidQpState`] unless the state allows them.
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
    }

    /// True if published WRs are still waiting for a doorbell.
    #[inline]
    pub fn doorbell_owed(&self) -> bool {
        self.doorbell_owed
    }

    /// Whether a doorbell is owed, clearing the debt: call it after a post
    /// returned an error and ring if it says so (the WRs before the refused
    /// one were published). A successful post hands the debt back in
    /// [`Posted::doorbell`] itself.
    #[inline]
    pub fn take_doorbell(&mut self) -> bool {
        core::mem::take(&mut self.doorbell_owed)
    }

    /// Re-reads the producer index from the header and forgets everything
    /// posted: for after the kernel reset the queue (QP moved to RESET,
    /// which zeroes both indices).
    pub fn resync(&mut self) {
        // Relaxed: the kernel rewrote the word inside the modify-QP
        // command, which the system call orders before this load.
        self.prod = self.q.producer().load(Ordering::Relaxed) & self.q.mask;
        self.written = self.prod;
        self.filled = 0;
        self.doorbell_owed = false;
    }

    /// Checks one WR: the crate's rules, then rxe's (no NOP).
    #[inline(always)]
    fn check(&self, wr: &SendWr<'_>) -> Result<()> {
        if matches!(wr.op, SendOp::Nop) {
            return Err(Error::Unsupported);
        }
        crate::wr::validate_send(wr, &self.caps)?;
        if !self.state.can_send() {
            return Err(Error::InvalidQpState);
        }
        Ok(())
    }

    /// Posts `wrs` in order and publishes them, with any WQEs deferred
    /// before them ([`RxeSendQueue::post_deferred`]), with one release
    /// store of the producer index. Stops at the first WR that is refused
    /// (invalid, not supported by rxe, QP state, or [`Error::SqFull`]):
    /// the WRs before it are published, the refused one and those after it
    /// are not, and the error carries its index. Nothing of a refused WR is
    /// written.
    ///
    /// On success, [`Posted::doorbell`] says whether the caller must ring
    /// the doorbell now (always, when anything was published by this or an
    /// earlier call since the last doorbell). After an error, call
    /// [`RxeSendQueue::take_doorbell`].
    ///
    /// # Safety
    /// Every SGE must name memory the kernel may access as the operation
    /// requires until the WR completes (see [`RxeSendQueue::new`]).
    pub unsafe fn post(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<Posted, PostError> {
        // SAFETY: forwarded contract.
        let (count, failed) = unsafe { self.write(wrs, None) };
        self.publish();
        match failed {
            None => Ok(Posted {
                count,
                doorbell: self.take_doorbell(),
            }),
            Some(e) => Err(e),
        }
    }

    /// Posts `wrs` as [`RxeSendQueue::post`] does, each as a UD send to
    /// `dest` (a UD QP's ring, docs/spec/rxe.md §8). Only SEND and
    /// SEND_WITH_IMM exist on UD: any other opcode is refused with
    /// [`Error::Unsupported`] (nothing of it written); an `ah_num` of 0 or
    /// a QP number wider than 24 bits is [`Error::InvalidAttribute`] /
    /// [`Error::InvalidQpn`].
    ///
    /// # Safety
    /// As [`RxeSendQueue::post`].
    pub unsafe fn post_ud(
        &mut self,
        wrs: &[SendWr<'_>],
        dest: &RxeUdDest,
    ) -> core::result::Result<Posted, PostError> {
        if dest.ah_num == 0 || dest.remote_qpn >> 24 != 0 {
            let error = if dest.ah_num == 0 {
                Error::InvalidAttribute
            } else {
                Error::InvalidQpn
            };
            return Err(PostError { index: 0, error });
        }
        // SAFETY: forwarded contract.
        let (count, failed) = unsafe { self.write(wrs, Some(dest)) };
        self.publish();
        match failed {
            None => Ok(Posted {
                count,
                doorbell: self.take_doorbell(),
            }),
            Some(e) => Err(e),
        }
    }

    /// Writes `wrs` into the ring as [`RxeSendQueue::post`] does and
    /// stops at the same WR, but publishes nothing: the kernel sees them
    /// at the next [`RxeSendQueue::publish`] (or `post`), all at once, so
    /// a batch built of several calls costs one producer store and one
    /// doorbell (docs/spec/rxe.md §2, §6). Returns how many were written.
    ///
    /// # Safety
    /// As [`RxeSendQueue::post`].
    pub unsafe fn post_deferred(
        &mut self,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<usize, PostError> {
        // SAFETY: forwarded contract.
        match unsafe { self.write(wrs, None) } {
            (n, None) => Ok(n),
            (_, Some(e)) => Err(e),
        }
    }

    /// Publishes every deferred WQE with one release store of the producer
    /// index; the doorbell is then owed ([`RxeSendQueue::take_doorbell`]).
    /// Returns how many were published (0: nothing was deferred, nothing
    /// stored).
    pub fn publish(&mut self) -> u32 {
        let n = self.deferred();
        if n != 0 {
            // Release: the WQE stores (`write`) happen before the kernel
            // sees the new index (it acquire-loads it, docs/spec/rxe.md §2).
            self.q.producer().store(self.written, Ordering::Release);
            self.prod = self.written;
            self.doorbell_owed = true;
        }
        n
    }

    /// Writes `wrs` from `written` on (with `ud`, as UD sends there),
    /// stopping at the first refused WR; returns how many were written and
    /// the refusal.
    ///
    /// # Safety
    /// As [`RxeSendQueue::post`].
    #[inline(always)]
    unsafe fn write(
        &mut self,
        wrs: &[SendWr<'_>],
        ud: Option<&RxeUdDest>,
    ) -> (usize, Option<PostError>) {
        let mask = self.q.mask;
        let mut prod = self.written;
        let mut cons = self.kernel_consumer();
        let mut count = 0usize;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            let checked = match ud {
                Some(_) if !matches!(wr.op, SendOp::Send | SendOp::SendImm { .. }) => {
                    // RDMA, atomics and the rest do not exist on UD.
                    Err(Error::Unsupported)
                }
                _ => self.check(wr),
            };
            if let Err(error) = checked {
                failed = Some(PostError { index, error });
                break;
            }
            let next = prod.wrapping_add(1) & mask;
            if next == cons {
                // Looks full: the kernel may have completed more since.
                cons = self.kernel_consumer();
                if next == cons {
                    failed = Some(PostError {
                        index,
                        error: Error::SqFull,
                    });
                    break;
                }
            }
            // SAFETY: slot `prod` lies in the mapping (masked in
            // `slot_ptr`); the space check shows the kernel's consumer
            // index has passed it, so the kernel no longer uses it (a slot
            // between `self.prod` and `written` is unpublished, so the
            // kernel never reads it); the WR is valid for this queue's
            // element size (constructor and `check`); the SGE contract is
            // forwarded.
            unsafe { self.write_wqe(self.q.slot_ptr(prod), wr, ud) };
            prod = next;
            count += 1;
        }
        self.written = prod;
        self.filled = self.filled.saturating_add(count as u32).min(self.q.slots());
        (count, failed)
    }

    /// Writes one validated WR at `slot` (docs/spec/rxe.md §3): the whole
    /// 208-byte header (clearing the kernel's scratch from the slot's last
    /// use), then the SGEs or the inline payload at offset 208. With `ud`
    /// the union is the UD member (docs/spec/rxe.md §8).
    ///
    /// # Safety
    /// `slot` is an element of this queue that the kernel no longer uses;
    /// `wr` passed [`RxeSendQueue::check`].
    #[inline(always)]
    unsafe fn write_wqe(&self, slot: *mut u8, wr: &SendWr<'_>, ud: Option<&RxeUdDest>) {
        let mut w = RxeSendWqe::ZERO;
        w.wr.wr_id = wr.wr_id;
        let (opcode, ex) = match wr.op {
            SendOp::Send | SendOp::Nop => (wr_opcode::SEND, 0),
            // Immediate data goes in big-endian, as `ibv_send_wr` carries it.
            SendOp::SendImm { imm } => (wr_opcode::SEND_WITH_IMM, imm.to_be()),
            SendOp::SendInv { rkey } => (wr_opcode::SEND_WITH_INV, rkey),
            SendOp::Write { .. } => (wr_opcode::RDMA_WRITE, 0),
            SendOp::WriteImm { imm, .. } => (wr_opcode::RDMA_WRITE_WITH_IMM, imm.to_be()),
            SendOp::Read { .. } => (wr_opcode::RDMA_READ, 0),
            SendOp::CompareSwap { .. } => (wr_opcode::ATOMIC_CMP_AND_SWP, 0),
            SendOp::FetchAdd { .. } => (wr_opcode::ATOMIC_FETCH_AND_ADD, 0),
            SendOp::BindMw(_) => (wr_opcode::BIND_MW, 0),
            // The kernel takes the key to invalidate from `ex`.
            SendOp::LocalInv { rkey } => (wr_opcode::LOCAL_INV, rkey),
        };
        w.wr.opcode = opcode;
        w.wr.ex = ex;
        // Start from the zeroed union and assign one member: building the
        // union from a smaller member would leave the rest uninitialised.
        match wr.op {
            SendOp::Write { remote }
            | SendOp::WriteImm { remote, .. }
            | SendOp::Read { remote } => {
                w.wr.wr.rdma = RxeRdmaWr {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                    reserved: 0,
                };
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                w.wr.wr.atomic = RxeAtomicWr {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey,
                    reserved: 0,
                };
            }
            SendOp::FetchAdd { remote, add } => {
                w.wr.wr.atomic = RxeAtomicWr {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey,
                    reserved: 0,
                };
            }
            SendOp::BindMw(b) => {
                w.wr.wr.mw = RxeMwWr {
                    addr: b.addr,
                    length: b.len,
                    mr_lkey: b.mr_lkey,
                    mw_rkey: b.mw_rkey,
                    rkey: b.new_rkey,
                    access: b.access,
                };
            }
            _ => {}
        }
        if let Some(d) = ud {
            w.wr.wr.ud = RxeUdWr {
                remote_qpn: d.remote_qpn,
                remote_qkey: d.qkey,
                pkey_index: 0,
                reserved: 0,
                ah_num: d.ah_num,
                pad: [0; 4],
                av: [0; 88],
            };
        }
        // The kernel takes the remote address of RDMA and atomics from
        // `iova` (docs/spec/rxe.md §3).
        w.iova = wr.op.remote().map_or(0, |r| r.addr);
        let mut flags =
            wr.flags.0 & (send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED);
        // SAFETY: the payload area starts at offset 208 of the slot, and
        // the element holds 208 + the largest payload `caps` allows
        // (constructor), which `check` enforced.
        let payload = unsafe { slot.add(SEND_PAYLOAD_OFFSET) };
        match wr.payload {
            Payload::Sges(sges) => {
                let mut len = 0u32;
                for s in sges {
                    // Validated: the sum is at most 2^31.
                    len = len.wrapping_add(s.length);
                }
                let n = sges.len() as u32;
                w.wr.reserved = n;
                w.dma.length = len;
                w.dma.resid = len;
                w.dma.num_sge = n;
                w.wr.send_flags = flags;
                // SAFETY: `slot` is 8-aligned (8-aligned mapping, 384-byte
                // header, power-of-two elements >= 208) and the header fits
                // in the element; the SGEs fit after it (see above) and
                // `Sge` is `struct rxe_sge`. The caller's slice cannot
                // overlap the mapping we own.
                unsafe {
                    slot.cast::<RxeSendWqe>().write(w);
                    ptr::copy_nonoverlapping(sges.as_ptr(), payload.cast::<Sge>(), sges.len());
                }
            }
            Payload::Inline(pieces) => {
                flags |= send_flags::INLINE;
                let mut off = 0usize;
                for p in pieces {
                    // SAFETY: the pieces add up to at most max_inline_data
                    // bytes (validated), which fit after the header; the
                    // caller's slices cannot overlap the mapping.
                    unsafe { ptr::copy_nonoverlapping(p.as_ptr(), payload.add(off), p.len()) };
                    off += p.len();
                }
                let len = off as u32;
                w.dma.length = len;
                w.dma.resid = len;
                w.wr.send_flags = flags;
                // SAFETY: as for the SGE case.
                unsafe { slot.cast::<RxeSendWqe>().write(w) };
            }
        }
    }

    /// Decodes the WQE in `slot` (masked) back into what was posted:
    /// opcode, first local buffer, total length, remote address and key
    /// (docs/spec/rxe.md §3). It reads only fields the kernel never writes
    /// (`wr`, `dma.length`, `dma.num_sge`, the SGEs), so it is exact for a
    /// completed WQE until the slot is reused; a damaged slot yields
    /// garbage values, never an out-of-bounds read. `status` and
    /// `vendor_err` are left for the caller ([`RxeSendQueue::failed_wr`]).
    #[cold]
    pub fn describe(&self, slot: u32) -> FailedWr {
        let p = self.q.slot_ptr(slot);
        // SAFETY: every offset below is inside the element (>= 208 bytes,
        // plus one SGE when one is read) and aligned for its type.
        let (wr_id, opcode, flags, raddr, rdma_rkey, atomic_rkey, length, num_sge) = unsafe {
            (
                read_at::<u64>(p, 0),
                read_at::<u32>(p, 12),
                read_at::<u32>(p, 16),
                read_at::<u64>(p, 24),
                read_at::<u32>(p, 32),
                read_at::<u32>(p, 48),
                read_at::<u32>(p, 184),
                read_at::<u32>(p, 196),
            )
        };
        let mut f = FailedWr {
            wr_id,
            length,
            ..FailedWr::default()
        };
        f.opcode = match opcode {
            wr_opcode::RDMA_WRITE | wr_opcode::RDMA_WRITE_WITH_IMM => WcOpcode::RDMA_WRITE,
            wr_opcode::RDMA_READ => WcOpcode::RDMA_READ,
            wr_opcode::ATOMIC_CMP_AND_SWP => WcOpcode::COMP_SWAP,
            wr_opcode::ATOMIC_FETCH_AND_ADD => WcOpcode::FETCH_ADD,
            wr_opcode::BIND_MW => WcOpcode::BIND_MW,
            wr_opcode::LOCAL_INV => WcOpcode::LOCAL_INV,
            _ => WcOpcode::SEND,
        };
        match opcode {
            wr_opcode::RDMA_WRITE | wr_opcode::RDMA_WRITE_WITH_IMM | wr_opcode::RDMA_READ => {
                f.remote_addr = raddr;
                f.rkey = rdma_rkey;
            }
            wr_opcode::ATOMIC_CMP_AND_SWP | wr_opcode::ATOMIC_FETCH_AND_ADD => {
                f.remote_addr = raddr;
                f.rkey = atomic_rkey;
            }
            _ => {}
        }
        if flags & send_flags::INLINE != 0 {
            f.inline = true;
        } else if num_sge != 0 && self.q.elem_size() >= SEND_PAYLOAD_OFFSET + SGE_SIZE {
            // SAFETY: one SGE at offset 208 fits in the element (tested).
            let s = unsafe { read_at::<Sge>(p, SEND_PAYLOAD_OFFSET) };
            f.local_addr = s.addr;
            f.lkey = s.lkey;
        }
        f
    }

    /// [`RxeSendQueue::describe`] with the completion's status, raw vendor
    /// error and wr_id filled in: the structured report of a failed WR.
    #[cold]
    pub fn failed_wr(&self, slot: u32, wc: &Wc) -> FailedWr {
        FailedWr {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
            ..self.describe(slot)
        }
    }

    /// The slot of the most recently completed WQE with `wr_id` that is
    /// still intact in the ring (completed WQEs stay until their slot is
    /// reused), for [`RxeSendQueue::describe`]. The kernel passes a WQE
    /// with the consumer index just before it writes its CQE (docs/spec/rxe.md §2), so
    /// calling this when polling an error completion, before posting more,
    /// finds the failed WQE if wr_ids are unique.
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
