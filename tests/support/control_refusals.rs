//! A refused control call changes nothing (issue 17, item 2), one test
//! body per call, shared by the software device (`tests/control_refusals.rs`,
//! `cargo test`) and the kernel devices in the VM
//! (`tests/verbs_device/refusals.rs`, rxe and siw on both data paths).
//!
//! For every control call of the safe API and every parameter, an invalid
//! value gets its typed error, the object is exactly as before (state,
//! what `Qp::query` reports, the send space, and where the device lets
//! us see it, the device's own view), and the same call with valid values
//! then succeeds. Table-driven; the C counterpart is
//! `ffi-tests/refusals.h`.
//!
//! Where a device answers differently, the table says so per [`Kind`]:
//! - siw (iWARP) refuses `Qp::connect` with `Unsupported` before it looks
//!   at anything else (iWARP connects through rdma_cm): every connect
//!   case is that refusal, and the QP still connects through rdma_cm
//!   afterwards. The `Qp::modify` cases apply unchanged (they are checked
//!   before the device is asked), but siw itself refuses RTS without an
//!   rdma_cm connection, so on siw the valid RTS step is refused too, and
//!   changes nothing.
//! - Device limits only the device knows (a GID index with no GID behind
//!   it) are refused by the kernel part-way through a connect, after INIT
//!   succeeded; the rollback must leave the QP in RESET, in the handle and
//!   in the kernel (the kernel then accepts RESET → INIT → RTR → RTS again
//!   and the connection carries traffic). The software device has one GID
//!   and does not look at the index: accepted there.
//! - `max_rd_atomic` above the device's limit is clamped to it by the
//!   verbs backend (`src/verbs/attr.rs`), not refused, and the software
//!   device ignores it: accepted everywhere (stated, and checked).
#![allow(dead_code)]

use std::any::Any;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

/// How long a completion is waited for.
const DEADLINE: Duration = Duration::from_secs(20);

/// Which device runs the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The software HCA (not started: [`Target::progress`] runs it).
    Soft,
    /// rxe (Soft-RoCE): connects out of band.
    Rxe,
    /// siw (soft-iWARP): connects through rdma_cm only.
    Siw,
}

/// The values just above what the device accepts, per parameter of the
/// create calls.
#[derive(Clone, Copy, Debug)]
pub struct TooBig {
    /// Work requests per queue.
    pub wr: u32,
    /// Send SGEs per WR.
    pub send_sge: u32,
    /// Receive SGEs per WR.
    pub recv_sge: u32,
    /// Inline bytes per WR.
    pub inline: u32,
    /// CQ depth.
    pub cq_depth: u32,
}

/// Connects two QPs in RESET by the device's own way (rdma_cm on siw);
/// returns what must live as long as the connection.
pub type CmConnect<B> = dyn Fn(&mut Qp<B>, &mut Qp<B>, &Device<B>) -> Box<dyn Any>;

/// A device to run the bodies on.
pub struct Target<B: Backend> {
    /// For messages.
    pub name: String,
    pub kind: Kind,
    /// A fresh device (each case starts from one).
    pub open: Box<dyn Fn() -> Device<B>>,
    /// The device's own view of a QP's state, where it can be read
    /// without going around the API (the software device's engine).
    pub device_state: fn(&Device<B>, u32) -> Option<QpState>,
    /// Lets the device make progress while a completion is waited for.
    pub progress: fn(&Device<B>),
    /// The create parameters the device refuses.
    pub too_big: TooBig,
    /// How the device connects when `Qp::connect` is not its way (siw).
    pub cm_connect: Option<Box<CmConnect<B>>>,
}

/// What a case expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Refused with exactly this error.
    Refused(Error),
    /// Refused by the kernel with an error of its own choosing (an errno
    /// mapped by `rdma_direct::verbs::errno_error`): printed, not pinned.
    ByKernel,
    /// Accepted (a value the device clamps or ignores).
    Accepted,
}

impl Want {
    #[track_caller]
    fn check(self, got: Result<(), Error>, what: &str) -> bool {
        eprintln!("{what}: {got:?}");
        match self {
            Want::Refused(e) => assert_eq!(got, Err(e), "{what}"),
            Want::ByKernel => assert!(got.is_err(), "{what}: a refusal by the kernel expected"),
            Want::Accepted => assert_eq!(got, Ok(()), "{what}"),
        }
        got.is_err()
    }
}

/// Two fresh QPs, each on its own CQ, in RESET.
pub struct Pair<B: Backend> {
    pub dev: Device<B>,
    pub pd: Pd<B>,
    pub cq: [Cq<B>; 2],
    pub qp: [Qp<B>; 2],
    /// rdma_cm connections (siw).
    pub keep: Option<Box<dyn Any>>,
}

