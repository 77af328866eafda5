//! The pre-registered buffer pool on the software HCA: buffers used for
//! RDMA WRITE and SEND/RECV with their lkey/rkey, least privilege, typed
//! exhaustion, every class round-tripping, statistics, refused double and
//! foreign frees (Rust and C API), huge pages, and a multi-threaded stress
//! test that proves no two live buffers overlap and nothing leaks.
//!
//! Stress size: 4,000,000 alloc+free pairs in all in release builds, 40,000
//! in debug builds; `RDD_POOL_STRESS_OPS=N` overrides (for example
//! `RDD_POOL_STRESS_OPS=20000000 cargo test --release --test pool -- stress`).

use std::sync::Arc;

use rdma_direct::api::*;
use rdma_direct::ffi::*;
use rdma_direct::pool::{BufferPool, ClassStats, PoolBuf, PoolConfig, HUGE_PAGE_SIZE};
use rdma_direct::soft::SoftDevice;
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

struct Pair {
    dev: Device<SoftDevice>,
    pd: Pd<SoftDevice>,
    a: Qp<SoftDevice>,
    b: Qp<SoftDevice>,
    cqa: Cq<SoftDevice>,
    cqb: Cq<SoftDevice>,
}

fn pair() -> Pair {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let init = QpInit::default();
    let cqa = dev.create_cq(dev.cq_depth_for(&[&init])).unwrap();
    let cqb = dev.create_cq(dev.cq_depth_for(&[&init])).unwrap();
    let mut a = pd.create_qp(&cqa, &cqa, &init).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &init).unwrap();
    let attr = ConnectAttr {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..Default::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cqa,
        cqb,
    }
}

impl Pair {
    fn run(&self) {
        self.dev.backend().run_until_idle(64);
    }
    fn poll_a(&mut self) -> Vec<Wc> {
        let mut wc = [Wc::default(); 16];
        let n = self.cqa.poll(&mut self.a, &mut wc).unwrap();
        wc[..n].to_vec()
    }
    fn poll_b(&mut self) -> Vec<Wc> {
        let mut wc = [Wc::default(); 16];
        let n = self.cqb.poll(&mut self.b, &mut wc).unwrap();
        wc[..n].to_vec()
    }
}

fn pattern(buf: &mut PoolBuf<'_>, seed: u8) {
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8).wrapping_mul(13);
    }
}

