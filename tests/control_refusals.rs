//! A refused control call changes nothing (issue 17, item 2), on the
//! software device: the bodies of `tests/support/control_refusals.rs`
//! (the same bodies run on rxe and siw in the VM,
//! `tests/verbs_device/refusals.rs`). The C counterpart is
//! `ffi-tests/test_refusals.c`.

use rdma_direct::api::Device;
use rdma_direct::soft::SoftDevice;

#[path = "support/control_refusals.rs"]
mod control_refusals;
use control_refusals::{Kind, Target, TooBig};

/// The software device, not started: each wait runs it in the test's
/// thread. Its view of a QP's state is its engine's.
fn soft() -> Target<SoftDevice> {
    Target {
        name: "soft".into(),
        kind: Kind::Soft,
        open: Box::new(|| Device::new(SoftDevice::new(Default::default()))),
        device_state: |d, qpn| d.backend().qp_state(qpn).ok(),
        progress: |d| {
            d.backend().run_until_idle(16);
        },
        // Values above the software device's limits (src/soft/device.rs:
        // `create_cq`, `create_qp`), as the table always used.
        too_big: TooBig {
            wr: 1 << 16,
            send_sge: 31,
            recv_sge: 65,
            inline: 513,
            cq_depth: 1 << 15,
        },
        cm_connect: None,
    }
}

#[test]
fn a_refused_connect_changes_nothing() {
    control_refusals::refused_connects(&soft());
}

#[test]
fn connect_outside_reset_changes_nothing() {
    control_refusals::connect_outside_reset(&soft());
}

#[test]
fn a_refused_modify_changes_nothing() {
    control_refusals::refused_modifies(&soft());
}

#[test]
fn refused_creates_and_registrations_change_nothing() {
    control_refusals::refused_creates(&soft());
}
