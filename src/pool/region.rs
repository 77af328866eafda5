//! The memory behind a pool: one page-aligned heap allocation, or one
//! anonymous mapping of 2 MiB huge pages.
//!
//! The bytes are only ever reached through raw pointers derived from
//! [`Region::base`] (each buffer's own slice, the device, C code), never
//! through a reference to the whole region, so buffers handed to
//! different threads never alias.

use core::ptr::NonNull;
use std::alloc::{alloc_zeroed, dealloc, Layout};

use crate::error::{Error, Result};

/// The huge page size the pool maps (`MAP_HUGE_2MB`).
pub const HUGE_PAGE: usize = 2 << 20;

/// Alignment of a heap-backed region.
const PAGE: usize = 4096;

/// Where the bytes come from.
enum Backing {
    /// `alloc_zeroed` with this layout.
    Heap(Layout),
    /// `mmap(MAP_HUGETLB)` of `len` bytes.
    Huge,
}

/// An owned, zeroed region of `len` bytes.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

impl Region {
    /// `len` zeroed bytes, page-aligned, from the heap. Running out of
    /// memory is [`Error::ResourceExhausted`] (never an abort).
    pub(crate) fn heap(len: usize) -> Result<Region> {
        if len == 0 {
            return Err(Error::InvalidAttribute);
        }
        let layout = Layout::from_size_align(len, PAGE).map_err(|_| Error::InvalidAttribute)?;
        // SAFETY: the layout has a non-zero size (checked above).
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(Error::ResourceExhausted)?;
        Ok(Region {
            ptr,
            len,
            backing: Backing::Heap(layout),
        })
    }

    /// `len` bytes of 2 MiB huge pages (`MAP_HUGETLB | MAP_HUGE_2MB`).
    ///
    /// [`Error::HugePagesUnavailable`] if `len` is not a positive multiple
    /// of 2 MiB (checked before asking the kernel, which would only say
    /// EINVAL), or if the kernel cannot supply the pages (none configured
    /// in `/proc/sys/vm/nr_hugepages`, or not enough free: ENOMEM).
    pub(crate) fn huge(len: usize) -> Result<Region> {
        if len == 0 || len % HUGE_PAGE != 0 {
            return Err(Error::HugePagesUnavailable);
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: an anonymous private mapping at an address of the
            // kernel's choice: no existing memory is touched; the result is
            // checked for MAP_FAILED before use.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE
                        | libc::MAP_ANONYMOUS
                        | libc::MAP_HUGETLB
                        | libc::MAP_HUGE_2MB,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::HugePagesUnavailable);
            }
            let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::HugePagesUnavailable)?;
            Ok(Region {
                ptr,
                len,
                backing: Backing::Huge,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            Err(Error::HugePagesUnavailable)
        }
    }

    /// The first byte.
    #[inline(always)]
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True if backed by huge pages.
    pub(crate) fn is_huge(&self) -> bool {
        matches!(self.backing, Backing::Huge)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `heap` with exactly this layout; the
            // pool drops its registration (and no buffer borrows it) first.
            Backing::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr(), layout) },
            Backing::Huge => {
                #[cfg(target_os = "linux")]
                {
                    // SAFETY: the mapping made in `huge`, of exactly `len`
                    // bytes, unmapped once; nothing refers to it any more
                    // (as for the heap case).
                    let _ = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
                }
            }
        }
    }
}

// SAFETY: the region is plain owned memory; `Region` itself only hands out
// the base pointer. Who may touch which bytes is decided by the pool's
// free lists (a buffer's bytes belong to the holder of its slot).
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` exposes only the address and length.
unsafe impl Sync for Region {}
