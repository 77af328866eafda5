//! `recover_ops`: the control path and recovery of a connected QP pair
//! through the C object API, on one software device in step mode
//! (`rdd_device_step`, deterministic): random sequences of posts (the
//! per-opcode `rdd_qp_write` / `rdd_qp_read` / `rdd_qp_send` /
//! `rdd_qp_recv`, with and without `RDD_SEND_DEFER_DOORBELL`, and lists
//! through `rdd_qp_post_send`), `rdd_qp_ring`, device steps, polls
//! (`rdd_cq_poll_n`, `rdd_cq_poll`), work requests made to fail, and
//! `rdd_qp_recover` (with and without a peer, with refused attributes),
//! `rdd_qp_connect` (also refused ones) and `rdd_qp_query` at random
//! points, against a model of every posted WR.
//!
//! The C ABI has no fault injection (`rdd_soft_config` sizes CQEs and the
//! RNR delay only) and no call that moves a QP to ERROR by itself, so WRs
//! fail by their operands: a bad local key (requester only), a bad remote
//! key or a READ/WRITE past the end of the peer's region, a SEND longer
//! than the receive buffer, a receive with a bad key (these end the
//! responder's connection too, docs/spec/responder.md). `rdd_qp_recover`
//! moves the QP to ERROR itself.
//!
//! Setup: one device, one PD, QPs A and B (each with its own CQ for sends
//! and receives, as `rdd_qp_recover` requires), one 16 KiB region each:
//! zone 0 (sources of WRITE/SEND, destinations of READ), zone 1 (the
//! peer's WRITE targets), zone 2 (receive buffers), zone 3 (a fixed
//! pattern, READ source). Every WR gets a fresh sequence number `seq`; its
//! slot `seq % 512` (8 bytes) in each zone is its own, and a WRITE/SEND
//! carries a stamp naming side, kind and `seq`.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! cfg  u8   bits 0-1: max_send_wr [4, 8, 16, 32]; bits 2-3: max_recv_wr
//!           [4, 8, 16, 32]; bit 4: rnr_retry 1 (else 7, infinite);
//!           bits 5-7: "signal every Nth" N [1, 2, 3, 4, 8, 16, 64, never]
//! ops... until the input ends (at most MAX_OPS): op u8, side = bit 4,
//!        arg = bits 5-7, code = bits 0-3:
//!   0 WRITE, 1 READ, 2 SEND (per-opcode call; f u8), 3 RECV (f u8)
//!   4 a list of arg % 4 + 1 sends through rdd_qp_post_send (kind u8 % 3,
//!     f u8 each)
//!   5 rdd_qp_ring         6 arg + 1 device steps
//!   7 rdd_cq_poll_n of n u8 % 17      8 rdd_cq_poll of n u8 % 17 + 1
//!   9 FAIL: a signaled WRITE with a bad remote key
//!  10 rdd_qp_recover without a peer  11 with the peer (attr variant arg)
//!  12 rdd_qp_connect (attr variant arg)
//!  13 heal: recover both with peers, then a signaled WRITE each way
//!  14 rdd_qp_connect with refused attributes (variant arg | 4)
//!  15 rdd_qp_recover with the peer and refused attributes (arg | 4)
//!   f: bit 0 SIGNALED, bit 1 signalled by the every-Nth counter instead,
//!      bit 2 DEFER_DOORBELL, bit 3 FENCE, bit 4 a stray flag (0x10:
//!      INVALID_FLAGS), bits 5-7 fault: 5 local (bad lkey), 6 and 7 remote
//!      (WRITE: bad rkey / past the end; READ: past the end / bad rkey;
//!      SEND: 16 bytes into 8-byte receives / bad lkey; RECV: bad lkey)
//!   attr variant v % 8: 0..=3 good, 4 unknown access bit, 5 info
//!      reserved field set, 6 retry_cnt 8, 7 sl 16 or a 25-bit QP number
//! ```
//!
//! At the end both QPs are healed (recovered, reconnected, a WRITE each
//! way checked) and everything is destroyed.
//!
//! Checked:
//! - every post's status is predicted: `INVALID_FLAGS`, `INVALID_QP_STATE`
//!   (in RESET; ERROR takes posts and flushes them), `SQ_FULL` / `RQ_FULL` exactly
//!   when the queue is full, else `OK`; a list stops at the right index;
//!   a refused call changes nothing (`rdd_qp_query` snapshot and doorbell
//!   count before and after);
//! - every completion (polled, or handed to the recover callback) names an
//!   outstanding WR of its QP: nothing unknown, nothing twice; receives
//!   complete in posting order, sends in posting order where the WRs
//!   skipped (retired silently) are unsignaled, not made to fail, and came
//!   before any error; a success is signaled and not made to fail; after
//!   a QP's first error every completion is a flush; a first error that is
//!   not a flush belongs to a WR made to fail (or a peer's fault, a peer
//!   recovery or RNR exhaustion made it possible); a flush as first error
//!   only inside a recovery or after such a peer event;
//! - data: a successful (or silently retired) WRITE's stamp is in the
//!   peer's zone 1, a READ's bytes are the peer's pattern, a received
//!   SEND carries a stamp of the peer's SENDs; a failed or flushed WRITE
//!   or READ wrote nothing;
//! - `rdd_qp_recover` finishes: in step mode a call that times out
//!   (timeout 0) must succeed after `rdd_device_step`, within
//!   `RECOVER_TRIES` calls; it reports each completion once
//!   (`reported` = the callback count), leaves nothing unreported that
//!   had to be, names the model's first failed WR (`has_failure`), and
//!   leaves the QP in RESET (or RTS with a peer) with nothing outstanding;
//!   refused attributes are refused before anything is drained;
//! - `rdd_qp_query` after every operation: state, connected flag and
//!   recovery phase as the model has them, receives outstanding exactly,
//!   sends outstanding between what must still complete and what the
//!   model has not seen retire;
//! - after a heal, a signaled WRITE each way succeeds and lands.
#![no_main]

