//! Queue creation through the kernel's uverbs ABI, for the rxe (Soft-RoCE)
//! and siw (soft-iWARP) devices (feature `verbs`).
//!
//! libibverbs' rxe and siw providers keep the rings they mmap in private
//! structs, so for these two devices the crate creates its CQs and QPs
//! itself with the kernel's legacy `write()` commands on the device
//! context's command fd (`ibv_context.cmd_fd`), maps the rings, and hands
//! them to the provider codecs. The PD and the MRs still come from
//! libibverbs: their kernel handles and keys are public (`ibv_pd.handle`,
//! `ibv_mr.lkey`/`rkey`), and the kernel accepts them for these objects
//! because they live in the same context (reference §F).
//!
//! What is here:
//! * [`UverbsCq`]: CREATE_CQ, the ring mapping (rxe: the driver's `mminfo`;
//!   siw: `num_cqe * 32 + 8` bytes at `cq_key`), REQ_NOTIFY_CQ (rxe's only
//!   way to arm; siw arms in shared memory), DESTROY_CQ on drop;
//! * [`UverbsQp`]: CREATE_QP (RC, no SRQ), both ring mappings, MODIFY_QP
//!   from the crate's [`QpModify`] (the same attributes and mask as the
//!   portable path's `ibv_modify_qp`) or from a raw `ibv_qp_attr` and mask
//!   (rdma_cm's `rdma_init_qp_attr`), the doorbell (an empty POST_SEND,
//!   built once per QP), DESTROY_QP on drop;
//! * [`CompChannel`]: a completion channel of our own (CREATE_COMP_CHANNEL),
//!   read directly;
//! * [`AsyncEvents`]: the context's async event fd, read directly.
//!
//! # Rules the caller must keep
//! * **Never** give these objects to libibverbs' event functions
//!   (`ibv_get_cq_event`, `ibv_ack_cq_events`, `ibv_get_async_event`,
//!   `ibv_ack_async_event`). The kernel reports our `user_handle` in their
//!   events, and libibverbs would take it for an `ibv_cq*`/`ibv_qp*`.
//!   Completion events come from [`CompChannel::consume`], async events
//!   from [`AsyncEvents::poll_async_event`]. In particular a CQ made here
//!   must not be given the fd of an `ibv_comp_channel` that anything
//!   reads with `ibv_get_cq_event`: libibverbs dereferences the reported
//!   handle as an `ibv_cq*`.
//! * The context's async fd is one stream for the whole context: reading it
//!   here takes events away from any other reader (a libibverbs
//!   `ibv_get_async_event` loop on the same context would both steal ours
//!   and misread them), so a context has one reader, this one.
//! * Destroy QPs before their CQs, and all of them before the PD and the
//!   context (the kernel refuses to destroy a CQ that a QP uses, and a PD
//!   with objects on it: the drop then leaves the kernel object to the
//!   context's close).
//! * rxe: each mmap offset can be mapped once, so the rings of an object
//!   are mapped here and nowhere else.
//!
//! Command numbers, sizes, word counts and response placement follow
//! reference §F (checked on Debian's 6.1 and 6.12 kernels); the layouts come
//! from the kernel UAPI headers through bindgen ([`crate::sys::uverbs`]),
//! with static assertions of the sizes §B, §C and §F state.

use core::cell::UnsafeCell;
use core::mem::{offset_of, size_of, size_of_val};
use core::ptr::NonNull;
use std::boxed::Box;

use rdma_sys as ibv;

use super::{fail, qp_attr, DeviceCaps};
use crate::error::{Error, Result};
use crate::soft::{QpInit, QpModify};
use crate::sys::uverbs as k;
use k::ib_uverbs_write_cmds as cmd;

// ---------------------------------------------------------------------------
// Layout checks (reference §B.1, §B.2, §B.6, §C.1, §C.2, §F).

/// A legacy uverbs command as written to the command fd: the 8-byte header
/// `{command, in_words, out_words}`, then the command body.
#[repr(C)]
struct Cmd<B> {
    hdr: k::ib_uverbs_cmd_hdr,
    body: B,
}

static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_cmd_hdr>(), 8);
// §F: bytes written per command, header included.
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_cq>>(), 40);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_qp>>(), 64);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_modify_qp>>(), 120);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_post_send>>(), 32);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_destroy_cq>>(), 24);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_destroy_qp>>(), 24);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_req_notify_cq>>(), 16);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_comp_channel>>(), 16);
// The body directly follows the header (no padding the kernel would read
// as part of the body).
static_assertions::const_assert_eq!(offset_of!(Cmd<k::ib_uverbs_create_cq>, body), 8);
static_assertions::const_assert_eq!(offset_of!(Cmd<k::ib_uverbs_req_notify_cq>, body), 8);
// Command numbers the reference names (§B.6: the doorbell is 28).
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, 17);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_CQ, 18);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_DESTROY_CQ, 20);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, 23);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_QP, 24);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_MODIFY_QP, 26);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_DESTROY_QP, 27);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_POST_SEND, 28);
// Core responses; the driver's response follows them (§F: +8, +32).
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_create_cq_resp>(), 8);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_create_qp_resp>(), 32);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_post_send_resp>(), 4);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_destroy_cq_resp>(), 8);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_destroy_qp_resp>(), 4);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_async_event_desc>(), 16);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_comp_event_desc>(), 8);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_qp_dest>(), 32);
// rxe (§B.1, §B.2).
static_assertions::const_assert_eq!(size_of::<k::mminfo>(), 16);
static_assertions::const_assert_eq!(size_of::<k::rxe_create_cq_resp>(), 16);
static_assertions::const_assert_eq!(size_of::<k::rxe_create_qp_resp>(), 32);
static_assertions::const_assert_eq!(size_of::<k::rxe_queue_buf>(), RXE_DATA_OFFSET);
static_assertions::const_assert_eq!(offset_of!(k::rxe_queue_buf, index_mask), 4);
static_assertions::const_assert_eq!(offset_of!(k::rxe_queue_buf, producer_index), 128);
static_assertions::const_assert_eq!(offset_of!(k::rxe_queue_buf, consumer_index), 256);
// siw (§C.1, §C.2).
static_assertions::const_assert_eq!(size_of::<k::siw_uresp_create_cq>(), 16);
static_assertions::const_assert_eq!(size_of::<k::siw_uresp_create_qp>(), 32);
static_assertions::const_assert_eq!(offset_of!(k::siw_uresp_create_qp, sq_key), 16);
static_assertions::const_assert_eq!(size_of::<k::siw_sqe>(), 120);
static_assertions::const_assert_eq!(size_of::<k::siw_rqe>(), 112);
static_assertions::const_assert_eq!(size_of::<k::siw_cqe>(), 32);
static_assertions::const_assert_eq!(size_of::<k::siw_cq_ctrl>(), 8);

