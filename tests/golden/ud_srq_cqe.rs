//! The completion cases of `ud-srq-golden.txt` (UD and SRQ responder and
//! error CQEs, a UD requester CQE); part of `tests/golden_ud_srq.rs`.

use super::parse::{read_recv_wr, Case, Field};
use super::send::{address_handles, post_ud, read_ud_wr, ud_queue};
use super::wc::wc_field;
use super::*;
// ---------------------------------------------------------------- CQEs

/// One QP, maybe on an SRQ: the route of the CQ.
struct Route {
    sq: SendQueue,
    rq: RecvQueue,
    srq: Option<Srq>,
    cqe_v1: bool,
    uidx: u32,
}

impl CqRoute for Route {
    fn route(&mut self, qpn: u32) -> Option<QpQueues<'_>> {
        (qpn == self.sq.qpn()).then_some(QpQueues {
            sq: &mut self.sq,
            rq: &mut self.rq,
        })
    }
    fn srq_for(&mut self, qpn: u32, srqn_uidx: u32) -> Option<&mut Srq> {
        if qpn != self.sq.qpn() {
            return None;
        }
        let srq = self.srq.as_mut()?;
        // Version 1: the QP's user index names the QP, whose SRQ it is;
        // version 0: the SRQ number (docs/spec/mlx5.md §11).
        let ok = if self.cqe_v1 {
            srqn_uidx == self.uidx
        } else {
            srqn_uidx == srq.srqn()
        };
        ok.then_some(srq)
    }
}

const WC_FIELDS: &[&str] = &[
    "wr_id",
    "status",
    "opcode",
    "vendor_err",
    "byte_len",
    "imm_data",
    "qp_num",
    "src_qp",
    "wc_flags",
    "pkey_index",
    "slid",
    "sl",
    "dlid_path_bits",
];

