//! `rdd_status`, its messages, and the library version.

use core::ffi::c_char;
use core::ptr;

use static_assertions::const_assert_eq;

use crate::error::Error;

/// The status every C function returns. 0 is success.
///
/// Values are stable and never reused; retired values stay listed here as
/// comments. 1001..1999 are the crate's `Error` codes, one for one;
/// 2001..2099 exist only at the C boundary. C code must treat any value it
/// does not know as a failure.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum rdd_status {
    /// Success.
    Ok = 0,

    // ---- 1000..1099: work-request validation (nothing was written) ----
    /// More scatter/gather entries than the queue allows or a WQE holds.
    TooManySges = 1001,
    /// Inline payload larger than the QP's `max_inline_data`.
    InlineTooLarge = 1002,
    /// Inline data on RDMA READ, an atomic or a NOP.
    InlineNotAllowed = 1003,
    /// An atomic whose local SGE is not exactly one 8-byte entry.
    AtomicSgeLength = 1004,
    /// An atomic whose remote address is not 8-byte aligned.
    AtomicUnaligned = 1005,
    /// The total message length overflows (limit 2 GiB).
    LengthOverflow = 1006,
    /// Unknown work-request opcode.
    InvalidOpcode = 1007,
    /// Unknown work-request flag bits.
    InvalidFlags = 1008,
    /// A NULL pointer inside a work request (SGE array, inline payload).
    NullPointer = 1009,
    /// Immediate data on an opcode that has none.
    InvalidImmediate = 1010,
    /// A UD message longer than the path MTU.
    ExceedsMtu = 1011,

    // ---- 1100..1199: queue state ----
    /// The send queue has no room for the WQE.
    SqFull = 1101,
    /// The receive queue has no free entry.
    RqFull = 1102,
    /// The QP state does not allow the operation.
    InvalidQpState = 1103,

    // ---- 1200..1299: queue descriptors ----
    /// Invalid queue geometry (size, stride, NULL or misaligned buffer).
    InvalidGeometry = 1201,
    /// Side-table storage smaller than the ring.
    StorageTooSmall = 1202,
    /// A QP number wider than 24 bits.
    InvalidQpn = 1203,

    // ---- 1300..1399: completions ----
    /// A compressed CQE; the CQ cannot be polled further.
    CqeCompressed = 1301,
    /// A corrupt CQE (consumed and reported).
    CqeCorrupt = 1302,

    // ---- 1400..1499: control path ----
    /// No object with that handle, key or number exists.
    NoSuchObject = 1401,
    /// The object is still in use.
    ResourceBusy = 1402,
    /// An attribute out of range or invalid for the QP state transition.
    InvalidAttribute = 1403,
    /// The device has no room for another object of this kind.
    ResourceExhausted = 1404,
    /// Not supported by this backend or device.
    Unsupported = 1405,
    /// No RDMA device, or none with that name.
    NoDevice = 1406,
    /// A bounded wait ran out.
    Timeout = 1407,
    /// Connection setup failed; a retry may succeed.
    ConnectFailed = 1408,
    /// The RDMA provider reported an error.
    ProviderError = 1409,
    /// Malformed connection data from the peer.
    ProtocolError = 1410,
    /// The CQ cannot hold the worst case of its QPs' completions.
    CqTooSmall = 1411,
    /// Posting could overrun an unguarded CQ: poll it first.
    CqFull = 1412,
    /// Huge pages unavailable for a buffer pool.
    HugePagesUnavailable = 1413,
    /// Flow control: no credit for another SEND.
    NoCredits = 1414,

    // ---- 2000..2099: C boundary only ----
    /// A required pointer parameter was NULL; nothing happened.
    NullParameter = 2001,
    /// A queue handle that was never initialised, was finalised, or was
    /// moved/copied after `_init`.
    InvalidHandle = 2002,
    /// The output buffer is too small; nothing was written to it.
    BufferTooSmall = 2003,
    /// A Rust panic was caught at the boundary (`std` builds only).
    Panic = 2004,
    /// An argument out of range: unknown init/arm flag bits, a misaligned
    /// array, a non-zero reserved field, a count too large to address.
    InvalidArgument = 2005,
}

