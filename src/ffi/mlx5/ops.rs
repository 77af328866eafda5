//! Per-opcode raw posts: one exported function per common operation,
//! taking scalars instead of an `rdd_wr`.
//!
//! Each function builds its typed [`SendWr`] (or [`RecvWr`]) from a
//! constant opcode and its arguments, inside an `#[inline(always)]` path
//! down to the encoder, exactly as a typed Rust caller of
//! [`SendQueue::post_one`] does: the compiler sees the opcode and the
//! one-SGE (or one-piece inline) payload, so the validation and the
//! encoder's shape dispatch (`by_shape!` in `provider::mlx5::sq`) fold
//! away, and no `rdd_wr` is read or translated at run time. The rules are
//! those of `rdd_mlx5_sq_post` for the equivalent `rdd_wr`, and the bytes
//! written are identical (`ffi-tests/test_raw_ops.c`, the `raw_ops` fuzz
//! target).
//!
//! The doorbell: a call without [`RDD_SEND_DEFER_DOORBELL`] rings it after
//! writing its WQE, covering every WQE still pending (one call is
//! `ibv_post_send` of one WR); with the bit the WQE waits for a later call
//! without it or for `rdd_mlx5_sq_ring` (a batch: N-1 deferred calls, then
//! one that rings, as `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`).

use core::ffi::c_void;
use core::slice;

use static_assertions::const_assert_eq;

use super::storage::{rdd_mlx5_rq_storage, rdd_mlx5_sq_storage};
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{RDD_SEND_FENCE, RDD_SEND_INLINE, RDD_SEND_SIGNALED, RDD_SEND_SOLICITED};
use crate::provider::mlx5::{RecvQueue, SendQueue};
use crate::wr::{RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

pub use crate::ffi::wr::RDD_SEND_DEFER_DOORBELL;

const_assert_eq!(RDD_SEND_DEFER_DOORBELL & SendFlags::ALL.0, 0);

/// The flags a per-opcode send with SGE payload accepts.
const SGE_FLAGS: u32 =
    RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_DEFER_DOORBELL;
/// The flags an inline send accepts (`RDD_SEND_INLINE` is implied there,
/// and allowed).
const INLINE_FLAGS: u32 = SGE_FLAGS | RDD_SEND_INLINE;

/// The handle and flag checks of a per-opcode send: `NULL_PARAMETER` and
/// `INVALID_HANDLE` for `sq`, then `INVALID_FLAGS` for any bit outside
/// `allowed`.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`.
#[inline(always)]
unsafe fn send_args<'a>(
    sq: *mut rdd_mlx5_sq_storage,
    flags: u32,
    allowed: u32,
) -> Result<&'a mut SendQueue, rdd_status> {
    // SAFETY: caller contract.
    let queue = unsafe { handle::get(sq) }?;
    if flags & !allowed != 0 {
        return Err(invalid_flags());
    }
    Ok(queue)
}

/// `INVALID_FLAGS`, from a call the compiler keeps out of line, so the
/// status is not loaded into the return register ahead of the flag test on
/// the path that passes (2 instructions off every per-opcode post,
/// docs/benchmarks.md).
#[cold]
#[inline(never)]
fn invalid_flags() -> rdd_status {
    rdd_status::InvalidFlags
}

/// The typed send flags of a per-opcode `flags` word (FENCE, SIGNALED,
/// SOLICITED; the payload kind and the doorbell bit are not WR flags).
#[inline(always)]
const fn wr_flags(flags: u32) -> SendFlags {
    SendFlags(flags & (RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED))
}

