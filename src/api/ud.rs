//! Unreliable datagrams in the safe API: address handles ([`Ah`]), UD QP
//! creation ([`Pd::create_ud_qp`]), making one ready with its Q_Key
//! ([`Qp::ready_ud`]) and posting a datagram ([`Qp::post_send_ud`])
//! (docs/spec/soft.md §3 for what the software device does with them).
//!
//! Receives are posted with [`Qp::post_recv`] as on RC, but every UD
//! receive buffer starts with a 40-byte GRH area
//! ([`crate::soft::GRH_BYTES`]): a datagram of `n` bytes needs a receive
//! of at least `40 + n` bytes, lands at offset 40, and completes with
//! `byte_len = n + 40`, `src_qp` = the sender's QP number and
//! [`crate::completion::wc_flags::GRH`] when the sender's address handle
//! had a global route (the 40 bytes then hold that GRH; otherwise they
//! are left as they were).

use std::sync::Arc;

use crate::attr::AddressVector;
use crate::error::{Error, Result};
use crate::provider::mlx5::{Mlx5Av, UdDest};
use crate::wr::{Payload, SendFlags, SendWr};

use super::device::{Pd, PdInner};
use super::qp::{Qp, QpPath};
use super::{Backend, Cq, DriverAh, QpInit, QpState};

/// A Q_Key for [`Qp::post_send_ud`] that means "this QP's own" (bit 31
/// set; IBA vol. 1 §10.2.4, docs/spec/mlx5.md §11).
pub const OWN_QKEY: u32 = 0x8000_0000;

/// What an address handle is made from (`struct ibv_ah_attr`): the port
/// to send from and the destination's address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhInit {
    /// Port to send from (1-based; 0 means the device's port).
    pub port_num: u8,
    /// Destination LID, SL, and with `is_global` the GRH fields: GID,
    /// source GID index, hop limit, traffic class, flow label.
    pub dest: AddressVector,
}

impl AhInit {
    /// The checks of [`Pd::create_ah`] that need no device call, for a
    /// device whose port is `port_num`: [`Error::InvalidAttribute`] for an
    /// SL above 15, a flow label wider than 20 bits or another port.
    pub fn check(&self, port_num: u8) -> Result<()> {
        let d = &self.dest;
        if d.sl > 15 || d.flow_label >> 20 != 0 {
            return Err(Error::InvalidAttribute);
        }
        if self.port_num != 0 && self.port_num != port_num {
            return Err(Error::InvalidAttribute);
        }
        Ok(())
    }
}

/// An address handle (`ibv_ah`): where UD sends go. It holds the mlx5
/// address vector every UD WQE to that address carries
/// (docs/spec/mlx5.md §3 "Datagram segment"). It can be used with any UD
/// QP of its protection domain.
///
/// On a backend whose UD QPs are driver-posted (the verbs fallback, rxe's
/// direct rings) the handle is the kernel's (`ibv_create_ah`, or our own
/// CREATE_AH on the rings, docs/spec/rxe.md §8), destroyed when this is
/// dropped (destroy it after the sends through it have completed: the
/// posted WQEs name it), and [`Ah::av`] is all zeros.
pub struct Ah<B: Backend> {
    pd: Arc<PdInner<B>>,
    av: Mlx5Av,
    global: bool,
    /// The provider's handle, on a driver backend.
    driver: Option<DriverAh>,
}

impl<B: Backend> Drop for Ah<B> {
    fn drop(&mut self) {
        if let Some(d) = self.driver {
            let _ = self.pd.b.destroy_driver_ah(d.handle);
        }
    }
}

impl<B: Backend> Ah<B> {
    /// The address vector this handle holds (zeros on a driver backend).
    pub fn av(&self) -> &Mlx5Av {
        &self.av
    }
    /// True if datagrams sent through it carry a GRH.
    pub fn is_global(&self) -> bool {
        self.global
    }
}

impl<B: Backend> Pd<B> {
    /// Creates an address handle. [`Error::InvalidAttribute`] for an SL
    /// above 15, a flow label wider than 20 bits, another port than the
    /// device's, or what the device refuses (the software device: a source
    /// GID index other than 0, its one GID); [`Error::Unsupported`] on a
    /// backend without UD (on the verbs backend UD is on the fallback data
    /// path of RoCE/InfiniBand devices and on rxe's direct rings: never on
    /// iWARP (siw), nor on the mlx5 core path).
    pub fn create_ah(&self, init: &AhInit) -> Result<Ah<B>> {
        let b = &self.inner.b;
        let d = &init.dest;
        init.check(b.port().port_num)?;
        let (av, driver) = match b.create_ah(self.inner.pd, d) {
            Ok(av) => (av, None),
            Err(Error::Unsupported) => {
                let port = if init.port_num == 0 {
                    b.port().port_num
                } else {
                    init.port_num
                };
                let h = b.create_driver_ah(self.inner.pd, port, d)?;
                (Mlx5Av::default(), Some(h))
            }
            Err(e) => return Err(e),
        };
        Ok(Ah {
            pd: Arc::clone(&self.inner),
            av,
            global: d.is_global,
            driver,
        })
    }

