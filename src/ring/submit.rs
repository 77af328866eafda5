//! An MPSC submission ring for poll-mode (DPDK-style) services.
//!
//! Many application threads submit fixed-size `Copy` descriptors into one
//! bounded ring; a single poll-mode thread drains it in batches (and, in
//! an RDMA service, posts each batch with one doorbell), then hands each
//! completion back through the submitter's own completion ring.
//!
//! Three layers, all bounded, `no_std` and allocation-free (storage is
//! const-generic arrays inside the value; put it in a `static`, on the
//! stack or in a box, as the application likes):
//!
//! - [`MpscRing`]: a lock-free multi-producer, single-consumer ring with a
//!   sequence stamp per slot. Producers claim a position with a CAS on a
//!   shared counter, write the slot, and publish it with one Release store
//!   of the slot's stamp. The consumer ([`MpscConsumer`], one at a time)
//!   reads slots in position order and hands each one back to the next lap
//!   with a Release store of its stamp. `try_push` on a full ring returns
//!   [`Full`] (back-pressure, never a wait).
//! - [`SpscRing`]: a lock-free single-producer, single-consumer ring with
//!   two free-running counters, used for completions: the poll-mode thread
//!   pushes, the submitter pops (a whole batch costs one Release store).
//! - [`SubmissionService`]: ties one [`MpscRing`] to `S` completion rings.
//!   [`SubmissionService::register`] hands out a [`Submitter`] (an id plus
//!   its completion ring), [`SubmissionService::poller`] the single
//!   [`Poller`]. Descriptors travel tagged with their submitter's id
//!   ([`Submission`]); the poller routes completions by that id.
//!
//! # Slot protocol of [`MpscRing`]
//!
//! Positions are free-running `usize` counters; position `p` lives in slot
//! `p % N` and belongs to lap `L = p & !(N - 1)` (the position with the
//! slot bits cleared). Each slot's stamp says where the slot is:
//!
//! | stamp   | meaning                                              |
//! |---------|------------------------------------------------------|
//! | `L`     | free for position `p` of lap `L` (initially 0)       |
//! | `L + 1` | holds the value written for `p`, not yet consumed    |
//! | `L + N` | consumed; now free for position `p + N` (next lap)   |
//!
//! `N >= 2` keeps "published" (`L + 1`) and "free for the next lap"
//! (`L + N`) apart. A producer at position `p` compares the stamp with
//! `L`: equal means the slot is free and it may try to claim `p`; smaller
//! means the slot still holds an unconsumed value from the previous lap,
//! i.e. the ring is full; larger means another producer claimed `p`
//! already, so it reloads the counter.
//!
//! The consumer never waits for a slow producer: if the producer that
//! claimed the next position has not published yet, `try_pop` returns
//! `None` even when later positions are already published (they are
//! returned in position order once it does).
//!
//! # Orderings
//!
//! Every ordering is commented where it is used. The two that carry data:
//! - producer `stamp.store(L + 1, Release)` → consumer
//!   `stamp.load(Acquire)`: the consumer reads the whole descriptor;
//! - consumer `stamp.store(L + N, Release)` → next-lap producer
//!   `stamp.load(Acquire)`: the consumer's read of the old value happens
//!   before the producer overwrites it.
//!
//! The shared claim counter is Relaxed: the CAS's atomicity alone makes
//! each position unique, and no data is published through it.
//!
//! # Back-pressure and credits
//!
//! [`Submitter::try_submit`] fails with [`ServiceError::RingFull`] when
//! the submission ring is full (the analogue of [`crate::Error::SqFull`]:
//! retry after the poll-mode thread has drained; `From` maps it to
//! `SqFull`), and with [`ServiceError::NoCredit`] when the submitter
//! already has `CQ` descriptors outstanding (submitted, completion not
//! yet received). The credit limit guarantees that a completion ring can
//! never overflow as long as the poller returns at most one completion
//! per descriptor, so the poll-mode thread never has to wait for a slow
//! submitter.
//!
//! # Example
//!
//! ```
//! use rdma_direct::ring::submit::{Submission, SubmissionService};
//!
//! // 64 queued descriptors, 16 outstanding per submitter, 4 submitters.
//! static SVC: SubmissionService<u64, u64, 64, 16, 4> = SubmissionService::new();
//!
//! let mut sub = SVC.register()?; // in an application thread
//! let mut poll = SVC.poller()?; // in the poll-mode thread
//! sub.try_submit(7)?;
//! sub.try_submit(8)?;
//!
//! let mut batch = [Submission::default(); 32];
//! let n = poll.drain(&mut batch); // one batch, one doorbell
//! for s in &batch[..n] {
//!     poll.try_complete(s.from, s.desc * 10)?;
//! }
//! let mut done = [0u64; 4];
//! assert_eq!(sub.recv_batch(&mut done), 2);
//! assert_eq!(&done[..2], &[70, 80]);
//! # Ok::<(), rdma_direct::ring::submit::ServiceError>(())
//! ```

