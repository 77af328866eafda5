//! The command line: the in-process options and the two-process
//! (`ibv_rc_pingpong` / `ibv_ud_pingpong`) ones.

use std::time::Duration;

use crate::common::{DevOpts, DEV_USAGE};

pub(crate) struct Args {
    pub(crate) size: usize,
    pub(crate) iters: usize,
    pub(crate) warmup: usize,
    pub(crate) dev: DevOpts,
    /// `--ud`: unreliable datagrams instead of RC (`ibv_ud_pingpong` in
    /// the two-process mode).
    pub(crate) ud: bool,
    /// Two-process mode, `ibv_rc_pingpong` (or with `--ud`
    /// `ibv_ud_pingpong`) compatible.
    pub(crate) rc: Option<RcArgs>,
}

/// The two-process (`ibv_rc_pingpong` / `ibv_ud_pingpong`) options.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub(crate) struct RcArgs {
    /// `None`: server; `Some(host)`: client of `host`.
    pub(crate) connect: Option<String>,
    pub(crate) port: u16,
    pub(crate) rx_depth: u32,
    pub(crate) mtu: u32,
    pub(crate) chk: bool,
    pub(crate) timeout: Duration,
}

fn usage() -> String {
    format!(
        "usage: pingpong [--ud] [--size BYTES] [--iters N] [--warmup N] {DEV_USAGE}\n       \
         pingpong [--device NAME] [--gid-idx N] (--server | --connect HOST) [--port 18515]\n       \
         \x20        [--size 4096] [--iters 1000] [--rx-depth 500] [--mtu 1024] [--chk]\n       \
         \x20        [--timeout SECS]   (ibv_rc_pingpong compatible; --features verbs)\n       \
         pingpong --ud [--device NAME] [--gid-idx N] (--server | --connect HOST) [--port 18515]\n       \
         \x20        [--size 2048] [--iters 1000] [--rx-depth 500] [--timeout SECS]\n       \
         \x20        (ibv_ud_pingpong compatible; --features verbs)"
    )
}

pub(crate) fn parse_args() -> Result<Args, String> {
    let mut dev = DevOpts::default();
    let (mut size, mut iters, mut warmup) = (None, None, 1_000);
    let (mut server, mut connect, mut port, mut rx_depth, mut mtu, mut chk, mut timeout) =
        (false, None, 18515u16, 500u32, 1024u32, false, 60u64);
    let (mut rc_flag, mut warmup_given, mut ud) = (None, false, false);
    let mut rc_only = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if dev.take(&flag, &mut it)? {
            continue;
        }
        let mut text = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {v}"))
        };
        match flag.as_str() {
            "--size" | "-s" => size = Some(num("--size", text("--size")?)? as usize),
            "--iters" | "-n" => iters = Some(num("--iters", text("--iters")?)? as usize),
            "--warmup" => {
                warmup = num("--warmup", text("--warmup")?)? as usize;
                warmup_given = true;
            }
            "--ud" => ud = true,
            "--server" => server = true,
            "--connect" => connect = Some(text("--connect")?),
            "--port" | "-p" => {
                port = u16::try_from(num("--port", text("--port")?)?)
                    .map_err(|_| "--port must be at most 65535".to_string())?;
                rc_flag = Some("--port");
            }
            "--rx-depth" | "-r" => {
                rx_depth = u32::try_from(num("--rx-depth", text("--rx-depth")?)?)
                    .map_err(|_| "--rx-depth is too large".to_string())?;
                rc_flag = Some("--rx-depth");
            }
            "--mtu" | "-m" => {
                mtu = u32::try_from(num("--mtu", text("--mtu")?)?).unwrap_or(0);
                rc_flag = Some("--mtu");
                rc_only = Some("--mtu");
            }
            "--chk" | "-c" => {
                chk = true;
                rc_flag = Some("--chk");
                rc_only = Some("--chk");
            }
            "--timeout" => {
                timeout = num("--timeout", text("--timeout")?)?;
                rc_flag = Some("--timeout");
            }
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    let two_process = server || connect.is_some();
    if server && connect.is_some() {
        return Err("--server and --connect exclude each other".into());
    }
    if let (false, Some(f)) = (two_process, rc_flag) {
        return Err(format!(
            "{f} belongs to the two-process mode: add --server or --connect HOST\n{}",
            usage()
        ));
    }
    if let (true, Some(f)) = (ud, rc_only) {
        return Err(format!(
            "{f} is an RC option (ibv_rc_pingpong's); a datagram is one packet of the \
             port's MTU, and ibv_ud_pingpong has no {f}"
        ));
    }
    if two_process && warmup_given {
        return Err("--warmup belongs to the in-process mode (ibv_rc_pingpong has none)".into());
    }
    if two_process && cfg!(not(feature = "verbs")) {
        return Err(
            "--server/--connect run on a kernel RDMA device, which needs the verbs backend: \
             build with --features verbs"
                .into(),
        );
    }
    let rc = two_process.then(|| RcArgs {
        connect,
        port,
        rx_depth,
        mtu,
        chk,
        timeout: Duration::from_secs(timeout.max(1)),
    });
    let (dsize, diters) = match (rc.is_some(), ud) {
        (true, false) => (4096, 1000),
        (true, true) => (2048, 1000),
        (false, _) => (64, 10_000),
    };
    let a = Args {
        size: size.unwrap_or(dsize),
        iters: iters.unwrap_or(diters),
        warmup,
        dev,
        ud,
        rc,
    };
    if a.size == 0 || a.size > 1 << 24 {
        return Err("--size must be between 1 and 2^24 (16 MiB)".into());
    }
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if let Some(rc) = &a.rc {
        if rc.rx_depth < 2 || rc.rx_depth > 1 << 16 {
            return Err("--rx-depth must be between 2 and 65536".into());
        }
        if ![256, 512, 1024, 2048, 4096].contains(&rc.mtu) {
            return Err("--mtu must be 256, 512, 1024, 2048 or 4096".into());
        }
    }
    Ok(a)
}
