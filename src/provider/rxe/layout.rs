//! Hand-written rxe (Soft-RoCE) layouts of the user-mapped queues
//! (docs/spec/rxe.md §2–§5), with compile-time size, alignment and offset
//! checks.
//!
//! Every field is host-endian (the kernel and the process share the CPU),
//! except the immediate data of a send WQE and of a completion, which is
//! carried as given on the wire (big-endian).

use core::mem::{align_of, offset_of, size_of};
use static_assertions::{assert_eq_size, const_assert, const_assert_eq};

use crate::wr::Sge;

/// Bytes of the shared header in front of the element array (docs/spec/rxe.md §2).
pub const HEADER_SIZE: usize = 384;
/// Offset of the producer index in the header (docs/spec/rxe.md §2).
pub const PRODUCER_OFFSET: usize = offset_of!(RxeQueueHeader, producer_index);
/// Offset of the consumer index in the header (docs/spec/rxe.md §2).
pub const CONSUMER_OFFSET: usize = offset_of!(RxeQueueHeader, consumer_index);
/// Largest `log2_elem_size` accepted from the kernel (64 KiB elements;
/// real send WQEs are at most a few KiB).
pub const LOG2_ELEM_MAX: u32 = 16;
/// Largest ring accepted from the kernel (`index_mask + 1`).
pub const MAX_SLOTS: u32 = 1 << 24;
/// Offset of the SGE array or inline payload in a send WQE (docs/spec/rxe.md §3).
pub const SEND_PAYLOAD_OFFSET: usize = size_of::<RxeSendWqe>();
/// Offset of the SGE array in a receive WQE (docs/spec/rxe.md §4).
pub const RECV_SGE_OFFSET: usize = size_of::<RxeRecvWqe>();
/// Size of one SGE in a WQE (`struct rxe_sge`, same as `ibv_sge`).
pub const SGE_SIZE: usize = size_of::<Sge>();

/// Send opcodes, `IB_UVERBS_WR_*` numbering (docs/spec/rxe.md §3).
pub mod wr_opcode {
    /// RDMA WRITE.
    pub const RDMA_WRITE: u32 = 0;
    /// RDMA WRITE with immediate.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// SEND.
    pub const SEND: u32 = 2;
    /// SEND with immediate.
    pub const SEND_WITH_IMM: u32 = 3;
    /// RDMA READ.
    pub const RDMA_READ: u32 = 4;
    /// Atomic compare and swap.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// Atomic fetch and add.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// Local invalidate (not posted by this crate).
    pub const LOCAL_INV: u32 = 7;
    /// Bind memory window (not posted by this crate).
    pub const BIND_MW: u32 = 8;
    /// SEND with invalidate.
    pub const SEND_WITH_INV: u32 = 9;
}

/// `send_flags` bits, `IBV_SEND_*` numbering (docs/spec/rxe.md §3).
pub mod send_flags {
    /// Fence.
    pub const FENCE: u32 = 1;
    /// Request a completion.
    pub const SIGNALED: u32 = 2;
    /// Solicited event.
    pub const SOLICITED: u32 = 4;
    /// The payload is inline at offset 208.
    pub const INLINE: u32 = 8;
}

/// Completion opcodes, `IB_UVERBS_WC_*` (= `ibv_wc_opcode`) numbering
/// (docs/spec/rxe.md §5).
pub mod wc_opcode {
    /// SEND (also every error completion: the kernel leaves the opcode 0).
    pub const SEND: u32 = 0;
    /// RDMA WRITE (with or without immediate).
    pub const RDMA_WRITE: u32 = 1;
    /// RDMA READ.
    pub const RDMA_READ: u32 = 2;
    /// Atomic compare and swap.
    pub const COMP_SWAP: u32 = 3;
    /// Atomic fetch and add.
    pub const FETCH_ADD: u32 = 4;
    /// A memory window bound (BIND_MW).
    pub const BIND_MW: u32 = 5;
    /// A key invalidated (LOCAL_INV).
    pub const LOCAL_INV: u32 = 6;
    /// A receive consumed by SEND.
    pub const RECV: u32 = 128;
    /// A receive consumed by RDMA WRITE with immediate.
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// The kernel's `wc_flags` encoding in an rxe CQE (`enum ib_wc_flags`,
/// docs/spec/rxe.md §5). It differs from libibverbs' for the invalidate bit.
pub mod kernel_wc_flags {
    /// A GRH is present.
    pub const GRH: u32 = 1;
    /// `ex` holds immediate data.
    pub const WITH_IMM: u32 = 2;
    /// `ex` holds an invalidated rkey.
    pub const WITH_INVALIDATE: u32 = 4;
}

/// `struct rxe_queue_buf` without its flexible `data[]` (docs/spec/rxe.md §2):
/// the 384-byte header at the start of every rxe queue mapping. Only used
/// for its layout; the words are accessed as atomics through raw pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RxeQueueHeader {
    /// log2 of the element size (kernel, at create).
    pub log2_elem_size: u32,
    /// Slots − 1 (kernel, at create).
    pub index_mask: u32,
    /// Padding to the producer's cache line.
    pub pad_1: [u32; 30],
    /// Producer index, stored masked.
    pub producer_index: u32,
    /// Padding to the consumer's cache line.
    pub pad_2: [u32; 31],
    /// Consumer index, stored masked.
    pub consumer_index: u32,
    /// Padding to the element array.
    pub pad_3: [u32; 31],
}

