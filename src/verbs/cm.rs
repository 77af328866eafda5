//! Connection setup through rdma_cm, with the crate's own QP.
//!
//! librdmacm never creates or modifies a QP here: the QP comes from
//! [`crate::api::Pd::create_qp`] on a [`VerbsDevice`] (whose context is
//! librdmacm's own, so the CM and the QP agree on the device), its number
//! goes to the peer in the connection parameters, and the state changes
//! use the attributes `rdma_init_qp_attr` reports (PSNs, path, MTU and
//! the negotiated READ/atomic depths come from the CM):
//!
//! * **InfiniBand/RoCE, active side:** resolve address and route, INIT, run
//!   the caller's `before` hook (post receives), `rdma_connect`; on
//!   `CONNECT_RESPONSE`, INIT (again, now with the remote-access flags the
//!   CM grants), RTR, RTS, then `rdma_establish` (sends the RTU).
//! * **InfiniBand/RoCE, passive side:** on `CONNECT_REQUEST`, INIT, RTR,
//!   RTS, `before`, `rdma_accept`, then wait for `ESTABLISHED`.
//! * **iWARP:** only INIT from user space; the kernel's iWARP CM moves the
//!   QP to RTS itself when the connection is up (a user RTS is refused
//!   by siw), and the active side sees `ESTABLISHED` directly.
//!
//! Every wait is bounded by [`CmOptions::timeout`]. Rejections, unreachable
//! peers, address/route/connect errors are [`Error::ConnectFailed`]
//! (transient: retrying the whole setup may succeed; siw has been seen to
//! fail a first connect with `CONNECT_ERROR -22`); running out of time is
//! [`Error::Timeout`]. Which event it was, with its status (a rejection's
//! reason), is [`last_failure`]: [`Error`] is a plain code.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use std::vec::Vec;

use core::ffi::CStr;

use rdma_sys as sys;

use super::{check, fail, fail_errno, DeviceCaps, VerbsDevice};
use crate::api::{Backend, Qp, Transport};
use crate::completion::QpState;
use crate::error::{Error, Result};

extern "C" {
    /// librdmacm: moves an id's events to another channel (rdma-sys does
    /// not bind it).
    fn rdma_migrate_id(id: *mut sys::rdma_cm_id, channel: *mut sys::rdma_event_channel) -> i32;
}

/// Connection parameters.
#[derive(Clone, Debug)]
pub struct CmOptions {
    /// Bound on the whole setup (resolution, handshake).
    pub timeout: Duration,
    /// Bytes for the peer (IB/RoCE REQ: at most 56; the receiver may see
    /// zero padding after them, so carry a length if it matters).
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics the peer may have outstanding on this QP.
    pub responder_resources: u8,
    /// RDMA READs/atomics this QP may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry_count: u8,
}

impl Default for CmOptions {
    fn default() -> Self {
        CmOptions {
            timeout: Duration::from_secs(10),
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

/// An event channel and its ids, destroyed on drop.
struct Channel(*mut sys::rdma_event_channel);

impl Channel {
    fn new() -> Result<Channel> {
        // SAFETY: no preconditions.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(fail_errno("rdma_create_event_channel"));
        }
        Ok(Channel(ch))
    }

    fn fd(&self) -> i32 {
        // SAFETY: live channel.
        unsafe { (*self.0).fd }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on it was destroyed first (field order / explicit
        // drops in the owners below).
        unsafe { sys::rdma_destroy_event_channel(self.0) };
    }
}

/// What this module keeps of an event (copied before it is acked).
struct Event {
    kind: u32,
    status: i32,
    id: *mut sys::rdma_cm_id,
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
}

fn event_name(k: u32) -> &'static str {
    use sys::rdma_cm_event_type as E;
    match k {
        E::RDMA_CM_EVENT_ADDR_ERROR => "rdma_cm: address error",
        E::RDMA_CM_EVENT_ROUTE_ERROR => "rdma_cm: route error",
        E::RDMA_CM_EVENT_CONNECT_ERROR => "rdma_cm: connect error",
        E::RDMA_CM_EVENT_UNREACHABLE => "rdma_cm: peer unreachable",
        E::RDMA_CM_EVENT_REJECTED => "rdma_cm: rejected",
        E::RDMA_CM_EVENT_DISCONNECTED => "rdma_cm: disconnected",
        E::RDMA_CM_EVENT_DEVICE_REMOVAL => "rdma_cm: device removed",
        _ => "rdma_cm: unexpected event",
    }
}

/// The rdma_cm event that ended a connection setup (or a connection)
/// with [`Error::ConnectFailed`], as librdmacm reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmFailure {
    /// The event (`rdma_cm_event_type`: 8 is `RDMA_CM_EVENT_REJECTED`).
    pub event: u32,
    /// Its `status`: a negative errno, or for a rejection the transport's
    /// reject reason (InfiniBand/RoCE: the reason of the IB CM REJ
    /// message), per rdma_get_cm_event(3).
    pub status: i32,
}

impl CmFailure {
    /// librdmacm's name of the event, `"RDMA_CM_EVENT_REJECTED"` etc.
    pub fn event_name(&self) -> &'static str {
        // SAFETY: librdmacm returns a static string for every value
        // (unknown ones included).
        let p = unsafe { sys::rdma_event_str(self.event) };
        if p.is_null() {
            return "RDMA_CM_EVENT_?";
        }
        // SAFETY: a NUL-terminated static string (above).
        unsafe { CStr::from_ptr(p) }
            .to_str()
            .unwrap_or("RDMA_CM_EVENT_?")
    }

