//! Typed work requests and their validation.
//!
//! A work request is validated once, at the edge, against the queue's
//! [`QpCaps`] (docs/spec/mlx5.md §2–§6); the provider encoders may then assume it
//! is well formed. Validation never panics and never writes to a queue: a
//! rejected WR leaves the queue untouched.

use crate::error::{Error, Result};

/// One scatter/gather entry. Same layout as `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address of the buffer (inside a registered region).
    pub addr: u64,
    /// Length in bytes. Zero-length entries are skipped when encoding.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

impl Sge {
    /// A new entry.
    #[inline]
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge { addr, length, lkey }
    }
}

static_assertions::assert_eq_size!(Sge, [u8; 16]);

/// Send flags. Bit values equal `IBV_SEND_*` so C callers can pass theirs.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// No flags: unsignaled, no fence, no solicited event.
    pub const NONE: SendFlags = SendFlags(0);
    /// Wait for earlier RDMA READs and atomics to complete (`IBV_SEND_FENCE`).
    pub const FENCE: SendFlags = SendFlags(0x01);
    /// Generate a completion (`IBV_SEND_SIGNALED`).
    pub const SIGNALED: SendFlags = SendFlags(0x02);
    /// Raise a solicited event at the responder (`IBV_SEND_SOLICITED`).
    pub const SOLICITED: SendFlags = SendFlags(0x04);
    /// Copy the payload into the WQE (`IBV_SEND_INLINE`). In the typed API
    /// this bit is implied by [`Payload::Inline`]; the C ABI uses it.
    pub const INLINE: SendFlags = SendFlags(0x08);
    /// Every defined bit.
    pub const ALL: SendFlags = SendFlags(0x0f);

    /// True if every bit of `other` is set.
    #[inline]
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    #[inline]
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// The remote side of an RDMA or atomic operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remote {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

impl Remote {
    /// A new remote address.
    #[inline]
    pub const fn new(addr: u64, rkey: u32) -> Remote {
        Remote { addr, rkey }
    }
}

/// The operation of a send work request.
///
/// Immediate values are host-order numbers; they travel big-endian on the
/// wire and come back in host order in the receiver's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND_WITH_IMM.
    SendImm {
        /// Immediate data.
        imm: u32,
    },
    /// SEND_WITH_INV: send and invalidate `rkey` at the responder.
    SendInv {
        /// The remote key to invalidate.
        rkey: u32,
    },
    /// RDMA_WRITE.
    Write {
        /// Destination.
        remote: Remote,
    },
    /// RDMA_WRITE_WITH_IMM (consumes a receive at the responder).
    WriteImm {
        /// Destination.
        remote: Remote,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA_READ into the local SGEs.
    Read {
        /// Source.
        remote: Remote,
    },
    /// ATOMIC_CMP_AND_SWP on 8 bytes: if `*remote == compare`, store `swap`.
    /// The original value lands in the 8-byte local SGE.
    CompareSwap {
        /// Target (8-byte aligned).
        remote: Remote,
        /// Value to compare.
        compare: u64,
        /// Value to store.
        swap: u64,
    },
    /// ATOMIC_FETCH_AND_ADD on 8 bytes. The original value lands in the
    /// 8-byte local SGE.
    FetchAdd {
        /// Target (8-byte aligned).
        remote: Remote,
        /// Addend.
        add: u64,
    },
    /// A NOP WQE (control segment only); useful to request a completion
    /// that flushes unsignaled work.
    Nop,
    /// BIND_MW: binds a type-2 memory window to a range of a region, for
    /// the peer of this QP only (IBA o10-37; the window then answers only
    /// requests that arrive on this QP). Local operation: no payload, no
    /// packet; the completion's opcode is [`WcOpcode::BIND_MW`]. Devices
    /// without type-2 windows (the mlx5 core, the software device, siw)
    /// refuse it with [`Error::Unsupported`]. `rdma_direct::expose`
    /// builds it (`Mr::expose_to`, `Exposure::rebind`), checking the range
    /// and picking the new key.
    ///
    /// [`WcOpcode::BIND_MW`]: crate::completion::WcOpcode::BIND_MW
    BindMw(MwBind),
    /// LOCAL_INV: invalidates `rkey` (a type-2 window bound on this QP), so
    /// the peer's requests with it fail with a remote access error from the
    /// moment the WR executes. Local operation: no payload, no packet; the
    /// completion's opcode is [`WcOpcode::LOCAL_INV`]. Refused with
    /// [`Error::Unsupported`] where [`SendOp::BindMw`] is.
    ///
    /// [`WcOpcode::LOCAL_INV`]: crate::completion::WcOpcode::LOCAL_INV
    LocalInv {
        /// The key to invalidate.
        rkey: u32,
    },
}

