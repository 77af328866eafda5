//! Unreliable datagrams on the software device (docs/spec/soft.md §3):
//! creating a UD QP and making it ready with its Q_Key, executing a
//! parsed UD send (routing by destination QP number, the Q_Key check,
//! drops, the GRH area of the receive buffer, the responder CQE) and the
//! drop counters.

use std::time::Instant;

use super::cqe::{cqe_image, err_image};
use super::device::SoftDevice;
use super::mem::SoftQp;
use super::mr::Access;
use super::srq::set_srqn;
use super::state::{Engine, Outcome, Scratch};
use super::ud_wqe::{ParsedUd, UdGrh};
use super::{QpInit, UdDrops};
use crate::completion::QpState;
use crate::error::{Error, Result};
use crate::mmio;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::{cqe_opcode, opcode};

/// Bytes of the GRH area at the start of every UD receive buffer (IBA
/// vol. 1 §8.3; rdma-core's `struct ibv_grh`).
pub const GRH_BYTES: u32 = 40;
/// A WR Q_Key with bit 31 set: use the sending QP's own Q_Key.
const QP_QKEY: u32 = 0x8000_0000;
/// GRH `next_hdr` for an IBA transport header (IBA vol. 1 §8.3.1).
const NEXT_HDR_IBA: u8 = 0x1b;
/// The soft port's LID, reported as the source LID of UD receives.
const PORT_LID: u16 = 1;

/// The largest UD send WQE for `init`, in bytes (whole BBs): the 64-byte
/// control and datagram header, then the data segments or the inline
/// segment (docs/spec/mlx5.md §11).
pub(super) fn ud_wqe_bytes(init: &QpInit) -> u32 {
    let sge = 64 + 16 * init.max_send_sge;
    let inl = 64 + (4 + init.max_inline_data).div_ceil(16) * 16;
    sge.max(inl).next_multiple_of(64)
}

/// The 40-byte GRH the device writes in front of a UD payload that came
/// with a global route: rdma-core's `struct ibv_grh` layout, big-endian
/// (IBA vol. 1 §8.3.1): IP version 6, traffic class and flow label in the
/// first word, the payload length (BTH, DETH, the immediate if any, the
/// payload padded to 4 bytes and the ICRC), next header 0x1b, the hop
/// limit, the source GID (the sender port's) and the destination GID (the
/// address vector's).
fn grh_bytes(g: &UdGrh, sgid: &[u8; 16], len: u32, imm: bool) -> [u8; 40] {
    let mut h = [0u8; 40];
    let vtf = 6u32 << 28 | u32::from(g.tclass) << 20 | g.flow_label;
    h[0..4].copy_from_slice(&vtf.to_be_bytes());
    let paylen = 12 + 8 + if imm { 4 } else { 0 } + len.next_multiple_of(4) + 4;
    h[4..6].copy_from_slice(&(paylen as u16).to_be_bytes());
    h[6] = NEXT_HDR_IBA;
    h[7] = g.hop_limit;
    h[8..24].copy_from_slice(sgid);
    h[24..40].copy_from_slice(&g.dgid);
    h
}

/// Skips the first `by` bytes of a scatter list in place; returns the
/// index of the first entry left (its start moved past what was skipped).
fn skip(dst: &mut [(*mut u8, usize)], mut by: usize) -> usize {
    let mut i = 0;
    while i < dst.len() && by > 0 {
        if dst[i].1 <= by {
            by -= dst[i].1;
            i += 1;
        } else {
            // SAFETY: `by` < the entry's length: still inside its range.
            dst[i].0 = unsafe { dst[i].0.add(by) };
            dst[i].1 -= by;
            by = 0;
        }
    }
    i
}

impl Engine {
    /// Whether QP `bi` has a receive to take (its RQ or its SRQ), without
    /// taking it: UD has no RNR, an empty queue drops the datagram.
    fn ud_recv_ready(&self, bi: usize) -> bool {
        let b = self.qps[bi].as_ref().expect("checked");
        if let Some(srqn) = b.srq {
            return self.srq_index(srqn).is_some_and(|si| {
                let s = self.srqs[si].as_ref().expect("checked");
                // SAFETY: the SRQ's doorbell-record word, kept alive by it.
                let posted = unsafe { mmio::read_dbrec(s.dbrec) } & 0xffff;
                // A broken SRQ is left to `take_recv`, which fails the QP.
                s.broken || posted.wrapping_sub(s.taken) & 0xffff != 0
            });
        }
        // SAFETY: word 0 (RQ) of the QP's doorbell record.
        let head = unsafe { mmio::read_dbrec(b.dbrec) } & 0xffff;
        head.wrapping_sub(b.rq_ci) & 0xffff != 0
    }

