//! A single-producer single-consumer ring of byte records in memory shared
//! by two processes ([`RingTx`] writes, [`RingRx`] reads).
//!
//! Layout at `base` (written by the producer's [`RingTx::init`]):
//!
//! | offset | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 0      | magic `u32` (stored last, with Release)                 |
//! | 4      | version `u32`                                           |
//! | 8      | capacity `u64`: data bytes, a power of two              |
//! | 64     | `head: AtomicU64`, bytes published (producer only)      |
//! | 128    | `tail: AtomicU64`, bytes consumed (consumer only)       |
//! | 192    | `closed: AtomicU32` (producer only)                     |
//! | 256    | `capacity` data bytes                                   |
//!
//! `head` and `tail` run free (they never wrap back to 0); a position in
//! the data area is `counter & (capacity - 1)`. Each writer has its own
//! cache line, so the two processes never write the same line.
//!
//! A record is an 8-byte header (`len: u32` payload bytes, then `tag: u32`,
//! both little-endian) and the payload padded to 8 bytes, so every record
//! starts 8-byte aligned. A record never wraps around the end: when it does
//! not fit before the end, the producer first writes a pad record (tag 0)
//! whose length fills the rest exactly, and the record goes to offset 0.
//! The pad and the record are published by the same store of `head`.
//!
//! The largest payload is `capacity / 4 - 8`, so a record takes at most a
//! quarter of the ring: a pad then wastes less than a quarter, and a ring
//! always holds at least two records of any size however the positions lie.
//!
//! The consumer trusts nothing in the shared memory: the header is read
//! once at [`RingRx::attach`], `head` and each record header are read once
//! per use and validated, and payloads are handed out as raw pointer and
//! length only (never as a Rust reference, since the peer may still write
//! them). The producer never reads its own `head` back and only uses the
//! peer-written `tail` to decide whether there is room: a garbage `tail`
//! can make it overwrite unconsumed records (the peer's loss) but never
//! write outside the data area.
//!
//! The algorithm works on a [`RingMem`]: [`ShmMem`] over raw (shared)
//! memory in every build, and, in the loom models, a model memory whose
//! atomics and data words come from `crate::sync`, so loom sees every
//! access to the data area (see the `loom_tests` module).

use core::ptr;
use core::sync::atomic as raw_atomic;

use crate::sync::Ordering;

/// Bytes before the data area.
pub(crate) const RING_HEADER: usize = 256;
/// `"RDFR"` little-endian: the ring header's first word once initialised.
const MAGIC: u32 = u32::from_le_bytes(*b"RDFR");
/// Layout version; bumped on any change to the layout above.
const VERSION: u32 = 1;
/// Smallest data area [`RingTx::init`] accepts.
const MIN_CAPACITY: usize = 4096;
/// Largest data area (keeps every record length well inside a `u32`).
const MAX_CAPACITY: usize = 1 << 32;
/// Header field offsets.
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_CAPACITY: usize = 8;
pub(crate) const OFF_HEAD: usize = 64;
pub(crate) const OFF_TAIL: usize = 128;
const OFF_CLOSED: usize = 192;
/// Bytes of a record header.
const REC_HDR: usize = 8;

/// Bytes a ring with `capacity` data bytes occupies (header + data).
pub(crate) const fn ring_bytes(capacity: usize) -> usize {
    RING_HEADER + capacity
}

/// Bytes a record with `len` payload bytes takes in the data area.
const fn record_bytes(len: usize) -> usize {
    REC_HDR + ((len + 7) & !7)
}

/// The shared words a ring works on: the three counters and the data area.
/// Data offsets are in bytes from the start of the data area; callers keep
/// every access inside `capacity`.
pub(crate) trait RingMem {
    /// Loads `head`.
    fn head(&self, o: Ordering) -> u64;
    /// Stores `head`.
    fn set_head(&self, v: u64, o: Ordering);
    /// Loads `tail`.
    fn tail(&self, o: Ordering) -> u64;
    /// Stores `tail`.
    fn set_tail(&self, v: u64, o: Ordering);
    /// Loads `closed`.
    fn closed(&self, o: Ordering) -> u32;
    /// Stores `closed`.
    fn set_closed(&self, v: u32, o: Ordering);
    /// The address [`Record::ptr`] is relative to.
    fn data(&self) -> *mut u8;
    /// Writes the 8-byte word at `off` (8-aligned).
    ///
    /// # Safety
    /// `off + 8 <= capacity`.
    unsafe fn write_word(&self, off: usize, w: u64);
    /// Reads the 8-byte word at `off` (8-aligned) once.
    ///
    /// # Safety
    /// `off + 8 <= capacity`.
    unsafe fn read_word(&self, off: usize) -> u64;
    /// Copies `src` to `off`.
    ///
    /// # Safety
    /// `off + src.len() <= capacity`.
    unsafe fn write(&self, off: usize, src: &[u8]);
    /// Copies `dst.len()` bytes from `off` into `dst`.
    ///
    /// # Safety
    /// `off + dst.len() <= capacity`.
    unsafe fn read(&self, off: usize, dst: &mut [u8]);
}

