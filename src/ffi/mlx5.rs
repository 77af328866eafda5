//! The raw mlx5 queue API: send, receive and completion queues over memory
//! described by `mlx5dv_init_obj`, with their handles in caller storage.
//!
//! This is the DPDK-style level: the caller owns the verbs objects (PD, CQ,
//! QP and their state transitions) and hands in the raw queue
//! descriptions; these functions format WQEs, ring doorbells and poll CQEs
//! with no allocation and no system calls.

use core::mem::{align_of, offset_of, size_of};
use core::ptr::NonNull;
use core::slice;

use static_assertions::{const_assert, const_assert_eq};

use crate::ffi::handle::{self, HandleStorage, Slot};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_recv, parse_send, rdd_recv_wr, rdd_wr, NO_PIECES};
use crate::provider::mlx5::cq::wc_flags;
use crate::provider::mlx5::{
    BfPolicy, CompletionQueue, CqRoute, Mlx5dvCq, Mlx5dvQp, QpQueues, RecvQueue, SendQueue,
    SqConfig, Wc, WcOpcode, WcStatus, WrSlot,
};
use crate::wr::{QpCaps, SendWr};

// ---------------------------------------------------------------------
// Handle storage
// ---------------------------------------------------------------------

/// Size in bytes of `rdd_mlx5_sq_storage`. Part of the ABI: it leaves room
/// for the send queue to grow without changing the C type.
pub const RDD_MLX5_SQ_STORAGE_SIZE: usize = 384;
/// Alignment in bytes of `rdd_mlx5_sq_storage`.
pub const RDD_MLX5_SQ_STORAGE_ALIGN: usize = 16;
/// Size in bytes of `rdd_mlx5_rq_storage`.
pub const RDD_MLX5_RQ_STORAGE_SIZE: usize = 128;
/// Alignment in bytes of `rdd_mlx5_rq_storage`.
pub const RDD_MLX5_RQ_STORAGE_ALIGN: usize = 16;
/// Size in bytes of `rdd_mlx5_cq_storage`.
pub const RDD_MLX5_CQ_STORAGE_SIZE: usize = 128;
/// Alignment in bytes of `rdd_mlx5_cq_storage`.
pub const RDD_MLX5_CQ_STORAGE_ALIGN: usize = 16;

/// Caller-provided storage for a send-queue handle. Declare one (static,
/// stack or heap; zero it so a use before `rdd_mlx5_sq_init` is detected),
/// initialise it with `rdd_mlx5_sq_init`, pass its address to the other
/// `rdd_mlx5_sq_*` calls, end with `rdd_mlx5_sq_fini`. Never copy or move
/// an initialised storage: the handle is bound to its address.
#[repr(C, align(16))]
pub struct rdd_mlx5_sq_storage {
    _opaque: [u8; RDD_MLX5_SQ_STORAGE_SIZE],
}

/// Caller-provided storage for a receive-queue handle (same rules as
/// `rdd_mlx5_sq_storage`).
#[repr(C, align(16))]
pub struct rdd_mlx5_rq_storage {
    _opaque: [u8; RDD_MLX5_RQ_STORAGE_SIZE],
}

/// Caller-provided storage for a completion-queue handle (same rules as
/// `rdd_mlx5_sq_storage`).
#[repr(C, align(16))]
pub struct rdd_mlx5_cq_storage {
    _opaque: [u8; RDD_MLX5_CQ_STORAGE_SIZE],
}

const_assert_eq!(size_of::<rdd_mlx5_sq_storage>(), RDD_MLX5_SQ_STORAGE_SIZE);
const_assert_eq!(align_of::<rdd_mlx5_sq_storage>(), RDD_MLX5_SQ_STORAGE_ALIGN);
const_assert!(size_of::<Slot<SendQueue>>() <= RDD_MLX5_SQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<SendQueue>>() <= RDD_MLX5_SQ_STORAGE_ALIGN);
const_assert_eq!(size_of::<rdd_mlx5_rq_storage>(), RDD_MLX5_RQ_STORAGE_SIZE);
const_assert_eq!(align_of::<rdd_mlx5_rq_storage>(), RDD_MLX5_RQ_STORAGE_ALIGN);
const_assert!(size_of::<Slot<RecvQueue>>() <= RDD_MLX5_RQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<RecvQueue>>() <= RDD_MLX5_RQ_STORAGE_ALIGN);
const_assert_eq!(size_of::<rdd_mlx5_cq_storage>(), RDD_MLX5_CQ_STORAGE_SIZE);
const_assert_eq!(align_of::<rdd_mlx5_cq_storage>(), RDD_MLX5_CQ_STORAGE_ALIGN);
const_assert!(size_of::<Slot<CompletionQueue>>() <= RDD_MLX5_CQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<CompletionQueue>>() <= RDD_MLX5_CQ_STORAGE_ALIGN);

// SAFETY: size and alignment are asserted above; the storage is a byte
// array; the tags are distinct.
unsafe impl HandleStorage for rdd_mlx5_sq_storage {
    type Value = SendQueue;
    const TAG: u64 = 0x5244_445f_4d35_5351; // "RDD_M5SQ"
}

// SAFETY: as above.
unsafe impl HandleStorage for rdd_mlx5_rq_storage {
    type Value = RecvQueue;
    const TAG: u64 = 0x5244_445f_4d35_5251; // "RDD_M5RQ"
}

// SAFETY: as above.
unsafe impl HandleStorage for rdd_mlx5_cq_storage {
    type Value = CompletionQueue;
    const TAG: u64 = 0x5244_445f_4d35_4351; // "RDD_M5CQ"
}

/// One entry of a send queue's side table (one per basic block of the
/// ring): caller-provided memory the send queue writes at post time and
/// reads at completion time. Its content is private.
#[repr(C)]
pub struct rdd_mlx5_sq_slot {
    _opaque: [u64; 2],
}

