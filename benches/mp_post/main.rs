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

mod poster;
mod rig;
mod run;
mod workers;

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::soft::SoftDevice;

use rig::{Mode, Variant};
use run::{run, Opts, Sample};

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