fn pair<B: Backend>(t: &Target<B>) -> Pair<B> {
    let dev = (t.open)();
    let pd = dev.alloc_pd().unwrap();
    let init = QpInit::default();
    let depth = dev.cq_depth_for(&[&init]);
    let cq = [dev.create_cq(depth).unwrap(), dev.create_cq(depth).unwrap()];
    let qp = [
        pd.create_qp(&cq[0], &cq[0], &init).unwrap(),
        pd.create_qp(&cq[1], &cq[1], &init).unwrap(),
    ];
    Pair {
        dev,
        pd,
        cq,
        qp,
        keep: None,
    }
}

/// Everything observable about a QP from outside.
fn snapshot<B: Backend>(t: &Target<B>, p: &Pair<B>, i: usize) -> (QpQuery, Option<QpState>, u32) {
    let q = &p.qp[i];
    (q.query(), (t.device_state)(&p.dev, q.qpn()), q.send_space())
}

/// One completion of `qp` on `cq`, waited for.
fn one_wc<B: Backend>(t: &Target<B>, dev: &Device<B>, cq: &mut Cq<B>, qp: &mut Qp<B>) -> Wc {
    let mut wc = [Wc::default(); 4];
    let t0 = Instant::now();
    loop {
        let n = cq.poll(qp, &mut wc).unwrap();
        if n > 0 {
            assert_eq!(n, 1, "{}: {:?}", t.name, &wc[..n]);
            return wc[0];
        }
        assert!(t0.elapsed() < DEADLINE, "{}: no completion", t.name);
        (t.progress)(dev);
    }
}

/// A SEND from QP 1 to QP 0 arrives: the connection works.
fn send_works<B: Backend>(t: &Target<B>, p: &mut Pair<B>) {
    let dst = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let mut src = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
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
    let (c0, c1) = p.cq.split_at_mut(1);
    let (q0, q1) = p.qp.split_at_mut(1);
    let w = one_wc(t, &p.dev, &mut c0[0], &mut q0[0]);
    assert_eq!((w.wr_id, w.status), (7, WcStatus::SUCCESS), "{}", t.name);
    let w = one_wc(t, &p.dev, &mut c1[0], &mut q1[0]);
    assert_eq!((w.wr_id, w.status), (8, WcStatus::SUCCESS), "{}", t.name);
    assert_eq!(&dst.as_slice()[..4], b"ping", "{}", t.name);
}

/// Connects QP 0 (in RESET) to QP 1 with valid values, as the device
/// connects: `Qp::connect`, or rdma_cm on siw (both QPs then).
fn connect_valid<B: Backend>(t: &Target<B>, p: &mut Pair<B>, ib: &QpInfo, what: &str) {
    if t.kind == Kind::Siw {
        assert_eq!(
            p.qp[0].connect(ib, &ConnectAttr::default()),
            Err(Error::Unsupported),
            "{what}: iWARP connects through rdma_cm only"
        );
        let cm = t.cm_connect.as_ref().expect("siw connects through rdma_cm");
        let (q0, q1) = p.qp.split_at_mut(1);
        p.keep = Some(cm(&mut q0[0], &mut q1[0], &p.dev));
    } else {
        p.qp[0].connect(ib, &ConnectAttr::default()).unwrap();
    }
    assert_eq!(p.qp[0].state(), QpState::Rts, "{what}");
}

/// A parameter of `Qp::connect` and a value of it.
pub struct ConnectCase {
    pub what: &'static str,
    pub spoil: fn(&mut QpInfo, &mut ConnectAttr),
    /// On the software device and on rxe (siw refuses every connect with
    /// `Unsupported`).
    pub soft: Want,
    pub rxe: Want,
}

const fn case(
    what: &'static str,
    spoil: fn(&mut QpInfo, &mut ConnectAttr),
    soft: Want,
    rxe: Want,
) -> ConnectCase {
    ConnectCase {
        what,
        spoil,
        soft,
        rxe,
    }
}

const INVALID: Want = Want::Refused(Error::InvalidAttribute);

