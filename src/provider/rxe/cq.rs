//! The rxe completion queue (docs/spec/rxe.md §2, §5).
//!
//! The kernel produces, the process consumes: acquire-load the producer
//! index, copy each CQE between our consumer index and it once into a
//! local, then publish the new consumer index with one release store per
//! poll. Arming has no shared-memory form on rxe (it is the
//! `REQ_NOTIFY_CQ` command), so it is not here.

use super::layout::{kernel_wc_flags, wc_opcode, RxeUverbsWc};
use super::RxeQueue;
use crate::completion::wc_flags;
use crate::completion::{Wc, WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::sync::Ordering;

/// Largest status in `ibv_wc_status` numbering (`IBV_WC_GENERAL_ERR`).
const MAX_STATUS: u32 = WcStatus::GENERAL_ERR.0;

/// Decodes one CQE (already copied out of the ring) into a [`Wc`]
/// (docs/spec/rxe.md §5).
///
/// - The status is `ibv_wc_status` numbering already; a value past
///   `GENERAL_ERR` becomes `GENERAL_ERR` with the raw value in
///   `vendor_err`. Otherwise `vendor_err` is the CQE's.
/// - `wc_flags` is translated from the kernel's encoding (GRH 1, WITH_IMM
///   2, WITH_INVALIDATE 4) to the crate's (`IBV_WC_*`: GRH 1, WITH_IMM 2,
///   WITH_INV 8); other bits are dropped.
/// - `imm_data` is host order: immediate data arrives in network order,
///   an invalidated rkey in host order; 0 when neither flag is set.
/// - The kernel writes opcode 0 (SEND) in every error completion, send or
///   receive (only `wr_id`, `status` and `qp_num` are meaningful there).
///
/// An opcode this crate never posts or receives, or both WITH_IMM and
/// WITH_INVALIDATE, is [`Error::CqeCorrupt`].
#[inline]
pub fn decode_cqe(c: &RxeUverbsWc) -> Result<Wc> {
    let opcode = match c.opcode {
        wc_opcode::SEND
        | wc_opcode::RDMA_WRITE
        | wc_opcode::RDMA_READ
        | wc_opcode::COMP_SWAP
        | wc_opcode::FETCH_ADD
        | wc_opcode::BIND_MW
        | wc_opcode::LOCAL_INV
        | wc_opcode::RECV
        | wc_opcode::RECV_RDMA_WITH_IMM => WcOpcode(c.opcode),
        _ => return Err(Error::CqeCorrupt),
    };
    let (status, vendor_err) = if c.status <= MAX_STATUS {
        (WcStatus(c.status), c.vendor_err)
    } else {
        (WcStatus::GENERAL_ERR, c.status)
    };
    let kf = c.wc_flags;
    let with_imm = kf & kernel_wc_flags::WITH_IMM != 0;
    let with_inv = kf & kernel_wc_flags::WITH_INVALIDATE != 0;
    if with_imm && with_inv {
        return Err(Error::CqeCorrupt);
    }
    let mut flags = 0;
    if kf & kernel_wc_flags::GRH != 0 {
        flags |= wc_flags::GRH;
    }
    let imm_data = if with_imm {
        flags |= wc_flags::WITH_IMM;
        u32::from_be(c.ex)
    } else if with_inv {
        flags |= wc_flags::WITH_INV;
        c.ex
    } else {
        0
    };
    Ok(Wc {
        wr_id: c.wr_id,
        status,
        opcode,
        vendor_err,
        byte_len: c.byte_len,
        imm_data,
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
        syndrome: 0,
        reserved: 0,
    })
}

/// An rxe completion queue over the kernel's mapping.
#[derive(Debug)]
pub struct RxeCq {
    q: RxeQueue,
    /// Our consumer index (masked).
    cons: u32,
    /// Corrupt CQEs consumed so far.
    corrupt: u64,
}

impl RxeCq {
    /// Wraps the CQ mapped at `ptr` (`len` bytes: the `size` of the create
    /// response's `mi`). The header is validated as in [`RxeQueue::new`]
    /// with elements of at least 48 bytes (`struct ib_uverbs_wc`; the
    /// kernel's are larger, typically 128). The consumer index is adopted
    /// from the header.
    ///
    /// # Safety
    /// `ptr` points to the `len`-byte mapping of an rxe CQ, valid while
    /// this CQ exists; only this poller writes its consumer index.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<RxeCq> {
        // SAFETY: forwarded contract.
        let q = unsafe { RxeQueue::new(ptr, len, core::mem::size_of::<RxeUverbsWc>()) }?;
        // Relaxed: the consumer word is ours; nobody else writes it.
        let cons = q.consumer().load(Ordering::Relaxed) & q.mask;
        Ok(RxeCq {
            q,
            cons,
            corrupt: 0,
        })
    }

    /// The mapping's geometry.
    #[inline]
    pub fn queue(&self) -> &RxeQueue {
        &self.q
    }
    /// Completions the CQ holds at once (`slots - 1`).
    #[inline]
    pub fn depth(&self) -> u32 {
        self.q.capacity()
    }
    /// Our consumer index (masked).
    #[inline]
    pub fn consumer(&self) -> u32 {
        self.cons
    }
    /// The kernel's producer index, masked.
    #[inline]
    pub fn kernel_producer(&self) -> u32 {
        // Acquire: pairs with the kernel's release store of the producer
        // index (docs/spec/rxe.md §2): the CQEs before it are fully written.
        self.q.producer().load(Ordering::Acquire) & self.q.mask
    }
    /// Corrupt CQEs consumed (and reported) so far.
    #[inline]
    pub fn corrupt_cqes(&self) -> u64 {
        self.corrupt
    }
    /// Re-reads the consumer index from the header (after a resize or to
    /// adopt a CQ in use).
    pub fn resync(&mut self) {
        // Relaxed: our own word.
        self.cons = self.q.consumer().load(Ordering::Relaxed) & self.q.mask;
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    /// The consumer index is published once per call.
    ///
    /// A corrupt CQE ([`decode_cqe`]) is consumed and reported as
    /// [`Error::CqeCorrupt`] when it is the first entry of a call; after
    /// good entries it is left for the next call, so no completion is lost
    /// (the convention of the mlx5 poller).
    #[inline]
    pub fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let mask = self.q.mask;
        // The kernel's index, re-masked: an out-of-range value can never
        // move a read outside the ring.
        let prod = self.kernel_producer();
        let mut cons = self.cons;
        let mut n = 0usize;
        let mut result = Ok(());
        for w in out.iter_mut() {
            if cons == prod {
                break;
            }
            // SAFETY: the slot is inside the mapping (masked), 8-aligned,
            // at least 48 bytes (constructor), and published by the kernel
            // (before `prod`, acquire above); it is read once, into a local.
            let c = unsafe { self.q.slot_ptr(cons).cast::<RxeUverbsWc>().read() };
            match decode_cqe(&c) {
                Ok(wc) => {
                    *w = wc;
                    n += 1;
                    cons = cons.wrapping_add(1) & mask;
                }
                Err(e) => {
                    if n == 0 {
                        cons = cons.wrapping_add(1) & mask;
                        self.corrupt += 1;
                        result = Err(e);
                    }
                    break;
                }
            }
        }
        if cons != self.cons {
            self.cons = cons;
            // Release: our reads of the consumed CQEs happen before the
            // kernel can see their slots free and overwrite them (it
            // acquire-loads this index, docs/spec/rxe.md §2).
            self.q.consumer().store(cons, Ordering::Release);
        }
        result.map(|()| n)
    }
}
