//! [`AsyncEvents`]: the context's async event fd, read directly.

use core::mem::size_of;

use rdma_sys as ibv;

use super::command::errno;
use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use crate::verbs::fail;

// ---------------------------------------------------------------------------
// Async events.

/// One asynchronous event (`struct ib_uverbs_async_event_desc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// For CQ, QP and SRQ events the `user_handle` given at creation; for
    /// port events the port number.
    pub element: u64,
    /// The event, numbered as `ibv_event_type` (`rdma_sys::ibv_event_type`:
    /// CQ_ERR 0, QP_FATAL 1, QP_REQ_ERR 2, QP_ACCESS_ERR 3, COMM_EST 4,
    /// SQ_DRAINED 5, ..., PORT_ACTIVE 9, PORT_ERR 10, ...,
    /// QP_LAST_WQE_REACHED 16, ...).
    pub event_type: u32,
}

/// The context's async event fd (`ibv_context.async_fd`), read directly.
///
/// The fd belongs to the context and is shared by everything on it: while
/// this reader is in use nothing else may read it — in particular not
/// libibverbs' `ibv_get_async_event`, which would take our events and
/// read their `element` (our `user_handle`) as an object pointer, and whose
/// events this reader would in turn consume. Events for libibverbs-made
/// objects on the same context (PD/MR have none; CQs/QPs made by
/// libibverbs do) arrive here too, with libibverbs' own user handles.
#[derive(Clone, Copy, Debug)]
pub struct AsyncEvents {
    fd: i32,
}

impl AsyncEvents {
    /// The reader of `ctx`'s async events. The fd's flags are left alone.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context`, open while this reader is
    /// used.
    pub unsafe fn new(ctx: *mut ibv::ibv_context) -> Result<AsyncEvents> {
        if ctx.is_null() {
            return Err(Error::NullPointer);
        }
        // SAFETY: live context (the caller's contract).
        let fd = unsafe { (*ctx).async_fd };
        if fd < 0 {
            return Err(Error::NoDevice);
        }
        Ok(AsyncEvents { fd })
    }

    /// The fd (for poll/epoll).
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The next event if one is pending, without blocking (a zero-timeout
    /// `poll`, then one `read`; with a single reader the read cannot
    /// block). No acknowledgement is needed.
    pub fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 0) };
            if r < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Err(fail("poll(async fd)", errno()));
            }
            if r == 0 || pfd.revents & libc::POLLIN == 0 {
                return Ok(None);
            }
            break;
        }
        let mut d = k::ib_uverbs_async_event_desc::default();
        loop {
            // SAFETY: `d` is writable for its size.
            let r = unsafe {
                libc::read(
                    self.fd,
                    (&mut d as *mut k::ib_uverbs_async_event_desc).cast(),
                    size_of::<k::ib_uverbs_async_event_desc>(),
                )
            };
            if r == size_of::<k::ib_uverbs_async_event_desc>() as isize {
                return Ok(Some(AsyncEvent {
                    element: d.element,
                    event_type: d.event_type,
                }));
            }
            if r >= 0 {
                return Err(Error::ProviderError);
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Ok(None),
                e => return Err(fail("read(async fd)", e)),
            }
        }
    }
}
