//! The pre-registered buffer pool against registering a fresh MR per
//! buffer, on the software HCA or, with the `verbs`
//! feature, on a kernel RDMA device (rxe, siw, mlx5).
//!
//! Usage:
//!
//! ```text
//! cargo bench --bench pool                       # the wall-clock table
//! cargo bench --bench pool -- --iters 2000000 --reg-iters 20000 --reps 5
//! cargo bench --features verbs --bench pool -- --device rxe0   # a kernel device
//! pool --count MODE SIZE N                       # exactly N ops, for callgrind
//! ```
//!
//! Options: `--device NAME` (`soft`, the default, is the in-process
//! software HCA; any other name is a kernel device opened through
//! `rdma_direct::verbs::VerbsDevice` and needs `--features verbs`),
//! `--iters N` (pool operations per run), `--reg-iters N` (registrations
//! per run, small buffers), `--reps N` (runs per figure), `--large-mib N`
//! (MiB registered per run in the large-region table, default 1024, at
//! least two regions per run) and `--large-sizes A,B,..` (the large
//! regions in MiB, default `1,16,256`). `scripts/vm-bench-pool.sh` runs
//! the software device, rxe0 and siw0 in one session of the test VM.
//!
//! **Wall clock** (the table): for 64 B, 4 KiB and 64 KiB buffers,
//!
//! * `pool alloc+free`: [`BufferPool::alloc`] then dropping the buffer,
//!   one thread, `--iters` times;
//! * `pool, C API`: `rdd_pool_alloc` + `rdd_pool_free` through the C
//!   handle (adds the handle validation of the object API); the C pool is
//!   created on its own `rdd_device` of the same kind (`rdd_device_open_soft`
//!   or `rdd_device_open_verbs`);
//! * `pool, 2 threads`: two threads doing `pool alloc+free` at once on one
//!   pool (per-op time of each thread; shows the cost of sharing the free
//!   list's cache line);
//! * `register per buffer`: [`Pd::register`] (allocate zeroed, page-aligned
//!   memory and register it) then dropping the MR (deregister, free),
//!   `--reg-iters` times, with the time per MB registered and the ratio
//!   to `pool alloc+free`;
//! * `memory alone`: the same allocation and free without registering
//!   (`alloc_zeroed` + `dealloc` of a page-aligned layout, as
//!   `Pd::register` does);
//! * `registration alone`: registering and deregistering one buffer that
//!   stays allocated and touched, through the backend's control path
//!   ([`Backend::reg_mr`] + [`Backend::dereg_mr`] on a PD of its own),
//!   i.e. `register per buffer` without the memory.
//!
//! A second table does the same three registration measurements for 1 MiB,
//! 16 MiB and 256 MiB regions (about `--large-mib` MiB per run): the
//! one-time cost a pool pays at start-up, per MB and in MB/s.
//!
//! Each figure is the median of `--reps` runs (default 5) of the whole
//! loop divided by its operation count. Registration on the software
//! device is a table insert under a mutex plus the allocation (page-aligned
//! zeroed memory: the zeroes are written, so large sizes pay a page fault
//! per 4 KiB page). A kernel device adds the `ibv_reg_mr` and
//! `ibv_dereg_mr` system calls, which pin and unpin the pages and build
//! (and tear down) the device's translation of them; the pool's own region
//! is registered once, so its alloc+free is the same user-space code on
//! every device.
//!
//! **Instruction counts** (`--count MODE SIZE N`): runs exactly `N`
//! operations of one kind after the same setup and prints nothing else, so
//! `valgrind --tool=callgrind` totals of two runs with different `N`
//! differ by exactly `N2 - N1` operations:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.1 target/release/deps/pool-* --count rust 64 100000
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.2 target/release/deps/pool-* --count rust 64 200000
//! # instructions per alloc+free = (Ir(cg.2) - Ir(cg.1)) / 100000
//! ```
//!
//! MODE is `rust` (alloc+free), `c` (`rdd_pool_alloc` + `rdd_pool_free`)
//! or `register` (`Pd::register` + drop). `--device` applies here too
//! (callgrind counts user-space instructions only).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::Instant;

use rdma_direct::api::{Access, Backend, Device, Pd};
use rdma_direct::ffi::{
    rdd_buf, rdd_device, rdd_device_close, rdd_device_open_soft, rdd_pd, rdd_pd_alloc, rdd_pd_free,
    rdd_pool, rdd_pool_alloc, rdd_pool_config, rdd_pool_create, rdd_pool_destroy, rdd_pool_free,
    rdd_status,
};
use rdma_direct::pool::{BufferPool, PoolConfig};
use rdma_direct::soft::SoftDevice;

const SIZES: [usize; 3] = [64, 4096, 65536];

