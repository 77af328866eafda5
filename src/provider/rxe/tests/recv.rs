//! The receive queue: WQE bytes, a full ring, refusals and many wraps.

use super::*;

#[test]
fn recv_wqe_bytes_full_and_wrap() {
    let mut f = Fake::new(7, 4);
    let c = caps(0, 0, 5);
    // SAFETY: our buffer, outliving the queue.
    let mut q = unsafe { RxeRecvQueue::new(f.ptr(), f.len(), &c) }.unwrap();
    let s = [
        Sge::new(0xa000, 64, 5),
        Sge::new(0xb000, 0, 6),
        Sge::new(0xc000, 32, 7),
    ];
    let wrs = [
        RecvWr {
            wr_id: 0x77,
            sges: &s,
        },
        RecvWr {
            wr_id: 0x78,
            sges: &[],
        },
    ];
    assert_eq!(q.tpost(&wrs), Ok(2));
    let slots = f.take_all();
    for (wr, &slot) in wrs.iter().zip(&slots) {
        let mut e = vec![0u8; 40];
        put64(&mut e, 0, wr.wr_id);
        let n = wr.sges.len() as u32;
        let len: u32 = wr.sges.iter().map(|s| s.length).sum();
        put32(&mut e, 8, n);
        put32(&mut e, 16, len);
        put32(&mut e, 20, len);
        put32(&mut e, 28, n);
        for g in wr.sges {
            e.extend_from_slice(&g.addr.to_ne_bytes());
            e.extend_from_slice(&g.length.to_ne_bytes());
            e.extend_from_slice(&g.lkey.to_ne_bytes());
        }
        assert_eq!(f.bytes(slot, 0, e.len()), e);
    }
    // Full at capacity (3): one more is refused.
    let one = RecvWr {
        wr_id: 1,
        sges: &s[..1],
    };
    assert_eq!(
        q.tpost(&[one, one]),
        Err(PostError {
            index: 1,
            error: Error::RqFull
        })
    );
    assert_eq!(q.free_slots(), 0);
    // Refusals.
    let six = [Sge::new(0, 1, 1); 6];
    f.complete_to(f.kidx);
    // SAFETY: as above.
    let r = unsafe {
        q.post(&[RecvWr {
            wr_id: 1,
            sges: &six,
        }])
    };
    assert_eq!(r.unwrap_err().error, Error::TooManySges);
    let huge = [Sge::new(0, 0x8000_0000, 1), Sge::new(0, 0x8000_0000, 1)];
    // SAFETY: as above.
    let r = unsafe {
        q.post(&[RecvWr {
            wr_id: 1,
            sges: &huge,
        }])
    };
    assert_eq!(r.unwrap_err().error, Error::LengthOverflow);
    q.set_state(QpState::Reset);
    assert_eq!(q.tpost(&[one]).unwrap_err().error, Error::InvalidQpState);
    q.set_state(QpState::Init);
    f.take_all();
    f.complete_to(f.kidx);
    // Wrap many times.
    let mut seen = 1000u64;
    for i in 0..300u64 {
        let wr = RecvWr {
            wr_id: 1000 + i,
            sges: &s[..1],
        };
        assert_eq!(q.tpost(&[wr]), Ok(1));
        for slot in f.consume_all() {
            assert_eq!(get64(&f.bytes(slot, 0, 8), 0), seen);
            seen += 1;
        }
    }
    assert_eq!(seen, 1300);
}
