//! The software HCA: an in-process device that behaves like an mlx5 HCA on
//! the same queue memory the core writes (feature `soft`).
//!
//! It sits on the device side of the queues: it watches the doorbell
//! records, copies WQEs out of the send ring as bytes, validates them with
//! its own parser ([`wqe`], never the crate's encoder), executes them
//! between RC QPs of the same device, and writes CQE64/CQE128 entries with
//! the owner-bit protocol of reference §A.8. Everything the application
//! touches on the data path is plain shared memory: posting and polling
//! never take a lock or make a call into the device.
//!
//! Two ways to run: [`SoftDevice::step`] processes what is pending in the
//! caller's thread (deterministic, for tests and instruction counts), and
//! [`SoftDevice::start`] runs a device thread. The device takes its lock
//! once per pass over all queues, never per WQE.

pub mod mr;
pub mod wqe;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use std::vec::Vec;

pub use mr::Access;
use mr::MrTable;
use wqe::{Local, ParsedSend, Seg};

use crate::error::{Error, Result};
use crate::mmio;
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::{cqe_opcode, opcode, Mlx5dvCq, Mlx5dvQp};
use crate::provider::mlx5::QpState;
use crate::util::AlignedBuf;
use crate::wr::QpCaps;

/// First QP number handed out.
const QPN_BASE: u32 = 0x100;
/// First CQ number handed out.
const CQN_BASE: u32 = 0x80;
/// Largest queue the device creates (BBs or entries).
const MAX_QUEUE: u32 = 1 << 15;
/// Work done per QP per pass, so one busy QP cannot starve the others.
const BUDGET_PER_QP: u32 = 64;

/// Device configuration.
#[derive(Clone, Copy, Debug)]
pub struct SoftConfig {
    /// CQE size for new CQs: 64 or 128.
    pub cqe_size: u32,
    /// Delay before an RNR-NAKed operation is retried (thread mode; in
    /// step mode every `step` is one retry).
    pub rnr_delay: Duration,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            cqe_size: 64,
            rnr_delay: Duration::from_micros(20),
        }
    }
}

/// Asynchronous errors the device reports (the `ibv_get_async_event`
/// equivalent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A completion did not fit: the CQ overran. The completion was not
    /// written, and the CQ accepts no more entries (like hardware, the CQ
    /// is in error).
    CqOverrun {
        /// CQ number.
        cqn: u32,
    },
    /// A QP entered the error state because of a local failure.
    QpFatal {
        /// QP number.
        qpn: u32,
    },
}

/// Fault injection, for tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The `nth` (1-based) operation executed from now on, on `qpn` (or any
    /// QP), fails with `syndrome` instead of executing.
    FailNth {
        /// Restrict to this QP.
        qpn: Option<u32>,
        /// Which operation.
        nth: u64,
        /// The error-CQE syndrome to report.
        syndrome: u8,
    },
    /// Every operation waits this long (thread mode) or this many steps
    /// (step mode, counted in whole passes) before it executes.
    DelayCompletions {
        /// Delay in thread mode.
        time: Duration,
        /// Delay in step mode.
        steps: u64,
    },
    /// The peer `qpn` is unreachable: requests to it fail with
    /// "transport retry counter exceeded".
    DropPeer {
        /// The unreachable QP.
        qpn: u32,
    },
}

/// QP creation parameters.
#[derive(Clone, Copy, Debug)]
pub struct QpInit {
    /// Send WRs the SQ must hold (of the largest size).
    pub max_send_wr: u32,
    /// Receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// The address of the peer a connected QP talks to (`ibv_ah_attr`).
/// The software device ignores it; the verbs backend passes it to
/// `ibv_modify_qp` at RTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressVector {
    /// Destination LID (InfiniBand; 0 on RoCE and iWARP).
    pub dlid: u16,
    /// Service level (InfiniBand SL; on RoCE the VLAN priority).
    pub sl: u8,
    /// Send a global routing header (always on RoCE).
    pub is_global: bool,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Local GID table index to send from.
    pub sgid_index: u8,
    /// GRH hop limit (IPv4/IPv6 TTL on RoCEv2).
    pub hop_limit: u8,
    /// GRH traffic class (the DSCP/ECN byte on RoCEv2, which switches map
    /// to a PFC priority).
    pub traffic_class: u8,
    /// GRH flow label.
    pub flow_label: u32,
}

/// A QP state change (`ibv_modify_qp`). Fields that the target state does
/// not use are ignored.
#[derive(Clone, Copy, Debug)]
pub struct QpModify {
    /// The new state.
    pub state: QpState,
    /// INIT: remote operations this QP accepts.
    pub access: Access,
    /// INIT: physical port (1-based).
    pub port_num: u8,
    /// RTR: the peer's QP number.
    pub dest_qpn: u32,
    /// RTR: path MTU in bytes (256, 512, 1024, 2048 or 4096).
    pub path_mtu: u32,
    /// RTR: the peer's initial packet sequence number (24 bits).
    pub rq_psn: u32,
    /// RTR: how to reach the peer.
    pub av: AddressVector,
    /// RTR: RDMA READs and atomics the peer may have outstanding here.
    pub max_dest_rd_atomic: u8,
    /// RTR: minimum RNR NAK timer (IB encoding, 1..=31; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// RTS: this QP's initial packet sequence number (24 bits).
    pub sq_psn: u32,
    /// RTS: local ACK timeout (IB encoding: 4.096 µs · 2^timeout).
    pub timeout: u8,
    /// RTS: RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RTS: transport retries.
    pub retry_cnt: u8,
    /// RTS: RDMA READs and atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
    /// RTS: send rate limit in kbit/s (0: none). Devices without packet
    /// pacing (the software device, rxe, siw) refuse a non-zero limit
    /// with [`Error::Unsupported`].
    pub rate_limit_kbps: u32,
}

impl QpModify {
    /// A transition to `state` with default attributes.
    pub fn to(state: QpState) -> QpModify {
        QpModify {
            state,
            access: Access::NONE,
            port_num: 1,
            dest_qpn: 0,
            path_mtu: 1024,
            rq_psn: 0,
            av: AddressVector::default(),
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            sq_psn: 0,
            rate_limit_kbps: 0,
            timeout: 14,
            rnr_retry: 7,
            retry_cnt: 7,
            max_rd_atomic: 1,
        }
    }
}

