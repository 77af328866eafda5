//! RC SEND/RECV ping-pong latency, in the style of perftest's
//! `ib_send_lat`, on the software HCA or (with `--device`) a kernel RDMA
//! device; and a two-process mode that interoperates with rdma-core's
//! `ibv_rc_pingpong`.
//!
//! **In-process mode** (the default). Two RC QPs on one device: the
//! in-process [`SoftDevice`] running its device thread, or with
//! `--device NAME` (builds with `--features verbs`) a kernel device such as
//! rxe0 or siw0, whose QPs are connected directly on RoCE/InfiniBand and
//! through rdma_cm on iWARP. A client thread and a server thread each own
//! one QP and its CQ. The client sends a message, the server answers with
//! a message of the same size, and the client times the round trip with
//! [`Instant`](std::time::Instant). The table reports one-way latency (round trip / 2).
//! Warm-up iterations are not recorded.
//!
//! Both sides pre-post a ring of receives and re-post each buffer after
//! checking it; every payload byte is checked on both sides, and the
//! program exits non-zero on any bad completion status or payload.
//!
//! Run: `cargo run --release --example pingpong [-- --size N --iters N
//! --warmup N]` (defaults: 64 bytes, 10000 iterations, 1000 warm-up);
//! `cargo run --release --features verbs --example pingpong -- --device
//! rxe0` for a kernel device.
//!
//! **Two-process mode** (`--server`, or `--connect HOST`; verbs only): one
//! QP per process, connected out of band over TCP with
//! `ibv_rc_pingpong`'s exchange ([`rdma_direct::verbs::oob`]), and that
//! tool's loop: the client sends first; each side sends its next message
//! only once its previous send has completed and a message has arrived;
//! one buffer (filled with `0x7b`) is both the send and the receive
//! buffer; `--rx-depth` receives are posted before the exchange and
//! refilled when one is left; the server is at RTS before it replies to
//! the exchange. The path MTU is `--mtu` (capped by the port's active
//! MTU) on both sides, since the exchanged message carries none. Either
//! side may be `ibv_rc_pingpong`:
//!
//! ```text
//! pingpong --device rxe0 --gid-idx 1 --server [--port 18515] [--size 4096]
//!          [--iters 1000] [--rx-depth 500] [--mtu 1024] [--chk]
//! pingpong --device rxe0 --gid-idx 1 --connect HOST [same options]
//! ```
//!
//! `--chk` is `ibv_rc_pingpong -c`: the client zeroes the first byte of
//! every page before it starts, the server checks those bytes at the end
//! (and, unlike rdma-core's tool, exits non-zero if one is wrong). Output:
//! the local and remote address lines, then bytes/seconds/Mbit/sec and
//! iters/seconds/usec/iter, as `ibv_rc_pingpong` prints them. Every wait
//! is bounded (`--timeout SECS`, default 60, and no completion for 20 s is
//! an error).
//!
//! The pollers busy-spin with [`spin_loop`](std::hint::spin_loop) and fall back to
//! [`std::thread::yield_now`] after a short while without progress: the
//! client, the server and the device thread are three spinning threads,
//! and on a machine with fewer than three cores one of them must give way
//! for the others to make progress.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use rdma_direct::api::{Access, ConnectAttr, Device, QpInit};
use rdma_direct::soft::{SoftConfig, SoftDevice};

#[path = "../common/mod.rs"]
mod common;
use common::{err, ExampleBackend};

