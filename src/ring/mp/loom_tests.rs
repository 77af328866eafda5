//! The whole post → doorbell → device → CQE → poll → retire cycle with
//! two producers, a model device and the poller on a 4-BB ring.
//! Run with `scripts/loom.sh` (LOOM_MAX_PREEMPTIONS=2).
use super::*;
use loom::sync::atomic::AtomicU8;
use loom::sync::Arc;
use loom::thread;
use std::vec::Vec;

const CNT: u32 = 4;

/// Model queue memory: the ring's ready words, the "WQE" of each BB
/// (its wr id, written by the producer, read by the device), the
/// side table (read by the poller), a doorbell record and a 4-entry CQ
/// with the mlx5 owner-bit protocol.
struct Model {
    _ready: Vec<AtomicU32>,
    ring: MpRing<u32>,
    wqe: Vec<UnsafeCell<u64>>,
    side: Vec<UnsafeCell<(u64, u32)>>,
    dbrec: AtomicU32,
    cqe: Vec<UnsafeCell<u16>>,
    op_own: Vec<AtomicU8>,
}

fn model() -> Arc<Model> {
    let ready: Vec<AtomicU32> = (0..CNT).map(|_| AtomicU32::new(0)).collect();
    let p = NonNull::new(ready.as_ptr() as *mut AtomicU32).unwrap();
    // SAFETY: `ready` is kept alive in the same struct.
    let ring = unsafe { MpRing::new(CNT, 1, 0, p, 0u32) };
    Arc::new(Model {
        _ready: ready,
        ring,
        wqe: (0..CNT).map(|_| UnsafeCell::new(0)).collect(),
        side: (0..CNT).map(|_| UnsafeCell::new((0, 0))).collect(),
        dbrec: AtomicU32::new(0),
        cqe: (0..CNT).map(|_| UnsafeCell::new(0)).collect(),
        // INVALID opcode, owner 0, as a fresh mlx5 CQ.
        op_own: (0..CNT).map(|_| AtomicU8::new(0xf0)).collect(),
    })
}

/// One producer posting `n` one-BB WQEs with ids `id0..`; returns how
/// many were refused with Full (back-pressure, never a wait).
fn produce(m: &Model, id0: u64, n: u64) -> u64 {
    produce_with(m, id0, n, false)
}

fn produce_with(m: &Model, id0: u64, n: u64, broken: bool) -> u64 {
    let mut full = 0;
    for id in id0..id0 + n {
        let Ok(start) = m.ring.reserve(1) else {
            full += 1;
            continue;
        };
        let slot = (start % CNT) as usize;
        // SAFETY (model): the BB is reserved by this producer only.
        m.wqe[slot].with_mut(|p| unsafe { *p = id });
        // SAFETY (model): as above.
        m.side[slot].with_mut(|p| unsafe { *p = (id, start + 1) });
        let ring = |rung: &mut u32, _from: u32, to: u32, _last: u32| {
            // The doorbell record: the device acquires it.
            *rung = to;
            m.dbrec.store(to, Ordering::Release);
        };
        if broken {
            m.ring.publish_broken(start, start + 1, ring);
        } else {
            m.ring.publish(start, start + 1, ring);
        }
    }
    full
}

/// One producer posting `n` one-BB WQEs with ids `id0..` as lists of
/// up to `list` WQEs: one reservation per list (its longest prefix that
/// fits), each WQE marked ready as it is written, one doorbell request
/// per list. Returns how many were refused.
fn produce_lists(m: &Model, id0: u64, n: u64, list: u64) -> u64 {
    let mut full = 0;
    let mut id = id0;
    while id < id0 + n {
        let want = list.min(id0 + n - id) as usize;
        let Ok((start, got)) = m.ring.reserve_prefix(want, |_| 1) else {
            full += want as u64;
            id += want as u64;
            continue;
        };
        for k in 0..got as u32 {
            let bb = start + k;
            let slot = (bb % CNT) as usize;
            let wid = id + k as u64;
            // SAFETY (model): the BB is reserved by this producer only.
            m.wqe[slot].with_mut(|p| unsafe { *p = wid });
            // SAFETY (model): as above.
            m.side[slot].with_mut(|p| unsafe { *p = (wid, bb + 1) });
            m.ring.mark_ready(bb, bb + 1);
        }
        m.ring.request_doorbell(|rung: &mut u32, _from, to, _last| {
            *rung = to;
            m.dbrec.store(to, Ordering::Release);
        });
        full += (want - got) as u64;
        id += want as u64;
    }
    full
}

/// One step of the model device: executes the WQEs published since
/// `done` in order and writes one CQE for each (all signaled), owner
/// byte last with Release.
fn device_step(m: &Model, done: &mut u32) {
    let pi = m.dbrec.load(Ordering::Acquire);
    while *done != pi {
        let slot = (*done % CNT) as usize;
        // SAFETY (model): a published WQE, read-only for the device.
        let _id = m.wqe[slot].with(|p| unsafe { *p });
        // The CQ has CNT entries and at most CNT WQEs are outstanding,
        // so the entry is free.
        m.cqe[slot].with_mut(|p| unsafe { *p = *done as u16 });
        let owner = ((*done / CNT) & 1) as u8;
        m.op_own[slot].store(owner, Ordering::Release);
        *done += 1;
    }
}

