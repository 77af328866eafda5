//! The service behind the handles: the [`SubmissionService`] on the heap,
//! the poll-mode state guarded by the owner flag, and the three poll-mode
//! steps (drain and post, poll and route, flush).

use core::cell::UnsafeCell;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::boxed::Box;
use std::vec;

use crate::ffi::mlx5::{rdd_wc, RDD_WC_SUCCESS, RDD_WC_WR_FLUSH_ERR};
use crate::ffi::mlx5::{RDD_WC_LOC_QP_OP_ERR, RDD_WC_OP_RECV};
use crate::ffi::object::{as_handle, rdd_cq_poll, rdd_qp, rdd_qp_doorbells, rdd_qp_post_send};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{rdd_sge, rdd_wr, RDD_SEND_SIGNALED, RDD_WR_RDMA_WRITE};
use crate::ring::submit::{Poller, Submission, SubmissionService, Submitter, SubmitterId};

use super::types::{
    rdd_submit_completion, rdd_submit_desc, RDD_SUBMIT_COMPLETION_RING_SIZE, RDD_SUBMIT_DESC_FLAGS,
    RDD_SUBMIT_MAX_BATCH, RDD_SUBMIT_MAX_SUBMITTERS, RDD_SUBMIT_POLL_BATCH, RDD_SUBMIT_RING_SIZE,
};

/// The one service type behind the C API.
pub(super) type Svc = SubmissionService<
    rdd_submit_desc,
    rdd_submit_completion,
    RDD_SUBMIT_RING_SIZE,
    RDD_SUBMIT_COMPLETION_RING_SIZE,
    RDD_SUBMIT_MAX_SUBMITTERS,
>;

/// A submitter of [`Svc`], borrowing it for as long as its [`Core`] lives
/// (see [`Core::svc`]).
pub(super) type SvcSubmitter = Submitter<
    'static,
    rdd_submit_desc,
    rdd_submit_completion,
    RDD_SUBMIT_RING_SIZE,
    RDD_SUBMIT_COMPLETION_RING_SIZE,
>;

type SvcPoller = Poller<
    'static,
    rdd_submit_desc,
    rdd_submit_completion,
    RDD_SUBMIT_RING_SIZE,
    RDD_SUBMIT_COMPLETION_RING_SIZE,
    RDD_SUBMIT_MAX_SUBMITTERS,
>;

const MAX_BATCH: usize = RDD_SUBMIT_MAX_BATCH as usize;

// ---------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------

/// Adds `n` to a counter that only one thread at a time writes.
///
/// Relaxed load and store: the counters are statistics that guard no
/// data. There is no lost update without a read-modify-write, because
/// each counter has one writer at a time (the poll-mode thread under the
/// owner flag, or the one thread using a submitter), and a new writer is
/// ordered after the old one by that flag's or the handle's
/// Release/Acquire hand-over.
#[inline(always)]
pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// A submitter id's counters, on their own cache lines (each written only
/// by the thread using that submitter).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct SubStats {
    pub(super) submitted: AtomicU64,
    pub(super) ring_full: AtomicU64,
    pub(super) no_credit: AtomicU64,
    pub(super) reaped: AtomicU64,
}

/// The poll-mode thread's counters (written only under the owner flag).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct PollStats {
    pub(super) drained: AtomicU64,
    pub(super) posted: AtomicU64,
    pub(super) doorbells: AtomicU64,
    pub(super) qp_full: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) flushed: AtomicU64,
    /// A gauge: descriptors drained, not yet posted.
    pub(super) held: AtomicU64,
}

// ---------------------------------------------------------------------
// The poll-mode state
// ---------------------------------------------------------------------

/// Where a posted WR's completion goes.
#[derive(Clone, Copy, Default)]
struct Pending {
    from: SubmitterId,
    wr_id: u64,
}

/// Everything only the poll-mode thread touches (under the owner flag).
/// Allocated once at creation; the poll-mode calls allocate nothing.
struct PollState {
    poller: SvcPoller,
    /// Posted WR `seq` waits in `pending[seq & mask]`.
    pending: Box<[Pending]>,
    mask: u64,
    max_outstanding: u64,
    max_batch: usize,
    /// Sequence number (and QP `wr_id`) of the next WR to post.
    next_seq: u64,
    /// Sequence number of the oldest posted WR not yet completed.
    retired: u64,
    /// An error completion was seen: the QP is in error and every later
    /// completion is a flush.
    errored: bool,
    /// Drained descriptors not yet posted, oldest first.
    held: [Submission<rdd_submit_desc>; MAX_BATCH],
    held_len: usize,
    /// The batch handed to `rdd_qp_post_send` (rebuilt every drain).
    wrs: [rdd_wr; MAX_BATCH],
    sges: [rdd_sge; MAX_BATCH],
    wcs: [rdd_wc; RDD_SUBMIT_POLL_BATCH],
    /// The QP's doorbell count after the last post.
    doorbells_seen: u64,
}

