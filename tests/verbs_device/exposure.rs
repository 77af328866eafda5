// Included by tests/verbs_device.rs: exposing memory to a peer. Revoked
// exposures, and type-2 memory windows (bind, invalidate, rebind, revoke).

/// Revocation on a real device: a peer reads and writes
/// through its own exposure's rkey; after `revoke` the old key fails with a
/// remote access error (iWARP: the connection is terminated, as for any bad
/// key) and the memory is unchanged. Also reports whether the device has
/// type-2 memory windows (the faster mechanism: see
/// `memory_window_exposures_on_real_devices`).
#[test]
fn revoked_exposures_fail_on_real_devices() {
    use rdma_direct::expose::RemoteAccess;
    for (name, ip) in devices("revoked_exposures_fail_on_real_devices") {
        let iwarp;
        {
            let mut p = pair(&name, ip, false, &|_, _| {});
            iwarp = p.dev.backend().port().transport == Transport::Iwarp;
            eprintln!(
                "{name}: type-2 memory windows: {}",
                if p.dev.backend().caps().memory_windows {
                    "yes"
                } else {
                    "no"
                }
            );
            let mut owned = p.pd.register(4096, Access::LOCAL_WRITE).unwrap();
            fill(&mut owned, 3);
            let mut land = p.pd.register(4096, Access::LOCAL_WRITE).unwrap();
            let mut e = owned.expose(0, 4096, RemoteAccess::ReadWrite).unwrap();
            // Granted: READ and WRITE work.
            p.a.post_send(&[SendWr::new(
                1,
                SendOp::Read {
                    remote: e.remote(0),
                },
                &[land.sge(0, 128)],
                SendFlags::SIGNALED,
            )])
            .unwrap();
            let w = wait(&mut p.cq_a, &mut p.a, 1);
            assert_eq!(w[0].status, WcStatus::SUCCESS, "{name}");
            assert_eq!(&land.as_slice()[..128], &owned.as_slice()[..128], "{name}");
            land.as_mut_slice()[..64].fill(0x5c);
            p.a.post_send(&[SendWr::new(
                2,
                SendOp::Write {
                    remote: e.remote(1024),
                },
                &[land.sge(0, 64)],
                SendFlags::SIGNALED,
            )])
            .unwrap();
            let w = wait(&mut p.cq_a, &mut p.a, 1);
            assert_eq!(w[0].status, WcStatus::SUCCESS, "{name}");
            let t0 = Instant::now();
            while owned.as_slice()[1024..1088].iter().any(|&b| b != 0x5c) {
                assert!(t0.elapsed() < WAIT, "{name}: WRITE data");
                thread::sleep(Duration::from_millis(1));
            }
            // Revoked: the old key reads nothing.
            let old = e.remote(0);
            e.revoke().unwrap();
            let before = owned.as_slice().to_vec();
            land.as_mut_slice().fill(0);
            p.a.post_send(&[SendWr::new(
                3,
                SendOp::Read { remote: old },
                &[land.sge(0, 128)],
                SendFlags::SIGNALED,
            )])
            .unwrap();
            let w = wait(&mut p.cq_a, &mut p.a, 1);
            assert_ne!(
                w[0].status,
                WcStatus::SUCCESS,
                "{name}: READ with a revoked key"
            );
            if !iwarp {
                assert_eq!(w[0].status, WcStatus::REM_ACCESS_ERR, "{name}");
            }
            assert!(
                land.as_slice()[..128].iter().all(|&b| b == 0),
                "{name}: data read"
            );
            assert_eq!(owned.as_slice(), &before[..], "{name}");
        }
        // And the old key writes nothing (a fresh pair: the first one is in
        // ERROR now).
        let mut p = pair(&name, ip, false, &|_, _| {});
        let mut owned = p.pd.register(4096, Access::LOCAL_WRITE).unwrap();
        fill(&mut owned, 9);
        let mut src = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
        src.as_mut_slice().fill(0x77);
        let mut e = owned.expose(0, 4096, RemoteAccess::Write).unwrap();
        let old = e.remote(0);
        e.revoke().unwrap();
        let before = owned.as_slice().to_vec();
        p.a.post_send(&[SendWr::new(
            4,
            SendOp::Write { remote: old },
            &[src.sge(0, 64)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        let w = wait(&mut p.cq_a, &mut p.a, 1);
        if iwarp {
            // The WRITE completes once on the wire; the responder then
            // terminates the connection.
            p.conns[0]
                .wait_disconnect(WAIT)
                .unwrap_or_else(|e| panic!("{name}: no disconnect after a revoked-key WRITE: {e}"));
        } else {
            assert_eq!(w[0].status, WcStatus::REM_ACCESS_ERR, "{name}");
        }
        assert_eq!(owned.as_slice(), &before[..], "{name}: data changed");
    }
}

/// Type-2 memory windows, the fast revocation path. On
/// rxe (which has them) `Mr::expose_to` binds a window on the responder's
/// QP with a BIND_MW work request: the peer's READ and WRITE through its
/// key work within the granted rights, a read-only window refuses WRITE,
/// LOCAL_INV (`Exposure::invalidate`, a work request, no re-registration)
/// and deallocation (`Exposure::revoke`) both make the key fail with a
/// remote access error and leave the memory unchanged, and `rebind` gives
/// the same window a fresh key while the old one stays dead. On siw (no
/// windows) the same calls fall back to a registration, and that is
/// checked too.
#[test]
fn memory_window_exposures_on_real_devices() {
    use rdma_direct::api::WcOpcode;
    use rdma_direct::expose::RemoteAccess;
    const BIND: Access = Access(Access::LOCAL_WRITE.0 | Access::MW_BIND.0);
    // One RDMA READ (into `land`) or WRITE (from it) of 64 bytes by `a`.
    fn access(p: &mut Pair, land: &Mr<Dev>, remote: Remote, write: bool, id: u64) -> WcStatus {
        let op = if write {
            SendOp::Write { remote }
        } else {
            SendOp::Read { remote }
        };
        p.a.post_send(&[SendWr::new(id, op, &[land.sge(0, 64)], SendFlags::SIGNALED)])
            .unwrap();
        let w = wait(&mut p.cq_a, &mut p.a, 1);
        assert_eq!(w[0].wr_id, id);
        w[0].status
    }
    // Waits for the window WR `id` on `b`'s CQ.
    fn local_done(p: &mut Pair, id: u64, op: WcOpcode, name: &str) {
        let w = wait(&mut p.cq_b, &mut p.b, 1);
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].opcode),
            (id, WcStatus::SUCCESS, op),
            "{name}"
        );
    }
    for (name, ip) in devices("memory_window_exposures_on_real_devices") {
        let mut p = pair(&name, ip, false, &|_, _| {});
        let windows = p.dev.backend().caps().memory_windows;
        eprintln!("{name}: type-2 memory windows: {windows}");
        let mut owned = p.pd.register(4096, BIND).unwrap();
        fill(&mut owned, 5);
        let mut land = p.pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let mut e = owned
            .expose_to(
                &mut p.b,
                100,
                SendFlags::SIGNALED,
                0,
                2048,
                RemoteAccess::ReadWrite,
            )
            .unwrap();
        assert_eq!(e.is_window(), windows, "{name}");
        if !windows {
            // The fallback: a registration, revoked at once.
            assert_eq!(
                access(&mut p, &land, e.remote(0), false, 1),
                WcStatus::SUCCESS
            );
            assert_eq!(&land.as_slice()[..64], &owned.as_slice()[..64], "{name}");
            assert_eq!(e.invalidate(&mut p.b, 101, SendFlags::SIGNALED), Ok(false));
            assert!(e.is_revoked());
            assert_eq!(
                e.rebind(&mut p.b, 102, SendFlags::SIGNALED),
                Err(Error::Unsupported)
            );
            quiet(&mut p.cq_b, &mut p.b);
            continue;
        }
        local_done(&mut p, 100, WcOpcode::BIND_MW, &name);
        // Granted: READ and WRITE through the window.
        assert_eq!(
            access(&mut p, &land, e.remote(0), false, 1),
            WcStatus::SUCCESS
        );
        assert_eq!(&land.as_slice()[..64], &owned.as_slice()[..64], "{name}");
        land.as_mut_slice()[..64].fill(0x5c);
        assert_eq!(
            access(&mut p, &land, e.remote(1024), true, 2),
            WcStatus::SUCCESS
        );
        let t0 = Instant::now();
        while owned.as_slice()[1024..1088].iter().any(|&b| b != 0x5c) {
            assert!(t0.elapsed() < WAIT, "{name}: WRITE data");
            thread::sleep(Duration::from_millis(1));
        }
        // Fast revocation and a fresh key for the same window.
        let first = e.remote(0);
        assert_eq!(e.invalidate(&mut p.b, 101, SendFlags::SIGNALED), Ok(true));
        local_done(&mut p, 101, WcOpcode::LOCAL_INV, &name);
        assert!(e.is_revoked());
        e.rebind(&mut p.b, 102, SendFlags::SIGNALED).unwrap();
        local_done(&mut p, 102, WcOpcode::BIND_MW, &name);
        assert_ne!(e.rkey(), first.rkey, "{name}: a fresh key");
        assert_eq!(e.rkey() >> 8, first.rkey >> 8, "{name}: the same window");
        land.as_mut_slice().fill(0);
        assert_eq!(
            access(&mut p, &land, e.remote(0), false, 3),
            WcStatus::SUCCESS
        );
        assert_eq!(&land.as_slice()[..64], &owned.as_slice()[..64], "{name}");
        // The first key stays dead: the READ fails and reads nothing.
        land.as_mut_slice().fill(0);
        assert_eq!(
            access(&mut p, &land, first, false, 4),
            WcStatus::REM_ACCESS_ERR,
            "{name}: READ with an invalidated key"
        );
        assert!(land.as_slice()[..64].iter().all(|&b| b == 0), "{name}");
        drop(e);

        // An invalidated key writes nothing (a fresh pair: `a` is in ERROR).
        let mut p = pair(&name, ip, false, &|_, _| {});
        let mut owned = p.pd.register(4096, BIND).unwrap();
        fill(&mut owned, 9);
        let mut src = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
        src.as_mut_slice().fill(0x77);
        let mut e = owned
            .expose_to(
                &mut p.b,
                200,
                SendFlags::SIGNALED,
                0,
                4096,
                RemoteAccess::Write,
            )
            .unwrap();
        local_done(&mut p, 200, WcOpcode::BIND_MW, &name);
        assert_eq!(
            access(&mut p, &src, e.remote(64), true, 5),
            WcStatus::SUCCESS
        );
        let t0 = Instant::now();
        while owned.as_slice()[64..128].iter().any(|&b| b != 0x77) {
            assert!(t0.elapsed() < WAIT, "{name}: WRITE data");
            thread::sleep(Duration::from_millis(1));
        }
        let old = e.remote(0);
        assert_eq!(e.invalidate(&mut p.b, 201, SendFlags::SIGNALED), Ok(true));
        local_done(&mut p, 201, WcOpcode::LOCAL_INV, &name);
        let before = owned.as_slice().to_vec();
        assert_eq!(
            access(&mut p, &src, old, true, 6),
            WcStatus::REM_ACCESS_ERR,
            "{name}: WRITE with an invalidated key"
        );
        assert_eq!(owned.as_slice(), &before[..], "{name}: data changed");
        drop(e);

        // Least privilege: a read-only window refuses WRITE.
        let mut p = pair(&name, ip, false, &|_, _| {});
        let mut owned = p.pd.register(4096, BIND).unwrap();
        fill(&mut owned, 13);
        let mut src = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
        src.as_mut_slice().fill(0x11);
        let ro = owned
            .expose_to(
                &mut p.b,
                300,
                SendFlags::SIGNALED,
                0,
                4096,
                RemoteAccess::Read,
            )
            .unwrap();
        local_done(&mut p, 300, WcOpcode::BIND_MW, &name);
        assert_eq!(
            access(&mut p, &src, ro.remote(128), false, 7),
            WcStatus::SUCCESS
        );
        assert_eq!(&src.as_slice()[..64], &owned.as_slice()[128..192], "{name}");
        let before = owned.as_slice().to_vec();
        assert_eq!(
            access(&mut p, &src, ro.remote(0), true, 8),
            WcStatus::REM_ACCESS_ERR,
            "{name}: WRITE through a read-only window"
        );
        assert_eq!(owned.as_slice(), &before[..], "{name}: data changed");
        drop(ro);

        // Revocation without a work request: deallocating the window.
        let mut p = pair(&name, ip, false, &|_, _| {});
        let mut owned = p.pd.register(4096, BIND).unwrap();
        fill(&mut owned, 17);
        let mut land = p.pd.register(64, Access::LOCAL_WRITE).unwrap();
        let mut e = owned
            .expose_to(
                &mut p.b,
                400,
                SendFlags::SIGNALED,
                0,
                4096,
                RemoteAccess::ReadWrite,
            )
            .unwrap();
        local_done(&mut p, 400, WcOpcode::BIND_MW, &name);
        assert_eq!(
            access(&mut p, &land, e.remote(0), false, 9),
            WcStatus::SUCCESS
        );
        let old = e.remote(0);
        e.revoke().unwrap();
        assert_eq!(
            e.rebind(&mut p.b, 401, SendFlags::SIGNALED),
            Err(Error::InvalidAttribute)
        );
        land.as_mut_slice().fill(0);
        let before = owned.as_slice().to_vec();
        assert_eq!(
            access(&mut p, &land, old, false, 10),
            WcStatus::REM_ACCESS_ERR,
            "{name}: READ through a deallocated window"
        );
        assert!(land.as_slice().iter().all(|&b| b == 0), "{name}");
        assert_eq!(owned.as_slice(), &before[..], "{name}");

        // On a QP that is not in RTS a LOCAL_INV would be flushed and the
        // window would stay bound across a RESET: `invalidate` revokes at
        // once instead, and posts nothing. (A fresh pair: the responder of
        // the refused READ above is in ERROR too.)
        let mut p = pair(&name, ip, false, &|_, _| {});
        let owned = p.pd.register(4096, BIND).unwrap();
        let mut e = owned
            .expose_to(
                &mut p.b,
                500,
                SendFlags::SIGNALED,
                0,
                4096,
                RemoteAccess::Read,
            )
            .unwrap();
        local_done(&mut p, 500, WcOpcode::BIND_MW, &name);
        p.b.modify(&QpModify::to(QpState::Error)).unwrap();
        assert_eq!(
            e.invalidate(&mut p.b, 501, SendFlags::SIGNALED),
            Ok(false),
            "{name}"
        );
        assert!(e.is_revoked(), "{name}");
        assert_eq!(
            e.rebind(&mut p.b, 502, SendFlags::SIGNALED),
            Err(Error::InvalidAttribute),
            "{name}: revoked, not invalidated"
        );
    }
}
