//! Credit-based flow control (`rdma_direct::credit`) on a real kernel RDMA
//! device: rxe (Soft-RoCE) in the test VM, on whichever data path
//! `RDMA_DIRECT_DATA_PATH` selects (scripts/vm-suite.sh runs this binary
//! once on rdma-direct's own rings and once on libibverbs' provider).
//!
//! The same slow-receiver workload runs twice on two QPs of one rxe
//! device, both connected with `rnr_retry = 0`, so a single RNR NAK fails
//! the sender's QP:
//!
//! - without flow control the sender's SENDs fail with
//!   `RNR_RETRY_EXC_ERR` (and the kernel's RNR counters move), which shows
//!   the workload really overruns the receiver;
//! - with [`CreditQp`] every message arrives exactly once, in order,
//!   intact, and no RNR NAK is sent at all (the QPs stay in RTS and the
//!   kernel's counters do not move).
//!
//! siw (iWARP) has no immediate data, so the layer refuses it with a typed
//! [`Error::Unsupported`]; a third test checks that on siw0.
//!
//! Outside the VM (no `IN_RDMA_VM`) the tests print that they did not run,
//! as in `tests/verbs_device.rs`; inside it a missing device fails them.
#![cfg(feature = "verbs")]

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, Backend, Cq, Device, Pd, Qp, QpInit, QpState, Transport, Wc, WcStatus,
};
use rdma_direct::credit::{CreditConfig, CreditQp};
use rdma_direct::verbs::cm::CmConnection;
use rdma_direct::verbs::VerbsDevice;
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

mod common;
use common::*;
#[path = "support/messages.rs"]
mod messages;
#[path = "support/slow_receiver.rs"]
mod slow_receiver;
use messages::{check, message, strict, MSG_MAX};

/// Messages in the slow-receiver workload: many times the receive window.
const STREAM: u64 = 2000;
/// Receives posted by the slow receiver (with and without the layer), and
/// the depth of its receive queue.
const WINDOW: u32 = 16;
/// The slow receiver takes at most this many messages per period...
const BATCH: usize = 8;
/// ...and sleeps this long between batches: at most 1 600 messages a
/// second, well below what rxe carries even under emulation.
const PERIOD: Duration = Duration::from_millis(5);
/// The fast sender without flow control posts this many SENDs per call
/// (one doorbell): each burst alone is twice the receive window.
const BURST: usize = 32;
/// Upper bound for one whole workload (the VM emulates its CPUs).
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The two rxe tests read device-wide kernel counters: one at a time, so
/// each sees only its own traffic even when the harness runs tests in
/// parallel.
static RXE_LOCK: Mutex<()> = Mutex::new(());

fn rxe_lock() -> MutexGuard<'static, ()> {
    // A failed test poisons the lock; the counters are still fine.
    RXE_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The RoCE device to test (rxe0 in the VM). `None` outside the VM, where
/// [`devices`] has said that the test did not run; inside the VM a missing
/// RoCE device is a failure.
fn roce_device(test: &str) -> Option<(String, IpAddr)> {
    let found = devices(test).into_iter().find(|(name, _)| is_roce(name));
    match found {
        Some(d) => Some(d),
        None => {
            assert!(!in_vm(), "{test}: no RoCE device (RXE_DEV) inside the VM");
            None
        }
    }
}

/// Queue sizes: the receive queue holds exactly the window.
fn init() -> QpInit {
    QpInit {
        max_send_wr: 64,
        max_recv_wr: WINDOW,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    }
}

fn credit_cfg() -> CreditConfig {
    CreditConfig {
        recv_depth: WINDOW,
        msg_size: MSG_MAX as u32,
        send_slots: 16,
        ..CreditConfig::default()
    }
}

/// A QP and the CQ that serves it alone.
type Side = (Qp<Dev>, Cq<Dev>);

/// Two QPs on device `name`, each with its own CQ, connected with
/// [`strict`] (out of band on RoCE, rdma_cm on iWARP).
fn connected(name: &str, ip: IpAddr) -> (Device<Dev>, Pd<Dev>, Side, Side, Vec<CmConnection>) {
    let dev = Device::new(VerbsDevice::open_named(name).expect("open device"));
    check_data_path(&dev);
    eprintln!("{name}: data path {:?}", dev.backend().data_path());
    let pd = dev.alloc_pd().unwrap();
    let init = init();
    let depth = dev.cq_depth_for(&[&init]);
    let cq_a = dev.create_cq(depth).unwrap();
    let cq_b = dev.create_cq(depth).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
    let conns = connect_qps_with(&mut a, &mut b, &dev, ip, false, &|_, _| {}, &strict());
    assert_eq!(
        (a.state(), b.state()),
        (QpState::Rts, QpState::Rts),
        "{name}"
    );
    (dev, pd, (a, cq_a), (b, cq_b), conns)
}

