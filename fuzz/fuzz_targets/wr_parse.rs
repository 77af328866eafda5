//! `wr_parse`: arbitrary C work requests (`rdd_wr` + SGE arrays) through the
//! C ABI's validation and formatting into a send ring
//! (`rdd_mlx5_sq_post` / `rdd_mlx5_sq_ring` over `testutil::FakeMlx5`).
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! geo      u8   bits 0-2: log2 SQ BBs (% 7 -> 1..64), bit 3: SIG_ALL,
//!               bits 4-5: 1 BF_NEVER, 2 BF_INLINE_ONLY, bit 6: SHARED_REGISTER
//! bf       u8   bf_size = [0, 64, 128, 256][bf & 3]
//! sge      u8   max_send_sge = 1 + sge % 8
//! inline   u8   max_inline_data = inline % 201
//! seed     u8   fill pattern of the QP buffer and of the inline payload pool
//! qpn      u32  masked to 24 bits
//! ops...        until the input ends (at most MAX_OPS):
//!   op u8 % 8:  0..=4 post one WR, 5 post a batch of 1 + u8 % 4 WRs,
//!               6 ring the doorbell, 7 re-initialise the queue (empty ring)
//! WR:
//!   opsel u8    < 0xf0: one of the nine known opcodes (opsel % 9),
//!               else a raw u32 opcode follows
//!   fsel  u8    bit 7: raw u32 flags follow, else flags = fsel & 0xf;
//!               bit 6: keep a non-zero immediate on any opcode
//!   wr_id u64, imm u32, remote_addr u64, rkey u32, invalidate_rkey u32,
//!   compare_add u64, swap u64
//!   asel  u8    bit 0: align remote_addr to 8 (atomics mostly valid)
//!   lsel  u8    bits 0-1: 0/1 a real SGE array, 2 NULL, 3 misaligned;
//!               bits 2-7 (c): num_sge = c % 18 (c < 48), 56 + c - 48
//!               (48..=62), a raw u32 (63)
//!   per SGE (min(num_sge, 70) of them): length code (send::read_len),
//!     addr u64, lkey u32; for an inline WR the address is replaced: amode
//!     u8 & 3 == 0 -> NULL, else a pointer into the payload pool (offset
//!     u16), with the length cut to 0..=1024 so it stays inside the pool
//! ```
//!
//! Checked for every WR:
//! - the C layer's own rules (flags, opcode, immediate, SGE array pointer,
//!   count and alignment, NULL inline pieces) and the core's rules
//!   (`send::violations`, an independent model) decide acceptance: a WR is
//!   accepted exactly when it breaks none, and a rejection's status is one
//!   of the rules it breaks;
//! - a rejected WR changes no byte of the QP buffer (RQ, ring and GUARD
//!   bytes after it), the doorbell record, the register or the side table,
//!   and the producer index is unchanged; `out_bad_index` names it;
//! - an accepted WR decodes (`testutil::decode_wqe`) to exactly what the
//!   `rdd_wr` asked: opcode, index, QPN, DS, `fm_ce_se`, immediate, remote,
//!   atomic operands, SGEs (zero-length ones skipped), inline bytes; no
//!   byte outside its BBs changed; `out_bad_index` is not written;
//! - a doorbell writes the record (`producer & 0xffff`) and changes no byte
//!   of the QP buffer except making the last WQE request a CQE.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_direct::ffi::{
    rdd_mlx5_sq_fini, rdd_mlx5_sq_init, rdd_mlx5_sq_post, rdd_mlx5_sq_ring, rdd_mlx5_sq_slot,
    rdd_mlx5_sq_storage, rdd_mlx5dv_qp, rdd_qp_caps, rdd_sge, rdd_status, rdd_wr,
    RDD_MLX5_SQ_BF_INLINE_ONLY, RDD_MLX5_SQ_BF_NEVER, RDD_MLX5_SQ_SHARED_REGISTER,
    RDD_MLX5_SQ_SIG_ALL, RDD_SEND_INLINE, RDD_WR_ATOMIC_CMP_AND_SWP, RDD_WR_ATOMIC_FETCH_AND_ADD,
    RDD_WR_MAX_INLINE_SGE, RDD_WR_NOP, RDD_WR_RDMA_READ, RDD_WR_RDMA_WRITE,
    RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_SEND, RDD_WR_SEND_WITH_IMM, RDD_WR_SEND_WITH_INV,
};
use rdma_direct::provider::mlx5::{QpState, WrSlot};
use rdma_direct::testutil::{decode_wqe, FakeGeometry, FakeMlx5, GUARD};
use rdma_direct::{QpCaps, Remote, SendFlags, SendOp, Sge};
use rdma_direct_fuzz::send::{self, ctrl, PayloadSpec, WrSpec};
use rdma_direct_fuzz::{pattern, Bytes};

