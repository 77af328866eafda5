//! UD send WQEs and the SRQ where the golden vectors are silent: every
//! ring slot and the wrap, every refusal (nothing written), the address
//! vector's rules, the SRQ free list against an independent model of
//! libmlx5's algorithm (docs/spec/mlx5.md §11) over many rounds of
//! out-of-order completions, and untrusted completion indexes.

use std::ptr::NonNull;

use rdma_direct::provider::mlx5::cq::{CqRoute, QpQueues};
use rdma_direct::provider::mlx5::sq::flow_label_to_udp_sport;
use rdma_direct::provider::mlx5::{
    AhAttr, GlobalRoute, LinkLayer, Mlx5Av, QpState, RecvQueue, SendQueue, SqConfig, Srq,
    SrqGeometry, SrqSlot, UdDest, Wc,
};
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct::{Error, QpCaps, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

const FILL: u8 = 0xa5;

fn caps() -> QpCaps {
    QpCaps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: 1,
    }
}

fn ud_fake(cnt: u32) -> FakeMlx5 {
    let mut f = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: cnt,
        qpn: 0x123,
        ..FakeGeometry::default()
    });
    f.qp_buf.fill(FILL);
    f.dbrec.fill(FILL);
    f
}

fn ud_queue(f: &mut FakeMlx5) -> SendQueue {
    let qp = f.dv_qp();
    let len = f.sq_wrid.len();
    // SAFETY: the memory belongs to `f`, which outlives the queue.
    unsafe {
        SendQueue::from_raw_ud(
            &qp,
            f.geo.qpn,
            caps(),
            SqConfig::default(),
            NonNull::new(f.sq_wrid.as_mut_ptr()).unwrap(),
            len,
        )
    }
    .unwrap()
}

fn ib_av() -> Mlx5Av {
    Mlx5Av::new(&AhAttr {
        link: LinkLayer::InfiniBand,
        dlid: 0x4242,
        sl: 9,
        src_path_bits: 0x81,
        mlx5_rate: 3,
        grh: Some(GlobalRoute {
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            sgid_index: 5,
            flow_label: 0xfffff,
            hop_limit: 3,
            traffic_class: 0x11,
        }),
    })
    .unwrap()
}

/// The WQE a UD WR must produce, built here from docs/spec/mlx5.md §3
/// without the encoder: ctrl + AV + data segments or inline.
fn expected_wqe(pi: u32, op: u8, imm: u32, av: &Mlx5Av, payload: &Payload) -> Vec<u8> {
    let mut w = Vec::new();
    let data_ds = match payload {
        Payload::Sges(s) => s.len() as u32,
        // An empty inline payload has no segment at all (as on RC).
        Payload::Inline(d) if d.is_empty() => 0,
        Payload::Inline(d) => (4 + d.len() as u32).div_ceil(16),
    };
    let ds = 4 + data_ds;
    w.extend_from_slice(&((pi & 0xffff) << 8 | op as u32).to_be_bytes());
    w.extend_from_slice(&(0x123u32 << 8 | ds).to_be_bytes());
    w.extend_from_slice(&[0, 0, 0, 0x08]);
    w.extend_from_slice(&imm.to_be_bytes());
    w.extend_from_slice(&0x1111_2222u32.to_be_bytes());
    w.extend_from_slice(&[0; 4]);
    w.extend_from_slice(&(0x00ab_cdefu32 | 0x8000_0000).to_be_bytes());
    w.push(av.stat_rate_sl);
    w.push(av.fl_mlid);
    w.extend_from_slice(&av.rlid.get().to_be_bytes());
    w.extend_from_slice(&[0; 4]);
    w.extend_from_slice(&av.rmac);
    w.push(av.tclass);
    w.push(av.hop_limit);
    w.extend_from_slice(&av.grh_gid_fl.get().to_be_bytes());
    w.extend_from_slice(&av.rgid);
    match payload {
        Payload::Sges(s) => {
            for g in s {
                w.extend_from_slice(&g.length.to_be_bytes());
                w.extend_from_slice(&g.lkey.to_be_bytes());
                w.extend_from_slice(&g.addr.to_be_bytes());
            }
        }
        Payload::Inline(d) if d.is_empty() => {}
        Payload::Inline(d) => {
            w.extend_from_slice(&(d.len() as u32 | 0x8000_0000).to_be_bytes());
            w.extend_from_slice(d);
        }
    }
    w
}

