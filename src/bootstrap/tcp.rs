//! The built-in TCP rendezvous: an [`Allgather`] for programs launched
//! without MPI. Rank 0 listens; every other rank connects (retrying
//! while rank 0 is not up yet), says who it is, and from then on sends
//! its contribution to rank 0, which checks it and sends everyone the
//! whole table (docs/architecture.md, "Bootstrap"). Every wait is bounded
//! by the timeout given, and a peer that goes away (EOF, reset) is an
//! error at once, never a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::thread::sleep;
use std::time::{Duration, Instant};
use std::vec;
use std::vec::Vec;

use crate::error::{Error, Result};

use super::Allgather;

/// "RDDT", little-endian: the rendezvous' own frames.
const MAGIC: u32 = u32::from_le_bytes(*b"RDDT");
const VERSION: u32 = 1;
/// The largest contribution a rank may announce (refused above, so that
/// garbage cannot make rank 0 allocate without bound).
const MAX_CONTRIBUTION: u64 = 1 << 28;
/// How often a refused connect to rank 0 is retried, and accept polled.
const POLL: Duration = Duration::from_millis(5);
/// How long rank 0 spends telling a rank a verdict after its own
/// deadline passed (a timeout is worth saying rather than closing).
const TELL: Duration = Duration::from_millis(500);

/// A TCP rendezvous among `size` ranks (see the module documentation).
pub struct TcpAllgather {
    rank: u32,
    size: u32,
    timeout: Duration,
    /// Rank 0: the other ranks' connections, index `r - 1`. Other ranks:
    /// the one connection to rank 0.
    conns: Vec<TcpStream>,
}

fn io_err(e: &std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout,
        _ => Error::ConnectFailed,
    }
}

/// Reads exactly `buf` before `deadline`: [`Error::Timeout`] when it
/// passes, [`Error::ConnectFailed`] on EOF or a reset.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        s.set_read_timeout(Some(left)).map_err(|e| io_err(&e))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(Error::ConnectFailed),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(&e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` before `deadline`.
fn write_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout);
    }
    s.set_write_timeout(Some(left)).map_err(|e| io_err(&e))?;
    s.write_all(buf).map_err(|e| io_err(&e))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn hello(rank: u32, size: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&VERSION.to_le_bytes());
    b[8..12].copy_from_slice(&rank.to_le_bytes());
    b[12..16].copy_from_slice(&size.to_le_bytes());
    b
}

/// Rank 0's verdict on a step: magic and a status (0, or an error code).
fn verdict(status: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&status.to_le_bytes());
    b
}

/// Reads rank 0's verdict: `Ok` for 0; the error it names otherwise
/// ([`Error::ConnectFailed`] for a code that names none), and
/// [`Error::ProtocolError`] for a frame that is not one.
fn read_verdict(s: &mut TcpStream, deadline: Instant) -> Result<()> {
    let mut b = [0u8; 8];
    read_by(s, &mut b, deadline)?;
    if u32_at(&b, 0) != MAGIC {
        return Err(Error::ProtocolError);
    }
    match u32_at(&b, 4) {
        0 => Ok(()),
        c => Err(Error::from_code(c).unwrap_or(Error::ConnectFailed)),
    }
}

