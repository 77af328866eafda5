//! [`VerbsSrq`]: a shared receive queue that posts through libibverbs
//! (`ibv_post_srq_recv`), and [`SrqTrack`], the wr_id table its
//! completions are mapped back through.
//!
//! An SRQ's receives are taken by whichever attached QP a message arrives
//! at, and their completions are polled from any of those QPs' CQs, in any
//! order: so the table is a set of slots with a free list, not the
//! in-order sequence a QP's own receive queue uses ([`super::QpTrack`]).
//! The provider sees, for every receive, `RECV_BIT | SRQ_BIT | gen << 24 |
//! slot`, where `gen` counts the SRQ's posts: a completion that names a
//! slot not posted under exactly that id (a stale, repeated or invented
//! wr_id) is [`Error::CqeCorrupt`], never an out-of-bounds index or a
//! second report.

use std::boxed::Box;
use std::sync::{Arc, Mutex};
use std::vec::Vec;

use rdma_sys as sys;

use super::qp::{bad_index, blank_recv, link_recv, recv_entry, CHAIN, SGES};
use super::track::RECV_BIT;
use crate::api::SrqDriver;
use crate::error::{Error, PostError, Result};
use crate::sync::{AtomicU64, Ordering};
use crate::verbs::fail;
use crate::wr::{validate_recv, QpCaps, RecvWr};

/// wr_id bit (with [`RECV_BIT`]) that marks a receive of an SRQ.
pub(crate) const SRQ_BIT: u64 = 1 << 62;
/// Bits of the wr_id that name the slot (an SRQ holds at most 2^24 WRs).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// One posted receive: the id the provider was given (0: free) and the
/// user's wr_id.
#[derive(Default)]
struct SrqSlot {
    tag: AtomicU64,
    wr_id: AtomicU64,
}

/// The wr_id table of one SRQ, shared by its poster ([`VerbsSrq`]) and the
/// pollers of the CQs its QPs complete on.
///
/// The poster writes a slot's user wr_id, then publishes the slot with a
/// Release store of its tag before the provider sees the WR; a poller
/// takes the slot with an Acquire compare-exchange of the tag to 0 (so
/// one completion, and only one, retires it) and hands the slot back
/// through `returned`, whose lock orders its reads before the poster's
/// reuse.
pub struct SrqTrack {
    slots: Box<[SrqSlot]>,
    /// Slots retired by pollers, not yet taken back by the poster.
    returned: Mutex<Vec<u32>>,
}

impl SrqTrack {
    /// A table for an SRQ that holds `cap` receives (at most 2^24).
    pub fn new(cap: u32) -> SrqTrack {
        let n = u64::from(cap.max(1)).min(SLOT_MASK + 1) as usize;
        SrqTrack {
            slots: (0..n).map(|_| SrqSlot::default()).collect(),
            returned: Mutex::new(Vec::with_capacity(n)),
        }
    }

    /// Receives the table holds.
    pub(crate) fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Maps a completion's wr_id (with [`SRQ_BIT`]) back to the user's and
    /// frees its slot; [`Error::CqeCorrupt`] if it names no posted receive.
    pub(crate) fn complete(&self, wr_id: u64) -> Result<u64> {
        let Some(slot) = self.slots.get((wr_id & SLOT_MASK) as usize) else {
            return Err(Error::CqeCorrupt);
        };
        // Acquire: pairs with the poster's Release store of the tag, so the
        // user wr_id written before it is visible. Relaxed on failure:
        // nothing is read.
        if slot
            .tag
            .compare_exchange(wr_id, 0, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(Error::CqeCorrupt);
        }
        // Relaxed: ordered by the Acquire above.
        let user = slot.wr_id.load(Ordering::Relaxed);
        // The lock orders the read above before the poster's reuse.
        let mut r = self.returned.lock().unwrap_or_else(|p| p.into_inner());
        r.push((wr_id & SLOT_MASK) as u32);
        Ok(user)
    }
}

/// The poster's side of an [`SrqTrack`]: its own free slots and the
/// generation of the next wr_id. Shared by the fallback's [`VerbsSrq`] and
/// the direct rings' SRQ (`verbs::direct_srq`).
pub(crate) struct SrqPoster {
    track: Arc<SrqTrack>,
    /// Free slots (the poster's own; refilled from `track.returned`).
    free: Vec<u32>,
    /// Posts so far: the generation in the next wr_id.
    gen: u64,
}

