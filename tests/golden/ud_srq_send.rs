//! The UD send cases of `ud-srq-golden.txt` and the address handles they
//! (and the UD completion cases) use; part of `tests/golden_ud_srq.rs`.

use super::parse::{read_send_wr, send_op, Case, Field};
use super::*;
// ---------------------------------------------------------------- AHs

pub(crate) fn mac(case: &Case, key: &str) -> [u8; 6] {
    let v: Vec<u8> = case
        .str(key)
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|e| panic!("{key}: {e}")))
        .collect();
    v.try_into()
        .unwrap_or_else(|_| panic!("{key}: not 6 bytes"))
}

/// Builds address handle `A` from its attributes and checks the vector
/// against `ah.A.av` (when given: the cqe file omits it).
pub(crate) fn address_handle(run: &mut Run<'_>, a: u64) -> Mlx5Av {
    let case = run.case;
    let k = |s: &str| format!("ah.{a}.{s}");
    let eth = match case.str(&k("link_layer")) {
        "INFINIBAND" => None,
        "ETHERNET" => Some((case.str(&k("gid_type")).to_string(), mac(case, &k("dmac")))),
        other => panic!("[{}] link layer {other}", case.name),
    };
    let link = match &eth {
        None => LinkLayer::InfiniBand,
        Some((t, dmac)) if t == "ROCE_V2" => LinkLayer::RoceV2 { dmac: *dmac },
        Some((t, dmac)) if t == "IB_ROCE_V1" => LinkLayer::RoceV1 { dmac: *dmac },
        Some((t, _)) => panic!("[{}] gid type {t}", case.name),
    };
    let grh = case.flag(&k("is_global")).then(|| GlobalRoute {
        dgid: case
            .bytes_exact(&k("dgid"))
            .try_into()
            .expect("16-byte dgid"),
        sgid_index: case.u32(&k("sgid_index")) as u8,
        flow_label: case.u32(&k("flow_label")),
        hop_limit: case.u32(&k("hop_limit")) as u8,
        traffic_class: case.u32(&k("traffic_class")) as u8,
    });
    // IBV_RATE_MAX (0) is the only rate in the vectors: mlx5 code 0.
    run.eq("static_rate", case.num(&k("static_rate")), 0);
    let attr = AhAttr {
        link,
        dlid: case.u32(&k("dlid")) as u16,
        sl: case.u32(&k("sl")) as u8,
        src_path_bits: case.u32(&k("src_path_bits")) as u8,
        mlx5_rate: 0,
        grh,
    };
    let av = Mlx5Av::new(&attr).unwrap_or_else(|e| panic!("[{}] ah {a}: {e:?}", case.name));
    if case.has(&k("av")) {
        // SAFETY: Mlx5Av is 48 bytes of plain integers.
        let img: [u8; 48] = unsafe { std::mem::transmute(av) };
        run.bytes(&format!("ah.{a}.av"), &img, &case.bytes(&k("av")));
    }
    av
}

pub(crate) fn address_handles(run: &mut Run<'_>) -> Vec<Mlx5Av> {
    let n = run.case.num("nah") as u64;
    run.eq("ah indices", run.case.indices("ah"), (0..n).collect());
    (0..n).map(|a| address_handle(run, a)).collect()
}

// ---------------------------------------------------------------- sends

/// Owned storage of one UD WR.
pub(crate) struct UdWr {
    spec: SendWrSpec,
    sges: Vec<Sge>,
    inline: Vec<Vec<u8>>,
    ah: usize,
    qpn: u32,
    qkey: u32,
}

pub(crate) fn read_ud_wr(case: &Case, prefix: &str) -> UdWr {
    let spec = read_send_wr(case, prefix);
    let inline = spec.send_flags & SendFlags::INLINE.0 != 0;
    let mut w = UdWr {
        sges: Vec::new(),
        inline: Vec::new(),
        ah: case.num(&format!("{prefix}.ah")) as usize,
        qpn: case.u32(&format!("{prefix}.remote_qpn")),
        qkey: case.u32(&format!("{prefix}.remote_qkey")),
        spec,
    };
    for (k, &(addr, len, lkey)) in w.spec.sges.iter().enumerate() {
        match (&w.spec.sge_data[k], inline) {
            (Some(d), true) => w.inline.push(d.clone()),
            (None, false) => w.sges.push(Sge::new(addr, len, lkey)),
            _ => panic!("[{}] {prefix}.sge.{k}.data vs INLINE", case.name),
        }
    }
    w
}

