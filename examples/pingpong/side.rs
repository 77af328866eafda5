//! One side of the in-process ping-pong: the payload pattern, the
//! adaptive idle, a QP (RC, or UD with an address handle to the other
//! side) with its receive ring, and the client and server loops.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{Ah, Cq, Mr, Qp, Wc, WcOpcode, WcStatus};
use rdma_direct::completion::wc_flags;
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

use crate::common::ExampleBackend;

/// Receives kept posted on each side.
pub(crate) const RECV_DEPTH: usize = 16;
/// The error of the side that stopped because the other one failed.
pub(crate) const ABORTED: &str = "stopped: the other side failed";
/// Give up if nothing completes for this long.
const STALL: Duration = Duration::from_secs(10);
/// Idle polls spent spinning before the poller starts yielding: long when
/// the client, the server and the device thread each have a core, short
/// when they must share (on 2 cores, spinning 256 polls before yielding
/// made the median 4x worse than spinning 4).
pub(crate) fn spin_budget() -> u32 {
    match thread::available_parallelism().map(|n| n.get()) {
        Ok(n) if n >= 4 => 4096,
        _ => 4,
    }
}

/// Byte `j` of the message of iteration `iter` sent by `side` (0 client,
/// 1 server): the iteration number in the first bytes, a side-dependent
/// pattern after it.
pub(crate) fn pattern_byte(side: u8, iter: u64, j: usize) -> u8 {
    if j < 8 {
        iter.to_le_bytes()[j] ^ side.wrapping_mul(0x5a)
    } else {
        (j as u8)
            .wrapping_mul(31)
            .wrapping_add(side.wrapping_mul(101))
    }
}

/// Writes the iteration stamp (the only part that changes per message).
fn stamp(buf: &mut [u8], side: u8, iter: u64) {
    for (j, b) in buf.iter_mut().enumerate().take(8) {
        *b = pattern_byte(side, iter, j);
    }
}

fn check_payload(buf: &[u8], side: u8, iter: u64) -> Result<(), String> {
    match buf
        .iter()
        .enumerate()
        .find(|&(j, &b)| b != pattern_byte(side, iter, j))
    {
        None => Ok(()),
        Some((j, &b)) => Err(format!(
            "payload mismatch in message {iter} from side {side}: byte {j} is {b:#04x}, \
             expected {:#04x}",
            pattern_byte(side, iter, j)
        )),
    }
}

/// Adaptive idle: spin first, then yield the CPU.
struct Idle {
    budget: u32,
    spins: u32,
    since: Instant,
}

impl Idle {
    fn new(budget: u32) -> Idle {
        Idle {
            budget,
            spins: 0,
            since: Instant::now(),
        }
    }
    fn progress(&mut self) {
        self.spins = 0;
    }
    fn wait(&mut self, abort: &AtomicBool) -> Result<(), String> {
        self.spins += 1;
        if self.spins < self.budget {
            spin_loop();
            return Ok(());
        }
        if self.spins == self.budget {
            self.since = Instant::now();
        }
        if abort.load(Ordering::Relaxed) {
            return Err(ABORTED.into());
        }
        if self.since.elapsed() > STALL {
            return Err(format!("no completion for {STALL:?}"));
        }
        thread::yield_now();
        Ok(())
    }
}

/// Bytes at the head of every UD receive buffer where the device puts the
/// global routing header (`struct ibv_grh`), whether the datagram has one
/// or not; the payload follows.
pub(crate) const GRH_BYTES: usize = 40;

/// The Q_Key of the UD QPs (`ibv_ud_pingpong`'s).
pub(crate) const UD_QKEY: u32 = 0x1111_1111;

/// Where a UD side sends: the other side's QP through an address handle.
pub(crate) struct UdPeer<B: ExampleBackend> {
    pub(crate) ah: Ah<B>,
    pub(crate) qpn: u32,
}

/// One side of the ping-pong: a QP, its CQ, a receive ring and a send
/// buffer.
pub(crate) struct Side<B: ExampleBackend> {
    pub(crate) id: u8,
    pub(crate) qp: Qp<B>,
    pub(crate) cq: Cq<B>,
    pub(crate) recv: Mr<B>,
    pub(crate) send: Mr<B>,
    pub(crate) size: usize,
    pub(crate) inline: bool,
    pub(crate) sends_posted: u64,
    pub(crate) sends_done: u64,
    /// Idle budget (see [`spin_budget`]).
    pub(crate) spin: u32,
    /// UD: the other side (`None`: RC).
    pub(crate) ud: Option<UdPeer<B>>,
}

impl<B: ExampleBackend> Side<B> {
    /// Bytes before the payload in a receive buffer: the GRH area on UD.
    fn head(&self) -> usize {
        if self.ud.is_some() {
            GRH_BYTES
        } else {
            0
        }
    }

