//! The harness: the real queues on fake mlx5 memory next to the model,
//! one method per input op, each checked against the model.

use std::collections::HashSet;

use rdma_direct::provider::mlx5::{CompletionQueue, Mlx5Qp, QpState, Wc, WcOpcode};
use rdma_direct::testutil::{AlignedBuf, FakeMlx5};
use rdma_direct::{Error, QpCaps, RecvWr, SendFlags, SendOp, Sge};
use rdma_direct_fuzz::send::{self, PayloadSpec, WrSpec};
use rdma_direct_fuzz::Bytes;

use super::model::*;

/// SGE buffer arena.
pub(crate) const ARENA: usize = 16 * 1024;
/// Pattern bytes between buffers.
const GUARD: usize = 16;
/// Largest poll batch.
pub(crate) const MAX_BATCH: usize = 8;

pub(crate) struct Harness {
    pub(crate) f: FakeMlx5,
    pub(crate) qp: Mlx5Qp,
    pub(crate) cq: CompletionQueue,
    pub(crate) m: Model,
    pub(crate) caps: QpCaps,
    pub(crate) sig_all: bool,
    /// Scatter-to-CQE handling on.
    pub(crate) scatter: bool,
    pub(crate) qpn: u32,
    pub(crate) arena: AlignedBuf,
    /// Bump allocator over the arena.
    pub(crate) next_buf: usize,
    pub(crate) next_id: u64,
    /// Device-side CQ write cursor.
    pub(crate) dev: u32,
}

impl Harness {
    fn cqe_size(&self) -> usize {
        self.f.geo.cqe_size as usize
    }
    fn cqe_cnt(&self) -> u32 {
        self.f.geo.cqe_cnt
    }

    pub(crate) fn check_state(&self) {
        let m = &self.m;
        assert_eq!(self.qp.sq.producer(), m.sq_pi, "SQ producer");
        assert_eq!(self.qp.sq.retired(), m.sq_retired, "SQ retired");
        assert_eq!(self.qp.sq.pending(), m.sq_batch, "SQ pending");
        assert_eq!(self.qp.sq.state(), m.sq_state, "SQ state");
        assert_eq!(self.qp.rq.head(), m.rq_head, "RQ head");
        assert_eq!(self.qp.rq.tail(), m.rq_tail, "RQ tail");
        assert_eq!(self.cq.consumer_index(), m.ci, "CQ consumer index");
        assert_eq!(self.cq.stale_cqes(), m.stale, "stale CQE count");
        assert_eq!(self.f.dbrec_sq(), m.dbrec_sq, "SQ doorbell record");
        assert_eq!(self.f.dbrec_rq(), m.dbrec_rq, "RQ doorbell record");
        assert_eq!(self.f.dbrec_cq_ci(), m.dbrec_cq, "CQ doorbell record");
        assert!(
            m.sq_pi.wrapping_sub(m.sq_retired) <= m.sq_cnt,
            "model: SQ overfull"
        );
        assert!(
            m.rq_head.wrapping_sub(m.rq_tail) <= m.rq_cnt,
            "model: RQ overfull"
        );
        if self.arena.bytes() != &m.arena[..] {
            let i = self
                .arena
                .bytes()
                .iter()
                .zip(&m.arena)
                .position(|(a, b)| a != b)
                .unwrap();
            panic!(
                "arena byte {i} is {:#04x}, expected {:#04x}",
                self.arena.bytes()[i],
                m.arena[i]
            );
        }
    }

    /// A fresh buffer of `len` bytes with guards on both sides; `None`
    /// when the arena is exhausted.
    fn alloc(&mut self, len: u32) -> Option<usize> {
        let off = self.next_buf + GUARD;
        let end = off + len as usize + GUARD;
        if end > ARENA {
            return None;
        }
        self.next_buf = off + len as usize;
        Some(off)
    }

    fn addr(&self, off: usize) -> u64 {
        // The poller turns SGE addresses back into pointers: expose the
        // arena's provenance so those pointers are valid.
        self.arena.ptr().wrapping_add(off).expose_provenance() as u64
    }

