//! The bootstrap in C (features `ffi` + `soft`): `rdd_mesh_create` builds
//! a mesh of connected RC QPs through an allgather callback the caller
//! supplies (`MPI_Allgather` in a small wrapper, or the built-in TCP
//! rendezvous `rdd_tcp_allgather`), with the protocol and the checks of
//! `crate::bootstrap` (docs/architecture.md, "Bootstrap"). The QPs are
//! ordinary `rdd_qp` handles, made and connected through the object-level
//! calls, owned by the mesh and destroyed with it.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::ptr;
use core::time::Duration;

use std::boxed::Box;
use std::format;
use std::sync::Mutex;
use std::vec::Vec;

use crate::api::QpInfo;
use crate::bootstrap::{exchange, Allgather, Endpoints, RemoteMr, TcpAllgather};
use crate::error::{Error, Result};
use crate::ffi::status::rdd_status;

use super::object::{
    as_handle, destroy_all, excl, h, insert, put, shared, Object, KIND_MESH, KIND_TCP_AG,
};
use super::object::{
    rdd_connect_attr, rdd_cq, rdd_mr, rdd_mr_addr, rdd_mr_len, rdd_mr_rkey, rdd_pd, rdd_qp,
    rdd_qp_connect, rdd_qp_create, rdd_qp_destroy, rdd_qp_info, rdd_qp_init, rdd_qp_query_info,
};

/// The allgather a mesh is built through: gathers `len` bytes from
/// `mine` on every rank into `all` (`len * size` bytes, rank `r`'s at
/// `all + r * len`), as `MPI_Allgather(mine, len, MPI_BYTE, all, len,
/// MPI_BYTE, comm)` does. Returns 0 on success; anything else fails the
/// build (an `rdd_status` value is passed on as the build's status, any
/// other value becomes `RDD_STATUS_CONNECT_FAILED`). It is called three
/// times per `rdd_mesh_create`, on every rank in the same order, and
/// should not block without bound.
pub type rdd_allgather_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        mine: *const c_void,
        len: usize,
        all: *mut c_void,
    ) -> c_int,
>;

/// A connected mesh (opaque handle): `rdd_mesh_create` / `rdd_mesh_destroy`.
pub struct rdd_mesh {
    _private: [u8; 0],
}

/// The built-in TCP rendezvous (opaque handle), an allgather for
/// `rdd_mesh_create`: `rdd_tcp_allgather_create` /
/// `rdd_tcp_allgather_destroy`.
pub struct rdd_tcp_rendezvous {
    _private: [u8; 0],
}

/// What `rdd_mesh_create` builds.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdd_mesh_init {
    /// This rank, `0..size` (the allgather's).
    pub rank: u32,
    /// The number of ranks.
    pub size: u32,
    /// Capacities of every QP (NULL: `rdd_qp_create`'s defaults).
    pub qp: *const rdd_qp_init,
    /// Attributes every QP connects with (NULL: `rdd_qp_connect`'s
    /// defaults, no remote access).
    pub attr: *const rdd_connect_attr,
    /// The ranks to connect to (distinct, in range, not `rank`); NULL
    /// with `n_peers` 0: every other rank.
    pub peers: *const u32,
    /// Entries of `peers`.
    pub n_peers: usize,
    /// Regions to publish to every peer (their address, length, rkey).
    pub mrs: *const *mut rdd_mr,
    /// Entries of `mrs` (at most `RDD_MESH_MAX_MRS`).
    pub n_mrs: usize,
}

/// A region a peer published (`rdd_mesh_peer_mr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdd_remote_mr {
    /// Its address in the peer's address space.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Always 0.
    pub reserved: u32,
}

/// Most regions one rank may publish in a mesh.
pub const RDD_MESH_MAX_MRS: usize = 4096;
static_assertions::const_assert_eq!(RDD_MESH_MAX_MRS, crate::bootstrap::MAX_PUBLISHED_MRS);

struct MeshPeerObj {
    rank: u32,
    qp: usize,
    mrs: Vec<RemoteMr>,
}