#[test]
fn pool_buffers_carry_rdma_write_and_send() {
    let mut p = pair();
    let pool = BufferPool::new(
        &p.pd,
        &PoolConfig::buffers_per_class(4)
            .size_classes(64, 4096)
            .allow_remote_write(),
    )
    .unwrap();
    assert_eq!(
        pool.access(),
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        "exactly what was asked for"
    );

    // RDMA WRITE: pool buffer -> another pool buffer, by its rkey.
    let mut src = pool.alloc(3000).unwrap();
    pattern(&mut src, 5);
    let dst = pool.alloc(4096).unwrap();
    assert_ne!(src.addr(), dst.addr());
    p.a.post_send_one(&SendWr::new(
        1,
        SendOp::Write {
            remote: dst.remote_at(100),
        },
        &[src.sge()],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(
        (wa.len(), wa[0].wr_id, wa[0].status),
        (1, 1, WcStatus::SUCCESS)
    );
    assert_eq!(&dst.as_slice()[100..3100], src.as_slice());
    assert!(dst.as_slice()[..100].iter().all(|&b| b == 0));

    // SEND into a posted pool buffer (RECV with the buffer's lkey).
    let mut msg = pool.alloc(200).unwrap();
    pattern(&mut msg, 9);
    let rx = pool.alloc(256).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 7,
        sges: &[rx.sge_at(0, rx.capacity() as u32)],
    }])
    .unwrap();
    p.a.post_send_one(&SendWr::new(
        2,
        SendOp::Send,
        &[msg.sge()],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    let wb = p.poll_b();
    assert_eq!(
        (wb.len(), wb[0].wr_id, wb[0].status),
        (1, 7, WcStatus::SUCCESS)
    );
    assert_eq!(wb[0].byte_len, 200);
    assert_eq!(&rx.as_slice()[..200], msg.as_slice());
    assert_eq!(p.poll_a()[0].wr_id, 2);

    drop((src, dst, msg, rx));
    assert_eq!(pool.stats().buffers_in_use, 0);
}

#[test]
fn pool_without_remote_write_refuses_peers() {
    let mut p = pair();
    let narrow = BufferPool::new(
        &p.pd,
        &PoolConfig::buffers_per_class(1).size_classes(64, 64),
    )
    .unwrap();
    assert_eq!(narrow.access(), Access::LOCAL_WRITE);
    let src = narrow.alloc(8).unwrap();
    let other = BufferPool::new(
        &p.pd,
        &PoolConfig::buffers_per_class(1).size_classes(64, 64),
    )
    .unwrap();
    let target = other.alloc(8).unwrap();
    p.a.post_send_one(&SendWr::new(
        3,
        SendOp::Write {
            remote: target.remote(),
        },
        &[src.sge()],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!((wa[0].wr_id, wa[0].status), (3, WcStatus::REM_ACCESS_ERR));
}

#[test]
fn exhaustion_and_bad_lengths_are_typed() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let pool = BufferPool::new(
        &pd,
        &PoolConfig::with_counts(&[2, 1]).class_sizes(&[128, 64]),
    )
    .unwrap();
    assert_eq!(pool.alloc(0).unwrap_err(), Error::InvalidAttribute);
    assert_eq!(pool.alloc(129).unwrap_err(), Error::InvalidAttribute);
    let a = pool.alloc(64).unwrap();
    let b = pool.alloc(64).unwrap();
    // The 64-byte class is empty: the larger class serves.
    let c = pool.alloc(64).unwrap();
    assert_eq!((a.capacity(), b.capacity(), c.capacity()), (64, 64, 128));
    assert_eq!(pool.alloc(1).unwrap_err(), Error::ResourceExhausted);
    assert_eq!(pool.alloc(128).unwrap_err(), Error::ResourceExhausted);
    drop(c);
    // A 65..128-byte request cannot use the 64-byte class.
    let d = pool.alloc(100).unwrap();
    assert_eq!(d.capacity(), 128);
    assert_eq!(pool.alloc(65).unwrap_err(), Error::ResourceExhausted);
    drop((a, b, d));
    assert_eq!(pool.stats().buffers_in_use, 0);
}

#[test]
fn every_class_round_trips() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let pool = BufferPool::new(&pd, &PoolConfig::total_bytes(4 << 20)).unwrap();
    assert_eq!(pool.class_count(), 11);
    for k in 0..pool.class_count() {
        let size = pool.class_stats(k).unwrap().size;
        assert_eq!(size, 64 << k);
        // The smallest length that lands in this class, and the largest.
        let lo = if k == 0 { 1 } else { size / 2 + 1 };
        for len in [lo, size] {
            let mut b = pool.alloc(len).unwrap();
            assert_eq!((b.len(), b.capacity()), (len, size));
            assert_eq!(b.addr() % size.min(4096) as u64, 0, "aligned to its size");
            pattern(&mut b, k as u8);
            let copy = b.as_slice().to_vec();
            let addr = b.addr();
            pool.free(b).unwrap();
            // LIFO: the same buffer comes back, contents untouched.
            let b = pool.alloc(len).unwrap();
            assert_eq!(b.addr(), addr);
            assert_eq!(b.as_slice(), &copy[..]);
        }
        let cs = pool.class_stats(k).unwrap();
        assert_eq!((cs.in_use, cs.free, cs.high_water), (0, cs.capacity, 1));
        // 4 MiB over 11 classes, evenly by bytes.
        assert_eq!(cs.capacity as usize, (4 << 20) / 11 / size);
    }
    assert!(pool.class_stats(11).is_none());
}

#[test]
fn stats_are_right() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let pool =
        BufferPool::new(&pd, &PoolConfig::buffers_per_class(4).size_classes(64, 256)).unwrap();
    let s0 = pool.stats();
    assert_eq!(s0.region_bytes, 4 * (64 + 128 + 256));
    assert_eq!(
        (s0.buffers_in_use, s0.bytes_in_use, s0.bytes_requested),
        (0, 0, 0)
    );
    assert_eq!(s0.fragmentation(), 0.0);

    let a = pool.alloc(10).unwrap(); // 64
    let b = pool.alloc(64).unwrap(); // 64
    let c = pool.alloc(100).unwrap(); // 128
    let d = pool.alloc(256).unwrap(); // 256
    let s = pool.stats();
    assert_eq!(s.buffers_in_use, 4);
    assert_eq!(s.bytes_in_use, 64 + 64 + 128 + 256);
    assert_eq!(s.bytes_requested, 10 + 64 + 100 + 256);
    let frag = 1.0 - 430.0 / 512.0;
    assert!(
        (s.fragmentation() - frag).abs() < 1e-12,
        "{}",
        s.fragmentation()
    );
    let all = pool.all_class_stats();
    assert_eq!(
        all[0],
        ClassStats {
            size: 64,
            capacity: 4,
            in_use: 2,
            free: 2,
            high_water: 2,
            bytes_requested: 74,
        }
    );
    assert!((all[0].fragmentation() - (1.0 - 74.0 / 128.0)).abs() < 1e-12);
    assert_eq!((all[1].in_use, all[1].bytes_requested), (1, 100));
    assert_eq!((all[2].in_use, all[2].bytes_requested), (1, 256));
    assert_eq!(all[2].fragmentation(), 0.0);
    drop((a, b));
    let all = pool.all_class_stats();
    assert_eq!((all[0].in_use, all[0].free, all[0].high_water), (0, 4, 2));
    assert_eq!(all[0].bytes_requested, 0);
    drop((c, d));
    let s = pool.stats();
    assert_eq!(
        (s.buffers_in_use, s.bytes_in_use, s.bytes_requested),
        (0, 0, 0)
    );
    let hw: Vec<u32> = pool
        .all_class_stats()
        .iter()
        .map(|c| c.high_water)
        .collect();
    assert_eq!(hw, [2, 1, 1]);
}

