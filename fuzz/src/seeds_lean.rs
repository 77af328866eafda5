//! Seeds of the lean targets (`wr_check`, `wqe_one`, `cqe_one`,
//! `fabric_rx`) and of
//! `wr_agree` (the `wr_check` format), in the
//! input formats documented at the top of each target; collected by
//! `seeds::all`.

use crate::SeedWriter;

/// A `send::read_wr` WR with SGEs: `kind` (0..=10), small flags, the
/// SGE length codes (`send::read_len`).
fn typed_wr(w: &mut SeedWriter, kind: u8, flags: u8, lens: &[u8]) {
    w.u8(kind | 0x10).u8(flags);
    match kind {
        1 | 2 | 10 => {
            w.u32(0x77);
        }
        3 | 5 => {
            w.u64(0x10_0000).u32(5);
        }
        4 => {
            w.u64(0x10_0000).u32(5).u32(0x77);
        }
        6 => {
            w.u64(0x10_0000).u32(5).u64(1).u64(2);
        }
        7 => {
            w.u64(0x10_0000).u32(5).u64(1);
        }
        9 => {
            w.u64(0x2000).u64(64).u32(1).u32(2).u32(3).u32(6);
        }
        _ => {}
    }
    w.u64(0x1d).u8(lens.len() as u8);
    for &l in lens {
        w.u8(l).u64(0x3000).u32(0x11);
    }
}

/// A `send::read_wr` inline WR (pieces of the given sizes).
fn typed_inline(w: &mut SeedWriter, kind: u8, flags: u8, pieces: &[u8]) {
    w.u8(kind).u8(flags);
    if kind == 3 {
        w.u64(0x10_0000).u32(5);
    }
    w.u64(0x1e).u8(0x80 | pieces.len() as u8);
    for &n in pieces {
        w.u8(n).bytes(&vec![0x42; n as usize]);
    }
}

/// A `wr_check` C request: opcode selector, flags, imm, remote, list.
fn c_wr(w: &mut SeedWriter, opsel: u8, fsel: u8, lsel: u8, sges: &[(u8, u8)], inline: bool) {
    w.u8(opsel).u8(fsel).u32(0x99).u64(0x10_0000).u8(1).u8(lsel);
    for &(len, x) in sges {
        w.u8(len);
        if len % 10 == 3 {
            w.u8(24);
        }
        if inline {
            w.u8(x).u16(100);
        } else {
            w.u8(x);
        }
    }
}

fn wr_check_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    // Typed: every opcode once (valid SGE shapes), two per input.
    for (name, kinds) in [
        ("typed_a", [0u8, 3]),
        ("typed_b", [5, 6]),
        ("typed_c", [7, 8]),
        ("typed_d", [9, 10]),
    ] {
        let mut w = SeedWriter::new();
        w.u8(4).u16(64).u8(1 << 1);
        for k in kinds {
            let lens: &[u8] = match k {
                6 | 7 => &[1],
                8..=10 => &[],
                _ => &[3, 0],
            };
            typed_wr(&mut w, k, 2, lens);
        }
        out.push((name, w.finish()));
    }
    // Typed refusals: too many SGEs, inline too large, bad caps.
    let mut w = SeedWriter::new();
    w.u8(1).u16(8).u8(3 << 1);
    typed_wr(&mut w, 0, 0, &[3, 3]);
    typed_inline(&mut w, 0, 0, &[9]);
    typed_inline(&mut w, 5, 0, &[1]);
    typed_wr(&mut w, 6, 0, &[3]);
    out.push(("typed_refusals", w.finish()));
    let mut w = SeedWriter::new();
    w.u8(62).u16(0).u8(0);
    typed_wr(&mut w, 0, 0, &[1]);
    out.push(("bad_caps", w.finish()));
    // C: each known opcode, inline, NULL / misaligned lists, bad flags.
    let mut w = SeedWriter::new();
    w.u8(4).u16(64).u8(1 | 3 << 1);
    c_wr(&mut w, 0, 2, 2 << 2, &[(3, 1), (1, 2)], false);
    c_wr(&mut w, 5, 0x02, 1 << 2, &[(1, 1)], false);
    c_wr(&mut w, 2, 0x0a, 2 << 2, &[(3, 1), (3, 1)], true);
    c_wr(&mut w, 8, 0, 0, &[], false);
    out.push(("c_ops", w.finish()));
    let mut w = SeedWriter::new();
    w.u8(4).u16(64).u8(1 | 3 << 1 | 8);
    c_wr(&mut w, 2, 0, 2 | 1 << 2, &[], false);
    c_wr(&mut w, 2, 0, 3 | 1 << 2, &[], false);
    c_wr(&mut w, 2, 0x80, 0, &[], false);
    w.u32(0x10);
    c_wr(&mut w, 2, 0x08, 1 << 2, &[(3, 0)], true);
    out.push(("c_refusals", w.finish()));
    out
}

