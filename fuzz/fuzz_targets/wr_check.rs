//! `wr_check` (lean) and `wr_agree`: one to four send work requests, typed
//! (`SendWr`) or C (`rdd_wr`), judged three ways that must agree; `wr_check`
//! compares 1 with 2, `wr_agree` (same input format, so the corpora are
//! interchangeable) compares 2 with 3:
//!
//! 1. an independent ordered model of the rules (`rdma_direct_fuzz::rules`):
//!    the first refused request and its exact error;
//! 2. the WR-check API: `SendQueue::check_list` / `SendQueue::check` for
//!    typed requests, `rdd_wr_check` for C ones (status and
//!    `out_bad_index`);
//! 3. the real post paths on a fresh 64-BB send queue in fake mlx5 memory
//!    (`testutil::FakeMlx5`, room for any four WQEs; the memory is reused
//!    across inputs, the queue is new): `SendQueue::post_list`
//!    or one `SendQueue::post` per request for typed ones,
//!    `rdd_mlx5_sq_post` or `rdd_mlx5_sq_post_ring` for C ones: the same
//!    status and index as the check.
//!
//! Capabilities no queue can have are included: the check then answers
//! `InvalidGeometry` and the queue's constructor must refuse them too.
//!
//! Input (read with `rdma_direct_fuzz::Bytes`; missing bytes read as 0):
//!
//! ```text
//! sge      u8   max_send_sge = sge % 66 (62.. cannot be encoded)
//! inline   u16  max_inline_data = inline % 1024 (973.. cannot)
//! mode     u8   bit 0: C requests (else typed), bits 1-2: 1 + count,
//!               bit 3: the other post call (post_ring / one post each)
//! WRs:
//!   typed: send::read_wr (any opcode incl. BindMw/LocalInv, any flags,
//!          0..15 SGEs or inline pieces)
//!   C:     opsel u8 (< 0xf0: a known opcode, else a raw u32 follows),
//!          fsel u8 (bit 7: raw u32 flags follow, else fsel & 0xf; bit 6:
//!          keep a non-zero immediate on any opcode), imm u32,
//!          remote_addr u64 (asel u8 bit 0: align to 8), lsel u8 (bits
//!          0-1: 0/1 real SGE array, 2 NULL, 3 misaligned; bits 2-7 c:
//!          num_sge = c % 18 (c < 48), 56 + c - 48 (48..=62), a raw u32
//!          (63)); per backed SGE (min(num_sge, 64)): length code
//!          (send::read_len), then for an inline request amode u8 (& 3 == 0:
//!          NULL) and a pool offset u16 (length cut to 0..=1024), else an
//!          lkey u8
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "wr_check/case.rs"]
mod case;

fuzz_target!(|data: &[u8]| case::run(data, false));
