//! The two-process mode (`--server` / `--connect HOST`, verbs only),
//! wire-compatible with rdma-core's `ibv_srq_pingpong`: either side can be
//! that tool.
//!
//! What the tool does, and so what this does:
//! * `--num-qp` RC QPs per side (default 16), one CQ, one SRQ of
//!   `--rx-depth` receives (default 500) of one `--size`-byte buffer (the
//!   same buffer for every receive and every send, zeroed, as the tool's);
//! * the exchange over TCP: each side sends 256 address messages (the
//!   tool's `MAX_QP`; the ones past `--num-qp` all zeros), the client
//!   first, the server after its QPs are at RTS; the client ends with
//!   `"done"`;
//! * the client starts with one SEND on every QP; a side sends on a QP
//!   again once that QP's previous send has completed and a message has
//!   arrived on it; receives are refilled when only `--num-qp` are left;
//!   the run ends when `--iters` messages have gone each way in total
//!   (over all QPs together, as the tool counts);
//! * output: the address lines, then bytes / seconds / Mbit/sec and iters
//!   / seconds / usec/iter, as the tool prints them.
//!
//! Every completion must succeed and name one of our QPs; every wait is
//! bounded (`--timeout` for the exchange, no completion for 20 s is an
//! error).

use std::hint::spin_loop;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, Backend, ConnectAttr, Device, Qp, QpInfo, QpInit, Transport, Wc, WcStatus,
};
use rdma_direct::verbs::VerbsDevice;
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

use super::common::oob::{self, address_line};
use super::common::{err, status_name, ExampleBackend};
use super::{Args, Outcome, WireArgs, MAX_QP};

type Dev = VerbsDevice;

/// `ibv_srq_pingpong`'s work-request ids, used as bits of `pending`.
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// No completion for this long is an error (the tool would wait forever).
const STALL: Duration = Duration::from_secs(20);

