//! Shared receive queue calls on `rdd_srq` handles: create, destroy,
//! posting (the generic `rdd_srq_post_recv` and the per-opcode
//! `rdd_srq_recv` + `rdd_srq_ring`), limit arming and query
//! (docs/spec/soft.md §2; the Rust counterpart is `api::Srq`).
//!
//! An SRQ belongs to a PD; RC QPs of that PD are attached at creation by
//! `rdd_qp_create_on_srq` and take their receives from it. What an
//! attached QP shares with its SRQ ([`SrqShared`]: the sizing guard's
//! per-CQ account) is in an `Arc` the QP holds, so the number of attached
//! QPs is that `Arc`'s count, as a CQ's QPs are counted by its link. The
//! ring's producer side ([`mlx5::Srq`]) is the handle's, used exclusively
//! by posts and by the polls that complete its receives
//! (`srq_route.rs`).
//!
//! On rxe and siw the SRQ is the verbs backend's (`Backend::create_driver_srq`):
//! libibverbs' provider's on the verbs fallback data path
//! (`RDMA_DIRECT_DATA_PATH=fallback`, `ibv_post_srq_recv`), the backend's
//! own CREATE_SRQ ring on the direct rxe/siw rings: [`SrqQueue::Driver`].
//! Its receives complete on CQs that the backend polls, whose poller maps
//! each completion back to the user's wr_id and frees its slot itself (as
//! `api::Srq::route` is a pass-through there), so such an SRQ is never
//! bound to a CQ and no poll uses it. The verbs backend's mlx5 direct path
//! has no SRQs (`UNSUPPORTED`, as in the Rust API; docs/status.md).

use core::mem::size_of;
use core::ptr::NonNull;

use std::any::Any;
use std::boxed::Box;
use std::sync::{Arc, Mutex};
use std::vec;
use std::vec::Vec;

use static_assertions::const_assert_eq;

use crate::api::{Backend, RawSrqPath, SrqDriver};
use crate::attr::SrqAttr;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_recv, rdd_recv_wr, RDD_SEND_DEFER_DOORBELL};
use crate::provider::mlx5::{self, SrqSlot};
use crate::wr::{RecvWr, Sge};

use super::objects::{CqBudget, PdObj};
use super::table::{excl, insert, shared, ExclusiveCell, Object, KIND_SRQ};
use super::types::rdd_pd;
use super::{as_handle, check_array, h, put};

// ---------------------------------------------------------------------
// C types
// ---------------------------------------------------------------------

/// A shared receive queue (opaque handle): `rdd_srq_create` /
/// `rdd_srq_destroy`.
pub struct rdd_srq {
    _private: [u8; 0],
}

/// SRQ creation attributes for `rdd_srq_create`. 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_srq_init {
    /// Receives the SRQ must hold at once (at least 1; the software
    /// device allows up to 32767).
    pub max_wr: u32,
    /// Scatter entries per receive (at least 1; the software device
    /// allows up to 31).
    pub max_sge: u32,
    /// Must be 0 (`RDD_STATUS_INVALID_ARGUMENT` otherwise).
    pub reserved: u32,
}

const_assert_eq!(size_of::<rdd_srq_init>(), 12);

/// What `rdd_srq_query` reports. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_srq_attr {
    /// Receives the SRQ holds at once, as granted (at least what
    /// `rdd_srq_init.max_wr` asked for).
    pub max_wr: u32,
    /// Scatter entries per receive, as granted.
    pub max_sge: u32,
    /// The armed limit (`rdd_srq_arm_limit`), 0 when not armed, also
    /// after its event fired.
    pub limit: u32,
    /// The SRQ number: what an `RDD_EVENT_SRQ_LIMIT_REACHED` event names
    /// in `rdd_async_event.element`.
    pub srqn: u32,
}

const_assert_eq!(size_of::<rdd_srq_attr>(), 16);

// ---------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------

/// What every QP attached to an SRQ shares with it: the sizing guard's
/// account. Every receive of the SRQ may complete on the receive CQ of
/// any attached QP, so the SRQ's `max_wr` is charged once on each such
/// CQ (not once per QP), as `api::Pd::create_qp` does.
pub(super) struct SrqShared {
    pub(super) srqn: u32,
    max_wr: u64,
    /// The receive CQs' accounts and how many attached QPs use each.
    cqs: Mutex<Vec<(Arc<CqBudget>, u32)>>,
}

