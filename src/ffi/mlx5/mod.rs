//! The raw mlx5 queue API: send, receive and completion queues over memory
//! described by `mlx5dv_init_obj`, with their handles in caller storage.
//!
//! This is the DPDK-style level: the caller owns the verbs objects (PD, CQ,
//! QP and their state transitions) and hands in the raw queue
//! descriptions; these functions format WQEs, ring doorbells and poll CQEs
//! with no allocation and no system calls.

// Declaration order is the header's order (cbindgen follows it), so each
// `mod` stands alone (rustfmt sorts a group).
mod storage;

mod desc;

mod wc;

mod shapes;

mod sq;

mod wr_check;

mod rq;

mod srq;

mod ud;

mod ops;

mod burst;

mod cq;

mod bound;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_ops;

use core::mem::{align_of, size_of};

use crate::ffi::status::rdd_status;

pub use bound::*;
pub use burst::*;
pub use cq::*;
pub use desc::*;
pub use ops::*;
pub use rq::*;
pub use sq::*;
pub use srq::*;
pub use storage::*;
pub use ud::*;
pub use wc::*;
pub use wr_check::*;

// ---------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------

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
