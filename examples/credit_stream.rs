//! A fast sender and a deliberately slow receiver on the software HCA,
//! first without flow control, then through `rdma_direct::credit`.
//!
//! The receiver takes at most `--batch` messages every `--period-us`
//! microseconds and re-posts a buffer only once its message is taken. The
//! QPs use a small RNR retry count (`rnr_retry = 1`), as a deployment that
//! wants to notice a stuck peer would.
//!
//! - Without flow control, the sender's SENDs outrun the posted receives.
//!   The RNR NAKs exhaust the retries and the QP fails with
//!   `RNR_RETRY_EXC_ERR`.
//! - With [`CreditQp`], the sender waits for credits instead, and the
//!   stream completes: every message arrives once, in order, intact. The
//!   receiver returns credits in explicit credit-only messages, because
//!   nothing flows back to carry them.
//!
//! Run: `cargo run --release --example credit_stream [-- --count N
//! --window W --batch B --period-us P]` (defaults: 5000 messages, a window
//! of 16, 8 messages per 500 µs). Exits non-zero if the run with credits
//! sees any error or a bad message.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::credit::{CreditConfig, CreditQp};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

const MSG: usize = 64;

struct Opts {
    count: u64,
    window: u32,
    batch: usize,
    period: Duration,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        count: 5000,
        window: 16,
        batch: 8,
        period: Duration::from_micros(500),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{a} needs a number"))
        };
        match a.as_str() {
            "--count" => o.count = val()?,
            "--window" => o.window = u32::try_from(val()?).map_err(|e| e.to_string())?,
            "--batch" => o.batch = val()? as usize,
            "--period-us" => o.period = Duration::from_micros(val()?),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.window < 3 || o.batch == 0 {
        return Err("--window must be at least 3 and --batch at least 1".into());
    }
    Ok(o)
}

/// Message `seq`: its number, then a pattern.
fn fill(seq: u64, buf: &mut [u8]) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[8..].iter_mut().enumerate() {
        *b = (seq as u8) ^ (i as u8);
    }
}

type Side = (Qp<SoftDevice>, Cq<SoftDevice>);

fn connected() -> (Device<SoftDevice>, Pd<SoftDevice>, Side, Side) {
    let dev = Device::new(SoftDevice::new(SoftConfig {
        rnr_delay: Duration::from_micros(50),
        ..SoftConfig::default()
    }));
    dev.backend().start();
    let pd = dev.alloc_pd().expect("pd");
    let init = QpInit::default();
    let depth = dev.cq_depth_for(&[&init]);
    let cqa = dev.create_cq(depth).expect("cq");
    let cqb = dev.create_cq(depth).expect("cq");
    let mut a = pd.create_qp(&cqa, &cqa, &init).expect("qp");
    let mut b = pd.create_qp(&cqb, &cqb, &init).expect("qp");
    let attr = ConnectAttr {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    };
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &attr).expect("connect");
    b.connect(&ia, &attr).expect("connect");
    (dev, pd, (a, cqa), (b, cqb))
}

/// Plain SEND/RECV: returns (messages delivered, status of the first failure).
fn without_flow_control(o: &Opts) -> (u64, Option<WcStatus>) {
    let (_dev, pd, (mut a, mut cqa), (mut b, mut cqb)) = connected();
    let src = pd.register(MSG, Access::NONE).expect("mr");
    let dst = pd
        .register(o.window as usize * MSG, Access::LOCAL_WRITE)
        .expect("mr");
    let post = |b: &mut Qp<SoftDevice>, slot: u64| {
        let sges = [dst.sge(slot as usize * MSG, MSG as u32)];
        b.post_recv(&[RecvWr {
            wr_id: slot,
            sges: &sges,
        }])
        .expect("post_recv");
    };
    for slot in 0..u64::from(o.window) {
        post(&mut b, slot);
    }
    let (mut posted, mut completed, mut failure) = (0u64, 0u64, None);
    let mut delivered = 0u64;
    let mut consumed = Vec::new();
    let mut wc = [Wc::default(); 64];
    let mut next_batch = Instant::now() + o.period;
    while completed < posted || (posted < o.count && failure.is_none()) {
        if failure.is_none() && posted < o.count {
            let sges = [src.sge(0, MSG as u32)];
            let wr = SendWr::new(posted, SendOp::Send, &sges, SendFlags::SIGNALED);
            if a.post_send_one(&wr).is_ok() {
                posted += 1;
            }
        }
        let n = cqa.poll(&mut a, &mut wc).expect("poll");
        for w in &wc[..n] {
            completed += 1;
            if w.status != WcStatus::SUCCESS && failure.is_none() {
                failure = Some(w.status);
            }
        }
        // The slow receiver, in the same thread: a batch per period.
        if Instant::now() >= next_batch {
            next_batch += o.period;
            let n = cqb.poll(&mut b, &mut wc).expect("poll");
            for w in &wc[..n] {
                if w.status == WcStatus::SUCCESS {
                    delivered += 1;
                    consumed.push(w.wr_id);
                }
            }
            if b.state() != QpState::Error {
                let k = consumed.len().min(o.batch);
                for slot in consumed.drain(..k) {
                    post(&mut b, slot);
                }
            }
        }
    }
    (delivered, failure)
}

