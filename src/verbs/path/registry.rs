//! [`CqRegistry`]: the QPs completing on a CQ, and the poller's lock-free
//! view of it ([`RegistryView`]) that turns provider completions into the
//! user's.

use std::sync::{Arc, Mutex};
use std::vec::Vec;

use super::srq::SRQ_BIT;
use super::track::{QpTrack, RECV_BIT};
use crate::completion::{QpState, Wc, WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Ordering};

/// The CQ-side registry of the QPs completing on a CQ. Changed only by the
/// control path; the poller keeps a copy and refreshes it when the
/// generation moves, so polling takes no lock in steady state.
#[derive(Default)]
pub struct CqRegistry {
    gen: AtomicU64,
    qps: Mutex<Vec<Arc<QpTrack>>>,
}

impl CqRegistry {
    /// Adds a QP.
    pub fn add(&self, t: Arc<QpTrack>) {
        let mut v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
        if !v.iter().any(|x| Arc::ptr_eq(x, &t)) {
            v.push(t);
        }
        // Release: the list change happens before a poller that sees the new
        // generation re-reads the list (it also takes the lock).
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Removes a QP.
    pub fn remove(&self, t: &Arc<QpTrack>) {
        let mut v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|x| !Arc::ptr_eq(x, t));
        // Release: as in `add`.
        self.gen.fetch_add(1, Ordering::Release);
    }
}

/// A poller's lock-free view of a [`CqRegistry`]: a copy of its QP list,
/// refreshed when the generation moves.
pub(crate) struct RegistryView {
    registry: Arc<CqRegistry>,
    seen_gen: u64,
    qps: Vec<Arc<QpTrack>>,
}

impl RegistryView {
    /// A view of `registry` (filled on the first refresh).
    pub(crate) fn new(registry: Arc<CqRegistry>) -> RegistryView {
        RegistryView {
            registry,
            seen_gen: u64::MAX,
            qps: Vec::new(),
        }
    }

    /// Re-reads the QP list if it changed.
    pub(crate) fn refresh(&mut self) {
        // Acquire: pairs with the Release in `CqRegistry::add/remove`.
        let g = self.registry.gen.load(Ordering::Acquire);
        if g != self.seen_gen {
            let v = self.registry.qps.lock().unwrap_or_else(|p| p.into_inner());
            self.qps.clone_from(&v);
            self.seen_gen = g;
        }
    }

    fn track(&self, qpn: u32) -> Option<&QpTrack> {
        self.qps.iter().find(|t| t.qpn == qpn).map(|t| &**t)
    }

    /// Fills `out` with flush completions for send WRs the device will
    /// never complete ([`QpTrack::add_stranded`]); returns how many.
    pub(crate) fn stranded(&self, out: &mut [Wc]) -> Result<usize> {
        let mut n = 0usize;
        let mut seqs = Vec::new();
        for t in &self.qps {
            if n == out.len() {
                break;
            }
            seqs.clear();
            t.take_stranded(out.len() - n, &mut seqs);
            for &seq in &seqs {
                let mut w = Wc {
                    wr_id: seq,
                    status: WcStatus::WR_FLUSH_ERR,
                    opcode: WcOpcode::SEND,
                    qp_num: t.qpn,
                    ..Wc::default()
                };
                if self.finish(&mut w)? {
                    out[n] = w;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Turns a provider completion carrying one of our wr_ids (read once
    /// from provider memory into `w`) into the user's: `Ok(false)` for a
    /// completion that is not reported (a forced signal, a refused WR),
    /// [`Error::CqeCorrupt`] for a QP or wr_id that names nothing
    /// outstanding. On error completions the opcode is undefined: it is
    /// derived from the queue the WR came from, and the QP is recorded as
    /// in ERROR.
    pub(crate) fn finish(&self, w: &mut Wc) -> Result<bool> {
        let Some(track) = self.track(w.qp_num) else {
            return Err(Error::CqeCorrupt);
        };
        let recv = w.wr_id & RECV_BIT != 0;
        if recv && w.wr_id & SRQ_BIT != 0 {
            // A receive the QP took from its SRQ (a QP without one never
            // gets such an id).
            let Some(srq) = &track.srq else {
                return Err(Error::CqeCorrupt);
            };
            w.wr_id = srq.complete(w.wr_id)?;
            if w.status != WcStatus::SUCCESS {
                w.opcode = WcOpcode::RECV;
                track.set_state(QpState::Error);
            }
            return Ok(true);
        }
        let Some(user) = track.complete(w.wr_id, w.status.0, w.vendor_err)? else {
            return Ok(false);
        };
        w.wr_id = user;
        if w.status != WcStatus::SUCCESS {
            w.opcode = if recv { WcOpcode::RECV } else { WcOpcode::SEND };
            track.set_state(QpState::Error);
        }
        Ok(true)
    }
}
