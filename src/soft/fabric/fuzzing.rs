//! What the `fabric_rx` fuzz target drives (feature `test-utils`): both
//! ends of one link ring over a heap buffer that the target may also
//! scribble on, as a hostile or broken peer process could scribble on the
//! shared segment, and the packet-header decoders.
//!
//! Everything here is a thin wrapper: the ring algorithm and the decoders
//! are the ones the fabric runs (`ring.rs`, `wire.rs`); the wrapper only
//! turns the consumer's raw payload pointers into offsets the target can
//! check, and re-encodes decoded headers so the target can compare them
//! with the bytes it sent.

use std::ptr;

use super::ring::{ring_bytes, RingRx, RingTx, RING_HEADER};
use super::wire::{Req, Resp, REQ_BYTES, RESP_BYTES};
use crate::util::AlignedBuf;

/// Bytes before a ring's data area.
pub const HEADER: usize = RING_HEADER;
/// Header offset of the producer's counter (`head`).
pub const OFF_HEAD: usize = super::ring::OFF_HEAD;
/// Header offset of the consumer's counter (`tail`).
pub const OFF_TAIL: usize = super::ring::OFF_TAIL;
/// Largest packet payload (`wire::PACKET`).
pub const PACKET: usize = super::wire::PACKET;
/// Request and response header bytes.
pub const REQ_HEADER: usize = REQ_BYTES;
/// See [`REQ_HEADER`].
pub const RESP_HEADER: usize = RESP_BYTES;

/// A record the consumer returned: its tag, where its payload starts
/// (bytes from the start of the data area) and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rec {
    /// The producer's tag.
    pub tag: u32,
    /// Payload offset in the data area.
    pub offset: usize,
    /// Payload bytes.
    pub len: usize,
}

/// One ring, its producer end and (once attached) its consumer end, over
/// one buffer of exactly `HEADER + capacity` bytes.
pub struct Ring {
    // The ends hold raw pointers into `buf`; declared first, dropped first.
    tx: RingTx,
    rx: Option<RingRx>,
    buf: AlignedBuf,
    cap: usize,
}

impl Ring {
    /// A ring with `capacity` data bytes (a power of two, at least 4096),
    /// initialised by its producer; `None` for any other capacity.
    pub fn new(capacity: usize) -> Option<Ring> {
        if !capacity.is_power_of_two() || !(4096..=1 << 20).contains(&capacity) {
            return None;
        }
        let buf = AlignedBuf::new(ring_bytes(capacity));
        // SAFETY: `buf` is 4096-aligned, `ring_bytes(capacity)` bytes long
        // and owned by the returned value, which drops the ends first.
        let tx = unsafe { RingTx::init(buf.ptr(), capacity) }?;
        Some(Ring {
            tx,
            rx: None,
            buf,
            cap: capacity,
        })
    }

    /// Data bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Total bytes of the buffer (header and data).
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// The largest payload the producer accepts.
    pub fn max_payload(&self) -> usize {
        self.tx.max_payload()
    }

    /// Attaches the consumer, telling it the mapping is `len` bytes (at
    /// most the buffer's); true when it accepted the header.
    pub fn attach(&mut self, len: usize) -> bool {
        let len = len.min(self.buf.len());
        self.rx = None;
        // SAFETY: the buffer is valid for `len <= buf.len()` bytes for as
        // long as `self` (and so the consumer) lives.
        match unsafe { RingRx::attach(self.buf.ptr(), len) } {
            Ok(rx) => {
                self.rx = Some(rx);
                true
            }
            Err(_) => false,
        }
    }

    /// Overwrites buffer bytes from `off` with `bytes` (clipped to the
    /// buffer), as another process could at any time.
    pub fn scribble(&mut self, off: usize, bytes: &[u8]) {
        let len = self.buf.len();
        if off >= len {
            return;
        }
        let n = bytes.len().min(len - off);
        // SAFETY: `off + n <= len`; the ends read these bytes only through
        // volatile and atomic accesses, as they would a peer's writes.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.buf.ptr().add(off), n) };
    }

    /// The little-endian `u64` at buffer offset `off` (8-aligned, inside).
    pub fn word(&self, off: usize) -> Option<u64> {
        if off % 8 != 0 || off + 8 > self.buf.len() {
            return None;
        }
        // SAFETY: inside the buffer and aligned; read once.
        Some(u64::from_le(unsafe {
            ptr::read_volatile(self.buf.ptr().add(off).cast::<u64>())
        }))
    }

    /// The producer's push of one record; false when it refused.
    pub fn push(&mut self, tag: u32, payload: &[u8]) -> bool {
        self.tx.push(tag, &[payload])
    }

    /// The producer's close.
    pub fn close(&mut self) {
        self.tx.close()
    }

    /// The consumer's peek: `Err(())` for a ring it refuses as corrupt (or
    /// when it is not attached).
    #[allow(clippy::result_unit_err)]
    pub fn peek(&mut self) -> Result<Option<Rec>, ()> {
        let data = self.buf.ptr() as usize + HEADER;
        let rx = self.rx.as_mut().ok_or(())?;
        match rx.peek() {
            Ok(Some(r)) => Ok(Some(Rec {
                tag: r.tag,
                // Wrapping: a bad pointer shows as a huge offset.
                offset: (r.ptr as usize).wrapping_sub(data),
                len: r.len,
            })),
            Ok(None) => Ok(None),
            Err(_) => Err(()),
        }
    }

    /// The consumer's pop.
    pub fn pop(&mut self) {
        if let Some(rx) = self.rx.as_mut() {
            rx.pop();
        }
    }

    /// The consumer's copy of the payload of `rec` (the last peeked
    /// record) into `dst`; how many bytes it copied.
    pub fn copy_payload(&mut self, rec: &Rec, dst: &mut [u8]) -> usize {
        let Some(rx) = self.rx.as_ref() else {
            return 0;
        };
        let r = super::ring::Record {
            tag: rec.tag,
            ptr: (self.buf.ptr() as usize + HEADER).wrapping_add(rec.offset) as *const u8,
            len: rec.len,
        };
        rx.copy_payload(&r, dst)
    }

    /// The consumer's view of a closed ring (false when not attached).
    pub fn is_closed(&self) -> bool {
        self.rx.as_ref().is_some_and(|rx| rx.is_closed())
    }
}

/// Decodes a request header followed by `payload` bytes, as the
/// responder does; the decoded header re-encoded, or `None` if refused.
pub fn decode_req(h: &[u8; REQ_BYTES], payload: usize) -> Option<[u8; REQ_BYTES]> {
    Req::decode(h, payload).ok().map(|r| r.encode())
}

/// Decodes a response header followed by `payload` bytes, as the
/// requester does; re-encoded, or `None` if refused.
pub fn decode_resp(h: &[u8; RESP_BYTES], payload: usize) -> Option<[u8; RESP_BYTES]> {
    Resp::decode(h, payload).ok().map(|r| r.encode())
}