impl SrqShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Arc<CqBudget>, u32)>> {
        // Each change is one statement after its checks: a poisoned lock
        // still holds consistent counts.
        self.cqs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A QP's attachment to its SRQ (held by the `QpObj`): dropping it, when
/// the QP goes, gives the SRQ's charge on the QP's receive CQ back once
/// no other QP of the SRQ uses that CQ.
pub(super) struct SrqAttach {
    pub(super) srqn: u32,
    shared: Arc<SrqShared>,
    budget: Arc<CqBudget>,
}

impl SrqAttach {
    /// Attaches a QP whose receives complete on the CQ with account
    /// `budget`: the first QP of the SRQ on that CQ charges the SRQ's
    /// `max_wr` there (`CQ_TOO_SMALL` if it does not fit, nothing
    /// changed).
    pub(super) fn attach(s: &SrqObj, budget: &Arc<CqBudget>) -> Result<SrqAttach, rdd_status> {
        let sh = &s.shared;
        let mut cqs = sh.lock();
        if let Some(e) = cqs.iter_mut().find(|(b, _)| Arc::ptr_eq(b, budget)) {
            e.1 += 1;
        } else {
            if !budget.charge(sh.max_wr) {
                return Err(rdd_status::CqTooSmall);
            }
            cqs.push((Arc::clone(budget), 1));
        }
        Ok(SrqAttach {
            srqn: sh.srqn,
            shared: Arc::clone(sh),
            budget: Arc::clone(budget),
        })
    }
}

impl Drop for SrqAttach {
    fn drop(&mut self) {
        let mut cqs = self.shared.lock();
        if let Some(i) = cqs.iter().position(|(b, _)| Arc::ptr_eq(b, &self.budget)) {
            cqs[i].1 -= 1;
            if cqs[i].1 == 0 {
                let (b, _) = cqs.swap_remove(i);
                b.release(self.shared.max_wr);
            }
        }
    }
}

/// The SRQ's producer side.
pub(super) enum SrqQueue {
    /// The mlx5 ring and the side table it points into (boxed: its heap
    /// buffer never moves).
    Mlx5 {
        q: mlx5::Srq,
        _slots: Box<[SrqSlot]>,
    },
    /// A provider-posted SRQ (the verbs fallback): it posts through
    /// `ibv_post_srq_recv` at once, so nothing is ever deferred.
    Driver(Box<dyn SrqDriver>),
}

pub(super) struct SrqObj {
    pub(super) backend: Arc<dyn Backend>,
    /// The PD's handle (a QP attached must be of this PD).
    pub(super) pd: usize,
    pub(super) srqn: u32,
    /// Granted sizes.
    pub(super) attr: SrqAttr,
    /// The queue is [`SrqQueue::Driver`]: its QPs are provider-posted
    /// (`QpImpl::Driver`) and it is never bound to a CQ.
    pub(super) driver: bool,
    pub(super) q: ExclusiveCell<SrqQueue>,
    /// Cloned by every attached QP ([`SrqAttach`]).
    pub(super) shared: Arc<SrqShared>,
    /// `rdd_srq_destroy` destroyed the device's SRQ already.
    destroyed: bool,
    _keep: Arc<dyn Any + Send + Sync>,
    _pd_link: Arc<()>,
}

impl SrqObj {
    /// QPs attached now.
    pub(super) fn attached(&self) -> usize {
        Arc::strong_count(&self.shared) - 1
    }
}

impl Drop for SrqObj {
    fn drop(&mut self) {
        // No QP is attached (the count is checked before every destroy,
        // and a failed `insert` drops an SRQ nobody knows): the device
        // agrees. The ring memory goes with the fields afterwards.
        if !self.destroyed {
            let _ = self.backend.destroy_srq(self.srqn);
        }
    }
}

// SAFETY: the core queue only names memory kept alive by `_keep` and the
// boxed side table owned next to it (a driver queue is `Send` itself); the
// handle table gives `&mut` access to one thread at a time
// (`ExclusiveCell`).
unsafe impl Send for SrqQueue {}

// SAFETY: each kind value is used by exactly one type.
unsafe impl Object for SrqObj {
    const KIND: u8 = KIND_SRQ;
}

// ---------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------

/// Creates a shared receive queue on `pd` for at least `init->max_wr`
/// receives of up to `init->max_sge` scatter entries each; the granted
/// sizes are in `rdd_srq_query`. RC QPs of the same PD are attached to it
/// at creation with `rdd_qp_create_on_srq`.
///
/// Errors (nothing is created and `*out` is not written):
/// `NULL_PARAMETER` (`pd`, `init`, `out`), `INVALID_HANDLE`,
/// `RESOURCE_BUSY` (the PD in use by another thread's exclusive call),
/// `INVALID_ARGUMENT` (`init->reserved` not 0), `INVALID_ATTRIBUTE`
/// (`max_wr` or `max_sge` 0 or above the device's limits: 32767 and 31 on
/// the software device), `UNSUPPORTED` (a device or data path without
/// SRQs: ConnectX's mlx5 path; rxe and siw have them on both data paths,
/// the direct rings and the verbs fallback), `RESOURCE_EXHAUSTED`.
///
/// # Safety
/// `init` is valid for reads of one `rdd_srq_init`; `out` for a write of
/// one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_srq_create(
    pd: *mut rdd_pd,
    init: *const rdd_srq_init,
    out: *mut *mut rdd_srq,
) -> rdd_status {
    ffi_boundary!({
        non_null!(init, out);
        // SAFETY: non-NULL and readable (caller contract).
        let init = unsafe { init.read_unaligned() };
        let p = try_status!(shared::<PdObj>(h(pd)));
        if init.reserved != 0 {
            return rdd_status::InvalidArgument;
        }
        if init.max_wr == 0 || init.max_sge == 0 {
            return rdd_status::InvalidAttribute;
        }
        let b = &p.backend;
        let raw = match b.create_srq(p.pd, init.max_wr, init.max_sge) {
            Ok(r) => r,
            // A provider-posted SRQ where there is no mlx5 ring (the verbs
            // fallback), as `api::Pd::create_srq`.
            Err(crate::error::Error::Unsupported) => {
                let d = match b.create_driver_srq(p.pd, init.max_wr, init.max_sge) {
                    Ok(d) => d,
                    Err(e) => return e.into(),
                };
                // SAFETY: forwarded contract (`out` writable).
                return unsafe {
                    insert_srq(
                        Arc::clone(&p.link),
                        b,
                        pd,
                        SrqQueue::Driver(d.driver),
                        d.srqn,
                        d.attr,
                        d.keep,
                        out,
                    )
                };
            }
            Err(e) => return e.into(),
        };
        let RawSrqPath::Mlx5(geo) = raw.path;
        let mut slots = vec![SrqSlot::default(); geo.nwqes as usize].into_boxed_slice();
        // SAFETY: the geometry names ring memory kept alive by `raw.keep`
        // (held by the SrqObj as long as the queue); the side table is
        // boxed and owned next to the queue; every SGE posted is checked by
        // the device against its registered regions before any access, and
        // scatter-to-CQE is off on the object level's pollers.
        let made = NonNull::new(slots.as_mut_ptr())
            .ok_or(crate::error::Error::InvalidGeometry)
            .and_then(|sp| unsafe { mlx5::Srq::from_raw(&geo, sp, slots.len()) });
        let q = match made {
            Ok(q) => q,
            Err(e) => {
                let _ = b.destroy_srq(raw.srqn);
                return e.into();
            }
        };
        let queue = SrqQueue::Mlx5 { q, _slots: slots };
        // SAFETY: forwarded contract (`out` writable).
        unsafe {
            insert_srq(
                Arc::clone(&p.link),
                b,
                pd,
                queue,
                raw.srqn,
                raw.attr,
                raw.keep,
                out,
            )
        }
    })
}

