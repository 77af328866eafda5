//! The per-WR plan and the segment writer: validating a WR, working out
//! its WQE and writing it into the ring and the side table.

use super::{by_shape, byte3, SendQueue, WrSlot};
use crate::error::{Error, Result};
use crate::provider::mlx5::layout::{ctrl_flags, opcode, Be32, INLINE_SEG, SEND_WQE_BB};
use crate::wr::{Payload, QpCaps, SendOp, SendWr};

/// A validated WR's WQE: what [`SendQueue::emit`] writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(super) mlx_op: u8,
    pub(super) hdr_ds: u32,
    pub(super) imm: u32,
    /// DS (octowords).
    pub(crate) ds: u32,
    /// Basic blocks.
    pub(crate) nbb: u32,
    /// `fm_ce_se` as the native value of control-segment bytes 8..11
    /// (the byte in the last position).
    pub(super) fm_word: u32,
    /// The side-table flags as the native value of slot bytes 12..15
    /// (the byte in the last position).
    pub(super) slot_word: u32,
    /// A completion was asked for.
    pub(crate) user_sig: bool,
    pub(super) shape: crate::wr::SendShape,
}

/// What writing one WQE produced, for its doorbell.
#[derive(Clone, Copy)]
pub(super) struct Written {
    /// First BB.
    pub(super) start: u32,
    /// First 8 bytes (the 8-byte doorbell value; DS in the last byte).
    pub(super) ctrl8: u64,
    /// The WQE requests a CQE.
    pub(super) sig: bool,
    /// The payload is inline (for [`BfPolicy::SingleInlineWqe`]).
    pub(super) inline: bool,
}

/// The producer state of a run of posts, held in locals (registers) and
/// written back to the queue once.
#[derive(Clone, Copy)]
pub(super) struct Cursor {
    buf: *mut u8,
    wrid: *mut WrSlot,
    mask: u32,
    /// Free-running BB producer counter.
    pi: u32,
    /// `retired + limit`: the producer counter may not pass it.
    pi_max: u32,
    /// Producer counter after the last WQE that requests a CQE.
    last_signaled_end: u32,
    /// A copy of the capabilities, so the compiler sees that they do not
    /// change during the run (the SGE-count test leaves the loop).
    caps: QpCaps,
}

/// Two 32-bit words, already in their in-memory (wire) representation, as
/// the native 64-bit value with the same memory image (`a` first).
#[inline(always)]
const fn pack2(a_raw: u32, b_raw: u32) -> u64 {
    #[cfg(target_endian = "little")]
    {
        a_raw as u64 | (b_raw as u64) << 32
    }
    #[cfg(target_endian = "big")]
    {
        (a_raw as u64) << 32 | b_raw as u64
    }
}

impl SendQueue {
    /// Why a WQE of `nbb` BBs cannot be posted (cold: only on refusal).
    #[cold]
    fn refusal(&self) -> Error {
        if self.ud && self.state.can_send() {
            // A UD queue takes only `post_ud`: this WR has no address
            // handle.
            Error::InvalidAttribute
        } else if self.state.can_send() {
            Error::SqFull
        } else {
            Error::InvalidQpState
        }
    }

    /// Formats one send WQE at the producer position without ringing the
    /// doorbell. Call [`SendQueue::ring`] after one or more posts.
    ///
    /// On error nothing is written and the queue is unchanged. A UD queue
    /// ([`SendQueue::from_raw_ud`]) refuses every WR here (and in batches
    /// and lists) with [`Error::InvalidAttribute`]: a UD WR needs an
    /// address handle, [`SendQueue::post_ud`].
    ///
    /// # Safety
    /// Every SGE must describe memory the device may access as the
    /// operation requires until the WR completes (see
    /// [`SendQueue::from_raw`]).
    #[inline(always)]
    pub unsafe fn post(&mut self, wr: &SendWr<'_>) -> Result<()> {
        let mut c = self.cursor();
        // SAFETY: forwarded contract.
        let w = unsafe { self.write::<true>(&mut c, wr) }?;
        self.store_cursor(&c);
        // The rest of the doorbell's inputs (the control bytes, whether the
        // last WQE is signaled) are read back when it rings.
        self.batch += 1;
        self.last_start = w.start;
        self.last_inline = w.inline;
        Ok(())
    }

