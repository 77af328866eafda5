//! The service facade: [`SubmissionService`] ties one MPSC submission ring
//! to per-[`Submitter`] completion rings, drained by one [`Poller`].

use core::fmt;

use super::mpsc::{MpscConsumer, MpscRing};
use super::spsc::{SpscConsumer, SpscProducer, SpscRing};
use super::Full;

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
    pub(super) done: [SpscRing<C, CQ>; S],
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

    /// Builds a service with no submitters and no poller at `this`, ring
    /// by ring, without building it on the stack first (a service with
    /// thousands of slots can be larger than a thread's stack; the C API
    /// allocates its services this way).
    ///
    /// # Safety
    /// `this` must be valid for writes of one `Self` and aligned for it.
    /// Whatever it held is overwritten without being dropped.
    pub unsafe fn init_in_place(this: *mut Self) {
        let () = Self::SUBMITTERS_OK;
        // SAFETY: `this` is valid for writes and aligned (caller contract),
        // so each field place is; every ring is written once, the large
        // submission ring in place and each completion ring (one `CQ`-slot
        // ring, as an element of the `done` array) as a value.
        unsafe {
            MpscRing::init_in_place(core::ptr::addr_of_mut!((*this).sq));
            let done = core::ptr::addr_of_mut!((*this).done).cast::<SpscRing<C, CQ>>();
            for i in 0..S {
                done.add(i).write(SpscRing::new());
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

    /// A service built in place on the heap behaves as one built by `new`
    /// (registration, back-pressure, routing), and drops cleanly.
    #[test]
    fn service_init_in_place() {
        type Big = SubmissionService<u64, u32, 8, 2, 3>;
        let mut b = std::boxed::Box::<Big>::new_uninit();
        // SAFETY: the box is valid for writes of one `Big` and aligned.
        unsafe { Big::init_in_place(b.as_mut_ptr()) };
        // SAFETY: `init_in_place` initialised every field.
        let svc = unsafe { b.assume_init() };
        let mut a = svc.register().unwrap();
        assert_eq!(a.id().index(), 0);
        let mut poll = svc.poller().unwrap();
        for v in 0..2 {
            a.try_submit(v).unwrap();
        }
        assert_eq!(a.try_submit(9), Err(ServiceError::NoCredit));
        assert_eq!(svc.queued(), 2);
        let mut batch = [Submission::default(); 4];
        assert_eq!(poll.drain(&mut batch), 2);
        poll.try_complete(a.id(), 5).unwrap();
        assert_eq!(a.try_recv(), Some(5));
        assert_eq!(svc.register().unwrap().id().index(), 1);
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
