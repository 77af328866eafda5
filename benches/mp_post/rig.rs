//! The rig: the device modes, the two variants, and the QPs and buffers
//! of one run.

use rdma_direct::api::{Access, ConnectAttr, Cq, Device, Mr, Pd, Qp, QpInit};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::Error;

use crate::{Dev, MSG};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Step,
    Thread,
    Fill,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Step => "step",
            Mode::Thread => "thread",
            Mode::Fill => "fill",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    Spin,
    LockFree,
}

/// The sending QP `a` (not yet wrapped), its CQ, the peer and buffers.
pub(crate) struct Rig {
    pub(crate) dev: Device<Dev>,
    pub(crate) a: Qp<Dev>,
    pub(crate) cq: Cq<Dev>,
    /// The peer; RDMA WRITEs need no receives, so it is never polled.
    _b: Qp<Dev>,
    _peer_cq: Cq<Dev>,
    pub(crate) src: Mr<Dev>,
    pub(crate) dst: Mr<Dev>,
    _pd: Pd<Dev>,
}

pub(crate) fn rig(depth: u32, producers: usize) -> Result<Rig, String> {
    let e = |what: &'static str| move |err: Error| format!("{what}: {err}");
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let init = |send: u32| QpInit {
        max_send_wr: send,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    // Sized by the CQ guard's worst case (every WR the queues hold).
    let cq = dev
        .create_cq(dev.cq_depth_for(&[&init(depth)]))
        .map_err(e("create_cq"))?;
    let peer_cq = dev
        .create_cq(dev.cq_depth_for(&[&init(16)]))
        .map_err(e("create_cq"))?;
    let mut a = pd
        .create_qp(&cq, &cq, &init(depth))
        .map_err(e("create_qp"))?;
    let mut b = pd
        .create_qp(&peer_cq, &peer_cq, &init(16))
        .map_err(e("create_qp"))?;
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &ConnectAttr::default())
        .map_err(e("connect"))?;
    b.connect(
        &ia,
        &ConnectAttr {
            access: Access::REMOTE_WRITE,
            ..Default::default()
        },
    )
    .map_err(e("connect"))?;
    let len = MSG as usize * producers;
    let mut src = pd.register(len, Access::NONE).map_err(e("register"))?;
    for (p, chunk) in src.as_mut_slice().chunks_mut(MSG as usize).enumerate() {
        chunk.copy_from_slice(&(0x5eed_0000_0000_0000u64 | p as u64).to_le_bytes());
    }
    let dst = pd
        .register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e("register"))?;
    Ok(Rig {
        dev,
        a,
        cq,
        _b: b,
        _peer_cq: peer_cq,
        src,
        dst,
        _pd: pd,
    })
}
