//! Least-privilege, revocable exposure on the
//! software device: a peer's READ and WRITE with an exposure's rkey work
//! as granted and no further, and after revocation they fail with a remote
//! access error and leave the memory unchanged, while the region and other
//! peers' exposures keep working.

use rdma_direct::api::{Access, ConnectAttr, Device, Mr, Pd, QpInit, Wc, WcStatus};
use rdma_direct::expose::{ExposureSet, RemoteAccess};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, Remote, SendFlags, SendOp, SendWr};

type Dev = SoftDevice;

/// Runs one RDMA READ or WRITE of 64 bytes from `local` (offset 0) against
/// `remote` on a fresh, connected QP pair (a failed access moves a QP to
/// ERROR, so every attempt gets its own), and returns its status.
fn attempt(
    dev: &Device<Dev>,
    pd: &Pd<Dev>,
    local: &Mr<Dev>,
    remote: Remote,
    write: bool,
) -> WcStatus {
    let mut cq_a = dev.create_cq(16).unwrap();
    let cq_b = dev.create_cq(16).unwrap();
    let init = QpInit {
        max_send_wr: 4,
        max_recv_wr: 4,
        ..QpInit::default()
    };
    let mut a = pd.create_qp(&cq_a, &cq_a, &init).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, &init).unwrap();
    // The QPs allow everything: only the memory's registration decides.
    let attr = ConnectAttr {
        access: Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC,
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).unwrap();
    b.connect(&ia, &attr).unwrap();
    let sge = [local.sge(0, 64)];
    let op = if write {
        SendOp::Write { remote }
    } else {
        SendOp::Read { remote }
    };
    a.post_send(&[SendWr::new(1, op, &sge, SendFlags::SIGNALED)])
        .unwrap();
    dev.backend().run_until_idle(64);
    let mut out = [Wc::default(); 4];
    let n = cq_a.poll(&mut a, &mut out).unwrap();
    assert_eq!(n, 1, "one completion");
    out[0].status
}

fn setup() -> (Device<Dev>, Pd<Dev>, Mr<Dev>, Mr<Dev>) {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    // The owner's region grants no remote access of its own.
    let mut owned = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    for (i, b) in owned.as_mut_slice().iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut peer = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    peer.as_mut_slice().fill(0xee);
    (dev, pd, owned, peer)
}