struct MeshObj {
    size: u32,
    peers: Vec<MeshPeerObj>,
}

impl Drop for MeshObj {
    fn drop(&mut self) {
        for p in &self.peers {
            let _ = rdd_qp_destroy(as_handle(p.qp));
        }
    }
}

// SAFETY: the kind value is used by this type only (table.rs lists them).
unsafe impl Object for MeshObj {
    const KIND: u8 = KIND_MESH;
}

struct TcpAgObj {
    ag: Mutex<Option<TcpAllgather>>,
}

// SAFETY: as above.
unsafe impl Object for TcpAgObj {
    const KIND: u8 = KIND_TCP_AG;
}

/// The caller's callback as an [`Allgather`].
struct CallbackAg {
    rank: u32,
    size: u32,
    f: unsafe extern "C" fn(*mut c_void, *const c_void, usize, *mut c_void) -> c_int,
    ctx: *mut c_void,
    /// The status the callback returned, passed on as the build's.
    failed: Option<rdd_status>,
}

impl Allgather for CallbackAg {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> Result<()> {
        // SAFETY: the caller's contract for `f` and `ctx`; `mine` and
        // `all` are live buffers of the lengths the callback is told.
        let r = unsafe {
            (self.f)(
                self.ctx,
                mine.as_ptr().cast(),
                mine.len(),
                all.as_mut_ptr().cast(),
            )
        };
        if r == 0 {
            return Ok(());
        }
        let s = u32::try_from(r)
            .ok()
            .and_then(rdd_status::from_u32)
            .filter(|s| *s != rdd_status::Ok)
            .unwrap_or(rdd_status::ConnectFailed);
        self.failed = Some(s);
        Err(Error::ConnectFailed)
    }
}

/// The QPs as object-level handles.
struct HandleEndpoints {
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    qp: *const rdd_qp_init,
    attr: *const rdd_connect_attr,
    qps: Vec<usize>,
    /// A local refusal's own status (it may be a C-only one, such as
    /// `INVALID_HANDLE`, which has no `Error`).
    failed: Option<rdd_status>,
}

impl HandleEndpoints {
    fn check(&mut self, s: rdd_status) -> Result<()> {
        if s == rdd_status::Ok {
            return Ok(());
        }
        self.failed = Some(s);
        Err(Error::from_code(s as u32).unwrap_or(Error::InvalidAttribute))
    }
}

impl Endpoints for HandleEndpoints {
    fn create(&mut self, peers: &[u32]) -> Result<Vec<QpInfo>> {
        let mut infos = Vec::with_capacity(peers.len());
        for _ in peers {
            let mut q: *mut rdd_qp = ptr::null_mut();
            // SAFETY: `qp` is NULL or readable (rdd_mesh_create's
            // contract); `q` is a local.
            let s = unsafe { rdd_qp_create(self.pd, self.send_cq, self.recv_cq, self.qp, &mut q) };
            self.check(s)?;
            self.qps.push(h(q));
            let mut i = rdd_qp_info::default();
            // SAFETY: `i` is a local.
            let s = unsafe { rdd_qp_query_info(q, &mut i) };
            self.check(s)?;
            infos.push(QpInfo {
                qpn: i.qpn,
                psn: i.psn,
                lid: i.lid,
                gid: i.gid,
                mtu: i.mtu,
            });
        }
        Ok(infos)
    }

    fn connect(&mut self, idx: usize, remote: &QpInfo) -> Result<()> {
        let r = rdd_qp_info {
            qpn: remote.qpn,
            psn: remote.psn,
            lid: remote.lid,
            reserved: 0,
            gid: remote.gid,
            mtu: remote.mtu,
        };
        // SAFETY: `r` is a local; `attr` is NULL or readable (contract).
        let s = unsafe { rdd_qp_connect(as_handle(self.qps[idx]), &r, self.attr) };
        self.check(s)
    }

    fn clear(&mut self) {
        for q in self.qps.drain(..) {
            let _ = rdd_qp_destroy(as_handle(q));
        }
    }
}

