//! The fabric's packets (docs/spec/fabric.md §3): fixed little-endian
//! headers, each followed by its payload in one ring record.
//!
//! Packets arrive from another process, so [`Req::decode`] and
//! [`Resp::decode`] take bytes already copied out of the ring and check
//! every field the engine relies on before anything is done with them.

/// Record tag of a request packet (requester to responder).
pub(crate) const TAG_REQ: u32 = 1;
/// Record tag of a response packet (responder to requester).
pub(crate) const TAG_RESP: u32 = 2;

/// Largest payload of one packet: a WRITE or SEND is cut into packets of
/// at most this many bytes, and a READ into requests for at most this
/// many (the fabric's MTU).
pub(crate) const PACKET: usize = 16 * 1024;

/// Bytes of a request header.
pub(crate) const REQ_BYTES: usize = 64;
/// Bytes of a response header.
pub(crate) const RESP_BYTES: usize = 16;

/// First packet of a message.
pub(crate) const F_FIRST: u8 = 1;
/// Last packet of a message.
pub(crate) const F_LAST: u8 = 2;
/// The message asks for a solicited event.
pub(crate) const F_SOLICITED: u8 = 4;
/// The responder acknowledges this packet.
pub(crate) const F_ACK_REQ: u8 = 8;
const F_ALL: u8 = F_FIRST | F_LAST | F_SOLICITED | F_ACK_REQ;

/// A request packet's header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Req {
    /// Packet sequence number (per link, from 0, wrapping).
    pub seq: u32,
    /// The mlx5 opcode of the WQE the packet comes from.
    pub opcode: u8,
    /// `F_*` flags.
    pub flags: u8,
    /// The requester's RNR retry count (7 = forever).
    pub rnr_retry: u8,
    /// Requester QP number.
    pub src_qpn: u32,
    /// Responder QP number.
    pub dst_qpn: u32,
    /// Length of the whole message.
    pub total: u32,
    /// Offset of this packet in the message.
    pub offset: u32,
    /// Bytes this packet carries (WRITE, SEND) or asks for (READ).
    pub len: u32,
    /// Remote key.
    pub rkey: u32,
    /// Remote address of the message's first byte.
    pub raddr: u64,
    /// Atomic swap or add operand.
    pub swap_add: u64,
    /// Atomic compare operand.
    pub compare: u64,
    /// Immediate data (host order).
    pub imm: u32,
}

/// Why a packet was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BadPacket;

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn le64(b: &[u8], o: usize) -> u64 {
    le32(b, o) as u64 | (le32(b, o + 4) as u64) << 32
}

impl Req {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; REQ_BYTES] {
        let mut b = [0u8; REQ_BYTES];
        b[0..4].copy_from_slice(&self.seq.to_le_bytes());
        b[4] = self.opcode;
        b[5] = self.flags;
        b[6] = self.rnr_retry;
        b[8..12].copy_from_slice(&self.src_qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.dst_qpn.to_le_bytes());
        b[16..20].copy_from_slice(&self.total.to_le_bytes());
        b[20..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.rkey.to_le_bytes());
        b[32..40].copy_from_slice(&self.raddr.to_le_bytes());
        b[40..48].copy_from_slice(&self.swap_add.to_le_bytes());
        b[48..56].copy_from_slice(&self.compare.to_le_bytes());
        b[56..60].copy_from_slice(&self.imm.to_le_bytes());
        b
    }

    /// Decodes a header copied out of a record whose payload is
    /// `payload` bytes long, checking that the flags are known, that the
    /// packet lies inside its message (`offset + len <= total`, at most
    /// [`PACKET`] bytes), and that the payload is exactly what the
    /// opcode carries (`len` bytes for WRITE and SEND, none for READ and
    /// atomics). The opcode itself is checked by the responder.
    pub(crate) fn decode(b: &[u8; REQ_BYTES], payload: usize) -> Result<Req, BadPacket> {
        let r = Req {
            seq: le32(b, 0),
            opcode: b[4],
            flags: b[5],
            rnr_retry: b[6],
            src_qpn: le32(b, 8),
            dst_qpn: le32(b, 12),
            total: le32(b, 16),
            offset: le32(b, 20),
            len: le32(b, 24),
            rkey: le32(b, 28),
            raddr: le64(b, 32),
            swap_add: le64(b, 40),
            compare: le64(b, 48),
            imm: le32(b, 56),
        };
        let end = r.offset.checked_add(r.len).ok_or(BadPacket)?;
        if r.flags & !F_ALL != 0
            || r.rnr_retry > 7
            || end > r.total
            || r.len as usize > PACKET
            || (r.flags & F_FIRST != 0 && r.offset != 0)
            || (r.flags & F_LAST != 0 && end != r.total)
        {
            return Err(BadPacket);
        }
        let carries = if r.reads() { 0 } else { r.len as usize };
        if payload != carries {
            return Err(BadPacket);
        }
        Ok(r)
    }

    /// An RDMA READ or an atomic: the data flows back in the response.
    pub(crate) fn reads(&self) -> bool {
        use crate::provider::mlx5::layout::opcode;
        matches!(
            self.opcode,
            opcode::RDMA_READ | opcode::ATOMIC_CS | opcode::ATOMIC_FA
        )
    }
}

