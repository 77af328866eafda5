//! [`VerbsQp`]: a QP that posts through libibverbs (`ibv_post_send` /
//! `ibv_post_recv`), one validated chain of WRs per call.

use std::boxed::Box;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdma_sys as sys;

use super::track::{track_accessors, QpTrack, RECV_BIT};
use crate::api::QpDriver;
use crate::completion::QpState;
use crate::error::{Error, PostError, Result};
use crate::sync::Ordering;
use crate::verbs::{fail, Raw};
use crate::wr::{validate_recv, Payload, QpCaps, RecvWr, SendOp, SendWr};

/// WRs per provider call.
pub const CHAIN: usize = 32;
/// SGEs per provider call (all WRs of a chain together).
pub(super) const SGES: usize = 128;

/// Memory windows (by index, `rkey >> 8`, with their PD handle) and the
/// regions registered with `MW_BIND` (by lkey): libibverbs' BIND_MW work
/// request names both by pointer. Owned by the device, shared with its
/// verbs-fallback QPs.
#[derive(Default)]
pub(crate) struct WindowTable {
    pub(crate) mws: HashMap<u32, (Raw<sys::ibv_mw>, u32)>,
    pub(crate) mrs: HashMap<u32, Raw<sys::ibv_mr>>,
}

/// A verbs-fallback QP: posts through libibverbs' provider.
pub struct VerbsQp {
    qp: *mut sys::ibv_qp,
    track: Arc<QpTrack>,
    caps: QpCaps,
    atomics: bool,
    /// Unsignaled sends since the last signaled one.
    unsignaled: u64,
    /// The device is iWARP (siw): what is posted in ERROR is never
    /// flushed, so recovery's drain marker does not go to the provider.
    iwarp: bool,
    /// An unreliable-datagram QP: sends only through
    /// [`QpDriver::post_send_ud`] (a WR without an address handle would
    /// reach the provider with a NULL `ah`).
    ud: bool,
    /// The chains handed to the provider, reused by every call: a call
    /// resets and fills only the entries it links, so its cost follows its
    /// WRs (a fresh zeroed array per call stored 4 KiB of WRs and 2 KiB of
    /// SGEs even for a single WR).
    send_chain: Box<[sys::ibv_send_wr; CHAIN]>,
    recv_chain: Box<[sys::ibv_recv_wr; CHAIN]>,
    /// The SGEs the chains point into (one call at a time uses them:
    /// posting takes `&mut self`).
    sges: Box<[sys::ibv_sge; SGES]>,
    /// The device's windows and bindable regions (BIND_MW names them by
    /// pointer).
    windows: Arc<Mutex<WindowTable>>,
}

// SAFETY: the QP pointer is used only through `&mut self` (one thread at a
// time) and libibverbs QPs may be used from any thread. The chains' raw
// pointers point into the QP's own scratch arrays (and, during a call, at
// the caller's inline data); they are written and handed to the provider
// only inside a call through `&mut self`, and never read otherwise.
unsafe impl Send for VerbsQp {}

impl VerbsQp {
    /// Wraps a created QP.
    pub(crate) fn new(
        qp: *mut sys::ibv_qp,
        track: Arc<QpTrack>,
        caps: QpCaps,
        atomics: bool,
        iwarp: bool,
        windows: Arc<Mutex<WindowTable>>,
    ) -> VerbsQp {
        VerbsQp {
            qp,
            track,
            caps,
            atomics,
            iwarp,
            ud: false,
            windows,
            unsignaled: 0,
            send_chain: Box::new(core::array::from_fn(|_| blank_send())),
            recv_chain: Box::new(core::array::from_fn(|_| blank_recv())),
            sges: Box::new(
                [sys::ibv_sge {
                    addr: 0,
                    length: 0,
                    lkey: 0,
                }; SGES],
            ),
        }
    }
}

impl VerbsQp {
    /// Marks the QP as an unreliable-datagram QP.
    pub(crate) fn datagram(mut self) -> VerbsQp {
        self.ud = true;
        self
    }
}

