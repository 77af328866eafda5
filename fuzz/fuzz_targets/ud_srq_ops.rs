//! `ud_srq_ops`: random sequences of the raw-queue UD and SRQ calls
//! (`rdd_mlx5_sq_send_ud`, `_send_ud_imm`, `_send_ud_inline`,
//! `rdd_mlx5_sq_post_ud`, `rdd_mlx5_sq_ring`, `rdd_mlx5_srq_recv`,
//! `rdd_mlx5_srq_post`, `rdd_mlx5_srq_ring`, `rdd_mlx5_cq_poll_srq`), each
//! checked against the core on a twin (`SendQueue::post_ud`, `Srq`,
//! `CompletionQueue::poll`): the C ABI's parsing of `rdd_ud_wr`, flags,
//! address vectors and receive lists, and its routing of SRQ completions,
//! must agree with the core, whose bytes the golden vectors pin.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! cfg   u8   bits 0-1: SQ BBs [8, 16, 32, 64]; bits 2-3: max_send_sge
//!            1 + x; bits 4-6: max_inline_data [0, 12, 28, 44, 60, 92,
//!            124, 188]
//! ops... until the input ends (at most MAX_OPS), op u8 % 7:
//!   0 per-opcode UD send: kind u8 % 3 (SEND, SEND_IMM, inline), then a
//!     send (below)
//!   1 generic UD post: n u8 % 4, then n sends, each with opcode u8 % 10
//!     (RDD_WR_* numbering: RDMA and atomics must be UNSUPPORTED)
//!   2 rdd_mlx5_sq_ring
//!   3 SRQ receive: fsel u8 (bit 0 DEFER, bit 1 a bad bit), len (read_len)
//!   4 SRQ list: n u8 % 4, then for each nsge u8 % 5 lengths (read_len)
//!   5 rdd_mlx5_srq_ring
//!   6 a responder CQE + poll: counter u16 (bit 15 set: the WQE of an
//!     outstanding receive, picked by the low bits), ksel u8, n u8 % 5
//!     (poll size), then, unless ksel bit 0 (the SRQ's own key), a u32
//!     whose low 24 bits are the CQE's SRQ field
//! send: fsel u8 (bit 7: raw u32 flags follow; else bits 0-2 FENCE,
//!       SIGNALED, SOLICITED, bit 3 DEFER, bit 4 INLINE, bit 5 bit 0x10),
//!       av u8 % 4 (3: NULL), qpn u32 (bit 0 of asel: masked to 24 bits),
//!       asel u8, qkey u32, nsge u8 % 4 lengths (read_len), imm u32,
//!       inline length u8
//! ```
//!
//! Checked after every call: both sides return the same status and the
//! same completions; the twins' memory (SQ ring, BlueFlame register,
//! doorbell records, side tables, SRQ buffer and record) is identical; a
//! refused call changed no byte; every SRQ completion names a receive that
//! was posted and not completed before (its `wr_id`), each at most once.
#![no_main]

use std::collections::HashSet;
use std::ptr::{null, null_mut};

use libfuzzer_sys::fuzz_target;
use rdma_direct::ffi::mlx5::*;
use rdma_direct::ffi::rdd_status;
use rdma_direct::ffi::wr::*;
use rdma_direct::provider::mlx5::*;
use rdma_direct::{Payload, RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};
use rdma_direct_fuzz::{send, Bytes};

#[path = "ud_srq_ops/rig.rs"]
mod rig;
use rig::{build, CHandles, Mem, Route};

pub(crate) const MAX_OPS: usize = 96;
pub(crate) const QPN: u32 = 0x1c5;
pub(crate) const SRQN: u32 = 0x51;
/// SRQ WQEs in the free list (7 usable) and in the buffer.
pub(crate) const NWQES: u32 = 8;
pub(crate) const MAX_WQES: u32 = 16;
/// SRQ WQE stride: 3 data segments.
pub(crate) const STRIDE: u32 = 64;

/// One send as read from the input.
struct Send {
    flags: u32,
    av: usize,
    qpn: u32,
    qkey: u32,
    sges: Vec<Sge>,
    imm: u32,
    data: Vec<u8>,
    opcode: u32,
}

