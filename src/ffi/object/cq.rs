//! Completion queue calls: create, destroy, poll (with the routing list of
//! the CQ's QPs) and the sizing guard's settings.

use core::mem::MaybeUninit;

use std::boxed::Box;
use std::sync::Arc;
use std::vec::Vec;

use crate::api::{Headroom, RawCqPath};
use crate::ffi::mlx5::rdd_wc;
use crate::ffi::status::rdd_status;
use crate::provider::mlx5::{CompletionQueue, CqRoute, QpQueues, Wc};

use super::objects::{CqBudget, CqDesc, CqImpl, CqObj, DeviceObj, QpImpl, QpObj};
use super::srq_route::{BoundSrq, WithSrqs};
use super::table::{excl, insert, shared, Excl, ExclusiveCell};
use super::types::{rdd_cq, rdd_device, rdd_qp, rdd_qp_init, RDD_CQ_MAX_QPS, RDD_QP_INIT_SIG_ALL};
use super::{as_handle, check_array, h, put};

// ---------------------------------------------------------------------
// Completion queue
// ---------------------------------------------------------------------

/// Creates a completion queue with room for at least `depth` completions
/// (1..32767; `INVALID_ATTRIBUTE` otherwise).
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_create(
    dev: *mut rdd_device,
    depth: u32,
    out: *mut *mut rdd_cq,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let raw = match d.backend.create_cq(depth) {
            Ok(r) => r,
            Err(e) => return e.into(),
        };
        let mlx5_dv = match &raw.path {
            RawCqPath::Mlx5(dv) => Some(CqDesc(*dv)),
            RawCqPath::Driver(_) => None,
        };
        let cq = match raw.path {
            // SAFETY: the backend's descriptor names live CQ memory kept
            // alive by `raw.keep`, which the CqObj holds as long as the
            // poller.
            RawCqPath::Mlx5(dv) => match unsafe { CompletionQueue::from_raw(&dv) } {
                Ok(mut cq) => {
                    // The device never scatters to CQEs; never trust a copy.
                    cq.set_scatter_to_cqe(false);
                    CqImpl::Mlx5(cq)
                }
                Err(e) => {
                    let _ = d.backend.destroy_cq(raw.cqn);
                    return e.into();
                }
            },
            RawCqPath::Driver(p) => CqImpl::Driver(p),
        };
        let capacity = u64::from(match &cq {
            CqImpl::Mlx5(c) => c.cqe_cnt(),
            CqImpl::Driver(p) => p.depth(),
        });
        let obj = Box::new(CqObj {
            dev: h(dev),
            backend: Arc::clone(&d.backend),
            cqn: raw.cqn,
            budget: Arc::new(CqBudget {
                capacity,
                committed: core::sync::atomic::AtomicU64::new(0),
                unguarded: core::sync::atomic::AtomicBool::new(false),
                headroom: Headroom::new(capacity),
            }),
            cq: ExclusiveCell(cq),
            adaptive: ExclusiveCell(crate::event::Adaptive::new(Default::default())),
            link: Arc::new(()),
            bound: Vec::with_capacity(4),
            srqs: Vec::new(),
            srq_gate: 0,
            mlx5_dv,
            _keep: raw.keep,
            _dev_link: Arc::clone(&d.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Destroys a completion queue. `RESOURCE_BUSY` while a QP uses it.
#[no_mangle]
pub extern "C" fn rdd_cq_destroy(cq: *mut rdd_cq) -> rdd_status {
    ffi_boundary!({
        let c = try_status!(excl::<CqObj>(h(cq)));
        if c.attached() != 0 {
            return rdd_status::ResourceBusy;
        }
        c.destroy();
        rdd_status::Ok
    })
}

/// A fixed-capacity list of exclusively held QPs (no allocation on the
/// data path).
pub(super) struct QpList {
    items: [MaybeUninit<Excl<QpObj>>; RDD_CQ_MAX_QPS],
    len: usize,
}

impl QpList {
    pub(super) fn new() -> QpList {
        QpList {
            items: [const { MaybeUninit::uninit() }; RDD_CQ_MAX_QPS],
            len: 0,
        }
    }

    pub(super) fn push(&mut self, g: Excl<QpObj>) {
        self.items[self.len].write(g);
        self.len += 1;
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [Excl<QpObj>] {
        // SAFETY: the first `len` items were written by `push` and are
        // initialised; `MaybeUninit<T>` has the layout of `T`.
        unsafe { core::slice::from_raw_parts_mut(self.items.as_mut_ptr().cast(), self.len) }
    }
}

impl Drop for QpList {
    fn drop(&mut self) {
        for g in &mut self.items[..self.len] {
            // SAFETY: initialised by `push`, dropped once.
            unsafe { g.assume_init_drop() };
        }
    }
}

impl CqRoute for QpList {
    #[inline]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.as_mut_slice()
            .iter_mut()
            .find(|q| q.qpn == qpn)
            .and_then(|q| match q.q.get_mut() {
                QpImpl::Mlx5(owned) => Some(QpQueues {
                    sq: &mut owned.sq,
                    rq: &mut owned.rq,
                }),
                QpImpl::Driver(_) => None,
            })
    }
}

/// Polls up to `n` completions into `out[0..n]`; `*out_count` (0..n) is
/// the number written.
///
/// `qps[0..nqps]` must be exactly the QPs that complete on this CQ (as
/// send or receive CQ), each once: the poller routes every completion to
/// its QP's queues by QP number, and a list that omits one would drop its
/// completions, so it is rejected with `INVALID_ARGUMENT` (as are a QP of
/// another CQ and a repeated QP). All the handles are used by the call.
/// A failed completion moves its QP to the error state; later work on it
/// completes with `RDD_WC_WR_FLUSH_ERR`.
///
/// Receives of QPs on an SRQ (`rdd_qp_create_on_srq`) complete through
/// the SRQ: the entry reports the SRQ receive's `wr_id` and the QP's
/// number in `qp_num`, and its WQE goes back to the SRQ's free list. Such
/// a poll uses the SRQs it completes receives of exclusively too; one in
/// use by another thread (a post to it, a poll of another CQ) stops the
/// poll in front of that entry without consuming it: the completions
/// before it are returned, or `RESOURCE_BUSY` when it is the first.
///
/// Errors leave `out` and `*out_count` unwritten: `NULL_PARAMETER` (a NULL
/// array, output or QP handle), `INVALID_HANDLE`, `RESOURCE_BUSY` (a
/// handle in use by another thread), `INVALID_ARGUMENT`, `CQE_CORRUPT`.
///
/// # Safety
/// `qps` points to `nqps` readable handles; `out` is valid for writes of
/// `n` `rdd_wc`; `out_count` for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_poll(
    cq: *mut rdd_cq,
    qps: *const *mut rdd_qp,
    nqps: usize,
    out: *mut rdd_wc,
    n: usize,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        try_status!(check_array(qps, nqps));
        try_status!(check_array(out.cast_const(), n));
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        // Filled in place: the list is 8 KiB, too big to move.
        let mut list = QpList::new();
        // SAFETY: the caller's contract on `qps` (checked above).
        if let Err(s) = unsafe { route_list(&c, cq, qps, nqps, &mut list) } {
            return s;
        }
        // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
        // (checked / caller contract); `rdd_wc` has the layout of `Wc`
        // (asserted in the mlx5 module) and every bit pattern is valid.
        let out_wc = unsafe { core::slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let budget = Arc::clone(&c.budget);
        let co: &mut CqObj = &mut c;
        let r = if co.srqs.is_empty() {
            poll_counted(co.cq.get_mut(), &budget, &mut list, out_wc)
        } else {
            poll_counted_srqs(co.cq.get_mut(), &budget, &mut list, &co.srqs, out_wc)
        };
        match r {
            Ok(count) => {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_count, count) };
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}

/// Polls, and on an unguarded CQ gives every consumed CQE's room back to
/// the posters' headroom check (forced signals the poller retires without
/// reporting included: the consumer index counts them).
pub(super) fn poll_counted<R: CqRoute + ?Sized>(
    cq: &mut CqImpl,
    budget: &CqBudget,
    list: &mut R,
    out: &mut [Wc],
) -> crate::error::Result<usize> {
    let cq = match cq {
        CqImpl::Mlx5(cq) => cq,
        CqImpl::Driver(p) => {
            // The provider retires queue space itself; it reports every
            // completion it was asked for (as `api::Cq`'s driver case).
            let r = p.poll(out);
            if budget.metered() {
                budget.headroom.unreserve(*r.as_ref().unwrap_or(&0) as u64);
            }
            return r;
        }
    };
    if !budget.metered() {
        return cq.poll(list, out);
    }
    let ci = cq.consumer_index();
    let r = cq.poll(list, out);
    let consumed = cq.consumer_index().wrapping_sub(ci);
    budget.headroom.unreserve(u64::from(consumed));
    r
}

/// [`poll_counted`] for a CQ that QPs on SRQs receive on: their receives
/// complete through the SRQs (`srq_route.rs`). Out of line, so that the
/// poll of a CQ without SRQs keeps its code.
#[inline(never)]
pub(super) fn poll_counted_srqs(
    cq: &mut CqImpl,
    budget: &CqBudget,
    list: &mut QpList,
    srqs: &[BoundSrq],
    out: &mut [Wc],
) -> crate::error::Result<usize> {
    let mut route = WithSrqs::new(list, srqs);
    poll_counted(cq, budget, &mut route, out)
}

/// Acquires into the empty `list` the QPs a poll routes to: every QP
/// attached to the CQ, each exactly once, each completing there.
///
/// # Safety
/// `qps` is non-NULL, aligned and holds `nqps` readable handles.
pub(super) unsafe fn route_list(
    c: &CqObj,
    cq: *mut rdd_cq,
    qps: *const *mut rdd_qp,
    nqps: usize,
    list: &mut QpList,
) -> Result<(), rdd_status> {
    if nqps != c.attached() {
        return Err(rdd_status::InvalidArgument);
    }
    for i in 0..nqps {
        // SAFETY: `qps` holds `nqps` readable handles (caller contract).
        let qh = h(unsafe { qps.add(i).read() });
        let g = match excl::<QpObj>(qh) {
            Ok(g) => g,
            Err(rdd_status::ResourceBusy) if qps_index_handle(qps, i, qh) => {
                // Held by this very call: a repeated QP.
                return Err(rdd_status::InvalidArgument);
            }
            Err(e) => return Err(e),
        };
        if g.send_cq != h(cq) && g.recv_cq != h(cq) {
            return Err(rdd_status::InvalidArgument);
        }
        list.push(g);
    }
    Ok(())
}

/// True if handle `qh` at `qps[i]` also appears at an earlier index.
fn qps_index_handle(qps: *const *mut rdd_qp, i: usize, qh: usize) -> bool {
    (0..i).any(|j| {
        // SAFETY: `j < i < nqps`, inside the array the caller vouched for
        // (`rdd_cq_poll` contract).
        h(unsafe { qps.add(j).read() }) == qh
    })
}

/// Opts the CQ in (`unguarded` = 0, the default) or out (non-zero) of the
/// sizing guard: `rdd_qp_create` refuses with `CQ_TOO_SMALL` a QP whose
/// queues could, flushed at once, overfill a guarded CQ. Opt out only if
/// you moderate completions yourself; an overrun loses completions.
///
/// # Safety
/// None beyond a handle from `rdd_cq_create`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_set_unguarded(
    cq: *mut rdd_cq,
    unguarded: core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        let c = try_status!(shared::<CqObj>(h(cq)));
        // Relaxed: a setting read on the control path.
        c.budget
            .unguarded
            .store(unguarded != 0, core::sync::atomic::Ordering::Relaxed);
        rdd_status::Ok
    })
}

/// The CQ's depth and the worst-case completions its QPs could have
/// outstanding (`*out_committed`): a QP refused with `CQ_TOO_SMALL` needs
/// a CQ of at least `committed` + its own send and receive queue sizes.
///
/// # Safety
/// `out_depth` and `out_committed` are valid for a write of one
/// `uint64_t` each.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_budget(
    cq: *const rdd_cq,
    out_depth: *mut u64,
    out_committed: *mut u64,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_depth);
        non_null!(out_committed);
        let c = try_status!(shared::<CqObj>(h(cq)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe {
            put(out_depth, c.budget.capacity);
            // Relaxed: a snapshot.
            put(
                out_committed,
                c.budget
                    .committed
                    .load(core::sync::atomic::Ordering::Relaxed),
            );
        }
        rdd_status::Ok
    })
}

