//! `submit_ops`: random sequences of the submission service's C calls
//! (`rdd_submit_*`, `src/ffi/submit/`) on the software device in step
//! mode, through the C ABI only, checked against a model of what each
//! call must do.
//!
//! One device per input: the service's QP (its send and receive CQ are
//! one CQ) connected to a peer QP, a source region and a target region,
//! 4096 bytes each, and an inline payload pool. At most one live service
//! at a time (the API does not stop a second one on the same QP, and the
//! two would take each other's completions); services are created,
//! settled and destroyed in sequence, and the QP can be connected late or
//! destroyed early (then `rdd_submit_flush` completes what is left).
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! cfg  u8   bit 0: connect the QPs now (else later, op 13); bits 1-3:
//!           max_send_wr [1, 2, 4, 8, 16, 32, 64, 128]; bits 4-5:
//!           max_inline_data [0, 8, 32, 64]
//! ops... until the input ends (at most MAX_OPS), op u8 % 16:
//!   0 create: mo u16 % 5000, mb u8 % 80 (max_outstanding, max_batch;
//!     above 4096 / 64 invalid), sel u8 (bit 0 flags != 0, bit 1 reserved
//!     != 0, bit 2 NULL config, bit 3 the peer's CQ, bit 4 NULL out)
//!   1 register
//!   2 unregister: pick u8 (a registered submitter, pick % count)
//!   3 post: pick u8, asel u8 (% 8: 0 NULL array, 1 misaligned array,
//!     2 NULL out_bad_index, else a good call), n u8 % 9, then n
//!     descriptors: dsel u8 (bit 0 bad lkey, 1 bad rkey, 2 inline,
//!     3 SIGNALED, 4 FENCE), inv u8 % 16 (10 opcode SEND, 11 a stray flag,
//!     12 reserved != 0, 13 length 2^31 + x, 14 inline NULL, 15 inline
//!     one byte too long; else valid), len u8 % 72, loff u16 % 4608,
//!     roff u16 % 4608
//!   4 burst: pick u8, n u16 % 1100 copies of one good descriptor (dsel
//!     bits 2-4 only, len u8 % 72, loff, roff), one call
//!   5 reap: pick u8, n u8 % 40, sel u8 (% 8: 0 NULL out, 1 misaligned
//!     out, 2 NULL out_count, else good)
//!   6 drain   7 step (u8 % 4 + 1 device steps)   8 complete
//!   9 pump (u8 % 8 + 1 rounds of drain, step, complete)
//!   10 settle: pump until nothing is in flight (at most 512 rounds), reap
//!      all, unregister all, destroy the service
//!   11 destroy the service
//!   12 a call on a bad handle: which u8 % 6 (NULL, a destroyed service,
//!      a destroyed submitter, forged, the QP's handle, the live handle of
//!      the other kind), call u8 % 10
//!   13 connect (if not yet)   14 destroy the QP   15 flush
//! ```
//!
//! Checked:
//! - every call's status is the one the model predicts (including the
//!   order of the checks in each call, e.g. a bad config before a bad QP);
//!   refused calls write no output (sentinels stay) and change no counter
//!   but the refusal counters (`rdd_submit_stats`), and `*out_bad_index`
//!   is written exactly when documented, with the index of the first
//!   descriptor not queued;
//! - a submitter's id is the lowest free one, and its in-flight count
//!   (`rdd_submit_query`) is what the model has in flight;
//! - every accepted descriptor is reaped exactly once, by its submitter,
//!   in the order it submitted them; a reap writes no entry past its count;
//! - in the order the service posts them (the global submission order),
//!   the completion statuses are: successes, at most one device error (at
//!   a descriptor the device must refuse), then flushes; a descriptor the
//!   device must refuse never succeeds;
//! - the counters agree with the model at every step (`submitted`,
//!   `reaped`, `submitted == drained + queued`, `completed >= reaped`),
//!   and at the end (a few more rounds of pumping, then the QP destroyed
//!   and the rest flushed) everything submitted was completed and reaped;
//! - no panic, leak or undefined behaviour (the build runs under ASan).
#![no_main]
#![feature(cfg_sanitize)]

use std::collections::VecDeque;
use std::ptr::{null, null_mut};