const_assert_eq!(size_of::<rdd_mlx5_sq_slot>(), size_of::<WrSlot>());
const_assert_eq!(align_of::<rdd_mlx5_sq_slot>(), align_of::<WrSlot>());

// ---------------------------------------------------------------------
// Queue descriptions
// ---------------------------------------------------------------------

/// The fields of `struct mlx5dv_qp` (`mlx5dv_init_obj(MLX5DV_OBJ_QP)`),
/// flattened but laid out identically on LP64, so a `struct mlx5dv_qp *`
/// may be passed by casting it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_mlx5dv_qp {
    /// QP doorbell record: `[0]` RQ counter, `[1]` SQ counter (big-endian).
    pub dbrec: *mut u32,
    /// SQ ring (`sq.buf`), 64-byte aligned.
    pub sq_buf: *mut u8,
    /// SQ size in 64-byte basic blocks (`sq.wqe_cnt`, power of two).
    pub sq_wqe_cnt: u32,
    /// SQ stride (`sq.stride`, 64).
    pub sq_stride: u32,
    /// RQ ring (`rq.buf`).
    pub rq_buf: *mut u8,
    /// RQ entries (`rq.wqe_cnt`, power of two).
    pub rq_wqe_cnt: u32,
    /// RQ stride (`rq.stride`, power of two, at least 16).
    pub rq_stride: u32,
    /// Doorbell / BlueFlame register pair (`bf.reg`).
    pub bf_reg: *mut u8,
    /// BlueFlame buffer size (`bf.size`); 0 = 8-byte doorbell only.
    pub bf_size: u32,
    /// `comp_mask` (unused here).
    pub comp_mask: u64,
    /// UAR mmap offset (unused here).
    pub uar_mmap_offset: i64,
    /// Raw-packet QPs only (unused here).
    pub tirn: u32,
    /// Raw-packet QPs only (unused here).
    pub tisn: u32,
    /// Raw-packet QPs only (unused here).
    pub rqn: u32,
    /// Raw-packet QPs only (unused here).
    pub sqn: u32,
    /// Raw-packet QPs only (unused here).
    pub tir_icm_addr: u64,
}

const_assert_eq!(size_of::<rdd_mlx5dv_qp>(), size_of::<Mlx5dvQp>());
const_assert_eq!(align_of::<rdd_mlx5dv_qp>(), align_of::<Mlx5dvQp>());
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, sq_buf),
    offset_of!(Mlx5dvQp, sq_buf)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, sq_wqe_cnt),
    offset_of!(Mlx5dvQp, sq_wqe_cnt)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, sq_stride),
    offset_of!(Mlx5dvQp, sq_stride)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, rq_buf),
    offset_of!(Mlx5dvQp, rq_buf)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, rq_wqe_cnt),
    offset_of!(Mlx5dvQp, rq_wqe_cnt)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, rq_stride),
    offset_of!(Mlx5dvQp, rq_stride)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, bf_reg),
    offset_of!(Mlx5dvQp, bf_reg)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, bf_size),
    offset_of!(Mlx5dvQp, bf_size)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, comp_mask),
    offset_of!(Mlx5dvQp, comp_mask)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_qp, tir_icm_addr),
    offset_of!(Mlx5dvQp, tir_icm_addr)
);
#[cfg(target_pointer_width = "64")]
const_assert_eq!(size_of::<rdd_mlx5dv_qp>(), 96);

impl rdd_mlx5dv_qp {
    fn to_core(self) -> Mlx5dvQp {
        Mlx5dvQp {
            dbrec: self.dbrec,
            sq_buf: self.sq_buf,
            sq_wqe_cnt: self.sq_wqe_cnt,
            sq_stride: self.sq_stride,
            rq_buf: self.rq_buf,
            rq_wqe_cnt: self.rq_wqe_cnt,
            rq_stride: self.rq_stride,
            bf_reg: self.bf_reg,
            bf_size: self.bf_size,
            comp_mask: self.comp_mask,
            uar_mmap_offset: self.uar_mmap_offset,
            tirn: self.tirn,
            tisn: self.tisn,
            rqn: self.rqn,
            sqn: self.sqn,
            tir_icm_addr: self.tir_icm_addr,
        }
    }
}

/// For Rust callers that hold the core's descriptor (tests, benches).
impl From<Mlx5dvQp> for rdd_mlx5dv_qp {
    fn from(q: Mlx5dvQp) -> rdd_mlx5dv_qp {
        rdd_mlx5dv_qp {
            dbrec: q.dbrec,
            sq_buf: q.sq_buf,
            sq_wqe_cnt: q.sq_wqe_cnt,
            sq_stride: q.sq_stride,
            rq_buf: q.rq_buf,
            rq_wqe_cnt: q.rq_wqe_cnt,
            rq_stride: q.rq_stride,
            bf_reg: q.bf_reg,
            bf_size: q.bf_size,
            comp_mask: q.comp_mask,
            uar_mmap_offset: q.uar_mmap_offset,
            tirn: q.tirn,
            tisn: q.tisn,
            rqn: q.rqn,
            sqn: q.sqn,
            tir_icm_addr: q.tir_icm_addr,
        }
    }
}

/// The fields of `struct mlx5dv_cq` (`mlx5dv_init_obj(MLX5DV_OBJ_CQ)`),
/// laid out identically on LP64.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_mlx5dv_cq {
    /// First CQE, 64-byte aligned.
    pub buf: *mut u8,
    /// CQ doorbell record: `[0]` consumer index, `[1]` arm word.
    pub dbrec: *mut u32,
    /// Number of entries (power of two, at least 2).
    pub cqe_cnt: u32,
    /// 64 or 128.
    pub cqe_size: u32,
    /// UAR page for arming (register at +0x20); may be NULL if the CQ is
    /// never armed.
    pub cq_uar: *mut u8,
    /// CQ number.
    pub cqn: u32,
    /// `comp_mask` (unused here).
    pub comp_mask: u64,
}

