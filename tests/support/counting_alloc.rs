//! A counting global allocator for tests that prove a data path allocates
//! nothing: it forwards to the system allocator and counts the calls made
//! by each thread (tests run in parallel threads, and device threads
//! allocate on their own, so each test checks only its own thread's count).
//! Including this module installs it as the test binary's allocator.

use std::alloc::{GlobalAlloc, Layout, System};

struct Counting;

thread_local! {
    // A const-initialised Cell needs no allocation itself.
    static MINE: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Allocations (and reallocations) made by the calling thread so far.
pub fn mine() -> usize {
    MINE.with(|c| c.get())
}

fn count() {
    let _ = MINE.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards every call to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
