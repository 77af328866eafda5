//! Credit-based flow control (`rdma_direct::credit`) on the software
//! device.
//!
//! The main test pits a deliberately slow receiver against a fast sender.
//! Without flow control, the sender's completions show
//! `RNR_RETRY_EXC_ERR`. With [`CreditQp`], the same workload completes
//! with no RNR NAK at all: its QPs use `rnr_retry = 0`, so a single RNR NAK
//! would fail the QP. Every message is delivered exactly once, in order,
//! intact. The other tests cover the edges: no credit, a timed-out wait,
//! credits in both directions, explicit credits on a one-way stream, the
//! reserved credit that prevents deadlock, protocol errors, iWARP, and
//! configuration checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::credit::{CreditConfig, CreditImm, CreditInfo, CreditQp};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, SendFlags, SendOp, SendWr};

#[path = "support/messages.rs"]
mod messages;
#[path = "support/slow_receiver.rs"]
mod slow_receiver;
use messages::{check, message, strict, MSG_MAX};

type Dev = Device<SoftDevice>;

/// Counts this thread's allocations, to prove the data path makes none.
#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::mine as my_allocs;

/// Messages in the slow-receiver workload.
const STREAM: u64 = 3000;
/// Receive window of the slow receiver (with and without the layer).
const WINDOW: u32 = 16;
/// The slow receiver takes at most this many messages per period...
const BATCH: usize = 8;
/// ...and sleeps this long between batches.
const PERIOD: Duration = Duration::from_millis(1);

/// A QP and the CQ that serves it.
type Side = (Qp<SoftDevice>, Cq<SoftDevice>);

/// Two connected RC QPs, each with its own CQ.
fn connected(cfg: SoftConfig, attr: ConnectAttr) -> (Dev, Pd<SoftDevice>, Side, Side) {
    let dev = Device::new(SoftDevice::new(cfg));
    let pd = dev.alloc_pd().unwrap();
    let init = QpInit::default();
    let depth = dev.cq_depth_for(&[&init]);
    let cqa = dev.create_cq(depth).unwrap();
    let cqb = dev.create_cq(depth).unwrap();
    let mut a = pd.create_qp(&cqa, &cqa, &init).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &init).unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    (dev, pd, (a, cqa), (b, cqb))
}

fn cfg(recv_depth: u32) -> CreditConfig {
    CreditConfig {
        recv_depth,
        msg_size: MSG_MAX as u32,
        send_slots: 16,
        ..CreditConfig::default()
    }
}

/// Two CreditQps over a connected pair, announcements exchanged.
fn credit_pair(
    dev_cfg: SoftConfig,
    attr: ConnectAttr,
    ca: &CreditConfig,
    cb: &CreditConfig,
) -> (Dev, CreditQp<SoftDevice>, CreditQp<SoftDevice>) {
    let (dev, pd, (a, cqa), (b, cqb)) = connected(dev_cfg, attr);
    let mut a = CreditQp::new(&pd, a, cqa, ca).unwrap();
    let mut b = CreditQp::new(&pd, b, cqb, cb).unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.set_peer(&ib).unwrap();
    b.set_peer(&ia).unwrap();
    (dev, a, b)
}

/// Sends until the layer refuses; returns how many went, and the refusal.
fn send_until_refused(q: &mut CreditQp<SoftDevice>, next: &mut u64, limit: u64) -> (u64, Error) {
    let mut buf = [0u8; MSG_MAX];
    let mut n = 0;
    while *next < limit {
        let len = message(*next, &mut buf);
        match q.send(&buf[..len]) {
            Ok(()) => {
                *next += 1;
                n += 1;
            }
            Err(e) => return (n, e),
        }
    }
    (n, Error::NoCredits)
}

/// Receives everything ready, checking order and payload.
fn recv_all(q: &mut CreditQp<SoftDevice>, expect: &mut u64) -> usize {
    q.recv(usize::MAX, |msg| {
        check(*expect, msg);
        *expect += 1;
    })
    .unwrap()
}

