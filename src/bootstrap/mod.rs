//! Bootstrapping a mesh of connected RC QPs among `size` ranks from an
//! allgather the caller supplies ([`Allgather`]: MPI's `MPI_Allgather`,
//! the built-in TCP rendezvous [`TcpAllgather`], or anything else that
//! gives every rank every rank's bytes).
//!
//! [`MeshBuilder`] creates one RC QP per peer (every other rank, or a
//! chosen subset), exchanges a versioned, checksummed record per rank
//! (its QPs' connection data and the memory regions it publishes),
//! checks every record it receives, connects, and agrees with every rank
//! that all of them connected before it returns. Any failure, local or
//! on another rank, destroys every QP it created and is reported on
//! every rank: nothing is left half-connected. The format and the rules
//! are in docs/architecture.md ("Bootstrap").
//!
//! ```
//! use std::sync::{Arc, Barrier, Mutex};
//! use rdma_direct::api::*;
//! use rdma_direct::bootstrap::{Allgather, MeshBuilder};
//! use rdma_direct::soft::SoftDevice;
//!
//! // A one-rank "allgather": a mesh of one rank has no peers.
//! struct Solo;
//! impl Allgather for Solo {
//!     fn rank(&self) -> u32 { 0 }
//!     fn size(&self) -> u32 { 1 }
//!     fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> rdma_direct::Result<()> {
//!         all.copy_from_slice(mine);
//!         Ok(())
//!     }
//! }
//! let dev = Device::new(SoftDevice::new(Default::default()));
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(64)?;
//! let mesh = MeshBuilder::new(&pd, &cq, &cq).build(&mut Solo)?;
//! assert_eq!(mesh.peers().len(), 0);
//! # Ok::<(), rdma_direct::Error>(())
//! ```

mod exchange;
mod mesh;
mod tcp;
mod wire;

use crate::error::Result;
use crate::wr::Remote;

pub(crate) use exchange::{exchange, Endpoints};
pub use mesh::{Mesh, MeshBuilder, MeshPeer};
pub use tcp::TcpAllgather;
pub use wire::MAX_PUBLISHED_MRS;

/// An allgather among `size` ranks: every rank calls
/// [`Allgather::allgather`] with the same number of bytes, and every rank
/// gets every rank's bytes, rank `r`'s at `all[r * mine.len()..]`
/// (`MPI_Allgather` with `MPI_BYTE`).
///
/// The mesh builder calls it three times per build, on every rank in the
/// same order, whatever happened locally (a rank that failed says so in
/// its contribution rather than skipping a call, so nobody waits for it).
/// An implementation should bound its waits and return an error
/// ([`crate::Error::Timeout`], [`crate::Error::ConnectFailed`]) rather
/// than hang when a rank vanishes.
pub trait Allgather {
    /// This rank, `0..size`.
    fn rank(&self) -> u32;
    /// The number of ranks.
    fn size(&self) -> u32;
    /// Gathers `mine` from every rank into `all`, which is exactly
    /// `mine.len() * size` bytes.
    fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> Result<()>;
}

impl<T: Allgather + ?Sized> Allgather for &mut T {
    fn rank(&self) -> u32 {
        (**self).rank()
    }
    fn size(&self) -> u32 {
        (**self).size()
    }
    fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> Result<()> {
        (**self).allgather(mine, all)
    }
}

/// A memory region a peer published: where it is, how long, and the key
/// to reach it with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteMr {
    /// The region's address in the peer's address space.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
}

impl RemoteMr {
    /// The remote address of byte `offset` (bounds are checked by the
    /// peer's device when the WR executes).
    pub fn remote(&self, offset: u64) -> Remote {
        Remote::new(self.addr.wrapping_add(offset), self.rkey)
    }
}
