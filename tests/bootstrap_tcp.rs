//! The TCP rendezvous on localhost: ranks as threads, rank 0 coming up
//! late, several rounds, a mesh built through it on the software device;
//! a duplicate rank, a rank that never joins, a peer that sends garbage,
//! one that vanishes and one whose length disagrees are each an error on
//! every rank within the timeout, never a hang.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::*;
use rdma_direct::bootstrap::{Allgather, MeshBuilder, TcpAllgather};
use rdma_direct::soft::{SoftConfig, SoftDevice};
use rdma_direct::Error;

const T: Duration = Duration::from_secs(10);

/// A port nobody listens on now (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_ranks<R: Send + 'static>(
    size: u32,
    f: impl Fn(u32) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let hs: Vec<_> = (0..size)
        .map(|r| {
            let f = f.clone();
            thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn four_ranks_gather_with_rank_0_late() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let out = spawn_ranks(4, move |r| {
        if r == 0 {
            // The others are already retrying.
            thread::sleep(Duration::from_millis(200));
        }
        let mut ag = TcpAllgather::new(r, 4, &addr, T).unwrap();
        assert_eq!((ag.rank(), ag.size()), (r, 4));
        let mut got = Vec::new();
        for len in [1usize, 7, 300] {
            let mine = vec![r as u8 + 1; len];
            let mut all = vec![0u8; len * 4];
            ag.allgather(&mine, &mut all).unwrap();
            got.push(all);
        }
        got
    });
    for got in &out {
        for (i, len) in [1usize, 7, 300].into_iter().enumerate() {
            for r in 0..4 {
                assert!(got[i][r * len..(r + 1) * len]
                    .iter()
                    .all(|&b| b == r as u8 + 1));
            }
        }
    }
}

#[test]
fn a_mesh_through_tcp() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let dev = Device::new(SoftDevice::new(SoftConfig::default()));
    let mut l = Some(l);
    let hs: Vec<_> = (0..4u32)
        .map(|r| {
            let (dev, addr, l) = (dev.clone(), addr.clone(), l.take());
            thread::spawn(move || {
                let mut ag = match l {
                    Some(l) if r == 0 => TcpAllgather::with_listener(l, 4, T),
                    _ => TcpAllgather::new(r, 4, &addr, T),
                }
                .unwrap();
                let pd = dev.alloc_pd().unwrap();
                let init = QpInit::default();
                let cq = dev.create_cq(dev.cq_depth_for(&[&init; 3])).unwrap();
                let mr = pd
                    .register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                    .unwrap();
                let mesh = MeshBuilder::new(&pd, &cq, &cq)
                    .publish(&mr)
                    .build(&mut ag)
                    .unwrap();
                let ranks: Vec<u32> = mesh.peers().iter().map(|p| p.rank).collect();
                assert_eq!(ranks.len(), 3);
                for p in mesh.peers() {
                    assert_eq!(p.qp.state(), QpState::Rts);
                    assert_eq!(p.mrs[0].len, 64);
                }
                (
                    r,
                    ranks,
                    mr.addr(),
                    mr.rkey(),
                    mesh.peers().iter().map(|p| p.mrs[0]).collect::<Vec<_>>(),
                )
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    // Every rank's view of every peer's region is what that peer has.
    for (_, ranks, _, _, mrs) in &out {
        for (p, m) in ranks.iter().zip(mrs) {
            let owner = &out[*p as usize];
            assert_eq!((m.addr, m.rkey), (owner.2, owner.3));
        }
    }
}

#[test]
fn a_duplicate_rank_is_refused() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let root = thread::spawn(move || TcpAllgather::with_listener(l, 3, T).map(|_| ()));
    let a = {
        let addr = addr.clone();
        thread::spawn(move || TcpAllgather::new(1, 3, &addr, T).map(|_| ()))
    };
    let b = thread::spawn(move || TcpAllgather::new(1, 3, &addr, T).map(|_| ()));
    let start = Instant::now();
    assert_eq!(root.join().unwrap(), Err(Error::ProtocolError));
    for h in [a, b] {
        let e = h.join().unwrap().unwrap_err();
        assert!(
            matches!(e, Error::ProtocolError | Error::ConnectFailed),
            "{e:?}"
        );
    }
    assert!(start.elapsed() < T / 2, "took {:?}", start.elapsed());
}

#[test]
fn a_rank_that_never_joins_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let short = Duration::from_millis(300);
    let start = Instant::now();
    let root = thread::spawn(move || TcpAllgather::with_listener(l, 3, short).map(|_| ()));
    let one = thread::spawn(move || TcpAllgather::new(1, 3, &addr, T).map(|_| ()));
    assert_eq!(root.join().unwrap(), Err(Error::Timeout));
    // Rank 1 hears rank 0's verdict rather than waiting its own 10 s.
    assert_eq!(one.join().unwrap(), Err(Error::Timeout));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    // Nobody listening at all: a joining rank gives up at its deadline.
    let start = Instant::now();
    let port = free_port();
    assert_eq!(
        TcpAllgather::new(1, 2, &format!("127.0.0.1:{port}"), short).map(|_| ()),
        Err(Error::Timeout)
    );
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_rank_that_sends_garbage() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let root = thread::spawn(move || TcpAllgather::with_listener(l, 2, T).map(|_| ()));
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n").unwrap();
    assert_eq!(root.join().unwrap(), Err(Error::ProtocolError));
}

#[test]
fn a_vanished_rank_and_a_disagreeing_length() {
    for case in 0..2 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let mut l = Some(l);
        let start = Instant::now();
        let hs: Vec<_> = (0..3u32)
            .map(|r| {
                let (addr, l) = (addr.clone(), l.take());
                thread::spawn(move || {
                    let mut ag = match l {
                        Some(l) => TcpAllgather::with_listener(l, 3, T),
                        None => TcpAllgather::new(r, 3, &addr, T),
                    }
                    .unwrap();
                    if r == 2 && case == 0 {
                        // Gone before the first round.
                        drop(ag);
                        return Ok(());
                    }
                    let len = if r == 2 { 5 } else { 4 };
                    let mut all = vec![0u8; len * 3];
                    ag.allgather(&vec![1; len], &mut all)
                })
            })
            .collect();
        let rs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let want = if case == 0 {
            Error::ConnectFailed
        } else {
            Error::ProtocolError
        };
        assert_eq!(rs[0], Err(want), "case {case}");
        assert_eq!(rs[1], Err(want), "case {case}");
        if case == 1 {
            assert_eq!(rs[2], Err(Error::ProtocolError));
        }
        // Noticed at once, not at the 10 s timeout.
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "case {case}: {:?}",
            start.elapsed()
        );
    }
}
