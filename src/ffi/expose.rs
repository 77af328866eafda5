//! Least-privilege, revocable exposure of memory to peers, from C (the
//! C side of [`crate::expose`]; features `ffi` + `soft`).
//!
//! # Use
//!
//! ```c
//! rdd_mr *mr;                       // registered with RDD_ACCESS_MW_BIND
//! rdd_mr_reg(pd, len, RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_MW_BIND, &mr);
//! rdd_exposure *e;
//! // A window bound on the peer's QP where the device has them (rxe),
//! // else a registration of its own; one BIND_MW WR is posted for a window.
//! rdd_mr_expose_to(mr, qp, 7, RDD_SEND_SIGNALED, 0, 4096, RDD_REMOTE_READ, &e);
//! rdd_exposure_info info;
//! rdd_exposure_get_info(e, &info);  // info.addr, info.rkey go to the peer
//! ...
//! int posted;
//! rdd_exposure_invalidate(e, qp, 8, RDD_SEND_SIGNALED, &posted); // fast revocation
//! rdd_exposure_free(e);             // revokes whatever is left
//! ```
//!
//! # Rules
//!
//! - An exposure grants only `RDD_REMOTE_READ`, `RDD_REMOTE_WRITE`,
//!   `RDD_REMOTE_READ_WRITE` or `RDD_REMOTE_ATOMIC` on its range, under a
//!   key of its own; the region needs no remote access itself.
//! - `rdd_mr_expose` always makes a registration of its own;
//!   `rdd_mr_expose_to` makes a type-2 memory window bound on `qp` (only
//!   requests arriving on that QP pass) where the device and data path have
//!   windows and the region was registered with `RDD_ACCESS_MW_BIND` (and
//!   `RDD_ACCESS_LOCAL_WRITE` for rights that write), else it falls back to
//!   a registration and posts nothing. `rdd_exposure_info.is_window` says
//!   which.
//! - Revocation: `rdd_exposure_revoke` / `rdd_exposure_free` at once
//!   (deregistration or window deallocation, one system call, no WR);
//!   `rdd_exposure_invalidate` for a window posts a LOCAL_INV WR on its QP
//!   (no system call on the direct data path; `*out_posted` = 1, and a
//!   completion comes if asked); `rdd_exposure_rebind` binds an invalidated
//!   window again under a fresh key.
//! - An exposure holds its region: `rdd_mr_free` is `RESOURCE_BUSY` until
//!   every exposure of it is freed. Threading: every call here is an
//!   exclusive use of the exposure (and of the QP it posts on).

use core::mem::size_of;
use std::boxed::Box;
use std::sync::Arc;

use static_assertions::const_assert_eq;

use crate::api::{Backend, MrKeys};
use crate::expose::{bind_op, window_fits, RemoteAccess};
use crate::ffi::object::{
    as_handle, excl, h, insert, post_library_wr, put, rdd_mr, rdd_qp, shared, MrObj, Object,
    KIND_EXPOSURE,
};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::RDD_SEND_INLINE;
use crate::wr::{SendFlags, SendOp, SendWr};

/// A range of a region exposed to one peer (opaque handle):
/// `rdd_mr_expose` / `rdd_mr_expose_to`, `rdd_exposure_free`.
pub struct rdd_exposure {
    _private: [u8; 0],
}

/// Rights of an exposure: RDMA READ only.
pub const RDD_REMOTE_READ: u32 = 1;
/// Rights of an exposure: RDMA WRITE only.
pub const RDD_REMOTE_WRITE: u32 = 2;
/// Rights of an exposure: RDMA READ and WRITE.
pub const RDD_REMOTE_READ_WRITE: u32 = 3;
/// Rights of an exposure: atomics (and READ).
pub const RDD_REMOTE_ATOMIC: u32 = 4;

/// What `rdd_exposure_get_info` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_exposure_info {
    /// The peer's address of the first exposed byte.
    pub addr: u64,
    /// Exposed bytes.
    pub len: u64,
    /// The key to give the peer (stale once revoked or invalidated).
    pub rkey: u32,
    /// 1 for a type-2 memory window, 0 for a registration of its own.
    pub is_window: u8,
    /// 1 once revoked, or (a window) invalidated and not bound again.
    pub revoked: u8,
    /// `RDD_REMOTE_*`.
    pub rights: u8,
    /// Zero.
    pub reserved: u8,
}

const_assert_eq!(size_of::<rdd_exposure_info>(), 24);

/// How the key was made (as `expose::Exposure`'s).
enum Key {
    Registered(MrKeys),
    Window { rkey: u32, bound: bool },
    Revoked,
}

struct ExposureObj {
    backend: Arc<dyn Backend>,
    addr: u64,
    len: u64,
    mr_lkey: u32,
    rights: u32,
    access: RemoteAccess,
    key: Key,
    rkey: u32,
    window: bool,
    pd_link: Arc<()>,
    _mr_link: Arc<()>,
}