pub(super) fn run(dev: &Device<Dev>, args: &Args, w: &WireArgs) -> Result<Outcome, String> {
    let e = |what: &'static str| err::<Dev>(what);
    let port = dev.backend().port();
    if port.transport == Transport::Iwarp {
        return Ok(Outcome::NotRun(format!(
            "{} is an iWARP device: its QPs connect only through rdma_cm, never with \
             ibv_srq_pingpong's out-of-band exchange (use the in-process mode)",
            dev.backend().name()
        )));
    }
    let (size, nqp) = (args.size, w.num_qp);
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let mut srq = match pd.create_srq(w.rx_depth, 1) {
        Ok(s) => s,
        Err(Error::Unsupported) => {
            return Ok(Outcome::NotRun(format!(
                "{} (this data path) has no shared receive queues (the mlx5 direct path has \
                 none: run with RDMA_DIRECT_DATA_PATH=fallback)",
                dev.backend().name()
            )))
        }
        Err(x) => return Err(e("create_srq")(x)),
    };
    let buf = pd
        .register(size, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    let init = QpInit {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: Some(srq.id()),
    };
    // rx_depth + num_qp entries, as the tool, or more if the device rounds
    // the queues up (the CQ guard counts what they can hold).
    let depth = (dev.cq_depth_for(&vec![&init; nqp]) + srq.max_wr()).max(w.rx_depth + nqp as u32);
    let mut cq = dev.create_cq(depth).map_err(e("create_cq"))?;
    let attr = ConnectAttr {
        max_mtu: w.mtu,
        gid_index: Some(port.gid_index),
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectAttr::default()
    };
    let mut qps = Vec::with_capacity(nqp);
    let mut local = [QpInfo::default(); MAX_QP];
    for slot in local.iter_mut().take(nqp) {
        let mut qp = pd
            .create_qp(&cq, &cq, &init)
            .map_err(e("create_qp on the SRQ"))?;
        *slot = qp.info();
        let [to_init, _, _] = qp.connect_steps(slot, &attr);
        qp.modify(&to_init).map_err(e("modify to INIT"))?;
        qps.push(qp);
    }
    // The receives, before the exchange: the peer may send as soon as it
    // has our addresses.
    let sge = [buf.sge(0, size as u32)];
    let recvs: Vec<RecvWr> = (0..w.rx_depth)
        .map(|_| RecvWr {
            wr_id: RECV_WRID,
            sges: &sge,
        })
        .collect();
    srq.post_recv(&recvs)
        .map_err(|p| format!("srq post_recv: {p}{}", Dev::detail()))?;
    let mut routs = w.rx_depth;
    for l in &local[..nqp] {
        println!("{}", address_line("local address: ", l));
    }

    // RTR and RTS of every QP towards its remote. The messages carry no
    // MTU: both sides use --mtu (capped by the port's active MTU).
    let connect_all = |qps: &mut [Qp<Dev>], remote: &[QpInfo]| -> Result<(), String> {
        for (i, (qp, r)) in qps.iter_mut().zip(remote).enumerate() {
            let r = QpInfo { mtu: w.mtu, ..*r };
            let [_, rtr, rts] = qp.connect_steps(&r, &attr);
            qp.modify(&rtr)
                .and_then(|_| qp.modify(&rts))
                .map_err(|x| format!("connect QP[{i}]: {x}{}", Dev::detail()))?;
        }
        Ok(())
    };
    let mut remote = [QpInfo::default(); MAX_QP];
    let exchange = |x: rdma_direct::Error| format!("address exchange: {x}{}", Dev::detail());
    match &w.connect {
        None => {
            let mut c = oob::accept(w.port, w.timeout)?;
            for r in remote.iter_mut() {
                *r = c.recv_qp().map_err(exchange)?;
            }
            connect_all(&mut qps, &remote[..nqp])?;
            for l in &local {
                c.send_qp(l).map_err(exchange)?;
            }
            c.recv_done().map_err(exchange)?;
        }
        Some(host) => {
            let mut c = oob::connect(host, w.port, w.timeout, "srq_server")?;
            for l in &local {
                c.send_qp(l).map_err(exchange)?;
            }
            for r in remote.iter_mut() {
                *r = c.recv_qp().map_err(exchange)?;
            }
            c.send_done().map_err(exchange)?;
            drop(c);
            connect_all(&mut qps, &remote[..nqp])?;
        }
    }
    for r in &remote[..nqp] {
        println!("{}", address_line("remote address:", r));
    }

    let send_sge = [buf.sge(0, size as u32)];
    let send = SendWr::new(SEND_WRID, SendOp::Send, &send_sge, SendFlags::SIGNALED);
    let post_send = |qp: &mut Qp<Dev>| {
        qp.post_send_one(&send)
            .map_err(|x| format!("Couldn't post send: {x}{}", Dev::detail()))
    };
    let mut pending = vec![RECV_WRID; nqp];
    if w.connect.is_some() {
        for (qp, p) in qps.iter_mut().zip(pending.iter_mut()) {
            post_send(qp)?;
            *p |= SEND_WRID;
        }
    }
    let by_qpn: std::collections::HashMap<u32, usize> =
        qps.iter().enumerate().map(|(i, q)| (q.qpn(), i)).collect();
    let iters = w.iters;
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wc = vec![Wc::default(); nqp + w.rx_depth as usize];
    let mut last = Instant::now();
    let mut idle = 0u32;
    while rcnt < iters || scnt < iters {
        let n = {
            let mut refs: Vec<&mut Qp<Dev>> = qps.iter_mut().collect();
            cq.poll(&mut srq.route(&mut refs[..]), &mut wc)
                .map_err(|x| format!("poll CQ: {x}{}", Dev::detail()))?
        };
        if n == 0 {
            idle = idle.wrapping_add(1);
            if idle % 1024 == 0 && last.elapsed() > STALL {
                return Err(format!(
                    "no completion for {STALL:?} ({rcnt} received, {scnt} sent of {iters})"
                ));
            }
            // Spin, but let a software device (rxe) sharing the CPU run
            // now and then.
            if idle % 64 == 0 {
                std::thread::yield_now();
            } else {
                spin_loop();
            }
            continue;
        }
        last = Instant::now();
        for c in &wc[..n] {
            if c.status != WcStatus::SUCCESS {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    status_name(c.status),
                    c.status.0,
                    c.wr_id
                ));
            }
            let Some(&qi) = by_qpn.get(&c.qp_num) else {
                return Err(format!("Couldn't find QPN {:06x}", c.qp_num));
            };
            match c.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs = routs.saturating_sub(1);
                    if routs <= nqp as u32 {
                        let more = (w.rx_depth - routs) as usize;
                        srq.post_recv(&recvs[..more])
                            .map_err(|x| format!("Couldn't post receive: {x}{}", Dev::detail()))?;
                        routs = w.rx_depth;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[qi] &= !c.wr_id;
            if scnt < iters && pending[qi] == 0 {
                post_send(&mut qps[qi])?;
                pending[qi] = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = (start.elapsed().as_secs_f64() * 1e6).max(1.0);
    let bytes = size as u64 * iters * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / iters as f64
    );
    drop(qps);
    Ok(Outcome::Ok)
}
