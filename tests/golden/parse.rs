//! A std-only parser for the mlx5 golden-vector files in `testdata/mlx5/`
//! (`wqe-golden.txt`, `cqe-golden.txt`). Written from the format
//! description in the files' header:
//!
//! * a line starting with `#` is a comment;
//! * `[name]` starts a case; cases are separated by blank lines;
//! * every other line is `key = value`, split at the first `" = "`, both
//!   sides trimmed;
//! * numbers: `0x...` is hexadecimal, anything else decimal (may be
//!   negative);
//! * byte strings: delete all whitespace, then read two characters per
//!   byte; `..` is a byte that was not written ("don't care / untouched").
//!
//! Every accessor records the key it read, so a test can prove it looked
//! at every key of a case ([`Case::unused_keys`]): a key added to the
//! vectors later cannot be silently ignored.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

/// One `[name]` block.
#[derive(Clone, Debug)]
pub struct Case {
    /// The name between the brackets.
    pub name: String,
    /// 1-based line number of the `[name]` line.
    pub line: usize,
    /// key -> (value, 1-based line number).
    entries: BTreeMap<String, (String, usize)>,
    /// Keys read through an accessor.
    used: RefCell<BTreeSet<String>>,
}

/// A parsed file.
#[derive(Debug)]
pub struct GoldenFile {
    /// The cases in file order.
    pub cases: Vec<Case>,
    /// The `N` of a `# cases: N` header comment, if present.
    pub declared_cases: Option<usize>,
}

/// A numeric field that may be `..` (not written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Not written by libmlx5 (don't care).
    Unwritten,
    /// A value.
    Value(i128),
}

/// Parses a number: `0x` hex or decimal, optionally negative.
pub fn parse_number(s: &str) -> Result<i128, String> {
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let v = if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        if hex.is_empty() {
            return Err(format!("empty hex number {s:?}"));
        }
        i128::from_str_radix(hex, 16).map_err(|e| format!("bad hex number {s:?}: {e}"))?
    } else {
        if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad decimal number {s:?}"));
        }
        body.parse::<i128>()
            .map_err(|e| format!("bad decimal number {s:?}: {e}"))?
    };
    Ok(if neg { -v } else { v })
}

/// Parses a byte string: whitespace removed, two characters per byte,
/// `..` = `None`.
pub fn parse_bytes(s: &str) -> Result<Vec<Option<u8>>, String> {
    let compact: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if compact.len() % 2 != 0 {
        return Err(format!(
            "byte string has an odd number of characters ({}): {s:?}",
            compact.len()
        ));
    }
    let mut out = Vec::with_capacity(compact.len() / 2);
    for (i, pair) in compact.chunks(2).enumerate() {
        if pair == b".." {
            out.push(None);
            continue;
        }
        let txt = std::str::from_utf8(pair).map_err(|_| format!("non-ASCII in byte {i}"))?;
        if !pair.iter().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("byte {i} is {txt:?}: neither hex nor \"..\""));
        }
        out.push(Some(
            u8::from_str_radix(txt, 16).map_err(|e| e.to_string())?,
        ));
    }
    Ok(out)
}

/// Formats bytes in the vector syntax (`..` for `None`), 4-byte groups.
pub fn format_bytes(b: &[Option<u8>]) -> String {
    let mut out = String::new();
    for (i, x) in b.iter().enumerate() {
        if i > 0 && i % 4 == 0 {
            out.push(' ');
        }
        match x {
            Some(v) => out.push_str(&format!("{v:02x}")),
            None => out.push_str(".."),
        }
    }
    out
}