fn read_send(r: &mut Bytes<'_>, opcode: u32) -> Send {
    let fsel = r.u8();
    let flags = if fsel & 0x80 != 0 {
        r.u32()
    } else {
        let mut f = (fsel & 7) as u32;
        if fsel & 0x08 != 0 {
            f |= RDD_SEND_DEFER_DOORBELL;
        }
        if fsel & 0x10 != 0 {
            f |= RDD_SEND_INLINE;
        }
        if fsel & 0x20 != 0 {
            f |= 0x10;
        }
        f
    };
    let av = (r.u8() % 4) as usize;
    let mut qpn = r.u32();
    if r.u8() & 1 != 0 {
        qpn &= 0x00ff_ffff;
    }
    let qkey = r.u32();
    let n = r.u8() % 4;
    let sges = (0..n)
        .map(|k| Sge::new(0x7f00_0000 + 0x1000 * k as u64, send::read_len(r), 0x77))
        .collect();
    let imm = r.u32();
    let len = r.u8() as usize;
    Send {
        flags,
        av,
        qpn,
        qkey,
        sges,
        imm,
        data: (0..len).map(|i| i as u8 ^ 0x5c).collect(),
        opcode,
    }
}

pub(crate) struct Twins {
    pub(crate) c: Mem,
    pub(crate) k: Mem,
    pub(crate) h: CHandles,
    pub(crate) sq: SendQueue,
    pub(crate) qp_rq: RecvQueue,
    pub(crate) srq: Srq,
    pub(crate) cq: CompletionQueue,
    pub(crate) c_avs: Vec<rdd_mlx5_av>,
    pub(crate) k_avs: Vec<Mlx5Av>,
    pub(crate) cqes: u32,
    pub(crate) next_id: u64,
    /// Receive ids posted to the SRQ and not completed.
    pub(crate) outstanding: HashSet<u64>,
}

impl Twins {
    fn check(&self, what: &str) {
        assert!(self.c.same(&self.k), "{what}: the twins differ");
    }

    fn c_av(&self, i: usize) -> *const rdd_mlx5_av {
        self.c_avs.get(i).map_or(null(), |a| a as *const _)
    }

    /// A per-opcode UD send on both sides.
    fn send(&mut self, kind: u8, s: &Send) {
        let before = self.c.snapshot();
        let s0 = s.sges.first().copied().unwrap_or(Sge::new(0, 0, 0));
        let av = self.c_av(s.av);
        let sq = &mut *self.h.sq;
        // SAFETY: a live handle; SGE addresses are never dereferenced;
        // `data` is a live buffer of its length.
        let got = unsafe {
            match kind {
                0 => rdd_mlx5_sq_send_ud(
                    sq, av, s.qpn, s.qkey, 1, s0.addr, s0.length, s0.lkey, s.flags,
                ),
                1 => rdd_mlx5_sq_send_ud_imm(
                    sq, av, s.qpn, s.qkey, 1, s0.addr, s0.length, s0.lkey, s.imm, s.flags,
                ),
                _ => rdd_mlx5_sq_send_ud_inline(
                    sq,
                    av,
                    s.qpn,
                    s.qkey,
                    1,
                    s.data.as_ptr().cast(),
                    s.data.len() as u32,
                    s.flags,
                ),
            }
        };
        let base = RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED;
        let allowed = base | RDD_SEND_DEFER_DOORBELL | if kind == 2 { RDD_SEND_INLINE } else { 0 };
        let want = if s.flags & !allowed != 0 {
            rdd_status::InvalidFlags
        } else if let Some(av) = self.k_avs.get(s.av) {
            let one = [s0];
            let pieces = [s.data.as_slice()];
            let f = SendFlags(s.flags & base);
            let wr = match kind {
                0 => SendWr::new(1, SendOp::Send, &one, f),
                1 => SendWr::new(1, SendOp::SendImm { imm: s.imm }, &one, f),
                _ => SendWr::inline(1, SendOp::Send, &pieces, f),
            };
            let dest = UdDest::new(av, s.qpn, s.qkey);
            // SAFETY: nothing executes the WQEs.
            match unsafe { self.sq.post_ud(&wr, &dest) } {
                Ok(()) => {
                    if s.flags & RDD_SEND_DEFER_DOORBELL == 0 {
                        self.sq.ring();
                    }
                    rdd_status::Ok
                }
                Err(e) => e.into(),
            }
        } else {
            rdd_status::NullPointer
        };
        assert_eq!(got, want, "send kind {kind} flags {:#x}", s.flags);
        if got != rdd_status::Ok {
            assert!(self.c.snapshot() == before, "a refused send wrote");
        }
        self.check("send");
    }

