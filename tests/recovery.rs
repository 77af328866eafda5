//! One-call QP recovery on the software device: a
//! workload of RDMA WRITEs (most unsignaled) hits a bad rkey part-way; both
//! sides recover in one call each, and the workload continues. Every WR is
//! accounted for: each signaled WR completes exactly once, no WR completes
//! twice, everything after the failed WR up to the recovery is reported as
//! flushed, and the WRs posted after recovery all land.

use std::collections::HashMap;
use std::time::Duration;

use rdma_direct::api::{Access, ConnectAttr, Device, QpInit, QpState, Wc, WcOpcode, WcStatus};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, Remote, SendFlags, SendOp, SendWr};

#[test]
fn error_recover_continue_every_wr_accounted() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(256).unwrap();
    let mut cq_b = dev.create_cq(256).unwrap();
    let init = QpInit {
        max_send_wr: 64,
        ..QpInit::default()
    };
    let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
    let attr = ConnectAttr {
        access: Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    let src = pd.register(8 * 400, Access::LOCAL_WRITE).unwrap();
    let mut dst = pd
        .register(
            8 * 400,
            Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        )
        .unwrap();

    const TOTAL: u64 = 400;
    const BAD: u64 = 150;
    let signaled = |id: u64| id % 4 == 3 || id == BAD;
    let mut seen: HashMap<u64, Vec<WcStatus>> = HashMap::new();
    let qpn_a = a.qpn();
    let mut record = |w: &Wc| {
        assert_eq!(w.qp_num, qpn_a);
        seen.entry(w.wr_id).or_default().push(w.status);
    };
    let mut out = [Wc::default(); 32];
    let mut next = 0u64;
    let mut recovered_at = None;
    let mut spins = 0u64;
    while next < TOTAL {
        // Post a batch of 8 (or what fits).
        let mut wrs = Vec::new();
        let sges: Vec<[rdma_direct::Sge; 1]> = (next..(next + 8).min(TOTAL))
            .map(|i| [src.sge(i as usize * 8, 8)])
            .collect();
        for (k, sge) in sges.iter().enumerate() {
            let id = next + k as u64;
            let remote = if id == BAD {
                Remote::new(dst.addr(), dst.rkey() ^ 0x7700)
            } else {
                dst.remote(id as usize * 8)
            };
            let flags = if signaled(id) {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            wrs.push(SendWr::new(id, SendOp::Write { remote }, sge, flags));
        }
        match a.post_send(&wrs) {
            Ok(()) => next += wrs.len() as u64,
            Err(e) => {
                assert_eq!(e.error, Error::SqFull, "{e:?}");
                next += e.index as u64;
            }
        }
        let n = cq_a.poll(&mut a, &mut out).unwrap();
        let mut failed = false;
        for w in &out[..n] {
            record(w);
            failed |= w.status != WcStatus::SUCCESS;
        }
        spins += 1;
        assert!(spins < 10_000_000, "workload stuck");
        if failed && recovered_at.is_none() {
            assert_eq!(a.state(), QpState::Error);
            // Both sides recover; they exchange fresh connection data.
            let r = a
                .drain_and_reset(&mut cq_a, None, Duration::from_secs(10), &mut record)
                .unwrap();
            let f = r.failure.expect("the failed WR");
            assert_eq!(
                (f.wr_id, f.status, f.opcode),
                (BAD, WcStatus::REM_ACCESS_ERR, WcOpcode::RDMA_WRITE)
            );
            assert_eq!(a.outstanding(), 0);
            assert_eq!(a.state(), QpState::Reset);
            let rb = b
                .recover(
                    &mut cq_b,
                    None,
                    &a.info(),
                    &attr,
                    Duration::from_secs(10),
                    |_| {},
                )
                .unwrap();
            assert_eq!(rb.failure, None);
            a.connect(&b.info(), &attr).unwrap();
            assert_eq!(a.state(), QpState::Rts);
            recovered_at = Some(next);
        }
    }
    // Drain the tail.
    let mut idle = 0;
    while a.outstanding() != 0 {
        let n = cq_a.poll(&mut a, &mut out).unwrap();
        for w in &out[..n] {
            record(w);
        }
        idle += 1;
        assert!(idle < 10_000_000, "tail stuck");
    }
    let posted_before_recovery = recovered_at.expect("the bad WR was hit");

    // Accounting.
    for (id, st) in &seen {
        assert_eq!(st.len(), 1, "wr {id} completed {} times: {st:?}", st.len());
    }
    for id in 0..TOTAL {
        let st = seen.get(&id).map(|v| v[0]);
        if id < BAD {
            // Before the failure: signaled ones succeeded, unsignaled ones
            // were retired silently by later completions.
            if signaled(id) {
                assert_eq!(st, Some(WcStatus::SUCCESS), "wr {id}");
            } else {
                assert_eq!(st, None, "wr {id}");
            }
        } else if id == BAD {
            assert_eq!(st, Some(WcStatus::REM_ACCESS_ERR));
        } else if id < posted_before_recovery {
            // Posted between the failure and the recovery: flushed, each
            // reported once, unsignaled or not.
            assert_eq!(st, Some(WcStatus::WR_FLUSH_ERR), "wr {id}");
        } else {
            if signaled(id) {
                assert_eq!(st, Some(WcStatus::SUCCESS), "wr {id}");
            } else {
                assert_eq!(st, None, "wr {id}");
            }
            // And the data landed.
            let want = &src.as_slice()[id as usize * 8..id as usize * 8 + 8];
            assert_eq!(
                &dst.as_mut_slice()[id as usize * 8..id as usize * 8 + 8],
                want
            );
        }
    }
    dev.backend().stop();
}

#[test]
fn recovery_refuses_a_shared_cq_and_times_out_instead_of_hanging() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let b = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    assert_eq!(
        a.drain_and_reset(&mut cq, None, Duration::from_secs(1), |_| {})
            .err(),
        Some(Error::ResourceBusy)
    );
    drop(b);
    // Device stopped (step mode, nobody steps): the flush never comes.
    let (ia, _) = (a.info(), ());
    a.connect(&ia, &ConnectAttr::default()).unwrap();
    let src = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let s = [src.sge(0, 8)];
    a.post_send(&[SendWr::new(1, SendOp::Send, &s, SendFlags::SIGNALED)])
        .unwrap();
    let t0 = std::time::Instant::now();
    assert_eq!(
        a.drain_and_reset(&mut cq, None, Duration::from_millis(100), |_| {})
            .err(),
        Some(Error::Timeout)
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
}

/// Recovery driven by an asynchronous event rather than by a completion:
/// the device moves a QP to ERROR on its own (a local QP operation error,
/// which raises `QpFatal`); the application waits on the device's async
/// event fd only, recovers the QP the event names, and every WR posted is
/// accounted for exactly once.
#[test]
fn a_fatal_async_event_drives_recovery() {
    use rdma_direct::api::AsyncEvent;
    use rdma_direct::provider::mlx5::cq::syndrome;
    use rdma_direct::soft::Fault;
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(256).unwrap();
    let mut cq_b = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, &QpInit::default()).unwrap();
    let attr = ConnectAttr {
        access: Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    let src = pd.register(8 * 64, Access::LOCAL_WRITE).unwrap();
    let dst = pd
        .register(
            8 * 64,
            Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        )
        .unwrap();
    // The device is quiet: no event, and the fd says so.
    assert_eq!(dev.poll_async_event().unwrap(), None);
    let fd = dev.async_event_fd().unwrap();
    assert!(!rdma_direct::event::wait_readable(fd, Duration::ZERO).unwrap());
    assert_eq!(
        dev.wait_async_event(Duration::from_millis(20)).unwrap(),
        None
    );

    // The 5th WR fails inside the device with a local QP operation error.
    dev.backend().inject(Fault::FailNth {
        qpn: Some(a.qpn()),
        nth: 5,
        syndrome: syndrome::LOCAL_QP_OP,
    });
    let sges: Vec<_> = (0..32).map(|i| [src.sge(i * 8, 8)]).collect();
    let wrs: Vec<SendWr> = (0..32u64)
        .map(|i| {
            let flags = if i % 8 == 7 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            SendWr::new(
                i,
                SendOp::Write {
                    remote: dst.remote(i as usize * 8),
                },
                &sges[i as usize],
                flags,
            )
        })
        .collect();
    a.post_send(&wrs).unwrap();
    // Only the event fd is watched; the CQ is not polled before recovery.
    let ev = dev
        .wait_async_event(Duration::from_secs(10))
        .unwrap()
        .expect("a fatal QP event");
    assert_eq!(ev, AsyncEvent::QpFatal { qpn: a.qpn() });
    assert!(ev.is_qp_fatal() && ev.qpn() == Some(a.qpn()));
    let mut seen: HashMap<u64, Vec<WcStatus>> = HashMap::new();
    let r = a
        .drain_and_reset(&mut cq_a, None, Duration::from_secs(10), |w| {
            seen.entry(w.wr_id).or_default().push(w.status)
        })
        .unwrap();
    let f = r.failure.expect("the failed WR");
    assert_eq!((f.wr_id, f.status), (4, WcStatus::LOC_QP_OP_ERR));
    for (id, st) in &seen {
        assert_eq!(st.len(), 1, "wr {id} reported {st:?}");
    }
    for id in 0..32u64 {
        let st = seen.get(&id).map(|v| v[0]);
        match id {
            // Signaled WRITEs before the failure succeeded (none here: the
            // first signaled one is 7); unsignaled ones stay silent.
            0..=3 => assert_eq!(st, None, "wr {id}"),
            4 => assert_eq!(st, Some(WcStatus::LOC_QP_OP_ERR)),
            _ => assert_eq!(st, Some(WcStatus::WR_FLUSH_ERR), "wr {id}"),
        }
    }
    assert_eq!(a.outstanding(), 0);
    // Both sides back to RTS, and the workload continues.
    dev.backend().clear_faults();
    b.recover(
        &mut cq_b,
        None,
        &a.info(),
        &attr,
        Duration::from_secs(10),
        |_| {},
    )
    .unwrap();
    a.connect(&b.info(), &attr).unwrap();
    let last = [SendWr::new(
        99,
        SendOp::Write {
            remote: dst.remote(0),
        },
        &sges[0],
        SendFlags::SIGNALED,
    )];
    a.post_send(&last).unwrap();
    let mut out = [Wc::default(); 4];
    let w = cq_a
        .wait(
            &mut a,
            &mut out,
            rdma_direct::event::WaitMode::BusyPoll,
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!((out[0].wr_id, out[0].status, w), (99, WcStatus::SUCCESS, 1));
    assert_eq!(dev.poll_async_event().unwrap(), None);
    dev.backend().stop();
}
