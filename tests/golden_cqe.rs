//! Golden vectors: our mlx5 CQ poller against rdma-core's libmlx5
//! (`testdata/mlx5/cqe-golden.txt`): the listed WRs are posted through our
//! queues, the CQEs are written into the fake CQ exactly as given, one
//! `poll` is made, and the completions, consumer index, doorbell record,
//! queue tails and (scatter-to-CQE cases) buffer contents are compared.
//!
//! The SGE addresses in the vectors are fake; every local SGE address is
//! mapped onto real memory (one buffer per 1 MiB region of fake addresses,
//! offsets preserved), pre-filled with 0x00 in one run and 0xFF in another:
//! a `..` byte of `mem.N` must keep the pre-fill, and every buffer byte not
//! listed in a `mem.N` must be untouched.

#[path = "golden/parse.rs"]
mod parse;
#[path = "golden/wc.rs"]
mod wc;
use wc::wc_field;

use parse::{
    format_bytes, read_recv_wr, read_send_wr, send_op, Case, Field, GoldenFile, SendWrSpec, SgeSpec,
};
use rdma_direct::provider::mlx5::{BfPolicy, Mlx5Qp, SqConfig, Wc, WcOpcode, WcStatus};
use rdma_direct::testutil::{AlignedBuf, FakeGeometry, FakeMlx5};
use rdma_direct::{Error, Payload, RecvWr, SendFlags, SendWr, Sge};

const PREFILLS: [u8; 2] = [0x00, 0xff];
const EXPECTED_CASES: usize = 23;

fn load() -> GoldenFile {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/mlx5/cqe-golden.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse::parse_file(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// What one `poll` call is expected to return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PollExpect {
    /// `Ok(n)`, with `n` completions compared field by field.
    Ok(usize),
    /// An error; no completion is written.
    Err(Error),
}

/// A case whose vector contradicts rdma-core's own source. The vector is
/// kept as delivered; the test checks that it still says what the erratum
/// describes (so a corrected vector makes the erratum fail loudly and be
/// removed) and then checks our documented behaviour instead.
///
/// `err_resp_wr_flush`: two receives are posted at RQ slots 3 (wr_id
/// 0x6003) and 4 (0x6004) with rq.tail = 3; the RESP_ERR CQE carries
/// wqe_counter 4 and the vector expects wr_id 0x6004 with rq.tail 3 -> 4.
/// libmlx5 does not produce that: for a non-SRQ RQ, both `handle_responder`
/// and the RESP_ERR branch of `mlx5_parse_cqe` (rdma-core
/// providers/mlx5/cq.c) take `wq->wrid[wq->tail & (wq->wqe_cnt - 1)]` and
/// ignore `wqe_counter`, so real libmlx5 returns 0x6003. Receives complete
/// in order, so a receive CQE whose counter is not the RQ tail is
/// inconsistent; our poller reports it as `Error::CqeCorrupt` (the entry is
/// consumed, nothing is retired; `RecvQueue::complete`).
fn erratum(case: &Case) -> Option<(Case, PollExpect)> {
    if case.name != "err_resp_wr_flush" {
        return None;
    }
    let says = |k: &str, v: &str| {
        assert_eq!(
            case.get(k),
            Some(v),
            "[{}] erratum no longer matches the vector ({k}); re-check it against \
             libmlx5 and remove it if the vector was corrected",
            case.name
        )
    };
    says("rq_tail", "3");
    says("rq.0.wr_id", "0x0000000000006003");
    says("rq.1.wr_id", "0x0000000000006004");
    says("wc.0.wr_id", "0x0000000000006004");
    says("rq.tail_after", "4");
    says("poll.rc", "1");
    let cqe = case.bytes_exact("cqe.0");
    assert_eq!(&cqe[60..62], &[0x00, 0x04], "erratum: wqe_counter 4");
    // Ours: the inconsistent CQE is consumed (ci and dbrec as in the
    // vector), nothing is completed or retired, the error is reported.
    let fixed = case.with_value("rq.tail_after", "3");
    Some((fixed, PollExpect::Err(Error::CqeCorrupt)))
}

struct Run<'c> {
    case: &'c Case,
    prefill: u8,
    errs: Vec<String>,
}

