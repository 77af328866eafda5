//! Test helpers (feature `test-utils`): aligned queue memory standing in
//! for a device's, a WQE decoder that parses send WQEs back from ring
//! bytes independently of the encoder, and a CQE writer.
//!
//! Nothing here is used by the data path.

use std::ptr::NonNull;
use std::vec;
use std::vec::Vec;

use crate::provider::mlx5::layout::{opcode, Mlx5dvCq, Mlx5dvQp, INLINE_SEG, INVALID_LKEY};
use crate::provider::mlx5::{CompletionQueue, RecvQueue, SendQueue, SqConfig, WrSlot};
use crate::wr::QpCaps;

pub use crate::util::AlignedBuf;

/// The cross-process fabric's link ring and packet decoders, for the
/// `fabric_rx` fuzz target.
#[cfg(feature = "soft")]
pub use crate::soft::fabric::fuzzing as fabric;

/// Geometry of a fake mlx5 QP + CQ.
#[derive(Clone, Copy, Debug)]
pub struct FakeGeometry {
    /// SQ size in BBs.
    pub sq_wqe_cnt: u32,
    /// RQ entries.
    pub rq_wqe_cnt: u32,
    /// RQ stride (16 × max_recv_sge, power of two).
    pub rq_stride: u32,
    /// BlueFlame buffer size (0 = none).
    pub bf_size: u32,
    /// CQ entries.
    pub cqe_cnt: u32,
    /// CQE size (64 or 128).
    pub cqe_size: u32,
    /// QP number.
    pub qpn: u32,
    /// CQ number.
    pub cqn: u32,
}

impl Default for FakeGeometry {
    fn default() -> Self {
        FakeGeometry {
            sq_wqe_cnt: 64,
            rq_wqe_cnt: 16,
            rq_stride: 64,
            bf_size: 256,
            cqe_cnt: 64,
            cqe_size: 64,
            qpn: 0x1c5,
            cqn: 0x80,
        }
    }
}

/// Bytes of guard space after the SQ ring in [`FakeMlx5::qp_buf`], so tests
/// can prove nothing is written past the ring end.
pub const GUARD: usize = 256;

/// Memory standing in for one QP and one CQ of a device: the QP buffer
/// (RQ then SQ, as rdma-core lays it out), doorbell records, a doorbell
/// register pair, a CQ buffer and a UAR page.
pub struct FakeMlx5 {
    /// Geometry.
    pub geo: FakeGeometry,
    /// QP buffer: RQ at 0, SQ after it, then [`GUARD`] bytes.
    pub qp_buf: AlignedBuf,
    /// QP doorbell record (2 words) and CQ doorbell record (2 words, at +64).
    pub dbrec: AlignedBuf,
    /// Doorbell/BlueFlame register pair (2 × max(bf_size, 64) bytes).
    pub bf: AlignedBuf,
    /// CQ buffer.
    pub cq_buf: AlignedBuf,
    /// UAR page for CQ arming.
    pub uar: AlignedBuf,
    /// SQ side table.
    pub sq_wrid: Vec<WrSlot>,
    /// RQ side table.
    pub rq_wrid: Vec<u64>,
}

impl FakeMlx5 {
    /// Allocates zeroed memory for `geo` and marks every CQE invalid.
    pub fn new(geo: FakeGeometry) -> FakeMlx5 {
        let rq_bytes = (geo.rq_wqe_cnt * geo.rq_stride) as usize;
        let sq_bytes = (geo.sq_wqe_cnt * 64) as usize;
        let f = FakeMlx5 {
            geo,
            qp_buf: AlignedBuf::new(rq_bytes.next_multiple_of(64) + sq_bytes + GUARD),
            dbrec: AlignedBuf::new(128),
            bf: AlignedBuf::new(2 * geo.bf_size.max(64) as usize),
            cq_buf: AlignedBuf::new((geo.cqe_cnt * geo.cqe_size) as usize),
            uar: AlignedBuf::new(4096),
            sq_wrid: vec![WrSlot::default(); geo.sq_wqe_cnt as usize],
            rq_wrid: vec![0; geo.rq_wqe_cnt as usize],
        };
        // SAFETY: the buffer is ours and sized for cnt × size.
        unsafe { CompletionQueue::init_buffer(f.cq_buf.ptr(), geo.cqe_cnt, geo.cqe_size) };
        f
    }

    /// Byte offset of the SQ inside `qp_buf`.
    pub fn sq_offset(&self) -> usize {
        ((self.geo.rq_wqe_cnt * self.geo.rq_stride) as usize).next_multiple_of(64)
    }

    /// The SQ ring bytes.
    pub fn sq_bytes(&self) -> &[u8] {
        let o = self.sq_offset();
        &self.qp_buf.bytes()[o..o + (self.geo.sq_wqe_cnt * 64) as usize]
    }

    /// The RQ ring bytes.
    pub fn rq_bytes(&self) -> &[u8] {
        &self.qp_buf.bytes()[..(self.geo.rq_wqe_cnt * self.geo.rq_stride) as usize]
    }

