//! Waiting and events: `rdd_cq_wait`, the CQ's event fd and arming, and the
//! device's asynchronous events.

use std::sync::Arc;

use crate::api::Backend;
use crate::completion::Wc;
use crate::ffi::mlx5::rdd_wc;
use crate::ffi::status::rdd_status;

use super::cq::{poll_counted, poll_counted_srqs, route_list, QpList};
use super::objects::{CqBudget, CqImpl, CqObj, DeviceObj};
use super::srq_route::BoundSrq;
use super::table::{excl, shared};
use super::types::{rdd_cq, rdd_device, rdd_qp, RDD_CQ_ARM_SOLICITED};
use super::{check_array, h, put};

/// `rdd_cq_wait` modes.
pub const RDD_WAIT_BUSY_POLL: u32 = 0;
/// Arm, poll once more, sleep on the CQ's event fd.
pub const RDD_WAIT_EVENT: u32 = 1;
/// Spin for a learnt budget, then as `RDD_WAIT_EVENT`.
pub const RDD_WAIT_ADAPTIVE: u32 = 2;

/// A CQ as `event::wait` drives it from C.
struct FfiWaitable<'a> {
    cq: &'a mut CqImpl,
    budget: &'a CqBudget,
    list: &'a mut QpList,
    /// The CQ's bound SRQs (`srq_route.rs`; empty for most CQs).
    srqs: &'a [BoundSrq],
    backend: &'a dyn Backend,
    cqn: u32,
}

impl crate::event::Waitable for FfiWaitable<'_> {
    fn poll(&mut self, out: &mut [Wc]) -> crate::error::Result<usize> {
        if self.srqs.is_empty() {
            return poll_counted(self.cq, self.budget, self.list, out);
        }
        poll_counted_srqs(self.cq, self.budget, self.list, self.srqs, out)
    }
    fn arm(&mut self) -> crate::error::Result<()> {
        self.cq.arm(false)
    }
    fn consume(&mut self) -> crate::error::Result<u32> {
        let n = self.backend.cq_event_consume(self.cqn)?;
        if let CqImpl::Mlx5(cq) = self.cq {
            // Each delivered event advances the arm sequence number.
            cq.events_consumed(n);
        }
        Ok(n)
    }
    fn fd(&self) -> crate::error::Result<i32> {
        self.backend.cq_event_fd(self.cqn)
    }
}

/// Waits up to `timeout_ns` nanoseconds for completions, then polls them
/// like `rdd_cq_poll` (same `qps` rules): `*out_count` >= 1 and
/// `RDD_STATUS_OK`, or `RDD_STATUS_TIMEOUT` (no completion came;
/// `*out_count` is not written, as on every failure). Never
/// blocks longer than the timeout. `mode` is `RDD_WAIT_BUSY_POLL`,
/// `RDD_WAIT_EVENT` (sleeps in the kernel) or `RDD_WAIT_ADAPTIVE` (spins for
/// a budget learnt per CQ, then sleeps); other values are
/// `INVALID_ARGUMENT`.
///
/// # Safety
/// As `rdd_cq_poll`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_wait(
    cq: *mut rdd_cq,
    qps: *const *mut rdd_qp,
    nqps: usize,
    out: *mut rdd_wc,
    n: usize,
    mode: u32,
    timeout_ns: u64,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        try_status!(check_array(qps, nqps));
        try_status!(check_array(out.cast_const(), n));
        let mode = match mode {
            RDD_WAIT_BUSY_POLL => crate::event::WaitMode::BusyPoll,
            RDD_WAIT_EVENT => crate::event::WaitMode::Event,
            RDD_WAIT_ADAPTIVE => crate::event::WaitMode::Adaptive,
            _ => return rdd_status::InvalidArgument,
        };
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        // Filled in place: the list is 8 KiB, too big to move.
        let mut list = QpList::new();
        // SAFETY: the caller's contract on `qps` (checked above).
        if let Err(s) = unsafe { route_list(&c, cq, qps, nqps, &mut list) } {
            return s;
        }
        // SAFETY: as in `rdd_cq_poll`.
        let out_wc = unsafe { core::slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let backend = Arc::clone(&c.backend);
        let budget = Arc::clone(&c.budget);
        let cqn = c.cqn;
        let mut adaptive = *c.adaptive.get_mut();
        let co: &mut CqObj = &mut c;
        let r = crate::event::wait(
            &mut FfiWaitable {
                cq: co.cq.get_mut(),
                budget: &budget,
                list: &mut list,
                srqs: &co.srqs,
                backend: &*backend,
                cqn,
            },
            out_wc,
            mode,
            &mut adaptive,
            core::time::Duration::from_nanos(timeout_ns),
        );
        *c.adaptive.get_mut() = adaptive;
        match r {
            Ok(count) => {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_count, count) };
                rdd_status::Ok
            }
            // Outputs only on success: a TIMEOUT leaves `*out_count` as
            // it was (it got no completion).
            Err(e) => e.into(),
        }
    })
}

/// The fd that becomes readable when the CQ, armed by an `RDD_WAIT_EVENT`
/// or `RDD_WAIT_ADAPTIVE` wait, gets a completion: for the application's
/// own epoll set.
///
/// # Safety
/// `out_fd` is valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_event_fd(
    cq: *mut rdd_cq,
    out_fd: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_fd);
        let c = try_status!(shared::<CqObj>(h(cq)));
        match c.backend.cq_event_fd(c.cqn) {
            Ok(fd) => {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_fd, fd) };
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}

