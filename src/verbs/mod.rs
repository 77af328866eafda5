//! The verbs backend (feature `verbs`): the control path on libibverbs
//! through `rdma-sys`, for real kernel devices.
//!
//! [`VerbsDevice`] implements [`Backend`], so every program written against
//! the safe API ([`crate::api`]) runs on it unchanged: list and open
//! devices, query the port (transport, link layer, LID, GID table), PDs,
//! MRs registered with exactly the access asked for, CQs with a completion
//! channel, RC QPs and their state changes.
//!
//! The data path depends on the provider:
//! * on every provider without a direct path (rxe, siw, ...) QPs and CQs use
//!   the verbs fallback in [`path`]: `ibv_post_send` / `ibv_post_recv` with
//!   a chain of WRs per call, and `ibv_poll_cq`, behind the same
//!   [`crate::api::Qp`] calls, with the crate's WR validation and its
//!   wr_id bookkeeping (so queue space is exact and unsignaled WRs stay
//!   invisible, as on the direct path); shared receive queues and
//!   unreliable datagrams (`srq`, `ud`) exist here, and on the rxe/siw
//!   direct rings (SRQs; UD on rxe only); the mlx5 direct path refuses
//!   them with [`Error::Unsupported`];
//! * on mlx5 (ConnectX) the raw queues come from `mlx5dv_init_obj` and go
//!   to the crate's direct mlx5 core ([`mlx5`]). That needs hardware this
//!   project's CI does not have; see `docs/verbs.md`.
//!
//! Connecting QP pairs: [`oob`] exchanges connection data over TCP (and
//! speaks `ibv_rc_pingpong`'s format), [`cm`] goes through rdma_cm (the
//! only way for iWARP).
//!
//! On a host whose kernel has no RDMA support, libibverbs lists no
//! devices: [`list_devices`] returns an empty list and [`VerbsDevice::open`]
//! returns [`Error::NoDevice`].
//!
//! Every failing provider call records its name and errno for
//! [`last_error`], because [`Error`] is a plain code.
//!
//! [`Backend`]: crate::api::Backend

pub mod cm;
pub(crate) mod direct;
mod direct_create;
mod direct_srq;
mod layout_check;
pub mod mlx5;
pub mod oob;
pub mod path;
pub mod uverbs;

mod attr;
mod backend;
mod config;
mod device;
mod open;
mod srq;
mod ud;

use std::cell::Cell;

use crate::error::{Error, Result};

pub(crate) use attr::qp_attr;
use backend::random_psn;
pub use config::{DataPath, DeviceCaps, VerbsConfig};
use device::CqEntry;
pub use device::VerbsDevice;
pub use open::{list_devices, DeviceSummary};

std::thread_local! {
    static LAST: Cell<(&'static str, i32)> = const { Cell::new(("", 0)) };
}

/// The provider call that failed last on this thread, and its errno
/// (`("", 0)` if none has).
pub fn last_error() -> (&'static str, i32) {
    LAST.with(|l| l.get())
}

/// Records a failed call and maps its errno to the crate's error.
pub(crate) fn fail(op: &'static str, errno: i32) -> Error {
    LAST.with(|l| l.set((op, errno)));
    errno_error(errno)
}

/// Records a failed call whose errno is in `errno` (libibverbs' convention
/// for calls that return NULL).
pub(crate) fn fail_errno(op: &'static str) -> Error {
    fail(
        op,
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    )
}

/// Checks a libibverbs return value: 0 is success; a positive value is an
/// errno; -1 means "see errno".
pub(crate) fn check(op: &'static str, ret: i32) -> Result<()> {
    match ret {
        0 => Ok(()),
        -1 => Err(fail_errno(op)),
        r if r < 0 => Err(fail(op, -r)),
        r => Err(fail(op, r)),
    }
}

/// The crate error closest to an errno.
pub fn errno_error(errno: i32) -> Error {
    match errno {
        libc::ENOMEM | libc::ENOSPC | libc::EAGAIN => Error::ResourceExhausted,
        libc::EINVAL | libc::EOPNOTSUPP | libc::ERANGE => Error::InvalidAttribute,
        libc::EBUSY => Error::ResourceBusy,
        libc::ENODEV | libc::ENOSYS | libc::ENXIO | libc::ENOENT => Error::NoDevice,
        libc::ETIMEDOUT => Error::Timeout,
        libc::ECONNREFUSED
        | libc::ECONNRESET
        | libc::ECONNABORTED
        | libc::EHOSTUNREACH
        | libc::ENETUNREACH
        | libc::EADDRNOTAVAIL
        | libc::EPIPE => Error::ConnectFailed,
        _ => Error::ProviderError,
    }
}

/// A raw libibverbs object pointer, owned by the backend's tables.
pub(crate) struct Raw<T>(pub(crate) *mut T);
// SAFETY: libibverbs objects may be used from any thread; the tables that
// hold these pointers are behind the backend's mutex.
unsafe impl<T> Send for Raw<T> {}
