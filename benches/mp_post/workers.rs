//! Producers, the completion checker and the poller.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use rdma_direct::api::{Wc, WcStatus};
use rdma_direct::soft::SoftDevice;
use rdma_direct::{Error, Remote, SendFlags, SendOp, SendWr, Sge};

use crate::poster::{post_some, Poster};
use crate::{ABORT, BURST, END, FINAL, FULL_SPINS, IDLE_SPINS, ID_SHIFT, INDEX_MASK};
use crate::{MEASURE, SIGNAL_EVERY, STALL, STOP};

/// One producer's counts for the measured window (or cycles).
#[derive(Clone, Debug, Default)]
pub(crate) struct ProdStats {
    /// WRs posted.
    pub(crate) posts: u64,
    /// Time inside post bursts.
    pub(crate) post_secs: f64,
    /// Post calls refused with SqFull.
    pub(crate) refused: u64,
    /// Fill mode: (start, end) of each measured cycle's posting.
    pub(crate) spans: Vec<(Instant, Instant)>,
}

/// A producer's WR, with its id and signaling set for index `i`.
#[inline(always)]
fn set_id(wr: &mut SendWr<'_>, p: u64, i: u64, last: bool) {
    wr.wr_id = p << ID_SHIFT | i | if last { FINAL } else { 0 };
    wr.flags = if last || i % SIGNAL_EVERY == SIGNAL_EVERY - 1 {
        SendFlags::SIGNALED
    } else {
        SendFlags::NONE
    };
}

/// Thread and step modes: posts WRITEs in bursts until the phase reaches
/// STOP, then one final signaled WR.
#[allow(clippy::too_many_arguments)]
pub(crate) fn produce<P: Poster + ?Sized>(
    qp: &P,
    p: u64,
    sge: Sge,
    remote: Remote,
    list: usize,
    phase: &AtomicU8,
    start: &Barrier,
) -> Result<ProdStats, String> {
    let sges = [sge];
    let mut wr = SendWr::new(0, SendOp::Write { remote }, &sges, SendFlags::NONE);
    let mut wrs = vec![wr; list];
    let mut st = ProdStats::default();
    let mut i: u64 = 0;
    let mut fulls = 0u32;
    let mut last_progress = Instant::now();
    start.wait();
    loop {
        let ph = phase.load(Ordering::Relaxed);
        if ph >= STOP {
            break;
        }
        let t0 = Instant::now();
        let mut k = 0;
        let mut full = false;
        // A burst is BURST post calls (of `list` WRs each).
        for _ in 0..BURST {
            for (j, w) in wrs.iter_mut().enumerate() {
                set_id(w, p, i + j as u64, false);
            }
            let (n, err) = post_some(qp, &wrs);
            i += n as u64;
            k += n as u64;
            match err {
                None => {}
                Some(Error::SqFull) => {
                    full = true;
                    break;
                }
                Some(e) => return Err(format!("producer {p}: post: {e}")),
            }
        }
        let dt = t0.elapsed();
        if ph == MEASURE {
            st.posts += k;
            st.post_secs += dt.as_secs_f64();
            st.refused += full as u64;
        }
        if k > 0 {
            fulls = 0;
            last_progress = Instant::now();
        }
        if full {
            back_off(&mut fulls, last_progress, p)?;
        }
    }
    if phase.load(Ordering::Relaxed) == ABORT {
        return Err(format!("producer {p}: aborted"));
    }
    set_id(&mut wr, p, i, true);
    let mut fulls = 0u32;
    let since = Instant::now();
    loop {
        match qp.post(&wr) {
            Ok(()) => return Ok(st),
            Err(Error::SqFull) => back_off(&mut fulls, since, p)?,
            Err(e) => return Err(format!("producer {p}: final post: {e}")),
        }
        if phase.load(Ordering::Relaxed) == ABORT {
            return Err(format!("producer {p}: aborted"));
        }
    }
}

/// After a refused post: spin briefly, then yield (a device or poller
/// thread may need this core).
fn back_off(fulls: &mut u32, since: Instant, p: u64) -> Result<(), String> {
    *fulls += 1;
    if *fulls < FULL_SPINS {
        for _ in 0..32 {
            spin_loop();
        }
    } else {
        thread::yield_now();
        if *fulls % 1024 == 0 && since.elapsed() > STALL {
            return Err(format!("producer {p}: queue full for {STALL:?}"));
        }
    }
    Ok(())
}

