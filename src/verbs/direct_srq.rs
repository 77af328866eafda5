//! Shared receive queues on the rxe/siw direct rings: our own CREATE_SRQ
//! ([`uverbs::UverbsSrq`]), its ring written with the receive-queue codecs
//! (an SRQ has an RQ's layout on both devices: docs/spec/rxe.md §7,
//! docs/spec/siw.md §5), and the wr_id table its completions map back
//! through ([`SrqTrack`], the fallback's).
//!
//! Receives carry `RECV_BIT | SRQ_BIT | gen << 24 | slot` in the ring, as
//! on the fallback; the direct CQ's poller ([`super::path::RegistryView`])
//! routes a completion with that id to the SRQ of the QP it names, and a
//! slot that is not outstanding under exactly that id is
//! [`Error::CqeCorrupt`]. No system call: the kernel reads the ring when
//! a message arrives at any QP on the SRQ.

use std::boxed::Box;
use std::sync::Arc;

use super::device::SrqEntry;
use super::direct::{RecvRing, BATCH};
use super::path::{SrqPoster, SrqTrack};
use super::{uverbs, Raw, VerbsDevice};
use crate::api::{RawDriverSrq, SrqDriver};
use crate::attr::SrqAttr;
use crate::error::{Error, PostError, Result};
use crate::provider::{rxe, siw};
use crate::wr::{QpCaps, RecvWr, Sge};

/// The posting side of a direct SRQ.
pub(crate) struct DirectSrq {
    /// Keeps the ring mapped (the kernel object is destroyed by
    /// `srq_destroy`, the mapping when this goes).
    _srq: Arc<uverbs::UverbsSrq>,
    ring: RecvRing,
    poster: SrqPoster,
}

impl SrqDriver for DirectSrq {
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let none: &[Sge] = &[];
        let mut buf = [RecvWr {
            wr_id: 0,
            sges: none,
        }; BATCH];
        let mut done = 0usize;
        while done < wrs.len() {
            let mut n = 0usize;
            let mut refused = None;
            while done + n < wrs.len() && n < BATCH {
                let wr = &wrs[done + n];
                // Room in the table; the ring's encoder validates the WR
                // (typed errors, before writing anything) and checks the
                // ring's own room.
                let Some(tag) = self.poster.publish(wr.wr_id) else {
                    refused = Some(Error::RqFull);
                    break;
                };
                buf[n] = RecvWr {
                    wr_id: tag,
                    sges: wr.sges,
                };
                n += 1;
            }
            if n > 0 {
                // SAFETY: SGEs name memory registered with this device (the
                // kernel checks every one against its MR table, lkey, PD
                // and access, before writing).
                if let Err(e) = unsafe { self.ring.post(&buf[..n]) } {
                    // The ring took the WRs before `e.index`; the rest were
                    // never written, so their slots are free again.
                    for w in &buf[e.index..n] {
                        self.poster.unpublish(w.wr_id);
                    }
                    return Err(PostError {
                        index: done + e.index,
                        error: e.error,
                    });
                }
                done += n;
            }
            if let Some(e) = refused {
                return Err(PostError {
                    index: done,
                    error: e,
                });
            }
        }
        Ok(())
    }
}

impl VerbsDevice {
    /// An SRQ on the rxe/siw direct rings (sizes already checked against
    /// the device's limits): our own CREATE_SRQ on the PD libibverbs made,
    /// the ring mapped and handed to the receive codec. The granted size is
    /// what the ring holds (rxe: slots - 1, siw: slots), so the table and
    /// the ring fill up together.
    pub(super) fn create_direct_srq(
        &self,
        kind: uverbs::Kind,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<RawDriverSrq> {
        let mut t = self.lock();
        let pdp = t.pds.get(&pd).ok_or(Error::NoSuchObject)?.0 .0;
        let h = t.next;
        t.next += 1;
        // SAFETY: the device's live context, kept open by `self.ctx` (the
        // SRQ handle holds it through `keep`); `pdp` is a live PD of it.
        let srq = Arc::new(unsafe {
            uverbs::UverbsSrq::create(
                self.ctx.ctx,
                kind,
                (*pdp).handle,
                max_wr,
                max_sge,
                u64::from(h),
            )
        }?);
        let caps = QpCaps {
            max_send_sge: 0,
            max_inline_data: 0,
            max_recv_sge: srq.max_sge(),
        };
        let ring = match kind {
            // SAFETY: the SRQ's own mapping, alive while `srq` is (the
            // DirectSrq holds it); only the DirectSrq writes it.
            uverbs::Kind::Rxe => RecvRing::Rxe(unsafe {
                rxe::RxeRecvQueue::new(srq.ring_ptr(), srq.ring_len(), &caps)
            }?),
            // SAFETY: as above; the element count is the kernel's.
            uverbs::Kind::Siw => RecvRing::Siw(unsafe {
                siw::SiwRecvQueue::new(srq.ring_ptr(), srq.ring_len(), srq.ring().slots, &caps)
            }?),
        };
        let cap = ring.capacity();
        if cap < max_wr {
            // Smaller than asked: the kernel's sizes make no sense.
            return Err(Error::InvalidGeometry);
        }
        let track = Arc::new(SrqTrack::new(cap));
        let attr = SrqAttr {
            max_wr: track.capacity(),
            max_sge: caps.max_recv_sge,
            srq_limit: 0,
        };
        t.srqs.insert(
            h,
            SrqEntry {
                srq: Raw(core::ptr::null_mut()),
                direct: Some(Arc::clone(&srq)),
                track: Arc::clone(&track),
                pd,
                qps: 0,
            },
        );
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 += 1;
        }
        Ok(RawDriverSrq {
            driver: Box::new(DirectSrq {
                _srq: srq,
                ring,
                poster: SrqPoster::new(track),
            }),
            srqn: h,
            attr,
            keep: self.ctx.clone(),
        })
    }
}
