//! `obj_ops`: the object level's per-opcode posts (`rdd_qp_write` ...
//! `rdd_qp_recv`, `RDD_SEND_DEFER_DOORBELL`, `rdd_qp_ring`) and its
//! one-handle poll (`rdd_cq_poll_n`) against the generic calls
//! (`rdd_qp_post_send` of the equivalent `rdd_wr`, `rdd_qp_post_recv`,
//! `rdd_cq_poll` with the QP list), on two software devices set up alike.
//!
//! Device A gets the per-opcode calls, device B the generic ones. B cannot
//! defer a doorbell, so it collects the equivalent `rdd_wr`s of A's
//! deferred sends and posts them as one list exactly when A rings (a send
//! without the deferral bit, a refused send followed by `rdd_qp_ring`, or
//! `rdd_qp_ring`): both queues then see the same WQEs, doorbells at the
//! same points and the same CQ headroom reservations. Receives go to B at
//! once (the receive queue has no doorbell-time rule, and A is rung before
//! every device step).
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! cfg    u8   bit 0: connect the QPs (else they stay in RESET); bit 1: the
//!             sender's send CQ is unguarded with depth 1 + depth % 32;
//!             bits 2-3: max_send_wr [1, 4, 8, 16]; bits 4-5: max_recv_wr
//! depth  u8
//! inl    u8   max_inline_data = inl % 65
//! ops... until the input ends (at most MAX_OPS):
//!   op u8 % 16: 0..=9 call number op (write, write_imm, read, send,
//!               send_imm, write_inline, send_inline, fetch_add, cmp_swap,
//!               recv); 10 ring; 11 step (steps u8 % 4 + 1, poll batch
//!               u8 % 17); 12 the call (k u8 % 10) on a bad handle (u8 % 4:
//!               NULL, destroyed, forged, a CQ's); 13..=15 call u8 % 10
//!   call: fsel u8 (bits 0-2 FENCE, SIGNALED, SOLICITED; bit 3 DEFER;
//!         bit 4 RDD_SEND_INLINE; bit 5 stray 0x10; bit 6 stray 0x20000000),
//!         wr_id u16, lsel u8 (< 200: % 72 bytes, < 240: 8, < 250:
//!         2^31 + lsel, else a raw u32), loff u16 % 4608, roff u16 % 4608,
//!         ksel u8 (bit 0 bad lkey, bit 1 bad rkey, bit 2 NULL inline
//!         data, bit 3 align roff to 8), imm u32, add u64, swap u64
//! ```
//!
//! Checked:
//! - every per-opcode call returns what `rdd_qp_post_send` (or
//!   `rdd_qp_post_recv`) returns for the equivalent `rdd_wr` on the twin
//!   QP; WRs B posts for A's accepted deferred ones are all accepted;
//! - flags the per-opcode calls do not take are `INVALID_FLAGS` (a stray
//!   bit is that for the generic post too), and a bad handle gives the
//!   generic call's status;
//! - after every sync point both QPs have rung the same number of doorbells
//!   and `rdd_qp_ring` never refuses;
//! - after device steps, `rdd_cq_poll_n` on A's CQs and `rdd_cq_poll` on
//!   B's return the same status, count and completions, and both devices'
//!   buffers hold the same bytes.
#![no_main]

use std::ptr::{null, null_mut};

use libfuzzer_sys::fuzz_target;
use rdma_direct::ffi::mlx5::rdd_wc;
use rdma_direct::ffi::object::*;
use rdma_direct::ffi::status::rdd_status;
use rdma_direct::ffi::wr::*;
use rdma_direct_fuzz::{pattern, Bytes};

/// Upper bound on operations per input.
const MAX_OPS: usize = 64;
/// Bytes of each registered region.
const MR_LEN: usize = 4096;
/// Offsets range a little past the region (the device fails those WRs).
const OFF_RANGE: u16 = 4608;
/// Bytes of the inline payload pool (offsets below 2048, lengths below
/// 2048 + 72: inside it).
const POOL: usize = 8192;

