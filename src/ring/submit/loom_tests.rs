//! Loom models of the MPSC and SPSC rings and of the whole submission
//! service (run by `scripts/loom.sh`).

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