enum Payload {
    Sges(Vec<Sge>),
    Inline(Vec<u8>),
}

#[test]
fn ud_wqe_at_every_slot_and_across_the_wrap() {
    let av = ib_av();
    let shapes = [
        Payload::Sges(vec![Sge::new(0x1000, 77, 0xaa)]),
        Payload::Sges(
            (0..4)
                .map(|i| Sge::new(0x2000 + i, 8 + i as u32, 0xbb))
                .collect(),
        ),
        Payload::Inline((0..16).collect()),
        Payload::Inline((0..60).map(|i| i as u8 ^ 0x3c).collect()),
        Payload::Inline(vec![]),
    ];
    for shape in &shapes {
        for (op, imm) in [(0x0au8, 0u32), (0x0b, 0xdead_beef)] {
            for start in 0..8u32 {
                let mut f = ud_fake(8);
                let mut sq = ud_queue(&mut f);
                sq.reset_counters(start + 8); // a counter that has wrapped once
                let pieces;
                let wr_payload = match shape {
                    Payload::Sges(s) => rdma_direct::Payload::Sges(s),
                    Payload::Inline(d) => {
                        pieces = [d.as_slice()];
                        rdma_direct::Payload::Inline(&pieces)
                    }
                };
                let sop = if op == 0x0b {
                    SendOp::SendImm { imm }
                } else {
                    SendOp::Send
                };
                let wr = SendWr {
                    wr_id: 7,
                    op: sop,
                    payload: wr_payload,
                    flags: SendFlags::SIGNALED,
                };
                let dest = UdDest::new(&av, 0xab_cdef, 0x1111_2222);
                // SAFETY: nothing executes the WQE.
                unsafe { sq.post_ud(&wr, &dest) }.unwrap();
                sq.ring();
                let want = expected_wqe(start + 8, op, imm, &av, shape);
                let nbb = (want.len() as u32).div_ceil(64);
                assert_eq!(sq.producer(), start + 8 + nbb, "start {start}");
                let ring = f.sq_bytes();
                let mut expect = vec![FILL; ring.len()];
                for (i, b) in want.iter().enumerate() {
                    expect[(start as usize * 64 + i) % ring.len()] = *b;
                }
                assert_eq!(ring, &expect[..], "start {start} op {op:#x}");
                assert_eq!(f.dbrec_sq(), (start + 8 + nbb) & 0xffff);
            }
        }
    }
}

