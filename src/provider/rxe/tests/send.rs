//! The send queue: WQE bytes for every opcode, refusals, partial posts,
//! a full ring, many wraps, and a resync after a kernel reset.

use super::*;

/// The bytes a send WQE must have, built from the table in docs/spec/rxe.md §3
/// (not from the encoder's structs): 208 header bytes, then the SGEs or
/// the inline payload.
fn expected_send(wr: &SendWr<'_>) -> Vec<u8> {
    let mut h = vec![0u8; 208];
    put64(&mut h, 0, wr.wr_id);
    let (op, ex): (u32, u32) = match wr.op {
        SendOp::Write { .. } => (0, 0),
        SendOp::WriteImm { imm, .. } => (1, u32::from_ne_bytes(imm.to_be_bytes())),
        SendOp::Send => (2, 0),
        SendOp::SendImm { imm } => (3, u32::from_ne_bytes(imm.to_be_bytes())),
        SendOp::Read { .. } => (4, 0),
        SendOp::CompareSwap { .. } => (5, 0),
        SendOp::FetchAdd { .. } => (6, 0),
        SendOp::SendInv { rkey } => (9, rkey),
        SendOp::LocalInv { rkey } => (7, rkey),
        SendOp::BindMw(_) => (8, 0),
        SendOp::Nop => unreachable!(),
    };
    put32(&mut h, 12, op);
    put32(&mut h, 20, ex);
    match wr.op {
        SendOp::Write { remote } | SendOp::WriteImm { remote, .. } | SendOp::Read { remote } => {
            put64(&mut h, 24, remote.addr);
            put32(&mut h, 32, remote.rkey);
            put64(&mut h, 152, remote.addr); // iova
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            put64(&mut h, 24, remote.addr);
            put64(&mut h, 32, compare);
            put64(&mut h, 40, swap);
            put32(&mut h, 48, remote.rkey);
            put64(&mut h, 152, remote.addr);
        }
        SendOp::FetchAdd { remote, add } => {
            put64(&mut h, 24, remote.addr);
            put64(&mut h, 32, add);
            put32(&mut h, 48, remote.rkey);
            put64(&mut h, 152, remote.addr);
        }
        // `struct rxe_send_wr`'s `mw` member (rdma_user_rxe.h).
        SendOp::BindMw(b) => {
            put64(&mut h, 24, b.addr);
            put64(&mut h, 32, b.len);
            put32(&mut h, 40, b.mr_lkey);
            put32(&mut h, 44, b.mw_rkey);
            put32(&mut h, 48, b.new_rkey);
            put32(&mut h, 52, b.access);
        }
        _ => {}
    }
    let mut flags = wr.flags.0 & 7;
    let mut payload = Vec::new();
    let (len, nsge) = match wr.payload {
        Payload::Sges(sges) => {
            for s in sges {
                payload.extend_from_slice(&s.addr.to_ne_bytes());
                payload.extend_from_slice(&s.length.to_ne_bytes());
                payload.extend_from_slice(&s.lkey.to_ne_bytes());
            }
            (
                sges.iter().map(|s| s.length).sum::<u32>(),
                sges.len() as u32,
            )
        }
        Payload::Inline(pieces) => {
            flags |= 8;
            for p in pieces {
                payload.extend_from_slice(p);
            }
            (payload.len() as u32, 0)
        }
    };
    put32(&mut h, 8, nsge); // the old num_sge word
    put32(&mut h, 16, flags);
    // status 144, state 148, mask 160, PSNs etc. 164..184: all 0.
    put32(&mut h, 184, len); // dma.length
    put32(&mut h, 188, len); // dma.resid
    put32(&mut h, 196, nsge); // dma.num_sge
    h.extend_from_slice(&payload);
    h
}

