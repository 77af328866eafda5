//! The CQ sizing guard: a QP is refused with
//! `Error::CqTooSmall` when the worst case of completions its queues could
//! put on a CQ (every WR they can hold, e.g. all flushed at once), added to
//! what the CQ's other QPs could, exceeds the CQ's depth. The opt-out
//! exists, and the overrun it risks is real (shown last).

use rdma_direct::api::{Access, ConnectAttr, Device, QpInit, QpModify, QpState, Wc};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr};

#[path = "support/loopback.rs"]
mod loopback;
use loopback::connect_loopback;

const SMALL: QpInit = QpInit {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
    srq: None,
};

#[test]
fn overcommitting_a_cq_is_refused() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    // 128 entries (the device rounds 64 + 1 up to a power of two).
    let cq = dev.create_cq(64).unwrap();
    assert_eq!(cq.depth(), 128);
    // 64 sends + 64 receives: exactly fits.
    let a = pd.create_qp(&cq, &cq, &SMALL).unwrap();
    assert_eq!(cq.committed(), 128);
    // A second QP could double that: refused, and nothing is committed.
    assert_eq!(
        pd.create_qp(&cq, &cq, &SMALL).err(),
        Some(Error::CqTooSmall)
    );
    assert_eq!(cq.committed(), 128);
    assert_eq!(cq.depth_needed(128), 256);
    // Gone again once the first QP is.
    drop(a);
    assert_eq!(cq.committed(), 0);
    let b = pd.create_qp(&cq, &cq, &SMALL).unwrap();
    // Separate send and receive CQs are charged separately.
    let scq = dev.create_cq(64).unwrap();
    let rcq = dev.create_cq(32).unwrap();
    let c = pd.create_qp(&scq, &rcq, &SMALL).unwrap();
    assert_eq!((scq.committed(), rcq.committed()), (64, 64));
    drop((b, c));
    // The device tells how deep a CQ its QPs need.
    assert_eq!(dev.cq_depth_for(&[&SMALL]), 128);
    assert_eq!(dev.cq_depth_for(&[&SMALL, &SMALL]), 256);
    let sized = dev
        .create_cq(dev.cq_depth_for(&[&QpInit::default()]))
        .unwrap();
    drop(pd.create_qp(&sized, &sized, &QpInit::default()).unwrap());
    // A QP larger than the CQ alone.
    let big = QpInit {
        max_send_wr: 512,
        ..SMALL
    };
    assert_eq!(pd.create_qp(&cq, &cq, &big).err(), Some(Error::CqTooSmall));
}

#[test]
fn the_opt_out_allows_it_and_the_overrun_it_risks_is_real() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(8).unwrap(); // 16 entries
    let peer_cq = dev.create_cq(256).unwrap();
    assert_eq!(
        pd.create_qp(&cq, &cq, &SMALL).err(),
        Some(Error::CqTooSmall)
    );
    cq.set_unguarded(true);
    let mut a = pd.create_qp(&cq, &cq, &SMALL).unwrap();
    let mut b = pd.create_qp(&peer_cq, &peer_cq, &SMALL).unwrap();
    assert_eq!(b.state(), QpState::Reset);
    connect_loopback(&mut a, &mut b, Access::NONE);
    // 40 unsignaled WRITEs (they produce no completion in normal
    // operation, so the run-time headroom check lets them through), then
    // ERROR before the device runs them: a flush completes every one.
    let m = pd
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let remote = rdma_direct::Remote::new(m.addr(), m.rkey());
    let sge = [m.sge(0, 8)];
    let wrs: Vec<_> = (0..40)
        .map(|i| {
            rdma_direct::SendWr::new(
                i,
                rdma_direct::SendOp::Write { remote },
                &sge,
                rdma_direct::SendFlags::NONE,
            )
        })
        .collect();
    a.post_send(&wrs).unwrap();
    a.modify(&QpModify::to(QpState::Error)).unwrap();
    dev.backend().run_until_idle(64);
    assert!(
        dev.backend().cq_overrun(cq.cqn()),
        "the device dropped completions"
    );
    let mut out = [Wc::default(); 64];
    let n = cq.poll(&mut a, &mut out).unwrap();
    assert!(n <= 16, "{n}");
}