/// An asynchronous device event (see `rdd_device_poll_async_event`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdd_async_event {
    /// `RDD_EVENT_*` (the `ibv_event_type` numbering).
    pub kind: u32,
    /// The QP number, CQ number, SRQ number or port number the event is
    /// about (as `kind` implies; 0 for device-wide events).
    pub element: u32,
}

/// An armed SRQ limit was crossed (`rdd_srq_arm_limit`): fewer receives
/// than the limit are posted to the SRQ and not yet taken; `element` is
/// the SRQ number (`rdd_srq_attr.srqn` of `rdd_srq_query`). The event
/// disarmed the limit: arm it again for another one.
/// (`IBV_EVENT_SRQ_LIMIT_REACHED`.)
pub const RDD_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
/// A QP on an SRQ, in ERROR, has no more receives to flush
/// (`IBV_EVENT_QP_LAST_WQE_REACHED`); `element` is the QP number.
pub const RDD_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

/// A CQ overran or failed; `element` is the CQ number.
pub const RDD_EVENT_CQ_ERR: u32 = 0;
/// A QP hit a fatal error and is in ERROR; `element` is the QP number.
/// Recover it with `rdd_qp_recover`.
pub const RDD_EVENT_QP_FATAL: u32 = 1;
/// An invalid request reached a QP, now in ERROR; `element` is the QPN.
pub const RDD_EVENT_QP_REQ_ERR: u32 = 2;
/// A remote access violation on a QP, now in ERROR; `element` is the QPN.
pub const RDD_EVENT_QP_ACCESS_ERR: u32 = 3;
/// The device failed: close and reopen it.
pub const RDD_EVENT_DEVICE_FATAL: u32 = 8;
/// A port became active; `element` is the port number.
pub const RDD_EVENT_PORT_ACTIVE: u32 = 9;
/// A port went down; `element` is the port number.
pub const RDD_EVENT_PORT_ERR: u32 = 10;

/// The C form of an event (kinds without a constant above keep their
/// `ibv_event_type` value).
fn async_event_c(e: crate::api::AsyncEvent) -> rdd_async_event {
    use crate::api::AsyncEvent as E;
    let (kind, element) = match e {
        E::CqError { cqn } => (RDD_EVENT_CQ_ERR, cqn),
        E::QpFatal { qpn } => (RDD_EVENT_QP_FATAL, qpn),
        E::QpRequestError { qpn } => (RDD_EVENT_QP_REQ_ERR, qpn),
        E::QpAccessError { qpn } => (RDD_EVENT_QP_ACCESS_ERR, qpn),
        E::CommEstablished { qpn } => (4, qpn),
        E::SqDrained { qpn } => (5, qpn),
        E::LastWqeReached { qpn } => (RDD_EVENT_QP_LAST_WQE_REACHED, qpn),
        E::SrqLimitReached { srqn } => (RDD_EVENT_SRQ_LIMIT_REACHED, srqn),
        E::DeviceFatal => (RDD_EVENT_DEVICE_FATAL, 0),
        E::PortActive { port } => (RDD_EVENT_PORT_ACTIVE, u32::from(port)),
        E::PortError { port } => (RDD_EVENT_PORT_ERR, u32::from(port)),
        E::Other { kind, element } => (kind, element),
    };
    rdd_async_event { kind, element }
}

/// Takes the device's next asynchronous event without blocking:
/// `*out_found` is 1 and `*out` filled, or 0 when none is pending. A QP
/// event of kind `RDD_EVENT_QP_FATAL`, `_REQ_ERR` or `_ACCESS_ERR` means
/// the device moved that QP to ERROR: recover it with `rdd_qp_recover`.
///
/// # Safety
/// `out` is valid for a write of one `rdd_async_event`, `out_found` of one
/// `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_poll_async_event(
    dev: *mut rdd_device,
    out: *mut rdd_async_event,
    out_found: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        non_null!(out_found);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let ev = try_status!(d.backend.poll_async_event().map_err(rdd_status::from));
        if let Some(e) = ev {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, async_event_c(e)) };
        }
        // SAFETY: as above.
        unsafe { put(out_found, ev.is_some() as core::ffi::c_int) };
        rdd_status::Ok
    })
}

/// An fd that is readable while asynchronous events are pending on the
/// device, for the application's own epoll set.
///
/// # Safety
/// `out_fd` is valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_async_event_fd(
    dev: *mut rdd_device,
    out_fd: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_fd);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let fd = try_status!(d.backend.async_event_fd().map_err(rdd_status::from));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_fd, fd) };
        rdd_status::Ok
    })
}

/// Arms the CQ: requests a completion event for the next completion (or,
/// with `RDD_CQ_ARM_SOLICITED`, the next solicited one).
/// `INVALID_ARGUMENT` for unknown flag bits.
#[no_mangle]
pub extern "C" fn rdd_cq_arm(cq: *mut rdd_cq, flags: u32) -> rdd_status {
    ffi_boundary!({
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        if flags & !RDD_CQ_ARM_SOLICITED != 0 {
            return rdd_status::InvalidArgument;
        }
        match c.cq.get_mut().arm(flags & RDD_CQ_ARM_SOLICITED != 0) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}
