//! The software HCA in thread mode: the device runs on its own thread,
//! two application threads each own one QP and its CQ, and post and poll
//! concurrently. Every message arrives intact and in order, every WR
//! completes exactly once, and atomics from several QPs are atomic.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn two_threads_send_and_write_through_the_device_thread() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let cqa = dev.create_cq(256).unwrap();
    let cqb = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cqa, &cqa, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &QpInit::default()).unwrap();
    let acc = ConnectAttr {
        access: Access::REMOTE_WRITE,
        ..Default::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &acc).unwrap();
    b.connect(&ia, &acc).unwrap();
    let target = pd
        .register(64 * 1024, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let remote = target.remote(0);
    const MSGS: u64 = 4_000;

    let receiver = {
        let pd_b = pd.register(64 * 64, Access::LOCAL_WRITE).unwrap();
        let mut cqb = cqb;
        thread::spawn(move || {
            let rbuf = pd_b;
            let mut posted = 0u64;
            let mut got = 0u64;
            let mut wc = [Wc::default(); 32];
            let start = Instant::now();
            while got < MSGS {
                while posted < MSGS && posted - got < 64 {
                    let slot = (posted % 64) as usize;
                    b.post_recv(&[RecvWr {
                        wr_id: posted,
                        sges: &[rbuf.sge(slot * 64, 64)],
                    }])
                    .unwrap();
                    posted += 1;
                }
                let n = cqb.poll(&mut b, &mut wc).unwrap();
                for w in &wc[..n] {
                    assert_eq!(w.status, WcStatus::SUCCESS);
                    assert_eq!(w.wr_id, got, "receives complete in order");
                    assert_eq!(w.byte_len, 16);
                    let slot = (w.wr_id % 64) as usize;
                    let v = u64::from_le_bytes(
                        rbuf.as_slice()[slot * 64..slot * 64 + 8]
                            .try_into()
                            .unwrap(),
                    );
                    assert_eq!(v, got, "payload of message {got}");
                    got += 1;
                }
                assert!(start.elapsed() < DEADLINE, "receiver stuck at {got}");
            }
            (b, cqb)
        })
    };

    let mut cqa = cqa;
    let src = pd.register(64 * 32, Access::NONE).unwrap();
    let mut src = src;
    let mut sent = 0u64;
    let mut completed = 0u64;
    let mut wc = [Wc::default(); 32];
    let start = Instant::now();
    while completed < MSGS {
        // A batch of 8: SEND (carrying its sequence number) + a WRITE to
        // the target; only the last of the batch is signaled.
        if sent < MSGS && a.send_space() >= 32 && sent - completed + 8 <= 32 {
            let k = 8.min(MSGS - sent);
            let mut sges = Vec::new();
            for i in 0..k {
                let slot = ((sent + i) % 32) as usize;
                src.as_mut_slice()[slot * 64..slot * 64 + 8]
                    .copy_from_slice(&(sent + i).to_le_bytes());
                sges.push([src.sge(slot * 64, 16)]);
            }
            let mut wrs = Vec::new();
            for (i, sg) in sges.iter().enumerate() {
                let last = i as u64 == k - 1;
                let flags = if last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                wrs.push(SendWr::new(sent + i as u64, SendOp::Send, sg, flags));
            }
            match a.post_send(&wrs) {
                Ok(()) => sent += k,
                Err(e) if e.error == Error::SqFull => {}
                Err(e) => panic!("{e}"),
            }
            let w = SendWr::new(
                u64::MAX,
                SendOp::Write { remote },
                &sges[0],
                SendFlags::NONE,
            );
            let _ = a.post_send_one(&w);
        }
        let n = cqa.poll(&mut a, &mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::SUCCESS);
            if w.wr_id != u64::MAX {
                assert!(w.wr_id >= completed);
                completed = w.wr_id + 1;
            }
        }
        assert!(start.elapsed() < DEADLINE, "sender stuck at {completed}");
    }
    let (_b, _cqb) = receiver.join().unwrap();
    dev.backend().stop();
}

#[test]
fn atomics_from_many_threads_are_atomic() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let counter = Arc::new(
        pd.register(8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .unwrap(),
    );
    const THREADS: usize = 4;
    const OPS: u64 = 1_000;
    let barrier = Arc::new(Barrier::new(THREADS));
    let mut handles = Vec::new();
    for _ in 0..THREADS {
        let cq = dev.create_cq(256).unwrap();
        let peer_cq = dev.create_cq(256).unwrap();
        let mut q = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
        let mut peer = pd
            .create_qp(&peer_cq, &peer_cq, &QpInit::default())
            .unwrap();
        let (iq, ip) = (q.info(), peer.info());
        q.connect(&ip, &ConnectAttr::default()).unwrap();
        peer.connect(
            &iq,
            &ConnectAttr {
                access: Access::REMOTE_ATOMIC,
                ..Default::default()
            },
        )
        .unwrap();
        let olds = pd.register(8 * 64, Access::LOCAL_WRITE).unwrap();
        let remote = counter.remote(0);
        let barrier = Arc::clone(&barrier);
        let mut cq = cq;
        handles.push(thread::spawn(move || {
            let _keep = (peer, peer_cq);
            barrier.wait();
            let mut seen = Vec::with_capacity(OPS as usize);
            let mut wc = [Wc::default(); 16];
            let start = Instant::now();
            for i in 0..OPS {
                let slot = (i % 64) as usize;
                let sge = [olds.sge(slot * 8, 8)];
                q.post_send_one(&SendWr::new(
                    i,
                    SendOp::FetchAdd { remote, add: 1 },
                    &sge,
                    SendFlags::SIGNALED,
                ))
                .unwrap();
                loop {
                    let n = cq.poll(&mut q, &mut wc).unwrap();
                    if n == 1 {
                        assert_eq!((wc[0].wr_id, wc[0].status), (i, WcStatus::SUCCESS));
                        break;
                    }
                    assert!(start.elapsed() < DEADLINE, "atomic {i} never completed");
                    std::hint::spin_loop();
                }
                seen.push(olds.load_u64(slot * 8).unwrap());
            }
            seen
        }));
    }
    let mut all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    let total = THREADS as u64 * OPS;
    assert_eq!(counter.load_u64(0), Some(total));
    assert_eq!(
        all,
        (0..total).collect::<Vec<_>>(),
        "every old value seen exactly once"
    );
    dev.backend().stop();
}
