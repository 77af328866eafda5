//! Asynchronous device events ([`AsyncEvent`]): QP errors, CQ overruns,
//! port changes.

/// An asynchronous event from the device (`ibv_async_event`; the software
/// device raises the QP and CQ ones). QP-fatal kinds mean the device moved
/// the QP to ERROR on its own: recover it with [`super::Qp::recover`] (or
/// [`super::Qp::drain_and_reset`]), which reports every outstanding WR once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A QP hit an error that prevented a completion (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// QP number.
        qpn: u32,
    },
    /// An invalid request arrived at a QP (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError {
        /// QP number.
        qpn: u32,
    },
    /// A remote access violation on a QP (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// QP number.
        qpn: u32,
    },
    /// The first message arrived on a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEstablished {
        /// QP number.
        qpn: u32,
    },
    /// A QP in SQD has no outstanding sends (`IBV_EVENT_SQ_DRAINED`).
    SqDrained {
        /// QP number.
        qpn: u32,
    },
    /// A QP on an SRQ in ERROR has no more receives to flush
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached {
        /// QP number.
        qpn: u32,
    },
    /// An armed SRQ limit was crossed: fewer receives than the limit are
    /// posted to the SRQ and not yet taken (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    /// The event disarms the limit; [`super::Srq::arm_limit`] arms it
    /// again.
    SrqLimitReached {
        /// SRQ number ([`super::Srq::srqn`]).
        srqn: u32,
    },
    /// A CQ overran or failed (`IBV_EVENT_CQ_ERR`); its completions are
    /// no longer reliable.
    CqError {
        /// CQ number.
        cqn: u32,
    },
    /// A port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive {
        /// Port number.
        port: u8,
    },
    /// A port went down (`IBV_EVENT_PORT_ERR`): connections through it
    /// will fail with retry errors.
    PortError {
        /// Port number.
        port: u8,
    },
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`); close and reopen it.
    DeviceFatal,
    /// Any other event: its `ibv_event_type` value and raw element.
    Other {
        /// `ibv_event_type`.
        kind: u32,
        /// QP number, CQ number or port, as the kind implies.
        element: u32,
    },
}

impl AsyncEvent {
    /// The QP the event is about, if any.
    pub const fn qpn(&self) -> Option<u32> {
        match *self {
            AsyncEvent::QpFatal { qpn }
            | AsyncEvent::QpRequestError { qpn }
            | AsyncEvent::QpAccessError { qpn }
            | AsyncEvent::CommEstablished { qpn }
            | AsyncEvent::SqDrained { qpn }
            | AsyncEvent::LastWqeReached { qpn } => Some(qpn),
            _ => None,
        }
    }

    /// The SRQ the event is about, if any.
    pub const fn srqn(&self) -> Option<u32> {
        match *self {
            AsyncEvent::SrqLimitReached { srqn } => Some(srqn),
            _ => None,
        }
    }

    /// True for the events after which the QP is in ERROR and needs
    /// [`super::Qp::recover`]: fatal, request and access errors.
    pub const fn is_qp_fatal(&self) -> bool {
        matches!(
            self,
            AsyncEvent::QpFatal { .. }
                | AsyncEvent::QpRequestError { .. }
                | AsyncEvent::QpAccessError { .. }
        )
    }
}
