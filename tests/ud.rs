//! Unreliable datagrams on the software device through the Rust API
//! (docs/spec/soft.md §3): delivery, fan-out, drops and their counters,
//! the QP's own Q_Key, the MTU limit, the GRH area, and refused posts.

use rdma_direct::api::*;
use rdma_direct::completion::wc_flags;
use rdma_direct::soft::{SoftConfig, SoftDevice, GRH_BYTES};
use rdma_direct::{Error, Payload, RecvWr, SendFlags, SendOp, SendWr};

type D = SoftDevice;

struct End {
    cq: Cq<D>,
    qp: Qp<D>,
    buf: Mr<D>,
}

fn init() -> QpInit {
    QpInit {
        max_send_wr: 32,
        max_recv_wr: 32,
        ..QpInit::default()
    }
}

fn end(dev: &Device<D>, pd: &Pd<D>, qkey: u32) -> End {
    let cq = dev.create_cq(256).unwrap();
    let mut qp = pd.create_ud_qp(&cq, &cq, &init()).unwrap();
    qp.ready_ud(qkey).unwrap();
    let buf = pd.register(1 << 16, Access::LOCAL_WRITE).unwrap();
    End { cq, qp, buf }
}

fn ah(pd: &Pd<D>) -> Ah<D> {
    pd.create_ah(&AhInit::default()).unwrap()
}

fn recv(e: &mut End, id: u64, off: u32, len: u32) {
    let sge = e.buf.sge(off as usize, len);
    e.qp.post_recv(&[RecvWr {
        wr_id: id,
        sges: &[sge],
    }])
    .unwrap();
}

fn poll_all(e: &mut End) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wc = [Wc::default(); 16];
    loop {
        let n = e.cq.poll(&mut e.qp, &mut wc).unwrap();
        out.extend_from_slice(&wc[..n]);
        if n == 0 {
            return out;
        }
    }
}

fn setup() -> (Device<D>, Pd<D>) {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    (dev, pd)
}

