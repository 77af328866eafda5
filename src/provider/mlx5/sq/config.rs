//! The send queue's configuration and its per-BB side-table entry.

/// When to use BlueFlame instead of the 8-byte doorbell (docs/spec/mlx5.md §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BfPolicy {
    /// Never copy WQEs; always the 8-byte doorbell (`MLX5_SHUT_UP_BF=1`).
    Never,
    /// libmlx5's default: a doorbell that covers exactly one WQE with
    /// DS > 1 that fits the BlueFlame buffer is sent as a BlueFlame copy.
    /// Batches always use the 8-byte doorbell.
    SingleWqe,
    /// As `SingleWqe`, but only for inline WQEs
    /// (`MLX5_POST_SEND_PREFER_BF=0`).
    SingleInlineWqe,
}

/// Per-BB side-table entry (docs/spec/mlx5.md §9), written at post time and read
/// when a completion names the WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct WrSlot {
    /// The WR's id.
    pub wr_id: u64,
    /// Producer counter just after this WQE (retire up to here).
    pub end: u32,
    /// Low 16 bits of the producer counter at this WQE's first BB.
    pub start: u16,
    /// mlx5 opcode of the WQE.
    pub opcode: u8,
    /// [`WrSlot::USER_SIGNALED`] and friends.
    pub flags: u8,
}

impl WrSlot {
    /// The application asked for a completion (or the QP signals all).
    pub const USER_SIGNALED: u8 = 1;
    /// The slot holds the first BB of a posted WQE.
    pub const VALID: u8 = 2;
    /// The WQE is the internal drain marker of recovery
    /// ([`SendQueue::post_drain_marker`](super::SendQueue::post_drain_marker)):
    /// its completion, whatever its status, is never reported.
    pub const DRAIN: u8 = 4;
}

/// Tunables of a send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqConfig {
    /// BlueFlame policy.
    pub bf_policy: BfPolicy,
    /// The QP was created with `sq_sig_all`: every WQE requests a CQE.
    pub sig_all: bool,
    /// The doorbell register is shared with other threads: flush the
    /// write-combining buffer after every doorbell (second `sfence`).
    pub shared_register: bool,
}

impl Default for SqConfig {
    fn default() -> Self {
        SqConfig {
            bf_policy: BfPolicy::SingleWqe,
            sig_all: false,
            shared_register: false,
        }
    }
}

const _: () = {
    assert!(core::mem::offset_of!(WrSlot, end) == 8);
    assert!(core::mem::offset_of!(WrSlot, start) == 12);
    assert!(core::mem::offset_of!(WrSlot, opcode) == 14);
    assert!(core::mem::offset_of!(WrSlot, flags) == 15);
    assert!(core::mem::size_of::<WrSlot>() == 16);
};
