//! Property test: random WR sequences are posted, and every accepted WR
//! decodes back (with the test-only decoder, which never calls the
//! encoder) to exactly what was asked; rejected WRs change nothing. The
//! ring wraps many times. A small xorshift generator keeps the test
//! deterministic and dependency-free; the seed is printed on failure.

use rdma_direct::provider::mlx5::layout::opcode;
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::*;
use rdma_direct::*;

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

/// What the decoder must return for an accepted WR (built from the WR
/// alone, following docs/spec/mlx5.md §3–§5).
fn expected(wr: &SendWr<'_>, index: u16, qpn: u32, signaled: bool) -> DecodedWqe {
    let (op, imm, remote, atomic) = match wr.op {
        SendOp::Send => (opcode::SEND, 0, None, None),
        SendOp::SendImm { imm } => (opcode::SEND_IMM, imm, None, None),
        SendOp::SendInv { rkey } => (opcode::SEND_INVAL, rkey, None, None),
        SendOp::Write { remote } => (opcode::RDMA_WRITE, 0, Some(remote), None),
        SendOp::WriteImm { remote, imm } => (opcode::RDMA_WRITE_IMM, imm, Some(remote), None),
        SendOp::Read { remote } => (opcode::RDMA_READ, 0, Some(remote), None),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => (
            opcode::ATOMIC_CS,
            0,
            Some(remote),
            Some((swap, Some(compare))),
        ),
        SendOp::FetchAdd { remote, add } => (opcode::ATOMIC_FA, 0, Some(remote), Some((add, None))),
        SendOp::Nop => (opcode::NOP, 0, None, None),
        SendOp::BindMw(_) | SendOp::LocalInv { .. } => {
            unreachable!("the mlx5 encoder refuses these")
        }
    };
    let mut ds = 1 + remote.is_some() as u32 + atomic.is_some() as u32;
    let (sges, inline) = match wr.payload {
        Payload::Sges(s) => {
            let v: Vec<_> = if atomic.is_some() {
                vec![(s[0].addr, 8, s[0].lkey)]
            } else {
                s.iter()
                    .filter(|s| s.length != 0)
                    .map(|s| (s.addr, s.length, s.lkey))
                    .collect()
            };
            ds += v.len() as u32;
            (v, None)
        }
        Payload::Inline(p) => {
            let bytes: Vec<u8> = p.iter().flat_map(|x| x.iter().copied()).collect();
            if bytes.is_empty() {
                (vec![], None)
            } else {
                ds += (4 + bytes.len() as u32).div_ceil(16);
                (vec![], Some(bytes))
            }
        }
    };
    let mut fm = 0u8;
    if signaled {
        fm |= 0x08;
    }
    if wr.flags.contains(SendFlags::SOLICITED) {
        fm |= 0x02;
    }
    if wr.flags.contains(SendFlags::FENCE) {
        fm |= 0x80;
    }
    DecodedWqe {
        opcode: op,
        opmod: 0,
        wqe_index: index,
        qpn,
        ds,
        fm_ce_se: fm,
        imm,
        remote: remote.map(|r| (r.addr, r.rkey)),
        atomic,
        sges,
        inline,
    }
}

#[test]
fn random_sequences_round_trip() {
    for seed in 1..=40u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    }
}