fn inline<'a>(id: u64, op: SendOp, data: &'a [&'a [u8]]) -> SendWr<'a> {
    SendWr {
        wr_id: id,
        op,
        payload: Payload::Inline(data),
        flags: SendFlags::SIGNALED,
    }
}

fn step(dev: &Device<D>) {
    dev.backend().run_until_idle(64);
}

#[test]
fn ping_pong() {
    let (dev, pd) = setup();
    let (mut a, mut b) = (end(&dev, &pd, 0x1111), end(&dev, &pd, 0x1111));
    let ah = ah(&pd);
    for round in 0..8u64 {
        recv(&mut b, round, 0, 128);
        let msg = round.to_le_bytes();
        let pieces: [&[u8]; 1] = [&msg];
        let wr = inline(100 + round, SendOp::SendImm { imm: round as u32 }, &pieces);
        a.qp.post_send_ud(&wr, &ah, b.qp.qpn(), 0x1111).unwrap();
        step(&dev);
        let wa = poll_all(&mut a);
        assert_eq!(wa.len(), 1);
        assert!(wa[0].status.is_ok() && wa[0].wr_id == 100 + round);
        let wb = poll_all(&mut b);
        assert_eq!(wb.len(), 1, "round {round}");
        let w = wb[0];
        assert!(w.status.is_ok());
        assert_eq!(
            (w.wr_id, w.byte_len, w.src_qp),
            (round, 8 + GRH_BYTES, a.qp.qpn())
        );
        assert_eq!(w.imm_data, round as u32);
        assert_eq!(w.wc_flags & wc_flags::GRH, 0);
        assert_ne!(w.wc_flags & wc_flags::WITH_IMM, 0);
        assert_eq!(&b.buf.as_slice()[40..48], &msg);
        // And back.
        std::mem::swap(&mut a, &mut b);
    }
}

#[test]
fn one_sender_many_destinations() {
    let (dev, pd) = setup();
    let mut a = end(&dev, &pd, 7);
    let mut dests: Vec<End> = (0..16).map(|_| end(&dev, &pd, 7)).collect();
    let ah = ah(&pd);
    for d in dests.iter_mut() {
        for k in 0..3 {
            recv(d, k, (k as u32) * 256, 256);
        }
    }
    for k in 0..3u8 {
        for (i, d) in dests.iter().enumerate() {
            let m = [i as u8, k];
            let pieces: [&[u8]; 1] = [&m];
            let wr = inline(u64::from(k), SendOp::Send, &pieces);
            a.qp.post_send_ud(&wr, &ah, d.qp.qpn(), 7).unwrap();
        }
        step(&dev);
        assert_eq!(poll_all(&mut a).len(), 16);
    }
    for (i, d) in dests.iter_mut().enumerate() {
        let w = poll_all(d);
        assert_eq!(w.len(), 3, "dest {i}");
        for (k, w) in w.iter().enumerate() {
            assert!(w.status.is_ok());
            assert_eq!((w.wr_id, w.src_qp, w.byte_len), (k as u64, a.qp.qpn(), 42));
            let o = k * 256 + 40;
            assert_eq!(&d.buf.as_slice()[o..o + 2], &[i as u8, k as u8]);
        }
    }
    assert_eq!(dev.backend().ud_drops().total(), 0);
}

#[test]
fn drops_are_counted_and_consume_nothing() {
    let (dev, pd) = setup();
    let mut a = end(&dev, &pd, 5);
    let mut b = end(&dev, &pd, 5);
    let ah = ah(&pd);
    recv(&mut b, 1, 0, 128);
    // Wrong qkey.
    a.qp.post_send_ud(&inline(1, SendOp::Send, &[b"x"]), &ah, b.qp.qpn(), 6)
        .unwrap();
    // No such QP.
    a.qp.post_send_ud(&inline(2, SendOp::Send, &[b"y"]), &ah, 0xabcd, 5)
        .unwrap();
    step(&dev);
    let wa = poll_all(&mut a);
    assert_eq!(wa.len(), 2);
    assert!(wa.iter().all(|w| w.status.is_ok()));
    let d = dev.backend().ud_drops();
    assert_eq!((d.bad_qkey, d.no_qp, d.total()), (1, 1, 2));
    assert!(poll_all(&mut b).is_empty());
    assert_eq!(b.buf.as_slice()[40], 0);
    // The receive is still there for the right qkey; an RC QP as the
    // destination drops (not UD).
    let rc = pd.create_qp(&b.cq, &b.cq, &init()).unwrap();
    a.qp.post_send_ud(&inline(3, SendOp::Send, &[b"z"]), &ah, rc.qpn(), 5)
        .unwrap();
    a.qp.post_send_ud(&inline(4, SendOp::Send, &[b"w"]), &ah, b.qp.qpn(), 5)
        .unwrap();
    step(&dev);
    assert_eq!(poll_all(&mut a).len(), 2);
    let wb = poll_all(&mut b);
    assert_eq!(wb.len(), 1);
    assert_eq!(wb[0].wr_id, 1);
    assert_eq!(b.buf.as_slice()[40], b'w');
    assert_eq!(dev.backend().ud_drops().not_ud, 1);
    // No receive left: dropped, counted.
    a.qp.post_send_ud(&inline(5, SendOp::Send, &[b"v"]), &ah, b.qp.qpn(), 5)
        .unwrap();
    step(&dev);
    assert_eq!(poll_all(&mut a).len(), 1);
    assert_eq!(dev.backend().ud_drops().no_receive, 1);
    drop(rc);
}

#[test]
fn own_qkey_and_grh_layout() {
    let cfg = SoftConfig {
        gid: [0x11; 16],
        ..SoftConfig::default()
    };
    let dev = Device::new(SoftDevice::new(cfg));
    let pd = dev.alloc_pd().unwrap();
    let mut a = end(&dev, &pd, 0x42);
    let mut b = end(&dev, &pd, 0x42);
    let gah = pd
        .create_ah(&AhInit {
            port_num: 1,
            dest: AddressVector {
                is_global: true,
                dgid: [0x22; 16],
                hop_limit: 9,
                traffic_class: 0x30,
                flow_label: 0x12345,
                sl: 3,
                ..AddressVector::default()
            },
        })
        .unwrap();
    assert!(gah.is_global());
    b.buf.as_mut_slice()[..40].fill(0xee);
    recv(&mut b, 1, 0, 100);
    a.qp.post_send_ud(
        &inline(1, SendOp::Send, &[b"hello"]),
        &gah,
        b.qp.qpn(),
        OWN_QKEY,
    )
    .unwrap();
    step(&dev);
    assert_eq!(poll_all(&mut a).len(), 1);
    let w = poll_all(&mut b);
    assert_eq!(w.len(), 1);
    assert_ne!(w[0].wc_flags & wc_flags::GRH, 0);
    assert_eq!((w[0].sl, w[0].byte_len), (3, 45));
    let g = &b.buf.as_slice()[..40];
    assert_eq!(
        u32::from_be_bytes(g[0..4].try_into().unwrap()),
        6 << 28 | 0x30 << 20 | 0x12345
    );
    // BTH + DETH + 5 bytes padded to 8 + ICRC.
    assert_eq!(u16::from_be_bytes([g[4], g[5]]), 12 + 8 + 8 + 4);
    assert_eq!((g[6], g[7]), (0x1b, 9));
    assert_eq!(&g[8..24], &[0x11; 16]);
    assert_eq!(&g[24..40], &[0x22; 16]);
    assert_eq!(&b.buf.as_slice()[40..45], b"hello");
    // Without a global route the area is left as it was.
    b.buf.as_mut_slice()[..40].fill(0xee);
    recv(&mut b, 2, 0, 100);
    a.qp.post_send_ud(
        &inline(2, SendOp::Send, &[b"again"]),
        &ah(&pd),
        b.qp.qpn(),
        OWN_QKEY,
    )
    .unwrap();
    step(&dev);
    let w = poll_all(&mut b);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].wc_flags & wc_flags::GRH, 0);
    assert!(b.buf.as_slice()[..40].iter().all(|&x| x == 0xee));
    assert_eq!(&b.buf.as_slice()[40..45], b"again");
    assert_eq!(dev.backend().ud_drops().total(), 0);
}

