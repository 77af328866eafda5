//! One server serves many clients from a single shared receive queue (SRQ),
//! and prints how much receive memory that takes against giving every
//! connection its own receive queue.
//!
//! `--clients` client QPs each connect to a server QP of their own; every
//! server QP is attached to one SRQ of `--depth` receive buffers of
//! `--size` bytes, on one CQ. The clients talk in rounds: in each round
//! `--active` of them (taken in turn) send a burst of `--burst` SENDs, as
//! request/response services see a few busy peers at a time out of many
//! connected ones. The server takes every message from whichever SRQ
//! buffer the device filled, checks it and posts that buffer back to the
//! SRQ.
//!
//! Every message carries its client's number, its sequence number and a
//! fill pattern derived from both. The server checks each one: the
//! completion's QP is the client's server QP, the length is `--size`, the
//! header and every byte of the pattern are right, and each client's
//! sequence numbers arrive in order with none missing (RC delivers a
//! connection's messages in order). At the end every client must have
//! delivered exactly `--rounds`-worth of its bursts; the program exits
//! non-zero otherwise.
//!
//! Receive memory, printed at the end: an SRQ needs as many buffers as can
//! be in flight across all connections at once (here `--active` ×
//! `--burst`, `--depth` by default twice that); per-connection receive
//! queues need every connection provisioned for its own burst, `--clients`
//! × `--burst` buffers, whether the connection is busy or idle. Both
//! counts include the receive WQEs (16 bytes per SGE on a QP's RQ; on an
//! SRQ the 16-byte next segment plus the SGE, rounded up to a power of
//! two).
//!
//! When the SRQ runs dry (a smaller `--depth`) the device answers a SEND
//! with an RNR NAK and the client retries (RNR retry 7: for ever), so the
//! run still completes; only slower.
//!
//! Run: `cargo run --release --example srq_server [-- --clients N --active
//! N --burst N --rounds N --size BYTES --depth N]` (defaults: 64 clients, 8
//! active, bursts of 8, 200 rounds, 512 bytes, depth 2 × active × burst).
//!
//! With `--device NAME` (builds with `--features verbs`) the same runs on a
//! kernel device: on rxe and siw on both data paths (the direct rings, the
//! default, and `RDMA_DIRECT_DATA_PATH=fallback`). A device or data path
//! without SRQs (the mlx5 direct path) is refused up front: the program
//! says so and exits with status 2, without running anything.
//!
//! **Two-process mode** (`--server`, or `--connect HOST`; with `--device`,
//! verbs only): `--num-qp` RC QPs per process on one SRQ, connected out of
//! band over TCP, wire-compatible with rdma-core's `ibv_srq_pingpong`
//! (either side can be that tool; see `wire.rs`):
//!
//! ```text
//! srq_server --device rxe0 --gid-idx 1 --server [--port 18515] [--size 4096]
//!            [--num-qp 16] [--rx-depth 500] [--iters 1000] [--mtu 1024]
//! srq_server --device rxe0 --gid-idx 1 --connect HOST [same options]
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, Srq, Wc, WcOpcode, WcStatus,
};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

#[path = "../common/mod.rs"]
mod common;
use common::{err, DevOpts, ExampleBackend, DEV_USAGE};

/// Give up if nothing completes for this long.
const STALL: Duration = Duration::from_secs(20);
/// Bytes of the header every message starts with: client, sequence.
const HEADER: usize = 8;
/// Address messages `ibv_srq_pingpong` exchanges each way, whatever its
/// `--num-qp` (the unused ones are all zeros): its `MAX_QP`.
const MAX_QP: usize = 256;

struct Args {
    clients: usize,
    active: usize,
    burst: usize,
    rounds: u64,
    size: usize,
    depth: u32,
    dev: DevOpts,
    /// The two-process mode (`ibv_srq_pingpong` compatible).
    wire: Option<WireArgs>,
}

/// The two-process (`ibv_srq_pingpong`) options.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
struct WireArgs {
    /// `None`: server; `Some(host)`: client of `host`.
    connect: Option<String>,
    port: u16,
    num_qp: usize,
    rx_depth: u32,
    mtu: u32,
    iters: u64,
    timeout: Duration,
}

