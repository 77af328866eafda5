//! Shared by the examples: the device flags (`--device`, `--gid-idx`,
//! `--addr`), opening the device, and connecting two QPs that live on the
//! same device.
//!
//! Without `--device` every example runs on the in-process software HCA.
//! With `--device NAME` (builds with `--features verbs`) it runs on that
//! kernel RDMA device instead, still in one process: both QPs are on the
//! same device, connected directly ([`Qp::connect`]) on InfiniBand/RoCE,
//! or through rdma_cm on iWARP (which has no other way to connect).

// Each example uses a different part of this module.
#![allow(dead_code)]

use std::any::Any;
use std::net::IpAddr;

use rdma_direct::api::{Backend, ConnectAttr, Device, Qp, WcStatus};
use rdma_direct::soft::SoftDevice;

/// Exit status of every example when it did not run (README,
/// "Examples"): a bad command line, or a request this build or the chosen
/// device cannot serve (checked before anything runs). 0 is success and 1
/// a run that failed.
pub const EXIT_USAGE: u8 = 2;

/// The device flags shared by the examples.
#[derive(Default)]
pub struct DevOpts {
    /// `--device NAME`: a kernel RDMA device (verbs backend).
    pub device: Option<String>,
    /// `--gid-idx N`: the GID index QPs send from (RoCE).
    pub gid_idx: Option<u8>,
    /// `--addr IP`: the device's IP address, for rdma_cm on iWARP (found
    /// from the device when not given).
    pub addr: Option<IpAddr>,
}

/// Usage text of the device flags.
pub const DEV_USAGE: &str = "[--device NAME [--gid-idx N] [--addr IP]]";

impl DevOpts {
    /// Consumes `flag` (and its value from `it`) if it is a device flag.
    pub fn take(
        &mut self,
        flag: &str,
        it: &mut impl Iterator<Item = String>,
    ) -> Result<bool, String> {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag {
            "--device" | "-d" => self.device = Some(value("--device")?),
            "--gid-idx" | "-g" => {
                let v = value("--gid-idx")?;
                self.gid_idx = Some(
                    v.parse::<u8>()
                        .map_err(|_| format!("--gid-idx: not a GID index (0..=255): {v}"))?,
                );
            }
            "--addr" => {
                let v = value("--addr")?;
                self.addr = Some(
                    v.parse::<IpAddr>()
                        .map_err(|_| format!("--addr: not an IP address: {v}"))?,
                );
            }
            _ => return Ok(false),
        }
        if cfg!(not(feature = "verbs")) {
            return Err(format!(
                "{flag} selects a kernel RDMA device, which needs the verbs backend: build \
                 with --features verbs (cargo run --release --features verbs --example ... \
                 -- {flag} ...)"
            ));
        }
        Ok(true)
    }
}

/// Keeps whatever a connection needs alive (rdma_cm ids on iWARP).
pub struct Link {
    _keep: Vec<Box<dyn Any + Send>>,
}

/// What an example needs from its device beyond [`Backend`].
pub trait ExampleBackend: Backend + Sized {
    /// One line for the report header.
    fn label(dev: &Device<Self>) -> String;
    /// What the device physically is, so a reader knows what the figures
    /// can and cannot say (memory copies in one process, a software RDMA
    /// driver in the kernel, or a NIC).
    fn medium(dev: &Device<Self>) -> String;
    /// Threads the device itself busy-polls with, in this process.
    fn device_threads(_dev: &Device<Self>) -> usize {
        0
    }
    /// Starts the device's own thread, if it has one.
    fn start(_dev: &Device<Self>) {}
    /// Stops it.
    fn stop(_dev: &Device<Self>) {}
    /// Why RDMA atomics cannot run here, if they cannot.
    fn no_atomics(_dev: &Device<Self>) -> Option<String> {
        None
    }
    /// The provider call behind the last error on this thread, if any, as
    /// text to append to a message.
    fn detail() -> String {
        String::new()
    }
    /// Connects `a` and `b` (both in RESET, on `dev`) to each other; `aa`
    /// and `ab` are their connection attributes (remote access granted to
    /// the peer, ...).
    fn connect_pair(
        dev: &Device<Self>,
        a: &mut Qp<Self>,
        b: &mut Qp<Self>,
        aa: &ConnectAttr,
        ab: &ConnectAttr,
        opts: &DevOpts,
    ) -> Result<Link, String>;
}

