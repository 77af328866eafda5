//! The names of the C constants, as static strings for logs
//! (`rdd_status_name`, `rdd_wc_status_name`, `rdd_wc_opcode_name`): the
//! counterpart of libibverbs' `ibv_wc_status_str`, spelling each value
//! as the header does. A unit test checks every name against the
//! committed header.

use core::ffi::{c_char, CStr};

use crate::ffi::mlx5::*;
use crate::ffi::status::rdd_status;

/// What every name function gives for a value it does not know.
const UNKNOWN: &CStr = c"unknown";

/// The header's name of a status value.
pub(crate) const fn status_name(v: u32) -> &'static CStr {
    let Some(s) = rdd_status::from_u32(v) else {
        return UNKNOWN;
    };
    match s {
        rdd_status::Ok => c"RDD_STATUS_OK",
        rdd_status::TooManySges => c"RDD_STATUS_TOO_MANY_SGES",
        rdd_status::InlineTooLarge => c"RDD_STATUS_INLINE_TOO_LARGE",
        rdd_status::InlineNotAllowed => c"RDD_STATUS_INLINE_NOT_ALLOWED",
        rdd_status::AtomicSgeLength => c"RDD_STATUS_ATOMIC_SGE_LENGTH",
        rdd_status::AtomicUnaligned => c"RDD_STATUS_ATOMIC_UNALIGNED",
        rdd_status::LengthOverflow => c"RDD_STATUS_LENGTH_OVERFLOW",
        rdd_status::InvalidOpcode => c"RDD_STATUS_INVALID_OPCODE",
        rdd_status::InvalidFlags => c"RDD_STATUS_INVALID_FLAGS",
        rdd_status::NullPointer => c"RDD_STATUS_NULL_POINTER",
        rdd_status::InvalidImmediate => c"RDD_STATUS_INVALID_IMMEDIATE",
        rdd_status::ExceedsMtu => c"RDD_STATUS_EXCEEDS_MTU",
        rdd_status::SqFull => c"RDD_STATUS_SQ_FULL",
        rdd_status::RqFull => c"RDD_STATUS_RQ_FULL",
        rdd_status::InvalidQpState => c"RDD_STATUS_INVALID_QP_STATE",
        rdd_status::InvalidGeometry => c"RDD_STATUS_INVALID_GEOMETRY",
        rdd_status::StorageTooSmall => c"RDD_STATUS_STORAGE_TOO_SMALL",
        rdd_status::InvalidQpn => c"RDD_STATUS_INVALID_QPN",
        rdd_status::CqeCompressed => c"RDD_STATUS_CQE_COMPRESSED",
        rdd_status::CqeCorrupt => c"RDD_STATUS_CQE_CORRUPT",
        rdd_status::NoSuchObject => c"RDD_STATUS_NO_SUCH_OBJECT",
        rdd_status::ResourceBusy => c"RDD_STATUS_RESOURCE_BUSY",
        rdd_status::InvalidAttribute => c"RDD_STATUS_INVALID_ATTRIBUTE",
        rdd_status::ResourceExhausted => c"RDD_STATUS_RESOURCE_EXHAUSTED",
        rdd_status::Unsupported => c"RDD_STATUS_UNSUPPORTED",
        rdd_status::NoDevice => c"RDD_STATUS_NO_DEVICE",
        rdd_status::Timeout => c"RDD_STATUS_TIMEOUT",
        rdd_status::ConnectFailed => c"RDD_STATUS_CONNECT_FAILED",
        rdd_status::ProviderError => c"RDD_STATUS_PROVIDER_ERROR",
        rdd_status::ProtocolError => c"RDD_STATUS_PROTOCOL_ERROR",
        rdd_status::CqTooSmall => c"RDD_STATUS_CQ_TOO_SMALL",
        rdd_status::CqFull => c"RDD_STATUS_CQ_FULL",
        rdd_status::HugePagesUnavailable => c"RDD_STATUS_HUGE_PAGES_UNAVAILABLE",
        rdd_status::NoCredits => c"RDD_STATUS_NO_CREDITS",
        rdd_status::NullParameter => c"RDD_STATUS_NULL_PARAMETER",
        rdd_status::InvalidHandle => c"RDD_STATUS_INVALID_HANDLE",
        rdd_status::BufferTooSmall => c"RDD_STATUS_BUFFER_TOO_SMALL",
        rdd_status::Panic => c"RDD_STATUS_PANIC",
        rdd_status::InvalidArgument => c"RDD_STATUS_INVALID_ARGUMENT",
    }
}

