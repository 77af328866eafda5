//! CQ polling: owner bit across many wraps, error-CQE mapping, unsignaled
//! retirement, scatter-to-CQE, corrupt and compressed CQEs, arming
//! (docs/spec/mlx5.md §8, §9).

use rdma_direct::provider::mlx5::cq::syndrome;
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::*;
use rdma_direct::*;

const QPN: u32 = 0x1c5;

/// A requester CQE image for the WQE at 16-bit index `counter`.
fn req_cqe(counter: u16, wqe_opcode: u8, byte_cnt: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    c[56..60].copy_from_slice(&((wqe_opcode as u32) << 24 | QPN).to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = 0x00;
    c
}

/// A responder CQE image.
fn resp_cqe(counter: u16, op: u8, byte_cnt: u32, imm: u32, format: u8) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[36..40].copy_from_slice(&imm.to_be_bytes());
    c[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    c[56..60].copy_from_slice(&QPN.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = op << 4 | format << 2;
    c
}

/// An error CQE image.
fn err_cqe(counter: u16, op: u8, synd: u8, vendor: u8) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[54] = vendor;
    c[55] = synd;
    c[56..60].copy_from_slice(&QPN.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = op << 4;
    c
}

struct Env {
    f: FakeMlx5,
    qp: Mlx5Qp,
    cq: CompletionQueue,
}

fn env(geo: FakeGeometry) -> Env {
    let mut f = FakeMlx5::new(geo);
    let caps = f.caps(4, 60);
    let sq = f.send_queue(caps, SqConfig::default()).unwrap();
    let rq = f.recv_queue(caps).unwrap();
    let cq = f.completion_queue().unwrap();
    Env {
        f,
        qp: Mlx5Qp { sq, rq },
        cq,
    }
}

fn write_wr(id: u64, flags: SendFlags) -> SendWr<'static> {
    static SGE: [Sge; 1] = [Sge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    }];
    SendWr::new(
        id,
        SendOp::Write {
            remote: Remote::new(0x2000, 2),
        },
        &SGE,
        flags,
    )
}

#[test]
fn owner_bit_across_many_wraps() {
    let mut e = env(FakeGeometry {
        cqe_cnt: 8,
        sq_wqe_cnt: 16,
        ..FakeGeometry::default()
    });
    let mut wc = [Wc::default(); 4];
    for i in 0..1000u32 {
        let pi = e.qp.sq.producer();
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { e.qp.sq.post_one(&write_wr(i as u64, SendFlags::SIGNALED)) }.unwrap();
        // Nothing new yet: the slot still holds last pass's CQE (owner of
        // the previous pass) or the initial invalid entry.
        assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 0, "iter {i}");
        e.f.write_cqe(i, &req_cqe(pi as u16, 0x08, 0));
        assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 1, "iter {i}");
        assert_eq!(wc[0].wr_id, i as u64);
        assert_eq!(wc[0].status, WcStatus::SUCCESS);
        assert_eq!(wc[0].opcode, WcOpcode::RDMA_WRITE);
        assert_eq!(e.cq.consumer_index(), i + 1);
        assert_eq!(e.f.dbrec_cq_ci(), (i + 1) & 0xffffff);
    }
}

#[test]
fn stale_owner_is_not_consumed() {
    let mut e = env(FakeGeometry {
        cqe_cnt: 8,
        ..FakeGeometry::default()
    });
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { e.qp.sq.post_one(&write_wr(1, SendFlags::SIGNALED)) }.unwrap();
    e.cq.set_consumer_index(8); // second pass expects owner 1
    e.f.write_cqe(0, &req_cqe(0, 0x08, 0)); // owner 0: previous pass
    let mut wc = [Wc::default(); 1];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 0);
    assert_eq!(e.cq.consumer_index(), 8);
    assert_eq!(
        e.f.dbrec_cq_ci(),
        8,
        "dbrec written even when nothing polled"
    );
}

