//! siw (soft-iWARP) user-mapped queues: the send queue, the receive queue
//! and the completion queue as the kernel shares them with the process
//! (docs/spec/siw.md).
//!
//! siw shares no indices. Each element carries a `flags` word whose VALID
//! bit says who owns it (docs/spec/siw.md §3): the producer fills an element whose flags
//! are 0 and stores the flags last, with release; the consumer
//! acquire-loads the flags, copies the element, and hands it back by
//! storing 0. Both sides keep private free-running `u32` counters; the
//! slot of counter `c` is `c & (n - 1)` with `n` the element count from
//! the create response (a power of two).
//!
//! Creating the queues and the send doorbell (an empty `POST_SEND`
//! command, docs/spec/siw.md §4) belong to the caller: [`SiwSendQueue::post`] says when
//! that doorbell is due.

pub mod cq;
pub mod layout;
pub mod rq;
pub mod sq;

#[cfg(test)]
mod tests;

pub use cq::SiwCq;
pub use rq::SiwRecvQueue;
pub use sq::{Posted, SiwSendQueue};

use core::ptr::NonNull;

use crate::error::{Error, Result};
use crate::sync::AtomicU32;
use layout::FLAGS_WORD_OFFSET;

/// Largest element count accepted for any siw queue.
pub const MAX_ELEMENTS: u32 = 1 << 24;

/// A validated array of `n` elements of `ELEM` bytes at an 8-aligned
/// address (the common part of the three queues).
#[derive(Debug)]
struct Ring<const ELEM: usize> {
    base: NonNull<u8>,
    /// `n - 1`.
    mask: u32,
}

// SAFETY: a pointer into a mapping the owning queue's constructor contract
// keeps alive; only the owning queue uses it, and moving the queue to
// another thread moves that use with it.
unsafe impl<const ELEM: usize> Send for Ring<ELEM> {}

impl<const ELEM: usize> Ring<ELEM> {
    /// Checks `ptr` (non-null, 8-aligned), `n` (a power of two in
    /// `1..=2^24`) and `len >= n * ELEM + extra`.
    fn new(ptr: *mut u8, len: usize, n: u32, extra: usize) -> Result<Ring<ELEM>> {
        let base = NonNull::new(ptr).ok_or(Error::InvalidGeometry)?;
        if ptr as usize % 8 != 0 || n == 0 || !n.is_power_of_two() || n > MAX_ELEMENTS {
            return Err(Error::InvalidGeometry);
        }
        let need = (n as usize)
            .checked_mul(ELEM)
            .and_then(|b| b.checked_add(extra))
            .ok_or(Error::InvalidGeometry)?;
        if len < need {
            return Err(Error::InvalidGeometry);
        }
        Ok(Ring { base, mask: n - 1 })
    }

    /// Elements.
    #[inline(always)]
    fn len(&self) -> u32 {
        self.mask + 1
    }

    /// Address of the element of counter `c`.
    #[inline(always)]
    fn slot(&self, c: u32) -> *mut u8 {
        // SAFETY: the masked index is below `n`, and the constructor
        // checked that `n * ELEM` bytes lie in the mapping.
        unsafe { self.base.as_ptr().add((c & self.mask) as usize * ELEM) }
    }

    /// The flags word of the element of counter `c`.
    #[inline(always)]
    fn flags(&self, c: u32) -> &AtomicU32 {
        // SAFETY: offset 8 of an element inside the mapping; 4-aligned
        // (8-aligned base, element sizes multiples of 8).
        unsafe { flags_word(self.slot(c)) }
    }

    /// The address just past the last element.
    #[inline(always)]
    fn end(&self) -> *mut u8 {
        // SAFETY: `n * ELEM` bytes lie in the mapping (constructor); one
        // past the end is a valid pointer.
        unsafe { self.base.as_ptr().add(self.len() as usize * ELEM) }
    }
}

/// The 32-bit word holding `flags` of the element at `elem`, as an atomic
/// (see [`layout`] for why it is 32 bits wide).
///
/// # Safety
/// `elem` must be an 8-aligned element of a live siw mapping that outlives
/// `'a`.
#[inline(always)]
unsafe fn flags_word<'a>(elem: *mut u8) -> &'a AtomicU32 {
    // SAFETY: caller contract; every access to this word, ours and the
    // kernel's, is atomic.
    unsafe { &*elem.add(FLAGS_WORD_OFFSET).cast::<AtomicU32>() }
}

/// Reads a `T` at `off` in an element.
///
/// # Safety
/// `p + off` must be valid for reads of `T` and aligned, and not the
/// flags word.
#[inline(always)]
unsafe fn read_at<T: Copy>(p: *const u8, off: usize) -> T {
    // SAFETY: caller contract.
    unsafe { p.add(off).cast::<T>().read() }
}

/// Writes a `T` at `off` in an element.
///
/// # Safety
/// `p + off` must be valid for writes of `T` and aligned, and not the
/// flags word; the element must be owned by the caller (flags 0).
#[inline(always)]
unsafe fn write_at<T>(p: *mut u8, off: usize, v: T) {
    // SAFETY: caller contract.
    unsafe { p.add(off).cast::<T>().write(v) }
}
