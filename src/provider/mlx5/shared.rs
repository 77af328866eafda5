//! A send queue that several threads post to at once, without a lock,
//! while another thread polls the completion queue and retires its space.
//!
//! The WQE bytes are formatted by the same encoder as [`SendQueue`]; the
//! concurrency (reservation in basic blocks, in-order publication, the
//! coalesced doorbell, retirement by the poller) is [`MpRing`], which the
//! loom models check. The ringer (whichever producer completes the
//! contiguous published prefix) is the only thread that touches the
//! doorbell record, the doorbell register and the BlueFlame offset, so
//! doorbells from different producers can never interleave.

use core::mem::MaybeUninit;
use core::ptr::NonNull;

use super::cq::SqRetire;
use super::layout::{ctrl_flags, Mlx5dvQp};
use super::sq::{by_shape, Plan, QpState, Retired, SendQueue, SqConfig, WrSlot};
use crate::error::{Error, PostError, Result};
use crate::mmio;
use crate::ring::mp::MpRing;
use crate::sync::{AtomicU32, UnsafeCell};
use crate::wr::{QpCaps, SendWr};

/// WRs of a list validated and claimed together by
/// [`SharedSendQueue::post_list`] (their plans live on the stack).
pub const LIST_CHUNK: usize = 16;

/// State only the current ringer touches.
struct Doorbell {
    /// BlueFlame offset (0 or bf_size), toggled per doorbell (docs/spec/mlx5.md §7 step 7).
    bf_offset: u32,
    /// Producer counter after the last WQE known to request a CQE.
    last_signaled_end: u32,
}

/// A multi-producer mlx5 send queue (`Sync`): post from any thread with
/// `&self`; one thread retires through [`SharedSendQueue::retirer`].
pub struct SharedSendQueue {
    /// Geometry and encoder (its own counters are not used).
    enc: SendQueue,
    ring: MpRing<Doorbell>,
    slots: NonNull<UnsafeCell<WrSlot>>,
    dbrec_sq: NonNull<u32>,
    bf_reg: NonNull<u8>,
    bf_size: u32,
    guard: u32,
    flush: bool,
    state: QpState,
}

// SAFETY: producers only write BBs and side-table entries they reserved
// (disjoint), the doorbell is touched only by the elected ringer, and the
// retire side is single-threaded by the `retirer` contract. All shared
// counters are atomics inside `MpRing`.
unsafe impl Send for SharedSendQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedSendQueue {}

/// Storage a [`SharedSendQueue`] needs besides the device's queue memory:
/// one side-table entry and one ready word per BB.
pub struct SharedStorage {
    /// Side table (`wqe_cnt` entries).
    pub slots: NonNull<WrSlot>,
    /// Ready words (`wqe_cnt` entries, each equal to the start counter).
    pub ready: NonNull<AtomicU32>,
    /// Entries in each.
    pub len: usize,
}

impl SharedSendQueue {
    /// Wraps a send queue described by `mlx5dv_init_obj` fields for
    /// multi-producer posting, with every counter at `start` (0 for a fresh
    /// or reset QP; the device's view of the doorbell record must match).
    /// BlueFlame is not used (several WQEs may be published per doorbell);
    /// `cfg.bf_policy` is ignored.
    ///
    /// # Safety
    /// As for [`SendQueue::from_raw`], with `storage` owned by the queue
    /// and its ready words all equal to `start`.
    pub unsafe fn from_raw(
        qp: &Mlx5dvQp,
        qpn: u32,
        caps: QpCaps,
        cfg: SqConfig,
        storage: SharedStorage,
        start: u32,
    ) -> Result<SharedSendQueue> {
        // SAFETY: forwarded contract; the encoder's own side table is the
        // same storage, which it never writes (only `emit` is used).
        let enc = unsafe { SendQueue::from_raw(qp, qpn, caps, cfg, storage.slots, storage.len) }?;
        let cnt = enc.wqe_cnt();
        let max_nbb = enc.max_wqe_bbs();
        // SAFETY: `ready` has `cnt` words equal to `start` (contract), which
        // is not a plausible end value at counter `start`.
        let ring = unsafe {
            MpRing::new(
                cnt,
                max_nbb,
                start,
                storage.ready,
                Doorbell {
                    bf_offset: 0,
                    last_signaled_end: start,
                },
            )
        };
        Ok(SharedSendQueue {
            guard: enc.signal_guard(),
            ring,
            slots: storage.slots.cast(),
            dbrec_sq: enc.dbrec_sq(),
            bf_reg: enc.bf_reg(),
            bf_size: qp.bf_size,
            flush: cfg.shared_register,
            state: QpState::Rts,
            enc,
        })
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.enc.qpn()
    }
    /// Ring size in BBs.
    pub fn wqe_cnt(&self) -> u32 {
        self.ring.cnt()
    }
    /// Free BBs (a snapshot).
    pub fn free_bbs(&self) -> u32 {
        self.ring.free()
    }
    /// Capabilities.
    pub fn caps(&self) -> &QpCaps {
        self.enc.caps()
    }
    /// Records a QP state change (no producer may be posting).
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Side-table entry of BB `bb`.
    #[inline(always)]
    fn slot(&self, bb: u32) -> &UnsafeCell<WrSlot> {
        // SAFETY: masked index into the `wqe_cnt` entries owned by the queue.
        unsafe {
            &*self
                .slots
                .as_ptr()
                .add((bb & (self.ring.cnt() - 1)) as usize)
        }
    }