use std::collections::VecDeque;
use std::ptr::{null, null_mut};

use libfuzzer_sys::fuzz_target;
use rdma_direct::ffi::*;
use rdma_direct_fuzz::{pattern, Bytes};

#[path = "recover_ops/completions.rs"]
mod completions;
#[path = "recover_ops/control.rs"]
mod control;

/// Upper bound on operations per input.
const MAX_OPS: usize = 96;
/// Bytes of each side's region (four zones).
const MR_LEN: usize = 16384;
const ZONE: u64 = 4096;
/// Slots per zone; sequence numbers stay below this per input.
const SLOTS: u32 = 512;
/// Sequence numbers per input (fewer than `SLOTS`, so no slot is reused):
/// posts stop at `MAX_POST_SEQ`, the rest is for the heals' WRITEs (two
/// per heal, at most `MAX_OPS + 1` heals).
const MAX_SEQ: u32 = SLOTS - 1;
const MAX_POST_SEQ: u32 = MAX_SEQ - 2 * (MAX_OPS as u32 + 1);
/// `rdd_qp_recover` calls (timeout 0, a device step between) before it
/// must have finished.
const RECOVER_TRIES: usize = 4;
const STRAY: u32 = 0x10;
const ALL_ACCESS: u32 = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE | RDD_ACCESS_REMOTE_READ;

fn ok(s: rdd_status, what: &str) {
    assert_eq!(s, rdd_status::Ok, "{what}");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    Read,
    Send,
}

/// How a WR is made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// The requester alone fails it.
    Local,
    /// The responder fails it and its connection ends.
    Remote,
}

#[derive(Clone, Copy, Debug)]
struct SendRec {
    wr_id: u64,
    seq: u32,
    kind: Kind,
    signaled: bool,
    fault: Fault,
}

#[derive(Clone, Copy, Debug)]
struct RecvRec {
    wr_id: u64,
    seq: u32,
    bad: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Reset,
    Rts,
    Error,
}

/// The model of one QP.
#[derive(Default)]
struct Model {
    /// Sends posted and not seen to complete (reported or retired).
    sends: VecDeque<SendRec>,
    recvs: VecDeque<RecvRec>,
    state: Option<State>,
    connected: bool,
    /// An error completion was seen since the last reset.
    errored: bool,
    /// A send's error completion was seen since the last reset: every
    /// later send is flushed and reported, none retires silently.
    sq_errored: bool,
    /// The first non-flush error's wr_id since the last reset.
    first_failure: Option<u64>,
    /// Something outside this QP's own WRs may have failed its work (the
    /// peer's fault WRs, the peer's recovery, a bad receive of the peer);
    /// cleared by a heal.
    loose: bool,
    /// Sends posted in "every Nth" mode.
    nth: u32,
    /// Sends posted with `RDD_SEND_DEFER_DOORBELL` and not rung yet.
    deferred: bool,
}