    /// Executes one validated UD send of QP `qi` (docs/spec/soft.md §3).
    /// The sender's outcome is `Done` whether the datagram was delivered,
    /// dropped or completed in error at the receiver; it fails only for
    /// what the sender itself got wrong (its local keys, a message over
    /// the MTU, a GID index the port does not have).
    pub(super) fn execute_ud(
        &mut self,
        qi: usize,
        u: &ParsedUd,
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
        let p = &u.send;
        if p.opcode == opcode::NOP {
            return Outcome::Done(0);
        }
        let q = self.qps[qi].as_ref().expect("checked");
        let (pd, qpn, own_qkey) = (q.pd, q.qpn, q.qkey);
        let (nlocal, total) = match self.local_list(pd, p.local, wbuf, segs, local, Access::NONE) {
            Ok(v) => v,
            Err(o) => return o,
        };
        if total > u64::from(self.cfg.effective_mtu()) {
            return Outcome::Fail(syndrome::LOCAL_LENGTH);
        }
        if u.grh.is_some_and(|g| g.sgid_index != 0) {
            // The port's GID table has one entry.
            return Outcome::Fail(syndrome::LOCAL_QP_OP);
        }
        let total = total as u32;
        let qkey = if u.qkey & QP_QKEY != 0 {
            own_qkey
        } else {
            u.qkey
        };
        let Some(bi) = self.qp_index(u.dqpn) else {
            self.ud_drops.no_qp += 1;
            return Outcome::Done(total);
        };
        let b = self.qps[bi].as_ref().expect("checked");
        if !b.ud {
            self.ud_drops.not_ud += 1;
            return Outcome::Done(total);
        }
        if !matches!(b.state, QpState::Rtr | QpState::Rts) {
            self.ud_drops.not_ready += 1;
            return Outcome::Done(total);
        }
        if b.qkey != qkey {
            self.ud_drops.bad_qkey += 1;
            return Outcome::Done(total);
        }
        if !self.ud_recv_ready(bi) {
            self.ud_drops.no_receive += 1;
            return Outcome::Done(total);
        }
        let b = self.qps[bi].as_ref().expect("checked");
        let (bpd, bqpn, brecv_cq) = (b.pd, b.qpn, b.recv_cq);
        let bsrqn = b.srq.unwrap_or(0);
        let rnr_delay = self.cfg.rnr_delay;
        let (counter, n) = match self.take_recv(bi, &mut rsegs[..], entry, now, rnr_delay, qi) {
            Ok(v) => v,
            // A malformed receive WQE: the receiver completed it in error
            // and went to ERROR; the datagram is gone, the sender done.
            Err(_) => return Outcome::Done(total),
        };
        let mut cap: u64 = 0;
        for (i, s) in rsegs[..n].iter().enumerate() {
            let Some(ptr) = self.mrs.check(
                s.lkey,
                bpd,
                s.addr,
                s.len as u64,
                Access::LOCAL_WRITE,
                false,
            ) else {
                return self.ud_recv_error(bi, bqpn, brecv_cq, counter, bsrqn, total, 1);
            };
            dst[i] = (ptr, s.len as usize);
            cap += s.len as u64;
        }
        if u64::from(total) + u64::from(GRH_BYTES) > cap {
            return self.ud_recv_error(bi, bqpn, brecv_cq, counter, bsrqn, total, 0);
        }
        let imm = p.opcode == opcode::SEND_IMM;
        if let Some(g) = &u.grh {
            let h = grh_bytes(g, &self.cfg.gid, total, imm);
            // SAFETY: the scatter list was validated against the MR table
            // with LOCAL_WRITE and holds at least 40 + total bytes.
            unsafe { super::exec::sg_copy(&[(h.as_ptr() as *mut u8, 40)], &dst[..n]) };
        }
        let from = skip(&mut dst[..n], GRH_BYTES as usize);
        // SAFETY: as above; `skip` only moved starts inside their ranges.
        unsafe { super::exec::sg_copy(&local[..nlocal], &dst[from..n]) };
        let (op, imm_v) = if imm {
            (cqe_opcode::RESP_SEND_IMM, p.imm)
        } else {
            (cqe_opcode::RESP_SEND, 0)
        };
        let mut img = cqe_image(op, bqpn, counter, total + GRH_BYTES, imm_v);
        img[22..24].copy_from_slice(&PORT_LID.to_be_bytes());
        let g = u32::from(u.grh.is_some());
        let flags_rqpn = g << 28 | u32::from(u.sl) << 24 | qpn;
        img[24..28].copy_from_slice(&flags_rqpn.to_be_bytes());
        if p.solicited {
            img[63] |= 0x02;
        }
        set_srqn(&mut img, bsrqn);
        self.push_cqe(brecv_cq, &img);
        Outcome::Done(total)
    }