const_assert_eq!(size_of::<rdd_mlx5dv_cq>(), size_of::<Mlx5dvCq>());
const_assert_eq!(align_of::<rdd_mlx5dv_cq>(), align_of::<Mlx5dvCq>());
const_assert_eq!(
    offset_of!(rdd_mlx5dv_cq, dbrec),
    offset_of!(Mlx5dvCq, dbrec)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_cq, cqe_cnt),
    offset_of!(Mlx5dvCq, cqe_cnt)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_cq, cqe_size),
    offset_of!(Mlx5dvCq, cqe_size)
);
const_assert_eq!(
    offset_of!(rdd_mlx5dv_cq, cq_uar),
    offset_of!(Mlx5dvCq, cq_uar)
);
const_assert_eq!(offset_of!(rdd_mlx5dv_cq, cqn), offset_of!(Mlx5dvCq, cqn));
const_assert_eq!(
    offset_of!(rdd_mlx5dv_cq, comp_mask),
    offset_of!(Mlx5dvCq, comp_mask)
);
#[cfg(target_pointer_width = "64")]
const_assert_eq!(size_of::<rdd_mlx5dv_cq>(), 48);

impl rdd_mlx5dv_cq {
    fn to_core(self) -> Mlx5dvCq {
        Mlx5dvCq {
            buf: self.buf,
            dbrec: self.dbrec,
            cqe_cnt: self.cqe_cnt,
            cqe_size: self.cqe_size,
            cq_uar: self.cq_uar,
            cqn: self.cqn,
            comp_mask: self.comp_mask,
        }
    }
}

/// For Rust callers that hold the core's descriptor (tests, benches).
impl From<Mlx5dvCq> for rdd_mlx5dv_cq {
    fn from(c: Mlx5dvCq) -> rdd_mlx5dv_cq {
        rdd_mlx5dv_cq {
            buf: c.buf,
            dbrec: c.dbrec,
            cqe_cnt: c.cqe_cnt,
            cqe_size: c.cqe_size,
            cq_uar: c.cq_uar,
            cqn: c.cqn,
            comp_mask: c.comp_mask,
        }
    }
}

/// What the QP accepts, fixed at creation (the `ibv_qp_cap` values the
/// QP was actually created with).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_qp_caps {
    /// Most SGEs per send WR.
    pub max_send_sge: u32,
    /// Most inline payload bytes per send WR.
    pub max_inline_data: u32,
    /// Most SGEs per receive WR.
    pub max_recv_sge: u32,
}

impl rdd_qp_caps {
    fn to_core(self) -> QpCaps {
        QpCaps {
            max_send_sge: self.max_send_sge,
            max_inline_data: self.max_inline_data,
            max_recv_sge: self.max_recv_sge,
        }
    }
}

/// `rdd_mlx5_sq_init` flag: the QP was created with `sq_sig_all`; every
/// WQE requests a completion.
pub const RDD_MLX5_SQ_SIG_ALL: u32 = 0x1;
/// `rdd_mlx5_sq_init` flag: the doorbell register is shared with other
/// QPs/threads; flush write-combining after every doorbell.
pub const RDD_MLX5_SQ_SHARED_REGISTER: u32 = 0x2;
/// `rdd_mlx5_sq_init` flag: never use BlueFlame, always the 8-byte
/// doorbell (`MLX5_SHUT_UP_BF=1`).
pub const RDD_MLX5_SQ_BF_NEVER: u32 = 0x4;
/// `rdd_mlx5_sq_init` flag: use BlueFlame only for single inline WQEs
/// (`MLX5_POST_SEND_PREFER_BF=0`). Without either BF flag, libmlx5's
/// default applies (BlueFlame for a single WQE that fits).
pub const RDD_MLX5_SQ_BF_INLINE_ONLY: u32 = 0x8;

/// `rdd_mlx5_cq_arm` flag: an event only for the next *solicited*
/// completion (default: the next completion).
pub const RDD_MLX5_CQ_ARM_SOLICITED: u32 = 0x1;

fn sq_config(flags: u32) -> Result<SqConfig, rdd_status> {
    const KNOWN: u32 = RDD_MLX5_SQ_SIG_ALL
        | RDD_MLX5_SQ_SHARED_REGISTER
        | RDD_MLX5_SQ_BF_NEVER
        | RDD_MLX5_SQ_BF_INLINE_ONLY;
    if flags & !KNOWN != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    let bf_policy = match flags & (RDD_MLX5_SQ_BF_NEVER | RDD_MLX5_SQ_BF_INLINE_ONLY) {
        0 => BfPolicy::SingleWqe,
        RDD_MLX5_SQ_BF_NEVER => BfPolicy::Never,
        RDD_MLX5_SQ_BF_INLINE_ONLY => BfPolicy::SingleInlineWqe,
        _ => return Err(rdd_status::InvalidArgument),
    };
    Ok(SqConfig {
        bf_policy,
        sig_all: flags & RDD_MLX5_SQ_SIG_ALL != 0,
        shared_register: flags & RDD_MLX5_SQ_SHARED_REGISTER != 0,
    })
}

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
/// `rdd_wc.status`: remote aborted.
pub const RDD_WC_REM_ABORT_ERR: u32 = 16;
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

/// The route of a CQ that serves one QP, borrowing its two queues.
struct SingleQp<'q> {
    sq: &'q mut SendQueue,
    rq: &'q mut RecvQueue,
}

