//! Golden vectors: our mlx5 send/receive WQE encoder and doorbell against
//! rdma-core's libmlx5, byte for byte (`testdata/mlx5/wqe-golden.txt`).
//!
//! Every case runs twice, with all "device" memory (QP buffer, doorbell
//! records, BlueFlame register) pre-filled with 0x00 and with 0xFF, as the
//! generator did: a byte the vector shows as `..` must keep the pre-fill,
//! every other byte must equal the vector, and every byte the vector does
//! not list (other ring slots, the guard after the ring, the rest of the
//! register) must be untouched.

#[path = "golden/parse.rs"]
mod parse;

use parse::{
    format_bytes, read_recv_wr, read_send_wr, send_op, Case, Field, GoldenFile, SendWrSpec, SgeSpec,
};
use rdma_direct::provider::mlx5::{BfPolicy, SqConfig};
use rdma_direct::testutil::{decode_wqe, FakeGeometry, FakeMlx5};
use rdma_direct::{Payload, QpCaps, RecvWr, SendFlags, SendWr, Sge};

const PREFILLS: [u8; 2] = [0x00, 0xff];
const EXPECTED_SEND_CASES: usize = 20;
const EXPECTED_RECV_CASES: usize = 3;

fn load() -> GoldenFile {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/mlx5/wqe-golden.txt");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse::parse_file(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Collects mismatches of one run so a case reports all of them at once.
struct Run<'c> {
    case: &'c Case,
    prefill: u8,
    errs: Vec<String>,
}

impl<'c> Run<'c> {
    fn new(case: &'c Case, prefill: u8) -> Self {
        Run {
            case,
            prefill,
            errs: Vec::new(),
        }
    }

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

    /// Compares `got` against a vector byte string: `Some(b)` must equal,
    /// `None` must still hold the pre-fill.
    fn bytes(&mut self, what: &str, got: &[u8], want: &[Option<u8>]) {
        if got.len() != want.len() {
            self.err(format!(
                "{what}: {} bytes compared against a {}-byte vector",
                got.len(),
                want.len()
            ));
        }
        for (off, (g, w)) in got.iter().zip(want).enumerate() {
            match *w {
                Some(b) if *g != b => self.err(format!(
                    "{what} byte +{off:#05x}: got {g:#04x}, want {b:#04x}"
                )),
                None if *g != self.prefill => self.err(format!(
                    "{what} byte +{off:#05x}: got {g:#04x}, want untouched ({:#04x})",
                    self.prefill
                )),
                _ => {}
            }
        }
    }

    /// Every byte must still hold the pre-fill.
    fn untouched(&mut self, what: &str, got: &[u8]) {
        for (off, g) in got.iter().enumerate() {
            if *g != self.prefill {
                self.err(format!(
                    "{what} byte +{off:#05x}: got {g:#04x}, want untouched ({:#04x})",
                    self.prefill
                ));
            }
        }
    }

    /// A doorbell-record word: a number, or `..` = untouched.
    fn dbrec_word(&mut self, what: &str, raw: &[u8], got_host: u32, want: Field) {
        match want {
            Field::Value(v) => self.eq(what, got_host as i128, v),
            Field::Unwritten => self.untouched(what, raw),
        }
    }

    fn finish(self, unused_check: bool) -> Vec<String> {
        let mut errs = self.errs;
        if unused_check {
            let unused = self.case.unused_keys();
            if !unused.is_empty() {
                errs.push(format!(
                    "[{}] keys never checked by the test: {unused:?}",
                    self.case.name
                ));
            }
        }
        errs
    }
}

/// Owned storage behind one typed `SendWr`.
struct WrStore {
    sges: Vec<Sge>,
    inline: Vec<Vec<u8>>,
}

fn is_inline(spec: &SendWrSpec) -> bool {
    spec.send_flags & SendFlags::INLINE.0 != 0
}

