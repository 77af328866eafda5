//! The kernel side on its own thread, racing the poster and poller.

use super::*;

/// A raw pointer the kernel thread may carry.
struct Shared(*mut u8);
// SAFETY: the pointed-to buffers outlive the scoped threads, and every
// shared word is accessed atomically (the point of the test).
unsafe impl Send for Shared {}

/// The kernel on its own thread: it consumes the SQ and produces one CQE
/// per WQE, concurrently with the poster/poller. Any missing
/// acquire/release pair shows up as a data race under Miri (the WQE and
/// CQE payloads are plain accesses).
#[test]
fn concurrent_kernel_thread() {
    const N: u64 = if cfg!(miri) { 60 } else { 5000 };
    let sqf = Fake::new(8, 8);
    let cqf = Fake::new(7, 4);
    let mut q = sq(&sqf, caps(1, 0, 0));
    let mut c = cq(&cqf);
    let (sp, cp) = (Shared(sqf.ptr()), Shared(cqf.ptr()));
    std::thread::scope(|s| {
        s.spawn(move || {
            let (sq_base, cq_base) = (sp, cp);
            let w = |b: &Shared, off: usize| {
                // SAFETY: a header word of a live buffer.
                unsafe { &*b.0.add(off).cast::<AtomicU32>() }
            };
            let (mut k, mut cq_put) = (0u32, 0u32);
            let mut done = 0u64;
            while done < N {
                let prod = w(&sq_base, 128).load(Ordering::Acquire);
                if k == prod {
                    std::thread::yield_now();
                    continue;
                }
                // SAFETY: slot k of the SQ (256-byte elements), published.
                let wqe = unsafe { sq_base.0.add(HEADER_SIZE + ((k as usize) << 8)) };
                // SAFETY: as above; the kernel also scribbles scratch.
                let id = unsafe {
                    let id = wqe.cast::<u64>().read();
                    wqe.add(144).cast::<u32>().write(0x5ca7);
                    id
                };
                assert_eq!(id, done);
                // Wait for CQ space (one slot stays empty).
                while (cq_put + 1) & 3 == w(&cq_base, 256).load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                let mut e = cqe(id, 0, 1, 0, 8, 0, 0);
                put32(&mut e, 28, 7);
                // SAFETY: CQ slot cq_put (128-byte elements), free.
                unsafe {
                    let p = cq_base.0.add(HEADER_SIZE + ((cq_put as usize) << 7));
                    core::ptr::copy_nonoverlapping(e.as_ptr(), p, 48);
                }
                k = (k + 1) & 7;
                w(&sq_base, 256).store(k, Ordering::Release);
                cq_put = (cq_put + 1) & 3;
                w(&cq_base, 128).store(cq_put, Ordering::Release);
                done += 1;
            }
        });
        let s1 = [Sge::new(0x1000, 8, 1)];
        let (mut posted, mut polled) = (0u64, 0u64);
        let mut out = [Wc::default(); 4];
        while polled < N {
            if posted < N {
                let wr = SendWr::new(posted, SendOp::Send, &s1, SendFlags::SIGNALED);
                match q.tpost(&[wr]) {
                    Ok(p) => {
                        assert_eq!(p.count, 1);
                        posted += 1;
                    }
                    Err(e) => assert_eq!(e.error, Error::SqFull),
                }
            }
            let n = c.poll(&mut out).unwrap();
            for x in &out[..n] {
                assert_eq!(
                    (x.wr_id, x.qp_num, x.opcode),
                    (polled, 7, WcOpcode::RDMA_WRITE)
                );
                polled += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
    });
}
