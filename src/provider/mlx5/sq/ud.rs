//! Unreliable-datagram sends: the address vector an address handle holds
//! (`struct mlx5_wqe_av`, docs/spec/mlx5.md §3 "Datagram segment", §11)
//! and the UD WQE: control segment, the 48-byte datagram segment, then
//! data segments or one inline segment.
//!
//! A UD queue is built with [`SendQueue::from_raw_ud`]; it accepts only
//! [`SendQueue::post_ud`]. Its `limit` stays 0, so the RC post paths
//! (single posts, batches) refuse every WR on it before writing anything,
//! without a test of their own.

use super::wqe::Plan;
use super::{by_shape, SendQueue, WrSlot};
use crate::error::{Error, Result};
use crate::provider::mlx5::layout::{opcode, Be16, Be32, Mlx5dvQp, MAX_DS};
use crate::wr::{Payload, QpCaps, SendOp, SendWr};

use super::config::SqConfig;
use core::ptr::NonNull;

/// `MLX5_EXTENDED_UD_AV`: set in `dqp_dct` of every UD datagram segment.
pub const EXTENDED_UD_AV: u32 = 0x8000_0000;
/// Bit 30 of `grh_gid_fl`: a GRH is sent (InfiniBand only).
pub const AV_GRH: u32 = 1 << 30;
/// Octowords before a UD WQE's data: control (1) + datagram (3).
pub const UD_HDR_DS: u32 = 4;
/// A WR's qkey with bit 31 set tells the HCA to use the QP's own qkey
/// (IBA vol. 1 chapter 10, "controlled" Q_Keys; docs/spec/mlx5.md §11);
/// the data path copies it as is.
pub const QP_QKEY: u32 = 0x8000_0000;

/// The mlx5 address vector (`struct mlx5_wqe_av` of rdma-core's
/// `providers/mlx5/mlx5dv.h`), big-endian fields; docs/spec/mlx5.md §3.
/// An address handle holds one; every UD WQE carries a copy with the
/// destination QP and qkey filled in. Aligned to 8 as in C, where the
/// first 8 bytes are a union with the 64-bit DC key.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mlx5Av {
    /// Q_Key (UD).
    pub qkey: Be32,
    /// Reserved (the upper half of the DC key).
    pub reserved: Be32,
    /// Destination QP number | [`EXTENDED_UD_AV`].
    pub dqp_dct: Be32,
    /// Static rate (bits 7..4) and SL (IB: bits 3..0; RoCE: bits 3..1).
    pub stat_rate_sl: u8,
    /// Source path bits (bits 6..0, IB).
    pub fl_mlid: u8,
    /// Remote LID (IB) or the UDP source port (RoCE v2).
    pub rlid: Be16,
    /// Reserved.
    pub reserved0: [u8; 4],
    /// Destination MAC (RoCE).
    pub rmac: [u8; 6],
    /// Traffic class.
    pub tclass: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// [`AV_GRH`] | SGID index (bits 27..20) | flow label (bits 19..0).
    pub grh_gid_fl: Be32,
    /// Destination GID.
    pub rgid: [u8; 16],
}

static_assertions::assert_eq_size!(Mlx5Av, [u8; 48]);
static_assertions::const_assert_eq!(core::mem::align_of::<Mlx5Av>(), 8);
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(Mlx5Av, qkey) == 0 && offset_of!(Mlx5Av, reserved) == 4);
    assert!(offset_of!(Mlx5Av, dqp_dct) == 8 && offset_of!(Mlx5Av, stat_rate_sl) == 12);
    assert!(offset_of!(Mlx5Av, fl_mlid) == 13 && offset_of!(Mlx5Av, rlid) == 14);
    assert!(offset_of!(Mlx5Av, reserved0) == 16 && offset_of!(Mlx5Av, rmac) == 20);
    assert!(offset_of!(Mlx5Av, tclass) == 26 && offset_of!(Mlx5Av, hop_limit) == 27);
    assert!(offset_of!(Mlx5Av, grh_gid_fl) == 28 && offset_of!(Mlx5Av, rgid) == 32);
};

