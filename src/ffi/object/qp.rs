//! Queue pair calls: create, destroy, queries (connection data, caps, the
//! failed WR, doorbells) and the state changes of connecting.

use core::mem::size_of;
use core::ptr::NonNull;

use std::boxed::Box;
use std::sync::Arc;
use std::vec;
use std::vec::Vec;

use static_assertions::const_assert_eq;

use crate::api::{QpConnection, RawQpPath};
use crate::attr::{QpModify, SrqId};
use crate::ffi::mlx5::rdd_qp_caps;
use crate::ffi::status::rdd_status;
use crate::provider::mlx5::rq::AbsentRq;
use crate::provider::mlx5::{QpState, RecvQueue, SendQueue, SqConfig, WrSlot};

use super::objects::{CqObj, PdObj, QpDesc, QpImpl, QpObj, QpQueuesOwned};
use super::srq::{rdd_srq, SrqAttach, SrqObj};
use super::table::{excl, insert, shared, ExclusiveCell};
use super::types::{rdd_connect_attr, rdd_cq, rdd_pd, rdd_qp, rdd_qp_info, rdd_qp_init};
use super::types::{RDD_CQ_MAX_QPS, RDD_QP_INIT_SIG_ALL};
use super::{access_from, as_handle, h, put};

// ---------------------------------------------------------------------
// Queue pair
// ---------------------------------------------------------------------

impl Default for rdd_qp_init {
    fn default() -> Self {
        rdd_qp_init {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            flags: 0,
        }
    }
}

/// Creates an RC queue pair (in the RESET state) on `pd` whose sends
/// complete on `send_cq` and receives on `recv_cq` (may be the same CQ).
/// All three must belong to one device (`INVALID_ARGUMENT`). `init` may be
/// NULL for the defaults. The CQs are used by the call (not the PD).
///
/// Errors: `INVALID_ATTRIBUTE` (limits above the device's),
/// `INVALID_ARGUMENT` (unknown `init->flags`), `RESOURCE_EXHAUSTED` (a CQ
/// already serves `RDD_CQ_MAX_QPS` QPs).
///
/// # Safety
/// `init` is NULL or valid for reads of one `rdd_qp_init`; `out` is valid
/// for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_create(
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    init: *const rdd_qp_init,
    out: *mut *mut rdd_qp,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: forwarded contract.
        unsafe { create_qp_obj(pd, send_cq, recv_cq, None, init, false, out) }
    })
}

/// Creates an RC queue pair as `rdd_qp_create` does, attached to the
/// shared receive queue `srq` (of the same PD): it has no receive queue
/// of its own and takes its receives from the SRQ (`rdd_srq_post_recv`,
/// `rdd_srq_recv`). `init->max_recv_wr` and `init->max_recv_sge` are not
/// used; `rdd_qp_query_caps` reports `max_recv_sge` 0. Posting a receive
/// to the QP (`rdd_qp_post_recv`, `rdd_qp_recv`) is `INVALID_ATTRIBUTE`
/// and writes nothing. The SRQ's receive completions come on `recv_cq`
/// with the SRQ receive's `wr_id` and this QP's number in
/// `rdd_wc.qp_num`; `rdd_cq_poll`, `rdd_cq_poll_n` and `rdd_cq_wait` route
/// them through the SRQ, which each of them then uses exclusively too (on
/// the verbs fallback the provider's CQ maps them back itself and the
/// polls do not use the SRQ).
///
/// The sizing guard counts the QP's send queue on `send_cq` and the SRQ's
/// `max_wr` once on each receive CQ its QPs use (not once per QP). While
/// the QP exists, `rdd_srq_destroy` is `RESOURCE_BUSY`.
///
/// Errors (nothing is created, `*out` is not written): those of
/// `rdd_qp_create`; for `srq` `NULL_PARAMETER`, `INVALID_HANDLE`,
/// `RESOURCE_BUSY`; `INVALID_ARGUMENT` (the SRQ is of another PD);
/// `CQ_TOO_SMALL` (`recv_cq` cannot take the SRQ's `max_wr` besides what
/// it holds); `UNSUPPORTED` (a device without SRQs; on a kernel device an
/// SRQ exists only on the verbs fallback, `rdd_srq_create`, and a
/// signal-all QP, `RDD_QP_INIT_SIG_ALL`, is `UNSUPPORTED` there as for
/// every kernel-device QP).
///
/// # Safety
/// As `rdd_qp_create`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_create_on_srq(
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    srq: *mut rdd_srq,
    init: *const rdd_qp_init,
    out: *mut *mut rdd_qp,
) -> rdd_status {
    ffi_boundary!({
        non_null!(srq);
        // SAFETY: forwarded contract.
        unsafe { create_qp_obj(pd, send_cq, recv_cq, Some(h(srq)), init, false, out) }
    })
}

