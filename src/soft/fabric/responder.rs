//! The responder side of a remote QP (docs/spec/fabric.md §4): a peer's
//! request packets executed against this device's memory-region table,
//! receive queues and SRQs, with the checks and errors of
//! docs/spec/responder.md, and answered through this side's segment.

use std::time::Instant;
use std::vec::Vec;

use super::requester::Remote;
use super::trace;
use super::wire::{self, Req, Resp, RespKind, PACKET, REQ_BYTES, RESP_BYTES, TAG_REQ, TAG_RESP};
use crate::completion::QpState;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::{cqe_opcode, opcode};
use crate::soft::mr::Access;
use crate::soft::srq::set_srqn;
use crate::soft::state::{Engine, Outcome, RespEvent};

/// Requests served per link per pass.
const BUDGET: usize = 64;
/// Free bytes the response ring must have before a request is taken:
/// the largest response record (header and a full packet) twice over, so
/// that it fits even after a pad record at the ring's end.
const RESP_ROOM: usize = 2 * (8 + RESP_BYTES + PACKET + 8);

/// A SEND being received: the receive it consumed and where its bytes go.
struct RecvProgress {
    counter: u16,
    dst: Vec<(*mut u8, usize)>,
    srqn: u32,
}

/// What the responder keeps per incoming link.
#[derive(Default)]
pub(crate) struct RxState {
    /// A NAK was sent: the requester's QP is in ERROR, so every later
    /// request of this link is dropped unexecuted.
    dead: bool,
    recv: Option<RecvProgress>,
    rnr_attempts: u32,
    rnr_until: Option<Instant>,
    rnr_step: u64,
    /// An atomic's original value, until its response is pushed.
    atomic: [u8; 8],
}

/// What one request came to.
enum Step {
    /// Executed; answer with this (or nothing).
    Done(Option<Resp>, Option<(*const u8, usize)>),
    /// No receive posted: retry later.
    Rnr,
    /// Failed: NAK with this syndrome.
    Nak(u8),
}

/// The ACK a request asks for with `F_ACK_REQ`, or none.
fn ack_if_asked(req: &Req) -> Option<Resp> {
    (req.flags & wire::F_ACK_REQ != 0).then_some(Resp {
        seq: req.seq,
        kind: RespKind::Ack,
        syndrome: 0,
        len: 0,
    })
}

/// What taking a receive for a remote request came to, as a step: the
/// receive (its counter and scatter entries), or an RNR wait, or the NAK
/// of a receive that failed (its error CQE already written).
fn recv_step(taken: Result<(u16, usize), Outcome>) -> Result<(u16, usize), Step> {
    match taken {
        Ok(v) => Ok(v),
        Err(Outcome::Rnr) => Err(Step::Rnr),
        Err(o) => Err(nak_of(o)),
    }
}