/// The `rdma` member of the send WR union (docs/spec/rxe.md §3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeRdmaWr {
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Reserved, written 0.
    pub reserved: u32,
}

/// The `atomic` member of the send WR union (docs/spec/rxe.md §3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeAtomicWr {
    /// Remote virtual address (8-byte aligned).
    pub remote_addr: u64,
    /// Compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Swap value (CMP_AND_SWP).
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
    /// Reserved, written 0.
    pub reserved: u32,
}

/// The `mw` member of the `wr` union: a BIND_MW work request (32 B). The
/// kernel looks the window up by `mw_rkey` and the region by `mr_lkey`,
/// checks both keys are current, and gives the window the low byte of
/// `rkey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeMwWr {
    /// First byte bound (a virtual address in the region).
    pub addr: u64,
    /// Bytes bound.
    pub length: u64,
    /// The region's local key.
    pub mr_lkey: u32,
    /// The window's current key.
    pub mw_rkey: u32,
    /// The window's key after the bind.
    pub rkey: u32,
    /// `IB_ACCESS_*` rights granted through the window.
    pub access: u32,
}

/// The `ud` member of the `wr` union: a UD send (120 B, docs/spec/rxe.md
/// §8). The kernel finds the address by `ah_num` (an address handle of
/// the QP's PD, made with CREATE_AH); `av` is read only when `ah_num` is
/// 0, which this crate never posts, so it stays zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxeUdWr {
    /// Destination QP number (24 bits).
    pub remote_qpn: u32,
    /// Q_Key sent in the DETH, as it is (bit 31 is not interpreted).
    pub remote_qkey: u32,
    /// Unused by the kernel for user QPs.
    pub pkey_index: u16,
    /// Reserved.
    pub reserved: u16,
    /// The address handle's number (CREATE_AH's driver response).
    pub ah_num: u32,
    /// Padding.
    pub pad: [u32; 4],
    /// `struct rxe_av` (88 B), for old providers without `ah_num`.
    pub av: [u8; 88],
}

/// The 120-byte `wr` union of `struct rxe_send_wr` (docs/spec/rxe.md §3). Only
/// the members this crate writes are named; `raw` covers the rest
/// (flush).
#[repr(C)]
#[derive(Clone, Copy)]
pub union RxeWrUnion {
    /// RDMA READ/WRITE.
    pub rdma: RxeRdmaWr,
    /// Atomics.
    pub atomic: RxeAtomicWr,
    /// BIND_MW.
    pub mw: RxeMwWr,
    /// UD sends.
    pub ud: RxeUdWr,
    /// The whole union.
    pub raw: [u64; 15],
}

/// `struct rxe_send_wr` (144 B, docs/spec/rxe.md §3).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RxeSendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `num_sge` before the 6.1-era cleanup; unused by current kernels.
    /// Written with the SGE count so older kernels see the same value.
    pub reserved: u32,
    /// `IB_UVERBS_WR_*` opcode ([`wr_opcode`]).
    pub opcode: u32,
    /// `IBV_SEND_*` flags ([`send_flags`]).
    pub send_flags: u32,
    /// Immediate data (big-endian as given) or the rkey to invalidate.
    pub ex: u32,
    /// Operation-specific part.
    pub wr: RxeWrUnion,
}

/// `struct rxe_dma_info` without its flexible SGE/inline array (24 B,
/// docs/spec/rxe.md §3, §4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeDmaInfo {
    /// Total payload bytes.
    pub length: u32,
    /// Bytes left (= length when posted).
    pub resid: u32,
    /// Kernel cursor, 0 when posted.
    pub cur_sge: u32,
    /// SGEs that follow (0 for inline payloads).
    pub num_sge: u32,
    /// Kernel cursor, 0 when posted.
    pub sge_offset: u32,
    /// Reserved.
    pub reserved: u32,
}