    /// A generic UD post of `list` on both sides.
    fn post(&mut self, list: &[Send]) {
        let sgs: Vec<Vec<rdd_sge>> = list
            .iter()
            .map(|s| {
                if s.flags & RDD_SEND_INLINE != 0 {
                    vec![rdd_sge {
                        addr: s.data.as_ptr() as u64,
                        length: s.data.len() as u32,
                        lkey: 0,
                    }]
                } else {
                    s.sges
                        .iter()
                        .map(|g| rdd_sge {
                            addr: g.addr,
                            length: g.length,
                            lkey: g.lkey,
                        })
                        .collect()
                }
            })
            .collect();
        let wrs: Vec<rdd_ud_wr> = list
            .iter()
            .zip(&sgs)
            .map(|(s, sg)| rdd_ud_wr {
                wr: rdd_wr {
                    wr_id: 2,
                    sg_list: if sg.is_empty() { null() } else { sg.as_ptr() },
                    num_sge: sg.len() as u32,
                    opcode: s.opcode,
                    flags: s.flags & !RDD_SEND_DEFER_DOORBELL,
                    imm_data: if s.opcode == RDD_WR_SEND_WITH_IMM {
                        s.imm
                    } else {
                        0
                    },
                    remote_addr: 0x9000,
                    rkey: 3,
                    invalidate_rkey: 0,
                    compare_add: 0,
                    swap: 0,
                },
                av: self.c_av(s.av),
                remote_qpn: s.qpn,
                qkey: s.qkey,
            })
            .collect();
        let before = self.c.snapshot();
        let mut bad = usize::MAX;
        // SAFETY: a live handle; `wrs` and its SGE lists and inline data
        // are live locals.
        let got =
            unsafe { rdd_mlx5_sq_post_ud(&mut *self.h.sq, wrs.as_ptr(), wrs.len(), &mut bad) };
        // The core: each WR in turn until one is refused.
        let mut want = rdd_status::Ok;
        let mut want_bad = usize::MAX;
        for (i, (s, w)) in list.iter().zip(&wrs).enumerate() {
            let st = self.core_generic(s, &w.wr);
            if st != rdd_status::Ok {
                want = st;
                want_bad = i;
                break;
            }
        }
        assert_eq!((got, bad), (want, want_bad), "generic post");
        if got != rdd_status::Ok && want_bad == 0 {
            assert!(self.c.snapshot() == before, "a refused post wrote");
        }
        self.check("generic post");
    }

    /// The core's verdict on one generic UD request (posting it when it
    /// is accepted), with the checks the C layer makes before the core in
    /// their order: the flags and the opcode of the `rdd_wr` (the rest of
    /// its translation cannot fail for the requests `post` builds), then
    /// the address vector. The core itself refuses RDMA and atomics.
    fn core_generic(&mut self, s: &Send, wr: &rdd_wr) -> rdd_status {
        if wr.flags & !SendFlags::ALL.0 != 0 {
            return rdd_status::InvalidFlags;
        }
        let remote = Remote::new(wr.remote_addr, wr.rkey);
        let op = match wr.opcode {
            RDD_WR_RDMA_WRITE => SendOp::Write { remote },
            RDD_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm { remote, imm: 0 },
            RDD_WR_SEND => SendOp::Send,
            RDD_WR_SEND_WITH_IMM => SendOp::SendImm { imm: wr.imm_data },
            RDD_WR_RDMA_READ => SendOp::Read { remote },
            RDD_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
                remote,
                compare: 0,
                swap: 0,
            },
            RDD_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd { remote, add: 0 },
            RDD_WR_SEND_WITH_INV => SendOp::SendInv { rkey: 0 },
            _ => return rdd_status::InvalidOpcode,
        };
        let Some(av) = self.k_avs.get(s.av) else {
            return rdd_status::NullPointer;
        };
        let pieces = [s.data.as_slice()];
        let flags = SendFlags(wr.flags & !RDD_SEND_INLINE);
        let w = if wr.flags & RDD_SEND_INLINE != 0 {
            SendWr::inline(2, op, &pieces, flags)
        } else {
            SendWr {
                wr_id: 2,
                op,
                payload: Payload::Sges(&s.sges),
                flags,
            }
        };
        let dest = UdDest::new(av, s.qpn, s.qkey);
        // SAFETY: nothing executes the WQEs.
        match unsafe { self.sq.post_ud(&w, &dest) } {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    }

