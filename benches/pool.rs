//! The pre-registered buffer pool against registering a fresh MR per
//! buffer, on the software HCA (issue 9, item 1).
//!
//! Usage:
//!
//! ```text
//! cargo bench --bench pool                       # the wall-clock table
//! cargo bench --bench pool -- --iters 2000000 --reg-iters 20000 --reps 5
//! pool --count MODE SIZE N                       # exactly N ops, for callgrind
//! ```
//!
//! **Wall clock** (the table): for 64 B, 4 KiB and 64 KiB buffers,
//!
//! * `pool alloc+free`: [`BufferPool::alloc`] then dropping the buffer,
//!   one thread, `--iters` times;
//! * `pool, C API`: `rdd_pool_alloc` + `rdd_pool_free` through the C
//!   handle (adds the handle validation of the object API);
//! * `pool, 2 threads`: two threads doing `pool alloc+free` at once on one
//!   pool (per-op time of each thread; shows the cost of sharing the free
//!   list's cache line);
//! * `register per buffer`: [`Pd::register`] (allocate zeroed, page-aligned
//!   memory and register it) then dropping the MR (deregister, free),
//!   `--reg-iters` times, with the time per MB registered.
//!
//! A second table registers 1 MiB, 16 MiB and 256 MiB regions (about
//! 1 GiB per run): the one-time cost a pool pays at start-up.
//!
//! Each figure is the median of `--reps` runs (default 5) of the whole
//! loop divided by its operation count. Registration on the software
//! device is a table insert under a mutex plus the allocation (page-aligned
//! zeroed memory: the zeroes are written, so large sizes pay a page fault
//! per 4 KiB page): a kernel device also pins the pages and programs the
//! NIC's translation tables, which costs far more, so the gap measured here
//! is a lower bound.
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
//! or `register` (`Pd::register` + drop).

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::Instant;

use rdma_direct::api::{Access, Device, Pd};
use rdma_direct::ffi::{
    rdd_buf, rdd_device, rdd_device_close, rdd_device_open_soft, rdd_pd, rdd_pd_alloc, rdd_pd_free,
    rdd_pool, rdd_pool_alloc, rdd_pool_config, rdd_pool_create, rdd_pool_destroy, rdd_pool_free,
    rdd_status,
};
use rdma_direct::pool::{BufferPool, PoolConfig};
use rdma_direct::soft::SoftDevice;

const SIZES: [usize; 3] = [64, 4096, 65536];

struct Args {
    iters: u64,
    reg_iters: u64,
    reps: usize,
    count: Option<(String, usize, u64)>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        iters: 2_000_000,
        reg_iters: 20_000,
        reps: 5,
        count: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        let mut v = || it.next().ok_or(format!("{f} needs a value"));
        match f.as_str() {
            "--iters" => a.iters = v()?.parse().map_err(|_| "--iters: a number")?,
            "--reg-iters" => a.reg_iters = v()?.parse().map_err(|_| "--reg-iters: a number")?,
            "--reps" => a.reps = v()?.parse().map_err(|_| "--reps: a number")?,
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
    Ok(a)
}

/// One pool holding 64 buffers of each benchmarked size (every class of
/// 64 B .. 64 KiB), registered for local write only.
fn rust_pool(pd: &Pd<SoftDevice>) -> BufferPool<SoftDevice> {
    BufferPool::new(pd, &PoolConfig::buffers_per_class(64)).expect("pool")
}

/// `n` alloc+free pairs of `size` bytes.
#[inline(never)]
fn pool_loop(pool: &BufferPool<SoftDevice>, size: usize, n: u64) {
    for _ in 0..n {
        let b = pool.alloc(black_box(size)).expect("alloc");
        black_box(&b);
        drop(b);
    }
}

/// The C objects: device, PD, pool (same configuration as `rust_pool`).
struct CPool {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    pool: *mut rdd_pool,
}

impl CPool {
    fn new() -> CPool {
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
        // SAFETY: every pointer is a live local or field.
        unsafe {
            assert_eq!(
                rdd_device_open_soft(std::ptr::null(), &mut c.dev),
                rdd_status::Ok
            );
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
fn register_loop(pd: &Pd<SoftDevice>, size: usize, n: u64) {
    for _ in 0..n {
        let mr = pd
            .register(black_box(size), Access::LOCAL_WRITE)
            .expect("register");
        black_box(&mr);
        drop(mr);
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

fn count_mode(mode: &str, size: usize, n: u64) -> Result<(), String> {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    match mode {
        "rust" => {
            let pool = rust_pool(&pd);
            pool_loop(&pool, size, 1000); // warm-up, fixed
            pool_loop(&pool, size, n);
        }
        "c" => {
            let c = CPool::new();
            c_loop(c.pool, size, 1000);
            c_loop(c.pool, size, n);
        }
        "register" => {
            register_loop(&pd, size, 100);
            register_loop(&pd, size, n);
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
    if let Some((mode, size, n)) = &args.count {
        return match count_mode(mode, *size, *n) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pool bench: {e}");
                ExitCode::FAILURE
            }
        };
    }

    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().expect("pd");
    let pool = rust_pool(&pd);
    let cpool = CPool::new();
    let (iters, reg_iters, reps) = (args.iters, args.reg_iters, args.reps);
    println!(
        "pool bench: software device, median of {reps} runs; {iters} pool ops, {reg_iters} registrations per run"
    );
    println!();
    println!("| size | pool alloc+free | pool, C API | pool, 2 threads | register per buffer | registration per MB | register / pool |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
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
        register_loop(&pd, size, reg_iters / 10);
        let reg = median_ns(reps, reg_iters, || register_loop(&pd, size, reg_iters));
        let per_mb_us = reg / (size as f64 / (1 << 20) as f64) / 1000.0;
        println!(
            "| {} | {rust:.1} ns | {c:.1} ns | {two:.1} ns | {reg:.0} ns | {per_mb_us:.0} µs | {:.0}× |",
            human(size),
            reg / rust
        );
    }
    println!();
    println!("Registration per MB for large regions (the pool's one-time cost at start-up):");
    println!();
    println!("| size | register+deregister | per MB |");
    println!("|---:|---:|---:|");
    for size in [1usize << 20, 16 << 20, 256 << 20] {
        // About 1 GiB registered per run.
        let n = ((1u64 << 30) / size as u64).max(2);
        let reg = median_ns(reps, n, || register_loop(&pd, size, n));
        let per_mb = reg / (size as f64 / (1 << 20) as f64);
        println!(
            "| {} | {:.1} µs | {per_mb:.0} ns |",
            human(size),
            reg / 1000.0
        );
    }
    let st = pool.stats();
    assert_eq!(st.buffers_in_use, 0, "every buffer came back");
    ExitCode::SUCCESS
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
