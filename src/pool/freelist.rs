//! A lock-free free list of slot indices (a Treiber stack) and the slot
//! word it links through.
//!
//! **Head.** One `AtomicU64`: a 32-bit ABA tag in the high half, the index
//! of the top slot (or [`NIL`]) in the low half. Every successful push and
//! pop increments the tag, so a pop that read `(tag, i)` and `next(i)`
//! before being preempted cannot install a stale `next` after `i` was
//! popped and pushed back meanwhile: its compare-and-swap sees a new tag
//! and retries. (A stale CAS could only succeed after exactly 2^32
//! operations in between.)
//!
//! **Slot word.** One `AtomicU64` per slot:
//!
//! ```text
//!  63        33  32  31                       0
//! +------------+----+--------------------------+
//! | generation |live| next slot (free)         |
//! |  31 bits   |    | requested length (live)  |
//! +------------+----+--------------------------+
//! ```
//!
//! While a slot is on a free list the low half links to the next free slot
//! of its class. While it is handed out, the low half holds the length the
//! caller asked for (the statistics subtract it on free, so a C caller
//! cannot skew them by editing its copy) and the live bit is set. The
//! generation increments on every free: a C token names `(index,
//! generation)`, so a second free of the same token, or a token from an
//! earlier life of the slot, finds a word that does not match and is
//! refused.
//!
//! The algorithm is the classic one (R. K. Treiber, "Systems Programming:
//! Coping with Parallelism", IBM RJ 5118, 1986) with a version tag against
//! ABA; the orderings are argued at each atomic access below.

use crate::sync::{AtomicU64, Ordering};

/// End of a list.
pub(crate) const NIL: u32 = u32::MAX;
/// Most slots one pool can have (indices below [`NIL`]).
pub(crate) const MAX_SLOTS: usize = NIL as usize;

const LIVE: u64 = 1 << 32;
const GEN_SHIFT: u32 = 33;
/// Generations wrap at 2^31.
pub(crate) const GEN_MASK: u32 = (1 << 31) - 1;

/// The word of a free slot of generation `gen` whose successor is `next`.
#[inline(always)]
pub(crate) const fn free_word(gen: u32, next: u32) -> u64 {
    ((gen as u64) << GEN_SHIFT) | next as u64
}

/// The word of a handed-out slot of generation `gen`, asked for with `len`.
#[inline(always)]
pub(crate) const fn live_word(gen: u32, len: u32) -> u64 {
    ((gen as u64) << GEN_SHIFT) | LIVE | len as u64
}

/// The generation in a slot word.
#[inline(always)]
pub(crate) const fn gen_of(w: u64) -> u32 {
    (w >> GEN_SHIFT) as u32
}

/// True if the slot word is handed out.
#[inline(always)]
pub(crate) const fn is_live(w: u64) -> bool {
    w & LIVE != 0
}

/// The low half: next free slot, or the requested length of a live one.
#[inline(always)]
pub(crate) const fn low(w: u64) -> u32 {
    w as u32
}

#[inline(always)]
const fn pack(tag: u32, index: u32) -> u64 {
    ((tag as u64) << 32) | index as u64
}

#[inline(always)]
const fn tag_of(h: u64) -> u32 {
    (h >> 32) as u32
}

/// A Treiber stack of slot indices, linked through the slot words.
pub(crate) struct FreeList {
    head: AtomicU64,
}

impl FreeList {
    /// A list whose top is `first` (already linked through the words, or
    /// [`NIL`] for an empty list).
    pub(crate) fn new(first: u32) -> FreeList {
        FreeList {
            head: AtomicU64::new(pack(0, first)),
        }
    }

    /// Takes the top slot, if any. Lock-free: a failed CAS means another
    /// thread's push or pop succeeded.
    ///
    /// Ownership hand-over: the Acquire load (and the Acquire CAS) read the
    /// value written by the push that freed the slot (or a later RMW in the
    /// release sequence it heads: every CAS on the head is an RMW), so
    /// everything the previous holder wrote to the buffer, and the word the
    /// pusher stored, happen-before the new holder's use.
    #[inline(always)]
    pub(crate) fn pop(&self, words: &[AtomicU64]) -> Option<u32> {
        // Acquire: pairs with the Release CAS in `push_ordered` (see above).
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let top = head as u32;
            if top == NIL {
                return None;
            }
            // Relaxed: the Acquire that produced `head` orders this read
            // after the store of the push that put `top` there. If `top`
            // was popped meanwhile the value may be stale or a length; the
            // tag then differs and the CAS below fails.
            let next = low(words[top as usize].load(Ordering::Relaxed));
            // Success Acquire: as for the load (the buffer's previous
            // holder's writes). Failure Acquire: the returned head is used
            // as the next `head`, whose `next` word is read through it.
            match self.head.compare_exchange_weak(
                head,
                pack(tag_of(head).wrapping_add(1), next),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(top),
                Err(now) => head = now,
            }
        }
    }

    /// Puts slot `i` (now free, of generation `gen`) on top.
    #[inline(always)]
    pub(crate) fn push(&self, words: &[AtomicU64], i: u32, gen: u32) {
        // Release: publishes the link word and everything the freeing
        // thread wrote to the buffer to the thread that pops it next.
        self.push_ordered(words, i, gen, Ordering::Release)
    }

    /// [`FreeList::push`] with the publishing CAS's success ordering as a
    /// parameter, so the loom models can show that anything weaker than
    /// Release is caught.
    #[inline(always)]
    pub(crate) fn push_ordered(&self, words: &[AtomicU64], i: u32, gen: u32, publish: Ordering) {
        // Relaxed: only the index is used (as our successor); nothing is
        // read through it.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // Relaxed: the caller owns slot `i` (it is neither live nor on
            // a list), so this store has no competing writer; stale poppers
            // may read it, and their CAS then fails on the tag. The CAS
            // below publishes it.
            words[i as usize].store(free_word(gen, head as u32), Ordering::Relaxed);
            // Failure Relaxed: the new head only becomes our successor.
            match self.head.compare_exchange_weak(
                head,
                pack(tag_of(head).wrapping_add(1), i),
                publish,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// The top slot (a snapshot; for tests and teardown checks).
    #[cfg(test)]
    pub(crate) fn top(&self) -> u32 {
        // Relaxed: a snapshot.
        self.head.load(Ordering::Relaxed) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_fields_round_trip() {
        let w = free_word(GEN_MASK, 7);
        assert_eq!(gen_of(w), GEN_MASK);
        assert!(!is_live(w));
        assert_eq!(low(w), 7);
        let w = live_word(5, 1 << 30);
        assert_eq!(gen_of(w), 5);
        assert!(is_live(w));
        assert_eq!(low(w), 1 << 30);
        assert_eq!(low(free_word(0, NIL)), NIL);
    }

    #[test]
    fn lifo_order_and_empty() {
        // Slots 0 -> 1 -> 2 -> NIL.
        let words: std::vec::Vec<AtomicU64> = (0..3u32)
            .map(|i| AtomicU64::new(free_word(0, if i == 2 { NIL } else { i + 1 })))
            .collect();
        let l = FreeList::new(0);
        assert_eq!(l.pop(&words), Some(0));
        assert_eq!(l.pop(&words), Some(1));
        l.push(&words, 0, 1);
        assert_eq!(l.top(), 0);
        assert_eq!(gen_of(words[0].load(Ordering::Relaxed)), 1);
        assert_eq!(l.pop(&words), Some(0));
        assert_eq!(l.pop(&words), Some(2));
        assert_eq!(l.pop(&words), None);
        assert_eq!(l.top(), NIL);
    }
}
