//! Unit, corruption and two-thread tests of the ring over heap buffers.

use super::*;
use crate::util::AlignedBuf;
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

/// A seeded xorshift64 generator.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The payload of record `seq`: `len` bytes that depend on both.
pub(super) fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..len).map(|_| r.next() as u8).collect()
}

/// FNV-1a of `b`, never 0 (usable as a tag).
pub(super) fn check_tag(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &x in b {
        h = (h ^ u32::from(x)).wrapping_mul(0x0100_0193);
    }
    h | 1
}

/// A ring over a heap buffer.
fn ring(cap: usize) -> (AlignedBuf, RingTx, RingRx) {
    let buf = AlignedBuf::new(ring_bytes(cap));
    // SAFETY: the buffer outlives both ends in every test (dropped last).
    let tx = unsafe { RingTx::init(buf.ptr(), cap) }.unwrap();
    // SAFETY: as above.
    let rx = unsafe { RingRx::attach(buf.ptr(), buf.len()) }.unwrap();
    (buf, tx, rx)
}

/// The record's payload, after checking it lies in the data area.
fn read(buf: &AlignedBuf, cap: usize, rx: &RingRx, r: &Record) -> Vec<u8> {
    let data = buf.ptr() as usize + RING_HEADER;
    let p = r.ptr as usize;
    assert!(
        p >= data && p + r.len <= data + cap,
        "{r:?} outside the data area"
    );
    let mut v = vec![0u8; r.len];
    assert_eq!(rx.copy_payload(r, &mut v), r.len);
    v
}

#[test]
fn random_against_model() {
    let cap = 4096;
    let (buf, mut tx, mut rx) = ring(cap);
    let mut model: VecDeque<(u32, Vec<u8>)> = VecDeque::new();
    let mut rng = Rng(0x1234_5678);
    let (mut pushed, mut pads, mut refused) = (0u64, 0u64, 0u64);
    while pushed < 20_000 {
        if rng.below(100) < 55 {
            let len = match rng.below(10) {
                0 => rng.below(tx.max_payload() as u64 + 1) as usize,
                1..=3 => rng.below(9) as usize,
                _ => rng.below(200) as usize,
            };
            let p = payload(pushed, len);
            let cut = rng.below(len as u64 + 1) as usize;
            let tag = rng.below(u64::from(u32::MAX)) as u32 + 1;
            let (free, before) = (tx.free(), tx.head);
            if tx.push(tag, &[&p[..cut], &[], &p[cut..]]) {
                if tx.head - before > record_bytes(len) as u64 {
                    pads += 1;
                }
                model.push_back((tag, p));
                pushed += 1;
            } else {
                refused += 1;
                assert!(free < 2 * record_bytes(len), "refused with {free} free");
                assert_eq!(tx.head, before);
            }
        } else {
            match (rx.peek().unwrap(), model.front()) {
                (None, None) => {}
                (Some(r), Some((tag, p))) => {
                    assert_eq!(r.tag, *tag);
                    assert_eq!(&read(&buf, cap, &rx, &r), p);
                    assert_eq!(rx.peek().unwrap(), Some(r), "peek is idempotent");
                    rx.pop();
                    model.pop_front();
                }
                (got, want) => panic!("ring {got:?}, model {want:?}"),
            }
        }
    }
    while let Some((tag, p)) = model.pop_front() {
        let r = rx.peek().unwrap().unwrap();
        assert_eq!((r.tag, read(&buf, cap, &rx, &r)), (tag, p));
        rx.pop();
    }
    assert_eq!(rx.peek(), Ok(None));
    assert!(
        pads > 100 && refused > 100,
        "pads {pads}, refused {refused}"
    );
}

#[test]
fn full_ring_refuses_and_writes_nothing() {
    let (buf, mut tx, mut rx) = ring(4096);
    assert_eq!(tx.free(), 4096);
    let mut n = 0;
    while tx.push(7, &[&[0xee; 100]]) {
        n += 1;
    }
    assert_eq!(n, 4096 / 112);
    // 36 records of 112 bytes leave 64 at the end: a 112-byte record
    // needs a pad too (176 bytes) and is refused without a write.
    let (before, head) = (buf.bytes().to_vec(), tx.head);
    assert_eq!(tx.free(), 64);
    assert!(!tx.push(7, &[&[1; 100]]));
    assert!(!tx.push(7, &[&[1; 60], &[2; 40]]));
    assert_eq!(before, buf.bytes(), "a refused push wrote something");
    assert_eq!(tx.head, head);
    // A small one still fits before the end.
    assert!(tx.push(8, &[&[3; 50]]));
    assert_eq!(tx.free(), 0);
    // Nothing became visible: the first record is still the first.
    let r = rx.peek().unwrap().unwrap();
    assert_eq!((r.tag, r.len), (7, 100));
    rx.pop();
    assert!(tx.push(7, &[&[2; 100]]), "room after one pop");
}

