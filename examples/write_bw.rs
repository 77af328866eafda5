//! RDMA WRITE message rate and bandwidth, in the style of perftest's
//! `ib_write_bw`, on the software HCA or (with `--device`) a kernel RDMA
//! device.
//!
//! One RC QP writes into a peer QP's memory region on the same device: the
//! in-process [`SoftDevice`], which runs its device thread, or with
//! `--device NAME` (builds with `--features verbs`) a kernel device such as
//! rxe0 or siw0 (QPs connected directly on RoCE/InfiniBand, through
//! rdma_cm on iWARP). For each message size the
//! application keeps the send queue busy with batches of `--batch` WRs
//! posted with one doorbell each (`post_send` of the whole batch), and
//! only the last WR of a batch is signaled: one completion retires the
//! whole batch. The application polls after every round of posting, so
//! completions free send-queue space before it fills; when a poll finds
//! nothing it spins, and yields the CPU after 64 empty polls so that a
//! device thread sharing its core can run. After each size, the
//! target buffer is checked byte for byte against the source (whose
//! contents change per size).
//!
//! Run: `cargo run --release --example write_bw [-- --iters N --batch N
//! --size N]` (defaults: 100000 messages per size after a warm-up of
//! 10000, batches of 16, sizes 8 B to 64 KiB); add `--device NAME` (and
//! `--features verbs` to the cargo command) for a kernel device.

use std::hint::spin_loop;
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, Wc, WcOpcode, WcStatus};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Remote, SendFlags, SendOp, SendWr, Sge};

mod common;
use common::{err, DevOpts, ExampleBackend, DEV_USAGE};

/// Message sizes measured by default.
const SIZES: [usize; 9] = [8, 32, 128, 512, 2048, 4096, 8192, 32768, 65536];
/// Largest `--batch`.
const MAX_BATCH: usize = 64;
/// Send-queue depth in WRs (each 1-SGE RDMA WRITE takes one 64-byte BB).
const SQ_DEPTH: u32 = 256;
/// Give up if nothing completes for this long.
const STALL: Duration = Duration::from_secs(10);

struct Args {
    iters: usize,
    warmup: usize,
    batch: usize,
    sizes: Vec<usize>,
    dev: DevOpts,
}

fn usage() -> String {
    format!("usage: write_bw [--iters N] [--warmup N] [--batch 1..=64] [--size BYTES] {DEV_USAGE}")
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        iters: 100_000,
        warmup: 10_000,
        batch: 16,
        sizes: SIZES.to_vec(),
        dev: DevOpts::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if a.dev.take(&flag, &mut it)? {
            continue;
        }
        let mut value = |name: &str| -> Result<usize, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse::<usize>()
                .map_err(|_| format!("{name}: not a number: {v}"))
        };
        match flag.as_str() {
            "--iters" | "-n" => a.iters = value("--iters")?,
            "--warmup" => a.warmup = value("--warmup")?,
            "--batch" | "-b" => a.batch = value("--batch")?,
            "--size" | "-s" => a.sizes = vec![value("--size")?],
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if a.batch == 0 || a.batch > MAX_BATCH {
        return Err(format!("--batch must be between 1 and {MAX_BATCH}"));
    }
    if a.sizes.iter().any(|&s| s == 0 || s > 1 << 28) {
        return Err("--size must be between 1 and 2^28 (256 MiB)".into());
    }
    Ok(a)
}

/// The writer: its QP, CQ and source buffer, and the target's address.
struct Writer<B: ExampleBackend> {
    qp: Qp<B>,
    cq: Cq<B>,
    src: Mr<B>,
    remote: Remote,
    batch: usize,
}

/// One measured run.
struct Run {
    msgs: u64,
    elapsed: Duration,
    completions: u64,
    doorbells: u64,
}

