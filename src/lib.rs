//! # rdma-direct
//!
//! An allocation-free, `no_std` RDMA data path. It writes work-queue
//! entries straight into a provider's send queue, rings the doorbell
//! itself and polls the completion queue directly. mlx5 (ConnectX) first.
//!
//! Layers (see `docs/architecture.md`):
//! - [`wr`]: typed work requests and their validation (typed errors,
//!   never a panic);
//! - [`provider::mlx5`]: hand-written `#[repr(C)]` layouts, the send and
//!   receive queues (WQE formatting, doorbells, accounting) and the CQ
//!   poller;
//! - [`mmio`]: every volatile access and named barrier.
//!
//! Supported architectures: x86_64 and aarch64 (barriers are
//! architecture-specific; other targets compile with compiler-only
//! barriers and are not supported for hardware use).
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

pub mod error;
// (Modules are documented by their own `//!` comments; an outer `///`
// here would make rustdoc resolve their links from this file.)

// The C ABI (status codes, raw mlx5 queues over caller storage).
#[cfg(feature = "ffi")]
pub mod ffi;
pub mod mmio;
pub mod provider;
// Lock-free ring algorithms (multi-producer posting, submission rings),
// model-checked with loom.
pub mod ring;
/// The loom/core synchronisation shim.
pub(crate) mod sync;
// bindgen of the system `infiniband/mlx5dv.h`, for layout cross-checks.
#[cfg(feature = "verbs")]
pub mod sys;
pub mod wr;

// The safe Rust API (device, PD, MR, CQ, QP), generic over backends.
#[cfg(feature = "soft")]
pub mod api;

// Credit-based flow control for SEND/RECV.
#[cfg(feature = "soft")]
pub mod credit;

// A pre-registered buffer pool: one region registered at start-up,
// buffers handed out by a lock-free, allocation-free allocator.
#[cfg(feature = "soft")]
pub mod pool;

// Least-privilege, revocable exposure of memory to peers.
#[cfg(feature = "soft")]
pub mod expose;

// The in-process software HCA (feature `soft`).
#[cfg(feature = "soft")]
pub mod soft;

// The verbs backend: libibverbs/librdmacm control path for real kernel
// devices (feature `verbs`).
#[cfg(feature = "verbs")]
pub mod verbs;

// Completion events as file descriptors (eventfd, timed waits).
#[cfg(feature = "std")]
pub mod event;

// Std-only helpers (aligned buffers).
#[cfg(feature = "std")]
pub mod util;

#[cfg(any(test, feature = "test-utils"))]
pub mod testutil;

pub use error::{Error, PostError, Result};

/// Bare-metal builds (`target_os = "none"`, no `std`) produce a staticlib,
/// which needs a panic handler. The data path never panics by design; if
/// it somehow does, stop. Users linking the rlib into a firmware that has
/// its own handler enable `external-panic-handler`.
#[cfg(all(
    target_os = "none",
    not(feature = "std"),
    not(feature = "external-panic-handler"),
    not(test)
))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {
        core::hint::spin_loop();
    }
}
pub use wr::{MwBind, Payload, QpCaps, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};
