//! The bootstrap's wire format (docs/architecture.md, "Bootstrap"): the
//! three messages every rank contributes to an allgather, their encoding
//! (little-endian, fixed offsets) and the checks every received one goes
//! through. Nothing here trusts a byte it did not check: a record is
//! parsed into owned values or refused with [`Error::ProtocolError`].

use std::vec::Vec;

use crate::api::QpInfo;
use crate::error::{Error, Result};

use super::RemoteMr;

/// "RDDB", little-endian.
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"RDDB");
/// The format version; a record of another version is refused.
pub(crate) const VERSION: u16 = 1;

/// Message kinds (the third field of every message).
pub(crate) const KIND_HELLO: u16 = 1;
pub(crate) const KIND_RECORD: u16 = 2;
pub(crate) const KIND_COMMIT: u16 = 3;

/// The hello: magic, version, kind, rank, size, status, record length,
/// checksum.
pub(crate) const HELLO_LEN: usize = 32;
/// The commit: magic, version, kind, rank, size, status, checksum.
pub(crate) const COMMIT_LEN: usize = 28;
/// A record's fixed header: magic, version, kind, rank, size, entry
/// count, MR count.
const RECORD_HEAD: usize = 24;
/// One QP entry: peer rank, QPN, PSN, LID, reserved, GID, MTU.
const QP_ENTRY: usize = 36;
/// One published MR: address, length, rkey, reserved.
const MR_ENTRY: usize = 24;
/// The trailing checksum.
const SUM: usize = 8;
/// The most MRs one rank may publish (bounds what a hello may announce).
pub const MAX_PUBLISHED_MRS: usize = 4096;

/// FNV-1a, 64 bits: catches a rank that sends garbage with the right
/// magic (not an authenticity check: the allgather is trusted not to be
/// malicious, only possibly broken).
fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn seal(mut v: Vec<u8>) -> Vec<u8> {
    let s = fnv1a(&v);
    v.extend_from_slice(&s.to_le_bytes());
    v
}

/// A little-endian reader over a checked slice (every read is in bounds
/// because the lengths were checked first; `get` still refuses).
struct Rd<'a>(&'a [u8], usize);

impl Rd<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let end = self.1.checked_add(N).ok_or(Error::ProtocolError)?;
        let b = self.0.get(self.1..end).ok_or(Error::ProtocolError)?;
        self.1 = end;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

/// Checks the checksum over `b[..n - 8]` and the common header (magic,
/// version, kind, rank = `slot`, size); returns a reader past it.
fn open(b: &[u8], kind: u16, slot: u32, size: u32) -> Result<Rd<'_>> {
    if b.len() < 16 + SUM {
        return Err(Error::ProtocolError);
    }
    let (body, sum) = b.split_at(b.len() - SUM);
    if fnv1a(body).to_le_bytes() != sum {
        return Err(Error::ProtocolError);
    }
    let mut r = Rd(body, 0);
    if r.u32()? != MAGIC || r.u16()? != VERSION || r.u16()? != kind {
        return Err(Error::ProtocolError);
    }
    // A rank field that is not the sender's slot: a duplicate rank (two
    // senders claiming one rank leave one slot wrong) or a shuffled table.
    if r.u32()? != slot || r.u32()? != size {
        return Err(Error::ProtocolError);
    }
    Ok(r)
}

fn head(kind: u16, rank: u32, size: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v
}

/// The first message: who I am, whether I can take part (`status` 0, or
/// the code of my local error) and how long my record will be.
pub(crate) fn hello(rank: u32, size: u32, status: u32, record_len: u32) -> Vec<u8> {
    let mut v = head(KIND_HELLO, rank, size);
    v.extend_from_slice(&status.to_le_bytes());
    v.extend_from_slice(&record_len.to_le_bytes());
    seal(v)
}

