//! The object-level C API: device, protection domain, memory region,
//! completion queue and queue pair as library-owned objects behind opaque
//! handles (features `ffi` + `soft`).
//!
//! # Handles
//!
//! A handle (`rdd_device *`, `rdd_pd *`, `rdd_mr *`, `rdd_cq *`,
//! `rdd_qp *`) is *not* the address of the object: it is an encoded slot
//! reference, `generation << 32 | index << 8 | kind`, cast to a pointer
//! type so C keeps its type checking. The library never dereferences a
//! handle. Every call decodes it and checks it against a global slot table
//! whose slots are never freed:
//!
//! - a handle of the wrong kind, with an index that was never allocated,
//!   or whose generation does not match the slot's (the object was
//!   destroyed, the slot possibly reused) is `RDD_STATUS_INVALID_HANDLE`;
//! - any value at all is safe to pass: there is no pointer to chase, so a
//!   stale or forged handle cannot cause undefined behaviour (a forged
//!   value that happens to name a live object of the right kind acts on
//!   that object; a destroyed handle is only mistaken for a new one after
//!   its slot was reused 2^32 times).
//!
//! Each slot carries one atomic state word (generation, kind, live bit, an
//! exclusive bit and a reader count). A call *acquires* the handles it
//! uses, shared (getters, creating children) or exclusive (posting,
//! polling, arming, connecting, destroying), with one compare-and-swap on
//! the slot's own cache line, and releases them on return. The data path
//! therefore takes no lock; the global mutex guards only slot allocation.
//! A handle that another thread holds in a conflicting mode at that moment
//! gives `RDD_STATUS_RESOURCE_BUSY` (a broken threading contract is
//! reported, never undefined behaviour).
//!
//! Parents know their children through reference counts (an `Arc` each
//! child holds), so destroying a device with PDs or CQs, a PD with MRs or
//! QPs, or a CQ with QPs returns `RDD_STATUS_RESOURCE_BUSY` and changes
//! nothing.

use core::ffi::c_void;
use core::mem::{self, align_of, size_of, MaybeUninit};
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::boxed::Box;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::vec;
use std::vec::Vec;

use static_assertions::{const_assert, const_assert_eq};

use crate::api::{Backend, Headroom, MrKeys, RawCqPath, RawQpPath};
use crate::ffi::mlx5::{rdd_qp_caps, rdd_wc, RDD_MLX5_CQ_ARM_SOLICITED};
use crate::ffi::status::rdd_status;
use crate::ffi::wr::{parse_recv, parse_send, rdd_recv_wr, rdd_wr, NO_PIECES};
use crate::provider::mlx5::{
    CompletionQueue, CqRoute, QpQueues, QpState, RecvQueue, SendQueue, SqConfig, Wc, WrSlot,
};
use crate::soft::{Access, QpInit, QpModify, SoftConfig, SoftDevice};
use crate::wr::QpCaps;

// ---------------------------------------------------------------------
// C types
// ---------------------------------------------------------------------

/// A device (opaque handle). Open with `rdd_device_open_soft`, close with
/// `rdd_device_close`.
pub struct rdd_device {
    _private: [u8; 0],
}

/// A protection domain (opaque handle): `rdd_pd_alloc` / `rdd_pd_free`.
pub struct rdd_pd {
    _private: [u8; 0],
}

/// A registered memory region with a library-owned buffer (opaque handle):
/// `rdd_mr_reg` / `rdd_mr_free`.
pub struct rdd_mr {
    _private: [u8; 0],
}

/// A completion queue (opaque handle): `rdd_cq_create` / `rdd_cq_destroy`.
pub struct rdd_cq {
    _private: [u8; 0],
}

/// A reliable-connected queue pair (opaque handle): `rdd_qp_create` /
/// `rdd_qp_destroy`.
pub struct rdd_qp {
    _private: [u8; 0],
}

/// Software-device configuration for `rdd_device_open_soft` (NULL there
/// means all defaults).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_soft_config {
    /// CQE size of new CQs: 64 or 128 (0: 64).
    pub cqe_size: u32,
    /// Delay in microseconds before an operation refused for lack of a
    /// posted receive (RNR) is retried, in thread mode (0: 20 us). In step
    /// mode every `rdd_device_step` is one retry.
    pub rnr_delay_us: u32,
}

/// `rdd_mr_reg` access bit: the device may write the region for local work
/// (receives, READ and atomic results). Numbered as `IBV_ACCESS_*`.
pub const RDD_ACCESS_LOCAL_WRITE: u32 = 0x1;
/// `rdd_mr_reg` / `rdd_connect_attr` access bit: peers may RDMA WRITE
/// (an MR with it needs `RDD_ACCESS_LOCAL_WRITE` too).
pub const RDD_ACCESS_REMOTE_WRITE: u32 = 0x2;
/// `rdd_mr_reg` / `rdd_connect_attr` access bit: peers may RDMA READ.
pub const RDD_ACCESS_REMOTE_READ: u32 = 0x4;
/// `rdd_mr_reg` / `rdd_connect_attr` access bit: peers may run atomics
/// (an MR with it needs `RDD_ACCESS_LOCAL_WRITE` too).
pub const RDD_ACCESS_REMOTE_ATOMIC: u32 = 0x8;
/// `rdd_mr_reg` access bit (regions only): memory windows may be bound to
/// the region, for `rdd_mr_expose_to`. Grants nothing by itself; devices
/// without windows ignore it.
pub const RDD_ACCESS_MW_BIND: u32 = 0x10;

const_assert_eq!(RDD_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE.0);
const_assert_eq!(RDD_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE.0);
const_assert_eq!(RDD_ACCESS_REMOTE_READ, Access::REMOTE_READ.0);
const_assert_eq!(RDD_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC.0);
const_assert_eq!(RDD_ACCESS_MW_BIND, Access::MW_BIND.0);
const_assert_eq!(
    RDD_ACCESS_LOCAL_WRITE
        | RDD_ACCESS_REMOTE_WRITE
        | RDD_ACCESS_REMOTE_READ
        | RDD_ACCESS_REMOTE_ATOMIC,
    Access::ALL.0
);

/// `rdd_qp_init.flags`: every send WR requests a completion (as if
/// `RDD_SEND_SIGNALED` were always set; `sq_sig_all` in verbs).
pub const RDD_QP_INIT_SIG_ALL: u32 = 0x1;

/// QP creation attributes for `rdd_qp_create` (NULL there means the
/// defaults: 64 send and 64 receive WRs, 4 SGEs each way, 64 inline
/// bytes). The device may grant more than asked: read the result with
/// `rdd_qp_query_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct rdd_qp_init {
    /// Send WRs the send queue must hold (at least 1).
    pub max_send_wr: u32,
    /// Receive WRs the receive queue must hold.
    pub max_recv_wr: u32,
    /// SGEs per send WR (at most 30).
    pub max_send_sge: u32,
    /// SGEs per receive WR (at most 64).
    pub max_recv_sge: u32,
    /// Inline payload bytes per send WR (at most 512).
    pub max_inline_data: u32,
    /// `RDD_QP_INIT_*` bits; unknown bits are `RDD_STATUS_INVALID_ARGUMENT`.
    pub flags: u32,
}

/// Connection data of a QP (`rdd_qp_query_info`), handed to the peer out of
/// band and passed to its `rdd_qp_connect`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_qp_info {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// Port LID (InfiniBand).
    pub lid: u16,
    /// Written as 0; ignored on input.
    pub reserved: u16,
    /// Port GID (RoCE).
    pub gid: [u8; 16],
    /// Path MTU in bytes.
    pub mtu: u32,
}

const_assert_eq!(size_of::<rdd_qp_info>(), 32);

/// Connection attributes for `rdd_qp_connect` (NULL there means no remote
/// access and infinite retries).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_connect_attr {
    /// Remote operations this QP executes for its peer
    /// (`RDD_ACCESS_REMOTE_*`; each is also checked against the target
    /// MR's access).
    pub access: u32,
    /// RNR retries, 0..7 (7 = infinite).
    pub rnr_retry: u8,
    /// Transport retries, 0..7.
    pub retry_cnt: u8,
    /// GRH traffic class: the DSCP/ECN byte on RoCEv2, so this QP's
    /// traffic can sit on its own PFC priority (0: default).
    pub traffic_class: u8,
    /// Service level (InfiniBand SL; VLAN priority on RoCE).
    pub sl: u8,
}

const_assert_eq!(size_of::<rdd_connect_attr>(), 8);

/// `rdd_cq_arm` flag: an event only for the next *solicited* completion.
pub const RDD_CQ_ARM_SOLICITED: u32 = 0x1;
const_assert_eq!(RDD_CQ_ARM_SOLICITED, RDD_MLX5_CQ_ARM_SOLICITED);

/// Most QPs that may complete on one CQ (each `rdd_cq_poll` passes all of
/// them).
pub const RDD_CQ_MAX_QPS: usize = 256;

/// Largest buffer `rdd_mr_reg` allocates (2^40 bytes).
pub const RDD_MR_MAX_LEN: usize = 0x100_0000_0000;

// ---------------------------------------------------------------------
// Slot table
// ---------------------------------------------------------------------

// Kinds of object, as stored in a handle's low byte (never 0, so a handle
// is never NULL).
const KIND_DEVICE: u8 = 1;
const KIND_PD: u8 = 2;
const KIND_MR: u8 = 3;
const KIND_CQ: u8 = 4;
const KIND_QP: u8 = 5;
/// The buffer pool (`ffi::pool`).
pub(super) const KIND_POOL: u8 = 6;
/// An exposure (`ffi::expose`).
pub(super) const KIND_EXPOSURE: u8 = 7;

const INDEX_SHIFT: u32 = 8;
const INDEX_BITS: u32 = 20;
const GEN_SHIFT: u32 = 32;
/// Slots per chunk; chunks are allocated on demand and never freed.
const CHUNK_SLOTS: usize = 256;
/// Most live objects at once.
const MAX_SLOTS: usize = 1 << INDEX_BITS;
const MAX_CHUNKS: usize = MAX_SLOTS / CHUNK_SLOTS;

// State word: generation in the top half, kind in bits 16..24, a reader
// count in bits 2..16, the exclusive bit and the live bit.
const LIVE: u64 = 1 << 0;
const EXCL: u64 = 1 << 1;
const READER: u64 = 1 << 2;
const READERS: u64 = 0xfffc;
const KIND_SHIFT: u32 = 16;

// The handle is an integer cast to a pointer: it needs 64 bits.
const_assert!(size_of::<usize>() == 8);

/// One table entry, on its own cache line so that handles used by
/// different threads never share one.
#[repr(align(64))]
struct Slot {
    state: AtomicU64,
    obj: AtomicPtr<()>,
}

struct Chunk {
    slots: [Slot; CHUNK_SLOTS],
}

/// Chunk pointers; a chunk, once published, is never freed or moved, so a
/// slot reference is `'static`.
static CHUNKS: [AtomicPtr<Chunk>; MAX_CHUNKS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_CHUNKS];

/// Slot allocation (the only lock of the object API).
struct Alloc {
    free: Vec<u32>,
    next: u32,
}

static ALLOC: Mutex<Alloc> = Mutex::new(Alloc {
    free: Vec::new(),
    next: 0,
});

fn alloc_lock() -> std::sync::MutexGuard<'static, Alloc> {
    // The allocator's data stays consistent across a panic (every update
    // is a single push/pop/increment), so a poisoned lock is still usable.
    ALLOC.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slot at `index`, if its chunk exists.
#[inline(always)]
fn slot_at(index: u32) -> Option<&'static Slot> {
    let chunk = CHUNKS
        .get(index as usize / CHUNK_SLOTS)?
        .load(Ordering::Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: a non-NULL chunk pointer was published (Release) after the
    // chunk was fully initialised and is never freed; slots are only
    // accessed through their atomics.
    Some(unsafe { &(*chunk).slots[index as usize % CHUNK_SLOTS] })
}

#[inline(always)]
fn encode(gen: u32, index: u32, kind: u8) -> usize {
    ((gen as usize) << GEN_SHIFT) | ((index as usize) << INDEX_SHIFT) | kind as usize
}

#[inline(always)]
fn live_word(gen: u32, kind: u8) -> u64 {
    ((gen as u64) << GEN_SHIFT) | ((kind as u64) << KIND_SHIFT) | LIVE
}

/// The parts of a handle of `kind`: (generation, index), or
/// `INVALID_HANDLE` for a value that is not shaped like one.
#[inline(always)]
fn decode(h: usize, kind: u8) -> Result<(u32, u32), rdd_status> {
    let index = (h >> INDEX_SHIFT) & (MAX_SLOTS - 1);
    // Bits between the index and the generation are always 0.
    let stray =
        (h >> (INDEX_SHIFT + INDEX_BITS)) & ((1 << (GEN_SHIFT - INDEX_SHIFT - INDEX_BITS)) - 1);
    if h as u8 != kind || stray != 0 {
        return Err(rdd_status::InvalidHandle);
    }
    Ok(((h >> GEN_SHIFT) as u32, index as u32))
}