/// The CQ depth that QPs created with `inits[0..n]` need if all their
/// send and receive completions go to one CQ: the sizing guard's worst
/// case, every WR their queues can hold, as the device sizes them (the C
/// counterpart of `Device::cq_depth_for`). Pass `*out_depth` to
/// `rdd_cq_create`; `rdd_qp_create` then accepts those QPs on that CQ. For
/// separate send and receive CQs it is an upper bound for each. A default
/// QP (`rdd_qp_create` with a NULL `init`) is `{64, 64, 4, 4, 64, 0}`.
/// `n` = 0 gives 1. The device is used shared (no state changes).
///
/// Errors: `NULL_PARAMETER` (`dev`, `inits` even with `n` 0, or
/// `out_depth`), `INVALID_HANDLE` (a closed or forged `dev`), `INVALID_ARGUMENT` (unknown `flags` bits in
/// an init, a misaligned `inits`, `n` too large to address).
///
/// # Safety
/// `inits` is valid for reads of `n` `rdd_qp_init`; `out_depth` is valid
/// for a write of one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_cq_depth_for(
    dev: *const rdd_device,
    inits: *const rdd_qp_init,
    n: usize,
    out_depth: *mut u32,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_depth);
        try_status!(check_array(inits, n));
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let mut depth = 0u32;
        for i in 0..n {
            // SAFETY: `i < n` inside the array the caller vouched for
            // (checked non-NULL and aligned above).
            let init = unsafe { inits.add(i).read() };
            if init.flags & !RDD_QP_INIT_SIG_ALL != 0 {
                return rdd_status::InvalidArgument;
            }
            let qi = init.queue_sizes();
            let (s, r) = d.backend.cq_demand(&qi);
            depth = depth.saturating_add(s.saturating_add(r));
        }
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_depth, depth.max(1)) };
        rdd_status::Ok
    })
}