/// The header's name of a completion status.
pub(crate) const fn wc_status_name(v: u32) -> &'static CStr {
    match v {
        RDD_WC_SUCCESS => c"RDD_WC_SUCCESS",
        RDD_WC_LOC_LEN_ERR => c"RDD_WC_LOC_LEN_ERR",
        RDD_WC_LOC_QP_OP_ERR => c"RDD_WC_LOC_QP_OP_ERR",
        RDD_WC_LOC_EEC_OP_ERR => c"RDD_WC_LOC_EEC_OP_ERR",
        RDD_WC_LOC_PROT_ERR => c"RDD_WC_LOC_PROT_ERR",
        RDD_WC_WR_FLUSH_ERR => c"RDD_WC_WR_FLUSH_ERR",
        RDD_WC_MW_BIND_ERR => c"RDD_WC_MW_BIND_ERR",
        RDD_WC_BAD_RESP_ERR => c"RDD_WC_BAD_RESP_ERR",
        RDD_WC_LOC_ACCESS_ERR => c"RDD_WC_LOC_ACCESS_ERR",
        RDD_WC_REM_INV_REQ_ERR => c"RDD_WC_REM_INV_REQ_ERR",
        RDD_WC_REM_ACCESS_ERR => c"RDD_WC_REM_ACCESS_ERR",
        RDD_WC_REM_OP_ERR => c"RDD_WC_REM_OP_ERR",
        RDD_WC_RETRY_EXC_ERR => c"RDD_WC_RETRY_EXC_ERR",
        RDD_WC_RNR_RETRY_EXC_ERR => c"RDD_WC_RNR_RETRY_EXC_ERR",
        RDD_WC_LOC_RDD_VIOL_ERR => c"RDD_WC_LOC_RDD_VIOL_ERR",
        RDD_WC_REM_INV_RD_REQ_ERR => c"RDD_WC_REM_INV_RD_REQ_ERR",
        RDD_WC_REM_ABORT_ERR => c"RDD_WC_REM_ABORT_ERR",
        RDD_WC_INV_EECN_ERR => c"RDD_WC_INV_EECN_ERR",
        RDD_WC_INV_EEC_STATE_ERR => c"RDD_WC_INV_EEC_STATE_ERR",
        RDD_WC_FATAL_ERR => c"RDD_WC_FATAL_ERR",
        RDD_WC_RESP_TIMEOUT_ERR => c"RDD_WC_RESP_TIMEOUT_ERR",
        RDD_WC_GENERAL_ERR => c"RDD_WC_GENERAL_ERR",
        _ => UNKNOWN,
    }
}

/// The header's name of a completion opcode.
pub(crate) const fn wc_opcode_name(v: u32) -> &'static CStr {
    match v {
        RDD_WC_OP_SEND => c"RDD_WC_OP_SEND",
        RDD_WC_OP_RDMA_WRITE => c"RDD_WC_OP_RDMA_WRITE",
        RDD_WC_OP_RDMA_READ => c"RDD_WC_OP_RDMA_READ",
        RDD_WC_OP_COMP_SWAP => c"RDD_WC_OP_COMP_SWAP",
        RDD_WC_OP_FETCH_ADD => c"RDD_WC_OP_FETCH_ADD",
        RDD_WC_OP_BIND_MW => c"RDD_WC_OP_BIND_MW",
        RDD_WC_OP_LOCAL_INV => c"RDD_WC_OP_LOCAL_INV",
        RDD_WC_OP_RECV => c"RDD_WC_OP_RECV",
        RDD_WC_OP_RECV_RDMA_WITH_IMM => c"RDD_WC_OP_RECV_RDMA_WITH_IMM",
        _ => UNKNOWN,
    }
}

/// The name of a status as the header spells it (`"RDD_STATUS_SQ_FULL"`),
/// for logs; `rdd_status_str` gives the message. Any value is accepted:
/// one that is not an `rdd_status` gives `"unknown"`. A static
/// NUL-terminated string, never NULL, never to be freed.
#[no_mangle]
pub extern "C" fn rdd_status_name(status: u32) -> *const c_char {
    ffi_boundary!({ status_name(status).as_ptr() })
}