fn wr_id(side: usize, recv: bool, kind: u8, seq: u32) -> u64 {
    (side as u64) << 63 | (recv as u64) << 62 | (kind as u64) << 56 | seq as u64
}

fn stamp(side: usize, kind: Kind, seq: u32) -> u64 {
    0xa5c3 << 48 | (side as u64) << 44 | (kind as u64) << 40 | seq as u64
}

struct Pair {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: [*mut rdd_cq; 2],
    qp: [*mut rdd_qp; 2],
    qpn: [u32; 2],
    mr: [*mut rdd_mr; 2],
    base: [*mut u8; 2],
    lkey: [u32; 2],
    rkey: [u32; 2],
    /// A key no region has.
    bad_key: u32,
    sq_cap: u32,
    rq_cap: u32,
    rnr_retry: u8,
    every: u32,
    m: [Model; 2],
    seq: u32,
    /// Inside `heal` (its WRITEs may use the reserved sequence numbers).
    healing: bool,
    cb: Vec<rdd_wc>,
}

impl Pair {
    fn new(cfg: u8) -> Pair {
        let caps = [4u32, 8, 16, 32];
        let every = [1u32, 2, 3, 4, 8, 16, 64, 0];
        let mut p = Pair {
            dev: null_mut(),
            pd: null_mut(),
            cq: [null_mut(); 2],
            qp: [null_mut(); 2],
            qpn: [0; 2],
            mr: [null_mut(); 2],
            base: [null_mut(); 2],
            lkey: [0; 2],
            rkey: [0; 2],
            bad_key: 0,
            sq_cap: caps[(cfg & 3) as usize],
            rq_cap: caps[((cfg >> 2) & 3) as usize],
            rnr_retry: if cfg & 0x10 != 0 { 1 } else { 7 },
            every: every[(cfg >> 5) as usize],
            m: [Model::default(), Model::default()],
            seq: 0,
            healing: false,
            cb: Vec::with_capacity(256),
        };
        let init = rdd_qp_init {
            max_send_wr: p.sq_cap,
            max_recv_wr: p.rq_cap,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            flags: 0,
        };
        // SAFETY: every out-parameter is a live local or field; `init` is
        // a live local.
        unsafe {
            ok(rdd_device_open_soft(null(), &mut p.dev), "open");
            ok(rdd_pd_alloc(p.dev, &mut p.pd), "pd");
            for s in 0..2 {
                ok(rdd_cq_create(p.dev, 128, &mut p.cq[s]), "cq");
                ok(
                    rdd_qp_create(p.pd, p.cq[s], p.cq[s], &init, &mut p.qp[s]),
                    "qp",
                );
                let mut info = rdd_qp_info::default();
                ok(rdd_qp_query_info(p.qp[s], &mut info), "info");
                p.qpn[s] = info.qpn;
                ok(rdd_mr_reg(p.pd, MR_LEN, ALL_ACCESS, &mut p.mr[s]), "mr");
                let mut a = null_mut();
                ok(rdd_mr_addr(p.mr[s], &mut a), "addr");
                p.base[s] = a.cast();
                ok(rdd_mr_lkey(p.mr[s], &mut p.lkey[s]), "lkey");
                ok(rdd_mr_rkey(p.mr[s], &mut p.rkey[s]), "rkey");
                // Zones 0-2 zero, zone 3 the pattern (the device writes
                // the region only inside `rdd_device_step`).
                let all = std::slice::from_raw_parts_mut(p.base[s], MR_LEN);
                all.fill(0);
                pattern::fill(&mut all[3 * ZONE as usize..], s as u8 + 1);
            }
        }
        p.bad_key = p.lkey[0] ^ 0x8000_0000;
        assert!(
            !p.lkey.contains(&p.bad_key) && !p.rkey.contains(&p.bad_key),
            "bad key"
        );
        for s in 0..2 {
            let st = p.connect_call(s, 0);
            assert_eq!(st, rdd_status::Ok, "initial connect");
            p.m[s].state = Some(State::Rts);
            p.m[s].connected = true;
        }
        p.check_all();
        p
    }

    fn addr(&self, s: usize, zone: u64, slot: u32) -> u64 {
        self.base[s] as u64 + zone * ZONE + slot as u64 * 8
    }

    fn read8(&self, s: usize, zone: u64, slot: u32) -> u64 {
        // SAFETY: inside the region (zone < 4, slot < 512); the device
        // writes it only inside `rdd_device_step`, not running now.
        unsafe { (self.addr(s, zone, slot) as *const u64).read_unaligned() }
    }

