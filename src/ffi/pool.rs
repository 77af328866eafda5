//! The buffer pool's C API (features `ffi` + `soft`): one region
//! registered once in a PD at `rdd_pool_create`, buffers handed out by a
//! lock-free allocator (see [`crate::pool`]).
//!
//! # Use
//!
//! ```c
//! rdd_pool_config cfg = {0};
//! cfg.total_bytes = 1 << 20;          // 1 MiB, classes 64 B .. 64 KiB
//! rdd_pool *pool;
//! rdd_pool_create(pd, &cfg, &pool);
//! rdd_buf b;
//! if (rdd_pool_alloc(pool, 100, &b) == RDD_STATUS_OK) {
//!     memcpy(b.addr, data, 100);       // SGE: { (uint64_t)b.addr, b.len, b.lkey }
//!     ...                              // post, poll the completion, then:
//!     rdd_pool_free(pool, &b);
//! }
//! rdd_pool_destroy(pool);
//! ```
//!
//! # Rules
//!
//! - A zeroed `rdd_pool_config` plus one sizing field is the least-privilege
//!   choice: the region is registered for local write only;
//!   `remote_access` adds `RDD_ACCESS_REMOTE_READ` and/or
//!   `RDD_ACCESS_REMOTE_WRITE` (nothing else).
//! - `rdd_buf` is a plain value; the library keeps no pointer to it. Free
//!   each buffer once, with an unmodified copy of what `rdd_pool_alloc`
//!   wrote. A second free of the same buffer, a buffer of another pool, or
//!   an edited token/address/lkey is refused with
//!   `RDD_STATUS_NO_SUCH_OBJECT` and changes nothing (each slot carries a
//!   generation that every free advances; a stale copy matches again only
//!   after 2^31 reuses of its slot).
//! - Threading: `rdd_pool_alloc`, `rdd_pool_free` and the statistics are
//!   shared uses: any number of threads may call them on one pool at once
//!   (lock-free; each call also validates the handle with one atomic
//!   update of its table slot). `rdd_pool_destroy` is exclusive.
//! - `rdd_pool_destroy` with buffers outstanding is refused with
//!   `RDD_STATUS_RESOURCE_BUSY` and changes nothing: free them first. The
//!   pool holds its PD: `rdd_pd_free` is `RESOURCE_BUSY` while it exists.

use core::ffi::c_void;
use core::mem::size_of;
use std::boxed::Box;
use std::sync::Arc;
use std::vec::Vec;

use static_assertions::const_assert_eq;

use crate::api::{Backend, MrKeys};
use crate::attr::Access;
use crate::ffi::object::{
    as_handle, excl, h, insert, put, rdd_pd, shared, Object, PdObj, KIND_POOL,
    RDD_ACCESS_REMOTE_READ, RDD_ACCESS_REMOTE_WRITE,
};
use crate::ffi::status::rdd_status;
use crate::pool::{build, PoolConfig, Slab, DEFAULT_MAX_CLASS, DEFAULT_MIN_CLASS, MAX_CLASSES};

/// A buffer pool (opaque handle): `rdd_pool_create` / `rdd_pool_destroy`.
pub struct rdd_pool {
    _private: [u8; 0],
}

/// `rdd_pool_config.flags`: back the region with 2 MiB huge pages
/// (`MAP_HUGETLB`). The region size must be a multiple of 2 MiB and the
/// system must have that many free huge pages, otherwise
/// `RDD_STATUS_HUGE_PAGES_UNAVAILABLE`.
pub const RDD_POOL_HUGE_PAGES: u32 = 0x1;

/// How `rdd_pool_create` builds a pool. Zero every field you do not set.
///
/// Classes: `num_sizes > 0` uses the `sizes` array (distinct multiples of
/// 64 bytes, any order); otherwise every power of two from `min_size` to
/// `max_size` (0: 64 and 65536). At most 64 classes of at most 1 GiB.
///
/// Sizing, exactly one of: `total_bytes` (a region of that size split
/// evenly between the classes), `buffers_per_class` (that many in every
/// class), or `counts` (one count per class, smallest class first). Every
/// class must get at least one buffer.
///
/// Errors for a bad configuration: `INVALID_ARGUMENT` (unknown `flags` or
/// `remote_access` bits, no sizing or more than one, a NULL `sizes` with
/// `num_sizes > 0`), `INVALID_ATTRIBUTE` (class sizes or counts that break
/// the rules above).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_pool_config {
    /// Region size in bytes, split evenly between the classes (0: unused).
    pub total_bytes: u64,
    /// Buffers in every class (0: unused).
    pub buffers_per_class: u32,
    /// Smallest power-of-two class (0: 64).
    pub min_size: u32,
    /// Largest power-of-two class (0: 65536).
    pub max_size: u32,
    /// Entries in `sizes` (0: powers of two from `min_size` to `max_size`).
    pub num_sizes: u32,
    /// Class sizes (read only when `num_sizes > 0`).
    pub sizes: *const u32,
    /// Buffers per class, one per class, smallest class first (NULL:
    /// unused).
    pub counts: *const u32,
    /// Remote access on top of local write: `RDD_ACCESS_REMOTE_READ`,
    /// `RDD_ACCESS_REMOTE_WRITE` or both (0: none).
    pub remote_access: u32,
    /// `RDD_POOL_*` bits.
    pub flags: u32,
}

