//! An independent, *ordered* model of the send-WR rules: not only which
//! rules a work request breaks (that is [`crate::send::violations`]) but
//! the one error a post reports, following the documented precedence:
//!
//! - the C translation (`rdd_wr`, `docs/c-api.md` "Work requests"): flags,
//!   then opcode, then immediate, then the SGE array (NULL, count,
//!   alignment), then NULL inline pieces in order;
//! - the payload rules of `wr.rs` (`validate_send`): for SGEs the count,
//!   then the atomic shape or the dataless rule, then the message length;
//!   for inline payloads the opcode, the message length, the size; then
//!   the atomic alignment;
//! - the mlx5 encoder (docs/spec/mlx5.md §2–§5): memory-window operations
//!   are unsupported.
//!
//! It never calls the crate's validation.

use rdma_direct::ffi::{
    rdd_status, RDD_SEND_INLINE, RDD_WR_ATOMIC_CMP_AND_SWP, RDD_WR_ATOMIC_FETCH_AND_ADD,
    RDD_WR_MAX_INLINE_SGE, RDD_WR_NOP, RDD_WR_RDMA_READ, RDD_WR_RDMA_WRITE,
    RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_SEND, RDD_WR_SEND_WITH_IMM, RDD_WR_SEND_WITH_INV,
};
use rdma_direct::{Error, QpCaps, SendOp};

use crate::send::{max_wqe_ds, MAX_DS, MAX_MESSAGE};

/// The known C opcodes.
pub const KNOWN_OPS: [u32; 9] = [
    RDD_WR_RDMA_WRITE,
    RDD_WR_RDMA_WRITE_WITH_IMM,
    RDD_WR_SEND,
    RDD_WR_SEND_WITH_IMM,
    RDD_WR_RDMA_READ,
    RDD_WR_ATOMIC_CMP_AND_SWP,
    RDD_WR_ATOMIC_FETCH_AND_ADD,
    RDD_WR_SEND_WITH_INV,
    RDD_WR_NOP,
];

/// Most SGEs of a non-inline `rdd_wr` (the DS field's limit).
pub const C_MAX_SGE: u32 = MAX_DS;

/// Whether any send queue accepts `caps` (its largest WQE fits DS).
pub fn caps_ok(caps: &QpCaps) -> bool {
    max_wqe_ds(caps) <= MAX_DS
}

/// A typed WR's payload, as the model sees it.
#[derive(Clone, Copy, Debug)]
pub enum Shape<'a> {
    /// SGE lengths.
    Sges(&'a [u32]),
    /// Inline piece lengths.
    Inline(&'a [usize]),
}

fn atomic(op: &SendOp) -> bool {
    matches!(op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
}

fn dataless(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Nop | SendOp::BindMw(_) | SendOp::LocalInv { .. }
    )
}

/// The error a post gives a typed WR on a queue with (valid) `caps` that
/// has room and can send; `None`: accepted.
pub fn typed_verdict(op: &SendOp, shape: Shape<'_>, caps: &QpCaps) -> Option<Error> {
    match shape {
        Shape::Sges(lens) => {
            if lens.len() > caps.max_send_sge as usize {
                return Some(Error::TooManySges);
            }
            if atomic(op) {
                if lens != [8] {
                    return Some(Error::AtomicSgeLength);
                }
            } else if dataless(op) {
                if !lens.is_empty() {
                    return Some(Error::TooManySges);
                }
            } else {
                let total: u64 = lens.iter().map(|&l| l as u64).sum();
                // Bit 31 of a byte count marks an inline segment.
                if total > MAX_MESSAGE || lens.iter().any(|&l| l >= 1 << 31) {
                    return Some(Error::LengthOverflow);
                }
            }
        }
        Shape::Inline(pieces) => {
            let carries_data = matches!(
                op,
                SendOp::Send
                    | SendOp::SendImm { .. }
                    | SendOp::SendInv { .. }
                    | SendOp::Write { .. }
                    | SendOp::WriteImm { .. }
            );
            if !carries_data {
                return Some(Error::InlineNotAllowed);
            }
            let total: u64 = pieces.iter().map(|&l| l as u64).sum();
            if total > MAX_MESSAGE {
                return Some(Error::LengthOverflow);
            }
            if total > caps.max_inline_data as u64 {
                return Some(Error::InlineTooLarge);
            }
        }
    }
    if let Some(r) = op.remote() {
        if atomic(op) && r.addr % 8 != 0 {
            return Some(Error::AtomicUnaligned);
        }
    }
    if matches!(op, SendOp::BindMw(_) | SendOp::LocalInv { .. }) {
        return Some(Error::Unsupported);
    }
    None
}

/// How a C WR's `sg_list` pointer is made by a harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMode {
    /// A real, aligned array.
    Real,
    /// NULL.
    Null,
    /// Four bytes into an aligned array.
    Misaligned,
}

/// The C translation's verdict on a request (before the typed rules):
/// `flags`, `opcode`, `imm`, the list mode and count, and for inline
/// requests whether each backed entry has a NULL address with a non-zero
/// length (`null_pieces`, in order).
pub fn c_verdict(
    flags: u32,
    opcode: u32,
    imm: u32,
    mode: ListMode,
    num_sge: u32,
    null_pieces: impl Iterator<Item = bool>,
) -> Option<rdd_status> {
    if flags & !0xf != 0 {
        return Some(rdd_status::InvalidFlags);
    }
    if !KNOWN_OPS.contains(&opcode) {
        return Some(rdd_status::InvalidOpcode);
    }
    if imm != 0 && opcode != RDD_WR_SEND_WITH_IMM && opcode != RDD_WR_RDMA_WRITE_WITH_IMM {
        return Some(rdd_status::InvalidImmediate);
    }
    let inline = flags & RDD_SEND_INLINE != 0;
    if num_sge > 0 {
        if mode == ListMode::Null {
            return Some(rdd_status::NullPointer);
        }
        let max = if inline {
            RDD_WR_MAX_INLINE_SGE as u32
        } else {
            C_MAX_SGE
        };
        if num_sge > max {
            return Some(rdd_status::TooManySges);
        }
        if mode == ListMode::Misaligned {
            return Some(rdd_status::InvalidArgument);
        }
        if inline {
            for null in null_pieces.take(num_sge as usize) {
                if null {
                    return Some(rdd_status::NullPointer);
                }
            }
        }
    }
    None
}

/// The typed operation a C request that passes the translation stands
/// for (field by field, from `docs/c-api.md`).
pub fn c_op(
    opcode: u32,
    imm: u32,
    remote: rdma_direct::Remote,
    invalidate_rkey: u32,
    compare_add: u64,
    swap: u64,
) -> SendOp {
    match opcode {
        RDD_WR_RDMA_WRITE => SendOp::Write { remote },
        RDD_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm { remote, imm },
        RDD_WR_SEND => SendOp::Send,
        RDD_WR_SEND_WITH_IMM => SendOp::SendImm { imm },
        RDD_WR_RDMA_READ => SendOp::Read { remote },
        RDD_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote,
            compare: compare_add,
            swap,
        },
        RDD_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote,
            add: compare_add,
        },
        RDD_WR_SEND_WITH_INV => SendOp::SendInv {
            rkey: invalidate_rkey,
        },
        _ => SendOp::Nop,
    }
}
