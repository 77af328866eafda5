//! The siw completion queue (docs/spec/siw.md §1–§3).
//!
//! The kernel writes a CQE into a slot whose flags are 0 and then sets
//! VALID; the poller acquire-loads the flags word of slot `get & (n - 1)`,
//! copies the other fields once, and hands the slot back with a release
//! store of 0. Arming is a store to the `siw_cq_ctrl` word right after the
//! last CQE; no system call.

use super::layout::{cqe_word_fields, notify, opcode, wc_status, wqe_flags, SiwCqCtrl, SiwCqe};
use super::{read_at, Ring};
use crate::completion::wc_flags;
use crate::completion::{Wc, WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::sync::{AtomicU32, Ordering};

const CQE: usize = core::mem::size_of::<SiwCqe>();

/// `siw_wc_status` → `ibv_wc_status` (docs/spec/siw.md §2), indexed by the siw
/// value.
const STATUS: [WcStatus; 10] = [
    WcStatus::SUCCESS,         // SUCCESS
    WcStatus::LOC_LEN_ERR,     // LOC_LEN_ERR
    WcStatus::LOC_PROT_ERR,    // LOC_PROT_ERR
    WcStatus::LOC_QP_OP_ERR,   // LOC_QP_OP_ERR
    WcStatus::WR_FLUSH_ERR,    // WR_FLUSH_ERR
    WcStatus::BAD_RESP_ERR,    // BAD_RESP_ERR
    WcStatus::LOC_ACCESS_ERR,  // LOC_ACCESS_ERR
    WcStatus::REM_ACCESS_ERR,  // REM_ACCESS_ERR
    WcStatus::REM_INV_REQ_ERR, // REM_INV_REQ_ERR
    WcStatus::GENERAL_ERR,     // GENERAL_ERR
];

const _: () = {
    assert!(STATUS.len() == wc_status::GENERAL_ERR as usize + 1);
    assert!(STATUS[wc_status::LOC_PROT_ERR as usize].0 == WcStatus::LOC_PROT_ERR.0);
    assert!(STATUS[wc_status::REM_INV_REQ_ERR as usize].0 == WcStatus::REM_INV_REQ_ERR.0);
};

/// Decodes one CQE (already copied out of the ring, flags word included)
/// into a [`Wc`] (docs/spec/siw.md §2).
///
/// - The status is translated from siw's numbering; an unknown value
///   becomes `GENERAL_ERR`. Every error carries the raw siw status in
///   `vendor_err` (0 on success).
/// - The opcode is the SQE's for send completions (WRITE → RDMA_WRITE,
///   READ and READ_LOCAL_INV → RDMA_READ, the SENDs → SEND, and the
///   atomics, which siw never completes) and RECEIVE → RECV.
/// - siw user CQs carry no immediate data; a REM_INVAL flag (kernel CQs
///   only) is honoured as `WITH_INV` with the STag in `imm_data`.
///
/// Any other opcode, or a QP id wider than 32 bits, is
/// [`Error::CqeCorrupt`].
#[inline]
pub fn decode_cqe(c: &SiwCqe) -> Result<Wc> {
    let op = match c.opcode {
        opcode::WRITE => WcOpcode::RDMA_WRITE,
        opcode::READ | opcode::READ_LOCAL_INV => WcOpcode::RDMA_READ,
        opcode::SEND | opcode::SEND_WITH_IMM | opcode::SEND_REMOTE_INV => WcOpcode::SEND,
        opcode::FETCH_AND_ADD => WcOpcode::FETCH_ADD,
        opcode::COMP_AND_SWAP => WcOpcode::COMP_SWAP,
        opcode::RECEIVE => WcOpcode::RECV,
        _ => return Err(Error::CqeCorrupt),
    };
    let qp_num = u32::try_from(c.qp_id).map_err(|_| Error::CqeCorrupt)?;
    let status = STATUS
        .get(c.status as usize)
        .copied()
        .unwrap_or(WcStatus::GENERAL_ERR);
    let (wc_flags, imm_data) = if c.flags as u16 & wqe_flags::REM_INVAL != 0 {
        // `inval_stag` is the first 4 bytes of the 8-byte union.
        let b = c.imm_data.to_ne_bytes();
        (
            wc_flags::WITH_INV,
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        )
    } else {
        (0, 0)
    };
    Ok(Wc {
        wr_id: c.id,
        status,
        opcode: op,
        vendor_err: c.status as u32,
        byte_len: c.bytes,
        imm_data,
        qp_num,
        wc_flags,
        ..Wc::default()
    })
}

/// An siw completion queue over the kernel's mapping.
#[derive(Debug)]
pub struct SiwCq {
    ring: Ring<CQE>,
    /// Free-running consumer counter (`cq_get`).
    get: u32,
    /// Corrupt CQEs consumed so far.
    corrupt: u64,
}

impl SiwCq {
    /// Wraps the CQ mapped at `ptr` (`len` bytes) with `num_cqe` entries,
    /// as the create response reports it (the mapping is
    /// `num_cqe * 32 + 8` bytes at `cq_key`: the entries, then
    /// `siw_cq_ctrl`).
    ///
    /// Checks (else [`Error::InvalidGeometry`]): `ptr` non-null and
    /// 8-aligned, `num_cqe` a power of two in `1..=2^24`,
    /// `len >= num_cqe * 32 + 8`.
    ///
    /// # Safety
    /// `ptr` points to the `len`-byte mapping of a new siw CQ, valid while
    /// this CQ exists; only this poller consumes its entries and writes its
    /// control word.
    pub unsafe fn new(ptr: *mut u8, len: usize, num_cqe: u32) -> Result<SiwCq> {
        Ok(SiwCq {
            ring: Ring::new(ptr, len, num_cqe, core::mem::size_of::<SiwCqCtrl>())?,
            get: 0,
            corrupt: 0,
        })
    }

    /// Entries in the CQ.
    #[inline]
    pub fn depth(&self) -> u32 {
        self.ring.len()
    }
    /// The free-running consumer counter.
    #[inline]
    pub fn consumer(&self) -> u32 {
        self.get
    }
    /// Corrupt CQEs consumed (and reported) so far.
    #[inline]
    pub fn corrupt_cqes(&self) -> u64 {
        self.corrupt
    }

    /// The `siw_cq_ctrl.flags` word.
    #[inline(always)]
    fn ctrl(&self) -> &AtomicU32 {
        // SAFETY: the 8-byte control block right after the last CQE is in
        // the mapping (constructor: len >= n * 32 + 8) and 8-aligned.
        unsafe { &*self.ring.end().cast::<AtomicU32>() }
    }

    /// The control word's current value ([`notify`] flags; the kernel
    /// clears it when it raises an event).
    #[inline]
    pub fn notify_flags(&self) -> u32 {
        // Relaxed: a snapshot for diagnostics.
        self.ctrl().load(Ordering::Relaxed)
    }

    /// Requests an event for the next completion, or the next solicited
    /// one (docs/spec/siw.md §3): stores SOLICITED (1) or SOLICITED | NEXT_COMPLETION (3)
    /// into the control word. One-shot: the kernel clears it when it
    /// raises the event. Poll once more after arming, so a completion that
    /// raced the arm is not lost.
    #[inline]
    pub fn arm(&mut self, solicited_only: bool) {
        let v = if solicited_only {
            notify::SOLICITED
        } else {
            notify::SOLICITED | notify::NEXT_COMPLETION
        };
        // Relaxed store, then a SeqCst fence: the arm must be visible before
        // the re-poll loads the next CQE's flags (a store-then-load order,
        // which acquire/release cannot give). Otherwise we could miss a
        // CQE the kernel wrote while the kernel, having checked the control
        // word before our store landed, raises no event. rdma-core's
        // sequentially consistent C11 store plays the same role.
        self.ctrl().store(v, Ordering::Relaxed);
        crate::mmio::store_load_barrier();
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    /// Each consumed slot is handed back to the kernel at once.
    ///
    /// A corrupt CQE ([`decode_cqe`]) is consumed and reported as
    /// [`Error::CqeCorrupt`] when it is the first entry of a call; after
    /// good entries it is left for the next call (the convention of the
    /// mlx5 poller).
    #[inline]
    pub fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        let mut n = 0usize;
        let mut result = Ok(());
        for w in out.iter_mut() {
            let flags_word = self.ring.flags(self.get);
            // Acquire: pairs with the kernel's store of VALID, made after
            // it wrote the CQE's other fields (docs/spec/siw.md §3).
            let (flags, op, status) = cqe_word_fields(flags_word.load(Ordering::Acquire));
            if flags as u16 & wqe_flags::VALID == 0 {
                break;
            }
            let p = self.ring.slot(self.get);
            // SAFETY: the CQE is VALID, so the kernel has finished writing
            // it and will not touch it until we clear the flags; fixed,
            // aligned offsets inside the 32-byte element, each read once.
            let c = unsafe {
                SiwCqe {
                    id: read_at(p, 0),
                    flags,
                    opcode: op,
                    status,
                    bytes: read_at(p, 12),
                    imm_data: read_at(p, 16),
                    qp_id: read_at(p, 24),
                }
            };
            let decoded = decode_cqe(&c);
            if decoded.is_err() && n != 0 {
                // Leave it for the next call, which reports it.
                break;
            }
            // Release: our reads of the CQE happen before the kernel sees
            // the slot free and rewrites it. Clearing the whole word also
            // zeroes opcode and status, which the kernel rewrites anyway.
            flags_word.store(0, Ordering::Release);
            self.get = self.get.wrapping_add(1);
            match decoded {
                Ok(wc) => {
                    *w = wc;
                    n += 1;
                }
                Err(e) => {
                    self.corrupt += 1;
                    result = Err(e);
                    break;
                }
            }
        }
        result.map(|()| n)
    }
}
