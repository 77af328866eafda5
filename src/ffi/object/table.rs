//! The handle table: slot allocation, handle encoding and the shared and
//! exclusive guards every call acquires its handles through.

use core::marker::PhantomData;
use core::mem::{self, size_of};
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use std::boxed::Box;
use std::sync::Mutex;
use std::vec::Vec;

use static_assertions::const_assert;

use crate::ffi::status::rdd_status;

// ---------------------------------------------------------------------
// Slot table
// ---------------------------------------------------------------------

// Kinds of object, as stored in a handle's low byte (never 0, so a handle
// is never NULL).
pub(super) const KIND_DEVICE: u8 = 1;
pub(super) const KIND_PD: u8 = 2;
pub(super) const KIND_MR: u8 = 3;
pub(super) const KIND_CQ: u8 = 4;
pub(super) const KIND_QP: u8 = 5;
/// The buffer pool (`ffi::pool`).
pub(in crate::ffi) const KIND_POOL: u8 = 6;
/// An exposure (`ffi::expose`).
pub(in crate::ffi) const KIND_EXPOSURE: u8 = 7;
/// A shared receive queue (`srq.rs`).
pub(super) const KIND_SRQ: u8 = 8;
/// An address handle (`ud.rs`).
pub(super) const KIND_AH: u8 = 9;
/// A bootstrapped mesh (`ffi::bootstrap`).
pub(in crate::ffi) const KIND_MESH: u8 = 10;
/// The TCP rendezvous (`ffi::bootstrap`).
pub(in crate::ffi) const KIND_TCP_AG: u8 = 11;

const INDEX_SHIFT: u32 = 8;
const INDEX_BITS: u32 = 20;
const GEN_SHIFT: u32 = 32;
/// Slots per chunk; chunks are allocated on demand and never freed.
const CHUNK_SLOTS: usize = 256;
/// Most live objects at once.
const MAX_SLOTS: usize = 1 << INDEX_BITS;
const MAX_CHUNKS: usize = MAX_SLOTS / CHUNK_SLOTS;

// State word: generation in the top half, kind in bits 16..24, a reader
// count in bits 2..16, the exclusive bit and the live bit.
const LIVE: u64 = 1 << 0;
const EXCL: u64 = 1 << 1;
const READER: u64 = 1 << 2;
const READERS: u64 = 0xfffc;
const KIND_SHIFT: u32 = 16;

// The handle is an integer cast to a pointer: it needs 64 bits.
const_assert!(size_of::<usize>() == 8);

/// One table entry, on its own cache line so that handles used by
/// different threads never share one.
#[repr(align(64))]
struct Slot {
    state: AtomicU64,
    obj: AtomicPtr<()>,
}

struct Chunk {
    slots: [Slot; CHUNK_SLOTS],
}

/// Chunk pointers; a chunk, once published, is never freed or moved, so a
/// slot reference is `'static`.
static CHUNKS: [AtomicPtr<Chunk>; MAX_CHUNKS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_CHUNKS];

/// Slot allocation (the only lock of the object API).
struct Alloc {
    free: Vec<u32>,
    next: u32,
}

static ALLOC: Mutex<Alloc> = Mutex::new(Alloc {
    free: Vec::new(),
    next: 0,
});

fn alloc_lock() -> std::sync::MutexGuard<'static, Alloc> {
    // The allocator's data stays consistent across a panic (every update
    // is a single push/pop/increment), so a poisoned lock is still usable.
    ALLOC.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slot at `index`, if its chunk exists.
#[inline(always)]
fn slot_at(index: u32) -> Option<&'static Slot> {
    let chunk = CHUNKS
        .get(index as usize / CHUNK_SLOTS)?
        .load(Ordering::Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: a non-NULL chunk pointer was published (Release) after the
    // chunk was fully initialised and is never freed; slots are only
    // accessed through their atomics.
    Some(unsafe { &(*chunk).slots[index as usize % CHUNK_SLOTS] })
}

#[inline(always)]
fn encode(gen: u32, index: u32, kind: u8) -> usize {
    ((gen as usize) << GEN_SHIFT) | ((index as usize) << INDEX_SHIFT) | kind as usize
}

#[inline(always)]
fn live_word(gen: u32, kind: u8) -> u64 {
    ((gen as u64) << GEN_SHIFT) | ((kind as u64) << KIND_SHIFT) | LIVE
}

/// The parts of a handle of `kind`: (generation, index), or
/// `INVALID_HANDLE` for a value that is not shaped like one.
#[inline(always)]
fn decode(h: usize, kind: u8) -> Result<(u32, u32), rdd_status> {
    let index = (h >> INDEX_SHIFT) & (MAX_SLOTS - 1);
    // Bits between the index and the generation are always 0.
    let stray =
        (h >> (INDEX_SHIFT + INDEX_BITS)) & ((1 << (GEN_SHIFT - INDEX_SHIFT - INDEX_BITS)) - 1);
    if h as u8 != kind || stray != 0 {
        return Err(rdd_status::InvalidHandle);
    }
    Ok(((h >> GEN_SHIFT) as u32, index as u32))
}

