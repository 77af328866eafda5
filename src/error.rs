//! The crate's error type: one `Copy` enum with stable numeric codes.
//!
//! Every code is part of the public contract (the C ABI returns the same
//! numbers as `rdd_status`). Codes are grouped by origin, are never reused,
//! and retired codes stay listed as comments.

use core::fmt;

/// Every error the data path and the queue constructors can return.
///
/// `#[non_exhaustive]` so later issues can add variants; the numeric codes
/// of existing variants never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum Error {
    // ---- 1000..1099: work-request validation (nothing is written) ----
    /// More scatter/gather entries than the queue allows (`max_send_sge` /
    /// `max_recv_sge`), or more than fit in one WQE.
    TooManySges = 1001,
    /// Inline payload larger than the QP's `max_inline_data`.
    InlineTooLarge = 1002,
    /// Inline data requested on an operation that cannot carry it (RDMA
    /// READ, atomics).
    InlineNotAllowed = 1003,
    /// An atomic whose local SGE is not exactly one 8-byte entry.
    AtomicSgeLength = 1004,
    /// An atomic whose remote address is not 8-byte aligned.
    AtomicUnaligned = 1005,
    /// The sum of the SGE lengths exceeds the 2 GiB RDMA message limit, or
    /// one SGE is 2 GiB or longer (bit 31 of an mlx5 byte count means
    /// "inline").
    LengthOverflow = 1006,
    /// An opcode value that is not a known work-request opcode (C ABI).
    InvalidOpcode = 1007,
    /// Unknown or contradictory flag bits (C ABI).
    InvalidFlags = 1008,
    /// A NULL pointer where data is required (C ABI: SGE array, inline
    /// payload).
    NullPointer = 1009,
    /// Immediate data given on an opcode that has none (C ABI).
    InvalidImmediate = 1010,
    /// A datagram (UD) message longer than the path MTU: a UD message is
    /// one packet.
    ExceedsMtu = 1011,

    // ---- 1100..1199: queue state ----
    /// The send queue has no room for this WQE (counted in 64-byte basic
    /// blocks, not in work requests).
    SqFull = 1101,
    /// The receive queue has no free entry.
    RqFull = 1102,
    /// The QP's state does not allow this operation (e.g. a send before
    /// RTS, a receive in RESET).
    InvalidQpState = 1103,

    // ---- 1200..1299: queue descriptors handed in by the caller ----
    /// A ring size that is not a power of two, a stride other than the
    /// provider's, a NULL or misaligned buffer, or a size out of range.
    InvalidGeometry = 1201,
    /// Caller-provided side-table storage is smaller than the ring.
    StorageTooSmall = 1202,
    /// A QP number wider than 24 bits.
    InvalidQpn = 1203,

    // ---- 1400..1499: control path (devices, PDs, MRs, CQs, QPs) ----
    /// No object with that handle, key or number exists (or it was
    /// destroyed).
    NoSuchObject = 1401,
    /// The object is still in use (a CQ with QPs attached, a PD with
    /// regions or QPs).
    ResourceBusy = 1402,
    /// An attribute is out of range or not valid for the requested QP
    /// state transition.
    InvalidAttribute = 1403,
    /// The device has no room for another object of this kind.
    ResourceExhausted = 1404,
    /// The backend cannot do this (e.g. an operation that needs the direct
    /// mlx5 queues on a device served by the verbs fallback).
    Unsupported = 1405,
    /// No RDMA device, or none with the requested name (on a host whose
    /// kernel has no RDMA support, libibverbs lists nothing).
    NoDevice = 1406,
    /// A bounded wait ran out (connection setup, an out-of-band exchange,
    /// waiting for a completion).
    Timeout = 1407,
    /// Connection setup failed in a way worth retrying: the peer refused
    /// or reset, rdma_cm reported a connect or address error, or the peer
    /// went away during the exchange.
    ConnectFailed = 1408,
    /// A provider call failed with an error this crate has no closer code
    /// for; `verbs::last_error()` has the call and its errno.
    ProviderError = 1409,
    /// The peer sent malformed connection data.
    ProtocolError = 1410,
    /// The CQ cannot hold the worst case of completions its QPs could have
    /// outstanding (every WR their queues can hold, flushed at once): a
    /// deeper CQ is needed (`Cq::depth_needed`), or an explicit opt-out
    /// (`Cq::set_unguarded`).
    CqTooSmall = 1411,
    /// Posting this WR could overrun a CQ that opted out of the sizing
    /// guard (`Cq::set_unguarded`): the completions already expected on it
    /// fill it. Poll the CQ, then post again.
    CqFull = 1412,
    /// Huge-page backing was asked for and cannot be had: the size is not
    /// a multiple of 2 MiB, or the system has no free 2 MiB pages
    /// (`/proc/sys/vm/nr_hugepages`).
    HugePagesUnavailable = 1413,
    /// Flow control: the peer has no receive posted for another SEND (no
    /// credit left); wait for credits or retry later.
    NoCredits = 1414,

    // ---- 1300..1399: completions (device-written memory is untrusted) ----
    /// A compressed CQE (format 3). Compression is never requested by this
    /// crate; seeing one means the CQ was created by someone else with
    /// compression enabled. The CQ cannot be polled further.
    CqeCompressed = 1301,
    /// A CQE whose fields are inconsistent: unknown opcode, or a
    /// `wqe_counter` that does not name an outstanding WQE. The entry is
    /// consumed and reported; it is never used to index anything.
    CqeCorrupt = 1302,
}

