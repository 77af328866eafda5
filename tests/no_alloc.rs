//! A counting global allocator proves that posting, ringing and polling
//! allocate nothing once the queues exist.

use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::*;
use rdma_direct::*;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::mine;

#[test]
fn post_and_poll_allocate_nothing() {
    let mut f = FakeMlx5::new(FakeGeometry::default());
    let caps = f.caps(4, 60);
    let sq = f.send_queue(caps, SqConfig::default()).unwrap();
    let rq = f.recv_queue(caps).unwrap();
    let mut cq = f.completion_queue().unwrap();
    let mut qp = Mlx5Qp { sq, rq };
    let sge = [Sge::new(0x1000, 8, 1)];
    let payload = [1u8; 32];
    let pieces: [&[u8]; 1] = [&payload];
    let mut wc = [Wc::default(); 16];
    let mut ci = 0u32;
    let mut cqe = [0u8; 64];
    cqe[56..60].copy_from_slice(&(0x0800_01c5u32).to_be_bytes());

    let before = mine();
    for round in 0..200u64 {
        let wrs = [
            SendWr::new(
                round,
                SendOp::Write {
                    remote: Remote::new(0x2000, 2),
                },
                &sge,
                SendFlags::NONE,
            ),
            SendWr::inline(round, SendOp::Send, &pieces, SendFlags::NONE),
            SendWr::new(
                round,
                SendOp::FetchAdd {
                    remote: Remote::new(0x2000, 2),
                    add: 1,
                },
                &sge,
                SendFlags::SIGNALED,
            ),
        ];
        let pi = qp.sq.producer();
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { qp.sq.post_list(&wrs) }.unwrap();
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { qp.sq.post_one(&wrs[0]) }.unwrap();
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe {
            qp.rq.post_list(&[RecvWr {
                wr_id: round,
                sges: &sge,
            }])
        }
        .unwrap();
        // The signaled atomic is the third WQE: ctrl+raddr+atomic+data = 1 BB,
        // after a 1-BB write and a 1-BB inline send (4+32 bytes -> 3 octowords).
        let atomic_index = pi.wrapping_add(2) as u16;
        cqe[60..62].copy_from_slice(&atomic_index.to_be_bytes());
        cqe[56..60].copy_from_slice(&(0x1200_01c5u32).to_be_bytes());
        f.write_cqe(ci, &cqe);
        ci += 1;
        let n = cq.poll(&mut qp, &mut wc).unwrap();
        assert_eq!(n, 1);
        // Retire the trailing write with a responder-less forced path: a
        // second requester CQE for it.
        let last = pi.wrapping_add(3) as u16;
        let mut c2 = cqe;
        c2[60..62].copy_from_slice(&last.to_be_bytes());
        c2[56..60].copy_from_slice(&(0x0800_01c5u32).to_be_bytes());
        f.write_cqe(ci, &c2);
        ci += 1;
        // Unsignaled: consumed silently.
        assert_eq!(cq.poll(&mut qp, &mut wc).unwrap(), 0);
        let mut r = [0u8; 64];
        r[56..60].copy_from_slice(&0x1c5u32.to_be_bytes());
        r[60..62].copy_from_slice(&(qp.rq.tail() as u16).to_be_bytes());
        r[63] = 2 << 4;
        f.write_cqe(ci, &r);
        ci += 1;
        assert_eq!(cq.poll(&mut qp, &mut wc).unwrap(), 1);
    }
    let after = mine();
    assert_eq!(after - before, 0, "the data path allocated");
    assert_eq!(qp.sq.free_bbs(), qp.sq.wqe_cnt());
}

