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
//! The loom models at the end of this file explore producers, a model
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
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Doorbells rung: (from, to, last).
    type Rung = Vec<(u32, u32, u32)>;

    fn ring(cnt: u32, max_nbb: u32) -> (Vec<AtomicU32>, MpRing<Rung>) {
        let ready: Vec<AtomicU32> = (0..cnt).map(|_| AtomicU32::new(0)).collect();
        let p = NonNull::new(ready.as_ptr() as *mut AtomicU32).unwrap();
        // SAFETY: `ready` outlives the ring in every test (returned first).
        let r = unsafe { MpRing::new(cnt, max_nbb, 0, p, Vec::new()) };
        (ready, r)
    }

    #[test]
    fn publishes_in_order_and_coalesces() {
        let (_ready, r) = ring(8, 2);
        let a = r.reserve(2).unwrap();
        let b = r.reserve(1).unwrap();
        let c = r.reserve(1).unwrap();
        assert_eq!((a, b, c), (0, 2, 3));
        // b and c are ready first: nothing can be published past a.
        r.publish(b, b + 1, |s, f, t, l| s.push((f, t, l)));
        r.publish(c, c + 1, |s, f, t, l| s.push((f, t, l)));
        assert_eq!(r.published(), 0);
        r.publish(a, a + 2, |s, f, t, l| s.push((f, t, l)));
        assert_eq!(r.published(), 4);
        let rang = r.state.with(|s| {
            // SAFETY: single-threaded test, no ringer active.
            unsafe { (*s).clone() }
        });
        assert_eq!(
            rang,
            std::vec![(0, 4, 3)],
            "one doorbell for the whole prefix"
        );
    }

    /// Two producers and the retiring thread on real threads (small, so
    /// Miri's data-race detector can run it).
    #[test]
    fn two_threads_post_while_one_retires() {
        use std::sync::atomic::AtomicU64;
        let (_ready, r) = ring(4, 1);
        let slots: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let per = if cfg!(miri) { 6 } else { 2000 };
        std::thread::scope(|sc| {
            for t in 0..2u64 {
                let (r, slots) = (&r, &slots);
                sc.spawn(move || {
                    for i in 0..per {
                        let start = loop {
                            match r.reserve(1) {
                                Ok(s) => break s,
                                Err(Full) => std::thread::yield_now(),
                            }
                        };
                        slots[(start % 4) as usize].store(t << 32 | i, Ordering::Relaxed);
                        r.publish(start, start + 1, |_, _, _, _| {});
                    }
                });
            }
            // The poller: retire every published WQE in order.
            let mut seen = [0u64; 2];
            let mut done = 0u32;
            while done < 2 * per as u32 {
                if r.published().wrapping_sub(done) == 0 {
                    std::thread::yield_now();
                    continue;
                }
                let v = slots[(done % 4) as usize].load(Ordering::Relaxed);
                // SAFETY: this thread is the only retirer.
                let got = unsafe { r.retire(done as u16, |s| Some(s + 1)) };
                assert_eq!(got, Some(done));
                let (t, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                assert_eq!(i, seen[t], "thread {t}'s WQEs in its order");
                seen[t] += 1;
                done += 1;
            }
        });
    }

    #[test]
    fn a_list_claims_the_longest_prefix_that_fits() {
        let (_ready, r) = ring(8, 2);
        let sizes = [2u32, 1, 2, 2, 1];
        // 8 BBs free: 2+1+2+2 = 7 fit, the last 1 would too (8).
        assert_eq!(r.reserve_prefix(5, |i| sizes[i]), Ok((0, 5)));
        assert_eq!(r.reserve_prefix(1, |_| 1), Err(Full));
        // Retire the first 3 BBs (the WQEs at 0 and 2), then a list whose
        // second WQE does not fit.
        r.publish(0, 2, |_, _, _, _| {});
        r.publish(2, 3, |_, _, _, _| {});
        // SAFETY: single-threaded test: the only retirer.
        assert_eq!(unsafe { r.retire(2, |_| Some(3)) }, Some(2));
        assert_eq!(r.reserve_prefix(3, |i| [2u32, 2, 1][i]), Ok((8, 1)));
        assert_eq!(r.reserve_prefix(2, |_| 2), Err(Full), "1 BB left");
        assert_eq!(r.reserve_prefix(2, |_| 1), Ok((10, 1)));
        assert_eq!(r.free(), 0);
    }

    #[test]
    fn full_and_retire() {
        let (_ready, r) = ring(4, 2);
        let a = r.reserve(2).unwrap();
        let b = r.reserve(2).unwrap();
        assert_eq!(r.reserve(1), Err(Full));
        r.publish(a, 2, |_, _, _, _| {});
        r.publish(b, 4, |_, _, _, _| {});
        // SAFETY: single-threaded test: this is the only retiring thread.
        unsafe {
            // Counter 1 is the middle of WQE a: no entry says it starts there.
            assert_eq!(r.retire(1, |_| None), None);
            assert_eq!(r.retire(9, |_| Some(10)), None, "not published");
            assert_eq!(r.retire(2, |s| Some(s + 2)), Some(2));
            assert_eq!(r.retire(0, |s| Some(s + 2)), None, "already retired");
        }
        assert_eq!(r.free(), 4);
        assert_eq!(r.reserve(4), Ok(4));
    }
}

