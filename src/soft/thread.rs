//! Running the device: step mode (passes in the caller's thread) and
//! thread mode (a device thread that spins, yields, then sleeps).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::SoftDevice;
use super::state::Shared;

impl SoftDevice {
    /// Processes everything that is pending now (one pass over every
    /// queue); returns the amount of work done. Deterministic.
    pub fn step(&self) -> usize {
        let w = self.engine().pass(Instant::now());
        self.shared.passes.fetch_add(1, Ordering::Relaxed);
        w
    }

    /// Steps until a pass does no work (at most `max` passes).
    pub fn run_until_idle(&self, max: usize) -> usize {
        let mut total = 0;
        for _ in 0..max {
            let w = self.step();
            total += w;
            if w == 0 {
                break;
            }
        }
        total
    }

    /// Starts the device thread (idempotent). From now on the device
    /// consumes work on its own; `step` may still be called.
    pub fn start(&self) {
        let mut t = self.shared.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_some() {
            return;
        }
        self.engine().threaded = true;
        self.shared.stop.store(false, Ordering::Relaxed);
        let shared = Arc::clone(&self.shared);
        *t = Some(
            std::thread::Builder::new()
                .name("rdd-soft-hca".into())
                .spawn(move || {
                    let mut idle = 0u32;
                    while !shared.stop.load(Ordering::Relaxed) {
                        let w = shared
                            .engine
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .pass(Instant::now());
                        shared.passes.fetch_add(1, Ordering::Relaxed);
                        if w > 0 {
                            idle = 0;
                        } else {
                            idle = idle.saturating_add(1);
                            if idle < 2000 {
                                core::hint::spin_loop();
                            } else if idle < 4000 {
                                std::thread::yield_now();
                            } else {
                                std::thread::sleep(Duration::from_micros(50));
                            }
                        }
                    }
                })
                .expect("spawning the device thread"),
        );
    }

    /// Stops the device thread, if running.
    pub fn stop(&self) {
        let h = self
            .shared
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            self.shared.stop.store(true, Ordering::Relaxed);
            let _ = h.join();
            self.engine().threaded = false;
        }
    }

    /// Device passes so far (a progress counter for tests).
    pub fn passes(&self) -> u64 {
        self.shared.passes.load(Ordering::Relaxed)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
