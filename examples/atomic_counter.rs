//! Several threads increment one remote counter with RDMA FETCH_AND_ADD
//! on the software HCA (or, with `--device`, a kernel RDMA device), and the
//! result is checked.
//!
//! One 8-byte counter lives in a memory region registered with
//! `REMOTE_ATOMIC | LOCAL_WRITE`. Each of `--threads` application threads
//! owns an RC QP and its CQ, connected to a peer QP of its own on the same
//! [`SoftDevice`] (running its device thread); every peer QP accepts
//! remote atomics, and every thread targets the same counter. A thread
//! posts its FETCH_AND_ADDs in batches of `--batch` WRs with one doorbell
//! (only the last signaled), each returning the counter's old value into
//! its own 8-byte slot, and collects the old values once the batch has
//! completed.
//!
//! At the end the counter must equal the total number of increments, and
//! the old values returned, merged over all threads and sorted, must be
//! exactly 0, 1, ..., total - 1: every increment saw a distinct value, so
//! none was lost or applied twice. The program exits non-zero otherwise.
//!
//! Run: `cargo run --release --example atomic_counter [-- --threads N
//! --ops TOTAL --batch N]` (defaults: 4 threads, 100000 increments in
//! total, batches of 16).
//!
//! With `--device NAME` (builds with `--features verbs`) the same runs on a
//! kernel device (rxe0: QPs connected directly). A device without RDMA
//! atomics (siw0: iWARP has none) is refused up front: the program says so
//! and exits with status 2, without running anything.

use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, Wc, WcOpcode, WcStatus};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Remote, SendFlags, SendOp, SendWr, Sge};

mod common;
use common::{err, DevOpts, ExampleBackend, DEV_USAGE};

/// Exit status when the device has no RDMA atomics: nothing ran, as for a
/// bad command line.
const NO_ATOMICS: u8 = common::EXIT_USAGE;

/// Largest `--batch`.
const MAX_BATCH: usize = 64;
/// Give up if nothing completes for this long.
const STALL: Duration = Duration::from_secs(10);

struct Args {
    threads: usize,
    ops: u64,
    batch: usize,
    dev: DevOpts,
}

fn usage() -> String {
    format!("usage: atomic_counter [--threads N] [--ops TOTAL] [--batch 1..=64] {DEV_USAGE}")
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        threads: 4,
        ops: 100_000,
        batch: 16,
        dev: DevOpts::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if a.dev.take(&flag, &mut it)? {
            continue;
        }
        let mut value = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {v}"))
        };
        match flag.as_str() {
            "--threads" | "-t" => a.threads = value("--threads")? as usize,
            "--ops" | "-n" => a.ops = value("--ops")?,
            "--batch" | "-b" => a.batch = value("--batch")? as usize,
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    if a.threads == 0 || a.threads > 256 {
        return Err("--threads must be between 1 and 256".into());
    }
    if a.batch == 0 || a.batch > MAX_BATCH {
        return Err(format!("--batch must be between 1 and {MAX_BATCH}"));
    }
    if a.ops == 0 || a.ops > 1 << 27 {
        return Err("--ops must be between 1 and 2^27".into());
    }
    Ok(a)
}

/// What one thread brings back.
struct Report {
    olds: Vec<u64>,
    elapsed: Duration,
}