impl ExposureObj {
    fn revoke(&mut self) -> Result<(), rdd_status> {
        let r = match core::mem::replace(&mut self.key, Key::Revoked) {
            Key::Registered(k) => self.backend.dereg_mr(k.lkey),
            Key::Window { rkey, .. } => self.backend.dealloc_mw(rkey),
            Key::Revoked => Ok(()),
        };
        r.map_err(rdd_status::from)
    }

    /// Posts BIND_MW for an allocated, unbound window.
    fn bind(&mut self, qp: usize, wr_id: u64, flags: SendFlags) -> Result<(), rdd_status> {
        let rkey = match self.key {
            _ if !self.window => return Err(rdd_status::Unsupported),
            Key::Window { rkey, bound: false } => rkey,
            Key::Window { bound: true, .. } => return Err(rdd_status::ResourceBusy),
            _ => return Err(rdd_status::InvalidArgument),
        };
        let (op, new_rkey) = bind_op(self.addr, self.len, self.mr_lkey, rkey, self.access);
        post_library_wr(qp, &self.pd_link, &SendWr::new(wr_id, op, &[], flags))?;
        self.key = Key::Window {
            rkey: new_rkey,
            bound: true,
        };
        self.rkey = new_rkey;
        Ok(())
    }
}

impl Drop for ExposureObj {
    fn drop(&mut self) {
        let _ = self.revoke();
    }
}

// SAFETY: this kind value is used by this type only.
unsafe impl Object for ExposureObj {
    const KIND: u8 = KIND_EXPOSURE;
}

fn rights_from(r: u32) -> Result<RemoteAccess, rdd_status> {
    Ok(match r {
        RDD_REMOTE_READ => RemoteAccess::Read,
        RDD_REMOTE_WRITE => RemoteAccess::Write,
        RDD_REMOTE_READ_WRITE => RemoteAccess::ReadWrite,
        RDD_REMOTE_ATOMIC => RemoteAccess::Atomic,
        _ => return Err(rdd_status::InvalidArgument),
    })
}

fn flags_from(f: u32) -> Result<SendFlags, rdd_status> {
    if f & !SendFlags::ALL.0 != 0 || f & RDD_SEND_INLINE != 0 {
        return Err(rdd_status::InvalidFlags);
    }
    Ok(SendFlags(f))
}

/// The exposure of `offset..offset+len` of `m` with `rights`, unbound.
fn new_obj(m: &MrObj, offset: usize, len: usize, rights: u32) -> Result<ExposureObj, rdd_status> {
    let access = rights_from(rights)?;
    let end = offset.checked_add(len).ok_or(rdd_status::InvalidArgument)?;
    if len == 0 || end > m.len {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(ExposureObj {
        backend: Arc::clone(&m.backend),
        addr: m.addr() + offset as u64,
        len: len as u64,
        mr_lkey: m.keys.lkey,
        rights,
        access,
        key: Key::Revoked,
        rkey: 0,
        window: false,
        pd_link: Arc::clone(&m.pd_link),
        _mr_link: Arc::clone(&m.link),
    })
}

/// Registers the exposure's range once more with only its rights.
fn register(m: &MrObj, e: &mut ExposureObj) -> Result<(), rdd_status> {
    // SAFETY: the range lies inside the region's buffer (checked in
    // `new_obj`), which the exposure holds through `_mr_link`
    // (`rdd_mr_free` refuses while it exists); the exposure deregisters
    // before it lets go of the region (Drop, then fields).
    let keys = unsafe { m.backend.reg_mr(m.pd, e.addr, e.len, e.access.flags()) }
        .map_err(rdd_status::from)?;
    e.key = Key::Registered(keys);
    e.rkey = keys.rkey;
    Ok(())
}

fn publish(e: ExposureObj, out: *mut *mut rdd_exposure) -> rdd_status {
    let handle = try_status!(insert(Box::new(e)));
    // SAFETY: non-NULL (checked by the caller), writable (caller contract).
    unsafe { put(out, as_handle(handle)) };
    rdd_status::Ok
}

/// Exposes `len` bytes at `offset` of `mr` with only `rights`
/// (`RDD_REMOTE_*`) under a registration of its own (every device).
///
/// Errors: `INVALID_ARGUMENT` (empty range, outside the region, unknown
/// rights), the device's registration errors.
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_expose(
    mr: *mut rdd_mr,
    offset: usize,
    len: usize,
    rights: u32,
    out: *mut *mut rdd_exposure,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let m = try_status!(shared::<MrObj>(h(mr)));
        let mut e = try_status!(new_obj(&m, offset, len, rights));
        try_status!(register(&m, &mut e));
        publish(e, out)
    })
}

