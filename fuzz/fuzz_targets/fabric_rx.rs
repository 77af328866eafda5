//! `fabric_rx` (lean): the cross-process fabric's link ring and packet
//! headers as the receiving process sees them, with the other process
//! honest or hostile (`rdma_direct::testutil::fabric`, over the ring and
//! decoders the fabric runs; docs/spec/fabric.md §2-§3).
//!
//! One ring per input, over a buffer of exactly its size (ASan reports
//! any access outside it). The producer pushes records; the input may
//! also overwrite any bytes of the shared buffer at any time, as a broken
//! or malicious peer could.
//!
//! Input (`rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! cfg u8   bit 0: capacity 8192 (else 4096); bits 1-2: the mapping length
//!          the consumer is told (0 the buffer, 1 one byte short, 2 the
//!          header only, 3 the buffer); bit 3: start hostile (scribble the
//!          header before attaching, 8 bytes at u8 % 32 * 8)
//! ops... (at most 256), op u8 % 8:
//!   0 push: tag u8 (0 stays 0: refused), len u16 % (max_payload + 24)
//!   1 peek (and copy the payload)   2 pop   3 peek, pop
//!   4 scribble: off u16 % bytes, n u8 % 16, then n bytes
//!   5 scribble a word: which u8 % 4 (0 head := u64, 1 tail := u64,
//!     2 head := the published tail + (u16 & !7), 3 the record header at
//!     the published tail := len u16 | tag u8 << 32)
//!   6 close, then is_closed
//!   7 decode: 64 request header bytes and a payload length u16, then 16
//!     response header bytes and a payload length u16
//! ```
//!
//! Checked:
//! - while nobody scribbled, the consumer returns exactly the records
//!   pushed, in order (tag, length, payload bytes), `None` when all were
//!   popped, never an error; a push succeeds exactly when the model says
//!   it fits (tag not 0, not closed, payload at most `capacity / 4 - 8`,
//!   and its bytes, with a pad to the end when it does not fit before
//!   it, within `capacity - (pushed - popped)`); the consumer sees the
//!   close once every record before it was popped;
//! - whatever was scribbled, a returned record's payload lies inside the
//!   data area (8-aligned start, at most `capacity / 4 - 8` bytes) and its
//!   copy never goes past it; no access leaves the buffer (ASan);
//! - every request and response header (those in record payloads, and
//!   the raw ones of op 7) is accepted exactly when an independent model
//!   of the rules accepts it, and an accepted one re-encodes to the bytes
//!   it came from (the reserved bytes read as 0).
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use rdma_direct::testutil::fabric::{
    decode_req, decode_resp, Ring, HEADER, OFF_HEAD, OFF_TAIL, PACKET, REQ_HEADER, RESP_HEADER,
};
use rdma_direct_fuzz::Bytes;

/// Operations per input at most.
const MAX_OPS: usize = 256;
/// Bytes of a record header.
const REC_HDR: usize = 8;

/// Bytes a record of `len` payload bytes takes in the data area.
fn record_bytes(len: usize) -> usize {
    REC_HDR + ((len + 7) & !7)
}

/// The payload of the `n`th push: position- and sequence-dependent.
fn payload_byte(n: u64, i: usize) -> u8 {
    (n.wrapping_mul(131) as usize ^ i.wrapping_mul(7)) as u8
}

/// The rules of a request header (docs/spec/fabric.md §3), written from
/// the spec: known flags, rnr_retry at most 7, the packet inside its
/// message, FIRST at offset 0, LAST at the end, at most PACKET bytes, and
/// a payload of `len` bytes for WRITE and SEND, none for READ and the
/// atomics.
fn req_ok(h: &[u8; REQ_HEADER], payload: usize) -> bool {
    let le = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let (opcode, flags, rnr) = (h[4], h[5], h[6]);
    let (total, offset, len) = (le(16), le(20), le(24));
    let Some(end) = offset.checked_add(len) else {
        return false;
    };
    let reads = matches!(opcode, 0x10..=0x12); // RDMA_READ, ATOMIC_CS, ATOMIC_FA
    flags & !0x0f == 0
        && rnr <= 7
        && end <= total
        && len as usize <= PACKET
        && (flags & 1 == 0 || offset == 0)
        && (flags & 2 == 0 || end == total)
        && payload == if reads { 0 } else { len as usize }
}

