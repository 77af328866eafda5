//! Waiting for completions on the software device: busy-poll, event and
//! adaptive modes, each with a timeout.
//!
//! Each test would fail without the guarantee it checks: an idle wait must
//! end with `Error::Timeout` close to its deadline (not hang, not return
//! early), an event-mode wait must sleep (its thread's CPU time stays far
//! below busy-poll's over the same idle period), a completion that lands
//! before the CQ is armed must not be missed, and the adaptive waiter must
//! learn its spin budget from how soon completions arrive.

use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, AdaptiveConfig, ConnectAttr, Cq, Device, Mr, Pd, Qp, QpInit, WaitMode, Wc,
};
use rdma_direct::event::thread_cpu_time;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, SendFlags, SendOp, SendWr};

struct Setup {
    dev: Device<SoftDevice>,
    _pd: Pd<SoftDevice>,
    cq: Cq<SoftDevice>,
    qp: Qp<SoftDevice>,
    _peer: Qp<SoftDevice>,
    _peer_cq: Cq<SoftDevice>,
    src: Mr<SoftDevice>,
    dst: Mr<SoftDevice>,
}

fn setup() -> Setup {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let peer_cq = dev.create_cq(256).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let mut peer = pd
        .create_qp(&peer_cq, &peer_cq, &QpInit::default())
        .unwrap();
    let attr = ConnectAttr {
        access: Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        ..ConnectAttr::default()
    };
    let (a, b) = (qp.info(), peer.info());
    qp.connect(&b, &attr).unwrap();
    peer.connect(&a, &attr).unwrap();
    let src = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let dst = pd
        .register(64, Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0))
        .unwrap();
    Setup {
        dev,
        _pd: pd,
        cq,
        qp,
        _peer: peer,
        _peer_cq: peer_cq,
        src,
        dst,
    }
}

fn write(s: &mut Setup, wr_id: u64) {
    let sge = [s.src.sge(0, 8)];
    s.qp.post_send(&[SendWr::new(
        wr_id,
        SendOp::Write {
            remote: s.dst.remote(0),
        },
        &sge,
        SendFlags::SIGNALED,
    )])
    .unwrap();
}

#[test]
fn every_mode_times_out_when_idle() {
    let mut s = setup();
    s.dev.backend().start();
    let mut out = [Wc::default(); 4];
    for mode in [WaitMode::BusyPoll, WaitMode::Event, WaitMode::Adaptive] {
        let t0 = Instant::now();
        let r =
            s.cq.wait(&mut s.qp, &mut out, mode, Duration::from_millis(100));
        let took = t0.elapsed();
        assert_eq!(r, Err(Error::Timeout), "{mode:?}");
        assert!(
            took >= Duration::from_millis(100),
            "{mode:?} returned early: {took:?}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{mode:?} overslept: {took:?}"
        );
    }
    s.dev.backend().stop();
}

#[test]
fn every_mode_returns_a_completion() {
    let mut s = setup();
    s.dev.backend().start();
    let mut out = [Wc::default(); 4];
    for (i, mode) in [WaitMode::BusyPoll, WaitMode::Event, WaitMode::Adaptive]
        .into_iter()
        .enumerate()
    {
        write(&mut s, i as u64);
        let n =
            s.cq.wait(&mut s.qp, &mut out, mode, Duration::from_secs(10))
                .unwrap();
        assert_eq!((n, out[0].wr_id), (1, i as u64), "{mode:?}");
    }
    s.dev.backend().stop();
}