/// Memory the device allocated for a QP (the QP buffer, doorbell record
/// and doorbell register pair). Shared with the application's queue
/// objects, freed when both sides are done.
pub struct QpMem {
    buf: AlignedBuf,
    dbrec: AlignedBuf,
    bf: AlignedBuf,
    rq_bytes: usize,
}

/// Memory the device allocated for a CQ.
pub struct CqMem {
    buf: AlignedBuf,
    dbrec: AlignedBuf,
    uar: AlignedBuf,
}

/// What `create_qp` returns: the raw queue descriptor for the core, the
/// QP number, the granted capabilities and the memory keep-alive.
pub struct SoftQp {
    /// Fields as `mlx5dv_init_obj` would return them.
    pub dv: Mlx5dvQp,
    /// QP number.
    pub qpn: u32,
    /// Granted capabilities.
    pub caps: QpCaps,
    /// Keeps the queue memory alive.
    pub mem: Arc<QpMem>,
}

/// What `create_cq` returns.
pub struct SoftCq {
    /// Fields as `mlx5dv_init_obj` would return them.
    pub dv: Mlx5dvCq,
    /// CQ number.
    pub cqn: u32,
    /// Keeps the CQ memory alive.
    pub mem: Arc<CqMem>,
}

/// Device-side state of one QP.
struct Qp {
    qpn: u32,
    pd: u32,
    state: QpState,
    mem: Arc<QpMem>,
    sq: *mut u8,
    sq_cnt: u32,
    /// BBs consumed (free-running).
    sq_ci: u32,
    rq: *mut u8,
    rq_cnt: u32,
    rq_stride: u32,
    /// Receives consumed (free-running).
    rq_ci: u32,
    dbrec: *mut u32,
    send_cq: u32,
    recv_cq: u32,
    dest: u32,
    access: Access,
    rnr_retry: u8,
    rnr_attempts: u32,
    rnr_wait: Option<Instant>,
    rnr_step: u64,
    hold: Option<(Instant, u64)>,
}

/// Device-side state of one CQ.
struct Cq {
    mem: Arc<CqMem>,
    cnt: u32,
    size: u32,
    /// CQEs written (free-running).
    pi: u32,
    overrun: bool,
    users: u32,
    /// Signalled when a CQE lands on an armed CQ.
    event: Arc<crate::event::EventFd>,
    /// Armed at this consumer index, not fired yet.
    armed_ci: Option<u32>,
    /// The arm asks only for solicited (or error) completions.
    armed_solicited: bool,
    /// Producer index of the newest CQE that is solicited or an error
    /// (what a solicited-only arm waits for).
    last_solicited: Option<u32>,
}

/// What executing one WQE produced.
enum Outcome {
    /// Completed; requester CQE byte count.
    Done(u32),
    /// Failed with this syndrome; the QP moves to ERROR.
    Fail(u8),
    /// The responder had no receive posted.
    Rnr,
    /// Not yet (injected delay).
    Wait,
}

/// Per-WQE working memory, allocated once with the device so executing a
/// WQE neither allocates nor zeroes large arrays.
struct Scratch {
    wbuf: [u8; wqe::MAX_WQE_BYTES + 64],
    segs: [Seg; wqe::MAX_SEGS],
    local: [(*mut u8, usize); wqe::MAX_SEGS],
    rsegs: [Seg; 64],
    dst: [(*mut u8, usize); 64],
    entry: [u8; 1024],
}

impl Scratch {
    fn new() -> std::boxed::Box<Scratch> {
        std::boxed::Box::new(Scratch {
            wbuf: [0; wqe::MAX_WQE_BYTES + 64],
            segs: [Seg::default(); wqe::MAX_SEGS],
            local: [(core::ptr::null_mut(), 0); wqe::MAX_SEGS],
            rsegs: [Seg::default(); 64],
            dst: [(core::ptr::null_mut(), 0); 64],
            entry: [0; 1024],
        })
    }
}

/// The device's state, behind one lock.
struct Engine {
    /// Taken out while a WQE executes (so `&mut self` stays usable).
    scratch: Option<std::boxed::Box<Scratch>>,
    cfg: SoftConfig,
    mrs: MrTable,
    qps: Vec<Option<Qp>>,
    cqs: Vec<Option<Cq>>,
    pds: Vec<bool>,
    events: VecDeque<AsyncEvent>,
    /// Readable while `events` is not empty (made on first request).
    events_fd: Option<Arc<crate::event::EventFd>>,
    faults: Vec<Fault>,
    steps: u64,
    threaded: bool,
}

// SAFETY: the raw pointers in `Qp` point into `QpMem` buffers that the same
// `Qp` keeps alive through its `Arc`; all shared words are accessed
// atomically (`mmio`), and the engine is only reachable behind a Mutex.
unsafe impl Send for Engine {}

