//! `wqe_encode`: arbitrary send-queue geometry plus an arbitrary sequence of
//! send WRs, doorbells and retirements, against an independent model.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! geo      u8   bits 0-2: log2 SQ BBs (% 7 -> 1..64), bits 3-4: BF policy,
//!               bit 5: sig_all, bit 6: shared_register
//! bf       u8   bf_size = [0, 64, 128, 256][bf & 3]
//! sge      u8   max_send_sge = 1 + sge % 8
//! inline   u8   max_inline_data = inline % 201
//! seed     u8   fill pattern of the QP buffer
//! qpn      u32  top byte 0xff keeps it (invalid, > 24 bits); else masked
//! pi       u32  start producer counter (reset_counters)
//! ops...        until the input ends (at most MAX_OPS): u8 code % 16, then
//!               its fields:
//!   0-7   post       one WR (`send::read_wr`)
//!   8     ring       doorbell
//!   9     post_one   one WR, posted and rung
//!   10-11 retire     u8: the k-th outstanding WQE (its index)
//!   12    retire     u8 sel, u8 k[, u16]: an arbitrary index, a BB inside
//!                    an outstanding WQE, or an earlier WQE's index
//!   13    post_list  u8: 1..4 WRs
//!   14    reset      u8 mode[, u32 | u8]: counters to a value, to 0 or a
//!                    little behind the producer
//!   15    state      u8: QP state (RESET..ERROR)
//! ```
//!
//! Checked after every step:
//! - an accepted WR decodes (`testutil::decode_wqe`, at its first BB) to
//!   exactly what was asked: opcode, index, QPN, DS, `fm_ce_se`, immediate,
//!   remote, atomic operands, SGEs (zero-length ones skipped, atomics
//!   forced to 8), inline bytes; reserved control/raddr bytes are zero;
//! - a rejected WR changes no byte of the QP buffer, the doorbell record or
//!   the register, and no counter; its error is one of the rules the WR
//!   breaks, computed independently (`send::violations`), and a WR is
//!   rejected exactly when it breaks one;
//! - bytes outside the BBs of accepted WQEs never change (RQ region, GUARD
//!   bytes after the ring, ring BBs of other WQEs);
//! - a WQE requests a CQE exactly when asked (SIGNALED or sig_all) when it
//!   is written; a doorbell may only add that request to the last WQE it
//!   covers, and afterwards the unsignaled run plus the largest WQE fits
//!   the ring (the SQ can never fill with work nothing retires, docs/spec/mlx5.md §9);
//! - after a doorbell the record is `producer & 0xffff`, the register holds
//!   the last WQE's control bytes (or, for BlueFlame, the whole WQE) at the
//!   current half, nothing else in the register changes, and the half
//!   toggles;
//! - `retire` of an outstanding WQE returns its id, opcode and signaled bit
//!   and retires everything before it; `retire` of any other index
//!   returns `None` and changes nothing;
//! - producer, retired, free and pending counters match the model.
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use rdma_direct::provider::mlx5::{BfPolicy, QpState, Retired, SendQueue, SqConfig};
use rdma_direct::testutil::{decode_wqe, FakeGeometry, FakeMlx5, GUARD};
use rdma_direct::{Error, PostError, QpCaps, SendFlags, SendWr};
use rdma_direct_fuzz::send::{self, ctrl, PayloadSpec, WrSpec};
use rdma_direct_fuzz::{pattern, Bytes};

/// Upper bound on operations per input, to keep executions fast.
const MAX_OPS: usize = 4096;
/// How many past WQE indices to remember.
const HISTORY: usize = 128;

/// An accepted WQE the device has not completed yet.
#[derive(Clone, Debug)]
struct Posted {
    start: u32,
    end: u32,
    wr_id: u64,
    opcode: u8,
    user_signaled: bool,
}

/// What the queue must look like, computed without the crate.
struct Model {
    wqe_cnt: u32,
    pi: u32,
    retired: u32,
    last_signaled_end: u32,
    /// WQEs written since the last doorbell.
    batch: u32,
    /// First BB, DS and inline-ness of the last WQE written.
    last: (u32, u32, bool),
    outstanding: VecDeque<Posted>,
    state: QpState,
    dbrec: u32,
    bf_offset: u32,
}

