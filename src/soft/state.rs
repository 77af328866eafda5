//! The device's state behind its lock: device-side QPs and CQs, the
//! per-WQE scratch memory and the engine that owns them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use std::vec::Vec;

use super::config::{AsyncEvent, Fault, SoftConfig};
use super::mem::{CqMem, QpMem};
use super::mr::{Access, MrTable};
use super::wqe::{self, Seg};
use crate::completion::QpState;

/// First QP number handed out.
pub(super) const QPN_BASE: u32 = 0x100;
/// First CQ number handed out.
pub(super) const CQN_BASE: u32 = 0x80;
/// First SRQ number handed out (never 0: a CQE's SRQ field is 0 for QPs
/// without one).
pub(super) const SRQN_BASE: u32 = 0x40;

/// Device-side state of one QP.
pub(super) struct Qp {
    pub(super) qpn: u32,
    pub(super) pd: u32,
    pub(super) state: QpState,
    pub(super) mem: Arc<QpMem>,
    pub(super) sq: *mut u8,
    pub(super) sq_cnt: u32,
    /// BBs consumed (free-running).
    pub(super) sq_ci: u32,
    pub(super) rq: *mut u8,
    pub(super) rq_cnt: u32,
    pub(super) rq_stride: u32,
    /// Receives consumed (free-running).
    pub(super) rq_ci: u32,
    pub(super) dbrec: *mut u32,
    pub(super) send_cq: u32,
    pub(super) recv_cq: u32,
    pub(super) dest: u32,
    pub(super) access: Access,
    pub(super) rnr_retry: u8,
    pub(super) rnr_attempts: u32,
    pub(super) rnr_wait: Option<Instant>,
    pub(super) rnr_step: u64,
    pub(super) hold: Option<(Instant, u64)>,
    /// The SRQ this QP takes its receives from (it has no RQ then).
    pub(super) srq: Option<u32>,
    /// `LastWqeReached` was raised since the QP last entered ERROR.
    pub(super) last_wqe_raised: bool,
    /// An unreliable-datagram QP (docs/spec/soft.md §3).
    pub(super) ud: bool,
    /// A UD QP's Q_Key (set by `ready_ud`).
    pub(super) qkey: u32,
    /// Connected to a QP of another process's device
    /// (docs/spec/fabric.md): its link and outstanding work.
    pub(super) remote: Option<std::boxed::Box<super::fabric::requester::Remote>>,
}

/// Device-side state of one CQ.
pub(super) struct Cq {
    pub(super) mem: Arc<CqMem>,
    pub(super) cnt: u32,
    pub(super) size: u32,
    /// CQEs written (free-running).
    pub(super) pi: u32,
    pub(super) overrun: bool,
    pub(super) users: u32,
    /// Signalled when a CQE lands on an armed CQ.
    pub(super) event: Arc<crate::event::EventFd>,
    /// Armed at this consumer index, not fired yet.
    pub(super) armed_ci: Option<u32>,
    /// The arm asks only for solicited (or error) completions.
    pub(super) armed_solicited: bool,
    /// Producer index of the newest CQE that is solicited or an error
    /// (what a solicited-only arm waits for).
    pub(super) last_solicited: Option<u32>,
}

/// What executing one WQE produced.
pub(super) enum Outcome {
    /// Completed; requester CQE byte count.
    Done(u32),
    /// Failed with this syndrome; the QP moves to ERROR.
    Fail(u8),
    /// The responder had no receive posted.
    Rnr,
    /// Not yet (injected delay, or a full link).
    Wait,
    /// Sent to a remote peer: completes when its response arrives.
    Queued,
}

/// Per-WQE working memory, allocated once with the device so executing a
/// WQE neither allocates nor zeroes large arrays.
pub(super) struct Scratch {
    pub(super) wbuf: [u8; wqe::MAX_WQE_BYTES + 64],
    pub(super) segs: [Seg; wqe::MAX_SEGS],
    pub(super) local: [(*mut u8, usize); wqe::MAX_SEGS],
    pub(super) rsegs: [Seg; 64],
    pub(super) dst: [(*mut u8, usize); 64],
    pub(super) entry: [u8; 1024],
}

