//! One remote QP's link (docs/spec/fabric.md §2): the segment this side
//! writes ([`LinkOut`]: its requests and its responses to the peer) and
//! the peer's segment it reads ([`LinkIn`]).
//!
//! The creator names its segment after both ends, so the peer finds it
//! without any exchange beyond the QP numbers and GIDs the application
//! already traded to connect. The peer unlinks the name once it has the
//! segment mapped, and the creator unlinks it when the QP leaves RTR/RTS,
//! so a name outlives its processes only if the creator dies before the
//! peer attaches (such leftovers are removed by [`sweep`]).

use core::sync::atomic::{AtomicU64, Ordering};
use std::string::String;

use super::ring::{ring_bytes, RingRx, RingTx};
use super::shm::Segment;
use super::{gid_pid, gid_tag, peer};
use crate::error::{Error, Result};

/// Bytes before the first ring.
pub(crate) const LINK_HEADER: usize = 4096;
/// "RDDFLNK1": written last by the creator, so a peer that sees it sees
/// the rest of the header and both rings initialised.
const MAGIC: u64 = u64::from_le_bytes(*b"RDDFLNK1");
const VERSION: u32 = 1;
/// Smallest ring a peer may offer (a response of one full packet must
/// fit, with room for the record header and a pad).
pub(crate) const MIN_RING: usize = 4 * (super::wire::PACKET + 4096);
/// Prefix of every link segment's name.
pub(crate) const NAME_PREFIX: &str = "rdd-fab-";

/// The segment name of the link from (`src`, `src_qpn`) to (`dst`,
/// `dst_qpn`).
pub(crate) fn name(src: &[u8; 16], src_qpn: u32, dst: &[u8; 16], dst_qpn: u32) -> String {
    let (a, b) = (gid_tag(src), gid_tag(dst));
    // Tags are ASCII hex digits.
    let (a, b) = (
        core::str::from_utf8(&a).unwrap_or("x"),
        core::str::from_utf8(&b).unwrap_or("x"),
    );
    std::format!("{NAME_PREFIX}{a}-{src_qpn:06x}-{b}-{dst_qpn:06x}")
}

/// Header fields (little-endian) at the start of a link segment.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SRC_QPN: usize = 12;
const H_SRC_GID: usize = 16;
const H_DST_GID: usize = 32;
const H_DST_QPN: usize = 48;
const H_RING: usize = 56;

/// The segment this side writes.
pub(crate) struct LinkOut {
    // Declared before `seg`: the rings point into it.
    /// Requests to the peer.
    pub(crate) req: RingTx,
    /// Responses to the peer's requests.
    pub(crate) resp: RingTx,
    seg: Segment,
    name: String,
}

