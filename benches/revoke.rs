//! What revoking a peer's rkey costs: a type-2 memory window
//! invalidated and bound again against a registration of its own
//! registered and deregistered again, on a kernel device with windows
//! (rxe). `docs/benchmarks.md` ("Revocation: memory windows against
//! re-registration") has the figures.
//!
//! Usage: `revoke --device NAME [--data-path auto|direct|fallback]
//! [--iters N] [--reps N] [--gid-index N]`
//!
//! For each exposed size (4 KiB, 1 MiB, 16 MiB; one region of 16 MiB,
//! registered once with `MW_BIND`), one cycle of each of:
//!
//! * `re-register`: [`Mr::expose`] (the range registered once more with
//!   the narrow rights: pins the pages, builds the device's page table)
//!   then [`Exposure::revoke`] (deregistration): two system calls whose
//!   work grows with the size;
//! * `window: invalidate + rebind`: [`Exposure::invalidate`] (a LOCAL_INV
//!   work request) and [`Exposure::rebind`] (a BIND_MW work request), each
//!   signaled and waited for on the CQ: what revoking a peer and admitting
//!   the next one costs on a bound window. No registration; on the direct
//!   path the only system calls are the two doorbells;
//! * `window: allocate + bind + deallocate`: [`Mr::expose_to`] (allocate a
//!   window, bind it, wait) then [`Exposure::revoke`] (deallocation, which
//!   invalidates at once): the cost when the window is not kept.
//!
//! Each figure is the median over `--reps` runs (default 5) of the loop's
//! wall time divided by its cycles; the ratio column divides the
//! re-registration cycle by the window cycle measured in the same run.
//! Both QPs are on one device in this process (loopback), connected
//! out of band; only QP b posts (the window WRs are local operations).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Qp, QpInit, QpState, Wc, WcStatus};
use rdma_direct::expose::{Exposure, RemoteAccess};
use rdma_direct::verbs::{DataPath, VerbsConfig, VerbsDevice};
use rdma_direct::SendFlags;

type Dev = VerbsDevice;

const MIB: usize = 1 << 20;
const SIZES: [usize; 3] = [4096, MIB, 16 * MIB];

struct Args {
    device: String,
    data_path: DataPath,
    iters: u32,
    reps: usize,
    gid_index: Option<u8>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        device: String::new(),
        data_path: DataPath::Auto,
        iters: 200,
        reps: 5,
        // The device's default GID unless asked (as the other benchmarks).
        gid_index: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--bench" {
            continue;
        }
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{k}: {e}"));
        match k.as_str() {
            "--device" => a.device = v,
            "--data-path" => {
                a.data_path = match v.as_str() {
                    "auto" => DataPath::Auto,
                    "direct" => DataPath::Direct,
                    "fallback" | "portable" => DataPath::Fallback,
                    _ => return Err(format!("--data-path: {v}?")),
                }
            }
            "--iters" => a.iters = num(&v)?.max(1) as u32,
            "--reps" => a.reps = num(&v)?.max(1) as usize,
            "--gid-index" => a.gid_index = Some(num(&v)? as u8),
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if a.device.is_empty() {
        a.device = std::env::var("RXE_DEV").map_err(|_| "--device NAME (e.g. rxe0)")?;
    }
    Ok(a)
}

fn err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| {
        format!(
            "{what}: {e:?} (last provider error {:?})",
            rdma_direct::verbs::last_error()
        )
    }
}

/// Waits for one successful completion `id` on `cq`.
fn done(cq: &mut Cq<Dev>, qp: &mut Qp<Dev>, id: u64) -> Result<(), String> {
    let mut wc = [Wc::default(); 1];
    let t0 = Instant::now();
    loop {
        if cq.poll(qp, &mut wc).map_err(err("poll"))? == 1 {
            if wc[0].wr_id != id || wc[0].status != WcStatus::SUCCESS {
                return Err(format!("completion {:?}, expected wr_id {id}", wc[0]));
            }
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(format!("no completion for wr_id {id}"));
        }
    }
}

