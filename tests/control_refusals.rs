//! A refused control call changes nothing (issue 17, item 2): for every
//! control call of the safe API and every parameter, an invalid value
//! gets its typed error, the object is exactly as before (state, what
//! `Qp::query` reports, the device's own view), and the same call with
//! valid values then succeeds. Table-driven; the C counterpart is
//! `ffi-tests/test_refusals.c`.

use rdma_direct::api::*;
use rdma_direct::soft::SoftDevice;
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

type Dev = Device<SoftDevice>;

fn dev() -> Dev {
    Device::new(SoftDevice::new(Default::default()))
}

/// Two fresh QPs, each on its own CQ, in RESET.
struct Pair {
    dev: Dev,
    pd: Pd<SoftDevice>,
    cq: [Cq<SoftDevice>; 2],
    qp: [Qp<SoftDevice>; 2],
}

fn pair() -> Pair {
    let dev = dev();
    let pd = dev.alloc_pd().unwrap();
    let init = QpInit::default();
    let depth = dev.cq_depth_for(&[&init]);
    let cq = [dev.create_cq(depth).unwrap(), dev.create_cq(depth).unwrap()];
    let qp = [
        pd.create_qp(&cq[0], &cq[0], &init).unwrap(),
        pd.create_qp(&cq[1], &cq[1], &init).unwrap(),
    ];
    Pair { dev, pd, cq, qp }
}

/// Everything observable about a QP from outside.
fn snapshot(p: &Pair, i: usize) -> (QpQuery, QpState, u32) {
    let q = &p.qp[i];
    (
        q.query(),
        p.dev.backend().qp_state(q.qpn()).unwrap(),
        q.send_space(),
    )
}

