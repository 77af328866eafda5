//! The library-owned objects behind the handles (device, PD, MR, CQ, QP)
//! and what they own: buffers, pollers, queues and CQ budgets.

use core::ptr::NonNull;

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::boxed::Box;
use std::sync::Arc;
use std::vec::Vec;

use crate::api::{Backend, Headroom, MrKeys};
use crate::provider::mlx5::{CompletionQueue, Mlx5dvCq, Mlx5dvQp, RecvQueue, SendQueue, WrSlot};
use crate::soft::{Access, SoftDevice};
use crate::wr::QpCaps;

use crate::ffi::status::rdd_status;

use super::srq::{SrqAttach, SrqObj};
use super::srq_route::BoundSrq;
use super::table::{slot_ref, ExclusiveCell, Object, SlotRef};
use super::table::{KIND_CQ, KIND_DEVICE, KIND_MR, KIND_PD, KIND_QP};

// ---------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------

pub(super) struct DeviceObj {
    /// The software device (None for a kernel device).
    pub(super) soft: Option<SoftDevice>,
    pub(super) backend: Arc<dyn Backend>,
    /// The data path its QPs and CQs use (`RDD_DATA_PATH_*`), fixed when
    /// the device is opened.
    pub(super) path: u32,
    /// Cloned by every PD and CQ.
    pub(super) link: Arc<()>,
}

impl Drop for DeviceObj {
    fn drop(&mut self) {
        // The device thread holds the device's state alive: stop it.
        if let Some(s) = &self.soft {
            s.stop();
        }
    }
}

pub(in crate::ffi) struct PdObj {
    pub(super) dev: usize,
    pub(in crate::ffi) backend: Arc<dyn Backend>,
    pub(in crate::ffi) pd: u32,
    /// Cloned by every MR, QP and buffer pool.
    pub(in crate::ffi) link: Arc<()>,
    pub(super) _dev_link: Arc<()>,
}

impl Drop for PdObj {
    fn drop(&mut self) {
        // No MR or QP is left (link count), so the device agrees.
        let _ = self.backend.dealloc_pd(self.pd);
    }
}

/// A zeroed, page-aligned buffer the library owns. The bytes are only
/// ever reached through raw pointers (C code and the device write them),
/// never through Rust references.
pub(super) struct MrBuf {
    pub(super) ptr: NonNull<u8>,
    layout: Layout,
}

impl MrBuf {
    pub(super) fn new(len: usize) -> Option<MrBuf> {
        let layout = Layout::from_size_align(len.max(64), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        Some(MrBuf {
            ptr: NonNull::new(p)?,
            layout,
        })
    }
}

impl Drop for MrBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: plain owned heap memory; the struct itself only hands out the
// address, and whoever writes the bytes (C code, the device) orders its
// accesses through completions.
unsafe impl Send for MrBuf {}
// SAFETY: as above; `&MrBuf` exposes no bytes.
unsafe impl Sync for MrBuf {}

pub(in crate::ffi) struct MrObj {
    pub(in crate::ffi) backend: Arc<dyn Backend>,
    pub(in crate::ffi) pd: u32,
    pub(in crate::ffi) keys: MrKeys,
    pub(in crate::ffi) access: Access,
    pub(in crate::ffi) len: usize,
    pub(super) buf: MrBuf,
    /// Cloned by every exposure of the region (`ffi::expose`).
    pub(in crate::ffi) link: Arc<()>,
    pub(in crate::ffi) pd_link: Arc<()>,
}

impl MrObj {
    /// The buffer's address.
    pub(in crate::ffi) fn addr(&self) -> u64 {
        self.buf.ptr.as_ptr() as u64
    }
}

impl Drop for MrObj {
    fn drop(&mut self) {
        // Deregister first: afterwards the device never touches the
        // buffer, which is freed with the fields.
        let _ = self.backend.dereg_mr(self.keys.lkey);
    }
}

pub(super) struct CqObj {
    pub(super) dev: usize,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) cqn: u32,
    pub(super) cq: ExclusiveCell<CqImpl>,
    /// The sizing guard's account.
    pub(super) budget: Arc<CqBudget>,
    /// The adaptive waiter's learnt state (`rdd_cq_wait`).
    pub(super) adaptive: ExclusiveCell<crate::event::Adaptive>,
    /// Cloned once by every QP that completes here.
    pub(super) link: Arc<()>,
    /// The QPs that complete here (bound by `rdd_qp_create`, unbound by
    /// `rdd_qp_destroy`, both holding this CQ exclusively): the route of
    /// `rdd_cq_poll_n`.
    pub(super) bound: Vec<BoundQp>,
    /// The SRQs whose QPs receive here (bound by `rdd_qp_create_on_srq`,
    /// unbound with their last QP by `rdd_qp_destroy`, both holding this
    /// CQ exclusively): empty unless such a QP exists, and then every poll
    /// routes SRQ receive completions through them (`srq_route.rs`).
    pub(super) srqs: Vec<BoundSrq>,
    /// 0 while `srqs` is empty, `usize::MAX` otherwise: `rdd_cq_poll_n`
    /// compares its `n` with this instead of with 0, so one test it makes
    /// anyway sends both `n` = 0 and a CQ with SRQs out of its fast path.
    pub(super) srq_gate: usize,
    /// The mlx5 descriptor the CQ was made over (`rdd_cq_mlx5_desc`);
    /// None for a provider-polled CQ.
    pub(super) mlx5_dv: Option<CqDesc>,
    pub(super) _keep: Arc<dyn Any + Send + Sync>,
    pub(super) _dev_link: Arc<()>,
}

