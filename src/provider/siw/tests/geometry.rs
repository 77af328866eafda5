//! Geometry checks of the send, receive and completion queues.

use super::*;

#[test]
fn geometry_checks() {
    let f = Fake::sq(8);
    let g = Err(Error::InvalidGeometry);
    let c = caps(6, 80, 6);
    let try_sq = |p: *mut u8, len: usize, n: u32, c: QpCaps| {
        // SAFETY: our buffer; nothing is dereferenced on refusal.
        unsafe { SiwSendQueue::new(p, len, n, c, false) }.map(|_| ())
    };
    assert_eq!(try_sq(f.ptr(), f.len(), 8, c), Ok(()));
    assert_eq!(try_sq(core::ptr::null_mut(), f.len(), 8, c), g);
    assert_eq!(try_sq(f.ptr().wrapping_add(4), f.len() - 4, 4, c), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 0, c), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 6, c), g);
    assert_eq!(try_sq(f.ptr(), usize::MAX, 1 << 25, c), g);
    assert_eq!(try_sq(f.ptr(), f.len() - 1, 8, c), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 8, caps(7, 0, 0)), g);
    assert_eq!(try_sq(f.ptr(), f.len(), 8, caps(1, 81, 0)), g);
    let r = Fake::rq(4);
    // SAFETY: our buffer.
    let try_rq = |len, c: QpCaps| {
        // SAFETY: our buffer; nothing is dereferenced on refusal.
        unsafe { SiwRecvQueue::new(r.ptr(), len, 4, &c) }.map(|_| ())
    };
    assert_eq!(try_rq(r.len(), caps(0, 0, 6)), Ok(()));
    assert_eq!(try_rq(r.len(), caps(0, 0, 7)), g);
    assert_eq!(try_rq(r.len() - 1, caps(0, 0, 1)), g);
    let q = Fake::cq(4);
    // SAFETY: our buffer.
    let try_cq = |len| {
        // SAFETY: our buffer; nothing is dereferenced on refusal.
        unsafe { SiwCq::new(q.ptr(), len, 4) }.map(|_| ())
    };
    assert_eq!(try_cq(q.len()), Ok(()));
    assert_eq!(try_cq(q.len() - 1), g, "no room for siw_cq_ctrl");
}