impl Error {
    /// The stable numeric code (also the C `rdd_status` value).
    #[inline]
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// Maps a numeric code back to the error, if it is one.
    pub const fn from_code(code: u32) -> Option<Error> {
        Some(match code {
            1001 => Error::TooManySges,
            1002 => Error::InlineTooLarge,
            1003 => Error::InlineNotAllowed,
            1004 => Error::AtomicSgeLength,
            1005 => Error::AtomicUnaligned,
            1006 => Error::LengthOverflow,
            1007 => Error::InvalidOpcode,
            1008 => Error::InvalidFlags,
            1009 => Error::NullPointer,
            1010 => Error::InvalidImmediate,
            1011 => Error::ExceedsMtu,
            1101 => Error::SqFull,
            1102 => Error::RqFull,
            1103 => Error::InvalidQpState,
            1201 => Error::InvalidGeometry,
            1202 => Error::StorageTooSmall,
            1203 => Error::InvalidQpn,
            1401 => Error::NoSuchObject,
            1402 => Error::ResourceBusy,
            1403 => Error::InvalidAttribute,
            1404 => Error::ResourceExhausted,
            1405 => Error::Unsupported,
            1406 => Error::NoDevice,
            1407 => Error::Timeout,
            1408 => Error::ConnectFailed,
            1409 => Error::ProviderError,
            1410 => Error::ProtocolError,
            1411 => Error::CqTooSmall,
            1412 => Error::CqFull,
            1413 => Error::HugePagesUnavailable,
            1414 => Error::NoCredits,
            1301 => Error::CqeCompressed,
            1302 => Error::CqeCorrupt,
            _ => return None,
        })
    }