impl TcpAllgather {
    /// Joins the rendezvous at `addr` (`host:port`) as `rank` of `size`:
    /// rank 0 listens there, the others connect to it. Returns once every
    /// rank has joined (rank 0 has checked that the ranks are distinct,
    /// in range and agree on `size`), or with an error within about
    /// `timeout`:
    /// - [`Error::InvalidAttribute`]: `rank >= size`, an `addr` that
    ///   resolves to nothing; rank 0's `addr` cannot be bound:
    ///   [`Error::ConnectFailed`];
    /// - [`Error::Timeout`]: a rank did not join in time (rank 0), or
    ///   rank 0 did not answer in time;
    /// - [`Error::ProtocolError`]: a duplicate rank, a rank out of range,
    ///   another size, or bytes that are not a join (rank 0; the others
    ///   hear rank 0's verdict, or see it close: [`Error::ConnectFailed`]).
    pub fn new(rank: u32, size: u32, addr: &str, timeout: Duration) -> Result<TcpAllgather> {
        if rank >= size {
            return Err(Error::InvalidAttribute);
        }
        if rank == 0 {
            let l = TcpListener::bind(addr).map_err(|_| Error::ConnectFailed)?;
            return Self::with_listener(l, size, timeout);
        }
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|_| Error::InvalidAttribute)?
            .collect();
        if addrs.is_empty() {
            return Err(Error::InvalidAttribute);
        }
        let deadline = Instant::now() + timeout;
        // Rank 0 may not be listening yet: retry refusals until the
        // deadline.
        let s = 'retry: loop {
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout);
                }
                if let Ok(s) = TcpStream::connect_timeout(a, left) {
                    break 'retry s;
                }
            }
            sleep(POLL);
        };
        let _ = s.set_nodelay(true);
        let mut s = s;
        write_by(&mut s, &hello(rank, size), deadline)?;
        read_verdict(&mut s, deadline)?;
        Ok(TcpAllgather {
            rank,
            size,
            timeout,
            conns: vec![s],
        })
    }

    /// Rank 0 on a listener the caller bound (to learn a port chosen by
    /// the system before the other ranks are told it): accepts the
    /// `size - 1` other ranks within `timeout` and checks their joins, as
    /// [`TcpAllgather::new`] does. On a refusal every rank that joined
    /// hears the error.
    pub fn with_listener(l: TcpListener, size: u32, timeout: Duration) -> Result<TcpAllgather> {
        if size == 0 {
            return Err(Error::InvalidAttribute);
        }
        let deadline = Instant::now() + timeout;
        l.set_nonblocking(true).map_err(|e| io_err(&e))?;
        let mut joined: Vec<Option<TcpStream>> = (1..size).map(|_| None).collect();
        let mut left = size as usize - 1;
        let r = (|| {
            while left > 0 {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).map_err(|e| io_err(&e))?;
                        let _ = s.set_nodelay(true);
                        let mut b = [0u8; 16];
                        read_by(&mut s, &mut b, deadline)?;
                        let r = u32_at(&b, 8);
                        if u32_at(&b, 0) != MAGIC
                            || u32_at(&b, 4) != VERSION
                            || u32_at(&b, 12) != size
                            || r == 0
                            || r >= size
                            || joined[r as usize - 1].is_some()
                        {
                            let _ =
                                write_by(&mut s, &verdict(Error::ProtocolError.code()), deadline);
                            return Err(Error::ProtocolError);
                        }
                        joined[r as usize - 1] = Some(s);
                        left -= 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            return Err(Error::Timeout);
                        }
                        sleep(POLL);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_err(&e)),
                }
            }
            Ok(())
        })();
        let status = match r {
            Ok(()) => 0,
            Err(e) => e.code(),
        };
        let tell = deadline.max(Instant::now() + TELL);
        for s in joined.iter_mut().flatten() {
            let _ = write_by(s, &verdict(status), tell);
        }
        r?;
        Ok(TcpAllgather {
            rank: 0,
            size,
            timeout,
            conns: joined.into_iter().flatten().collect(),
        })
    }

    /// Rank 0's side of one allgather.
    fn gather_at_root(&mut self, mine: &[u8], all: &mut [u8], deadline: Instant) -> Result<()> {
        let n = mine.len();
        all[..n].copy_from_slice(mine);
        let mut r = Ok(());
        for (i, s) in self.conns.iter_mut().enumerate() {
            let mut h = [0u8; 8];
            r = read_by(s, &mut h, deadline).and_then(|()| {
                if u64::from_le_bytes(h) != n as u64 {
                    // Lengths disagree: a rank that sends garbage, or
                    // another protocol.
                    return Err(Error::ProtocolError);
                }
                let at = (i + 1) * n;
                read_by(s, &mut all[at..at + n], deadline)
            });
            if r.is_err() {
                break;
            }
        }
        let status = match r {
            Ok(()) => 0,
            Err(e) => e.code(),
        };
        let tell = if status == 0 {
            deadline
        } else {
            deadline.max(Instant::now() + TELL)
        };
        for s in &mut self.conns {
            // A rank that cannot be told is told by the close instead.
            let w = write_by(s, &verdict(status), tell).and_then(|()| {
                if status == 0 {
                    write_by(s, all, deadline)
                } else {
                    Ok(())
                }
            });
            if r.is_ok() {
                r = w;
            }
        }
        r
    }

    /// A non-root rank's side of one allgather.
    fn gather_at_leaf(&mut self, mine: &[u8], all: &mut [u8], deadline: Instant) -> Result<()> {
        let s = &mut self.conns[0];
        if mine.len() as u64 > MAX_CONTRIBUTION {
            return Err(Error::InvalidAttribute);
        }
        let mut frame = Vec::with_capacity(8 + mine.len());
        frame.extend_from_slice(&(mine.len() as u64).to_le_bytes());
        frame.extend_from_slice(mine);
        write_by(s, &frame, deadline)?;
        read_verdict(s, deadline)?;
        read_by(s, all, deadline)
    }
}

impl Allgather for TcpAllgather {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    /// Gathers through rank 0 within the timeout given at creation:
    /// [`Error::Timeout`] when a rank is too slow, [`Error::ConnectFailed`]
    /// when one went away, [`Error::ProtocolError`] when the ranks' lengths
    /// disagree (rank 0 finds it and tells everyone), and
    /// [`Error::InvalidAttribute`] for `all` of the wrong length. After an
    /// error the rendezvous is unusable (drop it).
    fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> Result<()> {
        if Some(all.len()) != mine.len().checked_mul(self.size as usize) {
            return Err(Error::InvalidAttribute);
        }
        let deadline = Instant::now() + self.timeout;
        let r = if self.rank == 0 {
            self.gather_at_root(mine, all, deadline)
        } else {
            self.gather_at_leaf(mine, all, deadline)
        };
        if r.is_err() {
            // Closing tells every peer at once (EOF), instead of letting
            // them wait for the timeout.
            self.conns.clear();
        }
        r
    }
}