const_assert_eq!(size_of::<rdd_pool_config>(), 48);

/// A buffer handed out by `rdd_pool_alloc`. Give an unmodified copy back
/// to `rdd_pool_free`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_buf {
    /// First byte (SGE address; remote address for a peer).
    pub addr: *mut c_void,
    /// Names the buffer for `rdd_pool_free` (opaque).
    pub token: u64,
    /// The length asked for.
    pub len: u32,
    /// The buffer's real size (its class size, at least `len`).
    pub capacity: u32,
    /// Local key (the pool's).
    pub lkey: u32,
    /// Remote key (the pool's; meaningful with remote access).
    pub rkey: u32,
}

const_assert_eq!(size_of::<rdd_buf>(), 32);

/// Pool totals (`rdd_pool_stats`), a relaxed snapshot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rdd_pool_usage {
    /// Size of the registered region.
    pub region_bytes: u64,
    /// Buffers handed out.
    pub buffers_in_use: u64,
    /// Bytes of the buffers handed out (their class sizes).
    pub bytes_in_use: u64,
    /// Bytes asked for by the buffers handed out.
    pub bytes_requested: u64,
    /// Internal fragmentation: 1 - bytes_requested / bytes_in_use (0 when
    /// nothing is handed out).
    pub fragmentation: f64,
    /// Number of size classes (`rdd_pool_class_stats` indices).
    pub num_classes: u32,
    /// 1 if the region is backed by huge pages.
    pub huge_pages: u32,
}

const_assert_eq!(size_of::<rdd_pool_usage>(), 48);

/// Counters of one size class (`rdd_pool_class_stats`), a relaxed
/// snapshot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rdd_pool_class_usage {
    /// Buffer size of the class.
    pub size: u32,
    /// Buffers in the class.
    pub capacity: u32,
    /// Buffers handed out.
    pub in_use: u32,
    /// Buffers free.
    pub free: u32,
    /// Most buffers handed out at once since creation.
    pub high_water: u32,
    /// Written as 0.
    pub reserved: u32,
    /// Bytes asked for by the buffers handed out.
    pub bytes_requested: u64,
    /// Internal fragmentation of the class's buffers in use.
    pub fragmentation: f64,
}

const_assert_eq!(size_of::<rdd_pool_class_usage>(), 40);

/// The pool's registration: deregisters on drop.
struct PoolReg {
    backend: Arc<dyn Backend>,
    lkey: u32,
}

impl Drop for PoolReg {
    fn drop(&mut self) {
        // Afterwards the device never touches the region, which the Slab
        // frees (it drops after this field).
        let _ = self.backend.dereg_mr(self.lkey);
    }
}

struct PoolObj {
    // Field order is drop order: deregister, then free the region.
    reg: PoolReg,
    slab: Slab,
    rkey: u32,
    _pd_link: Arc<()>,
}

// SAFETY: the kind value is used by this type only (object.rs lists them).
unsafe impl Object for PoolObj {
    const KIND: u8 = KIND_POOL;
}

/// Reads `n` `u32`s from a C array.
///
/// # Safety
/// `p` is valid for reads of `n` `u32`s (alignment is not required).
unsafe fn read_u32s(p: *const u32, n: usize) -> Vec<u32> {
    // SAFETY: `i < n`, in the caller's array (caller contract).
    (0..n)
        .map(|i| unsafe { p.add(i).read_unaligned() })
        .collect()
}

