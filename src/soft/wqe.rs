//! The software device's own strict parser for mlx5 send and receive WQEs
//! (docs/spec/mlx5.md §3–§6). It never calls the crate's encoder: it reads
//! bytes, checks every rule, and reports a violation as the syndrome real
//! hardware would put in the error CQE.

use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::{opcode, INLINE_SEG, INVALID_LKEY};

/// Largest WQE in bytes (DS is 6 bits).
pub const MAX_WQE_BYTES: usize = 63 * 16;
/// Most data segments one WQE can hold.
pub const MAX_SEGS: usize = 62;

/// One gather/scatter entry read from a WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seg {
    /// Address.
    pub addr: u64,
    /// Length (0 means 2 GiB in hardware; rejected here as malformed).
    pub len: u32,
    /// Local key.
    pub lkey: u32,
}

/// Where a send WQE's local data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// `n` data segments, stored in `ParsedSend::segs`.
    Segs(usize),
    /// Inline payload: `len` bytes at offset `off` of the linear WQE copy.
    Inline {
        /// Offset in the WQE copy.
        off: usize,
        /// Length.
        len: usize,
    },
}

/// A validated send WQE.
#[derive(Clone, Copy, Debug)]
pub struct ParsedSend {
    /// mlx5 opcode.
    pub opcode: u8,
    /// WQE index from the control segment.
    pub index: u16,
    /// DS.
    pub ds: u32,
    /// CE = 2: a CQE was requested.
    pub signaled: bool,
    /// Solicited event.
    pub solicited: bool,
    /// Fence.
    pub fence: bool,
    /// Immediate / invalidated rkey (host order).
    pub imm: u32,
    /// Remote address and key.
    pub remote: (u64, u32),
    /// Atomic (swap_add, compare).
    pub atomic: (u64, u64),
    /// Local data.
    pub local: Local,
}

#[inline(always)]
pub(super) fn be32(b: &[u8], o: usize) -> u32 {
    match b.get(o..o + 4) {
        Some(w) => u32::from_be_bytes([w[0], w[1], w[2], w[3]]),
        None => 0,
    }
}
#[inline(always)]
pub(super) fn be64(b: &[u8], o: usize) -> u64 {
    (be32(b, o) as u64) << 32 | be32(b, o + 4) as u64
}

/// Reads the DS field of a control segment (to know how much to copy).
pub fn ctrl_ds(ctrl: &[u8; 16]) -> u32 {
    be32(ctrl, 4) & 0x3f
}

/// Parses a send WQE copied linearly (ring wrap already undone) into `w`;
/// its data segments go to `segs`. `expect_index` and `qpn` must match the
/// control segment.
pub fn parse_send(
    w: &[u8],
    expect_index: u16,
    qpn: u32,
    segs: &mut [Seg; MAX_SEGS],
) -> Result<ParsedSend, u8> {
    const BAD: u8 = syndrome::LOCAL_QP_OP;
    let mut p = parse_ctrl(w, expect_index, qpn)?;
    let (op, ds) = (p.opcode, p.ds);
    let (hdr, may_inline) = match op {
        opcode::NOP => (1, false),
        opcode::SEND | opcode::SEND_IMM | opcode::SEND_INVAL => (1, true),
        opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => (2, true),
        opcode::RDMA_READ => (2, false),
        opcode::ATOMIC_CS | opcode::ATOMIC_FA => (3, false),
        _ => return Err(BAD),
    };
    if ds < hdr {
        return Err(BAD);
    }
    if hdr >= 2 {
        if be32(w, 28) != 0 {
            return Err(BAD); // raddr reserved word
        }
        p.remote = (be64(w, 16), be32(w, 24));
    }
    if hdr == 3 {
        p.atomic = (be64(w, 32), be64(w, 40));
    }
    if matches!(
        op,
        opcode::SEND
            | opcode::RDMA_WRITE
            | opcode::RDMA_READ
            | opcode::NOP
            | opcode::ATOMIC_CS
            | opcode::ATOMIC_FA
    ) && p.imm != 0
    {
        return Err(BAD);
    }
    let body = hdr as usize * 16;
    let end = ds as usize * 16;
    if op == opcode::NOP {
        return if ds == 1 { Ok(p) } else { Err(BAD) };
    }
    if body == end {
        // No data (zero-length message). Atomics need their data segment.
        return if hdr == 3 { Err(BAD) } else { Ok(p) };
    }
    p.local = parse_data(w, body, end, may_inline, segs)?;
    if let (3, Local::Segs(n)) = (hdr, p.local) {
        if n != 1 || segs[0].len != 8 {
            return Err(BAD);
        }
    }
    Ok(p)
}

