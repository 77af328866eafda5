//! UD sends on a QP handle: one exported call per form (`rdd_qp_send_ud`,
//! `rdd_qp_send_ud_imm`, `rdd_qp_send_ud_inline`), built from scalars as
//! the RC per-opcode calls of `ops.rs` are, and the generic list form
//! (`rdd_qp_post_send_ud`, `rdd_ud_send`) in the style of
//! `rdd_qp_post_send`.
//!
//! Every call checks, in this order, before anything is written: the QP
//! handle, the flags, the payload, the address handle, that the QP is UD
//! and of the address handle's PD, the datagram's size against the MTU,
//! then the WR itself as the mlx5 core checks it (`SendQueue::post_ud`).

use std::sync::Arc;

use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_send, rdd_wr, NO_PIECES};
use crate::provider::mlx5::{SendQueue, UdDest};
use crate::wr::{inline_length, total_length, Payload, SendFlags, SendOp, SendWr, Sge};

use super::objects::{QpImpl, QpObj};
use super::ops::{inline_piece, metered_post, one_sge, SEND_OP_FLAGS, WQE_FLAGS};
use super::table::{excl, shared, Shared};
use super::types::rdd_qp;
use super::ud::{rdd_ah, AhObj};
use super::{check_array, h, put};
use crate::ffi::wr::RDD_SEND_DEFER_DOORBELL;

/// One generic UD send for `rdd_qp_post_send_ud`: an `rdd_wr` (opcode
/// `RDD_WR_SEND` or `RDD_WR_SEND_WITH_IMM`; any other is `UNSUPPORTED`;
/// its `remote_addr`, `rkey`, `compare_add` and `swap` are ignored) and
/// where it goes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_ud_send {
    /// The work request.
    pub wr: rdd_wr,
    /// The destination's address handle (of the QP's PD).
    pub ah: *mut rdd_ah,
    /// Destination QP number (24 bits).
    pub remote_qpn: u32,
    /// Q_Key; `RDD_OWN_QKEY`: the sending QP's own.
    pub qkey: u32,
}

#[cfg(target_pointer_width = "64")]
static_assertions::const_assert_eq!(core::mem::size_of::<rdd_ud_send>(), 80);

/// Bytes `wr` sends (0 for a payload the core will refuse anyway: an
/// overflowing length is its error, not `EXCEEDS_MTU`).
#[inline(always)]
fn payload_len(wr: &SendWr<'_>) -> u64 {
    let n = match wr.payload {
        Payload::Sges(s) => total_length(s),
        Payload::Inline(p) => inline_length(p),
    };
    u64::from(n.unwrap_or(0))
}

/// The WR of a per-opcode send, once its QP is held: `INVALID_FLAGS` for
/// a flag the per-opcode calls do not take, then `payload_err` (a payload
/// the caller found invalid). These are the first checks of `ops.rs`'s
/// `send_op`, which keeps them inline: built through this function the
/// RC hot path ran 8 instructions more per WR (`benches/c_object.rs`
/// `write_1`, 211 to 219 under callgrind), while the UD calls are not
/// measured against a baseline.
#[inline(always)]
fn op_wr(
    wr_id: u64,
    op: SendOp,
    payload: Payload<'_>,
    payload_err: Option<rdd_status>,
    flags: u32,
) -> Result<SendWr<'_>, rdd_status> {
    if flags & !SEND_OP_FLAGS != 0 {
        return Err(rdd_status::InvalidFlags);
    }
    if let Some(s) = payload_err {
        return Err(s);
    }
    Ok(SendWr {
        wr_id,
        op,
        payload,
        flags: SendFlags(flags & WQE_FLAGS),
    })
}

