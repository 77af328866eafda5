//! `raw_ops`: random calls of the per-opcode raw posts
//! (`rdd_mlx5_sq_write` and friends, `rdd_mlx5_rq_recv`, the
//! `RDD_SEND_DEFER_DOORBELL` batches), of the bursts
//! (`rdd_mlx5_sq_write_burst`, `_read_burst`) and of the bound poll
//! (`rdd_mlx5_cq_poll_bound`), each checked against the generic entry
//! points on a twin queue: `rdd_mlx5_sq_post` (+ `rdd_mlx5_sq_ring` for a
//! non-deferred call) of the equivalent `rdd_wr` (for a burst: one per
//! descriptor up to the first refused one, then the ring the burst owes),
//! `rdd_mlx5_rq_post` of the
//! equivalent `rdd_recv_wr`, `rdd_mlx5_cq_poll` with the three handles.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! geo      u8   bits 0-2: log2 SQ BBs (% 7 -> 1..64), bit 3: SIG_ALL,
//!               bits 4-5: 1 BF_NEVER, 2 BF_INLINE_ONLY, bit 6: SHARED_REGISTER
//! bf       u8   bf_size = [0, 64, 128, 256][bf & 3]
//! sge      u8   max_send_sge = sge % 5 (0 refuses every SGE post)
//! inline   u8   max_inline_data = inline % 201
//! rsge     u8   max_recv_sge = rsge % 3 (RQ stride 32)
//! seed     u8   fill pattern of the QP buffer, register and payload pool
//! ops...        until the input ends (at most MAX_OPS):
//!   op u8 % 17: 0..=8 that per-opcode send, 9 a receive, 10 rdd_mlx5_sq_ring,
//!               11 rdd_mlx5_rq_ring, 12 a send CQE + poll, 13 a receive
//!               CQE + poll, 14 re-initialise SQ and RQ, 15 a send of
//!               kind u8 % 9, 16 a burst
//! send:   fsel u8   bit 7: raw u32 flags follow; else bit 0 FENCE, 1 SIGNALED,
//!                   2 SOLICITED, 3 INLINE, 4 DEFER_DOORBELL, 5 bit 0x10 (bad)
//!         wr_id u64, laddr u64, length (send::read_len), lkey u32,
//!         raddr u64 (asel u8 bit 0: aligned to 8), rkey u32, imm u32,
//!         compare u64, swap u64; inline sends: amode u8 (& 3 == 0: NULL,
//!         any length; else a pointer into the pool at offset u16, the
//!         length cut to fit the pool)
//! recv:   fsel u8 (bit 0 DEFER_DOORBELL, bit 1 a bad bit), wr_id u64,
//!         laddr u64, length (send::read_len), lkey u32
//! burst:  sel u8 (bit 0: READs, else WRITEs; bit 1: `ops` NULL; bit 2:
//!         `ops` misaligned), n u8 % 21, then n sends of that kind (as
//!         above, each descriptor its flags, wr_id, laddr, length, lkey,
//!         raddr, rkey)
//! CQE:    pick u8 (which outstanding WQE / the next receive), status u8
//!         (< 0xc0 success, else an error syndrome), n u8 (poll n % 5)
//! ```
//!
//! Checked after every call: both queues return the same status (the
//! bound poll's `-(int32_t)status` or count against `rdd_mlx5_cq_poll`'s
//! status and count, with the same completions); the twins' memory is
//! byte-identical (QP buffer with both rings and the GUARD bytes after the
//! SQ, both side tables, the doorbell records, the register, the CQ
//! buffer); a refused per-opcode call changed no byte; a call with flag
//! bits outside its set is `INVALID_FLAGS`; a burst's `*out_posted` is the
//! number of descriptors the twin posted (untouched on a NULL or
//! misaligned array, which changes no byte).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_direct::ffi::{
    rdd_mlx5_cq_bind, rdd_mlx5_cq_poll, rdd_mlx5_cq_poll_bound, rdd_mlx5_rq_post, rdd_mlx5_rq_recv,
    rdd_mlx5_rq_ring, rdd_mlx5_sq_cmp_swap, rdd_mlx5_sq_fetch_add, rdd_mlx5_sq_post,
    rdd_mlx5_sq_read, rdd_mlx5_sq_read_burst, rdd_mlx5_sq_ring, rdd_mlx5_sq_send,
    rdd_mlx5_sq_send_imm, rdd_mlx5_sq_send_inline, rdd_mlx5_sq_storage, rdd_mlx5_sq_write,
    rdd_mlx5_sq_write_burst, rdd_mlx5_sq_write_imm, rdd_mlx5_sq_write_inline, rdd_qp_caps,
    rdd_rdma_op, rdd_recv_wr, rdd_sge, rdd_status, rdd_wc, rdd_wr, RDD_MLX5_SQ_BF_INLINE_ONLY,
    RDD_MLX5_SQ_BF_NEVER, RDD_MLX5_SQ_SHARED_REGISTER, RDD_MLX5_SQ_SIG_ALL,
    RDD_SEND_DEFER_DOORBELL, RDD_SEND_FENCE, RDD_SEND_INLINE, RDD_SEND_SIGNALED,
    RDD_SEND_SOLICITED, RDD_WR_ATOMIC_CMP_AND_SWP, RDD_WR_ATOMIC_FETCH_AND_ADD, RDD_WR_RDMA_READ,
    RDD_WR_RDMA_WRITE, RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_SEND, RDD_WR_SEND_WITH_IMM,
};
use rdma_direct::testutil::FakeGeometry;
use rdma_direct_fuzz::send;
use rdma_direct_fuzz::{pattern, Bytes};
use std::collections::VecDeque;
use std::ffi::c_void;