/// The rules of a response header: a kind 1..=5, and a length (and
/// payload) of exactly what the kind carries: READ data up to PACKET, 8
/// for an atomic, nothing otherwise.
fn resp_ok(h: &[u8; RESP_HEADER], payload: usize) -> bool {
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let want = match h[4] {
        2 if len <= PACKET => len,
        2 => return false,
        3 => 8,
        1 | 4 | 5 => 0,
        _ => return false,
    };
    len == want && payload == want
}

/// The request decoder on `h` + `payload` bytes against the model.
fn check_req(h: &[u8; REQ_HEADER], payload: usize) {
    match decode_req(h, payload) {
        Some(back) => {
            assert!(
                req_ok(h, payload),
                "request accepted against the rules: {h:?} + {payload}"
            );
            let mut want = *h;
            want[7] = 0;
            want[60..].fill(0);
            assert_eq!(back, want, "request re-encoded differently");
        }
        None => assert!(!req_ok(h, payload), "request refused: {h:?} + {payload}"),
    }
}

/// The response decoder on `h` + `payload` bytes against the model.
fn check_resp(h: &[u8; RESP_HEADER], payload: usize) {
    match decode_resp(h, payload) {
        Some(back) => {
            assert!(
                resp_ok(h, payload),
                "response accepted against the rules: {h:?} + {payload}"
            );
            let mut want = *h;
            want[6..8].fill(0);
            want[12..].fill(0);
            assert_eq!(back, want, "response re-encoded differently");
        }
        None => assert!(!resp_ok(h, payload), "response refused: {h:?} + {payload}"),
    }
}

/// What the model knows of the honest stream.
struct Model {
    /// Pushed and not yet popped: (tag, len, push number, bytes it took).
    queue: VecDeque<(u32, usize, u64, usize)>,
    /// Bytes published (records and pads) and consumed.
    head: usize,
    tail: usize,
    pushes: u64,
    closed: bool,
    /// Someone scribbled: only the safety properties hold from now on.
    hostile: bool,
    /// The record the last peek returned (popped by the next pop).
    peeked: bool,
    /// The consumer accepted the header.
    attached: bool,
}

fn peek(ring: &mut Ring, m: &mut Model, buf: &mut [u8]) {
    let r = ring.peek();
    let cap = ring.capacity();
    if !m.attached {
        assert!(r.is_err(), "peek on a refused ring returned {r:?}");
        return;
    }
    if m.hostile {
        m.peeked = matches!(r, Ok(Some(_)));
        let Ok(Some(rec)) = r else { return };
        assert!(
            rec.offset % 8 == 0,
            "payload at {} is not 8-aligned",
            rec.offset
        );
        assert!(
            rec.offset >= REC_HDR && rec.offset <= cap,
            "payload at {} outside the data area",
            rec.offset
        );
        assert!(
            rec.len <= ring.max_payload(),
            "payload of {} bytes",
            rec.len
        );
        assert!(
            rec.len <= cap - rec.offset,
            "payload {}+{} past the data area",
            rec.offset,
            rec.len
        );
        let n = ring.copy_payload(&rec, buf);
        assert_eq!(n, rec.len.min(buf.len()));
        headers_in(&buf[..n]);
        return;
    }
    let r = r.expect("an honest ring refused as corrupt");
    match (r, m.queue.front()) {
        (None, None) => m.peeked = false,
        (Some(rec), Some(&(tag, len, n, _))) => {
            assert_eq!((rec.tag, rec.len), (tag, len), "record {n}");
            let got = ring.copy_payload(&rec, buf);
            assert_eq!(got, len);
            for (i, b) in buf[..len].iter().enumerate() {
                assert_eq!(*b, payload_byte(n, i), "record {n} byte {i}");
            }
            headers_in(&buf[..len]);
            m.peeked = true;
        }
        (r, q) => panic!("peek returned {r:?}, the model has {q:?}"),
    }
}

/// A payload read as a request (first 64 bytes) and as a response
/// (first 16), as the two ends of a link read theirs.
fn headers_in(p: &[u8]) {
    if let Some(h) = p.first_chunk::<REQ_HEADER>() {
        check_req(h, p.len() - REQ_HEADER);
    }
    if let Some(h) = p.first_chunk::<RESP_HEADER>() {
        check_resp(h, p.len() - RESP_HEADER);
    }
}

