//! The environment of `submit_ops`: one software device with the
//! service's QP connected to a peer, a source and a target region, and the
//! descriptors the target builds from its input (valid, refused by the
//! submission, or refused by the device).

use std::ptr::{null, null_mut};

use rdma_direct::ffi::object::*;
use rdma_direct::ffi::status::rdd_status;
use rdma_direct::ffi::submit::rdd_submit_desc;
use rdma_direct::ffi::wr::*;
use rdma_direct_fuzz::pattern;

use super::{MR_LEN, OFF_RANGE};

pub(crate) fn ok(s: rdd_status, what: &str) {
    assert_eq!(s, rdd_status::Ok, "{what}");
}

/// The device, its QPs and regions.
pub(crate) struct Env {
    pub(crate) dev: *mut rdd_device,
    pub(crate) pd: *mut rdd_pd,
    /// The service QP's CQ, the peer's CQ.
    pub(crate) cq: [*mut rdd_cq; 2],
    /// The service's QP (NULL once destroyed), the peer.
    pub(crate) qp: *mut rdd_qp,
    pub(crate) peer: *mut rdd_qp,
    /// The service QP's handle value, kept after it is destroyed.
    pub(crate) qp_handle: *mut rdd_qp,
    pub(crate) mr: [*mut rdd_mr; 2],
    pub(crate) buf: [u64; 2],
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) max_inline: u32,
    pub(crate) connected: bool,
}

impl Env {
    pub(crate) fn new(cfg: u8) -> Env {
        let wrs = [1u32, 2, 4, 8, 16, 32, 64, 128];
        let inl = [0u32, 8, 32, 64];
        let init = rdd_qp_init {
            max_send_wr: wrs[((cfg >> 1) & 7) as usize],
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inl[((cfg >> 4) & 3) as usize],
            flags: 0,
        };
        let mut e = Env {
            dev: null_mut(),
            pd: null_mut(),
            cq: [null_mut(); 2],
            qp: null_mut(),
            peer: null_mut(),
            qp_handle: null_mut(),
            mr: [null_mut(); 2],
            buf: [0; 2],
            lkey: 0,
            rkey: 0,
            max_inline: 0,
            connected: false,
        };
        let all = RDD_ACCESS_LOCAL_WRITE | RDD_ACCESS_REMOTE_WRITE;
        // SAFETY: every out-parameter is a live local; `init` is a live
        // local struct.
        unsafe {
            ok(rdd_device_open_soft(null(), &mut e.dev), "open");
            ok(rdd_pd_alloc(e.dev, &mut e.pd), "pd");
            // Deep enough for the CQ guard (every send-queue basic block and
            // the receive): small CQs keep the buffers out of ASan's mmap
            // path, which costs page faults on every input.
            for c in &mut e.cq {
                ok(rdd_cq_create(e.dev, 4 * init.max_send_wr + 8, c), "cq");
            }
            ok(
                rdd_qp_create(e.pd, e.cq[0], e.cq[0], &init, &mut e.qp),
                "qp",
            );
            ok(
                rdd_qp_create(e.pd, e.cq[1], e.cq[1], &init, &mut e.peer),
                "peer",
            );
            e.qp_handle = e.qp;
            for i in 0..2 {
                ok(rdd_mr_reg(e.pd, MR_LEN as usize, all, &mut e.mr[i]), "mr");
                let mut a = null_mut();
                ok(rdd_mr_addr(e.mr[i], &mut a), "addr");
                e.buf[i] = a as u64;
                pattern::fill(
                    std::slice::from_raw_parts_mut(a.cast(), MR_LEN as usize),
                    i as u8,
                );
            }
            ok(rdd_mr_lkey(e.mr[0], &mut e.lkey), "lkey");
            ok(rdd_mr_rkey(e.mr[1], &mut e.rkey), "rkey");
            let mut caps = rdma_direct::ffi::mlx5::rdd_qp_caps::default();
            ok(rdd_qp_query_caps(e.qp, &mut caps), "caps");
            e.max_inline = caps.max_inline_data;
        }
        if cfg & 1 != 0 {
            e.connect();
        }
        e
    }

