//! The mlx5 send queue: WQE formatting straight into the ring (reference
//! §A.2–A.5), doorbells (§A.7) and send-queue accounting (§A.9).
//!
//! The producer counter `pi` counts 64-byte basic blocks (BBs) and runs
//! free; the WQE index written into the control segment and the doorbell
//! record is its low 16 bits. Free space is counted in BBs:
//! `wqe_cnt - (pi - retired)`. A completion for the WQE that starts at BB
//! `X` retires everything up to the end of that WQE, signaled or not.

use core::ptr::NonNull;

pub use super::completion::{QpState, Retired};
use super::layout::{
    ctrl_flags, opcode, Be32, CtrlSeg, DataSeg, Mlx5dvQp, RaddrSeg, INLINE_SEG, MAX_DS, SEND_WQE_BB,
};
use crate::error::{Error, PostError, Result};
use crate::mmio;
use crate::wr::{Payload, QpCaps, SendOp, SendWr};

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

/// When to use BlueFlame instead of the 8-byte doorbell (reference §A.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BfPolicy {
    /// Never copy WQEs; always the 8-byte doorbell (`MLX5_SHUT_UP_BF=1`).
    Never,
    /// libmlx5's default: a doorbell that covers exactly one WQE with
    /// DS > 1 that fits the BlueFlame buffer is sent as a BlueFlame copy.
    /// Batches always use the 8-byte doorbell.
    SingleWqe,
    /// As `SingleWqe`, but only for inline WQEs
    /// (`MLX5_POST_SEND_PREFER_BF=0`).
    SingleInlineWqe,
}

/// Per-BB side-table entry (reference §A.9), written at post time and read
/// when a completion names the WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct WrSlot {
    /// The WR's id.
    pub wr_id: u64,
    /// Producer counter just after this WQE (retire up to here).
    pub end: u32,
    /// Low 16 bits of the producer counter at this WQE's first BB.
    pub start: u16,
    /// mlx5 opcode of the WQE.
    pub opcode: u8,
    /// [`WrSlot::USER_SIGNALED`] and friends.
    pub flags: u8,
}

impl WrSlot {
    /// The application asked for a completion (or the QP signals all).
    pub const USER_SIGNALED: u8 = 1;
    /// The slot holds the first BB of a posted WQE.
    pub const VALID: u8 = 2;
}

/// Tunables of a send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqConfig {
    /// BlueFlame policy.
    pub bf_policy: BfPolicy,
    /// The QP was created with `sq_sig_all`: every WQE requests a CQE.
    pub sig_all: bool,
    /// The doorbell register is shared with other threads: flush the
    /// write-combining buffer after every doorbell (second `sfence`).
    pub shared_register: bool,
}

impl Default for SqConfig {
    fn default() -> Self {
        SqConfig {
            bf_policy: BfPolicy::SingleWqe,
            sig_all: false,
            shared_register: false,
        }
    }
}

/// A validated WR's WQE: what [`SendQueue::emit`] writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    mlx_op: u8,
    hdr_ds: u32,
    imm: u32,
    /// DS (octowords).
    pub(crate) ds: u32,
    /// Basic blocks.
    pub(crate) nbb: u32,
    /// `fm_ce_se` as the native value of control-segment bytes 8..11
    /// (the byte in the last position).
    fm_word: u32,
    /// The side-table flags as the native value of slot bytes 12..15
    /// (the byte in the last position).
    slot_word: u32,
    /// A completion was asked for.
    pub(crate) user_sig: bool,
    shape: crate::wr::SendShape,
}

/// What writing one WQE produced, for its doorbell.
#[derive(Clone, Copy)]
struct Written {
    /// First BB.
    start: u32,
    /// First 8 bytes (the 8-byte doorbell value; DS in the last byte).
    ctrl8: u64,
    /// The WQE requests a CQE.
    sig: bool,
    /// The payload is inline (for [`BfPolicy::SingleInlineWqe`]).
    inline: bool,
}

/// The retirement state of a [`SendQueue`] held in locals across a run of
/// completions, from [`SendQueue::retire_cursor`]; written back with
/// [`SendQueue::commit_retire`]. Nothing else may change the queue's
/// counters while it is held.
#[derive(Clone, Copy)]
pub(crate) struct RetireCursor {
    wrid: *const WrSlot,
    mask: u32,
    /// The queue's producer counter (fixed during the run).
    pi: u32,
    /// Everything before this BB counter has completed.
    pub(crate) retired: u32,
}