/// The body of `rdd_qp_create`, `rdd_qp_create_on_srq` (`srq`: the SRQ
/// handle, non-NULL) and their UD forms (`ud`, `ud.rs`).
///
/// # Safety
/// As `rdd_qp_create`.
pub(super) unsafe fn create_qp_obj(
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    srq: Option<usize>,
    init: *const rdd_qp_init,
    ud: bool,
    out: *mut *mut rdd_qp,
) -> rdd_status {
    non_null!(out);
    let init = if init.is_null() {
        rdd_qp_init::default()
    } else {
        // SAFETY: non-NULL and readable (caller contract).
        unsafe { init.read_unaligned() }
    };
    if init.flags & !RDD_QP_INIT_SIG_ALL != 0 {
        return rdd_status::InvalidArgument;
    }
    let p = try_status!(shared::<PdObj>(h(pd)));
    let mut scq = try_status!(excl::<CqObj>(h(send_cq)));
    let mut rcq = if h(recv_cq) == h(send_cq) {
        None
    } else {
        Some(try_status!(excl::<CqObj>(h(recv_cq))))
    };
    let rcq_ref: &CqObj = rcq.as_deref().unwrap_or(&*scq);
    if scq.dev != p.dev || rcq_ref.dev != p.dev {
        return rdd_status::InvalidArgument;
    }
    if scq.attached() >= RDD_CQ_MAX_QPS || rcq_ref.attached() >= RDD_CQ_MAX_QPS {
        return rdd_status::ResourceExhausted;
    }
    let srq_g = match srq {
        None => None,
        Some(sh) => Some(try_status!(shared::<SrqObj>(sh))),
    };
    if srq_g.as_ref().is_some_and(|s| s.pd != h(pd)) {
        return rdd_status::InvalidArgument;
    }
    let mut qi = init.queue_sizes();
    qi.srq = srq_g.as_ref().map(|s| SrqId::from_srqn(s.srqn));
    let b = &p.backend;
    let created = if ud {
        b.create_ud_qp(p.pd, scq.cqn, rcq_ref.cqn, &qi)
    } else {
        b.create_qp(p.pd, scq.cqn, rcq_ref.cqn, &qi)
    };
    let raw = match created {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let cfg = SqConfig {
        sig_all: init.flags & RDD_QP_INIT_SIG_ALL != 0,
        ..SqConfig::default()
    };
    let mlx5_dv = match &raw.path {
        RawQpPath::Mlx5(dv) => Some(QpDesc(*dv)),
        RawQpPath::Driver(_) => None,
    };
    // A QP on an SRQ has no receive queue (`rq_wqe_cnt` 0): its core
    // `rq` is the stand-in `AbsentRq` over private memory, which
    // `rdd_qp_post_recv` and `rdd_qp_recv` refuse before anything reaches
    // it and the device never reads (as `api::Qp` does).
    let mut no_rq = srq_g.as_ref().map(|_| Box::new(AbsentRq::new()));
    let (mut qimpl, sq_need, rq_need, sq_wrid, rq_wrid) = match raw.path {
        RawQpPath::Mlx5(dv) => {
            let mut sq_wrid = vec![WrSlot::default(); dv.sq_wqe_cnt as usize];
            let rq_slots = if no_rq.is_some() { 0 } else { dv.rq_wqe_cnt };
            let mut rq_wrid = vec![0u64; rq_slots as usize];
            let built = (|| {
                let slots =
                    NonNull::new(sq_wrid.as_mut_ptr()).ok_or(rdd_status::InvalidGeometry)?;
                let (caps, n) = (raw.caps, sq_wrid.len());
                // SAFETY: the descriptor names queue memory kept alive
                // by `raw.keep` (held by the QpObj); the side tables
                // are owned by the QpObj and their heap buffers never
                // move; every SGE is checked by the device against its
                // registered regions (lkey, bounds, PD, access) before
                // any access, and scatter-to-CQE is off on the pollers.
                let sq = unsafe {
                    if ud {
                        SendQueue::from_raw_ud(&dv, raw.qpn, caps, cfg, slots, n)
                    } else {
                        SendQueue::from_raw(&dv, raw.qpn, caps, cfg, slots, n)
                    }
                }?;
                let rq = match no_rq.as_deref_mut() {
                    // SAFETY: as above.
                    None => unsafe {
                        RecvQueue::from_raw(
                            &dv,
                            &raw.caps,
                            NonNull::new(rq_wrid.as_mut_ptr())
                                .ok_or(rdd_status::InvalidGeometry)?,
                            rq_wrid.len(),
                        )
                    }?,
                    // SAFETY: the stand-in's memory is boxed (it never
                    // moves) and owned by the QpObj next to the queue.
                    Some(m) => unsafe { m.queue() }?,
                };
                Ok::<_, rdd_status>((sq, rq))
            })();
            let (sq, rq) = match built {
                Ok(v) => v,
                Err(e) => {
                    let _ = b.destroy_qp(raw.qpn);
                    return e;
                }
            };
            (
                QpImpl::Mlx5(QpQueuesOwned { sq, rq }),
                u64::from(dv.sq_wqe_cnt),
                u64::from(dv.rq_wqe_cnt),
                sq_wrid,
                rq_wrid,
            )
        }
        RawQpPath::Driver(p) => {
            // The provider (libibverbs, or the verbs backend's own
            // rxe/siw rings) keeps the queues; signal-all QPs exist only
            // on the mlx5 core. A QP on an SRQ is a driver QP on both
            // rxe/siw data paths, and its SRQ is the backend's
            // (`SrqQueue::Driver`); a UD QP only on the verbs fallback
            // (the backend refuses it on the direct rings). An mlx5 ring
            // under a driver QP is never made, and refused here all the
            // same.
            if cfg.sig_all || srq_g.as_ref().is_some_and(|s| !s.driver) {
                drop(p);
                let _ = b.destroy_qp(raw.qpn);
                return rdd_status::Unsupported;
            }
            let (s, r) = p.capacity();
            (
                QpImpl::Driver(p),
                u64::from(s),
                u64::from(r),
                Vec::new(),
                Vec::new(),
            )
        }
    };
    // The SRQ's share of the receive CQ (released when the attachment
    // is dropped, with the QP or on a refusal below).
    let recv_budget = Arc::clone(rcq.as_ref().map_or(&scq.budget, |r| &r.budget));
    let attach = match &srq_g {
        Some(s) => match SrqAttach::attach(s, &recv_budget) {
            Ok(a) => Some(a),
            Err(e) => {
                drop(qimpl);
                let _ = b.destroy_qp(raw.qpn);
                return e;
            }
        },
        None => None,
    };
    // The CQ sizing guard (as `api::Pd::create_qp`): every WR the
    // queues can hold may complete at once (a flush), so each CQ must
    // hold the sum over its QPs.
    let charges = match &rcq {
        None if scq.budget.charge(sq_need + rq_need) => {
            vec![(Arc::clone(&scq.budget), sq_need + rq_need)]
        }
        Some(r) if scq.budget.charge(sq_need) => {
            if r.budget.charge(rq_need) {
                vec![
                    (Arc::clone(&scq.budget), sq_need),
                    (Arc::clone(&r.budget), rq_need),
                ]
            } else {
                scq.budget.release(sq_need);
                Vec::new()
            }
        }
        _ => Vec::new(),
    };
    if charges.is_empty() {
        drop(qimpl);
        let _ = b.destroy_qp(raw.qpn);
        return rdd_status::CqTooSmall;
    }
    match &mut qimpl {
        QpImpl::Mlx5(q) => {
            q.sq.set_state(QpState::Reset);
            q.rq.set_state(QpState::Reset);
        }
        QpImpl::Driver(p) => p.state_changed(QpState::Reset),
    }
    let mut cq_links = vec![Arc::clone(&scq.link)];
    if let Some(r) = &rcq {
        cq_links.push(Arc::clone(&r.link));
    }
    let send_budget = Arc::clone(&scq.budget);
    let srqn = attach.as_ref().map(|a| a.srqn);
    let obj = Box::new(QpObj {
        charges,
        send_budget,
        recv_budget,
        backend: Arc::clone(b),
        qpn: raw.qpn,
        caps: raw.caps,
        send_cq: h(send_cq),
        recv_cq: h(recv_cq),
        doorbells: 0,
        q: ExclusiveCell(qimpl),
        psn: raw.psn & 0xff_ffff,
        rate_limit_kbps: 0,
        connection: None,
        serviced: core::sync::atomic::AtomicBool::new(false),
        _sq_wrid: sq_wrid,
        _rq_wrid: rq_wrid,
        mlx5_dv,
        srq: attach,
        ud_mtu: if ud { b.port().mtu.max(256) } else { 0 },
        _no_rq: no_rq,
        _keep: raw.keep,
        _pd_link: Arc::clone(&p.link),
        _cq_links: cq_links,
    });
    let handle = try_status!(insert(obj));
    // The CQs learn their new QP (for `rdd_cq_poll_n`); both are held,
    // so no poll sees the QP before it is bound.
    try_status!(scq.bind(raw.qpn, handle));
    if let Some(r) = rcq.as_deref_mut() {
        try_status!(r.bind(raw.qpn, handle));
    }
    // The receive CQ learns the SRQ, so its polls route the SRQ's
    // receive completions. A provider-posted SRQ's receives complete on a
    // driver CQ, whose poller returns their slots itself: not bound (its
    // QPs' `rdd_qp_destroy` then unbinds nothing).
    let routed = srq_g.as_ref().is_some_and(|s| !s.driver);
    if let (Some(n), Some(sh), true) = (srqn, srq, routed) {
        let rc: &mut CqObj = match rcq.as_deref_mut() {
            Some(r) => r,
            None => &mut scq,
        };
        try_status!(rc.bind_srq(n, sh));
    }
    // SAFETY: non-NULL (checked), writable (caller contract).
    unsafe { put(out, as_handle(handle)) };
    rdd_status::Ok
}

/// The connection data to give the peer (for its `rdd_qp_connect`).
///
/// # Safety
/// `out` is valid for a write of one `rdd_qp_info`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_query_info(qp: *const rdd_qp, out: *mut rdd_qp_info) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let q = try_status!(shared::<QpObj>(h(qp)));
        let port = q.backend.port();
        let info = rdd_qp_info {
            qpn: q.qpn,
            psn: q.psn,
            lid: port.lid,
            reserved: 0,
            gid: port.gid,
            mtu: port.mtu,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, info) };
        rdd_status::Ok
    })
}