/// The Rust configuration for a C one.
///
/// # Safety
/// `sizes` and `counts`, when they will be read, point to as many `u32`s
/// as the configuration says.
unsafe fn config_from(c: &rdd_pool_config) -> Result<PoolConfig, rdd_status> {
    if c.flags & !RDD_POOL_HUGE_PAGES != 0
        || c.remote_access & !(RDD_ACCESS_REMOTE_READ | RDD_ACCESS_REMOTE_WRITE) != 0
    {
        return Err(rdd_status::InvalidArgument);
    }
    let sizing_fields = [
        c.total_bytes != 0,
        c.buffers_per_class != 0,
        !c.counts.is_null(),
    ];
    if sizing_fields.iter().filter(|&&b| b).count() != 1 {
        return Err(rdd_status::InvalidArgument);
    }
    let min = if c.min_size == 0 {
        DEFAULT_MIN_CLASS
    } else {
        c.min_size as usize
    };
    let max = if c.max_size == 0 {
        DEFAULT_MAX_CLASS
    } else {
        c.max_size as usize
    };
    // The classes (their number is needed to read `counts`).
    let sizes: Option<Vec<usize>> = if c.num_sizes > 0 {
        if c.sizes.is_null() {
            return Err(rdd_status::InvalidArgument);
        }
        if c.num_sizes as usize > MAX_CLASSES {
            return Err(rdd_status::InvalidAttribute);
        }
        // SAFETY: non-NULL, `num_sizes` entries (caller contract).
        let v = unsafe { read_u32s(c.sizes, c.num_sizes as usize) };
        Some(v.into_iter().map(|s| s as usize).collect())
    } else {
        if !min.is_power_of_two() || !max.is_power_of_two() || min > max {
            return Err(rdd_status::InvalidAttribute);
        }
        None
    };
    let classes = match &sizes {
        Some(v) => v.len(),
        None => (max.trailing_zeros() - min.trailing_zeros()) as usize + 1,
    };
    let cfg = if c.total_bytes != 0 {
        let Ok(total) = usize::try_from(c.total_bytes) else {
            return Err(rdd_status::InvalidAttribute);
        };
        PoolConfig::total_bytes(total)
    } else if c.buffers_per_class != 0 {
        PoolConfig::buffers_per_class(c.buffers_per_class)
    } else {
        // SAFETY: `counts` is the sizing field that is set (non-NULL), with
        // one entry per class (caller contract); `classes <= MAX_CLASSES`.
        PoolConfig::with_counts(&unsafe { read_u32s(c.counts, classes) })
    };
    let mut cfg = match &sizes {
        Some(v) => cfg.class_sizes(v),
        None => cfg.size_classes(min, max),
    };
    if c.remote_access & RDD_ACCESS_REMOTE_READ != 0 {
        cfg = cfg.allow_remote_read();
    }
    if c.remote_access & RDD_ACCESS_REMOTE_WRITE != 0 {
        cfg = cfg.allow_remote_write();
    }
    Ok(cfg.huge_pages(c.flags & RDD_POOL_HUGE_PAGES != 0))
}