    /// `mlx5dv_qp` fields for this memory.
    pub fn dv_qp(&self) -> Mlx5dvQp {
        Mlx5dvQp {
            dbrec: self.dbrec.ptr().cast(),
            // SAFETY: inside qp_buf.
            sq_buf: unsafe { self.qp_buf.ptr().add(self.sq_offset()) },
            sq_wqe_cnt: self.geo.sq_wqe_cnt,
            sq_stride: 64,
            rq_buf: self.qp_buf.ptr(),
            rq_wqe_cnt: self.geo.rq_wqe_cnt,
            rq_stride: self.geo.rq_stride,
            bf_reg: self.bf.ptr(),
            bf_size: self.geo.bf_size,
            ..Mlx5dvQp::EMPTY
        }
    }

    /// `mlx5dv_cq` fields for this memory.
    pub fn dv_cq(&self) -> Mlx5dvCq {
        Mlx5dvCq {
            buf: self.cq_buf.ptr(),
            // SAFETY: inside the 128-byte dbrec buffer.
            dbrec: unsafe { self.dbrec.ptr().add(64) }.cast(),
            cqe_cnt: self.geo.cqe_cnt,
            cqe_size: self.geo.cqe_size,
            cq_uar: self.uar.ptr(),
            cqn: self.geo.cqn,
            comp_mask: 0,
        }
    }

    /// Capabilities matching the geometry: `max_send_sge` SGEs, inline as
    /// rdma-core computes for a 256-byte WQE budget.
    pub fn caps(&self, max_send_sge: u32, max_inline: u32) -> QpCaps {
        QpCaps {
            max_send_sge,
            max_inline_data: max_inline,
            max_recv_sge: self.geo.rq_stride / 16,
        }
    }

    /// Builds the send queue. The fake must outlive it.
    pub fn send_queue(&mut self, caps: QpCaps, cfg: SqConfig) -> crate::Result<SendQueue> {
        let qp = self.dv_qp();
        let len = self.sq_wrid.len();
        // SAFETY: all memory is owned by `self`, which the caller keeps
        // alive; SGEs used by tests point at test-owned memory.
        unsafe {
            SendQueue::from_raw(
                &qp,
                self.geo.qpn,
                caps,
                cfg,
                NonNull::new(self.sq_wrid.as_mut_ptr()).unwrap(),
                len,
            )
        }
    }

    /// Builds the receive queue.
    pub fn recv_queue(&mut self, caps: QpCaps) -> crate::Result<RecvQueue> {
        let qp = self.dv_qp();
        let len = self.rq_wrid.len();
        // SAFETY: as for `send_queue`.
        unsafe {
            RecvQueue::from_raw(
                &qp,
                &caps,
                NonNull::new(self.rq_wrid.as_mut_ptr()).unwrap(),
                len,
            )
        }
    }

    /// Builds the CQ poller.
    pub fn completion_queue(&mut self) -> crate::Result<CompletionQueue> {
        let cq = self.dv_cq();
        // SAFETY: as for `send_queue`.
        unsafe { CompletionQueue::from_raw(&cq) }
    }

    /// Host-order SQ doorbell-record word.
    pub fn dbrec_sq(&self) -> u32 {
        // SAFETY: word 1 of the record.
        unsafe { crate::mmio::read_dbrec(self.dbrec.ptr().cast::<u32>().add(1)) }
    }
    /// Host-order RQ doorbell-record word.
    pub fn dbrec_rq(&self) -> u32 {
        // SAFETY: word 0 of the record.
        unsafe { crate::mmio::read_dbrec(self.dbrec.ptr().cast::<u32>()) }
    }
    /// Host-order CQ consumer-index word.
    pub fn dbrec_cq_ci(&self) -> u32 {
        // SAFETY: word 0 of the CQ record.
        unsafe { crate::mmio::read_dbrec(self.dbrec.ptr().add(64).cast::<u32>()) }
    }
    /// Host-order CQ arm word.
    pub fn dbrec_cq_arm(&self) -> u32 {
        // SAFETY: word 1 of the CQ record.
        unsafe { crate::mmio::read_dbrec(self.dbrec.ptr().add(64).cast::<u32>().add(1)) }
    }

    /// Writes a 64-byte CQE image at CQ slot `ci & (cnt-1)`: bytes 0..63
    /// are copied, then byte 63 (`op_own`) is published with the owner bit
    /// of pass `ci` set as hardware would (the given byte's bit 0 is
    /// replaced). For 128-byte CQEs the image goes to the second half.
    pub fn write_cqe(&mut self, ci: u32, cqe: &[u8; 64]) {
        let cnt = self.geo.cqe_cnt;
        let size = self.geo.cqe_size as usize;
        let slot = (ci & (cnt - 1)) as usize;
        let owner = ((ci & cnt) != 0) as u8;
        let base = slot * size + size - 64;
        self.cq_buf.bytes_mut()[base..base + 63].copy_from_slice(&cqe[..63]);
        // SAFETY: byte 63 of the slot's CQE.
        unsafe {
            crate::mmio::store_op_own(self.cq_buf.ptr().add(base + 63), (cqe[63] & !1) | owner)
        };
    }
}

