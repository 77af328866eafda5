//! Loopback message rate of the software HCA: 8-byte RDMA WRITEs and
//! 8-byte SENDs between two RC QPs of one [`SoftDevice`], at 1 and 16 WRs
//! per doorbell, in step mode and in thread mode. Results and the
//! command lines are in `docs/benchmarks.md` ("Software HCA loopback
//! message rate"); `scripts/soft_bench.sh` adds instruction counts.
//!
//! * **Step mode** (deterministic, one thread): each round posts one
//!   doorbell's worth of WRs (1 or 16) with `post_send`, runs one device
//!   pass with [`SoftDevice::step`], then polls.
//! * **Thread mode**: the device thread runs ([`SoftDevice::start`]); one
//!   application thread posts whenever the send queue has room for a
//!   doorbell's worth and polls in between (spinning, and yielding after
//!   64 idle polls so that a device thread sharing its core can run).
//!
//! In both modes every 16th WR is signaled (the last of each 16-WR
//! doorbell), so the two batch sizes differ only in WRs per doorbell, not
//! in completions. SENDs consume receives on the peer QP, which completes
//! every one of them with a CQE; the receiver keeps 1024 posted and
//! re-posts them 64 at a time with one doorbell-record update.
//!
//! A counting global allocator reports the allocations made while the
//! measured loop runs (posting, device passes, polling; in thread mode the
//! device thread's too): it must be zero.
//!
//! Usage: `soft_rate [--msgs N] [--reps N] [--only CASE] [--machine]`,
//! CASE one of `{step,thread}-{write,send}-{1,16}`. Each case runs
//! `--msgs` messages (default 500000) after a warm-up of a tenth of that
//! (1024 to 100000), `--reps` times (default 5) with the cases
//! interleaved, and the median rate is reported (wall clock). `--machine`
//! prints one `case=... msgs=... rate=... min=... max=... allocs=...`
//! line per case instead of the Markdown table.
//!
//! `--only CASE` runs one case once and prints `case=... msgs=...
//! loop_msgs=... allocs=...`; `scripts/soft_bench.sh` runs that under
//! `valgrind --tool=callgrind --toggle-collect=soft_rate_loop` (the
//! measured loop is the `#[no_mangle]` function [`soft_rate_loop`]) and
//! divides by `loop_msgs`, which counts the warm-up too because the
//! callgrind count covers both calls of the loop. `--bench` (from
//! `cargo bench`) is ignored.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::spin_loop;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, ConnectAttr, Cq, Device, Mr, Pd, Qp, QpInit, Wc, WcOpcode, WcStatus,
};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

// ---------------------------------------------------------------------
// Allocation counting.
// ---------------------------------------------------------------------

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// counts allocations and reallocations.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------------
// The rig.
// ---------------------------------------------------------------------

type Dev = SoftDevice;

/// Message size in bytes.
const MSG: u32 = 8;
/// One WR in this many is signaled.
const SIGNAL_EVERY: u64 = 16;
/// Send-queue depth in WRs (an 8-byte 1-SGE WRITE or SEND is one BB).
const SQ_WRS: u32 = 256;
/// Receives kept posted at the SEND responder.
const RQ_WRS: u32 = 1024;
/// Receives re-posted per `post_recv`.
const REPOST: usize = 64;
/// Largest WRs per doorbell.
const MAX_BATCH: usize = 16;
/// Idle polls the application spins before it starts yielding.
const IDLE_SPINS: u32 = 64;
/// Give up if a loop makes no progress for this long.
const STALL: Duration = Duration::from_secs(20);

/// Operation measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE of 8 bytes into the peer's region.
    Write,
    /// SEND of 8 bytes into a receive posted at the peer.
    Send,
}

/// How the device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `post_send`, one `step()`, poll: single-threaded.
    Step,
    /// Device thread plus one application thread.
    Thread,
}