#[cfg(all(loom, test))]
mod loom_tests {
    //! The whole post → doorbell → device → CQE → poll → retire cycle with
    //! two producers, a model device and the poller on a 4-BB ring.
    //! Run with `scripts/loom.sh` (LOOM_MAX_PREEMPTIONS=2).
    use super::*;
    use loom::sync::atomic::AtomicU8;
    use loom::sync::Arc;
    use loom::thread;
    use std::vec::Vec;

    const CNT: u32 = 4;

    /// Model queue memory: the ring's ready words, the "WQE" of each BB
    /// (its wr id, written by the producer, read by the device), the
    /// side table (read by the poller), a doorbell record and a 4-entry CQ
    /// with the mlx5 owner-bit protocol.
    struct Model {
        _ready: Vec<AtomicU32>,
        ring: MpRing<u32>,
        wqe: Vec<UnsafeCell<u64>>,
        side: Vec<UnsafeCell<(u64, u32)>>,
        dbrec: AtomicU32,
        cqe: Vec<UnsafeCell<u16>>,
        op_own: Vec<AtomicU8>,
    }

    fn model() -> Arc<Model> {
        let ready: Vec<AtomicU32> = (0..CNT).map(|_| AtomicU32::new(0)).collect();
        let p = NonNull::new(ready.as_ptr() as *mut AtomicU32).unwrap();
        // SAFETY: `ready` is kept alive in the same struct.
        let ring = unsafe { MpRing::new(CNT, 1, 0, p, 0u32) };
        Arc::new(Model {
            _ready: ready,
            ring,
            wqe: (0..CNT).map(|_| UnsafeCell::new(0)).collect(),
            side: (0..CNT).map(|_| UnsafeCell::new((0, 0))).collect(),
            dbrec: AtomicU32::new(0),
            cqe: (0..CNT).map(|_| UnsafeCell::new(0)).collect(),
            // INVALID opcode, owner 0, as a fresh mlx5 CQ.
            op_own: (0..CNT).map(|_| AtomicU8::new(0xf0)).collect(),
        })
    }

    /// One producer posting `n` one-BB WQEs with ids `id0..`; returns how
    /// many were refused with Full (back-pressure, never a wait).
    fn produce(m: &Model, id0: u64, n: u64) -> u64 {
        produce_with(m, id0, n, false)
    }

    fn produce_with(m: &Model, id0: u64, n: u64, broken: bool) -> u64 {
        let mut full = 0;
        for id in id0..id0 + n {
            let Ok(start) = m.ring.reserve(1) else {
                full += 1;
                continue;
            };
            let slot = (start % CNT) as usize;
            // SAFETY (model): the BB is reserved by this producer only.
            m.wqe[slot].with_mut(|p| unsafe { *p = id });
            // SAFETY (model): as above.
            m.side[slot].with_mut(|p| unsafe { *p = (id, start + 1) });
            let ring = |rung: &mut u32, _from: u32, to: u32, _last: u32| {
                // The doorbell record: the device acquires it.
                *rung = to;
                m.dbrec.store(to, Ordering::Release);
            };
            if broken {
                m.ring.publish_broken(start, start + 1, ring);
            } else {
                m.ring.publish(start, start + 1, ring);
            }
        }
        full
    }