struct Shared {
    engine: Mutex<Engine>,
    stop: AtomicBool,
    passes: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A software HCA. Cloning shares the device.
#[derive(Clone)]
pub struct SoftDevice {
    shared: Arc<Shared>,
}

fn cqe_image(op: u8, qpn_word: u32, counter: u16, byte_cnt: u32, imm: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[36..40].copy_from_slice(&imm.to_be_bytes());
    c[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    c[56..60].copy_from_slice(&qpn_word.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = op << 4;
    c
}

fn err_image(op: u8, wqe_op: u8, qpn: u32, counter: u16, synd: u8) -> [u8; 64] {
    let mut c = cqe_image(op, (wqe_op as u32) << 24 | qpn, counter, 0, 0);
    c[54] = synd; // vendor syndrome: we echo the syndrome
    c[55] = synd;
    c
}

/// Copies `len` bytes described by `src` into `dst` lists of (ptr, len).
///
/// # Safety
/// Every pointer must be valid for its length (checked against the MR
/// table by the caller).
unsafe fn sg_copy(src: &[(*mut u8, usize)], dst: &[(*mut u8, usize)]) {
    let (mut si, mut so, mut di, mut dof) = (0, 0, 0, 0);
    while si < src.len() && di < dst.len() {
        let n = (src[si].1 - so).min(dst[di].1 - dof);
        // SAFETY: both ranges are inside validated regions (caller);
        // `copy` tolerates overlap (a QP may write into its own memory).
        unsafe { core::ptr::copy(src[si].0.add(so), dst[di].0.add(dof), n) };
        so += n;
        dof += n;
        if so == src[si].1 {
            si += 1;
            so = 0;
        }
        if dof == dst[di].1 {
            di += 1;
            dof = 0;
        }
    }
}

/// Largest send WQE for `init`: atomics (64 B), ctrl + raddr + SGEs, or
/// ctrl + raddr + inline header + payload, rounded up to a BB.
fn max_wqe_bytes(init: &QpInit) -> u32 {
    [
        64,
        32 + 16 * init.max_send_sge,
        32 + (4 + init.max_inline_data).div_ceil(16) * 16,
    ]
    .into_iter()
    .max()
    .unwrap_or(64)
    .next_multiple_of(64)
}

/// SQ basic blocks and RQ entries the device gives a QP created with
/// `init` (as rdma-core sizes mlx5 queues, reference §A.2, §A.6).
pub fn queue_sizes(init: &QpInit) -> (u32, u32) {
    (
        pow2(init.max_send_wr.saturating_mul(max_wqe_bytes(init)) / 64),
        pow2(init.max_recv_wr),
    )
}

impl Engine {
    /// Queues an asynchronous event and wakes whoever waits on the fd.
    fn push_event(&mut self, ev: AsyncEvent) {
        self.events.push_back(ev);
        if let Some(fd) = &self.events_fd {
            fd.signal();
        }
    }

    fn qp_index(&self, qpn: u32) -> Option<usize> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(i)?.as_ref().map(|_| i)
    }

    fn cq_mut(&mut self, cqn: u32) -> Option<&mut Cq> {
        self.cqs
            .get_mut(cqn.checked_sub(CQN_BASE)? as usize)?
            .as_mut()
    }

    /// Writes one CQE with the owner bit of its pass, or reports an
    /// overrun instead of overwriting an entry software has not consumed.
    fn push_cqe(&mut self, cqn: u32, img: &[u8; 64]) -> bool {
        let Some(cq) = self.cq_mut(cqn) else {
            return false;
        };
        if cq.overrun {
            return false;
        }
        // SAFETY: word 0 of the CQ doorbell record, owned by `cq.mem`.
        let ci = unsafe { mmio::read_dbrec(cq.mem.dbrec.ptr().cast::<u32>()) } & 0x00ff_ffff;
        if (cq.pi.wrapping_sub(ci) & 0x00ff_ffff) >= cq.cnt {
            cq.overrun = true;
            self.push_event(AsyncEvent::CqOverrun { cqn });
            return false;
        }
        let slot = (cq.pi & (cq.cnt - 1)) as usize * cq.size as usize;
        let at = slot + cq.size as usize - 64;
        let owner = ((cq.pi & cq.cnt) != 0) as u8;
        let base = cq.mem.buf.ptr();
        // SAFETY: the slot is inside the CQ buffer and software does not
        // own it (checked against its consumer index above); the owner
        // byte is published last with Release.
        unsafe {
            if cq.size == 128 {
                core::ptr::write_bytes(base.add(slot), 0, 64);
            }
            core::ptr::copy_nonoverlapping(img.as_ptr(), base.add(at), 63);
            mmio::store_op_own(base.add(at + 63), (img[63] & 0xfe) | owner);
        }
        // op_own: opcode in bits 7..4, solicited event in bit 1 (§A.8).
        let op = img[63] >> 4;
        if img[63] & 0x02 != 0 || op == cqe_opcode::REQ_ERR || op == cqe_opcode::RESP_ERR {
            cq.last_solicited = Some(cq.pi);
        }
        cq.pi = cq.pi.wrapping_add(1);
        true
    }

    fn set_error(&mut self, qi: usize) {
        if let Some(q) = self.qps[qi].as_mut() {
            q.state = QpState::Error;
        }
    }

    /// One pass over every QP; returns the amount of work done.
    fn pass(&mut self, now: Instant) -> usize {
        self.steps += 1;
        let mut work = 0;
        for qi in 0..self.qps.len() {
            if self.qps[qi].is_none() {
                continue;
            }
            work += self.run_sq(qi, now);
            work += self.flush_rq(qi);
        }
        self.fire_cq_events();
        work
    }

    /// Delivers completion events (reference §A.8): software arms a CQ by
    /// writing the arm word into doorbell-record word 1 and then the 64-bit
    /// CQ doorbell (`arm word << 32 | cqn`, big-endian) at UAR + 0x20. Each
    /// doorbell write arms the CQ once: the device takes it (swaps the
    /// register back to 0, as a write-triggered register would be
    /// consumed), and fires one event as soon as a CQE exists at or after
    /// the armed consumer index; a solicited-only arm (command bit 24) only
    /// for a solicited or error CQE at or after it.
    fn fire_cq_events(&mut self) {
        for (i, slot) in self.cqs.iter_mut().enumerate() {
            let Some(cq) = slot.as_mut() else {
                continue;
            };
            // SAFETY: the CQ doorbell at UAR + 0x20 is 8-aligned and inside
            // the UAR page owned by `cq.mem`; software writes it with one
            // 64-bit store, the device reads and clears it atomically, so a
            // write that lands after the swap stays for the next pass.
            let reg = unsafe {
                core::sync::atomic::AtomicU64::from_ptr(
                    cq.mem
                        .uar
                        .ptr()
                        .add(crate::provider::mlx5::layout::CQ_DOORBELL)
                        .cast(),
                )
            };
            // AcqRel: the doorbell-record word written before the doorbell
            // is visible after this.
            let v = u64::from_be(reg.swap(0, Ordering::AcqRel));
            if v != 0 && (v & 0x00ff_ffff) as u32 == CQN_BASE + i as u32 {
                let word = (v >> 32) as u32;
                cq.armed_ci = Some(word & 0x00ff_ffff);
                cq.armed_solicited = word & (1 << 24) != 0;
            }
            let Some(ci) = cq.armed_ci else {
                continue;
            };
            let ahead = cq.pi.wrapping_sub(ci) & 0x00ff_ffff;
            let wanted = !cq.armed_solicited
                || cq
                    .last_solicited
                    .is_some_and(|s| (s.wrapping_sub(ci) & 0x00ff_ffff) < ahead);
            if ahead != 0 && ahead <= cq.cnt && wanted {
                cq.armed_ci = None;
                cq.event.signal();
            }
        }
    }

    /// In ERROR, completes every posted receive with a flush error.
    fn flush_rq(&mut self, qi: usize) -> usize {
        let q = self.qps[qi].as_ref().expect("checked");
        if q.state != QpState::Error {
            return 0;
        }
        // SAFETY: word 0 of the QP doorbell record.
        let head = unsafe { mmio::read_dbrec(q.dbrec) } & 0xffff;
        let (qpn, cqn) = (q.qpn, q.recv_cq);
        let mut n = 0;
        loop {
            let q = self.qps[qi].as_ref().expect("checked");
            if (head.wrapping_sub(q.rq_ci) & 0xffff) == 0 {
                break;
            }
            let counter = q.rq_ci as u16;
            let img = err_image(cqe_opcode::RESP_ERR, 0, qpn, counter, syndrome::WR_FLUSHED);
            if !self.push_cqe(cqn, &img) {
                break;
            }
            let q = self.qps[qi].as_mut().expect("checked");
            q.rq_ci = q.rq_ci.wrapping_add(1);
            n += 1;
        }
        n
    }

    /// Consumes posted send WQEs of one QP.
    fn run_sq(&mut self, qi: usize, now: Instant) -> usize {
        let mut done = 0;
        let Some(mut sc) = self.scratch.take() else {
            return 0;
        };
        while done < BUDGET_PER_QP {
            let q = self.qps[qi].as_ref().expect("checked");
            if !matches!(q.state, QpState::Rts | QpState::Error) {
                break;
            }
            // SAFETY: word 1 (SQ) of the QP doorbell record.
            let pi16 = unsafe { mmio::read_dbrec(q.dbrec.add(1)) } & 0xffff;
            let pending = pi16.wrapping_sub(q.sq_ci) & 0xffff;
            if pending == 0 {
                break;
            }
            let mask = q.sq_cnt - 1;
            let index = q.sq_ci as u16;
            // Copy the control segment, then the whole WQE, linearly.
            let mut ctrl = [0u8; 16];
            // SAFETY: the BB at sq_ci is inside the ring and was published
            // by the doorbell record (acquire-loaded above).
            unsafe {
                core::ptr::copy_nonoverlapping(
                    q.sq.add(((q.sq_ci & mask) as usize) * 64),
                    ctrl.as_mut_ptr(),
                    16,
                )
            };
            let ds = wqe::ctrl_ds(&ctrl);
            let nbb = ds.div_ceil(4);
            let sane = ds != 0 && nbb <= pending && nbb <= q.sq_cnt;
            let nbb = if sane { nbb } else { 1 };
            for k in 0..nbb {
                let bb = (q.sq_ci.wrapping_add(k) & mask) as usize;
                // SAFETY: as above; `wbuf` holds up to 16 BBs + slack.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        q.sq.add(bb * 64),
                        sc.wbuf.as_mut_ptr().add(k as usize * 64),
                        64,
                    )
                };
            }
            let wqe_op = ctrl[3];
            let (qpn, cqn, state) = (q.qpn, q.send_cq, q.state);
            let outcome = if state == QpState::Error {
                Outcome::Fail(syndrome::WR_FLUSHED)
            } else if !sane {
                Outcome::Fail(syndrome::LOCAL_QP_OP)
            } else {
                let Scratch { wbuf, segs, .. } = &mut *sc;
                match wqe::parse_send(&wbuf[..nbb as usize * 64], index, qpn, segs) {
                    Err(s) => Outcome::Fail(s),
                    Ok(p) => self.execute(qi, &p, &mut sc, now),
                }
            };
            let signaled = ctrl[11] & 0x0c == 0x08;
            match outcome {
                Outcome::Wait | Outcome::Rnr => break,
                Outcome::Done(bytes) => {
                    if signaled {
                        let img = cqe_image(
                            cqe_opcode::REQ,
                            (wqe_op as u32) << 24 | qpn,
                            index,
                            bytes,
                            0,
                        );
                        self.push_cqe(cqn, &img);
                    }
                }
                Outcome::Fail(s) => {
                    let img = err_image(cqe_opcode::REQ_ERR, wqe_op, qpn, index, s);
                    self.push_cqe(cqn, &img);
                    if state != QpState::Error {
                        self.set_error(qi);
                        if s == syndrome::LOCAL_QP_OP || s == syndrome::LOCAL_LENGTH {
                            self.push_event(AsyncEvent::QpFatal { qpn });
                        }
                    }
                }
            }
            let q = self.qps[qi].as_mut().expect("checked");
            q.sq_ci = q.sq_ci.wrapping_add(nbb);
            q.rnr_attempts = 0;
            q.hold = None;
            done += 1;
        }
        self.scratch = Some(sc);
        done as usize
    }