#[test]
fn refused_wrs_write_nothing() {
    let av = ib_av();
    let dest = UdDest::with_qp_qkey(&av, 5);
    assert_eq!(dest.qkey, 0x8000_0000);
    let sge = [Sge::new(0x1000, 8, 1)];
    let five = [Sge::new(0x1000, 8, 1); 5];
    let big = [0u8; 61];
    let big_pieces = [&big[..]];
    let remote = Remote::new(0x8000, 9);
    let mut f = ud_fake(8);
    let mut sq = ud_queue(&mut f);
    assert!(sq.is_ud());
    let before = f.qp_buf.bytes().to_vec();
    let db = f.dbrec.bytes().to_vec();
    let check = |sq: &mut SendQueue, f: &FakeMlx5, wr: SendWr<'_>, d: UdDest<'_>, want: Error| {
        let pi = sq.producer();
        // SAFETY: refused before anything is written.
        assert_eq!(unsafe { sq.post_ud(&wr, &d) }, Err(want), "{wr:?}");
        sq.ring();
        assert_eq!(sq.producer(), pi);
        assert_eq!(f.qp_buf.bytes(), &before[..]);
        assert_eq!(f.dbrec.bytes(), &db[..]);
    };
    let nf = SendFlags::NONE;
    for op in [
        SendOp::Write { remote },
        SendOp::WriteImm { remote, imm: 1 },
        SendOp::Read { remote },
        SendOp::CompareSwap {
            remote,
            compare: 1,
            swap: 2,
        },
        SendOp::FetchAdd { remote, add: 1 },
        SendOp::SendInv { rkey: 3 },
        SendOp::Nop,
        SendOp::LocalInv { rkey: 3 },
    ] {
        let sges: &[Sge] = if op.is_atomic() {
            &[Sge::new(0x1000, 8, 1)]
        } else {
            &[]
        };
        check(
            &mut sq,
            &f,
            SendWr::new(1, op, sges, nf),
            dest,
            Error::Unsupported,
        );
    }
    let send = SendWr::new(1, SendOp::Send, &sge, nf);
    check(
        &mut sq,
        &f,
        send,
        UdDest::new(&av, 1 << 24, 1),
        Error::InvalidQpn,
    );
    let wr5 = SendWr::new(1, SendOp::Send, &five, nf);
    check(&mut sq, &f, wr5, dest, Error::TooManySges);
    let inl = SendWr::inline(1, SendOp::Send, &big_pieces, nf);
    check(&mut sq, &f, inl, dest, Error::InlineTooLarge);
    // A WR without an address handle on a UD queue: the RC post and batch.
    // SAFETY: refused before anything is written.
    assert_eq!(unsafe { sq.post(&send) }, Err(Error::InvalidAttribute));
    {
        let mut b = sq.batch();
        // SAFETY: as above.
        assert_eq!(unsafe { b.post(&send) }, Err(Error::InvalidAttribute));
        b.ring();
    }
    assert_eq!(f.qp_buf.bytes(), &before[..]);
    // State: RESET refuses with InvalidQpState, and RTS again keeps the
    // RC paths closed on a UD queue.
    sq.set_state(QpState::Reset);
    check(&mut sq, &f, send, dest, Error::InvalidQpState);
    // SAFETY: as above.
    assert_eq!(unsafe { sq.post(&send) }, Err(Error::InvalidQpState));
    sq.set_state(QpState::Rts);
    // SAFETY: as above.
    assert_eq!(unsafe { sq.post(&send) }, Err(Error::InvalidAttribute));
    // Full ring: 4 two-BB WQEs fill 8 BBs, the fifth is refused.
    for _ in 0..4 {
        // SAFETY: nothing executes the WQEs.
        unsafe { sq.post_ud(&send, &dest) }.unwrap();
    }
    let full = f.qp_buf.bytes().to_vec();
    // SAFETY: refused.
    assert_eq!(unsafe { sq.post_ud(&send, &dest) }, Err(Error::SqFull));
    assert_eq!(f.qp_buf.bytes(), &full[..]);

    // An address handle on an RC queue.
    let mut g = ud_fake(8);
    let mut rc = g.send_queue(caps(), SqConfig::default()).unwrap();
    assert!(!rc.is_ud());
    let rc_before = g.qp_buf.bytes().to_vec();
    // SAFETY: refused before anything is written.
    let r = unsafe { rc.post_ud(&send, &dest) };
    assert_eq!(r, Err(Error::InvalidAttribute));
    assert_eq!(g.qp_buf.bytes(), &rc_before[..]);
    assert_eq!(rc.producer(), 0);
}

