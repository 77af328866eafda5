//! A QP on an SRQ made a shared QP ([`Qp::into_shared`]): several threads
//! post RDMA WRITEs through it while its peer SENDs to it, and its poller,
//! polling through [`Srq::route_shared`], reports every WRITE and every
//! receive the SRQ gave out exactly once; the shared QP refuses receives
//! of its own, and dropping it detaches it from the SRQ.

use std::collections::HashSet;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

#[test]
fn shared_qp_on_an_srq_completes_sends_and_srq_receives() {
    const THREADS: u64 = 2;
    const WRITES: u64 = 500;
    const SENDS: u64 = 300;
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut srq = pd.create_srq(64, 1).unwrap();
    let init_s = QpInit {
        max_send_wr: 128,
        max_recv_wr: 1,
        srq: Some(srq.id()),
        ..QpInit::default()
    };
    let init_p = QpInit {
        max_send_wr: 64,
        max_recv_wr: 1,
        ..QpInit::default()
    };
    let mut cq_s = dev
        .create_cq(dev.cq_depth_for(&[&init_s]) + srq.max_wr())
        .unwrap();
    let mut cq_p = dev.create_cq(dev.cq_depth_for(&[&init_p])).unwrap();
    let mut s = pd.create_qp(&cq_s, &cq_s, &init_s).unwrap();
    let mut p = pd.create_qp(&cq_p, &cq_p, &init_p).unwrap();
    let (is, ip) = (s.info(), p.info());
    s.connect(&ip, &ConnectAttr::default()).unwrap();
    p.connect(
        &is,
        &ConnectAttr {
            access: Access::REMOTE_WRITE,
            rnr_retry: 7,
            ..Default::default()
        },
    )
    .unwrap();
    // The peer retries on an empty SRQ (RNR) forever: it SENDs faster
    // than the test posts receives at times.
    let target = Arc::new(
        pd.register(
            (THREADS * 8) as usize,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap(),
    );
    let land = pd.register(64 * 8, Access::LOCAL_WRITE).unwrap();
    let mut src = pd.register(8, Access::NONE).unwrap();

    let (shared, mut poller) = s.into_shared().unwrap();
    // No receive queue of its own: refused, nothing posted.
    let sge = [land.sge(0, 8)];
    let e = poller
        .post_recv(&[RecvWr {
            wr_id: 1,
            sges: &sge,
        }])
        .unwrap_err();
    assert_eq!((e.index, e.error), (0, Error::InvalidAttribute));
    // Still attached through the shared QP.
    assert_eq!(srq.destroy().err(), Some(Error::ResourceBusy));

    dev.backend().start();
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let qp = Arc::clone(&shared);
            let src = pd.register(8, Access::NONE).unwrap();
            let remote = target.remote(t as usize * 8);
            thread::spawn(move || {
                let start = Instant::now();
                let sge = [src.sge(0, 8)];
                for i in 0..WRITES {
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
                        assert!(start.elapsed() < Duration::from_secs(60), "stuck");
                    }
                }
                src
            })
        })
        .collect();

    // The polling thread: keeps the SRQ stocked, has the peer SEND, and
    // polls the shared QP's CQ through the SRQ's route.
    let mut writes = HashSet::new();
    let mut recvs = Vec::new();
    let mut posted_recv = 0u64;
    let mut sent = 0u64;
    let mut wc = [Wc::default(); 32];
    let mut pwc = [Wc::default(); 32];
    let start = Instant::now();
    while writes.len() < (THREADS * WRITES) as usize || (recvs.len() as u64) < SENDS {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not all completed"
        );
        // One receive per outstanding slot of `land` (64 slots of 8 bytes).
        while posted_recv < SENDS && posted_recv - (recvs.len() as u64) < 64 {
            let slot = (posted_recv % 64) as usize;
            let sge = [land.sge(slot * 8, 8)];
            match srq.post_recv_one(&RecvWr {
                wr_id: posted_recv,
                sges: &sge,
            }) {
                Ok(()) => posted_recv += 1,
                Err(Error::RqFull) => break,
                Err(e) => panic!("{e}"),
            }
        }
        if sent < SENDS && sent < posted_recv {
            src.as_mut_slice()
                .copy_from_slice(&(sent + 1).to_le_bytes());
            let sge = [src.sge(0, 8)];
            let wr = SendWr::new(sent, SendOp::Send, &sge, SendFlags::SIGNALED);
            if p.post_send(core::slice::from_ref(&wr)).is_ok() {
                sent += 1;
                // One SEND in flight at a time: `src` is reused.
                let t0 = Instant::now();
                loop {
                    let n = cq_p.poll(&mut p, &mut pwc).unwrap();
                    if n == 1 {
                        assert_eq!(pwc[0].status, WcStatus::SUCCESS);
                        break;
                    }
                    assert!(t0.elapsed() < Duration::from_secs(10), "SEND stuck");
                    thread::yield_now();
                }
            }
        }
        let n = cq_s
            .poll_shared(&mut srq.route_shared(&mut poller), &mut wc)
            .unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::SUCCESS, "{w:?}");
            match w.opcode {
                WcOpcode::RDMA_WRITE => assert!(writes.insert(w.wr_id), "twice: {w:?}"),
                WcOpcode::RECV => {
                    assert_eq!(w.byte_len, 8);
                    let slot = (w.wr_id % 64) as usize;
                    let got = u64::from_le_bytes(
                        land.as_slice()[slot * 8..slot * 8 + 8].try_into().unwrap(),
                    );
                    recvs.push((w.wr_id, got));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    for h in producers {
        drop(h.join().unwrap());
    }
    // Every receive once, in order (one QP, one SEND at a time), each
    // holding the SEND's bytes.
    for (i, (id, got)) in recvs.iter().enumerate() {
        assert_eq!((*id, *got), (i as u64, i as u64 + 1));
    }
    assert_eq!(writes.len(), (THREADS * WRITES) as usize);
    dev.backend().stop();
    // The last handles go: the QP is destroyed and leaves the SRQ.
    drop(poller);
    drop(shared);
    srq.destroy().unwrap();
}
