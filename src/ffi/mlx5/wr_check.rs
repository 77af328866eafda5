//! `rdd_wr_check`: the verdict a send post would give on a list of work
//! requests, from the queue's capabilities alone (no device, no queue,
//! nothing written), so that C programs can unit-test or fuzz their own
//! WR construction against the rules of the post calls.
//!
//! It runs the posts' own code: the same per-request translation
//! (`shapes::post_send_wr`, which takes the typed shortcuts for the common
//! shapes and [`crate::ffi::wr::parse_send`] for the rest) and the send
//! queue's validation ([`SendQueue::check_wr`], the validation a post
//! runs before it looks at ring space), stopping at the first refused
//! request as `rdd_mlx5_sq_post` does.

use super::check_array;
use super::desc::rdd_qp_caps;
use super::shapes::Poster;
use super::sq::{post_each, send_post_status};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::rdd_wr;
use crate::provider::mlx5::SendQueue;
use crate::wr::{QpCaps, SendWr};

/// The "poster" of a check: validation only.
struct Check(QpCaps);

impl Poster for Check {
    #[inline(always)]
    unsafe fn post(&mut self, wr: &SendWr<'_>) -> crate::Result<()> {
        SendQueue::check_wr(&self.0, wr).map(|_| ())
    }
}

/// Checks the send work requests `wrs[0..n]` against the rules of a send
/// queue created with `caps`, and returns exactly the status
/// `rdd_mlx5_sq_post` or `rdd_mlx5_sq_post_ring` would return for them on
/// a send queue initialised with those capabilities that is ready to send
/// and has room for them all (and `rdd_qp_post_send` on a QP of the
/// software device, whose send queue is the same mlx5 queue).
/// Nothing is posted and no device or queue is needed; only
/// `*out_bad_index` is written, on the same terms as the posts.
///
/// The requests are checked in order and the first refused one decides:
/// its status is returned and `*out_bad_index` is its index. On `OK`
/// every request would be posted and `*out_bad_index` is not written.
///
/// Statuses:
/// - `OK`: every request is acceptable.
/// - `NULL_PARAMETER`: `caps`, `wrs` or `out_bad_index` is NULL (nothing
///   is written).
/// - `INVALID_GEOMETRY`: no send queue can be created with `caps` (its
///   largest WQE would not fit the 6-bit DS field; `rdd_mlx5_sq_init`
///   refuses such capabilities); `*out_bad_index` is not written.
/// - `INVALID_ARGUMENT`: the `wrs` array is misaligned or too large to
///   address (`*out_bad_index` = 0), or a request's `sg_list` is
///   misaligned.
/// - The work-request statuses of the posts, for the first refused
///   request: `INVALID_FLAGS` (a bit outside `RDD_SEND_*`),
///   `INVALID_OPCODE`, `INVALID_IMMEDIATE` (non-zero `imm_data` on an
///   opcode without one), `NULL_POINTER` (NULL `sg_list` with `num_sge >
///   0`, or a NULL inline piece with a non-zero length), `TOO_MANY_SGES`,
///   `ATOMIC_SGE_LENGTH`, `LENGTH_OVERFLOW`, `INLINE_NOT_ALLOWED`,
///   `INLINE_TOO_LARGE`, `ATOMIC_UNALIGNED`.
///
/// A post can also refuse for reasons that depend on the queue, which this
/// call never returns: `SQ_FULL`, `INVALID_QP_STATE`, `INVALID_HANDLE`
/// (and `CQ_FULL` of the object-level posts).
///
/// # Safety
/// `caps` is valid for a read (it is copied; no alignment needed); `wrs`
/// points to `n` readable `rdd_wr`, each `sg_list` to `num_sge` readable
/// entries, and for `RDD_SEND_INLINE` requests each entry with a non-zero
/// length to that many readable bytes (as for `rdd_mlx5_sq_post`; the
/// bytes are not read, only the pointers checked); `out_bad_index` is
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rdd_wr_check(
    caps: *const rdd_qp_caps,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(caps, wrs, out_bad_index);
        // SAFETY: non-NULL and readable (caller contract); an unaligned
        // read copies it without an alignment requirement.
        let caps = unsafe { caps.read_unaligned() }.to_core();
        if let Err(e) = SendQueue::check_caps(&caps) {
            return e.into();
        }
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), valid for a write (contract).
            unsafe { out_bad_index.write_unaligned(0) };
            return status;
        }
        // SAFETY: `wrs` holds `n` readable requests (checked / contract)
        // with the SGE and payload contract of the posts; `Check` posts
        // nothing, so the posting contract holds trivially.
        let failed = unsafe { post_each(wrs, n, Check(caps)) };
        // SAFETY: `out_bad_index` is non-NULL (checked) and writable.
        unsafe { send_post_status(failed, out_bad_index) }
    })
}
