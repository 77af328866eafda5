//! The completion queue: decoding every status and opcode, corrupt
//! entries, wraps and arming.

use super::*;

fn poll1(q: &mut SiwCq) -> crate::Result<Wc> {
    let mut w = [Wc::default(); 1];
    match q.poll(&mut w)? {
        1 => Ok(w[0]),
        n => panic!("polled {n}"),
    }
}

#[test]
fn cq_decodes_every_status_and_opcode() {
    let mut f = Fake::cq(16);
    let mut q = cq(&f);
    assert_eq!(q.depth(), 16);
    let status_map = [
        (0u16, WcStatus::SUCCESS),
        (1, WcStatus::LOC_LEN_ERR),
        (2, WcStatus::LOC_PROT_ERR),
        (3, WcStatus::LOC_QP_OP_ERR),
        (4, WcStatus::WR_FLUSH_ERR),
        (5, WcStatus::BAD_RESP_ERR),
        (6, WcStatus::LOC_ACCESS_ERR),
        (7, WcStatus::REM_ACCESS_ERR),
        (8, WcStatus::REM_INV_REQ_ERR),
        (9, WcStatus::GENERAL_ERR),
        (10, WcStatus::GENERAL_ERR),
        (0xffff, WcStatus::GENERAL_ERR),
    ];
    for (st, want) in status_map {
        f.push_cqe(st as u64, 1, 0, st, 64, 0, 0x21);
        let w = poll1(&mut q).unwrap();
        assert_eq!((w.status, w.vendor_err), (want, st as u32), "status {st}");
        assert_eq!((w.wr_id, w.byte_len, w.qp_num), (st as u64, 64, 0x21));
        assert_eq!((w.wc_flags, w.imm_data, w.src_qp), (0, 0, 0));
    }
    let op_map = [
        (0u8, WcOpcode::RDMA_WRITE),
        (1, WcOpcode::RDMA_READ),
        (2, WcOpcode::RDMA_READ),
        (3, WcOpcode::SEND),
        (4, WcOpcode::SEND),
        (5, WcOpcode::SEND),
        (6, WcOpcode::FETCH_ADD),
        (7, WcOpcode::COMP_SWAP),
        (8, WcOpcode::RECV),
    ];
    for (op, want) in op_map {
        f.push_cqe(1, 1, op, 0, 0, 0, 2);
        assert_eq!(poll1(&mut q).unwrap().opcode, want, "opcode {op}");
    }
    // REM_INVAL (kernel CQs): the STag in the first 4 bytes of imm_data.
    let stag = u64::from_ne_bytes({
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&0xabcdu32.to_ne_bytes());
        b
    });
    f.push_cqe(1, 1 | 0x20, 8, 0, 0, stag, 2);
    let w = poll1(&mut q).unwrap();
    assert_eq!((w.wc_flags, w.imm_data), (wc_flags::WITH_INV, 0xabcd));
    // Malformed: unknown opcodes, a QP id wider than 32 bits.
    for (op, qp) in [
        (9u8, 1u64),
        (10, 1),
        (11, 1),
        (200, 1),
        (255, 1),
        (0, 1 << 32),
    ] {
        f.push_cqe(1, 1, op, 0, 0, 0, qp);
        assert_eq!(
            poll1(&mut q),
            Err(Error::CqeCorrupt),
            "opcode {op} qp {qp:#x}"
        );
    }
    assert_eq!(q.corrupt_cqes(), 6);
    // Every consumed slot was handed back (whole flags word 0).
    for i in 0..16 {
        assert_eq!(f.word(i).load(Ordering::Acquire), 0, "slot {i}");
    }
    let mut w = [Wc::default(); 4];
    assert_eq!(q.poll(&mut w), Ok(0));
    assert_eq!(q.poll(&mut []), Ok(0));
}

#[test]
fn cq_corrupt_after_good_is_left_and_wraps() {
    let mut f = Fake::cq(8);
    let mut q = cq(&f);
    f.push_cqe(1, 1, 3, 0, 0, 0, 1);
    f.push_cqe(2, 1, 99, 0, 0, 0, 1);
    f.push_cqe(3, 1, 0, 0, 0, 0, 1);
    let mut w = [Wc::default(); 8];
    assert_eq!(q.poll(&mut w), Ok(1));
    assert_eq!(f.flags16(1) & 1, 1, "the corrupt entry is still there");
    assert_eq!(q.poll(&mut w), Err(Error::CqeCorrupt));
    assert_eq!((q.corrupt_cqes(), q.consumer()), (1, 2));
    assert_eq!(q.poll(&mut w), Ok(1));
    assert_eq!(w[0].wr_id, 3);
    // A slot whose flags lack VALID (whatever else is set) is empty.
    f.word(3)
        .store(u32::from_ne_bytes([0x40, 0, 0, 0]), Ordering::Release);
    assert_eq!(q.poll(&mut w), Ok(0));
    f.word(3).store(0, Ordering::Release);
    // Many wraps.
    let (mut produced, mut consumed) = (0u64, 0u64);
    for round in 0..400u64 {
        for _ in 0..(round % 9).min(8 - (produced - consumed)) {
            f.push_cqe(produced, 1, 8, 0, 1, 0, 7);
            produced += 1;
        }
        let want = (round as usize % 5) + 1;
        let n = q.poll(&mut w[..want]).unwrap();
        for x in &w[..n] {
            assert_eq!((x.wr_id, x.opcode), (consumed, WcOpcode::RECV));
            consumed += 1;
        }
    }
    while q.poll(&mut w).unwrap() != 0 {}
    assert!(produced > 1000);
}

#[test]
fn cq_arming() {
    let f = Fake::cq(4);
    let mut q = cq(&f);
    assert_eq!(q.notify_flags(), 0);
    q.arm(true);
    assert_eq!(f.ctrl().load(Ordering::Acquire), 1, "SOLICITED");
    // The kernel fires and clears it (one-shot).
    f.ctrl().store(0, Ordering::Release);
    q.arm(false);
    assert_eq!(
        f.ctrl().load(Ordering::Acquire),
        3,
        "SOLICITED | NEXT_COMPLETION"
    );
    assert_eq!(q.notify_flags(), 3);
    // The control word is right after the last CQE, nowhere else.
    for i in 0..4 {
        assert_eq!(f.word(i).load(Ordering::Relaxed), 0);
    }
}