struct Harness {
    f: FakeMlx5,
    sq: SendQueue,
    m: Model,
    caps: QpCaps,
    cfg: SqConfig,
    /// QP buffer and register contents as last verified.
    shadow_qp: Vec<u8>,
    shadow_bf: Vec<u8>,
    /// First BBs of the last [`HISTORY`] accepted WQEs (for stale indices).
    history: VecDeque<u32>,
}

fn state_from(b: u8) -> QpState {
    match b % 5 {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        _ => QpState::Error,
    }
}

impl Harness {
    fn sq_offset(&self) -> usize {
        self.f.sq_offset()
    }

    fn ring_len(&self) -> usize {
        self.m.wqe_cnt as usize * 64
    }

    /// Checks every counter the queue exposes against the model.
    fn check_counters(&self) {
        assert_eq!(self.sq.producer(), self.m.pi, "producer");
        assert_eq!(self.sq.retired(), self.m.retired, "retired");
        let outstanding = self.m.pi.wrapping_sub(self.m.retired);
        assert!(outstanding <= self.m.wqe_cnt, "model outstanding");
        assert_eq!(self.sq.free_bbs(), self.m.wqe_cnt - outstanding, "free_bbs");
        assert_eq!(self.sq.pending(), self.m.batch, "pending");
        assert_eq!(self.sq.state(), self.m.state, "state");
        assert_eq!(self.sq.bf_offset(), self.m.bf_offset, "bf_offset");
        assert_eq!(self.f.dbrec_sq(), self.m.dbrec, "SQ doorbell record");
        assert_eq!(self.f.dbrec_rq(), 0, "RQ doorbell record written");
    }

    /// Nothing anywhere changed since the last verified state.
    fn check_untouched(&self, what: &str) {
        assert!(
            self.f.qp_buf.bytes() == &self.shadow_qp[..],
            "{what}: QP buffer modified"
        );
        assert!(
            self.f.bf.bytes() == &self.shadow_bf[..],
            "{what}: doorbell register modified"
        );
    }

    /// The bytes of the BBs `[start, end)`, in ring order (wrapping).
    fn bbs(&self, start: u32, end: u32) -> Vec<u8> {
        let mask = self.m.wqe_cnt - 1;
        let ring = self.f.sq_bytes();
        let mut v = Vec::with_capacity(end.wrapping_sub(start) as usize * 64);
        let mut bb = start;
        while bb != end {
            let base = (bb & mask) as usize * 64;
            v.extend_from_slice(&ring[base..base + 64]);
            bb = bb.wrapping_add(1);
        }
        v
    }

    /// True if QP-buffer byte `i` lies in a BB of one of `posted`.
    fn in_wqes(&self, i: usize, posted: &[Posted]) -> bool {
        let off = self.sq_offset();
        if i < off || i >= off + self.ring_len() {
            return false;
        }
        let bb = ((i - off) / 64) as u32;
        let mask = self.m.wqe_cnt - 1;
        posted
            .iter()
            .any(|p| bb.wrapping_sub(p.start) & mask < p.end.wrapping_sub(p.start))
    }

    /// Verifies an accepted WQE against its request.
    /// `rung`: the WQE was the last one of a doorbell, which may have
    /// made it request a CQE.
    fn check_wqe(&self, p: &Posted, w: &WrSpec, fm_ce_se: u8, rung: bool) {
        let mask = self.m.wqe_cnt - 1;
        let ring = self.f.sq_bytes();
        let d = decode_wqe(ring, p.start & mask)
            .unwrap_or_else(|e| panic!("accepted WR {w:?} does not decode: {e:?}"));
        let (opcode, _) = send::opcode_and_hdr(&w.op);
        assert_eq!(d.opcode, opcode, "opcode of {w:?}");
        assert_eq!(d.opmod, 0, "opmod");
        assert_eq!(d.wqe_index, p.start as u16, "wqe index");
        assert_eq!(d.qpn, self.f.geo.qpn, "qpn");
        assert_eq!(d.ds, send::ds(w), "ds of {w:?}");
        if rung && d.fm_ce_se == fm_ce_se | ctrl::CQ_UPDATE {
            // Forced by the doorbell's unsignaled-run guard (docs/spec/mlx5.md §9).
        } else {
            assert_eq!(d.fm_ce_se, fm_ce_se, "fm_ce_se of {w:?}");
        }
        send::check_payload(&d, w);
        // Reserved bytes: signature and DC stream id of the control segment,
        // the reserved word of the remote-address segment.
        let base = (p.start & mask) as usize * 64;
        assert_eq!(
            &ring[base + 8..base + 11],
            &[0, 0, 0],
            "ctrl reserved bytes"
        );
        if w.op.remote().is_some() {
            let oct = (base + 16) % ring.len();
            assert_eq!(&ring[oct + 12..oct + 16], &[0; 4], "raddr reserved word");
        }
    }