/// A ring in raw memory, normally a shared mapping of another process.
///
/// Its atomics are `core`'s, not `crate::sync`'s: they are placed in memory
/// the peer process maps, which loom cannot model (as with device memory in
/// `crate::mmio`). The loom models check the same algorithm over their own
/// memory instead.
pub(crate) struct ShmMem {
    /// The ring header; the data area follows at `RING_HEADER`.
    base: *mut u8,
}

// SAFETY: `ShmMem` is a pointer to memory the creator of the ring end
// guaranteed valid for the end's life; nothing about it is tied to a
// thread. Concurrent access is only through the atomics and the positions
// the ring protocol hands to one side at a time.
unsafe impl Send for ShmMem {}

impl ShmMem {
    /// The atomic `u64` at header offset `off`.
    fn a64(&self, off: usize) -> &raw_atomic::AtomicU64 {
        // SAFETY: `off` is OFF_HEAD or OFF_TAIL, inside the header, which
        // init/attach checked is valid and 64-byte aligned for the end's
        // life; every access to these words in either process is atomic.
        unsafe { raw_atomic::AtomicU64::from_ptr(self.base.add(off).cast()) }
    }
    /// The atomic `u32` at header offset `off`.
    fn a32(&self, off: usize) -> &raw_atomic::AtomicU32 {
        // SAFETY: as in `a64` (OFF_MAGIC or OFF_CLOSED, 4-byte aligned).
        unsafe { raw_atomic::AtomicU32::from_ptr(self.base.add(off).cast()) }
    }
}

impl RingMem for ShmMem {
    fn head(&self, o: Ordering) -> u64 {
        self.a64(OFF_HEAD).load(o)
    }
    fn set_head(&self, v: u64, o: Ordering) {
        self.a64(OFF_HEAD).store(v, o)
    }
    fn tail(&self, o: Ordering) -> u64 {
        self.a64(OFF_TAIL).load(o)
    }
    fn set_tail(&self, v: u64, o: Ordering) {
        self.a64(OFF_TAIL).store(v, o)
    }
    fn closed(&self, o: Ordering) -> u32 {
        self.a32(OFF_CLOSED).load(o)
    }
    fn set_closed(&self, v: u32, o: Ordering) {
        self.a32(OFF_CLOSED).store(v, o)
    }
    fn data(&self) -> *mut u8 {
        self.base.wrapping_add(RING_HEADER)
    }
    unsafe fn write_word(&self, off: usize, w: u64) {
        // SAFETY: the caller keeps `off + 8` inside the data area, which
        // is 8-aligned (base is 64-aligned, RING_HEADER a multiple of 64).
        unsafe { ptr::write_volatile(self.data().add(off).cast::<u64>(), w.to_le()) }
    }
    unsafe fn read_word(&self, off: usize) -> u64 {
        // SAFETY: as in `write_word`; volatile, so the word is read exactly
        // once even though the peer may change it.
        u64::from_le(unsafe { ptr::read_volatile(self.data().add(off).cast::<u64>()) })
    }
    unsafe fn write(&self, off: usize, src: &[u8]) {
        // SAFETY: the caller keeps the range inside the data area; `src`
        // is the caller's own memory, so the ranges do not overlap.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.data().add(off), src.len()) }
    }
    unsafe fn read(&self, off: usize, dst: &mut [u8]) {
        // SAFETY: as in `write`, in the other direction.
        unsafe { ptr::copy_nonoverlapping(self.data().add(off), dst.as_mut_ptr(), dst.len()) }
    }
}

// Each end may move to the thread (or device loop) that drives it.
static_assertions::assert_impl_all!(RingTx: Send);
static_assertions::assert_impl_all!(RingRx: Send);

