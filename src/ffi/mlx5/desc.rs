//! The queue descriptions C passes in (`mlx5dv_init_obj` fields, QP
//! capabilities) and the queue flags, mirrored on the core types.

use core::mem::{align_of, offset_of, size_of};

use static_assertions::const_assert_eq;

use crate::ffi::status::rdd_status;
use crate::provider::mlx5::{BfPolicy, Mlx5dvCq, Mlx5dvQp, SqConfig};
use crate::wr::QpCaps;

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
    pub(super) fn to_core(self) -> Mlx5dvQp {
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
    pub(super) fn to_core(self) -> Mlx5dvCq {
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
    pub(super) fn to_core(self) -> QpCaps {
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

pub(super) fn sq_config(flags: u32) -> Result<SqConfig, rdd_status> {
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
