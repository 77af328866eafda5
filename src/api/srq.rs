//! A shared receive queue ([`Srq`]): one pool of receives that many RC
//! QPs of a protection domain take from, its limit event, and the CQ
//! route ([`SrqRoute`]) that completes its receives.
//!
//! Ownership follows [`super::Qp`] and [`super::Cq`]: the `Srq` handle
//! owns the ring's producer side (the core's
//! [`crate::provider::mlx5::Srq`]: free list, side table, doorbell record)
//! and is used through `&mut` by one thread; what the QPs need to stay
//! valid (the device's SRQ and its memory, the count of attached QPs, the
//! sizing guard's account) is in an `Arc` shared with every QP attached to
//! it. A QP names the SRQ at creation through [`QpInit::srq`](crate::attr::QpInit::srq)
//! ([`Srq::id`]); completions of its receives are polled through
//! [`Srq::route`], which hands the SRQ's free list to the CQ poller
//! (docs/spec/mlx5.md §11).

use std::any::Any;
use std::boxed::Box;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::vec;
use std::vec::Vec;

use core::ptr::NonNull;

use crate::attr::{SrqAttr, SrqId};
use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::{self, CqRoute, CqRouteTo, QpQueues, SrqSlot};
use crate::wr::RecvWr;

use super::cq::{CqDemand, CqInner};
use super::device::{Pd, PdInner};
use super::shared_qp::SharedRetirer;
use super::{Backend, RawSrqPath, SrqDriver};

/// Keys for [`SrqId::key`]: one per SRQ the API creates, never reused.
static NEXT_KEY: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);

/// What the QPs attached to an SRQ share with it.
pub(super) struct SrqInner<B: Backend> {
    pub(super) pd: Arc<PdInner<B>>,
    pub(super) srqn: u32,
    pub(super) key: u64,
    /// Granted sizes (the limit is the device's to report).
    pub(super) attr: SrqAttr,
    pub(super) uses: Mutex<SrqUses<B>>,
    _keep: Arc<dyn Any + Send + Sync>,
}

/// The SRQ's attachments, changed on the control path only.
pub(super) struct SrqUses<B: Backend> {
    /// QPs attached.
    attached: u32,
    /// [`Srq::destroy`] succeeded: no QP may attach, nothing may be posted.
    pub(super) destroyed: bool,
    /// The receive CQs of the attached QPs, each with how many of them
    /// use it. Every receive of the SRQ may complete on any of these CQs,
    /// so the sizing guard counts the SRQ's `max_wr` once on each (not
    /// once per QP).
    cqs: Vec<(Arc<CqInner<B>>, u32)>,
}

impl<B: Backend> SrqInner<B> {
    pub(super) fn lock(&self) -> MutexGuard<'_, SrqUses<B>> {
        // A panic while holding it cannot leave the counts torn (each
        // change is one statement after the checks).
        self.uses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sizing guard's share of this SRQ on `rcq`, taken by a QP being
    /// attached (first QP on that CQ: the SRQ's `max_wr` is committed, or
    /// [`Error::CqTooSmall`] and nothing changes).
    pub(super) fn attach(&self, uses: &mut SrqUses<B>, rcq: &Arc<CqInner<B>>) -> Result<()> {
        if let Some(e) = uses.cqs.iter_mut().find(|(c, _)| Arc::ptr_eq(c, rcq)) {
            e.1 += 1;
        } else {
            self.demand().commit(rcq, rcq)?;
            uses.cqs.push((Arc::clone(rcq), 1));
        }
        uses.attached += 1;
        Ok(())
    }

    /// Undoes [`SrqInner::attach`] for a QP that goes away.
    pub(super) fn detach(&self, rcq: &Arc<CqInner<B>>) {
        let mut uses = self.lock();
        uses.attached = uses.attached.saturating_sub(1);
        if let Some(i) = uses.cqs.iter().position(|(c, _)| Arc::ptr_eq(c, rcq)) {
            uses.cqs[i].1 -= 1;
            if uses.cqs[i].1 == 0 {
                let (c, _) = uses.cqs.swap_remove(i);
                self.demand().release(&c, &c);
            }
        }
    }

    fn demand(&self) -> CqDemand {
        CqDemand {
            send: 0,
            recv: u64::from(self.attr.max_wr),
        }
    }
}

impl<B: Backend> Drop for SrqInner<B> {
    fn drop(&mut self) {
        // Every QP attached holds this Arc, so none is left.
        let destroyed = self.lock().destroyed;
        if !destroyed {
            let _ = self.pd.b.destroy_srq(self.srqn);
        }
    }
}