use libfuzzer_sys::fuzz_target;
use rdma_direct::ffi::mlx5::{RDD_WC_SUCCESS, RDD_WC_WR_FLUSH_ERR};
use rdma_direct::ffi::object::*;
use rdma_direct::ffi::status::rdd_status;
use rdma_direct::ffi::submit::*;
use rdma_direct_fuzz::{pattern, Bytes};

#[path = "common/big_alloc.rs"]
mod big_alloc;
#[path = "submit_ops/env.rs"]
mod env;
use env::{build, ok, Built, Env};

/// Large blocks (the service's 1.3 MiB) reused across inputs instead of
/// mapped afresh by ASan each time (`common/big_alloc.rs`).
#[global_allocator]
static ALLOC: big_alloc::BigCache = big_alloc::BigCache::new();

/// Upper bound on operations per input.
const MAX_OPS: usize = 96;
/// Bytes of each registered region.
const MR_LEN: u64 = 4096;
/// Offsets range a little past the region (the device fails those WRs).
const OFF_RANGE: u16 = 4608;
/// Inline payloads point into this pool (offsets below 2048).
const POOL: usize = 4096;
/// Rounds of the settle pump at most.
const PUMP_ROUNDS: usize = 512;
/// Rounds of the pump at the end of an input before the QP is destroyed
/// and the rest flushed (device work is the slow part of an input).
const FINAL_ROUNDS: usize = 16;
/// An `out_bad_index` / `out_count` value no call writes.
const UNSET: usize = usize::MAX - 7;

/// A registered submitter in the model.
struct Sub {
    h: *mut rdd_submitter,
    id: u32,
    /// Global sequence numbers of its descriptors in flight, oldest first
    /// (a descriptor's `wr_id` is its sequence number).
    fifo: VecDeque<u64>,
}

/// What the model knows about one accepted descriptor.
#[derive(Clone, Copy)]
struct Done {
    /// The device must refuse it (a bad key, or out of its region).
    bad: bool,
    /// The reaped status (`None`: not reaped yet).
    status: Option<u32>,
}

fn stats(svc: *mut rdd_submit_service) -> rdd_submit_counters {
    let mut c = rdd_submit_counters::default();
    // SAFETY: out-parameter is a local.
    ok(unsafe { rdd_submit_stats(svc, &mut c) }, "stats");
    c
}

/// A handle value that names nothing (never a live handle).
const FORGED: usize = 0x1234_5678_9abc_def5;

/// The model: the live service and its submitters, every accepted
/// descriptor, the handles that were destroyed.
struct Model {
    e: Env,
    svc: *mut rdd_submit_service,
    subs: Vec<Sub>,
    descs: Vec<Done>,
    reaped: u64,
    /// Descriptors accepted and reaped before the live service was
    /// created (its counters start at 0).
    base: (u64, u64),
    /// Refused posts (SQ_FULL) of the live service.
    refusals: u64,
    dead_svc: *mut rdd_submit_service,
    dead_sub: *mut rdd_submitter,
    pool: Vec<u8>,
}

impl Model {
    fn in_flight(&self) -> usize {
        self.subs.iter().map(|s| s.fifo.len()).sum()
    }

    fn pick(&self, p: u8) -> Option<usize> {
        if self.subs.is_empty() {
            None
        } else {
            Some(p as usize % self.subs.len())
        }
    }

    /// The counters and every submitter's query agree with the model.
    fn check(&self) {
        if self.svc.is_null() {
            return;
        }
        let c = stats(self.svc);
        assert_eq!(
            c.submitted,
            self.descs.len() as u64 - self.base.0,
            "submitted"
        );
        assert_eq!(c.reaped, self.reaped - self.base.1, "reaped");
        assert_eq!(c.submitted, c.drained + c.queued, "drained + queued");
        assert!(
            c.completed >= c.reaped && c.completed <= c.submitted,
            "completed {c:?}"
        );
        assert_eq!(
            c.refused_ring_full + c.refused_no_credit,
            self.refusals,
            "refusals"
        );
        for s in &self.subs {
            let (mut id, mut n) = (u32::MAX, UNSET);
            // SAFETY: out-parameters are locals.
            ok(unsafe { rdd_submit_query(s.h, &mut id, &mut n) }, "query");
            assert_eq!((id, n), (s.id, s.fifo.len()), "query");
        }
    }

