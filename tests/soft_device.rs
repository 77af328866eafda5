//! The software HCA end to end through the safe API: every opcode with
//! memory contents checked, every error path with its exact status, fault
//! injection, CQ overrun, and hand-made malformed WQEs.

use rdma_direct::api::*;
use rdma_direct::provider::mlx5::cq::syndrome;
use rdma_direct::soft::{AsyncEvent, Fault, SoftConfig, SoftDevice};
use rdma_direct::{Error, Payload, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

type Dev = Device<SoftDevice>;

struct Pair {
    dev: Dev,
    pd: Pd<SoftDevice>,
    a: Qp<SoftDevice>,
    b: Qp<SoftDevice>,
    cqa: Cq<SoftDevice>,
    cqb: Cq<SoftDevice>,
}

fn pair_with(cfg: SoftConfig, cq_depth: u32, attr_a: ConnectAttr, attr_b: ConnectAttr) -> Pair {
    let dev = Device::new(SoftDevice::new(cfg));
    let pd = dev.alloc_pd().unwrap();
    let cqa = dev.create_cq(cq_depth).unwrap();
    let cqb = dev.create_cq(cq_depth).unwrap();
    // Several tests use small CQs on purpose (overrun, RNR, 128-byte CQE
    // wrap) and keep their completions below the CQ depth themselves: the
    // documented opt-out from the sizing guard.
    cqa.set_unguarded(true);
    cqb.set_unguarded(true);
    let mut a = pd.create_qp(&cqa, &cqa, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &QpInit::default()).unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr_a).unwrap();
    b.connect(&ia, &attr_b).unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cqa,
        cqb,
    }
}

fn pair() -> Pair {
    let all = ConnectAttr {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..Default::default()
    };
    pair_with(SoftConfig::default(), 256, all, all)
}

impl Pair {
    fn run(&self) {
        self.dev.backend().run_until_idle(64);
    }
    fn poll_a(&mut self) -> Vec<Wc> {
        let mut wc = [Wc::default(); 64];
        let n = self.cqa.poll(&mut self.a, &mut wc).unwrap();
        wc[..n].to_vec()
    }
    fn poll_b(&mut self) -> Vec<Wc> {
        let mut wc = [Wc::default(); 64];
        let n = self.cqb.poll(&mut self.b, &mut wc).unwrap();
        wc[..n].to_vec()
    }
}

const RW: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

fn fill(mr: &mut Mr<SoftDevice>, seed: u8) {
    for (i, b) in mr.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8).wrapping_mul(31);
    }
}

#[test]
fn send_recv_gather_scatter() {
    let mut p = pair();
    let mut src = p.pd.register(256, Access::NONE).unwrap();
    let dst = p.pd.register(256, Access::LOCAL_WRITE).unwrap();
    fill(&mut src, 1);
    // Scatter into two pieces of the receive buffer.
    p.b.post_recv(&[RecvWr {
        wr_id: 77,
        sges: &[dst.sge(0, 10), dst.sge(100, 90)],
    }])
    .unwrap();
    let gather = [
        src.sge(0, 30),
        src.sge(50, 20),
        src.sge(200, 0),
        src.sge(80, 50),
    ];
    p.a.post_send(&[SendWr::new(5, SendOp::Send, &gather, SendFlags::SIGNALED)])
        .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(wa.len(), 1);
    assert_eq!(
        (wa[0].wr_id, wa[0].status, wa[0].opcode),
        (5, WcStatus::SUCCESS, WcOpcode::SEND)
    );
    let wb = p.poll_b();
    assert_eq!(wb.len(), 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len),
        (77, WcStatus::SUCCESS, WcOpcode::RECV, 100)
    );
    let s = src.as_slice();
    let expect: Vec<u8> = [&s[0..30], &s[50..70], &s[80..130]].concat();
    let d = dst.as_slice();
    assert_eq!(&d[0..10], &expect[0..10]);
    assert_eq!(&d[100..190], &expect[10..100]);
    assert!(d[10..100].iter().all(|x| *x == 0));
}

