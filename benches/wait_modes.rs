//! What each completion-waiting mode costs:
//! CPU time burnt while idle, and ping-pong latency at a low and a high
//! message rate, for busy-poll, event and adaptive waiting.
//!
//! Runs on the software device by default, or on a kernel device with
//! `--device NAME` (built with `--features verbs`; inside the test VM).
//!
//! Usage: `wait_modes [--idle SECS] [--iters N] [--gap-us US] [--device NAME]`
//! (defaults: 10 s idle per mode, 2000 round trips per case, 1000 µs
//! between messages at the low rate). `scripts/wait_bench.sh` runs it and
//! writes the table in `docs/benchmarks.md`.
//!
//! * **Idle CPU**: one thread waits on a CQ that never gets a completion,
//!   in repeated 100 ms waits, for `--idle` seconds; the figure is that
//!   thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) over the wall time.
//! * **Latency**: SEND/RECV ping-pong between two QPs; both sides wait in
//!   the mode under test; one-way latency = round trip / 2; median and
//!   p99. "high rate" sends the next ping as soon as the pong arrives;
//!   "low rate" sleeps `--gap-us` between pings, so every wait starts on
//!   an idle CQ.
//!
//! On the software device the device itself is a thread that polls the
//! queues (it sleeps 50 µs after a few thousand idle passes), so event-mode
//! latency includes its wake-up; on rxe the kernel does the work.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, Backend, ConnectAttr, Cq, Device, Mr, QpInit, WaitMode, Wc, WcStatus,
};
use rdma_direct::event::thread_cpu_time;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

const MODES: [WaitMode; 3] = [WaitMode::BusyPoll, WaitMode::Event, WaitMode::Adaptive];

struct Args {
    idle: f64,
    iters: usize,
    gap_us: u64,
    device: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        idle: 10.0,
        iters: 2000,
        gap_us: 1000,
        device: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        let mut v = || it.next().ok_or(format!("{f} needs a value"));
        match f.as_str() {
            "--idle" => a.idle = v()?.parse().map_err(|_| "--idle: number")?,
            "--iters" => a.iters = v()?.parse().map_err(|_| "--iters: number")?,
            "--gap-us" => a.gap_us = v()?.parse().map_err(|_| "--gap-us: number")?,
            "--device" => a.device = Some(v()?),
            "--bench" => {}
            _ => return Err(format!("unknown argument {f}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("wait_modes: {e}");
            return ExitCode::from(2);
        }
    };
    let r = match &args.device {
        None => {
            let dev = Device::new(SoftDevice::new(SoftConfig::default()));
            dev.backend().start();
            let r = run(&dev, &args, "soft");
            dev.backend().stop();
            r
        }
        Some(name) => verbs(name, &args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wait_modes: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "verbs")]
fn verbs(name: &str, args: &Args) -> Result<(), String> {
    let dev = Device::new(
        rdma_direct::verbs::VerbsDevice::open_named(name)
            .map_err(|e| format!("open {name}: {e}"))?,
    );
    if dev.backend().port().transport == rdma_direct::api::Transport::Iwarp {
        return Err("this benchmark connects out of band: use a RoCE device (rxe)".into());
    }
    run(&dev, args, name)
}

#[cfg(not(feature = "verbs"))]
fn verbs(_: &str, _: &Args) -> Result<(), String> {
    Err("--device needs --features verbs".into())
}

fn e(what: &'static str) -> impl Fn(Error) -> String {
    move |err| format!("{what}: {err}")
}

fn run<B: Backend>(dev: &Device<B>, args: &Args, label: &str) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let init = QpInit {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
        srq: None,
    };
    let depth = dev.cq_depth_for(&[&init]);
    let mut cq_a = dev.create_cq(depth).map_err(e("create_cq"))?;
    let mut cq_b = dev.create_cq(depth).map_err(e("create_cq"))?;
    let mut a = pd.create_qp(&cq_a, &cq_a, &init).map_err(e("create_qp"))?;
    let mut b = pd.create_qp(&cq_b, &cq_b, &init).map_err(e("create_qp"))?;
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &ConnectAttr::default())
        .map_err(e("connect"))?;
    b.connect(&ia, &ConnectAttr::default())
        .map_err(e("connect"))?;