/// Parses a whole file.
pub fn parse_file(text: &str) -> Result<GoldenFile, String> {
    let mut cases: Vec<Case> = Vec::new();
    let mut declared = None;
    let mut in_case = false;
    for (idx, raw) in text.lines().enumerate() {
        let lineno = idx + 1;
        let line = raw.trim();
        if line.is_empty() {
            in_case = false;
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            if let Some(n) = c.trim().strip_prefix("cases:") {
                let n = parse_number(n).map_err(|e| format!("line {lineno}: {e}"))?;
                declared = Some(n as usize);
            }
            continue;
        }
        if line.starts_with('[') {
            let name = line
                .strip_prefix('[')
                .and_then(|l| l.strip_suffix(']'))
                .ok_or_else(|| format!("line {lineno}: malformed case header {line:?}"))?;
            if name.is_empty() {
                return Err(format!("line {lineno}: empty case name"));
            }
            if cases.iter().any(|c| c.name == name) {
                return Err(format!("line {lineno}: duplicate case [{name}]"));
            }
            cases.push(Case {
                name: name.to_string(),
                line: lineno,
                entries: BTreeMap::new(),
                used: RefCell::new(BTreeSet::new()),
            });
            in_case = true;
            continue;
        }
        // key = value (split at the FIRST " = "); a value may be empty.
        let (k, v) = match line.find(" = ") {
            Some(p) => (&line[..p], &line[p + 3..]),
            None => match line.strip_suffix(" =") {
                Some(k) => (k, ""),
                None => return Err(format!("line {lineno}: not `key = value`: {line:?}")),
            },
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(format!("line {lineno}: empty key"));
        }
        if !in_case {
            return Err(format!(
                "line {lineno}: key {k:?} outside a case (missing [name] after a blank line?)"
            ));
        }
        let case = cases.last_mut().expect("in_case implies a case");
        if case
            .entries
            .insert(k.to_string(), (v.to_string(), lineno))
            .is_some()
        {
            return Err(format!(
                "line {lineno}: duplicate key {k:?} in [{}]",
                case.name
            ));
        }
    }
    Ok(GoldenFile {
        cases,
        declared_cases: declared,
    })
}

impl Case {
    fn mark(&self, key: &str) {
        self.used.borrow_mut().insert(key.to_string());
    }

    fn fail(&self, key: &str, msg: &str) -> ! {
        let line = self.entries.get(key).map(|e| e.1).unwrap_or(self.line);
        panic!("[{}] (line {line}) key {key:?}: {msg}", self.name)
    }

    /// True if the key exists (does not mark it used).
    pub fn has(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// The raw value, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.mark(key);
        self.entries.get(key).map(|e| e.0.as_str())
    }

    /// The raw value; panics (naming the case) if absent.
    pub fn str(&self, key: &str) -> &str {
        match self.get(key) {
            Some(v) => v,
            None => self.fail(key, "missing"),
        }
    }

    /// A numeric value that may be `..`.
    pub fn field(&self, key: &str) -> Field {
        let v = self.str(key);
        if v == ".." {
            return Field::Unwritten;
        }
        match parse_number(v) {
            Ok(n) => Field::Value(n),
            Err(e) => self.fail(key, &e),
        }
    }

    /// A numeric value; `..` is an error.
    pub fn num(&self, key: &str) -> i128 {
        match self.field(key) {
            Field::Value(n) => n,
            Field::Unwritten => self.fail(key, "expected a number, found \"..\""),
        }
    }

    /// An optional numeric value.
    pub fn opt_num(&self, key: &str) -> Option<i128> {
        if self.has(key) {
            Some(self.num(key))
        } else {
            self.mark(key);
            None
        }
    }

    /// A number that must fit in `u64`.
    pub fn u64(&self, key: &str) -> u64 {
        let n = self.num(key);
        u64::try_from(n).unwrap_or_else(|_| self.fail(key, "out of u64 range"))
    }

    /// A number that must fit in `u32`.
    pub fn u32(&self, key: &str) -> u32 {
        let n = self.num(key);
        u32::try_from(n).unwrap_or_else(|_| self.fail(key, "out of u32 range"))
    }

    /// A 0/1 flag.
    pub fn flag(&self, key: &str) -> bool {
        match self.num(key) {
            0 => false,
            1 => true,
            _ => self.fail(key, "expected 0 or 1"),
        }
    }

    /// A byte string (`..` = `None`).
    pub fn bytes(&self, key: &str) -> Vec<Option<u8>> {
        let v = self.str(key);
        parse_bytes(v).unwrap_or_else(|e| self.fail(key, &e))
    }

