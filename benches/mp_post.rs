//! Multi-producer posting into one QP: the lock-free [`SharedQp`] against
//! a spinlock-per-post baseline, with 1, 2 and 4 producer threads, on the
//! software HCA. Results and the command line are in `docs/benchmarks.md`
//! ("Multi-producer posting: lock-free vs spinlock");
//! `scripts/mp_bench.sh` builds and runs it.
//!
//! **Work request.** An RDMA WRITE of 8 bytes (one SGE, from a registered
//! source that never changes) into the peer QP's registered target, each
//! producer to its own 8 bytes. Each producer signals its own WRs 15, 31,
//! 47, ... (1 in [`SIGNAL_EVERY`]), so the CQ sees one CQE per 16 WRs
//! whatever the producer count. An unsignaled WR only retires when a
//! later signaled one (of any producer) completes, so the poller keeps
//! the ring moving for everybody.
//!
//! **The two variants** (same rig, same producer and poller loops):
//!
//! * **spinlock**: one single-owner [`Qp`] behind a test-and-test-and-set
//!   spinlock written here ([`SpinQp`]: an `AtomicBool`, spinning with
//!   [`spin_loop`] on plain loads while it is held). Every post is lock,
//!   [`Qp::post_send_one`], unlock. The poller needs the same `Qp` to
//!   retire send-queue space, so every poll is lock, [`Cq::poll`],
//!   unlock. rdma-core's libmlx5 likewise takes a spinlock per post (the
//!   SQ lock) and per poll (the CQ lock); here one lock plays both roles,
//!   because the single-owner `Qp` holds both the posting and the
//!   retiring side.
//! * **lock-free**: [`Qp::into_shared`]; every producer calls
//!   [`SharedQp::post_send_one`] on a shared `Arc`, and the poller polls
//!   with [`Cq::poll_shared`] through the [`SharedQpPoller`].
//!
//! **Lists** (`--list N`, default 1): every post call carries N WRs. The
//! spinlock variant then takes its lock once per list ([`Qp::post_send`]:
//! one doorbell per list); the lock-free variant calls
//! [`SharedQp::post_send`], which claims the whole list with one
//! reservation, writes it in parallel with the other producers and makes
//! one doorbell request. Each WR's id and signaling are set exactly as in
//! single posts, so 1 WR in 16 per producer is still signaled.
//!
//! **The three device modes**:
//!
//! * **thread**: the device thread runs ([`SoftDevice::start`]). Threads:
//!   the producers, one poller, the device.
//! * **step**: no device thread; the poller thread calls
//!   [`SoftDevice::step`] (one pass over every queue, at most 64 WQEs per
//!   QP) before every poll, so the device's work per pass is
//!   deterministic; the producers run concurrently. Threads: the
//!   producers and one poller/driver.
//! * **fill** (posting in isolation): the device is idle while the
//!   producers post. In each cycle the producers start together (spinning
//!   on a shared generation word) and post `--fill-depth / 2` WRs between
//!   them into an empty send queue of `--fill-depth` WRs, so no post is
//!   ever refused and nothing retires while they post. Then the driver
//!   (the main thread) steps the device and polls until every WR of the
//!   cycle has completed, which is not timed. Retirement by the poller
//!   cannot be faked on the software HCA, so this is how posting is
//!   measured without the device's rate in it.
//!
//! **What is measured**:
//!
//! * **WRs/s**: thread and step modes: WRs posted by all producers in the
//!   measured window (`--seconds`, after `--warmup`), divided by its
//!   wall-clock length. The send queue is bounded (`--depth`), so this is
//!   also bounded by how fast the device executes and the poller retires.
//!   Fill mode: WRs posted in the measured cycles divided by the sum of
//!   the cycles' posting spans (first producer's start to last producer's
//!   end).
//! * **post calls/s per producer**: each producer times its bursts of up
//!   to [`BURST`] back-to-back post calls (stopping at the first refused
//!   one) with two clock reads per burst, and divides the WRs it posted
//!   by the time it spent inside those bursts (in fill mode a cycle is
//!   one burst). Time spent waiting for queue space between bursts is
//!   excluded; lock waits, CAS retries, cache-line transfers and
//!   preemption inside a burst are included.
//! * **refused/1k**: post calls refused with `SqFull` per 1000 posted WRs
//!   (a refusal ends a burst; the producer backs off: a short spin, then
//!   `yield_now`, the same in both variants). Always 0 in fill mode.
//!
//! The 18 cases (3 device modes × 3 producer counts × 2 variants) are run
//! `--reps` times, interleaved; within a rep the two variants of a case
//! run back to back (alternating which goes first), and their ratio is
//! that rep's lock-free/spinlock ratio. The table shows medians.
//!
//! **Context columns.** "producers posting at once" is the producers'
//! total in-burst time divided by the measured time: up to the producer
//! count when they really post concurrently, about 1 when they take
//! turns. Before the first rep and after every rep a probe times a busy
//! loop on one thread and then on two at once, and the header reports how
//! many CPUs two busy threads actually got (2.00 = two free cores). On a
//! shared machine read both before reading anything into a ratio.
//!
//! Every run checks its completions: each producer's signaled WRs must
//! complete exactly once, successfully, in its posting order, and its
//! final (signaled) WR must come after all of them; the target must hold
//! the source bytes at the end.
//!
//! Usage: `mp_post [--seconds S] [--warmup S] [--reps N] [--depth WRS]
//! [--fill-depth WRS] [--modes step,thread,fill] [--producers 1,2,4]
//! [--list N]`
//! (defaults 0.4, 0.1, 5, 1024, 16384, all modes, 1,2,4, 1; about 50 s
//! in all). The fill depth is at most 16384: the CQ is sized for every WR
//! the send queue holds, and the software HCA's queues stop below 32768. `--bench` (from `cargo bench`) is ignored.

