//! Executing one validated WQE between RC QPs: local gather/scatter,
//! RDMA WRITE, READ, atomics and SENDs, receive consumption with RNR, and
//! injected faults. Errors the responder detects follow
//! docs/spec/responder.md: each ends the connection (the responder QP
//! moves to ERROR) and raises the affiliated event it names.

use std::time::{Duration, Instant};

use core::sync::atomic::Ordering;

use super::config::Fault;
use super::cqe::{cqe_image, err_image};
use super::mr::Access;
use super::srq::set_srqn;
use super::state::{Engine, Outcome, RespEvent, Scratch};
use super::wqe::{self, Local, ParsedSend, Seg};
use crate::completion::QpState;
use crate::mmio;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::{cqe_opcode, opcode};

/// Copies `len` bytes described by `src` into `dst` lists of (ptr, len).
///
/// # Safety
/// Every pointer must be valid for its length (checked against the MR
/// table by the caller).
pub(super) unsafe fn sg_copy(src: &[(*mut u8, usize)], dst: &[(*mut u8, usize)]) {
    let (mut si, mut so, mut di, mut dof) = (0, 0, 0, 0);
    while si < src.len() && di < dst.len() {
        let n = (src[si].1 - so).min(dst[di].1 - dof);
        // SAFETY: both ranges are inside validated regions (caller);
        // `copy` tolerates overlap (a QP may write into its own memory).
        unsafe { core::ptr::copy(src[si].0.add(so), dst[di].0.add(dof), n) };
        so += n;
        dof += n;
        if so == src[si].1 {
            si += 1;
            so = 0;
        }
        if dof == dst[di].1 {
            di += 1;
            dof = 0;
        }
    }
}

/// Copies `len` bytes from `src` into the list `dst`, starting `off`
/// bytes into it (stopping at the list's end).
///
/// # Safety
/// `src` is valid for `len` bytes and every piece of `dst` for its
/// length (checked against the MR table by the caller).
pub(super) unsafe fn scatter_at(src: *const u8, len: usize, dst: &[(*mut u8, usize)], off: usize) {
    let (mut done, mut skip) = (0, off);
    for &(p, l) in dst {
        if done == len {
            break;
        }
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = (l - skip).min(len - done);
        // SAFETY: inside both ranges (caller); `copy` tolerates overlap.
        unsafe { core::ptr::copy(src.add(done), p.add(skip), n) };
        done += n;
        skip = 0;
    }
}

/// Executes FETCH_AND_ADD or CMP_AND_SWP on the 8 bytes at `t`; returns
/// the original value.
///
/// # Safety
/// `t` is 8-aligned and inside a registered region.
pub(super) unsafe fn atomic_at(t: *mut u8, op: u8, swap_add: u64, compare: u64) -> u64 {
    // SAFETY: 8 bytes inside a registered region, 8-aligned (caller);
    // atomic with respect to every device operation (engine lock) and to
    // CPU atomics on the same word, in this process or another.
    let cell = unsafe { core::sync::atomic::AtomicU64::from_ptr(t.cast::<u64>()) };
    if op == opcode::ATOMIC_FA {
        cell.fetch_add(swap_add, Ordering::SeqCst)
    } else {
        match cell.compare_exchange(compare, swap_add, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        }
    }
}

/// The responder CQE of a SEND or SEND_WITH_IMM received by QP `bqpn`
/// from QP `src_qpn`.
#[allow(clippy::too_many_arguments)]
pub(super) fn recv_cqe(
    op: u8,
    bqpn: u32,
    counter: u16,
    total: u32,
    imm: u32,
    src_qpn: u32,
    solicited: bool,
    srqn: u32,
) -> [u8; 64] {
    let (op, imm) = match op {
        opcode::SEND_IMM => (cqe_opcode::RESP_SEND_IMM, imm),
        _ => (cqe_opcode::RESP_SEND, 0),
    };
    let mut img = cqe_image(op, bqpn, counter, total, imm);
    img[24..28].copy_from_slice(&src_qpn.to_be_bytes());
    if solicited {
        img[63] |= 0x02;
    }
    set_srqn(&mut img, srqn);
    img
}