/// The capabilities the QP was granted (at least what `rdd_qp_init`
/// asked): the SGE and inline limits posts are checked against.
///
/// # Safety
/// `out` is valid for a write of one `rdd_qp_caps`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_query_caps(qp: *const rdd_qp, out: *mut rdd_qp_caps) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let q = try_status!(shared::<QpObj>(h(qp)));
        let caps = rdd_qp_caps {
            max_send_sge: q.caps.max_send_sge,
            max_inline_data: q.caps.max_inline_data,
            max_recv_sge: q.caps.max_recv_sge,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, caps) };
        rdd_status::Ok
    })
}

/// The first work request that failed on this QP since it was created or
/// last reset, as it was posted (`rdd_qp_failed_wr`). Flush errors do not
/// count: this is the WR that broke the QP. 56 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_failed_wr {
    /// The WR's id.
    pub wr_id: u64,
    /// Completion status (`RDD_WC_*`).
    pub status: u32,
    /// Raw vendor syndrome.
    pub vendor_err: u32,
    /// Operation (`RDD_WC_OP_*`).
    pub opcode: u32,
    /// Raw mlx5 syndrome.
    pub syndrome: u8,
    /// 1 for a receive, 0 for a send-queue WR.
    pub recv: u8,
    /// 1 if the payload was inline.
    pub inline_data: u8,
    /// Written as 0.
    pub reserved: u8,
    /// First local buffer (0 for inline data).
    pub local_addr: u64,
    /// Total local length (inline bytes for inline data).
    pub length: u32,
    /// Local key of the first buffer.
    pub lkey: u32,
    /// Remote address (RDMA and atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics).
    pub rkey: u32,
    /// Written as 0.
    pub reserved2: u32,
}