fn pop(ring: &mut Ring, m: &mut Model) {
    ring.pop();
    if !m.hostile && m.peeked {
        let (_, _, _, took) = m
            .queue
            .pop_front()
            .expect("popped a record the model lacks");
        m.tail += took;
    }
    m.peeked = false;
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let cfg = r.u8();
    let cap = if cfg & 1 != 0 { 8192 } else { 4096 };
    let mut ring = Ring::new(cap).expect("a valid capacity");
    let total = ring.bytes();
    let mut m = Model {
        queue: VecDeque::new(),
        head: 0,
        tail: 0,
        pushes: 0,
        closed: false,
        hostile: false,
        peeked: false,
        attached: false,
    };
    if cfg & 8 != 0 {
        let at = (r.u8() % 32) as usize * 8;
        ring.scribble(at, r.take(8));
        m.hostile = true;
    }
    let told = match (cfg >> 1) & 3 {
        1 => total - 1,
        2 => HEADER,
        _ => total,
    };
    let attached = ring.attach(told);
    m.attached = attached;
    // An intact header and a mapping that holds the data area: accepted.
    if !m.hostile {
        assert_eq!(
            attached,
            told >= HEADER + cap,
            "attach with a mapping of {told} bytes"
        );
    }
    let max = ring.max_payload();
    let src: Vec<u8> = vec![0; max + 24];
    let mut buf = vec![0u8; max];
    let mut payload = src;
    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        match r.u8() % 8 {
            0 => {
                let tag = u32::from(r.u8());
                let len = (r.u16() as usize) % (max + 24);
                let n = m.pushes;
                for (i, b) in payload[..len].iter_mut().enumerate() {
                    *b = payload_byte(n, i);
                }
                let ok = ring.push(tag, &payload[..len]);
                let rec = record_bytes(len);
                let pos = m.head % cap;
                let need = if rec <= cap - pos {
                    rec
                } else {
                    cap - pos + rec
                };
                if !m.hostile {
                    let fits =
                        tag != 0 && !m.closed && len <= max && need <= cap - (m.head - m.tail);
                    assert_eq!(
                        ok,
                        fits,
                        "push of {len} bytes, tag {tag}, {} free",
                        cap - (m.head - m.tail)
                    );
                }
                if ok {
                    m.pushes += 1;
                    m.head += need;
                    m.queue.push_back((tag, len, n, need));
                }
            }
            1 => peek(&mut ring, &mut m, &mut buf),
            2 => pop(&mut ring, &mut m),
            3 => {
                peek(&mut ring, &mut m, &mut buf);
                pop(&mut ring, &mut m);
            }
            4 => {
                let off = (r.u16() as usize) % total;
                let n = (r.u8() % 16) as usize;
                let bytes = r.take(n);
                ring.scribble(off, bytes);
                m.hostile |= !bytes.is_empty();
            }
            5 => {
                // The consumer's position, as it published it.
                let tail = ring.word(OFF_TAIL).unwrap_or(0);
                let (at, v) = match r.u8() % 4 {
                    0 => (OFF_HEAD, r.u64()),
                    1 => (OFF_TAIL, r.u64()),
                    // A head a little past the consumer: records claimed.
                    2 => (OFF_HEAD, tail.wrapping_add(u64::from(r.u16()) & !7)),
                    // The header of the record the consumer reads next,
                    // rewritten after it was published.
                    _ => {
                        let pos = (tail as usize) & (cap - 1);
                        let w = u64::from(r.u16()) | u64::from(r.u8()) << 32;
                        (HEADER + pos, w)
                    }
                };
                ring.scribble(at, &v.to_le_bytes());
                m.hostile = true;
            }
            6 => {
                ring.close();
                m.closed = true;
                let seen = ring.is_closed();
                if !m.hostile && attached {
                    assert_eq!(
                        seen,
                        m.queue.is_empty(),
                        "closed with {} records left",
                        m.queue.len()
                    );
                }
            }
            _ => {
                let mut req = [0u8; REQ_HEADER];
                let got = r.take(REQ_HEADER);
                req[..got.len()].copy_from_slice(got);
                let rp = r.u16() as usize;
                let mut resp = [0u8; RESP_HEADER];
                let got = r.take(RESP_HEADER);
                resp[..got.len()].copy_from_slice(got);
                let sp = r.u16() as usize;
                check_req(&req, rp);
                check_resp(&resp, sp);
            }
        }
        // The consumer's published tail is the model's while honest.
        if !m.hostile && attached {
            assert_eq!(ring.word(OFF_TAIL), Some(m.tail as u64), "tail");
        }
    }
});