impl Engine {
    /// Executes the requests waiting in remote QP `qi`'s incoming link.
    pub(in crate::soft) fn serve_requests(
        &mut self,
        qi: usize,
        r: &mut Remote,
        now: Instant,
    ) -> usize {
        let mut work = 0;
        let (threaded, steps, rnr_delay) = (self.threaded, self.steps, self.cfg.rnr_delay);
        let qpn = self.qps[qi].as_ref().map_or(0, |q| q.qpn);
        while work < BUDGET {
            if r.out.resp.free() < RESP_ROOM {
                break;
            }
            let Some(inc) = r.inc.as_mut() else { break };
            let rec = match inc.req.peek() {
                Ok(Some(rec)) => rec,
                Ok(None) => break,
                Err(_) => {
                    r.break_link(qpn, "a bad record in the request ring");
                    break;
                }
            };
            if rec.tag != TAG_REQ || rec.len < REQ_BYTES {
                r.break_link(qpn, "a request record of the wrong tag or length");
                break;
            }
            // The header is copied once and decoded from the copy.
            let mut h = [0u8; REQ_BYTES];
            inc.req.copy_payload(&rec, &mut h);
            let req = match Req::decode(&h, rec.len - REQ_BYTES) {
                Ok(q) if q.dst_qpn == qpn && q.src_qpn == r.peer_qpn => q,
                _ => {
                    r.break_link(qpn, "a request that does not decode or names other QPs");
                    break;
                }
            };
            if r.rx.dead {
                inc.req.pop();
                work += 1;
                continue;
            }
            if r.rx.rnr_attempts > 0 {
                let waiting = if threaded {
                    r.rx.rnr_until.is_some_and(|t| now < t)
                } else {
                    r.rx.rnr_step == steps
                };
                if waiting {
                    break;
                }
            }
            // SAFETY: the payload follows the header inside the record.
            let payload = unsafe { rec.ptr.add(REQ_BYTES) };
            let step = match self.respond(qi, &req, payload, &mut r.rx, now) {
                Ok(s) => s,
                Err(()) => {
                    r.break_link(qpn, "a request that contradicts the link's state");
                    break;
                }
            };
            let (resp, data) = match step {
                Step::Done(resp, data) => {
                    r.rx.rnr_attempts = 0;
                    (resp, data)
                }
                Step::Nak(s) => {
                    trace(
                        qpn,
                        format_args!(
                            "NAKs the peer's seq {} (opcode {:#x}) with syndrome {s:#x}",
                            req.seq, req.opcode
                        ),
                    );
                    r.rx.dead = true;
                    r.rx.rnr_attempts = 0;
                    (nak(req.seq, s), None)
                }
                Step::Rnr => {
                    r.rx.rnr_attempts += 1;
                    if req.rnr_retry != 7 && r.rx.rnr_attempts > u32::from(req.rnr_retry) {
                        trace(
                            qpn,
                            format_args!("NAKs the peer's seq {}: RNR retries exceeded", req.seq),
                        );
                        r.rx.dead = true;
                        r.rx.rnr_attempts = 0;
                        (nak(req.seq, syndrome::RNR_RETRY_EXC), None)
                    } else {
                        r.rx.rnr_until = Some(now + rnr_delay);
                        r.rx.rnr_step = steps;
                        let wait = Resp {
                            seq: req.seq,
                            kind: RespKind::RnrWait,
                            syndrome: 0,
                            len: 0,
                        };
                        let _ = r.out.resp.push(TAG_RESP, &[&wait.encode()[..]]);
                        work += 1;
                        break;
                    }
                }
            };
            if let Some(resp) = resp {
                let hdr = resp.encode();
                let ok = match data {
                    // SAFETY: `d` is `n` bytes of a region checked against
                    // the MR table (or a local buffer), read at once.
                    Some((d, n)) => r.out.resp.push(
                        TAG_RESP,
                        &[&hdr[..], unsafe { core::slice::from_raw_parts(d, n) }],
                    ),
                    None => r.out.resp.push(TAG_RESP, &[&hdr[..]]),
                };
                if !ok {
                    // Cannot happen with RESP_ROOM free; the requester's
                    // timer will fail what is unanswered.
                    r.break_link(qpn, "no room for a response");
                }
            }
            if let Some(inc) = r.inc.as_mut() {
                inc.req.pop();
            }
            work += 1;
        }
        work
    }

