//! Checking work requests without a queue: the verdict a post would give,
//! for programs that build WRs and want to test that construction against
//! the send queue's rules (no device, no ring, nothing written).

use super::wqe::Plan;
use super::{max_ds, SendQueue};
use crate::error::{Error, PostError, Result};
use crate::provider::mlx5::layout::MAX_DS;
use crate::wr::{QpCaps, SendWr};

impl SendQueue {
    /// Whether any send queue can be created with `caps`: its largest WQE
    /// (docs/spec/mlx5.md §2–§5) must fit the 6-bit DS field. This is the
    /// capability rule of [`SendQueue::from_raw`]; the ring-size rule
    /// (the largest WQE fits the ring) depends on the ring and is not
    /// checked here. Error: [`Error::InvalidGeometry`].
    #[inline]
    pub fn check_caps(caps: &QpCaps) -> Result<()> {
        if max_ds(caps) > MAX_DS {
            return Err(Error::InvalidGeometry);
        }
        Ok(())
    }

    /// The verdict [`SendQueue::post`] (and [`SendQueue::post_one`], a
    /// [`SendBatch`](super::SendBatch), [`SendQueue::post_list`] for this
    /// WR) would give on a queue created with `caps`, in a state that can
    /// send, with room for the WR. It runs the post's own validation (the
    /// same code), writes nothing and needs no queue or device.
    ///
    /// Errors: [`Error::InvalidGeometry`] when no queue has `caps`
    /// ([`SendQueue::check_caps`]); otherwise every work-request error a
    /// post returns: [`Error::TooManySges`], [`Error::AtomicSgeLength`],
    /// [`Error::LengthOverflow`], [`Error::InlineNotAllowed`],
    /// [`Error::InlineTooLarge`], [`Error::AtomicUnaligned`],
    /// [`Error::Unsupported`]. The queue-dependent refusals of a post,
    /// [`Error::SqFull`] and [`Error::InvalidQpState`], are never returned.
    #[inline]
    pub fn check(caps: &QpCaps, wr: &SendWr<'_>) -> Result<()> {
        Self::check_caps(caps)?;
        Self::check_wr(caps, wr).map(|_| ())
    }

    /// [`SendQueue::check`] for a list, as [`SendQueue::post_list`] would
    /// judge it on a queue with room for all of it: the first refused WR's
    /// index and error, or `Ok`. Capabilities no queue has are reported
    /// at index 0 ([`Error::InvalidGeometry`]).
    #[inline]
    pub fn check_list(caps: &QpCaps, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        Self::check_caps(caps).map_err(|error| PostError { index: 0, error })?;
        for (index, wr) in wrs.iter().enumerate() {
            Self::check_wr(caps, wr).map_err(|error| PostError { index, error })?;
        }
        Ok(())
    }

    /// The post's validation of one WR for capabilities already checked.
    #[inline(always)]
    pub(crate) fn check_wr(caps: &QpCaps, wr: &SendWr<'_>) -> Result<Plan> {
        Self::plan_for(wr, caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{FakeGeometry, FakeMlx5};
    use crate::wr::{Remote, SendFlags, SendOp, Sge};

    fn fake() -> FakeMlx5 {
        FakeMlx5::new(FakeGeometry {
            sq_wqe_cnt: 64,
            rq_wqe_cnt: 4,
            rq_stride: 32,
            bf_size: 64,
            cqe_cnt: 2,
            cqe_size: 64,
            qpn: 5,
            cqn: 1,
        })
    }

    #[test]
    fn caps_rule_is_the_constructors() {
        let mut f = fake();
        // (SGEs, inline bytes, accepted): the largest WQE is 2 + SGEs or
        // 2 + ceil((4 + inline) / 16) octowords (RDMA header and data) and
        // must fit DS (63).
        for (sge, inline, ok) in [
            (1, 0, true),
            (61, 0, true),
            (62, 0, false),
            (1, 972, true),
            (1, 973, false),
            (8, 200, true),
        ] {
            let caps = f.caps(sge, inline);
            let want = if ok {
                Ok(())
            } else {
                Err(Error::InvalidGeometry)
            };
            assert_eq!(SendQueue::check_caps(&caps), want, "caps {caps:?}");
            let queue = f.send_queue(caps, Default::default()).map(|_| ());
            assert_eq!(queue, want, "queue with {caps:?}");
        }
    }

    #[test]
    fn verdicts_match_a_post() {
        let mut f = fake();
        let caps = f.caps(2, 16);
        let eight = [Sge::new(0x1000, 8, 1)];
        let four = [Sge::new(0x1000, 4, 1)];
        let three = [Sge::new(0x1000, 1, 1); 3];
        let remote = Remote::new(0x2001, 2);
        let payload: [&[u8]; 1] = [&[7u8; 17]];
        let wrs = [
            SendWr::new(1, SendOp::Send, &eight, SendFlags::SIGNALED),
            SendWr::new(2, SendOp::Send, &three, SendFlags::NONE),
            SendWr::new(
                3,
                SendOp::FetchAdd { remote, add: 1 },
                &eight,
                SendFlags::NONE,
            ),
            SendWr::new(
                4,
                SendOp::FetchAdd {
                    remote: Remote::new(0x2000, 2),
                    add: 1,
                },
                &four,
                SendFlags::NONE,
            ),
            SendWr::inline(5, SendOp::Send, &payload, SendFlags::NONE),
            SendWr::new(6, SendOp::LocalInv { rkey: 1 }, &[], SendFlags::NONE),
        ];
        let want = [
            Ok(()),
            Err(Error::TooManySges),
            Err(Error::AtomicUnaligned),
            Err(Error::AtomicSgeLength),
            Err(Error::InlineTooLarge),
            Err(Error::Unsupported),
        ];
        let mut sq = f.send_queue(caps, Default::default()).unwrap();
        for (wr, want) in wrs.iter().zip(want) {
            assert_eq!(SendQueue::check(&caps, wr), want, "{wr:?}");
            // SAFETY: nothing reads the SGE addresses (no device).
            assert_eq!(unsafe { sq.post(wr) }, want, "post of {wr:?}");
        }
        assert_eq!(
            SendQueue::check_list(&caps, &wrs),
            Err(PostError {
                index: 1,
                error: Error::TooManySges
            })
        );
        assert_eq!(SendQueue::check_list(&caps, &wrs[..1]), Ok(()));
        let bad = f.caps(62, 0);
        assert_eq!(SendQueue::check(&bad, &wrs[0]), Err(Error::InvalidGeometry));
        assert_eq!(
            SendQueue::check_list(&bad, &[]),
            Err(PostError {
                index: 0,
                error: Error::InvalidGeometry
            })
        );
    }
}
