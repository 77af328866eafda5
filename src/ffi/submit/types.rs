//! The C types and constants of the submission service: the two opaque
//! handles, the descriptor, the completion, the configuration and the
//! counters, and the fixed sizes behind them.

use core::mem::size_of;

use static_assertions::const_assert_eq;

use crate::ffi::wr::{RDD_SEND_FENCE, RDD_SEND_INLINE, RDD_SEND_SIGNALED};

// ---------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------

/// A poll-mode submission service bound to one QP and its send CQ (opaque
/// handle): `rdd_submit_create` / `rdd_submit_destroy`.
pub struct rdd_submit_service {
    _private: [u8; 0],
}

/// One application thread's registration with a service (opaque handle):
/// `rdd_submit_register` / `rdd_submit_unregister`.
pub struct rdd_submitter {
    _private: [u8; 0],
}

// ---------------------------------------------------------------------
// Fixed sizes
// ---------------------------------------------------------------------

/// Descriptors the submission ring holds (shared by every submitter of a
/// service). A submission that finds it full is `RDD_STATUS_SQ_FULL`.
pub const RDD_SUBMIT_RING_SIZE: usize = 4096;

/// Most submitters registered with one service at once.
pub const RDD_SUBMIT_MAX_SUBMITTERS: usize = 64;

/// Entries of each submitter's completion ring, and so the most
/// descriptors one submitter may have in flight (submitted, completion
/// not yet reaped). One more is `RDD_STATUS_SQ_FULL` until it reaps.
pub const RDD_SUBMIT_COMPLETION_RING_SIZE: usize = 1024;

/// Largest `rdd_submit_config.max_batch`: descriptors one
/// `rdd_submit_drain` posts with one doorbell.
pub const RDD_SUBMIT_MAX_BATCH: u32 = 64;

/// Largest `rdd_submit_config.max_outstanding`: WRs the service keeps
/// posted on its QP and not yet completed.
pub const RDD_SUBMIT_MAX_OUTSTANDING: u32 = 4096;

/// `rdd_submit_config.max_batch` when 0 is given (or the config is NULL).
pub const RDD_SUBMIT_DEFAULT_BATCH: u32 = 32;

/// `rdd_submit_config.max_outstanding` when 0 is given (or the config is
/// NULL): the default send queue of `rdd_qp_create`.
pub const RDD_SUBMIT_DEFAULT_OUTSTANDING: u32 = 64;

/// Completions one `rdd_submit_complete` takes from the CQ at most.
pub const RDD_SUBMIT_POLL_BATCH: usize = 64;

/// The `rdd_submit_desc.flags` bits a descriptor may carry:
/// `RDD_SEND_FENCE`, `RDD_SEND_SIGNALED` (its own CQE; the service
/// already signals the last WR of every batch) and `RDD_SEND_INLINE`
/// (`local_addr` points at the payload, copied when the batch is posted;
/// `lkey` is ignored).
pub const RDD_SUBMIT_DESC_FLAGS: u32 = 0xb;

const_assert_eq!(
    RDD_SUBMIT_DESC_FLAGS,
    RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_INLINE
);

// ---------------------------------------------------------------------
// Descriptors and completions
// ---------------------------------------------------------------------

/// One RDMA WRITE to submit (`rdd_submit_post`): `length` bytes from
/// `local_addr` (in a region of the service QP's PD, `lkey`) to
/// `remote_addr` at the peer (`rkey`). 48 bytes; zero it, then set the
/// fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_submit_desc {
    /// The application's cookie, returned in the completion.
    pub wr_id: u64,
    /// First local byte (for `RDD_SEND_INLINE`, the payload pointer).
    pub local_addr: u64,
    /// First remote byte.
    pub remote_addr: u64,
    /// Bytes to write (less than 2^31; for `RDD_SEND_INLINE` at most the
    /// QP's inline limit).
    pub length: u32,
    /// Local key of the region holding the source bytes.
    pub lkey: u32,
    /// Remote key of the target region.
    pub rkey: u32,
    /// `RDD_WR_RDMA_WRITE` (the only operation the service posts).
    pub opcode: u32,
    /// `RDD_SUBMIT_DESC_FLAGS` bits.
    pub flags: u32,
    /// Must be 0.
    pub reserved: u32,
}