/// Builds a mesh of connected RC QPs among `init->size` ranks through
/// `fn(ctx, ...)`, called the same way on every rank: one QP per peer on
/// `pd`, completing on `send_cq` and `recv_cq` (may be the same; deep
/// enough for all of them, `rdd_device_cq_depth_for`), each connected to
/// its peer's QP towards this rank, with the regions in `init->mrs`
/// published to every peer. The protocol, the record format and the
/// checks are in docs/architecture.md ("Bootstrap").
///
/// On success `*out` is the mesh; on any error nothing the call made is
/// left (every QP it created is destroyed, on every rank), `*out` is not
/// written, and every rank reports an error:
/// - `NULL_PARAMETER` (`init`, `fn`, `out`, or `init->peers` / `init->mrs`
///   NULL with a non-zero count) and `INVALID_ARGUMENT` (`init->rank`
///   not below `init->size`): returned before `fn` is called at all, so
///   the other ranks' calls of their allgather fail as it fails when a
///   rank never takes part;
/// - `INVALID_ATTRIBUTE`: a peer list that is not distinct, in range and
///   without this rank, more than `RDD_MESH_MAX_MRS` regions, or QP
///   capacities the device refuses; `INVALID_HANDLE` for a bad `pd`, CQ
///   or region; what `rdd_qp_create` and `rdd_qp_connect` return: the
///   local rank's status, while the other ranks get `CONNECT_FAILED`;
/// - `PROTOCOL_ERROR`: a rank's message is not well formed (magic,
///   version, checksum, a rank field that is not its sender's slot, as a
///   duplicate rank gives, another size, counts that disagree with the
///   length, a QP number or PSN wider than 24 bits), or a rank is listed
///   by a peer it does not list;
/// - `CONNECT_FAILED`: another rank failed locally, or `fn` returned a
///   value that is not an `rdd_status`; an `rdd_status` value `fn`
///   returns (`TIMEOUT` from `rdd_tcp_allgather`, ...) is the status.
///
/// # Safety
/// `init` is valid for reads of one `rdd_mesh_init`, whose `qp` and
/// `attr` are NULL or readable and whose `peers` and `mrs` are readable
/// for their counts; `fn` is safe to call with `ctx` and buffers of the
/// lengths it is given; `out` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mesh_create(
    pd: *mut rdd_pd,
    send_cq: *mut rdd_cq,
    recv_cq: *mut rdd_cq,
    init: *const rdd_mesh_init,
    r#fn: rdd_allgather_fn,
    ctx: *mut c_void,
    out: *mut *mut rdd_mesh,
) -> rdd_status {
    ffi_boundary!({
        non_null!(init, out);
        let Some(f) = r#fn else {
            return rdd_status::NullParameter;
        };
        // SAFETY: non-NULL and readable (caller contract).
        let init = unsafe { init.read_unaligned() };
        if (init.peers.is_null() && init.n_peers != 0) || (init.mrs.is_null() && init.n_mrs != 0) {
            return rdd_status::NullParameter;
        }
        if init.rank >= init.size {
            return rdd_status::InvalidArgument;
        }
        let peers: Option<Vec<u32>> = (!init.peers.is_null()).then(|| {
            // SAFETY: readable for `n_peers` entries (caller contract).
            (0..init.n_peers)
                .map(|i| unsafe { init.peers.add(i).read_unaligned() })
                .collect()
        });
        let mut ep = HandleEndpoints {
            pd,
            send_cq,
            recv_cq,
            qp: init.qp,
            attr: init.attr,
            qps: Vec::new(),
            failed: None,
        };
        // The published regions, read through their handles (a bad one
        // is this rank's failure, announced to the others like any).
        let mut mrs = Vec::new();
        let mut mr_status = rdd_status::Ok;
        for i in 0..init.n_mrs.min(RDD_MESH_MAX_MRS + 1) {
            // SAFETY: readable for `n_mrs` entries (caller contract).
            let m = unsafe { init.mrs.add(i).read_unaligned() };
            let (mut a, mut l, mut k) = (ptr::null_mut(), 0usize, 0u32);
            // SAFETY: locals.
            let s = unsafe {
                let s = rdd_mr_addr(m, &mut a);
                if s != rdd_status::Ok {
                    s
                } else if rdd_mr_len(m, &mut l) != rdd_status::Ok {
                    rdd_status::InvalidHandle
                } else {
                    rdd_mr_rkey(m, &mut k)
                }
            };
            if s != rdd_status::Ok {
                mr_status = s;
                break;
            }
            mrs.push(RemoteMr {
                addr: a as u64,
                len: l as u64,
                rkey: k,
            });
        }
        let mut ag = CallbackAg {
            rank: init.rank,
            size: init.size,
            f,
            ctx,
            failed: None,
        };
        let r = if mr_status != rdd_status::Ok {
            ep.failed = Some(mr_status);
            let mut bad = FailFirst(
                &mut ep,
                Error::from_code(mr_status as u32).unwrap_or(Error::NoSuchObject),
            );
            exchange(&mut ag, peers.as_deref(), &mrs, &mut bad)
        } else {
            exchange(&mut ag, peers.as_deref(), &mrs, &mut ep)
        };
        let (ranks, peer_mrs) = match r {
            Ok(v) => v,
            Err(e) => return ag.failed.or(ep.failed).unwrap_or(e.into()),
        };
        let obj = Box::new(MeshObj {
            size: init.size,
            peers: ranks
                .into_iter()
                .zip(core::mem::take(&mut ep.qps))
                .zip(peer_mrs)
                .map(|((rank, qp), mrs)| MeshPeerObj { rank, qp, mrs })
                .collect(),
        });
        // On failure the object is dropped, destroying its QPs (the
        // others keep theirs: a local shortage, reported as such).
        let handle = try_status!(insert(obj));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Endpoints that refuse at creation (a bad published region): the
/// refusal is announced in the first round like any local failure.
struct FailFirst<'a>(&'a mut HandleEndpoints, Error);

impl Endpoints for FailFirst<'_> {
    fn create(&mut self, _: &[u32]) -> Result<Vec<QpInfo>> {
        Err(self.1)
    }
    fn connect(&mut self, idx: usize, remote: &QpInfo) -> Result<()> {
        self.0.connect(idx, remote)
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Destroys a mesh and every QP in it (as `rdd_qp_destroy` does: their
/// CQs are used by the call; QPs already destroyed with `rdd_qp_destroy`
/// are skipped). All or nothing: `RESOURCE_BUSY` if another call is using
/// the mesh, one of its QPs or one of their CQs (a poll on another
/// thread), and then nothing is destroyed; call again once it is done.
/// `NULL_PARAMETER`, `INVALID_HANDLE`.
#[no_mangle]
pub extern "C" fn rdd_mesh_destroy(mesh: *mut rdd_mesh) -> rdd_status {
    ffi_boundary!({
        non_null!(mesh);
        let mut m = try_status!(excl::<MeshObj>(h(mesh)));
        let qps: Vec<usize> = m.peers.iter().map(|p| p.qp).collect();
        try_status!(destroy_all(&qps));
        // Destroyed: the drop must not try again.
        m.peers.clear();
        m.destroy();
        rdd_status::Ok
    })
}

/// The number of peers in the mesh (`*out_n`; their ranks, in the order
/// they were listed, by `rdd_mesh_peer_rank`) and the mesh's size
/// (`*out_size`, may be NULL). `NULL_PARAMETER`, `INVALID_HANDLE`.
///
/// # Safety
/// `out_n` is valid for a write; `out_size` is NULL or valid for one.
#[no_mangle]
pub unsafe extern "C" fn rdd_mesh_peers(
    mesh: *const rdd_mesh,
    out_n: *mut usize,
    out_size: *mut u32,
) -> rdd_status {
    ffi_boundary!({
        non_null!(mesh, out_n);
        let m = try_status!(shared::<MeshObj>(h(mesh)));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_n, m.peers.len()) };
        if !out_size.is_null() {
            // SAFETY: as above.
            unsafe { put(out_size, m.size) };
        }
        rdd_status::Ok
    })
}

/// The rank of the mesh's `i`-th peer. `NULL_PARAMETER`,
/// `INVALID_HANDLE`, `INVALID_ARGUMENT` (`i` not below the peer count).
///
/// # Safety
/// `out_rank` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rdd_mesh_peer_rank(
    mesh: *const rdd_mesh,
    i: usize,
    out_rank: *mut u32,
) -> rdd_status {
    ffi_boundary!({
        non_null!(mesh, out_rank);
        let m = try_status!(shared::<MeshObj>(h(mesh)));
        let Some(p) = m.peers.get(i) else {
            return rdd_status::InvalidArgument;
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_rank, p.rank) };
        rdd_status::Ok
    })
}