/// The global route of an address (`struct ibv_global_route`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalRoute {
    /// Destination GID (memory order).
    pub dgid: [u8; 16],
    /// Source GID table index.
    pub sgid_index: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// The port's link layer, and for Ethernet the RoCE version of the GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: LID routed, GRH optional.
    InfiniBand,
    /// RoCE v1 (`IB_ROCE_V1` GID): the MAC and the GRH fields.
    RoceV1 {
        /// Destination MAC (as the kernel resolved it).
        dmac: [u8; 6],
    },
    /// RoCE v2 (`ROCE_V2` GID): as v1, and the UDP source port, derived
    /// from the flow label, in `rlid`.
    RoceV2 {
        /// Destination MAC (as the kernel resolved it).
        dmac: [u8; 6],
    },
}

/// What an address vector is built from (`struct ibv_ah_attr` as the
/// data path needs it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Link layer of the port.
    pub link: LinkLayer,
    /// Destination LID (IB).
    pub dlid: u16,
    /// Service level (4 bits on IB, 3 on RoCE).
    pub sl: u8,
    /// Source path bits (7 bits, IB).
    pub src_path_bits: u8,
    /// The mlx5 static-rate code (0: port rate); the translation from
    /// `enum ibv_rate` belongs to the control path.
    pub mlx5_rate: u8,
    /// The global route, if any (required on RoCE).
    pub grh: Option<GlobalRoute>,
}

/// The RoCE v2 UDP source port for a flow label (libibverbs'
/// `ibv_flow_label_to_udp_sport`, docs/spec/mlx5.md §11).
#[inline]
pub const fn flow_label_to_udp_sport(fl: u32) -> u16 {
    (((fl & 0x3fff) ^ ((fl & 0xfffff) >> 14)) | 0xc000) as u16
}

impl Mlx5Av {
    /// Builds the address vector as `mlx5_create_ah` does
    /// (docs/spec/mlx5.md §11). Refused with [`Error::InvalidAttribute`]:
    /// a rate code above 15, a flow label wider than 20 bits, RoCE
    /// without a global route, and RoCE v2 with flow label 0 (libmlx5
    /// picks a random port there; the caller must choose one).
    pub fn new(a: &AhAttr) -> Result<Mlx5Av> {
        if a.mlx5_rate > 15 {
            return Err(Error::InvalidAttribute);
        }
        let mut av = Mlx5Av::default();
        match a.link {
            LinkLayer::InfiniBand => {
                av.fl_mlid = a.src_path_bits & 0x7f;
                av.rlid = Be16::new(a.dlid);
                av.stat_rate_sl = a.mlx5_rate << 4 | (a.sl & 0xf);
            }
            LinkLayer::RoceV1 { dmac } | LinkLayer::RoceV2 { dmac } => {
                av.stat_rate_sl = a.mlx5_rate << 4 | (a.sl & 7) << 1;
                av.rmac = dmac;
                let Some(g) = a.grh else {
                    return Err(Error::InvalidAttribute);
                };
                if let LinkLayer::RoceV2 { .. } = a.link {
                    if g.flow_label == 0 {
                        return Err(Error::InvalidAttribute);
                    }
                    av.rlid = Be16::new(flow_label_to_udp_sport(g.flow_label));
                }
            }
        }
        if let Some(g) = a.grh {
            if g.flow_label >> 20 != 0 {
                return Err(Error::InvalidAttribute);
            }
            let grh = if a.link == LinkLayer::InfiniBand {
                AV_GRH
            } else {
                0
            };
            av.tclass = g.traffic_class;
            av.hop_limit = g.hop_limit;
            av.grh_gid_fl = Be32::new(grh | (g.sgid_index as u32) << 20 | g.flow_label);
            av.rgid = g.dgid;
        }
        Ok(av)
    }
}

