//! The device side of the rxe/siw direct path: creating direct CQs and
//! QPs (our own uverbs objects, rings mapped and handed to the codecs),
//! and their async events. The data path itself is in `direct`.

use std::sync::Arc;

use super::direct::{CqRing, DirectCq, DirectQp, RecvRing, SendRing};
use super::path::CqRegistry;
use super::uverbs::UverbsCq;
use super::{path as vpath, uverbs, CqEntry, Raw, VerbsDevice};
use crate::api::{RawCq, RawCqPath, RawQp, RawQpPath};
use crate::attr::QpInit;
use crate::error::{Error, Result};
use crate::provider::{rxe, siw};
use crate::wr::QpCaps;

impl VerbsDevice {
    /// A CQ on the rxe/siw direct path: our own CREATE_CQ with our own
    /// completion channel, the ring mapped and handed to the codec.
    pub(super) fn create_direct_cq(&self, kind: uverbs::Kind, depth: u32) -> Result<RawCq> {
        let cqn = {
            let mut t = self.lock();
            let h = t.next;
            t.next += 1;
            h
        };
        // SAFETY: the device's live context, kept open by `self.ctx`
        // (every CQ handle holds it through `keep`).
        let ch = Arc::new(unsafe { uverbs::CompChannel::create(self.ctx.ctx) }?);
        // SAFETY: as above; the channel is this context's.
        let cq = Arc::new(unsafe {
            uverbs::UverbsCq::create(
                self.ctx.ctx,
                kind,
                depth.max(1),
                Some(ch.fd()),
                u64::from(cqn),
            )
        }?);
        let ring = match kind {
            uverbs::Kind::Rxe => {
                // SAFETY: the CQ's own mapping, alive while `cq` is (the
                // DirectCq holds it).
                let c = unsafe { rxe::RxeCq::new(cq.ring_ptr(), cq.ring_len()) }?;
                CqRing::Rxe(c)
            }
            uverbs::Kind::Siw => {
                // SAFETY: as above; `entries` is the kernel's num_cqe.
                let c = unsafe { siw::SiwCq::new(cq.ring_ptr(), cq.ring_len(), cq.entries()) }?;
                CqRing::Siw(c)
            }
        };
        let registry = Arc::new(CqRegistry::default());
        let poller = DirectCq::new(Arc::clone(&cq), ring, Arc::clone(&registry));
        self.lock().cqs.insert(
            cqn,
            CqEntry {
                cq: Raw(core::ptr::null_mut()),
                channel: Raw(core::ptr::null_mut()),
                direct: Some((cq, ch)),
                registry,
                qps: 0,
            },
        );
        Ok(RawCq {
            path: RawCqPath::Driver(std::boxed::Box::new(poller)),
            cqn,
            keep: self.ctx.clone(),
        })
    }