/// A record the consumer sees: its tag and where its payload lies in the
/// shared data area. The payload is the peer's memory: read it through the
/// raw pointer (or [`RingRx::copy_payload`]) and validate what you read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The producer's tag (never 0).
    pub tag: u32,
    /// First payload byte, inside the data area.
    pub ptr: *const u8,
    /// Payload bytes; `ptr..ptr + len` lies inside the data area.
    pub len: usize,
}

/// Why the consumer refuses a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingError {
    /// [`RingRx::attach`]: wrong magic or version, a capacity that is not a
    /// supported power of two, a region too short, or a misaligned base.
    BadHeader,
    /// [`RingRx::peek`]: `head` or a record header is impossible; the ring
    /// cannot be read further.
    Corrupt,
}

/// The producer end of a ring.
pub(crate) struct RingTx<M: RingMem = ShmMem> {
    /// The shared words.
    mem: M,
    /// Data bytes.
    cap: usize,
    /// Largest payload.
    max_payload: usize,
    /// Bytes published: the only copy the producer trusts.
    head: u64,
    /// The last valid `tail` seen (at most `head`, at least `head - cap`).
    tail: u64,
    /// `close` was called.
    closed: bool,
}

impl RingTx<ShmMem> {
    /// Initialises a ring at `base` and returns its producer end, or `None`
    /// if `capacity` is not a power of two in `4096..=2^32` or `base` is not
    /// 64-byte aligned. Works over any such memory: a [`super::shm`]
    /// segment, or a heap buffer in tests.
    ///
    /// # Safety
    /// `base` is valid and writable for `ring_bytes(capacity)` bytes for
    /// the RingTx's life, 64-byte aligned, and no other producer exists.
    pub(crate) unsafe fn init(base: *mut u8, capacity: usize) -> Option<RingTx> {
        if !capacity.is_power_of_two()
            || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity)
            || base as usize % 64 != 0
        {
            return None;
        }
        let mem = ShmMem { base };
        // Relaxed (all three): nobody may read them before the magic below
        // is published with Release.
        mem.set_head(0, Ordering::Relaxed);
        mem.set_tail(0, Ordering::Relaxed);
        mem.set_closed(0, Ordering::Relaxed);
        // SAFETY: offsets 4 and 8 are inside the header the caller vouched
        // for, and aligned for their types.
        unsafe {
            ptr::write_volatile(base.add(OFF_VERSION).cast::<u32>(), VERSION.to_le());
            ptr::write_volatile(
                base.add(OFF_CAPACITY).cast::<u64>(),
                (capacity as u64).to_le(),
            );
        }
        // Release: a consumer that reads the magic with Acquire also sees
        // the version, capacity and zeroed counters written above.
        mem.a32(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Some(RingTx::over(mem, capacity, capacity / 4 - REC_HDR))
    }
}

impl<M: RingMem> RingTx<M> {
    /// A producer over `mem` (its counters already zero).
    fn over(mem: M, cap: usize, max_payload: usize) -> RingTx<M> {
        RingTx {
            mem,
            cap,
            max_payload,
            head: 0,
            tail: 0,
            closed: false,
        }
    }

    /// The largest payload [`push`](Self::push) accepts: `capacity / 4 - 8`.
    pub(crate) fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Appends one record with `tag != 0` whose payload is the
    /// concatenation of `parts`; returns false (writing nothing visible)
    /// if there is no room now, the payload is too large, the tag is 0 or
    /// the ring is closed. Publishes with one Release store of `head`.
    pub(crate) fn push(&mut self, tag: u32, parts: &[&[u8]]) -> bool {
        // Release: see `push_ordered`.
        self.push_ordered(tag, parts, Ordering::Release)
    }

