//! The out-of-band TCP exchange of rdma-core's `ibv_*_pingpong` tools, as
//! the two-process example modes use it: the listening and connecting
//! sides (with a short retry while the server starts), and the address
//! lines those tools print.

use std::net::{Ipv6Addr, TcpListener};
use std::time::Duration;

use rdma_direct::api::QpInfo;
use rdma_direct::verbs::oob::{OobConn, REFUSED_RETRY};
use rdma_direct::verbs::{self, VerbsDevice};

use super::ExampleBackend;

/// `  local address:  LID 0x0000, QPN 0x000011, PSN 0x123456, GID ::ffff:192.0.2.1`
pub fn address_line(which: &str, i: &QpInfo) -> String {
    format!(
        "  {which} LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
        i.lid,
        i.qpn,
        i.psn,
        Ipv6Addr::from(i.gid)
    )
}

/// `host:port`, bracketing an IPv6 literal.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The server side: listens on TCP `port` (IPv4, else IPv6) and accepts
/// one client within `timeout`.
pub fn accept(port: u16, timeout: Duration) -> Result<OobConn, String> {
    let l = TcpListener::bind(("0.0.0.0", port))
        .or_else(|_| TcpListener::bind(("::", port)))
        .map_err(|x| format!("listen on TCP port {port}: {x}"))?;
    OobConn::accept(&l, timeout).map_err(|x| format!("no client connected to TCP port {port}: {x}"))
}

/// The client side: connects to `host`:`port`. A refusal is retried
/// briefly (the server may be starting) and said at once on stderr, with
/// `tool` as the prefix; at the end of the window it is the error.
pub fn connect(host: &str, port: u16, timeout: Duration, tool: &str) -> Result<OobConn, String> {
    let mut refused = None;
    OobConn::connect_with(
        &host_port(host, port),
        timeout,
        REFUSED_RETRY,
        |a, window| {
            eprintln!(
                "{tool}: connection refused by {a} (retrying for up to {}s)",
                window.as_secs_f32()
            );
            refused = Some((a, window));
        },
    )
    .map_err(|x| match (x, refused, verbs::last_error()) {
        (rdma_direct::Error::ConnectFailed, Some((a, w)), (_, libc::ECONNREFUSED)) => {
            format!(
                "connect to {host} port {port}: connection refused by {a} for {}s: nobody \
                 listens there (start the server first, or check --port)",
                w.as_secs_f32()
            )
        }
        (x, _, _) => format!(
            "connect to {host} port {port}: {x}{}",
            <VerbsDevice as ExampleBackend>::detail()
        ),
    })
}