/// Upper bound on operations per input.
const MAX_OPS: usize = 512;
/// Most SGE entries backed by real memory (more than any WQE holds).
const MAX_BACKED_SGES: usize = 70;
/// Bytes of the inline payload pool.
const POOL: usize = 4096;
/// Longest inline piece the harness builds (keeps pieces inside the pool).
const MAX_PIECE: u32 = 1024;
/// Most SGEs of a non-inline WR the C layer forms a slice for.
const MAX_DS: u32 = 63;
/// `rdd_mlx5_sq_post` must not write `out_bad_index` on success.
const SENTINEL: usize = usize::MAX - 7;

const KNOWN_OPS: [u32; 9] = [
    RDD_WR_RDMA_WRITE,
    RDD_WR_RDMA_WRITE_WITH_IMM,
    RDD_WR_SEND,
    RDD_WR_SEND_WITH_IMM,
    RDD_WR_RDMA_READ,
    RDD_WR_ATOMIC_CMP_AND_SWP,
    RDD_WR_ATOMIC_FETCH_AND_ADD,
    RDD_WR_SEND_WITH_INV,
    RDD_WR_NOP,
];

/// How the WR's `sg_list` pointer is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListMode {
    Real,
    Null,
    Misaligned,
}

/// One C work request and the memory its pointers point into.
struct CWr {
    wr: rdd_wr,
    /// Backing store of the SGE array (u64 words, so a misaligned pointer
    /// can be made inside it); entries are `rdd_sge`-sized.
    sges: Vec<rdd_sge>,
    misaligned_store: Vec<u64>,
    mode: ListMode,
}

impl CWr {
    /// Points `wr.sg_list` at the backing store (after the CWr is in place).
    fn fix_pointer(&mut self) {
        self.wr.sg_list = match self.mode {
            ListMode::Null => std::ptr::null(),
            ListMode::Real => self.sges.as_ptr(),
            ListMode::Misaligned => self
                .misaligned_store
                .as_ptr()
                .cast::<u8>()
                .wrapping_add(4)
                .cast::<rdd_sge>(),
        };
    }
}

/// Reads one C WR. Inline pieces point into `pool`.
fn read_cwr(r: &mut Bytes<'_>, pool: &[u8]) -> CWr {
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
    let wr_id = r.u64();
    let mut imm = r.u32();
    if fsel & 0x40 == 0 && opcode != RDD_WR_SEND_WITH_IMM && opcode != RDD_WR_RDMA_WRITE_WITH_IMM {
        imm = 0;
    }
    let mut remote_addr = r.u64();
    let rkey = r.u32();
    let invalidate_rkey = r.u32();
    let compare_add = r.u64();
    let swap = r.u64();
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
    let backed = (num_sge as usize).min(MAX_BACKED_SGES);
    let mut sges = Vec::with_capacity(backed);
    for _ in 0..backed {
        let mut length = send::read_len(r);
        let mut addr = r.u64();
        let lkey = r.u32();
        if inline {
            length %= MAX_PIECE + 1;
            let amode = r.u8();
            let off = r.u16() as usize % (POOL - length as usize + 1);
            addr = if amode & 3 == 0 {
                0
            } else {
                pool[off..].as_ptr() as u64
            };
        }
        sges.push(rdd_sge { addr, length, lkey });
    }
    // The misaligned copy: the same entries 4 bytes into u64 storage.
    let mut misaligned_store = vec![0u64; backed * 2 + 1];
    {
        let bytes: &mut [u8] = bytemuck_words(&mut misaligned_store);
        for (i, s) in sges.iter().enumerate() {
            let o = 4 + i * 16;
            bytes[o..o + 8].copy_from_slice(&s.addr.to_ne_bytes());
            bytes[o + 8..o + 12].copy_from_slice(&s.length.to_ne_bytes());
            bytes[o + 12..o + 16].copy_from_slice(&s.lkey.to_ne_bytes());
        }
    }
    CWr {
        wr: rdd_wr {
            wr_id,
            sg_list: std::ptr::null(),
            num_sge,
            opcode,
            flags,
            imm_data: imm,
            remote_addr,
            rkey,
            invalidate_rkey,
            compare_add,
            swap,
        },
        sges,
        misaligned_store,
        mode,
    }
}