#[test]
fn error_cqes_map_every_syndrome() {
    let table = [
        (syndrome::LOCAL_LENGTH, WcStatus::LOC_LEN_ERR),
        (syndrome::LOCAL_QP_OP, WcStatus::LOC_QP_OP_ERR),
        (syndrome::LOCAL_PROT, WcStatus::LOC_PROT_ERR),
        (syndrome::WR_FLUSHED, WcStatus::WR_FLUSH_ERR),
        (syndrome::MW_BIND, WcStatus::MW_BIND_ERR),
        (syndrome::BAD_RESP, WcStatus::BAD_RESP_ERR),
        (syndrome::LOCAL_ACCESS, WcStatus::LOC_ACCESS_ERR),
        (syndrome::REMOTE_INVAL_REQ, WcStatus::REM_INV_REQ_ERR),
        (syndrome::REMOTE_ACCESS, WcStatus::REM_ACCESS_ERR),
        (syndrome::REMOTE_OP, WcStatus::REM_OP_ERR),
        (syndrome::TRANSPORT_RETRY_EXC, WcStatus::RETRY_EXC_ERR),
        (syndrome::RNR_RETRY_EXC, WcStatus::RNR_RETRY_EXC_ERR),
        (syndrome::REMOTE_ABORTED, WcStatus::REM_ABORT_ERR),
        (0x77, WcStatus::GENERAL_ERR),
    ];
    for (synd, status) in table {
        let mut e = env(FakeGeometry::default());
        // Unsignaled: error CQEs are reported anyway.
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { e.qp.sq.post_one(&write_wr(42, SendFlags::NONE)) }.unwrap();
        e.f.write_cqe(0, &err_cqe(0, 13, synd, 0x9a));
        let mut wc = [Wc::default(); 2];
        assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 1);
        assert_eq!(wc[0].status, status, "syndrome {synd:#x}");
        assert_eq!(wc[0].wr_id, 42);
        assert_eq!(wc[0].vendor_err, 0x9a);
        assert_eq!(wc[0].syndrome, synd);
        assert_eq!(wc[0].opcode, WcOpcode::RDMA_WRITE);
        assert_eq!(e.qp.sq.state(), QpState::Error);
        assert_eq!(e.qp.sq.free_bbs(), e.qp.sq.wqe_cnt());
    }
    // Responder error consumes a receive.
    let mut e = env(FakeGeometry::default());
    let buf = [Sge::new(0x3000, 64, 3)];
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe {
        e.qp.rq.post_list(&[RecvWr {
            wr_id: 7,
            sges: &buf,
        }])
    }
    .unwrap();
    e.f.write_cqe(0, &err_cqe(0, 14, syndrome::WR_FLUSHED, 0));
    let mut wc = [Wc::default(); 2];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (7, WcStatus::WR_FLUSH_ERR, WcOpcode::RECV)
    );
    assert_eq!(e.qp.rq.tail(), 1);
}

#[test]
fn unsignaled_run_is_retired_by_one_cqe() {
    let mut e = env(FakeGeometry::default());
    for i in 0..3 {
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { e.qp.sq.post(&write_wr(i, SendFlags::NONE)) }.unwrap();
    }
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { e.qp.sq.post(&write_wr(3, SendFlags::SIGNALED)) }.unwrap();
    e.qp.sq.ring();
    assert_eq!(e.qp.sq.free_bbs(), 60);
    e.f.write_cqe(0, &req_cqe(3, 0x08, 0));
    let mut wc = [Wc::default(); 4];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 1);
    assert_eq!(wc[0].wr_id, 3);
    assert_eq!(e.qp.sq.free_bbs(), 64);
}

#[test]
fn forced_signal_cqe_is_consumed_silently() {
    let mut e = env(FakeGeometry {
        sq_wqe_cnt: 8,
        ..FakeGeometry::default()
    });
    for i in 0..4 {
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { e.qp.sq.post(&write_wr(i, SendFlags::NONE)) }.unwrap();
    }
    e.qp.sq.ring();
    // The 4th WQE (index 3) was forced to signal.
    e.f.write_cqe(0, &req_cqe(3, 0x08, 0));
    let mut wc = [Wc::default(); 4];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 0);
    assert_eq!(e.cq.consumer_index(), 1);
    assert_eq!(e.qp.sq.free_bbs(), 8);
}

#[test]
fn responder_opcodes_and_immediates() {
    let mut e = env(FakeGeometry::default());
    let b = [Sge::new(0x3000, 64, 3)];
    let wrs: Vec<_> = (0..4)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sges: &b,
        })
        .collect();
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { e.qp.rq.post_list(&wrs) }.unwrap();
    assert_eq!(e.f.dbrec_rq(), 4);
    e.f.write_cqe(0, &resp_cqe(0, 2, 10, 0, 0));
    e.f.write_cqe(1, &resp_cqe(1, 3, 11, 0xdeadbeef, 0));
    e.f.write_cqe(2, &resp_cqe(2, 1, 12, 0x01020304, 0));
    e.f.write_cqe(3, &resp_cqe(3, 4, 13, 0x55667788, 0));
    let mut wc = [Wc::default(); 8];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 4);
    assert_eq!(
        (wc[0].wr_id, wc[0].opcode, wc[0].byte_len, wc[0].wc_flags),
        (100, WcOpcode::RECV, 10, 0)
    );
    assert_eq!(
        (wc[1].opcode, wc[1].imm_data, wc[1].wc_flags),
        (WcOpcode::RECV, 0xdeadbeef, 2)
    );
    assert_eq!(
        (wc[2].opcode, wc[2].imm_data, wc[2].wc_flags),
        (WcOpcode::RECV_RDMA_WITH_IMM, 0x01020304, 2)
    );
    assert_eq!(
        (wc[3].opcode, wc[3].imm_data, wc[3].wc_flags),
        (WcOpcode::RECV, 0x55667788, 8)
    );
    assert_eq!(e.f.dbrec_cq_ci(), 4, "one dbrec update for the batch");
}

