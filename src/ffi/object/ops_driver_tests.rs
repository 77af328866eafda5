//! The per-opcode posts and the one-handle poll on a provider-posted QP
//! (`QpImpl::Driver`, as the rxe/siw rings and the verbs fallback are),
//! over a fake backend whose driver records what it is handed.

use std::boxed::Box;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::vec::Vec;

use super::objects::{DeviceObj, QpObj};
use super::table::insert;
use super::*;
use crate::api::{
    Backend, CqDriver, MrKeys, PortInfo, QpDriver, QpInit, QpModify, QpState, RawCq, RawCqPath,
    RawQp, RawQpPath, Transport,
};
use crate::error::{Error, PostError};
use crate::ffi::mlx5::rdd_wc;
use crate::ffi::wr::{RDD_SEND_DEFER_DOORBELL, RDD_SEND_SIGNALED};
use crate::wr::{QpCaps, RecvWr, SendFlags, SendWr};
use core::ptr::null_mut;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

/// What the fake provider saw and the completions it will report.
#[derive(Default)]
struct Log {
    /// One entry per provider `post_send` call: the WR ids.
    send_calls: Vec<Vec<u64>>,
    recvs: Vec<u64>,
    cqes: VecDeque<crate::api::Wc>,
}

struct FakeQp {
    log: Arc<Mutex<Log>>,
    state: QpState,
    caps: QpCaps,
    /// Deferral as the direct rings do it (else the trait's defaults).
    defers: bool,
    /// Deferred WR ids, handed to the next provider call.
    pending: Vec<u64>,
}

impl FakeQp {
    /// Validates and takes `wrs` into `ids` (queueing their completions),
    /// stopping at the first refused one.
    fn accept(
        &self,
        log: &mut Log,
        wrs: &[SendWr<'_>],
        ids: &mut Vec<u64>,
    ) -> core::result::Result<(), PostError> {
        for (index, w) in wrs.iter().enumerate() {
            let refused = if self.state != QpState::Rts {
                Err(Error::InvalidQpState)
            } else {
                crate::wr::validate_send(w, &self.caps).map(|_| ())
            };
            if let Err(error) = refused {
                return Err(PostError { index, error });
            }
            ids.push(w.wr_id);
            if w.flags.contains(SendFlags::SIGNALED) {
                log.cqes.push_back(crate::api::Wc {
                    wr_id: w.wr_id,
                    ..Default::default()
                });
            }
        }
        Ok(())
    }
}

impl QpDriver for FakeQp {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let log = Arc::clone(&self.log);
        let mut log = log.lock().unwrap();
        let mut ids = core::mem::take(&mut self.pending);
        let r = self.accept(&mut log, wrs, &mut ids);
        log.send_calls.push(ids);
        r
    }
    fn post_send_deferred(&mut self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        if !self.defers {
            return self.post_send(wrs);
        }
        let log = Arc::clone(&self.log);
        let mut log = log.lock().unwrap();
        let mut ids = core::mem::take(&mut self.pending);
        let r = self.accept(&mut log, wrs, &mut ids);
        self.pending = ids;
        r
    }
    fn ring(&mut self) -> crate::error::Result<bool> {
        if self.pending.is_empty() {
            return Ok(false);
        }
        let ids = core::mem::take(&mut self.pending);
        self.log.lock().unwrap().send_calls.push(ids);
        Ok(true)
    }
    fn deferred(&self) -> u32 {
        self.pending.len() as u32
    }
    fn can_defer(&self) -> bool {
        self.defers
    }
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let mut log = self.log.lock().unwrap();
        log.recvs.extend(wrs.iter().map(|w| w.wr_id));
        Ok(())
    }
    fn send_space(&self) -> u32 {
        64
    }
    fn state(&self) -> QpState {
        self.state
    }
    fn outstanding(&self) -> u64 {
        0
    }
    fn capacity(&self) -> (u32, u32) {
        (4, 4)
    }
    fn state_changed(&mut self, state: QpState) {
        self.state = state;
    }
}