#[test]
fn send_with_imm_inline_and_invalidate() {
    let mut p = pair();
    let dst = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let target = p.pd.register(64, RW).unwrap();
    p.b.post_recv(&[
        RecvWr {
            wr_id: 1,
            sges: &[dst.sge(0, 64)],
        },
        RecvWr {
            wr_id: 2,
            sges: &[dst.sge(0, 64)],
        },
    ])
    .unwrap();
    let msg: [&[u8]; 2] = [b"inline ", b"payload"];
    p.a.post_send(&[
        SendWr::inline(
            10,
            SendOp::SendImm { imm: 0xfeed_f00d },
            &msg,
            SendFlags::SIGNALED | SendFlags::SOLICITED,
        ),
        SendWr::new(
            11,
            SendOp::SendInv {
                rkey: target.rkey(),
            },
            &[],
            SendFlags::SIGNALED,
        ),
    ])
    .unwrap();
    p.run();
    assert_eq!(p.poll_a().len(), 2);
    let wb = p.poll_b();
    assert_eq!(
        (wb[0].opcode, wb[0].imm_data, wb[0].wc_flags, wb[0].byte_len),
        (WcOpcode::RECV, 0xfeed_f00d, 2, 14)
    );
    assert_eq!(&dst.as_slice()[..14], b"inline payload");
    assert_eq!(
        (wb[1].opcode, wb[1].imm_data, wb[1].wc_flags, wb[1].byte_len),
        (WcOpcode::RECV, target.rkey(), 8, 0)
    );
    // The invalidated rkey no longer grants access.
    let src = p.pd.register(8, Access::NONE).unwrap();
    p.a.post_send_one(&SendWr::new(
        12,
        SendOp::Write {
            remote: target.remote(0),
        },
        &[src.sge(0, 8)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!((wa[0].wr_id, wa[0].status), (12, WcStatus::REM_ACCESS_ERR));
}

#[test]
fn rdma_write_multi_sge_and_inline() {
    let mut p = pair();
    let mut src = p.pd.register(4096, Access::NONE).unwrap();
    fill(&mut src, 7);
    let target = p.pd.register(8192, RW).unwrap();
    let sg = [src.sge(0, 1000), src.sge(2000, 2000)];
    let data: [&[u8]; 1] = [b"0123456789abcdef"];
    p.a.post_send(&[
        SendWr::new(
            1,
            SendOp::Write {
                remote: target.remote(100),
            },
            &sg,
            SendFlags::NONE,
        ),
        SendWr::inline(
            2,
            SendOp::Write {
                remote: target.remote(5000),
            },
            &data,
            SendFlags::SIGNALED,
        ),
    ])
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(wa.len(), 1, "the unsignaled WRITE completes silently");
    assert_eq!((wa[0].wr_id, wa[0].opcode), (2, WcOpcode::RDMA_WRITE));
    let s = src.as_slice();
    let t = target.as_slice();
    assert_eq!(&t[100..1100], &s[0..1000]);
    assert_eq!(&t[1100..3100], &s[2000..4000]);
    assert_eq!(&t[5000..5016], b"0123456789abcdef");
    assert!(t[..100].iter().all(|x| *x == 0) && t[3100..5000].iter().all(|x| *x == 0));
    assert!(p.poll_b().is_empty(), "a plain WRITE consumes no receive");
}

#[test]
fn rdma_write_with_imm_consumes_a_receive() {
    let mut p = pair();
    let mut src = p.pd.register(64, Access::NONE).unwrap();
    fill(&mut src, 3);
    let target = p.pd.register(64, RW).unwrap();
    let rbuf = p.pd.register(16, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 9,
        sges: &[rbuf.sge(0, 16)],
    }])
    .unwrap();
    p.a.post_send_one(&SendWr::new(
        1,
        SendOp::WriteImm {
            remote: target.remote(8),
            imm: 42,
        },
        &[src.sge(0, 32)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    assert_eq!(p.poll_a()[0].opcode, WcOpcode::RDMA_WRITE);
    let wb = p.poll_b();
    assert_eq!(
        (wb[0].wr_id, wb[0].opcode, wb[0].imm_data, wb[0].byte_len),
        (9, WcOpcode::RECV_RDMA_WITH_IMM, 42, 32)
    );
    assert_eq!(&target.as_slice()[8..40], &src.as_slice()[..32]);
    assert!(
        rbuf.as_slice().iter().all(|x| *x == 0),
        "WRITE_IMM data goes to the remote address only"
    );
}

#[test]
fn rdma_read_scatters_locally() {
    let mut p = pair();
    let mut remote = p.pd.register(4096, RW).unwrap();
    fill(&mut remote, 9);
    let local = p.pd.register(4096, Access::LOCAL_WRITE).unwrap();
    p.a.post_send_one(&SendWr::new(
        3,
        SendOp::Read {
            remote: remote.remote(10),
        },
        &[local.sge(0, 100), local.sge(1000, 300)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(
        (wa[0].opcode, wa[0].byte_len, wa[0].status),
        (WcOpcode::RDMA_READ, 400, WcStatus::SUCCESS)
    );
    assert_eq!(&local.as_slice()[..100], &remote.as_slice()[10..110]);
    assert_eq!(&local.as_slice()[1000..1300], &remote.as_slice()[110..410]);
}

#[test]
fn atomics() {
    let mut p = pair();
    let counter = p.pd.register(64, RW).unwrap();
    let old = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let r = counter.remote(8);
    p.a.post_send(&[
        SendWr::new(
            1,
            SendOp::FetchAdd { remote: r, add: 5 },
            &[old.sge(0, 8)],
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            2,
            SendOp::FetchAdd { remote: r, add: 7 },
            &[old.sge(8, 8)],
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            3,
            SendOp::CompareSwap {
                remote: r,
                compare: 12,
                swap: 100,
            },
            &[old.sge(16, 8)],
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            4,
            SendOp::CompareSwap {
                remote: r,
                compare: 12,
                swap: 200,
            },
            &[old.sge(24, 8)],
            SendFlags::SIGNALED,
        ),
    ])
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(
        wa.iter()
            .map(|w| (w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (WcOpcode::FETCH_ADD, 8),
            (WcOpcode::FETCH_ADD, 8),
            (WcOpcode::COMP_SWAP, 8),
            (WcOpcode::COMP_SWAP, 8)
        ]
    );
    assert_eq!(counter.load_u64(8), Some(100));
    let olds: Vec<u64> = (0..4).map(|i| old.load_u64(i * 8).unwrap()).collect();
    assert_eq!(olds, vec![0, 5, 12, 100]);
}

#[test]
fn nop_completes() {
    let mut p = pair();
    p.a.post_send_one(&SendWr::new(1, SendOp::Nop, &[], SendFlags::SIGNALED))
        .unwrap();
    p.run();
    assert_eq!(p.poll_a()[0].status, WcStatus::SUCCESS);
}

#[test]
fn rnr_retry_then_exceeded_and_flush() {
    let attr = ConnectAttr {
        rnr_retry: 3,
        ..Default::default()
    };
    let mut p = pair_with(SoftConfig::default(), 64, attr, attr);
    let src = p.pd.register(8, Access::NONE).unwrap();
    p.a.post_send(&[
        SendWr::new(1, SendOp::Send, &[src.sge(0, 8)], SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Send, &[src.sge(0, 8)], SendFlags::NONE),
    ])
    .unwrap();
    for _ in 0..3 {
        p.dev.backend().step();
        assert!(p.poll_a().is_empty(), "retrying");
    }
    p.run();
    let wa = p.poll_a();
    assert_eq!(wa.len(), 2);
    assert_eq!(
        (wa[0].wr_id, wa[0].status, wa[0].syndrome),
        (1, WcStatus::RNR_RETRY_EXC_ERR, syndrome::RNR_RETRY_EXC)
    );
    assert_eq!(
        (wa[1].wr_id, wa[1].status),
        (2, WcStatus::WR_FLUSH_ERR),
        "unsignaled WR flushed too"
    );
    assert_eq!(p.a.state(), QpState::Error);
    assert_eq!(p.dev.backend().qp_state(p.a.qpn()), Ok(QpState::Error));
}

#[test]
fn rnr_infinite_retry_waits_for_a_receive() {
    let mut p = pair();
    let src = p.pd.register(8, Access::NONE).unwrap();
    let dst = p.pd.register(8, Access::LOCAL_WRITE).unwrap();
    p.a.post_send_one(&SendWr::new(
        1,
        SendOp::Send,
        &[src.sge(0, 8)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    for _ in 0..50 {
        p.dev.backend().step();
    }
    assert!(p.poll_a().is_empty());
    p.b.post_recv(&[RecvWr {
        wr_id: 2,
        sges: &[dst.sge(0, 8)],
    }])
    .unwrap();
    p.run();
    assert_eq!(p.poll_a()[0].status, WcStatus::SUCCESS);
    assert_eq!(p.poll_b()[0].wr_id, 2);
}

#[test]
fn protection_errors() {
    // (description, build the WR, expected requester status)
    let mut p = pair();
    let src = p.pd.register(64, Access::NONE).unwrap();
    let ro = p.pd.register(64, Access::REMOTE_READ).unwrap();
    let good = p.pd.register(64, RW).unwrap();
    let local_ro = p.pd.register(64, Access::NONE).unwrap();
    let other_pd = p.dev.alloc_pd().unwrap();
    let foreign = other_pd.register(64, RW).unwrap();
    let cases: Vec<(&str, SendWr<'_>, WcStatus)> = vec![
        (
            "bad lkey",
            SendWr::new(
                1,
                SendOp::Write {
                    remote: good.remote(0),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::SUCCESS,
        ),
        (
            "bad rkey",
            SendWr::new(
                2,
                SendOp::Write {
                    remote: Remote::new(good.addr(), 0xdead00),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::REM_ACCESS_ERR,
        ),
        (
            "read-only target",
            SendWr::new(
                3,
                SendOp::Write {
                    remote: ro.remote(0),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::REM_ACCESS_ERR,
        ),
        (
            "remote out of bounds",
            SendWr::new(
                4,
                SendOp::Write {
                    remote: good.remote(60),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::REM_ACCESS_ERR,
        ),
        (
            "foreign PD rkey",
            SendWr::new(
                5,
                SendOp::Write {
                    remote: foreign.remote(0),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::REM_ACCESS_ERR,
        ),
        (
            "READ into read-only local",
            SendWr::new(
                6,
                SendOp::Read {
                    remote: good.remote(0),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::LOC_PROT_ERR,
        ),
        (
            "local out of bounds",
            SendWr::new(
                7,
                SendOp::Write {
                    remote: good.remote(0),
                },
                &[],
                SendFlags::SIGNALED,
            ),
            WcStatus::LOC_PROT_ERR,
        ),
    ];
    let bad_lkey = [Sge::new(src.addr(), 8, 0x7777_7700)];
    let eight = [src.sge(0, 8)];
    let ro_local = [local_ro.sge(0, 8)];
    let oob = [src.sge(60, 8)];
    for (i, (what, mut wr, want)) in cases.into_iter().enumerate() {
        wr.payload = Payload::Sges(match i {
            0 => &bad_lkey,
            5 => &ro_local,
            6 => &oob,
            _ => &eight,
        });
        let want = if i == 0 { WcStatus::LOC_PROT_ERR } else { want };
        // Fresh connection each time: an error moves the QP to ERROR.
        for q in [&mut p.a, &mut p.b] {
            q.modify(&QpModify::to(QpState::Reset)).unwrap();
        }
        let (ia, ib) = (p.a.info(), p.b.info());
        let acc = ConnectAttr {
            access: Access::REMOTE_WRITE | Access::REMOTE_READ,
            ..Default::default()
        };
        p.a.connect(&ib, &acc).unwrap();
        p.b.connect(&ia, &acc).unwrap();
        p.a.post_send_one(&wr).unwrap();
        p.run();
        let wa = p.poll_a();
        assert_eq!(wa.len(), 1, "{what}");
        assert_eq!(wa[0].status, want, "{what}");
        assert_eq!(p.a.state(), QpState::Error, "{what}");
    }
    assert!(
        good.as_slice().iter().all(|x| *x == 0),
        "no failed WRITE touched memory"
    );
    assert!(ro.as_slice().iter().all(|x| *x == 0));
}

#[test]
fn qp_access_flags_are_enforced() {
    let none = ConnectAttr::default();
    let mut p = pair_with(SoftConfig::default(), 64, none, none);
    let src = p.pd.register(8, Access::LOCAL_WRITE).unwrap();
    let target = p.pd.register(8, RW).unwrap();
    p.a.post_send_one(&SendWr::new(
        1,
        SendOp::Read {
            remote: target.remote(0),
        },
        &[src.sge(0, 8)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    assert_eq!(
        p.poll_a()[0].status,
        WcStatus::REM_ACCESS_ERR,
        "QP without REMOTE_READ"
    );
}

#[test]
fn receive_too_small() {
    let mut p = pair();
    let src = p.pd.register(64, Access::NONE).unwrap();
    let dst = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[dst.sge(0, 16)],
    }])
    .unwrap();
    p.a.post_send_one(&SendWr::new(
        2,
        SendOp::Send,
        &[src.sge(0, 64)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    assert_eq!(p.poll_a()[0].status, WcStatus::REM_INV_REQ_ERR);
    let wb = p.poll_b();
    assert_eq!((wb[0].wr_id, wb[0].status), (1, WcStatus::LOC_LEN_ERR));
    assert_eq!(p.dev.backend().qp_state(p.b.qpn()), Ok(QpState::Error));
}

#[test]
fn error_state_flushes_every_outstanding_wr() {
    let mut p = pair();
    let src = p.pd.register(8, Access::NONE).unwrap();
    let dst = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let sge = [dst.sge(0, 64)];
    let rwrs: Vec<_> = (0..5)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sges: &sge,
        })
        .collect();
    p.b.post_recv(&rwrs).unwrap();
    p.b.modify(&QpModify::to(QpState::Error)).unwrap();
    // A's sends: posted before the device sees them; A goes to ERROR first.
    p.a.modify(&QpModify::to(QpState::Error)).unwrap();
    let s8 = [src.sge(0, 8)];
    let wrs: Vec<_> = (0..6)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::Send,
                &s8,
                if i % 2 == 0 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            )
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(
        wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5],
        "every WR, signaled or not"
    );
    assert!(wa.iter().all(|w| w.status == WcStatus::WR_FLUSH_ERR));
    let wb = p.poll_b();
    assert_eq!(
        wb.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![100, 101, 102, 103, 104]
    );
    assert!(wb
        .iter()
        .all(|w| w.status == WcStatus::WR_FLUSH_ERR && w.opcode == WcOpcode::RECV));
    let free = p.a.send_space();
    assert!(
        free > 0 && p.poll_a().is_empty(),
        "all space retired, nothing left"
    );
}

#[test]
fn cq_overrun_is_reported_not_overwritten() {
    let mut p = pair_with(
        SoftConfig::default(),
        3,
        ConnectAttr::default(),
        ConnectAttr::default(),
    );
    // depth 3 -> 4 entries. Six signaled NOPs would be refused by the
    // API's run-time headroom check (`CqFull` after three, see
    // tests/cq_guard.rs); unsignaled ones are not counted, and a flush
    // completes all six at once.
    for i in 0..6 {
        p.a.post_send_one(&SendWr::new(i, SendOp::Nop, &[], SendFlags::NONE))
            .unwrap();
    }
    p.a.modify(&QpModify::to(QpState::Error)).unwrap();
    p.run();
    assert_eq!(
        p.dev.backend().poll_async_event(),
        Some(AsyncEvent::CqOverrun { cqn: p.cqa.cqn() })
    );
    assert!(p.dev.backend().cq_overrun(p.cqa.cqn()));
    let wa = p.poll_a();
    assert_eq!(
        wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "the first four entries are intact"
    );
}

#[test]
fn fault_fail_nth_and_drop_peer_and_delay() {
    let mut p = pair();
    let src = p.pd.register(8, Access::NONE).unwrap();
    let t = p.pd.register(8, RW).unwrap();
    let w = |id| {
        SendWr::new(
            id,
            SendOp::Write {
                remote: t.remote(0),
            },
            &[],
            SendFlags::SIGNALED,
        )
    };
    let s8 = [src.sge(0, 8)];
    p.dev.backend().inject(Fault::FailNth {
        qpn: Some(p.a.qpn()),
        nth: 2,
        syndrome: syndrome::LOCAL_ACCESS,
    });
    p.a.post_send(&[
        SendWr {
            payload: Payload::Sges(&s8),
            ..w(1)
        },
        SendWr {
            payload: Payload::Sges(&s8),
            ..w(2)
        },
    ])
    .unwrap();
    p.run();
    let wa = p.poll_a();
    assert_eq!(
        (wa[0].status, wa[1].status, wa[1].syndrome),
        (
            WcStatus::SUCCESS,
            WcStatus::LOC_ACCESS_ERR,
            syndrome::LOCAL_ACCESS
        )
    );

    // Reconnect; then the peer disappears.
    let mut p = pair();
    let src = p.pd.register(8, Access::NONE).unwrap();
    p.dev.backend().inject(Fault::DropPeer { qpn: p.b.qpn() });
    p.a.post_send_one(&SendWr::new(
        3,
        SendOp::Send,
        &[src.sge(0, 8)],
        SendFlags::SIGNALED,
    ))
    .unwrap();
    p.run();
    assert_eq!(p.poll_a()[0].status, WcStatus::RETRY_EXC_ERR);

    // Delayed completions: nothing for 5 steps, then the completion.
    let mut p = pair();
    p.dev.backend().inject(Fault::DelayCompletions {
        time: std::time::Duration::from_millis(1),
        steps: 5,
    });
    p.a.post_send_one(&SendWr::new(4, SendOp::Nop, &[], SendFlags::SIGNALED))
        .unwrap();
    p.a.post_send_one(&SendWr::new(5, SendOp::Nop, &[], SendFlags::SIGNALED))
        .unwrap();
    for _ in 0..5 {
        p.dev.backend().step();
        assert!(p.poll_a().is_empty());
    }
    // Each WQE waits 5 passes from when the device reaches it.
    let mut got = 0;
    for _ in 0..20 {
        p.dev.backend().step();
        got += p.poll_a().len();
    }
    assert_eq!(got, 2);
}

#[test]
fn invalid_transitions_and_objects() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let mut q = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    assert_eq!(
        q.modify(&QpModify::to(QpState::Rts)),
        Err(Error::InvalidQpState)
    );
    assert_eq!(
        q.post_send_one(&SendWr::new(1, SendOp::Nop, &[], SendFlags::NONE)),
        Err(Error::InvalidQpState)
    );
    assert_eq!(
        dev.backend().modify_qp(0xfff, &QpModify::to(QpState::Init)),
        Err(Error::NoSuchObject)
    );
    assert_eq!(dev.backend().destroy_cq(cq.cqn()), Err(Error::ResourceBusy));
    let big = QpInit {
        max_send_sge: 31,
        ..QpInit::default()
    };
    assert_eq!(
        pd.create_qp(&cq, &cq, &big).err(),
        Some(Error::InvalidAttribute)
    );
    assert_eq!(
        pd.register(16, Access::REMOTE_WRITE).err(),
        Some(Error::InvalidAttribute),
        "REMOTE_WRITE needs LOCAL_WRITE"
    );
}

/// Writes raw WQE bytes into a QP's send ring and rings the doorbell
/// record, bypassing the encoder entirely.
mod malformed {
    use super::*;
    use rdma_direct::mmio;
    use rdma_direct::provider::mlx5::{CompletionQueue, CqRoute, QpQueues};

    struct NoRoute;
    impl CqRoute for NoRoute {
        fn route(&mut self, _: u32) -> Option<QpQueues<'_>> {
            None
        }
    }

    fn run_raw(wqe: &[u8], fix_index_and_qpn: bool) -> [u8; 64] {
        let dev = SoftDevice::new(SoftConfig::default());
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(256).unwrap();
        let q = dev
            .create_qp(pd, cq.cqn, cq.cqn, &QpInit::default())
            .unwrap();
        let q2 = dev
            .create_qp(pd, cq.cqn, cq.cqn, &QpInit::default())
            .unwrap();
        for (me, peer) in [(q.qpn, q2.qpn), (q2.qpn, q.qpn)] {
            dev.modify_qp(me, &QpModify::to(QpState::Init)).unwrap();
            dev.modify_qp(
                me,
                &QpModify {
                    dest_qpn: peer,
                    ..QpModify::to(QpState::Rtr)
                },
            )
            .unwrap();
            dev.modify_qp(me, &QpModify::to(QpState::Rts)).unwrap();
        }
        let mut bytes = wqe.to_vec();
        if fix_index_and_qpn {
            let w1 = u32::from_be_bytes(bytes[4..8].try_into().unwrap());
            bytes[4..8].copy_from_slice(&((q.qpn << 8) | (w1 & 0xff)).to_be_bytes());
        }
        // SAFETY: the ring is at least 64 BBs; nothing else writes it.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), q.dv.sq_buf, bytes.len()) };
        let nbb = bytes.len().div_ceil(64) as u32;
        // SAFETY: the SQ word of the QP's doorbell record.
        unsafe { mmio::write_dbrec(q.dv.dbrec.add(1), nbb) };
        dev.run_until_idle(8);
        let mut out = [0u8; 64];
        // SAFETY: the CQ buffer is live; the entry was written by the
        // device (checked through its opcode below).
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { core::ptr::copy_nonoverlapping(cq.dv.buf, out.as_mut_ptr(), 64) };
        // The consumer polls through the core and must see a corrupt CQE
        // for work it never posted: nothing of this QP is routed.
        // SAFETY: the descriptor is the device's live CQ.
        let mut c = unsafe { CompletionQueue::from_raw(&cq.dv) }.unwrap();
        let mut wc = [rdma_direct::provider::mlx5::Wc::default(); 1];
        assert_eq!(c.poll(&mut NoRoute, &mut wc), Ok(0));
        assert_eq!(c.stale_cqes(), 1);
        out
    }

    fn ctrl(op: u8, ds: u8, fm_ce_se: u8) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[3] = op;
        c[7] = ds;
        c[11] = fm_ce_se;
        c
    }

    fn expect_err(cqe: &[u8; 64], synd: u8) {
        assert_eq!(cqe[63] >> 4, 13, "REQ_ERR CQE");
        assert_eq!(cqe[55], synd, "syndrome");
    }

    #[test]
    fn bad_ds_zero() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x0a, 0, 0x08));
        expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
    }

    #[test]
    fn ds_larger_than_posted() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x0a, 9, 0x08)); // 3 BBs, 1 posted
        expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
    }

    #[test]
    fn unknown_opcode() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x77, 1, 0x08));
        expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
    }

    #[test]
    fn wrong_qpn_and_wrong_index() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x00, 1, 0x08));
        w[4] = 0x55; // QPN 0x550000: not this QP
        expect_err(&run_raw(&w, false), syndrome::LOCAL_QP_OP);
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x00, 1, 0x08));
        w[2] = 7; // WQE index 7 at producer 0
        expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
    }

    #[test]
    fn bad_lkey() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x0a, 2, 0x08));
        w[16..20].copy_from_slice(&8u32.to_be_bytes());
        w[20..24].copy_from_slice(&0x4242_4200u32.to_be_bytes());
        w[24..32].copy_from_slice(&0x1000u64.to_be_bytes());
        expect_err(&run_raw(&w, true), syndrome::LOCAL_PROT);
    }

    #[test]
    fn inline_length_inconsistent_with_ds() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x08, 3, 0x08));
        w[32..36].copy_from_slice(&(0x8000_0000u32 | 40).to_be_bytes()); // needs 3 octowords
        expect_err(&run_raw(&w, true), syndrome::LOCAL_LENGTH);
    }

    #[test]
    fn atomic_without_8_byte_data() {
        let mut w = vec![0u8; 64];
        w[..16].copy_from_slice(&ctrl(0x12, 4, 0x08));
        w[48..52].copy_from_slice(&4u32.to_be_bytes());
        w[52..56].copy_from_slice(&0x100u32.to_be_bytes());
        expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
    }
}

