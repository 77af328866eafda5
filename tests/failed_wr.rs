//! Structured error completions: after an error
//! completion the QP reports the failed WR as it was posted, decoded from
//! the WQE still in the ring, with the status, the raw syndrome and the
//! likely causes. Flushes that follow do not replace it, and RESET clears
//! it.

use rdma_direct::api::{
    Access, ConnectAttr, Device, QpInit, QpModify, QpState, Wc, WcOpcode, WcStatus,
};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{RecvWr, Remote, SendFlags, SendOp, SendWr};

#[path = "support/loopback.rs"]
mod loopback;
use loopback::connect_loopback;

#[test]
fn a_bad_rkey_write_is_reported_as_posted() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut cq2 = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cq2, &cq2, &QpInit::default()).unwrap();
    let attr = ConnectAttr {
        access: Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let dst = pd
        .register(4096, Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0))
        .unwrap();
    assert_eq!(a.failure(), None);

    // A good WRITE, then one with a stale rkey, then one more that will be
    // flushed.
    let bad = Remote::new(dst.addr() + 128, dst.rkey() ^ 0x5a00);
    let (s0, s1) = ([src.sge(0, 64)], [src.sge(256, 100), src.sge(512, 28)]);
    a.post_send(&[
        SendWr::new(
            1,
            SendOp::Write {
                remote: dst.remote(0),
            },
            &s0,
            SendFlags::SIGNALED,
        ),
        SendWr::new(2, SendOp::Write { remote: bad }, &s1, SendFlags::SIGNALED),
        SendWr::new(
            3,
            SendOp::Write {
                remote: dst.remote(0),
            },
            &s0,
            SendFlags::SIGNALED,
        ),
    ])
    .unwrap();
    dev.backend().run_until_idle(32);
    let mut wc = [Wc::default(); 8];
    let n = cq.poll(&mut a, &mut wc).unwrap();
    assert_eq!(n, 3);
    assert_eq!(wc[0].status, WcStatus::SUCCESS);
    assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::REM_ACCESS_ERR));
    assert_eq!((wc[2].wr_id, wc[2].status), (3, WcStatus::WR_FLUSH_ERR));

    let f = a.failure().expect("the failed WR is recorded");
    assert_eq!(f.wr_id, 2);
    assert_eq!(f.status, WcStatus::REM_ACCESS_ERR);
    assert_eq!(f.syndrome, wc[1].syndrome);
    assert_ne!(f.syndrome, 0);
    assert!(!f.recv);
    assert_eq!(f.opcode, WcOpcode::RDMA_WRITE);
    assert_eq!((f.remote_addr, f.rkey), (bad.addr, bad.rkey));
    assert_eq!(
        (f.local_addr, f.lkey, f.length),
        (src.addr() + 256, src.lkey(), 128)
    );
    assert!(!f.inline);
    assert!(f.likely_causes().contains("rkey is not valid at the peer"));

    // RESET clears it.
    a.modify(&QpModify::to(QpState::Reset)).unwrap();
    assert_eq!(a.failure(), None);
    let _ = cq2.poll(&mut b, &mut wc).unwrap();
}

#[test]
fn a_short_receive_buffer_is_reported_as_posted() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut cq2 = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cq2, &cq2, &QpInit::default()).unwrap();
    connect_loopback(&mut a, &mut b, Access::NONE);
    let src = pd.register(256, Access::LOCAL_WRITE).unwrap();
    let dst = pd.register(256, Access::LOCAL_WRITE).unwrap();
    let r = [dst.sge(16, 32)];
    b.post_recv(&[RecvWr {
        wr_id: 40,
        sges: &r,
    }])
    .unwrap();
    let s = [src.sge(0, 200)];
    a.post_send(&[SendWr::new(41, SendOp::Send, &s, SendFlags::SIGNALED)])
        .unwrap();
    dev.backend().run_until_idle(32);
    let mut wc = [Wc::default(); 8];
    let n = cq2.poll(&mut b, &mut wc).unwrap();
    assert_eq!(
        (n, wc[0].wr_id, wc[0].status),
        (1, 40, WcStatus::LOC_LEN_ERR)
    );
    let f = b.failure().expect("recorded");
    assert!(f.recv);
    assert_eq!(
        (f.wr_id, f.opcode, f.local_addr, f.length),
        (40, WcOpcode::RECV, dst.addr() + 16, 32)
    );
    assert!(f
        .likely_causes()
        .contains("longer than the receive buffers"));
    let _ = cq.poll(&mut a, &mut wc).unwrap();
}
