//! Out-of-band connection setup over TCP: exchange QP numbers, PSNs,
//! LIDs and GIDs (and, for one-sided work, buffer addresses and rkeys),
//! with timeouts on every step.
//!
//! The QP message is byte-compatible with rdma-core's `ibv_rc_pingpong`:
//! the text `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, then the 16 GID bytes as
//! 32 lowercase hex digits), NUL-terminated, 52 bytes in one write. The
//! sequence is that tool's too:
//! * the client connects, sends its message, reads the server's, then
//!   sends `"done\0"` (5 bytes);
//! * the server reads the client's message, brings its QP to RTS (so it
//!   is ready before the client, which starts sending right after the
//!   exchange), sends its own, and waits for `"done"`.
//!
//! That message carries no MTU; both sides use their own port's active MTU
//! capped by [`crate::api::ConnectAttr::max_mtu`] (`ibv_rc_pingpong`
//! uses 1024 unless given `-m`).
//!
//! [`OobConn::send_region`] / [`OobConn::recv_region`] add a fixed
//! 32-byte message for a remote buffer (address, rkey, length), used by
//! this crate's own tools after the QP exchange.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::api::QpInfo;
use crate::error::{Error, Result};

/// `ibv_rc_pingpong`'s default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// Length of the QP message, NUL included.
pub const QP_MSG_LEN: usize = 52;
/// The client's final message.
const DONE: &[u8; 5] = b"done\0";
/// Length of a region message.
const REGION_LEN: usize = 32;
/// Magic of a region message.
const REGION_MAGIC: &[u8; 8] = b"rddreg01";

/// A remote buffer a peer may access.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionInfo {
    /// Virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u32,
}

/// Formats the `ibv_rc_pingpong` QP message.
pub fn encode_qp(info: &QpInfo) -> [u8; QP_MSG_LEN] {
    let mut s = std::format!(
        "{:04x}:{:06x}:{:06x}:",
        info.lid,
        info.qpn & 0xff_ffff,
        info.psn & 0xff_ffff
    );
    for b in info.gid {
        s.push_str(&std::format!("{b:02x}"));
    }
    let mut out = [0u8; QP_MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

/// Parses the `ibv_rc_pingpong` QP message (strictly: every field present,
/// hex only, in range). The MTU is not on the wire; the result carries 0.
pub fn decode_qp(msg: &[u8]) -> Result<QpInfo> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = core::str::from_utf8(&msg[..end]).map_err(|_| Error::ProtocolError)?;
    let mut it = text.split(':');
    let mut field = |max: u32| -> Result<u32> {
        let f = it.next().ok_or(Error::ProtocolError)?;
        if f.is_empty() || f.len() > 8 || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::ProtocolError);
        }
        let v = u32::from_str_radix(f, 16).map_err(|_| Error::ProtocolError)?;
        if v > max {
            return Err(Error::ProtocolError);
        }
        Ok(v)
    };
    let lid = field(0xffff)? as u16;
    let qpn = field(0xff_ffff)?;
    let psn = field(0xff_ffff)?;
    let g = it.next().ok_or(Error::ProtocolError)?;
    if it.next().is_some() || g.len() != 32 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::ProtocolError);
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| Error::ProtocolError)?;
    }
    Ok(QpInfo {
        qpn,
        psn,
        lid,
        gid,
        mtu: 0,
    })
}

/// One side of an out-of-band exchange.
pub struct OobConn {
    s: TcpStream,
    deadline: Instant,
}

fn io_error(e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Error::Timeout,
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionRefused
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::NotConnected
        | ErrorKind::AddrNotAvailable => Error::ConnectFailed,
        _ => Error::ProviderError,
    }
}

/// How long [`OobConn::connect`] keeps retrying a host that refuses the
/// connection: long enough for a server started at the same time to
/// begin listening, short enough that nobody waits a whole timeout for a
/// port nobody listens on.
pub const REFUSED_RETRY: Duration = Duration::from_secs(5);

impl OobConn {
    /// Connects to `addr` (host:port) within `timeout`; a refused
    /// connection is retried for [`REFUSED_RETRY`] at most (the server may
    /// not be listening yet). Every later step shares the same deadline.
    /// See [`OobConn::connect_with`].
    pub fn connect(addr: &str, timeout: Duration) -> Result<OobConn> {
        Self::connect_with(addr, timeout, REFUSED_RETRY, |_, _| {})
    }