/// `struct rxe_send_wqe` without its payload (208 B, docs/spec/rxe.md §3). The
/// SGEs or the inline payload follow at [`SEND_PAYLOAD_OFFSET`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RxeSendWqe {
    /// The work request.
    pub wr: RxeSendWr,
    /// Kernel scratch (completion status).
    pub status: u32,
    /// 0 (`wqe_state_posted`) when posted.
    pub state: u32,
    /// Remote address for RDMA and atomics: the kernel takes it from here.
    pub iova: u64,
    /// Kernel scratch (recomputed from the opcode).
    pub mask: u32,
    /// Kernel scratch.
    pub first_psn: u32,
    /// Kernel scratch.
    pub last_psn: u32,
    /// Kernel scratch.
    pub ack_length: u32,
    /// Kernel scratch.
    pub ssn: u32,
    /// Kernel scratch.
    pub has_rd_atomic: u32,
    /// Payload description.
    pub dma: RxeDmaInfo,
}

impl RxeSendWqe {
    /// An all-zero header.
    pub const ZERO: RxeSendWqe = RxeSendWqe {
        wr: RxeSendWr {
            wr_id: 0,
            reserved: 0,
            opcode: 0,
            send_flags: 0,
            ex: 0,
            wr: RxeWrUnion { raw: [0; 15] },
        },
        status: 0,
        state: 0,
        iova: 0,
        mask: 0,
        first_psn: 0,
        last_psn: 0,
        ack_length: 0,
        ssn: 0,
        has_rd_atomic: 0,
        dma: RxeDmaInfo {
            length: 0,
            resid: 0,
            cur_sge: 0,
            num_sge: 0,
            sge_offset: 0,
            reserved: 0,
        },
    };
}

/// `struct rxe_recv_wqe` without its SGEs (40 B, docs/spec/rxe.md §4). The SGEs
/// follow at [`RECV_SGE_OFFSET`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeRecvWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `num_sge` in older kernels; written with the SGE count.
    pub reserved: u32,
    /// Padding.
    pub padding: u32,
    /// Payload description.
    pub dma: RxeDmaInfo,
}

/// `struct ib_uverbs_wc` (48 B, docs/spec/rxe.md §5): the start of every rxe
/// CQ slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeUverbsWc {
    /// The WR's id.
    pub wr_id: u64,
    /// `ib_wc_status` (= `ibv_wc_status` numbering).
    pub status: u32,
    /// `IB_UVERBS_WC_*` opcode ([`wc_opcode`]).
    pub opcode: u32,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Immediate data (network order) or invalidated rkey (host order).
    pub ex: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD).
    pub src_qp: u32,
    /// Kernel `wc_flags` encoding ([`kernel_wc_flags`]).
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Port number.
    pub port_num: u8,
    /// Reserved.
    pub reserved: u8,
}

