//! Per-opcode posts on a QP handle: one exported function per common
//! operation (`rdd_qp_write` ... `rdd_qp_recv`), each taking scalars, and
//! `rdd_qp_ring` for the doorbells they leave for later with
//! `RDD_SEND_DEFER_DOORBELL`.
//!
//! Each call builds the typed [`SendWr`] from a constant opcode and its
//! scalars inside `#[inline(always)]` code, so the compiler sees the
//! operation and its one-SGE (or inline) shape, and the mlx5 core's shape
//! dispatch (`by_shape!` in `provider::mlx5::sq`) folds to the
//! straight-line writer of that one WQE. Nothing translates a generic
//! `rdd_wr`. The rules are those of `rdd_qp_post_send` for the same WR:
//! same validation, same typed errors, the same CQ headroom check on an
//! unguarded CQ, and a refused call writes nothing.

use std::sync::Arc;

use crate::api::QpDriver;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::RDD_SEND_SOLICITED;
use crate::ffi::wr::{RDD_SEND_DEFER_DOORBELL, RDD_SEND_FENCE, RDD_SEND_SIGNALED};
use crate::provider::mlx5::SendQueue;
use crate::wr::{Payload, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

use super::h;
use super::objects::{CqBudget, QpImpl, QpObj};
use super::post::post_send_metered;
use super::table::excl;
use super::types::rdd_qp;

/// The send flags that reach the WQE.
pub(super) const WQE_FLAGS: u32 = RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED;
/// Every flag a per-opcode send accepts.
pub(super) const SEND_OP_FLAGS: u32 = WQE_FLAGS | RDD_SEND_DEFER_DOORBELL;

// ---------------------------------------------------------------------
// The shared body
// ---------------------------------------------------------------------

/// Posts one send WR on QP handle `qp`: the handle, then `flags`, then
/// `payload_err` (a payload the caller found invalid), then the WR itself
/// as `rdd_qp_post_send` checks it. Without `RDD_SEND_DEFER_DOORBELL` the
/// doorbell rings for it and every WQE deferred before it.
///
/// # Safety
/// The SGEs of `payload` name memory the device checks against its
/// regions before any access; an inline payload is readable for the call.
#[inline(always)]
unsafe fn send_op(
    qp: *mut rdd_qp,
    wr_id: u64,
    op: SendOp,
    payload: Payload<'_>,
    payload_err: Option<rdd_status>,
    flags: u32,
) -> rdd_status {
    let mut g = try_status!(excl::<QpObj>(h(qp)));
    if flags & !SEND_OP_FLAGS != 0 {
        return rdd_status::InvalidFlags;
    }
    if let Some(s) = payload_err {
        return s;
    }
    let wr = SendWr {
        wr_id,
        op,
        payload,
        flags: SendFlags(flags & WQE_FLAGS),
    };
    let defer = flags & RDD_SEND_DEFER_DOORBELL != 0;
    let q: &mut QpObj = &mut g;
    let metered = q.send_budget.metered();
    match q.q.get_mut() {
        QpImpl::Mlx5(o) if !metered => {
            // SAFETY: SGEs only reach the device, which checks each against
            // its registered regions (lkey, bounds, PD, access) before any
            // access; an inline payload is copied before return (forwarded
            // contract).
            let r = unsafe {
                if defer {
                    o.sq.post(&wr)
                } else {
                    o.sq.post_one(&wr)
                }
            };
            match r {
                Ok(()) => {
                    q.doorbells += u64::from(!defer);
                    rdd_status::Ok
                }
                Err(e) => e.into(),
            }
        }
        // SAFETY: forwarded contract.
        _ => unsafe { send_cold(q, wr, defer) },
    }
}

/// [`send_op`] off the hot path: an unguarded send CQ, or a
/// provider-posted QP. The WR comes by value, so the hot path never
/// stores it.
///
/// # Safety
/// As [`send_op`].
#[cold]
#[inline(never)]
unsafe fn send_cold(q: &mut QpObj, wr: SendWr<'_>, defer: bool) -> rdd_status {
    if q.send_budget.metered() {
        // SAFETY: forwarded contract.
        return unsafe { send_metered(q, &wr, defer) };
    }
    match q.q.get_mut() {
        QpImpl::Driver(p) => send_driver(&mut **p, &wr, None, defer, &mut q.doorbells),
        // Not reached (the hot path takes unmetered mlx5 QPs).
        // SAFETY: as in `send_op`.
        QpImpl::Mlx5(o) => match unsafe { o.sq.post_one(&wr) } {
            Ok(()) => {
                q.doorbells += 1;
                rdd_status::Ok
            }
            Err(e) => e.into(),
        },
    }
}

/// [`send_op`] on a QP whose send CQ opted out of the sizing guard: the
/// same headroom check as `rdd_qp_post_send` for one WR (a spare entry for
/// a CQE the signalling guard may add at the doorbell, and the WR's own if
/// it is signaled; `CQ_FULL` and nothing posted if either is missing).
///
/// # Safety
/// As [`send_op`].
unsafe fn send_metered(q: &mut QpObj, wr: &SendWr<'_>, defer: bool) -> rdd_status {
    let b = Arc::clone(&q.send_budget);
    let o = match q.q.get_mut() {
        QpImpl::Mlx5(o) => o,
        QpImpl::Driver(p) => return send_driver(&mut **p, wr, Some(&b), defer, &mut q.doorbells),
    };
    let signaled = wr.flags.contains(SendFlags::SIGNALED);
    let s = metered_post(&b, &mut o.sq, signaled, |sq| {
        // SAFETY: as in `send_op`.
        unsafe {
            if defer {
                sq.post(wr)
            } else {
                sq.post_one(wr)
            }
        }
    });
    if s == rdd_status::Ok {
        q.doorbells += u64::from(!defer);
    }
    s
}

/// One `post` (which writes one WR, `signaled` or not, and may ring) on a
/// queue whose send CQ opted out of the sizing guard: it runs only with a
/// spare CQ entry reserved for a CQE the signalling guard may add at the
/// doorbell, and one for the WR's own if it is signaled (`CQ_FULL` and
/// nothing posted if either is missing). The spare goes back unless the
/// post's doorbell used it; a deferred WR's doorbell reserves its own
/// (`rdd_qp_ring`).
pub(super) fn metered_post(
    b: &CqBudget,
    sq: &mut SendQueue,
    signaled: bool,
    post: impl FnOnce(&mut SendQueue) -> crate::error::Result<()>,
) -> rdd_status {
    let signaled = u64::from(signaled);
    let spare = b.headroom.reserve(1);
    if spare == 0 {
        return rdd_status::CqFull;
    }
    if signaled != 0 && b.headroom.reserve(1) == 0 {
        b.headroom.unreserve(spare);
        return rdd_status::CqFull;
    }
    let forced = sq.forced_signals();
    match post(sq) {
        Ok(()) => {
            let used = u64::from(sq.forced_signals().wrapping_sub(forced));
            b.headroom.unreserve(spare.saturating_sub(used));
            rdd_status::Ok
        }
        Err(e) => {
            b.headroom.unreserve(spare + signaled);
            e.into()
        }
    }
}

/// One send WR on a provider-posted QP (the direct rxe/siw rings, the
/// verbs fallback), with the headroom check of `rdd_qp_post_send` when
/// `meter` is the unguarded send CQ's account. With `defer` it goes to
/// `QpDriver::post_send_deferred`: the direct rings write it and leave the
/// doorbell to a later call without the bit or `rdd_qp_ring`; the verbs
/// fallback posts it at once (the trait's default). Without, the provider
/// posts it and rings for it and every WR deferred before it. `doorbells`
/// counts provider calls that ring: posts without `defer`, and deferred
/// posts on a driver that cannot defer.
fn send_driver(
    p: &mut dyn QpDriver,
    wr: &SendWr<'_>,
    meter: Option<&CqBudget>,
    defer: bool,
    doorbells: &mut u64,
) -> rdd_status {
    let (called, r) = post_send_metered(p, core::slice::from_ref(wr), meter, defer);
    // A driver that defers makes no provider call (refused or not); one
    // that cannot posts the WR at once.
    *doorbells += u64::from(called && !(defer && p.can_defer()));
    match r {
        Ok(()) => rdd_status::Ok,
        Err((_, s)) => s,
    }
}

/// A one-SGE payload.
#[inline(always)]
pub(super) fn one_sge(s: &[Sge; 1]) -> Payload<'_> {
    Payload::Sges(s)
}

