//! Completion events as file descriptors (feature `std`, Linux).
//!
//! [`EventFd`] is what the software device signals when it writes a CQE on
//! an armed CQ (the verbs backend uses the completion channel's fd
//! instead). [`wait_readable`] blocks on any such fd with a timeout, so a
//! waiting thread sleeps in the kernel instead of spinning; the fd can just
//! as well go into the application's own epoll set.
//!
//! These are control-path helpers: nothing here runs on the post/poll hot
//! path.

use std::time::{Duration, Instant};

use crate::completion::Wc;
use crate::error::{Error, Result};

/// How [`crate::api::Cq::wait`] (and `rdd_cq_wait`) waits for a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Poll in a loop: the lowest latency, a whole core while waiting.
    BusyPoll,
    /// Arm the CQ, poll once more (a completion that slipped in between
    /// is not missed), then sleep on the CQ's event fd.
    Event,
    /// Spin for a budget learnt from how soon completions have been
    /// arriving, then fall back to [`WaitMode::Event`].
    Adaptive,
}

/// Tuning of [`WaitMode::Adaptive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveConfig {
    /// Shortest spin before sleeping.
    pub min_spin: Duration,
    /// Longest spin; when completions take longer than this to arrive,
    /// spinning does not pay and the wait sleeps after `min_spin`.
    pub max_spin: Duration,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            min_spin: Duration::from_micros(1),
            max_spin: Duration::from_micros(200),
        }
    }
}

/// The adaptive waiter's state. The spin budget follows two rules:
/// * a completion caught while spinning feeds an exponentially weighted
///   average of spin-phase arrival times, and the budget becomes twice that
///   average (clamped to the configured range): spin a little longer than
///   completions usually take;
/// * a completion that needed the sleep phase halves the budget (spinning
///   did not pay: the completion came later than the budget, or the
///   spinning thread competed for a core with whoever produces the
///   completion).
///
/// Every 64th wait spins the full `max_spin` once, so the budget can grow
/// back when completions start arriving quickly again.
#[derive(Clone, Copy, Debug)]
pub struct Adaptive {
    cfg: AdaptiveConfig,
    /// Average spin-phase arrival time, in nanoseconds (weight 1/8).
    avg_ns: u64,
    /// Current spin budget.
    budget: Duration,
    /// Waits since the last full-length probe.
    since_probe: u32,
}

impl Adaptive {
    /// A waiter with this tuning.
    pub fn new(cfg: AdaptiveConfig) -> Adaptive {
        Adaptive {
            cfg,
            avg_ns: cfg.max_spin.as_nanos() as u64 / 2,
            budget: cfg.max_spin,
            since_probe: 0,
        }
    }

    /// The current spin budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The spin to use for the next wait (the budget, or a probe).
    fn next_spin(&mut self) -> Duration {
        self.since_probe += 1;
        if self.since_probe >= 64 {
            self.since_probe = 0;
            return self.cfg.max_spin;
        }
        self.budget
    }

    /// A completion arrived `took` into the spin phase.
    fn hit(&mut self, took: Duration) {
        let t = took.as_nanos().min(u64::MAX as u128) as u64;
        self.avg_ns = self.avg_ns - self.avg_ns / 8 + t / 8;
        self.budget =
            (Duration::from_nanos(self.avg_ns) * 2).clamp(self.cfg.min_spin, self.cfg.max_spin);
    }

    /// A completion needed the sleep phase.
    fn miss(&mut self) {
        self.budget = (self.budget / 2).max(self.cfg.min_spin);
    }
}

/// What [`wait`] needs from a CQ: poll it (with its routing), arm it,
/// consume its events, and the fd that signals them.
pub trait Waitable {
    /// Polls up to `out.len()` completions.
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize>;
    /// Requests an event for the next completion.
    fn arm(&mut self) -> Result<()>;
    /// Takes the pending events without blocking.
    fn consume(&mut self) -> Result<u32>;
    /// The fd that becomes readable when an event is pending.
    fn fd(&self) -> Result<i32>;
}