/// The bytes of a u64 buffer.
fn bytemuck_words(w: &mut [u64]) -> &mut [u8] {
    let len = std::mem::size_of_val(w);
    // SAFETY: u64 storage viewed as bytes: same allocation, any bit
    // pattern is a valid u8, alignment of u8 is 1.
    unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), len) }
}

/// The C layer's rules a WR breaks (`ffi::wr` parsing, before the core).
fn c_violations(c: &CWr) -> Vec<rdd_status> {
    let w = &c.wr;
    let mut v = Vec::new();
    if w.flags & !0xf != 0 {
        v.push(rdd_status::InvalidFlags);
    }
    let known = KNOWN_OPS.contains(&w.opcode);
    if !known {
        v.push(rdd_status::InvalidOpcode);
    }
    let imm_op = w.opcode == RDD_WR_SEND_WITH_IMM || w.opcode == RDD_WR_RDMA_WRITE_WITH_IMM;
    if known && w.imm_data != 0 && !imm_op {
        v.push(rdd_status::InvalidImmediate);
    }
    let inline = w.flags & RDD_SEND_INLINE != 0;
    let max = if inline {
        RDD_WR_MAX_INLINE_SGE as u32
    } else {
        MAX_DS
    };
    if w.num_sge > 0 {
        let mut list_ok = true;
        if c.mode == ListMode::Null {
            v.push(rdd_status::NullPointer);
            list_ok = false;
        }
        if w.num_sge > max {
            v.push(rdd_status::TooManySges);
            list_ok = false;
        }
        if c.mode == ListMode::Misaligned {
            v.push(rdd_status::InvalidArgument);
            list_ok = false;
        }
        if list_ok && inline && c.sges.iter().any(|s| s.length != 0 && s.addr == 0) {
            v.push(rdd_status::NullPointer);
        }
    }
    v
}

/// The typed request a C WR that passes the C layer stands for.
fn to_spec(c: &CWr) -> WrSpec {
    let w = &c.wr;
    let remote = Remote::new(w.remote_addr, w.rkey);
    let op = match w.opcode {
        RDD_WR_RDMA_WRITE => SendOp::Write { remote },
        RDD_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm {
            remote,
            imm: w.imm_data,
        },
        RDD_WR_SEND => SendOp::Send,
        RDD_WR_SEND_WITH_IMM => SendOp::SendImm { imm: w.imm_data },
        RDD_WR_RDMA_READ => SendOp::Read { remote },
        RDD_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote,
            compare: w.compare_add,
            swap: w.swap,
        },
        RDD_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote,
            add: w.compare_add,
        },
        RDD_WR_SEND_WITH_INV => SendOp::SendInv {
            rkey: w.invalidate_rkey,
        },
        _ => SendOp::Nop,
    };
    let entries = &c.sges[..w.num_sge as usize];
    let payload = if w.flags & RDD_SEND_INLINE != 0 {
        PayloadSpec::Inline(
            entries
                .iter()
                .map(|s| {
                    if s.length == 0 {
                        Vec::new()
                    } else {
                        // SAFETY: inline pieces point into the pool with
                        // `length` bytes inside it (read_cwr).
                        unsafe {
                            std::slice::from_raw_parts(s.addr as *const u8, s.length as usize)
                        }
                        .to_vec()
                    }
                })
                .collect(),
        )
    } else {
        PayloadSpec::Sges(
            entries
                .iter()
                .map(|s| Sge::new(s.addr, s.length, s.lkey))
                .collect(),
        )
    };
    WrSpec {
        wr_id: w.wr_id,
        op,
        flags: SendFlags(w.flags & !RDD_SEND_INLINE),
        payload,
    }
}

