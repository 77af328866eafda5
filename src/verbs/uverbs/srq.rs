//! [`UverbsSrq`]: CREATE_SRQ, the SRQ ring mapping, MODIFY_SRQ (the
//! limit), QUERY_SRQ and DESTROY_SRQ (docs/spec/rxe.md §7,
//! docs/spec/siw.md §5).

use core::mem::{offset_of, size_of};

use rdma_sys as ibv;

use super::command::{cmd_fd, exec, resp_addr};
use super::mapping::Ring;
use super::{Kind, RingView};
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, Ordering};
use crate::sys::uverbs as k;
use k::ib_uverbs_write_cmds as cmd;

/// `IB_SRQ_LIMIT` (`enum ib_srq_attr_mask`; libibverbs' `IBV_SRQ_LIMIT`).
const SRQ_LIMIT_MASK: u32 = 1 << 1;

/// CREATE_SRQ's response: the core part, then the driver's.
#[repr(C)]
#[derive(Default)]
struct SrqResp<D> {
    core: k::ib_uverbs_create_srq_resp,
    drv: D,
}
static_assertions::const_assert_eq!(offset_of!(SrqResp<k::rxe_create_srq_resp>, drv), 16);
static_assertions::const_assert_eq!(offset_of!(SrqResp<k::siw_uresp_create_srq>, drv), 16);
static_assertions::const_assert_eq!(size_of::<SrqResp<k::rxe_create_srq_resp>>(), 40);
static_assertions::const_assert_eq!(size_of::<SrqResp<k::siw_uresp_create_srq>>(), 32);

/// MODIFY_SRQ with rxe's driver input after it (rxe refuses the command
/// without those 8 bytes, docs/spec/rxe.md §7).
#[repr(C)]
struct RxeModify {
    core: k::ib_uverbs_modify_srq,
    drv: k::rxe_modify_srq_cmd,
}
static_assertions::const_assert_eq!(size_of::<RxeModify>(), 24);

/// An SRQ's sizes and armed limit as the kernel reports them (QUERY_SRQ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqQuery {
    /// Receives the SRQ holds.
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// The armed limit (0: not armed).
    pub srq_limit: u32,
}

/// A shared receive queue created with the kernel's CREATE_SRQ on the
/// context's command fd, its ring mapped. QPs made with
/// [`UverbsQp::create_on_srq`](super::UverbsQp::create_on_srq) take their
/// receives from it. Dropping it unmaps the ring and destroys the SRQ (if
/// [`UverbsSrq::destroy`] has not already).
pub struct UverbsSrq {
    pub(super) fd: i32,
    pub(super) kind: Kind,
    pub(super) handle: u32,
    srqn: u32,
    user_handle: u64,
    max_sge: u32,
    ring: Ring,
    /// The kernel object exists (cleared by the destroy attempt).
    alive: AtomicBool,
}

// SAFETY: a kernel handle and a shared mapping handed out only as a raw
// pointer; every command is built on the stack.
unsafe impl Send for UverbsSrq {}
// SAFETY: as above; `alive` is atomic.
unsafe impl Sync for UverbsSrq {}

impl UverbsSrq {
    /// Creates an SRQ of at least `max_wr` receives of `max_sge` scatter
    /// entries on `ctx`'s command fd, on the PD whose kernel handle is
    /// `pd_handle`, with no limit armed, and maps its ring. The ring's view
    /// ([`UverbsSrq::ring`]) has what it really holds.
    ///
    /// Errors: the kernel's errno mapped as everywhere in
    /// [`crate::verbs`]; a driver response or ring header that makes no
    /// sense is [`Error::InvalidGeometry`]. Nothing is left behind on
    /// error.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context` of a device of `kind`,
    /// open until this SRQ is dropped.
    pub unsafe fn create(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        pd_handle: u32,
        max_wr: u32,
        max_sge: u32,
        user_handle: u64,
    ) -> Result<UverbsSrq> {
        // SAFETY: the caller's contract.
        let fd = unsafe { cmd_fd(ctx) }?;
        let body = |response: u64| k::ib_uverbs_create_srq {
            response,
            user_handle,
            pd_handle,
            max_wr,
            max_sge,
            srq_limit: 0,
            ..Default::default()
        };
        // The core response (the kernel made the object) and the ring
        // mapping, or the mapping's error.
        let (core, ring) = match kind {
            Kind::Rxe => {
                let mut resp = SrqResp::<k::rxe_create_srq_resp>::default();
                let b = body(resp_addr(&mut resp));
                exec(
                    fd,
                    "uverbs CREATE_SRQ",
                    cmd::IB_USER_VERBS_CMD_CREATE_SRQ,
                    b,
                    size_of_val(&resp),
                )?;
                (resp.core, Ring::map_rxe(fd, &resp.drv.mi))
            }
            Kind::Siw => {
                let mut resp = SrqResp::<k::siw_uresp_create_srq>::default();
                let b = body(resp_addr(&mut resp));
                exec(
                    fd,
                    "uverbs CREATE_SRQ",
                    cmd::IB_USER_VERBS_CMD_CREATE_SRQ,
                    b,
                    size_of_val(&resp),
                )?;
                let d = resp.drv;
                let ring = Ring::map_siw(fd, d.srq_key, d.num_rqe, size_of::<k::siw_rqe>(), 0);
                (resp.core, ring)
            }
        };
        match ring {
            Ok(ring) => Ok(UverbsSrq {
                fd,
                kind,
                handle: core.srq_handle,
                srqn: core.srqn,
                user_handle,
                max_sge: core.max_sge.max(max_sge),
                ring,
                alive: AtomicBool::new(true),
            }),
            Err(e) => {
                // Nothing left behind: the object the kernel made goes.
                let _ = destroy_cmd(fd, core.srq_handle);
                Err(e)
            }
        }
    }

