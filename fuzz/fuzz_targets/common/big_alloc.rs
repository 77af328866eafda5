//! A global allocator for the deep fuzz targets that keeps a few large
//! freed blocks for reuse instead of returning them to ASan.
//!
//! Why: under AddressSanitizer, a block above ASan's size classes (about
//! 128 KiB) is served by a fresh `mmap` and returned with `munmap`, so
//! every large allocation costs one page fault per page touched. A target
//! that builds a submission service per input (`rdd_submit_create`
//! allocates about 1.3 MiB at once) spent 44% of its CPU time in the
//! kernel doing exactly that. Here a freed block of at least [`MIN`]
//! bytes is parked in one of [`SLOTS`] slots and handed back to the next
//! allocation of exactly the same size and alignment.
//!
//! What ASan still sees: a parked block is poisoned, so any access to it
//! between its free and its reuse is reported as a use-after-poison (the
//! same bug as a use-after-free, reported under another name); its
//! redzones are the ones ASan gave it, so overflows past either end are
//! reported as before. What is lost: ASan's quarantine for these blocks
//! (a stale pointer used after the block was handed out again reads live
//! memory) and the fill of fresh allocations (`malloc_fill_byte`, first
//! 4 KiB only anyway). Zeroed allocations from the cache are zeroed here.
//!
//! Without ASan (the `cargo fuzz coverage` build) the cache is off: every
//! call goes straight to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Blocks at least this big are cached.
pub const MIN: usize = 64 << 10;
/// Parked blocks at most (more are returned to the system allocator).
pub const SLOTS: usize = 16;

#[cfg(sanitize = "address")]
extern "C" {
    fn __asan_poison_memory_region(addr: *const u8, size: usize);
    fn __asan_unpoison_memory_region(addr: *const u8, size: usize);
}

/// One parked block: address (0: empty), size and alignment.
#[derive(Clone, Copy)]
struct Parked {
    ptr: usize,
    size: usize,
    align: usize,
}

const EMPTY: Parked = Parked {
    ptr: 0,
    size: 0,
    align: 0,
};

/// The allocator: `#[global_allocator] static A: BigCache = BigCache::new();`.
pub struct BigCache {
    busy: AtomicBool,
    slots: UnsafeCell<[Parked; SLOTS]>,
}

// SAFETY: `slots` is only touched while `busy` is held (see `with`).
unsafe impl Sync for BigCache {}

impl BigCache {
    pub const fn new() -> BigCache {
        BigCache {
            busy: AtomicBool::new(false),
            slots: UnsafeCell::new([EMPTY; SLOTS]),
        }
    }

    /// Runs `f` on the slots under the spin lock (the targets are single-
    /// threaded; device threads may allocate too, so it must be a lock).
    fn with<R>(&self, f: impl FnOnce(&mut [Parked; SLOTS]) -> R) -> R {
        // Acquire: the slots written by the last holder are visible here.
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: `busy` is held, so no other reference to the slots exists.
        let r = f(unsafe { &mut *self.slots.get() });
        // Release: this holder's slot writes are visible to the next one.
        self.busy.store(false, Ordering::Release);
        r
    }

    /// A parked block of exactly `l`'s size and alignment, unpoisoned.
    fn take(&self, l: Layout) -> Option<*mut u8> {
        if !cfg!(sanitize = "address") || l.size() < MIN {
            return None;
        }
        let p = self.with(|s| {
            let i = s
                .iter()
                .position(|b| b.ptr != 0 && b.size == l.size() && b.align == l.align())?;
            Some(std::mem::replace(&mut s[i], EMPTY).ptr as *mut u8)
        })?;
        #[cfg(sanitize = "address")]
        // SAFETY: `p` is a live ASan block of `l.size()` bytes that this
        // cache owned and poisoned; it is handed out again now.
        unsafe {
            __asan_unpoison_memory_region(p, l.size())
        };
        Some(p)
    }

    /// Parks `p` (a block of layout `l`); false when it is not cacheable
    /// or every slot is taken.
    fn park(&self, p: *mut u8, l: Layout) -> bool {
        if !cfg!(sanitize = "address") || l.size() < MIN {
            return false;
        }
        self.with(|s| {
            let Some(slot) = s.iter_mut().find(|b| b.ptr == 0) else {
                return false;
            };
            #[cfg(sanitize = "address")]
            // SAFETY: `p` is a live block of `l.size()` bytes its owner
            // just freed; poisoning it makes every later access until
            // it is handed out again an ASan report.
            unsafe {
                __asan_poison_memory_region(p, l.size())
            };
            *slot = Parked {
                ptr: p as usize,
                size: l.size(),
                align: l.align(),
            };
            true
        })
    }
}

impl Default for BigCache {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block handed out is either the system allocator's for
// this layout or a parked one of exactly this size and alignment that no
// one else holds (it left its slot under the lock); `dealloc` parks a
// block only while its slot is empty, or gives it back to the system.
unsafe impl GlobalAlloc for BigCache {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        match self.take(l) {
            Some(p) => p,
            // SAFETY: same contract as ours (`l` has a non-zero size).
            None => unsafe { System.alloc(l) },
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        match self.take(l) {
            // SAFETY: `p` is valid for writes of `l.size()` bytes.
            Some(p) => unsafe {
                p.write_bytes(0, l.size());
                p
            },
            // SAFETY: same contract as ours.
            None => unsafe { System.alloc_zeroed(l) },
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if !self.park(p, l) {
            // SAFETY: `p` came from `System` with layout `l` (parked
            // blocks came from it too).
            unsafe { System.dealloc(p, l) }
        }
    }
}