#[test]
fn exposures_grant_exactly_what_was_asked() {
    let (dev, pd, owned, mut peer) = setup();
    let before = owned.as_slice().to_vec();
    // The region's own rkey: no remote access at all.
    assert_eq!(
        attempt(&dev, &pd, &peer, owned.remote(0), false),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(
        attempt(&dev, &pd, &peer, owned.remote(0), true),
        WcStatus::REM_ACCESS_ERR
    );

    // Read-only: READ works, WRITE is refused and changes nothing.
    let ro = owned.expose(0, 1024, RemoteAccess::Read).unwrap();
    assert_eq!(
        attempt(&dev, &pd, &peer, ro.remote(0), false),
        WcStatus::SUCCESS
    );
    assert_eq!(
        attempt(&dev, &pd, &peer, ro.remote(0), true),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(owned.as_slice(), &before[..]);
    // Only the exposed range: just past its end is refused.
    assert_eq!(
        attempt(&dev, &pd, &peer, ro.remote(1024 - 32), false),
        WcStatus::REM_ACCESS_ERR
    );

    // Write-only: WRITE works, READ is refused.
    let wo = owned.expose(2048, 1024, RemoteAccess::Write).unwrap();
    assert_eq!(
        attempt(&dev, &pd, &peer, wo.remote(0), false),
        WcStatus::REM_ACCESS_ERR
    );
    peer.as_mut_slice()[..64].fill(0xab);
    assert_eq!(
        attempt(&dev, &pd, &peer, wo.remote(0), true),
        WcStatus::SUCCESS
    );
    assert!(owned.as_slice()[2048..2048 + 64].iter().all(|&b| b == 0xab));
    assert_eq!(&owned.as_slice()[..2048], &before[..2048]);

    // Bad ranges are typed errors.
    assert_eq!(
        owned.expose(4000, 200, RemoteAccess::Read).err(),
        Some(Error::InvalidAttribute)
    );
    assert_eq!(
        owned.expose(0, 0, RemoteAccess::Read).err(),
        Some(Error::InvalidAttribute)
    );
}

#[test]
fn revocation_makes_the_old_rkey_useless() {
    let (dev, pd, owned, mut peer) = setup();
    let before = owned.as_slice().to_vec();
    let mut peer1 = owned.expose(0, 4096, RemoteAccess::ReadWrite).unwrap();
    let peer2 = owned.expose(0, 4096, RemoteAccess::ReadWrite).unwrap();
    assert_ne!(peer1.rkey(), peer2.rkey(), "each peer has its own key");
    let old = peer1.remote(512);
    assert_eq!(attempt(&dev, &pd, &peer, old, false), WcStatus::SUCCESS);

    peer1.revoke().unwrap();
    assert!(peer1.is_revoked());
    peer1.revoke().unwrap(); // idempotent
                             // The old key: READ and WRITE fail with a remote access error...
    assert_eq!(
        attempt(&dev, &pd, &peer, old, false),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(
        attempt(&dev, &pd, &peer, old, true),
        WcStatus::REM_ACCESS_ERR
    );
    // ...and the memory is unchanged.
    assert_eq!(owned.as_slice(), &before[..]);
    // The other peer's exposure still works, and so does the region locally.
    peer.as_mut_slice()[..64].fill(0xab);
    assert_eq!(
        attempt(&dev, &pd, &peer, peer2.remote(512), true),
        WcStatus::SUCCESS
    );
    assert!(owned.as_slice()[512..576].iter().all(|&b| b == 0xab));
    assert_eq!(
        attempt(&dev, &pd, &owned, peer2.remote(1024), false),
        WcStatus::SUCCESS
    );
}

#[test]
fn a_disconnected_peer_loses_every_exposure() {
    let (dev, pd, owned, peer) = setup();
    let before = owned.as_slice().to_vec();
    let mut set = ExposureSet::new();
    let r = set.expose(&owned, 0, 1024, RemoteAccess::Read).unwrap();
    let w = set.expose(&owned, 1024, 1024, RemoteAccess::Write).unwrap();
    let (rr, wr) = (set.get(r).unwrap().remote(0), set.get(w).unwrap().remote(0));
    assert_eq!(attempt(&dev, &pd, &peer, rr, false), WcStatus::SUCCESS);
    // The peer's connection ends: revoke everything it was given.
    set.revoke_all().unwrap();
    assert_eq!(
        attempt(&dev, &pd, &peer, rr, false),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(
        attempt(&dev, &pd, &peer, wr, true),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(owned.as_slice(), &before[..]);
    // Dropping an exposure revokes it too.
    let key = {
        let e = owned.expose(0, 64, RemoteAccess::Read).unwrap();
        e.remote(0)
    };
    assert_eq!(
        attempt(&dev, &pd, &peer, key, false),
        WcStatus::REM_ACCESS_ERR
    );
}

/// `Mr::expose_to` on a device without memory windows (the software
/// device) falls back to a registration of its own: no WR is posted, the
/// key works as granted, `invalidate` revokes it at once (no completion to
/// wait for) and a window-only `rebind` is refused with a typed error.
/// A QP of another protection domain is refused up front.
#[test]
fn expose_to_without_windows_falls_back_to_a_registration() {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let mut owned = pd
        .register(4096, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();
    owned.as_mut_slice().fill(0x3c);
    let peer = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let small = QpInit {
        max_send_wr: 4,
        max_recv_wr: 4,
        ..QpInit::default()
    };
    let mut qp = pd.create_qp(&cq, &cq, &small).unwrap();
    let before = owned.as_slice().to_vec();

    let mut e = owned
        .expose_to(&mut qp, 7, SendFlags::SIGNALED, 0, 1024, RemoteAccess::Read)
        .unwrap();
    assert!(!e.is_window(), "the software device has no windows");
    let mut none = [Wc::default(); 2];
    assert_eq!(cq.poll(&mut qp, &mut none).unwrap(), 0, "no WR was posted");
    let key = e.remote(0);
    assert_eq!(attempt(&dev, &pd, &peer, key, false), WcStatus::SUCCESS);
    assert_eq!(
        attempt(&dev, &pd, &peer, key, true),
        WcStatus::REM_ACCESS_ERR,
        "read-only"
    );
    assert_eq!(e.invalidate(&mut qp, 8, SendFlags::SIGNALED), Ok(false));
    assert!(e.is_revoked());
    assert_eq!(
        e.rebind(&mut qp, 9, SendFlags::SIGNALED),
        Err(Error::Unsupported)
    );
    assert_eq!(
        attempt(&dev, &pd, &peer, key, false),
        WcStatus::REM_ACCESS_ERR
    );
    assert_eq!(owned.as_slice(), &before[..]);

    // The set's variant, revoked with the rest.
    let mut set = ExposureSet::new();
    let i = set
        .expose_to(
            &mut qp,
            10,
            SendFlags::NONE,
            &owned,
            0,
            64,
            RemoteAccess::ReadWrite,
        )
        .unwrap();
    let k = set.get(i).unwrap().remote(0);
    assert_eq!(attempt(&dev, &pd, &peer, k, true), WcStatus::SUCCESS);
    set.revoke_all().unwrap();
    assert_eq!(attempt(&dev, &pd, &peer, k, true), WcStatus::REM_ACCESS_ERR);

    // Another PD's QP cannot be given the key.
    let pd2 = dev.alloc_pd().unwrap();
    let mut other = pd2.create_qp(&cq, &cq, &small).unwrap();
    assert!(matches!(
        owned.expose_to(&mut other, 11, SendFlags::NONE, 0, 64, RemoteAccess::Read),
        Err(Error::InvalidAttribute)
    ));
}