/// An object type stored in the table.
///
/// # Implementation safety
/// `KIND` must be unique per type: a slot's kind decides which type its
/// object pointer is cast to.
pub(in crate::ffi) unsafe trait Object: Send + Sync + 'static {
    const KIND: u8;
}

/// Stores `obj` in a free slot and returns its handle. On failure the
/// object is dropped (destroying what it owns) and
/// `RESOURCE_EXHAUSTED` returned.
pub(in crate::ffi) fn insert<T: Object>(obj: Box<T>) -> Result<usize, rdd_status> {
    let index = {
        let mut a = alloc_lock();
        match a.free.pop() {
            Some(i) => i,
            None => {
                let i = a.next;
                if i as usize >= MAX_SLOTS {
                    drop(a);
                    drop(obj);
                    return Err(rdd_status::ResourceExhausted);
                }
                let c = i as usize / CHUNK_SLOTS;
                if CHUNKS[c].load(Ordering::Relaxed).is_null() {
                    let chunk = Box::new(Chunk {
                        slots: [const {
                            Slot {
                                state: AtomicU64::new(0),
                                obj: AtomicPtr::new(ptr::null_mut()),
                            }
                        }; CHUNK_SLOTS],
                    });
                    // Leaked on purpose: slots live for the whole program.
                    CHUNKS[c].store(Box::into_raw(chunk), Ordering::Release);
                }
                a.next = i + 1;
                i
            }
        }
    };
    let slot = slot_at(index).expect("allocated chunk");
    // A free slot's state holds only the generation its next object gets.
    let gen = (slot.state.load(Ordering::Relaxed) >> GEN_SHIFT) as u32;
    slot.obj
        .store(Box::into_raw(obj).cast::<()>(), Ordering::Relaxed);
    // Publishes the object: an acquirer that sees LIVE sees the pointer
    // and everything the constructor wrote.
    slot.state.store(live_word(gen, T::KIND), Ordering::Release);
    Ok(encode(gen, index, T::KIND))
}

/// Exclusive access to a live object: no other guard on it exists.
pub(in crate::ffi) struct Excl<T: Object> {
    slot: &'static Slot,
    obj: NonNull<T>,
    live: u64,
    index: u32,
}

/// Shared access to a live object: only other shared guards exist.
pub(in crate::ffi) struct Shared<T: Object> {
    slot: &'static Slot,
    obj: NonNull<T>,
}

/// Looks `h` up: its slot and the state word it must have when live.
#[inline(always)]
fn lookup(h: usize, kind: u8) -> Result<(&'static Slot, u64, u32), rdd_status> {
    if h == 0 {
        return Err(rdd_status::NullParameter);
    }
    let (gen, index) = decode(h, kind)?;
    let slot = slot_at(index).ok_or(rdd_status::InvalidHandle)?;
    Ok((slot, live_word(gen, kind), index))
}

/// Acquires `h` exclusively.
#[inline(always)]
pub(in crate::ffi) fn excl<T: Object>(h: usize) -> Result<Excl<T>, rdd_status> {
    let (slot, live, index) = lookup(h, T::KIND)?;
    match slot
        .state
        .compare_exchange(live, live | EXCL, Ordering::Acquire, Ordering::Relaxed)
    {
        Ok(_) => {}
        Err(now) if now & !(EXCL | READERS) == live => return Err(rdd_status::ResourceBusy),
        Err(_) => return Err(rdd_status::InvalidHandle),
    }
    let obj = slot.obj.load(Ordering::Relaxed).cast::<T>();
    // Live implies a non-NULL object pointer (set before LIVE, cleared
    // after it is withdrawn).
    let obj = NonNull::new(obj).expect("live slot has an object");
    Ok(Excl {
        slot,
        obj,
        live,
        index,
    })
}

/// Acquires `h` shared.
#[inline(always)]
pub(in crate::ffi) fn shared<T: Object>(h: usize) -> Result<Shared<T>, rdd_status> {
    let (slot, live, _) = lookup(h, T::KIND)?;
    let mut now = slot.state.load(Ordering::Relaxed);
    loop {
        if now & !(EXCL | READERS) != live {
            return Err(rdd_status::InvalidHandle);
        }
        if now & EXCL != 0 || now & READERS == READERS {
            return Err(rdd_status::ResourceBusy);
        }
        match slot.state.compare_exchange_weak(
            now,
            now + READER,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(v) => now = v,
        }
    }
    let obj = slot.obj.load(Ordering::Relaxed).cast::<T>();
    let obj = NonNull::new(obj).expect("live slot has an object");
    Ok(Shared { slot, obj })
}