/// The checks shared by every UD send once the QP is held: the address
/// handle (acquired shared), the QP's kind and PD, the size. The guard
/// keeps the handle alive while its address is copied into the WQE.
#[inline(always)]
fn ud_target(q: &QpObj, ah: *mut rdd_ah, wr: &SendWr<'_>) -> Result<Shared<AhObj>, rdd_status> {
    let a = shared::<AhObj>(h(ah))?;
    if q.ud_mtu == 0 || !Arc::ptr_eq(&a.pd_link, &q._pd_link) {
        // A UD send on an RC QP, or an address of another PD.
        return Err(rdd_status::InvalidAttribute);
    }
    if payload_len(wr) > u64::from(q.ud_mtu) {
        // A datagram is one packet.
        return Err(rdd_status::ExceedsMtu);
    }
    Ok(a)
}

/// Writes one checked UD WR to `remote_qpn` at `a`'s address (and rings
/// unless `defer`), with the headroom check of an unguarded send CQ.
///
/// # Safety
/// The SGEs of `wr` name memory the device checks against its regions
/// before any access; an inline payload is readable for the call.
#[inline(always)]
unsafe fn post_checked(
    q: &mut QpObj,
    wr: &SendWr<'_>,
    a: &AhObj,
    remote_qpn: u32,
    qkey: u32,
    defer: bool,
) -> rdd_status {
    let metered = q.send_budget.metered();
    let o = match q.q.get_mut() {
        QpImpl::Mlx5(o) => o,
        QpImpl::Driver(p) => {
            return post_driver(
                &mut **p,
                &q.send_budget,
                wr,
                a,
                remote_qpn,
                qkey,
                &mut q.doorbells,
            )
        }
    };
    let dest = UdDest::new(&a.av, remote_qpn, qkey);
    let dest = &dest;
    let post = |sq: &mut SendQueue| {
        // SAFETY: forwarded contract (the device checks every SGE; an
        // inline payload is copied before return).
        unsafe { sq.post_ud(wr, dest) }?;
        if !defer {
            sq.ring();
        }
        Ok(())
    };
    let s = if metered {
        let signaled = wr.flags.contains(SendFlags::SIGNALED);
        metered_post(&q.send_budget, &mut o.sq, signaled, post)
    } else {
        match post(&mut o.sq) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    };
    if s == rdd_status::Ok {
        q.doorbells += u64::from(!defer);
    }
    s
}

/// One UD send on a driver QP (the verbs fallback or rxe's direct ring,
/// `QpDriver::post_send_ud`), which posts and rings at once whatever
/// `RDD_SEND_DEFER_DOORBELL` says (one doorbell each), with the headroom
/// check of an unguarded send CQ (room for the WR's own completion, as
/// `api::Qp::post_send_ud` on a driver).
#[cold]
#[inline(never)]
fn post_driver(
    p: &mut dyn crate::api::QpDriver,
    budget: &super::objects::CqBudget,
    wr: &SendWr<'_>,
    a: &AhObj,
    remote_qpn: u32,
    qkey: u32,
    doorbells: &mut u64,
) -> rdd_status {
    let Some(d) = a.driver else {
        // An mlx5 address vector under a driver QP: never made on one
        // device; refused, nothing posted.
        return rdd_status::InvalidAttribute;
    };
    let want = u64::from(budget.metered() && wr.flags.contains(SendFlags::SIGNALED));
    let got = if want != 0 {
        budget.headroom.reserve(want)
    } else {
        0
    };
    if got < want {
        budget.headroom.unreserve(got);
        return rdd_status::CqFull;
    }
    match p.post_send_ud(wr, d, remote_qpn, qkey) {
        Ok(()) => {
            *doorbells += 1;
            rdd_status::Ok
        }
        Err(e) => {
            budget.headroom.unreserve(got);
            e.into()
        }
    }
}