fn usage() -> String {
    format!(
        "usage: srq_server [--clients 1..=1024] [--active N] [--burst 1..=64] [--rounds N] \
         [--size 8..=65536] [--depth N] {DEV_USAGE}\n       \
         srq_server --device NAME [--gid-idx N] (--server | --connect HOST) [--port 18515]\n       \
         \x20          [--size 4096] [--num-qp 16] [--rx-depth 500] [--iters 1000] [--mtu 1024]\n       \
         \x20          [--timeout SECS]   (ibv_srq_pingpong compatible; --features verbs)"
    )
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        clients: 64,
        active: 8,
        burst: 8,
        rounds: 200,
        size: 0,
        depth: 0,
        dev: DevOpts::default(),
        wire: None,
    };
    let (mut server, mut connect, mut port, mut num_qp, mut rx_depth, mut mtu, mut iters) =
        (false, None, 18515u64, 16u64, 500u64, 1024u64, 1000u64);
    let mut timeout = 60u64;
    // The last flag of each mode seen, to refuse a mix.
    let (mut local_flag, mut wire_flag) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if a.dev.take(&flag, &mut it)? {
            continue;
        }
        if flag == "--server" {
            server = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(usage());
        }
        const VALUED: &[&str] = &[
            "--connect",
            "--size",
            "-s",
            "--clients",
            "-c",
            "--active",
            "-a",
            "--burst",
            "-b",
            "--rounds",
            "--depth",
            "--port",
            "-p",
            "--num-qp",
            "-q",
            "--rx-depth",
            "-r",
            "--mtu",
            "-m",
            "--iters",
            "-n",
            "--timeout",
        ];
        if !VALUED.contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag}\n{}", usage()));
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--connect" {
            connect = Some(v);
            continue;
        }
        let n = v
            .parse::<u64>()
            .map_err(|_| format!("{flag}: not a number: {v}"))?;
        match flag.as_str() {
            "--size" | "-s" => a.size = n.min(1 << 30) as usize,
            "--clients" | "-c" => a.clients = n.min(1 << 20) as usize,
            "--active" | "-a" => a.active = n.min(1 << 20) as usize,
            "--burst" | "-b" => a.burst = n.min(1 << 20) as usize,
            "--rounds" => a.rounds = n,
            "--depth" => a.depth = n.min(u32::MAX as u64) as u32,
            "--port" | "-p" => port = n,
            "--num-qp" | "-q" => num_qp = n,
            "--rx-depth" | "-r" => rx_depth = n,
            "--mtu" | "-m" => mtu = n,
            "--iters" | "-n" => iters = n,
            "--timeout" => timeout = n,
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
        match flag.as_str() {
            "--size" | "-s" => {}
            "--clients" | "-c" | "--active" | "-a" | "--burst" | "-b" | "--rounds" | "--depth" => {
                local_flag = Some(flag)
            }
            _ => wire_flag = Some(flag),
        }
    }
    let two_process = server || connect.is_some();
    if server && connect.is_some() {
        return Err("--server and --connect exclude each other".into());
    }
    match (two_process, local_flag, wire_flag) {
        (false, _, Some(f)) => {
            return Err(format!(
                "{f} belongs to the two-process mode: add --server or --connect HOST\n{}",
                usage()
            ))
        }
        (true, Some(f), _) => {
            return Err(format!(
                "{f} belongs to the in-process mode, not --server/--connect"
            ))
        }
        _ => {}
    }
    if two_process {
        if cfg!(not(feature = "verbs")) || a.dev.device.is_none() {
            return Err(
                "--server/--connect run on a kernel RDMA device: give --device NAME, and \
                 build with --features verbs"
                    .into(),
            );
        }
        if a.size == 0 {
            a.size = 4096;
        }
        if a.size > 1 << 24 {
            return Err("--size must be between 1 and 2^24 (16 MiB)".into());
        }
        if !(1..=MAX_QP as u64).contains(&num_qp) {
            return Err(format!("--num-qp must be between 1 and {MAX_QP}"));
        }
        if rx_depth < num_qp || rx_depth > 1 << 15 {
            return Err(format!(
                "--rx-depth {rx_depth} is too small for {num_qp} QPs (at least one receive \
                 per QP) or above 32768"
            ));
        }
        if ![256, 512, 1024, 2048, 4096].contains(&mtu) {
            return Err("--mtu must be 256, 512, 1024, 2048 or 4096".into());
        }
        if iters == 0 || iters > 1 << 31 {
            return Err("--iters must be between 1 and 2^31".into());
        }
        a.wire = Some(WireArgs {
            connect,
            port: u16::try_from(port).map_err(|_| "--port must be at most 65535".to_string())?,
            num_qp: num_qp as usize,
            rx_depth: rx_depth as u32,
            mtu: mtu as u32,
            iters,
            timeout: Duration::from_secs(timeout.max(1)),
        });
        return Ok(a);
    }
    if a.size == 0 {
        a.size = 512;
    }
    if a.clients == 0 || a.clients > 1024 {
        return Err("--clients must be between 1 and 1024".into());
    }
    if a.active == 0 || a.active > a.clients {
        return Err("--active must be between 1 and --clients".into());
    }
    if a.burst == 0 || a.burst > 64 {
        return Err("--burst must be between 1 and 64".into());
    }
    if a.rounds == 0 || a.rounds > 1 << 24 {
        return Err("--rounds must be between 1 and 2^24".into());
    }
    if a.size < HEADER || a.size > 65536 {
        return Err(format!("--size must be between {HEADER} and 65536"));
    }
    if a.depth == 0 {
        a.depth = (2 * a.active * a.burst) as u32;
    }
    if a.depth > 32767 {
        return Err("--depth must be at most 32767".into());
    }
    Ok(a)
}

