//! In-order commits of a source's position for sources that can read
//! again from a position (a journal cursor, a kernel sequence number):
//! each emitted batch is registered with the position after it, and the
//! committed position moves only over batches delivered with everything
//! before them. A failed delivery asks the reader to start again at the
//! committed position (at least once, never lost).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::plugin::Source;
use petrel_core::state::StateStore;
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

/// What the reader thread of a source with ordered commits shares with its
/// handle: the commits, the stop flags, and how a position is saved.
pub struct OrderedShared<T> {
    /// Positions of batches in flight and the committed one.
    pub commits: Arc<OrderedCommits<T>>,
    /// Stop reading new data (what is in flight may still be answered).
    pub stop_reading: AtomicBool,
    /// Stop the thread.
    pub stop: AtomicBool,
    encode: fn(&T) -> Vec<u8>,
}

impl<T: Clone + Send> OrderedShared<T> {
    /// Starting at `committed`; `encode` turns a position into what the
    /// state store keeps.
    pub fn new(committed: Option<T>, encode: fn(&T) -> Vec<u8>) -> Self {
        Self {
            commits: Arc::new(OrderedCommits::new(committed)),
            stop_reading: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            encode,
        }
    }

    /// Writes the checkpoint if it moved.
    pub fn save(&self, state: &StateStore) -> std::io::Result<()> {
        let Some(p) = self.commits.take_dirty() else {
            return Ok(());
        };
        state
            .save(&(self.encode)(&p))
            .inspect_err(|_| self.commits.set_dirty())
    }
}

/// A running source whose reader thread commits in order: stopping lets
/// what is in flight be answered (until the deadline), then joins the
/// thread and saves the checkpoint; what was not answered is read again
/// at the next start.
pub struct RunningOrdered<T> {
    shared: Arc<OrderedShared<T>>,
    handle: Option<std::thread::JoinHandle<()>>,
    key: String,
    state: StateStore,
    /// What the checkpoint is, for the error message.
    what: &'static str,
}

impl<T> RunningOrdered<T> {
    /// The handle of the reader thread `handle` of source `key`.
    pub fn new(
        shared: Arc<OrderedShared<T>>,
        handle: std::thread::JoinHandle<()>,
        key: String,
        state: StateStore,
        what: &'static str,
    ) -> Self {
        Self {
            shared,
            handle: Some(handle),
            key,
            state,
            what,
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Source for RunningOrdered<T> {
    fn begin_stop(&mut self, _deadline: Instant) {
        self.shared.stop_reading.store(true, Ordering::SeqCst);
    }

    fn wait_stopped(mut self: Box<Self>, deadline: Instant) -> anyhow::Result<()> {
        self.shared.stop_reading.store(true, Ordering::SeqCst);
        while Instant::now() < deadline && !self.shared.commits.idle() {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.shared.save(&self.state).map_err(|e| {
            anyhow::anyhow!(
                "source {}: cannot save the {} checkpoint {}: {e}",
                self.key,
                self.what,
                self.state.path().display()
            )
        })
    }

    fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
            || self.shared.stop.load(Ordering::SeqCst)
    }
}

/// True when `fd` has data (or end of file) within `timeout`.
pub fn readable(fd: i32, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    rc > 0
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
