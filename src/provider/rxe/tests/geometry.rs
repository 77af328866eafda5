//! Header validation: the geometry every rxe queue checks before use.

use super::*;

#[test]
fn header_validation() {
    let f = Fake::new(8, 16);
    // SAFETY: our own buffer, `len` bytes.
    let ok = unsafe { RxeQueue::new(f.ptr(), f.len(), 256) }.unwrap();
    assert_eq!(
        (ok.slots(), ok.capacity(), ok.elem_size(), ok.index_mask()),
        (16, 15, 256, 15)
    );
    let bad = |p: *mut u8, len: usize, min: usize| {
        // SAFETY: our buffer; every refusal below happens before any
        // element is touched, and only the header is read.
        unsafe { RxeQueue::new(p, len, min) }.err()
    };
    let g = Some(Error::InvalidGeometry);
    assert_eq!(bad(core::ptr::null_mut(), f.len(), 64), g, "null");
    assert_eq!(
        bad(f.ptr().wrapping_add(4), f.len() - 4, 64),
        g,
        "misaligned"
    );
    assert_eq!(bad(f.ptr(), 383, 64), g, "shorter than the header");
    assert_eq!(bad(f.ptr(), f.len() - 1, 64), g, "ring past the mapping");
    assert_eq!(bad(f.ptr(), f.len(), 257), g, "element too small");
    for (log2, mask) in [
        (17, 15),
        (2, 15),
        (8, 5),
        (8, 0),
        (8, u32::MAX),
        (8, (1 << 25) - 1),
    ] {
        f.word(0).store(log2, Ordering::Relaxed);
        f.word(4).store(mask, Ordering::Relaxed);
        assert_eq!(
            bad(f.ptr(), usize::MAX / 2, 0),
            g,
            "log2 {log2} mask {mask:#x}"
        );
    }
    // Send queue: the element must hold 208 + max(16 sge, inline).
    let f = Fake::new(8, 4);
    let try_sq = |c| {
        // SAFETY: our buffer, `len` bytes.
        unsafe { RxeSendQueue::new(f.ptr(), f.len(), c) }.err()
    };
    assert_eq!(try_sq(caps(3, 0, 0)), None, "208 + 48 = 256");
    assert_eq!(try_sq(caps(4, 0, 0)), g, "208 + 64 > 256");
    assert_eq!(try_sq(caps(1, 49, 0)), g, "208 + 49 > 256");
    assert_eq!(try_sq(caps(u32::MAX, u32::MAX, 0)), g);
    assert_eq!(sq::required_elem_size(&caps(2, 100, 0)), 308);
    // Receive queue: 40 + 16 sge.
    let f = Fake::new(6, 4);
    let try_rq = |c: QpCaps| {
        // SAFETY: our buffer, `len` bytes.
        unsafe { RxeRecvQueue::new(f.ptr(), f.len(), &c) }.err()
    };
    assert_eq!(try_rq(caps(0, 0, 1)), None);
    assert_eq!(try_rq(caps(0, 0, 2)), g, "40 + 32 > 64");
    // CQ: 48-byte entries at least.
    let f = Fake::new(5, 4);
    // SAFETY: our buffer.
    assert_eq!(unsafe { RxeCq::new(f.ptr(), f.len()) }.err(), g);
}