/// Waits up to `timeout` for completions of `cq` in `mode`, polling them
/// into `out`: at least one, or [`Error::Timeout`]. Never blocks longer
/// than `timeout`. `adaptive` carries the adaptive mode's learnt budget
/// from one wait to the next.
pub fn wait<W: Waitable + ?Sized>(
    cq: &mut W,
    out: &mut [Wc],
    mode: WaitMode,
    adaptive: &mut Adaptive,
    timeout: Duration,
) -> Result<usize> {
    let start = Instant::now();
    let deadline = start + timeout;
    match mode {
        WaitMode::BusyPoll => spin_until(cq, out, deadline),
        WaitMode::Event => sleep_until(cq, out, deadline),
        WaitMode::Adaptive => {
            let spin_end = (start + adaptive.next_spin()).min(deadline);
            match spin_until(cq, out, spin_end) {
                Err(Error::Timeout) if spin_end < deadline => {
                    let r = sleep_until(cq, out, deadline);
                    if r.is_ok() {
                        adaptive.miss();
                    }
                    r
                }
                Ok(n) => {
                    adaptive.hit(start.elapsed());
                    Ok(n)
                }
                r => r,
            }
        }
    }
}

/// Polls until a completion arrives or `deadline` passes (the clock is
/// read every 64 empty polls).
fn spin_until<W: Waitable + ?Sized>(
    cq: &mut W,
    out: &mut [Wc],
    deadline: Instant,
) -> Result<usize> {
    loop {
        for _ in 0..64 {
            let n = cq.poll(out)?;
            if n > 0 || out.is_empty() {
                return Ok(n);
            }
            core::hint::spin_loop();
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout);
        }
    }
}

/// The event path: poll, arm, poll again, sleep on the fd, repeat.
fn sleep_until<W: Waitable + ?Sized>(
    cq: &mut W,
    out: &mut [Wc],
    deadline: Instant,
) -> Result<usize> {
    let fd = cq.fd()?;
    loop {
        let n = cq.poll(out)?;
        if n > 0 || out.is_empty() {
            return Ok(n);
        }
        cq.arm()?;
        // A completion written before the arm took effect raises no event:
        // look once more before sleeping.
        let n = cq.poll(out)?;
        if n > 0 {
            return Ok(n);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        if wait_readable(fd, left)? {
            cq.consume()?;
        }
    }
}

/// An `eventfd(2)`: a counter the kernel can wait on.
#[derive(Debug)]
pub struct EventFd {
    fd: i32,
}

impl EventFd {
    /// A non-blocking, close-on-exec eventfd starting at 0.
    pub fn new() -> Result<EventFd> {
        // SAFETY: no pointers; flags are valid.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::ResourceExhausted);
        }
        Ok(EventFd { fd })
    }

    /// The fd (readable while the counter is non-zero).
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Adds one event.
    pub fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our own fd. A full
        // counter (2^64 - 2 events) would fail with EAGAIN, which leaves
        // the fd readable, which is all a signal needs.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Takes every pending event; returns how many there were (0 if none).
    pub fn drain(&self) -> u64 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking
        // fd; EAGAIN (no event) leaves `v` at 0.
        let n = unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            v
        } else {
            0
        }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: our own fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// Blocks until `fd` is readable or `timeout` passes. `Ok(true)` if
/// readable, `Ok(false)` on timeout. Interrupted waits resume with the time
/// left.
pub fn wait_readable(fd: i32, timeout: Duration) -> Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ts = libc::timespec {
            tv_sec: left.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, core::ptr::null()) };
        if r > 0 {
            return Ok(true);
        }
        if r == 0 {
            return Ok(false);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::InvalidAttribute);
        }
        if left.is_zero() {
            return Ok(false);
        }
    }
}

/// CPU time this thread has used so far (`CLOCK_THREAD_CPUTIME_ID`), for
/// measuring what waiting costs.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_signals_and_waits_time_out() {
        let e = EventFd::new().unwrap();
        assert!(!wait_readable(e.fd(), Duration::from_millis(20)).unwrap());
        e.signal();
        e.signal();
        assert!(wait_readable(e.fd(), Duration::from_secs(5)).unwrap());
        assert_eq!(e.drain(), 2);
        assert_eq!(e.drain(), 0);
        let t0 = std::time::Instant::now();
        assert!(!wait_readable(e.fd(), Duration::from_millis(50)).unwrap());
        assert!(t0.elapsed() >= Duration::from_millis(50));
    }
}
