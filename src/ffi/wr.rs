//! C work requests (`rdd_wr`, `rdd_recv_wr`, `rdd_sge`) and their
//! translation into the typed [`SendWr`] / [`RecvWr`].
//!
//! Translation is pure validation: it reads the C structs, builds borrowed
//! typed requests (inline payload pieces go into a fixed on-stack array,
//! nothing is allocated) and reports a typed status for anything the
//! typed API cannot express. Capability checks (SGE counts, inline size,
//! atomic rules) are left to the core, which rejects a WR without writing.

use core::mem::{align_of, offset_of, size_of, MaybeUninit};
use core::slice;

use static_assertions::const_assert_eq;

use crate::ffi::status::rdd_status;
use crate::provider::mlx5::layout::MAX_DS;
use crate::wr::{RecvWr, Remote, SendFlags, SendOp, SendWr, Sge};

/// One scatter/gather entry; same layout as `struct ibv_sge`.
///
/// For an inline send (`RDD_SEND_INLINE`), `addr` is a pointer to the
/// payload bytes, `length` their count, and `lkey` is ignored.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_sge {
    /// Buffer address (in a registered region), or the payload pointer of
    /// an inline send.
    pub addr: u64,
    /// Length in bytes; zero-length entries are skipped.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

const_assert_eq!(size_of::<rdd_sge>(), size_of::<Sge>());
const_assert_eq!(align_of::<rdd_sge>(), align_of::<Sge>());
const_assert_eq!(offset_of!(rdd_sge, addr), offset_of!(Sge, addr));
const_assert_eq!(offset_of!(rdd_sge, length), offset_of!(Sge, length));
const_assert_eq!(offset_of!(rdd_sge, lkey), offset_of!(Sge, lkey));

/// `rdd_wr.opcode`: RDMA WRITE (`IBV_WR_RDMA_WRITE`).
pub const RDD_WR_RDMA_WRITE: u32 = 0;
/// `rdd_wr.opcode`: RDMA WRITE with immediate (`IBV_WR_RDMA_WRITE_WITH_IMM`).
pub const RDD_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
/// `rdd_wr.opcode`: SEND (`IBV_WR_SEND`).
pub const RDD_WR_SEND: u32 = 2;
/// `rdd_wr.opcode`: SEND with immediate (`IBV_WR_SEND_WITH_IMM`).
pub const RDD_WR_SEND_WITH_IMM: u32 = 3;
/// `rdd_wr.opcode`: RDMA READ (`IBV_WR_RDMA_READ`).
pub const RDD_WR_RDMA_READ: u32 = 4;
/// `rdd_wr.opcode`: 8-byte compare and swap (`IBV_WR_ATOMIC_CMP_AND_SWP`).
pub const RDD_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
/// `rdd_wr.opcode`: 8-byte fetch and add (`IBV_WR_ATOMIC_FETCH_AND_ADD`).
pub const RDD_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
/// `rdd_wr.opcode`: SEND with invalidate (`IBV_WR_SEND_WITH_INV`).
pub const RDD_WR_SEND_WITH_INV: u32 = 9;
/// `rdd_wr.opcode`: a NOP WQE (no libibverbs equivalent; chosen outside
/// the `ibv_wr_opcode` range).
pub const RDD_WR_NOP: u32 = 0x100;

/// `rdd_wr.flags`: fence (`IBV_SEND_FENCE`).
pub const RDD_SEND_FENCE: u32 = 0x1;
/// `rdd_wr.flags`: request a completion (`IBV_SEND_SIGNALED`).
pub const RDD_SEND_SIGNALED: u32 = 0x2;
/// `rdd_wr.flags`: solicited event (`IBV_SEND_SOLICITED`).
pub const RDD_SEND_SOLICITED: u32 = 0x4;
/// `rdd_wr.flags`: copy the payload into the WQE (`IBV_SEND_INLINE`); the
/// SGEs then point at the payload.
pub const RDD_SEND_INLINE: u32 = 0x8;

