//! The send queue: SQE bytes for every supported opcode, typed refusals,
//! a full queue, many wraps, and the doorbell decisions.

use super::*;

/// Checks an SQE image against the table in docs/spec/siw.md §2 for `wr`.
fn check_sqe(img: &[u8], wr: &SendWr<'_>, sig_all: bool) {
    assert_eq!(get64(img, 0), wr.wr_id, "id");
    let (op, rkey, raddr) = match wr.op {
        SendOp::Write { remote } => (0u8, remote.rkey, remote.addr),
        SendOp::Read { remote } => (1, remote.rkey, remote.addr),
        SendOp::Send => (3, 0, 0),
        SendOp::SendInv { rkey } => (5, rkey, 0),
        _ => unreachable!(),
    };
    let mut flags = 1u16;
    if sig_all || wr.flags.contains(SendFlags::SIGNALED) {
        flags |= 4;
    }
    if wr.flags.contains(SendFlags::SOLICITED) {
        flags |= 8;
    }
    if wr.flags.contains(SendFlags::FENCE) {
        flags |= 0x10;
    }
    assert_eq!(img[11], op, "opcode");
    assert_eq!(get32(img, 12), rkey, "rkey");
    assert_eq!(get64(img, 16), raddr, "raddr");
    match wr.payload {
        Payload::Sges(sges) => {
            assert_eq!(get16(img, 8), flags, "flags");
            assert_eq!(img[10] as usize, sges.len(), "num_sge");
            for (i, s) in sges.iter().enumerate() {
                let o = 24 + 16 * i;
                assert_eq!(
                    (get64(img, o), get32(img, o + 8), get32(img, o + 12)),
                    (s.addr, s.length, s.lkey),
                    "sge {i}"
                );
            }
        }
        Payload::Inline(pieces) => {
            assert_eq!(get16(img, 8), flags | 2, "flags");
            assert_eq!(img[10], 1, "num_sge");
            let data: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            assert_eq!((get64(img, 24), get32(img, 36)), (0, 0), "sge[0] addr, key");
            assert_eq!(get32(img, 32) as usize, data.len(), "sge[0].length");
            assert_eq!(&img[40..40 + data.len()], &data[..], "payload at sge[1]");
        }
    }
}

#[test]
fn sqe_bytes_for_every_supported_opcode() {
    for sig_all in [false, true] {
        let mut f = Fake::sq(16);
        let mut q = sq(&f, caps(6, 80, 0), sig_all);
        let s = [
            Sge::new(0x1000, 100, 0x11),
            Sge::new(0x2000, 0, 0x22),
            Sge::new(0x3000, 7, 0x33),
            Sge::new(0x4000, 1, 0x44),
            Sge::new(0x5000, 2, 0x55),
            Sge::new(0x6000, 3, 0x66),
        ];
        let a = [0x5au8; 48];
        let b = [0x6bu8; 32];
        let p48: [&[u8]; 1] = [&a];
        let p80: [&[u8]; 2] = [&a, &b];
        let all = SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::FENCE;
        let wrs = [
            SendWr::new(1, SendOp::Write { remote: R }, &s[..2], SendFlags::SIGNALED),
            SendWr::new(2, SendOp::Write { remote: R }, &s, all),
            SendWr::new(3, SendOp::Send, &s[..3], SendFlags::SOLICITED),
            SendWr::new(4, SendOp::Send, &[], SendFlags::NONE),
            SendWr::new(5, SendOp::Read { remote: R }, &s[2..3], SendFlags::SIGNALED),
            SendWr::new(
                6,
                SendOp::SendInv { rkey: 0x4242 },
                &s[..1],
                SendFlags::FENCE,
            ),
            SendWr::inline(7, SendOp::Write { remote: R }, &p48, SendFlags::SIGNALED),
            SendWr::inline(8, SendOp::Send, &p80, SendFlags::SOLICITED),
            SendWr::inline(9, SendOp::Send, &[], SendFlags::NONE),
        ];
        let p = q.tpost(&wrs).unwrap();
        assert_eq!(
            p,
            Posted {
                count: wrs.len(),
                doorbell: true
            }
        );
        let imgs = f.pick_all();
        assert_eq!(imgs.len(), wrs.len());
        for (img, wr) in imgs.iter().zip(&wrs) {
            check_sqe(img, wr, sig_all);
        }
        assert_eq!(q.producer(), wrs.len() as u32);
    }
}