#[test]
fn slow_receiver_without_flow_control_gets_rnr_errors() {
    let dev_cfg = SoftConfig {
        rnr_delay: Duration::from_micros(50),
        ..SoftConfig::default()
    };
    let attr = ConnectAttr {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    };
    let (dev, pd, (mut a, mut cqa), (b, cqb)) = connected(dev_cfg, attr);
    dev.backend().start();
    let src = pd.register(MSG_MAX, Access::NONE).unwrap();
    let dst = pd
        .register(WINDOW as usize * MSG_MAX, Access::LOCAL_WRITE)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The slow receiver: every PERIOD, takes what arrived and re-posts at
    // most BATCH buffers. (Payloads are not checked here: this run is
    // about the RNR NAKs.)
    let receiver = slow_receiver::spawn(
        b,
        cqb,
        &dst,
        MSG_MAX,
        slow_receiver::Pace {
            window: WINDOW,
            batch: BATCH,
            period: PERIOD,
        },
        Arc::clone(&stop),
    );
    // The fast sender: every SEND signaled, as many as the SQ holds.
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut rnr = 0u64;
    let mut other_errors = 0u64;
    let mut wc = [Wc::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if a.state() != QpState::Error && posted < STREAM {
            let sges = [src.sge(0, MSG_MAX as u32)];
            let wr = SendWr::new(posted, SendOp::Send, &sges, SendFlags::SIGNALED);
            match a.post_send_one(&wr) {
                Ok(()) => posted += 1,
                Err(Error::SqFull) => {}
                Err(e) => panic!("post: {e}"),
            }
        }
        let n = cqa.poll(&mut a, &mut wc).unwrap();
        for w in &wc[..n] {
            completed += 1;
            match w.status {
                WcStatus::SUCCESS | WcStatus::WR_FLUSH_ERR => {}
                WcStatus::RNR_RETRY_EXC_ERR => rnr += 1,
                _ => other_errors += 1,
            }
        }
        if completed == posted && (posted == STREAM || a.state() == QpState::Error) {
            break;
        }
        assert!(Instant::now() < deadline, "sender stuck");
    }
    stop.store(true, Ordering::Relaxed);
    let got = receiver.join().unwrap();
    let delivered = got.delivered;
    drop(dst);
    // The responder only refused: its receives all succeeded, its QP is
    // fine.
    assert_eq!((got.failed, got.state), (0, QpState::Rts));
    assert!(
        rnr >= 1,
        "a slow receiver without flow control must cause RNR errors"
    );
    assert_eq!(other_errors, 0);
    assert_eq!(a.state(), QpState::Error);
    assert!(delivered < STREAM, "the stream broke off");
    let f = a.failure().expect("the failed SEND is recorded");
    assert_eq!(f.status, WcStatus::RNR_RETRY_EXC_ERR);
}

#[test]
fn slow_receiver_with_credits_has_no_rnr_and_delivers_everything_in_order() {
    let dev_cfg = SoftConfig {
        rnr_delay: Duration::from_micros(50),
        ..SoftConfig::default()
    };
    // Stricter than the run without the layer: no RNR retry at all.
    let (dev, mut a, mut b) = credit_pair(dev_cfg, strict(), &cfg(WINDOW), &cfg(WINDOW));
    dev.backend().start();
    let sender = thread::spawn(move || {
        let mut buf = [0u8; MSG_MAX];
        for seq in 0..STREAM {
            let len = message(seq, &mut buf);
            a.send_wait(&buf[..len], Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("send {seq}: {e} (failure {:?})", a.failure()));
        }
        a
    });
    // The slow receiver: at most BATCH messages per PERIOD; a buffer is
    // re-posted only when its message has been taken.
    let receiver = thread::spawn(move || {
        let mut expect = 0u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while expect < STREAM {
            thread::sleep(PERIOD);
            b.recv(BATCH, |msg| {
                check(expect, msg);
                expect += 1;
            })
            .unwrap_or_else(|e| panic!("recv: {e} (failure {:?})", b.failure()));
            assert!(Instant::now() < deadline, "receiver stuck at {expect}");
        }
        (b, expect)
    });
    let a = sender.join().unwrap();
    let (mut b, got) = receiver.join().unwrap();
    assert_eq!(got, STREAM);
    // Exactly once: nothing more arrives.
    thread::sleep(Duration::from_millis(20));
    assert_eq!(b.recv(usize::MAX, |_| panic!("a duplicate")).unwrap(), 0);
    for q in [&a, &b] {
        assert_eq!(q.failure(), None);
        assert_eq!(q.broken(), None);
        assert_eq!(q.qp().state(), QpState::Rts);
        assert!(q.qp().failure().is_none(), "no RNR (nor any) error");
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.sent, sb.received), (STREAM, STREAM));
    assert!(
        sa.no_credit > 0,
        "the sender was held back by credits: {sa:?}"
    );
    assert!(
        sb.credit_msgs_sent > 0,
        "a one-way stream returns credits explicitly: {sb:?}"
    );
    assert_eq!(sb.sent, 0);
}

