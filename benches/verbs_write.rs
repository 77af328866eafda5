//! RDMA WRITE message rate and latency through the verbs backend's
//! data paths (`ibv_post_send` chains and `ibv_poll_cq`), shaped
//! like perftest's `ib_write_bw` and `ib_write_lat` so the two can be
//! compared on the same device. `scripts/vm-bench.sh` runs both inside the
//! test VM and prints the comparison; results are in `docs/benchmarks.md`
//! ("Verbs backend vs perftest").
//!
//! Usage:
//! `verbs_write --mode bw|lat --device NAME [--size BYTES] [--iters N]
//! [--tx-depth N] [--cq-mod N] [--batch N] [--warmup N] [--ip ADDR]
//! [--gid-index N] [--data-path auto|direct|fallback]`
//!
//! `--data-path` picks the backend's data path ([`DataPath`]): on rxe and
//! siw `direct` is rdma-direct's own rings (WQEs written by us, one empty
//! POST_SEND per chain as the doorbell), `fallback` is libibverbs'
//! provider (`ibv_post_send` with a chain per call; `--batch 1` is one WR
//! per call, as perftest posts). The bw line reports the write() system
//! calls the process made during the timed loop, per WR (`syscw` of
//! /proc/self/io: on rxe and siw every doorbell is one write()).
//!
//! Both QPs live on one device in this process (as in
//! `tests/verbs_device.rs`; perftest runs a server and a client process):
//! RoCE/InfiniBand QPs are connected directly, iWARP QPs through rdma_cm
//! (`--ip` is the device's address; without it the `RXE_*`/`SIW_*`
//! variables of the test VM are used). Each QP's send queue holds
//! `--tx-depth` WRs, as perftest's does; each CQ holds twice that (at
//! least 16; perftest: the tx depth), see `pair`.
//!
//! * **bw** (like `ib_write_bw`): one thread posts RDMA WRITEs of `--size`
//!   bytes from QP a into a region behind QP b, keeping at most
//!   `--tx-depth` (128) WRs outstanding. WR number k is signaled when
//!   `k % cq_mod == cq_mod - 1` or it is the last one, as perftest does
//!   with its CQ moderation (`--cq-mod`, 100; perftest uses 1 above 8 KiB,
//!   and `vm-bench.sh` passes the value perftest printed). A signaled
//!   completion for WR k means WRs 0..=k are done. WRs go to
//!   [`Qp::post_send`] in chains of up to `--batch` (32) per call, as many
//!   as the window allows; perftest posts one WR per `ibv_post_send`. The
//!   CQ is polled 16 entries at a time between rounds of posting, as
//!   perftest does. For sizes up to 2 KiB the local and remote addresses
//!   step through a 4 KiB buffer in cache-line-rounded slots, as
//!   perftest's do. `--warmup` (default: one tx depth) WRs run first,
//!   unmeasured; then `--iters` WRs are timed from just before the first
//!   post to the poll that returns the last completion (perftest's
//!   `tposted[0]` to `tcompleted[iters-1]`). The posting thread's user and
//!   system CPU time over that window (`getrusage`) is reported per WR.
//! * **lat** (like `ib_write_lat`): two threads, one per QP, ping-pong.
//!   Each side sets the last byte of its source buffer to its send count,
//!   WRITEs `--size` bytes into the peer's landing buffer (signaled, no
//!   inline data: perftest reports "Max inline data: 0" on rxe and siw),
//!   then busy-polls its CQ for that completion; before each send after
//!   the first it busy-polls the last byte of its own landing buffer for
//!   the peer's count. Side a starts. The latency of iteration i is half
//!   the time between side a's posts i and i+1; `t_typical` is the median
//!   of those `iters - 1` samples, as perftest computes it. Timestamps
//!   come from the TSC, like perftest's (the VM's clock is an emulated
//!   HPET: one `Instant::now()` costs about 9 µs there).
//!
//! Output: one line, `verbs_write mode=... key=value ...` (see `main`).
//! Exit status 0 on success, 1 on a failure (printed on stderr), 2 on bad
//! arguments or when no RDMA device is present.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, Backend, ConnectAttr, Cq, Device, Mr, Pd, Qp, QpInit, QpState, Transport, Wc, WcStatus,
};
use rdma_direct::verbs::cm::{self, CmConnection, CmListener, CmOptions};
use rdma_direct::verbs::{DataPath, VerbsConfig, VerbsDevice};
use rdma_direct::{Remote, SendFlags, SendOp, SendWr, Sge};