/// Fill mode: per cycle, waits for the next generation and for all
/// `producers` to arrive, posts `per_cycle` WRs as fast as it can (the
/// last one signaled and marked FINAL), and reports done. Cycles below
/// `measure_from` are warm-up.
#[allow(clippy::too_many_arguments)]
pub(crate) fn produce_fill<P: Poster + ?Sized>(
    qp: &P,
    p: u64,
    sge: Sge,
    remote: Remote,
    list: usize,
    per_cycle: u64,
    producers: usize,
    generation: &AtomicU64,
    measure_from: &AtomicU64,
    arrived: &AtomicUsize,
    done: &AtomicUsize,
) -> Result<ProdStats, String> {
    let sges = [sge];
    let wr = SendWr::new(0, SendOp::Write { remote }, &sges, SendFlags::NONE);
    let mut wrs = vec![wr; list];
    let mut st = ProdStats::default();
    let mut i: u64 = 0;
    let mut seen = 0;
    loop {
        // Acquire pairs with the driver's Release store: its drain of the
        // previous cycle is complete.
        let g = wait_change(generation, seen, || Ok(()))?;
        if g == END {
            return Ok(st);
        }
        seen = g;
        // Start together: every producer of the cycle is on a CPU and
        // spinning here before any of them posts.
        arrived.fetch_add(1, Ordering::AcqRel);
        let mut n = 0u32;
        let since = Instant::now();
        while arrived.load(Ordering::Acquire) < producers {
            n = n.wrapping_add(1);
            if n < IDLE_SPINS {
                spin_loop();
            } else {
                thread::yield_now();
                if n % 4096 == 0 && since.elapsed() > STALL {
                    done.fetch_add(1, Ordering::Release);
                    return Err(format!("producer {p}: the others did not arrive"));
                }
            }
        }
        let t0 = Instant::now();
        let mut k = 0;
        while k < per_cycle {
            let m = (per_cycle - k).min(list as u64) as usize;
            for (j, w) in wrs[..m].iter_mut().enumerate() {
                let kj = k + j as u64;
                set_id(w, p, i + j as u64, kj == per_cycle - 1);
            }
            if let (_, Some(e)) = post_some(qp, &wrs[..m]) {
                // SqFull included: the queue holds every cycle's WRs.
                done.fetch_add(1, Ordering::Release);
                return Err(format!("producer {p}: fill post: {e}"));
            }
            i += m as u64;
            k += m as u64;
        }
        let t1 = Instant::now();
        if g >= measure_from.load(Ordering::Relaxed) {
            st.posts += per_cycle;
            st.post_secs += (t1 - t0).as_secs_f64();
            st.spans.push((t0, t1));
        }
        // Release: our posts happen before the driver's drain.
        done.fetch_add(1, Ordering::Release);
    }
}