impl RetireCursor {
    /// [`SendQueue::retire`] on the cursor.
    #[inline(always)]
    pub(crate) fn retire(&mut self, wqe_counter: u16) -> Option<Retired> {
        let retired = self.retired;
        let dist = (wqe_counter as u32).wrapping_sub(retired) & 0xffff;
        if dist >= self.pi.wrapping_sub(retired) {
            return None;
        }
        let start = retired.wrapping_add(dist);
        // SAFETY: the cursor came from a queue whose side table has
        // wrid_len > mask entries (constructor); the index is masked.
        let slot = unsafe { self.wrid.add((start & self.mask) as usize).read() };
        if slot.start != wqe_counter || slot.flags & WrSlot::VALID == 0 {
            return None;
        }
        self.retired = slot.end;
        Some(Retired {
            wr_id: slot.wr_id,
            opcode: slot.opcode,
            user_signaled: slot.flags & WrSlot::USER_SIGNALED != 0,
            start,
        })
    }
}

/// The producer state of a run of posts, held in locals (registers) and
/// written back to the queue once.
#[derive(Clone, Copy)]
struct Cursor {
    buf: *mut u8,
    wrid: *mut WrSlot,
    mask: u32,
    /// Free-running BB producer counter.
    pi: u32,
    /// `retired + limit`: the producer counter may not pass it.
    pi_max: u32,
    /// Producer counter after the last WQE that requests a CQE.
    last_signaled_end: u32,
    /// A copy of the capabilities, so the compiler sees that they do not
    /// change during the run (the SGE-count test leaves the loop).
    caps: QpCaps,
}

/// A run of posts on one [`SendQueue`] that ends with one doorbell
/// ([`SendBatch::ring`]), from [`SendQueue::batch`].
///
/// The producer counters stay in locals for the whole run and are written
/// back once, so a loop of [`SendBatch::post`] costs less than one of
/// [`SendQueue::post`]. Dropping a batch without ringing writes its state
/// back and leaves its WQEs pending, exactly as [`SendQueue::post`] does;
/// a later [`SendQueue::ring`] covers them.
pub struct SendBatch<'q> {
    sq: &'q mut SendQueue,
    cur: Cursor,
    /// WQEs written by this batch.
    count: u32,
    /// First BB of the last of them (valid if `count != 0`). Its control
    /// bytes are read back from the ring when the doorbell rings, so they
    /// need no register during the run.
    last_start: u32,
    /// The last of them has an inline payload.
    last_inline: bool,
}

impl SendBatch<'_> {
    /// Formats one send WQE without ringing the doorbell, as
    /// [`SendQueue::post`]. On error nothing is written and the batch is
    /// unchanged.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    pub unsafe fn post(&mut self, wr: &SendWr<'_>) -> Result<()> {
        // SAFETY: forwarded contract; the cursor is this queue's.
        let w = unsafe { self.sq.write(&mut self.cur, wr) }?;
        self.count += 1;
        self.last_start = w.start;
        self.last_inline = w.inline;
        Ok(())
    }

    /// WQEs written by this batch so far.
    #[inline]
    pub fn len(&self) -> u32 {
        self.count
    }

    /// True if this batch has written nothing yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Writes the state back and rings one doorbell for every pending WQE
    /// (this batch's and any posted before it), as [`SendQueue::ring`].
    #[inline(always)]
    pub fn ring(self) {
        let sq = &mut *self.sq;
        sq.store_cursor(&self.cur);
        if self.count != 0 {
            let single = sq.batch == 0 && self.count == 1;
            sq.batch = 0;
            sq.ring_written(self.last_start, self.last_inline, single);
        } else {
            sq.ring();
        }
        // Everything is written back: nothing is left for `drop` (which
        // would only store the same counters again).
        core::mem::forget(self);
    }
}

impl Drop for SendBatch<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let sq = &mut *self.sq;
        sq.store_cursor(&self.cur);
        if self.count != 0 {
            sq.batch += self.count;
            sq.last_start = self.last_start;
            sq.last_inline = self.last_inline;
        }
    }
}

