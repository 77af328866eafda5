//! The shared body of `wr_check` and `wr_agree` (input format and checks
//! in `wr_check.rs`).

use std::cell::RefCell;

use rdma_direct::ffi::{
    rdd_mlx5_sq_fini, rdd_mlx5_sq_init, rdd_mlx5_sq_post, rdd_mlx5_sq_post_ring, rdd_mlx5_sq_slot,
    rdd_mlx5_sq_storage, rdd_mlx5dv_qp, rdd_qp_caps, rdd_sge, rdd_status, rdd_wr, rdd_wr_check,
    RDD_SEND_INLINE, RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_SEND_WITH_IMM,
};
use rdma_direct::provider::mlx5::{SendQueue, SqConfig};
use rdma_direct::testutil::{FakeGeometry, FakeMlx5};
use rdma_direct::{Error, Payload, PostError, QpCaps, Remote, SendFlags, SendOp, SendWr, Sge};
use rdma_direct_fuzz::rules::{self, ListMode, Shape, KNOWN_OPS};
use rdma_direct_fuzz::send;
use rdma_direct_fuzz::Bytes;

/// SGE entries backed by memory per C request (more than any accepts).
const BACKED: usize = 64;
/// Inline payload pool.
const POOL: usize = 2048;
static POOL_BYTES: [u8; POOL] = [0xa5; POOL];
/// `out_bad_index` must not be written on success.
const SENTINEL: usize = usize::MAX - 3;

thread_local! {
    /// The fake queue memory, reused by every input (each builds a fresh
    /// queue over it; verdicts do not depend on what earlier inputs left
    /// in the ring), with the C handle's storage: allocating them per
    /// input costs more than the checks.
    static FAKE: RefCell<(FakeMlx5, Box<rdd_mlx5_sq_storage>)> = RefCell::new((
        fake(),
        // SAFETY: all zeroes is a valid (uninitialised) storage.
        unsafe { Box::<rdd_mlx5_sq_storage>::new_zeroed().assume_init() },
    ));
}

fn fake() -> FakeMlx5 {
    FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: 64,
        rq_wqe_cnt: 1,
        rq_stride: 16,
        bf_size: 64,
        cqe_cnt: 1,
        cqe_size: 64,
        qpn: 0x12,
        cqn: 1,
    })
}

/// One C request with its SGE storage.
struct CWr {
    wr: rdd_wr,
    sges: [rdd_sge; BACKED],
    mode: ListMode,
}

fn read_cwr(r: &mut Bytes<'_>) -> CWr {
    let opsel = r.u8();
    let opcode = if opsel < 0xf0 {
        KNOWN_OPS[(opsel % 9) as usize]
    } else {
        r.u32()
    };
    let fsel = r.u8();
    let flags = if fsel & 0x80 != 0 {
        r.u32()
    } else {
        (fsel & 0x0f) as u32
    };
    let mut imm = r.u32();
    if fsel & 0x40 == 0 && opcode != RDD_WR_SEND_WITH_IMM && opcode != RDD_WR_RDMA_WRITE_WITH_IMM {
        imm = 0;
    }
    let mut remote_addr = r.u64();
    if r.u8() & 1 != 0 {
        remote_addr &= !7;
    }
    let lsel = r.u8();
    let mode = match lsel & 3 {
        2 => ListMode::Null,
        3 => ListMode::Misaligned,
        _ => ListMode::Real,
    };
    let c = (lsel >> 2) as u32;
    let num_sge = match c {
        0..=47 => c % 18,
        48..=62 => 56 + c - 48,
        _ => r.u32(),
    };
    let inline = flags & RDD_SEND_INLINE != 0;
    let mut sges = [rdd_sge::default(); BACKED];
    for s in sges.iter_mut().take(num_sge as usize) {
        let mut length = send::read_len(r);
        if inline {
            length %= 1025;
            let amode = r.u8();
            let off = r.u16() as usize % (POOL - length as usize + 1);
            s.addr = if amode & 3 == 0 {
                0
            } else {
                POOL_BYTES[off..].as_ptr() as u64
            };
        } else {
            s.addr = 0x1000;
            s.lkey = r.u8() as u32;
        }
        s.length = length;
    }
    CWr {
        wr: rdd_wr {
            wr_id: 1,
            sg_list: std::ptr::null(),
            num_sge,
            opcode,
            flags,
            imm_data: imm,
            remote_addr,
            rkey: 2,
            invalidate_rkey: 3,
            compare_add: 4,
            swap: 5,
        },
        sges,
        mode,
    }
}

