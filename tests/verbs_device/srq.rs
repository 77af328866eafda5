// Included by tests/verbs_device.rs: shared receive queues, on both data
// paths of rxe0 and siw0: the verbs fallback (RDMA_DIRECT_DATA_PATH=
// fallback, libibverbs' rxe and siw providers) and the direct rings (our
// own CREATE_SRQ, the SRQ ring written by our codecs). One SRQ feeding
// several RC QPs, every receive completed once with the right bytes and
// QP, the exact capacity, the limit event, and the refusals.

/// Polls `cq` through `srq`'s route until `n` completions arrived.
#[track_caller]
fn wait_srq(
    cq: &mut rdma_direct::api::Cq<Dev>,
    srq: &mut rdma_direct::api::Srq<Dev>,
    qps: &mut [&mut rdma_direct::api::Qp<Dev>],
    n: usize,
) -> Vec<Wc> {
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 16];
    let t0 = Instant::now();
    while got.len() < n {
        let k = cq
            .poll(&mut srq.route(qps), &mut buf)
            .unwrap_or_else(|e| panic!("poll: {e} ({:?})", rdma_direct::verbs::last_error()));
        got.extend_from_slice(&buf[..k]);
        assert!(t0.elapsed() < WAIT, "timed out: {got:?}");
        if k == 0 {
            thread::yield_now();
        }
    }
    got
}

/// Waits for the SRQ limit event of `srqn` (other events are ignored).
#[track_caller]
fn wait_limit_event(dev: &Device<Dev>, srqn: u32) {
    let t0 = Instant::now();
    loop {
        match dev.poll_async_event().unwrap() {
            Some(rdma_direct::api::AsyncEvent::SrqLimitReached { srqn: s }) if s == srqn => return,
            Some(_) => {}
            None => thread::sleep(Duration::from_millis(5)),
        }
        assert!(t0.elapsed() < WAIT, "no SrqLimitReached for SRQ {srqn}");
    }
}

const SRQ_CLIENTS: usize = 3;
const SRQ_MSGS: usize = 4;
const SRQ_SLOT: usize = 64;