type Dev = VerbsDevice;

/// perftest's `CTX_POLL_BATCH`.
const POLL_BATCH: usize = 16;
/// Largest `--batch`.
const MAX_BATCH: usize = 128;
/// perftest's cycle buffer (a page) and cache-line size, for the address
/// stepping of small messages.
const CYCLE_BUFFER: usize = 4096;
const CACHE_LINE: usize = 64;
/// Give up when nothing moves for this long.
const STALL: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bw,
    Lat,
}

struct Args {
    mode: Mode,
    device: String,
    size: usize,
    iters: u64,
    tx_depth: u32,
    cq_mod: u64,
    batch: usize,
    warmup: u64,
    ip: Option<IpAddr>,
    gid_index: Option<u8>,
    data_path: DataPath,
}

fn usage() -> String {
    "usage: verbs_write --mode bw|lat --device NAME [--size BYTES] [--iters N] \
     [--tx-depth N] [--cq-mod N] [--batch N] [--warmup N] [--ip ADDR] [--gid-index N] \
     [--data-path auto|direct|fallback]"
        .into()
}

fn parse_args() -> Result<Args, String> {
    let mut mode = None;
    let mut device = None;
    let mut size = 8usize;
    let mut iters = None;
    let mut tx_depth = None;
    let mut cq_mod = 100u64;
    let mut batch = 32usize;
    let mut warmup = None;
    let mut ip = None;
    let mut gid_index = None;
    let mut data_path = DataPath::Auto;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--bench" {
            continue; // passed by `cargo bench`
        }
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{a} {v}: {e}"));
        match a.as_str() {
            "--mode" => {
                mode = Some(match val()?.as_str() {
                    "bw" => Mode::Bw,
                    "lat" => Mode::Lat,
                    m => return Err(format!("unknown mode {m}")),
                })
            }
            "--device" => device = Some(val()?),
            "--size" => size = num(val()?)? as usize,
            "--iters" => iters = Some(num(val()?)?),
            "--tx-depth" => tx_depth = Some(num(val()?)? as u32),
            "--cq-mod" => cq_mod = num(val()?)?,
            "--batch" => batch = num(val()?)? as usize,
            "--warmup" => warmup = Some(num(val()?)?),
            "--ip" => {
                let v = val()?;
                ip = Some(v.parse().map_err(|e| format!("--ip {v}: {e}"))?)
            }
            "--gid-index" => gid_index = Some(num(val()?)? as u8),
            "--data-path" => {
                data_path = match val()?.as_str() {
                    "auto" => DataPath::Auto,
                    "direct" => DataPath::Direct,
                    "fallback" | "portable" => DataPath::Fallback,
                    p => return Err(format!("unknown data path {p}")),
                }
            }
            "-h" | "--help" => return Err(usage()),
            _ => return Err(format!("unknown argument {a}\n{}", usage())),
        }
    }
    let mode = mode.ok_or_else(usage)?;
    let device = device.ok_or_else(usage)?;
    // perftest's defaults: BW 5000 iterations and tx depth 128, LAT 1000
    // iterations and tx depth 1.
    let (def_iters, def_depth) = match mode {
        Mode::Bw => (5000, 128),
        Mode::Lat => (1000, 1),
    };
    let tx_depth = tx_depth.unwrap_or(def_depth);
    let a = Args {
        mode,
        device,
        size,
        iters: iters.unwrap_or(def_iters),
        tx_depth,
        cq_mod,
        batch,
        warmup: warmup.unwrap_or(u64::from(tx_depth)),
        ip,
        gid_index,
        data_path,
    };
    if a.size == 0 || a.size > (1 << 30) {
        return Err("--size must be 1..=2^30".into());
    }
    if a.iters < 2 || a.tx_depth == 0 || a.cq_mod == 0 {
        return Err("--iters must be >= 2, --tx-depth and --cq-mod >= 1".into());
    }
    if a.batch == 0 || a.batch > MAX_BATCH {
        return Err(format!("--batch must be 1..={MAX_BATCH}"));
    }
    Ok(a)
}

