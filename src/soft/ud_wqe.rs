//! The software device's own parser for unreliable-datagram send WQEs
//! (docs/spec/mlx5.md §3 "Datagram segment", §11; docs/spec/soft.md §3):
//! the control segment, the 48-byte datagram segment (`struct
//! mlx5_wqe_av`), then data segments or one inline segment. Like
//! [`super::wqe`] it reads bytes and never calls the crate's encoder.

use super::wqe::{be32, parse_ctrl, parse_data, Local, ParsedSend, Seg, MAX_SEGS};
use crate::provider::mlx5::cq::syndrome;
use crate::provider::mlx5::layout::opcode;

/// `MLX5_EXTENDED_UD_AV`, set in `dqp_dct` of every UD datagram segment.
const EXTENDED_UD_AV: u32 = 0x8000_0000;
/// Bit 30 of `grh_gid_fl`: the datagram carries a GRH.
const AV_GRH: u32 = 1 << 30;
/// Octowords before a UD WQE's data: control (1) and datagram (3).
const UD_HDR_DS: u32 = 4;

/// The global route a datagram segment asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct UdGrh {
    /// Source GID table index.
    pub(super) sgid_index: u8,
    /// Flow label (20 bits).
    pub(super) flow_label: u32,
    /// Traffic class.
    pub(super) tclass: u8,
    /// Hop limit.
    pub(super) hop_limit: u8,
    /// Destination GID (memory order).
    pub(super) dgid: [u8; 16],
}

/// A validated UD send WQE.
#[derive(Clone, Copy, Debug)]
pub(super) struct ParsedUd {
    /// The control segment and the local data (`remote` and `atomic` are
    /// unused).
    pub(super) send: ParsedSend,
    /// Destination QP number (24 bits).
    pub(super) dqpn: u32,
    /// Q_Key as the WR gave it (bit 31: use the sender QP's own).
    pub(super) qkey: u32,
    /// Service level (InfiniBand: bits 3..0 of `stat_rate_sl`).
    pub(super) sl: u8,
    /// The global route, when the vector asks for a GRH.
    pub(super) grh: Option<UdGrh>,
}

