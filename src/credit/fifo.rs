//! A fixed-capacity FIFO, allocated once, for the receive bookkeeping.

use std::boxed::Box;
use std::vec;

use crate::error::{Error, Result};

/// A fixed-capacity FIFO, allocated once.
pub(super) struct Fifo<T: Copy> {
    buf: Box<[T]>,
    head: usize,
    len: usize,
}

impl<T: Copy> Fifo<T> {
    pub(super) fn new(cap: usize, fill: T) -> Fifo<T> {
        Fifo {
            buf: vec![fill; cap].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `k`-th entry from the front.
    pub(super) fn get(&self, k: usize) -> Option<T> {
        if k >= self.len {
            return None;
        }
        self.buf.get((self.head + k) % self.buf.len()).copied()
    }

    /// Appends; a full FIFO means the slot accounting broke, which only
    /// corrupt completions can cause.
    pub(super) fn push(&mut self, v: T) -> Result<()> {
        let cap = self.buf.len();
        if self.len == cap {
            return Err(Error::CqeCorrupt);
        }
        let at = (self.head + self.len) % cap;
        let slot = self.buf.get_mut(at).ok_or(Error::CqeCorrupt)?;
        *slot = v;
        self.len += 1;
        Ok(())
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        let v = self.get(0)?;
        self.head = (self.head + 1) % self.buf.len();
        self.len -= 1;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_wraps_and_refuses_overflow() {
        let mut f = Fifo::new(3, 0u32);
        for round in 0..5 {
            f.push(round).unwrap();
            f.push(round + 100).unwrap();
            assert_eq!(f.get(1), Some(round + 100));
            assert_eq!(f.pop(), Some(round));
            assert_eq!(f.pop(), Some(round + 100));
            assert_eq!(f.pop(), None);
        }
        f.push(1).unwrap();
        f.push(2).unwrap();
        f.push(3).unwrap();
        assert_eq!(f.push(4), Err(Error::CqeCorrupt));
        assert_eq!(f.len(), 3);
    }
}