#[test]
fn scatter_to_cqe_32_and_64() {
    for (size, format, n) in [(64u32, 1u8, 32usize), (128, 2, 64)] {
        let mut e = env(FakeGeometry {
            cqe_size: size,
            ..FakeGeometry::default()
        });
        let mut a = vec![0u8; 16 + 32];
        let mut b = vec![0u8; 128 + 32];
        // Guards of 16 bytes after each buffer's used part.
        let sg = [
            Sge::new(a.as_mut_ptr() as u64, 16, 1),
            Sge::new(b.as_mut_ptr() as u64, 128, 1),
        ];
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe {
            e.qp.rq.post_list(&[RecvWr {
                wr_id: 5,
                sges: &sg,
            }])
        }
        .unwrap();
        let data: Vec<u8> = (0..64u8).map(|i| i + 1).collect();
        let mut c = resp_cqe(0, 2, (n - 3) as u32, 0, format);
        let slot_base = 0usize;
        if format == 1 {
            c[..32].copy_from_slice(&data[..32]);
        } else {
            // First half of the 128-byte slot.
            e.f.cq_buf.bytes_mut()[slot_base..slot_base + 64].copy_from_slice(&data);
        }
        e.f.write_cqe(0, &c);
        let mut wc = [Wc::default(); 1];
        assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 1);
        let len = n - 3;
        assert_eq!(&a[..16], &data[..16]);
        assert_eq!(&b[..len - 16], &data[16..len]);
        assert!(
            b[len - 16..].iter().all(|x| *x == 0),
            "copied past byte_cnt"
        );
        assert!(a[16..].iter().all(|x| *x == 0));
    }
}

#[test]
fn scatter_to_cqe_requester_read() {
    let mut e = env(FakeGeometry::default());
    let mut dst = vec![0u8; 64];
    let sg = [Sge::new(dst.as_mut_ptr() as u64, 20, 1)];
    let wr = SendWr::new(
        9,
        SendOp::Read {
            remote: Remote::new(0x10, 1),
        },
        &sg,
        SendFlags::SIGNALED,
    );
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { e.qp.sq.post_one(&wr) }.unwrap();
    let mut c = req_cqe(0, 0x10, 20);
    for (i, b) in c[..32].iter_mut().enumerate() {
        *b = 0xc0 + i as u8;
    }
    c[63] = 1 << 2;
    e.f.write_cqe(0, &c);
    let mut wc = [Wc::default(); 1];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 1);
    assert_eq!((wc[0].opcode, wc[0].byte_len), (WcOpcode::RDMA_READ, 20));
    assert_eq!(&dst[..20], &c[..20]);
    assert!(dst[20..].iter().all(|x| *x == 0));
}