#[path = "raw_ops/side.rs"]
mod side;
use side::{Side, Snapshot};

/// Most descriptors of one burst.
const MAX_BURST: u8 = 20;
/// Upper bound on operations per input.
const MAX_OPS: usize = 512;
/// Bytes of the inline payload pool.
const POOL: usize = 1024;
/// Most completions one poll asks for.
const MAX_POLL: usize = 4;
/// The flags every per-opcode send accepts.
const SEND_FLAGS: u32 =
    RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_DEFER_DOORBELL;

/// The nine per-opcode sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    WriteImm,
    Read,
    Send,
    SendImm,
    WriteInline,
    SendInline,
    FetchAdd,
    CmpSwap,
}

const KINDS: [Kind; 9] = [
    Kind::Write,
    Kind::WriteImm,
    Kind::Read,
    Kind::Send,
    Kind::SendImm,
    Kind::WriteInline,
    Kind::SendInline,
    Kind::FetchAdd,
    Kind::CmpSwap,
];

impl Kind {
    fn inline(self) -> bool {
        matches!(self, Kind::WriteInline | Kind::SendInline)
    }
    fn atomic(self) -> bool {
        matches!(self, Kind::FetchAdd | Kind::CmpSwap)
    }
    fn opcode(self) -> u32 {
        match self {
            Kind::Write | Kind::WriteInline => RDD_WR_RDMA_WRITE,
            Kind::WriteImm => RDD_WR_RDMA_WRITE_WITH_IMM,
            Kind::Read => RDD_WR_RDMA_READ,
            Kind::Send | Kind::SendInline => RDD_WR_SEND,
            Kind::SendImm => RDD_WR_SEND_WITH_IMM,
            Kind::FetchAdd => RDD_WR_ATOMIC_FETCH_AND_ADD,
            Kind::CmpSwap => RDD_WR_ATOMIC_CMP_AND_SWP,
        }
    }
    fn has_imm(self) -> bool {
        matches!(self, Kind::WriteImm | Kind::SendImm)
    }
}

/// The arguments of one per-opcode send.
#[derive(Clone, Copy, Debug)]
struct SendCall {
    kind: Kind,
    flags: u32,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    imm: u32,
    compare: u64,
    swap: u64,
    data: *const u8,
}