struct FakeCq {
    log: Arc<Mutex<Log>>,
}

impl CqDriver for FakeCq {
    fn poll(&mut self, out: &mut [crate::api::Wc]) -> crate::error::Result<usize> {
        let mut log = self.log.lock().unwrap();
        let mut n = 0;
        while n < out.len() {
            let Some(w) = log.cqes.pop_front() else { break };
            out[n] = w;
            n += 1;
        }
        Ok(n)
    }
    fn depth(&self) -> u32 {
        16
    }
    fn arm(&mut self) -> crate::error::Result<()> {
        Ok(())
    }
}

struct FakeBackend {
    log: Arc<Mutex<Log>>,
    defers: bool,
}

impl Backend for FakeBackend {
    fn name(&self) -> &str {
        "fake-driver"
    }
    fn port(&self) -> PortInfo {
        PortInfo {
            transport: Transport::Roce,
            mtu: 1024,
            ..PortInfo::default()
        }
    }
    fn alloc_pd(&self) -> crate::error::Result<u32> {
        Ok(1)
    }
    fn dealloc_pd(&self, _pd: u32) -> crate::error::Result<()> {
        Ok(())
    }
    unsafe fn reg_mr(
        &self,
        _pd: u32,
        _addr: u64,
        _len: u64,
        _access: crate::attr::Access,
    ) -> crate::error::Result<MrKeys> {
        Ok(MrKeys { lkey: 7, rkey: 7 })
    }
    fn dereg_mr(&self, _lkey: u32) -> crate::error::Result<()> {
        Ok(())
    }
    fn create_cq(&self, _depth: u32) -> crate::error::Result<RawCq> {
        Ok(RawCq {
            path: RawCqPath::Driver(Box::new(FakeCq {
                log: Arc::clone(&self.log),
            })),
            cqn: 1,
            keep: Arc::new(()),
        })
    }
    fn destroy_cq(&self, _cqn: u32) -> crate::error::Result<()> {
        Ok(())
    }
    fn create_qp(&self, _pd: u32, _s: u32, _r: u32, init: &QpInit) -> crate::error::Result<RawQp> {
        let caps = QpCaps {
            max_send_sge: init.max_send_sge,
            max_inline_data: init.max_inline_data,
            max_recv_sge: init.max_recv_sge,
        };
        Ok(RawQp {
            path: RawQpPath::Driver(Box::new(FakeQp {
                log: Arc::clone(&self.log),
                state: QpState::Reset,
                caps,
                defers: self.defers,
                pending: Vec::new(),
            })),
            qpn: 0x11,
            caps,
            psn: 0,
            keep: Arc::new(()),
        })
    }
    fn modify_qp(&self, _qpn: u32, _m: &QpModify) -> crate::error::Result<()> {
        Ok(())
    }
    fn destroy_qp(&self, _qpn: u32) -> crate::error::Result<()> {
        Ok(())
    }
}

struct Env {
    log: Arc<Mutex<Log>>,
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    cq: *mut rdd_cq,
    qp: *mut rdd_qp,
}

fn env(unguarded: bool) -> Env {
    env_with(unguarded, false)
}

/// With `defers`, the fake driver defers as the direct rxe/siw rings do.
fn env_with(unguarded: bool, defers: bool) -> Env {
    let log = Arc::new(Mutex::new(Log::default()));
    let dev = insert(Box::new(DeviceObj {
        soft: None,
        backend: Arc::new(FakeBackend {
            log: Arc::clone(&log),
            defers,
        }),
        path: super::device::RDD_DATA_PATH_DIRECT,
        link: Arc::new(()),
    }))
    .unwrap();
    let mut e = Env {
        log,
        dev: as_handle(dev),
        pd: null_mut(),
        cq: null_mut(),
        qp: null_mut(),
    };
    // SAFETY: every out-parameter is a live local.
    unsafe {
        ok(rdd_pd_alloc(e.dev, &mut e.pd));
        ok(rdd_cq_create(e.dev, 16, &mut e.cq));
        if unguarded {
            ok(rdd_cq_set_unguarded(e.cq, 1));
        }
        ok(rdd_qp_create(e.pd, e.cq, e.cq, ptr::null(), &mut e.qp));
        let peer = rdd_qp_info::default();
        ok(rdd_qp_connect(e.qp, &peer, ptr::null()));
    }
    e
}