/// The end of `rdd_srq_create`: the object over a created SRQ, inserted
/// into the handle table and written to `*out`. A failed insert drops the
/// object, which destroys the device's SRQ.
///
/// # Safety
/// `out` is non-NULL and valid for a write of one pointer.
#[allow(clippy::too_many_arguments)]
unsafe fn insert_srq(
    pd_link: Arc<()>,
    b: &Arc<dyn Backend>,
    pd: *mut rdd_pd,
    queue: SrqQueue,
    srqn: u32,
    attr: SrqAttr,
    keep: Arc<dyn Any + Send + Sync>,
    out: *mut *mut rdd_srq,
) -> rdd_status {
    let obj = Box::new(SrqObj {
        backend: Arc::clone(b),
        pd: h(pd),
        srqn,
        attr,
        driver: matches!(queue, SrqQueue::Driver(_)),
        q: ExclusiveCell(queue),
        shared: Arc::new(SrqShared {
            srqn,
            max_wr: u64::from(attr.max_wr),
            cqs: Mutex::new(Vec::new()),
        }),
        destroyed: false,
        _keep: keep,
        _pd_link: pd_link,
    });
    let handle = try_status!(insert(obj));
    // SAFETY: non-NULL (checked by the caller), writable (caller contract).
    unsafe { put(out, as_handle(handle)) };
    rdd_status::Ok
}