/// A SEND from QP 1 to QP 0 arrives: the connection works.
fn send_works(p: &mut Pair) {
    let dst = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let mut src = p.pd.register(64, Access::NONE).unwrap();
    src.as_mut_slice()[..4].copy_from_slice(b"ping");
    p.qp[0]
        .post_recv(&[RecvWr {
            wr_id: 7,
            sges: &[dst.sge(0, 64)],
        }])
        .unwrap();
    let s = [src.sge(0, 4)];
    p.qp[1]
        .post_send(&[SendWr::new(8, SendOp::Send, &s, SendFlags::SIGNALED)])
        .unwrap();
    p.dev.backend().run_until_idle(16);
    let mut wc = [Wc::default(); 4];
    let (c0, c1) = p.cq.split_at_mut(1);
    let (q0, q1) = p.qp.split_at_mut(1);
    assert_eq!(c0[0].poll(&mut q0[0], &mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::SUCCESS));
    assert_eq!(c1[0].poll(&mut q1[0], &mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (8, WcStatus::SUCCESS));
    assert_eq!(&dst.as_slice()[..4], b"ping");
}

type ConnectCase = (&'static str, fn(&mut QpInfo, &mut ConnectAttr), Error);

/// Every parameter of `Qp::connect` with a value it refuses.
const CONNECT_CASES: &[ConnectCase] = &[
    (
        "remote.qpn wider than 24 bits",
        |r, _| r.qpn = 1 << 24,
        Error::InvalidAttribute,
    ),
    (
        "remote.psn wider than 24 bits",
        |r, _| r.psn = 1 << 24,
        Error::InvalidAttribute,
    ),
    (
        "access: an MR-only bit",
        |_, a| a.access = Access::MW_BIND,
        Error::InvalidAttribute,
    ),
    (
        "access: an unknown bit",
        |_, a| a.access = Access(0x100),
        Error::InvalidAttribute,
    ),
    (
        "rnr_retry 8",
        |_, a| a.rnr_retry = 8,
        Error::InvalidAttribute,
    ),
    (
        "retry_cnt 8",
        |_, a| a.retry_cnt = 8,
        Error::InvalidAttribute,
    ),
    (
        "retry_cnt 255",
        |_, a| a.retry_cnt = 255,
        Error::InvalidAttribute,
    ),
    ("timeout 32", |_, a| a.timeout = 32, Error::InvalidAttribute),
    (
        "min_rnr_timer 32",
        |_, a| a.min_rnr_timer = 32,
        Error::InvalidAttribute,
    ),
    ("sl 16", |_, a| a.sl = 16, Error::InvalidAttribute),
    (
        "max_mtu 255",
        |_, a| a.max_mtu = 255,
        Error::InvalidAttribute,
    ),
    // Refused by the device at RTS, after INIT and RTR succeeded: the
    // connect must roll back to RESET.
    (
        "rate limit (no pacing)",
        |_, a| a.rate_limit_kbps = 1000,
        Error::Unsupported,
    ),
];

#[test]
fn a_refused_connect_changes_nothing() {
    for (what, spoil, want) in CONNECT_CASES {
        let mut p = pair();
        let (ia, ib) = (p.qp[0].info(), p.qp[1].info());
        p.qp[1].connect(&ia, &ConnectAttr::default()).unwrap();
        let before = snapshot(&p, 0);
        let (mut remote, mut attr) = (ib, ConnectAttr::default());
        spoil(&mut remote, &mut attr);
        assert_eq!(p.qp[0].connect(&remote, &attr), Err(*want), "{what}");
        assert_eq!(snapshot(&p, 0), before, "{what}: the QP changed");
        assert_eq!(p.qp[0].state(), QpState::Reset, "{what}");
        // The same call with valid values succeeds, and the QP works.
        p.qp[0].connect(&ib, &ConnectAttr::default()).unwrap();
        assert_eq!(p.qp[0].state(), QpState::Rts, "{what}");
        send_works(&mut p);
    }
}

#[test]
fn connect_outside_reset_changes_nothing() {
    let mut p = pair();
    let (ia, ib) = (p.qp[0].info(), p.qp[1].info());
    p.qp[1].connect(&ia, &ConnectAttr::default()).unwrap();
    p.qp[0].connect(&ib, &ConnectAttr::default()).unwrap();
    let before = snapshot(&p, 0);
    let other = ConnectAttr {
        retry_cnt: 3,
        ..ConnectAttr::default()
    };
    assert_eq!(p.qp[0].connect(&ib, &other), Err(Error::InvalidQpState));
    assert_eq!(snapshot(&p, 0), before);
    send_works(&mut p);
}

type ModifyCase = (&'static str, QpState, fn(&mut QpModify), Error);

/// Every attribute `Qp::modify` uses, per target state, with a value it
/// refuses (and a transition the state machine refuses).
const MODIFY_CASES: &[ModifyCase] = &[
    (
        "INIT: unknown access bit",
        QpState::Init,
        |m| m.access = Access(0x10),
        Error::InvalidAttribute,
    ),
    (
        "RTR: path_mtu 128",
        QpState::Rtr,
        |m| m.path_mtu = 128,
        Error::InvalidAttribute,
    ),
    (
        "RTR: path_mtu 8192",
        QpState::Rtr,
        |m| m.path_mtu = 8192,
        Error::InvalidAttribute,
    ),
    (
        "RTR: dest_qpn 2^24",
        QpState::Rtr,
        |m| m.dest_qpn = 1 << 24,
        Error::InvalidAttribute,
    ),
    (
        "RTR: rq_psn 2^24",
        QpState::Rtr,
        |m| m.rq_psn = 1 << 24,
        Error::InvalidAttribute,
    ),
    (
        "RTR: min_rnr_timer 32",
        QpState::Rtr,
        |m| m.min_rnr_timer = 32,
        Error::InvalidAttribute,
    ),
    (
        "RTR: sl 16",
        QpState::Rtr,
        |m| m.av.sl = 16,
        Error::InvalidAttribute,
    ),
    (
        "RTR: flow label 2^20",
        QpState::Rtr,
        |m| m.av.flow_label = 1 << 20,
        Error::InvalidAttribute,
    ),
    (
        "RTS: sq_psn 2^24",
        QpState::Rts,
        |m| m.sq_psn = 1 << 24,
        Error::InvalidAttribute,
    ),
    (
        "RTS: timeout 32",
        QpState::Rts,
        |m| m.timeout = 32,
        Error::InvalidAttribute,
    ),
    (
        "RTS: retry_cnt 8",
        QpState::Rts,
        |m| m.retry_cnt = 8,
        Error::InvalidAttribute,
    ),
    (
        "RTS: rnr_retry 8",
        QpState::Rts,
        |m| m.rnr_retry = 8,
        Error::InvalidAttribute,
    ),
    (
        "RTS: rate limit",
        QpState::Rts,
        |m| m.rate_limit_kbps = 1,
        Error::Unsupported,
    ),
];

#[test]
fn a_refused_modify_changes_nothing() {
    for (what, target, spoil, want) in MODIFY_CASES {
        let mut p = pair();
        let ib = p.qp[1].info();
        let steps = p.qp[0].connect_steps(&ib, &ConnectAttr::default());
        // Walk up to the state before `target`.
        for m in steps.iter().take_while(|m| m.state != *target) {
            p.qp[0].modify(m).unwrap();
        }
        let good = *steps.iter().find(|m| m.state == *target).unwrap();
        let before = snapshot(&p, 0);
        let mut bad = good;
        spoil(&mut bad);
        assert_eq!(p.qp[0].modify(&bad), Err(*want), "{what}");
        assert_eq!(snapshot(&p, 0), before, "{what}: the QP changed");
        p.qp[0].modify(&good).unwrap();
        assert_eq!(p.qp[0].state(), *target, "{what}");
    }
    // A transition the state machine refuses: RESET straight to RTS.
    let mut p = pair();
    let before = snapshot(&p, 0);
    assert_eq!(
        p.qp[0].modify(&QpModify::to(QpState::Rts)),
        Err(Error::InvalidQpState)
    );
    assert_eq!(snapshot(&p, 0), before);
}

type InitCase = (&'static str, fn(&mut QpInit));

/// Every field of `QpInit` with a value the device refuses.
const INIT_CASES: &[InitCase] = &[
    ("max_send_wr 0", |i| i.max_send_wr = 0),
    ("max_send_wr 2^16", |i| i.max_send_wr = 1 << 16),
    ("max_recv_wr 2^16", |i| i.max_recv_wr = 1 << 16),
    ("max_send_sge 31", |i| i.max_send_sge = 31),
    ("max_recv_sge 65", |i| i.max_recv_sge = 65),
    ("max_inline_data 513", |i| i.max_inline_data = 513),
];

#[test]
fn refused_creates_and_registrations_change_nothing() {
    let dev = dev();
    let pd = dev.alloc_pd().unwrap();
    // CQs: the depth.
    for depth in [0, 1 << 15, u32::MAX] {
        assert_eq!(
            dev.create_cq(depth).err(),
            Some(Error::InvalidAttribute),
            "{depth}"
        );
    }
    let init = QpInit::default();
    let cq = dev.create_cq(dev.cq_depth_for(&[&init])).unwrap();
    // QPs: every init field; the CQ's account is untouched.
    for (what, spoil) in INIT_CASES {
        let mut bad = init;
        spoil(&mut bad);
        let committed = cq.committed();
        assert_eq!(
            pd.create_qp(&cq, &cq, &bad).err(),
            Some(Error::InvalidAttribute),
            "{what}"
        );
        assert_eq!(cq.committed(), committed, "{what}");
    }
    // A CQ too small for the QP: refused, nothing charged.
    let small = dev.create_cq(64).unwrap();
    assert_eq!(
        pd.create_qp(&small, &small, &init).err(),
        Some(Error::CqTooSmall)
    );
    assert_eq!(small.committed(), 0);
    let qp = pd.create_qp(&cq, &cq, &init).unwrap();
    assert!(cq.committed() > 0);
    drop(qp);
    assert_eq!(cq.committed(), 0);
    // Regions: the length (0 and too large) and the access bits.
    for (what, len, access) in [
        ("length 0", 0usize, Access::LOCAL_WRITE),
        (
            "length above the limit",
            Pd::<SoftDevice>::MAX_REGISTER + 1,
            Access::LOCAL_WRITE,
        ),
        ("unknown access bit", 64, Access(0x20)),
        ("remote write without local write", 64, Access::REMOTE_WRITE),
        (
            "remote atomic without local write",
            64,
            Access::REMOTE_ATOMIC,
        ),
    ] {
        assert_eq!(
            pd.register(len, access).err(),
            Some(Error::InvalidAttribute),
            "{what}"
        );
    }
    let mr = pd
        .register(1, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(mr.len(), 1);
}