/// The device's IPv4 address for rdma_cm: `--ip`, else the test VM's
/// variables for the device of that name.
fn device_ip(a: &Args) -> Option<IpAddr> {
    if a.ip.is_some() {
        return a.ip;
    }
    for (d, ip) in [("RXE_DEV", "RXE_IP"), ("SIW_DEV", "SIW_IP")] {
        if std::env::var(d).ok().as_deref() == Some(a.device.as_str()) {
            return std::env::var(ip).ok()?.parse().ok();
        }
    }
    None
}

/// Two connected QPs on one device, with their CQs.
struct Pair {
    a: Qp<Dev>,
    b: Qp<Dev>,
    cq_a: Cq<Dev>,
    cq_b: Cq<Dev>,
    pd: Pd<Dev>,
    transport: Transport,
    data_path: DataPath,
    // Dropped after the QPs are done with (declared last).
    _conns: Vec<CmConnection>,
}

fn err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| {
        format!(
            "{what}: {e:?} (last provider error {:?})",
            rdma_direct::verbs::last_error()
        )
    }
}

fn pair(a: &Args) -> Result<Pair, String> {
    let dev = Device::new(
        VerbsDevice::open(&VerbsConfig {
            device: Some(a.device.clone()),
            port: 1,
            gid_index: a.gid_index,
            data_path: a.data_path,
        })
        .map_err(err("open device"))?,
    );
    let transport = dev.backend().port().transport;
    let data_path = dev.backend().data_path();
    let pd = dev.alloc_pd().map_err(err("alloc_pd"))?;
    // perftest sizes the send queue and the send CQ to the tx depth. Our
    // CQs get twice that (at least 16) so they also hold the receive
    // queue's worst case; on rxe and siw a CQ is a ring in user memory, so
    // its size costs memory, not time.
    let cq_depth = (2 * a.tx_depth).max(16);
    let cq_a = dev.create_cq(cq_depth).map_err(err("create_cq"))?;
    let cq_b = dev.create_cq(cq_depth).map_err(err("create_cq"))?;
    let init = QpInit {
        max_send_wr: a.tx_depth,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    let mut qa = pd
        .create_qp(&cq_a, &cq_a, &init)
        .map_err(err("create_qp"))?;
    let mut qb = pd
        .create_qp(&cq_b, &cq_b, &init)
        .map_err(err("create_qp"))?;
    let mut conns = Vec::new();
    if transport == Transport::Iwarp {
        let ip = device_ip(a).ok_or("iWARP needs --ip (the device's IPv4 address)")?;
        let (ca, cb) = cm::retry(3, Duration::from_millis(200), || {
            let l = CmListener::bind(SocketAddr::new(ip, 0), 4)?;
            let dst = SocketAddr::new(ip, l.port());
            let opts = CmOptions::default();
            thread::scope(|s| {
                let server = s.spawn(|| l.accept(&mut qb, &opts, |_| Ok(())));
                let client = cm::connect(&mut qa, dst, None, &opts, |_| Ok(()));
                let server = server.join().map_err(|_| rdma_direct::Error::Timeout)?;
                Ok((client?, server?))
            })
        })
        .map_err(err("rdma_cm connection"))?;
        conns.push(ca);
        conns.push(cb);
    } else {
        let attr = ConnectAttr {
            access: Access::REMOTE_WRITE,
            gid_index: a.gid_index,
            ..ConnectAttr::default()
        };
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib, &attr).map_err(err("connect a"))?;
        qb.connect(&ia, &attr).map_err(err("connect b"))?;
    }
    if qa.state() != QpState::Rts || qb.state() != QpState::Rts {
        return Err("QPs did not reach RTS".into());
    }
    Ok(Pair {
        a: qa,
        b: qb,
        cq_a,
        cq_b,
        pd,
        transport,
        data_path,
        _conns: conns,
    })
}

/// CPU time this thread has used, user and system, in µs
/// (`getrusage(RUSAGE_THREAD)`).
fn thread_cpu_us() -> (f64, f64) {
    // SAFETY: all-zero is a valid rusage.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a valid out-pointer; RUSAGE_THREAD needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    (us(ru.ru_utime), us(ru.ru_stime))
}