/// Destroys a shared receive queue; receives still posted are dropped
/// with it (as `ibv_destroy_srq` drops them). `RESOURCE_BUSY` while QPs
/// are attached (destroy them first) or while another thread uses the
/// SRQ: nothing changes then and posted receives stay posted.
#[no_mangle]
pub extern "C" fn rdd_srq_destroy(srq: *mut rdd_srq) -> rdd_status {
    ffi_boundary!({
        let mut s = try_status!(excl::<SrqObj>(h(srq)));
        if s.attached() != 0 {
            return rdd_status::ResourceBusy;
        }
        if let Err(e) = s.backend.destroy_srq(s.srqn) {
            return e.into();
        }
        s.destroyed = true;
        s.destroy();
        rdd_status::Ok
    })
}

/// Posts receive work requests `wrs[0..n]` to the SRQ and publishes them
/// to the device once (`ibv_post_srq_recv`). The rules of
/// `rdd_qp_post_recv`: the call stops at the first refused request (the
/// ones before it are posted and published), `*out_bad_index` is written
/// exactly when a request's status is returned (`TOO_MANY_SGES`: more than
/// the granted `max_sge`; `LENGTH_OVERFLOW`; `RQ_FULL`: every WQE is
/// posted or completed but not yet polled, so poll the CQs; or
/// `INVALID_ARGUMENT` for a misaligned or too large array, index 0), and
/// not on `OK`, `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY`, which
/// post nothing. Zero-length SGEs are posted as they are.
///
/// The receives complete on the receive CQ of whichever attached QP a
/// SEND (or RDMA WRITE with immediate) arrives at, with that QP's number
/// in `rdd_wc.qp_num` and the receive's `wr_id`. They are not metered
/// against an unguarded CQ's headroom (the sizing guard counts the SRQ's
/// `max_wr` once on each such CQ instead).
///
/// On the verbs fallback (a provider-posted SRQ) each request is one
/// `ibv_post_srq_recv` of its own, published at once.
///
/// # Safety
/// `wrs` points to `n` readable `rdd_recv_wr`, each `sg_list` to
/// `num_sge` readable entries naming memory of this device's MRs (checked
/// by the device). `out_bad_index` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_srq_post_recv(
    srq: *mut rdd_srq,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut s = try_status!(excl::<SrqObj>(h(srq)));
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        let q = match s.q.get_mut() {
            SrqQueue::Mlx5 { q, .. } => q,
            SrqQueue::Driver(d) => {
                // SAFETY: the caller's contract on `wrs` (checked above).
                return unsafe { post_recv_driver(&mut **d, wrs, n, out_bad_index) };
            }
        };
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned and holds `n` readable
            // requests (checked / caller contract); the SGE contract is
            // the caller's.
            let posted = match unsafe { parse_recv(&*wrs.add(i)) } {
                // SAFETY: SGEs only reach the device, which checks each
                // against its registered regions before any access.
                Ok(rwr) => unsafe { q.post(&rwr) }.map_err(rdd_status::from),
                Err(st) => Err(st),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_bad_index, i) };
                result = status;
                break;
            }
        }
        q.ring();
        result
    })
}

/// `rdd_srq_post_recv` on a provider-posted SRQ: each request parsed and
/// posted in turn (one `ibv_post_srq_recv` each), stopping at the first
/// refused one with its index in `*out_bad_index`.
///
/// # Safety
/// `wrs` is non-NULL, aligned and holds `n` readable requests whose SGEs
/// name memory the device checks; `out_bad_index` is writable.
unsafe fn post_recv_driver(
    d: &mut dyn SrqDriver,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    for i in 0..n {
        // SAFETY: `i < n` inside the caller's array (caller contract).
        let posted = match unsafe { parse_recv(&*wrs.add(i)) } {
            Ok(rwr) => d
                .post_recv(core::slice::from_ref(&rwr))
                .map_err(|e| rdd_status::from(e.error)),
            Err(st) => Err(st),
        };
        if let Err(status) = posted {
            // SAFETY: non-NULL (checked by the caller), writable.
            unsafe { put(out_bad_index, i) };
            return status;
        }
    }
    rdd_status::Ok
}

