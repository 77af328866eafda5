//! The raw C ABI for UD sends (`src/ffi/mlx5/ud.rs`) against the core it
//! wraps: twin queues over twin fake memory, one driven through the C
//! calls, the other through `SendQueue::post_ud` directly, must return the
//! same statuses and hold the same bytes after every call (the core itself
//! reproduces libmlx5's bytes: `tests/golden_ud_srq.rs`). Refused calls
//! change no byte.

#[path = "support/ffi_twins.rs"]
mod ffi_twins;

use std::ptr::{null, NonNull};

use ffi_twins::*;
use rdma_direct::ffi::*;
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::FakeMlx5;
use rdma_direct::{Payload, SendFlags, SendOp, SendWr, Sge};

/// The C side: a fake and a UD send-queue handle over it.
struct CSide {
    f: FakeMlx5,
    sq: Box<rdd_mlx5_sq_storage>,
}

impl CSide {
    fn new(ud: bool) -> CSide {
        let mut f = FakeMlx5::new(geo());
        f.qp_buf.fill(0xa5);
        f.bf.fill(0x5a);
        let mut sq: Box<rdd_mlx5_sq_storage> = zeroed();
        let dv: rdd_mlx5dv_qp = f.dv_qp().into();
        let n = f.sq_wrid.len();
        let wrid = f.sq_wrid.as_mut_ptr().cast::<rdd_mlx5_sq_slot>();
        let init = if ud {
            rdd_mlx5_sq_init_ud
        } else {
            rdd_mlx5_sq_init
        };
        // SAFETY: the fake's memory outlives the handle (both in `CSide`;
        // the handle is finalised in Drop before the fake is freed).
        let st = unsafe { init(&mut *sq, &dv, QPN, &c_caps(), 0, wrid, n) };
        assert_eq!(st, rdd_status::Ok);
        CSide { f, sq }
    }
}

impl Drop for CSide {
    fn drop(&mut self) {
        // SAFETY: a live handle.
        let _ = unsafe { rdd_mlx5_sq_fini(&mut *self.sq) };
    }
}

/// The core side: the same memory and a core UD queue.
struct CoreSide {
    f: FakeMlx5,
    sq: SendQueue,
}

impl CoreSide {
    fn new() -> CoreSide {
        let mut f = FakeMlx5::new(geo());
        f.qp_buf.fill(0xa5);
        f.bf.fill(0x5a);
        let qp = f.dv_qp();
        let n = f.sq_wrid.len();
        // SAFETY: the fake outlives the queue (both in `CoreSide`).
        let sq = unsafe {
            SendQueue::from_raw_ud(
                &qp,
                QPN,
                caps(),
                SqConfig::default(),
                NonNull::new(f.sq_wrid.as_mut_ptr()).unwrap(),
                n,
            )
        }
        .unwrap();
        CoreSide { f, sq }
    }
}

fn attrs() -> Vec<(AhAttr, rdd_mlx5_ah_attr)> {
    let dgid: [u8; 16] = core::array::from_fn(|i| 0xf0 | i as u8);
    let dmac = [2, 0, 0, 0, 0, 7];
    vec![
        (
            AhAttr {
                link: LinkLayer::InfiniBand,
                dlid: 0x17,
                sl: 3,
                src_path_bits: 5,
                mlx5_rate: 0,
                grh: None,
            },
            rdd_mlx5_ah_attr {
                link_layer: RDD_MLX5_LINK_IB,
                dlid: 0x17,
                sl: 3,
                src_path_bits: 5,
                ..Default::default()
            },
        ),
        (
            AhAttr {
                link: LinkLayer::InfiniBand,
                dlid: 0x2a,
                sl: 15,
                src_path_bits: 0x7f,
                mlx5_rate: 7,
                grh: Some(GlobalRoute {
                    dgid,
                    sgid_index: 2,
                    flow_label: 0xabcde,
                    hop_limit: 64,
                    traffic_class: 0x20,
                }),
            },
            rdd_mlx5_ah_attr {
                link_layer: RDD_MLX5_LINK_IB,
                dlid: 0x2a,
                sl: 15,
                src_path_bits: 0x7f,
                static_rate: 7,
                is_global: 1,
                dgid,
                sgid_index: 2,
                flow_label: 0xabcde,
                hop_limit: 64,
                traffic_class: 0x20,
                ..Default::default()
            },
        ),
        (
            AhAttr {
                link: LinkLayer::RoceV2 { dmac },
                dlid: 0,
                sl: 5,
                src_path_bits: 0,
                mlx5_rate: 0,
                grh: Some(GlobalRoute {
                    dgid,
                    sgid_index: 1,
                    flow_label: 0x12345,
                    hop_limit: 1,
                    traffic_class: 0,
                }),
            },
            rdd_mlx5_ah_attr {
                link_layer: RDD_MLX5_LINK_ROCE_V2,
                sl: 5,
                is_global: 1,
                dgid,
                dmac,
                sgid_index: 1,
                flow_label: 0x12345,
                hop_limit: 1,
                ..Default::default()
            },
        ),
    ]
}

