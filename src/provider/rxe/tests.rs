//! rxe queues against an in-memory stand-in for the kernel: a buffer laid
//! out like the mapping, a header written as the kernel writes it, and a
//! "kernel" that consumes WQEs (checking their bytes against the
//! docs/spec/rxe.md §3/docs/spec/rxe.md §4 offsets, written out independently of the
//! encoder), advances its indices and produces CQEs.

use std::vec;
use std::vec::Vec;

use super::layout::HEADER_SIZE;
use super::*;
use crate::completion::wc_flags;
use crate::completion::{QpState, Wc, WcOpcode, WcStatus};
use crate::error::{Error, PostError};
use crate::sync::{AtomicU32, Ordering};
use crate::testutil::AlignedBuf;
use crate::wr::{
    FailedWr, MwBind, Payload, QpCaps, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge,
};

/// Memory standing in for one rxe queue mapping.
struct Fake {
    buf: AlignedBuf,
    log2: u32,
    slots: u32,
    /// The kernel's private copy of its own index.
    kidx: u32,
}

impl Fake {
    /// A mapping with `slots` elements of `1 << log2` bytes; the header is
    /// written as the kernel writes it, the elements are filled with
    /// garbage (stale kernel scratch).
    fn new(log2: u32, slots: u32) -> Fake {
        let len = HEADER_SIZE + ((slots as usize) << log2);
        let mut buf = AlignedBuf::new(len);
        buf.bytes_mut()[HEADER_SIZE..].fill(0xab);
        let f = Fake {
            buf,
            log2,
            slots,
            kidx: 0,
        };
        f.word(0).store(log2, Ordering::Relaxed);
        f.word(4).store(slots - 1, Ordering::Relaxed);
        f
    }
    fn len(&self) -> usize {
        HEADER_SIZE + ((self.slots as usize) << self.log2)
    }
    fn ptr(&self) -> *mut u8 {
        self.buf.ptr()
    }
    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: a header word of our own buffer.
        unsafe { &*self.buf.ptr().add(off).cast::<AtomicU32>() }
    }
    fn mask(&self) -> u32 {
        self.slots - 1
    }
    fn slot(&self, i: u32) -> *mut u8 {
        let off = HEADER_SIZE + (((i & self.mask()) as usize) << self.log2);
        // SAFETY: inside the buffer.
        unsafe { self.buf.ptr().add(off) }
    }
    /// `n` bytes of element `i` from `off`.
    fn bytes(&self, i: u32, off: usize, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        // SAFETY: inside the element; no concurrent writer in these tests.
        unsafe { core::ptr::copy_nonoverlapping(self.slot(i).add(off), v.as_mut_ptr(), n) };
        v
    }
    fn put_bytes(&self, i: u32, off: usize, b: &[u8]) {
        // SAFETY: inside the element.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), self.slot(i).add(off), b.len()) };
    }
    fn producer(&self) -> u32 {
        self.word(128).load(Ordering::Acquire)
    }
    fn consumer(&self) -> u32 {
        self.word(256).load(Ordering::Acquire)
    }

    // ---- the kernel as consumer (SQ, RQ) ----

    /// Takes every published WQE: returns their slot numbers, then
    /// passes the consumer index over them (as the kernel does when they
    /// complete).
    fn take_all(&mut self) -> Vec<u32> {
        let prod = self.producer();
        assert!(prod <= self.mask(), "producer stored unmasked: {prod:#x}");
        let mut v = Vec::new();
        while self.kidx != prod {
            v.push(self.kidx);
            self.kidx = (self.kidx + 1) & self.mask();
        }
        v
    }
    /// Completes up to and excluding `idx` (masked consumer store).
    fn complete_to(&mut self, idx: u32) {
        self.word(256).store(idx & self.mask(), Ordering::Release);
    }
    /// Takes and completes everything published; returns the slots.
    fn consume_all(&mut self) -> Vec<u32> {
        let v = self.take_all();
        self.complete_to(self.kidx);
        v
    }

    // ---- the kernel as producer (CQ) ----

    /// Writes a CQE at the kernel's producer position and publishes it.
    fn push_cqe(&mut self, c: &[u8; 48]) {
        self.put_bytes(self.kidx, 0, c);
        self.kidx = (self.kidx + 1) & self.mask();
        self.word(128).store(self.kidx, Ordering::Release);
    }
}

/// Posting in these tests: the SGEs name no real memory, and the fake
/// kernel never dereferences them.
trait TestPost<W> {
    type Out;
    fn tpost(&mut self, w: &[W]) -> Self::Out;
}