/// Posts one receive of up to `length` bytes into `laddr` (local key
/// `lkey`, a region with local write) to the SRQ: `rdd_srq_post_recv` of
/// one `rdd_recv_wr` with one SGE. `flags` is 0 or
/// `RDD_SEND_DEFER_DOORBELL`: the receive is then published to the device
/// by the next `rdd_srq_recv` without it, `rdd_srq_post_recv` or
/// `rdd_srq_ring` (one doorbell-record update for a batch; on the verbs
/// fallback the bit is a hint: every receive is published at once).
///
/// `OK`; `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (the handle);
/// `INVALID_FLAGS` (any other bit); `TOO_MANY_SGES` (never with one SGE),
/// `LENGTH_OVERFLOW`, `RQ_FULL`. A refused call writes nothing.
///
/// # Safety
/// `laddr`/`lkey` name memory of this device's regions (checked by the
/// device).
#[no_mangle]
pub unsafe extern "C" fn rdd_srq_recv(
    srq: *mut rdd_srq,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let mut s = try_status!(excl::<SrqObj>(h(srq)));
        if flags & !RDD_SEND_DEFER_DOORBELL != 0 {
            return rdd_status::InvalidFlags;
        }
        let sge = [Sge::new(laddr, length, lkey)];
        let wr = RecvWr { wr_id, sges: &sge };
        let q = match s.q.get_mut() {
            SrqQueue::Mlx5 { q, .. } => q,
            // Posted at once (nothing is deferred on the provider's SRQ).
            SrqQueue::Driver(d) => {
                return match d.post_recv(core::slice::from_ref(&wr)) {
                    Ok(()) => rdd_status::Ok,
                    Err(e) => e.error.into(),
                };
            }
        };
        // SAFETY: SGEs only reach the device, which checks each against its
        // registered regions before any access.
        match unsafe { q.post(&wr) } {
            Ok(()) => {
                if flags & RDD_SEND_DEFER_DOORBELL == 0 {
                    q.ring();
                }
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}

/// Publishes the receives posted to the SRQ with `RDD_SEND_DEFER_DOORBELL`
/// and not published yet (one doorbell-record update). Nothing pending:
/// nothing happens (always the case on the verbs fallback, which defers
/// nothing). `OK`; `NULL_PARAMETER`, `INVALID_HANDLE`,
/// `RESOURCE_BUSY`.
#[no_mangle]
pub extern "C" fn rdd_srq_ring(srq: *mut rdd_srq) -> rdd_status {
    ffi_boundary!({
        let mut s = try_status!(excl::<SrqObj>(h(srq)));
        if let SrqQueue::Mlx5 { q, .. } = s.q.get_mut() {
            q.ring();
        }
        rdd_status::Ok
    })
}

/// Arms the SRQ's limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): when the
/// device takes a receive and fewer than `limit` posted receives are left,
/// it raises one `RDD_EVENT_SRQ_LIMIT_REACHED` event
/// (`rdd_device_poll_async_event`, `element` = the SRQ number of
/// `rdd_srq_query`) and disarms the limit; arm again for another event.
/// 0 disarms. `INVALID_ATTRIBUTE` for a limit above the granted `max_wr`
/// (nothing changes); `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY`.
/// On rxe and siw the kernel raises the event (on both data paths) and
/// the call is `ibv_modify_srq` on the fallback, the backend's own
/// MODIFY_SRQ on the direct rings; a refusal there is `PROVIDER_ERROR`.
#[no_mangle]
pub extern "C" fn rdd_srq_arm_limit(srq: *mut rdd_srq, limit: u32) -> rdd_status {
    ffi_boundary!({
        let s = try_status!(excl::<SrqObj>(h(srq)));
        if limit > s.attr.max_wr {
            return rdd_status::InvalidAttribute;
        }
        match s.backend.arm_srq_limit(s.srqn, limit) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}

/// The SRQ's granted sizes, its armed limit as the device has it, and its
/// number (see `rdd_srq_attr`). `*out` is written only on `OK`.
/// `UNSUPPORTED` on siw's fallback path (libsiw, rdma-core 44, has no
/// `ibv_query_srq`: the limit is not known, so nothing is reported). On
/// siw's direct ring the kernel answers, but after the limit event it
/// still reports the limit as last armed, not 0 (docs/spec/siw.md §5).
///
/// # Safety
/// `out` is valid for a write of one `rdd_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn rdd_srq_query(srq: *const rdd_srq, out: *mut rdd_srq_attr) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let s = try_status!(shared::<SrqObj>(h(srq)));
        let dev = match s.backend.query_srq(s.srqn) {
            Ok(a) => a,
            Err(e) => return e.into(),
        };
        let attr = rdd_srq_attr {
            max_wr: s.attr.max_wr,
            max_sge: s.attr.max_sge,
            limit: dev.srq_limit,
            srqn: s.srqn,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, attr) };
        rdd_status::Ok
    })
}
