//! A deliberately slow receiver, shared by the flow-control tests on the
//! software device (`tests/credit.rs`) and on rxe (`tests/credit_verbs.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rdma_direct::api::{Backend, Cq, Qp, QpState, Wc, WcStatus};
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

/// Runs the receiving side of `qp` on a thread of its own until `stop`:
/// every `period` it takes what completed on `cq` and re-posts at most
/// `batch` of the consumed buffers (slot `i` is `sge(i)`, as posted
/// before). Payloads are not checked here.
pub fn spawn<B: Backend>(
    mut qp: Qp<B>,
    mut cq: Cq<B>,
    sge: impl Fn(u64) -> Sge + Send + 'static,
    batch: usize,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Received> {
    thread::spawn(move || {
        let mut wc = [Wc::default(); 64];
        let mut consumed: Vec<u64> = Vec::new();
        let (mut delivered, mut failed) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            thread::sleep(period);
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
            let k = consumed.len().min(batch);
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