/// Checks the control segment of the send WQE copied linearly into `w`
/// (DS within the copy, the WQE index and QP number expected, reserved
/// bits 0, CE 0 or 2) and returns it parsed, with no remote, atomic or
/// local part yet.
pub(super) fn parse_ctrl(w: &[u8], expect_index: u16, qpn: u32) -> Result<ParsedSend, u8> {
    const BAD: u8 = syndrome::LOCAL_QP_OP;
    if w.len() < 16 {
        return Err(BAD);
    }
    let w0 = be32(w, 0);
    let w1 = be32(w, 4);
    let ds = w1 & 0x3f;
    let op = (w0 & 0xff) as u8;
    if ds == 0 || ds as usize * 16 > w.len() || (w0 >> 24) != 0 {
        return Err(BAD);
    }
    if ((w0 >> 8) & 0xffff) as u16 != expect_index || (w1 >> 8) != qpn || w1 & 0xc0 != 0 {
        return Err(BAD);
    }
    let fm_ce_se = w[11];
    let ce = (fm_ce_se >> 2) & 3;
    // Only CE 0 (error only) and CE 2 (always) are used by RC senders.
    if ce == 1 || ce == 3 || fm_ce_se & 0x11 != 0 {
        return Err(BAD);
    }
    Ok(ParsedSend {
        opcode: op,
        index: expect_index,
        ds,
        signaled: ce == 2,
        solicited: fm_ce_se & 0x02 != 0,
        fence: fm_ce_se >> 5 != 0,
        imm: be32(w, 12),
        remote: (0, 0),
        atomic: (0, 0),
        local: Local::Segs(0),
    })
}

/// Parses the data part of a send WQE, octowords `body..end` of the
/// linear copy `w` (`body < end`): one inline segment filling it exactly
/// (if `may_inline`; its length is not 0), or data segments, none with
/// length 0, the inline bit or the invalid lkey.
pub(super) fn parse_data(
    w: &[u8],
    body: usize,
    end: usize,
    may_inline: bool,
    segs: &mut [Seg; MAX_SEGS],
) -> Result<Local, u8> {
    const BAD: u8 = syndrome::LOCAL_QP_OP;
    let first = be32(w, body);
    if first & INLINE_SEG != 0 {
        if !may_inline {
            return Err(BAD);
        }
        let len = (first & !INLINE_SEG) as usize;
        if len == 0 || body + (4 + len).div_ceil(16) * 16 != end {
            return Err(syndrome::LOCAL_LENGTH);
        }
        return Ok(Local::Inline { off: body + 4, len });
    }
    let mut n = 0;
    let mut o = body;
    while o < end {
        let len = be32(w, o);
        let lkey = be32(w, o + 4);
        if len & INLINE_SEG != 0 || len == 0 || lkey == INVALID_LKEY || n == MAX_SEGS {
            return Err(BAD);
        }
        segs[n] = Seg {
            addr: be64(w, o + 8),
            len,
            lkey,
        };
        n += 1;
        o += 16;
    }
    Ok(Local::Segs(n))
}

/// Parses a receive WQE (an array of data segments ended by the stride or
/// an invalid-lkey terminator) into `out`; returns the number of entries.
pub fn parse_recv(entry: &[u8], out: &mut [Seg]) -> Result<usize, u8> {
    let mut n = 0;
    for chunk in entry.chunks_exact(16) {
        let len = be32(chunk, 0);
        let lkey = be32(chunk, 4);
        if lkey == INVALID_LKEY {
            if len != 0 {
                return Err(syndrome::LOCAL_QP_OP);
            }
            break;
        }
        if len & INLINE_SEG != 0 || len == 0 {
            return Err(syndrome::LOCAL_QP_OP);
        }
        if n == out.len() {
            return Err(syndrome::LOCAL_QP_OP);
        }
        out[n] = Seg {
            addr: be64(chunk, 8),
            len,
            lkey,
        };
        n += 1;
    }
    Ok(n)
}

