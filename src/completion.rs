//! Work completions as every provider reports them: the completion record
//! ([`Wc`]), its status and opcode codes (numbered as libibverbs'
//! `enum ibv_wc_status` / `enum ibv_wc_opcode`), its flags, and the QP
//! state the data path tracks. The mlx5, rxe and siw pollers all decode
//! into these types; the failed-WR records in [`crate::wr`] use them too.

/// Completion status, numbered as `enum ibv_wc_status`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

#[allow(missing_docs)]
impl WcStatus {
    pub const SUCCESS: WcStatus = WcStatus(0);
    pub const LOC_LEN_ERR: WcStatus = WcStatus(1);
    pub const LOC_QP_OP_ERR: WcStatus = WcStatus(2);
    pub const LOC_EEC_OP_ERR: WcStatus = WcStatus(3);
    pub const LOC_PROT_ERR: WcStatus = WcStatus(4);
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);
    pub const MW_BIND_ERR: WcStatus = WcStatus(6);
    pub const BAD_RESP_ERR: WcStatus = WcStatus(7);
    pub const LOC_ACCESS_ERR: WcStatus = WcStatus(8);
    pub const REM_INV_REQ_ERR: WcStatus = WcStatus(9);
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(10);
    pub const REM_OP_ERR: WcStatus = WcStatus(11);
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    pub const RNR_RETRY_EXC_ERR: WcStatus = WcStatus(13);
    pub const LOC_RDD_VIOL_ERR: WcStatus = WcStatus(14);
    pub const REM_INV_RD_REQ_ERR: WcStatus = WcStatus(15);
    pub const REM_ABORT_ERR: WcStatus = WcStatus(16);
    pub const INV_EECN_ERR: WcStatus = WcStatus(17);
    pub const INV_EEC_STATE_ERR: WcStatus = WcStatus(18);
    pub const FATAL_ERR: WcStatus = WcStatus(19);
    pub const RESP_TIMEOUT_ERR: WcStatus = WcStatus(20);
    pub const GENERAL_ERR: WcStatus = WcStatus(21);
}

impl WcStatus {
    /// Maps an mlx5 error-CQE syndrome (docs/spec/mlx5.md §8 table).
    #[inline]
    pub const fn from_syndrome(s: u8) -> WcStatus {
        match s {
            0x01 => WcStatus::LOC_LEN_ERR,
            0x02 => WcStatus::LOC_QP_OP_ERR,
            0x04 => WcStatus::LOC_PROT_ERR,
            0x05 => WcStatus::WR_FLUSH_ERR,
            0x06 => WcStatus::MW_BIND_ERR,
            0x10 => WcStatus::BAD_RESP_ERR,
            0x11 => WcStatus::LOC_ACCESS_ERR,
            0x12 => WcStatus::REM_INV_REQ_ERR,
            0x13 => WcStatus::REM_ACCESS_ERR,
            0x14 => WcStatus::REM_OP_ERR,
            0x15 => WcStatus::RETRY_EXC_ERR,
            0x16 => WcStatus::RNR_RETRY_EXC_ERR,
            0x22 => WcStatus::REM_ABORT_ERR,
            _ => WcStatus::GENERAL_ERR,
        }
    }
    /// True for `SUCCESS`.
    #[inline]
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }
}

/// Completion opcode, numbered as `enum ibv_wc_opcode`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WcOpcode(pub u32);

#[allow(missing_docs)]
impl WcOpcode {
    pub const SEND: WcOpcode = WcOpcode(0);
    pub const RDMA_WRITE: WcOpcode = WcOpcode(1);
    pub const RDMA_READ: WcOpcode = WcOpcode(2);
    pub const COMP_SWAP: WcOpcode = WcOpcode(3);
    pub const FETCH_ADD: WcOpcode = WcOpcode(4);
    pub const BIND_MW: WcOpcode = WcOpcode(5);
    pub const LOCAL_INV: WcOpcode = WcOpcode(6);
    pub const RECV: WcOpcode = WcOpcode(128);
    pub const RECV_RDMA_WITH_IMM: WcOpcode = WcOpcode(129);
}

/// `wc_flags` bits, as `IBV_WC_*`.
pub mod wc_flags {
    /// A GRH is present.
    pub const GRH: u32 = 0x01;
    /// `imm_data` is valid.
    pub const WITH_IMM: u32 = 0x02;
    /// `imm_data` holds an invalidated rkey.
    pub const WITH_INV: u32 = 0x08;
}

/// A work completion. Field meanings follow `struct ibv_wc`; `imm_data`
/// is in host order; `syndrome`/`vendor_err` carry the raw mlx5 values of
/// an error CQE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wc {
    /// The WR's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Raw vendor syndrome of an error CQE.
    pub vendor_err: u32,
    /// Bytes received (or read; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data (host order) or the invalidated rkey.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD) as reported.
    pub src_qp: u32,
    /// `wc_flags` bits.
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
    /// Reserved.
    pub reserved: u8,
}

static_assertions::assert_eq_size!(Wc, [u8; 48]);

/// QP states, as far as the data path cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum QpState {
    /// Just created or reset: nothing may be posted.
    Reset = 0,
    /// Receives may be posted.
    Init = 1,
    /// Ready to receive: receives may be posted.
    Rtr = 2,
    /// Ready to send: everything may be posted.
    Rts = 3,
    /// Error: posts are accepted and complete with a flush error.
    Error = 4,
}

impl QpState {
    /// True if sends may be posted.
    #[inline(always)]
    pub const fn can_send(self) -> bool {
        matches!(self, QpState::Rts | QpState::Error)
    }
    /// True if receives may be posted.
    #[inline(always)]
    pub const fn can_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }
}