    /// The peer's reject reason, for a rejection that carries one
    /// (InfiniBand/RoCE; an iWARP rejection carries a negative errno).
    pub fn reject_reason(&self) -> Option<u32> {
        (self.event == sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED && self.status > 0)
            .then_some(self.status as u32)
    }

    /// The errno the status carries, if it is one.
    pub fn errno(&self) -> Option<i32> {
        (self.status < 0).then_some(-self.status)
    }
}

/// What the common IB CM reject reasons mean (IBA vol. 1 §12.6.7.2, the
/// REJ message's reason table; the ones rdma_cm peers send in practice).
fn reject_reason_text(r: u32) -> &'static str {
    match r {
        1 => "no QP",
        3 => "no resources",
        4 => "timeout",
        5 => "unsupported request",
        8 => "invalid service ID: nobody listens on that port",
        10 => "stale connection",
        28 => "consumer defined: the peer's application rejected",
        _ => "see the IB CM REJ reasons",
    }
}

impl core::fmt::Display for CmFailure {
    /// `RDMA_CM_EVENT_REJECTED, reason 8 (invalid service ID: ...)`, or
    /// `..., error -111 (Connection refused ...)`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.event_name())?;
        if let Some(r) = self.reject_reason() {
            write!(f, ", reason {r} ({})", reject_reason_text(r))
        } else if let Some(e) = self.errno() {
            write!(
                f,
                ", error {} ({})",
                self.status,
                std::io::Error::from_raw_os_error(e)
            )
        } else if self.status != 0 {
            write!(f, ", status {}", self.status)
        } else {
            Ok(())
        }
    }
}

std::thread_local! {
    static LAST_FAILURE: core::cell::Cell<Option<CmFailure>> = const { core::cell::Cell::new(None) };
}

/// The rdma_cm event behind the last [`Error::ConnectFailed`] an event
/// caused on this thread (`None` if none has). Like
/// [`super::last_error`], which names it too (`"rdma_cm: rejected"`), it
/// is not cleared by later successes.
pub fn last_failure() -> Option<CmFailure> {
    LAST_FAILURE.with(|l| l.get())
}