/// One measured combination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Case {
    mode: Mode,
    op: Op,
    batch: usize,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{}-{}-{}",
            match self.mode {
                Mode::Step => "step",
                Mode::Thread => "thread",
            },
            match self.op {
                Op::Write => "write",
                Op::Send => "send",
            },
            self.batch
        )
    }
}

const CASES: [Case; 8] = {
    const fn c(mode: Mode, op: Op, batch: usize) -> Case {
        Case { mode, op, batch }
    }
    [
        c(Mode::Step, Op::Write, 1),
        c(Mode::Step, Op::Write, 16),
        c(Mode::Step, Op::Send, 1),
        c(Mode::Step, Op::Send, 16),
        c(Mode::Thread, Op::Write, 1),
        c(Mode::Thread, Op::Write, 16),
        c(Mode::Thread, Op::Send, 1),
        c(Mode::Thread, Op::Send, 16),
    ]
};

/// Two connected QPs on one device, with their buffers.
pub struct Rig {
    dev: Device<Dev>,
    a: Qp<Dev>,
    cqa: Cq<Dev>,
    b: Qp<Dev>,
    cqb: Cq<Dev>,
    src: Mr<Dev>,
    dst: Mr<Dev>,
    rbuf: Mr<Dev>,
    /// Receives completed and not yet re-posted.
    consumed: usize,
    _pd: Pd<Dev>,
}

/// What the measured loop counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Send-side WRs completed (signaled ones retire the run before them).
    pub done: u64,
    /// Receive completions (SEND only).
    pub received: u64,
    /// Doorbells rung by the sender.
    pub doorbells: u64,
    /// Device passes (`step()` calls) in step mode.
    pub steps: u64,
}