/// Byte `i` of the message `seq` of `client`.
fn fill(client: u32, seq: u32, i: usize) -> u8 {
    (client.wrapping_mul(31) ^ seq.wrapping_mul(7) ^ i as u32) as u8
}

/// Writes message `seq` of `client` into `buf`.
fn compose(buf: &mut [u8], client: u32, seq: u32) {
    buf[..4].copy_from_slice(&client.to_le_bytes());
    buf[4..HEADER].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf.iter_mut().enumerate().skip(HEADER) {
        *b = fill(client, seq, i);
    }
}

/// Checks a received message; returns its (client, seq).
fn inspect(buf: &[u8]) -> Result<(u32, u32), String> {
    let word = |at: usize| u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let (client, seq) = (word(0), word(4));
    if let Some(i) = (HEADER..buf.len()).find(|&i| buf[i] != fill(client, seq, i)) {
        return Err(format!(
            "message {seq} of client {client}: byte {i} is {:#04x}, expected {:#04x}",
            buf[i],
            fill(client, seq, i)
        ));
    }
    Ok((client, seq))
}

/// The receive WQE bytes of `n` receives of one SGE: on an SRQ the 16-byte
/// next segment plus a 16-byte data segment (32, a power of two); on a QP's
/// RQ one 16-byte data segment.
fn wqe_bytes(n: u64, srq: bool) -> u64 {
    n * if srq { 32 } else { 16 }
}