    /// SGE lengths: mostly small, sometimes 8 (atomics) or 0.
    fn read_sges(&mut self, r: &mut Bytes<'_>, n: usize) -> Option<(Vec<Sge>, Segs)> {
        let mut sges = Vec::with_capacity(n);
        let mut segs = Vec::with_capacity(n);
        for _ in 0..n {
            let b = r.u8();
            let len = match b % 4 {
                0 => 0,
                1 => 8,
                _ => (b >> 2) as u32,
            };
            let off = self.alloc(len)?;
            let lkey = r.u8() as u32;
            sges.push(Sge::new(self.addr(off), len, lkey));
            if len != 0 {
                segs.push((off, len));
            }
        }
        Some((sges, segs))
    }

    pub(crate) fn post_send(&mut self, r: &mut Bytes<'_>) -> Option<()> {
        let ctl = r.u8();
        let op = send::read_op(r, ctl & 0x0f, ctl & 0x10 != 0);
        let mut flags = SendFlags::NONE;
        if ctl & 0x20 != 0 {
            flags = flags | SendFlags::SIGNALED;
        }
        if ctl & 0x40 != 0 {
            flags = flags | SendFlags::SOLICITED;
        }
        let n = r.u8();
        self.next_id += 1;
        let wr_id = self.next_id << 8 | 0x5e;
        let (payload, segs) = if ctl & 0x80 != 0 {
            let mut pieces = Vec::new();
            for _ in 0..n % 4 {
                let len = (r.u8() % 32) as usize;
                pieces.push(r.take(len).to_vec());
            }
            (PayloadSpec::Inline(pieces), Vec::new())
        } else {
            let (sges, segs) = self.read_sges(r, (n % 6) as usize)?;
            (PayloadSpec::Sges(sges), segs)
        };
        let w = WrSpec {
            wr_id,
            op,
            flags,
            payload,
        };
        let m = &mut self.m;
        let outstanding = m.sq_pi.wrapping_sub(m.sq_retired);
        let v = send::violations(&w, &self.caps, m.sq_state, outstanding, m.sq_cnt);
        // SAFETY: every SGE names a live buffer in `self.arena`, which
        // outlives the queues; nothing else uses those bytes.
        let got = w.with_wr(|wr| unsafe { self.qp.sq.post(wr) });
        match got {
            Err(e) => assert!(v.contains(&e), "send {w:?}: {e:?}, expected {v:?}"),
            Ok(()) => {
                assert!(v.is_empty(), "send {w:?} accepted, breaks {v:?}");
                let start = m.sq_pi;
                m.sq_pi = start.wrapping_add(send::nbb(&w));
                m.sq_batch += 1;
                m.sends.push_back(SendRec {
                    start,
                    end: m.sq_pi,
                    wr_id,
                    op,
                    user_signaled: flags.contains(SendFlags::SIGNALED) || self.sig_all,
                    segs,
                });
            }
        }
        Some(())
    }

    pub(crate) fn post_recv(&mut self, r: &mut Bytes<'_>) -> Option<()> {
        let n = (r.u8() as u32 % (self.caps.max_recv_sge + 2)) as usize;
        let (sges, segs) = self.read_sges(r, n)?;
        self.next_id += 1;
        let wr_id = self.next_id << 8 | 0x4e;
        let m = &mut self.m;
        let mut v = Vec::new();
        if m.rq_state == QpState::Reset {
            v.push(Error::InvalidQpState);
        }
        if sges.len() > self.caps.max_recv_sge as usize {
            v.push(Error::TooManySges);
        }
        if m.rq_head.wrapping_sub(m.rq_tail) >= m.rq_cnt {
            v.push(Error::RqFull);
        }
        let wr = RecvWr { wr_id, sges: &sges };
        // SAFETY: as for sends: the SGEs name arena buffers that outlive
        // the queue.
        match unsafe { self.qp.rq.post(&wr) } {
            Err(e) => assert!(v.contains(&e), "recv {wr:?}: {e:?}, expected {v:?}"),
            Ok(()) => {
                assert!(v.is_empty(), "recv {wr:?} accepted, breaks {v:?}");
                m.rq_head = m.rq_head.wrapping_add(1);
                m.recvs.push_back(RecvRec { wr_id, segs });
            }
        }
        Some(())
    }

    pub(crate) fn ring_sq(&mut self) -> Option<()> {
        self.qp.sq.ring();
        if self.m.sq_batch != 0 {
            self.m.dbrec_sq = self.m.sq_pi & 0xffff;
            self.m.sq_batch = 0;
        }
        Some(())
    }