/// The bytes of an inline payload (`data`, `length`), or why there are
/// none: `NULL_POINTER` for a NULL `data` with a non-zero length (as an
/// inline `rdd_wr` piece).
///
/// # Safety
/// A non-NULL `data` points to `length` readable bytes that live for `'a`.
#[inline(always)]
pub(super) unsafe fn inline_piece<'a>(
    data: *const u8,
    length: u32,
) -> Result<&'a [u8], rdd_status> {
    if length == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(rdd_status::NullPointer);
    }
    // SAFETY: non-NULL, `length` readable bytes (caller contract);
    // `length <= u32::MAX <= isize::MAX` on 64-bit targets (the handle
    // encoding asserts 64 bits); `u8` needs no alignment.
    Ok(unsafe { core::slice::from_raw_parts(data, length as usize) })
}

// ---------------------------------------------------------------------
// Sends
// ---------------------------------------------------------------------

/// Posts one RDMA WRITE of `length` bytes at `laddr` (local key `lkey`) to
/// `raddr` (remote key `rkey`): `ibv_post_send` of one WR, without the
/// `rdd_wr`. `flags` are `RDD_SEND_SIGNALED`, `RDD_SEND_FENCE`,
/// `RDD_SEND_SOLICITED` and `RDD_SEND_DEFER_DOORBELL`; without the last
/// the doorbell rings (for this WR and every one deferred before it), with
/// it the WR waits for a later call without it or for `rdd_qp_ring`.
/// `length` 0 is a zero-byte WRITE. Same rules as `rdd_qp_post_send` of
/// the equivalent `rdd_wr` (one SGE), same statuses:
///
/// `OK`; `NULL_PARAMETER` (`qp` NULL); `INVALID_HANDLE` (destroyed,
/// forged or not a QP); `RESOURCE_BUSY` (another thread is using the QP);
/// `INVALID_FLAGS` (any other bit, `RDD_SEND_INLINE` included);
/// `TOO_MANY_SGES` (a QP granted no send SGE); `LENGTH_OVERFLOW` (`length`
/// of 2^31 or more); `INVALID_QP_STATE` (not connected: RESET, INIT or
/// RTR; a QP in ERROR accepts the send, which completes flushed);
/// `SQ_FULL`; `CQ_FULL` (an unguarded send CQ without headroom); on a
/// kernel device also the provider's refusals (`UNSUPPORTED`,
/// `PROVIDER_ERROR`). A refused call writes nothing and rings nothing.
///
/// # Safety
/// `laddr`/`lkey` name memory of this device's regions; the device checks
/// them, so a wrong one fails the completion and cannot corrupt memory.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_write(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        let op = SendOp::Write {
            remote: Remote::new(raddr, rkey),
        };
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, one_sge(&sge), None, flags) }
    })
}

