//! The cross-process software fabric (docs/spec/fabric.md): RC QPs of
//! software devices in different processes, every RC operation across
//! the process boundary, exact atomics from several processes at once,
//! forged and stale keys refused by the owner, and a peer that dies, is
//! stopped or has no receive posted failing the requester's work within
//! its bound, after which a new peer process connects again.

#[path = "support/fabric_peer.rs"]
mod fabric_peer;

use std::time::{Duration, Instant};

use fabric_peer::*;
use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Remote, SendFlags, SendOp, SendWr};

/// Entry point of the child processes (a no-op in the parent's run).
#[test]
fn fabric_child() {
    if let Ok(role) = std::env::var("RDD_FABRIC_ROLE") {
        run_child(&role);
    }
}

fn side() -> Side {
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    Side { dev, pd, cq, qp }
}

/// Connects `s.qp` to a new target child; returns it and its region.
fn connect_target(s: &mut Side, env: &[(&str, &str)], attr: &ConnectAttr) -> (Peer, Remote) {
    let mut p = Peer::spawn("target", env);
    let theirs = parse_info(&p.expect("info"));
    let mr = p.expect("mr");
    let remote = Remote::new(mr[0].parse().unwrap(), mr[1].parse().unwrap());
    s.qp.connect(&theirs, attr).unwrap();
    p.say(&info_line(&s.qp.info()));
    p.expect("ready");
    (p, remote)
}

