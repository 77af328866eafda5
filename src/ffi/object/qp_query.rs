//! Seeing a QP from C: its state, what it was connected with, its
//! outstanding work and its recovery phase (`rdd_qp_query`), and the names
//! of its states.

use core::ffi::c_char;
use core::mem::size_of;

use static_assertions::const_assert_eq;

use crate::api::{recovery_phase, QpRecovery};
use crate::completion::QpState;
use crate::ffi::status::rdd_status;

use super::objects::QpObj;
use super::table::excl;
use super::types::rdd_qp;
use super::{h, put};

/// `rdd_qp_attr.state`: just created or reset; nothing may be posted.
pub const RDD_QP_STATE_RESET: u32 = 0;
/// `rdd_qp_attr.state`: initialised; receives may be posted.
pub const RDD_QP_STATE_INIT: u32 = 1;
/// `rdd_qp_attr.state`: ready to receive.
pub const RDD_QP_STATE_RTR: u32 = 2;
/// `rdd_qp_attr.state`: ready to send (connected).
pub const RDD_QP_STATE_RTS: u32 = 3;
/// `rdd_qp_attr.state`: error; posts complete with `RDD_WC_WR_FLUSH_ERR`.
pub const RDD_QP_STATE_ERROR: u32 = 4;

const_assert_eq!(RDD_QP_STATE_RESET, QpState::Reset as u32);
const_assert_eq!(RDD_QP_STATE_INIT, QpState::Init as u32);
const_assert_eq!(RDD_QP_STATE_RTR, QpState::Rtr as u32);
const_assert_eq!(RDD_QP_STATE_RTS, QpState::Rts as u32);
const_assert_eq!(RDD_QP_STATE_ERROR, QpState::Error as u32);

/// `rdd_qp_attr.recovery`: not in ERROR, nothing to recover.
pub const RDD_QP_RECOVERY_NONE: u32 = 0;
/// `rdd_qp_attr.recovery`: in ERROR with work outstanding. The device
/// flushes it; polling the QP's CQs (or `rdd_qp_recover`, which polls for
/// you) takes the completions. Recovery is under way or still to do.
pub const RDD_QP_RECOVERY_DRAINING: u32 = 1;
/// `rdd_qp_attr.recovery`: in ERROR with nothing outstanding. Move the QP
/// through RESET (`rdd_qp_recover` does) and reconnect.
pub const RDD_QP_RECOVERY_DRAINED: u32 = 2;

/// A snapshot of a QP (`rdd_qp_query`). The connection fields are those of
/// the last successful `rdd_qp_connect` (or reconnecting
/// `rdd_qp_recover`), and 0 while `connected` is 0. 72 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_qp_attr {
    /// `RDD_QP_STATE_*`, as the QP's handle knows it (an error completion
    /// moves it to ERROR).
    pub state: u32,
    /// `RDD_QP_RECOVERY_*`.
    pub recovery: u32,
    /// Send work posted and not yet completed: 64-byte basic blocks on the
    /// mlx5 path (the software device, ConnectX; one per WR of up to 64
    /// bytes), WRs on a kernel device's driver path (rxe, siw, the verbs
    /// fallback).
    pub send_outstanding: u32,
    /// Receives posted and not yet completed.
    pub recv_outstanding: u32,
    /// 1 if connected since the QP was created or last reset, else 0.
    pub connected: u32,
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The peer's initial PSN (this QP's receive PSN).
    pub rq_psn: u32,
    /// This QP's initial send PSN.
    pub sq_psn: u32,
    /// The path MTU in bytes both ports support.
    pub path_mtu: u32,
    /// `rdd_connect_attr.access`.
    pub access: u32,
    /// The rate limit the connect applied (kbit/s, 0: none).
    pub rate_limit_kbps: u32,
    /// The peer's LID.
    pub dest_lid: u16,
    /// Written as 0.
    pub reserved: u16,
    /// The peer's GID.
    pub dest_gid: [u8; 16],
    /// `rdd_connect_attr.rnr_retry`.
    pub rnr_retry: u8,
    /// `rdd_connect_attr.retry_cnt`.
    pub retry_cnt: u8,
    /// `rdd_connect_attr.traffic_class`.
    pub traffic_class: u8,
    /// `rdd_connect_attr.sl`.
    pub sl: u8,
    /// The local ACK timeout (IB encoding: 4.096 us * 2^timeout).
    pub timeout: u8,
    /// The minimum RNR NAK timer (IB encoding).
    pub min_rnr_timer: u8,
    /// RDMA READs and atomics outstanding in each direction.
    pub max_rd_atomic: u8,
    /// Written as 0.
    pub reserved2: u8,
}