#[test]
fn corrupt_cqes_are_rejected_not_followed() {
    let mut e = env(FakeGeometry::default());
    let sges = [Sge::new(0x1000, 1, 1); 4]; // ds 5: a 2-BB WQE
                                            // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe {
        e.qp.sq
            .post_one(&SendWr::new(1, SendOp::Send, &sges, SendFlags::SIGNALED))
    }
    .unwrap();
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { e.qp.sq.post_one(&write_wr(2, SendFlags::SIGNALED)) }.unwrap();
    let mut wc = [Wc::default(); 4];
    // wqe_counter naming the middle BB of the first WQE.
    e.f.write_cqe(0, &req_cqe(1, 0x0a, 0));
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Err(Error::CqeCorrupt));
    assert_eq!(e.cq.consumer_index(), 1, "corrupt entry consumed");
    // A counter far outside the outstanding window.
    e.f.write_cqe(1, &req_cqe(0x8000, 0x0a, 0));
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Err(Error::CqeCorrupt));
    // An unknown CQE opcode (7).
    let mut c = req_cqe(0, 0x0a, 0);
    c[63] = 7 << 4;
    e.f.write_cqe(2, &c);
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Err(Error::CqeCorrupt));
    // Nothing was retired by the corrupt entries.
    assert_eq!(e.qp.sq.free_bbs(), 61);
    // A good CQE followed by a corrupt one: the good one is returned, the
    // corrupt one stays for the next call.
    e.f.write_cqe(3, &req_cqe(0, 0x0a, 0));
    e.f.write_cqe(4, &req_cqe(0x4444, 0x08, 0));
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Ok(1));
    assert_eq!(wc[0].wr_id, 1);
    assert_eq!(e.cq.consumer_index(), 4);
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Err(Error::CqeCorrupt));
    assert_eq!(e.cq.consumer_index(), 5);
    // A receive CQE out of order (RQ empty).
    e.f.write_cqe(5, &resp_cqe(0, 2, 1, 0, 0));
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Err(Error::CqeCorrupt));
    // Unknown QPN: a stale entry of a destroyed QP, skipped silently.
    let mut c = req_cqe(2, 0x08, 0);
    c[56..60].copy_from_slice(&0x0abcdeu32.to_be_bytes());
    e.f.write_cqe(6, &c);
    e.f.write_cqe(7, &req_cqe(2, 0x08, 0));
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Ok(1));
    assert_eq!(wc[0].wr_id, 2);
    assert_eq!(e.cq.stale_cqes(), 1);
}

#[test]
fn compressed_cqe_is_a_clear_error_and_not_consumed() {
    let mut e = env(FakeGeometry::default());
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { e.qp.sq.post_one(&write_wr(1, SendFlags::SIGNALED)) }.unwrap();
    let mut c = req_cqe(0, 0x08, 0);
    c[63] = 3 << 2;
    e.f.write_cqe(0, &c);
    let mut wc = [Wc::default(); 2];
    for _ in 0..3 {
        assert_eq!(e.cq.poll(&mut e.qp, &mut wc), Err(Error::CqeCompressed));
        assert_eq!(e.cq.consumer_index(), 0);
    }
}

#[test]
fn batch_poll_respects_output_size() {
    let mut e = env(FakeGeometry::default());
    for i in 0..20u32 {
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { e.qp.sq.post(&write_wr(i as u64, SendFlags::SIGNALED)) }.unwrap();
        e.f.write_cqe(i, &req_cqe(i as u16, 0x08, 0));
    }
    e.qp.sq.ring();
    let mut wc = [Wc::default(); 16];
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 16);
    assert_eq!(e.cq.poll(&mut e.qp, &mut wc).unwrap(), 4);
    assert_eq!(wc[3].wr_id, 19);
    assert_eq!(e.cq.poll(&mut e.qp, &mut []).unwrap(), 0);
}

#[test]
fn arm_writes_doorbell_record_and_uar() {
    let mut e = env(FakeGeometry::default());
    e.cq.set_consumer_index(0x123);
    e.cq.arm(false).unwrap();
    assert_eq!(e.f.dbrec_cq_arm(), 0x123);
    let reg = u64::from_be_bytes(e.f.uar.bytes()[0x20..0x28].try_into().unwrap());
    assert_eq!(reg, (0x123u64 << 32) | 0x80);
    e.cq.event_consumed();
    e.cq.arm(true).unwrap();
    let word = 1 << 28 | 1 << 24 | 0x123;
    assert_eq!(e.f.dbrec_cq_arm(), word);
    let reg = u64::from_be_bytes(e.f.uar.bytes()[0x20..0x28].try_into().unwrap());
    assert_eq!(reg, ((word as u64) << 32) | 0x80);
}

