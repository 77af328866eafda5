//! The submission service end to end on the software HCA (thread mode):
//! application threads submit RDMA WRITE descriptors (remote offset,
//! length, tag) to a `SubmissionService` in a `static`; ONE poll-mode thread
//! owns the QP and its CQ, drains the ring in batches, posts each batch
//! with ONE `post_send` call (one doorbell), signals only the last WR of a
//! batch, polls the CQ and returns a completion for every WR to the
//! submitter it came from.
//!
//! Checked: every WR completes exactly once, successfully, at the right
//! submitter; the target memory holds exactly the bytes written (and
//! nothing outside them); every post was one batch.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::ring::submit::{ServiceError, Submission, SubmissionService, SubmitterId};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Remote, SendFlags, SendOp, SendWr, Sge};

#[path = "support/loopback.rs"]
mod loopback;
use loopback::connect_loopback;

const SUBMITTERS: usize = 4;
const PER_SUBMITTER: u64 = 10_000;
/// Each WR writes into its own chunk of the target.
const CHUNK: usize = 64;
const TOTAL: u64 = SUBMITTERS as u64 * PER_SUBMITTER;
const TARGET_LEN: usize = TOTAL as usize * CHUNK;
/// Largest batch the poll-mode thread posts at once.
const BATCH: usize = 16;
/// WRs the poll-mode thread tracks between post and completion.
const PENDING: usize = 256;
const DEADLINE: Duration = Duration::from_secs(60);

/// What an application thread submits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WriteDesc {
    /// Offset in the target region (and of the source bytes).
    remote_offset: u64,
    /// Bytes to write.
    len: u32,
    /// The application's tag for this WR.
    tag: u64,
}

/// What comes back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WriteDone {
    tag: u64,
    status: WcStatus,
}

/// 64 queued descriptors, 32 outstanding per submitter, 4 submitters: set
/// up at compile time, no allocation.
static SVC: SubmissionService<WriteDesc, WriteDone, 64, 32, SUBMITTERS> = SubmissionService::new();

/// The source pattern (the byte at offset `x`).
fn pattern(x: usize) -> u8 {
    (x.wrapping_mul(131) ^ (x >> 8).wrapping_mul(7)) as u8 | 1
}

/// Tag, offset and length of submitter `k`'s `i`-th WR.
fn wr_of(k: usize, i: u64) -> WriteDesc {
    let slot = k as u64 * PER_SUBMITTER + i;
    WriteDesc {
        remote_offset: slot * CHUNK as u64,
        len: 1 + ((slot * 37) % CHUNK as u64) as u32,
        tag: (k as u64) << 32 | i,
    }
}