/// Who asked for a receive: a QP of this device (whose RNR retries the
/// device counts) or a remote one (whose responder side counts them).
#[derive(Clone, Copy)]
pub(super) enum Requester {
    /// QP index on this device.
    Local(usize),
    /// A QP of another device.
    Remote,
}

impl From<usize> for Requester {
    fn from(i: usize) -> Requester {
        Requester::Local(i)
    }
}

impl From<Option<usize>> for Requester {
    fn from(i: Option<usize>) -> Requester {
        i.map_or(Requester::Remote, Requester::Local)
    }
}

impl Engine {
    /// Resolves a send WQE's local data into `local` (pointer, length)
    /// pieces: the inline bytes in the WQE copy `wbuf`, or each data
    /// segment of `segs` checked against the MR table for PD `pd` with the
    /// rights `need`. Returns the piece count and the total length, or a
    /// local protection error for the first segment that fails.
    pub(super) fn local_list(
        &self,
        pd: u32,
        spec: Local,
        wbuf: &[u8],
        segs: &[Seg],
        local: &mut [(*mut u8, usize)],
        need: Access,
    ) -> Result<(usize, u64), Outcome> {
        match spec {
            Local::Inline { off, len } => {
                local[0] = (wbuf[off..].as_ptr() as *mut u8, len);
                Ok((1, len as u64))
            }
            Local::Segs(n) => {
                let mut total = 0u64;
                for (s, slot) in segs[..n].iter().zip(local.iter_mut()) {
                    let Some(ptr) = self
                        .mrs
                        .check(s.lkey, pd, s.addr, s.len as u64, need, false)
                    else {
                        return Err(Outcome::Fail(syndrome::LOCAL_PROT));
                    };
                    *slot = (ptr, s.len as usize);
                    total += s.len as u64;
                }
                Ok((n, total))
            }
        }
    }

