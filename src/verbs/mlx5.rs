//! The mlx5 (ConnectX) direct path under the verbs backend: QPs and CQs
//! are created through libibverbs/libmlx5, then `mlx5dv_init_obj` hands
//! out their raw queues (docs/spec/mlx5.md §1), which go to the crate's own
//! mlx5 core, so posting and polling make no library call at all.
//!
//! * Each QP is created under its own thread domain (a parent domain over
//!   the PD), so libmlx5 gives it a dedicated BlueFlame register (no
//!   lock on the doorbell, no sharing with another QP).
//! * Scatter-to-CQE is disabled at creation (`mlx5dv_create_qp` with
//!   `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`), and the safe API's pollers
//!   refuse scattered CQEs anyway.
//!
//! This path needs a ConnectX NIC, which this project's CI does not have:
//! it is compiled and layout-checked everywhere (`tests/layout_bindgen.rs`
//! compares the structs below with bindgen's), and the core it feeds is
//! tested on the software device. `docs/verbs.md` says what a user with a
//! NIC runs to check it. `DataPath::Fallback` (or
//! `RDMA_DIRECT_DATA_PATH=fallback`) uses the verbs fallback on mlx5 as
//! well.

use core::ffi::c_int;

use rdma_sys as sys;

use super::{check, fail_errno};
use crate::error::{Error, Result};
use crate::provider::mlx5::{Mlx5dvCq, Mlx5dvQp};

/// `mlx5dv_obj_type::MLX5DV_OBJ_QP`.
pub const MLX5DV_OBJ_QP: u64 = 1 << 0;
/// `mlx5dv_obj_type::MLX5DV_OBJ_CQ`.
pub const MLX5DV_OBJ_CQ: u64 = 1 << 1;
/// `MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS`.
pub const MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: u64 = 1 << 0;
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`.
pub const MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;
/// `IBV_QP_INIT_ATTR_PD`.
const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;

/// One `{ in, out }` pair of `struct mlx5dv_obj`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ObjPair<I, O> {
    /// The verbs object.
    pub input: *mut I,
    /// Where libmlx5 writes its queues.
    pub output: *mut O,
}

/// `struct mlx5dv_obj` (seven pairs; only QP and CQ are used).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Mlx5dvObj {
    /// QP.
    pub qp: ObjPair<sys::ibv_qp, Mlx5dvQp>,
    /// CQ.
    pub cq: ObjPair<sys::ibv_cq, Mlx5dvCq>,
    /// SRQ (unused).
    pub srq: ObjPair<u8, u8>,
    /// RWQ (unused).
    pub rwq: ObjPair<u8, u8>,
    /// Device memory (unused).
    pub dm: ObjPair<u8, u8>,
    /// Address handle (unused).
    pub ah: ObjPair<u8, u8>,
    /// PD (unused).
    pub pd: ObjPair<u8, u8>,
}

/// `struct mlx5dv_dc_init_attr` (unused here; RC QPs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mlx5dvDcInitAttr {
    /// `enum mlx5dv_dc_type`.
    pub dc_type: u32,
    /// The union of `dct_access_key` and `dci_streams`.
    pub union_: u64,
}

/// `struct mlx5dv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mlx5dvQpInitAttr {
    /// `enum mlx5dv_qp_init_attr_mask`.
    pub comp_mask: u64,
    /// `enum mlx5dv_qp_create_flags`.
    pub create_flags: u32,
    /// DC attributes.
    pub dc_init_attr: Mlx5dvDcInitAttr,
    /// `enum mlx5dv_qp_create_send_ops_flags`.
    pub send_ops_flags: u64,
}

static_assertions::const_assert_eq!(core::mem::size_of::<Mlx5dvObj>(), 112);
static_assertions::const_assert_eq!(core::mem::size_of::<Mlx5dvQpInitAttr>(), 40);
static_assertions::const_assert_eq!(core::mem::offset_of!(Mlx5dvQpInitAttr, dc_init_attr), 16);

extern "C" {
    fn mlx5dv_is_supported(device: *mut sys::ibv_device) -> bool;
    fn mlx5dv_init_obj(obj: *mut Mlx5dvObj, obj_type: u64) -> c_int;
    fn mlx5dv_create_qp(
        context: *mut sys::ibv_context,
        qp_attr: *mut sys::ibv_qp_init_attr_ex,
        mlx5_qp_attr: *mut Mlx5dvQpInitAttr,
    ) -> *mut sys::ibv_qp;
}

/// True if `ctx` is an mlx5 device whose queues this crate may drive.
pub(crate) fn usable(ctx: *mut sys::ibv_context) -> bool {
    // SAFETY: live context with a live device.
    unsafe { mlx5dv_is_supported((*ctx).device) }
}