/// The body of the per-form UD sends.
///
/// # Safety
/// As [`post_checked`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn send_ud_op(
    qp: *mut rdd_qp,
    ah: *mut rdd_ah,
    remote_qpn: u32,
    qkey: u32,
    wr_id: u64,
    op: SendOp,
    payload: Payload<'_>,
    payload_err: Option<rdd_status>,
    flags: u32,
) -> rdd_status {
    let mut g = try_status!(excl::<QpObj>(h(qp)));
    let wr = try_status!(op_wr(wr_id, op, payload, payload_err, flags));
    let q: &mut QpObj = &mut g;
    let a = try_status!(ud_target(q, ah, &wr));
    let defer = flags & RDD_SEND_DEFER_DOORBELL != 0;
    // SAFETY: forwarded contract.
    unsafe { post_checked(q, &wr, &a, remote_qpn, qkey, defer) }
}

/// Posts one datagram: a SEND of `length` bytes at `laddr` (local key
/// `lkey`) to QP `remote_qpn` at the address `ah` holds, with Q_Key
/// `remote_qkey` (`RDD_OWN_QKEY`: this QP's own). Flags and deferral as
/// `rdd_qp_send` (`RDD_SEND_SIGNALED`, `RDD_SEND_FENCE`,
/// `RDD_SEND_SOLICITED`, `RDD_SEND_DEFER_DOORBELL`; `rdd_qp_ring` rings
/// deferred datagrams too; on rxe, on either data path, the
/// bit is a hint: each datagram is posted and rung at once). The QP and `ah` are used (the QP exclusively,
/// `ah` shared) for the call only: `ah` may be destroyed right after.
///
/// Statuses (a refused call writes nothing and rings nothing): `OK`;
/// `NULL_PARAMETER` (`qp` or `ah` NULL); `INVALID_HANDLE` (either
/// destroyed, forged or of another kind); `RESOURCE_BUSY`;
/// `INVALID_FLAGS`; `INVALID_ATTRIBUTE` (an RC QP, or an `ah` of another
/// PD); `EXCEEDS_MTU` (`length` above the port's MTU: a datagram is one
/// packet); `INVALID_QPN` (`remote_qpn` wider than 24 bits);
/// `TOO_MANY_SGES`, `LENGTH_OVERFLOW`; `INVALID_QP_STATE` (before
/// `rdd_qp_ready_ud`; a QP in ERROR accepts the send, which completes
/// flushed); `SQ_FULL`; `CQ_FULL` (an unguarded send CQ without
/// headroom). A datagram the destination does not take (no such QP, a
/// wrong Q_Key, no receive posted) still completes successfully here; the
/// software device counts it (`rdd_device_ud_drops`).
///
/// # Safety
/// As `rdd_qp_send`.
#[allow(clippy::too_many_arguments)]
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_send_ud(
    qp: *mut rdd_qp,
    ah: *mut rdd_ah,
    remote_qpn: u32,
    remote_qkey: u32,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        let p = one_sge(&sge);
        // SAFETY: forwarded contract.
        unsafe {
            send_ud_op(
                qp,
                ah,
                remote_qpn,
                remote_qkey,
                wr_id,
                SendOp::Send,
                p,
                None,
                flags,
            )
        }
    })
}

/// Posts one datagram with immediate data `imm` (host order): as
/// `rdd_qp_send_ud`; the receive completes with `RDD_WC_FLAG_WITH_IMM`
/// and `imm_data` = `imm`. Same statuses.
///
/// # Safety
/// As `rdd_qp_send`.
#[allow(clippy::too_many_arguments)]
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_send_ud_imm(
    qp: *mut rdd_qp,
    ah: *mut rdd_ah,
    remote_qpn: u32,
    remote_qkey: u32,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    imm: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let sge = [Sge::new(laddr, length, lkey)];
        let (op, p) = (SendOp::SendImm { imm }, one_sge(&sge));
        // SAFETY: forwarded contract.
        unsafe { send_ud_op(qp, ah, remote_qpn, remote_qkey, wr_id, op, p, None, flags) }
    })
}

