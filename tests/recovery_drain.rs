//! Recovery always finishes (issue 17, item 1), on the software device:
//! an unsignaled WR the device executed has no completion of its own, so
//! recovery posts a drain marker whose flush retires it. Each test fails
//! without the marker (`drain_and_reset` times out).
//!
//! Covered: one executed unsignaled WRITE (thread and step mode), the
//! "signal every 16th" pattern failing between two signaled WRs, a mix of
//! executed, outstanding, signaled and unsignaled sends with posted
//! receives (each WR reported exactly once, the flushed ones with flush
//! status, a user wr_id equal to the marker's reported normally), and a
//! send queue completely full of executed work.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, QpState, Wc, WcStatus};
use rdma_direct::soft::{Fault, SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

const WAIT: Duration = Duration::from_secs(5);

struct Env {
    dev: Device<SoftDevice>,
    cq_a: Cq<SoftDevice>,
    a: Qp<SoftDevice>,
    b: Qp<SoftDevice>,
    src: Mr<SoftDevice>,
    dst: Mr<SoftDevice>,
    attr: ConnectAttr,
    _cq_b: Cq<SoftDevice>,
}

fn env(max_send_wr: u32) -> Env {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(1024).unwrap();
    let cq_b = dev.create_cq(1024).unwrap();
    let init = QpInit {
        max_send_wr,
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
    let mut src = pd.register(8 * 1024, Access::LOCAL_WRITE).unwrap();
    for (i, x) in src.as_mut_slice().iter_mut().enumerate() {
        *x = (i % 251) as u8 + 1;
    }
    let dst = pd
        .register(
            8 * 1024,
            Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        )
        .unwrap();
    Env {
        dev,
        cq_a,
        a,
        b,
        src,
        dst,
        attr,
        _cq_b: cq_b,
    }
}

impl Env {
    /// An 8-byte WRITE of slot `i` (source and target at `i * 8`).
    fn write(&self, wr_id: u64, i: usize, signaled: bool) -> SendWr<'static> {
        let sge: &'static [rdma_direct::Sge] = Box::leak(Box::new([self.src.sge(i * 8, 8)]));
        SendWr::new(
            wr_id,
            SendOp::Write {
                remote: self.dst.remote(i * 8),
            },
            sge,
            if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            },
        )
    }

    /// Slot `i` has landed at the target.
    fn landed(&self, i: usize) -> bool {
        self.dst.as_slice()[i * 8..i * 8 + 8] == self.src.as_slice()[i * 8..i * 8 + 8]
    }

    /// Waits (thread mode) until slots `range` have landed.
    fn wait_landed(&self, range: std::ops::Range<usize>) {
        let t0 = Instant::now();
        while !range.clone().all(|i| self.landed(i)) {
            assert!(t0.elapsed() < WAIT, "WRITEs {range:?} did not land");
            std::thread::yield_now();
        }
    }

    /// Polls until `n` completions arrived; returns them.
    fn wait_wcs(&mut self, n: usize) -> Vec<Wc> {
        let mut got = Vec::new();
        let mut out = [Wc::default(); 16];
        let t0 = Instant::now();
        while got.len() < n {
            let k = self.cq_a.poll(&mut self.a, &mut out).unwrap();
            got.extend_from_slice(&out[..k]);
            assert!(t0.elapsed() < WAIT, "only {} of {n} completions", got.len());
        }
        got
    }

    /// Drains and resets `a`, recording every completion reported.
    fn drain(&mut self, seen: &mut HashMap<u64, Vec<WcStatus>>) -> usize {
        let r = self
            .a
            .drain_and_reset(&mut self.cq_a, None, WAIT, |w| {
                seen.entry(w.wr_id).or_default().push(w.status)
            })
            .expect("recovery finishes");
        assert_eq!(self.a.outstanding(), 0);
        assert_eq!(self.a.state(), QpState::Reset);
        r.reported
    }

    /// Reconnects `a` and shows it works: a signaled WRITE lands.
    fn reconnect_and_write(&mut self, slot: usize) {
        let ib = self.b.info();
        self.a.connect(&ib, &self.attr).unwrap();
        let w = self.write(777, slot, true);
        self.a.post_send(&[w]).unwrap();
        let got = self.wait_wcs(1);
        assert_eq!((got[0].wr_id, got[0].status), (777, WcStatus::SUCCESS));
        assert!(self.landed(slot));
        assert_eq!(self.a.outstanding(), 0);
    }
}