/// The model's verdict on one C request.
fn c_model(c: &CWr, caps: &QpCaps) -> Option<rdd_status> {
    let w = &c.wr;
    let backed = (w.num_sge as usize).min(BACKED);
    let nulls = c.sges[..backed]
        .iter()
        .map(|s| s.length != 0 && s.addr == 0);
    if let Some(s) = rules::c_verdict(w.flags, w.opcode, w.imm_data, c.mode, w.num_sge, nulls) {
        return Some(s);
    }
    let op = rules::c_op(
        w.opcode,
        w.imm_data,
        Remote::new(w.remote_addr, w.rkey),
        w.invalidate_rkey,
        w.compare_add,
        w.swap,
    );
    let entries = &c.sges[..w.num_sge as usize];
    let e = if w.flags & RDD_SEND_INLINE != 0 {
        let mut lens = [0usize; BACKED];
        for (l, s) in lens.iter_mut().zip(entries) {
            *l = s.length as usize;
        }
        rules::typed_verdict(&op, Shape::Inline(&lens[..entries.len()]), caps)
    } else {
        let mut lens = [0u32; BACKED];
        for (l, s) in lens.iter_mut().zip(entries) {
            *l = s.length;
        }
        rules::typed_verdict(&op, Shape::Sges(&lens[..entries.len()]), caps)
    };
    e.map(rdd_status::from)
}