/// Send flag of the calls that take one: leave the doorbell for a later
/// call. The work request is written into the queue but the device is not
/// told; a later call on the same queue without this bit, or the queue's
/// explicit ring call, rings once for everything written since the last
/// doorbell (the shape of `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`).
/// Not an `IBV_SEND_*` bit: it never reaches a WQE, and `rdd_wr.flags`
/// refuses it (`INVALID_FLAGS`). Bit 30, far from the `RDD_SEND_*` bits
/// (which grow from bit 0) and still a plain `int` constant in C.
pub const RDD_SEND_DEFER_DOORBELL: u32 = 0x4000_0000;

/// Most SGEs (payload pieces) of one inline send.
pub const RDD_WR_MAX_INLINE_SGE: usize = 16;

const_assert_eq!(RDD_SEND_FENCE, SendFlags::FENCE.0);
const_assert_eq!(RDD_SEND_SIGNALED, SendFlags::SIGNALED.0);
const_assert_eq!(RDD_SEND_SOLICITED, SendFlags::SOLICITED.0);
const_assert_eq!(RDD_SEND_INLINE, SendFlags::INLINE.0);
const_assert_eq!(
    RDD_SEND_FENCE | RDD_SEND_SIGNALED | RDD_SEND_SOLICITED | RDD_SEND_INLINE,
    SendFlags::ALL.0
);
const_assert_eq!(RDD_SEND_DEFER_DOORBELL & SendFlags::ALL.0, 0);

/// A send work request, modelled on `struct ibv_send_wr` without the
/// `next` link (requests are passed as an array).
///
/// Fields an opcode does not use are ignored, except `imm_data`, which
/// must be 0 unless the opcode carries an immediate
/// (`RDD_STATUS_INVALID_IMMEDIATE`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Gather (or, for READ and atomics, scatter) list; for inline sends
    /// the payload pieces. May be NULL only when `num_sge` is 0.
    pub sg_list: *const rdd_sge,
    /// Entries in `sg_list`.
    pub num_sge: u32,
    /// One of the `RDD_WR_*` opcodes.
    pub opcode: u32,
    /// `RDD_SEND_*` bits.
    pub flags: u32,
    /// Immediate data for the `*_WITH_IMM` opcodes, in *host* order (unlike
    /// libibverbs, which takes it big-endian).
    pub imm_data: u32,
    /// Remote address (RDMA and atomics; 8-byte aligned for atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics).
    pub rkey: u32,
    /// The rkey to invalidate (`RDD_WR_SEND_WITH_INV`).
    pub invalidate_rkey: u32,
    /// Compare value (compare-and-swap) or addend (fetch-and-add).
    pub compare_add: u64,
    /// Swap value (compare-and-swap).
    pub swap: u64,
}

#[cfg(target_pointer_width = "64")]
const_assert_eq!(size_of::<rdd_wr>(), 64);

/// A receive work request (`struct ibv_recv_wr` without `next`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_recv_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list; may be NULL only when `num_sge` is 0.
    pub sg_list: *const rdd_sge,
    /// Entries in `sg_list`.
    pub num_sge: u32,
    /// Must be 0 (`RDD_STATUS_INVALID_ARGUMENT` otherwise).
    pub reserved: u32,
}

#[cfg(target_pointer_width = "64")]
const_assert_eq!(size_of::<rdd_recv_wr>(), 24);

/// Scratch for the payload slices of one inline send. It starts
/// uninitialised ([`NO_PIECES`]): only an inline send writes it, and only
/// the entries it uses, so a caller that posts SGE-based sends pays
/// nothing for it.
pub(crate) type InlinePieces<'a> = MaybeUninit<[&'a [u8]; RDD_WR_MAX_INLINE_SGE]>;

/// Fresh scratch.
pub(crate) const NO_PIECES: InlinePieces<'static> = MaybeUninit::uninit();

