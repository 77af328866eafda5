use std::hint::spin_loop;
use std::time::{Duration, Instant};

use rdma_direct::api::{
    Access, AddressVector, Ah, AhInit, Backend, ConnectAttr, Device, PortInfo, Qp, QpInfo, QpInit,
    Transport, Wc, WcStatus,
};
use rdma_direct::verbs::VerbsDevice;
use rdma_direct::{RecvWr, SendFlags, SendOp, SendWr};

use super::args::{Args, RcArgs};
use super::common::oob::{self, address_line};
use super::common::{err, status_name, ExampleBackend};
use super::side::{GRH_BYTES, UD_QKEY};

type Dev = VerbsDevice;

/// `ibv_rc_pingpong`'s work-request ids, used as bits of `pending`.
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// No completion for this long is an error (`ibv_rc_pingpong` would
/// wait forever).
const STALL: Duration = Duration::from_secs(20);

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Why this mode cannot run on `dev`, if it cannot.
pub fn cannot_run(dev: &Device<Dev>, ud: bool) -> Option<String> {
    let name = dev.backend().name();
    (dev.backend().port().transport == Transport::Iwarp).then(|| {
        if ud {
            format!("{name} is an iWARP device: iWARP has no unreliable datagrams")
        } else {
            format!(
                "{name} is an iWARP device: its QPs connect only through rdma_cm, never with \
                 ibv_rc_pingpong's out-of-band exchange (use the in-process mode, or rping)"
            )
        }
    })
}

/// `ibv_ud_pingpong`'s address handle to `remote`: by LID, and through a
/// GRH (hop limit 1, from our GID index) when the remote sent a GID with a
/// non-zero interface ID.
fn ud_ah_init(remote: &QpInfo, port: &PortInfo) -> AhInit {
    AhInit {
        port_num: 0,
        dest: AddressVector {
            dlid: remote.lid,
            is_global: remote.gid[8..] != [0; 8],
            dgid: remote.gid,
            sgid_index: port.gid_index,
            hop_limit: 1,
            ..AddressVector::default()
        },
    }
}