use core::fmt;
use core::mem::MaybeUninit;

use crate::sync::{AtomicBool, AtomicUsize, Ordering, UnsafeCell};

/// Defines a constructor that is a `const fn` with `core`'s types and a
/// plain `fn` under loom, whose types have no `const` constructors.
macro_rules! ctor {
    ($(#[$m:meta])* $vis:vis fn $name:ident() -> $ret:ty $body:block) => {
        #[cfg(not(all(loom, test)))]
        $(#[$m])*
        $vis const fn $name() -> $ret $body

        #[cfg(all(loom, test))]
        $(#[$m])*
        $vis fn $name() -> $ret $body
    };
}

/// `[$e; $n]` for a non-`Copy` `$e`: an inline `const` repeat with
/// `core`'s types, `core::array::from_fn` under loom.
macro_rules! repeat {
    ($e:expr; $n:expr) => {{
        #[cfg(not(all(loom, test)))]
        let a = [const { $e }; $n];
        #[cfg(all(loom, test))]
        let a = core::array::from_fn(|_| $e);
        a
    }};
}

/// Compile-time geometry checks for a ring of `N` slots.
struct Geometry<const N: usize>;

impl<const N: usize> Geometry<N> {
    /// `N - 1`; evaluating it rejects (at compile time) a capacity that is
    /// not a power of two of at least 2.
    const MASK: usize = {
        assert!(
            N >= 2 && N.is_power_of_two() && N <= (isize::MAX as usize) / 2,
            "ring capacity must be a power of two, at least 2"
        );
        N - 1
    };
}

/// Keeps what one side writes on its own cache lines (128 bytes: two
/// 64-byte lines, because x86's adjacent-line prefetcher pulls pairs, and
/// some aarch64 cores have 128-byte lines).
#[repr(align(128))]
struct Padded<T>(T);

/// One side's position and its "a handle exists" flag.
struct Cursor {
    pos: AtomicUsize,
    claimed: AtomicBool,
}

impl Cursor {
    ctor! {
        fn new() -> Cursor {
            Cursor {
                pos: AtomicUsize::new(0),
                claimed: AtomicBool::new(false),
            }
        }
    }

    /// Claims the side; `false` if a handle already exists.
    #[inline]
    fn claim(&self) -> bool {
        // Acquire: pairs with the Release in `release` by the previous
        // handle, so everything it did (slot reads and writes, its last
        // `pos` store) happens before the new handle starts.
        !self.claimed.swap(true, Ordering::Acquire)
    }

    /// Ends a claim.
    #[inline]
    fn release(&self) {
        // Release: see `claim`.
        self.claimed.store(false, Ordering::Release);
    }
}

/// A ring was full: nothing was written; retry after the other side has
/// made room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ring full")
    }
}

impl core::error::Error for Full {}

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
    fn push_with(&self, value: T, publish: Ordering) -> Result<(), Full> {
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

// ---------------------------------------------------------------------
// SPSC ring
// ---------------------------------------------------------------------

/// A bounded lock-free ring for one producer and one consumer at a time
/// ([`SpscRing::producer`], [`SpscRing::consumer`]). `N` is a power of
/// two, at least 2 (checked at compile time).
pub struct SpscRing<T, const N: usize> {
    /// Next position to read; written by the consumer.
    head: Padded<Cursor>,
    /// Next position to write; written by the producer.
    tail: Padded<Cursor>,
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
    ring: &'a SpscRing<T, N>,
    /// Next position to read (the ring's `head`, owned by us).
    head: usize,
    /// The producer's `tail` as last seen (never ahead of the real one).
    tail: usize,
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

// ---------------------------------------------------------------------
// The service facade
// ---------------------------------------------------------------------

/// Why a service operation failed. `Copy`, no payload.
///
/// [`From`] maps each variant onto the crate's [`crate::Error`] (no new
/// codes): the two back-pressure variants become
/// [`SqFull`](crate::Error::SqFull) ("retry after completions").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceError {
    /// The submission ring is full: retry after the poll-mode thread has
    /// drained it. Nothing was queued.
    RingFull,
    /// This submitter already has `CQ` descriptors outstanding: receive
    /// completions first. Nothing was queued.
    NoCredit,
    /// All `S` submitter ids are taken.
    NoFreeSubmitter,
    /// A [`Poller`] exists already.
    PollerTaken,
    /// No submitter with that id (out of range).
    NoSuchSubmitter,
    /// The submitter's completion ring is full. Cannot happen while every
    /// descriptor gets at most one completion (credits bound the ring's
    /// contents); seeing it means a descriptor was completed twice or a
    /// forged id was used.
    CompletionRingFull,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServiceError::RingFull => "submission ring full",
            ServiceError::NoCredit => "too many descriptors outstanding for this submitter",
            ServiceError::NoFreeSubmitter => "no free submitter id",
            ServiceError::PollerTaken => "the service already has a poller",
            ServiceError::NoSuchSubmitter => "no such submitter",
            ServiceError::CompletionRingFull => "completion ring full (completed twice?)",
        })
    }
}