/// What a [`SendOp::BindMw`] binds: the window `mw_rkey` (its key now),
/// to `len` bytes at `addr` of the region whose local key is `mr_lkey`,
/// with the remote rights `access`, under `new_rkey` (the same window
/// index, a fresh low byte). The region must have been registered with
/// [`Access::MW_BIND`](crate::attr::Access::MW_BIND) and local write when
/// the window grants remote write or atomics (IBA C10-73, C10-74).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind {
    /// First byte (a virtual address inside the region).
    pub addr: u64,
    /// Bytes; at least 1.
    pub len: u64,
    /// The region's local key.
    pub mr_lkey: u32,
    /// The window's key before this bind.
    pub mw_rkey: u32,
    /// The window's key after it (upper 24 bits as `mw_rkey`).
    pub new_rkey: u32,
    /// `IBV_ACCESS_REMOTE_*` bits (remote read 4, write 2, atomic 8).
    pub access: u32,
}

impl SendOp {
    /// The remote address, for operations that have one.
    #[inline]
    pub const fn remote(&self) -> Option<Remote> {
        match *self {
            SendOp::Write { remote }
            | SendOp::WriteImm { remote, .. }
            | SendOp::Read { remote }
            | SendOp::CompareSwap { remote, .. }
            | SendOp::FetchAdd { remote, .. } => Some(remote),
            _ => None,
        }
    }

    /// True for CompareSwap and FetchAdd.
    #[inline]
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// True for the operations that carry no local data: NOP, BIND_MW and
    /// LOCAL_INV (they take no SGEs and no inline payload).
    #[inline]
    pub const fn is_dataless(&self) -> bool {
        matches!(
            self,
            SendOp::Nop | SendOp::BindMw(_) | SendOp::LocalInv { .. }
        )
    }
}

/// Where a send's local data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gather (or, for READ and atomics, scatter) list of registered memory.
    Sges(&'a [Sge]),
    /// Bytes copied into the WQE at post time (`IBV_SEND_INLINE`); the
    /// pieces are concatenated. No memory key is needed and the buffers may
    /// be reused as soon as the post returns.
    Inline(&'a [&'a [u8]]),
}

/// A send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data.
    pub payload: Payload<'a>,
    /// Signaled, solicited and fence bits. The INLINE bit is ignored here;
    /// use [`Payload::Inline`].
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A work request with SGE payload.
    #[inline]
    pub const fn new(wr_id: u64, op: SendOp, sges: &'a [Sge], flags: SendFlags) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            payload: Payload::Sges(sges),
            flags,
        }
    }

    /// A work request with inline payload.
    #[inline]
    pub const fn inline(
        wr_id: u64,
        op: SendOp,
        data: &'a [&'a [u8]],
        flags: SendFlags,
    ) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            payload: Payload::Inline(data),
            flags,
        }
    }
}

/// A receive-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: &'a [Sge],
}

/// What a queue pair accepts; fixed when the QP is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Maximum SGEs per send WR.
    pub max_send_sge: u32,
    /// Maximum inline payload per send WR, in bytes.
    pub max_inline_data: u32,
    /// Maximum SGEs per receive WR.
    pub max_recv_sge: u32,
}

/// Largest RDMA message (2^31 bytes).
pub const MAX_MESSAGE: u64 = 1 << 31;

/// Sum of SGE lengths, with overflow reported as [`Error::LengthOverflow`].
#[inline]
pub fn total_length(sges: &[Sge]) -> Result<u32> {
    let mut total: u64 = 0;
    let mut high = 0u32;
    for s in sges {
        total += s.length as u64;
        high |= s.length;
    }
    if total > MAX_MESSAGE || high & 0x8000_0000 != 0 {
        return Err(Error::LengthOverflow);
    }
    Ok(total as u32)
}

/// Total inline payload, with the same limit.
#[inline]
pub fn inline_length(pieces: &[&[u8]]) -> Result<u32> {
    let mut total: usize = 0;
    for p in pieces {
        total = total.checked_add(p.len()).ok_or(Error::LengthOverflow)?;
    }
    if total as u64 > MAX_MESSAGE {
        return Err(Error::LengthOverflow);
    }
    Ok(total as u32)
}

/// What validation learned about a send WR's local data, so encoders do
/// not walk the SGE list twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendShape {
    /// SGEs with a non-zero length (zero-length entries are skipped by
    /// encoders); 1 for atomics.
    pub data_sges: u32,
    /// Inline payload length (0 for SGE payloads).
    pub inline_len: u32,
    /// The payload is inline.
    pub inline: bool,
}

