//! Taps: samples of the events passing one point of a pipeline, streamed to
//! `petrel tap` through the API.
//!
//! A pipeline never waits for a tap. With no tap open the cost is one
//! atomic load per batch at each point. With one open, the sampled events
//! are encoded as ndjson and offered to a bounded channel; when the client
//! reads too slowly the channel is full and the events are skipped and
//! counted (`petrel_tap_skipped_events_total`), never queued without bound.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;

use crate::encode::{encode_batch, Encoding};
use crate::EventBatch;

/// Where a tap listens, as a key: `PIPELINE/source` (events as the
/// pipeline's sources produced them), `PIPELINE/processor/ID` (after that
/// processor, the same text as its health key) or `PIPELINE/sink` (the
/// sinks' input: what leaves the processor chain).
pub type TapKey = str;

/// One open tap.
struct Subscriber {
    key: String,
    tx: mpsc::Sender<Bytes>,
    /// Events still to send (the client's `--limit`).
    remaining: AtomicU64,
    /// At most this many events per second (0: no limit).
    rate: u64,
    /// Start of the current one-second window and events sent in it.
    window: Mutex<(Instant, u64)>,
}

impl Subscriber {
    /// How many events the rate and the limit allow now.
    fn allowance(&self, want: usize) -> usize {
        let left = self.remaining.load(Ordering::Relaxed);
        let mut n = (want as u64).min(left);
        if self.rate > 0 {
            let mut w = self.window.lock();
            if w.0.elapsed().as_secs_f64() >= 1.0 {
                *w = (Instant::now(), 0);
            }
            n = n.min(self.rate.saturating_sub(w.1));
            w.1 += n;
        }
        n as usize
    }
}

/// Every open tap of the agent.
pub struct Taps {
    open: AtomicUsize,
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    skipped: Counter,
    open_gauge: Gauge,
}

impl std::fmt::Debug for Taps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Taps({} open)", self.open.load(Ordering::Relaxed))
    }
}

impl Taps {
    /// No tap open; skipped events go to `skipped`, the number of open
    /// taps to `open`.
    pub fn new(skipped: Counter, open: Gauge) -> Self {
        Self {
            open: AtomicUsize::new(0),
            subscribers: Mutex::new(Vec::new()),
            skipped,
            open_gauge: open,
        }
    }

