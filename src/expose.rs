//! Least-privilege, revocable exposure of memory to peers.
//!
//! An rkey handed to a peer stays valid until someone revokes it: a peer
//! that disconnected (or was never meant to keep access) could still read
//! or write the memory. An [`Exposure`] gives one peer its own key for one
//! range of a region, with only the remote access it needs (read-only
//! exposure cannot be written), and [`Exposure::revoke`] (or dropping the
//! exposure, or [`ExposureSet::revoke_all`] when the peer's connection
//! ends) makes that key useless: the peer's RDMA READ, WRITE and atomics
//! with it then fail with a remote access error and leave the memory
//! unchanged. The region itself, and every other peer's exposure, keep
//! working.
//!
//! Two mechanisms:
//!
//! - **Type-2 memory windows** ([`Mr::expose_to`]), where the device has
//!   them (rxe does; the software device, siw and the mlx5 core do not).
//!   A window is bound to the range by a BIND_MW work request on the QP of
//!   the peer that gets the key, and then answers only requests arriving
//!   on that QP (IBA type 2B), so a key that leaks to another connection is
//!   useless there too. Revoking is a LOCAL_INV work request on the same
//!   QP ([`Exposure::invalidate`]: no system call on the direct data path,
//!   no re-registration) or, at once and without a WR, deallocating the
//!   window ([`Exposure::revoke`]: one system call). An invalidated window
//!   can be bound again under a fresh key ([`Exposure::rebind`]). The
//!   region must be registered with [`Access::MW_BIND`] (and
//!   [`Access::LOCAL_WRITE`] for exposures that may be written).
//! - **A registration of its own** ([`Mr::expose`], and the fallback of
//!   [`Mr::expose_to`]): the same memory registered once more with the
//!   narrow access flags; revoking deregisters it. Works on every device.
//!
//! `docs/benchmarks.md` compares the costs on rxe.

use std::vec::Vec;

use crate::api::{Access, Backend, Mr, MrKeys, Qp, QpState};
use crate::error::{Error, Result};
use crate::wr::{MwBind, Remote, SendFlags, SendOp, SendWr};

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
    pub(crate) fn flags(self) -> Access {
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

    /// The rights a window grants: the remote bits only.
    pub(crate) fn window_bits(self) -> u32 {
        self.flags().0 & !Access::LOCAL_WRITE.0
    }

    /// True if the peer may change the memory (the region then needs
    /// local write, IBA C10-74).
    pub(crate) fn writes(self) -> bool {
        !matches!(self, RemoteAccess::Read)
    }
}

/// True if a window granting `access` may be bound to a region
/// registered with `mr_access` (IBA C10-73, C10-74): the region allows
/// binding, and local write when the window lets the peer write.
pub(crate) fn window_fits(mr_access: Access, access: RemoteAccess) -> bool {
    mr_access.contains(Access::MW_BIND)
        && (!access.writes() || mr_access.contains(Access::LOCAL_WRITE))
}

/// The BIND_MW operation that binds window `mw_rkey` to `len` bytes at
/// `addr` of the region with local key `mr_lkey`, granting `access`, and
/// the window's key after it: a fresh low byte (the upper 24 bits name
/// the window).
pub(crate) fn bind_op(
    addr: u64,
    len: u64,
    mr_lkey: u32,
    mw_rkey: u32,
    access: RemoteAccess,
) -> (SendOp, u32) {
    let new_rkey = (mw_rkey & !0xff) | (mw_rkey.wrapping_add(1) & 0xff);
    let bind = MwBind {
        addr,
        len,
        mr_lkey,
        mw_rkey,
        new_rkey,
        access: access.window_bits(),
    };
    (SendOp::BindMw(bind), new_rkey)
}

/// How an exposure's key was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    /// A registration of its own.
    Registered(MrKeys),
    /// A type-2 window, bound (or being bound) under `rkey`, or invalidated
    /// (`bound == false`: free to bind again).
    Window { rkey: u32, bound: bool },
    /// Revoked: the registration is gone or the window deallocated.
    Revoked,
}

