//! The allocator behind [`BufferPool`](super::BufferPool) and the C pool:
//! size classes carved out of one region at creation, a lock-free free list
//! per class, and relaxed statistics counters. It knows nothing of devices
//! (it is handed the region's keys), so the Rust and C front ends and the
//! loom models share it.
//!
//! Layout: classes are placed largest first from the region's start, so
//! power-of-two buffers are naturally aligned (up to the page), and every
//! buffer starts on a 64-byte boundary (class sizes are multiples of 64).

mod plan;

use core::ptr::NonNull;
use std::boxed::Box;
use std::vec::Vec;

use super::freelist::{free_word, gen_of, is_live, live_word, low, FreeList, GEN_MASK, NIL};
use super::region;
use super::region::Region;
use super::{ClassStats, PoolStats};
use crate::api::MrKeys;
use crate::attr::Access;
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Ordering};

pub(crate) use plan::Plan;

/// One size class: its free list and counters on one cache line (an
/// allocation touches all of them, so they travel together).
#[repr(align(64))]
pub(crate) struct Class {
    free: FreeList,
    /// Buffers handed out.
    in_use: AtomicU64,
    /// Sum of the lengths asked for by the buffers handed out.
    requested: AtomicU64,
    /// Most buffers handed out at once.
    high_water: AtomicU64,
    size: u32,
    /// Index of the class's first slot.
    first: u32,
    count: u32,
    /// Byte offset of the first slot in the region.
    offset: usize,
}

/// A buffer handed out: where it is and what frees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grant {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) index: u32,
    pub(crate) gen: u32,
    pub(crate) class: u32,
    pub(crate) len: u32,
}

/// Size classes over one region.
pub(crate) struct Slab {
    classes: Box<[Class]>,
    /// One word per slot (see [`super::freelist`]).
    words: Box<[AtomicU64]>,
    region: Region,
    keys: MrKeys,
    access: Access,
    max_size: usize,
    /// `first_fit[c]`: the first class whose size exceeds `2^(c-1)` (every
    /// class for `c = 0`), so a length whose ceiling log2 is `c` fits in
    /// that class or a later one: the search starts there (for power-of-two
    /// classes it is the answer).
    first_fit: [u8; 32],
}

impl Slab {
    /// Carves `region` (of at least `plan.len` bytes, registered with
    /// `keys` and `access`) into the planned classes; every slot starts
    /// free.
    pub(crate) fn new(plan: &Plan, region: Region, keys: MrKeys, access: Access) -> Slab {
        debug_assert!(region.len() >= plan.len);
        let total: usize = plan.classes.iter().map(|c| c.count as usize).sum();
        let mut words = Vec::with_capacity(total);
        let mut classes = Vec::with_capacity(plan.classes.len());
        // Offsets: largest class first.
        let mut offsets = std::vec![0usize; plan.classes.len()];
        let mut off = 0usize;
        for (k, c) in plan.classes.iter().enumerate().rev() {
            offsets[k] = off;
            off += c.size as usize * c.count as usize;
        }
        for (k, c) in plan.classes.iter().enumerate() {
            let first = words.len() as u32;
            for j in 0..c.count {
                let next = if j + 1 == c.count { NIL } else { first + j + 1 };
                words.push(AtomicU64::new(free_word(0, next)));
            }
            classes.push(Class {
                free: FreeList::new(first),
                in_use: AtomicU64::new(0),
                requested: AtomicU64::new(0),
                high_water: AtomicU64::new(0),
                size: c.size,
                first,
                count: c.count,
                offset: offsets[k],
            });
        }
        let max_size = plan.classes.last().map_or(0, |c| c.size as usize);
        let mut first_fit = [0u8; 32];
        for (c, f) in first_fit.iter_mut().enumerate().skip(1) {
            let floor = (1u64 << (c - 1)) + 1;
            // At most MAX_CLASSES (64): fits a u8.
            *f = plan.classes.partition_point(|k| u64::from(k.size) < floor) as u8;
        }
        Slab {
            classes: classes.into_boxed_slice(),
            words: words.into_boxed_slice(),
            region,
            keys,
            access,
            max_size,
            first_fit,
        }
    }

