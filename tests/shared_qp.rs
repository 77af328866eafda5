//! Several threads post to one QP at once, lock-free, while another thread
//! polls the CQ and retires the space; every WR completes exactly once and
//! its data lands (software device, thread mode).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, SendFlags, SendOp, SendWr};

#[path = "support/loopback.rs"]
mod loopback;
use loopback::connect_loopback;

/// A writer QP `a` (CQ `cq`, created with `init`) connected to a peer `b`
/// that lets it write into its regions, on a fresh software device.
struct Writer {
    dev: Device<SoftDevice>,
    pd: Pd<SoftDevice>,
    cq: Cq<SoftDevice>,
    a: Qp<SoftDevice>,
    /// The peer; RDMA WRITEs need no receives, so it is never polled.
    b: Qp<SoftDevice>,
}

fn writer(init: &QpInit) -> Writer {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let peer_cq = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cq, &cq, init).unwrap();
    let mut b = pd
        .create_qp(&peer_cq, &peer_cq, &QpInit::default())
        .unwrap();
    connect_loopback(&mut a, &mut b, Access::REMOTE_WRITE);
    Writer { dev, pd, cq, a, b }
}

#[test]
fn four_producers_one_poller() {
    const THREADS: u64 = 4;
    const PER: u64 = if cfg!(debug_assertions) {
        3_000
    } else {
        100_000
    };
    let Writer {
        dev,
        pd,
        mut cq,
        a,
        b,
    } = writer(&QpInit {
        max_send_wr: 256,
        ..QpInit::default()
    });
    dev.backend().start();
    let target = Arc::new(
        pd.register(
            (THREADS * 8) as usize,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap(),
    );
    let (shared, mut poller) = a.into_shared().unwrap();

    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let qp = Arc::clone(&shared);
            let src = pd.register(8 * 64, Access::NONE).unwrap();
            let remote = target.remote(t as usize * 8);
            thread::spawn(move || {
                let mut src = src;
                let start = Instant::now();
                for i in 0..PER {
                    let slot = (i % 64) as usize;
                    src.as_mut_slice()[slot * 8..slot * 8 + 8]
                        .copy_from_slice(&(i + 1).to_le_bytes());
                    let sge = [src.sge(slot * 8, 8)];
                    let wr = SendWr::new(
                        t << 32 | i,
                        SendOp::Write { remote },
                        &sge,
                        SendFlags::SIGNALED,
                    );
                    loop {
                        match qp.post_send_one(&wr) {
                            Ok(()) => break,
                            Err(Error::SqFull) => thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                        assert!(
                            start.elapsed() < Duration::from_secs(120),
                            "producer {t} stuck"
                        );
                    }
                    // Do not reuse a source slot before its WRITE can have
                    // executed: keep at most 64 outstanding per thread by
                    // pacing on the queue's space.
                    while qp.send_space() < 8 {
                        thread::yield_now();
                    }
                }
                // Keep the source region registered until its WRITEs have
                // completed: the poller joins us after the last completion.
                src
            })
        })
        .collect();

    let mut seen = vec![0u64; THREADS as usize];
    let mut wc = [Wc::default(); 64];
    let start = Instant::now();
    let total = THREADS * PER;
    let mut got = 0;
    while got < total {
        let n = cq.poll_shared(&mut poller, &mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::SUCCESS, "wr {:#x}", w.wr_id);
            let (t, i) = ((w.wr_id >> 32) as usize, w.wr_id & 0xffff_ffff);
            // Each producer's WRs complete in its posting order.
            assert_eq!(i, seen[t], "thread {t}: wr {i} out of order or twice");
            seen[t] += 1;
            got += 1;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "poller stuck at {got}"
        );
    }
    let _srcs: Vec<_> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    assert!(seen.iter().all(|&s| s == PER));
    dev.backend().stop();
    drop(b);
}

