//! Unreliable datagrams at the object level: the address handle
//! (`rdd_ah`), UD QP creation (`rdd_qp_create_ud`, on an SRQ too), making
//! one ready with its Q_Key (`rdd_qp_ready_ud`) and the software device's
//! drop counters (`rdd_device_ud_drops`). The sends are in `ud_ops.rs`.
//!
//! An address handle holds the mlx5 address vector the backend built for
//! its destination; every UD WQE to that destination carries a copy of
//! it, so a handle may be destroyed while datagrams sent through it are
//! still outstanding (docs/spec/mlx5.md §3 "Datagram segment").
//!
//! On a kernel device opened on the verbs fallback data path
//! (`RDMA_DIRECT_DATA_PATH=fallback`; RoCE and InfiniBand only, so rxe,
//! not siw: iWARP has no datagrams) the handle is the provider's
//! (`Backend::create_driver_ah`, `ibv_create_ah`), destroyed with the
//! object, and UD QPs are provider-posted (`QpDriver::post_send_ud`), as
//! in the Rust API (`api::Ah`). On rxe's direct ring (the default data
//! path) the same hooks make the handle our own CREATE_AH and post the
//! datagrams into our own ring (docs/spec/rxe.md §8). siw (on either
//! path) and the mlx5 direct path have no UD: `UNSUPPORTED`
//! (docs/status.md).

use core::mem::size_of;

use std::boxed::Box;
use std::sync::Arc;

use static_assertions::const_assert_eq;

use crate::api::{AhInit, Backend, DriverAh, OWN_QKEY};
use crate::attr::AddressVector;
use crate::ffi::status::rdd_status;
use crate::provider::mlx5::{Mlx5Av, QpState};

use super::objects::{DeviceObj, PdObj, QpImpl, QpObj};
use super::qp::create_qp_obj;
use super::srq::rdd_srq;
use super::table::{excl, insert, shared, Object, KIND_AH};
use super::types::{rdd_cq, rdd_device, rdd_pd, rdd_qp, rdd_qp_init};
use super::{as_handle, h, put};

// ---------------------------------------------------------------------
// C types
// ---------------------------------------------------------------------

/// An address handle (opaque handle): where UD sends go.
/// `rdd_ah_create` / `rdd_ah_destroy`.
pub struct rdd_ah {
    _private: [u8; 0],
}

/// `rdd_qp_send_ud` and friends: a Q_Key that means "the sending QP's
/// own" (bit 31 set, IBA vol. 1 §10.2.4).
pub const RDD_OWN_QKEY: u32 = 0x8000_0000;

/// What `rdd_ah_create` makes an address handle from (`struct
/// ibv_ah_attr`): the destination's LID, and with `is_global` its global
/// route. The device supplies the rest (its link layer, the destination
/// MAC on RoCE), unlike the raw level's `rdd_mlx5_ah_attr`. 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_ah_attr {
    /// Destination GID (used with `is_global`).
    pub dgid: [u8; 16],
    /// Flow label of the global route (20 bits).
    pub flow_label: u32,
    /// Destination LID (InfiniBand).
    pub dlid: u16,
    /// Port to send from (1-based; 0: the device's port).
    pub port_num: u8,
    /// Service level (0..=15).
    pub sl: u8,
    /// 1: datagrams carry a GRH built from the fields below and `dgid`;
    /// 0: none.
    pub is_global: u8,
    /// Source GID index of the global route (the software device has
    /// one GID, index 0).
    pub sgid_index: u8,
    /// Hop limit of the global route.
    pub hop_limit: u8,
    /// Traffic class of the global route.
    pub traffic_class: u8,
    /// Must be 0.
    pub reserved: u32,
}

const_assert_eq!(size_of::<rdd_ah_attr>(), 32);

/// Datagrams the software device dropped since it was opened, by reason
/// (`rdd_device_ud_drops`). A dropped datagram completes successfully at
/// its sender and produces nothing at the destination. 40 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_ud_drops {
    /// No QP with the destination QP number exists.
    pub no_qp: u64,
    /// The destination QP is not a UD QP.
    pub not_ud: u64,
    /// The destination QP is not ready (`rdd_qp_ready_ud`).
    pub not_ready: u64,
    /// The datagram's Q_Key differs from the destination QP's.
    pub bad_qkey: u64,
    /// The destination QP had no receive posted (UD has no RNR retry).
    pub no_receive: u64,
}

const_assert_eq!(size_of::<rdd_ud_drops>(), 40);

// ---------------------------------------------------------------------
// Address handles
// ---------------------------------------------------------------------

