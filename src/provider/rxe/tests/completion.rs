//! The completion queue: decoding every status, opcode and flag, corrupt
//! entries, masked indices and many wraps.

use super::*;

fn poll1(q: &mut RxeCq) -> Result<Wc> {
    let mut w = [Wc::default(); 1];
    match q.poll(&mut w)? {
        1 => Ok(w[0]),
        n => panic!("polled {n}"),
    }
}

#[test]
fn cq_decodes_every_status_opcode_and_flag() {
    let mut f = Fake::new(7, 64);
    let mut q = cq(&f);
    assert_eq!(q.depth(), 63);
    // Every status: ibv numbering passes through with the CQE's
    // vendor_err; beyond GENERAL_ERR it becomes GENERAL_ERR carrying the
    // raw value.
    for st in (0..=21).chain([22, 0x100, u32::MAX]) {
        f.push_cqe(&cqe(st as u64, st, 0, 0x55, 0, 0, 0));
        let w = poll1(&mut q).unwrap();
        if st <= 21 {
            assert_eq!((w.status, w.vendor_err), (WcStatus(st), 0x55));
        } else {
            assert_eq!((w.status, w.vendor_err), (WcStatus::GENERAL_ERR, st));
        }
        assert_eq!(w.wr_id, st as u64);
    }
    // Every opcode this crate can see.
    for op in [0, 1, 2, 3, 4, 128, 129] {
        f.push_cqe(&cqe(7, 0, op, 0, 64, 0, 0));
        let w = poll1(&mut q).unwrap();
        assert_eq!((w.opcode, w.byte_len), (WcOpcode(op), 64));
        assert_eq!(
            (
                w.qp_num,
                w.src_qp,
                w.pkey_index,
                w.slid,
                w.sl,
                w.dlid_path_bits
            ),
            (0x12, 0x34, 5, 0x99, 3, 1)
        );
        assert_eq!((w.syndrome, w.reserved), (0, 0));
    }
    // Kernel wc_flags -> the crate's IBV_WC_* bits; imm to host order.
    let imm_raw = u32::from_ne_bytes(0xcafe_f00du32.to_be_bytes());
    let cases = [
        (0u32, imm_raw, 0u32, 0u32),
        (1, imm_raw, wc_flags::GRH, 0),
        (2, imm_raw, wc_flags::WITH_IMM, 0xcafe_f00d),
        (3, imm_raw, wc_flags::GRH | wc_flags::WITH_IMM, 0xcafe_f00d),
        (4, 0x4321, wc_flags::WITH_INV, 0x4321),
        (5, 0x4321, wc_flags::GRH | wc_flags::WITH_INV, 0x4321),
        (8 | 16 | 32 | 64, imm_raw, 0, 0),
    ];
    for (kf, ex, flags, imm) in cases {
        f.push_cqe(&cqe(1, 0, 128, 0, 0, ex, kf));
        let w = poll1(&mut q).unwrap();
        assert_eq!(
            (w.wc_flags, w.imm_data),
            (flags, imm),
            "kernel flags {kf:#x}"
        );
    }
    // BIND_MW and LOCAL_INV completions (memory windows) decode.
    for op in [5u32, 6] {
        f.push_cqe(&cqe(7, 0, op, 0, 0, 0, 0));
        let w = poll1(&mut q).unwrap();
        assert_eq!((w.wr_id, w.opcode), (7, WcOpcode(op)), "opcode {op}");
    }
    // Malformed entries: unknown opcodes, contradictory flags.
    for (op, kf) in [(7, 0), (8, 0), (127, 0), (130, 0), (u32::MAX, 0), (128, 6)] {
        f.push_cqe(&cqe(1, 0, op, 0, 0, 0, kf));
        assert_eq!(
            poll1(&mut q),
            Err(Error::CqeCorrupt),
            "opcode {op} flags {kf}"
        );
    }
    assert_eq!(q.corrupt_cqes(), 6);
    let mut none = [Wc::default(); 4];
    assert_eq!(q.poll(&mut none), Ok(0), "everything consumed");
    assert_eq!(q.poll(&mut []), Ok(0));
    assert_eq!(f.consumer(), q.consumer());
}

#[test]
fn cq_leaves_a_corrupt_entry_after_good_ones_and_masks_indices() {
    let mut f = Fake::new(7, 16);
    let mut q = cq(&f);
    f.push_cqe(&cqe(1, 0, 0, 0, 0, 0, 0));
    f.push_cqe(&cqe(2, 0, 77, 0, 0, 0, 0));
    f.push_cqe(&cqe(3, 0, 1, 0, 0, 0, 0));
    let mut w = [Wc::default(); 8];
    assert_eq!(q.poll(&mut w), Ok(1));
    assert_eq!((w[0].wr_id, f.consumer()), (1, 1));
    assert_eq!(q.poll(&mut w), Err(Error::CqeCorrupt));
    assert_eq!((q.corrupt_cqes(), f.consumer()), (1, 2));
    assert_eq!(q.poll(&mut w), Ok(1));
    assert_eq!(w[0].wr_id, 3);
    // A producer index out of range is masked: 0x..f5 & 15 = 5, so two
    // more entries (slots 3 and 4) are read, whatever they hold.
    f.put_bytes(3, 0, &cqe(4, 0, 2, 0, 0, 0, 0));
    f.put_bytes(4, 0, &cqe(5, 0, 3, 0, 0, 0, 0));
    f.word(128).store(0xffff_fff5, Ordering::Release);
    assert_eq!(q.poll(&mut w), Ok(2));
    assert_eq!((w[0].wr_id, w[1].wr_id, q.consumer()), (4, 5, 5));
    // Garbage in a slot is decoded (or refused), never followed.
    f.put_bytes(5, 0, &[0xff; 48]);
    f.word(128).store(6, Ordering::Release);
    assert_eq!(q.poll(&mut w), Err(Error::CqeCorrupt));
}

#[test]
fn cq_wraps_many_times() {
    let mut f = Fake::new(7, 8);
    let mut q = cq(&f);
    let mut produced = 0u64;
    let mut consumed = 0u64;
    let mut w = [Wc::default(); 5];
    for round in 0..400u64 {
        for _ in 0..(round % 8).min(7 - (produced - consumed)) {
            f.push_cqe(&cqe(produced, 0, 1, 0, 8, 0, 0));
            produced += 1;
        }
        let want = (round as usize % 5) + 1;
        let n = q.poll(&mut w[..want]).unwrap();
        for x in &w[..n] {
            assert_eq!(x.wr_id, consumed);
            consumed += 1;
        }
        assert_eq!(f.consumer(), q.consumer());
        assert!(f.consumer() <= 7);
    }
    while q.poll(&mut w).unwrap() != 0 {}
    assert!(produced > 1000);
}
