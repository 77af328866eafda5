//! siw queues against an in-memory stand-in for the kernel: buffers laid
//! out like the mappings, and a "kernel" that picks up VALID elements
//! (checking their bytes against the offsets in docs/spec/siw.md §2, written out
//! independently of the encoder), clears their flags, and produces CQEs.

use std::vec;
use std::vec::Vec;

use super::*;
use crate::completion::wc_flags;
use crate::completion::{QpState, Wc, WcOpcode, WcStatus};
use crate::error::{Error, PostError};
use crate::sync::{AtomicU32, Ordering};
use crate::testutil::AlignedBuf;
use crate::wr::{FailedWr, Payload, QpCaps, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

/// Memory standing in for one siw mapping of `n` elements of `elem`
/// bytes (plus `extra` bytes, the CQ control word).
struct Fake {
    buf: AlignedBuf,
    n: u32,
    elem: usize,
    extra: usize,
    /// The kernel's free-running counter (`sq_get`, `rq_get`, `cq_put`).
    k: u32,
}

impl Fake {
    fn new(n: u32, elem: usize, extra: usize) -> Fake {
        let mut buf = AlignedBuf::new(n as usize * elem + extra);
        // Garbage everywhere but the flags words (0: free).
        buf.bytes_mut().fill(0xab);
        let f = Fake {
            buf,
            n,
            elem,
            extra,
            k: 0,
        };
        for i in 0..n {
            f.word(i).store(0, Ordering::Relaxed);
        }
        if extra != 0 {
            f.ctrl().store(0, Ordering::Relaxed);
        }
        f
    }
    fn sq(n: u32) -> Fake {
        Fake::new(n, 120, 0)
    }
    fn rq(n: u32) -> Fake {
        Fake::new(n, 112, 0)
    }
    fn cq(n: u32) -> Fake {
        Fake::new(n, 32, 8)
    }
    fn len(&self) -> usize {
        self.n as usize * self.elem + self.extra
    }
    fn ptr(&self) -> *mut u8 {
        self.buf.ptr()
    }
    fn slot(&self, c: u32) -> *mut u8 {
        // SAFETY: inside the buffer.
        unsafe { self.buf.ptr().add((c % self.n) as usize * self.elem) }
    }
    fn word(&self, c: u32) -> &AtomicU32 {
        // SAFETY: the flags word of an element of our buffer.
        unsafe { &*self.slot(c).add(8).cast::<AtomicU32>() }
    }
    fn ctrl(&self) -> &AtomicU32 {
        // SAFETY: the control word after the last element.
        unsafe {
            &*self
                .buf
                .ptr()
                .add(self.n as usize * self.elem)
                .cast::<AtomicU32>()
        }
    }
    fn bytes(&self, c: u32, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: inside the element; no concurrent writer in these tests.
        unsafe { core::ptr::copy_nonoverlapping(self.slot(c).add(off), v.as_mut_ptr(), len) };
        v
    }
    fn put_bytes(&self, c: u32, off: usize, b: &[u8]) {
        // SAFETY: inside the element.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), self.slot(c).add(off), b.len()) };
    }
    /// The flags of element `c` (the u16 at offset 8).
    fn flags16(&self, c: u32) -> u16 {
        let b = self.word(c).load(Ordering::Acquire).to_ne_bytes();
        u16::from_ne_bytes([b[0], b[1]])
    }

    // ---- the kernel as consumer (SQ, RQ) ----

    /// Picks up the next element if it is VALID: returns its full image
    /// (flags word included) and clears its `flags` (u16 only; `num_sge`
    /// and `opcode` stay, as in the kernel).
    fn pick(&mut self) -> Option<Vec<u8>> {
        if self.flags16(self.k) & 1 == 0 {
            return None;
        }
        let img = self.bytes(self.k, 0, self.elem);
        let keep = u32::from_ne_bytes([0, 0, 0xff, 0xff]);
        self.word(self.k).fetch_and(keep, Ordering::SeqCst);
        self.k = self.k.wrapping_add(1);
        Some(img)
    }
    fn pick_all(&mut self) -> Vec<Vec<u8>> {
        core::iter::from_fn(|| self.pick()).collect()
    }

    // ---- the kernel as producer (CQ) ----

    /// Writes a CQE at `cq_put` if the slot is free, then sets its flags.
    #[allow(clippy::too_many_arguments)]
    fn push_cqe(&mut self, id: u64, flags: u8, op: u8, status: u16, bytes: u32, imm: u64, qp: u64) {
        assert_eq!(self.flags16(self.k) & 0xff, 0, "CQ overflow in the test");
        let mut c = [0u8; 32];
        c[0..8].copy_from_slice(&id.to_ne_bytes());
        c[12..16].copy_from_slice(&bytes.to_ne_bytes());
        c[16..24].copy_from_slice(&imm.to_ne_bytes());
        c[24..32].copy_from_slice(&qp.to_ne_bytes());
        self.put_bytes(self.k, 0, &c[..8]);
        self.put_bytes(self.k, 12, &c[12..]);
        let s = status.to_ne_bytes();
        self.word(self.k).store(
            u32::from_ne_bytes([flags, op, s[0], s[1]]),
            Ordering::Release,
        );
        self.k = self.k.wrapping_add(1);
    }
}

/// Posting in these tests: the SGEs name no real memory, and the fake
/// kernel never dereferences them.
trait TestPost<W> {
    type Out;
    fn tpost(&mut self, w: &[W]) -> Self::Out;
}

impl<'a> TestPost<SendWr<'a>> for SiwSendQueue {
    type Out = core::result::Result<Posted, PostError>;
    fn tpost(&mut self, w: &[SendWr<'a>]) -> Self::Out {
        // SAFETY: see the trait: nothing dereferences the SGEs.
        unsafe { self.post(w) }
    }
}

impl<'a> TestPost<RecvWr<'a>> for SiwRecvQueue {
    type Out = core::result::Result<usize, PostError>;
    fn tpost(&mut self, w: &[RecvWr<'a>]) -> Self::Out {
        // SAFETY: see the trait: nothing dereferences the SGEs.
        unsafe { self.post(w) }
    }
}

fn get16(v: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes(v[off..off + 2].try_into().unwrap())
}
fn get32(v: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(v[off..off + 4].try_into().unwrap())
}
fn get64(v: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(v[off..off + 8].try_into().unwrap())
}

fn caps(sge: u32, inline: u32, rsge: u32) -> QpCaps {
    QpCaps {
        max_send_sge: sge,
        max_inline_data: inline,
        max_recv_sge: rsge,
    }
}

const R: Remote = Remote {
    addr: 0x1122_3344_5566_7788,
    rkey: 0xa1b2_c3d4,
};

fn sq(f: &Fake, c: QpCaps, sig_all: bool) -> SiwSendQueue {
    // SAFETY: the fake mapping outlives the queue; SGEs are never
    // dereferenced.
    unsafe { SiwSendQueue::new(f.ptr(), f.len(), f.n, c, sig_all) }.unwrap()
}

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
fn geometry_checks() {
    let f = Fake::sq(8);
    let g = Err(Error::InvalidGeometry);
    let c = caps(6, 80, 6);
    let try_sq = |p: *mut u8, len: usize, n: u32, c: QpCaps| {
        // SAFETY: our buffer; nothing is dereferenced on refusal.
        unsafe { SiwSendQueue::new(p, len, n, c, false) }.map(|_| ())
    };
    assert_eq!(try_sq(f.ptr(), f.len(), 8, c), Ok(()));
    assert_eq!(try_sq(core::ptr::null_mut(), f.len(), 8, c), g);
    assert_eq!(try_sq(f.ptr().wrapping_add(4), f.len() - 4, 4, c), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 0, c), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 6, c), g);
    assert_eq!(try_sq(f.ptr(), usize::MAX, 1 << 25, c), g);
    assert_eq!(try_sq(f.ptr(), f.len() - 1, 8, c), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 8, caps(7, 0, 0)), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 8, caps(1, 81, 0)), g);
    let r = Fake::rq(4);
    // SAFETY: our buffer.
    let try_rq = |len, c: QpCaps| {
        // SAFETY: our buffer; nothing is dereferenced on refusal.
        unsafe { SiwRecvQueue::new(r.ptr(), len, 4, &c) }.map(|_| ())
    };
    assert_eq!(try_rq(r.len(), caps(0, 0, 6)), Ok(()));
    assert_eq!(try_rq(r.len(), caps(0, 0, 7)), g);
    assert_eq!(try_rq(r.len() - 1, caps(0, 0, 1)), g);
    let q = Fake::cq(4);
    // SAFETY: our buffer.
    let try_cq = |len| {
        // SAFETY: our buffer; nothing is dereferenced on refusal.
        unsafe { SiwCq::new(q.ptr(), len, 4) }.map(|_| ())
    };
    assert_eq!(try_cq(q.len()), Ok(()));
    assert_eq!(try_cq(q.len() - 1), g, "no room for siw_cq_ctrl");
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

