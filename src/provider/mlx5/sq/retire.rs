//! In-order retirement of completed WQEs and the record of the first
//! failed WR.

use super::{Retired, SendQueue, WrSlot};
use crate::provider::mlx5::layout::{opcode, CtrlSeg, DataSeg, RaddrSeg, INLINE_SEG};

/// The retirement state of a [`SendQueue`] held in locals across a run of
/// completions, from [`SendQueue::retire_cursor`]; written back with
/// [`SendQueue::commit_retire`]. Nothing else may change the queue's
/// counters while it is held.
#[derive(Clone, Copy)]
pub(crate) struct RetireCursor {
    wrid: *const WrSlot,
    mask: u32,
    /// The queue's producer counter (fixed during the run).
    pi: u32,
    /// Everything before this BB counter has completed.
    pub(crate) retired: u32,
}

impl RetireCursor {
    /// [`SendQueue::retire`] on the cursor.
    #[inline(always)]
    pub(crate) fn retire(&mut self, wqe_counter: u16) -> Option<Retired> {
        let retired = self.retired;
        let dist = (wqe_counter as u32).wrapping_sub(retired) & 0xffff;
        if dist >= self.pi.wrapping_sub(retired) {
            return None;
        }
        let start = retired.wrapping_add(dist);
        // SAFETY: the cursor came from a queue whose side table has
        // wrid_len > mask entries (constructor); the index is masked.
        let slot = unsafe { self.wrid.add((start & self.mask) as usize).read() };
        if slot.start != wqe_counter || slot.flags & WrSlot::VALID == 0 {
            return None;
        }
        self.retired = slot.end;
        Some(Retired {
            wr_id: slot.wr_id,
            opcode: slot.opcode,
            user_signaled: slot.flags & WrSlot::USER_SIGNALED != 0,
            start,
        })
    }

    /// [`RetireCursor::retire`] for a WQE that also asked for a completion:
    /// `None` (and nothing changed) for an unsignaled one too, which the
    /// one-entry fast poll leaves to the general path. The slot's start,
    /// opcode and flags bytes are compared as one word against the
    /// counter and the two flags (one load, one masked compare: 3
    /// instructions fewer than `retire` and a flag test; in the batch
    /// loop, which retires unsignaled WQEs too, the field form of
    /// `retire` compiles shorter).
    #[inline(always)]
    pub(crate) fn retire_signaled(&mut self, wqe_counter: u16) -> Option<Retired> {
        let need = WrSlot::VALID | WrSlot::USER_SIGNALED;
        let retired = self.retired;
        let dist = (wqe_counter as u32).wrapping_sub(retired) & 0xffff;
        if dist >= self.pi.wrapping_sub(retired) {
            return None;
        }
        let start = retired.wrapping_add(dist);
        // SAFETY: the cursor came from a queue whose side table has
        // wrid_len > mask entries (constructor); the index is masked.
        let sp = unsafe { self.wrid.add((start & self.mask) as usize) };
        // SAFETY: `sp` is an 8-aligned 16-byte `WrSlot` (repr(C)): bytes
        // 12..15 are `start`, `opcode` and `flags`, read as one aligned
        // word; `end` and `wr_id` at offsets 8 and 0.
        let (hi, end, wr_id) = unsafe {
            let b = sp.cast::<u8>();
            (
                b.add(12).cast::<u32>().read(),
                b.add(8).cast::<u32>().read(),
                b.cast::<u64>().read(),
            )
        };
        let c = wqe_counter.to_ne_bytes();
        let want = u32::from_ne_bytes([c[0], c[1], 0, need]);
        let mask = u32::from_ne_bytes([0xff, 0xff, 0, need]);
        if (hi ^ want) & mask != 0 {
            return None;
        }
        let [_, _, opcode, flags] = hi.to_ne_bytes();
        self.retired = end;
        Some(Retired {
            wr_id,
            opcode,
            user_signaled: flags & WrSlot::USER_SIGNALED != 0,
            start,
        })
    }
}

const _: () = {
    assert!(core::mem::offset_of!(WrSlot, wr_id) == 0);
    assert!(core::mem::offset_of!(WrSlot, end) == 8);
    assert!(core::mem::offset_of!(WrSlot, start) == 12);
    assert!(core::mem::offset_of!(WrSlot, opcode) == 14);
    assert!(core::mem::offset_of!(WrSlot, flags) == 15);
};

impl SendQueue {
    /// The first WR that failed (not counting flushes) since the queue was
    /// created or reset, as it was posted.
    pub fn failure(&self) -> Option<crate::wr::FailedWr> {
        self.failure
    }

