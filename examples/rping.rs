//! An rdma_cm ping that speaks the protocol of rdma-core's `rping`, with
//! this crate's own QP (connected through [`rdma_direct::verbs::cm`]).
//! Needs `--features verbs` and a kernel RDMA device (rxe, siw, ...).
//!
//! Each ping, as `rping` does it:
//! 1. the client fills its source buffer with `"rdma-ping-<n>: "` and a
//!    cycling `A..z` pattern (starting one letter later each ping),
//!    NUL-terminated, and SENDs `{addr, rkey, size}` of it (16 bytes,
//!    big-endian: `u64 addr, u32 rkey, u32 size`);
//! 2. the server RDMA READs the source, then SENDs a "go ahead";
//! 3. the client SENDs `{addr, rkey, size}` of its sink buffer;
//! 4. the server RDMA WRITEs what it read (up to and including its NUL)
//!    into the sink, then SENDs another "go ahead";
//! 5. with `-V` the client compares the sink with the source.
//!
//! After `-C` pings the client disconnects. Either side interoperates with
//! `rping` (`rping -s -a ADDR -V -C N` / `rping -c -a ADDR -V -C N`):
//!
//! ```text
//! rping -c -a ADDR [-p 7174] [-C N] [-S 64] [-v] [-V] [--device NAME]
//! rping -s [-a ADDR] [-p 7174] [-C N] [-S 64] [-v] [-V] [--device NAME]
//! ```
//!
//! The QP must exist before rdma_cm connects it, so the device is chosen
//! first: `--device`, else the device whose network address is ADDR, else
//! the only device there is. Differences from `rping`: the server serves
//! one connection and then exits (0 once the client has disconnected, or
//! after `-C` pings); with `-V` the server also checks every ping it reads
//! against the expected pattern; the client clears its sink before each
//! ping, so `-V` cannot pass on stale data; every wait is bounded
//! (`--timeout SECS`, default 30) and watches the rdma_cm events, so a
//! peer that disconnects or dies is reported at once. Connection setup is
//! retried a few times (siw sometimes refuses a first connect), and each
//! failed attempt is reported with the rdma_cm event and its status (a
//! rejection's reason, as rdma-core's `rping` prints it). Exit status: 0
//! success, 1 failure (data mismatch, bad message, completion error,
//! disconnect, rejection, timeout), 2 bad arguments.

#[cfg(feature = "verbs")]
mod common;

#[cfg(not(feature = "verbs"))]
fn main() -> std::process::ExitCode {
    eprintln!(
        "rping needs the verbs backend (rdma_cm and a kernel RDMA device): \
         cargo run --release --features verbs --example rping -- -c -a ADDR"
    );
    std::process::ExitCode::from(2)
}

#[cfg(feature = "verbs")]
fn main() -> std::process::ExitCode {
    imp::main()
}

#[cfg(feature = "verbs")]
mod imp {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::process::ExitCode;
    use std::thread;
    use std::time::{Duration, Instant};

    use rdma_direct::api::{
        Access, Backend, Cq, Device, Mr, Pd, Qp, QpInit, Wc, WcOpcode, WcStatus,
    };
    use rdma_direct::verbs::cm::{self, CmConnection, CmListener, CmOptions};
    use rdma_direct::verbs::{list_devices, VerbsDevice};
    use rdma_direct::{Error, RecvWr, Remote, SendFlags, SendOp, SendWr};

    use super::common::{device_ipv4, open_device, status_name, ExampleBackend, EXIT_USAGE};

    type Dev = VerbsDevice;

    const RECV_WRID: u64 = 1;
    const SEND_WRID: u64 = 2;
    const RDMA_WRID: u64 = 3;
    /// `struct rping_rdma_info`: be64 buf, be32 rkey, be32 size.
    const INFO_LEN: usize = 16;
    /// rping's smallest and largest `-S`.
    const MIN_SIZE: usize = 23;
    const MAX_SIZE: usize = 65535;
    const DEFAULT_PORT: u16 = 7174;
    /// Connection setups the client tries (siw sometimes refuses a first
    /// connect).
    const CONNECT_ATTEMPTS: u32 = 5;