struct Args {
    device: Option<String>,
    iters: u64,
    reg_iters: u64,
    reps: usize,
    large_mib: u64,
    large_sizes: Vec<usize>,
    count: Option<(String, usize, u64)>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        device: None,
        iters: 2_000_000,
        reg_iters: 20_000,
        reps: 5,
        large_mib: 1024,
        large_sizes: vec![1, 16, 256],
        count: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        let mut v = || it.next().ok_or(format!("{f} needs a value"));
        match f.as_str() {
            "--device" => a.device = Some(v()?),
            "--iters" => a.iters = v()?.parse().map_err(|_| "--iters: a number")?,
            "--reg-iters" => a.reg_iters = v()?.parse().map_err(|_| "--reg-iters: a number")?,
            "--reps" => a.reps = v()?.parse().map_err(|_| "--reps: a number")?,
            "--large-mib" => a.large_mib = v()?.parse().map_err(|_| "--large-mib: a number")?,
            "--large-sizes" => {
                a.large_sizes = v()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| "--large-sizes: MiB numbers separated by commas")?
            }
            "--count" => {
                let mode = v()?;
                let size = v()?.parse().map_err(|_| "--count MODE SIZE N: SIZE")?;
                let n = v()?.parse().map_err(|_| "--count MODE SIZE N: N")?;
                a.count = Some((mode, size, n));
            }
            "--bench" => {}
            _ => return Err(format!("unknown argument {f}")),
        }
    }
    if a.reps == 0 || a.iters == 0 || a.reg_iters == 0 {
        return Err("counts must be positive".into());
    }
    if a.large_sizes.iter().any(|&m| m == 0 || m > 4096) {
        return Err("--large-sizes: 1..=4096 MiB each".into());
    }
    Ok(a)
}

/// One pool holding 64 buffers of each benchmarked size (every class of
/// 64 B .. 64 KiB), registered for local write only.
fn rust_pool<B: Backend>(pd: &Pd<B>) -> BufferPool<B> {
    BufferPool::new(pd, &PoolConfig::buffers_per_class(64)).expect("pool")
}

/// `n` alloc+free pairs of `size` bytes.
#[inline(never)]
fn pool_loop<B: Backend>(pool: &BufferPool<B>, size: usize, n: u64) {
    for _ in 0..n {
        let b = pool.alloc(black_box(size)).expect("alloc");
        black_box(&b);
        drop(b);
    }
}

/// Opens the C API's device of the kind under test into `*out`.
type OpenC = dyn Fn(*mut *mut rdd_device) -> rdd_status;

/// The C objects: device, PD, pool (same configuration as `rust_pool`).
struct CPool {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    pool: *mut rdd_pool,
}

impl CPool {
    fn new(open: &OpenC) -> CPool {
        let cfg = rdd_pool_config {
            total_bytes: 0,
            buffers_per_class: 64,
            min_size: 0,
            max_size: 0,
            num_sizes: 0,
            sizes: std::ptr::null(),
            counts: std::ptr::null(),
            remote_access: 0,
            flags: 0,
        };
        let mut c = CPool {
            dev: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            pool: std::ptr::null_mut(),
        };
        assert_eq!(open(&mut c.dev), rdd_status::Ok, "open the C device");
        // SAFETY: `c.dev` is the live handle just opened; the out pointers
        // are fields of the live local `c`, `cfg` is a live local.
        unsafe {
            assert_eq!(rdd_pd_alloc(c.dev, &mut c.pd), rdd_status::Ok);
            assert_eq!(rdd_pool_create(c.pd, &cfg, &mut c.pool), rdd_status::Ok);
        }
        c
    }
}

impl Drop for CPool {
    fn drop(&mut self) {
        assert_eq!(rdd_pool_destroy(self.pool), rdd_status::Ok);
        assert_eq!(rdd_pd_free(self.pd), rdd_status::Ok);
        assert_eq!(rdd_device_close(self.dev), rdd_status::Ok);
    }
}

/// The software device through the C API.
fn open_c_soft(out: *mut *mut rdd_device) -> rdd_status {
    // SAFETY: NULL asks for the default configuration; `out` points to a
    // live `*mut rdd_device` (CPool::new passes its own field).
    unsafe { rdd_device_open_soft(std::ptr::null(), out) }
}

/// `n` `rdd_pool_alloc` + `rdd_pool_free` pairs of `size` bytes.
#[inline(never)]
fn c_loop(pool: *mut rdd_pool, size: usize, n: u64) {
    // SAFETY: a zeroed rdd_buf is a valid value (NULL address, zeros).
    let mut b: rdd_buf = unsafe { std::mem::zeroed() };
    for _ in 0..n {
        // SAFETY: `b` is a live local.
        let s = unsafe { rdd_pool_alloc(pool, black_box(size), &mut b) };
        assert_eq!(s, rdd_status::Ok);
        // SAFETY: as above.
        let s = unsafe { rdd_pool_free(pool, &b) };
        assert_eq!(s, rdd_status::Ok);
    }
}

