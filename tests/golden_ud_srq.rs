//! Golden vectors: UD send WQEs, SRQ receive WQEs and UD / SRQ
//! completions against rdma-core's libmlx5, byte for byte
//! (`testdata/mlx5/ud-srq-golden.txt`; its header describes every key).
//!
//! Every case runs with all "device" memory (QP buffer, doorbell records,
//! BlueFlame register, SRQ buffer) pre-filled with 0x00 and with 0xFF: a
//! `..` byte must keep the pre-fill, every other byte must equal the
//! vector, and bytes the vector does not list must be untouched. Every key
//! of every case is read (`Case::unused_keys`).

#[path = "golden/parse.rs"]
mod parse;

use std::ptr::NonNull;

use parse::{
    format_bytes, read_recv_wr, read_send_wr, send_op, Case, Field, GoldenFile, SendWrSpec,
};
use rdma_direct::provider::mlx5::cq::{CqRoute, QpQueues};
use rdma_direct::provider::mlx5::{
    AhAttr, BfPolicy, CompletionQueue, GlobalRoute, LinkLayer, Mlx5Av, RecvQueue, SendQueue,
    SqConfig, Srq, SrqGeometry, SrqSlot, UdDest, Wc, WcOpcode, WcStatus,
};
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct::{Payload, QpCaps, RecvWr, SendFlags, SendWr, Sge};

const PREFILLS: [u8; 2] = [0x00, 0xff];
const EXPECTED: [(&str, usize); 3] = [("send", 9), ("srq_recv", 3), ("cqe", 4)];

fn load() -> GoldenFile {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/mlx5/ud-srq-golden.txt"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse::parse_file(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Collects the mismatches of one run.
struct Run<'c> {
    case: &'c Case,
    prefill: u8,
    errs: Vec<String>,
}

impl<'c> Run<'c> {
    fn new(case: &'c Case, prefill: u8) -> Self {
        case.ignore("desc");
        case.ignore("kind");
        Run {
            case,
            prefill,
            errs: Vec::new(),
        }
    }
    fn err(&mut self, msg: String) {
        let name = &self.case.name;
        self.errs
            .push(format!("[{name}] (prefill {:#04x}) {msg}", self.prefill));
    }
    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.err(format!("{what}: got {got:x?}, want {want:x?}"));
        }
    }
    /// `got` against a vector byte string (`None` = still the pre-fill).
    fn bytes(&mut self, what: &str, got: &[u8], want: &[Option<u8>]) {
        if got.len() != want.len() {
            self.err(format!(
                "{what}: {} bytes vs a {}-byte vector",
                got.len(),
                want.len()
            ));
        }
        for (off, (g, w)) in got.iter().zip(want).enumerate() {
            let w = w.unwrap_or(self.prefill);
            if *g != w {
                self.err(format!(
                    "{what} byte +{off:#05x}: got {g:#04x}, want {w:#04x}"
                ));
            }
        }
    }
    fn untouched(&mut self, what: &str, got: &[u8]) {
        let want = vec![None; got.len()];
        self.bytes(what, got, &want);
    }
    fn finish(self) -> Vec<String> {
        let mut errs = self.errs;
        let unused = self.case.unused_keys();
        if !unused.is_empty() {
            errs.push(format!(
                "[{}] keys never checked: {unused:?}",
                self.case.name
            ));
        }
        errs
    }
}

// ---------------------------------------------------------------- AHs