    /// After accepted posts: bytes outside the given WQEs' BBs unchanged.
    fn check_outside(&self, posted: &[Posted]) {
        let now = self.f.qp_buf.bytes();
        let old = &self.shadow_qp[..];
        // Whole regions first (one compare each); bytes only where a region
        // changed.
        let off = self.sq_offset();
        let end = off + self.ring_len();
        let mut regions = vec![(0, off), (end, now.len())];
        for bb in 0..self.m.wqe_cnt as usize {
            let i = off + bb * 64;
            if !self.in_wqes(i, posted) {
                regions.push((i, i + 64));
            }
        }
        for (a, b) in regions {
            if now[a..b] == old[a..b] {
                continue;
            }
            for i in a..b {
                if now[i] != old[i] && !self.forced_ce(i, old[i], now[i]) {
                    let where_ = if i < off {
                        "RQ region".to_string()
                    } else if i >= end {
                        format!("GUARD byte {}", i - end)
                    } else {
                        format!("ring byte {}", i - off)
                    };
                    panic!(
                        "{where_} modified outside the accepted WQEs ({:#04x} -> {:#04x})",
                        old[i], now[i]
                    );
                }
            }
        }
    }

    /// True if the change `old -> new` of QP-buffer byte `i` is a doorbell
    /// making the last written WQE request a CQE: byte 11 (`fm_ce_se`) of
    /// its control segment gains `CQ_UPDATE`, nothing else.
    fn forced_ce(&self, i: usize, old: u8, new: u8) -> bool {
        let ctrl = self.sq_offset() + (self.m.last.0 & (self.m.wqe_cnt - 1)) as usize * 64;
        self.m.batch != 0 && i == ctrl + 11 && new == old | ctrl::CQ_UPDATE
    }

    /// Model side of a post: the violations, or the accepted WQE and its
    /// `fm_ce_se` byte (model updated).
    fn model_post(&mut self, w: &WrSpec) -> Result<(Posted, u8), Vec<Error>> {
        let outstanding = self.m.pi.wrapping_sub(self.m.retired);
        let v = send::violations(w, &self.caps, self.m.state, outstanding, self.m.wqe_cnt);
        if !v.is_empty() {
            return Err(v);
        }
        let (opcode, _) = send::opcode_and_hdr(&w.op);
        let start = self.m.pi;
        let end = start.wrapping_add(send::nbb(w));
        // At post time the WQE requests a CQE exactly when asked to; the
        // doorbell may add one later (see `after_ring`).
        let user_signaled = w.flags.contains(SendFlags::SIGNALED) || self.cfg.sig_all;
        if user_signaled {
            self.m.last_signaled_end = end;
        }
        let mut fm_ce_se = 0;
        if user_signaled {
            fm_ce_se |= ctrl::CQ_UPDATE;
        }
        if w.flags.contains(SendFlags::SOLICITED) {
            fm_ce_se |= ctrl::SOLICITED;
        }
        if w.flags.contains(SendFlags::FENCE) {
            fm_ce_se |= ctrl::FENCE;
        }
        let p = Posted {
            start,
            end,
            wr_id: w.wr_id,
            opcode,
            user_signaled,
        };
        self.m.pi = end;
        self.m.batch += 1;
        self.m.last = (
            start,
            send::ds(w),
            matches!(w.payload, PayloadSpec::Inline(_)),
        );
        self.m.outstanding.push_back(p.clone());
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(start);
        Ok((p, fm_ce_se))
    }

