//! The cross-process fabric's acknowledgement timer when the requester
//! itself was off the CPU (docs/spec/fabric.md §5): the pause must not
//! count as the peer's silence. In a test binary of its own: it pauses a
//! step-mode device and a stopped peer for 600 ms, and run beside the
//! other fabric tests (tests/fabric.rs) that pause disturbed their
//! timing-bound checks.

#[path = "support/fabric_peer.rs"]
mod fabric_peer;

use std::time::{Duration, Instant};

use fabric_peer::*;
use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Remote, SendOp};

/// Entry point of the child processes (a no-op in the parent's run).
#[test]
fn fabric_child() {
    if let Ok(role) = std::env::var("RDD_FABRIC_ROLE") {
        run_child(&role);
    }
}

#[test]
fn a_requester_paused_with_its_peer_does_not_time_out() {
    // The requester's device in step mode: it runs only when stepped, as
    // a device thread runs only when scheduled. 4.096 µs · 2^14 = 67 ms
    // per try, 2 tries: about 134 ms.
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let mut s = Side { dev, pd, cq, qp };
    let attr = ConnectAttr {
        timeout: 14,
        retry_cnt: 1,
        ..Default::default()
    };
    let mut p = Peer::spawn("target", &[]);
    let theirs = parse_info(&p.expect("info"));
    let mr = p.expect("mr");
    let remote = Remote::new(mr[0].parse().unwrap(), mr[1].parse().unwrap());
    s.qp.connect(&theirs, &attr).unwrap();
    p.say(&info_line(&s.qp.info()));
    p.expect("ready");
    let buf = s.pd.register(64, Access::LOCAL_WRITE).unwrap();
    // SAFETY: stopping our own child process.
    assert_eq!(unsafe { libc::kill(p.proc.id() as i32, libc::SIGSTOP) }, 0);
    p.wait_stopped();
    post(&mut s, 1, SendOp::Read { remote }, &[buf.sge(0, 64)], SIG);
    for _ in 0..4 {
        s.dev.backend().step();
    }
    // Both sides off the CPU for four times the bound, as on a machine
    // that paused or ran other work; then the requester runs first (one
    // pass while the peer is still stopped: the pause must not count as
    // the peer's silence), and the peer after it.
    std::thread::sleep(Duration::from_millis(600));
    s.dev.backend().step();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(p.proc.id() as i32, libc::SIGCONT) }, 0);
    let mut wc = [Wc::default(); 1];
    let t = Instant::now();
    loop {
        s.dev.backend().step();
        if s.cq.poll(&mut s.qp, &mut wc).unwrap() == 1 {
            break;
        }
        assert!(t.elapsed() < BOUND, "no completion");
    }
    // The pause was not the peer's silence: the READ completes.
    assert_eq!(wc[0].status, WcStatus::SUCCESS, "{:?}", wc[0]);
    p.say("quit");
}