    /// A short, static description.
    pub const fn message(self) -> &'static str {
        match self {
            Error::TooManySges => "more scatter/gather entries than the queue allows",
            Error::InlineTooLarge => "inline payload exceeds the QP's max_inline_data",
            Error::InlineNotAllowed => "inline data is not allowed on RDMA READ or atomics",
            Error::AtomicSgeLength => "an atomic needs exactly one 8-byte local SGE",
            Error::AtomicUnaligned => "an atomic's remote address must be 8-byte aligned",
            Error::LengthOverflow => "total message length overflows (limit 2 GiB)",
            Error::InvalidOpcode => "unknown work-request opcode",
            Error::InvalidFlags => "unknown or contradictory work-request flags",
            Error::NullPointer => "NULL pointer where data is required",
            Error::InvalidImmediate => "immediate data given on an opcode without one",
            Error::ExceedsMtu => "a datagram longer than the path MTU",
            Error::SqFull => "send queue full (no free basic blocks)",
            Error::RqFull => "receive queue full",
            Error::InvalidQpState => "the QP state does not allow this operation",
            Error::InvalidGeometry => "invalid queue geometry (size, stride or alignment)",
            Error::StorageTooSmall => "side-table storage smaller than the ring",
            Error::InvalidQpn => "QP number wider than 24 bits",
            Error::NoSuchObject => "no such object (unknown or destroyed handle)",
            Error::ResourceBusy => "object still in use",
            Error::InvalidAttribute => "invalid attribute or state transition",
            Error::ResourceExhausted => "device resources exhausted",
            Error::Unsupported => "not supported by this backend or device",
            Error::NoDevice => "no RDMA device (or none with that name)",
            Error::Timeout => "timed out",
            Error::ConnectFailed => "connection setup failed (transient: retry may succeed)",
            Error::ProviderError => "the RDMA provider reported an error",
            Error::ProtocolError => "malformed connection data from the peer",
            Error::CqTooSmall => {
                "CQ too small for the worst case of outstanding completions of its QPs"
            }
            Error::CqFull => "the CQ has no headroom for this WR's completion: poll it first",
            Error::HugePagesUnavailable => {
                "huge pages unavailable (size not a multiple of 2 MiB, or no free 2 MiB pages)"
            }
            Error::NoCredits => "no flow-control credit: the peer has no receive posted",
            Error::CqeCompressed => "compressed CQE: compression is not supported",
            Error::CqeCorrupt => "corrupt CQE (bad opcode or wqe_counter)",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (rdma-direct error {})", self.message(), self.code())
    }
}

impl core::error::Error for Error {}

/// A batch post stopped at WR `index` with `error`; the WRs before it
/// were posted (and rung), the failed one and those after it were not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Index of the WR that was refused.
    pub index: usize,
    /// Why.
    pub error: Error,
}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        e.error
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} refused: {}", self.index, self.error)
    }
}

impl core::error::Error for PostError {}

/// Result alias used across the crate.
pub type Result<T> = core::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let all = [
            Error::TooManySges,
            Error::InlineTooLarge,
            Error::InlineNotAllowed,
            Error::AtomicSgeLength,
            Error::AtomicUnaligned,
            Error::LengthOverflow,
            Error::InvalidOpcode,
            Error::InvalidFlags,
            Error::NullPointer,
            Error::InvalidImmediate,
            Error::ExceedsMtu,
            Error::SqFull,
            Error::RqFull,
            Error::InvalidQpState,
            Error::InvalidGeometry,
            Error::StorageTooSmall,
            Error::InvalidQpn,
            Error::NoSuchObject,
            Error::ResourceBusy,
            Error::InvalidAttribute,
            Error::ResourceExhausted,
            Error::Unsupported,
            Error::NoDevice,
            Error::Timeout,
            Error::ConnectFailed,
            Error::ProviderError,
            Error::ProtocolError,
            Error::CqTooSmall,
            Error::CqFull,
            Error::HugePagesUnavailable,
            Error::NoCredits,
            Error::CqeCompressed,
            Error::CqeCorrupt,
        ];
        for (i, e) in all.iter().enumerate() {
            assert_eq!(Error::from_code(e.code()), Some(*e));
            for f in &all[i + 1..] {
                assert_ne!(e.code(), f.code());
            }
        }
        assert_eq!(Error::from_code(0), None);
        assert_eq!(Error::SqFull.code(), 1101);
    }
}
