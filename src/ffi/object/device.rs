//! Device calls: open (software or kernel device), close, the data path
//! a device's queues use, and driving the software device (step, start,
//! stop).

use std::boxed::Box;
use std::sync::Arc;
use std::time::Duration;

use crate::ffi::status::rdd_status;
use crate::soft::{SoftConfig, SoftDevice};

use super::objects::DeviceObj;
use super::table::{excl, insert, shared};
use super::types::{rdd_device, rdd_soft_config};
use super::{as_handle, h, put};

// ---------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------

/// `rdd_device_data_path`: the in-process software HCA (also the fabric
/// device), whose queues are in the mlx5 layout and go through the mlx5
/// data path.
pub const RDD_DATA_PATH_SOFTWARE: u32 = 1;
/// `rdd_device_data_path`: a kernel device whose QPs and CQs run on
/// rdma-direct's own WQEs, doorbells and completion polling (the mlx5 core
/// on ConnectX; rdma-direct's rings on rxe and siw).
pub const RDD_DATA_PATH_DIRECT: u32 = 2;
/// `rdd_device_data_path`: a kernel device served by libibverbs' own
/// provider (`ibv_post_send`, `ibv_poll_cq`): a device with no direct
/// path, or `RDMA_DIRECT_DATA_PATH=fallback` when it was opened.
pub const RDD_DATA_PATH_FALLBACK: u32 = 3;

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
    // SAFETY: forwarded contract.
    unsafe { open_soft(cfg, out, false) }
}

/// Opens a new software device that joins the cross-process fabric
/// (docs/spec/fabric.md): its port GID names this process and this
/// device, and its RC QPs connect (`rdd_qp_connect` with the peer's
/// `rdd_qp_info`) to QPs of fabric devices in other processes on this
/// host as well as to its own. Start its device thread with
/// `rdd_device_start`: a peer's requests are served by this device's
/// passes. Otherwise as `rdd_device_open_soft`.
///
/// # Safety
/// As `rdd_device_open_soft`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_open_fabric(
    cfg: *const rdd_soft_config,
    out: *mut *mut rdd_device,
) -> rdd_status {
    // SAFETY: forwarded contract.
    unsafe { open_soft(cfg, out, true) }
}

/// The body of both software opens.
///
/// # Safety
/// As `rdd_device_open_soft`.
unsafe fn open_soft(
    cfg: *const rdd_soft_config,
    out: *mut *mut rdd_device,
    fabric: bool,
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
        if fabric {
            sc.gid = SoftConfig::fabric().gid;
        }
        let soft = SoftDevice::new(sc);
        let obj = Box::new(DeviceObj {
            backend: Arc::new(soft.clone()),
            soft: Some(soft),
            path: RDD_DATA_PATH_SOFTWARE,
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
/// libibverbs otherwise (`RDMA_DIRECT_DATA_PATH=fallback` or `direct`
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
            let path = match dev.data_path() {
                crate::verbs::DataPath::Direct => RDD_DATA_PATH_DIRECT,
                _ => RDD_DATA_PATH_FALLBACK,
            };
            let obj = Box::new(DeviceObj {
                backend: Arc::new(dev),
                soft: None,
                path,
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

/// Which data path the QPs and CQs of `dev` use, fixed when it was
/// opened: `*out` is `RDD_DATA_PATH_SOFTWARE` (`rdd_device_open_soft`,
/// `rdd_device_open_fabric`), `RDD_DATA_PATH_DIRECT` (a kernel device on
/// rdma-direct's own rings or the mlx5 core) or `RDD_DATA_PATH_FALLBACK`
/// (a kernel device on libibverbs' `ibv_post_send` / `ibv_poll_cq`). The
/// calls behave the same on all three; what differs is the cost, and that
/// on the fallback `RDD_SEND_DEFER_DOORBELL` is a hint (each call rings).
///
/// Errors: `NULL_PARAMETER` (`dev` or `out` NULL), `INVALID_HANDLE`
/// (`dev` is not a live device); `*out` is then unwritten.
///
/// # Safety
/// `out` is valid for a write of one `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn rdd_device_data_path(dev: *mut rdd_device, out: *mut u32) -> rdd_status {
    ffi_boundary!({
        non_null!(out);
        let d = try_status!(shared::<DeviceObj>(h(dev)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, d.path) };
        rdd_status::Ok
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
