//! The uverbs queue layer (`verbs::uverbs`) on the kernel's rxe and siw
//! devices: CQs and QPs created with our own write() commands, their rings
//! mapped, state changes through MODIFY_QP, the empty POST_SEND doorbell,
//! and on rxe one RDMA WRITE written into the SQ ring by hand and its
//! completion polled from the CQ ring by hand.
//!
//! On a host without RDMA devices every test prints "NOT RUN: no rxe/siw
//! device" and passes; inside the test VM (`IN_RDMA_VM=1`, `RXE_DEV`,
//! `SIW_DEV`, `RXE_GID_INDEX`) a missing device is a failure.
//!
//! siw cannot connect a QP to itself without rdma_cm, so on siw the tests
//! stop at INIT: creation, mappings, the doorbell's refusal before RTS,
//! destruction.
#![cfg(feature = "verbs")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdma_direct::api::{Access, AddressVector, Backend, QpInit, QpModify, QpState};
use rdma_direct::verbs::uverbs::{
    AsyncEvents, CompChannel, Kind, RingView, UverbsCq, UverbsQp, RXE_DATA_OFFSET,
};
use rdma_direct::verbs::VerbsDevice;
use rdma_direct::Error;
use rdma_sys as ibv;

fn in_vm() -> bool {
    std::env::var("IN_RDMA_VM").as_deref() == Ok("1")
}

/// The devices to test, from `RXE_DEV` and `SIW_DEV`.
fn devices(test: &str) -> Vec<(String, Kind)> {
    let mut v = Vec::new();
    for (var, kind) in [("RXE_DEV", Kind::Rxe), ("SIW_DEV", Kind::Siw)] {
        if let Ok(d) = std::env::var(var) {
            v.push((d, kind));
        }
    }
    if v.is_empty() {
        assert!(
            !in_vm(),
            "{test}: IN_RDMA_VM=1 but RXE_DEV/SIW_DEV are not set"
        );
        eprintln!("{test}: NOT RUN: no rxe/siw device");
    }
    v
}

/// An open device with a libibverbs PD (the uverbs layer takes its handle).
struct Env {
    dev: VerbsDevice,
    ctx: *mut ibv::ibv_context,
    pd: *mut ibv::ibv_pd,
    kind: Kind,
}

impl Env {
    fn open(name: &str, kind: Kind) -> Env {
        let dev = VerbsDevice::open_named(name).expect("open device");
        let ctx = dev.context();
        // SAFETY: the device's live context.
        assert_eq!(unsafe { Kind::detect(ctx) }, Some(kind), "{name}");
        // SAFETY: live context.
        let pd = unsafe { ibv::ibv_alloc_pd(ctx) };
        assert!(!pd.is_null(), "ibv_alloc_pd");
        Env { dev, ctx, pd, kind }
    }

    fn pd_handle(&self) -> u32 {
        // SAFETY: live PD.
        unsafe { (*self.pd).handle }
    }

    fn cq(&self, entries: u32, ch: Option<&CompChannel>, user: u64) -> Result<UverbsCq, Error> {
        // SAFETY: the context stays open while `self` lives; every CQ is
        // dropped before `self` in these tests.
        unsafe { UverbsCq::create(self.ctx, self.kind, entries, ch.map(|c| c.fd()), user) }
    }

    fn qp(&self, cq: &UverbsCq, caps: &QpInit, user: u64) -> Result<UverbsQp, Error> {
        // SAFETY: as for `cq`.
        unsafe {
            UverbsQp::create(
                self.ctx,
                self.kind,
                self.pd_handle(),
                cq,
                cq,
                caps,
                false,
                user,
            )
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // SAFETY: the PD, with every raw object and MR on it gone.
        let r = unsafe { ibv::ibv_dealloc_pd(self.pd) };
        if !std::thread::panicking() {
            assert_eq!(r, 0, "ibv_dealloc_pd");
        }
    }
}

/// A registered buffer.
struct Mr {
    mr: *mut ibv::ibv_mr,
    buf: Vec<u8>,
}

impl Mr {
    fn new(env: &Env, len: usize, access: Access) -> Mr {
        let mut buf = vec![0u8; len];
        // SAFETY: live PD; `buf` outlives the registration (dropped after
        // deregistration in `Drop`).
        let mr = unsafe { ibv::ibv_reg_mr(env.pd, buf.as_mut_ptr().cast(), len, access.0 as i32) };
        assert!(!mr.is_null(), "ibv_reg_mr");
        Mr { mr, buf }
    }
    fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr).rkey }
    }
    fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: live MR, deregistered once.
        unsafe { ibv::ibv_dereg_mr(self.mr) };
    }
}

