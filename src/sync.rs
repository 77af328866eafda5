//! The synchronisation shim (docs/architecture.md §6): every atomic, cell and spin
//! hint used by the crate's rings and shared indices comes from here. Under
//! `cfg(all(loom, test))` (the in-crate loom models) they are loom's model-checked types; otherwise `core`'s.
//!
//! `UnsafeCell` mirrors loom's `with`/`with_mut` API so the same code
//! compiles in both worlds (as tokio's `loom` shim does).
//!
//! Device memory (doorbell records, CQE owner bytes, doorbell registers) is
//! not covered here: it lives in [`crate::mmio`], because loom cannot model
//! memory shared with hardware. The loom models stand a model device in for
//! the hardware, over these types.
#![allow(unused_imports, dead_code)] // the full shim is shared by modules that use parts of it

#[cfg(all(loom, test))]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

#[cfg(not(all(loom, test)))]
pub(crate) use core::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// Busy-wait hint.
#[cfg(not(all(loom, test)))]
pub(crate) use core::hint::spin_loop;
/// Busy-wait hint.
#[cfg(all(loom, test))]
pub(crate) use loom::hint::spin_loop;

/// An `UnsafeCell` with loom's access API.
#[cfg(all(loom, test))]
pub(crate) use loom::cell::UnsafeCell;

/// An `UnsafeCell` with loom's access API (`core` version).
#[cfg(not(all(loom, test)))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(all(loom, test)))]
impl<T> UnsafeCell<T> {
    /// A new cell.
    #[inline(always)]
    pub(crate) const fn new(v: T) -> UnsafeCell<T> {
        UnsafeCell(core::cell::UnsafeCell::new(v))
    }
    /// Shared access to the contents through a raw pointer.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    /// Exclusive access to the contents through a raw pointer.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
