//! A tour of the mlx5 direct data path on plain memory: posts one WR of
//! every opcode into a send queue laid out exactly as a ConnectX QP's,
//! rings the doorbell (record + 8-byte doorbell or BlueFlame), prints the
//! WQE bytes as the device would read them, then feeds completions back
//! through the CQ poller.
//!
//! Run: `cargo run --release --example wqe_tour`

use rdma_direct::provider::mlx5::layout::{ctrl_flags, opcode};
use rdma_direct::provider::mlx5::*;
use rdma_direct::testutil::{decode_wqe, FakeGeometry, FakeMlx5};
use rdma_direct::*;

/// The name of an mlx5 send opcode (`MLX5_OPCODE_*` in `mlx5dv.h`).
fn opcode_name(op: u8) -> &'static str {
    match op {
        opcode::NOP => "NOP",
        opcode::SEND_INVAL => "SEND_INVAL",
        opcode::RDMA_WRITE => "RDMA_WRITE",
        opcode::RDMA_WRITE_IMM => "RDMA_WRITE_IMM",
        opcode::SEND => "SEND",
        opcode::SEND_IMM => "SEND_IMM",
        opcode::RDMA_READ => "RDMA_READ",
        opcode::ATOMIC_CS => "ATOMIC_CS",
        opcode::ATOMIC_FA => "ATOMIC_FA",
        _ => "?",
    }
}

/// The control segment's fence/completion/solicited byte in words.
fn flag_names(fm_ce_se: u8) -> String {
    let mut v = Vec::new();
    if fm_ce_se & ctrl_flags::FENCE != 0 {
        v.push("fence");
    }
    if fm_ce_se & ctrl_flags::INITIATOR_SMALL_FENCE != 0 {
        v.push("small fence");
    }
    if fm_ce_se & ctrl_flags::CQ_UPDATE != 0 {
        v.push("signaled");
    }
    if fm_ce_se & ctrl_flags::SOLICITED != 0 {
        v.push("solicited");
    }
    if v.is_empty() {
        "unsignaled".into()
    } else {
        v.join("+")
    }
}

/// The name of a completion opcode (`IBV_WC_*` numbering).
fn wc_opcode_name(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::SEND => "SEND",
        WcOpcode::RDMA_WRITE => "RDMA_WRITE",
        WcOpcode::RDMA_READ => "RDMA_READ",
        WcOpcode::COMP_SWAP => "COMP_SWAP",
        WcOpcode::FETCH_ADD => "FETCH_ADD",
        WcOpcode::BIND_MW => "BIND_MW",
        WcOpcode::LOCAL_INV => "LOCAL_INV",
        WcOpcode::RECV => "RECV",
        _ => "?",
    }
}

fn hex(b: &[u8]) -> String {
    b.chunks(4)
        .map(|w| w.iter().map(|x| format!("{x:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<()> {
    if std::env::args().len() > 1 {
        // Exit status 2, as every example for a bad command line.
        eprintln!("usage: wqe_tour (no arguments)");
        std::process::exit(2);
    }
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
        "Posting {} WRs with one doorbell: QP number {:#x}, send queue of {} basic blocks (BBs) of 64 bytes.",
        wrs.len(),
        qp.sq.qpn(),
        qp.sq.wqe_cnt()
    );
    println!("The software never touches a device here: the queues are plain memory laid out as a");
    println!("ConnectX QP's, and the bytes below are what the NIC would read (big-endian words).");
    println!();
    let mut starts = Vec::new();
    for wr in &wrs {
        starts.push(qp.sq.producer());
        // SAFETY: the queues live over memory this program owns; the SGE
        // addresses are never dereferenced (nothing but this program reads
        // the fake queue memory).
        unsafe { qp.sq.post(wr)? };
    }
    qp.sq.ring();
    println!(
        " {:>5}  {:>4}  {:<21} {:>2}  {:<16}  control segment (16 bytes)",
        "wr_id", "slot", "opcode", "DS", "flags"
    );
    for (wr, start) in wrs.iter().zip(&starts) {
        let slot = start % qp.sq.wqe_cnt();
        let d = decode_wqe(dev.sq_bytes(), slot).expect("decodes");
        let op = format!("{} ({:#04x})", opcode_name(d.opcode), d.opcode);
        println!(
            " {:>5}  {slot:>4}  {op:<21} {:>2}  {:<16}  {}",
            wr.wr_id,
            d.ds,
            flag_names(d.fm_ce_se),
            hex(&dev.sq_bytes()[slot as usize * 64..slot as usize * 64 + 16])
        );
    }
    println!();
    println!(
        "Reading a control segment: word 0 = WQE index << 8 | opcode; word 1 = QP number << 8 |"
    );
    println!(
        "DS, the WQE's size in 16-byte units (control 1, remote address 1, atomic 1, each data"
    );
    println!("segment 1, inline data rounded up); word 2 = fence/completion/solicited flags");
    println!("(0x80 fence, 0x08 signaled, 0x02 solicited); word 3 = immediate data (SEND_IMM,");
    println!("RDMA_WRITE_IMM). Layouts: docs/spec/mlx5.md §3-§5.");
    println!();
    println!(
        "Doorbell record (send): {:#x}, the producer counter in BBs after {} one-BB WQEs.",
        dev.dbrec_sq(),
        wrs.len()
    );
    println!(
        "Doorbell register: the last WQE's first 8 bytes, {} (one 8-byte write; docs/spec/mlx5.md §7).",
        hex(&dev.bf.bytes()[..8])
    );
    println!();

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
        Err(e) => println!(
            "A FETCH_AND_ADD to a misaligned address is refused before anything is written: {e}"
        ),
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
    println!();
    println!("The device writes one CQE, for the last WQE only (slot 7, signaled):");
    for w in &wc[..n] {
        let status = if w.status == WcStatus::SUCCESS {
            "success"
        } else {
            "error"
        };
        println!(
            "  completion: wr_id {}, status {} ({status}), opcode {} ({}), byte_len {}",
            w.wr_id,
            w.status.0,
            wc_opcode_name(w.opcode),
            w.opcode.0,
            w.byte_len
        );
    }
    println!(
        "It retires every earlier WQE too, signaled or not: send queue free {} of {} BBs.",
        qp.sq.free_bbs(),
        qp.sq.wqe_cnt()
    );
    Ok(())
}
