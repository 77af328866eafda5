//! rdma-direct's own data paths on the kernel's rxe and siw devices:
//! our WQEs in rings we created and mapped, consumed by the
//! kernel. Runs in the test VM (`scripts/vm-test.sh`); on a host without
//! RDMA devices every test prints that it did not run (a missing device
//! inside the VM is a failure). `tests/verbs_device.rs` runs every opcode
//! on both data paths; this file covers what is specific to the direct
//! rings:
//! - ring wrap-around, many times over, for sends and for receives;
//! - a direct QP talking to a QP libibverbs' own provider drives, in both
//!   directions (the wire format checked against rdma-core's provider);
//! - a destroyed peer: every outstanding WR accounted for once;
//! - a model-based random workload that accounts for every WR exactly once;
//! - at most one doorbell system call per batch of 32 WQEs;
//! - deferred doorbells (`direct_defer`): one system call per ring, none
//!   per deferred post, and recovery with deferred WRs pending.
#![cfg(feature = "verbs")]

mod common;
mod direct_defer;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use rdma_direct::api::{Access, Backend, Cq, Device, Mr, Qp, QpInit, Transport, Wc, WcStatus};
use rdma_direct::verbs::{DataPath, VerbsConfig, VerbsDevice};
use rdma_direct::{RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

/// Opens `name` on the given data path.
fn open(name: &str, path: DataPath) -> Device<Dev> {
    let d = VerbsDevice::open(&VerbsConfig {
        device: Some(name.into()),
        data_path: path,
        ..VerbsConfig::default()
    })
    .expect("open device");
    assert_eq!(d.data_path(), path, "{name}");
    Device::new(d)
}

/// Small rings, so that a few hundred WRs wrap them many times.
const SMALL: QpInit = QpInit {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 2,
    max_recv_sge: 2,
    max_inline_data: 64,
    srq: None,
};

fn fill(m: &mut Mr<Dev>, seed: u8) {
    for (i, b) in m.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add((i * 13) as u8);
    }
}

/// Polls until `n` completions arrived; all must be successes.
#[track_caller]
fn wait_ok(cq: &mut Cq<Dev>, qp: &mut Qp<Dev>, n: usize) -> Vec<Wc> {
    let w = wait(cq, qp, n);
    for c in &w {
        assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
    }
    w
}