    fn create(&mut self, mo: u16, mb: u8, sel: u8) {
        let cfg = rdd_submit_config {
            max_outstanding: (mo % 5000) as u32,
            max_batch: (mb % 80) as u32,
            flags: (sel & 1) as u32,
            reserved: ((sel >> 1) & 1) as u32,
        };
        let null_cfg = sel & 4 != 0;
        let cq = self.e.cq[((sel >> 3) & 1) as usize];
        let null_out = sel & 0x10 != 0;
        let bad_cfg = cfg.flags != 0
            || cfg.reserved != 0
            || cfg.max_outstanding > RDD_SUBMIT_MAX_OUTSTANDING
            || cfg.max_batch > RDD_SUBMIT_MAX_BATCH;
        let want = if null_out {
            rdd_status::NullParameter
        } else if !null_cfg && bad_cfg {
            rdd_status::InvalidArgument
        } else if self.e.qp.is_null() {
            rdd_status::InvalidHandle
        } else if cq != self.e.cq[0] {
            rdd_status::InvalidArgument
        } else {
            rdd_status::Ok
        };
        if want == rdd_status::Ok && !self.svc.is_null() {
            return; // one live service per QP
        }
        let sentinel = FORGED as *mut rdd_submit_service;
        let mut out = sentinel;
        let out_p = if null_out { null_mut() } else { &mut out };
        let cfg_p = if null_cfg { null() } else { &cfg };
        // SAFETY: `cfg_p` is NULL or a live local; `out_p` NULL or a local.
        let s = unsafe { rdd_submit_create(self.e.qp_handle, cq, cfg_p, out_p) };
        assert_eq!(s, want, "create {cfg:?} sel {sel:#x}");
        if s != rdd_status::Ok {
            assert_eq!(out, sentinel, "create wrote its output on {s:?}");
            return;
        }
        self.svc = out;
        self.base = (self.descs.len() as u64, self.reaped);
        self.refusals = 0;
        let c = stats(self.svc);
        assert_eq!(c, rdd_submit_counters::default(), "fresh counters");
    }

    fn register(&mut self, sel: u8) {
        if self.svc.is_null() {
            return;
        }
        let sentinel = FORGED as *mut rdd_submitter;
        let mut out = sentinel;
        let null_out = sel & 1 != 0;
        let out_p = if null_out { null_mut() } else { &mut out };
        // SAFETY: `out_p` is NULL or a local.
        let s = unsafe { rdd_submit_register(self.svc, out_p) };
        let want = if null_out {
            rdd_status::NullParameter
        } else if self.subs.len() >= RDD_SUBMIT_MAX_SUBMITTERS {
            rdd_status::ResourceExhausted
        } else {
            rdd_status::Ok
        };
        assert_eq!(s, want, "register");
        if s != rdd_status::Ok {
            assert_eq!(out, sentinel, "register wrote its output on {s:?}");
            return;
        }
        // The lowest free id.
        let id = (0u32..)
            .find(|i| self.subs.iter().all(|s| s.id != *i))
            .unwrap_or(0);
        self.subs.push(Sub {
            h: out,
            id,
            fifo: VecDeque::new(),
        });
    }

    fn unregister(&mut self, p: u8) {
        let Some(i) = self.pick(p) else { return };
        let s = rdd_submit_unregister(self.subs[i].h);
        if self.subs[i].fifo.is_empty() {
            assert_eq!(s, rdd_status::Ok, "unregister");
            self.dead_sub = self.subs.remove(i).h;
        } else {
            assert_eq!(s, rdd_status::ResourceBusy, "unregister in flight");
        }
    }