use std::cell::UnsafeCell;
use std::hint::spin_loop;
use std::ops::{Deref, DerefMut};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, ConnectAttr, Cq, Device, Mr, Pd, Qp, QpInit, SharedQp, SharedQpPoller, Wc, WcStatus,
};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, PostError, Remote, SendFlags, SendOp, SendWr, Sge};

type Dev = SoftDevice;

/// Message size in bytes.
const MSG: u32 = 8;
/// Each producer signals one WR in this many of its own.
const SIGNAL_EVERY: u64 = 16;
/// Most post calls a producer makes between two clock reads.
const BURST: u64 = 16;
/// Producer counts measured by default.
const PRODUCERS: [usize; 3] = [1, 2, 4];
/// wr_id layout: producer in bits 48..56, index in bits 0..48, and
/// [`FINAL`] on the last WR of a run (or of a fill cycle).
const ID_SHIFT: u32 = 48;
const INDEX_MASK: u64 = (1 << ID_SHIFT) - 1;
const FINAL: u64 = 1 << 63;
/// Refused posts in a row a producer spins through before yielding.
const FULL_SPINS: u32 = 8;
/// Idle polls (or waits) spun through before yielding.
const IDLE_SPINS: u32 = 64;
/// Give up if nothing moves for this long.
const STALL: Duration = Duration::from_secs(20);

/// Run phases, in order ([`AtomicU8::fetch_max`] only moves forward).
const WARM: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;
const ABORT: u8 = 3;

/// Fill mode: the generation word's value that ends the producers.
const END: u64 = u64::MAX;

// ---------------------------------------------------------------------
// The baseline: a spinlock around a single-owner Qp.
// ---------------------------------------------------------------------

/// A [`Qp`] behind a test-and-test-and-set spinlock: lock, post or poll,
/// unlock.
struct SpinQp {
    locked: AtomicBool,
    qp: UnsafeCell<Qp<Dev>>,
}

// SAFETY: the `Qp` is only reached through a `SpinGuard`, and a guard
// exists only while its thread holds `locked` (acquired with Acquire,
// released with Release), so at most one thread touches the `Qp` at a
// time and each sees the previous holder's writes. `Qp` is `Send`, so
// handing it from thread to thread this way is allowed.
unsafe impl Sync for SpinQp {}

impl SpinQp {
    fn new(qp: Qp<Dev>) -> SpinQp {
        SpinQp {
            locked: AtomicBool::new(false),
            qp: UnsafeCell::new(qp),
        }
    }

    /// Spins until the lock is ours.
    #[inline]
    fn lock(&self) -> SpinGuard<'_> {
        loop {
            // Test (a plain load, so waiters share the line instead of
            // bouncing it), then test-and-set.
            if !self.locked.load(Ordering::Relaxed)
                && self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return SpinGuard { lock: self };
            }
            spin_loop();
        }
    }
}

/// Holds a [`SpinQp`]'s lock; unlocks on drop.
struct SpinGuard<'a> {
    lock: &'a SpinQp,
}

impl Deref for SpinGuard<'_> {
    type Target = Qp<Dev>;
    fn deref(&self) -> &Qp<Dev> {
        // SAFETY: this guard holds the lock (see `unsafe impl Sync`).
        unsafe { &*self.lock.qp.get() }
    }
}