/// An mlx5 send queue over caller-provided memory.
pub struct SendQueue {
    buf: NonNull<u8>,
    /// `wqe_cnt - 1` (BBs).
    mask: u32,
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
const fn max_ds(caps: &QpCaps) -> u32 {
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
/// (2) and `SOLICITED` (4) (reference §A.3); the INLINE bit (8) is ignored.
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
const fn flag_words(sig_all: bool) -> [[u32; 2]; 16] {
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

/// Two 32-bit words, already in their in-memory (wire) representation, as
/// the native 64-bit value with the same memory image (`a` first).
#[inline(always)]
const fn pack2(a_raw: u32, b_raw: u32) -> u64 {
    #[cfg(target_endian = "little")]
    {
        a_raw as u64 | (b_raw as u64) << 32
    }
    #[cfg(target_endian = "big")]
    {
        (a_raw as u64) << 32 | b_raw as u64
    }
}

/// The bytes `[0, 0, 0, b]` as a native 32-bit value.
#[inline(always)]
const fn byte3(b: u8) -> u32 {
    u32::from_ne_bytes([0, 0, 0, b])
}

const _: () = {
    assert!(core::mem::offset_of!(WrSlot, end) == 8);
    assert!(core::mem::offset_of!(WrSlot, start) == 12);
    assert!(core::mem::offset_of!(WrSlot, opcode) == 14);
    assert!(core::mem::offset_of!(WrSlot, flags) == 15);
    assert!(core::mem::size_of::<WrSlot>() == 16);
};

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
        let mds = max_ds(&caps);
        let max_nbb = mds.div_ceil(4);
        if mds > MAX_DS || max_nbb > cnt {
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
            wqe_cnt: cnt,
            pi: 0,
            retired: 0,
            limit: cnt,
            last_signaled_end: 0,
            // The unsignaled run that remains after a doorbell is below
            // `guard`, so with no CQE pending at least `cnt - guard + 1 >
            // max_nbb` BBs are free: the largest WQE always fits (§A.9).
            guard: (cnt / 2).min(cnt - max_nbb).max(1),
            forced: 0,
            // SAFETY: the record has two words (contract); SND_DBR = 1.
            dbrec: unsafe { dbrec.add(super::layout::SND_DBR) },
            bf_reg,
            bf_size: qp.bf_size,
            bf_offset: 0,
            qpn_raw: (qpn << 8).to_be(),
            qpn,
            flag_words: flag_words(cfg.sig_all),
            bf_ds_limit,
            bf_inline_only: cfg.bf_policy == BfPolicy::SingleInlineWqe,
            shared_register: cfg.shared_register,
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
        self.limit = if s.can_send() { self.wqe_cnt } else { 0 };
    }
    /// Ring base (for the software device and tests).
    #[inline]
    pub fn ring_ptr(&self) -> *mut u8 {
        self.buf.as_ptr()
    }

    /// Resets the counters to `pi` with nothing outstanding, as after the
    /// QP moved through RESET (reference §A.7, "QP reset"). Pending
    /// (un-rung) WQEs are dropped.
    pub fn reset_counters(&mut self, pi: u32) {
        self.pi = pi;
        self.retired = pi;
        self.last_signaled_end = pi;
        self.batch = 0;
        self.failure = None;
    }

    /// The first WR that failed (not counting flushes) since the queue was
    /// created or reset, as it was posted.
    pub fn failure(&self) -> Option<crate::wr::FailedWr> {
        self.failure
    }

    /// Decodes the WQE at BB `start` (still in the ring) into the fields
    /// of a [`crate::wr::FailedWr`] (reference §A.3–A.5). Everything read is
    /// bounded by the ring mask, so a damaged WQE yields garbage values,
    /// never an out-of-bounds read.
    #[cold]
    pub fn describe(&self, start: u32) -> crate::wr::FailedWr {
        use super::completion::WcOpcode;
        let o = start << 2;
        // SAFETY: octoword o is inside the ring (masked in `octo`).
        let ctrl = unsafe { self.octo(o).cast::<CtrlSeg>().read() };
        let ds = ctrl.qpn_ds.get() & 0x3f;
        let op = (ctrl.opmod_idx_opcode.get() & 0xff) as u8;
        let mut w = crate::wr::FailedWr {
            opcode: match op {
                opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => WcOpcode::RDMA_WRITE,
                opcode::RDMA_READ => WcOpcode::RDMA_READ,
                opcode::ATOMIC_CS => WcOpcode::COMP_SWAP,
                opcode::ATOMIC_FA => WcOpcode::FETCH_ADD,
                _ => WcOpcode::SEND,
            },
            ..Default::default()
        };
        let mut seg = 1u32;
        if matches!(
            op,
            opcode::RDMA_WRITE
                | opcode::RDMA_WRITE_IMM
                | opcode::RDMA_READ
                | opcode::ATOMIC_CS
                | opcode::ATOMIC_FA
        ) {
            // SAFETY: inside the ring (masked) and 16-aligned.
            let r = unsafe { self.octo(o.wrapping_add(1)).cast::<RaddrSeg>().read() };
            w.remote_addr = r.raddr.get();
            w.rkey = r.rkey.get();
            seg = 2;
            if matches!(op, opcode::ATOMIC_CS | opcode::ATOMIC_FA) {
                seg = 3;
            }
        }
        let mut first = true;
        while seg < ds {
            // SAFETY: inside the ring (masked) and 16-aligned; a data
            // segment and an inline header share their first word.
            let d = unsafe { self.octo(o.wrapping_add(seg)).cast::<DataSeg>().read() };
            let bc = d.byte_count.get();
            if bc & INLINE_SEG != 0 {
                w.inline = true;
                w.length = bc & !INLINE_SEG;
                break;
            }
            if first {
                w.local_addr = d.addr.get();
                w.lkey = d.lkey.get();
                first = false;
            }
            w.length = w.length.wrapping_add(bc);
            seg += 1;
        }
        w
    }

    /// Records the failure of the WQE at BB `start` (the first one only;
    /// flushes are not failures).
    #[cold]
    pub(crate) fn record_failure(&mut self, start: u32, wc: &super::completion::Wc) {
        if self.failure.is_some() || wc.status == super::completion::WcStatus::WR_FLUSH_ERR {
            return;
        }
        let mut f = self.describe(start);
        f.wr_id = wc.wr_id;
        f.status = wc.status;
        f.vendor_err = wc.vendor_err;
        f.syndrome = wc.syndrome;
        self.failure = Some(f);
    }

    /// Sets the BlueFlame offset (0 or `bf_size`); for resynchronising with
    /// another owner of the register.
    pub fn set_bf_offset(&mut self, off: u32) {
        self.bf_offset = if off != 0 { self.bf_size } else { 0 };
    }

    /// Largest WQE this queue builds, in BBs.
    pub(crate) fn max_wqe_bbs(&self) -> u32 {
        max_ds(&self.caps).div_ceil(4)
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

    /// Why a WQE of `nbb` BBs cannot be posted (cold: only on refusal).
    #[cold]
    fn refusal(&self) -> Error {
        if self.state.can_send() {
            Error::SqFull
        } else {
            Error::InvalidQpState
        }
    }

    /// Formats one send WQE at the producer position without ringing the
    /// doorbell. Call [`SendQueue::ring`] after one or more posts.
    ///
    /// On error nothing is written and the queue is unchanged.
    ///
    /// # Safety
    /// Every SGE must describe memory the device may access as the
    /// operation requires until the WR completes (see
    /// [`SendQueue::from_raw`]).
    #[inline(always)]
    pub unsafe fn post(&mut self, wr: &SendWr<'_>) -> Result<()> {
        let mut c = self.cursor();
        // SAFETY: forwarded contract.
        let w = unsafe { self.write(&mut c, wr) }?;
        self.store_cursor(&c);
        // The rest of the doorbell's inputs (the control bytes, whether the
        // last WQE is signaled) are read back when it rings.
        self.batch += 1;
        self.last_start = w.start;
        self.last_inline = w.inline;
        Ok(())
    }

    /// The producer state for a run of posts, copied into locals.
    #[inline(always)]
    fn cursor(&self) -> Cursor {
        Cursor {
            buf: self.buf.as_ptr(),
            wrid: self.wrid.as_ptr(),
            mask: self.mask,
            pi: self.pi,
            pi_max: self.retired.wrapping_add(self.limit),
            last_signaled_end: self.last_signaled_end,
            caps: self.caps,
        }
    }

    /// Writes a cursor's counters back.
    #[inline(always)]
    fn store_cursor(&mut self, c: &Cursor) {
        self.pi = c.pi;
        self.last_signaled_end = c.last_signaled_end;
    }

    /// Formats one WQE at the cursor and advances it (producer counter and
    /// the end of the last signaled WQE); the queue itself and the doorbell
    /// bookkeeping are left to the caller.
    ///
    /// # Safety
    /// As for [`SendQueue::post`]; `c` is this queue's cursor.
    #[inline(always)]
    unsafe fn write(&self, c: &mut Cursor, wr: &SendWr<'_>) -> Result<Written> {
        // SAFETY: forwarded contract.
        by_shape!(wr, unsafe { self.write_shaped(c, wr) })
    }

    /// [`SendQueue::write`] for one shape (see [`by_shape`]).
    ///
    /// # Safety
    /// As for [`SendQueue::write`].
    #[inline(always)]
    unsafe fn write_shaped(&self, c: &mut Cursor, wr: &SendWr<'_>) -> Result<Written> {
        let plan = self.plan_with(wr, &c.caps)?;
        let pi = c.pi;
        let end = pi.wrapping_add(plan.nbb);
        // `pi - retired` is at most wqe_cnt (2^15) and `limit` is 0 or
        // wqe_cnt, so the distance fits an i32: one signed compare is the
        // space check and the state check.
        if (c.pi_max.wrapping_sub(end) as i32) < 0 {
            return Err(self.refusal());
        }
        // SAFETY: `pi & mask` < wqe_cnt, so the first BB is inside the ring;
        // the BBs from `pi` are free (space check); forwarded contract on
        // the SGEs.
        let ctrl8 = unsafe {
            let base = c.buf.add(((pi & c.mask) as usize) << 6);
            self.emit_at(wr, &plan, pi, base)
        };
        // SAFETY: `pi & mask` < wqe_cnt <= wrid_len (constructor); the slot
        // is a 16-byte, 8-aligned WrSlot owned by this queue.
        unsafe { self.set_slot(c.wrid.add((pi & c.mask) as usize), wr.wr_id, &plan, pi) };
        // The entries of the WQE's other BBs must not look like WQE starts
        // (stale entries from before a reset, or 65536 BBs ago, would let a
        // corrupt counter retire the wrong work).
        for k in 1..plan.nbb {
            // SAFETY: masked index < wqe_cnt <= wrid_len; the BB is free.
            unsafe {
                c.wrid
                    .add((pi.wrapping_add(k) & c.mask) as usize)
                    .write(WrSlot::default())
            };
        }
        c.pi = end;
        if plan.user_sig {
            c.last_signaled_end = end;
        }
        Ok(Written {
            start: pi,
            ctrl8,
            sig: plan.user_sig,
            inline: plan.shape.inline,
        })
    }

    /// Validates a WR and works out its WQE: opcode, size, flags.
    #[inline(always)]
    pub(crate) fn plan(&self, wr: &SendWr<'_>) -> Result<Plan> {
        self.plan_with(wr, &self.caps)
    }

    /// [`SendQueue::plan`] against `caps` (this queue's, or a copy).
    #[inline(always)]
    fn plan_with(&self, wr: &SendWr<'_>, caps: &QpCaps) -> Result<Plan> {
        let shape = crate::wr::validate_send(wr, caps)?;
        let (mlx_op, hdr_ds, imm) = match wr.op {
            SendOp::Send => (opcode::SEND, 1, 0),
            SendOp::SendImm { imm } => (opcode::SEND_IMM, 1, imm),
            SendOp::SendInv { rkey } => (opcode::SEND_INVAL, 1, rkey),
            SendOp::Write { .. } => (opcode::RDMA_WRITE, 2, 0),
            SendOp::WriteImm { imm, .. } => (opcode::RDMA_WRITE_IMM, 2, imm),
            SendOp::Read { .. } => (opcode::RDMA_READ, 2, 0),
            SendOp::CompareSwap { .. } => (opcode::ATOMIC_CS, 3, 0),
            SendOp::FetchAdd { .. } => (opcode::ATOMIC_FA, 3, 0),
            SendOp::Nop => (opcode::NOP, 1, 0),
            // Memory windows need UMR WQEs, which this encoder does not
            // write.
            SendOp::BindMw(_) | SendOp::LocalInv { .. } => return Err(Error::Unsupported),
        };
        let data_ds = if shape.inline {
            if shape.inline_len == 0 {
                0
            } else {
                (4 + shape.inline_len).div_ceil(16)
            }
        } else {
            shape.data_sges
        };
        // Capabilities bound DS by MAX_DS (checked at construction).
        let ds = hdr_ds + data_ds;
        let [fm_word, slot_word] = self.flag_words[(wr.flags.0 & 0xf) as usize];
        Ok(Plan {
            mlx_op,
            hdr_ds,
            imm,
            ds,
            nbb: (ds + 3) >> 2,
            fm_word,
            slot_word,
            user_sig: fm_word & byte3(ctrl_flags::CQ_UPDATE) != 0,
            shape,
        })
    }

    /// Writes the planned WQE at BB `pi`; returns its first 8 bytes.
    ///
    /// # Safety
    /// BBs `pi..pi+plan.nbb` must be owned by the caller (free, not being
    /// read by the device); the SGE contract of [`SendQueue::post`].
    #[inline(always)]
    pub(crate) unsafe fn emit(&self, wr: &SendWr<'_>, plan: &Plan, pi: u32) -> u64 {
        // SAFETY: (pi & mask) < wqe_cnt: the WQE's first BB is inside the
        // ring; the caller's contract covers the rest.
        unsafe {
            let base = self.buf.as_ptr().add(((pi & self.mask) as usize) << 6);
            self.emit_at(wr, plan, pi, base)
        }
    }

    /// [`SendQueue::emit`] with the first BB's address `base` computed by
    /// the caller.
    ///
    /// # Safety
    /// As for [`SendQueue::emit`]; `base` is BB `pi & mask` of the ring.
    #[inline(always)]
    unsafe fn emit_at(&self, wr: &SendWr<'_>, plan: &Plan, pi: u32, base: *mut u8) -> u64 {
        let ctrl8 = pack2(
            ((pi & 0xffff) << 8 | plan.mlx_op as u32).to_be(),
            self.qpn_raw | plan.ds.to_be(),
        );
        // SAFETY: the WQE's first BB is at `base`; its octowords 0..4
        // (every header segment: hdr_ds <= 3) are at fixed offsets from it.
        // Data segments past the first BB are masked into the ring by
        // `write_wqe`.
        unsafe { self.write_wqe(wr, plan, ctrl8, base, pi << 2) };
        ctrl8
    }

    /// Fills a side-table entry for the WQE at BB `pi`.
    ///
    /// # Safety
    /// `slot` must point to a writable, 8-aligned [`WrSlot`] that nobody
    /// else accesses now.
    #[inline(always)]
    pub(crate) unsafe fn set_slot(&self, slot: *mut WrSlot, wr_id: u64, plan: &Plan, pi: u32) {
        let p = slot.cast::<u64>();
        // `start`, `opcode` and `flags` as one native word.
        let hi = u32::from_ne_bytes({
            let s = (pi as u16).to_ne_bytes();
            [s[0], s[1], plan.mlx_op, 0]
        }) | plan.slot_word;
        // SAFETY: caller contract; an aligned 8-byte store and two aligned
        // 4-byte stores (offsets 8 and 12 of the 8-aligned slot).
        unsafe {
            p.write(wr_id);
            let m = p.add(1).cast::<u32>();
            m.write(pi.wrapping_add(plan.nbb));
            m.add(1).write(hi);
        }
    }

    /// Writes the segments of a validated WR whose first BB is at `base`
    /// (octoword `o` of the ring, unmasked).
    ///
    /// Header segments (at most 3 octowords) always lie in the first BB,
    /// so they are stored at fixed offsets from `base`; a data segment in a
    /// later BB may wrap at the ring end, so its address is masked.
    ///
    /// # Safety
    /// `base` must be the 64-aligned first BB of the WQE inside the ring,
    /// and the WQE's BBs must be free.
    #[inline(always)]
    unsafe fn write_wqe(&self, wr: &SendWr<'_>, plan: &Plan, ctrl8: u64, base: *mut u8, o: u32) {
        // SAFETY: `base + 16 * i` for i < 4 is inside the first BB, and
        // `octo` masks every later octoword into the ring; all belong to
        // the caller. Every store is an aligned 8-byte store.
        unsafe {
            let c = base.cast::<u64>();
            c.write(ctrl8);
            c.add(1).write(pack2(plan.fm_word, plan.imm.to_be()));
            if let Some(remote) = wr.op.remote() {
                let r = base.add(16).cast::<u64>();
                r.write(remote.addr.to_be());
                r.add(1).write(pack2(remote.rkey.to_be(), 0));
            }
            match wr.op {
                SendOp::CompareSwap { compare, swap, .. } => {
                    let a = base.add(32).cast::<u64>();
                    a.write(swap.to_be());
                    a.add(1).write(compare.to_be());
                }
                // Only swap_add is written; `compare` is left as it was
                // (libmlx5 does the same, reference §A.3).
                SendOp::FetchAdd { add, .. } => base.add(32).cast::<u64>().write(add.to_be()),
                _ => {}
            }
            let at = |k: u32| {
                if k < 4 {
                    base.add(k as usize * 16)
                } else {
                    self.octo(o.wrapping_add(k))
                }
            };
            let mut k = plan.hdr_ds;
            match wr.payload {
                Payload::Sges(sges) => {
                    if wr.op.is_atomic() {
                        // Validation guarantees exactly one 8-byte SGE.
                        let s = &sges[0];
                        let d = at(k).cast::<u64>();
                        d.write(pack2(8u32.to_be(), s.lkey.to_be()));
                        d.add(1).write(s.addr.to_be());
                    } else {
                        for s in sges {
                            if s.length != 0 {
                                let d = at(k).cast::<u64>();
                                d.write(pack2(s.length.to_be(), s.lkey.to_be()));
                                d.add(1).write(s.addr.to_be());
                                k += 1;
                            }
                        }
                    }
                }
                Payload::Inline(pieces) => {
                    if plan.shape.inline_len != 0 {
                        self.write_inline(at(k), plan.shape.inline_len, pieces);
                    }
                }
            }
        }
    }

    /// Writes an inline segment (header + payload) starting at `hdr`; the
    /// payload may wrap at the ring end at any byte (§A.2). Padding after
    /// the payload is not written.
    #[inline]
    fn write_inline(&self, hdr: *mut u8, len: u32, pieces: &[&[u8]]) {
        let ring_bytes = (self.wqe_cnt * SEND_WQE_BB) as usize;
        // SAFETY: the header is 4 bytes at a 16-aligned offset in the ring.
        unsafe { hdr.cast::<Be32>().write(Be32::new(len | INLINE_SEG)) };
        let mut off = hdr as usize - self.buf.as_ptr() as usize + 4;
        for p in pieces {
            let mut src: &[u8] = p;
            while !src.is_empty() {
                if off == ring_bytes {
                    off = 0;
                }
                let n = core::cmp::min(src.len(), ring_bytes - off);
                // SAFETY: [off, off+n) lies in the ring; `src` is a caller
                // slice, which cannot overlap the ring (the ring is never
                // handed out as a slice).
                unsafe {
                    core::ptr::copy_nonoverlapping(src.as_ptr(), self.buf.as_ptr().add(off), n)
                };
                off += n;
                src = &src[n..];
            }
        }
    }

    /// Number of WQEs written since the last doorbell.
    #[inline]
    pub fn pending(&self) -> u32 {
        self.batch
    }

    /// Rings the doorbell for every WQE written since the last one: the
    /// doorbell record, then either a BlueFlame copy (a single WQE, per the
    /// policy) or one 8-byte doorbell with the last WQE's control bytes.
    /// Does nothing if nothing is pending.
    ///
    /// If the run of unsignaled work since the last CQE request has grown
    /// past the guard, the last WQE is made to request a CQE first (it has
    /// not been published yet), so the SQ can never fill with work that
    /// nothing will retire (§A.9). That CQE is consumed by the poller and
    /// not reported.
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.batch == 0 {
            return;
        }
        let single = self.batch == 1;
        self.batch = 0;
        self.ring_written(self.last_start, self.last_inline, single);
    }

    /// The doorbell for pending WQEs, the last of which starts at BB
    /// `start`: its control bytes are read back from the ring.
    #[inline(always)]
    fn ring_written(&mut self, start: u32, inline: bool, single: bool) {
        // SAFETY: the first 8 bytes of the last WQE's control segment,
        // inside the ring and 8-aligned; only this queue writes the ring.
        let ctrl8 = unsafe { self.octo(start << 2).cast::<u64>().read() };
        let w = Written {
            start,
            ctrl8,
            // Unknown here: the guard test tells (a signaled last WQE leaves
            // no unsignaled run).
            sig: false,
            inline,
        };
        self.ring_last(w, single);
    }

    /// The doorbell proper, for the WQE `w` written last; `single` if it is
    /// the only WQE since the previous doorbell.
    #[inline(always)]
    fn ring_last(&mut self, w: Written, single: bool) {
        // guard >= 1, so a zero run never forces; a signaled last WQE ends
        // the run, so the test is skipped when that is known.
        if !w.sig && self.pi.wrapping_sub(self.last_signaled_end) >= self.guard {
            self.force_signal_last(w.start);
        }
        if self.db_other {
            self.ring_other(w.start, w.ctrl8, w.inline, single);
            return;
        }
        // SAFETY: register offset is 0 or bf_size, inside the register pair;
        // see the constructor contract.
        let reg = unsafe { self.bf_reg.as_ptr().add(self.bf_offset as usize) };
        // SAFETY: constructor contract.
        unsafe { mmio::send_doorbell(self.dbrec.as_ptr(), self.pi, reg, w.ctrl8, false) };
        // Step 7: toggle between the two BlueFlame buffers.
        self.bf_offset ^= self.bf_size;
    }

    /// The doorbell of a queue with a BlueFlame policy (libmlx5's default,
    /// so kept inline) or a shared register.
    #[inline(always)]
    fn ring_other(&mut self, start: u32, ctrl8: u64, inline: bool, single: bool) {
        // SAFETY: register offset is 0 or bf_size, inside the register pair;
        // see the constructor contract.
        let reg = unsafe { self.bf_reg.as_ptr().add(self.bf_offset as usize) };
        let flush = self.shared_register;
        let ds = (u64::from_be(ctrl8) & 0x3f) as u32;
        let bf_ds = if inline || !self.bf_inline_only {
            ds
        } else {
            0
        };
        // DS in 2..=bf_size/16 (a DS-1 WQE is never copied, §A.7).
        if single && bf_ds.wrapping_sub(2) < self.bf_ds_limit {
            // SAFETY: dbrec/reg/ring validity from the constructor contract;
            // the WQE's BBs are inside the ring modulo mask.
            unsafe {
                mmio::send_blueflame(
                    self.dbrec.as_ptr(),
                    self.pi,
                    reg,
                    self.buf.as_ptr(),
                    start,
                    (bf_ds + 3) >> 2,
                    self.mask,
                    flush,
                )
            };
        } else {
            // SAFETY: constructor contract.
            unsafe { mmio::send_doorbell(self.dbrec.as_ptr(), self.pi, reg, ctrl8, flush) };
        }
        // Step 7: toggle between the two BlueFlame buffers.
        self.bf_offset ^= self.bf_size;
    }

    /// Makes the last written (not yet published) WQE request a CQE.
    #[cold]
    fn force_signal_last(&mut self, start: u32) {
        let o = start << 2;
        // SAFETY: byte 11 of the last WQE's control segment, inside the
        // ring; the device has not been told about this WQE yet.
        unsafe { *self.octo(o).add(11) |= ctrl_flags::CQ_UPDATE };
        self.last_signaled_end = self.pi;
        self.forced = self.forced.wrapping_add(1);
    }

    /// Posts one WR and rings the doorbell for it.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    pub unsafe fn post_one(&mut self, wr: &SendWr<'_>) -> Result<()> {
        let mut c = self.cursor();
        // SAFETY: forwarded contract.
        let w = unsafe { self.write(&mut c, wr) }?;
        self.store_cursor(&c);
        // Earlier un-rung WQEs are covered by this doorbell too.
        let single = self.batch == 0;
        self.batch = 0;
        self.ring_last(w, single);
        Ok(())
    }

    /// Starts a run of posts that ends with one doorbell
    /// ([`SendBatch::ring`]). The producer state stays in locals for the
    /// whole run and is written back once.
    #[inline(always)]
    pub fn batch(&mut self) -> SendBatch<'_> {
        SendBatch {
            cur: self.cursor(),
            count: 0,
            last_start: 0,
            last_inline: false,
            sq: self,
        }
    }