#[test]
fn event_mode_sleeps_and_wakes_for_a_late_completion() {
    let mut s = setup();
    s.dev.backend().start();
    let mut out = [Wc::default(); 4];
    // Idle: event mode's thread sleeps; busy-poll's spins.
    let idle = Duration::from_millis(300);
    let c0 = thread_cpu_time();
    let _ = s.cq.wait(&mut s.qp, &mut out, WaitMode::Event, idle);
    let event_cpu = thread_cpu_time() - c0;
    let c0 = thread_cpu_time();
    let _ = s.cq.wait(&mut s.qp, &mut out, WaitMode::BusyPoll, idle);
    let busy_cpu = thread_cpu_time() - c0;
    assert!(
        event_cpu * 10 < busy_cpu,
        "event mode used {event_cpu:?} of CPU over {idle:?} idle, busy-poll {busy_cpu:?}"
    );

    // A completion that arrives while the waiter sleeps wakes it.
    let Setup {
        dev, qp, src, dst, ..
    } = &mut s;
    let sge = [src.sge(0, 8)];
    let wr = SendWr::new(
        77,
        SendOp::Write {
            remote: dst.remote(0),
        },
        &sge,
        SendFlags::SIGNALED,
    );
    dev.backend().stop();
    qp.post_send(&[wr]).unwrap();
    let d = dev.clone();
    let waker = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        d.backend().start();
    });
    let t0 = Instant::now();
    let n =
        s.cq.wait(
            &mut s.qp,
            &mut out,
            WaitMode::Event,
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!((n, out[0].wr_id), (1, 77));
    let took = t0.elapsed();
    // Woken by the event, not by the poll after the wait timed out.
    assert!(
        took >= Duration::from_millis(90) && took < Duration::from_secs(3),
        "{took:?}"
    );
    waker.join().unwrap();
    s.dev.backend().stop();
}

#[test]
fn a_completion_before_the_arm_is_not_missed() {
    let mut s = setup();
    // Step mode: the CQE is written now, before anyone arms the CQ.
    write(&mut s, 5);
    s.dev.backend().run_until_idle(16);
    s.dev.backend().start();
    let mut out = [Wc::default(); 4];
    // Poll with an empty slice first so the CQE stays; then an event wait
    // must find it (by the poll after arming) without sleeping.
    let t0 = Instant::now();
    let n =
        s.cq.wait(&mut s.qp, &mut out, WaitMode::Event, Duration::from_secs(5))
            .unwrap();
    assert_eq!((n, out[0].wr_id), (1, 5));
    assert!(t0.elapsed() < Duration::from_secs(1));

    // Armed with a CQE already present: the device raises the event at
    // once (the fd becomes readable), as hardware does.
    write(&mut s, 6);
    s.dev.backend().stop();
    s.dev.backend().run_until_idle(16);
    s.cq.arm().unwrap();
    s.dev.backend().run_until_idle(1);
    let fd = s.cq.event_fd().unwrap();
    assert!(rdma_direct::event::wait_readable(fd, Duration::from_secs(1)).unwrap());
    assert_eq!(s.cq.consume_events().unwrap(), 1);
    // One arm, one event: no second event without re-arming.
    s.dev.backend().run_until_idle(4);
    assert!(!rdma_direct::event::wait_readable(fd, Duration::from_millis(20)).unwrap());
    assert_eq!(s.cq.poll(&mut s.qp, &mut out).unwrap(), 1);
}

#[test]
fn adaptive_budget_follows_arrival_times() {
    let mut s = setup();
    s.dev.backend().start();
    let cfg = AdaptiveConfig {
        min_spin: Duration::from_micros(1),
        max_spin: Duration::from_millis(2),
    };
    s.cq.set_adaptive(cfg);
    let mut out = [Wc::default(); 4];
    // Completions that take ~10 ms to show up: spinning cannot win, the
    // budget drops to the minimum.
    for i in 0..24 {
        let Setup {
            dev,
            qp,
            cq,
            src,
            dst,
            ..
        } = &mut s;
        dev.backend().stop();
        write_on(qp, src, dst, i);
        let d = dev.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            d.backend().start();
        });
        let t0 = Instant::now();
        cq.wait(qp, &mut out, WaitMode::Adaptive, Duration::from_secs(10))
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(3), "no wake-up");
        h.join().unwrap();
    }
    assert_eq!(s.cq.spin_budget(), cfg.min_spin);
    // Completions that are already there (or nearly): the budget grows
    // back above the minimum, bounded by the maximum.
    for i in 100..160 {
        write(&mut s, i);
        thread::sleep(Duration::from_micros(200));
        s.cq.wait(
            &mut s.qp,
            &mut out,
            WaitMode::Adaptive,
            Duration::from_secs(10),
        )
        .unwrap();
    }
    let b = s.cq.spin_budget();
    assert!(b > cfg.min_spin && b <= cfg.max_spin, "budget {b:?}");
    s.dev.backend().stop();
}