impl LinkOut {
    /// Creates the link segment from (`me`, `qpn`) to (`peer`,
    /// `peer_qpn`) with two rings of `ring` data bytes each (a power of
    /// two, at least [`MIN_RING`]). A leftover segment of the same name
    /// (this device and QP number made it before and the peer never
    /// attached) is replaced.
    pub(crate) fn create(
        me: &[u8; 16],
        qpn: u32,
        peer: &[u8; 16],
        peer_qpn: u32,
        ring: usize,
    ) -> Result<LinkOut> {
        if !ring.is_power_of_two() || ring < MIN_RING {
            return Err(Error::InvalidAttribute);
        }
        let name = name(me, qpn, peer, peer_qpn);
        let len = LINK_HEADER + 2 * ring_bytes(ring);
        let seg = match Segment::create(&name, len) {
            Err(Error::ResourceBusy) => {
                Segment::unlink(&name);
                Segment::create(&name, len)?
            }
            other => other?,
        };
        let base = seg.as_ptr();
        // SAFETY: the segment is `len` bytes, page-aligned, fresh (zero)
        // and ours alone until the magic is published below; the rings
        // lie inside it at 64-byte-aligned offsets.
        let (req, resp) = unsafe {
            let h = base;
            debug_assert_eq!(H_MAGIC, 0);
            core::ptr::copy_nonoverlapping(VERSION.to_le_bytes().as_ptr(), h.add(H_VERSION), 4);
            core::ptr::copy_nonoverlapping(qpn.to_le_bytes().as_ptr(), h.add(H_SRC_QPN), 4);
            core::ptr::copy_nonoverlapping(me.as_ptr(), h.add(H_SRC_GID), 16);
            core::ptr::copy_nonoverlapping(peer.as_ptr(), h.add(H_DST_GID), 16);
            core::ptr::copy_nonoverlapping(peer_qpn.to_le_bytes().as_ptr(), h.add(H_DST_QPN), 4);
            core::ptr::copy_nonoverlapping((ring as u64).to_le_bytes().as_ptr(), h.add(H_RING), 8);
            let req = RingTx::init(base.add(LINK_HEADER), ring);
            let resp = RingTx::init(base.add(LINK_HEADER + ring_bytes(ring)), ring);
            (req, resp)
        };
        let (Some(req), Some(resp)) = (req, resp) else {
            Segment::unlink(&name);
            return Err(Error::InvalidAttribute);
        };
        let largest = 8 + super::wire::REQ_BYTES + super::wire::PACKET;
        if req.max_payload() < largest {
            Segment::unlink(&name);
            return Err(Error::InvalidAttribute);
        }
        // SAFETY: offset 0 of a page-aligned mapping is 8-aligned; the
        // peer reads the word atomically too.
        let magic = unsafe { AtomicU64::from_ptr(base.cast::<u64>()) };
        // Release: a peer that loads the magic with Acquire sees the
        // header fields and both rings' headers written above.
        magic.store(MAGIC, Ordering::Release);
        Ok(LinkOut {
            req,
            resp,
            seg,
            name,
        })
    }
}

impl Drop for LinkOut {
    fn drop(&mut self) {
        // The peer sees both rings closed after the records before, and
        // drops its mapping; the name goes now if the peer never took it.
        self.req.close();
        self.resp.close();
        Segment::unlink(&self.name);
        let _ = &self.seg;
    }
}

/// The peer's segment, as this side reads it.
pub(crate) struct LinkIn {
    /// The peer's requests to this QP.
    pub(crate) req: RingRx,
    /// The peer's responses to this QP's requests.
    pub(crate) resp: RingRx,
    _seg: Segment,
}