impl DerefMut for SpinGuard<'_> {
    fn deref_mut(&mut self) -> &mut Qp<Dev> {
        // SAFETY: this guard holds the lock, and `&mut self` makes this
        // the only reference derived from it.
        unsafe { &mut *self.lock.qp.get() }
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: our accesses to the Qp happen before the next holder's.
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// What a producer posts through.
trait Poster: Send + Sync {
    /// One WR per call.
    fn post(&self, wr: &SendWr<'_>) -> Result<(), Error>;
    /// A list per call (`--list N`, N > 1).
    fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;
}

impl Poster for SpinQp {
    #[inline]
    fn post(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        self.lock().post_send_one(wr)
    }
    /// One lock per list: the baseline batches exactly as the lock-free
    /// queue does (one doorbell per list).
    #[inline]
    fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.lock().post_send(wrs)
    }
}

impl Poster for SharedQp<Dev> {
    #[inline]
    fn post(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        self.post_send_one(wr)
    }
    #[inline]
    fn post_list(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.post_send(wrs)
    }
}

/// Posts `wrs` (one call: `post` for a single WR, `post_list` otherwise);
/// returns how many WRs were posted and the error that stopped it.
#[inline(always)]
fn post_some<P: Poster + ?Sized>(qp: &P, wrs: &[SendWr<'_>]) -> (usize, Option<Error>) {
    if wrs.len() == 1 {
        match qp.post(&wrs[0]) {
            Ok(()) => (1, None),
            Err(e) => (0, Some(e)),
        }
    } else {
        match qp.post_list(wrs) {
            Ok(()) => (wrs.len(), None),
            Err(e) => (e.index, Some(e.error)),
        }
    }
}

// ---------------------------------------------------------------------
// The rig.
// ---------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Step,
    Thread,
    Fill,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Step => "step",
            Mode::Thread => "thread",
            Mode::Fill => "fill",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Spin,
    LockFree,
}

/// The sending QP `a` (not yet wrapped), its CQ, the peer and buffers.
struct Rig {
    dev: Device<Dev>,
    a: Qp<Dev>,
    cq: Cq<Dev>,
    /// The peer; RDMA WRITEs need no receives, so it is never polled.
    _b: Qp<Dev>,
    _peer_cq: Cq<Dev>,
    src: Mr<Dev>,
    dst: Mr<Dev>,
    _pd: Pd<Dev>,
}

fn rig(depth: u32, producers: usize) -> Result<Rig, String> {
    let e = |what: &'static str| move |err: Error| format!("{what}: {err}");
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let init = |send: u32| QpInit {
        max_send_wr: send,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // Sized by the CQ guard's worst case (every WR the queues hold).
    let cq = dev
        .create_cq(dev.cq_depth_for(&[&init(depth)]))
        .map_err(e("create_cq"))?;
    let peer_cq = dev
        .create_cq(dev.cq_depth_for(&[&init(16)]))
        .map_err(e("create_cq"))?;
    let mut a = pd
        .create_qp(&cq, &cq, &init(depth))
        .map_err(e("create_qp"))?;
    let mut b = pd
        .create_qp(&peer_cq, &peer_cq, &init(16))
        .map_err(e("create_qp"))?;
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &ConnectAttr::default())
        .map_err(e("connect"))?;
    b.connect(
        &ia,
        &ConnectAttr {
            access: Access::REMOTE_WRITE,
            ..Default::default()
        },
    )
    .map_err(e("connect"))?;
    let len = MSG as usize * producers;
    let mut src = pd.register(len, Access::NONE).map_err(e("register"))?;
    for (p, chunk) in src.as_mut_slice().chunks_mut(MSG as usize).enumerate() {
        chunk.copy_from_slice(&(0x5eed_0000_0000_0000u64 | p as u64).to_le_bytes());
    }
    let dst = pd
        .register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e("register"))?;
    Ok(Rig {
        dev,
        a,
        cq,
        _b: b,
        _peer_cq: peer_cq,
        src,
        dst,
        _pd: pd,
    })
}

// ---------------------------------------------------------------------
// Producers, the completion checker and the poller.
// ---------------------------------------------------------------------

/// One producer's counts for the measured window (or cycles).
#[derive(Clone, Debug, Default)]
struct ProdStats {
    /// WRs posted.
    posts: u64,
    /// Time inside post bursts.
    post_secs: f64,
    /// Post calls refused with SqFull.
    refused: u64,
    /// Fill mode: (start, end) of each measured cycle's posting.
    spans: Vec<(Instant, Instant)>,
}

/// A producer's WR, with its id and signaling set for index `i`.
#[inline(always)]
fn set_id(wr: &mut SendWr<'_>, p: u64, i: u64, last: bool) {
    wr.wr_id = p << ID_SHIFT | i | if last { FINAL } else { 0 };
    wr.flags = if last || i % SIGNAL_EVERY == SIGNAL_EVERY - 1 {
        SendFlags::SIGNALED
    } else {
        SendFlags::NONE
    };
}

/// Thread and step modes: posts WRITEs in bursts until the phase reaches
/// STOP, then one final signaled WR.
#[allow(clippy::too_many_arguments)]
fn produce<P: Poster + ?Sized>(
    qp: &P,
    p: u64,
    sge: Sge,
    remote: Remote,
    list: usize,
    phase: &AtomicU8,
    start: &Barrier,
) -> Result<ProdStats, String> {
    let sges = [sge];
    let mut wr = SendWr::new(0, SendOp::Write { remote }, &sges, SendFlags::NONE);
    let mut wrs = vec![wr; list];
    let mut st = ProdStats::default();
    let mut i: u64 = 0;
    let mut fulls = 0u32;
    let mut last_progress = Instant::now();
    start.wait();
    loop {
        let ph = phase.load(Ordering::Relaxed);
        if ph >= STOP {
            break;
        }
        let t0 = Instant::now();
        let mut k = 0;
        let mut full = false;
        // A burst is BURST post calls (of `list` WRs each).
        for _ in 0..BURST {
            for (j, w) in wrs.iter_mut().enumerate() {
                set_id(w, p, i + j as u64, false);
            }
            let (n, err) = post_some(qp, &wrs);
            i += n as u64;
            k += n as u64;
            match err {
                None => {}
                Some(Error::SqFull) => {
                    full = true;
                    break;
                }
                Some(e) => return Err(format!("producer {p}: post: {e}")),
            }
        }
        let dt = t0.elapsed();
        if ph == MEASURE {
            st.posts += k;
            st.post_secs += dt.as_secs_f64();
            st.refused += full as u64;
        }
        if k > 0 {
            fulls = 0;
            last_progress = Instant::now();
        }
        if full {
            back_off(&mut fulls, last_progress, p)?;
        }
    }
    if phase.load(Ordering::Relaxed) == ABORT {
        return Err(format!("producer {p}: aborted"));
    }
    set_id(&mut wr, p, i, true);
    let mut fulls = 0u32;
    let since = Instant::now();
    loop {
        match qp.post(&wr) {
            Ok(()) => return Ok(st),
            Err(Error::SqFull) => back_off(&mut fulls, since, p)?,
            Err(e) => return Err(format!("producer {p}: final post: {e}")),
        }
        if phase.load(Ordering::Relaxed) == ABORT {
            return Err(format!("producer {p}: aborted"));
        }
    }
}

