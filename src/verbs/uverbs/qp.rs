//! [`UverbsQp`]: CREATE_QP (RC, with a receive ring or on an SRQ), the ring mappings, MODIFY_QP,
//! QUERY_QP, the doorbell (an empty POST_SEND) and DESTROY_QP.

use core::cell::UnsafeCell;
use core::mem::{offset_of, size_of};
use std::boxed::Box;

use rdma_sys as ibv;

use super::command::{cmd_error, cmd_fd, exec, resp_addr, write_raw, Cmd};
use super::layout::{DOORBELL_WQE_SIZE, QPT_RC, QPT_UD};
use super::mapping::Ring;
use super::{Kind, RingView, UverbsCq, UverbsSrq};
use crate::attr::{QpInit, QpModify};
use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use crate::verbs::{qp_attr, DeviceCaps};
use k::ib_uverbs_write_cmds as cmd;

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
        // SAFETY: forwarded contract.
        unsafe {
            Self::create_inner(
                ctx,
                kind,
                pd_handle,
                [send_cq, recv_cq],
                None,
                false,
                caps,
                sq_sig_all,
                user_handle,
            )
        }
    }

    /// As [`UverbsQp::create`], for an RC QP that takes its receives from
    /// `srq` (CREATE_QP with `is_srq` and the SRQ's handle,
    /// docs/spec/rxe.md §7, docs/spec/siw.md §5): the kernel makes no
    /// receive queue for it, so none is mapped ([`UverbsQp::rq`] is
    /// `None`) and the receive sizes of `caps` are sent as 0. An SRQ of
    /// another kind or context is [`Error::InvalidAttribute`].
    ///
    /// # Safety
    /// As [`UverbsQp::create`]; `srq` must stay alive (not destroyed)
    /// while this QP exists (the kernel refuses to destroy an SRQ in use).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn create_on_srq(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        pd_handle: u32,
        send_cq: &UverbsCq,
        recv_cq: &UverbsCq,
        srq: &UverbsSrq,
        caps: &QpInit,
        sq_sig_all: bool,
        user_handle: u64,
    ) -> Result<UverbsQp> {
        let caps = QpInit {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..*caps
        };
        // SAFETY: forwarded contract.
        unsafe {
            Self::create_inner(
                ctx,
                kind,
                pd_handle,
                [send_cq, recv_cq],
                Some(srq),
                false,
                &caps,
                sq_sig_all,
                user_handle,
            )
        }
    }

    /// A UD QP (rxe only: siw is [`Error::Unsupported`]) as
    /// [`UverbsQp::create`] or, with `srq`, [`UverbsQp::create_on_srq`]
    /// make an RC one (docs/spec/rxe.md §8).
    ///
    /// # Safety
    /// As [`UverbsQp::create_on_srq`] (for `srq`) or [`UverbsQp::create`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn create_ud(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        pd_handle: u32,
        send_cq: &UverbsCq,
        recv_cq: &UverbsCq,
        srq: Option<&UverbsSrq>,
        caps: &QpInit,
        user_handle: u64,
    ) -> Result<UverbsQp> {
        if kind != Kind::Rxe {
            return Err(Error::Unsupported);
        }
        let caps = match srq {
            Some(_) => QpInit {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..*caps
            },
            None => *caps,
        };
        // SAFETY: forwarded contract.
        unsafe {
            Self::create_inner(
                ctx,
                kind,
                pd_handle,
                [send_cq, recv_cq],
                srq,
                true,
                &caps,
                false,
                user_handle,
            )
        }
    }

    /// CREATE_QP (RC, or `ud`), optionally on an SRQ, and the ring mappings.
    ///
    /// # Safety
    /// As [`UverbsQp::create`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn create_inner(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        pd_handle: u32,
        [send_cq, recv_cq]: [&UverbsCq; 2],
        srq: Option<&UverbsSrq>,
        ud: bool,
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
        if let Some(s) = srq {
            if s.kind != kind || s.fd != fd {
                return Err(Error::InvalidAttribute);
            }
        }
        let body = |response: u64| k::ib_uverbs_create_qp {
            response,
            user_handle,
            pd_handle,
            send_cq_handle: send_cq.handle,
            recv_cq_handle: recv_cq.handle,
            srq_handle: srq.map_or(0, |s| s.handle),
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
            sq_sig_all: u8::from(sq_sig_all),
            qp_type: if ud { QPT_UD } else { QPT_RC },
            is_srq: u8::from(srq.is_some()),
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
                // On an SRQ the kernel makes no receive queue.
                if srq.is_none() && resp.drv.rq_mi.size != 0 {
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
                // No receive queue when none was asked for (or on an SRQ):
                // the key is then meaningless (0, itself a valid key, on current kernels).
                if srq.is_none() && d.num_rqe != 0 {
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
                srq: None,
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
    /// [`UverbsQp::sq`] and [`UverbsQp::rq`] (docs/spec/kernels.md).
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
    /// the attributes and mask the verbs fallback gives `ibv_modify_qp`
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
    /// returned (the siw flow, docs/spec/kernels.md step 4).
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

    /// Rings the doorbell: the empty POST_SEND (docs/spec/rxe.md §6, docs/spec/siw.md §4), prepared at
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