/// The SGE array of a WR as a typed slice.
///
/// # Safety
/// If `n > 0` and `list` is not NULL, `list` must point to `n` readable
/// `rdd_sge` that live for `'a`.
#[inline(always)]
unsafe fn sge_slice<'a>(list: *const rdd_sge, n: u32, max: usize) -> Result<&'a [Sge], rdd_status> {
    if n == 0 {
        return Ok(&[]);
    }
    if list.is_null() {
        return Err(rdd_status::NullPointer);
    }
    // More entries than any WQE can hold is rejected before a slice is
    // formed, which also keeps the slice size far below `isize::MAX`.
    if n as usize > max {
        return Err(rdd_status::TooManySges);
    }
    if list as usize % align_of::<Sge>() != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    // SAFETY: non-NULL and aligned (checked), `n` readable entries (caller
    // contract); `rdd_sge` and `Sge` have the same layout (asserted above)
    // and every bit pattern is valid for both.
    Ok(unsafe { slice::from_raw_parts(list.cast::<Sge>(), n as usize) })
}

/// Translates a C send WR. Inline payload slices are stored in the first
/// entries of `pieces` (the others are not touched, so one scratch array
/// serves a whole batch of WRs posted one at a time).
///
/// # Safety
/// `wr.sg_list` must satisfy [`sge_slice`]; for an inline send every entry
/// with a non-zero length must point to that many readable bytes, live
/// for `'a` and not inside the send queue's ring.
#[inline(always)]
pub(crate) unsafe fn parse_send<'a: 'p, 'p>(
    wr: &'a rdd_wr,
    pieces: &'p mut InlinePieces<'a>,
) -> Result<SendWr<'p>, rdd_status> {
    if wr.flags & !SendFlags::ALL.0 != 0 {
        return Err(rdd_status::InvalidFlags);
    }
    let remote = Remote::new(wr.remote_addr, wr.rkey);
    let op = match wr.opcode {
        RDD_WR_RDMA_WRITE => SendOp::Write { remote },
        RDD_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm {
            remote,
            imm: wr.imm_data,
        },
        RDD_WR_SEND => SendOp::Send,
        RDD_WR_SEND_WITH_IMM => SendOp::SendImm { imm: wr.imm_data },
        RDD_WR_RDMA_READ => SendOp::Read { remote },
        RDD_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote,
            compare: wr.compare_add,
            swap: wr.swap,
        },
        RDD_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote,
            add: wr.compare_add,
        },
        RDD_WR_SEND_WITH_INV => SendOp::SendInv {
            rkey: wr.invalidate_rkey,
        },
        RDD_WR_NOP => SendOp::Nop,
        _ => return Err(rdd_status::InvalidOpcode),
    };
    if wr.imm_data != 0 && !matches!(op, SendOp::WriteImm { .. } | SendOp::SendImm { .. }) {
        return Err(rdd_status::InvalidImmediate);
    }
    // The INLINE bit selects the payload kind; the typed flags ignore it.
    let flags = SendFlags(wr.flags & !RDD_SEND_INLINE);
    if wr.flags & RDD_SEND_INLINE == 0 {
        // SAFETY: forwarded contract.
        let sges = unsafe { sge_slice(wr.sg_list, wr.num_sge, MAX_DS as usize) }?;
        return Ok(SendWr::new(wr.wr_id, op, sges, flags));
    }
    // SAFETY: forwarded contract.
    let sges = unsafe { sge_slice(wr.sg_list, wr.num_sge, RDD_WR_MAX_INLINE_SGE) }?;
    let base = pieces.as_mut_ptr().cast::<&'a [u8]>();
    for (i, sge) in sges.iter().enumerate() {
        let piece: &'a [u8] = if sge.length == 0 {
            &[]
        } else {
            if sge.addr == 0 {
                return Err(rdd_status::NullPointer);
            }
            let Ok(addr) = usize::try_from(sge.addr) else {
                return Err(rdd_status::InvalidArgument);
            };
            if sge.length as usize > isize::MAX as usize {
                return Err(rdd_status::InvalidArgument);
            }
            // SAFETY: a non-NULL pointer to `length` readable bytes that
            // live for 'a (caller contract); `length <= isize::MAX`; a `u8`
            // slice needs no alignment.
            unsafe { slice::from_raw_parts(addr as *const u8, sge.length as usize) }
        };
        // SAFETY: i < sges.len() <= RDD_WR_MAX_INLINE_SGE (`sge_slice`'s
        // bound): entry i of the scratch array.
        unsafe { base.add(i).write(piece) };
    }
    // SAFETY: entries 0..sges.len() were written above.
    let pieces: &'p [&'p [u8]] = unsafe { slice::from_raw_parts(base, sges.len()) };
    Ok(SendWr::inline(wr.wr_id, op, pieces, flags))
}