    pub(crate) fn connect(&mut self) {
        if self.connected || self.qp.is_null() {
            return;
        }
        let attr = rdd_connect_attr {
            access: RDD_ACCESS_REMOTE_WRITE,
            rnr_retry: 1,
            retry_cnt: 1,
            traffic_class: 0,
            sl: 0,
        };
        let (mut a, mut b) = (rdd_qp_info::default(), rdd_qp_info::default());
        // SAFETY: live handles and local out-parameters.
        unsafe {
            ok(rdd_qp_query_info(self.qp, &mut a), "info");
            ok(rdd_qp_query_info(self.peer, &mut b), "info");
            ok(rdd_qp_connect(self.qp, &b, &attr), "connect");
            ok(rdd_qp_connect(self.peer, &a, &attr), "connect");
        }
        self.connected = true;
    }

    pub(crate) fn step(&self, n: u8) {
        let mut work = 0;
        for _ in 0..n {
            // SAFETY: out-parameter is a local.
            ok(unsafe { rdd_device_step(self.dev, &mut work) }, "step");
        }
    }

    pub(crate) fn close(self) {
        if !self.qp.is_null() {
            ok(rdd_qp_destroy(self.qp), "destroy qp");
        }
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

/// A descriptor as the target builds it, and whether the submission must
/// refuse it (with that status) or the device must.
pub(crate) struct Built {
    pub(crate) d: rdd_submit_desc,
    pub(crate) refuse: Option<rdd_status>,
    pub(crate) bad: bool,
}

/// Builds a descriptor from its selectors (see the input format).
pub(crate) fn build(
    e: &Env,
    pool: &[u8],
    dsel: u8,
    inv: u8,
    len: u8,
    loff: u16,
    roff: u16,
) -> Built {
    let inline = dsel & 4 != 0;
    let mut len = (len % 72) as u32;
    let (mut loff, mut roff) = ((loff % OFF_RANGE) as u64, (roff % OFF_RANGE) as u64);
    let (mut bad_l, mut bad_r) = (dsel & 1 != 0, dsel & 2 != 0);
    if inline {
        // The payload is read from the pool: the lkey is ignored.
        bad_l = false;
        loff %= 2048;
        len = len.min(e.max_inline);
    }
    if len == 0 {
        // A zero-length WRITE touches nothing: keep it clearly valid.
        bad_l = false;
        bad_r = false;
        loff %= MR_LEN;
        roff %= MR_LEN;
    }
    let mut flags = 0;
    if inline {
        flags |= RDD_SEND_INLINE;
    }
    if dsel & 8 != 0 {
        flags |= RDD_SEND_SIGNALED;
    }
    if dsel & 0x10 != 0 {
        flags |= RDD_SEND_FENCE;
    }
    let mut d = rdd_submit_desc {
        wr_id: 0,
        local_addr: if inline {
            pool[loff as usize..].as_ptr() as u64
        } else {
            e.buf[0] + loff
        },
        remote_addr: e.buf[1] + roff,
        length: len,
        lkey: if bad_l { e.lkey ^ 0x100 } else { e.lkey },
        rkey: if bad_r { e.rkey ^ 0x100 } else { e.rkey },
        opcode: RDD_WR_RDMA_WRITE,
        flags,
        reserved: 0,
    };
    let out_of_range = roff + len as u64 > MR_LEN || (!inline && loff + len as u64 > MR_LEN);
    let refuse = match inv % 16 {
        10 => {
            d.opcode = RDD_WR_SEND;
            Some(rdd_status::InvalidOpcode)
        }
        11 => {
            d.flags |= RDD_SEND_SOLICITED;
            Some(rdd_status::InvalidFlags)
        }
        12 => {
            d.reserved = 1 + inv as u32;
            Some(rdd_status::InvalidArgument)
        }
        13 => {
            d.length = 0x8000_0000 | inv as u32;
            Some(rdd_status::LengthOverflow)
        }
        14 if inline => {
            d.local_addr = 0;
            d.length = d.length.max(1);
            Some(if d.length > e.max_inline {
                rdd_status::InlineTooLarge
            } else {
                rdd_status::NullPointer
            })
        }
        15 if inline => {
            d.length = e.max_inline + 1;
            Some(rdd_status::InlineTooLarge)
        }
        _ => None,
    };
    Built {
        d,
        refuse,
        bad: bad_l || bad_r || out_of_range,
    }
}
