//! mlx5 completion-queue polling (docs/spec/mlx5.md §8, §9).
//!
//! A CQE is device-written memory: the poller loads the ownership byte
//! once (acquire), issues the from-device barrier, copies the entry once
//! into a local, and only then decodes it. Every index derived from a CQE
//! is masked and checked against outstanding work before it is used, so a
//! corrupt entry is reported, never followed.

mod decode;
mod poll;
mod route;

use core::ptr::NonNull;

pub use super::completion::{syndrome, wc_flags, Wc, WcOpcode, WcStatus};
use super::layout::{Mlx5dvCq, CQ_ARM_DB, CQ_DOORBELL};
use crate::error::{Error, Result};
use crate::mmio;
pub use route::{CqRoute, CqRouteTo, Mlx5Qp, QpQueues, SqRetire};

/// An mlx5 completion queue over caller-provided memory.
pub struct CompletionQueue {
    buf: NonNull<u8>,
    mask: u32,
    log_cnt: u32,
    /// log2 of the CQE size (6 or 7).
    size_shift: u32,
    /// The CQE64 of slot 0 (`buf + cqe_size - 64`), precomputed for the
    /// poll loops.
    cqe64_base: NonNull<u8>,
    ci: u32,
    dbrec: NonNull<u32>,
    uar: Option<NonNull<u8>>,
    cqn: u32,
    arm_sn: u32,
    stale: u64,
    scatter: bool,
}

// SAFETY: exclusive ownership of the CQ consumer side (constructor).
unsafe impl Send for CompletionQueue {}

impl CompletionQueue {
    /// Wraps a CQ described by `mlx5dv_init_obj` fields.
    ///
    /// # Safety
    /// `cq.buf` points to `cqe_cnt * cqe_size` bytes written by the device
    /// and read only by this poller; `cq.dbrec` to the two CQ doorbell
    /// words, written only by this poller; `cq.cq_uar`, if not NULL, to
    /// the UAR page whose arm register is at `+0x20`. All for the life of
    /// the queue.
    pub unsafe fn from_raw(cq: &Mlx5dvCq) -> Result<CompletionQueue> {
        let cnt = cq.cqe_cnt;
        if cnt < 2
            || !cnt.is_power_of_two()
            || (cq.cqe_size != 64 && cq.cqe_size != 128)
            || cnt > 1 << 24
        {
            return Err(Error::InvalidGeometry);
        }
        let buf = NonNull::new(cq.buf).ok_or(Error::InvalidGeometry)?;
        let dbrec = NonNull::new(cq.dbrec).ok_or(Error::InvalidGeometry)?;
        if buf.as_ptr() as usize % 64 != 0 || dbrec.as_ptr() as usize % 4 != 0 {
            return Err(Error::InvalidGeometry);
        }
        let uar = NonNull::new(cq.cq_uar);
        if let Some(u) = uar {
            if u.as_ptr() as usize % 8 != 0 {
                return Err(Error::InvalidGeometry);
            }
        }
        Ok(CompletionQueue {
            buf,
            mask: cnt - 1,
            log_cnt: cnt.trailing_zeros(),
            size_shift: cq.cqe_size.trailing_zeros(),
            // SAFETY: cqe_size (64 or 128) bytes from `buf` lie inside the
            // buffer (contract; cnt >= 2).
            cqe64_base: unsafe { buf.add(cq.cqe_size as usize - 64) },
            ci: 0,
            dbrec,
            uar,
            cqn: cq.cqn,
            arm_sn: 0,
            stale: 0,
            scatter: true,
        })
    }

    /// Marks every entry of a CQ buffer as hardware-owned and invalid
    /// (`op_own = 0xf0`), as libmlx5 does at creation (docs/spec/mlx5.md §8).
    ///
    /// # Safety
    /// `buf` valid for `cnt * size` bytes, no concurrent users.
    pub unsafe fn init_buffer(buf: *mut u8, cnt: u32, size: u32) {
        for i in 0..cnt as usize {
            // SAFETY: inside the buffer per the contract.
            unsafe { mmio::store_op_own(buf.add(i * size as usize + size as usize - 1), 0xf0) };
        }
    }

    /// Free-running consumer index.
    #[inline]
    pub fn consumer_index(&self) -> u32 {
        self.ci
    }
    /// Sets the consumer index (after a reset, or to adopt a CQ in use).
    pub fn set_consumer_index(&mut self, ci: u32) {
        self.ci = ci;
    }
    /// Number of entries.
    #[inline]
    pub fn cqe_cnt(&self) -> u32 {
        self.mask + 1
    }
    /// Enables or disables scatter-to-CQE handling (on by default). With it
    /// off, a CQE carrying inline data is reported as
    /// [`Error::CqeCorrupt`] instead of being copied into the posted
    /// buffer; the safe API turns it off because it creates its QPs with
    /// scatter-to-CQE disabled and never trusts an unexpected copy target.
    pub fn set_scatter_to_cqe(&mut self, on: bool) {
        self.scatter = on;
    }

    /// CQEs skipped because they named a QP the route did not own (stale
    /// entries of destroyed QPs, docs/spec/mlx5.md §1).
    pub fn stale_cqes(&self) -> u64 {
        self.stale
    }

    /// Requests an event for the next completion (or the next solicited
    /// one): arm word into the doorbell record, then a 64-bit store to the
    /// UAR's CQ doorbell (docs/spec/mlx5.md §8). Fails if the CQ has no UAR.
    pub fn arm(&mut self, solicited_only: bool) -> Result<()> {
        let uar = self.uar.ok_or(Error::InvalidGeometry)?;
        let sn = self.arm_sn & 3;
        let cmd = if solicited_only { 1u32 << 24 } else { 0 };
        let word = sn << 28 | cmd | (self.ci & 0x00ff_ffff);
        // SAFETY: constructor contract on the doorbell record and UAR.
        unsafe {
            mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_ARM_DB), word);
            mmio::wc_start();
            mmio::mmio_write64(
                uar.as_ptr().add(CQ_DOORBELL),
                (((word as u64) << 32) | self.cqn as u64).to_be(),
            );
            mmio::wc_flush();
        }
        Ok(())
    }

    /// Records that a CQ event was consumed (advances the arm sequence
    /// number, as `mlx5_cq_event`).
    pub fn event_consumed(&mut self) {
        self.arm_sn = self.arm_sn.wrapping_add(1);
    }

    /// Records `n` consumed CQ events (the arm sequence number is 2 bits:
    /// only `n` mod 4 matters).
    pub fn events_consumed(&mut self, n: u32) {
        self.arm_sn = self.arm_sn.wrapping_add(n & 3);
    }
}
