//! Multi-producer posting into one send queue, without a lock.
//!
//! The send queue is a ring of `cnt` basic blocks (BBs) counted by three
//! free-running `u32` counters, `retired <= published <= reserved`:
//!
//! - **reserve**: a producer claims `nbb` BBs with a CAS on `reserved`,
//!   after checking against `retired` that they are free (a full queue is
//!   a typed error, never a wait);
//! - **write**: it writes its WQE and side-table entry into those BBs, in
//!   parallel with other producers;
//! - **mark ready**: it stores the WQE's end counter into the ready word of
//!   its first BB (Release);
//! - **publish**: WQEs are published strictly in order. Whichever thread
//!   finds the next WQE after `published` ready advances `published` over
//!   the contiguous ready prefix and rings the doorbell once for all of it.
//!   Only one thread rings at a time: a request counter (`db_requests`)
//!   elects the ringer, and a ringer that sees new requests when it wants
//!   to stop scans again, so no ready WQE is ever left unpublished
//!   (doorbells coalesce; nobody waits for anybody).
//! - **lists**: a producer that posts several WQEs claims the BBs of all of
//!   them (the longest prefix that fits) with one CAS, marks each WQE ready
//!   as soon as it is written, and requests one doorbell after the last.
//!   So a list costs the same three shared read-modify-writes as a single
//!   WQE, and producers write their lists' WQEs in parallel.
//! - **retire**: the single completion poller moves `retired` forward when
//!   a completion names a published WQE (in order: a completion for WQE X
//!   retires everything before X as well).
//!
//! Orderings (each is also commented where it is used):
//! - producer `ready.store(Release)` → ringer `ready.load(Acquire)`: the
//!   ringer (and the device it rings for) sees the whole WQE;
//! - producer `db_requests.fetch_add(AcqRel)` → ringer's failed
//!   `compare_exchange(Acquire)`: a request made while a ringer is active
//!   is seen by that ringer's next scan;
//! - ringer `published.store(Release)` → poller `published.load(Acquire)`:
//!   side-table entries of published WQEs are visible to the poller;
//! - poller `retired.store(Release)` → producer `retired.load(Acquire)`:
//!   the poller's reads of a side-table entry happen before a producer
//!   reuses it.
//!
//! The loom models in `loom_tests.rs` explore producers, a model
//! device and the poller together, including one deliberately broken
//! ordering that the model must catch.

use core::ptr::NonNull;

use crate::sync::{AtomicU32, Ordering, UnsafeCell};

/// A value on its own 64-byte cache line, so counters written by different
/// threads do not share a line with each other or with read-only fields.
#[repr(align(64))]
struct Line<T>(T);

impl<T> core::ops::Deref for Line<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Why a reservation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

/// The shared counters and per-BB ready words of a multi-producer ring.
///
/// `S` is the doorbell state that only the current ringer touches (the
/// BlueFlame offset, the signalling guard, ...).
pub struct MpRing<S> {
    cnt: u32,
    mask: u32,
    /// Largest WQE in BBs (bounds a plausible ready value).
    max_nbb: u32,
    reserved: Line<AtomicU32>,
    published: Line<AtomicU32>,
    retired: Line<AtomicU32>,
    /// Doorbell requests since the current ringer last looked; 0 = no
    /// ringer.
    db_requests: Line<AtomicU32>,
    /// `ready[i]`: end counter of the WQE starting at BB `i` (this lap).
    ready: NonNull<AtomicU32>,
    /// Owned by the current ringer.
    state: UnsafeCell<S>,
}

// SAFETY: all shared mutable state is atomics; `state` is only accessed by
// the single elected ringer (see `publish`), and the ready array is owned
// by the ring (constructor contract).
unsafe impl<S: Send> Send for MpRing<S> {}
// SAFETY: as above; every `&self` method is safe to call concurrently
// except `retire`, whose single-caller rule is part of its contract.
unsafe impl<S: Send> Sync for MpRing<S> {}

impl<S> MpRing<S> {
    /// A ring of `cnt` BBs (a power of two, at most 2^15) whose WQEs span
    /// at most `max_nbb` BBs, with all counters at `start`.
    ///
    /// # Safety
    /// `ready` points to `cnt` atomics owned by this ring for its life,
    /// all holding `start` (any value not in `start+1..=start+max_nbb`
    /// works).
    pub unsafe fn new(
        cnt: u32,
        max_nbb: u32,
        start: u32,
        ready: NonNull<AtomicU32>,
        state: S,
    ) -> MpRing<S> {
        debug_assert!(cnt.is_power_of_two() && max_nbb >= 1 && max_nbb <= cnt);
        MpRing {
            cnt,
            mask: cnt - 1,
            max_nbb,
            reserved: Line(AtomicU32::new(start)),
            published: Line(AtomicU32::new(start)),
            retired: Line(AtomicU32::new(start)),
            db_requests: Line(AtomicU32::new(0)),
            ready,
            state: UnsafeCell::new(state),
        }
    }

