//! Stress test of lock-free multi-producer posting with real threads (not
//! loom): four producers post millions of 8-byte inline RDMA WRITEs
//! through ONE shared QP on the software HCA's device thread, while a
//! poller thread checks that every WR completes exactly once. Two
//! producers post one WR per call, the other two lists of 8 (one
//! reservation per list, and a prefix when the queue is short).
//!
//! Size: 2,000,000 WRs in all in release builds, 1,000 in debug builds;
//! `RDD_STRESS_WRS=N` overrides (for example
//! `RDD_STRESS_WRS=20000000 cargo test --release --test mp_stress -- --nocapture`).
//! `RDD_STRESS_SIGNAL=K` signals one WR in K per producer (default 16;
//! 1 signals every WR).
//!
//! What "exactly once" means with selective signaling: a completion for a
//! signaled WR retires it and every earlier WR in the ring, and each
//! producer's WRs sit in the ring in its posting order, so a completion
//! for producer p's WR i means all of p's WRs up to i have completed. The
//! poller therefore checks, per producer, that the signaled completions
//! arrive successfully, each once, exactly in the expected sequence
//! (i = K-1, 2K-1, ..., and the producer's last WR, which is always
//! signaled); the last one accounts for all of that producer's WRs.
//!
//! Target memory: each WR writes its own tag (producer, index) into its
//! own 8-byte slot of the peer's region (slot = index mod [`WINDOW`] per
//! producer, so 8 bytes per WR up to 8 MiB per producer). After the run
//! every slot is checked against the tag of the last WR that wrote it: at
//! the default size each WR has a slot of its own, so this proves that
//! every WR, signaled or not, executed and landed its data (something the
//! completions alone cannot show for unsignaled WRs); with a larger
//! `RDD_STRESS_WRS` it covers each producer's last [`WINDOW`] WRs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, PostError, Remote, SendFlags, SendOp, SendWr};

#[path = "support/loopback.rs"]
mod loopback;
use loopback::connect_loopback;

const PRODUCERS: u64 = 4;
/// WRs per list of the producers that post lists (see [`list_len`]).
const LIST: u64 = 8;
/// Target slots per producer (8 bytes each).
const WINDOW: u64 = 1 << 20;
/// wr_id = producer << ID_SHIFT | index.
const ID_SHIFT: u32 = 48;
/// A thread that makes no progress for this long fails the test.
const STALL: Duration = Duration::from_secs(60);

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.parse::<u64>() {
        Ok(n) if n > 0 => Some(n),
        _ => panic!("{name} must be a positive integer, not {v:?}"),
    }
}

/// What the test posts, shared by every thread.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// WRs per producer.
    per: u64,
    /// One WR in `signal` is signaled (plus each producer's last).
    signal: u64,
}

impl Plan {
    /// Target slots per producer.
    fn slots(&self) -> u64 {
        self.per.min(WINDOW)
    }
    /// Byte offset in the target region that producer `p`'s WR `i` writes.
    fn offset(&self, p: u64, i: u64) -> u64 {
        (p * self.slots() + i % self.slots()) * 8
    }
    fn signaled(&self, i: u64) -> bool {
        i % self.signal == self.signal - 1 || i == self.per - 1
    }
    /// The signaled index after `i` (None after the last WR).
    fn next_signaled(&self, i: Option<u64>) -> Option<u64> {
        let n = match i {
            None => self.signal - 1,
            Some(i) if i == self.per - 1 => return None,
            Some(i) => i + self.signal,
        };
        Some(n.min(self.per - 1))
    }
}

/// The value WR (p, i) writes: never 0, so an unwritten slot shows.
fn tag(p: u64, i: u64) -> u64 {
    (p << ID_SHIFT | i) + 1
}

/// WRs per `post_send` list for producer `p`: even producers post one WR
/// per call (`post_send_one`), odd ones lists of [`LIST`] (`post_send`,
/// one reservation and one doorbell request per list), so single posts
/// and lists interleave in the ring.
fn list_len(p: u64) -> u64 {
    if p % 2 == 1 {
        LIST
    } else {
        1
    }
}

