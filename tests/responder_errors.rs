//! Errors the responder detects, on the software device: each case of
//! `tests/support/responder_errors.rs` (the same bodies run on rxe and
//! siw in the VM, `tests/verbs_device/responder.rs`). The device runs on
//! its own thread, as a kernel device would.

use rdma_direct::api::{Access, ConnectAttr, Device, QpInit};
use rdma_direct::soft::{SoftConfig, SoftDevice};

#[path = "support/responder_errors.rs"]
mod responder_errors;
use responder_errors::{run, Case, Kind, Rig};

/// Two QPs of a started software device, connected to each other with
/// every remote right granted at the QP level.
fn rig() -> (Rig<SoftDevice>, SoftDevice) {
    let soft = SoftDevice::new(SoftConfig::default());
    soft.start();
    let dev = Device::new(soft.clone());
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(256).unwrap();
    let cq_b = dev.create_cq(256).unwrap();
    let init = QpInit {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
        srq: None,
    };
    let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
    let attr = ConnectAttr {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    let rig = Rig {
        a,
        b,
        cq_a,
        cq_b,
        pd,
        keep: Box::new(()),
        dev,
    };
    (rig, soft)
}

fn case(c: Case) {
    let (rig, soft) = rig();
    run(rig, Kind::Soft, c, true, "soft");
    soft.stop();
}

#[test]
fn responder_bad_rkey() {
    case(Case::BadRkey);
}

#[test]
fn responder_write_to_read_only_region() {
    case(Case::WriteReadOnly);
}

#[test]
fn responder_read_without_remote_read() {
    case(Case::ReadWithoutRemoteRead);
}

#[test]
fn responder_atomic_without_remote_atomic() {
    case(Case::AtomicWithoutRemoteAtomic);
}

#[test]
fn responder_write_past_region_end() {
    case(Case::WritePastEnd);
}

#[test]
fn responder_send_larger_than_receive() {
    case(Case::SendTooLarge);
}