/// Waits for the next event on `ch` until `deadline`; acks it and returns
/// a copy. Failure events become [`Error::ConnectFailed`].
fn next_event(ch: &Channel, deadline: Instant, want: &[u32]) -> Result<Event> {
    use sys::rdma_cm_event_type as E;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        let mut pfd = libc::pollfd {
            fd: ch.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(fail("poll", e.raw_os_error().unwrap_or(0)));
        }
        if r == 0 {
            continue;
        }
        let mut ev: *mut sys::rdma_cm_event = core::ptr::null_mut();
        // SAFETY: live channel; `ev` is a valid out-pointer.
        check("rdma_get_cm_event", unsafe {
            sys::rdma_get_cm_event(ch.0, &mut ev)
        })?;
        // SAFETY: a live event until acked below; the union is read as
        // `conn`, which is what every connection event carries.
        let copy = unsafe {
            let e = &*ev;
            let conn = e.param.conn;
            let private = if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                core::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    usize::from(conn.private_data_len),
                )
                .to_vec()
            };
            Event {
                kind: e.event,
                status: e.status,
                id: e.id,
                private,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
            }
        };
        // SAFETY: the event from rdma_get_cm_event, acked once.
        unsafe { sys::rdma_ack_cm_event(ev) };
        if want.contains(&copy.kind) {
            return Ok(copy);
        }
        match copy.kind {
            E::RDMA_CM_EVENT_TIMEWAIT_EXIT | E::RDMA_CM_EVENT_ADDR_CHANGE => continue,
            k => {
                // Error events carry a negative errno; a rejection carries
                // the peer's reject reason, which is not an errno.
                let errno = if copy.status < 0 { -copy.status } else { 0 };
                let _ = fail(event_name(k), errno);
                LAST_FAILURE.with(|l| {
                    l.set(Some(CmFailure {
                        event: k,
                        status: copy.status,
                    }))
                });
                return Err(Error::ConnectFailed);
            }
        }
    }
}