    /// A byte string in which every byte must be written.
    pub fn bytes_exact(&self, key: &str) -> Vec<u8> {
        self.bytes(key)
            .into_iter()
            .enumerate()
            .map(|(i, b)| b.unwrap_or_else(|| self.fail(key, &format!("byte {i} is \"..\""))))
            .collect()
    }

    /// An SGE `addr:length:lkey` (addr and lkey hex, length decimal).
    pub fn sge(&self, key: &str) -> SgeSpec {
        let v = self.str(key);
        let parts: Vec<&str> = v.split(':').collect();
        if parts.len() != 3 {
            self.fail(key, "expected addr:length:lkey");
        }
        let hex = |s: &str| -> u64 {
            let s = s.trim();
            let h = s.strip_prefix("0x").unwrap_or(s);
            u64::from_str_radix(h, 16).unwrap_or_else(|e| self.fail(key, &e.to_string()))
        };
        let addr = hex(parts[0]);
        let len: u32 = parts[1]
            .trim()
            .parse()
            .unwrap_or_else(|e: std::num::ParseIntError| self.fail(key, &e.to_string()));
        let lkey = u32::try_from(hex(parts[2])).unwrap_or_else(|_| self.fail(key, "lkey > u32"));
        (addr, len, lkey)
    }

    /// Every key of the case (does not mark them used).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|k| k.as_str())
    }

    /// The distinct indices `N` of keys `prefix.N` and `prefix.N.*`, sorted
    /// numerically.
    pub fn indices(&self, prefix: &str) -> Vec<u64> {
        let p = format!("{prefix}.");
        let mut out = BTreeSet::new();
        for k in self.entries.keys() {
            if let Some(rest) = k.strip_prefix(&p) {
                let head = rest.split('.').next().unwrap_or("");
                if !head.is_empty() && head.bytes().all(|b| b.is_ascii_digit()) {
                    out.insert(head.parse::<u64>().expect("digits"));
                }
            }
        }
        out.into_iter().collect()
    }

    /// Marks keys as deliberately not checked (e.g. human-readable names).
    pub fn ignore(&self, key: &str) {
        self.mark(key);
    }

    /// A copy with `key` set to `value` (added if absent) and a fresh
    /// used-key record. For mutation self-tests: a changed expectation must
    /// make the check fail.
    pub fn with_value(&self, key: &str, value: &str) -> Case {
        let mut c = self.clone();
        let line = c.entries.get(key).map(|e| e.1).unwrap_or(c.line);
        c.entries.insert(key.to_string(), (value.to_string(), line));
        c.used = RefCell::new(BTreeSet::new());
        c
    }

    /// Keys never read through an accessor.
    pub fn unused_keys(&self) -> Vec<String> {
        let used = self.used.borrow();
        self.entries
            .keys()
            .filter(|k| !used.contains(*k))
            .cloned()
            .collect()
    }
}

/// An SGE as the vectors give it: `(addr, length, lkey)`.
pub type SgeSpec = (u64, u32, u32);

/// A send work request as the vectors describe it (`wr.N.*` in the WQE
/// file, `sq.N.*` in the CQE file). Plain data: the tests translate it to
/// the crate's typed `SendWr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWrSpec {
    /// `wr_id`.
    pub wr_id: u64,
    /// `ibv_wr_opcode` name.
    pub opcode: String,
    /// `IBV_SEND_*` mask.
    pub send_flags: u32,
    /// `imm_data` (host value; posted as `htobe32(v)`).
    pub imm_data: Option<u32>,
    /// `invalidate_rkey`.
    pub invalidate_rkey: Option<u32>,
    /// `remote_addr`.
    pub remote_addr: Option<u64>,
    /// `rkey`.
    pub rkey: Option<u32>,
    /// `compare_add` (CAS compare value, or the fetch-add addend).
    pub compare_add: Option<u64>,
    /// `swap`.
    pub swap: Option<u64>,
    /// SGEs `(addr, length, lkey)`.
    pub sges: Vec<SgeSpec>,
    /// `sge.K.data` (inline payload bytes), per SGE.
    pub sge_data: Vec<Option<Vec<u8>>>,
}

