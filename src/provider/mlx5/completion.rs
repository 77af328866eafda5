//! mlx5-specific completion details shared by the send, receive and
//! completion queues: the error-CQE syndromes and what retiring a send WQE
//! yields. The provider-independent completion types live in
//! [`crate::completion`] and are re-exported here.

pub use crate::completion::{wc_flags, QpState, Wc, WcOpcode, WcStatus};

/// mlx5 error-CQE syndromes (docs/spec/mlx5.md §8).
pub mod syndrome {
    /// Local length error.
    pub const LOCAL_LENGTH: u8 = 0x01;
    /// Local QP operation error.
    pub const LOCAL_QP_OP: u8 = 0x02;
    /// Local protection error.
    pub const LOCAL_PROT: u8 = 0x04;
    /// WR flushed.
    pub const WR_FLUSHED: u8 = 0x05;
    /// Memory-window bind error.
    pub const MW_BIND: u8 = 0x06;
    /// Bad response.
    pub const BAD_RESP: u8 = 0x10;
    /// Local access error.
    pub const LOCAL_ACCESS: u8 = 0x11;
    /// Remote invalid request.
    pub const REMOTE_INVAL_REQ: u8 = 0x12;
    /// Remote access error.
    pub const REMOTE_ACCESS: u8 = 0x13;
    /// Remote operation error.
    pub const REMOTE_OP: u8 = 0x14;
    /// Transport retry counter exceeded.
    pub const TRANSPORT_RETRY_EXC: u8 = 0x15;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC: u8 = 0x16;
    /// Remote aborted.
    pub const REMOTE_ABORTED: u8 = 0x22;
}

/// What retiring a WQE yielded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retired {
    /// The WR's id.
    pub wr_id: u64,
    /// mlx5 opcode of the WQE.
    pub opcode: u8,
    /// The application asked for a completion.
    pub user_signaled: bool,
    /// First BB of the WQE (for reading it back, e.g. scatter-to-CQE).
    pub start: u32,
}