#[test]
fn send_wqe_bytes_for_every_opcode() {
    let mut f = Fake::new(9, 16);
    let mut q = sq(&f, caps(4, 128, 0));
    let s3 = [
        Sge::new(0x1000, 100, 0x11),
        Sge::new(0x2000, 0, 0x22),
        Sge::new(0x3000, 7, 0x33),
    ];
    let s8 = [Sge::new(0x8000, 8, 0x44)];
    let a = [0x5au8; 33];
    let b = [0x6bu8; 17];
    let pieces: [&[u8]; 2] = [&a, &b];
    let atomic_r = Remote::new(0x10_0000, 0x77);
    let all = SendFlags::FENCE | SendFlags::SIGNALED | SendFlags::SOLICITED;
    let wrs = [
        SendWr::new(1, SendOp::Write { remote: R }, &s3, SendFlags::SIGNALED),
        SendWr::new(
            2,
            SendOp::WriteImm {
                remote: R,
                imm: 0x0102_0304,
            },
            &s3[..1],
            all,
        ),
        SendWr::new(3, SendOp::Send, &s3, SendFlags::SOLICITED),
        SendWr::new(
            4,
            SendOp::SendImm { imm: 0xdead_beef },
            &[],
            SendFlags::NONE,
        ),
        SendWr::new(
            5,
            SendOp::SendInv { rkey: 0x4242 },
            &s3[2..],
            SendFlags::FENCE,
        ),
        SendWr::new(6, SendOp::Read { remote: R }, &s3[..2], SendFlags::SIGNALED),
        SendWr::new(
            7,
            SendOp::CompareSwap {
                remote: atomic_r,
                compare: 0xc0c0,
                swap: 0x5a5a,
            },
            &s8,
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            8,
            SendOp::FetchAdd {
                remote: atomic_r,
                add: 3,
            },
            &s8,
            SendFlags::NONE,
        ),
        SendWr::inline(9, SendOp::Write { remote: R }, &pieces, SendFlags::SIGNALED),
        SendWr::inline(10, SendOp::Send, &[], SendFlags::NONE),
        SendWr::inline(
            11,
            SendOp::SendImm { imm: 9 },
            &pieces[..1],
            SendFlags::NONE,
        ),
        // The INLINE bit and unknown bits in `flags` are not copied: the
        // payload decides INLINE.
        SendWr::new(12, SendOp::Send, &s3[..1], SendFlags(0x108)),
        SendWr::new(
            13,
            SendOp::BindMw(MwBind {
                addr: 0x7000_1000,
                len: 0x1_0000_0200,
                mr_lkey: 0x0000_3a11,
                mw_rkey: 0x0001_2345,
                new_rkey: 0x0001_2346,
                access: 6,
            }),
            &[],
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            14,
            SendOp::LocalInv { rkey: 0x0001_2346 },
            &[],
            SendFlags::FENCE,
        ),
    ];
    // SAFETY: SGEs are never dereferenced in these tests.
    let p = q.tpost(&wrs).unwrap();
    assert_eq!(
        p,
        Posted {
            count: wrs.len(),
            doorbell: true
        }
    );
    assert_eq!(f.producer(), wrs.len() as u32, "one masked release store");
    let slots = f.take_all();
    assert_eq!(slots.len(), wrs.len());
    for (wr, &s) in wrs.iter().zip(&slots) {
        let exp = expected_send(wr);
        assert_eq!(f.bytes(s, 0, exp.len()), exp, "WR {} at slot {s}", wr.wr_id);
    }
    // The last WR's expected flags really are SEND without INLINE.
    assert_eq!(get32(&f.bytes(11, 0, 208), 16), 0);
}

#[test]
fn refusals_and_partial_posts() {
    let mut f = Fake::new(8, 8);
    let mut q = sq(&f, caps(2, 32, 0));
    let s1 = [Sge::new(0x1000, 8, 1)];
    let s3 = [Sge::new(0x1000, 8, 1); 3];
    let big = [0u8; 33];
    let big_p: [&[u8]; 1] = [&big];
    let s4 = [Sge::new(0, 4, 1)];
    let s_huge = [Sge::new(0, 0x8000_0000, 1)];
    let ok = SendWr::new(1, SendOp::Send, &s1, SendFlags::NONE);
    let cases: [(SendWr<'_>, Error); 7] = [
        (
            SendWr::new(2, SendOp::Nop, &[], SendFlags::NONE),
            Error::Unsupported,
        ),
        (
            SendWr::new(2, SendOp::Send, &s3, SendFlags::NONE),
            Error::TooManySges,
        ),
        (
            SendWr::inline(2, SendOp::Send, &big_p, SendFlags::NONE),
            Error::InlineTooLarge,
        ),
        (
            SendWr::inline(2, SendOp::Read { remote: R }, &big_p[..0], SendFlags::NONE),
            Error::InlineNotAllowed,
        ),
        (
            SendWr::new(
                2,
                SendOp::FetchAdd {
                    remote: Remote::new(0x1000, 1),
                    add: 1,
                },
                &s4,
                SendFlags::NONE,
            ),
            Error::AtomicSgeLength,
        ),
        (
            SendWr::new(
                2,
                SendOp::FetchAdd {
                    remote: Remote::new(0x1004, 1),
                    add: 1,
                },
                &s1,
                SendFlags::NONE,
            ),
            Error::AtomicUnaligned,
        ),
        (
            SendWr::new(2, SendOp::Send, &s_huge, SendFlags::NONE),
            Error::LengthOverflow,
        ),
    ];
    for (bad, e) in cases {
        let before = f.producer();
        let r = q.tpost(&[ok, bad, ok]);
        assert_eq!(r, Err(PostError { index: 1, error: e }));
        assert_eq!(
            f.producer(),
            (before + 1) & 7,
            "the WR before it is published"
        );
        assert!(q.doorbell_owed());
        assert!(q.take_doorbell());
        assert!(!q.take_doorbell(), "the debt is paid once");
        f.consume_all();
    }
    // A refused first WR publishes nothing and owes nothing.
    let r = q.tpost(&[cases_first_bad()]);
    assert_eq!(r.unwrap_err().index, 0);
    assert!(!q.take_doorbell());
    // An owed doorbell comes back from the next successful post, even an
    // empty one.
    let _ = q.tpost(&[ok, cases_first_bad()]);
    assert_eq!(
        q.tpost(&[]),
        Ok(Posted {
            count: 0,
            doorbell: true
        })
    );
    assert_eq!(q.tpost(&[]), Ok(Posted::default()));
    // QP state.
    q.set_state(QpState::Reset);
    assert_eq!(
        q.tpost(&[ok]),
        Err(PostError {
            index: 0,
            error: Error::InvalidQpState
        })
    );
    q.set_state(QpState::Error);
    assert_eq!(q.tpost(&[ok]).unwrap().count, 1, "ERROR accepts (flush)");
    assert_eq!(q.state(), QpState::Error);
}

fn cases_first_bad() -> SendWr<'static> {
    SendWr::new(99, SendOp::Nop, &[], SendFlags::NONE)
}