/// The producer side of the SRQ.
enum SrqQueue {
    /// The mlx5 ring and its side table.
    Mlx5 {
        q: mlx5::Srq,
        // The side table the queue points into; boxed so moves keep it put.
        _slots: Box<[SrqSlot]>,
    },
    /// A provider-posted SRQ ([`SrqDriver`]).
    Driver(Box<dyn SrqDriver>),
}

/// A shared receive queue (`ibv_srq`): receives posted here are taken, in
/// any order, by whichever attached QP a SEND (or RDMA WRITE with
/// immediate) arrives at. Posting needs `&mut`, like [`super::Qp`]; the
/// completions come on each QP's receive CQ and are polled through
/// [`Srq::route`].
///
/// Drop the QPs before their SRQ: until the last attached QP is gone the
/// device keeps the SRQ (its receives can still be taken), but without
/// this handle their completions cannot be polled.
pub struct Srq<B: Backend> {
    inner: Arc<SrqInner<B>>,
    /// `None` once destroyed.
    queue: Option<SrqQueue>,
}

// SAFETY: the core queue only names memory kept alive by `inner` (the
// backend's keep-alive) and the boxed side table owned here (a driver
// queue is `Send` itself); an `Srq` is used by one thread at a time
// (`&mut` for every data-path call).
unsafe impl<B: Backend> Send for Srq<B> {}

impl<B: Backend> Pd<B> {
    /// Creates a shared receive queue for at least `max_wr` receives of up
    /// to `max_sge` scatter entries each (both at least 1; the device's
    /// limits decide the rest, the software device's being 32767 and 31).
    /// The granted sizes are in [`Srq::max_wr`] and [`Srq::max_sge`].
    /// Sizes out of range are [`Error::InvalidAttribute`]; a backend
    /// without SRQs is [`Error::Unsupported`] (the verbs backend has them
    /// on its fallback data path and on the direct rxe/siw rings; on the
    /// mlx5 direct path they are [`Error::Unsupported`], see
    /// docs/status.md).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq<B>> {
        if max_wr == 0 || max_sge == 0 {
            return Err(Error::InvalidAttribute);
        }
        let b = &self.inner.b;
        let (queue, srqn, attr, keep) = match b.create_srq(self.inner.pd, max_wr, max_sge) {
            Ok(raw) => {
                let RawSrqPath::Mlx5(geo) = raw.path;
                match Self::mlx5_queue(&geo) {
                    Ok(q) => (q, raw.srqn, raw.attr, raw.keep),
                    Err(e) => {
                        let _ = b.destroy_srq(raw.srqn);
                        return Err(e);
                    }
                }
            }
            Err(Error::Unsupported) => {
                let raw = b.create_driver_srq(self.inner.pd, max_wr, max_sge)?;
                (SrqQueue::Driver(raw.driver), raw.srqn, raw.attr, raw.keep)
            }
            Err(e) => return Err(e),
        };
        let inner = Arc::new(SrqInner {
            pd: Arc::clone(&self.inner),
            srqn,
            key: NEXT_KEY.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
            attr,
            uses: Mutex::new(SrqUses {
                attached: 0,
                destroyed: false,
                cqs: Vec::new(),
            }),
            _keep: keep,
        });
        let mut reg = self.inner.srqs();
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&inner));
        Ok(Srq {
            inner,
            queue: Some(queue),
        })
    }

    /// The core's producer side over an mlx5 SRQ ring, with its side table.
    fn mlx5_queue(geo: &mlx5::SrqGeometry) -> Result<SrqQueue> {
        let mut slots = vec![SrqSlot::default(); geo.nwqes as usize].into_boxed_slice();
        // SAFETY: the geometry names queue memory kept alive by `raw.keep`
        // (held by `SrqInner` for as long as this queue exists); the side
        // table is boxed and owned next to the queue; SGEs posted through
        // the safe API are checked by the device against registered regions
        // before any access, and scatter-to-CQE is off on the API's pollers.
        let made = NonNull::new(slots.as_mut_ptr())
            .ok_or(Error::InvalidGeometry)
            .and_then(|p| unsafe { mlx5::Srq::from_raw(geo, p, slots.len()) })?;
        Ok(SrqQueue::Mlx5 {
            q: made,
            _slots: slots,
        })
    }

    /// The live SRQ of this PD that `id` names ([`Error::NoSuchObject`]
    /// if none: never made here, dropped, or another SRQ now has the
    /// number).
    pub(super) fn find_srq(&self, id: SrqId) -> Result<Arc<SrqInner<B>>> {
        self.inner
            .srqs()
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.srqn == id.srqn && s.key == id.key)
            .ok_or(Error::NoSuchObject)
    }
}