fn run(seed: u64) {
    let mut rng = Rng(seed);
    let cnt = [4u32, 8, 16, 64][rng.below(4) as usize];
    let max_sge = 1 + rng.below(6) as u32;
    let max_inline = rng.below(120) as u32;
    let caps = QpCaps {
        max_send_sge: max_sge,
        max_inline_data: max_inline,
        max_recv_sge: 1,
    };
    let mut f = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: cnt,
        ..FakeGeometry::default()
    });
    let sig_all = rng.below(4) == 0;
    let Ok(mut sq) = f.send_queue(
        caps,
        SqConfig {
            sig_all,
            ..SqConfig::default()
        },
    ) else {
        // Geometry too small for the largest WQE: a valid refusal.
        return;
    };
    let start = rng.next() as u32;
    sq.reset_counters(start);
    let payload: Vec<u8> = (0..200u32).map(|i| (i ^ seed as u32) as u8).collect();
    let mut outstanding: std::collections::VecDeque<(u16, u32)> = Default::default();
    let mut accepted = 0;
    for step in 0..600 {
        let nsge = rng.below(max_sge as u64 + 2) as usize;
        let sges: Vec<Sge> = (0..nsge)
            .map(|_| {
                Sge::new(
                    rng.next(),
                    if rng.below(5) == 0 {
                        0
                    } else {
                        rng.below(5000) as u32
                    },
                    rng.next() as u32,
                )
            })
            .collect();
        let remote = Remote::new(rng.next() & !(rng.below(2) * 7), rng.next() as u32);
        let op = match rng.below(9) {
            0 => SendOp::Send,
            1 => SendOp::SendImm {
                imm: rng.next() as u32,
            },
            2 => SendOp::SendInv {
                rkey: rng.next() as u32,
            },
            3 => SendOp::Write { remote },
            4 => SendOp::WriteImm {
                remote,
                imm: rng.next() as u32,
            },
            5 => SendOp::Read { remote },
            6 => SendOp::CompareSwap {
                remote,
                compare: rng.next(),
                swap: rng.next(),
            },
            7 => SendOp::FetchAdd {
                remote,
                add: rng.next(),
            },
            _ => SendOp::Nop,
        };
        let flags = SendFlags(rng.below(8) as u32);
        let a = rng.below(60) as usize;
        let b = a + rng.below(80) as usize;
        let pieces: [&[u8]; 2] = [&payload[..a], &payload[a..b]];
        let mut wr = if rng.below(3) == 0 {
            SendWr::inline(step, op, &pieces, flags)
        } else {
            SendWr::new(step, op, &sges, flags)
        };
        if matches!(op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }) && rng.below(2) == 0 {
            // Mostly-valid atomics so they get exercised.
            wr.payload = Payload::Sges(&sges[..nsge.min(1)]);
        }
        let before = f.qp_buf.bytes().to_vec();
        let pi = sq.producer();
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        match unsafe { sq.post(&wr) } {
            Ok(()) => {
                accepted += 1;
                let slot = pi & (cnt - 1);
                let d = decode_wqe(f.sq_bytes(), slot)
                    .unwrap_or_else(|e| panic!("seed {seed:#x} step {step}: {e:?}"));
                let signaled = d.fm_ce_se & 0x08 != 0;
                if wr.flags.contains(SendFlags::SIGNALED) || sig_all {
                    assert!(
                        signaled,
                        "seed {seed:#x} step {step}: signaled WR without CE"
                    );
                }
                let want = expected(&wr, pi as u16, 0x1c5, signaled);
                assert_eq!(d, want, "seed {seed:#x} step {step}: {wr:?}");
                outstanding.push_back((pi as u16, sq.producer()));
            }
            Err(e) => {
                assert_eq!(
                    f.qp_buf.bytes(),
                    &before[..],
                    "seed {seed:#x} step {step}: rejected WR ({e:?}) wrote"
                );
                assert_eq!(sq.producer(), pi);
                if e == Error::SqFull {
                    assert!(!outstanding.is_empty());
                }
            }
        }
        if rng.below(3) == 0 {
            let had = sq.pending() > 0;
            sq.ring();
            assert_eq!(sq.pending(), 0);
            if had {
                assert_eq!(f.dbrec_sq(), sq.producer() & 0xffff);
            }
        }
        // Retire a random prefix, like in-order completions would.
        if !outstanding.is_empty() && rng.below(2) == 0 {
            let k = rng.below(outstanding.len() as u64) as usize;
            let (idx, end) = outstanding[k];
            let r = sq.retire(idx).expect("outstanding WQE must retire");
            assert_eq!(sq.retired(), end);
            assert_eq!(r.start as u16, idx);
            outstanding.drain(..=k);
            // A second retire of the same index is refused.
            assert!(sq.retire(idx).is_none());
        }
    }
    assert!(accepted > 100, "seed {seed:#x}: only {accepted} accepted");
}