#[test]
fn address_vector_rules() {
    let dgid = [9u8; 16];
    let grh = GlobalRoute {
        dgid,
        sgid_index: 1,
        flow_label: 0xabcde,
        hop_limit: 64,
        traffic_class: 2,
    };
    let dmac = [1, 2, 3, 4, 5, 6];
    let base = AhAttr {
        link: LinkLayer::RoceV1 { dmac },
        dlid: 0x77,
        sl: 0xf,
        src_path_bits: 0x7f,
        mlx5_rate: 15,
        grh: Some(grh),
    };
    // RoCE v1: MAC, SL in bits 3..1 (3 bits), no LID, no path bits, no
    // GRH bit; rate in the high nibble.
    let v1 = Mlx5Av::new(&base).unwrap();
    assert_eq!(v1.stat_rate_sl, 0xf0 | 7 << 1);
    assert_eq!((v1.rlid.get(), v1.fl_mlid, v1.rmac), (0, 0, dmac));
    assert_eq!(v1.grh_gid_fl.get(), 1 << 20 | 0xabcde);
    assert_eq!((v1.tclass, v1.hop_limit, v1.rgid), (2, 64, dgid));
    // RoCE v2: the UDP source port from the flow label in rlid.
    let v2 = Mlx5Av::new(&AhAttr {
        link: LinkLayer::RoceV2 { dmac },
        ..base
    })
    .unwrap();
    assert_eq!(v2.rlid.get(), 0xfcf4);
    assert_eq!(flow_label_to_udp_sport(0xabcde), 0xfcf4);
    assert_eq!(flow_label_to_udp_sport(1), 0xc001);
    assert_eq!(flow_label_to_udp_sport(0xfffff), 0xc000 | (0x3fff ^ 0x3f));
    // InfiniBand without a GRH: LID, 4-bit SL, 7 path bits, nothing else.
    let ib = Mlx5Av::new(&AhAttr {
        link: LinkLayer::InfiniBand,
        grh: None,
        ..base
    })
    .unwrap();
    assert_eq!(
        (ib.stat_rate_sl, ib.fl_mlid, ib.rlid.get()),
        (0xff, 0x7f, 0x77)
    );
    assert_eq!(ib.grh_gid_fl.get(), 0);
    let bad = |a: AhAttr| assert_eq!(Mlx5Av::new(&a), Err(Error::InvalidAttribute), "{a:?}");
    bad(AhAttr {
        mlx5_rate: 16,
        ..base
    });
    bad(AhAttr { grh: None, ..base });
    bad(AhAttr {
        grh: Some(GlobalRoute {
            flow_label: 1 << 20,
            ..grh
        }),
        ..base
    });
    bad(AhAttr {
        link: LinkLayer::RoceV2 { dmac },
        grh: Some(GlobalRoute {
            flow_label: 0,
            ..grh
        }),
        ..base
    });
}

// ---------------------------------------------------------------- SRQ

/// libmlx5's SRQ list, modelled from the golden file's header on its own.
struct Model {
    next: Vec<u32>,
    done: Vec<bool>,
    head: u32,
    tail: u32,
    n: u32,
}

impl Model {
    fn new(n: u32) -> Model {
        Model {
            next: (0..n).map(|i| (i + 1) % n).collect(),
            done: vec![false; n as usize],
            head: 0,
            tail: n - 1,
            n,
        }
    }
    /// The slot the next post uses, or None (ENOMEM).
    fn post(&mut self) -> Option<u32> {
        if self.head == self.tail {
            let nx = (self.tail + 1) % self.n;
            if self.done[nx as usize] {
                self.next[self.tail as usize] = nx;
                self.tail = nx;
                self.done[nx as usize] = false;
            } else {
                let run = (self.head + 1..self.n)
                    .find(|&i| self.done[i as usize])
                    .or_else(|| (0..self.head).find(|&i| self.done[i as usize]))?;
                self.next[self.tail as usize] = run;
                let mut end = run;
                self.done[run as usize] = false;
                while end + 1 < self.n && self.done[end as usize + 1] {
                    self.next[end as usize] = end + 1;
                    end += 1;
                    self.done[end as usize] = false;
                }
                self.tail = end;
            }
        }
        let h = self.head;
        self.head = self.next[h as usize];
        Some(h)
    }
}

struct SrqMem {
    buf: AlignedBuf,
    db: AlignedBuf,
    slots: Vec<SrqSlot>,
}

fn srq(n: u32, stride: u32) -> (SrqMem, Srq) {
    let mut m = SrqMem {
        buf: AlignedBuf::new((2 * n * stride) as usize),
        db: AlignedBuf::new(64),
        slots: vec![SrqSlot::default(); n as usize],
    };
    m.buf.fill(FILL);
    let geo = SrqGeometry {
        buf: m.buf.ptr(),
        dbrec: m.db.ptr().cast(),
        stride,
        nwqes: n,
        max: 2 * n,
        srqn: 0x77,
    };
    let len = m.slots.len();
    // SAFETY: the memory lives in `m`, kept with the queue by the caller.
    let q = unsafe { Srq::from_raw(&geo, NonNull::new(m.slots.as_mut_ptr()).unwrap(), len) };
    (m, q.unwrap())
}

