//! Connecting two QPs of one device to each other out of band, as the
//! loopback tests on the software device do (included with `#[path]`).

use rdma_direct::api::{Access, Backend, ConnectAttr, Qp};

/// Connects `a` and `b` to each other. `b` grants `b_access` to requests
/// from `a` (for example `Access::REMOTE_WRITE` so `a` can write into
/// `b`'s regions); `a` grants nothing. Panics if a transition fails.
pub fn connect_loopback<B: Backend>(a: &mut Qp<B>, b: &mut Qp<B>, b_access: Access) {
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib, &ConnectAttr::default()).unwrap();
    b.connect(
        &ia,
        &ConnectAttr {
            access: b_access,
            ..Default::default()
        },
    )
    .unwrap();
}
