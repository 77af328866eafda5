//! The baseline: a spinlock around a single-owner Qp, and the [`Poster`]
//! interface both variants post through.

use std::cell::UnsafeCell;
use std::hint::spin_loop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

use rdma_direct::api::{Qp, SharedQp};
use rdma_direct::{Error, PostError, SendWr};

use crate::Dev;

/// A [`Qp`] behind a test-and-test-and-set spinlock: lock, post or poll,
/// unlock.
pub(crate) struct SpinQp {
    locked: AtomicBool,
    qp: UnsafeCell<Qp<Dev>>,
}

// SAFETY: the `Qp` is only reached through a `SpinGuard`, and a guard
// exists only while its thread holds `locked` (acquired with Acquire,
// released with Release), so at most one thread touches the `Qp` at a
// time and each sees the previous holder's writes. `Qp` is `Send`, so
// handing it from thread to thread this way is allowed.
unsafe impl Sync for SpinQp {}

impl SpinQp {
    pub(crate) fn new(qp: Qp<Dev>) -> SpinQp {
        SpinQp {
            locked: AtomicBool::new(false),
            qp: UnsafeCell::new(qp),
        }
    }

    /// Spins until the lock is ours.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_> {
        loop {
            // Test (a plain load, so waiters share the line instead of
            // bouncing it), then test-and-set.
            if !self.locked.load(Ordering::Relaxed)
                && self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return SpinGuard { lock: self };
            }
            spin_loop();
        }
    }
}

/// Holds a [`SpinQp`]'s lock; unlocks on drop.
pub(crate) struct SpinGuard<'a> {
    lock: &'a SpinQp,
}

impl Deref for SpinGuard<'_> {
    type Target = Qp<Dev>;
    fn deref(&self) -> &Qp<Dev> {
        // SAFETY: this guard holds the lock (see `unsafe impl Sync`).
        unsafe { &*self.lock.qp.get() }
    }
}

impl DerefMut for SpinGuard<'_> {
    fn deref_mut(&mut self) -> &mut Qp<Dev> {
        // SAFETY: this guard holds the lock, and `&mut self` makes this
        // the only reference derived from it.
        unsafe { &mut *self.lock.qp.get() }
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: our accesses to the Qp happen before the next holder's.
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// What a producer posts through.
pub(crate) trait Poster: Send + Sync {
    /// One WR per call.
    fn post(&self, wr: &SendWr<'_>) -> Result<(), Error>;
    /// A list per call (`--list N`, N > 1).
    fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;
}

impl Poster for SpinQp {
    #[inline]
    fn post(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        self.lock().post_send_one(wr)
    }
    /// One lock per list: the baseline batches exactly as the lock-free
    /// queue does (one doorbell per list).
    #[inline]
    fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.lock().post_send(wrs)
    }
}

impl Poster for SharedQp<Dev> {
    #[inline]
    fn post(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        self.post_send_one(wr)
    }
    #[inline]
    fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.post_send(wrs)
    }
}

/// Posts `wrs` (one call: `post` for a single WR, `post_list` otherwise);
/// returns how many WRs were posted and the error that stopped it.
#[inline(always)]
pub(crate) fn post_some<P: Poster + ?Sized>(qp: &P, wrs: &[SendWr<'_>]) -> (usize, Option<Error>) {
    if wrs.len() == 1 {
        match qp.post(&wrs[0]) {
            Ok(()) => (1, None),
            Err(e) => (0, Some(e)),
        }
    } else {
        match qp.post_list(wrs) {
            Ok(()) => (wrs.len(), None),
            Err(e) => (e.index, Some(e.error)),
        }
    }
}
