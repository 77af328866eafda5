//! The mlx5 send queue: WQE formatting straight into the ring
//! (docs/spec/mlx5.md §2–§5), doorbells (docs/spec/mlx5.md §7) and send-queue accounting (docs/spec/mlx5.md §9).
//!
//! The producer counter `pi` counts 64-byte basic blocks (BBs) and runs
//! free; the WQE index written into the control segment and the doorbell
//! record is its low 16 bits. Free space is counted in BBs:
//! `wqe_cnt - (pi - retired)`. A completion for the WQE that starts at BB
//! `X` retires everything up to the end of that WQE, signaled or not.

mod check;
mod config;
mod doorbell;
mod drain;
mod retire;
mod ud;
mod wqe;

use core::ptr::NonNull;

use super::completion;
pub use super::completion::{QpState, Retired};
use super::layout::{ctrl_flags, Mlx5dvQp, SEND_WQE_BB};
use crate::error::{Error, Result};
use crate::wr::QpCaps;
pub use config::{BfPolicy, SqConfig, WrSlot};
pub use doorbell::SendBatch;
pub use ud::{
    flow_label_to_udp_sport, AhAttr, GlobalRoute, LinkLayer, Mlx5Av, UdDest, AV_GRH,
    EXTENDED_UD_AV, QP_QKEY, UD_HDR_DS,
};
pub(crate) use wqe::Plan;

/// Evaluates `$body` in one of several match arms chosen by the WR's
/// opcode and payload shape, so that each arm is compiled with that shape
/// known: the common shapes (one SGE, or inline, on the common opcodes)
/// get straight-line code even when the WR comes from a caller the
/// compiler cannot see into (a list, the C ABI). Where the shape is
/// already known at compile time, the match folds away. Uncommon shapes
/// share the generic arm.
macro_rules! by_shape {
    ($wr:expr, $body:expr) => {
        match (&$wr.op, &$wr.payload) {
            ($crate::wr::SendOp::Write { .. }, $crate::wr::Payload::Sges([_])) => $body,
            ($crate::wr::SendOp::Send, $crate::wr::Payload::Sges([_])) => $body,
            ($crate::wr::SendOp::Read { .. }, $crate::wr::Payload::Sges([_])) => $body,
            ($crate::wr::SendOp::WriteImm { .. }, $crate::wr::Payload::Sges([_])) => $body,
            ($crate::wr::SendOp::SendImm { .. }, $crate::wr::Payload::Sges([_])) => $body,
            ($crate::wr::SendOp::Write { .. }, $crate::wr::Payload::Inline(_)) => $body,
            ($crate::wr::SendOp::Send, $crate::wr::Payload::Inline(_)) => $body,
            _ => $body,
        }
    };
}
pub(crate) use by_shape;