#[test]
fn many_submitters_one_poll_mode_thread_batches_writes() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let cqb = dev.create_cq(256).unwrap();
    let init = QpInit {
        max_send_wr: 128,
        ..QpInit::default()
    };
    let mut a = pd.create_qp(&cq, &cq, &init).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &QpInit::default()).unwrap();
    connect_loopback(&mut a, &mut b, Access::REMOTE_WRITE);
    let target = pd
        .register(TARGET_LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut src = pd.register(TARGET_LEN, Access::NONE).unwrap();
    for (x, byte) in src.as_mut_slice().iter_mut().enumerate() {
        *byte = pattern(x);
    }
    let remote = target.remote(0);
    let start = Instant::now();

    // The poll-mode thread: owns the QP, its CQ and the source region.
    let poller = {
        let mut cq = cq;
        thread::spawn(move || {
            let mut poll = SVC.poller().expect("one poller");
            let mut batch = [Submission::<WriteDesc>::default(); BATCH];
            let mut sges = [[Sge::default(); 1]; BATCH];
            let mut wcs = [Wc::default(); 32];
            // wr_id = sequence number; pending[seq % PENDING] = its origin.
            let mut pending = [(SubmitterId::default(), 0u64); PENDING];
            let (mut posted, mut retired) = (0u64, 0u64);
            let (mut posts, mut max_batch) = (0u64, 0usize);
            while retired < TOTAL {
                // A one-SGE WRITE is one 64-byte basic block (control,
                // remote-address and data segments: 48 bytes).
                let room = (a.send_space() as usize)
                    .min(PENDING - (posted - retired) as usize)
                    .min(BATCH);
                let n = poll.drain(&mut batch[..room]);
                if n > 0 {
                    for (sg, s) in sges.iter_mut().zip(&batch[..n]) {
                        sg[0] = src.sge(s.desc.remote_offset as usize, s.desc.len);
                    }
                    let wrs: [SendWr<'_>; BATCH] = std::array::from_fn(|i| {
                        let s = &batch[i.min(n - 1)];
                        // Selective signaling: only the batch's last WR.
                        let flags = if i == n - 1 {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::NONE
                        };
                        let remote = Remote {
                            addr: remote.addr + s.desc.remote_offset,
                            ..remote
                        };
                        SendWr::new(posted + i as u64, SendOp::Write { remote }, &sges[i], flags)
                    });
                    for (i, s) in batch[..n].iter().enumerate() {
                        pending[(posted + i as u64) as usize % PENDING] = (s.from, s.desc.tag);
                    }
                    // One call, one doorbell for the whole batch.
                    a.post_send(&wrs[..n]).expect("room was checked");
                    posted += n as u64;
                    posts += 1;
                    max_batch = max_batch.max(n);
                }
                let m = cq.poll(&mut a, &mut wcs).unwrap();
                for wc in &wcs[..m] {
                    assert_eq!(wc.status, WcStatus::SUCCESS, "wr {}", wc.wr_id);
                    assert!(wc.wr_id >= retired && wc.wr_id < posted);
                    // A signaled completion covers the unsignaled WRs
                    // before it.
                    while retired <= wc.wr_id {
                        let (from, tag) = pending[retired as usize % PENDING];
                        let done = WriteDone {
                            tag,
                            status: wc.status,
                        };
                        poll.try_complete(from, done)
                            .expect("credits bound the ring");
                        retired += 1;
                    }
                }
                if n == 0 && m == 0 {
                    assert!(start.elapsed() < DEADLINE, "poller stuck at {retired}");
                    thread::yield_now();
                }
            }
            assert_eq!(poll.try_next(), None);
            (posts, max_batch, a, cq, src)
        })
    };

    // Every application thread holds its id before any submits, so a late
    // thread cannot reuse the id of one that already finished.
    let registered = Arc::new(Barrier::new(SUBMITTERS));
    let apps: Vec<_> = (0..SUBMITTERS)
        .map(|_| {
            let registered = Arc::clone(&registered);
            thread::spawn(move || {
                let mut sub = SVC.register().expect("a free id");
                registered.wait();
                let k = sub.id().index();
                let mut seen = vec![false; PER_SUBMITTER as usize];
                let (mut next, mut done) = (0u64, 0u64);
                let mut back_pressure = 0u64;
                let mut buf = [WriteDone::default(); 16];
                while done < PER_SUBMITTER {
                    let mut progress = false;
                    while next < PER_SUBMITTER {
                        match sub.try_submit(wr_of(k, next)) {
                            Ok(()) => {
                                next += 1;
                                progress = true;
                            }
                            Err(ServiceError::RingFull | ServiceError::NoCredit) => {
                                back_pressure += 1;
                                break;
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    let n = sub.recv_batch(&mut buf);
                    for d in &buf[..n] {
                        assert_eq!(d.status, WcStatus::SUCCESS);
                        assert_eq!(
                            (d.tag >> 32) as usize,
                            k,
                            "completion at the wrong submitter"
                        );
                        let i = (d.tag & 0xffff_ffff) as usize;
                        assert!(!seen[i], "tag {:#x} completed twice", d.tag);
                        seen[i] = true;
                        done += 1;
                    }
                    if !progress && n == 0 {
                        assert!(start.elapsed() < DEADLINE, "submitter {k} stuck at {done}");
                        thread::yield_now();
                    }
                }
                assert!(seen.iter().all(|&s| s));
                assert_eq!(sub.try_recv(), None, "an extra completion");
                (k, back_pressure)
            })
        })
        .collect();

    let mut ks: Vec<usize> = Vec::new();
    let mut back_pressure = 0;
    for h in apps {
        let (k, bp) = h.join().unwrap();
        ks.push(k);
        back_pressure += bp;
    }
    ks.sort_unstable();
    assert_eq!(ks, (0..SUBMITTERS).collect::<Vec<_>>());
    let (posts, max_batch, _a, _cq, src) = poller.join().unwrap();
    let el = start.elapsed();
    dev.backend().stop();

    // Every WR wrote exactly its bytes, and nothing else was touched.
    let t = target.as_slice();
    for k in 0..SUBMITTERS {
        for i in 0..PER_SUBMITTER {
            let d = wr_of(k, i);
            let off = d.remote_offset as usize;
            let len = d.len as usize;
            assert_eq!(
                &t[off..off + len],
                &src.as_slice()[off..off + len],
                "wr {:#x}",
                d.tag
            );
            assert!(
                t[off + len..off + CHUNK].iter().all(|&b| b == 0),
                "wr {:#x} overran",
                d.tag
            );
        }
    }
    assert!(posts <= TOTAL && max_batch <= BATCH);
    println!(
        "submit_service: {TOTAL} WRITEs from {SUBMITTERS} threads in {:.3} s: {posts} \
         post_send calls (avg batch {:.1}, max {max_batch}), {back_pressure} back-pressure \
         refusals",
        el.as_secs_f64(),
        TOTAL as f64 / posts as f64,
    );
    drop(b);
}
