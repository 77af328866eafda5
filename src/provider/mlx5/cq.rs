//! mlx5 completion-queue polling (reference §A.8, §A.9).
//!
//! A CQE is device-written memory: the poller loads the ownership byte
//! once (acquire), issues the from-device barrier, copies the entry once
//! into a local, and only then decodes it. Every index derived from a CQE
//! is masked and checked against outstanding work before it is used, so a
//! corrupt entry is reported, never followed.

use core::ptr::NonNull;

pub use super::completion::{syndrome, wc_flags, Wc, WcOpcode, WcStatus};
use super::completion::{QpState, Retired};
use super::layout::{
    cqe_format, cqe_opcode, opcode, Cqe64, Mlx5dvCq, CQ_ARM_DB, CQ_DOORBELL, CQ_SET_CI,
};
use super::rq::RecvQueue;
use super::sq::SendQueue;
use crate::error::{Error, Result};
use crate::mmio;

/// Requester completion per mlx5 WQE opcode (reference §A.8): bits 0..7
/// the `ibv_wc_opcode`, 8..15 `wc_flags`, bit 16 ([`REQ_BYTE_CNT`]) "the
/// byte length is the CQE's byte count", bits 24..31 a fixed byte length
/// (8 for atomics). NOP and unknown opcodes complete as SEND.
const REQ_WC: [u32; 32] = {
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
const REQ_BYTE_CNT: u32 = 1 << 16;

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
fn probe_req(
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
    unsafe fn req_words(r: &Retired, p: *const u8, qpn_word: u64) -> [u64; 6] {
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
    const fn words_pair(a: u32, b: u32) -> u64 {
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
    fn set_words(&mut self, words: [u64; 6]) {
        // SAFETY: Wc is 48 bytes and 8-aligned, and every bit pattern is a
        // valid Wc (plain integers only).
        unsafe { (self as *mut Wc).cast::<[u64; 6]>().write(words) };
    }

    /// Fills a successful requester completion: six aligned 8-byte stores
    /// of composed words instead of one store per field.
    #[inline(always)]
    fn set_requester(&mut self, wr_id: u64, opcode: u32, byte_len: u32, qpn: u32, flags: u32) {
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

/// What the completion poller needs from a send queue: in-order
/// retirement, the WQE's local buffers (for scatter-to-CQE) and the error
/// state. Implemented by the single-owner [`SendQueue`] and by the retire
/// handle of a [`super::shared::SharedSendQueue`].
pub trait SqRetire {
    /// Retires the WQE at 16-bit index `counter` and everything before it
    /// (see [`SendQueue::retire`]).
    fn retire(&mut self, counter: u16) -> Option<Retired>;
    /// Calls `f(addr, len)` for the local data segments of the READ or
    /// atomic WQE at BB `start`.
    fn for_each_data_seg(&self, start: u32, f: impl FnMut(u64, u32) -> bool);
    /// Records that the QP entered the error state.
    fn set_error(&mut self);
    /// Records the failure of the WQE at BB `start` (cold path).
    fn record_failure(&mut self, start: u32, wc: &Wc) {
        let _ = (start, wc);
    }
}

impl SqRetire for SendQueue {
    #[inline(always)]
    fn retire(&mut self, counter: u16) -> Option<Retired> {
        SendQueue::retire(self, counter)
    }
    fn for_each_data_seg(&self, start: u32, f: impl FnMut(u64, u32) -> bool) {
        SendQueue::for_each_data_seg(self, start, f)
    }
    fn set_error(&mut self) {
        self.set_state(QpState::Error);
    }
    fn record_failure(&mut self, start: u32, wc: &Wc) {
        SendQueue::record_failure(self, start, wc)
    }
}

/// The send and receive queue of one QP, as the poller sees them.
pub struct QpQueues<'q, S: ?Sized = SendQueue> {
    /// Send queue (or its retire handle).
    pub sq: &'q mut S,
    /// Receive queue.
    pub rq: &'q mut RecvQueue,
}

/// Finds the queues a CQE belongs to, by QP number.
pub trait CqRoute {
    /// The queues of QP `qpn`, if this route owns it.
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>>;
}

/// The general form of [`CqRoute`]: routes to any kind of send queue
/// ([`SqRetire`]). Every [`CqRoute`] is a `CqRouteTo<SendQueue>`.
pub trait CqRouteTo<S: SqRetire + ?Sized> {
    /// The queues of QP `qpn`, if this route owns it.
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, S>>;
}

impl<R: CqRoute + ?Sized> CqRouteTo<SendQueue> for R {
    #[inline(always)]
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, SendQueue>> {
        self.route(qpn)
    }
}

/// One QP's queues: the route for a CQ that serves a single QP.
pub struct Mlx5Qp {
    /// Send queue.
    pub sq: SendQueue,
    /// Receive queue.
    pub rq: RecvQueue,
}

impl CqRoute for Mlx5Qp {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        if qpn == self.sq.qpn() {
            Some(QpQueues {
                sq: &mut self.sq,
                rq: &mut self.rq,
            })
        } else {
            None
        }
    }
}

impl CqRoute for [Mlx5Qp] {
    #[inline]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.iter_mut()
            .find(|q| q.sq.qpn() == qpn)
            .map(|q| QpQueues {
                sq: &mut q.sq,
                rq: &mut q.rq,
            })
    }
}

/// An mlx5 completion queue over caller-provided memory.
pub struct CompletionQueue {
    buf: NonNull<u8>,
    mask: u32,
    log_cnt: u32,
    /// log2 of the CQE size (6 or 7).
    size_shift: u32,
    /// The CQE64 of slot 0 (`buf + cqe_size - 64`), precomputed for the
    /// poll loops.
    cqe64_base: NonNull<u8>,
    ci: u32,
    dbrec: NonNull<u32>,
    uar: Option<NonNull<u8>>,
    cqn: u32,
    arm_sn: u32,
    stale: u64,
    scatter: bool,
}

// SAFETY: exclusive ownership of the CQ consumer side (constructor).
unsafe impl Send for CompletionQueue {}

/// Outcome of decoding one owned CQE.
enum Step {
    /// Produce this completion.
    Out(Wc),
    /// Consumed internally (forced-signal CQE, stale QPN).
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

impl CompletionQueue {
    /// Wraps a CQ described by `mlx5dv_init_obj` fields.
    ///
    /// # Safety
    /// `cq.buf` points to `cqe_cnt * cqe_size` bytes written by the device
    /// and read only by this poller; `cq.dbrec` to the two CQ doorbell
    /// words, written only by this poller; `cq.cq_uar`, if not NULL, to
    /// the UAR page whose arm register is at `+0x20`. All for the life of
    /// the queue.
    pub unsafe fn from_raw(cq: &Mlx5dvCq) -> Result<CompletionQueue> {
        let cnt = cq.cqe_cnt;
        if cnt < 2
            || !cnt.is_power_of_two()
            || (cq.cqe_size != 64 && cq.cqe_size != 128)
            || cnt > 1 << 24
        {
            return Err(Error::InvalidGeometry);
        }
        let buf = NonNull::new(cq.buf).ok_or(Error::InvalidGeometry)?;
        let dbrec = NonNull::new(cq.dbrec).ok_or(Error::InvalidGeometry)?;
        if buf.as_ptr() as usize % 64 != 0 || dbrec.as_ptr() as usize % 4 != 0 {
            return Err(Error::InvalidGeometry);
        }
        let uar = NonNull::new(cq.cq_uar);
        if let Some(u) = uar {
            if u.as_ptr() as usize % 8 != 0 {
                return Err(Error::InvalidGeometry);
            }
        }
        Ok(CompletionQueue {
            buf,
            mask: cnt - 1,
            log_cnt: cnt.trailing_zeros(),
            size_shift: cq.cqe_size.trailing_zeros(),
            // SAFETY: cqe_size (64 or 128) bytes from `buf` lie inside the
            // buffer (contract; cnt >= 2).
            cqe64_base: unsafe { buf.add(cq.cqe_size as usize - 64) },
            ci: 0,
            dbrec,
            uar,
            cqn: cq.cqn,
            arm_sn: 0,
            stale: 0,
            scatter: true,
        })
    }

    /// Marks every entry of a CQ buffer as hardware-owned and invalid
    /// (`op_own = 0xf0`), as libmlx5 does at creation (§A.8).
    ///
    /// # Safety
    /// `buf` valid for `cnt * size` bytes, no concurrent users.
    pub unsafe fn init_buffer(buf: *mut u8, cnt: u32, size: u32) {
        for i in 0..cnt as usize {
            // SAFETY: inside the buffer per the contract.
            unsafe { mmio::store_op_own(buf.add(i * size as usize + size as usize - 1), 0xf0) };
        }
    }

    /// Free-running consumer index.
    #[inline]
    pub fn consumer_index(&self) -> u32 {
        self.ci
    }
    /// Sets the consumer index (after a reset, or to adopt a CQ in use).
    pub fn set_consumer_index(&mut self, ci: u32) {
        self.ci = ci;
    }
    /// Number of entries.
    #[inline]
    pub fn cqe_cnt(&self) -> u32 {
        self.mask + 1
    }
    /// Enables or disables scatter-to-CQE handling (on by default). With it
    /// off, a CQE carrying inline data is reported as
    /// [`Error::CqeCorrupt`] instead of being copied into the posted
    /// buffer; the safe API turns it off because it creates its QPs with
    /// scatter-to-CQE disabled and never trusts an unexpected copy target.
    pub fn set_scatter_to_cqe(&mut self, on: bool) {
        self.scatter = on;
    }

    /// CQEs skipped because they named a QP the route did not own (stale
    /// entries of destroyed QPs, reference §A.1).
    pub fn stale_cqes(&self) -> u64 {
        self.stale
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    /// The consumer-index doorbell record is written once per call.
    ///
    /// A corrupt CQE is consumed and reported as [`Error::CqeCorrupt`] when
    /// it is the first entry of a call; after good entries it is left for
    /// the next call, so no completion is lost. A compressed CQE is never
    /// consumed: [`Error::CqeCompressed`].
    #[inline(always)]
    pub fn poll<R: CqRoute + ?Sized>(&mut self, route: &mut R, out: &mut [Wc]) -> Result<usize> {
        // A one-entry poll (known at compile time when `out` is an array)
        // takes straight-line code without the loops' state.
        // Its other cases go to the loops out of line, so the common case
        // needs no saved registers.
        if let [w] = out {
            if let Some(n) = self.poll_single_sq(route, w) {
                return Ok(n);
            }
            return self.poll_loops(route, out);
        }
        self.poll_loops_inline(route, out)
    }

    /// The loops of [`CompletionQueue::poll`], out of line.
    #[inline(never)]
    fn poll_loops<R: CqRoute + ?Sized>(&mut self, route: &mut R, out: &mut [Wc]) -> Result<usize> {
        self.poll_loops_inline(route, out)
    }

    /// The loops of [`CompletionQueue::poll`].
    #[inline(always)]
    fn poll_loops_inline<R: CqRoute + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
    ) -> Result<usize> {
        // The fast loop keeps a QP's retirement state in registers for a
        // run of its CQEs; any entry it does not handle goes to the
        // out-of-line general loop (shared with `poll_to`).
        let (n, ci, done) = self.poll_fast_sq(route, out);
        if done {
            self.ci = ci;
            // SAFETY: constructor contract on the CQ doorbell record.
            unsafe { mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_SET_CI), ci & 0x00ff_ffff) };
            return Ok(n);
        }
        self.poll_general::<SendQueue, R>(route, out, n, ci)
    }

    /// [`CompletionQueue::poll`] into a single slot, for the common case
    /// only: the next CQE is a successful requester entry of a routed QP
    /// whose WR asked for a completion. Then it is consumed, `w` filled,
    /// the doorbell record written, and `Some(1)` returned; an empty CQ is
    /// `Some(0)` (the record is written then too). Anything else returns
    /// `None` with nothing changed, for the loops to handle. Each CQE field is read once, and the counter is
    /// checked against the QP's outstanding work before it is used.
    #[inline(always)]
    fn poll_single_sq<R: CqRoute + ?Sized>(&mut self, route: &mut R, w: &mut Wc) -> Option<usize> {
        let ci = self.ci;
        let (mask, shift) = (self.mask, self.size_shift);
        let p = match probe_req(self.cqe64_base.as_ptr(), mask, mask + 1, shift, ci) {
            Ok(p) => p,
            Err(true) => {
                // Empty: the record is still written once per call, as the
                // loops do.
                // SAFETY: constructor contract on the CQ doorbell record.
                unsafe { mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_SET_CI), ci & 0x00ff_ffff) };
                return Some(0);
            }
            Err(false) => return None,
        };
        // SAFETY: the entry belongs to software; fixed, aligned offsets.
        let (sdq_raw, counter) = unsafe {
            (
                p.add(56).cast::<u32>().read(),
                u16::from_be(p.add(60).cast::<u16>().read()),
            )
        };
        let qpn = u32::from_be(sdq_raw) & 0x00ff_ffff;
        let q = route.route(qpn)?;
        let mut rc = q.sq.retire_cursor();
        let r = rc.retire(counter)?;
        if !r.user_signaled {
            return None;
        }
        // SAFETY: `p` is the owned CQE64 the entry came from.
        w.set_words(unsafe { Wc::req_words(&r, p, Wc::words_pair(0, qpn)) });
        q.sq.commit_retire(&rc);
        let ci = ci.wrapping_add(1);
        self.ci = ci;
        // SAFETY: constructor contract on the CQ doorbell record.
        unsafe { mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_SET_CI), ci & 0x00ff_ffff) };
        Some(1)
    }

    /// The fast loop of [`CompletionQueue::poll`]: consumes successful
    /// requester CQEs without inline data; stops at an empty slot or a full
    /// `out` (`done` = true) or at any other entry (`done` = false, nothing
    /// consumed for it). Each CQE field is read once; the counter is
    /// checked against the QP's outstanding work before it is used.
    ///
    /// The routed QP's retirement state ([`RetireCursor`]) stays in locals
    /// while consecutive CQEs name the same QP, and is written back once
    /// per run.
    #[inline(always)]
    fn poll_fast_sq<R: CqRoute + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
    ) -> (usize, u32, bool) {
        let mut ci = self.ci;
        let (base, mask, shift) = (self.cqe64_base.as_ptr(), self.mask, self.size_shift);
        let cnt = mask + 1;
        let probe = |ci: u32| probe_req(base, mask, cnt, shift, ci);
        let mut n = 0usize;
        if out.is_empty() {
            return (0, ci, true);
        }
        let mut p = match probe(ci) {
            Ok(p) => p,
            Err(empty) => return (0, ci, empty),
        };
        // SAFETY: the entry belongs to software; fixed, aligned offset.
        let mut sdq_raw = unsafe { p.add(56).cast::<u32>().read() };
        loop {
            let qpn = u32::from_be(sdq_raw) & 0x00ff_ffff;
            let Some(q) = route.route(qpn) else {
                return (n, ci, false);
            };
            let sq = q.sq;
            let mut rc = sq.retire_cursor();
            // The QPN bytes of `sop_drop_qpn` as stored (big-endian).
            let key = sdq_raw & 0x00ff_ffff_u32.to_be();
            let qpn_word = Wc::words_pair(0, qpn);
            let stop = loop {
                // SAFETY: the entry belongs to software; fixed, aligned
                // offset.
                let counter = u16::from_be(unsafe { p.add(60).cast::<u16>().read() });
                let Some(r) = rc.retire(counter) else {
                    break (false, false);
                };
                ci = ci.wrapping_add(1);
                if r.user_signaled {
                    // SAFETY: `p` is the owned CQE64 the entry came from.
                    let words = unsafe { Wc::req_words(&r, p, qpn_word) };
                    // SAFETY: n < out.len(): `out` is not empty, and the
                    // loop returns as soon as n reaches its length.
                    let w = unsafe { out.get_unchecked_mut(n) };
                    w.set_words(words);
                    n += 1;
                    if n == out.len() {
                        break (true, true);
                    }
                }
                match probe(ci) {
                    Ok(np) => p = np,
                    Err(empty) => break (true, empty),
                }
                // SAFETY: as above.
                sdq_raw = unsafe { p.add(56).cast::<u32>().read() };
                if sdq_raw & 0x00ff_ffff_u32.to_be() != key {
                    // Another QP: write this one back and route again.
                    break (false, true);
                }
            };
            sq.commit_retire(&rc);
            match stop {
                (true, done) => return (n, ci, done),
                (false, false) => return (n, ci, false),
                (false, true) => {}
            }
        }
    }

    /// [`CompletionQueue::poll`] for routes to any kind of send queue (for
    /// example shared, multi-producer ones).
    #[inline(always)]
    pub fn poll_to<S: SqRetire + ?Sized, R: CqRouteTo<S> + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
    ) -> Result<usize> {
        // The fast loop makes no calls, so it needs no saved registers; any
        // entry it does not handle goes to the out-of-line general loop.
        let (n, ci, done) = self.poll_fast(route, out);
        if done {
            self.ci = ci;
            // SAFETY: constructor contract on the CQ doorbell record.
            unsafe { mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_SET_CI), ci & 0x00ff_ffff) };
            return Ok(n);
        }
        self.poll_general(route, out, n, ci)
    }

    /// Address of the 64-byte CQE at consumer index `ci`.
    #[inline(always)]
    fn cqe_at(&self, ci: u32) -> *mut u8 {
        let slot = ((ci & self.mask) as usize) << self.size_shift;
        // SAFETY: slot < cqe_cnt * cqe_size, and the CQE64 is the last 64
        // bytes of the slot (cqe_size >= 64).
        unsafe {
            self.buf
                .as_ptr()
                .add(slot + (1usize << self.size_shift) - 64)
        }
    }

    /// Owner-bit test (§A.8): the entry at `ci` belongs to software, with
    /// its `op_own` byte; `None` if hardware still owns it.
    #[inline(always)]
    fn owned(&self, cqe_ptr: *const u8, ci: u32) -> Option<u8> {
        // SAFETY: byte 63 of a CQE inside the buffer.
        let op_own = unsafe { mmio::load_op_own(cqe_ptr.add(63)) };
        if op_own >> 4 == cqe_opcode::INVALID || (op_own as u32 ^ (ci >> self.log_cnt)) & 1 != 0 {
            return None;
        }
        // Order the owner load before the loads of the other fields.
        mmio::from_device_barrier();
        Some(op_own)
    }

    /// Consumes successful requester CQEs without inline data (the common
    /// case); stops at an empty slot (`done` = true) or at any other entry
    /// (`done` = false, nothing consumed for it). Each field is read once,
    /// and the counter is checked by `retire` before it is used.
    #[inline(always)]
    fn poll_fast<S: SqRetire + ?Sized, R: CqRouteTo<S> + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
    ) -> (usize, u32, bool) {
        let mut n = 0usize;
        let mut ci = self.ci;
        // Locals: the acquire load of each owner byte would otherwise make
        // the compiler reload these fields for every entry.
        let (buf, mask, shift, log_cnt) =
            (self.buf.as_ptr(), self.mask, self.size_shift, self.log_cnt);
        // SAFETY: cqe_size >= 64: the CQE64 is the last 64 bytes of a slot.
        let base = unsafe { buf.add((1usize << shift) - 64) };
        while n < out.len() {
            // SAFETY: (ci & mask) < cqe_cnt: the CQE is inside the buffer.
            let cqe_ptr = unsafe { base.add(((ci & mask) as usize) << shift) };
            // SAFETY: byte 63 of that CQE.
            let op_own = unsafe { mmio::load_op_own(cqe_ptr.add(63)) };
            // One test for "owned by software, opcode REQ, no inline data"
            // (the solicited bit, 1, is ignored); anything else leaves the
            // loop, and only then is "empty" told apart from "other".
            let owner = (ci >> log_cnt) & 1;
            if (op_own as u32 ^ owner) & 0xfd != 0 {
                let empty = op_own >> 4 == cqe_opcode::INVALID
                    || (op_own as u32 ^ (ci >> log_cnt)) & 1 != 0;
                return (n, ci, empty);
            }
            mmio::from_device_barrier();
            // SAFETY: the entry belongs to software (owner bit); the fields
            // are at fixed, aligned offsets of the 64-byte CQE.
            let (sdq, counter, byte_cnt) = unsafe {
                (
                    u32::from_be(cqe_ptr.add(56).cast::<u32>().read()),
                    u16::from_be(cqe_ptr.add(60).cast::<u16>().read()),
                    u32::from_be(cqe_ptr.add(44).cast::<u32>().read()),
                )
            };
            let qpn = sdq & 0x00ff_ffff;
            let Some(q) = route.route_to(qpn) else {
                return (n, ci, false);
            };
            let Some(r) = q.sq.retire(counter) else {
                return (n, ci, false);
            };
            ci = ci.wrapping_add(1);
            if r.user_signaled {
                let m = REQ_WC[(r.opcode & 0x1f) as usize];
                let byte_len = if m & REQ_BYTE_CNT != 0 {
                    byte_cnt
                } else {
                    m >> 24
                };
                out[n].set_requester(r.wr_id, m & 0xff, byte_len, qpn, (m >> 8) & 0xff);
                n += 1;
            }
        }
        (n, ci, true)
    }

    /// Every kind of entry, from the first one the fast loop left, then
    /// the consumer-index update.
    #[cold]
    #[inline(never)]
    fn poll_general<S: SqRetire + ?Sized, R: CqRouteTo<S> + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
        mut n: usize,
        mut ci: u32,
    ) -> Result<usize> {
        let mut result = Ok(());
        while n < out.len() {
            let cqe_ptr = self.cqe_at(ci);
            let Some(op_own) = self.owned(cqe_ptr, ci) else {
                break;
            };
            match self.decode(route, op_own, cqe_ptr) {
                Ok(Step::Out(wc)) => {
                    out[n] = wc;
                    n += 1;
                    ci = ci.wrapping_add(1);
                }
                Ok(Step::Skip) => ci = ci.wrapping_add(1),
                Err(e) => {
                    if n == 0 {
                        if e != Error::CqeCompressed {
                            ci = ci.wrapping_add(1);
                        }
                        result = Err(e);
                    }
                    break;
                }
            }
        }
        self.ci = ci;
        // SAFETY: constructor contract on the CQ doorbell record.
        unsafe { mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_SET_CI), ci & 0x00ff_ffff) };
        result.map(|()| n)
    }

    /// Decodes any owned entry: responder and error CQEs, inline data,
    /// corrupt entries.
    #[inline(always)]
    fn decode<S: SqRetire + ?Sized, R: CqRouteTo<S> + ?Sized>(
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
        let Some(q) = route.route_to(qpn) else {
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

    /// Scatter-to-CQE (§A.8): format 1 holds up to 32 bytes at the start
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

    /// Requests an event for the next completion (or the next solicited
    /// one): arm word into the doorbell record, then a 64-bit store to the
    /// UAR's CQ doorbell (§A.8). Fails if the CQ has no UAR.
    pub fn arm(&mut self, solicited_only: bool) -> Result<()> {
        let uar = self.uar.ok_or(Error::InvalidGeometry)?;
        let sn = self.arm_sn & 3;
        let cmd = if solicited_only { 1u32 << 24 } else { 0 };
        let word = sn << 28 | cmd | (self.ci & 0x00ff_ffff);
        // SAFETY: constructor contract on the doorbell record and UAR.
        unsafe {
            mmio::write_dbrec(self.dbrec.as_ptr().add(CQ_ARM_DB), word);
            mmio::wc_start();
            mmio::mmio_write64(
                uar.as_ptr().add(CQ_DOORBELL),
                (((word as u64) << 32) | self.cqn as u64).to_be(),
            );
            mmio::wc_flush();
        }
        Ok(())
    }

    /// Records that a CQ event was consumed (advances the arm sequence
    /// number, as `mlx5_cq_event`).
    pub fn event_consumed(&mut self) {
        self.arm_sn = self.arm_sn.wrapping_add(1);
    }

    /// Records `n` consumed CQ events (the arm sequence number is 2 bits:
    /// only `n` mod 4 matters).
    pub fn events_consumed(&mut self, n: u32) {
        self.arm_sn = self.arm_sn.wrapping_add(n & 3);
    }
}

#[cfg(test)]
mod tests {
    //! The fast poll loop and the batch writer on fake queue memory,
    //! without ringing a doorbell (so Miri, which cannot run `sfence`,
    //! checks their pointer arithmetic too).
    use super::*;
    use crate::testutil::{FakeGeometry, FakeMlx5};
    use crate::wr::{Remote, SendFlags, SendOp, SendWr, Sge};

    fn cqe(opcode: u8, qpn: u32, counter: u16) -> [u8; 64] {
        let mut c = [0u8; 64];
        c[56..60].copy_from_slice(&((opcode as u32) << 24 | qpn).to_be_bytes());
        c[60..62].copy_from_slice(&counter.to_be_bytes());
        c
    }

    #[test]
    fn fast_poll_retires_a_batch_and_stops_at_bad_entries() {
        let geo = FakeGeometry {
            sq_wqe_cnt: 16,
            cqe_cnt: 4,
            ..FakeGeometry::default()
        };
        let mut f = FakeMlx5::new(geo);
        let caps = f.caps(2, 32);
        let sq = f.send_queue(caps, Default::default()).unwrap();
        let rq = f.recv_queue(caps).unwrap();
        let mut cq = f.completion_queue().unwrap();
        let mut qp = Mlx5Qp { sq, rq };
        let qpn = qp.sq.qpn();
        let sge = [Sge::new(0x1000, 8, 7)];
        let write = SendOp::Write {
            remote: Remote::new(0x2000, 9),
        };
        // Three WQEs, the middle one unsignaled; the batch is dropped
        // without a doorbell (pending).
        {
            let mut b = qp.sq.batch();
            for (id, fl) in [(10, SendFlags::SIGNALED), (11, SendFlags::NONE)] {
                // SAFETY: fake memory; the SGE is never dereferenced.
                unsafe { b.post(&SendWr::new(id, write, &sge, fl)) }.unwrap();
            }
            let read = SendOp::Read {
                remote: Remote::new(0x3000, 9),
            };
            // SAFETY: as above.
            unsafe { b.post(&SendWr::new(12, read, &sge, SendFlags::SIGNALED)) }.unwrap();
        }
        assert_eq!((qp.sq.producer(), qp.sq.pending()), (3, 3));
        // CQEs for WQE 0 and WQE 2 (retiring the unsignaled 1 with it); the
        // READ reports the CQE's byte count.
        f.write_cqe(0, &cqe(opcode::RDMA_WRITE, qpn, 0));
        let mut c = cqe(opcode::RDMA_READ, qpn, 2);
        c[44..48].copy_from_slice(&8u32.to_be_bytes());
        f.write_cqe(1, &c);
        let mut wc = [Wc::default(); 4];
        assert_eq!(cq.poll(&mut qp, &mut wc[..1]), Ok(1));
        assert_eq!((wc[0].wr_id, wc[0].opcode), (10, WcOpcode::RDMA_WRITE));
        assert_eq!(cq.poll(&mut qp, &mut wc), Ok(1));
        assert_eq!(
            (wc[0].wr_id, wc[0].opcode, wc[0].byte_len, wc[0].qp_num),
            (12, WcOpcode::RDMA_READ, 8, qpn)
        );
        assert_eq!(qp.sq.retired(), 3);
        assert_eq!(cq.poll(&mut qp, &mut wc), Ok(0), "empty CQ");
        // A counter naming no outstanding WQE is refused, never followed.
        f.write_cqe(2, &cqe(opcode::RDMA_WRITE, qpn, 7));
        assert_eq!(cq.poll(&mut qp, &mut wc), Err(Error::CqeCorrupt));
        assert_eq!(qp.sq.retired(), 3);
        // A CQE of another QP is skipped as stale; the ring wraps (pass 1).
        f.write_cqe(3, &cqe(opcode::RDMA_WRITE, qpn + 1, 0));
        assert_eq!(cq.poll(&mut qp, &mut wc), Ok(0));
        assert_eq!((cq.stale_cqes(), cq.consumer_index()), (1, 4));
    }
}