#[test]
fn rqe_bytes_full_and_wrap() {
    let mut f = Fake::rq(4);
    let c = caps(0, 0, 3);
    // SAFETY: our buffer, outliving the queue; SGEs never dereferenced.
    let mut q = unsafe { SiwRecvQueue::new(f.ptr(), f.len(), 4, &c) }.unwrap();
    let s = [
        Sge::new(0xa000, 64, 5),
        Sge::new(0xb000, 0, 6),
        Sge::new(0xc000, 32, 7),
    ];
    let wrs = [
        RecvWr {
            wr_id: 0x77,
            sges: &s,
        },
        RecvWr {
            wr_id: 0x78,
            sges: &[],
        },
    ];
    assert_eq!(q.tpost(&wrs), Ok(2));
    let imgs = f.pick_all();
    assert_eq!(imgs.len(), 2);
    for (img, wr) in imgs.iter().zip(&wrs) {
        assert_eq!(get64(img, 0), wr.wr_id);
        // flags exactly VALID, num_sge, opcode 0, unused 0.
        assert_eq!(&img[8..16], &[1, 0, wr.sges.len() as u8, 0, 0, 0, 0, 0]);
        for (i, g) in wr.sges.iter().enumerate() {
            let o = 16 + 16 * i;
            assert_eq!(
                (get64(img, o), get32(img, o + 8), get32(img, o + 12)),
                (g.addr, g.length, g.lkey)
            );
        }
    }
    let one = RecvWr {
        wr_id: 1,
        sges: &s[..1],
    };
    // Four usable slots, then full.
    assert_eq!(
        q.tpost(&[one; 5]),
        Err(PostError {
            index: 4,
            error: Error::RqFull
        })
    );
    assert_eq!(q.free_slots(), 0);
    f.pick_all();
    assert_eq!(q.free_slots(), 4);
    let four = [Sge::new(0, 1, 1); 4];
    // SAFETY: as above.
    let r = unsafe {
        q.post(&[RecvWr {
            wr_id: 1,
            sges: &four,
        }])
    };
    assert_eq!(r.unwrap_err().error, Error::TooManySges);
    let huge = [Sge::new(0, 0x8000_0000, 1), Sge::new(0, 0x8000_0000, 1)];
    // SAFETY: as above.
    let r = unsafe {
        q.post(&[RecvWr {
            wr_id: 1,
            sges: &huge,
        }])
    };
    assert_eq!(r.unwrap_err().error, Error::LengthOverflow);
    q.set_state(QpState::Reset);
    assert_eq!(q.tpost(&[one]).unwrap_err().error, Error::InvalidQpState);
    q.set_state(QpState::Rtr);
    let mut seen = 1000u64;
    for i in 0..300u64 {
        let w = RecvWr {
            wr_id: 1000 + i,
            sges: &s[..1],
        };
        assert_eq!(q.tpost(&[w]), Ok(1));
        if i % 3 == 2 {
            for img in f.pick_all() {
                assert_eq!(get64(&img, 0), seen);
                seen += 1;
            }
        }
    }
    f.pick_all();
}