/// A received hello: the sender's status and record length.
pub(crate) fn parse_hello(b: &[u8], slot: u32, size: u32) -> Result<(u32, u32)> {
    if b.len() != HELLO_LEN {
        return Err(Error::ProtocolError);
    }
    let mut r = open(b, KIND_HELLO, slot, size)?;
    let status = r.u32()?;
    let len = r.u32()?;
    if status == 0 && !record_len_ok(len as usize, size) {
        return Err(Error::ProtocolError);
    }
    Ok((status, len))
}

/// The length of a record with `n_qp` entries and `n_mr` MRs.
pub(crate) fn record_len(n_qp: usize, n_mr: usize) -> usize {
    RECORD_HEAD + n_qp * QP_ENTRY + n_mr * MR_ENTRY + SUM
}

/// Whether `len` is the length of some record a rank of a `size`-rank
/// mesh can send (at most `size - 1` entries, [`MAX_PUBLISHED_MRS`]).
fn record_len_ok(len: usize, size: u32) -> bool {
    let Some(rest) = len.checked_sub(RECORD_HEAD + SUM) else {
        return false;
    };
    let max_qp = size.saturating_sub(1) as usize;
    (0..=max_qp).any(|n| {
        rest.checked_sub(n * QP_ENTRY)
            .is_some_and(|m| m % MR_ENTRY == 0 && m / MR_ENTRY <= MAX_PUBLISHED_MRS)
    })
}

/// A rank's record: its QP towards each peer it lists, and its published
/// MRs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) qps: Vec<(u32, QpInfo)>,
    pub(crate) mrs: Vec<RemoteMr>,
}

/// Encodes a record (unpadded: [`record_len`] bytes).
pub(crate) fn record(rank: u32, size: u32, rec: &Record) -> Vec<u8> {
    let mut v = head(KIND_RECORD, rank, size);
    v.extend_from_slice(&(rec.qps.len() as u32).to_le_bytes());
    v.extend_from_slice(&(rec.mrs.len() as u32).to_le_bytes());
    for (peer, i) in &rec.qps {
        v.extend_from_slice(&peer.to_le_bytes());
        v.extend_from_slice(&i.qpn.to_le_bytes());
        v.extend_from_slice(&i.psn.to_le_bytes());
        v.extend_from_slice(&i.lid.to_le_bytes());
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&i.gid);
        v.extend_from_slice(&i.mtu.to_le_bytes());
    }
    for m in &rec.mrs {
        v.extend_from_slice(&m.addr.to_le_bytes());
        v.extend_from_slice(&m.len.to_le_bytes());
        v.extend_from_slice(&m.rkey.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
    }
    seal(v)
}

/// Parses the record in `b` (`len` bytes as its hello announced, then
/// zero padding to the slot's length) sent by `slot`: every entry count,
/// peer rank, reserved field and `QpInfo` is checked.
pub(crate) fn parse_record(b: &[u8], len: usize, slot: u32, size: u32) -> Result<Record> {
    if len > b.len() || b[len..].iter().any(|&x| x != 0) {
        return Err(Error::ProtocolError);
    }
    let b = &b[..len];
    let mut r = open(b, KIND_RECORD, slot, size)?;
    let n_qp = r.u32()? as usize;
    let n_mr = r.u32()? as usize;
    if n_qp >= size as usize || n_mr > MAX_PUBLISHED_MRS || record_len(n_qp, n_mr) != len {
        return Err(Error::ProtocolError);
    }
    let mut qps = Vec::with_capacity(n_qp);
    for _ in 0..n_qp {
        let peer = r.u32()?;
        let info = QpInfo {
            qpn: r.u32()?,
            psn: r.u32()?,
            lid: r.u16()?,
            gid: {
                if r.u16()? != 0 {
                    return Err(Error::ProtocolError);
                }
                r.take::<16>()?
            },
            mtu: r.u32()?,
        };
        if peer >= size || peer == slot || qps.iter().any(|(p, _)| *p == peer) {
            return Err(Error::ProtocolError);
        }
        // A QPN or PSN wider than 24 bits: the peer sent garbage.
        info.validate().map_err(|_| Error::ProtocolError)?;
        qps.push((peer, info));
    }
    let mut mrs = Vec::with_capacity(n_mr);
    for _ in 0..n_mr {
        let m = RemoteMr {
            addr: r.u64()?,
            len: r.u64()?,
            rkey: r.u32()?,
        };
        if r.u32()? != 0 || m.addr.checked_add(m.len).is_none() {
            return Err(Error::ProtocolError);
        }
        mrs.push(m);
    }
    Ok(Record { qps, mrs })
}

