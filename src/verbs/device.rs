//! [`VerbsDevice`]: the device context, the tables of the objects made on
//! it, and the device's own calls beyond [`Backend`](crate::api::Backend).

use std::collections::HashMap;
use std::string::String;
use std::sync::{Arc, Mutex, MutexGuard};

use rdma_sys as sys;

use super::{check, mlx5, path, uverbs, DataPath, DeviceCaps, Raw};
use crate::api::PortInfo;
use crate::completion::QpState;
use crate::error::{Error, Result};

pub(super) struct CqEntry {
    /// libibverbs CQ (null on the rxe/siw direct path).
    pub(super) cq: Raw<sys::ibv_cq>,
    /// libibverbs channel (null on the rxe/siw direct path).
    pub(super) channel: Raw<sys::ibv_comp_channel>,
    /// The rxe/siw direct path's CQ and its own completion channel.
    pub(super) direct: Option<(Arc<uverbs::UverbsCq>, Arc<uverbs::CompChannel>)>,
    pub(super) registry: Arc<path::CqRegistry>,
    pub(super) qps: u32,
}

pub(super) struct QpEntry {
    /// libibverbs QP (null on the rxe/siw direct path).
    pub(super) qp: Raw<sys::ibv_qp>,
    /// The rxe/siw direct path's QP.
    pub(super) direct: Option<Arc<uverbs::UverbsQp>>,
    /// Verbs fallback: the wr_id tables.
    pub(super) track: Option<Arc<path::QpTrack>>,
    /// mlx5 direct path: the thread domain (freed after the QP).
    pub(super) _td: Option<mlx5::ThreadDomain>,
    pub(super) cqs: [u32; 2],
    pub(super) pd: u32,
    /// The SRQ (table handle) the QP takes its receives from.
    pub(super) srq: Option<u32>,
}
// SAFETY: the thread domain's pointers are used only by its Drop, under the
// tables' mutex.
unsafe impl Send for QpEntry {}

pub(super) struct SrqEntry {
    /// libibverbs SRQ (null on the rxe/siw direct rings).
    pub(super) srq: Raw<sys::ibv_srq>,
    /// The rxe/siw direct rings' SRQ.
    pub(super) direct: Option<Arc<uverbs::UverbsSrq>>,
    pub(super) track: Arc<path::SrqTrack>,
    pub(super) pd: u32,
    /// QPs attached.
    pub(super) qps: u32,
}

#[derive(Default)]
pub(super) struct Tables {
    pub(super) next: u32,
    pub(super) pds: HashMap<u32, (Raw<sys::ibv_pd>, u32)>,
    pub(super) mrs: HashMap<u32, (Raw<sys::ibv_mr>, u32)>,
    pub(super) cqs: HashMap<u32, CqEntry>,
    pub(super) qps: HashMap<u32, QpEntry>,
    /// Verbs fallback: shared receive queues, by the handle the API names
    /// them with.
    pub(super) srqs: HashMap<u32, SrqEntry>,
    /// Verbs fallback: address handles (and their PD), by handle.
    pub(super) ahs: HashMap<u32, (Raw<sys::ibv_ah>, u32)>,
    /// rxe direct rings: address handles of our own CREATE_AH (and their
    /// PD), by handle.
    pub(super) direct_ahs: HashMap<u32, (uverbs::UverbsAh, u32)>,
    /// rxe/siw direct path: the `user_handle` each QP was created with
    /// (what the kernel's async events name) to its QP number.
    pub(super) qp_handles: HashMap<u64, u32>,
}

/// The owner of the device context. Dropped last (after every object that
/// holds the Arc).
pub(crate) struct Ctx {
    pub(crate) ctx: *mut sys::ibv_context,
    pub(super) owned: bool,
}
// SAFETY: an ibv_context is thread-safe for all the calls this crate makes.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: opened by ibv_open_device in `VerbsDevice::open`, and
            // every object on it was destroyed (they hold this Arc).
            unsafe { sys::ibv_close_device(self.ctx) };
        }
    }
}

/// A libibverbs device: the [`Backend`](crate::api::Backend) for real kernel RDMA devices.
pub struct VerbsDevice {
    pub(super) ctx: Arc<Ctx>,
    pub(super) name: String,
    pub(super) port: PortInfo,
    pub(super) caps: DeviceCaps,
    /// rxe/siw direct path: the device kind and the context's async event
    /// reader (the context is private to this device: no libibverbs QP or
    /// CQ exists on it whose events libibverbs would have to see).
    pub(super) direct: Option<(uverbs::Kind, uverbs::AsyncEvents)>,
    pub(super) tables: Mutex<Tables>,
    /// Memory windows and the regions they may be bound to, shared with
    /// the verbs-fallback QPs (libibverbs' BIND_MW work request names both by
    /// pointer).
    pub(super) windows: Arc<Mutex<path::WindowTable>>,
}

pub(super) fn query_gid(ctx: *mut sys::ibv_context, port: u8, index: i32) -> Result<[u8; 16]> {
    // SAFETY: an all-zero ibv_gid is valid.
    let mut gid: sys::ibv_gid = unsafe { core::mem::zeroed() };
    // SAFETY: live context; `gid` is a valid out-pointer.
    check("ibv_query_gid", unsafe {
        sys::ibv_query_gid(ctx, port, index, &mut gid)
    })?;
    // SAFETY: every bit pattern is a valid `raw` view.
    Ok(unsafe { gid.raw })
}

