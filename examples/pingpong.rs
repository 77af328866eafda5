//! RC SEND/RECV ping-pong latency on the software HCA, in the style of
//! perftest's `ib_send_lat`.
//!
//! Two RC QPs on one [`SoftDevice`] running its device thread. A client
//! thread and a server thread each own one QP and its CQ. The client sends
//! a message, the server answers with a message of the same size, and the
//! client times the round trip with [`Instant`]. The table reports one-way
//! latency (round trip / 2). Warm-up iterations are not recorded.
//!
//! Both sides pre-post a ring of receives and re-post each buffer after
//! checking it; every payload byte is checked on both sides, and the
//! program exits non-zero on any bad completion status or payload.
//!
//! Run: `cargo run --release --example pingpong [-- --size N --iters N
//! --warmup N]` (defaults: 64 bytes, 10000 iterations, 1000 warm-up).
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

type Dev = SoftDevice;

struct Args {
    size: usize,
    iters: usize,
    warmup: usize,
}

fn usage() -> String {
    "usage: pingpong [--size BYTES] [--iters N] [--warmup N]".to_string()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        size: 64,
        iters: 10_000,
        warmup: 1_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<usize, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse::<usize>()
                .map_err(|_| format!("{name}: not a number: {v}"))
        };
        match flag.as_str() {
            "--size" | "-s" => a.size = value("--size")?,
            "--iters" | "-n" => a.iters = value("--iters")?,
            "--warmup" => a.warmup = value("--warmup")?,
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    if a.size == 0 || a.size > 1 << 24 {
        return Err("--size must be between 1 and 2^24 (16 MiB)".into());
    }
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
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
struct Side {
    id: u8,
    qp: Qp<Dev>,
    cq: Cq<Dev>,
    recv: Mr<Dev>,
    send: Mr<Dev>,
    size: usize,
    inline: bool,
    sends_posted: u64,
    sends_done: u64,
    /// Idle budget (see [`spin_budget`]).
    spin: u32,
}

impl Side {
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

fn run_client(
    mut s: Side,
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
    // The reply's CQE follows our send's CQE on the same device, so every
    // send has completed by now.
    if s.sends_done != s.sends_posted {
        return Err(format!(
            "{} sends posted, {} completed",
            s.sends_posted, s.sends_done
        ));
    }
    Ok(rtt_ns)
}

fn run_server(mut s: Side, total: usize, abort: &AtomicBool) -> Result<(), String> {
    for i in 0..total as u64 {
        let slot = s.wait_recv(abort)?;
        // Answer first, check afterwards: the check is off the round trip.
        s.send(i)?;
        s.consume(slot, 0, i)?;
    }
    // Wait for the last reply's send completion.
    let mut wc = [Wc::default(); 4];
    let mut idle = Idle::new(s.spin);
    while s.sends_done < s.sends_posted {
        let n =
            s.cq.poll(&mut s.qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
        for w in &wc[..n] {
            if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::SEND {
                return Err(format!("unexpected final completion {w:?}"));
            }
            s.sends_done += 1;
        }
        if n == 0 {
            idle.wait(abort)?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let e = |what: &str| {
        let what = what.to_string();
        move |err: rdma_direct::Error| format!("{what}: {err}")
    };
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
    let (ic, is) = (client.qp.info(), server.qp.info());
    client
        .qp
        .connect(&is, &ConnectAttr::default())
        .map_err(e("connect"))?;
    server
        .qp
        .connect(&ic, &ConnectAttr::default())
        .map_err(e("connect"))?;
    for slot in 0..RECV_DEPTH {
        client.post_recv_slot(slot)?;
        server.post_recv_slot(slot)?;
    }
    let inline = client.inline;
    let inline_max = client.qp.caps().max_inline_data;

    dev.backend().start();
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
    dev.backend().stop();
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
    println!(" Device         : soft (in-process software HCA, device thread)");
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