fn ok(s: rdd_status, what: &str) {
    assert_eq!(s, rdd_status::Ok, "{what}");
}

/// One device with a sending QP and its connected peer.
struct Side {
    dev: *mut rdd_device,
    pd: *mut rdd_pd,
    /// Sender's send CQ, sender's receive CQ, the peer's CQ.
    cq: [*mut rdd_cq; 3],
    qp: *mut rdd_qp,
    peer: *mut rdd_qp,
    mr: [*mut rdd_mr; 2],
    buf: [*mut u8; 2],
    lkey: u32,
    rkey: u32,
    /// A QP handle that was destroyed.
    dead: *mut rdd_qp,
}

impl Side {
    fn new(cfg: u8, depth: u8, inl: u8) -> Side {
        let mut s = Side {
            dev: null_mut(),
            pd: null_mut(),
            cq: [null_mut(); 3],
            qp: null_mut(),
            peer: null_mut(),
            mr: [null_mut(); 2],
            buf: [null_mut(); 2],
            lkey: 0,
            rkey: 0,
            dead: null_mut(),
        };
        let wrs = [1u32, 4, 8, 16];
        let init = rdd_qp_init {
            max_send_wr: wrs[((cfg >> 2) & 3) as usize],
            max_recv_wr: wrs[((cfg >> 4) & 3) as usize],
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: (inl % 65) as u32,
            flags: 0,
        };
        let all = RDD_ACCESS_LOCAL_WRITE
            | RDD_ACCESS_REMOTE_WRITE
            | RDD_ACCESS_REMOTE_READ
            | RDD_ACCESS_REMOTE_ATOMIC;
        // SAFETY: every out-parameter is a live local; `init` is a live
        // local struct.
        unsafe {
            ok(rdd_device_open_soft(null(), &mut s.dev), "open");
            ok(rdd_pd_alloc(s.dev, &mut s.pd), "pd");
            let unguarded = cfg & 2 != 0;
            let d0 = if unguarded {
                1 + (depth % 32) as u32
            } else {
                128
            };
            ok(rdd_cq_create(s.dev, d0, &mut s.cq[0]), "cq");
            if unguarded {
                ok(rdd_cq_set_unguarded(s.cq[0], 1), "unguarded");
            }
            ok(rdd_cq_create(s.dev, 128, &mut s.cq[1]), "cq");
            ok(rdd_cq_create(s.dev, 128, &mut s.cq[2]), "cq");
            ok(
                rdd_qp_create(s.pd, s.cq[0], s.cq[1], &init, &mut s.qp),
                "qp",
            );
            ok(
                rdd_qp_create(s.pd, s.cq[2], s.cq[2], &init, &mut s.peer),
                "peer",
            );
            ok(
                rdd_qp_create(s.pd, s.cq[2], s.cq[2], &init, &mut s.dead),
                "dead",
            );
            ok(rdd_qp_destroy(s.dead), "destroy");
            for i in 0..2 {
                ok(rdd_mr_reg(s.pd, MR_LEN, all, &mut s.mr[i]), "mr");
                let mut a = null_mut();
                ok(rdd_mr_addr(s.mr[i], &mut a), "addr");
                s.buf[i] = a.cast();
                // The device writes these buffers only inside `step`.
                pattern::fill(std::slice::from_raw_parts_mut(s.buf[i], MR_LEN), i as u8);
            }
            ok(rdd_mr_lkey(s.mr[0], &mut s.lkey), "lkey");
            ok(rdd_mr_rkey(s.mr[1], &mut s.rkey), "rkey");
            if cfg & 1 != 0 {
                let attr = rdd_connect_attr {
                    access: all & !RDD_ACCESS_LOCAL_WRITE,
                    rnr_retry: 1,
                    retry_cnt: 1,
                    traffic_class: 0,
                    sl: 0,
                };
                let (mut a, mut b) = (rdd_qp_info::default(), rdd_qp_info::default());
                ok(rdd_qp_query_info(s.qp, &mut a), "info");
                ok(rdd_qp_query_info(s.peer, &mut b), "info");
                ok(rdd_qp_connect(s.qp, &b, &attr), "connect");
                ok(rdd_qp_connect(s.peer, &a, &attr), "connect");
            }
        }
        s
    }