fn rig() -> Result<Rig, String> {
    let e = |what: &'static str| move |err: rdma_direct::Error| format!("{what}: {err}");
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let init = QpInit {
        max_send_wr: SQ_WRS,
        max_recv_wr: RQ_WRS,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    // Sized by the CQ guard's worst case (every WR the queues hold).
    let depth = dev.cq_depth_for(&[&init]);
    let cqa = dev.create_cq(depth).map_err(e("create_cq"))?;
    let cqb = dev.create_cq(depth).map_err(e("create_cq"))?;
    let mut a = pd.create_qp(&cqa, &cqa, &init).map_err(e("create_qp"))?;
    let mut b = pd.create_qp(&cqb, &cqb, &init).map_err(e("create_qp"))?;
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
    let mut src = pd.register(64, Access::NONE).map_err(e("register"))?;
    src.as_mut_slice()[..MSG as usize].copy_from_slice(b"8 bytes!");
    let dst = pd
        .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e("register"))?;
    let rbuf = pd
        .register(64, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let mut r = Rig {
        dev,
        a,
        cqa,
        b,
        cqb,
        src,
        dst,
        rbuf,
        consumed: RQ_WRS as usize,
        _pd: pd,
    };
    repost(&mut r)?;
    Ok(r)
}

/// Re-posts consumed receives, [`REPOST`] per doorbell-record update.
#[inline(always)]
fn repost(r: &mut Rig) -> Result<(), String> {
    let sge = [r.rbuf.sge(0, MSG)];
    let wrs = [RecvWr {
        wr_id: 0,
        sges: &sge,
    }; REPOST];
    while r.consumed >= REPOST {
        r.b.post_recv(&wrs).map_err(|e| format!("post_recv: {e}"))?;
        r.consumed -= REPOST;
    }
    Ok(())
}

#[cold]
fn bad(w: &Wc) -> String {
    format!(
        "completion wr_id {} failed: opcode {:?}, status {:?}, syndrome {:#x}",
        w.wr_id, w.opcode, w.status, w.vendor_err
    )
}

/// The measured loop: `msgs` messages of `op`, `batch` WRs per doorbell;
/// in step mode one device pass per doorbell. Returns when every message
/// has completed at the sender (and, for SEND, at the receiver).
#[no_mangle]
#[inline(never)]
pub fn soft_rate_loop(
    r: &mut Rig,
    op: Op,
    batch: usize,
    msgs: u64,
    step: bool,
) -> Result<Tally, String> {
    let sge = [r.src.sge(0, MSG)];
    let sop = match op {
        Op::Write => SendOp::Write {
            remote: r.dst.remote(0),
        },
        Op::Send => SendOp::Send,
    };
    let mut wrs = [SendWr::new(0, sop, &sge, SendFlags::NONE); MAX_BATCH];
    let mut wc = [Wc::default(); 64];
    let mut t = Tally::default();
    let mut posted = 0u64;
    let want_recv = if op == Op::Send { msgs } else { 0 };
    let mut last_progress = Instant::now();
    let mut idle = 0u32;
    while t.done < msgs || t.received < want_recv {
        let mut progress = false;
        if posted < msgs && r.a.send_space() as usize >= batch {
            let n = (batch as u64).min(msgs - posted) as usize;
            for (i, w) in wrs[..n].iter_mut().enumerate() {
                // wr_id: messages posted once this WR is; a completion
                // for it means that many are done.
                let id = posted + i as u64 + 1;
                w.wr_id = id;
                w.flags = if id % SIGNAL_EVERY == 0 || id == msgs {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
            }
            r.a.post_send(&wrs[..n])
                .map_err(|e| format!("post_send: {e}"))?;
            posted += n as u64;
            t.doorbells += 1;
            progress = true;
        }
        if step {
            r.dev.backend().step();
            t.steps += 1;
        }
        let k = r
            .cqa
            .poll(&mut r.a, &mut wc)
            .map_err(|e| format!("poll: {e}"))?;
        for w in &wc[..k] {
            if w.status != WcStatus::SUCCESS {
                return Err(bad(w));
            }
            t.done = w.wr_id;
            progress = true;
        }
        if want_recv != 0 {
            let k = r
                .cqb
                .poll(&mut r.b, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            for w in &wc[..k] {
                if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::RECV || w.byte_len != MSG
                {
                    return Err(bad(w));
                }
            }
            if k > 0 {
                t.received += k as u64;
                r.consumed += k;
                repost(r)?;
                progress = true;
            }
        }
        if progress {
            idle = 0;
        } else {
            idle += 1;
            if idle % 4096 == 0 {
                if last_progress.elapsed() > STALL {
                    return Err(format!(
                        "stalled: {} of {msgs} done, {} received",
                        t.done, t.received
                    ));
                }
            } else if idle == 1 {
                last_progress = Instant::now();
            }
            // Spin a little, then let the device thread have the core if
            // it shares ours (2-core machines, or a loaded one).
            if idle < IDLE_SPINS {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
    Ok(t)
}

/// One run of a case.
struct Sample {
    /// Messages run through [`soft_rate_loop`] in total (warm-up
    /// included): what a callgrind count of that function covers.
    loop_msgs: u64,
    secs: f64,
    allocs: u64,
    tally: Tally,
}

fn run_case(c: Case, msgs: u64) -> Result<Sample, String> {
    let mut r = rig()?;
    // Warm-up (also brings every queue slot and page in).
    let warm = (msgs / 10).clamp(1024, 100_000);
    let step = c.mode == Mode::Step;
    if !step {
        r.dev.backend().start();
    }
    soft_rate_loop(&mut r, c.op, c.batch, warm, step)?;
    let before = ALLOCS.load(Ordering::SeqCst);
    let t0 = Instant::now();
    let tally = soft_rate_loop(&mut r, c.op, c.batch, msgs, step)?;
    let secs = t0.elapsed().as_secs_f64();
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    if !step {
        r.dev.backend().stop();
    }
    if c.op == Op::Write && r.dst.as_slice()[..MSG as usize] != r.src.as_slice()[..MSG as usize] {
        return Err("the WRITE target does not hold the source bytes".into());
    }
    if c.op == Op::Send && r.rbuf.as_slice()[..MSG as usize] != r.src.as_slice()[..MSG as usize] {
        return Err("the receive buffer does not hold the sent bytes".into());
    }
    Ok(Sample {
        loop_msgs: warm + tally.done,
        secs,
        allocs,
        tally,
    })
}

struct Opts {
    msgs: u64,
    reps: usize,
    only: Option<Case>,
    machine: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        msgs: 500_000,
        reps: 5,
        only: None,
        machine: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name}: not a positive number: {v}"))
        };
        match a.as_str() {
            "--msgs" => o.msgs = num("--msgs")?,
            "--reps" => o.reps = num("--reps")? as usize,
            "--only" => {
                let v = it.next().ok_or("--only needs a case")?;
                o.only = Some(
                    CASES
                        .into_iter()
                        .find(|c| c.name() == v)
                        .ok_or_else(|| format!("unknown case {v}"))?,
                );
            }
            "--machine" => o.machine = true,
            "--bench" => {}
            other => {
                return Err(format!(
                    "unknown argument {other}\nusage: soft_rate [--msgs N] [--reps N] \
                     [--only {{step,thread}}-{{write,send}}-{{1,16}}] [--machine]"
                ))
            }
        }
    }
    Ok(o)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soft_rate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<(), String> {
    let o = parse()?;
    if let Some(c) = o.only {
        let s = run_case(c, o.msgs)?;
        println!(
            "case={} msgs={} loop_msgs={} secs={:.6} rate={:.0} allocs={} doorbells={} steps={}",
            c.name(),
            s.tally.done,
            s.loop_msgs,
            s.secs,
            s.tally.done as f64 / s.secs,
            s.allocs,
            s.tally.doorbells,
            s.tally.steps
        );
        return if s.allocs == 0 {
            Ok(())
        } else {
            Err(format!(
                "{}: {} allocations in the loop",
                c.name(),
                s.allocs
            ))
        };
    }

    // Interleave the cases over the repetitions so that a burst of load on
    // a shared machine hits every case rather than one.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); CASES.len()];
    let mut allocs = [0u64; CASES.len()];
    for _ in 0..o.reps {
        for (i, c) in CASES.iter().enumerate() {
            let s = run_case(*c, o.msgs)?;
            rates[i].push(s.tally.done as f64 / s.secs);
            allocs[i] += s.allocs;
        }
    }
    let med: Vec<f64> = rates.iter().map(|r| median(r.clone())).collect();
    if o.machine {
        for (i, c) in CASES.iter().enumerate() {
            let (lo, hi) = rates[i]
                .iter()
                .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
            println!(
                "case={} msgs={} reps={} rate={:.0} min={:.0} max={:.0} allocs={}",
                c.name(),
                o.msgs,
                o.reps,
                med[i],
                lo,
                hi,
                allocs[i]
            );
        }
    } else {
        println!(
            "Soft HCA loopback, 8-byte messages, 1 in {SIGNAL_EVERY} WRs signaled; \
             median of {} runs; msgs/s (wall clock)\n",
            o.reps
        );
        println!("| mode | op | 1 WR/doorbell | 16 WRs/doorbell | 16/1 | allocations in loop |");
        println!("|---|---|---:|---:|---:|---:|");
        for pair in (0..CASES.len()).step_by(2) {
            let (c1, c16) = (CASES[pair], CASES[pair + 1]);
            println!(
                "| {} | {} | {:.2} M | {:.2} M | {:.2}× | {} |",
                match c1.mode {
                    Mode::Step => "step",
                    Mode::Thread => "thread",
                },
                match c1.op {
                    Op::Write => "RDMA WRITE",
                    Op::Send => "SEND",
                },
                med[pair] / 1e6,
                med[pair + 1] / 1e6,
                med[pair + 1] / med[pair],
                allocs[pair] + allocs[pair + 1]
            );
            debug_assert_eq!(c16.batch, 16);
        }
    }
    let total: u64 = allocs.iter().sum();
    if total != 0 {
        return Err(format!("{total} allocations inside measured loops"));
    }
    Ok(())
}