/// Every parameter of `Qp::connect` with a value it refuses, and the
/// device limits.
pub const CONNECT_CASES: &[ConnectCase] = &[
    case(
        "remote.qpn wider than 24 bits",
        |r, _| r.qpn = 1 << 24,
        INVALID,
        INVALID,
    ),
    case(
        "remote.psn wider than 24 bits",
        |r, _| r.psn = 1 << 24,
        INVALID,
        INVALID,
    ),
    case(
        "access: an MR-only bit",
        |_, a| a.access = Access::MW_BIND,
        INVALID,
        INVALID,
    ),
    case(
        "access: an unknown bit",
        |_, a| a.access = Access(0x100),
        INVALID,
        INVALID,
    ),
    case("rnr_retry 8", |_, a| a.rnr_retry = 8, INVALID, INVALID),
    case("retry_cnt 8", |_, a| a.retry_cnt = 8, INVALID, INVALID),
    case("retry_cnt 255", |_, a| a.retry_cnt = 255, INVALID, INVALID),
    case("timeout 32", |_, a| a.timeout = 32, INVALID, INVALID),
    case(
        "min_rnr_timer 32",
        |_, a| a.min_rnr_timer = 32,
        INVALID,
        INVALID,
    ),
    case("sl 16", |_, a| a.sl = 16, INVALID, INVALID),
    case("max_mtu 255", |_, a| a.max_mtu = 255, INVALID, INVALID),
    // Refused at RTS, after INIT and RTR succeeded (on rxe's direct path
    // by rdma-direct before the kernel, which has no rate-limit field in
    // its MODIFY_QP; on the fallback by libibverbs): the connect must
    // roll back to RESET.
    case(
        "rate limit (no pacing)",
        |_, a| a.rate_limit_kbps = 1000,
        Want::Refused(Error::Unsupported),
        Want::Refused(Error::Unsupported),
    ),
    // Refused by the kernel at RTR, after INIT succeeded: rolled back.
    case(
        "gid_index 200 (no GID there)",
        |_, a| a.gid_index = Some(200),
        Want::Accepted,
        Want::ByKernel,
    ),
    case(
        "max_rd_atomic 255 (clamped to the device's limit)",
        |_, a| a.max_rd_atomic = 255,
        Want::Accepted,
        Want::Accepted,
    ),
];

/// Every [`CONNECT_CASES`] entry on `t`: a refused connect changes
/// nothing; the valid connect then works.
pub fn refused_connects<B: Backend>(t: &Target<B>) {
    for c in CONNECT_CASES {
        let what = format!("{}: connect, {}", t.name, c.what);
        let want = match t.kind {
            Kind::Soft => c.soft,
            Kind::Rxe => c.rxe,
            // iWARP: refused before anything else is looked at.
            Kind::Siw => Want::Refused(Error::Unsupported),
        };
        let mut p = pair(t);
        let (ia, ib) = (p.qp[0].info(), p.qp[1].info());
        if t.kind != Kind::Siw {
            p.qp[1].connect(&ia, &ConnectAttr::default()).unwrap();
        }
        let before = snapshot(t, &p, 0);
        let (mut remote, mut attr) = (ib, ConnectAttr::default());
        (c.spoil)(&mut remote, &mut attr);
        if want.check(p.qp[0].connect(&remote, &attr), &what) {
            assert_eq!(snapshot(t, &p, 0), before, "{what}: the QP changed");
            assert_eq!(p.qp[0].state(), QpState::Reset, "{what}");
            // The same call with valid values succeeds (the kernel takes
            // RESET → INIT → RTR → RTS again), and the QP works.
            connect_valid(t, &mut p, &ib, &what);
        } else {
            assert_eq!(p.qp[0].state(), QpState::Rts, "{what}");
        }
        send_works(t, &mut p);
    }
}

/// A second connect (not in RESET) is refused and changes nothing.
pub fn connect_outside_reset<B: Backend>(t: &Target<B>) {
    let what = format!("{}: connect outside RESET", t.name);
    let mut p = pair(t);
    let (ia, ib) = (p.qp[0].info(), p.qp[1].info());
    if t.kind != Kind::Siw {
        p.qp[1].connect(&ia, &ConnectAttr::default()).unwrap();
    }
    connect_valid(t, &mut p, &ib, &what);
    let before = snapshot(t, &p, 0);
    let other = ConnectAttr {
        retry_cnt: 3,
        ..ConnectAttr::default()
    };
    let want = match t.kind {
        Kind::Siw => Error::Unsupported,
        _ => Error::InvalidQpState,
    };
    assert_eq!(p.qp[0].connect(&ib, &other), Err(want), "{what}");
    assert_eq!(snapshot(t, &p, 0), before, "{what}");
    send_works(t, &mut p);
}