impl core::error::Error for ServiceError {}

impl From<ServiceError> for crate::Error {
    fn from(e: ServiceError) -> crate::Error {
        match e {
            ServiceError::RingFull | ServiceError::NoCredit => crate::Error::SqFull,
            ServiceError::NoFreeSubmitter | ServiceError::CompletionRingFull => {
                crate::Error::ResourceExhausted
            }
            ServiceError::PollerTaken => crate::Error::ResourceBusy,
            ServiceError::NoSuchSubmitter => crate::Error::NoSuchObject,
        }
    }
}

/// A submitter's id: the index of its completion ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubmitterId(u32);

impl SubmitterId {
    /// The index, `0..S`.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// A descriptor tagged with the id of the submitter it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Submission<D> {
    /// Where its completion goes ([`Poller::try_complete`]).
    pub from: SubmitterId,
    /// The descriptor.
    pub desc: D,
}

/// A bounded submission service: one [`MpscRing`] of `SQ` descriptors,
/// drained by one [`Poller`], and `S` completion rings of `CQ` entries, one
/// per [`Submitter`]. Allocation-free: everything lives inside the value.
///
/// `D` is the descriptor, `C` the completion; both are plain `Copy` data.
pub struct SubmissionService<D, C, const SQ: usize, const CQ: usize, const S: usize> {
    sq: MpscRing<Submission<D>, SQ>,
    done: [SpscRing<C, CQ>; S],
}

impl<D: Copy, C: Copy, const SQ: usize, const CQ: usize, const S: usize> Default
    for SubmissionService<D, C, SQ, CQ, S>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<D: Copy, C: Copy, const SQ: usize, const CQ: usize, const S: usize>
    SubmissionService<D, C, SQ, CQ, S>
{
    /// Rejects (at compile time) a submitter count of 0 or beyond `u32`.
    const SUBMITTERS_OK: () = assert!(
        S >= 1 && S <= u32::MAX as usize,
        "a service has 1..=u32::MAX submitters"
    );

    ctor! {
        /// A service with no submitters and no poller (`const`, so it can be
        /// a `static`).
        pub fn new() -> Self {
            let () = Self::SUBMITTERS_OK;
            SubmissionService {
                sq: MpscRing::new(),
                done: repeat!(SpscRing::new(); S),
            }
        }
    }

    /// Registers a submitter: the first free id and its completion ring.
    ///
    /// Dropping the [`Submitter`] frees its id only if it has nothing
    /// outstanding; otherwise the id stays retired, so completions of its
    /// unfinished descriptors can never reach a later submitter.
    pub fn register(&self) -> Result<Submitter<'_, D, C, SQ, CQ>, ServiceError> {
        for (i, ring) in self.done.iter().enumerate() {
            if let Some(done) = ring.consumer() {
                return Ok(Submitter {
                    // In range: S <= u32::MAX (SUBMITTERS_OK).
                    id: SubmitterId(i as u32),
                    sq: &self.sq,
                    done: Some(done),
                    in_flight: 0,
                });
            }
        }
        Err(ServiceError::NoFreeSubmitter)
    }

    /// The poll-mode side: the submission ring's consumer and every
    /// completion ring's producer. One at a time.
    pub fn poller(&self) -> Result<Poller<'_, D, C, SQ, CQ, S>, ServiceError> {
        let sq = self.sq.consumer().ok_or(ServiceError::PollerTaken)?;
        let mut all = true;
        let done = core::array::from_fn(|i| {
            let p = self.done[i].producer();
            all &= p.is_some();
            p
        });
        // The completion rings are private and only a poller claims their
        // producers, so holding `sq` means all of them were free; checked
        // anyway (dropping `done` releases whatever was claimed).
        if !all {
            return Err(ServiceError::PollerTaken);
        }
        Ok(Poller { sq, done })
    }

    /// Descriptors queued and not yet drained (a snapshot).
    #[inline]
    pub fn queued(&self) -> usize {
        self.sq.len()
    }
}

