//! Unreliable-datagram sends at the raw-queue level: the address vector
//! (`rdd_mlx5_av`, libmlx5's `struct mlx5_wqe_av`), how to build one, a UD
//! send queue, and its posts, per opcode and generic
//! (docs/spec/mlx5.md §3 "Datagram segment", §11).
//!
//! A UD queue is initialised with `rdd_mlx5_sq_init_ud` and accepts only
//! the `rdd_mlx5_sq_*_ud*` posts; every RC post on it is refused before
//! anything is written, as every UD post is on an RC queue
//! (`INVALID_ATTRIBUTE`: an RC work request with an address handle). The
//! doorbell rules are those of the per-opcode RC posts (`ops.rs`): a call
//! without `RDD_SEND_DEFER_DOORBELL` rings after writing its WQE.

use core::ffi::c_void;
use core::mem::{align_of, size_of};

use static_assertions::const_assert_eq;

use super::check_array;
use super::desc::{rdd_mlx5dv_qp, rdd_qp_caps};
use super::ops::inline_piece;
use super::sq::init_send_queue;
use super::storage::{rdd_mlx5_sq_slot, rdd_mlx5_sq_storage};
use crate::ffi::handle;
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{
    parse_send, rdd_wr, InlinePieces, NO_PIECES, RDD_SEND_DEFER_DOORBELL, RDD_SEND_FENCE,
    RDD_SEND_INLINE, RDD_SEND_SIGNALED, RDD_SEND_SOLICITED,
};
use crate::provider::mlx5::{AhAttr, GlobalRoute, LinkLayer, Mlx5Av, SendQueue, UdDest};
use crate::wr::{SendFlags, SendOp, SendWr, Sge};

/// The address vector of an address handle, as the UD WQE carries it:
/// libmlx5's `struct mlx5_wqe_av` (48 bytes, big-endian fields, aligned to
/// 8). Build one with `rdd_mlx5_av_make`, or copy the one an mlx5dv
/// address handle holds (`mlx5dv_obj.ah.out->av`): the layouts are the
/// same. Its content is not interpreted by these calls beyond copying it
/// into each WQE with the destination QP and qkey filled in.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug)]
pub struct rdd_mlx5_av {
    /// The 48 bytes of `struct mlx5_wqe_av`.
    pub bytes: [u8; 48],
}

const_assert_eq!(size_of::<rdd_mlx5_av>(), size_of::<Mlx5Av>());
const_assert_eq!(align_of::<rdd_mlx5_av>(), align_of::<Mlx5Av>());

/// `rdd_mlx5_ah_attr.link_layer`: InfiniBand (LID routed; a GRH only when
/// `is_global`).
pub const RDD_MLX5_LINK_IB: u32 = 1;
/// `rdd_mlx5_ah_attr.link_layer`: RoCE v1 (Ethernet, `IB_ROCE_V1` GID; the
/// global route is required).
pub const RDD_MLX5_LINK_ROCE_V1: u32 = 2;
/// `rdd_mlx5_ah_attr.link_layer`: RoCE v2 (Ethernet, `ROCE_V2` GID; the
/// global route is required and its flow label, which chooses the UDP
/// source port, must not be 0).
pub const RDD_MLX5_LINK_ROCE_V2: u32 = 3;

/// What `rdd_mlx5_av_make` builds an address vector from: the fields of
/// `struct ibv_ah_attr` the data path needs, with the link layer and the
/// resolved destination MAC that libmlx5 looks up itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rdd_mlx5_ah_attr {
    /// One of `RDD_MLX5_LINK_*`.
    pub link_layer: u32,
    /// Flow label of the global route (20 bits).
    pub flow_label: u32,
    /// Destination GID of the global route.
    pub dgid: [u8; 16],
    /// Destination MAC (RoCE).
    pub dmac: [u8; 6],
    /// Destination LID (InfiniBand).
    pub dlid: u16,
    /// Service level (4 bits on InfiniBand, 3 on RoCE).
    pub sl: u8,
    /// Source path bits (7 bits, InfiniBand).
    pub src_path_bits: u8,
    /// The mlx5 static-rate code, 0..=15 (0: the port's rate).
    pub static_rate: u8,
    /// 1: the global route below is used; 0: none (InfiniBand only).
    pub is_global: u8,
    /// Source GID index of the global route.
    pub sgid_index: u8,
    /// Hop limit of the global route.
    pub hop_limit: u8,
    /// Traffic class of the global route.
    pub traffic_class: u8,
    /// Must be 0.
    pub reserved: u8,
}

const_assert_eq!(size_of::<rdd_mlx5_ah_attr>(), 40);

