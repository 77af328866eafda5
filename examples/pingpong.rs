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
//! [`Instant`]. The table reports one-way latency (round trip / 2).
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
//! The pollers busy-spin with [`spin_loop`] and fall back to
//! [`std::thread::yield_now`] after a short while without progress: the
//! client, the server and the device thread are three spinning threads,
//! and on a machine with fewer than three cores one of them must give way
//! for the others to make progress.

use std::hint::spin_loop;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, Wc, WcOpcode, WcStatus};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

mod common;
use common::{err, DevOpts, ExampleBackend, DEV_USAGE};

/// Receives kept posted on each side.
const RECV_DEPTH: usize = 16;
/// The error of the side that stopped because the other one failed.
const ABORTED: &str = "stopped: the other side failed";
/// Give up if nothing completes for this long.
const STALL: Duration = Duration::from_secs(10);
/// Idle polls spent spinning before the poller starts yielding: long when
/// the client, the server and the device thread each have a core, short
/// when they must share (on 2 cores, spinning 256 polls before yielding
/// made the median 4x worse than spinning 4).
fn spin_budget() -> u32 {
    match thread::available_parallelism().map(|n| n.get()) {
        Ok(n) if n >= 4 => 4096,
        _ => 4,
    }
}

struct Args {
    size: usize,
    iters: usize,
    warmup: usize,
    dev: DevOpts,
    /// Two-process mode, `ibv_rc_pingpong` compatible.
    rc: Option<RcArgs>,
}

/// The two-process (`ibv_rc_pingpong`) options.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
struct RcArgs {
    /// `None`: server; `Some(host)`: client of `host`.
    connect: Option<String>,
    port: u16,
    rx_depth: u32,
    mtu: u32,
    chk: bool,
    timeout: Duration,
}

fn usage() -> String {
    format!(
        "usage: pingpong [--size BYTES] [--iters N] [--warmup N] {DEV_USAGE}\n       \
         pingpong [--device NAME] [--gid-idx N] (--server | --connect HOST) [--port 18515]\n       \
         \x20        [--size 4096] [--iters 1000] [--rx-depth 500] [--mtu 1024] [--chk]\n       \
         \x20        [--timeout SECS]   (ibv_rc_pingpong compatible; --features verbs)"
    )
}

