//! Decoding CQEs: the requester-completion tables, the owner-bit probe,
//! the completion stores, and the general decoder for responder, error
//! and scatter-to-CQE entries.

use super::route::{CqRouteTo, SqRetire};
use super::CompletionQueue;
use crate::error::{Error, Result};
use crate::mmio;
use crate::provider::mlx5::completion::{wc_flags, QpState, Retired, Wc, WcOpcode, WcStatus};
use crate::provider::mlx5::layout::{cqe_format, cqe_opcode, opcode, Cqe64};

/// Requester completion per mlx5 WQE opcode (docs/spec/mlx5.md §8): bits 0..7
/// the `ibv_wc_opcode`, 8..15 `wc_flags`, bit 16 ([`REQ_BYTE_CNT`]) "the
/// byte length is the CQE's byte count", bits 24..31 a fixed byte length
/// (8 for atomics). NOP and unknown opcodes complete as SEND.
pub(super) const REQ_WC: [u32; 32] = {
    let mut t = [WcOpcode::SEND.0; 32];
    t[opcode::SEND_IMM as usize] = WcOpcode::SEND.0 | wc_flags::WITH_IMM << 8;
    t[opcode::RDMA_WRITE as usize] = WcOpcode::RDMA_WRITE.0;
    t[opcode::RDMA_WRITE_IMM as usize] = WcOpcode::RDMA_WRITE.0 | wc_flags::WITH_IMM << 8;
    t[opcode::RDMA_READ as usize] = WcOpcode::RDMA_READ.0 | REQ_BYTE_CNT;
    t[opcode::ATOMIC_CS as usize] = WcOpcode::COMP_SWAP.0 | 8 << 24;
    t[opcode::ATOMIC_FA as usize] = WcOpcode::FETCH_ADD.0 | 8 << 24;
    t
};

/// See [`REQ_WC`].
pub(super) const REQ_BYTE_CNT: u32 = 1 << 16;

/// [`REQ_WC`] as three of the words [`Wc::set_words`] stores: `status`
/// (0) and `opcode`; `vendor_err` (0) and the fixed `byte_len` (RDMA_READ
/// reports the CQE's byte count instead); `src_qp` (0) and `wc_flags`. One
/// table, so one address computation per CQE.
const REQ_WORDS: [[u64; 4]; 32] = {
    let mut t = [[0u64; 4]; 32];
    let mut i = 0;
    while i < 32 {
        let m = REQ_WC[i];
        t[i] = [
            Wc::words_pair(0, m & 0xff),
            Wc::words_pair(0, m >> 24),
            Wc::words_pair(0, (m >> 8) & 0xff),
            0,
        ];
        i += 1;
    }
    t
};

const _: () = {
    // Only RDMA_READ takes its byte length from the CQE (the fast loop
    // tests for that opcode alone).
    let mut i = 0;
    while i < 32 {
        assert!((REQ_WC[i] & REQ_BYTE_CNT != 0) == (i == opcode::RDMA_READ as usize));
        i += 1;
    }
};

/// The CQE64 at consumer index `ci` of the buffer whose first CQE64 is
/// at `base` (`mask` = entries - 1, `shift` = log2 of the entry size; the
/// caller passes `mask + 1` too, so a loop computes it once), if
/// it is owned by software and a successful requester entry without
/// inline data (the solicited bit, 1, is ignored); else whether the slot is
/// empty (hardware-owned or never written). Orders the owner-byte load
/// before any later load of the entry.
#[inline(always)]
pub(super) fn probe_req(
    base: *const u8,
    mask: u32,
    cnt: u32,
    shift: u32,
    ci: u32,
) -> core::result::Result<*const u8, bool> {
    // SAFETY: (ci & mask) < cqe_cnt: the CQE is inside the buffer (the
    // caller passes its queue's geometry).
    let p = unsafe { base.add(((ci & mask) as usize) << shift) };
    // SAFETY: byte 63 of that CQE.
    let op_own = unsafe { mmio::load_op_own(p.add(63)) };
    // The owner bit software expects: the parity of the pass.
    let owner = (ci & cnt != 0) as u32;
    if (op_own as u32 ^ owner) & 0xfd != 0 {
        let empty = op_own >> 4 == cqe_opcode::INVALID || (op_own as u32 ^ owner) & 1 != 0;
        return Err(empty);
    }
    // Order the owner load before the loads of the other fields.
    mmio::from_device_barrier();
    Ok(p)
}