/// `struct sockaddr` storage for an address.
fn sockaddr(a: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and
            // suitably aligned.
            unsafe { core::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { core::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// Applies `rdma_init_qp_attr`'s attributes for `state` to the QP.
fn cm_modify(
    id: *mut sys::rdma_cm_id,
    qp: &mut Qp<VerbsDevice>,
    state: QpState,
    depth: Option<(u8, u8)>,
) -> Result<()> {
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut attr: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
    attr.qp_state = match state {
        QpState::Init => sys::ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => sys::ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => sys::ibv_qp_state::IBV_QPS_RTS,
        _ => return Err(Error::InvalidAttribute),
    };
    let mut mask = 0i32;
    // SAFETY: live id; valid out-pointers.
    check("rdma_init_qp_attr", unsafe {
        sys::rdma_init_qp_attr(id, &mut attr, &mut mask)
    })?;
    if let Some((dest_rd, rd)) = depth {
        // Cap the negotiated READ/atomic depths by what was asked for.
        if state == QpState::Rtr && dest_rd != 0 {
            attr.max_dest_rd_atomic = attr.max_dest_rd_atomic.min(dest_rd).max(1);
        }
        if state == QpState::Rts && rd != 0 {
            attr.max_rd_atomic = attr.max_rd_atomic.min(rd).max(1);
        }
    }
    qp.backend().modify_qp_attr(qp.qpn(), &mut attr, mask)?;
    qp.set_known_state(state);
    Ok(())
}

/// An established rdma_cm connection. Dropping it disconnects (the QP is
/// moved to ERROR first, so outstanding work is flushed, not lost).
pub struct CmConnection {
    id: *mut sys::rdma_cm_id,
    ch: Channel,
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    disconnected: bool,
}

// SAFETY: the id and channel are used only through `&mut self`/drop, and
// librdmacm ids may be used from any thread.
unsafe impl Send for CmConnection {}

impl CmConnection {
    /// The peer's private data (IB/RoCE pads it to the message size).
    pub fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// Negotiated (responder resources, initiator depth) as the CM
    /// reported them.
    pub fn depths(&self) -> (u8, u8) {
        (self.responder_resources, self.initiator_depth)
    }

    /// Waits up to `timeout` for the peer to disconnect.
    pub fn wait_disconnect(&mut self, timeout: Duration) -> Result<()> {
        if self.disconnected {
            return Ok(());
        }
        next_event(
            &self.ch,
            Instant::now() + timeout,
            &[sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED],
        )?;
        self.disconnected = true;
        Ok(())
    }

    /// Moves `qp` to ERROR (flushing its work) and disconnects.
    pub fn disconnect(&mut self, qp: &mut Qp<VerbsDevice>) -> Result<()> {
        let _ = qp.modify(&crate::attr::QpModify::to(QpState::Error));
        // SAFETY: live id.
        let r = unsafe { sys::rdma_disconnect(self.id) };
        self.disconnected = true;
        check("rdma_disconnect", r)
    }
}

impl Drop for CmConnection {
    fn drop(&mut self) {
        if !self.disconnected {
            // SAFETY: live id; errors (peer already gone) are irrelevant.
            unsafe { sys::rdma_disconnect(self.id) };
        }
        // SAFETY: every event of this id was acked in `next_event`.
        unsafe { sys::rdma_destroy_id(self.id) };
        // The channel drops after this (field drop).
    }
}

/// The connection parameters for `rdma_connect` / `rdma_accept`. The QP's
/// transport retry count comes from `retry_count`: on a driver that
/// retries forever at 7 it is asked for 6 (`DeviceCaps::retry7_unbounded`).
fn conn_param(qpn: u32, o: &CmOptions, caps: &DeviceCaps) -> Result<sys::rdma_conn_param> {
    if o.private_data.len() > 196 {
        return Err(Error::InvalidAttribute);
    }
    Ok(sys::rdma_conn_param {
        private_data: if o.private_data.is_empty() {
            core::ptr::null()
        } else {
            o.private_data.as_ptr().cast()
        },
        private_data_len: o.private_data.len() as u8,
        responder_resources: o.responder_resources,
        initiator_depth: o.initiator_depth,
        flow_control: 0,
        retry_count: o.retry_count.min(caps.max_retry_cnt()),
        rnr_retry_count: o.rnr_retry_count.min(7),
        srq: 0,
        qp_num: qpn,
    })
}

fn same_device(id: *mut sys::rdma_cm_id, qp: &Qp<VerbsDevice>) -> Result<()> {
    // SAFETY: live id; `verbs` is set once the id is bound to a device.
    let ctx = unsafe { (*id).verbs };
    // The same device, not necessarily the same context: the rxe/siw
    // direct path keeps a context of its own (rdma_cm only needs the QP's
    // number and our own state changes).
    // SAFETY: both contexts are live; their devices' names are
    // NUL-terminated.
    let same = ctx == qp.backend().context()
        || (!ctx.is_null()
            && unsafe {
                CStr::from_ptr((*(*ctx).device).name.as_ptr())
                    == CStr::from_ptr((*(*qp.backend().context()).device).name.as_ptr())
            });
    if !same {
        // The address belongs to another RDMA device than the QP's.
        return Err(Error::InvalidAttribute);
    }
    Ok(())
}

/// Connects `qp` (in RESET) to the rdma_cm listener at `dst`. `before`
/// runs once the QP is in INIT and before the peer can send: post the
/// receives there.
pub fn connect(
    qp: &mut Qp<VerbsDevice>,
    dst: SocketAddr,
    src: Option<SocketAddr>,
    opts: &CmOptions,
    before: impl FnOnce(&mut Qp<VerbsDevice>) -> Result<()>,
) -> Result<CmConnection> {
    use sys::rdma_cm_event_type as E;
    let deadline = Instant::now() + opts.timeout;
    let ch = Channel::new()?;
    let mut id: *mut sys::rdma_cm_id = core::ptr::null_mut();
    // SAFETY: live channel; valid out-pointer.
    check("rdma_create_id", unsafe {
        sys::rdma_create_id(
            ch.0,
            &mut id,
            core::ptr::null_mut(),
            sys::rdma_port_space::RDMA_PS_TCP,
        )
    })?;
    // From here the id must be destroyed on every path: wrap it now.
    let mut conn = CmConnection {
        id,
        ch,
        private: Vec::new(),
        responder_resources: 0,
        initiator_depth: 0,
        disconnected: true,
    };
    let ms = |d: Instant| {
        d.saturating_duration_since(Instant::now())
            .as_millis()
            .clamp(1, 60_000) as i32
    };
    let mut dst_ss = sockaddr(&dst);
    let mut src_ss = src.map(|s| sockaddr(&s));
    let src_ptr = src_ss.as_mut().map_or(core::ptr::null_mut(), |s| {
        (s as *mut libc::sockaddr_storage).cast()
    });
    // SAFETY: live id; addresses valid for the call.
    check("rdma_resolve_addr", unsafe {
        sys::rdma_resolve_addr(
            conn.id,
            src_ptr,
            (&mut dst_ss as *mut libc::sockaddr_storage).cast(),
            ms(deadline),
        )
    })?;
    next_event(&conn.ch, deadline, &[E::RDMA_CM_EVENT_ADDR_RESOLVED])?;
    // SAFETY: live id.
    check("rdma_resolve_route", unsafe {
        sys::rdma_resolve_route(conn.id, ms(deadline))
    })?;
    next_event(&conn.ch, deadline, &[E::RDMA_CM_EVENT_ROUTE_RESOLVED])?;
    same_device(conn.id, qp)?;
    let iwarp = qp.backend().port().transport == Transport::Iwarp;
    cm_modify(conn.id, qp, QpState::Init, None)?;
    before(qp)?;
    let mut p = conn_param(qp.qpn(), opts, &qp.backend().caps())?;
    // SAFETY: live id; `p` and its private data live for the call.
    check("rdma_connect", unsafe {
        sys::rdma_connect(conn.id, &mut p)
    })?;
    conn.disconnected = false;
    let ev = next_event(
        &conn.ch,
        deadline,
        &[
            E::RDMA_CM_EVENT_CONNECT_RESPONSE,
            E::RDMA_CM_EVENT_ESTABLISHED,
        ],
    )?;
    conn.private = ev.private;
    conn.responder_resources = ev.responder_resources;
    conn.initiator_depth = ev.initiator_depth;
    if ev.kind == E::RDMA_CM_EVENT_CONNECT_RESPONSE && !iwarp {
        let depth = Some((opts.responder_resources, opts.initiator_depth));
        cm_modify(conn.id, qp, QpState::Init, depth)?;
        cm_modify(conn.id, qp, QpState::Rtr, depth)?;
        cm_modify(conn.id, qp, QpState::Rts, depth)?;
        // SAFETY: live id; sends the RTU.
        check("rdma_establish", unsafe { sys::rdma_establish(conn.id) })?;
    } else {
        // iWARP: the kernel moved the QP to RTS.
        qp.set_known_state(QpState::Rts);
    }
    Ok(conn)
}

/// A listening rdma_cm id.
pub struct CmListener {
    id: *mut sys::rdma_cm_id,
    ch: Channel,
}

// SAFETY: as for CmConnection.
unsafe impl Send for CmListener {}
// SAFETY: `accept` (the only `&self` call that touches librdmacm besides
// `port`) reads events from the channel with librdmacm's thread-safe calls;
// concurrent accepts each get a different request.
unsafe impl Sync for CmListener {}

impl CmListener {
    /// Binds to `addr` (port 0: any) and listens.
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<CmListener> {
        let ch = Channel::new()?;
        let mut id: *mut sys::rdma_cm_id = core::ptr::null_mut();
        // SAFETY: live channel; valid out-pointer.
        check("rdma_create_id", unsafe {
            sys::rdma_create_id(
                ch.0,
                &mut id,
                core::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        })?;
        let l = CmListener { id, ch };
        let mut ss = sockaddr(&addr);
        // SAFETY: live id; address valid for the call.
        check("rdma_bind_addr", unsafe {
            sys::rdma_bind_addr(l.id, (&mut ss as *mut libc::sockaddr_storage).cast())
        })?;
        // SAFETY: live, bound id.
        check("rdma_listen", unsafe { sys::rdma_listen(l.id, backlog) })?;
        Ok(l)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        // SAFETY: live, bound id.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.id) })
    }

    /// Accepts one connection onto `qp` (in RESET). `before` runs once the
    /// QP can receive and before the peer can send: post receives there.
    /// Returns the connection; the peer's private data is in it.
    pub fn accept(
        &self,
        qp: &mut Qp<VerbsDevice>,
        opts: &CmOptions,
        before: impl FnOnce(&mut Qp<VerbsDevice>) -> Result<()>,
    ) -> Result<CmConnection> {
        use sys::rdma_cm_event_type as E;
        let deadline = Instant::now() + opts.timeout;
        let req = next_event(&self.ch, deadline, &[E::RDMA_CM_EVENT_CONNECT_REQUEST])?;
        // Give the new id its own channel (its events were acked above).
        let ch = Channel::new()?;
        // SAFETY: the request's new id, all its events acked; live channel.
        let r = unsafe { rdma_migrate_id(req.id, ch.0) };
        if r != 0 {
            let e = fail_errno("rdma_migrate_id");
            // SAFETY: the new id, which nobody else owns.
            unsafe {
                sys::rdma_reject(req.id, core::ptr::null(), 0);
                sys::rdma_destroy_id(req.id);
            }
            return Err(e);
        }
        let mut conn = CmConnection {
            id: req.id,
            ch,
            private: req.private,
            // From the passive side: what the active side asked for.
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            disconnected: true,
        };
        let setup = (|| {
            same_device(conn.id, qp)?;
            let iwarp = qp.backend().port().transport == Transport::Iwarp;
            let depth = Some((opts.responder_resources, opts.initiator_depth));
            cm_modify(conn.id, qp, QpState::Init, depth)?;
            if !iwarp {
                cm_modify(conn.id, qp, QpState::Rtr, depth)?;
                cm_modify(conn.id, qp, QpState::Rts, depth)?;
            }
            before(qp)?;
            let mut o = opts.clone();
            o.responder_resources = o.responder_resources.min(conn.initiator_depth.max(1));
            o.initiator_depth = o.initiator_depth.min(conn.responder_resources);
            let mut p = conn_param(qp.qpn(), &o, &qp.backend().caps())?;
            // SAFETY: live id; `p` lives for the call.
            check("rdma_accept", unsafe { sys::rdma_accept(conn.id, &mut p) })?;
            Ok::<_, Error>(iwarp)
        })();
        let iwarp = match setup {
            Ok(i) => i,
            Err(e) => {
                // SAFETY: live id; tells the peer instead of leaving it to
                // time out.
                unsafe { sys::rdma_reject(conn.id, core::ptr::null(), 0) };
                return Err(e);
            }
        };
        conn.disconnected = false;
        next_event(&conn.ch, deadline, &[E::RDMA_CM_EVENT_ESTABLISHED])?;
        if iwarp {
            qp.set_known_state(QpState::Rts);
        }
        Ok(conn)
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        // SAFETY: live id, every event acked.
        unsafe { sys::rdma_destroy_id(self.id) };
    }
}

/// Retries `f` (a whole connection setup) up to `attempts` times while it
/// fails with [`Error::ConnectFailed`], pausing `pause` between tries.
pub fn retry<T>(attempts: u32, pause: Duration, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut n = 0;
    loop {
        n += 1;
        match f() {
            Err(Error::ConnectFailed) if n < attempts => std::thread::sleep(pause),
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::rdma_cm_event_type as E;

    #[test]
    fn failures_name_the_event_and_the_reject_reason() {
        let ib = CmFailure {
            event: E::RDMA_CM_EVENT_REJECTED,
            status: 8,
        };
        assert_eq!(ib.reject_reason(), Some(8));
        assert_eq!(ib.errno(), None);
        let s = std::format!("{ib}");
        assert!(
            s.starts_with("RDMA_CM_EVENT_REJECTED, reason 8 (invalid service ID"),
            "{s}"
        );
        let iw = CmFailure {
            event: E::RDMA_CM_EVENT_REJECTED,
            status: -libc::ECONNREFUSED,
        };
        assert_eq!(iw.reject_reason(), None);
        assert_eq!(iw.errno(), Some(libc::ECONNREFUSED));
        let s = std::format!("{iw}");
        assert!(
            s.starts_with("RDMA_CM_EVENT_REJECTED, error -111 (Connection refused"),
            "{s}"
        );
        let unreachable = CmFailure {
            event: E::RDMA_CM_EVENT_UNREACHABLE,
            status: -libc::ETIMEDOUT,
        };
        assert!(std::format!("{unreachable}").starts_with("RDMA_CM_EVENT_UNREACHABLE, error -110"));
        assert_eq!(
            std::format!(
                "{}",
                CmFailure {
                    event: E::RDMA_CM_EVENT_DISCONNECTED,
                    status: 0
                }
            ),
            "RDMA_CM_EVENT_DISCONNECTED"
        );
        assert_eq!(last_failure(), None, "nothing failed on this thread");
    }
}