/// Translates a C receive WR.
///
/// # Safety
/// `wr.sg_list` must satisfy [`sge_slice`].
#[inline(always)]
pub(crate) unsafe fn parse_recv(wr: &rdd_recv_wr) -> Result<RecvWr<'_>, rdd_status> {
    if wr.reserved != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    // SAFETY: forwarded contract.
    let sges = unsafe { sge_slice(wr.sg_list, wr.num_sge, MAX_DS as usize) }?;
    Ok(RecvWr {
        wr_id: wr.wr_id,
        sges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::Payload;
    use core::ptr;

    fn wr(opcode: u32, flags: u32, sg: &[rdd_sge]) -> rdd_wr {
        rdd_wr {
            wr_id: 7,
            sg_list: if sg.is_empty() {
                ptr::null()
            } else {
                sg.as_ptr()
            },
            num_sge: sg.len() as u32,
            opcode,
            flags,
            imm_data: 0,
            remote_addr: 0x1000,
            rkey: 0x55,
            invalidate_rkey: 0x66,
            compare_add: 3,
            swap: 4,
        }
    }

    fn parse(w: &rdd_wr) -> Result<(SendOp, usize, bool), rdd_status> {
        let mut p = NO_PIECES;
        // SAFETY: the test's SGEs and payloads are live locals.
        let s = unsafe { parse_send(w, &mut p) }?;
        Ok(match s.payload {
            Payload::Sges(g) => (s.op, g.len(), false),
            Payload::Inline(i) => (s.op, i.iter().map(|x| x.len()).sum(), true),
        })
    }

    #[test]
    fn opcodes() {
        let sg = [rdd_sge {
            addr: 0x2000,
            length: 8,
            lkey: 1,
        }];
        let r = Remote::new(0x1000, 0x55);
        let cases = [
            (RDD_WR_RDMA_WRITE, SendOp::Write { remote: r }),
            (RDD_WR_SEND, SendOp::Send),
            (RDD_WR_RDMA_READ, SendOp::Read { remote: r }),
            (
                RDD_WR_ATOMIC_CMP_AND_SWP,
                SendOp::CompareSwap {
                    remote: r,
                    compare: 3,
                    swap: 4,
                },
            ),
            (
                RDD_WR_ATOMIC_FETCH_AND_ADD,
                SendOp::FetchAdd { remote: r, add: 3 },
            ),
            (RDD_WR_SEND_WITH_INV, SendOp::SendInv { rkey: 0x66 }),
        ];
        for (code, op) in cases {
            assert_eq!(parse(&wr(code, 0, &sg)), Ok((op, 1, false)));
        }
        let mut w = wr(RDD_WR_SEND_WITH_IMM, 0, &sg);
        w.imm_data = 0xdead;
        assert_eq!(parse(&w), Ok((SendOp::SendImm { imm: 0xdead }, 1, false)));
        w.opcode = RDD_WR_RDMA_WRITE_WITH_IMM;
        assert_eq!(
            parse(&w),
            Ok((
                SendOp::WriteImm {
                    remote: r,
                    imm: 0xdead
                },
                1,
                false
            ))
        );
        w.opcode = RDD_WR_SEND;
        assert_eq!(parse(&w), Err(rdd_status::InvalidImmediate));
        assert_eq!(parse(&wr(RDD_WR_NOP, 0, &[])), Ok((SendOp::Nop, 0, false)));
        for bad in [7, 8, 10, 11, 0xff, u32::MAX] {
            assert_eq!(parse(&wr(bad, 0, &sg)), Err(rdd_status::InvalidOpcode));
        }
        assert_eq!(
            parse(&wr(RDD_WR_SEND, 0x10, &sg)),
            Err(rdd_status::InvalidFlags)
        );
    }

    #[test]
    fn sge_list_checks() {
        let mut w = wr(RDD_WR_SEND, 0, &[]);
        w.num_sge = 1;
        assert_eq!(parse(&w), Err(rdd_status::NullPointer));
        let many = [rdd_sge::default(); 64];
        assert_eq!(
            parse(&wr(RDD_WR_SEND, 0, &many)),
            Err(rdd_status::TooManySges)
        );
        assert_eq!(parse(&wr(RDD_WR_SEND, 0, &many[..63])).unwrap().1, 63);
        // NULL list with no entries is fine.
        assert_eq!(
            parse(&wr(RDD_WR_SEND, 0, &[])),
            Ok((SendOp::Send, 0, false))
        );
        // Misaligned array.
        let raw = [0u64; 5];
        let mut w = wr(RDD_WR_SEND, 0, &[]);
        w.sg_list = raw.as_ptr().cast::<u8>().wrapping_add(4).cast();
        w.num_sge = 1;
        assert_eq!(parse(&w), Err(rdd_status::InvalidArgument));
    }

    #[test]
    fn inline_pieces() {
        let a = *b"hello";
        let b = *b"world!";
        let sg = [
            rdd_sge {
                addr: a.as_ptr() as u64,
                length: 5,
                lkey: 0,
            },
            rdd_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            rdd_sge {
                addr: b.as_ptr() as u64,
                length: 6,
                lkey: 0,
            },
        ];
        assert_eq!(
            parse(&wr(RDD_WR_SEND, RDD_SEND_INLINE, &sg)),
            Ok((SendOp::Send, 11, true))
        );
        let null = [rdd_sge {
            addr: 0,
            length: 1,
            lkey: 0,
        }];
        assert_eq!(
            parse(&wr(RDD_WR_SEND, RDD_SEND_INLINE, &null)),
            Err(rdd_status::NullPointer)
        );
        let seventeen = [sg[0]; RDD_WR_MAX_INLINE_SGE + 1];
        assert_eq!(
            parse(&wr(RDD_WR_SEND, RDD_SEND_INLINE, &seventeen)),
            Err(rdd_status::TooManySges)
        );
        assert_eq!(
            parse(&wr(RDD_WR_SEND, RDD_SEND_INLINE, &seventeen[..16])),
            Ok((SendOp::Send, 80, true))
        );
    }

    #[test]
    fn scratch_reused_across_a_batch() {
        let a = *b"abc";
        let sg3 = [
            rdd_sge {
                addr: a.as_ptr() as u64,
                length: 3,
                lkey: 0,
            },
            rdd_sge {
                addr: a.as_ptr() as u64,
                length: 2,
                lkey: 0,
            },
            rdd_sge {
                addr: a.as_ptr() as u64,
                length: 1,
                lkey: 0,
            },
        ];
        let sg1 = [rdd_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }];
        let w3 = wr(RDD_WR_SEND, RDD_SEND_INLINE, &sg3);
        let w1 = wr(RDD_WR_SEND, RDD_SEND_INLINE, &sg1);
        let mut scratch = NO_PIECES;
        for (w, want) in [(&w3, 6usize), (&w1, 0)] {
            // SAFETY: the SGEs and payload are live locals.
            let s = unsafe { parse_send(w, &mut scratch) }.unwrap();
            let Payload::Inline(p) = s.payload else {
                panic!("inline expected");
            };
            assert_eq!(p.len(), w.num_sge as usize);
            assert_eq!(p.iter().map(|x| x.len()).sum::<usize>(), want);
        }
    }

    #[test]
    fn recv_checks() {
        let sg = [rdd_sge {
            addr: 0x3000,
            length: 64,
            lkey: 9,
        }];
        let mut r = rdd_recv_wr {
            wr_id: 1,
            sg_list: sg.as_ptr(),
            num_sge: 1,
            reserved: 0,
        };
        // SAFETY: live local SGEs.
        assert_eq!(unsafe { parse_recv(&r) }.unwrap().sges.len(), 1);
        r.reserved = 1;
        // SAFETY: as above.
        let e = unsafe { parse_recv(&r) }.unwrap_err();
        assert_eq!(e, rdd_status::InvalidArgument);
        r.reserved = 0;
        r.sg_list = ptr::null();
        // SAFETY: NULL is rejected before any access.
        let e = unsafe { parse_recv(&r) }.unwrap_err();
        assert_eq!(e, rdd_status::NullPointer);
    }
}