/// Part 1's run-time half: on a CQ that opted out of the static guard,
/// the post path counts the completions posted work will produce and
/// refuses (with `CqFull`, at the WR that does not fit) work that could
/// overrun the CQ; polling gives the room back. Without the check the
/// device would overrun the CQ here (as in the test above).
#[test]
fn unguarded_cqs_are_protected_at_post_time() {
    use rdma_direct::{Remote, SendFlags, SendOp, SendWr};
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(8).unwrap(); // 16 entries
    assert_eq!(cq.depth(), 16);
    let peer_cq = dev.create_cq(256).unwrap();
    cq.set_unguarded(true);
    let mut a = pd.create_qp(&cq, &cq, &SMALL).unwrap();
    let mut b = pd.create_qp(&peer_cq, &peer_cq, &SMALL).unwrap();
    let (ia, ib) = (a.info(), b.info());
    let attr = ConnectAttr {
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..ConnectAttr::default()
    };
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let dst = pd
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let remote = Remote::new(dst.addr(), dst.rkey());
    let sge = [src.sge(0, 8)];
    let wr = |id: u64, flags| SendWr::new(id, SendOp::Write { remote }, &sge, flags);

    // 20 signaled WRITEs into a 16-entry CQ: 15 fit (one entry is kept
    // for a CQE the signalling guard may add), the 16th is refused.
    let batch: Vec<_> = (0..20).map(|i| wr(i, SendFlags::SIGNALED)).collect();
    let e = a.post_send(&batch).unwrap_err();
    assert_eq!((e.index, e.error), (15, Error::CqFull));
    assert_eq!(
        a.post_send_one(&wr(99, SendFlags::SIGNALED)).err(),
        Some(Error::CqFull)
    );
    // Unsignaled work produces no completion: still accepted.
    a.post_send_one(&wr(100, SendFlags::NONE)).unwrap();
    // Receives count one each: none fits now.
    let rs = [dst.sge(0, 64)];
    // Receives need no room for a guard CQE: one more fits, not two.
    let two = [
        RecvWr {
            wr_id: 7,
            sges: &rs,
        },
        RecvWr {
            wr_id: 8,
            sges: &rs,
        },
    ];
    let e = a.post_recv(&two).unwrap_err();
    assert_eq!((e.index, e.error), (1, Error::CqFull));

    dev.backend().run_until_idle(1 << 12);
    let mut out = [Wc::default(); 32];
    let mut got = 0;
    while got < 15 {
        let n = cq.poll(&mut a, &mut out).unwrap();
        for w in &out[..n] {
            assert_eq!(w.status, rdma_direct::api::WcStatus::SUCCESS, "{w:?}");
        }
        got += n;
        if n == 0 {
            dev.backend().run_until_idle(1 << 12);
        }
    }
    assert_eq!(got, 15);
    assert!(!dev.backend().cq_overrun(cq.cqn()), "the CQ overran");
    // The room is back (receive 7 still holds one entry): the refused WR
    // and 8 receives go in now.
    a.post_send_one(&wr(99, SendFlags::SIGNALED)).unwrap();
    let recvs: Vec<_> = (0..8)
        .map(|i| RecvWr {
            wr_id: i,
            sges: &rs,
        })
        .collect();
    a.post_recv(&recvs).unwrap();
    // 1 + 1 + 8 expected: 6 more receives fit, the 7th does not.
    let more: Vec<_> = (0..8)
        .map(|i| RecvWr {
            wr_id: 10 + i,
            sges: &rs,
        })
        .collect();
    let e = a.post_recv(&more).unwrap_err();
    assert_eq!((e.index, e.error), (6, Error::CqFull));
    dev.backend().run_until_idle(1 << 12);
    assert_eq!(cq.poll(&mut a, &mut out).unwrap(), 1);
    assert!(!dev.backend().cq_overrun(cq.cqn()));
    drop(b);
}

/// The opt-out's run-time check is off while the CQ is guarded: a guarded
/// CQ's QPs fit by construction, so the hot path skips the bookkeeping.
#[test]
fn guarded_cqs_are_not_metered() {
    use rdma_direct::{Remote, SendFlags, SendOp, SendWr};
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(dev.cq_depth_for(&[&SMALL])).unwrap();
    let peer_cq = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cq, &cq, &SMALL).unwrap();
    let mut b = pd.create_qp(&peer_cq, &peer_cq, &SMALL).unwrap();
    connect_loopback(&mut a, &mut b, Access::NONE);
    let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let dst = pd
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let remote = Remote::new(dst.addr(), dst.rkey());
    let sge = [src.sge(0, 8)];
    let batch: Vec<_> = (0..64)
        .map(|i| SendWr::new(i, SendOp::Write { remote }, &sge, SendFlags::SIGNALED))
        .collect();
    a.post_send(&batch).unwrap();
}
