//! Caller storage for the queue handles and the send side-table slot,
//! with their size and alignment asserts.

use core::mem::{align_of, size_of};

use static_assertions::{const_assert, const_assert_eq};

use crate::ffi::handle::{self, HandleStorage, Slot};
use crate::provider::mlx5::{CompletionQueue, RecvQueue, SendQueue, WrSlot};

// ---------------------------------------------------------------------
// Handle storage
// ---------------------------------------------------------------------

/// Size in bytes of `rdd_mlx5_sq_storage`. Part of the ABI: it leaves room
/// for the send queue to grow without changing the C type.
pub const RDD_MLX5_SQ_STORAGE_SIZE: usize = 384;
/// Alignment in bytes of `rdd_mlx5_sq_storage`.
pub const RDD_MLX5_SQ_STORAGE_ALIGN: usize = 16;
/// Size in bytes of `rdd_mlx5_rq_storage`.
pub const RDD_MLX5_RQ_STORAGE_SIZE: usize = 128;
/// Alignment in bytes of `rdd_mlx5_rq_storage`.
pub const RDD_MLX5_RQ_STORAGE_ALIGN: usize = 16;
/// Size in bytes of `rdd_mlx5_cq_storage`.
pub const RDD_MLX5_CQ_STORAGE_SIZE: usize = 128;
/// Alignment in bytes of `rdd_mlx5_cq_storage`.
pub const RDD_MLX5_CQ_STORAGE_ALIGN: usize = 16;

/// Caller-provided storage for a send-queue handle. Declare one (static,
/// stack or heap; zero it so a use before `rdd_mlx5_sq_init` is detected),
/// initialise it with `rdd_mlx5_sq_init`, pass its address to the other
/// `rdd_mlx5_sq_*` calls, end with `rdd_mlx5_sq_fini`. Never copy or move
/// an initialised storage: the handle is bound to its address.
#[repr(C, align(16))]
pub struct rdd_mlx5_sq_storage {
    pub(super) _opaque: [u8; RDD_MLX5_SQ_STORAGE_SIZE],
}

/// Caller-provided storage for a receive-queue handle (same rules as
/// `rdd_mlx5_sq_storage`).
#[repr(C, align(16))]
pub struct rdd_mlx5_rq_storage {
    pub(super) _opaque: [u8; RDD_MLX5_RQ_STORAGE_SIZE],
}

/// Caller-provided storage for a completion-queue handle (same rules as
/// `rdd_mlx5_sq_storage`).
#[repr(C, align(16))]
pub struct rdd_mlx5_cq_storage {
    _opaque: [u8; RDD_MLX5_CQ_STORAGE_SIZE],
}

const_assert_eq!(size_of::<rdd_mlx5_sq_storage>(), RDD_MLX5_SQ_STORAGE_SIZE);
const_assert_eq!(align_of::<rdd_mlx5_sq_storage>(), RDD_MLX5_SQ_STORAGE_ALIGN);
const_assert!(size_of::<Slot<SendQueue>>() <= RDD_MLX5_SQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<SendQueue>>() <= RDD_MLX5_SQ_STORAGE_ALIGN);
const_assert_eq!(size_of::<rdd_mlx5_rq_storage>(), RDD_MLX5_RQ_STORAGE_SIZE);
const_assert_eq!(align_of::<rdd_mlx5_rq_storage>(), RDD_MLX5_RQ_STORAGE_ALIGN);
const_assert!(size_of::<Slot<RecvQueue>>() <= RDD_MLX5_RQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<RecvQueue>>() <= RDD_MLX5_RQ_STORAGE_ALIGN);
const_assert_eq!(size_of::<rdd_mlx5_cq_storage>(), RDD_MLX5_CQ_STORAGE_SIZE);
const_assert_eq!(align_of::<rdd_mlx5_cq_storage>(), RDD_MLX5_CQ_STORAGE_ALIGN);
const_assert!(size_of::<Slot<CompletionQueue>>() <= RDD_MLX5_CQ_STORAGE_SIZE);
const_assert!(align_of::<Slot<CompletionQueue>>() <= RDD_MLX5_CQ_STORAGE_ALIGN);

// SAFETY: size and alignment are asserted above; the storage is a byte
// array; the tags are distinct.
unsafe impl HandleStorage for rdd_mlx5_sq_storage {
    type Value = SendQueue;
    const TAG: u64 = 0x4d35_5351; // "M5SQ"
}

// SAFETY: as above.
unsafe impl HandleStorage for rdd_mlx5_rq_storage {
    type Value = RecvQueue;
    const TAG: u64 = 0x4d35_5251; // "M5RQ"
}

// SAFETY: as above.
unsafe impl HandleStorage for rdd_mlx5_cq_storage {
    type Value = CompletionQueue;
    const TAG: u64 = 0x4d35_4351; // "M5CQ"
}

// ---------------------------------------------------------------------
// The queues bound to a CQ handle
// ---------------------------------------------------------------------

