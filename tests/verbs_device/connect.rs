// Included by tests/verbs_device.rs: connecting QPs. rdma_cm on rxe, and
// the traffic class, service level and rate limit a connection asks for.

#[test]
fn rdma_cm_connects_on_rxe() {
    for (name, ip) in devices("rdma_cm_connects_on_rxe") {
        if !is_roce(&name) {
            continue; // iWARP always uses rdma_cm (every other test)
        }
        let mut p = pair(&name, ip, true, &|q, _| {
            let _ = q;
        });
        let src = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
        let dst = p.pd.register(64, ALL_REMOTE).unwrap();
        p.a.post_send(&[SendWr::new(
            1,
            SendOp::Write {
                remote: dst.remote(0),
            },
            &[src.sge(0, 64)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        let w = wait(&mut p.cq_a, &mut p.a, 1);
        assert_eq!(w[0].status, WcStatus::SUCCESS);
    }
}

/// Traffic class and service level per QP: what a
/// connection asks for is what the kernel holds for the QP (so its RoCEv2
/// traffic carries that DSCP/ECN byte and priority), and a rate limit on a
/// device without packet pacing is a typed `Unsupported`, not a bare
/// provider error. iWARP has no GRH: not applicable on siw.
#[test]
fn traffic_class_service_level_and_rate_limit() {
    for (name, _ip) in devices("traffic_class_service_level_and_rate_limit") {
        if !is_roce(&name) {
            eprintln!("{name}: traffic class / SL not applicable (iWARP)");
            continue;
        }
        let dev = Device::new(VerbsDevice::open_named(&name).expect("open device"));
        check_data_path(&dev);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let init = rdma_direct::api::QpInit {
            max_send_wr: 16,
            max_recv_wr: 16,
            ..rdma_direct::api::QpInit::default()
        };
        let mut a = pd.create_qp(&cq, &cq, &init).unwrap();
        let mut b = pd.create_qp(&cq, &cq, &init).unwrap();
        // Two classes of traffic on two QPs: storage on DSCP 26 (AF31),
        // application traffic on DSCP 46 (EF).
        let storage = ConnectAttr {
            access: ALL_REMOTE,
            traffic_class: 26 << 2,
            sl: 3,
            ..ConnectAttr::default()
        };
        let app = ConnectAttr {
            traffic_class: 46 << 2,
            sl: 5,
            ..storage
        };
        let (ia, ib) = (a.info(), b.info());
        a.connect(&ib, &storage).unwrap();
        b.connect(&ia, &app).unwrap();
        for (q, want) in [(&a, &storage), (&b, &app)] {
            let s = dev.backend().query_qp_service(q.qpn()).unwrap();
            // RoCEv2 priorities come from the DSCP: that is what must
            // stick. (The kernel takes the hop limit from the IP route and
            // keeps no SL without a VLAN; shown for the record.)
            assert_eq!(s.traffic_class, want.traffic_class, "{name}: {s:?}");
            eprintln!("{name}: QP {} service {s:?}", q.qpn());
        }
        let attr = storage;
        drop((a, b));
        // A rate limit where the device cannot pace.
        let mut c = pd.create_qp(&cq, &cq, &init).unwrap();
        let d = pd.create_qp(&cq, &cq, &init).unwrap();
        let limited = ConnectAttr {
            rate_limit_kbps: 10_000,
            ..attr
        };
        assert_eq!(
            c.connect(&d.info(), &limited).err(),
            Some(Error::Unsupported),
            "{name}: rxe has no packet pacing"
        );
    }
}