/// write() system calls this process has made (`syscw` in
/// /proc/self/io; 0 if the kernel does not account them).
fn write_syscalls() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("syscw: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Counters of one bw run.
#[derive(Default)]
struct BwStats {
    secs: f64,
    /// User and system CPU time of the posting thread during the run.
    user_us: f64,
    sys_us: f64,
    post_calls: u64,
    /// write() system calls of the process during the run.
    write_calls: u64,
    polls: u64,
    empty_polls: u64,
    cqes: u64,
}

/// The perftest address stepping: WR k uses slot `k % slots`.
fn slots(size: usize) -> (usize, usize) {
    if size <= CYCLE_BUFFER / 2 {
        let inc = size.div_ceil(CACHE_LINE) * CACHE_LINE;
        (CYCLE_BUFFER / inc, inc)
    } else {
        (1, 0)
    }
}

/// Posts `iters` WRITEs keeping at most `tx_depth` outstanding, as
/// `ib_write_bw`'s `run_iter_bw` does, and waits for the last completion.
#[allow(clippy::too_many_arguments)]
fn run_bw(
    qp: &mut Qp<Dev>,
    cq: &mut Cq<Dev>,
    local: &[[Sge; 1]],
    remote: &[Remote],
    iters: u64,
    tx_depth: u64,
    cq_mod: u64,
    batch: usize,
) -> Result<BwStats, String> {
    let mut st = BwStats::default();
    let template = SendWr::new(
        0,
        SendOp::Write { remote: remote[0] },
        &local[0],
        SendFlags::NONE,
    );
    let mut wrs = [template; MAX_BATCH];
    let mut wc = [Wc::default(); POLL_BATCH];
    let nslots = local.len() as u64;
    let (mut scnt, mut ccnt) = (0u64, 0u64);
    // Stall detection reads the clock only after many empty polls in a
    // row, so the loop itself makes no clock reads.
    let mut idle = 0u64;
    let mut stalled_since: Option<Instant> = None;
    let w0 = write_syscalls();
    let cpu0 = thread_cpu_us();
    let t0 = Instant::now();
    while ccnt < iters {
        // Post while the window has room, a chain of up to `batch` per call.
        let mut room = (iters - scnt).min(tx_depth + ccnt - scnt);
        while room > 0 {
            let n = (room as usize).min(batch);
            for (k, w) in wrs[..n].iter_mut().enumerate() {
                let idx = scnt + k as u64;
                let slot = (idx % nslots) as usize;
                let signaled = idx % cq_mod == cq_mod - 1 || idx == iters - 1;
                *w = SendWr::new(
                    idx,
                    SendOp::Write {
                        remote: remote[slot],
                    },
                    &local[slot],
                    if signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                );
            }
            qp.post_send(&wrs[..n]).map_err(|e| {
                format!(
                    "post_send of WR {}: {:?} (last provider error {:?})",
                    scnt + e.index as u64,
                    e.error,
                    rdma_direct::verbs::last_error()
                )
            })?;
            st.post_calls += 1;
            scnt += n as u64;
            room -= n as u64;
        }
        let got = cq.poll(qp, &mut wc).map_err(err("poll"))?;
        st.polls += 1;
        if got == 0 {
            st.empty_polls += 1;
            idle += 1;
            if idle % (1 << 16) == 0 {
                let since = *stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() > STALL {
                    return Err(format!("stalled at {ccnt} of {iters} completions"));
                }
            }
            continue;
        }
        idle = 0;
        stalled_since = None;
        for w in &wc[..got] {
            if w.status != WcStatus::SUCCESS {
                return Err(format!("completion error: {w:?}"));
            }
            // A completion for WR k retires WRs 0..=k (RC completes in
            // order).
            ccnt = ccnt.max(w.wr_id + 1);
        }
        st.cqes += got as u64;
    }
    st.secs = t0.elapsed().as_secs_f64();
    let cpu1 = thread_cpu_us();
    st.write_calls = write_syscalls().saturating_sub(w0);
    (st.user_us, st.sys_us) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    Ok(st)
}

fn bw(a: &Args) -> Result<String, String> {
    let mut p = pair(a)?;
    let (nslots, inc) = slots(a.size);
    let len = a.size.max(CYCLE_BUFFER);
    let src =
        p.pd.register(len, Access::LOCAL_WRITE)
            .map_err(err("register"))?;
    let dst =
        p.pd.register(len, Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0))
            .map_err(err("register"))?;
    let local: Vec<[Sge; 1]> = (0..nslots)
        .map(|i| [src.sge(i * inc, a.size as u32)])
        .collect();
    let remote: Vec<Remote> = (0..nslots).map(|i| dst.remote(i * inc)).collect();
    let sq_cap = p.a.send_space();
    let depth = u64::from(a.tx_depth);
    if a.warmup > 0 {
        run_bw(
            &mut p.a,
            &mut p.cq_a,
            &local,
            &remote,
            a.warmup,
            depth,
            a.cq_mod,
            a.batch,
        )?;
    }
    let st = run_bw(
        &mut p.a,
        &mut p.cq_a,
        &local,
        &remote,
        a.iters,
        depth,
        a.cq_mod,
        a.batch,
    )?;
    let mpps = a.iters as f64 / st.secs / 1e6;
    // perftest's MB is 2^20 bytes.
    let mbs = (a.iters as f64 * a.size as f64) / st.secs / 1048576.0;
    Ok(format!(
        "verbs_write mode=bw device={} transport={:?} size={} iters={} tx_depth={} cq_mod={} \
         batch={} warmup={} sq_cap={} secs={:.6} msg_rate_mpps={:.6} bw_avg_mbs={:.2} \
         post_calls={} wrs_per_call={:.2} polls={} empty_polls={} cqes={} \
         user_us_per_wr={:.2} sys_us_per_wr={:.2} data_path={:?} write_calls_per_wr={:.4}",
        a.device,
        p.transport,
        a.size,
        a.iters,
        a.tx_depth,
        a.cq_mod,
        a.batch,
        a.warmup,
        sq_cap,
        st.secs,
        mpps,
        mbs,
        st.post_calls,
        a.iters as f64 / st.post_calls as f64,
        st.polls,
        st.empty_polls,
        st.cqes,
        st.user_us / a.iters as f64,
        st.sys_us / a.iters as f64,
        p.data_path,
        st.write_calls as f64 / a.iters as f64,
    ))
}