/// Fills `w` for one validated WR; SGEs go to `sges` from `*used`.
fn fill_send(
    w: &mut sys::ibv_send_wr,
    wr: &SendWr<'_>,
    sges: &mut [sys::ibv_sge; SGES],
    used: &mut usize,
    windows: &Mutex<WindowTable>,
) -> Result<()> {
    use sys::ibv_wr_opcode as O;
    let first = *used;
    match wr.payload {
        Payload::Sges(list) => {
            for s in list {
                sges[*used] = sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
                *used += 1;
            }
        }
        Payload::Inline(pieces) => {
            for p in pieces {
                sges[*used] = sys::ibv_sge {
                    addr: p.as_ptr() as u64,
                    length: p.len() as u32,
                    lkey: 0,
                };
                *used += 1;
            }
            w.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
    }
    w.sg_list = if *used > first {
        sges[first..].as_mut_ptr()
    } else {
        core::ptr::null_mut()
    };
    w.num_sge = (*used - first) as i32;
    match wr.op {
        SendOp::Send => w.opcode = O::IBV_WR_SEND,
        SendOp::SendImm { imm } => {
            w.opcode = O::IBV_WR_SEND_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOp::SendInv { rkey } => {
            w.opcode = O::IBV_WR_SEND_WITH_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
        SendOp::Write { remote } => {
            w.opcode = O::IBV_WR_RDMA_WRITE;
            w.wr.rdma = sys::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::WriteImm { remote, imm } => {
            w.opcode = O::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            w.wr.rdma = sys::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::Read { remote } => {
            w.opcode = O::IBV_WR_RDMA_READ;
            w.wr.rdma = sys::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            w.opcode = O::IBV_WR_ATOMIC_CMP_AND_SWP;
            w.wr.atomic = sys::atomic_t {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            };
        }
        SendOp::FetchAdd { remote, add } => {
            w.opcode = O::IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.wr.atomic = sys::atomic_t {
                remote_addr: remote.addr,
                compare_add: add,
                swap: 0,
                rkey: remote.rkey,
            };
        }
        // Standard verbs has no NOP work request.
        SendOp::Nop => return Err(Error::Unsupported),
        SendOp::BindMw(b) => {
            let table = windows.lock().unwrap_or_else(|p| p.into_inner());
            let mw = table.mws.get(&(b.mw_rkey >> 8)).map(|e| e.0 .0);
            let mr = table.mrs.get(&b.mr_lkey).map(|m| m.0);
            let (Some(mw), Some(mr)) = (mw, mr) else {
                return Err(Error::NoSuchObject);
            };
            // SAFETY: a live MW of this device (in the table until
            // dealloc_mw, which takes the same lock). The provider reads
            // the window's current key from `rkey`, which libibverbs only
            // caches: the crate tracks the key across binds and writes it.
            unsafe { (*mw).rkey = b.mw_rkey };
            w.opcode = O::IBV_WR_BIND_MW;
            w.bind_mw_tso_union.bind_mw = sys::bind_mw_t {
                mw,
                rkey: b.new_rkey,
                bind_info: sys::ibv_mw_bind_info {
                    mr,
                    addr: b.addr,
                    length: b.len,
                    mw_access_flags: b.access,
                },
            };
        }
        SendOp::LocalInv { rkey } => {
            w.opcode = O::IBV_WR_LOCAL_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
    }
    Ok(())
}

/// Index in `chain` (of `n` linked WRs) of the WR the provider refused
/// (`bad`; NULL means it refused the whole chain).
pub(super) fn bad_index<T>(bad: *mut T, chain: *const T, n: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    // SAFETY: the provider sets `bad` to an element of the chain it was
    // given, which lives in `chain`'s array; the result is clamped anyway.
    (unsafe { bad.cast_const().offset_from(chain) }).clamp(0, n as isize) as usize
}

/// Number of provider SGE entries a WR needs.
fn sge_count(wr: &SendWr<'_>) -> usize {
    match wr.payload {
        Payload::Sges(s) => s.len(),
        Payload::Inline(p) => p.len(),
    }
}

/// A zeroed send WR.
fn blank_send() -> sys::ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero fields).
    unsafe { core::mem::zeroed() }
}

/// An empty receive WR.
/// One receive of a chain, its SGEs copied to `sges` from `*used` (the
/// caller checked they fit); `next` is NULL until [`link_recv`].
pub(super) fn recv_entry(
    wr_id: u64,
    wr: &RecvWr<'_>,
    sges: &mut [sys::ibv_sge; SGES],
    used: &mut usize,
) -> sys::ibv_recv_wr {
    let first = *used;
    for s in wr.sges {
        sges[*used] = sys::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        *used += 1;
    }
    sys::ibv_recv_wr {
        wr_id,
        next: core::ptr::null_mut(),
        sg_list: if *used > first {
            sges[first..].as_mut_ptr()
        } else {
            core::ptr::null_mut()
        },
        num_sge: (*used - first) as i32,
    }
}

/// Links the receives of a chain in order (the last one's `next` stays
/// NULL).
pub(super) fn link_recv(chain: &mut [sys::ibv_recv_wr]) {
    for i in 1..chain.len() {
        let next: *mut sys::ibv_recv_wr = &mut chain[i];
        chain[i - 1].next = next;
    }
}

pub(super) fn blank_recv() -> sys::ibv_recv_wr {
    sys::ibv_recv_wr {
        wr_id: 0,
        next: core::ptr::null_mut(),
        sg_list: core::ptr::null_mut(),
        num_sge: 0,
    }
}

impl VerbsQp {
    /// Posts send WRs; with `marker`, each is recorded as a drain marker
    /// (only ever one, from [`QpDriver::post_drain_marker`]).
    #[inline(always)]
    fn send_list(
        &mut self,
        wrs: &[SendWr<'_>],
        marker: bool,
    ) -> core::result::Result<(), PostError> {
        let t = &*self.track;
        if !QpState::Rts.can_send()
            || !(t.state() == QpState::Rts as u32 || t.state() == QpState::Error as u32)
        {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        let mut done = 0usize;
        while done < wrs.len() {
            let chain = &mut *self.send_chain;
            let sges = &mut *self.sges;
            let mut used = 0usize;
            let mut n = 0usize;
            // Relaxed: this thread is the only writer of sq_posted.
            let base = t.sq_posted.load(Ordering::Relaxed);
            // Acquire: pairs with the poller's Release of sq_done, so the
            // slots it has read are free to overwrite.
            let retired = t.sq_done.load(Ordering::Acquire);
            let mut refused = None;
            while done + n < wrs.len() && n < CHAIN {
                let wr = &wrs[done + n];
                let check = t.check_send(wr, &self.caps, self.atomics, base + n as u64 - retired);
                if let Err(e) = check {
                    refused = Some(e);
                    break;
                }
                if used + sge_count(wr) > SGES {
                    if n == 0 {
                        refused = Some(Error::TooManySges);
                    }
                    break;
                }
                let seq = base + n as u64;
                let w = &mut chain[n];
                // Every field not set below is zero, and `next` is NULL
                // until the WR is linked to a following one.
                *w = blank_send();
                w.wr_id = seq;
                w.send_flags = t.record_send(seq, wr, &mut self.unsignaled).0;
                if marker {
                    t.mark_drain(seq);
                }
                if let Err(e) = fill_send(w, wr, sges, &mut used, &self.windows) {
                    refused = Some(e);
                    break;
                }
                n += 1;
            }
            if n > 0 {
                for i in 0..n - 1 {
                    let next: *mut sys::ibv_send_wr = &mut chain[i + 1];
                    chain[i].next = next;
                }
                // Release: slots before the provider may complete them.
                t.sq_posted.store(base + n as u64, Ordering::Release);
                let mut bad: *mut sys::ibv_send_wr = core::ptr::null_mut();
                // SAFETY: live QP; the chain and its SGEs are this QP's
                // scratch arrays, borrowed for the call, and every linked
                // entry was written above (the last one's `next` is NULL);
                // inline data pointers are the caller's slices, copied by
                // the provider before it returns.
                let ret = unsafe { post_send_raw(self.qp, chain.as_mut_ptr(), &mut bad) };
                if ret != 0 {
                    let idx = bad_index(bad, chain.as_ptr(), n);
                    // The user is told WRs idx.. were not posted. Some
                    // providers queue them anyway and flush them later, so
                    // keep their sequence numbers and mark them: their
                    // completions (if any) are retired silently, and a
                    // later completion or a RESET retires them otherwise.
                    QpTrack::refuse(
                        &t.sq,
                        t.sq_mask,
                        &t.sq_posted,
                        base + idx as u64,
                        base + n as u64,
                    );
                    return Err(PostError {
                        index: done + idx,
                        error: fail("ibv_post_send", ret.abs()),
                    });
                }
                done += n;
            }
            if let Some(e) = refused {
                return Err(PostError {
                    index: done,
                    error: e,
                });
            }
        }
        Ok(())
    }
}

// No deferral here (the trait's `post_send_deferred` default posts and
// rings at once): a deferred `ibv_send_wr` would have to outlive the call,
// but an inline payload is the caller's memory only until the call returns
// (the C per-opcode calls promise the buffer is free at once), so holding
// a chain back would need a copy of up to `max_inline_data` bytes per WR,
// and libibverbs rings once per `ibv_post_send` anyway. The fallback is
// the compatibility path; the direct rings (`verbs::direct`) defer.
impl QpDriver for VerbsQp {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        if self.ud && !wrs.is_empty() {
            // A UD send needs an address handle: `Qp::post_send_ud`.
            return Err(PostError {
                index: 0,
                error: Error::InvalidAttribute,
            });
        }
        self.send_list(wrs, false)
    }

    fn post_send_ud(
        &mut self,
        wr: &SendWr<'_>,
        ah: crate::api::DriverAh,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<()> {
        crate::verbs::ud::check_ud_send(self.ud, wr, remote_qpn)?;
        let t = &*self.track;
        if t.state() != QpState::Rts as u32 {
            return Err(Error::InvalidQpState);
        }
        // Relaxed: this thread is the only writer of sq_posted.
        let base = t.sq_posted.load(Ordering::Relaxed);
        // Acquire: pairs with the poller's Release of sq_done.
        let retired = t.sq_done.load(Ordering::Acquire);
        t.check_send(wr, &self.caps, false, base - retired)?;
        if sge_count(wr) > SGES {
            return Err(Error::TooManySges);
        }
        let w = &mut self.send_chain[0];
        *w = blank_send();
        w.wr_id = base;
        let mut unsignaled = self.unsignaled;
        w.send_flags = t.record_send(base, wr, &mut unsignaled).0;
        let mut used = 0usize;
        fill_send(w, wr, &mut self.sges, &mut used, &self.windows)?;
        // IBA vol. 1 §10.2.4: a Q_Key with bit 31 set means the QP's own;
        // rxe sends the WR's value as it is, so it is resolved here.
        let qkey = if qkey & crate::api::OWN_QKEY != 0 {
            // Relaxed: stored by this thread when the QP was made ready.
            t.qkey.load(Ordering::Relaxed)
        } else {
            qkey
        };
        w.wr.ud = sys::ud_t {
            // The token is the `ibv_ah` pointer this backend handed out
            // (`create_driver_ah`), alive while the caller's `Ah` is.
            ah: ah.token as usize as *mut sys::ibv_ah,
            remote_qpn,
            remote_qkey: qkey,
        };
        self.unsignaled = unsignaled;
        // Release: the slot before the provider may complete it.
        t.sq_posted.store(base + 1, Ordering::Release);
        let mut bad: *mut sys::ibv_send_wr = core::ptr::null_mut();
        // SAFETY: live QP; one WR (`next` NULL) in this QP's scratch chain,
        // its SGEs in the scratch array; the address handle is live (the
        // API borrows its `Ah` for the call); inline data is copied by the
        // provider before it returns.
        let ret = unsafe { post_send_raw(self.qp, self.send_chain.as_mut_ptr(), &mut bad) };
        if ret != 0 {
            QpTrack::refuse(&t.sq, t.sq_mask, &t.sq_posted, base, base + 1);
            return Err(fail("ibv_post_send", ret.abs()));
        }
        Ok(())
    }

    fn post_drain_marker(&mut self) -> Result<bool> {
        let t = &*self.track;
        if t.state() != QpState::Error as u32 {
            return Err(Error::InvalidQpState);
        }
        if t.sends_outstanding() == 0 || t.last_send_is_marker() {
            return Ok(false);
        }
        if self.iwarp || self.ud {
            // (A UD QP cannot carry the marker's RDMA WRITE either.)
            // libsiw writes SQEs into the kernel's user ring, which the
            // kernel no longer reads in ERROR: a marker there would never
            // complete.
            t.post_stranded_marker()?;
            self.unsignaled = 0;
            return Ok(true);
        }
        let wr = super::track::drain_marker_wr();
        self.send_list(core::slice::from_ref(&wr), true)
            .map_err(|e| e.error)?;
        Ok(true)
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let t = &*self.track;
        if t.state() == QpState::Reset as u32 {
            return Err(PostError {
                index: 0,
                error: Error::InvalidQpState,
            });
        }
        let mut done = 0usize;
        while done < wrs.len() {
            let chain = &mut *self.recv_chain;
            let sges = &mut *self.sges;
            let mut used = 0usize;
            let mut n = 0usize;
            // Relaxed: only this thread writes rq_posted.
            let base = t.rq_posted.load(Ordering::Relaxed);
            // Acquire: pairs with the poller's Release of rq_done.
            let retired = t.rq_done.load(Ordering::Acquire);
            let mut refused = None;
            while done + n < wrs.len() && n < CHAIN {
                let wr = &wrs[done + n];
                let check = validate_recv(wr, &self.caps).and_then(|_| {
                    if base + n as u64 - retired >= t.rq_cap {
                        return Err(Error::RqFull);
                    }
                    Ok(())
                });
                if let Err(e) = check {
                    refused = Some(e);
                    break;
                }
                if used + wr.sges.len() > SGES {
                    if n == 0 {
                        refused = Some(Error::TooManySges);
                    }
                    break;
                }
                let seq = base + n as u64;
                chain[n] = recv_entry(seq | RECV_BIT, wr, sges, &mut used);
                t.record_recv(seq, wr);
                n += 1;
            }
            if n > 0 {
                link_recv(&mut chain[..n]);
                // Release: slots before the provider may complete them.
                t.rq_posted.store(base + n as u64, Ordering::Release);
                let mut bad: *mut sys::ibv_recv_wr = core::ptr::null_mut();
                // SAFETY: live QP; chain and SGEs are this QP's scratch
                // arrays, borrowed for the call, every linked entry written
                // above.
                let ret = unsafe { post_recv_raw(self.qp, chain.as_mut_ptr(), &mut bad) };
                if ret != 0 {
                    let idx = bad_index(bad, chain.as_ptr(), n);
                    // As for sends.
                    QpTrack::refuse(
                        &t.rq,
                        t.rq_mask,
                        &t.rq_posted,
                        base + idx as u64,
                        base + n as u64,
                    );
                    return Err(PostError {
                        index: done + idx,
                        error: fail("ibv_post_recv", ret.abs()),
                    });
                }
                done += n;
            }
            if let Some(e) = refused {
                return Err(PostError {
                    index: done,
                    error: e,
                });
            }
        }
        Ok(())
    }

    track_accessors!();

    fn state_changed(&mut self, state: QpState) {
        self.track.set_state(state);
        if state == QpState::Reset {
            // The provider emptied both queues.
            self.track.reset();
            self.unsignaled = 0;
        }
    }
}

/// `ibv_post_send` through the context's ops table, without the panic of
/// an `unwrap` on a missing op.
///
/// # Safety
/// `qp` is live; the chain is valid for the call.
unsafe fn post_send_raw(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> i32 {
    // SAFETY: the caller's contract; `context` of a live QP is live.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: as above.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}

/// `ibv_post_recv` through the ops table.
///
/// # Safety
/// As [`post_send_raw`].
unsafe fn post_recv_raw(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> i32 {
    // SAFETY: the caller's contract.
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: as above.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::ENOSYS,
    }
}
