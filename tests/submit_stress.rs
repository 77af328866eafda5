//! Real-thread stress of the submission service (`ring::submit`): four
//! submitter threads push 250 000 descriptors each through one bounded
//! MPSC ring to a poll-mode thread, which returns a completion for each
//! through the submitter's SPSC ring. (Fast enough unscaled in debug
//! builds too: well under a second on two cores.)
//!
//! Checked: every descriptor reaches the poller exactly once, tagged with
//! its submitter and in that submitter's order; every completion returns to
//! exactly that submitter, once, in order, carrying the right payload.
//! Back-pressure (full ring, no credit) is expected and counted.
//!
//! `cargo test --release --test submit_stress -- --nocapture` prints the
//! rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::ring::submit::{ServiceError, Submission, SubmissionService};

const SUBMITTERS: usize = 4;
const PER_SUBMITTER: u64 = 250_000;
const DEADLINE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Desc {
    /// Per-submitter sequence number.
    seq: u64,
    /// A payload derived from the sequence number and the submitter.
    payload: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Done {
    seq: u64,
    /// `f(payload)`, so a mixed-up completion is caught.
    check: u64,
}

fn payload(sub: usize, seq: u64) -> u64 {
    seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (sub as u64) << 56
}

fn check_of(payload: u64) -> u64 {
    payload.rotate_left(17) ^ 0x5555_5555_5555_5555
}

// 4 x 256 credits exceed the 512-slot ring, so both kinds of back-pressure
// occur.
type Svc = SubmissionService<Desc, Done, 512, 256, SUBMITTERS>;

#[test]
fn four_submitters_one_poller_every_descriptor_completes_once() {
    let svc: Box<Svc> = Box::default();
    let total = SUBMITTERS as u64 * PER_SUBMITTER;
    let ring_full = AtomicU64::new(0);
    let no_credit = AtomicU64::new(0);
    // Every submitter holds its id before any submits: a thread that
    // started late could otherwise register after an early one finished
    // and reuse its freed id (by design), which this test's per-id order
    // check would misread as a reordering.
    let registered = Barrier::new(SUBMITTERS);
    let start = Instant::now();

    let (batches, drained) = thread::scope(|s| {
        for _ in 0..SUBMITTERS {
            let svc = &*svc;
            let (ring_full, no_credit, registered) = (&ring_full, &no_credit, &registered);
            s.spawn(move || {
                let mut sub = svc.register().expect("a free id");
                registered.wait();
                let id = sub.id().index();
                let mut next_submit = 0u64;
                let mut next_done = 0u64;
                let mut buf = [Done::default(); 64];
                let (mut full, mut credit) = (0u64, 0u64);
                while next_done < PER_SUBMITTER {
                    let mut progress = false;
                    while next_submit < PER_SUBMITTER {
                        let d = Desc {
                            seq: next_submit,
                            payload: payload(id, next_submit),
                        };
                        match sub.try_submit(d) {
                            Ok(()) => {
                                next_submit += 1;
                                progress = true;
                            }
                            Err(ServiceError::RingFull) => {
                                full += 1;
                                break;
                            }
                            Err(ServiceError::NoCredit) => {
                                credit += 1;
                                break;
                            }
                            Err(e) => panic!("submit: {e}"),
                        }
                    }
                    let n = sub.recv_batch(&mut buf);
                    for c in &buf[..n] {
                        assert_eq!(c.seq, next_done, "submitter {id}: completion order");
                        assert_eq!(c.check, check_of(payload(id, c.seq)), "submitter {id}");
                        next_done += 1;
                    }
                    if !progress && n == 0 {
                        assert!(start.elapsed() < DEADLINE, "submitter {id} stuck");
                        thread::yield_now();
                    }
                }
                assert_eq!(sub.in_flight(), 0);
                assert_eq!(sub.try_recv(), None, "submitter {id}: extra completion");
                ring_full.fetch_add(full, Ordering::Relaxed);
                no_credit.fetch_add(credit, Ordering::Relaxed);
            });
        }

        let svc = &*svc;
        s.spawn(move || {
            let mut poll = svc.poller().expect("one poller");
            let mut next = [0u64; SUBMITTERS];
            let mut batch = [Submission::<Desc>::default(); 64];
            let (mut done, mut batches) = (0u64, 0u64);
            while done < total {
                let n = poll.drain(&mut batch);
                if n == 0 {
                    assert!(start.elapsed() < DEADLINE, "poller stuck at {done}");
                    thread::yield_now();
                    continue;
                }
                batches += 1;
                for s in &batch[..n] {
                    let i = s.from.index();
                    assert_eq!(s.desc.seq, next[i], "submitter {i}: ring order");
                    assert_eq!(s.desc.payload, payload(i, s.desc.seq));
                    next[i] += 1;
                    let c = Done {
                        seq: s.desc.seq,
                        check: check_of(s.desc.payload),
                    };
                    poll.try_complete(s.from, c)
                        .expect("credits bound the ring");
                }
                done += n as u64;
            }
            assert_eq!(next, [PER_SUBMITTER; SUBMITTERS]);
            assert_eq!(poll.try_next(), None, "nothing beyond the total");
            (batches, done)
        })
        .join()
        .unwrap()
    });

    let el = start.elapsed();
    assert_eq!(drained, total);
    assert_eq!(svc.queued(), 0);
    println!(
        "submit_stress: {total} descriptors in {:.3} s ({:.1} M/s round trip), {batches} \
         batches (avg {:.1}), back-pressure: {} ring full, {} no credit",
        el.as_secs_f64(),
        total as f64 / el.as_secs_f64() / 1e6,
        total as f64 / batches as f64,
        ring_full.load(Ordering::Relaxed),
        no_credit.load(Ordering::Relaxed),
    );
}
