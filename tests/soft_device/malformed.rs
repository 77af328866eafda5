use super::*;
use rdma_direct::mmio;
use rdma_direct::provider::mlx5::{CompletionQueue, CqRoute, QpQueues};

struct NoRoute;
impl CqRoute for NoRoute {
    fn route(&mut self, _: u32) -> Option<QpQueues<'_>> {
        None
    }
}

fn run_raw(wqe: &[u8], fix_index_and_qpn: bool) -> [u8; 64] {
    let dev = SoftDevice::new(SoftConfig::default());
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256).unwrap();
    let q = dev
        .create_qp(pd, cq.cqn, cq.cqn, &QpInit::default())
        .unwrap();
    let q2 = dev
        .create_qp(pd, cq.cqn, cq.cqn, &QpInit::default())
        .unwrap();
    for (me, peer) in [(q.qpn, q2.qpn), (q2.qpn, q.qpn)] {
        dev.modify_qp(me, &QpModify::to(QpState::Init)).unwrap();
        dev.modify_qp(
            me,
            &QpModify {
                dest_qpn: peer,
                ..QpModify::to(QpState::Rtr)
            },
        )
        .unwrap();
        dev.modify_qp(me, &QpModify::to(QpState::Rts)).unwrap();
    }
    let mut bytes = wqe.to_vec();
    if fix_index_and_qpn {
        let w1 = u32::from_be_bytes(bytes[4..8].try_into().unwrap());
        bytes[4..8].copy_from_slice(&((q.qpn << 8) | (w1 & 0xff)).to_be_bytes());
    }
    // SAFETY: the ring is at least 64 BBs; nothing else writes it.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), q.dv.sq_buf, bytes.len()) };
    let nbb = bytes.len().div_ceil(64) as u32;
    // SAFETY: the SQ word of the QP's doorbell record.
    unsafe { mmio::write_dbrec(q.dv.dbrec.add(1), nbb) };
    dev.run_until_idle(8);
    let mut out = [0u8; 64];
    // SAFETY: the CQ buffer is live; the entry was written by the
    // device (checked through its opcode below).
    // SAFETY: the queues live over memory this test owns; SGE addresses point at test buffers or are never dereferenced.
    unsafe { core::ptr::copy_nonoverlapping(cq.dv.buf, out.as_mut_ptr(), 64) };
    // The consumer polls through the core and must see a corrupt CQE
    // for work it never posted: nothing of this QP is routed.
    // SAFETY: the descriptor is the device's live CQ.
    let mut c = unsafe { CompletionQueue::from_raw(&cq.dv) }.unwrap();
    let mut wc = [rdma_direct::provider::mlx5::Wc::default(); 1];
    assert_eq!(c.poll(&mut NoRoute, &mut wc), Ok(0));
    assert_eq!(c.stale_cqes(), 1);
    out
}

fn ctrl(op: u8, ds: u8, fm_ce_se: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[3] = op;
    c[7] = ds;
    c[11] = fm_ce_se;
    c
}

fn expect_err(cqe: &[u8; 64], synd: u8) {
    assert_eq!(cqe[63] >> 4, 13, "REQ_ERR CQE");
    assert_eq!(cqe[55], synd, "syndrome");
}

#[test]
fn bad_ds_zero() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x0a, 0, 0x08));
    expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
}

#[test]
fn ds_larger_than_posted() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x0a, 9, 0x08)); // 3 BBs, 1 posted
    expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
}

#[test]
fn unknown_opcode() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x77, 1, 0x08));
    expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
}

#[test]
fn wrong_qpn_and_wrong_index() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x00, 1, 0x08));
    w[4] = 0x55; // QPN 0x550000: not this QP
    expect_err(&run_raw(&w, false), syndrome::LOCAL_QP_OP);
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x00, 1, 0x08));
    w[2] = 7; // WQE index 7 at producer 0
    expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
}

#[test]
fn bad_lkey() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x0a, 2, 0x08));
    w[16..20].copy_from_slice(&8u32.to_be_bytes());
    w[20..24].copy_from_slice(&0x4242_4200u32.to_be_bytes());
    w[24..32].copy_from_slice(&0x1000u64.to_be_bytes());
    expect_err(&run_raw(&w, true), syndrome::LOCAL_PROT);
}

#[test]
fn inline_length_inconsistent_with_ds() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x08, 3, 0x08));
    w[32..36].copy_from_slice(&(0x8000_0000u32 | 40).to_be_bytes()); // needs 3 octowords
    expect_err(&run_raw(&w, true), syndrome::LOCAL_LENGTH);
}

#[test]
fn atomic_without_8_byte_data() {
    let mut w = vec![0u8; 64];
    w[..16].copy_from_slice(&ctrl(0x12, 4, 0x08));
    w[48..52].copy_from_slice(&4u32.to_be_bytes());
    w[52..56].copy_from_slice(&0x100u32.to_be_bytes());
    expect_err(&run_raw(&w, true), syndrome::LOCAL_QP_OP);
}