fn mac(case: &Case, key: &str) -> [u8; 6] {
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
fn address_handle(run: &mut Run<'_>, a: u64) -> Mlx5Av {
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

fn address_handles(run: &mut Run<'_>) -> Vec<Mlx5Av> {
    let n = run.case.num("nah") as u64;
    run.eq("ah indices", run.case.indices("ah"), (0..n).collect());
    (0..n).map(|a| address_handle(run, a)).collect()
}

// ---------------------------------------------------------------- sends

/// Owned storage of one UD WR.
struct UdWr {
    spec: SendWrSpec,
    sges: Vec<Sge>,
    inline: Vec<Vec<u8>>,
    ah: usize,
    qpn: u32,
    qkey: u32,
}

fn read_ud_wr(case: &Case, prefix: &str) -> UdWr {
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
fn post_ud(case: &Case, sq: &mut SendQueue, w: &UdWr, avs: &[Mlx5Av]) -> rdma_direct::Result<()> {
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

fn ud_caps(case: &Case) -> QpCaps {
    QpCaps {
        max_send_sge: case.u32("max_send_sge"),
        max_inline_data: case.u32("max_inline"),
        max_recv_sge: 1,
    }
}

fn ud_queue(f: &mut FakeMlx5, caps: QpCaps, cfg: SqConfig) -> SendQueue {
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

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}

fn run_send(case: &Case, p: u8) -> Vec<String> {
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

// ---------------------------------------------------------------- SRQ

/// The SRQ memory of a case and the queue over it.
struct SrqMem {
    buf: AlignedBuf,
    db: AlignedBuf,
    slots: Vec<SrqSlot>,
    max: u32,
    stride: u32,
}

fn list(v: &str) -> Vec<u32> {
    if v == "none" {
        return Vec::new();
    }
    v.split(',')
        .map(|s| s.trim().parse().expect("slot number"))
        .collect()
}

/// Checks the geometry keys against rdma-core's sizing rules and builds
/// the SRQ.
fn srq_from_case(run: &mut Run<'_>, p: u8) -> (SrqMem, Srq) {
    let case = run.case;
    let max_wr = case.u32("srq_max_wr");
    let gs_req = case.u32("srq_max_gs_req");
    let stride = case.u32("srq_stride");
    let nwqes = case.u32("srq_nwqes");
    let max = case.u32("srq_max");
    run.eq(
        "srq_stride rule",
        (16 + 16 * gs_req).max(32).next_power_of_two(),
        stride,
    );
    run.eq("srq_nwqes rule", (max_wr + 1).next_power_of_two(), nwqes);
    run.eq("srq_max rule", (2 * max_wr + 1).next_power_of_two(), max);
    run.eq("srq_waitq_head", case.u32("srq_waitq_head"), nwqes);
    run.eq("srq_waitq_tail", case.u32("srq_waitq_tail"), max - 1);
    let mut m = SrqMem {
        buf: AlignedBuf::new((max * stride) as usize),
        db: AlignedBuf::new(64),
        slots: vec![SrqSlot::default(); nwqes as usize],
        max,
        stride,
    };
    m.buf.fill(p);
    m.db.fill(p);
    let geo = SrqGeometry {
        buf: m.buf.ptr(),
        dbrec: m.db.ptr().cast(),
        stride,
        nwqes,
        max,
        srqn: case.u32("srqn"),
    };
    let len = m.slots.len();
    // SAFETY: the memory lives in `m`, which the caller keeps with the queue.
    let srq = unsafe { Srq::from_raw(&geo, NonNull::new(m.slots.as_mut_ptr()).unwrap(), len) }
        .expect("srq");
    run.eq("srq_max_gs", srq.max_gs() as i128, case.num("srq_max_gs"));
    (m, srq)
}

impl SrqMem {
    fn links(&self) -> Vec<u32> {
        let b = self.buf.bytes();
        (0..self.max as usize)
            .map(|i| {
                u16::from_be_bytes([
                    b[i * self.stride as usize + 2],
                    b[i * self.stride as usize + 3],
                ]) as u32
            })
            .collect()
    }
    /// Pre-fills everything but the link words again.
    fn refill(&mut self, p: u8) {
        let s = self.stride as usize;
        for (i, b) in self.buf.bytes_mut().iter_mut().enumerate() {
            if !(2..4).contains(&(i % s)) {
                *b = p;
            }
        }
        self.db.fill(p);
    }
    fn dbrec(&self) -> u32 {
        u32::from_be_bytes(self.db.bytes()[..4].try_into().unwrap())
    }
}

fn srq_state(run: &mut Run<'_>, when: &str, m: &SrqMem, srq: &Srq) {
    let case = run.case;
    let k = |s: &str| format!("srq.{when}.{s}");
    run.eq(&k("head"), srq.head() as i128, case.num(&k("head")));
    run.eq(&k("tail"), srq.tail() as i128, case.num(&k("tail")));
    run.eq(
        &k("counter"),
        srq.counter() as i128,
        case.num(&k("counter")),
    );
    let free: Vec<u32> = (0..srq.nwqes())
        .filter(|&i| srq.slot_state(i).unwrap().state == SrqSlot::COMPLETED)
        .collect();
    run.eq(&k("free_bitmap"), free, list(case.str(&k("free_bitmap"))));
    let want: Vec<u32> = case
        .str(&k("next"))
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    run.eq(&k("next"), m.links(), want);
}

fn srq_post(srq: &mut Srq, wr_id: u64, sges: &[(u64, u32, u32)]) -> rdma_direct::Result<()> {
    let s: Vec<Sge> = sges.iter().map(|&(a, l, k)| Sge::new(a, l, k)).collect();
    // SAFETY: nothing executes these WQEs.
    unsafe { srq.post_list(&[RecvWr { wr_id, sges: &s }]) }.map_err(|e| e.error)
}

fn run_srq_recv(case: &Case, p: u8) -> Vec<String> {
    let mut run = Run::new(case, p);
    let (mut m, mut srq) = srq_from_case(&mut run, p);
    let nsetup = case.num("nsetup") as u64;
    run.eq(
        "setup indices",
        case.indices("setup"),
        (0..nsetup).collect(),
    );
    for i in 0..nsetup {
        let (id, sges) = read_recv_wr(case, &format!("setup.{i}"));
        run.eq(
            &format!("setup.{i}.slot"),
            srq.head() as i128,
            case.num(&format!("setup.{i}.slot")),
        );
        srq_post(&mut srq, id, &sges).expect("setup post");
    }
    let freed = case
        .opt_num("nfree")
        .map(|_| list(case.get("freed").unwrap_or("none")));
    let freed = freed.unwrap_or_default();
    run.eq("nfree", freed.len() as i128, case.num("nfree"));
    for &s in &freed {
        srq.complete(s as u16).expect("setup completion");
    }
    m.refill(p);
    srq_state(&mut run, "before", &m, &srq);
    let nwr = case.num("nwr") as u64;
    run.eq("wr indices", case.indices("wr"), (0..nwr).collect());
    let wrs: Vec<(u64, Vec<Sge>)> = (0..nwr)
        .map(|i| {
            let (id, s) = read_recv_wr(case, &format!("wr.{i}"));
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
    let r = unsafe { srq.post_list(&rwrs) };
    run.eq("rc", if r.is_ok() { 0 } else { 1 }, case.num("rc"));
    run.eq(
        "bad_wr",
        r.err().map_or(-1, |e| e.index as i128),
        case.num("bad_wr"),
    );
    srq_state(&mut run, "after", &m, &srq);
    match case.field("dbrec.srq") {
        Field::Value(v) => run.eq("dbrec.srq", m.dbrec() as i128, v),
        Field::Unwritten => run.untouched("dbrec.srq", &m.db.bytes()[..4]),
    }
    run.untouched("rest of the SRQ doorbell page", &m.db.bytes()[4..]);
    let listed = case.indices("swqe");
    run.eq("nswqe", listed.len() as i128, case.num("nswqe"));
    let links = m.links();
    let s = m.stride as usize;
    for (i, &link) in links.iter().enumerate() {
        let got = &m.buf.bytes()[i * s..(i + 1) * s];
        let key = format!("swqe.{i}");
        if case.has(&key) {
            let want = case.bytes(&key);
            run.bytes(&key, got, &want);
            run.eq(
                &format!("{key} link bytes shown"),
                want[2].is_some() && want[3].is_some(),
                true,
            );
            let id = srq.slot_state(i as u32).map(|s| s.wr_id);
            run.eq(
                &format!("srq.wrid.{i}"),
                id.map(|v| v as i128),
                case.opt_num(&format!("srq.wrid.{i}")),
            );
        } else {
            let mut want = vec![None; s];
            want[2] = Some((link >> 8) as u8);
            want[3] = Some(link as u8);
            run.bytes(&format!("SRQ WQE {i} (not in the vector)"), got, &want);
        }
    }
    run.eq("srq.wrid.S vs swqe.S", case.indices("srq.wrid"), listed);
    run.finish()
}

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

fn wc_field(wc: &Wc, f: &str) -> i128 {
    match f {
        "wr_id" => wc.wr_id as i128,
        "status" => wc.status.0 as i128,
        "opcode" => wc.opcode.0 as i128,
        "vendor_err" => wc.vendor_err as i128,
        "byte_len" => wc.byte_len as i128,
        "imm_data" => wc.imm_data as i128,
        "qp_num" => wc.qp_num as i128,
        "src_qp" => wc.src_qp as i128,
        "wc_flags" => wc.wc_flags as i128,
        "pkey_index" => wc.pkey_index as i128,
        "slid" => wc.slid as i128,
        "sl" => wc.sl as i128,
        "dlid_path_bits" => wc.dlid_path_bits as i128,
        _ => unreachable!(),
    }
}

/// A RESP_SEND CQE for SRQ WQE `counter` (the setup completions).
fn resp_send_cqe(qpn: u32, counter: u16, srqn_uidx: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[32..36].copy_from_slice(&srqn_uidx.to_be_bytes());
    c[56..60].copy_from_slice(&qpn.to_be_bytes());
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = 0x20;
    c
}

fn run_cqe(case: &Case, p: u8) -> Vec<String> {
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

// ---------------------------------------------------------------- drivers

fn run_case(case: &Case) -> Vec<String> {
    PREFILLS
        .iter()
        .flat_map(|&p| match case.str("kind") {
            "send" => run_send(case, p),
            "srq_recv" => run_srq_recv(case, p),
            "cqe" => run_cqe(case, p),
            k => vec![format!("[{}] unknown kind {k}", case.name)],
        })
        .collect()
}

#[test]
fn golden_ud_srq_vectors() {
    let file = load();
    assert_eq!(
        Some(file.cases.len()),
        file.declared_cases,
        "case count vs header"
    );
    let mut errs = Vec::new();
    for case in &file.cases {
        errs.extend(run_case(case));
    }
    assert!(
        errs.is_empty(),
        "{} mismatches:\n{}",
        errs.len(),
        errs.join("\n")
    );
    for (kind, n) in EXPECTED {
        let got = file.cases.iter().filter(|c| c.str("kind") == kind).count();
        assert_eq!(got, n, "{kind} cases");
    }
}

/// Every expected result (numbers and every byte of the byte strings) is
/// changed in turn; each change must be reported for that case.
#[test]
fn golden_ud_srq_mutations_are_detected() {
    let file = load();
    let mut mutations = 0;
    for case in &file.cases {
        let tag = format!("[{}]", case.name);
        let keys: Vec<String> = case.keys().map(str::to_string).collect();
        for key in &keys {
            let v = case.get(key).unwrap().to_string();
            let numeric = parse::parse_number(&v).is_ok();
            let result = key.starts_with("srq.")
                || key.starts_with("wc.") && !key.ends_with("_name")
                || key.starts_with("wqe.")
                || key.starts_with("dbrec.")
                || key.ends_with(".slot")
                || matches!(
                    key.as_str(),
                    "sq_pi_after"
                        | "cq.ci_after"
                        | "cq.dbrec"
                        | "sq.tail_after"
                        | "rq.tail_after"
                        | "poll.rc"
                        | "bf.offset"
                        | "bf.offset_after"
                        | "bad_wr"
                );
            let is_list = key.ends_with(".next") || key.ends_with(".free_bitmap");
            if is_list && key.starts_with("srq.") {
                let alt = if key.ends_with(".next") {
                    let mut n: Vec<String> = v.split(' ').map(str::to_string).collect();
                    n[0] = (n[0].parse::<u32>().unwrap() + 1).to_string();
                    n.join(" ")
                } else if v == "none" {
                    "3".to_string()
                } else {
                    "none".to_string()
                };
                let errs = run_case(&case.with_value(key, &alt));
                assert!(
                    errs.iter().any(|e| e.contains(&tag)),
                    "{tag} {key} = {alt} not detected"
                );
                mutations += 1;
            } else if result && numeric {
                let alt = format!("{:#x}", parse::parse_number(&v).unwrap() + 1);
                let errs = run_case(&case.with_value(key, &alt));
                assert!(
                    errs.iter().any(|e| e.contains(&tag)),
                    "{tag} {key} = {alt} not detected"
                );
                mutations += 1;
            }
            let bytes = key.starts_with("bb.")
                || key.starts_with("swqe.")
                || key == "bf.data"
                || key.ends_with(".av");
            if bytes {
                let orig = case.bytes(key);
                for b in 0..orig.len() {
                    let mut m = orig.clone();
                    m[b] = Some(orig[b].map_or(0x5a, |x| x ^ 0x01));
                    let errs = run_case(&case.with_value(key, &format_bytes(&m)));
                    assert!(
                        errs.iter().any(|e| e.contains(&tag)),
                        "{tag} {key} byte {b} not detected"
                    );
                    mutations += 1;
                }
            }
        }
        let errs = run_case(&case.with_value("wc.9.unknown", "1"));
        assert!(
            errs.iter().any(|e| e.contains("never checked")),
            "{tag} unknown key"
        );
    }
    eprintln!("golden_ud_srq: {mutations} mutations detected");
    let _ = (WcOpcode::RECV, WcStatus::SUCCESS);
}
