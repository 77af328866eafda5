//! Queue handles in caller-provided storage.
//!
//! A storage object (`rdd_mlx5_sq_storage` and friends) holds a [`Slot`]:
//! a magic word, then the Rust value. The magic word is the type's tag
//! XOR the storage address, so a storage that was never initialised,
//! was finalised (zeroed), or was copied or moved to another address is
//! rejected with `RDD_STATUS_INVALID_HANDLE` before the value is touched.
//! The check is best effort for never-initialised storage (garbage could
//! match by chance, or a stale handle could remain at a reused stack
//! address); zeroed storage is always rejected.

use core::mem::align_of;
use core::ptr;

use crate::ffi::status::rdd_status;

/// The layout inside a handle storage.
#[repr(C)]
pub(crate) struct Slot<T> {
    /// `TAG ^ address` while the handle is live, anything else otherwise.
    magic: u64,
    /// The handle's value.
    value: T,
}

/// A C storage type that carries a `Slot<Self::Value>`.
///
/// # Implementation safety
/// `Self` must be at least as large as `Slot<Self::Value>` and at least as
/// aligned (checked by `const_assert!`s next to each implementation), must
/// be valid for any bit pattern (a byte array), and `TAG` must be distinct
/// per implementation so one kind of storage is never mistaken for another.
pub(crate) unsafe trait HandleStorage {
    /// The Rust value the storage holds.
    type Value;
    /// Distinguishes handle kinds. Below 2^31, so that the check compares
    /// with an immediate operand (one instruction fewer per check on
    /// x86-64 than a 64-bit constant), and with a non-zero low nibble, so
    /// that zeroed storage never matches (storage is at least 16-aligned:
    /// the address's low nibble is 0, so the magic word's is the tag's).
    /// [`magic_for`] asserts both at compile time.
    const TAG: u64;
}

#[inline(always)]
fn magic_for<S: HandleStorage>(storage: *const S) -> u64 {
    const {
        assert!(S::TAG < 1 << 31 && S::TAG & 0xf != 0);
    }
    S::TAG ^ storage as usize as u64
}

/// Moves `value` into `storage` and marks it live. Whatever the storage
/// held before is overwritten without being dropped (a live handle there
/// is forgotten; handle values own no resources).
///
/// Returns `InvalidArgument` (and writes nothing) if `storage` is not
/// aligned for `S`.
///
/// # Safety
/// `storage` must be non-NULL and valid for writes of `size_of::<S>()`
/// bytes, with no other live reference into it.
#[inline]
pub(crate) unsafe fn install<S: HandleStorage>(
    storage: *mut S,
    value: S::Value,
) -> Result<(), rdd_status> {
    if misaligned(storage) {
        return Err(rdd_status::InvalidArgument);
    }
    let slot = storage.cast::<Slot<S::Value>>();
    // SAFETY: `storage` is valid for writes and aligned for `S`, which is
    // at least as large and aligned as `Slot<S::Value>` (trait contract).
    unsafe {
        slot.write(Slot {
            magic: magic_for(storage),
            value,
        })
    };
    Ok(())
}

/// Whether `p` is not aligned for `T`, tested on the address's low byte
/// (every alignment is below 256): compiled to one `test` of the
/// register's low byte on x86-64.
#[inline(always)]
pub(crate) fn misaligned<T>(p: *const T) -> bool {
    const { assert!(align_of::<T>() < 256) };
    (p as usize as u8) & (align_of::<T>() - 1) as u8 != 0
}

/// The live value in `storage`.
///
/// # Safety
/// `storage` must be NULL or valid for reads and writes of
/// `size_of::<S>()` bytes, and the returned reference must be the only one
/// into the storage while it is used (no concurrent calls on the same
/// handle).
#[inline(always)]
pub(crate) unsafe fn get<'a, S: HandleStorage>(
    storage: *mut S,
) -> Result<&'a mut S::Value, rdd_status> {
    if storage.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if misaligned(storage) {
        return Err(rdd_status::InvalidHandle);
    }
    let slot = storage.cast::<Slot<S::Value>>();
    // SAFETY: `storage` is valid for reads and aligned (checked), and the
    // magic word is a plain integer at offset 0 of the slot. A volatile
    // read keeps the check from being reasoned away.
    let magic = unsafe { ptr::read_volatile(ptr::addr_of!((*slot).magic)) };
    if magic != magic_for(storage) {
        return Err(rdd_status::InvalidHandle);
    }
    // SAFETY: the magic word matches, so `install` wrote a valid value at
    // this address and `clear` has not run since; exclusivity is the
    // caller's contract.
    Ok(unsafe { &mut (*slot).value })
}

