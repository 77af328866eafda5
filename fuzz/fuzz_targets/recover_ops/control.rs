//! `recover_ops`: the control path (`rdd_qp_connect`, `rdd_qp_recover`,
//! the heal of both QPs) and what the model checks of it.

use core::ffi::c_void;

use super::*;

/// Collects the completions `rdd_qp_recover` hands over.
///
/// # Safety
/// `ctx` is the `Vec<rdd_wc>` passed to `rdd_qp_recover`, `wc` a live
/// completion (the callback contract).
unsafe extern "C" fn collect(ctx: *mut c_void, wc: *const rdd_wc) {
    // SAFETY: the caller's contract above; the Vec has spare capacity, so
    // the push does not allocate (and cannot unwind).
    unsafe { (*ctx.cast::<Vec<rdd_wc>>()).push(*wc) };
}

impl Pair {
    /// status their check must give.
    pub(super) fn attrs(&self, s: usize, v: u8) -> (rdd_qp_info, rdd_connect_attr, rdd_status) {
        let mut info = rdd_qp_info::default();
        // SAFETY: out-parameter is a local.
        ok(
            unsafe { rdd_qp_query_info(self.qp[1 - s], &mut info) },
            "info",
        );
        let mut attr = rdd_connect_attr {
            access: ALL_ACCESS,
            rnr_retry: self.rnr_retry,
            retry_cnt: 1,
            traffic_class: 0,
            sl: 0,
        };
        let st = match v % 8 {
            4 => {
                attr.access |= 1 << 20;
                rdd_status::InvalidArgument
            }
            5 => {
                info.reserved = 1;
                rdd_status::InvalidArgument
            }
            6 => {
                attr.retry_cnt = 8;
                rdd_status::InvalidAttribute
            }
            7 => {
                if v & 8 != 0 {
                    info.qpn |= 1 << 24;
                } else {
                    attr.sl = 16;
                }
                rdd_status::InvalidAttribute
            }
            _ => rdd_status::Ok,
        };
        (info, attr, st)
    }

    pub(super) fn connect_call(&self, s: usize, v: u8) -> rdd_status {
        let (info, attr, _) = self.attrs(s, v);
        // SAFETY: live locals.
        unsafe { rdd_qp_connect(self.qp[s], &info, &attr) }
    }

    pub(super) fn connect(&mut self, s: usize, v: u8) {
        let (_, _, bad) = self.attrs(s, v);
        let want = if bad != rdd_status::Ok {
            bad
        } else if self.m[s].state != Some(State::Reset) {
            rdd_status::InvalidQpState
        } else {
            rdd_status::Ok
        };
        let before = self.snapshot(s);
        let st = self.connect_call(s, v);
        assert_eq!(st, want, "connect of QP {s}, variant {v}");
        if st != rdd_status::Ok {
            assert_eq!(
                self.snapshot(s),
                before,
                "a refused connect changed the QPs"
            );
            return;
        }
        self.m[s].state = Some(State::Rts);
        self.m[s].connected = true;
    }