impl Wc {
    /// The [`Wc::set_words`] image of the successful requester completion
    /// of retired WQE `r`, from its CQE64 at `p` (only RDMA_READ reads a
    /// field: the byte count); `qpn_word` is [`Wc::words_pair`]`(0, qpn)`.
    ///
    /// # Safety
    /// `p` points to a software-owned CQE64.
    #[inline(always)]
    pub(super) unsafe fn req_words(r: &Retired, p: *const u8, qpn_word: u64) -> [u64; 6] {
        let op = (r.opcode & 0x1f) as usize;
        let t = &REQ_WORDS[op];
        let len_word = if op == opcode::RDMA_READ as usize {
            // SAFETY: byte count at a fixed, aligned offset of the CQE
            // (caller contract); read only when it is reported.
            let b = u32::from_be(unsafe { p.add(44).cast::<u32>().read() });
            Wc::words_pair(0, b)
        } else {
            t[1]
        };
        [r.wr_id, t[0], len_word, qpn_word, t[2], 0]
    }

    /// Two consecutive 32-bit fields (`a` at the lower address) as the
    /// native 64-bit word with that memory image.
    pub(super) const fn words_pair(a: u32, b: u32) -> u64 {
        #[cfg(target_endian = "little")]
        {
            a as u64 | (b as u64) << 32
        }
        #[cfg(target_endian = "big")]
        {
            (a as u64) << 32 | b as u64
        }
    }

    /// Stores the whole completion as six aligned 8-byte words (offsets
    /// asserted below; see [`Wc::words_pair`]).
    #[inline(always)]
    pub(super) fn set_words(&mut self, words: [u64; 6]) {
        // SAFETY: Wc is 48 bytes and 8-aligned, and every bit pattern is a
        // valid Wc (plain integers only).
        unsafe { (self as *mut Wc).cast::<[u64; 6]>().write(words) };
    }

    /// Fills a successful requester completion: six aligned 8-byte stores
    /// of composed words instead of one store per field.
    #[inline(always)]
    pub(super) fn set_requester(
        &mut self,
        wr_id: u64,
        opcode: u32,
        byte_len: u32,
        qpn: u32,
        flags: u32,
    ) {
        #[cfg(target_endian = "little")]
        {
            let words = [
                wr_id,
                (opcode as u64) << 32,   // status SUCCESS, opcode
                (byte_len as u64) << 32, // vendor_err 0, byte_len
                (qpn as u64) << 32,      // imm 0, qp_num
                (flags as u64) << 32,    // src_qp 0, wc_flags
                0,                       // pkey, slid, sl, path bits, syndrome
            ];
            // SAFETY: Wc is 48 bytes, 8-aligned, with the fields at the
            // offsets the words above assume (asserted below), and every
            // bit pattern is a valid Wc.
            unsafe { (self as *mut Wc).cast::<[u64; 6]>().write(words) };
        }
        #[cfg(target_endian = "big")]
        {
            *self = Wc {
                wr_id,
                opcode: WcOpcode(opcode),
                byte_len,
                qp_num: qpn,
                wc_flags: flags,
                ..Wc::default()
            };
        }
    }
}

const _: () = {
    use core::mem::{align_of, offset_of};
    assert!(align_of::<Wc>() == 8);
    assert!(offset_of!(Wc, status) == 8 && offset_of!(Wc, opcode) == 12);
    assert!(offset_of!(Wc, vendor_err) == 16 && offset_of!(Wc, byte_len) == 20);
    assert!(offset_of!(Wc, imm_data) == 24 && offset_of!(Wc, qp_num) == 28);
    assert!(offset_of!(Wc, src_qp) == 32 && offset_of!(Wc, wc_flags) == 36);
    assert!(offset_of!(Wc, pkey_index) == 40);
};

/// Outcome of decoding one owned CQE.
pub(super) enum Step {
    /// Produce this completion.
    Out(Wc),
    /// Consumed internally (forced-signal CQE, recovery's drain marker,
    /// stale QPN).
    Skip,
}

/// Copies up to `len` bytes from `src` into the buffers `for_each` yields.
fn scatter(src: &[u8], len: u32, for_each: impl FnOnce(&mut dyn FnMut(u64, u32) -> bool)) {
    let mut rest = core::cmp::min(len as usize, src.len());
    let mut off = 0usize;
    for_each(&mut |addr, seg_len| {
        if rest == 0 {
            return false;
        }
        let n = core::cmp::min(rest, seg_len as usize);
        // SAFETY: the destination is a buffer the application posted (the
        // posting contract makes it device-writable until completion); the
        // source is our local copy of the CQE.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr().add(off), addr as usize as *mut u8, n)
        };
        off += n;
        rest -= n;
        rest != 0
    });
}