const_assert_eq!(size_of::<rdd_qp_attr>(), 72);

/// Fills `*out` with the QP's state, what it was connected with, its
/// outstanding send and receive work and its recovery phase
/// (`rdd_qp_attr`). Asks the device nothing (no system call). Uses the QP
/// exclusively, as posting does (the counters are the data path's): while
/// another thread posts to it or polls its CQ, or `rdd_qp_recover` runs on
/// it, this is `RESOURCE_BUSY` (which, during a recovery, also says the
/// recovery is under way).
///
/// Errors: `NULL_PARAMETER` (`qp` or `out`), `INVALID_HANDLE` (a
/// destroyed or forged `qp`), `RESOURCE_BUSY`.
///
/// # Safety
/// `out` is valid for a write of one `rdd_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_query(qp: *mut rdd_qp, out: *mut rdd_qp_attr) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        let imp = q.q.get_mut();
        let state = imp.state();
        let (send, recv) = imp.outstanding_split();
        let recovery = match recovery_phase(state, u64::from(send) + u64::from(recv)) {
            QpRecovery::None => RDD_QP_RECOVERY_NONE,
            QpRecovery::Draining => RDD_QP_RECOVERY_DRAINING,
            QpRecovery::Drained => RDD_QP_RECOVERY_DRAINED,
        };
        let mut a = rdd_qp_attr {
            state: state as u32,
            recovery,
            send_outstanding: send,
            recv_outstanding: recv,
            ..rdd_qp_attr::default()
        };
        if let Some(c) = &q.connection {
            a.connected = 1;
            a.dest_qpn = c.remote.qpn;
            a.rq_psn = c.remote.psn;
            a.sq_psn = c.sq_psn;
            a.path_mtu = c.path_mtu;
            a.access = c.attr.access.0;
            a.rate_limit_kbps = c.attr.rate_limit_kbps;
            a.dest_lid = c.remote.lid;
            a.dest_gid = c.remote.gid;
            a.rnr_retry = c.attr.rnr_retry;
            a.retry_cnt = c.attr.retry_cnt;
            a.traffic_class = c.attr.traffic_class;
            a.sl = c.attr.sl;
            a.timeout = c.attr.timeout;
            a.min_rnr_timer = c.attr.min_rnr_timer;
            a.max_rd_atomic = c.attr.max_rd_atomic;
        }
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, a) };
        rdd_status::Ok
    })
}

/// The name of a QP state as the header spells it (`"RDD_QP_STATE_RTS"`),
/// for logs. Any value is accepted: one that is not an `RDD_QP_STATE_*`
/// gives `"unknown"`. A static NUL-terminated string, never NULL, never to
/// be freed.
#[no_mangle]
pub extern "C" fn rdd_qp_state_name(state: u32) -> *const c_char {
    ffi_boundary!({
        let s: &'static core::ffi::CStr = match state {
            RDD_QP_STATE_RESET => c"RDD_QP_STATE_RESET",
            RDD_QP_STATE_INIT => c"RDD_QP_STATE_INIT",
            RDD_QP_STATE_RTR => c"RDD_QP_STATE_RTR",
            RDD_QP_STATE_RTS => c"RDD_QP_STATE_RTS",
            RDD_QP_STATE_ERROR => c"RDD_QP_STATE_ERROR",
            _ => c"unknown",
        };
        s.as_ptr()
    })
}
