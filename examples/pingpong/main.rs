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
//! **`--ud`: unreliable datagrams.** The same, over UD QPs (Q_Key
//! 0x11111111): no connection; each side sends to the other's QP number
//! through an address handle (to its own port in-process; in the
//! two-process mode built from the remote's LID and GID, with a GRH when
//! the GID has a non-zero interface ID, as `ibv_ud_pingpong` does). Every
//! receive buffer starts with the 40-byte GRH area, the completion's
//! length counts it, and the payload follows; each receive is checked for
//! the sender's QP number and the GRH flag too. A datagram is one packet:
//! a `--size` above the port's MTU is refused before anything runs (exit
//! status 2), as are RC-only flags (`--mtu`, `--chk`). The two-process
//! mode with `--ud` is wire-compatible with `ibv_ud_pingpong` (default
//! size 2048, its default); either side can be that tool:
//!
//! ```text
//! pingpong --ud --device rxe0 --gid-idx 1 --server [--port 18515] [--size 2048]
//!          [--iters 1000] [--rx-depth 500]
//! pingpong --ud --device rxe0 --gid-idx 1 --connect HOST [same options]
//! ```
//!
//! iWARP has no UD: `--ud` on siw is refused with status 2.
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

use rdma_direct::api::{Access, AddressVector, AhInit, ConnectAttr, Device, Pd, QpInit, Transport};
use rdma_direct::soft::{SoftConfig, SoftDevice};

#[path = "../common/mod.rs"]
mod common;
use common::{err, ExampleBackend};

mod args;
mod side;
use args::{parse_args, Args};
use side::{
    pattern_byte, run_client, run_server, spin_budget, Side, UdPeer, ABORTED, RECV_DEPTH, UD_QKEY,
};

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
    NotRun(String),
    /// The run failed.
    Run(String),
}

impl From<String> for Failed {
    fn from(e: String) -> Failed {
        Failed::Run(e)
    }
}

/// A refused UD QP: `Unsupported` means the device or its data path has
/// none (nothing ran); anything else is a failure.
fn no_ud<B: ExampleBackend>(x: rdma_direct::Error) -> Failed {
    match x {
        rdma_direct::Error::Unsupported => Failed::NotRun(
            "this device's data path has no unreliable datagrams (rxe has them on both data \
             paths; iWARP and the mlx5 direct path have none)"
                .into(),
        ),
        x => Failed::Run(err::<B>("create_ud_qp")(x)),
    }
}

/// Picks the mode and the device.
fn dispatch(args: &Args) -> Result<(), Failed> {
    #[cfg(feature = "verbs")]
    {
        use rdma_direct::api::Backend;
        if let Some(rc) = &args.rc {
            let dev = common::open_device(args.dev.device.as_deref(), args.dev.gid_idx)?;
            if let Some(why) = rc_mode::cannot_run(&dev, args.ud) {
                return Err(Failed::NotRun(why));
            }
            return rc_mode::run(&dev, args, rc);
        }
        if let Some(dev) = common::open_verbs(&args.dev)? {
            if args.ud && dev.backend().port().transport == Transport::Iwarp {
                return Err(Failed::NotRun(format!(
                    "{} is an iWARP device: iWARP has no unreliable datagrams",
                    dev.backend().name()
                )));
            }
            return run(dev, args);
        }
    }
    run(Device::new(SoftDevice::new(SoftConfig::default())), args)
}

fn run<B: ExampleBackend>(dev: Device<B>, args: &Args) -> Result<(), Failed> {
    let e = |what: &'static str| err::<B>(what);
    let mtu = dev.backend().port().mtu as usize;
    if args.ud && args.size > mtu {
        return Err(Failed::NotRun(format!(
            "--size {} is larger than the port's MTU ({mtu} bytes): a datagram is one packet",
            args.size
        )));
    }
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
    let head = if args.ud { side::GRH_BYTES } else { 0 };
    for id in 0..2u8 {
        let cq = dev.create_cq(64).map_err(e("create_cq"))?;
        let qp = if args.ud {
            let mut qp = pd.create_ud_qp(&cq, &cq, &init).map_err(no_ud::<B>)?;
            qp.ready_ud(UD_QKEY).map_err(e("ready_ud"))?;
            qp
        } else {
            pd.create_qp(&cq, &cq, &init).map_err(e("create_qp"))?
        };
        let recv = pd
            .register(RECV_DEPTH * (head + args.size), Access::LOCAL_WRITE)
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
            ud: None,
        });
    }
    let mut server = sides.pop().expect("two sides");
    let mut client = sides.pop().expect("two sides");
    let _link = if args.ud {
        // No connection: each side addresses the other's QP number
        // through an address handle to this device's own port.
        client.ud = Some(UdPeer {
            ah: self_ah(&dev, &pd)?,
            qpn: server.qp.qpn(),
        });
        server.ud = Some(UdPeer {
            ah: self_ah(&dev, &pd)?,
            qpn: client.qp.qpn(),
        });
        None
    } else {
        Some(B::connect_pair(
            &dev,
            &mut client.qp,
            &mut server.qp,
            &ConnectAttr::default(),
            &ConnectAttr::default(),
            &args.dev,
        )?)
    };
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
        (Err(e), Ok(())) => return Err(format!("client: {e}").into()),
        (Ok(_), Err(e)) => return Err(format!("server: {e}").into()),
        (Err(c), Err(s)) if c == ABORTED => return Err(format!("server: {s}").into()),
        (Err(c), Err(_)) => return Err(format!("client: {c}").into()),
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
    let kind = if args.ud { "UD" } else { "RC" };
    println!("                    {kind} SEND/RECV ping-pong latency (one-way = RTT/2)");
    common::print_context(
        &dev,
        "one-way latency: half the round trip of a SEND answered by a SEND, \
         timed by the client thread",
        &["client", "server"],
        15,
    );
    if args.ud {
        println!(
            " Transport      : UD, 1 QP per side, each owned by its own thread, an address \
             handle each, Q_Key {UD_QKEY:#x}; {} B GRH area per receive",
            side::GRH_BYTES
        );
    } else {
        println!(" Transport      : RC, 1 QP per side, each owned by its own thread");
    }
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

/// An address handle to this device's own port (both in-process UD QPs
/// live there): by LID, and on RoCE by the port's GID (RoCE always routes
/// globally; hop limit 1, as `ibv_ud_pingpong`).
fn self_ah<B: ExampleBackend>(
    dev: &Device<B>,
    pd: &Pd<B>,
) -> Result<rdma_direct::api::Ah<B>, String> {
    let port = dev.backend().port();
    let global = port.transport == Transport::Roce;
    pd.create_ah(&AhInit {
        port_num: 0,
        dest: AddressVector {
            dlid: port.lid,
            is_global: global,
            dgid: port.gid,
            sgid_index: port.gid_index,
            hop_limit: 1,
            ..AddressVector::default()
        },
    })
    .map_err(err::<B>("create_ah"))
}

/// The two-process mode, compatible with rdma-core's `ibv_rc_pingpong`
/// (and with `--ud`, `ibv_ud_pingpong`).
#[cfg(feature = "verbs")]
mod rc_mode;