    fn doorbells(&self) -> u64 {
        let mut n = 0;
        // SAFETY: out-parameter is a local.
        ok(unsafe { rdd_qp_doorbells(self.qp, &mut n) }, "doorbells");
        n
    }

    fn bytes(&self, i: usize) -> &[u8] {
        // SAFETY: the region's buffer, `MR_LEN` bytes, written by the
        // device only inside `step` (not running now).
        unsafe { std::slice::from_raw_parts(self.buf[i], MR_LEN) }
    }

    fn close(self) {
        ok(rdd_qp_destroy(self.qp), "destroy qp");
        ok(rdd_qp_destroy(self.peer), "destroy peer");
        for c in self.cq {
            ok(rdd_cq_destroy(c), "destroy cq");
        }
        for m in self.mr {
            ok(rdd_mr_free(m), "free mr");
        }
        ok(rdd_pd_free(self.pd), "free pd");
        ok(rdd_device_close(self.dev), "close");
    }
}

/// One per-opcode call's operands.
#[derive(Clone, Copy, Debug)]
struct Call {
    k: u8,
    flags: u32,
    wr_id: u64,
    len: u32,
    loff: u64,
    roff: u64,
    ksel: u8,
    imm: u32,
    add: u64,
    swap: u64,
}

fn read_call(r: &mut Bytes<'_>, k: u8) -> Call {
    let fsel = r.u8();
    let mut flags = (fsel & 7) as u32;
    if fsel & 0x08 != 0 {
        flags |= RDD_SEND_DEFER_DOORBELL;
    }
    if fsel & 0x10 != 0 {
        flags |= RDD_SEND_INLINE;
    }
    if fsel & 0x20 != 0 {
        flags |= 0x10;
    }
    if fsel & 0x40 != 0 {
        flags |= 0x2000_0000;
    }
    let wr_id = r.u16() as u64;
    let lsel = r.u8();
    let len = match lsel {
        0..=199 => (lsel % 72) as u32,
        200..=239 => 8,
        240..=249 => 0x8000_0000 + lsel as u32,
        _ => r.u32(),
    };
    let loff = (r.u16() % OFF_RANGE) as u64;
    let mut roff = (r.u16() % OFF_RANGE) as u64;
    let ksel = r.u8();
    if ksel & 8 != 0 {
        roff &= !7;
    }
    Call {
        k,
        flags,
        wr_id,
        len,
        loff,
        roff,
        ksel,
        imm: r.u32(),
        add: r.u64(),
        swap: r.u64(),
    }
}

/// The call's addresses and keys on side `s`, and the inline data.
struct Operands {
    laddr: u64,
    raddr: u64,
    lkey: u32,
    rkey: u32,
    data: *const u8,
    /// Inline length, kept inside the pool.
    ilen: u32,
}

fn operands(s: &Side, c: &Call, pool: &[u8]) -> Operands {
    let ilen = if c.len as usize <= 2048 + 72 {
        c.len
    } else {
        c.len % 2048
    };
    Operands {
        laddr: s.buf[0] as u64 + c.loff,
        raddr: s.buf[1] as u64 + c.roff,
        lkey: if c.ksel & 1 != 0 {
            s.lkey ^ 0x100
        } else {
            s.lkey
        },
        rkey: if c.ksel & 2 != 0 {
            s.rkey ^ 0x100
        } else {
            s.rkey
        },
        data: if c.ksel & 4 != 0 {
            null()
        } else {
            pool[(c.loff % 2048) as usize..].as_ptr()
        },
        ilen,
    }
}