    /// [`push`](Self::push) with the ordering of the `head` store as a
    /// parameter, so a loom model can show a weaker one is caught.
    #[inline(always)]
    fn push_ordered(&mut self, tag: u32, parts: &[&[u8]], publish: Ordering) -> bool {
        if tag == 0 || self.closed {
            return false;
        }
        let mut len = 0usize;
        for p in parts {
            len = len.saturating_add(p.len());
        }
        if len > self.max_payload {
            return false;
        }
        let rec = record_bytes(len);
        let pos = (self.head as usize) & (self.cap - 1);
        let to_end = self.cap - pos;
        let need = if rec <= to_end { rec } else { to_end + rec };
        if need > self.free_with(self.tail) {
            self.refresh_tail();
            if need > self.free_with(self.tail) {
                return false;
            }
        }
        let mut at = pos;
        if rec > to_end {
            // SAFETY: `pos + 8 <= cap` (positions are 8-aligned, `to_end > 0`).
            unsafe { self.mem.write_word(pos, (to_end - REC_HDR) as u64) };
            at = 0;
        }
        // SAFETY: `at + rec <= cap` by the choice of `at`, and the bytes
        // `head..head + need` are free (the consumer is past them).
        unsafe {
            self.mem.write_word(at, len as u64 | (u64::from(tag) << 32));
            let mut off = at + REC_HDR;
            for p in parts {
                self.mem.write(off, p);
                off += p.len();
            }
        }
        self.head += need as u64;
        // `publish` is Release in production: the consumer's Acquire load
        // of `head` then sees the pad, the record header and the payload.
        self.mem.set_head(self.head, publish);
        true
    }

    /// Bytes free now. A push of `n` payload bytes succeeds whenever this
    /// is at least `2 * (8 + n rounded up to 8)` (the worst-case pad is
    /// shorter than the record); with less it may still fit.
    pub(crate) fn free(&self) -> usize {
        let t = self.load_tail().unwrap_or(self.tail);
        self.free_with(t)
    }

    /// Marks the ring closed; later pushes are refused. The consumer sees
    /// it after every record pushed before.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        // Release: ordered after every earlier `head` store, so a consumer
        // that sees `closed` with Acquire also sees the final `head`.
        self.mem.set_closed(1, Ordering::Release);
    }

    /// Free bytes if the consumer has consumed up to `tail`.
    fn free_with(&self, tail: u64) -> usize {
        self.cap - (self.head - tail) as usize
    }

    /// The peer's `tail` if it is possible (between `head - cap` and
    /// `head`, 8-aligned and not behind what we saw), else `None`.
    fn load_tail(&self) -> Option<u64> {
        // Acquire: the consumer stored `tail` with Release after reading
        // the records below it; we are about to overwrite that space.
        let t = self.mem.tail(Ordering::Acquire);
        let ok = t >= self.tail && t <= self.head && t % 8 == 0;
        ok.then_some(t)
    }

    /// Takes the peer's `tail` if it is possible; a garbage one is ignored
    /// (the ring then looks as full as it was).
    fn refresh_tail(&mut self) {
        if let Some(t) = self.load_tail() {
            self.tail = t;
        }
    }
}

/// The consumer end of a ring.
pub(crate) struct RingRx<M: RingMem = ShmMem> {
    /// The shared words.
    mem: M,
    /// Data bytes (read once at attach).
    cap: usize,
    /// Largest payload a valid record has.
    max_payload: usize,
    /// Bytes consumed: our own copy, always valid.
    tail: u64,
    /// The last `head` loaded and validated (`tail <= head <= tail + cap`).
    head: u64,
    /// The `tail` after the record `peek` returned, if any.
    next: Option<u64>,
}

impl RingRx<ShmMem> {
    /// Attaches to the ring at `base` that a producer initialised.
    ///
    /// # Safety
    /// `base` is valid for `len` bytes for the RingRx's life (a mapping of
    /// the producer's segment). Checks magic, version, capacity (a power of
    /// two in `4096..=2^32`), `RING_HEADER + capacity <= len` and 64-byte
    /// alignment of `base`; else `Err(BadHeader)`.
    pub(crate) unsafe fn attach(base: *mut u8, len: usize) -> Result<RingRx, RingError> {
        if len < RING_HEADER || base as usize % 64 != 0 {
            return Err(RingError::BadHeader);
        }
        let mem = ShmMem { base };
        // Acquire: pairs with init's Release store, so version and capacity
        // below are the producer's.
        if mem.a32(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(RingError::BadHeader);
        }
        // SAFETY: offsets 4 and 8 are inside the `len >= RING_HEADER` bytes
        // and aligned; read once each.
        let (version, cap) = unsafe {
            (
                u32::from_le(ptr::read_volatile(base.add(OFF_VERSION).cast::<u32>())),
                u64::from_le(ptr::read_volatile(base.add(OFF_CAPACITY).cast::<u64>())),
            )
        };
        let cap_ok = cap.is_power_of_two()
            && (MIN_CAPACITY as u64..=MAX_CAPACITY as u64).contains(&cap)
            && cap <= (len - RING_HEADER) as u64;
        if version != VERSION || !cap_ok {
            return Err(RingError::BadHeader);
        }
        let cap = cap as usize;
        Ok(RingRx::over(mem, cap, cap / 4 - REC_HDR))
    }
}