// Every crate error keeps its code at the boundary (the exhaustive match in
// `rdd_status::from_error` makes a new `Error` variant a compile error).
const_assert_eq!(rdd_status::TooManySges as u32, Error::TooManySges.code());
const_assert_eq!(
    rdd_status::InlineTooLarge as u32,
    Error::InlineTooLarge.code()
);
const_assert_eq!(
    rdd_status::InlineNotAllowed as u32,
    Error::InlineNotAllowed.code()
);
const_assert_eq!(
    rdd_status::AtomicSgeLength as u32,
    Error::AtomicSgeLength.code()
);
const_assert_eq!(
    rdd_status::AtomicUnaligned as u32,
    Error::AtomicUnaligned.code()
);
const_assert_eq!(
    rdd_status::LengthOverflow as u32,
    Error::LengthOverflow.code()
);
const_assert_eq!(
    rdd_status::InvalidOpcode as u32,
    Error::InvalidOpcode.code()
);
const_assert_eq!(rdd_status::InvalidFlags as u32, Error::InvalidFlags.code());
const_assert_eq!(rdd_status::NullPointer as u32, Error::NullPointer.code());
const_assert_eq!(rdd_status::ExceedsMtu as u32, Error::ExceedsMtu.code());
const_assert_eq!(
    rdd_status::InvalidImmediate as u32,
    Error::InvalidImmediate.code()
);
const_assert_eq!(rdd_status::SqFull as u32, Error::SqFull.code());
const_assert_eq!(rdd_status::RqFull as u32, Error::RqFull.code());
const_assert_eq!(
    rdd_status::InvalidQpState as u32,
    Error::InvalidQpState.code()
);
const_assert_eq!(
    rdd_status::InvalidGeometry as u32,
    Error::InvalidGeometry.code()
);
const_assert_eq!(
    rdd_status::StorageTooSmall as u32,
    Error::StorageTooSmall.code()
);
const_assert_eq!(rdd_status::InvalidQpn as u32, Error::InvalidQpn.code());
const_assert_eq!(
    rdd_status::CqeCompressed as u32,
    Error::CqeCompressed.code()
);
const_assert_eq!(rdd_status::CqeCorrupt as u32, Error::CqeCorrupt.code());
const_assert_eq!(rdd_status::NoSuchObject as u32, Error::NoSuchObject.code());
const_assert_eq!(rdd_status::ResourceBusy as u32, Error::ResourceBusy.code());
const_assert_eq!(
    rdd_status::InvalidAttribute as u32,
    Error::InvalidAttribute.code()
);
const_assert_eq!(
    rdd_status::ResourceExhausted as u32,
    Error::ResourceExhausted.code()
);

const_assert_eq!(rdd_status::Unsupported as u32, Error::Unsupported.code());
const_assert_eq!(rdd_status::NoDevice as u32, Error::NoDevice.code());
const_assert_eq!(rdd_status::Timeout as u32, Error::Timeout.code());
const_assert_eq!(
    rdd_status::ConnectFailed as u32,
    Error::ConnectFailed.code()
);
const_assert_eq!(
    rdd_status::ProviderError as u32,
    Error::ProviderError.code()
);
const_assert_eq!(
    rdd_status::ProtocolError as u32,
    Error::ProtocolError.code()
);
const_assert_eq!(rdd_status::CqTooSmall as u32, Error::CqTooSmall.code());
const_assert_eq!(rdd_status::CqFull as u32, Error::CqFull.code());
const_assert_eq!(
    rdd_status::HugePagesUnavailable as u32,
    Error::HugePagesUnavailable.code()
);
const_assert_eq!(rdd_status::NoCredits as u32, Error::NoCredits.code());

impl From<Error> for rdd_status {
    #[inline]
    fn from(e: Error) -> rdd_status {
        rdd_status::from_error(e)
    }
}

