//! The command writer: a legacy uverbs command (header and body) written
//! to the context's command fd in one `write()`, its errno recorded.

use core::mem::size_of;

use rdma_sys as ibv;

use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use crate::verbs::fail;

// ---------------------------------------------------------------------------
// The command writer.

/// A legacy uverbs command as written to the command fd: the 8-byte header
/// `{command, in_words, out_words}`, then the command body.
#[repr(C)]
pub(super) struct Cmd<B> {
    pub(super) hdr: k::ib_uverbs_cmd_hdr,
    pub(super) body: B,
}

/// Writes `len` bytes at `buf` to the command fd as one command; the error
/// is the errno. The kernel consumes a command whole or not at all, so a
/// short count cannot happen; it would be reported as errno 0 (which maps
/// to [`Error::ProviderError`]).
pub(super) fn write_raw(fd: i32, buf: *const u8, len: usize) -> core::result::Result<(), i32> {
    loop {
        // SAFETY: `buf` is readable for `len` bytes (every caller passes a
        // live command struct and its size); the kernel writes responses
        // only to addresses named inside the command, which the callers
        // keep alive across this call.
        let r = unsafe { libc::write(fd, buf.cast(), len) };
        if r == len as isize {
            return Ok(());
        }
        if r >= 0 {
            return Err(0);
        }
        let errno = errno();
        if errno != libc::EINTR {
            return Err(errno);
        }
    }
}

/// The calling thread's errno.
pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Issues one command: header filled from the body's size and `out_bytes`
/// (core plus driver response), then the body. The body's `response`
/// field, if any, must already point at `out_bytes` of writable memory.
pub(super) fn exec<B>(
    fd: i32,
    op: &'static str,
    command: u32,
    body: B,
    out_bytes: usize,
) -> Result<()> {
    let c = Cmd {
        hdr: k::ib_uverbs_cmd_hdr {
            command,
            in_words: (size_of::<Cmd<B>>() / 4) as u16,
            out_words: (out_bytes / 4) as u16,
        },
        body,
    };
    write_raw(fd, (&c as *const Cmd<B>).cast(), size_of::<Cmd<B>>())
        .map_err(|errno| cmd_error(op, errno))
}

/// Records a failed command (for `verbs::last_error`) and maps its errno
/// as everywhere in [`crate::verbs`], except ENOENT: from a uverbs command
/// it means an unknown handle (PD, CQ, QP), not a missing device.
pub(super) fn cmd_error(op: &'static str, errno: i32) -> Error {
    let e = fail(op, errno);
    if errno == libc::ENOENT {
        Error::NoSuchObject
    } else {
        e
    }
}

/// The response address of a command: a user pointer as the kernel takes
/// it.
pub(super) fn resp_addr<T>(r: &mut T) -> u64 {
    r as *mut T as u64
}

/// The command fd of a context.
///
/// # Safety
/// `ctx` must point to a live `ibv_context`.
pub(super) unsafe fn cmd_fd(ctx: *mut ibv::ibv_context) -> Result<i32> {
    if ctx.is_null() {
        return Err(Error::NullPointer);
    }
    // SAFETY: live context (the caller's contract).
    let fd = unsafe { (*ctx).cmd_fd };
    if fd < 0 {
        return Err(Error::NoDevice);
    }
    Ok(fd)
}