fn write_on(qp: &mut Qp<SoftDevice>, src: &Mr<SoftDevice>, dst: &Mr<SoftDevice>, wr_id: u64) {
    let sge = [src.sge(0, 8)];
    qp.post_send(&[SendWr::new(
        wr_id,
        SendOp::Write {
            remote: dst.remote(0),
        },
        &sge,
        SendFlags::SIGNALED,
    )])
    .unwrap();
}

/// A solicited-only arm raises an event only for a solicited completion (a
/// SEND posted with `SOLICITED`) or an error, never for ordinary ones.
#[test]
fn solicited_only_arming_waits_for_a_solicited_send() {
    use rdma_direct::RecvWr;
    let mut s = setup();
    let rs = [s.dst.sge(0, 64)];
    let recvs: Vec<_> = (0..3)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sges: &rs,
        })
        .collect();
    s._peer.post_recv(&recvs).unwrap();
    let fd = s._peer_cq.event_fd().unwrap();
    let send = |s: &mut Setup, id: u64, flags: SendFlags| {
        let sge = [s.src.sge(0, 8)];
        s.qp.post_send(&[SendWr::new(id, SendOp::Send, &sge, flags)])
            .unwrap();
    };
    let mut out = [Wc::default(); 4];
    // Armed for solicited completions; an ordinary SEND arrives: its
    // completion is written, but no event.
    s._peer_cq.arm_solicited().unwrap();
    send(&mut s, 1, SendFlags::SIGNALED);
    s.dev.backend().run_until_idle(16);
    assert!(!rdma_direct::event::wait_readable(fd, Duration::from_millis(20)).unwrap());
    assert_eq!(s._peer_cq.poll(&mut s._peer, &mut out).unwrap(), 1);
    assert_eq!(out[0].wr_id, 100);
    // The same arm is still pending: a solicited SEND fires it.
    send(&mut s, 2, SendFlags::SIGNALED | SendFlags::SOLICITED);
    s.dev.backend().run_until_idle(16);
    assert!(rdma_direct::event::wait_readable(fd, Duration::from_secs(1)).unwrap());
    assert_eq!(s._peer_cq.consume_events().unwrap(), 1);
    assert_eq!(s._peer_cq.poll(&mut s._peer, &mut out).unwrap(), 1);
    assert_eq!(out[0].wr_id, 101);
    // An ordinary arm fires for any completion.
    s._peer_cq.arm().unwrap();
    send(&mut s, 3, SendFlags::SIGNALED);
    s.dev.backend().run_until_idle(16);
    assert!(rdma_direct::event::wait_readable(fd, Duration::from_secs(1)).unwrap());
    assert_eq!(s._peer_cq.consume_events().unwrap(), 1);
    // The sender's CQ armed solicited-only: successful sends raise nothing.
    let sfd = s.cq.event_fd().unwrap();
    while s.cq.poll(&mut s.qp, &mut out).unwrap() != 0 {}
    s.cq.arm_solicited().unwrap();
    write(&mut s, 9);
    s.dev.backend().run_until_idle(16);
    assert!(!rdma_direct::event::wait_readable(sfd, Duration::from_millis(20)).unwrap());
    assert_eq!(s.cq.poll(&mut s.qp, &mut out).unwrap(), 1);
}
