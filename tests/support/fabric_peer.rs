//! Peer processes for the cross-process fabric tests: the test binary
//! runs itself again with `RDD_FABRIC_ROLE` set, and the child talks to
//! its parent through lines on stdin/stdout (`@@ ` marks the protocol's
//! lines among the test harness's own output).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

/// How long any one expected line may take.
pub const LINE_WAIT: Duration = Duration::from_secs(30);

/// The name of the test function that runs a child's role.
pub const CHILD_TEST: &str = "fabric_child";

/// A child process and its protocol lines.
pub struct Peer {
    pub proc: Child,
    lines: Receiver<String>,
    stdin: ChildStdin,
}

impl Peer {
    /// Waits (at most [`BOUND`]) until the child's state letter in
    /// `/proc/<pid>/stat` is `T`: a SIGSTOP takes effect asynchronously.
    pub fn wait_stopped(&self) {
        let stat = format!("/proc/{}/stat", self.proc.id());
        let t0 = Instant::now();
        while !std::fs::read_to_string(&stat)
            .unwrap()
            .rsplit_once(')')
            .unwrap()
            .1
            .starts_with(" T")
        {
            assert!(t0.elapsed() < BOUND, "the peer never stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts a child in `role` with extra environment `env`.
    pub fn spawn(role: &str, env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
            .env("RDD_FABRIC_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = cmd.spawn().expect("spawning the peer process");
        let out = proc.stdout.take().unwrap();
        let stdin = proc.stdin.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                // libtest may print "test NAME ... " before the test's
                // own first line.
                if let Some(at) = l.find("@@ ") {
                    if tx.send(l[at + 3..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Peer { proc, lines, stdin }
    }

    /// The next line that starts with `word`, split in words (after it).
    pub fn expect(&self, word: &str) -> Vec<String> {
        let deadline = Instant::now() + LINE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the peer never said {word:?}"));
            let mut w = l.split_whitespace().map(str::to_string);
            if w.next().as_deref() == Some(word) {
                return w.collect();
            }
        }
    }

    /// Sends one line.
    pub fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// The parent's side of a test: a fabric device, a PD, one CQ for both
/// queues and a QP.
pub struct Side {
    pub dev: Device<SoftDevice>,
    pub pd: Pd<SoftDevice>,
    pub cq: Cq<SoftDevice>,
    pub qp: Qp<SoftDevice>,
}

/// Posts one send WR on the side's QP.
pub fn post(s: &mut Side, id: u64, op: SendOp, sge: &[rdma_direct::Sge], flags: SendFlags) {
    s.qp.post_send_one(&SendWr::new(id, op, sge, flags))
        .unwrap();
}

pub const SIG: SendFlags = SendFlags::SIGNALED;
/// How long the parent waits for anything a healthy peer does.
pub const BOUND: Duration = Duration::from_secs(20);

/// `info` as one line.
pub fn info_line(i: &QpInfo) -> String {
    let gid: String = i.gid.iter().map(|b| format!("{b:02x}")).collect();
    format!("info {} {} {} {} {}", i.qpn, i.psn, i.lid, gid, i.mtu)
}

/// The words of an `info` line back.
pub fn parse_info(w: &[String]) -> QpInfo {
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&w[3][2 * i..2 * i + 2], 16).unwrap();
    }
    QpInfo {
        qpn: w[0].parse().unwrap(),
        psn: w[1].parse().unwrap(),
        lid: w[2].parse().unwrap(),
        gid,
        mtu: w[4].parse().unwrap(),
    }
}

/// FNV-1a of `b`.
pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The bytes a target child's memory starts with.
pub fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

/// Bytes of a target child's memory region.
pub const TARGET_BYTES: usize = 2 << 20;
/// Receive slots a target child keeps posted, and their size.
pub const SLOTS: usize = 16;
/// Bytes of one receive slot.
pub const SLOT_BYTES: usize = 128 * 1024;

/// Every remote right.
pub fn all_access() -> Access {
    Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// The child's side: runs the role named by `RDD_FABRIC_ROLE`.
pub fn run_child(role: &str) {
    match role {
        "target" => target(),
        "adder" => adder(),
        "srq_target" => srq_target(),
        other => panic!("unknown role {other}"),
    }
}

fn stdin_lines() -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

fn next_line(rx: &Receiver<String>) -> Vec<String> {
    rx.recv_timeout(LINE_WAIT)
        .expect("the parent went away")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// A responder: one QP with a 2 MiB region every remote right reaches
/// (filled with `pattern`), receives kept posted (unless
/// `RDD_FABRIC_NORECV` is set), and every completion reported with a
/// checksum of what it received. Commands: `dereg` drops the region,
/// `quit` (or the parent's end of stdin closing) ends the child.
fn target() {
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let mut mem = Some(
        pd.register(TARGET_BYTES, Access::LOCAL_WRITE | all_access())
            .unwrap(),
    );
    for (i, b) in mem.as_mut().unwrap().as_mut_slice().iter_mut().enumerate() {
        *b = pattern(i);
    }
    let rx = pd
        .register(SLOTS * SLOT_BYTES, Access::LOCAL_WRITE)
        .unwrap();
    let post = |qp: &mut Qp<SoftDevice>, slot: usize| {
        qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sges: &[rx.sge(slot * SLOT_BYTES, SLOT_BYTES as u32)],
        }])
        .unwrap();
    };
    let recv = std::env::var_os("RDD_FABRIC_NORECV").is_none();
    let m = mem.as_ref().unwrap();
    println!("@@ {}", info_line(&qp.info()));
    println!("@@ mr {} {}", m.addr(), m.rkey());
    let cmds = stdin_lines();
    let w = next_line(&cmds);
    assert_eq!(w[0], "info");
    let parent = parse_info(&w[1..]);
    let attr = ConnectAttr {
        access: all_access(),
        ..Default::default()
    };
    qp.connect(&parent, &attr).unwrap();
    if recv {
        for s in 0..SLOTS {
            post(&mut qp, s);
        }
    }
    println!("@@ ready");
    let mut wc = [Wc::default(); 16];
    loop {
        let n = cq.poll(&mut qp, &mut wc).unwrap();
        for c in &wc[..n] {
            let slot = (c.wr_id as usize) % SLOTS;
            let got = &rx.as_slice()[slot * SLOT_BYTES..][..(c.byte_len as usize).min(SLOT_BYTES)];
            println!(
                "@@ wc {} {} {} {} {} {} {}",
                c.wr_id,
                c.status.0,
                c.opcode.0,
                c.byte_len,
                c.imm_data,
                c.src_qp,
                fnv(got)
            );
            if c.status == WcStatus::SUCCESS && recv {
                post(&mut qp, slot);
            }
        }
        while let Ok(Some(ev)) = dev.poll_async_event() {
            println!("@@ event {ev:?}");
        }
        match cmds.try_recv() {
            Ok(l) if l == "dereg" => {
                mem = None;
                println!("@@ dereg");
            }
            Ok(l) if l == "quit" => break,
            Ok(_) => {}
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
        }
    }
    drop(mem);
    dev.backend().stop();
    std::process::exit(0);
}

/// An atomic client: connects one QP to the parent, waits for `go`, then
/// runs `RDD_FABRIC_ADDS` FETCH_AND_ADDs of 1 on the parent's counter,
/// one at a time, and prints every original value it got back.
fn adder() {
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, &QpInit::default()).unwrap();
    let olds = pd.register(8, Access::LOCAL_WRITE).unwrap();
    println!("@@ {}", info_line(&qp.info()));
    let cmds = stdin_lines();
    let w = next_line(&cmds);
    let parent = parse_info(&w[1..]);
    let w = next_line(&cmds);
    assert_eq!(w[0], "mr");
    let remote = rdma_direct::Remote::new(w[1].parse().unwrap(), w[2].parse().unwrap());
    qp.connect(&parent, &ConnectAttr::default()).unwrap();
    println!("@@ ready");
    assert_eq!(next_line(&cmds)[0], "go");
    let adds: u64 = std::env::var("RDD_FABRIC_ADDS").unwrap().parse().unwrap();
    let mut seen = Vec::new();
    let mut wc = [Wc::default(); 4];
    for i in 0..adds {
        let sge = [olds.sge(0, 8)];
        qp.post_send_one(&SendWr::new(
            i,
            SendOp::FetchAdd { remote, add: 1 },
            &sge,
            SendFlags::SIGNALED,
        ))
        .unwrap();
        let t = Instant::now();
        while cq.poll(&mut qp, &mut wc).unwrap() == 0 {
            assert!(t.elapsed() < LINE_WAIT, "atomic {i} never completed");
        }
        assert_eq!(wc[0].status, WcStatus::SUCCESS, "atomic {i}");
        seen.push(olds.load_u64(0).unwrap());
    }
    let line: Vec<String> = seen.iter().map(u64::to_string).collect();
    println!("@@ olds {}", line.join(" "));
    let _ = next_line(&cmds);
    dev.backend().stop();
    std::process::exit(0);
}

/// A responder with two QPs on one SRQ: prints both QPs' `info` lines,
/// reads two from the parent, keeps `SLOTS` receives posted to the SRQ
/// and reports every completion (with the QP it arrived on) until `quit`.
fn srq_target() {
    let dev = Device::new(SoftDevice::new(SoftConfig::fabric()));
    dev.backend().start();
    let pd = dev.alloc_pd().unwrap();
    let mut srq = pd.create_srq(SLOTS as u32, 1).unwrap();
    let init = QpInit {
        srq: Some(srq.id()),
        ..QpInit::default()
    };
    let mut cq = dev.create_cq(1024).unwrap();
    let mut qps: Vec<Qp<SoftDevice>> = (0..2)
        .map(|_| pd.create_qp(&cq, &cq, &init).unwrap())
        .collect();
    let rx = pd
        .register(SLOTS * SLOT_BYTES, Access::LOCAL_WRITE)
        .unwrap();
    for q in &qps {
        println!("@@ {}", info_line(&q.info()));
    }
    let cmds = stdin_lines();
    for q in qps.iter_mut() {
        let w = next_line(&cmds);
        q.connect(&parse_info(&w[1..]), &ConnectAttr::default())
            .unwrap();
    }
    let post = |srq: &mut rdma_direct::api::Srq<SoftDevice>, slot: usize| {
        srq.post_recv_one(&RecvWr {
            wr_id: slot as u64,
            sges: &[rx.sge(slot * SLOT_BYTES, SLOT_BYTES as u32)],
        })
        .unwrap();
    };
    for s in 0..SLOTS {
        post(&mut srq, s);
    }
    println!("@@ ready");
    let mut wc = [Wc::default(); 16];
    loop {
        let n = {
            let mut refs: Vec<&mut Qp<SoftDevice>> = qps.iter_mut().collect();
            cq.poll(&mut srq.route(&mut refs[..]), &mut wc).unwrap()
        };
        for c in &wc[..n] {
            let slot = (c.wr_id as usize) % SLOTS;
            let got = &rx.as_slice()[slot * SLOT_BYTES..][..(c.byte_len as usize).min(SLOT_BYTES)];
            println!(
                "@@ wc {} {} {} {} {} {}",
                c.wr_id,
                c.status.0,
                c.byte_len,
                c.qp_num,
                c.src_qp,
                fnv(got)
            );
            post(&mut srq, slot);
        }
        match cmds.try_recv() {
            Ok(l) if l == "quit" => break,
            Ok(_) => {}
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
        }
    }
    dev.backend().stop();
    std::process::exit(0);
}