#[test]
fn rings_wrap_many_times() {
    for (name, ip) in devices("rings_wrap_many_times") {
        let dev = open(&name, DataPath::Direct);
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(64).unwrap();
        let mut cq_b = dev.create_cq(64).unwrap();
        let mut a = pd.create_qp(&cq_a, &cq_a, &SMALL).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, &SMALL).unwrap();
        let _conns = connect_qps(&mut a, &mut b, &dev, ip, false, &|_, _| {});
        let (sq_cap, rq_cap) = (a.send_space(), SMALL.max_recv_wr);
        assert!(sq_cap >= 16, "{name}: {sq_cap}");
        let mut src = pd.register(1 << 16, Access::LOCAL_WRITE).unwrap();
        let dst = pd.register(1 << 16, ALL_REMOTE).unwrap();
        fill(&mut src, 3);

        // WRITEs: 20 times the send ring, in batches of 8, every 4th
        // signaled (the rest retired by later completions), 64 bytes each
        // from two SGEs to a different place every time.
        let total = 20 * sq_cap as u64;
        let mut posted = 0u64;
        let mut signaled_seen = 0u64;
        let t0 = Instant::now();
        let mut out = [Wc::default(); 16];
        while posted < total || a.outstanding() != 0 {
            if posted < total {
                let n = (total - posted).min(8);
                let sges: Vec<[Sge; 2]> = (posted..posted + n)
                    .map(|i| {
                        let o = (i as usize * 64) % (1 << 16);
                        [src.sge(o, 40), src.sge((o + 40) % (1 << 16), 24)]
                    })
                    .collect();
                let wrs: Vec<SendWr> = (posted..posted + n)
                    .zip(&sges)
                    .map(|(i, s)| {
                        let o = (i as usize * 64) % (1 << 16);
                        let flags = if i % 4 == 3 || i + 1 == total {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::NONE
                        };
                        SendWr::new(
                            i,
                            SendOp::Write {
                                remote: dst.remote(o),
                            },
                            s,
                            flags,
                        )
                    })
                    .collect();
                match a.post_send(&wrs) {
                    Ok(()) => posted += n,
                    Err(e) => {
                        assert_eq!(e.error, rdma_direct::Error::SqFull, "{name}: {e:?}");
                        posted += e.index as u64;
                    }
                }
            }
            let k = cq_a.poll(&mut a, &mut out).unwrap();
            for w in &out[..k] {
                assert_eq!(w.status, WcStatus::SUCCESS, "{name}: {w:?}");
                assert!(w.wr_id % 4 == 3 || w.wr_id + 1 == total, "{name}: {w:?}");
                signaled_seen += 1;
            }
            assert!(t0.elapsed() < WAIT * 3, "{name}: stuck at {posted}");
        }
        assert_eq!(
            signaled_seen,
            total / 4 + u64::from(total % 4 != 0),
            "{name}"
        );
        // iWARP completes a WRITE once it is on the wire: wait for the data.
        let covered = (total as usize * 64).min(1 << 16);
        let t1 = Instant::now();
        while dst.as_slice()[..covered] != src.as_slice()[..covered] {
            assert!(t1.elapsed() < WAIT, "{name}: WRITE data");
            std::thread::sleep(Duration::from_millis(1));
        }

        // SEND/RECV: 12 times the receive ring; receives are reposted as
        // they complete, each checked for its data.
        let rounds = 12 * u64::from(rq_cap);
        let land = pd.register(64 * 16, Access::LOCAL_WRITE).unwrap();
        let slot = |i: u64| (i % 16) as usize * 64;
        let post_recv = |b: &mut Qp<Dev>, i: u64| {
            b.post_recv(&[RecvWr {
                wr_id: 1000 + i,
                sges: &[land.sge(slot(i), 64)],
            }])
            .unwrap();
        };
        for i in 0..u64::from(rq_cap) {
            post_recv(&mut b, i);
        }
        let mut next_recv = u64::from(rq_cap);
        for i in 0..rounds {
            let o = (i as usize * 64) % (1 << 16);
            a.post_send(&[SendWr::new(
                i,
                SendOp::Send,
                &[src.sge(o, 64)],
                SendFlags::SIGNALED,
            )])
            .unwrap();
            let w = wait_ok(&mut cq_b, &mut b, 1);
            assert_eq!((w[0].wr_id, w[0].byte_len), (1000 + i, 64), "{name}");
            assert_eq!(
                &land.as_slice()[slot(i)..slot(i) + 64],
                &src.as_slice()[o..o + 64],
                "{name}: receive {i}"
            );
            wait_ok(&mut cq_a, &mut a, 1);
            if next_recv < rounds {
                post_recv(&mut b, next_recv);
                next_recv += 1;
            }
        }
        assert_eq!(b.outstanding(), 0);
    }
}

