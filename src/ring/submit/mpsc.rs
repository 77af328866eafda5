//! The MPSC submission ring: [`MpscRing`], written to by any number of
//! producers and drained by one [`MpscConsumer`] at a time.

use core::mem::MaybeUninit;

use super::{Cursor, Full, Geometry, Padded};
use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

// ---------------------------------------------------------------------
// MPSC ring
// ---------------------------------------------------------------------

/// One slot: its sequence stamp (see the module docs) and the value.
struct Slot<T> {
    stamp: AtomicUsize,
    val: UnsafeCell<MaybeUninit<T>>,
}

impl<T> Slot<T> {
    ctor! {
        fn new() -> Slot<T> {
            Slot {
                // Every slot starts free for lap 0.
                stamp: AtomicUsize::new(0),
                val: UnsafeCell::new(MaybeUninit::uninit()),
            }
        }
    }
}

/// A bounded lock-free ring for any number of producers (`&self`) and one
/// consumer at a time ([`MpscRing::consumer`]). `N` is a power of two, at
/// least 2 (checked at compile time):
///
/// ```compile_fail
/// use rdma_direct::ring::submit::MpscRing;
/// let r: MpscRing<u64, 3> = MpscRing::new();
/// ```
pub struct MpscRing<T, const N: usize> {
    /// Next position to claim (producers' CAS target).
    head: Padded<AtomicUsize>,
    /// Next position to read, and the consumer claim.
    tail: Padded<Cursor>,
    slots: [Slot<T>; N],
}

// SAFETY: values only move through the ring (they are written by one
// thread and read, by copy, by another), so `T: Send` suffices. Each
// slot's value is accessed by at most one thread at a time: a producer
// only after winning the CAS for its position while the stamp said
// "free", the consumer only after the stamp said "published" (and there is
// one consumer at a time, enforced by the `tail.claimed` flag); the
// Release/Acquire stamp pairs order those accesses.
unsafe impl<T: Send, const N: usize> Sync for MpscRing<T, N> {}

impl<T: Copy, const N: usize> Default for MpscRing<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy, const N: usize> MpscRing<T, N> {
    /// The mask; also forces the compile-time geometry check.
    const MASK: usize = Geometry::<N>::MASK;

    ctor! {
        /// An empty ring (`const`, so it can be a `static`).
        pub fn new() -> Self {
            let _ = Self::MASK;
            MpscRing {
                head: Padded(AtomicUsize::new(0)),
                tail: Padded(Cursor::new()),
                slots: repeat!(Slot::new(); N),
            }
        }
    }

    /// Builds an empty ring at `this`, slot by slot, without building it
    /// on the stack first: a ring of thousands of descriptors can be
    /// larger than a thread's stack, and `Box::new(MpscRing::new())` may
    /// build its value there before moving it.
    ///
    /// # Safety
    /// `this` must be valid for writes of one `Self` and aligned for it.
    /// Whatever it held is overwritten without being dropped.
    pub unsafe fn init_in_place(this: *mut Self) {
        let _ = Self::MASK;
        // SAFETY: `this` is valid for writes and aligned (caller contract),
        // so each field place is; the fields are written once each, and
        // `Slot<T>` has the layout of one element of the `slots` array.
        unsafe {
            core::ptr::addr_of_mut!((*this).head).write(Padded(AtomicUsize::new(0)));
            core::ptr::addr_of_mut!((*this).tail).write(Padded(Cursor::new()));
            let slots = core::ptr::addr_of_mut!((*this).slots).cast::<Slot<T>>();
            for i in 0..N {
                slots.add(i).write(Slot::new());
            }
        }
    }