/// Writes `wr` and, unless `flags` defers it, rings the doorbell for it and
/// every pending WQE. A refused WR writes nothing and rings nothing.
///
/// # Safety
/// The posting contract of [`SendQueue::post`] for `wr`.
#[inline(always)]
unsafe fn submit(queue: &mut SendQueue, wr: &SendWr<'_>, flags: u32) -> rdd_status {
    let posted = if flags & RDD_SEND_DEFER_DOORBELL != 0 {
        // SAFETY: forwarded contract.
        unsafe { queue.post(wr) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { queue.post_one(wr) }
    };
    match posted {
        Ok(()) => rdd_status::Ok,
        Err(e) => e.into(),
    }
}

/// One send with a single SGE: the body every SGE-payload export shares.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; the SGE names memory the device may
/// access as `op` requires until the WR completes.
#[inline(always)]
unsafe fn send_sge(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    op: SendOp,
    sge: Sge,
    flags: u32,
) -> rdd_status {
    // SAFETY: caller contract.
    let queue = try_status!(unsafe { send_args(sq, flags, SGE_FLAGS) });
    let sges = [sge];
    let wr = SendWr::new(wr_id, op, &sges, wr_flags(flags));
    // SAFETY: caller contract on the SGE.
    unsafe { submit(queue, &wr, flags) }
}

/// One send whose payload is copied into the WQE.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `data` is NULL or points to `length`
/// readable bytes outside the send ring.
/// The payload `data[0..length]` of a per-opcode inline send, with the
/// rules of an `rdd_wr` inline piece (`ffi::wr::parse_send`): a zero length
/// is an empty payload whatever `data` is; otherwise a NULL `data` is
/// `NULL_POINTER` and a length above `isize::MAX` `INVALID_ARGUMENT`.
///
/// # Safety
/// `data` is NULL or points to `length` readable bytes that live for `'a`.
#[inline(always)]
pub(super) unsafe fn inline_piece<'a>(
    data: *const c_void,
    length: u32,
) -> Result<&'a [u8], rdd_status> {
    if length == 0 {
        Ok(&[])
    } else if data.is_null() {
        Err(rdd_status::NullPointer)
    } else if length as usize > isize::MAX as usize {
        Err(rdd_status::InvalidArgument)
    } else {
        // SAFETY: non-NULL, `length` readable bytes (caller contract),
        // `length <= isize::MAX`; a byte slice needs no alignment.
        Ok(unsafe { slice::from_raw_parts(data.cast::<u8>(), length as usize) })
    }
}

#[inline(always)]
unsafe fn send_inline(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    op: SendOp,
    data: *const c_void,
    length: u32,
    flags: u32,
) -> rdd_status {
    // SAFETY: caller contract.
    let queue = try_status!(unsafe { send_args(sq, flags, INLINE_FLAGS) });
    // SAFETY: caller contract on `data`.
    let piece = try_status!(unsafe { inline_piece(data, length) });
    let pieces = [piece];
    let wr = SendWr::inline(wr_id, op, &pieces, wr_flags(flags));
    // SAFETY: an inline WR names no memory the device accesses; the
    // payload is outside the ring (caller contract).
    unsafe { submit(queue, &wr, flags) }
}

// ---------------------------------------------------------------------
// Per-opcode sends
// ---------------------------------------------------------------------

/// RDMA WRITE of `length` bytes at `laddr` (key `lkey`) to `raddr` (key
/// `rkey`): one WQE, the equivalent of `rdd_mlx5_sq_post` of an `rdd_wr`
/// with opcode `RDD_WR_RDMA_WRITE` and one SGE, and byte for byte the same
/// WQE. `length` 0 is allowed (a zero-length SGE is skipped, so the WQE
/// has no data segment, as for the `rdd_wr`).
///
/// `flags`: `RDD_SEND_FENCE`, `RDD_SEND_SIGNALED`, `RDD_SEND_SOLICITED`,
/// `RDD_SEND_DEFER_DOORBELL`. Without `RDD_SEND_DEFER_DOORBELL` the call
/// rings the doorbell after writing, for this WQE and every pending one
/// (`ibv_post_send` of one WR); with it the WQE waits for a later call
/// without the bit or `rdd_mlx5_sq_ring` (the batch form: N-1 deferred
/// calls, then one that rings, as `ibv_wr_start` / `ibv_wr_*` /
/// `ibv_wr_complete`).
///
/// A refused request writes nothing (ring, side table, doorbell record and
/// register are exactly as before) and rings nothing: WQEs deferred
/// earlier stay pending. Statuses: `OK`; `NULL_PARAMETER` (`sq` NULL);
/// `INVALID_HANDLE` (`sq` never initialised, finalised, moved or copied,
/// or misaligned); `INVALID_FLAGS` (any other bit, `RDD_SEND_INLINE`
/// included: use `rdd_mlx5_sq_write_inline`); `TOO_MANY_SGES` (the queue
/// was initialised with `max_send_sge` 0); `LENGTH_OVERFLOW` (`length` of
/// 2^31 or more); `SQ_FULL` (no room in the ring: poll the CQ);
/// `INVALID_QP_STATE` (the queue does not accept sends).
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `laddr..laddr+length` is registered
/// memory (`lkey`) the device may read until the request completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_write(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::Write {
            remote: Remote::new(raddr, rkey),
        };
        // SAFETY: caller contract.
        unsafe { send_sge(sq, wr_id, op, Sge::new(laddr, length, lkey), flags) }
    })
}

