//! The mesh bootstrap on the software device: N ranks as N threads
//! sharing one device, an in-process allgather (a barrier and a shared
//! buffer). A full mesh of 4 and 8 ranks carries an RDMA WRITE into every
//! peer's published region and a SEND/RECV on every pair; every kind of
//! bad record (each check of docs/architecture.md, "Bootstrap") fails on
//! every rank and leaves no QP on the device.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::bootstrap::{Allgather, Mesh, MeshBuilder};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::{Error, RecvWr, SendFlags, SendOp, SendWr};

type Dev = Device<SoftDevice>;
/// Rewrites the gathered table of round `round` (0 hello, 1 record, 2
/// commit) whose slots are `width` bytes, the same way on every rank.
type Corrupt = dyn Fn(usize, &mut [u8], usize) + Send + Sync;

/// A barrier whose wait is bounded: a rank that panicked or stopped
/// calling makes the others' allgather fail with `Timeout`, never hang.
struct TimedBarrier {
    n: usize,
    st: Mutex<(usize, u64)>,
    cv: Condvar,
}

impl TimedBarrier {
    fn new(n: usize) -> Self {
        TimedBarrier {
            n,
            st: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }
    fn wait(&self) -> rdma_direct::Result<()> {
        let mut g = self.st.lock().unwrap();
        let gen = g.1;
        g.0 += 1;
        if g.0 == self.n {
            *g = (0, gen + 1);
            self.cv.notify_all();
            return Ok(());
        }
        let (g, t) = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(10), |g| g.1 == gen)
            .unwrap();
        drop(g);
        if t.timed_out() {
            return Err(Error::Timeout);
        }
        Ok(())
    }
}

struct Shared {
    barrier: TimedBarrier,
    buf: Mutex<Vec<u8>>,
    corrupt: Option<Box<Corrupt>>,
}

struct LocalAg {
    rank: u32,
    size: u32,
    round: usize,
    sh: Arc<Shared>,
}