/// What a post of one WR must do.
enum Expect {
    /// Rejected with one of these statuses.
    Reject(Vec<rdd_status>),
    /// Accepted: the typed request and its first BB.
    Accept(WrSpec, u32),
}

struct Harness {
    f: FakeMlx5,
    sq: Box<rdd_mlx5_sq_storage>,
    caps: QpCaps,
    sig_all: bool,
    wqe_cnt: u32,
    /// Producer counter (BBs) and BBs not yet retired (never retired here:
    /// the queue is re-initialised instead).
    pi: u32,
    /// WQEs posted since the last doorbell, and the last one's first BB.
    batch: u32,
    last_start: u32,
    shadow_qp: Vec<u8>,
    shadow_bf: Vec<u8>,
    shadow_dbrec: Vec<u8>,
}

impl Harness {
    fn dv(&self) -> rdd_mlx5dv_qp {
        self.f.dv_qp().into()
    }

    fn init(&mut self, flags: u32) -> rdd_status {
        let dv = self.dv();
        let caps = rdd_qp_caps {
            max_send_sge: self.caps.max_send_sge,
            max_inline_data: self.caps.max_inline_data,
            max_recv_sge: self.caps.max_recv_sge,
        };
        let n = self.f.sq_wrid.len();
        let wrid = self.f.sq_wrid.as_mut_ptr().cast::<rdd_mlx5_sq_slot>();
        // SAFETY: the storage is a live Box; `dv` describes `self.f`'s
        // memory and `wrid` its side table (`rdd_mlx5_sq_slot` has the
        // layout of `WrSlot`), all of which outlive the handle (fini in
        // Drop); nothing dereferences SGE addresses (no device here).
        unsafe { rdd_mlx5_sq_init(&mut *self.sq, &dv, self.f.geo.qpn, &caps, flags, wrid, n) }
    }

    fn snapshot(&mut self) {
        self.shadow_qp.copy_from_slice(self.f.qp_buf.bytes());
        self.shadow_bf.copy_from_slice(self.f.bf.bytes());
        self.shadow_dbrec.copy_from_slice(self.f.dbrec.bytes());
    }

    fn check_untouched(&self, what: &str) {
        assert!(
            self.f.qp_buf.bytes() == &self.shadow_qp[..],
            "{what}: QP buffer (ring, RQ or guard) modified"
        );
        assert!(
            self.f.bf.bytes() == &self.shadow_bf[..],
            "{what}: register modified"
        );
        assert!(
            self.f.dbrec.bytes() == &self.shadow_dbrec[..],
            "{what}: doorbell record modified"
        );
    }

    /// The model's verdict on `c` at the current producer position.
    fn expect(&self, c: &CWr) -> Expect {
        let cv = c_violations(c);
        if !cv.is_empty() {
            return Expect::Reject(cv);
        }
        let w = to_spec(c);
        let v = send::violations(&w, &self.caps, QpState::Rts, self.pi, self.wqe_cnt);
        if v.is_empty() {
            Expect::Accept(w, self.pi)
        } else {
            Expect::Reject(v.into_iter().map(rdd_status::from).collect())
        }
    }