    /// Ring size in BBs.
    #[inline]
    pub fn cnt(&self) -> u32 {
        self.cnt
    }

    #[inline(always)]
    fn ready_word(&self, bb: u32) -> &AtomicU32 {
        // SAFETY: the index is masked into the ring's `cnt` ready words,
        // which live as long as `self` (constructor contract).
        unsafe { &*self.ready.as_ptr().add((bb & self.mask) as usize) }
    }

    /// Claims `nbb` BBs; returns the first. `Err(Full)` if they are not all
    /// free (retired). The caller then owns BBs `start..start+nbb` and must
    /// eventually call [`MpRing::publish`] with them.
    #[inline]
    pub fn reserve(&self, nbb: u32) -> Result<u32, Full> {
        self.reserve_prefix(1, |_| nbb).map(|(start, _)| start)
    }

    /// Claims, with one compare-exchange, the BBs of the longest prefix of
    /// `n` WQEs (WQE `i` spans `nbb(i)` BBs) that is free; returns the
    /// first BB and how many WQEs (at least 1) were claimed. `Err(Full)`
    /// if not even the first fits. The caller owns every claimed BB and
    /// must mark each claimed WQE ready ([`MpRing::mark_ready`]) and then
    /// request a doorbell.
    #[inline(always)]
    pub fn reserve_prefix(
        &self,
        n: usize,
        nbb: impl Fn(usize) -> u32,
    ) -> Result<(u32, usize), Full> {
        let total: u32 = (0..n).map(&nbb).sum();
        // Relaxed: the CAS below only hands out disjoint ranges; the data
        // ordering comes from the Acquire load of `retired`.
        let mut r = self.reserved.load(Ordering::Relaxed);
        loop {
            // Acquire pairs with the poller's Release store in `retire`: its
            // reads of the side-table entries of retired WQEs happen before
            // we overwrite them.
            let ret = self.retired.load(Ordering::Acquire);
            let used = r.wrapping_sub(ret);
            if used > self.cnt {
                // `r` is older than `ret` (another producer moved on and the
                // poller retired past our snapshot): take a fresh one.
                r = self.reserved.load(Ordering::Relaxed);
                continue;
            }
            let avail = self.cnt - used;
            let (take, k) = if total <= avail {
                (total, n)
            } else {
                // The longest prefix that fits (the first WQE may not).
                let (mut take, mut k) = (0, 0);
                while k < n && take + nbb(k) <= avail {
                    take += nbb(k);
                    k += 1;
                }
                (take, k)
            };
            if k == 0 {
                return Err(Full);
            }
            // Relaxed on both sides: see above.
            match self.reserved.compare_exchange_weak(
                r,
                r.wrapping_add(take),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok((r, k)),
                Err(cur) => r = cur,
            }
        }
    }

    /// Marks the WQE at `start..end` (written in full) ready, and makes
    /// sure it gets published: either this thread becomes the ringer and
    /// calls `ring(state, from, to, last)` for every contiguous range it
    /// publishes (`last` = first BB of the range's last WQE), or the
    /// current ringer is told to look again.
    ///
    /// `ring` runs with exclusive access to the doorbell state, after
    /// `published` already covers `to`; it must ring the doorbell for
    /// `from..to`.
    #[inline]
    pub fn publish(&self, start: u32, end: u32, ring: impl FnMut(&mut S, u32, u32, u32)) {
        self.mark_ready(start, end);
        self.request_doorbell(ring);
    }

    /// Marks the WQE at `start..end` (written in full) ready without
    /// asking for a doorbell. A producer that posts several WQEs marks
    /// each one and then calls [`MpRing::request_doorbell`] once: a ringer
    /// may publish the first ones before the last is marked, and the
    /// closing request makes sure the rest are published too.
    #[inline(always)]
    pub fn mark_ready(&self, start: u32, end: u32) {
        // Release: the WQE bytes and side-table entry written before this
        // are visible to the ringer that acquires this word.
        self.ready_word(start).store(end, Ordering::Release);
    }

    /// A deliberately broken [`MpRing::publish`] (Relaxed instead of
    /// Release), for the loom test that proves the model catches it.
    #[cfg(all(loom, test))]
    fn publish_broken(&self, start: u32, end: u32, ring: impl FnMut(&mut S, u32, u32, u32)) {
        self.ready_word(start).store(end, Ordering::Relaxed);
        self.request_doorbell(ring);
    }