/// An object type stored in the table.
///
/// # Implementation safety
/// `KIND` must be unique per type: a slot's kind decides which type its
/// object pointer is cast to.
pub(super) unsafe trait Object: Send + Sync + 'static {
    const KIND: u8;
}

/// Stores `obj` in a free slot and returns its handle. On failure the
/// object is dropped (destroying what it owns) and
/// `RESOURCE_EXHAUSTED` returned.
pub(super) fn insert<T: Object>(obj: Box<T>) -> Result<usize, rdd_status> {
    let index = {
        let mut a = alloc_lock();
        match a.free.pop() {
            Some(i) => i,
            None => {
                let i = a.next;
                if i as usize >= MAX_SLOTS {
                    drop(a);
                    drop(obj);
                    return Err(rdd_status::ResourceExhausted);
                }
                let c = i as usize / CHUNK_SLOTS;
                if CHUNKS[c].load(Ordering::Relaxed).is_null() {
                    let chunk = Box::new(Chunk {
                        slots: [const {
                            Slot {
                                state: AtomicU64::new(0),
                                obj: AtomicPtr::new(ptr::null_mut()),
                            }
                        }; CHUNK_SLOTS],
                    });
                    // Leaked on purpose: slots live for the whole program.
                    CHUNKS[c].store(Box::into_raw(chunk), Ordering::Release);
                }
                a.next = i + 1;
                i
            }
        }
    };
    let slot = slot_at(index).expect("allocated chunk");
    // A free slot's state holds only the generation its next object gets.
    let gen = (slot.state.load(Ordering::Relaxed) >> GEN_SHIFT) as u32;
    slot.obj
        .store(Box::into_raw(obj).cast::<()>(), Ordering::Relaxed);
    // Publishes the object: an acquirer that sees LIVE sees the pointer
    // and everything the constructor wrote.
    slot.state.store(live_word(gen, T::KIND), Ordering::Release);
    Ok(encode(gen, index, T::KIND))
}

/// Exclusive access to a live object: no other guard on it exists.
pub(super) struct Excl<T: Object> {
    slot: &'static Slot,
    obj: NonNull<T>,
    live: u64,
    index: u32,
}

/// Shared access to a live object: only other shared guards exist.
pub(super) struct Shared<T: Object> {
    slot: &'static Slot,
    obj: NonNull<T>,
}

/// Looks `h` up: its slot and the state word it must have when live.
#[inline(always)]
fn lookup(h: usize, kind: u8) -> Result<(&'static Slot, u64, u32), rdd_status> {
    if h == 0 {
        return Err(rdd_status::NullParameter);
    }
    let (gen, index) = decode(h, kind)?;
    let slot = slot_at(index).ok_or(rdd_status::InvalidHandle)?;
    Ok((slot, live_word(gen, kind), index))
}

/// Acquires `h` exclusively.
#[inline(always)]
pub(super) fn excl<T: Object>(h: usize) -> Result<Excl<T>, rdd_status> {
    let (slot, live, index) = lookup(h, T::KIND)?;
    match slot
        .state
        .compare_exchange(live, live | EXCL, Ordering::Acquire, Ordering::Relaxed)
    {
        Ok(_) => {}
        Err(now) if now & !(EXCL | READERS) == live => return Err(rdd_status::ResourceBusy),
        Err(_) => return Err(rdd_status::InvalidHandle),
    }
    let obj = slot.obj.load(Ordering::Relaxed).cast::<T>();
    // Live implies a non-NULL object pointer (set before LIVE, cleared
    // after it is withdrawn).
    let obj = NonNull::new(obj).expect("live slot has an object");
    Ok(Excl {
        slot,
        obj,
        live,
        index,
    })
}

/// Acquires `h` shared.
#[inline(always)]
pub(super) fn shared<T: Object>(h: usize) -> Result<Shared<T>, rdd_status> {
    let (slot, live, _) = lookup(h, T::KIND)?;
    let mut now = slot.state.load(Ordering::Relaxed);
    loop {
        if now & !(EXCL | READERS) != live {
            return Err(rdd_status::InvalidHandle);
        }
        if now & EXCL != 0 || now & READERS == READERS {
            return Err(rdd_status::ResourceBusy);
        }
        match slot.state.compare_exchange_weak(
            now,
            now + READER,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(v) => now = v,
        }
    }
    let obj = slot.obj.load(Ordering::Relaxed).cast::<T>();
    let obj = NonNull::new(obj).expect("live slot has an object");
    Ok(Shared { slot, obj })
}

impl<T: Object> Deref for Excl<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot is live and held exclusively, so the object
        // exists and no other reference to it does (the kind check made
        // the cast correct, `Object` contract).
        unsafe { self.obj.as_ref() }
    }
}

impl<T: Object> DerefMut for Excl<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; exclusivity makes `&mut` sound.
        unsafe { self.obj.as_mut() }
    }
}

impl<T: Object> Drop for Excl<T> {
    fn drop(&mut self) {
        // Nobody else can change the word while EXCL is set.
        self.slot.state.store(self.live, Ordering::Release);
    }
}

impl<T: Object> Excl<T> {
    /// Withdraws the handle (every later use is `INVALID_HANDLE`), frees
    /// the slot and drops the object.
    pub(super) fn destroy(self) {
        let this = mem::ManuallyDrop::new(self);
        let p = this.slot.obj.swap(ptr::null_mut(), Ordering::Relaxed);
        let next_gen = ((this.live >> GEN_SHIFT) as u32).wrapping_add(1);
        this.slot
            .state
            .store((next_gen as u64) << GEN_SHIFT, Ordering::Release);
        alloc_lock().free.push(this.index);
        // SAFETY: `p` came from `Box::into_raw` of a `T` (kind checked at
        // acquisition) and was withdrawn from the slot above, so this is
        // the only owner.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
}

impl<T: Object> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot is live and held shared: the object exists and
        // only shared references to it exist (objects are `Sync`).
        unsafe { self.obj.as_ref() }
    }
}

impl<T: Object> Drop for Shared<T> {
    fn drop(&mut self) {
        self.slot.state.fetch_sub(READER, Ordering::Release);
    }
}

/// A value only reachable through `&mut`: sharing the wrapper shares
/// nothing, so it is `Sync` whatever `T` is.
struct ExclusiveCell<T>(T);

impl<T> ExclusiveCell<T> {
    fn get_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

// SAFETY: no method gives access to `T` through `&ExclusiveCell<T>`, so a
// shared reference to it cannot be used to touch the value from two
// threads.
unsafe impl<T: Send> Sync for ExclusiveCell<T> {}

// ---------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------

struct DeviceObj {
    /// The software device (None for a kernel device).
    soft: Option<SoftDevice>,
    backend: Arc<dyn Backend>,
    /// Cloned by every PD and CQ.
    link: Arc<()>,
}

impl Drop for DeviceObj {
    fn drop(&mut self) {
        // The device thread holds the device's state alive: stop it.
        if let Some(s) = &self.soft {
            s.stop();
        }
    }
}

pub(super) struct PdObj {
    dev: usize,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) pd: u32,
    /// Cloned by every MR, QP and buffer pool.
    pub(super) link: Arc<()>,
    _dev_link: Arc<()>,
}

impl Drop for PdObj {
    fn drop(&mut self) {
        // No MR or QP is left (link count), so the device agrees.
        let _ = self.backend.dealloc_pd(self.pd);
    }
}

/// A zeroed, page-aligned buffer the library owns. The bytes are only
/// ever reached through raw pointers (C code and the device write them),
/// never through Rust references.
struct MrBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl MrBuf {
    fn new(len: usize) -> Option<MrBuf> {
        let layout = Layout::from_size_align(len.max(64), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        Some(MrBuf {
            ptr: NonNull::new(p)?,
            layout,
        })
    }
}

impl Drop for MrBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: plain owned heap memory; the struct itself only hands out the
// address, and whoever writes the bytes (C code, the device) orders its
// accesses through completions.
unsafe impl Send for MrBuf {}
// SAFETY: as above; `&MrBuf` exposes no bytes.
unsafe impl Sync for MrBuf {}

pub(super) struct MrObj {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) pd: u32,
    pub(super) keys: MrKeys,
    pub(super) access: Access,
    pub(super) len: usize,
    buf: MrBuf,
    /// Cloned by every exposure of the region (`ffi::expose`).
    pub(super) link: Arc<()>,
    pub(super) pd_link: Arc<()>,
}

impl MrObj {
    /// The buffer's address.
    pub(super) fn addr(&self) -> u64 {
        self.buf.ptr.as_ptr() as u64
    }
}

impl Drop for MrObj {
    fn drop(&mut self) {
        // Deregister first: afterwards the device never touches the
        // buffer, which is freed with the fields.
        let _ = self.backend.dereg_mr(self.keys.lkey);
    }
}

struct CqObj {
    dev: usize,
    backend: Arc<dyn Backend>,
    cqn: u32,
    cq: ExclusiveCell<CqImpl>,
    /// The sizing guard's account.
    budget: Arc<CqBudget>,
    /// The adaptive waiter's learnt state (`rdd_cq_wait`).
    adaptive: ExclusiveCell<crate::event::Adaptive>,
    /// Cloned once by every QP that completes here.
    link: Arc<()>,
    _keep: Arc<dyn Any + Send + Sync>,
    _dev_link: Arc<()>,
}

impl Drop for CqObj {
    fn drop(&mut self) {
        // No QP uses the CQ (link count); destroy it before its memory
        // (`_keep`) is released with the fields.
        let _ = self.backend.destroy_cq(self.cqn);
    }
}

impl CqObj {
    /// QPs that complete on this CQ.
    fn attached(&self) -> usize {
        Arc::strong_count(&self.link) - 1
    }
}

/// The poller behind a C CQ handle.
enum CqImpl {
    /// The crate's mlx5 core (software device, ConnectX).
    Mlx5(CompletionQueue),
    /// A provider-polled CQ (the verbs backend's rxe/siw rings or
    /// libibverbs).
    Portable(Box<dyn crate::api::PortableCq>),
}

impl CqImpl {
    fn arm(&mut self, solicited_only: bool) -> crate::error::Result<()> {
        match self {
            CqImpl::Mlx5(cq) => cq.arm(solicited_only),
            CqImpl::Portable(p) if solicited_only => p.arm_solicited(),
            CqImpl::Portable(p) => p.arm(),
        }
    }
}

/// The data path behind a C QP handle.
#[allow(clippy::large_enum_variant)]
enum QpImpl {
    /// The crate's mlx5 core (inline: no pointer chase when posting).
    Mlx5(QpQueuesOwned),
    /// A provider-posted QP (the verbs backend's rxe/siw rings or
    /// libibverbs).
    Portable(Box<dyn crate::api::PortableQp>),
}

impl QpImpl {
    /// The first WR that failed since creation or RESET.
    fn failure(&self) -> Option<crate::wr::FailedWr> {
        match self {
            QpImpl::Mlx5(q) => q.sq.failure().or(q.rq.failure()),
            QpImpl::Portable(p) => p.failure(),
        }
    }

    /// Send and receive WRs posted and not yet completed.
    fn outstanding(&self) -> u64 {
        match self {
            QpImpl::Mlx5(q) => {
                u64::from(q.sq.producer().wrapping_sub(q.sq.retired()))
                    + u64::from(q.rq.head().wrapping_sub(q.rq.tail()))
            }
            QpImpl::Portable(p) => p.outstanding(),
        }
    }
}

struct QpQueuesOwned {
    sq: SendQueue,
    rq: RecvQueue,
}

/// A CQ's sizing-guard account (as `api::Cq`'s): its depth, the worst-case
/// completions its QPs could have outstanding, and the opt-out.
struct CqBudget {
    capacity: u64,
    committed: core::sync::atomic::AtomicU64,
    unguarded: core::sync::atomic::AtomicBool,
    /// The run-time check of an unguarded CQ (as `api::Cq`'s).
    headroom: Headroom,
}

impl CqBudget {
    /// Whether posts must check the CQ's headroom.
    #[inline(always)]
    fn metered(&self) -> bool {
        // Relaxed: a setting, changed on the control path.
        self.unguarded.load(core::sync::atomic::Ordering::Relaxed)
    }

