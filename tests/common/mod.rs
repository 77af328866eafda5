//! Helpers shared by the real-device test files (`verbs_device.rs`,
//! `direct_paths.rs`): which devices to test, connected QP pairs, polling
//! with a deadline.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, Backend, ConnectAttr, Cq, Device, Pd, Qp, QpInit, QpState, Transport, Wc,
};
use rdma_direct::verbs::cm::{self, CmConnection, CmListener, CmOptions};
use rdma_direct::verbs::VerbsDevice;

pub type Dev = VerbsDevice;

pub fn in_vm() -> bool {
    std::env::var("IN_RDMA_VM").as_deref() == Ok("1")
}

/// The devices to test: (name, IPv4 address of its netdev).
pub fn devices(test: &str) -> Vec<(String, IpAddr)> {
    let mut v = Vec::new();
    for (d, ip) in [("RXE_DEV", "RXE_IP"), ("SIW_DEV", "SIW_IP")] {
        if let (Ok(d), Ok(ip)) = (std::env::var(d), std::env::var(ip)) {
            v.push((d, ip.parse().expect("device IP")));
        }
    }
    if v.is_empty() {
        assert!(
            !in_vm(),
            "{test}: IN_RDMA_VM=1 but RXE_DEV/SIW_DEV are not set"
        );
        eprintln!(
            "{test}: NOT RUN: no RDMA device on this host (run scripts/vm-test.sh for the \
             rxe/siw suite)"
        );
    }
    v
}

/// The device named by `RXE_DEV` is the RoCE one (rxe in the VM; a
/// ConnectX port when a user points the suite at real hardware).
pub fn is_roce(name: &str) -> bool {
    std::env::var("RXE_DEV").as_deref() == Ok(name)
}

pub const WAIT: Duration = Duration::from_secs(20);

/// The suite runs once per data path (`RDMA_DIRECT_DATA_PATH`, set by
/// scripts/vm-suite.sh): make sure the device really uses the one asked
/// for (rxe and siw have both).
pub fn check_data_path(dev: &Device<Dev>) {
    use rdma_direct::verbs::DataPath;
    let want = match std::env::var("RDMA_DIRECT_DATA_PATH").as_deref() {
        Ok("fallback") | Ok("portable") => DataPath::Fallback,
        // Auto picks the direct rings on rxe and siw.
        _ => DataPath::Direct,
    };
    assert_eq!(dev.backend().data_path(), want, "{}", dev.backend().name());
}

/// Polls `cq` until `n` completions arrived (or fails after [`WAIT`]).
#[track_caller]
pub fn wait(cq: &mut Cq<Dev>, qp: &mut Qp<Dev>, n: usize) -> Vec<Wc> {
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 16];
    let t0 = Instant::now();
    while got.len() < n {
        let k = cq.poll(qp, &mut buf).unwrap_or_else(|e| {
            panic!(
                "poll: {e} ({:?}) after {got:?}",
                rdma_direct::verbs::last_error()
            )
        });
        got.extend_from_slice(&buf[..k]);
        assert!(
            t0.elapsed() < WAIT,
            "timed out: {} of {n} completions: {got:?}",
            got.len()
        );
        if k == 0 {
            thread::yield_now();
        }
    }
    got
}

/// Asserts nothing more completes for a short while.
pub fn quiet(cq: &mut Cq<Dev>, qp: &mut Qp<Dev>) {
    let mut buf = [Wc::default(); 4];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(200) {
        assert_eq!(cq.poll(qp, &mut buf).unwrap(), 0, "unexpected {buf:?}");
    }
}

pub struct Pair {
    pub a: Qp<Dev>,
    pub b: Qp<Dev>,
    pub cq_a: Cq<Dev>,
    pub cq_b: Cq<Dev>,
    pub pd: Pd<Dev>,
    pub dev: Device<Dev>,
    pub conns: Vec<CmConnection>,
}

pub const ALL_REMOTE: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

/// Two connected QPs on device `name`; `pre_a`/`pre_b` receives are posted
/// before either side can send.
pub fn pair(
    name: &str,
    ip: IpAddr,
    use_cm: bool,
    pre: &(dyn Fn(&mut Qp<Dev>, bool) + Sync),
) -> Pair {
    let dev = Device::new(VerbsDevice::open_named(name).expect("open device"));
    check_data_path(&dev);
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
    let conns = connect_qps(&mut a, &mut b, &dev, ip, use_cm, pre);
    assert_eq!(a.state(), QpState::Rts);
    assert_eq!(b.state(), QpState::Rts);
    Pair {
        a,
        b,
        cq_a,
        cq_b,
        pd,
        dev,
        conns,
    }
}

/// Connects two QPs in RESET (on one device, or on two devices of the same
/// port: e.g. one on the direct path, one on the verbs fallback): rdma_cm
/// when asked or on iWARP, else out of band. `pre(qp, is_a)` runs once each
/// QP is in INIT, before the peer can send (post receives there).
pub fn connect_qps(
    a: &mut Qp<Dev>,
    b: &mut Qp<Dev>,
    dev: &Device<Dev>,
    ip: IpAddr,
    use_cm: bool,
    pre: &(dyn Fn(&mut Qp<Dev>, bool) + Sync),
) -> Vec<CmConnection> {
    let attr = ConnectAttr {
        access: ALL_REMOTE,
        ..ConnectAttr::default()
    };
    connect_qps_with(a, b, dev, ip, use_cm, pre, &attr)
}

/// [`connect_qps`] with the out-of-band path's attributes given.
pub fn connect_qps_with(
    a: &mut Qp<Dev>,
    b: &mut Qp<Dev>,
    dev: &Device<Dev>,
    ip: IpAddr,
    use_cm: bool,
    pre: &(dyn Fn(&mut Qp<Dev>, bool) + Sync),
    attr: &ConnectAttr,
) -> Vec<CmConnection> {
    let mut conns = Vec::new();
    if use_cm || dev.backend().port().transport == Transport::Iwarp {
        let (ca, cb) = cm::retry(3, Duration::from_millis(200), || {
            let l = CmListener::bind(SocketAddr::new(ip, 0), 4)?;
            let dst = SocketAddr::new(ip, l.port());
            let opts = CmOptions {
                private_data: b"rdd-test".to_vec(),
                ..CmOptions::default()
            };
            thread::scope(|s| {
                let server = s.spawn(|| {
                    l.accept(&mut *b, &opts, |q| {
                        pre(q, false);
                        Ok(())
                    })
                });
                let client = cm::connect(&mut *a, dst, None, &opts, |q| {
                    pre(q, true);
                    Ok(())
                });
                let server = server.join().expect("accept thread");
                Ok((client?, server?))
            })
        })
        .expect("rdma_cm connection");
        assert_eq!(&cb.private_data()[..8], b"rdd-test");
        conns.push(ca);
        conns.push(cb);
    } else {
        let (ia, ib) = (a.info(), b.info());
        let [i, r, t] = a.connect_steps(&ib, attr);
        a.modify(&i).unwrap();
        pre(a, true);
        a.modify(&r).unwrap();
        a.modify(&t).unwrap();
        let [i, r, t] = b.connect_steps(&ia, attr);
        b.modify(&i).unwrap();
        pre(b, false);
        b.modify(&r).unwrap();
        b.modify(&t).unwrap();
    }
    conns
}