/// One step of the poller: consumes owned CQEs (owner-bit test, then
/// retire) and records the completed ids.
fn poll_step(m: &Model, ci: &mut u32, ids: &mut Vec<u64>) {
    loop {
        let slot = (*ci % CNT) as usize;
        let op_own = m.op_own[slot].load(Ordering::Acquire);
        let owned = op_own >> 4 != 0xf && (op_own & 1) as u32 == (*ci / CNT) & 1;
        if !owned {
            return;
        }
        // SAFETY (model): the entry belongs to software now.
        let counter = m.cqe[slot].with(|p| unsafe { *p });
        let mut id = 0;
        let side = |s: u32| {
            // SAFETY (model): the retirer alone reads a published slot.
            let (i, end) = m.side[(s % CNT) as usize].with(|p| unsafe { *p });
            id = i;
            Some(end)
        };
        // SAFETY: this is the only retiring thread.
        let start = unsafe { m.ring.retire(counter, side) };
        assert_eq!(start, Some(*ci), "CQE {ci} names a published WQE");
        ids.push(id);
        *ci += 1;
    }
}

/// Device and poller on one thread (the model device keeps no state of
/// its own to race on; pairing it with the poller bounds the model).
fn device_and_poll(m: &Model, total: u32) -> Vec<u64> {
    let (mut done, mut ci, mut ids) = (0, 0, Vec::new());
    while ci < total {
        device_step(m, &mut done);
        poll_step(m, &mut ci, &mut ids);
        if ci < total {
            thread::yield_now();
        }
    }
    ids
}

fn run(per_producer: u64) {
    // Producers race each other and the device/poller thread; the ring
    // is large enough that nothing is refused.
    let total = (2 * per_producer) as u32;
    assert!(total <= CNT);
    let m = model();
    let (m1, m2) = (m.clone(), m.clone());
    let p1 = thread::spawn(move || produce(&m1, 100, per_producer));
    let p2 = thread::spawn(move || produce(&m2, 200, per_producer));
    let mut ids = device_and_poll(&m, total);
    assert_eq!(p1.join().unwrap() + p2.join().unwrap(), 0);
    ids.sort_unstable();
    let mut want: Vec<u64> = (100..100 + per_producer)
        .chain(200..200 + per_producer)
        .collect();
    want.sort_unstable();
    assert_eq!(ids, want, "every posted WR completes exactly once");
    assert_eq!(m.ring.published(), total);
    assert_eq!(m.ring.retired(), total);
}

/// A loom builder that tolerates the spin-and-yield loops of the
/// device and the poller (each yield is a branch).
fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    b
}

#[test]
fn two_producers_device_and_poller() {
    builder().check(|| run(1));
}

/// A producer posting a list of two WQEs (one reservation, one
/// doorbell request) races a producer posting one WQE, the device and
/// the poller: every WR completes exactly once, in each producer's
/// order.
#[test]
fn a_list_and_a_single_post_race() {
    builder().check(|| {
        let m = model();
        let (m1, m2) = (m.clone(), m.clone());
        let p1 = thread::spawn(move || produce_lists(&m1, 100, 2, 2));
        let p2 = thread::spawn(move || produce(&m2, 200, 1));
        let ids = device_and_poll(&m, 3);
        assert_eq!(p1.join().unwrap() + p2.join().unwrap(), 0);
        let mine: Vec<u64> = ids.iter().copied().filter(|&i| i < 200).collect();
        assert_eq!(mine, std::vec![100, 101], "the list completes in order");
        assert!(ids.contains(&200));
        assert_eq!(m.ring.retired(), 3);
    });
}

/// Two lists of three one-BB WQEs into the 4-BB ring with nothing
/// retired: the second list gets only the prefix that still fits, and
/// every claimed WQE is published.
#[test]
fn lists_claim_a_prefix_when_the_ring_is_short() {
    builder().check(|| {
        let m = model();
        let (m1, m2) = (m.clone(), m.clone());
        let p1 = thread::spawn(move || produce_lists(&m1, 100, 3, 3));
        let p2 = thread::spawn(move || produce_lists(&m2, 200, 3, 3));
        let full = p1.join().unwrap() + p2.join().unwrap();
        assert_eq!(full, 2);
        assert_eq!(m.ring.published(), 4, "every claimed WQE published");
    });
}

