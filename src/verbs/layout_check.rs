//! The hand-written rxe and siw element layouts of the `no_std` codecs
//! (`provider::rxe::layout`, `provider::siw::layout`), checked field by
//! field against bindgen's output of the system's `rdma/rdma_user_rxe.h`,
//! `rdma/siw-abi.h` and `rdma/ib_user_verbs.h` (docs/spec/rxe.md §3–§5,
//! docs/spec/siw.md §2–§3). Everything here is a compile-time assertion: a header whose
//! layout differs from the codecs' fails the `verbs` build.

use core::mem::{offset_of, size_of};

use static_assertions::const_assert_eq;

use crate::provider::rxe::layout as rxe;
use crate::provider::siw::layout as siw;
use crate::sys::uverbs as k;

/// Asserts equal sizes and, for each `ours = theirs` pair of field paths,
/// equal offsets.
macro_rules! same_layout {
    ($ours:ty, $theirs:ty; $($o:ident $(. $o2:ident)* = $t:ident $(. $t2:ident)*),* $(,)?) => {
        $(
            const_assert_eq!(offset_of!($ours, $o $(. $o2)*), offset_of!($theirs, $t $(. $t2)*));
        )*
    };
}

// rxe (docs/spec/rxe.md §3): the send WQE header (its payload is a flexible array, so the
// C struct's size is the header's), the receive WQE header, the CQE.
const_assert_eq!(size_of::<rxe::RxeSendWqe>(), size_of::<k::rxe_send_wqe>());
const_assert_eq!(size_of::<rxe::RxeSendWr>(), size_of::<k::rxe_send_wr>());
const_assert_eq!(size_of::<rxe::RxeDmaInfo>(), size_of::<k::rxe_dma_info>());
const_assert_eq!(size_of::<rxe::RxeRecvWqe>(), size_of::<k::rxe_recv_wqe>());
const_assert_eq!(size_of::<rxe::RxeUverbsWc>(), size_of::<k::ib_uverbs_wc>());
same_layout!(rxe::RxeSendWr, k::rxe_send_wr;
    wr_id = wr_id,
    reserved = reserved,
    opcode = opcode,
    send_flags = send_flags,
    ex = ex,
    wr = wr,
    wr.rdma.remote_addr = wr.rdma.remote_addr,
    wr.rdma.rkey = wr.rdma.rkey,
    wr.atomic.remote_addr = wr.atomic.remote_addr,
    wr.atomic.compare_add = wr.atomic.compare_add,
    wr.atomic.swap = wr.atomic.swap,
    wr.atomic.rkey = wr.atomic.rkey,
    wr.mw.addr = wr.mw.addr,
    wr.mw.length = wr.mw.length,
    wr.mw.mr_lkey = wr.mw.mr_lkey,
    wr.mw.mw_rkey = wr.mw.mw_rkey,
    wr.mw.rkey = wr.mw.rkey,
    wr.mw.access = wr.mw.access,
);
same_layout!(rxe::RxeSendWqe, k::rxe_send_wqe;
    wr = wr,
    status = status,
    state = state,
    iova = iova,
    mask = mask,
    first_psn = first_psn,
    last_psn = last_psn,
    ack_length = ack_length,
    ssn = ssn,
    has_rd_atomic = has_rd_atomic,
    dma = dma,
);
same_layout!(rxe::RxeDmaInfo, k::rxe_dma_info;
    length = length,
    resid = resid,
    cur_sge = cur_sge,
    num_sge = num_sge,
    sge_offset = sge_offset,
    reserved = reserved,
);
same_layout!(rxe::RxeRecvWqe, k::rxe_recv_wqe;
    wr_id = wr_id,
    reserved = reserved,
    padding = padding,
    dma = dma,
);
same_layout!(rxe::RxeUverbsWc, k::ib_uverbs_wc;
    wr_id = wr_id,
    status = status,
    opcode = opcode,
    vendor_err = vendor_err,
    byte_len = byte_len,
    ex = ex,
    qp_num = qp_num,
    src_qp = src_qp,
    wc_flags = wc_flags,
    pkey_index = pkey_index,
    slid = slid,
    sl = sl,
    dlid_path_bits = dlid_path_bits,
    port_num = port_num,
    reserved = reserved,
);
same_layout!(rxe::RxeQueueHeader, k::rxe_queue_buf;
    index_mask = index_mask,
    producer_index = producer_index,
    consumer_index = consumer_index,
);

// siw (docs/spec/siw.md §2, §3).
const_assert_eq!(size_of::<siw::SiwSqe>(), size_of::<k::siw_sqe>());
const_assert_eq!(size_of::<siw::SiwRqe>(), size_of::<k::siw_rqe>());
const_assert_eq!(size_of::<siw::SiwCqe>(), size_of::<k::siw_cqe>());
const_assert_eq!(size_of::<siw::SiwCqCtrl>(), size_of::<k::siw_cq_ctrl>());
same_layout!(siw::SiwSqe, k::siw_sqe;
    id = id,
    flags = flags,
    num_sge = num_sge,
    opcode = opcode,
    rkey = rkey,
    raddr = __bindgen_anon_1.raddr,
    sge = __bindgen_anon_2.sge,
);
same_layout!(siw::SiwRqe, k::siw_rqe;
    id = id,
    flags = flags,
    num_sge = num_sge,
    opcode = opcode,
    unused = unused,
    sge = sge,
);
same_layout!(siw::SiwCqe, k::siw_cqe;
    id = id,
    flags = flags,
    opcode = opcode,
    status = status,
    bytes = bytes,
    imm_data = __bindgen_anon_1.imm_data,
    qp_id = __bindgen_anon_2.qp_id,
);
same_layout!(siw::SiwSge, k::siw_sge;
    laddr = laddr,
    length = length,
    lkey = lkey,
);