    /// The producer state for a run of posts, copied into locals.
    #[inline(always)]
    pub(super) fn cursor(&self) -> Cursor {
        Cursor {
            buf: self.buf.as_ptr(),
            wrid: self.wrid.as_ptr(),
            mask: self.mask,
            pi: self.pi,
            pi_max: self.retired.wrapping_add(self.limit),
            last_signaled_end: self.last_signaled_end,
            caps: self.caps,
        }
    }

    /// Writes a cursor's counters back.
    #[inline(always)]
    pub(super) fn store_cursor(&mut self, c: &Cursor) {
        self.pi = c.pi;
        self.last_signaled_end = c.last_signaled_end;
    }

    /// Formats one WQE at the cursor and advances it (producer counter and
    /// the end of the last signaled WQE); the queue itself and the doorbell
    /// bookkeeping are left to the caller.
    ///
    /// # Safety
    /// As for [`SendQueue::post`]; `c` is this queue's cursor.
    ///
    /// `SLOT_FIRST` writes the side-table entry before the WQE: fewer
    /// registers spilled across the segment stores when one WR is posted
    /// alone (the C per-opcode calls: 4 instructions fewer), but more in
    /// the unrolled loop of a batch (8 more per WR), which passes `false`.
    #[inline(always)]
    pub(super) unsafe fn write<const SLOT_FIRST: bool>(
        &self,
        c: &mut Cursor,
        wr: &SendWr<'_>,
    ) -> Result<Written> {
        // SAFETY: forwarded contract.
        by_shape!(wr, unsafe { self.write_shaped::<SLOT_FIRST>(c, wr) })
    }

    /// [`SendQueue::write`] for one shape (see [`by_shape`]).
    ///
    /// # Safety
    /// As for [`SendQueue::write`].
    #[inline(always)]
    unsafe fn write_shaped<const SLOT_FIRST: bool>(
        &self,
        c: &mut Cursor,
        wr: &SendWr<'_>,
    ) -> Result<Written> {
        let plan = self.plan_with(wr, &c.caps)?;
        let pi = c.pi;
        let end = pi.wrapping_add(plan.nbb);
        // `pi - retired` is at most wqe_cnt (2^15) and `limit` is 0 or
        // wqe_cnt, so the distance fits an i32: one signed compare is the
        // space check and the state check.
        if (c.pi_max.wrapping_sub(end) as i32) < 0 {
            return Err(self.refusal());
        }
        // SAFETY: `pi & mask` < wqe_cnt <= wrid_len (constructor); the slot
        // is a 16-byte, 8-aligned WrSlot owned by this queue.
        let slot = unsafe { c.wrid.add((pi & c.mask) as usize) };
        if SLOT_FIRST {
            // SAFETY: as above.
            unsafe { self.set_slot(slot, wr.wr_id, &plan, pi) };
        }
        // SAFETY: `pi & mask` < wqe_cnt, so the first BB is inside the ring;
        // the BBs from `pi` are free (space check); forwarded contract on
        // the SGEs.
        let ctrl8 = unsafe {
            let base = c.buf.add(((pi & c.mask) as usize) << 6);
            self.emit_at(wr, &plan, pi, base)
        };
        if !SLOT_FIRST {
            // SAFETY: as above.
            unsafe { self.set_slot(slot, wr.wr_id, &plan, pi) };
        }
        // The entries of the WQE's other BBs must not look like WQE starts
        // (stale entries from before a reset, or 65536 BBs ago, would let a
        // corrupt counter retire the wrong work).
        for k in 1..plan.nbb {
            // SAFETY: masked index < wqe_cnt <= wrid_len; the BB is free.
            unsafe {
                c.wrid
                    .add((pi.wrapping_add(k) & c.mask) as usize)
                    .write(WrSlot::default())
            };
        }
        c.pi = end;
        if plan.user_sig {
            c.last_signaled_end = end;
        }
        Ok(Written {
            start: pi,
            ctrl8,
            sig: plan.user_sig,
            inline: plan.shape.inline,
        })
    }

    /// Validates a WR and works out its WQE: opcode, size, flags.
    #[inline(always)]
    pub(crate) fn plan(&self, wr: &SendWr<'_>) -> Result<Plan> {
        self.plan_with(wr, &self.caps)
    }

    /// [`SendQueue::plan`] against `caps` (this queue's, or a copy).
    #[inline(always)]
    fn plan_with(&self, wr: &SendWr<'_>, caps: &QpCaps) -> Result<Plan> {
        Self::plan_for(wr, caps, &self.flag_words)
    }

