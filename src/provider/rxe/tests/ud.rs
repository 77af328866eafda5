//! UD sends (docs/spec/rxe.md §8): the `ud` member of the WR union, the
//! opcodes UD has, and the refusals that write nothing.

use super::*;

/// A UD post (nothing dereferences the SGEs here).
fn post_ud(
    q: &mut RxeSendQueue,
    w: &[SendWr<'_>],
    d: &RxeUdDest,
) -> core::result::Result<Posted, PostError> {
    // SAFETY: the SGEs are never dereferenced in these tests.
    unsafe { q.post_ud(w, d) }
}

#[test]
fn ud_send_wqe_carries_qpn_qkey_and_ah_num() {
    let mut f = Fake::new(9, 8);
    let mut q = sq(&f, caps(2, 64, 0));
    let s = [Sge::new(0x4000, 200, 0x99)];
    let d = RxeUdDest {
        ah_num: 7,
        remote_qpn: 0x00ab_cdef,
        qkey: 0x1111_2222,
    };
    let wrs = [
        SendWr::new(1, SendOp::Send, &s, SendFlags::SIGNALED),
        SendWr::new(2, SendOp::SendImm { imm: 0x0bad_cafe }, &s, SendFlags::NONE),
    ];
    assert_eq!(
        post_ud(&mut q, &wrs, &d).unwrap(),
        Posted {
            count: 2,
            doorbell: true
        }
    );
    let slots = f.take_all();
    assert_eq!(slots.len(), 2);
    for (wr, &slot) in wrs.iter().zip(&slots) {
        let h = f.bytes(slot, 0, 208);
        assert_eq!(get64(&h, 0), wr.wr_id);
        // The union starts at 24: remote_qpn, remote_qkey, pkey_index and
        // a reserved half-word, ah_num at 12 (docs/spec/rxe.md §8).
        assert_eq!(get32(&h, 24), 0x00ab_cdef);
        assert_eq!(get32(&h, 28), 0x1111_2222);
        assert_eq!(get32(&h, 32), 0, "pkey_index and reserved");
        assert_eq!(get32(&h, 36), 7, "ah_num");
        // Padding and the in-WQE address vector stay zero.
        assert!(h[40..144].iter().all(|&b| b == 0), "WR {}", wr.wr_id);
        // No remote address for a send.
        assert_eq!(get64(&h, 152), 0);
        assert_eq!(get32(&h, 184), 200, "dma.length");
    }
    assert_eq!(get32(&f.bytes(slots[0], 0, 208), 12), 2, "SEND");
    assert_eq!(get32(&f.bytes(slots[1], 0, 208), 12), 3, "SEND_WITH_IMM");
}

#[test]
fn ud_refusals_write_nothing() {
    let f = Fake::new(9, 8);
    let mut q = sq(&f, caps(2, 64, 0));
    let s = [Sge::new(0x4000, 8, 0x99)];
    let d = RxeUdDest {
        ah_num: 3,
        remote_qpn: 5,
        qkey: 1,
    };
    for op in [
        SendOp::Write { remote: R },
        SendOp::Read { remote: R },
        SendOp::FetchAdd { remote: R, add: 1 },
        SendOp::SendInv { rkey: 4 },
        SendOp::LocalInv { rkey: 4 },
    ] {
        let e = post_ud(&mut q, &[SendWr::new(1, op, &s, SendFlags::NONE)], &d).unwrap_err();
        assert_eq!(
            e,
            PostError {
                index: 0,
                error: Error::Unsupported
            },
            "{op:?}"
        );
    }
    let send = [SendWr::new(1, SendOp::Send, &s, SendFlags::NONE)];
    let e = post_ud(&mut q, &send, &RxeUdDest { ah_num: 0, ..d }).unwrap_err();
    assert_eq!(e.error, Error::InvalidAttribute);
    let e = post_ud(
        &mut q,
        &send,
        &RxeUdDest {
            remote_qpn: 1 << 24,
            ..d
        },
    )
    .unwrap_err();
    assert_eq!(e.error, Error::InvalidQpn);
    assert_eq!(f.producer(), 0, "nothing published");
    assert_eq!(q.deferred(), 0);
}
