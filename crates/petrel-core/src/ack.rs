//! Delivery acknowledgements flowing back from sinks to the source.
//!
//! A source starts one acknowledgement per batch ([`BatchAck::start`]); the
//! engine splits it into one part per sink. Each
//! sink acknowledges its part after the data is durable at the destination;
//! a part dropped without acknowledgement counts as a failed delivery. When
//! the last part answers, the source's [`AckReceiver`] learns the outcome and
//! may commit the batch's offsets, in order.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Learns the final outcome of each batch a source emitted.
pub trait AckReceiver: Send + Sync {
    /// Called once per batch, from whichever thread answered last.
    /// `delivered` is true only when every sink acknowledged its part.
    fn complete(&self, seq: u64, delivered: bool);
}

struct AckInner {
    pending: AtomicUsize,
    failed: AtomicBool,
    seq: u64,
    receiver: Arc<dyn AckReceiver>,
}

impl AckInner {
    fn answer(&self, ok: bool) {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let delivered = !self.failed.load(Ordering::Acquire);
            self.receiver.complete(self.seq, delivered);
        }
    }
}

/// Starts acknowledgement tracking of batches.
pub struct BatchAck;

impl BatchAck {
    /// Starts tracking batch `seq` and returns its single initial part; the
    /// engine splits it into one part per sink.
    pub fn start(receiver: Arc<dyn AckReceiver>, seq: u64) -> AckPart {
        AckPart {
            inner: Some(Arc::new(AckInner {
                pending: AtomicUsize::new(1),
                failed: AtomicBool::new(false),
                seq,
                receiver,
            })),
        }
    }
}

/// One share of a batch acknowledgement.
///
/// Call [`AckPart::ack`] after delivery; dropping it unanswered reports a
/// failure, so a crashing or shut-down sink can never acknowledge by accident.
pub struct AckPart {
    inner: Option<Arc<AckInner>>,
}

impl AckPart {
    /// A part tied to nothing, for tests and synthetic payloads.
    pub fn detached() -> Self {
        Self { inner: None }
    }

    /// Splits this part into `n` parts that must all be acknowledged.
    /// With `n == 0` the part is acknowledged at once.
    pub fn split(mut self, n: usize) -> Vec<AckPart> {
        let Some(inner) = self.inner.take() else {
            return (0..n).map(|_| AckPart::detached()).collect();
        };
        if n == 0 {
            inner.answer(true);
            return Vec::new();
        }
        inner.pending.fetch_add(n - 1, Ordering::AcqRel);
        (0..n)
            .map(|_| AckPart {
                inner: Some(inner.clone()),
            })
            .collect()
    }

    /// Confirms delivery of this part.
    pub fn ack(mut self) {
        if let Some(inner) = self.inner.take() {
            inner.answer(true);
        }
    }

    /// Reports a failed delivery explicitly.
    pub fn nack(mut self) {
        if let Some(inner) = self.inner.take() {
            inner.answer(false);
        }
    }
}

impl Drop for AckPart {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.answer(false);
        }
    }
}

impl std::fmt::Debug for AckPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckPart")
            .field("seq", &self.inner.as_ref().map(|i| i.seq))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<(u64, bool)>>);
    impl AckReceiver for Log {
        fn complete(&self, seq: u64, delivered: bool) {
            self.0.lock().push((seq, delivered));
        }
    }

    #[test]
    fn completes_after_last_part() {
        let log = Arc::new(Log::default());
        let mut parts = BatchAck::start(log.clone(), 7).split(2);
        parts.pop().unwrap().ack();
        assert!(log.0.lock().is_empty());
        parts.pop().unwrap().ack();
        assert_eq!(*log.0.lock(), vec![(7, true)]);
    }

    #[test]
    fn dropped_part_is_a_failure() {
        let log = Arc::new(Log::default());
        let mut parts = BatchAck::start(log.clone(), 1).split(2);
        parts.pop().unwrap().ack();
        drop(parts);
        assert_eq!(*log.0.lock(), vec![(1, false)]);
    }

    #[test]
    fn zero_parts_complete_at_once() {
        let log = Arc::new(Log::default());
        let parts = BatchAck::start(log.clone(), 3).split(0);
        assert!(parts.is_empty());
        assert_eq!(*log.0.lock(), vec![(3, true)]);
    }
}
