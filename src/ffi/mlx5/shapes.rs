//! The common `rdd_wr` shapes, posted through typed paths.
//!
//! [`parse_send`] translates any `rdd_wr` into a [`SendWr`] whose opcode
//! and payload shape the encoder learns only at run time (its `by_shape!`
//! dispatch in `provider::mlx5::sq`). For the shapes C programs post most
//! (one SGE, no inline payload; RDMA WRITE, WRITE_WITH_IMM, READ, SEND,
//! SEND_WITH_IMM and the two atomics) [`post_send_wr`] builds the
//! `SendWr` from a constant opcode instead, so the poster is compiled for
//! that shape, as the per-opcode posts (`ops`) are. Every other request,
//! and every request that could break a rule of the C translation (an
//! unknown flag bit, a non-zero immediate on an opcode without one, a
//! NULL or misaligned SGE array), goes to [`parse_send`], so the statuses
//! and the bytes written are exactly those of the generic translation.
//!
//! [`post_typed_wr`] is the typed half on its own: `rdd_mlx5_sq_post_ring`
//! calls it directly for a single request. It tests RDMA WRITE first, on
//! two 8-byte words of the request instead of four fields.

use core::mem::{align_of, offset_of};
use core::ptr;

use static_assertions::const_assert_eq;

use crate::ffi::status::rdd_status;
use crate::ffi::wr::{
    parse_send, rdd_wr, InlinePieces, RDD_SEND_FENCE, RDD_SEND_SIGNALED, RDD_SEND_SOLICITED,
    RDD_WR_ATOMIC_CMP_AND_SWP, RDD_WR_ATOMIC_FETCH_AND_ADD, RDD_WR_RDMA_READ, RDD_WR_RDMA_WRITE,
    RDD_WR_RDMA_WRITE_WITH_IMM, RDD_WR_SEND, RDD_WR_SEND_WITH_IMM,
};
use crate::provider::mlx5::{SendBatch, SendQueue};
use crate::wr::{Remote, SendFlags, SendOp, SendWr, Sge};

/// How the translated requests are posted. A trait rather than a closure
/// so that every call site below is inlined (`#[inline(always)]`): each
/// typed arm then gets the encoder compiled for its shape.
pub(super) trait Poster {
    /// Posts one typed request.
    ///
    /// # Safety
    /// The posting contract of [`SendQueue::post`] for `wr`.
    unsafe fn post(&mut self, wr: &SendWr<'_>) -> crate::Result<()>;
}

/// [`SendQueue::post`]: write, no doorbell.
pub(super) struct Post<'q>(pub(super) &'q mut SendQueue);

/// [`SendQueue::post_one`]: write and ring.
pub(super) struct PostOne<'q>(pub(super) &'q mut SendQueue);

impl Poster for Post<'_> {
    #[inline(always)]
    unsafe fn post(&mut self, wr: &SendWr<'_>) -> crate::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.post(wr) }
    }
}

impl Poster for PostOne<'_> {
    #[inline(always)]
    unsafe fn post(&mut self, wr: &SendWr<'_>) -> crate::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.post_one(wr) }
    }
}

impl<P: Poster + ?Sized> Poster for &mut P {
    #[inline(always)]
    unsafe fn post(&mut self, wr: &SendWr<'_>) -> crate::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { (**self).post(wr) }
    }
}

impl Poster for SendBatch<'_> {
    #[inline(always)]
    unsafe fn post(&mut self, wr: &SendWr<'_>) -> crate::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { SendBatch::post(self, wr) }
    }
}

/// The flags a typed-path request may carry (no INLINE, no unknown bit).
const PLAIN_FLAGS: u32 = RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED;

/// Two adjacent `u32` fields, `first` at the lower address, as the `u64`
/// [`word_at`] reads at the offset of `first`.
const fn pair(first: u32, second: u32) -> u64 {
    let (a, b) = (first.to_ne_bytes(), second.to_ne_bytes());
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
}

/// The (num_sge, opcode) word of an RDMA WRITE with one SGE.
const WRITE_ONE_SGE: u64 = pair(1, RDD_WR_RDMA_WRITE);
/// The bits of the (flags, imm_data) word that keep a request without an
/// immediate off the typed paths: any flag outside PLAIN_FLAGS, any
/// immediate bit.
const NOT_PLAIN_NO_IMM: u64 = pair(!PLAIN_FLAGS, u32::MAX);

// `word_at` reads (num_sge, opcode) and (flags, imm_data) as aligned
// words.
const_assert_eq!(offset_of!(rdd_wr, opcode), offset_of!(rdd_wr, num_sge) + 4);
const_assert_eq!(offset_of!(rdd_wr, imm_data), offset_of!(rdd_wr, flags) + 4);
const_assert_eq!(offset_of!(rdd_wr, num_sge) % align_of::<u64>(), 0);
const_assert_eq!(offset_of!(rdd_wr, flags) % align_of::<u64>(), 0);
const_assert_eq!(align_of::<rdd_wr>() % align_of::<u64>(), 0);

/// The 8 bytes of `wr` at `offset`, as one word.
///
/// # Safety
/// `offset + 8 <= size_of::<rdd_wr>()`, `offset` a multiple of 8, and the
/// 8 bytes are fields (no padding).
#[inline(always)]
unsafe fn word_at(wr: &rdd_wr, offset: usize) -> u64 {
    // SAFETY: inside `*wr` and aligned (`rdd_wr` is 8-aligned, `offset` a
    // multiple of 8), initialised bytes (caller contract); a `u64` has no
    // invalid bit pattern.
    unsafe {
        ptr::from_ref(wr)
            .cast::<u8>()
            .add(offset)
            .cast::<u64>()
            .read()
    }
}

