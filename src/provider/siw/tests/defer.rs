//! Deferred posts: SQEs published one by one (VALID, docs/spec/siw.md
//! §3), the doorbell decision (§4) made once for the whole batch.

use super::*;

fn valid(f: &Fake, c: u32) -> bool {
    f.flags16(c) & 1 != 0
}

#[test]
fn one_doorbell_decision_per_deferred_batch() {
    let mut f = Fake::sq(8);
    let mut q = sq(&f, caps(1, 0, 0), false);
    let s = [Sge::new(0x1000, 4, 1)];
    let wr = |id| SendWr::new(id, SendOp::Send, &s, SendFlags::NONE);
    // SAFETY: the fake kernel never dereferences the SGEs.
    let defer = |q: &mut SiwSendQueue, w: &[SendWr<'_>]| unsafe { q.post_deferred(w) };
    assert_eq!(defer(&mut q, &[wr(1), wr(2)]), Ok(2));
    assert_eq!(defer(&mut q, &[wr(3)]), Ok(1));
    assert!((0..3).all(|c| valid(&f, c)), "each SQE is published");
    assert_eq!(q.deferred(), 3);
    assert!(!q.doorbell_owed(), "no decision yet");
    // Fresh queue: the slot before the batch is free -> ring, once.
    assert_eq!(q.publish(), 3);
    assert!(q.take_doorbell());
    assert_eq!((q.deferred(), q.publish()), (0, 0));
    assert!(!q.doorbell_owed());
    let ids: Vec<u64> = [f.pick(), f.pick()]
        .iter()
        .map(|i| get64(i.as_ref().unwrap(), 0))
        .collect();
    assert_eq!(ids, [1, 2]);
    // The transmitter has not reached slot 2: a batch after it needs no
    // ring.
    assert_eq!(defer(&mut q, &[wr(4)]), Ok(1));
    assert_eq!(q.publish(), 1);
    assert_eq!(defer(&mut q, &[wr(5)]), Ok(1));
    assert_eq!(q.publish(), 1);
    assert!(!q.take_doorbell());
    let ids: Vec<u64> = f.pick_all().iter().map(|i| get64(i, 0)).collect();
    assert_eq!(ids, [3, 4, 5]);
    // It took everything and went idle; then two deferred SQEs and one
    // posted at once: the decision covers the batch from its first SQE
    // (the slot before it was taken -> ring), not just the last call's,
    // whose predecessor is a deferred SQE still VALID.
    assert_eq!(defer(&mut q, &[wr(6), wr(7)]), Ok(2));
    let p = q.tpost(&[wr(8)]).unwrap();
    assert_eq!(
        p,
        Posted {
            count: 1,
            doorbell: true
        }
    );
    let ids: Vec<u64> = f.pick_all().iter().map(|i| get64(i, 0)).collect();
    assert_eq!(ids, [6, 7, 8]);
    // forget_deferred drops a pending decision.
    assert_eq!(defer(&mut q, &[wr(9)]), Ok(1));
    q.forget_deferred();
    assert_eq!((q.deferred(), q.publish()), (0, 0));
    assert!(!q.doorbell_owed());
}