const_assert_eq!(size_of::<rdd_submit_desc>(), 48);

/// What a submitter reaps for each descriptor (`rdd_submit_reap`), in the
/// order it submitted them. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_submit_completion {
    /// The descriptor's `wr_id`.
    pub wr_id: u64,
    /// `RDD_WC_*` status: `RDD_WC_SUCCESS`, the device's error, or
    /// `RDD_WC_WR_FLUSH_ERR` for a descriptor that was flushed (after an
    /// earlier error on the QP, or by `rdd_submit_flush`). Descriptors of
    /// one submitter complete in the order it submitted them.
    pub status: u32,
    /// Raw vendor syndrome of the device's error completion (0 otherwise).
    pub vendor_err: u32,
}

const_assert_eq!(size_of::<rdd_submit_completion>(), 16);

/// How `rdd_submit_create` sizes a service (NULL there means all
/// defaults). Zero every field you do not set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_submit_config {
    /// WRs kept posted on the QP and not yet completed, 1 to
    /// `RDD_SUBMIT_MAX_OUTSTANDING` (0: `RDD_SUBMIT_DEFAULT_OUTSTANDING`).
    /// Keep it at most the QP's `max_send_wr`, so drains are not refused
    /// for a full send queue.
    pub max_outstanding: u32,
    /// Descriptors posted per `rdd_submit_drain` (one doorbell), 1 to
    /// `RDD_SUBMIT_MAX_BATCH` (0: `RDD_SUBMIT_DEFAULT_BATCH`).
    pub max_batch: u32,
    /// Must be 0.
    pub flags: u32,
    /// Must be 0.
    pub reserved: u32,
}

const_assert_eq!(size_of::<rdd_submit_config>(), 16);

/// Per-stage counters of a service (`rdd_submit_stats`), totals since
/// creation, and two gauges (`queued`, `held`). A relaxed snapshot: while
/// threads work, the stages are read at slightly different moments. When
/// no call is running, `submitted == drained + queued`, and
/// `completed - reaped` completions wait in completion rings. 104 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_submit_counters {
    /// Descriptors accepted into the submission ring.
    pub submitted: u64,
    /// Submissions refused because the ring was full (`SQ_FULL`).
    pub refused_ring_full: u64,
    /// Submissions refused because the submitter had
    /// `RDD_SUBMIT_COMPLETION_RING_SIZE` descriptors in flight (`SQ_FULL`).
    pub refused_no_credit: u64,
    /// Descriptors taken out of the ring by the poll-mode thread.
    pub drained: u64,
    /// WRs posted to the QP.
    pub posted: u64,
    /// Send doorbells the QP rang for those posts (one per non-empty
    /// `rdd_submit_drain` on the software device and the mlx5 core).
    pub doorbells: u64,
    /// Drains that the QP refused in part or whole because its send queue
    /// (or an unguarded CQ) was full; the rest stayed held for the next.
    /// The WRs of a batch cut short complete with a later batch's
    /// completion: keep `max_outstanding` within the send queue.
    pub qp_full: u64,
    /// Completions handed to the submitters' completion rings.
    pub completed: u64,
    /// Of those, completions whose status is not `RDD_WC_SUCCESS`.
    pub failed: u64,
    /// Completions the device did not produce: everything
    /// `rdd_submit_flush` completed, and a descriptor the QP refused
    /// (`RDD_WC_LOC_QP_OP_ERR`; not expected, descriptors are checked at
    /// submission). Counted in `completed` too.
    pub flushed: u64,
    /// Completions taken by submitters (`rdd_submit_reap`).
    pub reaped: u64,
    /// Descriptors in the submission ring right now.
    pub queued: u64,
    /// Descriptors drained and not yet posted (waiting for room on the
    /// QP) right now.
    pub held: u64,
}

const_assert_eq!(size_of::<rdd_submit_counters>(), 104);