fn read_send(r: &mut Bytes<'_>, kind: Kind, pool: &[u8]) -> SendCall {
    let fsel = r.u8();
    let flags = if fsel & 0x80 != 0 {
        r.u32()
    } else {
        let mut f = (fsel & 7) as u32;
        if fsel & 0x08 != 0 {
            f |= RDD_SEND_INLINE;
        }
        if fsel & 0x10 != 0 {
            f |= RDD_SEND_DEFER_DOORBELL;
        }
        if fsel & 0x20 != 0 {
            f |= 0x10;
        }
        f
    };
    let wr_id = r.u64();
    let laddr = r.u64();
    let mut length = send::read_len(r);
    let lkey = r.u32();
    let mut raddr = r.u64();
    if r.u8() & 1 != 0 {
        raddr &= !7;
    }
    let rkey = r.u32();
    let imm = r.u32();
    let compare = r.u64();
    let swap = r.u64();
    let mut data = std::ptr::null();
    if kind.inline() {
        let amode = r.u8();
        let off = r.u16() as usize % POOL;
        if amode & 3 != 0 {
            length %= (POOL - off) as u32 + 1;
            data = pool[off..].as_ptr();
        }
    }
    SendCall {
        kind,
        flags,
        wr_id,
        laddr,
        length,
        lkey,
        raddr,
        rkey,
        imm,
        compare,
        swap,
        data,
    }
}

/// The per-opcode call on `sq`.
///
/// # Safety
/// `sq` is live; `c.data` is NULL or points to `c.length` readable bytes.
unsafe fn call_op(sq: *mut rdd_mlx5_sq_storage, c: &SendCall) -> rdd_status {
    let d = c.data.cast::<c_void>();
    // SAFETY: caller contract; no SGE address is ever dereferenced (there
    // is no device).
    unsafe {
        match c.kind {
            Kind::Write => rdd_mlx5_sq_write(
                sq, c.wr_id, c.laddr, c.length, c.lkey, c.raddr, c.rkey, c.flags,
            ),
            Kind::WriteImm => rdd_mlx5_sq_write_imm(
                sq, c.wr_id, c.laddr, c.length, c.lkey, c.raddr, c.rkey, c.imm, c.flags,
            ),
            Kind::Read => rdd_mlx5_sq_read(
                sq, c.wr_id, c.laddr, c.length, c.lkey, c.raddr, c.rkey, c.flags,
            ),
            Kind::Send => rdd_mlx5_sq_send(sq, c.wr_id, c.laddr, c.length, c.lkey, c.flags),
            Kind::SendImm => {
                rdd_mlx5_sq_send_imm(sq, c.wr_id, c.laddr, c.length, c.lkey, c.imm, c.flags)
            }
            Kind::WriteInline => {
                rdd_mlx5_sq_write_inline(sq, c.wr_id, d, c.length, c.raddr, c.rkey, c.flags)
            }
            Kind::SendInline => rdd_mlx5_sq_send_inline(sq, c.wr_id, d, c.length, c.flags),
            Kind::FetchAdd => rdd_mlx5_sq_fetch_add(
                sq, c.wr_id, c.laddr, c.lkey, c.raddr, c.rkey, c.compare, c.flags,
            ),
            Kind::CmpSwap => rdd_mlx5_sq_cmp_swap(
                sq, c.wr_id, c.laddr, c.lkey, c.raddr, c.rkey, c.compare, c.swap, c.flags,
            ),
        }
    }
}

/// The equivalent request through `rdd_mlx5_sq_post` (+ ring).
///
/// # Safety
/// As for [`call_op`].
unsafe fn post_equivalent(sq: *mut rdd_mlx5_sq_storage, c: &SendCall) -> rdd_status {
    let sge = if c.kind.inline() {
        rdd_sge {
            addr: c.data as u64,
            length: c.length,
            lkey: 0,
        }
    } else if c.kind.atomic() {
        rdd_sge {
            addr: c.laddr,
            length: 8,
            lkey: c.lkey,
        }
    } else {
        rdd_sge {
            addr: c.laddr,
            length: c.length,
            lkey: c.lkey,
        }
    };
    let inline = if c.kind.inline() { RDD_SEND_INLINE } else { 0 };
    let w = rdd_wr {
        wr_id: c.wr_id,
        sg_list: &sge,
        num_sge: 1,
        opcode: c.kind.opcode(),
        flags: (c.flags & !RDD_SEND_DEFER_DOORBELL) | inline,
        imm_data: if c.kind.has_imm() { c.imm } else { 0 },
        remote_addr: c.raddr,
        rkey: c.rkey,
        invalidate_rkey: 0,
        compare_add: c.compare,
        swap: c.swap,
    };
    let mut bad = 0usize;
    // SAFETY: a live handle; one request whose SGE is a local (and whose
    // inline piece, if any, is the caller's readable bytes).
    unsafe {
        let s = rdd_mlx5_sq_post(sq, &w, 1, &mut bad);
        if s == rdd_status::Ok && c.flags & RDD_SEND_DEFER_DOORBELL == 0 {
            return rdd_mlx5_sq_ring(sq);
        }
        s
    }
}

