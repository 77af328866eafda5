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

mod completion;
mod concurrent;
mod defer;
mod failed_wr;
mod geometry;
mod recv;
mod send;

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

fn cq(f: &Fake) -> SiwCq {
    // SAFETY: our buffer, outliving the CQ.
    unsafe { SiwCq::new(f.ptr(), f.len(), f.n) }.unwrap()
}