/// A QP's mlx5 descriptor, kept for `rdd_qp_mlx5_desc`.
pub(super) struct QpDesc(pub(super) Mlx5dvQp);
/// A CQ's mlx5 descriptor, kept for `rdd_cq_mlx5_desc`.
pub(super) struct CqDesc(pub(super) Mlx5dvCq);

// SAFETY: the descriptors are plain copies of addresses and sizes; the
// objects never dereference them (the queues built from them do, under
// their own rules), they only hand the values out.
unsafe impl Send for QpDesc {}
// SAFETY: as above.
unsafe impl Sync for QpDesc {}
// SAFETY: as above.
unsafe impl Send for CqDesc {}
// SAFETY: as above.
unsafe impl Sync for CqDesc {}

/// A QP that completes on a CQ, as the CQ knows it: its number (what a
/// CQE names) and its slot, acquired only when a completion for it
/// arrives.
pub(super) struct BoundQp {
    pub(super) qpn: u32,
    pub(super) slot: SlotRef<QpObj>,
}

impl Drop for CqObj {
    fn drop(&mut self) {
        // No QP uses the CQ (link count); destroy it before its memory
        // (`_keep`) is released with the fields.
        let _ = self.backend.destroy_cq(self.cqn);
    }
}

impl CqObj {
    /// QPs that complete on this CQ.
    pub(super) fn attached(&self) -> usize {
        Arc::strong_count(&self.link) - 1
    }

    /// Records that QP `qpn` (handle `qp`, live) completes here.
    pub(super) fn bind(&mut self, qpn: u32, qp: usize) -> Result<(), rdd_status> {
        let slot = slot_ref::<QpObj>(qp)?;
        self.bound.push(BoundQp { qpn, slot });
        Ok(())
    }

    /// Forgets QP `qpn` (before it is destroyed).
    pub(super) fn unbind(&mut self, qpn: u32) {
        self.bound.retain(|b| b.qpn != qpn);
    }

    /// Records that one more QP of SRQ `srqn` (handle `srq`, live)
    /// receives here.
    pub(super) fn bind_srq(&mut self, srqn: u32, srq: usize) -> Result<(), rdd_status> {
        if let Some(b) = self.srqs.iter_mut().find(|b| b.srqn == srqn) {
            b.qps += 1;
            return Ok(());
        }
        let slot = slot_ref::<SrqObj>(srq)?;
        self.srqs.push(BoundSrq { srqn, slot, qps: 1 });
        self.srq_gate = usize::MAX;
        Ok(())
    }

    /// Undoes one [`CqObj::bind_srq`] (a QP of SRQ `srqn` goes); the SRQ is
    /// forgotten with its last QP here.
    pub(super) fn unbind_srq(&mut self, srqn: u32) {
        if let Some(i) = self.srqs.iter().position(|b| b.srqn == srqn) {
            self.srqs[i].qps -= 1;
            if self.srqs[i].qps == 0 {
                self.srqs.swap_remove(i);
                if self.srqs.is_empty() {
                    self.srq_gate = 0;
                }
            }
        }
    }
}

