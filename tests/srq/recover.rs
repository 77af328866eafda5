//! Recovery of a QP on an SRQ (`Qp::drain_and_reset_on_srq`,
//! `Qp::recover_on_srq`): its outstanding sends complete (the failed one
//! and the flushed ones), it resets and reconnects, and the receives still
//! in the SRQ stay there for it.

use std::time::Duration;

use rdma_direct::api::*;
use rdma_direct::{Error, SendFlags, SendOp, SendWr, Sge};

use super::rig::*;

fn send(wr_id: u64, sge: &[Sge]) -> SendWr<'_> {
    SendWr::new(wr_id, SendOp::Send, sge, SendFlags::SIGNALED)
}

const T: Duration = Duration::from_secs(10);

#[test]
fn a_qp_on_an_srq_recovers_and_the_srq_keeps_its_receives() {
    let mut r = rig(1, 8, 1, 7);
    let mut src = r.pd.register(64, Access::NONE).unwrap();
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = i as u8 ^ 0x5a;
    }
    let dst = r.pd.register(4 * 64, RW).unwrap();
    for k in 0..4u64 {
        r.srq
            .post_recv_one(&rdma_direct::RecvWr {
                wr_id: 100 + k,
                sges: &[dst.sge(k as usize * 64, 64)],
            })
            .unwrap();
    }
    r.a[0].post_send_one(&send(1, &[src.sge(0, 8)])).unwrap();
    r.run();
    let first: Vec<_> = r.poll_b().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(first, [(100, WcStatus::SUCCESS)]);

    // The SRQ QP breaks: a send with a bad lkey, then one the error
    // flushes.
    let bad = Sge {
        addr: src.addr(),
        length: 4,
        lkey: 0xdead_beef,
    };
    r.b[0].post_send_one(&send(50, &[bad])).unwrap();
    r.b[0].post_send_one(&send(51, &[src.sge(0, 4)])).unwrap();
    r.run();

    // Refusals first, each leaving the QP as it was.
    let mut other = r.pd.create_srq(4, 1).unwrap();
    assert_eq!(
        r.b[0]
            .drain_and_reset_on_srq(&mut other, &mut r.cqb, None, T, |_| {})
            .err(),
        Some(Error::InvalidAttribute)
    );
    assert_eq!(
        r.b[0].drain_and_reset(&mut r.cqb, None, T, |_| {}).err(),
        Some(Error::Unsupported)
    );
    assert_eq!(
        r.a[0]
            .drain_and_reset_on_srq(&mut r.srq, &mut r.cqa, None, T, |_| {})
            .err(),
        Some(Error::InvalidAttribute)
    );
    // (Its state is what the host knows: the error completion is not
    // polled yet.)
    assert_eq!((r.b[0].state(), r.b[0].outstanding()), (QpState::Rts, 2));

    // Both sides recover (the device thread runs during the drains): the
    // requester drains and resets, the SRQ QP recovers towards it, the
    // requester connects back.
    r.dev.backend().start();
    let attr_a = ConnectAttr {
        rnr_retry: 7,
        ..Default::default()
    };
    let attr_b = ConnectAttr {
        access: Access::REMOTE_WRITE,
        ..Default::default()
    };
    r.a[0].drain_and_reset(&mut r.cqa, None, T, |_| {}).unwrap();
    let a_info = r.a[0].info();
    let mut seen = Vec::new();
    let rb = r.b[0]
        .recover_on_srq(&mut r.srq, &mut r.cqb, None, &a_info, &attr_b, T, |w| {
            seen.push((w.wr_id, w.status))
        })
        .unwrap();
    assert_eq!(
        seen,
        [(50, WcStatus::LOC_PROT_ERR), (51, WcStatus::WR_FLUSH_ERR)]
    );
    assert_eq!(rb.reported, 2);
    assert_eq!(rb.failure.map(|f| f.wr_id), Some(50));
    assert_eq!(r.b[0].outstanding(), 0);
    let b_info = r.b[0].info();
    r.a[0].connect(&b_info, &attr_a).unwrap();
    r.dev.backend().stop();
    assert_eq!(r.b[0].state(), QpState::Rts);

    // The three receives the SRQ still held serve the reconnected QP, in
    // order, with the right bytes.
    for k in 0..3u64 {
        r.a[0]
            .post_send_one(&send(10 + k, &[src.sge(k as usize * 8, 8)]))
            .unwrap();
        r.run();
    }
    let again: Vec<_> = r
        .poll_b()
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.qp_num))
        .collect();
    let b = r.b[0].qpn();
    assert_eq!(
        again,
        [
            (101, WcStatus::SUCCESS, 8, b),
            (102, WcStatus::SUCCESS, 8, b),
            (103, WcStatus::SUCCESS, 8, b)
        ]
    );
    for k in 0..3usize {
        let at = (k + 1) * 64;
        assert_eq!(
            &dst.as_slice()[at..at + 8],
            &src.as_slice()[k * 8..k * 8 + 8]
        );
    }
    let wa = r.poll_a();
    assert_eq!(wa.len(), 3);
    assert!(wa.iter().all(|w| w.status == WcStatus::SUCCESS));
}
