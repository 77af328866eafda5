//! A pre-registered buffer pool.
//!
//! Registering memory is a system call that pins pages and programs the
//! device's translation tables: far too slow to do per I/O. A
//! [`BufferPool`] registers **one** region when it is created and hands out
//! buffers from it; nothing is registered, allocated, locked or entered in
//! the kernel on the data path.
//!
//! - **Size classes.** The region is carved into classes of equal-sized
//!   buffers at creation (powers of two from 64 B to 64 KiB by default, or
//!   a list of sizes), each class a lock-free free list (a Treiber stack
//!   of slot indices with an ABA tag, `freelist.rs`). [`BufferPool::alloc`]
//!   takes a buffer from the smallest class that fits, or from the next
//!   larger class that has one.
//! - **Least privilege.** The region is registered for local write only
//!   unless the configuration asks for more
//!   ([`PoolConfig::allow_remote_read`], [`PoolConfig::allow_remote_write`]);
//!   the buffers of a pool share its keys.
//! - **Safe hand-back.** A [`PoolBuf`] is a non-`Clone` token that borrows
//!   its pool: it goes back when dropped (or by [`BufferPool::free`]), so
//!   it cannot be freed twice, and the pool cannot be dropped while one is
//!   out. Freeing a buffer into a pool it does not come from is refused
//!   with [`Error::NoSuchObject`]. (C callers hold plain copies; there a
//!   per-slot generation check refuses double and foreign frees, see
//!   `rdd_pool_free`.)
//!
//!   ```compile_fail
//!   # use rdma_direct::{api::*, pool::*, soft::SoftDevice};
//!   # let pd = Device::new(SoftDevice::new(Default::default())).alloc_pd()?;
//!   let pool = BufferPool::new(&pd, &PoolConfig::buffers_per_class(1))?;
//!   let buf = pool.alloc(64)?;
//!   pool.free(buf)?;
//!   pool.free(buf)?; // error: use of moved value (no double free)
//!   # Ok::<(), rdma_direct::Error>(())
//!   ```
//!
//!   ```compile_fail
//!   # use rdma_direct::{api::*, pool::*, soft::SoftDevice};
//!   # let pd = Device::new(SoftDevice::new(Default::default())).alloc_pd()?;
//!   let pool = BufferPool::new(&pd, &PoolConfig::buffers_per_class(1))?;
//!   let buf = pool.alloc(64)?;
//!   drop(pool); // error: `pool` is still borrowed by `buf`
//!   drop(buf);
//!   # Ok::<(), rdma_direct::Error>(())
//!   ```
//! - **Huge pages** ([`PoolConfig::huge_pages`]): the region is mapped with
//!   `MAP_HUGETLB` (2 MiB pages, fewer IOTLB/MTT entries). Its size must
//!   be a multiple of 2 MiB, and the system must have free huge pages
//!   (`/proc/sys/vm/nr_hugepages`); otherwise creation fails with
//!   [`Error::HugePagesUnavailable`].
//! - **Statistics** ([`BufferPool::stats`], [`BufferPool::class_stats`]):
//!   relaxed counters, updated on every alloc and free.
//!
//! As with any registered memory, the device reads and writes a buffer on
//! behalf of posted work: keep a buffer until the completions that cover
//! its use have been polled, then drop it. A buffer's contents when handed
//! out are whatever its previous holder left (zero the first time).
//!
//! ```
//! use rdma_direct::api::*;
//! use rdma_direct::pool::{BufferPool, PoolConfig};
//! use rdma_direct::soft::SoftDevice;
//!
//! let dev = Device::new(SoftDevice::new(Default::default()));
//! let pd = dev.alloc_pd()?;
//! // 64 B ..= 64 KiB classes, 1 MiB in all, peers may RDMA WRITE into it.
//! let pool = BufferPool::new(&pd, &PoolConfig::total_bytes(1 << 20).allow_remote_write())?;
//! let mut buf = pool.alloc(100)?; // a 128-byte buffer
//! buf.as_mut_slice().copy_from_slice(&[7; 100]);
//! let sge = buf.sge(); // for a local work request
//! let remote = buf.remote(); // for the peer
//! assert_eq!((sge.length, sge.lkey, remote.rkey), (100, pool.lkey(), pool.rkey()));
//! assert_eq!(pool.stats().bytes_in_use, 128);
//! drop(buf); // back to the pool
//! assert_eq!(pool.stats().buffers_in_use, 0);
//! # Ok::<(), rdma_direct::Error>(())
//! ```