/// The model must catch a Relaxed publish: with it, the ringer (and
/// through the doorbell record, the device) can see a ready word
/// without the WQE written before it. Loom reports the unsynchronised
/// read of the WQE cell ("causality violation") in the schedule where
/// producer 2 rings for producer 1's WQE: p1 writes its WQE, stores
/// ready Relaxed, p2 (the ringer) acquires ready (no edge: Relaxed),
/// publishes, the device reads p1's WQE cell -> race.
#[test]
fn relaxed_publish_is_caught() {
    let caught = std::panic::catch_unwind(|| {
        builder().check(|| {
            let m = model();
            let (m1, m2) = (m.clone(), m.clone());
            let p1 = thread::spawn(move || produce_with(&m1, 100, 1, true));
            let p2 = thread::spawn(move || produce_with(&m2, 200, 1, true));
            let _ = device_and_poll(&m, 2);
            p1.join().unwrap();
            p2.join().unwrap();
        })
    });
    assert!(caught.is_err(), "loom did not find the broken ordering");
}

#[test]
fn producers_fill_the_ring() {
    // 2 × 3 one-BB WQEs into 4 BBs with nothing retired yet: some
    // reservations must fail with Full, none may block.
    builder().check(|| {
        let m = model();
        let (m1, m2) = (m.clone(), m.clone());
        let p1 = thread::spawn(move || produce(&m1, 100, 3));
        let p2 = thread::spawn(move || produce(&m2, 200, 3));
        let full = p1.join().unwrap() + p2.join().unwrap();
        assert_eq!(full, 2);
        assert_eq!(m.ring.published(), 4, "every reserved WQE published");
    });
}

/// A CQ shared by two QPs: one producer per QP, the device completes
/// both onto one CQ in whatever order it runs them, and the poller
/// routes each CQE by QP number to that QP's retirement.
#[test]
fn shared_cq_routes_to_the_right_qp() {
    builder().check(|| {
        let qa = model();
        let qb = model();
        let (a1, b1) = (qa.clone(), qb.clone());
        let pa = thread::spawn(move || produce(&a1, 100, 2));
        let pb = thread::spawn(move || produce(&b1, 200, 1));
        // The shared CQ: (qp, counter) entries with the owner protocol.
        let cqe: Vec<UnsafeCell<(u8, u16)>> = (0..CNT).map(|_| UnsafeCell::new((0, 0))).collect();
        let op_own: Vec<AtomicU8> = (0..CNT).map(|_| AtomicU8::new(0xf0)).collect();
        let qps = [&qa, &qb];
        let (mut done, mut pi, mut ci) = ([0u32; 2], 0u32, 0u32);
        let mut ids = Vec::new();
        while ci < 3 {
            // Device: alternate between the QPs' doorbell records.
            for q in 0..2 {
                let db = qps[q].dbrec.load(Ordering::Acquire);
                if done[q] != db {
                    let slot = (pi % CNT) as usize;
                    // SAFETY (model): a free CQ entry, written by the device.
                    cqe[slot].with_mut(|p| unsafe { *p = (q as u8, done[q] as u16) });
                    op_own[slot].store(((pi / CNT) & 1) as u8, Ordering::Release);
                    done[q] += 1;
                    pi += 1;
                }
            }
            // Poller: route by QP.
            let slot = (ci % CNT) as usize;
            let oo = op_own[slot].load(Ordering::Acquire);
            if oo >> 4 != 0xf && (oo & 1) as u32 == (ci / CNT) & 1 {
                // SAFETY (model): the entry belongs to software now.
                let (q, counter) = cqe[slot].with(|p| unsafe { *p });
                let m = qps[q as usize];
                let side = |s: u32| {
                    // SAFETY (model): the retirer alone reads a published
                    // slot.
                    let (i, end) = m.side[(s % CNT) as usize].with(|p| unsafe { *p });
                    ids.push(i);
                    Some(end)
                };
                // SAFETY: the only retirer of each ring.
                let r = unsafe { m.ring.retire(counter, side) };
                assert!(r.is_some(), "CQE routed to QP {q} names its WQE");
                ci += 1;
            } else {
                thread::yield_now();
            }
        }
        pa.join().unwrap();
        pb.join().unwrap();
        ids.sort_unstable();
        assert_eq!(ids, std::vec![100, 101, 200]);
        assert_eq!((qa.ring.retired(), qb.ring.retired()), (2, 1));
    });
}

/// Poster/poller hand-off (SPSC) around the ring end: one producer
/// posts 6 WQEs into the 4-BB ring, retrying on Full (the poller on the
/// other thread frees space), so slots and side-table entries are
/// reused across laps while the poller reads them.
#[test]
fn spsc_handoff_wraps_the_ring() {
    builder().check(|| {
        let m = model();
        let mp = m.clone();
        let p = thread::spawn(move || {
            for id in 0..6u64 {
                while produce(&mp, id, 1) == 1 {
                    thread::yield_now();
                }
            }
        });
        let ids = device_and_poll(&m, 6);
        p.join().unwrap();
        assert_eq!(ids, (0..6).collect::<Vec<u64>>(), "in order, exactly once");
        assert_eq!(m.ring.retired(), 6);
    });
}
