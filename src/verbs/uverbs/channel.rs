//! [`CompChannel`]: a completion channel of our own (CREATE_COMP_CHANNEL),
//! read directly.

use core::mem::{size_of, size_of_val};

use rdma_sys as ibv;

use super::command::{cmd_fd, errno, exec, resp_addr};
use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use crate::verbs::fail;
use k::ib_uverbs_write_cmds as cmd;

// ---------------------------------------------------------------------------
// Completion channel.

/// A completion channel of our own: CREATE_COMP_CHANNEL on the context's
/// command fd returns a new fd (close-on-exec), made non-blocking here.
/// Give [`CompChannel::fd`] to [`UverbsCq::create`](super::UverbsCq::create); arm the CQ; wait for
/// the fd to become readable (poll/epoll); then [`CompChannel::consume`].
///
/// Chosen over `ibv_create_comp_channel` so that no libibverbs object
/// exists whose event functions someone could call on our CQs: the
/// kernel's events name our `user_handle`, not an `ibv_cq*`. Drop the CQs
/// that use a channel before the channel (the kernel keeps the channel
/// alive for them anyway).
pub struct CompChannel {
    fd: i32,
}

impl CompChannel {
    /// Creates a completion channel on `ctx`.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context`.
    pub unsafe fn create(ctx: *mut ibv::ibv_context) -> Result<CompChannel> {
        // SAFETY: the caller's contract.
        let fd = unsafe { cmd_fd(ctx) }?;
        let mut resp = k::ib_uverbs_create_comp_channel_resp::default();
        exec(
            fd,
            "uverbs CREATE_COMP_CHANNEL",
            cmd::IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
            k::ib_uverbs_create_comp_channel {
                response: resp_addr(&mut resp),
            },
            size_of::<k::ib_uverbs_create_comp_channel_resp>(),
        )?;
        let ch = CompChannel { fd: resp.fd as i32 };
        if ch.fd < 0 {
            return Err(Error::ProviderError);
        }
        set_nonblocking(ch.fd).map_err(|errno| fail("fcntl(O_NONBLOCK)", errno))?;
        Ok(ch)
    }

    /// The channel's fd: readable while events are pending.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Takes every pending event without blocking, calling `on_event` with
    /// each one's CQ `user_handle`; returns how many there were. No
    /// acknowledgement is needed (that is libibverbs bookkeeping).
    pub fn consume(&self, mut on_event: impl FnMut(u64)) -> Result<u32> {
        let mut n = 0u32;
        let mut buf = [k::ib_uverbs_comp_event_desc::default(); 16];
        loop {
            let want = size_of_val(&buf);
            // SAFETY: `buf` is writable for `want` bytes; the fd is ours.
            let r = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), want) };
            if r < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => return Ok(n),
                    e => return Err(fail("read(comp channel)", e)),
                }
            }
            let got = r as usize / size_of::<k::ib_uverbs_comp_event_desc>();
            if got == 0 {
                return Ok(n);
            }
            for d in &buf[..got.min(buf.len())] {
                on_event(d.cq_handle);
                n = n.saturating_add(1);
            }
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

fn set_nonblocking(fd: i32) -> core::result::Result<(), i32> {
    // SAFETY: fcntl on an fd we own; no memory is involved.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(errno());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(errno());
    }
    Ok(())
}