/// The send and receive queue handles bound to a CQ handle
/// (`rdd_mlx5_cq_bind`), kept in the last bytes of its
/// `rdd_mlx5_cq_storage`, after the handle's [`Slot`], with the magic
/// word each holds while live ([`handle::live_key`], computed once at
/// bind time so that a bound poll compares each with one XOR). Nothing
/// bound: both point to the [`UNBOUND_SQ`] and [`UNBOUND_RQ`] sentinels
/// (the state `rdd_mlx5_cq_init` and `rdd_mlx5_cq_unbind` leave), with
/// their keys, so a bound poll checks the queues' magic words without a
/// NULL test first: the sentinels' are zero and never match. A finalised
/// CQ storage is all zeroes (NULL pointers here), but its own magic word
/// is refused before the binding is read.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CqBinding {
    /// The bound send queue's storage, or [`UNBOUND_SQ`].
    pub(super) sq: *mut rdd_mlx5_sq_storage,
    /// The bound receive queue's storage, or [`UNBOUND_RQ`] (exactly when
    /// `sq` is [`UNBOUND_SQ`]).
    pub(super) rq: *mut rdd_mlx5_rq_storage,
    /// `handle::live_key(sq)`.
    pub(super) sq_key: u64,
    /// `handle::live_key(rq)`.
    pub(super) rq_key: u64,
}

/// What an unbound CQ's binding names instead of a send queue: zeroed
/// storage, never written (only its magic word is ever read, and zero
/// never matches: see [`HandleStorage::TAG`]).
static UNBOUND_SQ: rdd_mlx5_sq_storage = rdd_mlx5_sq_storage {
    _opaque: [0; RDD_MLX5_SQ_STORAGE_SIZE],
};

/// The receive-queue twin of [`UNBOUND_SQ`].
static UNBOUND_RQ: rdd_mlx5_rq_storage = rdd_mlx5_rq_storage {
    _opaque: [0; RDD_MLX5_RQ_STORAGE_SIZE],
};

impl CqBinding {
    /// The binding of `sq` and `rq`, with their live magic words.
    #[inline(always)]
    pub(super) fn new(sq: *mut rdd_mlx5_sq_storage, rq: *mut rdd_mlx5_rq_storage) -> CqBinding {
        CqBinding {
            sq,
            rq,
            sq_key: handle::live_key(sq),
            rq_key: handle::live_key(rq),
        }
    }

    /// Nothing bound: the two sentinels. The pointers are only read
    /// through (a magic-word check that fails), never written.
    #[inline(always)]
    pub(super) fn none() -> CqBinding {
        CqBinding::new(
            core::ptr::addr_of!(UNBOUND_SQ).cast_mut(),
            core::ptr::addr_of!(UNBOUND_RQ).cast_mut(),
        )
    }

    /// Whether nothing is bound (the sentinels, or the NULL of a zeroed
    /// storage).
    #[inline(always)]
    pub(super) fn is_none(&self) -> bool {
        self.sq.is_null() || core::ptr::eq(self.sq, core::ptr::addr_of!(UNBOUND_SQ))
    }

    /// Whether both bound storages still hold live handles of their kinds
    /// (false for the sentinels): two loads, two XORs with the keys and
    /// one branch, the check of `handle::get_again` on both.
    ///
    /// # Safety
    /// `sq` and `rq` are the storages `rdd_mlx5_cq_bind` checked (still
    /// allocated and in place: its contract) or the sentinels; not the
    /// zeroed binding of a finalised CQ storage.
    #[inline(always)]
    pub(super) unsafe fn both_live(&self) -> bool {
        // SAFETY: non-NULL, aligned and readable (caller contract).
        unsafe {
            if handle::magic_xor(self.sq, self.sq_key) != 0 {
                return false;
            }
            handle::magic_xor(self.rq, self.rq_key) == 0
        }
    }
}

/// Offset of the [`CqBinding`] inside `rdd_mlx5_cq_storage`.
const CQ_BINDING_OFFSET: usize = RDD_MLX5_CQ_STORAGE_SIZE - size_of::<CqBinding>();

const_assert!(size_of::<Slot<CompletionQueue>>() <= CQ_BINDING_OFFSET);
const_assert_eq!(CQ_BINDING_OFFSET % align_of::<CqBinding>(), 0);

/// The binding slot of the CQ storage at `cq` (pointer arithmetic only:
/// nothing is read or written).
///
/// # Safety
/// `cq` points to one `rdd_mlx5_cq_storage` (it is non-NULL and aligned:
/// the caller checked it, for example with `handle::get`).
#[inline(always)]
pub(super) unsafe fn cq_binding(cq: *mut rdd_mlx5_cq_storage) -> *mut CqBinding {
    // SAFETY: the offset is inside the storage (asserted above) and keeps
    // the 16-byte alignment of the storage a multiple of the binding's.
    unsafe { cq.cast::<u8>().add(CQ_BINDING_OFFSET).cast::<CqBinding>() }
}

/// One entry of a send queue's side table (one per basic block of the
/// ring): caller-provided memory the send queue writes at post time and
/// reads at completion time. Its content is private.
#[repr(C)]
pub struct rdd_mlx5_sq_slot {
    pub(super) _opaque: [u64; 2],
}

const_assert_eq!(size_of::<rdd_mlx5_sq_slot>(), size_of::<WrSlot>());
const_assert_eq!(align_of::<rdd_mlx5_sq_slot>(), align_of::<WrSlot>());
