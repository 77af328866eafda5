//! The software HCA end to end through the safe API: every opcode with
//! memory contents checked, every error path with its exact status, fault
//! injection, CQ overrun, and hand-made malformed WQEs.

use rdma_direct::api::*;
use rdma_direct::provider::mlx5::cq::syndrome;
use rdma_direct::soft::{AsyncEvent, Fault, SoftConfig, SoftDevice};
use rdma_direct::{Error, Payload, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

#[path = "soft_device/helpers.rs"]
mod helpers;
use helpers::*;

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
fn send_with_imm_inline_and_a_refused_invalidate() {
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
    // A SEND_WITH_INV naming an ordinary MR is refused at the responder,
    // as on rxe: its receive fails with a remote invalid request error and
    // it moves to ERROR; the SEND itself completed (both of a's WRs above).
    assert_eq!(
        (wb[1].wr_id, wb[1].status, wb[1].syndrome),
        (2, WcStatus::REM_INV_REQ_ERR, syndrome::REMOTE_INVAL_REQ)
    );
    assert_eq!(p.b.state(), QpState::Error);
    assert_eq!(p.dev.backend().qp_state(p.b.qpn()).unwrap(), QpState::Error);
    // The rkey was not touched: after b reconnects, a WRITE with it lands.
    p.b.modify(&QpModify::to(QpState::Reset)).unwrap();
    let all = ConnectAttr {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..Default::default()
    };
    p.b.connect(&p.a.info(), &all).unwrap();
    let mut src = p.pd.register(8, Access::NONE).unwrap();
    src.as_mut_slice().copy_from_slice(b"written!");
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
    assert_eq!((wa[0].wr_id, wa[0].status), (12, WcStatus::SUCCESS));
    assert_eq!(&target.as_slice()[..8], b"written!");
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
    // A request the responder QP's access flags do not enable is an
    // invalid request (NAK class C), as rxe's check_op_valid has it: the
    // requester gets REM_INV_REQ_ERR, the responder goes to ERROR and
    // raises QP_REQ_ERR (docs/spec/responder.md §2, §3).
    let none = ConnectAttr::default();
    for op in ["read", "write", "atomic"] {
        let mut p = pair_with(SoftConfig::default(), 64, none, none);
        let src = p.pd.register(8, Access::LOCAL_WRITE).unwrap();
        let target = p.pd.register(8, RW).unwrap();
        let remote = target.remote(0);
        let sge = [src.sge(0, 8)];
        let kind = match op {
            "read" => SendOp::Read { remote },
            "write" => SendOp::Write { remote },
            _ => SendOp::FetchAdd { remote, add: 1 },
        };
        p.a.post_send_one(&SendWr::new(1, kind, &sge, SendFlags::SIGNALED))
            .unwrap();
        p.run();
        assert_eq!(
            p.poll_a()[0].status,
            WcStatus::REM_INV_REQ_ERR,
            "{op}: QP without the remote right"
        );
        let b = p.b.qpn();
        assert_eq!(p.dev.backend().qp_state(b), Ok(QpState::Error), "{op}");
        assert_eq!(
            p.dev.poll_async_event().unwrap(),
            Some(rdma_direct::api::AsyncEvent::QpRequestError { qpn: b }),
            "{op}"
        );
        assert_eq!(p.dev.poll_async_event().unwrap(), None, "{op}");
        assert!(target.as_slice().iter().all(|x| *x == 0), "{op}");
    }
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
#[path = "soft_device/malformed.rs"]
mod malformed;

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

/// `Mr::load_u64` refuses every offset whose word is not inside the region,
/// including offsets so large that `offset + 8` would wrap around.
#[test]
fn load_u64_refuses_offsets_past_the_end() {
    let dev = Device::new(SoftDevice::new(Default::default()));
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(mr.load_u64(56), Some(0));
    assert_eq!(mr.load_u64(64), None);
    assert_eq!(mr.load_u64(4), None);
    assert_eq!(mr.load_u64(usize::MAX - 7), None);
}