    /// Posts one WR from any thread: reserves its BBs, writes the WQE,
    /// publishes it in order and makes sure a doorbell covers it (this
    /// thread rings if it completes the contiguous prefix). A full queue
    /// is [`Error::SqFull`], never a wait.
    ///
    /// # Safety
    /// The SGE contract of [`SendQueue::post`].
    #[inline]
    pub unsafe fn post(&self, wr: &SendWr<'_>) -> Result<()> {
        // SAFETY: forwarded contract.
        by_shape!(wr, unsafe { self.post_shaped(wr) })
    }

    /// [`SharedSendQueue::post`] for one WR shape (see `by_shape`).
    ///
    /// # Safety
    /// As for [`SharedSendQueue::post`].
    #[inline(always)]
    unsafe fn post_shaped(&self, wr: &SendWr<'_>) -> Result<()> {
        if !self.state.can_send() {
            return Err(Error::InvalidQpState);
        }
        let plan = self.enc.plan(wr)?;
        let start = self.ring.reserve(plan.nbb).map_err(|_| Error::SqFull)?;
        // SAFETY: BBs start..start+nbb were reserved by this thread; the
        // SGE contract is forwarded.
        unsafe { self.write(wr, &plan, start) };
        self.ring
            .request_doorbell(|db, _from, to, last| self.ring_doorbell(db, to, last));
        Ok(())
    }

    /// Writes a planned WQE and its side-table entries into BBs this
    /// thread reserved, and marks it ready (no doorbell request).
    ///
    /// # Safety
    /// BBs `start..start+plan.nbb` are reserved by this thread and not yet
    /// marked ready; the SGE contract of [`SendQueue::post`].
    #[inline(always)]
    unsafe fn write(&self, wr: &SendWr<'_>, plan: &Plan, start: u32) {
        // SAFETY: caller contract (reserved BBs, SGE contract).
        unsafe { self.enc.emit(wr, plan, start) };
        // SAFETY: the entry of a reserved BB belongs to this thread until
        // it is published.
        self.slot(start)
            .with_mut(|p| unsafe { self.enc.set_slot(p, wr.wr_id, plan, start) });
        for k in 1..plan.nbb {
            // Middle BBs never look like WQE starts (see `SendQueue`).
            self.slot(start.wrapping_add(k)).with_mut(|p| {
                // SAFETY: a BB this thread reserved.
                unsafe { p.write(WrSlot::default()) }
            });
        }
        self.ring.mark_ready(start, start.wrapping_add(plan.nbb));
    }