    /// Posts a list of WRs and rings the doorbell once. Stops at the first
    /// invalid WR: the ones before it are posted and rung, and the error is
    /// returned with the index of the failed WR.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline]
    pub unsafe fn post_list(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let mut b = self.batch();
        let mut failed = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: forwarded contract.
            if let Err(error) = unsafe { b.post(wr) } {
                failed = Err(PostError { index: i, error });
                break;
            }
        }
        // Earlier un-rung WQEs get their doorbell even if nothing new was
        // posted.
        b.ring();
        failed
    }

    /// Retires the WQE whose first BB has 16-bit index `wqe_counter` and
    /// everything before it. Returns `None` (and changes nothing) if the
    /// counter does not name an outstanding WQE, so a corrupt CQE can never
    /// retire the wrong work or index out of bounds.
    #[inline(always)]
    pub fn retire(&mut self, wqe_counter: u16) -> Option<Retired> {
        let mut c = self.retire_cursor();
        let r = c.retire(wqe_counter)?;
        self.commit_retire(&c);
        Some(r)
    }

    /// The retirement state, copied into locals for a run of completions
    /// (the poller keeps it in registers and writes it back once).
    #[inline(always)]
    pub(crate) fn retire_cursor(&self) -> RetireCursor {
        RetireCursor {
            wrid: self.wrid.as_ptr(),
            mask: self.mask,
            pi: self.pi,
            retired: self.retired,
        }
    }

    /// Writes a retirement cursor back.
    #[inline(always)]
    pub(crate) fn commit_retire(&mut self, c: &RetireCursor) {
        self.retired = c.retired;
    }

    /// Reads back the data segments of the WQE starting at BB `start`,
    /// skipping `skip` header octowords, for scatter-to-CQE copies. Calls
    /// `f(addr, len)` for each, in order; at most `max` segments.
    pub(crate) fn for_each_data_seg(&self, start: u32, mut f: impl FnMut(u64, u32) -> bool) {
        let o = start << 2;
        // SAFETY: octoword o is the WQE's control segment, inside the ring.
        let ctrl = unsafe { self.octo(o).cast::<CtrlSeg>().read() };
        let ds = ctrl.qpn_ds.get() & 0x3f;
        let op = (ctrl.opmod_idx_opcode.get() & 0xff) as u8;
        let hdr = match op {
            opcode::RDMA_READ => 2,
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => 3,
            _ => return,
        };
        for i in hdr..ds {
            // SAFETY: inside the ring (masked) and 16-aligned.
            let d = unsafe { self.octo(o.wrapping_add(i)).cast::<DataSeg>().read() };
            if !f(d.addr.get(), d.byte_count.get()) {
                break;
            }
        }
    }
}