/// Posts one UD WR.
pub(crate) fn post_ud(
    case: &Case,
    sq: &mut SendQueue,
    w: &UdWr,
    avs: &[Mlx5Av],
) -> rdma_direct::Result<()> {
    let pieces: Vec<&[u8]> = w.inline.iter().map(|v| v.as_slice()).collect();
    let payload = if w.spec.send_flags & SendFlags::INLINE.0 != 0 {
        Payload::Inline(&pieces)
    } else {
        Payload::Sges(&w.sges)
    };
    let wr = SendWr {
        wr_id: w.spec.wr_id,
        op: send_op(case, &w.spec),
        payload,
        flags: SendFlags(w.spec.send_flags & !SendFlags::INLINE.0),
    };
    let dest = UdDest::new(&avs[w.ah], w.qpn, w.qkey);
    // SAFETY: nothing executes these WQEs; the SGE addresses are never
    // dereferenced.
    unsafe { sq.post_ud(&wr, &dest) }
}

pub(crate) fn ud_caps(case: &Case) -> QpCaps {
    QpCaps {
        max_send_sge: case.u32("max_send_sge"),
        max_inline_data: case.u32("max_inline"),
        max_recv_sge: 1,
    }
}

pub(crate) fn ud_queue(f: &mut FakeMlx5, caps: QpCaps, cfg: SqConfig) -> SendQueue {
    let qp = f.dv_qp();
    let len = f.sq_wrid.len();
    // SAFETY: the memory belongs to `f`, which outlives the queue.
    unsafe {
        SendQueue::from_raw_ud(
            &qp,
            f.geo.qpn,
            caps,
            cfg,
            NonNull::new(f.sq_wrid.as_mut_ptr()).unwrap(),
            len,
        )
    }
    .expect("UD send queue")
}

pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}

