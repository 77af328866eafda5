//! The verbs backend (feature `verbs`): the control path on libibverbs
//! through `rdma-sys`, for real kernel devices.
//!
//! [`VerbsDevice`] implements [`Backend`], so every program written against
//! the safe API ([`crate::api`]) runs on it unchanged: list and open
//! devices, query the port (transport, link layer, LID, GID table), PDs,
//! MRs registered with exactly the access asked for, CQs with a completion
//! channel, RC QPs and their state changes.
//!
//! The data path depends on the provider:
//! * on every provider without a direct path (rxe, siw, ...) QPs and CQs use
//!   the portable path in [`path`]: `ibv_post_send` / `ibv_post_recv` with
//!   a chain of WRs per call, and `ibv_poll_cq`, behind the same
//!   [`crate::api::Qp`] calls, with the crate's WR validation and its
//!   wr_id bookkeeping (so queue space is exact and unsignaled WRs stay
//!   invisible, as on the direct path);
//! * on mlx5 (ConnectX) the raw queues come from `mlx5dv_init_obj` and go
//!   to the crate's direct mlx5 core ([`mlx5`]). That needs hardware this
//!   project's CI does not have; see `docs/verbs.md`.
//!
//! Connecting QP pairs: [`oob`] exchanges connection data over TCP (and
//! speaks `ibv_rc_pingpong`'s format), [`cm`] goes through rdma_cm (the
//! only way for iWARP).
//!
//! On a host whose kernel has no RDMA support, libibverbs lists no
//! devices: [`list_devices`] returns an empty list and [`VerbsDevice::open`]
//! returns [`Error::NoDevice`].
//!
//! Every failing provider call records its name and errno for
//! [`last_error`], because [`Error`] is a plain code.

pub mod cm;
pub(crate) mod direct;
mod layout_check;
pub mod mlx5;
pub mod oob;
pub mod path;
pub mod uverbs;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::string::String;
use std::sync::{Arc, Mutex, MutexGuard};
use std::vec::Vec;

use rdma_sys as sys;

use crate::api::{Backend, MrKeys, PortInfo, RawCq, RawCqPath, RawQp, RawQpPath, Transport};
use crate::error::{Error, Result};
use crate::provider::mlx5::QpState;
use crate::soft::{Access, QpInit, QpModify};
use crate::wr::QpCaps;

std::thread_local! {
    static LAST: Cell<(&'static str, i32)> = const { Cell::new(("", 0)) };
}

/// The provider call that failed last on this thread, and its errno
/// (`("", 0)` if none has).
pub fn last_error() -> (&'static str, i32) {
    LAST.with(|l| l.get())
}

/// Records a failed call and maps its errno to the crate's error.
pub(crate) fn fail(op: &'static str, errno: i32) -> Error {
    LAST.with(|l| l.set((op, errno)));
    errno_error(errno)
}

/// Records a failed call whose errno is in `errno` (libibverbs' convention
/// for calls that return NULL).
pub(crate) fn fail_errno(op: &'static str) -> Error {
    fail(
        op,
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    )
}

/// Checks a libibverbs return value: 0 is success; a positive value is an
/// errno; -1 means "see errno".
pub(crate) fn check(op: &'static str, ret: i32) -> Result<()> {
    match ret {
        0 => Ok(()),
        -1 => Err(fail_errno(op)),
        r if r < 0 => Err(fail(op, -r)),
        r => Err(fail(op, r)),
    }
}

/// The crate error closest to an errno.
pub fn errno_error(errno: i32) -> Error {
    match errno {
        libc::ENOMEM | libc::ENOSPC | libc::EAGAIN => Error::ResourceExhausted,
        libc::EINVAL | libc::EOPNOTSUPP | libc::ERANGE => Error::InvalidAttribute,
        libc::EBUSY => Error::ResourceBusy,
        libc::ENODEV | libc::ENOSYS | libc::ENXIO | libc::ENOENT => Error::NoDevice,
        libc::ETIMEDOUT => Error::Timeout,
        libc::ECONNREFUSED
        | libc::ECONNRESET
        | libc::ECONNABORTED
        | libc::EHOSTUNREACH
        | libc::ENETUNREACH
        | libc::EADDRNOTAVAIL
        | libc::EPIPE => Error::ConnectFailed,
        _ => Error::ProviderError,
    }
}

/// A device as libibverbs lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSummary {
    /// Kernel name (`rxe0`, `siw0`, `mlx5_0`).
    pub name: String,
    /// InfiniBand/RoCE (`false`) or iWARP (`true`) transport.
    pub iwarp: bool,
}

/// Lists the RDMA devices. Empty (not an error) on a host without any,
/// including one whose kernel has no RDMA support at all.
pub fn list_devices() -> Result<Vec<DeviceSummary>> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        // ENOSYS: no uverbs in this kernel; nothing to list.
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a live ibv_device; its name is NUL-terminated.
        let (name, iwarp) = unsafe {
            (
                CStr::from_ptr((*dev).name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                (*dev).transport_type == sys::ibv_transport_type::IBV_TRANSPORT_IWARP,
            )
        };
        out.push(DeviceSummary { name, iwarp });
    }
    // SAFETY: allocated by ibv_get_device_list above, freed once.
    unsafe { sys::ibv_free_device_list(list) };
    Ok(out)
}

