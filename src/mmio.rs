//! Every volatile/MMIO access and every hardware barrier of the crate.
//!
//! Named barriers follow rdma-core's `util/udma_barrier.h`
//! (docs/spec/mlx5.md §7): one name per purpose, one implementation per architecture.
//!
//! | barrier | x86_64 | aarch64 |
//! |---|---|---|
//! | [`to_device_barrier`] | compiler only | `dmb oshst` |
//! | [`from_device_barrier`] | compiler only | `dmb oshld` |
//! | [`wc_start`] / [`wc_flush`] | `sfence` | `dsb st` |
//! | [`store_load_barrier`] | `mfence` (a locked op) | `dmb ish` |
//!
//! [`from_device_barrier`] is compiler-only on x86 as in DPDK (`rte_io_rmb`)
//! and UCX (`ucs_memory_cpu_load_fence`): x86 does not reorder loads with
//! other loads from write-back memory, so the owner-bit load cannot be
//! satisfied after the payload loads. rdma-core's `lfence` is stronger than
//! needed.
//!
//! Shared words (doorbell records, CQE owner bytes, doorbell registers) are
//! accessed through atomics: a relaxed 64-bit atomic store is exactly what
//! rdma-core's `mmio_write64` is on both architectures, and atomics keep the
//! in-process software device (another thread reading the same memory)
//! free of data races in Rust's memory model. No reference to device memory
//! is ever formed; everything goes through raw pointers.