fn link(m: &SrqMem, i: u32, stride: u32) -> u32 {
    let b = &m.buf.bytes()[(i * stride) as usize..];
    u16::from_be_bytes([b[2], b[3]]) as u32
}

#[test]
fn srq_free_list_follows_libmlx5_over_many_rounds() {
    for n in [2u32, 4, 8, 16] {
        let stride = 32;
        let (m, mut q) = srq(n, stride);
        let mut model = Model::new(n);
        let mut outstanding: Vec<(u32, u64)> = Vec::new();
        let mut seed = 0x1234_5678u32 ^ n;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        let mut id = 0u64;
        for _round in 0..400 {
            // Post a random number of receives (until the list is short).
            for _ in 0..rnd() % n {
                let want = model.post();
                id += 1;
                let sge = [Sge::new(0x10_0000 + id, id as u32, 0x42)];
                let head = q.head();
                // SAFETY: nothing executes the WQEs.
                let r = unsafe {
                    q.post(&RecvWr {
                        wr_id: id,
                        sges: &sge,
                    })
                };
                match want {
                    Some(slot) => {
                        r.unwrap();
                        assert_eq!(head, slot);
                        let w = &m.buf.bytes()[(slot * stride) as usize..][..32];
                        assert_eq!(&w[16..20], &(id as u32).to_be_bytes());
                        assert_eq!(&w[20..24], &0x42u32.to_be_bytes());
                        assert_eq!(&w[24..32], &(0x10_0000 + id).to_be_bytes());
                        outstanding.push((slot, id));
                    }
                    None => {
                        assert_eq!(r, Err(Error::RqFull));
                        // The model took nothing either.
                        id -= 1;
                    }
                }
                assert_eq!((q.head(), q.tail()), (model.head, model.tail));
            }
            q.ring();
            assert_eq!(
                u32::from_be_bytes(m.db.bytes()[..4].try_into().unwrap()),
                q.counter() as u32
            );
            // Complete a random subset in random order.
            for _ in 0..rnd() % (outstanding.len() as u32 + 1) {
                let k = (rnd() as usize) % outstanding.len();
                let (slot, wr_id) = outstanding.swap_remove(k);
                assert_eq!(q.complete(slot as u16), Ok(wr_id));
                model.done[slot as usize] = true;
                // A second completion of the same WQE is corrupt.
                assert_eq!(q.complete(slot as u16), Err(Error::CqeCorrupt));
            }
            for i in 0..n {
                assert_eq!(
                    link(&m, i, stride),
                    model.next[i as usize],
                    "n {n} slot {i}"
                );
                let done = q.slot_state(i).unwrap().state == SrqSlot::COMPLETED;
                assert_eq!(done, model.done[i as usize]);
            }
            // The wait queue's links are never changed.
            for i in n..2 * n {
                assert_eq!(link(&m, i, stride), if i == 2 * n - 1 { 0 } else { i + 1 });
            }
        }
    }
}