    fn check_wqe(&self, w: &WrSpec, start: u32) {
        let ring = self.f.sq_bytes();
        let d = decode_wqe(ring, start & (self.wqe_cnt - 1))
            .unwrap_or_else(|e| panic!("accepted {w:?} does not decode: {e:?}"));
        let (opcode, _) = send::opcode_and_hdr(&w.op);
        assert_eq!(d.opcode, opcode, "opcode of {w:?}");
        assert_eq!(d.opmod, 0, "opmod");
        assert_eq!(d.wqe_index, start as u16, "wqe index");
        assert_eq!(d.qpn, self.f.geo.qpn, "qpn");
        assert_eq!(d.ds, send::ds(w), "ds of {w:?}");
        let mut fm_ce_se = 0;
        if w.flags.contains(SendFlags::SIGNALED) || self.sig_all {
            fm_ce_se |= ctrl::CQ_UPDATE;
        }
        if w.flags.contains(SendFlags::SOLICITED) {
            fm_ce_se |= ctrl::SOLICITED;
        }
        if w.flags.contains(SendFlags::FENCE) {
            fm_ce_se |= ctrl::FENCE;
        }
        assert_eq!(d.fm_ce_se, fm_ce_se, "fm_ce_se of {w:?}");
        send::check_payload(&d, w);
    }

    /// Posts `wrs` with one `rdd_mlx5_sq_post` call and checks every
    /// outcome against the model.
    fn post(&mut self, wrs: &mut [CWr]) {
        for c in wrs.iter_mut() {
            c.fix_pointer();
        }
        let array: Vec<rdd_wr> = wrs.iter().map(|c| c.wr).collect();
        // Expected: WRs up to the first rejected one are accepted.
        let mut accepted: Vec<(WrSpec, u32, u32)> = Vec::new();
        let mut failure = None;
        let pi0 = self.pi;
        for (i, c) in wrs.iter().enumerate() {
            match self.expect(c) {
                Expect::Accept(w, start) => {
                    let end = start.wrapping_add(send::nbb(&w));
                    self.pi = end;
                    accepted.push((w, start, end));
                }
                Expect::Reject(v) => {
                    failure = Some((i, v));
                    break;
                }
            }
        }
        self.pi = pi0;
        let wrid_before = self.f.sq_wrid.clone();
        let mut bad = SENTINEL;
        // SAFETY: the handle is live; `array` holds `len` requests whose
        // SGE arrays are the CWr buffers (misaligned and NULL ones are
        // rejected before any read; counts above MAX_BACKED_SGES are above
        // every limit and rejected before any read); inline pieces point
        // inside the pool. Non-inline SGE addresses are never dereferenced.
        let got = unsafe { rdd_mlx5_sq_post(&mut *self.sq, array.as_ptr(), array.len(), &mut bad) };
        match &failure {
            None => {
                assert_eq!(
                    got,
                    rdd_status::Ok,
                    "batch of {} expected to post",
                    array.len()
                );
                assert_eq!(bad, SENTINEL, "out_bad_index written on success");
            }
            Some((i, v)) => {
                assert!(
                    v.contains(&got),
                    "WR {i} ({:?}, SGEs {:?}): got {got:?}, breaks only {v:?}",
                    wrs[*i].wr,
                    wrs[*i].sges
                );
                assert_eq!(bad, *i, "out_bad_index");
            }
        }
        // Accepted WQEs decode to what was asked; nothing else changed.
        // The check compares 64-byte blocks (and the RQ region and GUARD
        // bytes as wholes) with the shadow, skipping the accepted WQEs'
        // BBs; only a mismatch walks bytes, to say where.
        let mut inside = [false; 64];
        for (w, start, end) in &accepted {
            self.check_wqe(w, *start);
            let mut bb = *start;
            while bb != *end {
                inside[(bb & (self.wqe_cnt - 1)) as usize] = true;
                bb = bb.wrapping_add(1);
            }
        }
        let now = self.f.qp_buf.bytes();
        let sq0 = self.f.sq_offset();
        let ring_end = sq0 + self.wqe_cnt as usize * 64;
        let mut same =
            now[..sq0] == self.shadow_qp[..sq0] && now[ring_end..] == self.shadow_qp[ring_end..];
        for (bb, &skip) in inside.iter().enumerate().take(self.wqe_cnt as usize) {
            let (a, b) = (sq0 + bb * 64, sq0 + bb * 64 + 64);
            same &= skip || now[a..b] == self.shadow_qp[a..b];
        }
        if !same {
            for (k, (&now, &was)) in now.iter().zip(self.shadow_qp.iter()).enumerate() {
                let in_wqe = k >= sq0 && k < ring_end && inside[(k - sq0) / 64];
                if !in_wqe && now != was {
                    let where_ = if k < sq0 {
                        "RQ region".to_string()
                    } else if k >= ring_end {
                        format!("GUARD byte {}", k - ring_end)
                    } else {
                        format!("ring byte {}", k - sq0)
                    };
                    panic!("{where_} modified outside the accepted WQEs");
                }
            }
        }
        assert!(
            self.f.bf.bytes() == &self.shadow_bf[..],
            "post wrote the register"
        );
        assert!(
            self.f.dbrec.bytes() == &self.shadow_dbrec[..],
            "post wrote the doorbell record"
        );
        // The side table changes only at the accepted WQEs' BBs: the first
        // BB's entry describes the WQE, the others are cleared (so a stale
        // entry can never pass for a WQE start).
        let mask = self.wqe_cnt - 1;
        for (k, (now, was)) in self.f.sq_wrid.iter().zip(wrid_before.iter()).enumerate() {
            let first = accepted
                .iter()
                .any(|(_, start, _)| (start & mask) as usize == k);
            let middle = accepted.iter().any(|(_, start, end)| {
                (1..end.wrapping_sub(*start)).any(|d| (start.wrapping_add(d) & mask) as usize == k)
            });
            if middle && !first {
                assert_eq!(
                    *now,
                    WrSlot::default(),
                    "middle-BB side-table slot {k} not cleared"
                );
            }
            assert!(
                first || middle || now == was,
                "post wrote side-table slot {k}"
            );
        }
        if let Some((_, start, end)) = accepted.last() {
            self.last_start = *start;
            self.pi = *end;
        }
        self.batch += accepted.len() as u32;
        self.shadow_qp.copy_from_slice(self.f.qp_buf.bytes());
    }

