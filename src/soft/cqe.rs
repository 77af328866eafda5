//! Completion writing: CQE images, the owner-bit protocol, flush errors
//! for posted receives, and completion events on armed CQs.

use core::sync::atomic::Ordering;

use super::config::AsyncEvent;
use super::state::{Engine, CQN_BASE};
use crate::completion::QpState;
use crate::mmio;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::cqe_opcode;

pub(super) fn cqe_image(op: u8, qpn_word: u32, counter: u16, byte_cnt: u32, imm: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[36..40].copy_from_slice(&imm.to_be_bytes());
    c[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    c[56..60].copy_from_slice(&qpn_word.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = op << 4;
    c
}

pub(super) fn err_image(op: u8, wqe_op: u8, qpn: u32, counter: u16, synd: u8) -> [u8; 64] {
    let mut c = cqe_image(op, (wqe_op as u32) << 24 | qpn, counter, 0, 0);
    c[54] = synd; // vendor syndrome: we echo the syndrome
    c[55] = synd;
    c
}

impl Engine {
    /// Writes one CQE with the owner bit of its pass, or reports an
    /// overrun instead of overwriting an entry software has not consumed.
    pub(super) fn push_cqe(&mut self, cqn: u32, img: &[u8; 64]) -> bool {
        let Some(cq) = self.cq_mut(cqn) else {
            return false;
        };
        if cq.overrun {
            return false;
        }
        // SAFETY: word 0 of the CQ doorbell record, owned by `cq.mem`.
        let ci = unsafe { mmio::read_dbrec(cq.mem.dbrec.ptr().cast::<u32>()) } & 0x00ff_ffff;
        if (cq.pi.wrapping_sub(ci) & 0x00ff_ffff) >= cq.cnt {
            cq.overrun = true;
            self.push_event(AsyncEvent::CqOverrun { cqn });
            return false;
        }
        let slot = (cq.pi & (cq.cnt - 1)) as usize * cq.size as usize;
        let at = slot + cq.size as usize - 64;
        let owner = ((cq.pi & cq.cnt) != 0) as u8;
        let base = cq.mem.buf.ptr();
        // SAFETY: the slot is inside the CQ buffer and software does not
        // own it (checked against its consumer index above); the owner
        // byte is published last with Release.
        unsafe {
            if cq.size == 128 {
                core::ptr::write_bytes(base.add(slot), 0, 64);
            }
            core::ptr::copy_nonoverlapping(img.as_ptr(), base.add(at), 63);
            mmio::store_op_own(base.add(at + 63), (img[63] & 0xfe) | owner);
        }
        // op_own: opcode in bits 7..4, solicited event in bit 1 (docs/spec/mlx5.md §8).
        let op = img[63] >> 4;
        if img[63] & 0x02 != 0 || op == cqe_opcode::REQ_ERR || op == cqe_opcode::RESP_ERR {
            cq.last_solicited = Some(cq.pi);
        }
        cq.pi = cq.pi.wrapping_add(1);
        true
    }

    /// Delivers completion events (docs/spec/mlx5.md §8): software arms a CQ by
    /// writing the arm word into doorbell-record word 1 and then the 64-bit
    /// CQ doorbell (`arm word << 32 | cqn`, big-endian) at UAR + 0x20. Each
    /// doorbell write arms the CQ once: the device takes it (swaps the
    /// register back to 0, as a write-triggered register would be
    /// consumed), and fires one event as soon as a CQE exists at or after
    /// the armed consumer index; a solicited-only arm (command bit 24) only
    /// for a solicited or error CQE at or after it.
    pub(super) fn fire_cq_events(&mut self) {
        for (i, slot) in self.cqs.iter_mut().enumerate() {
            let Some(cq) = slot.as_mut() else {
                continue;
            };
            // SAFETY: the CQ doorbell at UAR + 0x20 is 8-aligned and inside
            // the UAR page owned by `cq.mem`; software writes it with one
            // 64-bit store, the device reads and clears it atomically, so a
            // write that lands after the swap stays for the next pass.
            let reg = unsafe {
                core::sync::atomic::AtomicU64::from_ptr(
                    cq.mem
                        .uar
                        .ptr()
                        .add(crate::provider::mlx5::layout::CQ_DOORBELL)
                        .cast(),
                )
            };
            // AcqRel: the doorbell-record word written before the doorbell
            // is visible after this.
            let v = u64::from_be(reg.swap(0, Ordering::AcqRel));
            if v != 0 && (v & 0x00ff_ffff) as u32 == CQN_BASE + i as u32 {
                let word = (v >> 32) as u32;
                cq.armed_ci = Some(word & 0x00ff_ffff);
                cq.armed_solicited = word & (1 << 24) != 0;
            }
            let Some(ci) = cq.armed_ci else {
                continue;
            };
            let ahead = cq.pi.wrapping_sub(ci) & 0x00ff_ffff;
            let wanted = !cq.armed_solicited
                || cq
                    .last_solicited
                    .is_some_and(|s| (s.wrapping_sub(ci) & 0x00ff_ffff) < ahead);
            if ahead != 0 && ahead <= cq.cnt && wanted {
                cq.armed_ci = None;
                cq.event.signal();
            }
        }
    }

    /// In ERROR, completes every posted receive with a flush error (a QP
    /// on an SRQ has none of its own: see `Engine::srq_qp_in_error`).
    pub(super) fn flush_rq(&mut self, qi: usize) -> usize {
        let q = self.qps[qi].as_ref().expect("checked");
        if q.state != QpState::Error {
            return 0;
        }
        if q.srq.is_some() {
            return self.srq_qp_in_error(qi);
        }
        // SAFETY: word 0 of the QP doorbell record.
        let head = unsafe { mmio::read_dbrec(q.dbrec) } & 0xffff;
        let (qpn, cqn) = (q.qpn, q.recv_cq);
        let mut n = 0;
        loop {
            let q = self.qps[qi].as_ref().expect("checked");
            if (head.wrapping_sub(q.rq_ci) & 0xffff) == 0 {
                break;
            }
            let counter = q.rq_ci as u16;
            let img = err_image(cqe_opcode::RESP_ERR, 0, qpn, counter, syndrome::WR_FLUSHED);
            if !self.push_cqe(cqn, &img) {
                break;
            }
            let q = self.qps[qi].as_mut().expect("checked");
            q.rq_ci = q.rq_ci.wrapping_add(1);
            n += 1;
        }
        n
    }
}