/// [`get`] for a storage pointer that passed [`get`] before, so it is
/// known to be non-NULL and aligned (a queue bound to a CQ handle): only
/// the magic word is checked again. A storage that was finalised (zeroed)
/// or re-initialised as another kind of handle since is still refused
/// with `InvalidHandle`; one re-initialised as the same kind is a live
/// handle again and is accepted.
///
/// # Safety
/// `storage` must be non-NULL, aligned for `S` and valid for reads and
/// writes of `size_of::<S>()` bytes, and the returned reference must be the
/// only one into the storage while it is used.
#[inline(always)]
pub(crate) unsafe fn get_again<'a, S: HandleStorage>(
    storage: *mut S,
) -> Result<&'a mut S::Value, rdd_status> {
    let slot = storage.cast::<Slot<S::Value>>();
    // SAFETY: valid for reads and aligned (caller contract); the magic word
    // is a plain integer at offset 0 of the slot. Volatile, as in `get`.
    let magic = unsafe { ptr::read_volatile(ptr::addr_of!((*slot).magic)) };
    if magic != magic_for(storage) {
        return Err(rdd_status::InvalidHandle);
    }
    // SAFETY: as in `get`: the magic word matches, so a valid value is
    // live at this address; exclusivity is the caller's contract.
    Ok(unsafe { &mut (*slot).value })
}

/// The magic word a live handle of kind `S` holds at `storage`: what a
/// caller that keeps a storage address (a CQ's binding) may record once
/// and compare with [`magic_xor`] later, instead of recomputing it.
#[inline(always)]
pub(crate) fn live_key<S: HandleStorage>(storage: *const S) -> u64 {
    magic_for(storage)
}

/// The magic word of `storage` XOR `key`: 0 exactly when the storage holds
/// the magic word `key` names. With `key` = [`live_key`]`(storage)`, 0
/// means the check of [`get_again`] passes.
///
/// # Safety
/// `storage` must be non-NULL, aligned for `S` and valid for reads of
/// `size_of::<S>()` bytes.
#[inline(always)]
pub(crate) unsafe fn magic_xor<S: HandleStorage>(storage: *mut S, key: u64) -> u64 {
    let slot = storage.cast::<Slot<S::Value>>();
    // SAFETY: as in `get_again`.
    let magic = unsafe { ptr::read_volatile(ptr::addr_of!((*slot).magic)) };
    magic ^ key
}

/// The value in `storage`, whose magic word the caller has just found
/// live ([`magic_xor`] with its [`live_key`] gave 0).
///
/// # Safety
/// As for [`get_again`], and the magic word of `storage` equals
/// [`live_key`]`(storage)` (checked by the caller, with nothing since
/// that could have changed it).
#[inline(always)]
pub(crate) unsafe fn value_checked_by_caller<'a, S: HandleStorage>(
    storage: *mut S,
) -> &'a mut S::Value {
    let slot = storage.cast::<Slot<S::Value>>();
    // SAFETY: the magic word matches (caller contract), so `install` wrote
    // a valid value at this address and `clear` has not run since;
    // exclusivity is the caller's contract.
    unsafe { &mut (*slot).value }
}

/// Drops the live value in `storage` and zeroes the whole storage.
///
/// # Safety
/// As for [`get`], and the value must not be used afterwards.
#[inline]
pub(crate) unsafe fn clear<S: HandleStorage>(storage: *mut S) -> Result<(), rdd_status> {
    // SAFETY: forwarded contract.
    let value: *mut S::Value = unsafe { get(storage) }?;
    // SAFETY: `value` is live (checked by `get`) and not used again.
    unsafe { ptr::drop_in_place(value) };
    // SAFETY: `storage` is valid for writes of one `S`, and `S` is valid
    // for any bit pattern (trait contract), so all zeroes is fine.
    unsafe { ptr::write_bytes(storage, 0, 1) };
    Ok(())
}