    /// Validates a WR against `caps` and works out its WQE, with the
    /// flag table `flag_words` (a queue's [`SendQueue::flag_words`]): every
    /// rule a post applies before it looks at ring space and QP state.
    /// Needs no queue, so [`SendQueue::check`] runs exactly this code.
    #[inline(always)]
    pub(super) fn plan_for(
        wr: &SendWr<'_>,
        caps: &QpCaps,
        flag_words: &[[u32; 2]; 16],
    ) -> Result<Plan> {
        let shape = crate::wr::validate_send(wr, caps)?;
        let (mlx_op, hdr_ds, imm) = match wr.op {
            SendOp::Send => (opcode::SEND, 1, 0),
            SendOp::SendImm { imm } => (opcode::SEND_IMM, 1, imm),
            SendOp::SendInv { rkey } => (opcode::SEND_INVAL, 1, rkey),
            SendOp::Write { .. } => (opcode::RDMA_WRITE, 2, 0),
            SendOp::WriteImm { imm, .. } => (opcode::RDMA_WRITE_IMM, 2, imm),
            SendOp::Read { .. } => (opcode::RDMA_READ, 2, 0),
            SendOp::CompareSwap { .. } => (opcode::ATOMIC_CS, 3, 0),
            SendOp::FetchAdd { .. } => (opcode::ATOMIC_FA, 3, 0),
            SendOp::Nop => (opcode::NOP, 1, 0),
            // Memory windows need UMR WQEs, which this encoder does not
            // write.
            SendOp::BindMw(_) | SendOp::LocalInv { .. } => return Err(Error::Unsupported),
        };
        let data_ds = if shape.inline {
            if shape.inline_len == 0 {
                0
            } else {
                (4 + shape.inline_len).div_ceil(16)
            }
        } else {
            shape.data_sges
        };
        // Capabilities bound DS by MAX_DS (checked at construction).
        let ds = hdr_ds + data_ds;
        let [fm_word, slot_word] = flag_words[(wr.flags.0 & 0xf) as usize];
        Ok(Plan {
            mlx_op,
            hdr_ds,
            imm,
            ds,
            nbb: (ds + 3) >> 2,
            fm_word,
            slot_word,
            user_sig: fm_word & byte3(ctrl_flags::CQ_UPDATE) != 0,
            shape,
        })
    }

    /// Writes the planned WQE at BB `pi`; returns its first 8 bytes.
    ///
    /// # Safety
    /// BBs `pi..pi+plan.nbb` must be owned by the caller (free, not being
    /// read by the device); the SGE contract of [`SendQueue::post`].
    #[inline(always)]
    pub(crate) unsafe fn emit(&self, wr: &SendWr<'_>, plan: &Plan, pi: u32) -> u64 {
        // SAFETY: (pi & mask) < wqe_cnt: the WQE's first BB is inside the
        // ring; the caller's contract covers the rest.
        unsafe {
            let base = self.buf.as_ptr().add(((pi & self.mask) as usize) << 6);
            self.emit_at(wr, plan, pi, base)
        }
    }

    /// [`SendQueue::emit`] with the first BB's address `base` computed by
    /// the caller.
    ///
    /// # Safety
    /// As for [`SendQueue::emit`]; `base` is BB `pi & mask` of the ring.
    #[inline(always)]
    unsafe fn emit_at(&self, wr: &SendWr<'_>, plan: &Plan, pi: u32, base: *mut u8) -> u64 {
        let ctrl8 = pack2(
            ((pi & 0xffff) << 8 | plan.mlx_op as u32).to_be(),
            self.qpn_raw | plan.ds.to_be(),
        );
        // SAFETY: the WQE's first BB is at `base`; its octowords 0..4
        // (every header segment: hdr_ds <= 3) are at fixed offsets from it.
        // Data segments past the first BB are masked into the ring by
        // `write_wqe`.
        unsafe { self.write_wqe(wr, plan, ctrl8, base, pi << 2) };
        ctrl8
    }

    /// Fills a side-table entry for the WQE at BB `pi`.
    ///
    /// # Safety
    /// `slot` must point to a writable, 8-aligned [`WrSlot`] that nobody
    /// else accesses now.
    #[inline(always)]
    pub(crate) unsafe fn set_slot(&self, slot: *mut WrSlot, wr_id: u64, plan: &Plan, pi: u32) {
        let p = slot.cast::<u64>();
        // `start`, `opcode` and `flags` as one native word.
        let hi = u32::from_ne_bytes({
            let s = (pi as u16).to_ne_bytes();
            [s[0], s[1], plan.mlx_op, 0]
        }) | plan.slot_word;
        // SAFETY: caller contract; an aligned 8-byte store and two aligned
        // 4-byte stores (offsets 8 and 12 of the 8-aligned slot).
        unsafe {
            p.write(wr_id);
            let m = p.add(1).cast::<u32>();
            m.write(pi.wrapping_add(plan.nbb));
            m.add(1).write(hi);
        }
    }

