//! Hand-written mlx5 layouts (docs/spec/mlx5.md §1, §3, §8, §10), with
//! compile-time size, alignment and offset checks. Under the `verbs`
//! feature `tests/layout_bindgen.rs` cross-checks them against bindgen
//! output of the system's `infiniband/mlx5dv.h`.
//!
//! Multi-byte device fields are big-endian; they are held in [`Be16`],
//! [`Be32`] and [`Be64`], whose in-memory image is the wire image.

use core::mem::{align_of, offset_of, size_of};
use static_assertions::const_assert_eq;

macro_rules! be_type {
    ($(#[$m:meta])* $name:ident, $t:ty) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name($t);

        impl $name {
            /// Stores a host-order value big-endian.
            #[inline(always)]
            pub const fn new(v: $t) -> Self {
                $name(v.to_be())
            }
            /// The host-order value.
            #[inline(always)]
            pub const fn get(self) -> $t {
                <$t>::from_be(self.0)
            }
            /// The raw in-memory representation (already big-endian).
            #[inline(always)]
            pub const fn raw(self) -> $t {
                self.0
            }
            /// Wraps a raw in-memory representation.
            #[inline(always)]
            pub const fn from_raw(raw: $t) -> Self {
                $name(raw)
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{:#x}", self.get())
            }
        }
    };
}

be_type!(
    /// A big-endian 16-bit field.
    Be16, u16
);
be_type!(
    /// A big-endian 32-bit field.
    Be32, u32
);
be_type!(
    /// A big-endian 64-bit field.
    Be64, u64
);

/// Send WQE basic block size (`MLX5_SEND_WQE_BB`).
pub const SEND_WQE_BB: u32 = 64;
/// log2 of [`SEND_WQE_BB`].
pub const SEND_WQE_SHIFT: u32 = 6;
/// Octoword (segment unit) size.
pub const OCTOWORD: u32 = 16;
/// Largest DS value: the field is 6 bits (docs/spec/mlx5.md §2).
pub const MAX_DS: u32 = 63;
/// `MLX5_INLINE_SEG`: set in an inline segment's byte count.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// `MLX5_INVALID_LKEY`: the lkey of a receive-WQE terminator entry.
pub const INVALID_LKEY: u32 = 0x100;
/// `MLX5_CQ_DOORBELL`: offset of the CQ arm register in the UAR page.
pub const CQ_DOORBELL: usize = 0x20;
/// Index of the RQ word of the QP doorbell record (`MLX5_RCV_DBR`).
pub const RCV_DBR: usize = 0;
/// Index of the SQ word of the QP doorbell record (`MLX5_SND_DBR`).
pub const SND_DBR: usize = 1;
/// Index of the consumer-index word of the CQ doorbell record
/// (`MLX5_CQ_SET_CI`, private in rdma-core).
pub const CQ_SET_CI: usize = 0;
/// Index of the arm word of the CQ doorbell record (`MLX5_CQ_ARM_DB`).
pub const CQ_ARM_DB: usize = 1;

/// `fm_ce_se` bits (docs/spec/mlx5.md §3).
pub mod ctrl_flags {
    /// CE = 2: always generate a CQE (`MLX5_WQE_CTRL_CQ_UPDATE`).
    pub const CQ_UPDATE: u8 = 0x08;
    /// Solicited event (`MLX5_WQE_CTRL_SOLICITED`).
    pub const SOLICITED: u8 = 0x02;
    /// Fence mode 4, used for `IBV_SEND_FENCE` (`MLX5_WQE_CTRL_FENCE`).
    pub const FENCE: u8 = 0x80;
    /// Fence mode 1 (`MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE`).
    pub const INITIATOR_SMALL_FENCE: u8 = 0x20;
}

/// mlx5 send opcodes (docs/spec/mlx5.md §4).
pub mod opcode {
    /// NOP.
    pub const NOP: u8 = 0x00;
    /// SEND with invalidate.
    pub const SEND_INVAL: u8 = 0x01;
    /// RDMA WRITE.
    pub const RDMA_WRITE: u8 = 0x08;
    /// RDMA WRITE with immediate.
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    /// SEND.
    pub const SEND: u8 = 0x0a;
    /// SEND with immediate.
    pub const SEND_IMM: u8 = 0x0b;
    /// RDMA READ.
    pub const RDMA_READ: u8 = 0x10;
    /// Atomic compare and swap.
    pub const ATOMIC_CS: u8 = 0x11;
    /// Atomic fetch and add.
    pub const ATOMIC_FA: u8 = 0x12;
}

/// CQE opcodes, bits 7..4 of `op_own` (docs/spec/mlx5.md §8).
pub mod cqe_opcode {
    /// Requester completion.
    pub const REQ: u8 = 0;
    /// Responder: RDMA WRITE with immediate.
    pub const RESP_WR_IMM: u8 = 1;
    /// Responder: SEND.
    pub const RESP_SEND: u8 = 2;
    /// Responder: SEND with immediate.
    pub const RESP_SEND_IMM: u8 = 3;
    /// Responder: SEND with invalidate.
    pub const RESP_SEND_INV: u8 = 4;
    /// CQ resize marker.
    pub const RESIZE_CQ: u8 = 5;
    /// Signature error.
    pub const SIG_ERR: u8 = 12;
    /// Requester error.
    pub const REQ_ERR: u8 = 13;
    /// Responder error.
    pub const RESP_ERR: u8 = 14;
    /// Entry not yet written by hardware.
    pub const INVALID: u8 = 15;
}

/// CQE format field values, bits 3..2 of `op_own`.
pub mod cqe_format {
    /// No inline data.
    pub const NORMAL: u8 = 0;
    /// Up to 32 bytes of data in the CQE itself (`MLX5_INLINE_SCATTER_32`).
    pub const SCATTER_32: u8 = 1;
    /// Up to 64 bytes in the first half of a 128-byte CQE slot.
    pub const SCATTER_64: u8 = 2;
    /// A compressed CQE block.
    pub const COMPRESSED: u8 = 3;
}

/// `struct mlx5_wqe_ctrl_seg` (16 B, 4-aligned). `dci_stream_channel_id`
/// sits at the odd offset 9 and is held as bytes (docs/spec/mlx5.md §10).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlSeg {
    /// Opcode modifier (31..24), WQE index (23..8), opcode (7..0).
    pub opmod_idx_opcode: Be32,
    /// QP number (31..8), DS (5..0).
    pub qpn_ds: Be32,
    /// WQE signature (0: signatures off).
    pub signature: u8,
    /// DC stream channel id (big-endian bytes), 0 for RC.
    pub dci_stream_channel_id: [u8; 2],
    /// Fence mode (7..5), completion mode (3..2), solicited (1).
    pub fm_ce_se: u8,
    /// Immediate data (wire order) or the rkey to invalidate.
    pub imm: Be32,
}

/// `struct mlx5_wqe_raddr_seg` (16 B).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaddrSeg {
    /// Remote address.
    pub raddr: Be64,
    /// Remote key.
    pub rkey: Be32,
    /// Reserved, written 0.
    pub reserved: Be32,
}

