//! Loom models of the shared-memory ring (run by `scripts/loom.sh`).
//!
//! Loom cannot see accesses to raw memory, so the models run the same
//! `RingTx`/`RingRx` code over [`ModelMem`]: the counters are loom
//! atomics and the data area is one loom `UnsafeCell<u64>` per 8-byte
//! word (records are 8-byte aligned and padded, so no word is ever shared
//! by two records). Every payload and record-header access is then a
//! tracked cell access, and a missing happens-before edge between the
//! producer writing a word and the consumer reading it (or the producer
//! reusing a word the consumer still reads) is a loom "Causality
//! violation".
//!
//! The data area is shrunk to 32 bytes with a 16-byte largest payload (the
//! production rule `capacity / 4 - 8` would allow no payload at all), so a
//! 24-byte record followed by a 16-byte one needs a pad and a wrap.
//!
//! Besides [`relaxed_publish_is_caught`] (kept as a test), these weakenings
//! were tried by hand, and each made a model fail in a fraction of a
//! second:
//! - `pop` storing `tail` Relaxed: `wrap_around_with_pad` reports a
//!   causality violation (the wrapped record overwrites words the
//!   consumer read);
//! - `close` storing `closed` Relaxed, or `is_closed` loading `head`
//!   before `closed`: `close_after_last_record` sees the ring closed with
//!   its record never consumed.

use super::*;
use crate::sync::{AtomicU32, AtomicU64, UnsafeCell};
use loom::sync::Arc;
use loom::thread;
use std::string::String;
use std::vec::Vec;

/// Data bytes of the model rings.
const CAP: usize = 32;
/// Largest payload of the model rings.
const MAX: usize = 16;

/// The shared state of a model ring.
struct Shared {
    head: AtomicU64,
    tail: AtomicU64,
    closed: AtomicU32,
    words: Vec<UnsafeCell<u64>>,
}

// SAFETY: the words are only reached through `UnsafeCell::with`/`with_mut`,
// which loom checks for unsynchronised access; the rest are atomics.
unsafe impl Sync for Shared {}

/// A model ring's memory, shared by both ends.
#[derive(Clone)]
struct ModelMem(Arc<Shared>);

impl RingMem for ModelMem {
    fn head(&self, o: Ordering) -> u64 {
        self.0.head.load(o)
    }
    fn set_head(&self, v: u64, o: Ordering) {
        self.0.head.store(v, o)
    }
    fn tail(&self, o: Ordering) -> u64 {
        self.0.tail.load(o)
    }
    fn set_tail(&self, v: u64, o: Ordering) {
        self.0.tail.store(v, o)
    }
    fn closed(&self, o: Ordering) -> u32 {
        self.0.closed.load(o)
    }
    fn set_closed(&self, v: u32, o: Ordering) {
        self.0.closed.store(v, o)
    }
    fn data(&self) -> *mut u8 {
        // An opaque base: only differences from it are used.
        self.0.words.as_ptr() as *mut u8
    }
    unsafe fn write_word(&self, off: usize, w: u64) {
        // SAFETY: loom tracks the exclusive access.
        self.0.words[off / 8].with_mut(|p| unsafe { *p = w })
    }
    unsafe fn read_word(&self, off: usize) -> u64 {
        // SAFETY: loom tracks the shared access.
        self.0.words[off / 8].with(|p| unsafe { *p })
    }
    unsafe fn write(&self, off: usize, src: &[u8]) {
        for (i, &b) in src.iter().enumerate() {
            let o = off + i;
            self.0.words[o / 8].with_mut(|p| {
                // SAFETY: loom tracks the exclusive access.
                let mut w = unsafe { *p }.to_le_bytes();
                w[o % 8] = b;
                // SAFETY: as above.
                unsafe { *p = u64::from_le_bytes(w) };
            });
        }
    }
    unsafe fn read(&self, off: usize, dst: &mut [u8]) {
        for (i, d) in dst.iter_mut().enumerate() {
            let o = off + i;
            // SAFETY: loom tracks the shared access.
            *d = self.0.words[o / 8].with(|p| unsafe { *p }).to_le_bytes()[o % 8];
        }
    }
}

