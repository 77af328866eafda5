//! Golden vectors: UD send WQEs, SRQ receive WQEs and UD / SRQ
//! completions against rdma-core's libmlx5, byte for byte
//! (`testdata/mlx5/ud-srq-golden.txt`; its header describes every key).
//!
//! Every case runs with all "device" memory (QP buffer, doorbell records,
//! BlueFlame register, SRQ buffer) pre-filled with 0x00 and with 0xFF: a
//! `..` byte must keep the pre-fill, every other byte must equal the
//! vector, and bytes the vector does not list must be untouched. Every key
//! of every case is read (`Case::unused_keys`).

#[path = "golden/ud_srq_cqe.rs"]
mod cqe;
#[path = "golden/parse.rs"]
mod parse;
#[path = "golden/ud_srq_send.rs"]
mod send;
#[path = "golden/wc.rs"]
mod wc;

use cqe::run_cqe;
use send::run_send;

use std::ptr::NonNull;

use parse::{format_bytes, read_recv_wr, Case, Field, GoldenFile, SendWrSpec};
use rdma_direct::provider::mlx5::cq::{CqRoute, QpQueues};
use rdma_direct::provider::mlx5::{
    AhAttr, BfPolicy, CompletionQueue, GlobalRoute, LinkLayer, Mlx5Av, RecvQueue, SendQueue,
    SqConfig, Srq, SrqGeometry, SrqSlot, UdDest, Wc,
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
}
