//! `wqe_one` (lean): one send WR encoded into a ring at any slot (any start
//! counter, so any index, wrap and BB boundary), decoded back by the
//! independent test decoder (`testutil::decode_wqe`) and compared.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! geo      u8   bits 0-2: log2 SQ BBs (% 7 -> 1..64, raised to fit the
//!               largest WQE of the caps), bit 3: sig_all, bit 4: post_one
//!               (post and ring) instead of post
//! sge      u8   max_send_sge = 1 + sge % 16
//! inline   u8   max_inline_data = inline % 256
//! seed     u8   unused (the fill pattern follows pi and geo)
//! qpn      u32  masked to 24 bits
//! pi       u32  the start counter (`reset_counters`)
//! WR            send::read_wr
//! ```
//!
//! Checked: a WR is accepted exactly when it breaks no rule
//! (`send::violations`, an independent model) and a rejection names one
//! it breaks and changes no byte of the QP buffer; an accepted WR decodes
//! at slot `pi & mask` to exactly what was asked (opcode, index
//! `pi & 0xffff`, QPN, DS, `fm_ce_se`, immediate, remote, atomic operands,
//! SGEs, inline bytes), the producer moves by its BBs, and no byte outside
//! its BBs changes (RQ region, other ring BBs, GUARD bytes): one pass over
//! the buffer, skipping the WQE's range.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use rdma_direct::provider::mlx5::{QpState, SqConfig};
use rdma_direct::testutil::{decode_wqe, FakeGeometry, FakeMlx5};
use rdma_direct::{QpCaps, SendFlags};
use rdma_direct_fuzz::send::{self, ctrl};
use rdma_direct_fuzz::{pattern, Bytes};

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let geo = r.u8();
    let caps = QpCaps {
        max_send_sge: 1 + (r.u8() % 16) as u32,
        max_inline_data: (r.u8()) as u32,
        max_recv_sge: 1,
    };
    let _seed = r.u8();
    let qpn = r.u32() & 0x00ff_ffff;
    let pi = r.u32();
    let w = send::read_wr(&mut r);

    let need = send::max_wqe_ds(&caps).div_ceil(4).next_power_of_two();
    let cnt = (1u32 << ((geo & 7) % 7)).max(need);
    let sig_all = geo & 0x08 != 0;
    FAKES.with_borrow_mut(|fakes| {
        let (f, pristine) = fakes[cnt.trailing_zeros() as usize].get_or_insert_with(|| {
            let mut f = FakeMlx5::new(FakeGeometry {
                sq_wqe_cnt: cnt,
                rq_wqe_cnt: 1,
                rq_stride: 16,
                bf_size: 64,
                cqe_cnt: 1,
                cqe_size: 64,
                qpn: 0,
                cqn: 1,
            });
            pattern::fill(f.qp_buf.bytes_mut(), cnt as u8);
            let pristine = f.qp_buf.bytes().to_vec();
            (f, pristine)
        });
        f.geo.qpn = qpn;
        one(f, pristine, &w, caps, geo, pi, cnt, sig_all);
    });
});

thread_local! {
    /// Fake queue memory per ring size (1..64 BBs), filled with a pattern
    /// once and reused by every input (each builds a new queue), with a
    /// copy of that pattern: an input compares only the bytes outside its
    /// WQE with the copy and then restores the WQE's bytes, so no input
    /// pays for a fill or a whole-buffer scan.
    #[allow(clippy::type_complexity)]
    static FAKES: RefCell<[Option<(FakeMlx5, Vec<u8>)>; 7]> = RefCell::new(Default::default());
}

