//! The receive queue: RQE bytes, a full queue and many wraps.

use super::*;

#[test]
fn rqe_bytes_full_and_wrap() {
    let mut f = Fake::rq(4);
    let c = caps(0, 0, 3);
    // SAFETY: our buffer, outliving the queue; SGEs never dereferenced.
    let mut q = unsafe { SiwRecvQueue::new(f.ptr(), f.len(), 4, &c) }.unwrap();
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
    let imgs = f.pick_all();
    assert_eq!(imgs.len(), 2);
    for (img, wr) in imgs.iter().zip(&wrs) {
        assert_eq!(get64(img, 0), wr.wr_id);
        // flags exactly VALID, num_sge, opcode 0, unused 0.
        assert_eq!(&img[8..16], &[1, 0, wr.sges.len() as u8, 0, 0, 0, 0, 0]);
        for (i, g) in wr.sges.iter().enumerate() {
            let o = 16 + 16 * i;
            assert_eq!(
                (get64(img, o), get32(img, o + 8), get32(img, o + 12)),
                (g.addr, g.length, g.lkey)
            );
        }
    }
    let one = RecvWr {
        wr_id: 1,
        sges: &s[..1],
    };
    // Four usable slots, then full.
    assert_eq!(
        q.tpost(&[one; 5]),
        Err(PostError {
            index: 4,
            error: Error::RqFull
        })
    );
    assert_eq!(q.free_slots(), 0);
    f.pick_all();
    assert_eq!(q.free_slots(), 4);
    let four = [Sge::new(0, 1, 1); 4];
    // SAFETY: as above.
    let r = unsafe {
        q.post(&[RecvWr {
            wr_id: 1,
            sges: &four,
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
    q.set_state(QpState::Rtr);
    let mut seen = 1000u64;
    for i in 0..300u64 {
        let w = RecvWr {
            wr_id: 1000 + i,
            sges: &s[..1],
        };
        assert_eq!(q.tpost(&[w]), Ok(1));
        if i % 3 == 2 {
            for img in f.pick_all() {
                assert_eq!(get64(&img, 0), seen);
                seen += 1;
            }
        }
    }
    f.pick_all();
}