fn store_for(case: &Case, spec: &SendWrSpec) -> WrStore {
    let inline = is_inline(spec);
    let mut st = WrStore {
        sges: Vec::new(),
        inline: Vec::new(),
    };
    for (k, &(addr, len, lkey)) in spec.sges.iter().enumerate() {
        match (&spec.sge_data[k], inline) {
            (Some(d), true) => {
                assert_eq!(
                    d.len(),
                    len as usize,
                    "[{}] sge.{k}.data length vs sge length",
                    case.name
                );
                st.inline.push(d.clone());
            }
            (None, true) => panic!("[{}] inline WR without sge.{k}.data", case.name),
            (Some(_), false) => panic!("[{}] sge.{k}.data on a non-inline WR", case.name),
            (None, false) => st.sges.push(Sge::new(addr, len, lkey)),
        }
    }
    st
}

fn send_wr<'a>(
    case: &Case,
    spec: &SendWrSpec,
    store: &'a WrStore,
    pieces: &'a [&'a [u8]],
) -> SendWr<'a> {
    let known = SendFlags::ALL.0;
    assert_eq!(
        spec.send_flags & !known,
        0,
        "[{}] unknown send_flags bits {:#x}",
        case.name,
        spec.send_flags
    );
    let flags = SendFlags(spec.send_flags & !SendFlags::INLINE.0);
    let op = send_op(case, spec);
    let payload = if is_inline(spec) {
        Payload::Inline(pieces)
    } else {
        Payload::Sges(&store.sges)
    };
    SendWr {
        wr_id: spec.wr_id,
        op,
        payload,
        flags,
    }
}

fn fill_device_memory(f: &mut FakeMlx5, p: u8) {
    f.qp_buf.fill(p);
    f.dbrec.fill(p);
    f.bf.fill(p);
}

/// Checks the ring slots of a queue: listed slots against the vector,
/// unlisted slots untouched.
fn check_ring(
    run: &mut Run<'_>,
    queue: &str,
    ring: &[u8],
    stride: usize,
    listed: &[(u64, Vec<Option<u8>>)],
) {
    let slots = ring.len() / stride;
    for s in 0..slots {
        let got = &ring[s * stride..(s + 1) * stride];
        match listed.iter().find(|(i, _)| *i as usize == s) {
            Some((_, want)) => run.bytes(&format!("{queue} slot {s}"), got, want),
            None => run.untouched(&format!("{queue} slot {s} (not in the vector)"), got),
        }
    }
    for (i, _) in listed {
        if *i as usize >= slots {
            run.err(format!("{queue} slot {i} listed but the ring has {slots}"));
        }
    }
}

/// Expected per-WQE data parsed back by `decode_wqe`, from the WR itself.
fn check_decoded(run: &mut Run<'_>, n: usize, ring: &[u8], slot: u32, spec: &SendWrSpec) {
    let d = match decode_wqe(ring, slot) {
        Ok(d) => d,
        Err(e) => {
            run.err(format!("wqe.{n}: decode_wqe(slot {slot}) failed: {e:?}"));
            return;
        }
    };
    let case = run.case;
    let field = |k: &str| case.num(&format!("wqe.{n}.{k}"));
    run.eq(
        &format!("wqe.{n}.opcode"),
        d.opcode as i128,
        field("opcode"),
    );
    run.eq(&format!("wqe.{n}.opmod"), d.opmod as i128, field("opmod"));
    run.eq(
        &format!("wqe.{n}.wqe_index"),
        d.wqe_index as i128,
        field("wqe_index"),
    );
    run.eq(&format!("wqe.{n}.qpn"), d.qpn as i128, field("qpn"));
    run.eq(&format!("wqe.{n}.ds"), d.ds as i128, field("ds"));
    run.eq(
        &format!("wqe.{n}.fm_ce_se"),
        d.fm_ce_se as i128,
        field("fm_ce_se"),
    );
    run.eq(&format!("wqe.{n}.imm"), d.imm as i128, field("imm"));
    // The decoded segments must describe the WR that was posted.
    run.eq(
        &format!("wqe.{n} decoded remote"),
        d.remote,
        spec.remote_addr.zip(spec.rkey),
    );
    let atomic = match spec.opcode.as_str() {
        "ATOMIC_CMP_AND_SWP" => Some((spec.swap.unwrap_or(0), spec.compare_add)),
        "ATOMIC_FETCH_AND_ADD" => Some((spec.compare_add.unwrap_or(0), None)),
        _ => None,
    };
    run.eq(&format!("wqe.{n} decoded atomic"), d.atomic, atomic);
    if is_inline(spec) {
        let data: Vec<u8> = spec.sge_data.iter().flatten().flatten().copied().collect();
        let want = (!data.is_empty()).then_some(data);
        run.eq(&format!("wqe.{n} decoded inline"), d.inline, want);
        run.eq(&format!("wqe.{n} decoded sges"), d.sges, vec![]);
    } else {
        let atomic_op = atomic.is_some();
        let want: Vec<SgeSpec> = spec
            .sges
            .iter()
            .filter(|s| s.1 != 0)
            .map(|&(a, l, k)| (a, if atomic_op { 8 } else { l }, k))
            .collect();
        run.eq(&format!("wqe.{n} decoded sges"), d.sges, want);
        run.eq(&format!("wqe.{n} decoded inline"), d.inline, None);
    }
}