/// One generic UD send: an `rdd_wr` (opcode `RDD_WR_SEND` or
/// `RDD_WR_SEND_WITH_IMM`; any other is `UNSUPPORTED`) and where it goes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_ud_wr {
    /// The work request; `remote_addr`, `rkey`, `invalidate_rkey`,
    /// `compare_add` and `swap` are ignored, as for a SEND.
    pub wr: rdd_wr,
    /// The destination's address vector (non-NULL, aligned to 8).
    pub av: *const rdd_mlx5_av,
    /// Destination QP number (24 bits).
    pub remote_qpn: u32,
    /// Q_Key; bit 31 set: the QP's own qkey.
    pub qkey: u32,
}

#[cfg(target_pointer_width = "64")]
const_assert_eq!(size_of::<rdd_ud_wr>(), 80);

/// The flags a per-opcode UD send accepts: those of the RC sends (libmlx5
/// sets the fence bits on any QP type, and so does this encoder).
const UD_FLAGS: u32 =
    RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_DEFER_DOORBELL;
const UD_INLINE_FLAGS: u32 = UD_FLAGS | RDD_SEND_INLINE;

/// Builds the address vector for `attr` into `*out` as libmlx5's
/// `mlx5_create_ah` lays it out (docs/spec/mlx5.md §11).
///
/// Errors (nothing is written): `NULL_PARAMETER`; `INVALID_ARGUMENT` for
/// an unknown link layer, `is_global` other than 0 or 1, or a non-zero
/// `reserved`; `INVALID_ATTRIBUTE` for a rate code above 15, a flow label
/// wider than 20 bits, RoCE without a global route, and RoCE v2 with flow
/// label 0.
///
/// # Safety
/// `attr` is valid for reads (copied; no alignment needed), `out` for a
/// write of one `rdd_mlx5_av`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_av_make(
    attr: *const rdd_mlx5_ah_attr,
    out: *mut rdd_mlx5_av,
) -> rdd_status {
    ffi_boundary!({
        non_null!(attr, out);
        // SAFETY: non-NULL and readable (caller contract).
        let a = unsafe { attr.read_unaligned() };
        let link = match a.link_layer {
            RDD_MLX5_LINK_IB => LinkLayer::InfiniBand,
            RDD_MLX5_LINK_ROCE_V1 => LinkLayer::RoceV1 { dmac: a.dmac },
            RDD_MLX5_LINK_ROCE_V2 => LinkLayer::RoceV2 { dmac: a.dmac },
            _ => return rdd_status::InvalidArgument,
        };
        if a.is_global > 1 || a.reserved != 0 {
            return rdd_status::InvalidArgument;
        }
        let grh = (a.is_global == 1).then_some(GlobalRoute {
            dgid: a.dgid,
            sgid_index: a.sgid_index,
            flow_label: a.flow_label,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        });
        let core = AhAttr {
            link,
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            mlx5_rate: a.static_rate,
            grh,
        };
        let av = try_status!(Mlx5Av::new(&core).map_err(rdd_status::from));
        // SAFETY: `Mlx5Av` is 48 bytes of plain integers with no padding
        // (its size is asserted equal to the byte array's).
        let bytes: [u8; 48] = unsafe { core::mem::transmute(av) };
        // SAFETY: non-NULL, valid for a write (caller contract); unaligned
        // so the caller's buffer needs no alignment here.
        unsafe { out.write_unaligned(rdd_mlx5_av { bytes }) };
        rdd_status::Ok
    })
}

/// Initialises a send-queue handle for a UD QP: as `rdd_mlx5_sq_init`
/// (same arguments, flags, storage and error rules), and the largest UD
/// WQE `caps` allows (four octowords of control and datagram segment, then
/// `max_send_sge` data segments or `max_inline_data` bytes inline) must
/// fit the ring and a WQE (`INVALID_GEOMETRY` otherwise).
///
/// # Safety
/// As for `rdd_mlx5_sq_init`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_init_ud(
    sq: *mut rdd_mlx5_sq_storage,
    qp: *const rdd_mlx5dv_qp,
    qpn: u32,
    caps: *const rdd_qp_caps,
    flags: u32,
    wrid: *mut rdd_mlx5_sq_slot,
    wrid_len: usize,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        unsafe {
            init_send_queue(
                sq,
                qp,
                qpn,
                caps,
                flags,
                wrid,
                wrid_len,
                SendQueue::from_raw_ud,
            )
        }
    })
}