struct Harness {
    a: Side,
    b: Side,
    wqe_cnt: u32,
    /// Producer counter (BBs) of the twins.
    pi: u32,
    /// WQE starts written but not rung, and rung but not retired.
    pending: Vec<u32>,
    rung: VecDeque<u32>,
    /// Receives posted, published on A, and completed.
    rq_head: u32,
    rq_published: u32,
    rq_tail: u32,
    /// What A's and B's RQ doorbell records must hold (host order).
    rec_a: u32,
    rec_b: u32,
    /// CQEs written so far (the CQ producer).
    cqes: u32,
    /// A's memory before the call being checked.
    snap: Snapshot,
}

impl Harness {
    /// The twins hold the same bytes, except the RQ record: B's
    /// (`rdd_mlx5_rq_post` always publishes) covers every receive posted,
    /// A's those published (a receive without RDD_SEND_DEFER_DOORBELL, or
    /// `rdd_mlx5_rq_ring`).
    fn check_twins(&self, what: &str) {
        assert!(self.a.same_as(&self.b), "{what}: the twins' memory differs");
        assert_eq!(self.a.f.dbrec_rq(), self.rec_a, "{what}: A's RQ record");
        assert_eq!(self.b.f.dbrec_rq(), self.rec_b, "{what}: B's RQ record");
    }

    fn send(&mut self, c: SendCall) {
        self.a.take(&mut self.snap);
        let allowed = if c.kind.inline() {
            SEND_FLAGS | RDD_SEND_INLINE
        } else {
            SEND_FLAGS
        };
        // SAFETY: live handles; `c.data` is NULL or inside the pool with
        // `length` bytes (read_send).
        let got = unsafe { call_op(self.a.sq, &c) };
        if c.flags & !allowed != 0 {
            assert_eq!(got, rdd_status::InvalidFlags, "{c:?}");
            assert!(self.a.matches(&self.snap), "refused {c:?} wrote");
            return;
        }
        // SAFETY: as above.
        let want = unsafe { post_equivalent(self.b.sq, &c) };
        assert_eq!(got, want, "{c:?}");
        if got != rdd_status::Ok {
            assert!(self.a.matches(&self.snap), "refused {c:?} ({got:?}) wrote");
        } else {
            let start = self.pi;
            let slot = self.a.f.sq_wrid[(start & (self.wqe_cnt - 1)) as usize];
            assert_eq!(slot.start, start as u16, "side table of {c:?}");
            assert_eq!(slot.wr_id, c.wr_id);
            self.pi = slot.end;
            self.pending.push(start);
            if c.flags & RDD_SEND_DEFER_DOORBELL == 0 {
                self.rung.extend(self.pending.drain(..));
            }
        }
        self.check_twins("send");
    }

