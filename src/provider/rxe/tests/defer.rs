//! Deferred posts: WQEs written without the producer store, published all
//! at once by `publish` or the next `post`, in posting order.

use super::*;

fn ids(f: &Fake, slots: &[u32]) -> Vec<u64> {
    slots.iter().map(|&s| get64(&f.bytes(s, 0, 8), 0)).collect()
}

#[test]
fn deferred_wqes_are_published_by_one_store() {
    let mut f = Fake::new(8, 8);
    let mut q = sq(&f, caps(1, 0, 0));
    let s = [Sge::new(0x1000, 4, 1)];
    let wr = |id| SendWr::new(id, SendOp::Send, &s, SendFlags::NONE);
    // SAFETY: the fake kernel never dereferences the SGEs.
    let defer = |q: &mut RxeSendQueue, w: &[SendWr<'_>]| unsafe { q.post_deferred(w) };
    assert_eq!(defer(&mut q, &[wr(1), wr(2)]), Ok(2));
    assert_eq!(defer(&mut q, &[wr(3)]), Ok(1));
    // Written, counted, not published, nothing owed.
    assert_eq!((q.deferred(), q.outstanding(), q.free_slots()), (3, 3, 4));
    assert_eq!((f.producer(), q.producer()), (0, 0));
    assert!(!q.doorbell_owed());
    assert!(f.take_all().is_empty(), "the kernel sees nothing yet");
    // One store publishes all three; the doorbell is owed once.
    assert_eq!(q.publish(), 3);
    assert_eq!((f.producer(), q.deferred()), (3, 0));
    assert!(q.take_doorbell());
    let slots = f.consume_all();
    assert_eq!(ids(&f, &slots), [1, 2, 3]);
    // Nothing pending: publish stores nothing and owes nothing.
    assert_eq!(q.publish(), 0);
    assert!(!q.doorbell_owed());
    // A post without deferral publishes the deferred ones ahead of it.
    assert_eq!(defer(&mut q, &[wr(10), wr(11)]), Ok(2));
    assert_eq!(
        q.tpost(&[wr(12)]),
        Ok(Posted {
            count: 1,
            doorbell: true
        })
    );
    assert_eq!(f.producer(), 6);
    let slots = f.consume_all();
    assert_eq!(ids(&f, &slots), [10, 11, 12]);
}

#[test]
fn deferred_wqes_take_ring_space_and_resync_drops_them() {
    let mut f = Fake::new(8, 8);
    let mut q = sq(&f, caps(1, 0, 0));
    let s = [Sge::new(0x1000, 4, 1)];
    let wrs: Vec<_> = (0..8)
        .map(|id| SendWr::new(id, SendOp::Send, &s, SendFlags::NONE))
        .collect();
    // SAFETY: the fake kernel never dereferences the SGEs.
    let r = unsafe { q.post_deferred(&wrs) };
    assert_eq!(
        r,
        Err(PostError {
            index: 7,
            error: Error::SqFull
        })
    );
    assert_eq!((q.deferred(), q.free_slots()), (7, 0));
    // A refused deferral is not a debt: nothing was published.
    assert!(!q.doorbell_owed());
    assert_eq!(q.tpost(&wrs[..1]).unwrap_err().error, Error::SqFull);
    // The failed post above still published the seven deferred.
    assert_eq!(f.producer(), 7);
    assert!(q.take_doorbell());
    f.consume_all();
    // SAFETY: as above.
    assert_eq!(unsafe { q.post_deferred(&wrs[..2]) }, Ok(2));
    // The kernel resets the queue (RESET zeroes both indices).
    f.word(128).store(0, Ordering::Relaxed);
    f.word(256).store(0, Ordering::Relaxed);
    q.resync();
    assert_eq!((q.deferred(), q.producer(), q.publish()), (0, 0, 0));
    assert_eq!(f.producer(), 0);
}
