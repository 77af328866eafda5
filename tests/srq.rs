//! Shared receive queues on the software device, through the safe API:
//! receives taken by several QPs, the SRQ WQE index in the completions,
//! RNR on an empty SRQ, the limit event, refusals that change nothing, a
//! stale completion reported as corrupt, (in `srq/random.rs`) 64 QPs on
//! one SRQ under a seeded random workload with faults, and (in
//! `srq/recover.rs`) recovery of a QP on an SRQ.

use rdma_direct::api::*;
use rdma_direct::soft::SoftDevice;
use rdma_direct::{Error, PostError, RecvWr, SendFlags, SendOp, SendWr};

#[path = "srq/rig.rs"]
mod rig;
use rig::*;

#[path = "srq/random.rs"]
mod random;

#[path = "srq/recover.rs"]
mod recover;

fn send(wr_id: u64, op: SendOp, sge: &[rdma_direct::Sge]) -> SendWr<'_> {
    SendWr::new(wr_id, op, sge, SendFlags::SIGNALED)
}

#[test]
fn receives_are_taken_by_any_attached_qp() {
    let mut r = rig(2, 8, 2, 7);
    let mut src = r.pd.register(256, Access::NONE).unwrap();
    let dst = r.pd.register(1024, RW).unwrap();
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = i as u8;
    }
    assert_eq!((r.srq.max_wr(), r.srq.max_sge()), (15, 3));
    let sges: Vec<_> = (0..4).map(|i| dst.sge(i * 128, 64)).collect();
    let wrs: Vec<_> = (0..4)
        .map(|i| RecvWr {
            wr_id: 100 + i as u64,
            sges: &sges[i..i + 1],
        })
        .collect();
    r.srq.post_recv(&wrs).unwrap();
    r.a[1]
        .post_send_one(&send(1, SendOp::Send, &[src.sge(0, 10)]))
        .unwrap();
    r.run();
    r.a[0]
        .post_send_one(&send(2, SendOp::SendImm { imm: 7 }, &[src.sge(10, 20)]))
        .unwrap();
    r.run();
    r.a[1]
        .post_send_one(&send(
            3,
            SendOp::WriteImm {
                remote: dst.remote(512),
                imm: 9,
            },
            &[src.sge(30, 8)],
        ))
        .unwrap();
    r.run();
    let wa = r.poll_a();
    assert_eq!(wa.len(), 3);
    assert!(wa.iter().all(|w| w.status == WcStatus::SUCCESS));
    let wb = r.poll_b();
    let got: Vec<_> = wb
        .iter()
        .map(|w| {
            (
                w.wr_id, w.qp_num, w.opcode, w.byte_len, w.imm_data, w.status,
            )
        })
        .collect();
    let (b0, b1) = (r.b[0].qpn(), r.b[1].qpn());
    assert_eq!(
        got,
        [
            (100, b1, WcOpcode::RECV, 10, 0, WcStatus::SUCCESS),
            (101, b0, WcOpcode::RECV, 20, 7, WcStatus::SUCCESS),
            (
                102,
                b1,
                WcOpcode::RECV_RDMA_WITH_IMM,
                8,
                9,
                WcStatus::SUCCESS
            ),
        ]
    );
    let d = dst.as_slice();
    assert_eq!(&d[0..10], &src.as_slice()[0..10]);
    assert_eq!(&d[128..148], &src.as_slice()[10..30]);
    assert_eq!(&d[512..520], &src.as_slice()[30..38]);
    // WQE 102's receive buffer (256..) was not touched by the WRITE.
    assert!(d[256..320].iter().all(|&x| x == 0));
    assert_eq!(r.b[0].srqn(), Some(r.srq.srqn()));
    assert_eq!(r.a[0].srqn(), None);
    // The free list has the three WQEs back: 15 more posts fit at once
    // (one receive, 103, is still posted).
    let more: Vec<_> = (0..14)
        .map(|i| RecvWr {
            wr_id: 200 + i,
            sges: &sges[0..1],
        })
        .collect();
    r.srq.post_recv(&more).unwrap();
    assert_eq!(
        r.srq.post_recv_one(&RecvWr {
            wr_id: 999,
            sges: &sges[0..1],
        }),
        Err(Error::RqFull)
    );
}