/// An application thread's handle: submits descriptors and receives their
/// completions. Not `Clone`; send it to the thread that uses it.
pub struct Submitter<'a, D: Copy, C: Copy, const SQ: usize, const CQ: usize> {
    id: SubmitterId,
    sq: &'a MpscRing<Submission<D>, SQ>,
    /// Always `Some` until `drop`.
    done: Option<SpscConsumer<'a, C, CQ>>,
    /// Descriptors submitted whose completion has not been received.
    in_flight: usize,
}

impl<D: Copy, C: Copy, const SQ: usize, const CQ: usize> Submitter<'_, D, C, SQ, CQ> {
    /// This submitter's id (the poller sees it in [`Submission::from`]).
    #[inline]
    pub fn id(&self) -> SubmitterId {
        self.id
    }

    /// Descriptors submitted whose completion has not been received yet.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Queues `desc`. Back-pressure: [`ServiceError::RingFull`] (the ring
    /// is full) or [`ServiceError::NoCredit`] (`CQ` outstanding); nothing
    /// is queued on error.
    #[inline]
    pub fn try_submit(&mut self, desc: D) -> Result<(), ServiceError> {
        if self.in_flight >= CQ {
            return Err(ServiceError::NoCredit);
        }
        self.sq
            .try_push(Submission {
                from: self.id,
                desc,
            })
            .map_err(|Full| ServiceError::RingFull)?;
        self.in_flight += 1;
        Ok(())
    }

    /// The oldest completion, if any.
    #[inline]
    pub fn try_recv(&mut self) -> Option<C> {
        let c = self.done.as_mut()?.try_pop()?;
        self.in_flight = self.in_flight.saturating_sub(1);
        Some(c)
    }

    /// Moves up to `out.len()` completions, oldest first, into `out`;
    /// returns how many.
    #[inline]
    pub fn recv_batch(&mut self, out: &mut [C]) -> usize {
        let n = match self.done.as_mut() {
            Some(d) => d.pop_batch(out),
            None => 0,
        };
        self.in_flight = self.in_flight.saturating_sub(n);
        n
    }
}

impl<D: Copy, C: Copy, const SQ: usize, const CQ: usize> Drop for Submitter<'_, D, C, SQ, CQ> {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            if self.in_flight == 0 {
                // Nothing outstanding: the id may be reused.
                drop(done);
            } else {
                // Completions may still arrive: keep the id claimed forever.
                core::mem::forget(done);
            }
        }
    }
}

/// The poll-mode thread's handle: drains descriptors and returns
/// completions to their submitters.
pub struct Poller<'a, D: Copy, C: Copy, const SQ: usize, const CQ: usize, const S: usize> {
    sq: MpscConsumer<'a, Submission<D>, SQ>,
    /// All `Some` (checked in `SubmissionService::poller`).
    done: [Option<SpscProducer<'a, C, CQ>>; S],
}