fn cq(f: &Fake) -> SiwCq {
    // SAFETY: our buffer, outliving the CQ.
    unsafe { SiwCq::new(f.ptr(), f.len(), f.n) }.unwrap()
}

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

#[test]
fn describe_and_find_failed_wqes() {
    let mut f = Fake::sq(8);
    let mut q = sq(&f, caps(3, 80, 0), false);
    let s = [Sge::new(0x1000, 10, 0x11), Sge::new(0x2000, 20, 0x22)];
    let d = [7u8; 24];
    let dp: [&[u8]; 1] = [&d];
    let wrs = [
        SendWr::new(1, SendOp::Write { remote: R }, &s, SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Read { remote: R }, &s[1..], SendFlags::SIGNALED),
        SendWr::new(3, SendOp::SendInv { rkey: 0x99 }, &s[..1], SendFlags::NONE),
        SendWr::inline(4, SendOp::Write { remote: R }, &dp, SendFlags::NONE),
    ];
    q.tpost(&wrs).unwrap();
    // Not picked up yet: not searched. The inline one is described as
    // inline from its flags.
    assert_eq!(q.find(1), None);
    assert!(q.describe(3).inline);
    f.pick_all();
    let expect = [
        FailedWr {
            wr_id: 1,
            opcode: WcOpcode::RDMA_WRITE,
            local_addr: 0x1000,
            length: 30,
            lkey: 0x11,
            remote_addr: R.addr,
            rkey: R.rkey,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 2,
            opcode: WcOpcode::RDMA_READ,
            local_addr: 0x2000,
            length: 20,
            lkey: 0x22,
            remote_addr: R.addr,
            rkey: R.rkey,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 3,
            opcode: WcOpcode::SEND,
            local_addr: 0x1000,
            length: 10,
            lkey: 0x11,
            ..FailedWr::default()
        },
        // Flags cleared by the pickup: still recognised as inline.
        FailedWr {
            wr_id: 4,
            opcode: WcOpcode::RDMA_WRITE,
            length: 24,
            remote_addr: R.addr,
            rkey: R.rkey,
            inline: true,
            ..FailedWr::default()
        },
    ];
    for (i, e) in expect.iter().enumerate() {
        assert_eq!(q.find(e.wr_id), Some(i as u32));
        assert_eq!(q.describe(i as u32), *e);
    }
    assert_eq!(q.find(42), None);
    let wc = Wc {
        wr_id: 2,
        status: WcStatus::REM_ACCESS_ERR,
        vendor_err: 7,
        ..Wc::default()
    };
    let fw = q.failed_wr(1, &wc);
    assert_eq!(
        (fw.status, fw.vendor_err, fw.rkey),
        (WcStatus::REM_ACCESS_ERR, 7, R.rkey)
    );
    // Garbage slots stay in bounds.
    f.put_bytes(5, 0, &[0xff; 8]);
    f.put_bytes(5, 12, &[0xff; 108]);
    f.word(5).store(u32::MAX, Ordering::Relaxed);
    let _ = q.describe(5);
    let _ = q.describe(u32::MAX);

    // Receive side.
    let mut f = Fake::rq(4);
    let c = caps(0, 0, 2);
    // SAFETY: our buffer.
    let mut r = unsafe { SiwRecvQueue::new(f.ptr(), f.len(), 4, &c) }.unwrap();
    // SAFETY: SGEs never dereferenced.
    unsafe {
        r.post(&[RecvWr {
            wr_id: 42,
            sges: &s,
        }])
    }
    .unwrap();
    assert_eq!(r.find(42), None);
    f.pick_all();
    let sl = r.find(42).unwrap();
    assert_eq!(
        r.describe(sl),
        FailedWr {
            wr_id: 42,
            recv: true,
            opcode: WcOpcode::RECV,
            local_addr: 0x1000,
            length: 30,
            lkey: 0x11,
            ..FailedWr::default()
        }
    );
    let wc = Wc {
        wr_id: 42,
        status: WcStatus::WR_FLUSH_ERR,
        ..Wc::default()
    };
    assert_eq!(r.failed_wr(sl, &wc).status, WcStatus::WR_FLUSH_ERR);
}