/// The name of a completion status (`rdd_wc.status`, `RDD_WC_*`) as the
/// header spells it (`"RDD_WC_REM_ACCESS_ERR"`), like libibverbs'
/// `ibv_wc_status_str`; `rdd_wc_status_causes` explains it. Any value is
/// accepted: one that is not an `RDD_WC_*` status gives `"unknown"`. A
/// static NUL-terminated string, never NULL, never to be freed.
#[no_mangle]
pub extern "C" fn rdd_wc_status_name(status: u32) -> *const c_char {
    ffi_boundary!({ wc_status_name(status).as_ptr() })
}

/// The name of a completion opcode (`rdd_wc.opcode`, `RDD_WC_OP_*`) as the
/// header spells it (`"RDD_WC_OP_FETCH_ADD"`). Any value is accepted: one
/// that is not an `RDD_WC_OP_*` gives `"unknown"`. A static
/// NUL-terminated string, never NULL, never to be freed.
#[no_mangle]
pub extern "C" fn rdd_wc_opcode_name(opcode: u32) -> *const c_char {
    ffi_boundary!({ wc_opcode_name(opcode).as_ptr() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, value)` of every `#define PREFIX... value` and every enum
    /// item `PREFIX... = value,` in the committed header.
    fn header_constants(prefix: &str) -> std::vec::Vec<(std::string::String, u32)> {
        let h = include_str!("../../include/rdma_direct.h");
        let mut v = std::vec::Vec::new();
        for line in h.lines() {
            let t = line.trim();
            let (name, value) = if let Some(rest) = t.strip_prefix("#define ") {
                match rest.split_once(' ') {
                    Some((n, val)) => (n, val.trim()),
                    None => continue,
                }
            } else if let Some((n, val)) = t.split_once(" = ") {
                (n, val.trim_end_matches(','))
            } else {
                continue;
            };
            if !name.starts_with(prefix) {
                continue;
            }
            if let Ok(x) = value.parse::<u32>() {
                v.push((std::string::String::from(name), x));
            }
        }
        v
    }

    fn name_of(f: extern "C" fn(u32) -> *const c_char, v: u32) -> &'static str {
        // SAFETY: the name functions return static NUL-terminated strings.
        unsafe { CStr::from_ptr(f(v)) }.to_str().unwrap()
    }

    #[test]
    fn every_header_status_has_its_name() {
        let all = header_constants("RDD_STATUS_");
        assert!(all.len() > 30, "{all:?}");
        for (name, v) in &all {
            assert_eq!(name_of(rdd_status_name, *v), name, "value {v}");
        }
        for v in 0..5000u32 {
            let got = name_of(rdd_status_name, v);
            let known = all.iter().any(|(_, x)| *x == v);
            assert_eq!(got == "unknown", !known, "value {v}: {got}");
        }
        assert_eq!(name_of(rdd_status_name, u32::MAX), "unknown");
    }

    #[test]
    fn every_header_wc_constant_has_its_name() {
        let all = header_constants("RDD_WC_");
        let ops: std::vec::Vec<_> = all
            .iter()
            .filter(|(n, _)| n.starts_with("RDD_WC_OP_"))
            .collect();
        let statuses: std::vec::Vec<_> = all
            .iter()
            .filter(|(n, _)| !n.starts_with("RDD_WC_OP_") && !n.starts_with("RDD_WC_FLAG_"))
            .collect();
        assert_eq!(statuses.len(), 22, "{statuses:?}");
        assert_eq!(ops.len(), 9, "{ops:?}");
        for (name, v) in statuses {
            assert_eq!(name_of(rdd_wc_status_name, *v), name);
        }
        for (name, v) in ops {
            assert_eq!(name_of(rdd_wc_opcode_name, *v), name);
        }
        for v in [22, 23, 127, 1000, u32::MAX] {
            assert_eq!(name_of(rdd_wc_status_name, v), "unknown");
        }
        for v in [7, 8, 127, 130, u32::MAX] {
            assert_eq!(name_of(rdd_wc_opcode_name, v), "unknown");
        }
    }
}
