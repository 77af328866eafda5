//! Hand-written siw (soft-iWARP) layouts of the user-mapped queues
//! (docs/spec/siw.md §1, §2), with compile-time size, alignment and offset
//! checks. Every field is host-endian.
//!
//! Each element's `flags` shares an aligned 32-bit word with the bytes
//! next to it (SQE/RQE: `flags` u16, `num_sge`, `opcode` at 8..12; CQE:
//! `flags` u8, `opcode`, `status` u16 at 8..12). The crate's atomics shim
//! has no 8- or 16-bit atomics, so that word is accessed as one
//! `AtomicU32` ([`FLAGS_WORD_OFFSET`]); a 32-bit access contains and is
//! single-copy atomic with the kernel's narrower accesses to `flags`.

use core::mem::{align_of, offset_of, size_of};
use static_assertions::{const_assert, const_assert_eq};

use crate::wr::Sge;

/// SGEs per SQE and RQE (`SIW_MAX_SGE`).
pub const MAX_SGE: usize = 6;
/// Largest inline payload (`SIW_MAX_INLINE` = 16 × (6 − 1) = 80 bytes),
/// stored from `sge[1]` (offset 40) with its length in `sge[0].length`.
pub const MAX_INLINE: usize = SGE_SIZE * (MAX_SGE - 1);
/// Size of one SGE (`struct siw_sge`, same as `ibv_sge` and [`Sge`]).
pub const SGE_SIZE: usize = size_of::<SiwSge>();
/// Offset of the 32-bit word holding `flags` in every element.
pub const FLAGS_WORD_OFFSET: usize = 8;
/// Offset of the SGE array of an SQE.
pub const SQE_SGE_OFFSET: usize = offset_of!(SiwSqe, sge);
/// Offset of the inline payload in an SQE (`sge[1]`).
pub const SQE_INLINE_OFFSET: usize = SQE_SGE_OFFSET + SGE_SIZE;
/// Offset of the SGE array of an RQE.
pub const RQE_SGE_OFFSET: usize = offset_of!(SiwRqe, sge);
/// The mmap key that means "no mapping" (`SIW_INVAL_UOBJ_KEY`, docs/spec/siw.md §1).
pub const INVALID_KEY: u64 = 0x09_0000;

/// `enum siw_wqe_flags` (docs/spec/siw.md §2).
pub mod wqe_flags {
    /// The element belongs to the other side (posted / completed).
    pub const VALID: u16 = 0x01;
    /// The payload is inline.
    pub const INLINE: u16 = 0x02;
    /// Request a completion.
    pub const SIGNALLED: u16 = 0x04;
    /// Solicited event.
    pub const SOLICITED: u16 = 0x08;
    /// Wait for earlier READs (not allowed on READ itself).
    pub const READ_FENCE: u16 = 0x10;
    /// CQE: `inval_stag` holds an invalidated STag (kernel CQs only).
    pub const REM_INVAL: u16 = 0x20;
    /// Kernel-internal.
    pub const COMPLETED: u16 = 0x40;
}

/// `enum siw_opcode` (docs/spec/siw.md §2).
pub mod opcode {
    /// RDMA WRITE.
    pub const WRITE: u8 = 0;
    /// RDMA READ.
    pub const READ: u8 = 1;
    /// RDMA READ with local invalidate.
    pub const READ_LOCAL_INV: u8 = 2;
    /// SEND.
    pub const SEND: u8 = 3;
    /// SEND with immediate (not supported for user QPs).
    pub const SEND_WITH_IMM: u8 = 4;
    /// SEND with invalidate: the STag to invalidate is in `rkey`.
    pub const SEND_REMOTE_INV: u8 = 5;
    /// Fetch and add (unsupported by siw).
    pub const FETCH_AND_ADD: u8 = 6;
    /// Compare and swap (unsupported by siw).
    pub const COMP_AND_SWAP: u8 = 7;
    /// Receive (CQEs of the receive queue).
    pub const RECEIVE: u8 = 8;
    /// Kernel-internal.
    pub const READ_RESPONSE: u8 = 9;
    /// Kernel clients only.
    pub const INVAL_STAG: u8 = 10;
    /// Kernel clients only.
    pub const REG_MR: u8 = 11;
}