const_assert_eq!(size_of::<rdd_failed_wr>(), 56);

/// The C form of a failed WR.
pub(super) fn failed_wr_c(f: &crate::wr::FailedWr) -> rdd_failed_wr {
    rdd_failed_wr {
        wr_id: f.wr_id,
        status: f.status.0,
        vendor_err: f.vendor_err,
        opcode: f.opcode.0,
        syndrome: f.syndrome,
        recv: f.recv as u8,
        inline_data: f.inline as u8,
        reserved: 0,
        local_addr: f.local_addr,
        length: f.length,
        lkey: f.lkey,
        remote_addr: f.remote_addr,
        rkey: f.rkey,
        reserved2: 0,
    }
}

/// The first WR that failed on `qp` (see `rdd_failed_wr`). `*out_found` is
/// 1 and `*out` filled if there is one, 0 (and `*out` untouched)
/// otherwise. `rdd_wc_status_causes` explains the status in words.
///
/// # Safety
/// `out` is valid for a write of one `rdd_failed_wr`, `out_found` of one
/// `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_failed_wr(
    qp: *mut rdd_qp,
    out: *mut rdd_failed_wr,
    out_found: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        non_null!(out_found);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        let found = q.q.get_mut().failure();
        if let Some(f) = found {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, failed_wr_c(&f)) };
        }
        // SAFETY: as above.
        unsafe { put(out_found, found.is_some() as core::ffi::c_int) };
        rdd_status::Ok
    })
}