#[test]
fn direct_qp_talks_to_a_libibverbs_qp_both_ways() {
    for (name, ip) in devices("direct_qp_talks_to_a_libibverbs_qp_both_ways") {
        let ddev = open(&name, DataPath::Direct);
        let pdev = open(&name, DataPath::Fallback);
        let (dpd, ppd) = (ddev.alloc_pd().unwrap(), pdev.alloc_pd().unwrap());
        let mut dcq = ddev.create_cq(64).unwrap();
        let mut pcq = pdev.create_cq(64).unwrap();
        let init = QpInit {
            max_send_wr: 32,
            max_recv_wr: 32,
            ..SMALL
        };
        let mut d = dpd.create_qp(&dcq, &dcq, &init).unwrap();
        let mut p = ppd.create_qp(&pcq, &pcq, &init).unwrap();
        let mut dsrc = dpd.register(4096, ALL_REMOTE).unwrap();
        let mut psrc = ppd.register(4096, ALL_REMOTE).unwrap();
        let dland = dpd.register(4096, ALL_REMOTE).unwrap();
        let pland = ppd.register(4096, ALL_REMOTE).unwrap();
        fill(&mut dsrc, 5);
        fill(&mut psrc, 9);
        // Receives before either side can send: 0 = direct side.
        let pre = |q: &mut Qp<Dev>, is_direct: bool| {
            let land = if is_direct { &dland } else { &pland };
            q.post_recv(&[RecvWr {
                wr_id: 77,
                sges: &[land.sge(0, 256)],
            }])
            .unwrap();
        };
        let _conns = connect_qps(&mut d, &mut p, &ddev, ip, false, &pre);

        exchange(
            &name,
            "direct -> libibverbs",
            (&mut d, &mut dcq, &dsrc),
            (&mut p, &mut pcq, &pland),
        );
        exchange(
            &name,
            "libibverbs -> direct",
            (&mut p, &mut pcq, &psrc),
            (&mut d, &mut dcq, &dland),
        );
        // The direct side's receive for the second direction was posted by
        // `pre`; both receives of each side were consumed.
        assert_eq!(d.outstanding(), 0, "{name}");
        assert_eq!(p.outstanding(), 0, "{name}");
    }
}

type Side<'a> = (&'a mut Qp<Dev>, &'a mut Cq<Dev>, &'a Mr<Dev>);