/// A cheap cycle counter for the per-iteration timestamps, like
/// perftest's `get_cycles`: the TSC on x86_64 (converted to time with two
/// clock reads around the whole run), the monotonic clock elsewhere.
/// Inside a TCG guest the clock may be a slow emulated device, so the
/// measured loops never read it.
#[inline(always)]
fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Fails after [`STALL`] of `spins` counting up without progress; reads
/// the clock once every 2^20 spins only.
fn check_stall(
    spins: u64,
    since: &mut Option<Instant>,
    what: impl Fn() -> String,
) -> Result<(), String> {
    if spins % (1 << 20) == 0 {
        let t = *since.get_or_insert_with(Instant::now);
        if t.elapsed() > STALL {
            return Err(what());
        }
    }
    Ok(())
}

/// One side of the ping-pong. `land` is the address of the last byte of
/// this side's landing buffer (written by the peer); returns the
/// [`cycles`] of each post.
#[allow(clippy::too_many_arguments)]
fn lat_side(
    qp: &mut Qp<Dev>,
    cq: &mut Cq<Dev>,
    src: &mut Mr<Dev>,
    land: usize,
    remote: Remote,
    size: usize,
    iters: u64,
    starts: bool,
) -> Result<Vec<u64>, String> {
    let mut stamps = Vec::with_capacity(iters as usize);
    let poll = land as *const u8;
    let mut wc = [Wc::default(); 1];
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    while scnt < iters || ccnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt == 0 && starts) {
            rcnt += 1;
            let want = rcnt as u8;
            let (mut spins, mut since) = (0u64, None);
            // SAFETY: `land` is the last byte of a registered region that
            // outlives this call (the caller's scope joins this thread
            // before dropping it); the peer's device writes it, so it is
            // read with a volatile load each time, like perftest's
            // `volatile char *poll_buf`.
            while unsafe { core::ptr::read_volatile(poll) } != want {
                spins += 1;
                check_stall(spins, &mut since, || {
                    format!("no WRITE {rcnt} from the peer")
                })?;
            }
        }
        if scnt < iters {
            stamps.push(cycles());
            scnt += 1;
            src.as_mut_slice()[size - 1] = scnt as u8;
            let sge = [src.sge(0, size as u32)];
            qp.post_send(&[SendWr::new(
                scnt,
                SendOp::Write { remote },
                &sge,
                SendFlags::SIGNALED,
            )])
            .map_err(|e| format!("post_send {scnt}: {:?}", e.error))?;
        }
        if ccnt < iters {
            let (mut spins, mut since) = (0u64, None);
            while cq.poll(qp, &mut wc).map_err(err("poll"))? == 0 {
                spins += 1;
                check_stall(spins, &mut since, || {
                    format!("no completion for WRITE {}", ccnt + 1)
                })?;
            }
            if wc[0].status != WcStatus::SUCCESS {
                return Err(format!("completion error: {:?}", wc[0]));
            }
            ccnt += 1;
        }
    }
    Ok(stamps)
}