impl<D: Copy, C: Copy, const SQ: usize, const CQ: usize, const S: usize>
    Poller<'_, D, C, SQ, CQ, S>
{
    /// Moves up to `out.len()` queued descriptors, in ring order, into
    /// `out`; returns how many. Each submitter's descriptors come out in
    /// the order it submitted them.
    #[inline]
    pub fn drain(&mut self, out: &mut [Submission<D>]) -> usize {
        self.sq.pop_batch(out)
    }

    /// The next queued descriptor, if any.
    #[inline]
    pub fn try_next(&mut self) -> Option<Submission<D>> {
        self.sq.try_pop()
    }

    /// Returns `c` to submitter `to`. Never blocks; see
    /// [`ServiceError::CompletionRingFull`] for when it can fail.
    #[inline]
    pub fn try_complete(&mut self, to: SubmitterId, c: C) -> Result<(), ServiceError> {
        match self.done.get_mut(to.index()) {
            Some(Some(p)) => p
                .try_push(c)
                .map_err(|Full| ServiceError::CompletionRingFull),
            _ => Err(ServiceError::NoSuchSubmitter),
        }
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

    type Svc = SubmissionService<u32, u64, 4, 2, 2>;

    #[test]
    fn service_routes_completions_and_applies_back_pressure() {
        let svc = Svc::new();
        let mut a = svc.register().unwrap();
        let mut b = svc.register().unwrap();
        assert_eq!((a.id().index(), b.id().index()), (0, 1));
        assert_eq!(svc.register().err(), Some(ServiceError::NoFreeSubmitter));
        let mut poll = svc.poller().unwrap();
        assert_eq!(svc.poller().err(), Some(ServiceError::PollerTaken));

        // Credits: CQ = 2 per submitter.
        a.try_submit(10).unwrap();
        a.try_submit(11).unwrap();
        assert_eq!(a.try_submit(12), Err(ServiceError::NoCredit));
        // Ring: SQ = 4.
        b.try_submit(20).unwrap();
        b.try_submit(21).unwrap();
        assert_eq!(svc.queued(), 4);
        drop(b);
        // `b` had work outstanding: its id stays retired.
        assert_eq!(svc.register().err(), Some(ServiceError::NoFreeSubmitter));

        let mut batch = [Submission::default(); 8];
        let n = poll.drain(&mut batch);
        assert_eq!(n, 4);
        let got: [(usize, u32); 4] =
            core::array::from_fn(|i| (batch[i].from.index(), batch[i].desc));
        assert_eq!(got, [(0, 10), (0, 11), (1, 20), (1, 21)]);
        for s in &batch[..n] {
            poll.try_complete(s.from, u64::from(s.desc) * 100).unwrap();
        }
        assert_eq!(
            poll.try_complete(SubmitterId(0), 1),
            Err(ServiceError::CompletionRingFull)
        );
        assert_eq!(
            poll.try_complete(SubmitterId(2), 1),
            Err(ServiceError::NoSuchSubmitter)
        );
        assert_eq!(a.in_flight(), 2);
        assert_eq!(a.try_recv(), Some(1000));
        let mut out = [0u64; 4];
        assert_eq!(a.recv_batch(&mut out), 1);
        assert_eq!(out[0], 1100);
        assert_eq!(a.in_flight(), 0);
        assert_eq!(a.try_recv(), None);
        drop(a);
        // Nothing outstanding: id 0 is free again.
        assert_eq!(svc.register().unwrap().id().index(), 0);
        assert_eq!(
            crate::Error::from(ServiceError::RingFull),
            crate::Error::SqFull
        );
    }

    #[test]
    fn service_ring_full_is_reported() {
        let svc: SubmissionService<u8, u8, 2, 4, 1> = SubmissionService::new();
        let mut a = svc.register().unwrap();
        a.try_submit(1).unwrap();
        a.try_submit(2).unwrap();
        assert_eq!(a.try_submit(3), Err(ServiceError::RingFull));
        assert_eq!(a.in_flight(), 2, "a refused descriptor takes no credit");
        let mut poll = svc.poller().unwrap();
        let s = poll.try_next().unwrap();
        assert_eq!((s.from, s.desc), (a.id(), 1));
        a.try_submit(3).unwrap();
        drop(poll);
        // A new poller continues where the old one stopped.
        let mut poll = svc.poller().unwrap();
        assert_eq!(poll.try_next().map(|s| s.desc), Some(2));
        assert_eq!(poll.try_next().map(|s| s.desc), Some(3));
        assert_eq!(poll.try_next(), None);
        for v in [1, 2, 3] {
            poll.try_complete(SubmitterId(0), v).unwrap();
        }
        let mut out = [0u8; 4];
        assert_eq!(a.recv_batch(&mut out), 3);
        assert_eq!(&out[..3], &[1, 2, 3]);
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

    /// The service on real threads: two submitters and the poller, so the
    /// completion rings are used concurrently too (small enough for Miri).
    #[test]
    fn service_threads() {
        const PER: u32 = if cfg!(miri) { 40 } else { 10_000 };
        let svc: SubmissionService<u32, u32, 4, 2, 2> = SubmissionService::new();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let svc = &svc;
                s.spawn(move || {
                    let mut sub = svc.register().unwrap();
                    let (mut next, mut done) = (0u32, 0u32);
                    while done < PER {
                        if next < PER && sub.try_submit(next).is_ok() {
                            next += 1;
                        }
                        match sub.try_recv() {
                            Some(c) => {
                                assert_eq!(c, done * 2, "own completions, in order");
                                done += 1;
                            }
                            None => std::thread::yield_now(),
                        }
                    }
                });
            }
            let mut poll = svc.poller().unwrap();
            let mut batch = [Submission::default(); 4];
            let mut n_done = 0;
            while n_done < 2 * PER {
                let n = poll.drain(&mut batch);
                if n == 0 {
                    std::thread::yield_now();
                }
                for b in &batch[..n] {
                    poll.try_complete(b.from, b.desc * 2).unwrap();
                }
                n_done += n as u32;
            }
        });
    }
}