/// Message `rdd_status_str` writes for a value that is not a status.
const UNKNOWN_STATUS: &str = "unknown rdd_status value";

impl rdd_status {
    /// Maps an integer from C to a status; `None` for unknown values.
    pub const fn from_u32(v: u32) -> Option<rdd_status> {
        if v == 0 {
            return Some(rdd_status::Ok);
        }
        if let Some(e) = Error::from_code(v) {
            return Some(Self::from_error(e));
        }
        Some(match v {
            2001 => rdd_status::NullParameter,
            2002 => rdd_status::InvalidHandle,
            2003 => rdd_status::BufferTooSmall,
            2004 => rdd_status::Panic,
            2005 => rdd_status::InvalidArgument,
            _ => return None,
        })
    }

    /// The status of a crate error (same code; the match is exhaustive, so
    /// a new `Error` variant does not compile until it is mapped here).
    pub const fn from_error(e: Error) -> rdd_status {
        match e {
            Error::TooManySges => rdd_status::TooManySges,
            Error::InlineTooLarge => rdd_status::InlineTooLarge,
            Error::InlineNotAllowed => rdd_status::InlineNotAllowed,
            Error::AtomicSgeLength => rdd_status::AtomicSgeLength,
            Error::AtomicUnaligned => rdd_status::AtomicUnaligned,
            Error::LengthOverflow => rdd_status::LengthOverflow,
            Error::InvalidOpcode => rdd_status::InvalidOpcode,
            Error::InvalidFlags => rdd_status::InvalidFlags,
            Error::NullPointer => rdd_status::NullPointer,
            Error::InvalidImmediate => rdd_status::InvalidImmediate,
            Error::ExceedsMtu => rdd_status::ExceedsMtu,
            Error::SqFull => rdd_status::SqFull,
            Error::RqFull => rdd_status::RqFull,
            Error::InvalidQpState => rdd_status::InvalidQpState,
            Error::InvalidGeometry => rdd_status::InvalidGeometry,
            Error::StorageTooSmall => rdd_status::StorageTooSmall,
            Error::InvalidQpn => rdd_status::InvalidQpn,
            Error::CqeCompressed => rdd_status::CqeCompressed,
            Error::CqeCorrupt => rdd_status::CqeCorrupt,
            Error::NoSuchObject => rdd_status::NoSuchObject,
            Error::ResourceBusy => rdd_status::ResourceBusy,
            Error::InvalidAttribute => rdd_status::InvalidAttribute,
            Error::ResourceExhausted => rdd_status::ResourceExhausted,
            Error::Unsupported => rdd_status::Unsupported,
            Error::NoDevice => rdd_status::NoDevice,
            Error::Timeout => rdd_status::Timeout,
            Error::ConnectFailed => rdd_status::ConnectFailed,
            Error::ProviderError => rdd_status::ProviderError,
            Error::ProtocolError => rdd_status::ProtocolError,
            Error::CqTooSmall => rdd_status::CqTooSmall,
            Error::CqFull => rdd_status::CqFull,
            Error::HugePagesUnavailable => rdd_status::HugePagesUnavailable,
            Error::NoCredits => rdd_status::NoCredits,
        }
    }

    /// The numeric value C sees.
    #[inline]
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// A short, static description (no NUL).
    pub const fn message(self) -> &'static str {
        match self {
            rdd_status::Ok => "success",
            rdd_status::NullParameter => "a required pointer parameter is NULL",
            rdd_status::InvalidHandle => {
                "invalid handle: never valid, destroyed or finalised, or a queue handle moved after init"
            }
            rdd_status::BufferTooSmall => "output buffer too small",
            rdd_status::Panic => "a panic was caught at the C boundary",
            rdd_status::InvalidArgument => {
                "invalid argument (unknown flag bits, misaligned array, non-zero reserved field)"
            }
            other => match Error::from_code(other as u32) {
                Some(e) => e.message(),
                None => UNKNOWN_STATUS,
            },
        }
    }
}