fn parse_args() -> Result<Args, String> {
    let mut dev = DevOpts::default();
    let (mut size, mut iters, mut warmup) = (None, None, 1_000);
    let (mut server, mut connect, mut port, mut rx_depth, mut mtu, mut chk, mut timeout) =
        (false, None, 18515u16, 500u32, 1024u32, false, 60u64);
    let (mut rc_flag, mut warmup_given) = (None, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if dev.take(&flag, &mut it)? {
            continue;
        }
        let mut text = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {v}"))
        };
        match flag.as_str() {
            "--size" | "-s" => size = Some(num("--size", text("--size")?)? as usize),
            "--iters" | "-n" => iters = Some(num("--iters", text("--iters")?)? as usize),
            "--warmup" => {
                warmup = num("--warmup", text("--warmup")?)? as usize;
                warmup_given = true;
            }
            "--server" => server = true,
            "--connect" => connect = Some(text("--connect")?),
            "--port" | "-p" => {
                port = u16::try_from(num("--port", text("--port")?)?)
                    .map_err(|_| "--port must be at most 65535".to_string())?;
                rc_flag = Some("--port");
            }
            "--rx-depth" | "-r" => {
                rx_depth = u32::try_from(num("--rx-depth", text("--rx-depth")?)?)
                    .map_err(|_| "--rx-depth is too large".to_string())?;
                rc_flag = Some("--rx-depth");
            }
            "--mtu" | "-m" => {
                mtu = u32::try_from(num("--mtu", text("--mtu")?)?).unwrap_or(0);
                rc_flag = Some("--mtu");
            }
            "--chk" | "-c" => {
                chk = true;
                rc_flag = Some("--chk");
            }
            "--timeout" => {
                timeout = num("--timeout", text("--timeout")?)?;
                rc_flag = Some("--timeout");
            }
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    let two_process = server || connect.is_some();
    if server && connect.is_some() {
        return Err("--server and --connect exclude each other".into());
    }
    if let (false, Some(f)) = (two_process, rc_flag) {
        return Err(format!(
            "{f} belongs to the two-process mode: add --server or --connect HOST\n{}",
            usage()
        ));
    }
    if two_process && warmup_given {
        return Err("--warmup belongs to the in-process mode (ibv_rc_pingpong has none)".into());
    }
    if two_process && cfg!(not(feature = "verbs")) {
        return Err(
            "--server/--connect run on a kernel RDMA device, which needs the verbs backend: \
             build with --features verbs"
                .into(),
        );
    }
    let rc = two_process.then(|| RcArgs {
        connect,
        port,
        rx_depth,
        mtu,
        chk,
        timeout: Duration::from_secs(timeout.max(1)),
    });
    let (dsize, diters) = if rc.is_some() {
        (4096, 1000)
    } else {
        (64, 10_000)
    };
    let a = Args {
        size: size.unwrap_or(dsize),
        iters: iters.unwrap_or(diters),
        warmup,
        dev,
        rc,
    };
    if a.size == 0 || a.size > 1 << 24 {
        return Err("--size must be between 1 and 2^24 (16 MiB)".into());
    }
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if let Some(rc) = &a.rc {
        if rc.rx_depth < 2 || rc.rx_depth > 1 << 16 {
            return Err("--rx-depth must be between 2 and 65536".into());
        }
        if ![256, 512, 1024, 2048, 4096].contains(&rc.mtu) {
            return Err("--mtu must be 256, 512, 1024, 2048 or 4096".into());
        }
    }
    Ok(a)
}

/// Byte `j` of the message of iteration `iter` sent by `side` (0 client,
/// 1 server): the iteration number in the first bytes, a side-dependent
/// pattern after it.
fn pattern_byte(side: u8, iter: u64, j: usize) -> u8 {
    if j < 8 {
        iter.to_le_bytes()[j] ^ side.wrapping_mul(0x5a)
    } else {
        (j as u8)
            .wrapping_mul(31)
            .wrapping_add(side.wrapping_mul(101))
    }
}

/// Writes the iteration stamp (the only part that changes per message).
fn stamp(buf: &mut [u8], side: u8, iter: u64) {
    for (j, b) in buf.iter_mut().enumerate().take(8) {
        *b = pattern_byte(side, iter, j);
    }
}

fn check_payload(buf: &[u8], side: u8, iter: u64) -> Result<(), String> {
    match buf
        .iter()
        .enumerate()
        .find(|&(j, &b)| b != pattern_byte(side, iter, j))
    {
        None => Ok(()),
        Some((j, &b)) => Err(format!(
            "payload mismatch in message {iter} from side {side}: byte {j} is {b:#04x}, \
             expected {:#04x}",
            pattern_byte(side, iter, j)
        )),
    }
}

/// Adaptive idle: spin first, then yield the CPU.
struct Idle {
    budget: u32,
    spins: u32,
    since: Instant,
}

impl Idle {
    fn new(budget: u32) -> Idle {
        Idle {
            budget,
            spins: 0,
            since: Instant::now(),
        }
    }
    fn progress(&mut self) {
        self.spins = 0;
    }
    fn wait(&mut self, abort: &AtomicBool) -> Result<(), String> {
        self.spins += 1;
        if self.spins < self.budget {
            spin_loop();
            return Ok(());
        }
        if self.spins == self.budget {
            self.since = Instant::now();
        }
        if abort.load(Ordering::Relaxed) {
            return Err(ABORTED.into());
        }
        if self.since.elapsed() > STALL {
            return Err(format!("no completion for {STALL:?}"));
        }
        thread::yield_now();
        Ok(())
    }
}

/// One side of the ping-pong: a QP, its CQ, a receive ring and a send
/// buffer.
struct Side<B: ExampleBackend> {
    id: u8,
    qp: Qp<B>,
    cq: Cq<B>,
    recv: Mr<B>,
    send: Mr<B>,
    size: usize,
    inline: bool,
    sends_posted: u64,
    sends_done: u64,
    /// Idle budget (see [`spin_budget`]).
    spin: u32,
}

impl<B: ExampleBackend> Side<B> {
    fn post_recv_slot(&mut self, slot: usize) -> Result<(), String> {
        let sge = [self.recv.sge(slot * self.size, self.size as u32)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: slot as u64,
                sges: &sge,
            }])
            .map_err(|e| format!("post_recv: {e}"))
    }

    /// Stamps and sends the message of iteration `iter`.
    fn send(&mut self, iter: u64) -> Result<(), String> {
        let size = self.size;
        stamp(&mut self.send.as_mut_slice()[..size], self.id, iter);
        let sge = [self.send.sge(0, size as u32)];
        let data: [&[u8]; 1] = [&self.send.as_slice()[..size]];
        let wr = if self.inline {
            SendWr::inline(iter, SendOp::Send, &data, SendFlags::SIGNALED)
        } else {
            SendWr::new(iter, SendOp::Send, &sge, SendFlags::SIGNALED)
        };
        self.qp
            .post_send_one(&wr)
            .map_err(|e| format!("post_send: {e}"))?;
        self.sends_posted += 1;
        Ok(())
    }

    /// Polls until one receive completes; returns its ring slot. Send
    /// completions met on the way are checked and counted.
    fn wait_recv(&mut self, abort: &AtomicBool) -> Result<usize, String> {
        let mut wc = [Wc::default(); 4];
        let mut idle = Idle::new(self.spin);
        let mut got = None;
        loop {
            let n = self
                .cq
                .poll(&mut self.qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            for w in &wc[..n] {
                if w.status != WcStatus::SUCCESS {
                    return Err(format!(
                        "completion wr_id {} opcode {:?} failed: status {:?}, syndrome {:#x}",
                        w.wr_id, w.opcode, w.status, w.vendor_err
                    ));
                }
                if w.opcode == WcOpcode::RECV {
                    if got.is_some() {
                        return Err("two receives completed for one message".into());
                    }
                    if w.byte_len as usize != self.size {
                        return Err(format!(
                            "received {} bytes, expected {}",
                            w.byte_len, self.size
                        ));
                    }
                    got = Some(w.wr_id as usize);
                } else if w.opcode == WcOpcode::SEND {
                    if w.wr_id != self.sends_done {
                        return Err(format!(
                            "send {} completed, expected {}",
                            w.wr_id, self.sends_done
                        ));
                    }
                    self.sends_done += 1;
                } else {
                    return Err(format!("unexpected completion opcode {:?}", w.opcode));
                }
            }
            if let Some(slot) = got {
                return Ok(slot);
            }
            if n > 0 {
                idle.progress();
            } else {
                idle.wait(abort)?;
            }
        }
    }

    /// Checks the received message in `slot` and gives the slot back to
    /// the receive queue.
    fn consume(&mut self, slot: usize, from: u8, iter: u64) -> Result<(), String> {
        let at = slot * self.size;
        check_payload(&self.recv.as_slice()[at..at + self.size], from, iter)?;
        self.post_recv_slot(slot)
    }
}