pub(super) struct AhObj {
    /// The address vector each UD WQE to this destination copies (zeros
    /// for a provider's handle).
    pub(super) av: Mlx5Av,
    /// The provider's handle (the verbs fallback), destroyed with the
    /// object; `None` on the mlx5 core.
    pub(super) driver: Option<DriverAh>,
    pub(super) backend: Arc<dyn Backend>,
    /// The PD's link, compared with the QP's on every send (an AH is
    /// used only by QPs of its PD) and keeping the PD alive.
    pub(super) pd_link: Arc<()>,
}

impl Drop for AhObj {
    fn drop(&mut self) {
        // No send uses the handle any more (a send holds it shared for
        // its call, and the table drops the object only once no guard is
        // left); the PD goes after it, with the fields.
        if let Some(d) = self.driver {
            let _ = self.backend.destroy_driver_ah(d.handle);
        }
    }
}

// SAFETY: each kind value is used by exactly one type.
unsafe impl Object for AhObj {
    const KIND: u8 = KIND_AH;
}

/// The typed form of a C address-handle attribute: `INVALID_ARGUMENT`
/// for `is_global` other than 0 or 1 or a non-zero `reserved`.
pub(super) fn ah_init_from(a: &rdd_ah_attr) -> Result<AhInit, rdd_status> {
    if a.is_global > 1 || a.reserved != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(AhInit {
        port_num: a.port_num,
        dest: AddressVector {
            dlid: a.dlid,
            sl: a.sl,
            is_global: a.is_global == 1,
            dgid: a.dgid,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            flow_label: a.flow_label,
        },
    })
}