impl<'c> Run<'c> {
    fn err(&mut self, msg: String) {
        self.errs.push(format!(
            "[{}] (prefill {:#04x}) {msg}",
            self.case.name, self.prefill
        ));
    }

    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.err(format!("{what}: got {got:x?}, want {want:x?}"));
        }
    }
}

/// Real memory behind the vectors' fake local addresses: one buffer per
/// 1 MiB region, covering every SGE and `mem.N` range in it.
struct Arena {
    /// (fake base, buffer)
    regions: Vec<(u64, AlignedBuf)>,
}

impl Arena {
    fn new(ranges: &[(u64, u64)], fill: u8) -> Arena {
        let mut spans: Vec<(u64, u64, u64)> = Vec::new(); // (region, lo, hi)
        for &(a, len) in ranges {
            let region = a >> 20;
            let end = a + len.max(1);
            match spans.iter_mut().find(|s| s.0 == region) {
                Some(s) => {
                    s.1 = s.1.min(a);
                    s.2 = s.2.max(end);
                }
                None => spans.push((region, a, end)),
            }
        }
        let regions = spans
            .into_iter()
            .map(|(_, lo, hi)| {
                let base = lo & !0xfff;
                let size = (hi - base) as usize;
                assert!(size <= 64 << 20, "fake address span too large");
                let mut b = AlignedBuf::new(size);
                b.fill(fill);
                (base, b)
            })
            .collect();
        Arena { regions }
    }

    fn find(&self, fake: u64, len: u64) -> (usize, usize) {
        for (i, (base, b)) in self.regions.iter().enumerate() {
            if fake >= *base && fake + len <= base + b.len() as u64 {
                return (i, (fake - base) as usize);
            }
        }
        panic!("fake address {fake:#x}+{len} not in the arena")
    }

    fn real(&self, fake: u64, len: u64) -> u64 {
        let (i, off) = self.find(fake, len);
        self.regions[i].1.ptr() as u64 + off as u64
    }

    fn read(&self, fake: u64, len: usize) -> Vec<u8> {
        let (i, off) = self.find(fake, len as u64);
        self.regions[i].1.bytes()[off..off + len].to_vec()
    }
}

const WC_FIELDS: &[&str] = &[
    "wr_id",
    "status",
    "opcode",
    "vendor_err",
    "byte_len",
    "imm_data",
    "invalidated_rkey",
    "qp_num",
    "src_qp",
    "wc_flags",
    "pkey_index",
    "slid",
    "sl",
    "dlid_path_bits",
];

/// A recognisable value for every entry of the caller's wc array.
fn sentinel_wc() -> Wc {
    Wc {
        wr_id: 0x5e57_1ae1_5e57_1ae1,
        status: WcStatus(0x5e57),
        opcode: WcOpcode(0x5e57),
        vendor_err: 0x5e57,
        byte_len: 0x5e57,
        imm_data: 0x5e57,
        qp_num: 0x5e57,
        src_qp: 0x5e57,
        wc_flags: 0x5e57,
        pkey_index: 0x5e57,
        slid: 0x5e57,
        sl: 0x5e,
        dlid_path_bits: 0x5e,
        syndrome: 0x5e,
        reserved: 0x5e,
    }
}