/// Parses a UD send WQE copied linearly (ring wrap undone) into its
/// parts; data segments go to `segs`. `expect_index` and `qpn` must match
/// the control segment. A NOP (the recovery drain marker, one octoword)
/// parses with no datagram segment. SEND and SEND_WITH_IMM need the
/// datagram segment: its reserved words 0, `MLX5_EXTENDED_UD_AV` set in
/// `dqp_dct` and nothing else above the 24-bit QP number, the reserved
/// bits of `fl_mlid` and `grh_gid_fl` 0. Every other opcode (RDMA, atomics,
/// SEND_WITH_INV) does not exist on UD. A violation is the syndrome of a
/// local QP operation error (a malformed inline segment: local length).
pub(super) fn parse_ud_send(
    w: &[u8],
    expect_index: u16,
    qpn: u32,
    segs: &mut [Seg; MAX_SEGS],
) -> Result<ParsedUd, u8> {
    const BAD: u8 = syndrome::LOCAL_QP_OP;
    let mut send = parse_ctrl(w, expect_index, qpn)?;
    let none = ParsedUd {
        send,
        dqpn: 0,
        qkey: 0,
        sl: 0,
        grh: None,
    };
    match send.opcode {
        opcode::NOP => {
            return if send.ds == 1 && send.imm == 0 {
                Ok(none)
            } else {
                Err(BAD)
            }
        }
        opcode::SEND => {
            if send.imm != 0 {
                return Err(BAD);
            }
        }
        opcode::SEND_IMM => {}
        _ => return Err(BAD),
    }
    if send.ds < UD_HDR_DS {
        return Err(BAD);
    }
    // The datagram segment: bytes 16..64 of the WQE.
    let av = &w[16..64];
    let dqp = be32(av, 8);
    let grh_word = be32(av, 28);
    if be32(av, 4) != 0
        || dqp & 0x7f00_0000 != 0
        || dqp & EXTENDED_UD_AV == 0
        || av[13] & 0x80 != 0
        || be32(av, 16) != 0
        || grh_word & 0xb000_0000 != 0
    {
        return Err(BAD);
    }
    let grh = (grh_word & AV_GRH != 0).then(|| {
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&av[32..48]);
        UdGrh {
            sgid_index: ((grh_word >> 20) & 0xff) as u8,
            flow_label: grh_word & 0xf_ffff,
            tclass: av[26],
            hop_limit: av[27],
            dgid,
        }
    });
    let body = UD_HDR_DS as usize * 16;
    let end = send.ds as usize * 16;
    send.local = if body == end {
        Local::Segs(0)
    } else {
        parse_data(w, body, end, true, segs)?
    };
    Ok(ParsedUd {
        send,
        dqpn: dqp & 0x00ff_ffff,
        qkey: be32(av, 0),
        sl: av[12] & 0xf,
        grh,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::mlx5::layout::{INLINE_SEG, INVALID_LKEY};

    const QPN: u32 = 0x123;

    /// A UD WQE built by hand from docs/spec/mlx5.md §3 (not by the
    /// crate's encoder): `data` is appended after the datagram segment.
    fn ud_wqe(op: u8, imm: u32, dqpn: u32, qkey: u32, grh: bool, data: &[u8]) -> std::vec::Vec<u8> {
        let ds = 4 + data.len() / 16;
        let mut w = std::vec![0u8; (ds * 16).next_multiple_of(64)];
        w[0..4].copy_from_slice(&(7u32 << 8 | op as u32).to_be_bytes());
        w[4..8].copy_from_slice(&(QPN << 8 | ds as u32).to_be_bytes());
        w[11] = 0x08; // CE = 2
        w[12..16].copy_from_slice(&imm.to_be_bytes());
        w[16..20].copy_from_slice(&qkey.to_be_bytes());
        w[24..28].copy_from_slice(&(dqpn | EXTENDED_UD_AV).to_be_bytes());
        w[28] = 0x35; // rate 3, SL 5
        w[30..32].copy_from_slice(&9u16.to_be_bytes());
        if grh {
            w[42] = 0x22; // tclass
            w[43] = 17; // hop limit
            w[44..48].copy_from_slice(&(AV_GRH | 0xabcde).to_be_bytes());
            w[48..64].copy_from_slice(&[0xfe; 16]);
        }
        w[64..64 + data.len()].copy_from_slice(data);
        w
    }

    fn dseg(len: u32, lkey: u32, addr: u64) -> [u8; 16] {
        let mut d = [0u8; 16];
        d[0..4].copy_from_slice(&len.to_be_bytes());
        d[4..8].copy_from_slice(&lkey.to_be_bytes());
        d[8..16].copy_from_slice(&addr.to_be_bytes());
        d
    }

    #[test]
    fn send_with_segments_and_grh() {
        let mut segs = [Seg::default(); MAX_SEGS];
        let mut data = dseg(100, 5, 0x1000).to_vec();
        data.extend_from_slice(&dseg(8, 6, 0x2000));
        let w = ud_wqe(opcode::SEND_IMM, 0xdead, 0x456, 0x11, true, &data);
        let p = parse_ud_send(&w, 7, QPN, &mut segs).unwrap();
        assert_eq!((p.dqpn, p.qkey, p.sl), (0x456, 0x11, 5));
        assert_eq!(p.send.imm, 0xdead);
        assert_eq!(p.send.local, Local::Segs(2));
        assert_eq!(
            segs[1],
            Seg {
                addr: 0x2000,
                len: 8,
                lkey: 6
            }
        );
        let g = p.grh.unwrap();
        assert_eq!(
            (g.sgid_index, g.flow_label, g.tclass, g.hop_limit),
            (0, 0xabcde, 0x22, 17)
        );
        assert_eq!(g.dgid, [0xfe; 16]);
    }

    #[test]
    fn inline_empty_and_qp_qkey() {
        let mut segs = [Seg::default(); MAX_SEGS];
        let mut data = std::vec![0u8; 16];
        data[0..4].copy_from_slice(&(INLINE_SEG | 5).to_be_bytes());
        data[4..9].copy_from_slice(b"hello");
        let w = ud_wqe(opcode::SEND, 0, 1, 0x8000_0000, false, &data);
        let p = parse_ud_send(&w, 7, QPN, &mut segs).unwrap();
        assert_eq!(p.send.local, Local::Inline { off: 68, len: 5 });
        assert_eq!(p.qkey, 0x8000_0000);
        assert!(p.grh.is_none());
        // A zero-length message: no data segment at all.
        let w = ud_wqe(opcode::SEND, 0, 1, 3, false, &[]);
        assert_eq!(
            parse_ud_send(&w, 7, QPN, &mut segs).unwrap().send.local,
            Local::Segs(0)
        );
    }

    #[test]
    fn malformed_is_a_local_qp_operation_error() {
        let mut segs = [Seg::default(); MAX_SEGS];
        let good = ud_wqe(opcode::SEND, 0, 0x456, 1, false, &dseg(4, 5, 0));
        assert!(parse_ud_send(&good, 7, QPN, &mut segs).is_ok());
        let bad = |f: &dyn Fn(&mut std::vec::Vec<u8>)| {
            let mut w = good.clone();
            f(&mut w);
            parse_ud_send(&w, 7, QPN, &mut [Seg::default(); MAX_SEGS]).err()
        };
        let qp_op = Some(syndrome::LOCAL_QP_OP);
        // RDMA and atomics do not exist on UD.
        for op in [
            opcode::RDMA_WRITE,
            opcode::RDMA_WRITE_IMM,
            opcode::RDMA_READ,
            opcode::ATOMIC_CS,
            opcode::ATOMIC_FA,
            opcode::SEND_INVAL,
        ] {
            assert_eq!(bad(&|w| w[3] = op), qp_op, "opcode {op:#x}");
        }
        assert_eq!(bad(&|w| w[24] = 0), qp_op); // no EXTENDED_UD_AV
        assert_eq!(bad(&|w| w[24] = 0x81), qp_op); // QPN wider than 24 bits
        assert_eq!(bad(&|w| w[20] = 1), qp_op); // reserved key word
        assert_eq!(bad(&|w| w[32] = 1), qp_op); // reserved0
        assert_eq!(bad(&|w| w[29] = 0x80), qp_op); // fl_mlid bit 7
        assert_eq!(bad(&|w| w[44] = 0x80), qp_op); // grh_gid_fl bit 31
        assert_eq!(bad(&|w| w[15] = 1), qp_op); // immediate on plain SEND
        assert_eq!(bad(&|w| w[7] = 3), qp_op); // DS too small for the AV
        assert_eq!(
            bad(&|w| w[64..68].copy_from_slice(&0u32.to_be_bytes())),
            qp_op
        );
        assert_eq!(
            bad(&|w| w[68..72].copy_from_slice(&INVALID_LKEY.to_be_bytes())),
            qp_op
        );
        assert_eq!(bad(&|w| w[6] = 0x02), qp_op); // another QP's WQE
        assert_eq!(bad(&|w| w[2] = 8), qp_op); // wrong WQE index
    }
}
