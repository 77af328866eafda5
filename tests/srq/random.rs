//! 64 RC QPs on one SRQ under a seeded random workload (SEND, SEND with
//! immediate, RDMA WRITE with immediate, receives posted in random
//! batches, the device stepped a random number of passes) with faults
//! injected mid-run: a bad rkey and a SEND too long for its receive (the
//! responder fails), a responder moved to ERROR by hand, and an injected
//! requester failure. Every receive posted to the SRQ must complete
//! exactly once, on the QP whose sender's data it holds, none is flushed
//! by a failing QP, and at the end the SRQ's free list has every WQE back.

use std::collections::HashMap;

use rdma_direct::api::*;
use rdma_direct::provider::mlx5::cq::syndrome;
use rdma_direct::soft::Fault;
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

use super::rig::*;

const PAIRS: usize = 64;
/// Bytes per receive buffer.
const SLOT: usize = 64;
/// Sends a requester keeps outstanding at most (its SQ holds 16).
const MAX_OUT: u32 = 12;
/// Pairs the faults may end.
const MAX_DEAD: usize = 12;

struct Model {
    /// Posted SRQ receives not yet completed: wr_id -> buffer slot.
    posted: HashMap<u64, usize>,
    /// wr_ids completed (to catch a second completion).
    done: std::collections::HashSet<u64>,
    free_slots: Vec<usize>,
    next_wr: u64,
    /// Requester sends outstanding, per pair.
    a_out: [u32; PAIRS],
    /// Next sequence number per pair, and the last one its responder saw.
    seq: [u32; PAIRS],
    last_seen: [Option<u32>; PAIRS],
    dead: [bool; PAIRS],
    /// Responders that must raise `LastWqeReached` once.
    b_failed: Vec<u32>,
    recv_errors: usize,
}

fn tag(p: usize, seq: u32) -> u32 {
    (p as u32) << 20 | seq
}

#[test]
fn sixty_four_qps_share_one_srq_and_nothing_is_lost() {
    for seed in [1u64, 0x5eed_1234, 0xdead_beef_cafe] {
        run_seed(seed);
    }
}