    /// Posts `list` from submitter `i` (`asel` picks a bad array or
    /// out-parameter) and checks the outcome against the model.
    fn post(&mut self, i: usize, list: &mut [Built], asel: u8) {
        let before = stats(self.svc);
        let h = self.subs[i].h;
        let n = list.len();
        // Global sequence numbers as wr_ids.
        for (k, b) in list.iter_mut().enumerate() {
            b.d.wr_id = self.descs.len() as u64 + k as u64;
        }
        let descs: Vec<rdd_submit_desc> = list.iter().map(|b| b.d).collect();
        let mut raw = vec![0u8; 16 + n * 48];
        let mut bad = UNSET;
        let (mut no_credit, mut ring_full) = (0, 0);
        let (s, want, written) = match asel % 8 {
            0 => {
                // SAFETY: NULL array, refused before it is read.
                let s = unsafe { rdd_submit_post(h, null(), n, &mut bad) };
                (s, rdd_status::NullParameter, None)
            }
            1 => {
                let p = raw.as_mut_ptr().wrapping_add(1).cast::<rdd_submit_desc>();
                // SAFETY: a misaligned array, refused before it is read.
                let s = unsafe { rdd_submit_post(h, p, n, &mut bad) };
                (s, rdd_status::InvalidArgument, Some(0))
            }
            2 => {
                // SAFETY: NULL out-parameter, refused first.
                let s = unsafe { rdd_submit_post(h, descs.as_ptr(), n, null_mut()) };
                (s, rdd_status::NullParameter, None)
            }
            3 => {
                // SAFETY: an oversized count, refused before anything is read.
                let s = unsafe { rdd_submit_post(h, descs.as_ptr(), usize::MAX / 8, &mut bad) };
                (s, rdd_status::InvalidArgument, Some(0))
            }
            _ => {
                // What the model expects: stop at the first refusal.
                let fifo = self.subs[i].fifo.len();
                let mut want = (rdd_status::Ok, None);
                for (k, b) in list.iter().enumerate() {
                    if let Some(r) = b.refuse {
                        want = (r, Some(k));
                        break;
                    }
                    // The credit is checked before the ring.
                    if fifo + k >= RDD_SUBMIT_COMPLETION_RING_SIZE {
                        no_credit = 1;
                    } else if before.queued as usize + k >= RDD_SUBMIT_RING_SIZE {
                        ring_full = 1;
                    } else {
                        continue;
                    }
                    want = (rdd_status::SqFull, Some(k));
                    break;
                }
                // SAFETY: `n` live descriptors; inline ones point into the
                // pool, which outlives every completion.
                let s = unsafe { rdd_submit_post(h, descs.as_ptr(), n, &mut bad) };
                (s, want.0, want.1)
            }
        };
        assert_eq!(s, want, "post of {n}, asel {asel}");
        match written {
            Some(k) => assert_eq!(bad, k, "out_bad_index on {s:?}"),
            None => assert_eq!(bad, UNSET, "out_bad_index written on {s:?}"),
        }
        let queued = if s == rdd_status::Ok {
            n
        } else if matches!(asel % 8, 0..=3) {
            0
        } else {
            bad
        };
        for b in &list[..queued] {
            self.subs[i].fifo.push_back(self.descs.len() as u64);
            self.descs.push(Done {
                bad: b.bad,
                status: None,
            });
        }
        if s == rdd_status::SqFull {
            self.refusals += 1;
        }
        // Nothing else changed.
        let after = stats(self.svc);
        let expect = rdd_submit_counters {
            submitted: before.submitted + queued as u64,
            queued: before.queued + queued as u64,
            refused_ring_full: before.refused_ring_full + ring_full,
            refused_no_credit: before.refused_no_credit + no_credit,
            ..before
        };
        assert_eq!(after, expect, "counters after post");
    }