/// After a refused post: spin briefly, then yield (a device or poller
/// thread may need this core).
fn back_off(fulls: &mut u32, since: Instant, p: u64) -> Result<(), String> {
    *fulls += 1;
    if *fulls < FULL_SPINS {
        for _ in 0..32 {
            spin_loop();
        }
    } else {
        thread::yield_now();
        if *fulls % 1024 == 0 && since.elapsed() > STALL {
            return Err(format!("producer {p}: queue full for {STALL:?}"));
        }
    }
    Ok(())
}

/// Fill mode: per cycle, waits for the next generation and for all
/// `producers` to arrive, posts `per_cycle` WRs as fast as it can (the
/// last one signaled and marked FINAL), and reports done. Cycles below
/// `measure_from` are warm-up.
#[allow(clippy::too_many_arguments)]
fn produce_fill<P: Poster + ?Sized>(
    qp: &P,
    p: u64,
    sge: Sge,
    remote: Remote,
    list: usize,
    per_cycle: u64,
    producers: usize,
    generation: &AtomicU64,
    measure_from: &AtomicU64,
    arrived: &AtomicUsize,
    done: &AtomicUsize,
) -> Result<ProdStats, String> {
    let sges = [sge];
    let wr = SendWr::new(0, SendOp::Write { remote }, &sges, SendFlags::NONE);
    let mut wrs = vec![wr; list];
    let mut st = ProdStats::default();
    let mut i: u64 = 0;
    let mut seen = 0;
    loop {
        // Acquire pairs with the driver's Release store: its drain of the
        // previous cycle is complete.
        let g = wait_change(generation, seen, || Ok(()))?;
        if g == END {
            return Ok(st);
        }
        seen = g;
        // Start together: every producer of the cycle is on a CPU and
        // spinning here before any of them posts.
        arrived.fetch_add(1, Ordering::AcqRel);
        let mut n = 0u32;
        let since = Instant::now();
        while arrived.load(Ordering::Acquire) < producers {
            n = n.wrapping_add(1);
            if n < IDLE_SPINS {
                spin_loop();
            } else {
                thread::yield_now();
                if n % 4096 == 0 && since.elapsed() > STALL {
                    done.fetch_add(1, Ordering::Release);
                    return Err(format!("producer {p}: the others did not arrive"));
                }
            }
        }
        let t0 = Instant::now();
        let mut k = 0;
        while k < per_cycle {
            let m = (per_cycle - k).min(list as u64) as usize;
            for (j, w) in wrs[..m].iter_mut().enumerate() {
                let kj = k + j as u64;
                set_id(w, p, i + j as u64, kj == per_cycle - 1);
            }
            if let (_, Some(e)) = post_some(qp, &wrs[..m]) {
                // SqFull included: the queue holds every cycle's WRs.
                done.fetch_add(1, Ordering::Release);
                return Err(format!("producer {p}: fill post: {e}"));
            }
            i += m as u64;
            k += m as u64;
        }
        let t1 = Instant::now();
        if g >= measure_from.load(Ordering::Relaxed) {
            st.posts += per_cycle;
            st.post_secs += (t1 - t0).as_secs_f64();
            st.spans.push((t0, t1));
        }
        // Release: our posts happen before the driver's drain.
        done.fetch_add(1, Ordering::Release);
    }
}

