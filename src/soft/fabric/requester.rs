//! The requester side of a remote QP (docs/spec/fabric.md §4): send WQEs
//! become request packets, responses complete them in order, and a peer
//! that stops answering or dies fails them within a bound.

use std::collections::VecDeque;
use std::time::{Duration, Instant};
use std::vec::Vec;

use super::link::{LinkIn, LinkOut};
use super::responder::RxState;
use super::wire::{self, Req, Resp, RespKind, PACKET, RESP_BYTES, TAG_REQ, TAG_RESP};
use super::{gid_pid, peer, trace};
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::{cqe_opcode, opcode};
use crate::soft::cqe::{cqe_image, err_image};
use crate::soft::state::{Engine, Outcome};
use crate::soft::wqe::{ParsedSend, MAX_SEGS};

/// How often a requester with work outstanding checks that its peer's
/// process still runs.
const ALIVE_EVERY: Duration = Duration::from_millis(10);
/// The most one gap between this device's passes adds to a QP's wait for
/// an acknowledgement. A longer gap means this device was not running (a
/// loaded or paused machine), not that the peer was silent: counting it
/// whole would fail the QP the moment this device runs again, before the
/// peer, descheduled alike, had a chance to answer.
const MAX_PASS_GAP: Duration = Duration::from_millis(10);
/// How often a QP whose peer has not made its segment yet looks again.
const ATTACH_EVERY: Duration = Duration::from_millis(1);

/// Where one WQE of a remote QP stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Track {
    /// Sent, not answered yet.
    Pending,
    /// Completed with this byte count.
    Done(u32),
    /// Failed with this syndrome.
    Fail(u8),
}

/// A WQE of a remote QP that has left the send queue but has not been
/// completed yet (completions are written strictly in WQE order).
struct Inflight {
    index: u16,
    wqe_op: u8,
    signaled: bool,
    track: Track,
    bytes: u32,
    first_seq: u32,
    last_seq: u32,
    /// Where READ data or an atomic's original value goes (local
    /// memory checked against the MR table when the WQE was sent).
    scatter: Vec<(*mut u8, usize)>,
}

/// `a` comes before `b` in (wrapping) sequence order.
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// A QP connected to a QP of another process's device.
pub(crate) struct Remote {
    pub(crate) peer_gid: [u8; 16],
    pub(crate) peer_qpn: u32,
    pub(crate) out: LinkOut,
    pub(crate) inc: Option<LinkIn>,
    next_attach: Instant,
    /// The peer wrote something that is not a valid packet, or a
    /// response that matches no outstanding WQE: nothing more is read.
    pub(crate) broken: bool,
    seq: u32,
    /// Packets of the WQE at the head of the send queue already pushed
    /// (a message cut into packets may wait for ring space).
    tx_next: u32,
    tx_first: u32,
    inflight: VecDeque<Inflight>,
    /// Time counted against `ack_bound` since the peer last answered (or
    /// since the first outstanding WQE was sent): the gaps between this
    /// device's passes, each at most [`MAX_PASS_GAP`].
    waited: Duration,
    /// This device's last pass of the QP.
    last_pass: Instant,
    /// The acknowledgement bound: the IB local ACK timeout times the
    /// retry count plus one (none for a timeout of 0, as on IB).
    pub(crate) ack_bound: Option<Duration>,
    pub(crate) rnr_retry: u8,
    next_alive: Instant,
    pub(crate) rx: RxState,
}

impl Remote {
    /// A remote QP whose outgoing segment is `out`.
    pub(crate) fn new(peer_gid: [u8; 16], peer_qpn: u32, out: LinkOut, now: Instant) -> Remote {
        Remote {
            peer_gid,
            peer_qpn,
            out,
            inc: None,
            next_attach: now,
            broken: false,
            seq: 0,
            tx_next: 0,
            tx_first: 0,
            inflight: VecDeque::new(),
            waited: Duration::ZERO,
            last_pass: now,
            ack_bound: None,
            rnr_retry: 7,
            next_alive: now,
            rx: RxState::default(),
        }
    }

    /// The peer answered (or the QP had nothing outstanding): the wait for
    /// an acknowledgement starts again.
    fn progress(&mut self) {
        self.waited = Duration::ZERO;
    }

    /// Sets the bound from the RTS attributes: 4.096 µs · 2^`timeout`
    /// per try, `retry_cnt` + 1 tries (IB vol. 1, 9.7.6.1.3).
    pub(crate) fn set_timer(&mut self, timeout: u8, retry_cnt: u8, rnr_retry: u8) {
        self.ack_bound = (timeout != 0)
            .then(|| Duration::from_nanos(4096u64 << timeout.min(31)) * (u32::from(retry_cnt) + 1));
        self.rnr_retry = rnr_retry;
    }