/// rxe's RNR counters (port 1 `hw_counters`, device-wide).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RnrCounters {
    /// RNR NAKs the responders sent (`send_rnr_err`).
    naks_sent: u64,
    /// RNR NAKs the requesters received (`rcvd_rnr_err`).
    naks_received: u64,
    /// Requests failed with RNR retries exhausted (`retry_rnr_exceeded_err`).
    retries_exceeded: u64,
}

impl RnrCounters {
    fn since(self, before: RnrCounters) -> RnrCounters {
        RnrCounters {
            naks_sent: self.naks_sent - before.naks_sent,
            naks_received: self.naks_received - before.naks_received,
            retries_exceeded: self.retries_exceeded - before.retries_exceeded,
        }
    }
}

/// Reads [`RnrCounters`] of device `name`. rxe in the VM must have them;
/// another RoCE device (a ConnectX port the suite was pointed at) may name
/// its counters differently: `None`, and the completions alone decide.
fn rnr_counters(name: &str) -> Option<RnrCounters> {
    let dir = format!("/sys/class/infiniband/{name}/ports/1/hw_counters");
    let read = |c: &str| -> Option<u64> {
        let s = std::fs::read_to_string(format!("{dir}/{c}")).ok()?;
        Some(
            s.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{dir}/{c}: {s:?}: {e}")),
        )
    };
    // The kernel serves hw_counters from a cache that it refreshes at most
    // once per `lifespan` milliseconds (10 by default). Wait that out, so
    // a read right after a short workload is not the value from before it
    // (seen in the VM suite: RNR_RETRY_EXC_ERR completions, counters
    // unchanged after a 2.5 ms run).
    let lifespan = read("lifespan").unwrap_or(10);
    thread::sleep(Duration::from_millis(2 * lifespan + 20));
    let c = (|| {
        Some(RnrCounters {
            naks_sent: read("send_rnr_err")?,
            naks_received: read("rcvd_rnr_err")?,
            retries_exceeded: read("retry_rnr_exceeded_err")?,
        })
    })();
    if c.is_none() {
        assert!(
            !(in_vm() && name.starts_with("rxe")),
            "{name}: no RNR counters in {dir}"
        );
        eprintln!("{name}: no rxe RNR counters; checking completions only");
    }
    c
}