impl<B: Backend> Srq<B> {
    /// SRQ number (what [`super::AsyncEvent::SrqLimitReached`] names).
    pub fn srqn(&self) -> u32 {
        self.inner.srqn
    }

    /// What [`QpInit::srq`](crate::attr::QpInit::srq) takes to attach a new QP (of this SRQ's PD)
    /// to this SRQ.
    pub fn id(&self) -> SrqId {
        SrqId {
            srqn: self.inner.srqn,
            key: self.inner.key,
        }
    }

    /// Receives the SRQ holds at once (as granted: at least what was asked
    /// for).
    pub fn max_wr(&self) -> u32 {
        self.inner.attr.max_wr
    }

    /// Scatter entries per receive (as granted).
    pub fn max_sge(&self) -> u32 {
        self.inner.attr.max_sge
    }

    /// QPs attached now.
    pub fn attached(&self) -> u32 {
        self.inner.lock().attached
    }

    /// Whether [`Srq::destroy`] has succeeded.
    pub fn is_destroyed(&self) -> bool {
        self.queue.is_none()
    }

    /// Posts receives with one doorbell-record update
    /// (`ibv_post_srq_recv`). Stops at the first refused WR: the ones
    /// before it are posted, and the error comes with the failed WR's
    /// index; nothing is written for the failed WR. Errors:
    /// [`Error::TooManySges`] (more than [`Srq::max_sge`]),
    /// [`Error::LengthOverflow`], [`Error::RqFull`] (every WQE is posted or
    /// completed-but-not-polled: poll the CQs), and
    /// [`Error::NoSuchObject`] once the SRQ is destroyed.
    ///
    /// Zero-length SGEs are posted as they are (libmlx5 does the same on
    /// an SRQ); the device scatters nothing into them.
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let Some(s) = self.queue.as_mut() else {
            return Err(PostError {
                index: 0,
                error: Error::NoSuchObject,
            });
        };
        match s {
            // SAFETY: SGEs only reach the device, which checks every one
            // against registered regions (lkey, bounds, PD, access) before
            // any access; scatter-to-CQE is disabled on the API's pollers.
            SrqQueue::Mlx5 { q, .. } => unsafe { q.post_list(wrs) },
            SrqQueue::Driver(d) => d.post_recv(wrs),
        }
    }

    /// Posts one receive and updates the doorbell record (as
    /// [`Srq::post_recv`]).
    #[inline]
    pub fn post_recv_one(&mut self, wr: &RecvWr<'_>) -> Result<()> {
        self.post_recv(core::slice::from_ref(wr))
            .map_err(|e| e.error)
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the device
    /// raises one [`super::AsyncEvent::SrqLimitReached`] when it takes a
    /// receive and fewer than `limit` posted receives are left, and the
    /// limit is disarmed by it; arm again for another event. 0 disarms.
    /// A limit above [`Srq::max_wr`] is [`Error::InvalidAttribute`] and
    /// changes nothing; a destroyed SRQ is [`Error::NoSuchObject`].
    pub fn arm_limit(&mut self, limit: u32) -> Result<()> {
        if self.queue.is_none() {
            return Err(Error::NoSuchObject);
        }
        if limit > self.inner.attr.max_wr {
            return Err(Error::InvalidAttribute);
        }
        self.inner.pd.b.arm_srq_limit(self.inner.srqn, limit)
    }

    /// The SRQ's sizes and its armed limit as the device has it (0 when
    /// not armed, including after the limit event fired; except on siw's
    /// direct rings, whose kernel keeps reporting the last armed limit
    /// after the event: docs/status.md).
    pub fn query(&self) -> Result<SrqAttr> {
        if self.queue.is_none() {
            return Err(Error::NoSuchObject);
        }
        self.inner.pd.b.query_srq(self.inner.srqn)
    }

    /// Destroys the SRQ now. While QPs are attached it is refused with
    /// [`Error::ResourceBusy`] and nothing changes (posted receives stay
    /// posted). Afterwards every call on this handle is
    /// [`Error::NoSuchObject`]; receives still posted are simply dropped
    /// with the queue, as `ibv_destroy_srq` drops them. Dropping the
    /// handle destroys the SRQ too (once the last attached QP is gone).
    pub fn destroy(&mut self) -> Result<()> {
        if self.queue.is_none() {
            return Err(Error::NoSuchObject);
        }
        let mut uses = self.inner.lock();
        if uses.attached != 0 {
            return Err(Error::ResourceBusy);
        }
        self.inner.pd.b.destroy_srq(self.inner.srqn)?;
        uses.destroyed = true;
        drop(uses);
        self.queue = None;
        Ok(())
    }

    /// The route for polling a CQ that carries completions of QPs on this
    /// SRQ: `qps` (one [`super::Qp`] or a slice of `&mut Qp`) for their
    /// send completions and their own receive queues, this SRQ for the
    /// receives it gave out. Each completed receive returns its WQE to the
    /// SRQ's free list (in any order) and reports the SRQ receive's
    /// `wr_id`, with the QP's number in `qp_num`.
    ///
    /// A CQ that carries SRQ receive completions must be polled through
    /// this route: a route without the SRQ reports such an entry as
    /// [`Error::CqeCorrupt`] (it names no receive of the QP's own).
    ///
    /// On a provider-posted SRQ (the verbs fallback, [`SrqDriver`]) the
    /// route is a pass-through: its CQs are driver CQs
    /// ([`super::CqDriver`]), whose poller maps every completion back to
    /// the user's wr_id and returns the SRQ's slot itself (a CQ polled
    /// without this route reports the same completions). Polling through
    /// it keeps one program correct on every path.
    pub fn route<'a, R: CqRoute + ?Sized>(&'a mut self, qps: &'a mut R) -> SrqRoute<'a, B, R> {
        SrqRoute { srq: self, qps }
    }

    /// [`Srq::route`] for shared QPs on this SRQ: `pollers` (one
    /// [`super::SharedQpPoller`] or a slice of `&mut` ones) for their send
    /// completions, this SRQ for the receives, polled with
    /// [`super::Cq::poll_shared`].
    pub fn route_shared<'a, R: CqRouteTo<SharedRetirer<B>> + ?Sized>(
        &'a mut self,
        pollers: &'a mut R,
    ) -> SrqSharedRoute<'a, B, R> {
        SrqSharedRoute { srq: self, pollers }
    }

    /// The mlx5 SRQ a responder completion names by `srqn_uidx` (the low
    /// 24 bits: the SRQ number with CQE version 0; docs/spec/mlx5.md §11),
    /// if it is this one.
    #[inline]
    fn named_by(&mut self, srqn_uidx: u32) -> Option<&mut mlx5::Srq> {
        if srqn_uidx != self.inner.srqn & 0x00ff_ffff {
            return None;
        }
        match self.queue.as_mut() {
            Some(SrqQueue::Mlx5 { q, .. }) => Some(q),
            // A driver SRQ's receives complete on a driver CQ, which never
            // asks the route.
            _ => None,
        }
    }
}

