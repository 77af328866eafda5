//! Protection domain and memory region calls: allocation, registration of a
//! library-owned buffer, and the region getters.

use core::ffi::c_void;

use std::boxed::Box;
use std::sync::Arc;

use crate::attr::Access;
use crate::ffi::status::rdd_status;

use super::objects::{DeviceObj, MrBuf, MrObj, PdObj};
use super::table::{excl, insert, shared};
use super::types::{rdd_device, rdd_mr, rdd_pd, RDD_MR_MAX_LEN};
use super::{as_handle, h, put};

// ---------------------------------------------------------------------
// Protection domain
// ---------------------------------------------------------------------

/// Allocates a protection domain on `dev`.
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_pd_alloc(dev: *mut rdd_device, out: *mut *mut rdd_pd) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let pd = match d.backend.alloc_pd() {
            Ok(pd) => pd,
            Err(e) => return e.into(),
        };
        let obj = Box::new(PdObj {
            dev: h(dev),
            backend: Arc::clone(&d.backend),
            pd,
            link: Arc::new(()),
            _dev_link: Arc::clone(&d.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Frees a protection domain. `RESOURCE_BUSY` while MRs or QPs of it
/// exist.
#[no_mangle]
pub extern "C" fn rdd_pd_free(pd: *mut rdd_pd) -> rdd_status {
    ffi_boundary!({
        let p = try_status!(excl::<PdObj>(h(pd)));
        if Arc::strong_count(&p.link) != 1 {
            return rdd_status::ResourceBusy;
        }
        p.destroy();
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// Memory region
// ---------------------------------------------------------------------

/// Allocates `len` zeroed, page-aligned bytes owned by the library and
/// registers them in `pd` with exactly `access` (`RDD_ACCESS_*` bits; ask
/// only for what peers need). The buffer's address is `rdd_mr_addr`; it is
/// valid until `rdd_mr_free`.
///
/// `len` is 1..=`RDD_MR_MAX_LEN`. A length of 0 is refused on every
/// device (`ibv_reg_mr` of 0 bytes is accepted by some kernels and
/// refused by others, and nothing needs an empty region: a zero-length
/// SGE names no memory).
///
/// Errors: `NULL_PARAMETER` (`out`), `INVALID_HANDLE` (`pd`),
/// `INVALID_ARGUMENT` (unknown access bits, `len` 0 or above
/// `RDD_MR_MAX_LEN`), `INVALID_ATTRIBUTE` (remote write or atomic access
/// without `RDD_ACCESS_LOCAL_WRITE`), `RESOURCE_EXHAUSTED` (out of
/// memory), or what the device reports.
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_reg(
    pd: *mut rdd_pd,
    len: usize,
    access: u32,
    out: *mut *mut rdd_mr,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let p = try_status!(shared::<PdObj>(h(pd)));
        if access & !Access::MR_ALL.0 != 0 {
            return rdd_status::InvalidArgument;
        }
        let access = Access(access);
        if len == 0 || len > RDD_MR_MAX_LEN {
            return rdd_status::InvalidArgument;
        }
        let Some(buf) = MrBuf::new(len) else {
            return rdd_status::ResourceExhausted;
        };
        // SAFETY: `buf` moves into the MrObj, which deregisters the key
        // before the buffer is freed (Drop runs before the fields drop).
        let keys = match unsafe {
            p.backend
                .reg_mr(p.pd, buf.ptr.as_ptr() as u64, len as u64, access)
        } {
            Ok(k) => k,
            Err(e) => return e.into(),
        };
        let obj = Box::new(MrObj {
            backend: Arc::clone(&p.backend),
            pd: p.pd,
            keys,
            access,
            len,
            buf,
            link: Arc::new(()),
            pd_link: Arc::clone(&p.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Deregisters a region and frees its buffer. Work still queued that
/// names it fails with a protection or access error completion; the
/// device never touches the buffer after this returns, and neither may
/// the caller.
#[no_mangle]
pub extern "C" fn rdd_mr_free(mr: *mut rdd_mr) -> rdd_status {
    ffi_boundary!({
        let m = try_status!(excl::<MrObj>(h(mr)));
        // Exposures hold the region (free them first).
        if Arc::strong_count(&m.link) != 1 {
            return rdd_status::ResourceBusy;
        }
        m.destroy();
        rdd_status::Ok
    })
}

/// The start of the region's buffer (also the remote address of byte 0
/// for a peer, as an integer).
///
/// # Safety
/// `out_addr` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_addr(mr: *const rdd_mr, out_addr: *mut *mut c_void) -> rdd_status {
    ffi_boundary!({
        non_null!(out_addr);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_addr, m.buf.ptr.as_ptr().cast::<c_void>()) };
        rdd_status::Ok
    })
}

/// The region's length in bytes (as registered).
///
/// # Safety
/// `out_len` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_len(mr: *const rdd_mr, out_len: *mut usize) -> rdd_status {
    ffi_boundary!({
        non_null!(out_len);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_len, m.len) };
        rdd_status::Ok
    })
}

/// The local key, for SGEs of this QP's work requests.
///
/// # Safety
/// `out_lkey` is valid for a write of one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_lkey(mr: *const rdd_mr, out_lkey: *mut u32) -> rdd_status {
    ffi_boundary!({
        non_null!(out_lkey);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_lkey, m.keys.lkey) };
        rdd_status::Ok
    })
}

/// The remote key, for peers (`rdd_wr.rkey`).
///
/// # Safety
/// `out_rkey` is valid for a write of one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_rkey(mr: *const rdd_mr, out_rkey: *mut u32) -> rdd_status {
    ffi_boundary!({
        non_null!(out_rkey);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_rkey, m.keys.rkey) };
        rdd_status::Ok
    })
}