/// `"what: error"`, with the provider call and errno when there is one.
pub fn err<B: ExampleBackend>(what: &str) -> impl Fn(rdma_direct::Error) -> String + '_ {
    move |e| format!("{what}: {e}{}", B::detail())
}

impl ExampleBackend for SoftDevice {
    fn label(_dev: &Device<Self>) -> String {
        "soft (in-process software HCA, device thread)".into()
    }
    fn medium(_dev: &Device<Self>) -> String {
        "a software device inside this process: memory copies and thread hand-offs, \
         no network and no NIC"
            .into()
    }
    fn device_threads(_dev: &Device<Self>) -> usize {
        1
    }
    fn start(dev: &Device<Self>) {
        dev.backend().start();
    }
    fn stop(dev: &Device<Self>) {
        dev.backend().stop();
    }
    fn connect_pair(
        _dev: &Device<Self>,
        a: &mut Qp<Self>,
        b: &mut Qp<Self>,
        aa: &ConnectAttr,
        ab: &ConnectAttr,
        _opts: &DevOpts,
    ) -> Result<Link, String> {
        let (ia, ib) = (a.info(), b.info());
        a.connect(&ib, aa).map_err(err::<Self>("connect"))?;
        b.connect(&ia, ab).map_err(err::<Self>("connect"))?;
        Ok(Link { _keep: Vec::new() })
    }
}

/// Cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether the CPU says it runs under a hypervisor (the `hypervisor` flag
/// of `/proc/cpuinfo`), so wall-clock figures come from a virtual machine.
pub fn in_vm() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
        c.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "hypervisor"))
    })
}

/// Prints what a benchmark example measured and on what: the quantity,
/// the device and what it physically is, the machine's cores, and a
/// warning when more threads busy-poll than there are cores (then the
/// figures include the scheduler's hand-offs and swing between runs).
/// `pollers` names this program's own busy-polling threads; the device's
/// are added. Each line starts with `label_width` columns of label.
pub fn print_context<B: ExampleBackend>(
    dev: &Device<B>,
    measured: &str,
    pollers: &[&str],
    label_width: usize,
) {
    let w = label_width;
    println!(" {:<w$}: {measured}", "Measured");
    println!(" {:<w$}: {}", "Device", B::label(dev));
    println!(" {:<w$}: {}", "What it is", B::medium(dev));
    let cores = cores();
    let machine = if in_vm() {
        "virtual machine"
    } else {
        "no hypervisor flag"
    };
    println!(" {:<w$}: {cores} cores available ({machine})", "Machine");
    let mut names: Vec<&str> = pollers.to_vec();
    names.extend(std::iter::repeat_n("device thread", B::device_threads(dev)));
    if names.len() > cores {
        println!(
            " {:<w$}: {} busy-polling threads ({}) on {cores} cores: they take turns, so the \
             figures include scheduler hand-offs and vary widely between runs",
            "WARNING",
            names.len(),
            names.join(", ")
        );
    }
}

/// A completion status as text (the names of `ibv_wc_status_str`).
pub fn status_name(s: WcStatus) -> &'static str {
    const NAMES: [&str; 22] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    ];
    NAMES.get(s.0 as usize).copied().unwrap_or("unknown")
}

#[cfg(feature = "verbs")]
pub use verbs_impl::*;

/// The `ibv_*_pingpong` TCP exchange (two-process modes).
#[cfg(feature = "verbs")]
pub mod oob;

#[cfg(feature = "verbs")]
mod verbs_impl {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::thread;
    use std::time::Duration;

    use rdma_direct::api::{QpModify, QpState, Transport};
    use rdma_direct::verbs::cm::{self, CmListener, CmOptions};
    use rdma_direct::verbs::{self, VerbsConfig, VerbsDevice};

    /// Opens `--device` if one was given.
    pub fn open_verbs(o: &DevOpts) -> Result<Option<Device<VerbsDevice>>, String> {
        let Some(name) = &o.device else {
            return Ok(None);
        };
        open_device(Some(name), o.gid_idx).map(Some)
    }