    /// Adds `n` unless that would exceed the depth of a guarded CQ.
    fn charge(&self, n: u64) -> bool {
        use core::sync::atomic::Ordering::Relaxed;
        // Relaxed: a counter of the control path; the handle table's
        // exclusive access to the CQ serialises QP creation on it anyway.
        let unguarded = self.unguarded.load(Relaxed);
        self.committed
            .fetch_update(Relaxed, Relaxed, |c| {
                (unguarded || c + n <= self.capacity).then_some(c + n)
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        // Relaxed: as in `charge`.
        let _ = self.committed.fetch_update(
            core::sync::atomic::Ordering::Relaxed,
            core::sync::atomic::Ordering::Relaxed,
            |c| Some(c.saturating_sub(n)),
        );
    }
}

struct QpObj {
    /// What this QP charged to its CQs' budgets (released on drop).
    charges: Vec<(Arc<CqBudget>, u64)>,
    /// The send and receive CQs' accounts (run-time headroom).
    send_budget: Arc<CqBudget>,
    recv_budget: Arc<CqBudget>,
    backend: Arc<dyn Backend>,
    qpn: u32,
    caps: QpCaps,
    send_cq: usize,
    recv_cq: usize,
    doorbells: u64,
    q: ExclusiveCell<QpImpl>,
    /// Initial send PSN.
    psn: u32,
    /// Send rate limit for the next connect (kbit/s, 0: none).
    rate_limit_kbps: u32,
    // Side tables the queues point into (heap buffers do not move).
    _sq_wrid: Vec<WrSlot>,
    _rq_wrid: Vec<u64>,
    _keep: Arc<dyn Any + Send + Sync>,
    _pd_link: Arc<()>,
    _cq_links: Vec<Arc<()>>,
}

impl Drop for QpObj {
    fn drop(&mut self) {
        // The device stops touching the queues; the memory and the side
        // tables go with the fields afterwards.
        let _ = self.backend.destroy_qp(self.qpn);
        for (b, n) in &self.charges {
            b.release(*n);
        }
    }
}

// SAFETY: each kind value is used by exactly one type.
unsafe impl Object for DeviceObj {
    const KIND: u8 = KIND_DEVICE;
}
// SAFETY: as above.
unsafe impl Object for PdObj {
    const KIND: u8 = KIND_PD;
}
// SAFETY: as above.
unsafe impl Object for MrObj {
    const KIND: u8 = KIND_MR;
}
// SAFETY: as above.
unsafe impl Object for CqObj {
    const KIND: u8 = KIND_CQ;
}
// SAFETY: as above.
unsafe impl Object for QpObj {
    const KIND: u8 = KIND_QP;
}

// ---------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------

#[inline(always)]
pub(super) fn h<T>(p: *const T) -> usize {
    p.addr()
}

#[inline(always)]
pub(super) fn as_handle<T>(h: usize) -> *mut T {
    ptr::without_provenance_mut(h)
}

/// Writes `v` to a caller's out-parameter.
///
/// # Safety
/// `out` is non-NULL and valid for a write of one `T`.
#[inline(always)]
pub(super) unsafe fn put<T>(out: *mut T, v: T) {
    // SAFETY: caller contract; unaligned writes accept any address.
    unsafe { out.write_unaligned(v) }
}

/// Checks a C array parameter: non-NULL (`NULL_PARAMETER`), aligned for
/// `T` and small enough to address (`INVALID_ARGUMENT`).
#[inline(always)]
fn check_array<T>(p: *const T, n: usize) -> Result<(), rdd_status> {
    if p.is_null() {
        return Err(rdd_status::NullParameter);
    }
    if p as usize % align_of::<T>() != 0 || n > isize::MAX as usize / size_of::<T>() {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(())
}

fn access_from(bits: u32) -> Result<Access, rdd_status> {
    if bits & !Access::ALL.0 != 0 {
        return Err(rdd_status::InvalidArgument);
    }
    Ok(Access(bits))
}

// ---------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------

/// Opens a new software device (the in-process HCA) in step mode: work
/// posted to its QPs executes only inside `rdd_device_step`, until
/// `rdd_device_start` starts its device thread.
///
/// `cfg` may be NULL (defaults). Errors: `NULL_PARAMETER` (`out`),
/// `INVALID_ARGUMENT` (a CQE size other than 0, 64 or 128).
///
/// # Safety
/// `cfg` is NULL or valid for reads of one `rdd_soft_config`; `out` is
/// valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_open_soft(
    cfg: *const rdd_soft_config,
    out: *mut *mut rdd_device,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let c = if cfg.is_null() {
            rdd_soft_config::default()
        } else {
            // SAFETY: non-NULL and readable (caller contract).
            unsafe { cfg.read_unaligned() }
        };
        let mut sc = SoftConfig::default();
        match c.cqe_size {
            0 => {}
            64 | 128 => sc.cqe_size = c.cqe_size,
            _ => return rdd_status::InvalidArgument,
        }
        if c.rnr_delay_us != 0 {
            sc.rnr_delay = Duration::from_micros(c.rnr_delay_us as u64);
        }
        let soft = SoftDevice::new(sc);
        let obj = Box::new(DeviceObj {
            backend: Arc::new(soft.clone()),
            soft: Some(soft),
            link: Arc::new(()),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Opens the kernel RDMA device `name` (e.g. "rxe0", "siw0", "mlx5_0";
/// NULL: the first one) on port 1, with the fastest data path it has:
/// the mlx5 core on ConnectX, rdma-direct's own rings on rxe and siw,
/// libibverbs otherwise (`RDMA_DIRECT_DATA_PATH=portable` or `direct`
/// in the environment overrides the choice). The device runs by itself:
/// `rdd_device_step`/`start`/`stop` are `UNSUPPORTED` on it. QPs connect
/// with `rdd_qp_connect` (InfiniBand and RoCE; iWARP needs rdma_cm, which
/// the C API does not offer yet: `UNSUPPORTED`).
///
/// Errors: `NO_DEVICE` (none, or none of that name), `PROVIDER_ERROR`,
/// `UNSUPPORTED` (a library built without the `verbs` feature).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is valid for a write
/// of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_open_verbs(
    name: *const core::ffi::c_char,
    out: *mut *mut rdd_device,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        #[cfg(feature = "verbs")]
        {
            let device = if name.is_null() {
                None
            } else {
                // SAFETY: non-NULL, NUL-terminated (caller contract).
                match unsafe { core::ffi::CStr::from_ptr(name) }.to_str() {
                    Ok(n) => Some(std::string::String::from(n)),
                    Err(_) => return rdd_status::InvalidArgument,
                }
            };
            let cfg = crate::verbs::VerbsConfig {
                device,
                port: 1,
                ..crate::verbs::VerbsConfig::default()
            };
            let dev = try_status!(crate::verbs::VerbsDevice::open(&cfg).map_err(rdd_status::from));
            let obj = Box::new(DeviceObj {
                backend: Arc::new(dev),
                soft: None,
                link: Arc::new(()),
            });
            let handle = try_status!(insert(obj));
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, as_handle(handle)) };
            rdd_status::Ok
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = name;
            rdd_status::Unsupported
        }
    })
}

/// Closes a device: stops its thread and frees it. Fails with
/// `RESOURCE_BUSY` (and changes nothing) while PDs or CQs of the device
/// exist or another thread is using the handle.
#[no_mangle]
pub extern "C" fn rdd_device_close(dev: *mut rdd_device) -> rdd_status {
    ffi_boundary!({
        let d = try_status!(excl::<DeviceObj>(h(dev)));
        if Arc::strong_count(&d.link) != 1 {
            return rdd_status::ResourceBusy;
        }
        d.destroy();
        rdd_status::Ok
    })
}

/// Runs one pass of the software device in the calling thread: executes
/// what is pending on every queue and writes the completions. `*out_work`
/// is the amount of work done (0: nothing was pending). Deterministic;
/// also allowed while the device thread runs.
///
/// # Safety
/// `out_work` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_step(dev: *mut rdd_device, out_work: *mut usize) -> rdd_status {
    ffi_boundary!({
        non_null!(out_work);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let Some(soft) = &d.soft else {
            return rdd_status::Unsupported;
        };
        let work = soft.step();
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_work, work) };
        rdd_status::Ok
    })
}

/// Starts the device thread (idempotent): from now on posted work executes
/// without `rdd_device_step`.
#[no_mangle]
pub extern "C" fn rdd_device_start(dev: *mut rdd_device) -> rdd_status {
    ffi_boundary!({
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let Some(soft) = &d.soft else {
            return rdd_status::Unsupported;
        };
        soft.start();
        rdd_status::Ok
    })
}