/// The address vector at `av`, checked.
///
/// # Safety
/// `av` is NULL or valid for reads of one `rdd_mlx5_av`.
#[inline(always)]
unsafe fn av_ref<'a>(av: *const rdd_mlx5_av) -> Result<&'a Mlx5Av, rdd_status> {
    if av.is_null() {
        return Err(rdd_status::NullPointer);
    }
    if av as usize % align_of::<Mlx5Av>() != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    // SAFETY: non-NULL, aligned (checked) and readable (caller contract);
    // same size and alignment (asserted) and every bit pattern is a valid
    // `Mlx5Av` (integers only).
    Ok(unsafe { &*av.cast::<Mlx5Av>() })
}

/// Posts `wr` to `dest` and rings unless `flags` defers the doorbell.
///
/// # Safety
/// As for [`SendQueue::post_ud`].
#[inline(always)]
unsafe fn submit_ud(
    queue: &mut SendQueue,
    wr: &SendWr<'_>,
    dest: &UdDest<'_>,
    flags: u32,
) -> rdd_status {
    // SAFETY: forwarded contract.
    match unsafe { queue.post_ud(wr, dest) } {
        Ok(()) => {
            if flags & RDD_SEND_DEFER_DOORBELL == 0 {
                queue.ring();
            }
            rdd_status::Ok
        }
        Err(e) => e.into(),
    }
}

/// The checks every per-opcode UD send makes first: the handle, the flags,
/// the address vector.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `av` as for [`av_ref`].
#[inline(always)]
unsafe fn ud_args<'a>(
    sq: *mut rdd_mlx5_sq_storage,
    av: *const rdd_mlx5_av,
    flags: u32,
    allowed: u32,
) -> Result<(&'a mut SendQueue, &'a Mlx5Av), rdd_status> {
    // SAFETY: caller contract.
    let queue = unsafe { handle::get(sq) }?;
    if flags & !allowed != 0 {
        return Err(rdd_status::InvalidFlags);
    }
    // SAFETY: caller contract.
    let av = unsafe { av_ref(av) }?;
    Ok((queue, av))
}

#[inline(always)]
const fn ud_flags(flags: u32) -> SendFlags {
    SendFlags(flags & (RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED))
}

/// UD SEND of one buffer (`laddr`, `length`, `lkey`; a zero length sends
/// an empty message) to the QP `remote_qpn` behind `av`, with Q_Key `qkey`
/// (bit 31 set: the QP's own). `flags`: `RDD_SEND_FENCE`,
/// `RDD_SEND_SIGNALED`, `RDD_SEND_SOLICITED`, `RDD_SEND_DEFER_DOORBELL`;
/// any other bit is `INVALID_FLAGS`. The WQE bytes are those libmlx5
/// writes for the same `ibv_send_wr` (`testdata/mlx5/ud-srq-golden.txt`).
///
/// Errors (nothing is written), in this order: `NULL_PARAMETER` /
/// `INVALID_HANDLE`; `INVALID_FLAGS`; `NULL_POINTER` for a NULL `av`,
/// `INVALID_ARGUMENT` for one not aligned to 8; `INVALID_ATTRIBUTE` on a
/// queue that is not UD; `INVALID_QPN` for a destination wider than 24
/// bits; the SGE checks of `rdd_mlx5_sq_post`; `SQ_FULL`;
/// `INVALID_QP_STATE`.
///
/// # Safety
/// `sq` as for `rdd_mlx5_sq_fini`; `av` is NULL or valid for reads of one
/// `rdd_mlx5_av`; the buffer is memory the device may read until the
/// completion.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_send_ud(
    sq: *mut rdd_mlx5_sq_storage,
    av: *const rdd_mlx5_av,
    remote_qpn: u32,
    qkey: u32,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let (queue, av) = try_status!(unsafe { ud_args(sq, av, flags, UD_FLAGS) });
        let sges = [Sge::new(laddr, length, lkey)];
        let wr = SendWr::new(wr_id, SendOp::Send, &sges, ud_flags(flags));
        let dest = UdDest::new(av, remote_qpn, qkey);
        // SAFETY: caller contract on the buffer.
        unsafe { submit_ud(queue, &wr, &dest, flags) }
    })
}

/// UD SEND_WITH_IMM: as `rdd_mlx5_sq_send_ud`, and the receive completes
/// with `imm` (host order, sent big-endian).
///
/// # Safety
/// As for `rdd_mlx5_sq_send_ud`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_send_ud_imm(
    sq: *mut rdd_mlx5_sq_storage,
    av: *const rdd_mlx5_av,
    remote_qpn: u32,
    qkey: u32,
    wr_id: u64,
    laddr: u64,
    length: u32,
    lkey: u32,
    imm: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let (queue, av) = try_status!(unsafe { ud_args(sq, av, flags, UD_FLAGS) });
        let sges = [Sge::new(laddr, length, lkey)];
        let wr = SendWr::new(wr_id, SendOp::SendImm { imm }, &sges, ud_flags(flags));
        let dest = UdDest::new(av, remote_qpn, qkey);
        // SAFETY: caller contract on the buffer.
        unsafe { submit_ud(queue, &wr, &dest, flags) }
    })
}