/// Parses one shared-receive-queue WQE (docs/spec/mlx5.md §11): the 16-byte
/// next segment (reserved bytes zero, the big-endian `next_wqe_index` at
/// bytes 2..3) and the data segments after it, up to the end of the WQE or
/// an invalid-lkey terminator (whose byte count must be 0). A zero-length
/// entry is legal on an SRQ (libmlx5 writes such SGEs as they are): it
/// scatters nothing and is left out of `out`. Returns the next WQE's index
/// and the number of entries written to `out`; a malformed WQE is the
/// syndrome of a local QP operation error.
pub fn parse_srq_recv(w: &[u8], out: &mut [Seg]) -> Result<(u16, usize), u8> {
    const BAD: u8 = syndrome::LOCAL_QP_OP;
    let Some((next_seg, data)) = w.split_first_chunk::<16>() else {
        return Err(BAD);
    };
    if next_seg[..2] != [0, 0] || next_seg[4..].iter().any(|&b| b != 0) {
        return Err(BAD);
    }
    let next = u16::from_be_bytes([next_seg[2], next_seg[3]]);
    let mut n = 0;
    for chunk in data.chunks_exact(16) {
        let len = be32(chunk, 0);
        let lkey = be32(chunk, 4);
        if lkey == INVALID_LKEY {
            if len != 0 {
                return Err(BAD);
            }
            break;
        }
        if len & INLINE_SEG != 0 {
            return Err(BAD);
        }
        if len == 0 {
            continue;
        }
        if n == out.len() {
            return Err(BAD);
        }
        out[n] = Seg {
            addr: be64(chunk, 8),
            len,
            lkey,
        };
        n += 1;
    }
    Ok((next, n))
}

#[cfg(test)]
mod srq_tests {
    use super::*;

    fn wqe(next: u16, segs: &[(u32, u32, u64)], stride: usize) -> std::vec::Vec<u8> {
        let mut w = std::vec![0u8; stride];
        w[2..4].copy_from_slice(&next.to_be_bytes());
        for (i, &(len, lkey, addr)) in segs.iter().enumerate() {
            let o = 16 + 16 * i;
            w[o..o + 4].copy_from_slice(&len.to_be_bytes());
            w[o + 4..o + 8].copy_from_slice(&lkey.to_be_bytes());
            w[o + 8..o + 16].copy_from_slice(&addr.to_be_bytes());
        }
        w
    }

    #[test]
    fn srq_wqe_link_and_segments() {
        let mut out = [Seg::default(); 4];
        let w = wqe(7, &[(64, 5, 0x1000), (0, 6, 0), (8, 9, 0x2000)], 64);
        assert_eq!(parse_srq_recv(&w, &mut out), Ok((7, 2)));
        assert_eq!(
            out[0],
            Seg {
                addr: 0x1000,
                len: 64,
                lkey: 5
            }
        );
        assert_eq!(
            out[1],
            Seg {
                addr: 0x2000,
                len: 8,
                lkey: 9
            }
        );
        // Terminated early.
        let w = wqe(1, &[(64, 5, 0x1000), (0, INVALID_LKEY, 0), (8, 9, 0)], 64);
        assert_eq!(parse_srq_recv(&w, &mut out), Ok((1, 1)));
    }

    #[test]
    fn srq_wqe_malformed() {
        let mut out = [Seg::default(); 4];
        let mut w = wqe(1, &[(64, 5, 0x1000)], 32);
        w[4] = 1; // signature byte
        assert_eq!(parse_srq_recv(&w, &mut out), Err(syndrome::LOCAL_QP_OP));
        let w = wqe(1, &[(64 | INLINE_SEG, 5, 0)], 32);
        assert_eq!(parse_srq_recv(&w, &mut out), Err(syndrome::LOCAL_QP_OP));
        let w = wqe(1, &[(4, INVALID_LKEY, 0)], 32);
        assert_eq!(parse_srq_recv(&w, &mut out), Err(syndrome::LOCAL_QP_OP));
        assert_eq!(
            parse_srq_recv(&w[..8], &mut out),
            Err(syndrome::LOCAL_QP_OP)
        );
        let w = wqe(1, &[(4, 1, 0), (4, 2, 0)], 48);
        assert_eq!(
            parse_srq_recv(&w, &mut out[..1]),
            Err(syndrome::LOCAL_QP_OP)
        );
    }
}
