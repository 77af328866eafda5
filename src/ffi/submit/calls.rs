//! The service's lifetime and the submitter side: create, destroy,
//! register, unregister, post (submit), reap and query.

use core::mem::{align_of, size_of};

use std::boxed::Box;
use std::sync::Arc;

use static_assertions::const_assert;

use crate::ffi::mlx5::{rdd_qp_caps, rdd_wc};
use crate::ffi::object::{
    as_handle, excl, h, insert, put, rdd_cq, rdd_cq_poll, rdd_qp, rdd_qp_doorbells,
    rdd_qp_query_caps, shared, Object, KIND_EXPOSURE, KIND_POOL,
};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{RDD_SEND_INLINE, RDD_WR_RDMA_WRITE};
use crate::ring::submit::ServiceError;

use super::service::{bump, Binding, Core, SvcSubmitter};
use super::types::{
    rdd_submit_completion, rdd_submit_config, rdd_submit_desc, rdd_submit_service, rdd_submitter,
    RDD_SUBMIT_DEFAULT_BATCH, RDD_SUBMIT_DEFAULT_OUTSTANDING, RDD_SUBMIT_DESC_FLAGS,
    RDD_SUBMIT_MAX_BATCH, RDD_SUBMIT_MAX_OUTSTANDING,
};

// ---------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------

/// Handle kinds of this module. `ffi::object`'s table lists kinds 1..=9
/// (device, PD, MR, CQ, QP, pool, exposure, SRQ, AH); these sit well apart from
/// them so a new kind added there cannot collide.
const KIND_SUBMIT_SERVICE: u8 = 0x40;
const KIND_SUBMITTER: u8 = 0x41;
const_assert!(KIND_SUBMIT_SERVICE > KIND_EXPOSURE && KIND_SUBMIT_SERVICE > KIND_POOL);

/// A service handle's object.
pub(super) struct ServiceObj {
    /// Cloned by every submitter object.
    pub(super) core: Arc<Core>,
}

/// A submitter handle's object.
pub(super) struct SubmitterObj {
    /// Borrows the service in `core`: declared first, so dropped first.
    sub: SvcSubmitter,
    core: Arc<Core>,
}

// SAFETY: each kind value is used by exactly one type, and by no type of
// `ffi::object` (see the kinds above).
unsafe impl Object for ServiceObj {
    const KIND: u8 = KIND_SUBMIT_SERVICE;
}
// SAFETY: as above.
unsafe impl Object for SubmitterObj {
    const KIND: u8 = KIND_SUBMITTER;
}

