//! The Rust API's mesh: [`MeshBuilder`] makes the [`Qp`]s on a PD and
//! runs the bootstrap protocol (`exchange.rs`) over them; [`Mesh`] holds
//! the connected QPs and the peers' published regions.

use std::vec::Vec;

use crate::api::{Backend, ConnectAttr, Cq, Mr, Pd, Qp, QpInfo, QpInit};
use crate::error::Result;

use super::{exchange, Allgather, Endpoints, RemoteMr};

/// Builds a [`Mesh`]: one RC QP per peer on `pd`, completing on the CQs
/// given (which must be deep enough for all of them: see
/// [`crate::api::Device::cq_depth_for`]).
pub struct MeshBuilder<'a, B: Backend> {
    pd: &'a Pd<B>,
    send_cq: &'a Cq<B>,
    recv_cq: &'a Cq<B>,
    init: QpInit,
    attr: ConnectAttr,
    peers: Option<Vec<u32>>,
    mrs: Vec<RemoteMr>,
}

/// One peer of a [`Mesh`]: its rank, the QP connected to it, and the
/// regions it published (in its order).
pub struct MeshPeer<B: Backend> {
    /// The peer's rank.
    pub rank: u32,
    /// The QP connected to the peer's QP towards this rank.
    pub qp: Qp<B>,
    /// What the peer published ([`MeshBuilder::publish`]).
    pub mrs: Vec<RemoteMr>,
}

/// A connected mesh: every QP is in RTS, connected to its peer's, and so
/// are the peers' (the build agreed on it with every rank).
pub struct Mesh<B: Backend> {
    rank: u32,
    size: u32,
    peers: Vec<MeshPeer<B>>,
}

impl<'a, B: Backend> MeshBuilder<'a, B> {
    /// A builder for QPs on `pd` completing on `send_cq` and `recv_cq`
    /// (may be the same): default [`QpInit`] and [`ConnectAttr`], every
    /// other rank a peer, nothing published.
    pub fn new(pd: &'a Pd<B>, send_cq: &'a Cq<B>, recv_cq: &'a Cq<B>) -> Self {
        MeshBuilder {
            pd,
            send_cq,
            recv_cq,
            init: QpInit::default(),
            attr: ConnectAttr::default(),
            peers: None,
            mrs: Vec::new(),
        }
    }

    /// The capacities of every QP.
    pub fn qp_init(mut self, init: QpInit) -> Self {
        self.init = init;
        self
    }

    /// The attributes every QP connects with (the remote access it
    /// grants, retries, ...).
    pub fn connect_attr(mut self, attr: ConnectAttr) -> Self {
        self.attr = attr;
        self
    }

    /// Connects only to these ranks (distinct, in range, not this rank;
    /// [`crate::Error::InvalidAttribute`] otherwise). Every rank listed
    /// must list this rank in turn, or the build fails on every rank
    /// with [`crate::Error::ProtocolError`].
    pub fn peers(mut self, ranks: &[u32]) -> Self {
        self.peers = Some(ranks.to_vec());
        self
    }

    /// Publishes `mr` (its address, length and rkey) to every peer.
    pub fn publish(mut self, mr: &Mr<B>) -> Self {
        self.mrs.push(RemoteMr {
            addr: mr.addr(),
            len: mr.len() as u64,
            rkey: mr.rkey(),
        });
        self
    }

    /// Publishes a region described by hand (a buffer pool's, say).
    pub fn publish_remote(mut self, mr: RemoteMr) -> Self {
        self.mrs.push(mr);
        self
    }

