//! The C ABI (feature `ffi`): status codes, the raw mlx5 queue API over
//! caller-provided storage, and the boundary machinery every exported
//! function goes through. The header `include/rdma_direct.h` is generated
//! from this module by the pinned cbindgen in `scripts/header.sh`.
//!
//! # Conventions (C callers)
//!
//! - Every function returns an
//!   [`crate::ffi::status::rdd_status`]: 0 is success; crate
//!   errors keep their [`crate::Error`] codes (1001..); C-ABI-only
//!   failures are 2001.. . (One exception: `rdd_mlx5_cq_poll_bound`
//!   returns an `int32_t`, the count or `-(int32_t)status`.) A status is never *read* from C as the enum:
//!   [`crate::ffi::status::rdd_status_str`] takes a plain
//!   `uint32_t` and maps unknown values.
//! - Parameters: the object first, then inputs, then outputs; a buffer is
//!   followed by its length.
//! - Every pointer parameter is checked: NULL gives
//!   `RDD_STATUS_NULL_PARAMETER` and nothing happens; array parameters
//!   must be non-NULL even when their count is 0. (A NULL pointer
//!   *inside* a work request, such as a NULL `sg_list` with `num_sge > 0`,
//!   is a work-request error, `RDD_STATUS_NULL_POINTER`.)
//! - Outputs are written only on success, with two documented exceptions
//!   that report *why* a call failed: the `out_bad_index` of the post calls
//!   (the index of the rejected work request) and the `out_n` of
//!   `rdd_status_str` on `RDD_STATUS_BUFFER_TOO_SMALL` (the size needed).
//! - Object handles (`rdd_device`, `rdd_pd`, `rdd_mr`, `rdd_cq`, `rdd_qp`;
//!   feature `soft`) are library-owned objects named by an encoded
//!   index + generation, never dereferenced: a destroyed or forged handle
//!   is `RDD_STATUS_INVALID_HANDLE`, a handle another thread is using in a
//!   conflicting way is `RDD_STATUS_RESOURCE_BUSY`, and destroying a parent
//!   that still has children is `RDD_STATUS_RESOURCE_BUSY` (see
//!   [`object`]).
//! - Queue handles live in caller storage (`rdd_mlx5_*_storage`, fixed
//!   size and alignment, see the `*_STORAGE_SIZE`/`*_ALIGN` constants).
//!   `_init` fills it, `_fini` clears it. A handle is bound to the address
//!   it was initialised at: do not copy or move the storage. A handle that
//!   was never initialised (zero the storage first for a reliable check),
//!   was finalised, or was moved is reported as
//!   `RDD_STATUS_INVALID_HANDLE`.
//! - Threading: a handle may move between threads but must not be used by
//!   two threads at once; `rdd_mlx5_cq_poll` uses the SQ and RQ handles it
//!   is given as well, `rdd_mlx5_cq_poll_bound` those bound to the CQ.
//! - Panics: the data path is designed never to panic. With `std`, every
//!   export catches a panic and returns `RDD_STATUS_PANIC` (the release
//!   profile aborts instead); without `std` a panic reaches the panic
//!   handler.
#![allow(non_camel_case_types)]

#[macro_use]
mod macros;

mod handle;

// Declaration order is the header's order: status, work requests, queues.
pub mod names;
pub mod status;
pub mod wr;

pub mod mlx5;

// The object level (library-owned device, PD, MR, CQ and QP objects behind
// validated handles) needs the software device and so `std`.
#[cfg(feature = "soft")]
pub mod expose;
#[cfg(feature = "soft")]
pub mod object;
#[cfg(feature = "soft")]
pub mod pool;
// The poll-mode submission service (`ring::submit` over an object QP).
#[cfg(feature = "soft")]
pub mod submit;
// Building a mesh of connected QPs through an allgather (`crate::bootstrap`).
#[cfg(feature = "soft")]
pub mod bootstrap;

#[cfg(feature = "soft")]
pub use bootstrap::*;
#[cfg(feature = "soft")]
pub use expose::*;
pub use mlx5::*;
pub use names::*;
#[cfg(feature = "soft")]
pub use object::*;
#[cfg(feature = "soft")]
pub use pool::*;
pub use status::*;
#[cfg(feature = "soft")]
pub use submit::*;
pub use wr::*;