    fn post(&mut self, w: &WrSpec) {
        let expect = self.model_post(w);
        let wrid_before = self.f.sq_wrid.clone();
        // SAFETY: nothing reads or writes the SGE addresses in this target
        // (no device, no CQ): the queue only copies them into WQEs.
        let got = w.with_wr(|wr| unsafe { self.sq.post(wr) });
        match (expect, got) {
            (Err(v), Err(e)) => {
                assert!(v.contains(&e), "{w:?}: got {e:?}, breaks only {v:?}");
                self.check_untouched("rejected post");
                assert!(
                    self.f.sq_wrid == wrid_before,
                    "rejected post wrote the side table"
                );
            }
            (Err(v), Ok(())) => panic!("{w:?} accepted but breaks {v:?}"),
            (Ok(_), Err(e)) => panic!("valid {w:?} rejected with {e:?}"),
            (Ok((p, fm_ce_se)), Ok(())) => {
                self.check_wqe(&p, w, fm_ce_se, false);
                self.check_outside(&[p]);
                self.shadow_qp.copy_from_slice(self.f.qp_buf.bytes());
                self.check_untouched("after post");
            }
        }
        self.check_counters();
    }

    fn post_one(&mut self, w: &WrSpec) {
        let expect = self.model_post(w);
        let wrid_before = self.f.sq_wrid.clone();
        let bf_before = self.f.bf.bytes().to_vec();
        // SAFETY: as in `post`: no SGE is ever dereferenced here.
        let got = w.with_wr(|wr| unsafe { self.sq.post_one(wr) });
        match (expect, got) {
            (Err(v), Err(e)) => {
                assert!(v.contains(&e), "{w:?}: got {e:?}, breaks only {v:?}");
                self.check_untouched("rejected post_one");
                assert!(
                    self.f.sq_wrid == wrid_before,
                    "rejected post wrote the side table"
                );
                self.check_counters();
            }
            (Err(v), Ok(())) => panic!("{w:?} accepted but breaks {v:?}"),
            (Ok(_), Err(e)) => panic!("valid {w:?} rejected with {e:?}"),
            (Ok((p, fm_ce_se)), Ok(())) => {
                self.check_wqe(&p, w, fm_ce_se, true);
                self.check_outside(&[p]);
                self.shadow_qp.copy_from_slice(self.f.qp_buf.bytes());
                self.after_ring(bf_before);
            }
        }
    }

    fn post_list(&mut self, specs: &[WrSpec]) {
        // Expected: every WR before the first invalid one is posted, then
        // the doorbell rings.
        let mut accepted = Vec::new();
        let mut failure = None;
        for (i, w) in specs.iter().enumerate() {
            match self.model_post(w) {
                Ok(p) => accepted.push(p),
                Err(v) => {
                    failure = Some((i, v));
                    break;
                }
            }
        }
        let refs: Vec<Vec<&[u8]>> = specs
            .iter()
            .map(|w| match &w.payload {
                PayloadSpec::Inline(p) => p.iter().map(|x| x.as_slice()).collect(),
                PayloadSpec::Sges(_) => Vec::new(),
            })
            .collect();
        let wrs: Vec<SendWr<'_>> = specs
            .iter()
            .zip(refs.iter())
            .map(|(w, r)| match &w.payload {
                PayloadSpec::Sges(s) => SendWr::new(w.wr_id, w.op, s, w.flags),
                PayloadSpec::Inline(_) => SendWr::inline(w.wr_id, w.op, r, w.flags),
            })
            .collect();
        let bf_before = self.f.bf.bytes().to_vec();
        // SAFETY: as in `post`: no SGE is ever dereferenced here.
        let got = unsafe { self.sq.post_list(&wrs) };
        match (&failure, got) {
            (None, Ok(())) => {}
            (Some((i, v)), Err(PostError { index, error })) => {
                assert_eq!(*i, index, "post_list failed at the wrong WR");
                assert!(
                    v.contains(&error),
                    "post_list: got {error:?}, WR breaks {v:?}"
                );
            }
            (f, g) => panic!("post_list: expected {f:?}, got {g:?}"),
        }
        for (i, ((p, fm_ce_se), w)) in accepted.iter().zip(specs).enumerate() {
            self.check_wqe(p, w, *fm_ce_se, i + 1 == accepted.len());
        }
        let posted: Vec<Posted> = accepted.into_iter().map(|(p, _)| p).collect();
        self.check_outside(&posted);
        self.shadow_qp.copy_from_slice(self.f.qp_buf.bytes());
        self.after_ring(bf_before);
    }