fn av_bytes(av: &Mlx5Av) -> [u8; 48] {
    // SAFETY: 48 bytes of plain integers.
    unsafe { std::mem::transmute(*av) }
}

fn make_av(a: &rdd_mlx5_ah_attr) -> (rdd_status, rdd_mlx5_av) {
    let mut out = rdd_mlx5_av { bytes: [0xee; 48] };
    // SAFETY: live locals.
    let st = unsafe { rdd_mlx5_av_make(a, &mut out) };
    (st, out)
}

#[test]
fn av_make_builds_what_the_core_builds() {
    for (core, c) in attrs() {
        let (st, av) = make_av(&c);
        assert_eq!(st, rdd_status::Ok);
        assert_eq!(av.bytes, av_bytes(&Mlx5Av::new(&core).unwrap()));
    }
    let base = attrs()[2].1;
    let refused = [
        (
            rdd_mlx5_ah_attr {
                link_layer: 9,
                ..base
            },
            rdd_status::InvalidArgument,
        ),
        (
            rdd_mlx5_ah_attr {
                is_global: 2,
                ..base
            },
            rdd_status::InvalidArgument,
        ),
        (
            rdd_mlx5_ah_attr {
                reserved: 1,
                ..base
            },
            rdd_status::InvalidArgument,
        ),
        (
            rdd_mlx5_ah_attr {
                static_rate: 16,
                ..base
            },
            rdd_status::InvalidAttribute,
        ),
        (
            rdd_mlx5_ah_attr {
                is_global: 0,
                ..base
            },
            rdd_status::InvalidAttribute,
        ),
        (
            rdd_mlx5_ah_attr {
                flow_label: 0,
                ..base
            },
            rdd_status::InvalidAttribute,
        ),
        (
            rdd_mlx5_ah_attr {
                flow_label: 1 << 20,
                ..base
            },
            rdd_status::InvalidAttribute,
        ),
    ];
    for (a, want) in refused {
        let (st, av) = make_av(&a);
        assert_eq!(st, want, "{a:?}");
        assert_eq!(av.bytes, [0xee; 48], "a refused build wrote");
    }
    let mut out = rdd_mlx5_av { bytes: [0; 48] };
    // SAFETY: NULL is refused before anything is read or written.
    unsafe {
        assert_eq!(
            rdd_mlx5_av_make(null(), &mut out),
            rdd_status::NullParameter
        );
        assert_eq!(
            rdd_mlx5_av_make(&base, std::ptr::null_mut()),
            rdd_status::NullParameter
        );
    }
}

/// One random UD call, made on both sides.
struct Call {
    kind: u64,
    flags: u32,
    av: usize,
    qpn: u32,
    qkey: u32,
    wr_id: u64,
    sges: Vec<Sge>,
    imm: u32,
    data: Vec<u8>,
}

fn random_call(r: &mut Rng) -> Call {
    let mut flags = match r.below(4) {
        0 => 0,
        1 => RDD_SEND_SIGNALED,
        2 => RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_FENCE,
        _ => RDD_SEND_DEFER_DOORBELL,
    };
    if r.below(20) == 0 {
        flags |= 0x10;
    }
    let nsge = r.below(5) as usize;
    let sges = (0..nsge)
        .map(|k| {
            let len = match r.below(6) {
                0 => 0,
                1 => 1 << 31,
                _ => r.below(5000) as u32,
            };
            Sge::new(0x7f00_0000_0000 + 0x1000 * k as u64, len, 0xc0ffee)
        })
        .collect();
    Call {
        kind: r.below(4),
        flags,
        av: r.below(4) as usize,
        qpn: if r.below(25) == 0 {
            1 << 24
        } else {
            r.below(1 << 24) as u32
        },
        qkey: r.next() as u32,
        wr_id: r.next(),
        sges,
        imm: r.next() as u32,
        data: (0..r.below(70)).map(|i| i as u8 ^ 0x3c).collect(),
    }
}