/// An mlx5 send queue over caller-provided memory.
pub struct SendQueue {
    buf: NonNull<u8>,
    /// `wqe_cnt - 1` (BBs).
    mask: u32,
    /// `mask << 4`: masks `pi << 4` to the byte offset of BB `pi`'s
    /// side-table entry, which times 4 is the BB's byte offset in the ring
    /// (one index register serves both addresses).
    mask16: u32,
    wqe_cnt: u32,
    /// Free-running BB producer counter.
    pi: u32,
    /// Everything before this BB counter has completed.
    retired: u32,
    /// `wqe_cnt` while sends may be posted, 0 otherwise: one compare in the
    /// hot path covers both the space check and the state check.
    limit: u32,
    /// Producer counter after the last WQE that requests a CQE.
    last_signaled_end: u32,
    /// Unsignaled run (in BBs) that forces a CQE at the next doorbell.
    guard: u32,
    /// CQEs requested by the guard so far (wrapping; see
    /// [`SendQueue::forced_signals`]).
    forced: u32,
    dbrec: NonNull<u32>,
    bf_reg: NonNull<u8>,
    bf_size: u32,
    bf_offset: u32,
    /// `qpn << 8` as stored big-endian in the control segment.
    qpn_raw: u32,
    /// `qpn_raw` in bytes 4..7 of the control segment's first 8 bytes, as
    /// the native value of those 8 bytes (0 elsewhere): OR-ed into them
    /// with the WQE index, opcode and DS.
    qpn_ctrl8: u64,
    /// QP number (host order).
    qpn: u32,
    /// For each combination of the FENCE, SIGNALED and SOLICITED send
    /// flags, with the QP's `sig_all` CQ_UPDATE folded in: `[0]` is
    /// control-segment bytes 8..11 (`fm_ce_se` last, signature and
    /// reserved bytes 0) and `[1]` is side-table bytes 12..15 with only the
    /// flags byte set ([`WrSlot::VALID`], [`WrSlot::USER_SIGNALED`]), both
    /// as native values: one index turns a WR's flags into both words.
    flag_words: [[u32; 2]; 16],
    /// BlueFlame: largest DS a copy may carry, minus 1 (0: never).
    bf_ds_limit: u32,
    /// BlueFlame only for inline WQEs.
    bf_inline_only: bool,
    shared_register: bool,
    /// A UD queue ([`SendQueue::from_raw_ud`]): `limit` stays 0, so only
    /// [`SendQueue::post_ud`] writes WQEs.
    ud: bool,
    /// The doorbell may need more than the plain 8-byte store (a BlueFlame
    /// policy is on, or the register is shared): one test in the hot path
    /// sends such queues to [`SendQueue::ring_other`].
    db_other: bool,
    caps: QpCaps,
    state: QpState,
    wrid: NonNull<WrSlot>,
    /// WQEs written since the last doorbell.
    batch: u32,
    /// First BB of the last WQE written.
    last_start: u32,
    /// The last WQE written has an inline payload.
    last_inline: bool,
    /// The first failed WR since the last reset (cold; set by the poller).
    failure: Option<crate::wr::FailedWr>,
}

// SAFETY: the queue owns its ring, side table and doorbell words
// exclusively (constructor contract); moving it to another thread moves
// that ownership. It is not `Sync`: posting needs `&mut`.
unsafe impl Send for SendQueue {}

/// Size of the largest WQE this queue can build, in octowords.
pub(super) const fn max_ds(caps: &QpCaps) -> u32 {
    let sge = 2 + caps.max_send_sge;
    let inl = 2 + (4 + caps.max_inline_data).div_ceil(16);
    let atomic = 4;
    let m = if sge > inl { sge } else { inl };
    if m > atomic {
        m
    } else {
        atomic
    }
}

/// `fm_ce_se` for each combination of `IBV_SEND_FENCE` (1), `SIGNALED`
/// (2) and `SOLICITED` (4) (docs/spec/mlx5.md §3); the INLINE bit (8) is ignored.
const FM_CE_SE: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut f = 0;
    while f < 16 {
        let mut v = 0u8;
        if f & 1 != 0 {
            v |= ctrl_flags::FENCE;
        }
        if f & 2 != 0 {
            v |= ctrl_flags::CQ_UPDATE;
        }
        if f & 4 != 0 {
            v |= ctrl_flags::SOLICITED;
        }
        t[f] = v;
        f += 1;
    }
    t
};

/// [`SendQueue::flag_words`] for a QP with or without `sig_all`.
pub(super) const fn flag_words(sig_all: bool) -> [[u32; 2]; 16] {
    let mut t = [[0u32; 2]; 16];
    let mut f = 0;
    while f < 16 {
        let mut v = FM_CE_SE[f];
        if sig_all {
            v |= ctrl_flags::CQ_UPDATE;
        }
        let mut slot = WrSlot::VALID;
        if v & ctrl_flags::CQ_UPDATE != 0 {
            slot |= WrSlot::USER_SIGNALED;
        }
        t[f] = [byte3(v), byte3(slot)];
        f += 1;
    }
    t
}