#[test]
fn slow_receiver_without_flow_control_gets_rnr_errors_on_rxe() {
    let test = "slow_receiver_without_flow_control_gets_rnr_errors_on_rxe";
    let Some((name, ip)) = roce_device(test) else {
        return;
    };
    let _serial = rxe_lock();
    let (_dev, pd, (mut a, mut cq_a), (b, cq_b), _conns) = connected(&name, ip);
    let before = rnr_counters(&name);
    let src = pd.register(MSG_MAX, Access::NONE).unwrap();
    let dst = pd
        .register(WINDOW as usize * MSG_MAX, Access::LOCAL_WRITE)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The slow receiver: every PERIOD, takes what arrived and re-posts at
    // most BATCH buffers.
    let receiver = slow_receiver::spawn(
        b,
        cq_b,
        &dst,
        MSG_MAX,
        slow_receiver::Pace {
            window: WINDOW,
            batch: BATCH,
            period: PERIOD,
        },
        Arc::clone(&stop),
    );
    // The fast sender: every SEND signaled, in bursts of up to BURST, as
    // many as the send queue holds.
    let (mut posted, mut completed, mut ok, mut flushed, mut rnr) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut other = Vec::new();
    let mut wc = [Wc::default(); 64];
    let sges = [src.sge(0, MSG_MAX as u32)];
    let mut burst = Vec::with_capacity(BURST);
    let t0 = Instant::now();
    loop {
        if a.state() != QpState::Error && posted < STREAM {
            burst.clear();
            burst.extend(
                (posted..STREAM.min(posted + BURST as u64))
                    .map(|id| SendWr::new(id, SendOp::Send, &sges, SendFlags::SIGNALED)),
            );
            match a.post_send(&burst) {
                Ok(()) => posted += burst.len() as u64,
                // The WRs before `index` went.
                Err(e) => match e.error {
                    Error::SqFull | Error::CqFull => posted += e.index as u64,
                    err => panic!("{name}: post {}: {err}", posted + e.index as u64),
                },
            }
        }
        let n = cq_a.poll(&mut a, &mut wc).unwrap();
        for w in &wc[..n] {
            completed += 1;
            match w.status {
                WcStatus::SUCCESS => ok += 1,
                WcStatus::WR_FLUSH_ERR => flushed += 1,
                WcStatus::RNR_RETRY_EXC_ERR => rnr += 1,
                s => other.push((w.wr_id, s)),
            }
        }
        if completed == posted && (posted == STREAM || a.state() == QpState::Error) {
            break;
        }
        assert!(
            t0.elapsed() < RUN_LIMIT,
            "{name}: sender stuck: {posted} posted, {completed} completed"
        );
        if n == 0 {
            thread::yield_now();
        }
    }
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let slow_receiver::Received {
        delivered,
        failed: recv_failed,
        state: b_state,
    } = receiver.join().unwrap();
    drop(dst);
    eprintln!(
        "{name}: without flow control: {posted} SENDs posted, {ok} succeeded, {rnr} RNR retry \
         exceeded, {flushed} flushed; {delivered} received; {took:?}"
    );
    assert!(
        rnr >= 1,
        "{name}: a slow receiver without flow control must cause RNR errors \
         ({ok} of {posted} SENDs succeeded)"
    );
    assert!(other.is_empty(), "{name}: other errors: {other:?}");
    assert_eq!(
        ok + rnr + flushed,
        posted,
        "{name}: every SEND reported once"
    );
    assert_eq!(a.state(), QpState::Error, "{name}");
    let f = a.failure().expect("the failed SEND is recorded");
    assert_eq!(f.status, WcStatus::RNR_RETRY_EXC_ERR, "{name}: {f:?}");
    assert!(!f.recv, "{name}: a send-queue WR failed: {f:?}");
    assert!(delivered < STREAM, "{name}: the stream broke off");
    // The responder only refuses: its QP is fine.
    assert_eq!((recv_failed, b_state), (0, QpState::Rts), "{name}");
    if let (Some(before), Some(after)) = (before, rnr_counters(&name)) {
        let d = after.since(before);
        eprintln!("{name}: kernel RNR counters moved by {d:?}");
        // rxe's responder-side count (`send_rnr_err`) does not move on
        // every RNR NAK it sends (seen once in the VM suite: 0 sent, 1
        // received), so only the requester's counts are required.
        assert!(
            d.naks_received >= 1,
            "{name}: the requester received RNR NAKs: {d:?}"
        );
        assert!(d.retries_exceeded >= 1, "{name}: {d:?}");
    }
}

