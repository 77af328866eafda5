//! The descriptor of one RDMA WRITE that the post benches read their
//! work requests from, so every field is a runtime value (shared by
//! `benches/post_poll.rs`, `benches/c_object.rs` and, as `struct
//! write_desc`, `benches/c/mlx5_ref.c`).

/// What the application knows about one RDMA_WRITE (the C reference takes
/// the same struct).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteDesc {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local buffer.
    pub laddr: u64,
    /// Remote buffer.
    pub raddr: u64,
    /// Bytes.
    pub len: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// `RDD_SEND_*` bits (the same values as `IBV_SEND_*`).
    pub flags: u32,
}