fn c_case(r: &mut Bytes<'_>, caps: &QpCaps, n: usize, other: bool, agree: bool) {
    // On the stack: heap allocations cost more than the checks.
    let mut store: [CWr; 4] = std::array::from_fn(|i| {
        if i < n {
            read_cwr(r)
        } else {
            read_cwr(&mut Bytes::new(&[]))
        }
    });
    let wrs = &mut store[..n];
    for c in wrs.iter_mut() {
        c.wr.sg_list = match c.mode {
            ListMode::Null => std::ptr::null(),
            ListMode::Real => c.sges.as_ptr(),
            ListMode::Misaligned => c.sges.as_ptr().cast::<u8>().wrapping_add(4).cast(),
        };
    }
    let mut arr = [wrs[0].wr; 4];
    for (a, c) in arr.iter_mut().zip(wrs.iter()) {
        *a = c.wr;
    }
    let array = &arr[..n];
    let ccaps = rdd_qp_caps {
        max_send_sge: caps.max_send_sge,
        max_inline_data: caps.max_inline_data,
        max_recv_sge: caps.max_recv_sge,
    };
    let mut bad = SENTINEL;
    // SAFETY: `array` holds `n` requests whose SGE arrays are the CWr
    // storage (BACKED entries, more than any count read before a refusal;
    // NULL and misaligned lists are refused before any read); inline
    // pieces point into POOL_BYTES with their length inside it.
    let got = unsafe { rdd_wr_check(&ccaps, array.as_ptr(), n, &mut bad) };
    if !rules::caps_ok(caps) {
        assert_eq!(got, rdd_status::InvalidGeometry, "caps {caps:?}");
        assert_eq!(bad, SENTINEL, "out_bad_index written for bad caps");
        if agree {
            FAKE.with_borrow_mut(|(f, sq)| {
                let dv: rdd_mlx5dv_qp = f.dv_qp().into();
                let slots = f.sq_wrid.len();
                let wrid = f.sq_wrid.as_mut_ptr().cast::<rdd_mlx5_sq_slot>();
                // SAFETY: as below; the init is expected to fail.
                let s = unsafe { rdd_mlx5_sq_init(&mut **sq, &dv, 0x12, &ccaps, 0, wrid, slots) };
                assert_eq!(s, rdd_status::InvalidGeometry, "init with {caps:?}");
            });
        }
        return;
    }
    if !agree {
        let want = wrs
            .iter()
            .enumerate()
            .find_map(|(i, c)| c_model(c, caps).map(|s| (i, s)));
        match want {
            None => {
                assert_eq!(got, rdd_status::Ok, "check of {:?}", array);
                assert_eq!(bad, SENTINEL, "out_bad_index written on OK");
            }
            Some((i, s)) => {
                assert_eq!(
                    (got, bad),
                    (s, i),
                    "check of WR {i} {:?} SGEs {:?}",
                    wrs[i].wr,
                    &wrs[i].sges[..(wrs[i].wr.num_sge as usize).min(4)]
                );
            }
        }
        return;
    }
    // The real post on a fresh queue with these caps.
    FAKE.with_borrow_mut(|(f, sq)| {
        let dv: rdd_mlx5dv_qp = f.dv_qp().into();
        let slots = f.sq_wrid.len();
        let wrid = f.sq_wrid.as_mut_ptr().cast::<rdd_mlx5_sq_slot>();
        // SAFETY: `dv` describes `f`'s memory and `wrid` its side table,
        // which outlive the handle (fini below).
        let s = unsafe { rdd_mlx5_sq_init(&mut **sq, &dv, 0x12, &ccaps, 0, wrid, slots) };
        assert_eq!(s, rdd_status::Ok, "init with {caps:?}");
        let mut pbad = SENTINEL;
        // SAFETY: as for the check; no device reads the SGE addresses.
        let posted = unsafe {
            if other {
                rdd_mlx5_sq_post_ring(&mut **sq, array.as_ptr(), n, &mut pbad)
            } else {
                rdd_mlx5_sq_post(&mut **sq, array.as_ptr(), n, &mut pbad)
            }
        };
        assert_eq!(
            (posted, pbad),
            (got, bad),
            "post and check disagree on {array:?}"
        );
        // SAFETY: the handle is live.
        let _ = unsafe { rdd_mlx5_sq_fini(&mut **sq) };
    });
}

/// The typed requests' checks against the ordered model.
fn typed_vs_model(wrs: &[SendWr<'_>], caps: &QpCaps, got: &Result<(), PostError>) {
    let mut want = Ok(());
    for (i, w) in wrs.iter().enumerate() {
        let v = typed_model(w, caps);
        assert_eq!(
            SendQueue::check(caps, w),
            v.map_or(Ok(()), Err),
            "check of {w:?}"
        );
        if let (Some(error), Ok(())) = (v, &want) {
            want = Err(PostError { index: i, error });
        }
    }
    assert_eq!(*got, want, "check_list of {wrs:?}");
}

fn typed_model(w: &SendWr<'_>, caps: &QpCaps) -> Option<Error> {
    match w.payload {
        Payload::Sges(s) => {
            let mut lens = [0u32; 16];
            for (l, e) in lens.iter_mut().zip(s) {
                *l = e.length;
            }
            rules::typed_verdict(&w.op, Shape::Sges(&lens[..s.len()]), caps)
        }
        Payload::Inline(p) => {
            let mut lens = [0usize; 16];
            for (l, x) in lens.iter_mut().zip(p) {
                *l = x.len();
            }
            rules::typed_verdict(&w.op, Shape::Inline(&lens[..p.len()]), caps)
        }
    }
}

/// One typed request read in `send::read_wr`'s format without allocating:
/// SGEs in an array, inline pieces borrowed from the input itself.
struct TWr<'a> {
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    inline: bool,
    n: usize,
    sges: [Sge; 15],
    pieces: [&'a [u8]; 15],
}

fn read_twr<'a>(r: &mut Bytes<'a>) -> TWr<'a> {
    let ctl = r.u8();
    let flags = if ctl & 0x20 != 0 {
        SendFlags(r.u32())
    } else {
        SendFlags((r.u8() & 0x0f) as u32)
    };
    let op = send::read_op(r, ctl & 0x0f, ctl & 0x10 != 0);
    let wr_id = r.u64();
    let pl = r.u8();
    let n = (pl & 0x0f) as usize;
    let mut w = TWr {
        wr_id,
        op,
        flags,
        inline: pl & 0x80 != 0,
        n,
        sges: [Sge::default(); 15],
        pieces: [&[]; 15],
    };
    for k in 0..n {
        if w.inline {
            let len = r.u8() as usize;
            w.pieces[k] = r.take(len);
        } else {
            let length = send::read_len(r);
            w.sges[k] = Sge::new(r.u64(), length, r.u32());
        }
    }
    w
}