    /// Executes one request packet for QP `bi`. `Err` for a packet that
    /// contradicts the link's state (a protocol violation by the peer).
    fn respond(
        &mut self,
        bi: usize,
        req: &Req,
        payload: *const u8,
        rx: &mut RxState,
        now: Instant,
    ) -> Result<Step, ()> {
        let b = self.qps[bi].as_ref().expect("checked");
        if !matches!(b.state, QpState::Rtr | QpState::Rts) {
            return Ok(Step::Nak(syndrome::TRANSPORT_RETRY_EXC));
        }
        let (bpd, bqpn, baccess, brecv_cq) = (b.pd, b.qpn, b.access, b.recv_cq);
        let bsrqn = b.srq.unwrap_or(0);
        let first = req.flags & wire::F_FIRST != 0;
        let last = req.flags & wire::F_LAST != 0;
        let acked = ack_if_asked(req);
        let len = req.len as usize;
        let fatal = |e: &mut Engine, s: u8, ev: RespEvent| nak_of(e.responder_fatal(bi, s, ev));
        let step = match req.opcode {
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => {
                let dst = match self.remote_piece(bi, req, bpd, baccess, Access::REMOTE_WRITE) {
                    Ok(p) => p,
                    Err(nak) => return Ok(nak),
                };
                if last && req.opcode == opcode::RDMA_WRITE_IMM {
                    let entry = &mut [0u8; 1024];
                    let taken = self.take_recv(bi, &mut [], entry, now, self.cfg.rnr_delay, None);
                    match recv_step(taken) {
                        Err(step) => return Ok(step),
                        Ok((counter, _)) => {
                            // SAFETY: checked against the MR table above;
                            // the payload is `len` bytes of the ring.
                            unsafe {
                                crate::soft::exec::scatter_at(payload, len, &[(dst, len)], 0)
                            };
                            let mut img = crate::soft::cqe::cqe_image(
                                cqe_opcode::RESP_WR_IMM,
                                bqpn,
                                counter,
                                req.total,
                                req.imm,
                            );
                            set_srqn(&mut img, bsrqn);
                            self.push_cqe(brecv_cq, &img);
                        }
                    }
                } else {
                    // SAFETY: as above.
                    unsafe { crate::soft::exec::scatter_at(payload, len, &[(dst, len)], 0) };
                }
                Step::Done(acked, None)
            }
            opcode::RDMA_READ => {
                let src = match self.remote_piece(bi, req, bpd, baccess, Access::REMOTE_READ) {
                    Ok(p) => p,
                    Err(nak) => return Ok(nak),
                };
                let resp = Resp {
                    seq: req.seq,
                    kind: RespKind::ReadData,
                    syndrome: 0,
                    len: req.len,
                };
                Step::Done(Some(resp), Some((src as *const u8, len)))
            }
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => {
                if !(first && last && req.total == 8 && req.len == 8) {
                    return Err(());
                }
                if !baccess.contains(Access::REMOTE_ATOMIC) {
                    return Ok(fatal(self, syndrome::REMOTE_INVAL_REQ, RespEvent::Request));
                }
                if req.raddr % 8 != 0 {
                    return Ok(fatal(self, syndrome::REMOTE_INVAL_REQ, RespEvent::Access));
                }
                let need = Access::REMOTE_ATOMIC;
                let Some(t) = self.mrs.check(req.rkey, bpd, req.raddr, 8, need, true) else {
                    return Ok(fatal(self, syndrome::REMOTE_ACCESS, RespEvent::Access));
                };
                // SAFETY: 8 bytes of a registered region, 8-aligned.
                let old = unsafe {
                    crate::soft::exec::atomic_at(t, req.opcode, req.swap_add, req.compare)
                };
                rx.atomic = old.to_ne_bytes();
                let resp = Resp {
                    seq: req.seq,
                    kind: RespKind::Atomic,
                    syndrome: 0,
                    len: 8,
                };
                Step::Done(Some(resp), Some((rx.atomic.as_ptr(), 8)))
            }
            opcode::SEND | opcode::SEND_IMM | opcode::SEND_INVAL => {
                return self.respond_send(bi, req, payload, rx, now, (bpd, bqpn, brecv_cq, bsrqn));
            }
            _ => return Err(()),
        };
        Ok(step)
    }

    /// Where a WRITE or READ packet's bytes are: QP `bi` must enable
    /// `need`, and the packet's range (and on its first packet the whole
    /// message's) must lie in region `rkey` of PD `bpd` with `need`
    /// (docs/spec/responder.md §1). A refusal ends the connection and is
    /// the NAK to send.
    fn remote_piece(
        &mut self,
        bi: usize,
        req: &Req,
        bpd: u32,
        baccess: Access,
        need: Access,
    ) -> Result<*mut u8, Step> {
        if !baccess.contains(need) {
            let s = self.responder_fatal(bi, syndrome::REMOTE_INVAL_REQ, RespEvent::Request);
            return Err(nak_of(s));
        }
        let whole = req.flags & wire::F_FIRST == 0
            || self
                .mrs
                .check(req.rkey, bpd, req.raddr, req.total.into(), need, true)
                .is_some();
        let at = req.raddr.wrapping_add(u64::from(req.offset));
        match self
            .mrs
            .check(req.rkey, bpd, at, req.len.into(), need, true)
        {
            Some(p) if whole => Ok(p),
            _ => {
                let s = self.responder_fatal(bi, syndrome::REMOTE_ACCESS, RespEvent::Access);
                Err(nak_of(s))
            }
        }
    }