/// Spins (then yields) until `word` differs from `old`; returns the new
/// value. `check` runs while waiting and may abort.
fn wait_change(
    word: &AtomicU64,
    old: u64,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<u64, String> {
    let mut n = 0u32;
    let since = Instant::now();
    loop {
        let v = word.load(Ordering::Acquire);
        if v != old {
            return Ok(v);
        }
        n = n.wrapping_add(1);
        if n < IDLE_SPINS {
            spin_loop();
        } else {
            thread::yield_now();
            check()?;
            if n % 4096 == 0 && since.elapsed() > STALL {
                return Err(format!("waited {STALL:?} for the other threads"));
            }
        }
    }
}

/// Checks completions as they arrive: per producer, every signaled WR
/// exactly once, successfully and in posting order, and each FINAL WR only
/// after all signaled WRs before it.
struct Checker {
    next: Vec<u64>,
    done: Vec<bool>,
    finals: usize,
    completions: u64,
}

impl Checker {
    fn new(producers: usize) -> Checker {
        Checker {
            next: vec![SIGNAL_EVERY - 1; producers],
            done: vec![false; producers],
            finals: 0,
            completions: 0,
        }
    }

    /// Starts a new fill cycle (every producer finished the last one).
    fn new_cycle(&mut self) {
        self.done.iter_mut().for_each(|d| *d = false);
        self.finals = 0;
    }

    fn all_final(&self) -> bool {
        self.finals == self.done.len()
    }

    fn take(&mut self, wc: &[Wc]) -> Result<(), String> {
        for w in wc {
            if w.status != WcStatus::SUCCESS {
                return Err(format!(
                    "wr_id {:#x} failed: {:?}, syndrome {:#x}",
                    w.wr_id, w.status, w.vendor_err
                ));
            }
            let p = ((w.wr_id & !FINAL) >> ID_SHIFT) as usize;
            let i = w.wr_id & INDEX_MASK;
            if p >= self.done.len() || self.done[p] {
                return Err(format!("unexpected completion {:#x}", w.wr_id));
            }
            let next = &mut self.next[p];
            if w.wr_id & FINAL != 0 {
                // Every signaled WR of p before this one has completed.
                if !(i <= *next && *next < i + SIGNAL_EVERY) {
                    return Err(format!(
                        "producer {p}: final WR {i} completed before WR {next}"
                    ));
                }
                if *next == i {
                    *next += SIGNAL_EVERY;
                }
                self.done[p] = true;
                self.finals += 1;
            } else if i != *next {
                return Err(format!("producer {p}: WR {i} completed, expected {next}"));
            } else {
                *next += SIGNAL_EVERY;
            }
        }
        self.completions += wc.len() as u64;
        Ok(())
    }
}

/// Thread and step modes: polls (in step mode: one device pass, then a
/// poll) until every producer's final WR has completed.
fn poll_loop(
    mut poll: impl FnMut(&mut [Wc]) -> Result<usize, Error>,
    step: Option<&SoftDevice>,
    producers: usize,
    phase: &AtomicU8,
    start: &Barrier,
) -> Result<u64, String> {
    let mut wc = [Wc::default(); 64];
    let mut check = Checker::new(producers);
    let mut idle = 0u32;
    let mut last_progress = Instant::now();
    start.wait();
    while !check.all_final() {
        let work = step.map_or(0, |d| d.step());
        let n = poll(&mut wc).map_err(|e| format!("poll: {e}"))?;
        check.take(&wc[..n])?;
        if n > 0 || work > 0 {
            idle = 0;
            last_progress = Instant::now();
        } else {
            idle += 1;
            if idle < IDLE_SPINS {
                spin_loop();
            } else {
                thread::yield_now();
                if phase.load(Ordering::Relaxed) == ABORT {
                    return Err("poller: aborted".into());
                }
                if idle % 4096 == 0 && last_progress.elapsed() > STALL {
                    return Err(format!(
                        "poller: no completion for {STALL:?} ({} of {producers} finished)",
                        check.finals
                    ));
                }
            }
        }
    }
    Ok(check.completions)
}

/// Fill mode: drives cycles from the calling thread until `seconds` of
/// measured cycles have passed (after `warmup` seconds of warm-up cycles),
/// draining the queue after each.
#[allow(clippy::too_many_arguments)]
fn fill_driver(
    mut poll: impl FnMut(&mut [Wc]) -> Result<usize, Error>,
    dev: &SoftDevice,
    producers: usize,
    generation: &AtomicU64,
    measure_from: &AtomicU64,
    arrived: &AtomicUsize,
    done: &AtomicUsize,
    warmup: f64,
    seconds: f64,
) -> Result<(), String> {
    let mut wc = [Wc::default(); 64];
    let mut check = Checker::new(producers);
    let t_start = Instant::now();
    let mut t_measure: Option<Instant> = None;
    let mut g = 0u64;
    loop {
        let now = Instant::now();
        match t_measure {
            None if (now - t_start).as_secs_f64() >= warmup => {
                t_measure = Some(now);
                measure_from.store(g + 1, Ordering::Relaxed);
            }
            Some(t) if (now - t).as_secs_f64() >= seconds => break,
            _ => {}
        }
        done.store(0, Ordering::Relaxed);
        arrived.store(0, Ordering::Relaxed);
        g += 1;
        // Release: the drain below (and `done`, `arrived`,
        // `measure_from`) happen before the producers start the cycle.
        generation.store(g, Ordering::Release);
        let since = Instant::now();
        // Sleep rather than spin, so that the producers have the CPUs to
        // themselves while they post. Acquire pairs with the producers'
        // Release increments.
        while done.load(Ordering::Acquire) < producers {
            thread::sleep(Duration::from_micros(50));
            if since.elapsed() > STALL {
                return Err("fill: producers did not finish a cycle".into());
            }
        }
        check.new_cycle();
        let since = Instant::now();
        while !check.all_final() {
            dev.step();
            let k = poll(&mut wc).map_err(|e| format!("poll: {e}"))?;
            check.take(&wc[..k])?;
            if k == 0 && since.elapsed() > STALL {
                return Err("fill: the drain did not finish".into());
            }
        }
    }
    generation.store(END, Ordering::Release);
    Ok(())
}

// ---------------------------------------------------------------------
// One run.
// ---------------------------------------------------------------------

/// One run of one case.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// WRs/s, all producers.
    rate: f64,
    /// Post calls/s inside bursts, per producer (total posts / total
    /// in-burst time).
    call_rate: f64,
    /// Refused post calls per 1000 posted WRs.
    refused_per_k: f64,
    /// Producers inside a post burst at once, on average (in-burst time
    /// of all producers / window).
    overlap: f64,
}