    /// The region's keys.
    #[inline(always)]
    pub(crate) fn keys(&self) -> MrKeys {
        self.keys
    }

    /// The access the region was registered with.
    pub(crate) fn access(&self) -> Access {
        self.access
    }

    /// The region.
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// The largest class size.
    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    /// Number of classes.
    pub(crate) fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// The size of class `k`.
    #[inline(always)]
    pub(crate) fn class_size(&self, k: u32) -> u32 {
        self.classes[k as usize].size
    }

    /// The first byte of slot `index` of class `k`.
    #[inline(always)]
    fn slot_ptr(&self, c: &Class, index: u32) -> NonNull<u8> {
        let off = c.offset + (index - c.first) as usize * c.size as usize;
        // SAFETY: `index` is one of the class's slots, so `off` plus the
        // class size is within the planned layout, which fits the region
        // (`Slab::new`); the region is one allocation.
        unsafe { self.region.base().add(off) }
    }

    /// Hands out a buffer of at least `len` bytes from the smallest class
    /// that fits and has one free, trying larger classes when a class is
    /// empty. No allocation, lock or system call.
    ///
    /// [`Error::InvalidAttribute`] for `len` 0 or above the largest class;
    /// [`Error::ResourceExhausted`] when the fitting class and every larger
    /// one are empty.
    #[inline]
    pub(crate) fn alloc(&self, len: usize) -> Result<Grant> {
        if len == 0 || len > self.max_size {
            return Err(Error::InvalidAttribute);
        }
        // ceil(log2(len)) <= 30, as len <= MAX_CLASS_SIZE.
        let log = (usize::BITS - (len - 1).leading_zeros()) as usize;
        let mut start = self.first_fit[log & 31] as usize;
        // Terminates within the slice: the last class fits (len <= max).
        while (self.classes[start].size as usize) < len {
            start += 1;
        }
        for (k, c) in self.classes.iter().enumerate().skip(start) {
            let Some(index) = c.free.pop(&self.words) else {
                continue;
            };
            let w = &self.words[index as usize];
            // Relaxed: the slot is ours (popped); its word was published by
            // the push that freed it, which the pop acquired.
            let gen = gen_of(w.load(Ordering::Relaxed));
            // Relaxed: only the owner (us) and `free` touch a popped slot's
            // word, and `free` needs a token the caller gets from us through
            // its own synchronisation (a CAS always sees the latest value).
            w.store(live_word(gen, len as u32), Ordering::Relaxed);
            // Relaxed counters: statistics only; no memory is published
            // through them.
            let now = c.in_use.fetch_add(1, Ordering::Relaxed) + 1;
            c.requested.fetch_add(len as u64, Ordering::Relaxed);
            if now > c.high_water.load(Ordering::Relaxed) {
                c.high_water.fetch_max(now, Ordering::Relaxed);
            }
            return Ok(Grant {
                ptr: self.slot_ptr(c, index),
                index,
                gen,
                class: k as u32,
                len: len as u32,
            });
        }
        Err(Error::ResourceExhausted)
    }

