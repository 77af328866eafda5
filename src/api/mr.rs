//! Registered memory: [`Mr`], which owns its buffer, and [`RawMr`], a
//! registration of memory someone else owns.

use std::sync::Arc;

use crate::error::Result;
use crate::util::AlignedBuf;
use crate::wr::{Remote, Sge};

use super::device::PdInner;
use super::qp::Qp;
use super::{Access, Backend, MrKeys};

/// A registered memory region that owns its buffer.
///
/// The device reads and writes the buffer on behalf of posted work and of
/// peers holding the rkey (as the access flags allow). As with every RDMA
/// API, the application orders its own accesses after the completions
/// that cover the device's.
pub struct Mr<B: Backend> {
    pub(super) pd: Arc<PdInner<B>>,
    pub(super) keys: MrKeys,
    pub(super) access: Access,
    pub(super) buf: AlignedBuf,
    pub(super) len: usize,
}

impl<B: Backend> Mr<B> {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    /// Remote key (give it to peers that need access).
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    /// Access flags the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.buf.ptr() as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Registers `len` bytes at `addr` (inside this region) once more, with
    /// `access` (for [`crate::expose`]).
    ///
    /// # Safety
    /// The range lies inside this region's buffer, and the registration is
    /// deregistered ([`Mr::deregister_range`]) before the buffer is freed.
    pub(crate) unsafe fn register_range(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MrKeys> {
        // SAFETY: forwarded contract.
        unsafe { self.pd.b.reg_mr(self.pd.pd, addr, len, access) }
    }

    /// Deregisters a registration made by [`Mr::register_range`].
    pub(crate) fn deregister_range(&self, keys: MrKeys) -> Result<()> {
        self.pd.b.dereg_mr(keys.lkey)
    }

    /// True if `qp` is in this region's protection domain.
    pub(crate) fn same_pd(&self, qp: &Qp<B>) -> bool {
        Arc::ptr_eq(&self.pd, &qp.pd)
    }

    /// Allocates a type-2 memory window in this region's PD (for
    /// [`crate::expose`]); returns its key.
    pub(crate) fn alloc_window(&self) -> Result<u32> {
        self.pd.b.alloc_mw(self.pd.pd)
    }

    /// Deallocates a window made by [`Mr::alloc_window`].
    pub(crate) fn dealloc_window(&self, rkey: u32) -> Result<()> {
        self.pd.b.dealloc_mw(rkey)
    }

    /// An SGE for `len` bytes at `offset` (bounds are checked by the
    /// device when the WR executes).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge::new(self.addr().wrapping_add(offset as u64), len, self.keys.lkey)
    }
    /// The remote address of byte `offset`, for a peer.
    pub fn remote(&self, offset: usize) -> Remote {
        Remote::new(self.addr().wrapping_add(offset as u64), self.keys.rkey)
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf.bytes()[..self.len]
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf.bytes_mut()[..len]
    }
    /// Reads the 8-byte word at `offset` atomically (host order): for
    /// counters that peers update with RDMA atomics.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        // `checked_add`: an offset near `usize::MAX` must not wrap into range.
        if offset % 8 != 0 || offset.checked_add(8).is_none_or(|end| end > self.len) {
            return None;
        }
        // SAFETY: in bounds and 8-aligned (page-aligned base).
        let a =
            unsafe { core::sync::atomic::AtomicU64::from_ptr(self.buf.ptr().add(offset).cast()) };
        Some(a.load(core::sync::atomic::Ordering::SeqCst))
    }
}

impl<B: Backend> Drop for Mr<B> {
    fn drop(&mut self) {
        // Deregister before the buffer is freed (fields drop after this).
        let _ = self.pd.b.dereg_mr(self.keys.lkey);
    }
}

/// A registration of memory someone else owns ([`Pd::register_raw`]):
/// holds the PD and deregisters on drop; the owner frees the memory only
/// afterwards.
pub(crate) struct RawMr<B: Backend> {
    pub(super) pd: Arc<PdInner<B>>,
    pub(super) keys: MrKeys,
}

impl<B: Backend> RawMr<B> {
    /// The keys.
    pub(crate) fn keys(&self) -> MrKeys {
        self.keys
    }
}

impl<B: Backend> Drop for RawMr<B> {
    fn drop(&mut self) {
        let _ = self.pd.b.dereg_mr(self.keys.lkey);
    }
}