use core::sync::atomic::{compiler_fence, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Orders earlier stores to host memory (WQEs) before later stores that
/// the device will act on (doorbell record). `udma_to_device_barrier`.
#[inline(always)]
pub fn to_device_barrier() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshst` only orders memory accesses; it has no other effect.
    unsafe {
        core::arch::asm!("dmb oshst", options(nostack, preserves_flags));
    }
    // On x86 stores to write-back memory are not reordered with each other;
    // only the compiler must be stopped. On aarch64 this also pins the asm.
    compiler_fence(Ordering::Release);
}

/// Orders the load that found a valid CQE before the loads of its other
/// fields. `udma_from_device_barrier`.
#[inline(always)]
pub fn from_device_barrier() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshld` only orders memory accesses.
    unsafe {
        core::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
    // x86: loads are not reordered with older loads; compiler barrier only.
    compiler_fence(Ordering::Acquire);
}

/// Orders earlier stores before later loads of memory shared with the
/// kernel (a full fence): siw publishes an SQE's VALID flag and then
/// checks whether the kernel consumed the previous one (docs/spec/siw.md §4),
/// and arms a CQ through its control word and then re-polls (docs/spec/siw.md §3); a
/// store followed by a load needs this, which acquire/release cannot give.
/// The kernel side pairs it with `smp_store_mb`/`smp_mb`. rdma-core gets
/// the same from sequentially consistent C11 atomics.
#[inline(always)]
pub fn store_load_barrier() {
    // x86: `mfence` (or a locked instruction); aarch64: `dmb ish`. The
    // fence is also a compiler barrier, and Miri models it.
    core::sync::atomic::fence(Ordering::SeqCst);
}

/// Orders the doorbell-record store (write-back memory) before a store to
/// the write-combining doorbell register. `mmio_wc_start`.
#[inline(always)]
pub fn wc_start() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dsb st` only waits for stores to complete.
    unsafe {
        core::arch::asm!("dsb st", options(nostack, preserves_flags));
    }
    compiler_fence(Ordering::SeqCst);
}

/// Pushes write-combining buffers out. `mmio_flush_writes`. Needed after a
/// doorbell only when the register is shared between threads (two
/// doorbells must not merge); a dedicated register is flushed by the next
/// doorbell's [`wc_start`] (UCX's `bf_post` mode does the same).
#[inline(always)]
pub fn wc_flush() {
    wc_start()
}

/// Stores a big-endian 32-bit doorbell-record word after
/// [`to_device_barrier`].
///
/// # Safety
/// `rec` must be valid for writes, 4-byte aligned, and only ever accessed
/// atomically by other threads (the software device).
#[inline(always)]
pub unsafe fn write_dbrec(rec: *mut u32, host_value: u32) {
    to_device_barrier();
    // SAFETY: the caller guarantees `rec` is valid, aligned and atomic-only.
    let word = unsafe { AtomicU32::from_ptr(rec) };
    // Release: an in-process device that acquire-loads this word sees every
    // WQE byte written before it (the Rust-model counterpart of the
    // hardware barrier above).
    word.store(host_value.to_be(), Ordering::Release);
}

/// Loads a doorbell-record word (host order). Used by the software device
/// and by tests.
///
/// # Safety
/// As for [`write_dbrec`].
#[inline(always)]
pub unsafe fn read_dbrec(rec: *const u32) -> u32 {
    // SAFETY: the caller guarantees `rec` is valid, aligned and atomic-only.
    let word = unsafe { AtomicU32::from_ptr(rec as *mut u32) };
    // Acquire: pairs with the Release in `write_dbrec`.
    u32::from_be(word.load(Ordering::Acquire))
}

/// One 64-bit store to a doorbell register. `mmio_write64_be` with the
/// bytes already in wire order.
///
/// # Safety
/// `reg` must be valid for an 8-byte, 8-aligned store.
#[inline(always)]
pub unsafe fn mmio_write64(reg: *mut u8, raw: u64) {
    // SAFETY: caller guarantees validity and alignment.
    let r = unsafe { AtomicU64::from_ptr(reg.cast::<u64>()) };
    // Relaxed: ordering against earlier stores is the job of `wc_start`;
    // a relaxed atomic store is a single plain store instruction.
    r.store(raw, Ordering::Relaxed);
}

/// Copies `nbb` 64-byte blocks to a BlueFlame register in ascending order,
/// eight 64-bit stores per block (`mmio_memcpy_x64`). The source wraps at
/// the end of the ring; the destination is linear.
///
/// # Safety
/// `reg` must be valid for `nbb * 64` bytes of 8-aligned stores; `ring`
/// must be valid for reads of `(ring_mask + 1) * 64` bytes and 64-aligned.
#[inline(always)]
pub unsafe fn blueflame_copy(
    reg: *mut u8,
    ring: *const u8,
    first_bb: u32,
    nbb: u32,
    ring_mask: u32,
) {
    for i in 0..nbb {
        let bb = (first_bb.wrapping_add(i) & ring_mask) as usize;
        // SAFETY: bb <= ring_mask, so the block is inside the ring.
        let src = unsafe { ring.add(bb * 64) }.cast::<u64>();
        for w in 0..8 {
            // SAFETY: inside block `bb` of the ring and 8-aligned; the
            // destination offset is below nbb * 64.
            unsafe {
                let v = src.add(w).read();
                mmio_write64(reg.add(i as usize * 64 + w * 8), v);
            }
        }
    }
}

/// The full mlx5 send doorbell (docs/spec/mlx5.md §7 steps 2–7), 8-byte form:
/// to-device barrier, doorbell record = `pi`, WC start, one 64-bit store of
/// the last WQE's first 8 control bytes, optional flush.
///
/// # Safety
/// `dbrec_sq` as for [`write_dbrec`]; `reg` as for [`mmio_write64`].
#[inline(always)]
pub unsafe fn send_doorbell(dbrec_sq: *mut u32, pi: u32, reg: *mut u8, ctrl8: u64, flush: bool) {
    // Steps 2-3: WQE stores before the record; record = pi & 0xffff.
    // SAFETY: forwarded caller contract.
    unsafe { write_dbrec(dbrec_sq, pi & 0xffff) };
    // Step 4: record before the WC store.
    wc_start();
    // Step 5: 8-byte doorbell, bytes exactly as they sit in the WQE.
    // SAFETY: forwarded caller contract.
    unsafe { mmio_write64(reg, ctrl8) };
    // Step 6 (shared registers only).
    if flush {
        wc_flush();
    }
}

/// The BlueFlame form of [`send_doorbell`]: the whole WQE is copied.
///
/// # Safety
/// As for [`send_doorbell`] and [`blueflame_copy`].
#[inline(always)]
#[allow(clippy::too_many_arguments)] // one step of a hardware sequence; a struct would only rename them
pub unsafe fn send_blueflame(
    dbrec_sq: *mut u32,
    pi: u32,
    reg: *mut u8,
    ring: *const u8,
    first_bb: u32,
    nbb: u32,
    ring_mask: u32,
    flush: bool,
) {
    // SAFETY: forwarded caller contract.
    unsafe { write_dbrec(dbrec_sq, pi & 0xffff) };
    wc_start();
    // SAFETY: forwarded caller contract.
    unsafe { blueflame_copy(reg, ring, first_bb, nbb, ring_mask) };
    if flush {
        wc_flush();
    }
}

/// Loads a CQE's `op_own` byte (the ownership word) with Acquire, so an
/// in-process device's CQE writes are visible; the caller then issues
/// [`from_device_barrier`] before reading the rest (docs/spec/mlx5.md §8).
///
/// # Safety
/// `p` must be valid for reads and only written atomically by others.
#[inline(always)]
pub unsafe fn load_op_own(p: *const u8) -> u8 {
    // SAFETY: caller contract.
    let b = unsafe { AtomicU8::from_ptr(p as *mut u8) };
    // Acquire pairs with the device's Release store of the same byte; on
    // x86 this is a plain load, on aarch64 `ldarb`.
    b.load(Ordering::Acquire)
}

/// Stores a CQE's `op_own` byte with Release (software device side, and
/// for re-initialising a CQ).
///
/// # Safety
/// As for [`load_op_own`], for writes.
#[inline(always)]
pub unsafe fn store_op_own(p: *mut u8, v: u8) {
    // SAFETY: caller contract.
    let b = unsafe { AtomicU8::from_ptr(p) };
    // Release: every other CQE byte written before is visible to a poller
    // that acquire-loads this byte.
    b.store(v, Ordering::Release);
}