/// The number of send doorbells this QP has rung (one per non-empty
/// `rdd_qp_post_send` call): a measure of batching.
///
/// # Safety
/// `out_count` is valid for a write of one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_doorbells(qp: *const rdd_qp, out_count: *mut u64) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        let q = try_status!(shared::<QpObj>(h(qp)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_count, q.doorbells) };
        rdd_status::Ok
    })
}

/// Sets the QP's send rate limit in kbit/s (0: none), applied by the next
/// `rdd_qp_connect` (or `rdd_qp_recover` with a peer). Devices without
/// packet pacing (the software device, rxe, siw) then refuse the connect
/// with `UNSUPPORTED`; ConnectX paces through verbs.
#[no_mangle]
pub extern "C" fn rdd_qp_set_rate_limit(qp: *mut rdd_qp, kbps: u32) -> rdd_status {
    ffi_boundary!({
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        q.rate_limit_kbps = kbps;
        rdd_status::Ok
    })
}

/// Moves the QP from RESET through INIT and RTR to RTS, connected to the
/// peer `remote` describes. `attr` may be NULL (no remote access, infinite
/// retries).
///
/// A refused call changes nothing: every field is checked before the
/// first state change, and a step the device refuses part-way (a limit
/// only it knows) moves the QP back to RESET before the call returns.
///
/// Errors: `NULL_PARAMETER` (`qp`, `remote`), `INVALID_HANDLE`, `RESOURCE_BUSY`
/// (the QP is in use by another call), `INVALID_QP_STATE` (not in RESET),
/// `INVALID_ARGUMENT` (unknown access bits, `remote->reserved` not 0),
/// `INVALID_ATTRIBUTE` (`remote->qpn` or `remote->psn` wider than 24 bits,
/// retry counts above 7, `sl` above 15), `UNSUPPORTED` (iWARP, which
/// connects through rdma_cm; a rate limit, `rdd_qp_set_rate_limit`, on a
/// device without packet pacing), or what the device reports
/// (`PROVIDER_ERROR`, ...).
///
/// # Safety
/// `remote` is valid for reads of one `rdd_qp_info`; `attr` is NULL or
/// valid for reads of one `rdd_connect_attr`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_connect(
    qp: *mut rdd_qp,
    remote: *const rdd_qp_info,
    attr: *const rdd_connect_attr,
) -> rdd_status {
    ffi_boundary!({
        non_null!(remote);
        // SAFETY: non-NULL and readable (caller contract).
        let remote = unsafe { remote.read_unaligned() };
        // SAFETY: NULL or readable (caller contract).
        let attr = unsafe { connect_attr_or_default(attr) };
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        match connect_obj(&mut q, &remote, &attr) {
            Ok(()) => rdd_status::Ok,
            Err(s) => s,
        }
    })
}