    /// The SEND family: the receive is taken on the first packet (on the
    /// last for SEND_WITH_INV, which this device refuses at the
    /// receive), each packet is scattered at its offset, and the receive
    /// completes with the last.
    fn respond_send(
        &mut self,
        bi: usize,
        req: &Req,
        payload: *const u8,
        rx: &mut RxState,
        now: Instant,
        (bpd, bqpn, brecv_cq, bsrqn): (u32, u32, u32, u32),
    ) -> Result<Step, ()> {
        let first = req.flags & wire::F_FIRST != 0;
        let last = req.flags & wire::F_LAST != 0;
        let acked = ack_if_asked(req);
        if req.opcode == opcode::SEND_INVAL {
            if !last {
                return Ok(Step::Done(acked, None));
            }
            let entry = &mut [0u8; 1024];
            let taken = self.take_recv(bi, &mut [], entry, now, self.cfg.rnr_delay, None);
            let (counter, _) = match recv_step(taken) {
                Err(step) => return Ok(step),
                Ok(v) => v,
            };
            // As in-process: the receive fails, the SEND is acknowledged.
            self.refuse_invalidate((bi, bqpn, brecv_cq, bsrqn), counter);
            return Ok(Step::Done(acked, None));
        }
        if first {
            if rx.recv.is_some() {
                return Err(());
            }
            let mut rsegs = [crate::soft::wqe::Seg::default(); 64];
            let entry = &mut [0u8; 1024];
            let taken = self.take_recv(bi, &mut rsegs[..], entry, now, self.cfg.rnr_delay, None);
            let (counter, n) = match recv_step(taken) {
                Err(step) => return Ok(step),
                Ok(v) => v,
            };
            let mut dst = [(core::ptr::null_mut(), 0); 64];
            if let Err(o) = self.receive_list(
                (bi, bpd, bqpn, brecv_cq, bsrqn),
                counter,
                &rsegs[..n],
                req.total.into(),
                &mut dst,
            ) {
                return Ok(match o {
                    Outcome::Fail(s) => Step::Nak(s),
                    _ => Step::Nak(syndrome::REMOTE_OP),
                });
            }
            rx.recv = Some(RecvProgress {
                counter,
                dst: dst[..n].to_vec(),
                srqn: bsrqn,
            });
        }
        let Some(p) = rx.recv.as_ref() else {
            return Err(());
        };
        // SAFETY: the receive's list was checked against the MR table with
        // LOCAL_WRITE and holds at least `total` bytes (receive_list);
        // the packet lies inside the message (Req::decode).
        unsafe {
            crate::soft::exec::scatter_at(payload, req.len as usize, &p.dst, req.offset as usize)
        };
        if last {
            let p = rx.recv.take().expect("checked");
            let img = crate::soft::exec::recv_cqe(
                req.opcode,
                bqpn,
                p.counter,
                req.total,
                req.imm,
                req.src_qpn,
                req.flags & wire::F_SOLICITED != 0,
                p.srqn,
            );
            self.push_cqe(brecv_cq, &img);
        }
        Ok(Step::Done(acked, None))
    }
}

fn nak(seq: u32, s: u8) -> Option<Resp> {
    Some(Resp {
        seq,
        kind: RespKind::Nak,
        syndrome: s,
        len: 0,
    })
}

/// The NAK for a responder error's outcome.
fn nak_of(o: Outcome) -> Step {
    match o {
        Outcome::Fail(s) => Step::Nak(s),
        _ => Step::Nak(syndrome::REMOTE_OP),
    }
}