mod freelist;
mod region;
mod slab;

use core::fmt;
use core::ptr::NonNull;
use std::vec::Vec;

use crate::api::{Backend, MrKeys, Pd, RawMr};
use crate::attr::Access;
use crate::error::{Error, Result};
use crate::wr::{Remote, Sge};

pub(crate) use slab::{Grant, Slab};

/// The huge page size a huge-page pool is mapped with (2 MiB).
pub const HUGE_PAGE_SIZE: usize = region::HUGE_PAGE;
/// The smallest class size, and the granule of every class size: classes
/// are multiples of 64 bytes, so buffers never share a cache line.
pub const MIN_CLASS_SIZE: usize = 64;
/// The largest class size (1 GiB; one SGE carries less than 2 GiB).
pub const MAX_CLASS_SIZE: usize = 1 << 30;
/// The most size classes a pool can have.
pub const MAX_CLASSES: usize = 64;
/// The default classes: powers of two from this ...
pub const DEFAULT_MIN_CLASS: usize = 64;
/// ... to this (64 KiB).
pub const DEFAULT_MAX_CLASS: usize = 64 << 10;

/// The class sizes of a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ClassSizes {
    /// Every power of two from `min` to `max`.
    PowersOfTwo { min: usize, max: usize },
    /// These sizes.
    List(Vec<usize>),
}

/// How many buffers each class gets.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sizing {
    /// A region of this many bytes, split evenly (by bytes) between the
    /// classes; the remainder of each share is left unused.
    TotalBytes(usize),
    /// This many buffers in every class.
    Each(u32),
    /// One count per class, smallest class first.
    Counts(Vec<u32>),
}

/// What a [`BufferPool`] is made of. Start from [`PoolConfig::total_bytes`],
/// [`PoolConfig::buffers_per_class`] or [`PoolConfig::with_counts`], then
/// adjust:
///
/// ```
/// use rdma_direct::pool::PoolConfig;
/// let cfg = PoolConfig::buffers_per_class(256)
///     .size_classes(512, 8192) // 512 B, 1 KiB, ..., 8 KiB
///     .allow_remote_read();
/// ```
///
/// Rules (checked by [`BufferPool::new`], [`Error::InvalidAttribute`]
/// otherwise): 1 to [`MAX_CLASSES`] distinct class sizes, each a multiple
/// of [`MIN_CLASS_SIZE`] and at most [`MAX_CLASS_SIZE`]; every class gets
/// at least one buffer; fewer than 2^32 buffers in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    sizes: ClassSizes,
    sizing: Sizing,
    access: Access,
    huge_pages: bool,
}

impl PoolConfig {
    fn with(sizing: Sizing) -> PoolConfig {
        PoolConfig {
            sizes: ClassSizes::PowersOfTwo {
                min: DEFAULT_MIN_CLASS,
                max: DEFAULT_MAX_CLASS,
            },
            sizing,
            access: Access::LOCAL_WRITE,
            huge_pages: false,
        }
    }

    /// A region of `bytes`, split evenly between the classes (class `k`
    /// gets `bytes / classes / size_k` buffers). Default classes: powers of
    /// two from 64 B to 64 KiB. Local write access only.
    pub fn total_bytes(bytes: usize) -> PoolConfig {
        PoolConfig::with(Sizing::TotalBytes(bytes))
    }