const BLANK_WR: rdd_wr = rdd_wr {
    wr_id: 0,
    sg_list: ptr::null(),
    num_sge: 1,
    opcode: RDD_WR_RDMA_WRITE,
    flags: 0,
    imm_data: 0,
    remote_addr: 0,
    rkey: 0,
    invalidate_rkey: 0,
    compare_add: 0,
    swap: 0,
};

// ---------------------------------------------------------------------
// The core
// ---------------------------------------------------------------------

/// What a service is bound to and how it is sized (checked by
/// `rdd_submit_create`).
pub(super) struct Binding {
    /// The QP handle the service posts on.
    pub(super) qp: usize,
    /// Its send CQ's handle, serving only that QP.
    pub(super) cq: usize,
    /// The QP's inline limit.
    pub(super) max_inline: u32,
    /// The QP's doorbell count at creation.
    pub(super) doorbells: u64,
    /// 1..=`RDD_SUBMIT_MAX_OUTSTANDING`.
    pub(super) max_outstanding: u32,
    /// 1..=`RDD_SUBMIT_MAX_BATCH`.
    pub(super) max_batch: u32,
}

/// What a service handle and its submitter handles share (through an
/// `Arc`): the submission service, the poll-mode state and the bound
/// QP and CQ handles.
pub(super) struct Core {
    /// The service, in a heap allocation of its own that only `Drop`
    /// frees (after `poll`), so `'static` borrows of it stay valid while
    /// any holder of this core exists.
    svc: NonNull<Svc>,
    /// Guarded by `polling`.
    poll: UnsafeCell<ManuallyDrop<PollState>>,
    /// The single-poller flag: set while a poll-mode call runs.
    polling: AtomicBool,
    /// The bound QP and CQ (handle values; checked by every call that
    /// uses them).
    pub(super) qp: usize,
    pub(super) cq: usize,
    /// The QP's inline limit (checked at submission).
    pub(super) max_inline: u32,
    pub(super) sub_stats: Box<[SubStats]>,
    pub(super) poll_stats: PollStats,
}

// SAFETY: `svc` is a `SubmissionService` of plain `Copy` data, which is
// `Sync` (its rings are); `poll` is touched only by the thread holding
// the `polling` flag (`PollGuard`), whose Acquire/Release hand-over orders
// one holder's accesses before the next's. The raw pointers inside
// `PollState` (the batch's SGE list) point into the state itself and are
// only followed during a call that holds the flag.
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

impl Core {
    /// A new core for the QP and CQ of `bind`; allocates everything the
    /// service will use.
    pub(super) fn new(bind: Binding) -> Result<Core, rdd_status> {
        let mut b = Box::<Svc>::new_uninit();
        // SAFETY: the box is valid for writes of one `Svc` and aligned.
        unsafe { Svc::init_in_place(b.as_mut_ptr()) };
        // SAFETY: `init_in_place` initialised the whole service.
        let svc = NonNull::from(Box::leak(unsafe { b.assume_init() }));
        // SAFETY: `svc` was just created; the poller borrowing it is
        // dropped before it is freed (here on failure, in `Drop` otherwise).
        let this_svc: &'static Svc = unsafe { svc.as_ref() };
        let Ok(poller) = this_svc.poller() else {
            // Cannot happen: a service built a moment ago has no poller.
            // SAFETY: from `Box::leak` above; nothing borrows it.
            drop(unsafe { Box::from_raw(svc.as_ptr()) });
            return Err(rdd_status::ResourceBusy);
        };
        let slots = (bind.max_outstanding as usize).next_power_of_two();
        Ok(Core {
            svc,
            poll: UnsafeCell::new(ManuallyDrop::new(PollState {
                poller,
                pending: vec![Pending::default(); slots].into_boxed_slice(),
                mask: slots as u64 - 1,
                max_outstanding: u64::from(bind.max_outstanding),
                max_batch: bind.max_batch as usize,
                next_seq: 0,
                retired: 0,
                errored: false,
                held: [Submission::default(); MAX_BATCH],
                held_len: 0,
                wrs: [BLANK_WR; MAX_BATCH],
                sges: [rdd_sge::default(); MAX_BATCH],
                wcs: [rdd_wc::default(); RDD_SUBMIT_POLL_BATCH],
                doorbells_seen: bind.doorbells,
            })),
            polling: AtomicBool::new(false),
            qp: bind.qp,
            cq: bind.cq,
            max_inline: bind.max_inline,
            sub_stats: (0..RDD_SUBMIT_MAX_SUBMITTERS)
                .map(|_| SubStats::default())
                .collect(),
            poll_stats: PollStats::default(),
        })
    }

