//! The wire format: the immediate value of every message ([`CreditImm`])
//! and the out-of-band announcement ([`CreditInfo`]).

#[cfg(doc)]
use super::CreditQp;
use super::MAX_GRANT;
use crate::error::{Error, Result};

/// Bit 31 of the immediate value: a credit-only message.
const IMM_CREDIT_ONLY: u32 = 1 << 31;
/// Bits 24..30 of the immediate value: reserved, zero.
const IMM_RESERVED: u32 = 0x7f00_0000;

/// The immediate value of a message sent by the layer: its grant and
/// whether it is credit-only. See the module documentation for the bit
/// layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditImm {
    /// Receives the sender re-posted since its previous report.
    pub grant: u32,
    /// No application data: the message exists to return credits.
    pub credit_only: bool,
}

impl CreditImm {
    /// The immediate value (the grant is cut to [`MAX_GRANT`]).
    pub const fn encode(self) -> u32 {
        let g = if self.grant > MAX_GRANT {
            MAX_GRANT
        } else {
            self.grant
        };
        if self.credit_only {
            IMM_CREDIT_ONLY | g
        } else {
            g
        }
    }

    /// Decodes an immediate value. Reserved bits set, or a credit-only
    /// message that grants nothing, are [`Error::ProtocolError`].
    pub const fn decode(imm: u32) -> Result<CreditImm> {
        if imm & IMM_RESERVED != 0 {
            return Err(Error::ProtocolError);
        }
        let credit_only = imm & IMM_CREDIT_ONLY != 0;
        let grant = imm & MAX_GRANT;
        if credit_only && grant == 0 {
            return Err(Error::ProtocolError);
        }
        Ok(CreditImm { grant, credit_only })
    }
}

/// What one side announces to its peer when connecting: exchange it out
/// of band with the [`QpInfo`](crate::api::QpInfo) and pass the peer's to
/// [`CreditQp::set_peer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditInfo {
    /// Receives posted: the peer's initial credits.
    pub credits: u32,
    /// Largest message accepted, in bytes (the receive buffer size).
    pub max_msg: u32,
}

impl CreditInfo {
    /// Bytes of [`CreditInfo::to_bytes`].
    pub const WIRE_LEN: usize = 8;

    /// The announcement as 8 bytes: `credits` then `max_msg`, each a
    /// big-endian u32.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..4].copy_from_slice(&self.credits.to_be_bytes());
        b[4..].copy_from_slice(&self.max_msg.to_be_bytes());
        b
    }

    /// Parses [`CreditInfo::to_bytes`] (values are checked by
    /// [`CreditQp::set_peer`]).
    pub fn from_bytes(b: &[u8; Self::WIRE_LEN]) -> CreditInfo {
        let [c0, c1, c2, c3, m0, m1, m2, m3] = *b;
        CreditInfo {
            credits: u32::from_be_bytes([c0, c1, c2, c3]),
            max_msg: u32::from_be_bytes([m0, m1, m2, m3]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imm_round_trips() {
        for (grant, credit_only) in [(0, false), (1, false), (1, true), (MAX_GRANT, true)] {
            let c = CreditImm { grant, credit_only };
            assert_eq!(CreditImm::decode(c.encode()), Ok(c));
        }
        assert_eq!(
            CreditImm {
                grant: 5,
                credit_only: true
            }
            .encode(),
            0x8000_0005
        );
        // A grant above 24 bits is cut, never spilled into other fields.
        assert_eq!(
            CreditImm {
                grant: u32::MAX,
                credit_only: false
            }
            .encode(),
            MAX_GRANT
        );
    }

    #[test]
    fn imm_rejects_reserved_bits_and_empty_credit_messages() {
        assert_eq!(CreditImm::decode(0x0100_0000), Err(Error::ProtocolError));
        assert_eq!(CreditImm::decode(0x8000_0000), Err(Error::ProtocolError));
    }

    #[test]
    fn info_bytes_round_trip() {
        let i = CreditInfo {
            credits: 0x0102_0304,
            max_msg: 4096,
        };
        assert_eq!(i.to_bytes(), [1, 2, 3, 4, 0, 0, 0x10, 0]);
        assert_eq!(CreditInfo::from_bytes(&i.to_bytes()), i);
    }
}
