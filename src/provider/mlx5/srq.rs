//! The mlx5 shared receive queue (docs/spec/mlx5.md §11): WQEs of a
//! 16-byte next-WQE segment and `max_gs` data segments, chained into a
//! free list by their `next_wqe_index`; a doorbell record holding the
//! 16-bit count of posted WQEs; completions in any order.
//!
//! The list state follows libmlx5's (`mlx5_post_srq_recv`,
//! `mlx5_free_srq_wqe` in rdma-core's `providers/mlx5/srq.c`), so the ring
//! the device sees is the one libmlx5 would leave: `head` is the next WQE
//! to fill, `tail` the last WQE of the list (always kept unused, so the
//! device never runs past it), and a completed WQE is only marked; a
//! later post relinks it when the list runs short.
//!
//! The links are kept in the side table as well as in the ring, so the
//! queue never reads the ring back. A completion's `wqe_counter` is
//! device-written: an index outside the list or of a WQE that is not
//! outstanding is [`Error::CqeCorrupt`] and changes nothing.

use core::ptr::NonNull;

use super::layout::{Be16, Be32, Be64, DataSeg, INVALID_LKEY};
use crate::error::{Error, PostError, Result};
use crate::mmio;
use crate::wr::RecvWr;

/// Size of the next-WQE segment (`struct mlx5_wqe_srq_next_seg`).
pub const SRQ_NEXT_SEG: u32 = 16;
/// Offset of the big-endian `next_wqe_index` in it.
const NEXT_OFF: usize = 2;

/// Per-WQE side-table entry of an [`Srq`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct SrqSlot {
    /// The WR id of the receive posted in this WQE.
    pub wr_id: u64,
    /// `next_wqe_index` as last written to the ring.
    pub next: u16,
    /// [`SrqSlot::POSTED`] or [`SrqSlot::COMPLETED`] (0: on the free list).
    pub state: u8,
    /// Reserved.
    pub reserved: [u8; 5],
}

static_assertions::assert_eq_size!(SrqSlot, [u8; 16]);

impl SrqSlot {
    /// A receive is posted in this WQE and not completed.
    pub const POSTED: u8 = 1;
    /// Completed by the device, not yet relinked (libmlx5's
    /// `free_wqe_bitmap`).
    pub const COMPLETED: u8 = 2;
}

/// The geometry of an SRQ as rdma-core allocates it
/// (`mlx5_alloc_srq_buf`; docs/spec/mlx5.md §11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqGeometry {
    /// WQE buffer: `max * stride` bytes.
    pub buf: *mut u8,
    /// The SRQ's doorbell-record word.
    pub dbrec: *mut u32,
    /// Bytes per WQE: a power of two, at least 32.
    pub stride: u32,
    /// WQEs in the free list (a power of two, at least 2).
    pub nwqes: u32,
    /// WQEs in the buffer (`>= nwqes`); those past `nwqes` are libmlx5's
    /// page-fault wait queue, linked at creation and never used here.
    pub max: u32,
    /// SRQ number.
    pub srqn: u32,
}

/// An mlx5 SRQ over caller-provided memory.
pub struct Srq {
    buf: NonNull<u8>,
    dbrec: NonNull<u32>,
    stride_shift: u32,
    nwqes: u32,
    max_gs: u32,
    head: u32,
    tail: u32,
    /// 16-bit count of posted WQEs (what the doorbell record holds).
    counter: u16,
    /// `counter` at the last doorbell-record update.
    rung: u16,
    srqn: u32,
    slots: NonNull<SrqSlot>,
}

// SAFETY: exclusive ownership of the WQE buffer, side table and doorbell
// record (constructor contract); moving the queue moves that ownership.
unsafe impl Send for Srq {}

