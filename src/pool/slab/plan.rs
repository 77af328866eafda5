//! The layout of a slab: a pool configuration checked and turned into
//! size classes (ascending) and the region size.

use std::vec::Vec;

use crate::error::{Error, Result};
use crate::pool::freelist::MAX_SLOTS;
use crate::pool::{ClassSizes, PoolConfig, Sizing};
use crate::pool::{MAX_CLASSES, MAX_CLASS_SIZE, MIN_CLASS_SIZE};

/// One class of the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassPlan {
    pub(crate) size: u32,
    pub(crate) count: u32,
}

/// A validated configuration: the classes (ascending) and the region size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) classes: Vec<ClassPlan>,
    pub(crate) len: usize,
}

impl Plan {
    /// Checks `cfg` and lays the classes out. Every mistake is
    /// [`Error::InvalidAttribute`], except a huge-page region whose size
    /// is not a multiple of 2 MiB: [`Error::HugePagesUnavailable`].
    pub(crate) fn new(cfg: &PoolConfig) -> Result<Plan> {
        let sizes: Vec<usize> = match &cfg.sizes {
            ClassSizes::PowersOfTwo { min, max } => {
                if !min.is_power_of_two() || !max.is_power_of_two() || min > max {
                    return Err(Error::InvalidAttribute);
                }
                let mut v = Vec::new();
                let mut s = *min;
                while s <= *max {
                    v.push(s);
                    s *= 2;
                }
                v
            }
            ClassSizes::List(list) => {
                let mut v = list.clone();
                v.sort_unstable();
                if v.windows(2).any(|w| w[0] == w[1]) {
                    return Err(Error::InvalidAttribute);
                }
                v
            }
        };
        if sizes.is_empty() || sizes.len() > MAX_CLASSES {
            return Err(Error::InvalidAttribute);
        }
        if sizes
            .iter()
            .any(|&s| s < MIN_CLASS_SIZE || s % MIN_CLASS_SIZE != 0 || s > MAX_CLASS_SIZE)
        {
            return Err(Error::InvalidAttribute);
        }
        let n = sizes.len();
        let counts: Vec<u32> = match &cfg.sizing {
            Sizing::TotalBytes(total) => {
                let per = total / n;
                sizes
                    .iter()
                    .map(|&s| u32::try_from(per / s).unwrap_or(u32::MAX))
                    .collect()
            }
            Sizing::Each(c) => std::vec![*c; n],
            Sizing::Counts(c) => {
                if c.len() != n {
                    return Err(Error::InvalidAttribute);
                }
                c.clone()
            }
        };
        if counts.contains(&0) {
            return Err(Error::InvalidAttribute);
        }
        let mut used = 0usize;
        let mut slots = 0usize;
        for (&s, &c) in sizes.iter().zip(&counts) {
            used = s
                .checked_mul(c as usize)
                .and_then(|b| used.checked_add(b))
                .ok_or(Error::InvalidAttribute)?;
            slots += c as usize;
        }
        if slots > MAX_SLOTS || used > isize::MAX as usize {
            return Err(Error::InvalidAttribute);
        }
        let len = match cfg.sizing {
            Sizing::TotalBytes(total) => total,
            _ => used,
        };
        if cfg.huge_pages && len % super::region::HUGE_PAGE != 0 {
            return Err(Error::HugePagesUnavailable);
        }
        let classes = sizes
            .iter()
            .zip(&counts)
            .map(|(&s, &c)| ClassPlan {
                size: s as u32,
                count: c,
            })
            .collect();
        Ok(Plan { classes, len })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn plan_rejects_bad_configs() {
        let bad = [
            PoolConfig::buffers_per_class(1).size_classes(48, 256),
            PoolConfig::buffers_per_class(1).size_classes(256, 64),
            PoolConfig::buffers_per_class(1).size_classes(32, 64),
            PoolConfig::buffers_per_class(0),
            PoolConfig::buffers_per_class(1).class_sizes(&[]),
            PoolConfig::buffers_per_class(1).class_sizes(&[64, 100]),
            PoolConfig::buffers_per_class(1).class_sizes(&[64, 64]),
            PoolConfig::buffers_per_class(1).class_sizes(&[(MAX_CLASS_SIZE * 2)]),
            PoolConfig::with_counts(&[1, 2]),
            // 64 KiB total over 11 classes: no 64 KiB buffer fits.
            PoolConfig::total_bytes(64 << 10),
            // 2 × (2^32 - 1) buffers: more than 2^32 - 1 slots.
            PoolConfig::buffers_per_class(u32::MAX).size_classes(64, 128),
        ];
        for cfg in &bad {
            assert_eq!(Plan::new(cfg), Err(Error::InvalidAttribute), "{cfg:?}");
        }
        let many: Vec<usize> = (1..=65).map(|i| i * 64).collect();
        assert_eq!(
            Plan::new(&PoolConfig::buffers_per_class(1).class_sizes(&many)),
            Err(Error::InvalidAttribute)
        );
    }

    #[test]
    fn plan_total_bytes_splits_evenly() {
        let p =
            Plan::new(&PoolConfig::total_bytes(3 * 4096).class_sizes(&[4096, 64, 1024])).unwrap();
        assert_eq!(p.len, 3 * 4096);
        assert_eq!(
            p.classes,
            [
                ClassPlan {
                    size: 64,
                    count: 64
                },
                ClassPlan {
                    size: 1024,
                    count: 4
                },
                ClassPlan {
                    size: 4096,
                    count: 1
                }
            ]
        );
    }

    #[test]
    fn plan_huge_pages_size_check() {
        let cfg = PoolConfig::buffers_per_class(1).huge_pages(true);
        assert_eq!(Plan::new(&cfg), Err(Error::HugePagesUnavailable));
        let ok = PoolConfig::total_bytes(4 << 20).huge_pages(true);
        assert_eq!(Plan::new(&ok).unwrap().len, 4 << 20);
    }
}