/// Posts `plan.per` WRs for producer `p`; returns (posts, refusals).
fn produce(
    qp: &SharedQp<SoftDevice>,
    target: Remote,
    plan: Plan,
    p: u64,
    abort: &AtomicBool,
) -> Result<(u64, u64), String> {
    let mut refused = 0u64;
    let list = list_len(p);
    let mut i = 0;
    while i < plan.per {
        let n = list.min(plan.per - i);
        let bytes: Vec<[u8; 8]> = (i..i + n).map(|k| tag(p, k).to_ne_bytes()).collect();
        let data: Vec<[&[u8]; 1]> = bytes.iter().map(|b| [&b[..]]).collect();
        let wrs: Vec<SendWr<'_>> = (i..i + n)
            .zip(&data)
            .map(|(k, d)| {
                let remote = Remote::new(target.addr + plan.offset(p, k), target.rkey);
                let flags = if plan.signaled(k) {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                SendWr::inline(p << ID_SHIFT | k, SendOp::Write { remote }, d, flags)
            })
            .collect();
        // Posted WRs of this list; a refusal posts a prefix.
        let mut off = 0;
        let mut tries = 0u32;
        let since = Instant::now();
        while off < wrs.len() {
            let r = if list == 1 {
                qp.post_send_one(&wrs[0])
                    .map_err(|error| PostError { index: 0, error })
            } else {
                qp.post_send(&wrs[off..])
            };
            match r {
                Ok(()) => off = wrs.len(),
                Err(PostError {
                    index,
                    error: Error::SqFull,
                }) => {
                    off += index;
                    refused += 1;
                    tries += 1;
                    if tries < 16 {
                        std::hint::spin_loop();
                    } else {
                        thread::yield_now();
                    }
                    if tries % 1024 == 0 {
                        if abort.load(Ordering::Relaxed) {
                            return Err(format!("producer {p}: aborted at WR {}", i + off as u64));
                        }
                        if since.elapsed() > STALL {
                            return Err(format!(
                                "producer {p}: queue full for {STALL:?} at WR {}",
                                i + off as u64
                            ));
                        }
                    }
                }
                Err(e) => {
                    return Err(format!(
                        "producer {p}: WR {}: {}",
                        i + (off + e.index) as u64,
                        e.error
                    ))
                }
            }
        }
        i += n;
    }
    Ok((plan.per, refused))
}

/// Polls until every producer's last WR has completed, checking the
/// signaled sequence of each producer. Returns the signaled completions.
fn poll(
    mut cq: Cq<SoftDevice>,
    mut poller: SharedQpPoller<SoftDevice>,
    plan: Plan,
    abort: &AtomicBool,
) -> Result<u64, String> {
    let mut next: Vec<Option<u64>> = vec![plan.next_signaled(None); PRODUCERS as usize];
    // WRs of each producer known complete (a completion for WR i implies
    // 0..=i).
    let mut complete = vec![0u64; PRODUCERS as usize];
    let mut finished = 0;
    let mut seen = 0u64;
    let mut wc = [Wc::default(); 64];
    let mut last_progress = Instant::now();
    let mut idle = 0u32;
    while finished < PRODUCERS {
        let n = cq
            .poll_shared(&mut poller, &mut wc)
            .map_err(|e| format!("poll: {e}"))?;
        for w in &wc[..n] {
            let (p, i) = (w.wr_id >> ID_SHIFT, w.wr_id & ((1 << ID_SHIFT) - 1));
            if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::RDMA_WRITE {
                return Err(format!(
                    "WR ({p}, {i}): status {:?}, opcode {:?}, syndrome {:#x}",
                    w.status, w.opcode, w.vendor_err
                ));
            }
            let Some(want) = next.get(p as usize).copied() else {
                return Err(format!(
                    "completion for unknown producer {p} (wr_id {:#x})",
                    w.wr_id
                ));
            };
            match want {
                Some(want) if want == i => {}
                Some(want) => {
                    return Err(format!(
                        "producer {p}: WR {i} completed, expected WR {want} \
                         (a duplicate, a loss or out of order)"
                    ))
                }
                None => return Err(format!("producer {p}: WR {i} completed after its last")),
            }
            if !plan.signaled(i) {
                return Err(format!("producer {p}: unsignaled WR {i} reported"));
            }
            complete[p as usize] = i + 1;
            next[p as usize] = plan.next_signaled(Some(i));
            if next[p as usize].is_none() {
                finished += 1;
            }
        }
        seen += n as u64;
        if n > 0 {
            idle = 0;
            last_progress = Instant::now();
        } else {
            idle += 1;
            if idle < 64 {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
                if idle % 1024 == 0 {
                    if abort.load(Ordering::Relaxed) {
                        return Err(format!(
                            "poller: aborted; complete per producer {complete:?}"
                        ));
                    }
                    if last_progress.elapsed() > STALL {
                        return Err(format!(
                            "poller: no completion for {STALL:?}; complete per producer {complete:?}"
                        ));
                    }
                }
            }
        }
    }
    if let Some(p) = complete.iter().position(|&c| c != plan.per) {
        return Err(format!(
            "producer {p}: {} of {} complete",
            complete[p], plan.per
        ));
    }
    // Nothing may follow the last completions.
    thread::sleep(Duration::from_millis(20));
    let n = cq
        .poll_shared(&mut poller, &mut wc)
        .map_err(|e| format!("poll: {e}"))?;
    if n != 0 {
        return Err(format!(
            "{n} completions after the last WRs (first wr_id {:#x})",
            wc[0].wr_id
        ));
    }
    Ok(seen)
}

#[test]
fn four_producers_millions_of_wrs_each_once() {
    let total = env_u64("RDD_STRESS_WRS").unwrap_or(if cfg!(debug_assertions) {
        1_000
    } else {
        2_000_000
    });
    let signal = env_u64("RDD_STRESS_SIGNAL").unwrap_or(16);
    let per = total.div_ceil(PRODUCERS);
    assert!(per < 1 << ID_SHIFT, "too many WRs");
    let plan = Plan { per, signal };

    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let peer_cq = dev.create_cq(1024).unwrap();
    let init = QpInit {
        max_send_wr: 1024,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 8,
        srq: None,
    };
    let mut a = pd.create_qp(&cq, &cq, &init).unwrap();
    let mut b = pd.create_qp(&peer_cq, &peer_cq, &init).unwrap();
    connect_loopback(&mut a, &mut b, Access::REMOTE_WRITE);
    let target = pd
        .register(
            (PRODUCERS * plan.slots() * 8) as usize,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let remote = target.remote(0);
    let (shared, poller) = a.into_shared().unwrap();

    dev.backend().start();
    let abort = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (qp, abort) = (Arc::clone(&shared), Arc::clone(&abort));
            thread::spawn(move || {
                let r = produce(&qp, remote, plan, p, &abort);
                if r.is_err() {
                    abort.store(true, Ordering::Relaxed);
                }
                r
            })
        })
        .collect();
    let poll_abort = Arc::clone(&abort);
    let poller = thread::spawn(move || {
        let r = poll(cq, poller, plan, &poll_abort);
        if r.is_err() {
            poll_abort.store(true, Ordering::Relaxed);
        }
        r
    });
    let results: Vec<_> = producers
        .into_iter()
        .map(|h| h.join().expect("producer panicked"))
        .collect();
    let polled = poller.join().expect("poller panicked");
    let secs = start.elapsed().as_secs_f64();
    dev.backend().stop();

    // Report every thread's error: the first failure makes the others
    // abort, and the root cause may be in any of them.
    let mut errors: Vec<String> = results.iter().filter_map(|r| r.clone().err()).collect();
    if let Err(e) = &polled {
        errors.push(e.clone());
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let refused: u64 = results.iter().map(|r| r.as_ref().map_or(0, |v| v.1)).sum();
    let signaled = polled.unwrap_or_default();
    println!(
        "mp_stress: {} WRs ({PRODUCERS} producers x {per}), 1 in {signal} signaled \
         ({signaled} completions), {refused} SqFull refusals, {secs:.2} s, {:.2} M WRs/s",
        PRODUCERS * per,
        (PRODUCERS * per) as f64 / secs / 1e6
    );

    // Target memory: every slot holds the tag of the last WR that wrote
    // it (at the default size, every WR's own slot).
    let mut checked = 0u64;
    for p in 0..PRODUCERS {
        for i in per - plan.slots()..per {
            let off = plan.offset(p, i) as usize;
            let got = target.load_u64(off).expect("slot inside the region");
            if got != tag(p, i) {
                panic!(
                    "producer {p}: the slot of WR {i} holds {got:#x}, not its tag {:#x} \
                     (WR lost, misplaced or overwritten)",
                    tag(p, i)
                );
            }
            checked += 1;
        }
    }
    println!("mp_stress: target memory checked for {checked} WRs");
    assert_eq!(checked, PRODUCERS * plan.slots());
    drop(shared);
    drop(b);
}
