//! rxe (Soft-RoCE) user-mapped queues: the send queue, the receive queue
//! and the completion queue as the kernel shares them with the process
//! (docs/spec/rxe.md).
//!
//! Every rxe queue is one `mmap` of the uverbs command fd: a 384-byte
//! header ([`layout::RxeQueueHeader`]: element size, index mask, producer
//! and consumer indices on separate cache lines) followed by
//! `index_mask + 1` elements of `1 << log2_elem_size` bytes (docs/spec/rxe.md §2).
//! Indices are stored masked. The side that produces owns the producer
//! word, the other side the consumer word; each side loads the other's
//! index with acquire and publishes its own with release.
//!
//! These types only format and decode the shared memory. Creating the
//! queues (uverbs commands, `mmap`) and the send doorbell (an empty
//! `POST_SEND` command, docs/spec/rxe.md §6) belong to the caller: [`RxeSendQueue::post`]
//! says when that doorbell is due.
//!
//! The header and every index the kernel hands back are untrusted: the
//! geometry is validated once at construction and kept privately, and each
//! index read from the mapping is masked before use.

pub mod cq;
pub mod layout;
pub mod rq;
pub mod sq;

#[cfg(test)]
mod tests;

pub use cq::RxeCq;
pub use rq::RxeRecvQueue;
pub use sq::{Posted, RxeSendQueue, RxeUdDest};

use core::ptr::NonNull;

use crate::error::{Error, Result};
use crate::sync::AtomicU32;
use layout::{CONSUMER_OFFSET, HEADER_SIZE, LOG2_ELEM_MAX, MAX_SLOTS, PRODUCER_OFFSET};

/// A validated view of one rxe queue mapping: header plus element array
/// (docs/spec/rxe.md §2).
///
/// The geometry (`log2_elem_size`, `index_mask`) is read once from the
/// header at construction, checked, and never read again, so a later write
/// to those header words cannot move any access outside the mapping.
#[derive(Debug)]
pub struct RxeQueue {
    base: NonNull<u8>,
    /// `slots - 1`.
    mask: u32,
    /// log2 of the element size.
    log2_elem: u32,
}

// SAFETY: the view is a pointer into a mapping that the constructor's
// contract keeps alive; every access through it is an atomic on a header
// word or a raw access to an element the owning queue has the right to
// touch. Moving it to another thread moves that right with it.
unsafe impl Send for RxeQueue {}

impl RxeQueue {
    /// Validates the header of the rxe queue mapped at `ptr` (`len`
    /// bytes) and returns a view of it. `min_elem` is the smallest element
    /// size the caller needs (the WQE or CQE header plus its SGEs or inline
    /// payload).
    ///
    /// Checks: `ptr` non-null and 8-aligned; `len >= 384`;
    /// `min_elem <= 1 << log2_elem_size <= 64 KiB`; `index_mask + 1` a
    /// power of two in `2..=2^24`; `384 + (slots << log2_elem_size) <= len`.
    /// Any failure is [`Error::InvalidGeometry`].
    ///
    /// # Safety
    /// `ptr` must point to `len` readable and writable bytes holding an
    /// rxe queue buffer whose header the kernel has initialised (the
    /// mapping of a create response's `mminfo`), valid for as long as the
    /// returned view or any queue built on it is used.
    pub unsafe fn new(ptr: *mut u8, len: usize, min_elem: usize) -> Result<RxeQueue> {
        let base = NonNull::new(ptr).ok_or(Error::InvalidGeometry)?;
        if ptr as usize % 8 != 0 || len < HEADER_SIZE {
            return Err(Error::InvalidGeometry);
        }
        // Relaxed: the kernel wrote both words before the create command
        // returned and never changes them; the command and the mmap system
        // calls order those writes before anything this process does with
        // the mapping. Atomics because the page is shared.
        // SAFETY: offsets 0 and 4 are inside the header (len >= 384) and
        // 4-aligned (ptr is 8-aligned).
        let (log2, mask) = unsafe {
            (
                word(base, 0).load(crate::sync::Ordering::Relaxed),
                word(base, 4).load(crate::sync::Ordering::Relaxed),
            )
        };
        if log2 > LOG2_ELEM_MAX || (1usize << log2) < min_elem || (1usize << log2) < 8 {
            return Err(Error::InvalidGeometry);
        }
        let slots = mask.wrapping_add(1);
        if slots < 2 || !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(Error::InvalidGeometry);
        }
        // slots <= 2^24 and log2 <= 16: the product fits in a u64.
        let data = (slots as u64) << log2;
        if data > (len - HEADER_SIZE) as u64 {
            return Err(Error::InvalidGeometry);
        }
        Ok(RxeQueue {
            base,
            mask,
            log2_elem: log2,
        })
    }

    /// Slots in the ring (`index_mask + 1`).
    #[inline]
    pub fn slots(&self) -> u32 {
        self.mask + 1
    }

    /// Elements the ring can hold at once: one slot always stays empty
    /// (full is `(prod + 1) & mask == cons`, docs/spec/rxe.md §2).
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.mask
    }

    /// The index mask (`slots - 1`).
    #[inline]
    pub fn index_mask(&self) -> u32 {
        self.mask
    }

    /// log2 of the element size.
    #[inline]
    pub fn log2_elem_size(&self) -> u32 {
        self.log2_elem
    }

    /// Element size in bytes.
    #[inline]
    pub fn elem_size(&self) -> usize {
        1usize << self.log2_elem
    }

    /// Base of the mapping (the header).
    #[inline]
    pub fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Address of element `index & mask`.
    #[inline(always)]
    pub fn slot_ptr(&self, index: u32) -> *mut u8 {
        let off = HEADER_SIZE + (((index & self.mask) as usize) << self.log2_elem);
        // SAFETY: the masked index is below `slots`, and the constructor
        // checked `384 + (slots << log2) <= len`: the element lies inside
        // the mapping.
        unsafe { self.base.as_ptr().add(off) }
    }

    /// The producer-index word.
    #[inline(always)]
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: offset 128 of the header (constructor: len >= 384), 4-aligned.
        unsafe { word(self.base, PRODUCER_OFFSET) }
    }

    /// The consumer-index word.
    #[inline(always)]
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: offset 256 of the header (constructor: len >= 384), 4-aligned.
        unsafe { word(self.base, CONSUMER_OFFSET) }
    }
}

/// The shared header word at byte `off` of the mapping, as an atomic.
///
/// # Safety
/// `off + 4` must lie inside the mapping, `base + off` must be 4-aligned,
/// and the mapping must outlive `'a`.
#[inline(always)]
unsafe fn word<'a>(base: NonNull<u8>, off: usize) -> &'a AtomicU32 {
    // SAFETY: caller contract; `AtomicU32` has the size and alignment of a
    // `u32`, and every access to the word (ours and the kernel's) is
    // atomic, so no reference to non-atomic data is formed.
    unsafe { &*base.as_ptr().add(off).cast::<AtomicU32>() }
}

/// Reads a `T` from element memory (a field of a WQE the caller owns or a
/// CQE the kernel has published).
///
/// # Safety
/// `p` must be valid for reads of `T` and suitably aligned.
#[inline(always)]
unsafe fn read_at<T: Copy>(p: *const u8, off: usize) -> T {
    // SAFETY: caller contract.
    unsafe { p.add(off).cast::<T>().read() }
}