impl Scratch {
    pub(super) fn new() -> std::boxed::Box<Scratch> {
        std::boxed::Box::new(Scratch {
            wbuf: [0; wqe::MAX_WQE_BYTES + 64],
            segs: [Seg::default(); wqe::MAX_SEGS],
            local: [(core::ptr::null_mut(), 0); wqe::MAX_SEGS],
            rsegs: [Seg::default(); 64],
            dst: [(core::ptr::null_mut(), 0); 64],
            entry: [0; 1024],
        })
    }
}

/// The device's state, behind one lock.
pub(super) struct Engine {
    /// Taken out while a WQE executes (so `&mut self` stays usable).
    pub(super) scratch: Option<std::boxed::Box<Scratch>>,
    pub(super) cfg: SoftConfig,
    pub(super) mrs: MrTable,
    pub(super) qps: Vec<Option<Qp>>,
    pub(super) cqs: Vec<Option<Cq>>,
    pub(super) srqs: Vec<Option<super::srq::DevSrq>>,
    pub(super) pds: Vec<bool>,
    pub(super) events: VecDeque<AsyncEvent>,
    /// Readable while `events` is not empty (made on first request).
    pub(super) events_fd: Option<Arc<crate::event::EventFd>>,
    pub(super) faults: Vec<Fault>,
    pub(super) steps: u64,
    pub(super) threaded: bool,
    /// Datagrams dropped (docs/spec/soft.md §3).
    pub(super) ud_drops: super::config::UdDrops,
}

// SAFETY: the raw pointers in `Qp` (and `DevSrq`) point into `QpMem`
// (`SrqMem`) buffers that the same entry keeps alive through its `Arc`; all
// shared words are accessed atomically (`mmio`), and the engine is only
// reachable behind a Mutex.
unsafe impl Send for Engine {}

pub(super) struct Shared {
    pub(super) engine: Mutex<Engine>,
    pub(super) stop: AtomicBool,
    pub(super) passes: AtomicU64,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Queues an asynchronous event and wakes whoever waits on the fd.
    pub(super) fn push_event(&mut self, ev: AsyncEvent) {
        self.events.push_back(ev);
        if let Some(fd) = &self.events_fd {
            fd.signal();
        }
    }

    pub(super) fn qp_index(&self, qpn: u32) -> Option<usize> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(i)?.as_ref().map(|_| i)
    }

    pub(super) fn cq_mut(&mut self, cqn: u32) -> Option<&mut Cq> {
        self.cqs
            .get_mut(cqn.checked_sub(CQN_BASE)? as usize)?
            .as_mut()
    }

    pub(super) fn set_error(&mut self, qi: usize) {
        if let Some(q) = self.qps[qi].as_mut() {
            q.state = QpState::Error;
        }
    }

    /// A responder error that ends the connection (docs/spec/responder.md
    /// §2, §3): the responder QP `bi` moves to ERROR (its receives are
    /// then flushed by the pass) and `ev` is raised for it. Returns the
    /// requester's outcome: the NAK's syndrome.
    pub(super) fn responder_fatal(&mut self, bi: usize, nak: u8, ev: RespEvent) -> Outcome {
        if let Some(q) = self.qps[bi].as_mut() {
            if q.state != QpState::Error {
                q.state = QpState::Error;
                let qpn = q.qpn;
                match ev {
                    RespEvent::Access => self.push_event(AsyncEvent::QpAccessError { qpn }),
                    RespEvent::Request => self.push_event(AsyncEvent::QpRequestError { qpn }),
                    RespEvent::None => {}
                }
            }
        }
        Outcome::Fail(nak)
    }
}

/// Which affiliated asynchronous event a responder error raises
/// (docs/spec/responder.md §3).
#[derive(Clone, Copy)]
pub(super) enum RespEvent {
    /// `IBV_EVENT_QP_ACCESS_ERR`: key, bounds or rights of a region.
    Access,
    /// `IBV_EVENT_QP_REQ_ERR`: an operation the QP does not enable.
    Request,
    /// None: the error was reported in a receive completion.
    None,
}
