//! The verbs fallback data path: `ibv_post_send` / `ibv_post_recv` / `ibv_poll_cq`
//! on providers without a direct path (rxe, siw, ...), behind
//! [`QpDriver`] and [`CqDriver`].
//!
//! It keeps the direct path's guarantees where the provider would not:
//! * every WR is validated with the crate's rules first (same typed errors,
//!   nothing handed to the provider for a refused WR);
//! * WRs go to the provider as one chain per call (up to [`CHAIN`] WRs),
//!   built in scratch arrays the QP allocates once: no allocation, and a
//!   call writes only the entries it uses;
//! * the provider sees our own wr_ids (a sequence number per queue; bit 63
//!   marks receives), and a per-QP table ([`QpTrack`]) maps them back, so
//!   send-queue space is exact, and an unsignaled run is broken by a forced
//!   signal that the poller retires without reporting it (as the mlx5
//!   core does);
//! * an SRQ ([`VerbsSrq`]) posts with `ibv_post_srq_recv` under ids of its
//!   own table ([`SrqTrack`]), slots with a free list, since its receives
//!   complete out of order across the QPs attached to it;
//! * provider-written completions are validated: a wr_id that does not
//!   name an outstanding WR of that QP is [`Error::CqeCorrupt`], never an
//!   out-of-bounds index.
//!
//! [`QpDriver`]: crate::api::QpDriver
//! [`CqDriver`]: crate::api::CqDriver
//! [`Error::CqeCorrupt`]: crate::error::Error::CqeCorrupt

mod cq;
mod qp;
mod registry;
mod srq;
mod track;

use super::check;

pub use cq::VerbsCq;
pub(crate) use qp::WindowTable;
pub use qp::{VerbsQp, CHAIN};
pub use registry::CqRegistry;
pub(crate) use registry::RegistryView;
pub(crate) use srq::SrqPoster;
pub use srq::{SrqTrack, VerbsSrq};
pub use track::QpTrack;
pub(crate) use track::{drain_marker_wr, track_accessors, RECV_BIT};