/// Where the slots start in an rxe ring (`struct rxe_queue_buf`, §B.2).
pub const RXE_DATA_OFFSET: usize = 384;

/// `wqe_size` of the empty POST_SEND: `sizeof(struct ibv_send_wr)`, as
/// rdma-core sends; the kernel refuses anything below
/// `sizeof(struct ib_uverbs_send_wr)` (56) on newer kernels (§B.6).
const DOORBELL_WQE_SIZE: u32 = 128;

/// `IB_UVERBS_QPT_RC`.
const QPT_RC: u8 = k::ib_uverbs_qp_type::IB_UVERBS_QPT_RC as u8;

/// `ibv_device_attr.vendor_id` of rxe (`RXE_VENDOR_ID`, 0xFFFFFF since
/// Linux 5.x).
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;
/// `ibv_device_attr.vendor_id` of siw (`SIW_VENDOR_ID`, ASCII "bmt").
const SIW_VENDOR_ID: u32 = 0x0062_6d74;

// ---------------------------------------------------------------------------
// Device kind.

/// Which kernel driver serves the context: it decides the driver
/// responses and the ring layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Soft-RoCE (`rdma_rxe`): rings with a 384-byte index header
    /// (reference §B).
    Rxe,
    /// Soft-iWARP (`siw`): rings of elements with a valid flag each
    /// (reference §C).
    Siw,
}