/// `n` registrations (and deregistrations) of fresh `size`-byte buffers.
#[inline(never)]
fn register_loop<B: Backend>(pd: &Pd<B>, size: usize, n: u64) {
    for _ in 0..n {
        let mr = pd
            .register(black_box(size), Access::LOCAL_WRITE)
            .expect("register");
        black_box(&mr);
        drop(mr);
    }
}

/// `n` allocations and frees of `size` zeroed, page-aligned bytes, as
/// [`Pd::register`] allocates them, without registering: the memory's
/// share of `register_loop`.
#[inline(never)]
fn alloc_loop(size: usize, n: u64) {
    let layout = Layout::from_size_align(size.max(64), 4096).expect("layout");
    for _ in 0..n {
        // SAFETY: the layout's size is at least 64 bytes (non-zero).
        let p = unsafe { alloc_zeroed(layout) };
        assert!(!p.is_null(), "out of memory");
        black_box(p);
        // SAFETY: `p` was allocated just above with this layout and is
        // not used after this.
        unsafe { dealloc(p, layout) };
    }
}

/// Zeroed, page-aligned memory that stays allocated (and touched: the
/// zeroes are written) while it is registered again and again.
struct Touched {
    ptr: *mut u8,
    layout: Layout,
}

impl Touched {
    fn new(size: usize) -> Touched {
        let layout = Layout::from_size_align(size.max(64), 4096).expect("layout");
        // SAFETY: the layout's size is at least 64 bytes (non-zero).
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Touched { ptr, layout }
    }
}

