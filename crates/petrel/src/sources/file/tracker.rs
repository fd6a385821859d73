//! Turns out-of-order batch acknowledgements into an in-order committed
//! offset: a file offset is committed only when every batch below it was
//! delivered by every sink.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use petrel_core::AckReceiver;

/// Bytes committed by every tracker of the process since it started: the
/// input thread writes a checkpoint early when much was committed since
/// the last one, which bounds the duplicates after a crash by bytes as
/// well as by time.
pub static COMMITTED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Acknowledgement bookkeeping of one file reader.
#[derive(Debug)]
pub struct OffsetTracker {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Sequence number of `pending[0]`.
    base_seq: u64,
    /// (end offset, delivered) per batch in flight, in read order.
    pending: VecDeque<(u64, bool)>,
    committed: u64,
    /// A batch failed: nothing at or past it may be committed until the
    /// reader re-reads from `committed`.
    failed: bool,
}

impl OffsetTracker {
    /// A tracker whose data up to `committed` is already delivered.
    pub fn new(committed: u64) -> Self {
        Self {
            inner: Mutex::new(Inner {
                base_seq: 0,
                pending: VecDeque::new(),
                committed,
                failed: false,
            }),
        }
    }

    /// Records a batch ending at `end_offset`; returns its sequence number.
    pub fn register(&self, end_offset: u64) -> u64 {
        let mut g = self.inner.lock();
        let seq = g.base_seq + g.pending.len() as u64;
        g.pending.push_back((end_offset, false));
        seq
    }

    /// The offset below which everything was delivered.
    pub fn committed(&self) -> u64 {
        self.inner.lock().committed
    }

    /// Batches emitted and not yet answered by every sink.
    pub fn in_flight(&self) -> usize {
        self.inner.lock().pending.iter().filter(|p| !p.1).count()
    }

    /// True when some batch failed delivery; the reader must rewind to
    /// [`OffsetTracker::committed`].
    pub fn failed(&self) -> bool {
        self.inner.lock().failed
    }

    /// Clears a failure after the reader rewound to the committed offset:
    /// batches still in flight keep their slots but can no longer commit.
    pub fn rewound(&self) {
        let mut g = self.inner.lock();
        let n = g.pending.len() as u64;
        g.base_seq += n;
        g.pending.clear();
        g.failed = false;
    }
}

impl AckReceiver for OffsetTracker {
    fn complete(&self, seq: u64, delivered: bool) {
        let mut g = self.inner.lock();
        if seq < g.base_seq {
            return; // answer for a batch abandoned by a rewind
        }
        let idx = (seq - g.base_seq) as usize;
        if !delivered {
            g.failed = true;
        }
        if g.failed {
            return;
        }
        if let Some(slot) = g.pending.get_mut(idx) {
            slot.1 = true;
        }
        while let Some(&(end, true)) = g.pending.front() {
            COMMITTED_BYTES.fetch_add(end.saturating_sub(g.committed), Ordering::Relaxed);
            g.committed = end;
            g.pending.pop_front();
            g.base_seq += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_in_order_only() {
        let t = OffsetTracker::new(0);
        let a = t.register(10);
        let b = t.register(20);
        let c = t.register(30);
        t.complete(b, true);
        assert_eq!(t.committed(), 0);
        t.complete(a, true);
        assert_eq!(t.committed(), 20);
        assert_eq!(t.in_flight(), 1);
        t.complete(c, true);
        assert_eq!(t.committed(), 30);
    }

    #[test]
    fn failure_stops_commits_until_rewind() {
        let t = OffsetTracker::new(5);
        let a = t.register(10);
        let b = t.register(20);
        t.complete(a, false);
        t.complete(b, true);
        assert_eq!(t.committed(), 5);
        assert!(t.failed());
        t.rewound();
        assert!(!t.failed());
        let c = t.register(10);
        t.complete(c, true);
        assert_eq!(t.committed(), 10);
    }
}
