//! A counting global allocator proves that the submission service's C
//! calls on the data path (`rdd_submit_post`, `_drain`, `_complete`,
//! `_reap`, `_stats`, and a refused post) allocate nothing once the
//! service exists. The software device is stepped in between; its own
//! work is not counted.

use core::ptr::{self, null_mut};

use rdma_direct::ffi::*;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::mine;

fn ok(s: rdd_status) {
    assert_eq!(s, rdd_status::Ok);
}

/// Runs `f` and returns what it returned and how many allocations this
/// thread made meanwhile.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = mine();
    let v = f();
    (v, mine() - before)
}

#[test]
fn submit_drain_complete_reap_allocate_nothing() {
    let mut dev = null_mut();
    let mut pd = null_mut();
    let mut cq = [null_mut(); 2];
    let mut qp = [null_mut(); 2];
    let (mut src, mut dst) = (null_mut(), null_mut());
    let (mut lkey, mut rkey) = (0, 0);
    let (mut s_addr, mut d_addr) = (null_mut(), null_mut());
    // SAFETY: every out-parameter is a live local.
    unsafe {
        ok(rdd_device_open_soft(ptr::null(), &mut dev));
        ok(rdd_pd_alloc(dev, &mut pd));
        for i in 0..2 {
            ok(rdd_cq_create(dev, 1024, &mut cq[i]));
            ok(rdd_qp_create(pd, cq[i], cq[i], ptr::null(), &mut qp[i]));
        }
        ok(rdd_mr_reg(pd, 1 << 16, RDD_ACCESS_LOCAL_WRITE, &mut src));
        let acc = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
        ok(rdd_mr_reg(pd, 1 << 16, acc, &mut dst));
        ok(rdd_mr_addr(src, &mut s_addr));
        ok(rdd_mr_addr(dst, &mut d_addr));
        ok(rdd_mr_lkey(src, &mut lkey));
        ok(rdd_mr_rkey(dst, &mut rkey));
        let mut info = [rdd_qp_info::default(); 2];
        ok(rdd_qp_query_info(qp[0], &mut info[0]));
        ok(rdd_qp_query_info(qp[1], &mut info[1]));
        let attr = rdd_connect_attr {
            access: RDD_ACCESS_REMOTE_WRITE,
            rnr_retry: 7,
            retry_cnt: 7,
            ..rdd_connect_attr::default()
        };
        ok(rdd_qp_connect(qp[0], &info[1], ptr::null()));
        ok(rdd_qp_connect(qp[1], &info[0], &attr));
    }
    let mut svc = null_mut();
    let mut sub = null_mut();
    // SAFETY: out-parameters are live locals.
    unsafe {
        ok(rdd_submit_create(qp[0], cq[0], ptr::null(), &mut svc));
        ok(rdd_submit_register(svc, &mut sub));
    }
    let descs: Vec<rdd_submit_desc> = (0..16u64)
        .map(|i| rdd_submit_desc {
            wr_id: i,
            local_addr: s_addr as u64 + i * 64,
            remote_addr: d_addr as u64 + i * 64,
            length: 64,
            lkey,
            rkey,
            ..rdd_submit_desc::default()
        })
        .collect();
    let mut out = [rdd_submit_completion::default(); 32];
    let mut allocs = 0;
    let mut reaped = 0;
    for _round in 0..100 {
        let mut bad = 0;
        let (s, a) = counted(|| {
            // SAFETY: `descs` is a live slice; `bad` a local.
            unsafe { rdd_submit_post(sub, descs.as_ptr(), descs.len(), &mut bad) }
        });
        ok(s);
        allocs += a;
        let mut n = 0;
        // SAFETY: `n` is a local.
        let (s, a) = counted(|| unsafe { rdd_submit_drain(svc, &mut n) });
        ok(s);
        allocs += a;
        let mut work = 0;
        for _ in 0..4 {
            // SAFETY: `work` is a local (not counted: the device's work).
            ok(unsafe { rdd_device_step(dev, &mut work) });
        }
        // SAFETY: `n` is a local.
        let (s, a) = counted(|| unsafe { rdd_submit_complete(svc, &mut n) });
        ok(s);
        allocs += a;
        // SAFETY: `out` and `n` are locals.
        let (s, a) =
            counted(|| unsafe { rdd_submit_reap(sub, out.as_mut_ptr(), out.len(), &mut n) });
        ok(s);
        allocs += a;
        reaped += n;
        let mut k = rdd_submit_counters::default();
        // SAFETY: `k` is a local.
        let (s, a) = counted(|| unsafe { rdd_submit_stats(svc, &mut k) });
        ok(s);
        allocs += a;
    }
    assert_eq!(reaped, 1600);
    // A refused post (a bad descriptor) allocates nothing either.
    let bad_desc = rdd_submit_desc {
        reserved: 1,
        ..descs[0]
    };
    let mut bad = 0;
    // SAFETY: `bad_desc` and `bad` are locals.
    let (s, a) = counted(|| unsafe { rdd_submit_post(sub, &bad_desc, 1, &mut bad) });
    assert_eq!(s, rdd_status::InvalidArgument);
    allocs += a;
    assert_eq!(allocs, 0, "the service's data-path calls allocated");

    assert_eq!(rdd_submit_unregister(sub), rdd_status::Ok);
    assert_eq!(rdd_submit_destroy(svc), rdd_status::Ok);
    for i in 0..2 {
        ok(rdd_qp_destroy(qp[i]));
        ok(rdd_cq_destroy(cq[i]));
    }
    ok(rdd_mr_free(src));
    ok(rdd_mr_free(dst));
    ok(rdd_pd_free(pd));
    ok(rdd_device_close(dev));
}
