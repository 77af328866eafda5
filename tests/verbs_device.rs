//! The verbs backend on real kernel devices: rxe (RoCEv2) and siw (iWARP).
//!
//! These tests need RDMA devices. On a host without any (the CI machine's
//! kernel has no RDMA support at all) only
//! [`host_reports_missing_devices`] does real work and every device test
//! prints that it did not run and why. Inside the test VM
//! (`scripts/vm-test.sh`, which sets `IN_RDMA_VM=1`, `RXE_DEV`, `RXE_IP`,
//! `SIW_DEV`, `SIW_IP`) a missing device is a failure, never a skip.
//!
//! Each test runs on both devices. Two QPs on one device talk to each other
//! through the kernel (rxe loops packets back, siw connects over TCP):
//! rxe QPs are connected directly (the out-of-band path), siw QPs through
//! rdma_cm, and `rdma_cm_connects_on_rxe` covers rdma_cm on rxe too.
//! siw has no atomics and no immediate data; those cases check the
//! device's capability and say so.
#![cfg(feature = "verbs")]

use std::net::IpAddr;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, Backend, ConnectAttr, Device, Mr, QpModify, QpState, Transport, Wc, WcOpcode, WcStatus,
};
use rdma_direct::verbs::{list_devices, VerbsDevice};
use rdma_direct::{Error, RecvWr, Remote, SendFlags, SendOp, SendWr};

mod common;
use common::*;
#[path = "support/control_refusals.rs"]
mod control_refusals;
#[path = "support/responder_errors.rs"]
mod responder_errors;

// The device tests, by subject. Included, not `mod`: every test keeps its
// name at the crate root (a module would prefix it).
include!("verbs_device/data_path.rs");
include!("verbs_device/connect.rs");
include!("verbs_device/errors.rs");
include!("verbs_device/exposure.rs");
include!("verbs_device/responder.rs");
include!("verbs_device/refusals.rs");
include!("verbs_device/srq.rs");
include!("verbs_device/ud.rs");
include!("verbs_device/mesh.rs");

#[test]
fn host_reports_missing_devices() {
    let list = list_devices().expect("listing never fails");
    if list.is_empty() {
        assert!(!in_vm(), "no RDMA device inside the test VM");
        eprintln!("no RDMA device on this host: device tests run in the VM (scripts/vm-test.sh)");
        assert_eq!(
            VerbsDevice::open(&Default::default()).err(),
            Some(Error::NoDevice)
        );
        assert_eq!(VerbsDevice::open_named("rxe0").err(), Some(Error::NoDevice));
    } else {
        for d in &list {
            let dev = VerbsDevice::open_named(&d.name).expect("open listed device");
            let p = dev.port();
            eprintln!(
                "{}: {:?}, gid index {}, mtu {}",
                d.name, p.transport, p.gid_index, p.mtu
            );
            assert_eq!(d.iwarp, p.transport == Transport::Iwarp);
        }
        assert_eq!(
            VerbsDevice::open_named("no-such-device").err(),
            Some(Error::NoDevice)
        );
    }
}

#[test]
fn ports_report_transport_and_gid() {
    for (name, ip) in devices("ports_report_transport_and_gid") {
        let dev = VerbsDevice::open_named(&name).unwrap();
        let p = dev.port();
        if is_roce(&name) {
            assert_eq!(p.transport, Transport::Roce, "{name}");
            // The default GID is the RoCEv2 IPv4-mapped address of the netdev.
            let IpAddr::V4(v4) = ip else {
                panic!("IPv4 expected")
            };
            assert_eq!(&p.gid[10..12], &[0xff, 0xff], "{name}: {:?}", p.gid);
            assert_eq!(&p.gid[12..], &v4.octets(), "{name}");
        } else {
            assert_eq!(p.transport, Transport::Iwarp, "{name}");
        }
        assert!(p.mtu >= 256);
    }
}

fn fill(m: &mut Mr<Dev>, seed: u8) {
    for (i, b) in m.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add((i * 7) as u8);
    }
}