fn run_send(case: &Case, p: u8) -> Vec<String> {
    let mut run = Run::new(case, p);
    assert_eq!(case.str("qp_type"), "RC", "[{}] qp_type", case.name);
    let sq_wqe_cnt = case.u32("sq_wqe_cnt");
    let bf_size = case.u32("bf_size");
    let geo = FakeGeometry {
        sq_wqe_cnt,
        qpn: case.u32("qpn"),
        bf_size,
        ..FakeGeometry::default()
    };
    let mut f = FakeMlx5::new(geo);
    fill_device_memory(&mut f, p);

    let prefer_bf = case.flag("prefer_bf");
    let shut_up_bf = case.flag("shut_up_bf");
    let cfg = SqConfig {
        bf_policy: if shut_up_bf {
            BfPolicy::Never
        } else if !prefer_bf {
            BfPolicy::SingleInlineWqe
        } else {
            BfPolicy::SingleWqe
        },
        sig_all: case.flag("sq_sig_all"),
        shared_register: false,
    };
    let caps = f.caps(case.u32("max_send_sge"), case.u32("max_inline"));
    let mut sq = f
        .send_queue(caps, cfg)
        .unwrap_or_else(|e| panic!("[{}] send_queue: {e:?}", case.name));
    sq.reset_counters(case.u32("sq_pi"));
    let bf_offset = case.u32("bf_offset");
    sq.set_bf_offset(bf_offset);
    run.eq("bf_offset set", sq.bf_offset(), bf_offset);

    // The WR list.
    let nwr = case.num("nwr") as usize;
    run.eq("wr indices", case.indices("wr"), (0..nwr as u64).collect());
    let specs: Vec<SendWrSpec> = (0..nwr)
        .map(|i| read_send_wr(case, &format!("wr.{i}")))
        .collect();
    let stores: Vec<WrStore> = specs.iter().map(|s| store_for(case, s)).collect();
    let pieces: Vec<Vec<&[u8]>> = stores
        .iter()
        .map(|st| st.inline.iter().map(|v| v.as_slice()).collect())
        .collect();
    let wrs: Vec<SendWr<'_>> = specs
        .iter()
        .zip(&stores)
        .zip(&pieces)
        .map(|((sp, st), pc)| send_wr(case, sp, st, pc))
        .collect();

    // One ibv_post_send call = post every WR, then ring once.
    let rc = case.num("rc");
    let bad_wr = case.num("bad_wr");
    let mut posted: Vec<(u32, u32)> = Vec::new(); // (first BB counter, nbb)
    let mut failed_at: i128 = -1;
    for (i, wr) in wrs.iter().enumerate() {
        let before = sq.producer();
        // SAFETY: the SGE addresses are never dereferenced: nothing
        // executes these WQEs, and no completion is polled here.
        match unsafe { sq.post(wr) } {
            Ok(()) => posted.push((before, sq.producer().wrapping_sub(before))),
            Err(e) => {
                if rc == 0 {
                    run.err(format!("post wr.{i}: {e:?} (libmlx5 accepted it)"));
                }
                failed_at = i as i128;
                break;
            }
        }
    }
    run.eq("bad_wr", failed_at, bad_wr);
    let bf_used = sq.bf_offset();
    sq.ring();

    // Counters and doorbell records.
    run.eq(
        "sq_pi_after",
        sq.producer() as i128,
        case.num("sq_pi_after"),
    );
    let sq_word = f.dbrec_sq();
    let rq_word = f.dbrec_rq();
    let raw = f.dbrec.bytes().to_vec();
    run.dbrec_word("dbrec.sq", &raw[4..8], sq_word, case.field("dbrec.sq"));
    run.dbrec_word("dbrec.rq", &raw[0..4], rq_word, case.field("dbrec.rq"));
    run.untouched("dbrec (rest of the record page)", &raw[8..]);

    // Each WQE: slot / nbb from our counters, control fields and segments
    // through the independent decoder.
    let mask = sq_wqe_cnt - 1;
    run.eq("nwqe", posted.len() as i128, case.num("nwqe"));
    run.eq(
        "wqe indices",
        case.indices("wqe"),
        (0..posted.len() as u64).collect(),
    );
    for (n, &(start, nbb)) in posted.iter().enumerate() {
        run.eq(
            &format!("wqe.{n}.slot"),
            (start & mask) as i128,
            case.num(&format!("wqe.{n}.slot")),
        );
        run.eq(
            &format!("wqe.{n}.nbb"),
            nbb as i128,
            case.num(&format!("wqe.{n}.nbb")),
        );
        check_decoded(&mut run, n, f.sq_bytes(), start & mask, &specs[n]);
    }

    // The SQ ring, byte for byte; every listed BB belongs to a WQE.
    let listed: Vec<(u64, Vec<Option<u8>>)> = case
        .indices("bb")
        .into_iter()
        .map(|s| (s, case.bytes(&format!("bb.{s}"))))
        .collect();
    let mut wqe_bbs: Vec<u64> = posted
        .iter()
        .flat_map(|&(start, nbb)| (0..nbb).map(move |i| (start.wrapping_add(i) & mask) as u64))
        .collect();
    wqe_bbs.sort_unstable();
    run.eq("bb.S slots vs the WQEs' BBs", case.indices("bb"), wqe_bbs);
    // scratch.S: libmlx5 wrote there for a WR that then failed. We write
    // nothing for a rejected WR, so those slots must be untouched.
    for s in case.indices("scratch") {
        case.bytes(&format!("scratch.{s}"));
    }
    let sq_ring = f.sq_bytes().to_vec();
    check_ring(&mut run, "SQ", &sq_ring, 64, &listed);
    let sq_off = f.sq_offset();
    let all = f.qp_buf.bytes().to_vec();
    run.untouched("RQ region of the QP buffer", &all[..sq_off]);
    run.untouched("guard after the SQ ring", &all[sq_off + sq_ring.len()..]);

    // The doorbell register.
    let data = case.bytes("bf.data");
    let len = case.num("bf.len") as usize;
    run.eq("bf.len vs bf.data length", data.len(), len);
    let off = case.num("bf.offset") as usize;
    run.eq("bf.offset", bf_used as usize, off);
    let reg = f.bf.bytes().to_vec();
    if off + data.len() <= reg.len() {
        run.bytes(
            &format!("BF register +{off:#x}"),
            &reg[off..off + data.len()],
            &data,
        );
        run.untouched("BF register before the write", &reg[..off]);
        run.untouched("BF register after the write", &reg[off + data.len()..]);
    } else {
        run.err(format!("bf write {off}+{} beyond the register", data.len()));
    }
    run.eq(
        "bf.offset_after",
        sq.bf_offset() as i128,
        case.num("bf.offset_after"),
    );
    // We return typed errors, not errnos: compare "failed or not".
    run.eq("rc != 0 (a WR was rejected)", failed_at >= 0, rc != 0);
    run.finish(p == PREFILLS[0])
}