#[test]
fn out_of_credits_is_immediate_and_posts_nothing() {
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(4));
    assert_eq!(a.credits(), 3, "4 receives announced, one reserved");
    let mut next = 0;
    let (n, e) = send_until_refused(&mut a, &mut next, 100);
    assert_eq!((n, e), (3, Error::NoCredits));
    let before = a.qp().outstanding();
    let t = Instant::now();
    assert_eq!(a.send(b"more"), Err(Error::NoCredits));
    assert!(t.elapsed() < Duration::from_millis(100), "refused at once");
    assert_eq!(a.qp().outstanding(), before, "nothing posted");
    assert_eq!(a.stats().sent, 3);
    assert_eq!(a.broken(), None, "NoCredits does not break anything");
    // The peer takes the three messages: its re-posted receives reach the
    // threshold (2) and come back as an explicit grant.
    dev.backend().run_until_idle(64);
    let mut expect = 0;
    assert_eq!(recv_all(&mut b, &mut expect), 3);
    assert_eq!(b.stats().credit_msgs_sent, 1);
    dev.backend().run_until_idle(64);
    let (n, e) = send_until_refused(&mut a, &mut next, 100);
    assert_eq!((n, e), (3, Error::NoCredits));
    dev.backend().run_until_idle(64);
    assert_eq!(recv_all(&mut b, &mut expect), 3);
    assert_eq!(expect, 6);
}

#[test]
fn send_wait_times_out_when_the_peer_never_reposts() {
    let (dev, mut a, b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(4));
    dev.backend().start();
    let mut next = 0;
    assert_eq!(send_until_refused(&mut a, &mut next, 100).0, 3);
    // The peer never calls into its CreditQp: no receive is re-posted.
    let timeout = Duration::from_millis(80);
    let t = Instant::now();
    assert_eq!(a.send_wait(b"late", timeout), Err(Error::Timeout));
    let took = t.elapsed();
    assert!(took >= timeout, "waited {took:?}");
    assert!(took < Duration::from_secs(5), "bounded wait, took {took:?}");
    assert_eq!(a.stats().sent, 3);
    assert_eq!(a.broken(), None);
    assert_eq!(
        a.wait_credit(Duration::from_millis(10)),
        Err(Error::Timeout)
    );
    drop(b);
}

#[test]
fn credits_flow_both_ways_on_data() {
    // Threshold at the top of the window and at most 3 messages per round:
    // every credit returns on a data message, none explicitly.
    let c = CreditConfig {
        grant_threshold: 7,
        ..cfg(8)
    };
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &c, &c);
    const N: u64 = 600;
    let (mut next_a, mut next_b) = (0u64, 0u64);
    let (mut got_a, mut got_b) = (0u64, 0u64);
    let mut rounds = 0;
    while got_a < N || got_b < N {
        let before = (next_a, next_b, got_a, got_b);
        let (limit_a, limit_b) = ((next_a + 3).min(N), (next_b + 3).min(N));
        send_until_refused(&mut a, &mut next_a, limit_a);
        send_until_refused(&mut b, &mut next_b, limit_b);
        dev.backend().run_until_idle(64);
        recv_all(&mut a, &mut got_a);
        recv_all(&mut b, &mut got_b);
        dev.backend().run_until_idle(64);
        assert_ne!(before, (next_a, next_b, got_a, got_b), "stalled");
        rounds += 1;
        assert!(rounds < 10 * N, "too many rounds");
    }
    for q in [&a, &b] {
        let s = q.stats();
        assert_eq!((s.sent, s.received), (N, N));
        assert_eq!(s.credit_msgs_sent, 0, "no explicit credit needed: {s:?}");
        assert!(s.granted_piggyback >= N - 3, "credits rode on data: {s:?}");
        assert_eq!(s.credits_received, s.granted_piggyback);
    }
    assert_eq!(a.stats().granted_piggyback, b.stats().credits_received);
}

