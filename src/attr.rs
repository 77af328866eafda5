//! Attributes every backend shares: memory access rights, queue sizes at
//! creation, address vectors and state changes.

use crate::completion::QpState;

/// Access flags, numbered as `IBV_ACCESS_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// The device may write the region on behalf of local work
    /// (receives, READ results, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE (needs LOCAL_WRITE).
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ.
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may run atomics (needs LOCAL_WRITE).
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every access bit a QP takes (`IBV_ACCESS_*` local write and the
    /// remote rights).
    pub const ALL: Access = Access(0xf);
    /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`).
    /// Regions only; grants nothing by itself. Needed for
    /// [`crate::expose`]'s windows; devices without windows ignore it.
    pub const MW_BIND: Access = Access(0x10);
    /// Every bit a region takes: [`Access::ALL`] and [`Access::MW_BIND`].
    pub const MR_ALL: Access = Access(0x1f);

    /// True if all bits of `o` are set.
    #[inline]
    pub const fn contains(self, o: Access) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// QP creation parameters.
#[derive(Clone, Copy, Debug)]
pub struct QpInit {
    /// Send WRs the SQ must hold (of the largest size).
    pub max_send_wr: u32,
    /// Receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// The shared receive queue this QP takes its receives from, if any
    /// (`ibv_qp_init_attr.srq`). Such a QP has no receive queue of its own:
    /// `max_recv_wr` and `max_recv_sge` are ignored, and receives are
    /// posted to the SRQ. Devices without SRQs refuse it with
    /// [`crate::Error::Unsupported`].
    pub srq: Option<SrqId>,
}

impl Default for QpInit {
    fn default() -> Self {
        QpInit {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            srq: None,
        }
    }
}

/// Names a shared receive queue for [`QpInit::srq`]: its number on the
/// device and a key that tells this SRQ from a later one that reuses the
/// number. The safe API hands it out (`api::Srq::id`) and checks both
/// parts; a device looks at the number only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrqId {
    /// SRQ number on its device.
    pub srqn: u32,
    /// Identifies the SRQ object the number belongs to (0 for an SRQ made
    /// at the device level).
    pub key: u64,
}

impl SrqId {
    /// The SRQ numbered `srqn` on the device (key 0), for device-level
    /// callers such as the software device's `create_qp`.
    pub const fn from_srqn(srqn: u32) -> SrqId {
        SrqId { srqn, key: 0 }
    }
}

/// What a shared receive queue holds (`ibv_srq_attr`), as created or
/// queried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receives the SRQ can hold at once.
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// The armed limit (0: not armed). Arming it asks for one
    /// `SrqLimitReached` event once fewer receives than this are posted
    /// and not yet taken by the device; the event disarms it again.
    pub srq_limit: u32,
}

/// The address of the peer a connected QP talks to (`ibv_ah_attr`).
/// The software device ignores it; the verbs backend passes it to
/// `ibv_modify_qp` at RTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressVector {
    /// Destination LID (InfiniBand; 0 on RoCE and iWARP).
    pub dlid: u16,
    /// Service level (InfiniBand SL; on RoCE the VLAN priority).
    pub sl: u8,
    /// Send a global routing header (always on RoCE).
    pub is_global: bool,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Local GID table index to send from.
    pub sgid_index: u8,
    /// GRH hop limit (IPv4/IPv6 TTL on RoCEv2).
    pub hop_limit: u8,
    /// GRH traffic class (the DSCP/ECN byte on RoCEv2, which switches map
    /// to a PFC priority).
    pub traffic_class: u8,
    /// GRH flow label.
    pub flow_label: u32,
}

/// A QP state change (`ibv_modify_qp`). Fields that the target state does
/// not use are ignored.
#[derive(Clone, Copy, Debug)]
pub struct QpModify {
    /// The new state.
    pub state: QpState,
    /// INIT: remote operations this QP accepts.
    pub access: Access,
    /// INIT: physical port (1-based).
    pub port_num: u8,
    /// RTR: the peer's QP number.
    pub dest_qpn: u32,
    /// RTR: path MTU in bytes (256, 512, 1024, 2048 or 4096).
    pub path_mtu: u32,
    /// RTR: the peer's initial packet sequence number (24 bits).
    pub rq_psn: u32,
    /// RTR: how to reach the peer.
    pub av: AddressVector,
    /// RTR: RDMA READs and atomics the peer may have outstanding here.
    pub max_dest_rd_atomic: u8,
    /// RTR: minimum RNR NAK timer (IB encoding, 1..=31; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// RTS: this QP's initial packet sequence number (24 bits).
    pub sq_psn: u32,
    /// RTS: local ACK timeout (IB encoding: 4.096 µs · 2^timeout).
    pub timeout: u8,
    /// RTS: RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RTS: transport retries.
    pub retry_cnt: u8,
    /// RTS: RDMA READs and atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
    /// RTS: send rate limit in kbit/s (0: none). Devices without packet
    /// pacing (the software device, rxe, siw) refuse a non-zero limit
    /// with [`crate::Error::Unsupported`].
    pub rate_limit_kbps: u32,
}

/// Largest packet sequence number (PSNs are 24 bits), also the largest
/// QP number.
pub const MAX_PSN: u32 = 0xff_ffff;

impl QpModify {
    /// Checks every attribute the target state uses, before anything is
    /// changed: a refused state change leaves the QP as it was. INIT: only
    /// [`Access::ALL`] bits. RTR: a path MTU of 256..=4096 bytes, a 24-bit
    /// destination QP number and PSN, an RNR timer of 0..=31, an SL of
    /// 0..=15 and a 20-bit flow label. RTS: a 24-bit PSN, a timeout of
    /// 0..=31 and retry counts of 0..=7 (the widths of the fields in
    /// `ibv_qp_attr` and of the IB transport headers: InfiniBand
    /// Architecture Specification vol. 1, ch. 9 and 11). RESET and ERROR
    /// use no attribute. Device limits (`max_rd_atomic`, the GID index, a
    /// rate limit) are the device's to check.
    pub fn validate(&self) -> crate::error::Result<()> {
        let bad = match self.state {
            QpState::Init => self.access.0 & !Access::ALL.0 != 0,
            QpState::Rtr => {
                !(256..=4096).contains(&self.path_mtu)
                    || self.dest_qpn > MAX_PSN
                    || self.rq_psn > MAX_PSN
                    || self.min_rnr_timer > 31
                    || self.av.sl > 15
                    || self.av.flow_label > 0xf_ffff
            }
            QpState::Rts => {
                self.sq_psn > MAX_PSN
                    || self.timeout > 31
                    || self.retry_cnt > 7
                    || self.rnr_retry > 7
            }
            QpState::Reset | QpState::Error => false,
        };
        if bad {
            return Err(crate::error::Error::InvalidAttribute);
        }
        Ok(())
    }

    /// A transition to `state` with default attributes.
    pub fn to(state: QpState) -> QpModify {
        QpModify {
            state,
            access: Access::NONE,
            port_num: 1,
            dest_qpn: 0,
            path_mtu: 1024,
            rq_psn: 0,
            av: AddressVector::default(),
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            sq_psn: 0,
            rate_limit_kbps: 0,
            timeout: 14,
            rnr_retry: 7,
            retry_cnt: 7,
            max_rd_atomic: 1,
        }
    }
}
