//! In-order commits of a source's position for sources that can read
//! again from a position (a journal cursor, a kernel sequence number):
//! each emitted batch is registered with the position after it, and the
//! committed position moves only over batches delivered with everything
//! before them. A failed delivery asks the reader to start again at the
//! committed position (at least once, never lost).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use petrel_core::AckReceiver;

struct Pending<T> {
    position: Option<T>,
    delivered: bool,
}

struct Inner<T> {
    pending: BTreeMap<u64, Pending<T>>,
    committed: Option<T>,
}

/// Positions of batches in flight and the committed one.
pub struct OrderedCommits<T> {
    inner: Mutex<Inner<T>>,
    next_seq: AtomicU64,
    /// The committed position moved since [`OrderedCommits::take_dirty`].
    dirty: AtomicBool,
    /// A delivery failed: the reader starts again at the committed position.
    rewind: AtomicBool,
}

impl<T: Clone + Send> OrderedCommits<T> {
    /// Starts at `committed` (the saved checkpoint, if any).
    pub fn new(committed: Option<T>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                pending: BTreeMap::new(),
                committed,
            }),
            next_seq: AtomicU64::new(0),
            dirty: AtomicBool::new(false),
            rewind: AtomicBool::new(false),
        }
    }

    /// Registers a batch ending at `position` (`None`: it moves nothing);
    /// its acknowledgement sequence number.
    pub fn register(&self, position: Option<T>) -> u64 {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        self.inner.lock().pending.insert(
            seq,
            Pending {
                position,
                delivered: false,
            },
        );
        seq
    }

    /// The committed position.
    pub fn committed(&self) -> Option<T> {
        self.inner.lock().committed.clone()
    }

    /// True when no batch awaits its answer.
    pub fn idle(&self) -> bool {
        self.inner.lock().pending.is_empty()
    }

    /// True (once) when a delivery failed since the last call; batches in
    /// flight are forgotten, since everything after the committed
    /// position is read again.
    pub fn take_rewind(&self) -> bool {
        if self.rewind.swap(false, Ordering::SeqCst) {
            self.inner.lock().pending.clear();
            return true;
        }
        false
    }

    /// True while a failed delivery waits for [`OrderedCommits::take_rewind`].
    pub fn rewind_pending(&self) -> bool {
        self.rewind.load(Ordering::SeqCst)
    }

    /// Asks for a rewind (bad input from the reader's side).
    pub fn request_rewind(&self) {
        self.rewind.store(true, Ordering::SeqCst);
    }

    /// The committed position if it moved since the last call.
    pub fn take_dirty(&self) -> Option<T> {
        if self.dirty.swap(false, Ordering::SeqCst) {
            return self.committed();
        }
        None
    }

    /// Marks the committed position as not saved (a save failed).
    pub fn set_dirty(&self) {
        self.dirty.store(true, Ordering::SeqCst);
    }
}

impl<T: Clone + Send> AckReceiver for OrderedCommits<T> {
    fn complete(&self, seq: u64, delivered: bool) {
        let mut g = self.inner.lock();
        let Some(p) = g.pending.get_mut(&seq) else {
            // From before a rewind: read again anyway.
            return;
        };
        if !delivered {
            self.rewind.store(true, Ordering::SeqCst);
            return;
        }
        p.delivered = true;
        while let Some(e) = g.pending.first_entry() {
            if !e.get().delivered {
                break;
            }
            if let Some(pos) = e.remove().position {
                g.committed = Some(pos);
                self.dirty.store(true, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_in_order_and_rewinds_on_failure() {
        let c = OrderedCommits::new(Some(0u64));
        let (a, b, d) = (
            c.register(Some(1)),
            c.register(Some(2)),
            c.register(Some(3)),
        );
        c.complete(b, true);
        assert_eq!(c.take_dirty(), None, "b waits for a");
        c.complete(a, true);
        assert_eq!(c.take_dirty(), Some(2));
        c.complete(d, false);
        assert!(c.take_rewind());
        assert!(c.idle());
        assert_eq!(c.committed(), Some(2));
        c.complete(d, true);
        assert_eq!(
            c.committed(),
            Some(2),
            "answers from before the rewind are ignored"
        );
    }
}
