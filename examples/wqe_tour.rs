//! A tour of the mlx5 direct data path on plain memory: posts one WR of
//! every opcode into a send queue laid out exactly as a ConnectX QP's,
//! rings the doorbell (record + 8-byte doorbell or BlueFlame), prints the
//! WQE bytes as the device would read them, then feeds completions back
//! through the CQ poller.
//!
//! Run: `cargo run --release --example wqe_tour`

use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::{decode_wqe, FakeGeometry, FakeMlx5};
use rdma_direct::*;

fn hex(b: &[u8]) -> String {
    b.chunks(4)
        .map(|w| w.iter().map(|x| format!("{x:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<()> {
    let mut dev = FakeMlx5::new(FakeGeometry {
        sq_wqe_cnt: 16,
        ..FakeGeometry::default()
    });
    let caps = QpCaps {
        max_send_sge: 4,
        max_inline_data: 60,
        max_recv_sge: 4,
    };
    let sq = dev.send_queue(caps, SqConfig::default())?;
    let rq = dev.recv_queue(caps)?;
    let mut cq = dev.completion_queue()?;
    let mut qp = Mlx5Qp { sq, rq };

    let local = [Sge::new(0x7f00_0000_1000, 4096, 0xa1b2c3)];
    let atomic_dst = [Sge::new(0x7f00_0000_2000, 8, 0xa1b2c3)];
    let remote = Remote::new(0x7e00_1122_0000, 0x0bad_cafe);
    let hello: [&[u8]; 1] = [b"hello, rdma"];
    let wrs = [
        SendWr::new(1, SendOp::Send, &local, SendFlags::SIGNALED),
        SendWr::new(
            2,
            SendOp::SendImm { imm: 0xdead_beef },
            &local,
            SendFlags::SIGNALED,
        ),
        SendWr::new(3, SendOp::Write { remote }, &local, SendFlags::NONE),
        SendWr::inline(4, SendOp::Write { remote }, &hello, SendFlags::SIGNALED),
        SendWr::new(
            5,
            SendOp::WriteImm { remote, imm: 7 },
            &local,
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            6,
            SendOp::Read { remote },
            &local,
            SendFlags::SIGNALED | SendFlags::FENCE,
        ),
        SendWr::new(
            7,
            SendOp::CompareSwap {
                remote,
                compare: 0,
                swap: 1,
            },
            &atomic_dst,
            SendFlags::SIGNALED,
        ),
        SendWr::new(
            8,
            SendOp::FetchAdd { remote, add: 1 },
            &atomic_dst,
            SendFlags::SIGNALED,
        ),
    ];
    println!(
        "posting {} WRs with one doorbell (QPN {:#x}, SQ {} BBs)",
        wrs.len(),
        qp.sq.qpn(),
        qp.sq.wqe_cnt()
    );
    let mut starts = Vec::new();
    for wr in &wrs {
        starts.push(qp.sq.producer());
        // SAFETY: the addresses are never dereferenced: nothing but this
        // program reads the fake queue memory.
        // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
        unsafe { qp.sq.post(wr)? };
    }
    qp.sq.ring();
    for (wr, start) in wrs.iter().zip(&starts) {
        let slot = start % qp.sq.wqe_cnt();
        let d = decode_wqe(dev.sq_bytes(), slot).expect("decodes");
        println!(
            "  wr_id {} -> slot {slot:2} opcode {:#04x} ds {:2} fm_ce_se {:#04x}  {}",
            wr.wr_id,
            d.opcode,
            d.ds,
            d.fm_ce_se,
            hex(&dev.sq_bytes()[slot as usize * 64..slot as usize * 64 + 16])
        );
    }
    println!(
        "doorbell record (SQ) = {:#x}; doorbell register got the last WQE's first 8 bytes: {}",
        dev.dbrec_sq(),
        hex(&dev.bf.bytes()[..8])
    );

    // One bad WR: a typed error, nothing written.
    let bad = SendWr::new(
        9,
        SendOp::FetchAdd {
            remote: Remote::new(0x1004, 1),
            add: 1,
        },
        &atomic_dst,
        SendFlags::NONE,
    );
    // SAFETY: as above.
    match unsafe { qp.sq.post(&bad) } {
        Err(e) => println!("misaligned atomic refused: {e}"),
        Ok(()) => unreachable!("validation must refuse a misaligned atomic"),
    }

    // The "device" completes the last WQE: one CQE retires all eight.
    let mut cqe = [0u8; 64];
    let last = *starts.last().unwrap() as u16;
    cqe[44..48].copy_from_slice(&8u32.to_be_bytes());
    cqe[56..60].copy_from_slice(&(0x1200_0000u32 | qp.sq.qpn()).to_be_bytes());
    cqe[60..62].copy_from_slice(&last.to_be_bytes());
    dev.write_cqe(0, &cqe);
    let mut wc = [Wc::default(); 8];
    let n = cq.poll(&mut qp, &mut wc)?;
    for w in &wc[..n] {
        println!(
            "completion: wr_id {} status {} opcode {} byte_len {}",
            w.wr_id, w.status.0, w.opcode.0, w.byte_len
        );
    }
    println!(
        "SQ free after one CQE: {} of {} BBs",
        qp.sq.free_bbs(),
        qp.sq.wqe_cnt()
    );
    Ok(())
}
