//! The kernel ABI this module speaks, checked at compile time: command
//! and response sizes, command numbers, the rxe and siw layouts, and the
//! constants the commands use.

use core::mem::{offset_of, size_of};

use super::command::Cmd;
use crate::sys::uverbs as k;
use k::ib_uverbs_write_cmds as cmd;

// ---------------------------------------------------------------------------
// Layout checks (docs/spec/rxe.md §1, §2, §6, docs/spec/siw.md §1, §2, docs/spec/kernels.md).

static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_cmd_hdr>(), 8);
// docs/spec/kernels.md: bytes written per command, header included.
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_cq>>(), 40);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_qp>>(), 64);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_modify_qp>>(), 120);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_post_send>>(), 32);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_destroy_cq>>(), 24);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_destroy_qp>>(), 24);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_req_notify_cq>>(), 16);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_comp_channel>>(), 16);
// The body directly follows the header (no padding the kernel would read
// as part of the body).
static_assertions::const_assert_eq!(offset_of!(Cmd<k::ib_uverbs_create_cq>, body), 8);
static_assertions::const_assert_eq!(offset_of!(Cmd<k::ib_uverbs_req_notify_cq>, body), 8);
// Command numbers the reference names (docs/spec/rxe.md §6: the doorbell is 28).
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, 17);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_CQ, 18);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_DESTROY_CQ, 20);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, 23);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_QP, 24);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_MODIFY_QP, 26);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_DESTROY_QP, 27);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_POST_SEND, 28);
// SRQ commands (docs/spec/kernels.md, docs/spec/rxe.md §7).
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_CREATE_SRQ, 32);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_MODIFY_SRQ, 33);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_QUERY_SRQ, 34);
static_assertions::const_assert_eq!(cmd::IB_USER_VERBS_CMD_DESTROY_SRQ, 35);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_create_srq>>(), 40);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_modify_srq>>(), 24);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_query_srq>>(), 24);
static_assertions::const_assert_eq!(size_of::<Cmd<k::ib_uverbs_destroy_srq>>(), 24);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_create_srq_resp>(), 16);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_query_srq_resp>(), 16);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_destroy_srq_resp>(), 4);
static_assertions::const_assert_eq!(size_of::<k::rxe_create_srq_resp>(), 24);
static_assertions::const_assert_eq!(size_of::<k::rxe_modify_srq_cmd>(), 8);
static_assertions::const_assert_eq!(size_of::<k::siw_uresp_create_srq>(), 16);
// Core responses; the driver's response follows them (docs/spec/kernels.md: +8, +32).
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_create_cq_resp>(), 8);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_create_qp_resp>(), 32);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_post_send_resp>(), 4);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_destroy_cq_resp>(), 8);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_destroy_qp_resp>(), 4);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_async_event_desc>(), 16);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_comp_event_desc>(), 8);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_qp_dest>(), 32);
// rxe (docs/spec/rxe.md §1, §2).
static_assertions::const_assert_eq!(size_of::<k::mminfo>(), 16);
static_assertions::const_assert_eq!(size_of::<k::rxe_create_cq_resp>(), 16);
static_assertions::const_assert_eq!(size_of::<k::rxe_create_qp_resp>(), 32);
static_assertions::const_assert_eq!(size_of::<k::rxe_queue_buf>(), RXE_DATA_OFFSET);
static_assertions::const_assert_eq!(offset_of!(k::rxe_queue_buf, index_mask), 4);
static_assertions::const_assert_eq!(offset_of!(k::rxe_queue_buf, producer_index), 128);
static_assertions::const_assert_eq!(offset_of!(k::rxe_queue_buf, consumer_index), 256);
// siw (docs/spec/siw.md §1, §2).
static_assertions::const_assert_eq!(size_of::<k::siw_uresp_create_cq>(), 16);
static_assertions::const_assert_eq!(size_of::<k::siw_uresp_create_qp>(), 32);
static_assertions::const_assert_eq!(offset_of!(k::siw_uresp_create_qp, sq_key), 16);
static_assertions::const_assert_eq!(size_of::<k::siw_sqe>(), 120);
static_assertions::const_assert_eq!(size_of::<k::siw_rqe>(), 112);
static_assertions::const_assert_eq!(size_of::<k::siw_cqe>(), 32);
static_assertions::const_assert_eq!(size_of::<k::siw_cq_ctrl>(), 8);

/// Where the slots start in an rxe ring (`struct rxe_queue_buf`, docs/spec/rxe.md §2).
pub const RXE_DATA_OFFSET: usize = 384;

/// `wqe_size` of the empty POST_SEND: `sizeof(struct ibv_send_wr)`, as
/// rdma-core sends; the kernel refuses anything below
/// `sizeof(struct ib_uverbs_send_wr)` (56) on newer kernels (docs/spec/rxe.md §6).
pub(super) const DOORBELL_WQE_SIZE: u32 = 128;

/// `IB_UVERBS_QPT_RC`.
pub(super) const QPT_RC: u8 = k::ib_uverbs_qp_type::IB_UVERBS_QPT_RC as u8;

/// `IB_UVERBS_QPT_UD`.
pub(super) const QPT_UD: u8 = k::ib_uverbs_qp_type::IB_UVERBS_QPT_UD as u8;