/// `SharedQp::post_send` with lists (step mode, one thread): a list longer
/// than the free space posts the prefix that fits and reports `SqFull` at
/// the first WR left out; a refused WR in the middle of a list posts the
/// WRs before it and reports its own typed error; every posted WR
/// completes exactly once, in order.
#[test]
fn lists_post_a_prefix_and_report_the_first_refusal() {
    let Writer {
        dev,
        pd,
        mut cq,
        a,
        b,
    } = writer(&QpInit {
        max_send_wr: 64,
        max_send_sge: 1,
        ..QpInit::default()
    });
    let target = pd
        .register(8 * 256, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut src = pd.register(8 * 256, Access::NONE).unwrap();
    for (i, c) in src.as_mut_slice().chunks_mut(8).enumerate() {
        c.copy_from_slice(&(i as u64 + 1).to_le_bytes());
    }
    let (shared, mut poller) = a.into_shared().unwrap();
    // Every 8-byte, one-SGE WRITE takes one BB.
    let space = shared.send_space() as usize;
    assert!(space >= 16);
    let sges: Vec<[rdma_direct::Sge; 1]> = (0..256).map(|i| [src.sge(i * 8, 8)]).collect();
    let wr = |i: usize| {
        SendWr::new(
            i as u64,
            SendOp::Write {
                remote: target.remote(i * 8),
            },
            &sges[i],
            SendFlags::SIGNALED,
        )
    };
    let mut wc = [Wc::default(); 256];
    let mut next = 0u64;
    let mut drain =
        |cq: &mut Cq<SoftDevice>, poller: &mut SharedQpPoller<SoftDevice>, want: u64| {
            let mut got = 0;
            for _ in 0..100 {
                dev.backend().step();
                let n = cq.poll_shared(poller, &mut wc).unwrap();
                for w in &wc[..n] {
                    assert_eq!(w.status, WcStatus::SUCCESS);
                    assert_eq!(w.wr_id, next, "in order, exactly once");
                    next += 1;
                }
                got += n as u64;
                if got == want {
                    break;
                }
            }
            assert_eq!(got, want);
        };

    // A list longer than the queue: the prefix that fits is posted.
    let long: Vec<_> = (0..space + 3).map(wr).collect();
    let e = shared.post_send(&long).unwrap_err();
    assert_eq!((e.index, e.error), (space, Error::SqFull));
    assert_eq!(shared.send_space(), 0);
    drain(&mut cq, &mut poller, space as u64);

    // A refused WR in the middle: an atomic whose local SGE is 4 bytes.
    let short = [src.sge(0, 4)];
    let base = space;
    let mut list: Vec<_> = (base..base + 4).map(wr).collect();
    list[2] = SendWr::new(
        99_999,
        SendOp::FetchAdd {
            remote: target.remote(0),
            add: 1,
        },
        &short,
        SendFlags::SIGNALED,
    );
    let e = shared.post_send(&list).unwrap_err();
    assert_eq!((e.index, e.error), (2, Error::AtomicSgeLength));
    drain(&mut cq, &mut poller, 2);

    // Longer than one validation chunk (16 WRs), all accepted.
    let base = base + 2;
    let list: Vec<_> = (base..base + 40).map(|i| wr(i % 256)).collect();
    // wr_ids must continue the sequence.
    assert!(base + 40 <= 256);
    shared.post_send(&list).unwrap();
    drain(&mut cq, &mut poller, 40);
    assert_eq!(shared.send_space() as usize, space);
    // Every WRITE landed.
    for i in 0..base + 40 {
        let got = u64::from_le_bytes(target.as_slice()[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(got, i as u64 + 1, "WRITE {i}");
    }
    drop(b);
}

/// A shared QP gives back what its QP held when its last handle goes: the
/// CQ's share of the sizing guard (a QP just as large fits on the same,
/// exactly sized CQ afterwards) and its count of the CQ's users (a QP
/// alone on the CQ afterwards can be drained and reset).
#[test]
fn dropping_a_shared_qp_releases_its_cq() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let init = QpInit {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpInit::default()
    };
    let mut cq = dev.create_cq(dev.cq_depth_for(&[&init])).unwrap();
    let a = pd.create_qp(&cq, &cq, &init).unwrap();
    // The CQ is full up: a second QP does not fit beside the first.
    assert_eq!(pd.create_qp(&cq, &cq, &init).err(), Some(Error::CqTooSmall));
    let (shared, poller) = a.into_shared().unwrap();
    drop(poller);
    drop(shared);
    let mut c = pd.create_qp(&cq, &cq, &init).unwrap();
    let r = c.drain_and_reset(&mut cq, None, Duration::from_secs(5), |_| {});
    assert!(r.is_ok(), "{:?}", r.err());
}