#[test]
fn mtu_limit_and_bad_inputs_write_nothing() {
    let cfg = SoftConfig {
        mtu: 1024,
        ..SoftConfig::default()
    };
    let dev = Device::new(SoftDevice::new(cfg));
    let pd = dev.alloc_pd().unwrap();
    let mut a = end(&dev, &pd, 1);
    let b = end(&dev, &pd, 1);
    let ah = ah(&pd);
    let space = a.qp.send_space();
    let big = [a.buf.sge(0, 1025)];
    let wr = SendWr::new(1, SendOp::Send, &big, SendFlags::SIGNALED);
    assert_eq!(
        a.qp.post_send_ud(&wr, &ah, b.qp.qpn(), 1),
        Err(Error::ExceedsMtu)
    );
    // RC post paths on a UD QP: no address handle.
    assert_eq!(
        a.qp.post_send_one(&inline(2, SendOp::Send, &[b"x"])),
        Err(Error::InvalidAttribute)
    );
    // RDMA and atomics on UD.
    let rd = SendWr::new(
        3,
        SendOp::Write {
            remote: rdma_direct::wr::Remote { addr: 0, rkey: 1 },
        },
        &[],
        SendFlags::SIGNALED,
    );
    assert_eq!(
        a.qp.post_send_ud(&rd, &ah, b.qp.qpn(), 1),
        Err(Error::Unsupported)
    );
    // An address handle on an RC QP.
    let mut rc = pd.create_qp(&a.cq, &a.cq, &init()).unwrap();
    assert_eq!(
        rc.post_send_ud(&inline(4, SendOp::Send, &[b"x"]), &ah, b.qp.qpn(), 1),
        Err(Error::InvalidAttribute)
    );
    assert_eq!(rc.ready_ud(1), Err(Error::InvalidAttribute));
    // UD post before ready.
    let mut c = pd.create_ud_qp(&a.cq, &a.cq, &init()).unwrap();
    assert_eq!(
        c.post_send_ud(&inline(5, SendOp::Send, &[b"x"]), &ah, b.qp.qpn(), 1),
        Err(Error::InvalidQpState)
    );
    assert_eq!(c.ready_ud(0x8000_0001), Err(Error::InvalidAttribute));
    assert_eq!(c.state(), QpState::Reset);
    c.ready_ud(1).unwrap();
    assert_eq!(c.ready_ud(1), Err(Error::InvalidQpState));
    // A UD QP connects to nothing.
    assert_eq!(
        a.qp.connect(&b.qp.info(), &ConnectAttr::default()),
        Err(Error::InvalidAttribute)
    );
    // Nothing was written and nothing completes.
    assert_eq!(a.qp.send_space(), space);
    step(&dev);
    assert!(poll_all(&mut a).is_empty());
    assert_eq!(dev.backend().ud_drops().total(), 0);
    // Exactly the MTU goes through.
    let mut b = b;
    recv(&mut b, 9, 0, 1024 + 40);
    let ok = [a.buf.sge(0, 1024)];
    let wr = SendWr::new(6, SendOp::Send, &ok, SendFlags::SIGNALED);
    a.qp.post_send_ud(&wr, &ah, b.qp.qpn(), 1).unwrap();
    step(&dev);
    assert_eq!(poll_all(&mut a).len(), 1);
    assert_eq!(poll_all(&mut b)[0].byte_len, 1024 + 40);
    drop((rc, c));
}