/// `rdd_connect_attr` from C, or the defaults for NULL (no remote access,
/// infinite retries).
///
/// # Safety
/// `attr` is NULL or readable.
pub(super) unsafe fn connect_attr_or_default(attr: *const rdd_connect_attr) -> rdd_connect_attr {
    if attr.is_null() {
        rdd_connect_attr {
            access: 0,
            rnr_retry: 7,
            retry_cnt: 7,
            traffic_class: 0,
            sl: 0,
        }
    } else {
        // SAFETY: non-NULL and readable (caller contract).
        unsafe { attr.read_unaligned() }
    }
}

/// Checks a connect's inputs in full and builds its three steps, changing
/// nothing: `INVALID_ARGUMENT` for the C-level fields (reserved, unknown
/// access bits), then the Rust API's checks (`INVALID_ATTRIBUTE`).
pub(super) fn checked_steps(
    q: &QpObj,
    remote: &rdd_qp_info,
    attr: &rdd_connect_attr,
) -> Result<([QpModify; 3], QpConnection), rdd_status> {
    if q.ud_mtu != 0 {
        // A UD QP has no peer (`rdd_qp_ready_ud`).
        return Err(rdd_status::InvalidAttribute);
    }
    let port = q.backend.port();
    if port.transport == crate::api::Transport::Iwarp {
        // iWARP connects through rdma_cm only.
        return Err(rdd_status::Unsupported);
    }
    if remote.reserved != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    let ca = crate::api::ConnectAttr {
        access: access_from(attr.access)?,
        rnr_retry: attr.rnr_retry,
        retry_cnt: attr.retry_cnt,
        traffic_class: attr.traffic_class,
        sl: attr.sl,
        rate_limit_kbps: q.rate_limit_kbps,
        ..crate::api::ConnectAttr::default()
    };
    let peer = crate::api::QpInfo {
        qpn: remote.qpn,
        psn: remote.psn,
        lid: remote.lid,
        gid: remote.gid,
        mtu: remote.mtu,
    };
    let steps = crate::api::checked_connect_steps(&port, q.psn, &peer, &ca)?;
    let conn = QpConnection {
        remote: peer,
        attr: ca,
        path_mtu: steps[1].path_mtu,
        sq_psn: q.psn,
    };
    Ok((steps, conn))
}

