//! Describing and finding the WQEs behind failed completions.

use super::*;

#[test]
fn describe_and_find_failed_wqes() {
    let mut f = Fake::new(9, 8);
    let mut q = sq(&f, caps(3, 64, 0));
    let s = [Sge::new(0x1000, 10, 0x11), Sge::new(0x2000, 20, 0x22)];
    let s8 = [Sge::new(0x3000, 8, 0x33)];
    let data = [1u8; 24];
    let d: [&[u8]; 1] = [&data];
    let fa = Remote::new(0x9000, 0x99);
    let wrs = [
        SendWr::new(1, SendOp::Write { remote: R }, &s, SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Read { remote: R }, &s[1..], SendFlags::SIGNALED),
        SendWr::new(
            3,
            SendOp::FetchAdd { remote: fa, add: 1 },
            &s8,
            SendFlags::NONE,
        ),
        SendWr::inline(4, SendOp::Send, &d, SendFlags::NONE),
        SendWr::new(5, SendOp::SendImm { imm: 1 }, &[], SendFlags::NONE),
    ];
    q.tpost(&wrs).unwrap();
    assert_eq!(q.find(1), None, "outstanding WQEs are not searched");
    let slots = f.take_all();
    // The kernel scribbles its scratch fields (status, PSNs, cursors,
    // iova) while executing; describe reads none of them.
    for &sl in &slots {
        f.put_bytes(sl, 144, &[0xee; 40]);
        f.put_bytes(sl, 188, &[0xee; 4]);
        f.put_bytes(sl, 192, &[0xee; 4]);
        f.put_bytes(sl, 200, &[0xee; 4]);
    }
    f.complete_to(f.kidx);
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
            opcode: WcOpcode::FETCH_ADD,
            local_addr: 0x3000,
            length: 8,
            lkey: 0x33,
            remote_addr: fa.addr,
            rkey: fa.rkey,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 4,
            opcode: WcOpcode::SEND,
            length: 24,
            inline: true,
            ..FailedWr::default()
        },
        FailedWr {
            wr_id: 5,
            opcode: WcOpcode::SEND,
            ..FailedWr::default()
        },
    ];
    for (e, &sl) in expect.iter().zip(&slots) {
        assert_eq!(q.find(e.wr_id), Some(sl));
        assert_eq!(q.describe(sl), *e);
    }
    assert_eq!(q.find(77), None);
    let wc = Wc {
        wr_id: 2,
        status: WcStatus::REM_ACCESS_ERR,
        vendor_err: 9,
        ..Wc::default()
    };
    let fw = q.failed_wr(slots[1], &wc);
    assert_eq!(
        (fw.status, fw.vendor_err, fw.remote_addr),
        (WcStatus::REM_ACCESS_ERR, 9, R.addr)
    );
    // Describing any slot, even garbage, stays in bounds.
    f.put_bytes(7, 0, &[0xff; 256]);
    let _ = q.describe(7);
    let _ = q.describe(u32::MAX);

    // Receive side.
    let mut f = Fake::new(7, 4);
    let c = caps(0, 0, 2);
    // SAFETY: our buffer.
    let mut r = unsafe { RxeRecvQueue::new(f.ptr(), f.len(), &c) }.unwrap();
    let rw = RecvWr {
        wr_id: 42,
        sges: &s,
    };
    r.tpost(&[rw]).unwrap();
    assert_eq!(r.find(42), None);
    f.consume_all();
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
        status: WcStatus::LOC_LEN_ERR,
        ..Wc::default()
    };
    assert_eq!(r.failed_wr(sl, &wc).status, WcStatus::LOC_LEN_ERR);
}
