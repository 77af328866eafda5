//! Loom models of the slab's free lists.

use super::testing::slab;
use super::*;
use crate::sync::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

/// A slab plus one cell per slot ("the buffer").
struct Rig {
    slab: Slab,
    cells: Vec<UnsafeCell<u32>>,
}

fn rig(classes: &[(u32, u32)]) -> Arc<Rig> {
    let slab = slab(classes);
    let n: u32 = classes.iter().map(|c| c.1).sum();
    Arc::new(Rig {
        slab,
        cells: (0..n).map(|_| UnsafeCell::new(0)).collect(),
    })
}

impl Rig {
    /// Writes `me` into the grant's cell, then checks it is still there.
    fn own(&self, g: &Grant, me: u32) {
        let c = &self.cells[g.index as usize];
        // SAFETY: the grant makes the cell ours (what loom checks).
        c.with_mut(|p| unsafe { *p = me });
        // SAFETY: as above.
        c.with(|p| assert_eq!(unsafe { *p }, me, "slot {} shared", g.index));
    }

    /// Allocates, owns and frees `rounds` times; returns the successes.
    fn churn(&self, me: u32, len: usize, rounds: usize) -> usize {
        let mut ok = 0;
        for _ in 0..rounds {
            match self.slab.alloc(len) {
                Ok(g) => {
                    self.own(&g, me);
                    self.slab.free(g.class, g.index, g.gen).unwrap();
                    ok += 1;
                }
                Err(e) => assert_eq!(e, Error::ResourceExhausted),
            }
        }
        ok
    }

    /// Nothing handed out, and every slot can be allocated exactly once.
    fn check_all_free(&self, lens: &[usize]) {
        assert_eq!(self.slab.in_use(), 0);
        let mut seen = Vec::new();
        for &l in lens {
            let g = self.slab.alloc(l).unwrap();
            assert!(!seen.contains(&g.index), "slot {} twice", g.index);
            seen.push(g.index);
        }
        assert_eq!(self.slab.alloc(1).unwrap_err(), Error::ResourceExhausted);
    }
}

/// Two threads, one class of two slots, two rounds each.
#[test]
fn two_threads_one_class() {
    loom::model(|| {
        let r = rig(&[(64, 2)]);
        let r2 = Arc::clone(&r);
        let t = thread::spawn(move || r2.churn(2, 64, 2));
        let mine = r.churn(1, 64, 2);
        let theirs = t.join().unwrap();
        // Two slots, at most two holders: nobody is ever refused.
        assert_eq!(mine + theirs, 4);
        r.check_all_free(&[64, 64]);
    });
}

/// Three threads contend for two slots in two classes (the small class
/// falls back to the large one when empty).
#[test]
fn three_threads_two_classes() {
    loom::model(|| {
        let r = rig(&[(64, 1), (128, 1)]);
        let hs: Vec<_> = (0..2u32)
            .map(|i| {
                let r = Arc::clone(&r);
                thread::spawn(move || r.churn(i + 2, 64, 1))
            })
            .collect();
        r.churn(1, 100, 1);
        for h in hs {
            h.join().unwrap();
        }
        r.check_all_free(&[64, 128]);
    });
}

/// The ABA shape: one thread pops while the other pops both slots and
/// pushes the first back. With the tag, the stale pop cannot install
/// a successor that is handed out.
#[test]
fn aba_is_prevented() {
    loom::model(|| {
        let r = rig(&[(64, 2)]);
        let r2 = Arc::clone(&r);
        let t = thread::spawn(move || {
            let a = r2.slab.alloc(64);
            if let Ok(g) = &a {
                r2.own(g, 2);
            }
            a
        });
        let x = r.slab.alloc(64);
        let y = r.slab.alloc(64);
        for g in [&x, &y].into_iter().flatten() {
            r.own(g, 1);
        }
        if let Ok(g) = x {
            r.slab.free(g.class, g.index, g.gen).unwrap();
        }
        let a = t.join().unwrap();
        let mut live: Vec<Grant> = [a, y].into_iter().flatten().collect();
        if let (Some(p), Some(q)) = (live.first(), live.get(1)) {
            assert_ne!(p.index, q.index);
        }
        for g in live.drain(..) {
            r.slab.free(g.class, g.index, g.gen).unwrap();
        }
        r.check_all_free(&[64, 64]);
    });
}

/// Two threads free the same C token at once: exactly one wins.
#[test]
fn racing_double_free_one_wins() {
    loom::model(|| {
        let r = rig(&[(64, 2)]);
        let g = r.slab.alloc(8).unwrap();
        let (tok, addr, lkey) = (g.token(), g.ptr.as_ptr() as u64, r.slab.keys().lkey);
        let r2 = Arc::clone(&r);
        let t = thread::spawn(move || r2.slab.free_token(tok, addr, lkey).is_ok());
        let mine = r.slab.free_token(tok, addr, lkey).is_ok();
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs, "exactly one free succeeds");
        r.check_all_free(&[64, 64]);
    });
}

/// The model catches a broken ordering: with a Relaxed publishing CAS
/// in push, a thread that pops the slot reads the buffer without a
/// happens-before edge to the previous holder's write.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_push_is_caught() {
    loom::model(|| {
        let r = rig(&[(64, 1)]);
        let r2 = Arc::clone(&r);
        let t = thread::spawn(move || {
            let l = &r2.slab.classes[0].free;
            if let Some(i) = l.pop(&r2.slab.words) {
                // SAFETY: popped, so the cell is ours (what loom checks).
                r2.cells[i as usize].with_mut(|p| unsafe { *p = 2 });
                l.push_ordered(&r2.slab.words, i, 1, Ordering::Relaxed);
            }
        });
        let l = &r.slab.classes[0].free;
        for _ in 0..2 {
            if let Some(i) = l.pop(&r.slab.words) {
                // SAFETY: popped, so the cell is ours (what loom checks).
                r.cells[i as usize].with_mut(|p| unsafe { *p = 1 });
                l.push(&r.slab.words, i, 1);
            }
            thread::yield_now();
        }
        t.join().unwrap();
    });
}