    /// Opens a tap on `key`: at most `limit` events (`None`: until the
    /// client goes), at most `rate` per second (0: any), with room for
    /// `capacity` lines waiting for the client. The receiver ends when the
    /// limit is reached.
    pub fn open(
        &self,
        key: &TapKey,
        limit: Option<u64>,
        rate: u64,
        capacity: usize,
    ) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.subscribers.lock().push(Arc::new(Subscriber {
            key: key.to_string(),
            tx,
            remaining: AtomicU64::new(limit.unwrap_or(u64::MAX)),
            rate,
            window: Mutex::new((Instant::now(), 0)),
        }));
        let n = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.open_gauge.set(n as i64);
        rx
    }

    /// Taps open now.
    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Offers `batch` at `key` to the taps open there.
    pub fn offer(&self, key: impl FnOnce() -> String, batch: &EventBatch) {
        if self.open.load(Ordering::Relaxed) == 0 || batch.events.is_empty() {
            return;
        }
        let key = key();
        let subs: Vec<Arc<Subscriber>> = self
            .subscribers
            .lock()
            .iter()
            .filter(|s| s.key == key)
            .cloned()
            .collect();
        let mut finished = false;
        for s in subs {
            if s.tx.is_closed() {
                finished = true;
                continue;
            }
            // Only what the client's queue has room for is encoded: the
            // rest would be skipped anyway, and encoding is the cost.
            let room = s.tx.capacity();
            let want = batch.events.len();
            if room < want {
                self.skipped.inc_by((want - room) as u64);
            }
            let n = s.allowance(want.min(room));
            if n == 0 {
                finished |= s.remaining.load(Ordering::Relaxed) == 0;
                continue;
            }
            // Evenly spread over the batch rather than its first events.
            let stride = batch.events.len() / n;
            let mut sample = EventBatch::new(batch.buf.clone(), batch.source.clone());
            sample.events = (0..n)
                .filter_map(|i| batch.events.get(i * stride).cloned())
                .collect();
            let mut out = Vec::new();
            let mut ends = Vec::new();
            // The events as they are: every field, Petrel's names.
            let ndjson = Encoding::Ndjson(Default::default());
            encode_batch(&ndjson, &sample, &mut out, Some(&mut ends));
            let out = Bytes::from(out);
            let mut start = 0usize;
            for end in ends {
                let end = end as usize;
                let line = out.slice(start..end);
                start = end;
                match s.tx.try_send(line) {
                    Ok(()) => {
                        if s.remaining.fetch_sub(1, Ordering::Relaxed) <= 1 {
                            finished = true;
                            break;
                        }
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        self.skipped.inc();
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        finished = true;
                        break;
                    }
                }
            }
        }
        if finished {
            self.prune();
        }
    }

    /// Forgets taps whose client left or whose limit is reached (their
    /// channel closes, which ends the client's stream).
    pub fn prune(&self) {
        let mut subs = self.subscribers.lock();
        let before = subs.len();
        subs.retain(|s| !s.tx.is_closed() && s.remaining.load(Ordering::Relaxed) > 0);
        self.open.fetch_sub(before - subs.len(), Ordering::SeqCst);
        self.open_gauge.set(subs.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, SourceInfo, Span};

    fn batch(n: usize) -> EventBatch {
        let text: String = (0..n).map(|i| format!("line {i}\n")).collect();
        let buf = Bytes::from(text.clone());
        let mut b = EventBatch::new(buf, Arc::new(SourceInfo::file("/x", Arc::new([]))));
        let mut pos = 0;
        for l in text.split_inclusive('\n') {
            b.events.push(Event::from_span(Span::new(pos, l.len() - 1)));
            pos += l.len();
        }
        b
    }

    #[test]
    fn a_slow_client_makes_events_skipped_and_counted_never_queued() {
        let skipped = Counter::default();
        let taps = Taps::new(skipped.clone(), Gauge::default());
        let mut rx = taps.open("p/sink", None, 0, 4);
        taps.offer(|| "p/sink".into(), &batch(10));
        assert_eq!(skipped.get(), 6);
        let first = rx.try_recv().unwrap();
        assert!(
            std::str::from_utf8(&first)
                .unwrap()
                .contains("\"message\":\"line 0\""),
            "{first:?}"
        );
        // Another point is not this tap's.
        taps.offer(|| "p/source".into(), &batch(10));
        assert_eq!(skipped.get(), 6);
    }

    #[test]
    fn the_limit_closes_the_tap_and_the_cost_drops_back_to_nothing() {
        let taps = Taps::new(Counter::default(), Gauge::default());
        let mut rx = taps.open("p/sink", Some(3), 0, 100);
        taps.offer(|| "p/sink".into(), &batch(2));
        taps.offer(|| "p/sink".into(), &batch(2));
        let mut got = 0;
        while rx.try_recv().is_ok() {
            got += 1;
        }
        assert_eq!(got, 3);
        assert_eq!(taps.open_count(), 0);
        let mut called = false;
        taps.offer(
            || {
                called = true;
                "p/sink".into()
            },
            &batch(2),
        );
        assert!(!called, "no tap open: the key is not even built");
    }

    #[test]
    fn the_rate_bounds_events_per_second() {
        let taps = Taps::new(Counter::default(), Gauge::default());
        let mut rx = taps.open("p/sink", None, 5, 100);
        for _ in 0..10 {
            taps.offer(|| "p/sink".into(), &batch(3));
        }
        let mut got = 0;
        while rx.try_recv().is_ok() {
            got += 1;
        }
        assert_eq!(got, 5);
    }
}