/// RDMA WRITE with immediate: as `rdd_mlx5_sq_write`, and the responder
/// consumes a receive that completes with `imm` (host order, sent
/// big-endian). Equivalent to an `rdd_wr` with opcode
/// `RDD_WR_RDMA_WRITE_WITH_IMM`. Same flags, statuses and doorbell rules
/// as `rdd_mlx5_sq_write`.
///
/// # Safety
/// As for `rdd_mlx5_sq_write`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_write_imm(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    imm: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::WriteImm {
            remote: Remote::new(raddr, rkey),
            imm,
        };
        // SAFETY: caller contract.
        unsafe { send_sge(sq, wr_id, op, Sge::new(laddr, length, lkey), flags) }
    })
}

/// RDMA READ of `length` bytes at `raddr` (key `rkey`) into `laddr` (key
/// `lkey`). Equivalent to an `rdd_wr` with opcode `RDD_WR_RDMA_READ` and
/// one SGE. Same flags, statuses and doorbell rules as
/// `rdd_mlx5_sq_write`.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `laddr..laddr+length` is registered
/// memory the device may write until the request completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_read(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::Read {
            remote: Remote::new(raddr, rkey),
        };
        // SAFETY: caller contract.
        unsafe { send_sge(sq, wr_id, op, Sge::new(laddr, length, lkey), flags) }
    })
}

/// SEND of `length` bytes at `laddr` (key `lkey`). Equivalent to an
/// `rdd_wr` with opcode `RDD_WR_SEND` and one SGE. Same flags, statuses
/// and doorbell rules as `rdd_mlx5_sq_write`.
///
/// # Safety
/// As for `rdd_mlx5_sq_write`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_send(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        unsafe {
            send_sge(
                sq,
                wr_id,
                SendOp::Send,
                Sge::new(laddr, length, lkey),
                flags,
            )
        }
    })
}

/// SEND with immediate `imm` (host order). Equivalent to an `rdd_wr` with
/// opcode `RDD_WR_SEND_WITH_IMM` and one SGE. Same flags, statuses and
/// doorbell rules as `rdd_mlx5_sq_write`.
///
/// # Safety
/// As for `rdd_mlx5_sq_write`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_send_imm(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    imm: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::SendImm { imm };
        // SAFETY: caller contract.
        unsafe { send_sge(sq, wr_id, op, Sge::new(laddr, length, lkey), flags) }
    })
}

/// RDMA WRITE of `length` bytes copied from `data` into the WQE (no
/// memory key; `data` may be reused as soon as the call returns) to
/// `raddr` (key `rkey`). Equivalent to an `rdd_wr` with opcode
/// `RDD_WR_RDMA_WRITE`, `RDD_SEND_INLINE` and one payload piece.
///
/// `flags` as for `rdd_mlx5_sq_write`, plus `RDD_SEND_INLINE` (implied,
/// allowed). Statuses: those of `rdd_mlx5_sq_write` except
/// `TOO_MANY_SGES`, plus `NULL_POINTER` (`data` NULL with `length` > 0;
/// NULL with 0 is an empty payload), `INLINE_TOO_LARGE` (`length` above
/// the queue's `max_inline_data`), `LENGTH_OVERFLOW` (`length` above
/// 2^31), and on 32-bit targets `INVALID_ARGUMENT` (`length` above
/// `PTRDIFF_MAX`).
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `data` is NULL or points to `length`
/// readable bytes that are not inside the send ring.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_write_inline(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    data: *const c_void,
    length: u32,
    raddr: u64,
    rkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::Write {
            remote: Remote::new(raddr, rkey),
        };
        // SAFETY: caller contract.
        unsafe { send_inline(sq, wr_id, op, data, length, flags) }
    })
}

/// SEND of `length` bytes copied from `data` into the WQE. Equivalent to
/// an `rdd_wr` with opcode `RDD_WR_SEND`, `RDD_SEND_INLINE` and one
/// payload piece. Same flags, statuses and doorbell rules as
/// `rdd_mlx5_sq_write_inline`.
///
/// # Safety
/// As for `rdd_mlx5_sq_write_inline`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_send_inline(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    data: *const c_void,
    length: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        unsafe { send_inline(sq, wr_id, SendOp::Send, data, length, flags) }
    })
}

