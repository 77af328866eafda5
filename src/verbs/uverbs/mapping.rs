//! Ring mappings: a shared mapping of the command fd, and a mapped ring
//! with its geometry ([`RingView`]), checked before anyone indexes it.

use core::ptr::NonNull;

use super::command::errno;
use super::layout::RXE_DATA_OFFSET;
use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use crate::verbs::fail;

// ---------------------------------------------------------------------------
// Mappings.

/// One shared mapping of the command fd (a ring), unmapped on drop.
pub(super) struct Mapping {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

impl Mapping {
    /// `mmap(NULL, len, RW, MAP_SHARED, fd, offset)`.
    fn new(fd: i32, offset: u64, len: usize) -> Result<Mapping> {
        if len == 0 || offset > i64::MAX as u64 {
            return Err(Error::InvalidGeometry);
        }
        // SAFETY: a fresh shared mapping chosen by the kernel; it aliases no
        // Rust object. The kernel checks `offset` and `len` against the
        // object it names.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(fail("uverbs mmap", errno()));
        }
        match NonNull::new(p.cast::<u8>()) {
            Some(ptr) => Ok(Mapping { ptr, len }),
            None => Err(Error::ProviderError),
        }
    }

    /// Reads a u32 of the mapping (device-shared memory: one volatile read).
    fn read_u32(&self, off: usize) -> Option<u32> {
        if off.checked_add(4)? > self.len || off % 4 != 0 {
            return None;
        }
        // SAFETY: in bounds (checked above), 4-aligned (page-aligned base,
        // aligned offset), and the mapping stays valid while `self` lives.
        Some(unsafe { self.ptr.as_ptr().add(off).cast::<u32>().read_volatile() })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: this mapping was made by `Mapping::new` with this length
        // and is unmapped exactly once, here. Errors cannot be acted upon.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The page size (4096 if sysconf fails).
fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `n` rounded up to whole pages (None on overflow).
fn page_round(n: usize) -> Option<usize> {
    let p = page_size();
    Some(n.checked_add(p - 1)? & !(p - 1))
}

/// Where a ring is, how big, and how it is divided. The pointers stay
/// valid while the [`UverbsCq`](super::UverbsCq)/[`UverbsQp`](super::UverbsQp) that returned it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingView {
    /// Start of the mapping (rxe: the `rxe_queue_buf` header; siw: the
    /// first element).
    pub ptr: NonNull<u8>,
    /// Length of the mapping in bytes.
    pub len: usize,
    /// Byte offset of slot 0 from `ptr` (rxe 384, siw 0).
    pub data_offset: usize,
    /// Number of slots (a power of two).
    pub slots: u32,
    /// Bytes per slot.
    pub elem_size: u32,
    /// Entries the ring can hold at once: rxe `slots - 1` (one slot tells
    /// full from empty), siw `slots`.
    pub capacity: u32,
}

/// A mapped ring with its geometry.
pub(super) struct Ring {
    pub(super) map: Mapping,
    data_offset: usize,
    slots: u32,
    elem_size: u32,
    pub(super) capacity: u32,
}

impl Ring {
    pub(super) fn view(&self) -> RingView {
        RingView {
            ptr: self.map.ptr,
            len: self.map.len,
            data_offset: self.data_offset,
            slots: self.slots,
            elem_size: self.elem_size,
            capacity: self.capacity,
        }
    }

    /// Maps an rxe queue (`mminfo` from the driver response) and checks
    /// its header: the kernel wrote it, so it is validated before anyone
    /// indexes with it (docs/spec/rxe.md §2).
    pub(super) fn map_rxe(fd: i32, mi: &k::mminfo) -> Result<Ring> {
        let map = Mapping::new(fd, mi.offset, mi.size as usize)?;
        let log2 = map.read_u32(0).ok_or(Error::InvalidGeometry)?;
        let mask = map.read_u32(4).ok_or(Error::InvalidGeometry)?;
        let slots = mask.checked_add(1).ok_or(Error::InvalidGeometry)?;
        if !(4..=16).contains(&log2) || !slots.is_power_of_two() {
            return Err(Error::InvalidGeometry);
        }
        let data = (slots as usize)
            .checked_shl(log2)
            .and_then(|d| d.checked_add(RXE_DATA_OFFSET))
            .ok_or(Error::InvalidGeometry)?;
        if data > map.len {
            return Err(Error::InvalidGeometry);
        }
        Ok(Ring {
            map,
            data_offset: RXE_DATA_OFFSET,
            slots,
            elem_size: 1 << log2,
            capacity: mask,
        })
    }

    /// Maps a siw queue of `num` elements of `elem` bytes plus `extra`
    /// trailing bytes at `key`; the length rounds up to whole pages, as
    /// the driver requires (docs/spec/kernels.md).
    pub(super) fn map_siw(fd: i32, key: u64, num: u32, elem: usize, extra: usize) -> Result<Ring> {
        if num == 0 || !num.is_power_of_two() || key == u64::from(k::SIW_INVAL_UOBJ_KEY) {
            return Err(Error::InvalidGeometry);
        }
        let len = (num as usize)
            .checked_mul(elem)
            .and_then(|b| b.checked_add(extra))
            .and_then(page_round)
            .ok_or(Error::InvalidGeometry)?;
        Ok(Ring {
            map: Mapping::new(fd, key, len)?,
            data_offset: 0,
            slots: num,
            elem_size: elem as u32,
            capacity: num,
        })
    }
}
