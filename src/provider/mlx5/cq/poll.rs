//! The poll loops: the one-entry fast path, the fast requester loops
//! that keep a QP's retirement state in registers, and the general loop.

use super::decode::{probe_req, Step, REQ_BYTE_CNT, REQ_WC};
use super::route::{CqRoute, CqRouteTo, SqRetire};
use super::CompletionQueue;
use crate::error::{Error, Result};
use crate::mmio;
use crate::provider::mlx5::completion::Wc;
use crate::provider::mlx5::layout::{cqe_opcode, CQ_SET_CI};
use crate::provider::mlx5::sq::SendQueue;

impl CompletionQueue {
    /// Polls up to `out.len()` completions into `out`; returns how many.
    /// The consumer-index doorbell record is written once per call.
    ///
    /// A corrupt CQE is consumed and reported as [`Error::CqeCorrupt`] when
    /// it is the first entry of a call; after good entries it is left for
    /// the next call, so no completion is lost. A compressed CQE is never
    /// consumed: [`Error::CqeCompressed`]. Nor is an entry whose QP the
    /// route reports busy ([`CqRoute::busy`]): the poll stops in front of
    /// it, with [`Error::ResourceBusy`] when it is the first entry.
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
        // The closure must fold into the caller like the rest of this path
        // (without the attribute, the object level's lazy route made it a
        // call: +12 instructions per one-entry `rdd_cq_poll_n`).
        self.poll_one_fast(
            #[inline(always)]
            |qpn| route.route(qpn).map(|q| q.sq),
            w,
        )
    }

    /// The straight-line part of a one-entry [`CompletionQueue::poll`],
    /// for callers that keep their own slow path out of line (the C ABI's
    /// bound poll). `sq_for` maps the CQE's QP number to its send queue,
    /// or `None` when no queue of that number is known here (only the
    /// send queue: this path takes requester entries alone).
    ///
    /// `Some(n)` when the next CQE was a successful, user-signaled
    /// requester entry of a QP that `sq_for` knows (`n` = 1, `w` filled,
    /// the doorbell record written) or the CQ was empty (`n` = 0, the
    /// record written); `None` with nothing written to `w` and nothing
    /// changed otherwise, and then a call of [`CompletionQueue::poll`]
    /// handles the entry exactly as a one-entry poll would have. Each
    /// CQE field is read once, and the counter is checked against the
    /// QP's outstanding work before it is used.
    #[inline(always)]
    pub fn poll_one_fast<'q>(
        &mut self,
        sq_for: impl FnOnce(u32) -> Option<&'q mut SendQueue>,
        w: &mut Wc,
    ) -> Option<usize> {
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
        let sq = sq_for(qpn)?;
        let mut rc = sq.retire_cursor();
        let r = rc.retire_signaled(counter)?;
        // SAFETY: `p` is the owned CQE64 the entry came from.
        w.set_words(unsafe { Wc::req_words(&r, p, Wc::words_pair(0, qpn)) });
        sq.commit_retire(&rc);
        // The consumer index is read again here rather than kept from the
        // top (the same value: nothing else writes it); after the owner
        // byte's acquire load and the barrier the compiler loads it anew,
        // which frees a register across the whole path: the typed
        // one-entry poll saves two registers fewer and needs no stack
        // adjustment (3 instructions net), the bound C poll one (1).
        let ci = self.ci.wrapping_add(1);
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

    /// Owner-bit test (docs/spec/mlx5.md §8): the entry at `ci` belongs to software, with
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
                        // A compressed entry, or one whose QP the route
                        // reports busy, is left in place.
                        if e != Error::CqeCompressed && e != Error::ResourceBusy {
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
}

#[cfg(test)]
mod tests {
    //! The fast poll loop and the batch writer on fake queue memory,
    //! without ringing a doorbell (so Miri, which cannot run `sfence`,
    //! checks their pointer arithmetic too).
    use super::*;
    use crate::provider::mlx5::cq::{Mlx5Qp, WcOpcode};
    use crate::provider::mlx5::layout::opcode;
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