fn run_seed(seed: u64) {
    let mut rng = Rng::new(seed);
    let mut r = rig(PAIRS, 255, 1, 7);
    let max = r.srq.max_wr() as usize;
    let mut src = r.pd.register(PAIRS * 16 * 256, Access::NONE).unwrap();
    let dst = r.pd.register(max * SLOT, RW).unwrap();
    let target = r.pd.register(PAIRS * 64, RW).unwrap();
    let pair_of: HashMap<u32, usize> = r.b.iter().enumerate().map(|(i, q)| (q.qpn(), i)).collect();
    let mut m = Model {
        posted: HashMap::new(),
        done: Default::default(),
        free_slots: (0..max).collect(),
        next_wr: 1,
        a_out: [0; PAIRS],
        seq: [0; PAIRS],
        last_seen: [None; PAIRS],
        dead: [false; PAIRS],
        b_failed: Vec::new(),
        recv_errors: 0,
    };
    let mut accesses = 0;

    // `post_recvs(n)`: n receives to the SRQ, as room allows.
    macro_rules! post_recvs {
        ($n:expr) => {
            for _ in 0..$n {
                let Some(slot) = m.free_slots.pop() else {
                    break;
                };
                let id = m.next_wr;
                m.next_wr += 1;
                r.srq
                    .post_recv_one(&RecvWr {
                        wr_id: id,
                        sges: &[dst.sge(slot * SLOT, SLOT as u32)],
                    })
                    .expect("room in the SRQ");
                m.posted.insert(id, slot);
            }
        };
    }
    // `send(p)`: one random SEND / SEND_IMM / WRITE_IMM on pair p.
    macro_rules! send {
        ($p:expr) => {{
            let p = $p;
            let s = m.seq[p];
            let t = tag(p, s);
            let off = (p * 256 + (s as usize % 256)) * 16;
            src.as_mut_slice()[off..off + 4].copy_from_slice(&t.to_le_bytes());
            let sge = [src.sge(off, 16)];
            let op = match rng.below(3) {
                0 => SendOp::Send,
                1 => SendOp::SendImm { imm: t },
                _ => SendOp::WriteImm {
                    remote: target.remote(p * 64),
                    imm: t,
                },
            };
            r.a[p]
                .post_send_one(&SendWr::new(u64::from(t), op, &sge, SendFlags::SIGNALED))
                .unwrap();
            m.seq[p] += 1;
            m.a_out[p] += 1;
        }};
    }
    // `poll()`: both CQs, every completion checked against the model.
    macro_rules! poll {
        () => {{
            for w in r.poll_a() {
                let p = (w.wr_id >> 20) as usize;
                assert!(
                    m.a_out[p] > 0,
                    "seed {seed}: extra requester completion {w:?}"
                );
                m.a_out[p] -= 1;
                if w.status != WcStatus::SUCCESS {
                    assert!(m.dead[p], "seed {seed}: pair {p} failed unprovoked: {w:?}");
                }
            }
            for w in r.poll_b() {
                let slot = m
                    .posted
                    .remove(&w.wr_id)
                    .unwrap_or_else(|| panic!("seed {seed}: {w:?} names no posted receive"));
                assert!(m.done.insert(w.wr_id), "seed {seed}: completed twice");
                let p = pair_of[&w.qp_num];
                match w.status {
                    WcStatus::SUCCESS => {
                        let t = if w.opcode == WcOpcode::RECV_RDMA_WITH_IMM || w.imm_data != 0 {
                            w.imm_data
                        } else {
                            let d = &dst.as_slice()[slot * SLOT..slot * SLOT + 4];
                            u32::from_le_bytes([d[0], d[1], d[2], d[3]])
                        };
                        if w.opcode == WcOpcode::RECV {
                            let d = &dst.as_slice()[slot * SLOT..slot * SLOT + 4];
                            assert_eq!(u32::from_le_bytes([d[0], d[1], d[2], d[3]]), t);
                        }
                        assert_eq!((t >> 20) as usize, p, "seed {seed}: data of another pair");
                        let s = t & 0xf_ffff;
                        assert!(
                            m.last_seen[p].is_none_or(|l| s > l),
                            "seed {seed}: pair {p} out of order"
                        );
                        m.last_seen[p] = Some(s);
                    }
                    WcStatus::LOC_LEN_ERR => {
                        assert!(m.dead[p]);
                        m.recv_errors += 1;
                    }
                    s => panic!("seed {seed}: unexpected receive status {s:?} (no SRQ flushes)"),
                }
                m.free_slots.push(slot);
            }
        }};
    }

    post_recvs!(64);
    for round in 0..600 {
        post_recvs!(rng.below(10));
        for _ in 0..rng.below(8) {
            let p = rng.below(PAIRS as u64) as usize;
            if !m.dead[p] && m.a_out[p] < MAX_OUT {
                send!(p);
            }
        }
        let dead = m.dead.iter().filter(|d| **d).count();
        if round > 20 && dead < MAX_DEAD && rng.below(25) == 0 {
            let p = rng.below(PAIRS as u64) as usize;
            if !m.dead[p] && m.a_out[p] < MAX_OUT {
                m.dead[p] = true;
                match rng.below(4) {
                    0 => {
                        // A bad rkey: the responder fails (QpAccessError).
                        let sge = [src.sge(0, 8)];
                        let bad = rdma_direct::Remote::new(target.remote(0).addr, 0xdead);
                        r.a[p]
                            .post_send_one(&SendWr::new(
                                u64::from(tag(p, 0xf_ffff)),
                                SendOp::Write { remote: bad },
                                &sge,
                                SendFlags::SIGNALED,
                            ))
                            .unwrap();
                        m.a_out[p] += 1;
                        m.b_failed.push(r.b[p].qpn());
                        accesses += 1;
                    }
                    1 => {
                        // Too long for the receive: it completes with
                        // LOC_LEN_ERR, the responder fails.
                        let sge = [src.sge(0, SLOT as u32 * 2)];
                        r.a[p]
                            .post_send_one(&SendWr::new(
                                u64::from(tag(p, 0xf_fffe)),
                                SendOp::Send,
                                &sge,
                                SendFlags::SIGNALED,
                            ))
                            .unwrap();
                        m.a_out[p] += 1;
                        m.b_failed.push(r.b[p].qpn());
                    }
                    2 => {
                        r.b[p].modify(&QpModify::to(QpState::Error)).unwrap();
                        m.b_failed.push(r.b[p].qpn());
                    }
                    _ => {
                        let qpn = Some(r.a[p].qpn());
                        let syndrome = syndrome::LOCAL_PROT;
                        r.dev.backend().inject(Fault::FailNth {
                            qpn,
                            nth: 1,
                            syndrome,
                        });
                        // The fault needs a send to hit.
                        send!(p);
                    }
                }
                // Sends after the fault, to a dead pair: they fail without
                // taking a receive.
                if m.a_out[p] < MAX_OUT {
                    send!(p);
                }
            }
        }
        for _ in 0..rng.below(4) {
            r.dev.backend().step();
        }
        poll!();
    }
    // Drain: give waiting sends receives until no send is outstanding ...
    for _ in 0..10_000 {
        r.run();
        poll!();
        if m.a_out.iter().all(|n| *n == 0) {
            break;
        }
        if m.posted.is_empty() {
            post_recvs!(8);
        }
    }
    assert!(m.a_out.iter().all(|n| *n == 0), "seed {seed}: sends stuck");
    // ... then use up the receives still posted from the live pairs.
    let live: Vec<usize> = (0..PAIRS).filter(|p| !m.dead[*p]).collect();
    let mut k = 0;
    for _ in 0..10_000 {
        if m.posted.is_empty() {
            break;
        }
        let want = m.posted.len() as u32;
        for _ in 0..want.min(MAX_OUT) {
            let p = live[k % live.len()];
            k += 1;
            if m.a_out[p] < MAX_OUT {
                send!(p);
            }
        }
        r.run();
        poll!();
    }
    r.run();
    poll!();
    assert!(
        m.posted.is_empty(),
        "seed {seed}: {} receives never completed",
        m.posted.len()
    );
    assert!(m.a_out.iter().all(|n| *n == 0));
    assert_eq!(
        m.done.len() as u64,
        m.next_wr - 1,
        "seed {seed}: a receive was lost"
    );
    eprintln!(
        "seed {seed}: {} receives, {} dead, {} failed responders, {} recv errors, {} access",
        m.next_wr - 1,
        m.dead.iter().filter(|d| **d).count(),
        m.b_failed.len(),
        m.recv_errors,
        accesses
    );
    // Events: each failed responder raised LastWqeReached exactly once;
    // each bad rkey an access error; nothing else.
    let mut last = Vec::new();
    let mut acc = 0;
    for e in r.events() {
        match e {
            AsyncEvent::LastWqeReached { qpn } => last.push(qpn),
            AsyncEvent::QpAccessError { qpn } => {
                assert!(m.b_failed.contains(&qpn));
                acc += 1;
            }
            e => panic!("seed {seed}: unexpected event {e:?}"),
        }
    }
    last.sort_unstable();
    m.b_failed.sort_unstable();
    assert_eq!(last, m.b_failed, "seed {seed}");
    assert_eq!(acc, accesses);
    assert!(
        !m.b_failed.is_empty() && m.recv_errors <= m.b_failed.len(),
        "seed {seed}: the faults ran"
    );
    // The free list has every WQE back: max_wr receives fit at once.
    let sge = [dst.sge(0, 8)];
    let wrs: Vec<_> = (0..max as u64)
        .map(|i| RecvWr {
            wr_id: 1 << 40 | i,
            sges: &sge,
        })
        .collect();
    r.srq.post_recv(&wrs).unwrap();
    assert_eq!(
        r.srq.post_recv_one(&wrs[0]),
        Err(rdma_direct::Error::RqFull)
    );
}