/// Spins (then yields) until `word` differs from `old`; returns the new
/// value. `check` runs while waiting and may abort.
fn wait_change(
    word: &AtomicU64,
    old: u64,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<u64, String> {
    let mut n = 0u32;
    let since = Instant::now();
    loop {
        let v = word.load(Ordering::Acquire);
        if v != old {
            return Ok(v);
        }
        n = n.wrapping_add(1);
        if n < IDLE_SPINS {
            spin_loop();
        } else {
            thread::yield_now();
            check()?;
            if n % 4096 == 0 && since.elapsed() > STALL {
                return Err(format!("waited {STALL:?} for the other threads"));
            }
        }
    }
}

/// Checks completions as they arrive: per producer, every signaled WR
/// exactly once, successfully and in posting order, and each FINAL WR only
/// after all signaled WRs before it.
struct Checker {
    next: Vec<u64>,
    done: Vec<bool>,
    finals: usize,
    completions: u64,
}

impl Checker {
    fn new(producers: usize) -> Checker {
        Checker {
            next: vec![SIGNAL_EVERY - 1; producers],
            done: vec![false; producers],
            finals: 0,
            completions: 0,
        }
    }

    /// Starts a new fill cycle (every producer finished the last one).
    fn new_cycle(&mut self) {
        self.done.iter_mut().for_each(|d| *d = false);
        self.finals = 0;
    }

    fn all_final(&self) -> bool {
        self.finals == self.done.len()
    }

    fn take(&mut self, wc: &[Wc]) -> Result<(), String> {
        for w in wc {
            if w.status != WcStatus::SUCCESS {
                return Err(format!(
                    "wr_id {:#x} failed: {:?}, syndrome {:#x}",
                    w.wr_id, w.status, w.vendor_err
                ));
            }
            let p = ((w.wr_id & !FINAL) >> ID_SHIFT) as usize;
            let i = w.wr_id & INDEX_MASK;
            if p >= self.done.len() || self.done[p] {
                return Err(format!("unexpected completion {:#x}", w.wr_id));
            }
            let next = &mut self.next[p];
            if w.wr_id & FINAL != 0 {
                // Every signaled WR of p before this one has completed.
                if !(i <= *next && *next < i + SIGNAL_EVERY) {
                    return Err(format!(
                        "producer {p}: final WR {i} completed before WR {next}"
                    ));
                }
                if *next == i {
                    *next += SIGNAL_EVERY;
                }
                self.done[p] = true;
                self.finals += 1;
            } else if i != *next {
                return Err(format!("producer {p}: WR {i} completed, expected {next}"));
            } else {
                *next += SIGNAL_EVERY;
            }
        }
        self.completions += wc.len() as u64;
        Ok(())
    }
}

/// Thread and step modes: polls (in step mode: one device pass, then a
/// poll) until every producer's final WR has completed.
pub(crate) fn poll_loop(
    mut poll: impl FnMut(&mut [Wc]) -> Result<usize, Error>,
    step: Option<&SoftDevice>,
    producers: usize,
    phase: &AtomicU8,
    start: &Barrier,
) -> Result<u64, String> {
    let mut wc = [Wc::default(); 64];
    let mut check = Checker::new(producers);
    let mut idle = 0u32;
    let mut last_progress = Instant::now();
    start.wait();
    while !check.all_final() {
        let work = step.map_or(0, |d| d.step());
        let n = poll(&mut wc).map_err(|e| format!("poll: {e}"))?;
        check.take(&wc[..n])?;
        if n > 0 || work > 0 {
            idle = 0;
            last_progress = Instant::now();
        } else {
            idle += 1;
            if idle < IDLE_SPINS {
                spin_loop();
            } else {
                thread::yield_now();
                if phase.load(Ordering::Relaxed) == ABORT {
                    return Err("poller: aborted".into());
                }
                if idle % 4096 == 0 && last_progress.elapsed() > STALL {
                    return Err(format!(
                        "poller: no completion for {STALL:?} ({} of {producers} finished)",
                        check.finals
                    ));
                }
            }
        }
    }
    Ok(check.completions)
}

/// Fill mode: drives cycles from the calling thread until `seconds` of
/// measured cycles have passed (after `warmup` seconds of warm-up cycles),
/// draining the queue after each.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fill_driver(
    mut poll: impl FnMut(&mut [Wc]) -> Result<usize, Error>,
    dev: &SoftDevice,
    producers: usize,
    generation: &AtomicU64,
    measure_from: &AtomicU64,
    arrived: &AtomicUsize,
    done: &AtomicUsize,
    warmup: f64,
    seconds: f64,
) -> Result<(), String> {
    let mut wc = [Wc::default(); 64];
    let mut check = Checker::new(producers);
    let t_start = Instant::now();
    let mut t_measure: Option<Instant> = None;
    let mut g = 0u64;
    loop {
        let now = Instant::now();
        match t_measure {
            None if (now - t_start).as_secs_f64() >= warmup => {
                t_measure = Some(now);
                measure_from.store(g + 1, Ordering::Relaxed);
            }
            Some(t) if (now - t).as_secs_f64() >= seconds => break,
            _ => {}
        }
        done.store(0, Ordering::Relaxed);
        arrived.store(0, Ordering::Relaxed);
        g += 1;
        // Release: the drain below (and `done`, `arrived`,
        // `measure_from`) happen before the producers start the cycle.
        generation.store(g, Ordering::Release);
        let since = Instant::now();
        // Sleep rather than spin, so that the producers have the CPUs to
        // themselves while they post. Acquire pairs with the producers'
        // Release increments.
        while done.load(Ordering::Acquire) < producers {
            thread::sleep(Duration::from_micros(50));
            if since.elapsed() > STALL {
                return Err("fill: producers did not finish a cycle".into());
            }
        }
        check.new_cycle();
        let since = Instant::now();
        while !check.all_final() {
            dev.step();
            let k = poll(&mut wc).map_err(|e| format!("poll: {e}"))?;
            check.take(&wc[..k])?;
            if k == 0 && since.elapsed() > STALL {
                return Err("fill: the drain did not finish".into());
            }
        }
    }
    generation.store(END, Ordering::Release);
    Ok(())
}
