//! Bursts of one-SGE RDMA operations: an array of small per-operation
//! descriptors (`rdd_rdma_op`) posted in one call with one doorbell, in
//! the style of a DPDK transmit burst.
//!
//! The encoder reads each descriptor's fields directly: the opcode is a
//! constant of the exported function, the payload is one SGE, so the
//! typed [`SendWr`] built for each descriptor folds into the same code a
//! typed Rust caller of [`SendQueue::batch`] gets, and no `rdd_wr` is
//! translated. One handle check per call, not per operation.
//!
//! Rules: those of the per-opcode call of the same opcode for each
//! descriptor (`rdd_mlx5_sq_write`, `rdd_mlx5_sq_read`), and the bytes
//! written are the same (`ffi-tests/test_raw_burst.c`).

use static_assertions::const_assert_eq;

use super::check_array;
use super::storage::rdd_mlx5_sq_storage;
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{
    RDD_SEND_DEFER_DOORBELL, RDD_SEND_FENCE, RDD_SEND_SIGNALED, RDD_SEND_SOLICITED,
};
use crate::provider::mlx5::SendQueue;
use crate::wr::{Remote, SendFlags, SendOp, SendWr, Sge};

/// One one-SGE RDMA operation of a burst (`rdd_mlx5_sq_write_burst`,
/// `rdd_mlx5_sq_read_burst`): 40 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_rdma_op {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local buffer address (registered memory, key `lkey`).
    pub laddr: u64,
    /// Remote buffer address (key `rkey`).
    pub raddr: u64,
    /// Bytes to transfer; 0 is allowed (the WQE has no data segment).
    pub length: u32,
    /// Local key of `laddr`.
    pub lkey: u32,
    /// Remote key of `raddr`.
    pub rkey: u32,
    /// `RDD_SEND_FENCE`, `RDD_SEND_SIGNALED`, `RDD_SEND_SOLICITED`; and
    /// `RDD_SEND_DEFER_DOORBELL`, which counts on the last operation only
    /// (the burst then leaves its WQEs pending for a later doorbell).
    pub flags: u32,
}

const_assert_eq!(core::mem::size_of::<rdd_rdma_op>(), 40);

/// The flags a burst operation accepts.
const OP_FLAGS: u32 =
    RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_DEFER_DOORBELL;

/// The typed WR of one descriptor, for the opcode `op` builds.
#[inline(always)]
fn wr_of<'a>(o: &rdd_rdma_op, sges: &'a [Sge; 1], op: SendOp) -> SendWr<'a> {
    let flags = SendFlags(o.flags & (RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED));
    SendWr::new(o.wr_id, op, sges, flags)
}