/// A raw pointer the kernel thread may carry.
struct Shared(*mut u8);
// SAFETY: the pointed-to buffers outlive the scoped threads, and every
// flags word is accessed atomically (the point of the test).
unsafe impl Send for Shared {}

/// The kernel on its own thread: it picks up SQEs and produces one CQE per
/// SQE, concurrently with the poster/poller. Any missing acquire/release
/// pair shows up as a data race under Miri (the element payloads are plain
/// accesses).
#[test]
fn concurrent_kernel_thread() {
    const N: u64 = if cfg!(miri) { 60 } else { 5000 };
    let sqf = Fake::sq(4);
    let cqf = Fake::cq(4);
    let mut q = sq(&sqf, caps(1, 0, 0), false);
    let mut c = cq(&cqf);
    let (sp, cp) = (Shared(sqf.ptr()), Shared(cqf.ptr()));
    std::thread::scope(|s| {
        s.spawn(move || {
            let (sq_base, cq_base) = (sp, cp);
            let (mut get, mut put) = (0u32, 0u32);
            let mut done = 0u64;
            while done < N {
                // SAFETY: slot `get` of the SQ (120-byte elements).
                let sqe = unsafe { sq_base.0.add((get % 4) as usize * 120) };
                // SAFETY: its flags word.
                let sw = unsafe { &*sqe.add(8).cast::<AtomicU32>() };
                if sw.load(Ordering::Acquire).to_ne_bytes()[0] & 1 == 0 {
                    std::thread::yield_now();
                    continue;
                }
                // SAFETY: VALID: published by the poster, ours to read.
                let (id, len) =
                    unsafe { (sqe.cast::<u64>().read(), sqe.add(32).cast::<u32>().read()) };
                assert_eq!((id, len), (done, 8));
                // Clear the u16 flags (keep num_sge, opcode), as at pickup.
                sw.fetch_and(u32::from_ne_bytes([0, 0, 0xff, 0xff]), Ordering::SeqCst);
                get = get.wrapping_add(1);
                // SAFETY: CQ slot `put` (32-byte elements) and its flags.
                let (cqe, cw) = unsafe {
                    let p = cq_base.0.add((put % 4) as usize * 32);
                    (p, &*p.add(8).cast::<AtomicU32>())
                };
                while cw.load(Ordering::Acquire) & 0xff != 0 {
                    std::thread::yield_now();
                }
                // SAFETY: the CQE is free (flags 0): ours to write.
                unsafe {
                    cqe.cast::<u64>().write(id);
                    cqe.add(12).cast::<u32>().write(len);
                    cqe.add(16).cast::<u64>().write(0);
                    cqe.add(24).cast::<u64>().write(9);
                }
                cw.store(u32::from_ne_bytes([1, 3, 0, 0]), Ordering::Release);
                put = put.wrapping_add(1);
                done += 1;
            }
        });
        let s1 = [Sge::new(0x1000, 8, 1)];
        let (mut posted, mut polled) = (0u64, 0u64);
        let mut out = [Wc::default(); 3];
        while polled < N {
            if posted < N {
                let wr = SendWr::new(posted, SendOp::Send, &s1, SendFlags::SIGNALED);
                match q.tpost(&[wr]) {
                    Ok(p) => {
                        assert_eq!(p.count, 1);
                        posted += 1;
                    }
                    Err(e) => assert_eq!(e.error, Error::SqFull),
                }
            }
            let n = c.poll(&mut out).unwrap();
            for x in &out[..n] {
                assert_eq!((x.wr_id, x.qp_num, x.opcode), (polled, 9, WcOpcode::SEND));
                polled += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
    });
}