/// A RESP_SEND CQE for SRQ WQE `counter` (the setup completions).
fn resp_send_cqe(qpn: u32, counter: u16, srqn_uidx: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[32..36].copy_from_slice(&srqn_uidx.to_be_bytes());
    c[56..60].copy_from_slice(&qpn.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = 0x20;
    c
}

pub(crate) fn run_cqe(case: &Case, p: u8) -> Vec<String> {
    let mut run = Run::new(case, p);
    let qpn = case.u32("qpn");
    let ud = match case.str("qp_type") {
        "UD" => true,
        "RC" => false,
        t => panic!("qp_type {t}"),
    };
    let v1 = case.num("cqe_version") == 1;
    let on_srq = case.opt_num("srq") == Some(1);
    let cq_cnt = case.u32("cq_cqe_cnt");
    let (rq_cnt, rq_sge) = if on_srq {
        (16, 1)
    } else {
        (case.u32("rq_wqe_cnt"), case.u32("max_recv_sge"))
    };
    let geo = FakeGeometry {
        sq_wqe_cnt: case.u32("sq_wqe_cnt"),
        rq_wqe_cnt: rq_cnt,
        rq_stride: (16 * rq_sge).next_power_of_two(),
        cqe_cnt: cq_cnt,
        cqe_size: case.u32("cq_cqe_size"),
        qpn,
        ..FakeGeometry::default()
    };
    let mut f = FakeMlx5::new(geo);
    let caps = QpCaps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: rq_sge,
    };
    let cfg = SqConfig {
        sig_all: case.flag("sq_sig_all"),
        ..SqConfig::default()
    };
    let mut sq = if ud {
        ud_queue(&mut f, caps, cfg)
    } else {
        f.send_queue(caps, cfg).expect("sq")
    };
    let mut rq = f.recv_queue(caps).expect("rq");
    let sq_pi = case.u32("sq_pi");
    sq.reset_counters(sq_pi);
    let sq_tail = case.num("sq_tail");
    let avs = address_handles(&mut run);
    let nsq = case.num("nsq") as usize;
    run.eq("sq indices", case.indices("sq"), (0..nsq as u64).collect());
    let mut sq_ends = Vec::new();
    for i in 0..nsq {
        let w = read_ud_wr(case, &format!("sq.{i}"));
        assert!(
            ud,
            "[{}] send WRs on an RC QP are not in this file",
            case.name
        );
        let start = sq.producer();
        post_ud(case, &mut sq, &w, &avs).expect("sq post");
        sq.ring();
        let k = |s: &str| case.num(&format!("sq.{i}.{s}"));
        run.eq(
            &format!("sq.{i}.wqe_index"),
            (start & 0xffff) as i128,
            k("wqe_index"),
        );
        run.eq(
            &format!("sq.{i}.slot"),
            (start & (geo.sq_wqe_cnt - 1)) as i128,
            k("slot"),
        );
        run.eq(
            &format!("sq.{i}.nbb"),
            (sq.producer() - start) as i128,
            k("nbb"),
        );
        sq_ends.push(sq.producer());
    }
    let mut cq = f.completion_queue().expect("cq");
    let nrq = case.num("nrq") as usize;
    run.eq("rq indices", case.indices("rq"), (0..nrq as u64).collect());
    let mut srq_mem = None;
    let mut srq = None;
    let uidx = case.opt_num("uidx").unwrap_or(0) as u32;
    if on_srq {
        let (m, mut s) = srq_from_case(&mut run, p);
        for i in 0..nrq {
            let (id, sges) = read_recv_wr(case, &format!("rq.{i}"));
            run.eq(
                &format!("rq.{i}.slot"),
                s.head() as i128,
                case.num(&format!("rq.{i}.slot")),
            );
            srq_post(&mut s, id, &sges).expect("srq post");
        }
        srq_mem = Some(m);
        srq = Some(s);
    } else {
        let head = case.u32("rq_head");
        rq.reset_counters(head);
        run.eq("rq_tail", case.num("rq_tail"), head as i128);
        let wrs: Vec<(u64, Vec<Sge>)> = (0..nrq)
            .map(|i| {
                let (id, s) = read_recv_wr(case, &format!("rq.{i}"));
                let slot = case.num(&format!("rq.{i}.slot"));
                run.eq(
                    &format!("rq.{i}.slot"),
                    ((head + i as u32) & (rq_cnt - 1)) as i128,
                    slot,
                );
                (id, s.iter().map(|&(a, l, k)| Sge::new(a, l, k)).collect())
            })
            .collect();
        let rwrs: Vec<RecvWr<'_>> = wrs
            .iter()
            .map(|(id, s)| RecvWr {
                wr_id: *id,
                sges: s,
            })
            .collect();
        // SAFETY: nothing executes these WQEs.
        unsafe { rq.post_list(&rwrs) }.expect("rq post");
    }
    let mut route = Route {
        sq,
        rq,
        srq,
        cqe_v1: v1,
        uidx,
    };
    let ci = case.u32("cq_ci");
    if on_srq {
        // The earlier completions, polled through the same CQ just before
        // `ci`; then the CQ buffer is reset.
        let freed = list(case.str("srq_freed"));
        run.eq("srq_nfree", freed.len() as i128, case.num("srq_nfree"));
        let start = ci - freed.len() as u32;
        cq.set_consumer_index(start);
        let su = if v1 { uidx } else { case.u32("srqn") };
        for (j, &s) in freed.iter().enumerate() {
            f.write_cqe(start + j as u32, &resp_send_cqe(qpn, s as u16, su));
        }
        let mut w = vec![Wc::default(); freed.len().max(1)];
        run.eq(
            "setup poll",
            cq.poll(&mut route, &mut w).ok(),
            Some(freed.len()),
        );
        // SAFETY: the CQ buffer is ours, sized cnt × size.
        unsafe { CompletionQueue::init_buffer(f.cq_buf.ptr(), cq_cnt, geo.cqe_size) };
        srq_state(
            &mut run,
            "before",
            srq_mem.as_ref().unwrap(),
            route.srq.as_ref().unwrap(),
        );
    }
    cq.set_consumer_index(ci);
    let ncqe = case.num("ncqe") as u32;
    run.eq(
        "cqe indices",
        case.indices("cqe"),
        (0..ncqe as u64).collect(),
    );
    for n in 0..ncqe {
        run.eq(
            &format!("cqe.{n}.slot"),
            ((ci + n) & (cq_cnt - 1)) as i128,
            case.num(&format!("cqe.{n}.slot")),
        );
        let b: [u8; 64] = case
            .bytes_exact(&format!("cqe.{n}"))
            .try_into()
            .expect("64-byte CQE");
        f.write_cqe(ci + n, &b);
    }
    let ne = case.num("poll.ne") as usize;
    let mut wc = vec![Wc::default(); ne];
    let got = cq.poll(&mut route, &mut wc);
    run.eq(
        "poll.rc",
        got.map_err(|e| format!("{e:?}")),
        Ok(case.num("poll.rc") as usize),
    );
    let n_wc = *got.as_ref().unwrap_or(&0);
    run.eq("wc indices", case.indices("wc"), (0..n_wc as u64).collect());
    for (n, w) in wc.iter().enumerate().take(n_wc) {
        for &fld in WC_FIELDS {
            let key = format!("wc.{n}.{fld}");
            if let Field::Value(v) = case.field(&key) {
                run.eq(&key, wc_field(w, fld), v);
            }
        }
        case.ignore(&format!("wc.{n}.status_name"));
        case.ignore(&format!("wc.{n}.opcode_name"));
    }
    run.eq(
        "cq.ci_after",
        cq.consumer_index() as i128,
        case.num("cq.ci_after"),
    );
    run.eq("cq.dbrec", f.dbrec_cq_ci() as i128, case.num("cq.dbrec"));
    // libmlx5 counts the SQ tail in WRs, ours in BBs: +k WRs = the end
    // of the k-th WR posted.
    let k = case.num("sq.tail_after") - sq_tail;
    let want = match k {
        0 => Some(sq_pi),
        k if k > 0 => sq_ends.get(k as usize - 1).copied(),
        _ => None,
    };
    run.eq(
        "sq.tail_after as our BB counter",
        Some(route.sq.retired()),
        want,
    );
    if on_srq {
        let (m, s) = (srq_mem.as_ref().unwrap(), route.srq.as_ref().unwrap());
        srq_state(&mut run, "after", m, s);
        match case.field("dbrec.srq") {
            Field::Value(v) => run.eq("dbrec.srq", m.dbrec() as i128, v),
            Field::Unwritten => run.untouched("dbrec.srq", &m.db.bytes()[..4]),
        }
    } else {
        run.eq(
            "rq.tail_after",
            route.rq.tail() as i128,
            case.num("rq.tail_after"),
        );
    }
    run.eq("nmem", case.num("nmem"), 0);
    run.finish()
}
