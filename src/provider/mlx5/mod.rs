//! mlx5 (ConnectX-4 and later) direct data path: layouts, send and receive
//! queues, completion polling. Reference: `docs/spec/mlx5.md`.

mod completion;
pub mod cq;
pub mod geometry;
pub mod layout;
pub mod rq;
pub mod shared;
pub mod sq;
pub mod srq;

pub use cq::{
    CompletionQueue, CqRoute, CqRouteTo, Mlx5Qp, QpQueues, SqRetire, Wc, WcOpcode, WcStatus,
};
pub use layout::{Mlx5dvCq, Mlx5dvQp};
pub use rq::RecvQueue;
pub use shared::{SharedSendQueue, SharedStorage, SqRetirer};
pub use sq::{
    AhAttr, BfPolicy, GlobalRoute, LinkLayer, Mlx5Av, QpState, Retired, SendBatch, SendQueue,
    SqConfig, UdDest, WrSlot,
};
pub use srq::{Srq, SrqGeometry, SrqSlot};