    /// Verifies a doorbell that just happened (`bf_before`: the register
    /// before it) and updates the model.
    fn after_ring(&mut self, bf_before: Vec<u8>) {
        let bf = self.f.bf.bytes();
        if self.m.batch == 0 {
            assert!(bf == &bf_before[..], "empty doorbell wrote the register");
            self.check_counters();
            return;
        }
        let (last_start, last_ds, last_inline) = self.m.last;
        let bf_size = self.f.geo.bf_size;
        let use_bf = self.m.batch == 1
            && bf_size != 0
            && last_ds > 1
            && last_ds * 16 <= bf_size
            && match self.cfg.bf_policy {
                BfPolicy::Never => false,
                BfPolicy::SingleWqe => true,
                BfPolicy::SingleInlineWqe => last_inline,
            };
        let off = self.m.bf_offset as usize;
        let wqe = self.bbs(last_start, last_start.wrapping_add(last_ds.div_ceil(4)));
        let written = if use_bf { wqe.len() } else { 8 };
        assert_eq!(
            &bf[off..off + written],
            &wqe[..written],
            "doorbell register (BlueFlame: {use_bf}) does not hold the last WQE"
        );
        for (i, (&a, &b)) in bf.iter().zip(bf_before.iter()).enumerate() {
            assert!(
                (off..off + written).contains(&i) || a == b,
                "doorbell register byte {i} written outside the doorbell"
            );
        }
        // The unsignaled-run guard (docs/spec/mlx5.md §9): if the doorbell made the last
        // WQE request a CQE, the run restarts. Either way, once every
        // requested CQE arrives the largest WQE must fit again, or the SQ
        // could fill with work nothing retires.
        let ctrl = self.sq_offset() + (last_start & (self.m.wqe_cnt - 1)) as usize * 64;
        if self.f.qp_buf.bytes()[ctrl + 11] & ctrl::CQ_UPDATE != 0 {
            self.m.last_signaled_end = self.m.pi;
        }
        let run = self.m.pi.wrapping_sub(self.m.last_signaled_end);
        let max_nbb = send::max_wqe_ds(&self.caps).div_ceil(4);
        assert!(
            run + max_nbb <= self.m.wqe_cnt,
            "after a doorbell {run} unsignaled BBs remain on a {}-BB ring (largest WQE {max_nbb} BBs)",
            self.m.wqe_cnt
        );
        self.m.dbrec = self.m.pi & 0xffff;
        self.m.bf_offset ^= bf_size;
        self.m.batch = 0;
        self.shadow_bf.copy_from_slice(bf);
        self.check_untouched("after ring");
        self.check_counters();
    }

    fn ring(&mut self) {
        let bf_before = self.f.bf.bytes().to_vec();
        self.sq.ring();
        self.check_outside(&[]);
        self.shadow_qp.copy_from_slice(self.f.qp_buf.bytes());
        self.after_ring(bf_before);
    }

    /// Retires by 16-bit WQE index; the model decides what must happen.
    fn retire(&mut self, counter: u16) {
        let hit = self
            .m
            .outstanding
            .iter()
            .position(|p| p.start as u16 == counter);
        let got = self.sq.retire(counter);
        match hit {
            None => assert_eq!(got, None, "retire({counter:#x}) of no outstanding WQE"),
            Some(k) => {
                let p = self.m.outstanding[k].clone();
                let want = Retired {
                    wr_id: p.wr_id,
                    opcode: p.opcode,
                    user_signaled: p.user_signaled,
                    start: p.start,
                };
                assert_eq!(got, Some(want), "retire({counter:#x})");
                self.m.outstanding.drain(..=k);
                self.m.retired = p.end;
            }
        }
        self.check_untouched("retire");
        self.check_counters();
    }

