//! One device pass: every QP's posted send WQEs are copied out, parsed
//! and executed (RC or UD, docs/spec/soft.md §3), and their requester
//! completions written.

use std::time::Instant;

use super::config::AsyncEvent;
use super::cqe::{cqe_image, err_image};
use super::state::{Engine, Outcome, Scratch};
use super::{ud_wqe, wqe};
use crate::completion::QpState;
use crate::mmio;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::cqe_opcode;

/// Work done per QP per pass, so one busy QP cannot starve the others.
const BUDGET_PER_QP: u32 = 64;

impl Engine {
    /// One pass over every QP; returns the amount of work done.
    pub(super) fn pass(&mut self, now: Instant) -> usize {
        self.steps += 1;
        let mut work = 0;
        for qi in 0..self.qps.len() {
            if self.qps[qi].is_none() {
                continue;
            }
            let remote = self.qps[qi].as_ref().is_some_and(|q| q.remote.is_some());
            work += self.run_sq(qi, now);
            if remote {
                work += self.pass_remote(qi, now);
            }
            work += self.flush_rq(qi);
        }
        self.fire_cq_events();
        work
    }

    /// Consumes posted send WQEs of one QP.
    fn run_sq(&mut self, qi: usize, now: Instant) -> usize {
        let mut done = 0;
        let Some(mut sc) = self.scratch.take() else {
            return 0;
        };
        while done < BUDGET_PER_QP {
            let q = self.qps[qi].as_ref().expect("checked");
            if !matches!(q.state, QpState::Rts | QpState::Error) {
                break;
            }
            // SAFETY: word 1 (SQ) of the QP doorbell record.
            let pi16 = unsafe { mmio::read_dbrec(q.dbrec.add(1)) } & 0xffff;
            let pending = pi16.wrapping_sub(q.sq_ci) & 0xffff;
            if pending == 0 {
                break;
            }
            let mask = q.sq_cnt - 1;
            let index = q.sq_ci as u16;
            // Copy the control segment, then the whole WQE, linearly.
            let mut ctrl = [0u8; 16];
            // SAFETY: the BB at sq_ci is inside the ring and was published
            // by the doorbell record (acquire-loaded above).
            unsafe {
                core::ptr::copy_nonoverlapping(
                    q.sq.add(((q.sq_ci & mask) as usize) * 64),
                    ctrl.as_mut_ptr(),
                    16,
                )
            };
            let ds = wqe::ctrl_ds(&ctrl);
            let nbb = ds.div_ceil(4);
            let sane = ds != 0 && nbb <= pending && nbb <= q.sq_cnt;
            let nbb = if sane { nbb } else { 1 };
            for k in 0..nbb {
                let bb = (q.sq_ci.wrapping_add(k) & mask) as usize;
                // SAFETY: as above; `wbuf` holds up to 16 BBs + slack.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        q.sq.add(bb * 64),
                        sc.wbuf.as_mut_ptr().add(k as usize * 64),
                        64,
                    )
                };
            }
            let wqe_op = ctrl[3];
            let (qpn, cqn, state, ud) = (q.qpn, q.send_cq, q.state, q.ud);
            let outcome = if state == QpState::Error {
                Outcome::Fail(syndrome::WR_FLUSHED)
            } else if !sane {
                Outcome::Fail(syndrome::LOCAL_QP_OP)
            } else if ud {
                let Scratch { wbuf, segs, .. } = &mut *sc;
                match ud_wqe::parse_ud_send(&wbuf[..nbb as usize * 64], index, qpn, segs) {
                    Err(s) => Outcome::Fail(s),
                    Ok(u) => self.execute_ud(qi, &u, &mut sc, now),
                }
            } else {
                let Scratch { wbuf, segs, .. } = &mut *sc;
                match wqe::parse_send(&wbuf[..nbb as usize * 64], index, qpn, segs) {
                    Err(s) => Outcome::Fail(s),
                    Ok(p) => self.execute(qi, &p, &mut sc, now),
                }
            };
            let signaled = ctrl[11] & 0x0c == 0x08;
            let remote = self.qps[qi].as_ref().is_some_and(|q| q.remote.is_some());
            match outcome {
                Outcome::Wait | Outcome::Rnr => break,
                Outcome::Queued => {}
                Outcome::Done(bytes) if remote => {
                    // Completes behind what is still outstanding at the peer.
                    self.queue_result(qi, index, wqe_op, signaled, Ok(bytes));
                }
                Outcome::Done(bytes) => {
                    if signaled {
                        let img = cqe_image(
                            cqe_opcode::REQ,
                            (wqe_op as u32) << 24 | qpn,
                            index,
                            bytes,
                            0,
                        );
                        self.push_cqe(cqn, &img);
                    }
                }
                Outcome::Fail(s) => {
                    if remote {
                        self.queue_result(qi, index, wqe_op, signaled, Err(s));
                    } else {
                        let img = err_image(cqe_opcode::REQ_ERR, wqe_op, qpn, index, s);
                        self.push_cqe(cqn, &img);
                    }
                    if state != QpState::Error {
                        self.set_error(qi);
                        if s == syndrome::LOCAL_QP_OP || s == syndrome::LOCAL_LENGTH {
                            self.push_event(AsyncEvent::QpFatal { qpn });
                        }
                    }
                }
            }
            let q = self.qps[qi].as_mut().expect("checked");
            q.sq_ci = q.sq_ci.wrapping_add(nbb);
            q.rnr_attempts = 0;
            q.hold = None;
            done += 1;
        }
        self.scratch = Some(sc);
        done as usize
    }
}
