//! A deliberately slow receiver, shared by the flow-control tests on the
//! software device (`tests/credit.rs`) and on rxe (`tests/credit_verbs.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rdma_direct::api::{Backend, Cq, Mr, Qp, QpState, Wc, WcStatus};
use rdma_direct::{RecvWr, Sge};

/// What the receiver saw.
pub struct Received {
    /// Receives that completed successfully.
    pub delivered: u64,
    /// Receives that completed with an error.
    pub failed: u64,
    /// The QP's state at the end.
    pub state: QpState,
}

/// How slow the receiver is.
pub struct Pace {
    /// Receives posted at the start (slots `0..window` of the region).
    pub window: u32,
    /// Most receives re-posted per period.
    pub batch: usize,
    /// Sleep between polls.
    pub period: Duration,
}

/// Runs the receiving side of `qp` on a thread of its own until `stop`:
/// posts `pace.window` receives first (slot `i` is `slot_len` bytes at
/// offset `i * slot_len` of `dst`, which must outlive the thread: join it
/// before dropping `dst`), then every `pace.period` takes what completed
/// on `cq` and re-posts at most `pace.batch` of the consumed slots.
/// Payloads are not checked here.
pub fn spawn<B: Backend>(
    mut qp: Qp<B>,
    mut cq: Cq<B>,
    dst: &Mr<B>,
    slot_len: usize,
    pace: Pace,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Received> {
    // The thread builds its SGEs from the region's address and key.
    let (base, lkey) = (dst.addr(), dst.lkey());
    let sge = move |slot: u64| Sge::new(base + slot * slot_len as u64, slot_len as u32, lkey);
    for slot in 0..u64::from(pace.window) {
        qp.post_recv(&[RecvWr {
            wr_id: slot,
            sges: &[sge(slot)],
        }])
        .unwrap();
    }
    thread::spawn(move || {
        let mut wc = [Wc::default(); 64];
        let mut consumed: Vec<u64> = Vec::new();
        let (mut delivered, mut failed) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            thread::sleep(pace.period);
            let n = cq.poll(&mut qp, &mut wc).unwrap();
            for w in &wc[..n] {
                if w.status == WcStatus::SUCCESS {
                    delivered += 1;
                    consumed.push(w.wr_id);
                } else {
                    failed += 1;
                }
            }
            if qp.state() == QpState::Error {
                continue;
            }
            let k = consumed.len().min(pace.batch);
            for slot in consumed.drain(..k) {
                qp.post_recv(&[RecvWr {
                    wr_id: slot,
                    sges: &[sge(slot)],
                }])
                .unwrap();
            }
        }
        Received {
            delivered,
            failed,
            state: qp.state(),
        }
    })
}
