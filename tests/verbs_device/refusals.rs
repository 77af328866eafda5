// Included by tests/verbs_device.rs: a refused control call changes
// nothing, on rxe and siw: the bodies of tests/support/control_refusals.rs
// (which the software device runs in `cargo test`,
// tests/control_refusals.rs). What differs per device is stated there.

/// rxe or siw as a refusal target. The kernel's own view of a QP's state
/// is not read (the API has no call for it); it is checked by behaviour:
/// after a refused connect the kernel must take RESET → INIT → RTR → RTS
/// again and the connection must carry a SEND.
fn refusal_target(name: &str, ip: IpAddr) -> control_refusals::Target<Dev> {
    use control_refusals::{Kind, Target, TooBig};
    let probe = VerbsDevice::open_named(name).expect("open device");
    let c = probe.caps();
    eprintln!(
        "{name}: max_qp_wr {}, max_sge {}, max_cqe {}, max_qp_rd_atom {}",
        c.max_qp_wr, c.max_sge, c.max_cqe, c.max_qp_rd_atom
    );
    drop(probe);
    let kind = if is_roce(name) { Kind::Rxe } else { Kind::Siw };
    let open_name = name.to_string();
    Target {
        name: name.to_string(),
        kind,
        open: Box::new(move || {
            let dev = Device::new(VerbsDevice::open_named(&open_name).expect("open device"));
            check_data_path(&dev);
            dev
        }),
        device_state: |_, _| None,
        progress: |_| thread::yield_now(),
        // One above what the device reports (ibv_query_device); the inline
        // size has no attribute there: 64 KiB is far above what either
        // kernel device's send WQE holds (docs/spec/rxe.md §3, siw.md).
        too_big: TooBig {
            wr: c.max_qp_wr.saturating_add(1),
            send_sge: c.max_sge.saturating_add(1),
            recv_sge: c.max_sge.saturating_add(1),
            inline: 1 << 16,
            cq_depth: c.max_cqe.saturating_add(1),
        },
        cm_connect: (kind == Kind::Siw).then(|| {
            let cm: Box<control_refusals::CmConnect<Dev>> = Box::new(move |a, b, dev| {
                Box::new(connect_qps(a, b, dev, ip, true, &|_, _| {})) as Box<dyn std::any::Any>
            });
            cm
        }),
    }
}

#[test]
fn refusals_connect() {
    for (name, ip) in devices("refusals_connect") {
        control_refusals::refused_connects(&refusal_target(&name, ip));
    }
}

#[test]
fn refusals_connect_outside_reset() {
    for (name, ip) in devices("refusals_connect_outside_reset") {
        control_refusals::connect_outside_reset(&refusal_target(&name, ip));
    }
}

#[test]
fn refusals_modify() {
    for (name, ip) in devices("refusals_modify") {
        control_refusals::refused_modifies(&refusal_target(&name, ip));
    }
}

#[test]
fn refusals_create() {
    for (name, ip) in devices("refusals_create") {
        control_refusals::refused_creates(&refusal_target(&name, ip));
    }
}