impl Kind {
    /// Recognises rxe and siw by the vendor ID the kernel reports for
    /// them (rxe 0xFFFFFF, siw 0x626d74); `None` for any other device, or
    /// if the query fails.
    ///
    /// # Safety
    /// `ctx` must point to a live, open `ibv_context`.
    pub unsafe fn detect(ctx: *mut ibv::ibv_context) -> Option<Kind> {
        // SAFETY: all-zero is a valid ibv_device_attr.
        let mut attr: ibv::ibv_device_attr = unsafe { core::mem::zeroed() };
        // SAFETY: live context (the caller's contract); valid out-pointer.
        if unsafe { ibv::ibv_query_device(ctx, &mut attr) } != 0 {
            return None;
        }
        match attr.vendor_id {
            RXE_VENDOR_ID => Some(Kind::Rxe),
            SIW_VENDOR_ID => Some(Kind::Siw),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// The command writer.

/// Writes `len` bytes at `buf` to the command fd as one command; the error
/// is the errno. The kernel consumes a command whole or not at all, so a
/// short count cannot happen; it would be reported as errno 0 (which maps
/// to [`Error::ProviderError`]).
fn write_raw(fd: i32, buf: *const u8, len: usize) -> core::result::Result<(), i32> {
    loop {
        // SAFETY: `buf` is readable for `len` bytes (every caller passes a
        // live command struct and its size); the kernel writes responses
        // only to addresses named inside the command, which the callers
        // keep alive across this call.
        let r = unsafe { libc::write(fd, buf.cast(), len) };
        if r == len as isize {
            return Ok(());
        }
        if r >= 0 {
            return Err(0);
        }
        let errno = errno();
        if errno != libc::EINTR {
            return Err(errno);
        }
    }
}

/// The calling thread's errno.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Issues one command: header filled from the body's size and `out_bytes`
/// (core plus driver response), then the body. The body's `response`
/// field, if any, must already point at `out_bytes` of writable memory.
fn exec<B>(fd: i32, op: &'static str, command: u32, body: B, out_bytes: usize) -> Result<()> {
    let c = Cmd {
        hdr: k::ib_uverbs_cmd_hdr {
            command,
            in_words: (size_of::<Cmd<B>>() / 4) as u16,
            out_words: (out_bytes / 4) as u16,
        },
        body,
    };
    write_raw(fd, (&c as *const Cmd<B>).cast(), size_of::<Cmd<B>>())
        .map_err(|errno| cmd_error(op, errno))
}

/// Records a failed command (for `verbs::last_error`) and maps its errno
/// as everywhere in [`crate::verbs`], except ENOENT: from a uverbs command
/// it means an unknown handle (PD, CQ, QP), not a missing device.
fn cmd_error(op: &'static str, errno: i32) -> Error {
    let e = fail(op, errno);
    if errno == libc::ENOENT {
        Error::NoSuchObject
    } else {
        e
    }
}

/// The response address of a command: a user pointer as the kernel takes
/// it.
fn resp_addr<T>(r: &mut T) -> u64 {
    r as *mut T as u64
}

// ---------------------------------------------------------------------------
// Mappings.

/// One shared mapping of the command fd (a ring), unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// `mmap(NULL, len, RW, MAP_SHARED, fd, offset)`.
    fn new(fd: i32, offset: u64, len: usize) -> Result<Mapping> {
        if len == 0 || offset > i64::MAX as u64 {
            return Err(Error::InvalidGeometry);
        }
        // SAFETY: a fresh shared mapping chosen by the kernel; it aliases no
        // Rust object. The kernel checks `offset` and `len` against the
        // object it names.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(fail("uverbs mmap", errno()));
        }
        match NonNull::new(p.cast::<u8>()) {
            Some(ptr) => Ok(Mapping { ptr, len }),
            None => Err(Error::ProviderError),
        }
    }

    /// Reads a u32 of the mapping (device-shared memory: one volatile read).
    fn read_u32(&self, off: usize) -> Option<u32> {
        if off.checked_add(4)? > self.len || off % 4 != 0 {
            return None;
        }
        // SAFETY: in bounds (checked above), 4-aligned (page-aligned base,
        // aligned offset), and the mapping stays valid while `self` lives.
        Some(unsafe { self.ptr.as_ptr().add(off).cast::<u32>().read_volatile() })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: this mapping was made by `Mapping::new` with this length
        // and is unmapped exactly once, here. Errors cannot be acted upon.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The page size (4096 if sysconf fails).
fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `n` rounded up to whole pages (None on overflow).
fn page_round(n: usize) -> Option<usize> {
    let p = page_size();
    Some(n.checked_add(p - 1)? & !(p - 1))
}

/// Where a ring is, how big, and how it is divided. The pointers stay
/// valid while the [`UverbsCq`]/[`UverbsQp`] that returned it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingView {
    /// Start of the mapping (rxe: the `rxe_queue_buf` header; siw: the
    /// first element).
    pub ptr: NonNull<u8>,
    /// Length of the mapping in bytes.
    pub len: usize,
    /// Byte offset of slot 0 from `ptr` (rxe 384, siw 0).
    pub data_offset: usize,
    /// Number of slots (a power of two).
    pub slots: u32,
    /// Bytes per slot.
    pub elem_size: u32,
    /// Entries the ring can hold at once: rxe `slots - 1` (one slot tells
    /// full from empty), siw `slots`.
    pub capacity: u32,
}

/// A mapped ring with its geometry.
struct Ring {
    map: Mapping,
    data_offset: usize,
    slots: u32,
    elem_size: u32,
    capacity: u32,
}

impl Ring {
    fn view(&self) -> RingView {
        RingView {
            ptr: self.map.ptr,
            len: self.map.len,
            data_offset: self.data_offset,
            slots: self.slots,
            elem_size: self.elem_size,
            capacity: self.capacity,
        }
    }

    /// Maps an rxe queue (`mminfo` from the driver response) and checks
    /// its header: the kernel wrote it, so it is validated before anyone
    /// indexes with it (§B.2).
    fn map_rxe(fd: i32, mi: &k::mminfo) -> Result<Ring> {
        let map = Mapping::new(fd, mi.offset, mi.size as usize)?;
        let log2 = map.read_u32(0).ok_or(Error::InvalidGeometry)?;
        let mask = map.read_u32(4).ok_or(Error::InvalidGeometry)?;
        let slots = mask.checked_add(1).ok_or(Error::InvalidGeometry)?;
        if !(4..=16).contains(&log2) || !slots.is_power_of_two() {
            return Err(Error::InvalidGeometry);
        }
        let data = (slots as usize)
            .checked_shl(log2)
            .and_then(|d| d.checked_add(RXE_DATA_OFFSET))
            .ok_or(Error::InvalidGeometry)?;
        if data > map.len {
            return Err(Error::InvalidGeometry);
        }
        Ok(Ring {
            map,
            data_offset: RXE_DATA_OFFSET,
            slots,
            elem_size: 1 << log2,
            capacity: mask,
        })
    }

    /// Maps a siw queue of `num` elements of `elem` bytes plus `extra`
    /// trailing bytes at `key`; the length rounds up to whole pages, as
    /// the driver requires (§F).
    fn map_siw(fd: i32, key: u64, num: u32, elem: usize, extra: usize) -> Result<Ring> {
        if num == 0 || !num.is_power_of_two() || key == u64::from(k::SIW_INVAL_UOBJ_KEY) {
            return Err(Error::InvalidGeometry);
        }
        let len = (num as usize)
            .checked_mul(elem)
            .and_then(|b| b.checked_add(extra))
            .and_then(page_round)
            .ok_or(Error::InvalidGeometry)?;
        Ok(Ring {
            map: Mapping::new(fd, key, len)?,
            data_offset: 0,
            slots: num,
            elem_size: elem as u32,
            capacity: num,
        })
    }
}

/// The command fd of a context.
///
/// # Safety
/// `ctx` must point to a live `ibv_context`.
unsafe fn cmd_fd(ctx: *mut ibv::ibv_context) -> Result<i32> {
    if ctx.is_null() {
        return Err(Error::NullPointer);
    }
    // SAFETY: live context (the caller's contract).
    let fd = unsafe { (*ctx).cmd_fd };
    if fd < 0 {
        return Err(Error::NoDevice);
    }
    Ok(fd)
}

// ---------------------------------------------------------------------------
// CQ.

/// CREATE_CQ's response: the core part, then the driver's.
#[repr(C)]
#[derive(Default)]
struct CqResp<D> {
    core: k::ib_uverbs_create_cq_resp,
    drv: D,
}
static_assertions::const_assert_eq!(offset_of!(CqResp<k::rxe_create_cq_resp>, drv), 8);
static_assertions::const_assert_eq!(offset_of!(CqResp<k::siw_uresp_create_cq>, drv), 8);
static_assertions::const_assert_eq!(size_of::<CqResp<k::rxe_create_cq_resp>>(), 24);
static_assertions::const_assert_eq!(size_of::<CqResp<k::siw_uresp_create_cq>>(), 24);

/// A CQ created with the kernel's CREATE_CQ on the context's command fd,
/// its ring mapped. Dropping it unmaps the ring and destroys the CQ.
///
/// The ring format is the provider codec's business (rxe §B.5, siw §C.2,
/// §C.3); this type only creates, maps, arms (rxe) and destroys.
pub struct UverbsCq {
    fd: i32,
    kind: Kind,
    handle: u32,
    cqe: u32,
    driver_id: u32,
    user_handle: u64,
    ring: Option<Ring>,
    /// The kernel object exists (cleared by the destroy attempt).
    alive: bool,
}

// SAFETY: the CQ is a kernel handle plus a shared mapping; nothing in it is
// tied to the creating thread. The ring is only handed out as raw pointers.
unsafe impl Send for UverbsCq {}
// SAFETY: every `&self` method is either a read of immutable fields or one
// `write()` of a command built on the stack.
unsafe impl Sync for UverbsCq {}

impl UverbsCq {
    /// Creates a CQ of at least `entries` entries on `ctx`'s command fd and
    /// maps its ring. `comp_channel_fd` is a completion channel of the same
    /// context (see [`CompChannel`]) or `None`; `user_handle` is what the
    /// kernel reports in this CQ's completion and async events.
    ///
    /// Errors: the kernel's errno mapped as everywhere in [`crate::verbs`]
    /// (an absurd size is [`Error::InvalidAttribute`], a channel fd that is
    /// not one of this context's fails too); a driver response
    /// or ring header that makes no sense is [`Error::InvalidGeometry`].
    /// Nothing is left behind on error.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context` of an rxe (`kind` Rxe) or
    /// siw (`kind` Siw) device, which stays open until this CQ is dropped
    /// (its command fd is used to destroy the CQ).
    pub unsafe fn create(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        entries: u32,
        comp_channel_fd: Option<i32>,
        user_handle: u64,
    ) -> Result<UverbsCq> {
        // SAFETY: the caller's contract.
        let fd = unsafe { cmd_fd(ctx) }?;
        if comp_channel_fd.is_some_and(|c| c < 0) {
            return Err(Error::InvalidAttribute);
        }
        match kind {
            Kind::Rxe => {
                let mut resp = CqResp::<k::rxe_create_cq_resp>::default();
                let handle = create_cq_cmd(fd, entries, comp_channel_fd, user_handle, &mut resp)?;
                let mut cq = UverbsCq {
                    fd,
                    kind,
                    handle,
                    cqe: resp.core.cqe,
                    driver_id: 0,
                    user_handle,
                    ring: None,
                    alive: true,
                };
                // On error `cq` drops here: the CQ is destroyed.
                cq.ring = Some(Ring::map_rxe(fd, &resp.drv.mi)?);
                Ok(cq)
            }
            Kind::Siw => {
                let mut resp = CqResp::<k::siw_uresp_create_cq>::default();
                let handle = create_cq_cmd(fd, entries, comp_channel_fd, user_handle, &mut resp)?;
                let mut cq = UverbsCq {
                    fd,
                    kind,
                    handle,
                    cqe: resp.core.cqe,
                    driver_id: resp.drv.cq_id,
                    user_handle,
                    ring: None,
                    alive: true,
                };
                cq.ring = Some(Ring::map_siw(
                    fd,
                    resp.drv.cq_key,
                    resp.drv.num_cqe,
                    size_of::<k::siw_cqe>(),
                    size_of::<k::siw_cq_ctrl>(),
                )?);
                Ok(cq)
            }
        }
    }

    /// The device kind this CQ was created for.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The kernel's handle of this CQ (for CREATE_QP).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The `user_handle` given at creation (echoed in events).
    pub fn user_handle(&self) -> u64 {
        self.user_handle
    }

    /// The CQ size in the core response (`ib_cq.cqe`; rxe reports the
    /// request, siw the rounded count). Use [`UverbsCq::entries`] for the
    /// ring's real capacity.
    pub fn kernel_cqe(&self) -> u32 {
        self.cqe
    }

    /// siw's CQ id (`siw_uresp_create_cq.cq_id`); 0 on rxe.
    pub fn driver_id(&self) -> u32 {
        self.driver_id
    }

    /// The ring's geometry and address.
    pub fn ring(&self) -> Option<RingView> {
        self.ring.as_ref().map(Ring::view)
    }

    /// Start of the ring mapping (null only if never mapped, which
    /// [`UverbsCq::create`] does not return).
    pub fn ring_ptr(&self) -> *mut u8 {
        self.ring
            .as_ref()
            .map_or(core::ptr::null_mut(), |r| r.map.ptr.as_ptr())
    }

    /// Length of the ring mapping in bytes.
    pub fn ring_len(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.map.len)
    }

    /// Completions the ring holds at once: siw `num_cqe`; rxe the header's
    /// `index_mask` (slots − 1), read and checked at creation.
    pub fn entries(&self) -> u32 {
        self.ring.as_ref().map_or(0, |r| r.capacity)
    }

    /// Arms an rxe CQ (REQ_NOTIFY_CQ): the next completion (or, with
    /// `solicited_only`, the next solicited one) raises one event on the
    /// completion channel. rxe has no other way to arm (§B.5).
    ///
    /// siw is [`Error::Unsupported`], without a system call: its kernel
    /// refuses the command (EOPNOTSUPP, seen on 6.1). A siw CQ is armed in
    /// shared memory instead, by the codec: the `siw_cq_ctrl` word right
    /// after the last CQE (byte `slots * 32` of [`UverbsCq::ring`]; §C.3).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.kind == Kind::Siw {
            return Err(Error::Unsupported);
        }
        exec(
            self.fd,
            "uverbs REQ_NOTIFY_CQ",
            cmd::IB_USER_VERBS_CMD_REQ_NOTIFY_CQ,
            k::ib_uverbs_req_notify_cq {
                cq_handle: self.handle,
                solicited_only: u32::from(solicited_only),
            },
            0,
        )
    }

    /// Unmaps the ring and destroys the CQ, reporting the kernel's error
    /// (e.g. [`Error::ResourceBusy`] while a QP still uses it; the kernel
    /// object is then freed with the context).
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    /// Unmaps (if mapped), then destroys the kernel object, once.
    fn teardown(&mut self) -> Result<()> {
        drop(self.ring.take());
        if !core::mem::replace(&mut self.alive, false) {
            return Ok(());
        }
        destroy_cq_cmd(self.fd, self.handle)
    }
}