    /// The QP moved to ERROR by a state change: what was sent and not
    /// answered is flushed (what completed keeps its result).
    pub(crate) fn flush_pending(&mut self) {
        self.tx_next = 0;
        for e in self.inflight.iter_mut() {
            if e.track == Track::Pending {
                e.track = Track::Fail(syndrome::WR_FLUSHED);
            }
        }
    }

    /// Fails the first unanswered WQE with `synd` and flushes the rest.
    fn fail_pending(&mut self, synd: u8) {
        self.tx_next = 0;
        let mut first = true;
        for e in self.inflight.iter_mut() {
            if e.track == Track::Pending {
                e.track = Track::Fail(if first { synd } else { syndrome::WR_FLUSHED });
                first = false;
            }
        }
    }

    /// Marks the link broken (nothing more is read from it), saying why
    /// under `RDD_FABRIC_TRACE`.
    pub(crate) fn break_link(&mut self, qpn: u32, why: &str) {
        if !self.broken {
            trace(qpn, format_args!("the link breaks: {why}"));
        }
        self.broken = true;
    }

    fn has_pending(&self) -> bool {
        self.inflight.iter().any(|e| e.track == Track::Pending)
    }

    /// Applies one response; `data` holds its payload (`resp.len` bytes
    /// of the peer's ring). Returns the syndrome of a NAK.
    ///
    /// # Safety
    /// `data` is valid for `resp.len` bytes.
    unsafe fn apply(&mut self, resp: &Resp, data: *const u8) -> Result<Option<u8>, ()> {
        let s = resp.seq;
        let mut nak = None;
        for e in self.inflight.iter_mut() {
            if e.track != Track::Pending {
                continue;
            }
            if before(e.last_seq, s) {
                // Acknowledged by a later answer; a READ or an atomic
                // cannot be: its own answers come first.
                if !e.scatter.is_empty() || e.wqe_op == opcode::RDMA_READ {
                    return Err(());
                }
                e.track = Track::Done(e.bytes);
                continue;
            }
            if before(s, e.first_seq) {
                break;
            }
            // `s` names a packet of `e`.
            match resp.kind {
                RespKind::Ack => {
                    if e.last_seq == s {
                        e.track = Track::Done(e.bytes);
                    }
                }
                RespKind::RnrWait => {}
                RespKind::Nak => {
                    e.track = Track::Fail(resp.syndrome);
                    nak = Some(resp.syndrome);
                }
                RespKind::ReadData | RespKind::Atomic => {
                    let atomic = resp.kind == RespKind::Atomic;
                    if (e.wqe_op == opcode::RDMA_READ) == atomic
                        || (atomic && !matches!(e.wqe_op, opcode::ATOMIC_CS | opcode::ATOMIC_FA))
                    {
                        return Err(());
                    }
                    let off = s.wrapping_sub(e.first_seq) as usize * PACKET;
                    let want = if atomic {
                        8
                    } else {
                        (e.bytes as usize).saturating_sub(off).min(PACKET)
                    };
                    if resp.len as usize != want || off > e.bytes as usize {
                        return Err(());
                    }
                    // SAFETY: the scatter list was checked against the MR
                    // table with LOCAL_WRITE when the WQE was sent and
                    // holds `bytes` bytes; `data` holds `want` bytes.
                    unsafe { crate::soft::exec::scatter_at(data, want, &e.scatter, off) };
                    if e.last_seq == s {
                        e.track = Track::Done(if atomic { 8 } else { e.bytes });
                    }
                }
            }
            break;
        }
        if nak.is_some() {
            self.fail_pending(syndrome::WR_FLUSHED);
        }
        Ok(nak)
    }
}

/// The pieces of `list` that cover bytes `[off, off + len)`, as slices
/// into `out`; returns how many.
///
/// # Safety
/// Every (pointer, length) of `list` is valid for reads.
unsafe fn gather(
    list: &[(*mut u8, usize)],
    mut off: usize,
    mut len: usize,
    out: &mut [&[u8]],
) -> usize {
    let mut n = 0;
    for &(p, l) in list {
        if len == 0 || n == out.len() {
            break;
        }
        if off >= l {
            off -= l;
            continue;
        }
        let take = (l - off).min(len);
        // SAFETY: inside a piece checked against the MR table (caller).
        // The application must not change memory under an outstanding
        // WR (the verbs contract); the ring copies the bytes at once.
        out[n] = unsafe { core::slice::from_raw_parts(p.add(off), take) };
        n += 1;
        len -= take;
        off = 0;
    }
    n
}

