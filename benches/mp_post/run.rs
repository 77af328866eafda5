//! One run of one case: its threads, and the sample it measures.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{SharedQp, SharedQpPoller, Wc};
use rdma_direct::soft::SoftDevice;
use rdma_direct::{Error, Remote, Sge};

use crate::poster::{Poster, SpinQp};
use crate::rig::{rig, Mode, Variant};
use crate::workers::{fill_driver, poll_loop, produce, produce_fill, ProdStats};
use crate::{Dev, ABORT, END, MEASURE, MSG, STOP, WARM};

/// One run of one case.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// WRs/s, all producers.
    pub(crate) rate: f64,
    /// Post calls/s inside bursts, per producer (total posts / total
    /// in-burst time).
    pub(crate) call_rate: f64,
    /// Refused post calls per 1000 posted WRs.
    pub(crate) refused_per_k: f64,
    /// Producers inside a post burst at once, on average (in-burst time
    /// of all producers / window).
    pub(crate) overlap: f64,
}

pub(crate) struct Opts {
    pub(crate) seconds: f64,
    pub(crate) warmup: f64,
    pub(crate) reps: usize,
    pub(crate) depth: u32,
    pub(crate) fill_depth: u32,
    pub(crate) modes: Vec<Mode>,
    pub(crate) producers: Vec<usize>,
    /// WRs per post call.
    pub(crate) list: usize,
}

type Handles<'s> = Vec<thread::ScopedJoinHandle<'s, Result<ProdStats, String>>>;

/// Shared state of a run's threads.
struct Ctl {
    /// WRs per post call.
    list: usize,
    phase: AtomicU8,
    start: Barrier,
    generation: AtomicU64,
    measure_from: AtomicU64,
    arrived: AtomicUsize,
    done: AtomicUsize,
}

/// Starts one producer thread per (SGE, remote) pair, posting through `qp`.
fn spawn_producers<'s, 'e, P: Poster + 'static>(
    s: &'s thread::Scope<'s, 'e>,
    mode: Mode,
    qp: &Arc<P>,
    sges: &'e [Sge],
    remotes: &'e [Remote],
    per_cycle: u64,
    ctl: &'e Ctl,
) -> Handles<'s> {
    (0..sges.len())
        .map(|p| {
            let qp = Arc::clone(qp);
            let (sge, remote) = (sges[p], remotes[p]);
            s.spawn(move || {
                let res = if mode == Mode::Fill {
                    produce_fill(
                        &*qp,
                        p as u64,
                        sge,
                        remote,
                        ctl.list,
                        per_cycle,
                        sges.len(),
                        &ctl.generation,
                        &ctl.measure_from,
                        &ctl.arrived,
                        &ctl.done,
                    )
                } else {
                    produce(
                        &*qp, p as u64, sge, remote, ctl.list, &ctl.phase, &ctl.start,
                    )
                };
                if res.is_err() {
                    // Let the others stop waiting.
                    ctl.phase.fetch_max(ABORT, Ordering::Relaxed);
                }
                res
            })
        })
        .collect()
}

/// Either the poller thread (thread and step modes) or the fill driver on
/// the calling thread; returns the poller thread's handle if any.
fn complete<'s, 'e>(
    s: &'s thread::Scope<'s, 'e>,
    mode: Mode,
    o: &'e Opts,
    dev: &'e SoftDevice,
    producers: usize,
    ctl: &'e Ctl,
    poll: impl FnMut(&mut [Wc]) -> Result<usize, Error> + Send + 's,
) -> Result<Option<thread::ScopedJoinHandle<'s, Result<u64, String>>>, String> {
    if mode == Mode::Fill {
        let r = fill_driver(
            poll,
            dev,
            producers,
            &ctl.generation,
            &ctl.measure_from,
            &ctl.arrived,
            &ctl.done,
            o.warmup,
            o.seconds,
        );
        if r.is_err() {
            ctl.phase.fetch_max(ABORT, Ordering::Relaxed);
            // Release the producers.
            ctl.generation.store(END, Ordering::Release);
        }
        r.map(|()| None)
    } else {
        let step = (mode == Mode::Step).then_some(dev);
        Ok(Some(s.spawn(move || {
            let r = poll_loop(poll, step, producers, &ctl.phase, &ctl.start);
            if r.is_err() {
                ctl.phase.fetch_max(ABORT, Ordering::Relaxed);
            }
            r
        })))
    }
}