/// A send WQE parsed back from ring bytes. The parser follows
/// docs/spec/mlx5.md §3–§5 on its own and never calls the encoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedWqe {
    /// mlx5 opcode.
    pub opcode: u8,
    /// Opcode modifier.
    pub opmod: u8,
    /// 16-bit WQE index.
    pub wqe_index: u16,
    /// QP number.
    pub qpn: u32,
    /// DS (octowords).
    pub ds: u32,
    /// `fm_ce_se` byte.
    pub fm_ce_se: u8,
    /// Immediate / invalidate rkey (host order).
    pub imm: u32,
    /// Remote address and rkey, for RDMA and atomics.
    pub remote: Option<(u64, u32)>,
    /// (swap_add, compare) for atomics; compare is `None` for fetch-add.
    pub atomic: Option<(u64, Option<u64>)>,
    /// Data segments (addr, len, lkey).
    pub sges: Vec<(u64, u32, u32)>,
    /// Inline payload.
    pub inline: Option<Vec<u8>>,
}

/// Decode errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// DS of 0 or larger than the ring.
    BadDs,
    /// Unknown opcode.
    BadOpcode,
    /// Segments do not add up to DS.
    BadLayout,
}

/// Parses the WQE whose first BB is `slot` out of `ring` (a whole SQ ring,
/// `len` = wqe_cnt × 64), wrapping at the end.
pub fn decode_wqe(ring: &[u8], slot: u32) -> Result<DecodedWqe, DecodeError> {
    let n = ring.len();
    let octs = n / 16;
    let oct = |i: usize| -> [u8; 16] {
        let b = ((slot as usize * 4 + i) % octs) * 16;
        ring[b..b + 16].try_into().unwrap()
    };
    let be32 = |b: &[u8], o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    let be64 = |b: &[u8], o: usize| u64::from_be_bytes(b[o..o + 8].try_into().unwrap());
    let c = oct(0);
    let w0 = be32(&c, 0);
    let w1 = be32(&c, 4);
    let ds = w1 & 0x3f;
    if ds == 0 || ds as usize > octs {
        return Err(DecodeError::BadDs);
    }
    let mut d = DecodedWqe {
        opcode: (w0 & 0xff) as u8,
        opmod: (w0 >> 24) as u8,
        wqe_index: ((w0 >> 8) & 0xffff) as u16,
        qpn: w1 >> 8,
        ds,
        fm_ce_se: c[11],
        imm: be32(&c, 12),
        remote: None,
        atomic: None,
        sges: Vec::new(),
        inline: None,
    };
    let mut i = 1usize;
    let has_raddr = matches!(
        d.opcode,
        opcode::RDMA_WRITE
            | opcode::RDMA_WRITE_IMM
            | opcode::RDMA_READ
            | opcode::ATOMIC_CS
            | opcode::ATOMIC_FA
    );
    match d.opcode {
        opcode::NOP | opcode::SEND | opcode::SEND_IMM | opcode::SEND_INVAL => {}
        _ if has_raddr => {}
        _ => return Err(DecodeError::BadOpcode),
    }
    if has_raddr {
        if i >= ds as usize {
            return Err(DecodeError::BadLayout);
        }
        let r = oct(i);
        d.remote = Some((be64(&r, 0), be32(&r, 8)));
        i += 1;
    }
    if matches!(d.opcode, opcode::ATOMIC_CS | opcode::ATOMIC_FA) {
        if i >= ds as usize {
            return Err(DecodeError::BadLayout);
        }
        let a = oct(i);
        d.atomic = Some((
            be64(&a, 0),
            (d.opcode == opcode::ATOMIC_CS).then(|| be64(&a, 8)),
        ));
        i += 1;
    }
    if i < ds as usize {
        let first = oct(i);
        let bc = be32(&first, 0);
        if bc & INLINE_SEG != 0
            && !matches!(
                d.opcode,
                opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA
            )
        {
            let len = (bc & !INLINE_SEG) as usize;
            let need = (4 + len).div_ceil(16);
            if i + need != ds as usize {
                return Err(DecodeError::BadLayout);
            }
            let start = (slot as usize * 64 + i * 16 + 4) % n;
            let mut v = Vec::with_capacity(len);
            for k in 0..len {
                v.push(ring[(start + k) % n]);
            }
            d.inline = Some(v);
            i = ds as usize;
        }
        while i < ds as usize {
            let s = oct(i);
            let lkey = be32(&s, 4);
            if lkey == INVALID_LKEY && be32(&s, 0) == 0 {
                return Err(DecodeError::BadLayout);
            }
            d.sges.push((be64(&s, 8), be32(&s, 0), lkey));
            i += 1;
        }
    }
    Ok(d)
}
