//! `wr_agree`: the WR-check API (`rdd_wr_check`, `SendQueue::check_list`)
//! against the real post paths on fake mlx5 memory (`rdd_mlx5_sq_post`,
//! `rdd_mlx5_sq_post_ring`, `SendQueue::post_list`, `SendQueue::post`):
//! the same status and the same failing index for the same capabilities
//! and requests, and capabilities the check refuses are refused by the
//! queue's initialisation. Input format and details: `wr_check.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "wr_check/case.rs"]
mod case;

fuzz_target!(|data: &[u8]| case::run(data, true));