pub(crate) fn run(
    o: &Opts,
    mode: Mode,
    variant: Variant,
    producers: usize,
) -> Result<Sample, String> {
    let depth = if mode == Mode::Fill {
        o.fill_depth
    } else {
        o.depth
    };
    let per_cycle = (depth as u64 / 2 / producers as u64).max(1);
    let r = rig(depth, producers)?;
    if mode == Mode::Thread {
        r.dev.backend().start();
    }
    let ctl = Ctl {
        list: o.list,
        phase: AtomicU8::new(WARM),
        start: Barrier::new(producers + 2),
        generation: AtomicU64::new(0),
        measure_from: AtomicU64::new(u64::MAX),
        arrived: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    };
    let sges: Vec<Sge> = (0..producers).map(|p| r.src.sge(p * 8, MSG)).collect();
    let remotes: Vec<Remote> = (0..producers).map(|p| r.dst.remote(p * 8)).collect();
    let dev = r.dev.backend();

    let (prod, driven, mut window) = thread::scope(|s| {
        let mut cq = r.cq;
        let (workers, poller) = match variant {
            Variant::Spin => {
                let spin = Arc::new(SpinQp::new(r.a));
                let workers = spawn_producers(s, mode, &spin, &sges, &remotes, per_cycle, &ctl);
                let poll = move |wc: &mut [Wc]| {
                    let mut g = spin.lock();
                    cq.poll(&mut *g, wc)
                };
                (workers, complete(s, mode, o, dev, producers, &ctl, poll))
            }
            Variant::LockFree => {
                let (shared, mut poller): (Arc<SharedQp<Dev>>, SharedQpPoller<Dev>) =
                    match r.a.into_shared() {
                        Ok(v) => v,
                        Err(e) => return Err(format!("into_shared: {e}")),
                    };
                let workers = spawn_producers(s, mode, &shared, &sges, &remotes, per_cycle, &ctl);
                drop(shared);
                let poll = move |wc: &mut [Wc]| cq.poll_shared(&mut poller, wc);
                (workers, complete(s, mode, o, dev, producers, &ctl, poll))
            }
        };
        let mut window = 0.0;
        if mode != Mode::Fill {
            ctl.start.wait();
            thread::sleep(Duration::from_secs_f64(o.warmup));
            ctl.phase.fetch_max(MEASURE, Ordering::Relaxed);
            let t0 = Instant::now();
            thread::sleep(Duration::from_secs_f64(o.seconds));
            ctl.phase.fetch_max(STOP, Ordering::Relaxed);
            window = t0.elapsed().as_secs_f64();
        }
        let prod: Vec<Result<ProdStats, String>> = workers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("producer panicked".into())))
            .collect();
        let driven = match poller {
            Ok(Some(h)) => h
                .join()
                .unwrap_or_else(|_| Err("poller panicked".into()))
                .map(|_| ()),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        Ok((prod, driven, window))
    })?;
    if mode == Mode::Thread {
        r.dev.backend().stop();
    }
    driven?;
    let prod: Vec<ProdStats> = prod.into_iter().collect::<Result<_, _>>()?;
    if r.dst.as_slice() != r.src.as_slice() {
        return Err("the WRITE target does not hold the source bytes".into());
    }
    let posts: u64 = prod.iter().map(|s| s.posts).sum();
    let secs: f64 = prod.iter().map(|s| s.post_secs).sum();
    let refused: u64 = prod.iter().map(|s| s.refused).sum();
    if posts == 0 {
        return Err(format!(
            "{}/{variant:?}/{producers}: nothing posted in the measured window",
            mode.name()
        ));
    }
    if mode == Mode::Fill {
        // Sum over cycles of (last end - first start).
        let cycles = prod[0].spans.len();
        if prod.iter().any(|s| s.spans.len() != cycles) {
            return Err("fill: producers measured different cycles".into());
        }
        window = (0..cycles)
            .map(|c| {
                let first = prod.iter().map(|s| s.spans[c].0).min().unwrap();
                let last = prod.iter().map(|s| s.spans[c].1).max().unwrap();
                (last - first).as_secs_f64()
            })
            .sum();
    }
    Ok(Sample {
        rate: posts as f64 / window,
        call_rate: posts as f64 / secs,
        refused_per_k: refused as f64 * 1000.0 / posts as f64,
        overlap: secs / window,
    })
}