/// UD SEND of `data[0..length]` copied into the WQE (inline): as
/// `rdd_mlx5_sq_send_ud`, and `RDD_SEND_INLINE` is accepted (and implied).
/// After the flag and address-vector checks: a NULL `data` with a non-zero
/// length is `NULL_POINTER`; `length` above the queue's `max_inline_data`
/// is `INLINE_TOO_LARGE`.
///
/// # Safety
/// As for `rdd_mlx5_sq_send_ud`; `data` is NULL or points to `length`
/// readable bytes outside the send ring.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_send_ud_inline(
    sq: *mut rdd_mlx5_sq_storage,
    av: *const rdd_mlx5_av,
    remote_qpn: u32,
    qkey: u32,
    wr_id: u64,
    data: *const c_void,
    length: u32,
    flags: u32,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: caller contract.
        let (queue, av) = try_status!(unsafe { ud_args(sq, av, flags, UD_INLINE_FLAGS) });
        // SAFETY: caller contract on `data`.
        let piece = try_status!(unsafe { inline_piece(data, length) });
        let pieces = [piece];
        let wr = SendWr::inline(wr_id, SendOp::Send, &pieces, ud_flags(flags));
        let dest = UdDest::new(av, remote_qpn, qkey);
        // SAFETY: an inline WR names no memory the device accesses.
        unsafe { submit_ud(queue, &wr, &dest, flags) }
    })
}

/// Posts the UD sends `wrs[0..n]` without ringing the doorbell; call
/// `rdd_mlx5_sq_ring` after one or more posts (as `rdd_mlx5_sq_post`).
/// Each `wr` follows the rules of an `rdd_wr` for `rdd_mlx5_sq_post`
/// (`RDD_SEND_INLINE` and the SGE or inline-piece rules included), with
/// opcode `RDD_WR_SEND` or
/// `RDD_WR_SEND_WITH_IMM` (any other valid opcode is `UNSUPPORTED`: RDMA
/// and atomics do not exist on UD), and the destination rules of
/// `rdd_mlx5_sq_send_ud`.
///
/// Stops at the first rejected request exactly as `rdd_mlx5_sq_post`
/// does: those before it stay written (pending the doorbell), the queue is
/// otherwise untouched, `*out_bad_index` is its index.
///
/// # Safety
/// As for `rdd_mlx5_sq_post`, and every `av` is NULL or valid for reads of
/// one `rdd_mlx5_av`. `*out_bad_index` is written exactly as
/// `rdd_mlx5_sq_post` writes it.
#[no_mangle]
pub unsafe extern "C" fn rdd_mlx5_sq_post_ud(
    sq: *mut rdd_mlx5_sq_storage,
    wrs: *const rdd_ud_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        // SAFETY: caller contract on `sq`.
        let queue = try_status!(unsafe { handle::get(sq) });
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), valid for a write (contract).
            unsafe { out_bad_index.write_unaligned(0) };
            return status;
        }
        let mut pieces = NO_PIECES;
        for i in 0..n {
            // SAFETY: non-NULL, aligned, `n` readable entries (checked /
            // caller contract).
            let u = unsafe { &*wrs.add(i) };
            // SAFETY: SGE, inline and AV contracts forwarded.
            let st = unsafe { post_one_ud(queue, u, &mut pieces) };
            if st != rdd_status::Ok {
                // SAFETY: non-NULL (checked), valid for a write (contract).
                unsafe { out_bad_index.write_unaligned(i) };
                return st;
            }
        }
        rdd_status::Ok
    })
}

/// One entry of `rdd_mlx5_sq_post_ud`.
///
/// # Safety
/// As for `rdd_mlx5_sq_post_ud`, for this entry.
#[inline(always)]
unsafe fn post_one_ud<'a>(
    queue: &mut SendQueue,
    u: &'a rdd_ud_wr,
    pieces: &mut InlinePieces<'a>,
) -> rdd_status {
    // SAFETY: forwarded contract.
    let wr = try_status!(unsafe { parse_send(&u.wr, pieces) });
    // SAFETY: forwarded contract.
    let av = try_status!(unsafe { av_ref(u.av) });
    let dest = UdDest::new(av, u.remote_qpn, u.qkey);
    // SAFETY: forwarded contract.
    match unsafe { queue.post_ud(&wr, &dest) } {
        Ok(()) => rdd_status::Ok,
        Err(e) => e.into(),
    }
}