impl Drop for UverbsCq {
    fn drop(&mut self) {
        // Errors are recorded for `verbs::last_error` and otherwise ignored:
        // a drop cannot report them.
        let _ = self.teardown();
    }
}

/// CREATE_CQ with the driver response `D` (no driver input, §F).
fn create_cq_cmd<D>(
    fd: i32,
    entries: u32,
    comp_channel_fd: Option<i32>,
    user_handle: u64,
    resp: &mut CqResp<D>,
) -> Result<u32> {
    let body = k::ib_uverbs_create_cq {
        response: resp_addr(resp),
        user_handle,
        cqe: entries,
        comp_vector: 0,
        comp_channel: comp_channel_fd.unwrap_or(-1),
        ..Default::default()
    };
    exec(
        fd,
        "uverbs CREATE_CQ",
        cmd::IB_USER_VERBS_CMD_CREATE_CQ,
        body,
        size_of::<CqResp<D>>(),
    )?;
    Ok(resp.core.cq_handle)
}

fn destroy_cq_cmd(fd: i32, handle: u32) -> Result<()> {
    let mut resp = k::ib_uverbs_destroy_cq_resp::default();
    exec(
        fd,
        "uverbs DESTROY_CQ",
        cmd::IB_USER_VERBS_CMD_DESTROY_CQ,
        k::ib_uverbs_destroy_cq {
            response: resp_addr(&mut resp),
            cq_handle: handle,
            reserved: 0,
        },
        size_of::<k::ib_uverbs_destroy_cq_resp>(),
    )
}