    /// The service, borrowed for `'static`.
    ///
    /// Sound because the service lives until this core is dropped, and
    /// every holder of such a borrow keeps the core alive: the poller
    /// lives inside the core and is dropped first in [`Drop`], and each
    /// submitter object holds an `Arc` of the core and drops its
    /// [`SvcSubmitter`] before that `Arc` (field order).
    pub(super) fn svc(&self) -> &'static Svc {
        // SAFETY: see above; the allocation is only ever borrowed shared
        // until `Drop` frees it.
        unsafe { self.svc.as_ref() }
    }

    /// Takes the owner flag: `RESOURCE_BUSY` while another poll-mode call
    /// runs.
    #[inline]
    pub(super) fn claim_poller(&self) -> Result<PollGuard<'_>, rdd_status> {
        // Acquire on success: pairs with the previous holder's Release in
        // `PollGuard::drop`, so its accesses to `poll` happen before ours.
        // Relaxed on failure: nothing is read.
        match self
            .polling
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(PollGuard { core: self }),
            Err(_) => Err(rdd_status::ResourceBusy),
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The poller borrows the service: it goes first. No submitter
        // exists any more (each held an `Arc` of this core).
        // SAFETY: dropped once, and `poll` is not used afterwards.
        unsafe { ManuallyDrop::drop(self.poll.get_mut()) };
        // SAFETY: `svc` came from `Box::leak` in `new`, and its last
        // borrower (the poller) is gone.
        drop(unsafe { Box::from_raw(self.svc.as_ptr()) });
        // The QP may take another service now.
        crate::ffi::object::release_service(self.qp);
    }
}

/// The owner flag, held for one poll-mode call.
pub(super) struct PollGuard<'a> {
    core: &'a Core,
}

impl Drop for PollGuard<'_> {
    fn drop(&mut self) {
        // Release: pairs with the next holder's Acquire in `claim_poller`.
        self.core.polling.store(false, Ordering::Release);
    }
}

