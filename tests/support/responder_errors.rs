//! Errors the responder detects, one test body per case, shared by the
//! software device (`tests/responder_errors.rs`, `cargo test`) and the
//! kernel devices in the VM (`tests/verbs_device/responder.rs`): a bad
//! rkey, a region without the right the request needs (WRITE to a
//! read-only region, READ without remote read, an atomic without remote
//! atomic), a WRITE past the region's end, and a SEND larger than the
//! receive. The rules are docs/spec/responder.md; where a device differs
//! from them, the body says so next to the expectation.
//!
//! Every case checks the requester's completion, that the responder's
//! connection ended (a spare receive posted on the responder is flushed),
//! that the target memory is untouched, and the device's asynchronous
//! events.
#![allow(dead_code)]

use std::any::Any;
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, AsyncEvent, Backend, Cq, Device, Pd, Qp, QpState, Wc, WcStatus};
use rdma_direct::{RecvWr, Remote, SendFlags, SendOp, SendWr};

/// How long a case waits for a completion or an event.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// How long "no further event" is watched for.
const QUIET: Duration = Duration::from_millis(300);

/// Two connected RC QPs on one device: `a` requests, `b` responds (it
/// grants remote read, write and atomics at the QP level, so every
/// refusal below comes from the memory region).
pub struct Rig<B: Backend> {
    pub a: Qp<B>,
    pub b: Qp<B>,
    pub cq_a: Cq<B>,
    pub cq_b: Cq<B>,
    pub pd: Pd<B>,
    /// Whatever else must live as long as the QPs (rdma_cm connections).
    pub keep: Box<dyn Any>,
    pub dev: Device<B>,
}

/// Which device runs the body: the expectations that differ are chosen
/// by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The software HCA: docs/spec/responder.md exactly.
    Soft,
    /// rxe (Soft-RoCE) or another InfiniBand/RoCE device.
    Rxe,
    /// siw (soft-iWARP): errors are iWARP TERMINATE messages.
    Siw,
}

/// The responder-side error cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// RDMA WRITE with an rkey that names no region.
    BadRkey,
    /// RDMA WRITE into a region registered with remote read only.
    WriteReadOnly,
    /// RDMA READ from a region without remote read.
    ReadWithoutRemoteRead,
    /// FETCH_AND_ADD on a region without remote atomic.
    AtomicWithoutRemoteAtomic,
    /// RDMA WRITE of 64 bytes at offset 32 of a 64-byte region.
    WritePastEnd,
    /// SEND of 64 bytes into a 16-byte receive.
    SendTooLarge,
}

