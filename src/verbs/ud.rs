//! Unreliable datagrams on the verbs backend: UD QPs made ready with their
//! Q_Key, and address handles. On the fallback data path they are
//! libibverbs' (`ibv_create_ah`, posted with `wr.ud.ah`); on rxe's direct
//! rings our own CREATE_AH, whose `ah_num` the ring's UD send WQEs name
//! (docs/spec/rxe.md §8).
//!
//! Only on RoCE and InfiniBand devices opened on the fallback, and on rxe's
//! direct rings: iWARP (siw) has no datagrams, and the mlx5 core path has
//! no UD QPs of this backend's making; there every call is
//! [`Error::Unsupported`] (docs/status.md).

use rdma_sys as sys;

use super::{fail_errno, random_psn, Raw, VerbsDevice};
use crate::api::{DriverAh, Transport};
use crate::attr::AddressVector;
use crate::completion::QpState;
use crate::error::{Error, Result};
use crate::sync::Ordering;
use crate::wr::{SendOp, SendWr};

/// The checks every data path makes on a UD send before it looks at its
/// queue (`QpDriver::post_send_ud` on the fallback and on the direct rxe
/// ring): the QP is a UD QP ([`Error::InvalidAttribute`]), the opcode is
/// SEND or SEND_WITH_IMM (RDMA and atomics do not exist on UD:
/// [`Error::Unsupported`]) and the destination QPN fits 24 bits
/// ([`Error::InvalidQpn`]).
pub(in crate::verbs) fn check_ud_send(ud: bool, wr: &SendWr<'_>, remote_qpn: u32) -> Result<()> {
    if !ud {
        return Err(Error::InvalidAttribute);
    }
    if !matches!(wr.op, SendOp::Send | SendOp::SendImm { .. }) {
        return Err(Error::Unsupported);
    }
    if remote_qpn >> 24 != 0 {
        return Err(Error::InvalidQpn);
    }
    Ok(())
}

impl VerbsDevice {
    /// Whether UD QPs and address handles can be made here.
    pub(super) fn ud_capable(&self) -> bool {
        match self.direct {
            Some((kind, _)) => kind == super::uverbs::Kind::Rxe,
            None => self.on_fallback() && self.port.transport != Transport::Iwarp,
        }
    }

    /// `Backend::ready_ud`: INIT (P_Key index 0, the port, `qkey`), RTR,
    /// RTS (a random send PSN). A failure after INIT moves the QP back to
    /// RESET, so a refused call leaves it as it was.
    pub(super) fn ud_ready(&self, qpn: u32, qkey: u32) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        if !self.ud_capable() {
            return Err(Error::Unsupported);
        }
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.port.port_num;
        a.qkey = qkey;
        let mask = M::IBV_QP_STATE.0 | M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_QKEY.0;
        self.modify_qp_attr(qpn, &mut a, mask as i32)?;
        let rest = || -> Result<()> {
            // SAFETY: as above.
            let mut a: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
            self.modify_qp_attr(qpn, &mut a, M::IBV_QP_STATE.0 as i32)?;
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
            a.sq_psn = random_psn();
            self.modify_qp_attr(qpn, &mut a, (M::IBV_QP_STATE.0 | M::IBV_QP_SQ_PSN.0) as i32)
        };
        if let Err(e) = rest() {
            // SAFETY: as above.
            let mut a: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RESET;
            let _ = self.modify_qp_attr(qpn, &mut a, M::IBV_QP_STATE.0 as i32);
            return Err(e);
        }
        self.note_state(qpn, QpState::Rts);
        if let Some(t) = self.lock().qps.get(&qpn).and_then(|e| e.track.as_ref()) {
            // Relaxed: read by this QP's poster, which is the thread making
            // it ready (`Qp::ready_ud` takes `&mut`).
            t.qkey.store(qkey, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `Backend::create_driver_ah`: `ibv_create_ah` from the address
    /// vector (LID, SL, and with `is_global` the GRH: GID, source GID
    /// index, hop limit, traffic class, flow label); on rxe's direct rings
    /// our own CREATE_AH from the same fields, the token its `ah_num`.
    pub(super) fn ah_create(&self, pd: u32, port_num: u8, d: &AddressVector) -> Result<DriverAh> {
        if !self.ud_capable() {
            return Err(Error::Unsupported);
        }
        let mut t = self.lock();
        let pdp = t.pds.get(&pd).ok_or(Error::NoSuchObject)?.0 .0;
        if let Some((kind, _)) = self.direct {
            // SAFETY: the device's live context (held by `self.ctx`, which
            // every object outlives: the table entry is dropped before the
            // device); `pdp` is a live PD of it (in the tables).
            let ah = unsafe {
                super::uverbs::UverbsAh::create(self.ctx.ctx, kind, (*pdp).handle, port_num, d)
            }?;
            let token = u64::from(ah.ah_num());
            let h = t.next;
            t.next += 1;
            t.direct_ahs.insert(h, (ah, pd));
            if let Some(p) = t.pds.get_mut(&pd) {
                p.1 += 1;
            }
            return Ok(DriverAh { handle: h, token });
        }
        let mut attr = sys::ibv_ah_attr {
            grh: sys::ibv_global_route {
                dgid: sys::ibv_gid { raw: d.dgid },
                flow_label: d.flow_label,
                sgid_index: d.sgid_index,
                hop_limit: d.hop_limit,
                traffic_class: d.traffic_class,
            },
            dlid: d.dlid,
            sl: d.sl,
            src_path_bits: 0,
            static_rate: 0,
            is_global: u8::from(d.is_global),
            port_num,
        };
        // SAFETY: a live PD; valid attributes.
        let ah = unsafe { sys::ibv_create_ah(pdp, &mut attr) };
        if ah.is_null() {
            return Err(fail_errno("ibv_create_ah"));
        }
        let h = t.next;
        t.next += 1;
        t.ahs.insert(h, (Raw(ah), pd));
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 += 1;
        }
        Ok(DriverAh {
            handle: h,
            token: ah as usize as u64,
        })
    }

    /// `Backend::destroy_driver_ah`.
    pub(super) fn ah_destroy(&self, handle: u32) -> Result<()> {
        let mut t = self.lock();
        if let Some((ah, pd)) = t.direct_ahs.remove(&handle) {
            if let Some(p) = t.pds.get_mut(&pd) {
                p.1 -= 1;
            }
            // No post uses it any more (the API's `Ah` is being dropped);
            // a kernel refusal leaves it to the context's close.
            return ah.destroy();
        }
        let (raw, pd) = t.ahs.get(&handle).ok_or(Error::NoSuchObject)?;
        let pd = *pd;
        // SAFETY: a live AH owned by this table; no post uses it any more
        // (the API's `Ah` is being dropped).
        super::check("ibv_destroy_ah", unsafe { sys::ibv_destroy_ah(raw.0) })?;
        t.ahs.remove(&handle);
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 -= 1;
        }
        Ok(())
    }
}
