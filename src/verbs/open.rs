//! Finding and opening a device: the device list, the context (librdmacm's
//! when it has one), and the port and GID queries [`VerbsDevice::open`]
//! makes.

use std::ffi::CStr;
use std::string::String;
use std::sync::{Arc, Mutex};
use std::vec::Vec;

use rdma_sys as sys;

use super::device::{query_gid, Ctx, Tables};
use super::{check, fail_errno, mlx5, uverbs, DataPath, DeviceCaps, VerbsConfig, VerbsDevice};
use crate::api::{PortInfo, Transport};
use crate::error::{Error, Result};

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

impl VerbsDevice {
    /// Opens a device. [`Error::NoDevice`] if there is none (or none with
    /// the requested name).
    pub fn open(cfg: &VerbsConfig) -> Result<VerbsDevice> {
        let path = cfg.data_path.resolve()?;
        // The rxe/siw direct path creates its own CQs and QPs with raw
        // uverbs commands; it takes a context of its own, so that no
        // libibverbs object shares its async events (docs/spec/kernels.md).
        let (ctx, owned) = if path == DataPath::Fallback {
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
            (DataPath::Fallback, _) => None,
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
            max_srq_wr: if da.max_srq > 0 {
                da.max_srq_wr.max(0) as u32
            } else {
                0
            },
            max_srq_sge: da.max_srq_sge.max(0) as u32,
            atomics: da.atomic_cap != sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
            direct_mlx5: path != DataPath::Fallback && mlx5::usable(ctx.ctx),
            memory_windows: da.device_cap_flags
                & (sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                    | sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
                != 0,
            retry7_unbounded: matches!(kind, Some(uverbs::Kind::Rxe)),
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