fn run_client<B: ExampleBackend>(
    mut s: Side<B>,
    total: usize,
    warmup: usize,
    abort: &AtomicBool,
) -> Result<Vec<u64>, String> {
    let mut rtt_ns = Vec::with_capacity(total - warmup);
    let mut next_slot = 0usize;
    for i in 0..total as u64 {
        let t0 = Instant::now();
        s.send(i)?;
        let slot = s.wait_recv(abort)?;
        let dt = t0.elapsed();
        if slot != next_slot {
            return Err(format!(
                "receive slot {slot} completed, expected {next_slot}"
            ));
        }
        next_slot = (next_slot + 1) % RECV_DEPTH;
        if i as usize >= warmup {
            rtt_ns.push(dt.as_nanos() as u64);
        }
        s.consume(slot, 1, i)?;
    }
    // On the software HCA the reply's CQE follows our send's CQE, so this
    // finds nothing to wait for; a kernel device may report the send's
    // acknowledgement after the reply has arrived.
    s.drain_sends(abort)?;
    Ok(rtt_ns)
}

fn run_server<B: ExampleBackend>(
    mut s: Side<B>,
    total: usize,
    abort: &AtomicBool,
) -> Result<(), String> {
    for i in 0..total as u64 {
        let slot = s.wait_recv(abort)?;
        // Answer first, check afterwards: the check is off the round trip.
        s.send(i)?;
        s.consume(slot, 0, i)?;
    }
    // Wait for the last reply's send completion.
    s.drain_sends(abort)
}