/// One range of a region, exposed to one peer under its own rkey. Dropping
/// it revokes the key.
pub struct Exposure<'m, B: Backend> {
    mr: &'m Mr<B>,
    key: Key,
    /// The last key handed out (stale once revoked or invalidated).
    rkey: u32,
    /// Made as a window (kept after revocation).
    window: bool,
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
        self.check_range(offset, len)?;
        let addr = self.addr() + offset as u64;
        // SAFETY: the range lies inside this region's buffer, which the
        // returned Exposure borrows (so it outlives the registration:
        // dropping the exposure deregisters first).
        let keys = unsafe { self.register_range(addr, len as u64, access.flags()) }?;
        Ok(Exposure {
            mr: self,
            key: Key::Registered(keys),
            rkey: keys.rkey,
            window: false,
            offset,
            len,
            access,
        })
    }

    /// Exposes `len` bytes at `offset` to the peer of `qp` only, with only
    /// `access`, through a type-2 memory window bound on `qp`: posts one
    /// BIND_MW work request with `wr_id` and `flags` (its completion, with
    /// opcode `BIND_MW`, arrives if `flags` asks for one). Hand the key out
    /// once the bind has completed; on rxe, WRs posted on `qp` after it
    /// (a SEND carrying the key, say) execute after it.
    ///
    /// Falls back to [`Mr::expose`] (no WR posted) where windows cannot be
    /// used: the device or data path has none, or this region was
    /// registered without [`Access::MW_BIND`], or without
    /// [`Access::LOCAL_WRITE`] for an access that writes.
    /// [`Exposure::is_window`] says which one was made.
    ///
    /// Errors: [`Error::InvalidAttribute`] for an empty range, one outside
    /// the region, or a QP of another protection domain;
    /// [`Error::InvalidQpState`] for a window on a QP that is not in RTS;
    /// the post's errors (the window is deallocated again).
    pub fn expose_to(
        &self,
        qp: &mut Qp<B>,
        wr_id: u64,
        flags: SendFlags,
        offset: usize,
        len: usize,
        access: RemoteAccess,
    ) -> Result<Exposure<'_, B>> {
        self.check_range(offset, len)?;
        if !self.same_pd(qp) {
            return Err(Error::InvalidAttribute);
        }
        if !window_fits(self.access(), access) {
            return self.expose(offset, len, access);
        }
        let rkey = match self.alloc_window() {
            Ok(k) => k,
            Err(Error::Unsupported) => return self.expose(offset, len, access),
            Err(e) => return Err(e),
        };
        let mut e = Exposure {
            mr: self,
            key: Key::Window { rkey, bound: false },
            rkey,
            window: true,
            offset,
            len,
            access,
        };
        // On error, dropping `e` deallocates the window.
        e.rebind(qp, wr_id, flags)?;
        Ok(e)
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        let end = offset.checked_add(len).ok_or(Error::InvalidAttribute)?;
        if len == 0 || end > self.len() {
            return Err(Error::InvalidAttribute);
        }
        Ok(())
    }
}