/// Both ends of a fresh model ring.
fn pair() -> (RingTx<ModelMem>, RingRx<ModelMem>) {
    let m = ModelMem(Arc::new(Shared {
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
        closed: AtomicU32::new(0),
        words: (0..CAP / 8).map(|_| UnsafeCell::new(0)).collect(),
    }));
    (RingTx::over(m.clone(), CAP, MAX), RingRx::over(m, CAP, MAX))
}

/// Payload of record `tag` (`len` bytes).
fn body(tag: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (tag as u8) << 5 | i as u8).collect()
}

/// Pops one record if there is one and checks its payload; returns its tag.
fn take(rx: &mut RingRx<ModelMem>) -> Option<u32> {
    let r = rx.peek().expect("a model ring is never corrupt")?;
    let mut v = [0u8; MAX];
    let n = rx.copy_payload(&r, &mut v);
    assert_eq!(n, r.len);
    assert_eq!(v[..n], body(r.tag, n)[..], "payload of {}", r.tag);
    rx.pop();
    Some(r.tag)
}

/// Record 1 (16 bytes, 24 in the ring) then record 2 (8 bytes, 16 in the
/// ring) through 32 bytes: record 2 does not fit in the 8 bytes left at the
/// end, so the producer waits for the consumer to free record 1, writes a
/// pad and puts record 2 at offset 0, over record 1's words.
#[test]
fn wrap_around_with_pad() {
    loom::model(|| {
        let (mut tx, mut rx) = pair();
        let h = thread::spawn(move || {
            assert!(tx.push(1, &[&body(1, 16)]), "an empty ring takes it");
            while !tx.push(2, &[&body(2, 3), &body(2, 8)[3..]]) {
                thread::yield_now();
            }
            assert_eq!(tx.head, 24 + 8 + 16, "record, pad, record");
        });
        let mut got = Vec::new();
        while got.len() < 2 {
            match take(&mut rx) {
                Some(t) => got.push(t),
                None => thread::yield_now(),
            }
        }
        h.join().unwrap();
        assert_eq!(got, [1, 2]);
        assert_eq!(rx.peek(), Ok(None));
    });
}

/// A record, then the close: whenever the consumer sees the ring closed,
/// it has consumed the record.
#[test]
fn close_after_last_record() {
    loom::model(|| {
        let (mut tx, mut rx) = pair();
        let h = thread::spawn(move || {
            assert!(tx.push(1, &[&body(1, 8)]));
            tx.close();
            assert!(!tx.push(2, &[&body(2, 8)]), "closed");
        });
        let mut got = Vec::new();
        while !rx.is_closed() {
            match take(&mut rx) {
                Some(t) => got.push(t),
                None => thread::yield_now(),
            }
        }
        assert_eq!(got, [1], "closed before the record was consumed");
        h.join().unwrap();
        assert_eq!(rx.peek(), Ok(None));
    });
}

/// The wrap model's first record with `head` published Relaxed: loom must
/// find the consumer reading payload words the producer's writes are not
/// ordered before.
#[test]
fn relaxed_publish_is_caught() {
    let caught = std::panic::catch_unwind(|| {
        loom::model(|| {
            let (mut tx, mut rx) = pair();
            let h = thread::spawn(move || {
                assert!(tx.push_ordered(1, &[&body(1, 16)], Ordering::Relaxed));
            });
            while take(&mut rx).is_none() {
                thread::yield_now();
            }
            h.join().unwrap();
        });
    });
    let err = caught.expect_err("loom must catch the Relaxed publish");
    let msg = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("");
    assert!(
        msg.contains("Causality violation"),
        "unexpected failure: {msg}"
    );
}