impl<M: RingMem> RingRx<M> {
    /// A consumer over `mem` with `cap` data bytes.
    fn over(mem: M, cap: usize, max_payload: usize) -> RingRx<M> {
        RingRx {
            mem,
            cap,
            max_payload,
            tail: 0,
            head: 0,
            next: None,
        }
    }

    /// The next record (pad records skipped), or `None` if the ring is
    /// empty. Calling it again before [`pop`](Self::pop) returns the same
    /// record. `head` and every record header are read once and validated:
    /// anything impossible is `Err(Corrupt)`, never an out-of-bounds
    /// pointer. The payload stays valid until `pop`.
    pub(crate) fn peek(&mut self) -> Result<Option<Record>, RingError> {
        if self.head == self.tail {
            // Acquire: pairs with the producer's Release store of `head`,
            // so the records below it are visible before we read them.
            let h = self.mem.head(Ordering::Acquire);
            let used = h.wrapping_sub(self.tail);
            if used > self.cap as u64 || used % 8 != 0 {
                return Err(RingError::Corrupt);
            }
            self.head = h;
        }
        let avail = self.head - self.tail;
        if avail == 0 {
            return Ok(None);
        }
        let mut pos = (self.tail as usize) & (self.cap - 1);
        let mut skip = 0u64;
        let mut avail = avail as usize;
        // SAFETY: `pos` is 8-aligned and below `cap`, so `pos + 8 <= cap`.
        let mut w = unsafe { self.mem.read_word(pos) };
        if w >> 32 == 0 {
            // A pad: it must fill the rest exactly and be followed by a
            // record (the producer publishes both at once); a pad at 0 is
            // never written.
            let to_end = self.cap - pos;
            if pos == 0 || (w & 0xffff_ffff) != (to_end - REC_HDR) as u64 || avail <= to_end {
                return Err(RingError::Corrupt);
            }
            avail -= to_end;
            skip = to_end as u64;
            pos = 0;
            // SAFETY: offset 0, and `cap >= 8`.
            w = unsafe { self.mem.read_word(0) };
            if w >> 32 == 0 {
                return Err(RingError::Corrupt);
            }
        }
        let len = (w & 0xffff_ffff) as usize;
        if len > self.max_payload {
            return Err(RingError::Corrupt);
        }
        let rec = record_bytes(len);
        if rec > avail || rec > self.cap - pos {
            return Err(RingError::Corrupt);
        }
        self.next = Some(self.tail + skip + rec as u64);
        Ok(Some(Record {
            tag: (w >> 32) as u32,
            ptr: self.mem.data().wrapping_add(pos + REC_HDR),
            len,
        }))
    }

    /// Consumes the record `peek` returned (one Release store of `tail`);
    /// does nothing if there is none.
    pub(crate) fn pop(&mut self) {
        if let Some(t) = self.next.take() {
            self.tail = t;
            // Release: our reads of the consumed records happen before the
            // producer (Acquire load of `tail`) reuses their space.
            self.mem.set_tail(t, Ordering::Release);
        }
    }

    /// Copies the first `min(rec.len, dst.len())` payload bytes of `rec`
    /// (a record `peek` returned and not yet popped) into `dst` and returns
    /// how many; 0 for a record whose range is not in the data area.
    pub(crate) fn copy_payload(&self, rec: &Record, dst: &mut [u8]) -> usize {
        let off = (rec.ptr as usize).wrapping_sub(self.mem.data() as usize);
        if off > self.cap || rec.len > self.cap - off {
            return 0;
        }
        let n = rec.len.min(dst.len());
        // SAFETY: `off + n <= cap`, checked above.
        unsafe { self.mem.read(off, &mut dst[..n]) };
        n
    }

    /// True when the producer closed the ring and every record before the
    /// close was consumed.
    pub(crate) fn is_closed(&self) -> bool {
        // Acquire (closed first): pairs with `close`'s Release store, so
        // the `head` loaded next is the final one.
        if self.mem.closed(Ordering::Acquire) == 0 {
            return false;
        }
        // Acquire: for the comparison only; nothing is read under it.
        self.mem.head(Ordering::Acquire) == self.tail
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod xproc_tests;

#[cfg(all(loom, test))]
mod loom_tests;