mod args;
mod side;
use args::{parse_args, Args};
use side::{pattern_byte, run_client, run_server, spin_budget, Side, ABORTED, RECV_DEPTH};

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
        Err(Failed::NotRun(why)) => {
            eprintln!("pingpong: NOT RUN: {why}");
            ExitCode::from(common::EXIT_USAGE)
        }
        Err(Failed::Run(e)) => {
            eprintln!("pingpong: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why `dispatch` failed.
enum Failed {
    /// Nothing ran: the device cannot do what was asked.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    NotRun(String),
    /// The run failed.
    Run(String),
}

impl From<String> for Failed {
    fn from(e: String) -> Failed {
        Failed::Run(e)
    }
}

/// Picks the mode and the device.
fn dispatch(args: &Args) -> Result<(), Failed> {
    #[cfg(feature = "verbs")]
    {
        if let Some(rc) = &args.rc {
            let dev = common::open_device(args.dev.device.as_deref(), args.dev.gid_idx)?;
            if let Some(why) = rc_mode::cannot_run(&dev) {
                return Err(Failed::NotRun(why));
            }
            return Ok(rc_mode::run(&dev, args, rc)?);
        }
        if let Some(dev) = common::open_verbs(&args.dev)? {
            return Ok(run(dev, args)?);
        }
    }
    Ok(run(
        Device::new(SoftDevice::new(SoftConfig::default())),
        args,
    )?)
}

fn run<B: ExampleBackend>(dev: Device<B>, args: &Args) -> Result<(), String> {
    let e = |what: &'static str| err::<B>(what);
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let init = QpInit {
        max_send_wr: 16,
        max_recv_wr: RECV_DEPTH as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
        srq: None,
    };
    let mut sides = Vec::new();
    for id in 0..2u8 {
        let cq = dev.create_cq(64).map_err(e("create_cq"))?;
        let qp = pd.create_qp(&cq, &cq, &init).map_err(e("create_qp"))?;
        let recv = pd
            .register(RECV_DEPTH * args.size, Access::LOCAL_WRITE)
            .map_err(e("register"))?;
        let mut send = pd
            .register(args.size, Access::NONE)
            .map_err(e("register"))?;
        for (j, b) in send.as_mut_slice().iter_mut().enumerate() {
            *b = pattern_byte(id, 0, j);
        }
        let inline = args.size <= qp.caps().max_inline_data as usize;
        sides.push(Side {
            id,
            qp,
            cq,
            recv,
            send,
            size: args.size,
            inline,
            sends_posted: 0,
            sends_done: 0,
            spin: spin_budget(),
        });
    }
    let mut server = sides.pop().expect("two sides");
    let mut client = sides.pop().expect("two sides");
    let _link = B::connect_pair(
        &dev,
        &mut client.qp,
        &mut server.qp,
        &ConnectAttr::default(),
        &ConnectAttr::default(),
        &args.dev,
    )?;
    for slot in 0..RECV_DEPTH {
        client.post_recv_slot(slot)?;
        server.post_recv_slot(slot)?;
    }
    let inline = client.inline;
    let inline_max = client.qp.caps().max_inline_data;

    B::start(&dev);
    let total = args.iters + args.warmup;
    let abort = Arc::new(AtomicBool::new(false));
    let server_thread = {
        let abort = Arc::clone(&abort);
        thread::Builder::new()
            .name("server".into())
            .spawn(move || {
                let r = run_server(server, total, &abort);
                if r.is_err() {
                    abort.store(true, Ordering::Relaxed);
                }
                r
            })
            .map_err(|e| format!("spawn: {e}"))?
    };
    let client_thread = {
        let abort = Arc::clone(&abort);
        let warmup = args.warmup;
        thread::Builder::new()
            .name("client".into())
            .spawn(move || {
                let r = run_client(client, total, warmup, &abort);
                if r.is_err() {
                    abort.store(true, Ordering::Relaxed);
                }
                r
            })
            .map_err(|e| format!("spawn: {e}"))?
    };
    let client_result = client_thread
        .join()
        .map_err(|_| "client thread panicked".to_string());
    let server_result = server_thread
        .join()
        .map_err(|_| "server thread panicked".to_string());
    B::stop(&dev);
    // Report the root cause, not the other side's reaction to it.
    let mut rtt = match (client_result?, server_result?) {
        (Ok(rtt), Ok(())) => rtt,
        (Err(e), Ok(())) => return Err(format!("client: {e}")),
        (Ok(_), Err(e)) => return Err(format!("server: {e}")),
        (Err(c), Err(s)) if c == ABORTED => return Err(format!("server: {s}")),
        (Err(c), Err(_)) => return Err(format!("client: {c}")),
    };

    rtt.sort_unstable();
    let n = rtt.len();
    let one_way_us = |ns: u64| ns as f64 / 2.0 / 1000.0;
    let min = one_way_us(rtt[0]);
    let max = one_way_us(rtt[n - 1]);
    let median = one_way_us(rtt[n / 2]);
    let p99 = one_way_us(rtt[((n * 99).div_ceil(100)).max(1) - 1]);
    let avg = one_way_us(rtt.iter().sum::<u64>()) / n as f64;

    let line = "-".repeat(86);
    println!("{line}");
    println!("                    RC SEND/RECV ping-pong latency (one-way = RTT/2)");
    common::print_context(
        &dev,
        "one-way latency: half the round trip of a SEND answered by a SEND, \
         timed by the client thread",
        &["client", "server"],
        15,
    );
    println!(" Transport      : RC, 1 QP per side, each owned by its own thread");
    println!(
        " Inline         : {} (up to {inline_max} bytes)",
        if inline { "yes" } else { "no" }
    );
    println!(" Receive ring   : {RECV_DEPTH} buffers per side, re-posted after each message");
    println!(
        " Warm-up        : {} iterations (not recorded)",
        args.warmup
    );
    println!(" Payload check  : every byte, both directions: OK");
    println!("{line}");
    println!(
        " {:<8} {:<12} {:>12} {:>15} {:>12} {:>12} {:>12}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_median[usec]",
        "t_avg[usec]",
        "t_p99[usec]",
        "t_max[usec]"
    );
    println!(
        " {:<8} {:<12} {:>12.2} {:>15.2} {:>12.2} {:>12.2} {:>12.2}",
        args.size, n, min, median, avg, p99, max
    );
    println!("{line}");
    Ok(())
}

/// The two-process mode, compatible with rdma-core's `ibv_rc_pingpong`.
#[cfg(feature = "verbs")]
mod rc_mode;