    /// Reaps up to `n` completions of submitter `i` (`sel` picks bad
    /// arguments); returns how many.
    fn reap(&mut self, i: usize, n: usize, sel: u8) -> usize {
        let h = self.subs[i].h;
        let blank = rdd_submit_completion {
            wr_id: u64::MAX,
            status: u32::MAX,
            vendor_err: u32::MAX,
        };
        let mut out = vec![blank; n + 1];
        // Only the misaligned case needs it (checked untouched below).
        let mut raw = vec![0u8; if sel % 8 == 1 { 16 * (n + 2) } else { 0 }];
        let mut count = UNSET;
        let (s, want) = match sel % 8 {
            0 => {
                // SAFETY: NULL array, refused first.
                let s = unsafe { rdd_submit_reap(h, null_mut(), n, &mut count) };
                (s, rdd_status::NullParameter)
            }
            1 => {
                let p = raw
                    .as_mut_ptr()
                    .wrapping_add(4)
                    .cast::<rdd_submit_completion>();
                // (`raw` has 16 * (n + 2) bytes: the misaligned array fits.)
                // SAFETY: misaligned, refused before anything is written.
                let s = unsafe { rdd_submit_reap(h, p, n, &mut count) };
                (s, rdd_status::InvalidArgument)
            }
            2 => {
                // SAFETY: NULL out-parameter, refused first.
                let s = unsafe { rdd_submit_reap(h, out.as_mut_ptr(), n, null_mut()) };
                (s, rdd_status::NullParameter)
            }
            3 => {
                // SAFETY: an oversized count, refused before anything is
                // written.
                let s = unsafe { rdd_submit_reap(h, out.as_mut_ptr(), usize::MAX / 8, &mut count) };
                (s, rdd_status::InvalidArgument)
            }
            _ => {
                // SAFETY: `out` has room for `n` (plus a guard entry).
                let s = unsafe { rdd_submit_reap(h, out.as_mut_ptr(), n, &mut count) };
                (s, rdd_status::Ok)
            }
        };
        assert_eq!(s, want, "reap sel {sel}");
        assert!(raw.iter().all(|&b| b == 0), "reap wrote a refused array");
        if s != rdd_status::Ok {
            assert_eq!(count, UNSET, "reap wrote out_count on {s:?}");
            assert!(out.iter().all(|c| *c == blank), "reap wrote out on {s:?}");
            return 0;
        }
        assert!(count <= n, "reap count {count} > {n}");
        assert!(
            out[count..].iter().all(|c| *c == blank),
            "reap wrote past its count"
        );
        let sub = &mut self.subs[i];
        assert!(count <= sub.fifo.len(), "reaped more than in flight");
        for c in &out[..count] {
            let seq = sub.fifo.pop_front().unwrap_or(u64::MAX);
            assert_eq!(c.wr_id, seq, "submitter {} order", sub.id);
            let d = &mut self.descs[seq as usize];
            assert!(d.status.is_none(), "completed twice");
            d.status = Some(c.status);
            if c.status == RDD_WC_SUCCESS {
                assert_eq!(c.vendor_err, 0, "vendor_err of {c:?}");
            }
        }
        self.reaped += count as u64;
        count
    }

    /// Reaps every submitter until nothing is left to reap.
    fn reap_all(&mut self) {
        for i in 0..self.subs.len() {
            while !self.subs[i].fifo.is_empty() && self.reap(i, 64, 7) > 0 {}
        }
    }

    fn drain(&mut self) {
        if self.svc.is_null() {
            return;
        }
        let mut posted = UNSET;
        // SAFETY: out-parameter is a local.
        let s = unsafe { rdd_submit_drain(self.svc, &mut posted) };
        let allowed = if self.e.qp.is_null() {
            rdd_status::NoSuchObject
        } else if !self.e.connected {
            rdd_status::InvalidQpState
        } else {
            rdd_status::Ok
        };
        assert!(s == rdd_status::Ok || s == allowed, "drain: {s:?}");
        if s == rdd_status::Ok {
            assert!(
                posted <= RDD_SUBMIT_MAX_BATCH as usize,
                "drain posted {posted}"
            );
        } else {
            assert_eq!(posted, UNSET, "drain wrote out_posted on {s:?}");
        }
    }

    fn complete(&mut self) {
        if self.svc.is_null() {
            return;
        }
        let mut n = UNSET;
        // SAFETY: out-parameter is a local.
        let s = unsafe { rdd_submit_complete(self.svc, &mut n) };
        if self.e.qp.is_null() {
            assert_eq!(
                (s, n),
                (rdd_status::NoSuchObject, UNSET),
                "complete, QP gone"
            );
        } else {
            assert_eq!(s, rdd_status::Ok, "complete");
            assert!(n <= self.in_flight(), "completed {n}");
        }
    }