    /// `n` buffers in every class (the region is exactly their sum).
    pub fn buffers_per_class(n: u32) -> PoolConfig {
        PoolConfig::with(Sizing::Each(n))
    }

    /// `counts[k]` buffers in class `k`, smallest class first (one count
    /// per class of the final configuration).
    pub fn with_counts(counts: &[u32]) -> PoolConfig {
        PoolConfig::with(Sizing::Counts(counts.to_vec()))
    }

    /// Classes of every power of two from `min` to `max` bytes.
    pub fn size_classes(mut self, min: usize, max: usize) -> PoolConfig {
        self.sizes = ClassSizes::PowersOfTwo { min, max };
        self
    }

    /// Classes of exactly these sizes (any order; multiples of 64 bytes).
    pub fn class_sizes(mut self, sizes: &[usize]) -> PoolConfig {
        self.sizes = ClassSizes::List(sizes.to_vec());
        self
    }

    /// Lets peers RDMA READ the pool's buffers (with the pool's rkey).
    pub fn allow_remote_read(mut self) -> PoolConfig {
        self.access = self.access | Access::REMOTE_READ;
        self
    }

    /// Lets peers RDMA WRITE into the pool's buffers (with the pool's
    /// rkey).
    pub fn allow_remote_write(mut self) -> PoolConfig {
        self.access = self.access | Access::REMOTE_WRITE;
        self
    }

    /// Backs the region with 2 MiB huge pages (`MAP_HUGETLB`) instead of
    /// the heap. The region size must be a multiple of 2 MiB.
    pub fn huge_pages(mut self, on: bool) -> PoolConfig {
        self.huge_pages = on;
        self
    }

    /// The access the region will be registered with: always
    /// `LOCAL_WRITE`, plus what was allowed.
    pub fn access(&self) -> Access {
        self.access
    }
}

/// Counters of one size class. A relaxed snapshot: while other threads
/// allocate, the fields may come from slightly different moments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Buffer size of the class.
    pub size: usize,
    /// Buffers in the class.
    pub capacity: u32,
    /// Buffers handed out.
    pub in_use: u32,
    /// Buffers free (`capacity - in_use`).
    pub free: u32,
    /// Most buffers handed out at once since creation.
    pub high_water: u32,
    /// Sum of the lengths asked for by the buffers handed out.
    pub bytes_requested: u64,
}

impl ClassStats {
    /// Internal fragmentation of the buffers handed out:
    /// `1 - bytes_requested / (in_use * size)` (0 when none is out).
    pub fn fragmentation(&self) -> f64 {
        fragmentation(
            self.bytes_requested,
            u64::from(self.in_use) * self.size as u64,
        )
    }
}

/// Totals over a pool (a relaxed snapshot, as [`ClassStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Size of the registered region.
    pub region_bytes: usize,
    /// Buffers handed out.
    pub buffers_in_use: u64,
    /// Bytes of the buffers handed out (their class sizes).
    pub bytes_in_use: u64,
    /// Bytes asked for by the buffers handed out.
    pub bytes_requested: u64,
}

impl PoolStats {
    /// Internal fragmentation: `1 - bytes_requested / bytes_in_use` (0
    /// when nothing is handed out).
    pub fn fragmentation(&self) -> f64 {
        fragmentation(self.bytes_requested, self.bytes_in_use)
    }
}

fn fragmentation(requested: u64, in_use: u64) -> f64 {
    if in_use == 0 {
        0.0
    } else {
        1.0 - requested as f64 / in_use as f64
    }
}

/// Plans `cfg`, makes its region, has `register` register it, and carves
/// it.
///
/// `register` gets the region's address, length and access and returns
/// whatever keeps the registration (plus its keys). The caller must drop
/// that value, which deregisters, **before** the returned [`Slab`] (which
/// frees the region).
pub(crate) fn build<R>(
    cfg: &PoolConfig,
    register: impl FnOnce(NonNull<u8>, usize, Access) -> Result<(R, MrKeys)>,
) -> Result<(R, Slab)> {
    let plan = slab::Plan::new(cfg)?;
    let region = if cfg.huge_pages {
        region::Region::huge(plan.len)?
    } else {
        region::Region::heap(plan.len)?
    };
    let (reg, keys) = register(region.base(), plan.len, cfg.access)?;
    Ok((reg, Slab::new(&plan, region, keys, cfg.access)))
}