impl Drop for Touched {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; every registration
        // of it was deregistered before the `Touched` is dropped
        // (`reg_only_loop` deregisters before returning).
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// `n` registrations and deregistrations of the same `size` bytes of
/// already allocated, touched memory, through the backend's control path
/// (what [`Pd::register`] calls, without its allocation): the device's
/// share of `register_loop`. `pd` is a raw PD of `backend`.
#[inline(never)]
fn reg_only_loop<B: Backend>(backend: &B, pd: u32, mem: &Touched, size: usize, n: u64) {
    for _ in 0..n {
        // SAFETY: `mem` covers at least `size` bytes and stays allocated
        // until after the `dereg_mr` just below.
        let keys = unsafe { backend.reg_mr(pd, mem.ptr as u64, size as u64, Access::LOCAL_WRITE) }
            .expect("reg_mr");
        black_box(&keys);
        backend.dereg_mr(keys.lkey).expect("dereg_mr");
    }
}

/// Median over `reps` runs of `f`'s wall time divided by `n`, in ns.
fn median_ns(reps: usize, n: u64, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn count_mode<B: Backend>(
    pd: &Pd<B>,
    open_c: &OpenC,
    mode: &str,
    size: usize,
    n: u64,
) -> Result<(), String> {
    match mode {
        "rust" => {
            let pool = rust_pool(pd);
            pool_loop(&pool, size, 1000); // warm-up, fixed
            pool_loop(&pool, size, n);
        }
        "c" => {
            let c = CPool::new(open_c);
            c_loop(c.pool, size, 1000);
            c_loop(c.pool, size, n);
        }
        "register" => {
            register_loop(pd, size, 100);
            register_loop(pd, size, n);
        }
        _ => return Err(format!("unknown mode {mode} (rust, c, register)")),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pool bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match args.device.as_deref() {
        None | Some("soft") => {
            let dev = Device::new(SoftDevice::new(Default::default()));
            run(&dev, "software device", &open_c_soft, &args)
        }
        Some(name) => verbs(name, &args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pool bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A kernel device: the safe API's `Device` over `VerbsDevice`, and
/// `rdd_device_open_verbs` for the C pool.
#[cfg(feature = "verbs")]
fn verbs(name: &str, args: &Args) -> Result<(), String> {
    use rdma_direct::ffi::rdd_device_open_verbs;
    use rdma_direct::verbs::VerbsDevice;

    let dev = Device::new(VerbsDevice::open_named(name).map_err(|e| format!("open {name}: {e}"))?);
    let label = format!(
        "{name} ({:?}, kernel {})",
        dev.backend().port().transport,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    );
    let cname = std::ffi::CString::new(name).map_err(|_| "device name has a NUL byte")?;
    let open_c = move |out: *mut *mut rdd_device| {
        // SAFETY: `cname` is a NUL-terminated string that outlives the
        // call; `out` points to a live `*mut rdd_device` (CPool's field).
        unsafe { rdd_device_open_verbs(cname.as_ptr(), out) }
    };
    run(&dev, &label, &open_c, args)
}

#[cfg(not(feature = "verbs"))]
fn verbs(name: &str, _: &Args) -> Result<(), String> {
    Err(format!(
        "--device {name} needs a build with --features verbs (or --device soft)"
    ))
}

/// The tables (or `--count`) on `dev`.
fn run<B: Backend>(
    dev: &Device<B>,
    label: &str,
    open_c: &OpenC,
    args: &Args,
) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    if let Some((mode, size, n)) = &args.count {
        return count_mode(&pd, open_c, mode, *size, *n);
    }
    let pool = rust_pool(&pd);
    let cpool = CPool::new(open_c);
    // A PD of the backend's own, for registering without `Pd::register`'s
    // allocation.
    let raw_pd = dev
        .backend()
        .alloc_pd()
        .map_err(|e| format!("alloc_pd: {e}"))?;
    let (iters, reg_iters, reps) = (args.iters, args.reg_iters, args.reps);
    println!(
        "pool bench: {label}, median of {reps} runs; {iters} pool ops, {reg_iters} registrations per run"
    );
    println!();
    println!("| size | pool alloc+free | pool, C API | pool, 2 threads | register per buffer | registration per MB | register / pool | memory alone | registration alone |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for size in SIZES {
        pool_loop(&pool, size, iters / 10);
        let rust = median_ns(reps, iters, || pool_loop(&pool, size, iters));
        c_loop(cpool.pool, size, iters / 10);
        let c = median_ns(reps, iters, || c_loop(cpool.pool, size, iters));
        let two = median_ns(reps, iters, || {
            let start = Barrier::new(2);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        start.wait();
                        pool_loop(&pool, size, iters);
                    });
                }
            });
        });
        register_loop(&pd, size, (reg_iters / 10).max(1));
        let reg = median_ns(reps, reg_iters, || register_loop(&pd, size, reg_iters));
        let mem = median_ns(reps, reg_iters, || alloc_loop(size, reg_iters));
        let touched = Touched::new(size);
        let only = median_ns(reps, reg_iters, || {
            reg_only_loop(dev.backend(), raw_pd, &touched, size, reg_iters)
        });
        drop(touched);
        let per_mb = reg / (size as f64 / (1 << 20) as f64);
        println!(
            "| {} | {rust:.1} ns | {c:.1} ns | {two:.1} ns | {} | {} | {:.0}× | {} | {} |",
            human(size),
            op_time(reg),
            mb_time(per_mb),
            reg / rust,
            op_time(mem),
            op_time(only)
        );
    }
    println!();
    println!("Registration per MB for large regions (the pool's one-time cost at start-up):");
    println!();
    println!("| size | regions per run | register+deregister | per MB | MB/s | memory alone, per MB | registration alone, per MB | registration alone, MB/s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &mib in &args.large_sizes {
        let size = mib << 20;
        // About --large-mib MiB registered per run, at least two regions.
        let n = (args.large_mib / mib as u64).max(2);
        let reg = median_ns(reps, n, || register_loop(&pd, size, n));
        let mem = median_ns(reps, n, || alloc_loop(size, n));
        let touched = Touched::new(size);
        let only = median_ns(reps, n, || {
            reg_only_loop(dev.backend(), raw_pd, &touched, size, n)
        });
        drop(touched);
        let per_mb = reg / mib as f64;
        let only_per_mb = only / mib as f64;
        println!(
            "| {} | {n} | {} | {} | {} | {} | {} | {} |",
            human(size),
            long_time(reg),
            mb_time(per_mb),
            rate(per_mb),
            mb_time(mem / mib as f64),
            mb_time(only_per_mb),
            rate(only_per_mb)
        );
    }
    let st = pool.stats();
    assert_eq!(st.buffers_in_use, 0, "every buffer came back");
    dev.backend()
        .dealloc_pd(raw_pd)
        .map_err(|e| format!("dealloc_pd: {e}"))?;
    Ok(())
}

/// A per-operation time: ns below 10 µs, else µs.
fn op_time(ns: f64) -> String {
    if ns < 10_000.0 {
        format!("{ns:.0} ns")
    } else {
        format!("{:.1} µs", ns / 1000.0)
    }
}

/// A longer time: µs below 10 ms, else ms.
fn long_time(ns: f64) -> String {
    if ns < 10_000_000.0 {
        format!("{:.1} µs", ns / 1000.0)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// A time per MB: ns below 10 µs, µs below 10 ms, else ms.
fn mb_time(ns: f64) -> String {
    if ns < 10_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 10_000_000.0 {
        format!("{:.0} µs", ns / 1000.0)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// MB/s from ns per MB (scientific notation above a million).
fn rate(ns_per_mb: f64) -> String {
    let r = 1e9 / ns_per_mb;
    if r < 1e6 {
        format!("{r:.0}")
    } else {
        format!("{r:.1e}")
    }
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}