    /// Capacity in descriptors.
    #[inline]
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Descriptors claimed and not yet consumed (including any still being
    /// written). A snapshot: other threads may change it at once.
    #[inline]
    pub fn len(&self) -> usize {
        // Relaxed (both): a statistic; neither value guards any data.
        let t = self.tail.0.pos.load(Ordering::Relaxed);
        let h = self.head.0.load(Ordering::Relaxed);
        (h.wrapping_sub(t) as isize).clamp(0, N as isize) as usize
    }

    /// True if [`len`](Self::len) is 0.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `value`, from any thread. Lock-free; on a full ring returns
    /// [`Full`] and writes nothing.
    ///
    /// A push may also see the ring full while the consumer is freeing a
    /// slot whose release this thread cannot see yet; retrying succeeds.
    #[inline]
    pub fn try_push(&self, value: T) -> Result<(), Full> {
        // Release: publishes the value to the consumer (see `push_with`).
        self.push_with(value, Ordering::Release)
    }

    /// [`try_push`](Self::try_push) with the publishing store's ordering as
    /// a parameter, so the loom models can demonstrate that a weaker one
    /// is caught. Production code always passes `Release`.
    #[inline(always)]
    pub(super) fn push_with(&self, value: T, publish: Ordering) -> Result<(), Full> {
        let mask = Self::MASK;
        // Relaxed: the head only hands out positions; which position we
        // start from is a guess that the stamp check and the CAS below
        // validate, and no data is published through the head.
        let mut pos = self.head.0.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & mask];
            let lap = pos & !mask;
            // Acquire: pairs with the consumer's Release store that freed
            // this slot (stamp := lap). Its read of the previous lap's value
            // then happens before our write below.
            let stamp = slot.stamp.load(Ordering::Acquire);
            let diff = stamp.wrapping_sub(lap) as isize;
            if diff == 0 {
                // Free for `pos`: claim it. Relaxed on success and failure:
                // atomicity alone makes the claim unique (the slot is ours
                // for this lap; the Acquire load above already ordered us
                // after the consumer), and on failure we only learn a newer
                // head to retry from.
                match self.head.0.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        slot.val.with_mut(|p| {
                            // SAFETY: winning the CAS for `pos` while the
                            // stamp said "free for `pos`" gives this thread
                            // the slot exclusively until it publishes: no
                            // other producer can claim `pos` again, and the
                            // consumer does not read the slot before the
                            // stamp says "published". `p` points into
                            // `self.slots`, valid for writes.
                            unsafe { p.write(MaybeUninit::new(value)) }
                        });
                        // `publish` is Release in production: pairs with the
                        // consumer's Acquire load of the stamp, so the value
                        // written above is visible before it reads it.
                        slot.stamp.store(lap.wrapping_add(1), publish);
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The slot still holds (or is about to hold) the value of
                // position `pos - N`, not yet consumed: full.
                return Err(Full);
            } else {
                // Another producer claimed `pos` (and possibly more laps
                // passed); start again from the current head. Relaxed: as
                // the first load.
                pos = self.head.0.load(Ordering::Relaxed);
            }
        }
    }

    /// The consumer handle, or `None` if one exists already (dropping it
    /// lets another one be taken, possibly on another thread).
    #[inline]
    pub fn consumer(&self) -> Option<MpscConsumer<'_, T, N>> {
        if !self.tail.0.claim() {
            return None;
        }
        // Relaxed: only consumer handles store `pos`, and the previous one
        // did so before its Release of the claim, which `claim` acquired.
        let pos = self.tail.0.pos.load(Ordering::Relaxed);
        Some(MpscConsumer { ring: self, pos })
    }
}

/// The single consumer of an [`MpscRing`]. Dropping it releases the claim.
pub struct MpscConsumer<'a, T: Copy, const N: usize> {
    ring: &'a MpscRing<T, N>,
    /// Next position to read (mirrored to `ring.tail.pos`).
    pos: usize,
}

impl<T: Copy, const N: usize> MpscConsumer<'_, T, N> {
    /// Takes the value at `pos` if it has been published, freeing the slot
    /// for the next lap.
    #[inline(always)]
    fn take(&self, pos: usize) -> Option<T> {
        let mask = MpscRing::<T, N>::MASK;
        let slot = &self.ring.slots[pos & mask];
        let lap = pos & !mask;
        // Acquire: pairs with the producer's Release publish, so its write
        // of the value happens before our read below.
        if slot.stamp.load(Ordering::Acquire) != lap.wrapping_add(1) {
            return None;
        }
        let v = slot.val.with(|p| {
            // SAFETY: the stamp says "published for `pos`": the producer
            // that claimed `pos` has finished writing an initialised `T`
            // (ordered before us by the Acquire above), and no producer
            // writes the slot again until we free it below. This handle is
            // the only consumer (claim flag), so nobody else reads it.
            unsafe { p.read().assume_init() }
        });
        // Release: pairs with the Acquire stamp load of the producer that
        // claims this slot next lap, so our read above happens before its
        // write.
        slot.stamp.store(lap.wrapping_add(N), Ordering::Release);
        Some(v)
    }

    /// Mirrors the position for [`MpscRing::len`] and the next handle.
    #[inline(always)]
    fn store_pos(&self) {
        // Relaxed: a statistic for `len`; a later handle is ordered after
        // this store by the claim flag's Release/Acquire.
        self.ring.tail.0.pos.store(self.pos, Ordering::Relaxed);
    }

    /// The next descriptor, or `None` if the next position has not been
    /// published yet (the ring is empty, or its producer is mid-write).
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        let v = self.take(self.pos)?;
        self.pos = self.pos.wrapping_add(1);
        self.store_pos();
        Some(v)
    }

    /// Moves up to `out.len()` published descriptors, in order, into
    /// `out`; returns how many. Stops at the first position not yet
    /// published.
    #[inline]
    pub fn pop_batch(&mut self, out: &mut [T]) -> usize {
        let mut n = 0;
        for o in out.iter_mut() {
            match self.take(self.pos) {
                Some(v) => {
                    *o = v;
                    self.pos = self.pos.wrapping_add(1);
                    n += 1;
                }
                None => break,
            }
        }
        if n > 0 {
            self.store_pos();
        }
        n
    }

    /// The ring.
    #[inline]
    pub fn ring(&self) -> &MpscRing<T, N> {
        self.ring
    }
}