    pub(crate) fn ring_rq(&mut self) -> Option<()> {
        self.qp.rq.ring();
        if self.m.rq_rung != self.m.rq_head {
            self.m.dbrec_rq = self.m.rq_head & 0xffff;
            self.m.rq_rung = self.m.rq_head;
        }
        Some(())
    }

    /// A CQE built from structured fields, written by `write_cqe` (which
    /// sets the owner bit of its pass).
    pub(crate) fn write_structured(&mut self, r: &mut Bytes<'_>) -> Option<()> {
        let sel = r.u8();
        let op = match sel & 7 {
            0 => REQ,
            1 => RESP_WR_IMM,
            2 => RESP_SEND,
            3 => RESP_SEND_IMM,
            4 => RESP_SEND_INV,
            5 => REQ_ERR,
            6 => RESP_ERR,
            _ => r.u8() >> 4,
        };
        let format = (sel >> 3) & 3;
        let qpn = if sel & 0x20 != 0 {
            r.u32()
        } else {
            self.qpn | (r.u8() as u32) << 24
        };
        let m = &self.m;
        let counter = match (sel >> 6, m.sends.len()) {
            (0, n) if n > 0 => m.sends[r.u8() as usize % n].start as u16,
            // The tail, or (one time in four) the entry after it.
            (1, _) => (m.rq_tail as u16).wrapping_add(r.u8().is_multiple_of(4) as u16),
            // A BB inside (or just after) an outstanding WQE.
            (3, n) if n > 0 => {
                let k = r.u8() as usize;
                (m.sends[k % n].start as u16).wrapping_add(1 + (k >> 6) as u16)
            }
            _ => r.u16(),
        };
        let mut img = [0u8; 64];
        let bc = r.u8();
        let byte_cnt = match bc % 4 {
            0 => (bc >> 2) as u32,
            1 => 8,
            2 => r.u32(),
            _ => 0,
        };
        img[17] = r.u8(); // ml_path
        img[22..24].copy_from_slice(&r.u16().to_be_bytes()); // slid
        img[24..28].copy_from_slice(&r.u32().to_be_bytes()); // flags_rqpn
        img[36..40].copy_from_slice(&r.u32().to_be_bytes()); // imm_inval_pkey
        img[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
        img[54] = r.u8(); // vendor syndrome
        img[55] = r.u8(); // syndrome
        img[56..60].copy_from_slice(&qpn.to_be_bytes());
        img[60..62].copy_from_slice(&counter.to_be_bytes());
        img[63] = op << 4 | format << 2;
        let delta = r.u8();
        let ci = self
            .dev
            .wrapping_add(delta.saturating_sub(240) as u32 & (2 * self.cqe_cnt() - 1));
        if format == 1 {
            img[..32].copy_from_slice(&r.array::<32>());
        }
        if format == 2 && self.cqe_size() == 128 {
            let data = r.array::<64>();
            let base = (ci & (self.cqe_cnt() - 1)) as usize * 128;
            self.f.cq_buf.bytes_mut()[base..base + 64].copy_from_slice(&data);
        }
        self.f.write_cqe(ci, &img);
        self.dev = ci.wrapping_add(1);
        Some(())
    }

    /// A raw 64-byte image, owner bit and all, at any slot.
    pub(crate) fn write_raw(&mut self, r: &mut Bytes<'_>) -> Option<()> {
        let slot = (r.u8() as u32 & (self.cqe_cnt() - 1)) as usize;
        let img = r.array::<64>();
        let size = self.cqe_size();
        let base = slot * size + size - 64;
        self.f.cq_buf.bytes_mut()[base..base + 64].copy_from_slice(&img);
        Some(())
    }

    /// Arbitrary bytes at an arbitrary CQ offset.
    pub(crate) fn patch(&mut self, r: &mut Bytes<'_>) -> Option<()> {
        let len = self.f.cq_buf.len();
        let off = r.u16() as usize % len;
        let n = (r.u8() % 17) as usize;
        let bytes = r.take(n);
        let end = (off + bytes.len()).min(len);
        self.f.cq_buf.bytes_mut()[off..end].copy_from_slice(&bytes[..end - off]);
        Some(())
    }

    /// The model's poll: expected completions (or error); updates the model.
    fn model_poll(&mut self, batch: usize) -> Result<Vec<Wc>, Error> {
        let size = self.cqe_size();
        let cnt = self.cqe_cnt();
        let log_cnt = cnt.trailing_zeros();
        let cq = self.f.cq_buf.bytes().to_vec();
        let mut out = Vec::new();
        let mut err = None;
        while out.len() < batch {
            let ci = self.m.ci;
            let base = (ci & (cnt - 1)) as usize * size;
            let c = &cq[base + size - 64..base + size];
            // Owner bit and opcode (docs/spec/mlx5.md §8): hardware-owned entries end the poll.
            let op_own = c[63];
            let op = op_own >> 4;
            if op == INVALID || (op_own & 1) as u32 != (ci >> log_cnt) & 1 {
                break;
            }
            // Data for scatter-to-CQE: 32 bytes in the CQE (format 1) or the
            // 64 bytes before it in a 128-byte slot (format 2).
            let format = (op_own >> 2) & 3;
            let data = match (format, size) {
                (1, _) => Some(&c[..32]),
                (2, 128) => Some(&cq[base..base + 64]),
                _ => None,
            };
            let outcome = if format == 3 {
                Outcome::Compressed
            } else if format != 0 && !self.scatter {
                Outcome::Corrupt
            } else if be32(c, 56) & 0x00ff_ffff != self.qpn {
                self.m.stale += 1;
                Outcome::Skip
            } else {
                match op {
                    REQ | REQ_ERR => self.model_requester(c, data),
                    RESP_WR_IMM | RESP_SEND | RESP_SEND_IMM | RESP_SEND_INV | RESP_ERR => {
                        self.model_responder(c, data)
                    }
                    _ => Outcome::Corrupt,
                }
            };
            match outcome {
                Outcome::Wc(wc) => {
                    out.push(wc);
                    self.m.ci = ci.wrapping_add(1);
                }
                Outcome::Skip => self.m.ci = ci.wrapping_add(1),
                Outcome::Corrupt => {
                    // Consumed and reported only as the first entry.
                    if out.is_empty() {
                        err = Some(Error::CqeCorrupt);
                        self.m.ci = ci.wrapping_add(1);
                    }
                    break;
                }
                Outcome::Compressed => {
                    // Never consumed.
                    if out.is_empty() {
                        err = Some(Error::CqeCompressed);
                    }
                    break;
                }
            }
        }
        self.m.dbrec_cq = self.m.ci & 0x00ff_ffff;
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// A requester (or requester error) CQE of our QP: retire the send
    /// WQE it names, with everything before it.
    fn model_requester(&mut self, c: &[u8], data: Option<&[u8]>) -> Outcome {
        let m = &mut self.m;
        let counter = be16(c, 60);
        let Some(k) = m.sends.iter().position(|s| s.start as u16 == counter) else {
            return Outcome::Corrupt;
        };
        let s = m.sends[k].clone();
        m.sends.drain(..=k);
        m.sq_retired = s.end;
        let mut wc = Wc {
            wr_id: s.wr_id,
            opcode: send_wc_opcode(&s.op),
            qp_num: self.qpn,
            ..Wc::default()
        };
        if c[63] >> 4 == REQ_ERR {
            wc.status = status_of(c[55]);
            wc.syndrome = c[55];
            wc.vendor_err = c[54] as u32;
            m.sq_state = QpState::Error;
            m.rq_state = QpState::Error;
            return Outcome::Wc(wc);
        }
        if !s.user_signaled {
            // A CQE the doorbell guard requested: consumed, not reported.
            return Outcome::Skip;
        }
        if matches!(s.op, SendOp::SendImm { .. } | SendOp::WriteImm { .. }) {
            wc.wc_flags = WC_WITH_IMM;
        }
        wc.byte_len = match s.op {
            SendOp::Read { .. } => be32(c, 44),
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 8,
            _ => 0,
        };
        // Only READ and atomics have local data to scatter into.
        let scatters = matches!(
            s.op,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        );
        if let (true, Some(src)) = (scatters, data) {
            scatter_model(&mut m.arena, &s.segs, src, wc.byte_len);
        }
        Outcome::Wc(wc)
    }

    /// A responder (or responder error) CQE of our QP: complete the RQ
    /// tail, which must be the entry the CQE names.
    fn model_responder(&mut self, c: &[u8], data: Option<&[u8]>) -> Outcome {
        let m = &mut self.m;
        if m.rq_head == m.rq_tail || m.rq_tail as u16 != be16(c, 60) {
            return Outcome::Corrupt;
        }
        let rec = m.recvs.pop_front().expect("model: recv");
        m.rq_tail = m.rq_tail.wrapping_add(1);
        let mut wc = Wc {
            wr_id: rec.wr_id,
            opcode: WcOpcode::RECV,
            qp_num: self.qpn,
            ..Wc::default()
        };
        let op = c[63] >> 4;
        if op == RESP_ERR {
            wc.status = status_of(c[55]);
            wc.syndrome = c[55];
            wc.vendor_err = c[54] as u32;
            m.sq_state = QpState::Error;
            m.rq_state = QpState::Error;
            return Outcome::Wc(wc);
        }
        let imm = be32(c, 36);
        let fr = be32(c, 24);
        wc.byte_len = be32(c, 44);
        match op {
            RESP_WR_IMM => {
                wc.opcode = WcOpcode::RECV_RDMA_WITH_IMM;
                wc.wc_flags = WC_WITH_IMM;
                wc.imm_data = imm;
            }
            RESP_SEND_IMM => {
                wc.wc_flags = WC_WITH_IMM;
                wc.imm_data = imm;
            }
            RESP_SEND_INV => {
                wc.wc_flags = WC_WITH_INV;
                wc.imm_data = imm;
            }
            _ => {}
        }
        wc.src_qp = fr & 0x00ff_ffff;
        wc.sl = ((fr >> 24) & 0xf) as u8;
        if (fr >> 28) & 3 != 0 {
            wc.wc_flags |= WC_GRH;
        }
        wc.slid = be16(c, 22);
        wc.dlid_path_bits = c[17] & 0x7f;
        wc.pkey_index = (imm & 0xffff) as u16;
        if let Some(src) = data {
            scatter_model(&mut m.arena, &rec.segs, src, wc.byte_len);
        }
        Outcome::Wc(wc)
    }

    pub(crate) fn poll(&mut self, batch: usize) -> Option<()> {
        let cq_before = self.f.cq_buf.bytes().to_vec();
        let qp_before = self.f.qp_buf.bytes().to_vec();
        let ci_before = self.m.ci;
        let sq_before = (self.m.sq_retired, self.m.sq_pi);
        let rq_before = (self.m.rq_tail, self.m.rq_head);
        let live: HashSet<u64> = self
            .m
            .sends
            .iter()
            .map(|s| s.wr_id)
            .chain(self.m.recvs.iter().map(|r| r.wr_id))
            .collect();

        let expect = self.model_poll(batch);
        let mut out = [Wc::default(); MAX_BATCH];
        let got = self.cq.poll(&mut self.qp, &mut out[..batch]);
        match (&expect, &got) {
            (Ok(want), Ok(n)) => {
                assert_eq!(&out[..*n], &want[..], "completions");
                for wc in &out[..*n] {
                    assert!(
                        live.contains(&wc.wr_id),
                        "wr_id {:#x} not outstanding",
                        wc.wr_id
                    );
                    assert!(
                        self.m.completed.insert(wc.wr_id),
                        "wr_id {:#x} completed twice",
                        wc.wr_id
                    );
                }
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "poll error"),
            _ => panic!(
                "poll: expected {expect:?}, got {got:?} ({:?})",
                &out[..batch]
            ),
        }
        assert!(self.f.cq_buf.bytes() == &cq_before[..], "poll wrote the CQ");
        assert!(
            self.f.qp_buf.bytes() == &qp_before[..],
            "poll wrote the QP buffer"
        );
        let sq = self.qp.sq.retired().wrapping_sub(sq_before.0);
        assert!(
            sq <= sq_before.1.wrapping_sub(sq_before.0),
            "SQ retired past the producer"
        );
        let rq = self.qp.rq.tail().wrapping_sub(rq_before.0);
        assert!(
            rq <= rq_before.1.wrapping_sub(rq_before.0),
            "RQ tail past the head"
        );
        let adv = self.cq.consumer_index().wrapping_sub(ci_before);
        assert!(
            adv <= self.cqe_cnt() + batch as u32,
            "consumer index moved by {adv}"
        );
        self.check_state();
        Some(())
    }
}