impl<B: Backend> Exposure<'_, B> {
    /// The key to give the peer (stale after [`Exposure::revoke`] or
    /// [`Exposure::invalidate`]).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The peer's address of byte `offset` of the exposed range.
    pub fn remote(&self, offset: usize) -> Remote {
        Remote::new(self.mr.addr() + (self.offset + offset) as u64, self.rkey)
    }
    /// True if this exposure is a type-2 memory window (see
    /// [`Mr::expose_to`]); false for a registration of its own.
    pub fn is_window(&self) -> bool {
        self.window
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
    /// True once revoked (for a window: once invalidated too, until it is
    /// bound again).
    pub fn is_revoked(&self) -> bool {
        matches!(self.key, Key::Revoked | Key::Window { bound: false, .. })
    }

    /// Makes the rkey useless at once: deregisters this exposure's
    /// registration, or deallocates its window (one system call; the
    /// device invalidates the key before the call returns, without a work
    /// request or a completion). A peer's READ, WRITE or atomic with the
    /// old key then fails with a remote access error and changes nothing.
    /// Idempotent; a revoked exposure cannot be bound again. The caller
    /// should first stop posting its own work that uses the key; WRs of
    /// the peer still in flight fail.
    pub fn revoke(&mut self) -> Result<()> {
        match core::mem::replace(&mut self.key, Key::Revoked) {
            Key::Registered(k) => self.mr.deregister_range(k),
            Key::Window { rkey, .. } => self.mr.dealloc_window(rkey),
            Key::Revoked => Ok(()),
        }
    }

    /// The fast revocation of a window: posts a LOCAL_INV work request for
    /// the current key on `qp` (the QP it was bound on) with `wr_id` and
    /// `flags`: no system call on the direct data path and nothing
    /// re-registered. The key is useless from the moment the WR executes;
    /// its completion (opcode `LOCAL_INV`, if `flags` asks for one) says
    /// so. Returns `true` if a WR was posted.
    ///
    /// A registration has no such WR: it is revoked at once as by
    /// [`Exposure::revoke`], and `false` is returned (no completion will
    /// come). So is a window when `qp` is not in RTS: a LOCAL_INV posted
    /// there would be flushed, not executed, and the window would stay
    /// bound to the QP (and valid again after a RESET and a reconnect to
    /// another peer). Already revoked or invalidated: `false`, nothing
    /// done.
    ///
    /// A window bound on a QP stays bound across the QP's RESET: revoke
    /// or invalidate it (or [`ExposureSet::revoke_all`]) before the QP is
    /// reconnected to another peer.
    pub fn invalidate(&mut self, qp: &mut Qp<B>, wr_id: u64, flags: SendFlags) -> Result<bool> {
        match self.key {
            Key::Window { bound: true, .. } if qp.state() != QpState::Rts => {
                self.revoke().map(|()| false)
            }
            Key::Window { rkey, bound: true } => {
                qp.post_send_one(&SendWr::new(wr_id, SendOp::LocalInv { rkey }, &[], flags))?;
                self.key = Key::Window { rkey, bound: false };
                Ok(true)
            }
            Key::Registered(_) => self.revoke().map(|()| false),
            Key::Window { bound: false, .. } | Key::Revoked => Ok(false),
        }
    }

    /// Binds an invalidated window again, to the same range and rights,
    /// under a fresh key (the old one stays useless): posts one BIND_MW on
    /// `qp`, as [`Mr::expose_to`] does. For the next connection on a reused
    /// QP, or to re-admit the same peer. Errors: [`Error::Unsupported`]
    /// for a registration; [`Error::ResourceBusy`] while the window is
    /// bound; [`Error::InvalidAttribute`] once it was revoked
    /// (deallocated).
    pub fn rebind(&mut self, qp: &mut Qp<B>, wr_id: u64, flags: SendFlags) -> Result<()> {
        let rkey = match self.key {
            _ if !self.window => return Err(Error::Unsupported),
            Key::Window { rkey, bound: false } => rkey,
            Key::Window { bound: true, .. } => return Err(Error::ResourceBusy),
            _ => return Err(Error::InvalidAttribute),
        };
        if !self.mr.same_pd(qp) {
            return Err(Error::InvalidAttribute);
        }
        // A BIND_MW posted elsewhere would be flushed, not executed.
        if qp.state() != QpState::Rts {
            return Err(Error::InvalidQpState);
        }
        let (op, new_rkey) = bind_op(
            self.mr.addr() + self.offset as u64,
            self.len as u64,
            self.mr.lkey(),
            rkey,
            self.access,
        );
        qp.post_send_one(&SendWr::new(wr_id, op, &[], flags))?;
        self.key = Key::Window {
            rkey: new_rkey,
            bound: true,
        };
        self.rkey = new_rkey;
        Ok(())
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
    /// Exposes a range of `mr` through a window bound on the peer's QP
    /// where possible (see [`Mr::expose_to`]) and returns its position in
    /// the set.
    #[allow(clippy::too_many_arguments)]
    pub fn expose_to(
        &mut self,
        qp: &mut Qp<B>,
        wr_id: u64,
        flags: SendFlags,
        mr: &'m Mr<B>,
        offset: usize,
        len: usize,
        access: RemoteAccess,
    ) -> Result<usize> {
        self.list
            .push(mr.expose_to(qp, wr_id, flags, offset, len, access)?);
        Ok(self.list.len() - 1)
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