// ---------------------------------------------------------------------------
// QP.

/// CREATE_QP's response: the core part, then the driver's.
#[repr(C)]
#[derive(Default)]
struct QpResp<D> {
    core: k::ib_uverbs_create_qp_resp,
    drv: D,
}
static_assertions::const_assert_eq!(offset_of!(QpResp<k::rxe_create_qp_resp>, drv), 32);
static_assertions::const_assert_eq!(offset_of!(QpResp<k::siw_uresp_create_qp>, drv), 32);
static_assertions::const_assert_eq!(size_of::<QpResp<k::rxe_create_qp_resp>>(), 64);
static_assertions::const_assert_eq!(size_of::<QpResp<k::siw_uresp_create_qp>>(), 64);

/// The empty POST_SEND (the doorbell) and the word its response goes to,
/// built once per QP at a stable address (boxed).
#[repr(C)]
struct DoorbellCmd {
    cmd: Cmd<k::ib_uverbs_post_send>,
    /// Written by the kernel on every doorbell (`bad_wr`); never read.
    resp: UnsafeCell<k::ib_uverbs_post_send_resp>,
}

/// A QP's address-vector attributes as the kernel reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpService {
    /// GRH traffic class (DSCP/ECN on RoCEv2).
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// Source GID index.
    pub sgid_index: u8,
}

/// An RC QP created with the kernel's CREATE_QP on the context's command
/// fd, its send and receive rings mapped. Dropping it unmaps the rings and
/// destroys the QP.
pub struct UverbsQp {
    fd: i32,
    kind: Kind,
    handle: u32,
    qpn: u32,
    driver_id: u32,
    user_handle: u64,
    caps: QpInit,
    sq: Option<Ring>,
    rq: Option<Ring>,
    db: Box<DoorbellCmd>,
    /// The kernel object exists (cleared by the destroy attempt).
    alive: bool,
}

// SAFETY: a kernel handle, shared mappings handed out only as raw pointers,
// and the doorbell buffer, which the kernel alone writes (its response
// word, in an UnsafeCell Rust never reads).
unsafe impl Send for UverbsQp {}
// SAFETY: `&self` methods write commands built on the stack, or the boxed
// doorbell command, which they only read; concurrent doorbells make the
// kernel write the same never-read response word.
unsafe impl Sync for UverbsQp {}