/// Mappings of uverbs device files in this process (`/proc/self/maps`).
fn uverbs_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains("/dev/infiniband/uverbs"))
        .count()
}

fn page() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn page_round(n: usize) -> usize {
    n.div_ceil(page()) * page()
}

/// A u32 of a ring, as an atomic (the rings' shared index words).
fn word(r: &RingView, off: usize) -> &AtomicU32 {
    assert!(off + 4 <= r.len && off % 4 == 0);
    // SAFETY: in bounds of the live mapping, 4-aligned; the kernel accesses
    // these words atomically (smp_load_acquire/smp_store_release).
    unsafe { AtomicU32::from_ptr(r.ptr.as_ptr().add(off).cast()) }
}

/// Checks an rxe ring's header against its view.
fn check_rxe_ring(what: &str, r: &RingView, min_capacity: u32) {
    let log2 = word(r, 0).load(Ordering::Relaxed);
    let mask = word(r, 4).load(Ordering::Relaxed);
    eprintln!(
        "rxe {what}: len {}, log2_elem_size {log2}, index_mask {mask}, slots {}, elem {}",
        r.len, r.slots, r.elem_size
    );
    assert!((6..=12).contains(&log2), "{what}: log2_elem_size {log2}");
    assert!((mask + 1).is_power_of_two(), "{what}: index_mask {mask}");
    assert_eq!(r.slots, mask + 1);
    assert_eq!(r.capacity, mask);
    assert_eq!(r.elem_size, 1 << log2);
    assert_eq!(r.data_offset, RXE_DATA_OFFSET);
    assert!(
        r.capacity >= min_capacity,
        "{what}: {} < {min_capacity}",
        r.capacity
    );
    assert!(RXE_DATA_OFFSET + (r.slots as usize) * (r.elem_size as usize) <= r.len);
    assert_eq!(r.len % page(), 0);
    // Empty at creation.
    assert_eq!(word(r, 128).load(Ordering::Acquire), 0, "{what}: producer");
    assert_eq!(word(r, 256).load(Ordering::Acquire), 0, "{what}: consumer");
}

/// Checks a siw ring: a power-of-two count, a page-rounded mapping of
/// exactly `count * elem + extra` bytes, every element free.
fn check_siw_ring(what: &str, r: &RingView, want: u32, elem: u32, extra: usize) {
    eprintln!(
        "siw {what}: len {}, slots {}, elem {}",
        r.len, r.slots, r.elem_size
    );
    assert!(
        r.slots.is_power_of_two() && r.slots >= want,
        "{what}: {}",
        r.slots
    );
    assert_eq!(r.capacity, r.slots);
    assert_eq!(r.elem_size, elem);
    assert_eq!(r.data_offset, 0);
    assert_eq!(r.len, page_round(r.slots as usize * elem as usize + extra));
    // SAFETY: the whole mapping is readable while the object lives.
    let bytes = unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) };
    assert!(bytes.iter().all(|&b| b == 0), "{what}: not zeroed");
}

const CAPS: QpInit = QpInit {
    max_send_wr: 64,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
    srq: None,
};