impl Allgather for LocalAg {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    fn allgather(&mut self, mine: &[u8], all: &mut [u8]) -> rdma_direct::Result<()> {
        let n = mine.len();
        assert_eq!(all.len(), n * self.size as usize);
        // Everybody has read the previous round before anyone writes.
        self.sh.barrier.wait()?;
        {
            let mut b = self.sh.buf.lock().unwrap_or_else(|p| p.into_inner());
            b.resize(all.len(), 0);
            let at = self.rank as usize * n;
            b[at..at + n].copy_from_slice(mine);
        }
        self.sh.barrier.wait()?;
        all.copy_from_slice(&self.sh.buf.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(c) = &self.sh.corrupt {
            c(self.round, all, n);
        }
        self.round += 1;
        Ok(())
    }
}

/// FNV-1a 64, as the record's checksum (so a test can change one field
/// and re-seal it, reaching the check behind the checksum).
fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn reseal(slot: &mut [u8]) {
    let n = slot.len() - 8;
    let s = fnv1a(&slot[..n]);
    slot[n..].copy_from_slice(&s.to_le_bytes());
}

const MR_LEN: usize = 4096;
const DEADLINE: Duration = Duration::from_secs(60);

struct Rank {
    mesh: Mesh<SoftDevice>,
    cq: Cq<SoftDevice>,
    rcq: Cq<SoftDevice>,
    target: Mr<SoftDevice>,
    _pd: Pd<SoftDevice>,
}

/// A rank's peer list (None: the full mesh).
type PeersOf = dyn Fn(u32) -> Option<Vec<u32>> + Send + Sync;

/// Options of one run.
#[derive(Clone, Default)]
struct Opts {
    corrupt: Option<Arc<Corrupt>>,
    /// Per-rank peer lists (None: the full mesh).
    peers: Option<Arc<PeersOf>>,
    /// Per-rank connect attributes.
    attr: Option<Arc<dyn Fn(u32) -> ConnectAttr + Send + Sync>>,
}

fn acc() -> ConnectAttr {
    ConnectAttr {
        access: Access::REMOTE_WRITE,
        ..Default::default()
    }
}

/// Builds the mesh on `size` threads; returns each rank's outcome.
fn run(dev: &Dev, size: u32, o: Opts) -> Vec<Result<Rank, Error>> {
    let corrupt = o.corrupt.clone();
    let sh = Arc::new(Shared {
        barrier: TimedBarrier::new(size as usize),
        buf: Mutex::new(Vec::new()),
        corrupt: corrupt
            .map(|c| Box::new(move |r: usize, a: &mut [u8], w: usize| c(r, a, w)) as Box<Corrupt>),
    });
    let hs: Vec<_> = (0..size)
        .map(|rank| {
            let (dev, sh, o) = (dev.clone(), Arc::clone(&sh), o.clone());
            thread::spawn(move || {
                let pd = dev.alloc_pd().unwrap();
                let init = QpInit::default();
                let depth = dev.cq_depth_for(&vec![&init; size as usize]);
                let cq = dev.create_cq(depth).unwrap();
                let rcq = dev.create_cq(depth).unwrap();
                let target = pd
                    .register(MR_LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                    .unwrap();
                let mut ag = LocalAg {
                    rank,
                    size,
                    round: 0,
                    sh,
                };
                let attr = o.attr.as_ref().map_or_else(acc, |f| f(rank));
                let mut b = MeshBuilder::new(&pd, &cq, &rcq)
                    .qp_init(init)
                    .connect_attr(attr)
                    .publish(&target);
                if let Some(p) = o.peers.as_ref().and_then(|f| f(rank)) {
                    b = b.peers(&p);
                }
                let r = b.build(&mut ag);
                r.map(|mesh| Rank {
                    mesh,
                    cq,
                    rcq,
                    target,
                    _pd: pd,
                })
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// No QP is left on the device (QPNs start at 0x100 on the software
/// device; a mesh of 8 makes 56).
fn assert_no_qps(dev: &Dev) {
    for qpn in 0x100..0x100 + 512 {
        assert_eq!(
            dev.backend().qp_state(qpn),
            Err(Error::NoSuchObject),
            "QP {qpn:#x} left"
        );
    }
}

fn poll_one(cq: &mut Cq<SoftDevice>, qp: &mut Qp<SoftDevice>, dev: &Dev) -> Wc {
    let mut wc = [Wc::default(); 1];
    let start = Instant::now();
    loop {
        dev.backend().step();
        if cq.poll(qp, &mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::SUCCESS, "{:?}", wc[0]);
            return wc[0];
        }
        assert!(start.elapsed() < DEADLINE, "no completion");
    }
}

fn full_mesh(size: u32) {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let ranks: Vec<Rank> = run(&dev, size, Opts::default())
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let mut ranks = ranks;
    for (r, rk) in ranks.iter().enumerate() {
        assert_eq!(rk.mesh.rank(), r as u32);
        assert_eq!(rk.mesh.size(), size);
        let peers: Vec<u32> = rk.mesh.peers().iter().map(|p| p.rank).collect();
        let want: Vec<u32> = (0..size).filter(|&p| p != r as u32).collect();
        assert_eq!(peers, want);
        for p in rk.mesh.peers() {
            assert_eq!(p.qp.state(), QpState::Rts);
            assert_eq!(p.mrs.len(), 1);
            assert_eq!(p.mrs[0].len, MR_LEN as u64);
        }
    }
    // Every rank writes its rank and the peer's into byte slot [16 * me]
    // of every peer's published region, and sends it a message.
    let mut src = Vec::new();
    for (r, rk) in ranks.iter_mut().enumerate() {
        let mut s = rk
            ._pd
            .register(64 * size as usize, Access::LOCAL_WRITE)
            .unwrap();
        for p in 0..size as usize {
            s.as_mut_slice()[p * 16] = r as u8;
            s.as_mut_slice()[p * 16 + 1] = p as u8;
        }
        src.push(s);
    }
    let mut recv = Vec::new();
    for rk in ranks.iter_mut() {
        let rb = rk
            ._pd
            .register(64 * size as usize, Access::LOCAL_WRITE)
            .unwrap();
        for p in rk.mesh.peers_mut() {
            let slot = p.rank as usize * 64;
            p.qp.post_recv(&[RecvWr {
                wr_id: u64::from(p.rank),
                sges: &[rb.sge(slot, 64)],
            }])
            .unwrap();
        }
        recv.push(rb);
    }
    for (r, rk) in ranks.iter_mut().enumerate() {
        let Rank { mesh, cq, .. } = rk;
        for p in mesh.peers_mut() {
            let sge = [src[r].sge(p.rank as usize * 16, 16)];
            let wr = SendWr::new(
                1,
                SendOp::Write {
                    remote: p.mrs[0].remote(r as u64 * 16),
                },
                &sge,
                SendFlags::SIGNALED,
            );
            p.qp.post_send(&[wr]).unwrap();
            poll_one(cq, &mut p.qp, &dev);
            let wr = SendWr::new(2, SendOp::Send, &sge, SendFlags::SIGNALED);
            p.qp.post_send(&[wr]).unwrap();
            assert_eq!(poll_one(cq, &mut p.qp, &dev).wr_id, 2);
        }
    }
    for (me, rk) in ranks.iter_mut().enumerate() {
        let t = rk.target.as_slice();
        for p in (0..size as usize).filter(|&p| p != me) {
            assert_eq!(
                &t[p * 16..p * 16 + 2],
                &[p as u8, me as u8],
                "WRITE {p} -> {me}"
            );
        }
        let Rank { mesh, rcq, .. } = rk;
        let mut qps: Vec<&mut Qp<SoftDevice>> =
            mesh.peers_mut().iter_mut().map(|p| &mut p.qp).collect();
        let mut seen = Vec::new();
        let mut wc = [Wc::default(); 16];
        let start = Instant::now();
        while seen.len() < size as usize - 1 {
            dev.backend().step();
            let n = rcq.poll(&mut qps[..], &mut wc).unwrap();
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::SUCCESS);
                assert_eq!(w.byte_len, 16);
                let from = w.wr_id as usize;
                let at = from * 64;
                assert_eq!(
                    &recv[me].as_slice()[at..at + 2],
                    &[from as u8, me as u8],
                    "SEND {from} -> {me}"
                );
                seen.push(from);
            }
            assert!(start.elapsed() < DEADLINE, "receives missing");
        }
        seen.sort();
        let want: Vec<usize> = (0..size as usize).filter(|&p| p != me).collect();
        assert_eq!(seen, want);
    }
    drop(ranks);
    assert_no_qps(&dev);
}

#[test]
fn full_mesh_of_4() {
    full_mesh(4);
}

#[test]
fn full_mesh_of_8() {
    full_mesh(8);
}

/// Runs a build of `size` ranks that must fail: returns every rank's
/// error, after checking that no QP is left.
fn failing(size: u32, o: Opts) -> Vec<Error> {
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let errs: Vec<Error> = run(&dev, size, o)
        .into_iter()
        .enumerate()
        .map(|(r, x)| match x {
            Ok(_) => panic!("rank {r} built a mesh"),
            Err(e) => e,
        })
        .collect();
    assert_no_qps(&dev);
    errs
}

fn corrupting(f: impl Fn(usize, &mut [u8], usize) + Send + Sync + 'static) -> Opts {
    Opts {
        corrupt: Some(Arc::new(f)),
        ..Opts::default()
    }
}

/// Rewrites rank 1's message of round `round` with `f`, then re-seals it.
fn field(round: usize, f: impl Fn(&mut [u8]) + Send + Sync + 'static) -> Opts {
    corrupting(move |r, all, w| {
        if r == round {
            let s = &mut all[w..2 * w];
            f(s);
            reseal(s);
        }
    })
}

fn all_protocol(errs: &[Error]) {
    assert!(errs.iter().all(|e| *e == Error::ProtocolError), "{errs:?}");
}

#[test]
fn wrong_magic_in_a_hello() {
    all_protocol(&failing(4, field(0, |s| s[0] ^= 1)));
}

#[test]
fn wrong_version_in_a_record() {
    all_protocol(&failing(4, field(1, |s| s[4] = 2)));
}

#[test]
fn rank_field_not_the_senders_slot() {
    all_protocol(&failing(4, field(1, |s| s[8] = 2)));
}

#[test]
fn mismatched_size() {
    all_protocol(&failing(4, field(0, |s| s[12] = 5)));
}

#[test]
fn entry_count_that_disagrees_with_the_length() {
    all_protocol(&failing(4, field(1, |s| s[16] = 2)));
}

#[test]
fn qp_info_that_fails_validate() {
    // The first entry's QPN (offset 24 + 4), top byte set.
    all_protocol(&failing(4, field(1, |s| s[31] = 1)));
}

#[test]
fn garbage_record() {
    all_protocol(&failing(
        4,
        corrupting(|r, all, w| {
            if r == 1 {
                for (i, b) in all[2 * w..3 * w].iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(37) ^ 0x5a;
                }
            }
        }),
    ));
}

#[test]
fn duplicate_ranks() {
    // Two senders claiming rank 1: slot 3 carries what slot 1 does, in
    // every round.
    all_protocol(&failing(
        4,
        corrupting(|_, all, w| {
            let (a, b) = all.split_at_mut(3 * w);
            b[..w].copy_from_slice(&a[w..2 * w]);
        }),
    ));
}

#[test]
fn a_peer_that_does_not_list_us() {
    let o = Opts {
        peers: Some(Arc::new(|r| {
            (r == 1).then(|| vec![2, 3]) // rank 0 lists 1; 1 does not list 0
        })),
        ..Opts::default()
    };
    all_protocol(&failing(4, o));
}

#[test]
fn a_subset_builds() {
    // A ring: each rank connects to its two neighbours.
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let o = Opts {
        peers: Some(Arc::new(|r| Some(vec![(r + 1) % 4, (r + 3) % 4]))),
        ..Opts::default()
    };
    let ranks: Vec<Rank> = run(&dev, 4, o).into_iter().map(|r| r.unwrap()).collect();
    for (r, rk) in ranks.iter().enumerate() {
        let r = r as u32;
        let got: Vec<u32> = rk.mesh.peers().iter().map(|p| p.rank).collect();
        assert_eq!(got, vec![(r + 1) % 4, (r + 3) % 4]);
        assert!(rk.mesh.peer((r + 2) % 4).is_none());
        assert!(rk.cq.committed() > 0);
    }
    drop(ranks);
    assert_no_qps(&dev);
}

#[test]
fn a_local_refusal_fails_every_rank() {
    // Rank 2 lists itself: its own error, and every other rank hears of
    // it in the first round.
    let o = Opts {
        peers: Some(Arc::new(|r| (r == 2).then(|| vec![2]))),
        ..Opts::default()
    };
    let errs = failing(4, o);
    assert_eq!(errs[2], Error::InvalidAttribute);
    for r in [0, 1, 3] {
        assert_eq!(errs[r], Error::ConnectFailed);
    }
}

#[test]
fn a_connect_refused_on_one_rank_disconnects_all() {
    // Rank 3 asks for a rate limit the software device cannot pace: its
    // connects fail after the others connected theirs to it; the commit
    // round takes every QP down.
    let o = Opts {
        attr: Some(Arc::new(|r| ConnectAttr {
            rate_limit_kbps: if r == 3 { 1000 } else { 0 },
            ..acc()
        })),
        ..Opts::default()
    };
    let errs = failing(4, o);
    assert_eq!(errs[3], Error::Unsupported);
    assert!(errs[..3].iter().all(|e| *e == Error::ConnectFailed));
}