    /// Returns slot `index` of class `k`, handed out as generation `gen`.
    /// A slot that is not live with that generation (already freed, or
    /// freed and handed out again) is [`Error::NoSuchObject`] and nothing
    /// changes; of two concurrent frees of one grant exactly one succeeds.
    #[inline]
    pub(crate) fn free(&self, k: u32, index: u32, gen: u32) -> Result<()> {
        let c = &self.classes[k as usize];
        let w = &self.words[index as usize];
        // Relaxed: the CAS below re-checks against the latest value.
        let cur = w.load(Ordering::Relaxed);
        if !is_live(cur) || gen_of(cur) != gen {
            return Err(Error::NoSuchObject);
        }
        let next_gen = gen.wrapping_add(1) & GEN_MASK;
        // Relaxed: this CAS only decides which free wins; the buffer's
        // contents are published by the push's Release CAS below.
        if w.compare_exchange(
            cur,
            free_word(next_gen, NIL),
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .is_err()
        {
            return Err(Error::NoSuchObject);
        }
        // Relaxed counters: statistics only. Decremented before the push,
        // so `in_use` never counts more buffers than are handed out.
        c.in_use.fetch_sub(1, Ordering::Relaxed);
        c.requested
            .fetch_sub(u64::from(low(cur)), Ordering::Relaxed);
        c.free.push(&self.words, index, next_gen);
        Ok(())
    }

    /// The class whose slots include `index`, if any.
    #[cfg_attr(not(feature = "ffi"), allow(dead_code))] // used by the C API
    fn class_of(&self, index: u32) -> Option<u32> {
        let k = self
            .classes
            .partition_point(|c| c.first as u64 + c.count as u64 <= index as u64);
        (k < self.classes.len()).then_some(k as u32)
    }

    /// Frees the buffer a C caller names by `token` (see [`Grant::token`]),
    /// checking that `addr` and `lkey` are the ones it was handed: a token
    /// that is forged, from another pool, already freed, or from an
    /// earlier life of its slot is [`Error::NoSuchObject`].
    #[cfg_attr(not(feature = "ffi"), allow(dead_code))] // used by the C API
    pub(crate) fn free_token(&self, token: u64, addr: u64, lkey: u32) -> Result<()> {
        let index = token as u32;
        let gen = (token >> 32) as u32;
        if index as usize >= self.words.len() || gen > GEN_MASK || lkey != self.keys.lkey {
            return Err(Error::NoSuchObject);
        }
        let k = self.class_of(index).ok_or(Error::NoSuchObject)?;
        let c = &self.classes[k as usize];
        if self.slot_ptr(c, index).as_ptr() as u64 != addr {
            return Err(Error::NoSuchObject);
        }
        self.free(k, index, gen)
    }

    /// Counters of class `k` (a relaxed snapshot: under concurrent use the
    /// fields may be from slightly different moments).
    pub(crate) fn class_stats(&self, k: usize) -> Option<ClassStats> {
        let c = self.classes.get(k)?;
        // Relaxed: statistics snapshots.
        let in_use = (c.in_use.load(Ordering::Relaxed) as u32).min(c.count);
        Some(ClassStats {
            size: c.size as usize,
            capacity: c.count,
            in_use,
            free: c.count - in_use,
            high_water: c.high_water.load(Ordering::Relaxed) as u32,
            bytes_requested: c.requested.load(Ordering::Relaxed),
        })
    }

    /// Totals over every class (a relaxed snapshot).
    pub(crate) fn stats(&self) -> PoolStats {
        let mut s = PoolStats {
            region_bytes: self.region.len(),
            buffers_in_use: 0,
            bytes_in_use: 0,
            bytes_requested: 0,
        };
        for k in 0..self.classes.len() {
            if let Some(c) = self.class_stats(k) {
                s.buffers_in_use += u64::from(c.in_use);
                s.bytes_in_use += u64::from(c.in_use) * c.size as u64;
                s.bytes_requested += c.bytes_requested;
            }
        }
        s
    }

    /// Buffers handed out in all classes.
    #[cfg_attr(not(feature = "ffi"), allow(dead_code))] // used by the C API
    pub(crate) fn in_use(&self) -> u64 {
        self.classes
            .iter()
            // Relaxed: see `class_stats`; exact once every user of the
            // pool has synchronised with the caller.
            .map(|c| c.in_use.load(Ordering::Relaxed))
            .sum()
    }
}

impl Grant {
    /// The C token: generation in the high half, slot index in the low.
    #[cfg_attr(not(feature = "ffi"), allow(dead_code))] // used by the C API
    #[inline(always)]
    pub(crate) fn token(&self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.index)
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::plan::ClassPlan;
    use super::*;

