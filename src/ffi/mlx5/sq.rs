//! The send-queue calls: init, fini, post, post-and-ring, ring.

use core::ptr::NonNull;

use super::check_array;
use super::desc::{rdd_mlx5dv_qp, rdd_qp_caps, sq_config};
use super::shapes::{post_send_wr, post_typed_wr, Post, PostOne, Poster};
use super::storage::{rdd_mlx5_sq_slot, rdd_mlx5_sq_storage};
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{rdd_wr, NO_PIECES};
use crate::provider::mlx5::layout::Mlx5dvQp;
use crate::provider::mlx5::{SendQueue, SqConfig, WrSlot};
use crate::wr::QpCaps;

// ---------------------------------------------------------------------
// Send queue
// ---------------------------------------------------------------------

/// Initialises a send-queue handle in `sq` over the SQ half of `qp`.
///
/// `qpn` is the QP number (24 bits), `caps` the capabilities the QP was
/// created with, `flags` a set of `RDD_MLX5_SQ_*` bits. `wrid` is a side
/// table of at least `qp->sq_wqe_cnt` slots that the handle uses for its
/// whole life. The queue starts in the ready-to-send state with empty
/// counters (the QP's SQ must be unused, as after creation or a reset).
///
/// On success the storage holds a live handle (any handle it held before
/// is forgotten). On failure the storage is not written. Errors:
/// `NULL_PARAMETER`; `INVALID_ARGUMENT` (misaligned `sq` or `wrid`,
/// unknown or contradictory flags); `INVALID_GEOMETRY`, `INVALID_QPN`,
/// `STORAGE_TOO_SMALL` from the queue checks.
///
/// # Safety
/// - `sq` is valid for writes of one `rdd_mlx5_sq_storage`; `qp` and
///   `caps` are valid for reads (they are copied; no alignment needed).
/// - The memory `qp` describes (SQ ring, doorbell record, BlueFlame
///   register pair) and `wrid[0..wrid_len]` stay valid, and are written by
///   no one else (the device only reads the ring), until
///   `rdd_mlx5_sq_fini`.
/// - Every SGE posted later names memory the device may access as the
///   operation requires until its completion.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_init(
    sq: *mut rdd_mlx5_sq_storage,
    qp: *const rdd_mlx5dv_qp,
    qpn: u32,
    caps: *const rdd_qp_caps,
    flags: u32,
    wrid: *mut rdd_mlx5_sq_slot,
    wrid_len: usize,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        unsafe {
            init_send_queue(
                sq,
                qp,
                qpn,
                caps,
                flags,
                wrid,
                wrid_len,
                SendQueue::from_raw,
            )
        }
    })
}

/// The constructor of a send queue over mlx5 memory: `SendQueue::from_raw`
/// (RC) or `SendQueue::from_raw_ud`.
pub(super) type MakeSendQueue = unsafe fn(
    &Mlx5dvQp,
    u32,
    QpCaps,
    SqConfig,
    NonNull<WrSlot>,
    usize,
) -> crate::error::Result<SendQueue>;

/// The body of `rdd_mlx5_sq_init` and `rdd_mlx5_sq_init_ud`: the argument
/// checks, the queue built by `make`, the handle installed.
///
/// # Safety
/// The caller contract of `rdd_mlx5_sq_init`, and that of `make`.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn init_send_queue(
    sq: *mut rdd_mlx5_sq_storage,
    qp: *const rdd_mlx5dv_qp,
    qpn: u32,
    caps: *const rdd_qp_caps,
    flags: u32,
    wrid: *mut rdd_mlx5_sq_slot,
    wrid_len: usize,
    make: MakeSendQueue,
) -> rdd_status {
    non_null!(sq, qp, caps);
    try_status!(check_array(wrid.cast_const(), wrid_len));
    let cfg = try_status!(sq_config(flags));
    // SAFETY: non-NULL and readable (caller contract); unaligned reads
    // copy the descriptions without an alignment requirement.
    let (qp, caps) = unsafe { (qp.read_unaligned(), caps.read_unaligned()) };
    let Some(wrid) = NonNull::new(wrid.cast::<WrSlot>()) else {
        return rdd_status::NullParameter;
    };
    // SAFETY: the memory contract of `make` is the caller's (see
    // `rdd_mlx5_sq_init`'s `# Safety`); `rdd_mlx5_sq_slot` has the layout of
    // `WrSlot` (asserted) and the pointer is aligned (checked).
    let queue = match unsafe { make(&qp.to_core(), qpn, caps.to_core(), cfg, wrid, wrid_len) } {
        Ok(q) => q,
        Err(e) => return e.into(),
    };
    // SAFETY: `sq` is non-NULL and valid for writes (caller contract).
    try_status!(unsafe { handle::install(sq, queue) });
    rdd_status::Ok
}