/// The poller behind a C CQ handle.
pub(super) enum CqImpl {
    /// The crate's mlx5 core (software device, ConnectX).
    Mlx5(CompletionQueue),
    /// A provider-polled CQ (the verbs backend's rxe/siw rings or
    /// libibverbs).
    Driver(Box<dyn crate::api::CqDriver>),
}

impl CqImpl {
    pub(super) fn arm(&mut self, solicited_only: bool) -> crate::error::Result<()> {
        match self {
            CqImpl::Mlx5(cq) => cq.arm(solicited_only),
            CqImpl::Driver(p) if solicited_only => p.arm_solicited(),
            CqImpl::Driver(p) => p.arm(),
        }
    }
}

/// The data path behind a C QP handle.
#[allow(clippy::large_enum_variant)]
pub(super) enum QpImpl {
    /// The crate's mlx5 core (inline: no pointer chase when posting).
    Mlx5(QpQueuesOwned),
    /// A provider-posted QP (the verbs backend's rxe/siw rings or
    /// libibverbs).
    Driver(Box<dyn crate::api::QpDriver>),
}

impl QpImpl {
    /// The first WR that failed since creation or RESET.
    pub(super) fn failure(&self) -> Option<crate::wr::FailedWr> {
        match self {
            QpImpl::Mlx5(q) => q.sq.failure().or(q.rq.failure()),
            QpImpl::Driver(p) => p.failure(),
        }
    }

    /// The state as the data path knows it.
    pub(super) fn state(&self) -> crate::completion::QpState {
        match self {
            QpImpl::Mlx5(q) => q.sq.state(),
            QpImpl::Driver(p) => p.state(),
        }
    }

    /// Send work (mlx5: basic blocks; a driver path: WRs) and receives
    /// posted and not yet completed, separately.
    pub(super) fn outstanding_split(&self) -> (u32, u32) {
        match self {
            QpImpl::Mlx5(q) => (
                q.sq.producer().wrapping_sub(q.sq.retired()),
                q.rq.head().wrapping_sub(q.rq.tail()),
            ),
            QpImpl::Driver(p) => {
                let send = p.capacity().0.saturating_sub(p.send_space());
                let recv = p.outstanding().saturating_sub(u64::from(send));
                (send, u32::try_from(recv).unwrap_or(u32::MAX))
            }
        }
    }

    /// Rings the sends and publishes the receives posted with
    /// `RDD_SEND_DEFER_DOORBELL` and not rung yet (as `rdd_qp_ring` does,
    /// without counting a doorbell): until then the device does not know
    /// that work, so it would never flush it. A driver path defers
    /// nothing.
    pub(super) fn ring_deferred(&mut self) {
        match self {
            QpImpl::Mlx5(q) => {
                q.rq.ring();
                q.sq.ring();
            }
            QpImpl::Driver(p) => {
                // rxe: publishes deferred sends so the kernel flushes them
                // (the drain marker would, but a full ring has no room for
                // it); siw took them back when the QP moved to ERROR. A
                // failed system call leaves them owed to the marker.
                let _ = p.ring();
            }
        }
    }

    /// Recovery's drain marker (see `api::Qp::drain_and_reset`).
    pub(super) fn post_drain_marker(&mut self) -> crate::error::Result<bool> {
        match self {
            QpImpl::Mlx5(q) => q.sq.post_drain_marker(),
            QpImpl::Driver(p) => p.post_drain_marker(),
        }
    }

    /// Send and receive WRs posted and not yet completed.
    pub(super) fn outstanding(&self) -> u64 {
        match self {
            QpImpl::Mlx5(q) => {
                u64::from(q.sq.producer().wrapping_sub(q.sq.retired()))
                    + u64::from(q.rq.head().wrapping_sub(q.rq.tail()))
            }
            QpImpl::Driver(p) => p.outstanding(),
        }
    }
}

pub(super) struct QpQueuesOwned {
    pub(super) sq: SendQueue,
    pub(super) rq: RecvQueue,
}

/// A CQ's sizing-guard account (as `api::Cq`'s): its depth, the worst-case
/// completions its QPs could have outstanding, and the opt-out.
pub(super) struct CqBudget {
    pub(super) capacity: u64,
    pub(super) committed: core::sync::atomic::AtomicU64,
    pub(super) unguarded: core::sync::atomic::AtomicBool,
    /// The run-time check of an unguarded CQ (as `api::Cq`'s).
    pub(super) headroom: Headroom,
}