/// The last message: whether every QP of this rank connected (`status`
/// 0) or the code of what failed.
pub(crate) fn commit(rank: u32, size: u32, status: u32) -> Vec<u8> {
    let mut v = head(KIND_COMMIT, rank, size);
    v.extend_from_slice(&status.to_le_bytes());
    seal(v)
}

/// A received commit's status.
pub(crate) fn parse_commit(b: &[u8], slot: u32, size: u32) -> Result<u32> {
    if b.len() != COMMIT_LEN {
        return Err(Error::ProtocolError);
    }
    open(b, KIND_COMMIT, slot, size)?.u32()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            qps: std::vec![(
                2,
                QpInfo {
                    qpn: 0x11,
                    psn: 0x123456,
                    lid: 3,
                    gid: [7; 16],
                    mtu: 1024,
                }
            )],
            mrs: std::vec![RemoteMr {
                addr: 0x1000,
                len: 64,
                rkey: 9,
            }],
        }
    }

    #[test]
    fn round_trips_and_pads() {
        let mut b = record(1, 4, &sample());
        let len = b.len();
        assert_eq!(len, record_len(1, 1));
        b.resize(len + 36, 0);
        assert_eq!(parse_record(&b, len, 1, 4).unwrap(), sample());
        let h = hello(1, 4, 0, len as u32);
        assert_eq!(parse_hello(&h, 1, 4).unwrap(), (0, len as u32));
        assert_eq!(parse_commit(&commit(3, 4, 5), 3, 4).unwrap(), 5);
    }

    #[test]
    fn every_byte_flip_is_refused() {
        let b = record(1, 4, &sample());
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert_eq!(
                parse_record(&c, c.len(), 1, 4),
                Err(Error::ProtocolError),
                "byte {i}"
            );
        }
        let h = hello(0, 4, 0, b.len() as u32);
        for i in 0..h.len() {
            let mut c = h.clone();
            c[i] ^= 1;
            assert!(parse_hello(&c, 0, 4).is_err(), "hello byte {i}");
        }
    }

    #[test]
    fn wrong_slot_size_and_padding_are_refused() {
        let mut b = record(1, 4, &sample());
        let len = b.len();
        assert_eq!(parse_record(&b, len, 2, 4), Err(Error::ProtocolError));
        assert_eq!(parse_record(&b, len, 1, 5), Err(Error::ProtocolError));
        b.push(1);
        assert_eq!(parse_record(&b, len, 1, 4), Err(Error::ProtocolError));
        // A record listing itself, or an out-of-range peer.
        let mut s = sample();
        s.qps[0].0 = 1;
        let b = record(1, 4, &s);
        assert_eq!(parse_record(&b, b.len(), 1, 4), Err(Error::ProtocolError));
        s.qps[0].0 = 4;
        let b = record(1, 4, &s);
        assert_eq!(parse_record(&b, b.len(), 1, 4), Err(Error::ProtocolError));
        // A QPN wider than 24 bits, sealed correctly.
        let mut s = sample();
        s.qps[0].1.qpn = 1 << 24;
        let b = record(1, 4, &s);
        assert_eq!(parse_record(&b, b.len(), 1, 4), Err(Error::ProtocolError));
        // A hello announcing an impossible length.
        assert!(parse_hello(&hello(0, 4, 0, 7), 0, 4).is_err());
    }
}