    /// An RC QP on the rxe/siw direct path: our own CREATE_QP on the PD
    /// libibverbs made, both rings mapped and handed to the codecs; or,
    /// on an SRQ ([`QpInit::srq`]), the send ring alone, its receives
    /// taken from the SRQ's ring (`super::direct_srq`). With `ud`, a UD
    /// QP (rxe only, docs/spec/rxe.md §8).
    pub(super) fn create_direct_qp(
        &self,
        kind: uverbs::Kind,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        init: &QpInit,
        ud: bool,
    ) -> Result<RawQp> {
        if ud && kind != uverbs::Kind::Rxe {
            return Err(Error::Unsupported);
        }
        let c = &self.caps;
        if init.max_send_wr == 0
            || (c.max_qp_wr != 0
                && (init.max_send_wr > c.max_qp_wr || init.max_recv_wr > c.max_qp_wr))
            || (c.max_sge != 0 && (init.max_send_sge > c.max_sge || init.max_recv_sge > c.max_sge))
        {
            return Err(Error::InvalidAttribute);
        }
        let mut t = self.lock();
        let pdp = t.pds.get(&pd).ok_or(Error::NoSuchObject)?.0 .0;
        let cq_of = |n: u32| -> Result<Arc<UverbsCq>> {
            let e = t.cqs.get(&n).ok_or(Error::NoSuchObject)?;
            e.direct
                .as_ref()
                .map(|(cq, _)| Arc::clone(cq))
                .ok_or(Error::InvalidAttribute)
        };
        let (scq, rcq) = (cq_of(send_cq)?, cq_of(recv_cq)?);
        // The SRQ the QP takes its receives from: a direct one of this PD.
        let srq = match init.srq {
            None => None,
            Some(id) => {
                let e = t.srqs.get(&id.srqn).ok_or(Error::NoSuchObject)?;
                if e.pd != pd {
                    return Err(Error::InvalidAttribute);
                }
                let d = e.direct.as_ref().ok_or(Error::InvalidAttribute)?;
                Some((id.srqn, Arc::clone(d), Arc::clone(&e.track)))
            }
        };
        let uh = u64::from(t.next);
        t.next += 1;
        let want = QpInit {
            max_recv_wr: init.max_recv_wr.max(1),
            max_send_sge: init.max_send_sge.max(1),
            max_recv_sge: init.max_recv_sge.max(1),
            ..*init
        };
        // SAFETY: live context (held by the device); `pdp` is a live PD of
        // it (in the tables); the CQs and the SRQ are this context's, and
        // the SRQ is not destroyed while the QP is attached (`srq_destroy`
        // refuses while its count is not 0, and the kernel while the QP
        // exists).
        let qp = Arc::new(unsafe {
            match &srq {
                _ if ud => uverbs::UverbsQp::create_ud(
                    self.ctx.ctx,
                    kind,
                    (*pdp).handle,
                    &scq,
                    &rcq,
                    srq.as_ref().map(|(_, s, _)| &**s),
                    &want,
                    uh,
                ),
                None => uverbs::UverbsQp::create(
                    self.ctx.ctx,
                    kind,
                    (*pdp).handle,
                    &scq,
                    &rcq,
                    &want,
                    false,
                    uh,
                ),
                Some((_, s, _)) => uverbs::UverbsQp::create_on_srq(
                    self.ctx.ctx,
                    kind,
                    (*pdp).handle,
                    &scq,
                    &rcq,
                    s,
                    &want,
                    false,
                    uh,
                ),
            }
        }?);
        let caps = QpCaps {
            max_send_sge: want.max_send_sge,
            max_inline_data: want.max_inline_data,
            // A QP on an SRQ has no receive queue of its own.
            max_recv_sge: if srq.is_some() { 0 } else { want.max_recv_sge },
        };
        let sq_view = qp.sq().ok_or(Error::InvalidGeometry)?;
        let rq_view = qp.rq();
        let (sq, rq) = match kind {
            uverbs::Kind::Rxe => {
                // SAFETY: the QP's own mappings, alive while `qp` is (the
                // DirectQp holds it); SGEs are checked by the kernel.
                let sq = SendRing::Rxe(unsafe {
                    rxe::RxeSendQueue::new(qp.sq_ptr(), qp.sq_len(), caps)
                }?);
                let rq = match rq_view {
                    // SAFETY: as above.
                    Some(_) => Some(RecvRing::Rxe(unsafe {
                        rxe::RxeRecvQueue::new(qp.rq_ptr(), qp.rq_len(), &caps)
                    }?)),
                    None => None,
                };
                (sq, rq)
            }
            uverbs::Kind::Siw => {
                // SAFETY: as above; the element counts are the kernel's.
                let sq = SendRing::Siw(unsafe {
                    siw::SiwSendQueue::new(qp.sq_ptr(), qp.sq_len(), sq_view.slots, caps, false)
                }?);
                let rq = match rq_view {
                    // SAFETY: as above.
                    Some(v) => Some(RecvRing::Siw(unsafe {
                        siw::SiwRecvQueue::new(qp.rq_ptr(), qp.rq_len(), v.slots, &caps)
                    }?)),
                    None => None,
                };
                (sq, rq)
            }
        };
        let qpn = qp.qp_num();
        let (sq_cap, rq_cap) = DirectQp::ring_capacity(&sq, rq.as_ref());
        let track = vpath::QpTrack::new(qpn, sq_cap, rq_cap.max(1));
        let track = Arc::new(match &srq {
            Some((_, _, st)) => track.on_srq(Arc::clone(st)),
            None => track,
        });
        let atomics = self.caps.atomics && kind == uverbs::Kind::Rxe && !ud;
        let mut dq = DirectQp::new(
            Arc::clone(&qp),
            [scq, rcq],
            sq,
            rq,
            Arc::clone(&track),
            atomics,
        );
        if ud {
            dq = dq.datagram();
        }
        t.qp_handles.insert(uh, qpn);
        self.register_qp(
            &mut t,
            qpn,
            core::ptr::null_mut(),
            Some(track),
            None,
            Some(qp),
            pd,
            [send_cq, recv_cq],
        );
        if let Some((h, _, _)) = srq {
            if let Some(e) = t.srqs.get_mut(&h) {
                e.qps += 1;
            }
            if let Some(q) = t.qps.get_mut(&qpn) {
                q.srq = Some(h);
            }
        }
        Ok(RawQp {
            path: RawQpPath::Driver(std::boxed::Box::new(dq)),
            qpn,
            caps,
            psn: super::random_psn(),
            keep: self.ctx.clone(),
        })
    }

    /// The next async event of a direct-path context, read from its fd.
    pub(super) fn poll_direct_async_event(
        &self,
        reader: &uverbs::AsyncEvents,
    ) -> Result<Option<crate::api::AsyncEvent>> {
        use crate::api::AsyncEvent as E;
        let Some(ev) = reader.poll_async_event()? else {
            return Ok(None);
        };
        let kind = ev.event_type;
        let qpn = || -> Option<u32> { self.lock().qp_handles.get(&ev.element).copied() };
        let cqn = u32::try_from(ev.element).unwrap_or(u32::MAX);
        let port = u8::try_from(ev.element).unwrap_or(0);
        let qp_event = |mk: fn(u32) -> E| match qpn() {
            Some(q) => mk(q),
            None => E::Other { kind, element: cqn },
        };
        Ok(Some(match kind {
            0 => E::CqError { cqn },
            1 => qp_event(|qpn| E::QpFatal { qpn }),
            2 => qp_event(|qpn| E::QpRequestError { qpn }),
            3 => qp_event(|qpn| E::QpAccessError { qpn }),
            4 => qp_event(|qpn| E::CommEstablished { qpn }),
            5 => qp_event(|qpn| E::SqDrained { qpn }),
            16 => qp_event(|qpn| E::LastWqeReached { qpn }),
            // IB_EVENT_SRQ_LIMIT_REACHED: the element is the user_handle
            // our CREATE_SRQ gave, the SRQ's table handle
            // (`create_direct_srq`). IB_EVENT_SRQ_ERR (14) stays `Other`.
            15 => {
                let srqn = u32::try_from(ev.element)
                    .ok()
                    .filter(|h| self.lock().srqs.get(h).is_some_and(|e| e.direct.is_some()));
                match srqn {
                    Some(srqn) => E::SrqLimitReached { srqn },
                    None => E::Other { kind, element: cqn },
                }
            }
            8 => E::DeviceFatal,
            9 => E::PortActive { port },
            10 => E::PortError { port },
            _ => E::Other { kind, element: cqn },
        }))
    }
}