#[test]
fn an_empty_srq_is_an_rnr() {
    let mut r = rig(1, 4, 1, 2);
    let src = r.pd.register(64, Access::NONE).unwrap();
    let dst = r.pd.register(64, RW).unwrap();
    r.a[0]
        .post_send_one(&send(1, SendOp::Send, &[src.sge(0, 8)]))
        .unwrap();
    r.run();
    assert!(r.poll_a().is_empty(), "waits for a receive");
    r.srq
        .post_recv_one(&RecvWr {
            wr_id: 5,
            sges: &[dst.sge(0, 64)],
        })
        .unwrap();
    r.run();
    assert_eq!(r.poll_a()[0].status, WcStatus::SUCCESS);
    assert_eq!(r.poll_b()[0].wr_id, 5);
    // With the SRQ empty again and rnr_retry 2, the third retry fails.
    r.a[0]
        .post_send_one(&send(2, SendOp::Send, &[src.sge(0, 8)]))
        .unwrap();
    for _ in 0..8 {
        r.dev.backend().step();
    }
    let wa = r.poll_a();
    assert_eq!(wa[0].status, WcStatus::RNR_RETRY_EXC_ERR);
    assert!(r.poll_b().is_empty());
}

#[test]
fn the_limit_event_fires_once_per_arm_at_the_limit() {
    let mut r = rig(1, 15, 1, 7);
    let src = r.pd.register(64, Access::NONE).unwrap();
    let dst = r.pd.register(64, RW).unwrap();
    let sge = [dst.sge(0, 64)];
    let wrs: Vec<_> = (0..10)
        .map(|i| RecvWr {
            wr_id: i,
            sges: &sge,
        })
        .collect();
    r.srq.post_recv(&wrs).unwrap();
    assert_eq!(r.srq.arm_limit(16), Err(Error::InvalidAttribute));
    assert_eq!(
        r.srq.query().unwrap().srq_limit,
        0,
        "a refused arm changes nothing"
    );
    r.srq.arm_limit(4).unwrap();
    assert_eq!(
        r.srq.query().unwrap(),
        SrqAttr {
            max_wr: 15,
            max_sge: 1,
            srq_limit: 4
        }
    );
    let srqn = r.srq.srqn();
    let mut fired_at = Vec::new();
    for k in 1..=10u32 {
        r.a[0]
            .post_send_one(&send(u64::from(k), SendOp::Send, &[src.sge(0, 4)]))
            .unwrap();
        r.run();
        for e in r.events() {
            assert_eq!(e, AsyncEvent::SrqLimitReached { srqn });
            fired_at.push(10 - k); // receives left untaken
        }
        if k == 7 {
            assert_eq!(r.srq.query().unwrap().srq_limit, 0, "disarmed by the event");
            // Re-arm at 3 with 3 left: not below yet, fires on the next.
            r.srq.arm_limit(3).unwrap();
        }
    }
    // First arm: fired when 3 (< 4) were left; second: at 2 (< 3).
    assert_eq!(fired_at, [3, 2]);
    assert_eq!(r.poll_b().len(), 10);
    // Arming 0 disarms: nothing fires with the SRQ run dry.
    r.srq.post_recv(&wrs[..2]).unwrap();
    r.srq.arm_limit(2).unwrap();
    r.srq.arm_limit(0).unwrap();
    for k in 0..2 {
        r.a[0]
            .post_send_one(&send(20 + k, SendOp::Send, &[src.sge(0, 4)]))
            .unwrap();
        r.run();
    }
    assert!(r.events().is_empty());
}