/// `enum ibv_wr_opcode` values by name.
pub fn ibv_wr_opcode_num(name: &str) -> Option<i128> {
    Some(match name {
        "RDMA_WRITE" => 0,
        "RDMA_WRITE_WITH_IMM" => 1,
        "SEND" => 2,
        "SEND_WITH_IMM" => 3,
        "RDMA_READ" => 4,
        "ATOMIC_CMP_AND_SWP" => 5,
        "ATOMIC_FETCH_AND_ADD" => 6,
        "LOCAL_INV" => 7,
        "BIND_MW" => 8,
        "SEND_WITH_INV" => 9,
        _ => return None,
    })
}

/// The SGEs `prefix.sge.K` for `K < prefix.num_sge`, checking that no
/// other `sge.K` keys exist.
fn read_sges(case: &Case, prefix: &str) -> Vec<SgeSpec> {
    let n = case.num(&format!("{prefix}.num_sge"));
    let idx = case.indices(&format!("{prefix}.sge"));
    let want: Vec<u64> = (0..n as u64).collect();
    if idx != want {
        panic!(
            "[{}] {prefix}.num_sge = {n} but sge indices are {idx:?}",
            case.name
        );
    }
    (0..n)
        .map(|k| case.sge(&format!("{prefix}.sge.{k}")))
        .collect()
}

/// Reads the send WR at `prefix` (e.g. `wr.0`, `sq.2`). The opcode number
/// is checked against the name.
pub fn read_send_wr(case: &Case, prefix: &str) -> SendWrSpec {
    let k = |s: &str| format!("{prefix}.{s}");
    let opcode = case.str(&k("opcode")).to_string();
    let num = case.num(&k("opcode_num"));
    match ibv_wr_opcode_num(&opcode) {
        Some(n) if n == num => {}
        other => panic!(
            "[{}] {prefix}.opcode {opcode:?} (= {other:?}) disagrees with opcode_num {num}",
            case.name
        ),
    }
    let sges = read_sges(case, prefix);
    let sge_data = (0..sges.len())
        .map(|i| {
            let key = k(&format!("sge.{i}.data"));
            case.has(&key).then(|| case.bytes_exact(&key))
        })
        .collect();
    let u32_opt = |s: &str| {
        case.opt_num(&k(s)).map(|v| {
            u32::try_from(v).unwrap_or_else(|_| panic!("[{}] {prefix}.{s} > u32", case.name))
        })
    };
    let u64_opt = |s: &str| {
        case.opt_num(&k(s)).map(|v| {
            u64::try_from(v).unwrap_or_else(|_| panic!("[{}] {prefix}.{s} > u64", case.name))
        })
    };
    SendWrSpec {
        wr_id: case.u64(&k("wr_id")),
        send_flags: case.u32(&k("send_flags")),
        imm_data: u32_opt("imm_data"),
        invalidate_rkey: u32_opt("invalidate_rkey"),
        remote_addr: u64_opt("remote_addr"),
        rkey: u32_opt("rkey"),
        compare_add: u64_opt("compare_add"),
        swap: u64_opt("swap"),
        opcode,
        sges,
        sge_data,
    }
}

/// Reads the receive WR at `prefix`: `(wr_id, sges)`.
pub fn read_recv_wr(case: &Case, prefix: &str) -> (u64, Vec<SgeSpec>) {
    (
        case.u64(&format!("{prefix}.wr_id")),
        read_sges(case, prefix),
    )
}