struct Opts {
    seconds: f64,
    warmup: f64,
    reps: usize,
    depth: u32,
    fill_depth: u32,
    modes: Vec<Mode>,
    producers: Vec<usize>,
    /// WRs per post call.
    list: usize,
}

type Handles<'s> = Vec<thread::ScopedJoinHandle<'s, Result<ProdStats, String>>>;

/// Shared state of a run's threads.
struct Ctl {
    /// WRs per post call.
    list: usize,
    phase: AtomicU8,
    start: Barrier,
    generation: AtomicU64,
    measure_from: AtomicU64,
    arrived: AtomicUsize,
    done: AtomicUsize,
}

/// Starts one producer thread per (SGE, remote) pair, posting through `qp`.
fn spawn_producers<'s, 'e, P: Poster + 'static>(
    s: &'s thread::Scope<'s, 'e>,
    mode: Mode,
    qp: &Arc<P>,
    sges: &'e [Sge],
    remotes: &'e [Remote],
    per_cycle: u64,
    ctl: &'e Ctl,
) -> Handles<'s> {
    (0..sges.len())
        .map(|p| {
            let qp = Arc::clone(qp);
            let (sge, remote) = (sges[p], remotes[p]);
            s.spawn(move || {
                let res = if mode == Mode::Fill {
                    produce_fill(
                        &*qp,
                        p as u64,
                        sge,
                        remote,
                        ctl.list,
                        per_cycle,
                        sges.len(),
                        &ctl.generation,
                        &ctl.measure_from,
                        &ctl.arrived,
                        &ctl.done,
                    )
                } else {
                    produce(
                        &*qp, p as u64, sge, remote, ctl.list, &ctl.phase, &ctl.start,
                    )
                };
                if res.is_err() {
                    // Let the others stop waiting.
                    ctl.phase.fetch_max(ABORT, Ordering::Relaxed);
                }
                res
            })
        })
        .collect()
}

/// Either the poller thread (thread and step modes) or the fill driver on
/// the calling thread; returns the poller thread's handle if any.
fn complete<'s, 'e>(
    s: &'s thread::Scope<'s, 'e>,
    mode: Mode,
    o: &'e Opts,
    dev: &'e SoftDevice,
    producers: usize,
    ctl: &'e Ctl,
    poll: impl FnMut(&mut [Wc]) -> Result<usize, Error> + Send + 's,
) -> Result<Option<thread::ScopedJoinHandle<'s, Result<u64, String>>>, String> {
    if mode == Mode::Fill {
        let r = fill_driver(
            poll,
            dev,
            producers,
            &ctl.generation,
            &ctl.measure_from,
            &ctl.arrived,
            &ctl.done,
            o.warmup,
            o.seconds,
        );
        if r.is_err() {
            ctl.phase.fetch_max(ABORT, Ordering::Relaxed);
            // Release the producers.
            ctl.generation.store(END, Ordering::Release);
        }
        r.map(|()| None)
    } else {
        let step = (mode == Mode::Step).then_some(dev);
        Ok(Some(s.spawn(move || {
            let r = poll_loop(poll, step, producers, &ctl.phase, &ctl.start);
            if r.is_err() {
                ctl.phase.fetch_max(ABORT, Ordering::Relaxed);
            }
            r
        })))
    }
}