/// `struct mlx5_wqe_data_seg` (16 B).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataSeg {
    /// Byte count.
    pub byte_count: Be32,
    /// Local key.
    pub lkey: Be32,
    /// Local address.
    pub addr: Be64,
}

/// `struct mlx5_wqe_atomic_seg` (16 B).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicSeg {
    /// Swap value (CAS) or addend (fetch-add).
    pub swap_add: Be64,
    /// Compare value (CAS only).
    pub compare: Be64,
}

/// `struct mlx5_wqe_inl_data_seg` (4 B header; the payload follows).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InlineHdr {
    /// `len | MLX5_INLINE_SEG`.
    pub byte_count: Be32,
}

/// `struct mlx5_cqe64` (64 B). For 128-byte CQEs it is the second half of
/// each slot (docs/spec/mlx5.md §8).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe64 {
    /// Reserved.
    pub rsvd0: [u8; 2],
    /// WQE id (striding RQ).
    pub wqe_id: Be16,
    /// Reserved.
    pub rsvd4: [u8; 13],
    /// Multipath / DLID path bits.
    pub ml_path: u8,
    /// Reserved.
    pub rsvd20: [u8; 4],
    /// Source LID.
    pub slid: Be16,
    /// GRH/L3 (29..28), SL (27..24), source QPN (23..0).
    pub flags_rqpn: Be32,
    /// Header-data split / IP extension.
    pub hds_ip_ext: u8,
    /// L4 header type etc.
    pub l4_hdr_type_etc: u8,
    /// VLAN info.
    pub vlan_info: Be16,
    /// SRQ number or user index (low 24 bits).
    pub srqn_uidx: Be32,
    /// Immediate (wire order), invalidated rkey, or pkey index.
    pub imm_inval_pkey: Be32,
    /// Tag matching.
    pub app: u8,
    /// Tag matching.
    pub app_op: u8,
    /// Tag matching.
    pub app_info: Be16,
    /// Bytes transferred.
    pub byte_cnt: Be32,
    /// Timestamp.
    pub timestamp: Be64,
    /// WQE opcode (31..24, requester) and QPN (23..0).
    pub sop_drop_qpn: Be32,
    /// WQE index.
    pub wqe_counter: Be16,
    /// Signature / compression iteration.
    pub signature: u8,
    /// Opcode (7..4), format (3..2), solicited (1), owner (0).
    pub op_own: u8,
}