/// The per-opcode call `c.k` on handle `qp` (flags as given).
fn call_op(qp: *mut rdd_qp, c: &Call, o: &Operands) -> rdd_status {
    let f = c.flags;
    let data = o.data.cast::<core::ffi::c_void>();
    // SAFETY: the addresses name the side's regions or a little past them
    // (checked by the device); inline data points into the pool with
    // `ilen` bytes readable, or is NULL.
    unsafe {
        match c.k {
            0 => rdd_qp_write(qp, c.wr_id, o.laddr, c.len, o.lkey, o.raddr, o.rkey, f),
            1 => rdd_qp_write_imm(
                qp, c.wr_id, o.laddr, c.len, o.lkey, o.raddr, o.rkey, c.imm, f,
            ),
            2 => rdd_qp_read(qp, c.wr_id, o.laddr, c.len, o.lkey, o.raddr, o.rkey, f),
            3 => rdd_qp_send(qp, c.wr_id, o.laddr, c.len, o.lkey, f),
            4 => rdd_qp_send_imm(qp, c.wr_id, o.laddr, c.len, o.lkey, c.imm, f),
            5 => rdd_qp_write_inline(qp, c.wr_id, data, o.ilen, o.raddr, o.rkey, f),
            6 => rdd_qp_send_inline(qp, c.wr_id, data, o.ilen, f),
            7 => rdd_qp_fetch_add(qp, c.wr_id, o.laddr, o.lkey, o.raddr, o.rkey, c.add, f),
            8 => rdd_qp_cmp_swap(
                qp, c.wr_id, o.laddr, o.lkey, o.raddr, o.rkey, c.add, c.swap, f,
            ),
            _ => rdd_qp_recv(qp, c.wr_id, o.laddr, c.len, o.lkey, f),
        }
    }
}

/// A generic send WR and the SGE it points at.
#[derive(Clone, Copy)]
struct GenWr {
    wr: rdd_wr,
    sge: rdd_sge,
}

/// The `rdd_wr` equivalent to send call `c` (flags as given, minus the
/// deferral bit, plus `RDD_SEND_INLINE` for the inline calls).
fn generic_wr(c: &Call, o: &Operands) -> GenWr {
    let (opcode, inline, atomic) = match c.k {
        0 => (RDD_WR_RDMA_WRITE, false, false),
        1 => (RDD_WR_RDMA_WRITE_WITH_IMM, false, false),
        2 => (RDD_WR_RDMA_READ, false, false),
        3 => (RDD_WR_SEND, false, false),
        4 => (RDD_WR_SEND_WITH_IMM, false, false),
        5 => (RDD_WR_RDMA_WRITE, true, false),
        6 => (RDD_WR_SEND, true, false),
        7 => (RDD_WR_ATOMIC_FETCH_AND_ADD, false, true),
        _ => (RDD_WR_ATOMIC_CMP_AND_SWP, false, true),
    };
    let sge = if inline {
        rdd_sge {
            addr: o.data as u64,
            length: o.ilen,
            lkey: 0,
        }
    } else {
        rdd_sge {
            addr: o.laddr,
            length: if atomic { 8 } else { c.len },
            lkey: o.lkey,
        }
    };
    let mut flags = c.flags & !RDD_SEND_DEFER_DOORBELL;
    if inline {
        flags |= RDD_SEND_INLINE;
    }
    let remote = !matches!(c.k, 3 | 4 | 6);
    GenWr {
        wr: rdd_wr {
            wr_id: c.wr_id,
            sg_list: null(),
            num_sge: 1,
            opcode,
            flags,
            imm_data: if matches!(c.k, 1 | 4) { c.imm } else { 0 },
            remote_addr: if remote { o.raddr } else { 0 },
            rkey: if remote { o.rkey } else { 0 },
            invalidate_rkey: 0,
            compare_add: if atomic { c.add } else { 0 },
            swap: if c.k == 8 { c.swap } else { 0 },
        },
        sge,
    }
}