#[test]
fn typed_refusals() {
    let mut f = Fake::sq(8);
    let mut q = sq(&f, caps(6, 80, 0), false);
    let s1 = [Sge::new(0x1000, 8, 1)];
    let s2 = [Sge::new(0x1000, 8, 1); 2];
    let s7 = [Sge::new(0x1000, 8, 1); 7];
    let d81 = [0u8; 81];
    let p81: [&[u8]; 1] = [&d81];
    let d8 = [0u8; 8];
    let p8: [&[u8]; 1] = [&d8];
    let s_huge = [Sge::new(0, 0x8000_0000, 1)];
    let ok = SendWr::new(1, SendOp::Send, &s1, SendFlags::NONE);
    let read = SendOp::Read { remote: R };
    let cases: [(SendWr<'_>, Error); 13] = [
        (
            SendWr::new(2, SendOp::SendImm { imm: 1 }, &s1, SendFlags::NONE),
            Error::Unsupported,
        ),
        (
            SendWr::new(
                2,
                SendOp::WriteImm { remote: R, imm: 1 },
                &s1,
                SendFlags::NONE,
            ),
            Error::Unsupported,
        ),
        (
            SendWr::new(
                2,
                SendOp::CompareSwap {
                    remote: R,
                    compare: 0,
                    swap: 1,
                },
                &s1,
                SendFlags::NONE,
            ),
            Error::Unsupported,
        ),
        (
            SendWr::new(
                2,
                SendOp::FetchAdd { remote: R, add: 1 },
                &s1,
                SendFlags::NONE,
            ),
            Error::Unsupported,
        ),
        (
            SendWr::new(2, SendOp::Nop, &[], SendFlags::NONE),
            Error::Unsupported,
        ),
        (
            SendWr::new(2, read, &[], SendFlags::NONE),
            Error::Unsupported,
        ),
        (
            SendWr::new(2, read, &s2, SendFlags::NONE),
            Error::Unsupported,
        ),
        (
            SendWr::new(2, read, &s1, SendFlags::FENCE),
            Error::Unsupported,
        ),
        (
            SendWr::inline(2, read, &p8, SendFlags::NONE),
            Error::InlineNotAllowed,
        ),
        (
            SendWr::inline(2, SendOp::SendInv { rkey: 1 }, &p8, SendFlags::NONE),
            Error::InlineNotAllowed,
        ),
        (
            SendWr::inline(2, SendOp::Send, &p81, SendFlags::NONE),
            Error::InlineTooLarge,
        ),
        (
            SendWr::new(2, SendOp::Send, &s7, SendFlags::NONE),
            Error::TooManySges,
        ),
        (
            SendWr::new(2, SendOp::Send, &s_huge, SendFlags::NONE),
            Error::LengthOverflow,
        ),
    ];
    for (bad, e) in cases {
        let put = q.producer();
        let r = q.tpost(&[ok, ok, bad, ok]);
        assert_eq!(r, Err(PostError { index: 2, error: e }), "{bad:?}");
        assert_eq!(
            q.producer(),
            put.wrapping_add(2),
            "the two before it are posted"
        );
        assert_eq!(f.pick_all().len(), 2, "and nothing of the refused one");
    }
    q.set_state(QpState::Init);
    assert_eq!(q.tpost(&[ok]).unwrap_err().error, Error::InvalidQpState);
    q.set_state(QpState::Error);
    assert!(q.tpost(&[ok]).is_ok());
}

#[test]
fn full_queue_and_many_wraps() {
    let mut f = Fake::sq(8);
    let mut q = sq(&f, caps(1, 0, 0), false);
    let s = [Sge::new(0x1000, 4, 1)];
    let wr = |id| SendWr::new(id, SendOp::Send, &s, SendFlags::NONE);
    let wrs: Vec<_> = (0..9).map(wr).collect();
    // All 8 slots are usable; the 9th finds slot 0 still VALID.
    let r = q.tpost(&wrs);
    assert_eq!(
        r,
        Err(PostError {
            index: 8,
            error: Error::SqFull
        })
    );
    assert_eq!((q.producer(), q.free_slots()), (8, 0));
    assert!(q.take_doorbell(), "a call that filled the whole SQ rings");
    // The kernel picks up 3 (not completed yet, but the slots are free).
    for _ in 0..3 {
        f.pick().unwrap();
    }
    assert_eq!(q.free_slots(), 3);
    let r = q.tpost(&wrs[..4]);
    assert_eq!(
        r.unwrap_err(),
        PostError {
            index: 3,
            error: Error::SqFull
        }
    );
    q.take_doorbell();
    f.pick_all();
    // Many wraps, including the u32 counter wrap being irrelevant to the
    // slot (power-of-two size).
    let mut next = 100u64;
    let mut seen = 100u64;
    for round in 0..500u32 {
        let n = 1 + (round % 8) as usize;
        let batch: Vec<_> = (0..n as u64).map(|i| wr(next + i)).collect();
        let p = q.tpost(&batch).unwrap();
        assert_eq!(p.count, n);
        next += n as u64;
        for img in f.pick_all() {
            assert_eq!(get64(&img, 0), seen);
            seen += 1;
        }
    }
    assert_eq!(seen, next);
}

#[test]
fn doorbell_decisions() {
    let mut f = Fake::sq(8);
    let mut q = sq(&f, caps(1, 0, 0), false);
    let s = [Sge::new(0x1000, 4, 1)];
    let ok = SendWr::new(1, SendOp::Send, &s, SendFlags::NONE);
    let bad = SendWr::new(2, SendOp::Nop, &[], SendFlags::NONE);
    let post = |q: &mut SiwSendQueue, w: &[SendWr<'_>]| q.tpost(w);
    // Fresh queue: the slot before the first (7) is free -> ring.
    assert!(post(&mut q, &[ok]).unwrap().doorbell);
    // Slot 0 not picked up yet: the transmitter will reach ours -> no ring.
    assert!(!post(&mut q, &[ok, ok]).unwrap().doorbell);
    // The kernel picks up 0 and 1 but not 2: still no ring.
    f.pick();
    f.pick();
    assert!(!post(&mut q, &[ok]).unwrap().doorbell);
    // It picks up everything (then goes idle): the next post rings.
    f.pick_all();
    assert!(post(&mut q, &[ok, ok]).unwrap().doorbell);
    f.pick_all();
    // A call that fills the whole SQ rings even though the slot before its
    // first is one of its own, now VALID.
    let eight = [ok; 8];
    assert_eq!(
        post(&mut q, &eight).unwrap(),
        Posted {
            count: 8,
            doorbell: true
        }
    );
    f.pick_all();
    // A partial post: the debt is kept for take_doorbell ...
    let r = post(&mut q, &[ok, bad]);
    assert_eq!(r.unwrap_err().index, 1);
    assert!(q.doorbell_owed());
    assert!(q.take_doorbell());
    // ... or handed back by the next successful post, even an empty one.
    f.pick_all();
    let _ = post(&mut q, &[ok, bad]);
    assert_eq!(
        post(&mut q, &[]).unwrap(),
        Posted {
            count: 0,
            doorbell: true
        }
    );
    assert_eq!(post(&mut q, &[]).unwrap(), Posted::default());
    // A partial post behind a VALID SQE owes nothing.
    let _ = post(&mut q, &[ok, bad]);
    assert!(!q.take_doorbell());
    // A refused first WR publishes nothing and owes nothing.
    f.pick_all();
    assert_eq!(post(&mut q, &[bad]).unwrap_err().index, 0);
    assert!(!q.take_doorbell());
}
