//! The bootstrap protocol, independent of which objects the QPs are (the
//! Rust API's [`crate::api::Qp`] or the C ABI's handles): three allgather
//! rounds (hello, record, commit; docs/architecture.md, "Bootstrap"),
//! every received message checked, and every created QP destroyed on any
//! failure.

use std::vec;
use std::vec::Vec;

use crate::api::QpInfo;
use crate::error::{Error, Result};

use super::wire::{self, Record, COMMIT_LEN, HELLO_LEN};
use super::{Allgather, RemoteMr};

/// What the protocol needs from the QPs it builds.
pub(crate) trait Endpoints {
    /// Creates one RC QP per rank of `peers` (in that order) and returns
    /// their connection data. On an error the QPs made so far stay for
    /// [`Endpoints::clear`].
    fn create(&mut self, peers: &[u32]) -> Result<Vec<QpInfo>>;
    /// Connects the QP made for `peers[idx]` to `remote`.
    fn connect(&mut self, idx: usize, remote: &QpInfo) -> Result<()>;
    /// Destroys every QP made.
    fn clear(&mut self);
}

/// The error a rank reports when another rank failed (its status is in
/// its message): the mesh cannot be built, worth retrying.
const PEER_FAILED: Error = Error::ConnectFailed;

/// A status word: 0, or the code of an error (never 0).
fn status_of(r: &Result<()>) -> u32 {
    match r {
        Ok(()) => 0,
        Err(e) => e.code(),
    }
}

/// The peer list: `peers` (distinct, in range, not `rank`), or every
/// other rank.
fn peer_list(rank: u32, size: u32, peers: Option<&[u32]>) -> Result<Vec<u32>> {
    match peers {
        None => Ok((0..size).filter(|&r| r != rank).collect()),
        Some(p) => {
            for (i, &r) in p.iter().enumerate() {
                if r >= size || r == rank || p[..i].contains(&r) {
                    return Err(Error::InvalidAttribute);
                }
            }
            Ok(p.to_vec())
        }
    }
}

/// Runs one allgather round of `mine`; also says whether our own slot
/// came back as we sent it (an allgather that scrambles or overwrites
/// slots is broken). That check is this rank's alone, so it is never an
/// early return: every rank must leave the protocol at the same round,
/// and a local finding is announced in the commit round instead.
fn round(ag: &mut dyn Allgather, rank: u32, size: u32, mine: &[u8]) -> Result<(Vec<u8>, bool)> {
    let n = mine.len();
    let total = n
        .checked_mul(size as usize)
        .ok_or(Error::InvalidAttribute)?;
    let mut all = vec![0u8; total];
    ag.allgather(mine, &mut all)?;
    let at = rank as usize * n;
    let mine_back = all[at..at + n] == *mine;
    Ok((all, mine_back))
}

/// Builds the mesh: on `Ok`, the QPs of `ep` (one per returned peer, in
/// order) are connected on every rank, and the peers' published MRs come
/// with them. On `Err` `ep` holds no QP.
pub(crate) fn exchange(
    ag: &mut dyn Allgather,
    peers: Option<&[u32]>,
    mrs: &[RemoteMr],
    ep: &mut dyn Endpoints,
) -> Result<(Vec<u32>, Vec<Vec<RemoteMr>>)> {
    let r = run(ag, peers, mrs, ep);
    if r.is_err() {
        ep.clear();
    }
    r
}

fn run(
    ag: &mut dyn Allgather,
    peers: Option<&[u32]>,
    mrs: &[RemoteMr],
    ep: &mut dyn Endpoints,
) -> Result<(Vec<u32>, Vec<Vec<RemoteMr>>)> {
    let (rank, size) = (ag.rank(), ag.size());
    if rank >= size {
        // No slot to speak from: nothing can be told to the others.
        return Err(Error::InvalidAttribute);
    }

    // Local work first; a failure is announced in the hello, so that
    // every rank stops after the first round instead of waiting for us.
    let mut peer_ranks = Vec::new();
    let mut mine = Vec::new();
    let local = (|| {
        peer_ranks = peer_list(rank, size, peers)?;
        if mrs.len() > wire::MAX_PUBLISHED_MRS
            || mrs.iter().any(|m| m.addr.checked_add(m.len).is_none())
        {
            return Err(Error::InvalidAttribute);
        }
        let infos = ep.create(&peer_ranks)?;
        let rec = Record {
            qps: peer_ranks.iter().copied().zip(infos).collect(),
            mrs: mrs.to_vec(),
        };
        mine = wire::record(rank, size, &rec);
        Ok(())
    })();

    // Round 1: hellos. Every check made on the gathered table is made
    // alike by every rank (they all have the same table), so a refusal
    // there ends the build on every rank at the same round.
    let (all, hello_back) = round(
        ag,
        rank,
        size,
        &wire::hello(rank, size, status_of(&local), mine.len() as u32),
    )?;
    let mut lens = Vec::with_capacity(size as usize);
    let mut failed = false;
    for (slot, h) in all.chunks_exact(HELLO_LEN).enumerate() {
        let (status, len) = wire::parse_hello(h, slot as u32, size)?;
        failed |= status != 0;
        lens.push(len as usize);
    }
    local?;
    if failed {
        return Err(PEER_FAILED);
    }

    // Round 2: records, each padded with zeros to the longest. (Ours is
    // longer only if the table's hello of ours is not what we sent; then
    // we send zeros, which every rank refuses.)
    let width = lens.iter().copied().max().unwrap_or(0);
    if mine.len() > width {
        mine.clear();
    }
    mine.resize(width, 0);
    let (all, record_back) = round(ag, rank, size, &mine)?;
    let mut recs = Vec::with_capacity(size as usize);
    for (slot, b) in all.chunks_exact(width).enumerate() {
        recs.push(wire::parse_record(b, lens[slot], slot as u32, size)?);
    }
    // Every listed pair lists each other (checked for all pairs, so every
    // rank, having the same table, refuses the same tables).
    for (r, rec) in recs.iter().enumerate() {
        for (p, _) in &rec.qps {
            if !recs[*p as usize].qps.iter().any(|(q, _)| *q as usize == r) {
                return Err(Error::ProtocolError);
            }
        }
    }

    // Connect, then agree that everybody did.
    let connected = (|| {
        if !hello_back || !record_back {
            return Err(Error::ProtocolError);
        }
        for (idx, &p) in peer_ranks.iter().enumerate() {
            let remote = recs[p as usize]
                .qps
                .iter()
                .find(|(q, _)| *q == rank)
                .map(|(_, i)| *i)
                .ok_or(Error::ProtocolError)?;
            ep.connect(idx, &remote)?;
        }
        Ok(())
    })();
    let (all, _) = round(
        ag,
        rank,
        size,
        &wire::commit(rank, size, status_of(&connected)),
    )?;
    let mut failed = false;
    for (slot, c) in all.chunks_exact(COMMIT_LEN).enumerate() {
        failed |= wire::parse_commit(c, slot as u32, size)? != 0;
    }
    connected?;
    if failed {
        return Err(PEER_FAILED);
    }
    let peer_mrs = peer_ranks
        .iter()
        .map(|&p| recs[p as usize].mrs.clone())
        .collect();
    Ok((peer_ranks, peer_mrs))
}