/// `struct mlx5_err_cqe` (64 B, same slot as [`Cqe64`]).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrCqe {
    /// Reserved.
    pub rsvd0: [u8; 32],
    /// SRQ number.
    pub srqn: Be32,
    /// Reserved.
    pub rsvd1: [u8; 18],
    /// Vendor syndrome (passed through as `vendor_err`).
    pub vendor_err_synd: u8,
    /// Syndrome (mapped to a status).
    pub syndrome: u8,
    /// WQE opcode (31..24) and QPN.
    pub s_wqe_opcode_qpn: Be32,
    /// WQE index.
    pub wqe_counter: Be16,
    /// Signature.
    pub signature: u8,
    /// Opcode / owner.
    pub op_own: u8,
}

/// Mirror of `struct mlx5dv_qp` (96 B on LP64, docs/spec/mlx5.md §1): what
/// `mlx5dv_init_obj(MLX5DV_OBJ_QP)` returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Mlx5dvQp {
    /// QP doorbell record: `[0]` RQ counter, `[1]` SQ counter (big-endian).
    pub dbrec: *mut u32,
    /// SQ ring.
    pub sq_buf: *mut u8,
    /// SQ size in basic blocks (power of two).
    pub sq_wqe_cnt: u32,
    /// SQ stride (64).
    pub sq_stride: u32,
    /// RQ ring.
    pub rq_buf: *mut u8,
    /// RQ entries (power of two).
    pub rq_wqe_cnt: u32,
    /// RQ stride (power of two, ≥ 16).
    pub rq_stride: u32,
    /// Doorbell / BlueFlame register base (UAR mapping).
    pub bf_reg: *mut u8,
    /// BlueFlame buffer size; 0 = 8-byte doorbell only.
    pub bf_size: u32,
    /// `comp_mask` (in/out).
    pub comp_mask: u64,
    /// UAR mmap offset (`off_t`).
    pub uar_mmap_offset: i64,
    /// Raw-packet QPs only.
    pub tirn: u32,
    /// Raw-packet QPs only.
    pub tisn: u32,
    /// Raw-packet QPs only.
    pub rqn: u32,
    /// Raw-packet QPs only.
    pub sqn: u32,
    /// Raw-packet QPs only.
    pub tir_icm_addr: u64,
}

impl Mlx5dvQp {
    /// Every pointer null and every field 0 (no queue at all): the base of
    /// a descriptor that names only what its user fills in.
    pub const EMPTY: Mlx5dvQp = Mlx5dvQp {
        dbrec: core::ptr::null_mut(),
        sq_buf: core::ptr::null_mut(),
        sq_wqe_cnt: 0,
        sq_stride: 0,
        rq_buf: core::ptr::null_mut(),
        rq_wqe_cnt: 0,
        rq_stride: 0,
        bf_reg: core::ptr::null_mut(),
        bf_size: 0,
        comp_mask: 0,
        uar_mmap_offset: 0,
        tirn: 0,
        tisn: 0,
        rqn: 0,
        sqn: 0,
        tir_icm_addr: 0,
    };
}

/// Mirror of `struct mlx5dv_cq` (48 B): what `mlx5dv_init_obj(MLX5DV_OBJ_CQ)`
/// returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Mlx5dvCq {
    /// First CQE.
    pub buf: *mut u8,
    /// CQ doorbell record: `[0]` consumer index, `[1]` arm word.
    pub dbrec: *mut u32,
    /// Number of entries (power of two).
    pub cqe_cnt: u32,
    /// 64 or 128.
    pub cqe_size: u32,
    /// UAR page base for arming (register at +0x20).
    pub cq_uar: *mut u8,
    /// CQ number.
    pub cqn: u32,
    /// `comp_mask`.
    pub comp_mask: u64,
}

