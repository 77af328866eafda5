//! Every start slot × every WQE size on a small ring: nothing is written
//! outside the WQE's basic blocks (modulo the ring), DS and the WQE index
//! are right, and inline payloads split correctly at every byte of the
//! ring end (docs/spec/mlx5.md §2 wrap rule).

use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::*;
use rdma_direct::*;

const RING_BBS: u32 = 8;
const PATTERN: u8 = 0xa5;

fn geo() -> FakeGeometry {
    FakeGeometry {
        sq_wqe_cnt: RING_BBS,
        bf_size: 256,
        ..FakeGeometry::default()
    }
}

/// Checks that only the bytes of BBs [start, start+nbb) (mod ring) of the
/// SQ changed and that the RQ region and the guard are untouched.
fn check_footprint(f: &FakeMlx5, start: u32, nbb: u32, case: &str) {
    let all = f.qp_buf.bytes();
    let sq_off = f.sq_offset();
    let sq_len = (RING_BBS * 64) as usize;
    for (i, b) in all[..sq_off].iter().enumerate() {
        assert_eq!(*b, PATTERN, "{case}: RQ byte {i} written");
    }
    for (i, b) in all[sq_off + sq_len..].iter().enumerate() {
        assert_eq!(*b, PATTERN, "{case}: guard byte {i} after the ring written");
    }
    let covered = |bb: u32| (0..nbb).any(|k| (start + k) % RING_BBS == bb);
    for bb in 0..RING_BBS {
        if covered(bb) {
            continue;
        }
        let s = sq_off + bb as usize * 64;
        assert!(
            all[s..s + 64].iter().all(|b| *b == PATTERN),
            "{case}: BB {bb} outside the WQE written"
        );
    }
}

fn caps() -> QpCaps {
    // ds up to 32 octowords (8 BBs, the whole ring).
    QpCaps {
        max_send_sge: 30,
        max_inline_data: 476,
        max_recv_sge: 4,
    }
}

#[test]
fn every_slot_every_sge_count() {
    let sges: Vec<Sge> = (0..30)
        .map(|i| Sge::new(0x1000_0000 + i * 0x100, 64 + i as u32, 0x100 + i as u32))
        .collect();
    for high in [0u32, 0xfff8, 0x7fff_fff8] {
        for start in 0..RING_BBS {
            for n in 0..=30usize {
                let case = format!("pi {:#x} sges {n}", high + start);
                let mut f = FakeMlx5::new(geo());
                f.qp_buf.fill(PATTERN);
                let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
                let pi = high.wrapping_add(start);
                sq.reset_counters(pi);
                let wr = SendWr::new(n as u64, SendOp::Send, &sges[..n], SendFlags::SIGNALED);
                // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
                unsafe { sq.post_one(&wr) }.unwrap();
                let ds = 1 + n as u32;
                let nbb = ds.div_ceil(4);
                assert_eq!(sq.producer(), pi.wrapping_add(nbb), "{case}");
                assert_eq!(f.dbrec_sq(), pi.wrapping_add(nbb) & 0xffff, "{case}");
                check_footprint(&f, pi % RING_BBS, nbb, &case);
                let d = decode_wqe(f.sq_bytes(), pi % RING_BBS).unwrap();
                assert_eq!(d.ds, ds, "{case}");
                assert_eq!(d.wqe_index, pi as u16, "{case}");
                assert_eq!(d.qpn, 0x1c5, "{case}");
                let want: Vec<_> = sges[..n]
                    .iter()
                    .map(|s| (s.addr, s.length, s.lkey))
                    .collect();
                assert_eq!(d.sges, want, "{case}");
            }
        }
    }
}

#[test]
fn every_slot_every_inline_length() {
    let payload: Vec<u8> = (0..476u32).map(|i| (i * 7 + 1) as u8).collect();
    for start in 0..RING_BBS {
        for len in 0..=476usize {
            let case = format!("slot {start} inline {len}");
            let mut f = FakeMlx5::new(geo());
            f.qp_buf.fill(PATTERN);
            let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
            sq.reset_counters(start);
            // Split the payload in up to three pieces to exercise
            // concatenation as well as the ring-end split.
            let a = len / 3;
            let b = len / 2;
            let pieces: [&[u8]; 3] = [&payload[..a], &payload[a..b], &payload[b..len]];
            let wr = SendWr::inline(
                9,
                SendOp::Write {
                    remote: Remote::new(0xabc0, 5),
                },
                &pieces,
                SendFlags::NONE,
            );
            // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
            unsafe { sq.post_one(&wr) }.unwrap();
            let ds = 2 + if len == 0 {
                0
            } else {
                (4 + len as u32).div_ceil(16)
            };
            let nbb = ds.div_ceil(4);
            check_footprint(&f, start, nbb, &case);
            let d = decode_wqe(f.sq_bytes(), start).unwrap();
            assert_eq!(d.ds, ds, "{case}");
            if len == 0 {
                assert_eq!(d.inline, None, "{case}");
            } else {
                assert_eq!(d.inline.as_deref(), Some(&payload[..len]), "{case}");
            }
            assert_eq!(d.remote, Some((0xabc0, 5)), "{case}");
        }
    }
}