impl Srq {
    /// Wraps an SRQ and initialises its free list as `mlx5_alloc_srq_buf`
    /// does: WQE `i` links to `i + 1` inside the list and inside the wait
    /// queue, the last ones to 0; `head = 0`, `tail = nwqes - 1`. Only the
    /// link words (bytes 2..3 of each WQE) are written.
    ///
    /// # Safety
    /// - `geo.buf` points to `geo.max * geo.stride` bytes only this queue
    ///   writes, `geo.dbrec` to a 4-byte word only this queue writes, for
    ///   the queue's life.
    /// - `slots` points to `slots_len` entries owned by this queue.
    /// - Posted SGEs name memory the device may write until completion.
    pub unsafe fn from_raw(
        geo: &SrqGeometry,
        slots: NonNull<SrqSlot>,
        slots_len: usize,
    ) -> Result<Srq> {
        let s = geo.stride;
        if s < 32
            || !s.is_power_of_two()
            || s > 1 << 16
            || geo.nwqes < 2
            || !geo.nwqes.is_power_of_two()
            || geo.nwqes > 1 << 16
            || geo.max < geo.nwqes
            || geo.max > 1 << 16
        {
            return Err(Error::InvalidGeometry);
        }
        let buf = NonNull::new(geo.buf).ok_or(Error::InvalidGeometry)?;
        let dbrec = NonNull::new(geo.dbrec).ok_or(Error::InvalidGeometry)?;
        if buf.as_ptr() as usize % 16 != 0 || dbrec.as_ptr() as usize % 4 != 0 {
            return Err(Error::InvalidGeometry);
        }
        if slots_len < geo.nwqes as usize {
            return Err(Error::StorageTooSmall);
        }
        let mut q = Srq {
            buf,
            dbrec,
            stride_shift: s.trailing_zeros(),
            nwqes: geo.nwqes,
            max_gs: (s - SRQ_NEXT_SEG) / 16,
            head: 0,
            tail: geo.nwqes - 1,
            counter: 0,
            rung: 0,
            srqn: geo.srqn,
            slots,
        };
        for i in 0..geo.max {
            let last = i == geo.nwqes - 1 || i == geo.max - 1;
            let next = if last { 0 } else { i + 1 };
            q.write_link(i, next as u16);
            if i < geo.nwqes {
                // SAFETY: i < nwqes <= slots_len.
                unsafe { slots.add(i as usize).write(SrqSlot::default()) };
                q.slot(i).next = next as u16;
            }
        }
        Ok(q)
    }

    /// SRQ number.
    #[inline]
    pub fn srqn(&self) -> u32 {
        self.srqn
    }
    /// Data segments per WQE.
    #[inline]
    pub fn max_gs(&self) -> u32 {
        self.max_gs
    }
    /// WQEs in the free list.
    #[inline]
    pub fn nwqes(&self) -> u32 {
        self.nwqes
    }
    /// The next WQE a post fills.
    #[inline]
    pub fn head(&self) -> u32 {
        self.head
    }
    /// The last WQE of the free list (kept unused).
    #[inline]
    pub fn tail(&self) -> u32 {
        self.tail
    }
    /// 16-bit count of posted WQEs.
    #[inline]
    pub fn counter(&self) -> u16 {
        self.counter
    }
    /// The side-table entry of WQE `i` (`None` past the list).
    pub fn slot_state(&self, i: u32) -> Option<SrqSlot> {
        // SAFETY: i < nwqes <= slots_len.
        (i < self.nwqes).then(|| unsafe { self.slots.add(i as usize).read() })
    }

    /// Side-table entry `i`.
    #[inline(always)]
    fn slot(&mut self, i: u32) -> &mut SrqSlot {
        // SAFETY: the masked index is < nwqes <= slots_len (callers pass
        // i < nwqes anyway); the table is this queue's and `&mut self`
        // makes the borrow unique.
        unsafe { &mut *self.slots.as_ptr().add((i & (self.nwqes - 1)) as usize) }
    }

    /// The state of side-table entry `i` (`i < nwqes`).
    #[inline(always)]
    fn state_of(&self, i: u32) -> u8 {
        // SAFETY: masked index < nwqes <= slots_len.
        unsafe { (*self.slots.as_ptr().add((i & (self.nwqes - 1)) as usize)).state }
    }

    /// WQE `i` of the buffer (`i < max`).
    #[inline(always)]
    fn wqe(&self, i: u32) -> *mut u8 {
        // SAFETY: callers pass i < max: inside the buffer (contract).
        unsafe { self.buf.as_ptr().add((i as usize) << self.stride_shift) }
    }

    /// Stores WQE `i`'s `next_wqe_index` in the ring.
    #[inline(always)]
    fn write_link(&mut self, i: u32, next: u16) {
        // SAFETY: bytes 2..3 of WQE i (i < max), 2-aligned.
        unsafe {
            self.wqe(i)
                .add(NEXT_OFF)
                .cast::<Be16>()
                .write(Be16::new(next))
        };
    }

    /// Links `tail` to `next` in the side table and the ring.
    #[inline(always)]
    fn link(&mut self, from: u32, to: u32) {
        self.slot(from).next = to as u16;
        self.write_link(from, to as u16);
    }