/// Writes the message for `status` into `buf` as a NUL-terminated string.
///
/// `status` is a plain integer: any value is accepted, and one that is not
/// an `rdd_status` gets the message "unknown rdd_status value" (and the call
/// still succeeds). Nothing is allocated.
///
/// `*out_n` is the size of the message in bytes *including* the NUL, i.e.
/// the buffer length needed:
/// - `RDD_STATUS_OK`: the message and its NUL were written to `buf`, and
///   `*out_n` holds the number of bytes written (`strlen(buf) + 1`).
/// - `RDD_STATUS_BUFFER_TOO_SMALL` (`len < *out_n`): nothing is written to
///   `buf` (no truncated message), `*out_n` holds the size needed. Passing
///   `buf = NULL, len = 0` is the way to ask for the size.
/// - `RDD_STATUS_NULL_PARAMETER`: `out_n` is NULL, or `buf` is NULL with
///   `len > 0`; nothing is written.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes (unless `len` is 0) and
/// `out_n` valid for a write of one `size_t`; neither may overlap.
#[no_mangle]
pub unsafe extern "C" fn rdd_status_str(
    status: u32,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_n);
        if buf.is_null() && len != 0 {
            return rdd_status::NullParameter;
        }
        let msg = match rdd_status::from_u32(status) {
            Some(s) => s.message(),
            None => UNKNOWN_STATUS,
        };
        // SAFETY: the caller's contract, forwarded.
        unsafe { write_message(msg, buf, len, out_n) }
    })
}

/// Copies `msg` and a NUL into `buf` with `rdd_status_str`'s contract.
///
/// # Safety
/// As `rdd_status_str`; `out_n` is non-NULL, and `buf` is non-NULL when
/// `len > 0`.
unsafe fn write_message(msg: &str, buf: *mut c_char, len: usize, out_n: *mut usize) -> rdd_status {
    let needed = msg.len() + 1;
    if len < needed {
        // SAFETY: `out_n` is non-NULL and valid for a write (caller
        // contract); unaligned writes are allowed.
        unsafe { out_n.write_unaligned(needed) };
        return rdd_status::BufferTooSmall;
    }
    // SAFETY: `buf` is valid for `len >= msg.len() + 1` bytes (caller
    // contract) and cannot overlap the static message; `out_n` is non-NULL
    // and valid for a write.
    unsafe {
        ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), msg.len());
        buf.add(msg.len()).write(0);
        out_n.write_unaligned(needed);
    }
    rdd_status::Ok
}

/// Writes the likely causes of a completion status (`RDD_WC_*`, e.g. from
/// `rdd_wc.status` or `rdd_failed_wr.status`) into `buf`, with the same
/// buffer contract as `rdd_status_str`. Unknown values get the text for a
/// general error.
///
/// # Safety
/// As `rdd_status_str`.
#[no_mangle]
pub unsafe extern "C" fn rdd_wc_status_causes(
    wc_status: u32,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_n);
        if buf.is_null() && len != 0 {
            return rdd_status::NullParameter;
        }
        let msg = crate::wr::status_causes(crate::completion::WcStatus(wc_status));
        // SAFETY: the caller's contract, forwarded.
        unsafe { write_message(msg, buf, len, out_n) }
    })
}

/// The crate version, NUL-terminated, for `rdd_version`.
static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// Major version of the library the header was generated from.
pub const RDD_VERSION_MAJOR: u32 = 0;
/// Minor version of the library the header was generated from.
pub const RDD_VERSION_MINOR: u32 = 1;
/// Patch version of the library the header was generated from.
pub const RDD_VERSION_PATCH: u32 = 0;