    /// `rdd_qp_recover` on QP `s` (towards the peer if `peer`), attribute
    /// variant `v`: retried with device steps until it finishes.
    pub(super) fn recover(&mut self, s: usize, peer: bool, v: u8) {
        let (info, attr, bad) = self.attrs(s, v);
        let before = self.snapshot(s);
        let (pi, pa) = if peer {
            (
                &info as *const rdd_qp_info,
                &attr as *const rdd_connect_attr,
            )
        } else {
            (null(), null())
        };
        for _ in 0..RECOVER_TRIES {
            self.cb.clear();
            let mut rec = rdd_recovery {
                reported: u64::MAX,
                has_failure: u32::MAX,
                reserved: u32::MAX,
                failure: rdd_failed_wr::default(),
            };
            let ctx = (&mut self.cb as *mut Vec<rdd_wc>).cast::<c_void>();
            // SAFETY: `pi`/`pa` are NULL or live locals; `collect` is safe
            // to call with `ctx` (a Vec with room for every completion the
            // QP can have); `rec` is a live local.
            let st = unsafe { rdd_qp_recover(self.qp[s], pi, pa, 0, Some(collect), ctx, &mut rec) };
            if peer && bad != rdd_status::Ok {
                assert_eq!(st, bad, "recover of QP {s} with variant {v}");
                assert!(self.cb.is_empty(), "a refused recover drained");
                assert_eq!(
                    self.snapshot(s),
                    before,
                    "a refused recover changed the QPs"
                );
                return;
            }
            self.m[0].loose = true;
            self.m[1].loose = true;
            let wcs = std::mem::take(&mut self.cb);
            // The QP is in ERROR once the call ran.
            if self.m[s].state != Some(State::Error) {
                self.m[s].state = Some(State::Error);
            }
            for w in &wcs {
                self.observe(s, w, true);
            }
            self.cb = wcs;
            // The drain marker's doorbell covers deferred sends.
            self.m[s].deferred = false;
            if st == rdd_status::Timeout {
                self.check_draining(s);
                self.step(1);
                continue;
            }
            ok(st, "recover");
            assert_eq!(
                rec.reported,
                self.cb.len() as u64,
                "recover of QP {s}: reported"
            );
            let m = &self.m[s];
            assert_eq!(
                (rec.has_failure != 0).then_some(rec.failure.wr_id),
                m.first_failure,
                "recover of QP {s}: the first failed WR"
            );
            assert_eq!(rec.reserved, 0);
            self.finish_recovery(s, peer);
            return;
        }
        panic!("rdd_qp_recover of QP {s} did not finish in {RECOVER_TRIES} calls with steps");
    }

    /// A recover call timed out: the QP is in ERROR (still draining).
    pub(super) fn check_draining(&self, s: usize) {
        let a = self.query(s);
        assert_eq!(
            a.state, RDD_QP_STATE_ERROR,
            "QP {s} after a timed-out recover"
        );
        assert!(a.recv_outstanding as usize == self.m[s].recvs.len());
    }

    /// What a finished recovery leaves: nothing that had to be reported is
    /// unreported; the rest retired silently and so was executed.
    pub(super) fn finish_recovery(&mut self, s: usize, peer: bool) {
        assert!(
            self.m[s].recvs.is_empty(),
            "QP {s}: receives not flushed: {:?}",
            self.m[s].recvs
        );
        let left: Vec<SendRec> = self.m[s].sends.drain(..).collect();
        for e in &left {
            assert!(
                !e.signaled && e.fault == Fault::None && !self.m[s].sq_errored,
                "QP {s}: recovery left {e:?} unreported"
            );
            self.check_data(s, e, true);
        }
        let m = &mut self.m[s];
        m.errored = false;
        m.sq_errored = false;
        m.first_failure = None;
        m.state = Some(if peer { State::Rts } else { State::Reset });
        m.connected = peer;
        // The peer's work towards this QP may fail now, and the peer's
        // failure may fail this QP's work in turn.
        self.m[0].loose = true;
        self.m[1].loose = true;
        let a = self.query(s);
        assert_eq!(
            (a.send_outstanding, a.recv_outstanding),
            (0, 0),
            "QP {s} after recovery"
        );
    }

    /// Recovers both QPs towards each other, then a signaled WRITE each
    /// way must land.
    pub(super) fn heal(&mut self) {
        self.recover(0, true, 0);
        self.recover(1, true, 0);
        self.m[0].loose = false;
        self.m[1].loose = false;
        self.healing = true;
        for s in 0..2 {
            self.post_one(s, Kind::Write, 1);
            assert_eq!(self.m[s].sends.len(), 1, "heal: WRITE refused on QP {s}");
            self.step(2);
            self.poll_n(s, 16);
            assert!(
                self.m[s].sends.is_empty(),
                "heal: WRITE on QP {s} did not complete"
            );
            assert!(!self.m[s].errored, "heal: WRITE on QP {s} failed");
        }
        self.healing = false;
    }
}