#[test]
fn foreign_free_is_refused() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let cfg = PoolConfig::buffers_per_class(2).size_classes(64, 64);
    let p1 = BufferPool::new(&pd, &cfg).unwrap();
    let p2 = BufferPool::new(&pd, &cfg).unwrap();
    let b = p1.alloc(8).unwrap();
    assert_eq!(p2.free(b), Err(Error::NoSuchObject));
    // The refused buffer went home, not into p2.
    assert_eq!(p1.stats().buffers_in_use, 0);
    assert_eq!(p2.class_stats(0).unwrap().free, 2);
    // (A second free of one buffer does not compile: `free` takes it by
    // value and `PoolBuf` is not Clone; see the compile_fail doctests.)
}

/// The C API's checks from Rust: a double free, a stale copy, a buffer of
/// another pool and a forged token are refused; destroy waits for the
/// buffers; the pool holds its PD.
#[test]
fn c_api_refuses_double_and_foreign_frees() {
    // SAFETY: every pointer passed is a live local (the whole test).
    unsafe {
        let mut dev = std::ptr::null_mut();
        assert_eq!(
            rdd_device_open_soft(std::ptr::null(), &mut dev),
            rdd_status::Ok
        );
        let mut pd = std::ptr::null_mut();
        assert_eq!(rdd_pd_alloc(dev, &mut pd), rdd_status::Ok);
        let cfg = rdd_pool_config {
            total_bytes: 0,
            buffers_per_class: 2,
            min_size: 64,
            max_size: 128,
            num_sizes: 0,
            sizes: std::ptr::null(),
            counts: std::ptr::null(),
            remote_access: 0,
            flags: 0,
        };
        let (mut p1, mut p2) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(rdd_pool_create(pd, &cfg, &mut p1), rdd_status::Ok);
        assert_eq!(rdd_pool_create(pd, &cfg, &mut p2), rdd_status::Ok);
        let mut b = std::mem::zeroed::<rdd_buf>();
        assert_eq!(rdd_pool_alloc(p1, 100, &mut b), rdd_status::Ok);
        assert_eq!((b.len, b.capacity), (100, 128));
        let mut other = std::mem::zeroed::<rdd_buf>();
        assert_eq!(rdd_pool_alloc(p2, 100, &mut other), rdd_status::Ok);
        assert_eq!(rdd_pool_free(p1, &other), rdd_status::NoSuchObject);
        let mut forged = b;
        forged.token ^= 1;
        assert_eq!(rdd_pool_free(p1, &forged), rdd_status::NoSuchObject);
        assert_eq!(rdd_pd_free(pd), rdd_status::ResourceBusy);
        assert_eq!(rdd_pool_destroy(p1), rdd_status::ResourceBusy);
        assert_eq!(rdd_pool_free(p1, &b), rdd_status::Ok);
        assert_eq!(rdd_pool_free(p1, &b), rdd_status::NoSuchObject);
        // The slot is handed out again; the stale copy stays dead.
        let mut again = std::mem::zeroed::<rdd_buf>();
        assert_eq!(rdd_pool_alloc(p1, 100, &mut again), rdd_status::Ok);
        assert_eq!(again.addr, b.addr);
        assert_ne!(again.token, b.token);
        assert_eq!(rdd_pool_free(p1, &b), rdd_status::NoSuchObject);
        assert_eq!(rdd_pool_free(p1, &again), rdd_status::Ok);
        assert_eq!(rdd_pool_free(p2, &other), rdd_status::Ok);
        assert_eq!(rdd_pool_destroy(p1), rdd_status::Ok);
        assert_eq!(rdd_pool_destroy(p1), rdd_status::InvalidHandle);
        assert_eq!(rdd_pool_destroy(p2), rdd_status::Ok);
        assert_eq!(rdd_pd_free(pd), rdd_status::Ok);
        assert_eq!(rdd_device_close(dev), rdd_status::Ok);
    }
}