/// The body both exports share.
///
/// # Safety
/// As for [`rdd_mlx5_sq_write_burst`].
#[inline(always)]
unsafe fn burst(
    sq: *mut rdd_mlx5_sq_storage,
    ops: *const rdd_rdma_op,
    n: u32,
    out_posted: *mut u32,
    op_of: impl Fn(&rdd_rdma_op) -> SendOp,
) -> rdd_status {
    if n != 1 {
        // Out of line (a tail call), so that the one-operation path below
        // is a leaf function with no frame.
        // SAFETY: forwarded contract.
        return unsafe { burst_n(sq, ops, n, out_posted, &op_of) };
    }
    // SAFETY: caller contract.
    let queue: &mut SendQueue = try_status!(unsafe { handle::get(sq) });
    // `check_array` for one element, as two plain tests.
    if ops.is_null() {
        return rdd_status::NullParameter;
    }
    if ops as usize % core::mem::align_of::<rdd_rdma_op>() != 0 {
        return rdd_status::InvalidArgument;
    }
    // One operation: the queue's one-WQE path (post and ring).
    // SAFETY: non-NULL, aligned, readable (checked / caller contract).
    let o = unsafe { &*ops };
    let status = if o.flags & !OP_FLAGS != 0 {
        rdd_status::InvalidFlags
    } else {
        let sges = [Sge::new(o.laddr, o.length, o.lkey)];
        let wr = wr_of(o, &sges, op_of(o));
        // SAFETY: the caller's contract on the SGE's memory.
        let posted = unsafe {
            if o.flags & RDD_SEND_DEFER_DOORBELL != 0 {
                queue.post(&wr)
            } else {
                queue.post_one(&wr)
            }
        };
        match posted {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    };
    let posted = (status == rdd_status::Ok) as u32;
    if posted == 0 {
        // As a refusal in a longer burst: what was pending is rung.
        queue.ring();
    }
    if !out_posted.is_null() {
        // SAFETY: non-NULL, valid for a write (caller contract).
        unsafe { out_posted.write_unaligned(posted) };
    }
    status
}

/// [`burst`] for any `n` but 1, out of line so that the one-operation
/// path stays a leaf with a small frame.
///
/// # Safety
/// As for [`rdd_mlx5_sq_write_burst`].
#[inline(never)]
unsafe fn burst_n(
    sq: *mut rdd_mlx5_sq_storage,
    ops: *const rdd_rdma_op,
    n: u32,
    out_posted: *mut u32,
    op_of: &impl Fn(&rdd_rdma_op) -> SendOp,
) -> rdd_status {
    // SAFETY: caller contract.
    let queue: &mut SendQueue = try_status!(unsafe { handle::get(sq) });
    try_status!(check_array(ops, n as usize));
    // SAFETY: `n` readable descriptors (checked / caller contract).
    let all = unsafe { core::slice::from_raw_parts(ops, n as usize) };
    let mut b = queue.batch();
    let mut status = rdd_status::Ok;
    let mut posted = 0u32;
    for o in all {
        if o.flags & !OP_FLAGS != 0 {
            status = rdd_status::InvalidFlags;
            break;
        }
        let sges = [Sge::new(o.laddr, o.length, o.lkey)];
        let wr = wr_of(o, &sges, op_of(o));
        // SAFETY: the caller's contract on the SGE's memory.
        if let Err(e) = unsafe { b.post(&wr) } {
            status = e.into();
            break;
        }
        posted += 1;
    }
    let defer = status == rdd_status::Ok
        && all
            .last()
            .is_some_and(|o| o.flags & RDD_SEND_DEFER_DOORBELL != 0);
    if defer {
        // The batch's WQEs stay pending (dropping it writes the state back
        // without a doorbell).
        drop(b);
    } else {
        b.ring();
    }
    if !out_posted.is_null() {
        // SAFETY: non-NULL, valid for a write (caller contract).
        unsafe { out_posted.write_unaligned(posted) };
    }
    status
}

/// Posts `n` RDMA WRITEs, one per descriptor of `ops[0..n]`, and rings
/// the doorbell once for them and every WQE still pending: the batch form
/// of `rdd_mlx5_sq_write` (its rules and its bytes for each descriptor),
/// with one handle check per call. `n` = 1 takes the queue's one-WQE path
/// (`ibv_post_send` of one WR); `n` = 0 posts nothing and rings what is
/// pending.
///
/// Stops at the first refused descriptor: those before it are written
/// *and rung*, it and those after it are not, and the queue is exactly as
/// if it had never been passed. Unless `RDD_SEND_DEFER_DOORBELL` is set
/// on the last descriptor (and all were posted), which leaves the WQEs
/// pending for a later call or `rdd_mlx5_sq_ring`; the bit is ignored on
/// the other descriptors. A refused first descriptor (any `n`) rings
/// what was pending before the call; the per-opcode calls leave it
/// pending instead.
///
/// `*out_posted` (if `out_posted` is not NULL) receives the number of
/// descriptors posted, on every status but `NULL_PARAMETER`,
/// `INVALID_HANDLE` and `INVALID_ARGUMENT`; it is the index of the
/// refused one when the status is a per-descriptor one.
///
/// Statuses: `OK`; `NULL_PARAMETER` (`sq` or `ops` NULL); `INVALID_HANDLE`
/// (`sq` is not a live handle); `INVALID_ARGUMENT` (`ops` misaligned);
/// per descriptor: `INVALID_FLAGS` (a bit outside `RDD_SEND_FENCE`,
/// `RDD_SEND_SIGNALED`, `RDD_SEND_SOLICITED`, `RDD_SEND_DEFER_DOORBELL`),
/// `TOO_MANY_SGES` (the queue has `max_send_sge` 0), `LENGTH_OVERFLOW`
/// (`length` of 2^31 or more), `SQ_FULL`, `INVALID_QP_STATE`.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `ops` points to `n` readable
/// descriptors; `out_posted` is NULL or valid for a write; each
/// descriptor's local buffer is registered memory the device may read
/// until the operation completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_write_burst(
    sq: *mut rdd_mlx5_sq_storage,
    ops: *const rdd_rdma_op,
    n: u32,
    out_posted: *mut u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        unsafe {
            burst(sq, ops, n, out_posted, |o| SendOp::Write {
                remote: Remote::new(o.raddr, o.rkey),
            })
        }
    })
}

/// Posts `n` RDMA READs (remote `raddr`/`rkey` into local
/// `laddr`/`lkey`), one per descriptor of `ops[0..n]`, with one doorbell:
/// the batch form of `rdd_mlx5_sq_read`, with the rules, statuses and
/// `*out_posted` of `rdd_mlx5_sq_write_burst`.
///
/// # Safety
/// As for `rdd_mlx5_sq_write_burst`, and each local buffer is memory the
/// device may write until the operation completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_read_burst(
    sq: *mut rdd_mlx5_sq_storage,
    ops: *const rdd_rdma_op,
    n: u32,
    out_posted: *mut u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        unsafe {
            burst(sq, ops, n, out_posted, |o| SendOp::Read {
                remote: Remote::new(o.raddr, o.rkey),
            })
        }
    })
}
