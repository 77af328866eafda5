//! The work completion as C sees it (`rdd_wc`) and its status, opcode
//! and flag values, asserted equal to the core ones.

use core::mem::{align_of, offset_of, size_of};

use static_assertions::const_assert_eq;

use crate::completion::wc_flags;
use crate::completion::{Wc, WcOpcode, WcStatus};

// ---------------------------------------------------------------------
// Completions
// ---------------------------------------------------------------------

/// A work completion (mirrors `struct ibv_wc` in spirit; 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_wc {
    /// The WR's id.
    pub wr_id: u64,
    /// `RDD_WC_*` status, numbered as `enum ibv_wc_status`.
    pub status: u32,
    /// `RDD_WC_OP_*` opcode, numbered as `enum ibv_wc_opcode`.
    pub opcode: u32,
    /// Raw vendor syndrome of an error CQE.
    pub vendor_err: u32,
    /// Bytes received (or read; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data (host order) or the invalidated rkey.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number as reported.
    pub src_qp: u32,
    /// `RDD_WC_FLAG_*` bits.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Raw mlx5 syndrome of an error CQE (0 on success).
    pub syndrome: u8,
    /// Reserved (0).
    pub reserved: u8,
}

const_assert_eq!(size_of::<rdd_wc>(), 48);
const_assert_eq!(size_of::<rdd_wc>(), size_of::<Wc>());
const_assert_eq!(align_of::<rdd_wc>(), align_of::<Wc>());
const_assert_eq!(offset_of!(rdd_wc, wr_id), offset_of!(Wc, wr_id));
const_assert_eq!(offset_of!(rdd_wc, status), offset_of!(Wc, status));
const_assert_eq!(offset_of!(rdd_wc, opcode), offset_of!(Wc, opcode));
const_assert_eq!(offset_of!(rdd_wc, vendor_err), offset_of!(Wc, vendor_err));
const_assert_eq!(offset_of!(rdd_wc, byte_len), offset_of!(Wc, byte_len));
const_assert_eq!(offset_of!(rdd_wc, imm_data), offset_of!(Wc, imm_data));
const_assert_eq!(offset_of!(rdd_wc, qp_num), offset_of!(Wc, qp_num));
const_assert_eq!(offset_of!(rdd_wc, src_qp), offset_of!(Wc, src_qp));
const_assert_eq!(offset_of!(rdd_wc, wc_flags), offset_of!(Wc, wc_flags));
const_assert_eq!(offset_of!(rdd_wc, pkey_index), offset_of!(Wc, pkey_index));
const_assert_eq!(offset_of!(rdd_wc, slid), offset_of!(Wc, slid));
const_assert_eq!(offset_of!(rdd_wc, sl), offset_of!(Wc, sl));
const_assert_eq!(
    offset_of!(rdd_wc, dlid_path_bits),
    offset_of!(Wc, dlid_path_bits)
);
const_assert_eq!(offset_of!(rdd_wc, syndrome), offset_of!(Wc, syndrome));
const_assert_eq!(offset_of!(rdd_wc, reserved), offset_of!(Wc, reserved));
const_assert_eq!(size_of::<WcStatus>(), 4);
const_assert_eq!(size_of::<WcOpcode>(), 4);