/// Polls `cq` for `qp` until `n` completions arrived or [`DEADLINE`].
fn wait_wc<B: Backend>(cq: &mut Cq<B>, qp: &mut Qp<B>, n: usize, what: &str) -> Vec<Wc> {
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 8];
    let t0 = Instant::now();
    while got.len() < n {
        let k = cq.poll(qp, &mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        assert!(
            t0.elapsed() < DEADLINE,
            "{what}: {} of {n} completions: {got:?}",
            got.len()
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

/// Every event the device raises until it has been quiet for [`QUIET`].
fn events<B: Backend>(dev: &Device<B>) -> Vec<AsyncEvent> {
    let mut seen = Vec::new();
    while let Some(e) = dev.wait_async_event(QUIET).unwrap() {
        seen.push(e);
    }
    seen
}

/// Runs `case` on `rig`. `atomics`: the device executes atomics (siw
/// does not: that case says so and returns).
pub fn run<B: Backend>(rig: Rig<B>, kind: Kind, case: Case, atomics: bool, name: &str) {
    let what = format!("{name}: {case:?}");
    if case == Case::AtomicWithoutRemoteAtomic && !atomics {
        eprintln!("{what}: not run: the device has no atomics");
        return;
    }
    let Rig {
        mut a,
        mut b,
        mut cq_a,
        mut cq_b,
        pd,
        keep: _keep,
        dev,
    } = rig;
    let mut src = pd.register(64, Access::LOCAL_WRITE).unwrap();
    src.as_mut_slice().fill(0x5a);
    let spare = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let rights = match case {
        Case::BadRkey | Case::WritePastEnd => {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
        }
        Case::WriteReadOnly => Access::REMOTE_READ,
        Case::ReadWithoutRemoteRead => {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC
        }
        Case::AtomicWithoutRemoteAtomic => {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
        }
        Case::SendTooLarge => Access::LOCAL_WRITE,
    };
    let mut target = pd.register(64, rights).unwrap();
    target.as_mut_slice().fill(0xaa);

    // The responder's receives: the too-small one (SEND case) and a spare
    // one that only a flush can complete.
    if case == Case::SendTooLarge {
        b.post_recv(&[RecvWr {
            wr_id: 10,
            sges: &[target.sge(0, 16)],
        }])
        .unwrap();
    }
    b.post_recv(&[RecvWr {
        wr_id: 11,
        sges: &[spare.sge(0, 64)],
    }])
    .unwrap();

    let s64 = [src.sge(0, 64)];
    let s8 = [src.sge(0, 8)];
    let (op, sges) = match case {
        Case::BadRkey => (
            SendOp::Write {
                remote: Remote::new(target.addr(), target.rkey() ^ 0x00ff_ff00),
            },
            &s64[..],
        ),
        Case::WriteReadOnly => (
            SendOp::Write {
                remote: target.remote(0),
            },
            &s64[..],
        ),
        Case::ReadWithoutRemoteRead => (
            SendOp::Read {
                remote: target.remote(0),
            },
            &s64[..],
        ),
        Case::AtomicWithoutRemoteAtomic => (
            SendOp::FetchAdd {
                remote: target.remote(0),
                add: 1,
            },
            &s8[..],
        ),
        Case::WritePastEnd => (
            SendOp::Write {
                remote: target.remote(32),
            },
            &s64[..],
        ),
        Case::SendTooLarge => (SendOp::Send, &s64[..]),
    };
    a.post_send(&[SendWr::new(1, op, sges, SendFlags::SIGNALED)])
        .unwrap();

    // The requester's completion: the NAK the responder sent
    // (docs/spec/responder.md §2).
    let w = wait_wc(&mut cq_a, &mut a, 1, &what);
    assert_eq!(w[0].wr_id, 1, "{what}");
    let nak = match (case, kind) {
        (Case::SendTooLarge, Kind::Soft) => WcStatus::REM_INV_REQ_ERR,
        // rxe differs: its copy_data() refuses a message longer than the
        // receive with -EINVAL, not -ENOSPC, so send_data_in() takes it
        // for a malformed receive WQE (class A) and NAKs with Remote
        // Operational Error (seen on Debian's 6.1 kernel; the check is the
        // same in mainline).
        (Case::SendTooLarge, _) => WcStatus::REM_OP_ERR,
        _ => WcStatus::REM_ACCESS_ERR,
    };
    match kind {
        Kind::Soft | Kind::Rxe => {
            assert_eq!(w[0].status, nak, "{what}: requester {w:?}");
            assert_eq!(a.state(), QpState::Error, "{what}");
        }
        Kind::Siw if case == Case::ReadWithoutRemoteRead => {
            // siw differs: it does not check the remote-read right of the
            // region a READ names (seen on Debian's 6.1 kernel): the READ
            // succeeds, the data arrives, and the connection stays up.
            assert_eq!(
                w[0].status,
                WcStatus::SUCCESS,
                "{what}: siw now refuses: {w:?}"
            );
            assert_eq!(src.as_slice(), target.as_slice(), "{what}");
            eprintln!("{what}: siw executes a READ of a region without remote read");
            return;
        }
        Kind::Siw => {
            // iWARP has no NAK: the responder sends a TERMINATE and both
            // QPs go to ERROR. A WRITE or SEND completes at the requester
            // once TCP took the data, so its status is SUCCESS or, when
            // the TERMINATE came first, an error; a READ cannot succeed.
            eprintln!("{what}: requester completion {:?}", w[0].status);
            if case == Case::ReadWithoutRemoteRead {
                assert_ne!(w[0].status, WcStatus::SUCCESS, "{what}: READ {w:?}");
            }
        }
    }

    // The responder: its connection ended, so the spare receive is
    // flushed; in the SEND case the too-small receive completes first.
    let n = if case == Case::SendTooLarge { 2 } else { 1 };
    let got = wait_wc(&mut cq_b, &mut b, n, &what);
    if case == Case::SendTooLarge {
        assert_eq!(got[0].wr_id, 10, "{what}: {got:?}");
        match kind {
            // IB spec: a receive too small for the message completes
            // with Local Length Error (mlx5 syndrome 0x01).
            Kind::Soft => assert_eq!(got[0].status, WcStatus::LOC_LEN_ERR, "{what}: {got:?}"),
            // rxe differs (see the requester's status above): the class-A
            // path completes the receive with Local QP Operation Error
            // (rxe_resp.c: RESPST_ERR_MALFORMED_WQE ->
            // do_class_ac_error(.., IB_WC_LOC_QP_OP_ERR) -> do_complete).
            Kind::Rxe => assert_eq!(got[0].status, WcStatus::LOC_QP_OP_ERR, "{what}: {got:?}"),
            // siw marks the receive LOC_LEN_ERR (siw_send_check_ntoh) and
            // completes it when the stream fails (siw_rdmap_complete, which
            // may also say GENERAL_ERR); it may be flushed with the QP.
            Kind::Siw => {
                eprintln!("{what}: the short receive completed {:?}", got[0].status);
                assert!(
                    [
                        WcStatus::LOC_LEN_ERR,
                        WcStatus::GENERAL_ERR,
                        WcStatus::WR_FLUSH_ERR
                    ]
                    .contains(&got[0].status),
                    "{what}: {got:?}"
                )
            }
        }
    }
    let last = got[n - 1];
    assert_eq!(
        (last.wr_id, last.status),
        (11, WcStatus::WR_FLUSH_ERR),
        "{what}: the responder did not go to ERROR: {got:?}"
    );
    assert_eq!(b.state(), QpState::Error, "{what}");

    // No data landed anywhere.
    let untouched = if case == Case::SendTooLarge { 16 } else { 64 };
    assert!(
        target.as_slice()[..untouched].iter().all(|&x| x == 0xaa),
        "{what}: target memory changed"
    );
    if case == Case::ReadWithoutRemoteRead || case == Case::AtomicWithoutRemoteAtomic {
        assert!(
            src.as_slice().iter().all(|&x| x == 0x5a),
            "{what}: data landed at the requester"
        );
    }

    // The affiliated asynchronous events (docs/spec/responder.md §3).
    let seen = events(&dev);
    let bq = b.qpn();
    match kind {
        Kind::Soft => {
            let want: Vec<AsyncEvent> = match case {
                // Reported by the receive's completion, not as an event.
                Case::SendTooLarge => vec![],
                _ => vec![AsyncEvent::QpAccessError { qpn: bq }],
            };
            assert_eq!(seen, want, "{what}: events");
        }
        // rxe raises no QP event for responder errors: rxe_resp.c moves
        // the QP to ERROR with rxe_qp_error(), which notifies nobody.
        Kind::Rxe => assert_eq!(seen, vec![], "{what}: events"),
        Kind::Siw => {
            // siw raises QP_ACCESS_ERR when a region check fails
            // (siw_proc_write: siw_check_mem) and QP_FATAL when a SEND
            // does not fit (siw_proc_send); an rkey naming no region only
            // terminates (siw_mem_id2obj fails, no event).
            eprintln!("{what}: events {seen:?}");
            assert!(
                seen.iter()
                    .all(|e| e.is_qp_fatal() && (e.qpn() == Some(bq) || e.qpn() == Some(a.qpn()))),
                "{what}: events {seen:?}"
            );
            let want = match case {
                Case::WriteReadOnly | Case::WritePastEnd => {
                    Some(AsyncEvent::QpAccessError { qpn: bq })
                }
                Case::SendTooLarge => Some(AsyncEvent::QpFatal { qpn: bq }),
                _ => None,
            };
            if let Some(e) = want {
                assert!(seen.contains(&e), "{what}: no {e:?} in {seen:?}");
            }
        }
    }
}