/// Translates `wr` and hands it to `poster`; a translation failure is
/// returned as its status without posting.
///
/// # Safety
/// The contract of [`parse_send`] for `wr` (its SGE array and inline
/// payload pieces are readable) and the posting contract of
/// [`SendQueue::post`].
#[inline(always)]
pub(super) unsafe fn post_send_wr<'a>(
    wr: &'a rdd_wr,
    pieces: &mut InlinePieces<'a>,
    poster: &mut impl Poster,
) -> Result<(), rdd_status> {
    // SAFETY: forwarded contract.
    if let Some(posted) = unsafe { post_typed_wr(wr, poster) } {
        return posted;
    }
    // SAFETY: forwarded contract.
    match unsafe { parse_send(wr, pieces) } {
        // SAFETY: forwarded contract.
        Ok(swr) => unsafe { poster.post(&swr) }.map_err(rdd_status::from),
        Err(s) => Err(s),
    }
}

/// The typed paths of [`post_send_wr`]: if `wr` has one of the common
/// shapes, posts it through `poster` and returns the result; otherwise
/// (`None`) posts nothing, and the request is [`parse_send`]'s.
///
/// # Safety
/// As for [`post_send_wr`].
#[inline(always)]
pub(super) unsafe fn post_typed_wr(
    wr: &rdd_wr,
    poster: &mut impl Poster,
) -> Option<Result<(), rdd_status>> {
    let list = wr.sg_list;
    // RDMA WRITE without an immediate, the request C programs post most,
    // is tested first, on two pairs of adjacent fields read as one word
    // each: (num_sge, opcode) is (1, WRITE), and (flags, imm_data) has no
    // bit outside PLAIN_FLAGS.
    // SAFETY: `wr` is a reference, so each word lies inside it, and at an
    // offset aligned for `u64` (asserted above `word_at`).
    let (count_op, flags_imm) = unsafe {
        (
            word_at(wr, offset_of!(rdd_wr, num_sge)),
            word_at(wr, offset_of!(rdd_wr, flags)),
        )
    };
    // One word that is zero exactly when the shape matches and the SGE
    // array is aligned (fewer branches than testing each part).
    let misfit = (count_op ^ WRITE_ONE_SGE)
        | (flags_imm & NOT_PLAIN_NO_IMM)
        | (list as usize % align_of::<Sge>()) as u64;
    if misfit == 0 && !list.is_null() {
        // SAFETY: as below.
        let sges = [unsafe { list.cast::<Sge>().read() }];
        let op = SendOp::Write {
            remote: Remote::new(wr.remote_addr, wr.rkey),
        };
        let swr = SendWr::new(wr.wr_id, op, &sges, SendFlags(wr.flags));
        // SAFETY: forwarded contract.
        return Some(unsafe { poster.post(&swr) }.map_err(rdd_status::from));
    }
    let sge_ok = !list.is_null() && list as usize % align_of::<Sge>() == 0;
    if wr.num_sge == 1 && wr.flags & !PLAIN_FLAGS == 0 && sge_ok {
        // SAFETY: non-NULL and aligned (checked), one readable entry (the
        // caller's contract); `rdd_sge` has the layout of `Sge` (asserted
        // in `ffi::wr`) and every bit pattern is valid for both. The entry
        // is copied: `parse_send` would borrow it, and the encoder reads
        // the same three fields either way.
        let sges = [unsafe { list.cast::<Sge>().read() }];
        // These flags are exactly the typed ones (no INLINE bit to drop).
        let flags = SendFlags(wr.flags);
        let remote = Remote::new(wr.remote_addr, wr.rkey);
        // Each arm builds the `SendWr` `parse_send` would build for it;
        // an opcode without an immediate but with a non-zero `imm_data`
        // (INVALID_IMMEDIATE) falls through to `parse_send`.
        macro_rules! typed {
            ($op:expr) => {{
                let swr = SendWr::new(wr.wr_id, $op, &sges, flags);
                // SAFETY: forwarded contract.
                return Some(unsafe { poster.post(&swr) }.map_err(rdd_status::from));
            }};
        }
        match (wr.opcode, wr.imm_data) {
            // (RDD_WR_RDMA_WRITE, 0) was posted above.
            (RDD_WR_RDMA_WRITE_WITH_IMM, imm) => typed!(SendOp::WriteImm { remote, imm }),
            (RDD_WR_RDMA_READ, 0) => typed!(SendOp::Read { remote }),
            (RDD_WR_SEND, 0) => typed!(SendOp::Send),
            (RDD_WR_SEND_WITH_IMM, imm) => typed!(SendOp::SendImm { imm }),
            (RDD_WR_ATOMIC_FETCH_AND_ADD, 0) => typed!(SendOp::FetchAdd {
                remote,
                add: wr.compare_add,
            }),
            (RDD_WR_ATOMIC_CMP_AND_SWP, 0) => typed!(SendOp::CompareSwap {
                remote,
                compare: wr.compare_add,
                swap: wr.swap,
            }),
            _ => {}
        }
    }
    None
}