    /// Injected faults that apply to this operation.
    fn fault_for(&mut self, qpn: u32, dest: u32) -> Option<Outcome> {
        for f in &self.faults {
            if let Fault::DropPeer { qpn: d } = *f {
                if d == dest {
                    return Some(Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC));
                }
            }
        }
        let mut hit = None;
        for f in self.faults.iter_mut() {
            if let Fault::FailNth {
                qpn: which,
                nth,
                syndrome,
            } = f
            {
                if which.is_none_or(|w| w == qpn) {
                    if *nth == 1 {
                        hit = Some(*syndrome);
                        *nth = 0;
                    } else if *nth > 1 {
                        *nth -= 1;
                    }
                }
            }
        }
        self.faults
            .retain(|f| !matches!(f, Fault::FailNth { nth: 0, .. }));
        hit.map(Outcome::Fail)
    }

    /// Executes one validated WQE of QP `qi` against its peer.
    fn execute(&mut self, qi: usize, p: &ParsedSend, sc: &mut Scratch, now: Instant) -> Outcome {
        let Scratch {
            wbuf,
            segs,
            local,
            rsegs,
            dst,
            entry,
        } = sc;
        let threaded = self.threaded;
        let steps = self.steps;
        let delay = self.faults.iter().find_map(|f| match *f {
            Fault::DelayCompletions { time, steps } => Some((time, steps)),
            _ => None,
        });
        let rnr_delay = self.cfg.rnr_delay;
        let q = self.qps[qi].as_mut().expect("checked");
        if let Some((t, s)) = delay {
            let (until, until_step) = *q.hold.get_or_insert((now + t, steps + s));
            if (threaded && now < until) || (!threaded && steps < until_step) {
                return Outcome::Wait;
            }
        }
        if let Some(w) = q.rnr_wait {
            if threaded && now < w {
                return Outcome::Wait;
            }
        }
        if !threaded && q.rnr_step == steps && q.rnr_attempts > 0 {
            return Outcome::Wait;
        }
        let (pd, qpn, dest) = (q.pd, q.qpn, q.dest);
        if p.opcode == opcode::NOP {
            return Outcome::Done(0);
        }
        if let Some(o) = self.fault_for(qpn, dest) {
            return o;
        }

        // Local side: gather (SEND/WRITE) or scatter (READ/atomics) list.
        let mut nlocal = 0;
        let mut total: u64 = 0;
        let writes_local = matches!(
            p.opcode,
            opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA
        );
        match p.local {
            Local::Inline { off, len } => {
                local[0] = (wbuf[off..].as_ptr() as *mut u8, len);
                nlocal = 1;
                total = len as u64;
            }
            Local::Segs(n) => {
                let need = if writes_local {
                    Access::LOCAL_WRITE
                } else {
                    Access::NONE
                };
                for s in &segs[..n] {
                    let Some(ptr) = self
                        .mrs
                        .check(s.lkey, pd, s.addr, s.len as u64, need, false)
                    else {
                        return Outcome::Fail(syndrome::LOCAL_PROT);
                    };
                    local[nlocal] = (ptr, s.len as usize);
                    nlocal += 1;
                    total += s.len as u64;
                }
            }
        }
        if total > 1 << 31 {
            return Outcome::Fail(syndrome::LOCAL_LENGTH);
        }

        // Remote side.
        let Some(bi) = self.qp_index(dest) else {
            return Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC);
        };
        let b = self.qps[bi].as_ref().expect("checked");
        if !matches!(b.state, QpState::Rtr | QpState::Rts) || b.dest != qpn {
            return Outcome::Fail(syndrome::TRANSPORT_RETRY_EXC);
        }
        let (bpd, bqpn, baccess, brecv_cq) = (b.pd, b.qpn, b.access, b.recv_cq);
        match p.opcode {
            opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => {
                let (ra, rk) = p.remote;
                let ok = baccess.contains(Access::REMOTE_WRITE);
                let Some(dst) = self
                    .mrs
                    .check(rk, bpd, ra, total, Access::REMOTE_WRITE, true)
                    .filter(|_| ok)
                else {
                    return Outcome::Fail(syndrome::REMOTE_ACCESS);
                };
                if p.opcode == opcode::RDMA_WRITE_IMM {
                    // Consumes a receive: check before moving data.
                    match self.take_recv(bi, &mut [], entry, now, rnr_delay, qi) {
                        Err(o) => return o,
                        Ok((counter, _)) => {
                            // SAFETY: ranges validated against the MR table.
                            unsafe { sg_copy(&local[..nlocal], &[(dst, total as usize)]) };
                            let img = cqe_image(
                                cqe_opcode::RESP_WR_IMM,
                                bqpn,
                                counter,
                                total as u32,
                                p.imm,
                            );
                            self.push_cqe(brecv_cq, &img);
                        }
                    }
                } else {
                    // SAFETY: ranges validated against the MR table.
                    unsafe { sg_copy(&local[..nlocal], &[(dst, total as usize)]) };
                }
                Outcome::Done(total as u32)
            }
            opcode::RDMA_READ => {
                let (ra, rk) = p.remote;
                let ok = baccess.contains(Access::REMOTE_READ);
                let Some(srcp) = self
                    .mrs
                    .check(rk, bpd, ra, total, Access::REMOTE_READ, true)
                    .filter(|_| ok)
                else {
                    return Outcome::Fail(syndrome::REMOTE_ACCESS);
                };
                // SAFETY: ranges validated against the MR table.
                unsafe { sg_copy(&[(srcp, total as usize)], &local[..nlocal]) };
                Outcome::Done(total as u32)
            }
            opcode::ATOMIC_CS | opcode::ATOMIC_FA => {
                let (ra, rk) = p.remote;
                if ra % 8 != 0 {
                    return Outcome::Fail(syndrome::REMOTE_INVAL_REQ);
                }
                let ok = baccess.contains(Access::REMOTE_ATOMIC);
                let Some(t) = self
                    .mrs
                    .check(rk, bpd, ra, 8, Access::REMOTE_ATOMIC, true)
                    .filter(|_| ok)
                else {
                    return Outcome::Fail(syndrome::REMOTE_ACCESS);
                };
                // SAFETY: 8 bytes inside a registered region, 8-aligned;
                // atomic with respect to every device operation (engine
                // lock) and to CPU atomics on the same word.
                let cell = unsafe { core::sync::atomic::AtomicU64::from_ptr(t.cast::<u64>()) };
                let (swap_add, compare) = p.atomic;
                let old = if p.opcode == opcode::ATOMIC_FA {
                    cell.fetch_add(swap_add, Ordering::SeqCst)
                } else {
                    match cell.compare_exchange(
                        compare,
                        swap_add,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    ) {
                        Ok(v) | Err(v) => v,
                    }
                };
                let bytes = old.to_ne_bytes();
                // SAFETY: the local SGE is exactly 8 bytes, validated with
                // LOCAL_WRITE.
                unsafe { sg_copy(&[(bytes.as_ptr() as *mut u8, 8)], &local[..nlocal]) };
                Outcome::Done(8)
            }
            _ => {
                // SEND, SEND_IMM, SEND_INV.
                let (counter, n) =
                    match self.take_recv(bi, &mut rsegs[..], entry, now, rnr_delay, qi) {
                        Err(o) => return o,
                        Ok(v) => v,
                    };
                let mut cap: u64 = 0;
                for (i, s) in rsegs[..n].iter().enumerate() {
                    let Some(ptr) = self.mrs.check(
                        s.lkey,
                        bpd,
                        s.addr,
                        s.len as u64,
                        Access::LOCAL_WRITE,
                        false,
                    ) else {
                        let img =
                            err_image(cqe_opcode::RESP_ERR, 0, bqpn, counter, syndrome::LOCAL_PROT);
                        self.push_cqe(brecv_cq, &img);
                        self.set_error(bi);
                        return Outcome::Fail(syndrome::REMOTE_OP);
                    };
                    dst[i] = (ptr, s.len as usize);
                    cap += s.len as u64;
                }
                if total > cap {
                    let img = err_image(
                        cqe_opcode::RESP_ERR,
                        0,
                        bqpn,
                        counter,
                        syndrome::LOCAL_LENGTH,
                    );
                    self.push_cqe(brecv_cq, &img);
                    self.set_error(bi);
                    return Outcome::Fail(syndrome::REMOTE_INVAL_REQ);
                }
                // SAFETY: ranges validated against the MR table.
                unsafe { sg_copy(&local[..nlocal], &dst[..n]) };
                let (op, imm) = match p.opcode {
                    opcode::SEND_IMM => (cqe_opcode::RESP_SEND_IMM, p.imm),
                    opcode::SEND_INVAL => {
                        if let Some(m) = self.mrs.get_mut(p.imm).filter(|m| m.pd == bpd) {
                            m.remote_valid = false;
                        }
                        (cqe_opcode::RESP_SEND_INV, p.imm)
                    }
                    _ => (cqe_opcode::RESP_SEND, 0),
                };
                let mut img = cqe_image(op, bqpn, counter, total as u32, imm);
                img[24..28].copy_from_slice(&qpn.to_be_bytes());
                if p.solicited {
                    img[63] |= 0x02;
                }
                self.push_cqe(brecv_cq, &img);
                Outcome::Done(total as u32)
            }
        }
    }

    /// Takes the next posted receive of QP `bi`, or reports RNR (retried up
    /// to the requester's `rnr_retry`, 7 = forever). Fills `segs` with the
    /// receive's scatter list (if `segs` is empty the list is not needed).
    fn take_recv(
        &mut self,
        bi: usize,
        segs: &mut [Seg],
        entry: &mut [u8; 1024],
        now: Instant,
        rnr_delay: Duration,
        requester: usize,
    ) -> core::result::Result<(u16, usize), Outcome> {
        let b = self.qps[bi].as_ref().expect("checked");
        // SAFETY: word 0 (RQ) of the responder's doorbell record.
        let head = unsafe { mmio::read_dbrec(b.dbrec) } & 0xffff;
        if head.wrapping_sub(b.rq_ci) & 0xffff == 0 {
            let steps = self.steps;
            let a = self.qps[requester].as_mut().expect("checked");
            a.rnr_attempts += 1;
            a.rnr_step = steps;
            a.rnr_wait = Some(now + rnr_delay);
            if a.rnr_retry != 7 && a.rnr_attempts > a.rnr_retry as u32 {
                return Err(Outcome::Fail(syndrome::RNR_RETRY_EXC));
            }
            return Err(Outcome::Rnr);
        }
        let slot = (b.rq_ci & (b.rq_cnt - 1)) as usize;
        let stride = b.rq_stride as usize;
        let len = stride.min(entry.len());
        // SAFETY: the entry is inside the RQ ring and was published by the
        // RQ doorbell record (acquire-loaded above).
        unsafe { core::ptr::copy_nonoverlapping(b.rq.add(slot * stride), entry.as_mut_ptr(), len) };
        let counter = b.rq_ci as u16;
        let (bqpn, bcq) = (b.qpn, b.recv_cq);
        let n = if segs.is_empty() {
            Ok(0)
        } else {
            wqe::parse_recv(&entry[..len], segs)
        };
        let b = self.qps[bi].as_mut().expect("checked");
        b.rq_ci = b.rq_ci.wrapping_add(1);
        let a = self.qps[requester].as_mut().expect("checked");
        a.rnr_wait = None;
        match n {
            Ok(n) => Ok((counter, n)),
            Err(s) => {
                let img = err_image(cqe_opcode::RESP_ERR, 0, bqpn, counter, s);
                self.push_cqe(bcq, &img);
                self.set_error(bi);
                Err(Outcome::Fail(syndrome::REMOTE_OP))
            }
        }
    }
}