impl TWr<'_> {
    fn wr(&self) -> SendWr<'_> {
        if self.inline {
            SendWr::inline(self.wr_id, self.op, &self.pieces[..self.n], self.flags)
        } else {
            SendWr::new(self.wr_id, self.op, &self.sges[..self.n], self.flags)
        }
    }
}

fn typed_case(r: &mut Bytes<'_>, caps: &QpCaps, n: usize, other: bool, agree: bool) {
    // On the stack, pieces borrowed from the input: allocations cost more
    // than the checks.
    let store: [TWr<'_>; 4] = std::array::from_fn(|i| {
        if i < n {
            read_twr(r)
        } else {
            read_twr(&mut Bytes::new(&[]))
        }
    });
    let all: [SendWr<'_>; 4] = std::array::from_fn(|i| store[i].wr());
    let wrs = &all[..n];
    let got = SendQueue::check_list(caps, wrs);
    if !rules::caps_ok(caps) {
        assert_eq!(
            got,
            Err(PostError {
                index: 0,
                error: Error::InvalidGeometry
            })
        );
        for wr in wrs {
            assert_eq!(SendQueue::check(caps, wr), Err(Error::InvalidGeometry));
        }
        if agree {
            FAKE.with_borrow_mut(|(f, _)| {
                assert!(
                    f.send_queue(*caps, SqConfig::default()).is_err(),
                    "a queue accepted caps the check refuses: {caps:?}"
                );
            });
        }
        return;
    }
    if !agree {
        typed_vs_model(wrs, caps, &got);
        return;
    }
    FAKE.with_borrow_mut(|(f, _)| {
        let mut sq = f
            .send_queue(*caps, SqConfig::default())
            .expect("a queue for caps the check accepts");
        let posted = if other {
            let mut r = Ok(());
            for (index, wr) in wrs.iter().enumerate() {
                // SAFETY: no device reads the SGE addresses.
                if let Err(error) = unsafe { sq.post(wr) } {
                    r = Err(PostError { index, error });
                    break;
                }
            }
            r
        } else {
            // SAFETY: as above.
            unsafe { sq.post_list(wrs) }
        };
        assert_eq!(posted, got, "post and check disagree on {wrs:?}");
    });
}

/// Runs one input: against the model (`agree` false, the lean `wr_check`)
/// or against the post paths (`agree` true, `wr_agree`).
pub(crate) fn run(data: &[u8], agree: bool) {
    let mut r = Bytes::new(data);
    let caps = QpCaps {
        max_send_sge: (r.u8() % 66) as u32,
        max_inline_data: (r.u16() % 1024) as u32,
        max_recv_sge: 1,
    };
    let mode = r.u8();
    let n = 1 + ((mode >> 1) & 3) as usize;
    let other = mode & 8 != 0;
    if mode & 1 != 0 {
        c_case(&mut r, &caps, n, other, agree);
    } else {
        typed_case(&mut r, &caps, n, other, agree);
    }
}