impl VerbsDevice {
    /// Device capabilities.
    pub fn caps(&self) -> DeviceCaps {
        self.caps
    }

    /// The data path this device's QPs use: [`DataPath::Direct`] (mlx5
    /// core, or rdma-direct's own rxe/siw rings) or [`DataPath::Fallback`].
    pub fn data_path(&self) -> DataPath {
        if self.direct.is_some() || self.caps.direct_mlx5 {
            DataPath::Direct
        } else {
            DataPath::Fallback
        }
    }

    /// The raw context (for rdma_cm and for callers mixing in their own
    /// libibverbs calls).
    pub fn context(&self) -> *mut sys::ibv_context {
        self.ctx.ctx
    }

    /// The GID at `index` of this device's port.
    pub fn gid(&self, index: u8) -> Result<[u8; 16]> {
        query_gid(self.ctx.ctx, self.port.port_num, i32::from(index))
    }

    /// The completion channel fd of CQ `cqn` (for epoll; event mode).
    pub fn cq_channel_fd(&self, cqn: u32) -> Result<i32> {
        let t = self.lock();
        let e = t.cqs.get(&cqn).ok_or(Error::NoSuchObject)?;
        if let Some((_, ch)) = &e.direct {
            return Ok(ch.fd());
        }
        // SAFETY: the channel lives as long as its table entry.
        Ok(unsafe { (*e.channel.0).fd })
    }

    /// The traffic class, service level, hop limit and source GID index
    /// QP `qpn` really uses, as the kernel reports them (after RTR): to
    /// check which PFC priority a connection's traffic sits on.
    pub fn query_qp_service(&self, qpn: u32) -> Result<uverbs::QpService> {
        let (qp, direct) = {
            let t = self.lock();
            let e = t.qps.get(&qpn).ok_or(Error::NoSuchObject)?;
            (e.qp.0, e.direct.clone())
        };
        if let Some(d) = direct {
            return d.query_service();
        }
        // SAFETY: all-zero is valid for both structs.
        let (mut attr, mut init): (sys::ibv_qp_attr, sys::ibv_qp_init_attr) =
            unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
        // SAFETY: a live QP (in the tables); valid out-pointers.
        check("ibv_query_qp", unsafe {
            sys::ibv_query_qp(
                qp,
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_AV.0 as i32,
                &mut init,
            )
        })?;
        Ok(uverbs::QpService {
            traffic_class: attr.ah_attr.grh.traffic_class,
            sl: attr.ah_attr.sl,
            hop_limit: attr.ah_attr.grh.hop_limit,
            sgid_index: attr.ah_attr.grh.sgid_index,
        })
    }

    /// Modifies QP `qpn` with exactly `attr` and `mask` (rdma_cm's
    /// `rdma_init_qp_attr` results), on whichever path the QP is.
    pub(crate) fn modify_qp_attr(
        &self,
        qpn: u32,
        attr: &mut sys::ibv_qp_attr,
        mask: i32,
    ) -> Result<()> {
        let (qp, direct) = {
            let t = self.lock();
            let e = t.qps.get(&qpn).ok_or(Error::NoSuchObject)?;
            (e.qp.0, e.direct.clone())
        };
        match direct {
            Some(d) => d.modify_raw(attr, mask as u32),
            // SAFETY: live QP (in the tables); attributes filled for `mask`.
            None => check("ibv_modify_qp", unsafe {
                sys::ibv_modify_qp(qp, attr, mask)
            }),
        }
    }

    /// Records a state the kernel moved a QP to (rdma_cm on iWARP), so
    /// the data path's view follows.
    pub(crate) fn note_state(&self, qpn: u32, st: QpState) {
        if let Some(t) = self.lock().qps.get(&qpn).and_then(|e| e.track.as_ref()) {
            t.set_state(st);
        }
    }

    /// Records a new QP in the tables and counts it on its PD and CQs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn register_qp(
        &self,
        t: &mut Tables,
        qpn: u32,
        qp: *mut sys::ibv_qp,
        track: Option<Arc<path::QpTrack>>,
        td: Option<mlx5::ThreadDomain>,
        direct: Option<Arc<uverbs::UverbsQp>>,
        pd: u32,
        cqs: [u32; 2],
    ) {
        for cqn in cqs {
            if let Some(e) = t.cqs.get_mut(&cqn) {
                e.qps += 1;
                if let Some(tr) = &track {
                    e.registry.add(Arc::clone(tr));
                }
            }
        }
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 += 1;
        }
        t.qps.insert(
            qpn,
            QpEntry {
                qp: Raw(qp),
                direct,
                track,
                _td: td,
                cqs,
                pd,
                srq: None,
            },
        );
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock cannot leave the maps torn in a
        // way that matters here (each update is one insert/remove).
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The window table (taken after `tables` when both are held).
    pub(super) fn windows(&self) -> MutexGuard<'_, path::WindowTable> {
        // As for `lock`.
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}