#[test]
fn create_map_and_destroy() {
    for (name, kind) in devices("create_map_and_destroy") {
        let env = Env::open(&name, kind);
        let cq = env.cq(32, None, 0xc0).expect("create CQ");
        let qp = env.qp(&cq, &CAPS, 0x90).expect("create QP");
        eprintln!(
            "{name}: cq handle {} (kernel cqe {}), qp handle {} qpn {} caps {:?}",
            cq.handle(),
            cq.kernel_cqe(),
            qp.handle(),
            qp.qp_num(),
            qp.caps()
        );
        assert_eq!(cq.kind(), kind);
        assert_eq!(cq.user_handle(), 0xc0);
        assert_eq!(qp.user_handle(), 0x90);
        assert_ne!(qp.qp_num(), 0);
        let cring = cq.ring().expect("CQ ring");
        assert_eq!(cring.ptr.as_ptr(), cq.ring_ptr());
        assert_eq!(cring.len, cq.ring_len());
        let sq = qp.sq().expect("SQ ring");
        let rq = qp.rq().expect("RQ ring");
        assert_eq!((sq.ptr.as_ptr(), sq.len), (qp.sq_ptr(), qp.sq_len()));
        assert_eq!((rq.ptr.as_ptr(), rq.len), (qp.rq_ptr(), qp.rq_len()));
        match kind {
            Kind::Rxe => {
                // docs/spec/kernels.md: a CQ asked for 32 holds 63; the rings hold at least
                // what was asked.
                check_rxe_ring("CQ", &cring, 32);
                assert_eq!(cq.entries(), cring.capacity);
                check_rxe_ring("SQ", &sq, CAPS.max_send_wr);
                check_rxe_ring("RQ", &rq, CAPS.max_recv_wr);
                // 208-byte WQE header + one 16-byte SGE → 256-byte slots.
                assert!(sq.elem_size >= 224);
            }
            Kind::Siw => {
                assert_eq!(cq.entries(), 32);
                check_siw_ring("CQ", &cring, 32, 32, 8);
                check_siw_ring("SQ", &sq, CAPS.max_send_wr, 120, 0);
                check_siw_ring("RQ", &rq, CAPS.max_recv_wr, 112, 0);
                // siw CQEs carry the driver's QP id, which is the QPN.
                assert_eq!(qp.driver_id(), qp.qp_num());
            }
        }
        // Before RTS the doorbell is refused with a typed error (rxe EINVAL,
        // siw ENOTCONN).
        assert_eq!(qp.doorbell(), Err(Error::InvalidQpState));
        let caps = env.dev.caps();
        let init = QpModify {
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            port_num: 1,
            ..QpModify::to(QpState::Init)
        };
        match kind {
            Kind::Rxe => qp.modify(&init, &caps).expect("RESET -> INIT"),
            Kind::Siw => {
                // What rdma_init_qp_attr hands an iWARP QP (docs/spec/kernels.md siw flow
                // step 4): the state and access flags only.
                // SAFETY: all-zero is a valid ibv_qp_attr.
                let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
                a.qp_state = ibv::ibv_qp_state::IBV_QPS_INIT;
                a.qp_access_flags = init.access.0;
                let mask = ibv::ibv_qp_attr_mask::IBV_QP_STATE.0
                    | ibv::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
                qp.modify_raw(&a, mask).expect("RESET -> INIT (raw)");
            }
        }
        assert_eq!(qp.doorbell(), Err(Error::InvalidQpState));
        eprintln!(
            "{name}: doorbell before RTS: {:?}",
            rdma_direct::verbs::last_error()
        );
        qp.modify(&QpModify::to(QpState::Error), &caps)
            .expect("INIT -> ERR");
        qp.modify(&QpModify::to(QpState::Reset), &caps)
            .expect("ERR -> RESET");
        // Arming by command is rxe's only way; siw arms in shared memory
        // (its kernel refuses the command), so the layer refuses it first.
        match kind {
            Kind::Rxe => {
                cq.req_notify(false).expect("REQ_NOTIFY_CQ");
                cq.req_notify(true).expect("REQ_NOTIFY_CQ solicited");
            }
            Kind::Siw => assert_eq!(cq.req_notify(false), Err(Error::Unsupported)),
        }
        // A CQ still used by a QP cannot go first... so the QP goes first.
        qp.destroy().expect("DESTROY_QP");
        cq.destroy().expect("DESTROY_CQ");
    }
}

#[test]
fn siw_without_receive_queue_maps_no_rq() {
    for (name, kind) in devices("siw_without_receive_queue_maps_no_rq") {
        if kind != Kind::Siw {
            continue;
        }
        let env = Env::open(&name, kind);
        let before = uverbs_maps();
        let cq = env.cq(16, None, 1).unwrap();
        let caps = QpInit {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..CAPS
        };
        let qp = env.qp(&cq, &caps, 2).expect("QP without RQ");
        assert!(qp.rq().is_none());
        assert!(qp.rq_ptr().is_null());
        assert_eq!(uverbs_maps(), before + 2, "CQ and SQ only");
        drop(qp);
        drop(cq);
        assert_eq!(uverbs_maps(), before);
    }
}