/// The QP connected to peer `rank` (an `rdd_qp` handle owned by the
/// mesh: post and poll with it, never destroy it). `NULL_PARAMETER`,
/// `INVALID_HANDLE`, `NO_SUCH_OBJECT` (`rank` is not a peer).
///
/// # Safety
/// `out_qp` is valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_mesh_peer_qp(
    mesh: *const rdd_mesh,
    rank: u32,
    out_qp: *mut *mut rdd_qp,
) -> rdd_status {
    ffi_boundary!({
        non_null!(mesh, out_qp);
        let m = try_status!(shared::<MeshObj>(h(mesh)));
        let Some(p) = m.peers.iter().find(|p| p.rank == rank) else {
            return rdd_status::NoSuchObject;
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out_qp, as_handle(p.qp)) };
        rdd_status::Ok
    })
}

/// The `i`-th region peer `rank` published (`*out`), and how many it
/// published (`*out_count`, may be NULL). `NULL_PARAMETER`,
/// `INVALID_HANDLE`, `NO_SUCH_OBJECT` (`rank` is not a peer),
/// `INVALID_ARGUMENT` (`i` not below the count; `*out_count` is still
/// written, so `i` = 0 with a NULL-safe `out` is how to ask the count:
/// `out` may be NULL then).
///
/// # Safety
/// `out` is NULL or valid for a write of one `rdd_remote_mr`;
/// `out_count` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rdd_mesh_peer_mr(
    mesh: *const rdd_mesh,
    rank: u32,
    i: usize,
    out: *mut rdd_remote_mr,
    out_count: *mut usize,
) -> rdd_status {
    ffi_boundary!({
        non_null!(mesh);
        let m = try_status!(shared::<MeshObj>(h(mesh)));
        let Some(p) = m.peers.iter().find(|p| p.rank == rank) else {
            return rdd_status::NoSuchObject;
        };
        if !out_count.is_null() {
            // SAFETY: writable (caller contract).
            unsafe { put(out_count, p.mrs.len()) };
        }
        if out.is_null() {
            return if out_count.is_null() {
                rdd_status::NullParameter
            } else {
                rdd_status::Ok
            };
        }
        let Some(r) = p.mrs.get(i) else {
            return rdd_status::InvalidArgument;
        };
        let v = rdd_remote_mr {
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
            reserved: 0,
        };
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, v) };
        rdd_status::Ok
    })
}