#[test]
fn both_sides_out_of_credits_recover_through_the_reserved_credit() {
    // Both sides spend every data credit before either receives anything.
    // Each then owes the other its whole window, and only the reserved
    // credit lets the grants through.
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(8));
    let (mut next_a, mut next_b, mut got_a, mut got_b) = (0, 0, 0, 0);
    for _ in 0..5 {
        assert_eq!(
            send_until_refused(&mut a, &mut next_a, 1000).1,
            Error::NoCredits
        );
        assert_eq!(
            send_until_refused(&mut b, &mut next_b, 1000).1,
            Error::NoCredits
        );
        assert_eq!((a.credits(), b.credits()), (0, 0));
        assert_eq!((a.raw_credits(), b.raw_credits()), (1, 1), "the reserve");
        dev.backend().run_until_idle(64);
        recv_all(&mut a, &mut got_a);
        recv_all(&mut b, &mut got_b);
        dev.backend().run_until_idle(64);
        a.progress().unwrap();
        b.progress().unwrap();
        assert!(a.credits() > 0 && b.credits() > 0, "credits came back");
    }
    assert_eq!((got_a, got_b), (next_b, next_a));
    assert!(a.stats().credit_msgs_sent >= 5 && b.stats().credit_msgs_sent >= 5);
}

#[test]
fn one_way_stream_does_not_stall() {
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(8));
    const N: u64 = 2000;
    let (mut next, mut got) = (0u64, 0u64);
    let mut rounds = 0u64;
    while got < N {
        let before = (next, got);
        send_until_refused(&mut a, &mut next, N);
        dev.backend().run_until_idle(64);
        recv_all(&mut b, &mut got);
        dev.backend().run_until_idle(64);
        assert_ne!(before, (next, got), "stalled at {got}");
        rounds += 1;
        assert!(rounds < N, "too many rounds");
    }
    // The sender polls only when it needs credits: take the last grants.
    a.progress().unwrap();
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sb.sent, 0, "nothing flows back but credits");
    assert!(sb.credit_msgs_sent > 0);
    assert_eq!(sb.granted_explicit, sa.credits_received);
    assert_eq!(sa.credit_msgs_received, sb.credit_msgs_sent);
    // The sender owed the receives its peer's credit messages used, and
    // returned them on its data.
    assert!(sa.granted_piggyback > 0);
    assert_eq!(sa.credit_msgs_sent, 0);
}

#[test]
fn one_way_stream_threaded_with_waits() {
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(8));
    dev.backend().start();
    const N: u64 = 2000;
    let receiver = thread::spawn(move || {
        let mut got = 0u64;
        while got < N {
            b.recv_wait(usize::MAX, Duration::from_secs(30), |msg| {
                check(got, msg);
                got += 1;
            })
            .unwrap();
        }
        b
    });
    let mut buf = [0u8; MSG_MAX];
    for seq in 0..N {
        let len = message(seq, &mut buf);
        a.send_wait(&buf[..len], Duration::from_secs(30)).unwrap();
    }
    let b = receiver.join().unwrap();
    assert_eq!(b.stats().received, N);
    assert!(b.stats().credit_msgs_sent > 0);
    assert_eq!(a.failure(), None);
}

#[test]
fn recv_wait_times_out_and_messages_too_long_are_refused() {
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(8));
    dev.backend().start();
    let t = Instant::now();
    assert_eq!(
        b.recv_wait(4, Duration::from_millis(30), |_| {}),
        Err(Error::Timeout)
    );
    assert!(t.elapsed() >= Duration::from_millis(30));
    assert_eq!(a.max_message(), MSG_MAX as u32);
    assert_eq!(a.send(&[0u8; MSG_MAX + 1]), Err(Error::LengthOverflow));
    assert_eq!(a.stats().sent, 0);
    // Still usable: an empty message and a full one.
    a.send(&[]).unwrap();
    a.send(&[7u8; MSG_MAX]).unwrap();
    let mut lens = Vec::new();
    while lens.len() < 2 {
        b.recv_wait(4, Duration::from_secs(10), |m| {
            assert!(m.iter().all(|&x| x == 7));
            lens.push(m.len());
        })
        .unwrap();
    }
    assert_eq!(lens, [0, MSG_MAX]);
}