    /// One producer posting `n` one-BB WQEs with ids `id0..` as lists of
    /// up to `list` WQEs: one reservation per list (its longest prefix that
    /// fits), each WQE marked ready as it is written, one doorbell request
    /// per list. Returns how many were refused.
    fn produce_lists(m: &Model, id0: u64, n: u64, list: u64) -> u64 {
        let mut full = 0;
        let mut id = id0;
        while id < id0 + n {
            let want = list.min(id0 + n - id) as usize;
            let Ok((start, got)) = m.ring.reserve_prefix(want, |_| 1) else {
                full += want as u64;
                id += want as u64;
                continue;
            };
            for k in 0..got as u32 {
                let bb = start + k;
                let slot = (bb % CNT) as usize;
                let wid = id + k as u64;
                // SAFETY (model): the BB is reserved by this producer only.
                m.wqe[slot].with_mut(|p| unsafe { *p = wid });
                // SAFETY (model): as above.
                m.side[slot].with_mut(|p| unsafe { *p = (wid, bb + 1) });
                m.ring.mark_ready(bb, bb + 1);
            }
            m.ring.request_doorbell(|rung: &mut u32, _from, to, _last| {
                *rung = to;
                m.dbrec.store(to, Ordering::Release);
            });
            full += (want - got) as u64;
            id += want as u64;
        }
        full
    }

    /// One step of the model device: executes the WQEs published since
    /// `done` in order and writes one CQE for each (all signaled), owner
    /// byte last with Release.
    fn device_step(m: &Model, done: &mut u32) {
        let pi = m.dbrec.load(Ordering::Acquire);
        while *done != pi {
            let slot = (*done % CNT) as usize;
            // SAFETY (model): a published WQE, read-only for the device.
            let _id = m.wqe[slot].with(|p| unsafe { *p });
            // The CQ has CNT entries and at most CNT WQEs are outstanding,
            // so the entry is free.
            m.cqe[slot].with_mut(|p| unsafe { *p = *done as u16 });
            let owner = ((*done / CNT) & 1) as u8;
            m.op_own[slot].store(owner, Ordering::Release);
            *done += 1;
        }
    }

    /// One step of the poller: consumes owned CQEs (owner-bit test, then
    /// retire) and records the completed ids.
    fn poll_step(m: &Model, ci: &mut u32, ids: &mut Vec<u64>) {
        loop {
            let slot = (*ci % CNT) as usize;
            let op_own = m.op_own[slot].load(Ordering::Acquire);
            let owned = op_own >> 4 != 0xf && (op_own & 1) as u32 == (*ci / CNT) & 1;
            if !owned {
                return;
            }
            // SAFETY (model): the entry belongs to software now.
            let counter = m.cqe[slot].with(|p| unsafe { *p });
            let mut id = 0;
            // SAFETY: this is the only retiring thread.
            let start = unsafe {
                m.ring.retire(counter, |s| {
                    let (i, end) = m.side[(s % CNT) as usize].with(|p| unsafe { *p });
                    id = i;
                    Some(end)
                })
            };
            assert_eq!(start, Some(*ci), "CQE {ci} names a published WQE");
            ids.push(id);
            *ci += 1;
        }
    }

    /// Device and poller on one thread (the model device keeps no state of
    /// its own to race on; pairing it with the poller bounds the model).
    fn device_and_poll(m: &Model, total: u32) -> Vec<u64> {
        let (mut done, mut ci, mut ids) = (0, 0, Vec::new());
        while ci < total {
            device_step(m, &mut done);
            poll_step(m, &mut ci, &mut ids);
            if ci < total {
                thread::yield_now();
            }
        }
        ids
    }