    fn ring(&mut self) {
        let wrid_before = self.f.sq_wrid.clone();
        // SAFETY: the handle is live; the register and record are `self.f`'s.
        let s = unsafe { rdd_mlx5_sq_ring(&mut *self.sq) };
        assert_eq!(s, rdd_status::Ok);
        // Only the last WQE's fm_ce_se may change (a forced CQE request).
        let ctrl11 = self.f.sq_offset() + (self.last_start & (self.wqe_cnt - 1)) as usize * 64 + 11;
        let now = self.f.qp_buf.bytes();
        let (was, is) = (self.shadow_qp[ctrl11], now[ctrl11]);
        let forced = self.batch != 0 && is == was | ctrl::CQ_UPDATE;
        assert!(
            is == was || forced,
            "doorbell changed QP-buffer byte {ctrl11}"
        );
        if now[..ctrl11] != self.shadow_qp[..ctrl11]
            || now[ctrl11 + 1..] != self.shadow_qp[ctrl11 + 1..]
        {
            let k = (0..now.len())
                .find(|&k| k != ctrl11 && now[k] != self.shadow_qp[k])
                .unwrap_or(0);
            panic!("doorbell changed QP-buffer byte {k}");
        }
        assert!(
            self.f.sq_wrid == wrid_before,
            "doorbell wrote the side table"
        );
        if self.batch != 0 {
            assert_eq!(self.f.dbrec_sq(), self.pi & 0xffff, "SQ doorbell record");
        } else {
            assert!(
                self.f.dbrec.bytes() == &self.shadow_dbrec[..],
                "empty doorbell wrote the record"
            );
            assert!(
                self.f.bf.bytes() == &self.shadow_bf[..],
                "empty doorbell wrote the register"
            );
        }
        assert_eq!(self.f.dbrec_rq(), 0, "RQ doorbell record written");
        self.batch = 0;
        self.snapshot();
    }

