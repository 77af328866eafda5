//! Doorbells: ringing for pending WQEs, BlueFlame, the signalling guard,
//! and batches of posts that end with one doorbell.

use super::wqe::{Cursor, Written};
use super::SendQueue;
use crate::error::{PostError, Result};
use crate::mmio;
use crate::provider::mlx5::layout::ctrl_flags;
use crate::wr::SendWr;

/// A run of posts on one [`SendQueue`] that ends with one doorbell
/// ([`SendBatch::ring`]), from [`SendQueue::batch`].
///
/// The producer counters stay in locals for the whole run and are written
/// back once, so a loop of [`SendBatch::post`] costs less than one of
/// [`SendQueue::post`]. Dropping a batch without ringing writes its state
/// back and leaves its WQEs pending, exactly as [`SendQueue::post`] does;
/// a later [`SendQueue::ring`] covers them.
pub struct SendBatch<'q> {
    sq: &'q mut SendQueue,
    cur: Cursor,
    /// WQEs written by this batch.
    count: u32,
    /// First BB of the last of them (valid if `count != 0`). Its control
    /// bytes are read back from the ring when the doorbell rings, so they
    /// need no register during the run.
    last_start: u32,
    /// The last of them has an inline payload.
    last_inline: bool,
}

impl SendBatch<'_> {
    /// Formats one send WQE without ringing the doorbell, as
    /// [`SendQueue::post`]. On error nothing is written and the batch is
    /// unchanged.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    pub unsafe fn post(&mut self, wr: &SendWr<'_>) -> Result<()> {
        // SAFETY: forwarded contract; the cursor is this queue's.
        let w = unsafe { self.sq.write::<false>(&mut self.cur, wr) }?;
        self.sq.note_signaled(&self.cur, w.sig);
        self.count += 1;
        self.last_start = w.start;
        self.last_inline = w.inline;
        Ok(())
    }

    /// WQEs written by this batch so far.
    #[inline]
    pub fn len(&self) -> u32 {
        self.count
    }

    /// True if this batch has written nothing yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Writes the state back and rings one doorbell for every pending WQE
    /// (this batch's and any posted before it), as [`SendQueue::ring`].
    #[inline(always)]
    pub fn ring(self) {
        let sq = &mut *self.sq;
        sq.store_cursor(&self.cur);
        if self.count != 0 {
            let single = sq.batch == 0 && self.count == 1;
            sq.batch = 0;
            sq.ring_written(self.last_start, self.last_inline, single);
        } else {
            sq.ring();
        }
        // Everything is written back: nothing is left for `drop` (which
        // would only store the same counters again).
        core::mem::forget(self);
    }
}

impl Drop for SendBatch<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let sq = &mut *self.sq;
        sq.store_cursor(&self.cur);
        if self.count != 0 {
            sq.batch += self.count;
            sq.last_start = self.last_start;
            sq.last_inline = self.last_inline;
        }
    }
}

impl SendQueue {
    /// Number of WQEs written since the last doorbell.
    #[inline]
    pub fn pending(&self) -> u32 {
        self.batch
    }