impl SrqPoster {
    /// The poster of `track`, every slot free.
    pub(crate) fn new(track: Arc<SrqTrack>) -> SrqPoster {
        let free = (0..track.capacity()).rev().collect();
        SrqPoster {
            track,
            free,
            gen: 0,
        }
    }

    /// A free slot, taking back the ones pollers retired when the poster's
    /// own list is empty; `None` when every slot is posted.
    fn take_slot(&mut self) -> Option<u32> {
        if self.free.is_empty() {
            let mut r = self
                .track
                .returned
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.free.append(&mut r);
        }
        self.free.pop()
    }

    /// Records the user's `wr_id` in a free slot and publishes the slot;
    /// returns the wr_id the provider or ring is to carry
    /// (`RECV_BIT | SRQ_BIT | gen << 24 | slot`), `None` when every slot
    /// is posted ([`Error::RqFull`] for the caller).
    pub(crate) fn publish(&mut self, wr_id: u64) -> Option<u64> {
        let slot = self.take_slot()?;
        self.gen = self.gen.wrapping_add(1);
        let tag = RECV_BIT
            | SRQ_BIT
            | (self.gen << SLOT_BITS) & !(RECV_BIT | SRQ_BIT | SLOT_MASK)
            | u64::from(slot);
        let s = &self.track.slots[slot as usize];
        // Relaxed: published by the Release store of the tag.
        s.wr_id.store(wr_id, Ordering::Relaxed);
        // Release: the slot before the provider may complete it.
        s.tag.store(tag, Ordering::Release);
        Some(tag)
    }

    /// Takes back the slot of `tag` (from [`SrqPoster::publish`]) that the
    /// provider or ring never received: a completion naming it is then
    /// corrupt.
    pub(crate) fn unpublish(&mut self, tag: u64) {
        let slot = (tag & SLOT_MASK) as u32;
        if let Some(s) = self.track.slots.get(slot as usize) {
            // Relaxed: the provider never saw this id.
            s.tag.store(0, Ordering::Relaxed);
            self.free.push(slot);
        }
    }
}

/// A verbs-fallback SRQ: validates receives with the crate's rules and
/// posts them through libibverbs' provider, one chain per call.
pub struct VerbsSrq {
    srq: *mut sys::ibv_srq,
    poster: SrqPoster,
    /// The receive limits (`max_recv_sge` is the SRQ's `max_sge`).
    caps: QpCaps,
    /// Reused chain and SGEs, as [`super::VerbsQp`]'s.
    chain: Box<[sys::ibv_recv_wr; CHAIN]>,
    sges: Box<[sys::ibv_sge; SGES]>,
}

// SAFETY: the SRQ pointer is used only through `&mut self` (one thread at
// a time) and libibverbs SRQs may be used from any thread; the chain's
// pointers point into this SRQ's own scratch arrays and are handed to the
// provider only inside a call.
unsafe impl Send for VerbsSrq {}

impl VerbsSrq {
    /// Wraps a created SRQ of `max_sge` scatter entries per receive.
    pub(crate) fn new(srq: *mut sys::ibv_srq, track: Arc<SrqTrack>, max_sge: u32) -> VerbsSrq {
        VerbsSrq {
            srq,
            poster: SrqPoster::new(track),
            caps: QpCaps {
                max_send_sge: 0,
                max_inline_data: 0,
                max_recv_sge: max_sge,
            },
            chain: Box::new(core::array::from_fn(|_| blank_recv())),
            sges: Box::new(
                [sys::ibv_sge {
                    addr: 0,
                    length: 0,
                    lkey: 0,
                }; SGES],
            ),
        }
    }
}