fn run_recv(case: &Case, p: u8) -> Vec<String> {
    let mut run = Run::new(case, p);
    assert_eq!(case.str("qp_type"), "RC", "[{}] qp_type", case.name);
    let rq_wqe_cnt = case.u32("rq_wqe_cnt");
    let rq_stride = case.u32("rq_stride");
    let max_recv_sge = case.u32("max_recv_sge");
    run.eq(
        "rq_stride vs max_recv_sge",
        rq_stride,
        (16 * max_recv_sge.max(1)).next_power_of_two(),
    );
    let geo = FakeGeometry {
        rq_wqe_cnt,
        rq_stride,
        qpn: case.u32("qpn"),
        ..FakeGeometry::default()
    };
    let mut f = FakeMlx5::new(geo);
    fill_device_memory(&mut f, p);
    let caps = QpCaps {
        max_send_sge: 1,
        max_inline_data: 0,
        max_recv_sge,
    };
    let mut rq = f
        .recv_queue(caps)
        .unwrap_or_else(|e| panic!("[{}] recv_queue: {e:?}", case.name));
    let head = case.u32("rq_head");
    rq.reset_counters(head);

    let nwr = case.num("nwr") as usize;
    run.eq("wr indices", case.indices("wr"), (0..nwr as u64).collect());
    let specs: Vec<(u64, Vec<Sge>)> = (0..nwr)
        .map(|i| {
            let (id, sges) = read_recv_wr(case, &format!("wr.{i}"));
            (
                id,
                sges.into_iter()
                    .map(|(a, l, k)| Sge::new(a, l, k))
                    .collect(),
            )
        })
        .collect();
    let wrs: Vec<RecvWr<'_>> = specs
        .iter()
        .map(|(id, s)| RecvWr {
            wr_id: *id,
            sges: s,
        })
        .collect();
    // One ibv_post_recv call.
    // SAFETY: the SGE addresses are never dereferenced (nothing receives).
    let res = unsafe { rq.post_list(&wrs) };
    let failed_at = match res {
        Ok(()) => -1,
        Err(rdma_direct::PostError { index: i, error: e }) => {
            if case.num("rc") == 0 {
                run.err(format!("post_list failed at wr.{i}: {e:?}"));
            }
            i as i128
        }
    };
    run.eq("bad_wr", failed_at, case.num("bad_wr"));
    let rc = case.num("rc");
    run.eq("rc != 0 (a WR was rejected)", failed_at >= 0, rc != 0);
    run.eq(
        "rq_head_after",
        rq.head() as i128,
        case.num("rq_head_after"),
    );

    let sq_word = f.dbrec_sq();
    let rq_word = f.dbrec_rq();
    let raw = f.dbrec.bytes().to_vec();
    run.dbrec_word("dbrec.rq", &raw[0..4], rq_word, case.field("dbrec.rq"));
    run.dbrec_word("dbrec.sq", &raw[4..8], sq_word, case.field("dbrec.sq"));
    run.untouched("dbrec (rest of the record page)", &raw[8..]);

    let posted = rq.head().wrapping_sub(head);
    run.eq("nrwqe", posted as i128, case.num("nrwqe"));
    let mut want_slots: Vec<u64> = (0..posted)
        .map(|i| (head.wrapping_add(i) & (rq_wqe_cnt - 1)) as u64)
        .collect();
    want_slots.sort_unstable();
    run.eq(
        "rwqe.S slots vs posted receives",
        case.indices("rwqe"),
        want_slots,
    );
    let listed: Vec<(u64, Vec<Option<u8>>)> = case
        .indices("rwqe")
        .into_iter()
        .map(|s| (s, case.bytes(&format!("rwqe.{s}"))))
        .collect();
    let rq_ring = f.rq_bytes().to_vec();
    check_ring(&mut run, "RQ", &rq_ring, rq_stride as usize, &listed);
    let all = f.qp_buf.bytes().to_vec();
    run.untouched(
        "QP buffer after the RQ (SQ ring, guard)",
        &all[rq_ring.len()..],
    );
    run.untouched("BF register", f.bf.bytes());
    run.finish(p == PREFILLS[0])
}