/// (a) One valid unsignaled WRITE that the device executed, then recovery:
/// it finishes, reports nothing for that WR, and the QP works afterwards.
#[test]
fn one_executed_unsignaled_write_then_recover() {
    let mut e = env(64);
    e.dev.backend().start();
    let w = e.write(1, 0, false);
    e.a.post_send(&[w]).unwrap();
    e.wait_landed(0..1);
    assert_eq!(e.a.outstanding(), 1, "executed but not retired");
    let mut seen = HashMap::new();
    assert_eq!(e.drain(&mut seen), 0);
    assert!(seen.is_empty(), "{seen:?}");
    e.reconnect_and_write(1);
    // The one-call form does the same.
    let w = e.write(2, 2, false);
    e.a.post_send(&[w]).unwrap();
    e.wait_landed(2..3);
    let ib = e.b.info();
    let r =
        e.a.recover(&mut e.cq_a, None, &ib, &e.attr, WAIT, |w| {
            panic!("reported {w:?}")
        })
        .expect("recover finishes");
    assert_eq!((r.reported, r.failure), (0, None));
    assert_eq!(e.a.state(), QpState::Rts);
    e.dev.backend().stop();
}

/// (a), step mode: nobody steps during the first call, so it times out
/// with the marker posted; once the device has run, the second call
/// finishes and posts no second marker.
#[test]
fn step_mode_recovery_finishes_once_the_device_runs() {
    let mut e = env(64);
    let w = e.write(1, 0, false);
    e.a.post_send(&[w]).unwrap();
    e.dev.backend().run_until_idle(100);
    assert!(e.landed(0));
    let free = e.a.send_space();
    assert_eq!(
        e.a.drain_and_reset(&mut e.cq_a, None, Duration::from_millis(20), |w| {
            panic!("reported {w:?}")
        })
        .err(),
        Some(Error::Timeout)
    );
    assert_eq!(e.a.send_space(), free - 1, "the marker is posted");
    // A repeated call before the device ran adds no second marker.
    assert_eq!(
        e.a.drain_and_reset(&mut e.cq_a, None, Duration::from_millis(1), |_| {})
            .err(),
        Some(Error::Timeout)
    );
    assert_eq!(e.a.send_space(), free - 1, "one marker only");
    e.dev.backend().run_until_idle(100);
    let mut seen = HashMap::new();
    assert_eq!(e.drain(&mut seen), 0);
    assert!(seen.is_empty(), "{seen:?}");
    e.dev.backend().start();
    e.reconnect_and_write(1);
    e.dev.backend().stop();
}

/// (b) "Signal every 16th send" (as the docs recommend), and the QP fails
/// between two signaled WRs: the WRs after the last signaled one were
/// executed and have no completion. Recovery finishes; the signaled WRs
/// are reported once each, nothing else.
#[test]
fn signal_every_16th_failing_between_two_signaled_wrs() {
    let mut e = env(64);
    e.dev.backend().start();
    let mut seen: HashMap<u64, Vec<WcStatus>> = HashMap::new();
    // 0..40: 15 and 31 signaled; 32..39 executed, unsignaled.
    let wrs: Vec<SendWr> = (0..40)
        .map(|i| e.write(i, i as usize, i % 16 == 15))
        .collect();
    e.a.post_send(&wrs).unwrap();
    for w in e.wait_wcs(2) {
        seen.entry(w.wr_id).or_default().push(w.status);
    }
    e.wait_landed(0..40);
    // The failure: the peer goes away; the application recovers.
    e.b.modify(&rdma_direct::api::QpModify::to(QpState::Error))
        .unwrap();
    assert_eq!(e.drain(&mut seen), 0);
    let mut want = HashMap::new();
    want.insert(15, vec![WcStatus::SUCCESS]);
    want.insert(31, vec![WcStatus::SUCCESS]);
    assert_eq!(seen, want);
    e.dev.backend().stop();
}