/// Stops the device thread if it runs (back to step mode) and waits for
/// it to exit.
#[no_mangle]
pub extern "C" fn rdd_device_stop(dev: *mut rdd_device) -> rdd_status {
    ffi_boundary!({
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let Some(soft) = &d.soft else {
            return rdd_status::Unsupported;
        };
        soft.stop();
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// Protection domain
// ---------------------------------------------------------------------

/// Allocates a protection domain on `dev`.
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_pd_alloc(dev: *mut rdd_device, out: *mut *mut rdd_pd) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let pd = match d.backend.alloc_pd() {
            Ok(pd) => pd,
            Err(e) => return e.into(),
        };
        let obj = Box::new(PdObj {
            dev: h(dev),
            backend: Arc::clone(&d.backend),
            pd,
            link: Arc::new(()),
            _dev_link: Arc::clone(&d.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Frees a protection domain. `RESOURCE_BUSY` while MRs or QPs of it
/// exist.
#[no_mangle]
pub extern "C" fn rdd_pd_free(pd: *mut rdd_pd) -> rdd_status {
    ffi_boundary!({
        let p = try_status!(excl::<PdObj>(h(pd)));
        if Arc::strong_count(&p.link) != 1 {
            return rdd_status::ResourceBusy;
        }
        p.destroy();
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// Memory region
// ---------------------------------------------------------------------

/// Allocates `len` zeroed, page-aligned bytes owned by the library and
/// registers them in `pd` with exactly `access` (`RDD_ACCESS_*` bits; ask
/// only for what peers need). The buffer's address is `rdd_mr_addr`; it is
/// valid until `rdd_mr_free`.
///
/// Errors: `INVALID_ARGUMENT` (unknown access bits, `len` above
/// `RDD_MR_MAX_LEN`), `INVALID_ATTRIBUTE` (remote write or atomic access
/// without `RDD_ACCESS_LOCAL_WRITE`), `RESOURCE_EXHAUSTED` (out of
/// memory).
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_reg(
    pd: *mut rdd_pd,
    len: usize,
    access: u32,
    out: *mut *mut rdd_mr,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let p = try_status!(shared::<PdObj>(h(pd)));
        if access & !Access::MR_ALL.0 != 0 {
            return rdd_status::InvalidArgument;
        }
        let access = Access(access);
        if len > RDD_MR_MAX_LEN {
            return rdd_status::InvalidArgument;
        }
        let Some(buf) = MrBuf::new(len) else {
            return rdd_status::ResourceExhausted;
        };
        // SAFETY: `buf` moves into the MrObj, which deregisters the key
        // before the buffer is freed (Drop runs before the fields drop).
        let keys = match unsafe {
            p.backend
                .reg_mr(p.pd, buf.ptr.as_ptr() as u64, len as u64, access)
        } {
            Ok(k) => k,
            Err(e) => return e.into(),
        };
        let obj = Box::new(MrObj {
            backend: Arc::clone(&p.backend),
            pd: p.pd,
            keys,
            access,
            len,
            buf,
            link: Arc::new(()),
            pd_link: Arc::clone(&p.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Deregisters a region and frees its buffer. Work still queued that
/// names it fails with a protection or access error completion; the
/// device never touches the buffer after this returns, and neither may
/// the caller.
#[no_mangle]
pub extern "C" fn rdd_mr_free(mr: *mut rdd_mr) -> rdd_status {
    ffi_boundary!({
        let m = try_status!(excl::<MrObj>(h(mr)));
        // Exposures hold the region (free them first).
        if Arc::strong_count(&m.link) != 1 {
            return rdd_status::ResourceBusy;
        }
        m.destroy();
        rdd_status::Ok
    })
}

/// The start of the region's buffer (also the remote address of byte 0
/// for a peer, as an integer).
///
/// # Safety
/// `out_addr` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_addr(mr: *const rdd_mr, out_addr: *mut *mut c_void) -> rdd_status {
    ffi_boundary!({
        non_null!(out_addr);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_addr, m.buf.ptr.as_ptr().cast::<c_void>()) };
        rdd_status::Ok
    })
}

/// The region's length in bytes (as registered).
///
/// # Safety
/// `out_len` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_len(mr: *const rdd_mr, out_len: *mut usize) -> rdd_status {
    ffi_boundary!({
        non_null!(out_len);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_len, m.len) };
        rdd_status::Ok
    })
}

/// The local key, for SGEs of this QP's work requests.
///
/// # Safety
/// `out_lkey` is valid for a write of one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_lkey(mr: *const rdd_mr, out_lkey: *mut u32) -> rdd_status {
    ffi_boundary!({
        non_null!(out_lkey);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_lkey, m.keys.lkey) };
        rdd_status::Ok
    })
}

/// The remote key, for peers (`rdd_wr.rkey`).
///
/// # Safety
/// `out_rkey` is valid for a write of one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_mr_rkey(mr: *const rdd_mr, out_rkey: *mut u32) -> rdd_status {
    ffi_boundary!({
        non_null!(out_rkey);
        let m = try_status!(shared::<MrObj>(h(mr)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_rkey, m.keys.rkey) };
        rdd_status::Ok
    })
}

// ---------------------------------------------------------------------
// Completion queue
// ---------------------------------------------------------------------

/// Creates a completion queue with room for at least `depth` completions
/// (1..32767; `INVALID_ATTRIBUTE` otherwise).
///
/// # Safety
/// `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_create(
    dev: *mut rdd_device,
    depth: u32,
    out: *mut *mut rdd_cq,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let raw = match d.backend.create_cq(depth) {
            Ok(r) => r,
            Err(e) => return e.into(),
        };
        let cq = match raw.path {
            // SAFETY: the backend's descriptor names live CQ memory kept
            // alive by `raw.keep`, which the CqObj holds as long as the
            // poller.
            RawCqPath::Mlx5(dv) => match unsafe { CompletionQueue::from_raw(&dv) } {
                Ok(mut cq) => {
                    // The device never scatters to CQEs; never trust a copy.
                    cq.set_scatter_to_cqe(false);
                    CqImpl::Mlx5(cq)
                }
                Err(e) => {
                    let _ = d.backend.destroy_cq(raw.cqn);
                    return e.into();
                }
            },
            RawCqPath::Portable(p) => CqImpl::Portable(p),
        };
        let capacity = u64::from(match &cq {
            CqImpl::Mlx5(c) => c.cqe_cnt(),
            CqImpl::Portable(p) => p.depth(),
        });
        let obj = Box::new(CqObj {
            dev: h(dev),
            backend: Arc::clone(&d.backend),
            cqn: raw.cqn,
            budget: Arc::new(CqBudget {
                capacity,
                committed: core::sync::atomic::AtomicU64::new(0),
                unguarded: core::sync::atomic::AtomicBool::new(false),
                headroom: Headroom::new(capacity),
            }),
            cq: ExclusiveCell(cq),
            adaptive: ExclusiveCell(crate::event::Adaptive::new(Default::default())),
            link: Arc::new(()),
            _keep: raw.keep,
            _dev_link: Arc::clone(&d.link),
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Destroys a completion queue. `RESOURCE_BUSY` while a QP uses it.
#[no_mangle]
pub extern "C" fn rdd_cq_destroy(cq: *mut rdd_cq) -> rdd_status {
    ffi_boundary!({
        let c = try_status!(excl::<CqObj>(h(cq)));
        if c.attached() != 0 {
            return rdd_status::ResourceBusy;
        }
        c.destroy();
        rdd_status::Ok
    })
}

/// A fixed-capacity list of exclusively held QPs (no allocation on the
/// data path).
struct QpList {
    items: [MaybeUninit<Excl<QpObj>>; RDD_CQ_MAX_QPS],
    len: usize,
}

impl QpList {
    fn new() -> QpList {
        QpList {
            items: [const { MaybeUninit::uninit() }; RDD_CQ_MAX_QPS],
            len: 0,
        }
    }

    fn push(&mut self, g: Excl<QpObj>) {
        self.items[self.len].write(g);
        self.len += 1;
    }

    fn as_mut_slice(&mut self) -> &mut [Excl<QpObj>] {
        // SAFETY: the first `len` items were written by `push` and are
        // initialised; `MaybeUninit<T>` has the layout of `T`.
        unsafe { core::slice::from_raw_parts_mut(self.items.as_mut_ptr().cast(), self.len) }
    }
}

impl Drop for QpList {
    fn drop(&mut self) {
        for g in &mut self.items[..self.len] {
            // SAFETY: initialised by `push`, dropped once.
            unsafe { g.assume_init_drop() };
        }
    }
}

impl CqRoute for QpList {
    #[inline]
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        self.as_mut_slice()
            .iter_mut()
            .find(|q| q.qpn == qpn)
            .and_then(|q| match q.q.get_mut() {
                QpImpl::Mlx5(owned) => Some(QpQueues {
                    sq: &mut owned.sq,
                    rq: &mut owned.rq,
                }),
                QpImpl::Portable(_) => None,
            })
    }
}

/// Polls up to `n` completions into `out[0..n]`; `*out_count` (0..n) is
/// the number written.
///
/// `qps[0..nqps]` must be exactly the QPs that complete on this CQ (as
/// send or receive CQ), each once: the poller routes every completion to
/// its QP's queues by QP number, and a list that omits one would drop its
/// completions, so it is rejected with `INVALID_ARGUMENT` (as are a QP of
/// another CQ and a repeated QP). All the handles are used by the call.
/// A failed completion moves its QP to the error state; later work on it
/// completes with `RDD_WC_WR_FLUSH_ERR`.
///
/// Errors leave `out` and `*out_count` unwritten: `NULL_PARAMETER` (a NULL
/// array, output or QP handle), `INVALID_HANDLE`, `RESOURCE_BUSY` (a
/// handle in use by another thread), `INVALID_ARGUMENT`, `CQE_CORRUPT`.
///
/// # Safety
/// `qps` points to `nqps` readable handles; `out` is valid for writes of
/// `n` `rdd_wc`; `out_count` for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_poll(
    cq: *mut rdd_cq,
    qps: *const *mut rdd_qp,
    nqps: usize,
    out: *mut rdd_wc,
    n: usize,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        try_status!(check_array(qps, nqps));
        try_status!(check_array(out.cast_const(), n));
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        // SAFETY: the caller's contract on `qps` (checked above).
        let mut list = match unsafe { route_list(&c, cq, qps, nqps) } {
            Ok(l) => l,
            Err(s) => return s,
        };
        // SAFETY: `out` is non-NULL, aligned and valid for `n` writes
        // (checked / caller contract); `rdd_wc` has the layout of `Wc`
        // (asserted in the mlx5 module) and every bit pattern is valid.
        let out_wc = unsafe { core::slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let budget = Arc::clone(&c.budget);
        match poll_counted(c.cq.get_mut(), &budget, &mut list, out_wc) {
            Ok(count) => {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_count, count) };
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}

/// Polls, and on an unguarded CQ gives every consumed CQE's room back to
/// the posters' headroom check (forced signals the poller retires without
/// reporting included: the consumer index counts them).
fn poll_counted(
    cq: &mut CqImpl,
    budget: &CqBudget,
    list: &mut QpList,
    out: &mut [Wc],
) -> crate::error::Result<usize> {
    let cq = match cq {
        CqImpl::Mlx5(cq) => cq,
        CqImpl::Portable(p) => {
            // The provider retires queue space itself; it reports every
            // completion it was asked for (as `api::Cq`'s portable case).
            let r = p.poll(out);
            if budget.metered() {
                budget.headroom.unreserve(*r.as_ref().unwrap_or(&0) as u64);
            }
            return r;
        }
    };
    if !budget.metered() {
        return cq.poll(list, out);
    }
    let ci = cq.consumer_index();
    let r = cq.poll(list, out);
    let consumed = cq.consumer_index().wrapping_sub(ci);
    budget.headroom.unreserve(u64::from(consumed));
    r
}

/// The QPs a poll routes to: every QP attached to the CQ, each exactly
/// once, each completing there.
///
/// # Safety
/// `qps` is non-NULL, aligned and holds `nqps` readable handles.
unsafe fn route_list(
    c: &CqObj,
    cq: *mut rdd_cq,
    qps: *const *mut rdd_qp,
    nqps: usize,
) -> Result<QpList, rdd_status> {
    if nqps != c.attached() {
        return Err(rdd_status::InvalidArgument);
    }
    let mut list = QpList::new();
    for i in 0..nqps {
        // SAFETY: `qps` holds `nqps` readable handles (caller contract).
        let qh = h(unsafe { qps.add(i).read() });
        let g = match excl::<QpObj>(qh) {
            Ok(g) => g,
            Err(rdd_status::ResourceBusy) if qps_index_handle(qps, i, qh) => {
                // Held by this very call: a repeated QP.
                return Err(rdd_status::InvalidArgument);
            }
            Err(e) => return Err(e),
        };
        if g.send_cq != h(cq) && g.recv_cq != h(cq) {
            return Err(rdd_status::InvalidArgument);
        }
        list.push(g);
    }
    Ok(list)
}

/// Opts the CQ in (`unguarded` = 0, the default) or out (non-zero) of the
/// sizing guard: `rdd_qp_create` refuses with `CQ_TOO_SMALL` a QP whose
/// queues could, flushed at once, overfill a guarded CQ. Opt out only if
/// you moderate completions yourself; an overrun loses completions.
///
/// # Safety
/// None beyond a handle from `rdd_cq_create`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_set_unguarded(
    cq: *mut rdd_cq,
    unguarded: core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        let c = try_status!(shared::<CqObj>(h(cq)));
        // Relaxed: a setting read on the control path.
        c.budget
            .unguarded
            .store(unguarded != 0, core::sync::atomic::Ordering::Relaxed);
        rdd_status::Ok
    })
}

/// The CQ's depth and the worst-case completions its QPs could have
/// outstanding (`*out_committed`): a QP refused with `CQ_TOO_SMALL` needs
/// a CQ of at least `committed` + its own send and receive queue sizes.
///
/// # Safety
/// `out_depth` and `out_committed` are valid for a write of one
/// `uint64_t` each.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_budget(
    cq: *const rdd_cq,
    out_depth: *mut u64,
    out_committed: *mut u64,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_depth);
        non_null!(out_committed);
        let c = try_status!(shared::<CqObj>(h(cq)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe {
            put(out_depth, c.budget.capacity);
            // Relaxed: a snapshot.
            put(
                out_committed,
                c.budget
                    .committed
                    .load(core::sync::atomic::Ordering::Relaxed),
            );
        }
        rdd_status::Ok
    })
}

/// `rdd_cq_wait` modes.
pub const RDD_WAIT_BUSY_POLL: u32 = 0;
/// Arm, poll once more, sleep on the CQ's event fd.
pub const RDD_WAIT_EVENT: u32 = 1;
/// Spin for a learnt budget, then as `RDD_WAIT_EVENT`.
pub const RDD_WAIT_ADAPTIVE: u32 = 2;

/// A CQ as `event::wait` drives it from C.
struct FfiWaitable<'a> {
    cq: &'a mut CqImpl,
    budget: &'a CqBudget,
    list: &'a mut QpList,
    backend: &'a dyn Backend,
    cqn: u32,
}

impl crate::event::Waitable for FfiWaitable<'_> {
    fn poll(&mut self, out: &mut [Wc]) -> crate::error::Result<usize> {
        poll_counted(self.cq, self.budget, self.list, out)
    }
    fn arm(&mut self) -> crate::error::Result<()> {
        self.cq.arm(false)
    }
    fn consume(&mut self) -> crate::error::Result<u32> {
        let n = self.backend.cq_event_consume(self.cqn)?;
        if let CqImpl::Mlx5(cq) = self.cq {
            // Each delivered event advances the arm sequence number.
            cq.events_consumed(n);
        }
        Ok(n)
    }
    fn fd(&self) -> crate::error::Result<i32> {
        self.backend.cq_event_fd(self.cqn)
    }
}