#[test]
fn golden_wqe_vectors() {
    let file = load();
    assert_eq!(
        Some(file.cases.len()),
        file.declared_cases,
        "parsed case count vs the header's `# cases:`"
    );
    let mut errs = Vec::new();
    let (mut sends, mut recvs) = (0usize, 0usize);
    for case in &file.cases {
        for p in PREFILLS {
            errs.extend(run_case(case, p));
        }
        match case.str("kind") {
            "send" => sends += 1,
            _ => recvs += 1,
        }
    }
    let shown: Vec<&String> = errs.iter().take(200).collect();
    assert!(
        errs.is_empty(),
        "{} mismatches against libmlx5:\n{}",
        errs.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(sends, EXPECTED_SEND_CASES, "send cases checked");
    assert_eq!(recvs, EXPECTED_RECV_CASES, "recv cases checked");
    eprintln!("golden_wqe: {sends} send + {recvs} recv cases, each with 0x00 and 0xff prefill");
}

fn run_case(case: &Case, p: u8) -> Vec<String> {
    case.ignore("desc");
    match case.str("kind") {
        "send" => run_send(case, p),
        "recv" => run_recv(case, p),
        other => panic!("[{}] unknown kind {other:?}", case.name),
    }
}

fn errors_both_prefills(case: &Case) -> Vec<String> {
    PREFILLS.iter().flat_map(|&p| run_case(case, p)).collect()
}

/// Where a byte mismatch of vector key `key` is reported.
fn byte_location(case: &Case, key: &str, i: usize) -> String {
    if let Some(s) = key.strip_prefix("bb.") {
        format!("SQ slot {s} byte +{i:#05x}")
    } else if let Some(s) = key.strip_prefix("rwqe.") {
        format!("RQ slot {s} byte +{i:#05x}")
    } else {
        assert_eq!(key, "bf.data");
        format!("BF register +{:#x} byte +{i:#05x}", case.num("bf.offset"))
    }
}

/// Proves the checks can fail: every expected byte of every case is
/// changed (to another value, and from "written" to ".."), and every
/// expected result number is changed; each change must be reported with
/// the case name and, for bytes, the slot and byte offset.
#[test]
fn golden_wqe_mutations_are_detected() {
    let file = load();
    let mut mutations = 0usize;
    for case in &file.cases {
        let base = errors_both_prefills(case);
        assert!(base.is_empty(), "baseline must pass: {base:?}");
        let byte_keys: Vec<String> = case
            .keys()
            .filter(|k| k.starts_with("bb.") || k.starts_with("rwqe.") || *k == "bf.data")
            .map(str::to_string)
            .collect();
        for key in &byte_keys {
            let orig = case.bytes(key);
            for i in 0..orig.len() {
                let mut alts = vec![Some(orig[i].map_or(0x01, |b| b ^ 0x01))];
                if orig[i].is_some() {
                    alts.push(None);
                }
                for alt in alts {
                    let mut m = orig.clone();
                    m[i] = alt;
                    let mutated = case.with_value(key, &format_bytes(&m));
                    let errs = errors_both_prefills(&mutated);
                    let loc = byte_location(case, key, i);
                    let tag = format!("[{}]", case.name);
                    assert!(
                        errs.iter().any(|e| e.contains(&tag) && e.contains(&loc)),
                        "{tag} {key} byte {i} changed to {alt:?} was not reported at {loc:?}; got {errs:#?}"
                    );
                    mutations += 1;
                }
            }
        }
        let numeric_keys: Vec<String> = case
            .keys()
            .filter(|k| {
                matches!(
                    *k,
                    "sq_pi_after"
                        | "dbrec.sq"
                        | "dbrec.rq"
                        | "nwqe"
                        | "nrwqe"
                        | "rq_head_after"
                        | "bf.offset"
                        | "bf.len"
                        | "bf.offset_after"
                        | "rc"
                        | "bad_wr"
                ) || (k.starts_with("wqe.") && !k.ends_with("_name"))
            })
            .map(str::to_string)
            .collect();
        for key in &numeric_keys {
            let alts: Vec<String> = match case.field(key) {
                Field::Value(v) => {
                    let mut a = vec![format!("{}", v + 1)];
                    if key.starts_with("dbrec.") {
                        a.push("..".to_string());
                    }
                    a
                }
                Field::Unwritten => vec!["0x1".to_string()],
            };
            for alt in alts {
                let mutated = case.with_value(key, &alt);
                let errs = errors_both_prefills(&mutated);
                let tag = format!("[{}]", case.name);
                assert!(
                    errs.iter().any(|e| e.contains(&tag)),
                    "{tag} {key} = {alt} was not detected"
                );
                mutations += 1;
            }
        }
        // A key the test does not know must not be silently ignored.
        let mutated = case.with_value("wqe.0.unknown_field", "1");
        assert!(
            errors_both_prefills(&mutated)
                .iter()
                .any(|e| e.contains("keys never checked")),
            "[{}] an unknown key went unnoticed",
            case.name
        );
    }
    eprintln!("golden_wqe: {mutations} single-field mutations all detected");
}