#[test]
fn receive_shorter_than_grh_plus_payload_fails_the_receive() {
    let (dev, pd) = setup();
    let mut a = end(&dev, &pd, 1);
    let mut b = end(&dev, &pd, 1);
    recv(&mut b, 1, 0, 44);
    a.qp.post_send_ud(
        &inline(1, SendOp::Send, &[b"12345"]),
        &ah(&pd),
        b.qp.qpn(),
        1,
    )
    .unwrap();
    step(&dev);
    let wa = poll_all(&mut a);
    assert!(wa.len() == 1 && wa[0].status.is_ok());
    let wb = poll_all(&mut b);
    assert_eq!(wb[0].status, WcStatus::LOC_LEN_ERR);
    assert_eq!(&b.buf.as_slice()[40..44], &[0; 4]);
}

#[test]
fn ud_receives_from_an_srq() {
    let (dev, pd) = setup();
    let mut a = end(&dev, &pd, 3);
    let mut srq = pd.create_srq(8, 1).unwrap();
    let cq = dev.create_cq(256).unwrap();
    let mut b = pd
        .create_ud_qp(
            &cq,
            &cq,
            &QpInit {
                srq: Some(srq.id()),
                ..init()
            },
        )
        .unwrap();
    b.ready_ud(3).unwrap();
    let buf = pd.register(256, Access::LOCAL_WRITE).unwrap();
    srq.post_recv(&[RecvWr {
        wr_id: 77,
        sges: &[buf.sge(0, 256)],
    }])
    .unwrap();
    a.qp.post_send_ud(&inline(1, SendOp::Send, &[b"srq"]), &ah(&pd), b.qpn(), 3)
        .unwrap();
    step(&dev);
    assert_eq!(poll_all(&mut a).len(), 1);
    let mut wc = [Wc::default(); 4];
    let mut cq = cq;
    let n = cq.poll(&mut srq.route(&mut b), &mut wc).unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].src_qp, wc[0].byte_len),
        (77, a.qp.qpn(), 43)
    );
    assert_eq!(&buf.as_slice()[40..43], b"srq");
    drop(b);
}