/// Joins the TCP rendezvous at `host`:`port` as `rank` of `size`: rank 0
/// listens there (`host` is the address to bind, e.g. "0.0.0.0"), the
/// others connect to it, retrying while rank 0 is not up yet. Returns
/// once every rank joined, or within about `timeout_ms`:
/// `NULL_PARAMETER` (`host`, `out`), `INVALID_ARGUMENT` (`host` not
/// UTF-8, `timeout_ms` 0), `INVALID_ATTRIBUTE` (`rank >= size`, a host
/// that resolves to nothing), `TIMEOUT` (a rank did not join in time, or
/// rank 0 did not answer), `PROTOCOL_ERROR` (rank 0: a duplicate rank,
/// one out of range, another size, or bytes that are not a join; the
/// other ranks hear rank 0's status), `CONNECT_FAILED` (rank 0 cannot
/// bind, or went away).
///
/// Pass `rdd_tcp_allgather` as the `fn` of `rdd_mesh_create` and the
/// handle as its `ctx`; each of its gathers is bounded by `timeout_ms`
/// too, and a rank that vanishes is an error at once.
///
/// # Safety
/// `host` is NULL or a NUL-terminated string; `out` is valid for a write
/// of one pointer.
#[no_mangle]
pub unsafe extern "C" fn rdd_tcp_allgather_create(
    rank: u32,
    size: u32,
    host: *const c_char,
    port: u16,
    timeout_ms: u32,
    out: *mut *mut rdd_tcp_rendezvous,
) -> rdd_status {
    ffi_boundary!({
        non_null!(host, out);
        // SAFETY: NUL-terminated (caller contract).
        let Ok(host) = unsafe { CStr::from_ptr(host) }.to_str() else {
            return rdd_status::InvalidArgument;
        };
        if timeout_ms == 0 {
            return rdd_status::InvalidArgument;
        }
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let t = Duration::from_millis(u64::from(timeout_ms));
        let ag = match TcpAllgather::new(rank, size, &addr, t) {
            Ok(a) => a,
            Err(e) => return e.into(),
        };
        let handle = try_status!(insert(Box::new(TcpAgObj {
            ag: Mutex::new(Some(ag)),
        })));
        // SAFETY: non-NULL (checked), writable (caller contract).
        unsafe { put(out, as_handle(handle)) };
        rdd_status::Ok
    })
}