/// Median seconds per cycle of `f` run `iters` times, over `reps` runs.
fn median(
    reps: usize,
    iters: u32,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        v.push(t0.elapsed().as_secs_f64() / f64::from(iters));
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

fn us(s: f64) -> String {
    format!("{:.1}", s * 1e6)
}

fn run(a: &Args) -> Result<(), String> {
    let dev = Device::new(
        VerbsDevice::open(&VerbsConfig {
            device: Some(a.device.clone()),
            port: 1,
            gid_index: a.gid_index,
            data_path: a.data_path,
        })
        .map_err(err("open device"))?,
    );
    if !dev.backend().caps().memory_windows {
        return Err(format!("{}: no type-2 memory windows", a.device));
    }
    let pd = dev.alloc_pd().map_err(err("alloc_pd"))?;
    let mut cq_a = dev.create_cq(16).map_err(err("create_cq"))?;
    let mut cq_b = dev.create_cq(16).map_err(err("create_cq"))?;
    let init = QpInit {
        max_send_wr: 4,
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
    let attr = ConnectAttr {
        access: Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        gid_index: a.gid_index,
        ..ConnectAttr::default()
    };
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib, &attr).map_err(err("connect a"))?;
    qb.connect(&ia, &attr).map_err(err("connect b"))?;
    if qb.state() != QpState::Rts {
        return Err("QP b did not reach RTS".into());
    }
    let mr: Mr<Dev> = pd
        .register(16 * MIB, Access::LOCAL_WRITE | Access::MW_BIND)
        .map_err(err("register"))?;
    println!(
        "device {} ({:?} data path), {} cycles x {} runs (median)",
        a.device,
        dev.backend().data_path(),
        a.iters,
        a.reps
    );
    println!();
    println!(
        "| exposed | re-register (µs/cycle) | window: invalidate + rebind (µs/cycle) | \
         window: allocate + bind + deallocate (µs/cycle) | re-register / invalidate+rebind |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut id = 0u64;
    for &size in &SIZES {
        // Large registrations take milliseconds each under emulation.
        let reg_iters = (a.iters / (size / 4096).max(1).ilog2().max(1)).max(4);
        let rereg = median(a.reps, reg_iters, || {
            let mut e = mr
                .expose(0, size, RemoteAccess::ReadWrite)
                .map_err(err("expose"))?;
            e.revoke().map_err(err("revoke"))
        })?;
        // A window over the whole exposed range, bound on QP b (signaled).
        let window_on = |qb: &mut Qp<Dev>, id: u64| -> Result<Exposure<'_, Dev>, String> {
            mr.expose_to(
                qb,
                id,
                SendFlags::SIGNALED,
                0,
                size,
                RemoteAccess::ReadWrite,
            )
            .map_err(err("expose_to"))
        };
        id += 1;
        let mut e = window_on(&mut qb, id)?;
        if !e.is_window() {
            return Err("expose_to did not make a window".into());
        }
        done(&mut cq_b, &mut qb, id)?;
        let window = median(a.reps, a.iters, || {
            id += 1;
            e.invalidate(&mut qb, id, SendFlags::SIGNALED)
                .map_err(err("invalidate"))?;
            done(&mut cq_b, &mut qb, id)?;
            id += 1;
            e.rebind(&mut qb, id, SendFlags::SIGNALED)
                .map_err(err("rebind"))?;
            done(&mut cq_b, &mut qb, id)
        })?;
        drop(e);
        let fresh = median(a.reps, a.iters, || {
            id += 1;
            let mut e = window_on(&mut qb, id)?;
            done(&mut cq_b, &mut qb, id)?;
            e.revoke().map_err(err("revoke"))
        })?;
        let label = if size >= MIB {
            format!("{} MiB", size / MIB)
        } else {
            format!("{} KiB", size / 1024)
        };
        println!(
            "| {label} | {} | {} | {} | {:.1}× |",
            us(rereg),
            us(window),
            us(fresh),
            rereg / window
        );
    }
    // The QPs stay quiet: only local operations were posted.
    let mut wc = [Wc::default(); 4];
    if cq_a.poll(&mut qa, &mut wc).map_err(err("poll"))? != 0 {
        return Err("unexpected completion on QP a".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("revoke: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("revoke: {e}");
            ExitCode::FAILURE
        }
    }
}