/// Parses a decimal Cargo version component at compile time.
const fn parse_version_part(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut v = 0u32;
    let mut i = 0;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

// The header's version macros come from the literals above; a version bump
// in Cargo.toml without updating them (and regenerating the header with
// `scripts/header.sh --write`) fails the build here.
const _: () = assert!(
    RDD_VERSION_MAJOR == parse_version_part(env!("CARGO_PKG_VERSION_MAJOR"))
        && RDD_VERSION_MINOR == parse_version_part(env!("CARGO_PKG_VERSION_MINOR"))
        && RDD_VERSION_PATCH == parse_version_part(env!("CARGO_PKG_VERSION_PATCH")),
    "RDD_VERSION_* in src/ffi/status.rs differ from Cargo.toml: update them and run scripts/header.sh --write"
);

/// The library version (`CARGO_PKG_VERSION`, e.g. "0.1.0") as a static
/// NUL-terminated string; never NULL, never to be freed.
#[no_mangle]
pub extern "C" fn rdd_version() -> *const c_char {
    VERSION.as_ptr().cast::<c_char>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_str(code: u32, len: usize) -> (rdd_status, usize, std::vec::Vec<u8>) {
        let mut buf = std::vec![0xaau8; len];
        let mut n = usize::MAX;
        let p = if len == 0 {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast()
        };
        // SAFETY: buf has `len` bytes; n is a local.
        let s = unsafe { rdd_status_str(code, p, len, &mut n) };
        (s, n, buf)
    }

    #[test]
    fn every_code_maps_and_has_a_message() {
        for v in 0..3000u32 {
            match rdd_status::from_u32(v) {
                Some(s) => {
                    assert_eq!(s.code(), v);
                    assert!(!s.message().is_empty());
                    assert!(!s.message().contains('\0'));
                    assert_ne!(s.message(), UNKNOWN_STATUS);
                    if let Some(e) = Error::from_code(v) {
                        assert_eq!(rdd_status::from(e), s);
                        assert_eq!(s.message(), e.message());
                    }
                }
                None => assert!(Error::from_code(v).is_none()),
            }
        }
    }

    #[test]
    fn status_str_contract() {
        let msg = rdd_status::SqFull.message();
        let (s, n, buf) = status_str(1101, 128);
        assert_eq!(s, rdd_status::Ok);
        assert_eq!(n, msg.len() + 1);
        assert_eq!(&buf[..msg.len()], msg.as_bytes());
        assert_eq!(buf[msg.len()], 0);
        // Exactly enough.
        let (s, n, _) = status_str(1101, msg.len() + 1);
        assert_eq!((s, n), (rdd_status::Ok, msg.len() + 1));
        // One short: nothing written, size reported.
        let (s, n, buf) = status_str(1101, msg.len());
        assert_eq!((s, n), (rdd_status::BufferTooSmall, msg.len() + 1));
        assert!(buf.iter().all(|&b| b == 0xaa));
        // Size query.
        let (s, n, _) = status_str(1101, 0);
        assert_eq!((s, n), (rdd_status::BufferTooSmall, msg.len() + 1));
        // Unknown values still get a message.
        let (s, _, buf) = status_str(999_999, 64);
        assert_eq!(s, rdd_status::Ok);
        assert_eq!(&buf[..UNKNOWN_STATUS.len()], UNKNOWN_STATUS.as_bytes());
        // NULL parameters.
        let mut b = [0u8; 8];
        // SAFETY: NULL out_n is rejected before any access.
        let s = unsafe { rdd_status_str(0, b.as_mut_ptr().cast(), 8, ptr::null_mut()) };
        assert_eq!(s, rdd_status::NullParameter);
        let mut n = 7usize;
        // SAFETY: NULL buf with len > 0 is rejected before any access.
        let s = unsafe { rdd_status_str(0, ptr::null_mut(), 8, &mut n) };
        assert_eq!((s, n), (rdd_status::NullParameter, 7));
    }

    #[test]
    fn version_string() {
        // SAFETY: rdd_version returns a static NUL-terminated string.
        let v = unsafe { core::ffi::CStr::from_ptr(rdd_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[cfg(feature = "std")]
    #[test]
    fn panic_boundary_maps_to_status() {
        fn boom(x: u32) -> rdd_status {
            ffi_boundary!({
                if x == 1 {
                    panic!("boundary test");
                }
                rdd_status::Ok
            })
        }
        assert_eq!(boom(0), rdd_status::Ok);
        assert_eq!(boom(1), rdd_status::Panic);
    }
}