    fn reinit(&mut self, flags: u32) {
        // SAFETY: the handle is live (or zeroed after a failed init, which
        // fini reports without touching anything).
        let _ = unsafe { rdd_mlx5_sq_fini(&mut *self.sq) };
        assert_eq!(self.init(flags), rdd_status::Ok, "re-init");
        self.pi = 0;
        self.batch = 0;
        self.snapshot();
        self.check_untouched("re-init");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // SAFETY: as in `reinit`.
        let _ = unsafe { rdd_mlx5_sq_fini(&mut *self.sq) };
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let geo = r.u8();
    let bf = r.u8();
    let max_send_sge = 1 + (r.u8() % 8) as u32;
    let max_inline_data = (r.u8() % 201) as u32;
    let seed = r.u8();
    let qpn = r.u32() & 0x00ff_ffff;

    let wqe_cnt = 1u32 << ((geo & 7) % 7);
    let mut flags = 0;
    if geo & 0x08 != 0 {
        flags |= RDD_MLX5_SQ_SIG_ALL;
    }
    match (geo >> 4) & 3 {
        1 => flags |= RDD_MLX5_SQ_BF_NEVER,
        2 => flags |= RDD_MLX5_SQ_BF_INLINE_ONLY,
        _ => {}
    }
    if geo & 0x40 != 0 {
        flags |= RDD_MLX5_SQ_SHARED_REGISTER;
    }
    let mut f = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: wqe_cnt,
        rq_wqe_cnt: 4,
        rq_stride: 32,
        bf_size: [0, 64, 128, 256][(bf & 3) as usize],
        cqe_cnt: 2,
        cqe_size: 64,
        qpn,
        cqn: 1,
    });
    assert_eq!(
        f.qp_buf.len(),
        f.sq_offset() + wqe_cnt as usize * 64 + GUARD
    );
    pattern::fill(f.qp_buf.bytes_mut(), seed);
    pattern::fill(f.bf.bytes_mut(), seed ^ 0x5a);
    let mut pool = vec![0u8; POOL];
    pattern::fill(&mut pool, seed ^ 0xa5);
    let caps = QpCaps {
        max_send_sge,
        max_inline_data,
        max_recv_sge: 2,
    };
    let n_qp = f.qp_buf.len();
    let n_bf = f.bf.len();
    let n_db = f.dbrec.len();
    // SAFETY: the storage is a byte array: all zeroes is a valid value.
    let sq = unsafe { Box::<rdd_mlx5_sq_storage>::new_zeroed().assume_init() };
    let mut h = Harness {
        f,
        sq,
        caps,
        sig_all: flags & RDD_MLX5_SQ_SIG_ALL != 0,
        wqe_cnt,
        pi: 0,
        batch: 0,
        last_start: 0,
        shadow_qp: vec![0; n_qp],
        shadow_bf: vec![0; n_bf],
        shadow_dbrec: vec![0; n_db],
    };
    h.snapshot();
    let s = h.init(flags);
    if !send::geometry_ok(&caps, wqe_cnt) {
        assert_eq!(
            s,
            rdd_status::InvalidGeometry,
            "init of {caps:?} on {wqe_cnt} BBs"
        );
        h.check_untouched("failed init");
        return;
    }
    assert_eq!(s, rdd_status::Ok, "init of {caps:?} on {wqe_cnt} BBs");
    h.check_untouched("init");

    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        match r.u8() % 8 {
            0..=4 => {
                let mut one = [read_cwr(&mut r, &pool)];
                h.post(&mut one);
            }
            5 => {
                let n = 1 + (r.u8() % 4) as usize;
                let mut batch: Vec<CWr> = (0..n).map(|_| read_cwr(&mut r, &pool)).collect();
                h.post(&mut batch);
            }
            6 => h.ring(),
            _ => h.reinit(flags),
        }
    }
    h.ring();
});