/// How to open a device.
#[derive(Clone, Debug, Default)]
pub struct VerbsConfig {
    /// Device name (`None`: the first device).
    pub device: Option<String>,
    /// Port (1-based; 0 means 1).
    pub port: u8,
    /// GID index QPs send from (`None`: on RoCE the RoCEv2 IPv4 entry,
    /// else 0).
    pub gid_index: Option<u8>,
    /// Which data path QPs and CQs use.
    pub data_path: DataPath,
}

/// Which data path a [`VerbsDevice`] gives its QPs and CQs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataPath {
    /// The fastest the device has: the mlx5 core on ConnectX, the direct
    /// rxe/siw rings on the kernel's software devices, libibverbs
    /// otherwise. The environment variable `RDMA_DIRECT_DATA_PATH`
    /// (`portable` or `direct`) overrides it, so a whole program or test
    /// suite can be run on either path unchanged.
    #[default]
    Auto,
    /// libibverbs' `ibv_post_send` / `ibv_poll_cq` (any device).
    Portable,
    /// rdma-direct's own WQEs, doorbells and completion polling: mlx5, rxe
    /// or siw; [`Error::Unsupported`] on other devices.
    Direct,
}

impl DataPath {
    /// `Auto` resolved through `RDMA_DIRECT_DATA_PATH`.
    fn resolve(self) -> Result<DataPath> {
        if self != DataPath::Auto {
            return Ok(self);
        }
        match std::env::var("RDMA_DIRECT_DATA_PATH").as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(DataPath::Auto),
            Ok("portable") => Ok(DataPath::Portable),
            Ok("direct") => Ok(DataPath::Direct),
            Ok(_) => Err(Error::InvalidAttribute),
        }
    }
}

/// Device attributes the backend checks requests against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// WRs per queue.
    pub max_qp_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// CQ entries.
    pub max_cqe: u32,
    /// Outstanding RDMA READ/atomic per QP (responder).
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA READ/atomic per QP (initiator).
    pub max_qp_init_rd_atom: u32,
    /// RDMA atomics (`IBV_ATOMIC_HCA` or `_GLOB`).
    pub atomics: bool,
    /// The provider's mlx5 direct path is in use.
    pub direct_mlx5: bool,
    /// The device has type-2 memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2A`
    /// or `_2B`): rkeys that can be bound and invalidated without
    /// re-registering (see [`crate::expose`]).
    pub memory_windows: bool,
}

/// A raw libibverbs object pointer, owned by the backend's tables.
pub(crate) struct Raw<T>(pub(crate) *mut T);
// SAFETY: libibverbs objects may be used from any thread; the tables that
// hold these pointers are behind the backend's mutex.
unsafe impl<T> Send for Raw<T> {}

struct CqEntry {
    /// libibverbs CQ (null on the rxe/siw direct path).
    cq: Raw<sys::ibv_cq>,
    /// libibverbs channel (null on the rxe/siw direct path).
    channel: Raw<sys::ibv_comp_channel>,
    /// The rxe/siw direct path's CQ and its own completion channel.
    direct: Option<(Arc<uverbs::UverbsCq>, Arc<uverbs::CompChannel>)>,
    registry: Arc<path::CqRegistry>,
    qps: u32,
}

struct QpEntry {
    /// libibverbs QP (null on the rxe/siw direct path).
    qp: Raw<sys::ibv_qp>,
    /// The rxe/siw direct path's QP.
    direct: Option<Arc<uverbs::UverbsQp>>,
    /// Portable path: the wr_id tables.
    track: Option<Arc<path::QpTrack>>,
    /// mlx5 direct path: the thread domain (freed after the QP).
    _td: Option<mlx5::ThreadDomain>,
    cqs: [u32; 2],
    pd: u32,
}
// SAFETY: the thread domain's pointers are used only by its Drop, under the
// tables' mutex.
unsafe impl Send for QpEntry {}

#[derive(Default)]
struct Tables {
    next: u32,
    pds: HashMap<u32, (Raw<sys::ibv_pd>, u32)>,
    mrs: HashMap<u32, (Raw<sys::ibv_mr>, u32)>,
    cqs: HashMap<u32, CqEntry>,
    qps: HashMap<u32, QpEntry>,
    /// rxe/siw direct path: the `user_handle` each QP was created with
    /// (what the kernel's async events name) to its QP number.
    qp_handles: HashMap<u64, u32>,
}

/// The owner of the device context. Dropped last (after every object that
/// holds the Arc).
pub(crate) struct Ctx {
    pub(crate) ctx: *mut sys::ibv_context,
    owned: bool,
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

/// A libibverbs device: the [`Backend`] for real kernel RDMA devices.
pub struct VerbsDevice {
    ctx: Arc<Ctx>,
    name: String,
    port: PortInfo,
    caps: DeviceCaps,
    /// rxe/siw direct path: the device kind and the context's async event
    /// reader (the context is private to this device: no libibverbs QP or
    /// CQ exists on it whose events libibverbs would have to see).
    direct: Option<(uverbs::Kind, uverbs::AsyncEvents)>,
    tables: Mutex<Tables>,
    /// Memory windows and the regions they may be bound to, shared with
    /// the portable QPs (libibverbs' BIND_MW work request names both by
    /// pointer).
    windows: Arc<Mutex<path::WindowTable>>,
}

/// `IBV_LINK_LAYER_ETHERNET` (verbs.h; an anonymous enum rdma-sys does
/// not bind).
const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// IB MTU enum to bytes.
fn mtu_bytes(m: u32) -> u32 {
    match m {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        5 => 4096,
        _ => 1024,
    }
}

/// Bytes to the IB MTU enum (the largest that fits).
fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        0..=511 => 1,
        512..=1023 => 2,
        1024..=2047 => 3,
        2048..=4095 => 4,
        _ => 5,
    }
}