/// Writes one signaled RDMA WRITE into an rxe SQ (docs/spec/rxe.md §3) and
/// publishes it (docs/spec/rxe.md §2: release-store of the masked producer index).
fn rxe_post_write(sq: &RingView, wr_id: u64, src: &Mr, dst: &Mr, len: u32) {
    let prod = word(sq, 128).load(Ordering::Relaxed);
    let cons = word(sq, 256).load(Ordering::Acquire);
    let mask = sq.slots - 1;
    assert_ne!((prod + 1) & mask, cons, "SQ full");
    let off = sq.data_offset + (prod as usize) * (sq.elem_size as usize);
    assert!(off + sq.elem_size as usize <= sq.len);
    // SAFETY: the slot is in bounds and owned by us (prod is ours, the
    // kernel reads it only after the index store below).
    let wqe =
        unsafe { std::slice::from_raw_parts_mut(sq.ptr.as_ptr().add(off), sq.elem_size as usize) };
    wqe.fill(0);
    let mut put = |at: usize, bytes: &[u8]| wqe[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &wr_id.to_ne_bytes()); // wr.wr_id
    put(12, &0u32.to_ne_bytes()); // wr.opcode: IB_UVERBS_WR_RDMA_WRITE
    put(16, &2u32.to_ne_bytes()); // wr.send_flags: IBV_SEND_SIGNALED
    put(24, &dst.addr().to_ne_bytes()); // wr.rdma.remote_addr
    put(32, &dst.rkey().to_ne_bytes()); // wr.rdma.rkey
    put(148, &0u32.to_ne_bytes()); // state: posted
    put(152, &dst.addr().to_ne_bytes()); // iova
    put(184, &len.to_ne_bytes()); // dma.length
    put(188, &len.to_ne_bytes()); // dma.resid
    put(196, &1u32.to_ne_bytes()); // dma.num_sge
    put(208, &src.addr().to_ne_bytes()); // sge[0].addr
    put(216, &len.to_ne_bytes()); // sge[0].length
    put(220, &src.lkey().to_ne_bytes()); // sge[0].lkey
    word(sq, 128).store((prod + 1) & mask, Ordering::Release);
}

/// A CQE read from an rxe CQ ring (`struct ib_uverbs_wc`, docs/spec/rxe.md §5).
#[derive(Debug)]
struct RxeCqe {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    qp_num: u32,
}