    fn reset(&mut self, pi: u32) {
        self.sq.reset_counters(pi);
        self.m.pi = pi;
        self.m.retired = pi;
        self.m.last_signaled_end = pi;
        self.m.batch = 0;
        self.m.outstanding.clear();
        self.check_untouched("reset");
        self.check_counters();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let geo = r.u8();
    let bf = r.u8();
    let max_send_sge = 1 + (r.u8() % 8) as u32;
    let max_inline_data = (r.u8() % 201) as u32;
    let seed = r.u8();
    let qpn_raw = r.u32();
    let qpn = if qpn_raw >> 24 == 0xff {
        qpn_raw
    } else {
        qpn_raw & 0x00ff_ffff
    };
    let start_pi = r.u32();

    let wqe_cnt = 1u32 << ((geo & 7) % 7);
    let cfg = SqConfig {
        bf_policy: match (geo >> 3) & 3 {
            0 => BfPolicy::Never,
            2 => BfPolicy::SingleInlineWqe,
            _ => BfPolicy::SingleWqe,
        },
        sig_all: geo & 0x20 != 0,
        shared_register: geo & 0x40 != 0,
    };
    let mut f = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: wqe_cnt,
        rq_wqe_cnt: 4,
        rq_stride: 32,
        bf_size: [0, 64, 128, 256][(bf & 3) as usize],
        cqe_cnt: 2,
        cqe_size: 64,
        qpn,
        cqn: 1,
    });
    assert_eq!(
        f.qp_buf.len(),
        f.sq_offset() + wqe_cnt as usize * 64 + GUARD,
        "fake layout"
    );
    pattern::fill(f.qp_buf.bytes_mut(), seed);
    pattern::fill(f.bf.bytes_mut(), seed ^ 0x5a);
    let caps = QpCaps {
        max_send_sge,
        max_inline_data,
        max_recv_sge: 2,
    };

    // The constructor must accept exactly the geometries whose largest WQE
    // fits, and QPNs of 24 bits.
    let mut bad = Vec::new();
    if !send::geometry_ok(&caps, wqe_cnt) {
        bad.push(Error::InvalidGeometry);
    }
    if qpn >= 1 << 24 {
        bad.push(Error::InvalidQpn);
    }
    let sq = match f.send_queue(caps, cfg) {
        Ok(sq) => {
            assert!(
                bad.is_empty(),
                "constructor accepted {caps:?} on {wqe_cnt} BBs"
            );
            sq
        }
        Err(e) => {
            assert!(
                bad.contains(&e),
                "constructor: {e:?} for {caps:?} on {wqe_cnt} BBs"
            );
            return;
        }
    };

    let shadow_qp = f.qp_buf.bytes().to_vec();
    let shadow_bf = f.bf.bytes().to_vec();
    let mut h = Harness {
        f,
        sq,
        m: Model {
            wqe_cnt,
            pi: 0,
            retired: 0,
            last_signaled_end: 0,
            batch: 0,
            last: (0, 0, false),
            outstanding: VecDeque::new(),
            state: QpState::Rts,
            dbrec: 0,
            bf_offset: 0,
        },
        caps,
        cfg,
        shadow_qp,
        shadow_bf,
        history: VecDeque::new(),
    };
    h.check_counters();
    h.reset(start_pi);

    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        let op = r.u8();
        match op % 16 {
            0..=7 => {
                let w = send::read_wr(&mut r);
                h.post(&w);
            }
            8 => h.ring(),
            9 => {
                let w = send::read_wr(&mut r);
                h.post_one(&w);
            }
            10 | 11 => {
                // Retire an outstanding WQE (or, with none, a random index).
                let k = r.u8() as usize;
                let counter = match h.m.outstanding.len() {
                    0 => k as u16,
                    n => h.m.outstanding[k % n].start as u16,
                };
                h.retire(counter);
            }
            12 => {
                // Indices a corrupt or stale CQE could carry: anything, a BB
                // inside an outstanding WQE, or an earlier WQE's index.
                let sel = r.u8();
                let k = r.u8() as usize;
                let counter = match (sel % 3, h.m.outstanding.len(), h.history.len()) {
                    (1, n, _) if n > 0 => (h.m.outstanding[k % n].start as u16)
                        .wrapping_add(1 + (sel >> 2) as u16 % 4),
                    (2, _, n) if n > 0 => h.history[k % n] as u16,
                    _ => r.u16(),
                };
                h.retire(counter);
            }
            13 => {
                let n = 1 + (r.u8() % 4) as usize;
                let specs: Vec<WrSpec> = (0..n).map(|_| send::read_wr(&mut r)).collect();
                h.post_list(&specs);
            }
            14 => {
                // Anywhere, back to 0 (a QP reset), or a little behind.
                let pi = match r.u8() % 3 {
                    0 => r.u32(),
                    1 => 0,
                    _ => h.m.pi.wrapping_sub(r.u8() as u32),
                };
                h.reset(pi);
            }
            _ => {
                let s = state_from(r.u8());
                h.sq.set_state(s);
                h.m.state = s;
                h.check_counters();
            }
        }
    }
    // A last doorbell, then complete everything: the ring must drain.
    h.ring();
    if let Some(last) = h.m.outstanding.back() {
        let c = last.start as u16;
        h.retire(c);
    }
    assert_eq!(h.sq.free_bbs(), wqe_cnt, "ring did not drain");
});