impl CqBudget {
    /// Whether posts must check the CQ's headroom.
    #[inline(always)]
    pub(super) fn metered(&self) -> bool {
        // Relaxed: a setting, changed on the control path.
        self.unguarded.load(core::sync::atomic::Ordering::Relaxed)
    }

    /// Adds `n` unless that would exceed the depth of a guarded CQ.
    pub(super) fn charge(&self, n: u64) -> bool {
        use core::sync::atomic::Ordering::Relaxed;
        // Relaxed: a counter of the control path; the handle table's
        // exclusive access to the CQ serialises QP creation on it anyway.
        let unguarded = self.unguarded.load(Relaxed);
        self.committed
            .fetch_update(Relaxed, Relaxed, |c| {
                (unguarded || c + n <= self.capacity).then_some(c + n)
            })
            .is_ok()
    }

    pub(super) fn release(&self, n: u64) {
        // Relaxed: as in `charge`.
        let _ = self.committed.fetch_update(
            core::sync::atomic::Ordering::Relaxed,
            core::sync::atomic::Ordering::Relaxed,
            |c| Some(c.saturating_sub(n)),
        );
    }
}

pub(super) struct QpObj {
    /// What this QP charged to its CQs' budgets (released on drop).
    pub(super) charges: Vec<(Arc<CqBudget>, u64)>,
    /// The send and receive CQs' accounts (run-time headroom).
    pub(super) send_budget: Arc<CqBudget>,
    pub(super) recv_budget: Arc<CqBudget>,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) qpn: u32,
    pub(super) caps: QpCaps,
    pub(super) send_cq: usize,
    pub(super) recv_cq: usize,
    pub(super) doorbells: u64,
    pub(super) q: ExclusiveCell<QpImpl>,
    /// Initial send PSN.
    pub(super) psn: u32,
    /// Send rate limit for the next connect (kbit/s, 0: none).
    pub(super) rate_limit_kbps: u32,
    /// What the last successful connect used (cleared by RESET).
    pub(super) connection: Option<crate::api::QpConnection>,
    /// A submission service (`rdd_submit_create`) drives this QP's send
    /// queue: a second one is refused.
    pub(super) serviced: core::sync::atomic::AtomicBool,
    // Side tables the queues point into (heap buffers do not move).
    pub(super) _sq_wrid: Vec<WrSlot>,
    pub(super) _rq_wrid: Vec<u64>,
    /// The mlx5 descriptor the queues were made over (`rdd_qp_mlx5_desc`);
    /// None for a provider-posted QP.
    pub(super) mlx5_dv: Option<QpDesc>,
    /// The SRQ this QP takes its receives from (`rdd_qp_create_on_srq`);
    /// its receive queue is then a one-entry stand-in that is never
    /// posted to (`_no_rq`, below) and never seen by the device.
    pub(super) srq: Option<SrqAttach>,
    /// A UD QP (`rdd_qp_create_ud`): the largest datagram it sends (the
    /// port's MTU); 0 for an RC QP.
    pub(super) ud_mtu: u32,
    /// The stand-in receive queue's memory (QPs on an SRQ only).
    pub(super) _no_rq: Option<Box<crate::provider::mlx5::rq::AbsentRq>>,
    pub(super) _keep: Arc<dyn Any + Send + Sync>,
    pub(super) _pd_link: Arc<()>,
    pub(super) _cq_links: Vec<Arc<()>>,
}

impl Drop for QpObj {
    fn drop(&mut self) {
        // The device stops touching the queues; the memory and the side
        // tables go with the fields afterwards.
        let _ = self.backend.destroy_qp(self.qpn);
        for (b, n) in &self.charges {
            b.release(*n);
        }
    }
}

// SAFETY: each kind value is used by exactly one type.
unsafe impl Object for DeviceObj {
    const KIND: u8 = KIND_DEVICE;
}
// SAFETY: as above.
unsafe impl Object for PdObj {
    const KIND: u8 = KIND_PD;
}
// SAFETY: as above.
unsafe impl Object for MrObj {
    const KIND: u8 = KIND_MR;
}
// SAFETY: as above.
unsafe impl Object for CqObj {
    const KIND: u8 = KIND_CQ;
}
// SAFETY: as above.
unsafe impl Object for QpObj {
    const KIND: u8 = KIND_QP;
}
