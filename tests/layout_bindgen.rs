//! Cross-checks the hand-written mlx5 layouts in
//! `src/provider/mlx5/layout.rs` (and the syndromes in `completion.rs`) against
//! bindgen output of the system's `infiniband/mlx5dv.h` (`rdma_direct::sys`,
//! feature `verbs`). Guards against the field-width drift of ruapc PR #94
//! (docs/architecture.md §7).
//!
//! For every struct: size, alignment, and for every field (both sides,
//! `offset_of!`) the offset and the width. Destructuring patterns without
//! `..` make the compiler reject the test if either side gains a field the
//! test does not name. `mlx5_wqe_ctrl_seg` is opaque in the bindings (see
//! [`ctrl_seg`]).
#![cfg(feature = "verbs")]

use core::mem::{align_of, offset_of, size_of};

use rdma_direct::provider::mlx5::cq::syndrome;
use rdma_direct::provider::mlx5::layout::{
    self, cqe_format, cqe_opcode, ctrl_flags, opcode, AtomicSeg, Cqe64, CtrlSeg, DataSeg, ErrCqe,
    InlineHdr, Mlx5dvCq, Mlx5dvQp, RaddrSeg,
};
use rdma_direct::sys;

/// Width of a field, named through a projection closure that is never
/// called (only its type is used).
fn width<T, F>(_project: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// Asserts equal size and alignment of a hand-written type and its C twin.
macro_rules! same_shape {
    ($ours:ty, $c:ty) => {{
        assert_eq!(
            size_of::<$ours>(),
            size_of::<$c>(),
            concat!("size of ", stringify!($ours), " vs ", stringify!($c))
        );
        assert_eq!(
            align_of::<$ours>(),
            align_of::<$c>(),
            concat!("alignment of ", stringify!($ours), " vs ", stringify!($c))
        );
    }};
}

/// For each `ours_field => c.path`, asserts that the offset in `$ours`
/// equals `$base` + the offset in `$c`, and that the widths match.
macro_rules! fields_match {
    ($ours:ident, $c:ty, base = $base:expr, { $($f:ident => $($cf:ident).+),+ $(,)? }) => {{
        $(
            assert_eq!(
                offset_of!($ours, $f),
                $base + offset_of!($c, $($cf).+),
                concat!(
                    "offset of ", stringify!($ours), "::", stringify!($f),
                    " vs ", stringify!($c), "::", stringify!($($cf).+)
                )
            );
            assert_eq!(
                width(|v: &$ours| &v.$f),
                width(|v: &$c| &v.$($cf).+),
                concat!(
                    "width of ", stringify!($ours), "::", stringify!($f),
                    " vs ", stringify!($c), "::", stringify!($($cf).+)
                )
            );
        )+
    }};
}

/// Fails to compile unless every field of the struct is listed.
macro_rules! all_fields_listed {
    ($ty:path { $($f:ident),+ $(,)? }) => {{
        let _exhaustive = |v: &$ty| {
            let $ty { $($f: _),+ } = v;
        };
    }};
}

/// [`fields_match!`] at base 0, plus [`all_fields_listed!`] on our side.
macro_rules! same_fields {
    ($ours:ident, $c:ty, { $($f:ident => $($cf:ident).+),+ $(,)? }) => {{
        all_fields_listed!($ours { $($f),+ });
        fields_match!($ours, $c, base = 0, { $($f => $($cf).+),+ });
    }};
}

/// `mlx5_wqe_ctrl_seg` is `packed` + `aligned(4)` in C with a `__be16` at
/// the odd offset 9. bindgen renders that as `repr(C, packed(4))`, which
/// Rust lays out differently (u16 at 10, 20 bytes) and whose own layout
/// assertions then fail, so the bindings make it opaque (docs/spec/mlx5.md §10) and
/// no C field offsets are available here. What is checked instead:
/// * size 16 and alignment 4 against the opaque blob (which bindgen takes
///   from libclang's layout of the real struct);
/// * the C offsets, derived from the header's declaration: the struct is
///   packed, so each field starts where the previous one ends. The field
///   order and C types (`__be32 opmod_idx_opcode; __be32 qpn_ds; uint8_t
///   signature; __be16 dci_stream_channel_id; uint8_t fm_ce_se; __be32
///   imm;`) are transcribed from mlx5dv.h; their widths come from the
///   bindgen'd typedefs, and their sum must equal the blob's size;
/// * the documented offsets 0/4/8/9/11/12 of docs/spec/mlx5.md §3 (also
///   asserted at compile time in layout.rs).
#[test]
fn ctrl_seg() {
    same_shape!(CtrlSeg, sys::mlx5_wqe_ctrl_seg);

    let c_widths = [
        size_of::<sys::__be32>(), // opmod_idx_opcode
        size_of::<sys::__be32>(), // qpn_ds
        size_of::<u8>(),          // signature
        size_of::<sys::__be16>(), // dci_stream_channel_id
        size_of::<u8>(),          // fm_ce_se
        size_of::<sys::__be32>(), // imm
    ];
    let mut c_offsets = [0usize; 6];
    let mut end = 0;
    for (off, w) in c_offsets.iter_mut().zip(c_widths) {
        *off = end;
        end += w;
    }
    assert_eq!(
        end,
        size_of::<sys::mlx5_wqe_ctrl_seg>(),
        "packed field widths must add up to the C struct size"
    );
    assert_eq!(c_offsets, [0, 4, 8, 9, 11, 12], "docs/spec/mlx5.md §3");

    all_fields_listed!(CtrlSeg {
        opmod_idx_opcode,
        qpn_ds,
        signature,
        dci_stream_channel_id,
        fm_ce_se,
        imm,
    });
    let ours = [
        (
            offset_of!(CtrlSeg, opmod_idx_opcode),
            width(|v: &CtrlSeg| &v.opmod_idx_opcode),
        ),
        (offset_of!(CtrlSeg, qpn_ds), width(|v: &CtrlSeg| &v.qpn_ds)),
        (
            offset_of!(CtrlSeg, signature),
            width(|v: &CtrlSeg| &v.signature),
        ),
        (
            offset_of!(CtrlSeg, dci_stream_channel_id),
            width(|v: &CtrlSeg| &v.dci_stream_channel_id),
        ),
        (
            offset_of!(CtrlSeg, fm_ce_se),
            width(|v: &CtrlSeg| &v.fm_ce_se),
        ),
        (offset_of!(CtrlSeg, imm), width(|v: &CtrlSeg| &v.imm)),
    ];
    for (i, (off, w)) in ours.into_iter().enumerate() {
        assert_eq!(off, c_offsets[i], "CtrlSeg field {i} offset");
        assert_eq!(w, c_widths[i], "CtrlSeg field {i} width");
    }
}

#[test]
fn raddr_seg() {
    same_shape!(RaddrSeg, sys::mlx5_wqe_raddr_seg);
    same_fields!(RaddrSeg, sys::mlx5_wqe_raddr_seg, {
        raddr => raddr,
        rkey => rkey,
        reserved => reserved,
    });
    all_fields_listed!(sys::mlx5_wqe_raddr_seg {
        raddr,
        rkey,
        reserved
    });
}

#[test]
fn data_seg() {
    same_shape!(DataSeg, sys::mlx5_wqe_data_seg);
    same_fields!(DataSeg, sys::mlx5_wqe_data_seg, {
        byte_count => byte_count,
        lkey => lkey,
        addr => addr,
    });
    all_fields_listed!(sys::mlx5_wqe_data_seg {
        byte_count,
        lkey,
        addr
    });
}

/// The address vector (UD datagram segment): the first 8 bytes are a
/// union in C (`qkey` + reserved for UD, the 64-bit DC key for DC).
#[test]
fn address_vector() {
    use rdma_direct::provider::mlx5::Mlx5Av;
    same_shape!(Mlx5Av, sys::mlx5_wqe_av);
    // The union's UD member, field by field (a projection through the
    // union would need `unsafe`).
    type UdKey = sys::mlx5_wqe_av__bindgen_ty_1__bindgen_ty_1;
    fields_match!(Mlx5Av, UdKey, base = offset_of!(sys::mlx5_wqe_av, key), {
        qkey => qkey,
        reserved => reserved,
    });
    assert_eq!(offset_of!(sys::mlx5_wqe_av, key), 0);
    assert_eq!(size_of::<UdKey>(), 8);
    all_fields_listed!(Mlx5Av {
        qkey,
        reserved,
        dqp_dct,
        stat_rate_sl,
        fl_mlid,
        rlid,
        reserved0,
        rmac,
        tclass,
        hop_limit,
        grh_gid_fl,
        rgid
    });
    fields_match!(Mlx5Av, sys::mlx5_wqe_av, base = 0, {
        dqp_dct => dqp_dct,
        stat_rate_sl => stat_rate_sl,
        fl_mlid => fl_mlid,
        rlid => rlid,
        reserved0 => reserved0,
        rmac => rmac,
        tclass => tclass,
        hop_limit => hop_limit,
        grh_gid_fl => grh_gid_fl,
        rgid => rgid,
    });
    all_fields_listed!(sys::mlx5_wqe_av {
        key,
        dqp_dct,
        stat_rate_sl,
        fl_mlid,
        rlid,
        reserved0,
        rmac,
        tclass,
        hop_limit,
        grh_gid_fl,
        rgid
    });
}

#[test]
fn atomic_seg() {
    same_shape!(AtomicSeg, sys::mlx5_wqe_atomic_seg);
    same_fields!(AtomicSeg, sys::mlx5_wqe_atomic_seg, {
        swap_add => swap_add,
        compare => compare,
    });
    all_fields_listed!(sys::mlx5_wqe_atomic_seg { swap_add, compare });
}

#[test]
fn inline_hdr() {
    same_shape!(InlineHdr, sys::mlx5_wqe_inl_data_seg);
    same_fields!(InlineHdr, sys::mlx5_wqe_inl_data_seg, {
        byte_count => byte_count,
    });
    all_fields_listed!(sys::mlx5_wqe_inl_data_seg { byte_count });
}

/// The first 32 bytes of `mlx5_cqe64` are an anonymous union of an
/// anonymous struct (the responder fields we mirror), `mlx5_tm_cqe` and
/// `ibv_tmh`. Offsets inside the union are taken from bindgen's named
/// inner struct and rebased by the union's offset in the CQE (borrowing a
/// union field would need `unsafe`, so widths come from the inner struct).
#[test]
fn cqe64() {
    type Outer = sys::mlx5_cqe64;
    type Union = sys::mlx5_cqe64__bindgen_ty_1;
    type Inner = sys::mlx5_cqe64__bindgen_ty_1__bindgen_ty_1;

    same_shape!(Cqe64, Outer);
    let base = offset_of!(Outer, __bindgen_anon_1) + offset_of!(Union, __bindgen_anon_1);
    assert_eq!(base, 0);
    assert_eq!(size_of::<Inner>(), offset_of!(Outer, srqn_uidx));

    all_fields_listed!(Cqe64 {
        rsvd0,
        wqe_id,
        rsvd4,
        ml_path,
        rsvd20,
        slid,
        flags_rqpn,
        hds_ip_ext,
        l4_hdr_type_etc,
        vlan_info,
        srqn_uidx,
        imm_inval_pkey,
        app,
        app_op,
        app_info,
        byte_cnt,
        timestamp,
        sop_drop_qpn,
        wqe_counter,
        signature,
        op_own,
    });
    fields_match!(Cqe64, Inner, base = base, {
        rsvd0 => rsvd0,
        wqe_id => wqe_id,
        rsvd4 => rsvd4,
        ml_path => ml_path,
        rsvd20 => rsvd20,
        slid => slid,
        flags_rqpn => flags_rqpn,
        hds_ip_ext => hds_ip_ext,
        l4_hdr_type_etc => l4_hdr_type_etc,
        vlan_info => vlan_info,
    });
    fields_match!(Cqe64, Outer, base = 0, {
        srqn_uidx => srqn_uidx,
        imm_inval_pkey => imm_inval_pkey,
        app => app,
        app_op => app_op,
        app_info => app_info,
        byte_cnt => byte_cnt,
        timestamp => timestamp,
        sop_drop_qpn => sop_drop_qpn,
        wqe_counter => wqe_counter,
        signature => signature,
        op_own => op_own,
    });

    all_fields_listed!(sys::mlx5_cqe64__bindgen_ty_1__bindgen_ty_1 {
        rsvd0,
        wqe_id,
        rsvd4,
        ml_path,
        rsvd20,
        slid,
        flags_rqpn,
        hds_ip_ext,
        l4_hdr_type_etc,
        vlan_info,
    });
    all_fields_listed!(sys::mlx5_cqe64 {
        __bindgen_anon_1,
        srqn_uidx,
        imm_inval_pkey,
        app,
        app_op,
        app_info,
        byte_cnt,
        timestamp,
        sop_drop_qpn,
        wqe_counter,
        signature,
        op_own,
    });
}

#[test]
fn err_cqe() {
    same_shape!(ErrCqe, sys::mlx5_err_cqe);
    same_fields!(ErrCqe, sys::mlx5_err_cqe, {
        rsvd0 => rsvd0,
        srqn => srqn,
        rsvd1 => rsvd1,
        vendor_err_synd => vendor_err_synd,
        syndrome => syndrome,
        s_wqe_opcode_qpn => s_wqe_opcode_qpn,
        wqe_counter => wqe_counter,
        signature => signature,
        op_own => op_own,
    });
    all_fields_listed!(sys::mlx5_err_cqe {
        rsvd0,
        srqn,
        rsvd1,
        vendor_err_synd,
        syndrome,
        s_wqe_opcode_qpn,
        wqe_counter,
        signature,
        op_own,
    });
}

/// Our mirror flattens the C struct's `sq`, `rq` and `bf` sub-structs into
/// `sq_*`, `rq_*` and `bf_*` fields.
#[test]
fn dv_qp() {
    same_shape!(Mlx5dvQp, sys::mlx5dv_qp);
    same_fields!(Mlx5dvQp, sys::mlx5dv_qp, {
        dbrec => dbrec,
        sq_buf => sq.buf,
        sq_wqe_cnt => sq.wqe_cnt,
        sq_stride => sq.stride,
        rq_buf => rq.buf,
        rq_wqe_cnt => rq.wqe_cnt,
        rq_stride => rq.stride,
        bf_reg => bf.reg,
        bf_size => bf.size,
        comp_mask => comp_mask,
        uar_mmap_offset => uar_mmap_offset,
        tirn => tirn,
        tisn => tisn,
        rqn => rqn,
        sqn => sqn,
        tir_icm_addr => tir_icm_addr,
    });
    let _all_c_fields = |v: &sys::mlx5dv_qp| {
        let sys::mlx5dv_qp {
            dbrec: _,
            sq:
                sys::mlx5dv_qp__bindgen_ty_1 {
                    buf: _,
                    wqe_cnt: _,
                    stride: _,
                },
            rq:
                sys::mlx5dv_qp__bindgen_ty_2 {
                    buf: _,
                    wqe_cnt: _,
                    stride: _,
                },
            bf: sys::mlx5dv_qp__bindgen_ty_3 { reg: _, size: _ },
            comp_mask: _,
            uar_mmap_offset: _,
            tirn: _,
            tisn: _,
            rqn: _,
            sqn: _,
            tir_icm_addr: _,
        } = v;
    };
}

#[test]
fn dv_cq() {
    same_shape!(Mlx5dvCq, sys::mlx5dv_cq);
    same_fields!(Mlx5dvCq, sys::mlx5dv_cq, {
        buf => buf,
        dbrec => dbrec,
        cqe_cnt => cqe_cnt,
        cqe_size => cqe_size,
        cq_uar => cq_uar,
        cqn => cqn,
        comp_mask => comp_mask,
    });
    all_fields_listed!(sys::mlx5dv_cq {
        buf,
        dbrec,
        cqe_cnt,
        cqe_size,
        cq_uar,
        cqn,
        comp_mask,
    });
}

/// Asserts `ours == theirs` for each pair, compared as `u64` (the header's
/// constants are anonymous-enum values whose generated type names are not
/// stable, so only the values are compared).
macro_rules! same_values {
    ($($ours:expr => $c:ident),+ $(,)?) => {{
        $(
            assert_eq!(
                $ours as u64,
                sys::$c as u64,
                concat!(stringify!($ours), " vs ", stringify!($c))
            );
        )+
    }};
}

#[test]
fn send_opcodes() {
    same_values!(
        opcode::NOP => MLX5_OPCODE_NOP,
        opcode::SEND_INVAL => MLX5_OPCODE_SEND_INVAL,
        opcode::RDMA_WRITE => MLX5_OPCODE_RDMA_WRITE,
        opcode::RDMA_WRITE_IMM => MLX5_OPCODE_RDMA_WRITE_IMM,
        opcode::SEND => MLX5_OPCODE_SEND,
        opcode::SEND_IMM => MLX5_OPCODE_SEND_IMM,
        opcode::RDMA_READ => MLX5_OPCODE_RDMA_READ,
        opcode::ATOMIC_CS => MLX5_OPCODE_ATOMIC_CS,
        opcode::ATOMIC_FA => MLX5_OPCODE_ATOMIC_FA,
    );
}

#[test]
fn cqe_opcodes() {
    same_values!(
        cqe_opcode::REQ => MLX5_CQE_REQ,
        cqe_opcode::RESP_WR_IMM => MLX5_CQE_RESP_WR_IMM,
        cqe_opcode::RESP_SEND => MLX5_CQE_RESP_SEND,
        cqe_opcode::RESP_SEND_IMM => MLX5_CQE_RESP_SEND_IMM,
        cqe_opcode::RESP_SEND_INV => MLX5_CQE_RESP_SEND_INV,
        cqe_opcode::RESIZE_CQ => MLX5_CQE_RESIZE_CQ,
        cqe_opcode::SIG_ERR => MLX5_CQE_SIG_ERR,
        cqe_opcode::REQ_ERR => MLX5_CQE_REQ_ERR,
        cqe_opcode::RESP_ERR => MLX5_CQE_RESP_ERR,
        cqe_opcode::INVALID => MLX5_CQE_INVALID,
    );
}

/// Our format values are the 2-bit field (bits 3..2 of `op_own`); the
/// header's `MLX5_INLINE_SCATTER_32/64` are the same values already shifted
/// into place (0x4, 0x8), so ours are shifted by 2 before comparing.
/// `NORMAL` (0) and `COMPRESSED` (3) have no header constant.
#[test]
fn cqe_formats() {
    same_values!(
        (cqe_format::SCATTER_32 << 2) => MLX5_INLINE_SCATTER_32,
        (cqe_format::SCATTER_64 << 2) => MLX5_INLINE_SCATTER_64,
    );
    // The shifted values must still fit the 2-bit field.
    assert_eq!(sys::MLX5_INLINE_SCATTER_32 as u64 & !0xc, 0);
    assert_eq!(sys::MLX5_INLINE_SCATTER_64 as u64 & !0xc, 0);
}

#[test]
fn ctrl_flag_values() {
    same_values!(
        ctrl_flags::CQ_UPDATE => MLX5_WQE_CTRL_CQ_UPDATE,
        ctrl_flags::SOLICITED => MLX5_WQE_CTRL_SOLICITED,
        ctrl_flags::FENCE => MLX5_WQE_CTRL_FENCE,
        ctrl_flags::INITIATOR_SMALL_FENCE => MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE,
    );
}

/// `OCTOWORD`, `MAX_DS`, `CQ_SET_CI` and `CQ_ARM_DB` have no public header
/// constant (the last two live in rdma-core's private mlx5.h, docs/spec/mlx5.md
/// §10) and are covered by that document only.
#[test]
fn misc_constants() {
    same_values!(
        layout::INLINE_SEG => MLX5_INLINE_SEG,
        layout::INVALID_LKEY => MLX5_INVALID_LKEY,
        layout::CQ_DOORBELL => MLX5_CQ_DOORBELL,
        layout::SEND_WQE_BB => MLX5_SEND_WQE_BB,
        layout::SEND_WQE_SHIFT => MLX5_SEND_WQE_SHIFT,
        layout::RCV_DBR => MLX5_RCV_DBR,
        layout::SND_DBR => MLX5_SND_DBR,
    );
}

#[test]
fn error_syndromes() {
    same_values!(
        syndrome::LOCAL_LENGTH => MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
        syndrome::LOCAL_QP_OP => MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
        syndrome::LOCAL_PROT => MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
        syndrome::WR_FLUSHED => MLX5_CQE_SYNDROME_WR_FLUSH_ERR,
        syndrome::MW_BIND => MLX5_CQE_SYNDROME_MW_BIND_ERR,
        syndrome::BAD_RESP => MLX5_CQE_SYNDROME_BAD_RESP_ERR,
        syndrome::LOCAL_ACCESS => MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR,
        syndrome::REMOTE_INVAL_REQ => MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR,
        syndrome::REMOTE_ACCESS => MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR,
        syndrome::REMOTE_OP => MLX5_CQE_SYNDROME_REMOTE_OP_ERR,
        syndrome::TRANSPORT_RETRY_EXC => MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR,
        syndrome::RNR_RETRY_EXC => MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR,
        syndrome::REMOTE_ABORTED => MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR,
    );
}

/// The structs the verbs backend's mlx5 direct path hands to libmlx5
/// (`src/verbs/mlx5.rs`).
#[test]
fn mlx5dv_obj_and_qp_init_attr() {
    use rdma_direct::verbs::mlx5::{
        self as m, Mlx5dvDcInitAttr, Mlx5dvObj, Mlx5dvQpInitAttr, ObjPair,
    };
    same_shape!(Mlx5dvObj, sys::mlx5dv_obj);
    fields_match!(Mlx5dvObj, sys::mlx5dv_obj, base = 0, {
        qp => qp, cq => cq, srq => srq, rwq => rwq, dm => dm, ah => ah, pd => pd,
    });
    all_fields_listed!(Mlx5dvObj {
        qp,
        cq,
        srq,
        rwq,
        dm,
        ah,
        pd
    });
    type QpPair = ObjPair<rdma_sys::ibv_qp, Mlx5dvQp>;
    fields_match!(QpPair, sys::mlx5dv_obj__bindgen_ty_1, base = 0, {
        input => in_, output => out,
    });
    same_shape!(Mlx5dvQpInitAttr, sys::mlx5dv_qp_init_attr);
    fields_match!(Mlx5dvQpInitAttr, sys::mlx5dv_qp_init_attr, base = 0, {
        comp_mask => comp_mask,
        create_flags => create_flags,
        dc_init_attr => dc_init_attr,
        send_ops_flags => send_ops_flags,
    });
    all_fields_listed!(Mlx5dvQpInitAttr {
        comp_mask,
        create_flags,
        dc_init_attr,
        send_ops_flags
    });
    same_shape!(Mlx5dvDcInitAttr, sys::mlx5dv_dc_init_attr);
    assert_eq!(m::MLX5DV_OBJ_QP, sys::mlx5dv_obj_type_MLX5DV_OBJ_QP as u64);
    assert_eq!(m::MLX5DV_OBJ_CQ, sys::mlx5dv_obj_type_MLX5DV_OBJ_CQ as u64);
    assert_eq!(
        m::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
        sys::mlx5dv_qp_create_flags_MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
    );
    assert_eq!(
        m::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        sys::mlx5dv_qp_init_attr_mask_MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS as u64
    );
}