/// The call through the C ABI.
fn c_call(c: &mut CSide, avs: &[rdd_mlx5_av], x: &Call) -> rdd_status {
    let av: *const rdd_mlx5_av = avs.get(x.av).map_or(null(), |a| a as *const _);
    let s0 = x.sges.first().copied().unwrap_or(Sge::new(0, 0, 0));
    let sq = &mut *c.sq;
    // SAFETY: a live handle; SGE addresses are never dereferenced; `data`
    // is a live buffer of its length.
    unsafe {
        match x.kind {
            0 => rdd_mlx5_sq_send_ud(
                sq, av, x.qpn, x.qkey, x.wr_id, s0.addr, s0.length, s0.lkey, x.flags,
            ),
            1 => rdd_mlx5_sq_send_ud_imm(
                sq, av, x.qpn, x.qkey, x.wr_id, s0.addr, s0.length, s0.lkey, x.imm, x.flags,
            ),
            2 => rdd_mlx5_sq_send_ud_inline(
                sq,
                av,
                x.qpn,
                x.qkey,
                x.wr_id,
                x.data.as_ptr().cast(),
                x.data.len() as u32,
                x.flags,
            ),
            _ => {
                let sg: Vec<rdd_sge> = x
                    .sges
                    .iter()
                    .map(|s| rdd_sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    })
                    .collect();
                let w = rdd_ud_wr {
                    wr: rdd_wr {
                        wr_id: x.wr_id,
                        sg_list: sg.as_ptr(),
                        num_sge: sg.len() as u32,
                        opcode: RDD_WR_SEND_WITH_IMM,
                        flags: x.flags & !RDD_SEND_DEFER_DOORBELL,
                        imm_data: x.imm,
                        remote_addr: 0,
                        rkey: 0,
                        invalidate_rkey: 0,
                        compare_add: 0,
                        swap: 0,
                    },
                    av,
                    remote_qpn: x.qpn,
                    qkey: x.qkey,
                };
                let mut bad = usize::MAX;
                let st = rdd_mlx5_sq_post_ud(sq, &w, 1, &mut bad);
                assert_eq!(bad, if st == rdd_status::Ok { usize::MAX } else { 0 });
                st
            }
        }
    }
}

/// The same call on the core, with the checks the C layer makes before
/// the core sees it (flags, then the address vector).
fn core_call(k: &mut CoreSide, avs: &[Mlx5Av], x: &Call) -> rdd_status {
    let generic = x.kind == 3;
    let per_opcode = RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED;
    let allowed = if x.kind == 2 {
        per_opcode | RDD_SEND_DEFER_DOORBELL | RDD_SEND_INLINE
    } else {
        per_opcode | RDD_SEND_DEFER_DOORBELL
    };
    let bad_flags = if generic {
        x.flags & !RDD_SEND_DEFER_DOORBELL & !SendFlags::ALL.0 != 0
    } else {
        x.flags & !allowed != 0
    };
    if bad_flags {
        return rdd_status::InvalidFlags;
    }
    let Some(av) = avs.get(x.av) else {
        return rdd_status::NullPointer;
    };
    let flags = SendFlags(x.flags & per_opcode);
    let s0 = [x.sges.first().copied().unwrap_or(Sge::new(0, 0, 0))];
    let pieces = [x.data.as_slice()];
    let wr = match x.kind {
        0 => SendWr::new(x.wr_id, SendOp::Send, &s0, flags),
        1 => SendWr::new(x.wr_id, SendOp::SendImm { imm: x.imm }, &s0, flags),
        2 => SendWr::inline(x.wr_id, SendOp::Send, &pieces, flags),
        _ => SendWr {
            wr_id: x.wr_id,
            op: SendOp::SendImm { imm: x.imm },
            payload: Payload::Sges(&x.sges),
            flags,
        },
    };
    let dest = UdDest::new(av, x.qpn, x.qkey);
    // SAFETY: nothing executes the WQEs.
    match unsafe { k.sq.post_ud(&wr, &dest) } {
        Ok(()) => {
            if !generic && x.flags & RDD_SEND_DEFER_DOORBELL == 0 {
                k.sq.ring();
            }
            rdd_status::Ok
        }
        Err(e) => e.into(),
    }
}

#[test]
fn ud_sends_write_what_the_core_writes() {
    let mut r = Rng(0x5eed_0001);
    let core_avs: Vec<Mlx5Av> = attrs()
        .iter()
        .map(|(a, _)| Mlx5Av::new(a).unwrap())
        .collect();
    let c_avs: Vec<rdd_mlx5_av> = attrs().iter().map(|(_, a)| make_av(a).1).collect();
    let mut counts = [0usize; 2];
    for round in 0..40 {
        let mut c = CSide::new(true);
        let mut k = CoreSide::new();
        assert!(memory(&c.f) == memory(&k.f), "round {round}: fresh");
        for step in 0..40 {
            let x = random_call(&mut r);
            let before = memory(&c.f);
            let got = c_call(&mut c, &c_avs, &x);
            let want = core_call(&mut k, &core_avs, &x);
            assert_eq!(got, want, "round {round} step {step}: kind {}", x.kind);
            if got != rdd_status::Ok {
                assert!(memory(&c.f) == before, "a refused call wrote");
            }
            if r.below(8) == 0 {
                // SAFETY: a live handle.
                assert_eq!(unsafe { rdd_mlx5_sq_ring(&mut *c.sq) }, rdd_status::Ok);
                k.sq.ring();
            }
            assert!(
                memory(&c.f) == memory(&k.f),
                "round {round} step {step}: the twins differ"
            );
            counts[(got == rdd_status::Ok) as usize] += 1;
        }
    }
    // Both outcomes were exercised often.
    assert!(counts[0] > 200 && counts[1] > 200, "{counts:?}");
}