fn wait_wc(s: &mut Side, within: Duration) -> Wc {
    let mut wc = [Wc::default(); 1];
    let t = Instant::now();
    loop {
        if s.cq.poll(&mut s.qp, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(t.elapsed() < within, "no completion within {within:?}");
        std::hint::spin_loop();
    }
}

#[test]
fn every_rc_operation_crosses_the_process_boundary() {
    let mut s = side();
    let (mut p, remote) = connect_target(&mut s, &[], &ConnectAttr::default());
    let at = |off: usize| Remote::new(remote.addr + off as u64, remote.rkey);
    let mut src = s.pd.register(1 << 20, Access::NONE).unwrap();
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 13 + 5) as u8;
    }
    let dst = s.pd.register(1 << 20, Access::LOCAL_WRITE).unwrap();

    // A WRITE of many packets at an odd address, read back whole.
    let n = 1_000_001;
    post(
        &mut s,
        1,
        SendOp::Write { remote: at(1) },
        &[src.sge(0, n)],
        SIG,
    );
    let w = wait_wc(&mut s, BOUND);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, WcStatus::SUCCESS, WcOpcode::RDMA_WRITE)
    );
    post(
        &mut s,
        2,
        SendOp::Read { remote: at(1) },
        &[dst.sge(0, n)],
        SIG,
    );
    let w = wait_wc(&mut s, BOUND);
    assert_eq!((w.wr_id, w.status, w.byte_len), (2, WcStatus::SUCCESS, n));
    assert_eq!(dst.as_slice()[..n as usize], src.as_slice()[..n as usize]);

    // A READ of memory the peer initialised, into two SGEs.
    post(
        &mut s,
        3,
        SendOp::Read {
            remote: at(1_500_000),
        },
        &[dst.sge(0, 3000), dst.sge(10_000, 2000)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    let want: Vec<u8> = (1_500_000..1_505_000).map(pattern).collect();
    assert_eq!(dst.as_slice()[..3000], want[..3000]);
    assert_eq!(dst.as_slice()[10_000..12_000], want[3000..]);

    // SENDs: several packets, with immediate data, and empty.
    let qpn = s.qp.info().qpn;
    post(&mut s, 4, SendOp::Send, &[src.sge(7, 100_000)], SIG);
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    let w = p.expect("wc");
    assert_eq!(w[1..6], ["0", "128", "100000", "0", &qpn.to_string()]);
    assert_eq!(w[6], fnv(&src.as_slice()[7..100_007]).to_string());
    post(
        &mut s,
        5,
        SendOp::SendImm { imm: 0xabcdef },
        &[src.sge(0, 10)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    let w = p.expect("wc");
    assert_eq!(w[1..5], ["0", "128", "10", &0xabcdefu32.to_string()]);
    post(&mut s, 6, SendOp::Send, &[], SIG);
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    assert_eq!(p.expect("wc")[1..4], ["0", "128", "0"]);

    // WRITE_WITH_IMM: data placed, and a receive consumed with the
    // immediate.
    post(
        &mut s,
        7,
        SendOp::WriteImm {
            remote: at(1_600_000),
            imm: 77,
        },
        &[src.sge(100, 5000)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    assert_eq!(p.expect("wc")[1..5], ["0", "129", "5000", "77"]);
    post(
        &mut s,
        8,
        SendOp::Read {
            remote: at(1_600_000),
        },
        &[dst.sge(0, 5000)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    assert_eq!(dst.as_slice()[..5000], src.as_slice()[100..5100]);

    // Atomics on the peer's memory.
    let word = TARGET_BYTES - 8;
    let before = u64::from_ne_bytes(core::array::from_fn(|i| pattern(word + i)));
    let olds = s.pd.register(8 * 16, Access::LOCAL_WRITE).unwrap();
    post(
        &mut s,
        9,
        SendOp::CompareSwap {
            remote: at(word),
            compare: before,
            swap: 1000,
        },
        &[olds.sge(0, 8)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    assert_eq!(olds.load_u64(0), Some(before));
    for i in 0..10u64 {
        post(
            &mut s,
            10 + i,
            SendOp::FetchAdd {
                remote: at(word),
                add: 5,
            },
            &[olds.sge(8, 8)],
            SIG,
        );
        let w = wait_wc(&mut s, BOUND);
        assert_eq!(
            (w.status, w.opcode),
            (WcStatus::SUCCESS, WcOpcode::FETCH_ADD)
        );
        assert_eq!(olds.load_u64(8), Some(1000 + 5 * i));
    }
    post(
        &mut s,
        20,
        SendOp::CompareSwap {
            remote: at(word),
            compare: 1,
            swap: 2,
        },
        &[olds.sge(0, 8)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    assert_eq!(
        olds.load_u64(0),
        Some(1050),
        "a failed compare leaves the word"
    );

    // Many unsignaled WRITEs with a signaled one every 50: in order, the
    // signaled ones only.
    for i in 0..500u64 {
        let flags = if i % 50 == 49 { SIG } else { SendFlags::NONE };
        loop {
            match s.qp.post_send_one(&SendWr::new(
                100 + i,
                SendOp::Write {
                    remote: at(64 * i as usize),
                },
                &[src.sge(0, 64)],
                flags,
            )) {
                Ok(()) => break,
                Err(rdma_direct::Error::SqFull) => {
                    let w = wait_wc(&mut s, BOUND);
                    assert_eq!(w.status, WcStatus::SUCCESS);
                    assert_eq!(w.wr_id % 50, 49);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    let mut last = 0;
    while last != 599 {
        let w = wait_wc(&mut s, BOUND);
        assert_eq!(w.status, WcStatus::SUCCESS);
        assert!(
            w.wr_id > last && w.wr_id % 50 == 49,
            "{} after {last}",
            w.wr_id
        );
        last = w.wr_id;
    }
    p.say("quit");
    assert!(p.proc.wait().unwrap().success());
    drop(s);
}

#[test]
fn atomics_from_several_processes_are_exact() {
    const PEERS: usize = 3;
    const ADDS: u64 = 1500;
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let counter = pd
        .register(8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
        .unwrap();
    let mut keep = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..PEERS {
        let cq = dev.create_cq(256).unwrap();
        let mut qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
        let mut p = Peer::spawn("adder", &[("RDD_FABRIC_ADDS", &ADDS.to_string())]);
        let theirs = parse_info(&p.expect("info"));
        let attr = ConnectAttr {
            access: Access::REMOTE_ATOMIC,
            ..Default::default()
        };
        qp.connect(&theirs, &attr).unwrap();
        p.say(&info_line(&qp.info()));
        p.say(&format!("mr {} {}", counter.addr(), counter.rkey()));
        p.expect("ready");
        keep.push((qp, cq));
        peers.push(p);
    }
    for p in &mut peers {
        p.say("go");
    }
    // This process adds too, with CPU atomics on the same word.
    // SAFETY: the region is 8 bytes, page-aligned, alive for the test.
    let cell = unsafe { core::sync::atomic::AtomicU64::from_ptr(counter.addr() as *mut u64) };
    let mut all: Vec<u64> = (0..ADDS)
        .map(|_| cell.fetch_add(1, core::sync::atomic::Ordering::SeqCst))
        .collect();
    for p in &mut peers {
        let olds: Vec<u64> = p
            .expect("olds")
            .iter()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(olds.len() as u64, ADDS);
        assert!(
            olds.windows(2).all(|w| w[0] < w[1]),
            "one peer's adds are ordered"
        );
        all.extend(olds);
        p.say("quit");
    }
    all.sort_unstable();
    let n = (PEERS as u64 + 1) * ADDS;
    assert_eq!(
        all,
        (0..n).collect::<Vec<_>>(),
        "every add saw a distinct value"
    );
    assert_eq!(counter.load_u64(0), Some(n));
    drop(keep);
}

#[test]
fn forged_and_stale_keys_are_refused_by_the_owner() {
    let mut s = side();
    let (p, remote) = connect_target(&mut s, &[], &ConnectAttr::default());
    let src = s.pd.register(64, Access::NONE).unwrap();
    let forged = Remote::new(remote.addr, remote.rkey ^ 0x100);
    post(
        &mut s,
        1,
        SendOp::Write { remote: forged },
        &[src.sge(0, 8)],
        SIG,
    );
    let w = wait_wc(&mut s, BOUND);
    assert_eq!((w.wr_id, w.status), (1, WcStatus::REM_ACCESS_ERR));
    assert!(p.expect("event")[0].starts_with("QpAccessError"));
    // Out of bounds of a real key.
    let mut s2 = side();
    let (mut p2, remote2) = connect_target(&mut s2, &[], &ConnectAttr::default());
    let src2 = s2.pd.register(64, Access::NONE).unwrap();
    let past = Remote::new(remote2.addr + TARGET_BYTES as u64 - 4, remote2.rkey);
    post(
        &mut s2,
        2,
        SendOp::Write { remote: past },
        &[src2.sge(0, 8)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s2, BOUND).status, WcStatus::REM_ACCESS_ERR);
    // A key the owner deregistered.
    let mut s3 = side();
    let (mut p3, remote3) = connect_target(&mut s3, &[], &ConnectAttr::default());
    p3.say("dereg");
    p3.expect("dereg");
    let src3 = s3.pd.register(64, Access::NONE).unwrap();
    post(
        &mut s3,
        3,
        SendOp::Read { remote: remote3 },
        &[src3.sge(0, 8)],
        SIG,
    );
    // The READ's target is LOCAL_WRITE-less: refused locally first.
    assert_eq!(wait_wc(&mut s3, BOUND).status, WcStatus::LOC_PROT_ERR);
    let mut s4 = side();
    let (mut p4, remote4) = connect_target(&mut s4, &[], &ConnectAttr::default());
    p4.say("dereg");
    p4.expect("dereg");
    let dst4 = s4.pd.register(64, Access::LOCAL_WRITE).unwrap();
    post(
        &mut s4,
        4,
        SendOp::Read { remote: remote4 },
        &[dst4.sge(0, 8)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s4, BOUND).status, WcStatus::REM_ACCESS_ERR);
    for p in [&mut p2, &mut p3, &mut p4] {
        p.say("quit");
    }
    drop(p);
}

#[test]
fn a_killed_peer_fails_outstanding_work_and_a_new_one_connects() {
    let mut s = side();
    // No acknowledgement timer (timeout 0, as on IB): only the liveness
    // check can end the wait.
    let attr = ConnectAttr {
        rnr_retry: 7,
        timeout: 0,
        ..Default::default()
    };
    let (mut p, remote) = connect_target(&mut s, &[("RDD_FABRIC_NORECV", "1")], &attr);
    let buf = s.pd.register(1 << 20, Access::LOCAL_WRITE).unwrap();
    // The SEND waits for a receive that never comes; the READ behind it.
    post(&mut s, 1, SendOp::Send, &[buf.sge(0, 100)], SIG);
    post(
        &mut s,
        2,
        SendOp::Read { remote },
        &[buf.sge(4096, 1 << 19)],
        SIG,
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut wc = [Wc::default(); 2];
    assert_eq!(
        s.cq.poll(&mut s.qp, &mut wc).unwrap(),
        0,
        "nothing completes while the peer waits"
    );
    p.proc.kill().unwrap();
    let t = Instant::now();
    let w1 = wait_wc(&mut s, Duration::from_secs(2));
    let w2 = wait_wc(&mut s, Duration::from_secs(2));
    let took = t.elapsed();
    assert_eq!((w1.wr_id, w1.status), (1, WcStatus::RETRY_EXC_ERR));
    assert_eq!((w2.wr_id, w2.status), (2, WcStatus::WR_FLUSH_ERR));
    assert!(
        took < Duration::from_secs(1),
        "the death was noticed after {took:?}"
    );
    let _ = p.proc.wait();

    // A new peer process, a new QP: traffic flows again.
    let cq = s.dev.create_cq(1024).unwrap();
    let qp = s.pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let old = std::mem::replace(&mut s.qp, qp);
    let old_cq = std::mem::replace(&mut s.cq, cq);
    drop((old, old_cq));
    let (mut p2, remote2) = connect_target(&mut s, &[], &ConnectAttr::default());
    post(
        &mut s,
        3,
        SendOp::Read { remote: remote2 },
        &[buf.sge(0, 4096)],
        SIG,
    );
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::SUCCESS);
    assert!(buf.as_slice()[..4096]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(i)));
    p2.say("quit");
}

#[test]
fn a_stopped_peer_runs_out_the_ack_timer() {
    let mut s = side();
    // 4.096 µs · 2^12 = 16.8 ms per try, 2 tries: about 34 ms.
    let attr = ConnectAttr {
        timeout: 12,
        retry_cnt: 1,
        ..Default::default()
    };
    let (p, remote) = connect_target(&mut s, &[], &attr);
    let buf = s.pd.register(64, Access::LOCAL_WRITE).unwrap();
    // SAFETY: stopping our own child process.
    assert_eq!(unsafe { libc::kill(p.proc.id() as i32, libc::SIGSTOP) }, 0);
    // The stop takes effect asynchronously: wait until it has.
    p.wait_stopped();
    let t = Instant::now();
    post(&mut s, 1, SendOp::Read { remote }, &[buf.sge(0, 64)], SIG);
    let w = wait_wc(&mut s, Duration::from_secs(2));
    assert_eq!(w.status, WcStatus::RETRY_EXC_ERR);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(30) && took < Duration::from_secs(1),
        "{took:?}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(p.proc.id() as i32, libc::SIGCONT) };
}

#[test]
fn rnr_retries_run_out_across_processes() {
    let mut s = side();
    let attr = ConnectAttr {
        rnr_retry: 2,
        ..Default::default()
    };
    let (mut p, _) = connect_target(&mut s, &[("RDD_FABRIC_NORECV", "1")], &attr);
    let buf = s.pd.register(64, Access::NONE).unwrap();
    post(&mut s, 1, SendOp::Send, &[buf.sge(0, 8)], SIG);
    post(&mut s, 2, SendOp::Send, &[buf.sge(0, 8)], SIG);
    let w = wait_wc(&mut s, BOUND);
    assert_eq!((w.wr_id, w.status), (1, WcStatus::RNR_RETRY_EXC_ERR));
    assert_eq!(wait_wc(&mut s, BOUND).status, WcStatus::WR_FLUSH_ERR);
    p.say("quit");
}

#[test]
fn two_qps_feed_one_srq_in_another_process() {
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let mut qps: Vec<Qp<SoftDevice>> = (0..2)
        .map(|_| pd.create_qp(&cq, &cq, &QpInit::default()).unwrap())
        .collect();
    let mut p = Peer::spawn("srq_target", &[]);
    let theirs: Vec<QpInfo> = (0..2).map(|_| parse_info(&p.expect("info"))).collect();
    for (q, t) in qps.iter_mut().zip(&theirs) {
        q.connect(t, &ConnectAttr::default()).unwrap();
        p.say(&info_line(&q.info()));
    }
    p.expect("ready");
    let mut src = pd.register(64 * 1024, Access::NONE).unwrap();
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    // Three SENDs from each QP, of sizes across the packet boundary.
    let sizes = [100usize, 20_000, 40_000];
    let mut want = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        for (i, q) in qps.iter_mut().enumerate() {
            let off = 1000 * (k + i);
            q.post_send_one(&SendWr::new(
                0,
                SendOp::Send,
                &[src.sge(off, n as u32)],
                SIG,
            ))
            .unwrap();
            want.push((
                theirs[i].qpn,
                q.info().qpn,
                n,
                fnv(&src.as_slice()[off..off + n]),
            ));
        }
    }
    let mut wc = [Wc::default(); 8];
    let mut done = 0;
    let t = Instant::now();
    while done < want.len() {
        let mut refs: Vec<&mut Qp<SoftDevice>> = qps.iter_mut().collect();
        let n = cq.poll(&mut refs[..], &mut wc).unwrap();
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::SUCCESS);
            done += 1;
        }
        assert!(t.elapsed() < BOUND, "sends stuck at {done}");
    }
    let mut got: Vec<(u32, u32, usize, u64)> = (0..want.len())
        .map(|_| {
            let w = p.expect("wc");
            assert_eq!(w[1], "0", "receive status");
            (
                w[3].parse().unwrap(),
                w[4].parse().unwrap(),
                w[2].parse().unwrap(),
                w[5].parse().unwrap(),
            )
        })
        .collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(
        got, want,
        "every SEND received once, on its QP, with its bytes"
    );
    p.say("quit");
}