/// (c) A mix: executed unsignaled sends, a signaled one executed but not
/// polled, outstanding (not executed) signaled and unsignaled sends, and
/// posted receives, over two recoveries of one QP. Every WR is reported
/// exactly once (flushed ones with flush status), except executed
/// unsignaled ones, which are never reported; a user WR whose wr_id is the
/// marker's own (0) is reported like any other.
#[test]
fn a_mix_of_work_each_wr_reported_exactly_once() {
    let mut e = env(64);
    let buf = e.src.sge(4096, 64);
    let rsges: Vec<[rdma_direct::Sge; 1]> = (0..4).map(|_| [buf]).collect();
    let recvs = |base: u64| -> Vec<RecvWr> {
        rsges
            .iter()
            .enumerate()
            .map(|(i, s)| RecvWr {
                wr_id: base + i as u64,
                sges: s,
            })
            .collect()
    };
    let mut seen: HashMap<u64, Vec<WcStatus>> = HashMap::new();

    // Round 1 (step mode): 10 unsignaled, 11 signaled (its completion left
    // in the CQ), 12..14 unsignaled, all executed; the tail is unsignaled.
    let wrs: Vec<SendWr> = (10..15).map(|i| e.write(i, i as usize, i == 11)).collect();
    e.a.post_send(&wrs).unwrap();
    e.a.post_recv(&recvs(100)).unwrap();
    e.dev.backend().run_until_idle(100);
    assert!((10..15).all(|i| e.landed(i)));
    e.dev.backend().start();
    let reported = e.drain(&mut seen);
    e.dev.backend().stop();
    assert_eq!(reported, 5, "{seen:?}");
    assert_eq!(seen.remove(&11), Some(vec![WcStatus::SUCCESS]));
    for id in 100..104 {
        assert_eq!(seen.remove(&id), Some(vec![WcStatus::WR_FLUSH_ERR]), "{id}");
    }
    assert!(
        seen.is_empty(),
        "executed unsignaled WRs reported: {seen:?}"
    );

    // Round 2: 20 unsignaled executed; then the device stalls, and 0
    // (signaled, the marker's wr_id), 21 (unsignaled), 22 (signaled), 23
    // (unsignaled) stay outstanding; receives posted.
    let ib = e.b.info();
    e.a.connect(&ib, &e.attr).unwrap();
    let w = e.write(20, 20, false);
    e.a.post_send(&[w]).unwrap();
    e.dev.backend().run_until_idle(100);
    assert!(e.landed(20));
    e.dev.backend().inject(Fault::DelayCompletions {
        time: Duration::from_secs(3600),
        steps: 1_000_000,
    });
    let held = [
        e.write(0, 30, true),
        e.write(21, 21, false),
        e.write(22, 22, true),
        e.write(23, 23, false),
    ];
    e.a.post_send(&held).unwrap();
    e.a.post_recv(&recvs(200)).unwrap();
    e.dev.backend().run_until_idle(100);
    assert!(!e.landed(30) && !e.landed(21));
    e.dev.backend().start();
    let reported = e.drain(&mut seen);
    e.dev.backend().stop();
    assert_eq!(reported, 8, "{seen:?}");
    for id in [0, 21, 22, 23, 200, 201, 202, 203] {
        assert_eq!(seen.remove(&id), Some(vec![WcStatus::WR_FLUSH_ERR]), "{id}");
    }
    assert!(seen.is_empty(), "{seen:?}");
    e.dev.backend().clear_faults();
    e.dev.backend().start();
    e.reconnect_and_write(40);
    e.dev.backend().stop();
}

/// (e) The send queue completely full of executed work: one signaled WR,
/// then unsignaled ones until the queue is full (the signalling guard adds
/// forced completions; after the last of them an unsignaled tail remains).
/// The marker does not fit at first; polling retires the signaled and the
/// forced completions, which frees room, and the marker then retires the
/// unsignaled tail. No room is reserved for the marker: the full ring was
/// usable.
#[test]
fn a_completely_full_send_queue_of_executed_work() {
    let mut e = env(16);
    let mut posted = 0u64;
    loop {
        let w = e.write(posted, posted as usize, posted == 0);
        match e.a.post_send_one(&w) {
            Ok(()) => posted += 1,
            Err(Error::SqFull) => break,
            Err(x) => panic!("{x:?}"),
        }
    }
    assert_eq!(e.a.send_space(), 0);
    assert!(posted >= 16, "the whole ring was usable: {posted}");
    e.dev.backend().run_until_idle(1000);
    assert!((0..posted as usize).all(|i| e.landed(i)));
    let mut seen = HashMap::new();
    e.dev.backend().start();
    assert_eq!(e.drain(&mut seen), 1);
    assert_eq!(seen, HashMap::from([(0, vec![WcStatus::SUCCESS])]));
    e.reconnect_and_write(500);
    e.dev.backend().stop();
}

/// `Qp::recover` with a reconnect input it would refuse (retry_cnt 8, a
/// peer with a 25-bit QPN) refuses it before draining anything: the QP
/// keeps its state and its outstanding work, and a valid recover then
/// finishes and reconnects.
#[test]
fn a_refused_recover_drains_nothing() {
    let mut e = env(64);
    e.dev.backend().start();
    let w = e.write(1, 0, false);
    e.a.post_send(&[w]).unwrap();
    e.wait_landed(0..1);
    let before = (e.a.state(), e.a.outstanding());
    assert_eq!(before, (QpState::Rts, 1));
    let ib = e.b.info();
    let bad_attr = ConnectAttr {
        retry_cnt: 8,
        ..e.attr
    };
    let mut bad_peer = ib;
    bad_peer.qpn = 1 << 24;
    for (peer, attr) in [(ib, bad_attr), (bad_peer, e.attr)] {
        let r = e.a.recover(&mut e.cq_a, None, &peer, &attr, WAIT, |_| {});
        assert_eq!(r.unwrap_err(), Error::InvalidAttribute);
        assert_eq!((e.a.state(), e.a.outstanding()), before, "nothing drained");
    }
    let r = e.a.recover(&mut e.cq_a, None, &ib, &e.attr, WAIT, |_| {});
    assert_eq!(r.expect("recover finishes").reported, 0);
    assert_eq!(e.a.state(), QpState::Rts);
    e.dev.backend().stop();
}