impl LinkIn {
    /// Attaches to the segment the peer (`peer`, `peer_qpn`) made for
    /// (`me`, `qpn`). `Ok(None)` while it does not exist or is not
    /// initialised yet; [`Error::ProtocolError`] if what is there is not a
    /// link between these two QPs (a foreign or damaged segment: every
    /// field is checked before a ring is attached). On success the name is
    /// removed: both ends hold the mapping now.
    pub(crate) fn attach(
        me: &[u8; 16],
        qpn: u32,
        peer: &[u8; 16],
        peer_qpn: u32,
    ) -> Result<Option<LinkIn>> {
        let name = name(peer, peer_qpn, me, qpn);
        let Some(seg) = Segment::open(&name, LINK_HEADER + 2 * ring_bytes(MIN_RING))? else {
            return Ok(None);
        };
        let base = seg.as_ptr();
        // SAFETY: offset 0 of a page-aligned mapping of at least
        // LINK_HEADER bytes is 8-aligned; the creator stores it atomically.
        let magic = unsafe { AtomicU64::from_ptr(base.cast::<u64>()) };
        // Acquire: pairs with the creator's Release store of the magic, so
        // the header copied below is the one it wrote.
        match magic.load(Ordering::Acquire) {
            0 => return Ok(None),
            MAGIC => {}
            _ => return Err(Error::ProtocolError),
        }
        let mut h = [0u8; 64];
        // SAFETY: the mapping holds at least LINK_HEADER bytes; the copy
        // is read once and checked below.
        unsafe { core::ptr::copy_nonoverlapping(base, h.as_mut_ptr(), 64) };
        let le32 = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let mut ring = [0u8; 8];
        ring.copy_from_slice(&h[H_RING..H_RING + 8]);
        let ring = u64::from_le_bytes(ring);
        let fits = usize::try_from(ring).ok().and_then(|r| {
            let rb = ring_bytes(r);
            rb.checked_mul(2)?
                .checked_add(LINK_HEADER)
                .filter(|&n| n <= seg.len())
                .map(|_| (r, rb))
        });
        let Some((ring, rb)) = fits.filter(|&(r, _)| r.is_power_of_two() && r >= MIN_RING) else {
            return Err(Error::ProtocolError);
        };
        if le32(H_VERSION) != VERSION
            || le32(H_SRC_QPN) != peer_qpn
            || le32(H_DST_QPN) != qpn
            || h[H_SRC_GID..H_SRC_GID + 16] != peer[..]
            || h[H_DST_GID..H_DST_GID + 16] != me[..]
        {
            return Err(Error::ProtocolError);
        }
        let _ = ring;
        // SAFETY: both ring areas lie inside the mapping (checked above),
        // which `_seg` keeps alive as long as the rings.
        let rings = unsafe {
            (
                RingRx::attach(base.add(LINK_HEADER), rb),
                RingRx::attach(base.add(LINK_HEADER + rb), rb),
            )
        };
        let (Ok(req), Ok(resp)) = rings else {
            return Err(Error::ProtocolError);
        };
        Segment::unlink(&name);
        Ok(Some(LinkIn {
            req,
            resp,
            _seg: seg,
        }))
    }

    /// The peer closed its end (its QP left RTR/RTS or was destroyed)
    /// and every record before that was consumed.
    pub(crate) fn closed(&self) -> bool {
        self.req.is_closed() && self.resp.is_closed()
    }
}

/// Removes link segments whose creating process no longer runs (the
/// creator died before its peer attached). Called when a fabric device
/// is made; a name that does not parse is left alone.
pub(crate) fn sweep() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for ent in dir.flatten() {
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
            continue;
        };
        // The creator's tag starts with its pid in 8 hex digits.
        let Some(pid) = rest.get(..8).and_then(|h| u32::from_str_radix(h, 16).ok()) else {
            continue;
        };
        let mut gid = [0u8; 16];
        gid[8..12].copy_from_slice(&pid.to_be_bytes());
        if !peer::alive(gid_pid(&gid)) {
            Segment::unlink(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::fabric::new_gid;

    #[test]
    fn a_peer_attaching_while_the_segment_is_made_waits() {
        let (a, b) = (new_gid(), new_gid());
        let n = name(&a, 0x100, &b, 0x200);
        // The creator has named the segment and not sized it yet.
        Segment::name_unsized(&n);
        assert!(LinkIn::attach(&b, 0x200, &a, 0x100).unwrap().is_none());
        // The creator finishes (replacing the name as a leftover), and the
        // peer attaches.
        let out = LinkOut::create(&a, 0x100, &b, 0x200, 256 * 1024).unwrap();
        let inc = LinkIn::attach(&b, 0x200, &a, 0x100).unwrap();
        assert!(inc.is_some());
        drop((out, inc));
    }

    #[test]
    fn a_segment_of_the_wrong_size_is_refused() {
        let (a, b) = (new_gid(), new_gid());
        let n = name(&a, 0x100, &b, 0x200);
        let seg = Segment::create(&n, LINK_HEADER).unwrap();
        assert!(matches!(
            LinkIn::attach(&b, 0x200, &a, 0x100),
            Err(Error::InvalidAttribute)
        ));
        Segment::unlink(&n);
        drop(seg);
    }
}
