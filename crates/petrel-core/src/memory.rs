//! Byte budgets that bound the memory held by in-flight data.
//!
//! Sources must obtain a [`MemoryCharge`] before reading; when the global or
//! their pipeline's budget is exhausted they pause and the data waits on
//! disk. Charges are released when the data they cover is dropped, which
//! happens once every sink acknowledged it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The process-wide budget set by `--memory-limit`.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Total limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently charged.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One pipeline's share of the global budget, so that a stalled pipeline
/// cannot take all memory from the healthy ones.
#[derive(Debug)]
pub struct PipelineBudget {
    global: Arc<MemoryBudget>,
    limit: usize,
    used: AtomicUsize,
}

impl PipelineBudget {
    /// A pipeline budget of at most `limit` bytes drawn from `global`.
    pub fn new(global: Arc<MemoryBudget>, limit: usize) -> Arc<Self> {
        Arc::new(Self {
            global,
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// This pipeline's limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes this pipeline holds now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes that could be charged right now without exceeding either limit.
    pub fn available(&self) -> usize {
        let mine = self.limit.saturating_sub(self.used());
        let global = self.global.limit.saturating_sub(self.global.used());
        mine.min(global)
    }

    /// Charges `bytes` if both this pipeline and the process have room.
    ///
    /// A budget holding nothing accepts any single charge, so that one item
    /// larger than the limit (a long line) still makes progress instead of
    /// waiting forever; memory then stays bounded by one such item.
    pub fn try_charge(self: &Arc<Self>, bytes: usize) -> Option<MemoryCharge> {
        let used = self.used();
        let gused = self.global.used();
        let fits = used == 0 || used + bytes <= self.limit;
        let gfits = gused == 0 || gused + bytes <= self.global.limit;
        if !(fits && gfits) {
            return None;
        }
        Some(self.force_charge(bytes))
    }

    /// Charges `bytes` unconditionally. Used for data derived from already
    /// charged input (encoded payloads), whose growth is bounded by it.
    pub fn force_charge(self: &Arc<Self>, bytes: usize) -> MemoryCharge {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        self.global.used.fetch_add(bytes, Ordering::Relaxed);
        MemoryCharge {
            budget: Some(self.clone()),
            bytes,
        }
    }
}

/// Bytes held against a [`PipelineBudget`]; released on drop.
#[derive(Debug, Default)]
pub struct MemoryCharge {
    budget: Option<Arc<PipelineBudget>>,
    bytes: usize,
}

impl MemoryCharge {
    /// A charge against nothing (tests, synthetic data).
    pub fn none() -> Self {
        Self::default()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds `other`'s bytes to this charge (both must come from the same
    /// budget, or `self` must be empty).
    pub fn merge(&mut self, mut other: MemoryCharge) {
        if self.budget.is_none() {
            std::mem::swap(self, &mut other);
            return;
        }
        self.bytes += other.bytes;
        other.bytes = 0;
    }

    /// Gives back all but `keep` bytes early (e.g. a read buffer that turned
    /// out shorter than reserved).
    pub fn shrink_to(&mut self, keep: usize) {
        if let Some(b) = &self.budget {
            if keep < self.bytes {
                let give = self.bytes - keep;
                b.used.fetch_sub(give, Ordering::Relaxed);
                b.global.used.fetch_sub(give, Ordering::Relaxed);
                self.bytes = keep;
            }
        }
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_respect_both_limits() {
        let g = MemoryBudget::new(100);
        let a = PipelineBudget::new(g.clone(), 60);
        let b = PipelineBudget::new(g.clone(), 60);
        let c1 = a.try_charge(60).expect("fits");
        assert!(a.try_charge(1).is_none(), "pipeline limit");
        let c2 = b.try_charge(40).expect("fits global");
        assert!(b.try_charge(1).is_none(), "global limit");
        drop(c1);
        assert_eq!(g.used(), 40);
        let mut c3 = b.try_charge(20).expect("room again");
        c3.shrink_to(5);
        assert_eq!(b.used(), 45);
        drop((c2, c3));
        assert_eq!(g.used(), 0);
        let big = a
            .try_charge(1000)
            .expect("an empty budget takes one oversized item");
        assert!(a.try_charge(1).is_none());
        drop(big);
    }
}