fn wqe_one_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, geo, pi, kind, inline) in [
        ("send", 6u8, 0u32, 0u8, false),
        ("write_wrap", 2, 3, 3, false),
        ("inline_wrap", 3 | 0x08, 0xffff_fffe, 0, true),
        ("atomic_post_one", 6 | 0x10, 0x1_0005, 6, false),
    ] {
        let mut w = SeedWriter::new();
        w.u8(geo).u8(3).u8(100).u8(0x33).u32(0x1234).u32(pi);
        if inline {
            typed_inline(&mut w, kind, 2, &[20, 40]);
        } else {
            let lens: &[u8] = if kind == 6 { &[1] } else { &[3, 0, 5] };
            typed_wr(&mut w, kind, 2 | 4, lens);
        }
        out.push((name, w.finish()));
    }
    out
}

/// A 64-byte CQE: `op_own`, counter, byte count, syndrome.
fn cqe64(op_own: u8, counter: u16, byte_cnt: u32, syndrome: u8) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[44..48].copy_from_slice(&byte_cnt.to_be_bytes());
    c[55] = syndrome;
    c[57..60].copy_from_slice(&0x000abcu32.to_be_bytes()[1..]);
    c[60..62].copy_from_slice(&counter.to_be_bytes());
    c[63] = op_own;
    c
}

fn cqe_one_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    // aim: QPN, owner and counter set; bits 3-5 pick the work (0..3 the
    // sends, 4..6 the receives), bits 6-7 add to the index.
    for (name, geo, aim, op_own) in [
        ("req_send", 0u8, 0x07u8, 0x00u8),
        ("req_read", 0, 0x07 | 2 << 3, 0x00),
        ("req_unsignaled", 0, 0x07 | 1 << 3, 0x00),
        ("resp_send", 0, 0x07 | 4 << 3, 0x20),
        ("req_err", 0, 0x07 | 3 << 3, 0xd0),
        ("resp_scatter", 1, 0x07 | 5 << 3, 0x24),
        ("corrupt_opcode", 0, 0x07, 0x70),
        ("counter_off", 0, 0x07 | 3 << 6, 0x00),
    ] {
        let mut w = SeedWriter::new();
        w.u8(geo).u8(aim).u8(1);
        if geo & 1 != 0 {
            w.bytes(&[0x61; 64]);
        }
        w.bytes(&cqe64(op_own, 0, 16, 0x05));
        out.push((name, w.finish()));
    }
    out
}

/// A request header: opcode, flags, total, offset, len (the rest 0).
fn req_header(opcode: u8, flags: u8, total: u32, offset: u32, len: u32) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[4] = opcode;
    h[5] = flags;
    h[16..20].copy_from_slice(&total.to_le_bytes());
    h[20..24].copy_from_slice(&offset.to_le_bytes());
    h[24..28].copy_from_slice(&len.to_le_bytes());
    h
}

/// A response header: kind and len (the rest 0).
fn resp_header(kind: u8, len: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[4] = kind;
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h
}

fn fabric_rx_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    // Pushes and pops through a wrap (records of 1000 bytes in 4096).
    let mut w = SeedWriter::new();
    w.u8(0);
    for _ in 0..6 {
        w.u8(0).u8(7).u16(1000).u8(3);
    }
    w.u8(6);
    out.push(("stream_wrap", w.finish()));
    // Full ring, then a refused push, then drain.
    let mut w = SeedWriter::new();
    w.u8(1);
    for _ in 0..5 {
        w.u8(0).u8(9).u16(2040);
    }
    for _ in 0..5 {
        w.u8(3);
    }
    out.push(("full_then_drain", w.finish()));
    // A record, then the head scribbled past it.
    let mut w = SeedWriter::new();
    w.u8(0)
        .u8(0)
        .u8(1)
        .u16(64)
        .u8(5)
        .u8(0)
        .u64(4000)
        .u8(1)
        .u8(3)
        .u8(1);
    out.push(("hostile_head", w.finish()));
    // A record whose header is overwritten with a huge length.
    let mut w = SeedWriter::new();
    w.u8(0).u8(0).u8(2).u16(16).u8(4).u16(256).u8(8);
    w.bytes(&[0xff, 0xff, 0, 0, 2, 0, 0, 0]).u8(1);
    out.push(("hostile_record", w.finish()));
    // Short mapping: attach refused.
    let mut w = SeedWriter::new();
    w.u8(2).u8(0).u8(1).u16(8).u8(1);
    out.push(("short_mapping", w.finish()));
    // Raw headers: a valid WRITE, a READ, a READ_DATA and an atomic reply.
    let mut w = SeedWriter::new();
    w.u8(0);
    w.u8(7).bytes(&req_header(0x08, 3, 100, 0, 100)).u16(100);
    w.bytes(&resp_header(2, 100)).u16(100);
    w.u8(7).bytes(&req_header(0x10, 3, 4096, 0, 4096)).u16(0);
    w.bytes(&resp_header(3, 8)).u16(8);
    out.push(("headers", w.finish()));
    out
}

/// Every lean seed: (target, name, bytes).
pub fn all() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    for (name, bytes) in wr_check_seeds() {
        v.push(("wr_check", name, bytes));
    }
    // `wr_agree` reads the same format.
    for (name, bytes) in wr_check_seeds() {
        v.push(("wr_agree", name, bytes));
    }
    for (name, bytes) in wqe_one_seeds() {
        v.push(("wqe_one", name, bytes));
    }
    for (name, bytes) in cqe_one_seeds() {
        v.push(("cqe_one", name, bytes));
    }
    for (name, bytes) in fabric_rx_seeds() {
        v.push(("fabric_rx", name, bytes));
    }
    v
}