    fn run(per_producer: u64) {
        // Producers race each other and the device/poller thread; the ring
        // is large enough that nothing is refused.
        let total = (2 * per_producer) as u32;
        assert!(total <= CNT);
        let m = model();
        let (m1, m2) = (m.clone(), m.clone());
        let p1 = thread::spawn(move || produce(&m1, 100, per_producer));
        let p2 = thread::spawn(move || produce(&m2, 200, per_producer));
        let mut ids = device_and_poll(&m, total);
        assert_eq!(p1.join().unwrap() + p2.join().unwrap(), 0);
        ids.sort_unstable();
        let mut want: Vec<u64> = (100..100 + per_producer)
            .chain(200..200 + per_producer)
            .collect();
        want.sort_unstable();
        assert_eq!(ids, want, "every posted WR completes exactly once");
        assert_eq!(m.ring.published(), total);
        assert_eq!(m.ring.retired(), total);
    }

    /// A loom builder that tolerates the spin-and-yield loops of the
    /// device and the poller (each yield is a branch).
    fn builder() -> loom::model::Builder {
        let mut b = loom::model::Builder::new();
        b.max_branches = 100_000;
        b
    }

    #[test]
    fn two_producers_device_and_poller() {
        builder().check(|| run(1));
    }

    /// A producer posting a list of two WQEs (one reservation, one
    /// doorbell request) races a producer posting one WQE, the device and
    /// the poller: every WR completes exactly once, in each producer's
    /// order.
    #[test]
    fn a_list_and_a_single_post_race() {
        builder().check(|| {
            let m = model();
            let (m1, m2) = (m.clone(), m.clone());
            let p1 = thread::spawn(move || produce_lists(&m1, 100, 2, 2));
            let p2 = thread::spawn(move || produce(&m2, 200, 1));
            let ids = device_and_poll(&m, 3);
            assert_eq!(p1.join().unwrap() + p2.join().unwrap(), 0);
            let mine: Vec<u64> = ids.iter().copied().filter(|&i| i < 200).collect();
            assert_eq!(mine, std::vec![100, 101], "the list completes in order");
            assert!(ids.contains(&200));
            assert_eq!(m.ring.retired(), 3);
        });
    }

    /// Two lists of three one-BB WQEs into the 4-BB ring with nothing
    /// retired: the second list gets only the prefix that still fits, and
    /// every claimed WQE is published.
    #[test]
    fn lists_claim_a_prefix_when_the_ring_is_short() {
        builder().check(|| {
            let m = model();
            let (m1, m2) = (m.clone(), m.clone());
            let p1 = thread::spawn(move || produce_lists(&m1, 100, 3, 3));
            let p2 = thread::spawn(move || produce_lists(&m2, 200, 3, 3));
            let full = p1.join().unwrap() + p2.join().unwrap();
            assert_eq!(full, 2);
            assert_eq!(m.ring.published(), 4, "every claimed WQE published");
        });
    }

    /// The model must catch a Relaxed publish: with it, the ringer (and
    /// through the doorbell record, the device) can see a ready word
    /// without the WQE written before it. Loom reports the unsynchronised
    /// read of the WQE cell ("causality violation") in the schedule where
    /// producer 2 rings for producer 1's WQE: p1 writes its WQE, stores
    /// ready Relaxed, p2 (the ringer) acquires ready (no edge: Relaxed),
    /// publishes, the device reads p1's WQE cell -> race.
    #[test]
    fn relaxed_publish_is_caught() {
        let caught = std::panic::catch_unwind(|| {
            builder().check(|| {
                let m = model();
                let (m1, m2) = (m.clone(), m.clone());
                let p1 = thread::spawn(move || produce_with(&m1, 100, 1, true));
                let p2 = thread::spawn(move || produce_with(&m2, 200, 1, true));
                let _ = device_and_poll(&m, 2);
                p1.join().unwrap();
                p2.join().unwrap();
            })
        });
        assert!(caught.is_err(), "loom did not find the broken ordering");
    }