#[test]
fn srq_serves_several_rc_qps() {
    use rdma_direct::api::QpInit;
    use rdma_direct::verbs::DataPath;
    for (name, ip) in devices("srq_serves_several_rc_qps") {
        let dev = Device::new(VerbsDevice::open_named(&name).expect("open device"));
        check_data_path(&dev);
        let pd = dev.alloc_pd().unwrap();
        let fallback = dev.backend().data_path() == DataPath::Fallback;
        eprintln!("{name}: SRQs on the {:?} path", dev.backend().data_path());
        let mut srq = pd.create_srq(32, 2).unwrap();
        assert!(srq.max_wr() >= 32 && srq.max_sge() >= 2, "{name}");
        assert_ne!(srq.srqn(), 0);
        let mut cq_s = dev.create_cq(256).unwrap();
        let mut cq_c = dev.create_cq(256).unwrap();
        let on_srq = QpInit {
            max_send_wr: 16,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
            srq: Some(srq.id()),
        };
        let plain = QpInit {
            max_recv_wr: 4,
            srq: None,
            ..on_srq
        };
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        let mut conns = Vec::new();
        for _ in 0..SRQ_CLIENTS {
            let mut s = pd.create_qp(&cq_s, &cq_s, &on_srq).unwrap();
            let mut c = pd.create_qp(&cq_c, &cq_c, &plain).unwrap();
            assert_eq!(s.srqn(), Some(srq.srqn()));
            conns.extend(connect_qps(&mut c, &mut s, &dev, ip, false, &|_, _| {}));
            servers.push(s);
            clients.push(c);
        }
        assert_eq!(srq.attached(), SRQ_CLIENTS as u32);

        // A receive on a QP attached to the SRQ is refused, nothing posted.
        let land = pd.register(SRQ_SLOT * 64, Access::LOCAL_WRITE).unwrap();
        let e = servers[0]
            .post_recv(&[RecvWr {
                wr_id: 1,
                sges: &[land.sge(0, 64)],
            }])
            .unwrap_err();
        assert_eq!(e.error, Error::InvalidAttribute, "{name}");

        // A list stops at the first bad WR: the one before it is posted.
        let too_many = [land.sge(0, 8), land.sge(8, 8), land.sge(16, 8)];
        let e = srq
            .post_recv(&[
                RecvWr {
                    wr_id: 1000,
                    sges: &[land.sge(0, SRQ_SLOT as u32)],
                },
                RecvWr {
                    wr_id: 1,
                    sges: &too_many,
                },
            ])
            .unwrap_err();
        assert_eq!((e.index, e.error), (1, Error::TooManySges), "{name}");
        let total = SRQ_CLIENTS * SRQ_MSGS;
        let slots: Vec<[rdma_direct::Sge; 1]> = (0..total)
            .map(|i| [land.sge(i * SRQ_SLOT, SRQ_SLOT as u32)])
            .collect();
        let rest: Vec<RecvWr> = (1..total)
            .map(|i| RecvWr {
                wr_id: 1000 + i as u64,
                sges: &slots[i],
            })
            .collect();
        srq.post_recv(&rest).unwrap();

        // Every client sends SRQ_MSGS messages, each 32 bytes of one value.
        let src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        for (ci, c) in clients.iter_mut().enumerate() {
            for m in 0..SRQ_MSGS {
                let v = (ci * 16 + m + 1) as u8;
                let msg = [v; 32];
                c.post_send(&[SendWr::inline(
                    v as u64,
                    SendOp::Send,
                    &[&msg[..]],
                    SendFlags::SIGNALED,
                )])
                .unwrap();
            }
        }
        let mut qrefs: Vec<&mut rdma_direct::api::Qp<Dev>> = servers.iter_mut().collect();
        let got = wait_srq(&mut cq_s, &mut srq, &mut qrefs, total);
        let w = wait(&mut cq_c, &mut clients[0], total);
        assert!(
            w.iter().all(|w| w.status == WcStatus::SUCCESS),
            "{name}: {w:?}"
        );
        let qpns: Vec<u32> = qrefs.iter().map(|q| q.qpn()).collect();
        let mut seen_ids = std::collections::HashSet::new();
        let mut seen_vals = std::collections::HashSet::new();
        for w in &got {
            assert_eq!(
                (w.status, w.opcode, w.byte_len),
                (WcStatus::SUCCESS, WcOpcode::RECV, 32),
                "{name}: {w:?}"
            );
            assert!(
                (1000..1000 + total as u64).contains(&w.wr_id),
                "{name}: {w:?}"
            );
            assert!(seen_ids.insert(w.wr_id), "{name}: wr_id twice: {w:?}");
            let off = (w.wr_id - 1000) as usize * SRQ_SLOT;
            let v = land.as_slice()[off];
            assert!(
                land.as_slice()[off..off + 32].iter().all(|&b| b == v),
                "{name}: torn message at {off}"
            );
            // The value names the client, so the QP it arrived at.
            let ci = (v as usize - 1) / 16;
            assert_eq!(w.qp_num, qpns[ci], "{name}: value {v} on the wrong QP");
            assert!(seen_vals.insert(v), "{name}: message {v} twice");
        }
        assert_eq!(seen_vals.len(), total);
        drop(src);

        // Every slot is free again: exactly max_wr receives fit, one more
        // is RqFull (the slots of completed receives are reused).
        let cap = srq.max_wr() as usize;
        let slots_all: Vec<[rdma_direct::Sge; 1]> = (0..cap)
            .map(|i| [land.sge((i % 64) * SRQ_SLOT, SRQ_SLOT as u32)])
            .collect();
        let fill: Vec<RecvWr> = (0..cap)
            .map(|i| RecvWr {
                wr_id: 2000 + i as u64,
                sges: &slots_all[i],
            })
            .collect();
        srq.post_recv(&fill).unwrap();
        let e = srq.post_recv(&fill[..1]).unwrap_err();
        assert_eq!((e.index, e.error), (0, Error::RqFull), "{name}");

        // The limit: cap posted, armed at cap - 2; 3 taken leaves fewer: one
        // event.
        let limit = srq.max_wr() - 2;
        srq.arm_limit(limit).unwrap();
        match srq.query() {
            Ok(a) => assert_eq!((a.srq_limit, a.max_wr), (limit, srq.max_wr()), "{name}"),
            // libsiw (rdma-core 44) has no query_srq: said, not faked. The
            // direct rings ask the kernel, which answers on siw too.
            Err(Error::Unsupported) if !is_roce(&name) && fallback => {}
            Err(e) => panic!("{name}: query: {e} {:?}", rdma_direct::verbs::last_error()),
        }
        assert_eq!(
            srq.arm_limit(srq.max_wr() + 1),
            Err(Error::InvalidAttribute)
        );
        for m in 0..3u8 {
            clients[0]
                .post_send(&[SendWr::inline(
                    50 + u64::from(m),
                    SendOp::Send,
                    &[&[m; 8][..]],
                    SendFlags::SIGNALED,
                )])
                .unwrap();
        }
        wait(&mut cq_c, &mut clients[0], 3);
        let got = wait_srq(&mut cq_s, &mut srq, &mut qrefs, 3);
        assert!(got.iter().all(|w| w.qp_num == qpns[0] && w.byte_len == 8));
        wait_limit_event(&dev, srq.srqn());
        // The event disarmed the limit: rxe reports 0; siw's kernel keeps
        // the stored limit (docs/spec/siw.md §5, docs/status.md); libsiw
        // has no query.
        match srq.query() {
            Ok(a) if is_roce(&name) => assert_eq!(a.srq_limit, 0, "{name}"),
            Ok(a) => assert_eq!((a.srq_limit, fallback), (limit, false), "{name}"),
            Err(Error::Unsupported) if !is_roce(&name) && fallback => {}
            Err(e) => panic!("{name}: query: {e} {:?}", rdma_direct::verbs::last_error()),
        }

        // Destroying the SRQ while QPs use it is refused; afterwards every
        // call is NoSuchObject.
        assert_eq!(srq.destroy(), Err(Error::ResourceBusy), "{name}");
        drop(qrefs);
        drop(conns);
        drop(servers);
        drop(clients);
        assert_eq!(srq.attached(), 0);
        srq.destroy().unwrap();
        let e = srq
            .post_recv(&[RecvWr {
                wr_id: 9,
                sges: &[land.sge(0, 8)],
            }])
            .unwrap_err();
        assert_eq!(e.error, Error::NoSuchObject);
        assert_eq!(srq.arm_limit(1), Err(Error::NoSuchObject));
        assert_eq!(srq.query().err(), Some(Error::NoSuchObject));
    }
}