    /// The device kind this SRQ was created for.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The kernel's handle of this SRQ.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The SRQ number the kernel reports.
    pub fn srq_num(&self) -> u32 {
        self.srqn
    }

    /// The `user_handle` given at creation (echoed in async events).
    pub fn user_handle(&self) -> u64 {
        self.user_handle
    }

    /// Scatter entries per receive (as granted, at least as asked).
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The ring.
    pub fn ring(&self) -> RingView {
        self.ring.view()
    }

    /// Start of the ring mapping.
    pub fn ring_ptr(&self) -> *mut u8 {
        self.ring.map.ptr.as_ptr()
    }

    /// Length of the ring mapping.
    pub fn ring_len(&self) -> usize {
        self.ring.map.len
    }

    /// Arms the limit (0 disarms): MODIFY_SRQ with `IB_SRQ_LIMIT` alone.
    /// A limit the kernel refuses (above the ring's size) is
    /// [`Error::InvalidAttribute`]; a destroyed SRQ [`Error::NoSuchObject`].
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        // Relaxed: a flag of this object alone, no data behind it.
        if !self.alive.load(Ordering::Relaxed) {
            return Err(Error::NoSuchObject);
        }
        let core = k::ib_uverbs_modify_srq {
            srq_handle: self.handle,
            attr_mask: SRQ_LIMIT_MASK,
            max_wr: 0,
            srq_limit: limit,
            ..Default::default()
        };
        let op = "uverbs MODIFY_SRQ";
        let n = cmd::IB_USER_VERBS_CMD_MODIFY_SRQ;
        match self.kind {
            Kind::Rxe => {
                // A mapping address the kernel only uses when resizing; 0
                // for a limit alone.
                let b = RxeModify {
                    core,
                    drv: k::rxe_modify_srq_cmd { mmap_info_addr: 0 },
                };
                exec(self.fd, op, n, b, 0)
            }
            Kind::Siw => exec(self.fd, op, n, core, 0),
        }
    }

    /// QUERY_SRQ: the sizes and the armed limit as the kernel has them.
    pub fn query(&self) -> Result<SrqQuery> {
        // Relaxed: as in `arm_limit`.
        if !self.alive.load(Ordering::Relaxed) {
            return Err(Error::NoSuchObject);
        }
        let mut resp = k::ib_uverbs_query_srq_resp::default();
        exec(
            self.fd,
            "uverbs QUERY_SRQ",
            cmd::IB_USER_VERBS_CMD_QUERY_SRQ,
            k::ib_uverbs_query_srq {
                response: resp_addr(&mut resp),
                srq_handle: self.handle,
                reserved: 0,
                ..Default::default()
            },
            size_of::<k::ib_uverbs_query_srq_resp>(),
        )?;
        Ok(SrqQuery {
            max_wr: resp.max_wr,
            max_sge: resp.max_sge,
            srq_limit: resp.srq_limit,
        })
    }

    /// Destroys the kernel object (once; later calls are
    /// [`Error::NoSuchObject`]). The ring stays mapped until the drop, and
    /// nothing writes it after this: the mapping keeps the queue's pages
    /// alive (rxe: the mapping holds a reference on the queue's mmap
    /// info; siw: the pages inserted into our mapping are counted, so its
    /// `vfree` at destroy leaves them until we unmap). While QPs use the SRQ the kernel refuses
    /// ([`Error::ResourceBusy`]) and the SRQ stays as it was.
    pub fn destroy(&self) -> Result<()> {
        // Relaxed: the flag guards the one DESTROY command and no data;
        // concurrent callers race for it, one wins.
        if self
            .alive
            .compare_exchange(true, false, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return Err(Error::NoSuchObject);
        }
        let r = destroy_cmd(self.fd, self.handle);
        if r == Err(Error::ResourceBusy) {
            // Still alive in the kernel (QPs attached).
            // Relaxed: as above.
            self.alive.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl Drop for UverbsSrq {
    fn drop(&mut self) {
        // Relaxed: `&mut self`, no other user.
        if self.alive.swap(false, Ordering::Relaxed) {
            // Recorded for `verbs::last_error`, otherwise ignored.
            let _ = destroy_cmd(self.fd, self.handle);
        }
        // The ring unmaps with `self.ring`.
    }
}

/// DESTROY_SRQ of `handle`; EBUSY (QPs attached) is
/// [`Error::ResourceBusy`], as every errno maps.
fn destroy_cmd(fd: i32, handle: u32) -> Result<()> {
    let mut resp = k::ib_uverbs_destroy_srq_resp::default();
    let body = k::ib_uverbs_destroy_srq {
        response: resp_addr(&mut resp),
        srq_handle: handle,
        reserved: 0,
    };
    exec(
        fd,
        "uverbs DESTROY_SRQ",
        cmd::IB_USER_VERBS_CMD_DESTROY_SRQ,
        body,
        size_of::<k::ib_uverbs_destroy_srq_resp>(),
    )
}