#[test]
fn send_ring_full_and_wraps_many_times() {
    let mut f = Fake::new(8, 8);
    let mut q = sq(&f, caps(1, 0, 0));
    assert_eq!((q.slots(), q.capacity(), q.free_slots()), (8, 7, 7));
    let s = [Sge::new(0x1000, 4, 1)];
    let wr = |id| SendWr::new(id, SendOp::Send, &s, SendFlags::NONE);
    let wrs: Vec<_> = (0..8).map(wr).collect();
    let r = q.tpost(&wrs);
    assert_eq!(
        r,
        Err(PostError {
            index: 7,
            error: Error::SqFull
        })
    );
    assert_eq!((q.free_slots(), q.outstanding(), q.producer()), (0, 7, 7));
    assert!(q.take_doorbell());
    // The kernel has taken the WQEs but not completed them: still full
    // (it uses them as scratch until the consumer index passes).
    let taken = f.take_all();
    assert_eq!(taken.len(), 7);
    assert_eq!(q.tpost(&wrs[..1]).unwrap_err().error, Error::SqFull);
    f.complete_to(3);
    assert_eq!((q.kernel_consumer(), q.free_slots()), (3, 3));
    f.complete_to(7);
    // Wrap the ring many times with batches of varying size; every WQE
    // the kernel sees carries the next id.
    let mut next_id = 100u64;
    let mut seen = 100u64;
    for round in 0..200u32 {
        let n = 1 + (round % 7) as usize;
        let batch: Vec<_> = (0..n as u64).map(|i| wr(next_id + i)).collect();
        let p = q.tpost(&batch).unwrap();
        assert_eq!(
            p,
            Posted {
                count: n,
                doorbell: true
            }
        );
        next_id += n as u64;
        for slot in f.consume_all() {
            assert_eq!(get64(&f.bytes(slot, 0, 8), 0), seen);
            seen += 1;
        }
        assert!(f.producer() <= 7);
    }
    assert_eq!(seen, next_id);
    // A kernel index out of range is masked, never trusted.
    f.word(256)
        .store(0xdead_bee0 | q.producer(), Ordering::Release);
    assert_eq!(q.free_slots(), 7);
}

#[test]
fn resync_after_kernel_reset() {
    let mut f = Fake::new(8, 8);
    let mut q = sq(&f, caps(1, 0, 0));
    let s = [Sge::new(0, 1, 1)];
    let wr = SendWr::new(1, SendOp::Send, &s, SendFlags::NONE);
    q.tpost(&[wr, wr, wr]).unwrap();
    f.consume_all();
    // RESET: the kernel zeroes both indices.
    f.word(128).store(0, Ordering::Release);
    f.word(256).store(0, Ordering::Release);
    f.kidx = 0;
    q.resync();
    assert_eq!((q.producer(), q.free_slots(), q.find(1)), (0, 7, None));
    q.tpost(&[wr]).unwrap();
    assert_eq!(f.take_all(), [0]);
}