/// The responder fields of a successful receive CQE
/// (docs/spec/mlx5.md §8): opcode, flags, immediate, byte count, and the
/// sender's QP, SL, GRH flag, LID, path bits and P_Key index (UD).
#[inline(always)]
fn responder_fields(wc: &mut Wc, c: &Cqe64, op: u8) {
    wc.byte_len = c.byte_cnt.get();
    let iip = c.imm_inval_pkey.get();
    match op {
        cqe_opcode::RESP_WR_IMM => {
            wc.opcode = WcOpcode::RECV_RDMA_WITH_IMM;
            wc.wc_flags = wc_flags::WITH_IMM;
            wc.imm_data = iip;
        }
        cqe_opcode::RESP_SEND => wc.opcode = WcOpcode::RECV,
        cqe_opcode::RESP_SEND_IMM => {
            wc.opcode = WcOpcode::RECV;
            wc.wc_flags = wc_flags::WITH_IMM;
            wc.imm_data = iip;
        }
        _ => {
            wc.opcode = WcOpcode::RECV;
            wc.wc_flags = wc_flags::WITH_INV;
            wc.imm_data = iip;
        }
    }
    let fr = c.flags_rqpn.get();
    wc.src_qp = fr & 0x00ff_ffff;
    wc.sl = ((fr >> 24) & 0xf) as u8;
    if (fr >> 28) & 3 != 0 {
        wc.wc_flags |= wc_flags::GRH;
    }
    wc.slid = c.slid.get();
    wc.dlid_path_bits = c.ml_path & 0x7f;
    wc.pkey_index = (iip & 0xffff) as u16;
}

impl CompletionQueue {
    /// A responder or receive-error CQE of a QP that receives through an
    /// SRQ, whose WQE has completed as `wr_id` (docs/spec/mlx5.md §11).
    /// Scatter-to-CQE into SRQ buffers is not done: such an entry is
    /// [`Error::CqeCorrupt`] (create SRQ QPs with scatter-to-CQE off).
    /// Only routes that override [`CqRouteTo::srq_for`] reach it.
    #[inline]
    fn decode_srq<S: SqRetire + ?Sized, R: CqRouteTo<S> + ?Sized>(
        route: &mut R,
        c: &Cqe64,
        op: u8,
        format: u8,
        qpn: u32,
        wr_id: u64,
    ) -> Result<Step> {
        let mut wc = Wc {
            qp_num: qpn,
            wr_id,
            ..Wc::default()
        };
        if op == cqe_opcode::RESP_ERR {
            // SAFETY: ErrCqe is the same 64 bytes; the syndrome bytes are
            // at fixed offsets of the caller's local copy.
            let raw: &[u8; 64] = unsafe { &*(c as *const Cqe64 as *const [u8; 64]) };
            wc.status = WcStatus::from_syndrome(raw[55]);
            wc.vendor_err = raw[54] as u32;
            wc.syndrome = raw[55];
            wc.opcode = WcOpcode::RECV;
            // The hardware has moved the QP to the error state.
            if let Some(q) = route.route_to(qpn) {
                q.sq.set_error();
                q.rq.set_state(QpState::Error);
            }
        } else {
            if format != cqe_format::NORMAL {
                return Err(Error::CqeCorrupt);
            }
            responder_fields(&mut wc, c, op);
        }
        Ok(Step::Out(wc))
    }

