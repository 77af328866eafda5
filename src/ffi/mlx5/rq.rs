//! The receive-queue calls: init, fini, post.

use core::ptr::NonNull;

use super::check_array;
use super::desc::{rdd_mlx5dv_qp, rdd_qp_caps};
use super::storage::rdd_mlx5_rq_storage;
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_recv, rdd_recv_wr};
use crate::provider::mlx5::RecvQueue;

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
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), valid for a write (contract).
            unsafe { out_bad_index.write_unaligned(0) };
            return status;
        }
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned, with `n` readable
            // requests (checked / caller contract).
            let wr = unsafe { &*wrs.add(i) };
            // SAFETY: SGE contract forwarded from the caller.
            let posted = match unsafe { parse_recv(wr) } {
                // SAFETY: posting contract forwarded from the caller.
                Ok(rwr) => unsafe { queue.post(&rwr) }.map_err(rdd_status::from),
                Err(s) => Err(s),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), valid for a write (contract).
                unsafe { out_bad_index.write_unaligned(i) };
                result = status;
                break;
            }
        }
        queue.ring();
        result
    })
}