fn with_credits(o: &Opts) -> Result<(Duration, rdma_direct::credit::CreditStats), String> {
    let (_dev, pd, (a, cqa), (b, cqb)) = connected();
    let cfg = CreditConfig {
        recv_depth: o.window,
        msg_size: MSG as u32,
        send_slots: 16,
        ..CreditConfig::default()
    };
    let mut a = CreditQp::new(&pd, a, cqa, &cfg).map_err(|e| e.to_string())?;
    let mut b = CreditQp::new(&pd, b, cqb, &cfg).map_err(|e| e.to_string())?;
    let (ia, ib) = (a.info(), b.info());
    a.set_peer(&ib).map_err(|e| e.to_string())?;
    b.set_peer(&ia).map_err(|e| e.to_string())?;
    let (count, batch, period) = (o.count, o.batch, o.period);
    let start = Instant::now();
    let receiver = thread::spawn(move || -> Result<CreditQp<SoftDevice>, String> {
        let mut want = [0u8; MSG];
        let mut next = 0u64;
        let mut bad = None;
        while next < count {
            thread::sleep(period);
            b.recv(batch, |msg| {
                fill(next, &mut want);
                if msg != want && bad.is_none() {
                    bad = Some(next);
                }
                next += 1;
            })
            .map_err(|e| format!("recv: {e} ({:?})", b.failure()))?;
        }
        match bad {
            Some(s) => Err(format!("message {s} arrived damaged or out of order")),
            None => Ok(b),
        }
    });
    let mut buf = [0u8; MSG];
    for seq in 0..count {
        fill(seq, &mut buf);
        a.send_wait(&buf, Duration::from_secs(30))
            .map_err(|e| format!("send {seq}: {e} ({:?})", a.failure()))?;
    }
    let b = receiver
        .join()
        .map_err(|_| "receiver panicked".to_string())??;
    let took = start.elapsed();
    if a.failure().is_some() || b.failure().is_some() {
        return Err(format!("failures: {:?} {:?}", a.failure(), b.failure()));
    }
    let sa = a.stats();
    let sb = b.stats();
    println!(
        "  sender:   {} sent, refused for lack of credit {} times, {} credits received",
        sa.sent, sa.no_credit, sa.credits_received
    );
    println!(
        "  receiver: {} received, {} credit-only messages returning {} credits",
        sb.received, sb.credit_msgs_sent, sb.granted_explicit
    );
    Ok((took, sb))
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("credit_stream: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "{} messages of {MSG} bytes; receiver window {}, takes {} every {:?}; rnr_retry 1",
        o.count, o.window, o.batch, o.period
    );
    let (delivered, failure) = without_flow_control(&o);
    match failure {
        Some(s) => println!(
            "without flow control: QP failed with {s:?} after {delivered} of {} messages\n  ({})",
            o.count,
            rdma_direct::wr::status_causes(s)
        ),
        None => {
            println!("without flow control: all {delivered} delivered (receiver kept up this time)")
        }
    }
    match with_credits(&o) {
        Ok((took, sb)) => {
            println!(
                "with credits: all {} delivered in order, no RNR, in {:.1} ms",
                sb.received,
                took.as_secs_f64() * 1e3
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("with credits: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
