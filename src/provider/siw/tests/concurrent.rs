//! The kernel side on its own thread, racing the poster and poller.

use super::*;

/// A raw pointer the kernel thread may carry.
struct Shared(*mut u8);
// SAFETY: the pointed-to buffers outlive the scoped threads, and every
// flags word is accessed atomically (the point of the test).
unsafe impl Send for Shared {}

/// The kernel on its own thread: it picks up SQEs and produces one CQE per
/// SQE, concurrently with the poster/poller. Any missing acquire/release
/// pair shows up as a data race under Miri (the element payloads are plain
/// accesses).
#[test]
fn concurrent_kernel_thread() {
    const N: u64 = if cfg!(miri) { 60 } else { 5000 };
    let sqf = Fake::sq(4);
    let cqf = Fake::cq(4);
    let mut q = sq(&sqf, caps(1, 0, 0), false);
    let mut c = cq(&cqf);
    let (sp, cp) = (Shared(sqf.ptr()), Shared(cqf.ptr()));
    std::thread::scope(|s| {
        s.spawn(move || {
            let (sq_base, cq_base) = (sp, cp);
            let (mut get, mut put) = (0u32, 0u32);
            let mut done = 0u64;
            while done < N {
                // SAFETY: slot `get` of the SQ (120-byte elements).
                let sqe = unsafe { sq_base.0.add((get % 4) as usize * 120) };
                // SAFETY: its flags word.
                let sw = unsafe { &*sqe.add(8).cast::<AtomicU32>() };
                if sw.load(Ordering::Acquire).to_ne_bytes()[0] & 1 == 0 {
                    std::thread::yield_now();
                    continue;
                }
                // SAFETY: VALID: published by the poster, ours to read.
                let (id, len) =
                    unsafe { (sqe.cast::<u64>().read(), sqe.add(32).cast::<u32>().read()) };
                assert_eq!((id, len), (done, 8));
                // Clear the u16 flags (keep num_sge, opcode), as at pickup.
                sw.fetch_and(u32::from_ne_bytes([0, 0, 0xff, 0xff]), Ordering::SeqCst);
                get = get.wrapping_add(1);
                // SAFETY: CQ slot `put` (32-byte elements) and its flags.
                let (cqe, cw) = unsafe {
                    let p = cq_base.0.add((put % 4) as usize * 32);
                    (p, &*p.add(8).cast::<AtomicU32>())
                };
                while cw.load(Ordering::Acquire) & 0xff != 0 {
                    std::thread::yield_now();
                }
                // SAFETY: the CQE is free (flags 0): ours to write.
                unsafe {
                    cqe.cast::<u64>().write(id);
                    cqe.add(12).cast::<u32>().write(len);
                    cqe.add(16).cast::<u64>().write(0);
                    cqe.add(24).cast::<u64>().write(9);
                }
                cw.store(u32::from_ne_bytes([1, 3, 0, 0]), Ordering::Release);
                put = put.wrapping_add(1);
                done += 1;
            }
        });
        let s1 = [Sge::new(0x1000, 8, 1)];
        let (mut posted, mut polled) = (0u64, 0u64);
        let mut out = [Wc::default(); 3];
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
                assert_eq!((x.wr_id, x.qp_num, x.opcode), (polled, 9, WcOpcode::SEND));
                polled += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
    });
}
