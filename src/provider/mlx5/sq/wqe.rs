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
    /// The WR's FENCE, SIGNALED and SOLICITED bits (and INLINE, ignored):
    /// the row of the queue's [`SendQueue::flag_words`] that gives the
    /// control-segment and side-table flag words. The row is read where
    /// each word is stored ([`SendQueue::fm_word`],
    /// [`SendQueue::slot_word`]), not when the WR is planned, so neither
    /// word occupies a register across the other stores of the WQE.
    pub(super) flag_ix: u8,
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
    /// [`SendQueue::mask16`].
    mask16: u32,
    /// Free-running BB producer counter.
    pi: u32,
    /// `retired + limit`: the producer counter may not pass it.
    pi_max: u32,
    /// A copy of the capabilities, so the compiler sees that they do not
    /// change during the run (the SGE-count test leaves the loop).
    caps: QpCaps,
}

/// Two 32-bit words, already in their in-memory (wire) representation, as
/// the native 64-bit value with the same memory image (`a` first).
#[inline(always)]
pub(super) const fn pack2(a_raw: u32, b_raw: u32) -> u64 {
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
        self.note_signaled(&c, w.sig);
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
            mask16: self.mask16,
            pi: self.pi,
            pi_max: self.retired.wrapping_add(self.limit),
            caps: self.caps,
        }
    }

    /// Writes a cursor's producer counter back.
    #[inline(always)]
    pub(super) fn store_cursor(&mut self, c: &Cursor) {
        self.pi = c.pi;
    }

    /// Records that the WQE just written at the cursor `c` requests a CQE
    /// if `sig`: the end of the last signaled WQE moves to `c`'s producer
    /// counter. A conditional store straight into the queue, not a value
    /// carried in the cursor: the old value is never read, which keeps a
    /// register free across the WQE's stores (and, in a batch, across the
    /// loop), and costs a branch instead of a select.
    #[inline(always)]
    pub(super) fn note_signaled(&mut self, c: &Cursor, sig: bool) {
        if sig {
            self.last_signaled_end = c.pi;
        }
    }

    /// Formats one WQE at the cursor and advances its producer counter;
    /// the queue itself (the end of the last signaled WQE:
    /// [`SendQueue::note_signaled`] with [`Written::sig`]) and the
    /// doorbell bookkeeping are left to the caller.
    ///
    /// `ONE`: the WQE is the cursor's only one (a single post, not a run
    /// of them). It reads the side-table mask from the queue where the
    /// index is masked, an operand of that instruction, instead of the
    /// cursor's copy, which would hold a register across the loads of the
    /// WR (typed post of one WR: 84 -> 81 instructions); a run keeps the
    /// copy in the cursor (reading the queue on every WR of a batch
    /// measured dearer: 67.6 -> 69.4 per WR, docs/benchmarks.md).
    ///
    /// # Safety
    /// As for [`SendQueue::post`]; `c` is this queue's cursor.
    #[inline(always)]
    pub(super) unsafe fn write<const ONE: bool>(
        &self,
        c: &mut Cursor,
        wr: &SendWr<'_>,
    ) -> Result<Written> {
        // SAFETY: forwarded contract.
        by_shape!(wr, unsafe { self.write_shaped::<ONE>(c, wr) })
    }

    /// [`SendQueue::write`] for one shape (see [`by_shape`]).
    ///
    /// # Safety
    /// As for [`SendQueue::write`].
    #[inline(always)]
    unsafe fn write_shaped<const ONE: bool>(
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
        // The side-table entry's byte offset; times 4, the WQE's (an x86
        // index scale, so one register addresses both).
        let mask16 = if ONE { self.mask16 } else { c.mask16 };
        let off16 = (pi << 4 & mask16) as usize;
        // SAFETY: `off16 / 16` = `pi & mask` < wqe_cnt, so the first BB is
        // inside the ring and the 16-byte slot inside the side table
        // (wqe_cnt <= wrid_len, constructor).
        let (base, slot) = unsafe {
            (
                c.buf.add(off16 * 4),
                c.wrid.cast::<u8>().add(off16).cast::<WrSlot>(),
            )
        };
        // The order of the stores decides how many values are live at
        // once, since the compiler keeps every load of the WR (and of the
        // queue) above the first store that follows it in the code: the
        // remote segment first (its two fields die at once), then the data
        // segment (the SGE fields are loaded inside its zero-length test),
        // the side-table entry, and the control segment last (the queue's
        // flag and QP words are loaded there). Single posts and batches
        // both measured best in this order (docs/benchmarks.md).
        // SAFETY: the WQE's BBs from `pi` are free (space check) and the
        // slot is this queue's (above); forwarded contract on the SGEs.
        let ctrl8 = unsafe {
            Self::write_op_segs(wr, base);
            let ds = self.write_payload(wr, &plan, base, pi << 2);
            self.set_slot(slot, wr.wr_id, &plan, pi);
            self.write_ctrl(&plan, ds, pi, base)
        };
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
        let sig = self.user_sig(&plan);
        Ok(Written {
            start: pi,
            ctrl8,
            sig,
            inline: plan.shape.inline,
        })
    }

    /// `fm_ce_se` of a planned WR as the native value of control-segment
    /// bytes 8..11 (the byte in the last position).
    #[inline(always)]
    pub(super) fn fm_word(&self, plan: &Plan) -> u32 {
        self.flag_words[(plan.flag_ix & 0xf) as usize][0]
    }

    /// The side-table flags of a planned WR as the native value of slot
    /// bytes 12..15 (the byte in the last position).
    #[inline(always)]
    pub(super) fn slot_word(&self, plan: &Plan) -> u32 {
        self.flag_words[(plan.flag_ix & 0xf) as usize][1]
    }

    /// A planned WR requests a completion (it asked for one, or the QP
    /// signals all).
    #[inline(always)]
    pub(crate) fn user_sig(&self, plan: &Plan) -> bool {
        self.fm_word(plan) & byte3(ctrl_flags::CQ_UPDATE) != 0
    }

    /// Validates a WR and works out its WQE: opcode, size, flags.
    #[inline(always)]
    pub(crate) fn plan(&self, wr: &SendWr<'_>) -> Result<Plan> {
        self.plan_with(wr, &self.caps)
    }

    /// [`SendQueue::plan`] against `caps` (this queue's, or a copy).
    #[inline(always)]
    fn plan_with(&self, wr: &SendWr<'_>, caps: &QpCaps) -> Result<Plan> {
        Self::plan_for(wr, caps)
    }

    /// Validates a WR against `caps` and works out its WQE: every rule a
    /// post applies before it looks at ring space and QP state. Needs no
    /// queue (the flag words are the queue's, read when the WQE is
    /// written), so [`SendQueue::check`] runs exactly this code.
    #[inline(always)]
    pub(super) fn plan_for(wr: &SendWr<'_>, caps: &QpCaps) -> Result<Plan> {
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
        Ok(Plan {
            mlx_op,
            hdr_ds,
            imm,
            ds,
            nbb: (ds + 3) >> 2,
            flag_ix: (wr.flags.0 & 0xf) as u8,
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
        // SAFETY: the caller's contract.
        unsafe {
            Self::write_op_segs(wr, base);
            let ds = self.write_payload(wr, plan, base, pi << 2);
            self.write_ctrl(plan, ds, pi, base)
        }
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
        }) | self.slot_word(plan);
        // SAFETY: caller contract; an aligned 8-byte store and two aligned
        // 4-byte stores (offsets 8 and 12 of the 8-aligned slot).
        unsafe {
            p.write(wr_id);
            let m = p.add(1).cast::<u32>();
            m.write(pi.wrapping_add(plan.nbb));
            m.add(1).write(hi);
        }
    }

    /// Writes the data segments (or the inline segment) of a validated WR
    /// whose first BB is at `base` (octoword `o` of the ring, unmasked).
    ///
    /// Header segments (at most 3 octowords) always lie in the first BB;
    /// a data segment there is stored at a fixed offset from `base`, one in
    /// a later BB may wrap at the ring end, so its address is masked.
    ///
    /// # Safety
    /// `base` must be the 64-aligned first BB of the WQE inside the ring,
    /// and the WQE's BBs must be free.
    ///
    /// Returns the WQE's DS: `plan.ds`, counted again here for an SGE list
    /// (the header octowords plus one per SGE stored), so that a
    /// zero-length SGE's DS comes out of the branch that skips it instead
    /// of a value held in a register since the WR was planned.
    #[inline(always)]
    unsafe fn write_payload(&self, wr: &SendWr<'_>, plan: &Plan, base: *mut u8, o: u32) -> u32 {
        // SAFETY: `base + 16 * i` for i < 4 is inside the first BB, and
        // `octo` masks every later octoword into the ring; all belong to
        // the caller. Every store is an aligned 8-byte store.
        unsafe {
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
                        plan.ds
                    } else {
                        for s in sges {
                            if s.length != 0 {
                                let d = at(k).cast::<u64>();
                                d.write(pack2(s.length.to_be(), s.lkey.to_be()));
                                d.add(1).write(s.addr.to_be());
                                k += 1;
                            }
                        }
                        // Validation counted the same SGEs: k == plan.ds.
                        k
                    }
                }
                Payload::Inline(pieces) => {
                    if plan.shape.inline_len != 0 {
                        self.write_inline(at(k), plan.shape.inline_len, pieces);
                    }
                    plan.ds
                }
            }
        }
    }

    /// Writes the remote-address or atomic segment of a WR whose first BB
    /// is at `base` (nothing for an opcode without one).
    ///
    /// # Safety
    /// `base` must be the 64-aligned first BB of the WQE inside the ring,
    /// and the BB must be free; every header segment lies in it
    /// (`hdr_ds` <= 3), at fixed offsets.
    #[inline(always)]
    unsafe fn write_op_segs(wr: &SendWr<'_>, base: *mut u8) {
        // SAFETY: `base + 16 * i` for i < 4 is inside the first BB, which
        // belongs to the caller. Every store is an aligned 8-byte store.
        unsafe {
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
        }
    }

    /// Writes the control segment of a planned WR of DS `ds` at `base`,
    /// BB `pi` of the ring; returns its first 8 bytes (the doorbell value).
    ///
    /// # Safety
    /// As for [`SendQueue::write_op_segs`].
    #[inline(always)]
    unsafe fn write_ctrl(&self, plan: &Plan, ds: u32, pi: u32, base: *mut u8) -> u64 {
        // The QP number's bytes are a precomputed 8-byte word, so a DS
        // known per path (one SGE, or a zero-length one skipped) is a
        // constant OR-ed in.
        let ctrl8 = pack2(
            ((pi & 0xffff) << 8 | plan.mlx_op as u32).to_be(),
            ds.to_be(),
        ) | self.qpn_ctrl8;
        // SAFETY: the first 16 bytes of the first BB, which belongs to the
        // caller; aligned 8-byte stores.
        unsafe {
            let c = base.cast::<u64>();
            c.write(ctrl8);
            c.add(1).write(pack2(self.fm_word(plan), plan.imm.to_be()));
        }
        ctrl8
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