impl CqRoute for SingleQp<'_> {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        if qpn == self.sq.qpn() {
            Some(QpQueues {
                sq: &mut *self.sq,
                rq: &mut *self.rq,
            })
        } else {
            None
        }
    }
}

// ---------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------

/// Checks a C array parameter: non-NULL (`NULL_PARAMETER`), aligned for
/// `T` and small enough to address (`INVALID_ARGUMENT`).
#[inline(always)]
fn check_array<T>(p: *const T, n: usize) -> Result<(), rdd_status> {
    if p.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if p as usize % align_of::<T>() != 0 || n > isize::MAX as usize / size_of::<T>() {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Send queue
// ---------------------------------------------------------------------

/// Initialises a send-queue handle in `sq` over the SQ half of `qp`.
///
/// `qpn` is the QP number (24 bits), `caps` the capabilities the QP was
/// created with, `flags` a set of `RDD_MLX5_SQ_*` bits. `wrid` is a side
/// table of at least `qp->sq_wqe_cnt` slots that the handle uses for its
/// whole life. The queue starts in the ready-to-send state with empty
/// counters (the QP's SQ must be unused, as after creation or a reset).
///
/// On success the storage holds a live handle (any handle it held before
/// is forgotten). On failure the storage is not written. Errors:
/// `NULL_PARAMETER`; `INVALID_ARGUMENT` (misaligned `sq` or `wrid`,
/// unknown or contradictory flags); `INVALID_GEOMETRY`, `INVALID_QPN`,
/// `STORAGE_TOO_SMALL` from the queue checks.
///
/// # Safety
/// - `sq` is valid for writes of one `rdd_mlx5_sq_storage`; `qp` and
///   `caps` are valid for reads (they are copied; no alignment needed).
/// - The memory `qp` describes (SQ ring, doorbell record, BlueFlame
///   register pair) and `wrid[0..wrid_len]` stay valid, and are written by
///   no one else (the device only reads the ring), until
///   `rdd_mlx5_sq_fini`.
/// - Every SGE posted later names memory the device may access as the
///   operation requires until its completion.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_init(
    sq: *mut rdd_mlx5_sq_storage,
    qp: *const rdd_mlx5dv_qp,
    qpn: u32,
    caps: *const rdd_qp_caps,
    flags: u32,
    wrid: *mut rdd_mlx5_sq_slot,
    wrid_len: usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(sq, qp, caps);
        try_status!(check_array(wrid.cast_const(), wrid_len));
        let cfg = try_status!(sq_config(flags));
        // SAFETY: non-NULL and readable (caller contract); unaligned reads
        // copy the descriptions without an alignment requirement.
        let (qp, caps) = unsafe { (qp.read_unaligned(), caps.read_unaligned()) };
        let Some(wrid) = NonNull::new(wrid.cast::<WrSlot>()) else {
            return rdd_status::NullParameter;
        };
        // SAFETY: the memory contract of `SendQueue::from_raw` is the
        // caller's (see `# Safety`); `rdd_mlx5_sq_slot` has the layout of
        // `WrSlot` (asserted) and the pointer is aligned (checked).
        let queue = match unsafe {
            SendQueue::from_raw(&qp.to_core(), qpn, caps.to_core(), cfg, wrid, wrid_len)
        } {
            Ok(q) => q,
            Err(e) => return e.into(),
        };
        // SAFETY: `sq` is non-NULL and valid for writes (caller contract).
        try_status!(unsafe { handle::install(sq, queue) });
        rdd_status::Ok
    })
}

/// Finalises a send-queue handle: the storage is zeroed and any further
/// use returns `INVALID_HANDLE`. WQEs already posted stay in the ring (the
/// QP itself is the caller's to destroy or reset).
///
/// # Safety
/// `sq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_sq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_fini(sq: *mut rdd_mlx5_sq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(sq) });
        rdd_status::Ok
    })
}

/// Writes one WQE per work request of `wrs[0..n]` into the send ring
/// without ringing the doorbell; call `rdd_mlx5_sq_ring` after one or more
/// posts to hand them to the device.
///
/// Stops at the first request that is rejected: the requests before it
/// are written (pending the doorbell), the rejected one and those after it
/// are not, and the queue is exactly as if the rejected one had never been
/// passed; its status is returned (a work-request, queue-state or
/// `INVALID_ARGUMENT` status).
///
/// `*out_bad_index` is written exactly when the status is not `OK`,
/// `NULL_PARAMETER` or `INVALID_HANDLE`: it is the index of the first
/// request that was not posted (0 when the `wrs` array itself is misaligned
/// or too large to address, `INVALID_ARGUMENT`). On `OK` all `n` were
/// posted and it is not written; on `NULL_PARAMETER` and `INVALID_HANDLE`
/// nothing was posted.
///
/// # Safety
/// - `sq` as for `rdd_mlx5_sq_fini`; `wrs` points to `n` readable
///   `rdd_wr`; `out_bad_index` is valid for a write.
/// - Each request's `sg_list` points to `num_sge` readable entries. For
///   RDD_SEND_INLINE their `addr`/`length` are readable payload bytes
///   (copied before return, so they may be reused at once) outside the
///   send ring; otherwise they name registered memory the device may
///   access until the request completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_post(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { send_post_args(sq, wrs, n, out_bad_index) });
        let post = |swr: &SendWr<'_>| {
            // SAFETY: the posting contract is the caller's.
            unsafe { queue.post(swr) }
        };
        // SAFETY: `wrs` holds `n` readable requests (checked /
        // contract); the SGE and payload contracts are the caller's.
        let failed = unsafe { post_each(wrs, n, post) };
        // SAFETY: `out_bad_index` is non-NULL (checked) and writable.
        unsafe { send_post_status(failed, out_bad_index) }
    })
}

