// Included by tests/verbs_device.rs: unreliable datagrams. On rxe, on
// both data paths (the verbs fallback, RDMA_DIRECT_DATA_PATH=fallback,
// and the direct rings): a ping-pong between two UD QPs through address
// handles, the 40-byte GRH area at the head of every receive, src_qp,
// SEND_WITH_IMM, inline, OWN_QKEY, a datagram with the wrong Q_Key that
// is never delivered, and the typed refusals. On siw (iWARP has no
// datagrams) and on the mlx5 core path UD is Unsupported (docs/status.md).

const GRH: usize = 40;

#[test]
fn ud_ping_pong_through_address_handles() {
    use rdma_direct::api::{AddressVector, AhInit, QpInit};
    use rdma_direct::completion::wc_flags;
    use rdma_direct::verbs::DataPath;
    for (name, _ip) in devices("ud_ping_pong_through_address_handles") {
        let dev = Device::new(VerbsDevice::open_named(&name).expect("open device"));
        check_data_path(&dev);
        let pd = dev.alloc_pd().unwrap();
        let mut cq_a = dev.create_cq(64).unwrap();
        let mut cq_b = dev.create_cq(64).unwrap();
        let init = QpInit {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
            srq: None,
        };
        let port = dev.backend().port();
        let ah_init = AhInit {
            port_num: 0,
            dest: AddressVector {
                is_global: true,
                dgid: port.gid,
                sgid_index: port.gid_index,
                hop_limit: 64,
                ..AddressVector::default()
            },
        };
        let fallback = dev.backend().data_path() == DataPath::Fallback;
        let mlx5_core = !fallback && dev.backend().caps().direct_mlx5;
        if mlx5_core || port.transport == Transport::Iwarp {
            assert_eq!(
                pd.create_ud_qp(&cq_a, &cq_a, &init).err(),
                Some(Error::Unsupported),
                "{name}"
            );
            assert_eq!(
                pd.create_ah(&ah_init).err(),
                Some(Error::Unsupported),
                "{name}"
            );
            eprintln!("{name}: UD is Unsupported here (fallback {fallback}), as documented");
            continue;
        }
        eprintln!(
            "{name}: UD on the {:?} data path",
            dev.backend().data_path()
        );
        let mut a = pd.create_ud_qp(&cq_a, &cq_a, &init).unwrap();
        let mut b = pd.create_ud_qp(&cq_b, &cq_b, &init).unwrap();
        assert!(a.is_ud());
        let qkey = 0x1111_2222;
        let ah = pd.create_ah(&ah_init).unwrap();
        assert!(ah.is_global());
        let four = [1u8; 4];
        let piece: [&[u8]; 1] = [&four];
        let one = SendWr::inline(9, SendOp::Send, &piece, SendFlags::SIGNALED);
        // Before ready_ud: no sends.
        assert_eq!(
            a.post_send_ud(&one, &ah, b.qpn(), qkey),
            Err(Error::InvalidQpState),
            "{name}"
        );
        // A controlled Q_Key (bit 31) cannot be a QP's own.
        assert_eq!(
            a.ready_ud(rdma_direct::api::OWN_QKEY | 1),
            Err(Error::InvalidAttribute),
            "{name}"
        );
        a.ready_ud(qkey).unwrap();
        b.ready_ud(qkey).unwrap();
        assert_eq!(a.ready_ud(qkey), Err(Error::InvalidQpState));
        // A QP number wider than 24 bits.
        assert_eq!(
            a.post_send_ud(&one, &ah, 1 << 24, qkey),
            Err(Error::InvalidQpn),
            "{name}"
        );
        // An address handle of another PD.
        let pd2 = dev.alloc_pd().unwrap();
        let ah2 = pd2.create_ah(&ah_init).unwrap();
        assert_eq!(
            a.post_send_ud(&one, &ah2, b.qpn(), qkey),
            Err(Error::InvalidAttribute),
            "{name}"
        );
        drop(ah2);

        let mut land_a = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let mut land_b = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        land_a.as_mut_slice().fill(0xee);
        land_b.as_mut_slice().fill(0xee);
        let mut src = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        fill(&mut src, 3);
        b.post_recv(&[RecvWr {
            wr_id: 10,
            sges: &[land_b.sge(0, 1024)],
        }])
        .unwrap();
        a.post_recv(&[RecvWr {
            wr_id: 20,
            sges: &[land_a.sge(0, 1024)],
        }])
        .unwrap();
        // An RC post on a UD QP has no address handle: refused.
        let e = a
            .post_send(&[SendWr::new(
                1,
                SendOp::Send,
                &[src.sge(0, 8)],
                SendFlags::SIGNALED,
            )])
            .unwrap_err();
        assert_eq!(e.error, Error::InvalidAttribute, "{name}");
        // RDMA does not exist on UD.
        let eight = [src.sge(0, 8)];
        let write = SendWr::new(
            1,
            SendOp::Write {
                remote: Remote::new(0, 0),
            },
            &eight,
            SendFlags::SIGNALED,
        );
        assert_eq!(
            a.post_send_ud(&write, &ah, b.qpn(), qkey),
            Err(Error::Unsupported)
        );

        // Ping: a -> b, 200 bytes from registered memory.
        a.post_send_ud(
            &SendWr::new(1, SendOp::Send, &[src.sge(0, 200)], SendFlags::SIGNALED),
            &ah,
            b.qpn(),
            qkey,
        )
        .unwrap();
        let w = wait(&mut cq_a, &mut a, 1);
        assert_eq!(
            (w[0].wr_id, w[0].status),
            (1, WcStatus::SUCCESS),
            "{name}: {w:?}"
        );
        let w = wait(&mut cq_b, &mut b, 1);
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].opcode, w[0].byte_len),
            (10, WcStatus::SUCCESS, WcOpcode::RECV, 200 + GRH as u32),
            "{name}: {w:?}"
        );
        assert_eq!(w[0].src_qp, a.qpn(), "{name}");
        assert_eq!(w[0].qp_num, b.qpn(), "{name}");
        assert_ne!(
            w[0].wc_flags & wc_flags::GRH,
            0,
            "{name}: RoCE datagrams carry a GRH"
        );
        assert_eq!(&land_b.as_slice()[GRH..GRH + 200], &src.as_slice()[..200]);
        assert_eq!(
            land_b.as_slice()[GRH + 200],
            0xee,
            "{name}: wrote past the datagram"
        );

        // Pong: b -> a, inline SEND_WITH_IMM.
        b.post_send_ud(
            &SendWr::inline(
                2,
                SendOp::SendImm { imm: 0x0bad_cafe },
                &[&b"pong, inline"[..]],
                SendFlags::SIGNALED,
            ),
            &ah,
            a.qpn(),
            qkey,
        )
        .unwrap();
        wait(&mut cq_b, &mut b, 1);
        let w = wait(&mut cq_a, &mut a, 1);
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].byte_len, w[0].src_qp),
            (20, WcStatus::SUCCESS, 12 + GRH as u32, b.qpn()),
            "{name}: {w:?}"
        );
        assert_ne!(w[0].wc_flags & wc_flags::WITH_IMM, 0);
        assert_eq!(w[0].imm_data, 0x0bad_cafe);
        assert_eq!(&land_a.as_slice()[GRH..GRH + 12], b"pong, inline");

        // The wrong Q_Key: sent (a datagram completes locally), dropped by
        // b, whose receive stays posted for the next right one.
        b.post_recv(&[RecvWr {
            wr_id: 11,
            sges: &[land_b.sge(1024, 1024)],
        }])
        .unwrap();
        a.post_send_ud(
            &SendWr::inline(3, SendOp::Send, &[&[0x5a; 16][..]], SendFlags::SIGNALED),
            &ah,
            b.qpn(),
            qkey ^ 1,
        )
        .unwrap();
        wait(&mut cq_a, &mut a, 1);
        quiet(&mut cq_b, &mut b);
        // OWN_QKEY: the sender's own Q_Key (the same as b's here).
        a.post_send_ud(
            &SendWr::inline(4, SendOp::Send, &[&[0x77; 16][..]], SendFlags::SIGNALED),
            &ah,
            b.qpn(),
            rdma_direct::api::OWN_QKEY,
        )
        .unwrap();
        wait(&mut cq_a, &mut a, 1);
        let w = wait(&mut cq_b, &mut b, 1);
        assert_eq!(
            (w[0].wr_id, w[0].byte_len),
            (11, 16 + GRH as u32),
            "{name}: {w:?}"
        );
        assert_eq!(&land_b.as_slice()[1024 + GRH..1024 + GRH + 16], &[0x77; 16]);
        drop(ah);
    }
}