    /// The receive UD QP `bi` took cannot hold the datagram: a region key,
    /// bound or right failed (`prot` 1: local protection error) or it is
    /// shorter than 40 + the payload (local length error). The receive
    /// completes in error and the receiver goes to ERROR (every mlx5
    /// error completion does); the sender is done.
    #[allow(clippy::too_many_arguments)]
    fn ud_recv_error(
        &mut self,
        bi: usize,
        bqpn: u32,
        cq: u32,
        counter: u16,
        srqn: u32,
        total: u32,
        prot: u8,
    ) -> Outcome {
        let s = if prot == 1 {
            syndrome::LOCAL_PROT
        } else {
            syndrome::LOCAL_LENGTH
        };
        let mut img = err_image(cqe_opcode::RESP_ERR, 0, bqpn, counter, s);
        set_srqn(&mut img, srqn);
        self.push_cqe(cq, &img);
        self.set_error(bi);
        Outcome::Done(total)
    }
}

impl SoftDevice {
    /// Creates an unreliable-datagram QP in RESET (docs/spec/soft.md §3),
    /// sized as [`SoftDevice::create_qp`] sizes an RC QP but for the UD
    /// WQE's 64-byte header. On an SRQ ([`QpInit::srq`]) as an RC QP is.
    /// Make it ready with [`SoftDevice::ready_ud`].
    pub fn create_ud_qp(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        init: &QpInit,
    ) -> Result<SoftQp> {
        self.create_qp_of(pd, send_cq, recv_cq, init, true)
    }

    /// Moves a UD QP from RESET through INIT and RTR to RTS in one step,
    /// with its Q_Key (a UD QP has no peer: nothing else is needed). A
    /// Q_Key with bit 31 set is a controlled key a QP cannot take (IBA
    /// vol. 1 §10.2.4) and is [`Error::InvalidAttribute`]; an RC QP is
    /// [`Error::InvalidAttribute`]; a QP not in RESET is
    /// [`Error::InvalidQpState`]. A refused call changes nothing.
    pub fn ready_ud(&self, qpn: u32, qkey: u32) -> Result<()> {
        let mut e = self.engine();
        let i = e.qp_index(qpn).ok_or(Error::NoSuchObject)?;
        let q = e.qps[i].as_mut().expect("checked");
        if !q.ud || qkey & QP_QKEY != 0 {
            return Err(Error::InvalidAttribute);
        }
        if q.state != QpState::Reset {
            return Err(Error::InvalidQpState);
        }
        q.qkey = qkey;
        q.state = QpState::Rts;
        Ok(())
    }

    /// True if `pd` is a live protection domain of this device.
    pub fn pd_live(&self, pd: u32) -> bool {
        self.engine()
            .pds
            .get((pd as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
    }

    /// Datagrams dropped since the device was made, by reason.
    pub fn ud_drops(&self) -> UdDrops {
        self.engine().ud_drops
    }

    /// The port's MTU (see [`super::SoftConfig::mtu`]).
    pub fn mtu(&self) -> u32 {
        self.engine().cfg.effective_mtu()
    }

    /// The port's GID ([`super::SoftConfig::gid`]).
    pub fn gid(&self) -> [u8; 16] {
        self.engine().cfg.gid
    }
}