/// `enum siw_wc_status` (docs/spec/siw.md §2); differs from `ibv_wc_status`.
pub mod wc_status {
    /// Success.
    pub const SUCCESS: u16 = 0;
    /// Local length error.
    pub const LOC_LEN_ERR: u16 = 1;
    /// Local protection error.
    pub const LOC_PROT_ERR: u16 = 2;
    /// Local QP operation error.
    pub const LOC_QP_OP_ERR: u16 = 3;
    /// Flushed.
    pub const WR_FLUSH_ERR: u16 = 4;
    /// Bad response.
    pub const BAD_RESP_ERR: u16 = 5;
    /// Local access error.
    pub const LOC_ACCESS_ERR: u16 = 6;
    /// Remote access error.
    pub const REM_ACCESS_ERR: u16 = 7;
    /// Remote invalid request.
    pub const REM_INV_REQ_ERR: u16 = 8;
    /// General error.
    pub const GENERAL_ERR: u16 = 9;
}

/// `enum siw_notify_flags`: the `siw_cq_ctrl.flags` values (docs/spec/siw.md §3).
pub mod notify {
    /// Not armed.
    pub const NOT: u32 = 0;
    /// Event on the next solicited completion.
    pub const SOLICITED: u32 = 1;
    /// Event on the next completion (with SOLICITED).
    pub const NEXT_COMPLETION: u32 = 2;
    /// Kernel-internal.
    pub const MISSED_EVENTS: u32 = 4;
}

/// `struct siw_sge` (16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiwSge {
    /// Local address.
    pub laddr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key (STag).
    pub lkey: u32,
}

/// `struct siw_sqe` (120 B, docs/spec/siw.md §2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiwSqe {
    /// wr_id.
    pub id: u64,
    /// [`wqe_flags`]; written last, with VALID.
    pub flags: u16,
    /// SGEs used.
    pub num_sge: u8,
    /// [`opcode`].
    pub opcode: u8,
    /// Remote key, or the STag to invalidate (SEND_REMOTE_INV).
    pub rkey: u32,
    /// Remote address.
    pub raddr: u64,
    /// SGEs, or inline payload from `sge[1]` with its length in
    /// `sge[0].length`.
    pub sge: [SiwSge; MAX_SGE],
}

/// `struct siw_rqe` (112 B, docs/spec/siw.md §2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiwRqe {
    /// wr_id.
    pub id: u64,
    /// Exactly VALID when posted.
    pub flags: u16,
    /// SGEs used.
    pub num_sge: u8,
    /// Ignored from user space.
    pub opcode: u8,
    /// Unused.
    pub unused: u32,
    /// SGEs.
    pub sge: [SiwSge; MAX_SGE],
}

/// `struct siw_cqe` (32 B, docs/spec/siw.md §2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiwCqe {
    /// wr_id.
    pub id: u64,
    /// VALID (plus REM_INVAL on kernel CQs).
    pub flags: u8,
    /// [`opcode`]: the SQE's, or RECEIVE.
    pub opcode: u8,
    /// [`wc_status`].
    pub status: u16,
    /// Bytes transferred.
    pub bytes: u32,
    /// Immediate data (never set for user QPs), or `inval_stag` in its
    /// first 4 bytes.
    pub imm_data: u64,
    /// QP id (user CQs).
    pub qp_id: u64,
}

/// `struct siw_cq_ctrl` (8 B), right after the last CQE (docs/spec/siw.md §1, §3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiwCqCtrl {
    /// [`notify`] flags.
    pub flags: u32,
    /// Padding.
    pub pad: u32,
}

/// The flags word of an SQE or RQE: `flags`, `num_sge`, `opcode` in memory
/// order, as the native `u32` with that image.
#[inline(always)]
pub const fn wqe_word(flags: u16, num_sge: u8, opcode: u8) -> u32 {
    let f = flags.to_ne_bytes();
    u32::from_ne_bytes([f[0], f[1], num_sge, opcode])
}

/// The `(flags, num_sge, opcode)` of an SQE or RQE flags word.
#[inline(always)]
pub const fn wqe_word_fields(w: u32) -> (u16, u8, u8) {
    let b = w.to_ne_bytes();
    (u16::from_ne_bytes([b[0], b[1]]), b[2], b[3])
}