/// One-slot polls take their own straight-line path for the common case
/// and hand everything else to the loops. The same mixed stream of CQEs
/// (signaled and unsignaled WRITEs, a READ with its byte count, a forced
/// signal, a receive, an error, a stale QPN, a corrupt counter, a wrap of
/// the CQ) gives the same completions, errors, consumer index, doorbell
/// record and free space whether it is polled one entry at a time or 16
/// at a time.
#[test]
fn one_slot_polls_match_batch_polls() {
    type Outcome = Vec<core::result::Result<Wc, Error>>;
    fn run(slots: usize) -> (Outcome, Vec<u32>, u32, u32, u32, u64) {
        let mut e = env(FakeGeometry {
            sq_wqe_cnt: 8,
            cqe_cnt: 8,
            ..FakeGeometry::default()
        });
        let rbuf = [Sge::new(0x3000, 64, 3)];
        let read_sge = [Sge::new(0x4000, 8, 4)];
        let mut out: Outcome = Vec::new();
        let mut space = Vec::new();
        let mut ci = 0u32;
        let mut pi = 0u16;
        let mut wc = [Wc::default(); 16];
        // Post `flags` WRITEs (or a READ), write the CQEs, poll until the
        // CQ is empty.
        // Free send space after each completion (or error), so space that
        // a poll fails to retire shows at once.
        let mut drain = |e: &mut Env, out: &mut Outcome, space: &mut Vec<u32>| loop {
            let r = e.cq.poll(&mut e.qp, &mut wc[..slots]);
            match r {
                Ok(0) => break,
                Ok(n) => out.extend(wc[..n].iter().map(|w| Ok(*w))),
                Err(err) => out.push(Err(err)),
            }
            space.resize(out.len(), e.qp.sq.free_bbs());
        };
        for round in 0..3u64 {
            let base = round * 100;
            let post = |e: &mut Env, id: u64, flags: SendFlags| {
                // SAFETY: the queues live over memory this test owns; SGE addresses are never dereferenced.
                unsafe { e.qp.sq.post(&write_wr(id, flags)) }.unwrap();
            };
            // WRITE signaled, WRITE unsignaled, READ signaled (retires the
            // unsignaled one silently).
            post(&mut e, base, SendFlags::SIGNALED);
            post(&mut e, base + 1, SendFlags::NONE);
            let read = SendWr::new(
                base + 2,
                SendOp::Read {
                    remote: Remote::new(0x5000, 5),
                },
                &read_sge,
                SendFlags::SIGNALED,
            );
            // SAFETY: as above.
            unsafe { e.qp.sq.post(&read) }.unwrap();
            e.qp.sq.ring();
            // A receive for the responder CQE.
            let rwr = [RecvWr {
                wr_id: base + 50,
                sges: &rbuf,
            }];
            // SAFETY: as above.
            unsafe { e.qp.rq.post_list(&rwr) }.unwrap();
            let mut put = |e: &mut Env, c: [u8; 64]| {
                e.f.write_cqe(ci, &c);
                ci += 1;
            };
            put(&mut e, req_cqe(pi, 0x08, 0));
            put(&mut e, req_cqe(pi + 2, 0x10, 8));
            put(&mut e, resp_cqe(round as u16, 2, 33, 0, 0));
            // A stale entry of another QP.
            let mut stale = req_cqe(pi, 0x08, 0);
            stale[56..60].copy_from_slice(&0x0abcdeu32.to_be_bytes());
            put(&mut e, stale);
            drain(&mut e, &mut out, &mut space);
            pi += 3;
            // Four unsignaled WRITEs in an 8-BB queue: the guard forces the
            // last one to signal; its CQE is consumed silently. Then a
            // signaled one that fails, and a corrupt counter.
            for k in 0..4 {
                post(&mut e, base + 10 + k, SendFlags::NONE);
            }
            post(&mut e, base + 20, SendFlags::SIGNALED);
            e.qp.sq.ring();
            put(&mut e, req_cqe(pi + 3, 0x08, 0));
            put(&mut e, err_cqe(pi + 4, 13, syndrome::REMOTE_ACCESS, 0x88));
            put(&mut e, req_cqe(pi.wrapping_add(0x4000), 0x08, 0));
            drain(&mut e, &mut out, &mut space);
            pi += 5;
        }
        (
            out,
            space,
            e.cq.consumer_index(),
            e.f.dbrec_cq_ci(),
            e.qp.sq.free_bbs(),
            e.cq.stale_cqes(),
        )
    }
    let one = run(1);
    let batch = run(16);
    let strip = |r: &(Outcome, Vec<u32>, u32, u32, u32, u64)| (r.0.clone(), r.2, r.3, r.4, r.5);
    assert_eq!(strip(&one), strip(&batch));
    // Polled one at a time, each completion retires its WQE at once: the
    // WRITE frees its BB, the READ the unsignaled WRITE's and its own.
    assert_eq!(&one.1[..2], &[6, 8]);
    let (out, _, ci, dbrec, free, stale) = one;
    // Per round: WRITE, READ, RECV, the error; then the corrupt entry.
    assert_eq!(out.len(), 15, "{out:?}");
    assert_eq!((ci, dbrec, free, stale), (21, 21, 8, 3));
    let read = out[1].as_ref().unwrap();
    assert_eq!(
        (read.wr_id, read.opcode, read.byte_len),
        (2, WcOpcode::RDMA_READ, 8)
    );
    assert_eq!(out[4], Err(Error::CqeCorrupt));
    assert_eq!(out[3].as_ref().unwrap().status, WcStatus::REM_ACCESS_ERR);
}
