//! Small std-only helpers shared by the software device, the safe API and
//! the test utilities.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// A zeroed, page-aligned heap buffer: the stand-in for memory a device
/// driver would allocate (queue buffers, doorbell records, UAR pages) and
/// for registered application buffers.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    /// `len` zeroed bytes aligned to 4096 (at least 64 bytes are allocated).
    pub fn new(len: usize) -> AlignedBuf {
        let layout =
            Layout::from_size_align(len.max(64), 4096).expect("buffer size overflows a Layout");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, layout }
    }
    /// Base pointer.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    /// Always false (the buffer has at least 64 bytes).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The bytes. Callers must ensure no device writes concurrently.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: owned allocation of `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
    /// The bytes, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: owned allocation of `len` initialised bytes, borrowed
        // mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
    /// Fills every byte with `v`.
    pub fn fill(&mut self, v: u8) {
        self.bytes_mut().fill(v);
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: plain owned heap memory; all shared access goes through raw
// pointers whose users synchronise (doorbell records, CQE owner bytes).
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` only hands out the pointer and shared
// byte views whose callers guarantee no concurrent writers.
unsafe impl Sync for AlignedBuf {}