/// Validates a send WR against the QP's capabilities in one pass over its
/// local data. Provider-independent rules only; queue-space and QP-state
/// checks happen in the queue.
#[inline(always)]
pub fn validate_send(wr: &SendWr<'_>, caps: &QpCaps) -> Result<SendShape> {
    let shape = match wr.payload {
        Payload::Sges(sges) => {
            if sges.len() > caps.max_send_sge as usize {
                return Err(Error::TooManySges);
            }
            let mut total: u64 = 0;
            let mut data = 0u32;
            let mut high = 0u32;
            for s in sges {
                total += s.length as u64;
                data += (s.length != 0) as u32;
                high |= s.length;
            }
            if wr.op.is_atomic() {
                if sges.len() != 1 || sges[0].length != 8 {
                    return Err(Error::AtomicSgeLength);
                }
            } else if wr.op.is_dataless() {
                if !sges.is_empty() {
                    return Err(Error::TooManySges);
                }
            } else if total > MAX_MESSAGE || high & 0x8000_0000 != 0 {
                // One SGE of 2^31 bytes or more cannot be encoded: bit 31 of
                // an mlx5 byte count marks an inline segment.
                return Err(Error::LengthOverflow);
            }
            SendShape {
                data_sges: data,
                inline_len: 0,
                inline: false,
            }
        }
        Payload::Inline(pieces) => {
            match wr.op {
                SendOp::Read { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::Nop
                | SendOp::BindMw(_)
                | SendOp::LocalInv { .. } => return Err(Error::InlineNotAllowed),
                _ => {}
            }
            let len = inline_length(pieces)?;
            if len > caps.max_inline_data {
                return Err(Error::InlineTooLarge);
            }
            SendShape {
                data_sges: 0,
                inline_len: len,
                inline: true,
            }
        }
    };
    if let Some(remote) = wr.op.remote() {
        if wr.op.is_atomic() && remote.addr & 7 != 0 {
            return Err(Error::AtomicUnaligned);
        }
    }
    Ok(shape)
}

/// Validates a receive WR.
#[inline]
pub fn validate_recv(wr: &RecvWr<'_>, caps: &QpCaps) -> Result<()> {
    if wr.sges.len() > caps.max_recv_sge as usize {
        return Err(Error::TooManySges);
    }
    total_length(wr.sges)?;
    Ok(())
}

/// A work request that failed, as it was posted: what an error completion
/// is about, decoded from the WQE still in the ring (mlx5) or from the
/// copy a driver path keeps. [`FailedWr::likely_causes`] explains the
/// status in words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailedWr {
    /// The WR's id.
    pub wr_id: u64,
    /// Completion status (`ibv_wc_status` numbering).
    pub status: crate::completion::WcStatus,
    /// Raw vendor syndrome.
    pub vendor_err: u32,
    /// Raw mlx5 syndrome (0 on other providers).
    pub syndrome: u8,
    /// A receive (otherwise a send-queue WR).
    pub recv: bool,
    /// The operation (`ibv_wc_opcode` numbering).
    pub opcode: crate::completion::WcOpcode,
    /// First local buffer (0 for inline data).
    pub local_addr: u64,
    /// Total local length in bytes (inline bytes for inline data).
    pub length: u32,
    /// Local key of the first local buffer.
    pub lkey: u32,
    /// Remote address (RDMA and atomics; 0 otherwise).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics; 0 otherwise).
    pub rkey: u32,
    /// The payload was inline.
    pub inline: bool,
}

impl FailedWr {
    /// The usual reasons for this failure.
    pub const fn likely_causes(&self) -> &'static str {
        status_causes(self.status)
    }
}