#[test]
fn slow_receiver_with_credits_has_no_rnr_and_delivers_in_order_on_rxe() {
    let test = "slow_receiver_with_credits_has_no_rnr_and_delivers_in_order_on_rxe";
    let Some((name, ip)) = roce_device(test) else {
        return;
    };
    let _serial = rxe_lock();
    let (_dev, pd, (a, cq_a), (b, cq_b), _conns) = connected(&name, ip);
    let before = rnr_counters(&name);
    let cfg = credit_cfg();
    let mut a = CreditQp::new(&pd, a, cq_a, &cfg).unwrap();
    let mut b = CreditQp::new(&pd, b, cq_b, &cfg).unwrap();
    let (ia, ib) = (a.info(), b.info());
    assert_eq!(ib.credits, WINDOW);
    a.set_peer(&ib).unwrap();
    b.set_peer(&ia).unwrap();
    let t0 = Instant::now();
    let sender = thread::spawn(move || {
        let mut buf = [0u8; MSG_MAX];
        for seq in 0..STREAM {
            let len = message(seq, &mut buf);
            a.send_wait(&buf[..len], Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("send {seq}: {e} (failure {:?})", a.failure()));
        }
        a
    });
    // The slow receiver: at most BATCH messages per PERIOD; a buffer is
    // re-posted (and becomes a credit) only once its message was taken.
    let receiver = thread::spawn(move || {
        let mut expect = 0u64;
        while expect < STREAM {
            thread::sleep(PERIOD);
            b.recv(BATCH, |msg| {
                check(expect, msg);
                expect += 1;
            })
            .unwrap_or_else(|e| panic!("recv at {expect}: {e} (failure {:?})", b.failure()));
            assert!(t0.elapsed() < RUN_LIMIT, "receiver stuck at {expect}");
        }
        (b, expect)
    });
    let mut a = sender.join().unwrap();
    let (mut b, got) = receiver.join().unwrap();
    let took = t0.elapsed();
    assert_eq!(got, STREAM, "{name}");
    // Exactly once: nothing more arrives, and the sender's last grants and
    // completions are taken without error.
    thread::sleep(Duration::from_millis(50));
    assert_eq!(
        b.recv(usize::MAX, |m| panic!("a duplicate: {m:?}"))
            .unwrap(),
        0,
        "{name}"
    );
    a.progress().unwrap();
    for q in [&a, &b] {
        assert_eq!(q.failure(), None, "{name}");
        assert_eq!(q.broken(), None, "{name}");
        assert_eq!(q.qp().state(), QpState::Rts, "{name}");
        assert!(
            q.qp().failure().is_none(),
            "{name}: no RNR (nor any) error: {:?}",
            q.qp().failure()
        );
    }
    let (sa, sb) = (a.stats(), b.stats());
    eprintln!(
        "{name}: with credits: {STREAM} messages in {took:?}; sender {sa:?}; receiver {sb:?}"
    );
    assert_eq!((sa.sent, sb.received), (STREAM, STREAM), "{name}");
    assert!(
        sa.no_credit > 0,
        "{name}: the sender was held back by credits: {sa:?}"
    );
    assert!(
        sb.credit_msgs_sent > 0,
        "{name}: a one-way stream returns credits explicitly: {sb:?}"
    );
    assert_eq!(sb.sent, 0, "{name}");
    assert_eq!(sb.credit_msgs_sent, sa.credit_msgs_received, "{name}");
    if let (Some(before), Some(after)) = (before, rnr_counters(&name)) {
        let d = after.since(before);
        eprintln!("{name}: kernel RNR counters moved by {d:?}");
        assert_eq!(d, RnrCounters::default(), "{name}: not one RNR NAK");
    }
}

#[test]
fn iwarp_is_refused_with_unsupported_on_siw() {
    let test = "iwarp_is_refused_with_unsupported_on_siw";
    let found = devices(test).into_iter().find(|(name, _)| !is_roce(name));
    let Some((name, ip)) = found else {
        assert!(!in_vm(), "{test}: no iWARP device (SIW_DEV) inside the VM");
        return;
    };
    let (dev, pd, (mut a, mut cq_a), (mut b, mut cq_b), _conns) = connected(&name, ip);
    assert_eq!(dev.backend().port().transport, Transport::Iwarp, "{name}");
    let cfg = credit_cfg();
    // `check` refuses without taking the QP...
    assert_eq!(CreditQp::check(&a, &cfg), Err(Error::Unsupported), "{name}");
    assert_eq!(CreditQp::check(&b, &cfg), Err(Error::Unsupported), "{name}");
    // ...which is still connected and carries plain SENDs.
    let dst = pd.register(MSG_MAX, Access::LOCAL_WRITE).unwrap();
    let mut src = pd.register(MSG_MAX, Access::NONE).unwrap();
    let mut buf = [0u8; MSG_MAX];
    let len = message(7, &mut buf);
    src.as_mut_slice()[..len].copy_from_slice(&buf[..len]);
    b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[dst.sge(0, MSG_MAX as u32)],
    }])
    .unwrap();
    a.post_send_one(&SendWr::new(
        2,
        SendOp::Send,
        &[src.sge(0, len as u32)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    let w = wait(&mut cq_a, &mut a, 1);
    assert_eq!(w[0].status, WcStatus::SUCCESS, "{name}: {w:?}");
    let w = wait(&mut cq_b, &mut b, 1);
    assert_eq!(
        (w[0].status, w[0].byte_len),
        (WcStatus::SUCCESS, len as u32)
    );
    check(7, &dst.as_slice()[..len]);
    // `new` refuses too, with the same typed error (the QP and CQ are
    // dropped with it).
    assert_eq!(
        CreditQp::new(&pd, a, cq_a, &cfg).err(),
        Some(Error::Unsupported),
        "{name}"
    );
}