    /// Writes the segments of a validated WR whose first BB is at `base`
    /// (octoword `o` of the ring, unmasked).
    ///
    /// Header segments (at most 3 octowords) always lie in the first BB,
    /// so they are stored at fixed offsets from `base`; a data segment in a
    /// later BB may wrap at the ring end, so its address is masked.
    ///
    /// # Safety
    /// `base` must be the 64-aligned first BB of the WQE inside the ring,
    /// and the WQE's BBs must be free.
    #[inline(always)]
    unsafe fn write_wqe(&self, wr: &SendWr<'_>, plan: &Plan, ctrl8: u64, base: *mut u8, o: u32) {
        // SAFETY: `base + 16 * i` for i < 4 is inside the first BB, and
        // `octo` masks every later octoword into the ring; all belong to
        // the caller. Every store is an aligned 8-byte store.
        unsafe {
            let c = base.cast::<u64>();
            c.write(ctrl8);
            c.add(1).write(pack2(plan.fm_word, plan.imm.to_be()));
            if let Some(remote) = wr.op.remote() {
                let r = base.add(16).cast::<u64>();
                r.write(remote.addr.to_be());
                r.add(1).write(pack2(remote.rkey.to_be(), 0));
            }
            match wr.op {
                SendOp::CompareSwap { compare, swap, .. } => {
                    let a = base.add(32).cast::<u64>();
                    a.write(swap.to_be());
                    a.add(1).write(compare.to_be());
                }
                // Only swap_add is written; `compare` is left as it was
                // (libmlx5 does the same, docs/spec/mlx5.md §3).
                SendOp::FetchAdd { add, .. } => base.add(32).cast::<u64>().write(add.to_be()),
                _ => {}
            }
            let at = |k: u32| {
                if k < 4 {
                    base.add(k as usize * 16)
                } else {
                    self.octo(o.wrapping_add(k))
                }
            };
            let mut k = plan.hdr_ds;
            match wr.payload {
                Payload::Sges(sges) => {
                    if wr.op.is_atomic() {
                        // Validation guarantees exactly one 8-byte SGE.
                        let s = &sges[0];
                        let d = at(k).cast::<u64>();
                        d.write(pack2(8u32.to_be(), s.lkey.to_be()));
                        d.add(1).write(s.addr.to_be());
                    } else {
                        for s in sges {
                            if s.length != 0 {
                                let d = at(k).cast::<u64>();
                                d.write(pack2(s.length.to_be(), s.lkey.to_be()));
                                d.add(1).write(s.addr.to_be());
                                k += 1;
                            }
                        }
                    }
                }
                Payload::Inline(pieces) => {
                    if plan.shape.inline_len != 0 {
                        self.write_inline(at(k), plan.shape.inline_len, pieces);
                    }
                }
            }
        }
    }

    /// Writes an inline segment (header + payload) starting at `hdr`; the
    /// payload may wrap at the ring end at any byte (docs/spec/mlx5.md §2). Padding after
    /// the payload is not written.
    #[inline]
    pub(super) fn write_inline(&self, hdr: *mut u8, len: u32, pieces: &[&[u8]]) {
        let ring_bytes = (self.wqe_cnt * SEND_WQE_BB) as usize;
        // SAFETY: the header is 4 bytes at a 16-aligned offset in the ring.
        unsafe { hdr.cast::<Be32>().write(Be32::new(len | INLINE_SEG)) };
        let mut off = hdr as usize - self.buf.as_ptr() as usize + 4;
        for p in pieces {
            let mut src: &[u8] = p;
            while !src.is_empty() {
                if off == ring_bytes {
                    off = 0;
                }
                let n = core::cmp::min(src.len(), ring_bytes - off);
                // SAFETY: [off, off+n) lies in the ring; `src` is a caller
                // slice, which cannot overlap the ring (the ring is never
                // handed out as a slice).
                unsafe {
                    core::ptr::copy_nonoverlapping(src.as_ptr(), self.buf.as_ptr().add(off), n)
                };
                off += n;
                src = &src[n..];
            }
        }
    }
}