/// How a run ended (errors aside).
enum Outcome {
    Ok,
    Wrong,
    /// Nothing ran: the device (or its data path) cannot do this (why).
    NotRun(String),
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
        Ok(Outcome::NotRun(why)) => {
            eprintln!("srq_server: NOT RUN: {why}");
            ExitCode::from(common::EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("srq_server: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Picks the device.
fn dispatch(args: &Args) -> Result<Outcome, String> {
    #[cfg(feature = "verbs")]
    if let Some(dev) = common::open_verbs(&args.dev)? {
        if let Some(w) = &args.wire {
            return wire::run(&dev, args, w);
        }
        return run(dev, args);
    }
    run(Device::new(SoftDevice::new(SoftConfig::default())), args)
}

/// The server side: its QPs (index = client), their CQ, the SRQ and its
/// buffers.
struct Server<B: ExampleBackend> {
    qps: Vec<Qp<B>>,
    cq: Cq<B>,
    srq: Srq<B>,
    bufs: Mr<B>,
    size: usize,
    /// Buffers posted (`--depth`; the SRQ may hold more).
    depth: usize,
    /// Next sequence number expected from each client.
    next: Vec<u32>,
    /// Client of each server QP number.
    by_qpn: std::collections::HashMap<u32, u32>,
    received: u64,
}

impl<B: ExampleBackend> Server<B> {
    /// Posts SRQ buffer `slot` (wr_id = slot).
    fn post(&mut self, slot: usize) -> Result<(), String> {
        let sge = [self.bufs.sge(slot * self.size, self.size as u32)];
        self.srq
            .post_recv_one(&RecvWr {
                wr_id: slot as u64,
                sges: &sge,
            })
            .map_err(err::<B>("srq post_recv"))
    }

    /// Takes what the CQ holds: checks each message and gives its buffer
    /// back to the SRQ. Returns how many it took.
    fn drain(&mut self, wc: &mut [Wc]) -> Result<usize, String> {
        let mut refs: Vec<&mut Qp<B>> = self.qps.iter_mut().collect();
        let n = self
            .cq
            .poll(&mut self.srq.route(&mut refs[..]), wc)
            .map_err(err::<B>("server poll"))?;
        drop(refs);
        for w in &wc[..n] {
            if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::RECV {
                return Err(format!("server completion {w:?}"));
            }
            let slot = w.wr_id as usize;
            if slot >= self.depth || w.byte_len as usize != self.size {
                return Err(format!(
                    "server completion names slot {slot}, {} bytes",
                    w.byte_len
                ));
            }
            let at = slot * self.size;
            let (client, seq) = inspect(&self.bufs.as_slice()[at..at + self.size])?;
            let from = self.by_qpn.get(&w.qp_num).copied();
            if from != Some(client) {
                return Err(format!(
                    "message of client {client} arrived on server QP {:#x} (client {from:?})",
                    w.qp_num
                ));
            }
            let want = &mut self.next[client as usize];
            if seq != *want {
                return Err(format!(
                    "client {client}: message {seq} arrived, expected {want}"
                ));
            }
            *want += 1;
            self.received += 1;
            self.post(slot)?;
        }
        Ok(n)
    }
}

fn run<B: ExampleBackend>(dev: Device<B>, args: &Args) -> Result<Outcome, String> {
    let e = |what: &'static str| err::<B>(what);
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let srq = match pd.create_srq(args.depth, 1) {
        Ok(s) => s,
        Err(Error::Unsupported) => {
            return Ok(Outcome::NotRun(format!(
                "{} (this data path) has no shared receive queues (the mlx5 direct path has \
                 none: run with RDMA_DIRECT_DATA_PATH=fallback)",
                dev.backend().name()
            )))
        }
        Err(x) => return Err(e("create_srq")(x)),
    };
    let burst = args.burst as u32;
    let client_init = QpInit {
        max_send_wr: burst,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    let server_init = QpInit {
        max_send_wr: 1,
        srq: Some(srq.id()),
        ..client_init
    };
    let ccq = dev
        .create_cq(dev.cq_depth_for(&vec![&client_init; args.clients]))
        .map_err(e("create_cq"))?;
    let scq_depth = dev.cq_depth_for(&vec![&server_init; args.clients]) + srq.max_wr();
    let scq = dev.create_cq(scq_depth).map_err(e("create_cq"))?;
    let bufs = pd
        .register(args.depth as usize * args.size, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let mut sends = pd
        .register(args.clients * args.burst * args.size, Access::NONE)
        .map_err(e("register"))?;
    let mut clients = Vec::new();
    let mut server = Server {
        qps: Vec::new(),
        cq: scq,
        srq,
        bufs,
        size: args.size,
        depth: args.depth as usize,
        next: vec![0; args.clients],
        by_qpn: Default::default(),
        received: 0,
    };
    let mut links = Vec::new();
    B::start(&dev);
    let rnr = ConnectAttr {
        rnr_retry: 7,
        ..Default::default()
    };
    for c in 0..args.clients {
        let mut qc = pd
            .create_qp(&ccq, &ccq, &client_init)
            .map_err(e("create_qp"))?;
        let mut qs = pd
            .create_qp(&server.cq, &server.cq, &server_init)
            .map_err(e("create_qp on the SRQ"))?;
        links.push(B::connect_pair(
            &dev, &mut qc, &mut qs, &rnr, &rnr, &args.dev,
        )?);
        server.by_qpn.insert(qs.qpn(), c as u32);
        clients.push(qc);
        server.qps.push(qs);
    }
    for slot in 0..server.depth {
        server.post(slot)?;
    }
    let mut ccq = ccq;
    let mut sent = vec![0u32; args.clients];
    let mut wc = vec![Wc::default(); 64];
    let t0 = Instant::now();
    let mut turn = 0usize;
    for _ in 0..args.rounds {
        let mut outstanding = 0usize;
        for _ in 0..args.active {
            let c = turn % args.clients;
            turn += 1;
            let base = c * args.burst * args.size;
            for k in 0..args.burst {
                let at = base + k * args.size;
                compose(
                    &mut sends.as_mut_slice()[at..at + args.size],
                    c as u32,
                    sent[c] + k as u32,
                );
            }
            let sges: Vec<_> = (0..args.burst)
                .map(|k| [sends.sge(base + k * args.size, args.size as u32)])
                .collect();
            let wrs: Vec<_> = sges
                .iter()
                .enumerate()
                .map(|(k, s)| SendWr::new(k as u64, SendOp::Send, s, SendFlags::SIGNALED))
                .collect();
            clients[c]
                .post_send(&wrs)
                .map_err(|x| format!("client {c} post_send: {x}"))?;
            sent[c] += burst;
            outstanding += args.burst;
        }
        // The round ends when every send has completed at its client and
        // the server has checked every message.
        let want = server.received + outstanding as u64;
        let mut since = Instant::now();
        while outstanding > 0 || server.received < want {
            let mut refs: Vec<&mut Qp<B>> = clients.iter_mut().collect();
            let n = ccq.poll(&mut refs[..], &mut wc).map_err(e("client poll"))?;
            for w in &wc[..n] {
                if w.status != WcStatus::SUCCESS {
                    return Err(format!("client completion {w:?}"));
                }
            }
            outstanding -= n.min(outstanding);
            let m = server.drain(&mut wc)?;
            if n + m > 0 {
                since = Instant::now();
            } else if since.elapsed() > STALL {
                return Err(format!(
                    "nothing completed for {STALL:?} ({outstanding} sends outstanding, \
                     {} messages still to arrive)",
                    want - server.received
                ));
            } else {
                std::thread::yield_now();
            }
        }
    }
    let wall = t0.elapsed();
    B::stop(&dev);

    let ok = server.next.iter().zip(&sent).all(|(got, sent)| got == sent);
    let total: u64 = sent.iter().map(|&s| s as u64).sum();
    let depth = server.depth as u64;
    let size = args.size as u64;
    // The SRQ's WQE ring is as large as granted (max_wr + 1 entries, a
    // power of two), whatever is posted.
    let srq_bytes = depth * size + wqe_bytes(server.srq.max_wr() as u64 + 1, true);
    let per_qp = args.clients as u64 * args.burst as u64;
    let rq_bytes = per_qp * size + wqe_bytes(per_qp, false);

    let line = "-".repeat(92);
    println!("{line}");
    println!("                    One SRQ serving many RC clients");
    common::print_context(
        &dev,
        "SENDs delivered through one shared receive queue, every byte checked, \
         and the receive memory against one receive queue per connection",
        &["main (clients and server)"],
        15,
    );
    println!(
        " QPs            : {} client QPs -> {} server QPs on one SRQ ({} buffers posted, room for {})",
        args.clients,
        args.clients,
        depth,
        server.srq.max_wr()
    );
    println!(
        " Traffic        : {} rounds; each round {} clients send {} x {} B",
        args.rounds, args.active, args.burst, args.size
    );
    println!("{line}");
    println!(
        " {:<10} {:>12} {:>10} {:>12} {:>10}",
        "messages", "bytes", "time[ms]", "msgs/s", "check"
    );
    println!(
        " {:<10} {:>12} {:>10.1} {:>12.0} {:>10}",
        total,
        total * size,
        wall.as_secs_f64() * 1e3,
        total as f64 / wall.as_secs_f64(),
        if ok { "OK" } else { "FAILED" }
    );
    println!("{line}");
    println!(" Receive memory (buffers + receive WQEs):");
    println!(
        "   one SRQ                : {:>6} receives x {} B = {:>10} bytes",
        depth, args.size, srq_bytes
    );
    println!(
        "   a receive queue per QP : {:>6} receives x {} B = {:>10} bytes  ({} QPs x {})",
        per_qp, args.size, rq_bytes, args.clients, args.burst
    );
    println!(
        "   the SRQ needs {:.1}% of that ({:.2}x less)",
        100.0 * srq_bytes as f64 / rq_bytes as f64,
        rq_bytes as f64 / srq_bytes as f64
    );
    if !ok {
        for (c, (got, sent)) in server.next.iter().zip(&sent).enumerate() {
            if got != sent {
                eprintln!("srq_server: client {c}: sent {sent}, server checked {got}");
            }
        }
    }
    drop(clients);
    drop(links);
    Ok(if ok { Outcome::Ok } else { Outcome::Wrong })
}

/// The two-process mode, compatible with rdma-core's `ibv_srq_pingpong`.
#[cfg(feature = "verbs")]
mod wire;