/// The bytes `[0, 0, 0, b]` as a native 32-bit value.
#[inline(always)]
const fn byte3(b: u8) -> u32 {
    u32::from_ne_bytes([0, 0, 0, b])
}

impl SendQueue {
    /// Wraps a send queue described by `mlx5dv_init_obj` fields.
    ///
    /// # Safety
    /// - `qp.sq_buf` points to `qp.sq_wqe_cnt * 64` bytes that only this
    ///   queue writes (the device reads them) for the queue's life.
    /// - `qp.dbrec` points to the QP's two doorbell-record words, valid for
    ///   the queue's life; the SQ word (`[1]`) is written only by this queue.
    /// - `qp.bf_reg` points to the doorbell register pair (two buffers of
    ///   `max(bf_size, 64)` bytes) that only this queue writes.
    /// - `wrid` points to `wqe_cnt` slots owned by this queue.
    /// - Every SGE later posted names memory the device may access as the
    ///   operation requires, until its completion (the device writes READ
    ///   and atomic results and scatters received data there).
    pub unsafe fn from_raw(
        qp: &Mlx5dvQp,
        qpn: u32,
        caps: QpCaps,
        cfg: SqConfig,
        wrid: NonNull<WrSlot>,
        wrid_len: usize,
    ) -> Result<SendQueue> {
        let cnt = qp.sq_wqe_cnt;
        if cnt == 0 || !cnt.is_power_of_two() || qp.sq_stride != SEND_WQE_BB || cnt > 1 << 15 {
            return Err(Error::InvalidGeometry);
        }
        if qpn >= 1 << 24 {
            return Err(Error::InvalidQpn);
        }
        let buf = NonNull::new(qp.sq_buf).ok_or(Error::InvalidGeometry)?;
        let dbrec = NonNull::new(qp.dbrec).ok_or(Error::InvalidGeometry)?;
        let bf_reg = NonNull::new(qp.bf_reg).ok_or(Error::InvalidGeometry)?;
        if buf.as_ptr() as usize % 64 != 0
            || dbrec.as_ptr() as usize % 4 != 0
            || bf_reg.as_ptr() as usize % 8 != 0
            || qp.bf_size % 64 != 0
        {
            return Err(Error::InvalidGeometry);
        }
        SendQueue::check_caps(&caps)?;
        let mds = max_ds(&caps);
        let max_nbb = mds.div_ceil(4);
        if max_nbb > cnt {
            return Err(Error::InvalidGeometry);
        }
        if wrid_len < cnt as usize {
            return Err(Error::StorageTooSmall);
        }
        let bf_ds_limit = match cfg.bf_policy {
            BfPolicy::Never => 0,
            _ => (qp.bf_size / 16).saturating_sub(1),
        };
        Ok(SendQueue {
            buf,
            mask: cnt - 1,
            mask16: (cnt - 1) << 4,
            wqe_cnt: cnt,
            pi: 0,
            retired: 0,
            limit: cnt,
            last_signaled_end: 0,
            // The unsignaled run that remains after a doorbell is below
            // `guard`, so with no CQE pending at least `cnt - guard + 1 >
            // max_nbb` BBs are free: the largest WQE always fits (docs/spec/mlx5.md §9).
            guard: (cnt / 2).min(cnt - max_nbb).max(1),
            forced: 0,
            // SAFETY: the record has two words (contract); SND_DBR = 1.
            dbrec: unsafe { dbrec.add(super::layout::SND_DBR) },
            bf_reg,
            bf_size: qp.bf_size,
            bf_offset: 0,
            qpn_raw: (qpn << 8).to_be(),
            qpn_ctrl8: wqe::pack2(0, (qpn << 8).to_be()),
            qpn,
            flag_words: flag_words(cfg.sig_all),
            bf_ds_limit,
            bf_inline_only: cfg.bf_policy == BfPolicy::SingleInlineWqe,
            shared_register: cfg.shared_register,
            ud: false,
            db_other: bf_ds_limit != 0 || cfg.shared_register,
            caps,
            state: QpState::Rts,
            wrid,
            batch: 0,
            last_start: 0,
            last_inline: false,
            failure: None,
        })
    }