fn close(e: Env) {
    ok(rdd_qp_destroy(e.qp));
    ok(rdd_cq_destroy(e.cq));
    ok(rdd_pd_free(e.pd));
    ok(rdd_device_close(e.dev));
}

fn write(e: &Env, wr_id: u64, flags: u32) -> rdd_status {
    // SAFETY: the fake provider never touches memory.
    unsafe { rdd_qp_write(e.qp, wr_id, 0x1000, 8, 7, 0x2000, 7, flags) }
}

fn doorbells(e: &Env) -> u64 {
    let mut n = 0;
    // SAFETY: out-parameter is a local.
    ok(unsafe { rdd_qp_doorbells(e.qp, &mut n) });
    n
}

#[test]
fn a_deferred_wr_goes_to_the_provider_at_once() {
    let e = env(false);
    ok(write(&e, 1, RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    ok(write(&e, 2, RDD_SEND_DEFER_DOORBELL));
    // SAFETY: the fake provider never touches memory.
    ok(unsafe { rdd_qp_send_inline(e.qp, 3, b"hi".as_ptr().cast(), 2, RDD_SEND_SIGNALED) });
    // SAFETY: as above.
    ok(unsafe { rdd_qp_recv(e.qp, 4, 0x3000, 64, 7, RDD_SEND_DEFER_DOORBELL) });
    {
        let log = e.log.lock().unwrap();
        assert_eq!(log.send_calls, [[1], [2], [3]]);
        assert_eq!(log.recvs, [4]);
    }
    assert_eq!(doorbells(&e), 3);
    ok(rdd_qp_ring(e.qp)); // nothing deferred: nothing happens
    assert_eq!(doorbells(&e), 3);
    // The provider validates with the crate's rules: same statuses.
    assert_eq!(write(&e, 5, 0x10), rdd_status::InvalidFlags);
    // SAFETY: as above.
    let s = unsafe { rdd_qp_fetch_add(e.qp, 6, 0x1000, 7, 0x2004, 7, 1, 0) };
    assert_eq!(s, rdd_status::AtomicUnaligned);
    // The one-handle poll takes the provider's completions; it uses no QP
    // (the provider's bookkeeping is its own), so a held QP is no conflict.
    let mut wc = [rdd_wc::default(); 4];
    {
        let _held = excl::<QpObj>(h(e.qp)).unwrap();
        // SAFETY: a live local array.
        assert_eq!(unsafe { rdd_cq_poll_n(e.cq, wc.as_mut_ptr(), 4) }, 2);
    }
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (1, 3));
    close(e);
}

#[test]
fn an_unguarded_cq_meters_provider_posts() {
    let e = env(true);
    // 16 entries; the provider reports every completion it is asked for,
    // so no spare is kept (as `rdd_qp_post_send` on a driver QP).
    for i in 0..16 {
        ok(write(&e, i, RDD_SEND_SIGNALED));
    }
    assert_eq!(write(&e, 16, RDD_SEND_SIGNALED), rdd_status::CqFull);
    ok(write(&e, 17, 0));
    // SAFETY: the fake provider never touches memory.
    let s = unsafe { rdd_qp_recv(e.qp, 18, 0x3000, 8, 7, 0) };
    assert_eq!(s, rdd_status::CqFull);
    let mut wc = [rdd_wc::default(); 16];
    // SAFETY: a live local array.
    assert_eq!(unsafe { rdd_cq_poll_n(e.cq, wc.as_mut_ptr(), 16) }, 16);
    ok(write(&e, 19, RDD_SEND_SIGNALED));
    assert_eq!(e.log.lock().unwrap().send_calls.len(), 18);
    close(e);
}

fn calls(e: &Env) -> Vec<Vec<u64>> {
    e.log.lock().unwrap().send_calls.clone()
}

#[test]
fn a_deferring_driver_rings_once_per_batch() {
    let e = env_with(false, true);
    for id in 1..=3 {
        ok(write(&e, id, RDD_SEND_DEFER_DOORBELL));
    }
    assert!(calls(&e).is_empty(), "nothing reaches the provider yet");
    assert_eq!(doorbells(&e), 0);
    ok(rdd_qp_ring(e.qp));
    assert_eq!(calls(&e), [[1, 2, 3]]);
    assert_eq!(doorbells(&e), 1);
    // Nothing pending: nothing happens.
    ok(rdd_qp_ring(e.qp));
    assert_eq!((calls(&e).len(), doorbells(&e)), (1, 1));
    // A deferred WR then one without the bit: one call for both.
    ok(write(&e, 4, RDD_SEND_DEFER_DOORBELL));
    ok(write(&e, 5, RDD_SEND_SIGNALED));
    assert_eq!(calls(&e)[1], [4, 5]);
    assert_eq!(doorbells(&e), 2);
    // A refused call changes nothing: the deferred WR stays pending, and
    // a deferred WR the provider refuses rings nothing.
    ok(write(&e, 6, RDD_SEND_DEFER_DOORBELL));
    assert_eq!(write(&e, 7, 0x10), rdd_status::InvalidFlags);
    // SAFETY: the fake provider never touches memory.
    let s = unsafe { rdd_qp_fetch_add(e.qp, 8, 0x1000, 7, 0x2004, 7, 1, RDD_SEND_DEFER_DOORBELL) };
    assert_eq!(s, rdd_status::AtomicUnaligned);
    assert_eq!((calls(&e).len(), doorbells(&e)), (2, 2));
    // rdd_qp_post_send rings what was deferred, even when its own WR is
    // refused before the provider sees it.
    let bad = crate::ffi::wr::rdd_wr {
        wr_id: 8,
        sg_list: ptr::null(),
        num_sge: 0,
        opcode: 0xff,
        flags: 0,
        imm_data: 0,
        remote_addr: 0,
        rkey: 0,
        invalidate_rkey: 0,
        compare_add: 0,
        swap: 0,
    };
    let mut bad_index = 99usize;
    // SAFETY: one readable WR, a writable index.
    let s = unsafe { rdd_qp_post_send(e.qp, &bad, 1, &mut bad_index) };
    assert_ne!(s, rdd_status::Ok);
    assert_eq!(bad_index, 0);
    assert_eq!(calls(&e)[2], [6]);
    assert_eq!(doorbells(&e), 3);
    // Completions in posting order (only 5 was signaled).
    let mut wc = [rdd_wc::default(); 4];
    // SAFETY: a live local array.
    assert_eq!(unsafe { rdd_cq_poll_n(e.cq, wc.as_mut_ptr(), 4) }, 1);
    assert_eq!(wc[0].wr_id, 5);
    close(e);
}

#[test]
fn a_deferring_driver_meters_deferred_posts() {
    let e = env_with(true, true);
    // 16 entries: deferred signaled WRs take their completions' headroom
    // at once, as posted ones do.
    for i in 0..16 {
        ok(write(&e, i, RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL));
    }
    assert_eq!(
        write(&e, 16, RDD_SEND_SIGNALED | RDD_SEND_DEFER_DOORBELL),
        rdd_status::CqFull
    );
    ok(rdd_qp_ring(e.qp));
    assert_eq!(calls(&e), [(0..16).collect::<Vec<u64>>()]);
    assert_eq!(doorbells(&e), 1);
    close(e);
}
