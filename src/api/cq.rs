//! A completion queue ([`Cq`]): polling, arming and waiting, and the
//! sizing guard's account of what its QPs may put on it.

use std::any::Any;
use std::boxed::Box;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::provider::mlx5::{CompletionQueue, CqRoute};
use crate::sync::{AtomicU32, Ordering};

use super::{Adaptive, AdaptiveConfig, Backend, CqDriver, Headroom, WaitMode, Wc};

pub(super) struct CqInner<B: Backend> {
    pub(super) b: Arc<B>,
    pub(super) cqn: u32,
    /// QPs whose send or receive completions land here (a QP using the
    /// CQ for both counts twice).
    pub(super) users: AtomicU32,
    /// Entries the CQ holds.
    pub(super) capacity: u32,
    /// Worst-case completions the attached QPs can have outstanding.
    pub(super) committed: std::sync::Mutex<u64>,
    /// The owner moderates completions itself: no sizing guard.
    pub(super) unguarded: core::sync::atomic::AtomicBool,
    /// The run-time headroom check of an unguarded CQ.
    pub(super) headroom: Headroom,
    pub(super) _keep: Arc<dyn Any + Send + Sync>,
}

impl<B: Backend> CqInner<B> {
    /// Whether posts must check this CQ's headroom (it opted out of the
    /// sizing guard, so its QPs could overrun it).
    #[inline(always)]
    pub(super) fn metered(&self) -> bool {
        // Relaxed: a setting, changed on the control path.
        self.unguarded.load(Ordering::Relaxed)
    }

    pub(super) fn reserve(&self, want: u64) -> u64 {
        self.headroom.reserve(want)
    }

    pub(super) fn unreserve(&self, n: u64) {
        self.headroom.unreserve(n)
    }
}

impl<B: Backend> Drop for CqInner<B> {
    fn drop(&mut self) {
        // Every QP on this CQ holds this Arc, so none is left.
        let _ = self.b.destroy_cq(self.cqn);
    }
}

/// A completion queue and its poller.
pub struct Cq<B: Backend> {
    pub(super) inner: Arc<CqInner<B>>,
    pub(super) cq: CqPath,
    pub(super) adaptive: Adaptive,
}

/// The poller behind a [`Cq`].
pub(super) enum CqPath {
    /// The crate's mlx5 core.
    Mlx5(CompletionQueue),
    /// A provider-polled CQ.
    Driver(Box<dyn CqDriver>),
}

impl<B: Backend> Cq<B> {
    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.inner.cqn
    }
    /// Entries.
    pub fn depth(&self) -> u32 {
        match &self.cq {
            CqPath::Mlx5(cq) => cq.cqe_cnt(),
            CqPath::Driver(p) => p.depth(),
        }
    }
    /// Polls up to `out.len()` completions of the QPs in `route` (one
    /// [`super::Qp`], or a slice of `&mut Qp` sharing this CQ). Allocation- and
    /// lock-free.
    #[inline]
    ///
    /// On a driver CQ ([`CqDriver`](super::CqDriver): the direct rxe/siw
    /// rings or the verbs fallback) the route is not needed: the
    /// provider retires queue space itself.
    pub fn poll<R: CqRoute + ?Sized>(&mut self, route: &mut R, out: &mut [Wc]) -> Result<usize> {
        if self.inner.metered() {
            return self.poll_metered(|cq, out| cq.poll(route, out), out);
        }
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.poll(route, out),
            CqPath::Driver(p) => p.poll(out),
        }
    }

    /// Polls an unguarded CQ and gives the consumed completions' room back
    /// to the posters' headroom check.
    #[cold]
    pub(super) fn poll_metered(
        &mut self,
        mlx5: impl FnOnce(&mut CompletionQueue, &mut [Wc]) -> Result<usize>,
        out: &mut [Wc],
    ) -> Result<usize> {
        let (r, consumed) = match &mut self.cq {
            CqPath::Mlx5(cq) => {
                // Every CQE consumed counts (forced signals the poller
                // retires without reporting included): the consumer index.
                let ci = cq.consumer_index();
                let r = mlx5(cq, out);
                (r, cq.consumer_index().wrapping_sub(ci))
            }
            CqPath::Driver(p) => {
                // A driver reports every completion it was asked
                // for (its own forced signals are neither counted at post
                // nor reported here).
                let r = p.poll(out);
                let n = *r.as_ref().unwrap_or(&0) as u32;
                (r, n)
            }
        };
        self.inner.unreserve(u64::from(consumed));
        r
    }
}

impl<B: Backend> Cq<B> {
    /// The fd that becomes readable when the armed CQ gets a completion
    /// (for the application's own epoll set; see [`Cq::arm`]).
    pub fn event_fd(&self) -> Result<i32> {
        self.inner.b.cq_event_fd(self.inner.cqn)
    }

