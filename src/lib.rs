//! # rdma-direct
//!
//! An RDMA data path for Rust, C and C++ programs: it writes work-queue
//! entries straight into the provider's send queue, rings the doorbell
//! itself and polls the completion queue directly, with no allocation,
//! lock or system call when posting and polling on mlx5.
//!
//! ## Where to start
//!
//! - **[`api`]**, the safe Rust API: [`api::Device`] → [`api::Pd`] →
//!   [`api::Mr`], [`api::Cq`] → [`api::Qp`], with [`SendWr`] and
//!   [`RecvWr`] to post and [`api::Wc`] to poll. Its module page has a
//!   complete, compiled example on the software device.
//! - [`soft::SoftDevice`], the in-process software HCA and the default
//!   backend: everything runs without RDMA hardware.
//! - `verbs::VerbsDevice` (feature `verbs`): real kernel devices through
//!   libibverbs, with rdma-direct's own rings on rxe and siw and the mlx5
//!   core on ConnectX (`mlx5dv_init_obj`).
//! - [`bootstrap`]: a mesh of connected QPs among many ranks (MPI, or
//!   the built-in TCP rendezvous), through an allgather.
//! - [`pool`], [`expose`] and [`credit`]: pre-registered buffers,
//!   revocable exposure of memory to peers, credit-based flow control.
//! - [`ring::submit`]: the MPSC submission ring a poll-mode service
//!   embeds.
//! - The C ABI is in [`ffi`] and `include/rdma_direct.h`; its conventions
//!   are in `docs/c-api.md`.
//!
//! ## The core
//!
//! Below the API sits the `no_std`, allocation-free core, which builds for
//! `x86_64-unknown-none` and `aarch64-unknown-none`:
//! - [`wr`]: typed work requests and their validation (typed errors,
//!   never a panic);
//! - [`provider::mlx5`], [`provider::rxe`], [`provider::siw`]: the queue
//!   formats, WQE encoders, queue accounting and completion pollers;
//! - [`ring`]: lock-free multi-producer posting and submission rings,
//!   model-checked with loom;
//! - [`mmio`]: every volatile access, doorbell and named barrier.
//!
//! `docs/architecture.md` in the repository explains the layers and
//! their one-way dependencies; `docs/spec/` documents each provider's
//! queue formats.
//!
//! Supported architectures: x86_64 and aarch64 (barriers are
//! architecture-specific; other targets compile with compiler-only
//! barriers and are not supported for hardware use).
#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

pub mod error;
// Work completions, status and opcode codes, QP state: what every
// provider's poller reports.
pub mod completion;
// Attributes every backend shares (access rights, QP sizes, address
// vectors, state changes).
pub mod attr;
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

// Connecting a mesh of QPs among many ranks through an allgather (MPI,
// or the built-in TCP rendezvous).
#[cfg(feature = "soft")]
pub mod bootstrap;

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
#[cfg_attr(docsrs, doc(cfg(feature = "verbs")))]
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