/// What a response says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RespKind {
    /// Every request up to `seq` was executed.
    Ack = 1,
    /// READ data for request `seq` (also acknowledges what came before).
    ReadData = 2,
    /// The original value of the atomic `seq`.
    Atomic = 3,
    /// Request `seq` failed with `syndrome`; the responder executes
    /// nothing after it.
    Nak = 4,
    /// Request `seq` waits for a receive (an RNR NAK that the responder
    /// retries itself); keeps the requester's timer from expiring.
    RnrWait = 5,
}

/// A response packet's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resp {
    /// The request packet answered.
    pub seq: u32,
    /// What it says.
    pub kind: RespKind,
    /// The CQE syndrome of a NAK (0 otherwise).
    pub syndrome: u8,
    /// Payload bytes (READ data, or 8 for an atomic).
    pub len: u32,
}

impl Resp {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; RESP_BYTES] {
        let mut b = [0u8; RESP_BYTES];
        b[0..4].copy_from_slice(&self.seq.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.syndrome;
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a header copied out of a record with `payload` bytes after
    /// it: a known kind, a payload length that matches it.
    pub(crate) fn decode(b: &[u8; RESP_BYTES], payload: usize) -> Result<Resp, BadPacket> {
        let kind = match b[4] {
            1 => RespKind::Ack,
            2 => RespKind::ReadData,
            3 => RespKind::Atomic,
            4 => RespKind::Nak,
            5 => RespKind::RnrWait,
            _ => return Err(BadPacket),
        };
        let r = Resp {
            seq: le32(b, 0),
            kind,
            syndrome: b[5],
            len: le32(b, 8),
        };
        let want = match kind {
            RespKind::ReadData if (r.len as usize) <= PACKET => r.len as usize,
            RespKind::ReadData => return Err(BadPacket),
            RespKind::Atomic => 8,
            _ => 0,
        };
        if payload != want || r.len as usize != want {
            return Err(BadPacket);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::mlx5::layout::opcode;

    fn write(len: u32, total: u32, offset: u32, flags: u8) -> Req {
        Req {
            seq: 7,
            opcode: opcode::RDMA_WRITE,
            flags,
            rnr_retry: 7,
            src_qpn: 0x101,
            dst_qpn: 0x102,
            total,
            offset,
            len,
            rkey: 0x1234,
            raddr: 0xdead_beef_0000,
            swap_add: 1,
            compare: 2,
            imm: 3,
        }
    }

    #[test]
    fn request_round_trip_and_refusals() {
        let r = write(100, 100, 0, F_FIRST | F_LAST | F_ACK_REQ);
        assert_eq!(Req::decode(&r.encode(), 100), Ok(r));
        // Payload length must match.
        assert_eq!(Req::decode(&r.encode(), 99), Err(BadPacket));
        // Outside its message, too big, unknown flags, FIRST not at 0,
        // LAST not at the end, an RNR count above 7.
        for bad in [
            write(10, 5, 0, 0),
            write(10, u32::MAX, u32::MAX - 3, 0),
            write(PACKET as u32 + 1, PACKET as u32 + 1, 0, 0),
            write(10, 10, 0, 0x80),
            write(10, 20, 10, F_FIRST),
            write(10, 30, 10, F_LAST),
            Req {
                rnr_retry: 8,
                ..write(10, 10, 0, 0)
            },
        ] {
            assert_eq!(Req::decode(&bad.encode(), bad.len as usize), Err(BadPacket));
        }
        let rd = Req {
            opcode: opcode::RDMA_READ,
            ..write(4096, 4096, 0, F_FIRST | F_LAST)
        };
        assert_eq!(Req::decode(&rd.encode(), 0), Ok(rd));
        assert_eq!(Req::decode(&rd.encode(), 4096), Err(BadPacket));
    }

    #[test]
    fn response_round_trip_and_refusals() {
        for r in [
            Resp {
                seq: 1,
                kind: RespKind::Ack,
                syndrome: 0,
                len: 0,
            },
            Resp {
                seq: 2,
                kind: RespKind::ReadData,
                syndrome: 0,
                len: 512,
            },
            Resp {
                seq: 3,
                kind: RespKind::Atomic,
                syndrome: 0,
                len: 8,
            },
            Resp {
                seq: 4,
                kind: RespKind::Nak,
                syndrome: 0x13,
                len: 0,
            },
        ] {
            assert_eq!(Resp::decode(&r.encode(), r.len as usize), Ok(r));
            assert_eq!(
                Resp::decode(&r.encode(), r.len as usize + 1),
                Err(BadPacket)
            );
        }
        let mut b = Resp {
            seq: 1,
            kind: RespKind::Ack,
            syndrome: 0,
            len: 0,
        }
        .encode();
        b[4] = 9;
        assert_eq!(Resp::decode(&b, 0), Err(BadPacket));
        let big = Resp {
            seq: 1,
            kind: RespKind::ReadData,
            syndrome: 0,
            len: PACKET as u32 + 1,
        };
        assert_eq!(Resp::decode(&big.encode(), PACKET + 1), Err(BadPacket));
    }
}