fn run_cqe(orig: &Case, p: u8) -> Vec<String> {
    let errata = erratum(orig);
    let (case_owned, expect_override) = match errata {
        Some((c, e)) => (Some(c), Some(e)),
        None => (None, None),
    };
    let case: &Case = case_owned.as_ref().unwrap_or(orig);
    let mut run = Run {
        case,
        prefill: p,
        errs: Vec::new(),
    };
    case.ignore("desc");
    assert_eq!(case.str("kind"), "cqe", "[{}] kind", case.name);
    assert_eq!(case.str("qp_type"), "RC", "[{}] qp_type", case.name);

    // ---- geometry
    let qpn = case.u32("qpn");
    let cqe_version = case.num("cqe_version");
    let sq_wqe_cnt = case.u32("sq_wqe_cnt");
    let rq_wqe_cnt = case.u32("rq_wqe_cnt");
    let max_recv_sge = case.u32("max_recv_sge");
    let cq_cnt = case.u32("cq_cqe_cnt");
    let cqe_size = case.u32("cq_cqe_size");
    let geo = FakeGeometry {
        sq_wqe_cnt,
        rq_wqe_cnt,
        rq_stride: (16 * max_recv_sge.max(1)).next_power_of_two(),
        cqe_cnt: cq_cnt,
        cqe_size,
        qpn,
        ..FakeGeometry::default()
    };
    let mut f = FakeMlx5::new(geo);

    // ---- the posted work, with fake local addresses mapped to memory
    let nsq = case.num("nsq") as usize;
    let nrq = case.num("nrq") as usize;
    run.eq("sq indices", case.indices("sq"), (0..nsq as u64).collect());
    run.eq("rq indices", case.indices("rq"), (0..nrq as u64).collect());
    let sq_specs: Vec<SendWrSpec> = (0..nsq)
        .map(|i| read_send_wr(case, &format!("sq.{i}")))
        .collect();
    let rq_specs: Vec<(u64, Vec<SgeSpec>)> = (0..nrq)
        .map(|i| read_recv_wr(case, &format!("rq.{i}")))
        .collect();
    let nmem = case.num("nmem") as usize;
    run.eq(
        "mem indices",
        case.indices("mem"),
        (0..nmem as u64).collect(),
    );
    let mems: Vec<(u64, Vec<Option<u8>>)> = (0..nmem)
        .map(|i| {
            (
                case.u64(&format!("mem.{i}.addr")),
                case.bytes(&format!("mem.{i}")),
            )
        })
        .collect();
    let inline = |s: &SendWrSpec| s.send_flags & SendFlags::INLINE.0 != 0;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for s in &sq_specs {
        if !inline(s) {
            ranges.extend(s.sges.iter().map(|&(a, l, _)| (a, l as u64)));
        }
    }
    for (_, sges) in &rq_specs {
        ranges.extend(sges.iter().map(|&(a, l, _)| (a, l as u64)));
    }
    ranges.extend(mems.iter().map(|(a, b)| (*a, b.len() as u64)));
    let arena = Arena::new(&ranges, p);
    let real_sges = |sges: &[SgeSpec]| -> Vec<Sge> {
        sges.iter()
            .map(|&(a, l, k)| Sge::new(arena.real(a, l as u64), l, k))
            .collect()
    };

    let max_sge = sq_specs
        .iter()
        .map(|s| s.sges.len() as u32)
        .max()
        .unwrap_or(0);
    let caps = rdma_direct::QpCaps {
        max_send_sge: max_sge.max(4),
        max_inline_data: 60,
        max_recv_sge,
    };
    let cfg = SqConfig {
        bf_policy: BfPolicy::SingleWqe,
        sig_all: case.flag("sq_sig_all"),
        shared_register: false,
    };
    let mut sq = f
        .send_queue(caps, cfg)
        .unwrap_or_else(|e| panic!("[{}] send_queue: {e:?}", case.name));
    let mut rq = f
        .recv_queue(caps)
        .unwrap_or_else(|e| panic!("[{}] recv_queue: {e:?}", case.name));
    let sq_pi = case.u32("sq_pi");
    let rq_head = case.u32("rq_head");
    sq.reset_counters(sq_pi);
    rq.reset_counters(rq_head);
    // libmlx5's WR-counted tails; ours start empty at the producer.
    let sq_tail = case.num("sq_tail");
    run.eq("rq_tail == rq_head", case.num("rq_tail"), rq_head as i128);

    // Send WRs: one post_one (one ibv_post_send) each.
    let mask = sq_wqe_cnt - 1;
    let mut sq_ends: Vec<u32> = Vec::new();
    for (i, spec) in sq_specs.iter().enumerate() {
        let sges = if inline(spec) {
            Vec::new()
        } else {
            real_sges(&spec.sges)
        };
        let data: Vec<&[u8]> = spec
            .sge_data
            .iter()
            .flatten()
            .map(|v| v.as_slice())
            .collect();
        let wr = SendWr {
            wr_id: spec.wr_id,
            op: send_op(case, spec),
            payload: if inline(spec) {
                Payload::Inline(&data)
            } else {
                Payload::Sges(&sges)
            },
            flags: SendFlags(spec.send_flags & !SendFlags::INLINE.0),
        };
        let before = sq.producer();
        // SAFETY: every SGE names arena memory that outlives the queues;
        // the poller writes scatter-to-CQE data only there.
        if let Err(e) = unsafe { sq.post_one(&wr) } {
            run.err(format!("post sq.{i}: {e:?}"));
            continue;
        }
        let after = sq.producer();
        sq_ends.push(after);
        run.eq(
            &format!("sq.{i}.slot"),
            (before & mask) as i128,
            case.num(&format!("sq.{i}.slot")),
        );
        run.eq(
            &format!("sq.{i}.wqe_index"),
            (before & 0xffff) as i128,
            case.num(&format!("sq.{i}.wqe_index")),
        );
        run.eq(
            &format!("sq.{i}.nbb"),
            after.wrapping_sub(before) as i128,
            case.num(&format!("sq.{i}.nbb")),
        );
    }
    // Receive WRs: one post_list (one ibv_post_recv).
    let rq_sges: Vec<Vec<Sge>> = rq_specs.iter().map(|(_, s)| real_sges(s)).collect();
    let rwrs: Vec<RecvWr<'_>> = rq_specs
        .iter()
        .zip(&rq_sges)
        .map(|((id, _), s)| RecvWr {
            wr_id: *id,
            sges: s,
        })
        .collect();
    // SAFETY: as for the send WRs.
    if let Err(rdma_direct::PostError { index: i, error: e }) = unsafe { rq.post_list(&rwrs) } {
        run.err(format!("post_list rq.{i}: {e:?}"));
    }
    for i in 0..nrq {
        run.eq(
            &format!("rq.{i}.slot"),
            (rq_head.wrapping_add(i as u32) & (rq_wqe_cnt - 1)) as i128,
            case.num(&format!("rq.{i}.slot")),
        );
    }

    // ---- the CQ
    let mut cq = f
        .completion_queue()
        .unwrap_or_else(|e| panic!("[{}] completion_queue: {e:?}", case.name));
    let cq_ci = case.u32("cq_ci");
    cq.set_consumer_index(cq_ci);
    let ncqe = case.num("ncqe") as usize;
    run.eq(
        "cqe indices",
        case.indices("cqe"),
        (0..ncqe as u64).collect(),
    );
    for n in 0..ncqe {
        let ci = cq_ci.wrapping_add(n as u32);
        let slot = ci & (cq_cnt - 1);
        run.eq(
            &format!("cqe.{n}.slot"),
            slot as i128,
            case.num(&format!("cqe.{n}.slot")),
        );
        let bytes: [u8; 64] = case
            .bytes_exact(&format!("cqe.{n}"))
            .try_into()
            .unwrap_or_else(|v: Vec<u8>| panic!("[{}] cqe.{n}: {} bytes", case.name, v.len()));
        if cqe_version == 1 {
            let uidx = u32::from_be_bytes(bytes[32..36].try_into().unwrap()) & 0x00ff_ffff;
            run.eq(
                "cqe_version 1: srqn_uidx vs uidx",
                uidx as i128,
                case.num("uidx"),
            );
        }
        let pass_owner = (ci & cq_cnt != 0) as u8;
        let base = slot as usize * cqe_size as usize + cqe_size as usize - 64;
        if bytes[63] & 1 == pass_owner {
            f.write_cqe(ci, &bytes);
        } else {
            // A CQE with the other pass's owner bit (stale): written as
            // given. Same steps as `write_cqe`, without the owner rewrite.
            f.cq_buf.bytes_mut()[base..base + 63].copy_from_slice(&bytes[..63]);
            // SAFETY: byte 63 of this slot's CQE, inside the CQ buffer; no
            // other thread touches the CQ.
            unsafe { rdma_direct::mmio::store_op_own(f.cq_buf.ptr().add(base + 63), bytes[63]) };
        }
        run.eq(
            &format!("CQ slot {slot} image vs cqe.{n}"),
            &f.cq_buf.bytes()[base..base + 64],
            &bytes[..],
        );
    }

    // ---- one poll
    let ne = case.num("poll.ne") as usize;
    let mut wc = vec![sentinel_wc(); ne];
    let mut qp = Mlx5Qp { sq, rq };
    let got = cq.poll(&mut qp, &mut wc);
    let rc = case.num("poll.rc") as usize;
    let expect = expect_override.unwrap_or(PollExpect::Ok(rc));
    let n_wc = match (got, expect) {
        (Ok(n), PollExpect::Ok(want)) => {
            run.eq("poll.rc", n, want);
            n.min(want)
        }
        (Err(e), PollExpect::Err(want)) => {
            run.eq("poll error", e, want);
            0
        }
        (g, w) => {
            run.err(format!("poll returned {g:?}, want {w:?}"));
            0
        }
    };
    match expect {
        PollExpect::Ok(want) => {
            run.eq("wc indices", case.indices("wc"), (0..want as u64).collect());
            for (n, got_wc) in wc.iter().enumerate().take(n_wc) {
                for &fld in WC_FIELDS {
                    let key = format!("wc.{n}.{fld}");
                    if !case.has(&key) {
                        case.ignore(&key);
                        continue;
                    }
                    if let Field::Value(v) = case.field(&key) {
                        run.eq(&key, wc_field(got_wc, fld), v);
                    }
                }
                case.ignore(&format!("wc.{n}.status_name"));
                case.ignore(&format!("wc.{n}.opcode_name"));
            }
        }
        PollExpect::Err(_) => {
            // Superseded by the erratum: nothing may be written (checked
            // below). Only known wc fields are set aside, so an unknown key
            // is still reported.
            for n in case.indices("wc") {
                for fld in WC_FIELDS.iter().chain(&["status_name", "opcode_name"]) {
                    case.ignore(&format!("wc.{n}.{fld}"));
                }
            }
        }
    }
    for (i, w) in wc.iter().enumerate().skip(n_wc) {
        if *w != sentinel_wc() {
            run.err(format!(
                "wc[{i}] beyond the returned count was written: {w:x?}"
            ));
        }
    }

    // ---- CQ and queue state after the call
    run.eq(
        "cq.ci_after",
        cq.consumer_index() as i128,
        case.num("cq.ci_after"),
    );
    run.eq("cq.dbrec", f.dbrec_cq_ci() as i128, case.num("cq.dbrec"));
    let k = case.num("sq.tail_after") - sq_tail;
    let want_retired = match k {
        0 => Some(sq_pi),
        k if k > 0 && (k as usize) <= sq_ends.len() => Some(sq_ends[k as usize - 1]),
        _ => None,
    };
    match want_retired {
        Some(w) => run.eq(
            &format!("sq.tail_after (+{k} WRs) as our BB counter"),
            qp.sq.retired(),
            w,
        ),
        None => run.err(format!(
            "sq.tail_after - sq_tail = {k}: not within the {} WRs posted",
            sq_ends.len()
        )),
    }
    run.eq(
        "rq.tail_after",
        qp.rq.tail() as i128,
        case.num("rq.tail_after"),
    );

    // ---- buffers: listed mem.N ranges as given, everything else untouched
    for (i, (addr, want)) in mems.iter().enumerate() {
        let got = arena.read(*addr, want.len());
        for (off, (g, w)) in got.iter().zip(want).enumerate() {
            let w = w.unwrap_or(p);
            if *g != w {
                run.err(format!(
                    "mem.{i} ({addr:#x}) byte +{off:#05x}: got {g:#04x}, want {w:#04x}{}",
                    if want[off].is_none() {
                        " (untouched)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    for (base, buf) in &arena.regions {
        for (off, g) in buf.bytes().iter().enumerate() {
            let fake = base + off as u64;
            let listed = mems
                .iter()
                .any(|(a, b)| fake >= *a && fake < a + b.len() as u64);
            if !listed && *g != p {
                run.err(format!(
                    "buffer byte at fake address {fake:#x} written ({g:#04x}) outside every mem.N"
                ));
            }
        }
    }

    let mut errs = run.errs;
    let unused = case.unused_keys();
    if !unused.is_empty() {
        errs.push(format!(
            "[{}] keys never checked by the test: {unused:?}",
            case.name
        ));
    }
    errs
}

fn errors_both_prefills(case: &Case) -> Vec<String> {
    PREFILLS.iter().flat_map(|&p| run_cqe(case, p)).collect()
}

#[test]
fn golden_cqe_vectors() {
    let file = load();
    assert_eq!(
        Some(file.cases.len()),
        file.declared_cases,
        "parsed case count vs the header's `# cases:`"
    );
    let mut errs = Vec::new();
    for case in &file.cases {
        errs.extend(errors_both_prefills(case));
    }
    assert!(
        errs.is_empty(),
        "{} mismatches against libmlx5:\n{}",
        errs.len(),
        errs.iter()
            .take(200)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(file.cases.len(), EXPECTED_CASES, "cqe cases checked");
    eprintln!(
        "golden_cqe: {} cases, each with 0x00 and 0xff buffer prefill",
        file.cases.len()
    );
}

/// Proves the checks can fail: every expected result of every case is
/// changed in turn (wc fields, poll.rc, ci/dbrec, tails, each byte of
/// mem.N) and each change must be reported, naming the case.
#[test]
fn golden_cqe_mutations_are_detected() {
    let file = load();
    let mut mutations = 0usize;
    for case in &file.cases {
        let tag = format!("[{}]", case.name);
        let superseded = erratum(case).is_some();
        let keys: Vec<String> = case
            .keys()
            .filter(|k| {
                let wc = k.starts_with("wc.") && !k.ends_with("_name");
                (wc && !superseded)
                    || matches!(
                        *k,
                        "poll.rc" | "cq.ci_after" | "cq.dbrec" | "sq.tail_after" | "rq.tail_after"
                    )
                    || (k.starts_with("sq.") || k.starts_with("rq."))
                        && (k.ends_with(".slot")
                            || k.ends_with(".wqe_index")
                            || k.ends_with(".nbb"))
            })
            .map(str::to_string)
            .collect();
        for key in &keys {
            if superseded && (key == "poll.rc" || key == "rq.tail_after") {
                continue; // asserted verbatim by the erratum itself
            }
            let alt = match case.field(key) {
                Field::Value(v) => format!("{:#x}", v + 1),
                Field::Unwritten => continue, // "don't care" has no wrong value
            };
            let errs = errors_both_prefills(&case.with_value(key, &alt));
            assert!(
                errs.iter().any(|e| e.contains(&tag)),
                "{tag} {key} = {alt} was not detected"
            );
            mutations += 1;
        }
        for i in case.indices("mem") {
            let key = format!("mem.{i}");
            let orig = case.bytes(&key);
            for b in 0..orig.len() {
                let mut alts = vec![Some(orig[b].map_or(0x01, |x| x ^ 0x01))];
                if orig[b].is_some() {
                    alts.push(None);
                }
                for alt in alts {
                    let mut m = orig.clone();
                    m[b] = alt;
                    let errs = errors_both_prefills(&case.with_value(&key, &format_bytes(&m)));
                    let loc = format!("mem.{i} (");
                    let off = format!("byte +{b:#05x}");
                    assert!(
                        errs.iter()
                            .any(|e| e.contains(&tag) && e.contains(&loc) && e.contains(&off)),
                        "{tag} {key} byte {b} -> {alt:?} not reported; got {errs:#?}"
                    );
                    mutations += 1;
                }
            }
        }
        let errs = errors_both_prefills(&case.with_value("wc.0.unknown_field", "1"));
        assert!(
            errs.iter().any(|e| e.contains("keys never checked")),
            "{tag} an unknown key went unnoticed"
        );
    }
    eprintln!("golden_cqe: {mutations} single-field mutations all detected");
}