impl<'a> TestPost<SendWr<'a>> for RxeSendQueue {
    type Out = core::result::Result<Posted, PostError>;
    fn tpost(&mut self, w: &[SendWr<'a>]) -> Self::Out {
        // SAFETY: see the trait: nothing dereferences the SGEs.
        unsafe { self.post(w) }
    }
}

impl<'a> TestPost<RecvWr<'a>> for RxeRecvQueue {
    type Out = core::result::Result<usize, PostError>;
    fn tpost(&mut self, w: &[RecvWr<'a>]) -> Self::Out {
        // SAFETY: see the trait: nothing dereferences the SGEs.
        unsafe { self.post(w) }
    }
}

fn put32(v: &mut [u8], off: usize, x: u32) {
    v[off..off + 4].copy_from_slice(&x.to_ne_bytes());
}
fn put64(v: &mut [u8], off: usize, x: u64) {
    v[off..off + 8].copy_from_slice(&x.to_ne_bytes());
}
fn get32(v: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(v[off..off + 4].try_into().unwrap())
}
fn get64(v: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(v[off..off + 8].try_into().unwrap())
}

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

fn sq(f: &Fake, c: QpCaps) -> RxeSendQueue {
    // SAFETY: the fake mapping outlives the queue in every test; SGEs are
    // never dereferenced.
    unsafe { RxeSendQueue::new(f.ptr(), f.len(), c) }.unwrap()
}

#[test]
fn header_validation() {
    let f = Fake::new(8, 16);
    // SAFETY: our own buffer, `len` bytes.
    let ok = unsafe { RxeQueue::new(f.ptr(), f.len(), 256) }.unwrap();
    assert_eq!(
        (ok.slots(), ok.capacity(), ok.elem_size(), ok.index_mask()),
        (16, 15, 256, 15)
    );
    let bad = |p: *mut u8, len: usize, min: usize| {
        // SAFETY: our buffer; every refusal below happens before any
        // element is touched, and only the header is read.
        unsafe { RxeQueue::new(p, len, min) }.err()
    };
    let g = Some(Error::InvalidGeometry);
    assert_eq!(bad(core::ptr::null_mut(), f.len(), 64), g, "null");
    assert_eq!(
        bad(f.ptr().wrapping_add(4), f.len() - 4, 64),
        g,
        "misaligned"
    );
    assert_eq!(bad(f.ptr(), 383, 64), g, "shorter than the header");
    assert_eq!(bad(f.ptr(), f.len() - 1, 64), g, "ring past the mapping");
    assert_eq!(bad(f.ptr(), f.len(), 257), g, "element too small");
    for (log2, mask) in [
        (17, 15),
        (2, 15),
        (8, 5),
        (8, 0),
        (8, u32::MAX),
        (8, (1 << 25) - 1),
    ] {
        f.word(0).store(log2, Ordering::Relaxed);
        f.word(4).store(mask, Ordering::Relaxed);
        assert_eq!(
            bad(f.ptr(), usize::MAX / 2, 0),
            g,
            "log2 {log2} mask {mask:#x}"
        );
    }
    // Send queue: the element must hold 208 + max(16 sge, inline).
    let f = Fake::new(8, 4);
    let try_sq = |c| {
        // SAFETY: our buffer, `len` bytes.
        unsafe { RxeSendQueue::new(f.ptr(), f.len(), c) }.err()
    };
    assert_eq!(try_sq(caps(3, 0, 0)), None, "208 + 48 = 256");
    assert_eq!(try_sq(caps(4, 0, 0)), g, "208 + 64 > 256");
    assert_eq!(try_sq(caps(1, 49, 0)), g, "208 + 49 > 256");
    assert_eq!(try_sq(caps(u32::MAX, u32::MAX, 0)), g);
    assert_eq!(sq::required_elem_size(&caps(2, 100, 0)), 308);
    // Receive queue: 40 + 16 sge.
    let f = Fake::new(6, 4);
    let try_rq = |c: QpCaps| {
        // SAFETY: our buffer, `len` bytes.
        unsafe { RxeRecvQueue::new(f.ptr(), f.len(), &c) }.err()
    };
    assert_eq!(try_rq(caps(0, 0, 1)), None);
    assert_eq!(try_rq(caps(0, 0, 2)), g, "40 + 32 > 64");
    // CQ: 48-byte entries at least.
    let f = Fake::new(5, 4);
    // SAFETY: our buffer.
    assert_eq!(unsafe { RxeCq::new(f.ptr(), f.len()) }.err(), g);
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
fn recv_wqe_bytes_full_and_wrap() {
    let mut f = Fake::new(7, 4);
    let c = caps(0, 0, 5);
    // SAFETY: our buffer, outliving the queue.
    let mut q = unsafe { RxeRecvQueue::new(f.ptr(), f.len(), &c) }.unwrap();
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
    let slots = f.take_all();
    for (wr, &slot) in wrs.iter().zip(&slots) {
        let mut e = vec![0u8; 40];
        put64(&mut e, 0, wr.wr_id);
        let n = wr.sges.len() as u32;
        let len: u32 = wr.sges.iter().map(|s| s.length).sum();
        put32(&mut e, 8, n);
        put32(&mut e, 16, len);
        put32(&mut e, 20, len);
        put32(&mut e, 28, n);
        for g in wr.sges {
            e.extend_from_slice(&g.addr.to_ne_bytes());
            e.extend_from_slice(&g.length.to_ne_bytes());
            e.extend_from_slice(&g.lkey.to_ne_bytes());
        }
        assert_eq!(f.bytes(slot, 0, e.len()), e);
    }
    // Full at capacity (3): one more is refused.
    let one = RecvWr {
        wr_id: 1,
        sges: &s[..1],
    };
    assert_eq!(
        q.tpost(&[one, one]),
        Err(PostError {
            index: 1,
            error: Error::RqFull
        })
    );
    assert_eq!(q.free_slots(), 0);
    // Refusals.
    let six = [Sge::new(0, 1, 1); 6];
    f.complete_to(f.kidx);
    // SAFETY: as above.
    let r = unsafe {
        q.post(&[RecvWr {
            wr_id: 1,
            sges: &six,
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
    q.set_state(QpState::Init);
    f.take_all();
    f.complete_to(f.kidx);
    // Wrap many times.
    let mut seen = 1000u64;
    for i in 0..300u64 {
        let wr = RecvWr {
            wr_id: 1000 + i,
            sges: &s[..1],
        };
        assert_eq!(q.tpost(&[wr]), Ok(1));
        for slot in f.consume_all() {
            assert_eq!(get64(&f.bytes(slot, 0, 8), 0), seen);
            seen += 1;
        }
    }
    assert_eq!(seen, 1300);
}

/// A CQE image (docs/spec/rxe.md §5 offsets).
#[allow(clippy::too_many_arguments)]
fn cqe(
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor: u32,
    len: u32,
    ex: u32,
    flags: u32,
) -> [u8; 48] {
    let mut c = [0u8; 48];
    put64(&mut c, 0, wr_id);
    put32(&mut c, 8, status);
    put32(&mut c, 12, opcode);
    put32(&mut c, 16, vendor);
    put32(&mut c, 20, len);
    put32(&mut c, 24, ex);
    put32(&mut c, 28, 0x12); // qp_num
    put32(&mut c, 32, 0x34); // src_qp
    put32(&mut c, 36, flags);
    c[40..42].copy_from_slice(&5u16.to_ne_bytes()); // pkey_index
    c[42..44].copy_from_slice(&0x99u16.to_ne_bytes()); // slid
    c[44] = 3; // sl
    c[45] = 1; // dlid_path_bits
    c[46] = 1; // port_num
    c
}

fn cq(f: &Fake) -> RxeCq {
    // SAFETY: our buffer, outliving the CQ.
    unsafe { RxeCq::new(f.ptr(), f.len()) }.unwrap()
}

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

#[test]
fn describe_and_find_failed_wqes() {
    let mut f = Fake::new(9, 8);
    let mut q = sq(&f, caps(3, 64, 0));
    let s = [Sge::new(0x1000, 10, 0x11), Sge::new(0x2000, 20, 0x22)];
    let s8 = [Sge::new(0x3000, 8, 0x33)];
    let data = [1u8; 24];
    let d: [&[u8]; 1] = [&data];
    let fa = Remote::new(0x9000, 0x99);
    let wrs = [
        SendWr::new(1, SendOp::Write { remote: R }, &s, SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Read { remote: R }, &s[1..], SendFlags::SIGNALED),
        SendWr::new(
            3,
            SendOp::FetchAdd { remote: fa, add: 1 },
            &s8,
            SendFlags::NONE,
        ),
        SendWr::inline(4, SendOp::Send, &d, SendFlags::NONE),
        SendWr::new(5, SendOp::SendImm { imm: 1 }, &[], SendFlags::NONE),
    ];
    q.tpost(&wrs).unwrap();
    assert_eq!(q.find(1), None, "outstanding WQEs are not searched");
    let slots = f.take_all();
    // The kernel scribbles its scratch fields (status, PSNs, cursors,
    // iova) while executing; describe reads none of them.
    for &sl in &slots {
        f.put_bytes(sl, 144, &[0xee; 40]);
        f.put_bytes(sl, 188, &[0xee; 4]);
        f.put_bytes(sl, 192, &[0xee; 4]);
        f.put_bytes(sl, 200, &[0xee; 4]);
    }
    f.complete_to(f.kidx);
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
            opcode: WcOpcode::FETCH_ADD,
            local_addr: 0x3000,
            length: 8,
            lkey: 0x33,
            remote_addr: fa.addr,
            rkey: fa.rkey,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 4,
            opcode: WcOpcode::SEND,
            length: 24,
            inline: true,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 5,
            opcode: WcOpcode::SEND,
            ..FailedWr::default()
        },
    ];
    for (e, &sl) in expect.iter().zip(&slots) {
        assert_eq!(q.find(e.wr_id), Some(sl));
        assert_eq!(q.describe(sl), *e);
    }
    assert_eq!(q.find(77), None);
    let wc = Wc {
        wr_id: 2,
        status: WcStatus::REM_ACCESS_ERR,
        vendor_err: 9,
        ..Wc::default()
    };
    let fw = q.failed_wr(slots[1], &wc);
    assert_eq!(
        (fw.status, fw.vendor_err, fw.remote_addr),
        (WcStatus::REM_ACCESS_ERR, 9, R.addr)
    );
    // Describing any slot, even garbage, stays in bounds.
    f.put_bytes(7, 0, &[0xff; 256]);
    let _ = q.describe(7);
    let _ = q.describe(u32::MAX);

    // Receive side.
    let mut f = Fake::new(7, 4);
    let c = caps(0, 0, 2);
    // SAFETY: our buffer.
    let mut r = unsafe { RxeRecvQueue::new(f.ptr(), f.len(), &c) }.unwrap();
    let rw = RecvWr {
        wr_id: 42,
        sges: &s,
    };
    r.tpost(&[rw]).unwrap();
    assert_eq!(r.find(42), None);
    f.consume_all();
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
        status: WcStatus::LOC_LEN_ERR,
        ..Wc::default()
    };
    assert_eq!(r.failed_wr(sl, &wc).status, WcStatus::LOC_LEN_ERR);
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

/// A raw pointer the kernel thread may carry.
struct Shared(*mut u8);
// SAFETY: the pointed-to buffers outlive the scoped threads, and every
// shared word is accessed atomically (the point of the test).
unsafe impl Send for Shared {}

/// The kernel on its own thread: it consumes the SQ and produces one CQE
/// per WQE, concurrently with the poster/poller. Any missing
/// acquire/release pair shows up as a data race under Miri (the WQE and
/// CQE payloads are plain accesses).
#[test]
fn concurrent_kernel_thread() {
    const N: u64 = if cfg!(miri) { 60 } else { 5000 };
    let sqf = Fake::new(8, 8);
    let cqf = Fake::new(7, 4);
    let mut q = sq(&sqf, caps(1, 0, 0));
    let mut c = cq(&cqf);
    let (sp, cp) = (Shared(sqf.ptr()), Shared(cqf.ptr()));
    std::thread::scope(|s| {
        s.spawn(move || {
            let (sq_base, cq_base) = (sp, cp);
            let w = |b: &Shared, off: usize| {
                // SAFETY: a header word of a live buffer.
                unsafe { &*b.0.add(off).cast::<AtomicU32>() }
            };
            let (mut k, mut cq_put) = (0u32, 0u32);
            let mut done = 0u64;
            while done < N {
                let prod = w(&sq_base, 128).load(Ordering::Acquire);
                if k == prod {
                    std::thread::yield_now();
                    continue;
                }
                // SAFETY: slot k of the SQ (256-byte elements), published.
                let wqe = unsafe { sq_base.0.add(HEADER_SIZE + ((k as usize) << 8)) };
                // SAFETY: as above; the kernel also scribbles scratch.
                let id = unsafe {
                    let id = wqe.cast::<u64>().read();
                    wqe.add(144).cast::<u32>().write(0x5ca7);
                    id
                };
                assert_eq!(id, done);
                // Wait for CQ space (one slot stays empty).
                while (cq_put + 1) & 3 == w(&cq_base, 256).load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                let mut e = cqe(id, 0, 1, 0, 8, 0, 0);
                put32(&mut e, 28, 7);
                // SAFETY: CQ slot cq_put (128-byte elements), free.
                unsafe {
                    let p = cq_base.0.add(HEADER_SIZE + ((cq_put as usize) << 7));
                    core::ptr::copy_nonoverlapping(e.as_ptr(), p, 48);
                }
                k = (k + 1) & 7;
                w(&sq_base, 256).store(k, Ordering::Release);
                cq_put = (cq_put + 1) & 3;
                w(&cq_base, 128).store(cq_put, Ordering::Release);
                done += 1;
            }
        });
        let s1 = [Sge::new(0x1000, 8, 1)];
        let (mut posted, mut polled) = (0u64, 0u64);
        let mut out = [Wc::default(); 4];
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
                assert_eq!(
                    (x.wr_id, x.qp_num, x.opcode),
                    (polled, 7, WcOpcode::RDMA_WRITE)
                );
                polled += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
    });
}