impl UverbsQp {
    /// Creates an RC QP (no SRQ) on `ctx`'s command fd with the PD whose
    /// kernel handle is `pd_handle` (`ibv_pd.handle` of a libibverbs PD on
    /// the same context), and maps its rings. `caps` are the requested
    /// sizes (as for `ibv_create_qp`); [`UverbsQp::caps`] has what the
    /// kernel reports back, the ring views what the rings really hold.
    /// `sq_sig_all` makes every send WR generate a completion.
    ///
    /// Errors: the kernel's errno mapped as everywhere in [`crate::verbs`]
    /// (absurd sizes are [`Error::InvalidAttribute`], an unknown PD handle
    /// is [`Error::NoSuchObject`]); CQs of another kind
    /// or context are [`Error::InvalidAttribute`]; a driver response or ring
    /// header that makes no sense is [`Error::InvalidGeometry`]. Nothing is
    /// left behind on error.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context` of a device of `kind`,
    /// open until this QP is dropped.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn create(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        pd_handle: u32,
        send_cq: &UverbsCq,
        recv_cq: &UverbsCq,
        caps: &QpInit,
        sq_sig_all: bool,
        user_handle: u64,
    ) -> Result<UverbsQp> {
        // SAFETY: the caller's contract.
        let fd = unsafe { cmd_fd(ctx) }?;
        for cq in [send_cq, recv_cq] {
            if cq.kind != kind || cq.fd != fd {
                return Err(Error::InvalidAttribute);
            }
        }
        let body = |response: u64| k::ib_uverbs_create_qp {
            response,
            user_handle,
            pd_handle,
            send_cq_handle: send_cq.handle,
            recv_cq_handle: recv_cq.handle,
            srq_handle: 0,
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
            sq_sig_all: u8::from(sq_sig_all),
            qp_type: QPT_RC,
            is_srq: 0,
            ..Default::default()
        };
        match kind {
            Kind::Rxe => {
                let mut resp = QpResp::<k::rxe_create_qp_resp>::default();
                let b = body(resp_addr(&mut resp));
                exec(
                    fd,
                    "uverbs CREATE_QP",
                    cmd::IB_USER_VERBS_CMD_CREATE_QP,
                    b,
                    size_of_val(&resp),
                )?;
                let mut qp = UverbsQp::new(fd, kind, &resp.core, 0, user_handle);
                // On error `qp` drops: what was mapped is unmapped, the QP
                // destroyed.
                qp.sq = Some(Ring::map_rxe(fd, &resp.drv.sq_mi)?);
                if resp.drv.rq_mi.size != 0 {
                    qp.rq = Some(Ring::map_rxe(fd, &resp.drv.rq_mi)?);
                }
                Ok(qp)
            }
            Kind::Siw => {
                let mut resp = QpResp::<k::siw_uresp_create_qp>::default();
                let b = body(resp_addr(&mut resp));
                exec(
                    fd,
                    "uverbs CREATE_QP",
                    cmd::IB_USER_VERBS_CMD_CREATE_QP,
                    b,
                    size_of_val(&resp),
                )?;
                let d = resp.drv;
                let mut qp = UverbsQp::new(fd, kind, &resp.core, d.qp_id, user_handle);
                qp.sq = Some(Ring::map_siw(
                    fd,
                    d.sq_key,
                    d.num_sqe,
                    size_of::<k::siw_sqe>(),
                    0,
                )?);
                // No receive queue when none was asked for: the key is then
                // meaningless (0, itself a valid key, on current kernels).
                if d.num_rqe != 0 {
                    qp.rq = Some(Ring::map_siw(
                        fd,
                        d.rq_key,
                        d.num_rqe,
                        size_of::<k::siw_rqe>(),
                        0,
                    )?);
                }
                Ok(qp)
            }
        }
    }

    /// The object for a QP the kernel just created (no rings yet), with its
    /// doorbell command built.
    fn new(
        fd: i32,
        kind: Kind,
        core: &k::ib_uverbs_create_qp_resp,
        driver_id: u32,
        user_handle: u64,
    ) -> UverbsQp {
        let mut db = Box::new(DoorbellCmd {
            cmd: Cmd {
                hdr: k::ib_uverbs_cmd_hdr {
                    command: cmd::IB_USER_VERBS_CMD_POST_SEND,
                    in_words: (size_of::<Cmd<k::ib_uverbs_post_send>>() / 4) as u16,
                    out_words: (size_of::<k::ib_uverbs_post_send_resp>() / 4) as u16,
                },
                body: k::ib_uverbs_post_send {
                    response: 0,
                    qp_handle: core.qp_handle,
                    wr_count: 0,
                    sge_count: 0,
                    wqe_size: DOORBELL_WQE_SIZE,
                    ..Default::default()
                },
            },
            resp: UnsafeCell::new(k::ib_uverbs_post_send_resp::default()),
        });
        // The box never moves its contents, so this address stays valid for
        // the QP's life.
        db.cmd.body.response = db.resp.get() as u64;
        UverbsQp {
            fd,
            kind,
            handle: core.qp_handle,
            qpn: core.qpn,
            driver_id,
            user_handle,
            caps: QpInit {
                max_send_wr: core.max_send_wr,
                max_recv_wr: core.max_recv_wr,
                max_send_sge: core.max_send_sge,
                max_recv_sge: core.max_recv_sge,
                max_inline_data: core.max_inline_data,
            },
            sq: None,
            rq: None,
            db,
            alive: true,
        }
    }

    /// The device kind this QP was created for.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The QP number (from the core response).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The kernel's handle of this QP.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The `user_handle` given at creation (echoed in async events).
    pub fn user_handle(&self) -> u64 {
        self.user_handle
    }

    /// siw's QP id (`siw_uresp_create_qp.qp_id`, which siw CQEs carry);
    /// 0 on rxe.
    pub fn driver_id(&self) -> u32 {
        self.driver_id
    }

    /// The capabilities the kernel reported (core CREATE_QP response). On
    /// rxe these echo the request on 6.1; the rings' real sizes are in
    /// [`UverbsQp::sq`] and [`UverbsQp::rq`] (§F).
    pub fn caps(&self) -> QpInit {
        self.caps
    }

    /// The send ring.
    pub fn sq(&self) -> Option<RingView> {
        self.sq.as_ref().map(Ring::view)
    }

    /// The receive ring (`None` on siw when no receive WRs were asked for).
    pub fn rq(&self) -> Option<RingView> {
        self.rq.as_ref().map(Ring::view)
    }

    /// Start of the send ring mapping.
    pub fn sq_ptr(&self) -> *mut u8 {
        self.sq
            .as_ref()
            .map_or(core::ptr::null_mut(), |r| r.map.ptr.as_ptr())
    }

    /// Length of the send ring mapping.
    pub fn sq_len(&self) -> usize {
        self.sq.as_ref().map_or(0, |r| r.map.len)
    }

    /// Start of the receive ring mapping (null if there is none).
    pub fn rq_ptr(&self) -> *mut u8 {
        self.rq
            .as_ref()
            .map_or(core::ptr::null_mut(), |r| r.map.ptr.as_ptr())
    }

    /// Length of the receive ring mapping (0 if there is none).
    pub fn rq_len(&self) -> usize {
        self.rq.as_ref().map_or(0, |r| r.map.len)
    }

    /// Moves the QP to another state with the crate's attributes: exactly
    /// the attributes and mask the portable path gives `ibv_modify_qp`
    /// (`verbs::qp_attr`; READ/atomic depths clamped to `caps`), sent as
    /// MODIFY_QP. RESET and ERR take the state alone; INIT port, pkey index
    /// 0 and access flags; RTR path MTU, dest QPN, RQ PSN, responder depth,
    /// RNR timer and the address vector; RTS SQ PSN, timeout, retry counts
    /// and initiator depth.
    pub fn modify(&self, m: &QpModify, caps: &DeviceCaps) -> Result<()> {
        let (attr, mask) = qp_attr(m, caps);
        self.modify_raw(&attr, mask)
    }

    /// MODIFY_QP with exactly `attr` and `mask` (`IBV_QP_*` bits, the
    /// kernel's `IB_QP_*` numbering), e.g. what `rdma_init_qp_attr`
    /// returned (the siw flow, §F step 4).
    pub fn modify_raw(&self, attr: &ibv::ibv_qp_attr, mask: u32) -> Result<()> {
        if mask & ibv::ibv_qp_attr_mask::IBV_QP_RATE_LIMIT.0 != 0 {
            // The legacy MODIFY_QP command has no rate-limit field (only
            // the extended one does), and rxe and siw do not pace packets.
            return Err(Error::Unsupported);
        }
        let body = k::ib_uverbs_modify_qp {
            dest: qp_dest(&attr.ah_attr),
            alt_dest: qp_dest(&attr.alt_ah_attr),
            qp_handle: self.handle,
            attr_mask: mask,
            qkey: attr.qkey,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            dest_qp_num: attr.dest_qp_num,
            qp_access_flags: attr.qp_access_flags,
            pkey_index: attr.pkey_index,
            alt_pkey_index: attr.alt_pkey_index,
            qp_state: attr.qp_state as u8,
            cur_qp_state: attr.cur_qp_state as u8,
            path_mtu: attr.path_mtu as u8,
            path_mig_state: attr.path_mig_state as u8,
            en_sqd_async_notify: attr.en_sqd_async_notify,
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            port_num: attr.port_num,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            alt_port_num: attr.alt_port_num,
            alt_timeout: attr.alt_timeout,
            ..Default::default()
        };
        exec(
            self.fd,
            "uverbs MODIFY_QP",
            cmd::IB_USER_VERBS_CMD_MODIFY_QP,
            body,
            0,
        )
    }

    /// The QP's address-vector attributes as the kernel holds them
    /// (QUERY_QP): traffic class, service level, hop limit and source GID
    /// index, so a caller can check what a connection really uses.
    pub fn query_service(&self) -> Result<QpService> {
        #[repr(C)]
        #[derive(Default)]
        struct Resp {
            core: k::ib_uverbs_query_qp_resp,
        }
        let mut resp = Resp::default();
        exec(
            self.fd,
            "uverbs QUERY_QP",
            cmd::IB_USER_VERBS_CMD_QUERY_QP,
            k::ib_uverbs_query_qp {
                response: resp_addr(&mut resp),
                qp_handle: self.handle,
                attr_mask: ibv::ibv_qp_attr_mask::IBV_QP_AV.0,
                ..Default::default()
            },
            size_of::<Resp>(),
        )?;
        let d = &resp.core.dest;
        Ok(QpService {
            traffic_class: d.traffic_class,
            sl: d.sl,
            hop_limit: d.hop_limit,
            sgid_index: d.sgid_index,
        })
    }

    /// Rings the doorbell: the empty POST_SEND (§B.6, §C.4), prepared at
    /// creation, so this is one `write()` and allocates nothing. Publish the
    /// WQEs first (rxe: release-store the producer index; siw: set VALID
    /// with release); one doorbell covers any number of them.
    ///
    /// A QP not in RTS is [`Error::InvalidQpState`] (rxe answers EINVAL,
    /// siw ENOTCONN); other failures map the errno as usual. The call and
    /// errno are recorded for `verbs::last_error` either way.
    pub fn doorbell(&self) -> Result<()> {
        let c: *const Cmd<k::ib_uverbs_post_send> = &self.db.cmd;
        match write_raw(self.fd, c.cast(), size_of::<Cmd<k::ib_uverbs_post_send>>()) {
            Ok(()) => Ok(()),
            Err(errno) => {
                let e = cmd_error("uverbs POST_SEND (doorbell)", errno);
                if errno == libc::EINVAL || errno == libc::ENOTCONN {
                    Err(Error::InvalidQpState)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Unmaps the rings and destroys the QP, reporting the kernel's error
    /// (the kernel object is then freed with the context).
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    /// Unmaps what is mapped, then destroys the kernel object, once.
    fn teardown(&mut self) -> Result<()> {
        drop(self.sq.take());
        drop(self.rq.take());
        if !core::mem::replace(&mut self.alive, false) {
            return Ok(());
        }
        let mut resp = k::ib_uverbs_destroy_qp_resp::default();
        exec(
            self.fd,
            "uverbs DESTROY_QP",
            cmd::IB_USER_VERBS_CMD_DESTROY_QP,
            k::ib_uverbs_destroy_qp {
                response: resp_addr(&mut resp),
                qp_handle: self.handle,
                reserved: 0,
            },
            size_of::<k::ib_uverbs_destroy_qp_resp>(),
        )
    }
}

impl Drop for UverbsQp {
    fn drop(&mut self) {
        // Recorded for `verbs::last_error`, otherwise ignored.
        let _ = self.teardown();
    }
}

/// `ib_uverbs_qp_dest` from an `ibv_ah_attr` (same fields, flat GRH).
fn qp_dest(ah: &ibv::ibv_ah_attr) -> k::ib_uverbs_qp_dest {
    k::ib_uverbs_qp_dest {
        // SAFETY: every bit pattern of the GID union is a valid `raw`.
        dgid: unsafe { ah.grh.dgid.raw },
        flow_label: ah.grh.flow_label,
        dlid: ah.dlid,
        reserved: 0,
        sgid_index: ah.grh.sgid_index,
        hop_limit: ah.grh.hop_limit,
        traffic_class: ah.grh.traffic_class,
        sl: ah.sl,
        src_path_bits: ah.src_path_bits,
        static_rate: ah.static_rate,
        is_global: ah.is_global,
        port_num: ah.port_num,
    }
}

// ---------------------------------------------------------------------------
// Completion channel.

/// A completion channel of our own: CREATE_COMP_CHANNEL on the context's
/// command fd returns a new fd (close-on-exec), made non-blocking here.
/// Give [`CompChannel::fd`] to [`UverbsCq::create`]; arm the CQ; wait for
/// the fd to become readable (poll/epoll); then [`CompChannel::consume`].
///
/// Chosen over `ibv_create_comp_channel` so that no libibverbs object
/// exists whose event functions someone could call on our CQs: the
/// kernel's events name our `user_handle`, not an `ibv_cq*`. Drop the CQs
/// that use a channel before the channel (the kernel keeps the channel
/// alive for them anyway).
pub struct CompChannel {
    fd: i32,
}

impl CompChannel {
    /// Creates a completion channel on `ctx`.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context`.
    pub unsafe fn create(ctx: *mut ibv::ibv_context) -> Result<CompChannel> {
        // SAFETY: the caller's contract.
        let fd = unsafe { cmd_fd(ctx) }?;
        let mut resp = k::ib_uverbs_create_comp_channel_resp::default();
        exec(
            fd,
            "uverbs CREATE_COMP_CHANNEL",
            cmd::IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
            k::ib_uverbs_create_comp_channel {
                response: resp_addr(&mut resp),
            },
            size_of::<k::ib_uverbs_create_comp_channel_resp>(),
        )?;
        let ch = CompChannel { fd: resp.fd as i32 };
        if ch.fd < 0 {
            return Err(Error::ProviderError);
        }
        set_nonblocking(ch.fd).map_err(|errno| fail("fcntl(O_NONBLOCK)", errno))?;
        Ok(ch)
    }

    /// The channel's fd: readable while events are pending.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Takes every pending event without blocking, calling `on_event` with
    /// each one's CQ `user_handle`; returns how many there were. No
    /// acknowledgement is needed (that is libibverbs bookkeeping).
    pub fn consume(&self, mut on_event: impl FnMut(u64)) -> Result<u32> {
        let mut n = 0u32;
        let mut buf = [k::ib_uverbs_comp_event_desc::default(); 16];
        loop {
            let want = size_of_val(&buf);
            // SAFETY: `buf` is writable for `want` bytes; the fd is ours.
            let r = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), want) };
            if r < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => return Ok(n),
                    e => return Err(fail("read(comp channel)", e)),
                }
            }
            let got = r as usize / size_of::<k::ib_uverbs_comp_event_desc>();
            if got == 0 {
                return Ok(n);
            }
            for d in &buf[..got.min(buf.len())] {
                on_event(d.cq_handle);
                n = n.saturating_add(1);
            }
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

fn set_nonblocking(fd: i32) -> core::result::Result<(), i32> {
    // SAFETY: fcntl on an fd we own; no memory is involved.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(errno());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(errno());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Async events.

/// One asynchronous event (`struct ib_uverbs_async_event_desc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// For CQ, QP and SRQ events the `user_handle` given at creation; for
    /// port events the port number.
    pub element: u64,
    /// The event, numbered as `ibv_event_type` (`rdma_sys::ibv_event_type`:
    /// CQ_ERR 0, QP_FATAL 1, QP_REQ_ERR 2, QP_ACCESS_ERR 3, COMM_EST 4,
    /// SQ_DRAINED 5, ..., PORT_ACTIVE 9, PORT_ERR 10, ...,
    /// QP_LAST_WQE_REACHED 16, ...).
    pub event_type: u32,
}

/// The context's async event fd (`ibv_context.async_fd`), read directly.
///
/// The fd belongs to the context and is shared by everything on it: while
/// this reader is in use nothing else may read it — in particular not
/// libibverbs' `ibv_get_async_event`, which would take our events and
/// read their `element` (our `user_handle`) as an object pointer, and whose
/// events this reader would in turn consume. Events for libibverbs-made
/// objects on the same context (PD/MR have none; CQs/QPs made by
/// libibverbs do) arrive here too, with libibverbs' own user handles.
#[derive(Clone, Copy, Debug)]
pub struct AsyncEvents {
    fd: i32,
}

impl AsyncEvents {
    /// The reader of `ctx`'s async events. The fd's flags are left alone.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context`, open while this reader is
    /// used.
    pub unsafe fn new(ctx: *mut ibv::ibv_context) -> Result<AsyncEvents> {
        if ctx.is_null() {
            return Err(Error::NullPointer);
        }
        // SAFETY: live context (the caller's contract).
        let fd = unsafe { (*ctx).async_fd };
        if fd < 0 {
            return Err(Error::NoDevice);
        }
        Ok(AsyncEvents { fd })
    }

    /// The fd (for poll/epoll).
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The next event if one is pending, without blocking (a zero-timeout
    /// `poll`, then one `read`; with a single reader the read cannot
    /// block). No acknowledgement is needed.
    pub fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 0) };
            if r < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Err(fail("poll(async fd)", errno()));
            }
            if r == 0 || pfd.revents & libc::POLLIN == 0 {
                return Ok(None);
            }
            break;
        }
        let mut d = k::ib_uverbs_async_event_desc::default();
        loop {
            // SAFETY: `d` is writable for its size.
            let r = unsafe {
                libc::read(
                    self.fd,
                    (&mut d as *mut k::ib_uverbs_async_event_desc).cast(),
                    size_of::<k::ib_uverbs_async_event_desc>(),
                )
            };
            if r == size_of::<k::ib_uverbs_async_event_desc>() as isize {
                return Ok(Some(AsyncEvent {
                    element: d.element,
                    event_type: d.event_type,
                }));
            }
            if r >= 0 {
                return Err(Error::ProviderError);
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Ok(None),
                e => return Err(fail("read(async fd)", e)),
            }
        }
    }
}