pub(crate) fn run_send(case: &Case, p: u8) -> Vec<String> {
    let mut run = Run::new(case, p);
    run.eq("qp_type", case.str("qp_type"), "UD");
    let cnt = case.u32("sq_wqe_cnt");
    let geo = FakeGeometry {
        sq_wqe_cnt: cnt,
        qpn: case.u32("qpn"),
        bf_size: case.u32("bf_size"),
        ..FakeGeometry::default()
    };
    let mut f = FakeMlx5::new(geo);
    f.qp_buf.fill(p);
    f.dbrec.fill(p);
    f.bf.fill(p);
    // The WQE size rule of the header, and the inline budget it leaves.
    let wqe_size = case.u32("sq_wqe_size");
    let sge = case.u32("max_send_sge");
    let inl_req = case.opt_num("max_inline_data_req").unwrap_or(0) as u32;
    let size = (64 + 16 * sge).max(64 + (4 + inl_req).next_multiple_of(16));
    run.eq("sq_wqe_size rule", size.next_multiple_of(64), wqe_size);
    run.eq(
        "max_inline = sq_wqe_size - 68",
        case.u32("max_inline"),
        wqe_size - 68,
    );
    let cfg = SqConfig {
        bf_policy: match (case.flag("shut_up_bf"), case.flag("prefer_bf")) {
            (true, _) => BfPolicy::Never,
            (false, false) => BfPolicy::SingleInlineWqe,
            (false, true) => BfPolicy::SingleWqe,
        },
        sig_all: case.flag("sq_sig_all"),
        shared_register: false,
    };
    let mut sq = ud_queue(&mut f, ud_caps(case), cfg);
    sq.reset_counters(case.u32("sq_pi"));
    sq.set_bf_offset(case.u32("bf_offset"));
    let avs = address_handles(&mut run);
    let nwr = case.num("nwr") as usize;
    run.eq("wr indices", case.indices("wr"), (0..nwr as u64).collect());
    let wrs: Vec<UdWr> = (0..nwr)
        .map(|i| read_ud_wr(case, &format!("wr.{i}")))
        .collect();

    let mut posted = Vec::new();
    let mut bad = -1i128;
    for (i, w) in wrs.iter().enumerate() {
        let before = sq.producer();
        match post_ud(case, &mut sq, w, &avs) {
            Ok(()) => posted.push((before, sq.producer() - before)),
            Err(e) => {
                run.err(format!("post wr.{i}: {e:?}"));
                bad = i as i128;
                break;
            }
        }
    }
    run.eq("rc", 0, case.num("rc"));
    run.eq("bad_wr", bad, case.num("bad_wr"));
    let bf_used = sq.bf_offset();
    sq.ring();
    run.eq(
        "sq_pi_after",
        sq.producer() as i128,
        case.num("sq_pi_after"),
    );
    let raw = f.dbrec.bytes().to_vec();
    match case.field("dbrec.sq") {
        Field::Value(v) => run.eq("dbrec.sq", f.dbrec_sq() as i128, v),
        Field::Unwritten => run.untouched("dbrec.sq", &raw[4..8]),
    }
    match case.field("dbrec.rq") {
        Field::Value(v) => run.eq("dbrec.rq", f.dbrec_rq() as i128, v),
        Field::Unwritten => run.untouched("dbrec.rq", &raw[0..4]),
    }
    run.untouched("rest of the doorbell records", &raw[8..]);

    let mask = cnt - 1;
    run.eq("nwqe", posted.len() as i128, case.num("nwqe"));
    run.eq(
        "wqe indices",
        case.indices("wqe"),
        (0..posted.len() as u64).collect(),
    );
    let ring = f.sq_bytes().to_vec();
    for (n, &(start, nbb)) in posted.iter().enumerate() {
        let k = |s: &str| case.num(&format!("wqe.{n}.{s}"));
        let slot = (start & mask) as usize;
        let b = &ring[slot * 64..slot * 64 + 64];
        run.eq(&format!("wqe.{n}.slot"), slot as i128, k("slot"));
        run.eq(&format!("wqe.{n}.nbb"), nbb as i128, k("nbb"));
        run.eq(&format!("wqe.{n}.opmod"), b[0] as i128, k("opmod"));
        run.eq(
            &format!("wqe.{n}.wqe_index"),
            (be32(b, 0) >> 8 & 0xffff) as i128,
            k("wqe_index"),
        );
        run.eq(&format!("wqe.{n}.opcode"), b[3] as i128, k("opcode"));
        run.eq(&format!("wqe.{n}.qpn"), (be32(b, 4) >> 8) as i128, k("qpn"));
        run.eq(&format!("wqe.{n}.ds"), (b[7] & 0x3f) as i128, k("ds"));
        run.eq(&format!("wqe.{n}.fm_ce_se"), b[11] as i128, k("fm_ce_se"));
        run.eq(&format!("wqe.{n}.imm"), be32(b, 12) as i128, k("imm"));
        run.eq(
            &format!("wqe.{n}.av.qkey"),
            be32(b, 16) as i128,
            k("av.qkey"),
        );
        run.eq(
            &format!("wqe.{n}.av.dqp_dct"),
            be32(b, 24) as i128,
            k("av.dqp_dct"),
        );
    }
    let mut wqe_bbs: Vec<u64> = posted
        .iter()
        .flat_map(|&(s, n)| (0..n).map(move |i| ((s + i) & mask) as u64))
        .collect();
    wqe_bbs.sort_unstable();
    run.eq("bb.S slots vs the WQEs' BBs", case.indices("bb"), wqe_bbs);
    for s in 0..cnt as usize {
        let got = &ring[s * 64..s * 64 + 64];
        let key = format!("bb.{s}");
        if case.has(&key) {
            run.bytes(&key, got, &case.bytes(&key));
        } else {
            run.untouched(&format!("SQ slot {s}"), got);
        }
    }
    let off = f.sq_offset();
    let all = f.qp_buf.bytes().to_vec();
    run.untouched("RQ region", &all[..off]);
    run.untouched("guard after the SQ", &all[off + ring.len()..]);

    let data = case.bytes("bf.data");
    run.eq("bf.len", data.len() as i128, case.num("bf.len"));
    let bo = case.num("bf.offset") as usize;
    run.eq("bf.offset", bf_used as usize, bo);
    let reg = f.bf.bytes().to_vec();
    run.bytes("BF register", &reg[bo..bo + data.len()], &data);
    run.untouched("BF register before the copy", &reg[..bo]);
    run.untouched("BF register after the copy", &reg[bo + data.len()..]);
    run.eq(
        "bf.offset_after",
        sq.bf_offset() as i128,
        case.num("bf.offset_after"),
    );
    run.finish()
}