    /// Creates the QPs and connects them through `ag`, called the same
    /// way on every rank.
    ///
    /// Errors, after which no QP made by the call is left, on every rank
    /// for all but the local ones:
    /// - [`crate::Error::InvalidAttribute`]: the allgather's rank is not
    ///   below its size, a peer list that is not distinct, in range and
    ///   without this rank, more than [`super::MAX_PUBLISHED_MRS`]
    ///   regions, or QP capacities or connect attributes the device
    ///   refuses (the local rank's error; the others get
    ///   [`crate::Error::ConnectFailed`]);
    /// - [`crate::Error::ProtocolError`]: a message that is not well
    ///   formed (magic, version, checksum, a rank field that is not its
    ///   sender's slot, which is also what a duplicate rank gives, another
    ///   size, entry counts that disagree with the announced length, a
    ///   peer out of range, a `QpInfo` that fails [`QpInfo::validate`]),
    ///   or a rank listed by a peer it does not list;
    /// - [`crate::Error::ConnectFailed`]: another rank failed locally
    ///   (creating or connecting its QPs);
    /// - what the allgather returns, and what the device returns for the
    ///   local QPs.
    pub fn build<A: Allgather + ?Sized>(self, ag: &mut A) -> Result<Mesh<B>> {
        let (rank, size) = (ag.rank(), ag.size());
        let mut ep = ApiEndpoints {
            pd: self.pd,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            init: self.init,
            attr: self.attr,
            qps: Vec::new(),
        };
        let mut dyn_ag = DynAg(ag);
        let (ranks, mrs) = exchange(&mut dyn_ag, self.peers.as_deref(), &self.mrs, &mut ep)?;
        let peers = ranks
            .into_iter()
            .zip(ep.qps)
            .zip(mrs)
            .map(|((rank, qp), mrs)| MeshPeer { rank, qp, mrs })
            .collect();
        Ok(Mesh { rank, size, peers })
    }
}

/// Lets `build` take an unsized allgather and hand the protocol a
/// `&mut dyn Allgather`.
struct DynAg<'a, A: Allgather + ?Sized>(&'a mut A);

impl<A: Allgather + ?Sized> Allgather for DynAg<'_, A> {
    fn rank(&self) -> u32 {
        self.0.rank()
    }
    fn size(&self) -> u32 {
        self.0.size()
    }
    fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> Result<()> {
        self.0.allgather(mine, all)
    }
}

struct ApiEndpoints<'a, B: Backend> {
    pd: &'a Pd<B>,
    send_cq: &'a Cq<B>,
    recv_cq: &'a Cq<B>,
    init: QpInit,
    attr: ConnectAttr,
    qps: Vec<Qp<B>>,
}

impl<B: Backend> Endpoints for ApiEndpoints<'_, B> {
    fn create(&mut self, peers: &[u32]) -> Result<Vec<QpInfo>> {
        // Checked before any QP is made, so a bad attribute is refused
        // whole.
        self.attr.validate()?;
        let mut infos = Vec::with_capacity(peers.len());
        for _ in peers {
            let qp = self.pd.create_qp(self.send_cq, self.recv_cq, &self.init)?;
            infos.push(qp.info());
            self.qps.push(qp);
        }
        Ok(infos)
    }

    fn connect(&mut self, idx: usize, remote: &QpInfo) -> Result<()> {
        self.qps[idx].connect(remote, &self.attr)
    }

    fn clear(&mut self) {
        // Dropping a Qp destroys it.
        self.qps.clear();
    }
}

impl<B: Backend> Mesh<B> {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }
    /// The peers, in the order they were listed (rank order by default).
    pub fn peers(&self) -> &[MeshPeer<B>] {
        &self.peers
    }
    /// The peers, mutably (to post and poll).
    pub fn peers_mut(&mut self) -> &mut [MeshPeer<B>] {
        &mut self.peers
    }
    /// The peer `rank`, if it is one.
    pub fn peer(&self, rank: u32) -> Option<&MeshPeer<B>> {
        self.peers.iter().find(|p| p.rank == rank)
    }
    /// The peer `rank`, mutably.
    pub fn peer_mut(&mut self, rank: u32) -> Option<&mut MeshPeer<B>> {
        self.peers.iter_mut().find(|p| p.rank == rank)
    }
    /// The peers, taken out (dropping a QP destroys it).
    pub fn into_peers(self) -> Vec<MeshPeer<B>> {
        self.peers
    }
}