impl<B: ExampleBackend> Side<B> {
    /// Waits until every posted send has completed.
    fn drain_sends(&mut self, abort: &AtomicBool) -> Result<(), String> {
        let mut wc = [Wc::default(); 4];
        let mut idle = Idle::new(self.spin);
        while self.sends_done < self.sends_posted {
            let n = self
                .cq
                .poll(&mut self.qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            for w in &wc[..n] {
                if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::SEND {
                    return Err(format!("unexpected final completion {w:?}"));
                }
                self.sends_done += 1;
            }
            if n == 0 {
                idle.wait(abort)?;
            }
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Picks the mode and the device.
fn dispatch(args: &Args) -> Result<(), String> {
    #[cfg(feature = "verbs")]
    {
        if let Some(rc) = &args.rc {
            let dev = common::open_device(args.dev.device.as_deref(), args.dev.gid_idx)?;
            return rc_mode::run(&dev, args, rc);
        }
        if let Some(dev) = common::open_verbs(&args.dev)? {
            return run(dev, args);
        }
    }
    run(Device::new(SoftDevice::new(SoftConfig::default())), args)
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
mod rc_mode {
    use std::hint::spin_loop;
    use std::net::{Ipv6Addr, TcpListener};
    use std::time::{Duration, Instant};

    use rdma_direct::api::{
        Access, Backend, ConnectAttr, Device, QpInfo, QpInit, Transport, Wc, WcStatus,
    };
    use rdma_direct::verbs::oob::OobConn;
    use rdma_direct::verbs::VerbsDevice;
    use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

    use super::common::{err, status_name, ExampleBackend};
    use super::{Args, RcArgs};

    type Dev = VerbsDevice;

    /// `ibv_rc_pingpong`'s work-request ids, used as bits of `pending`.
    const RECV_WRID: u64 = 1;
    const SEND_WRID: u64 = 2;
    /// No completion for this long is an error (`ibv_rc_pingpong` would
    /// wait forever).
    const STALL: Duration = Duration::from_secs(20);

    /// `  local address:  LID 0x0000, QPN 0x000011, PSN 0x123456, GID ::ffff:192.0.2.1`
    fn address_line(which: &str, i: &QpInfo) -> String {
        format!(
            "  {which} LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
            i.lid,
            i.qpn,
            i.psn,
            Ipv6Addr::from(i.gid)
        )
    }

    fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    }

    /// `host:port`, bracketing an IPv6 literal.
    fn host_port(host: &str, port: u16) -> String {
        if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }

    pub fn run(dev: &Device<Dev>, args: &Args, rc: &RcArgs) -> Result<(), String> {
        let e = |what: &'static str| err::<Dev>(what);
        let port = dev.backend().port();
        if port.transport == Transport::Iwarp {
            return Err(format!(
                "{} is an iWARP device: its QPs connect only through rdma_cm, never with \
                 ibv_rc_pingpong's out-of-band exchange (use the in-process mode, or rping)",
                dev.backend().name()
            ));
        }
        let size = args.size;
        let rx_depth = rc.rx_depth;
        let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
        // One buffer for sends and receives, as ibv_rc_pingpong.
        let mut buf = pd
            .register(size, Access::LOCAL_WRITE)
            .map_err(e("register"))?;
        buf.as_mut_slice().fill(0x7b);
        let init = QpInit {
            max_send_wr: 1,
            max_recv_wr: rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        // rx_depth + 1 entries, as ibv_rc_pingpong, or more if the device
        // rounds the queues up (the CQ guard counts what they can hold).
        let depth = dev.cq_depth_for(&[&init]).max(rx_depth + 1);
        let mut cq = dev.create_cq(depth).map_err(e("create_cq"))?;
        let mut qp = pd.create_qp(&cq, &cq, &init).map_err(e("create_qp"))?;
        let inline = qp.caps().max_inline_data as usize >= size;
        let attr = ConnectAttr {
            max_mtu: rc.mtu,
            gid_index: Some(port.gid_index),
            ..ConnectAttr::default()
        };
        let local = qp.info();
        // INIT (no remote access: SEND only), then the receives, before
        // the exchange: the peer may send as soon as it has our address.
        let [to_init, _, _] = qp.connect_steps(&local, &attr);
        qp.modify(&to_init).map_err(e("modify to INIT"))?;
        let recv_sge = [buf.sge(0, size as u32)];
        let recvs: Vec<RecvWr> = (0..rx_depth)
            .map(|_| RecvWr {
                wr_id: RECV_WRID,
                sges: &recv_sge,
            })
            .collect();
        qp.post_recv(&recvs)
            .map_err(|p| format!("post_recv: {p}{}", Dev::detail()))?;
        let mut routs = rx_depth;
        println!("{}", address_line("local address: ", &local));

        // RTR and RTS towards `remote`. Its message carries no MTU: both
        // sides use --mtu (capped by the port's active MTU).
        let mut to_rts = |remote: &QpInfo| -> rdma_direct::Result<()> {
            let remote = QpInfo {
                mtu: rc.mtu,
                ..*remote
            };
            let [_, rtr, rts] = qp.connect_steps(&remote, &attr);
            qp.modify(&rtr)?;
            qp.modify(&rts)
        };
        let remote = match &rc.connect {
            None => {
                let l = TcpListener::bind(("0.0.0.0", rc.port))
                    .or_else(|_| TcpListener::bind(("::", rc.port)))
                    .map_err(|x| format!("listen on TCP port {}: {x}", rc.port))?;
                let mut c = OobConn::accept(&l, rc.timeout)
                    .map_err(|x| format!("no client connected to TCP port {}: {x}", rc.port))?;
                drop(l);
                c.server_exchange(&local, |r| to_rts(r))
                    .map_err(|x| format!("address exchange: {x}{}", Dev::detail()))?
            }
            Some(host) => {
                let mut c = OobConn::connect(&host_port(host, rc.port), rc.timeout)
                    .map_err(|x| format!("connect to {host} port {}: {x}", rc.port))?;
                let r = c
                    .client_exchange(&local)
                    .map_err(|x| format!("address exchange: {x}"))?;
                drop(c);
                to_rts(&r).map_err(|x| format!("connect QP: {x}{}", Dev::detail()))?;
                r
            }
        };
        println!("{}", address_line("remote address:", &remote));

        if rc.chk && rc.connect.is_some() {
            // ibv_rc_pingpong -c: byte 0 of every page becomes 0.
            for b in buf.as_mut_slice().iter_mut().step_by(page_size()) {
                *b = 0;
            }
        }
        let iters = args.iters as u64;
        let send_sge = [buf.sge(0, size as u32)];
        let data: [&[u8]; 1] = [&buf.as_slice()[..size]];
        let send = if inline {
            SendWr::inline(SEND_WRID, SendOp::Send, &data, SendFlags::SIGNALED)
        } else {
            SendWr::new(SEND_WRID, SendOp::Send, &send_sge, SendFlags::SIGNALED)
        };
        let post_send = |qp: &mut rdma_direct::api::Qp<Dev>| {
            qp.post_send_one(&send)
                .map_err(|x| format!("Couldn't post send: {x}{}", Dev::detail()))
        };

        let mut pending = RECV_WRID;
        if rc.connect.is_some() {
            post_send(&mut qp)?;
            pending |= SEND_WRID;
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt) = (0u64, 0u64);
        let mut wc = [Wc::default(); 2];
        let mut last = Instant::now();
        let mut idle = 0u32;
        while rcnt < iters || scnt < iters {
            let n = cq
                .poll(&mut qp, &mut wc)
                .map_err(|x| format!("poll CQ: {x}{}", Dev::detail()))?;
            if n == 0 {
                idle = idle.wrapping_add(1);
                if idle % 1024 == 0 && last.elapsed() > STALL {
                    return Err(format!(
                        "no completion for {STALL:?} ({rcnt} received, {scnt} sent of {iters})"
                    ));
                }
                // Spin, but let a software device (rxe, siw) sharing
                // the CPU run now and then.
                if idle % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    spin_loop();
                }
                continue;
            }
            last = Instant::now();
            for w in &wc[..n] {
                if w.status != WcStatus::SUCCESS {
                    return Err(format!(
                        "Failed status {} ({}) for wr_id {}",
                        status_name(w.status),
                        w.status.0,
                        w.wr_id
                    ));
                }
                match w.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        routs = routs.saturating_sub(1);
                        if routs <= 1 {
                            let more = (rx_depth - routs) as usize;
                            qp.post_recv(&recvs[..more]).map_err(|x| {
                                format!("Couldn't post receive: {x}{}", Dev::detail())
                            })?;
                            routs = rx_depth;
                        }
                        rcnt += 1;
                    }
                    other => {
                        return Err(format!("Completion for unknown wr_id {other}"));
                    }
                }
                pending &= !w.wr_id;
                if scnt < iters && pending == 0 {
                    post_send(&mut qp)?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        let usec = (start.elapsed().as_secs_f64() * 1e6).max(1.0);
        let bytes = size as u64 * iters * 2;
        println!(
            "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
            usec / 1e6,
            bytes as f64 * 8.0 / usec
        );
        println!(
            "{iters} iters in {:.2} seconds = {:.2} usec/iter",
            usec / 1e6,
            usec / iters as f64
        );
        if rc.chk && rc.connect.is_none() {
            let page = page_size();
            let bad: Vec<usize> = buf
                .as_slice()
                .iter()
                .step_by(page)
                .enumerate()
                .filter(|&(_, &b)| b != 0)
                .map(|(i, _)| i)
                .collect();
            for p in &bad {
                println!("invalid data in page {p}");
            }
            if !bad.is_empty() {
                return Err(format!("--chk: {} page(s) with invalid data", bad.len()));
            }
        }
        Ok(())
    }
}