/// Leaves the rendezvous (closing its connections: ranks still gathering
/// through it see an error at once). `NULL_PARAMETER`, `INVALID_HANDLE`,
/// `RESOURCE_BUSY` (a gather is running on it).
#[no_mangle]
pub extern "C" fn rdd_tcp_allgather_destroy(t: *mut rdd_tcp_rendezvous) -> rdd_status {
    ffi_boundary!({
        non_null!(t);
        let o = try_status!(excl::<TcpAgObj>(h(t)));
        o.destroy();
        rdd_status::Ok
    })
}

/// The TCP rendezvous as an `rdd_allgather_fn`: `ctx` is an
/// `rdd_tcp_rendezvous *`. Returns 0, or an `rdd_status` value:
/// `NULL_PARAMETER`, `INVALID_HANDLE`, `RESOURCE_BUSY` (another gather
/// runs on it), `TIMEOUT`, `CONNECT_FAILED` (a rank went away; the
/// rendezvous is then unusable), `PROTOCOL_ERROR` (the ranks' lengths
/// disagree).
///
/// # Safety
/// `mine` is readable for `len` bytes and `all` writable for `len` times
/// the rendezvous' size.
#[no_mangle]
pub unsafe extern "C" fn rdd_tcp_allgather(
    ctx: *mut c_void,
    mine: *const c_void,
    len: usize,
    all: *mut c_void,
) -> c_int {
    let s: rdd_status = ffi_boundary!({
        non_null!(ctx, mine, all);
        let o = try_status!(shared::<TcpAgObj>(h(ctx)));
        let Ok(mut g) = o.ag.try_lock() else {
            return rdd_status::ResourceBusy;
        };
        let Some(ag) = g.as_mut() else {
            return rdd_status::ConnectFailed;
        };
        let Some(total) = len.checked_mul(ag.size() as usize) else {
            return rdd_status::InvalidArgument;
        };
        // SAFETY: readable/writable for these lengths (caller contract);
        // the two buffers are the caller's and distinct.
        let (m, a) = unsafe {
            (
                core::slice::from_raw_parts(mine.cast::<u8>(), len),
                core::slice::from_raw_parts_mut(all.cast::<u8>(), total),
            )
        };
        match ag.allgather(m, a) {
            Ok(()) => rdd_status::Ok,
            Err(e) => {
                // Unusable after an error: later calls fail at once.
                *g = None;
                e.into()
            }
        }
    });
    s as u32 as c_int
}