/// The argument checks of the send posts: the handle, then `wrs` and
/// `out_bad_index` (a bad `wrs` array writes index 0, as documented).
///
/// # Safety
/// The caller contract of `rdd_mlx5_sq_post`.
#[inline(always)]
unsafe fn send_post_args<'a>(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> Result<&'a mut SendQueue, rdd_status> {
    if out_bad_index.is_null() {
        return Err(rdd_status::NullParameter);
    }
    // SAFETY: caller contract on `sq`.
    let queue = unsafe { handle::get(sq) }?;
    if wrs.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if let Err(status) = check_array(wrs, n) {
        // SAFETY: non-NULL (checked), valid for a write (contract).
        unsafe { out_bad_index.write_unaligned(0) };
        return Err(status);
    }
    Ok(queue)
}

/// Translates `wrs[0..n]` one by one and hands each to `post`; stops at
/// the first rejected one and returns its index and status.
///
/// # Safety
/// `wrs` points to `n` readable requests; the SGE and payload contract of
/// [`parse_send`] holds for each.
#[inline(always)]
unsafe fn post_each(
    wrs: *const rdd_wr,
    n: usize,
    mut post: impl FnMut(&SendWr<'_>) -> crate::Result<()>,
) -> Option<(usize, rdd_status)> {
    let mut pieces = NO_PIECES;
    for i in 0..n {
        // SAFETY: i < n, inside the caller's array.
        let wr = unsafe { &*wrs.add(i) };
        // SAFETY: forwarded contract.
        let posted = match unsafe { parse_send(wr, &mut pieces) } {
            Ok(swr) => post(&swr).map_err(rdd_status::from),
            Err(s) => Err(s),
        };
        if let Err(status) = posted {
            return Some((i, status));
        }
    }
    None
}

/// The status of a send post, writing the rejected request's index.
///
/// # Safety
/// `out_bad_index` is non-NULL and valid for a write.
#[inline(always)]
unsafe fn send_post_status(
    failed: Option<(usize, rdd_status)>,
    out_bad_index: *mut usize,
) -> rdd_status {
    match failed {
        None => rdd_status::Ok,
        Some((i, status)) => {
            // SAFETY: caller contract.
            unsafe { out_bad_index.write_unaligned(i) };
            status
        }
    }
}

/// Posts `wrs[0..n]` and rings the send doorbell once, in one call: the
/// `ibv_post_send` shape, and the cheapest way to post from C (one handle
/// check, and a single request takes the queue's one-WQE path). The
/// doorbell covers every WQE written since the last ring, this call's
/// and any left pending by `rdd_mlx5_sq_post`.
///
/// Stops at the first rejected request with the same rules as
/// `rdd_mlx5_sq_post` (including when `*out_bad_index` is written); the
/// requests before it are posted *and rung*.
///
/// # Safety
/// As for `rdd_mlx5_sq_post`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_post_ring(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { send_post_args(sq, wrs, n, out_bad_index) });
        let failed = if n == 1 {
            // One request: the queue's one-WQE path (it rings, covering
            // earlier pending WQEs, only if the request is posted).
            let post = |swr: &SendWr<'_>| {
                // SAFETY: the posting contract is the caller's.
                unsafe { queue.post_one(swr) }
            };
            // SAFETY: `wrs` holds one readable request (checked /
            // contract); the SGE and payload contracts are the caller's.
            let failed = unsafe { post_each(wrs, 1, post) };
            if failed.is_some() {
                queue.ring();
            }
            failed
        } else {
            let mut batch = queue.batch();
            let post = |swr: &SendWr<'_>| {
                // SAFETY: the posting contract is the caller's.
                unsafe { batch.post(swr) }
            };
            // SAFETY: `wrs` holds `n` readable requests (checked /
            // contract); the SGE and payload contracts are the caller's.
            let failed = unsafe { post_each(wrs, n, post) };
            batch.ring();
            failed
        };
        // SAFETY: `out_bad_index` is non-NULL (checked) and writable.
        unsafe { send_post_status(failed, out_bad_index) }
    })
}

/// Rings the send doorbell for every WQE posted since the last ring
/// (doorbell record, then one 8-byte doorbell or a BlueFlame copy).
/// Does nothing if nothing is pending.
///
/// # Safety
/// As for `rdd_mlx5_sq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_ring(sq: *mut rdd_mlx5_sq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let queue = try_status!(unsafe { handle::get(sq) });
        queue.ring();
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// Receive queue
// ---------------------------------------------------------------------

/// Initialises a receive-queue handle in `rq` over the RQ half of `qp`.
/// `wrid` is a table of at least `qp->rq_wqe_cnt` ids used for the
/// handle's whole life. Same storage and error rules as
/// `rdd_mlx5_sq_init`.
///
/// # Safety
/// - `rq` is valid for writes of one `rdd_mlx5_rq_storage`; `qp` and
///   `caps` are valid for reads.
/// - The RQ ring, the doorbell record's RQ word and `wrid[0..wrid_len]`
///   stay valid and are written by no one else until `rdd_mlx5_rq_fini`.
/// - Every SGE posted later names memory the device may write until the
///   receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_init(
    rq: *mut rdd_mlx5_rq_storage,
    qp: *const rdd_mlx5dv_qp,
    caps: *const rdd_qp_caps,
    wrid: *mut u64,
    wrid_len: usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(rq, qp, caps);
        try_status!(check_array(wrid.cast_const(), wrid_len));
        // SAFETY: non-NULL and readable (caller contract).
        let (qp, caps) = unsafe { (qp.read_unaligned(), caps.read_unaligned()) };
        let Some(wrid) = NonNull::new(wrid) else {
            return rdd_status::NullParameter;
        };
        // SAFETY: the memory contract is the caller's (see `# Safety`).
        let queue =
            match unsafe { RecvQueue::from_raw(&qp.to_core(), &caps.to_core(), wrid, wrid_len) } {
                Ok(q) => q,
                Err(e) => return e.into(),
            };
        // SAFETY: `rq` is non-NULL and valid for writes (caller contract).
        try_status!(unsafe { handle::install(rq, queue) });
        rdd_status::Ok
    })
}

