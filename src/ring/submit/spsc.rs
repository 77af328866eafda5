//! The SPSC completion ring: [`SpscRing`], with one [`SpscProducer`] and
//! one [`SpscConsumer`] at a time.

use core::mem::MaybeUninit;

use super::{Cursor, Full, Geometry, Padded};
use crate::sync::{Ordering, UnsafeCell};

// ---------------------------------------------------------------------
// SPSC ring
// ---------------------------------------------------------------------

/// A bounded lock-free ring for one producer and one consumer at a time
/// ([`SpscRing::producer`], [`SpscRing::consumer`]). `N` is a power of
/// two, at least 2 (checked at compile time).
pub struct SpscRing<T, const N: usize> {
    /// Next position to read; written by the consumer.
    pub(super) head: Padded<Cursor>,
    /// Next position to write; written by the producer.
    pub(super) tail: Padded<Cursor>,
    slots: [UnsafeCell<MaybeUninit<T>>; N],
}

// SAFETY: values only move through the ring, so `T: Send` suffices. There
// is one producer and one consumer at a time (claim flags); a slot is
// written only while it lies outside `head..tail` and read only while
// inside, and the Release/Acquire pairs on `head` and `tail` order those
// accesses.
unsafe impl<T: Send, const N: usize> Sync for SpscRing<T, N> {}

impl<T: Copy, const N: usize> Default for SpscRing<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy, const N: usize> SpscRing<T, N> {
    /// The mask; also forces the compile-time geometry check.
    const MASK: usize = Geometry::<N>::MASK;

    ctor! {
        /// An empty ring (`const`, so it can be a `static`).
        pub fn new() -> Self {
            let _ = Self::MASK;
            SpscRing {
                head: Padded(Cursor::new()),
                tail: Padded(Cursor::new()),
                slots: repeat!(UnsafeCell::new(MaybeUninit::uninit()); N),
            }
        }
    }

    /// Capacity.
    #[inline]
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Values pushed and not yet popped (a snapshot).
    #[inline]
    pub fn len(&self) -> usize {
        // Relaxed (both): a statistic; neither value guards any data.
        let h = self.head.0.pos.load(Ordering::Relaxed);
        let t = self.tail.0.pos.load(Ordering::Relaxed);
        (t.wrapping_sub(h) as isize).clamp(0, N as isize) as usize
    }

    /// True if [`len`](Self::len) is 0.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The producer handle, or `None` if one exists already.
    #[inline]
    pub fn producer(&self) -> Option<SpscProducer<'_, T, N>> {
        if !self.tail.0.claim() {
            return None;
        }
        // Relaxed: only producer handles store `tail`, the previous one
        // before its Release of the claim, which `claim` acquired.
        let tail = self.tail.0.pos.load(Ordering::Relaxed);
        // Acquire: pairs with the consumer's Release `head` stores, so its
        // reads of the slots it freed happen before we overwrite them.
        let head = self.head.0.pos.load(Ordering::Acquire);
        Some(SpscProducer {
            ring: self,
            tail,
            head,
        })
    }

    /// The consumer handle, or `None` if one exists already.
    #[inline]
    pub fn consumer(&self) -> Option<SpscConsumer<'_, T, N>> {
        if !self.head.0.claim() {
            return None;
        }
        // Relaxed: only consumer handles store `head`, the previous one
        // before its Release of the claim, which `claim` acquired.
        let head = self.head.0.pos.load(Ordering::Relaxed);
        // Acquire: pairs with the producer's Release `tail` stores, so the
        // values below `tail` are visible.
        let tail = self.tail.0.pos.load(Ordering::Acquire);
        Some(SpscConsumer {
            ring: self,
            head,
            tail,
        })
    }
}

/// The producer side of an [`SpscRing`]. Dropping it releases the claim.
pub struct SpscProducer<'a, T: Copy, const N: usize> {
    ring: &'a SpscRing<T, N>,
    /// Next position to write (the ring's `tail`, owned by us).
    tail: usize,
    /// The consumer's `head` as last seen (never ahead of the real one).
    head: usize,
}

