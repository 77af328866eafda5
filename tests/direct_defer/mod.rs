//! Deferred doorbells on the direct rxe/siw rings (part of
//! `tests/direct_paths.rs`, which the VM suite runs on rxe and siw):
//! `Qp::post_send_deferred` writes WRs into the ring without the doorbell
//! system call, `Qp::ring` (or the next `post_send`) makes one call for
//! all of them, and recovery flushes deferred WRs like posted ones.

use std::collections::HashMap;
use std::time::Instant;

use super::{fill, open, write_syscalls, SMALL};
use crate::common::*;
use rdma_direct::api::{Access, Backend, Cq, Mr, Qp, QpInit, Transport, Wc, WcStatus};
use rdma_direct::verbs::DataPath;
use rdma_direct::{SendFlags, SendOp, SendWr};

/// `n` signaled 8-byte WRITEs, ids `first..`, from `src` offset `8 * i`
/// to the same offset of `dst`.
fn writes<'a>(
    src: &'a [rdma_direct::Sge; 16],
    dst: &Mr<Dev>,
    first: u64,
    n: usize,
) -> Vec<SendWr<'a>> {
    (0..n)
        .map(|i| {
            SendWr::new(
                first + i as u64,
                SendOp::Write {
                    remote: dst.remote(i * 8),
                },
                core::slice::from_ref(&src[i]),
                SendFlags::SIGNALED,
            )
        })
        .collect()
}

/// Waits for `n` successful completions; returns their ids in order.
#[track_caller]
fn ids(cq: &mut Cq<Dev>, qp: &mut Qp<Dev>, n: usize) -> Vec<u64> {
    let got = wait(cq, qp, n);
    for w in &got {
        assert_eq!(w.status, WcStatus::SUCCESS, "{w:?}");
    }
    got.iter().map(|w| w.wr_id).collect()
}

#[test]
fn deferred_posts_ring_once_per_batch() {
    for (name, ip) in devices("deferred_posts_ring_once_per_batch") {
        let dev = open(&name, DataPath::Direct);
        let iwarp = dev.backend().port().transport == Transport::Iwarp;
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(256).unwrap();
        let cq_b = dev.create_cq(256).unwrap();
        let init = QpInit {
            max_send_wr: 64,
            ..SMALL
        };
        let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
        let _conns = connect_qps(&mut a, &mut b, &dev, ip, false, &|_, _| {});
        let mut src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let mut dst = pd.register(4096, ALL_REMOTE).unwrap();
        let sges: [rdma_direct::Sge; 16] = core::array::from_fn(|i| src.sge(i * 8, 8));

        // 16 deferred WRITEs, one call each: no system call; one ring: one.
        for round in 0..4u64 {
            fill(&mut src, round as u8 + 1);
            dst.as_mut_slice().fill(0);
            let wrs = writes(&sges, &dst, round * 100, 16);
            let before = write_syscalls();
            for w in &wrs {
                a.post_send_deferred(core::slice::from_ref(w)).unwrap();
            }
            assert_eq!(
                write_syscalls() - before,
                0,
                "{name}: a deferred post made a system call"
            );
            assert_eq!(a.outstanding(), 16, "{name}: deferred WRs are outstanding");
            assert!(a.ring().unwrap(), "{name}: the ring had work");
            let calls = write_syscalls() - before;
            // rxe: exactly one POST_SEND; siw: at most one (it rings only
            // when its transmitter may be idle, docs/spec/siw.md §4).
            if iwarp {
                assert!(calls <= 1, "{name}: {calls} system calls for one ring");
            } else {
                assert_eq!(calls, 1, "{name}: {calls} system calls for one ring");
            }
            let want: Vec<u64> = (0..16).map(|i| round * 100 + i).collect();
            assert_eq!(ids(&mut cq_a, &mut a, 16), want, "{name}: in order");
            assert_eq!(
                &dst.as_slice()[..128],
                &src.as_slice()[..128],
                "{name}: data"
            );
        }

        // Nothing pending: ring does nothing.
        let before = write_syscalls();
        assert!(!a.ring().unwrap(), "{name}");
        assert_eq!(write_syscalls() - before, 0, "{name}");

        // A deferred WR, then one posted at once: one call rings both.
        fill(&mut src, 0x77);
        dst.as_mut_slice().fill(0);
        let wrs = writes(&sges, &dst, 500, 2);
        let before = write_syscalls();
        a.post_send_deferred(&wrs[..1]).unwrap();
        a.post_send(&wrs[1..]).unwrap();
        let calls = write_syscalls() - before;
        assert!(calls <= 1, "{name}: {calls} system calls");
        assert!(calls == 1 || iwarp, "{name}: the post did not ring");
        assert_eq!(ids(&mut cq_a, &mut a, 2), [500, 501], "{name}");
        assert_eq!(&dst.as_slice()[..16], &src.as_slice()[..16], "{name}");
        assert!(!a.ring().unwrap(), "{name}: nothing left pending");
        quiet(&mut cq_a, &mut a);
    }
}

#[test]
fn recovery_flushes_deferred_wrs_once() {
    for (name, ip) in devices("recovery_flushes_deferred_wrs_once") {
        let dev = open(&name, DataPath::Direct);
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(256).unwrap();
        let cq_b = dev.create_cq(256).unwrap();
        let mut a = pd.create_qp(&cq_a, &cq_a, &SMALL).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, &SMALL).unwrap();
        let _conns = connect_qps(&mut a, &mut b, &dev, ip, false, &|_, _| {});
        let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let dst = pd.register(4096, ALL_REMOTE).unwrap();
        let sges: [rdma_direct::Sge; 16] = core::array::from_fn(|i| src.sge(i * 8, 8));
        // Two executed first (a ring in between), then eight deferred and
        // never rung, the last unsignaled.
        let done = writes(&sges, &dst, 0, 2);
        a.post_send_deferred(&done).unwrap();
        a.ring().unwrap();
        assert_eq!(ids(&mut cq_a, &mut a, 2), [0, 1], "{name}");
        let mut wrs = writes(&sges, &dst, 10, 8);
        wrs[7].flags = SendFlags::NONE;
        for w in &wrs {
            a.post_send_deferred(core::slice::from_ref(w)).unwrap();
        }
        assert_eq!(a.outstanding(), 8, "{name}");
        let mut seen: HashMap<u64, Vec<WcStatus>> = HashMap::new();
        let t0 = Instant::now();
        let rec = a
            .drain_and_reset(&mut cq_a, None, WAIT, |w: &Wc| {
                seen.entry(w.wr_id).or_default().push(w.status)
            })
            .unwrap_or_else(|e| panic!("{name}: recovery: {e}"));
        assert!(t0.elapsed() < WAIT, "{name}");
        // Each signaled deferred WR exactly once (flushed: they were never
        // rung; an unsignaled one only if it failed, as always).
        for id in 10..17 {
            let st = seen
                .get(&id)
                .unwrap_or_else(|| panic!("{name}: {id} lost: {seen:?}"));
            assert_eq!(st.len(), 1, "{name}: {id} reported {st:?}");
        }
        for (id, st) in &seen {
            assert!((10..18).contains(id), "{name}: {id} reported: {st:?}");
            assert_eq!(st.len(), 1, "{name}: {id} reported {st:?}");
        }
        assert_eq!(rec.reported, seen.len(), "{name}");
        assert_eq!(a.outstanding(), 0, "{name}");
        assert!(!a.ring().unwrap(), "{name}: nothing left after RESET");
    }
}