    /// Rings the doorbell for every WQE written since the last one: the
    /// doorbell record, then either a BlueFlame copy (a single WQE, per the
    /// policy) or one 8-byte doorbell with the last WQE's control bytes.
    /// Does nothing if nothing is pending.
    ///
    /// If the run of unsignaled work since the last CQE request has grown
    /// past the guard, the last WQE is made to request a CQE first (it has
    /// not been published yet), so the SQ can never fill with work that
    /// nothing will retire (docs/spec/mlx5.md §9). That CQE is consumed by the poller and
    /// not reported.
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.batch == 0 {
            return;
        }
        let single = self.batch == 1;
        self.batch = 0;
        self.ring_written(self.last_start, self.last_inline, single);
    }

    /// The doorbell for pending WQEs, the last of which starts at BB
    /// `start`: its control bytes are read back from the ring.
    #[inline(always)]
    fn ring_written(&mut self, start: u32, inline: bool, single: bool) {
        // SAFETY: the first 8 bytes of the last WQE's control segment,
        // inside the ring and 8-aligned; only this queue writes the ring.
        let ctrl8 = unsafe { self.octo(start << 2).cast::<u64>().read() };
        let w = Written {
            start,
            ctrl8,
            // Unknown here: the guard test tells (a signaled last WQE leaves
            // no unsignaled run).
            sig: false,
            inline,
        };
        self.ring_last(w, single);
    }

    /// The doorbell proper, for the WQE `w` written last; `single` if it is
    /// the only WQE since the previous doorbell.
    #[inline(always)]
    pub(super) fn ring_last(&mut self, w: Written, single: bool) {
        self.guard_last(&w);
        if self.db_other {
            self.ring_other(w.start, w.ctrl8, w.inline, single);
            return;
        }
        self.ring_plain(w.ctrl8);
    }

    /// The doorbell after one WQE `w` was posted by itself: it covers the
    /// WQEs still pending before it (`batch` of them) too. Whether it is
    /// the only one matters only to BlueFlame, so `batch` is read only on
    /// that path.
    #[inline(always)]
    pub(super) fn ring_posted(&mut self, w: Written) {
        self.guard_last(&w);
        if !self.db_other {
            self.batch = 0;
            self.ring_plain(w.ctrl8);
            return;
        }
        let single = self.batch == 0;
        self.batch = 0;
        self.ring_other(w.start, w.ctrl8, w.inline, single);
    }

    /// The signalling guard for the last WQE `w` (not yet published).
    #[inline(always)]
    fn guard_last(&mut self, w: &Written) {
        // guard >= 1, so a zero run never forces; a signaled last WQE ends
        // the run, so the test is skipped when that is known.
        if !w.sig && self.pi.wrapping_sub(self.last_signaled_end) >= self.guard {
            self.force_signal_last(w.start);
        }
    }

    /// The plain 8-byte doorbell with control bytes `ctrl8`, for a queue
    /// without BlueFlame or a shared register.
    #[inline(always)]
    fn ring_plain(&mut self, ctrl8: u64) {
        // SAFETY: register offset is 0 or bf_size, inside the register pair;
        // see the constructor contract.
        let reg = unsafe { self.bf_reg.as_ptr().add(self.bf_offset as usize) };
        // SAFETY: constructor contract.
        unsafe { mmio::send_doorbell(self.dbrec.as_ptr(), self.pi, reg, ctrl8, false) };
        // Step 7: toggle between the two BlueFlame buffers.
        self.bf_offset ^= self.bf_size;
    }

    /// The doorbell of a queue with a BlueFlame policy (libmlx5's default,
    /// so kept inline) or a shared register.
    #[inline(always)]
    fn ring_other(&mut self, start: u32, ctrl8: u64, inline: bool, single: bool) {
        // SAFETY: register offset is 0 or bf_size, inside the register pair;
        // see the constructor contract.
        let reg = unsafe { self.bf_reg.as_ptr().add(self.bf_offset as usize) };
        let flush = self.shared_register;
        let ds = (u64::from_be(ctrl8) & 0x3f) as u32;
        let bf_ds = if inline || !self.bf_inline_only {
            ds
        } else {
            0
        };
        // DS in 2..=bf_size/16 (a DS-1 WQE is never copied, docs/spec/mlx5.md §7).
        if single && bf_ds.wrapping_sub(2) < self.bf_ds_limit {
            // Read again here, not reused from the WQE's write: a register
            // kept across a post for this path alone would be spilled on
            // every post (and the plain doorbell does not need it).
            // SAFETY: a reference to a field is valid for a read.
            let (ring, mask) = unsafe {
                (
                    core::ptr::read_volatile(&self.buf),
                    core::ptr::read_volatile(&self.mask),
                )
            };
            // SAFETY: dbrec/reg/ring validity from the constructor contract;
            // the WQE's BBs are inside the ring modulo mask.
            unsafe {
                mmio::send_blueflame(
                    self.dbrec.as_ptr(),
                    self.pi,
                    reg,
                    ring.as_ptr(),
                    start,
                    (bf_ds + 3) >> 2,
                    mask,
                    flush,
                )
            };
        } else {
            // SAFETY: constructor contract.
            unsafe { mmio::send_doorbell(self.dbrec.as_ptr(), self.pi, reg, ctrl8, flush) };
        }
        // Step 7: toggle between the two BlueFlame buffers.
        self.bf_offset ^= self.bf_size;
    }

    /// Makes the last written (not yet published) WQE request a CQE.
    #[cold]
    fn force_signal_last(&mut self, start: u32) {
        // The mask is read again here, not kept in a register from the
        // WQE's write for this rare path (see `ring_other`).
        // SAFETY: a reference to a field is valid for a read.
        let mask = unsafe { core::ptr::read_volatile(&self.mask) };
        let off = ((start & mask) as usize) << 6;
        // SAFETY: byte 11 of the last WQE's control segment, inside the
        // ring (`start & mask` < wqe_cnt); the device has not been told
        // about this WQE yet.
        unsafe { *self.buf.as_ptr().add(off + 11) |= ctrl_flags::CQ_UPDATE };
        self.last_signaled_end = self.pi;
        self.forced = self.forced.wrapping_add(1);
    }

    /// Posts one WR and rings the doorbell for it.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    pub unsafe fn post_one(&mut self, wr: &SendWr<'_>) -> Result<()> {
        let mut c = self.cursor();
        // SAFETY: forwarded contract.
        let w = unsafe { self.write::<true>(&mut c, wr) }?;
        self.store_cursor(&c);
        self.note_signaled(&c, w.sig);
        // Earlier un-rung WQEs are covered by this doorbell too.
        self.ring_posted(w);
        Ok(())
    }

    /// Starts a run of posts that ends with one doorbell
    /// ([`SendBatch::ring`]). The producer state stays in locals for the
    /// whole run and is written back once.
    #[inline(always)]
    pub fn batch(&mut self) -> SendBatch<'_> {
        SendBatch {
            cur: self.cursor(),
            count: 0,
            last_start: 0,
            last_inline: false,
            sq: self,
        }
    }

    /// Posts a list of WRs and rings the doorbell once. Stops at the first
    /// invalid WR: the ones before it are posted and rung, and the error is
    /// returned with the index of the failed WR.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline]
    pub unsafe fn post_list(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let mut b = self.batch();
        let mut failed = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: forwarded contract.
            if let Err(error) = unsafe { b.post(wr) } {
                failed = Err(PostError { index: i, error });
                break;
            }
        }
        // Earlier un-rung WQEs get their doorbell even if nothing new was
        // posted.
        b.ring();
        failed
    }
}