    /// Posts several WRs from any thread, in order, stopping at the first
    /// refused one (its index and error in the [`PostError`]; the WRs
    /// before it are posted). Up to [`LIST_CHUNK`] WRs at a time are
    /// validated, then claimed with one reservation (the longest prefix
    /// that fits), written, and covered by one doorbell request, so a list
    /// makes as many shared read-modify-writes as one WR and producers
    /// write their lists in parallel.
    ///
    /// # Safety
    /// As for [`SharedSendQueue::post`].
    pub unsafe fn post_list(&self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if !self.state.can_send() {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        let mut done = 0;
        while done < wrs.len() {
            let chunk = &wrs[done..wrs.len().min(done + LIST_CHUNK)];
            let mut plans = [MaybeUninit::<Plan>::uninit(); LIST_CHUNK];
            let mut refused = None;
            let mut n = 0;
            for wr in chunk {
                match by_shape!(wr, self.enc.plan(wr)) {
                    Ok(p) => {
                        plans[n].write(p);
                        n += 1;
                    }
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            let nbb = |i: usize| {
                // SAFETY: `reserve_prefix` asks only for i < n, and
                // plans[..n] were written above.
                unsafe { plans[i].assume_init_ref() }.nbb
            };
            let (start, got) = match n {
                0 => (0, 0),
                _ => self.ring.reserve_prefix(n, nbb).unwrap_or((0, 0)),
            };
            let mut bb = start;
            for (i, wr) in chunk[..got].iter().enumerate() {
                // SAFETY: i < got <= n, and plans[..n] were written above.
                let plan = unsafe { plans[i].assume_init_ref() };
                // SAFETY: the prefix's BBs were reserved by this thread, in
                // order; the SGE contract is forwarded.
                by_shape!(wr, unsafe { self.write(wr, plan, bb) });
                bb = bb.wrapping_add(plan.nbb);
            }
            if got > 0 {
                self.ring
                    .request_doorbell(|db, _from, to, last| self.ring_doorbell(db, to, last));
            }
            if got < n {
                return Err(PostError {
                    index: done + got,
                    error: Error::SqFull,
                });
            }
            if let Some(error) = refused {
                return Err(PostError {
                    index: done + n,
                    error,
                });
            }
            done += chunk.len();
        }
        Ok(())
    }

    /// The doorbell for a newly published range ending at `to`, whose last
    /// WQE starts at BB `last` (docs/spec/mlx5.md §7). Runs on the elected ringer only.
    fn ring_doorbell(&self, db: &mut Doorbell, to: u32, last: u32) {
        // The entry was written before the producer's Release store of its
        // ready word, which the ringer acquired.
        let flags = self.slot(last).with(|p| {
            // SAFETY: see above; no producer writes it until it is retired.
            unsafe { (*p).flags }
        });
        if flags & WrSlot::USER_SIGNALED != 0 {
            db.last_signaled_end = to;
        } else if to.wrapping_sub(db.last_signaled_end) >= self.guard {
            // Not yet published to the device: make it request a CQE.
            let p = self.enc.octo_ptr(last << 2);
            // SAFETY: byte 11 of the last WQE's control segment; the device
            // has not been told about it yet.
            unsafe { *p.add(11) |= ctrl_flags::CQ_UPDATE };
            db.last_signaled_end = to;
        }
        // SAFETY: the first 8 bytes of the last WQE, inside the ring and
        // 8-aligned, written before its ready word (acquired).
        let ctrl8 = unsafe { self.enc.octo_ptr(last << 2).cast::<u64>().read() };
        // SAFETY: the register pair and doorbell record from the
        // constructor contract; only the ringer writes them.
        unsafe {
            let reg = self.bf_reg.as_ptr().add(db.bf_offset as usize);
            mmio::send_doorbell(self.dbrec_sq.as_ptr(), to, reg, ctrl8, self.flush);
        }
        db.bf_offset ^= self.bf_size;
    }

    /// The retire side, for the completion poller.
    ///
    /// # Safety
    /// At most one [`SqRetirer`] of a queue may exist at a time.
    pub unsafe fn retirer(&self) -> SqRetirer<'_> {
        SqRetirer { sq: self }
    }
}

/// The completion poller's handle on a [`SharedSendQueue`]: retires WQEs
/// named by completions. Put it in a [`super::cq::CqRouteTo`] route.
pub struct SqRetirer<'a> {
    sq: &'a SharedSendQueue,
}

impl SqRetirer<'_> {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.sq.qpn()
    }
}

impl SqRetire for SqRetirer<'_> {
    #[inline(always)]
    fn retire(&mut self, counter: u16) -> Option<Retired> {
        let sq = self.sq;
        let mut got = None;
        let end_of = |start: u32| {
            let s = sq.slot(start).with(|p| {
                // SAFETY: a published entry; producers do not touch it
                // until `retired` passes it.
                unsafe { *p }
            });
            if s.flags & WrSlot::VALID == 0 || s.start != start as u16 {
                return None;
            }
            got = Some(s);
            Some(s.end)
        };
        // SAFETY: this handle is the only retirer (`retirer` contract).
        let start = unsafe { sq.ring.retire(counter, end_of) }?;
        let s = got?;
        Some(Retired {
            wr_id: s.wr_id,
            opcode: s.opcode,
            user_signaled: s.flags & WrSlot::USER_SIGNALED != 0,
            start,
        })
    }
    fn for_each_data_seg(&self, start: u32, f: impl FnMut(u64, u32) -> bool) {
        self.sq.enc.for_each_data_seg(start, f)
    }
    fn set_error(&mut self) {
        // The QP state is changed by the control path (`set_state`); the
        // completions of the remaining WQEs arrive as flush errors.
    }
}
