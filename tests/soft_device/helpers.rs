//! The two-QP rig the tests share: a connected pair on one software
//! device, its polling helpers and the MR fill pattern.

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};

pub(crate) type Dev = Device<SoftDevice>;

pub(crate) struct Pair {
    pub(crate) dev: Dev,
    pub(crate) pd: Pd<SoftDevice>,
    pub(crate) a: Qp<SoftDevice>,
    pub(crate) b: Qp<SoftDevice>,
    pub(crate) cqa: Cq<SoftDevice>,
    pub(crate) cqb: Cq<SoftDevice>,
}

pub(crate) fn pair_with(
    cfg: SoftConfig,
    cq_depth: u32,
    attr_a: ConnectAttr,
    attr_b: ConnectAttr,
) -> Pair {
    let dev = Device::new(SoftDevice::new(cfg));
    let pd = dev.alloc_pd().unwrap();
    let cqa = dev.create_cq(cq_depth).unwrap();
    let cqb = dev.create_cq(cq_depth).unwrap();
    // Several tests use small CQs on purpose (overrun, RNR, 128-byte CQE
    // wrap) and keep their completions below the CQ depth themselves: the
    // documented opt-out from the sizing guard.
    cqa.set_unguarded(true);
    cqb.set_unguarded(true);
    let mut a = pd.create_qp(&cqa, &cqa, &QpInit::default()).unwrap();
    let mut b = pd.create_qp(&cqb, &cqb, &QpInit::default()).unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr_a).unwrap();
    b.connect(&ia, &attr_b).unwrap();
    Pair {
        dev,
        pd,
        a,
        b,
        cqa,
        cqb,
    }
}

pub(crate) fn pair() -> Pair {
    let all = ConnectAttr {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..Default::default()
    };
    pair_with(SoftConfig::default(), 256, all, all)
}

impl Pair {
    pub(crate) fn run(&self) {
        self.dev.backend().run_until_idle(64);
    }
    pub(crate) fn poll_a(&mut self) -> Vec<Wc> {
        let mut wc = [Wc::default(); 64];
        let n = self.cqa.poll(&mut self.a, &mut wc).unwrap();
        wc[..n].to_vec()
    }
    pub(crate) fn poll_b(&mut self) -> Vec<Wc> {
        let mut wc = [Wc::default(); 64];
        let n = self.cqb.poll(&mut self.b, &mut wc).unwrap();
        wc[..n].to_vec()
    }
}

pub(crate) const RW: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

pub(crate) fn fill(mr: &mut Mr<SoftDevice>, seed: u8) {
    for (i, b) in mr.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8).wrapping_mul(31);
    }
}