/// Loom models (`RUSTFLAGS="--cfg loom"`, see `ci/loom.sh`). Rings are
/// shrunk to two slots so every model wraps around and hits the full path;
/// with `LOOM_MAX_PREEMPTIONS=2` each model runs in seconds.
///
/// Retry loops in spawned threads are bounded ([`TRIES`] attempts, each
/// followed by a yield). Loom explores every choice of thread at a yield,
/// so two threads spinning on each other without bound would let it build
/// an endless execution in which a third thread (the one they wait for)
/// never runs ("model exceeded maximum number of branches"). Instead, each
/// model joins its threads and then drains what is left without any
/// concurrency, and checks the result of the whole execution: every value
/// that was pushed came out exactly once, in each producer's order. Static
/// flags then assert that the explored executions did include refused
/// pushes that later succeeded (and, for the service, a released id being
/// reused), so the bound does not hide the back-pressure paths.
///
/// Besides [`relaxed_publish_is_caught`] (kept as a test), these weakenings
/// were tried by hand and each made the models fail with a loom
/// "Causality violation" within a fraction of a second:
/// - consumer frees a slot with `Relaxed` instead of `Release`
///   (`MpscConsumer::take`): concurrent writes to the slot by the
///   producers of two laps, in both MPSC models and the service model;
/// - producer loads the stamp with `Relaxed` instead of `Acquire`
///   (`push_with`): the same write/write race;
/// - SPSC producer publishes `tail` with `Relaxed` instead of `Release`:
///   concurrent read and write of a completion slot, in the SPSC and the
///   service models.
#[cfg(all(loom, test))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;
    use std::string::String;
    use std::vec::Vec;

    /// Attempts per bounded retry loop.
    const TRIES: usize = 2;

    /// Facts about the explored executions as a whole (plain std atomics:
    /// they live outside the model, across executions).
    struct Seen(std::sync::atomic::AtomicBool);

    impl Seen {
        const fn new() -> Seen {
            Seen(std::sync::atomic::AtomicBool::new(false))
        }
        fn set(&self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        fn get(&self) -> bool {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// Runs `f` until it succeeds, at most [`TRIES`] times, yielding after
    /// each failure. Returns the number of failures before success, or
    /// `None` if it never succeeded.
    fn retry(mut f: impl FnMut() -> bool) -> Option<usize> {
        for i in 0..TRIES {
            if f() {
                return Some(i);
            }
            thread::yield_now();
        }
        None
    }

    /// Every pushed value came out exactly once, and each producer's
    /// values (producer `k` pushes `10k + 1, 10k + 2, ...`) in its order.
    fn check_exactly_once(got: &[u32], pushed: &[u32]) {
        for k in 0..4 {
            let mine: Vec<u32> = got.iter().copied().filter(|v| v / 10 == k).collect();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "order of {k}: {got:?}"
            );
        }
        let mut a = got.to_vec();
        let mut b = pushed.to_vec();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "popped vs pushed");
    }

    /// Producer thread `k`: pushes `10k + 1 ..= 10k + n` in order, giving
    /// up at the first value that stays refused; returns what it pushed.
    fn producer(
        r: &Arc<MpscRing<u32, 2>>,
        k: u32,
        n: u32,
        full: &'static Seen,
        after_full: &'static Seen,
    ) -> thread::JoinHandle<Vec<u32>> {
        let r = r.clone();
        thread::spawn(move || {
            let mut pushed = Vec::new();
            for v in (1..=n).map(|i| 10 * k + i) {
                match retry(|| r.try_push(v).is_ok()) {
                    Some(0) => pushed.push(v),
                    Some(_) => {
                        full.set();
                        after_full.set();
                        pushed.push(v);
                    }
                    None => {
                        full.set();
                        break;
                    }
                }
            }
            pushed
        })
    }

    static TWO_FULL: Seen = Seen::new();
    static TWO_AFTER_FULL: Seen = Seen::new();

    /// Two producers push two values each through a two-slot ring while
    /// the consumer pops: the second lap reuses both slots.
    #[test]
    fn mpsc_two_producers_one_consumer() {
        loom::model(|| {
            let r = Arc::new(MpscRing::<u32, 2>::new());
            let hs = [0, 1].map(|k| producer(&r, k, 2, &TWO_FULL, &TWO_AFTER_FULL));
            let mut c = r.consumer().unwrap();
            let mut got = Vec::new();
            for _ in 0..TRIES {
                match c.try_pop() {
                    Some(v) => got.push(v),
                    None => thread::yield_now(),
                }
            }
            let pushed: Vec<u32> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
            // Quiescent: everything pushed is published and visible.
            while let Some(v) = c.try_pop() {
                got.push(v);
            }
            // Lap 0 cannot be refused: the first two claims always succeed.
            assert!(pushed.len() >= 2, "{pushed:?}");
            check_exactly_once(&got, &pushed);
            assert!(r.is_empty());
        });
        assert!(
            TWO_FULL.get() && TWO_AFTER_FULL.get(),
            "back-pressure path not explored"
        );
    }

    static THREE_FULL: Seen = Seen::new();
    static THREE_AFTER_FULL: Seen = Seen::new();

    /// Three producers, one value each, into two slots: two spawned
    /// producers, and the main thread, which pushes before it starts
    /// consuming (a fourth thread would make the model take minutes). The
    /// third push is refused unless the consumer freed a slot first; some
    /// executions see it accepted after a refusal.
    #[test]
    fn mpsc_three_producers_back_pressure() {
        loom::model(|| {
            let r = Arc::new(MpscRing::<u32, 2>::new());
            let hs = [0, 1].map(|k| producer(&r, k, 1, &THREE_FULL, &THREE_AFTER_FULL));
            let mut pushed = Vec::new();
            match retry(|| r.try_push(21).is_ok()) {
                Some(_) => pushed.push(21),
                None => THREE_FULL.set(),
            }
            let mut c = r.consumer().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u32; 2];
            for _ in 0..TRIES {
                let n = c.pop_batch(&mut buf);
                got.extend_from_slice(&buf[..n]);
                thread::yield_now();
            }
            pushed.extend(hs.into_iter().flat_map(|h| h.join().unwrap()));
            loop {
                let n = c.pop_batch(&mut buf);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(pushed.len() >= 2, "{pushed:?}");
            check_exactly_once(&got, &pushed);
        });
        assert!(
            THREE_FULL.get() && THREE_AFTER_FULL.get(),
            "back-pressure path not explored"
        );
    }

    /// SPSC: three values through two slots, popped one by one and by
    /// batch; FIFO, each exactly once. Two threads only, so both may spin
    /// without bound.
    #[test]
    fn spsc_wraps_in_order() {
        loom::model(|| {
            let r = Arc::new(SpscRing::<u32, 2>::new());
            let h = {
                let r = r.clone();
                thread::spawn(move || {
                    let mut p = r.producer().unwrap();
                    for v in 1..=3 {
                        while p.try_push(v).is_err() {
                            thread::yield_now();
                        }
                    }
                })
            };
            let mut c = r.consumer().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u32; 2];
            while got.len() < 3 {
                let n = if got.is_empty() {
                    usize::from(c.try_pop().map(|v| buf[0] = v).is_some())
                } else {
                    c.pop_batch(&mut buf)
                };
                if n == 0 {
                    thread::yield_now();
                }
                got.extend_from_slice(&buf[..n]);
            }
            h.join().unwrap();
            assert_eq!(got, [1, 2, 3]);
            assert_eq!(c.try_pop(), None);
        });
    }

    type Svc = SubmissionService<u32, u32, 2, 2, 2>;

    /// What a submitter thread reports after it has been joined.
    struct Report {
        k: u32,
        id: SubmitterId,
        submitted: Vec<u32>,
        received: Vec<u32>,
        /// Outstanding when the thread ended (0: the id was released and
        /// may have been taken by the other submitter).
        in_flight: usize,
    }

    /// A consumer for a completion ring whose handle a joined submitter
    /// thread left claimed (it still had descriptors outstanding, so its
    /// `Drop` retired the id). Test-only: sound because that thread is
    /// gone, so this is the only consumer.
    fn orphaned_consumer(r: &SpscRing<u32, 2>) -> SpscConsumer<'_, u32, 2> {
        r.consumer().unwrap_or_else(|| SpscConsumer {
            ring: r,
            head: r.head.0.pos.load(Ordering::Relaxed),
            tail: r.tail.0.pos.load(Ordering::Acquire),
        })
    }

    static SVC_BACK_PRESSURE: Seen = Seen::new();
    static SVC_ID_REUSED: Seen = Seen::new();

    /// The whole service: two submitters register concurrently and submit
    /// two descriptors each (credits: two outstanding; ring: two slots)
    /// while the poll-mode thread drains and completes each with
    /// `desc + 100`. Every descriptor reaches the poller tagged with its
    /// submitter's id, and every completion reaches exactly that
    /// submitter, once, in submission order.
    #[test]
    fn service_returns_completions_to_their_submitter() {
        loom::model(|| {
            let svc = Arc::new(Svc::new());
            let hs = [0u32, 1].map(|k| {
                let svc = svc.clone();
                thread::spawn(move || {
                    let mut sub = svc.register().unwrap();
                    let (mut submitted, mut received) = (Vec::new(), Vec::new());
                    for d in [10 * k + 1, 10 * k + 2] {
                        let ok = retry(|| match sub.try_submit(d) {
                            Ok(()) => true,
                            Err(ServiceError::RingFull | ServiceError::NoCredit) => {
                                SVC_BACK_PRESSURE.set();
                                received.extend(sub.try_recv());
                                false
                            }
                            Err(e) => panic!("{e}"),
                        });
                        if ok.is_none() {
                            break;
                        }
                        submitted.push(d);
                    }
                    let _ = retry(|| {
                        received.extend(sub.try_recv());
                        sub.in_flight() == 0
                    });
                    Report {
                        k,
                        id: sub.id(),
                        submitted,
                        received,
                        in_flight: sub.in_flight(),
                    }
                })
            });
            let mut from = Vec::new();
            let mut batch = [Submission::default(); 2];
            let mut complete =
                |poll: &mut Poller<'_, u32, u32, 2, 2, 2>, n: usize, batch: &[Submission<u32>]| {
                    for s in &batch[..n] {
                        poll.try_complete(s.from, s.desc + 100).unwrap();
                        from.push((s.desc / 10, s.from));
                    }
                };
            let mut poll = svc.poller().unwrap();
            for _ in 0..TRIES {
                let n = poll.drain(&mut batch);
                complete(&mut poll, n, &batch);
                thread::yield_now();
            }
            let reports = hs.map(|h| h.join().unwrap());
            // Quiescent: finish the work without concurrency.
            loop {
                let n = poll.drain(&mut batch);
                if n == 0 {
                    break;
                }
                complete(&mut poll, n, &batch);
            }
            // The ids differ, unless one submitter finished with nothing
            // outstanding (releasing its id) before the other registered.
            if reports[0].id == reports[1].id {
                assert!(reports.iter().any(|r| r.in_flight == 0));
                SVC_ID_REUSED.set();
            }
            for (k, id) in from {
                assert_eq!(
                    reports[k as usize].id, id,
                    "descriptor tagged with its submitter"
                );
            }
            for r in &reports {
                let mut got = r.received.clone();
                if r.in_flight > 0 {
                    let mut rest = orphaned_consumer(&svc.done[r.id.index()]);
                    while let Some(c) = rest.try_pop() {
                        got.push(c);
                    }
                }
                let want: Vec<u32> = r.submitted.iter().map(|d| d + 100).collect();
                assert_eq!(got, want, "completions of submitter {}", r.k);
            }
            assert!(svc.done.iter().all(|d| d.is_empty()), "a stray completion");
            // Lap 0 of the ring and the first credits cannot be refused.
            assert!(reports.iter().map(|r| r.submitted.len()).sum::<usize>() >= 2);
        });
        assert!(SVC_BACK_PRESSURE.get(), "back-pressure path not explored");
        assert!(SVC_ID_REUSED.get(), "id reuse after release not explored");
    }

    /// The deliberately broken ordering: the producer publishes its slot
    /// with a Relaxed stamp store instead of Release. The model must find
    /// the execution where the consumer's Acquire load sees the new stamp
    /// without synchronising with the producer; loom's `UnsafeCell`
    /// tracking then reports the unsynchronised read of the slot.
    ///
    /// The failing trace loom finds (needs no preemption at all):
    ///
    /// 1. producer: `head` CAS 0 -> 1 claims position 0;
    /// 2. producer: `slots[0].val.with_mut` writes the value;
    /// 3. producer: `slots[0].stamp.store(1, Relaxed)` -- no release;
    /// 4. consumer: `slots[0].stamp.load(Acquire)` reads 1 ("published"),
    ///    but a Relaxed store creates no happens-before edge;
    /// 5. consumer: `slots[0].val.with` -> panic "Causality violation:
    ///    Concurrent read and write accesses to `UnsafeCell`".
    ///
    /// On hardware this is a stale or torn descriptor on weakly ordered
    /// CPUs (aarch64), or after a compiler reordering on any CPU.
    #[test]
    fn relaxed_publish_is_caught() {
        let caught = std::panic::catch_unwind(|| {
            loom::model(|| {
                let r = Arc::new(MpscRing::<u64, 2>::new());
                let h = {
                    let r = r.clone();
                    thread::spawn(move || {
                        r.push_with(0x1234_5678_9abc_def0, Ordering::Relaxed)
                            .unwrap();
                    })
                };
                let mut c = r.consumer().unwrap();
                loop {
                    if let Some(v) = c.try_pop() {
                        assert_eq!(v, 0x1234_5678_9abc_def0);
                        break;
                    }
                    thread::yield_now();
                }
                h.join().unwrap();
            });
        });
        let err = caught.expect_err("loom must catch the Relaxed publish");
        let msg = err
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| err.downcast_ref::<&str>().copied())
            .unwrap_or("");
        assert!(
            msg.contains("Causality violation"),
            "unexpected failure: {msg}"
        );
    }

    /// The same model with the production (Release) publish passes.
    #[test]
    fn release_publish_passes() {
        loom::model(|| {
            let r = Arc::new(MpscRing::<u64, 2>::new());
            let h = {
                let r = r.clone();
                thread::spawn(move || r.try_push(0x1234_5678_9abc_def0).unwrap())
            };
            let mut c = r.consumer().unwrap();
            loop {
                if let Some(v) = c.try_pop() {
                    assert_eq!(v, 0x1234_5678_9abc_def0);
                    break;
                }
                thread::yield_now();
            }
            h.join().unwrap();
        });
    }
}
