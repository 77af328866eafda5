//! Model-based test of the software HCA: random workloads (opcodes, sizes,
//! signaling, batching) on two connected QPs, with randomly injected
//! faults and QP recovery. Every WR must be accounted for exactly once
//! (completed explicitly, retired by a later completion, or flushed after
//! an error) and memory must match a reference model after every poll.

use std::collections::{HashSet, VecDeque};

use rdma_direct::api::*;
use rdma_direct::provider::mlx5::cq::syndrome;
use rdma_direct::soft::{Fault, SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const TARGET: usize = 4096;
const RD_SLOTS: usize = 256;
const RBUF: usize = 64;
const RSLOTS: usize = 64;

#[derive(Clone, Debug)]
enum Op {
    Write {
        src: usize,
        dst: usize,
        len: usize,
    },
    Read {
        src: usize,
        len: usize,
        slot: usize,
    },
    Faa {
        off: usize,
        add: u64,
        slot: usize,
    },
    Cas {
        off: usize,
        cmp: u64,
        swap: u64,
        slot: usize,
    },
    Send {
        src: usize,
        len: usize,
    },
    Nop,
}

struct Posted {
    id: u64,
    op: Op,
}

struct Model {
    target: Vec<u8>,
    /// Every posted SEND, in order: (WR id, payload).
    sends: VecDeque<(u64, Vec<u8>)>,
    /// WRs that failed or were flushed.
    failed: HashSet<u64>,
}

impl Model {
    fn word(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.target[off..off + 8].try_into().unwrap())
    }
    fn set_word(&mut self, off: usize, v: u64) {
        self.target[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

#[test]
fn random_workloads_with_faults() {
    for seed in 1..=12u64 {
        run(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    }
}

fn run(seed: u64) {
    let mut rng = Rng(seed);
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cqa = dev.create_cq(512).unwrap();
    let mut cqb = dev.create_cq(512).unwrap();
    let mut a = pd.create_qp(&cqa, &cqa, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &QpInit::default()).unwrap();
    let acc = ConnectAttr {
        access: Access(0xe),
        ..Default::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &acc).unwrap();
    b.connect(&ia, &acc).unwrap();

    let mut src = pd.register(4096, Access::NONE).unwrap();
    for (i, x) in src.as_mut_slice().iter_mut().enumerate() {
        *x = (i as u64 ^ seed) as u8;
    }
    let rd = pd.register(RD_SLOTS * 64, Access::LOCAL_WRITE).unwrap();
    let target = pd.register(TARGET, Access(0xf)).unwrap();
    let rbuf = pd.register(RSLOTS * RBUF, Access::LOCAL_WRITE).unwrap();
    let mut model = Model {
        target: vec![0; TARGET],
        sends: VecDeque::new(),
        failed: HashSet::new(),
    };

    let mut outstanding: VecDeque<Posted> = VecDeque::new();
    let mut accounted: HashSet<u64> = HashSet::new();
    let mut next_id = 0u64;
    let mut recv_posted = 0u64;
    let mut recv_done = 0u64;
    let mut in_error = false;
    let mut faults = 0;
    let mut checks = 0;

    let mut wc = [Wc::default(); 64];
    for round in 0..400 {
        // Keep receives posted at B.
        while recv_posted - recv_done < 32 {
            let slot = (recv_posted as usize) % RSLOTS;
            b.post_recv(&[RecvWr {
                wr_id: recv_posted,
                sges: &[rbuf.sge(slot * RBUF, RBUF as u32)],
            }])
            .unwrap();
            recv_posted += 1;
        }
        if !in_error && rng.below(40) == 0 {
            let synd = [
                syndrome::LOCAL_PROT,
                syndrome::REMOTE_ACCESS,
                syndrome::TRANSPORT_RETRY_EXC,
            ][rng.below(3) as usize];
            dev.backend().inject(Fault::FailNth {
                qpn: Some(a.qpn()),
                nth: 1 + rng.below(6),
                syndrome: synd,
            });
            faults += 1;
        }
        // Post a batch with one doorbell.
        let n = 1 + rng.below(8) as usize;
        let mut batch = Vec::new();
        let mut ops = Vec::new();
        let mut sges = Vec::new();
        for _ in 0..n {
            let id = next_id + batch.len() as u64;
            let op = match rng.below(6) {
                0 => {
                    let len = 1 + rng.below(200) as usize;
                    Op::Write {
                        src: rng.below((4096 - len) as u64) as usize,
                        dst: rng.below((TARGET - len) as u64) as usize,
                        len,
                    }
                }
                1 => {
                    let len = 1 + rng.below(64) as usize;
                    Op::Read {
                        src: rng.below((TARGET - len) as u64) as usize,
                        len,
                        slot: (id as usize) % RD_SLOTS,
                    }
                }
                2 => Op::Faa {
                    off: 8 * rng.below(16) as usize,
                    add: rng.next() >> 40,
                    slot: (id as usize) % RD_SLOTS,
                },
                3 => Op::Cas {
                    off: 8 * rng.below(16) as usize,
                    cmp: rng.below(3),
                    swap: rng.next(),
                    slot: (id as usize) % RD_SLOTS,
                },
                4 => {
                    let len = rng.below(RBUF as u64 + 1) as usize;
                    Op::Send {
                        src: rng.below((4096 - len) as u64) as usize,
                        len,
                    }
                }
                _ => Op::Nop,
            };
            let sge = match op {
                Op::Write { src: s, len, .. } | Op::Send { src: s, len } => src.sge(s, len as u32),
                Op::Read { len, slot, .. } => rd.sge(slot * 64, len as u32),
                Op::Faa { slot, .. } | Op::Cas { slot, .. } => rd.sge(slot * 64, 8),
                Op::Nop => src.sge(0, 0),
            };
            sges.push([sge]);
            ops.push((id, op));
            batch.push(());
        }
        let mut wrs = Vec::new();
        for ((id, op), sge) in ops.iter().zip(&sges) {
            let flags = if rng.below(3) == 0 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            let sendop = match *op {
                Op::Write { dst, .. } => SendOp::Write {
                    remote: target.remote(dst),
                },
                Op::Read { src: s, .. } => SendOp::Read {
                    remote: target.remote(s),
                },
                Op::Faa { off, add, .. } => SendOp::FetchAdd {
                    remote: target.remote(off),
                    add,
                },
                Op::Cas { off, cmp, swap, .. } => SendOp::CompareSwap {
                    remote: target.remote(off),
                    compare: cmp,
                    swap,
                },
                Op::Send { .. } => SendOp::Send,
                Op::Nop => SendOp::Nop,
            };
            let sg: &[rdma_direct::Sge] = if matches!(op, Op::Nop) { &[] } else { sge };
            wrs.push(SendWr::new(*id, sendop, sg, flags));
        }
        let posted = match a.post_send(&wrs) {
            Ok(()) => wrs.len(),
            Err(e) => {
                assert!(
                    matches!(e.error, Error::SqFull | Error::InvalidQpState),
                    "seed {seed:#x}: {e}"
                );
                e.index
            }
        };
        for (id, op) in ops.into_iter().take(posted) {
            if let Op::Send { src: s, len } = op {
                model
                    .sends
                    .push_back((id, (s..s + len).map(|i| (i as u64 ^ seed) as u8).collect()));
            }
            outstanding.push_back(Posted { id, op });
        }
        next_id += posted as u64;

        // Let the device run a random amount, then poll both sides.
        for _ in 0..rng.below(4) {
            dev.backend().step();
        }
        if round % 25 == 24 && !in_error {
            // A signaled NOP retires everything before it once polled.
            if a.post_send_one(&SendWr::new(next_id, SendOp::Nop, &[], SendFlags::SIGNALED))
                .is_ok()
            {
                outstanding.push_back(Posted {
                    id: next_id,
                    op: Op::Nop,
                });
                next_id += 1;
            }
            dev.backend().run_until_idle(1000);
        }
        loop {
            let got = cqa.poll(&mut a, &mut wc).unwrap();
            for w in &wc[..got] {
                // Retire everything before this WR: unsignaled, succeeded.
                loop {
                    let p = outstanding.pop_front().unwrap_or_else(|| {
                        panic!("seed {seed:#x}: completion {} for nothing", w.wr_id)
                    });
                    assert!(
                        accounted.insert(p.id),
                        "seed {seed:#x}: WR {} accounted twice",
                        p.id
                    );
                    let last = p.id == w.wr_id;
                    let ok = !last || w.status == WcStatus::SUCCESS;
                    if !last {
                        assert!(!in_error || w.status != WcStatus::SUCCESS, "seed {seed:#x}");
                    }
                    if ok && !in_error {
                        apply(&mut model, &p.op, &rd, seed, p.id);
                    } else {
                        model.failed.insert(p.id);
                    }
                    if last {
                        if w.status != WcStatus::SUCCESS {
                            if !in_error {
                                assert_ne!(
                                    w.status,
                                    WcStatus::WR_FLUSH_ERR,
                                    "seed {seed:#x}: first error is the real one"
                                );
                            } else {
                                assert_eq!(
                                    w.status,
                                    WcStatus::WR_FLUSH_ERR,
                                    "seed {seed:#x}: later ones are flushed"
                                );
                            }
                            in_error = true;
                        }
                        break;
                    }
                }
            }
            if got < wc.len() {
                break;
            }
        }
        // B's receives: in order, with the data of successful SENDs.
        let got = cqb.poll(&mut b, &mut wc).unwrap();
        for w in &wc[..got] {
            assert_eq!(
                w.wr_id, recv_done,
                "seed {seed:#x}: receives complete in order"
            );
            assert_eq!(w.status, WcStatus::SUCCESS);
            while model
                .sends
                .front()
                .is_some_and(|(id, _)| model.failed.contains(id))
            {
                model.sends.pop_front();
            }
            let (_, want) = model.sends.pop_front().expect("a receive without a SEND");
            assert_eq!(w.byte_len as usize, want.len());
            let slot = (w.wr_id as usize) % RSLOTS;
            assert_eq!(
                &rbuf.as_slice()[slot * RBUF..slot * RBUF + want.len()],
                &want[..],
                "seed {seed:#x}: SEND payload"
            );
            recv_done += 1;
        }
        if outstanding.is_empty() {
            same(target.as_slice(), &model.target, seed, round);
            checks += 1;
        }
        // Recovery: once every outstanding WR is flushed, reset and reconnect.
        if in_error && outstanding.is_empty() {
            dev.backend().clear_faults();
            a.modify(&QpModify::to(QpState::Reset)).unwrap();
            a.connect(&b.info(), &acc).unwrap();
            in_error = false;
        }
    }
    // Drain: a final signaled NOP retires everything (or is flushed).
    dev.backend().clear_faults();
    if in_error {
        dev.backend().run_until_idle(1000);
    } else {
        a.post_send_one(&SendWr::new(next_id, SendOp::Nop, &[], SendFlags::SIGNALED))
            .unwrap();
        outstanding.push_back(Posted {
            id: next_id,
            op: Op::Nop,
        });
        next_id += 1;
        dev.backend().run_until_idle(1000);
    }
    loop {
        let got = cqa.poll(&mut a, &mut wc).unwrap();
        if got == 0 {
            break;
        }
        for w in &wc[..got] {
            loop {
                let p = outstanding.pop_front().expect("completion for nothing");
                assert!(accounted.insert(p.id));
                if w.status == WcStatus::SUCCESS && !in_error {
                    apply(&mut model, &p.op, &rd, seed, p.id);
                }
                if p.id == w.wr_id {
                    if w.status != WcStatus::SUCCESS {
                        in_error = true;
                    }
                    break;
                }
            }
        }
    }
    assert!(
        outstanding.is_empty(),
        "seed {seed:#x}: {} WRs never completed",
        outstanding.len()
    );
    assert_eq!(
        accounted.len() as u64,
        next_id,
        "seed {seed:#x}: every WR exactly once"
    );
    same(target.as_slice(), &model.target, seed, 9999);
    assert!(faults > 0, "seed {seed:#x}: no fault injected");
    assert!(
        checks > 5,
        "seed {seed:#x}: memory compared only {checks} times"
    );
    assert!(next_id > 500, "seed {seed:#x}: only {next_id} WRs");
}

fn same(got: &[u8], want: &[u8], seed: u64, round: usize) {
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "seed {seed:#x} round {round}: target byte {i} is {} but the model says {}",
            got[i], want[i]
        );
    }
}

/// Applies a completed WR to the model and checks its local results.
fn apply(m: &mut Model, op: &Op, rd: &Mr<SoftDevice>, seed: u64, id: u64) {
    let src = |off: usize, len: usize| -> Vec<u8> {
        (off..off + len).map(|i| (i as u64 ^ seed) as u8).collect()
    };
    match *op {
        Op::Write { src: s, dst, len } => m.target[dst..dst + len].copy_from_slice(&src(s, len)),
        Op::Read { src: s, len, slot } => {
            assert_eq!(
                &rd.as_slice()[slot * 64..slot * 64 + len],
                &m.target[s..s + len],
                "seed {seed:#x}: READ {id}"
            );
        }
        Op::Faa { off, add, slot } => {
            let old = m.word(off);
            assert_eq!(
                rd.load_u64(slot * 64),
                Some(old),
                "seed {seed:#x}: FAA {id} original value"
            );
            m.set_word(off, old.wrapping_add(add));
        }
        Op::Cas {
            off,
            cmp,
            swap,
            slot,
        } => {
            let old = m.word(off);
            assert_eq!(
                rd.load_u64(slot * 64),
                Some(old),
                "seed {seed:#x}: CAS {id} original value"
            );
            if old == cmp {
                m.set_word(off, swap);
            }
        }
        Op::Send { .. } => {}
        Op::Nop => {}
    }
}
