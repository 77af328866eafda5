//! The receive-queue calls: init, fini, post.

use core::ptr::NonNull;

use super::check_array;
use super::desc::{rdd_mlx5dv_qp, rdd_qp_caps};
use super::storage::rdd_mlx5_rq_storage;
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_recv, rdd_recv_wr};
use crate::provider::mlx5::RecvQueue;
use crate::wr::RecvWr;

// ---------------------------------------------------------------------
// Receive queue
// ---------------------------------------------------------------------

/// Initialises a receive-queue handle in `rq` over the RQ half of `qp`.
/// `wrid` is a table of at least `qp->rq_wqe_cnt` ids used for the
/// handle's whole life. Same storage and error rules as
/// `rdd_mlx5_sq_init`.
///
/// # Safety
/// - `rq` is valid for writes of one `rdd_mlx5_rq_storage`; `qp` and
///   `caps` are valid for reads.
/// - The RQ ring, the doorbell record's RQ word and `wrid[0..wrid_len]`
///   stay valid and are written by no one else until `rdd_mlx5_rq_fini`.
/// - Every SGE posted later names memory the device may write until the
///   receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_init(
    rq: *mut rdd_mlx5_rq_storage,
    qp: *const rdd_mlx5dv_qp,
    caps: *const rdd_qp_caps,
    wrid: *mut u64,
    wrid_len: usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(rq, qp, caps);
        try_status!(check_array(wrid.cast_const(), wrid_len));
        // SAFETY: non-NULL and readable (caller contract).
        let (qp, caps) = unsafe { (qp.read_unaligned(), caps.read_unaligned()) };
        let Some(wrid) = NonNull::new(wrid) else {
            return rdd_status::NullParameter;
        };
        // SAFETY: the memory contract is the caller's (see `# Safety`).
        let queue =
            match unsafe { RecvQueue::from_raw(&qp.to_core(), &caps.to_core(), wrid, wrid_len) } {
                Ok(q) => q,
                Err(e) => return e.into(),
            };
        // SAFETY: `rq` is non-NULL and valid for writes (caller contract).
        try_status!(unsafe { handle::install(rq, queue) });
        rdd_status::Ok
    })
}

/// Finalises a receive-queue handle (see `rdd_mlx5_sq_fini`).
///
/// # Safety
/// `rq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_rq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_fini(rq: *mut rdd_mlx5_rq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(rq) });
        rdd_status::Ok
    })
}

/// Posts receive work requests `wrs[0..n]` and publishes them in the
/// doorbell record (receives have no MMIO doorbell) before returning.
///
/// Stops at the first rejected request with the same rules as
/// `rdd_mlx5_sq_post` (including when `*out_bad_index` is written): the
/// ones before it are posted *and published*, and the queue is otherwise
/// untouched.
///
/// # Safety
/// - `rq` as for `rdd_mlx5_rq_fini`; `wrs` points to `n` readable
///   `rdd_recv_wr`; `out_bad_index` is valid for a write.
/// - Each `sg_list` points to `num_sge` readable entries naming memory the
///   device may write until the receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_post(
    rq: *mut rdd_mlx5_rq_storage,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        // SAFETY: caller contract on `rq`.
        let queue = try_status!(unsafe { handle::get(rq) });
        // SAFETY: `RecvQueue::post`'s contract is the caller's (the SGEs name
        // memory the device may write until the receive completes).
        let post = |w: &RecvWr<'_>| unsafe { queue.post(w) };
        // SAFETY: caller contract.
        let result = match unsafe { post_recv_each(wrs, n, out_bad_index, post) } {
            Ok(st) => st,
            Err(st) => return st,
        };
        queue.ring();
        result
    })
}

/// The body of the receive-array posts (`rdd_mlx5_rq_post`,
/// `rdd_mlx5_srq_post`) once the handle is checked: the array checks, then
/// each request translated and handed to `post` until one is refused.
/// `Err(status)`: the array itself was refused, nothing was posted (the
/// caller returns at once); `Ok(status)`: the requests before the first
/// refused one (all, on `OK`) were posted, and the caller publishes them.
/// `*out_bad_index` is written as `rdd_mlx5_rq_post` documents.
///
/// # Safety
/// `wrs` points to `n` readable requests whose SGE lists satisfy
/// [`parse_recv`]; `out_bad_index` is non-NULL and valid for a write;
/// `post`'s own contract holds for every request (caller contract).
#[inline(always)]
pub(super) unsafe fn post_recv_each(
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
    mut post: impl FnMut(&RecvWr<'_>) -> crate::error::Result<()>,
) -> Result<rdd_status, rdd_status> {
    if wrs.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if let Err(status) = check_array(wrs, n) {
        // SAFETY: non-NULL, valid for a write (contract).
        unsafe { out_bad_index.write_unaligned(0) };
        return Err(status);
    }
    for i in 0..n {
        // SAFETY: `wrs` is non-NULL, aligned, with `n` readable requests
        // (checked / caller contract).
        let wr = unsafe { &*wrs.add(i) };
        // SAFETY: SGE contract forwarded from the caller.
        let posted = match unsafe { parse_recv(wr) } {
            Ok(rwr) => post(&rwr).map_err(rdd_status::from),
            Err(s) => Err(s),
        };
        if let Err(status) = posted {
            // SAFETY: non-NULL, valid for a write (contract).
            unsafe { out_bad_index.write_unaligned(i) };
            return Ok(status);
        }
    }
    Ok(rdd_status::Ok)
}