    /// Decodes the WQE at BB `start` (still in the ring) into the fields
    /// of a [`crate::wr::FailedWr`] (docs/spec/mlx5.md §3–§5). Everything read is
    /// bounded by the ring mask, so a damaged WQE yields garbage values,
    /// never an out-of-bounds read.
    #[cold]
    pub fn describe(&self, start: u32) -> crate::wr::FailedWr {
        use super::completion::WcOpcode;
        let o = start << 2;
        // SAFETY: octoword o is inside the ring (masked in `octo`).
        let ctrl = unsafe { self.octo(o).cast::<CtrlSeg>().read() };
        let ds = ctrl.qpn_ds.get() & 0x3f;
        let op = (ctrl.opmod_idx_opcode.get() & 0xff) as u8;
        let mut w = crate::wr::FailedWr {
            opcode: match op {
                opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => WcOpcode::RDMA_WRITE,
                opcode::RDMA_READ => WcOpcode::RDMA_READ,
                opcode::ATOMIC_CS => WcOpcode::COMP_SWAP,
                opcode::ATOMIC_FA => WcOpcode::FETCH_ADD,
                _ => WcOpcode::SEND,
            },
            ..Default::default()
        };
        let mut seg = 1u32;
        if matches!(
            op,
            opcode::RDMA_WRITE
                | opcode::RDMA_WRITE_IMM
                | opcode::RDMA_READ
                | opcode::ATOMIC_CS
                | opcode::ATOMIC_FA
        ) {
            // SAFETY: inside the ring (masked) and 16-aligned.
            let r = unsafe { self.octo(o.wrapping_add(1)).cast::<RaddrSeg>().read() };
            w.remote_addr = r.raddr.get();
            w.rkey = r.rkey.get();
            seg = 2;
            if matches!(op, opcode::ATOMIC_CS | opcode::ATOMIC_FA) {
                seg = 3;
            }
        }
        let mut first = true;
        while seg < ds {
            // SAFETY: inside the ring (masked) and 16-aligned; a data
            // segment and an inline header share their first word.
            let d = unsafe { self.octo(o.wrapping_add(seg)).cast::<DataSeg>().read() };
            let bc = d.byte_count.get();
            if bc & INLINE_SEG != 0 {
                w.inline = true;
                w.length = bc & !INLINE_SEG;
                break;
            }
            if first {
                w.local_addr = d.addr.get();
                w.lkey = d.lkey.get();
                first = false;
            }
            w.length = w.length.wrapping_add(bc);
            seg += 1;
        }
        w
    }

    /// Records the failure of the WQE at BB `start` (the first one only;
    /// flushes are not failures).
    #[cold]
    pub(crate) fn record_failure(&mut self, start: u32, wc: &super::completion::Wc) {
        if self.failure.is_some() || wc.status == super::completion::WcStatus::WR_FLUSH_ERR {
            return;
        }
        let mut f = self.describe(start);
        f.wr_id = wc.wr_id;
        f.status = wc.status;
        f.vendor_err = wc.vendor_err;
        f.syndrome = wc.syndrome;
        self.failure = Some(f);
    }

    /// Retires the WQE whose first BB has 16-bit index `wqe_counter` and
    /// everything before it. Returns `None` (and changes nothing) if the
    /// counter does not name an outstanding WQE, so a corrupt CQE can never
    /// retire the wrong work or index out of bounds.
    #[inline(always)]
    pub fn retire(&mut self, wqe_counter: u16) -> Option<Retired> {
        let mut c = self.retire_cursor();
        let r = c.retire(wqe_counter)?;
        self.commit_retire(&c);
        Some(r)
    }

    /// The retirement state, copied into locals for a run of completions
    /// (the poller keeps it in registers and writes it back once).
    #[inline(always)]
    pub(crate) fn retire_cursor(&self) -> RetireCursor {
        RetireCursor {
            wrid: self.wrid.as_ptr(),
            mask: self.mask,
            pi: self.pi,
            retired: self.retired,
        }
    }

    /// Writes a retirement cursor back.
    #[inline(always)]
    pub(crate) fn commit_retire(&mut self, c: &RetireCursor) {
        self.retired = c.retired;
    }

    /// Reads back the data segments of the WQE starting at BB `start`,
    /// skipping `skip` header octowords, for scatter-to-CQE copies. Calls
    /// `f(addr, len)` for each, in order; at most `max` segments.
    pub(crate) fn for_each_data_seg(&self, start: u32, mut f: impl FnMut(u64, u32) -> bool) {
        let o = start << 2;
        // SAFETY: octoword o is the WQE's control segment, inside the ring.
        let ctrl = unsafe { self.octo(o).cast::<CtrlSeg>().read() };
        let ds = ctrl.qpn_ds.get() & 0x3f;
        let op = (ctrl.opmod_idx_opcode.get() & 0xff) as u8;
        let hdr = match op {
            opcode::RDMA_READ => 2,
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => 3,
            _ => return,
        };
        for i in hdr..ds {
            // SAFETY: inside the ring (masked) and 16-aligned.
            let d = unsafe { self.octo(o.wrapping_add(i)).cast::<DataSeg>().read() };
            if !f(d.addr.get(), d.byte_count.get()) {
                break;
            }
        }
    }
}
