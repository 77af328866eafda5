//! Unit tests of the multi-producer ring: ordering, coalescing, lists, full.

use super::*;
use std::vec::Vec;

/// Doorbells rung: (from, to, last).
type Rung = Vec<(u32, u32, u32)>;

fn ring(cnt: u32, max_nbb: u32) -> (Vec<AtomicU32>, MpRing<Rung>) {
    let ready: Vec<AtomicU32> = (0..cnt).map(|_| AtomicU32::new(0)).collect();
    let p = NonNull::new(ready.as_ptr() as *mut AtomicU32).unwrap();
    // SAFETY: `ready` outlives the ring in every test (returned first).
    let r = unsafe { MpRing::new(cnt, max_nbb, 0, p, Vec::new()) };
    (ready, r)
}

#[test]
fn publishes_in_order_and_coalesces() {
    let (_ready, r) = ring(8, 2);
    let a = r.reserve(2).unwrap();
    let b = r.reserve(1).unwrap();
    let c = r.reserve(1).unwrap();
    assert_eq!((a, b, c), (0, 2, 3));
    // b and c are ready first: nothing can be published past a.
    r.publish(b, b + 1, |s, f, t, l| s.push((f, t, l)));
    r.publish(c, c + 1, |s, f, t, l| s.push((f, t, l)));
    assert_eq!(r.published(), 0);
    r.publish(a, a + 2, |s, f, t, l| s.push((f, t, l)));
    assert_eq!(r.published(), 4);
    let rang = r.state.with(|s| {
        // SAFETY: single-threaded test, no ringer active.
        unsafe { (*s).clone() }
    });
    assert_eq!(
        rang,
        std::vec![(0, 4, 3)],
        "one doorbell for the whole prefix"
    );
}

/// Two producers and the retiring thread on real threads (small, so
/// Miri's data-race detector can run it).
#[test]
fn two_threads_post_while_one_retires() {
    use std::sync::atomic::AtomicU64;
    let (_ready, r) = ring(4, 1);
    let slots: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
    let per = if cfg!(miri) { 6 } else { 2000 };
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let (r, slots) = (&r, &slots);
            sc.spawn(move || {
                for i in 0..per {
                    let start = loop {
                        match r.reserve(1) {
                            Ok(s) => break s,
                            Err(Full) => std::thread::yield_now(),
                        }
                    };
                    slots[(start % 4) as usize].store(t << 32 | i, Ordering::Relaxed);
                    r.publish(start, start + 1, |_, _, _, _| {});
                }
            });
        }
        // The poller: retire every published WQE in order.
        let mut seen = [0u64; 2];
        let mut done = 0u32;
        while done < 2 * per as u32 {
            if r.published().wrapping_sub(done) == 0 {
                std::thread::yield_now();
                continue;
            }
            let v = slots[(done % 4) as usize].load(Ordering::Relaxed);
            // SAFETY: this thread is the only retirer.
            let got = unsafe { r.retire(done as u16, |s| Some(s + 1)) };
            assert_eq!(got, Some(done));
            let (t, i) = ((v >> 32) as usize, v & 0xffff_ffff);
            assert_eq!(i, seen[t], "thread {t}'s WQEs in its order");
            seen[t] += 1;
            done += 1;
        }
    });
}

#[test]
fn a_list_claims_the_longest_prefix_that_fits() {
    let (_ready, r) = ring(8, 2);
    let sizes = [2u32, 1, 2, 2, 1];
    // 8 BBs free: 2+1+2+2 = 7 fit, the last 1 would too (8).
    assert_eq!(r.reserve_prefix(5, |i| sizes[i]), Ok((0, 5)));
    assert_eq!(r.reserve_prefix(1, |_| 1), Err(Full));
    // Retire the first 3 BBs (the WQEs at 0 and 2), then a list whose
    // second WQE does not fit.
    r.publish(0, 2, |_, _, _, _| {});
    r.publish(2, 3, |_, _, _, _| {});
    // SAFETY: single-threaded test: the only retirer.
    assert_eq!(unsafe { r.retire(2, |_| Some(3)) }, Some(2));
    assert_eq!(r.reserve_prefix(3, |i| [2u32, 2, 1][i]), Ok((8, 1)));
    assert_eq!(r.reserve_prefix(2, |_| 2), Err(Full), "1 BB left");
    assert_eq!(r.reserve_prefix(2, |_| 1), Ok((10, 1)));
    assert_eq!(r.free(), 0);
}

#[test]
fn full_and_retire() {
    let (_ready, r) = ring(4, 2);
    let a = r.reserve(2).unwrap();
    let b = r.reserve(2).unwrap();
    assert_eq!(r.reserve(1), Err(Full));
    r.publish(a, 2, |_, _, _, _| {});
    r.publish(b, 4, |_, _, _, _| {});
    // SAFETY: single-threaded test: this is the only retiring thread.
    unsafe {
        // Counter 1 is the middle of WQE a: no entry says it starts there.
        assert_eq!(r.retire(1, |_| None), None);
        assert_eq!(r.retire(9, |_| Some(10)), None, "not published");
        assert_eq!(r.retire(2, |s| Some(s + 2)), Some(2));
        assert_eq!(r.retire(0, |s| Some(s + 2)), None, "already retired");
    }
    assert_eq!(r.free(), 4);
    assert_eq!(r.reserve(4), Ok(4));
}