    fn write8(&self, s: usize, zone: u64, slot: u32, v: u64) {
        // SAFETY: as in `read8`.
        unsafe { (self.addr(s, zone, slot) as *mut u64).write_unaligned(v) }
    }

    fn query(&self, s: usize) -> rdd_qp_attr {
        let mut a = rdd_qp_attr::default();
        // SAFETY: out-parameter is a local.
        ok(unsafe { rdd_qp_query(self.qp[s], &mut a) }, "query");
        a
    }

    fn doorbells(&self, s: usize) -> u64 {
        let mut n = 0;
        // SAFETY: out-parameter is a local.
        ok(unsafe { rdd_qp_doorbells(self.qp[s], &mut n) }, "doorbells");
        n
    }

    fn snapshot(&self, s: usize) -> (rdd_qp_attr, u64, rdd_qp_attr, u64) {
        (
            self.query(s),
            self.doorbells(s),
            self.query(1 - s),
            self.doorbells(1 - s),
        )
    }

    fn next_seq(&mut self) -> Option<u32> {
        let limit = if self.healing { MAX_SEQ } else { MAX_POST_SEQ };
        if self.seq >= limit {
            return None;
        }
        self.seq += 1;
        Some(self.seq)
    }

    // ---------------------------------------------------------------
    // Posting
    // ---------------------------------------------------------------

    /// The status a send on QP `s` must get, with `extra` sends already
    /// accepted by this call.
    fn expect_send(&self, s: usize, flags: u32, out: u32) -> rdd_status {
        if flags & STRAY != 0 {
            rdd_status::InvalidFlags
        } else if self.m[s].state == Some(State::Reset) {
            // ERROR takes posts (they are flushed), as verbs do
            // (`QpState::can_send`).
            rdd_status::InvalidQpState
        } else if out >= self.sq_cap {
            rdd_status::SqFull
        } else {
            rdd_status::Ok
        }
    }

    /// Operands of a send of `kind` from `s` with fault selector `fsel`.
    fn send_operands(
        &self,
        s: usize,
        kind: Kind,
        fsel: u8,
        slot: u32,
    ) -> (Fault, u64, u32, u32, u64, u32) {
        let peer = 1 - s;
        let (laddr, mut len, mut lkey) = (self.addr(s, 0, slot), 8u32, self.lkey[s]);
        let (mut raddr, mut rkey) = match kind {
            Kind::Write => (self.addr(peer, 1, slot), self.rkey[peer]),
            Kind::Read => (self.addr(peer, 3, slot), self.rkey[peer]),
            Kind::Send => (0, 0),
        };
        let end = self.base[peer] as u64 + MR_LEN as u64 - 4;
        let fault = match (fsel, kind) {
            (5, _) | (7, Kind::Send) => {
                lkey = self.bad_key;
                Fault::Local
            }
            (6, Kind::Write) | (7, Kind::Read) => {
                rkey = self.bad_key;
                Fault::Remote
            }
            (7, Kind::Write) | (6, Kind::Read) => {
                raddr = end;
                Fault::Remote
            }
            (6, Kind::Send) => {
                len = 16;
                Fault::Remote
            }
            _ => Fault::None,
        };
        (fault, laddr, len, lkey, raddr, rkey)
    }

    fn signaled(&mut self, s: usize, f: u8) -> bool {
        if f & 2 != 0 {
            let n = self.m[s].nth;
            self.m[s].nth += 1;
            self.every != 0 && n % self.every == self.every - 1
        } else {
            f & 1 != 0
        }
    }

    /// Records an accepted send.
    fn accepted(&mut self, s: usize, rec: SendRec) {
        // A WR made to fail puts its QP (and for a remote fault the peer)
        // in ERROR, so the peer's work towards it may fail; so may a SEND
        // that runs out of RNR retries.
        if rec.fault != Fault::None || (rec.kind == Kind::Send && self.rnr_retry != 7) {
            self.m[0].loose = true;
            self.m[1].loose = true;
        }
        self.m[s].sends.push_back(rec);
    }

