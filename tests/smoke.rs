//! Quick end-to-end sanity: post, ring, decode, complete.
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::*;
use rdma_direct::*;

#[test]
fn write_then_poll() {
    let mut f = FakeMlx5::new(FakeGeometry::default());
    let caps = f.caps(4, 60);
    let mut sq = f.send_queue(caps, SqConfig::default()).unwrap();
    let sge = [Sge::new(0x7f5a3c003000, 4096, 0xa1b2c3)];
    let wr = SendWr::new(
        0x1004,
        SendOp::Write {
            remote: Remote::new(0x7e0011220000, 0x0badcafe),
        },
        &sge,
        SendFlags::SIGNALED,
    );
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { sq.post_one(&wr).unwrap() };
    assert_eq!(f.dbrec_sq(), 1);
    let d = decode_wqe(f.sq_bytes(), 0).unwrap();
    assert_eq!(d.opcode, 0x08);
    assert_eq!(d.ds, 3);
    assert_eq!(d.sges, vec![(0x7f5a3c003000, 4096, 0xa1b2c3)]);
    assert_eq!(&f.bf.bytes()[..8], &f.sq_bytes()[..8]);
    let rq = f.recv_queue(caps).unwrap();
    let mut cq = f.completion_queue().unwrap();
    let mut cqe = [0u8; 64];
    cqe[56..60].copy_from_slice(&(0x0800_01c5u32).to_be_bytes());
    cqe[60..62].copy_from_slice(&0u16.to_be_bytes());
    cqe[63] = 0x00;
    f.write_cqe(0, &cqe);
    let mut qp = Mlx5Qp { sq, rq };
    let mut wc = [Wc::default(); 4];
    let n = cq.poll(&mut qp, &mut wc).unwrap();
    assert_eq!(n, 1);
    assert_eq!(wc[0].wr_id, 0x1004);
    assert_eq!(wc[0].opcode, WcOpcode::RDMA_WRITE);
    assert_eq!(qp.sq.free_bbs(), 64);
    assert_eq!(f.dbrec_cq_ci(), 1);
}