    /// [`OobConn::connect`] with the refusal window `refused_for` (capped
    /// by `timeout`) and `on_refused(address, window)`, called once, at the
    /// first refusal, so the caller can say that it is retrying.
    ///
    /// Errors: [`Error::InvalidAttribute`] for an address that does not
    /// resolve; [`Error::ConnectFailed`] when every try failed, the last
    /// one with a refusal, reset or unreachable network (the call and
    /// errno are in [`super::last_error`], `("TCP connect",
    /// ECONNREFUSED)` for a refusal); [`Error::Timeout`] when nothing
    /// answered.
    pub fn connect_with(
        addr: &str,
        timeout: Duration,
        refused_for: Duration,
        mut on_refused: impl FnMut(SocketAddr, Duration),
    ) -> Result<OobConn> {
        let start = Instant::now();
        let deadline = start + timeout;
        let refused_until = start + refused_for.min(timeout);
        let addrs: std::vec::Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|_| Error::InvalidAttribute)?
            .collect();
        if addrs.is_empty() {
            return Err(Error::InvalidAttribute);
        }
        // No answer at all: Timeout; refused: ConnectFailed (nobody
        // listens), once the refusal window is over.
        let mut last = Error::Timeout;
        let mut told = false;
        loop {
            let mut refused = false;
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(last);
                }
                match TcpStream::connect_timeout(a, left) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(OobConn { s, deadline });
                    }
                    Err(e) => {
                        if e.kind() == ErrorKind::ConnectionRefused {
                            refused = true;
                            if !told {
                                told = true;
                                on_refused(*a, refused_for.min(timeout));
                            }
                        }
                        let errno = e.raw_os_error().unwrap_or(0);
                        last = io_error(e);
                        if last != Error::Timeout {
                            let _ = super::fail("TCP connect", errno);
                        }
                    }
                }
            }
            if refused && Instant::now() >= refused_until {
                return Err(last);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Accepts one connection on `listener` within `timeout`.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<OobConn> {
        let deadline = Instant::now() + timeout;
        listener.set_nonblocking(true).map_err(io_error)?;
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(io_error)?;
                    let _ = s.set_nodelay(true);
                    return Ok(OobConn { s, deadline });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io_error(e)),
            }
        }
    }

    fn arm(&self) -> Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        self.s.set_read_timeout(Some(left)).map_err(io_error)?;
        self.s.set_write_timeout(Some(left)).map_err(io_error)
    }

    /// Writes `b` in one call (the C tools read each message with one
    /// exact-length read).
    pub fn send(&mut self, b: &[u8]) -> Result<()> {
        self.arm()?;
        self.s.write_all(b).map_err(io_error)
    }

    /// Reads exactly `b.len()` bytes.
    pub fn recv(&mut self, b: &mut [u8]) -> Result<()> {
        self.arm()?;
        self.s.read_exact(b).map_err(io_error)
    }

    /// Sends a QP message.
    pub fn send_qp(&mut self, info: &QpInfo) -> Result<()> {
        self.send(&encode_qp(info))
    }

    /// Receives a QP message.
    pub fn recv_qp(&mut self) -> Result<QpInfo> {
        let mut b = [0u8; QP_MSG_LEN];
        self.recv(&mut b)?;
        decode_qp(&b)
    }

    /// Sends `"done\0"`.
    pub fn send_done(&mut self) -> Result<()> {
        self.send(DONE)
    }

    /// Waits for `"done\0"`.
    pub fn recv_done(&mut self) -> Result<()> {
        let mut b = [0u8; 5];
        self.recv(&mut b)?;
        if &b != DONE {
            return Err(Error::ProtocolError);
        }
        Ok(())
    }

    /// Sends a region message.
    pub fn send_region(&mut self, r: &RegionInfo) -> Result<()> {
        let mut b = [0u8; REGION_LEN];
        b[..8].copy_from_slice(REGION_MAGIC);
        b[8..16].copy_from_slice(&r.addr.to_be_bytes());
        b[16..20].copy_from_slice(&r.rkey.to_be_bytes());
        b[20..24].copy_from_slice(&r.len.to_be_bytes());
        self.send(&b)
    }

    /// Receives a region message.
    pub fn recv_region(&mut self) -> Result<RegionInfo> {
        let mut b = [0u8; REGION_LEN];
        self.recv(&mut b)?;
        if &b[..8] != REGION_MAGIC || b[24..].iter().any(|&x| x != 0) {
            return Err(Error::ProtocolError);
        }
        let word = |r: core::ops::Range<usize>| -> u64 {
            b[r].iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
        };
        Ok(RegionInfo {
            addr: word(8..16),
            rkey: word(16..20) as u32,
            len: word(20..24) as u32,
        })
    }

    /// The client's half of the `ibv_rc_pingpong` exchange: send ours,
    /// receive theirs, send "done".
    pub fn client_exchange(&mut self, local: &QpInfo) -> Result<QpInfo> {
        self.send_qp(local)?;
        let remote = self.recv_qp()?;
        self.send_done()?;
        Ok(remote)
    }

    /// The server's half: receive theirs, run `ready` (bring the QP to
    /// RTS), send ours, wait for "done".
    pub fn server_exchange(
        &mut self,
        local: &QpInfo,
        ready: impl FnOnce(&QpInfo) -> Result<()>,
    ) -> Result<QpInfo> {
        let remote = self.recv_qp()?;
        ready(&remote)?;
        self.send_qp(local)?;
        self.recv_done()?;
        Ok(remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_message_matches_rc_pingpong_format() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 0, 2, 1]);
        let info = QpInfo {
            qpn: 0x11,
            psn: 0xabcdef,
            lid: 0,
            gid,
            mtu: 1024,
        };
        let m = encode_qp(&info);
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffffc0000201"
        );
        assert_eq!(m[51], 0);
        let back = decode_qp(&m).unwrap();
        assert_eq!(back.qpn, 0x11);
        assert_eq!(back.psn, 0xabcdef);
        assert_eq!(back.gid, gid);
    }

    #[test]
    fn malformed_qp_messages_are_typed_errors() {
        for bad in [
            &b""[..],
            b"0000:000011:abcdef",
            b"0000:000011:abcdef:0011",
            b"0000:1000000:000000:00000000000000000000000000000000",
            b"zz00:000011:abcdef:00000000000000000000000000000000",
            b"0000:000011:abcdef:00000000000000000000000000000000:x",
        ] {
            assert_eq!(decode_qp(bad), Err(Error::ProtocolError), "{bad:?}");
        }
    }

    #[test]
    fn exchange_over_loopback_and_timeouts() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let a = QpInfo {
            qpn: 7,
            psn: 9,
            ..QpInfo::default()
        };
        let b = QpInfo {
            qpn: 8,
            psn: 10,
            ..QpInfo::default()
        };
        let t = std::thread::spawn(move || {
            let mut c = OobConn::accept(&l, Duration::from_secs(10)).unwrap();
            let got = c.server_exchange(&b, |_| Ok(())).unwrap();
            c.send_region(&RegionInfo {
                addr: 0x1234_5678_9abc,
                rkey: 0xdead,
                len: 4096,
            })
            .unwrap();
            got
        });
        let mut c =
            OobConn::connect(&std::format!("127.0.0.1:{port}"), Duration::from_secs(10)).unwrap();
        let got = c.client_exchange(&a).unwrap();
        assert_eq!((got.qpn, got.psn), (8, 10));
        let r = c.recv_region().unwrap();
        assert_eq!((r.addr, r.rkey, r.len), (0x1234_5678_9abc, 0xdead, 4096));
        assert_eq!(t.join().unwrap().qpn, 7);

        // Nobody answers: a typed timeout, not a hang.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut c = OobConn::connect(
            &std::format!("127.0.0.1:{port}"),
            Duration::from_millis(300),
        )
        .unwrap();
        assert_eq!(c.recv_qp(), Err(Error::Timeout));
        assert_eq!(
            OobConn::accept(&l, Duration::from_millis(100)).err(),
            None,
            "the connection above is pending on the listener"
        );
        drop(l);
        assert_eq!(
            OobConn::connect(
                &std::format!("127.0.0.1:{port}"),
                Duration::from_millis(300)
            )
            .err(),
            Some(Error::ConnectFailed)
        );
    }

    #[test]
    fn refused_connect_fails_at_the_refusal_window_and_says_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let t0 = Instant::now();
        let mut told = std::vec::Vec::new();
        let r = OobConn::connect_with(
            &std::format!("{addr}"),
            Duration::from_secs(60),
            Duration::from_millis(400),
            |a, w| told.push((a, w)),
        );
        let took = t0.elapsed();
        assert_eq!(r.err(), Some(Error::ConnectFailed));
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(5),
            "a refusal ends the connect after the refusal window, not the timeout: {took:?}"
        );
        assert_eq!(told, [(addr, Duration::from_millis(400))], "told once");
        assert_eq!(
            crate::verbs::last_error(),
            ("TCP connect", libc::ECONNREFUSED)
        );
        // The window never outlasts the timeout.
        let t0 = Instant::now();
        let r = OobConn::connect_with(
            &std::format!("{addr}"),
            Duration::from_millis(200),
            Duration::from_secs(60),
            |_, w| assert_eq!(w, Duration::from_millis(200)),
        );
        assert_eq!(r.err(), Some(Error::ConnectFailed));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