    /// One per-opcode send call.
    fn post_one(&mut self, s: usize, kind: Kind, f: u8) {
        let Some(seq) = self.next_seq() else { return };
        let slot = seq % SLOTS;
        let signaled = self.signaled(s, f);
        let mut flags = if signaled { RDD_SEND_SIGNALED } else { 0 };
        if f & 4 != 0 {
            flags |= RDD_SEND_DEFER_DOORBELL;
        }
        if f & 8 != 0 {
            flags |= RDD_SEND_FENCE;
        }
        if f & 0x10 != 0 {
            flags |= STRAY;
        }
        let (fault, laddr, len, lkey, raddr, rkey) = self.send_operands(s, kind, f >> 5, slot);
        let id = wr_id(s, false, kind as u8, seq);
        if kind != Kind::Read {
            self.write8(s, 0, slot, stamp(s, kind, seq));
        }
        let want = self.expect_send(s, flags, self.query(s).send_outstanding);
        let before = self.snapshot(s);
        let qp = self.qp[s];
        // SAFETY: the addresses name this device's regions or run a little
        // past one (the device checks them and fails the WR).
        let st = unsafe {
            match kind {
                Kind::Write => rdd_qp_write(qp, id, laddr, len, lkey, raddr, rkey, flags),
                Kind::Read => rdd_qp_read(qp, id, laddr, len, lkey, raddr, rkey, flags),
                Kind::Send => rdd_qp_send(qp, id, laddr, len, lkey, flags),
            }
        };
        assert_eq!(st, want, "{kind:?} f={f:#x} on QP {s}");
        if st != rdd_status::Ok {
            assert_eq!(
                self.snapshot(s),
                before,
                "a refused {kind:?} changed the QPs"
            );
            return;
        }
        self.m[s].deferred = flags & RDD_SEND_DEFER_DOORBELL != 0;
        self.accepted(
            s,
            SendRec {
                wr_id: id,
                seq,
                kind,
                signaled,
                fault,
            },
        );
    }

    /// A list of sends through `rdd_qp_post_send`.
    fn post_list(&mut self, s: usize, r: &mut Bytes<'_>, n: usize) {
        let mut recs = Vec::new();
        let mut sges = Vec::new();
        let mut flagv = Vec::new();
        for _ in 0..n {
            let kind = [Kind::Write, Kind::Read, Kind::Send][(r.u8() % 3) as usize];
            let f = r.u8();
            let Some(seq) = self.next_seq() else { break };
            let slot = seq % SLOTS;
            let signaled = self.signaled(s, f);
            let mut flags = if signaled { RDD_SEND_SIGNALED } else { 0 };
            if f & 8 != 0 {
                flags |= RDD_SEND_FENCE;
            }
            if f & 0x10 != 0 {
                flags |= STRAY;
            }
            let (fault, laddr, len, lkey, raddr, rkey) = self.send_operands(s, kind, f >> 5, slot);
            if kind != Kind::Read {
                self.write8(s, 0, slot, stamp(s, kind, seq));
            }
            let rec = SendRec {
                wr_id: wr_id(s, false, kind as u8, seq),
                seq,
                kind,
                signaled,
                fault,
            };
            recs.push((rec, raddr, rkey));
            sges.push(rdd_sge {
                addr: laddr,
                length: len,
                lkey,
            });
            flagv.push(flags);
        }
        if recs.is_empty() {
            return;
        }
        let wrs: Vec<rdd_wr> = recs
            .iter()
            .zip(&sges)
            .zip(&flagv)
            .map(|(((rec, raddr, rkey), sge), &flags)| rdd_wr {
                wr_id: rec.wr_id,
                sg_list: sge,
                num_sge: 1,
                opcode: match rec.kind {
                    Kind::Write => RDD_WR_RDMA_WRITE,
                    Kind::Read => RDD_WR_RDMA_READ,
                    Kind::Send => RDD_WR_SEND,
                },
                flags,
                imm_data: 0,
                remote_addr: *raddr,
                rkey: *rkey,
                invalidate_rkey: 0,
                compare_add: 0,
                swap: 0,
            })
            .collect();
        // The first refused WR and its status, as predicted.
        let out = self.query(s).send_outstanding;
        let mut want = (rdd_status::Ok, usize::MAX);
        for (i, &fl) in flagv.iter().enumerate() {
            let st = self.expect_send(s, fl, out + i as u32);
            if st != rdd_status::Ok {
                want = (st, i);
                break;
            }
        }
        let before = self.snapshot(s);
        let mut bad = usize::MAX;
        // SAFETY: live WRs whose SGEs live in `sges`, naming this device's
        // regions or a little past one (checked by the device).
        let st = unsafe { rdd_qp_post_send(self.qp[s], wrs.as_ptr(), wrs.len(), &mut bad) };
        assert_eq!((st, bad), want, "post_send list on QP {s}");
        if want.1 == 0 {
            // Nothing posted; only the WRs deferred by earlier per-opcode
            // calls are rung (as documented in `rdd_qp_post_send`).
            let mut after = self.snapshot(s);
            assert_eq!(
                after.1,
                before.1 + self.m[s].deferred as u64,
                "doorbells of a refused list"
            );
            after.1 = before.1;
            assert_eq!(after, before, "a refused list changed the QPs");
        }
        self.m[s].deferred = false;
        let posted = want.1.min(recs.len());
        for &(rec, _, _) in &recs[..posted] {
            self.accepted(s, rec);
        }
    }