    #[test]
    fn producers_fill_the_ring() {
        // 2 × 3 one-BB WQEs into 4 BBs with nothing retired yet: some
        // reservations must fail with Full, none may block.
        builder().check(|| {
            let m = model();
            let (m1, m2) = (m.clone(), m.clone());
            let p1 = thread::spawn(move || produce(&m1, 100, 3));
            let p2 = thread::spawn(move || produce(&m2, 200, 3));
            let full = p1.join().unwrap() + p2.join().unwrap();
            assert_eq!(full, 2);
            assert_eq!(m.ring.published(), 4, "every reserved WQE published");
        });
    }

    /// A CQ shared by two QPs: one producer per QP, the device completes
    /// both onto one CQ in whatever order it runs them, and the poller
    /// routes each CQE by QP number to that QP's retirement.
    #[test]
    fn shared_cq_routes_to_the_right_qp() {
        builder().check(|| {
            let qa = model();
            let qb = model();
            let (a1, b1) = (qa.clone(), qb.clone());
            let pa = thread::spawn(move || produce(&a1, 100, 2));
            let pb = thread::spawn(move || produce(&b1, 200, 1));
            // The shared CQ: (qp, counter) entries with the owner protocol.
            let cqe: Vec<UnsafeCell<(u8, u16)>> =
                (0..CNT).map(|_| UnsafeCell::new((0, 0))).collect();
            let op_own: Vec<AtomicU8> = (0..CNT).map(|_| AtomicU8::new(0xf0)).collect();
            let qps = [&qa, &qb];
            let (mut done, mut pi, mut ci) = ([0u32; 2], 0u32, 0u32);
            let mut ids = Vec::new();
            while ci < 3 {
                // Device: alternate between the QPs' doorbell records.
                for q in 0..2 {
                    let db = qps[q].dbrec.load(Ordering::Acquire);
                    if done[q] != db {
                        let slot = (pi % CNT) as usize;
                        // SAFETY (model): a free CQ entry, written by the device.
                        cqe[slot].with_mut(|p| unsafe { *p = (q as u8, done[q] as u16) });
                        op_own[slot].store(((pi / CNT) & 1) as u8, Ordering::Release);
                        done[q] += 1;
                        pi += 1;
                    }
                }
                // Poller: route by QP.
                let slot = (ci % CNT) as usize;
                let oo = op_own[slot].load(Ordering::Acquire);
                if oo >> 4 != 0xf && (oo & 1) as u32 == (ci / CNT) & 1 {
                    // SAFETY (model): the entry belongs to software now.
                    let (q, counter) = cqe[slot].with(|p| unsafe { *p });
                    let m = qps[q as usize];
                    // SAFETY: the only retirer of each ring.
                    let r = unsafe {
                        m.ring.retire(counter, |s| {
                            let (i, end) = m.side[(s % CNT) as usize].with(|p| unsafe { *p });
                            ids.push(i);
                            Some(end)
                        })
                    };
                    assert!(r.is_some(), "CQE routed to QP {q} names its WQE");
                    ci += 1;
                } else {
                    thread::yield_now();
                }
            }
            pa.join().unwrap();
            pb.join().unwrap();
            ids.sort_unstable();
            assert_eq!(ids, std::vec![100, 101, 200]);
            assert_eq!((qa.ring.retired(), qb.ring.retired()), (2, 1));
        });
    }

    /// Poster/poller hand-off (SPSC) around the ring end: one producer
    /// posts 6 WQEs into the 4-BB ring, retrying on Full (the poller on the
    /// other thread frees space), so slots and side-table entries are
    /// reused across laps while the poller reads them.
    #[test]
    fn spsc_handoff_wraps_the_ring() {
        builder().check(|| {
            let m = model();
            let mp = m.clone();
            let p = thread::spawn(move || {
                for id in 0..6u64 {
                    while produce(&mp, id, 1) == 1 {
                        thread::yield_now();
                    }
                }
            });
            let ids = device_and_poll(&m, 6);
            p.join().unwrap();
            assert_eq!(ids, (0..6).collect::<Vec<u64>>(), "in order, exactly once");
            assert_eq!(m.ring.retired(), 6);
        });
    }
}