/// Checks a C array parameter: non-NULL (`NULL_PARAMETER`), aligned for
/// `T` and small enough to address (`INVALID_ARGUMENT`).
#[inline(always)]
pub(super) fn check_array<T>(p: *const T, n: usize) -> Result<(), rdd_status> {
    if p.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if p as usize % align_of::<T>() != 0 || n > isize::MAX as usize / size_of::<T>() {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Service lifetime
// ---------------------------------------------------------------------

/// Creates a poll-mode submission service that posts RDMA WRITEs on `qp`
/// and polls their completions on `cq`, sized by `cfg` (NULL: defaults).
/// Everything the service uses later is allocated here (about 1.3 MiB:
/// the `RDD_SUBMIT_RING_SIZE` submission ring and
/// `RDD_SUBMIT_MAX_SUBMITTERS` completion rings of
/// `RDD_SUBMIT_COMPLETION_RING_SIZE`).
///
/// `cq` must be the CQ `qp`'s sends complete on and serve no other QP
/// (`INVALID_ARGUMENT` when it serves another QP or does not serve `qp`;
/// a CQ that serves `qp` only as its receive CQ cannot be told apart, and
/// its service would never see a completion). From now on the service
/// owns the QP's send queue and that CQ: post nothing else on the QP and
/// do not poll the CQ yourself; create the service on an idle, connected
/// QP. Destroy the service before the QP (see `rdd_submit_flush` for the
/// other order). The QP and CQ handles are used by the poll-mode calls,
/// not by this one beyond its checks.
///
/// Errors: `NULL_PARAMETER` (`out`, `qp` or `cq`), `INVALID_HANDLE`,
/// `RESOURCE_BUSY` (`qp` or `cq` in use by another thread, or another
/// service drives `qp` already: one service per QP),
/// `INVALID_ARGUMENT` (the CQ rule above; non-zero `flags`/`reserved`;
/// `max_outstanding` above `RDD_SUBMIT_MAX_OUTSTANDING` or `max_batch`
/// above `RDD_SUBMIT_MAX_BATCH`), `UNSUPPORTED` (a UD QP,
/// `rdd_qp_create_ud`: the service posts RC work requests),
/// `RESOURCE_EXHAUSTED` (no handle slot).
///
/// # Safety
/// `cfg` is NULL or valid for reads of one `rdd_submit_config`; `out` is
/// valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_create(
    qp: *mut rdd_qp,
    cq: *mut rdd_cq,
    cfg: *const rdd_submit_config,
    out: *mut *mut rdd_submit_service,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let c = if cfg.is_null() {
            rdd_submit_config::default()
        } else {
            // SAFETY: non-NULL and readable (caller contract).
            unsafe { cfg.read_unaligned() }
        };
        if c.flags != 0
            || c.reserved != 0
            || c.max_outstanding > RDD_SUBMIT_MAX_OUTSTANDING
            || c.max_batch > RDD_SUBMIT_MAX_BATCH
        {
            return rdd_status::InvalidArgument;
        }
        let or = |v: u32, d: u32| if v == 0 { d } else { v };
        let mut caps = rdd_qp_caps::default();
        // SAFETY: `caps` is valid for one write; any handle value is safe.
        match unsafe { rdd_qp_query_caps(qp, &mut caps) } {
            rdd_status::Ok => {}
            s => return s,
        }
        // The routing check of `rdd_cq_poll`, polling nothing: `cq` must
        // serve exactly `qp`.
        let mut wc = rdd_wc::default();
        let mut n = 0usize;
        // SAFETY: one readable handle; `wc` valid for (zero) writes; `n`
        // valid for one write.
        match unsafe { rdd_cq_poll(cq, &qp, 1, &mut wc, 0, &mut n) } {
            rdd_status::Ok => {}
            s => return s,
        }
        let mut doorbells = 0u64;
        // SAFETY: `doorbells` is valid for one write.
        match unsafe { rdd_qp_doorbells(qp, &mut doorbells) } {
            rdd_status::Ok => {}
            s => return s,
        }
        // One service per QP (the claim is undone when the service's core
        // goes, or right here if it cannot be built).
        try_status!(crate::ffi::object::claim_for_service(h(qp)));
        let core = Core::new(Binding {
            qp: h(qp),
            cq: h(cq),
            max_inline: caps.max_inline_data,
            doorbells,
            max_outstanding: or(c.max_outstanding, RDD_SUBMIT_DEFAULT_OUTSTANDING),
            max_batch: or(c.max_batch, RDD_SUBMIT_DEFAULT_BATCH),
        });
        let core = match core {
            Ok(core) => core,
            Err(s) => {
                crate::ffi::object::release_service(h(qp));
                return s;
            }
        };
        let obj = Box::new(ServiceObj {
            core: Arc::new(core),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Destroys a service. Refused with `RESOURCE_BUSY` (nothing changes)
/// while any submitter is registered or another call is using the
/// service. Unregistering needs every submitted descriptor reaped, so a
/// service that can be destroyed holds no work: nothing is abandoned.
#[no_mangle]
pub extern "C" fn rdd_submit_destroy(svc: *mut rdd_submit_service) -> rdd_status {
    ffi_boundary!({
        let s = try_status!(excl::<ServiceObj>(h(svc)));
        // Exact: a submitter object holds a clone of the core, and the
        // exclusive acquisition orders us after every earlier release.
        if Arc::strong_count(&s.core) != 1 {
            return rdd_status::ResourceBusy;
        }
        s.destroy();
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// Submitters
// ---------------------------------------------------------------------

/// Registers a submitter with the service: a handle for one application
/// thread, with its own completion ring of `RDD_SUBMIT_COMPLETION_RING_SIZE`
/// entries and an id (`rdd_submit_query`), the lowest free one. Any thread
/// may call it, also while the poll-mode thread works.
///
/// Errors: `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_EXHAUSTED`
/// (`RDD_SUBMIT_MAX_SUBMITTERS` registered, or no handle slot),
/// `RESOURCE_BUSY` (the service is being destroyed).
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_register(
    svc: *mut rdd_submit_service,
    out: *mut *mut rdd_submitter,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let s = try_status!(shared::<ServiceObj>(h(svc)));
        let sub = match s.core.svc().register() {
            Ok(sub) => sub,
            Err(_) => return rdd_status::ResourceExhausted,
        };
        let obj = Box::new(SubmitterObj {
            sub,
            core: Arc::clone(&s.core),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Unregisters a submitter and frees its id. Refused with `RESOURCE_BUSY`
/// (nothing changes) while it has descriptors in flight (submitted and
/// not yet reaped: reap them first) or another thread is using the handle.
#[no_mangle]
pub extern "C" fn rdd_submit_unregister(sub: *mut rdd_submitter) -> rdd_status {
    ffi_boundary!({
        let s = try_status!(excl::<SubmitterObj>(h(sub)));
        if s.sub.in_flight() != 0 {
            return rdd_status::ResourceBusy;
        }
        s.destroy();
        rdd_status::Ok
    })
}

/// The checks of one descriptor, before it is queued.
fn check_desc(d: &rdd_submit_desc, max_inline: u32) -> Result<(), rdd_status> {
    if d.opcode != RDD_WR_RDMA_WRITE {
        return Err(rdd_status::InvalidOpcode);
    }
    if d.flags & !RDD_SUBMIT_DESC_FLAGS != 0 {
        return Err(rdd_status::InvalidFlags);
    }
    if d.reserved != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    // One SGE of 2^31 bytes or more cannot be encoded (`wr::MAX_MESSAGE`).
    if d.length & 0x8000_0000 != 0 {
        return Err(rdd_status::LengthOverflow);
    }
    if d.flags & RDD_SEND_INLINE != 0 {
        if d.length > max_inline {
            return Err(rdd_status::InlineTooLarge);
        }
        if d.local_addr == 0 && d.length != 0 {
            return Err(rdd_status::NullPointer);
        }
    }
    Ok(())
}

/// Submits RDMA WRITE descriptors `descs[0..n]` to the service, in order,
/// from the thread that uses this submitter. Lock-free, allocation-free,
/// and never waits: the poll-mode thread's next `rdd_submit_drain` posts
/// them.
///
/// The call stops at the first descriptor it does not queue; those before
/// it are queued. `*out_bad_index` is written exactly when a descriptor
/// (or the array) is refused: the index of the first one not queued (0
/// for the array). Statuses that write it: `SQ_FULL` (back-pressure: the
/// submission ring is full, or this submitter has
/// `RDD_SUBMIT_COMPLETION_RING_SIZE` descriptors in flight; reap, then
/// submit again), `INVALID_OPCODE` (not `RDD_WR_RDMA_WRITE`),
/// `INVALID_FLAGS` (bits outside `RDD_SUBMIT_DESC_FLAGS`),
/// `LENGTH_OVERFLOW` (2^31 bytes or more), `INLINE_TOO_LARGE` (an inline
/// payload above the QP's limit), `NULL_POINTER` (an inline payload at
/// address 0), `INVALID_ARGUMENT` (non-zero `reserved`; a misaligned or
/// oversized array). Statuses that do not: `OK`, `NULL_PARAMETER`,
/// `INVALID_HANDLE`, `RESOURCE_BUSY` (another thread is using this
/// submitter).
///
/// # Safety
/// `descs` points to `n` readable `rdd_submit_desc`; `out_bad_index` is
/// valid for a write of one `size_t`. An inline descriptor's `local_addr`
/// points to `length` readable bytes, which the poll-mode thread copies
/// when it posts the descriptor; every other descriptor names memory of a
/// region of the QP's PD (checked by the device). Either kind of buffer
/// must stay valid until the descriptor's completion is reaped.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_post(
    sub: *mut rdd_submitter,
    descs: *const rdd_submit_desc,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut s = try_status!(excl::<SubmitterObj>(h(sub)));
        non_null!(descs);
        if let Err(status) = check_array(descs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        let SubmitterObj { sub, core } = &mut *s;
        let stats = &core.sub_stats[sub.id().index()];
        let mut result = rdd_status::Ok;
        let mut queued = 0usize;
        for i in 0..n {
            // SAFETY: non-NULL, aligned, `n` readable entries (checked /
            // caller contract).
            let d = unsafe { descs.add(i).read() };
            if let Err(status) = check_desc(&d, core.max_inline) {
                result = status;
                break;
            }
            match sub.try_submit(d) {
                Ok(()) => queued += 1,
                Err(e) => {
                    let counter = match e {
                        ServiceError::NoCredit => &stats.no_credit,
                        _ => &stats.ring_full,
                    };
                    bump(counter, 1);
                    result = rdd_status::SqFull;
                    break;
                }
            }
        }
        bump(&stats.submitted, queued as u64);
        if result != rdd_status::Ok {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, queued) };
        }
        result
    })
}

/// Moves up to `n` of this submitter's completions, oldest first (the
/// order it submitted the descriptors), into `out[0..n]`;
/// `*out_count` (0 to `n`) is how many. Never waits; one call frees their
/// credits. Allocation-free.
///
/// Errors leave `out` and `*out_count` unwritten: `NULL_PARAMETER`,
/// `INVALID_HANDLE`, `RESOURCE_BUSY` (another thread is using this
/// submitter), `INVALID_ARGUMENT` (a misaligned or oversized `out`).
///
/// # Safety
/// `out` is valid for writes of `n` `rdd_submit_completion`; `out_count`
/// for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_reap(
    sub: *mut rdd_submitter,
    out: *mut rdd_submit_completion,
    n: usize,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        try_status!(check_array(out.cast_const(), n));
        let mut s = try_status!(excl::<SubmitterObj>(h(sub)));
        // SAFETY: non-NULL, aligned, valid for `n` writes (checked /
        // caller contract); every bit pattern is a valid completion.
        let out = unsafe { core::slice::from_raw_parts_mut(out, n) };
        let SubmitterObj { sub, core } = &mut *s;
        let got = sub.recv_batch(out);
        bump(&core.sub_stats[sub.id().index()].reaped, got as u64);
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_count, got) };
        rdd_status::Ok
    })
}

/// The submitter's id (`*out_id`, below `RDD_SUBMIT_MAX_SUBMITTERS`; a
/// freed id is given to the next registration) and its descriptors in flight,
/// submitted and not yet reaped (`*out_in_flight`).
///
/// Errors: `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (the
/// submitter is in use by a post or reap on another thread).
///
/// # Safety
/// `out_id` is valid for a write of one `uint32_t`, `out_in_flight` of
/// one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_submit_query(
    sub: *const rdd_submitter,
    out_id: *mut u32,
    out_in_flight: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_id, out_in_flight);
        let s = try_status!(shared::<SubmitterObj>(h(sub)));
        // SAFETY: non-NULL (checked), writable (caller contract). The id
        // is below RDD_SUBMIT_MAX_SUBMITTERS, so it fits.
        unsafe {
            put(out_id, s.sub.id().index() as u32);
            put(out_in_flight, s.sub.in_flight());
        }
        rdd_status::Ok
    })
}