/// Posts `w` on a new queue over `f` at counter `pi` and checks it; `f`'s
/// QP buffer holds `before` on entry and on return.
#[allow(clippy::too_many_arguments)]
fn one(
    f: &mut FakeMlx5,
    before: &[u8],
    w: &send::WrSpec,
    caps: QpCaps,
    geo: u8,
    pi: u32,
    cnt: u32,
    sig_all: bool,
) {
    let qpn = f.geo.qpn;
    let cfg = SqConfig {
        sig_all,
        ..SqConfig::default()
    };
    let mut sq = f.send_queue(caps, cfg).expect("geometry fits the caps");
    sq.reset_counters(pi);

    let v = send::violations(w, &caps, QpState::Rts, 0, cnt);
    // SAFETY: no device reads the SGE addresses.
    let got = w.with_wr(|wr| unsafe {
        if geo & 0x10 != 0 {
            sq.post_one(wr)
        } else {
            sq.post(wr)
        }
    });
    if let Err(e) = got {
        assert!(v.contains(&e), "{w:?}: {e:?}, breaks only {v:?}");
        assert_eq!(sq.producer(), pi, "refused WR moved the producer");
        assert!(f.qp_buf.bytes() == before, "refused WR wrote the buffer");
        return;
    }
    assert!(v.is_empty(), "{w:?} accepted, breaks {v:?}");
    let nbb = send::nbb(w);
    assert_eq!(sq.producer(), pi.wrapping_add(nbb), "producer");
    let mask = cnt - 1;
    let d = decode_wqe(f.sq_bytes(), pi & mask)
        .unwrap_or_else(|e| panic!("accepted {w:?} does not decode: {e:?}"));
    let (opcode, _) = send::opcode_and_hdr(&w.op);
    assert_eq!(d.opcode, opcode, "opcode of {w:?}");
    assert_eq!(d.opmod, 0, "opmod");
    assert_eq!(d.wqe_index, pi as u16, "wqe index");
    assert_eq!(d.qpn, qpn, "qpn");
    assert_eq!(d.ds, send::ds(w), "ds of {w:?}");
    let mut fm_ce_se = 0;
    // A post_one may add a CQE request to the WQE it rings (the signal
    // guard); a plain post writes exactly the asked flags.
    let asked = w.flags.contains(SendFlags::SIGNALED) || sig_all;
    if asked {
        fm_ce_se |= ctrl::CQ_UPDATE;
    }
    if w.flags.contains(SendFlags::SOLICITED) {
        fm_ce_se |= ctrl::SOLICITED;
    }
    if w.flags.contains(SendFlags::FENCE) {
        fm_ce_se |= ctrl::FENCE;
    }
    if geo & 0x10 != 0 && !asked {
        assert!(
            d.fm_ce_se == fm_ce_se || d.fm_ce_se == fm_ce_se | ctrl::CQ_UPDATE,
            "fm_ce_se of {w:?}: {:#x}",
            d.fm_ce_se
        );
    } else {
        assert_eq!(d.fm_ce_se, fm_ce_se, "fm_ce_se of {w:?}");
    }
    send::check_payload(&d, w);
    // Nothing outside the WQE's BBs changed. The WQE covers BBs
    // `pi & mask ..` for `nbb` BBs, wrapping at the ring end: one or two
    // byte ranges of the QP buffer.
    let sq0 = f.sq_offset();
    let first = (pi & mask) as usize;
    let end = first + nbb as usize;
    let mut ranges = [(sq0 + first * 64, sq0 + end.min(cnt as usize) * 64), (0, 0)];
    if end > cnt as usize {
        ranges[1] = (sq0, sq0 + (end - cnt as usize) * 64);
        ranges.swap(0, 1);
    }
    let now = f.qp_buf.bytes();
    let mut at = 0;
    for &(a, b) in ranges.iter().filter(|r| r.1 > r.0) {
        assert!(
            now[at..a] == before[at..a],
            "QP buffer bytes {at}..{a} changed outside the WQE of {w:?}"
        );
        at = b;
    }
    assert!(
        now[at..] == before[at..],
        "QP buffer bytes {at}.. changed outside the WQE of {w:?}"
    );
    // Restore the pattern for the next input.
    for &(a, b) in &ranges {
        f.qp_buf.bytes_mut()[a..b].copy_from_slice(&before[a..b]);
    }
}