impl<T: Copy, const N: usize> Drop for MpscConsumer<'_, T, N> {
    fn drop(&mut self) {
        self.ring.tail.0.release();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn mpsc_fifo_full_and_wrap() {
        let r: MpscRing<u32, 4> = MpscRing::new();
        let mut c = r.consumer().unwrap();
        assert!(r.consumer().is_none(), "one consumer at a time");
        assert_eq!(c.try_pop(), None);
        // Many laps, with the ring filled to the brim each time.
        let mut next = 0u32;
        for lap in 0..10u32 {
            for i in 0..4 {
                r.try_push(lap * 4 + i).unwrap();
            }
            assert_eq!(r.try_push(99), Err(Full));
            assert_eq!(r.len(), 4);
            for _ in 0..4 {
                assert_eq!(c.try_pop(), Some(next));
                next += 1;
            }
            assert_eq!(c.try_pop(), None);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn mpsc_pop_batch_stops_at_unpublished() {
        let r: MpscRing<u64, 8> = MpscRing::default();
        let mut c = r.consumer().unwrap();
        let mut out = [0u64; 8];
        assert_eq!(c.pop_batch(&mut out), 0);
        for v in 0..5 {
            r.try_push(v).unwrap();
        }
        assert_eq!(c.pop_batch(&mut out[..3]), 3);
        assert_eq!(&out[..3], &[0, 1, 2]);
        assert_eq!(c.pop_batch(&mut out), 2);
        assert_eq!(&out[..2], &[3, 4]);
        // A claimed-but-unpublished position blocks the ones after it.
        r.head
            .0
            .store(r.head.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        r.try_push(7).unwrap();
        assert_eq!(c.pop_batch(&mut out), 0);
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn mpsc_consumer_handover_keeps_position() {
        let r: MpscRing<u8, 2> = MpscRing::new();
        r.try_push(1).unwrap();
        r.try_push(2).unwrap();
        {
            let mut c = r.consumer().unwrap();
            assert_eq!(c.try_pop(), Some(1));
        }
        r.try_push(3).unwrap();
        let mut c = r.consumer().unwrap();
        assert_eq!(c.try_pop(), Some(2));
        assert_eq!(c.try_pop(), Some(3));
        assert_eq!(c.ring().capacity(), 2);
    }

    /// Two producers on real threads (small enough for Miri).
    #[test]
    fn mpsc_two_threads() {
        const PER: u32 = if cfg!(miri) { 50 } else { 10_000 };
        let r: MpscRing<u32, 8> = MpscRing::new();
        std::thread::scope(|s| {
            for t in 0..2u32 {
                let r = &r;
                s.spawn(move || {
                    for i in 0..PER {
                        while r.try_push((t << 16) | i).is_err() {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let mut c = r.consumer().unwrap();
            let mut next = [0u32; 2];
            let mut buf = [0u32; 4];
            while next != [PER; 2] {
                let n = c.pop_batch(&mut buf);
                if n == 0 {
                    std::thread::yield_now();
                }
                for v in &buf[..n] {
                    let t = (v >> 16) as usize;
                    assert_eq!(v & 0xffff, next[t], "per-producer order");
                    next[t] += 1;
                }
            }
        });
    }
}
