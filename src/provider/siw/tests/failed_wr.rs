//! Describing and finding the WQEs behind failed completions.

use super::*;

#[test]
fn describe_and_find_failed_wqes() {
    let mut f = Fake::sq(8);
    let mut q = sq(&f, caps(3, 80, 0), false);
    let s = [Sge::new(0x1000, 10, 0x11), Sge::new(0x2000, 20, 0x22)];
    let d = [7u8; 24];
    let dp: [&[u8]; 1] = [&d];
    let wrs = [
        SendWr::new(1, SendOp::Write { remote: R }, &s, SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Read { remote: R }, &s[1..], SendFlags::SIGNALED),
        SendWr::new(3, SendOp::SendInv { rkey: 0x99 }, &s[..1], SendFlags::NONE),
        SendWr::inline(4, SendOp::Write { remote: R }, &dp, SendFlags::NONE),
    ];
    q.tpost(&wrs).unwrap();
    // Not picked up yet: not searched. The inline one is described as
    // inline from its flags.
    assert_eq!(q.find(1), None);
    assert!(q.describe(3).inline);
    f.pick_all();
    let expect = [
        FailedWr {
            wr_id: 1,
            opcode: WcOpcode::RDMA_WRITE,
            local_addr: 0x1000,
            length: 30,
            lkey: 0x11,
            remote_addr: R.addr,
            rkey: R.rkey,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 2,
            opcode: WcOpcode::RDMA_READ,
            local_addr: 0x2000,
            length: 20,
            lkey: 0x22,
            remote_addr: R.addr,
            rkey: R.rkey,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 3,
            opcode: WcOpcode::SEND,
            local_addr: 0x1000,
            length: 10,
            lkey: 0x11,
            ..FailedWr::default()
        },
        // Flags cleared by the pickup: still recognised as inline.
        FailedWr {
            wr_id: 4,
            opcode: WcOpcode::RDMA_WRITE,
            length: 24,
            remote_addr: R.addr,
            rkey: R.rkey,
            inline: true,
            ..FailedWr::default()
        },
    ];
    for (i, e) in expect.iter().enumerate() {
        assert_eq!(q.find(e.wr_id), Some(i as u32));
        assert_eq!(q.describe(i as u32), *e);
    }
    assert_eq!(q.find(42), None);
    let wc = Wc {
        wr_id: 2,
        status: WcStatus::REM_ACCESS_ERR,
        vendor_err: 7,
        ..Wc::default()
    };
    let fw = q.failed_wr(1, &wc);
    assert_eq!(
        (fw.status, fw.vendor_err, fw.rkey),
        (WcStatus::REM_ACCESS_ERR, 7, R.rkey)
    );
    // Garbage slots stay in bounds.
    f.put_bytes(5, 0, &[0xff; 8]);
    f.put_bytes(5, 12, &[0xff; 108]);
    f.word(5).store(u32::MAX, Ordering::Relaxed);
    let _ = q.describe(5);
    let _ = q.describe(u32::MAX);

    // Receive side.
    let mut f = Fake::rq(4);
    let c = caps(0, 0, 2);
    // SAFETY: our buffer.
    let mut r = unsafe { SiwRecvQueue::new(f.ptr(), f.len(), 4, &c) }.unwrap();
    // SAFETY: SGEs never dereferenced.
    unsafe {
        r.post(&[RecvWr {
            wr_id: 42,
            sges: &s,
        }])
    }
    .unwrap();
    assert_eq!(r.find(42), None);
    f.pick_all();
    let sl = r.find(42).unwrap();
    assert_eq!(
        r.describe(sl),
        FailedWr {
            wr_id: 42,
            recv: true,
            opcode: WcOpcode::RECV,
            local_addr: 0x1000,
            length: 30,
            lkey: 0x11,
            ..FailedWr::default()
        }
    );
    let wc = Wc {
        wr_id: 42,
        status: WcStatus::WR_FLUSH_ERR,
        ..Wc::default()
    };
    assert_eq!(r.failed_wr(sl, &wc).status, WcStatus::WR_FLUSH_ERR);
}