/// Finalises a send-queue handle: the storage is zeroed and any further
/// use returns `INVALID_HANDLE`. WQEs already posted stay in the ring (the
/// QP itself is the caller's to destroy or reset).
///
/// # Safety
/// `sq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_sq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_fini(sq: *mut rdd_mlx5_sq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(sq) });
        rdd_status::Ok
    })
}

/// Writes one WQE per work request of `wrs[0..n]` into the send ring
/// without ringing the doorbell; call `rdd_mlx5_sq_ring` after one or more
/// posts to hand them to the device.
///
/// Stops at the first request that is rejected: the requests before it
/// are written (pending the doorbell), the rejected one and those after it
/// are not, and the queue is exactly as if the rejected one had never been
/// passed; its status is returned (a work-request, queue-state or
/// `INVALID_ARGUMENT` status).
///
/// `*out_bad_index` is written exactly when the status is not `OK`,
/// `NULL_PARAMETER` or `INVALID_HANDLE`: it is the index of the first
/// request that was not posted (0 when the `wrs` array itself is misaligned
/// or too large to address, `INVALID_ARGUMENT`). On `OK` all `n` were
/// posted and it is not written; on `NULL_PARAMETER` and `INVALID_HANDLE`
/// nothing was posted.
///
/// # Safety
/// - `sq` as for `rdd_mlx5_sq_fini`; `wrs` points to `n` readable
///   `rdd_wr`; `out_bad_index` is valid for a write.
/// - Each request's `sg_list` points to `num_sge` readable entries. For
///   RDD_SEND_INLINE their `addr`/`length` are readable payload bytes
///   (copied before return, so they may be reused at once) outside the
///   send ring; otherwise they name registered memory the device may
///   access until the request completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_post(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { send_post_args(sq, wrs, n, out_bad_index) });
        // SAFETY: `wrs` holds `n` readable requests (checked /
        // contract); the SGE, payload and posting contracts are the
        // caller's.
        let failed = unsafe { post_each(wrs, n, Post(queue)) };
        // SAFETY: `out_bad_index` is non-NULL (checked) and writable.
        unsafe { send_post_status(failed, out_bad_index) }
    })
}

/// The argument checks of the send posts: the handle, then `wrs` and
/// `out_bad_index` (a bad `wrs` array writes index 0, as documented).
///
/// # Safety
/// The caller contract of `rdd_mlx5_sq_post`.
#[inline(always)]
unsafe fn send_post_args<'a>(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> Result<&'a mut SendQueue, rdd_status> {
    if out_bad_index.is_null() {
        return Err(rdd_status::NullParameter);
    }
    // SAFETY: caller contract on `sq`.
    let queue = unsafe { handle::get(sq) }?;
    if wrs.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if let Err(status) = check_array(wrs, n) {
        // SAFETY: non-NULL (checked), valid for a write (contract).
        unsafe { out_bad_index.write_unaligned(0) };
        return Err(status);
    }
    Ok(queue)
}

/// Translates `wrs[0..n]` one by one and hands each to `poster`; stops at
/// the first rejected one and returns its index and status.
///
/// # Safety
/// `wrs` points to `n` readable requests; the SGE and payload contract of
/// [`crate::ffi::wr::parse_send`] and the posting contract of
/// [`SendQueue::post`] hold for each.
#[inline(always)]
pub(super) unsafe fn post_each(
    wrs: *const rdd_wr,
    n: usize,
    mut poster: impl Poster,
) -> Option<(usize, rdd_status)> {
    let mut pieces = NO_PIECES;
    for i in 0..n {
        // SAFETY: i < n, inside the caller's array.
        let wr = unsafe { &*wrs.add(i) };
        // SAFETY: forwarded contract. The common shapes take typed paths;
        // the rest, and every rule a request may break, are
        // `parse_send`'s (`shapes`).
        if let Err(status) = unsafe { post_send_wr(wr, &mut pieces, &mut poster) } {
            return Some((i, status));
        }
    }
    None
}

/// The status of a send post, writing the rejected request's index.
///
/// # Safety
/// `out_bad_index` is non-NULL and valid for a write.
#[inline(always)]
pub(super) unsafe fn send_post_status(
    failed: Option<(usize, rdd_status)>,
    out_bad_index: *mut usize,
) -> rdd_status {
    match failed {
        None => rdd_status::Ok,
        Some((i, status)) => {
            // SAFETY: caller contract.
            unsafe { out_bad_index.write_unaligned(i) };
            status
        }
    }
}