#[test]
fn no_credits_before_the_peer_announcement_and_receiving_works() {
    let (dev, pd, (a, cqa), (b, cqb)) = connected(SoftConfig::default(), strict());
    let mut a = CreditQp::new(&pd, a, cqa, &cfg(8)).unwrap();
    let mut b = CreditQp::new(&pd, b, cqb, &cfg(8)).unwrap();
    assert_eq!(a.send(b"x"), Err(Error::NoCredits));
    assert_eq!(a.max_message(), 0);
    // b learns a's announcement first and sends; a receives before it has
    // b's announcement.
    b.set_peer(&a.info()).unwrap();
    b.send(b"early").unwrap();
    dev.backend().run_until_idle(64);
    let mut got = Vec::new();
    assert_eq!(a.recv(8, |m| got.extend_from_slice(m)).unwrap(), 1);
    assert_eq!(got, b"early");
    let ib = CreditInfo::from_bytes(&b.info().to_bytes());
    a.set_peer(&ib).unwrap();
    assert_eq!(a.set_peer(&ib), Err(Error::InvalidAttribute));
    assert_eq!(a.credits(), 7);
    a.send(b"x").unwrap();
}

#[test]
fn a_send_without_the_protocol_is_a_protocol_error() {
    for op in [
        SendOp::Send,
        // Reserved bits set.
        SendOp::SendImm { imm: 0x0100_0000 },
        // More credits than the receiver ever announced.
        SendOp::SendImm {
            imm: CreditImm {
                grant: 100,
                credit_only: true,
            }
            .encode(),
        },
    ] {
        let (dev, pd, (mut raw, mut cq_raw), (b, cqb)) = connected(SoftConfig::default(), strict());
        let mut b = CreditQp::new(&pd, b, cqb, &cfg(8)).unwrap();
        b.set_peer(&CreditInfo {
            credits: 8,
            max_msg: 64,
        })
        .unwrap();
        let src = pd.register(8, Access::NONE).unwrap();
        raw.post_send_one(&SendWr::new(1, op, &[src.sge(0, 0)], SendFlags::SIGNALED))
            .unwrap();
        dev.backend().run_until_idle(64);
        let mut wc = [Wc::default(); 4];
        assert_eq!(cq_raw.poll(&mut raw, &mut wc).unwrap(), 1);
        assert_eq!(
            b.recv(8, |_| panic!("not a message")),
            Err(Error::ProtocolError),
            "{op:?}"
        );
        assert_eq!(b.broken(), Some(Error::ProtocolError));
        assert_eq!(b.send(b"x"), Err(Error::ProtocolError), "sticky");
    }
}

#[test]
fn a_failed_qp_is_reported_and_earlier_messages_still_delivered() {
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(8));
    let mut next = 0;
    send_until_refused(&mut a, &mut next, 2);
    dev.backend().run_until_idle(64);
    // Break b's QP behind the layer's back.
    dev.backend()
        .modify_qp(b.qp().qpn(), &QpModify::to(QpState::Error))
        .unwrap();
    dev.backend().run_until_idle(64);
    let mut got = 0;
    assert_eq!(recv_all(&mut b, &mut got), 2, "received before the error");
    assert_eq!(b.failure(), Some(WcStatus::WR_FLUSH_ERR));
    assert_eq!(b.recv(8, |_| {}), Err(Error::InvalidQpState));
    assert_eq!(b.send(b"x"), Err(Error::InvalidQpState));
}

#[test]
fn configuration_and_state_are_checked() {
    let (dev, pd, (a, cqa), (b, _cqb)) = connected(SoftConfig::default(), strict());
    let bad = [
        cfg(2),
        CreditConfig {
            grant_threshold: 8,
            ..cfg(8)
        },
        CreditConfig {
            grant_threshold: 1,
            ..cfg(8)
        },
        CreditConfig {
            msg_size: 0,
            ..cfg(8)
        },
        CreditConfig {
            send_slots: 0,
            ..cfg(8)
        },
    ];
    for c in &bad {
        assert_eq!(
            CreditQp::check(&a, c),
            Err(Error::InvalidAttribute),
            "{c:?}"
        );
    }
    assert_eq!(CreditQp::check(&a, &cfg(8)), Ok(()));
    // A window larger than the receive queue (64 by default).
    assert_eq!(
        CreditQp::new(&pd, a, cqa, &cfg(1000)).err(),
        Some(Error::RqFull)
    );
    // A QP in RESET.
    let cq = dev.create_cq(256).unwrap();
    let fresh = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    assert_eq!(CreditQp::check(&fresh, &cfg(8)), Err(Error::InvalidQpState));
    drop(b);
}