/// Translates a vector WR into the typed API (see the vector header:
/// `imm_data = v` is posted as `htobe32(v)`, i.e. our host-order `imm`).
pub fn send_op(case: &Case, spec: &SendWrSpec) -> rdma_direct::SendOp {
    use rdma_direct::{Remote, SendOp};
    let name = &case.name;
    let remote = || {
        Remote::new(
            spec.remote_addr
                .unwrap_or_else(|| panic!("[{name}] {} without remote_addr", spec.opcode)),
            spec.rkey
                .unwrap_or_else(|| panic!("[{name}] {} without rkey", spec.opcode)),
        )
    };
    let imm = || {
        spec.imm_data
            .unwrap_or_else(|| panic!("[{name}] {} without imm_data", spec.opcode))
    };
    let cmp_add = || {
        spec.compare_add
            .unwrap_or_else(|| panic!("[{name}] {} without compare_add", spec.opcode))
    };
    let has_remote = spec.remote_addr.is_some() || spec.rkey.is_some();
    let op = match spec.opcode.as_str() {
        "SEND" => SendOp::Send,
        "SEND_WITH_IMM" => SendOp::SendImm { imm: imm() },
        "SEND_WITH_INV" => SendOp::SendInv {
            rkey: spec
                .invalidate_rkey
                .unwrap_or_else(|| panic!("[{name}] SEND_WITH_INV without invalidate_rkey")),
        },
        "RDMA_WRITE" => SendOp::Write { remote: remote() },
        "RDMA_WRITE_WITH_IMM" => SendOp::WriteImm {
            remote: remote(),
            imm: imm(),
        },
        "RDMA_READ" => SendOp::Read { remote: remote() },
        "ATOMIC_CMP_AND_SWP" => SendOp::CompareSwap {
            remote: remote(),
            compare: cmp_add(),
            swap: spec
                .swap
                .unwrap_or_else(|| panic!("[{name}] CAS without swap")),
        },
        // `swap` is ignored by FETCH_AND_ADD (vector header).
        "ATOMIC_FETCH_AND_ADD" => SendOp::FetchAdd {
            remote: remote(),
            add: cmp_add(),
        },
        other => panic!("[{name}] unsupported WR opcode {other:?}"),
    };
    // Fields that do not apply to the opcode must be absent.
    assert_eq!(
        has_remote,
        op.remote().is_some(),
        "[{name}] remote fields vs opcode {}",
        spec.opcode
    );
    assert_eq!(
        spec.imm_data.is_some(),
        matches!(op, SendOp::SendImm { .. } | SendOp::WriteImm { .. }),
        "[{name}] imm_data vs opcode {}",
        spec.opcode
    );
    assert_eq!(
        spec.invalidate_rkey.is_some(),
        matches!(op, SendOp::SendInv { .. }),
        "[{name}] invalidate_rkey vs opcode {}",
        spec.opcode
    );
    assert_eq!(
        spec.compare_add.is_some(),
        op.is_atomic(),
        "[{name}] compare_add vs opcode {}",
        spec.opcode
    );
    op
}

#[cfg(test)]
mod parser_tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0x1f"), Ok(31));
        assert_eq!(parse_number("42"), Ok(42));
        assert_eq!(parse_number("-1"), Ok(-1));
        assert!(parse_number("0x").is_err());
        assert!(parse_number("12a").is_err());
        assert!(parse_number("").is_err());
    }

    #[test]
    fn bytes() {
        assert_eq!(
            parse_bytes("0001 ..ff  \t10").unwrap(),
            vec![Some(0), Some(1), None, Some(0xff), Some(0x10)]
        );
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("0g").is_err());
        assert!(parse_bytes(".0").is_err());
        assert_eq!(parse_bytes("").unwrap(), vec![]);
        let v = parse_bytes("00010203 ..05").unwrap();
        assert_eq!(parse_bytes(&format_bytes(&v)).unwrap(), v);
    }

    #[test]
    fn file() {
        let text = "# cases: 2\n\n[a]\nx = 1\ny = a = b\nz =\n\n[b]\nw = 0x10\n";
        let f = parse_file(text).unwrap();
        assert_eq!(f.declared_cases, Some(2));
        assert_eq!(f.cases.len(), 2);
        assert_eq!(f.cases[0].str("y"), "a = b");
        assert_eq!(f.cases[0].str("z"), "");
        assert_eq!(f.cases[0].unused_keys(), vec!["x".to_string()]);
        assert_eq!(f.cases[1].u32("w"), 16);
        assert!(parse_file("x = 1\n").is_err());
        assert!(parse_file("[a]\nx = 1\nx = 2\n").is_err());
        assert!(parse_file("[a]\nx 1\n").is_err());
        assert!(parse_file("[a]\n\nx = 1\n").is_err());
    }
}
