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

use std::time::Duration;

use crate::error::{Error, Result};

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