/// Posts `list` on B's QP as one generic call; returns the status and the
/// bad index (`usize::MAX` if not written).
fn post_list(qp: *mut rdd_qp, list: &mut [GenWr]) -> (rdd_status, usize) {
    let wrs: Vec<rdd_wr> = list
        .iter()
        .map(|g| rdd_wr {
            sg_list: &g.sge,
            ..g.wr
        })
        .collect();
    let mut bad = usize::MAX;
    // SAFETY: live WRs whose SGEs live in `list`; inline SGEs point into
    // the pool with their length readable.
    let s = unsafe { rdd_qp_post_send(qp, wrs.as_ptr(), wrs.len(), &mut bad) };
    (s, bad)
}

/// Both devices, and B's collected WRs.
struct Twin {
    a: Side,
    b: Side,
    /// B's equivalents of A's deferred sends, not posted yet.
    pending: Vec<GenWr>,
}

impl Twin {
    /// A rang (or is about to ring): B posts what it collected; every WR
    /// must go, as each was accepted by A.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let (s, bad) = post_list(self.b.qp, &mut self.pending);
        assert_eq!(s, rdd_status::Ok, "B refused a WR A accepted (index {bad})");
        self.pending.clear();
    }

    /// Rings A and posts B's collection; both must have rung alike.
    fn sync(&mut self) {
        assert_eq!(
            rdd_qp_ring(self.a.qp),
            rdd_status::Ok,
            "rdd_qp_ring refused"
        );
        self.flush();
        assert_eq!(
            self.a.doorbells(),
            self.b.doorbells(),
            "doorbell counts differ"
        );
    }

    fn call(&mut self, c: &Call, pool: &[u8]) {
        let oa = operands(&self.a, c, pool);
        let ob = operands(&self.b, c, pool);
        let sa = call_op(self.a.qp, c, &oa);
        let allowed = if c.k == 9 {
            RDD_SEND_DEFER_DOORBELL
        } else {
            RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_DEFER_DOORBELL
        };
        if c.flags & !allowed != 0 {
            assert_eq!(sa, rdd_status::InvalidFlags, "{c:?}");
            // A stray bit is refused by the generic post as well.
            if c.k != 9 && c.flags & (0x10 | 0x2000_0000) != 0 {
                let mut one = [generic_wr(c, &ob)];
                let (sb, bad) = post_list(self.b.qp, &mut one);
                assert_eq!((sb, bad), (rdd_status::InvalidFlags, 0), "{c:?}");
            }
            return;
        }
        if c.k == 9 {
            let sge = rdd_sge {
                addr: ob.laddr,
                length: c.len,
                lkey: ob.lkey,
            };
            let r = rdd_recv_wr {
                wr_id: c.wr_id,
                sg_list: &sge,
                num_sge: 1,
                reserved: 0,
            };
            let mut bad = usize::MAX;
            // SAFETY: a live WR and SGE.
            let sb = unsafe { rdd_qp_post_recv(self.b.qp, &r, 1, &mut bad) };
            assert_eq!(sa, sb, "recv {c:?}");
            return;
        }
        self.pending.push(generic_wr(c, &ob));
        let defer = c.flags & RDD_SEND_DEFER_DOORBELL != 0;
        if sa == rdd_status::Ok {
            if !defer {
                self.flush();
                assert_eq!(
                    self.a.doorbells(),
                    self.b.doorbells(),
                    "doorbells after {c:?}"
                );
            }
            return;
        }
        // Refused: B posts its collection with this WR last; the ones
        // before it go, it is refused with A's status.
        let last = self.pending.len() - 1;
        let (sb, bad) = post_list(self.b.qp, &mut self.pending);
        assert_eq!((sb, bad), (sa, last), "send {c:?}");
        self.pending.clear();
        assert_eq!(
            rdd_qp_ring(self.a.qp),
            rdd_status::Ok,
            "rdd_qp_ring refused"
        );
        assert_eq!(
            self.a.doorbells(),
            self.b.doorbells(),
            "doorbells after {c:?}"
        );
    }

    fn bad_handle(&mut self, which: u8, c: &Call, pool: &[u8]) {
        let pick = |s: &Side| -> *mut rdd_qp {
            match which {
                0 => null_mut(),
                1 => s.dead,
                2 => 0x1234_5678_9abc_def5usize as *mut rdd_qp,
                _ => s.cq[0].cast(),
            }
        };
        let (ha, hb) = (pick(&self.a), pick(&self.b));
        let oa = operands(&self.a, c, pool);
        let ob = operands(&self.b, c, pool);
        let sa = call_op(ha, c, &oa);
        let sb = if c.k == 9 {
            let r = rdd_recv_wr {
                wr_id: 0,
                sg_list: null(),
                num_sge: 0,
                reserved: 0,
            };
            let mut bad = 0;
            // SAFETY: a live WR; the handle is never dereferenced.
            unsafe { rdd_qp_post_recv(hb, &r, 1, &mut bad) }
        } else {
            post_list(hb, &mut [generic_wr(c, &ob)]).0
        };
        assert_eq!(sa, sb, "bad handle {which} {c:?}");
        assert!(matches!(
            sa,
            rdd_status::NullParameter | rdd_status::InvalidHandle
        ));
    }

    fn step(&mut self, steps: u8, batch: u8) {
        self.sync();
        let mut work = 0;
        for _ in 0..steps {
            // SAFETY: out-parameters are locals.
            unsafe {
                ok(rdd_device_step(self.a.dev, &mut work), "step");
                ok(rdd_device_step(self.b.dev, &mut work), "step");
            }
        }
        let n = batch as usize;
        for (i, qps) in [
            (0, [self.a.qp, self.b.qp]),
            (1, [self.a.qp, self.b.qp]),
            (2, [self.a.peer, self.b.peer]),
        ] {
            let mut wa = vec![rdd_wc::default(); n.max(1)];
            let mut wb = vec![rdd_wc::default(); n.max(1)];
            // SAFETY: live arrays of at least `n` entries.
            let ra = unsafe { rdd_cq_poll_n(self.a.cq[i], wa.as_mut_ptr(), n as u32) };
            let mut cnt = 0usize;
            // SAFETY: live arrays and out-parameter; one QP per CQ.
            let sb = unsafe { rdd_cq_poll(self.b.cq[i], &qps[1], 1, wb.as_mut_ptr(), n, &mut cnt) };
            let rb = if sb == rdd_status::Ok {
                cnt as i32
            } else {
                -(sb as u32 as i32)
            };
            assert_eq!(ra, rb, "poll of CQ {i}");
            for k in 0..(ra.max(0) as usize) {
                let (mut x, mut y) = (wa[k], wb[k]);
                x.qp_num = 0;
                y.qp_num = 0;
                x.src_qp = 0;
                y.src_qp = 0;
                assert_eq!(x, y, "completion {k} of CQ {i}");
            }
            let _ = qps[0];
        }
        for i in 0..2 {
            assert!(self.a.bytes(i) == self.b.bytes(i), "region {i} differs");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Bytes::new(data);
    let (cfg, depth, inl) = (r.u8(), r.u8(), r.u8());
    let mut pool = vec![0u8; POOL];
    pattern::fill(&mut pool, 7);
    let mut t = Twin {
        a: Side::new(cfg, depth, inl),
        b: Side::new(cfg, depth, inl),
        pending: Vec::new(),
    };
    let mut n = 0;
    while !r.is_empty() && n < MAX_OPS {
        n += 1;
        let op = r.u8() % 16;
        match op {
            0..=9 => {
                let c = read_call(&mut r, op);
                t.call(&c, &pool);
            }
            10 => t.sync(),
            11 => {
                let (steps, batch) = (r.u8() % 4 + 1, r.u8() % 17);
                t.step(steps, batch);
            }
            12 => {
                let which = r.u8() % 4;
                let k = r.u8() % 10;
                let c = read_call(&mut r, k);
                t.bad_handle(which, &c, &pool);
            }
            _ => {
                let k = r.u8() % 10;
                let c = read_call(&mut r, k);
                t.call(&c, &pool);
            }
        }
    }
    t.step(2, 16);
    t.a.close();
    t.b.close();
});
