//! [`UverbsCq`]: CREATE_CQ, the ring mapping, REQ_NOTIFY_CQ (rxe) and
//! DESTROY_CQ.

use core::mem::{offset_of, size_of};

use rdma_sys as ibv;

use super::command::{cmd_fd, exec, resp_addr};
use super::mapping::Ring;
use super::{Kind, RingView};
use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use k::ib_uverbs_write_cmds as cmd;

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
/// The ring format is the provider codec's business (rxe docs/spec/rxe.md §5, siw docs/spec/siw.md §2,
/// docs/spec/siw.md §3); this type only creates, maps, arms (rxe) and destroys.
pub struct UverbsCq {
    pub(super) fd: i32,
    pub(super) kind: Kind,
    pub(super) handle: u32,
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
    /// context (see [`CompChannel`](super::CompChannel)) or `None`; `user_handle` is what the
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
    /// completion channel. rxe has no other way to arm (docs/spec/rxe.md §5).
    ///
    /// siw is [`Error::Unsupported`], without a system call: its kernel
    /// refuses the command (EOPNOTSUPP, seen on 6.1). A siw CQ is armed in
    /// shared memory instead, by the codec: the `siw_cq_ctrl` word right
    /// after the last CQE (byte `slots * 32` of [`UverbsCq::ring`]; docs/spec/siw.md §3).
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

/// CREATE_CQ with the driver response `D` (no driver input, docs/spec/kernels.md).
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