fn lat(a: &Args) -> Result<String, String> {
    let p = pair(a)?;
    let Pair {
        a: mut qa,
        b: mut qb,
        mut cq_a,
        mut cq_b,
        pd,
        transport,
        data_path: _,
        _conns,
    } = p;
    let remote_access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
    let mut src_a = pd
        .register(a.size, Access::LOCAL_WRITE)
        .map_err(err("register"))?;
    let mut src_b = pd
        .register(a.size, Access::LOCAL_WRITE)
        .map_err(err("register"))?;
    let land_a = pd
        .register(a.size, remote_access)
        .map_err(err("register"))?;
    let land_b = pd
        .register(a.size, remote_access)
        .map_err(err("register"))?;
    let (last_a, last_b) = (
        land_a.addr() as usize + a.size - 1,
        land_b.addr() as usize + a.size - 1,
    );
    let (to_b, to_a) = (land_b.remote(0), land_a.remote(0));
    let (size, iters) = (a.size, a.iters);
    let (t0, c0) = (Instant::now(), cycles());
    let (stamps, cpu) = thread::scope(|s| {
        let peer = s.spawn(|| {
            lat_side(
                &mut qb, &mut cq_b, &mut src_b, last_b, to_a, size, iters, false,
            )
        });
        let cpu0 = thread_cpu_us();
        let mine = lat_side(
            &mut qa, &mut cq_a, &mut src_a, last_a, to_b, size, iters, true,
        );
        let cpu1 = thread_cpu_us();
        let theirs = peer.join().map_err(|_| "peer thread panicked".to_string());
        theirs??;
        mine.map(|m| (m, (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1)))
    })?;
    let (t1, c1) = (Instant::now(), cycles());
    drop((land_a, land_b));
    let us_per_cycle = t1.duration_since(t0).as_secs_f64() * 1e6 / (c1 - c0).max(1) as f64;
    // perftest: delta[i] = tposted[i+1] - tposted[i], sorted; one-way
    // latency is delta / 2 for WRITE; t_typical is delta[(iters-1)/2].
    let mut d: Vec<f64> = stamps
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 * us_per_cycle / 2.0)
        .collect();
    d.sort_by(|x, y| x.total_cmp(y));
    let n = d.len();
    let avg = d.iter().sum::<f64>() / n as f64;
    let pct = |q: f64| d[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
    Ok(format!(
        "verbs_write mode=lat device={} transport={:?} size={} iters={} tx_depth={} \
         t_min_us={:.2} t_max_us={:.2} t_typical_us={:.2} t_avg_us={:.2} t_p99_us={:.2} \
         t_p999_us={:.2} user_us_per_iter={:.2} sys_us_per_iter={:.2}",
        a.device,
        transport,
        a.size,
        a.iters,
        a.tx_depth,
        d[0],
        d[n - 1],
        d[n / 2],
        avg,
        pct(0.99),
        pct(0.999),
        cpu.0 / iters as f64,
        cpu.1 / iters as f64,
    ))
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match rdma_direct::verbs::list_devices() {
        Ok(l) if l.iter().any(|d| d.name == a.device) => {}
        _ => {
            eprintln!(
                "verbs_write: no RDMA device named {} here (run it in the test VM: \
                 scripts/vm-bench.sh)",
                a.device
            );
            return ExitCode::from(2);
        }
    }
    let r = match a.mode {
        Mode::Bw => bw(&a),
        Mode::Lat => lat(&a),
    };
    match r {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("verbs_write: {e}");
            ExitCode::FAILURE
        }
    }
}