#[test]
fn refusals_change_nothing() {
    let mut r = rig(1, 4, 1, 7);
    let src = r.pd.register(64, Access::NONE).unwrap();
    let dst = r.pd.register(64, RW).unwrap();
    let sge = [dst.sge(0, 32), dst.sge(32, 32)];
    // Sizes out of range.
    for (wr, sge) in [(0, 1), (1, 0), (1 << 15, 1), (4, 32)] {
        assert_eq!(
            r.pd.create_srq(wr, sge).err(),
            Some(Error::InvalidAttribute),
            "{wr} {sge}"
        );
    }
    // A receive posted to a QP on the SRQ: refused, nothing written.
    assert_eq!(
        r.b[0].post_recv(&[RecvWr {
            wr_id: 1,
            sges: &sge[..1]
        }]),
        Err(PostError {
            index: 0,
            error: Error::InvalidAttribute
        })
    );
    assert_eq!(r.b[0].outstanding(), 0);
    // More SGEs than the SRQ takes: refused at its index, the first posted.
    assert_eq!(
        r.srq.post_recv(&[
            RecvWr {
                wr_id: 2,
                sges: &sge[..1]
            },
            RecvWr {
                wr_id: 3,
                sges: &sge
            },
        ]),
        Err(PostError {
            index: 1,
            error: Error::TooManySges
        })
    );
    // Exactly one receive reached the device: the second SEND waits.
    for k in 0..2 {
        r.a[0]
            .post_send_one(&send(k, SendOp::Send, &[src.sge(0, 4)]))
            .unwrap();
    }
    r.run();
    assert_eq!(r.poll_a().len(), 1);
    let wb = r.poll_b();
    assert_eq!((wb.len(), wb[0].wr_id), (1, 2));
    // Destroying the SRQ while a QP is attached is refused, and the SRQ
    // keeps working.
    assert_eq!(r.srq.destroy(), Err(Error::ResourceBusy));
    assert_eq!(r.srq.attached(), 1);
    r.srq
        .post_recv_one(&RecvWr {
            wr_id: 4,
            sges: &sge[..1],
        })
        .unwrap();
    r.run();
    assert_eq!(r.poll_a().len(), 1);
    assert_eq!(r.poll_b()[0].wr_id, 4);
    // An SRQ id of another PD names nothing here.
    let pd2 = r.dev.alloc_pd().unwrap();
    let other = pd2.create_srq(4, 1).unwrap();
    let init = QpInit {
        srq: Some(other.id()),
        ..small_init()
    };
    assert_eq!(
        r.pd.create_qp(&r.cqb, &r.cqb, &init).err(),
        Some(Error::NoSuchObject)
    );
    // Without QPs the SRQ can go; afterwards every call on it is refused.
    let id = r.srq.id();
    r.b.clear();
    assert_eq!(r.srq.attached(), 0);
    r.srq.destroy().unwrap();
    assert!(r.srq.is_destroyed());
    assert_eq!(
        r.srq.post_recv_one(&RecvWr {
            wr_id: 5,
            sges: &sge[..1]
        }),
        Err(Error::NoSuchObject)
    );
    assert_eq!(r.srq.arm_limit(1), Err(Error::NoSuchObject));
    assert_eq!(r.srq.query().err(), Some(Error::NoSuchObject));
    assert_eq!(r.srq.destroy(), Err(Error::NoSuchObject));
    let init = QpInit {
        srq: Some(id),
        ..small_init()
    };
    assert_eq!(
        r.pd.create_qp(&r.cqb, &r.cqb, &init).err(),
        Some(Error::NoSuchObject)
    );
}