#[test]
fn refused_pushes() {
    let (_buf, mut tx, mut rx) = ring(4096);
    assert_eq!(tx.max_payload(), 4096 / 4 - 8);
    assert!(!tx.push(0, &[b"x"]), "tag 0 is the pad");
    assert!(!tx.push(1, &[&[0; 1017]]));
    assert!(!tx.push(1, &[&[0; 1000], &[0; 17]]));
    assert!(tx.push(1, &[&[0; 1000], &[0; 16]]));
    assert!(tx.push(2, &[]));
    assert_eq!(rx.peek().unwrap().unwrap().len, 1016);
    rx.pop();
    let r = rx.peek().unwrap().unwrap();
    assert_eq!((r.tag, r.len), (2, 0));
    let buf = AlignedBuf::new(ring_bytes(1 << 16));
    // SAFETY: the buffer outlives the producer.
    let big = unsafe { RingTx::init(buf.ptr(), 1 << 16) }.unwrap();
    assert_eq!(big.max_payload(), (1 << 14) - 8);
}

#[test]
fn init_refuses_bad_geometry() {
    let buf = AlignedBuf::new(ring_bytes(16384));
    for cap in [0, 2048, 4095, 4097, 12288] {
        // SAFETY: the buffer holds ring_bytes(16384) >= ring_bytes(cap).
        assert!(unsafe { RingTx::init(buf.ptr(), cap) }.is_none(), "{cap}");
    }
    // SAFETY: as above; refused before any write.
    assert!(unsafe { RingTx::init(buf.ptr().add(8), 4096) }.is_none());
}

#[test]
fn close_is_seen_after_the_last_record() {
    let (_buf, mut tx, mut rx) = ring(4096);
    assert!(!rx.is_closed());
    for t in 1..=3 {
        assert!(tx.push(t, &[b"abc"]));
    }
    tx.close();
    assert!(!tx.push(4, &[b"abc"]), "push after close");
    for t in 1..=3 {
        assert!(!rx.is_closed(), "closed before record {t}");
        assert_eq!(rx.peek().unwrap().unwrap().tag, t);
        assert!(!rx.is_closed(), "closed before pop of {t}");
        rx.pop();
    }
    assert!(rx.is_closed());
    assert_eq!(rx.peek(), Ok(None));
}

#[test]
fn attach_refuses_bad_headers() {
    let buf = AlignedBuf::new(ring_bytes(8192));
    let attach = |len: usize| {
        // SAFETY: `len` is at most the buffer's length.
        unsafe { RingRx::attach(buf.ptr(), len) }.map(|_| ())
    };
    assert_eq!(attach(buf.len()), Err(RingError::BadHeader), "no magic");
    // SAFETY: the buffer outlives the producer.
    let _tx = unsafe { RingTx::init(buf.ptr(), 8192) }.unwrap();
    assert_eq!(attach(ring_bytes(8192)), Ok(()));
    assert_eq!(attach(ring_bytes(8192) - 1), Err(RingError::BadHeader));
    assert_eq!(attach(100), Err(RingError::BadHeader));
    // SAFETY: offset 8 is inside the buffer, 4096 bytes after it too.
    let misaligned = unsafe { RingRx::attach(buf.ptr().add(8), 4096) };
    assert_eq!(misaligned.map(|_| ()), Err(RingError::BadHeader));
    let set = |off: usize, v: &[u8]| {
        let mut saved = [0u8; 8];
        // SAFETY: header bytes of the buffer; the test is single-threaded.
        unsafe {
            ptr::copy_nonoverlapping(buf.ptr().add(off), saved.as_mut_ptr(), v.len());
            ptr::copy_nonoverlapping(v.as_ptr(), buf.ptr().add(off), v.len());
        }
        let r = attach(buf.len());
        // SAFETY: as above.
        unsafe { ptr::copy_nonoverlapping(saved.as_ptr(), buf.ptr().add(off), v.len()) };
        r
    };
    assert_eq!(set(0, b"RDFS"), Err(RingError::BadHeader), "magic");
    assert_eq!(
        set(4, &2u32.to_le_bytes()),
        Err(RingError::BadHeader),
        "version"
    );
    for cap in [0u64, 4095, 6144, 2048, 16384, 1 << 40, u64::MAX] {
        assert_eq!(
            set(8, &cap.to_le_bytes()),
            Err(RingError::BadHeader),
            "{cap}"
        );
    }
    assert_eq!(
        set(8, &4096u64.to_le_bytes()),
        Ok(()),
        "smaller capacity fits"
    );
    assert_eq!(attach(buf.len()), Ok(()), "restored");
}