fn run(o: &Opts, mode: Mode, variant: Variant, producers: usize) -> Result<Sample, String> {
    let depth = if mode == Mode::Fill {
        o.fill_depth
    } else {
        o.depth
    };
    let per_cycle = (depth as u64 / 2 / producers as u64).max(1);
    let r = rig(depth, producers)?;
    if mode == Mode::Thread {
        r.dev.backend().start();
    }
    let ctl = Ctl {
        list: o.list,
        phase: AtomicU8::new(WARM),
        start: Barrier::new(producers + 2),
        generation: AtomicU64::new(0),
        measure_from: AtomicU64::new(u64::MAX),
        arrived: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    };
    let sges: Vec<Sge> = (0..producers).map(|p| r.src.sge(p * 8, MSG)).collect();
    let remotes: Vec<Remote> = (0..producers).map(|p| r.dst.remote(p * 8)).collect();
    let dev = r.dev.backend();

    let (prod, driven, mut window) = thread::scope(|s| {
        let mut cq = r.cq;
        let (workers, poller) = match variant {
            Variant::Spin => {
                let spin = Arc::new(SpinQp::new(r.a));
                let workers = spawn_producers(s, mode, &spin, &sges, &remotes, per_cycle, &ctl);
                let poll = move |wc: &mut [Wc]| {
                    let mut g = spin.lock();
                    cq.poll(&mut *g, wc)
                };
                (workers, complete(s, mode, o, dev, producers, &ctl, poll))
            }
            Variant::LockFree => {
                let (shared, mut poller): (Arc<SharedQp<Dev>>, SharedQpPoller<Dev>) =
                    match r.a.into_shared() {
                        Ok(v) => v,
                        Err(e) => return Err(format!("into_shared: {e}")),
                    };
                let workers = spawn_producers(s, mode, &shared, &sges, &remotes, per_cycle, &ctl);
                drop(shared);
                let poll = move |wc: &mut [Wc]| cq.poll_shared(&mut poller, wc);
                (workers, complete(s, mode, o, dev, producers, &ctl, poll))
            }
        };
        let mut window = 0.0;
        if mode != Mode::Fill {
            ctl.start.wait();
            thread::sleep(Duration::from_secs_f64(o.warmup));
            ctl.phase.fetch_max(MEASURE, Ordering::Relaxed);
            let t0 = Instant::now();
            thread::sleep(Duration::from_secs_f64(o.seconds));
            ctl.phase.fetch_max(STOP, Ordering::Relaxed);
            window = t0.elapsed().as_secs_f64();
        }
        let prod: Vec<Result<ProdStats, String>> = workers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("producer panicked".into())))
            .collect();
        let driven = match poller {
            Ok(Some(h)) => h
                .join()
                .unwrap_or_else(|_| Err("poller panicked".into()))
                .map(|_| ()),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        Ok((prod, driven, window))
    })?;
    if mode == Mode::Thread {
        r.dev.backend().stop();
    }
    driven?;
    let prod: Vec<ProdStats> = prod.into_iter().collect::<Result<_, _>>()?;
    if r.dst.as_slice() != r.src.as_slice() {
        return Err("the WRITE target does not hold the source bytes".into());
    }
    let posts: u64 = prod.iter().map(|s| s.posts).sum();
    let secs: f64 = prod.iter().map(|s| s.post_secs).sum();
    let refused: u64 = prod.iter().map(|s| s.refused).sum();
    if posts == 0 {
        return Err(format!(
            "{}/{variant:?}/{producers}: nothing posted in the measured window",
            mode.name()
        ));
    }
    if mode == Mode::Fill {
        // Sum over cycles of (last end - first start).
        let cycles = prod[0].spans.len();
        if prod.iter().any(|s| s.spans.len() != cycles) {
            return Err("fill: producers measured different cycles".into());
        }
        window = (0..cycles)
            .map(|c| {
                let first = prod.iter().map(|s| s.spans[c].0).min().unwrap();
                let last = prod.iter().map(|s| s.spans[c].1).max().unwrap();
                (last - first).as_secs_f64()
            })
            .sum();
    }
    Ok(Sample {
        rate: posts as f64 / window,
        call_rate: posts as f64 / secs,
        refused_per_k: refused as f64 * 1000.0 / posts as f64,
        overlap: secs / window,
    })
}

