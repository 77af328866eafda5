//! The raw C ABI for shared receive queues (`src/ffi/mlx5/srq.rs`)
//! against the core `Srq` it wraps: twin SRQs over twin memory, one
//! driven through the C calls (`rdd_mlx5_srq_*`, `rdd_mlx5_cq_poll_srq`),
//! the other directly, must return the same statuses and completions and
//! hold the same bytes after every call. Refused calls change no byte.

#[path = "support/ffi_twins.rs"]
mod ffi_twins;

use std::ptr::NonNull;

use ffi_twins::*;
use rdma_direct::ffi::*;
use rdma_direct::provider::mlx5::cq::{CqRoute, QpQueues};
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::{AlignedBuf, FakeMlx5};
use rdma_direct::{RecvWr, Sge};

const SRQN: u32 = 0x51;

/// One SRQ's memory.
struct SrqMem {
    buf: AlignedBuf,
    db: AlignedBuf,
    slots: Vec<SrqSlot>,
}

impl SrqMem {
    fn new() -> SrqMem {
        let mut m = SrqMem {
            buf: AlignedBuf::new(16 * 64),
            db: AlignedBuf::new(64),
            slots: vec![SrqSlot::default(); 8],
        };
        m.buf.fill(0x33);
        m
    }
    fn geometry(&self) -> SrqGeometry {
        SrqGeometry {
            buf: self.buf.ptr(),
            dbrec: self.db.ptr().cast(),
            stride: 64,
            nwqes: 8,
            max: 16,
            srqn: SRQN,
        }
    }
    fn bytes(&self) -> Vec<u8> {
        let mut v = self.buf.bytes().to_vec();
        v.extend_from_slice(self.db.bytes());
        for s in &self.slots {
            v.extend_from_slice(&s.wr_id.to_le_bytes());
            v.extend_from_slice(&[s.next as u8, (s.next >> 8) as u8, s.state]);
        }
        v
    }
}

/// The core's route for the twin: one QP receiving through one SRQ.
struct CoreRoute<'a> {
    qp: &'a mut Mlx5Qp,
    srq: &'a mut Srq,
}

impl CqRoute for CoreRoute<'_> {
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        (qpn == QPN).then_some(QpQueues {
            sq: &mut self.qp.sq,
            rq: &mut self.qp.rq,
        })
    }
    fn srq_for(&mut self, qpn: u32, srqn_uidx: u32) -> Option<&mut Srq> {
        (qpn == QPN && srqn_uidx == SRQN).then_some(&mut *self.srq)
    }
}

