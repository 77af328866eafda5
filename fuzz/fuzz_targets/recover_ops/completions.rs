//! `recover_ops`: what the model checks of completions (polled or handed
//! to the recover callback) and of `rdd_qp_query`.

use super::*;

impl Pair {
    /// Whether the model's view of QP `s` agrees with `rdd_qp_query`.
    pub(super) fn check(&self, s: usize) {
        let m = &self.m[s];
        let a = self.query(s);
        let state = match m.state.expect("state") {
            State::Reset => RDD_QP_STATE_RESET,
            State::Rts => RDD_QP_STATE_RTS,
            State::Error => RDD_QP_STATE_ERROR,
        };
        assert_eq!(a.state, state, "state of QP {s}: {a:?}");
        assert_eq!(a.connected, m.connected as u32, "connected of QP {s}");
        assert_eq!(
            a.recv_outstanding as usize,
            m.recvs.len(),
            "receives outstanding on QP {s}"
        );
        // Everything from the first WR that must still be reported on is
        // outstanding; the model may not have seen silent retirements.
        let must = if m.sq_errored {
            m.sends.len()
        } else {
            m.sends
                .iter()
                .position(|e| e.signaled || e.fault != Fault::None)
                .map_or(0, |i| m.sends.len() - i)
        };
        let out = a.send_outstanding as usize;
        assert!(
            must <= out && out <= m.sends.len(),
            "sends outstanding on QP {s}: {out}, model {must}..={}",
            m.sends.len()
        );
        let phase = if a.state != RDD_QP_STATE_ERROR {
            RDD_QP_RECOVERY_NONE
        } else if a.send_outstanding + a.recv_outstanding != 0 {
            RDD_QP_RECOVERY_DRAINING
        } else {
            RDD_QP_RECOVERY_DRAINED
        };
        assert_eq!(a.recovery, phase, "recovery phase of QP {s}");
    }

    pub(super) fn check_all(&self) {
        self.check(0);
        self.check(1);
    }

    /// A WRITE or READ whose data must have been moved (`done`) or not.
    pub(super) fn check_data(&self, s: usize, e: &SendRec, done: bool) {
        let slot = e.seq % SLOTS;
        let peer = 1 - s;
        match (e.kind, e.fault) {
            (Kind::Write, Fault::None) => {
                let got = self.read8(peer, 1, slot);
                let want = if done {
                    stamp(s, Kind::Write, e.seq)
                } else {
                    0
                };
                assert_eq!(got, want, "WRITE {e:?} (done {done}) landed {got:#x}");
            }
            (Kind::Read, Fault::None) => {
                let got = self.read8(s, 0, slot);
                let want = if done { self.read8(peer, 3, slot) } else { 0 };
                assert_eq!(got, want, "READ {e:?} (done {done}) read {got:#x}");
            }
            (Kind::Write, _) => {
                assert_eq!(self.read8(peer, 1, slot), 0, "failed WRITE {e:?} landed");
            }
            (Kind::Read, _) => {
                assert_eq!(self.read8(s, 0, slot), 0, "failed READ {e:?} wrote");
            }
            (Kind::Send, _) => {}
        }
    }

    /// The first error (or a later one) of QP `s`, for a WR made to fail
    /// (`bad`) or not.
    pub(super) fn error(
        &mut self,
        s: usize,
        id: u64,
        bad: bool,
        send: bool,
        status: u32,
        in_recover: bool,
    ) {
        let rnr = self.rnr_retry != 7;
        let m = &mut self.m[s];
        if m.errored {
            assert_eq!(
                status, RDD_WC_WR_FLUSH_ERR,
                "a second error on QP {s}: {id:#x}"
            );
            return;
        }
        if status == RDD_WC_WR_FLUSH_ERR {
            assert!(
                in_recover || m.loose,
                "QP {s}: {id:#x} flushed with no error before it"
            );
        } else {
            let rnr_ok = rnr && send && status == RDD_WC_RNR_RETRY_EXC_ERR;
            assert!(
                bad || m.loose || rnr_ok,
                "QP {s}: {id:#x} failed ({status}) and was not made to"
            );
            m.first_failure = Some(id);
        }
        m.errored = true;
        m.state = Some(State::Error);
    }

    /// One completion of QP `s`.
    pub(super) fn observe(&mut self, s: usize, wc: &rdd_wc, in_recover: bool) {
        assert_eq!(
            wc.qp_num, self.qpn[s],
            "completion {wc:?} on the CQ of QP {s}"
        );
        let id = wc.wr_id;
        if (id >> 63) as usize != s {
            panic!("QP {s} reported {id:#x}, a WR of the other QP");
        }
        if id >> 62 & 1 != 0 {
            let Some(front) = self.m[s].recvs.pop_front() else {
                panic!("QP {s} reported receive {id:#x}: none outstanding");
            };
            assert_eq!(front.wr_id, id, "QP {s}: receives out of order or twice");
            if wc.status == RDD_WC_SUCCESS {
                assert!(
                    !self.m[s].errored && !front.bad,
                    "receive {front:?} succeeded"
                );
                assert_eq!(wc.byte_len, 8, "receive {front:?}");
                let got = self.read8(s, 2, front.seq % SLOTS);
                assert_eq!(
                    got >> 40,
                    0xa5c3 << 8 | ((1 - s) as u64) << 4 | Kind::Send as u64,
                    "receive {front:?} holds {got:#x}"
                );
            } else {
                self.error(s, id, front.bad, false, wc.status, in_recover);
            }
            return;
        }
        let Some(i) = self.m[s].sends.iter().position(|e| e.wr_id == id) else {
            panic!("QP {s} reported send {id:#x}: not outstanding (unknown or twice)");
        };
        let skipped: Vec<SendRec> = self.m[s].sends.drain(..i).collect();
        let e = self.m[s].sends.pop_front().expect("found");
        for k in &skipped {
            assert!(
                !k.signaled && k.fault == Fault::None && !self.m[s].sq_errored,
                "QP {s}: {k:?} retired without a completion (before {e:?})"
            );
            self.check_data(s, k, true);
        }
        if wc.status == RDD_WC_SUCCESS {
            assert!(e.signaled, "an unsignaled success was reported: {e:?}");
            assert!(
                e.fault == Fault::None && !self.m[s].errored,
                "{e:?} succeeded"
            );
            self.check_data(s, &e, true);
        } else {
            self.error(
                s,
                id,
                e.fault != Fault::None,
                e.kind == Kind::Send,
                wc.status,
                in_recover,
            );
            self.m[s].sq_errored = true;
            self.check_data(s, &e, false);
        }
    }

    pub(super) fn poll_n(&mut self, s: usize, n: u32) {
        let mut wc = [rdd_wc::default(); 16];
        // SAFETY: a live array of 16 >= n entries.
        let got = unsafe { rdd_cq_poll_n(self.cq[s], wc.as_mut_ptr(), n) };
        assert!(got >= 0 && got as u32 <= n, "rdd_cq_poll_n returned {got}");
        for w in &wc[..got as usize] {
            self.observe(s, w, false);
        }
    }

    pub(super) fn poll_list(&mut self, s: usize, n: usize) {
        let mut wc = [rdd_wc::default(); 17];
        let mut cnt = usize::MAX;
        // SAFETY: live array of 17 >= n entries, one live handle.
        let st = unsafe { rdd_cq_poll(self.cq[s], &self.qp[s], 1, wc.as_mut_ptr(), n, &mut cnt) };
        ok(st, "rdd_cq_poll");
        assert!(cnt <= n);
        for w in &wc[..cnt] {
            self.observe(s, w, false);
        }
    }
}