    /// Requests one event for the next completion. Poll once more after
    /// arming: a completion that arrived before the arm may not raise one.
    pub fn arm(&mut self) -> Result<()> {
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.arm(false),
            CqPath::Driver(p) => p.arm(),
        }
    }

    /// Requests one event for the next solicited completion (a SEND the
    /// peer posted with [`SendFlags::SOLICITED`](crate::SendFlags)) or
    /// error completion; other completions raise none. Poll once more
    /// after arming, as for [`Cq::arm`].
    pub fn arm_solicited(&mut self) -> Result<()> {
        match &mut self.cq {
            CqPath::Mlx5(cq) => cq.arm(true),
            CqPath::Driver(p) => p.arm_solicited(),
        }
    }

    /// Takes the pending events without blocking (after the fd became
    /// readable); returns how many.
    pub fn consume_events(&mut self) -> Result<u32> {
        let n = self.inner.b.cq_event_consume(self.inner.cqn)?;
        if let CqPath::Mlx5(cq) = &mut self.cq {
            // Each delivered event advances the arm sequence number.
            cq.events_consumed(n);
        }
        Ok(n)
    }

    /// Worst-case completions the QPs attached to this CQ can have
    /// outstanding (every WR their queues can hold).
    pub fn committed(&self) -> u64 {
        *self
            .inner
            .committed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// How deep this CQ would have to be for its QPs plus `extra` more
    /// worst-case completions (e.g. a QP that [`super::Pd::create_qp`] refused
    /// with [`Error::CqTooSmall`]: pass the send plus receive capacity it
    /// asked for, rounded up as the device rounds queue sizes).
    pub fn depth_needed(&self, extra: u64) -> u64 {
        self.committed() + extra
    }

    /// Opts this CQ out of the sizing guard: [`super::Pd::create_qp`] no longer
    /// refuses QPs that could overrun it. For owners that moderate
    /// completions themselves (signal rarely, never flush more than the
    /// CQ holds). A flush can then still overrun it and lose completions:
    /// the software device reports `CqOverrun`, hardware moves the CQ to an
    /// error state.
    ///
    /// In normal operation an unguarded CQ is still protected at run time:
    /// posts count the completions their WRs will produce (signaled sends,
    /// every receive, and a CQE the signalling guard may add) against the
    /// CQ's headroom, polls give the room back, and a WR whose completion
    /// might not fit is refused with [`Error::CqFull`] (the WRs before it
    /// are posted). Opt out before posting on the CQ's QPs: work posted
    /// while the CQ was guarded is not counted.
    pub fn set_unguarded(&self, unguarded: bool) {
        // Relaxed: a setting read on the control path.
        self.inner.unguarded.store(unguarded, Ordering::Relaxed);
    }

    /// Sets the adaptive waiter's spin range.
    pub fn set_adaptive(&mut self, cfg: AdaptiveConfig) {
        self.adaptive = Adaptive::new(cfg);
    }

    /// The adaptive waiter's current spin budget.
    pub fn spin_budget(&self) -> Duration {
        self.adaptive.budget()
    }

    /// Waits up to `timeout` for completions of the QPs in `route` and
    /// polls them into `out`: returns how many (at least one), or
    /// [`Error::Timeout`]. Never blocks longer than `timeout`.
    pub fn wait<R: CqRoute + ?Sized>(
        &mut self,
        route: &mut R,
        out: &mut [Wc],
        mode: WaitMode,
        timeout: Duration,
    ) -> Result<usize> {
        let mut adaptive = self.adaptive;
        let r = crate::event::wait(
            &mut RoutedCq { cq: self, route },
            out,
            mode,
            &mut adaptive,
            timeout,
        );
        self.adaptive = adaptive;
        r
    }
}

/// A CQ and the route its completions go to, as [`crate::event::wait`]
/// sees them.
struct RoutedCq<'a, B: Backend, R: CqRoute + ?Sized> {
    cq: &'a mut Cq<B>,
    route: &'a mut R,
}

impl<B: Backend, R: CqRoute + ?Sized> crate::event::Waitable for RoutedCq<'_, B, R> {
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        self.cq.poll(self.route, out)
    }
    fn arm(&mut self) -> Result<()> {
        self.cq.arm()
    }
    fn consume(&mut self) -> Result<u32> {
        self.cq.consume_events()
    }
    fn fd(&self) -> Result<i32> {
        self.cq.event_fd()
    }
}

/// What one QP may put on its CQs at worst.
#[derive(Clone, Copy, Debug)]
pub(super) struct CqDemand {
    pub(super) send: u64,
    pub(super) recv: u64,
}

impl CqDemand {
    /// Adds this demand to the CQs, or fails with [`Error::CqTooSmall`]
    /// (and changes nothing) if a guarded CQ would be overcommitted.
    pub(super) fn commit<B: Backend>(&self, scq: &CqInner<B>, rcq: &CqInner<B>) -> Result<()> {
        let same = core::ptr::eq(scq, rcq);
        let check = |c: &CqInner<B>, add: u64, total: u64| -> bool {
            // Relaxed: a setting read on the control path.
            c.unguarded.load(Ordering::Relaxed) || total + add <= u64::from(c.capacity)
        };
        if same {
            let mut g = lock(scq);
            if !check(scq, self.send + self.recv, *g) {
                return Err(Error::CqTooSmall);
            }
            *g += self.send + self.recv;
            return Ok(());
        }
        // Lock in address order, so two QPs attaching to the same pair of
        // CQs in opposite roles cannot deadlock.
        let (mut gs, mut gr) = if (scq as *const CqInner<B>) < (rcq as *const CqInner<B>) {
            let gs = lock(scq);
            (gs, lock(rcq))
        } else {
            let gr = lock(rcq);
            (lock(scq), gr)
        };
        if !check(scq, self.send, *gs) || !check(rcq, self.recv, *gr) {
            return Err(Error::CqTooSmall);
        }
        *gs += self.send;
        *gr += self.recv;
        Ok(())
    }

    pub(super) fn release<B: Backend>(&self, scq: &CqInner<B>, rcq: &CqInner<B>) {
        let mut g = lock(scq);
        *g = g.saturating_sub(self.send);
        drop(g);
        let mut g = lock(rcq);
        *g = g.saturating_sub(self.recv);
    }
}

/// Locks a CQ's committed-demand counter (a panic while holding it cannot
/// leave the number torn).
fn lock<B: Backend>(c: &CqInner<B>) -> std::sync::MutexGuard<'_, u64> {
    c.committed.lock().unwrap_or_else(|p| p.into_inner())
}
