//! The crate's QP attributes as libibverbs' (`ibv_qp_attr` and its mask,
//! access flags, MTU and state enums), for `ibv_modify_qp` and the uverbs
//! MODIFY_QP alike.

use rdma_sys as sys;

use super::DeviceCaps;
use crate::attr::{Access, QpModify};
use crate::completion::QpState;

/// Bytes to the IB MTU enum (the largest that fits).
fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        0..=511 => 1,
        512..=1023 => 2,
        1024..=2047 => 3,
        2048..=4095 => 4,
        _ => 5,
    }
}

/// `IBV_ACCESS_*` from the crate's flags (same numbering).
pub(super) fn access_bits(a: Access) -> u32 {
    a.0
}

/// `ibv_modify_qp` attributes and mask for a transition.
pub(crate) fn qp_attr(m: &QpModify, caps: &DeviceCaps) -> (sys::ibv_qp_attr, u32) {
    use sys::ibv_qp_attr_mask as M;
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut a: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
    let mut mask = M::IBV_QP_STATE.0;
    a.qp_state = qp_state(m.state);
    match m.state {
        QpState::Init => {
            a.pkey_index = 0;
            a.port_num = m.port_num.max(1);
            a.qp_access_flags = access_bits(m.access);
            mask |= M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_ACCESS_FLAGS.0;
        }
        QpState::Rtr => {
            a.path_mtu = mtu_enum(m.path_mtu);
            a.dest_qp_num = m.dest_qpn;
            a.rq_psn = m.rq_psn & 0xff_ffff;
            a.max_dest_rd_atomic = clamp_rd(m.max_dest_rd_atomic, caps.max_qp_rd_atom);
            a.min_rnr_timer = m.min_rnr_timer;
            a.ah_attr.dlid = m.av.dlid;
            a.ah_attr.sl = m.av.sl;
            a.ah_attr.src_path_bits = 0;
            a.ah_attr.port_num = m.port_num.max(1);
            if m.av.is_global {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid = sys::ibv_gid { raw: m.av.dgid };
                a.ah_attr.grh.sgid_index = m.av.sgid_index;
                a.ah_attr.grh.hop_limit = m.av.hop_limit.max(1);
                a.ah_attr.grh.traffic_class = m.av.traffic_class;
                a.ah_attr.grh.flow_label = m.av.flow_label;
            }
            mask |= M::IBV_QP_AV.0
                | M::IBV_QP_PATH_MTU.0
                | M::IBV_QP_DEST_QPN.0
                | M::IBV_QP_RQ_PSN.0
                | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
                | M::IBV_QP_MIN_RNR_TIMER.0;
        }
        QpState::Rts => {
            a.sq_psn = m.sq_psn & 0xff_ffff;
            a.timeout = m.timeout;
            // On a driver that retries forever at 7, 6, so a gone peer
            // still ends in RETRY_EXC (`DeviceCaps::retry7_unbounded`).
            a.retry_cnt = m.retry_cnt.min(caps.max_retry_cnt());
            a.rnr_retry = m.rnr_retry.min(7);
            a.max_rd_atomic = clamp_rd(m.max_rd_atomic, caps.max_qp_init_rd_atom);
            if m.rate_limit_kbps != 0 {
                a.rate_limit = m.rate_limit_kbps;
                mask |= M::IBV_QP_RATE_LIMIT.0;
            }
            mask |= M::IBV_QP_SQ_PSN.0
                | M::IBV_QP_TIMEOUT.0
                | M::IBV_QP_RETRY_CNT.0
                | M::IBV_QP_RNR_RETRY.0
                | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        }
        _ => {}
    }
    (a, mask)
}

fn clamp_rd(want: u8, cap: u32) -> u8 {
    if cap == 0 {
        want
    } else {
        want.min(cap.min(255) as u8)
    }
}

fn qp_state(s: QpState) -> u32 {
    use sys::ibv_qp_state as S;
    match s {
        QpState::Reset => S::IBV_QPS_RESET,
        QpState::Init => S::IBV_QPS_INIT,
        QpState::Rtr => S::IBV_QPS_RTR,
        QpState::Rts => S::IBV_QPS_RTS,
        QpState::Error => S::IBV_QPS_ERR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RTS attributes for `retry_cnt` on a device with `caps`.
    fn rts_retry(retry_cnt: u8, caps: &DeviceCaps) -> u8 {
        let mut m = QpModify::to(QpState::Rts);
        m.retry_cnt = retry_cnt;
        qp_attr(&m, caps).0.retry_cnt
    }

    #[test]
    fn retry_count_seven_is_bounded_on_drivers_that_would_retry_forever() {
        let ib = DeviceCaps::default();
        let rxe = DeviceCaps {
            retry7_unbounded: true,
            ..DeviceCaps::default()
        };
        // Seven is seven where the driver follows the IB spec.
        assert_eq!(rts_retry(7, &ib), 7);
        // rxe would retry forever at 7: it gets 6, the nearest bound.
        assert_eq!(rts_retry(7, &rxe), 6);
        for n in 0..=6 {
            assert_eq!(rts_retry(n, &rxe), n);
            assert_eq!(rts_retry(n, &ib), n);
        }
        // Out of range asks are capped as before.
        assert_eq!(rts_retry(200, &ib), 7);
        assert_eq!(rts_retry(200, &rxe), 6);
    }
}