    fn post_recv(&mut self, s: usize, f: u8) {
        let Some(seq) = self.next_seq() else { return };
        let slot = seq % SLOTS;
        let bad = f >> 5 >= 5;
        let mut flags = 0;
        if f & 4 != 0 {
            flags |= RDD_SEND_DEFER_DOORBELL;
        }
        if f & 0x10 != 0 {
            flags |= STRAY;
        }
        let want = if flags & STRAY != 0 {
            rdd_status::InvalidFlags
        } else if self.m[s].state == Some(State::Reset) {
            rdd_status::InvalidQpState
        } else if self.m[s].recvs.len() as u32 >= self.rq_cap {
            rdd_status::RqFull
        } else {
            rdd_status::Ok
        };
        let id = wr_id(s, true, 0, seq);
        let lkey = if bad { self.bad_key } else { self.lkey[s] };
        let before = self.snapshot(s);
        // SAFETY: the address names this device's region (the key may be
        // bad: the device checks it).
        let st = unsafe { rdd_qp_recv(self.qp[s], id, self.addr(s, 2, slot), 8, lkey, flags) };
        assert_eq!(st, want, "recv f={f:#x} on QP {s}");
        if st != rdd_status::Ok {
            assert_eq!(self.snapshot(s), before, "a refused recv changed the QPs");
            return;
        }
        if bad {
            // It fails the peer's SEND into it and ends both QPs' work.
            self.m[0].loose = true;
            self.m[1].loose = true;
        }
        self.m[s].recvs.push_back(RecvRec {
            wr_id: id,
            seq,
            bad,
        });
    }

    fn ring(&mut self, s: usize) {
        let before = self.doorbells(s);
        // Guarded CQs: ringing is never refused.
        ok(rdd_qp_ring(self.qp[s]), "ring");
        let want = before + self.m[s].deferred as u64;
        assert_eq!(self.doorbells(s), want, "doorbells after rdd_qp_ring");
        self.m[s].deferred = false;
    }

    fn step(&mut self, n: usize) {
        let mut work = 0;
        for _ in 0..n {
            // SAFETY: out-parameter is a local.
            ok(unsafe { rdd_device_step(self.dev, &mut work) }, "step");
        }
    }

    fn close(self) {
        for s in 0..2 {
            ok(rdd_qp_destroy(self.qp[s]), "destroy qp");
            ok(rdd_cq_destroy(self.cq[s]), "destroy cq");
            ok(rdd_mr_free(self.mr[s]), "free mr");
        }
        ok(rdd_pd_free(self.pd), "free pd");
        ok(rdd_device_close(self.dev), "close");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let mut p = Pair::new(r.u8());
    let mut n = 0;
    while !r.is_empty() && n < MAX_OPS {
        n += 1;
        let op = r.u8();
        let s = ((op >> 4) & 1) as usize;
        let arg = op >> 5;
        match op & 15 {
            0 => p.post_one(s, Kind::Write, r.u8()),
            1 => p.post_one(s, Kind::Read, r.u8()),
            2 => p.post_one(s, Kind::Send, r.u8()),
            3 => p.post_recv(s, r.u8()),
            4 => p.post_list(s, &mut r, (arg % 4) as usize + 1),
            5 => p.ring(s),
            6 => p.step(arg as usize + 1),
            7 => p.poll_n(s, (r.u8() % 17) as u32),
            8 => p.poll_list(s, (r.u8() % 17) as usize + 1),
            9 => p.post_one(s, Kind::Write, 0xc1),
            10 => p.recover(s, false, 0),
            11 => p.recover(s, true, arg),
            12 => p.connect(s, arg),
            13 => p.heal(),
            14 => p.connect(s, arg | 4 | (arg & 4) << 1),
            _ => p.recover(s, true, arg | 4 | (arg & 4) << 1),
        }
        p.check_all();
    }
    p.heal();
    p.check_all();
    p.close();
});