    /// A burst on A; on B the same descriptors through `rdd_mlx5_sq_post`
    /// up to the first refused one, then `rdd_mlx5_sq_ring` unless the
    /// burst owes no doorbell (all posted and the last defers; a refused
    /// descriptor, at any index and for any `n`, rings what is pending).
    fn burst(&mut self, r: &mut Bytes<'_>, pool: &[u8]) {
        let sel = r.u8();
        let n = r.u8() % (MAX_BURST + 1);
        let kind = if sel & 1 != 0 {
            Kind::Read
        } else {
            Kind::Write
        };
        let calls: Vec<SendCall> = (0..n).map(|_| read_send(r, kind, pool)).collect();
        let ops: Vec<rdd_rdma_op> = calls
            .iter()
            .map(|c| rdd_rdma_op {
                wr_id: c.wr_id,
                laddr: c.laddr,
                raddr: c.raddr,
                length: c.length,
                lkey: c.lkey,
                rkey: c.rkey,
                flags: c.flags,
            })
            .collect();
        let f = match kind {
            Kind::Read => rdd_mlx5_sq_read_burst,
            _ => rdd_mlx5_sq_write_burst,
        };
        self.a.take(&mut self.snap);
        let mut posted = u32::MAX;
        if sel & 6 != 0 {
            // Never dereferenced: the array is refused first.
            let (p, want) = if sel & 2 != 0 {
                (std::ptr::null(), rdd_status::NullParameter)
            } else {
                let p = ops.as_ptr().cast::<u8>().wrapping_add(4);
                (p.cast::<rdd_rdma_op>(), rdd_status::InvalidArgument)
            };
            // SAFETY: a live handle; the array is refused unread.
            let got = unsafe { f(self.a.sq, p, n as u32, &mut posted) };
            assert_eq!((got, posted), (want, u32::MAX), "burst array {sel:#x}");
            assert!(self.a.matches(&self.snap), "refused burst wrote");
            return;
        }
        // SAFETY: a live handle, `n` descriptors; no SGE is dereferenced.
        let got = unsafe { f(self.a.sq, ops.as_ptr(), n as u32, &mut posted) };
        let mut want = rdd_status::Ok;
        let mut k = 0u32;
        for c in &calls {
            if c.flags & !SEND_FLAGS != 0 {
                want = rdd_status::InvalidFlags;
                break;
            }
            let deferred = SendCall {
                flags: c.flags | RDD_SEND_DEFER_DOORBELL,
                ..*c
            };
            // SAFETY: a live handle; no SGE is dereferenced.
            want = unsafe { post_equivalent(self.b.sq, &deferred) };
            if want != rdd_status::Ok {
                break;
            }
            let start = self.pi;
            let slot = self.a.f.sq_wrid[(start & (self.wqe_cnt - 1)) as usize];
            assert_eq!(
                (slot.start, slot.wr_id),
                (start as u16, c.wr_id),
                "burst slot"
            );
            self.pi = slot.end;
            self.pending.push(start);
            k += 1;
        }
        assert_eq!((got, posted), (want, k), "burst of {n} {kind:?}: {calls:?}");
        let defer = want == rdd_status::Ok
            && calls
                .last()
                .is_some_and(|c| c.flags & RDD_SEND_DEFER_DOORBELL != 0);
        if !defer {
            // SAFETY: a live handle.
            assert_eq!(unsafe { rdd_mlx5_sq_ring(self.b.sq) }, rdd_status::Ok);
            self.rung.extend(self.pending.drain(..));
        } else if k == 0 {
            assert!(self.a.matches(&self.snap), "refused burst ({got:?}) wrote");
        }
        self.check_twins("burst");
    }

    fn recv(&mut self, r: &mut Bytes<'_>) {
        let fsel = r.u8();
        let mut flags = if fsel & 1 != 0 {
            RDD_SEND_DEFER_DOORBELL
        } else {
            0
        };
        if fsel & 2 != 0 {
            flags |= RDD_SEND_SIGNALED;
        }
        let wr_id = r.u64();
        let laddr = r.u64();
        let length = send::read_len(r);
        let lkey = r.u32();
        self.a.take(&mut self.snap);
        // SAFETY: a live handle; the SGE is never dereferenced.
        let got = unsafe { rdd_mlx5_rq_recv(self.a.rq, wr_id, laddr, length, lkey, flags) };
        if flags & !RDD_SEND_DEFER_DOORBELL != 0 {
            assert_eq!(got, rdd_status::InvalidFlags);
            assert!(self.a.matches(&self.snap), "refused receive wrote");
            return;
        }
        let sge = rdd_sge {
            addr: laddr,
            length,
            lkey,
        };
        let w = rdd_recv_wr {
            wr_id,
            sg_list: &sge,
            num_sge: 1,
            reserved: 0,
        };
        let mut bad = 0usize;
        // SAFETY: a live handle; one request with a local SGE.
        let want = unsafe { rdd_mlx5_rq_post(self.b.rq, &w, 1, &mut bad) };
        assert_eq!(got, want, "receive {length} flags {flags:#x}");
        if got != rdd_status::Ok {
            assert!(
                self.a.matches(&self.snap),
                "refused receive ({got:?}) wrote"
            );
        } else {
            self.rq_head += 1;
            self.rec_b = self.rq_head & 0xffff;
            if flags == 0 {
                self.rq_published = self.rq_head;
                self.rec_a = self.rq_head & 0xffff;
            }
        }
        self.check_twins("receive");
    }