#[test]
fn every_slot_every_opcode() {
    let one = [Sge::new(0x5000, 8, 0x77)];
    let r = Remote::new(0x9000, 0x33);
    let ops = [
        (SendOp::Nop, 1u32),
        (SendOp::Send, 2),
        (SendOp::SendImm { imm: 0x01020304 }, 2),
        (SendOp::SendInv { rkey: 0x55 }, 2),
        (SendOp::Write { remote: r }, 3),
        (SendOp::WriteImm { remote: r, imm: 7 }, 3),
        (SendOp::Read { remote: r }, 3),
        (
            SendOp::CompareSwap {
                remote: r,
                compare: 1,
                swap: 2,
            },
            4,
        ),
        (SendOp::FetchAdd { remote: r, add: 3 }, 4),
    ];
    for start in 0..RING_BBS {
        for (op, ds) in ops {
            let case = format!("slot {start} {op:?}");
            let mut f = FakeMlx5::new(geo());
            f.qp_buf.fill(PATTERN);
            let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
            sq.reset_counters(start);
            let sg: &[Sge] = if matches!(op, SendOp::Nop) { &[] } else { &one };
            // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
            unsafe { sq.post_one(&SendWr::new(1, op, sg, SendFlags::SIGNALED)) }.unwrap();
            check_footprint(&f, start, 1, &case);
            let d = decode_wqe(f.sq_bytes(), start).unwrap();
            assert_eq!(d.ds, ds, "{case}");
            assert_eq!(d.fm_ce_se, 0x08, "{case}");
        }
    }
}

#[test]
fn full_ring_is_refused_without_writing() {
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
    let sges = [Sge::new(0x1000, 1, 1); 7]; // ds 8 = 2 BBs
    for i in 0..4 {
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { sq.post(&SendWr::new(i, SendOp::Send, &sges, SendFlags::SIGNALED)) }.unwrap();
    }
    sq.ring();
    assert_eq!(sq.free_bbs(), 0);
    let before = f.qp_buf.bytes().to_vec();
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    let e = unsafe { sq.post(&SendWr::new(9, SendOp::Nop, &[], SendFlags::NONE)) };
    assert_eq!(e, Err(Error::SqFull));
    assert_eq!(f.qp_buf.bytes(), &before[..]);
    assert_eq!(sq.producer(), 8);
    // One BB free after retiring the first WQE: a 2-BB WQE still does not fit
    // after filling it with a NOP.
    assert!(sq.retire(0).is_some());
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { sq.post(&SendWr::new(10, SendOp::Nop, &[], SendFlags::NONE)) }.unwrap();
    assert_eq!(
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { sq.post(&SendWr::new(11, SendOp::Send, &sges, SendFlags::NONE)) },
        Err(Error::SqFull)
    );
}

#[test]
fn state_gates_posting() {
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
    let mut rq = f.recv_queue(caps()).unwrap();
    for s in [QpState::Reset, QpState::Init, QpState::Rtr] {
        sq.set_state(s);
        assert_eq!(
            // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
            unsafe { sq.post(&SendWr::new(1, SendOp::Nop, &[], SendFlags::NONE)) },
            Err(Error::InvalidQpState)
        );
    }
    rq.set_state(QpState::Reset);
    assert_eq!(
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe {
            rq.post(&RecvWr {
                wr_id: 1,
                sges: &[],
            })
        },
        Err(Error::InvalidQpState)
    );
    rq.set_state(QpState::Init);
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    assert!(unsafe {
        rq.post(&RecvWr {
            wr_id: 1,
            sges: &[],
        })
    }
    .is_ok());
    assert_eq!(sq.producer(), 0);
}