/// Waits up to `timeout_ns` nanoseconds for completions, then polls them
/// like `rdd_cq_poll` (same `qps` rules): `*out_count` >= 1 and
/// `RDD_STATUS_OK`, or `RDD_STATUS_TIMEOUT` (and `*out_count` = 0). Never
/// blocks longer than the timeout. `mode` is `RDD_WAIT_BUSY_POLL`,
/// `RDD_WAIT_EVENT` (sleeps in the kernel) or `RDD_WAIT_ADAPTIVE` (spins for
/// a budget learnt per CQ, then sleeps); other values are
/// `INVALID_ARGUMENT`.
///
/// # Safety
/// As `rdd_cq_poll`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_wait(
    cq: *mut rdd_cq,
    qps: *const *mut rdd_qp,
    nqps: usize,
    out: *mut rdd_wc,
    n: usize,
    mode: u32,
    timeout_ns: u64,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        try_status!(check_array(qps, nqps));
        try_status!(check_array(out.cast_const(), n));
        let mode = match mode {
            RDD_WAIT_BUSY_POLL => crate::event::WaitMode::BusyPoll,
            RDD_WAIT_EVENT => crate::event::WaitMode::Event,
            RDD_WAIT_ADAPTIVE => crate::event::WaitMode::Adaptive,
            _ => return rdd_status::InvalidArgument,
        };
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        // SAFETY: the caller's contract on `qps` (checked above).
        let mut list = match unsafe { route_list(&c, cq, qps, nqps) } {
            Ok(l) => l,
            Err(s) => return s,
        };
        // SAFETY: as in `rdd_cq_poll`.
        let out_wc = unsafe { core::slice::from_raw_parts_mut(out.cast::<Wc>(), n) };
        let backend = Arc::clone(&c.backend);
        let budget = Arc::clone(&c.budget);
        let cqn = c.cqn;
        let mut adaptive = *c.adaptive.get_mut();
        let r = crate::event::wait(
            &mut FfiWaitable {
                cq: c.cq.get_mut(),
                budget: &budget,
                list: &mut list,
                backend: &*backend,
                cqn,
            },
            out_wc,
            mode,
            &mut adaptive,
            core::time::Duration::from_nanos(timeout_ns),
        );
        *c.adaptive.get_mut() = adaptive;
        let count = *r.as_ref().unwrap_or(&0);
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_count, count) };
        match r {
            Ok(_) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}

/// The fd that becomes readable when the CQ, armed by an `RDD_WAIT_EVENT`
/// or `RDD_WAIT_ADAPTIVE` wait, gets a completion: for the application's
/// own epoll set.
///
/// # Safety
/// `out_fd` is valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_cq_event_fd(
    cq: *mut rdd_cq,
    out_fd: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_fd);
        let c = try_status!(shared::<CqObj>(h(cq)));
        match c.backend.cq_event_fd(c.cqn) {
            Ok(fd) => {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_fd, fd) };
                rdd_status::Ok
            }
            Err(e) => e.into(),
        }
    })
}

/// An asynchronous device event (see `rdd_device_poll_async_event`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdd_async_event {
    /// `RDD_EVENT_*` (the `ibv_event_type` numbering).
    pub kind: u32,
    /// The QP number, CQ number or port number the event is about (as
    /// `kind` implies; 0 for device-wide events).
    pub element: u32,
}

/// A CQ overran or failed; `element` is the CQ number.
pub const RDD_EVENT_CQ_ERR: u32 = 0;
/// A QP hit a fatal error and is in ERROR; `element` is the QP number.
/// Recover it with `rdd_qp_recover`.
pub const RDD_EVENT_QP_FATAL: u32 = 1;
/// An invalid request reached a QP, now in ERROR; `element` is the QPN.
pub const RDD_EVENT_QP_REQ_ERR: u32 = 2;
/// A remote access violation on a QP, now in ERROR; `element` is the QPN.
pub const RDD_EVENT_QP_ACCESS_ERR: u32 = 3;
/// The device failed: close and reopen it.
pub const RDD_EVENT_DEVICE_FATAL: u32 = 8;
/// A port became active; `element` is the port number.
pub const RDD_EVENT_PORT_ACTIVE: u32 = 9;
/// A port went down; `element` is the port number.
pub const RDD_EVENT_PORT_ERR: u32 = 10;

/// The C form of an event (kinds without a constant above keep their
/// `ibv_event_type` value).
fn async_event_c(e: crate::api::AsyncEvent) -> rdd_async_event {
    use crate::api::AsyncEvent as E;
    let (kind, element) = match e {
        E::CqError { cqn } => (RDD_EVENT_CQ_ERR, cqn),
        E::QpFatal { qpn } => (RDD_EVENT_QP_FATAL, qpn),
        E::QpRequestError { qpn } => (RDD_EVENT_QP_REQ_ERR, qpn),
        E::QpAccessError { qpn } => (RDD_EVENT_QP_ACCESS_ERR, qpn),
        E::CommEstablished { qpn } => (4, qpn),
        E::SqDrained { qpn } => (5, qpn),
        E::LastWqeReached { qpn } => (16, qpn),
        E::DeviceFatal => (RDD_EVENT_DEVICE_FATAL, 0),
        E::PortActive { port } => (RDD_EVENT_PORT_ACTIVE, u32::from(port)),
        E::PortError { port } => (RDD_EVENT_PORT_ERR, u32::from(port)),
        E::Other { kind, element } => (kind, element),
    };
    rdd_async_event { kind, element }
}

/// Takes the device's next asynchronous event without blocking:
/// `*out_found` is 1 and `*out` filled, or 0 when none is pending. A QP
/// event of kind `RDD_EVENT_QP_FATAL`, `_REQ_ERR` or `_ACCESS_ERR` means
/// the device moved that QP to ERROR: recover it with `rdd_qp_recover`.
///
/// # Safety
/// `out` is valid for a write of one `rdd_async_event`, `out_found` of one
/// `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_poll_async_event(
    dev: *mut rdd_device,
    out: *mut rdd_async_event,
    out_found: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        non_null!(out_found);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let ev = try_status!(d.backend.poll_async_event().map_err(rdd_status::from));
        if let Some(e) = ev {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, async_event_c(e)) };
        }
        // SAFETY: as above.
        unsafe { put(out_found, ev.is_some() as core::ffi::c_int) };
        rdd_status::Ok
    })
}

/// An fd that is readable while asynchronous events are pending on the
/// device, for the application's own epoll set.
///
/// # Safety
/// `out_fd` is valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_async_event_fd(
    dev: *mut rdd_device,
    out_fd: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_fd);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        let fd = try_status!(d.backend.async_event_fd().map_err(rdd_status::from));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_fd, fd) };
        rdd_status::Ok
    })
}

/// True if handle `qh` at `qps[i]` also appears at an earlier index.
fn qps_index_handle(qps: *const *mut rdd_qp, i: usize, qh: usize) -> bool {
    (0..i).any(|j| {
        // SAFETY: `j < i < nqps`, inside the array the caller vouched for
        // (`rdd_cq_poll` contract).
        h(unsafe { qps.add(j).read() }) == qh
    })
}

/// Arms the CQ: requests a completion event for the next completion (or,
/// with `RDD_CQ_ARM_SOLICITED`, the next solicited one).
/// `INVALID_ARGUMENT` for unknown flag bits.
#[no_mangle]
pub extern "C" fn rdd_cq_arm(cq: *mut rdd_cq, flags: u32) -> rdd_status {
    ffi_boundary!({
        let mut c = try_status!(excl::<CqObj>(h(cq)));
        if flags & !RDD_CQ_ARM_SOLICITED != 0 {
            return rdd_status::InvalidArgument;
        }
        match c.cq.get_mut().arm(flags & RDD_CQ_ARM_SOLICITED != 0) {
            Ok(()) => rdd_status::Ok,
            Err(e) => e.into(),
        }
    })
}

// ---------------------------------------------------------------------
// Queue pair
// ---------------------------------------------------------------------

impl Default for rdd_qp_init {
    fn default() -> Self {
        rdd_qp_init {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            flags: 0,
        }
    }
}

/// Creates an RC queue pair (in the RESET state) on `pd` whose sends
/// complete on `send_cq` and receives on `recv_cq` (may be the same CQ).
/// All three must belong to one device (`INVALID_ARGUMENT`). `init` may be
/// NULL for the defaults. The CQs are used by the call (not the PD).
///
/// Errors: `INVALID_ATTRIBUTE` (limits above the device's),
/// `INVALID_ARGUMENT` (unknown `init->flags`), `RESOURCE_EXHAUSTED` (a CQ
/// already serves `RDD_CQ_MAX_QPS` QPs).
///
/// # Safety
/// `init` is NULL or valid for reads of one `rdd_qp_init`; `out` is valid
/// for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_create(
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    init: *const rdd_qp_init,
    out: *mut *mut rdd_qp,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let init = if init.is_null() {
            rdd_qp_init::default()
        } else {
            // SAFETY: non-NULL and readable (caller contract).
            unsafe { init.read_unaligned() }
        };
        if init.flags & !RDD_QP_INIT_SIG_ALL != 0 {
            return rdd_status::InvalidArgument;
        }
        let p = try_status!(shared::<PdObj>(h(pd)));
        let scq = try_status!(excl::<CqObj>(h(send_cq)));
        let rcq = if h(recv_cq) == h(send_cq) {
            None
        } else {
            Some(try_status!(excl::<CqObj>(h(recv_cq))))
        };
        let rcq_ref: &CqObj = rcq.as_deref().unwrap_or(&*scq);
        if scq.dev != p.dev || rcq_ref.dev != p.dev {
            return rdd_status::InvalidArgument;
        }
        if scq.attached() >= RDD_CQ_MAX_QPS || rcq_ref.attached() >= RDD_CQ_MAX_QPS {
            return rdd_status::ResourceExhausted;
        }
        let qi = QpInit {
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr,
            max_send_sge: init.max_send_sge,
            max_recv_sge: init.max_recv_sge,
            max_inline_data: init.max_inline_data,
        };
        let b = &p.backend;
        let raw = match b.create_qp(p.pd, scq.cqn, rcq_ref.cqn, &qi) {
            Ok(r) => r,
            Err(e) => return e.into(),
        };
        let cfg = SqConfig {
            sig_all: init.flags & RDD_QP_INIT_SIG_ALL != 0,
            ..SqConfig::default()
        };
        let (mut qimpl, sq_need, rq_need, sq_wrid, rq_wrid) = match raw.path {
            RawQpPath::Mlx5(dv) => {
                let mut sq_wrid = vec![WrSlot::default(); dv.sq_wqe_cnt as usize];
                let mut rq_wrid = vec![0u64; dv.rq_wqe_cnt as usize];
                let built = (|| {
                    // SAFETY: the descriptor names queue memory kept alive
                    // by `raw.keep` (held by the QpObj); the side tables
                    // are owned by the QpObj and their heap buffers never
                    // move; every SGE is checked by the device against its
                    // registered regions (lkey, bounds, PD, access) before
                    // any access, and scatter-to-CQE is off on the pollers.
                    let sq = unsafe {
                        SendQueue::from_raw(
                            &dv,
                            raw.qpn,
                            raw.caps,
                            cfg,
                            NonNull::new(sq_wrid.as_mut_ptr())
                                .ok_or(rdd_status::InvalidGeometry)?,
                            sq_wrid.len(),
                        )
                    }?;
                    // SAFETY: as above.
                    let rq = unsafe {
                        RecvQueue::from_raw(
                            &dv,
                            &raw.caps,
                            NonNull::new(rq_wrid.as_mut_ptr())
                                .ok_or(rdd_status::InvalidGeometry)?,
                            rq_wrid.len(),
                        )
                    }?;
                    Ok::<_, rdd_status>((sq, rq))
                })();
                let (sq, rq) = match built {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = b.destroy_qp(raw.qpn);
                        return e;
                    }
                };
                (
                    QpImpl::Mlx5(QpQueuesOwned { sq, rq }),
                    u64::from(dv.sq_wqe_cnt),
                    u64::from(dv.rq_wqe_cnt),
                    sq_wrid,
                    rq_wrid,
                )
            }
            RawQpPath::Portable(p) => {
                // The provider (libibverbs, or the verbs backend's own
                // rxe/siw rings) keeps the queues; signal-all QPs exist
                // only on the mlx5 core.
                if cfg.sig_all {
                    drop(p);
                    let _ = b.destroy_qp(raw.qpn);
                    return rdd_status::Unsupported;
                }
                let (s, r) = p.capacity();
                (
                    QpImpl::Portable(p),
                    u64::from(s),
                    u64::from(r),
                    Vec::new(),
                    Vec::new(),
                )
            }
        };
        // The CQ sizing guard (as `api::Pd::create_qp`): every WR the
        // queues can hold may complete at once (a flush), so each CQ must
        // hold the sum over its QPs.
        let charges = match &rcq {
            None if scq.budget.charge(sq_need + rq_need) => {
                vec![(Arc::clone(&scq.budget), sq_need + rq_need)]
            }
            Some(r) if scq.budget.charge(sq_need) => {
                if r.budget.charge(rq_need) {
                    vec![
                        (Arc::clone(&scq.budget), sq_need),
                        (Arc::clone(&r.budget), rq_need),
                    ]
                } else {
                    scq.budget.release(sq_need);
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        if charges.is_empty() {
            drop(qimpl);
            let _ = b.destroy_qp(raw.qpn);
            return rdd_status::CqTooSmall;
        }
        match &mut qimpl {
            QpImpl::Mlx5(q) => {
                q.sq.set_state(QpState::Reset);
                q.rq.set_state(QpState::Reset);
            }
            QpImpl::Portable(p) => p.state_changed(QpState::Reset),
        }
        let mut cq_links = vec![Arc::clone(&scq.link)];
        if let Some(r) = &rcq {
            cq_links.push(Arc::clone(&r.link));
        }
        let send_budget = Arc::clone(&scq.budget);
        let recv_budget = Arc::clone(rcq.as_ref().map_or(&scq.budget, |r| &r.budget));
        let obj = Box::new(QpObj {
            charges,
            send_budget,
            recv_budget,
            backend: Arc::clone(b),
            qpn: raw.qpn,
            caps: raw.caps,
            send_cq: h(send_cq),
            recv_cq: h(recv_cq),
            doorbells: 0,
            q: ExclusiveCell(qimpl),
            psn: raw.psn & 0xff_ffff,
            rate_limit_kbps: 0,
            _sq_wrid: sq_wrid,
            _rq_wrid: rq_wrid,
            _keep: raw.keep,
            _pd_link: Arc::clone(&p.link),
            _cq_links: cq_links,
        });
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Destroys a queue pair. Work in flight is abandoned (its completions,
/// if any arrive, are discarded). The QP's CQs are used by the call
/// (`RESOURCE_BUSY` while another thread polls them). Once this returns
/// the device no longer touches the buffers of the abandoned work.
#[no_mangle]
pub extern "C" fn rdd_qp_destroy(qp: *mut rdd_qp) -> rdd_status {
    ffi_boundary!({
        let q = try_status!(excl::<QpObj>(h(qp)));
        // Hold the CQs so no poll sees the attached count change.
        let _scq = try_status!(excl::<CqObj>(q.send_cq));
        let _rcq = if q.recv_cq != q.send_cq {
            Some(try_status!(excl::<CqObj>(q.recv_cq)))
        } else {
            None
        };
        q.destroy();
        rdd_status::Ok
    })
}

/// The connection data to give the peer (for its `rdd_qp_connect`).
///
/// # Safety
/// `out` is valid for a write of one `rdd_qp_info`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_query_info(qp: *const rdd_qp, out: *mut rdd_qp_info) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let q = try_status!(shared::<QpObj>(h(qp)));
        let port = q.backend.port();
        let info = rdd_qp_info {
            qpn: q.qpn,
            psn: q.psn,
            lid: port.lid,
            reserved: 0,
            gid: port.gid,
            mtu: port.mtu,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, info) };
        rdd_status::Ok
    })
}