// ---------------------------------------------------------------------
// Driver.
// ---------------------------------------------------------------------

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        seconds: 0.4,
        warmup: 0.1,
        reps: 5,
        depth: 1024,
        fill_depth: 16384,
        modes: vec![Mode::Step, Mode::Thread, Mode::Fill],
        producers: PRODUCERS.to_vec(),
        list: 1,
    };
    let usage = "usage: mp_post [--seconds S] [--warmup S] [--reps N] [--depth WRS] \
                 [--fill-depth WRS] [--modes step,thread,fill] [--producers 1,2,4] [--list N]";
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut next = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("{name}: not a positive number: {v}"))
        };
        match a.as_str() {
            "--seconds" => o.seconds = num(&a, next(&a)?)?,
            "--warmup" => o.warmup = num(&a, next(&a)?)?,
            "--reps" => o.reps = num(&a, next(&a)?)?.max(1.0) as usize,
            "--depth" => o.depth = num(&a, next(&a)?)? as u32,
            "--fill-depth" => o.fill_depth = num(&a, next(&a)?)? as u32,
            "--modes" => {
                o.modes = next(&a)?
                    .split(',')
                    .map(|m| match m {
                        "step" => Ok(Mode::Step),
                        "thread" => Ok(Mode::Thread),
                        "fill" => Ok(Mode::Fill),
                        _ => Err(format!("unknown mode {m}\n{usage}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--producers" => {
                o.producers = next(&a)?
                    .split(',')
                    .map(|n| match n.parse::<usize>() {
                        Ok(n @ 1..=255) => Ok(n),
                        _ => Err(format!("--producers: not a count from 1 to 255: {n}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--list" => match next(&a)?.parse::<usize>() {
                Ok(n @ 1..=64) => o.list = n,
                _ => return Err(format!("--list: not a count from 1 to 64\n{usage}")),
            },
            "--bench" => {}
            "--help" | "-h" => return Err(usage.into()),
            other => return Err(format!("unknown argument {other}\n{usage}")),
        }
    }
    Ok(o)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)))
}

/// Iterations of the parallelism probe's busy loop (about 20 ms).
const PROBE_ITERS: u64 = 20_000_000;

/// How many CPUs two busy threads get right now: 2 × (time for one thread
/// to run a fixed busy loop alone) / (time for two threads to run it each
/// at once). 2.0: two free cores; 1.0: they take turns on one.
fn parallelism() -> f64 {
    fn work() -> f64 {
        let t = Instant::now();
        let mut x = 1u64;
        for i in 0..PROBE_ITERS {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
        std::hint::black_box(x);
        t.elapsed().as_secs_f64()
    }
    let alone = work().min(work());
    let t = Instant::now();
    thread::scope(|s| {
        let h = s.spawn(work);
        work();
        let _ = h.join();
    });
    (2.0 * alone / t.elapsed().as_secs_f64()).clamp(0.0, 2.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mp_post: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Samples of one (mode, producers) row.
#[derive(Default)]
struct Row {
    spin: Vec<Sample>,
    lf: Vec<Sample>,
    ratio: Vec<f64>,
}

fn col(v: &[Sample], f: fn(&Sample) -> f64) -> Vec<f64> {
    v.iter().map(f).collect()
}

fn real_main() -> Result<(), String> {
    let o = parse()?;
    let np = o.producers.len();
    let mut rows: Vec<Row> = (0..o.modes.len() * np).map(|_| Row::default()).collect();
    let load_start = loadavg();
    let t_all = Instant::now();
    let mut cpus = vec![parallelism()];
    for rep in 0..o.reps {
        for (mi, &mode) in o.modes.iter().enumerate() {
            for (pi, &n) in o.producers.iter().enumerate() {
                let row = &mut rows[mi * np + pi];
                let order = if rep % 2 == 0 {
                    [Variant::Spin, Variant::LockFree]
                } else {
                    [Variant::LockFree, Variant::Spin]
                };
                let mut got = [None, None];
                for v in order {
                    let s = run(&o, mode, v, n)?;
                    eprintln!(
                        "mp_post: rep {rep} {} {n} producer(s) {v:?}: {:.3} M WRs/s, \
                         {:.2} M post calls/s per producer",
                        mode.name(),
                        s.rate / 1e6,
                        s.call_rate / 1e6
                    );
                    got[(v == Variant::LockFree) as usize] = Some(s);
                }
                let [Some(spin), Some(lf)] = got else {
                    unreachable!("both variants ran")
                };
                row.ratio.push(lf.rate / spin.rate);
                row.spin.push(spin);
                row.lf.push(lf);
            }
        }
        cpus.push(parallelism());
    }
    let total = t_all.elapsed().as_secs_f64();

    println!(
        "8-byte RDMA WRITE (1 SGE), 1 in {SIGNAL_EVERY} WRs signaled per producer; {} WR(s) \
         per post call; send queue {} WRs (fill: {}); {} interleaved reps of {} s measured after {} s warm-up per case; \
         medians, min–max in brackets; load average {} at the start, {} at the end; \
         {:.0} s in all\n",
        o.list,
        o.depth,
        o.fill_depth,
        o.reps,
        o.seconds,
        o.warmup,
        load_start,
        loadavg(),
        total
    );
    let (clo, chi) = spread(&cpus);
    println!(
        "CPUs two busy threads actually got (probe before the first and after every rep; \
         2.00 = two free cores): median {:.2} ({clo:.2}–{chi:.2})\n",
        median(&cpus)
    );
    println!(
        "| device | producers | spinlock WRs/s | lock-free WRs/s | lock-free / spinlock \
         | post calls/s per producer, spinlock | post calls/s per producer, lock-free \
         | lock-free / spinlock (calls) | refused/1k WRs, spinlock / lock-free \
         | producers posting at once, spinlock / lock-free |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let m = |x: f64| format!("{:.2} M", x / 1e6);
    let mut verdicts = Vec::new();
    for (mi, &mode) in o.modes.iter().enumerate() {
        for (pi, &n) in o.producers.iter().enumerate() {
            let row = &rows[mi * np + pi];
            let (sr, lr) = (col(&row.spin, |s| s.rate), col(&row.lf, |s| s.rate));
            let (sc, lc) = (
                col(&row.spin, |s| s.call_rate),
                col(&row.lf, |s| s.call_rate),
            );
            let call_ratio: Vec<f64> = lc.iter().zip(&sc).map(|(l, s)| l / s).collect();
            let (rlo, rhi) = spread(&row.ratio);
            let (clo, chi) = spread(&call_ratio);
            let ratio = median(&row.ratio);
            println!(
                "| {} | {n} | {} | {} | **{ratio:.2}×** ({rlo:.2}–{rhi:.2}) | {} | {} \
                 | {:.2}× ({clo:.2}–{chi:.2}) | {:.1} / {:.1} | {:.2} / {:.2} |",
                mode.name(),
                m(median(&sr)),
                m(median(&lr)),
                m(median(&sc)),
                m(median(&lc)),
                median(&call_ratio),
                median(&col(&row.spin, |s| s.refused_per_k)),
                median(&col(&row.lf, |s| s.refused_per_k)),
                median(&col(&row.spin, |s| s.overlap)),
                median(&col(&row.lf, |s| s.overlap)),
            );
            if n == 2 {
                verdicts.push(format!(
                    "{} mode, 2 producers: lock-free/spinlock = {ratio:.2}× WRs/s \
                     (goal ≥ 1.5×: {})",
                    mode.name(),
                    if ratio >= 1.5 { "met" } else { "**not met**" }
                ));
            }
        }
    }
    println!();
    for v in verdicts {
        println!("- {v}");
    }
    Ok(())
}
