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
    /// The port's MTU in bytes: 256, 512, 1024, 2048 or 4096 (default
    /// 4096, the largest IB MTU and rxe's largest). A UD message longer
    /// than this is refused at the sender (docs/spec/soft.md §3); the
    /// port reports it as its active MTU. Any other value is taken as
    /// 4096.
    pub mtu: u32,
    /// The port's GID (GID table entry 0, the only one): what the port
    /// reports and the source GID of the GRHs the device writes
    /// (docs/spec/soft.md §3). Default all zero. A fabric GID (made by
    /// [`SoftConfig::fabric`]) joins the device to the cross-process
    /// fabric: its RC QPs can then connect to QPs of devices in other
    /// processes on this host (docs/spec/fabric.md).
    pub gid: [u8; 16],
    /// Data bytes of each of the two rings a remote QP's link holds (a
    /// power of two, at least 128 KiB; default 256 KiB). Used only on the
    /// fabric.
    pub fabric_ring: usize,
}

impl SoftConfig {
    /// A configuration that joins the cross-process fabric: the defaults
    /// with a new fabric GID naming this process and this device
    /// (docs/spec/fabric.md §1). Give each device its own: two devices
    /// with the same GID cannot reach each other.
    pub fn fabric() -> SoftConfig {
        SoftConfig {
            gid: super::fabric::new_gid(),
            ..SoftConfig::default()
        }
    }

    /// Whether [`SoftConfig::gid`] is a fabric GID.
    pub fn is_fabric(&self) -> bool {
        super::fabric::is_fabric_gid(&self.gid)
    }

    /// The MTU the device uses: [`SoftConfig::mtu`] if it is a valid IB
    /// MTU, else 4096.
    pub fn effective_mtu(&self) -> u32 {
        match self.mtu {
            256 | 512 | 1024 | 2048 | 4096 => self.mtu,
            _ => 4096,
        }
    }
}

/// Datagrams the device dropped, by reason (docs/spec/soft.md §3). UD is
/// unreliable: the sender's WR completes successfully either way, and a
/// dropped datagram consumes no receive and writes nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdDrops {
    /// No QP with the destination QP number exists on the device.
    pub no_qp: u64,
    /// The destination QP is not a UD QP.
    pub not_ud: u64,
    /// The destination QP is not in RTR or RTS.
    pub not_ready: u64,
    /// The datagram's Q_Key differs from the destination QP's.
    pub bad_qkey: u64,
    /// The destination QP had no receive posted (UD has no RNR retry).
    pub no_receive: u64,
}

impl UdDrops {
    /// Every drop, whatever the reason.
    pub fn total(&self) -> u64 {
        self.no_qp + self.not_ud + self.not_ready + self.bad_qkey + self.no_receive
    }
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            cqe_size: 64,
            rnr_delay: Duration::from_micros(20),
            mtu: 4096,
            gid: [0; 16],
            fabric_ring: 256 * 1024,
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