    /// Writes the same CQE into both CQs and polls A with the bound poll,
    /// B with the three-handle poll.
    fn cqe_and_poll(&mut self, cqe: [u8; 64], n: usize) {
        self.a.f.write_cqe(self.cqes, &cqe);
        self.b.f.write_cqe(self.cqes, &cqe);
        self.cqes += 1;
        self.poll(n);
    }

    fn poll(&mut self, n: usize) {
        // SAFETY: the C completion entry is plain data: zeroes are valid.
        let mut wa: [rdd_wc; MAX_POLL] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut wb: [rdd_wc; MAX_POLL] = unsafe { std::mem::zeroed() };
        let mut count = usize::MAX;
        // SAFETY: live (and for A bound) handles; room for n <= MAX_POLL.
        let (got, want) = unsafe {
            (
                rdd_mlx5_cq_poll_bound(self.a.cq, wa.as_mut_ptr(), n as u32),
                rdd_mlx5_cq_poll(
                    self.b.cq,
                    self.b.sq,
                    self.b.rq,
                    wb.as_mut_ptr(),
                    n,
                    &mut count,
                ),
            )
        };
        if want == rdd_status::Ok {
            assert!(count <= n);
            assert_eq!(got, count as i32, "bound poll count");
            for i in 0..count {
                assert_eq!(
                    format!("{:?}", wa[i]),
                    format!("{:?}", wb[i]),
                    "completion {i}"
                );
            }
        } else {
            assert_eq!(got, -(want as u32 as i32), "bound poll status");
        }
        self.check_twins("poll");
    }

    fn send_cqe(&mut self, r: &mut Bytes<'_>) {
        let pick = r.u8() as usize;
        let status = r.u8();
        let n = (r.u8() as usize) % (MAX_POLL + 1);
        let qpn = self.a.f.geo.qpn;
        let mut cqe = [0u8; 64];
        // A rung WQE if there is one (retiring it and everything before
        // it), else a counter nothing is outstanding for (corrupt).
        let (counter, opcode) = if self.rung.is_empty() {
            (self.pi.wrapping_add(pick as u32) as u16, 0x08u8)
        } else {
            let k = pick % self.rung.len();
            let start = self.rung[k];
            let slot = self.a.f.sq_wrid[(start & (self.wqe_cnt - 1)) as usize];
            self.rung.drain(..=k);
            (start as u16, slot.opcode)
        };
        cqe[56..60].copy_from_slice(&((opcode as u32) << 24 | qpn).to_be_bytes());
        cqe[60..62].copy_from_slice(&counter.to_be_bytes());
        cqe[44..48].copy_from_slice(&8u32.to_be_bytes());
        if status >= 0xc0 {
            cqe[54] = status; // vendor syndrome
            cqe[55] = [0x05, 0x04, 0x13, 0x22][(status & 3) as usize];
            cqe[63] = 13 << 4; // REQ_ERR
        }
        self.cqe_and_poll(cqe, n);
    }

    fn recv_cqe(&mut self, r: &mut Bytes<'_>) {
        let _pick = r.u8();
        let status = r.u8();
        let n = (r.u8() as usize) % (MAX_POLL + 1);
        let qpn = self.a.f.geo.qpn;
        let mut cqe = [0u8; 64];
        cqe[44..48].copy_from_slice(&(status as u32).to_be_bytes());
        cqe[56..60].copy_from_slice(&qpn.to_be_bytes());
        cqe[60..62].copy_from_slice(&(self.rq_tail as u16).to_be_bytes());
        cqe[63] = if status >= 0xc0 { 14 << 4 } else { 2 << 4 }; // RESP_ERR / RESP_SEND
        if status >= 0xc0 {
            cqe[55] = 0x05;
        }
        if self.rq_tail != self.rq_head {
            self.rq_tail += 1;
        }
        self.cqe_and_poll(cqe, n);
    }