impl<T: Copy, const N: usize> SpscProducer<'_, T, N> {
    /// Appends `value`; [`Full`] if the consumer has not made room.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), Full> {
        if self.tail.wrapping_sub(self.head) >= N {
            // Acquire: pairs with the consumer's Release `head` store, so
            // its reads of the freed slots happen before our overwrite.
            self.head = self.ring.head.0.pos.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head) >= N {
                return Err(Full);
            }
        }
        self.ring.slots[self.tail & SpscRing::<T, N>::MASK].with_mut(|p| {
            // SAFETY: position `tail` is outside the consumer's readable
            // range `head..tail` and its previous value was consumed
            // (tail - head < N, with `head` acquired above); this handle is
            // the only producer (claim flag). `p` points into the ring.
            unsafe { p.write(MaybeUninit::new(value)) }
        });
        self.tail = self.tail.wrapping_add(1);
        // Release: pairs with the consumer's Acquire `tail` load, so the
        // value written above is visible before it reads it.
        self.ring.tail.0.pos.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Free room, as this producer knows it (it may be larger).
    #[inline]
    pub fn free(&self) -> usize {
        N - self.tail.wrapping_sub(self.head).min(N)
    }
}

impl<T: Copy, const N: usize> Drop for SpscProducer<'_, T, N> {
    fn drop(&mut self) {
        self.ring.tail.0.release();
    }
}

/// The consumer side of an [`SpscRing`]. Dropping it releases the claim.
pub struct SpscConsumer<'a, T: Copy, const N: usize> {
    pub(super) ring: &'a SpscRing<T, N>,
    /// Next position to read (the ring's `head`, owned by us).
    pub(super) head: usize,
    /// The producer's `tail` as last seen (never ahead of the real one).
    pub(super) tail: usize,
}

impl<T: Copy, const N: usize> SpscConsumer<'_, T, N> {
    /// Values readable without looking at the producer's counter again;
    /// refreshes it (Acquire) when that is zero.
    #[inline(always)]
    fn available(&mut self) -> usize {
        if self.tail == self.head {
            // Acquire: pairs with the producer's Release `tail` store, so
            // the values below the new tail are visible.
            self.tail = self.ring.tail.0.pos.load(Ordering::Acquire);
        }
        self.tail.wrapping_sub(self.head)
    }

    /// Reads position `pos`, which must lie in `head..tail`.
    #[inline(always)]
    fn read(&self, pos: usize) -> T {
        self.ring.slots[pos & SpscRing::<T, N>::MASK].with(|p| {
            // SAFETY: `pos` is in `head..tail` (caller), so the producer
            // wrote an initialised `T` there before its Release `tail`
            // store that we acquired, and it does not write the slot again
            // until our `head` store passes `pos`. This handle is the only
            // consumer (claim flag).
            unsafe { p.read().assume_init() }
        })
    }

    /// Publishes `head` after reads.
    #[inline(always)]
    fn store_head(&self) {
        // Release: pairs with the producer's Acquire `head` load, so our
        // reads of the freed slots happen before it overwrites them.
        self.ring.head.0.pos.store(self.head, Ordering::Release);
    }

    /// The oldest value, or `None` if the ring is empty.
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        if self.available() == 0 {
            return None;
        }
        let v = self.read(self.head);
        self.head = self.head.wrapping_add(1);
        self.store_head();
        Some(v)
    }

    /// Moves up to `out.len()` values, oldest first, into `out`; returns
    /// how many. One Release store frees them all.
    #[inline]
    pub fn pop_batch(&mut self, out: &mut [T]) -> usize {
        let n = self.available().min(out.len());
        if n == 0 {
            return 0;
        }
        for (i, o) in out[..n].iter_mut().enumerate() {
            *o = self.read(self.head.wrapping_add(i));
        }
        self.head = self.head.wrapping_add(n);
        self.store_head();
        n
    }
}

impl<T: Copy, const N: usize> Drop for SpscConsumer<'_, T, N> {
    fn drop(&mut self) {
        self.ring.head.0.release();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spsc_fifo_full_batch_and_handover() {
        let r: SpscRing<u16, 4> = SpscRing::new();
        let mut p = r.producer().unwrap();
        assert!(r.producer().is_none());
        let mut c = r.consumer().unwrap();
        assert!(r.consumer().is_none());
        let mut out = [0u16; 3];
        let mut next_in = 0u16;
        let mut next_out = 0u16;
        for _ in 0..20 {
            while p.try_push(next_in).is_ok() {
                next_in += 1;
            }
            assert_eq!(p.free(), 0);
            assert_eq!(r.len(), 4);
            let n = c.pop_batch(&mut out);
            assert_eq!(n, 3);
            for v in &out[..n] {
                assert_eq!(*v, next_out);
                next_out += 1;
            }
            assert_eq!(c.try_pop(), Some(next_out));
            next_out += 1;
            assert_eq!(c.try_pop(), None);
        }
        drop(p);
        let mut p = r.producer().unwrap();
        p.try_push(500).unwrap();
        drop(c);
        let mut c = r.consumer().unwrap();
        assert_eq!(c.try_pop(), Some(500));
        assert!(r.is_empty());
    }
}