impl Engine {
    /// Sends one validated WQE of remote QP `qi` as request packets. The
    /// local data is `local` (checked against the MR table), `total`
    /// bytes. Returns `Queued` once every packet is in the ring, `Wait`
    /// while the ring is full (the packets sent so far are remembered).
    pub(in crate::soft) fn send_remote(
        &mut self,
        qi: usize,
        p: &ParsedSend,
        local: &[(*mut u8, usize)],
        total: u64,
    ) -> Outcome {
        let q = self.qps[qi].as_mut().expect("checked");
        let qpn = q.qpn;
        let Some(r) = q.remote.as_deref_mut() else {
            trace(
                qpn,
                format_args!("a WR fails with RETRY_EXC: the QP has no link"),
            );
            return Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC);
        };
        if r.broken {
            trace(
                qpn,
                format_args!("a WR fails with RETRY_EXC: its link is broken"),
            );
            return Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC);
        }
        let total = total as u32;
        let atomic = matches!(p.opcode, opcode::ATOMIC_CS | opcode::ATOMIC_FA);
        let reads = atomic || p.opcode == opcode::RDMA_READ;
        let npk = if atomic {
            1
        } else {
            (total as usize).div_ceil(PACKET).max(1) as u32
        };
        if r.tx_next == 0 {
            r.tx_first = r.seq;
        }
        while r.tx_next < npk {
            let k = r.tx_next;
            let off = k as usize * PACKET;
            let len = (total as usize - off.min(total as usize)).min(PACKET);
            let last = k + 1 == npk;
            let mut flags = 0;
            if k == 0 {
                flags |= wire::F_FIRST;
            }
            if last {
                flags |= wire::F_LAST;
                if !reads {
                    flags |= wire::F_ACK_REQ;
                }
            }
            if p.solicited {
                flags |= wire::F_SOLICITED;
            }
            let hdr = Req {
                seq: r.seq,
                opcode: p.opcode,
                flags,
                rnr_retry: r.rnr_retry,
                src_qpn: qpn,
                dst_qpn: r.peer_qpn,
                total,
                offset: off as u32,
                len: len as u32,
                rkey: p.remote.1,
                raddr: p.remote.0,
                swap_add: p.atomic.0,
                compare: p.atomic.1,
                imm: p.imm,
            }
            .encode();
            let mut parts: [&[u8]; MAX_SEGS + 1] = [&[]; MAX_SEGS + 1];
            parts[0] = &hdr;
            let n = if reads {
                0
            } else {
                // SAFETY: `local` was checked against the MR table.
                unsafe { gather(local, off, len, &mut parts[1..]) }
            };
            if !r.out.req.push(TAG_REQ, &parts[..1 + n]) {
                return Outcome::Wait;
            }
            r.seq = r.seq.wrapping_add(1);
            r.tx_next += 1;
        }
        r.tx_next = 0;
        if !r.has_pending() {
            r.progress();
        }
        r.inflight.push_back(Inflight {
            index: p.index,
            wqe_op: p.opcode,
            signaled: p.signaled,
            track: Track::Pending,
            bytes: if atomic { 8 } else { total },
            first_seq: r.tx_first,
            last_seq: r.seq.wrapping_sub(1),
            scatter: if reads { local.to_vec() } else { Vec::new() },
        });
        Outcome::Queued
    }

    /// Queues the result of a WQE of remote QP `qi` that completed or
    /// failed without leaving the device, behind the ones still
    /// outstanding.
    pub(in crate::soft) fn queue_result(
        &mut self,
        qi: usize,
        index: u16,
        wqe_op: u8,
        signaled: bool,
        outcome: Result<u32, u8>,
    ) {
        let Some(r) = self.qps[qi].as_mut().and_then(|q| q.remote.as_deref_mut()) else {
            return;
        };
        if outcome.is_err() {
            r.tx_next = 0;
        }
        r.inflight.push_back(Inflight {
            index,
            wqe_op,
            signaled,
            track: match outcome {
                Ok(b) => Track::Done(b),
                Err(s) => Track::Fail(s),
            },
            bytes: 0,
            first_seq: 0,
            last_seq: 0,
            scatter: Vec::new(),
        });
    }

    /// One pass of remote QP `qi`'s link: attach to the peer's segment,
    /// execute the peer's requests, apply its responses, enforce the
    /// acknowledgement bound and the peer's liveness, and write the
    /// completions that are due. Returns the work done.
    pub(in crate::soft) fn pass_remote(&mut self, qi: usize, now: Instant) -> usize {
        let Some(q) = self.qps[qi].as_mut() else {
            return 0;
        };
        let (qpn, me) = (q.qpn, self.cfg.gid);
        let Some(mut r) = q.remote.take() else {
            return 0;
        };
        let mut work = 0;
        if r.inc.is_none() && !r.broken && now >= r.next_attach {
            r.next_attach = now + ATTACH_EVERY;
            match LinkIn::attach(&me, qpn, &r.peer_gid, r.peer_qpn) {
                Ok(Some(l)) => {
                    r.inc = Some(l);
                    r.rx = RxState::default();
                }
                Ok(None) => {}
                Err(_) => r.break_link(qpn, "the peer's segment is not a link to this QP"),
            }
        }
        if !r.broken {
            work += self.serve_requests(qi, &mut r, now);
            work += self.take_responses(qpn, &mut r);
        }
        if r.inc.as_ref().is_some_and(|l| l.closed()) {
            // The peer's QP left RTR/RTS or was destroyed: what it had
            // not answered never will be.
            r.inc = None;
            if r.has_pending() {
                trace(
                    qpn,
                    format_args!("outstanding WRs fail with RETRY_EXC: the peer closed its end"),
                );
            }
            r.fail_pending(syndrome::TRANSPORT_RETRY_EXC);
        }
        let mut failed = false;
        // The wait clock runs only while this device runs (MAX_PASS_GAP).
        let gap = now.saturating_duration_since(r.last_pass).min(MAX_PASS_GAP);
        r.last_pass = now;
        if r.has_pending() {
            r.waited += gap;
            let late = r.ack_bound.is_some_and(|b| r.waited > b);
            let mut dead = r.broken;
            if !dead && now >= r.next_alive {
                r.next_alive = now + ALIVE_EVERY;
                dead = !peer::alive(gid_pid(&r.peer_gid));
            }
            if late || dead {
                let why = if r.broken {
                    "the link is broken"
                } else if dead {
                    "the peer process is gone"
                } else {
                    "no answer within the acknowledgement bound"
                };
                trace(
                    qpn,
                    format_args!("outstanding WRs fail with RETRY_EXC: {why}"),
                );
                r.fail_pending(syndrome::TRANSPORT_RETRY_EXC);
                failed = true;
            }
        }
        if r.inflight.iter().any(|e| matches!(e.track, Track::Fail(_))) {
            failed = true;
        }
        let q = self.qps[qi].as_mut().expect("checked");
        q.remote = Some(r);
        if failed {
            self.set_error(qi);
        }
        work + self.retire_remote(qi)
    }

    /// Applies the peer's responses to this QP's requests.
    fn take_responses(&mut self, qpn: u32, r: &mut Remote) -> usize {
        let mut work = 0;
        while let Some(inc) = r.inc.as_mut() {
            let rec = match inc.resp.peek() {
                Ok(Some(rec)) => rec,
                Ok(None) => break,
                Err(_) => {
                    r.break_link(qpn, "a bad record in the response ring");
                    break;
                }
            };
            if rec.tag != TAG_RESP || rec.len < RESP_BYTES {
                r.break_link(qpn, "a response record of the wrong tag or length");
                break;
            }
            // The header is copied once and decoded from the copy.
            let mut h = [0u8; RESP_BYTES];
            inc.resp.copy_payload(&rec, &mut h);
            let Ok(resp) = Resp::decode(&h, rec.len - RESP_BYTES) else {
                r.break_link(qpn, "a response that does not decode");
                break;
            };
            // SAFETY: the payload follows the header inside the record.
            match unsafe { r.apply(&resp, rec.ptr.add(RESP_BYTES)) } {
                Ok(Some(s)) => trace(
                    qpn,
                    format_args!("the peer NAKs seq {} with syndrome {s:#x}", resp.seq),
                ),
                Ok(None) => {}
                Err(()) => {
                    r.break_link(qpn, "a response that contradicts the WRs outstanding");
                    break;
                }
            }
            if let Some(inc) = r.inc.as_mut() {
                inc.resp.pop();
            }
            r.progress();
            work += 1;
        }
        work
    }

    /// Writes the completions at the head of remote QP `qi`'s
    /// outstanding list that are known, in WQE order.
    fn retire_remote(&mut self, qi: usize) -> usize {
        let mut n = 0;
        while let Some(q) = self.qps[qi].as_mut() {
            let (qpn, cqn) = (q.qpn, q.send_cq);
            let Some(r) = q.remote.as_deref_mut() else {
                break;
            };
            let Some(e) = r.inflight.front() else { break };
            if e.track == Track::Pending {
                break;
            }
            let e = r.inflight.pop_front().expect("front exists");
            match e.track {
                Track::Done(bytes) if e.signaled => {
                    let img = cqe_image(
                        cqe_opcode::REQ,
                        (e.wqe_op as u32) << 24 | qpn,
                        e.index,
                        bytes,
                        0,
                    );
                    self.push_cqe(cqn, &img);
                }
                Track::Fail(s) => {
                    let img = err_image(cqe_opcode::REQ_ERR, e.wqe_op, qpn, e.index, s);
                    self.push_cqe(cqn, &img);
                }
                _ => {}
            }
            n += 1;
        }
        n
    }
}