    /// Injected faults that apply to this operation.
    fn fault_for(&mut self, qpn: u32, dest: u32) -> Option<Outcome> {
        for f in &self.faults {
            if let Fault::DropPeer { qpn: d } = *f {
                if d == dest {
                    return Some(Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC));
                }
            }
        }
        let mut hit = None;
        for f in self.faults.iter_mut() {
            if let Fault::FailNth {
                qpn: which,
                nth,
                syndrome,
            } = f
            {
                if which.is_none_or(|w| w == qpn) {
                    if *nth == 1 {
                        hit = Some(*syndrome);
                        *nth = 0;
                    } else if *nth > 1 {
                        *nth -= 1;
                    }
                }
            }
        }
        self.faults
            .retain(|f| !matches!(f, Fault::FailNth { nth: 0, .. }));
        hit.map(Outcome::Fail)
    }

    /// Executes one validated WQE of QP `qi` against its peer.
    pub(super) fn execute(
        &mut self,
        qi: usize,
        p: &ParsedSend,
        sc: &mut Scratch,
        now: Instant,
    ) -> Outcome {
        let Scratch {
            wbuf,
            segs,
            local,
            rsegs,
            dst,
            entry,
        } = sc;
        let threaded = self.threaded;
        let steps = self.steps;
        let delay = self.faults.iter().find_map(|f| match *f {
            Fault::DelayCompletions { time, steps } => Some((time, steps)),
            _ => None,
        });
        let rnr_delay = self.cfg.rnr_delay;
        let q = self.qps[qi].as_mut().expect("checked");
        if let Some((t, s)) = delay {
            let (until, until_step) = *q.hold.get_or_insert((now + t, steps + s));
            if (threaded && now < until) || (!threaded && steps < until_step) {
                return Outcome::Wait;
            }
        }
        if let Some(w) = q.rnr_wait {
            if threaded && now < w {
                return Outcome::Wait;
            }
        }
        if !threaded && q.rnr_step == steps && q.rnr_attempts > 0 {
            return Outcome::Wait;
        }
        let (pd, qpn, dest, remote) = (q.pd, q.qpn, q.dest, q.remote.is_some());
        if p.opcode == opcode::NOP {
            return Outcome::Done(0);
        }
        // Injected faults act on this device's own connections only.
        if !remote {
            if let Some(o) = self.fault_for(qpn, dest) {
                return o;
            }
        }

        // Local side: gather (SEND/WRITE) or scatter (READ/atomics) list.
        let writes_local = matches!(
            p.opcode,
            opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA
        );
        let need = if writes_local {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let (nlocal, total) = match self.local_list(pd, p.local, wbuf, segs, local, need) {
            Ok(v) => v,
            Err(o) => return o,
        };
        if total > 1 << 31 {
            return Outcome::Fail(syndrome::LOCAL_LENGTH);
        }

        if remote {
            // The peer is another process's device (docs/spec/fabric.md).
            return self.send_remote(qi, p, &local[..nlocal], total);
        }

        // Remote side.
        let Some(bi) = self.qp_index(dest) else {
            return Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC);
        };
        let b = self.qps[bi].as_ref().expect("checked");
        if !matches!(b.state, QpState::Rtr | QpState::Rts) || b.dest != qpn {
            return Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC);
        }
        let (bpd, bqpn, baccess, brecv_cq) = (b.pd, b.qpn, b.access, b.recv_cq);
        // 0 for a QP without an SRQ: its responder CQEs stay as they were.
        let bsrqn = b.srq.unwrap_or(0);
        match p.opcode {
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => {
                let (ra, rk) = p.remote;
                if !baccess.contains(Access::REMOTE_WRITE) {
                    return self.responder_fatal(
                        bi,
                        syndrome::REMOTE_INVAL_REQ,
                        RespEvent::Request,
                    );
                }
                let Some(dst) = self
                    .mrs
                    .check(rk, bpd, ra, total, Access::REMOTE_WRITE, true)
                else {
                    return self.responder_fatal(bi, syndrome::REMOTE_ACCESS, RespEvent::Access);
                };
                if p.opcode == opcode::RDMA_WRITE_IMM {
                    // Consumes a receive: check before moving data.
                    match self.take_recv(bi, &mut [], entry, now, rnr_delay, qi) {
                        Err(o) => return o,
                        Ok((counter, _)) => {
                            // SAFETY: ranges validated against the MR table.
                            unsafe { sg_copy(&local[..nlocal], &[(dst, total as usize)]) };
                            let mut img = cqe_image(
                                cqe_opcode::RESP_WR_IMM,
                                bqpn,
                                counter,
                                total as u32,
                                p.imm,
                            );
                            set_srqn(&mut img, bsrqn);
                            self.push_cqe(brecv_cq, &img);
                        }
                    }
                } else {
                    // SAFETY: ranges validated against the MR table.
                    unsafe { sg_copy(&local[..nlocal], &[(dst, total as usize)]) };
                }
                Outcome::Done(total as u32)
            }
            opcode::RDMA_READ => {
                let (ra, rk) = p.remote;
                if !baccess.contains(Access::REMOTE_READ) {
                    return self.responder_fatal(
                        bi,
                        syndrome::REMOTE_INVAL_REQ,
                        RespEvent::Request,
                    );
                }
                let Some(srcp) = self
                    .mrs
                    .check(rk, bpd, ra, total, Access::REMOTE_READ, true)
                else {
                    return self.responder_fatal(bi, syndrome::REMOTE_ACCESS, RespEvent::Access);
                };
                // SAFETY: ranges validated against the MR table.
                unsafe { sg_copy(&[(srcp, total as usize)], &local[..nlocal]) };
                Outcome::Done(total as u32)
            }
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => {
                let (ra, rk) = p.remote;
                if !baccess.contains(Access::REMOTE_ATOMIC) {
                    return self.responder_fatal(
                        bi,
                        syndrome::REMOTE_INVAL_REQ,
                        RespEvent::Request,
                    );
                }
                if ra % 8 != 0 {
                    return self.responder_fatal(bi, syndrome::REMOTE_INVAL_REQ, RespEvent::Access);
                }
                let Some(t) = self.mrs.check(rk, bpd, ra, 8, Access::REMOTE_ATOMIC, true) else {
                    return self.responder_fatal(bi, syndrome::REMOTE_ACCESS, RespEvent::Access);
                };
                let (swap_add, compare) = p.atomic;
                // SAFETY: 8 bytes inside a registered region, 8-aligned.
                let old = unsafe { atomic_at(t, p.opcode, swap_add, compare) };
                let bytes = old.to_ne_bytes();
                // SAFETY: the local SGE is exactly 8 bytes, validated with
                // LOCAL_WRITE.
                unsafe { sg_copy(&[(bytes.as_ptr() as *mut u8, 8)], &local[..nlocal]) };
                Outcome::Done(8)
            }
            _ => {
                // SEND, SEND_IMM, SEND_INV (refused at the responder).
                let (counter, n) =
                    match self.take_recv(bi, &mut rsegs[..], entry, now, rnr_delay, qi) {
                        Err(o) => return o,
                        Ok(v) => v,
                    };
                if p.opcode == opcode::SEND_INVAL {
                    // Only memory windows and MRs made for fast
                    // registration can be invalidated remotely (InfiniBand
                    // Architecture Specification vol. 1, ch. 10, Send with
                    // Invalidate). This device has neither, so the key
                    // names nothing it may invalidate and no key changes.
                    // As rxe (rxe_invalidate_mr refuses every other MR
                    // type, and the responder fails the receive with a
                    // remote invalid request error and moves to ERROR; the
                    // SEND itself was acknowledged), the requester's SEND
                    // completes and the responder's receive does not.
                    self.refuse_invalidate((bi, bqpn, brecv_cq, bsrqn), counter);
                    return Outcome::Done(total as u32);
                }
                if let Err(o) = self.receive_list(
                    (bi, bpd, bqpn, brecv_cq, bsrqn),
                    counter,
                    &rsegs[..n],
                    total,
                    dst,
                ) {
                    return o;
                }
                // SAFETY: ranges validated against the MR table.
                unsafe { sg_copy(&local[..nlocal], &dst[..n]) };
                let img = recv_cqe(
                    p.opcode,
                    bqpn,
                    counter,
                    total as u32,
                    p.imm,
                    qpn,
                    p.solicited,
                    bsrqn,
                );
                self.push_cqe(brecv_cq, &img);
                Outcome::Done(total as u32)
            }
        }
    }

    /// A SEND_WITH_INV's receive `counter`, taken by QP `bi` (number
    /// `bqpn`, receive CQ `brecv_cq`, SRQ `bsrqn` or 0), fails with a
    /// remote invalid request error and the QP moves to ERROR: no region
    /// of this device can be invalidated remotely (see `execute`).
    pub(super) fn refuse_invalidate(
        &mut self,
        (bi, bqpn, brecv_cq, bsrqn): (usize, u32, u32, u32),
        counter: u16,
    ) {
        let synd = syndrome::REMOTE_INVAL_REQ;
        let mut img = err_image(cqe_opcode::RESP_ERR, 0, bqpn, counter, synd);
        set_srqn(&mut img, bsrqn);
        self.push_cqe(brecv_cq, &img);
        self.set_error(bi);
    }

    /// Resolves the scatter list `rsegs` of receive `counter`, taken by
    /// QP `bi` (PD `bpd`, number `bqpn`, receive CQ `brecv_cq`, SRQ
    /// `bsrqn` or 0), into `dst`, for a message of `total` bytes. A piece
    /// outside the MR table fails the receive with a local protection
    /// error, a list too short for the message with a local length error;
    /// either ends the connection (docs/spec/responder.md §2) and is
    /// returned as the requester's outcome.
    pub(super) fn receive_list(
        &mut self,
        (bi, bpd, bqpn, brecv_cq, bsrqn): (usize, u32, u32, u32, u32),
        counter: u16,
        rsegs: &[Seg],
        total: u64,
        dst: &mut [(*mut u8, usize)],
    ) -> Result<(), Outcome> {
        let mut cap: u64 = 0;
        for (i, s) in rsegs.iter().enumerate() {
            let Some(ptr) = self.mrs.check(
                s.lkey,
                bpd,
                s.addr,
                s.len as u64,
                Access::LOCAL_WRITE,
                false,
            ) else {
                let mut img =
                    err_image(cqe_opcode::RESP_ERR, 0, bqpn, counter, syndrome::LOCAL_PROT);
                set_srqn(&mut img, bsrqn);
                self.push_cqe(brecv_cq, &img);
                return Err(self.responder_fatal(bi, syndrome::REMOTE_OP, RespEvent::None));
            };
            dst[i] = (ptr, s.len as usize);
            cap += s.len as u64;
        }
        if total > cap {
            let mut img = err_image(
                cqe_opcode::RESP_ERR,
                0,
                bqpn,
                counter,
                syndrome::LOCAL_LENGTH,
            );
            set_srqn(&mut img, bsrqn);
            self.push_cqe(brecv_cq, &img);
            return Err(self.responder_fatal(bi, syndrome::REMOTE_INVAL_REQ, RespEvent::None));
        }
        Ok(())
    }

    /// The responder had no receive: an RNR NAK, retried up to the
    /// requester's `rnr_retry` (7 = forever), after which the requester's
    /// WR fails with RNR retry exceeded.
    pub(super) fn rnr_nak(
        &mut self,
        requester: Requester,
        now: Instant,
        rnr_delay: Duration,
    ) -> Outcome {
        let Requester::Local(requester) = requester else {
            // A remote requester's retries are counted by the responder
            // side of its link (docs/spec/fabric.md §4).
            return Outcome::Rnr;
        };
        let steps = self.steps;
        let a = self.qps[requester].as_mut().expect("checked");
        a.rnr_attempts += 1;
        a.rnr_step = steps;
        a.rnr_wait = Some(now + rnr_delay);
        if a.rnr_retry != 7 && a.rnr_attempts > a.rnr_retry as u32 {
            return Outcome::Fail(syndrome::RNR_RETRY_EXC);
        }
        Outcome::Rnr
    }

    /// Takes the next posted receive of QP `bi` (from its SRQ if it has
    /// one), or reports RNR (retried up to the requester's `rnr_retry`, 7 =
    /// forever). Fills `segs` with the receive's scatter list (if `segs`
    /// is empty the list is not needed).
    pub(super) fn take_recv(
        &mut self,
        bi: usize,
        segs: &mut [Seg],
        entry: &mut [u8; 1024],
        now: Instant,
        rnr_delay: Duration,
        requester: impl Into<Requester>,
    ) -> core::result::Result<(u16, usize), Outcome> {
        let requester = requester.into();
        let b = self.qps[bi].as_ref().expect("checked");
        if let Some(srqn) = b.srq {
            return self.take_srq_recv(bi, srqn, segs, entry, now, rnr_delay, requester);
        }
        // SAFETY: word 0 (RQ) of the responder's doorbell record.
        let head = unsafe { mmio::read_dbrec(b.dbrec) } & 0xffff;
        if head.wrapping_sub(b.rq_ci) & 0xffff == 0 {
            return Err(self.rnr_nak(requester, now, rnr_delay));
        }
        let slot = (b.rq_ci & (b.rq_cnt - 1)) as usize;
        let stride = b.rq_stride as usize;
        let len = stride.min(entry.len());
        // SAFETY: the entry is inside the RQ ring and was published by the
        // RQ doorbell record (acquire-loaded above).
        unsafe { core::ptr::copy_nonoverlapping(b.rq.add(slot * stride), entry.as_mut_ptr(), len) };
        let counter = b.rq_ci as u16;
        let (bqpn, bcq) = (b.qpn, b.recv_cq);
        let n = if segs.is_empty() {
            Ok(0)
        } else {
            wqe::parse_recv(&entry[..len], segs)
        };
        let b = self.qps[bi].as_mut().expect("checked");
        b.rq_ci = b.rq_ci.wrapping_add(1);
        if let Requester::Local(a) = requester {
            self.qps[a].as_mut().expect("checked").rnr_wait = None;
        }
        match n {
            Ok(n) => Ok((counter, n)),
            Err(s) => {
                let img = err_image(cqe_opcode::RESP_ERR, 0, bqpn, counter, s);
                self.push_cqe(bcq, &img);
                self.set_error(bi);
                Err(Outcome::Fail(syndrome::REMOTE_OP))
            }
        }
    }
}