    fn ring(&mut self) {
        // SAFETY: a live handle.
        assert_eq!(unsafe { rdd_mlx5_sq_ring(&mut *self.h.sq) }, rdd_status::Ok);
        self.sq.ring();
        self.check("ring");
    }

    /// One SRQ receive on both sides.
    fn recv(&mut self, fsel: u8, len: u32) {
        let mut flags = 0;
        if fsel & 1 != 0 {
            flags |= RDD_SEND_DEFER_DOORBELL;
        }
        if fsel & 2 != 0 {
            flags |= 0x2;
        }
        let id = self.next_id;
        self.next_id += 1;
        let before = self.c.snapshot();
        // SAFETY: a live handle; the buffer is never written.
        let got = unsafe { rdd_mlx5_srq_recv(&mut *self.h.srq, id, 0x8000, len, 9, flags) };
        let want = if flags & !RDD_SEND_DEFER_DOORBELL != 0 {
            rdd_status::InvalidFlags
        } else {
            let s = [Sge::new(0x8000, len, 9)];
            // SAFETY: nothing executes the WQEs.
            match unsafe {
                self.srq.post(&RecvWr {
                    wr_id: id,
                    sges: &s,
                })
            } {
                Ok(()) => {
                    if flags == 0 {
                        self.srq.ring();
                    }
                    rdd_status::Ok
                }
                Err(e) => e.into(),
            }
        };
        assert_eq!(got, want, "srq receive");
        if got == rdd_status::Ok {
            self.outstanding.insert(id);
        } else {
            assert!(self.c.snapshot() == before, "a refused receive wrote");
        }
        self.check("srq receive");
    }

    /// A list of SRQ receives on both sides.
    fn recv_list(&mut self, lens: &[Vec<u32>]) {
        let first = self.next_id;
        self.next_id += lens.len() as u64;
        let sgs: Vec<Vec<rdd_sge>> = lens
            .iter()
            .map(|l| {
                l.iter()
                    .map(|&length| rdd_sge {
                        addr: 0x8000,
                        length,
                        lkey: 9,
                    })
                    .collect()
            })
            .collect();
        let wrs: Vec<rdd_recv_wr> = sgs
            .iter()
            .enumerate()
            .map(|(i, sg)| rdd_recv_wr {
                wr_id: first + i as u64,
                sg_list: if sg.is_empty() { null() } else { sg.as_ptr() },
                num_sge: sg.len() as u32,
                reserved: 0,
            })
            .collect();
        let mut bad = usize::MAX;
        // SAFETY: a live handle; live local requests.
        let got = unsafe { rdd_mlx5_srq_post(&mut *self.h.srq, wrs.as_ptr(), wrs.len(), &mut bad) };
        let mut want = (rdd_status::Ok, usize::MAX);
        for (i, l) in lens.iter().enumerate() {
            let s: Vec<Sge> = l.iter().map(|&n| Sge::new(0x8000, n, 9)).collect();
            let id = first + i as u64;
            // SAFETY: nothing executes the WQEs.
            match unsafe {
                self.srq.post(&RecvWr {
                    wr_id: id,
                    sges: &s,
                })
            } {
                Ok(()) => {
                    self.outstanding.insert(id);
                }
                Err(e) => {
                    want = (e.into(), i);
                    break;
                }
            }
        }
        self.srq.ring();
        assert_eq!((got, bad), want, "srq list");
        self.check("srq list");
    }

    fn srq_ring(&mut self) {
        // SAFETY: a live handle.
        assert_eq!(
            unsafe { rdd_mlx5_srq_ring(&mut *self.h.srq) },
            rdd_status::Ok
        );
        self.srq.ring();
        self.check("srq ring");
    }

