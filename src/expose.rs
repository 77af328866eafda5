//! Least-privilege, revocable exposure of memory to peers (issue 9, parts
//! 2 and 3).
//!
//! An rkey handed to a peer stays valid until someone revokes it: a peer
//! that disconnected (or was never meant to keep access) could still read
//! or write the memory. [`Mr::expose`] gives one peer its own key for one
//! range of a region, with only the remote access it needs (read-only
//! exposure cannot be written), and [`Exposure::revoke`] (or dropping the
//! exposure, or [`ExposureSet::revoke_all`] when the peer's connection
//! ends) makes that key useless: the peer's RDMA READ, WRITE and atomics
//! with it then fail with a remote access error and leave the memory
//! unchanged. The region itself, and every other peer's exposure, keep
//! working.
//!
//! How: each exposure is its own registration of the range (the same
//! memory registered once more, with the narrow access flags), and
//! revoking deregisters it. That works on every device (the software
//! device, rxe, siw, mlx5). Type-2 memory windows would make binding and
//! invalidating cheaper where the device has them (rxe does; siw does not);
//! they are not used yet, so revocation costs one deregistration.

use std::vec::Vec;

use crate::api::{Access, Backend, Mr, MrKeys};
use crate::error::{Error, Result};
use crate::wr::Remote;

/// The remote rights an exposure grants (only these; local access is the
/// region owner's business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAccess {
    /// RDMA READ only.
    Read,
    /// RDMA WRITE only.
    Write,
    /// RDMA READ and WRITE.
    ReadWrite,
    /// Atomics (and READ, which atomics need to return the old value).
    Atomic,
}

impl RemoteAccess {
    /// The registration flags: the remote bits asked for, plus the local
    /// write the device needs to execute remote writes and atomics.
    fn flags(self) -> Access {
        match self {
            RemoteAccess::Read => Access::REMOTE_READ,
            RemoteAccess::Write => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            RemoteAccess::ReadWrite => {
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
            }
            RemoteAccess::Atomic => {
                Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ
            }
        }
    }
}

/// One range of a region, exposed to one peer under its own rkey. Dropping
/// it revokes the key.
pub struct Exposure<'m, B: Backend> {
    mr: &'m Mr<B>,
    keys: Option<MrKeys>,
    offset: usize,
    len: usize,
    access: RemoteAccess,
}

impl<B: Backend> Mr<B> {
    /// Exposes `len` bytes at `offset` of this region to one peer, with
    /// only `access`: a registration of its own, so its rkey can be
    /// revoked alone ([`Exposure::revoke`]). The borrow keeps the memory
    /// alive (and registered) while the exposure exists.
    ///
    /// Errors: [`Error::InvalidAttribute`] for an empty range or one
    /// outside the region; the device's registration errors.
    pub fn expose(
        &self,
        offset: usize,
        len: usize,
        access: RemoteAccess,
    ) -> Result<Exposure<'_, B>> {
        let end = offset.checked_add(len).ok_or(Error::InvalidAttribute)?;
        if len == 0 || end > self.len() {
            return Err(Error::InvalidAttribute);
        }
        let addr = self.addr() + offset as u64;
        // SAFETY: the range lies inside this region's buffer, which the
        // returned Exposure borrows (so it outlives the registration:
        // dropping the exposure deregisters first).
        let keys = unsafe { self.register_range(addr, len as u64, access.flags()) }?;
        Ok(Exposure {
            mr: self,
            keys: Some(keys),
            offset,
            len,
            access,
        })
    }
}

impl<B: Backend> Exposure<'_, B> {
    /// The key to give the peer (stale after [`Exposure::revoke`]).
    pub fn rkey(&self) -> u32 {
        self.keys.map_or(0, |k| k.rkey)
    }
    /// The peer's address of byte `offset` of the exposed range.
    pub fn remote(&self, offset: usize) -> Remote {
        Remote::new(
            self.mr.addr() + (self.offset + offset) as u64,
            self.keys.map_or(0, |k| k.rkey),
        )
    }
    /// Exposed bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty exposure (never: `Mr::expose` refuses those).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The rights granted.
    pub fn access(&self) -> RemoteAccess {
        self.access
    }
    /// True once revoked.
    pub fn is_revoked(&self) -> bool {
        self.keys.is_none()
    }

    /// Makes the rkey useless: the device deregisters this exposure's
    /// registration, so a peer's READ, WRITE or atomic with the old key
    /// fails with a remote access error and changes nothing. Idempotent.
    /// The caller should first stop posting its own work that uses the
    /// key; WRs of the peer still in flight fail.
    pub fn revoke(&mut self) -> Result<()> {
        match self.keys.take() {
            Some(k) => self.mr.deregister_range(k),
            None => Ok(()),
        }
    }
}

impl<B: Backend> Drop for Exposure<'_, B> {
    fn drop(&mut self) {
        let _ = self.revoke();
    }
}

/// Every exposure made to one peer (one connection): revoke them all when
/// the connection ends, with [`ExposureSet::revoke_all`] or by dropping
/// the set.
pub struct ExposureSet<'m, B: Backend> {
    list: Vec<Exposure<'m, B>>,
}

impl<B: Backend> Default for ExposureSet<'_, B> {
    fn default() -> Self {
        ExposureSet { list: Vec::new() }
    }
}

impl<'m, B: Backend> ExposureSet<'m, B> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }
    /// Exposes a range of `mr` to this set's peer (see [`Mr::expose`]) and
    /// returns its position in the set.
    pub fn expose(
        &mut self,
        mr: &'m Mr<B>,
        offset: usize,
        len: usize,
        access: RemoteAccess,
    ) -> Result<usize> {
        self.list.push(mr.expose(offset, len, access)?);
        Ok(self.list.len() - 1)
    }
    /// The exposure at `i`.
    pub fn get(&self, i: usize) -> Option<&Exposure<'m, B>> {
        self.list.get(i)
    }
    /// Number of exposures (revoked ones included).
    pub fn len(&self) -> usize {
        self.list.len()
    }
    /// True if nothing was exposed.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
    /// Revokes every exposure (the peer disconnected); returns the first
    /// error, after trying them all.
    pub fn revoke_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        for e in &mut self.list {
            if let Err(err) = e.revoke() {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
        first
    }
}