/// Posts one datagram of the `length` bytes at `data`, copied into the
/// WQE before the call returns: as `rdd_qp_send_ud` (the inline payload
/// is implied: `RDD_SEND_INLINE` is `INVALID_FLAGS` here, as for
/// `rdd_qp_send_inline`), plus `NULL_POINTER` (`data` NULL with a
/// non-zero `length`) and `INLINE_TOO_LARGE` (more than the QP's
/// `max_inline_data`).
///
/// # Safety
/// `data` is NULL or points to `length` readable bytes.
#[allow(clippy::too_many_arguments)]
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_send_ud_inline(
    qp: *mut rdd_qp,
    ah: *mut rdd_ah,
    remote_qpn: u32,
    remote_qkey: u32,
    wr_id: u64,
    data: *const core::ffi::c_void,
    length: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: the caller's contract on `data`.
        let piece = unsafe { inline_piece(data.cast::<u8>(), length) };
        let pieces: [&[u8]; 1] = [piece.unwrap_or(&[])];
        let p = Payload::Inline(&pieces);
        let (op, e) = (SendOp::Send, piece.err());
        // SAFETY: forwarded contract.
        unsafe { send_ud_op(qp, ah, remote_qpn, remote_qkey, wr_id, op, p, e, flags) }
    })
}

/// Posts the UD sends `wrs[0..n]`: the generic form of `rdd_qp_send_ud`
/// (SGE lists, `RDD_SEND_INLINE`, immediate data), with the batch rules of
/// `rdd_qp_post_send`. Each entry's `rdd_wr` is checked as
/// `rdd_qp_post_send` checks it (flags, opcode, SGE list or inline
/// pieces), then its destination and size as `rdd_qp_send_ud` checks them
/// (the address handle, a UD QP of its PD, the MTU), then the rest as
/// `rdd_qp_send_ud` (the QP number, the opcode: RDMA and atomics are
/// `UNSUPPORTED`, the QP's limits and state); the call
/// stops at the first rejected one: those before it are posted and rung
/// (once for the batch), it and those after are not, its status is
/// returned and `*out_bad_index` is its index (0 when the `wrs` array
/// itself is misaligned or too large). `*out_bad_index` is not written on
/// `OK` nor for a bad `qp` (`NULL_PARAMETER`, `INVALID_HANDLE`,
/// `RESOURCE_BUSY`: nothing posted). On an unguarded send CQ each entry
/// is rung as it is posted, so that its headroom check covers its
/// doorbell.
///
/// # Safety
/// As `rdd_qp_post_send` for the `rdd_wr` of each entry; `wrs` points to
/// `n` readable `rdd_ud_send`; `out_bad_index` is valid for a write of
/// one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_post_send_ud(
    qp: *mut rdd_qp,
    wrs: *const rdd_ud_send,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut g = try_status!(excl::<QpObj>(h(qp)));
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        let q: &mut QpObj = &mut g;
        let per_wr_ring = q.send_budget.metered();
        let mut pieces = NO_PIECES;
        let mut posted = 0usize;
        let mut status = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: non-NULL, aligned and `n` readable entries
            // (checked / caller contract).
            let u = unsafe { &*wrs.add(i) };
            // SAFETY: the caller's contract on the entry's SGEs or inline
            // pieces.
            let st = match unsafe { parse_send(&u.wr, &mut pieces) } {
                Err(s) => s,
                Ok(wr) => match ud_target(q, u.ah, &wr) {
                    Err(s) => s,
                    Ok(a) => {
                        let (qpn, qkey) = (u.remote_qpn, u.qkey);
                        // SAFETY: as above; the device checks every SGE.
                        unsafe { post_checked(q, &wr, &a, qpn, qkey, !per_wr_ring) }
                    }
                },
            };
            if st != rdd_status::Ok {
                status = st;
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_bad_index, i) };
                break;
            }
            posted += 1;
        }
        if posted != 0 && !per_wr_ring {
            if let QpImpl::Mlx5(o) = q.q.get_mut() {
                o.sq.ring();
                q.doorbells += 1;
            }
        }
        status
    })
}