    /// Opens a device by name (`None`: the first one), on port 1.
    pub fn open_device(name: Option<&str>, gid: Option<u8>) -> Result<Device<VerbsDevice>, String> {
        let cfg = VerbsConfig {
            device: name.map(String::from),
            port: 1,
            gid_index: gid,
            // Auto: the direct path where the device has one (mlx5, rxe,
            // siw); RDMA_DIRECT_DATA_PATH=fallback|direct overrides it.
            ..VerbsConfig::default()
        };
        let shown = name.unwrap_or("(first device)");
        let opened = VerbsDevice::open(&cfg).map(Device::new);
        if let Ok(d) = &opened {
            eprintln!(
                "{}: {:?} data path",
                d.backend().name(),
                d.backend().data_path()
            );
        }
        opened.map_err(|e| {
            let names: Vec<String> = verbs::list_devices()
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.name)
                .collect();
            let have = if names.is_empty() {
                "this host has no RDMA device".to_string()
            } else {
                format!("devices here: {}", names.join(", "))
            };
            format!(
                "cannot open RDMA device {shown}{}: {e}{} ({have})",
                gid.map_or(String::new(), |g| format!(" with GID index {g}")),
                VerbsDevice::detail()
            )
        })
    }

    /// The IPv4 address of `dev`'s network device: the IPv4-mapped GID on
    /// RoCE; on iWARP (siw's GID starts with the netdev's MAC address) the
    /// address of the netdev with that MAC.
    pub fn device_ipv4(dev: &VerbsDevice) -> Option<Ipv4Addr> {
        let p = dev.port();
        let g = p.gid;
        if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
            return Some(Ipv4Addr::new(g[12], g[13], g[14], g[15]));
        }
        let ndev = netdev_by_sysfs(dev.name(), p.port_num, p.gid_index)
            .or_else(|| netdev_by_mac(&g[..6]))?;
        netdev_ipv4(&ndev)
    }

    fn netdev_by_sysfs(dev: &str, port: u8, gid: u8) -> Option<String> {
        let p = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/ndevs/{gid}");
        let n = std::fs::read_to_string(p).ok()?;
        let n = n.trim();
        (!n.is_empty()).then(|| n.to_string())
    }

    fn netdev_by_mac(mac: &[u8]) -> Option<String> {
        if mac.iter().all(|&b| b == 0) {
            return None;
        }
        let want: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
        let want = want.join(":");
        for e in std::fs::read_dir("/sys/class/net").ok()?.flatten() {
            let addr = std::fs::read_to_string(e.path().join("address")).unwrap_or_default();
            if addr.trim().eq_ignore_ascii_case(&want) {
                return Some(e.file_name().to_string_lossy().into_owned());
            }
        }
        None
    }

    /// The first IPv4 address of network device `name`.
    fn netdev_ipv4(name: &str) -> Option<Ipv4Addr> {
        let mut list: *mut libc::ifaddrs = core::ptr::null_mut();
        // SAFETY: `list` is a valid out-pointer; freed below.
        if unsafe { libc::getifaddrs(&mut list) } != 0 {
            return None;
        }
        let mut found = None;
        let mut cur = list;
        while !cur.is_null() {
            // SAFETY: a node of the list getifaddrs returned, alive until
            // freeifaddrs; its name is NUL-terminated and its address, when
            // not NULL, is a sockaddr of the family it names.
            let (n, addr, next) = unsafe { ((*cur).ifa_name, (*cur).ifa_addr, (*cur).ifa_next) };
            // SAFETY: as above.
            let this = unsafe { std::ffi::CStr::from_ptr(n) }.to_bytes() == name.as_bytes();
            // SAFETY: as above.
            if this && !addr.is_null() && i32::from(unsafe { (*addr).sa_family }) == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(addr as *const libc::sockaddr_in) };
                found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
                break;
            }
            cur = next;
        }
        // SAFETY: the list from getifaddrs, freed once.
        unsafe { libc::freeifaddrs(list) };
        found
    }

    /// The device's IP for rdma_cm: `--addr`, else found from the device.
    pub fn cm_addr(dev: &VerbsDevice, opts: &DevOpts) -> Result<IpAddr, String> {
        if let Some(a) = opts.addr {
            return Ok(a);
        }
        device_ipv4(dev).map(IpAddr::V4).ok_or_else(|| {
            format!(
                "cannot find the IPv4 address of {}'s network device (needed for rdma_cm); \
                 pass --addr IP",
                dev.name()
            )
        })
    }

    impl ExampleBackend for VerbsDevice {
        fn label(dev: &Device<Self>) -> String {
            let b = dev.backend();
            let p = b.port();
            let how = match p.transport {
                Transport::Roce => format!("RoCE, GID index {}", p.gid_index),
                Transport::InfiniBand => format!("InfiniBand, LID {:#x}", p.lid),
                Transport::Iwarp => "iWARP, QPs connected with rdma_cm".into(),
                Transport::Soft => "soft".into(),
            };
            let path = if b.caps().direct_mlx5 {
                "rdma-direct's mlx5 data path"
            } else if b.data_path() == verbs::DataPath::Direct {
                "rdma-direct's own rings"
            } else {
                "libibverbs' provider (the verbs fallback)"
            };
            format!("{} ({how}; kernel verbs, {path})", b.name())
        }
        fn medium(dev: &Device<Self>) -> String {
            let name = dev.backend().name();
            let what = if name.starts_with("rxe") {
                "the kernel's rxe driver (Soft-RoCE): RoCE v2 in software over an \
                 Ethernet interface, no RDMA NIC"
            } else if name.starts_with("siw") {
                "the kernel's siw driver (soft-iWARP): iWARP in software over the \
                 kernel's TCP, no RDMA NIC"
            } else if name.starts_with("mlx5") {
                "an mlx5 (ConnectX) NIC"
            } else {
                "a kernel RDMA device"
            };
            format!("{what}; both QPs in this process, on one device")
        }
        fn no_atomics(dev: &Device<Self>) -> Option<String> {
            let b = dev.backend();
            (!b.caps().atomics).then(|| {
                let why = if b.port().transport == Transport::Iwarp {
                    " (iWARP, e.g. siw, has no RDMA atomics)"
                } else {
                    ""
                };
                format!(
                    "{} reports no RDMA atomic support (atomic_cap NONE){why}",
                    b.name()
                )
            })
        }
        fn detail() -> String {
            match verbs::last_error() {
                ("", _) => String::new(),
                // An rdma_cm event: its name and status (a rejection's
                // status is the peer's reason, not an errno).
                (op, _) if op.starts_with("rdma_cm:") => match cm::last_failure() {
                    Some(f) => format!(" ({f})"),
                    None => format!(" ({op})"),
                },
                (op, 0) => format!(" ({op})"),
                (op, errno) => format!(" ({op}: {})", std::io::Error::from_raw_os_error(errno)),
            }
        }
        fn connect_pair(
            dev: &Device<Self>,
            a: &mut Qp<Self>,
            b: &mut Qp<Self>,
            aa: &ConnectAttr,
            ab: &ConnectAttr,
            opts: &DevOpts,
        ) -> Result<Link, String> {
            if dev.backend().port().transport != Transport::Iwarp {
                let (ia, ib) = (a.info(), b.info());
                a.connect(&ib, aa).map_err(err::<Self>("connect"))?;
                b.connect(&ia, ab).map_err(err::<Self>("connect"))?;
                return Ok(Link { _keep: Vec::new() });
            }
            // iWARP: rdma_cm on the device's own address, a listener thread
            // for `b` and a connect for `a`. The CM grants remote READ,
            // WRITE (and atomics, where they exist) on both QPs.
            let ip = cm_addr(dev.backend(), opts)?;
            let cm_opts = CmOptions::default();
            let (ca, cb) = cm::retry(5, Duration::from_millis(300), || {
                // A failed attempt may have left the QPs in INIT or ERROR.
                for q in [&mut *a, &mut *b] {
                    if q.state() != QpState::Reset {
                        q.modify(&QpModify::to(QpState::Reset))?;
                    }
                }
                let l = CmListener::bind(SocketAddr::new(ip, 0), 4)?;
                let dst = SocketAddr::new(ip, l.port());
                let (a, b) = (&mut *a, &mut *b);
                thread::scope(|s| {
                    let server = s.spawn(|| l.accept(b, &cm_opts, |_| Ok(())));
                    let client = cm::connect(a, dst, None, &cm_opts, |_| Ok(()));
                    let server = server
                        .join()
                        .map_err(|_| rdma_direct::Error::ProviderError)?;
                    Ok((client?, server?))
                })
            })
            .map_err(|e| format!("rdma_cm connection on {ip}: {e}{}", Self::detail()))?;
            Ok(Link {
                _keep: vec![Box::new(ca), Box::new(cb)],
            })
        }
    }
}