pub fn run(dev: &Device<Dev>, args: &Args, rc: &RcArgs) -> Result<(), super::Failed> {
    let e = |what: &'static str| err::<Dev>(what);
    let port = dev.backend().port();
    let ud = args.ud;
    if let Some(why) = cannot_run(dev, ud) {
        return Err(super::Failed::NotRun(why));
    }
    let size = args.size;
    if ud && size > port.mtu as usize {
        return Err(format!("Requested size larger than port MTU ({})", port.mtu).into());
    }
    // UD receives start with the GRH area; sends come from after it.
    let head = if ud { GRH_BYTES } else { 0 };
    let rx_depth = rc.rx_depth;
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    // One buffer for sends and receives, as ibv_rc_pingpong and
    // ibv_ud_pingpong.
    let mut buf = pd
        .register(head + size, Access::LOCAL_WRITE)
        .map_err(e("register"))?;
    buf.as_mut_slice().fill(0x7b);
    let init = QpInit {
        max_send_wr: 1,
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        srq: None,
    };
    // rx_depth + 1 entries, as ibv_rc_pingpong, or more if the device
    // rounds the queues up (the CQ guard counts what they can hold).
    let depth = dev.cq_depth_for(&[&init]).max(rx_depth + 1);
    let mut cq = dev.create_cq(depth).map_err(e("create_cq"))?;
    let mut qp = if ud {
        pd.create_ud_qp(&cq, &cq, &init)
            .map_err(super::no_ud::<Dev>)?
    } else {
        pd.create_qp(&cq, &cq, &init).map_err(e("create_qp"))?
    };
    let inline = qp.caps().max_inline_data as usize >= size;
    let attr = ConnectAttr {
        max_mtu: rc.mtu,
        gid_index: Some(port.gid_index),
        ..ConnectAttr::default()
    };
    let local = qp.info();
    // INIT (no remote access: SEND only; UD: ready at once with the
    // Q_Key, it has no peer), then the receives, before the exchange: the
    // peer may send as soon as it has our address.
    if ud {
        qp.ready_ud(UD_QKEY).map_err(e("ready_ud"))?;
    } else {
        let [to_init, _, _] = qp.connect_steps(&local, &attr);
        qp.modify(&to_init).map_err(e("modify to INIT"))?;
    }
    let recv_sge = [buf.sge(0, (head + size) as u32)];
    let recvs: Vec<RecvWr> = (0..rx_depth)
        .map(|_| RecvWr {
            wr_id: RECV_WRID,
            sges: &recv_sge,
        })
        .collect();
    qp.post_recv(&recvs)
        .map_err(|p| format!("post_recv: {p}{}", Dev::detail()))?;
    let mut routs = rx_depth;
    println!("{}", address_line("local address: ", &local));

    // RTR and RTS towards `remote`. Its message carries no MTU: both
    // sides use --mtu (capped by the port's active MTU). UD: the address
    // handle to it.
    let mut ah: Option<Ah<Dev>> = None;
    let mut to_rts = |remote: &QpInfo| -> rdma_direct::Result<()> {
        if ud {
            ah = Some(pd.create_ah(&ud_ah_init(remote, &port))?);
            return Ok(());
        }
        let remote = QpInfo {
            mtu: rc.mtu,
            ..*remote
        };
        let [_, rtr, rts] = qp.connect_steps(&remote, &attr);
        qp.modify(&rtr)?;
        qp.modify(&rts)
    };
    let remote = match &rc.connect {
        None => {
            let mut c = oob::accept(rc.port, rc.timeout)?;
            c.server_exchange(&local, |r| to_rts(r))
                .map_err(|x| format!("address exchange: {x}{}", Dev::detail()))?
        }
        Some(host) => {
            let mut c = oob::connect(host, rc.port, rc.timeout, "pingpong")?;
            let r = c
                .client_exchange(&local)
                .map_err(|x| format!("address exchange: {x}"))?;
            drop(c);
            to_rts(&r).map_err(|x| format!("connect QP: {x}{}", Dev::detail()))?;
            r
        }
    };
    println!("{}", address_line("remote address:", &remote));

    if rc.chk && rc.connect.is_some() {
        // ibv_rc_pingpong -c: byte 0 of every page becomes 0.
        for b in buf.as_mut_slice().iter_mut().step_by(page_size()) {
            *b = 0;
        }
    }
    let iters = args.iters as u64;
    if ud && ah.is_none() {
        return Err(String::from("no address handle to the remote QP").into());
    }
    let send_sge = [buf.sge(head, size as u32)];
    let data: [&[u8]; 1] = [&buf.as_slice()[head..head + size]];
    let send = if inline {
        SendWr::inline(SEND_WRID, SendOp::Send, &data, SendFlags::SIGNALED)
    } else {
        SendWr::new(SEND_WRID, SendOp::Send, &send_sge, SendFlags::SIGNALED)
    };
    let post_send = |qp: &mut Qp<Dev>| {
        match &ah {
            Some(a) => qp.post_send_ud(&send, a, remote.qpn, UD_QKEY),
            None => qp.post_send_one(&send),
        }
        .map_err(|x| format!("Couldn't post send: {x}{}", Dev::detail()))
    };

    let mut pending = RECV_WRID;
    if rc.connect.is_some() {
        post_send(&mut qp)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wc = [Wc::default(); 2];
    let mut last = Instant::now();
    let mut idle = 0u32;
    while rcnt < iters || scnt < iters {
        let n = cq
            .poll(&mut qp, &mut wc)
            .map_err(|x| format!("poll CQ: {x}{}", Dev::detail()))?;
        if n == 0 {
            idle = idle.wrapping_add(1);
            if idle % 1024 == 0 && last.elapsed() > STALL {
                return Err(format!(
                    "no completion for {STALL:?} ({rcnt} received, {scnt} sent of {iters})"
                )
                .into());
            }
            // Spin, but let a software device (rxe, siw) sharing
            // the CPU run now and then.
            if idle % 64 == 0 {
                std::thread::yield_now();
            } else {
                spin_loop();
            }
            continue;
        }
        last = Instant::now();
        for w in &wc[..n] {
            if w.status != WcStatus::SUCCESS {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    status_name(w.status),
                    w.status.0,
                    w.wr_id
                )
                .into());
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs = routs.saturating_sub(1);
                    if routs <= 1 {
                        let more = (rx_depth - routs) as usize;
                        qp.post_recv(&recvs[..more])
                            .map_err(|x| format!("Couldn't post receive: {x}{}", Dev::detail()))?;
                        routs = rx_depth;
                    }
                    rcnt += 1;
                }
                other => {
                    return Err(format!("Completion for unknown wr_id {other}").into());
                }
            }
            pending &= !w.wr_id;
            if scnt < iters && pending == 0 {
                post_send(&mut qp)?;
                pending = RECV_WRID | SEND_WRID;
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
    if rc.chk && rc.connect.is_none() {
        let page = page_size();
        let bad: Vec<usize> = buf
            .as_slice()
            .iter()
            .step_by(page)
            .enumerate()
            .filter(|&(_, &b)| b != 0)
            .map(|(i, _)| i)
            .collect();
        for p in &bad {
            println!("invalid data in page {p}");
        }
        if !bad.is_empty() {
            return Err(format!("--chk: {} page(s) with invalid data", bad.len()).into());
        }
    }
    Ok(())
}