/// Creates an address handle in `pd` to the destination `attr` describes,
/// for `rdd_qp_send_ud` and friends on any UD QP of that PD. The PD is
/// used shared; while the handle exists `rdd_pd_free` is `RESOURCE_BUSY`.
///
/// Errors (nothing is created, `*out` is not written): `NULL_PARAMETER`
/// (`pd`, `attr`, `out`); `INVALID_HANDLE`; `RESOURCE_BUSY`;
/// `INVALID_ARGUMENT` (`is_global` other than 0 or 1, `reserved` not 0);
/// `INVALID_ATTRIBUTE` (an SL above 15, a flow label wider than 20 bits,
/// a port other than the device's, or what the device refuses: on the
/// software device a source GID index other than 0; on a kernel device
/// what `ibv_create_ah` refuses, `PROVIDER_ERROR`); `UNSUPPORTED` (a
/// device or data path without UD: siw (iWARP has no datagrams) and
/// ConnectX's mlx5 path; rxe has UD on both data paths, its direct ring
/// (our own CREATE_AH) and `RDMA_DIRECT_DATA_PATH=fallback` (libibverbs'
/// provider)).
///
/// # Safety
/// `attr` is valid for reads of one `rdd_ah_attr`; `out` for a write of
/// one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_ah_create(
    pd: *mut rdd_pd,
    attr: *const rdd_ah_attr,
    out: *mut *mut rdd_ah,
) -> rdd_status {
    ffi_boundary!({
        non_null!(attr);
        non_null!(out);
        let p = try_status!(shared::<PdObj>(h(pd)));
        // SAFETY: non-NULL and readable (caller contract).
        let attr = unsafe { attr.read_unaligned() };
        let init = try_status!(ah_init_from(&attr));
        let b = &p.backend;
        if let Err(e) = init.check(b.port().port_num) {
            return e.into();
        }
        let (av, driver) = match b.create_ah(p.pd, &init.dest) {
            Ok(av) => (av, None),
            // The provider's handle where there is no mlx5 address vector
            // (the verbs fallback), as `api::Pd::create_ah`.
            Err(crate::error::Error::Unsupported) => {
                let port = if init.port_num == 0 {
                    b.port().port_num
                } else {
                    init.port_num
                };
                match b.create_driver_ah(p.pd, port, &init.dest) {
                    Ok(d) => (Mlx5Av::default(), Some(d)),
                    Err(e) => return e.into(),
                }
            }
            Err(e) => return e.into(),
        };
        let obj = Box::new(AhObj {
            av,
            driver,
            backend: Arc::clone(b),
            pd_link: Arc::clone(&p.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Destroys an address handle. Datagrams already posted through it are
/// not affected (each WQE holds its own copy of the address), so this is
/// allowed with sends outstanding; later sends naming the handle are
/// `INVALID_HANDLE`. `RESOURCE_BUSY` while another thread sends through
/// it. On rxe it is the kernel's DESTROY_AH (`ibv_destroy_ah` on the
/// verbs fallback): a posted send names the kernel's handle rather than
/// copying the address (our direct ring always, rxe's provider on current
/// kernels), so destroy it after the sends through it have completed (one
/// still in flight may then complete in error).
#[no_mangle]
pub extern "C" fn rdd_ah_destroy(ah: *mut rdd_ah) -> rdd_status {
    ffi_boundary!({
        let a = try_status!(excl::<AhObj>(h(ah)));
        a.destroy();
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// UD queue pairs
// ---------------------------------------------------------------------

/// Creates an unreliable-datagram queue pair (in RESET) on `pd`, as
/// `rdd_qp_create` creates an RC one: same arguments, same sizing guard,
/// same statuses, plus `UNSUPPORTED` on a device or data path without UD
/// (as `rdd_ah_create`: of the kernel devices, only rxe has it, on both
/// data paths). Make it
/// ready with `rdd_qp_ready_ud` (it connects to nothing: `rdd_qp_connect`
/// on it is `INVALID_ATTRIBUTE`, `rdd_qp_recover` `UNSUPPORTED`).
///
/// It sends only datagrams (`rdd_qp_send_ud`, `rdd_qp_send_ud_imm`,
/// `rdd_qp_send_ud_inline`): RC sends on it (`rdd_qp_send`,
/// `rdd_qp_write`, `rdd_qp_post_send`, ...) are `INVALID_ATTRIBUTE` once
/// it is ready (no address handle) and write nothing. Receives are posted
/// as on RC (`rdd_qp_recv`, `rdd_qp_post_recv`), but every receive buffer
/// starts with a 40-byte GRH area: a datagram of `n` bytes needs a
/// receive of at least `40 + n` bytes, lands at offset 40, and completes
/// with `byte_len` `n + 40`, `src_qp` the sender's QP number, `slid` and
/// `sl` the sender's, and `RDD_WC_FLAG_GRH` when the sender's address
/// handle was global (the 40 bytes then hold the GRH; otherwise they are
/// left as they were). On RoCE (rxe) every datagram carries a GRH.
///
/// # Safety
/// As `rdd_qp_create`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_create_ud(
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    init: *const rdd_qp_init,
    out: *mut *mut rdd_qp,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: forwarded contract.
        unsafe { create_qp_obj(pd, send_cq, recv_cq, None, init, true, out) }
    })
}

/// Creates a UD queue pair as `rdd_qp_create_ud` does, taking its
/// receives from the shared receive queue `srq`, with the rules and
/// statuses of `rdd_qp_create_on_srq` (the SRQ's receives need the 40-byte
/// GRH area too).
///
/// # Safety
/// As `rdd_qp_create`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_create_ud_on_srq(
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
        unsafe { create_qp_obj(pd, send_cq, recv_cq, Some(h(srq)), init, true, out) }
    })
}

/// Moves a UD QP from RESET to ready (RTS: it sends and receives) with
/// Q_Key `qkey`: datagrams reach it only with that key. Refused with
/// nothing changed: `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY`;
/// `INVALID_ATTRIBUTE` for an RC QP or a `qkey` with bit 31 set (a
/// controlled key); `INVALID_QP_STATE` for a QP not in RESET.
#[no_mangle]
pub extern "C" fn rdd_qp_ready_ud(qp: *mut rdd_qp, qkey: u32) -> rdd_status {
    ffi_boundary!({
        let mut g = try_status!(excl::<QpObj>(h(qp)));
        let q: &mut QpObj = &mut g;
        if q.ud_mtu == 0 || qkey & OWN_QKEY != 0 {
            return rdd_status::InvalidAttribute;
        }
        if q.q.get_mut().state() != QpState::Reset {
            return rdd_status::InvalidQpState;
        }
        if let Err(e) = q.backend.ready_ud(q.qpn, qkey) {
            return e.into();
        }
        match q.q.get_mut() {
            QpImpl::Mlx5(o) => {
                o.sq.set_state(QpState::Rts);
                o.rq.set_state(QpState::Rts);
            }
            QpImpl::Driver(p) => p.state_changed(QpState::Rts),
        }
        rdd_status::Ok
    })
}

/// The datagrams the software device `dev` dropped since it was opened,
/// by reason (see `rdd_ud_drops`). `UNSUPPORTED` for every kernel device,
/// on every data path (the kernel keeps no such per-reason count: rxe's
/// drops are in its port and hardware counters, `rdma statistic`), with
/// `*out` unwritten.
///
/// # Safety
/// `out` is valid for a write of one `rdd_ud_drops`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_ud_drops(
    dev: *mut rdd_device,
    out: *mut rdd_ud_drops,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let Some(soft) = &d.soft else {
            return rdd_status::Unsupported;
        };
        let u = soft.ud_drops();
        let c = rdd_ud_drops {
            no_qp: u.no_qp,
            not_ud: u.not_ud,
            not_ready: u.not_ready,
            bad_qkey: u.bad_qkey,
            no_receive: u.no_receive,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, c) };
        rdd_status::Ok
    })
}