#[test]
fn ud_calls_on_the_wrong_queue_or_with_bad_input_write_nothing() {
    let avs: Vec<rdd_mlx5_av> = attrs().iter().map(|(_, a)| make_av(a).1).collect();
    // A UD send on an RC queue: an RC work request cannot carry an AH.
    let mut rc = CSide::new(false);
    let before = memory(&rc.f);
    // SAFETY: a live handle; nothing is dereferenced.
    let st = unsafe { rdd_mlx5_sq_send_ud(&mut *rc.sq, &avs[0], 1, 1, 1, 0x1000, 8, 1, 0) };
    assert_eq!(st, rdd_status::InvalidAttribute);
    assert!(memory(&rc.f) == before);

    let mut ud = CSide::new(true);
    let sq: *mut rdd_mlx5_sq_storage = &mut *ud.sq;
    let before = memory(&ud.f);
    let misaligned = (avs.as_ptr() as *const u8).wrapping_add(4) as *const rdd_mlx5_av;
    // SAFETY: live handle; each call is refused before it dereferences
    // anything it was not given.
    unsafe {
        // RC operations on a UD queue.
        assert_eq!(
            rdd_mlx5_sq_write(sq, 1, 0x1000, 8, 1, 0x2000, 2, 0),
            rdd_status::InvalidAttribute
        );
        assert_eq!(
            rdd_mlx5_sq_send(sq, 1, 0x1000, 8, 1, 0),
            rdd_status::InvalidAttribute
        );
        assert_eq!(
            rdd_mlx5_sq_send_ud(sq, null(), 1, 1, 1, 0x1000, 8, 1, 0),
            rdd_status::NullPointer
        );
        assert_eq!(
            rdd_mlx5_sq_send_ud(sq, misaligned, 1, 1, 1, 0x1000, 8, 1, 0),
            rdd_status::InvalidArgument
        );
        assert_eq!(
            rdd_mlx5_sq_send_ud(sq, &avs[0], 1 << 24, 1, 1, 0x1000, 8, 1, 0),
            rdd_status::InvalidQpn
        );
        assert_eq!(
            rdd_mlx5_sq_send_ud(sq, &avs[0], 1, 1, 1, 0x1000, 8, 1, RDD_SEND_INLINE),
            rdd_status::InvalidFlags
        );
        assert_eq!(
            rdd_mlx5_sq_send_ud_inline(sq, &avs[0], 1, 1, 1, null(), 4, 0),
            rdd_status::NullPointer
        );
        let big = [0u8; 61];
        assert_eq!(
            rdd_mlx5_sq_send_ud_inline(sq, &avs[0], 1, 1, 1, big.as_ptr().cast(), 61, 0),
            rdd_status::InlineTooLarge
        );
        // RDMA and atomics do not exist on UD.
        let sge = rdd_sge {
            addr: 0x1000,
            length: 8,
            lkey: 1,
        };
        for op in [
            RDD_WR_RDMA_WRITE,
            RDD_WR_RDMA_READ,
            RDD_WR_ATOMIC_FETCH_AND_ADD,
            RDD_WR_ATOMIC_CMP_AND_SWP,
        ] {
            let w = rdd_ud_wr {
                wr: rdd_wr {
                    wr_id: 1,
                    sg_list: &sge,
                    num_sge: 1,
                    opcode: op,
                    flags: 0,
                    imm_data: 0,
                    remote_addr: 0x2000,
                    rkey: 2,
                    invalidate_rkey: 0,
                    compare_add: 0,
                    swap: 0,
                },
                av: &avs[0],
                remote_qpn: 1,
                qkey: 1,
            };
            let mut bad = usize::MAX;
            assert_eq!(
                rdd_mlx5_sq_post_ud(sq, &w, 1, &mut bad),
                rdd_status::Unsupported,
                "opcode {op}"
            );
            assert_eq!(bad, 0);
        }
        let mut bad = usize::MAX;
        assert_eq!(
            rdd_mlx5_sq_post_ud(sq, null(), 1, &mut bad),
            rdd_status::NullParameter
        );
        assert_eq!(bad, usize::MAX);
    }
    assert!(memory(&ud.f) == before, "a refused call wrote");
}