/// Posts one RDMA WRITE with immediate data `imm` (host order; the peer's
/// receive completion carries it): as `rdd_qp_write`, and it consumes a
/// receive at the peer. Same statuses as `rdd_qp_write` (on siw also
/// `UNSUPPORTED`: no immediate data).
///
/// # Safety
/// As `rdd_qp_write`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_write_imm(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    imm: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        let op = SendOp::WriteImm {
            remote: Remote::new(raddr, rkey),
            imm,
        };
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, one_sge(&sge), None, flags) }
    })
}

/// Posts one RDMA READ of `length` bytes from `raddr` (remote key `rkey`)
/// into `laddr` (local key `lkey`, a region with local write). Flags,
/// deferral and statuses as `rdd_qp_write`.
///
/// # Safety
/// As `rdd_qp_write`; the device writes the local buffer.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_read(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        let op = SendOp::Read {
            remote: Remote::new(raddr, rkey),
        };
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, one_sge(&sge), None, flags) }
    })
}

/// Posts one SEND of `length` bytes at `laddr` (local key `lkey`); it
/// lands in the peer's next posted receive. `length` 0 is an empty
/// message. Flags, deferral and statuses as `rdd_qp_write`.
///
/// # Safety
/// As `rdd_qp_write`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_send(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, SendOp::Send, one_sge(&sge), None, flags) }
    })
}

/// Posts one SEND with immediate data `imm` (host order). As
/// `rdd_qp_send`; statuses as `rdd_qp_write_imm`.
///
/// # Safety
/// As `rdd_qp_write`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_send_imm(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    imm: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        let op = SendOp::SendImm { imm };
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, one_sge(&sge), None, flags) }
    })
}

