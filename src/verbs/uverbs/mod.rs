//! Queue creation through the kernel's uverbs ABI, for the rxe (Soft-RoCE)
//! and siw (soft-iWARP) devices (feature `verbs`).
//!
//! libibverbs' rxe and siw providers keep the rings they mmap in private
//! structs, so for these two devices the crate creates its CQs and QPs
//! itself with the kernel's legacy `write()` commands on the device
//! context's command fd (`ibv_context.cmd_fd`), maps the rings, and hands
//! them to the provider codecs. The PD and the MRs still come from
//! libibverbs: their kernel handles and keys are public (`ibv_pd.handle`,
//! `ibv_mr.lkey`/`rkey`), and the kernel accepts them for these objects
//! because they live in the same context (docs/spec/kernels.md).
//!
//! What is here:
//! * [`UverbsCq`]: CREATE_CQ, the ring mapping (rxe: the driver's `mminfo`;
//!   siw: `num_cqe * 32 + 8` bytes at `cq_key`), REQ_NOTIFY_CQ (rxe's only
//!   way to arm; siw arms in shared memory), DESTROY_CQ on drop;
//! * [`UverbsSrq`]: CREATE_SRQ, the SRQ ring mapping (rxe: `mminfo`;
//!   siw: `num_rqe * 112` bytes at `srq_key`), MODIFY_SRQ (the limit),
//!   QUERY_SRQ, DESTROY_SRQ;
//! * [`UverbsQp`]: CREATE_QP (RC, or UD on rxe; on its own receive ring or an SRQ), both ring mappings, MODIFY_QP
//!   from the crate's [`QpModify`] (the same attributes and mask as the
//!   verbs fallback's `ibv_modify_qp`) or from a raw `ibv_qp_attr` and mask
//!   (rdma_cm's `rdma_init_qp_attr`), the doorbell (an empty POST_SEND,
//!   built once per QP), DESTROY_QP on drop;
//! * [`UverbsAh`]: CREATE_AH (rxe: the kernel's `ah_num` for UD send
//!   WQEs), DESTROY_AH on drop;
//! * [`CompChannel`]: a completion channel of our own (CREATE_COMP_CHANNEL),
//!   read directly;
//! * [`AsyncEvents`]: the context's async event fd, read directly.
//!
//! # Rules the caller must keep
//! * **Never** give these objects to libibverbs' event functions
//!   (`ibv_get_cq_event`, `ibv_ack_cq_events`, `ibv_get_async_event`,
//!   `ibv_ack_async_event`). The kernel reports our `user_handle` in their
//!   events, and libibverbs would take it for an `ibv_cq*`/`ibv_qp*`.
//!   Completion events come from [`CompChannel::consume`], async events
//!   from [`AsyncEvents::poll_async_event`]. In particular a CQ made here
//!   must not be given the fd of an `ibv_comp_channel` that anything
//!   reads with `ibv_get_cq_event`: libibverbs dereferences the reported
//!   handle as an `ibv_cq*`.
//! * The context's async fd is one stream for the whole context: reading it
//!   here takes events away from any other reader (a libibverbs
//!   `ibv_get_async_event` loop on the same context would both steal ours
//!   and misread them), so a context has one reader, this one.
//! * Destroy QPs before their CQs, and all of them before the PD and the
//!   context (the kernel refuses to destroy a CQ that a QP uses, and a PD
//!   with objects on it: the drop then leaves the kernel object to the
//!   context's close).
//! * rxe: each mmap offset can be mapped once, so the rings of an object
//!   are mapped here and nowhere else.
//!
//! Command numbers, sizes, word counts and response placement follow
//! docs/spec/kernels.md (checked on Debian's 6.1 and 6.12 kernels); the layouts come
//! from the kernel UAPI headers through bindgen ([`crate::sys::uverbs`]),
//! with static assertions of the sizes docs/spec/rxe.md, docs/spec/siw.md and docs/spec/kernels.md state.
//!
//! [`QpModify`]: crate::attr::QpModify

mod ah;
mod channel;
mod command;
mod cq;
mod events;
mod kind;
mod layout;
mod mapping;
mod qp;
mod srq;

pub use ah::UverbsAh;
pub use channel::CompChannel;
pub use cq::UverbsCq;
pub use events::{AsyncEvent, AsyncEvents};
pub use kind::Kind;
pub use layout::RXE_DATA_OFFSET;
pub use mapping::RingView;
pub use qp::{QpService, UverbsQp};
pub use srq::{SrqQuery, UverbsSrq};