    /// A responder CQE for SRQ WQE `counter` with SRQ field `key`, then a
    /// poll of `n` on both sides.
    fn complete(&mut self, counter: u16, key: u32, n: usize) {
        let mut cqe = [0u8; 64];
        cqe[32..36].copy_from_slice(&key.to_be_bytes());
        cqe[44..48].copy_from_slice(&16u32.to_be_bytes());
        cqe[56..60].copy_from_slice(&QPN.to_be_bytes());
        cqe[60..62].copy_from_slice(&counter.to_be_bytes());
        cqe[63] = 0x20;
        self.c.f.write_cqe(self.cqes, &cqe);
        self.k.f.write_cqe(self.cqes, &cqe);
        self.cqes += 1;
        let mut cw = vec![rdd_wc::default(); n.max(1)];
        let mut count = usize::MAX;
        // SAFETY: live handles and local outputs; no receive queue.
        let got = unsafe {
            rdd_mlx5_cq_poll_srq(
                &mut *self.h.cq,
                &mut *self.h.sq,
                null_mut(),
                &mut *self.h.srq,
                SRQN,
                cw.as_mut_ptr(),
                n,
                &mut count,
            )
        };
        let mut kw = vec![Wc::default(); n.max(1)];
        let polled = self.cq.poll(
            &mut Route {
                sq: &mut self.sq,
                rq: &mut self.qp_rq,
                srq: &mut self.srq,
            },
            &mut kw[..n],
        );
        match polled {
            Ok(k) => {
                assert_eq!((got, count), (rdd_status::Ok, k), "poll");
                for i in 0..k {
                    assert_eq!(cw[i].wr_id, kw[i].wr_id);
                    assert!(
                        self.outstanding.remove(&cw[i].wr_id),
                        "completion of receive {} that is not outstanding",
                        cw[i].wr_id
                    );
                }
            }
            Err(e) => {
                assert_eq!(got, rdd_status::from(e), "poll");
                assert_eq!(count, usize::MAX, "a failed poll wrote its count");
            }
        }
        self.check("poll");
    }

    /// The SRQ WQE index holding outstanding receive number `pick`
    /// (found by scanning the core's side table).
    fn outstanding_wqe(&self, pick: u16) -> Option<u16> {
        let posted: Vec<u32> = (0..NWQES)
            .filter(|&i| self.srq.slot_state(i).map(|s| s.state) == Some(SrqSlot::POSTED))
            .collect();
        if posted.is_empty() {
            return None;
        }
        Some(posted[pick as usize % posted.len()] as u16)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let Some(mut t) = build(r.u8()) else {
        return;
    };
    t.check("init");
    let mut ops = 0;
    while !r.is_empty() && ops < MAX_OPS {
        ops += 1;
        match r.u8() % 7 {
            0 => {
                let kind = r.u8() % 3;
                let s = read_send(&mut r, RDD_WR_SEND);
                t.send(kind, &s);
            }
            1 => {
                let n = r.u8() % 4;
                let list: Vec<Send> = (0..n)
                    .map(|_| {
                        let op = (r.u8() % 10) as u32;
                        read_send(&mut r, op)
                    })
                    .collect();
                t.post(&list);
            }
            2 => t.ring(),
            3 => {
                let fsel = r.u8();
                let len = send::read_len(&mut r);
                t.recv(fsel, len);
            }
            4 => {
                let n = r.u8() % 4;
                let lens: Vec<Vec<u32>> = (0..n)
                    .map(|_| {
                        let k = r.u8() % 5;
                        (0..k).map(|_| send::read_len(&mut r)).collect()
                    })
                    .collect();
                t.recv_list(&lens);
            }
            5 => t.srq_ring(),
            _ => {
                let c = r.u16();
                let ksel = r.u8();
                let n = (r.u8() % 5) as usize;
                let counter = if c & 0x8000 != 0 {
                    t.outstanding_wqe(c).unwrap_or(c & 0x7fff)
                } else {
                    c
                };
                let key = if ksel & 1 != 0 {
                    SRQN
                } else {
                    r.u32() & 0x00ff_ffff
                };
                t.complete(counter, key, n);
            }
        }
    }
    // SAFETY: live handles, finalised once.
    unsafe {
        assert_eq!(rdd_mlx5_sq_fini(&mut *t.h.sq), rdd_status::Ok);
        assert_eq!(rdd_mlx5_cq_fini(&mut *t.h.cq), rdd_status::Ok);
        assert_eq!(rdd_mlx5_srq_fini(&mut *t.h.srq), rdd_status::Ok);
    }
});