    /// Extends the free list past `tail` when only `tail` is left (cold:
    /// once per completed run; the scan for a run is bounded by `nwqes`,
    /// as libmlx5's). Returns false if no completed WQE exists.
    #[cold]
    fn extend(&mut self) -> bool {
        let next = (self.tail + 1) & (self.nwqes - 1);
        if self.slot(next).state == SrqSlot::COMPLETED {
            let t = self.tail;
            self.link(t, next);
            self.slot(next).state = 0;
            self.tail = next;
            return true;
        }
        // The first run of completed WQEs after `head`, else from 0.
        let done = |q: &Srq, i: u32| q.state_of(i) == SrqSlot::COMPLETED;
        let start = match (self.head + 1..self.nwqes).find(|&i| done(self, i)) {
            Some(s) => s,
            None => match (0..self.head).find(|&i| done(self, i)) {
                Some(s) => s,
                None => return false,
            },
        };
        let t = self.tail;
        self.link(t, start);
        let mut end = start;
        self.slot(start).state = 0;
        while end + 1 < self.nwqes && done(self, end + 1) {
            self.link(end, end + 1);
            end += 1;
            self.slot(end).state = 0;
        }
        self.tail = end;
        true
    }

    /// Writes one receive into the head WQE; the doorbell record is
    /// updated by [`Srq::ring`]. Errors, with nothing written:
    /// [`Error::TooManySges`] (more than [`Srq::max_gs`]),
    /// [`Error::LengthOverflow`], [`Error::RqFull`] (no free WQE).
    /// Zero-length SGEs are written as they are (unlike a QP's receive
    /// queue, libmlx5 does not skip them on an SRQ).
    ///
    /// # Safety
    /// Every SGE must name memory the device may write until completion.
    #[inline(always)]
    pub unsafe fn post(&mut self, wr: &RecvWr<'_>) -> Result<()> {
        if wr.sges.len() > self.max_gs as usize {
            return Err(Error::TooManySges);
        }
        crate::wr::total_length(wr.sges)?;
        if self.head == self.tail && !self.extend() {
            return Err(Error::RqFull);
        }
        let h = self.head;
        let base = self
            .wqe(h)
            .wrapping_add(SRQ_NEXT_SEG as usize)
            .cast::<DataSeg>();
        for (k, s) in wr.sges.iter().enumerate() {
            // SAFETY: k < max_gs: inside WQE h (h < nwqes <= max), 16-aligned.
            unsafe {
                base.add(k).write(DataSeg {
                    byte_count: Be32::new(s.length),
                    lkey: Be32::new(s.lkey),
                    addr: Be64::new(s.addr),
                })
            };
        }
        if wr.sges.len() < self.max_gs as usize {
            // SAFETY: as above, the entry after the last SGE.
            unsafe {
                base.add(wr.sges.len()).write(DataSeg {
                    byte_count: Be32::new(0),
                    lkey: Be32::new(INVALID_LKEY),
                    addr: Be64::new(0),
                })
            };
        }
        let s = self.slot(h);
        s.wr_id = wr.wr_id;
        s.state = SrqSlot::POSTED;
        self.head = s.next as u32;
        self.counter = self.counter.wrapping_add(1);
        Ok(())
    }

    /// Publishes posted receives: to-device barrier, then the doorbell
    /// record = the 16-bit posted count (docs/spec/mlx5.md §11).
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.rung == self.counter {
            return;
        }
        // SAFETY: constructor contract on dbrec.
        unsafe { mmio::write_dbrec(self.dbrec.as_ptr(), self.counter as u32) };
        self.rung = self.counter;
    }

    /// Posts a list and updates the doorbell record once, as
    /// `ibv_post_srq_recv`. Stops at the first refused WR (the earlier ones
    /// are posted).
    ///
    /// # Safety
    /// As for [`Srq::post`].
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

    /// Completes the receive in WQE `wqe_counter` (the CQE's counter is the
    /// WQE index, not masked): returns its WR id and marks the WQE
    /// completed, for a later post to relink. An index past the list or
    /// of a WQE with no outstanding receive is [`Error::CqeCorrupt`] and
    /// changes nothing.
    #[inline]
    pub fn complete(&mut self, wqe_counter: u16) -> Result<u64> {
        let i = wqe_counter as u32;
        if i >= self.nwqes {
            return Err(Error::CqeCorrupt);
        }
        let s = self.slot(i);
        if s.state != SrqSlot::POSTED {
            return Err(Error::CqeCorrupt);
        }
        s.state = SrqSlot::COMPLETED;
        Ok(s.wr_id)
    }
}
