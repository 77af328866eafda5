//! The software HCA: an in-process device that behaves like an mlx5 HCA on
//! the same queue memory the core writes (feature `soft`).
//!
//! It sits on the device side of the queues: it watches the doorbell
//! records, copies WQEs out of the send ring as bytes, validates them with
//! its own parser ([`wqe`], never the crate's encoder), executes them
//! between RC QPs of the same device (and delivers datagrams between its
//! UD QPs, docs/spec/soft.md §3), and writes CQE64/CQE128 entries with
//! the owner-bit protocol of docs/spec/mlx5.md §8. Everything the application
//! touches on the data path is plain shared memory: posting and polling
//! never take a lock or make a call into the device.
//!
//! Two ways to run: [`SoftDevice::step`] processes what is pending in the
//! caller's thread (deterministic, for tests and instruction counts), and
//! [`SoftDevice::start`] runs a device thread. The device takes its lock
//! once per pass over all queues, never per WQE.

mod config;
mod cqe;
mod device;
mod exec;
pub(crate) mod fabric;
mod mem;
pub mod mr;
mod pass;
mod srq;
mod state;
mod thread;
mod ud;
mod ud_wqe;
pub mod wqe;

pub use crate::attr::{Access, AddressVector, QpInit, QpModify, SrqAttr, SrqId};
pub use crate::provider::mlx5::geometry::queue_sizes;
pub use config::{AsyncEvent, Fault, SoftConfig, UdDrops};
pub use device::SoftDevice;
pub use mem::{CqMem, QpMem, SoftCq, SoftQp, SoftSrq, SrqMem};
pub use ud::GRH_BYTES;
