//! Shared by the raw C ABI twin tests (`tests/ffi_ud.rs`,
//! `tests/ffi_srq.rs`): a deterministic generator, the fake QP geometry
//! and capabilities, zeroed handle storage, and the memory snapshot the
//! twins compare.

#![allow(dead_code)]

use rdma_direct::ffi::rdd_qp_caps;
use rdma_direct::testutil::{FakeGeometry, FakeMlx5};
use rdma_direct::QpCaps;

/// A zeroed heap value (handle storages are byte arrays: zeroes are
/// valid, and a zeroed storage is "not a handle").
pub fn zeroed<T>() -> Box<T> {
    // SAFETY: used only for the C storage types, which are byte arrays
    // valid for any bit pattern.
    Box::new(unsafe { std::mem::zeroed() })
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub const QPN: u32 = 0x0d21;

pub fn geo() -> FakeGeometry {
    FakeGeometry {
        sq_wqe_cnt: 16,
        qpn: QPN,
        bf_size: 256,
        ..FakeGeometry::default()
    }
}

pub fn caps() -> QpCaps {
    QpCaps {
        max_send_sge: 3,
        max_inline_data: 60,
        max_recv_sge: 1,
    }
}

pub fn c_caps() -> rdd_qp_caps {
    rdd_qp_caps {
        max_send_sge: 3,
        max_inline_data: 60,
        max_recv_sge: 1,
    }
}

/// All of a fake's memory the send side writes.
pub fn memory(f: &FakeMlx5) -> Vec<u8> {
    let mut v = f.qp_buf.bytes().to_vec();
    v.extend_from_slice(f.bf.bytes());
    v.extend_from_slice(f.dbrec.bytes());
    for s in &f.sq_wrid {
        v.extend_from_slice(&s.wr_id.to_le_bytes());
        v.extend_from_slice(&s.end.to_le_bytes());
        v.extend_from_slice(&s.start.to_le_bytes());
        v.extend_from_slice(&[s.opcode, s.flags]);
    }
    v
}