/// Finalises a receive-queue handle (see `rdd_mlx5_sq_fini`).
///
/// # Safety
/// `rq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_rq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_fini(rq: *mut rdd_mlx5_rq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(rq) });
        rdd_status::Ok
    })
}

/// Posts receive work requests `wrs[0..n]` and publishes them in the
/// doorbell record (receives have no MMIO doorbell) before returning.
///
/// Stops at the first rejected request with the same rules as
/// `rdd_mlx5_sq_post` (including when `*out_bad_index` is written): the
/// ones before it are posted *and published*, and the queue is otherwise
/// untouched.
///
/// # Safety
/// - `rq` as for `rdd_mlx5_rq_fini`; `wrs` points to `n` readable
///   `rdd_recv_wr`; `out_bad_index` is valid for a write.
/// - Each `sg_list` points to `num_sge` readable entries naming memory the
///   device may write until the receive completes.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_rq_post(
    rq: *mut rdd_mlx5_rq_storage,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        // SAFETY: caller contract on `rq`.
        let queue = try_status!(unsafe { handle::get(rq) });
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), valid for a write (contract).
            unsafe { out_bad_index.write_unaligned(0) };
            return status;
        }
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned, with `n` readable
            // requests (checked / caller contract).
            let wr = unsafe { &*wrs.add(i) };
            // SAFETY: SGE contract forwarded from the caller.
            let posted = match unsafe { parse_recv(wr) } {
                // SAFETY: posting contract forwarded from the caller.
                Ok(rwr) => unsafe { queue.post(&rwr) }.map_err(rdd_status::from),
                Err(s) => Err(s),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), valid for a write (contract).
                unsafe { out_bad_index.write_unaligned(i) };
                result = status;
                break;
            }
        }
        queue.ring();
        result
    })
}

// ---------------------------------------------------------------------
// Completion queue
// ---------------------------------------------------------------------

/// Initialises a completion-queue handle in `cq` over the CQ `dv`
/// describes, with consumer index 0 (a CQ that nothing has polled yet;
/// its entries must be in their creation state: opcode INVALID, owner 0).
/// Same storage and error rules as `rdd_mlx5_sq_init`.
///
/// # Safety
/// `cq` is valid for writes of one `rdd_mlx5_cq_storage`; `dv` is valid
/// for reads. The CQ buffer, its doorbell record and (if not NULL) the UAR
/// page stay valid, and the record is written by no one else, until
/// `rdd_mlx5_cq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_init(
    cq: *mut rdd_mlx5_cq_storage,
    dv: *const rdd_mlx5dv_cq,
) -> rdd_status {
    ffi_boundary!({
        non_null!(cq, dv);
        // SAFETY: non-NULL and readable (caller contract).
        let dv = unsafe { dv.read_unaligned() };
        // SAFETY: the memory contract is the caller's (see `# Safety`).
        let queue = match unsafe { CompletionQueue::from_raw(&dv.to_core()) } {
            Ok(q) => q,
            Err(e) => return e.into(),
        };
        // SAFETY: `cq` is non-NULL and valid for writes (caller contract).
        try_status!(unsafe { handle::install(cq, queue) });
        rdd_status::Ok
    })
}

/// Finalises a completion-queue handle (see `rdd_mlx5_sq_fini`).
///
/// # Safety
/// `cq` is NULL or valid for reads and writes of one
/// `rdd_mlx5_cq_storage`, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_fini(cq: *mut rdd_mlx5_cq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        try_status!(unsafe { handle::clear(cq) });
        rdd_status::Ok
    })
}