    struct Args {
        server: bool,
        addr: Option<IpAddr>,
        port: u16,
        count: u64,
        size: usize,
        verbose: bool,
        validate: bool,
        device: Option<String>,
        timeout: Duration,
    }

    fn usage() -> &'static str {
        "usage: rping -c -a ADDR [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [--device NAME] \
         [--timeout SECS]\n       rping -s [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] \
         [--device NAME] [--timeout SECS]"
    }

    fn parse_args() -> Result<Args, String> {
        let mut a = Args {
            server: false,
            addr: None,
            port: DEFAULT_PORT,
            count: 0,
            size: 64,
            verbose: false,
            validate: false,
            device: None,
            timeout: Duration::from_secs(30),
        };
        let (mut s, mut c) = (false, false);
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
            let num = |name: &str, v: String| -> Result<u64, String> {
                v.parse::<u64>()
                    .map_err(|_| format!("{name}: not a number: {v}"))
            };
            match flag.as_str() {
                "-s" => s = true,
                "-c" => c = true,
                "-a" => {
                    let v = value("-a")?;
                    a.addr = Some(
                        v.parse()
                            .map_err(|_| format!("-a: not an IP address: {v}"))?,
                    );
                }
                "-p" => {
                    a.port = u16::try_from(num("-p", value("-p")?)?)
                        .map_err(|_| "-p: port out of range".to_string())?
                }
                "-C" => a.count = num("-C", value("-C")?)?,
                "-S" => a.size = num("-S", value("-S")?)?.min(u64::MAX >> 1) as usize,
                "-v" => a.verbose = true,
                "-V" => a.validate = true,
                "--device" => a.device = Some(value("--device")?),
                "--timeout" => {
                    a.timeout = Duration::from_secs(num("--timeout", value("--timeout")?)?.max(1))
                }
                "-h" | "--help" => return Err(usage().into()),
                other => return Err(format!("unknown argument {other}\n{}", usage())),
            }
        }
        if s == c {
            return Err(format!(
                "give exactly one of -s (server) and -c (client)\n{}",
                usage()
            ));
        }
        a.server = s;
        if !s && a.addr.is_none() {
            return Err("the client needs the server's address: -a ADDR".into());
        }
        if !(MIN_SIZE..=MAX_SIZE).contains(&a.size) {
            return Err(format!("-S must be between {MIN_SIZE} and {MAX_SIZE}"));
        }
        if a.count > i32::MAX as u64 {
            return Err("-C is at most 2147483647".into());
        }
        Ok(a)
    }

    pub fn main() -> ExitCode {
        let args = match parse_args() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(EXIT_USAGE);
            }
        };
        let r = if args.server {
            server(&args)
        } else {
            client(&args)
        };
        match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rping: FAILED: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// The device for `addr`: `--device`, else the one whose network device
    /// has that address, else the only one.
    fn pick_device(args: &Args, addr: IpAddr) -> Result<Device<Dev>, String> {
        if let Some(d) = &args.device {
            return open_device(Some(d), None);
        }
        let names: Vec<String> = list_devices()
            .map_err(|e| format!("list RDMA devices: {e}"))?
            .into_iter()
            .map(|d| d.name)
            .collect();
        if names.is_empty() {
            return Err("this host has no RDMA device".into());
        }
        for n in &names {
            let dev = open_device(Some(n), None)?;
            if device_ipv4(dev.backend()).map(IpAddr::V4) == Some(addr) {
                return Ok(dev);
            }
        }
        if names.len() == 1 {
            return open_device(Some(&names[0]), None);
        }
        Err(format!(
            "no RDMA device has address {addr} (devices: {}): choose one with --device",
            names.join(", ")
        ))
    }

    /// Fills `buf` as rping's client does for ping number `ping` whose
    /// pattern starts at letter `start`.
    fn fill_ping(buf: &mut [u8], ping: u64, start: u8) {
        let head = format!("rdma-ping-{ping}: ");
        let n = head.len().min(buf.len());
        buf[..n].copy_from_slice(&head.as_bytes()[..n]);
        let mut c = start;
        for b in &mut buf[n..] {
            *b = c;
            c += 1;
            if c > b'z' {
                c = b'A';
            }
        }
        if let Some(last) = buf.last_mut() {
            *last = 0;
        }
    }

    /// The pattern's first letter for the ping after one starting at `s`.
    fn next_start(s: u8) -> u8 {
        if s >= b'z' {
            b'A'
        } else {
            s + 1
        }
    }

    /// The text up to the first NUL.
    fn c_str(b: &[u8]) -> std::borrow::Cow<'_, str> {
        let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end])
    }

    fn encode_info(addr: u64, rkey: u32, size: u32) -> [u8; INFO_LEN] {
        let mut m = [0u8; INFO_LEN];
        m[..8].copy_from_slice(&addr.to_be_bytes());
        m[8..12].copy_from_slice(&rkey.to_be_bytes());
        m[12..].copy_from_slice(&size.to_be_bytes());
        m
    }

    fn decode_info(m: &[u8; INFO_LEN]) -> (u64, u32, u32) {
        let mut a = [0u8; 8];
        a.copy_from_slice(&m[..8]);
        let mut k = [0u8; 4];
        k.copy_from_slice(&m[8..12]);
        let mut s = [0u8; 4];
        s.copy_from_slice(&m[12..]);
        (
            u64::from_be_bytes(a),
            u32::from_be_bytes(k),
            u32::from_be_bytes(s),
        )
    }

    fn e(what: &'static str) -> impl Fn(Error) -> String {
        move |x| format!("{what}: {x}{}", Dev::detail())
    }

    /// The QP attributes rping uses: 16 sends, 2 receives, 1 SGE.
    fn qp_init() -> QpInit {
        QpInit {
            max_send_wr: 16,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            srq: None,
        }
    }

    /// What the poller has seen.
    #[derive(Default)]
    struct Seen {
        /// A received message (its 16 bytes).
        msg: Option<[u8; INFO_LEN]>,
        /// Sends posted and not completed.
        sends_out: u32,
        /// The RDMA READ/WRITE completed.
        rdma_done: bool,
    }

    /// One connected endpoint.
    struct Ep {
        qp: Qp<Dev>,
        cq: Cq<Dev>,
        recv: Mr<Dev>,
        send: Mr<Dev>,
        rdma: Mr<Dev>,
        conn: CmConnection,
        seen: Seen,
        timeout: Duration,
        /// The CM reported the peer's disconnect.
        peer_gone: bool,
    }

    /// How a wait ended.
    #[derive(PartialEq)]
    enum Waited {
        Done,
        /// The peer disconnected (only when the caller allows it).
        Disconnected,
    }

    fn post_recv(qp: &mut Qp<Dev>, recv: &Mr<Dev>) -> rdma_direct::Result<()> {
        qp.post_recv(&[RecvWr {
            wr_id: RECV_WRID,
            sges: &[recv.sge(0, INFO_LEN as u32)],
        }])
        .map_err(|p| p.error)
    }

    impl Ep {
        /// SENDs `msg` (16 bytes).
        fn send_msg(&mut self, msg: &[u8; INFO_LEN]) -> Result<(), String> {
            self.send.as_mut_slice()[..INFO_LEN].copy_from_slice(msg);
            let sge = [self.send.sge(0, INFO_LEN as u32)];
            self.qp
                .post_send_one(&SendWr::new(
                    SEND_WRID,
                    SendOp::Send,
                    &sge,
                    SendFlags::SIGNALED,
                ))
                .map_err(e("post SEND"))?;
            self.seen.sends_out += 1;
            Ok(())
        }

        /// Posts an RDMA READ (`read`) or WRITE of `len` bytes between our
        /// buffer and the peer's.
        fn rdma(&mut self, read: bool, len: u32, remote: Remote) -> Result<(), String> {
            let sge = [self.rdma.sge(0, len)];
            let op = if read {
                SendOp::Read { remote }
            } else {
                SendOp::Write { remote }
            };
            self.seen.rdma_done = false;
            self.qp
                .post_send_one(&SendWr::new(RDMA_WRID, op, &sge, SendFlags::SIGNALED))
                .map_err(e(if read {
                    "post RDMA READ"
                } else {
                    "post RDMA WRITE"
                }))
        }

        /// The error for a peer that disconnected while we were at `what`.
        fn gone(&self, what: &str) -> String {
            format!(
                "{what}: the peer disconnected (RDMA_CM_EVENT_DISCONNECTED): it closed the \
                 connection or its process ended"
            )
        }

        /// Polls until `done(&seen)`, watching the rdma_cm events all the
        /// while (on rxe a peer that dies only shows as a DISCONNECTED
        /// event: nothing flushes our QP). A peer disconnect ends the wait
        /// with [`Waited::Disconnected`] if `may_end`, and is an error
        /// otherwise.
        fn wait(
            &mut self,
            what: &str,
            may_end: bool,
            done: impl Fn(&Seen) -> bool,
        ) -> Result<Waited, String> {
            let deadline = Instant::now() + self.timeout;
            let mut wc = [Wc::default(); 8];
            let mut idle = 0u32;
            while !done(&self.seen) {
                let n = self.cq.poll(&mut self.qp, &mut wc).map_err(e("poll CQ"))?;
                for w in &wc[..n] {
                    if w.status != WcStatus::SUCCESS {
                        if w.status == WcStatus::WR_FLUSH_ERR {
                            // The connection is gone (iWARP flushes the
                            // QP); the CM says so shortly.
                            let said = self.conn.wait_disconnect(Duration::from_millis(500));
                            if may_end {
                                return Ok(Waited::Disconnected);
                            }
                            if said.is_ok() {
                                return Err(format!(
                                    "{} (wr_id {} flushed)",
                                    self.gone(what),
                                    w.wr_id
                                ));
                            }
                        }
                        let why = if w.status == WcStatus::WR_FLUSH_ERR {
                            " (the connection is gone: the peer failed or disconnected)"
                        } else {
                            ""
                        };
                        return Err(format!(
                            "{what}: completion of wr_id {} failed: {} ({}){why}",
                            w.wr_id,
                            status_name(w.status),
                            w.status.0
                        ));
                    }
                    match (w.wr_id, w.opcode) {
                        (RECV_WRID, WcOpcode::RECV) => {
                            if w.byte_len as usize != INFO_LEN {
                                return Err(format!("Received bogus data, size {}", w.byte_len));
                            }
                            if self.seen.msg.is_some() {
                                return Err(format!(
                                    "{what}: a second message arrived before the first was used"
                                ));
                            }
                            let mut m = [0u8; INFO_LEN];
                            m.copy_from_slice(&self.recv.as_slice()[..INFO_LEN]);
                            self.seen.msg = Some(m);
                            post_recv(&mut self.qp, &self.recv).map_err(e("post receive"))?;
                        }
                        (SEND_WRID, WcOpcode::SEND) => {
                            self.seen.sends_out = self.seen.sends_out.saturating_sub(1)
                        }
                        (RDMA_WRID, WcOpcode::RDMA_READ | WcOpcode::RDMA_WRITE) => {
                            self.seen.rdma_done = true
                        }
                        (id, op) => {
                            return Err(format!(
                                "{what}: unexpected completion wr_id {id} opcode {op:?}"
                            ))
                        }
                    }
                }
                if n > 0 {
                    idle = 0;
                    continue;
                }
                if self.peer_gone {
                    // The CQ is drained since the DISCONNECTED event.
                    return if may_end {
                        Ok(Waited::Disconnected)
                    } else {
                        Err(self.gone(what))
                    };
                }
                idle += 1;
                if idle < 256 {
                    std::hint::spin_loop();
                    continue;
                }
                // Idle: let the (possibly software) device have the CPU,
                // and notice a disconnect (rdma_cm event) whatever we wait
                // for.
                if idle % 16 == 0 {
                    match self.conn.wait_disconnect(Duration::from_millis(1)) {
                        // Drain the CQ once more first: what the peer
                        // sent before it left still counts.
                        Ok(()) => self.peer_gone = true,
                        Err(Error::Timeout) => {}
                        Err(x) => return Err(format!("{what}: rdma_cm: {x}{}", Dev::detail())),
                    }
                } else {
                    thread::sleep(Duration::from_micros(50));
                }
                if Instant::now() > deadline {
                    return Err(format!("{what}: nothing happened for {:?}", self.timeout));
                }
            }
            Ok(Waited::Done)
        }

        fn take_msg(&mut self) -> Result<(u64, u32, u32), String> {
            let m = self.seen.msg.take().ok_or("no message")?;
            Ok(decode_info(&m))
        }
    }

    /// The buffers every endpoint has.
    struct Bufs {
        /// Receives land here (16 bytes).
        recv: Mr<Dev>,
        /// Our messages go out from here (16 bytes).
        send: Mr<Dev>,
        /// The server's READ target and WRITE source; the client's sink.
        rdma: Mr<Dev>,
    }

    fn buffers(pd: &Pd<Dev>, size: usize) -> Result<Bufs, String> {
        let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        Ok(Bufs {
            recv: pd
                .register(INFO_LEN, Access::LOCAL_WRITE)
                .map_err(e("register"))?,
            send: pd.register(INFO_LEN, Access::NONE).map_err(e("register"))?,
            rdma: pd.register(size, remote).map_err(e("register"))?,
        })
    }

    fn client(args: &Args) -> Result<(), String> {
        let addr = args.addr.ok_or("no server address")?;
        let dev = pick_device(args, addr)?;
        let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
        let Bufs { recv, send, rdma } = buffers(&pd, args.size)?;
        let mut start_buf = pd
            .register(
                args.size,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .map_err(e("register"))?;
        let dst = SocketAddr::new(addr, args.port);
        let opts = CmOptions {
            timeout: args.timeout,
            ..CmOptions::default()
        };
        // A fresh CQ and QP per attempt: a failed one may leave flushed
        // work behind. Each failed attempt says why (a rejection's
        // reason), since the next one may fail differently.
        let mut attempt = 0;
        let (cq, qp, conn) = cm::retry(CONNECT_ATTEMPTS, Duration::from_millis(500), || {
            attempt += 1;
            let r = (|| {
                let cq = dev.create_cq(dev.cq_depth_for(&[&qp_init()]).max(32))?;
                let mut qp = pd.create_qp(&cq, &cq, &qp_init())?;
                let conn = cm::connect(&mut qp, dst, None, &opts, |q| post_recv(q, &recv))?;
                Ok((cq, qp, conn))
            })();
            if let (Err(x @ Error::ConnectFailed), true) = (&r, attempt < CONNECT_ATTEMPTS) {
                eprintln!(
                    "rping: connect to {dst}, attempt {attempt} of {CONNECT_ATTEMPTS}: {x}{}; \
                     retrying",
                    Dev::detail()
                );
            }
            r
        })
        .map_err(|x| format!("connect to {dst}: {x}{}", Dev::detail()))?;
        let mut ep = Ep {
            qp,
            cq,
            recv,
            send,
            rdma,
            conn,
            seen: Seen::default(),
            timeout: args.timeout,
            peer_gone: false,
        };
        let size = args.size as u32;
        let mut start = b'A';
        let mut ping = 0u64;
        while args.count == 0 || ping < args.count {
            fill_ping(start_buf.as_mut_slice(), ping, start);
            start = next_start(start);
            // A ping that never arrives cannot pass -V on stale data.
            ep.rdma.as_mut_slice().fill(0);
            ep.send_msg(&encode_info(start_buf.addr(), start_buf.rkey(), size))?;
            ep.wait("waiting for the server's READ", false, |s| {
                s.msg.is_some() && s.sends_out == 0
            })?;
            ep.take_msg()?;
            ep.send_msg(&encode_info(ep.rdma.addr(), ep.rdma.rkey(), size))?;
            ep.wait("waiting for the server's WRITE", false, |s| {
                s.msg.is_some() && s.sends_out == 0
            })?;
            ep.take_msg()?;
            if args.validate && ep.rdma.as_slice() != start_buf.as_slice() {
                println!("data mismatch!");
                return Err(format!(
                    "ping {ping}: sent \"{}\", got back \"{}\"",
                    c_str(start_buf.as_slice()),
                    c_str(ep.rdma.as_slice())
                ));
            }
            if args.verbose {
                println!("ping data: {}", c_str(ep.rdma.as_slice()));
            }
            ping += 1;
        }
        if !ep.peer_gone {
            ep.conn
                .disconnect(&mut ep.qp)
                .map_err(e("rdma_disconnect"))?;
        }
        println!(
            "rping client: {ping} pings of {size} bytes with {dst} on {}{}",
            dev.backend().name(),
            if args.validate {
                ", every echo verified"
            } else {
                ""
            }
        );
        Ok(())
    }

    fn server(args: &Args) -> Result<(), String> {
        let bind = args.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let dev = pick_device(args, bind)?;
        let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
        let Bufs { recv, send, rdma } = buffers(&pd, args.size)?;
        let at = SocketAddr::new(bind, args.port);
        let l =
            CmListener::bind(at, 3).map_err(|x| format!("listen on {at}: {x}{}", Dev::detail()))?;
        let opts = CmOptions {
            timeout: args.timeout,
            ..CmOptions::default()
        };
        let (cq, qp, conn) = cm::retry(5, Duration::ZERO, || {
            let cq = dev.create_cq(dev.cq_depth_for(&[&qp_init()]).max(32))?;
            let mut qp = pd.create_qp(&cq, &cq, &qp_init())?;
            let conn = l.accept(&mut qp, &opts, |q| post_recv(q, &recv))?;
            Ok((cq, qp, conn))
        })
        .map_err(|x| format!("accept on {at}: {x}{}", Dev::detail()))?;
        drop(l);
        let mut ep = Ep {
            qp,
            cq,
            recv,
            send,
            rdma,
            conn,
            seen: Seen::default(),
            timeout: args.timeout,
            peer_gone: false,
        };
        let go_ahead = [0u8; INFO_LEN];
        let mut start = b'A';
        let mut ping = 0u64;
        let mut expect = vec![0u8; args.size];
        let mut ended = false;
        while args.count == 0 || ping < args.count {
            if ep.wait("waiting for the client's source", true, |s| s.msg.is_some())?
                == Waited::Disconnected
            {
                ended = true;
                break;
            }
            let (addr, rkey, len) = ep.take_msg()?;
            if len as usize > args.size || len == 0 {
                return Err(format!(
                    "ping {ping}: the client's buffer is {len} bytes, ours {} (start the server \
                     with -S {len} or more)",
                    args.size
                ));
            }
            ep.rdma(true, len, Remote::new(addr, rkey))?;
            ep.wait("RDMA READ", false, |s| s.rdma_done)?;
            let got = &ep.rdma.as_slice()[..len as usize];
            if args.verbose {
                println!("server ping data: {}", c_str(got));
            }
            if args.validate {
                fill_ping(&mut expect[..len as usize], ping, start);
                if got != &expect[..len as usize] {
                    return Err(format!(
                        "ping {ping}: read \"{}\", expected \"{}\"",
                        c_str(got),
                        c_str(&expect[..len as usize])
                    ));
                }
            }
            start = next_start(start);
            ep.send_msg(&go_ahead)?;
            ep.wait("waiting for the client's sink", false, |s| s.msg.is_some())?;
            let (addr, rkey, sink) = ep.take_msg()?;
            // rping echoes strlen + 1 bytes.
            let data = &ep.rdma.as_slice()[..len as usize];
            let wlen = data
                .iter()
                .position(|&b| b == 0)
                .map_or(data.len(), |p| p + 1) as u32;
            if wlen > sink {
                return Err(format!(
                    "ping {ping}: the client's sink ({sink} bytes) is smaller than the echo \
                     ({wlen})"
                ));
            }
            ep.rdma(false, wlen, Remote::new(addr, rkey))?;
            ep.wait("RDMA WRITE", false, |s| s.rdma_done)?;
            ep.send_msg(&go_ahead)?;
            ping += 1;
        }
        let mut how = "the client disconnected";
        if !ended {
            // -C pings done: the client disconnects next (its QP may be
            // flushed before our last send's completion is polled).
            let w = ep.wait("waiting for the last send", true, |s| s.sends_out == 0)?;
            if w == Waited::Done && ep.conn.wait_disconnect(args.timeout).is_err() {
                let _ = ep.conn.disconnect(&mut ep.qp);
                how = "the client did not disconnect: we did";
            }
        }
        println!(
            "rping server: {ping} pings of up to {} bytes on {} ({at}), {how}{}",
            args.size,
            dev.backend().name(),
            if args.validate {
                ", every ping verified"
            } else {
                ""
            }
        );
        Ok(())
    }
}