fn pow2(v: u32) -> u32 {
    v.max(1).next_power_of_two()
}

impl SoftDevice {
    /// A new device in step mode (no thread).
    pub fn new(cfg: SoftConfig) -> SoftDevice {
        SoftDevice {
            shared: Arc::new(Shared {
                engine: Mutex::new(Engine {
                    scratch: Some(Scratch::new()),
                    cfg,
                    mrs: MrTable::default(),
                    qps: Vec::new(),
                    cqs: Vec::new(),
                    pds: Vec::new(),
                    events: VecDeque::new(),
                    events_fd: None,
                    faults: Vec::new(),
                    steps: 0,
                    threaded: false,
                }),
                stop: AtomicBool::new(false),
                passes: AtomicU64::new(0),
                thread: Mutex::new(None),
            }),
        }
    }

    fn engine(&self) -> MutexGuard<'_, Engine> {
        // A panic inside the engine would be a device bug; keep the
        // device usable for the rest of the program's teardown.
        self.shared.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Processes everything that is pending now (one pass over every
    /// queue); returns the amount of work done. Deterministic.
    pub fn step(&self) -> usize {
        let w = self.engine().pass(Instant::now());
        self.shared.passes.fetch_add(1, Ordering::Relaxed);
        w
    }

    /// Steps until a pass does no work (at most `max` passes).
    pub fn run_until_idle(&self, max: usize) -> usize {
        let mut total = 0;
        for _ in 0..max {
            let w = self.step();
            total += w;
            if w == 0 {
                break;
            }
        }
        total
    }

    /// Starts the device thread (idempotent). From now on the device
    /// consumes work on its own; `step` may still be called.
    pub fn start(&self) {
        let mut t = self.shared.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_some() {
            return;
        }
        self.engine().threaded = true;
        self.shared.stop.store(false, Ordering::Relaxed);
        let shared = Arc::clone(&self.shared);
        *t = Some(
            std::thread::Builder::new()
                .name("rdd-soft-hca".into())
                .spawn(move || {
                    let mut idle = 0u32;
                    while !shared.stop.load(Ordering::Relaxed) {
                        let w = shared
                            .engine
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .pass(Instant::now());
                        shared.passes.fetch_add(1, Ordering::Relaxed);
                        if w > 0 {
                            idle = 0;
                        } else {
                            idle = idle.saturating_add(1);
                            if idle < 2000 {
                                core::hint::spin_loop();
                            } else if idle < 4000 {
                                std::thread::yield_now();
                            } else {
                                std::thread::sleep(Duration::from_micros(50));
                            }
                        }
                    }
                })
                .expect("spawning the device thread"),
        );
    }

    /// Stops the device thread, if running.
    pub fn stop(&self) {
        let h = self
            .shared
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            self.shared.stop.store(true, Ordering::Relaxed);
            let _ = h.join();
            self.engine().threaded = false;
        }
    }

