//! The device handle ([`Device`]) and the protection domain handle
//! ([`Pd`]): asynchronous events, PD allocation and CQ creation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::provider::mlx5::CompletionQueue;
use crate::sync::AtomicU32;

use super::cq::{Cq, CqInner, CqPath};
use super::{Adaptive, AdaptiveConfig, AsyncEvent, Backend, Headroom, QpInit, RawCqPath};

/// A device handle. Cloning shares it.
pub struct Device<B: Backend> {
    b: Arc<B>,
}

impl<B: Backend> Clone for Device<B> {
    fn clone(&self) -> Self {
        Device {
            b: Arc::clone(&self.b),
        }
    }
}

pub(super) struct PdInner<B: Backend> {
    pub(super) b: Arc<B>,
    pub(super) pd: u32,
    /// The SRQs made in this PD, for [`QpInit::srq`] to name (dead entries
    /// are pruned when an SRQ is made).
    pub(super) srqs: std::sync::Mutex<std::vec::Vec<std::sync::Weak<super::srq::SrqInner<B>>>>,
}

impl<B: Backend> PdInner<B> {
    pub(super) fn srqs(
        &self,
    ) -> std::sync::MutexGuard<'_, std::vec::Vec<std::sync::Weak<super::srq::SrqInner<B>>>> {
        // A list of weak references: a panic while holding it cannot tear
        // anything.
        self.srqs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: Backend> Drop for PdInner<B> {
    fn drop(&mut self) {
        // Everything using the PD holds this Arc, so nothing is left.
        let _ = self.b.dealloc_pd(self.pd);
    }
}

/// A protection domain.
pub struct Pd<B: Backend> {
    pub(super) inner: Arc<PdInner<B>>,
}

impl<B: Backend> Device<B> {
    /// Wraps a backend.
    pub fn new(b: B) -> Device<B> {
        Device { b: Arc::new(b) }
    }

    /// Takes the next asynchronous event (QP errors, CQ overruns, port
    /// changes) without blocking. A QP-fatal event
    /// ([`AsyncEvent::is_qp_fatal`]) names a QP to [`super::Qp::recover`].
    pub fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.b.poll_async_event()
    }

    /// An fd that is readable while asynchronous events are pending, for
    /// the application's own epoll set.
    pub fn async_event_fd(&self) -> Result<i32> {
        self.b.async_event_fd()
    }

    /// Waits up to `timeout` for the next asynchronous event; `Ok(None)`
    /// when none came. Never blocks longer than `timeout`.
    pub fn wait_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.b.poll_async_event()? {
                return Ok(Some(e));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            crate::event::wait_readable(self.b.async_event_fd()?, left)?;
        }
    }

    /// The backend (for backend-specific control: stepping the software
    /// device, fault injection, ...).
    pub fn backend(&self) -> &B {
        &self.b
    }

    /// The CQ depth that QPs created with `inits` need if their send and
    /// receive completions all go to one CQ (the sizing guard's worst
    /// case: every WR their queues can hold). Pass it to
    /// [`Device::create_cq`].
    pub fn cq_depth_for(&self, inits: &[&QpInit]) -> u32 {
        inits
            .iter()
            .map(|i| {
                let (s, r) = self.b.cq_demand(i);
                s.saturating_add(r)
            })
            .fold(0u32, u32::saturating_add)
            .max(1)
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd<B>> {
        let pd = self.b.alloc_pd()?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                b: Arc::clone(&self.b),
                pd,
                srqs: std::sync::Mutex::new(std::vec::Vec::new()),
            }),
        })
    }

    /// Creates a CQ with room for at least `depth` completions.
    pub fn create_cq(&self, depth: u32) -> Result<Cq<B>> {
        let raw = self.b.create_cq(depth)?;
        let cq = match raw.path {
            RawCqPath::Mlx5(dv) => {
                // SAFETY: the backend guarantees the descriptor describes
                // live CQ memory kept alive by `raw.keep`, which `CqInner`
                // holds as long as the poller exists.
                match unsafe { CompletionQueue::from_raw(&dv) } {
                    Ok(mut cq) => {
                        cq.set_scatter_to_cqe(false);
                        CqPath::Mlx5(cq)
                    }
                    Err(e) => {
                        let _ = self.b.destroy_cq(raw.cqn);
                        return Err(e);
                    }
                }
            }
            RawCqPath::Driver(p) => CqPath::Driver(p),
        };
        let capacity = match &cq {
            CqPath::Mlx5(c) => c.cqe_cnt(),
            CqPath::Driver(p) => p.depth(),
        };
        Ok(Cq {
            adaptive: Adaptive::new(AdaptiveConfig::default()),
            inner: Arc::new(CqInner {
                b: Arc::clone(&self.b),
                cqn: raw.cqn,
                users: AtomicU32::new(0),
                capacity,
                committed: std::sync::Mutex::new(0),
                unguarded: core::sync::atomic::AtomicBool::new(false),
                headroom: Headroom::new(u64::from(capacity)),
                _keep: raw.keep,
            }),
            cq,
        })
    }
}
