//! Connecting a QP: the connection data exchanged with the peer
//! ([`QpInfo`]), the attributes ([`ConnectAttr`]), their validation, and
//! the INIT, RTR and RTS steps built from them.

use crate::attr::MAX_PSN;
use crate::error::{Error, Result};

use super::{Access, AddressVector, PortInfo, QpModify, QpState, Transport};

/// Connection data of a QP, exchanged with the peer (out of band, or by a
/// connection manager).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID.
    pub gid: [u8; 16],
    /// Path MTU in bytes.
    pub mtu: u32,
}

impl QpInfo {
    /// Checks the peer's connection data: a QP number and a PSN of 24
    /// bits ([`Error::InvalidAttribute`] otherwise). The LID, GID and MTU
    /// are taken as given (an MTU of 0 means unknown, and below 256 counts
    /// as 256).
    pub fn validate(&self) -> Result<()> {
        if self.qpn > MAX_PSN || self.psn > MAX_PSN {
            return Err(Error::InvalidAttribute);
        }
        Ok(())
    }
}

/// Attributes for [`super::Qp::connect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectAttr {
    /// Remote operations this QP accepts (checked with the MR's flags).
    pub access: Access,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Transport retries, 0..7 (as in the IB spec, 7 is seven retries,
    /// then [`crate::completion::WcStatus`]'s retry-exceeded; rxe would
    /// retry forever at 7, so on rxe the QP is given 6:
    /// `DeviceCaps::retry7_unbounded` under the `verbs` feature).
    pub retry_cnt: u8,
    /// Local ACK timeout (IB encoding: 4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Minimum RNR NAK timer (IB encoding; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// RDMA READs/atomics outstanding in each direction.
    pub max_rd_atomic: u8,
    /// GID index to send from (`None`: the port's default,
    /// [`PortInfo::gid_index`]).
    pub gid_index: Option<u8>,
    /// GRH hop limit (TTL on RoCEv2).
    pub hop_limit: u8,
    /// GRH traffic class: the DSCP/ECN byte on RoCEv2, so this QP's
    /// traffic can be mapped to its own PFC priority.
    pub traffic_class: u8,
    /// Service level (InfiniBand SL; VLAN priority on RoCE).
    pub sl: u8,
    /// Cap the path MTU below what both ports support (bytes, 0 = none).
    pub max_mtu: u32,
    /// Send rate limit in kbit/s (0: none), where the device paces packets
    /// (ConnectX through verbs); elsewhere connecting with a limit fails
    /// with [`crate::Error::Unsupported`].
    pub rate_limit_kbps: u32,
}

impl Default for ConnectAttr {
    fn default() -> Self {
        ConnectAttr {
            access: Access::NONE,
            rnr_retry: 7,
            retry_cnt: 7,
            timeout: 14,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            gid_index: None,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            max_mtu: 0,
            rate_limit_kbps: 0,
        }
    }
}

impl ConnectAttr {
    /// Checks every attribute before anything is changed
    /// ([`Error::InvalidAttribute`]): only [`Access::ALL`] bits, retry
    /// counts of 0..=7, a timeout and an RNR timer of 0..=31, an SL of
    /// 0..=15, and a `max_mtu` of 0 or at least 256. `max_rd_atomic`, the
    /// GID index and the rate limit are device limits, checked by the
    /// device (a connect it refuses part-way is rolled back to RESET).
    pub fn validate(&self) -> Result<()> {
        if self.access.0 & !Access::ALL.0 != 0
            || self.rnr_retry > 7
            || self.retry_cnt > 7
            || self.timeout > 31
            || self.min_rnr_timer > 31
            || self.sl > 15
            || (self.max_mtu != 0 && self.max_mtu < 256)
        {
            return Err(Error::InvalidAttribute);
        }
        Ok(())
    }
}

/// What a QP was connected with ([`super::Qp::query`]): the peer's
/// connection data, the attributes, and the path MTU both sides agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConnection {
    /// The peer, as given to [`super::Qp::connect`].
    pub remote: QpInfo,
    /// The attributes, as given.
    pub attr: ConnectAttr,
    /// The path MTU in bytes (the smaller port MTU, capped by
    /// `attr.max_mtu`).
    pub path_mtu: u32,
    /// This QP's initial send PSN.
    pub sq_psn: u32,
}

/// Validates `remote` and `attr` and builds the three connect steps,
/// each checked with [`QpModify::validate`]: on `Ok` nothing the caller
/// can pass is left for the device to refuse but its own limits.
pub(crate) fn checked_connect_steps(
    port: &PortInfo,
    psn: u32,
    remote: &QpInfo,
    attr: &ConnectAttr,
) -> Result<[QpModify; 3]> {
    remote.validate()?;
    attr.validate()?;
    let steps = connect_steps_for(port, psn, remote, attr);
    for m in &steps {
        m.validate()?;
    }
    Ok(steps)
}

/// The three state changes that connect a QP with initial send PSN `psn`
/// on `port` to `remote`: INIT, RTR and RTS (shared by [`Qp::connect_steps`]
/// and the C ABI). On RoCE the GRH is always set (from `attr`'s GID index,
/// hop limit and traffic class); on InfiniBand only when the peer has no
/// LID.
pub(crate) fn connect_steps_for(
    port: &PortInfo,
    psn: u32,
    remote: &QpInfo,
    attr: &ConnectAttr,
) -> [QpModify; 3] {
    let mut init = QpModify::to(QpState::Init);
    init.access = attr.access;
    init.port_num = port.port_num.max(1);
    let mut rtr = QpModify::to(QpState::Rtr);
    rtr.port_num = init.port_num;
    rtr.dest_qpn = remote.qpn;
    rtr.rq_psn = remote.psn & 0xff_ffff;
    // A peer MTU of 0 means unknown (ibv_rc_pingpong's message carries
    // none): use this port's.
    let remote_mtu = if remote.mtu == 0 {
        port.mtu
    } else {
        remote.mtu.max(256)
    };
    let mut mtu = port.mtu.min(remote_mtu);
    if attr.max_mtu != 0 {
        mtu = mtu.min(attr.max_mtu);
    }
    rtr.path_mtu = mtu;
    rtr.max_dest_rd_atomic = attr.max_rd_atomic;
    rtr.min_rnr_timer = attr.min_rnr_timer;
    rtr.av = AddressVector {
        dlid: remote.lid,
        sl: attr.sl,
        is_global: port.transport == Transport::Roce || remote.lid == 0,
        dgid: remote.gid,
        sgid_index: attr.gid_index.unwrap_or(port.gid_index),
        hop_limit: attr.hop_limit,
        traffic_class: attr.traffic_class,
        flow_label: 0,
    };
    let mut rts = QpModify::to(QpState::Rts);
    rts.sq_psn = psn;
    rts.timeout = attr.timeout;
    rts.rnr_retry = attr.rnr_retry;
    rts.retry_cnt = attr.retry_cnt;
    rts.max_rd_atomic = attr.max_rd_atomic;
    rts.rate_limit_kbps = attr.rate_limit_kbps;
    [init, rtr, rts]
}