    /// Device passes so far (a progress counter for tests).
    pub fn passes(&self) -> u64 {
        self.shared.passes.load(Ordering::Relaxed)
    }

    /// Next asynchronous event, if any.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        let mut e = self.engine();
        let ev = e.events.pop_front();
        if e.events.is_empty() {
            if let Some(fd) = &e.events_fd {
                fd.drain();
            }
        }
        ev
    }

    /// An fd that is readable while asynchronous events are pending (for
    /// the application's epoll set); take them with
    /// [`SoftDevice::poll_async_event`].
    pub fn async_event_fd(&self) -> Result<i32> {
        let mut e = self.engine();
        if e.events_fd.is_none() {
            let fd = Arc::new(crate::event::EventFd::new()?);
            if !e.events.is_empty() {
                fd.signal();
            }
            e.events_fd = Some(fd);
        }
        Ok(e.events_fd.as_ref().map_or(-1, |f| f.fd()))
    }

    /// Adds a fault.
    pub fn inject(&self, f: Fault) {
        self.engine().faults.push(f);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.engine().faults.clear();
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> u32 {
        let mut e = self.engine();
        e.pds.push(true);
        e.pds.len() as u32
    }

    /// Frees a protection domain.
    pub fn dealloc_pd(&self, pd: u32) -> Result<()> {
        let mut e = self.engine();
        let busy = e.qps.iter().flatten().any(|q| q.pd == pd);
        match e.pds.get_mut((pd as usize).wrapping_sub(1)) {
            Some(live @ true) => {
                if busy {
                    return Err(Error::ResourceBusy);
                }
                *live = false;
                Ok(())
            }
            _ => Err(Error::NoSuchObject),
        }
    }

    /// Registers `[addr, addr+len)` in `pd`; returns the key (lkey = rkey).
    ///
    /// # Safety
    /// The memory must stay valid, and not be freed, until
    /// [`SoftDevice::dereg_mr`] returns: the device reads and writes it on
    /// behalf of local and remote work.
    pub unsafe fn reg_mr(&self, pd: u32, addr: u64, len: u64, access: Access) -> Result<u32> {
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::InvalidAttribute);
        }
        if access.0 & !Access::MR_ALL.0 != 0 || addr.checked_add(len).is_none() {
            return Err(Error::InvalidAttribute);
        }
        let mut e = self.engine();
        if !e
            .pds
            .get((pd as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
        {
            return Err(Error::NoSuchObject);
        }
        Ok(e.mrs.insert(pd, addr, len, access))
    }

    /// Deregisters a region. After this returns the device never touches
    /// the memory again.
    pub fn dereg_mr(&self, key: u32) -> Result<()> {
        if self.engine().mrs.remove(key) {
            Ok(())
        } else {
            Err(Error::NoSuchObject)
        }
    }

    /// Creates a CQ with at least `depth` entries.
    pub fn create_cq(&self, depth: u32) -> Result<SoftCq> {
        if depth == 0 || depth >= MAX_QUEUE {
            return Err(Error::InvalidAttribute);
        }
        let mut e = self.engine();
        let cnt = pow2(depth + 1);
        let size = e.cfg.cqe_size;
        let mem = Arc::new(CqMem {
            buf: AlignedBuf::new((cnt * size) as usize),
            dbrec: AlignedBuf::new(64),
            uar: AlignedBuf::new(4096),
        });
        // SAFETY: fresh buffer of cnt × size bytes, no other users yet.
        unsafe { crate::provider::mlx5::CompletionQueue::init_buffer(mem.buf.ptr(), cnt, size) };
        let idx = match e.cqs.iter().position(|c| c.is_none()) {
            Some(i) => i,
            None => {
                e.cqs.push(None);
                e.cqs.len() - 1
            }
        };
        let cqn = CQN_BASE + idx as u32;
        let event = Arc::new(crate::event::EventFd::new()?);
        e.cqs[idx] = Some(Cq {
            mem: Arc::clone(&mem),
            cnt,
            size,
            pi: 0,
            overrun: false,
            users: 0,
            event,
            armed_ci: None,
            armed_solicited: false,
            last_solicited: None,
        });
        let dv = Mlx5dvCq {
            buf: mem.buf.ptr(),
            dbrec: mem.dbrec.ptr().cast(),
            cqe_cnt: cnt,
            cqe_size: size,
            cq_uar: mem.uar.ptr(),
            cqn,
            comp_mask: 0,
        };
        Ok(SoftCq { dv, cqn, mem })
    }

    /// Destroys a CQ (no QP may use it).
    pub fn destroy_cq(&self, cqn: u32) -> Result<()> {
        let mut e = self.engine();
        let Some(cq) = e.cq_mut(cqn) else {
            return Err(Error::NoSuchObject);
        };
        if cq.users != 0 {
            return Err(Error::ResourceBusy);
        }
        e.cqs[(cqn - CQN_BASE) as usize] = None;
        Ok(())
    }

    /// The fd that becomes readable when an armed CQ gets a completion.
    pub fn cq_event_fd(&self, cqn: u32) -> Result<i32> {
        let mut e = self.engine();
        let cq = e.cq_mut(cqn).ok_or(Error::NoSuchObject)?;
        Ok(cq.event.fd())
    }

    /// Takes the CQ's pending events (non-blocking); returns how many.
    pub fn cq_event_consume(&self, cqn: u32) -> Result<u32> {
        let ev = {
            let mut e = self.engine();
            Arc::clone(&e.cq_mut(cqn).ok_or(Error::NoSuchObject)?.event)
        };
        Ok(ev.drain().min(u64::from(u32::MAX)) as u32)
    }

    /// True if the CQ overran (the device dropped a completion).
    pub fn cq_overrun(&self, cqn: u32) -> bool {
        self.engine().cq_mut(cqn).is_some_and(|c| c.overrun)
    }

    /// Creates an RC QP in RESET, sized like rdma-core sizes mlx5 QPs
    /// (reference §A.2, §A.6).
    pub fn create_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<SoftQp> {
        if init.max_send_wr == 0
            || init.max_send_sge > 30
            || init.max_recv_sge > 64
            || init.max_inline_data > 512
            || init.max_send_wr > MAX_QUEUE
            || init.max_recv_wr > MAX_QUEUE
        {
            return Err(Error::InvalidAttribute);
        }
        let wqe = max_wqe_bytes(init);
        let (sq_cnt, rq_cnt_sized) = queue_sizes(init);
        if sq_cnt > MAX_QUEUE {
            return Err(Error::InvalidAttribute);
        }
        let caps = QpCaps {
            max_send_sge: (wqe - 32) / 16,
            max_inline_data: wqe - 32 - 4,
            max_recv_sge: init.max_recv_sge.max(1),
        };
        let rq_stride = pow2(16 * caps.max_recv_sge).max(16);
        let rq_cnt = rq_cnt_sized;
        let caps = QpCaps {
            max_recv_sge: rq_stride / 16,
            ..caps
        };
        let rq_bytes = ((rq_cnt * rq_stride) as usize).next_multiple_of(64);
        let mem = Arc::new(QpMem {
            buf: AlignedBuf::new(rq_bytes + sq_cnt as usize * 64),
            dbrec: AlignedBuf::new(64),
            bf: AlignedBuf::new(512),
            rq_bytes,
        });
        let mut e = self.engine();
        if !e
            .pds
            .get((pd as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
        {
            return Err(Error::NoSuchObject);
        }
        if e.cq_mut(send_cq).is_none() || e.cq_mut(recv_cq).is_none() {
            return Err(Error::NoSuchObject);
        }
        e.cq_mut(send_cq).expect("checked").users += 1;
        e.cq_mut(recv_cq).expect("checked").users += 1;
        let idx = match e.qps.iter().position(|q| q.is_none()) {
            Some(i) => i,
            None => {
                e.qps.push(None);
                e.qps.len() - 1
            }
        };
        let qpn = QPN_BASE + idx as u32;
        // SAFETY: offsets inside the QP buffer just allocated.
        let sq = unsafe { mem.buf.ptr().add(rq_bytes) };
        e.qps[idx] = Some(Qp {
            qpn,
            pd,
            state: QpState::Reset,
            mem: Arc::clone(&mem),
            sq,
            sq_cnt,
            sq_ci: 0,
            rq: mem.buf.ptr(),
            rq_cnt,
            rq_stride,
            rq_ci: 0,
            dbrec: mem.dbrec.ptr().cast(),
            send_cq,
            recv_cq,
            dest: 0,
            access: Access::NONE,
            rnr_retry: 7,
            rnr_attempts: 0,
            rnr_wait: None,
            rnr_step: 0,
            hold: None,
        });
        let dv = Mlx5dvQp {
            dbrec: mem.dbrec.ptr().cast(),
            sq_buf: sq,
            sq_wqe_cnt: sq_cnt,
            sq_stride: 64,
            rq_buf: mem.buf.ptr(),
            rq_wqe_cnt: rq_cnt,
            rq_stride,
            bf_reg: mem.bf.ptr(),
            bf_size: 256,
            comp_mask: 0,
            uar_mmap_offset: 0,
            tirn: 0,
            tisn: 0,
            rqn: 0,
            sqn: 0,
            tir_icm_addr: 0,
        };
        Ok(SoftQp { dv, qpn, caps, mem })
    }

    /// Changes a QP's state. Valid transitions: RESET→INIT→RTR→RTS, any
    /// state → ERROR, any state → RESET (which zeroes the device counters
    /// and both doorbell-record words, like libmlx5, §A.7).
    pub fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()> {
        let mut e = self.engine();
        let Some(i) = e.qp_index(qpn) else {
            return Err(Error::NoSuchObject);
        };
        let q = e.qps[i].as_mut().expect("checked");
        match (q.state, m.state) {
            (_, QpState::Reset) => {
                q.sq_ci = 0;
                q.rq_ci = 0;
                q.rnr_attempts = 0;
                q.rnr_wait = None;
                q.hold = None;
                // SAFETY: both words of the QP's doorbell record.
                unsafe {
                    mmio::write_dbrec(q.dbrec, 0);
                    mmio::write_dbrec(q.dbrec.add(1), 0);
                }
            }
            (QpState::Reset, QpState::Init) | (QpState::Init, QpState::Init) => {
                if m.access.0 & !Access::ALL.0 != 0 {
                    return Err(Error::InvalidAttribute);
                }
                q.access = m.access;
            }
            (QpState::Init, QpState::Rtr) => q.dest = m.dest_qpn,
            (QpState::Rtr, QpState::Rts) => {
                if m.rnr_retry > 7 || m.retry_cnt > 7 {
                    return Err(Error::InvalidAttribute);
                }
                if m.rate_limit_kbps != 0 {
                    // No packet pacing here.
                    return Err(Error::Unsupported);
                }
                q.rnr_retry = m.rnr_retry;
            }
            (_, QpState::Error) => {}
            _ => return Err(Error::InvalidQpState),
        }
        q.state = m.state;
        Ok(())
    }

    /// Current device-side state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Result<QpState> {
        let e = self.engine();
        let i = e.qp_index(qpn).ok_or(Error::NoSuchObject)?;
        Ok(e.qps[i].as_ref().expect("checked").state)
    }

    /// Destroys a QP. The device stops touching its queues at once.
    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        let mut e = self.engine();
        let Some(i) = e.qp_index(qpn) else {
            return Err(Error::NoSuchObject);
        };
        let q = e.qps[i].take().expect("checked");
        for cqn in [q.send_cq, q.recv_cq] {
            if let Some(c) = e.cq_mut(cqn) {
                c.users -= 1;
            }
        }
        drop(q.mem);
        Ok(())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl QpMem {
    /// Bytes of the RQ ring (the SQ follows it).
    pub fn rq_bytes(&self) -> usize {
        self.rq_bytes
    }
}

impl CqMem {
    /// The CQ's UAR page (arm register at +0x20).
    pub fn uar(&self) -> *mut u8 {
        self.uar.ptr()
    }
}
