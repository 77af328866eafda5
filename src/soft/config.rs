//! Device configuration, the asynchronous events the device reports and
//! the faults tests inject.

use std::time::Duration;

/// Device configuration.
#[derive(Clone, Copy, Debug)]
pub struct SoftConfig {
    /// CQE size for new CQs: 64 or 128.
    pub cqe_size: u32,
    /// Delay before an RNR-NAKed operation is retried (thread mode; in
    /// step mode every `step` is one retry).
    pub rnr_delay: Duration,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            cqe_size: 64,
            rnr_delay: Duration::from_micros(20),
        }
    }
}

/// Asynchronous errors the device reports (the `ibv_get_async_event`
/// equivalent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A completion did not fit: the CQ overran. The completion was not
    /// written, and the CQ accepts no more entries (like hardware, the CQ
    /// is in error).
    CqOverrun {
        /// CQ number.
        cqn: u32,
    },
    /// A QP entered the error state because of a local failure.
    QpFatal {
        /// QP number.
        qpn: u32,
    },
    /// A responder QP refused an invalid request (an operation its access
    /// flags do not enable) and entered the error state
    /// (`IBV_EVENT_QP_REQ_ERR`; docs/spec/responder.md §3).
    QpRequestError {
        /// QP number of the responder.
        qpn: u32,
    },
    /// A responder QP refused a request that violated a memory region's
    /// key, bounds or access rights and entered the error state
    /// (`IBV_EVENT_QP_ACCESS_ERR`; docs/spec/responder.md §3).
    QpAccessError {
        /// QP number of the responder.
        qpn: u32,
    },
    /// An armed SRQ limit was crossed: fewer receives than the limit are
    /// posted and not yet taken (`IBV_EVENT_SRQ_LIMIT_REACHED`). The limit
    /// is disarmed; arm it again for another event.
    SrqLimitReached {
        /// SRQ number.
        srqn: u32,
    },
    /// A QP attached to an SRQ is in the error state and will take no
    /// more receives from it (`IBV_EVENT_QP_LAST_WQE_REACHED`, raised once
    /// per entry into ERROR).
    LastWqeReached {
        /// QP number.
        qpn: u32,
    },
}

/// Fault injection, for tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The `nth` (1-based) operation executed from now on, on `qpn` (or any
    /// QP), fails with `syndrome` instead of executing.
    FailNth {
        /// Restrict to this QP.
        qpn: Option<u32>,
        /// Which operation.
        nth: u64,
        /// The error-CQE syndrome to report.
        syndrome: u8,
    },
    /// Every operation waits this long (thread mode) or this many steps
    /// (step mode, counted in whole passes) before it executes.
    DelayCompletions {
        /// Delay in thread mode.
        time: Duration,
        /// Delay in step mode.
        steps: u64,
    },
    /// The peer `qpn` is unreachable: requests to it fail with
    /// "transport retry counter exceeded".
    DropPeer {
        /// The unreachable QP.
        qpn: u32,
    },
}
