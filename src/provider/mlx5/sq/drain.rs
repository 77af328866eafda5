//! The drain marker of recovery: one signaled NOP WQE posted after the QP
//! entered ERROR, whose flush completion retires every WQE before it.
//!
//! A completion names one WQE and retires everything up to it
//! (docs/spec/mlx5.md §9). An unsignaled WQE that the device executed has
//! no completion of its own, and once the QP is in ERROR nothing after it
//! may come to retire it: without a marker, recovery would wait for ever
//! for such work at the tail of the queue. The device flushes every WQE
//! posted in ERROR with an error completion, so the marker's completion
//! always comes; the poller recognises the marker by its side-table slot
//! ([`WrSlot::DRAIN`], the position of the WQE, never its wr_id) and
//! retires it without reporting it.

use super::{SendQueue, WrSlot};
use crate::completion::QpState;
use crate::error::{Error, Result};
use crate::provider::mlx5::layout::ctrl_flags;
use crate::wr::{SendFlags, SendOp, SendWr};

impl SendQueue {
    /// Posts the drain marker if the queue needs one: in ERROR, with send
    /// work outstanding, and unless the last WQE written is a marker
    /// already (a repeated recovery call, e.g. in the software device's
    /// step mode, adds no second one). `Ok(true)` if a marker was posted
    /// (its doorbell rung, covering any WQEs still pending), `Ok(false)` if
    /// none was needed.
    ///
    /// The marker is a NOP of one basic block with a completion requested.
    /// [`Error::SqFull`] if not one BB is free: poll the CQ (the
    /// completions of the signaled WQEs in the queue free their space) and
    /// call again. The queue never stays full of work nothing retires: the
    /// signalling guard keeps the unsignaled run after the last signaled
    /// WQE below `wqe_cnt - max_wqe_bbs` (docs/spec/mlx5.md §9), so once the
    /// completions of the signaled WQEs are polled, more than one BB is
    /// free. No BB is reserved for the marker, so the queue's capacity is
    /// the full ring. [`Error::InvalidQpState`] outside ERROR.
    ///
    /// Cold: used by recovery only, never on the post path.
    #[cold]
    pub fn post_drain_marker(&mut self) -> Result<bool> {
        if self.state != QpState::Error {
            return Err(Error::InvalidQpState);
        }
        if self.pi == self.retired || self.last_is_drain_marker() {
            return Ok(false);
        }
        if self.free_bbs() == 0 {
            return Err(Error::SqFull);
        }
        let nop = SendWr::new(0, SendOp::Nop, &[], SendFlags::NONE);
        // The limit is set to the whole ring for this one write, whatever
        // the state left it at (ERROR accepts posts, which the device
        // flushes; the marker must not depend on that).
        let limit = self.limit;
        self.limit = self.wqe_cnt;
        let mut c = self.cursor();
        // SAFETY: a NOP has no SGEs: the device accesses no memory for it.
        let written = unsafe { self.write::<true>(&mut c, &nop) };
        self.limit = limit;
        let mut w = written?;
        self.store_cursor(&c);
        let slot = (w.start & self.mask) as usize;
        // SAFETY: byte 11 (`fm_ce_se`) of the marker's control segment,
        // inside the ring; the device has not been told about the WQE yet.
        unsafe { *self.octo(w.start << 2).add(11) |= ctrl_flags::CQ_UPDATE };
        // SAFETY: `slot` < wqe_cnt <= the side table's length (constructor
        // contract); the queue owns the side table and `write` has just
        // filled this entry.
        unsafe {
            let e = self.wrid.as_ptr().add(slot);
            (*e).flags = WrSlot::VALID | WrSlot::DRAIN;
        }
        self.last_signaled_end = self.pi;
        w.sig = true;
        // Earlier un-rung WQEs are covered by this doorbell too.
        let single = self.batch == 0;
        self.batch = 0;
        self.ring_last(w, single);
        Ok(true)
    }

    /// The WQE at BB `start` (still in the ring's side table) is a drain
    /// marker (cold: checked for error completions only).
    #[cold]
    pub fn is_drain_marker(&self, start: u32) -> bool {
        // SAFETY: the index is masked below wqe_cnt <= the side table's
        // length (constructor contract).
        let e = unsafe { self.wrid.as_ptr().add((start & self.mask) as usize).read() };
        e.flags & WrSlot::DRAIN != 0 && e.start == start as u16
    }

    /// The last WQE written (outstanding) is a drain marker: it is one BB,
    /// so its slot is the one just before the producer counter.
    fn last_is_drain_marker(&self) -> bool {
        let start = self.pi.wrapping_sub(1);
        // SAFETY: masked index, as in `is_drain_marker`.
        let e = unsafe { self.wrid.as_ptr().add((start & self.mask) as usize).read() };
        e.flags & (WrSlot::VALID | WrSlot::DRAIN) == WrSlot::VALID | WrSlot::DRAIN
            && e.end == self.pi
    }
}