#[test]
fn huge_pages_size_must_be_a_2mib_multiple() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    for cfg in [
        PoolConfig::total_bytes(HUGE_PAGE_SIZE + 4096).huge_pages(true),
        PoolConfig::buffers_per_class(3).huge_pages(true),
    ] {
        assert_eq!(
            BufferPool::new(&pd, &cfg).unwrap_err(),
            Error::HugePagesUnavailable
        );
    }
}

/// Free 2 MiB huge pages on this machine (`HugePages_Free` in
/// /proc/meminfo; 0 if unreadable).
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let size_2m = m
                .lines()
                .any(|l| l.starts_with("Hugepagesize:") && l.contains("2048 kB"));
            let free = m
                .lines()
                .find(|l| l.starts_with("HugePages_Free:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(if size_2m { free } else { 0 })
        })
        .unwrap_or(0)
}

/// One 2 MiB huge page: works if the machine has a free one, and is
/// `HugePagesUnavailable` (not a panic or a provider error) if not.
#[test]
fn huge_pages_two_mib() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let cfg = PoolConfig::total_bytes(HUGE_PAGE_SIZE)
        .size_classes(4096, 65536)
        .huge_pages(true);
    let free = free_huge_pages();
    let r = BufferPool::new(&pd, &cfg);
    if free == 0 {
        eprintln!(
            "huge_pages_two_mib: no free 2 MiB huge pages here: expecting HugePagesUnavailable"
        );
        assert_eq!(r.unwrap_err(), Error::HugePagesUnavailable);
    } else {
        eprintln!("huge_pages_two_mib: {free} free 2 MiB huge pages: expecting a huge-page pool");
        let pool = r.unwrap();
        assert!(pool.is_huge_pages());
        assert_eq!(pool.region_addr() % HUGE_PAGE_SIZE as u64, 0);
        let mut b = pool.alloc(65536).unwrap();
        pattern(&mut b, 1);
        drop(b);
    }
}

fn stress_ops() -> u64 {
    if let Ok(v) = std::env::var("RDD_POOL_STRESS_OPS") {
        return v
            .parse()
            .unwrap_or_else(|_| panic!("RDD_POOL_STRESS_OPS must be a number, not {v:?}"));
    }
    if cfg!(debug_assertions) {
        40_000
    } else {
        4_000_000
    }
}

/// A small xorshift generator (deterministic per thread).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Checks the fill byte of a buffer at every 64-byte boundary (buffers
/// start on one, so any overlap with another live buffer covers at least
/// one checked byte) and at its last byte.
fn check_fill(b: &PoolBuf<'_>, want: u8) {
    let s = b.as_slice();
    for (i, &x) in s.iter().enumerate().step_by(64) {
        assert_eq!(
            x,
            want,
            "byte {i} of a {}-byte buffer at {:#x}",
            s.len(),
            b.addr()
        );
    }
    assert_eq!(
        s[s.len() - 1],
        want,
        "last byte of buffer at {:#x}",
        b.addr()
    );
}