/// A registered region carved into size classes, handing out buffers
/// without registering, allocating or locking. `Sync`: share it (in an
/// `Arc`, or by reference) between threads that allocate and free at once.
pub struct BufferPool<B: Backend> {
    // Field order is drop order: deregister first, then free the region.
    mr: RawMr<B>,
    slab: Slab,
}

impl<B: Backend> BufferPool<B> {
    /// Allocates the region (the heap, or huge pages), registers it once
    /// in `pd` with [`PoolConfig::access`], and carves it into the
    /// configured classes.
    ///
    /// Errors: [`Error::InvalidAttribute`] (a configuration that breaks the
    /// rules of [`PoolConfig`]), [`Error::HugePagesUnavailable`] (huge
    /// pages asked for and the size is not a multiple of 2 MiB, or the
    /// system has none free), [`Error::ResourceExhausted`] (out of memory),
    /// or the device's registration error.
    pub fn new(pd: &Pd<B>, cfg: &PoolConfig) -> Result<BufferPool<B>> {
        let (mr, slab) = build(cfg, |base, len, access| {
            // SAFETY: the region lives in the Slab, which the BufferPool
            // drops after this registration (field order).
            let mr = unsafe { pd.register_raw(base.as_ptr(), len, access) }?;
            let keys = mr.keys();
            Ok((mr, keys))
        })?;
        Ok(BufferPool { mr, slab })
    }

    /// A buffer of at least `len` bytes, from the smallest class that fits
    /// and has a free buffer. Lock-free; no allocation or system call.
    ///
    /// Errors: [`Error::InvalidAttribute`] for `len` 0 or above the largest
    /// class; [`Error::ResourceExhausted`] when the fitting class and every
    /// larger one are empty.
    #[inline]
    pub fn alloc(&self, len: usize) -> Result<PoolBuf<'_>> {
        let grant = self.slab.alloc(len)?;
        Ok(PoolBuf {
            slab: &self.slab,
            grant,
        })
    }

    /// Gives a buffer back (as dropping it does). A buffer of another pool
    /// is [`Error::NoSuchObject`]; it still goes back to its own pool.
    #[inline]
    pub fn free(&self, buf: PoolBuf<'_>) -> Result<()> {
        if !core::ptr::eq(buf.slab, &self.slab) {
            return Err(Error::NoSuchObject);
        }
        drop(buf);
        Ok(())
    }

    /// Totals (relaxed counters).
    pub fn stats(&self) -> PoolStats {
        self.slab.stats()
    }

    /// Counters of class `k` (smallest first); `None` past the last class.
    pub fn class_stats(&self, k: usize) -> Option<ClassStats> {
        self.slab.class_stats(k)
    }

    /// Counters of every class, smallest first.
    pub fn all_class_stats(&self) -> Vec<ClassStats> {
        (0..self.slab.class_count())
            .filter_map(|k| self.slab.class_stats(k))
            .collect()
    }

    /// Number of size classes.
    pub fn class_count(&self) -> usize {
        self.slab.class_count()
    }

    /// The largest buffer the pool hands out.
    pub fn max_buffer_size(&self) -> usize {
        self.slab.max_size()
    }

    /// The local key every buffer of the pool uses.
    pub fn lkey(&self) -> u32 {
        self.mr.keys().lkey
    }

    /// The remote key peers use for the pool's buffers (meaningful only
    /// with remote access).
    pub fn rkey(&self) -> u32 {
        self.mr.keys().rkey
    }

    /// The access the region is registered with.
    pub fn access(&self) -> Access {
        self.slab.access()
    }

    /// Start address of the region.
    pub fn region_addr(&self) -> u64 {
        self.slab.region().base().as_ptr() as u64
    }

    /// Length of the region in bytes.
    pub fn region_len(&self) -> usize {
        self.slab.region().len()
    }

    /// True if the region is backed by huge pages.
    pub fn is_huge_pages(&self) -> bool {
        self.slab.region().is_huge()
    }
}

