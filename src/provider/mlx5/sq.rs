//! The mlx5 send queue: WQE formatting straight into the ring (reference
//! §A.2–A.5), doorbells (§A.7) and send-queue accounting (§A.9).
//!
//! The producer counter `pi` counts 64-byte basic blocks (BBs) and runs
//! free; the WQE index written into the control segment and the doorbell
//! record is its low 16 bits. Free space is counted in BBs:
//! `wqe_cnt - (pi - retired)`. A completion for the WQE that starts at BB
//! `X` retires everything up to the end of that WQE, signaled or not.

use core::ptr::NonNull;

use super::layout::{
    ctrl_flags, opcode, AtomicSeg, Be32, Be64, CtrlSeg, DataSeg, Mlx5dvQp, RaddrSeg, INLINE_SEG,
    MAX_DS, SEND_WQE_BB,
};
use crate::error::{Error, PostError, Result};
use crate::mmio;
use crate::wr::{Payload, QpCaps, SendFlags, SendOp, SendWr};

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
    /// Producer counter after the last WQE that requests a CQE.
    last_signaled_end: u32,
    dbrec: NonNull<u32>,
    bf_reg: NonNull<u8>,
    bf_size: u32,
    bf_offset: u32,
    /// `qpn << 8`, host order.
    qpn_shifted: u32,
    caps: QpCaps,
    cfg: SqConfig,
    state: QpState,
    wrid: NonNull<WrSlot>,
    /// WQEs written since the last doorbell.
    batch: u32,
    /// First BB of the last WQE written.
    last_start: u32,
    /// DS of the last WQE written.
    last_ds: u32,
    /// Last WQE was inline.
    last_inline: bool,
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
        if mds > MAX_DS || mds.div_ceil(4) > cnt {
            return Err(Error::InvalidGeometry);
        }
        if wrid_len < cnt as usize {
            return Err(Error::StorageTooSmall);
        }
        Ok(SendQueue {
            buf,
            mask: cnt - 1,
            wqe_cnt: cnt,
            pi: 0,
            retired: 0,
            last_signaled_end: 0,
            // SAFETY: the record has two words (contract); SND_DBR = 1.
            dbrec: unsafe { dbrec.add(super::layout::SND_DBR) },
            bf_reg,
            bf_size: qp.bf_size,
            bf_offset: 0,
            qpn_shifted: qpn << 8,
            caps,
            cfg,
            state: QpState::Rts,
            wrid,
            batch: 0,
            last_start: 0,
            last_ds: 0,
            last_inline: false,
        })
    }

    /// QP number.
    #[inline]
    pub fn qpn(&self) -> u32 {
        self.qpn_shifted >> 8
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
    }

    /// Sets the BlueFlame offset (0 or `bf_size`); for resynchronising with
    /// another owner of the register.
    pub fn set_bf_offset(&mut self, off: u32) {
        self.bf_offset = if off != 0 { self.bf_size } else { 0 };
    }

    /// Pointer to octoword `i` (mod ring) of the ring.
    #[inline(always)]
    fn octo(&self, i: u32) -> *mut u8 {
        let off = (i & (self.mask << 2 | 3)) as usize * 16;
        // SAFETY: off < wqe_cnt * 64 = ring size (constructor contract).
        unsafe { self.buf.as_ptr().add(off) }
    }

    /// Writes one 16-byte segment at octoword `i`.
    #[inline(always)]
    fn put<T: Copy>(&mut self, i: u32, seg: T) {
        debug_assert!(core::mem::size_of::<T>() == 16);
        // SAFETY: `octo` is inside the ring and 16-aligned (ring is
        // 64-aligned); all segment types are 16 bytes with align <= 8; the
        // slot is free (space was checked), so the device is not reading it.
        unsafe { self.octo(i).cast::<T>().write(seg) }
    }

    /// Octowords of the data part of a WR (after ctrl/raddr/atomic).
    #[inline(always)]
    fn data_ds(wr: &SendWr<'_>) -> Result<(u32, u32)> {
        match wr.payload {
            Payload::Sges(sges) => {
                let mut n = 0u32;
                for s in sges {
                    n += (s.length != 0) as u32;
                }
                if wr.op.is_atomic() {
                    n = 1;
                }
                Ok((n, 0))
            }
            Payload::Inline(pieces) => {
                let len = crate::wr::inline_length(pieces)?;
                Ok(((4 + len).div_ceil(16) * (len != 0) as u32, len))
            }
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
        if !self.state.can_send() {
            return Err(Error::InvalidQpState);
        }
        crate::wr::validate_send(wr, &self.caps)?;
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
        };
        let (data_ds, inline_len) = Self::data_ds(wr)?;
        let ds = hdr_ds + data_ds;
        if ds > MAX_DS {
            return Err(Error::TooManySges);
        }
        let nbb = (ds + 3) >> 2;
        if self.pi.wrapping_sub(self.retired) + nbb > self.wqe_cnt {
            return Err(Error::SqFull);
        }

        // Completion request. The guard forces a CQE when the run of
        // unsignaled BBs would reach half the ring, so a full SQ always has
        // a signaled WQE outstanding and can never stall (§A.9).
        let end = self.pi.wrapping_add(nbb);
        let user_sig = wr.flags.contains(SendFlags::SIGNALED) || self.cfg.sig_all;
        let sig = user_sig || end.wrapping_sub(self.last_signaled_end) >= self.wqe_cnt / 2;
        if sig {
            self.last_signaled_end = end;
        }
        let mut fm_ce_se = 0u8;
        if sig {
            fm_ce_se |= ctrl_flags::CQ_UPDATE;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            fm_ce_se |= ctrl_flags::SOLICITED;
        }
        if wr.flags.contains(SendFlags::FENCE) {
            fm_ce_se |= ctrl_flags::FENCE;
        }

        let start = self.pi;
        // First octoword; octoword indices run free and are masked on use.
        let o = start << 2;
        self.put(
            o,
            CtrlSeg {
                opmod_idx_opcode: Be32::new((start & 0xffff) << 8 | mlx_op as u32),
                qpn_ds: Be32::new(self.qpn_shifted | ds),
                signature: 0,
                dci_stream_channel_id: [0; 2],
                fm_ce_se,
                imm: Be32::new(imm),
            },
        );
        if let Some(remote) = wr.op.remote() {
            self.put(
                o.wrapping_add(1),
                RaddrSeg {
                    raddr: Be64::new(remote.addr),
                    rkey: Be32::new(remote.rkey),
                    reserved: Be32::new(0),
                },
            );
        }
        match wr.op {
            SendOp::CompareSwap { compare, swap, .. } => self.put(
                o.wrapping_add(2),
                AtomicSeg {
                    swap_add: Be64::new(swap),
                    compare: Be64::new(compare),
                },
            ),
            SendOp::FetchAdd { add, .. } => {
                // Only swap_add is written; `compare` is left as it was
                // (libmlx5 does the same, reference §A.3).
                // SAFETY: octoword o+2 is inside the ring and 8-aligned.
                unsafe {
                    self.octo(o.wrapping_add(2))
                        .cast::<Be64>()
                        .write(Be64::new(add))
                }
            }
            _ => {}
        }
        let mut at = o.wrapping_add(hdr_ds);
        match wr.payload {
            Payload::Sges(sges) => {
                if wr.op.is_atomic() {
                    // Validation guarantees exactly one 8-byte SGE.
                    let s = sges[0];
                    self.put(
                        at,
                        DataSeg {
                            byte_count: Be32::new(8),
                            lkey: Be32::new(s.lkey),
                            addr: Be64::new(s.addr),
                        },
                    );
                } else {
                    for s in sges {
                        if s.length != 0 {
                            self.put(
                                at,
                                DataSeg {
                                    byte_count: Be32::new(s.length),
                                    lkey: Be32::new(s.lkey),
                                    addr: Be64::new(s.addr),
                                },
                            );
                            at = at.wrapping_add(1);
                        }
                    }
                }
            }
            Payload::Inline(pieces) => {
                if inline_len != 0 {
                    self.write_inline(at, inline_len, pieces);
                }
            }
        }

        // Side table, indexed by the WQE's first BB.
        let slot = WrSlot {
            wr_id: wr.wr_id,
            end,
            start: start as u16,
            opcode: mlx_op,
            flags: WrSlot::VALID | if user_sig { WrSlot::USER_SIGNALED } else { 0 },
        };
        // SAFETY: index <= mask < wqe_cnt <= wrid_len (constructor).
        unsafe {
            self.wrid
                .as_ptr()
                .add((start & self.mask) as usize)
                .write(slot)
        };

        self.pi = end;
        self.batch += 1;
        self.last_start = start;
        self.last_ds = ds;
        self.last_inline = matches!(wr.payload, Payload::Inline(_));
        Ok(())
    }

    /// Writes an inline segment (header + payload) starting at octoword
    /// `at`; the payload may wrap at the ring end at any byte (§A.2).
    /// Padding after the payload is not written.
    #[inline]
    fn write_inline(&mut self, at: u32, len: u32, pieces: &[&[u8]]) {
        let ring_bytes = (self.wqe_cnt * SEND_WQE_BB) as usize;
        let hdr = self.octo(at);
        // SAFETY: the header is 4 bytes at a 16-aligned offset in the ring.
        unsafe { hdr.cast::<Be32>().write(Be32::new(len | INLINE_SEG)) };
        let mut off = (at & (self.mask << 2 | 3)) as usize * 16 + 4;
        for p in pieces {
            let mut src: &[u8] = p;
            while !src.is_empty() {
                if off == ring_bytes {
                    off = 0;
                }
                let n = core::cmp::min(src.len(), ring_bytes - off);
                // SAFETY: [off, off+n) lies in the ring; `src` is a valid
                // slice that cannot overlap the ring (it is borrowed while
                // the queue is mutably borrowed... and the ring is never
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
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.batch == 0 {
            return;
        }
        // SAFETY: register offset is 0 or bf_size, inside the register pair;
        // see the constructor contract.
        let reg = unsafe { self.bf_reg.as_ptr().add(self.bf_offset as usize) };
        let use_bf = self.batch == 1
            && self.bf_size != 0
            && self.last_ds > 1
            && self.last_ds * 16 <= self.bf_size
            && match self.cfg.bf_policy {
                BfPolicy::Never => false,
                BfPolicy::SingleWqe => true,
                BfPolicy::SingleInlineWqe => self.last_inline,
            };
        let flush = self.cfg.shared_register;
        if use_bf {
            // SAFETY: dbrec/reg/ring validity from the constructor contract;
            // the WQE's BBs are inside the ring modulo mask.
            unsafe {
                mmio::send_blueflame(
                    self.dbrec.as_ptr(),
                    self.pi,
                    reg,
                    self.buf.as_ptr(),
                    self.last_start,
                    (self.last_ds + 3) >> 2,
                    self.mask,
                    flush,
                )
            };
        } else {
            // SAFETY: the last WQE's first 8 bytes are in the ring and
            // 8-aligned (BB-aligned).
            let ctrl8 = unsafe { self.octo(self.last_start << 2).cast::<u64>().read() };
            // SAFETY: constructor contract.
            unsafe { mmio::send_doorbell(self.dbrec.as_ptr(), self.pi, reg, ctrl8, flush) };
        }
        // Step 7: toggle between the two BlueFlame buffers.
        self.bf_offset ^= self.bf_size;
        self.batch = 0;
    }

    /// Posts one WR and rings the doorbell for it.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    pub unsafe fn post_one(&mut self, wr: &SendWr<'_>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr)? };
        self.ring();
        Ok(())
    }

    /// Posts a list of WRs and rings the doorbell once. Stops at the first
    /// invalid WR: the ones before it are posted and rung, and the error is
    /// returned with the index of the failed WR.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline]
    pub unsafe fn post_list(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: forwarded contract.
            if let Err(e) = unsafe { self.post(wr) } {
                self.ring();
                return Err(PostError { index: i, error: e });
            }
        }
        self.ring();
        Ok(())
    }

    /// Retires the WQE whose first BB has 16-bit index `wqe_counter` and
    /// everything before it. Returns `None` (and changes nothing) if the
    /// counter does not name an outstanding WQE, so a corrupt CQE can never
    /// retire the wrong work or index out of bounds.
    #[inline(always)]
    pub fn retire(&mut self, wqe_counter: u16) -> Option<Retired> {
        let outstanding = self.pi.wrapping_sub(self.retired);
        let dist = (wqe_counter as u32).wrapping_sub(self.retired) & 0xffff;
        if dist >= outstanding {
            return None;
        }
        let start = self.retired.wrapping_add(dist);
        // SAFETY: index <= mask < wrid_len.
        let slot = unsafe { self.wrid.as_ptr().add((start & self.mask) as usize).read() };
        if slot.flags & WrSlot::VALID == 0 || slot.start != wqe_counter {
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