/// The usual reasons for a completion status, in words.
pub const fn status_causes(s: crate::completion::WcStatus) -> &'static str {
    match s.0 {
        0 => "success",
        1 => "local length error: the message is longer than the receive buffers posted for it, or longer than the port allows",
        2 => "local QP operation error: the WQE was malformed or not allowed on this QP (e.g. inline data above the QP's limit)",
        4 => "local protection error: a local SGE's lkey is not valid, belongs to another protection domain, or the address range is outside its memory region",
        5 => "flushed: the QP was already in the error state (an earlier WR failed or the QP was moved to ERROR); see the first error completion",
        6 => "memory-window bind error",
        7 => "bad response from the peer (unexpected transport opcode)",
        8 => "local access error: the local region lacks LOCAL_WRITE for a receive, RDMA READ result or atomic result",
        9 => "remote invalid request: the peer QP's access flags do not enable the operation (REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC when it connected), the peer does not support it, an atomic target is not 8-byte aligned, or the message exceeds the peer's limits or its receive buffers",
        10 => "remote access error: the rkey is not valid at the peer (wrong key, memory region deregistered or re-registered, window invalidated), the remote range lies outside the region, or the region or the peer QP lacks the needed REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC access",
        11 => "remote operation error: the peer could not complete the operation (e.g. its receive queue or receive buffer failed)",
        12 => "transport retry count exceeded: the peer did not answer (down, unreachable, wrong GID/LID or GID index, MTU or PSN mismatch, peer QP not in RTR/RTS, or a lossy RoCE fabric)",
        13 => "RNR retry count exceeded: the peer had no receive posted for a SEND or RDMA WRITE with immediate; post receives earlier, add flow control, or raise rnr_retry",
        16 => "remote aborted: the peer's QP went to the error state during the operation",
        20 => "response timeout",
        _ => "general error: see the vendor syndrome",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: QpCaps = QpCaps {
        max_send_sge: 2,
        max_inline_data: 16,
        max_recv_sge: 1,
    };
    const R: Remote = Remote {
        addr: 0x1000,
        rkey: 7,
    };

    #[test]
    fn sge_limits() {
        let s = [Sge::new(0, 1, 1); 3];
        let wr = SendWr::new(1, SendOp::Send, &s, SendFlags::NONE);
        assert_eq!(validate_send(&wr, &CAPS), Err(Error::TooManySges));
        let wr = SendWr::new(1, SendOp::Send, &s[..2], SendFlags::NONE);
        assert!(validate_send(&wr, &CAPS).is_ok());
        let r = RecvWr {
            wr_id: 0,
            sges: &s[..2],
        };
        assert_eq!(validate_recv(&r, &CAPS), Err(Error::TooManySges));
    }

    #[test]
    fn inline_rules() {
        let a = [0u8; 10];
        let b = [0u8; 7];
        let p: [&[u8]; 2] = [&a, &b];
        let wr = SendWr::inline(1, SendOp::Write { remote: R }, &p, SendFlags::NONE);
        assert_eq!(validate_send(&wr, &CAPS), Err(Error::InlineTooLarge));
        let wr = SendWr::inline(1, SendOp::Write { remote: R }, &p[..1], SendFlags::NONE);
        assert!(validate_send(&wr, &CAPS).is_ok());
        for op in [
            SendOp::Read { remote: R },
            SendOp::FetchAdd { remote: R, add: 1 },
            SendOp::CompareSwap {
                remote: R,
                compare: 1,
                swap: 2,
            },
        ] {
            let wr = SendWr::inline(1, op, &p[..1], SendFlags::NONE);
            assert_eq!(validate_send(&wr, &CAPS), Err(Error::InlineNotAllowed));
        }
    }

    #[test]
    fn atomic_rules() {
        let ok = [Sge::new(0x10, 8, 1)];
        let bad = [Sge::new(0x10, 4, 1)];
        let fa = SendOp::FetchAdd { remote: R, add: 1 };
        assert_eq!(
            validate_send(&SendWr::new(1, fa, &ok, SendFlags::NONE), &CAPS),
            Ok(SendShape {
                data_sges: 1,
                inline_len: 0,
                inline: false
            })
        );
        assert_eq!(
            validate_send(&SendWr::new(1, fa, &bad, SendFlags::NONE), &CAPS),
            Err(Error::AtomicSgeLength)
        );
        assert_eq!(
            validate_send(&SendWr::new(1, fa, &[], SendFlags::NONE), &CAPS),
            Err(Error::AtomicSgeLength)
        );
        let unaligned = SendOp::CompareSwap {
            remote: Remote::new(0x1004, 1),
            compare: 0,
            swap: 0,
        };
        assert_eq!(
            validate_send(&SendWr::new(1, unaligned, &ok, SendFlags::NONE), &CAPS),
            Err(Error::AtomicUnaligned)
        );
    }

    #[test]
    fn length_overflow() {
        let s = [Sge::new(0, u32::MAX, 1), Sge::new(0, 2, 1)];
        let wr = SendWr::new(1, SendOp::Send, &s, SendFlags::NONE);
        assert_eq!(validate_send(&wr, &CAPS), Err(Error::LengthOverflow));
        let s = [Sge::new(0, 0x8000_0001, 1)];
        let wr = SendWr::new(1, SendOp::Send, &s, SendFlags::NONE);
        assert_eq!(validate_send(&wr, &CAPS), Err(Error::LengthOverflow));
    }
}