// docs/spec/rxe.md §2: the 384-byte header, producer and consumer on their own
// cache lines.
const_assert_eq!(size_of::<RxeQueueHeader>(), HEADER_SIZE);
const_assert_eq!(align_of::<RxeQueueHeader>(), 4);
const_assert_eq!(offset_of!(RxeQueueHeader, log2_elem_size), 0);
const_assert_eq!(offset_of!(RxeQueueHeader, index_mask), 4);
const_assert_eq!(offset_of!(RxeQueueHeader, producer_index), 128);
const_assert_eq!(offset_of!(RxeQueueHeader, consumer_index), 256);
// docs/spec/rxe.md §3: the send WR (144 B) and its union members.
const_assert_eq!(size_of::<RxeRdmaWr>(), 16);
const_assert_eq!(size_of::<RxeAtomicWr>(), 32);
const_assert_eq!(offset_of!(RxeAtomicWr, compare_add), 8);
const_assert_eq!(offset_of!(RxeAtomicWr, swap), 16);
const_assert_eq!(offset_of!(RxeAtomicWr, rkey), 24);
const_assert_eq!(size_of::<RxeMwWr>(), 32);
const_assert_eq!(offset_of!(RxeMwWr, length), 8);
const_assert_eq!(offset_of!(RxeMwWr, mr_lkey), 16);
const_assert_eq!(offset_of!(RxeMwWr, mw_rkey), 20);
const_assert_eq!(offset_of!(RxeMwWr, rkey), 24);
const_assert_eq!(offset_of!(RxeMwWr, access), 28);
const_assert_eq!(size_of::<RxeUdWr>(), 120);
const_assert_eq!(offset_of!(RxeUdWr, remote_qkey), 4);
const_assert_eq!(offset_of!(RxeUdWr, pkey_index), 8);
const_assert_eq!(offset_of!(RxeUdWr, ah_num), 12);
const_assert_eq!(offset_of!(RxeUdWr, av), 32);
assert_eq_size!(RxeWrUnion, [u8; 120]);
const_assert_eq!(size_of::<RxeSendWr>(), 144);
const_assert_eq!(align_of::<RxeSendWr>(), 8);
const_assert_eq!(offset_of!(RxeSendWr, reserved), 8);
const_assert_eq!(offset_of!(RxeSendWr, opcode), 12);
const_assert_eq!(offset_of!(RxeSendWr, send_flags), 16);
const_assert_eq!(offset_of!(RxeSendWr, ex), 20);
const_assert_eq!(offset_of!(RxeSendWr, wr), 24);
// docs/spec/rxe.md §3: the send WQE header (208 B).
const_assert_eq!(size_of::<RxeDmaInfo>(), 24);
const_assert_eq!(offset_of!(RxeDmaInfo, resid), 4);
const_assert_eq!(offset_of!(RxeDmaInfo, cur_sge), 8);
const_assert_eq!(offset_of!(RxeDmaInfo, num_sge), 12);
const_assert_eq!(offset_of!(RxeDmaInfo, sge_offset), 16);
const_assert_eq!(offset_of!(RxeDmaInfo, reserved), 20);
const_assert_eq!(size_of::<RxeSendWqe>(), 208);
const_assert_eq!(align_of::<RxeSendWqe>(), 8);
const_assert_eq!(offset_of!(RxeSendWqe, status), 144);
const_assert_eq!(offset_of!(RxeSendWqe, state), 148);
const_assert_eq!(offset_of!(RxeSendWqe, iova), 152);
const_assert_eq!(offset_of!(RxeSendWqe, mask), 160);
const_assert_eq!(offset_of!(RxeSendWqe, first_psn), 164);
const_assert_eq!(offset_of!(RxeSendWqe, has_rd_atomic), 180);
const_assert_eq!(offset_of!(RxeSendWqe, dma), 184);
// docs/spec/rxe.md §4: the receive WQE header (40 B).
const_assert_eq!(size_of::<RxeRecvWqe>(), 40);
const_assert_eq!(offset_of!(RxeRecvWqe, reserved), 8);
const_assert_eq!(offset_of!(RxeRecvWqe, padding), 12);
const_assert_eq!(offset_of!(RxeRecvWqe, dma), 16);
// `struct rxe_sge` = `ibv_sge` = the crate's `Sge` (docs/spec/rxe.md §3).
const_assert_eq!(SGE_SIZE, 16);
const_assert_eq!(offset_of!(Sge, length), 8);
const_assert_eq!(offset_of!(Sge, lkey), 12);
// docs/spec/rxe.md §5: `struct ib_uverbs_wc` (48 B).
const_assert_eq!(size_of::<RxeUverbsWc>(), 48);
const_assert_eq!(align_of::<RxeUverbsWc>(), 8);
const_assert_eq!(offset_of!(RxeUverbsWc, status), 8);
const_assert_eq!(offset_of!(RxeUverbsWc, opcode), 12);
const_assert_eq!(offset_of!(RxeUverbsWc, vendor_err), 16);
const_assert_eq!(offset_of!(RxeUverbsWc, byte_len), 20);
const_assert_eq!(offset_of!(RxeUverbsWc, ex), 24);
const_assert_eq!(offset_of!(RxeUverbsWc, qp_num), 28);
const_assert_eq!(offset_of!(RxeUverbsWc, src_qp), 32);
const_assert_eq!(offset_of!(RxeUverbsWc, wc_flags), 36);
const_assert_eq!(offset_of!(RxeUverbsWc, pkey_index), 40);
const_assert_eq!(offset_of!(RxeUverbsWc, slid), 42);
const_assert_eq!(offset_of!(RxeUverbsWc, sl), 44);
const_assert_eq!(offset_of!(RxeUverbsWc, dlid_path_bits), 45);
const_assert_eq!(offset_of!(RxeUverbsWc, port_num), 46);
// Every element is at least 8-aligned in the mapping: the header is a
// multiple of 8 and element sizes are powers of two >= the structs.
const_assert!(HEADER_SIZE % 8 == 0);