    /// A slab over heap memory with made-up keys, without a device.
    pub(crate) fn slab(classes: &[(u32, u32)]) -> Slab {
        let plan = Plan {
            classes: classes
                .iter()
                .map(|&(size, count)| ClassPlan { size, count })
                .collect(),
            len: classes.iter().map(|&(s, c)| s as usize * c as usize).sum(),
        };
        let region = Region::heap(plan.len).unwrap();
        Slab::new(
            &plan,
            region,
            MrKeys {
                lkey: 0x11,
                rkey: 0x22,
            },
            Access::LOCAL_WRITE,
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::plan::ClassPlan;
    use super::testing::slab;
    use super::*;
    use crate::pool::PoolConfig;

    #[test]
    fn plan_powers_of_two_and_layout() {
        let p = Plan::new(&PoolConfig::buffers_per_class(2).size_classes(64, 256)).unwrap();
        assert_eq!(
            p.classes,
            [
                ClassPlan { size: 64, count: 2 },
                ClassPlan {
                    size: 128,
                    count: 2
                },
                ClassPlan {
                    size: 256,
                    count: 2
                }
            ]
        );
        assert_eq!(p.len, 2 * (64 + 128 + 256));
        let s = Slab::new(
            &p,
            Region::heap(p.len).unwrap(),
            MrKeys::default(),
            Access::NONE,
        );
        let base = s.region().base().as_ptr() as usize;
        // Largest first: 256-byte slots at 0 and 256, then 128s, then 64s.
        let g = s.alloc(256).unwrap();
        assert_eq!(g.ptr.as_ptr() as usize - base, 0);
        let g2 = s.alloc(100).unwrap();
        assert_eq!(g2.ptr.as_ptr() as usize - base, 512);
        let g3 = s.alloc(1).unwrap();
        assert_eq!(g3.ptr.as_ptr() as usize - base, 768);
        for g in [g, g2, g3] {
            assert_eq!(g.ptr.as_ptr() as usize % s.class_size(g.class) as usize, 0);
            s.free(g.class, g.index, g.gen).unwrap();
        }
    }
    #[test]
    fn alloc_picks_smallest_fitting_class_then_larger() {
        let s = slab(&[(64, 1), (128, 1), (256, 1)]);
        assert_eq!(s.alloc(0).unwrap_err(), Error::InvalidAttribute);
        assert_eq!(s.alloc(257).unwrap_err(), Error::InvalidAttribute);
        let a = s.alloc(64).unwrap();
        assert_eq!(s.class_size(a.class), 64);
        // The 64 class is empty: the next one serves.
        let b = s.alloc(10).unwrap();
        assert_eq!(s.class_size(b.class), 128);
        let c = s.alloc(10).unwrap();
        assert_eq!(s.class_size(c.class), 256);
        assert_eq!(s.alloc(1).unwrap_err(), Error::ResourceExhausted);
        let st = s.stats();
        assert_eq!(st.buffers_in_use, 3);
        assert_eq!(st.bytes_in_use, 64 + 128 + 256);
        assert_eq!(st.bytes_requested, 64 + 10 + 10);
        for g in [a, b, c] {
            s.free(g.class, g.index, g.gen).unwrap();
        }
        assert_eq!(s.in_use(), 0);
        assert_eq!(s.stats().bytes_requested, 0);
        for k in 0..3 {
            let cs = s.class_stats(k).unwrap();
            assert_eq!((cs.in_use, cs.free, cs.high_water), (0, 1, 1));
        }
        assert!(s.class_stats(3).is_none());
    }

    /// The `first_fit` shortcut gives what a linear search would, for odd
    /// class lists, around every power of two and every class boundary.
    #[test]
    fn class_choice_matches_a_linear_search() {
        let lists: [&[u32]; 3] = [
            &[64, 192, 320, 4096, 4160, 1 << 16],
            &[64, 128, 256, 512],
            &[1 << 20],
        ];
        for sizes in lists {
            let s = slab(&sizes.iter().map(|&z| (z, 1)).collect::<Vec<_>>());
            let max = *sizes.last().unwrap() as usize;
            let mut lens: Vec<usize> = (1..=300).collect();
            for b in 1..=20 {
                lens.extend([(1 << b) - 1, 1 << b, (1 << b) + 1]);
            }
            for &z in sizes {
                lens.extend([z as usize - 1, z as usize, z as usize + 1]);
            }
            for len in lens {
                let want = sizes.iter().copied().find(|&z| z as usize >= len);
                match (s.alloc(len), want) {
                    (Ok(g), Some(z)) => {
                        assert_eq!(s.class_size(g.class), z, "len {len} of {sizes:?}");
                        s.free(g.class, g.index, g.gen).unwrap();
                    }
                    (Err(e), None) => {
                        assert!(len > max);
                        assert_eq!(e, Error::InvalidAttribute);
                    }
                    (r, w) => panic!("len {len} of {sizes:?}: {r:?} vs {w:?}"),
                }
            }
        }
    }

    #[test]
    fn double_and_stale_frees_are_refused() {
        let s = slab(&[(64, 2)]);
        let a = s.alloc(8).unwrap();
        s.free(a.class, a.index, a.gen).unwrap();
        assert_eq!(s.free(a.class, a.index, a.gen), Err(Error::NoSuchObject));
        // The slot is handed out again (LIFO): the old grant stays dead.
        let b = s.alloc(8).unwrap();
        assert_eq!(b.index, a.index);
        assert_eq!(b.gen, a.gen + 1);
        assert_eq!(s.free(a.class, a.index, a.gen), Err(Error::NoSuchObject));
        assert_eq!(s.in_use(), 1);
        s.free(b.class, b.index, b.gen).unwrap();
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn tokens_check_index_address_and_key() {
        let s = slab(&[(64, 2), (128, 2)]);
        let g = s.alloc(100).unwrap();
        let addr = g.ptr.as_ptr() as u64;
        let lkey = s.keys().lkey;
        assert_eq!(
            s.free_token(g.token(), addr + 64, lkey),
            Err(Error::NoSuchObject)
        );
        assert_eq!(
            s.free_token(g.token(), addr, lkey ^ 1),
            Err(Error::NoSuchObject)
        );
        assert_eq!(
            s.free_token(u64::from(u32::MAX), addr, lkey),
            Err(Error::NoSuchObject)
        );
        assert_eq!(s.free_token(4, addr, lkey), Err(Error::NoSuchObject));
        assert_eq!(s.free_token(!0, addr, lkey), Err(Error::NoSuchObject));
        assert_eq!(s.in_use(), 1);
        s.free_token(g.token(), addr, lkey).unwrap();
        assert_eq!(
            s.free_token(g.token(), addr, lkey),
            Err(Error::NoSuchObject)
        );
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn generations_wrap() {
        let s = slab(&[(64, 1)]);
        s.words[0].store(free_word(GEN_MASK, NIL), Ordering::Relaxed);
        let g = s.alloc(1).unwrap();
        assert_eq!(g.gen, GEN_MASK);
        s.free(g.class, g.index, g.gen).unwrap();
        let g = s.alloc(1).unwrap();
        assert_eq!(g.gen, 0);
        s.free(g.class, g.index, g.gen).unwrap();
    }

    /// Two threads hand buffers back and forth through the free lists and
    /// write every byte of each buffer they hold: under Miri this checks
    /// the free list's Release/Acquire hand-over of the bytes (a data race
    /// on a buffer would be reported) and the slice accesses.
    #[test]
    fn threads_hand_buffers_over() {
        let s = slab(&[(64, 2), (128, 1)]);
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|sc| {
            for t in 0..2u8 {
                let s = &s;
                sc.spawn(move || {
                    for r in 0..rounds {
                        let Ok(g) = s.alloc(64 + (r % 2) * 64) else {
                            std::thread::yield_now();
                            continue;
                        };
                        let n = s.class_size(g.class) as usize;
                        // SAFETY: the grant owns `n` bytes at `ptr` until
                        // it is freed below.
                        let b = unsafe { core::slice::from_raw_parts_mut(g.ptr.as_ptr(), n) };
                        b.fill(t);
                        assert!(b.iter().all(|&x| x == t));
                        s.free(g.class, g.index, g.gen).unwrap();
                    }
                });
            }
        });
        assert_eq!(s.in_use(), 0);
        assert_eq!(s.stats().bytes_requested, 0);
    }
}

/// Loom models of the free lists (`scripts/loom.sh pool::slab`; a plain
/// `scripts/loom.sh` runs them too): small slabs, two or three threads, every
/// interleaving up to the preemption bound. A side table of loom cells
/// stands for the buffers' bytes, so a hand-over that is not ordered (a
/// missing Release/Acquire) is reported by loom as a causality violation,
/// and two threads holding one slot at once as a concurrent access. The
/// models fail (checked by hand) if the ABA tag is dropped or the pop's
/// Acquire is weakened; `relaxed_push_is_caught` keeps the Release side
/// honest.
#[cfg(all(loom, test))]
mod loom_tests;