/// Several threads allocate and free random sizes millions of times,
/// each holding up to 8 buffers at once (it allocates 3 times in 4) in a
/// pool too small for all of them (so classes run empty, fall back, and
/// run out: `ResourceExhausted`). Each live buffer is filled
/// with a byte unique to its thread and allocation and checked before it
/// is freed: two live buffers that overlapped would corrupt each other.
/// At the end every buffer is back: counters restored, and every slot of
/// every class can be allocated again exactly once.
#[test]
fn stress_threads_never_share_a_buffer_and_nothing_leaks() {
    const THREADS: u64 = 4;
    const HOLD: usize = 8;
    let ops = stress_ops();
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    // 7 classes (64 B .. 4 KiB) of 4 buffers: 28 buffers for up to 32 live.
    let pool = Arc::new(
        BufferPool::new(
            &pd,
            &PoolConfig::buffers_per_class(4).size_classes(64, 4096),
        )
        .unwrap(),
    );
    let per = ops / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1).wrapping_mul(0x1000_0001));
                let mut live: Vec<(PoolBuf<'_>, u8)> = Vec::with_capacity(HOLD);
                let (mut allocs, mut exhausted) = (0u64, 0u64);
                let mut serial = 0u8;
                while allocs < per {
                    let r = rng.next();
                    if live.len() < HOLD && (live.is_empty() || r & 3 != 0) {
                        // Sizes skewed small: 1..64 B, up to 512 B, up to 4 KiB.
                        let len = match (r >> 8) % 8 {
                            0..=3 => 1 + (r >> 16) as usize % 64,
                            4..=6 => 1 + (r >> 16) as usize % 512,
                            _ => 1 + (r >> 16) as usize % 4096,
                        };
                        match pool.alloc(len) {
                            Ok(mut b) => {
                                serial = serial.wrapping_add(1);
                                // Thread in the top 2 bits, allocation below.
                                let fill = ((t as u8) << 6) | (serial & 0x3f);
                                b.as_mut_slice().fill(fill);
                                live.push((b, fill));
                                allocs += 1;
                            }
                            Err(Error::ResourceExhausted) => {
                                exhausted += 1;
                                if let Some((b, fill)) = live.pop() {
                                    check_fill(&b, fill);
                                }
                            }
                            Err(e) => panic!("alloc({len}): {e}"),
                        }
                    } else {
                        let i = (r >> 32) as usize % live.len();
                        let (b, fill) = live.swap_remove(i);
                        check_fill(&b, fill);
                        pool.free(b).unwrap();
                    }
                }
                for (b, fill) in live.drain(..) {
                    check_fill(&b, fill);
                }
                (allocs, exhausted)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        let (allocs, exhausted) = h.join().unwrap();
        total += allocs;
        eprintln!("stress: {allocs} allocs, {exhausted} refused as exhausted");
    }
    assert_eq!(total, per * THREADS);
    let s = pool.stats();
    assert_eq!(
        (s.buffers_in_use, s.bytes_in_use, s.bytes_requested),
        (0, 0, 0)
    );
    for c in pool.all_class_stats() {
        assert_eq!((c.in_use, c.free), (0, c.capacity), "{c:?}");
        assert!(c.high_water >= 1 && c.high_water <= c.capacity, "{c:?}");
    }
    // Every slot is on its list exactly once: drain the classes largest
    // first (so no fallback steals), then nothing is left.
    let mut all = Vec::new();
    for k in (0..pool.class_count()).rev() {
        let c = pool.class_stats(k).unwrap();
        for _ in 0..c.capacity {
            let b = pool.alloc(c.size).unwrap();
            assert_eq!(b.capacity(), c.size);
            all.push(b);
        }
    }
    assert_eq!(pool.alloc(1).unwrap_err(), Error::ResourceExhausted);
    let mut addrs: Vec<u64> = all.iter().map(|b| b.addr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), 28);
}