impl<B: Backend> fmt::Debug for BufferPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("region_addr", &format_args!("{:#x}", self.region_addr()))
            .field("region_len", &self.region_len())
            .field("classes", &self.class_count())
            .field("lkey", &self.lkey())
            .field("access", &self.access())
            .field("huge_pages", &self.is_huge_pages())
            .finish()
    }
}

/// A buffer from a [`BufferPool`]: its own bytes of the registered region
/// until it is dropped (or given to [`BufferPool::free`]), which returns it
/// to the pool. Not `Clone`; borrows the pool.
///
/// The device accesses the bytes on behalf of work posted with
/// [`PoolBuf::sge`] or [`PoolBuf::remote`]: keep the buffer until that
/// work's completion has been polled.
pub struct PoolBuf<'a> {
    slab: &'a Slab,
    grant: Grant,
}

impl PoolBuf<'_> {
    /// Start address (local SGE address, and remote address for a peer).
    #[inline(always)]
    pub fn addr(&self) -> u64 {
        self.grant.ptr.as_ptr() as u64
    }

    /// The length asked for.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.grant.len as usize
    }

    /// Always false (a buffer has at least one byte).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.grant.len == 0
    }

    /// The buffer's real size: its class size (at least [`PoolBuf::len`]).
    #[inline(always)]
    pub fn capacity(&self) -> usize {
        self.slab.class_size(self.grant.class) as usize
    }

    /// The local key (the pool's).
    #[inline(always)]
    pub fn lkey(&self) -> u32 {
        self.slab.keys().lkey
    }

    /// The remote key (the pool's).
    #[inline(always)]
    pub fn rkey(&self) -> u32 {
        self.slab.keys().rkey
    }

    /// An SGE covering the requested length.
    #[inline(always)]
    pub fn sge(&self) -> Sge {
        Sge::new(self.addr(), self.grant.len, self.lkey())
    }

    /// An SGE for `len` bytes at `offset` (the device checks the bounds
    /// against the region when the work request executes; stay within
    /// [`PoolBuf::capacity`]).
    #[inline(always)]
    pub fn sge_at(&self, offset: usize, len: u32) -> Sge {
        Sge::new(self.addr().wrapping_add(offset as u64), len, self.lkey())
    }

    /// The remote address of the buffer's first byte, for a peer.
    #[inline(always)]
    pub fn remote(&self) -> Remote {
        Remote::new(self.addr(), self.rkey())
    }

    /// The remote address of byte `offset`.
    #[inline(always)]
    pub fn remote_at(&self, offset: usize) -> Remote {
        Remote::new(self.addr().wrapping_add(offset as u64), self.rkey())
    }

    /// The requested bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: this buffer owns `len <= capacity` bytes at `ptr` inside
        // the live region (the pool outlives `'a`), handed over by the free
        // list's Release/Acquire pair; no other buffer covers them.
        unsafe { core::slice::from_raw_parts(self.grant.ptr.as_ptr(), self.len()) }
    }

    /// The requested bytes, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the access unique.
        unsafe { core::slice::from_raw_parts_mut(self.grant.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for PoolBuf<'_> {
    #[inline]
    fn drop(&mut self) {
        // Cannot fail: the grant is live and only this token holds it.
        let _ = self
            .slab
            .free(self.grant.class, self.grant.index, self.grant.gen);
    }
}

impl fmt::Debug for PoolBuf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("lkey", &self.lkey())
            .finish()
    }
}