/// A random 8-aligned data offset.
fn any_pos(rng: &mut Rng, cap: usize) -> usize {
    (rng.below(cap as u64 / 8) * 8) as usize
}

/// A plausible or random record header for offset `pos`.
fn garbage_word(rng: &mut Rng, cap: usize, pos: usize) -> u64 {
    let tag = if rng.below(3) == 0 {
        0
    } else {
        rng.next() >> 32
    };
    let len = match rng.below(5) {
        0 => rng.next() & 0xffff_ffff,
        1 => (cap - pos) as u64 - 8 + rng.below(3),
        2 => rng.below(cap as u64 / 4),
        _ => rng.below(cap as u64 + 16),
    };
    if rng.below(8) == 0 {
        rng.next()
    } else {
        len | tag << 32
    }
}

#[test]
fn garbage_never_escapes_the_data_area() {
    let cap = 4096;
    let buf = AlignedBuf::new(ring_bytes(cap));
    let data = buf.ptr() as usize + RING_HEADER;
    let mut rng = Rng(0xdead_beef);
    let (mut records, mut corrupt) = (0u64, 0u64);
    for round in 0..3000u64 {
        // SAFETY: the buffer outlives both ends (dropped each round).
        let mut tx = unsafe { RingTx::init(buf.ptr(), cap) }.unwrap();
        for i in 0..rng.below(60) {
            tx.push(i as u32 + 1, &[&payload(i, rng.below(300) as usize)]);
        }
        let mut rx = RingRx::over(ShmMem { base: buf.ptr() }, cap, cap / 4 - 8);
        rx.tail = tx.head.saturating_sub(rng.below(cap as u64)) & !7;
        rx.head = rx.tail;
        for _ in 0..rng.below(6) {
            let pos = any_pos(&mut rng, cap);
            // SAFETY: `pos + 8 <= cap`; single-threaded.
            unsafe { tx.mem.write_word(pos, garbage_word(&mut rng, cap, pos)) };
        }
        let head = match rng.below(4) {
            0 => rng.next(),
            1 => rx.tail.wrapping_add(rng.below(2 * cap as u64)),
            _ => rx.tail + (rng.below(cap as u64 / 8 + 1) * 8),
        };
        tx.mem.set_head(head, Ordering::Relaxed);
        for _ in 0..200 {
            if round % 7 == 0 {
                // The peer scribbles while we read.
                let pos = any_pos(&mut rng, cap);
                // SAFETY: as above.
                unsafe { tx.mem.write_word(pos, garbage_word(&mut rng, cap, pos)) };
            }
            match rx.peek() {
                Ok(Some(r)) => {
                    let p = r.ptr as usize;
                    assert!(p >= data && p + r.len <= data + cap, "{r:?}");
                    assert_ne!(r.tag, 0);
                    records += 1;
                    rx.pop();
                }
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(e, RingError::Corrupt);
                    corrupt += 1;
                    break;
                }
            }
        }
    }
    assert!(
        records > 1000 && corrupt > 500,
        "{records} records, {corrupt} corrupt"
    );
}

#[test]
fn two_threads_stress() {
    const N: u64 = 200_000;
    let cap = 8192;
    let (_buf, mut tx, mut rx) = ring(cap);
    let max = tx.max_payload() as u64 - 8;
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut rng = Rng(42);
            for seq in 0..N {
                let body = payload(seq, rng.below(max.min(300)) as usize);
                let tag = check_tag(&[&seq.to_le_bytes()[..], &body].concat());
                while !tx.push(tag, &[&seq.to_le_bytes(), &body]) {
                    std::thread::yield_now();
                }
            }
            tx.close();
        });
        let mut rng = Rng(42);
        let mut seq = 0u64;
        let mut v = vec![0u8; cap];
        loop {
            match rx.peek().unwrap() {
                Some(r) => {
                    let n = rx.copy_payload(&r, &mut v);
                    assert_eq!(n, 8 + rng.below(max.min(300)) as usize, "length of {seq}");
                    assert_eq!(check_tag(&v[..n]), r.tag, "checksum of {seq}");
                    assert_eq!(v[..8], seq.to_le_bytes(), "order");
                    rx.pop();
                    seq += 1;
                }
                None if rx.is_closed() => break,
                None => std::thread::yield_now(),
            }
        }
        assert_eq!(seq, N);
    });
}