impl SrqDriver for VerbsSrq {
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let mut done = 0usize;
        while done < wrs.len() {
            let mut used = 0usize;
            let mut n = 0usize;
            let mut refused = None;
            while done + n < wrs.len() && n < CHAIN {
                let wr = &wrs[done + n];
                if let Err(e) = validate_recv(wr, &self.caps) {
                    refused = Some(e);
                    break;
                }
                if used + wr.sges.len() > SGES {
                    if n == 0 {
                        refused = Some(Error::TooManySges);
                    }
                    break;
                }
                let Some(tag) = self.poster.publish(wr.wr_id) else {
                    refused = Some(Error::RqFull);
                    break;
                };
                self.chain[n] = recv_entry(tag, wr, &mut self.sges, &mut used);
                n += 1;
            }
            if n > 0 {
                link_recv(&mut self.chain[..n]);
                let mut bad: *mut sys::ibv_recv_wr = core::ptr::null_mut();
                // SAFETY: live SRQ (destroyed only after this handle is
                // done posting: `Srq::destroy` takes `&mut`); the chain and
                // its SGEs are this SRQ's scratch arrays, every linked
                // entry written above.
                let ret = unsafe { post_srq_recv_raw(self.srq, self.chain.as_mut_ptr(), &mut bad) };
                if ret != 0 {
                    let idx = bad_index(bad, self.chain.as_ptr(), n);
                    // WRs idx.. were not posted (rxe and siw refuse before
                    // queueing anything of a WR): their slots are free
                    // again, and a completion naming one would be corrupt.
                    for w in &self.chain[idx..n] {
                        self.poster.unpublish(w.wr_id);
                    }
                    return Err(PostError {
                        index: done + idx,
                        error: fail("ibv_post_srq_recv", ret.abs()),
                    });
                }
                done += n;
            }
            if let Some(e) = refused {
                return Err(PostError {
                    index: done,
                    error: e,
                });
            }
        }
        Ok(())
    }
}

/// `ibv_post_srq_recv` through the context's ops table, without the panic
/// of an `unwrap` on a missing op.
///
/// # Safety
/// `srq` is live; the chain is valid for the call.
unsafe fn post_srq_recv_raw(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> i32 {
    // SAFETY: the caller's contract; `context` of a live SRQ is live.
    match unsafe { (*(*srq).context).ops.post_srq_recv } {
        // SAFETY: as above.
        Some(f) => unsafe { f(srq, wr, bad) },
        None => libc::ENOSYS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table the direct rings and the fallback share: exact capacity,
    /// one report per receive, and every id that names no outstanding
    /// receive (repeated, stale, out of range, never handed to the ring)
    /// is `CqeCorrupt`.
    #[test]
    fn poster_tags_complete_once_and_refuses_corrupt_ids() {
        let t = Arc::new(SrqTrack::new(4));
        let mut p = SrqPoster::new(Arc::clone(&t));
        let tags: Vec<u64> = (0..4).map(|i| p.publish(100 + i).unwrap()).collect();
        assert_eq!(p.publish(9), None, "a fifth receive in a table of 4");
        for &tag in &tags {
            assert_eq!(tag & (RECV_BIT | SRQ_BIT), RECV_BIT | SRQ_BIT);
        }
        assert_eq!(t.complete(tags[2]), Ok(102));
        assert_eq!(t.complete(tags[2]), Err(Error::CqeCorrupt), "twice");
        let stale = tags[0] ^ (1 << SLOT_BITS);
        assert_eq!(
            t.complete(stale),
            Err(Error::CqeCorrupt),
            "wrong generation"
        );
        let far = RECV_BIT | SRQ_BIT | SLOT_MASK;
        assert_eq!(t.complete(far), Err(Error::CqeCorrupt), "slot out of range");
        // The completed slot comes back under a new id; the old one stays
        // corrupt.
        let again = p.publish(200).unwrap();
        assert_eq!(again & SLOT_MASK, tags[2] & SLOT_MASK);
        assert_ne!(again, tags[2]);
        assert_eq!(t.complete(tags[2]), Err(Error::CqeCorrupt));
        // Taken back before the ring saw it: its id is corrupt, its slot
        // free.
        p.unpublish(again);
        assert_eq!(t.complete(again), Err(Error::CqeCorrupt));
        assert_eq!(
            p.publish(300).map(|x| x & SLOT_MASK),
            Some(tags[2] & SLOT_MASK)
        );
        assert_eq!(p.publish(301), None);
        // The others complete once each, with their own wr_ids.
        for (i, &tag) in tags.iter().enumerate().filter(|(i, _)| *i != 2) {
            assert_eq!(t.complete(tag), Ok(100 + i as u64));
        }
    }
}