/// Runs `ops` FETCH_AND_ADD(+1) on the counter at `target` through `qp`,
/// `batch` WRs per doorbell; returns every old value.
fn worker<B: ExampleBackend>(
    mut qp: Qp<B>,
    mut cq: Cq<B>,
    results: Mr<B>,
    target: Remote,
    ops: u64,
    batch: usize,
    start: &Barrier,
) -> Result<Report, String> {
    // One 8-byte result slot per WR of a batch.
    let sges: Vec<[Sge; 1]> = (0..batch).map(|i| [results.sge(i * 8, 8)]).collect();
    let op = SendOp::FetchAdd {
        remote: target,
        add: 1,
    };
    let mut wrs = [SendWr::new(0, op, &sges[0], SendFlags::NONE); MAX_BATCH];
    let mut olds = Vec::with_capacity(ops as usize);
    let mut wc = [Wc::default(); 8];
    start.wait();
    let t0 = Instant::now();
    let mut done = 0u64;
    while done < ops {
        let n = (batch as u64).min(ops - done) as usize;
        for (i, (w, sge)) in wrs.iter_mut().zip(&sges).take(n).enumerate() {
            let flags = if i == n - 1 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            *w = SendWr::new(done + i as u64, op, sge, flags);
        }
        qp.post_send(&wrs[..n])
            .map_err(|e| format!("post_send: {e}"))?;
        // Wait for the batch's one completion. The device executes a QP's
        // WRs in order, so when the last one has completed every result
        // slot of the batch has been written.
        let last = done + n as u64 - 1;
        let since = Instant::now();
        let mut spins = 0u32;
        loop {
            let k = cq
                .poll(&mut qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            if k > 0 {
                let w = &wc[0];
                if k != 1 || w.wr_id != last {
                    return Err(format!("unexpected completion {w:?} (waiting for {last})"));
                }
                if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::FETCH_ADD {
                    return Err(format!(
                        "FETCH_AND_ADD {} failed: opcode {:?}, status {:?}, syndrome {:#x}",
                        w.wr_id, w.opcode, w.status, w.vendor_err
                    ));
                }
                break;
            }
            spins += 1;
            // More threads than cores share the CPU with the device thread:
            // yield early so it gets to run.
            if spins < 16 {
                std::hint::spin_loop();
            } else {
                if since.elapsed() > STALL {
                    return Err(format!("no completion for {STALL:?}"));
                }
                thread::yield_now();
            }
        }
        for i in 0..n {
            olds.push(results.load_u64(i * 8).ok_or("result slot out of range")?);
        }
        done += n as u64;
    }
    Ok(Report {
        olds,
        elapsed: t0.elapsed(),
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(common::EXIT_USAGE);
        }
    };
    match dispatch(&args) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Wrong) => ExitCode::FAILURE,
        Ok(Outcome::NoAtomics(why)) => {
            eprintln!("atomic_counter: NOT RUN: {why}; nothing to measure on this device");
            ExitCode::from(NO_ATOMICS)
        }
        Err(e) => {
            eprintln!("atomic_counter: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How a run ended (errors aside).
enum Outcome {
    /// The counter and the old values are right.
    Ok,
    /// They are not.
    Wrong,
    /// The device has no RDMA atomics (why).
    NoAtomics(String),
}

/// Picks the device.
fn dispatch(args: &Args) -> Result<Outcome, String> {
    #[cfg(feature = "verbs")]
    if let Some(dev) = common::open_verbs(&args.dev)? {
        return run(dev, args);
    }
    run(Device::new(SoftDevice::new(SoftConfig::default())), args)
}

fn run<B: ExampleBackend>(dev: Device<B>, args: &Args) -> Result<Outcome, String> {
    if let Some(why) = B::no_atomics(&dev) {
        return Ok(Outcome::NoAtomics(why));
    }
    let e = |what: &'static str| err::<B>(what);
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let counter = pd
        .register(8, Access::REMOTE_ATOMIC | Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let init = QpInit {
        max_send_wr: 2 * MAX_BATCH as u32,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    // All peer QPs share one CQ: atomics produce no responder completion,
    // but the CQ guard counts what their queues could hold (a flush).
    let peer_inits = vec![&init; args.threads];
    let peer_cq = dev
        .create_cq(dev.cq_depth_for(&peer_inits))
        .map_err(e("create_cq"))?;
    let start = Arc::new(Barrier::new(args.threads + 1));
    let mut peers = Vec::new();
    let mut links = Vec::new();
    let mut handles = Vec::new();
    B::start(&dev);
    for t in 0..args.threads {
        let cq = dev
            .create_cq(dev.cq_depth_for(&[&init]))
            .map_err(e("create_cq"))?;
        let mut qp = pd.create_qp(&cq, &cq, &init).map_err(e("create_qp"))?;
        let mut peer = pd
            .create_qp(&peer_cq, &peer_cq, &init)
            .map_err(e("create_qp"))?;
        links.push(B::connect_pair(
            &dev,
            &mut qp,
            &mut peer,
            &ConnectAttr::default(),
            &ConnectAttr {
                access: Access::REMOTE_ATOMIC,
                ..Default::default()
            },
            &args.dev,
        )?);
        peers.push(peer);
        let results = pd
            .register(8 * args.batch, Access::LOCAL_WRITE)
            .map_err(e("register"))?;
        // Spread the remainder over the first threads.
        let ops =
            args.ops / args.threads as u64 + ((t as u64) < args.ops % args.threads as u64) as u64;
        let target = counter.remote(0);
        let (batch, start) = (args.batch, Arc::clone(&start));
        handles.push(
            thread::Builder::new()
                .name(format!("faa-{t}"))
                .spawn(move || worker(qp, cq, results, target, ops, batch, &start))
                .map_err(|e| format!("spawn: {e}"))?,
        );
    }
    start.wait();
    let t0 = Instant::now();
    let mut reports = Vec::new();
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => reports.push(r),
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("worker thread panicked".to_string())),
        }
    }
    let wall = t0.elapsed();
    B::stop(&dev);
    if let Some(e) = failure {
        return Err(e);
    }

    let total = args.ops;
    let fin = counter.load_u64(0).ok_or("counter out of range")?;
    let mut all: Vec<u64> = reports
        .iter()
        .flat_map(|r| r.olds.iter().copied())
        .collect();
    all.sort_unstable();
    let distinct = all.len() as u64 - all.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    let exact = all.len() as u64 == total && all.iter().enumerate().all(|(i, &v)| v == i as u64);
    let ok = fin == total && exact;
    let slowest = reports.iter().map(|r| r.elapsed).max().unwrap_or_default();

    let line = "-".repeat(96);
    println!("{line}");
    if dev.backend().name() == "soft" {
        println!("                    RDMA FETCH_AND_ADD on one shared counter (software HCA)");
    } else {
        println!("                    RDMA FETCH_AND_ADD on one shared counter (kernel device)");
    }
    let pollers: Vec<String> = (0..args.threads).map(|i| format!("worker {i}")).collect();
    let pollers: Vec<&str> = pollers.iter().map(String::as_str).collect();
    common::print_context(
        &dev,
        "FETCH_AND_ADD operations per second on one remote counter, all threads \
         together, and whether the final value and every returned old value are exact",
        &pollers,
        15,
    );
    println!(
        " QPs            : {} requester QPs (one per thread) -> {} peer QPs, one counter MR",
        args.threads, args.threads
    );
    println!(
        " Doorbell batch : {} FETCH_AND_ADDs per post_send, only the last signaled",
        args.batch
    );
    println!("{line}");
    println!(
        " {:<8} {:>10} {:>10} {:>10} {:>14} {:>16} {:>8}",
        "threads", "ops", "time[ms]", "Mops/s", "final value", "distinct olds", "check"
    );
    println!(
        " {:<8} {:>10} {:>10.1} {:>10.3} {:>14} {:>16} {:>8}",
        args.threads,
        total,
        wall.as_secs_f64() * 1e3,
        total as f64 / wall.as_secs_f64() / 1e6,
        fin,
        distinct,
        if ok { "OK" } else { "FAILED" }
    );
    println!("{line}");
    println!(
        " Slowest thread: {:.1} ms. Old values are exactly 0..{}: {}.",
        slowest.as_secs_f64() * 1e3,
        total,
        if exact { "yes" } else { "NO" }
    );
    if !ok {
        eprintln!(
            "atomic_counter: FAILED: counter {fin} (expected {total}), {} old values, {distinct} distinct",
            all.len()
        );
    }
    drop(peers);
    drop(links);
    Ok(if ok { Outcome::Ok } else { Outcome::Wrong })
}
