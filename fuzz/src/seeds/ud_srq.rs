//! Seeds of `ud_srq_ops` (the raw-queue UD and SRQ calls against the
//! core): scenarios in the input format documented at the top of
//! `fuzz_targets/ud_srq_ops.rs`.

use crate::SeedWriter;

/// Op codes of `ud_srq_ops` (the op byte % 7).
mod op {
    pub const SEND: u8 = 0;
    pub const POST: u8 = 1;
    pub const RING: u8 = 2;
    pub const RECV: u8 = 3;
    pub const RECV_LIST: u8 = 4;
    pub const SRQ_RING: u8 = 5;
    pub const COMPLETE: u8 = 6;
}

/// A send's fields: fsel, av, qpn, asel (bit 0: mask the QPN), qkey,
/// nsge SGE length codes, imm, inline length.
fn send(w: &mut SeedWriter, fsel: u8, av: u8, qpn: u32, lens: &[u8], inline_len: u8) {
    w.u8(fsel).u8(av).u32(qpn).u8(1).u32(0x1111_1111);
    w.u8(lens.len() as u8);
    for &l in lens {
        w.u8(l);
    }
    w.u32(0xabcd).u8(inline_len);
}

/// A responder CQE for an outstanding receive (`pick`), with the SRQ's
/// key, or with `other` as the CQE's SRQ field.
fn complete(w: &mut SeedWriter, pick: u16, other: Option<u32>, n: u8) {
    w.u8(op::COMPLETE).u16(0x8000 | pick);
    match other {
        None => {
            w.u8(1).u8(n);
        }
        Some(k) => {
            w.u8(0).u8(n).u32(k);
        }
    }
}

/// (name, bytes) of every seed.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();

    // UD sends of each kind to each address vector, rung once.
    let mut w = SeedWriter::new();
    w.u8(0x1d); // 32 BBs, 4 SGEs, 60 inline bytes
    for (kind, av) in [(0u8, 0u8), (1, 1), (2, 2)] {
        w.u8(op::SEND).u8(kind);
        send(&mut w, 0x02 | 0x08, av, 0x100 + av as u32, &[1], 16);
    }
    w.u8(op::RING);
    out.push(("sends", w.finish()));

    // The generic post: SEND, SEND_IMM, then RDMA WRITE (UNSUPPORTED).
    let mut w = SeedWriter::new();
    w.u8(0x1d).u8(op::POST).u8(3);
    for opcode in [2u8, 3, 0] {
        w.u8(opcode);
        send(&mut w, 0x02, 0, 0x200, &[1, 3], 0);
    }
    w.u8(op::RING);
    out.push(("post_list", w.finish()));

    // Refusals: no AV, a QPN over 24 bits, a stray flag, inline too long.
    let mut w = SeedWriter::new();
    w.u8(0x01);
    w.u8(op::SEND).u8(0);
    send(&mut w, 0x02, 3, 0x300, &[1], 0);
    w.u8(op::SEND)
        .u8(0)
        .u8(0x02)
        .u8(0)
        .u32(0x0100_0000)
        .u8(0)
        .u32(1)
        .u8(1)
        .u8(1);
    w.u32(0).u8(0);
    w.u8(op::SEND).u8(0);
    send(&mut w, 0x22, 0, 0x300, &[1], 0);
    w.u8(op::SEND).u8(2);
    send(&mut w, 0x02, 0, 0x300, &[], 200);
    out.push(("refusals", w.finish()));

    // SRQ: receives (one deferred), a list, completions out of order, a
    // repeated one, one carrying another SRQ field (upper bits differ),
    // then the list runs full and completed WQEs are reused.
    let mut w = SeedWriter::new();
    w.u8(0x00);
    w.u8(op::RECV).u8(0).u8(1);
    w.u8(op::RECV).u8(1).u8(3).u8(200);
    w.u8(op::SRQ_RING);
    w.u8(op::RECV_LIST).u8(2).u8(1).u8(1).u8(2).u8(1).u8(2);
    complete(&mut w, 2, None, 2);
    complete(&mut w, 0, None, 1);
    complete(&mut w, 0, Some(0x0001_0051), 1);
    complete(&mut w, 1, None, 4);
    for _ in 0..6 {
        w.u8(op::RECV).u8(0).u8(1);
    }
    complete(&mut w, 3, None, 4);
    w.u8(op::RECV).u8(0).u8(1);
    out.push(("srq", w.finish()));
    out
}
