//! The configuration of a [`CreditQp`] (with its checked grant threshold)
//! and its counters.

#[cfg(doc)]
use super::{CreditQp, MAX_SEND_SLOTS};
use super::{MAX_RECV_DEPTH, MIN_RECV_DEPTH};
use crate::api::WaitMode;
use crate::error::{Error, Result};

/// Configuration of a [`CreditQp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditConfig {
    /// Receive buffers posted: the credits announced to the peer
    /// ([`MIN_RECV_DEPTH`] to [`MAX_RECV_DEPTH`]). The QP's receive queue
    /// must hold this many ([`QpInit::max_recv_wr`](crate::api::QpInit)).
    pub recv_depth: u32,
    /// Bytes per buffer, at least 1: the largest message the peer may send
    /// us, and (with the peer's own `max_msg`) the largest we send.
    pub msg_size: u32,
    /// Registered send buffers, rounded up to a power of two (at most
    /// [`MAX_SEND_SLOTS`]): data messages posted and not yet completed.
    pub send_slots: u32,
    /// Re-posted receives owed before an explicit credit-only message is
    /// sent (when no data message carries them first). 0 means half the
    /// receive window (at least 2). Must lie in `2 ..= recv_depth − 1`.
    pub grant_threshold: u32,
    /// How [`CreditQp::send_wait`] and [`CreditQp::recv_wait`] wait for
    /// completions.
    pub wait_mode: WaitMode,
}

impl Default for CreditConfig {
    fn default() -> Self {
        CreditConfig {
            recv_depth: 32,
            msg_size: 1024,
            send_slots: 32,
            grant_threshold: 0,
            wait_mode: WaitMode::Adaptive,
        }
    }
}

/// Counters of one [`CreditQp`] since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditStats {
    /// Data messages posted.
    pub sent: u64,
    /// Data messages handed to the application.
    pub received: u64,
    /// Explicit credit-only messages posted.
    pub credit_msgs_sent: u64,
    /// Credit-only messages received from the peer.
    pub credit_msgs_received: u64,
    /// Credits returned to the peer on data messages.
    pub granted_piggyback: u64,
    /// Credits returned to the peer in credit-only messages.
    pub granted_explicit: u64,
    /// Credits the peer granted us (after its initial announcement).
    pub credits_received: u64,
    /// Send attempts refused with [`Error::NoCredits`] (each attempt of a
    /// waiting send counts).
    pub no_credit: u64,
}

/// The grant threshold `cfg` asks for, checked (see the module
/// documentation for why `2 ..= recv_depth − 1`).
pub(super) fn threshold_for(cfg: &CreditConfig) -> Result<u32> {
    let depth = cfg.recv_depth;
    if !(MIN_RECV_DEPTH..=MAX_RECV_DEPTH).contains(&depth) {
        return Err(Error::InvalidAttribute);
    }
    let t = if cfg.grant_threshold == 0 {
        (depth / 2).max(2)
    } else {
        cfg.grant_threshold
    };
    if t < 2 || t >= depth {
        return Err(Error::InvalidAttribute);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        let cfg = |recv_depth, grant_threshold| CreditConfig {
            recv_depth,
            grant_threshold,
            ..CreditConfig::default()
        };
        assert_eq!(threshold_for(&cfg(32, 0)), Ok(16));
        assert_eq!(threshold_for(&cfg(3, 0)), Ok(2));
        assert_eq!(threshold_for(&cfg(8, 7)), Ok(7));
        assert_eq!(threshold_for(&cfg(2, 0)), Err(Error::InvalidAttribute));
        assert_eq!(threshold_for(&cfg(8, 8)), Err(Error::InvalidAttribute));
        assert_eq!(threshold_for(&cfg(8, 1)), Err(Error::InvalidAttribute));
    }
}