// docs/spec/mlx5.md §3 / docs/spec/mlx5.md §10: segment sizes, alignment and field offsets.
const_assert_eq!(size_of::<CtrlSeg>(), 16);
const_assert_eq!(align_of::<CtrlSeg>(), 4);
const_assert_eq!(offset_of!(CtrlSeg, opmod_idx_opcode), 0);
const_assert_eq!(offset_of!(CtrlSeg, qpn_ds), 4);
const_assert_eq!(offset_of!(CtrlSeg, signature), 8);
const_assert_eq!(offset_of!(CtrlSeg, dci_stream_channel_id), 9);
const_assert_eq!(offset_of!(CtrlSeg, fm_ce_se), 11);
const_assert_eq!(offset_of!(CtrlSeg, imm), 12);
const_assert_eq!(size_of::<RaddrSeg>(), 16);
const_assert_eq!(offset_of!(RaddrSeg, rkey), 8);
const_assert_eq!(offset_of!(RaddrSeg, reserved), 12);
const_assert_eq!(size_of::<DataSeg>(), 16);
const_assert_eq!(offset_of!(DataSeg, lkey), 4);
const_assert_eq!(offset_of!(DataSeg, addr), 8);
const_assert_eq!(size_of::<AtomicSeg>(), 16);
const_assert_eq!(offset_of!(AtomicSeg, compare), 8);
const_assert_eq!(size_of::<InlineHdr>(), 4);
// docs/spec/mlx5.md §8.
const_assert_eq!(size_of::<Cqe64>(), 64);
const_assert_eq!(align_of::<Cqe64>(), 8);
const_assert_eq!(offset_of!(Cqe64, wqe_id), 2);
const_assert_eq!(offset_of!(Cqe64, ml_path), 17);
const_assert_eq!(offset_of!(Cqe64, slid), 22);
const_assert_eq!(offset_of!(Cqe64, flags_rqpn), 24);
const_assert_eq!(offset_of!(Cqe64, hds_ip_ext), 28);
const_assert_eq!(offset_of!(Cqe64, vlan_info), 30);
const_assert_eq!(offset_of!(Cqe64, srqn_uidx), 32);
const_assert_eq!(offset_of!(Cqe64, imm_inval_pkey), 36);
const_assert_eq!(offset_of!(Cqe64, app), 40);
const_assert_eq!(offset_of!(Cqe64, app_info), 42);
const_assert_eq!(offset_of!(Cqe64, byte_cnt), 44);
const_assert_eq!(offset_of!(Cqe64, timestamp), 48);
const_assert_eq!(offset_of!(Cqe64, sop_drop_qpn), 56);
const_assert_eq!(offset_of!(Cqe64, wqe_counter), 60);
const_assert_eq!(offset_of!(Cqe64, signature), 62);
const_assert_eq!(offset_of!(Cqe64, op_own), 63);
const_assert_eq!(size_of::<ErrCqe>(), 64);
const_assert_eq!(offset_of!(ErrCqe, srqn), 32);
const_assert_eq!(offset_of!(ErrCqe, vendor_err_synd), 54);
const_assert_eq!(offset_of!(ErrCqe, syndrome), 55);
const_assert_eq!(offset_of!(ErrCqe, s_wqe_opcode_qpn), 56);
const_assert_eq!(offset_of!(ErrCqe, wqe_counter), 60);
const_assert_eq!(offset_of!(ErrCqe, op_own), 63);
// docs/spec/mlx5.md §1 (LP64).
#[cfg(target_pointer_width = "64")]
mod lp64 {
    use super::*;
    const_assert_eq!(size_of::<Mlx5dvQp>(), 96);
    const_assert_eq!(offset_of!(Mlx5dvQp, sq_buf), 8);
    const_assert_eq!(offset_of!(Mlx5dvQp, sq_wqe_cnt), 16);
    const_assert_eq!(offset_of!(Mlx5dvQp, sq_stride), 20);
    const_assert_eq!(offset_of!(Mlx5dvQp, rq_buf), 24);
    const_assert_eq!(offset_of!(Mlx5dvQp, rq_wqe_cnt), 32);
    const_assert_eq!(offset_of!(Mlx5dvQp, rq_stride), 36);
    const_assert_eq!(offset_of!(Mlx5dvQp, bf_reg), 40);
    const_assert_eq!(offset_of!(Mlx5dvQp, bf_size), 48);
    const_assert_eq!(offset_of!(Mlx5dvQp, comp_mask), 56);
    const_assert_eq!(offset_of!(Mlx5dvQp, uar_mmap_offset), 64);
    const_assert_eq!(offset_of!(Mlx5dvQp, tirn), 72);
    const_assert_eq!(offset_of!(Mlx5dvQp, sqn), 84);
    const_assert_eq!(offset_of!(Mlx5dvQp, tir_icm_addr), 88);
    const_assert_eq!(size_of::<Mlx5dvCq>(), 48);
    const_assert_eq!(offset_of!(Mlx5dvCq, dbrec), 8);
    const_assert_eq!(offset_of!(Mlx5dvCq, cqe_cnt), 16);
    const_assert_eq!(offset_of!(Mlx5dvCq, cqe_size), 20);
    const_assert_eq!(offset_of!(Mlx5dvCq, cq_uar), 24);
    const_assert_eq!(offset_of!(Mlx5dvCq, cqn), 32);
    const_assert_eq!(offset_of!(Mlx5dvCq, comp_mask), 40);
}