/// 8-byte atomic FETCH_AND_ADD of `add` at `raddr` (key `rkey`, 8-byte
/// aligned); the original value lands in the 8 bytes at `laddr` (key
/// `lkey`). Equivalent to an `rdd_wr` with opcode
/// `RDD_WR_ATOMIC_FETCH_AND_ADD`, `compare_add` = `add` and one SGE of 8
/// bytes.
///
/// Same flags and doorbell rules as `rdd_mlx5_sq_write`. Statuses: those
/// of `rdd_mlx5_sq_write` except `LENGTH_OVERFLOW`, plus
/// `ATOMIC_UNALIGNED` (`raddr` not a multiple of 8).
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `laddr..laddr+8` is registered memory
/// the device may write until the request completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_fetch_add(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    add: u64,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::FetchAdd {
            remote: Remote::new(raddr, rkey),
            add,
        };
        // SAFETY: caller contract.
        unsafe { send_sge(sq, wr_id, op, Sge::new(laddr, 8, lkey), flags) }
    })
}

/// 8-byte atomic COMPARE_AND_SWAP at `raddr` (key `rkey`, 8-byte
/// aligned): if the remote value equals `compare`, `swap` is stored; the
/// original value lands in the 8 bytes at `laddr` (key `lkey`).
/// Equivalent to an `rdd_wr` with opcode `RDD_WR_ATOMIC_CMP_AND_SWP`,
/// `compare_add` = `compare`, `swap` = `swap` and one SGE of 8 bytes.
/// Same flags, statuses and doorbell rules as `rdd_mlx5_sq_fetch_add`.
///
/// # Safety
/// As for `rdd_mlx5_sq_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_cmp_swap(
    sq: *mut rdd_mlx5_sq_storage,
    wr_id: u64,
    laddr: u64,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    compare: u64,
    swap: u64,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        let op = SendOp::CompareSwap {
            remote: Remote::new(raddr, rkey),
            compare,
            swap,
        };
        // SAFETY: caller contract.
        unsafe { send_sge(sq, wr_id, op, Sge::new(laddr, 8, lkey), flags) }
    })
}

// ---------------------------------------------------------------------
// Receives
// ---------------------------------------------------------------------

/// Posts one receive of up to `length` bytes into `laddr` (key `lkey`):
/// the equivalent of `rdd_mlx5_rq_post` of one `rdd_recv_wr` with one
/// SGE, and byte for byte the same WQE (`length` 0: the entry holds only
/// the terminator, as for a zero-length SGE).
///
/// `flags`: 0 or `RDD_SEND_DEFER_DOORBELL`. Without it the doorbell record
/// is updated before returning, publishing this receive and every pending
/// one; with it the receive waits for a later call without the bit or
/// `rdd_mlx5_rq_ring`.
///
/// A refused request writes nothing and publishes nothing (deferred
/// receives stay pending). Statuses: `OK`; `NULL_PARAMETER` (`rq` NULL);
/// `INVALID_HANDLE` (`rq` not a live handle); `INVALID_FLAGS` (any other
/// bit); `INVALID_QP_STATE` (the queue does not accept receives);
/// `TOO_MANY_SGES` (the queue was initialised with `max_recv_sge` 0);
/// `LENGTH_OVERFLOW` (`length` of 2^31 or more); `RQ_FULL`.
///
/// # Safety
/// `rq` as for `rdd_mlx5_rq_fini`; `laddr..laddr+length` is registered
/// memory the device may write until the receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_recv(
    rq: *mut rdd_mlx5_rq_storage,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue: &mut RecvQueue = try_status!(unsafe { handle::get(rq) });
        if flags & !RDD_SEND_DEFER_DOORBELL != 0 {
            return rdd_status::InvalidFlags;
        }
        let sges = [Sge::new(laddr, length, lkey)];
        let wr = RecvWr { wr_id, sges: &sges };
        // SAFETY: caller contract on the SGE.
        if let Err(e) = unsafe { queue.post(&wr) } {
            return e.into();
        }
        if flags & RDD_SEND_DEFER_DOORBELL == 0 {
            queue.ring();
        }
        rdd_status::Ok
    })
}

/// Publishes every receive posted since the last doorbell-record update
/// (those left pending by `rdd_mlx5_rq_recv` with
/// `RDD_SEND_DEFER_DOORBELL`): a to-device barrier, then the record.
/// Does nothing if nothing is pending. Statuses: `OK`, `NULL_PARAMETER`,
/// `INVALID_HANDLE`.
///
/// # Safety
/// As for `rdd_mlx5_rq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_ring(rq: *mut rdd_mlx5_rq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { handle::get(rq) });
        queue.ring();
        rdd_status::Ok
    })
}