    /// Decodes any owned entry: responder and error CQEs, inline data,
    /// corrupt entries.
    #[inline(always)]
    pub(super) fn decode<S: SqRetire + ?Sized, R: CqRouteTo<S> + ?Sized>(
        &mut self,
        route: &mut R,
        op_own: u8,
        cqe_ptr: *const u8,
    ) -> Result<Step> {
        // SAFETY: the entry belongs to software now (owner bit, checked by
        // the caller); read it once into a local copy. Cqe64 is 8-aligned;
        // the slot is 64-aligned.
        let cqe = unsafe { cqe_ptr.cast::<Cqe64>().read() };
        let c = &cqe;
        let op = op_own >> 4;
        let format = (op_own >> 2) & 3;
        if format == cqe_format::COMPRESSED {
            return Err(Error::CqeCompressed);
        }
        if format != cqe_format::NORMAL && !self.scatter {
            return Err(Error::CqeCorrupt);
        }
        let sdq = c.sop_drop_qpn.get();
        let qpn = sdq & 0x00ff_ffff;
        let counter = c.wqe_counter.get();
        if matches!(
            op,
            cqe_opcode::RESP_WR_IMM
                | cqe_opcode::RESP_SEND
                | cqe_opcode::RESP_SEND_IMM
                | cqe_opcode::RESP_SEND_INV
                | cqe_opcode::RESP_ERR
        ) {
            // With a route that has no SRQs this is `None` at compile time.
            let srq_id = route
                .srq_for(qpn, c.srqn_uidx.get() & 0x00ff_ffff)
                .map(|srq| srq.complete(counter));
            if let Some(id) = srq_id {
                return Self::decode_srq(route, c, op, format, qpn, id?);
            }
        }
        let Some(q) = route.route_to(qpn) else {
            if <R as CqRouteTo<S>>::busy(route) {
                // The QP is the route's but in use elsewhere: stop here and
                // leave the entry (not stale) for a later poll.
                return Err(Error::ResourceBusy);
            }
            self.stale += 1;
            return Ok(Step::Skip);
        };
        let mut wc = Wc {
            qp_num: qpn,
            ..Wc::default()
        };
        match op {
            cqe_opcode::REQ => {
                let r = q.sq.retire(counter).ok_or(Error::CqeCorrupt)?;
                if !r.user_signaled {
                    return Ok(Step::Skip);
                }
                wc.wr_id = r.wr_id;
                let m = REQ_WC[(r.opcode & 0x1f) as usize];
                wc.opcode = WcOpcode(m & 0xff);
                wc.wc_flags = (m >> 8) & 0xff;
                wc.byte_len = if m & REQ_BYTE_CNT != 0 {
                    c.byte_cnt.get()
                } else {
                    m >> 24
                };
                if format != cqe_format::NORMAL {
                    self.scatter_from_cqe(format, cqe_ptr, wc.byte_len, |f| {
                        q.sq.for_each_data_seg(r.start, f)
                    });
                }
            }
            cqe_opcode::RESP_WR_IMM
            | cqe_opcode::RESP_SEND
            | cqe_opcode::RESP_SEND_IMM
            | cqe_opcode::RESP_SEND_INV => {
                let (id, slot) = q.rq.complete(counter).ok_or(Error::CqeCorrupt)?;
                wc.wr_id = id;
                responder_fields(&mut wc, c, op);
                if format != cqe_format::NORMAL {
                    let rq = &*q.rq;
                    self.scatter_from_cqe(format, cqe_ptr, wc.byte_len, |f| {
                        rq.for_each_sge(slot, f)
                    });
                }
            }
            cqe_opcode::REQ_ERR | cqe_opcode::RESP_ERR => {
                // SAFETY: ErrCqe is the same 64 bytes; the syndrome bytes
                // are at fixed offsets of our local copy.
                let raw: &[u8; 64] = unsafe { &*(c as *const Cqe64 as *const [u8; 64]) };
                let vendor = raw[54];
                let synd = raw[55];
                wc.status = WcStatus::from_syndrome(synd);
                wc.vendor_err = vendor as u32;
                wc.syndrome = synd;
                if op == cqe_opcode::REQ_ERR {
                    let r = q.sq.retire(counter).ok_or(Error::CqeCorrupt)?;
                    if q.sq.is_drain_marker(r.start) {
                        // Recovery's marker (posted in ERROR, so flushed):
                        // it has retired everything before it; it is not
                        // the user's and is not reported.
                        q.sq.set_error();
                        q.rq.set_state(QpState::Error);
                        return Ok(Step::Skip);
                    }
                    wc.wr_id = r.wr_id;
                    wc.opcode = match r.opcode {
                        opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => WcOpcode::RDMA_WRITE,
                        opcode::RDMA_READ => WcOpcode::RDMA_READ,
                        opcode::ATOMIC_CS => WcOpcode::COMP_SWAP,
                        opcode::ATOMIC_FA => WcOpcode::FETCH_ADD,
                        _ => WcOpcode::SEND,
                    };
                    // Decode the failed WQE now, before the ring slot can
                    // be reused.
                    q.sq.record_failure(r.start, &wc);
                } else {
                    let (id, slot) = q.rq.complete(counter).ok_or(Error::CqeCorrupt)?;
                    wc.wr_id = id;
                    wc.opcode = WcOpcode::RECV;
                    q.rq.record_failure(slot, &wc);
                }
                // The hardware has moved the QP to the error state; later
                // WQEs will complete with flush errors.
                q.sq.set_error();
                q.rq.set_state(QpState::Error);
            }
            _ => return Err(Error::CqeCorrupt),
        }
        Ok(Step::Out(wc))
    }

    /// Scatter-to-CQE (docs/spec/mlx5.md §8): format 1 holds up to 32 bytes at the start
    /// of the 64-byte CQE; format 2 up to 64 bytes in the 64 bytes before
    /// it (128-byte CQEs only).
    #[cold]
    fn scatter_from_cqe(
        &self,
        format: u8,
        cqe_ptr: *const u8,
        byte_len: u32,
        segs: impl FnOnce(&mut dyn FnMut(u64, u32) -> bool),
    ) {
        let mut data = [0u8; 64];
        let (src, n) = if format == cqe_format::SCATTER_32 {
            (cqe_ptr, 32)
        } else if self.size_shift == 7 {
            // SAFETY: a 128-byte slot: the first half precedes the CQE64.
            (unsafe { cqe_ptr.sub(64) }, 64)
        } else {
            return;
        };
        // SAFETY: `n` bytes at `src` are inside the software-owned slot.
        unsafe { core::ptr::copy_nonoverlapping(src, data.as_mut_ptr(), n) };
        scatter(&data[..n], byte_len, segs);
    }
}