/// The capabilities the QP was granted (at least what `rdd_qp_init`
/// asked): the SGE and inline limits posts are checked against.
///
/// # Safety
/// `out` is valid for a write of one `rdd_qp_caps`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_query_caps(qp: *const rdd_qp, out: *mut rdd_qp_caps) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let q = try_status!(shared::<QpObj>(h(qp)));
        let caps = rdd_qp_caps {
            max_send_sge: q.caps.max_send_sge,
            max_inline_data: q.caps.max_inline_data,
            max_recv_sge: q.caps.max_recv_sge,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, caps) };
        rdd_status::Ok
    })
}

/// The first work request that failed on this QP since it was created or
/// last reset, as it was posted (`rdd_qp_failed_wr`). Flush errors do not
/// count: this is the WR that broke the QP. 56 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_failed_wr {
    /// The WR's id.
    pub wr_id: u64,
    /// Completion status (`RDD_WC_*`).
    pub status: u32,
    /// Raw vendor syndrome.
    pub vendor_err: u32,
    /// Operation (`RDD_WC_OP_*`).
    pub opcode: u32,
    /// Raw mlx5 syndrome.
    pub syndrome: u8,
    /// 1 for a receive, 0 for a send-queue WR.
    pub recv: u8,
    /// 1 if the payload was inline.
    pub inline_data: u8,
    /// Written as 0.
    pub reserved: u8,
    /// First local buffer (0 for inline data).
    pub local_addr: u64,
    /// Total local length (inline bytes for inline data).
    pub length: u32,
    /// Local key of the first buffer.
    pub lkey: u32,
    /// Remote address (RDMA and atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics).
    pub rkey: u32,
    /// Written as 0.
    pub reserved2: u32,
}

const_assert_eq!(size_of::<rdd_failed_wr>(), 56);

/// The C form of a failed WR.
fn failed_wr_c(f: &crate::wr::FailedWr) -> rdd_failed_wr {
    rdd_failed_wr {
        wr_id: f.wr_id,
        status: f.status.0,
        vendor_err: f.vendor_err,
        opcode: f.opcode.0,
        syndrome: f.syndrome,
        recv: f.recv as u8,
        inline_data: f.inline as u8,
        reserved: 0,
        local_addr: f.local_addr,
        length: f.length,
        lkey: f.lkey,
        remote_addr: f.remote_addr,
        rkey: f.rkey,
        reserved2: 0,
    }
}

/// The first WR that failed on `qp` (see `rdd_failed_wr`). `*out_found` is
/// 1 and `*out` filled if there is one, 0 (and `*out` untouched)
/// otherwise. `rdd_wc_status_causes` explains the status in words.
///
/// # Safety
/// `out` is valid for a write of one `rdd_failed_wr`, `out_found` of one
/// `int`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_failed_wr(
    qp: *mut rdd_qp,
    out: *mut rdd_failed_wr,
    out_found: *mut core::ffi::c_int,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        non_null!(out_found);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        let found = q.q.get_mut().failure();
        if let Some(f) = found {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, failed_wr_c(&f)) };
        }
        // SAFETY: as above.
        unsafe { put(out_found, found.is_some() as core::ffi::c_int) };
        rdd_status::Ok
    })
}

/// The number of send doorbells this QP has rung (one per non-empty
/// `rdd_qp_post_send` call): a measure of batching.
///
/// # Safety
/// `out_count` is valid for a write of one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_doorbells(qp: *const rdd_qp, out_count: *mut u64) -> rdd_status {
    ffi_boundary!({
        non_null!(out_count);
        let q = try_status!(shared::<QpObj>(h(qp)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_count, q.doorbells) };
        rdd_status::Ok
    })
}

/// Sets the QP's send rate limit in kbit/s (0: none), applied by the next
/// `rdd_qp_connect` (or `rdd_qp_recover` with a peer). Devices without
/// packet pacing (the software device, rxe, siw) then refuse the connect
/// with `UNSUPPORTED`; ConnectX paces through verbs.
#[no_mangle]
pub extern "C" fn rdd_qp_set_rate_limit(qp: *mut rdd_qp, kbps: u32) -> rdd_status {
    ffi_boundary!({
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        q.rate_limit_kbps = kbps;
        rdd_status::Ok
    })
}

/// Moves the QP from RESET through INIT and RTR to RTS, connected to the
/// peer `remote` describes. `attr` may be NULL (no remote access, infinite
/// retries).
///
/// Errors: `INVALID_QP_STATE` (not in RESET), `INVALID_ARGUMENT` (unknown
/// access bits, non-zero `reserved`), `INVALID_ATTRIBUTE` (retry counts
/// above 7). A failure part-way leaves the QP in the state it reached.
///
/// # Safety
/// `remote` is valid for reads of one `rdd_qp_info`; `attr` is NULL or
/// valid for reads of one `rdd_connect_attr`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_connect(
    qp: *mut rdd_qp,
    remote: *const rdd_qp_info,
    attr: *const rdd_connect_attr,
) -> rdd_status {
    ffi_boundary!({
        non_null!(remote);
        // SAFETY: non-NULL and readable (caller contract).
        let remote = unsafe { remote.read_unaligned() };
        // SAFETY: NULL or readable (caller contract).
        let attr = unsafe { connect_attr_or_default(attr) };
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        match connect_obj(&mut q, &remote, &attr) {
            Ok(()) => rdd_status::Ok,
            Err(s) => s,
        }
    })
}

/// `rdd_connect_attr` from C, or the defaults for NULL (no remote access,
/// infinite retries).
///
/// # Safety
/// `attr` is NULL or readable.
unsafe fn connect_attr_or_default(attr: *const rdd_connect_attr) -> rdd_connect_attr {
    if attr.is_null() {
        rdd_connect_attr {
            access: 0,
            rnr_retry: 7,
            retry_cnt: 7,
            traffic_class: 0,
            sl: 0,
        }
    } else {
        // SAFETY: non-NULL and readable (caller contract).
        unsafe { attr.read_unaligned() }
    }
}

/// RESET → INIT → RTR → RTS towards `remote`, keeping the queues' states
/// in step.
fn connect_obj(
    q: &mut QpObj,
    remote: &rdd_qp_info,
    attr: &rdd_connect_attr,
) -> Result<(), rdd_status> {
    let port = q.backend.port();
    if port.transport == crate::api::Transport::Iwarp {
        // iWARP connects through rdma_cm only.
        return Err(rdd_status::Unsupported);
    }
    let ca = crate::api::ConnectAttr {
        access: access_from(attr.access)?,
        rnr_retry: attr.rnr_retry,
        retry_cnt: attr.retry_cnt,
        traffic_class: attr.traffic_class,
        sl: attr.sl,
        rate_limit_kbps: q.rate_limit_kbps,
        ..crate::api::ConnectAttr::default()
    };
    let peer = crate::api::QpInfo {
        qpn: remote.qpn,
        psn: remote.psn,
        lid: remote.lid,
        gid: remote.gid,
        mtu: remote.mtu,
    };
    for m in crate::api::connect_steps_for(&port, q.psn, &peer, &ca) {
        modify_obj(q, &m)?;
    }
    Ok(())
}

/// One state change, with the queues' states (and on RESET their
/// counters) kept in step.
fn modify_obj(q: &mut QpObj, m: &QpModify) -> Result<(), rdd_status> {
    q.backend.modify_qp(q.qpn, m)?;
    match q.q.get_mut() {
        QpImpl::Mlx5(queues) => {
            if m.state == QpState::Reset {
                queues.sq.reset_counters(0);
                queues.rq.reset_counters(0);
            }
            queues.sq.set_state(m.state);
            queues.rq.set_state(m.state);
        }
        QpImpl::Portable(p) => p.state_changed(m.state),
    }
    Ok(())
}

/// A completion callback for `rdd_qp_recover`: called once per completion
/// drained, with the `ctx` given to `rdd_qp_recover`. It must not call back
/// into this QP or its CQs (they are held busy) and must not unwind.
pub type rdd_wc_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, wc: *const rdd_wc)>;

/// What `rdd_qp_recover` found and did.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdd_recovery {
    /// Completions handed to the callback while draining.
    pub reported: u64,
    /// 1 if `failure` holds the first WR that failed, else 0.
    pub has_failure: u32,
    /// Written as 0.
    pub reserved: u32,
    /// The first failed WR as posted (valid if `has_failure`).
    pub failure: rdd_failed_wr,
}

const_assert_eq!(size_of::<rdd_recovery>(), 72);