/// The flags word of a CQE: `flags`, `opcode`, `status` in memory order.
#[inline(always)]
pub const fn cqe_word(flags: u8, opcode: u8, status: u16) -> u32 {
    let s = status.to_ne_bytes();
    u32::from_ne_bytes([flags, opcode, s[0], s[1]])
}

/// The `(flags, opcode, status)` of a CQE flags word.
#[inline(always)]
pub const fn cqe_word_fields(w: u32) -> (u8, u8, u16) {
    let b = w.to_ne_bytes();
    (b[0], b[1], u16::from_ne_bytes([b[2], b[3]]))
}

// docs/spec/siw.md §2: `struct siw_sge`, identical to `ibv_sge` and `Sge`.
const_assert_eq!(size_of::<SiwSge>(), 16);
const_assert_eq!(offset_of!(SiwSge, length), 8);
const_assert_eq!(offset_of!(SiwSge, lkey), 12);
const_assert_eq!(size_of::<Sge>(), size_of::<SiwSge>());
const_assert_eq!(offset_of!(Sge, length), offset_of!(SiwSge, length));
const_assert_eq!(offset_of!(Sge, lkey), offset_of!(SiwSge, lkey));
// docs/spec/siw.md §2: `struct siw_sqe` (120 B).
const_assert_eq!(size_of::<SiwSqe>(), 120);
const_assert_eq!(align_of::<SiwSqe>(), 8);
const_assert_eq!(offset_of!(SiwSqe, flags), FLAGS_WORD_OFFSET);
const_assert_eq!(offset_of!(SiwSqe, num_sge), 10);
const_assert_eq!(offset_of!(SiwSqe, opcode), 11);
const_assert_eq!(offset_of!(SiwSqe, rkey), 12);
const_assert_eq!(offset_of!(SiwSqe, raddr), 16);
const_assert_eq!(offset_of!(SiwSqe, sge), 24);
const_assert_eq!(SQE_INLINE_OFFSET, 40);
const_assert_eq!(MAX_INLINE, 80);
const_assert_eq!(SQE_INLINE_OFFSET + MAX_INLINE, size_of::<SiwSqe>());
// docs/spec/siw.md §2: `struct siw_rqe` (112 B).
const_assert_eq!(size_of::<SiwRqe>(), 112);
const_assert_eq!(align_of::<SiwRqe>(), 8);
const_assert_eq!(offset_of!(SiwRqe, flags), FLAGS_WORD_OFFSET);
const_assert_eq!(offset_of!(SiwRqe, num_sge), 10);
const_assert_eq!(offset_of!(SiwRqe, opcode), 11);
const_assert_eq!(offset_of!(SiwRqe, unused), 12);
const_assert_eq!(offset_of!(SiwRqe, sge), 16);
// docs/spec/siw.md §2: `struct siw_cqe` (32 B).
const_assert_eq!(size_of::<SiwCqe>(), 32);
const_assert_eq!(align_of::<SiwCqe>(), 8);
const_assert_eq!(offset_of!(SiwCqe, flags), FLAGS_WORD_OFFSET);
const_assert_eq!(offset_of!(SiwCqe, opcode), 9);
const_assert_eq!(offset_of!(SiwCqe, status), 10);
const_assert_eq!(offset_of!(SiwCqe, bytes), 12);
const_assert_eq!(offset_of!(SiwCqe, imm_data), 16);
const_assert_eq!(offset_of!(SiwCqe, qp_id), 24);
// docs/spec/siw.md §1, §3: `struct siw_cq_ctrl` (8 B).
const_assert_eq!(size_of::<SiwCqCtrl>(), 8);
const_assert_eq!(offset_of!(SiwCqCtrl, flags), 0);
// Every element size keeps the flags word 4-aligned and the 64-bit
// fields 8-aligned in an 8-aligned mapping.
const_assert!(size_of::<SiwSqe>() % 8 == 0);
const_assert!(size_of::<SiwRqe>() % 8 == 0);
const_assert!(size_of::<SiwCqe>() % 8 == 0);