/// The software device dressed up as an iWARP port.
struct IwarpSoft(SoftDevice);

impl Backend for IwarpSoft {
    fn name(&self) -> &str {
        "soft-iwarp"
    }
    fn port(&self) -> PortInfo {
        PortInfo {
            transport: Transport::Iwarp,
            ..Backend::port(&self.0)
        }
    }
    fn alloc_pd(&self) -> rdma_direct::Result<u32> {
        Backend::alloc_pd(&self.0)
    }
    fn dealloc_pd(&self, pd: u32) -> rdma_direct::Result<()> {
        Backend::dealloc_pd(&self.0, pd)
    }
    unsafe fn reg_mr(
        &self,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> rdma_direct::Result<MrKeys> {
        // SAFETY: forwarded contract: the caller keeps the memory valid
        // until `dereg_mr`.
        unsafe { Backend::reg_mr(&self.0, pd, addr, len, access) }
    }
    fn dereg_mr(&self, lkey: u32) -> rdma_direct::Result<()> {
        Backend::dereg_mr(&self.0, lkey)
    }
    fn create_cq(&self, depth: u32) -> rdma_direct::Result<RawCq> {
        Backend::create_cq(&self.0, depth)
    }
    fn destroy_cq(&self, cqn: u32) -> rdma_direct::Result<()> {
        Backend::destroy_cq(&self.0, cqn)
    }
    fn create_qp(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        init: &QpInit,
    ) -> rdma_direct::Result<RawQp> {
        Backend::create_qp(&self.0, pd, send_cq, recv_cq, init)
    }
    fn modify_qp(&self, qpn: u32, m: &QpModify) -> rdma_direct::Result<()> {
        Backend::modify_qp(&self.0, qpn, m)
    }
    fn destroy_qp(&self, qpn: u32) -> rdma_direct::Result<()> {
        Backend::destroy_qp(&self.0, qpn)
    }
}

#[test]
fn iwarp_is_unsupported() {
    let dev = Device::new(IwarpSoft(SoftDevice::new(SoftConfig::default())));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    assert_eq!(CreditQp::check(&qp, &cfg(8)), Err(Error::Unsupported));
    assert_eq!(
        CreditQp::new(&pd, qp, cq, &cfg(8)).err(),
        Some(Error::Unsupported)
    );
}

#[test]
fn the_data_path_allocates_nothing() {
    let (dev, mut a, mut b) = credit_pair(SoftConfig::default(), strict(), &cfg(8), &cfg(8));
    dev.backend().start();
    let mut buf = [0u8; MSG_MAX];
    let (mut sent_ab, mut sent_ba, mut got_ab, mut got_ba) = (0u64, 0u64, 0u64, 0u64);
    // One round trip outside the count (first-use effects, if any).
    let mut round = |a: &mut CreditQp<SoftDevice>, b: &mut CreditQp<SoftDevice>| {
        for _ in 0..5 {
            let len = message(sent_ab, &mut buf);
            a.send_wait(&buf[..len], Duration::from_secs(10)).unwrap();
            sent_ab += 1;
            let len = message(sent_ba, &mut buf);
            b.send_wait(&buf[..len], Duration::from_secs(10)).unwrap();
            sent_ba += 1;
        }
        while got_ab < sent_ab {
            b.recv_wait(usize::MAX, Duration::from_secs(10), |m| {
                check(got_ab, m);
                got_ab += 1;
            })
            .unwrap();
        }
        while got_ba < sent_ba {
            a.recv_wait(usize::MAX, Duration::from_secs(10), |m| {
                check(got_ba, m);
                got_ba += 1;
            })
            .unwrap();
        }
        a.progress().unwrap();
        b.flush_credits().unwrap();
        a.wait_credit(Duration::from_secs(10)).unwrap();
    };
    round(&mut a, &mut b);
    let before = my_allocs();
    for _ in 0..200 {
        round(&mut a, &mut b);
    }
    assert_eq!(my_allocs() - before, 0, "allocations on the data path");
    assert!(a.stats().sent >= 1000 && b.stats().sent >= 1000);
    assert_eq!(a.failure(), None);
}