/// SEND (inline and SGE pieces) into the receive `pre` posted, WRITE (with
/// immediate data where the device has it), READ back, and FETCH_ADD where
/// the device has atomics, from `s` to `r`; data checked on both sides.
fn exchange(name: &str, dir: &str, s: Side<'_>, r: Side<'_>) {
    let (sq, scq, src) = s;
    let (rq, rcq, land) = r;
    let head = b"rdma-direct wire format";
    sq.post_send(&[SendWr::inline(
        1,
        SendOp::Send,
        &[&head[..], &src.as_slice()[..40]],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    wait_ok(scq, sq, 1);
    let w = wait_ok(rcq, rq, 1);
    assert_eq!(
        (w[0].wr_id, w[0].byte_len as usize),
        (77, head.len() + 40),
        "{name}: {dir}"
    );
    assert_eq!(&land.as_slice()[..head.len()], head, "{name}: {dir}");
    assert_eq!(
        &land.as_slice()[head.len()..head.len() + 40],
        &src.as_slice()[..40],
        "{name}: {dir}"
    );
    let iwarp = sq.backend().port().transport == Transport::Iwarp;
    let remote = Remote::new(land.addr() + 1024, land.rkey());
    if iwarp {
        sq.post_send(&[SendWr::new(
            2,
            SendOp::Write { remote },
            &[src.sge(100, 500)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        wait_ok(scq, sq, 1);
    } else {
        rq.post_recv(&[RecvWr {
            wr_id: 78,
            sges: &[land.sge(3500, 8)],
        }])
        .unwrap();
        sq.post_send(&[SendWr::new(
            2,
            SendOp::WriteImm {
                remote,
                imm: 0x1234_5678,
            },
            &[src.sge(100, 500)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        wait_ok(scq, sq, 1);
        let w = wait_ok(rcq, rq, 1);
        assert_eq!(
            (w[0].wr_id, w[0].imm_data),
            (78, 0x1234_5678),
            "{name}: {dir}"
        );
    }
    // iWARP completes a WRITE when it is handed to TCP: wait for the data.
    let t0 = Instant::now();
    while land.as_slice()[1024..1524] != src.as_slice()[100..600] {
        assert!(t0.elapsed() < WAIT, "{name}: {dir}: WRITE data");
        std::thread::yield_now();
    }
    let back = Remote::new(land.addr(), land.rkey());
    sq.post_send(&[SendWr::new(
        3,
        SendOp::Read { remote: back },
        &[src.sge(2048, 256)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    wait_ok(scq, sq, 1);
    assert_eq!(
        &src.as_slice()[2048..2048 + 256],
        &land.as_slice()[..256],
        "{name}: {dir}"
    );
    if sq.backend().caps().atomics && !iwarp {
        let counter = Remote::new(land.addr() + 3072, land.rkey());
        let before = u64::from_ne_bytes(land.as_slice()[3072..3080].try_into().unwrap());
        sq.post_send(&[SendWr::new(
            4,
            SendOp::FetchAdd {
                remote: counter,
                add: 5,
            },
            &[src.sge(3000, 8)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        wait_ok(scq, sq, 1);
        let after = u64::from_ne_bytes(land.as_slice()[3072..3080].try_into().unwrap());
        assert_eq!(after, before.wrapping_add(5), "{name}: {dir}");
        assert_eq!(
            u64::from_ne_bytes(src.as_slice()[3000..3008].try_into().unwrap()),
            before,
            "{name}: {dir}: FETCH_ADD's old value"
        );
    }
}

#[test]
fn a_destroyed_peer_fails_outstanding_work_once() {
    for (name, ip) in devices("a_destroyed_peer_fails_outstanding_work_once") {
        let dev = open(&name, DataPath::Direct);
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(64).unwrap();
        let cq_b = dev.create_cq(64).unwrap();
        let mut a = pd.create_qp(&cq_a, &cq_a, &SMALL).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, &SMALL).unwrap();
        // Few transport retries: rxe treats a retry count of 7 as
        // "forever" (rxe_comp.c), so the dead peer would never be noticed.
        let attr = rdma_direct::api::ConnectAttr {
            access: ALL_REMOTE,
            retry_cnt: 2,
            timeout: 12,
            ..rdma_direct::api::ConnectAttr::default()
        };
        let mut conns = connect_qps_with(&mut a, &mut b, &dev, ip, false, &|_, _| {}, &attr);
        let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let dst = pd.register(4096, ALL_REMOTE).unwrap();
        // The peer goes away: its rdma_cm connection (siw) and its QP.
        conns.truncate(1);
        drop(b);
        let sge = [src.sge(0, 8)];
        let wrs: Vec<SendWr> = (0..8u64)
            .map(|i| {
                SendWr::new(
                    i,
                    SendOp::Write {
                        remote: dst.remote(i as usize * 8),
                    },
                    &sge,
                    if i % 2 == 1 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                )
            })
            .collect();
        // On siw the connection may already be gone: posting then fails
        // with a typed error (`index` = WRs accepted), as good a signal as
        // an error completion.
        let (posted, post_failed) = match a.post_send(&wrs) {
            Ok(()) => (8, false),
            Err(e) => (e.index as u64, true),
        };
        // On iWARP the peer's disappearance is the TCP connection closing:
        // rdma_cm reports it on our connection, and the QP stops; the
        // application recovers it then (its WRs are flushed).
        let iwarp = dev.backend().port().transport == Transport::Iwarp;
        if iwarp && !post_failed {
            conns[0]
                .wait_disconnect(WAIT)
                .unwrap_or_else(|e| panic!("{name}: no disconnect: {e}"));
        }
        let mut seen: HashMap<u64, Vec<WcStatus>> = HashMap::new();
        let mut out = [Wc::default(); 16];
        let t0 = Instant::now();
        loop {
            let k = cq_a.poll(&mut a, &mut out).unwrap();
            for w in &out[..k] {
                seen.entry(w.wr_id).or_default().push(w.status);
            }
            let failed =
                iwarp || post_failed || seen.values().flatten().any(|s| *s != WcStatus::SUCCESS);
            if failed {
                // Recover: every outstanding WR is reported once.
                a.drain_and_reset(&mut cq_a, None, WAIT * 3, |w| {
                    seen.entry(w.wr_id).or_default().push(w.status)
                })
                .unwrap();
                break;
            }
            assert!(
                a.outstanding() != 0,
                "{name}: all WRs succeeded against a destroyed peer: {seen:?}"
            );
            assert!(t0.elapsed() < WAIT * 6, "{name}: no error: {seen:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        for (id, st) in &seen {
            assert_eq!(st.len(), 1, "{name}: wr {id} reported {st:?}");
            assert!(*id < posted, "{name}: refused wr {id} reported {st:?}");
        }
        // Each posted signaled WR is reported (success or error); each
        // unsignaled one only if it failed.
        for id in (1..posted).step_by(2) {
            assert!(seen.contains_key(&id), "{name}: wr {id} lost: {seen:?}");
        }
        assert_eq!(a.outstanding(), 0, "{name}");
    }
}

/// A deterministic generator (xorshift), so a failing run can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_workload_accounts_for_every_wr() {
    for (name, ip) in devices("random_workload_accounts_for_every_wr") {
        let dev = open(&name, DataPath::Direct);
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(128).unwrap();
        let mut cq_b = dev.create_cq(128).unwrap();
        let init = QpInit {
            max_send_wr: 32,
            max_recv_wr: 32,
            ..SMALL
        };
        let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
        let _conns = connect_qps(&mut a, &mut b, &dev, ip, false, &|_, _| {});
        let atomics =
            dev.backend().caps().atomics && dev.backend().port().transport != Transport::Iwarp;
        let mut src = pd.register(1 << 16, ALL_REMOTE).unwrap();
        let mut dst = pd.register(1 << 16, ALL_REMOTE).unwrap();
        let land = pd.register(1 << 16, Access::LOCAL_WRITE).unwrap();
        let rland = pd.register(1 << 16, Access::LOCAL_WRITE).unwrap();
        fill(&mut src, 7);
        fill(&mut dst, 11);
        let dst_start = dst.as_slice().to_vec();
        let seed = 0x5eed_0000 ^ u64::from(name.len() as u32);
        let mut rng = Rng(seed);
        // The model: what each WR is, and what the peer must see.
        #[derive(Clone, Copy, Debug)]
        enum Op {
            Write { off: usize, len: usize },
            Read,
            Send,
            FetchAdd,
        }
        let mut ops: HashMap<u64, (Op, bool)> = HashMap::new();
        let mut completed: HashMap<u64, u32> = HashMap::new();
        let mut recvs_done = 0u64;
        let mut recvs_posted = 0u64;
        let mut sends = 0u64;
        const TOTAL: u64 = 1500;
        let mut next = 0u64;
        let mut out = [Wc::default(); 32];
        let t0 = Instant::now();
        while next < TOTAL || a.outstanding() != 0 {
            // Keep receives ahead of the SENDs.
            while recvs_posted < recvs_done + 16 {
                let o = (recvs_posted % 64) as usize * 512;
                b.post_recv(&[RecvWr {
                    wr_id: recvs_posted,
                    sges: &[land.sge(o, 512)],
                }])
                .unwrap();
                recvs_posted += 1;
            }
            if next < TOTAL {
                let n = 1 + rng.below(12);
                let mut wrs = Vec::new();
                let mut sge_store: Vec<[Sge; 1]> = Vec::new();
                let mut plan = Vec::new();
                let mut planned_sends = 0u64;
                for k in 0..n {
                    let id = next + k;
                    if id >= TOTAL {
                        break;
                    }
                    let pick = rng.below(if atomics { 4 } else { 3 });
                    let op = match pick {
                        0 => Op::Write {
                            off: rng.below(56_000) as usize,
                            len: 1 + rng.below(4000) as usize,
                        },
                        1 => Op::Read,
                        // A SEND only with a receive waiting for it.
                        2 if sends + planned_sends < recvs_posted => {
                            planned_sends += 1;
                            Op::Send
                        }
                        2 => Op::Write { off: 0, len: 8 },
                        _ => Op::FetchAdd,
                    };
                    let signaled = rng.below(3) == 0 || id + 1 == TOTAL;
                    plan.push((id, op, signaled));
                }
                for (id, op, _) in &plan {
                    let s = match op {
                        Op::Write { off, len } => src.sge(*off, *len as u32),
                        Op::Read => rland.sge((*id as usize % 64) * 64, 64),
                        Op::Send => src.sge((*id as usize % 100) * 64, 300),
                        Op::FetchAdd => src.sge(64_000 + (*id as usize % 32) * 8, 8),
                    };
                    sge_store.push([s]);
                }
                for ((id, op, signaled), s) in plan.iter().zip(&sge_store) {
                    let flags = if *signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    };
                    let sop = match op {
                        Op::Write { off, .. } => SendOp::Write {
                            remote: dst.remote(*off),
                        },
                        Op::Read => SendOp::Read {
                            remote: dst.remote(20_000),
                        },
                        Op::Send => SendOp::Send,
                        Op::FetchAdd => SendOp::FetchAdd {
                            remote: dst.remote(62_000),
                            add: 1,
                        },
                    };
                    wrs.push(SendWr::new(*id, sop, s, flags));
                }
                let accepted = match a.post_send(&wrs) {
                    Ok(()) => wrs.len(),
                    Err(e) => {
                        assert_eq!(e.error, rdma_direct::Error::SqFull, "{name}: {e:?}");
                        e.index
                    }
                };
                for (id, op, signaled) in &plan[..accepted] {
                    ops.insert(*id, (*op, *signaled));
                    if matches!(op, Op::Send) {
                        sends += 1;
                    }
                }
                next += accepted as u64;
            }
            let k = cq_a.poll(&mut a, &mut out).unwrap();
            for w in &out[..k] {
                assert_eq!(
                    w.status,
                    WcStatus::SUCCESS,
                    "{name} (seed {seed:#x}): {w:?}"
                );
                let (_, signaled) = ops.get(&w.wr_id).copied().expect("a posted WR");
                assert!(signaled, "{name}: an unsignaled WR was reported: {w:?}");
                *completed.entry(w.wr_id).or_default() += 1;
            }
            let k = cq_b.poll(&mut b, &mut out).unwrap();
            for w in &out[..k] {
                assert_eq!(w.status, WcStatus::SUCCESS, "{name}: {w:?}");
                assert_eq!(w.wr_id, recvs_done, "{name}: receives complete in order");
                recvs_done += 1;
            }
            assert!(t0.elapsed() < WAIT * 6, "{name}: stuck at {next}");
        }
        // Every signaled WR exactly once, every unsignaled one never.
        for (id, (_, signaled)) in &ops {
            let n = completed.get(id).copied().unwrap_or(0);
            assert_eq!(n, u32::from(*signaled), "{name}: wr {id}");
        }
        assert_eq!(ops.len() as u64, TOTAL);
        // Receives: one per SEND, in order, none lost.
        let t1 = Instant::now();
        while recvs_done < sends {
            let k = cq_b.poll(&mut b, &mut out).unwrap();
            recvs_done += k as u64;
            assert!(t1.elapsed() < WAIT, "{name}: receives");
        }
        assert_eq!(recvs_done, sends, "{name}");
        // The WRITEs land in posting order (one RC QP): replay them.
        let mut model = dst_start;
        let mut ids: Vec<_> = ops.keys().copied().collect();
        ids.sort();
        for id in ids {
            if let (Op::Write { off, len }, _) = ops[&id] {
                model[off..off + len].copy_from_slice(&src.as_slice()[off..off + len]);
            }
        }
        // The counter the FETCH_ADDs hit is the only other change.
        let counter = 62_000;
        let adds = ops
            .values()
            .filter(|(o, _)| matches!(o, Op::FetchAdd))
            .count() as u64;
        let before = u64::from_ne_bytes(model[counter..counter + 8].try_into().unwrap());
        model[counter..counter + 8].copy_from_slice(&before.wrapping_add(adds).to_ne_bytes());
        assert!(
            dst.as_slice() == &model[..],
            "{name}: target memory differs from the model"
        );
    }
}

/// Reads this process's count of write() system calls (`syscw` in
/// /proc/self/io).
fn write_syscalls() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    s.lines()
        .find_map(|l| l.strip_prefix("syscw: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("syscw")
}

#[test]
fn one_doorbell_per_batch_of_32() {
    for (name, ip) in devices("one_doorbell_per_batch_of_32") {
        let dev = open(&name, DataPath::Direct);
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(256).unwrap();
        let cq_b = dev.create_cq(256).unwrap();
        let init = QpInit {
            max_send_wr: 128,
            ..SMALL
        };
        let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
        let _conns = connect_qps(&mut a, &mut b, &dev, ip, false, &|_, _| {});
        let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let dst = pd.register(4096, ALL_REMOTE).unwrap();
        let sge = [src.sge(0, 8)];
        const BATCHES: u64 = 64;
        let mut out = [Wc::default(); 32];
        let before = write_syscalls();
        for batch in 0..BATCHES {
            let wrs: Vec<SendWr> = (0..32u64)
                .map(|i| {
                    SendWr::new(
                        batch * 32 + i,
                        SendOp::Write {
                            remote: dst.remote(((i * 8) % 4096) as usize),
                        },
                        &sge,
                        if i == 31 {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::NONE
                        },
                    )
                })
                .collect();
            a.post_send(&wrs).unwrap();
            // Wait for the batch (the window is 128 WRs).
            let t0 = Instant::now();
            let mut got = 0;
            while got == 0 {
                got = cq_a.poll(&mut a, &mut out).unwrap();
                assert!(t0.elapsed() < WAIT, "{name}: batch {batch}");
            }
            assert_eq!(out[0].wr_id, batch * 32 + 31);
        }
        let calls = write_syscalls() - before;
        let wrs = BATCHES * 32;
        eprintln!(
            "{name}: {calls} write() calls for {wrs} WRs ({:.4} per WR)",
            calls as f64 / wrs as f64
        );
        // At most one doorbell per batch of 32 (siw rings only when its TX
        // engine may be idle, so often fewer).
        assert!(
            calls <= BATCHES,
            "{name}: {calls} write() calls for {BATCHES} batches"
        );
        assert!(calls >= 1 || dev.backend().port().transport == Transport::Iwarp);
    }
}

/// `Device::cq_depth_for` knows how the kernel rounds rxe and siw rings, so
/// a CQ sized with it passes the sizing guard for any queue sizes (the
/// examples size their CQs this way).
#[test]
fn cq_depth_for_matches_the_kernel_rings() {
    for (name, _ip) in devices("cq_depth_for_matches_the_kernel_rings") {
        let dev = open(&name, DataPath::Direct);
        let pd = dev.alloc_pd().unwrap();
        for (s, r) in [(1, 500), (64, 64), (100, 3), (128, 1)] {
            let init = QpInit {
                max_send_wr: s,
                max_recv_wr: r,
                ..SMALL
            };
            let depth = dev.cq_depth_for(&[&init]);
            let cq = dev.create_cq(depth).unwrap();
            let qp = pd.create_qp(&cq, &cq, &init).unwrap_or_else(|e| {
                panic!("{name}: {s}/{r} on a CQ of {depth} ({}): {e}", cq.depth())
            });
            assert!(qp.send_space() >= s, "{name}: {s}/{r}");
            let c = cq.committed();
            assert!(
                c >= u64::from(s + r) && c <= u64::from(cq.depth()),
                "{name}: {c}"
            );
        }
    }
}