/// Where one UD send goes: the address handle's vector, the destination
/// QP and the qkey (`wr.ud` of `struct ibv_send_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest<'a> {
    /// The address handle's vector.
    pub av: &'a Mlx5Av,
    /// Destination QP number (24 bits).
    pub remote_qpn: u32,
    /// Q_Key, or [`QP_QKEY`] for the QP's own.
    pub qkey: u32,
}

impl<'a> UdDest<'a> {
    /// A destination with a per-WR qkey.
    pub const fn new(av: &'a Mlx5Av, remote_qpn: u32, qkey: u32) -> UdDest<'a> {
        UdDest {
            av,
            remote_qpn,
            qkey,
        }
    }
    /// A destination that uses the QP's qkey ([`QP_QKEY`]).
    pub const fn with_qp_qkey(av: &'a Mlx5Av, remote_qpn: u32) -> UdDest<'a> {
        UdDest::new(av, remote_qpn, QP_QKEY)
    }
}

/// Size of the largest UD WQE for `caps`, in octowords.
const fn max_ds_ud(caps: &QpCaps) -> u32 {
    let sge = caps.max_send_sge;
    let inl = (4 + caps.max_inline_data).div_ceil(16);
    UD_HDR_DS + if sge > inl { sge } else { inl }
}

impl SendQueue {
    /// Wraps the send queue of a UD QP. As [`SendQueue::from_raw`]; the
    /// queue accepts only [`SendQueue::post_ud`] (and the drain marker).
    ///
    /// # Safety
    /// As for [`SendQueue::from_raw`].
    pub unsafe fn from_raw_ud(
        qp: &Mlx5dvQp,
        qpn: u32,
        caps: QpCaps,
        cfg: SqConfig,
        wrid: NonNull<WrSlot>,
        wrid_len: usize,
    ) -> Result<SendQueue> {
        let mds = max_ds_ud(&caps);
        if mds > MAX_DS || mds.div_ceil(4) > qp.sq_wqe_cnt {
            return Err(Error::InvalidGeometry);
        }
        // SAFETY: forwarded contract.
        let mut sq = unsafe { SendQueue::from_raw(qp, qpn, caps, cfg, wrid, wrid_len) }?;
        let cnt = sq.wqe_cnt;
        sq.ud = true;
        sq.limit = 0;
        // The guard keeps the largest (UD) WQE placeable (docs/spec/mlx5.md §9).
        sq.guard = (cnt / 2).min(cnt - mds.div_ceil(4)).max(1);
        Ok(sq)
    }

    /// True for a queue built by [`SendQueue::from_raw_ud`].
    #[inline]
    pub fn is_ud(&self) -> bool {
        self.ud
    }

    /// Formats one UD send WQE (SEND or SEND_WITH_IMM, SGEs or inline) to
    /// `dest` at the producer position without ringing the doorbell; call
    /// [`SendQueue::ring`] after one or more posts.
    ///
    /// Errors (nothing is written, the queue is unchanged):
    /// [`Error::InvalidAttribute`] on a queue that is not UD (an RC WR
    /// with an address handle); [`Error::Unsupported`] for any opcode but
    /// SEND and SEND_WITH_IMM (RDMA and atomics do not exist on UD);
    /// [`Error::InvalidQpn`] for a destination QPN wider than 24 bits; the
    /// validation errors of [`crate::wr::validate_send`];
    /// [`Error::SqFull`]; [`Error::InvalidQpState`].
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    pub unsafe fn post_ud(&mut self, wr: &SendWr<'_>, dest: &UdDest<'_>) -> Result<()> {
        // SAFETY: forwarded contract.
        by_shape!(wr, unsafe { self.post_ud_shaped(wr, dest) })
    }

    /// [`SendQueue::post_ud`] for one shape (see [`by_shape`]): compiled
    /// once per common shape, so a one-SGE or inline SEND gets
    /// straight-line code.
    ///
    /// # Safety
    /// As for [`SendQueue::post`].
    #[inline(always)]
    unsafe fn post_ud_shaped(&mut self, wr: &SendWr<'_>, dest: &UdDest<'_>) -> Result<()> {
        if !self.ud {
            return Err(Error::InvalidAttribute);
        }
        let (mlx_op, imm) = match wr.op {
            SendOp::Send => (opcode::SEND, 0),
            SendOp::SendImm { imm } => (opcode::SEND_IMM, imm),
            _ => return Err(Error::Unsupported),
        };
        if dest.remote_qpn >> 24 != 0 {
            return Err(Error::InvalidQpn);
        }
        let shape = crate::wr::validate_send(wr, &self.caps)?;
        let data_ds = if shape.inline {
            if shape.inline_len == 0 {
                0
            } else {
                (4 + shape.inline_len).div_ceil(16)
            }
        } else {
            shape.data_sges
        };
        // Capabilities bound DS by MAX_DS (checked at construction).
        let ds = UD_HDR_DS + data_ds;
        let plan = Plan {
            mlx_op,
            hdr_ds: UD_HDR_DS,
            imm,
            ds,
            nbb: ds.div_ceil(4),
            flag_ix: (wr.flags.0 & 0xf) as u8,
            shape,
        };
        let pi = self.pi;
        let end = pi.wrapping_add(plan.nbb);
        let limit = if self.state.can_send() {
            self.wqe_cnt
        } else {
            0
        };
        // As in the RC path: the distance fits an i32.
        if (self.retired.wrapping_add(limit).wrapping_sub(end) as i32) < 0 {
            return Err(if self.state.can_send() {
                Error::SqFull
            } else {
                Error::InvalidQpState
            });
        }
        let o = pi << 2;
        // SAFETY: octoword `o` (masked) begins a free BB of the ring (space
        // check); the control and datagram segments fill exactly that BB,
        // every later octoword is masked into the ring by `octo`; all
        // stores are aligned (16-byte segment boundaries).
        unsafe {
            let base = self.octo(o);
            let ctrl = base.cast::<u32>();
            ctrl.write(Be32::new((pi & 0xffff) << 8 | mlx_op as u32).raw());
            ctrl.add(1).write(self.qpn_raw | ds.to_be());
            ctrl.add(2).write(self.fm_word(&plan));
            ctrl.add(3).write(imm.to_be());
            let mut av = *dest.av;
            av.qkey = Be32::new(dest.qkey);
            av.reserved = Be32::new(0);
            av.dqp_dct = Be32::new(dest.remote_qpn | EXTENDED_UD_AV);
            base.add(16).cast::<Mlx5Av>().write(av);
            match wr.payload {
                Payload::Sges(sges) => {
                    let mut k = UD_HDR_DS;
                    for s in sges {
                        if s.length != 0 {
                            let d = self.octo(o.wrapping_add(k)).cast::<u32>();
                            d.write(s.length.to_be());
                            d.add(1).write(s.lkey.to_be());
                            d.add(2).cast::<u64>().write(s.addr.to_be());
                            k += 1;
                        }
                    }
                }
                Payload::Inline(pieces) => {
                    if shape.inline_len != 0 {
                        self.write_inline(
                            self.octo(o.wrapping_add(UD_HDR_DS)),
                            shape.inline_len,
                            pieces,
                        );
                    }
                }
            }
        }
        let wrid = self.wrid.as_ptr();
        let mask = self.mask;
        // SAFETY: masked indexes < wqe_cnt <= wrid_len (constructor); the
        // entries are this queue's and the BBs are free.
        unsafe {
            self.set_slot(wrid.add((pi & mask) as usize), wr.wr_id, &plan, pi);
            for k in 1..plan.nbb {
                wrid.add((pi.wrapping_add(k) & mask) as usize)
                    .write(WrSlot::default());
            }
        }
        self.pi = end;
        if self.user_sig(&plan) {
            self.last_signaled_end = end;
        }
        self.batch += 1;
        self.last_start = pi;
        self.last_inline = shape.inline;
        Ok(())
    }
}