/// Polls up to `n` completions of the QP whose queues are `sq` and `rq`
/// into `out[0..n]`, then updates the CQ's consumer-index record.
///
/// On `RDD_STATUS_OK`, `*out_count` (0..n) entries of `out` were written.
/// CQEs of other QP numbers are consumed and skipped (stale entries of a
/// destroyed QP); unsignaled send WQEs retire without an entry.
/// On `CQE_CORRUPT` (the first CQE was inconsistent; it was consumed) and
/// `CQE_COMPRESSED` (the CQ uses compression, unsupported; nothing
/// consumed) neither `out` nor `*out_count` is written; a corrupt CQE after
/// good ones is left for the next call, so no completion is lost.
///
/// # Safety
/// - `cq`, `sq`, `rq` as for their `_fini`; all three are used by this
///   call and must not be in use by another thread.
/// - `out` is valid for writes of `n` `rdd_wc`; `out_count` for a write.
/// - Scatter-to-CQE data is copied into the buffers of the completed
///   requests, which must still be valid (the posting contract).
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_poll(
    cq: *mut rdd_mlx5_cq_storage,
    sq: *mut rdd_mlx5_sq_storage,
    rq: *mut rdd_mlx5_rq_storage,
    out: *mut rdd_wc,
    n: usize,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        // SAFETY: caller contract on the three handles. They are distinct
        // objects: each storage kind has its own tag, so no two of these
        // references can alias.
        let (cq, sq, rq) = unsafe {
            (
                try_status!(handle::get(cq)),
                try_status!(handle::get(sq)),
                try_status!(handle::get(rq)),
            )
        };
        try_status!(check_array(out.cast_const(), n));
        // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
        // (checked / caller contract); `rdd_wc` has the layout of `Wc`
        // (asserted) and every bit pattern is a valid `Wc` (integers only).
        let out_wc = unsafe { slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let mut route = SingleQp { sq, rq };
        match cq.poll(&mut route, out_wc) {
            Ok(count) => {
                // SAFETY: non-NULL (checked), valid for a write (contract).
                unsafe { out_count.write_unaligned(count) };
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}

/// Arms the CQ: requests an event for the next completion, or with
/// `RDD_MLX5_CQ_ARM_SOLICITED` the next solicited one. Fails with
/// `INVALID_GEOMETRY` if the CQ was initialised without a UAR page, and
/// `INVALID_ARGUMENT` for unknown flag bits.
///
/// # Safety
/// As for `rdd_mlx5_cq_fini`; the UAR page given at init is still mapped.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_arm(cq: *mut rdd_mlx5_cq_storage, flags: u32) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let cq = try_status!(unsafe { handle::get(cq) });
        if flags & !RDD_MLX5_CQ_ARM_SOLICITED != 0 {
            return rdd_status::InvalidArgument;
        }
        match cq.arm(flags & RDD_MLX5_CQ_ARM_SOLICITED != 0) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}

/// Records that a completion event of this CQ was consumed (after
/// `ibv_get_cq_event`), so the next `rdd_mlx5_cq_arm` uses the next arm
/// sequence number.
///
/// # Safety
/// As for `rdd_mlx5_cq_fini`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_cq_event_consumed(cq: *mut rdd_mlx5_cq_storage) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let cq = try_status!(unsafe { handle::get(cq) });
        cq.event_consumed();
        rdd_status::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::wr::{
        rdd_sge, RDD_SEND_INLINE, RDD_SEND_SIGNALED, RDD_WR_RDMA_WRITE, RDD_WR_SEND,
    };
    use crate::testutil::{decode_wqe, FakeGeometry, FakeMlx5};
    use core::ptr;
    use std::boxed::Box;
    use std::vec;

    fn dv_qp(f: &FakeMlx5) -> rdd_mlx5dv_qp {
        f.dv_qp().into()
    }

    fn dv_cq(f: &FakeMlx5) -> rdd_mlx5dv_cq {
        f.dv_cq().into()
    }

    fn zeroed<T>() -> Box<T> {
        // SAFETY: the storage types are byte arrays: all zeroes is valid.
        unsafe { Box::new(core::mem::zeroed()) }
    }

    fn send_wr(opcode: u32, flags: u32, sg: &[rdd_sge]) -> rdd_wr {
        rdd_wr {
            wr_id: 0x1004,
            sg_list: sg.as_ptr(),
            num_sge: sg.len() as u32,
            opcode,
            flags,
            imm_data: 0,
            remote_addr: 0x7e00_1122_0000,
            rkey: 0x0bad_cafe,
            invalidate_rkey: 0,
            compare_add: 0,
            swap: 0,
        }
    }

    #[test]
    fn post_ring_poll_through_the_c_abi() {
        let geo = FakeGeometry::default();
        let mut f = FakeMlx5::new(geo);
        let qp = dv_qp(&f);
        let cqd = dv_cq(&f);
        let caps = rdd_qp_caps {
            max_send_sge: 4,
            max_inline_data: 60,
            max_recv_sge: geo.rq_stride / 16,
        };
        let mut sq = zeroed::<rdd_mlx5_sq_storage>();
        let mut rq = zeroed::<rdd_mlx5_rq_storage>();
        let mut cq = zeroed::<rdd_mlx5_cq_storage>();
        let mut slots: vec::Vec<rdd_mlx5_sq_slot> = (0..geo.sq_wqe_cnt)
            .map(|_| rdd_mlx5_sq_slot { _opaque: [0; 2] })
            .collect();
        let mut rq_ids = vec![0u64; geo.rq_wqe_cnt as usize];
        let mut bad = usize::MAX;
        let sge = [rdd_sge {
            addr: 0x7f5a_3c00_3000,
            length: 4096,
            lkey: 0xa1b2c3,
        }];
        let w = send_wr(RDD_WR_RDMA_WRITE, RDD_SEND_SIGNALED, &sge);

        // SAFETY: (whole test) every pointer is to live memory owned by
        // the test; `f` outlives the handles.
        unsafe {
            // Use before init.
            assert_eq!(
                rdd_mlx5_sq_post(&mut *sq, &w, 1, &mut bad),
                rdd_status::InvalidHandle
            );
            assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::InvalidHandle);
            assert_eq!(rdd_mlx5_sq_fini(&mut *sq), rdd_status::InvalidHandle);
            // Wrid table too small: storage untouched.
            let s = rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, 0, slots.as_mut_ptr(), 3);
            assert_eq!(s, rdd_status::StorageTooSmall);
            assert!(sq._opaque.iter().all(|&b| b == 0));
            let s = rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, 0x10, slots.as_mut_ptr(), 64);
            assert_eq!(s, rdd_status::InvalidArgument);
            let both = RDD_MLX5_SQ_BF_NEVER | RDD_MLX5_SQ_BF_INLINE_ONLY;
            let s = rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, both, slots.as_mut_ptr(), 64);
            assert_eq!(s, rdd_status::InvalidArgument);
            let s = rdd_mlx5_sq_init(
                &mut *sq,
                ptr::null(),
                geo.qpn,
                &caps,
                0,
                slots.as_mut_ptr(),
                64,
            );
            assert_eq!(s, rdd_status::NullParameter);

            let n = slots.len();
            assert_eq!(
                rdd_mlx5_sq_init(&mut *sq, &qp, geo.qpn, &caps, 0, slots.as_mut_ptr(), n),
                rdd_status::Ok
            );
            let n = rq_ids.len();
            assert_eq!(
                rdd_mlx5_rq_init(&mut *rq, &qp, &caps, rq_ids.as_mut_ptr(), n),
                rdd_status::Ok
            );
            assert_eq!(rdd_mlx5_cq_init(&mut *cq, &cqd), rdd_status::Ok);

            // A good WR, then one with an unknown opcode: index 1 reported,
            // the first one posted.
            let mut ws = [w, w];
            ws[1].opcode = 7;
            assert_eq!(
                rdd_mlx5_sq_post(&mut *sq, ws.as_ptr(), 2, &mut bad),
                rdd_status::InvalidOpcode
            );
            assert_eq!(bad, 1);
            assert_eq!(f.dbrec_sq(), 0, "post does not ring");
            assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::Ok);
            assert_eq!(f.dbrec_sq(), 1);
            let d = decode_wqe(f.sq_bytes(), 0).unwrap();
            assert_eq!((d.opcode, d.ds, d.qpn), (0x08, 3, geo.qpn));
            assert_eq!(d.sges, vec![(0x7f5a_3c00_3000, 4096, 0xa1b2c3)]);

            // Inline SEND.
            let payload = *b"hello";
            let isg = [rdd_sge {
                addr: payload.as_ptr() as u64,
                length: 5,
                lkey: 0,
            }];
            let iw = send_wr(RDD_WR_SEND, RDD_SEND_INLINE, &isg);
            bad = usize::MAX;
            assert_eq!(rdd_mlx5_sq_post(&mut *sq, &iw, 1, &mut bad), rdd_status::Ok);
            assert_eq!(bad, usize::MAX, "not written on success");
            assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::Ok);
            let d = decode_wqe(f.sq_bytes(), 1).unwrap();
            assert_eq!(d.inline.as_deref(), Some(&b"hello"[..]));

            // A receive.
            let rsg = [rdd_sge {
                addr: 0x5000,
                length: 256,
                lkey: 3,
            }];
            let rw = rdd_recv_wr {
                wr_id: 77,
                sg_list: rsg.as_ptr(),
                num_sge: 1,
                reserved: 0,
            };
            assert_eq!(rdd_mlx5_rq_post(&mut *rq, &rw, 1, &mut bad), rdd_status::Ok);
            assert_eq!(f.dbrec_rq(), 1);

            // Requester CQE for WQE 0 and a responder SEND_WITH_IMM.
            let mut cqe = [0u8; 64];
            cqe[56..60].copy_from_slice(&(0x0800_0000 | geo.qpn).to_be_bytes());
            f.write_cqe(0, &cqe);
            let mut cqe = [0u8; 64];
            cqe[36..40].copy_from_slice(&0x1234_5678u32.to_be_bytes());
            cqe[44..48].copy_from_slice(&5u32.to_be_bytes());
            cqe[56..60].copy_from_slice(&geo.qpn.to_be_bytes());
            cqe[63] = 0x30;
            f.write_cqe(1, &cqe);

            let mut wc = [rdd_wc::default(); 4];
            let mut count = usize::MAX;
            assert_eq!(
                rdd_mlx5_cq_poll(&mut *cq, &mut *sq, &mut *rq, wc.as_mut_ptr(), 4, &mut count),
                rdd_status::Ok
            );
            assert_eq!(count, 2);
            assert_eq!(
                (wc[0].wr_id, wc[0].opcode, wc[0].status),
                (0x1004, RDD_WC_OP_RDMA_WRITE, 0)
            );
            assert_eq!((wc[1].wr_id, wc[1].opcode), (77, RDD_WC_OP_RECV));
            assert_eq!((wc[1].imm_data, wc[1].byte_len), (0x1234_5678, 5));
            assert_eq!(wc[1].wc_flags, RDD_WC_FLAG_WITH_IMM);
            assert_eq!(f.dbrec_cq_ci(), 2);

            // Handles are not interchangeable, NULLs are caught.
            let sq_as_rq = (&mut *sq as *mut rdd_mlx5_sq_storage).cast::<rdd_mlx5_rq_storage>();
            assert_eq!(
                rdd_mlx5_cq_poll(&mut *cq, &mut *sq, sq_as_rq, wc.as_mut_ptr(), 4, &mut count),
                rdd_status::InvalidHandle
            );
            assert_eq!(
                rdd_mlx5_cq_poll(&mut *cq, &mut *sq, &mut *rq, ptr::null_mut(), 4, &mut count),
                rdd_status::NullParameter
            );
            assert_eq!(rdd_mlx5_cq_arm(&mut *cq, 2), rdd_status::InvalidArgument);
            assert_eq!(
                rdd_mlx5_cq_arm(&mut *cq, RDD_MLX5_CQ_ARM_SOLICITED),
                rdd_status::Ok
            );
            assert_eq!(rdd_mlx5_cq_event_consumed(&mut *cq), rdd_status::Ok);

            // A moved (copied) handle is rejected.
            let mut copy = zeroed::<rdd_mlx5_cq_storage>();
            ptr::copy_nonoverlapping(&*cq, &mut *copy, 1);
            assert_eq!(rdd_mlx5_cq_arm(&mut *copy, 0), rdd_status::InvalidHandle);

            // Fini, then every use fails.
            assert_eq!(rdd_mlx5_sq_fini(&mut *sq), rdd_status::Ok);
            assert!(sq._opaque.iter().all(|&b| b == 0));
            assert_eq!(rdd_mlx5_sq_ring(&mut *sq), rdd_status::InvalidHandle);
            assert_eq!(rdd_mlx5_sq_fini(&mut *sq), rdd_status::InvalidHandle);
            assert_eq!(rdd_mlx5_rq_fini(&mut *rq), rdd_status::Ok);
            assert_eq!(rdd_mlx5_cq_fini(&mut *cq), rdd_status::Ok);
            assert_eq!(rdd_mlx5_cq_fini(ptr::null_mut()), rdd_status::NullParameter);
        }
    }
}
