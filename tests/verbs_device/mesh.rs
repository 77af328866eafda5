// Included by tests/verbs_device.rs: the Rust bootstrap on a kernel
// device. Ranks are threads of this process, as in tests/bootstrap_tcp.rs
// on the software device, but their QPs are rxe's: `MeshBuilder` connects
// them through `TcpAllgather` on loopback, and every rank WRITEs into every
// peer's published region.

/// Three ranks build a full mesh on the RoCE device (iWARP connects only
/// through rdma_cm, which `MeshBuilder` does not use: siw is refused by
/// `connect` and not tried here), twice.
///
/// First with the default `ConnectAttr`, which grants no remote access:
/// no WRITE into a peer's published region lands (the peer's QP refuses
/// it, and the refusal breaks both QPs of that pair, so the pair's other
/// WRITE is refused or flushed). Then with remote
/// access granted: each rank WRITEs its own 8-byte pattern into slot
/// `rank` of every peer's region, and after an allgather (a barrier: every
/// WRITE has completed at its requester, so it is placed) every rank finds
/// each peer's pattern in its own region and nothing in its own slot.
#[test]
fn a_tcp_bootstrapped_mesh_writes_to_every_peer() {
    use rdma_direct::bootstrap::{Allgather, MeshBuilder, TcpAllgather};
    const RANKS: u32 = 3;
    const BOOT: Duration = Duration::from_secs(20);
    let pattern = |r: u32| 0x5a5a_0000_0000_0000u64 | ((r as u64 + 1) * 0x0101);
    for (name, _ip) in devices("a_tcp_bootstrapped_mesh_writes_to_every_peer") {
        if !is_roce(&name) {
            eprintln!("{name}: MeshBuilder connects without rdma_cm: RoCE only");
            continue;
        }
        let dev = Device::new(VerbsDevice::open_named(&name).expect("open device"));
        check_data_path(&dev);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let mut l = Some(l);
        let hs: Vec<_> = (0..RANKS)
            .map(|r| {
                let (dev, addr, l) = (dev.clone(), addr.clone(), l.take());
                thread::spawn(move || {
                    let mut ag = match l {
                        Some(l) if r == 0 => TcpAllgather::with_listener(l, RANKS, BOOT),
                        _ => TcpAllgather::new(r, RANKS, &addr, BOOT),
                    }
                    .unwrap();
                    let pd = dev.alloc_pd().unwrap();
                    let init = rdma_direct::api::QpInit::default();
                    let region = pd.register(8 * RANKS as usize, ALL_REMOTE).unwrap();
                    let mut src = pd.register(8, Access::LOCAL_WRITE).unwrap();
                    src.as_mut_slice()
                        .copy_from_slice(&pattern(r).to_le_bytes());
                    let granted = ConnectAttr {
                        access: ALL_REMOTE,
                        ..ConnectAttr::default()
                    };
                    for attr in [ConnectAttr::default(), granted] {
                        let open = attr.access == ALL_REMOTE;
                        let mut cq = dev
                            .create_cq(dev.cq_depth_for(&[&init; RANKS as usize]))
                            .unwrap();
                        let mut mesh = MeshBuilder::new(&pd, &cq, &cq)
                            .connect_attr(attr)
                            .publish(&region)
                            .build(&mut ag)
                            .unwrap();
                        assert_eq!(mesh.peers().len(), RANKS as usize - 1);
                        for p in mesh.peers_mut() {
                            assert_eq!(p.qp.state(), QpState::Rts, "{}", p.rank);
                            let remote = p.mrs[0].remote(8 * r as u64);
                            p.qp.post_send(&[SendWr::new(
                                u64::from(p.rank),
                                SendOp::Write { remote },
                                &[src.sge(0, 8)],
                                SendFlags::SIGNALED,
                            )])
                            .unwrap();
                            let w = wait(&mut cq, &mut p.qp, 1);
                            assert_eq!(w[0].wr_id, u64::from(p.rank));
                            if open {
                                assert_eq!(w[0].status, WcStatus::SUCCESS, "to rank {}", p.rank);
                            } else {
                                // Refused by the peer's QP, or flushed: a
                                // refused WRITE breaks both QPs of the pair,
                                // so the other direction's WRITE may find its
                                // own QP in error already.
                                assert!(
                                    [
                                        WcStatus::REM_INV_REQ_ERR,
                                        WcStatus::REM_ACCESS_ERR,
                                        WcStatus::WR_FLUSH_ERR,
                                    ]
                                    .contains(&w[0].status),
                                    "a WRITE to rank {} without remote access: {:?}",
                                    p.rank,
                                    w[0].status
                                );
                            }
                        }
                        let mut all = [0u8; RANKS as usize];
                        ag.allgather(&[1], &mut all).unwrap();
                        assert_eq!(all, [1; RANKS as usize]);
                        if !open {
                            assert_eq!(region.as_slice(), &[0; 8 * RANKS as usize][..]);
                        }
                    }
                    (r, region.as_slice().to_vec())
                })
            })
            .collect();
        for h in hs {
            let (r, got) = h.join().unwrap();
            for slot in 0..RANKS {
                let v = u64::from_le_bytes(got[8 * slot as usize..][..8].try_into().unwrap());
                let want = if slot == r { 0 } else { pattern(slot) };
                assert_eq!(v, want, "{name}: rank {r}, slot {slot}");
            }
        }
    }
}