    /// QP number.
    #[inline]
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Ring size in BBs.
    #[inline]
    pub fn wqe_cnt(&self) -> u32 {
        self.wqe_cnt
    }
    /// The producer counter (BBs, free-running).
    #[inline]
    pub fn producer(&self) -> u32 {
        self.pi
    }
    /// The retirement counter (BBs, free-running).
    #[inline]
    pub fn retired(&self) -> u32 {
        self.retired
    }
    /// Free BBs.
    #[inline]
    pub fn free_bbs(&self) -> u32 {
        self.wqe_cnt - self.pi.wrapping_sub(self.retired)
    }
    /// BlueFlame offset the next doorbell will use (0 or `bf_size`).
    #[inline]
    pub fn bf_offset(&self) -> u32 {
        self.bf_offset
    }
    /// Capabilities.
    #[inline]
    pub fn caps(&self) -> &QpCaps {
        &self.caps
    }
    /// Current state.
    #[inline]
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Records a QP state change made by the control path.
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
        self.limit = if s.can_send() && !self.ud {
            self.wqe_cnt
        } else {
            0
        };
    }
    /// Ring base (for the software device and tests).
    #[inline]
    pub fn ring_ptr(&self) -> *mut u8 {
        self.buf.as_ptr()
    }

    /// Resets the counters to `pi` with nothing outstanding, as after the
    /// QP moved through RESET (docs/spec/mlx5.md §7, "QP reset"). Pending
    /// (un-rung) WQEs are dropped.
    pub fn reset_counters(&mut self, pi: u32) {
        self.pi = pi;
        self.retired = pi;
        self.last_signaled_end = pi;
        self.batch = 0;
        self.failure = None;
    }

    /// Sets the BlueFlame offset (0 or `bf_size`); for resynchronising with
    /// another owner of the register.
    pub fn set_bf_offset(&mut self, off: u32) {
        self.bf_offset = if off != 0 { self.bf_size } else { 0 };
    }

    /// Largest WQE this queue builds, in BBs.
    pub(crate) fn max_wqe_bbs(&self) -> u32 {
        let ud_extra = if self.ud { ud::UD_HDR_DS } else { 0 };
        (max_ds(&self.caps) + ud_extra).div_ceil(4)
    }
    /// How many CQEs the signalling guard has requested on unsignaled
    /// WQEs so far (wrapping). Each adds one completion to the CQ that the
    /// poller consumes without reporting; at most one per doorbell.
    pub fn forced_signals(&self) -> u32 {
        self.forced
    }

    /// Unsignaled run (BBs) that forces a CQE at the next doorbell.
    pub(crate) fn signal_guard(&self) -> u32 {
        self.guard
    }
    /// The SQ doorbell-record word.
    pub(crate) fn dbrec_sq(&self) -> NonNull<u32> {
        self.dbrec
    }
    /// The doorbell register pair.
    pub(crate) fn bf_reg(&self) -> NonNull<u8> {
        self.bf_reg
    }
    /// Pointer to octoword `i` (mod ring) of the ring.
    #[inline(always)]
    pub(crate) fn octo_ptr(&self, i: u32) -> *mut u8 {
        self.octo(i)
    }

    /// Pointer to octoword `i` (mod ring) of the ring.
    #[inline(always)]
    fn octo(&self, i: u32) -> *mut u8 {
        let off = (i & (self.mask << 2 | 3)) as usize * 16;
        // SAFETY: off < wqe_cnt * 64 = ring size (constructor contract).
        unsafe { self.buf.as_ptr().add(off) }
    }
}
