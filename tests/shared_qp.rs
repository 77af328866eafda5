//! Several threads post to one QP at once, lock-free, while another thread
//! polls the CQ and retires the space; every WR completes exactly once and
//! its data lands (software device, thread mode).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, SendFlags, SendOp, SendWr};

#[test]
fn four_producers_one_poller() {
    const THREADS: u64 = 4;
    const PER: u64 = if cfg!(debug_assertions) {
        3_000
    } else {
        100_000
    };
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let peer_cq = dev.create_cq(256).unwrap();
    let init = QpInit {
        max_send_wr: 256,
        ..QpInit::default()
    };
    let mut a = pd.create_qp(&cq, &cq, &init).unwrap();
    let mut b = pd
        .create_qp(&peer_cq, &peer_cq, &QpInit::default())
        .unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &ConnectAttr::default()).unwrap();
    b.connect(
        &ia,
        &ConnectAttr {
            access: Access::REMOTE_WRITE,
            ..Default::default()
        },
    )
    .unwrap();
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