#[test]
fn forced_signal_guard() {
    // 8-BB ring, largest WQE 2 BBs: the guard is half the ring. A doorbell
    // that leaves an unsignaled run of 4 BBs makes its last WQE request a
    // CQE, before the WQE is published.
    let small = QpCaps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: 4,
    };
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(small, SqConfig::default()).unwrap();
    let sge = [Sge::new(0x1000, 8, 1)];
    let ce = |f: &FakeMlx5, slot: u32| decode_wqe(f.sq_bytes(), slot).unwrap().fm_ce_se & 0x0c != 0;
    for i in 0..3u64 {
        // SAFETY: fake queue memory; the SGE is never dereferenced.
        unsafe { sq.post(&SendWr::new(i, SendOp::Send, &sge, SendFlags::NONE)) }.unwrap();
    }
    sq.ring();
    assert_eq!(
        (0..3).map(|s| ce(&f, s)).collect::<Vec<_>>(),
        vec![false; 3]
    );
    // SAFETY: as above.
    unsafe { sq.post_one(&SendWr::new(3, SendOp::Send, &sge, SendFlags::NONE)) }.unwrap();
    assert!(
        ce(&f, 3),
        "the doorbell that reached the guard forced a CQE"
    );
    // The doorbell carried the patched WQE (BlueFlame copies the whole WQE).
    assert_eq!(f.bf.bytes()[256 + 11] & 0x08, 0x08);
    // A signaled WR resets the run.
    // SAFETY: as above.
    unsafe { sq.post_one(&SendWr::new(4, SendOp::Send, &sge, SendFlags::SIGNALED)) }.unwrap();
    assert!(sq.retire(4).is_some());

    // When the largest WQE fills the ring, every doorbell with unsignaled
    // work forces a CQE.
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
    // SAFETY: as above.
    unsafe { sq.post_one(&SendWr::new(0, SendOp::Send, &sge, SendFlags::NONE)) }.unwrap();
    assert!(ce(&f, 0));
}

/// Regression (found by the `wqe_encode` fuzz target): `post_one` and
/// `post_list` must ring with the last WQE's own control bytes.
#[test]
fn post_one_and_post_list_ring_with_their_last_wqe() {
    let mut f = FakeMlx5::new(geo());
    let cfg = SqConfig {
        bf_policy: BfPolicy::Never,
        ..SqConfig::default()
    };
    let mut sq = f.send_queue(caps(), cfg).unwrap();
    let sge = [Sge::new(0x1000, 8, 1)];
    // SAFETY: fake queue memory; the SGE is never dereferenced.
    unsafe { sq.post_one(&SendWr::new(1, SendOp::Send, &sge, SendFlags::SIGNALED)) }.unwrap();
    assert_eq!(&f.bf.bytes()[..8], &f.sq_bytes()[..8]);
    let wrs = [
        SendWr::new(2, SendOp::Send, &sge, SendFlags::SIGNALED),
        SendWr::new(3, SendOp::Nop, &[], SendFlags::SIGNALED),
    ];
    // SAFETY: as above.
    unsafe { sq.post_list(&wrs) }.unwrap();
    let off = sq.bf_offset() ^ 256; // the offset this doorbell used
    let reg = &f.bf.bytes()[off as usize..off as usize + 8];
    assert_eq!(
        reg,
        &f.sq_bytes()[2 * 64..2 * 64 + 8],
        "the NOP's control bytes"
    );
}

/// Regression (found by the fuzzers): a counter naming the middle BB of an
/// outstanding WQE must not match a stale side-table entry from before a
/// reset.
#[test]
fn middle_bb_never_matches_a_stale_entry() {
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
    let one = [Sge::new(0x1000, 8, 1)];
    let many = [Sge::new(0x1000, 8, 1); 6]; // ds 7: 2 BBs
    sq.reset_counters(10);
    // SAFETY: fake queue memory; SGEs never dereferenced.
    unsafe { sq.post_one(&SendWr::new(1, SendOp::Send, &one, SendFlags::SIGNALED)) }.unwrap();
    sq.reset_counters(9);
    // SAFETY: as above.
    unsafe { sq.post_one(&SendWr::new(2, SendOp::Send, &many, SendFlags::SIGNALED)) }.unwrap();
    assert!(sq.retire(10).is_none(), "BB 10 is the middle of WQE 2");
    assert_eq!(sq.retire(9).map(|r| r.wr_id), Some(2));
}