    /// Asks for a doorbell over whatever is ready (see [`MpRing::publish`]).
    #[inline]
    pub fn request_doorbell(&self, mut ring: impl FnMut(&mut S, u32, u32, u32)) {
        // AcqRel: Release makes our ready store visible to a ringer that
        // reads our increment; Acquire, when we become the ringer (old
        // value 0), makes the previous ringer's state writes visible to us.
        if self.db_requests.fetch_add(1, Ordering::AcqRel) != 0 {
            // A ringer is active; its closing compare-exchange will see our
            // increment and make it scan again.
            return;
        }
        let mut claimed = 1;
        loop {
            // Only the ringer writes `published`; Relaxed is enough to read
            // our own or the previous ringer's value (ordered by the
            // db_requests hand-over above).
            let from = self.published.load(Ordering::Relaxed);
            let mut to = from;
            let mut last = from;
            loop {
                // Acquire pairs with the producer's Release in `publish`.
                let end = self.ready_word(to).load(Ordering::Acquire);
                let n = end.wrapping_sub(to);
                if n == 0 || n > self.max_nbb {
                    break;
                }
                last = to;
                to = end;
            }
            if to != from {
                // Release pairs with the poller's Acquire in `retire`:
                // side-table entries below `to` are complete. Stored before
                // the doorbell, so no completion can precede it.
                self.published.store(to, Ordering::Release);
                // SAFETY: only the elected ringer reaches this point, and
                // ringers are serialised by `db_requests` (a new ringer is
                // only elected after this one's compare-exchange to 0).
                self.state
                    .with_mut(|s| ring(unsafe { &mut *s }, from, to, last));
            }
            // AcqRel: Release hands the doorbell state to the next ringer;
            // on failure, Acquire makes the ready stores of the producers
            // whose requests we now claim visible to the next scan.
            match self
                .db_requests
                .compare_exchange(claimed, 0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => claimed = now,
            }
        }
    }

    /// Published counter (for the poller's validation and for tests).
    #[inline]
    pub fn published(&self) -> u32 {
        // Acquire: see `retire`.
        self.published.load(Ordering::Acquire)
    }

    /// Retired counter.
    #[inline]
    pub fn retired(&self) -> u32 {
        // Acquire: pairs with the Release in `retire` (for readers other
        // than the poller).
        self.retired.load(Ordering::Acquire)
    }

    /// Free BBs (a snapshot).
    #[inline]
    pub fn free(&self) -> u32 {
        let r = self.reserved.load(Ordering::Relaxed);
        self.cnt.saturating_sub(r.wrapping_sub(self.retired()))
    }

    /// Completes the published WQE whose first BB has 16-bit index
    /// `counter`, and everything before it: `end_of(start)` reads the
    /// WQE's side-table entry and returns its end counter if the entry is
    /// valid for `start`. Returns the WQE's first BB, or `None` (nothing
    /// changed) if the counter names no published, unretired WQE.
    ///
    /// # Safety
    /// Only one thread may retire (the completion poller of this queue).
    #[inline(always)]
    pub unsafe fn retire(
        &self,
        counter: u16,
        end_of: impl FnOnce(u32) -> Option<u32>,
    ) -> Option<u32> {
        // Acquire pairs with the ringer's Release store: entries below
        // `published` are fully written.
        let published = self.published.load(Ordering::Acquire);
        // Relaxed: only this thread stores `retired`.
        let retired = self.retired.load(Ordering::Relaxed);
        let dist = (counter as u32).wrapping_sub(retired) & 0xffff;
        if dist >= published.wrapping_sub(retired) {
            return None;
        }
        let start = retired.wrapping_add(dist);
        let end = end_of(start)?;
        if end.wrapping_sub(start).wrapping_sub(1) >= self.max_nbb
            || end.wrapping_sub(retired) > published.wrapping_sub(retired)
        {
            return None;
        }
        // Release pairs with the producers' Acquire in `reserve`: our reads
        // of the retired entries happen before they are reused.
        self.retired.store(end, Ordering::Release);
        Some(start)
    }

    /// Resets every counter to `start` (QP reset). Needs `&mut`: no
    /// producer or poller may be active.
    pub fn reset(&mut self, start: u32) {
        self.reserved = Line(AtomicU32::new(start));
        self.published = Line(AtomicU32::new(start));
        self.retired = Line(AtomicU32::new(start));
        for i in 0..self.cnt {
            self.ready_word(i).store(start, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(all(loom, test))]
mod loom_tests;