#[test]
fn the_sizing_guard_counts_the_srq_once_per_cq() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let srq = pd.create_srq(63, 1).unwrap();
    let init = QpInit {
        srq: Some(srq.id()),
        ..small_init()
    };
    let sq = u64::from(dev.cq_depth_for(&[&init]));
    let cq = dev.create_cq(200).unwrap();
    let q1 = pd.create_qp(&cq, &cq, &init).unwrap();
    assert_eq!(cq.committed(), sq + 63);
    let q2 = pd.create_qp(&cq, &cq, &init).unwrap();
    assert_eq!(cq.committed(), 2 * sq + 63);
    drop(q1);
    assert_eq!(cq.committed(), sq + 63);
    drop(q2);
    assert_eq!(cq.committed(), 0);
    // A CQ that cannot hold the SRQ's receives is refused, and nothing
    // stays attached.
    let tiny = dev.create_cq(sq as u32 + 8).unwrap();
    assert_eq!(
        pd.create_qp(&tiny, &tiny, &init).err(),
        Some(Error::CqTooSmall)
    );
    assert_eq!((tiny.committed(), srq.attached()), (0, 0));
}

#[test]
fn a_stale_srq_completion_is_corrupt() {
    // A completion of a destroyed SRQ's QP, left in the CQ, polled through
    // a new SRQ that got the same number: its `wqe_counter` names no
    // receive posted there, so it is `CqeCorrupt`, consumed, and the new
    // SRQ is unchanged.
    let mut r = rig(1, 4, 1, 7);
    let src = r.pd.register(64, Access::NONE).unwrap();
    let dst = r.pd.register(64, RW).unwrap();
    r.srq
        .post_recv_one(&RecvWr {
            wr_id: 1,
            sges: &[dst.sge(0, 64)],
        })
        .unwrap();
    r.a[0]
        .post_send_one(&send(1, SendOp::Send, &[src.sge(0, 4)]))
        .unwrap();
    r.run();
    let old = r.srq.srqn();
    r.b.clear();
    r.srq.destroy().unwrap();
    let mut fresh = r.pd.create_srq(4, 1).unwrap();
    assert_eq!(fresh.srqn(), old, "the device reuses the number");
    let mut wc = [Wc::default(); 4];
    let none: &mut [&mut Qp<SoftDevice>] = &mut [];
    assert_eq!(
        r.cqb.poll(&mut fresh.route(none), &mut wc),
        Err(Error::CqeCorrupt)
    );
    assert_eq!(r.cqb.poll(&mut fresh.route(none), &mut wc), Ok(0));
    // All of the new SRQ's WQEs are still free.
    let sge = [dst.sge(0, 8)];
    let wrs: Vec<_> = (0..fresh.max_wr() as u64)
        .map(|i| RecvWr {
            wr_id: i,
            sges: &sge,
        })
        .collect();
    fresh.post_recv(&wrs).unwrap();
}

#[test]
fn last_wqe_reached_once_when_an_srq_qp_fails() {
    let mut r = rig(2, 8, 1, 7);
    let dst = r.pd.register(64, RW).unwrap();
    let sge = [dst.sge(0, 64)];
    let wrs: Vec<_> = (0..4)
        .map(|i| RecvWr {
            wr_id: i,
            sges: &sge,
        })
        .collect();
    r.srq.post_recv(&wrs).unwrap();
    r.b[0].modify(&QpModify::to(QpState::Error)).unwrap();
    r.run();
    r.run();
    let qpn = r.b[0].qpn();
    assert_eq!(r.events(), [AsyncEvent::LastWqeReached { qpn }]);
    // Nothing of the SRQ was flushed: the other QP takes all four.
    assert!(r.poll_b().is_empty());
    let src = r.pd.register(64, Access::NONE).unwrap();
    for k in 0..4 {
        r.a[1]
            .post_send_one(&send(k, SendOp::Send, &[src.sge(0, 4)]))
            .unwrap();
    }
    r.run();
    let wb = r.poll_b();
    assert_eq!(wb.len(), 4);
    assert!(wb.iter().all(|w| w.status == WcStatus::SUCCESS));
    // Recovery is not there yet for QPs on an SRQ.
    assert_eq!(
        r.b[0]
            .drain_and_reset(
                &mut r.cqb,
                None,
                std::time::Duration::from_millis(1),
                |_| {}
            )
            .err(),
        Some(Error::Unsupported)
    );
}

#[path = "srq/shared.rs"]
mod shared;