/// Regression (found by the fuzzers): one SGE of 2^31 bytes would encode
/// as an inline segment (bit 31 of the byte count).
#[test]
fn two_gib_sge_is_refused() {
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(caps(), SqConfig::default()).unwrap();
    let mut rq = f.recv_queue(caps()).unwrap();
    let big = [Sge::new(0x1000, 1 << 31, 1)];
    // SAFETY: refused before anything is written.
    let e = unsafe { sq.post(&SendWr::new(1, SendOp::Send, &big, SendFlags::NONE)) };
    assert_eq!(e, Err(Error::LengthOverflow));
    assert_eq!(
        // SAFETY: as above.
        unsafe {
            rq.post(&RecvWr {
                wr_id: 1,
                sges: &big,
            })
        },
        Err(Error::LengthOverflow)
    );
}

/// `SendQueue::batch`: one doorbell for the run, with the last WQE's
/// control bytes; a dropped batch leaves its WQEs pending (as `post`); a
/// refused WR changes nothing; the forced-signal guard applies at its
/// doorbell too.
#[test]
fn send_batch_rings_once_and_drop_leaves_pending() {
    let small = QpCaps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: 4,
    };
    let cfg = SqConfig {
        bf_policy: BfPolicy::Never,
        ..SqConfig::default()
    };
    let mut f = FakeMlx5::new(geo());
    let mut sq = f.send_queue(small, cfg).unwrap();
    let sge = [Sge::new(0x1000, 8, 1)];
    let wr = |id: u64, flags: SendFlags| SendWr::new(id, SendOp::Send, &sge, flags);
    let reg_of = |f: &FakeMlx5, off: u32| f.bf.bytes()[off as usize..off as usize + 8].to_vec();

    // Three WQEs, one doorbell carrying the third one's control bytes.
    let mut b = sq.batch();
    assert!(b.is_empty());
    for i in 0..3 {
        // SAFETY: fake queue memory; the SGE is never dereferenced.
        unsafe { b.post(&wr(i, SendFlags::SIGNALED)) }.unwrap();
    }
    assert_eq!(b.len(), 3);
    b.ring();
    assert_eq!((sq.producer(), sq.pending(), f.dbrec_sq()), (3, 0, 3));
    assert_eq!(sq.bf_offset(), 256, "one doorbell, one toggle");
    assert_eq!(reg_of(&f, 0), f.sq_bytes()[2 * 64..2 * 64 + 8].to_vec());

    // A dropped batch: written and counted as pending, no doorbell.
    {
        let mut b = sq.batch();
        for i in 3..5 {
            // SAFETY: as above.
            unsafe { b.post(&wr(i, SendFlags::SIGNALED)) }.unwrap();
        }
    }
    assert_eq!((sq.producer(), sq.pending(), f.dbrec_sq()), (5, 2, 3));
    sq.ring();
    assert_eq!((sq.pending(), f.dbrec_sq()), (0, 5));
    assert_eq!(reg_of(&f, 256), f.sq_bytes()[4 * 64..4 * 64 + 8].to_vec());
    assert_eq!(sq.retire(4).map(|r| r.wr_id), Some(4));

    // A refused WR (too many SGEs) changes nothing; what was posted before
    // it in the batch is still rung.
    let many = [Sge::new(0x1000, 8, 1); 5];
    let mut b = sq.batch();
    // SAFETY: as above.
    unsafe { b.post(&wr(5, SendFlags::SIGNALED)) }.unwrap();
    // SAFETY: as above.
    let bad = unsafe { b.post(&SendWr::new(6, SendOp::Send, &many, SendFlags::NONE)) };
    assert_eq!(bad, Err(Error::TooManySges));
    assert_eq!(b.len(), 1);
    b.ring();
    assert_eq!((sq.producer(), f.dbrec_sq()), (6, 6));

    // The guard (4 BBs on this ring) forces a CQE on the last WQE of a
    // batch that leaves too long an unsignaled run.
    let mut b = sq.batch();
    for i in 10..14 {
        // SAFETY: as above.
        unsafe { b.post(&wr(i, SendFlags::NONE)) }.unwrap();
    }
    b.ring();
    let ce = |slot: u32| decode_wqe(f.sq_bytes(), slot).unwrap().fm_ce_se & 0x08 != 0;
    assert_eq!(
        (6..10).map(|s| ce(s % RING_BBS)).collect::<Vec<_>>(),
        vec![false, false, false, true]
    );
}
