//! The SRQ rig the tests share: one software device, requester QPs on one
//! CQ, responder QPs attached to one SRQ on another, connected in pairs.

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};

pub(crate) type B = SoftDevice;

pub(crate) const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);

pub(crate) struct Rig {
    pub(crate) dev: Device<B>,
    pub(crate) pd: Pd<B>,
    /// Requesters (own RQs, unused).
    pub(crate) a: Vec<Qp<B>>,
    /// Responders, on `srq`.
    pub(crate) b: Vec<Qp<B>>,
    pub(crate) cqa: Cq<B>,
    pub(crate) cqb: Cq<B>,
    pub(crate) srq: Srq<B>,
}

pub(crate) fn small_init() -> QpInit {
    QpInit {
        max_send_wr: 16,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    }
}

/// `pairs` connected pairs; the responders share an SRQ of `srq_wr`
/// receives of `srq_sge` entries. `rnr_retry` is the requesters' (7 =
/// forever).
pub(crate) fn rig(pairs: usize, srq_wr: u32, srq_sge: u32, rnr_retry: u8) -> Rig {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().unwrap();
    let srq = pd.create_srq(srq_wr, srq_sge).unwrap();
    let ia = small_init();
    let ib = QpInit {
        srq: Some(srq.id()),
        ..small_init()
    };
    let da = dev.cq_depth_for(&vec![&ia; pairs]);
    let db = dev.cq_depth_for(&vec![&ib; pairs]) + srq.max_wr();
    let cqa = dev.create_cq(da).unwrap();
    let cqb = dev.create_cq(db).unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..pairs {
        let mut qa = pd.create_qp(&cqa, &cqa, &ia).unwrap();
        let mut qb = pd.create_qp(&cqb, &cqb, &ib).unwrap();
        let (na, nb) = (qa.info(), qb.info());
        let attr_a = ConnectAttr {
            rnr_retry,
            ..Default::default()
        };
        let attr_b = ConnectAttr {
            access: Access::REMOTE_WRITE,
            ..Default::default()
        };
        qa.connect(&nb, &attr_a).unwrap();
        qb.connect(&na, &attr_b).unwrap();
        a.push(qa);
        b.push(qb);
    }
    Rig {
        dev,
        pd,
        a,
        b,
        cqa,
        cqb,
        srq,
    }
}

impl Rig {
    pub(crate) fn run(&self) {
        self.dev.backend().run_until_idle(256);
    }

    /// Polls the requesters' CQ dry.
    pub(crate) fn poll_a(&mut self) -> Vec<Wc> {
        let mut all = Vec::new();
        let mut refs: Vec<&mut Qp<B>> = self.a.iter_mut().collect();
        let mut wc = [Wc::default(); 32];
        loop {
            let n = self.cqa.poll(&mut refs[..], &mut wc).unwrap();
            all.extend_from_slice(&wc[..n]);
            if n == 0 {
                return all;
            }
        }
    }

    /// Polls the responders' CQ dry, through the SRQ's route.
    pub(crate) fn poll_b(&mut self) -> Vec<Wc> {
        let mut all = Vec::new();
        let mut refs: Vec<&mut Qp<B>> = self.b.iter_mut().collect();
        let mut wc = [Wc::default(); 32];
        loop {
            let n = self
                .cqb
                .poll(&mut self.srq.route(&mut refs[..]), &mut wc)
                .unwrap();
            all.extend_from_slice(&wc[..n]);
            if n == 0 {
                return all;
            }
        }
    }

    /// Every pending asynchronous event.
    pub(crate) fn events(&self) -> Vec<AsyncEvent> {
        let mut v = Vec::new();
        while let Some(e) = self.dev.poll_async_event().unwrap() {
            v.push(e);
        }
        v
    }
}

/// A deterministic xorshift64* generator (no new dependency).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