/// A live object's slot, remembered by another object so that it can be
/// acquired later without its handle being decoded again (a CQ's bound
/// QPs, `rdd_cq_poll_n`). The word it expects holds the generation and
/// the kind of `T`, so an acquisition only succeeds on that very object.
pub(in crate::ffi) struct SlotRef<T: Object> {
    slot: &'static Slot,
    live: u64,
    index: u32,
    _kind: PhantomData<fn() -> T>,
}

/// The slot of handle `h` of kind `T`, for [`excl_ref`] (the handle need
/// not be held, but must name a live object: a stale one is
/// `INVALID_HANDLE`).
pub(in crate::ffi) fn slot_ref<T: Object>(h: usize) -> Result<SlotRef<T>, rdd_status> {
    let (slot, live, index) = lookup(h, T::KIND)?;
    // Relaxed: only a plausibility check; every use is a CAS on the word.
    if slot.state.load(Ordering::Relaxed) & !(EXCL | READERS) != live {
        return Err(rdd_status::InvalidHandle);
    }
    Ok(SlotRef {
        slot,
        live,
        index,
        _kind: PhantomData,
    })
}

/// Acquires the object `r` names exclusively, as [`excl`] does for a
/// handle: one compare-and-swap, no decoding. `RESOURCE_BUSY` while
/// another guard on it exists, `INVALID_HANDLE` once it was destroyed.
#[inline(always)]
pub(in crate::ffi) fn excl_ref<T: Object>(r: &SlotRef<T>) -> Result<Excl<T>, rdd_status> {
    let (slot, live) = (r.slot, r.live);
    // Acquire: pairs with the Release of the previous guard's drop (or of
    // `insert`), so this call sees everything done under that guard.
    match slot
        .state
        .compare_exchange(live, live | EXCL, Ordering::Acquire, Ordering::Relaxed)
    {
        Ok(_) => {}
        Err(now) if now & !(EXCL | READERS) == live => return Err(rdd_status::ResourceBusy),
        Err(_) => return Err(rdd_status::InvalidHandle),
    }
    let obj = slot.obj.load(Ordering::Relaxed).cast::<T>();
    // Live (the CAS matched the live word, kind `T` included) implies a
    // non-NULL object pointer of type `T`.
    let obj = NonNull::new(obj).expect("live slot has an object");
    Ok(Excl {
        slot,
        obj,
        live,
        index: r.index,
    })
}

impl<T: Object> Deref for Excl<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot is live and held exclusively, so the object
        // exists and no other reference to it does (the kind check made
        // the cast correct, `Object` contract).
        unsafe { self.obj.as_ref() }
    }
}

impl<T: Object> DerefMut for Excl<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; exclusivity makes `&mut` sound.
        unsafe { self.obj.as_mut() }
    }
}

impl<T: Object> Drop for Excl<T> {
    fn drop(&mut self) {
        // Nobody else can change the word while EXCL is set.
        self.slot.state.store(self.live, Ordering::Release);
    }
}

impl<T: Object> Excl<T> {
    /// Withdraws the handle (every later use is `INVALID_HANDLE`), frees
    /// the slot and drops the object.
    pub(in crate::ffi) fn destroy(self) {
        let this = mem::ManuallyDrop::new(self);
        let p = this.slot.obj.swap(ptr::null_mut(), Ordering::Relaxed);
        let next_gen = ((this.live >> GEN_SHIFT) as u32).wrapping_add(1);
        this.slot
            .state
            .store((next_gen as u64) << GEN_SHIFT, Ordering::Release);
        alloc_lock().free.push(this.index);
        // SAFETY: `p` came from `Box::into_raw` of a `T` (kind checked at
        // acquisition) and was withdrawn from the slot above, so this is
        // the only owner.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
}

impl<T: Object> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot is live and held shared: the object exists and
        // only shared references to it exist (objects are `Sync`).
        unsafe { self.obj.as_ref() }
    }
}

impl<T: Object> Drop for Shared<T> {
    fn drop(&mut self) {
        self.slot.state.fetch_sub(READER, Ordering::Release);
    }
}

/// A value only reachable through `&mut`: sharing the wrapper shares
/// nothing, so it is `Sync` whatever `T` is.
pub(super) struct ExclusiveCell<T>(pub(super) T);

impl<T> ExclusiveCell<T> {
    pub(super) fn get_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

// SAFETY: no method gives access to `T` through `&ExclusiveCell<T>`, so a
// shared reference to it cannot be used to touch the value from two
// threads.
unsafe impl<T: Send> Sync for ExclusiveCell<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_encoding() {
        for (gen, index, kind) in [(0, 0, 1u8), (u32::MAX, (MAX_SLOTS - 1) as u32, 5)] {
            let v = encode(gen, index, kind);
            assert_ne!(v, 0);
            assert_eq!(decode(v, kind), Ok((gen, index)));
            assert_eq!(decode(v, kind + 1), Err(rdd_status::InvalidHandle));
            assert_eq!(decode(v | 1 << 29, kind), Err(rdd_status::InvalidHandle));
        }
    }
}