/// Polls an rxe CQ ring until one CQE arrives (or `timeout`).
fn rxe_poll_one(cq: &RingView, timeout: Duration) -> Option<RxeCqe> {
    let t0 = Instant::now();
    loop {
        let prod = word(cq, 128).load(Ordering::Acquire);
        let cons = word(cq, 256).load(Ordering::Relaxed);
        if prod != cons {
            let off = cq.data_offset + (cons as usize) * (cq.elem_size as usize);
            assert!(off + 48 <= cq.len);
            // SAFETY: a published slot (acquire above), in bounds; read
            // before the consumer index hands it back.
            let e = unsafe { std::slice::from_raw_parts(cq.ptr.as_ptr().add(off), 48) };
            let u32_at = |at: usize| u32::from_ne_bytes(e[at..at + 4].try_into().unwrap());
            let cqe = RxeCqe {
                wr_id: u64::from_ne_bytes(e[0..8].try_into().unwrap()),
                status: u32_at(8),
                opcode: u32_at(12),
                byte_len: u32_at(20),
                qp_num: u32_at(28),
            };
            word(cq, 256).store((cons + 1) & (cq.slots - 1), Ordering::Release);
            return Some(cqe);
        }
        if t0.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits for the channel fd to become readable.
fn wait_readable(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
    r == 1 && p.revents & libc::POLLIN != 0
}

/// The user handles of the rxe test's CQ and QP (echoed in events).
const CQ_USER: u64 = 0x5eed_00c0;
const QP_USER: u64 = 0x5eed_0090;

#[test]
fn rxe_write_through_raw_queues() {
    for (name, kind) in devices("rxe_write_through_raw_queues") {
        if kind != Kind::Rxe {
            eprintln!("{name}: siw cannot self-connect without rdma_cm (integrator's test)");
            continue;
        }
        let env = Env::open(&name, kind);
        let caps = env.dev.caps();
        let gid_index: u8 = match std::env::var("RXE_GID_INDEX") {
            Ok(s) => s.parse().expect("RXE_GID_INDEX"),
            Err(_) => env.dev.port().gid_index,
        };
        let gid = env.dev.gid(gid_index).expect("GID");
        // SAFETY: live context, open while `env` lives.
        let ch = unsafe { CompChannel::create(env.ctx) }.expect("completion channel");
        assert!(ch.fd() >= 0);
        assert_eq!(ch.consume(|_| {}).unwrap(), 0, "no event yet");
        let cq = env.cq(32, Some(&ch), CQ_USER).expect("CQ");
        let qp = env.qp(&cq, &CAPS, QP_USER).expect("QP");
        let qpn = qp.qp_num();
        // SAFETY: live context.
        let async_ev = unsafe { AsyncEvents::new(env.ctx) }.unwrap();

        // RESET -> INIT -> RTR -> RTS, connected to itself (docs/spec/kernels.md: global AV
        // with the device's RoCEv2 GID index, hop limit 1, port 1, MTU 1024).
        let psn = 0xabcd;
        let init = QpModify {
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            port_num: 1,
            ..QpModify::to(QpState::Init)
        };
        qp.modify(&init, &caps).expect("INIT");
        let rtr = QpModify {
            port_num: 1,
            dest_qpn: qpn,
            path_mtu: 1024,
            rq_psn: psn,
            av: AddressVector {
                is_global: true,
                dgid: gid,
                sgid_index: gid_index,
                hop_limit: 1,
                ..AddressVector::default()
            },
            ..QpModify::to(QpState::Rtr)
        };
        qp.modify(&rtr, &caps).expect("RTR");
        let rts = QpModify {
            sq_psn: psn,
            ..QpModify::to(QpState::Rts)
        };
        qp.modify(&rts, &caps).expect("RTS");

        let mut src = Mr::new(&env, 4096, Access::LOCAL_WRITE);
        for (i, b) in src.buf.iter_mut().enumerate() {
            *b = (i * 13 + 5) as u8;
        }
        let dst = Mr::new(&env, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let len = 3000u32;

        cq.req_notify(false).expect("arm");
        let sq = qp.sq().unwrap();
        rxe_post_write(&sq, 0x77, &src, &dst, len);
        qp.doorbell().expect("doorbell in RTS");
        let cqe =
            rxe_poll_one(&cq.ring().unwrap(), Duration::from_secs(20)).expect("no CQE within 20 s");
        eprintln!("{name}: CQE {cqe:?}");
        assert_eq!(cqe.wr_id, 0x77);
        assert_eq!(cqe.status, 0, "IBV_WC_SUCCESS");
        assert_eq!(cqe.opcode, 1, "IB_UVERBS_WC_RDMA_WRITE");
        assert_eq!(cqe.qp_num, qpn);
        let _ = cqe.byte_len;
        assert_eq!(&dst.buf[..len as usize], &src.buf[..len as usize]);
        assert!(dst.buf[len as usize..].iter().all(|&b| b == 0));
        // The SQ consumer index passed the WQE.
        assert_eq!(word(&sq, 256).load(Ordering::Acquire), 1);

        // The armed CQ raised one event on our own channel, naming our CQ's
        // user handle.
        assert!(
            wait_readable(ch.fd(), Duration::from_secs(10)),
            "no completion event"
        );
        let mut seen = Vec::new();
        let n = ch.consume(|h| seen.push(h)).unwrap();
        assert!(n >= 1);
        assert!(seen.iter().all(|&h| h == CQ_USER), "{seen:?}");
        assert_eq!(ch.consume(|_| {}).unwrap(), 0);

        // Nothing went wrong, so no async event is pending for our objects.
        while let Some(ev) = async_ev.poll_async_event().expect("async fd") {
            eprintln!("{name}: async event {ev:?}");
            assert!(ev.element != QP_USER && ev.element != CQ_USER);
        }

        // Five more WRITEs with one doorbell.
        for i in 0..5u64 {
            rxe_post_write(&sq, 0x100 + i, &src, &dst, 64);
        }
        qp.doorbell().unwrap();
        for i in 0..5u64 {
            let c = rxe_poll_one(&cq.ring().unwrap(), Duration::from_secs(20)).expect("CQE");
            assert_eq!((c.wr_id, c.status), (0x100 + i, 0));
        }

        drop(qp);
        drop(cq);
        drop(ch);
        drop(src);
        drop(dst);
    }
}

#[test]
fn destroying_leaves_no_mappings() {
    for (name, kind) in devices("destroying_leaves_no_mappings") {
        let env = Env::open(&name, kind);
        let before = uverbs_maps();
        for i in 0..40u64 {
            let cq = env.cq(64, None, i).expect("CQ");
            let qp = env.qp(&cq, &CAPS, i).expect("QP");
            if i == 0 {
                assert_eq!(uverbs_maps(), before + 3, "{name}: CQ, SQ, RQ");
            }
            if i % 2 == 0 {
                drop(qp);
                drop(cq);
            } else {
                qp.destroy().expect("destroy QP");
                cq.destroy().expect("destroy CQ");
            }
        }
        assert_eq!(uverbs_maps(), before, "{name}: mappings left behind");
    }
}

#[test]
fn errors_are_typed_and_leave_nothing() {
    for (name, kind) in devices("errors_are_typed_and_leave_nothing") {
        let env = Env::open(&name, kind);
        let before = uverbs_maps();
        assert_eq!(
            env.cq(u32::MAX, None, 0).err(),
            Some(Error::InvalidAttribute),
            "{name}: CQ of u32::MAX entries"
        );
        assert!(env.cq(0, None, 0).is_err(), "{name}: CQ of 0 entries");
        let cq = env.cq(16, None, 0).unwrap();
        let huge = QpInit {
            max_send_wr: 1 << 30,
            ..CAPS
        };
        assert_eq!(
            env.qp(&cq, &huge, 0).err(),
            Some(Error::InvalidAttribute),
            "{name}: QP of 2^30 WRs"
        );
        let many_sge = QpInit {
            max_send_sge: 1 << 20,
            ..CAPS
        };
        assert!(env.qp(&cq, &many_sge, 0).is_err(), "{name}: 2^20 SGEs");
        // A PD handle that does not exist.
        // SAFETY: live context.
        let bad_pd =
            unsafe { UverbsQp::create(env.ctx, kind, 0x7fff_fff0, &cq, &cq, &CAPS, false, 0) };
        eprintln!("{name}: bad PD handle: {:?}", bad_pd.as_ref().err());
        assert_eq!(bad_pd.err(), Some(Error::NoSuchObject));
        // CQs of the other kind are refused before any command.
        let other = if kind == Kind::Rxe {
            Kind::Siw
        } else {
            Kind::Rxe
        };
        // SAFETY: live context.
        let wrong =
            unsafe { UverbsQp::create(env.ctx, other, env.pd_handle(), &cq, &cq, &CAPS, false, 0) };
        assert_eq!(wrong.err(), Some(Error::InvalidAttribute));
        // Parsing the other driver's response: the CQ is created, its
        // mapping fails, and the CQ is destroyed again (unwinding).
        // SAFETY: live context.
        let mismatched = unsafe { UverbsCq::create(env.ctx, other, 16, None, 0) };
        eprintln!(
            "{name}: CQ parsed as {other:?}: {:?}, last error {:?}",
            mismatched.as_ref().err(),
            rdma_direct::verbs::last_error()
        );
        assert!(mismatched.is_err());
        assert_ne!(rdma_direct::verbs::last_error().0, "uverbs DESTROY_CQ");
        // An fd that is not a completion channel of this context.
        // SAFETY: live context.
        let not_channel = unsafe { UverbsCq::create(env.ctx, kind, 16, Some(0), 0) };
        eprintln!("{name}: fd 0 as channel: {:?}", not_channel.as_ref().err());
        assert!(not_channel.is_err());
        // SAFETY: live context.
        let negative = unsafe { UverbsCq::create(env.ctx, kind, 16, Some(-5), 0) };
        assert_eq!(negative.err(), Some(Error::InvalidAttribute));
        drop(cq);
        assert_eq!(uverbs_maps(), before, "{name}: mappings left behind");
        // The device still works after all that.
        let cq = env.cq(16, None, 0).unwrap();
        let qp = env.qp(&cq, &CAPS, 0).unwrap();
        drop(qp);
        drop(cq);
        assert_eq!(uverbs_maps(), before);
    }
}