type ModifyCase = (&'static str, QpState, fn(&mut QpModify), Error);

/// Every attribute `Qp::modify` uses, per target state, with a value it
/// refuses. All are checked before the device is asked (the rate limit:
/// by the backend), so they hold on every device.
pub const MODIFY_CASES: &[ModifyCase] = &[
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

/// Every [`MODIFY_CASES`] entry on `t`, and a transition the state
/// machine refuses.
pub fn refused_modifies<B: Backend>(t: &Target<B>) {
    for (case, target, spoil, want) in MODIFY_CASES {
        let what = format!("{}: modify, {case}", t.name);
        let mut p = pair(t);
        let ib = p.qp[1].info();
        let steps = p.qp[0].connect_steps(&ib, &ConnectAttr::default());
        // Walk up to the state before `target`.
        for m in steps.iter().take_while(|m| m.state != *target) {
            p.qp[0].modify(m).unwrap();
        }
        let good = *steps.iter().find(|m| m.state == *target).unwrap();
        let before = snapshot(t, &p, 0);
        let mut bad = good;
        spoil(&mut bad);
        assert_eq!(p.qp[0].modify(&bad), Err(*want), "{what}");
        assert_eq!(snapshot(t, &p, 0), before, "{what}: the QP changed");
        let got = p.qp[0].modify(&good);
        if t.kind == Kind::Siw && *target == QpState::Rts {
            // siw enters RTS only with the socket rdma_cm hands it.
            Want::ByKernel.check(got, &format!("{what}: the valid RTS step on iWARP"));
            assert_eq!(snapshot(t, &p, 0), before, "{what}: the QP changed");
        } else {
            got.unwrap();
            assert_eq!(p.qp[0].state(), *target, "{what}");
        }
    }
    // A transition the state machine refuses: RESET straight to RTS (the
    // software device says InvalidQpState; the kernel devices EINVAL).
    let what = format!("{}: modify, RESET to RTS", t.name);
    let mut p = pair(t);
    let before = snapshot(t, &p, 0);
    let want = match t.kind {
        Kind::Soft => Want::Refused(Error::InvalidQpState),
        _ => Want::ByKernel,
    };
    want.check(p.qp[0].modify(&QpModify::to(QpState::Rts)), &what);
    assert_eq!(snapshot(t, &p, 0), before, "{what}");
}

/// Every field of `QpInit` with a value the device refuses.
fn init_cases(b: &TooBig) -> [(&'static str, QpInit); 6] {
    let d = QpInit::default();
    [
        (
            "max_send_wr 0",
            QpInit {
                max_send_wr: 0,
                ..d
            },
        ),
        (
            "max_send_wr too large",
            QpInit {
                max_send_wr: b.wr,
                ..d
            },
        ),
        (
            "max_recv_wr too large",
            QpInit {
                max_recv_wr: b.wr,
                ..d
            },
        ),
        (
            "max_send_sge too large",
            QpInit {
                max_send_sge: b.send_sge,
                ..d
            },
        ),
        (
            "max_recv_sge too large",
            QpInit {
                max_recv_sge: b.recv_sge,
                ..d
            },
        ),
        (
            "max_inline_data too large",
            QpInit {
                max_inline_data: b.inline,
                ..d
            },
        ),
    ]
}

/// `Device::create_cq`, `Pd::create_qp` and `Pd::register`: every
/// parameter refused, nothing left behind (the CQs' accounts), and the
/// valid calls then succeed.
pub fn refused_creates<B: Backend>(t: &Target<B>) {
    let name = &t.name;
    let dev = (t.open)();
    let pd = dev.alloc_pd().unwrap();
    // CQs: the depth.
    for depth in [0, t.too_big.cq_depth, u32::MAX] {
        assert_eq!(
            dev.create_cq(depth).err(),
            Some(Error::InvalidAttribute),
            "{name}: CQ depth {depth}"
        );
    }
    let init = QpInit::default();
    let cq = dev.create_cq(dev.cq_depth_for(&[&init])).unwrap();
    // QPs: every init field; the CQ's account is untouched.
    for (what, bad) in init_cases(&t.too_big) {
        let committed = cq.committed();
        assert_eq!(
            pd.create_qp(&cq, &cq, &bad).err(),
            Some(Error::InvalidAttribute),
            "{name}: {what} ({bad:?})"
        );
        assert_eq!(cq.committed(), committed, "{name}: {what}");
    }
    // A CQ too small for the QP: refused, nothing charged.
    let small = dev.create_cq(64).unwrap();
    assert_eq!(
        pd.create_qp(&small, &small, &init).err(),
        Some(Error::CqTooSmall),
        "{name}"
    );
    assert_eq!(small.committed(), 0, "{name}");
    let qp = pd.create_qp(&cq, &cq, &init).unwrap();
    assert!(cq.committed() > 0, "{name}");
    drop(qp);
    assert_eq!(cq.committed(), 0, "{name}");
    // Regions: the length (0 and too large) and the access bits.
    for (what, len, access) in [
        ("length 0", 0usize, Access::LOCAL_WRITE),
        (
            "length above the limit",
            Pd::<B>::MAX_REGISTER + 1,
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
            "{name}: register, {what}"
        );
    }
    let mr = pd
        .register(1, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(mr.len(), 1, "{name}");
}