/// Posts one RDMA WRITE of the `length` bytes at `data` to `raddr`
/// (remote key `rkey`), copied into the WQE before the call returns (no
/// local key; the buffer is free again at once). `data` may be NULL when
/// `length` is 0. Flags and deferral as `rdd_qp_write` (the inline
/// payload is implied: `RDD_SEND_INLINE` is `INVALID_FLAGS` here too).
/// Statuses as `rdd_qp_write` (without `TOO_MANY_SGES` and
/// `LENGTH_OVERFLOW`: no SGE), plus `NULL_POINTER` (`data` NULL with a
/// non-zero `length`) and `INLINE_TOO_LARGE` (more than the QP's
/// `max_inline_data`, see `rdd_qp_query_caps`).
///
/// # Safety
/// `data` is NULL or points to `length` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_write_inline(
    qp: *mut rdd_qp,
    wr_id: u64,
    data: *const core::ffi::c_void,
    length: u32,
    raddr: u64,
    rkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: the caller's contract on `data`.
        let piece = unsafe { inline_piece(data.cast::<u8>(), length) };
        let pieces: [&[u8]; 1] = [piece.unwrap_or(&[])];
        let op = SendOp::Write {
            remote: Remote::new(raddr, rkey),
        };
        let payload = Payload::Inline(&pieces);
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, payload, piece.err(), flags) }
    })
}

/// Posts one SEND of the `length` bytes at `data`, copied into the WQE
/// before the call returns. As `rdd_qp_write_inline`, same statuses.
///
/// # Safety
/// `data` is NULL or points to `length` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_send_inline(
    qp: *mut rdd_qp,
    wr_id: u64,
    data: *const core::ffi::c_void,
    length: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: the caller's contract on `data`.
        let piece = unsafe { inline_piece(data.cast::<u8>(), length) };
        let pieces: [&[u8]; 1] = [piece.unwrap_or(&[])];
        let payload = Payload::Inline(&pieces);
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, SendOp::Send, payload, piece.err(), flags) }
    })
}

/// Posts one 8-byte atomic fetch-and-add of `add` on `raddr` (remote key
/// `rkey`, 8-byte aligned); the value before the add lands in the 8 bytes
/// at `laddr` (local key `lkey`, a region with local write). Flags and
/// deferral as `rdd_qp_write`. Statuses as `rdd_qp_write` (without
/// `LENGTH_OVERFLOW`), plus `ATOMIC_UNALIGNED` (`raddr` not a multiple of
/// 8); siw has no atomics (`UNSUPPORTED`).
///
/// # Safety
/// As `rdd_qp_write`; the device writes the 8 local bytes.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_fetch_add(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    add: u64,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, 8, lkey)];
        let op = SendOp::FetchAdd {
            remote: Remote::new(raddr, rkey),
            add,
        };
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, one_sge(&sge), None, flags) }
    })
}

/// Posts one 8-byte atomic compare-and-swap on `raddr` (remote key
/// `rkey`, 8-byte aligned): if it holds `compare` it becomes `swap`; the
/// value before lands in the 8 bytes at `laddr` (local key `lkey`). As
/// `rdd_qp_fetch_add`, same statuses.
///
/// # Safety
/// As `rdd_qp_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_cmp_swap(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    compare: u64,
    swap: u64,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, 8, lkey)];
        let op = SendOp::CompareSwap {
            remote: Remote::new(raddr, rkey),
            compare,
            swap,
        };
        // SAFETY: forwarded contract.
        unsafe { send_op(qp, wr_id, op, one_sge(&sge), None, flags) }
    })
}

// ---------------------------------------------------------------------
// Receive and doorbell
// ---------------------------------------------------------------------

