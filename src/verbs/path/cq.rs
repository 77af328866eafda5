//! [`VerbsCq`]: a CQ that polls through libibverbs (`ibv_poll_cq`), its
//! completions checked against the tracking tables.

use std::boxed::Box;
use std::sync::Arc;

use rdma_sys as sys;

use super::registry::{CqRegistry, RegistryView};
use crate::api::CqDriver;
use crate::completion::{Wc, WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::verbs::fail;

/// Completions fetched from the provider per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// A verbs-fallback CQ: polls through libibverbs' provider.
pub struct VerbsCq {
    cq: *mut sys::ibv_cq,
    view: RegistryView,
    depth: u32,
    /// Where the provider writes completions, reused by every poll (only
    /// the entries it reports are read).
    wcs: Box<[sys::ibv_wc; POLL_BATCH]>,
}

// SAFETY: used through `&mut self` only; libibverbs CQs may be polled from
// any thread.
unsafe impl Send for VerbsCq {}

impl VerbsCq {
    /// Wraps a created CQ.
    pub fn new(cq: *mut sys::ibv_cq, registry: Arc<CqRegistry>, depth: u32) -> VerbsCq {
        VerbsCq {
            cq,
            view: RegistryView::new(registry),
            depth,
            // SAFETY: all-zero is a valid ibv_wc.
            wcs: Box::new(unsafe { core::mem::zeroed() }),
        }
    }

    /// `ibv_req_notify_cq`: any completion, or only solicited ones.
    fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ; `context` of a live CQ is live.
        let op = unsafe { (*(*self.cq).context).ops.req_notify_cq };
        let Some(f) = op else {
            return Err(Error::Unsupported);
        };
        // SAFETY: live CQ; 0 = any completion, 1 = solicited only.
        let r = unsafe { f(self.cq, i32::from(solicited_only)) };
        super::check("ibv_req_notify_cq", r)
    }
}

/// `ibv_poll_cq` through the ops table.
///
/// # Safety
/// `cq` is live; `wc` holds `n` entries.
unsafe fn poll_raw(cq: *mut sys::ibv_cq, n: i32, wc: *mut sys::ibv_wc) -> i32 {
    // SAFETY: the caller's contract.
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: as above.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::ENOSYS,
    }
}

impl CqDriver for VerbsCq {
    fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        self.view.refresh();
        let mut filled = 0usize;
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            // SAFETY: live CQ; `wcs` holds `want` entries.
            let got = unsafe { poll_raw(self.cq, want as i32, self.wcs.as_mut_ptr()) };
            if got < 0 {
                return Err(fail("ibv_poll_cq", -got));
            }
            let got = (got as usize).min(want);
            for w in &self.wcs[..got] {
                // Read each provider-written field once, then validate.
                let flags = w.wc_flags;
                // SAFETY: reading a u32 union field; both variants are u32.
                let raw_imm = unsafe { w.imm_data_invalidated_rkey_union.imm_data };
                let imm = if flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                    u32::from_be(raw_imm)
                } else {
                    raw_imm
                };
                let mut wc = Wc {
                    wr_id: w.wr_id,
                    status: WcStatus(w.status),
                    opcode: WcOpcode(w.opcode),
                    vendor_err: w.vendor_err,
                    byte_len: w.byte_len,
                    imm_data: imm,
                    qp_num: w.qp_num,
                    src_qp: w.src_qp,
                    wc_flags: flags,
                    pkey_index: w.pkey_index,
                    slid: w.slid,
                    sl: w.sl,
                    dlid_path_bits: w.dlid_path_bits,
                    syndrome: 0,
                    reserved: 0,
                };
                if self.view.finish(&mut wc)? {
                    out[filled] = wc;
                    filled += 1;
                }
            }
            if got < want {
                break;
            }
        }
        if filled < out.len() {
            // Drain markers that never reach the provider (iWARP, see
            // `QpTrack::post_stranded_marker`), after the provider's own
            // completions.
            filled += self.view.stranded(&mut out[filled..])?;
        }
        Ok(filled)
    }

    fn depth(&self) -> u32 {
        self.depth
    }

    fn arm(&mut self) -> Result<()> {
        self.req_notify(false)
    }

    fn arm_solicited(&mut self) -> Result<()> {
        self.req_notify(true)
    }
}