/// One-call QP recovery (after an error completion or a fatal QP event).
///
/// Moves `qp` to ERROR (unless it is there), polls its CQ(s) until every
/// outstanding WR has completed, handing each completion to `on_wc`
/// exactly once (flushed WRs included, unsignaled ones too), then moves it
/// through RESET, which resynchronises the queue counters and the CQ
/// consumer state. With `peer` non-NULL it then reconnects (INIT → RTR →
/// RTS with `attr`, as `rdd_qp_connect`; the peer recovers its own QP the
/// same way and the two exchange fresh `rdd_qp_info`); with `peer` NULL the
/// QP is left in RESET.
///
/// The QP's CQs must serve only this QP (another QP's completions would be
/// consumed): otherwise `RESOURCE_BUSY`. Gives up with `TIMEOUT` after
/// `timeout_ns` nanoseconds of draining. `*out` (if non-NULL) receives the
/// count of completions reported and the first failed WR.
///
/// # Safety
/// `peer`, `attr` and `out` are NULL or valid; `on_wc` is NULL or a
/// function safe to call with `ctx` and a completion.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_recover(
    qp: *mut rdd_qp,
    peer: *const rdd_qp_info,
    attr: *const rdd_connect_attr,
    timeout_ns: u64,
    on_wc: rdd_wc_fn,
    ctx: *mut c_void,
    out: *mut rdd_recovery,
) -> rdd_status {
    ffi_boundary!({
        // SAFETY: NULL or readable (caller contract).
        let attr = unsafe { connect_attr_or_default(attr) };
        let peer = if peer.is_null() {
            None
        } else {
            // SAFETY: non-NULL and readable (caller contract).
            Some(unsafe { peer.read_unaligned() })
        };
        let g = try_status!(excl::<QpObj>(h(qp)));
        let (scq_h, rcq_h) = (g.send_cq, g.recv_cq);
        let mut scq = try_status!(excl::<CqObj>(scq_h));
        let mut rcq = if rcq_h == scq_h {
            None
        } else {
            Some(try_status!(excl::<CqObj>(rcq_h)))
        };
        if scq.attached() != 1 || rcq.as_ref().is_some_and(|r| r.attached() != 1) {
            return rdd_status::ResourceBusy;
        }
        let mut list = QpList::new();
        list.push(g);
        // Always through the device (its state may lag ours; see
        // `api::Qp::drain_and_reset`).
        try_status!(modify_obj(
            &mut list.as_mut_slice()[0],
            &QpModify::to(QpState::Error)
        ));
        let outstanding = |l: &mut QpList| l.as_mut_slice()[0].q.get_mut().outstanding();
        let deadline = std::time::Instant::now() + Duration::from_nanos(timeout_ns);
        let mut reported = 0u64;
        let mut wc = [Wc::default(); 32];
        while outstanding(&mut list) != 0 {
            let mut n = 0;
            for cq in core::iter::once(&mut scq).chain(rcq.as_mut()) {
                let budget = Arc::clone(&cq.budget);
                let m = match poll_counted(cq.cq.get_mut(), &budget, &mut list, &mut wc) {
                    Ok(m) => m,
                    Err(e) => return e.into(),
                };
                if let Some(f) = on_wc {
                    for w in &wc[..m] {
                        // SAFETY: the caller's contract on `on_wc`;
                        // `rdd_wc` has the layout of `Wc` (asserted in the
                        // mlx5 module).
                        unsafe { f(ctx, (w as *const Wc).cast::<rdd_wc>()) };
                    }
                }
                n += m;
            }
            reported += n as u64;
            if n == 0 {
                if std::time::Instant::now() >= deadline {
                    return rdd_status::Timeout;
                }
                std::thread::yield_now();
            }
        }
        // After the drain (the failed WR's completion may be among those
        // drained); RESET clears the record.
        let failure = list.as_mut_slice()[0].q.get_mut().failure();
        try_status!(modify_obj(
            &mut list.as_mut_slice()[0],
            &QpModify::to(QpState::Reset)
        ));
        if let Some(p) = &peer {
            try_status!(connect_obj(&mut list.as_mut_slice()[0], p, &attr));
        }
        if !out.is_null() {
            let r = rdd_recovery {
                reported,
                has_failure: failure.is_some() as u32,
                reserved: 0,
                failure: failure.as_ref().map_or(
                    // SAFETY: all-zero is a valid `rdd_failed_wr` (plain
                    // integers).
                    unsafe { MaybeUninit::<rdd_failed_wr>::zeroed().assume_init() },
                    failed_wr_c,
                ),
            };
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out, r) };
        }
        rdd_status::Ok
    })
}

/// WRs handed to a provider-posted QP per call.
const PORTABLE_CHUNK: usize = 16;

/// `rdd_qp_post_send` on a provider-posted QP: the WRs go to the provider
/// in chains of up to [`PORTABLE_CHUNK`] (one doorbell per chain on rxe
/// and siw). Returns the stopping index and status on failure (the WRs
/// before it are posted), and the number of provider calls made.
///
/// # Safety
/// As `rdd_qp_post_send` for `wrs[0..n]` (checked non-NULL and aligned).
/// Posts one WR the library built (the memory-window operations of
/// `ffi::expose`) on QP handle `qp`, which must be in the protection
/// domain `pd_link` names and in RTS (`INVALID_QP_STATE` otherwise): with
/// the same CQ headroom check as `rdd_qp_post_send`. The mlx5 core has no
/// window WQEs: `UNSUPPORTED`.
pub(super) fn post_library_wr(
    qp: usize,
    pd_link: &Arc<()>,
    wr: &crate::wr::SendWr<'_>,
) -> Result<(), rdd_status> {
    let mut q = excl::<QpObj>(qp)?;
    if !Arc::ptr_eq(&q._pd_link, pd_link) {
        return Err(rdd_status::InvalidArgument);
    }
    let meter = q.send_budget.metered().then(|| Arc::clone(&q.send_budget));
    let (called, r) = match q.q.get_mut() {
        QpImpl::Portable(p) if p.state() != QpState::Rts => return Err(rdd_status::InvalidQpState),
        QpImpl::Portable(p) => {
            post_send_metered(&mut **p, core::slice::from_ref(wr), meter.as_deref())
        }
        QpImpl::Mlx5(_) => return Err(rdd_status::Unsupported),
    };
    q.doorbells += u64::from(called);
    r.map_err(|(_, s)| s)
}

/// Hands `wrs` to a provider-posted QP in one call. With an unguarded send
/// CQ (`meter`), only the prefix whose completions fit its headroom goes
/// (the provider reports every completion it is asked for, so no spare
/// entry is kept, as in `api::Qp::post_send`), and the first WR left out
/// is `CQ_FULL`. Returns whether the provider was called, and the index
/// and status of the first WR not posted.
fn post_send_metered(
    p: &mut dyn crate::api::PortableQp,
    wrs: &[crate::wr::SendWr<'_>],
    meter: Option<&CqBudget>,
) -> (bool, Result<(), (usize, rdd_status)>) {
    let want = crate::api::signaled(wrs);
    let reserved = meter.map_or(0, |b| b.headroom.reserve(want));
    let mut post = wrs.len();
    let mut refused = None;
    if meter.is_some() && reserved < want {
        post = crate::api::fitting_prefix(wrs, 0, reserved);
        refused = Some(rdd_status::CqFull);
    }
    let r = if post > 0 {
        p.post_send(&wrs[..post])
    } else {
        Ok(())
    };
    let posted = match &r {
        Ok(()) => post,
        Err(e) => e.index,
    };
    if let Some(b) = meter {
        b.headroom
            .unreserve(reserved.saturating_sub(crate::api::signaled(&wrs[..posted])));
    }
    let r = match (r, refused) {
        (Err(e), _) => Err((e.index, e.error.into())),
        (Ok(()), Some(s)) => Err((post, s)),
        (Ok(()), None) => Ok(()),
    };
    (post > 0, r)
}

unsafe fn post_send_portable(
    p: &mut dyn crate::api::PortableQp,
    wrs: *const rdd_wr,
    n: usize,
    meter: Option<&CqBudget>,
) -> (Result<(), (usize, rdd_status)>, u64) {
    let mut done = 0usize;
    let mut calls = 0u64;
    while done < n {
        let mut pieces = [NO_PIECES; PORTABLE_CHUNK];
        let blank =
            crate::wr::SendWr::new(0, crate::wr::SendOp::Send, &[], crate::wr::SendFlags::NONE);
        let mut chunk = [blank; PORTABLE_CHUNK];
        let mut k = 0usize;
        let mut refused = None;
        for (slot, pc) in chunk.iter_mut().zip(pieces.iter_mut()) {
            if done + k == n {
                break;
            }
            // SAFETY: `done + k < n`, inside the caller's array.
            let wr = unsafe { &*wrs.add(done + k) };
            // SAFETY: the SGE and inline-payload contract is the caller's.
            match unsafe { parse_send(wr, pc) } {
                Ok(w) => {
                    *slot = w;
                    k += 1;
                }
                Err(s) => {
                    refused = Some(s);
                    break;
                }
            }
        }
        let (called, r) = post_send_metered(p, &chunk[..k], meter);
        calls += u64::from(called);
        if let Err((i, s)) = r {
            return (Err((done + i, s)), calls);
        }
        done += k;
        if let Some(s) = refused {
            return (Err((done, s)), calls);
        }
    }
    (Ok(()), calls)
}

/// `rdd_qp_post_recv` on a provider-posted QP, in chains.
///
/// # Safety
/// As `rdd_qp_post_recv` for `wrs[0..n]` (checked non-NULL and aligned).
unsafe fn post_recv_portable(
    p: &mut dyn crate::api::PortableQp,
    wrs: *const rdd_recv_wr,
    n: usize,
    meter: Option<&CqBudget>,
) -> Result<(), (usize, rdd_status)> {
    let mut done = 0usize;
    while done < n {
        let none: &[crate::wr::Sge] = &[];
        let mut chunk = [crate::wr::RecvWr {
            wr_id: 0,
            sges: none,
        }; PORTABLE_CHUNK];
        let mut k = 0usize;
        let mut refused = None;
        while k < PORTABLE_CHUNK && done + k < n {
            // SAFETY: `done + k < n`, inside the caller's array; the SGE
            // contract is the caller's.
            match unsafe { parse_recv(&*wrs.add(done + k)) } {
                Ok(w) => {
                    chunk[k] = w;
                    k += 1;
                }
                Err(s) => {
                    refused = Some(s);
                    break;
                }
            }
        }
        let mut post = k;
        let reserved = meter.map_or(0, |b| b.headroom.reserve(k as u64));
        if meter.is_some() && (reserved as usize) < k {
            post = reserved as usize;
            refused = Some(rdd_status::CqFull);
        }
        let r = if post > 0 {
            p.post_recv(&chunk[..post])
        } else {
            Ok(())
        };
        let posted = match &r {
            Ok(()) => post,
            Err(e) => e.index,
        };
        if let Some(b) = meter {
            b.headroom.unreserve(reserved.saturating_sub(posted as u64));
        }
        if let Err(e) = r {
            return Err((done + e.index, e.error.into()));
        }
        done += post;
        if let Some(s) = refused {
            return Err((done, s));
        }
    }
    Ok(())
}

/// Posts send work requests `wrs[0..n]` and rings the doorbell once for
/// the batch.
///
/// Every request is validated before anything of it is written. The call
/// stops at the first rejected request: the ones before it are posted
/// *and rung*, the rejected one and those after it are not, and its status
/// is returned (a work-request status, `SQ_FULL`, `INVALID_QP_STATE`, or
/// `INVALID_ARGUMENT`). `*out_bad_index` is written exactly when such a
/// status is returned: the index of the first request not posted (0 when
/// the `wrs` array itself is misaligned or too large). It is not written
/// on `OK`, `NULL_PARAMETER`, `INVALID_HANDLE` and `RESOURCE_BUSY`, which
/// post nothing.
///
/// # Safety
/// `wrs` points to `n` readable `rdd_wr`, each `sg_list` to `num_sge`
/// readable entries; for `RDD_SEND_INLINE` the entries' `addr`/`length`
/// are readable payload bytes (copied before return). Other SGEs name
/// memory of this device's MRs; the device checks them, so a wrong one
/// fails the request's completion and cannot corrupt memory.
/// `out_bad_index` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_post_send(
    qp: *mut rdd_qp,
    wrs: *const rdd_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        // An unguarded send CQ: count each signaled WR's completion, and
        // one for a CQE the signalling guard may add at the doorbell,
        // against its headroom (as `api::Qp::post_send`).
        let meter = q.send_budget.metered().then(|| Arc::clone(&q.send_budget));
        if let QpImpl::Portable(p) = q.q.get_mut() {
            // SAFETY: the caller's contract on `wrs` (checked above).
            let (r, calls) = unsafe { post_send_portable(&mut **p, wrs, n, meter.as_deref()) };
            q.doorbells += calls;
            return match r {
                Ok(()) => rdd_status::Ok,
                Err((i, status)) => {
                    // SAFETY: non-NULL (checked), writable (caller contract).
                    unsafe { put(out_bad_index, i) };
                    status
                }
            };
        }
        let mut reserved = match &meter {
            Some(b) => b.headroom.reserve(1),
            None => 0,
        };
        let sq = match q.q.get_mut() {
            QpImpl::Mlx5(o) => &mut o.sq,
            QpImpl::Portable(_) => return rdd_status::InvalidHandle,
        };
        let forced = sq.forced_signals();
        let mut pieces = NO_PIECES;
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned and holds `n` readable
            // requests (checked / caller contract).
            let wr = unsafe { &*wrs.add(i) };
            // SAFETY: the SGE and inline-payload contract is the caller's.
            let posted = match unsafe { parse_send(wr, &mut pieces) } {
                Ok(swr) => match &meter {
                    Some(_) if reserved == 0 => Err(rdd_status::CqFull),
                    Some(b)
                        if swr.flags.contains(crate::wr::SendFlags::SIGNALED)
                            && b.headroom.reserve(1) == 0 =>
                    {
                        Err(rdd_status::CqFull)
                    }
                    _ => {
                        // SAFETY: SGEs only reach the device, which checks
                        // each against its registered regions before any
                        // access.
                        let r = unsafe { sq.post(&swr) }.map_err(rdd_status::from);
                        if meter.is_some()
                            && r.is_err()
                            && swr.flags.contains(crate::wr::SendFlags::SIGNALED)
                        {
                            reserved += 1; // returned below
                        }
                        r
                    }
                },
                Err(s) => Err(s),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_bad_index, i) };
                result = status;
                break;
            }
        }
        if sq.pending() != 0 {
            sq.ring();
            q.doorbells += 1;
        }
        if let Some(b) = &meter {
            // The guard's spare entry, unless the doorbell used it, and a
            // refused signaled WR's.
            let now = match q.q.get_mut() {
                QpImpl::Mlx5(o) => o.sq.forced_signals(),
                QpImpl::Portable(_) => forced,
            };
            let used = u64::from(now.wrapping_sub(forced));
            b.headroom.unreserve(reserved.saturating_sub(used));
        }
        result
    })
}