/// Exposes `len` bytes at `offset` of `mr` with only `rights` to the peer
/// of `qp` only, through a type-2 memory window bound on `qp` (one BIND_MW
/// work request with `wr_id` and `send_flags`; its completion, opcode
/// `IBV_WC_BIND_MW` = 5, comes if `RDD_SEND_SIGNALED` asks). Falls back to
/// `rdd_mr_expose` (nothing posted) where windows cannot be used; see the
/// module rules. Hand out the key once the bind has completed.
///
/// Errors: as `rdd_mr_expose`; `INVALID_ARGUMENT` for a QP of another PD;
/// `INVALID_FLAGS`; the post's errors (the window is released again).
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rdd_mr_expose_to(
    mr: *mut rdd_mr,
    qp: *mut rdd_qp,
    wr_id: u64,
    send_flags: u32,
    offset: usize,
    len: usize,
    rights: u32,
    out: *mut *mut rdd_exposure,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let flags = try_status!(flags_from(send_flags));
        let m = try_status!(shared::<MrObj>(h(mr)));
        let mut e = try_status!(new_obj(&m, offset, len, rights));
        if window_fits(m.access, e.access) {
            match m.backend.alloc_mw(m.pd) {
                Ok(rkey) => {
                    e.key = Key::Window { rkey, bound: false };
                    e.rkey = rkey;
                    e.window = true;
                    // On error, dropping `e` deallocates the window.
                    try_status!(e.bind(h(qp), wr_id, flags));
                    return publish(e, out);
                }
                Err(crate::Error::Unsupported) => {}
                Err(err) => return err.into(),
            }
        }
        try_status!(register(&m, &mut e));
        publish(e, out)
    })
}

/// What the exposure is now: address, length and key for the peer,
/// whether it is a window, whether it is revoked.
///
/// # Safety
/// `out` is valid for a write of one `rdd_exposure_info`.
#[no_mangle]
pub unsafe extern "C" fn rdd_exposure_get_info(
    e: *const rdd_exposure,
    out: *mut rdd_exposure_info,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let x = try_status!(shared::<ExposureObj>(h(e)));
        let info = rdd_exposure_info {
            addr: x.addr,
            len: x.len,
            rkey: x.rkey,
            is_window: u8::from(x.window),
            revoked: u8::from(matches!(
                x.key,
                Key::Revoked | Key::Window { bound: false, .. }
            )),
            rights: x.rights as u8,
            reserved: 0,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, info) };
        rdd_status::Ok
    })
}

/// The fast revocation of a window: posts LOCAL_INV for its key on `qp`
/// (the QP it was bound on) with `wr_id` and `send_flags`, and sets
/// `*out_posted` to 1. A registration is revoked at once instead
/// (`*out_posted` = 0, no completion will come); an already revoked or
/// invalidated exposure: 0, nothing done. A window whose QP is not in RTS
/// is revoked at once too (a LOCAL_INV there would be flushed, and the
/// window would stay bound to the QP across a RESET). If the QP fails
/// after the WR was posted, the key stays bound: `rdd_exposure_revoke`
/// then.
///
/// # Safety
/// `out_posted` is valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_exposure_invalidate(
    e: *mut rdd_exposure,
    qp: *mut rdd_qp,
    wr_id: u64,
    send_flags: u32,
    out_posted: *mut i32,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_posted);
        let flags = try_status!(flags_from(send_flags));
        let mut x = try_status!(excl::<ExposureObj>(h(e)));
        let posted = match x.key {
            Key::Window { rkey, bound: true } => {
                let wr = SendWr::new(wr_id, SendOp::LocalInv { rkey }, &[], flags);
                match post_library_wr(h(qp), &x.pd_link, &wr) {
                    Ok(()) => {
                        x.key = Key::Window { rkey, bound: false };
                        1
                    }
                    // Not in RTS: the WR would be flushed, not executed.
                    Err(rdd_status::InvalidQpState) => {
                        try_status!(x.revoke());
                        0
                    }
                    Err(s) => return s,
                }
            }
            Key::Registered(_) => {
                try_status!(x.revoke());
                0
            }
            Key::Window { bound: false, .. } | Key::Revoked => 0,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_posted, posted) };
        rdd_status::Ok
    })
}

/// Binds an invalidated window again, to the same range and rights, under
/// a fresh key (one BIND_MW on `qp`). `UNSUPPORTED` for a registration,
/// `RESOURCE_BUSY` while bound, `INVALID_ARGUMENT` once revoked.
#[no_mangle]
pub extern "C" fn rdd_exposure_rebind(
    e: *mut rdd_exposure,
    qp: *mut rdd_qp,
    wr_id: u64,
    send_flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let flags = try_status!(flags_from(send_flags));
        let mut x = try_status!(excl::<ExposureObj>(h(e)));
        try_status!(x.bind(h(qp), wr_id, flags));
        rdd_status::Ok
    })
}

/// Revokes at once (deregistration or window deallocation; no WR, no
/// completion). The handle stays valid (its info says revoked) until
/// `rdd_exposure_free`. Idempotent.
#[no_mangle]
pub extern "C" fn rdd_exposure_revoke(e: *mut rdd_exposure) -> rdd_status {
    ffi_boundary!({
        let mut x = try_status!(excl::<ExposureObj>(h(e)));
        try_status!(x.revoke());
        rdd_status::Ok
    })
}

/// Revokes what is left and frees the handle.
#[no_mangle]
pub extern "C" fn rdd_exposure_free(e: *mut rdd_exposure) -> rdd_status {
    ffi_boundary!({
        let mut x = try_status!(excl::<ExposureObj>(h(e)));
        let r = x.revoke();
        x.destroy();
        match r {
            Ok(()) => rdd_status::Ok,
            Err(s) => s,
        }
    })
}