    /// Bytes of one receive buffer of the ring.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.head() + self.size
    }

    pub(crate) fn post_recv_slot(&mut self, slot: usize) -> Result<(), String> {
        let n = self.slot_bytes();
        let sge = [self.recv.sge(slot * n, n as u32)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: slot as u64,
                sges: &sge,
            }])
            .map_err(|e| format!("post_recv: {e}"))
    }

    /// Stamps and sends the message of iteration `iter`.
    fn send(&mut self, iter: u64) -> Result<(), String> {
        let size = self.size;
        stamp(&mut self.send.as_mut_slice()[..size], self.id, iter);
        let sge = [self.send.sge(0, size as u32)];
        let data: [&[u8]; 1] = [&self.send.as_slice()[..size]];
        let wr = if self.inline {
            SendWr::inline(iter, SendOp::Send, &data, SendFlags::SIGNALED)
        } else {
            SendWr::new(iter, SendOp::Send, &sge, SendFlags::SIGNALED)
        };
        match &self.ud {
            None => self.qp.post_send_one(&wr),
            Some(p) => self.qp.post_send_ud(&wr, &p.ah, p.qpn, UD_QKEY),
        }
        .map_err(|e| format!("post_send: {e}"))?;
        self.sends_posted += 1;
        Ok(())
    }

    /// Polls until one receive completes; returns its ring slot. Send
    /// completions met on the way are checked and counted.
    fn wait_recv(&mut self, abort: &AtomicBool) -> Result<usize, String> {
        let mut wc = [Wc::default(); 4];
        let mut idle = Idle::new(self.spin);
        let mut got = None;
        loop {
            let n = self
                .cq
                .poll(&mut self.qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            for w in &wc[..n] {
                if w.status != WcStatus::SUCCESS {
                    return Err(format!(
                        "completion wr_id {} opcode {:?} failed: status {:?}, syndrome {:#x}",
                        w.wr_id, w.opcode, w.status, w.vendor_err
                    ));
                }
                if w.opcode == WcOpcode::RECV {
                    if got.is_some() {
                        return Err("two receives completed for one message".into());
                    }
                    // UD receives count the GRH area too.
                    if w.byte_len as usize != self.slot_bytes() {
                        return Err(format!(
                            "received {} bytes, expected {}",
                            w.byte_len,
                            self.slot_bytes()
                        ));
                    }
                    if let Some(p) = &self.ud {
                        let grh = w.wc_flags & wc_flags::GRH != 0;
                        if w.src_qp != p.qpn || grh != p.ah.is_global() {
                            return Err(format!(
                                "datagram from QP {:#x} (GRH {grh}), expected QP {:#x} \
                                 (GRH {})",
                                w.src_qp,
                                p.qpn,
                                p.ah.is_global()
                            ));
                        }
                    }
                    got = Some(w.wr_id as usize);
                } else if w.opcode == WcOpcode::SEND {
                    if w.wr_id != self.sends_done {
                        return Err(format!(
                            "send {} completed, expected {}",
                            w.wr_id, self.sends_done
                        ));
                    }
                    self.sends_done += 1;
                } else {
                    return Err(format!("unexpected completion opcode {:?}", w.opcode));
                }
            }
            if let Some(slot) = got {
                return Ok(slot);
            }
            if n > 0 {
                idle.progress();
            } else {
                idle.wait(abort)?;
            }
        }
    }

    /// Checks the received message in `slot` and gives the slot back to
    /// the receive queue.
    fn consume(&mut self, slot: usize, from: u8, iter: u64) -> Result<(), String> {
        let at = slot * self.slot_bytes() + self.head();
        check_payload(&self.recv.as_slice()[at..at + self.size], from, iter)?;
        self.post_recv_slot(slot)
    }
}

pub(crate) fn run_client<B: ExampleBackend>(
    mut s: Side<B>,
    total: usize,
    warmup: usize,
    abort: &AtomicBool,
) -> Result<Vec<u64>, String> {
    let mut rtt_ns = Vec::with_capacity(total - warmup);
    let mut next_slot = 0usize;
    for i in 0..total as u64 {
        let t0 = Instant::now();
        s.send(i)?;
        let slot = s.wait_recv(abort)?;
        let dt = t0.elapsed();
        if slot != next_slot {
            return Err(format!(
                "receive slot {slot} completed, expected {next_slot}"
            ));
        }
        next_slot = (next_slot + 1) % RECV_DEPTH;
        if i as usize >= warmup {
            rtt_ns.push(dt.as_nanos() as u64);
        }
        s.consume(slot, 1, i)?;
    }
    // On the software HCA the reply's CQE follows our send's CQE, so this
    // finds nothing to wait for; a kernel device may report the send's
    // acknowledgement after the reply has arrived.
    s.drain_sends(abort)?;
    Ok(rtt_ns)
}

pub(crate) fn run_server<B: ExampleBackend>(
    mut s: Side<B>,
    total: usize,
    abort: &AtomicBool,
) -> Result<(), String> {
    for i in 0..total as u64 {
        let slot = s.wait_recv(abort)?;
        // Answer first, check afterwards: the check is off the round trip.
        s.send(i)?;
        s.consume(slot, 0, i)?;
    }
    // Wait for the last reply's send completion.
    s.drain_sends(abort)
}

impl<B: ExampleBackend> Side<B> {
    /// Waits until every posted send has completed.
    fn drain_sends(&mut self, abort: &AtomicBool) -> Result<(), String> {
        let mut wc = [Wc::default(); 4];
        let mut idle = Idle::new(self.spin);
        while self.sends_done < self.sends_posted {
            let n = self
                .cq
                .poll(&mut self.qp, &mut wc)
                .map_err(|e| format!("poll: {e}"))?;
            for w in &wc[..n] {
                if w.status != WcStatus::SUCCESS || w.opcode != WcOpcode::SEND {
                    return Err(format!("unexpected final completion {w:?}"));
                }
                self.sends_done += 1;
            }
            if n == 0 {
                idle.wait(abort)?;
            }
        }
        Ok(())
    }
}