    println!("## {label}: idle CPU ({:.0} s per mode)", args.idle);
    println!();
    println!("| mode | CPU time | wall | CPU share of one core |");
    println!("|---|---:|---:|---:|");
    let mut out = [Wc::default(); 8];
    for mode in MODES {
        let t0 = Instant::now();
        let c0 = thread_cpu_time();
        while t0.elapsed().as_secs_f64() < args.idle {
            match cq_a.wait(&mut a, &mut out, mode, Duration::from_millis(100)) {
                Err(Error::Timeout) => {}
                other => return Err(format!("idle wait: {other:?}")),
            }
        }
        let cpu = thread_cpu_time() - c0;
        let wall = t0.elapsed();
        println!(
            "| {mode:?} | {:.3} s | {:.1} s | {:.2} % |",
            cpu.as_secs_f64(),
            wall.as_secs_f64(),
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
        );
    }
    println!();

    let buf_a = pd
        .register(64, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let buf_b = pd
        .register(64, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    println!(
        "## {label}: ping-pong one-way latency, 8-byte SEND ({} round trips)",
        args.iters
    );
    println!();
    println!("| mode | rate | median µs | p99 µs | vs busy-poll median |");
    println!("|---|---|---:|---:|---:|");
    for (rate, gap) in [("high", 0u64), ("low", args.gap_us)] {
        let mut busy_median = 0.0;
        for mode in MODES {
            let lat = thread::scope(|s| -> Result<Vec<f64>, String> {
                let server = s.spawn(|| echo(&mut b, &mut cq_b, &buf_b, mode, args.iters));
                let r = ping(&mut a, &mut cq_a, &buf_a, mode, args.iters, gap);
                server
                    .join()
                    .map_err(|_| "echo thread panicked".to_string())??;
                r
            })?;
            let (med, p99) = stats(lat);
            if mode == WaitMode::BusyPoll {
                busy_median = med;
            }
            println!(
                "| {mode:?} | {rate} | {med:.2} | {p99:.2} | {:.2}× |",
                med / busy_median
            );
        }
    }
    println!();
    Ok(())
}

fn post_recv<B: Backend>(qp: &mut rdma_direct::api::Qp<B>, m: &Mr<B>) -> Result<(), String> {
    let s = [m.sge(0, 64)];
    qp.post_recv(&[RecvWr { wr_id: 1, sges: &s }])
        .map_err(|e| format!("post_recv: {e}"))
}

fn send<B: Backend>(qp: &mut rdma_direct::api::Qp<B>) -> Result<(), String> {
    let msg = [7u8; 8];
    let pieces = [&msg[..]];
    qp.post_send(&[SendWr::inline(
        2,
        SendOp::Send,
        &pieces,
        SendFlags::SIGNALED,
    )])
    .map_err(|e| format!("post_send: {e}"))
}

/// Waits until a receive completed (send completions are consumed on the
/// way).
fn wait_recv<B: Backend>(
    qp: &mut rdma_direct::api::Qp<B>,
    cq: &mut Cq<B>,
    mode: WaitMode,
) -> Result<(), String> {
    let mut out = [Wc::default(); 8];
    loop {
        let n = cq
            .wait(qp, &mut out, mode, Duration::from_secs(10))
            .map_err(|e| format!("wait: {e}"))?;
        let mut got = false;
        for w in &out[..n] {
            if w.status != WcStatus::SUCCESS {
                return Err(format!("completion failed: {w:?}"));
            }
            got |= w.wr_id == 1;
        }
        if got {
            return Ok(());
        }
    }
}

fn ping<B: Backend>(
    qp: &mut rdma_direct::api::Qp<B>,
    cq: &mut Cq<B>,
    m: &Mr<B>,
    mode: WaitMode,
    iters: usize,
    gap_us: u64,
) -> Result<Vec<f64>, String> {
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        post_recv(qp, m)?;
        if gap_us > 0 {
            thread::sleep(Duration::from_micros(gap_us));
        }
        let t0 = Instant::now();
        send(qp)?;
        wait_recv(qp, cq, mode)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    Ok(lat)
}

fn echo<B: Backend>(
    qp: &mut rdma_direct::api::Qp<B>,
    cq: &mut Cq<B>,
    m: &Mr<B>,
    mode: WaitMode,
    iters: usize,
) -> Result<(), String> {
    for _ in 0..iters {
        post_recv(qp, m)?;
        wait_recv(qp, cq, mode)?;
        send(qp)?;
    }
    Ok(())
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (q(0.5), q(0.99))
}