// SAFETY: a PoolBuf owns its bytes exclusively (the free list handed the
// slot to it alone), and the pool it borrows is Sync, so moving it to
// another thread (and dropping it there) is fine.
unsafe impl Send for PoolBuf<'_> {}
// SAFETY: `&PoolBuf` only gives shared access to the bytes (`as_slice`)
// and reads the pool's immutable fields.
unsafe impl Sync for PoolBuf<'_> {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::api::Device;
    use crate::soft::SoftDevice;

    fn pd() -> Pd<SoftDevice> {
        Device::new(SoftDevice::new(Default::default()))
            .alloc_pd()
            .unwrap()
    }

    #[test]
    fn pool_is_sync_and_buffers_are_send() {
        fn shared<T: Send + Sync>() {}
        shared::<BufferPool<SoftDevice>>();
        shared::<PoolBuf<'static>>();
    }

    #[test]
    fn least_privilege_by_default() {
        assert_eq!(PoolConfig::total_bytes(1).access(), Access::LOCAL_WRITE);
        assert_eq!(
            PoolConfig::total_bytes(1)
                .allow_remote_read()
                .allow_remote_write()
                .access(),
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
        );
        let pd = pd();
        let pool = BufferPool::new(&pd, &PoolConfig::buffers_per_class(1)).unwrap();
        assert_eq!(pool.access(), Access::LOCAL_WRITE);
        assert_eq!(pool.class_count(), 11);
        assert_eq!(pool.max_buffer_size(), 64 << 10);
        assert_eq!(pool.region_len(), (128 << 10) - 64);
        assert_eq!(pool.region_addr() % 4096, 0);
        assert!(!pool.is_huge_pages());
    }

    #[test]
    fn buffers_carry_the_pool_keys_and_bytes() {
        let pd = pd();
        let pool =
            BufferPool::new(&pd, &PoolConfig::buffers_per_class(2).size_classes(64, 128)).unwrap();
        let mut a = pool.alloc(65).unwrap();
        assert_eq!((a.len(), a.capacity()), (65, 128));
        assert!(!a.is_empty());
        assert_eq!(a.addr() % 128, 0);
        a.as_mut_slice().fill(0xab);
        assert_eq!(a.as_slice(), &[0xab; 65][..]);
        let s = a.sge();
        assert_eq!((s.addr, s.length, s.lkey), (a.addr(), 65, pool.lkey()));
        let s = a.sge_at(64, 64);
        assert_eq!((s.addr, s.length), (a.addr() + 64, 64));
        let r = a.remote_at(8);
        assert_eq!((r.addr, r.rkey), (a.addr() + 8, pool.rkey()));
        assert_eq!(a.remote().addr, a.addr());
        let st = pool.stats();
        assert_eq!((st.bytes_in_use, st.bytes_requested), (128, 65));
        assert!((st.fragmentation() - (1.0 - 65.0 / 128.0)).abs() < 1e-12);
        pool.free(a).unwrap();
        assert_eq!(
            pool.stats(),
            PoolStats {
                region_bytes: 2 * (64 + 128),
                ..PoolStats::default()
            }
        );
        assert_eq!(pool.stats().fragmentation(), 0.0);
    }

    #[test]
    fn foreign_free_is_refused_and_the_buffer_goes_home() {
        let pd = pd();
        let cfg = PoolConfig::buffers_per_class(1).size_classes(64, 64);
        let p1 = BufferPool::new(&pd, &cfg).unwrap();
        let p2 = BufferPool::new(&pd, &cfg).unwrap();
        let b = p1.alloc(1).unwrap();
        assert_eq!(p2.free(b), Err(Error::NoSuchObject));
        assert_eq!(p1.stats().buffers_in_use, 0);
        assert_eq!(p2.stats().buffers_in_use, 0);
        assert!(p1.alloc(1).is_ok());
    }

    #[test]
    fn huge_pages_need_a_2mib_multiple() {
        let pd = pd();
        let r = BufferPool::new(&pd, &PoolConfig::buffers_per_class(1).huge_pages(true));
        assert_eq!(r.unwrap_err(), Error::HugePagesUnavailable);
    }
}
