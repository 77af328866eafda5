//! The independent model of the poller: the CQE opcodes and flags it
//! decodes, the outstanding work it tracks and the pure helpers it uses.

use std::collections::{HashSet, VecDeque};

use rdma_direct::provider::mlx5::{QpState, Wc, WcOpcode, WcStatus};
use rdma_direct::SendOp;

/// CQE opcodes (bits 7..4 of `op_own`), `mlx5dv.h`.
pub(crate) const REQ: u8 = 0x0;
pub(crate) const RESP_WR_IMM: u8 = 0x1;
pub(crate) const RESP_SEND: u8 = 0x2;
pub(crate) const RESP_SEND_IMM: u8 = 0x3;
pub(crate) const RESP_SEND_INV: u8 = 0x4;
pub(crate) const REQ_ERR: u8 = 0xd;
pub(crate) const RESP_ERR: u8 = 0xe;
pub(crate) const INVALID: u8 = 0xf;

/// `IBV_WC_*` flag bits.
pub(crate) const WC_GRH: u32 = 0x01;
pub(crate) const WC_WITH_IMM: u32 = 0x02;
pub(crate) const WC_WITH_INV: u32 = 0x08;

/// Buffers a WR names, in WQE order: (arena offset, length).
pub(crate) type Segs = Vec<(usize, u32)>;

/// An outstanding send as the model sees it.
#[derive(Clone, Debug)]
pub(crate) struct SendRec {
    pub(crate) start: u32,
    pub(crate) end: u32,
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) user_signaled: bool,
    /// Buffers the WQE names.
    pub(crate) segs: Segs,
}

/// An outstanding receive.
#[derive(Clone, Debug)]
pub(crate) struct RecvRec {
    pub(crate) wr_id: u64,
    pub(crate) segs: Segs,
}

pub(crate) struct Model {
    pub(crate) sq_cnt: u32,
    pub(crate) sq_pi: u32,
    pub(crate) sq_retired: u32,
    pub(crate) sq_batch: u32,
    pub(crate) sq_state: QpState,
    pub(crate) sends: VecDeque<SendRec>,
    pub(crate) rq_cnt: u32,
    pub(crate) rq_head: u32,
    pub(crate) rq_tail: u32,
    pub(crate) rq_rung: u32,
    pub(crate) rq_state: QpState,
    pub(crate) recvs: VecDeque<RecvRec>,
    pub(crate) ci: u32,
    pub(crate) stale: u64,
    pub(crate) dbrec_sq: u32,
    pub(crate) dbrec_rq: u32,
    pub(crate) dbrec_cq: u32,
    /// Expected arena contents.
    pub(crate) arena: Vec<u8>,
    /// Every wr_id ever completed (ids are unique per input).
    pub(crate) completed: HashSet<u64>,
}

pub(crate) fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

pub(crate) fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}

/// The error-CQE syndrome table (docs/spec/mlx5.md §8, rdma-core
/// `mlx5_handle_error_cqe`).
pub(crate) fn status_of(syndrome: u8) -> WcStatus {
    WcStatus(match syndrome {
        0x01 => 1,  // local length
        0x02 => 2,  // local QP operation
        0x04 => 4,  // local protection
        0x05 => 5,  // flushed
        0x06 => 6,  // MW bind
        0x10 => 7,  // bad response
        0x11 => 8,  // local access
        0x12 => 9,  // remote invalid request
        0x13 => 10, // remote access
        0x14 => 11, // remote operation
        0x15 => 12, // transport retry exceeded
        0x16 => 13, // RNR retry exceeded
        0x22 => 16, // remote aborted
        _ => 21,    // general error
    })
}

/// Requester completion opcode for a send operation.
pub(crate) fn send_wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RDMA_WRITE,
        SendOp::Read { .. } => WcOpcode::RDMA_READ,
        SendOp::CompareSwap { .. } => WcOpcode::COMP_SWAP,
        SendOp::FetchAdd { .. } => WcOpcode::FETCH_ADD,
        _ => WcOpcode::SEND,
    }
}

/// What the model makes of one software-owned CQE.
pub(crate) enum Outcome {
    /// A completion for the caller.
    Wc(Wc),
    /// Consumed silently (foreign QPN, or a requested-by-guard CQE).
    Skip,
    /// Corrupt: unknown opcode, or a counter naming no outstanding work.
    Corrupt,
    /// A compressed CQE.
    Compressed,
}

/// Copies up to `len` bytes of `src` into `segs` of `arena`, in order.
pub(crate) fn scatter_model(arena: &mut [u8], segs: &[(usize, u32)], src: &[u8], len: u32) {
    let mut rest = (len as usize).min(src.len());
    let mut from = 0;
    for &(off, seg_len) in segs {
        if rest == 0 {
            break;
        }
        let n = rest.min(seg_len as usize);
        arena[off..off + n].copy_from_slice(&src[from..from + n]);
        from += n;
        rest -= n;
    }
}