    fn ring_sq(&mut self) {
        // SAFETY: live handles.
        let (x, y) = unsafe { (rdd_mlx5_sq_ring(self.a.sq), rdd_mlx5_sq_ring(self.b.sq)) };
        assert_eq!((x, y), (rdd_status::Ok, rdd_status::Ok));
        self.rung.extend(self.pending.drain(..));
        self.check_twins("sq ring");
    }

    fn ring_rq(&mut self) {
        // SAFETY: a live handle. B published at post time.
        let x = unsafe { rdd_mlx5_rq_ring(self.a.rq) };
        assert_eq!(x, rdd_status::Ok);
        // Nothing pending: nothing is written.
        if self.rq_published != self.rq_head {
            self.rq_published = self.rq_head;
            self.rec_a = self.rq_head & 0xffff;
        }
        self.check_twins("rq ring");
    }

    fn reinit(&mut self, flags: u32, caps: &rdd_qp_caps) {
        let ra = self.a.init_queues(flags, caps);
        let rb = self.b.init_queues(flags, caps);
        assert_eq!(ra, (rdd_status::Ok, rdd_status::Ok));
        assert_eq!(rb, ra);
        self.pi = 0;
        self.pending.clear();
        self.rung.clear();
        self.rq_head = 0;
        self.rq_tail = 0;
        // A fresh RQ starts at 0 without writing its record: both keep
        // what they hold.
        self.rq_published = 0;
        self.check_twins("re-init");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let geo = r.u8();
    let bf = r.u8();
    let max_send_sge = (r.u8() % 5) as u32;
    let max_inline_data = (r.u8() % 201) as u32;
    let max_recv_sge = (r.u8() % 3) as u32;
    let seed = r.u8();

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
    let fg = FakeGeometry {
        sq_wqe_cnt: wqe_cnt,
        rq_wqe_cnt: 8,
        rq_stride: 32,
        bf_size: [0, 64, 128, 256][(bf & 3) as usize],
        cqe_cnt: 64,
        cqe_size: 64,
        qpn: 0x1c5,
        cqn: 1,
    };
    let mut pool = vec![0u8; POOL];
    pattern::fill(&mut pool, seed ^ 0xa5);
    let caps = rdd_qp_caps {
        max_send_sge,
        max_inline_data,
        max_recv_sge,
    };
    let mut h = Harness {
        a: Side::new(fg, seed),
        b: Side::new(fg, seed),
        wqe_cnt,
        pi: 0,
        pending: Vec::new(),
        rung: VecDeque::new(),
        rq_head: 0,
        rq_published: 0,
        rq_tail: 0,
        rec_a: 0,
        rec_b: 0,
        cqes: 0,
        snap: Snapshot::default(),
    };
    let ra = h.a.init_queues(flags, &caps);
    let rb = h.b.init_queues(flags, &caps);
    assert_eq!(ra, rb, "init");
    if ra != (rdd_status::Ok, rdd_status::Ok) {
        // Geometry the queues refuse (a ring too small for the WQE size).
        return;
    }
    h.a.init_cq();
    h.b.init_cq();
    // SAFETY: live handles whose storages stay in place for the whole run.
    let bound = unsafe { rdd_mlx5_cq_bind(h.a.cq, h.a.sq, h.a.rq) };
    assert_eq!(bound, rdd_status::Ok);
    h.check_twins("init");

    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        match r.u8() % 17 {
            k @ 0..=8 => {
                let c = read_send(&mut r, KINDS[k as usize], &pool);
                h.send(c);
            }
            9 => h.recv(&mut r),
            10 => h.ring_sq(),
            11 => h.ring_rq(),
            12 => h.send_cqe(&mut r),
            13 => h.recv_cqe(&mut r),
            14 => h.reinit(flags, &caps),
            16 => h.burst(&mut r, &pool),
            _ => {
                let k = r.u8() % 9;
                let c = read_send(&mut r, KINDS[k as usize], &pool);
                h.send(c);
            }
        }
    }
    h.ring_sq();
});