/// A CQ route through one SRQ and a set of shared QPs
/// ([`Srq::route_shared`]).
pub struct SrqSharedRoute<'a, B: Backend, R: CqRouteTo<SharedRetirer<B>> + ?Sized> {
    srq: &'a mut Srq<B>,
    pollers: &'a mut R,
}

impl<B: Backend, R: CqRouteTo<SharedRetirer<B>> + ?Sized> CqRouteTo<SharedRetirer<B>>
    for SrqSharedRoute<'_, B, R>
{
    #[inline(always)]
    fn route_to(&mut self, qpn: u32) -> Option<QpQueues<'_, SharedRetirer<B>>> {
        self.pollers.route_to(qpn)
    }
    #[inline(always)]
    fn busy(&self) -> bool {
        self.pollers.busy()
    }
    #[inline]
    fn srq_for(&mut self, _qpn: u32, srqn_uidx: u32) -> Option<&mut mlx5::Srq> {
        self.srq.named_by(srqn_uidx)
    }
}

/// A CQ route through one SRQ and a set of QPs ([`Srq::route`]).
pub struct SrqRoute<'a, B: Backend, R: CqRoute + ?Sized> {
    srq: &'a mut Srq<B>,
    qps: &'a mut R,
}

impl<B: Backend, R: CqRoute + ?Sized> CqRoute for SrqRoute<'_, B, R> {
    #[inline(always)]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.qps.route(qpn)
    }
    #[inline(always)]
    fn busy(&self) -> bool {
        self.qps.busy()
    }
    #[inline]
    fn srq_for(&mut self, _qpn: u32, srqn_uidx: u32) -> Option<&mut mlx5::Srq> {
        self.srq.named_by(srqn_uidx)
    }
}
