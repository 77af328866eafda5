//! The object-level C API: device, protection domain, memory region,
//! completion queue and queue pair as library-owned objects behind opaque
//! handles (features `ffi` + `soft`).
//!
//! # Handles
//!
//! A handle (`rdd_device *`, `rdd_pd *`, `rdd_mr *`, `rdd_cq *`,
//! `rdd_qp *`, `rdd_srq *`, `rdd_ah *`) is *not* the address of the object: it is an encoded slot
//! reference, `generation << 32 | index << 8 | kind`, cast to a pointer
//! type so C keeps its type checking. The library never dereferences a
//! handle. Every call decodes it and checks it against a global slot table
//! whose slots are never freed:
//!
//! - a handle of the wrong kind, with an index that was never allocated,
//!   or whose generation does not match the slot's (the object was
//!   destroyed, the slot possibly reused) is `RDD_STATUS_INVALID_HANDLE`;
//! - any value at all is safe to pass: there is no pointer to chase, so a
//!   stale or forged handle cannot cause undefined behaviour (a forged
//!   value that happens to name a live object of the right kind acts on
//!   that object; a destroyed handle is only mistaken for a new one after
//!   its slot was reused 2^32 times).
//!
//! Each slot carries one atomic state word (generation, kind, live bit, an
//! exclusive bit and a reader count). A call *acquires* the handles it
//! uses, shared (getters, creating children) or exclusive (posting,
//! polling, arming, connecting, destroying), with one compare-and-swap on
//! the slot's own cache line, and releases them on return. The data path
//! therefore takes no lock; the global mutex guards only slot allocation.
//! A handle that another thread holds in a conflicting mode at that moment
//! gives `RDD_STATUS_RESOURCE_BUSY` (a broken threading contract is
//! reported, never undefined behaviour).
//!
//! Parents know their children through reference counts (an `Arc` each
//! child holds), so destroying a device with PDs or CQs, a PD with MRs or
//! QPs or address handles, or a CQ with QPs returns `RDD_STATUS_RESOURCE_BUSY` and changes
//! nothing.

use core::mem::{align_of, size_of};
use core::ptr;

use crate::attr::Access;
use crate::ffi::status::rdd_status;

mod types;

mod table;

mod objects;

mod device;
mod pd_mr;

mod cq;
mod events;

mod mlx5_desc;
mod qp;
mod qp_destroy;
mod qp_query;
mod recover;

mod post;

mod srq;
mod srq_route;

mod ud;
mod ud_ops;

mod ops;
mod poll_n;

#[cfg(test)]
mod ops_driver_tests;
#[cfg(test)]
mod ops_tests;
#[cfg(test)]
mod recover_tests;
#[cfg(test)]
mod srq_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod ud_tests;

pub use cq::*;
pub use device::*;
pub use events::*;
pub use ops::*;
pub use pd_mr::*;
pub use poll_n::*;
pub use post::*;
pub use qp::*;
pub use qp_destroy::*;
pub use qp_query::*;
pub use recover::*;
pub use srq::*;
pub use types::*;
pub use ud::*;
pub use ud_ops::*;

pub(super) use objects::{MrObj, PdObj};
pub(super) use post::post_library_wr;
pub(super) use table::{excl, insert, shared, Object, KIND_EXPOSURE, KIND_POOL};
pub(super) use table::{KIND_MESH, KIND_TCP_AG};

// ---------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------

#[inline(always)]
pub(super) fn h<T>(p: *const T) -> usize {
    p.addr()
}

#[inline(always)]
pub(super) fn as_handle<T>(h: usize) -> *mut T {
    ptr::without_provenance_mut(h)
}

/// Writes `v` to a caller's out-parameter.
///
/// # Safety
/// `out` is non-NULL and valid for a write of one `T`.
#[inline(always)]
pub(super) unsafe fn put<T>(out: *mut T, v: T) {
    // SAFETY: caller contract; unaligned writes accept any address.
    unsafe { out.write_unaligned(v) }
}

/// Checks a C array parameter: non-NULL (`NULL_PARAMETER`), aligned for
/// `T` and small enough to address (`INVALID_ARGUMENT`).
#[inline(always)]
fn check_array<T>(p: *const T, n: usize) -> Result<(), rdd_status> {
    if p.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if p as usize % align_of::<T>() != 0 || n > isize::MAX as usize / size_of::<T>() {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(())
}

fn access_from(bits: u32) -> Result<Access, rdd_status> {
    if bits & !Access::ALL.0 != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(Access(bits))
}