    /// Creates an unreliable-datagram QP (in RESET) whose sends complete
    /// on `send_cq` and receives on `recv_cq`; `init` as for
    /// [`Pd::create_qp`] (an SRQ included). Make it ready with
    /// [`Qp::ready_ud`]. [`Error::Unsupported`] on a backend without UD.
    pub fn create_ud_qp(&self, send_cq: &Cq<B>, recv_cq: &Cq<B>, init: &QpInit) -> Result<Qp<B>> {
        self.create_qp_of(send_cq, recv_cq, init, true)
    }
}

/// Bytes a WR sends.
fn wr_len(wr: &SendWr<'_>) -> u64 {
    match wr.payload {
        Payload::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
        Payload::Inline(p) => p.iter().map(|p| p.len() as u64).sum(),
    }
}

impl<B: Backend> Qp<B> {
    /// True for a QP made by [`Pd::create_ud_qp`].
    pub fn is_ud(&self) -> bool {
        self.ud_mtu != 0
    }

    /// Moves a UD QP from RESET to ready (RTS: it sends and receives) with
    /// Q_Key `qkey`; a UD QP has no peer, so nothing else is needed.
    /// Refused with nothing changed: an RC QP or a Q_Key with bit 31 set
    /// (a controlled key, IBA vol. 1 §10.2.4) is
    /// [`Error::InvalidAttribute`], a QP not in RESET
    /// [`Error::InvalidQpState`].
    pub fn ready_ud(&mut self, qkey: u32) -> Result<()> {
        if !self.is_ud() || qkey & OWN_QKEY != 0 {
            return Err(Error::InvalidAttribute);
        }
        if self.state() != QpState::Reset {
            return Err(Error::InvalidQpState);
        }
        self.pd.b.ready_ud(self.qpn, qkey)?;
        match &mut self.path {
            QpPath::Mlx5(q) => {
                q.sq.set_state(QpState::Rts);
                q.rq.set_state(QpState::Rts);
            }
            QpPath::Driver(p) => p.state_changed(QpState::Rts),
        }
        Ok(())
    }

    /// Posts one datagram (SEND or SEND_WITH_IMM, SGEs or inline) to QP
    /// `remote_qpn` at `ah`'s address with Q_Key `qkey`
    /// ([`OWN_QKEY`]: this QP's own), and rings the
    /// doorbell. Refused with nothing written:
    /// [`Error::InvalidAttribute`] on an RC QP (an address handle has no
    /// use there) or with an `ah` of another PD; [`Error::Unsupported`]
    /// for RDMA and atomics (they do not exist on UD);
    /// [`Error::ExceedsMtu`] for a message longer than the port's MTU
    /// (a datagram is one packet); [`Error::InvalidQpn`] for a QP number
    /// wider than 24 bits; [`Error::InvalidQpState`] before
    /// [`Qp::ready_ud`] or in ERROR; the SGE and inline limits and
    /// [`Error::SqFull`] as on RC; [`Error::CqFull`] on a send CQ outside
    /// the sizing guard that has no room. RC posts on a UD QP
    /// ([`Qp::post_send`]) are [`Error::InvalidAttribute`] (no address
    /// handle) once it is ready, and write nothing either.
    pub fn post_send_ud(
        &mut self,
        wr: &SendWr<'_>,
        ah: &Ah<B>,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<()> {
        if !self.is_ud() || !Arc::ptr_eq(&ah.pd, &self.pd) {
            return Err(Error::InvalidAttribute);
        }
        if wr_len(wr) > u64::from(self.ud_mtu) {
            return Err(Error::ExceedsMtu);
        }
        let q = match &mut self.path {
            QpPath::Mlx5(q) => q,
            QpPath::Driver(p) => {
                let d = ah.driver.ok_or(Error::InvalidAttribute)?;
                if !self._send_cq.metered() {
                    return p.post_send_ud(wr, d, remote_qpn, qkey);
                }
                // As `post_send_metered` on a driver: room for this WR's
                // completion (a driver's forced signals are its own).
                let want = u64::from(wr.flags.contains(SendFlags::SIGNALED));
                let cq = Arc::clone(&self._send_cq);
                let got = cq.reserve(want);
                if got < want {
                    cq.unreserve(got);
                    return Err(Error::CqFull);
                }
                let r = p.post_send_ud(wr, d, remote_qpn, qkey);
                if r.is_err() {
                    cq.unreserve(got);
                }
                return r;
            }
        };
        let dest = UdDest::new(&ah.av, remote_qpn, qkey);
        if !self._send_cq.metered() {
            // SAFETY: SGEs only reach the device, which checks every one
            // against registered regions before any access (as `post_send`).
            unsafe { q.sq.post_ud(wr, &dest) }?;
            q.sq.ring();
            return Ok(());
        }
        // As `post_send_metered`: room for this WR's completion and one
        // the signalling guard may add at the doorbell.
        let want = u64::from(wr.flags.contains(SendFlags::SIGNALED)) + 1;
        let cq = Arc::clone(&self._send_cq);
        let got = cq.reserve(want);
        if got < want {
            cq.unreserve(got);
            return Err(Error::CqFull);
        }
        let f = q.sq.forced_signals();
        // SAFETY: as above.
        let r = unsafe { q.sq.post_ud(wr, &dest) };
        if r.is_ok() {
            q.sq.ring();
        }
        let used = match r {
            Ok(()) => u64::from(wr.flags.contains(SendFlags::SIGNALED)),
            Err(_) => 0,
        } + u64::from(q.sq.forced_signals().wrapping_sub(f));
        cq.unreserve(got.saturating_sub(used));
        r
    }
}