    fn flush(&mut self) {
        if self.svc.is_null() {
            return;
        }
        let mut n = UNSET;
        // SAFETY: out-parameter is a local.
        let s = unsafe { rdd_submit_flush(self.svc, &mut n) };
        if !self.e.qp.is_null() {
            assert_eq!((s, n), (rdd_status::ResourceBusy, UNSET), "flush, QP alive");
            return;
        }
        assert_eq!(s, rdd_status::Ok, "flush");
        let c = stats(self.svc);
        assert_eq!(c.completed, c.submitted, "flush left work: {c:?}");
        assert_eq!((c.queued, c.held), (0, 0), "flush left work: {c:?}");
    }

    fn pump(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.drain();
            self.e.step(1);
            self.complete();
        }
    }

    /// Completes and reaps everything it can (bounded), then unregisters
    /// every submitter and destroys the service, when nothing is left in
    /// flight.
    fn settle(&mut self) {
        if self.svc.is_null() {
            return;
        }
        if self.e.qp.is_null() {
            self.flush();
        }
        let mut rounds = 0;
        while self.in_flight() > 0 && self.e.connected && rounds < PUMP_ROUNDS {
            rounds += 1;
            self.pump(1);
            self.reap_all();
            if self.e.qp.is_null() {
                break;
            }
        }
        self.reap_all();
        if self.in_flight() > 0 {
            return;
        }
        while !self.subs.is_empty() {
            self.unregister(0);
        }
        self.destroy();
    }

    fn destroy(&mut self) {
        if self.svc.is_null() {
            return;
        }
        let s = rdd_submit_destroy(self.svc);
        if self.subs.is_empty() {
            assert_eq!(s, rdd_status::Ok, "destroy");
            self.dead_svc = self.svc;
            self.svc = null_mut();
        } else {
            assert_eq!(s, rdd_status::ResourceBusy, "destroy with submitters");
        }
    }

    fn kill_qp(&mut self) {
        if self.e.qp.is_null() {
            return;
        }
        ok(rdd_qp_destroy(self.e.qp), "destroy qp");
        self.e.qp = null_mut();
    }

    /// One call (`call`) on a handle that is not a live one of its kind.
    fn bad_handle(&mut self, which: u8, call: u8) {
        let svc_call = matches!(call % 10, 0 | 5..=9);
        let h: usize = match which % 6 {
            0 => 0,
            1 if !self.dead_svc.is_null() => self.dead_svc as usize,
            2 if !self.dead_sub.is_null() => self.dead_sub as usize,
            3 => FORGED,
            4 => self.e.qp_handle as usize,
            5 if svc_call && !self.subs.is_empty() => self.subs[0].h as usize,
            5 if !svc_call && !self.svc.is_null() => self.svc as usize,
            _ => return,
        };
        let want = if h == 0 {
            rdd_status::NullParameter
        } else {
            rdd_status::InvalidHandle
        };
        let (svc, sub) = (h as *mut rdd_submit_service, h as *mut rdd_submitter);
        let mut n = UNSET;
        let mut id = u32::MAX;
        let mut p = FORGED as *mut rdd_submitter;
        let mut c = rdd_submit_counters {
            submitted: 7,
            ..Default::default()
        };
        let d = [rdd_submit_desc::default()];
        let mut out = [rdd_submit_completion::default(); 2];
        // SAFETY: every pointer is a live local; the handle is never
        // dereferenced by a call that refuses it.
        let s = unsafe {
            match call % 10 {
                0 => rdd_submit_register(svc, &mut p),
                1 => rdd_submit_unregister(sub),
                2 => rdd_submit_post(sub, d.as_ptr(), 1, &mut n),
                3 => rdd_submit_reap(sub, out.as_mut_ptr(), 2, &mut n),
                4 => rdd_submit_query(sub, &mut id, &mut n),
                5 => rdd_submit_drain(svc, &mut n),
                6 => rdd_submit_complete(svc, &mut n),
                7 => rdd_submit_flush(svc, &mut n),
                8 => rdd_submit_stats(svc, &mut c),
                _ => rdd_submit_destroy(svc),
            }
        };
        assert_eq!(s, want, "call {} on bad handle {which}", call % 10);
        assert_eq!(
            (n, id, p as usize),
            (UNSET, u32::MAX, FORGED),
            "output written"
        );
        assert_eq!(c.submitted, 7, "stats written");
        assert!(out.iter().all(|c| *c == rdd_submit_completion::default()));
    }

    /// The end: completes and reaps everything (destroying the QP and
    /// flushing if the device cannot finish it), tears the service down,
    /// and checks every completion.
    fn finish(mut self) {
        if !self.svc.is_null() {
            for _ in 0..FINAL_ROUNDS {
                if self.in_flight() == 0 || !self.e.connected || self.e.qp.is_null() {
                    break;
                }
                self.pump(1);
                self.reap_all();
            }
            self.reap_all();
            if self.in_flight() == 0 {
                while !self.subs.is_empty() {
                    self.unregister(0);
                }
                self.destroy();
            }
            if !self.svc.is_null() {
                self.kill_qp();
                self.flush();
                self.reap_all();
                assert_eq!(self.in_flight(), 0, "work left after flush");
                while !self.subs.is_empty() {
                    self.unregister(0);
                }
                self.destroy();
            }
        }
        assert!(self.svc.is_null());
        // Successes, at most one device error, then flushes, in the order
        // the service posted them.
        let mut phase = 0;
        for (g, d) in self.descs.iter().enumerate() {
            let st = d
                .status
                .unwrap_or_else(|| panic!("descriptor {g} never completed"));
            match (phase, st) {
                (0, RDD_WC_SUCCESS) => assert!(!d.bad, "descriptor {g} must fail"),
                (_, RDD_WC_WR_FLUSH_ERR) => phase = 2,
                (0, _) => {
                    assert!(d.bad, "descriptor {g} failed with {st}");
                    phase = 2;
                }
                _ => panic!("descriptor {g}: status {st} after an error"),
            }
        }
        self.e.close();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let cfg = r.u8();
    let mut pool = vec![0u8; POOL];
    pattern::fill(&mut pool, 9);
    let mut m = Model {
        e: Env::new(cfg),
        svc: null_mut(),
        subs: Vec::new(),
        descs: Vec::new(),
        reaped: 0,
        base: (0, 0),
        refusals: 0,
        dead_svc: null_mut(),
        dead_sub: null_mut(),
        pool,
    };
    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        match r.u8() % 16 {
            0 => {
                let (mo, mb, sel) = (r.u16(), r.u8(), r.u8());
                m.create(mo, mb, sel);
            }
            1 => m.register(r.u8()),
            2 => m.unregister(r.u8()),
            3 => {
                let (p, asel, n) = (r.u8(), r.u8(), r.u8() % 9);
                let mut list: Vec<Built> = (0..n)
                    .map(|_| {
                        let (dsel, inv, len) = (r.u8(), r.u8(), r.u8());
                        let (loff, roff) = (r.u16(), r.u16());
                        build(&m.e, &m.pool, dsel, inv, len, loff, roff)
                    })
                    .collect();
                if let Some(i) = m.pick(p) {
                    m.post(i, &mut list, asel);
                }
            }
            4 => {
                let (p, n) = (r.u8(), r.u16() % 1100);
                let (dsel, len, loff, roff) = (r.u8() & 0x1c, r.u8(), r.u16(), r.u16());
                let one = build(&m.e, &m.pool, dsel, 0, len, loff, roff);
                let mut list: Vec<Built> = (0..n)
                    .map(|_| Built {
                        d: one.d,
                        refuse: None,
                        bad: one.bad,
                    })
                    .collect();
                if let Some(i) = m.pick(p) {
                    m.post(i, &mut list, 7);
                }
            }
            5 => {
                let (p, n, sel) = (r.u8(), r.u8() % 40, r.u8());
                if let Some(i) = m.pick(p) {
                    m.reap(i, n as usize, sel);
                }
            }
            6 => m.drain(),
            7 => {
                let n = r.u8() % 4 + 1;
                m.e.step(n);
            }
            8 => m.complete(),
            9 => {
                let n = r.u8() % 8 + 1;
                m.pump(n as usize);
            }
            10 => m.settle(),
            11 => m.destroy(),
            12 => {
                let (which, call) = (r.u8(), r.u8());
                m.bad_handle(which, call);
            }
            13 => m.e.connect(),
            14 => m.kill_qp(),
            _ => m.flush(),
        }
        m.check();
    }
    m.finish();
});
