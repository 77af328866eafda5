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

mod completion;
mod concurrent;
mod defer;
mod failed_wr;
mod geometry;
mod recv;
mod send;
mod ud;

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