/// UD posts, SRQ posts (with free-list extension) and SRQ completions
/// through the poller allocate nothing.
#[test]
fn ud_and_srq_allocate_nothing() {
    use std::ptr::NonNull;
    struct R {
        sq: SendQueue,
        rq: RecvQueue,
        srq: Srq,
    }
    impl cq::CqRoute for R {
        fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
            (qpn == self.sq.qpn()).then_some(QpQueues {
                sq: &mut self.sq,
                rq: &mut self.rq,
            })
        }
        fn srq_for(&mut self, _qpn: u32, srqn: u32) -> Option<&mut Srq> {
            (srqn == self.srq.srqn()).then_some(&mut self.srq)
        }
    }
    let mut f = FakeMlx5::new(FakeGeometry::default());
    let caps = f.caps(4, 60);
    let qp = f.dv_qp();
    let len = f.sq_wrid.len();
    let wrid = NonNull::new(f.sq_wrid.as_mut_ptr()).unwrap();
    // SAFETY: the memory belongs to `f`, which outlives the queues.
    let sq = unsafe { SendQueue::from_raw_ud(&qp, 0x1c5, caps, SqConfig::default(), wrid, len) };
    let rq = f.recv_queue(caps).unwrap();
    let buf = AlignedBuf::new(16 * 32);
    let db = AlignedBuf::new(64);
    let mut slots = vec![SrqSlot::default(); 8];
    let geo = SrqGeometry {
        buf: buf.ptr(),
        dbrec: db.ptr().cast(),
        stride: 32,
        nwqes: 8,
        max: 16,
        srqn: 0x51,
    };
    // SAFETY: the memory lives until the end of the test.
    let srq = unsafe { Srq::from_raw(&geo, NonNull::new(slots.as_mut_ptr()).unwrap(), 8) };
    let mut r = R {
        sq: sq.unwrap(),
        rq,
        srq: srq.unwrap(),
    };
    let mut cq = f.completion_queue().unwrap();
    let av = Mlx5Av::default();
    let sge = [Sge::new(0x1000, 8, 1)];
    let payload = [1u8; 32];
    let pieces: [&[u8]; 1] = [&payload];
    let mut wc = [Wc::default(); 4];
    let before = mine();
    for round in 0..200u32 {
        let dest = UdDest::new(&av, round & 0xff_ffff, 0x1111);
        let send = SendWr::new(round as u64, SendOp::Send, &sge, SendFlags::SIGNALED);
        let inl = SendWr::inline(0, SendOp::SendImm { imm: round }, &pieces, SendFlags::NONE);
        // SAFETY: nothing executes the WQEs.
        unsafe { r.sq.post_ud(&inl, &dest) }.unwrap();
        // SAFETY: as above.
        unsafe { r.sq.post_ud(&send, &dest) }.unwrap();
        r.sq.ring();
        let slot = r.srq.head();
        // SAFETY: as above.
        unsafe {
            r.srq.post_list(&[RecvWr {
                wr_id: round as u64,
                sges: &sge,
            }])
        }
        .unwrap();
        // The send's CQE (its WQE is the second, 2 BBs after the first).
        let mut c = [0u8; 64];
        c[56..60].copy_from_slice(&(0x0a00_01c5u32).to_be_bytes());
        let start = r.sq.producer().wrapping_sub(2) as u16;
        c[60..62].copy_from_slice(&start.to_be_bytes());
        f.write_cqe(2 * round, &c);
        // The SRQ receive's CQE.
        let mut c = [0u8; 64];
        c[32..36].copy_from_slice(&0x51u32.to_be_bytes());
        c[56..60].copy_from_slice(&0x1c5u32.to_be_bytes());
        c[60..62].copy_from_slice(&(slot as u16).to_be_bytes());
        c[63] = 0x20;
        f.write_cqe(2 * round + 1, &c);
        assert_eq!(cq.poll(&mut r, &mut wc).unwrap(), 2);
        assert_eq!(wc[1].wr_id, round as u64);
    }
    assert_eq!(mine() - before, 0, "the UD / SRQ data path allocated");
}

/// The safe API's data path (and the software device's pass in step mode)
/// allocates nothing either.
#[test]
fn api_post_step_poll_allocate_nothing() {
    use rdma_direct::api::*;
    use rdma_direct::soft::{SoftConfig, SoftDevice};
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut cqa = dev.create_cq(256).unwrap();
    let mut cqb = dev.create_cq(256).unwrap();
    let mut a = pd.create_qp(&cqa, &cqa, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &QpInit::default()).unwrap();
    let acc = ConnectAttr {
        access: Access::REMOTE_WRITE,
        ..Default::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &acc).unwrap();
    b.connect(&ia, &acc).unwrap();
    let src = pd.register(64, Access::NONE).unwrap();
    let dst = pd
        .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut wc = [Wc::default(); 8];
    let before = mine();
    for i in 0..100u64 {
        let rsge = [dst.sge(0, 64)];
        b.post_recv(&[RecvWr {
            wr_id: i,
            sges: &rsge,
        }])
        .unwrap();
        let sge = [src.sge(0, 8)];
        let wrs = [
            SendWr::new(
                i,
                SendOp::Write {
                    remote: dst.remote(8),
                },
                &sge,
                SendFlags::NONE,
            ),
            SendWr::new(i, SendOp::Send, &sge, SendFlags::SIGNALED),
        ];
        a.post_send(&wrs).unwrap();
        dev.backend().step();
        assert_eq!(cqa.poll(&mut a, &mut wc).unwrap(), 1);
        assert_eq!(cqb.poll(&mut b, &mut wc).unwrap(), 1);
    }
    assert_eq!(
        mine() - before,
        0,
        "the API data path or the device pass allocated"
    );
}
