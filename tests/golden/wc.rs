//! The `wc.N.<field>` keys of the golden files, read off a completion
//! (shared by tests/golden_cqe.rs and tests/golden_ud_srq.rs).

use rdma_direct::provider::mlx5::Wc;

/// The value of golden key field `f` in `wc`, as the files write it.
pub fn wc_field(wc: &Wc, f: &str) -> i128 {
    match f {
        "wr_id" => wc.wr_id as i128,
        "status" => wc.status.0 as i128,
        "opcode" => wc.opcode.0 as i128,
        "vendor_err" => wc.vendor_err as i128,
        "byte_len" => wc.byte_len as i128,
        // Same union in `struct ibv_wc`; ours is host order in both cases.
        "imm_data" | "invalidated_rkey" => wc.imm_data as i128,
        "qp_num" => wc.qp_num as i128,
        "src_qp" => wc.src_qp as i128,
        "wc_flags" => wc.wc_flags as i128,
        "pkey_index" => wc.pkey_index as i128,
        "slid" => wc.slid as i128,
        "sl" => wc.sl as i128,
        "dlid_path_bits" => wc.dlid_path_bits as i128,
        _ => unreachable!("{f}"),
    }
}