#[test]
fn srq_untrusted_indexes_and_full_list() {
    let n = 8;
    let (m, mut q) = srq(n, 64);
    assert_eq!(q.max_gs(), 3);
    let sge = [Sge::new(0x1000, 0, 7)]; // zero length: written as is
    for i in 0..n - 1 {
        // SAFETY: nothing executes the WQEs.
        unsafe {
            q.post(&RecvWr {
                wr_id: i as u64,
                sges: &sge,
            })
        }
        .unwrap();
    }
    let w0 = &m.buf.bytes()[..64];
    assert_eq!(&w0[16..20], &[0, 0, 0, 0]);
    assert_eq!(
        &w0[32..48],
        &[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(&w0[48..64], &[FILL; 16]);
    // Only the tail is left: full.
    let before = m.buf.bytes().to_vec();
    let state: Vec<_> = (0..n).map(|i| q.slot_state(i)).collect();
    let wr = RecvWr {
        wr_id: 9,
        sges: &sge,
    };
    // SAFETY: refused before anything is written.
    let r = unsafe { q.post(&wr) };
    assert_eq!(r, Err(Error::RqFull));
    let four = [Sge::new(0, 1, 1); 4];
    let wr = RecvWr {
        wr_id: 9,
        sges: &four,
    };
    // SAFETY: refused before anything is written.
    let r = unsafe { q.post(&wr) };
    assert_eq!(r, Err(Error::TooManySges));
    for bad in [7u16, 8, 15, 16, 0x7fff, 0xffff] {
        // 7 is the tail (never posted); 8.. are outside the list.
        assert_eq!(q.complete(bad), Err(Error::CqeCorrupt), "index {bad}");
    }
    assert_eq!(m.buf.bytes(), &before[..]);
    assert_eq!((0..n).map(|i| q.slot_state(i)).collect::<Vec<_>>(), state);
    // Completion in reverse order frees the list again.
    for i in (0..n - 1).rev() {
        assert_eq!(q.complete(i as u16), Ok(i as u64));
    }
    // SAFETY: nothing executes the WQE.
    unsafe {
        q.post(&RecvWr {
            wr_id: 20,
            sges: &sge,
        })
    }
    .unwrap();
    assert_eq!(q.head(), 0);
}

/// An SRQ completion whose counter names no outstanding WQE is reported as
/// corrupt by the poller, and the SRQ is unchanged.
#[test]
fn poll_rejects_corrupt_srq_counters() {
    struct R {
        sq: SendQueue,
        rq: RecvQueue,
        srq: Srq,
    }
    impl CqRoute for R {
        fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
            (qpn == self.sq.qpn()).then_some(QpQueues {
                sq: &mut self.sq,
                rq: &mut self.rq,
            })
        }
        fn srq_for(&mut self, _qpn: u32, srqn: u32) -> Option<&mut Srq> {
            (srqn == self.srq.srqn()).then_some(&mut self.srq)
        }
    }
    let mut f = ud_fake(8);
    let (_m, mut s) = srq(4, 32);
    let sge = [Sge::new(0x1000, 64, 7)];
    // SAFETY: nothing executes the WQE.
    unsafe {
        s.post(&RecvWr {
            wr_id: 0xaa,
            sges: &sge,
        })
    }
    .unwrap();
    let sq = ud_queue(&mut f);
    let rq = f.recv_queue(caps()).unwrap();
    let mut cq = f.completion_queue().unwrap();
    let mut r = R { sq, rq, srq: s };
    let cqe = |counter: u16, op: u8| {
        let mut c = [0u8; 64];
        c[32..36].copy_from_slice(&0x77u32.to_be_bytes());
        c[56..60].copy_from_slice(&0x123u32.to_be_bytes());
        c[60..62].copy_from_slice(&counter.to_be_bytes());
        c[63] = op;
        c
    };
    let mut wc = [Wc::default(); 2];
    for (i, bad) in [1u16, 4, 0xffff].into_iter().enumerate() {
        f.write_cqe(i as u32, &cqe(bad, 0x20));
        assert_eq!(
            cq.poll(&mut r, &mut wc),
            Err(Error::CqeCorrupt),
            "counter {bad}"
        );
        assert_eq!(wc, [Wc::default(); 2]);
    }
    f.write_cqe(3, &cqe(0, 0x20));
    assert_eq!(cq.poll(&mut r, &mut wc), Ok(1));
    assert_eq!((wc[0].wr_id, wc[0].qp_num), (0xaa, 0x123));
    // The same WQE again: no longer outstanding.
    f.write_cqe(4, &cqe(0, 0x20));
    assert_eq!(cq.poll(&mut r, &mut wc[1..]), Err(Error::CqeCorrupt));
    assert_eq!(r.srq.slot_state(0).unwrap().state, SrqSlot::COMPLETED);
}