/// RESET → INIT → RTR → RTS towards `remote`, keeping the queues' states
/// in step. Everything is checked first; a step the device refuses
/// part-way moves the QP back to RESET, so a refused connect leaves the QP
/// as it was.
pub(super) fn connect_obj(
    q: &mut QpObj,
    remote: &rdd_qp_info,
    attr: &rdd_connect_attr,
) -> Result<(), rdd_status> {
    let (steps, conn) = checked_steps(q, remote, attr)?;
    if q.q.get_mut().state() != QpState::Reset {
        return Err(rdd_status::InvalidQpState);
    }
    for (i, m) in steps.iter().enumerate() {
        if let Err(e) = modify_obj(q, m) {
            if i > 0 {
                // Back to where the call started: RESET is always allowed,
                // and nothing was posted in between (the QP is held).
                let _ = modify_obj(q, &QpModify::to(QpState::Reset));
            }
            return Err(e);
        }
    }
    q.connection = Some(conn);
    Ok(())
}

/// One state change, with the queues' states (and on RESET their
/// counters) kept in step. The attributes are checked first
/// (`QpModify::validate`), so a refused change changes nothing.
pub(super) fn modify_obj(q: &mut QpObj, m: &QpModify) -> Result<(), rdd_status> {
    m.validate()?;
    q.backend.modify_qp(q.qpn, m)?;
    match q.q.get_mut() {
        QpImpl::Mlx5(queues) => {
            if m.state == QpState::Reset {
                queues.sq.reset_counters(0);
                queues.rq.reset_counters(0);
            }
            queues.sq.set_state(m.state);
            queues.rq.set_state(m.state);
        }
        QpImpl::Driver(p) => p.state_changed(m.state),
    }
    if m.state == QpState::Reset {
        q.connection = None;
    }
    Ok(())
}

/// Marks `qp` as driven by a submission service (`rdd_submit_create`):
/// `UNSUPPORTED` for a UD QP, `RESOURCE_BUSY` if another service drives
/// it already (two services on
/// one QP would take each other's completions), the handle statuses of a
/// shared acquisition otherwise.
pub(in crate::ffi) fn claim_for_service(qp: usize) -> Result<(), rdd_status> {
    let g = shared::<QpObj>(qp)?;
    if g.ud_mtu != 0 {
        // The service posts RC work requests, which a UD QP refuses.
        return Err(rdd_status::Unsupported);
    }
    // Relaxed: the flag guards nothing but itself; the CAS makes one of
    // two racing claims fail.
    match g.serviced.compare_exchange(
        false,
        true,
        core::sync::atomic::Ordering::Relaxed,
        core::sync::atomic::Ordering::Relaxed,
    ) {
        Ok(_) => Ok(()),
        Err(_) => Err(rdd_status::ResourceBusy),
    }
}

/// Undoes [`claim_for_service`] when the service goes. A QP destroyed
/// under the service (its handle dead) has nothing to undo. A QP busy in
/// another thread's exclusive call is waited for, a bounded number of
/// times (the service is idle by now, so only a foreign call can hold it).
pub(in crate::ffi) fn release_service(qp: usize) {
    for _ in 0..1_000_000 {
        match shared::<QpObj>(qp) {
            Ok(g) => {
                // Relaxed: as in `claim_for_service`.
                g.serviced
                    .store(false, core::sync::atomic::Ordering::Relaxed);
                return;
            }
            Err(rdd_status::ResourceBusy) => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}