impl PollGuard<'_> {
    fn state(&mut self) -> &mut PollState {
        // SAFETY: the flag is held (this guard exists, and only one can),
        // so no other reference to the state exists.
        unsafe { &mut *self.core.poll.get() }
    }

    /// Hands `c` to submitter `to` and counts it.
    fn route(&mut self, to: SubmitterId, c: rdd_submit_completion, local: bool) {
        let stats = &self.core.poll_stats;
        // The completion ring cannot be full: a submitter has at most
        // `RDD_SUBMIT_COMPLETION_RING_SIZE` descriptors in flight (its
        // credits), each completed once, and `rdd_submit_unregister`
        // refuses a submitter with any in flight, so no id is reused while
        // completions for it are due. Were it ever refused, the completion
        // would be dropped here rather than panic.
        if self.state().poller.try_complete(to, c).is_ok() {
            bump(&stats.completed, 1);
            if c.status != RDD_WC_SUCCESS {
                bump(&stats.failed, 1);
            }
            if local {
                bump(&stats.flushed, 1);
            }
        }
    }

    /// Completes held descriptor `i` without posting it.
    fn fail_held(&mut self, i: usize, status: u32) {
        let s = self.state().held[i];
        let c = rdd_submit_completion {
            wr_id: s.desc.wr_id,
            status,
            vendor_err: 0,
        };
        self.route(s.from, c, true);
    }

    /// Drops the first `n` held descriptors.
    fn shift_held(&mut self, n: usize) {
        let st = self.state();
        st.held.copy_within(n..st.held_len, 0);
        st.held_len -= n;
    }

    fn publish_held(&mut self) {
        let held = self.state().held_len as u64;
        // Relaxed: a gauge (see `bump`; one writer).
        self.core.poll_stats.held.store(held, Ordering::Relaxed);
    }

    /// `rdd_submit_drain`: tops the held batch up from the ring, then
    /// posts what fits with one `rdd_qp_post_send` call. Returns the WRs
    /// posted.
    pub(super) fn drain(&mut self) -> Result<usize, rdd_status> {
        let core = self.core;
        let st = self.state();
        let want = st.max_batch;
        if st.held_len < want {
            let (from, to) = (st.held_len, want);
            let n = st.poller.drain(&mut st.held[from..to]);
            st.held_len += n;
            bump(&core.poll_stats.drained, n as u64);
        }
        let r = self.post();
        self.publish_held();
        r
    }

    /// Posts as many held descriptors as the outstanding limit allows.
    ///
    /// Only the batch's last WR asks for a completion. When the QP cuts a
    /// batch short (its send queue or an unguarded CQ is full), the WRs it
    /// took have none of their own; the next completion retires them. One
    /// comes: a cut leaves room under the limit (the posted part is
    /// smaller than the batch, which fit the limit), so a later drain
    /// posts at least one more WR, the last of its batch and signaled, as
    /// soon as the send queue has room again; and it will, because the
    /// send queue's signalling guard makes the device retire unsignaled
    /// runs (docs/architecture.md §3, step 5).
    fn post(&mut self) -> Result<usize, rdd_status> {
        let core = self.core;
        let st = self.state();
        let in_flight = st.next_seq.wrapping_sub(st.retired);
        let room = st.max_outstanding.saturating_sub(in_flight) as usize;
        let k = st.held_len.min(room);
        if k == 0 {
            return Ok(0);
        }
        for i in 0..k {
            let s = st.held[i];
            let d = &s.desc;
            let seq = st.next_seq.wrapping_add(i as u64);
            st.sges[i] = rdd_sge {
                addr: d.local_addr,
                length: d.length,
                lkey: d.lkey,
            };
            // The batch's last WR asks for a completion; it retires the
            // unsignaled ones before it (docs/architecture.md §4).
            let last = if i + 1 == k { RDD_SEND_SIGNALED } else { 0 };
            st.wrs[i] = rdd_wr {
                wr_id: seq,
                flags: (d.flags & RDD_SUBMIT_DESC_FLAGS) | last,
                remote_addr: d.remote_addr,
                rkey: d.rkey,
                ..BLANK_WR
            };
            st.pending[(seq & st.mask) as usize] = Pending {
                from: s.from,
                wr_id: d.wr_id,
            };
        }
        // Each WR's one-entry SGE list, now that `sges` is written.
        let sges = st.sges.as_ptr();
        for (i, w) in st.wrs[..k].iter_mut().enumerate() {
            // SAFETY: `i < k <= MAX_BATCH`, inside `sges`.
            w.sg_list = unsafe { sges.add(i) };
        }
        let mut bad = 0usize;
        // SAFETY: `wrs[0..k]` are initialised requests whose one-entry SGE
        // lists point into `sges`, alive for the call. Non-inline SGEs name
        // memory the device checks against its regions; an inline one
        // points at payload bytes the submitter vouched for
        // (`rdd_submit_post`'s contract) and that stay valid until its
        // completion is reaped, which cannot happen before this post.
        let status =
            unsafe { rdd_qp_post_send(as_handle::<rdd_qp>(core.qp), st.wrs.as_ptr(), k, &mut bad) };
        // The WRs before `bad` were posted (and rung) whatever the status;
        // `bad` stays 0 for the statuses that post nothing.
        let posted = if status == rdd_status::Ok {
            k
        } else {
            bad.min(k)
        };
        if posted > 0 {
            let st = self.state();
            st.next_seq = st.next_seq.wrapping_add(posted as u64);
            bump(&core.poll_stats.posted, posted as u64);
            let mut now = 0u64;
            // SAFETY: `now` is valid for one write.
            if unsafe { rdd_qp_doorbells(as_handle::<rdd_qp>(core.qp), &mut now) } == rdd_status::Ok
            {
                let seen = self.state().doorbells_seen;
                bump(&core.poll_stats.doorbells, now.wrapping_sub(seen));
                self.state().doorbells_seen = now;
            }
            self.shift_held(posted);
        }
        match status {
            rdd_status::Ok => {}
            // The rest waits for room: the next drain posts it.
            rdd_status::SqFull | rdd_status::CqFull => bump(&core.poll_stats.qp_full, 1),
            rdd_status::InvalidHandle => return Err(rdd_status::NoSuchObject),
            rdd_status::ResourceBusy | rdd_status::NullParameter => return Err(status),
            // Not connected yet (a QP in ERROR takes posts, and the device
            // flushes them): keep everything for a later drain.
            rdd_status::InvalidQpState => return Err(status),
            // A refused WR. The descriptors were validated at submission,
            // so this is not expected; complete that one descriptor with a
            // local error and keep the rest for the next drain.
            _ => {
                if self.state().held_len > 0 {
                    self.fail_held(0, RDD_WC_LOC_QP_OP_ERR);
                    self.shift_held(1);
                }
            }
        }
        Ok(posted)
    }

    /// `rdd_submit_complete`: one poll of the CQ; every completion goes to
    /// its submitters. Returns the descriptors completed.
    pub(super) fn complete(&mut self) -> Result<usize, rdd_status> {
        let core = self.core;
        let st = self.state();
        let qp = as_handle::<rdd_qp>(core.qp);
        let mut n = 0usize;
        // SAFETY: `qp` is one readable handle; `wcs` is valid for
        // `RDD_SUBMIT_POLL_BATCH` writes; `n` for one.
        let status = unsafe {
            rdd_cq_poll(
                as_handle(core.cq),
                &qp,
                1,
                st.wcs.as_mut_ptr(),
                st.wcs.len(),
                &mut n,
            )
        };
        match status {
            rdd_status::Ok => {}
            // A destroyed QP leaves its CQ with no QP to route to, which
            // `rdd_cq_poll` reports as a wrong list.
            rdd_status::InvalidHandle | rdd_status::InvalidArgument if self.qp_gone() => {
                return Err(rdd_status::NoSuchObject)
            }
            s => return Err(s),
        }
        let mut done = 0usize;
        for i in 0..n.min(RDD_SUBMIT_POLL_BATCH) {
            let wc = self.state().wcs[i];
            done += self.retire_to(&wc);
        }
        Ok(done)
    }

    /// Completes every posted WR up to `wc`'s: RC completes in order, so
    /// the unsignaled WRs before it succeeded, unless the QP had already
    /// failed (then they were flushed). Returns how many.
    fn retire_to(&mut self, wc: &rdd_wc) -> usize {
        let st = self.state();
        // Only the service posts sends on its QP; anything else (a
        // receive, a WR outside the posted window) is not ours.
        if wc.opcode >= RDD_WC_OP_RECV
            || wc.wr_id.wrapping_sub(st.retired) >= st.next_seq.wrapping_sub(st.retired)
        {
            return 0;
        }
        let mut n = 0;
        loop {
            let st = self.state();
            let seq = st.retired;
            let p = st.pending[(seq & st.mask) as usize];
            let (status, vendor_err) = if seq == wc.wr_id {
                (wc.status, wc.vendor_err)
            } else if st.errored {
                (RDD_WC_WR_FLUSH_ERR, 0)
            } else {
                (RDD_WC_SUCCESS, 0)
            };
            st.retired = seq.wrapping_add(1);
            let c = rdd_submit_completion {
                wr_id: p.wr_id,
                status,
                vendor_err,
            };
            self.route(p.from, c, false);
            n += 1;
            if seq == wc.wr_id {
                break;
            }
        }
        if wc.status != RDD_WC_SUCCESS {
            self.state().errored = true;
        }
        n
    }

    /// True if the bound QP handle no longer names a QP (destroyed; a
    /// handle never becomes valid again).
    fn qp_gone(&self) -> bool {
        let mut x = 0u64;
        // SAFETY: `x` is valid for one write; any handle value is safe.
        let s = unsafe { rdd_qp_doorbells(as_handle::<rdd_qp>(self.core.qp), &mut x) };
        s == rdd_status::InvalidHandle
    }

    /// `rdd_submit_flush`: completes everything the service holds (posted,
    /// held and queued) with `RDD_WC_WR_FLUSH_ERR`. Only once the QP is
    /// gone (the device no longer touches any of their buffers):
    /// `RESOURCE_BUSY` while it exists.
    pub(super) fn flush(&mut self) -> Result<usize, rdd_status> {
        let core = self.core;
        if !self.qp_gone() {
            return Err(rdd_status::ResourceBusy);
        }
        let mut n = 0usize;
        while self.state().retired != self.state().next_seq {
            let st = self.state();
            let p = st.pending[(st.retired & st.mask) as usize];
            st.retired = st.retired.wrapping_add(1);
            let c = rdd_submit_completion {
                wr_id: p.wr_id,
                status: RDD_WC_WR_FLUSH_ERR,
                vendor_err: 0,
            };
            self.route(p.from, c, true);
            n += 1;
        }
        loop {
            while self.state().held_len > 0 {
                self.fail_held(0, RDD_WC_WR_FLUSH_ERR);
                self.shift_held(1);
                n += 1;
            }
            let st = self.state();
            let got = st.poller.drain(&mut st.held[..MAX_BATCH]);
            if got == 0 {
                break;
            }
            st.held_len = got;
            bump(&core.poll_stats.drained, got as u64);
        }
        self.publish_held();
        Ok(n)
    }
}