impl<B: ExampleBackend> Writer<B> {
    /// Writes `count` messages of `size` bytes; returns once every one has
    /// completed.
    fn run(&mut self, size: usize, count: u64) -> Result<Run, String> {
        let sge = [Sge::new(self.src.addr(), size as u32, self.src.lkey())];
        let op = SendOp::Write {
            remote: self.remote,
        };
        // Every WR of a batch is the same unsignaled WRITE except the
        // last, which is signaled and carries the number of messages
        // posted so far: its completion retires everything before it.
        let mut wrs = [SendWr::new(0, op, &sge, SendFlags::NONE); MAX_BATCH];
        let mut wc = [Wc::default(); 32];
        let (mut posted, mut done) = (0u64, 0u64);
        let (mut completions, mut doorbells) = (0u64, 0u64);
        let mut idle_since: Option<Instant> = None;
        let mut idle = 0u32;
        let start = Instant::now();
        while done < count {
            // Post whole batches while the send queue has room.
            while posted < count && self.qp.send_space() as usize >= self.batch {
                let n = (self.batch as u64).min(count - posted) as usize;
                for w in &mut wrs[..n - 1] {
                    w.flags = SendFlags::NONE;
                }
                wrs[n - 1].wr_id = posted + n as u64;
                wrs[n - 1].flags = SendFlags::SIGNALED;
                self.qp
                    .post_send(&wrs[..n])
                    .map_err(|e| format!("post_send: {e}"))?;
                posted += n as u64;
                doorbells += 1;
            }
            let k = self
                .cq
                .poll(&mut self.qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            for w in &wc[..k] {
                if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::RDMA_WRITE {
                    return Err(format!(
                        "completion wr_id {} failed: opcode {:?}, status {:?}, syndrome {:#x}",
                        w.wr_id, w.opcode, w.status, w.vendor_err
                    ));
                }
                if w.wr_id <= done || w.wr_id > posted {
                    return Err(format!(
                        "completion for {} messages out of order (done {done}, posted {posted})",
                        w.wr_id
                    ));
                }
                done = w.wr_id;
                completions += 1;
            }
            if k == 0 {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > STALL {
                    return Err(format!("no completion for {STALL:?} ({done}/{count})"));
                }
                // Spin a little, then let the device thread have the core
                // if it shares ours (2 cores, or a loaded machine).
                idle += 1;
                if idle < 64 {
                    spin_loop();
                } else {
                    thread::yield_now();
                }
            } else {
                idle_since = None;
                idle = 0;
            }
        }
        Ok(Run {
            msgs: count,
            elapsed: start.elapsed(),
            completions,
            doorbells,
        })
    }
}

fn fill_source<B: ExampleBackend>(src: &mut Mr<B>, size: usize, seed: usize) {
    for (j, b) in src.as_mut_slice()[..size].iter_mut().enumerate() {
        *b = (j as u8).wrapping_mul(13).wrapping_add(seed as u8 + 1) ^ (j >> 8) as u8;
    }
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
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_bw: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Picks the device.
fn dispatch(args: &Args) -> Result<(), String> {
    #[cfg(feature = "verbs")]
    if let Some(dev) = common::open_verbs(&args.dev)? {
        return run(dev, args);
    }
    run(Device::new(SoftDevice::new(SoftConfig::default())), args)
}

fn run<B: ExampleBackend>(dev: Device<B>, args: &Args) -> Result<(), String> {
    let max = *args.sizes.iter().max().ok_or("no message size")?;
    let e = |what: &'static str| err::<B>(what);
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let init = QpInit {
        max_send_wr: SQ_DEPTH,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    // Deep enough for the worst case the CQ guard checks (every WR the
    // queues can hold).
    let depth = dev.cq_depth_for(&[&init]);
    let cq = dev.create_cq(depth).map_err(e("create_cq"))?;
    let peer_cq = dev.create_cq(depth).map_err(e("create_cq"))?;
    let mut qp = pd.create_qp(&cq, &cq, &init).map_err(e("create_qp"))?;
    let mut peer = pd
        .create_qp(&peer_cq, &peer_cq, &init)
        .map_err(e("create_qp"))?;
    let link = B::connect_pair(
        &dev,
        &mut qp,
        &mut peer,
        &ConnectAttr::default(),
        &ConnectAttr {
            access: Access::REMOTE_WRITE,
            ..Default::default()
        },
        &args.dev,
    )?;
    let src = pd.register(max, Access::NONE).map_err(e("register"))?;
    let mut dst = pd
        .register(max, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e("register"))?;
    let mut w = Writer {
        remote: dst.remote(0),
        qp,
        cq,
        src,
        batch: args.batch,
    };
    let sq_wrs = w.qp.send_space();

    B::start(&dev);
    let line = "-".repeat(88);
    println!("{line}");
    if dev.backend().name() == "soft" {
        println!("                    RDMA_Write BW Test (software HCA, loopback)");
    } else {
        println!("                    RDMA_Write BW Test (kernel device, loopback)");
    }
    common::print_context(
        &dev,
        "RDMA WRITE message rate and bandwidth from one QP to another, \
         timed from the first post to the last completion",
        &["poster"],
        17,
    );
    println!(" Transport        : RC, 1 QP, 1 SGE per WR, no inline");
    println!(" TX depth         : {sq_wrs} WRs");
    println!(
        " Doorbell batch   : {} WRs per post_send, only the last signaled",
        args.batch
    );
    println!(
        " Iterations       : {} per size after {} warm-up",
        args.iters, args.warmup
    );
    println!("{line}");
    println!(
        " {:<10} {:<12} {:>16} {:>16} {:>12} {:>12} {:>8}",
        "#bytes",
        "#iterations",
        "BW average[MB/s]",
        "MsgRate[Mmsg/s]",
        "doorbells",
        "CQEs",
        "check"
    );
    let mut result = Ok(());
    for (k, &size) in args.sizes.iter().enumerate() {
        fill_source(&mut w.src, size, k);
        dst.as_mut_slice()[..size].fill(0);
        if args.warmup > 0 {
            w.run(size, args.warmup as u64)?;
        }
        let r = w.run(size, args.iters as u64)?;
        // Every WRITE of this size has completed: the device has written
        // the target, so reading it now is ordered after those writes.
        let ok = dst.as_slice()[..size] == w.src.as_slice()[..size];
        let secs = r.elapsed.as_secs_f64();
        println!(
            " {:<10} {:<12} {:>16.2} {:>16.3} {:>12} {:>12} {:>8}",
            size,
            r.msgs,
            r.msgs as f64 * size as f64 / secs / 1e6,
            r.msgs as f64 / secs / 1e6,
            r.doorbells,
            r.completions,
            if ok { "OK" } else { "MISMATCH" }
        );
        if !ok && result.is_ok() {
            result = Err(format!(
                "target buffer differs from the source at size {size}"
            ));
        }
    }
    println!("{line}");
    println!(" MB = 10^6 bytes. Wall-clock figures: noisy on a shared machine.");
    if dev.backend().name() == "soft" {
        println!(
            " On the software device a WRITE is a memcpy between two buffers of this process: \
             the bandwidth is memory-copy speed, not a network's."
        );
    }
    B::stop(&dev);
    drop(w);
    drop(peer);
    drop(link);
    result
}