/// Posts receive work requests `wrs[0..n]` and publishes them to the
/// device once. Same stopping rule and `*out_bad_index` contract as
/// `rdd_qp_post_send` (`RQ_FULL` when the receive queue is full).
///
/// # Safety
/// `wrs` points to `n` readable `rdd_recv_wr`, each `sg_list` to `num_sge`
/// readable entries naming memory of this device's MRs (checked by the
/// device). `out_bad_index` is valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_qp_post_recv(
    qp: *mut rdd_qp,
    wrs: *const rdd_recv_wr,
    n: usize,
    out_bad_index: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(out_bad_index);
        let mut q = try_status!(excl::<QpObj>(h(qp)));
        non_null!(wrs);
        if let Err(status) = check_array(wrs, n) {
            // SAFETY: non-NULL (checked), writable (caller contract).
            unsafe { put(out_bad_index, 0) };
            return status;
        }
        // An unguarded receive CQ: one completion per receive.
        let meter = q.recv_budget.metered().then(|| Arc::clone(&q.recv_budget));
        let rq = match q.q.get_mut() {
            QpImpl::Mlx5(o) => &mut o.rq,
            QpImpl::Portable(p) => {
                // SAFETY: the caller's contract on `wrs` (checked above).
                return match unsafe { post_recv_portable(&mut **p, wrs, n, meter.as_deref()) } {
                    Ok(()) => rdd_status::Ok,
                    Err((i, status)) => {
                        // SAFETY: non-NULL (checked), writable (caller
                        // contract).
                        unsafe { put(out_bad_index, i) };
                        status
                    }
                };
            }
        };
        let mut result = rdd_status::Ok;
        for i in 0..n {
            // SAFETY: `wrs` is non-NULL, aligned and holds `n` readable
            // requests (checked / caller contract).
            let wr = unsafe { &*wrs.add(i) };
            // SAFETY: the SGE contract is the caller's.
            let posted = match unsafe { parse_recv(wr) } {
                Ok(_) if meter.as_ref().is_some_and(|b| b.headroom.reserve(1) == 0) => {
                    Err(rdd_status::CqFull)
                }
                Ok(rwr) => {
                    // SAFETY: as in `rdd_qp_post_send`.
                    let r = unsafe { rq.post(&rwr) }.map_err(rdd_status::from);
                    if let (Some(b), Err(_)) = (&meter, &r) {
                        b.headroom.unreserve(1);
                    }
                    r
                }
                Err(s) => Err(s),
            };
            if let Err(status) = posted {
                // SAFETY: non-NULL (checked), writable (caller contract).
                unsafe { put(out_bad_index, i) };
                result = status;
                break;
            }
        }
        rq.ring();
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::mlx5::{RDD_WC_OP_RECV, RDD_WC_OP_SEND, RDD_WC_SUCCESS};
    use crate::ffi::wr::{rdd_sge, RDD_SEND_SIGNALED, RDD_WR_SEND};
    use core::ptr::null_mut;

    fn ok(s: rdd_status) {
        assert_eq!(s, rdd_status::Ok);
    }

    struct Pair {
        dev: *mut rdd_device,
        pd: *mut rdd_pd,
        cq: [*mut rdd_cq; 2],
        qp: [*mut rdd_qp; 2],
        mr: [*mut rdd_mr; 2],
    }

    /// Two connected QPs, each with its own CQ and a 4 KiB MR.
    fn pair() -> Pair {
        let mut p = Pair {
            dev: null_mut(),
            pd: null_mut(),
            cq: [null_mut(); 2],
            qp: [null_mut(); 2],
            mr: [null_mut(); 2],
        };
        // SAFETY: every out-parameter is a live local.
        unsafe {
            ok(rdd_device_open_soft(ptr::null(), &mut p.dev));
            ok(rdd_pd_alloc(p.dev, &mut p.pd));
            for i in 0..2 {
                ok(rdd_cq_create(p.dev, 256, &mut p.cq[i]));
                ok(rdd_qp_create(
                    p.pd,
                    p.cq[i],
                    p.cq[i],
                    ptr::null(),
                    &mut p.qp[i],
                ));
                ok(rdd_mr_reg(p.pd, 4096, RDD_ACCESS_LOCAL_WRITE, &mut p.mr[i]));
            }
            let mut info = [rdd_qp_info::default(); 2];
            ok(rdd_qp_query_info(p.qp[0], &mut info[0]));
            ok(rdd_qp_query_info(p.qp[1], &mut info[1]));
            ok(rdd_qp_connect(p.qp[0], &info[1], ptr::null()));
            ok(rdd_qp_connect(p.qp[1], &info[0], ptr::null()));
        }
        p
    }

    fn teardown(p: Pair) {
        for i in 0..2 {
            ok(rdd_qp_destroy(p.qp[i]));
            ok(rdd_cq_destroy(p.cq[i]));
            ok(rdd_mr_free(p.mr[i]));
        }
        ok(rdd_pd_free(p.pd));
        ok(rdd_device_close(p.dev));
    }

    fn sge(mr: *mut rdd_mr, len: u32) -> rdd_sge {
        let mut addr = null_mut();
        let mut lkey = 0;
        // SAFETY: out-parameters are locals.
        unsafe {
            ok(rdd_mr_addr(mr, &mut addr));
            ok(rdd_mr_lkey(mr, &mut lkey));
        }
        rdd_sge {
            addr: addr as u64,
            length: len,
            lkey,
        }
    }

    fn poll(cq: *mut rdd_cq, qp: *mut rdd_qp) -> Vec<rdd_wc> {
        let mut wc = [rdd_wc::default(); 8];
        let mut n = 0;
        // SAFETY: arrays and out-parameters are locals.
        ok(unsafe { rdd_cq_poll(cq, &qp, 1, wc.as_mut_ptr(), 8, &mut n) });
        wc[..n].to_vec()
    }

    #[test]
    fn send_recv_round_trip() {
        let p = pair();
        let src = sge(p.mr[0], 5);
        let dst = sge(p.mr[1], 64);
        // SAFETY: the MR buffer is 4096 bytes.
        unsafe { ptr::copy_nonoverlapping(b"hello".as_ptr(), src.addr as *mut u8, 5) };
        let r = rdd_recv_wr {
            wr_id: 9,
            sg_list: &dst,
            num_sge: 1,
            reserved: 0,
        };
        let w = rdd_wr {
            wr_id: 8,
            sg_list: &src,
            num_sge: 1,
            opcode: RDD_WR_SEND,
            flags: RDD_SEND_SIGNALED,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            invalidate_rkey: 0,
            compare_add: 0,
            swap: 0,
        };
        let mut bad = usize::MAX;
        let mut work = 0;
        let mut bells = 0;
        // SAFETY: WRs and SGEs are live locals.
        unsafe {
            ok(rdd_qp_post_recv(p.qp[1], &r, 1, &mut bad));
            ok(rdd_qp_post_send(p.qp[0], &w, 1, &mut bad));
            ok(rdd_device_step(p.dev, &mut work));
            ok(rdd_qp_doorbells(p.qp[0], &mut bells));
        }
        assert_eq!(bad, usize::MAX);
        assert!(work > 0);
        assert_eq!(bells, 1);
        let s = poll(p.cq[0], p.qp[0]);
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].wr_id, s[0].opcode, s[0].status),
            (8, RDD_WC_OP_SEND, RDD_WC_SUCCESS)
        );
        let r = poll(p.cq[1], p.qp[1]);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].wr_id, r[0].opcode, r[0].byte_len),
            (9, RDD_WC_OP_RECV, 5)
        );
        // SAFETY: the MR buffer is 4096 bytes and the receive completed.
        let got = unsafe { core::slice::from_raw_parts(dst.addr as *const u8, 5) };
        assert_eq!(got, b"hello");
        teardown(p);
    }

    #[test]
    fn handles_are_validated() {
        let p = pair();
        let mut lkey = 0;
        // Wrong kind, forged values, NULL.
        assert_eq!(rdd_pd_free(p.qp[0].cast()), rdd_status::InvalidHandle);
        assert_eq!(
            rdd_qp_destroy(as_handle(0x1234_5678_9abc_def5)),
            rdd_status::InvalidHandle
        );
        assert_eq!(
            rdd_qp_destroy(as_handle(KIND_QP as usize | 1 << 30)),
            rdd_status::InvalidHandle
        );
        assert_eq!(rdd_qp_destroy(null_mut()), rdd_status::NullParameter);
        // SAFETY: out-parameter is a local.
        let s = unsafe { rdd_mr_lkey(null_mut::<rdd_mr>(), &mut lkey) };
        assert_eq!(s, rdd_status::NullParameter);
        // Wrong destroy order.
        assert_eq!(rdd_device_close(p.dev), rdd_status::ResourceBusy);
        assert_eq!(rdd_pd_free(p.pd), rdd_status::ResourceBusy);
        assert_eq!(rdd_cq_destroy(p.cq[0]), rdd_status::ResourceBusy);
        // A handle held by another call is busy, not freed under it.
        {
            let _held = excl::<QpObj>(h(p.qp[0])).unwrap();
            assert_eq!(rdd_qp_destroy(p.qp[0]), rdd_status::ResourceBusy);
            let mut info = rdd_qp_info::default();
            // SAFETY: out-parameter is a local.
            let s = unsafe { rdd_qp_query_info(p.qp[0], &mut info) };
            assert_eq!(s, rdd_status::ResourceBusy);
        }
        {
            let _reader = shared::<MrObj>(h(p.mr[0])).unwrap();
            // SAFETY: out-parameter is a local.
            ok(unsafe { rdd_mr_lkey(p.mr[0], &mut lkey) });
            assert_eq!(rdd_mr_free(p.mr[0]), rdd_status::ResourceBusy);
        }
        let old_qp = p.qp[0];
        let old_mr = p.mr[0];
        teardown(p);
        // Use after destroy and double destroy.
        assert_eq!(rdd_qp_destroy(old_qp), rdd_status::InvalidHandle);
        // SAFETY: out-parameter is a local.
        let s = unsafe { rdd_mr_lkey(old_mr, &mut lkey) };
        assert_eq!(s, rdd_status::InvalidHandle);
        assert_eq!(rdd_mr_free(old_mr), rdd_status::InvalidHandle);
        // A reused slot gets a new generation: the old handle stays dead.
        let p = pair();
        assert_eq!(rdd_qp_destroy(old_qp), rdd_status::InvalidHandle);
        teardown(p);
    }

    #[test]
    fn poll_list_must_name_every_qp_once() {
        let p = pair();
        let mut q2 = null_mut();
        // SAFETY: out-parameter is a local.
        ok(unsafe { rdd_qp_create(p.pd, p.cq[0], p.cq[1], ptr::null(), &mut q2) });
        let mut wc = [rdd_wc::default(); 4];
        let mut n = 77;
        let cases: [(&[*mut rdd_qp], rdd_status); 4] = [
            (&[p.qp[0]], rdd_status::InvalidArgument),
            (&[p.qp[0], p.qp[0]], rdd_status::InvalidArgument),
            (&[p.qp[0], p.qp[1]], rdd_status::InvalidArgument),
            (&[q2, p.qp[0]], rdd_status::Ok),
        ];
        for (list, want) in cases {
            // SAFETY: arrays and out-parameters are locals.
            let s = unsafe {
                rdd_cq_poll(
                    p.cq[0],
                    list.as_ptr(),
                    list.len(),
                    wc.as_mut_ptr(),
                    4,
                    &mut n,
                )
            };
            assert_eq!(s, want, "{list:?}");
        }
        assert_eq!(n, 0);
        // The send and receive CQs are both held by the new QP.
        assert_eq!(rdd_cq_destroy(p.cq[1]), rdd_status::ResourceBusy);
        ok(rdd_qp_destroy(q2));
        teardown(p);
    }

    #[test]
    fn handle_encoding() {
        for (gen, index, kind) in [(0, 0, 1u8), (u32::MAX, (MAX_SLOTS - 1) as u32, 5)] {
            let v = encode(gen, index, kind);
            assert_ne!(v, 0);
            assert_eq!(decode(v, kind), Ok((gen, index)));
            assert_eq!(decode(v, kind + 1), Err(rdd_status::InvalidHandle));
            assert_eq!(decode(v | 1 << 29, kind), Err(rdd_status::InvalidHandle));
        }
    }
}