fn empty_obj() -> Mlx5dvObj {
    let none = ObjPair {
        input: core::ptr::null_mut(),
        output: core::ptr::null_mut(),
    };
    Mlx5dvObj {
        qp: ObjPair {
            input: core::ptr::null_mut(),
            output: core::ptr::null_mut(),
        },
        cq: ObjPair {
            input: core::ptr::null_mut(),
            output: core::ptr::null_mut(),
        },
        srq: none,
        rwq: none,
        dm: none,
        ah: none,
        pd: none,
    }
}

/// The raw queues of an mlx5 CQ.
pub(crate) fn cq_queues(cq: *mut sys::ibv_cq) -> Result<Mlx5dvCq> {
    // SAFETY: all-zero is a valid Mlx5dvCq (null pointers, zero sizes).
    let mut out: Mlx5dvCq = unsafe { core::mem::zeroed() };
    let mut obj = empty_obj();
    obj.cq = ObjPair {
        input: cq,
        output: &mut out,
    };
    // SAFETY: live CQ of an mlx5 context; `out` is writable.
    check("mlx5dv_init_obj(cq)", unsafe {
        mlx5dv_init_obj(&mut obj, MLX5DV_OBJ_CQ)
    })?;
    Ok(out)
}

/// A thread domain and the parent domain over a PD that uses it.
pub struct ThreadDomain {
    td: *mut sys::ibv_td,
    parent: *mut sys::ibv_pd,
}

impl ThreadDomain {
    /// Allocates a thread domain and a parent domain for `pd`.
    pub(crate) fn new(ctx: *mut sys::ibv_context, pd: *mut sys::ibv_pd) -> Result<ThreadDomain> {
        let mut ta = sys::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: live context; valid attributes.
        let td = unsafe { sys::ibv_alloc_td(ctx, &mut ta) }.unwrap_or(core::ptr::null_mut());
        if td.is_null() {
            return Err(fail_errno("ibv_alloc_td"));
        }
        // SAFETY: all-zero is a valid ibv_parent_domain_init_attr.
        let mut pa: sys::ibv_parent_domain_init_attr = unsafe { core::mem::zeroed() };
        pa.pd = pd;
        pa.td = td;
        // SAFETY: live context, PD and TD.
        let parent =
            unsafe { sys::ibv_alloc_parent_domain(ctx, &mut pa) }.unwrap_or(core::ptr::null_mut());
        if parent.is_null() {
            let e = fail_errno("ibv_alloc_parent_domain");
            // SAFETY: the TD just allocated, unused.
            unsafe { sys::ibv_dealloc_td(td) };
            return Err(e);
        }
        Ok(ThreadDomain { td, parent })
    }
}

impl Drop for ThreadDomain {
    fn drop(&mut self) {
        // SAFETY: the QP using them was destroyed first (the owner drops
        // this after ibv_destroy_qp).
        unsafe {
            sys::ibv_dealloc_pd(self.parent);
            sys::ibv_dealloc_td(self.td);
        }
    }
}

/// Creates an RC QP under a new thread domain with scatter-to-CQE
/// disabled, and returns it with its raw queues.
pub(crate) fn create_qp(
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    send_cq: *mut sys::ibv_cq,
    recv_cq: *mut sys::ibv_cq,
    cap: sys::ibv_qp_cap,
) -> Result<(*mut sys::ibv_qp, Mlx5dvQp, sys::ibv_qp_cap, ThreadDomain)> {
    let td = ThreadDomain::new(ctx, pd)?;
    // SAFETY: all-zero is a valid ibv_qp_init_attr_ex.
    let mut ia: sys::ibv_qp_init_attr_ex = unsafe { core::mem::zeroed() };
    ia.send_cq = send_cq;
    ia.recv_cq = recv_cq;
    ia.cap = cap;
    ia.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD;
    ia.pd = td.parent;
    let mut ma = Mlx5dvQpInitAttr {
        comp_mask: MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        create_flags: MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
        ..Mlx5dvQpInitAttr::default()
    };
    // SAFETY: live context, parent domain and CQs; valid attributes.
    let qp = unsafe { mlx5dv_create_qp(ctx, &mut ia, &mut ma) };
    if qp.is_null() {
        return Err(fail_errno("mlx5dv_create_qp"));
    }
    // SAFETY: all-zero is a valid Mlx5dvQp.
    let mut out: Mlx5dvQp = unsafe { core::mem::zeroed() };
    let mut obj = empty_obj();
    obj.qp = ObjPair {
        input: qp,
        output: &mut out,
    };
    // SAFETY: live mlx5 QP; `out` is writable.
    let r = unsafe { mlx5dv_init_obj(&mut obj, MLX5DV_OBJ_QP) };
    if let Err(e) = check("mlx5dv_init_obj(qp)", r) {
        // SAFETY: the QP just created, unused.
        unsafe { sys::ibv_destroy_qp(qp) };
        return Err(e);
    }
    if out.sq_stride != 64 || out.sq_wqe_cnt == 0 {
        // SAFETY: as above.
        unsafe { sys::ibv_destroy_qp(qp) };
        return Err(Error::InvalidGeometry);
    }
    Ok((qp, out, ia.cap, td))
}
