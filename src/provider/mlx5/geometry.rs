//! How big the queues of an mlx5 QP are: the largest send WQE a QP's
//! limits allow, and the send-queue basic blocks and receive entries the
//! device gives it (as rdma-core sizes mlx5 queues). The software device
//! sizes its queues this way, and the verbs backend predicts libmlx5's.

use crate::attr::QpInit;

/// Largest send WQE for `init`: atomics (64 B), ctrl + raddr + SGEs, or
/// ctrl + raddr + inline header + payload, rounded up to a BB.
pub fn max_wqe_bytes(init: &QpInit) -> u32 {
    [
        64,
        32 + 16 * init.max_send_sge,
        32 + (4 + init.max_inline_data).div_ceil(16) * 16,
    ]
    .into_iter()
    .max()
    .unwrap_or(64)
    .next_multiple_of(64)
}

/// SQ basic blocks and RQ entries the device gives a QP created with
/// `init` (as rdma-core sizes mlx5 queues, docs/spec/mlx5.md §2, §6).
pub fn queue_sizes(init: &QpInit) -> (u32, u32) {
    (
        pow2(init.max_send_wr.saturating_mul(max_wqe_bytes(init)) / 64),
        pow2(init.max_recv_wr),
    )
}

/// The smallest power of two that is at least `v` (and at least 1).
pub fn pow2(v: u32) -> u32 {
    v.max(1).next_power_of_two()
}