/// Posts `wrs[0..n]` and rings the send doorbell once, in one call: the
/// `ibv_post_send` shape, and the cheapest way to post `rdd_wr`s (one
/// handle check, and a single request takes the queue's one-WQE path;
/// the per-opcode calls such as `rdd_mlx5_sq_write` are cheaper still for
/// one-SGE requests). The
/// doorbell covers every WQE written since the last ring, this call's
/// and any left pending by `rdd_mlx5_sq_post`.
///
/// Stops at the first rejected request with the same rules as
/// `rdd_mlx5_sq_post` (including when `*out_bad_index` is written); the
/// requests before it are posted *and rung*.
///
/// # Safety
/// As for `rdd_mlx5_sq_post`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_post_ring(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    // A single request of a typed shape is posted here, inside the first
    // panic boundary; every other call, and a single request of another
    // shape, is `post_ring`'s, out of line and after that boundary, so
    // that the call is a tail call and this function needs no stack frame
    // of its own on the fast path. (A large boundary closure, such as
    // `post_ring` inlined, is called through a closure-capture block in
    // unwinding builds: the arguments spilled to the stack and read back
    // through pointers.)
    // SAFETY: the caller's contract, forwarded.
    let posted = ffi_boundary!({ unsafe { post_ring_single(sq, wrs, n, out_bad_index) } });
    match posted {
        Some(status) => status,
        // SAFETY: the caller's contract, forwarded.
        None => unsafe { post_ring_slow(sq, wrs, n, out_bad_index) },
    }
}

/// [`post_ring`] inside its own panic boundary. `extern "C"`, the
/// export's own convention, so that the export's call of it compiles to a
/// jump (with the Rust ABI it did not).
///
/// # Safety
/// As for [`rdd_mlx5_sq_post_ring`].
#[inline(never)]
unsafe extern "C" fn post_ring_slow(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    // SAFETY: the caller's contract, forwarded.
    ffi_boundary!({ unsafe { post_ring(sq, wrs, n, out_bad_index) } })
}

/// The one-request fast path of [`rdd_mlx5_sq_post_ring`]: `n` is 1, the
/// arguments are valid and the request has a typed shape
/// ([`post_typed_wr`]). It does what [`post_ring`] does for such a call
/// (the same checks in the same order, the same WQE through
/// [`SendQueue::post_one`], on a refusal the same ring of pending WQEs and
/// index 0), without the loop and the call. `None`: nothing was written
/// (the handle may have been checked) and the call is [`post_ring`]'s.
///
/// # Safety
/// As for [`rdd_mlx5_sq_post_ring`].
#[inline(always)]
unsafe fn post_ring_single(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> Option<rdd_status> {
    // The checks of `send_post_args` that can fail before the handle's
    // are left to `post_ring`; with these true, the handle's status is
    // the first one it could return.
    if n != 1 || out_bad_index.is_null() || wrs.is_null() || !wrs.is_aligned() {
        return None;
    }
    // SAFETY: caller contract on `sq`.
    let queue = match unsafe { handle::get(sq) } {
        Ok(q) => q,
        Err(status) => return Some(status),
    };
    // SAFETY: non-NULL and aligned (checked), one readable request
    // (caller contract).
    let wr = unsafe { &*wrs };
    // SAFETY: the SGE and posting contracts are the caller's.
    let posted = unsafe { post_typed_wr(wr, &mut PostOne(&mut *queue)) }?;
    Some(match posted {
        Ok(()) => rdd_status::Ok,
        Err(status) => {
            // As `post_ring`: a refused request rings what was pending.
            queue.ring();
            // SAFETY: non-NULL (checked), valid for a write (contract).
            unsafe { out_bad_index.write_unaligned(0) };
            status
        }
    })
}

/// The body of [`rdd_mlx5_sq_post_ring`].
///
/// # Safety
/// As for [`rdd_mlx5_sq_post_ring`].
#[inline(always)]
unsafe fn post_ring(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    // SAFETY: caller contract.
    let queue = try_status!(unsafe { send_post_args(sq, wrs, n, out_bad_index) });
    let failed = if n == 1 {
        // One request: the queue's one-WQE path (it rings, covering
        // earlier pending WQEs, only if the request is posted).
        // SAFETY: `wrs` holds one readable request (checked /
        // contract); the SGE, payload and posting contracts are the
        // caller's.
        let failed = unsafe { post_each(wrs, 1, PostOne(&mut *queue)) };
        if failed.is_some() {
            queue.ring();
        }
        failed
    } else {
        let mut batch = queue.batch();
        // SAFETY: `wrs` holds `n` readable requests (checked /
        // contract); the SGE, payload and posting contracts are the
        // caller's.
        let failed = unsafe { post_each(wrs, n, &mut batch) };
        batch.ring();
        failed
    };
    // SAFETY: `out_bad_index` is non-NULL (checked) and writable.
    unsafe { send_post_status(failed, out_bad_index) }
}

/// Rings the send doorbell for every WQE posted since the last ring
/// (doorbell record, then one 8-byte doorbell or a BlueFlame copy).
/// Does nothing if nothing is pending.
///
/// # Safety
/// As for `rdd_mlx5_sq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_ring(sq: *mut rdd_mlx5_sq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { handle::get(sq) });
        queue.ring();
        rdd_status::Ok
    })
}
