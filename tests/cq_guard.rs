//! The CQ sizing guard (issue 8, part 1): a QP is refused with
//! `Error::CqTooSmall` when the worst case of completions its queues could
//! put on a CQ (every WR they can hold, e.g. all flushed at once), added to
//! what the CQ's other QPs could, exceeds the CQ's depth. The opt-out
//! exists, and the overrun it risks is real (shown last).

use rdma_direct::api::{Access, ConnectAttr, Device, QpInit, QpModify, QpState, Wc};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr};

const SMALL: QpInit = QpInit {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
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
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &ConnectAttr::default()).unwrap();
    b.connect(&ia, &ConnectAttr::default()).unwrap();
    let m = pd.register(64 * 64, Access::LOCAL_WRITE).unwrap();
    // 40 receives, then ERROR: 40 flush completions for a 16-entry CQ.
    let sges: Vec<_> = (0..40).map(|i| [m.sge(i * 64, 64)]).collect();
    let recvs: Vec<RecvWr> = sges
        .iter()
        .zip(0..)
        .map(|(s, wr_id)| RecvWr { wr_id, sges: s })
        .collect();
    a.post_recv(&recvs).unwrap();
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