/// Creates a buffer pool in `pd`: allocates its region (heap, or huge
/// pages with `RDD_POOL_HUGE_PAGES`), registers it once, and carves it
/// into size classes (see `rdd_pool_config`).
///
/// Errors: `NULL_PARAMETER`, `INVALID_HANDLE`, `INVALID_ARGUMENT` and
/// `INVALID_ATTRIBUTE` (see `rdd_pool_config`), `HUGE_PAGES_UNAVAILABLE`
/// (huge pages asked for and the region is not a multiple of 2 MiB, or the
/// system has not enough free ones), `RESOURCE_EXHAUSTED` (out of memory),
/// or the device's registration error.
///
/// # Safety
/// `cfg` is valid for reads of one `rdd_pool_config` whose arrays hold as
/// many entries as it says; `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_pool_create(
    pd: *mut rdd_pd,
    cfg: *const rdd_pool_config,
    out: *mut *mut rdd_pool,
) -> rdd_status {
    ffi_boundary!({
        non_null!(cfg, out);
        let p = try_status!(shared::<PdObj>(h(pd)));
        // SAFETY: non-NULL and readable (caller contract).
        let c = unsafe { cfg.read_unaligned() };
        // SAFETY: the arrays' lengths are the caller's contract.
        let cfg = try_status!(unsafe { config_from(&c) });
        let built = build(&cfg, |base, len, access: Access| {
            // SAFETY: the region lives in the Slab of the PoolObj, which
            // drops the registration (`reg`) before the Slab.
            let keys: MrKeys = unsafe {
                p.backend
                    .reg_mr(p.pd, base.as_ptr() as u64, len as u64, access)
            }?;
            Ok((
                PoolReg {
                    backend: Arc::clone(&p.backend),
                    lkey: keys.lkey,
                },
                keys,
            ))
        });
        let (reg, slab) = match built {
            Ok(b) => b,
            Err(e) => return e.into(),
        };
        let obj = Box::new(PoolObj {
            rkey: slab.keys().rkey,
            reg,
            slab,
            _pd_link: Arc::clone(&p.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Takes a buffer of at least `len` bytes from the smallest class that
/// fits and has a free one (lock-free; no allocation or system call) and
/// describes it in `*out`.
///
/// Errors: `INVALID_ATTRIBUTE` (`len` 0 or above the largest class),
/// `RESOURCE_EXHAUSTED` (the fitting class and every larger one are
/// empty), `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (the pool
/// is being destroyed).
///
/// # Safety
/// `out` is valid for a write of one `rdd_buf`.
#[no_mangle]
pub unsafe extern "C" fn rdd_pool_alloc(
    pool: *mut rdd_pool,
    len: usize,
    out: *mut rdd_buf,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let p = try_status!(shared::<PoolObj>(h(pool)));
        let g = match p.slab.alloc(len) {
            Ok(g) => g,
            Err(e) => return e.into(),
        };
        let b = rdd_buf {
            addr: g.ptr.as_ptr().cast::<c_void>(),
            token: g.token(),
            len: g.len,
            capacity: p.slab.class_size(g.class),
            lkey: p.reg.lkey,
            rkey: p.rkey,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, b) };
        rdd_status::Ok
    })
}

/// Gives a buffer back. `buf` must be an unmodified copy of what
/// `rdd_pool_alloc` of this pool wrote; afterwards neither the caller nor
/// the device may touch the buffer.
///
/// Errors: `NO_SUCH_OBJECT` (already freed, from another pool, or
/// modified; nothing changes), `NULL_PARAMETER`, `INVALID_HANDLE`,
/// `RESOURCE_BUSY` (the pool is being destroyed).
///
/// # Safety
/// `buf` is valid for reads of one `rdd_buf`.
#[no_mangle]
pub unsafe extern "C" fn rdd_pool_free(pool: *mut rdd_pool, buf: *const rdd_buf) -> rdd_status {
    ffi_boundary!({
        non_null!(buf);
        let p = try_status!(shared::<PoolObj>(h(pool)));
        // SAFETY: non-NULL and readable (caller contract).
        let b = unsafe { buf.read_unaligned() };
        match p.slab.free_token(b.token, b.addr as u64, b.lkey) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}

/// The pool's totals.
///
/// # Safety
/// `out` is valid for a write of one `rdd_pool_usage`.
#[no_mangle]
pub unsafe extern "C" fn rdd_pool_stats(
    pool: *const rdd_pool,
    out: *mut rdd_pool_usage,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let p = try_status!(shared::<PoolObj>(h(pool)));
        let s = p.slab.stats();
        let u = rdd_pool_usage {
            region_bytes: s.region_bytes as u64,
            buffers_in_use: s.buffers_in_use,
            bytes_in_use: s.bytes_in_use,
            bytes_requested: s.bytes_requested,
            fragmentation: s.fragmentation(),
            num_classes: p.slab.class_count() as u32,
            huge_pages: u32::from(p.slab.region().is_huge()),
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, u) };
        rdd_status::Ok
    })
}

/// The counters of class `index` (0 is the smallest; `num_classes` from
/// `rdd_pool_stats`). `INVALID_ARGUMENT` past the last class.
///
/// # Safety
/// `out` is valid for a write of one `rdd_pool_class_usage`.
#[no_mangle]
pub unsafe extern "C" fn rdd_pool_class_stats(
    pool: *const rdd_pool,
    index: u32,
    out: *mut rdd_pool_class_usage,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let p = try_status!(shared::<PoolObj>(h(pool)));
        let Some(c) = p.slab.class_stats(index as usize) else {
            return rdd_status::InvalidArgument;
        };
        let u = rdd_pool_class_usage {
            size: c.size as u32,
            capacity: c.capacity,
            in_use: c.in_use,
            free: c.free,
            high_water: c.high_water,
            reserved: 0,
            bytes_requested: c.bytes_requested,
            fragmentation: c.fragmentation(),
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, u) };
        rdd_status::Ok
    })
}

/// Deregisters the pool's region and frees it. Refused with
/// `RESOURCE_BUSY` (nothing changes) while any buffer is outstanding or
/// another thread is using the handle.
#[no_mangle]
pub extern "C" fn rdd_pool_destroy(pool: *mut rdd_pool) -> rdd_status {
    ffi_boundary!({
        let p = try_status!(excl::<PoolObj>(h(pool)));
        // Exact: the exclusive acquisition synchronised with every earlier
        // call's release of the handle.
        if p.slab.in_use() != 0 {
            return rdd_status::ResourceBusy;
        }
        p.destroy();
        rdd_status::Ok
    })
}