/// `rdd_wc.status`: success.
pub const RDD_WC_SUCCESS: u32 = 0;
/// `rdd_wc.status`: local length error.
pub const RDD_WC_LOC_LEN_ERR: u32 = 1;
/// `rdd_wc.status`: local QP operation error.
pub const RDD_WC_LOC_QP_OP_ERR: u32 = 2;
/// `rdd_wc.status`: local EE context operation error (reliable datagram;
/// not expected).
pub const RDD_WC_LOC_EEC_OP_ERR: u32 = 3;
/// `rdd_wc.status`: local protection error.
pub const RDD_WC_LOC_PROT_ERR: u32 = 4;
/// `rdd_wc.status`: flushed (the QP is in the error state).
pub const RDD_WC_WR_FLUSH_ERR: u32 = 5;
/// `rdd_wc.status`: memory-window bind error.
pub const RDD_WC_MW_BIND_ERR: u32 = 6;
/// `rdd_wc.status`: bad response.
pub const RDD_WC_BAD_RESP_ERR: u32 = 7;
/// `rdd_wc.status`: local access error.
pub const RDD_WC_LOC_ACCESS_ERR: u32 = 8;
/// `rdd_wc.status`: remote invalid request.
pub const RDD_WC_REM_INV_REQ_ERR: u32 = 9;
/// `rdd_wc.status`: remote access error.
pub const RDD_WC_REM_ACCESS_ERR: u32 = 10;
/// `rdd_wc.status`: remote operation error.
pub const RDD_WC_REM_OP_ERR: u32 = 11;
/// `rdd_wc.status`: transport retry counter exceeded.
pub const RDD_WC_RETRY_EXC_ERR: u32 = 12;
/// `rdd_wc.status`: RNR retry counter exceeded.
pub const RDD_WC_RNR_RETRY_EXC_ERR: u32 = 13;
/// `rdd_wc.status`: local RDD violation (reliable datagram; not expected).
pub const RDD_WC_LOC_RDD_VIOL_ERR: u32 = 14;
/// `rdd_wc.status`: remote invalid RD request (not expected).
pub const RDD_WC_REM_INV_RD_REQ_ERR: u32 = 15;
/// `rdd_wc.status`: remote aborted.
pub const RDD_WC_REM_ABORT_ERR: u32 = 16;
/// `rdd_wc.status`: invalid EE context number (not expected).
pub const RDD_WC_INV_EECN_ERR: u32 = 17;
/// `rdd_wc.status`: invalid EE context state (not expected).
pub const RDD_WC_INV_EEC_STATE_ERR: u32 = 18;
/// `rdd_wc.status`: fatal device error.
pub const RDD_WC_FATAL_ERR: u32 = 19;
/// `rdd_wc.status`: response timeout.
pub const RDD_WC_RESP_TIMEOUT_ERR: u32 = 20;
/// `rdd_wc.status`: any other error.
pub const RDD_WC_GENERAL_ERR: u32 = 21;

/// `rdd_wc.opcode`: SEND (also SEND_WITH_IMM/INV and NOP completions).
pub const RDD_WC_OP_SEND: u32 = 0;
/// `rdd_wc.opcode`: RDMA WRITE.
pub const RDD_WC_OP_RDMA_WRITE: u32 = 1;
/// `rdd_wc.opcode`: RDMA READ.
pub const RDD_WC_OP_RDMA_READ: u32 = 2;
/// `rdd_wc.opcode`: compare and swap.
pub const RDD_WC_OP_COMP_SWAP: u32 = 3;
/// `rdd_wc.opcode`: fetch and add.
pub const RDD_WC_OP_FETCH_ADD: u32 = 4;
/// `rdd_wc.opcode`: a memory-window bind.
pub const RDD_WC_OP_BIND_MW: u32 = 5;
/// `rdd_wc.opcode`: a local invalidate.
pub const RDD_WC_OP_LOCAL_INV: u32 = 6;
/// `rdd_wc.opcode`: a receive.
pub const RDD_WC_OP_RECV: u32 = 128;
/// `rdd_wc.opcode`: a receive consumed by RDMA WRITE with immediate.
pub const RDD_WC_OP_RECV_RDMA_WITH_IMM: u32 = 129;

/// `rdd_wc.wc_flags`: a GRH is present.
pub const RDD_WC_FLAG_GRH: u32 = 0x1;
/// `rdd_wc.wc_flags`: `imm_data` holds immediate data.
pub const RDD_WC_FLAG_WITH_IMM: u32 = 0x2;
/// `rdd_wc.wc_flags`: `imm_data` holds an invalidated rkey.
pub const RDD_WC_FLAG_WITH_INV: u32 = 0x8;

