// Included by tests/verbs_device.rs: errors the responder detects, the
// bodies of tests/support/responder_errors.rs (which the software device
// runs in `cargo test`, tests/responder_errors.rs) on rxe and siw.

/// Runs one responder-error case on every device.
fn responder_case(test: &str, case: responder_errors::Case) {
    use responder_errors::{run, Kind, Rig};
    for (name, ip) in devices(test) {
        let p = pair(&name, ip, false, &|_, _| {});
        let kind = if is_roce(&name) { Kind::Rxe } else { Kind::Siw };
        let atomics = p.dev.backend().caps().atomics;
        let rig = Rig {
            a: p.a,
            b: p.b,
            cq_a: p.cq_a,
            cq_b: p.cq_b,
            pd: p.pd,
            keep: Box::new(p.conns),
            dev: p.dev,
        };
        run(rig, kind, case, atomics, &name);
    }
}

#[test]
fn responder_bad_rkey() {
    responder_case("responder_bad_rkey", responder_errors::Case::BadRkey);
}

#[test]
fn responder_write_to_read_only_region() {
    responder_case(
        "responder_write_to_read_only_region",
        responder_errors::Case::WriteReadOnly,
    );
}

#[test]
fn responder_read_without_remote_read() {
    responder_case(
        "responder_read_without_remote_read",
        responder_errors::Case::ReadWithoutRemoteRead,
    );
}

#[test]
fn responder_atomic_without_remote_atomic() {
    responder_case(
        "responder_atomic_without_remote_atomic",
        responder_errors::Case::AtomicWithoutRemoteAtomic,
    );
}

#[test]
fn responder_write_past_region_end() {
    responder_case(
        "responder_write_past_region_end",
        responder_errors::Case::WritePastEnd,
    );
}

#[test]
fn responder_send_larger_than_receive() {
    responder_case(
        "responder_send_larger_than_receive",
        responder_errors::Case::SendTooLarge,
    );
}
