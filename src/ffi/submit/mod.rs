//! The poll-mode submission service from C (features `ffi` + `soft`): the
//! C side of [`crate::ring::submit`]. Application threads submit RDMA
//! WRITE descriptors into one bounded MPSC ring; one poll-mode thread
//! drains them in batches, posts each batch to an object-level QP with one
//! doorbell, polls the QP's CQ, and hands each completion back through the
//! submitter's own completion ring.
//!
//! # Use
//!
//! ```c
//! rdd_submit_service *svc;                  // qp: connected; cq: its send CQ
//! rdd_submit_create(qp, cq, NULL, &svc);    // allocates everything now
//!
//! // each worker thread:
//! rdd_submitter *sub;
//! rdd_submit_register(svc, &sub);
//! rdd_submit_desc d = {0};
//! d.wr_id = cookie; d.local_addr = src; d.length = len; d.lkey = lkey;
//! d.remote_addr = dst; d.rkey = rkey;       // opcode 0: RDD_WR_RDMA_WRITE
//! size_t bad;
//! if (rdd_submit_post(sub, &d, 1, &bad) == RDD_STATUS_SQ_FULL) { reap, retry }
//! rdd_submit_completion c[16]; size_t n;
//! rdd_submit_reap(sub, c, 16, &n);          // c[i].wr_id, c[i].status
//! rdd_submit_unregister(sub);               // once nothing is in flight
//!
//! // the poll-mode thread:
//! size_t posted, done;
//! for (;;) {
//!     rdd_submit_drain(svc, &posted);       // one batch, one doorbell
//!     rdd_submit_complete(svc, &done);      // route completions
//! }
//! rdd_submit_destroy(svc);                  // once no submitter is left
//! ```
//!
//! # Sizes
//!
//! Fixed behind the API (header constants): a submission ring of
//! `RDD_SUBMIT_RING_SIZE` (4096) descriptors per service, up to
//! `RDD_SUBMIT_MAX_SUBMITTERS` (64) submitters, each with a completion
//! ring of `RDD_SUBMIT_COMPLETION_RING_SIZE` (1024) entries, which is also
//! how many descriptors one submitter may have in flight. Per service,
//! `rdd_submit_config` sets how many WRs stay posted on the QP
//! (`max_outstanding`, up to 4096) and how many one drain posts
//! (`max_batch`, up to 64).
//!
//! # Threading
//!
//! | call | from | runs concurrently with |
//! |------|------|------------------------|
//! | `rdd_submit_post`, `_reap`, `_query` | the thread using that submitter | every call on other submitters, the poll-mode calls, `_register`, `_stats` |
//! | `rdd_submit_drain`, `_complete`, `_flush` | the poll-mode thread | every submitter call, `_register`, `_unregister`, `_stats` |
//! | `rdd_submit_register`, `_stats` | any thread | everything but `_destroy` |
//! | `rdd_submit_unregister` | the thread using that submitter | everything on other handles |
//! | `rdd_submit_destroy` | any thread | nothing on this service |
//!
//! Misuse is detected, never undefined behaviour, and nothing waits: a
//! second poll-mode call while one runs (one compare-and-swap on the
//! service's owner flag), two calls at once on one submitter (its handle
//! slot), and a destroy while anything runs all return
//! `RDD_STATUS_RESOURCE_BUSY` and change nothing. Submitter calls never
//! touch the service's handle slot or another submitter's cache lines:
//! the only shared line on the submit path is the ring's claim counter.
//! The poll-mode calls use the bound QP and CQ exclusively while they run
//! (object-level threading rules): nobody else may use them.
//!
//! # Lifetimes
//!
//! A destroyed or forged service or submitter handle is
//! `RDD_STATUS_INVALID_HANDLE` from every call. `rdd_submit_unregister`
//! is refused while the submitter has descriptors in flight, and
//! `rdd_submit_destroy` while any submitter is registered, so work is
//! never abandoned: destroy in the order unregister (after reaping
//! everything), destroy the service, then the QP. If the QP goes first,
//! `rdd_submit_flush` completes what the service still holds with
//! `RDD_WC_WR_FLUSH_ERR`, so it can be reaped and the service torn down.
//!
//! Nothing is allocated and no lock is taken on the submit, drain,
//! complete and reap paths: the rings, the in-flight table and the batch
//! arrays are allocated by `rdd_submit_create`. The only system call is
//! whatever the QP's doorbell is (none on the software device and the
//! mlx5 core; one `write()` per batch on the direct rxe/siw rings).

mod types;

mod service;

mod calls;
mod poll;

#[cfg(test)]
mod tests;

pub use calls::*;
pub use poll::*;
pub use types::*;