const_assert_eq!(RDD_WC_SUCCESS, WcStatus::SUCCESS.0);
const_assert_eq!(RDD_WC_LOC_LEN_ERR, WcStatus::LOC_LEN_ERR.0);
const_assert_eq!(RDD_WC_LOC_QP_OP_ERR, WcStatus::LOC_QP_OP_ERR.0);
const_assert_eq!(RDD_WC_LOC_PROT_ERR, WcStatus::LOC_PROT_ERR.0);
const_assert_eq!(RDD_WC_WR_FLUSH_ERR, WcStatus::WR_FLUSH_ERR.0);
const_assert_eq!(RDD_WC_MW_BIND_ERR, WcStatus::MW_BIND_ERR.0);
const_assert_eq!(RDD_WC_BAD_RESP_ERR, WcStatus::BAD_RESP_ERR.0);
const_assert_eq!(RDD_WC_LOC_ACCESS_ERR, WcStatus::LOC_ACCESS_ERR.0);
const_assert_eq!(RDD_WC_REM_INV_REQ_ERR, WcStatus::REM_INV_REQ_ERR.0);
const_assert_eq!(RDD_WC_REM_ACCESS_ERR, WcStatus::REM_ACCESS_ERR.0);
const_assert_eq!(RDD_WC_REM_OP_ERR, WcStatus::REM_OP_ERR.0);
const_assert_eq!(RDD_WC_RETRY_EXC_ERR, WcStatus::RETRY_EXC_ERR.0);
const_assert_eq!(RDD_WC_RNR_RETRY_EXC_ERR, WcStatus::RNR_RETRY_EXC_ERR.0);
const_assert_eq!(RDD_WC_REM_ABORT_ERR, WcStatus::REM_ABORT_ERR.0);
const_assert_eq!(RDD_WC_GENERAL_ERR, WcStatus::GENERAL_ERR.0);
const_assert_eq!(RDD_WC_LOC_EEC_OP_ERR, WcStatus::LOC_EEC_OP_ERR.0);
const_assert_eq!(RDD_WC_LOC_RDD_VIOL_ERR, WcStatus::LOC_RDD_VIOL_ERR.0);
const_assert_eq!(RDD_WC_REM_INV_RD_REQ_ERR, WcStatus::REM_INV_RD_REQ_ERR.0);
const_assert_eq!(RDD_WC_INV_EECN_ERR, WcStatus::INV_EECN_ERR.0);
const_assert_eq!(RDD_WC_INV_EEC_STATE_ERR, WcStatus::INV_EEC_STATE_ERR.0);
const_assert_eq!(RDD_WC_FATAL_ERR, WcStatus::FATAL_ERR.0);
const_assert_eq!(RDD_WC_RESP_TIMEOUT_ERR, WcStatus::RESP_TIMEOUT_ERR.0);
const_assert_eq!(RDD_WC_OP_BIND_MW, WcOpcode::BIND_MW.0);
const_assert_eq!(RDD_WC_OP_LOCAL_INV, WcOpcode::LOCAL_INV.0);
const_assert_eq!(RDD_WC_OP_SEND, WcOpcode::SEND.0);
const_assert_eq!(RDD_WC_OP_RDMA_WRITE, WcOpcode::RDMA_WRITE.0);
const_assert_eq!(RDD_WC_OP_RDMA_READ, WcOpcode::RDMA_READ.0);
const_assert_eq!(RDD_WC_OP_COMP_SWAP, WcOpcode::COMP_SWAP.0);
const_assert_eq!(RDD_WC_OP_FETCH_ADD, WcOpcode::FETCH_ADD.0);
const_assert_eq!(RDD_WC_OP_RECV, WcOpcode::RECV.0);
const_assert_eq!(RDD_WC_OP_RECV_RDMA_WITH_IMM, WcOpcode::RECV_RDMA_WITH_IMM.0);
const_assert_eq!(RDD_WC_FLAG_GRH, wc_flags::GRH);
const_assert_eq!(RDD_WC_FLAG_WITH_IMM, wc_flags::WITH_IMM);
const_assert_eq!(RDD_WC_FLAG_WITH_INV, wc_flags::WITH_INV);