fn resp_cqe(counter: u16, srqn: u32, byte_cnt: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[32..36].copy_from_slice(&srqn.to_be_bytes());
    c[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    c[56..60].copy_from_slice(&QPN.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = 0x20; // RESP_SEND
    c
}

#[test]
fn srq_posts_and_completions_match_the_core() {
    let mut r = Rng(0x5eed_0002);
    // C side.
    let mut cm = SrqMem::new();
    let mut cf = FakeMlx5::new(geo());
    let mut csrq: Box<rdd_mlx5_srq_storage> = zeroed();
    let mut csq: Box<rdd_mlx5_sq_storage> = zeroed();
    let mut ccq: Box<rdd_mlx5_cq_storage> = zeroed();
    let g = cm.geometry();
    let cg = rdd_mlx5_srq_geometry {
        buf: g.buf,
        dbrec: g.dbrec,
        stride: g.stride,
        nwqes: g.nwqes,
        max: g.max,
        srqn: g.srqn,
    };
    let dvq: rdd_mlx5dv_qp = cf.dv_qp().into();
    let dvc: rdd_mlx5dv_cq = cf.dv_cq().into();
    let n = cf.sq_wrid.len();
    // SAFETY: the memory outlives the handles (finalised at the end).
    unsafe {
        assert_eq!(
            rdd_mlx5_srq_init(&mut *csrq, &cg, cm.slots.as_mut_ptr().cast(), 8),
            rdd_status::Ok
        );
        assert_eq!(
            rdd_mlx5_sq_init(
                &mut *csq,
                &dvq,
                QPN,
                &c_caps(),
                0,
                cf.sq_wrid.as_mut_ptr().cast(),
                n
            ),
            rdd_status::Ok
        );
        assert_eq!(rdd_mlx5_cq_init(&mut *ccq, &dvc), rdd_status::Ok);
    }
    // Core side.
    let mut km = SrqMem::new();
    let mut kf = FakeMlx5::new(geo());
    let kg = km.geometry();
    // SAFETY: the memory outlives the queue.
    let mut ksrq =
        unsafe { Srq::from_raw(&kg, NonNull::new(km.slots.as_mut_ptr()).unwrap(), 8) }.unwrap();
    let kc = caps();
    let mut kqp = Mlx5Qp {
        sq: kf.send_queue(kc, SqConfig::default()).unwrap(),
        rq: kf.recv_queue(kc).unwrap(),
    };
    let mut kcq = kf.completion_queue().unwrap();
    assert!(cm.bytes() == km.bytes());

    let mut posted: Vec<u16> = Vec::new();
    let mut next_index = 0u16;
    let mut cqes = 0u32;
    let mut outcomes = [0usize; 3];
    for step in 0..3000 {
        match r.below(6) {
            0..=2 => {
                let (id, len) = (r.next(), r.below(1 << 20) as u32);
                let defer = r.below(3) == 0;
                let flags = if r.below(30) == 0 {
                    2
                } else if defer {
                    RDD_SEND_DEFER_DOORBELL
                } else {
                    0
                };
                let before = cm.bytes();
                // SAFETY: a live handle; the buffer is never accessed.
                let got = unsafe { rdd_mlx5_srq_recv(&mut *csrq, id, 0x9000, len, 7, flags) };
                let want = if flags == 2 {
                    rdd_status::InvalidFlags
                } else {
                    let head = ksrq.head();
                    let s = [Sge::new(0x9000, len, 7)];
                    // SAFETY: nothing executes the WQEs.
                    match unsafe {
                        ksrq.post(&RecvWr {
                            wr_id: id,
                            sges: &s,
                        })
                    } {
                        Ok(()) => {
                            posted.push(head as u16);
                            if !defer {
                                ksrq.ring();
                            }
                            rdd_status::Ok
                        }
                        Err(e) => e.into(),
                    }
                };
                assert_eq!(got, want, "step {step}");
                if got != rdd_status::Ok {
                    assert!(cm.bytes() == before, "a refused receive wrote");
                }
                outcomes[(got == rdd_status::Ok) as usize] += 1;
            }
            3 => {
                // SAFETY: a live handle.
                assert_eq!(unsafe { rdd_mlx5_srq_ring(&mut *csrq) }, rdd_status::Ok);
                ksrq.ring();
            }
            _ => {
                // A completion: of a posted WQE (in any order), or a
                // corrupt counter, or one for another SRQ.
                let (counter, srqn) = match r.below(8) {
                    0 => (r.below(40) as u16, SRQN),
                    1 => (next_index, SRQN + 1),
                    _ if !posted.is_empty() => {
                        let i = r.below(posted.len() as u64) as usize;
                        (posted.swap_remove(i), SRQN)
                    }
                    _ => continue,
                };
                next_index = next_index.wrapping_add(1);
                let cqe = resp_cqe(counter, srqn, 64);
                cf.write_cqe(cqes, &cqe);
                kf.write_cqe(cqes, &cqe);
                cqes += 1;
                let mut cw = [rdd_wc::default(); 2];
                let mut count = usize::MAX;
                // SAFETY: live handles and local outputs; `rq` NULL: the
                // QP has no receive queue of its own.
                let got = unsafe {
                    rdd_mlx5_cq_poll_srq(
                        &mut *ccq,
                        &mut *csq,
                        std::ptr::null_mut(),
                        &mut *csrq,
                        SRQN,
                        cw.as_mut_ptr(),
                        2,
                        &mut count,
                    )
                };
                let mut kw = [Wc::default(); 2];
                let want = match kcq.poll(
                    &mut CoreRoute {
                        qp: &mut kqp,
                        srq: &mut ksrq,
                    },
                    &mut kw,
                ) {
                    Ok(k) => {
                        assert_eq!(count, k, "step {step}");
                        for i in 0..k {
                            assert_eq!(cw[i].wr_id, kw[i].wr_id);
                            assert_eq!(cw[i].byte_len, 64);
                            assert_eq!(cw[i].qp_num, QPN);
                        }
                        rdd_status::Ok
                    }
                    Err(e) => {
                        assert_eq!(count, usize::MAX, "a failed poll wrote its count");
                        e.into()
                    }
                };
                assert_eq!(got, want, "step {step}: counter {counter} srqn {srqn:#x}");
                outcomes[2] += (got == rdd_status::CqeCorrupt) as usize;
            }
        }
        assert!(cm.bytes() == km.bytes(), "step {step}: the twins differ");
    }
    assert!(
        outcomes.iter().all(|&n| n > 20),
        "every outcome exercised: {outcomes:?}"
    );
    // SAFETY: live handles, not used again.
    unsafe {
        assert_eq!(rdd_mlx5_srq_fini(&mut *csrq), rdd_status::Ok);
        assert_eq!(rdd_mlx5_srq_fini(&mut *csrq), rdd_status::InvalidHandle);
        assert_eq!(rdd_mlx5_sq_fini(&mut *csq), rdd_status::Ok);
        assert_eq!(rdd_mlx5_cq_fini(&mut *ccq), rdd_status::Ok);
    }
}

#[test]
fn srq_refusals_write_nothing() {
    let mut m = SrqMem::new();
    let mut s: Box<rdd_mlx5_srq_storage> = zeroed();
    let g = m.geometry();
    let mut cg = rdd_mlx5_srq_geometry {
        buf: g.buf,
        dbrec: g.dbrec,
        stride: g.stride,
        nwqes: g.nwqes,
        max: g.max,
        srqn: g.srqn,
    };
    let slots = m.slots.as_mut_ptr().cast::<rdd_mlx5_srq_slot>();
    // SAFETY: the memory outlives the handle; refused inits write nothing.
    unsafe {
        // A zeroed storage is not a handle.
        assert_eq!(rdd_mlx5_srq_ring(&mut *s), rdd_status::InvalidHandle);
        let bad = [
            rdd_mlx5_srq_geometry { stride: 48, ..cg },
            rdd_mlx5_srq_geometry { nwqes: 6, ..cg },
            rdd_mlx5_srq_geometry { max: 4, ..cg },
            rdd_mlx5_srq_geometry {
                buf: std::ptr::null_mut(),
                ..cg
            },
        ];
        for b in &bad {
            assert_eq!(
                rdd_mlx5_srq_init(&mut *s, b, slots, 8),
                rdd_status::InvalidGeometry
            );
        }
        assert_eq!(
            rdd_mlx5_srq_init(&mut *s, &cg, slots, 7),
            rdd_status::StorageTooSmall
        );
        let raw =
            std::slice::from_raw_parts((&*s as *const rdd_mlx5_srq_storage).cast::<u8>(), 128);
        assert!(
            raw.iter().all(|&b| b == 0),
            "a refused init wrote the storage"
        );
        cg.max = 16;
        assert_eq!(rdd_mlx5_srq_init(&mut *s, &cg, slots, 8), rdd_status::Ok);
    }
    let before = m.bytes();
    // SAFETY: a live handle; nothing is dereferenced.
    unsafe {
        assert_eq!(
            rdd_mlx5_srq_recv(&mut *s, 1, 0x1000, 8, 1, 1),
            rdd_status::InvalidFlags
        );
        let sge = [rdd_sge {
            addr: 0x1000,
            length: 8,
            lkey: 1,
        }; 4];
        let w = rdd_recv_wr {
            wr_id: 1,
            sg_list: sge.as_ptr(),
            num_sge: 4,
            reserved: 0,
        };
        let mut bad = usize::MAX;
        assert_eq!(
            rdd_mlx5_srq_post(&mut *s, &w, 1, &mut bad),
            rdd_status::TooManySges
        );
        assert_eq!(bad, 0);
    }
    assert!(m.bytes() == before, "a refused receive wrote");
    // Fill the list: 7 WQEs (one always stays unused), then RQ_FULL.
    for i in 0..7 {
        // SAFETY: as above.
        let st = unsafe { rdd_mlx5_srq_recv(&mut *s, i, 0x1000, 8, 1, 0) };
        assert_eq!(st, rdd_status::Ok, "receive {i}");
    }
    let before = m.bytes();
    // SAFETY: as above.
    let st = unsafe { rdd_mlx5_srq_recv(&mut *s, 9, 0x1000, 8, 1, 0) };
    assert_eq!(st, rdd_status::RqFull);
    assert!(m.bytes() == before, "a refused receive wrote");
    // SAFETY: a live handle.
    unsafe { assert_eq!(rdd_mlx5_srq_fini(&mut *s), rdd_status::Ok) };
}