/// The device writes 128-byte CQEs too (the CQE64 in the second half of
/// each slot, docs/spec/mlx5.md §8), and the poller reads them.
#[test]
fn cqe128_round_trip() {
    let all = ConnectAttr {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..Default::default()
    };
    let cfg = SoftConfig {
        cqe_size: 128,
        ..SoftConfig::default()
    };
    let mut p = pair_with(cfg, 8, all, all);
    let src = p.pd.register(64, Access::NONE).unwrap();
    let dst = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    // More completions than entries: the owner bit flips across passes.
    for i in 0..40u64 {
        p.b.post_recv(&[RecvWr {
            wr_id: 1000 + i,
            sges: &[dst.sge(0, 64)],
        }])
        .unwrap();
        p.a.post_send_one(&SendWr::new(
            i,
            SendOp::SendImm { imm: i as u32 },
            &[src.sge(0, 16)],
            SendFlags::SIGNALED,
        ))
        .unwrap();
        p.run();
        let wa = p.poll_a();
        let wb = p.poll_b();
        assert_eq!((wa.len(), wb.len()), (1, 1), "iteration {i}");
        assert_eq!((wa[0].wr_id, wa[0].status), (i, WcStatus::SUCCESS));
        assert_eq!(
            (wb[0].wr_id, wb[0].imm_data, wb[0].byte_len),
            (1000 + i, i as u32, 16)
        );
    }
}