/// The RoCEv2 IPv4 GID index of a port, from sysfs
/// (`/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>` says
/// "RoCE v2"; the GID is an IPv4-mapped address `::ffff:a.b.c.d`).
fn roce_v2_ipv4_gid(
    ctx: *mut sys::ibv_context,
    dev: &str,
    port: u8,
    tbl_len: i32,
) -> Option<(u8, [u8; 16])> {
    for i in 0..tbl_len.clamp(0, 256) {
        let p = std::format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{i}");
        let Ok(t) = std::fs::read_to_string(&p) else {
            continue;
        };
        if t.trim() != "RoCE v2" {
            continue;
        }
        let gid = query_gid(ctx, port, i).ok()?;
        if gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff {
            return Some((i as u8, gid));
        }
    }
    None
}

fn query_gid(ctx: *mut sys::ibv_context, port: u8, index: i32) -> Result<[u8; 16]> {
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
    /// Opens a device. [`Error::NoDevice`] if there is none (or none with
    /// the requested name).
    pub fn open(cfg: &VerbsConfig) -> Result<VerbsDevice> {
        let path = cfg.data_path.resolve()?;
        // The rxe/siw direct path creates its own CQs and QPs with raw
        // uverbs commands; it takes a context of its own, so that no
        // libibverbs object shares its async events (reference §F).
        let (ctx, owned) = if path == DataPath::Portable {
            open_context(cfg.device.as_deref())?
        } else {
            let (c, owned) = open_context(cfg.device.as_deref())?;
            // SAFETY: a live context.
            match unsafe { uverbs::Kind::detect(c) } {
                Some(_) => {
                    // SAFETY: live context: its device.
                    let dev = unsafe { (*c).device };
                    if owned {
                        // SAFETY: opened by open_context for us alone.
                        unsafe { sys::ibv_close_device(c) };
                    }
                    // SAFETY: a live device (libibverbs keeps its device
                    // list for the process).
                    let p = unsafe { sys::ibv_open_device(dev) };
                    if p.is_null() {
                        return Err(fail_errno("ibv_open_device"));
                    }
                    (p, true)
                }
                None => (c, owned),
            }
        };
        let ctx = Arc::new(Ctx { ctx, owned });
        // SAFETY: live context.
        let kind = unsafe { uverbs::Kind::detect(ctx.ctx) };
        let direct = match (path, kind) {
            (DataPath::Portable, _) => None,
            // SAFETY: live context, kept open by `ctx` (held by the device).
            (_, Some(k)) => Some((k, unsafe { uverbs::AsyncEvents::new(ctx.ctx) }?)),
            (_, None) => None,
        };
        // SAFETY: live context; its device pointer and name are valid.
        let (name, iwarp) = unsafe {
            let dev = (*ctx.ctx).device;
            (
                CStr::from_ptr((*dev).name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                (*dev).transport_type == sys::ibv_transport_type::IBV_TRANSPORT_IWARP,
            )
        };
        // SAFETY: all-zero is a valid ibv_device_attr.
        let mut da: sys::ibv_device_attr = unsafe { core::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        check("ibv_query_device", unsafe {
            sys::ibv_query_device(ctx.ctx, &mut da)
        })?;
        let port_num = cfg.port.max(1);
        // SAFETY: all-zero is a valid ibv_port_attr.
        let mut pa: sys::ibv_port_attr = unsafe { core::mem::zeroed() };
        // SAFETY: live context, valid out-pointer of the full size.
        check("ibv_query_port", unsafe {
            sys::___ibv_query_port(ctx.ctx, port_num, &mut pa)
        })?;
        let transport = if iwarp {
            Transport::Iwarp
        } else if pa.link_layer == IBV_LINK_LAYER_ETHERNET {
            Transport::Roce
        } else {
            Transport::InfiniBand
        };
        let (gid_index, gid) = match cfg.gid_index {
            Some(i) => (i, query_gid(ctx.ctx, port_num, i32::from(i))?),
            None => match transport {
                Transport::Roce => {
                    match roce_v2_ipv4_gid(ctx.ctx, &name, port_num, pa.gid_tbl_len) {
                        Some(found) => found,
                        None => (0, query_gid(ctx.ctx, port_num, 0)?),
                    }
                }
                _ => (0, query_gid(ctx.ctx, port_num, 0)?),
            },
        };
        // Non-blocking async events: `poll_async_event` must never block,
        // and the fd can go into the application's epoll set.
        // SAFETY: the context's own fd.
        unsafe {
            let fd = (*ctx.ctx).async_fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl >= 0 {
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        let caps = DeviceCaps {
            max_qp_wr: da.max_qp_wr.max(0) as u32,
            max_sge: da.max_sge.max(0) as u32,
            max_cqe: da.max_cqe.max(0) as u32,
            max_qp_rd_atom: da.max_qp_rd_atom.max(0) as u32,
            max_qp_init_rd_atom: da.max_qp_init_rd_atom.max(0) as u32,
            atomics: da.atomic_cap != sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
            direct_mlx5: path != DataPath::Portable && mlx5::usable(ctx.ctx),
            memory_windows: da.device_cap_flags
                & (sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                    | sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
                != 0,
        };
        if path == DataPath::Direct && direct.is_none() && !caps.direct_mlx5 {
            // No direct path for this device.
            return Err(Error::Unsupported);
        }
        Ok(VerbsDevice {
            ctx,
            name,
            port: PortInfo {
                port_num,
                transport,
                lid: pa.lid,
                gid_index,
                gid,
                mtu: mtu_bytes(pa.active_mtu),
            },
            caps,
            direct,
            tables: Mutex::new(Tables {
                next: 1,
                ..Tables::default()
            }),
            windows: Arc::default(),
        })
    }

    /// Opens the device named `name` on port 1 with the default GID.
    pub fn open_named(name: &str) -> Result<VerbsDevice> {
        VerbsDevice::open(&VerbsConfig {
            device: Some(name.into()),
            ..VerbsConfig::default()
        })
    }

    /// Device capabilities.
    pub fn caps(&self) -> DeviceCaps {
        self.caps
    }

    /// The data path this device's QPs use: [`DataPath::Direct`] (mlx5
    /// core, or rdma-direct's own rxe/siw rings) or [`DataPath::Portable`].
    pub fn data_path(&self) -> DataPath {
        if self.direct.is_some() || self.caps.direct_mlx5 {
            DataPath::Direct
        } else {
            DataPath::Portable
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
    fn register_qp(
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
            },
        );
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock cannot leave the maps torn in a
        // way that matters here (each update is one insert/remove).
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The window table (taken after `tables` when both are held).
    fn windows(&self) -> MutexGuard<'_, path::WindowTable> {
        // As for `lock`.
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Opens a device context, preferring librdmacm's own contexts so QPs made
/// here can be connected through rdma_cm (which works only on its
/// contexts).
fn open_context(want: Option<&str>) -> Result<(*mut sys::ibv_context, bool)> {
    let matches = |dev: *mut sys::ibv_device| -> bool {
        match want {
            None => true,
            // SAFETY: live device; NUL-terminated name.
            Some(w) => unsafe { CStr::from_ptr((*dev).name.as_ptr()) }.to_bytes() == w.as_bytes(),
        }
    };
    let mut n = 0;
    // SAFETY: valid out-pointer; the array is freed below.
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    if !list.is_null() {
        let mut found = core::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `n` valid context pointers.
            let c = unsafe { *list.add(i) };
            // SAFETY: live context with a live device.
            if !c.is_null() && matches(unsafe { (*c).device }) {
                found = c;
                break;
            }
        }
        // SAFETY: from rdma_get_devices; frees the array only (librdmacm
        // keeps the contexts open for the process).
        unsafe { sys::rdma_free_devices(list) };
        if !found.is_null() {
            return Ok((found, false));
        }
    }
    let mut n = 0;
    // SAFETY: valid out-pointer.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(fail_errno("ibv_get_device_list"));
    }
    let mut res = Err(Error::NoDevice);
    for i in 0..n.max(0) as usize {
        // SAFETY: `n` valid device pointers.
        let d = unsafe { *list.add(i) };
        if !d.is_null() && matches(d) {
            // SAFETY: live device.
            let c = unsafe { sys::ibv_open_device(d) };
            res = if c.is_null() {
                Err(fail_errno("ibv_open_device"))
            } else {
                Ok((c, true))
            };
            break;
        }
    }
    // SAFETY: from ibv_get_device_list, freed once (opened contexts stay).
    unsafe { sys::ibv_free_device_list(list) };
    res
}

/// `IBV_ACCESS_*` from the crate's flags (same numbering).
fn access_bits(a: Access) -> u32 {
    a.0
}

impl Backend for VerbsDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> PortInfo {
        self.port
    }

    fn alloc_pd(&self) -> Result<u32> {
        // SAFETY: live context.
        let pd = unsafe { sys::ibv_alloc_pd(self.ctx.ctx) };
        if pd.is_null() {
            return Err(fail_errno("ibv_alloc_pd"));
        }
        let mut t = self.lock();
        let h = t.next;
        t.next += 1;
        t.pds.insert(h, (Raw(pd), 0));
        Ok(h)
    }

    fn dealloc_pd(&self, pd: u32) -> Result<()> {
        let mut t = self.lock();
        let (raw, users) = t.pds.get(&pd).ok_or(Error::NoSuchObject)?;
        if *users != 0 {
            return Err(Error::ResourceBusy);
        }
        // SAFETY: a live PD with no MRs or QPs left.
        check("ibv_dealloc_pd", unsafe { sys::ibv_dealloc_pd(raw.0) })?;
        t.pds.remove(&pd);
        Ok(())
    }

    unsafe fn reg_mr(&self, pd: u32, addr: u64, len: u64, access: Access) -> Result<MrKeys> {
        if access.0 & !Access::MR_ALL.0 != 0 {
            return Err(Error::InvalidAttribute);
        }
        let mut t = self.lock();
        let (raw, _) = t.pds.get(&pd).ok_or(Error::NoSuchObject)?;
        // SAFETY: live PD; the caller keeps the memory valid until
        // dereg_mr (the function's contract).
        let mr = unsafe {
            sys::ibv_reg_mr(
                raw.0,
                addr as *mut core::ffi::c_void,
                len as usize,
                access_bits(access) as i32,
            )
        };
        if mr.is_null() {
            return Err(fail_errno("ibv_reg_mr"));
        }
        // SAFETY: a live MR just returned.
        let keys = unsafe {
            MrKeys {
                lkey: (*mr).lkey,
                rkey: (*mr).rkey,
            }
        };
        if t.mrs.contains_key(&keys.lkey) {
            // SAFETY: the MR just registered; nothing refers to it.
            unsafe { sys::ibv_dereg_mr(mr) };
            return Err(Error::ProviderError);
        }
        t.mrs.insert(keys.lkey, (Raw(mr), pd));
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 += 1;
        }
        if access.contains(Access::MW_BIND) {
            self.windows().mrs.insert(keys.lkey, Raw(mr));
        }
        Ok(keys)
    }

    fn dereg_mr(&self, lkey: u32) -> Result<()> {
        let mut t = self.lock();
        let (raw, pd) = t.mrs.get(&lkey).ok_or(Error::NoSuchObject)?;
        let pd = *pd;
        // SAFETY: a live MR owned by this table.
        check("ibv_dereg_mr", unsafe { sys::ibv_dereg_mr(raw.0) })?;
        t.mrs.remove(&lkey);
        self.windows().mrs.remove(&lkey);
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 -= 1;
        }
        Ok(())
    }

    fn alloc_mw(&self, pd: u32) -> Result<u32> {
        // The mlx5 core writes no UMR WQEs, so it could never bind one.
        if !self.caps.memory_windows || self.caps.direct_mlx5 {
            return Err(Error::Unsupported);
        }
        let mut t = self.lock();
        let (raw, _) = t.pds.get(&pd).ok_or(Error::NoSuchObject)?;
        // SAFETY: a live PD; rdma-sys's wrapper calls the provider's
        // alloc_mw (or reports EOPNOTSUPP when it has none).
        let mw = unsafe { sys::ibv_alloc_mw(raw.0, sys::ibv_mw_type::IBV_MW_TYPE_2) }
            .unwrap_or(core::ptr::null_mut());
        if mw.is_null() {
            let e = fail_errno("ibv_alloc_mw");
            return Err(match last_error().1 {
                libc::EOPNOTSUPP | libc::ENOSYS => Error::Unsupported,
                _ => e,
            });
        }
        // SAFETY: a live MW just returned.
        let rkey = unsafe { (*mw).rkey };
        let mut w = self.windows();
        if w.mws.contains_key(&(rkey >> 8)) {
            // SAFETY: the MW just allocated; nothing refers to it.
            unsafe { sys::ibv_dealloc_mw(mw) };
            return Err(Error::ProviderError);
        }
        w.mws.insert(rkey >> 8, (Raw(mw), pd));
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 += 1;
        }
        Ok(rkey)
    }

    fn dealloc_mw(&self, rkey: u32) -> Result<()> {
        let mut t = self.lock();
        let mut w = self.windows();
        let (raw, pd) = w.mws.get(&(rkey >> 8)).ok_or(Error::NoSuchObject)?;
        let (mw, pd) = (raw.0, *pd);
        // SAFETY: a live MW owned by this table (alloc_mw set the provider
        // ops, dealloc_mw among them).
        check("ibv_dealloc_mw", unsafe { sys::ibv_dealloc_mw(mw) })?;
        w.mws.remove(&(rkey >> 8));
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 -= 1;
        }
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<RawCq> {
        if let Some((kind, _)) = self.direct {
            return self.create_direct_cq(kind, depth);
        }
        if depth == 0 || (self.caps.max_cqe != 0 && depth > self.caps.max_cqe) {
            return Err(Error::InvalidAttribute);
        }
        // SAFETY: live context.
        let ch = unsafe { sys::ibv_create_comp_channel(self.ctx.ctx) };
        if ch.is_null() {
            return Err(fail_errno("ibv_create_comp_channel"));
        }
        // Non-blocking, so events can be drained without blocking
        // (`cq_event_consume`) and the fd can go into an epoll set.
        // SAFETY: the channel's own fd.
        unsafe {
            let fd = (*ch).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        // SAFETY: live context and channel; no CQ context pointer.
        let cq =
            unsafe { sys::ibv_create_cq(self.ctx.ctx, depth as i32, core::ptr::null_mut(), ch, 0) };
        if cq.is_null() {
            let e = fail_errno("ibv_create_cq");
            // SAFETY: the channel just created, unused.
            unsafe { sys::ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        let registry = Arc::new(path::CqRegistry::default());
        let cq_path = if self.caps.direct_mlx5 {
            match mlx5::cq_queues(cq) {
                Ok(dv) => RawCqPath::Mlx5(dv),
                Err(e) => {
                    // SAFETY: the CQ and channel just created, unused.
                    unsafe {
                        sys::ibv_destroy_cq(cq);
                        sys::ibv_destroy_comp_channel(ch);
                    }
                    return Err(e);
                }
            }
        } else {
            // SAFETY: live CQ.
            let granted = unsafe { (*cq).cqe }.max(0) as u32;
            RawCqPath::Portable(std::boxed::Box::new(path::VerbsCq::new(
                cq,
                Arc::clone(&registry),
                granted,
            )))
        };
        let mut t = self.lock();
        let h = t.next;
        t.next += 1;
        t.cqs.insert(
            h,
            CqEntry {
                cq: Raw(cq),
                channel: Raw(ch),
                direct: None,
                registry,
                qps: 0,
            },
        );
        Ok(RawCq {
            path: cq_path,
            cqn: h,
            keep: self.ctx.clone(),
        })
    }

    fn destroy_cq(&self, cqn: u32) -> Result<()> {
        let mut t = self.lock();
        let e = t.cqs.get(&cqn).ok_or(Error::NoSuchObject)?;
        if e.qps != 0 {
            return Err(Error::ResourceBusy);
        }
        if e.direct.is_some() {
            // The kernel CQ goes when its last holder (this entry, the
            // poller, QPs that used it) lets go of it.
            t.cqs.remove(&cqn);
            return Ok(());
        }
        // SAFETY: a live CQ with no QP left.
        check("ibv_destroy_cq", unsafe { sys::ibv_destroy_cq(e.cq.0) })?;
        // SAFETY: its only CQ is gone.
        check("ibv_destroy_comp_channel", unsafe {
            sys::ibv_destroy_comp_channel(e.channel.0)
        })?;
        t.cqs.remove(&cqn);
        Ok(())
    }

    fn create_qp(&self, pd: u32, send_cq: u32, recv_cq: u32, init: &QpInit) -> Result<RawQp> {
        let c = &self.caps;
        if init.max_send_wr == 0
            || (c.max_qp_wr != 0
                && (init.max_send_wr > c.max_qp_wr || init.max_recv_wr > c.max_qp_wr))
            || (c.max_sge != 0 && (init.max_send_sge > c.max_sge || init.max_recv_sge > c.max_sge))
        {
            return Err(Error::InvalidAttribute);
        }
        if let Some((kind, _)) = self.direct {
            return self.create_direct_qp(kind, pd, send_cq, recv_cq, init);
        }
        let mut t = self.lock();
        let pdp = t.pds.get(&pd).ok_or(Error::NoSuchObject)?.0 .0;
        let scq = t.cqs.get(&send_cq).ok_or(Error::NoSuchObject)?.cq.0;
        let rcq = t.cqs.get(&recv_cq).ok_or(Error::NoSuchObject)?.cq.0;
        let cap = sys::ibv_qp_cap {
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr.max(1),
            max_send_sge: init.max_send_sge.max(1),
            max_recv_sge: init.max_recv_sge.max(1),
            max_inline_data: init.max_inline_data,
        };
        if self.caps.direct_mlx5 {
            let (qp, dv, granted, td) = mlx5::create_qp(self.ctx.ctx, pdp, scq, rcq, cap)?;
            let caps = QpCaps {
                max_send_sge: granted.max_send_sge,
                max_inline_data: granted.max_inline_data,
                max_recv_sge: granted.max_recv_sge,
            };
            // SAFETY: live QP.
            let qpn = unsafe { (*qp).qp_num };
            self.register_qp(
                &mut t,
                qpn,
                qp,
                None,
                Some(td),
                None,
                pd,
                [send_cq, recv_cq],
            );
            return Ok(RawQp {
                path: RawQpPath::Mlx5(dv),
                qpn,
                caps,
                psn: random_psn(),
                keep: self.ctx.clone(),
            });
        }
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut ia: sys::ibv_qp_init_attr = unsafe { core::mem::zeroed() };
        ia.send_cq = scq;
        ia.recv_cq = rcq;
        ia.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        ia.sq_sig_all = 0;
        ia.cap = cap;
        // SAFETY: live PD and CQs; valid attributes.
        let qp = unsafe { sys::ibv_create_qp(pdp, &mut ia) };
        if qp.is_null() {
            return Err(fail_errno("ibv_create_qp"));
        }
        // ibv_create_qp writes the granted capabilities back into `ia.cap`.
        let caps = QpCaps {
            max_send_sge: ia.cap.max_send_sge,
            max_inline_data: ia.cap.max_inline_data,
            max_recv_sge: ia.cap.max_recv_sge,
        };
        // SAFETY: live QP.
        let qpn = unsafe { (*qp).qp_num };
        let track = Arc::new(path::QpTrack::new(
            qpn,
            ia.cap.max_send_wr.max(init.max_send_wr),
            ia.cap.max_recv_wr.max(init.max_recv_wr.max(1)),
        ));
        let portable = path::VerbsQp::new(
            qp,
            Arc::clone(&track),
            caps,
            self.caps.atomics,
            Arc::clone(&self.windows),
        );
        self.register_qp(
            &mut t,
            qpn,
            qp,
            Some(track),
            None,
            None,
            pd,
            [send_cq, recv_cq],
        );
        Ok(RawQp {
            path: RawQpPath::Portable(std::boxed::Box::new(portable)),
            qpn,
            caps,
            psn: random_psn(),
            keep: self.ctx.clone(),
        })
    }

    fn modify_qp(&self, qpn: u32, m: &QpModify) -> Result<()> {
        let (mut attr, mask) = qp_attr(m, &self.caps);
        match self.modify_qp_attr(qpn, &mut attr, mask as i32) {
            Ok(()) => {}
            // A device without packet pacing refuses the rate-limit
            // attribute (EINVAL / EOPNOTSUPP): say so with a typed error.
            Err(Error::InvalidAttribute | Error::ProviderError | Error::Unsupported)
                if m.rate_limit_kbps != 0 =>
            {
                return Err(Error::Unsupported)
            }
            Err(e) => return Err(e),
        }
        self.note_state(qpn, m.state);
        Ok(())
    }

    fn cq_demand(&self, init: &QpInit) -> (u32, u32) {
        let (s, r) = (init.max_send_wr, init.max_recv_wr.max(1));
        match self.direct {
            // The kernel's ring sizes (reference §B.2: slots are
            // roundup_pow2(n + 1), one stays empty; §C.1: roundup_pow2(n)).
            Some((uverbs::Kind::Rxe, _)) => {
                let ring = |n: u32| n.saturating_add(1).next_power_of_two() - 1;
                return (ring(s), ring(r));
            }
            Some((uverbs::Kind::Siw, _)) => {
                return (s.next_power_of_two(), r.next_power_of_two());
            }
            None => {}
        }
        if self.caps.direct_mlx5 {
            // libmlx5 sizes its queues the way the software device does
            // (largest WQE per WR, rounded to a power of two); the guard
            // checks the exact figure at creation.
            crate::soft::queue_sizes(init)
        } else {
            (init.max_send_wr, init.max_recv_wr.max(1))
        }
    }

    fn cq_event_fd(&self, cqn: u32) -> Result<i32> {
        self.cq_channel_fd(cqn)
    }

    fn async_event_fd(&self) -> Result<i32> {
        // SAFETY: live context.
        Ok(unsafe { (*self.ctx.ctx).async_fd })
    }

    fn poll_async_event(&self) -> Result<Option<crate::api::AsyncEvent>> {
        use crate::api::AsyncEvent as E;
        if let Some((_, reader)) = &self.direct {
            return self.poll_direct_async_event(reader);
        }
        let mut ev = core::mem::MaybeUninit::<sys::ibv_async_event>::zeroed();
        // SAFETY: live context whose async fd is non-blocking (`open`);
        // `ev` is writable.
        if unsafe { sys::ibv_get_async_event(self.ctx.ctx, ev.as_mut_ptr()) } != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(fail("ibv_get_async_event", errno));
        }
        let p = ev.as_ptr();
        // The kernel's event number is read as the integer it is: a value
        // newer than rdma-sys's enum must not become an invalid enum.
        // SAFETY: `event_type` is a 4-byte C enum, written by the call.
        let kind = unsafe { core::ptr::addr_of!((*p).event_type).cast::<u32>().read() };
        // SAFETY: the element union's pointer members were written for the
        // kinds that use them; the objects stay alive until the ack below
        // (libibverbs' destroy calls wait for it).
        let (qp, cq, port) = unsafe {
            let el = core::ptr::addr_of!((*p).element);
            ((*el).qp, (*el).cq, (*el).port_num)
        };
        let qpn = || {
            // SAFETY: a live QP (see above).
            unsafe { (*qp).qp_num }
        };
        let event = match kind {
            0 => {
                let t = self.lock();
                let cqn = t.cqs.iter().find(|(_, e)| e.cq.0 == cq).map(|(n, _)| *n);
                match cqn {
                    Some(cqn) => E::CqError { cqn },
                    None => E::Other { kind, element: 0 },
                }
            }
            1 => E::QpFatal { qpn: qpn() },
            2 => E::QpRequestError { qpn: qpn() },
            3 => E::QpAccessError { qpn: qpn() },
            4 => E::CommEstablished { qpn: qpn() },
            5 => E::SqDrained { qpn: qpn() },
            16 => E::LastWqeReached { qpn: qpn() },
            8 => E::DeviceFatal,
            9 => E::PortActive { port: port as u8 },
            10 => E::PortError { port: port as u8 },
            11..=13 | 17 | 18 => E::Other {
                kind,
                element: port as u32,
            },
            _ => E::Other { kind, element: 0 },
        };
        // SAFETY: the event taken above, acknowledged once.
        unsafe { sys::ibv_ack_async_event(ev.as_mut_ptr()) };
        Ok(Some(event))
    }

    fn cq_event_consume(&self, cqn: u32) -> Result<u32> {
        let (ch, cq) = {
            let t = self.lock();
            let e = t.cqs.get(&cqn).ok_or(Error::NoSuchObject)?;
            if let Some((_, ch)) = &e.direct {
                let ch = Arc::clone(ch);
                drop(t);
                // One channel per CQ: every event is this CQ's.
                return ch.consume(|_| {});
            }
            (e.channel.0, e.cq.0)
        };
        let mut n = 0u32;
        loop {
            let mut got: *mut sys::ibv_cq = core::ptr::null_mut();
            let mut ctx: *mut core::ffi::c_void = core::ptr::null_mut();
            // SAFETY: live channel (non-blocking fd); valid out-pointers.
            let r = unsafe { sys::ibv_get_cq_event(ch, &mut got, &mut ctx) };
            if r != 0 {
                break; // EAGAIN: none left
            }
            if got == cq {
                n += 1;
            }
        }
        if n > 0 {
            // SAFETY: acknowledges exactly the events taken above.
            unsafe { sys::ibv_ack_cq_events(cq, n) };
        }
        Ok(n)
    }

    fn destroy_qp(&self, qpn: u32) -> Result<()> {
        let mut t = self.lock();
        let e = t.qps.get(&qpn).ok_or(Error::NoSuchObject)?;
        if e.direct.is_none() {
            // SAFETY: a live QP; the data-path handle that posted to it is
            // being dropped (the API destroys the QP from the handle's
            // Drop).
            check("ibv_destroy_qp", unsafe { sys::ibv_destroy_qp(e.qp.0) })?;
        }
        // A direct QP is destroyed (and unmapped) when its last holder, the
        // data-path handle dropping next, lets go.
        // The thread domain (if any) is freed with the entry, after the QP.
        let Some(e) = t.qps.remove(&qpn) else {
            return Ok(());
        };
        let (cqs, pd) = (e.cqs, e.pd);
        t.qp_handles.retain(|_, q| *q != qpn);
        for cqn in cqs {
            if let Some(c) = t.cqs.get_mut(&cqn) {
                c.qps -= 1;
                if let Some(track) = &e.track {
                    c.registry.remove(track);
                }
            }
        }
        drop(e);
        if let Some(p) = t.pds.get_mut(&pd) {
            p.1 -= 1;
        }
        Ok(())
    }
}

/// A random 24-bit initial PSN (peers must not be able to predict it, and
/// reconnects must not reuse one).
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: `b` is writable for 4 bytes.
    let r = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if r != 4 {
        // Fall back to the clock: still varies between runs.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0x5eed);
        return t & 0xff_ffff;
    }
    u32::from_ne_bytes(b) & 0xff_ffff
}

/// `ibv_modify_qp` attributes and mask for a transition.
pub(crate) fn qp_attr(m: &QpModify, caps: &DeviceCaps) -> (sys::ibv_qp_attr, u32) {
    use sys::ibv_qp_attr_mask as M;
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut a: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
    let mut mask = M::IBV_QP_STATE.0;
    a.qp_state = qp_state(m.state);
    match m.state {
        QpState::Init => {
            a.pkey_index = 0;
            a.port_num = m.port_num.max(1);
            a.qp_access_flags = access_bits(m.access);
            mask |= M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_ACCESS_FLAGS.0;
        }
        QpState::Rtr => {
            a.path_mtu = mtu_enum(m.path_mtu);
            a.dest_qp_num = m.dest_qpn;
            a.rq_psn = m.rq_psn & 0xff_ffff;
            a.max_dest_rd_atomic = clamp_rd(m.max_dest_rd_atomic, caps.max_qp_rd_atom);
            a.min_rnr_timer = m.min_rnr_timer;
            a.ah_attr.dlid = m.av.dlid;
            a.ah_attr.sl = m.av.sl;
            a.ah_attr.src_path_bits = 0;
            a.ah_attr.port_num = m.port_num.max(1);
            if m.av.is_global {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid = sys::ibv_gid { raw: m.av.dgid };
                a.ah_attr.grh.sgid_index = m.av.sgid_index;
                a.ah_attr.grh.hop_limit = m.av.hop_limit.max(1);
                a.ah_attr.grh.traffic_class = m.av.traffic_class;
                a.ah_attr.grh.flow_label = m.av.flow_label;
            }
            mask |= M::IBV_QP_AV.0
                | M::IBV_QP_PATH_MTU.0
                | M::IBV_QP_DEST_QPN.0
                | M::IBV_QP_RQ_PSN.0
                | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
                | M::IBV_QP_MIN_RNR_TIMER.0;
        }
        QpState::Rts => {
            a.sq_psn = m.sq_psn & 0xff_ffff;
            a.timeout = m.timeout;
            a.retry_cnt = m.retry_cnt.min(7);
            a.rnr_retry = m.rnr_retry.min(7);
            a.max_rd_atomic = clamp_rd(m.max_rd_atomic, caps.max_qp_init_rd_atom);
            if m.rate_limit_kbps != 0 {
                a.rate_limit = m.rate_limit_kbps;
                mask |= M::IBV_QP_RATE_LIMIT.0;
            }
            mask |= M::IBV_QP_SQ_PSN.0
                | M::IBV_QP_TIMEOUT.0
                | M::IBV_QP_RETRY_CNT.0
                | M::IBV_QP_RNR_RETRY.0
                | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        }
        _ => {}
    }
    (a, mask)
}

fn clamp_rd(want: u8, cap: u32) -> u8 {
    if cap == 0 {
        want
    } else {
        want.min(cap.min(255) as u8)
    }
}

fn qp_state(s: QpState) -> u32 {
    use sys::ibv_qp_state as S;
    match s {
        QpState::Reset => S::IBV_QPS_RESET,
        QpState::Init => S::IBV_QPS_INIT,
        QpState::Rtr => S::IBV_QPS_RTR,
        QpState::Rts => S::IBV_QPS_RTS,
        QpState::Error => S::IBV_QPS_ERR,
    }
}