/// Posts one receive of up to `length` bytes into `laddr` (local key
/// `lkey`, a region with local write): `rdd_qp_post_recv` of one
/// `rdd_recv_wr` with one SGE. `flags` is 0 or `RDD_SEND_DEFER_DOORBELL`
/// (the receive is published to the device by a later `rdd_qp_recv`
/// without it, `rdd_qp_post_recv` or `rdd_qp_ring`; on a kernel device it
/// is published at once). A QP on an SRQ (`rdd_qp_create_on_srq`) has no
/// receive queue: `INVALID_ATTRIBUTE` (after the handle and flag checks),
/// nothing written; use `rdd_srq_recv`.
///
/// `OK`; `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (as
/// `rdd_qp_write`); `INVALID_FLAGS` (any other bit); `TOO_MANY_SGES` (a QP
/// granted no receive SGE); `LENGTH_OVERFLOW`; `INVALID_QP_STATE` (RESET);
/// `RQ_FULL`; `CQ_FULL` (an unguarded receive CQ without headroom); on a
/// kernel device also the provider's refusals. A refused call writes
/// nothing.
///
/// # Safety
/// `laddr`/`lkey` name memory of this device's regions (checked by the
/// device).
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_recv(
    qp: *mut rdd_qp,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let mut g = try_status!(excl::<QpObj>(h(qp)));
        if flags & !RDD_SEND_DEFER_DOORBELL != 0 {
            return rdd_status::InvalidFlags;
        }
        let sge = [Sge::new(laddr, length, lkey)];
        let wr = RecvWr { wr_id, sges: &sge };
        let q: &mut QpObj = &mut g;
        // An unguarded receive CQ: one completion per receive.
        let meter = q.recv_budget.metered().then_some(&*q.recv_budget);
        if meter.is_some_and(|b| b.headroom.reserve(1) == 0) {
            return recv_refused(q, rdd_status::CqFull);
        }
        let r = match q.q.get_mut() {
            QpImpl::Mlx5(o) => {
                // SAFETY: as in `send_op`.
                let r = unsafe { o.rq.post(&wr) };
                if r.is_ok() && flags & RDD_SEND_DEFER_DOORBELL == 0 {
                    o.rq.ring();
                }
                r
            }
            // A QP on the provider's SRQ (the verbs fallback): its
            // receives go to the SRQ; refused before the provider sees it.
            QpImpl::Driver(_) if q.srq.is_some() => Err(crate::error::Error::InvalidAttribute),
            QpImpl::Driver(p) => p.post_recv(core::slice::from_ref(&wr)).map_err(|e| e.error),
        };
        match r {
            Ok(()) => rdd_status::Ok,
            Err(e) => {
                if let Some(b) = meter {
                    b.headroom.unreserve(1);
                }
                recv_refused(q, e.into())
            }
        }
    })
}

/// The status of a refused `rdd_qp_recv`: `INVALID_ATTRIBUTE` for a QP on
/// an SRQ, whatever its stand-in receive queue said (it has no SGE, so it
/// refuses every receive before writing anything), `status` otherwise.
/// Only refusals come here, so a QP without an SRQ posts through the code
/// it always did.
#[cold]
#[inline(never)]
fn recv_refused(q: &QpObj, status: rdd_status) -> rdd_status {
    if q.srq.is_some() {
        rdd_status::InvalidAttribute
    } else {
        status
    }
}

/// Rings the doorbells for every WR posted on `qp` with
/// `RDD_SEND_DEFER_DOORBELL` since the last doorbell: one send doorbell
/// for all the deferred sends (the `ibv_wr_complete` of a batch begun with
/// the first deferred post) and the receive doorbell record for the
/// deferred receives. Nothing pending: nothing happens. On a kernel
/// device's direct rxe/siw rings, one provider doorbell (the empty
/// `POST_SEND` system call; on siw only when its transmitter may be idle)
/// for the deferred sends; receives there are never deferred. On the
/// libibverbs fallback nothing is ever deferred, so it does nothing.
///
/// `OK`; `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (as
/// `rdd_qp_write`); `CQ_FULL` when the send CQ is unguarded and has no
/// entry left for the completion the signalling guard may add at this
/// doorbell: nothing is rung then; poll the CQ and ring again; on a kernel
/// device `PROVIDER_ERROR` when the system call fails (the WRs stay
/// pending; ring again).
#[no_mangle]
pub extern "C" fn rdd_qp_ring(qp: *mut rdd_qp) -> rdd_status {
    ffi_boundary!({
        let mut g = try_status!(excl::<QpObj>(h(qp)));
        let q: &mut QpObj = &mut g;
        let o = match q.q.get_mut() {
            QpImpl::Mlx5(o) => o,
            QpImpl::Driver(p) => {
                return match p.ring() {
                    Ok(rung) => {
                        q.doorbells += u64::from(rung);
                        rdd_status::Ok
                    }
                    Err(e) => e.into(),
                };
            }
        };
        if o.sq.pending() == 0 {
            o.rq.ring();
            return rdd_status::Ok;
        }
        let meter = q.send_budget.metered().then_some(&*q.send_budget);
        let spare = meter.map_or(0, |b| b.headroom.reserve(1));
        if meter.is_some() && spare == 0 {
            return rdd_status::CqFull;
        }
        // Receives first: a send may make the peer answer into them.
        o.rq.ring();
        let forced = o.sq.forced_signals();
        o.sq.ring();
        q.doorbells += 1;
        if let Some(b) = meter {
            let used = u64::from(o.sq.forced_signals().wrapping_sub(forced));
            b.headroom.unreserve(spare.saturating_sub(used));
        }
        rdd_status::Ok
    })
}
