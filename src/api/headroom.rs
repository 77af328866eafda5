//! The run-time headroom check of CQs that opted out of the sizing guard,
//! and the counts of completions a list of send WRs will produce.

use crate::sync::Ordering;
use crate::wr::SendWr;

/// Completions expected on a CQ that opted out of the sizing guard and
/// not yet polled: the run-time headroom check (shared with the C object
/// API). Counted only while the CQ is unguarded.
pub(crate) struct Headroom {
    capacity: u64,
    inflight: core::sync::atomic::AtomicU64,
}

impl Headroom {
    /// An empty account for a CQ of `capacity` entries.
    pub(crate) fn new(capacity: u64) -> Headroom {
        Headroom {
            capacity,
            inflight: core::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Reserves room for up to `want` completions; returns how many fit.
    pub(crate) fn reserve(&self, want: u64) -> u64 {
        let cap = self.capacity;
        // Relaxed throughout: the counter publishes no memory, it is only
        // arithmetic; the CAS keeps concurrent posters on one CQ from both
        // taking the last room.
        let mut cur = self.inflight.load(Ordering::Relaxed);
        loop {
            let got = want.min(cap.saturating_sub(cur));
            if got == 0 {
                return 0;
            }
            match self.inflight.compare_exchange_weak(
                cur,
                cur + got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return got,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back `n` completions' room (unused reservations, polled CQEs).
    /// Saturates at zero: a CQE nobody reserved (an error on an unsignaled
    /// WR) must not make later checks lenient.
    pub(crate) fn unreserve(&self, n: u64) {
        if n == 0 {
            return;
        }
        // Relaxed: as in `reserve`.
        let _ = self
            .inflight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(n))
            });
    }
}

/// Signaled WRs among `wrs` (each will produce a completion).
pub(crate) fn signaled(wrs: &[SendWr<'_>]) -> u64 {
    wrs.iter()
        .filter(|w| w.flags.contains(crate::wr::SendFlags::SIGNALED))
        .count() as u64
}

/// The longest prefix of `wrs` whose signaled WRs, plus `extra`, fit in
/// `room` completions.
pub(crate) fn fitting_prefix(wrs: &[SendWr<'_>], extra: u64, room: u64) -> usize {
    let mut used = extra;
    if used > room {
        return 0;
    }
    for (i, w) in wrs.iter().enumerate() {
        if w.flags.contains(crate::wr::SendFlags::SIGNALED) {
            used += 1;
            if used > room {
                return i;
            }
        }
    }
    wrs.len()
}
