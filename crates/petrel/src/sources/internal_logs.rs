//! `type: internal_logs` — the agent's own log records as events.
//!
//! ```yaml
//! sources:
//!   - type: internal_logs
//!     rate_limit: 100    # records per second taken (bursts up to as many)
//! ```
//!
//! A `tracing` layer installed with the agent's logging ([`layer`]) copies
//! every record the log level lets through (level, target, message,
//! fields) into a bounded queue while an `internal_logs` source runs. The
//! source turns them into events: `message`, `level` (`error`, `warn`,
//! `info`, `debug`, `trace`), `target` (the module), and each field of
//! the record under its name.
//!
//! Loop-safe: a pipeline carrying these events may itself log (a failing
//! sink logs each retry), and those records come back to it. The layer
//! takes at most `rate_limit` records per second (a token bucket) and the
//! queue holds at most [`QUEUE`] records; what does not fit is dropped and
//! counted (`petrel_component_discarded_events_total{reason="rate_limited"}`
//! and `{reason="queue_full"}`), so the loop is bounded whatever the sink
//! does. Records in the queue and in flight are in memory: a restart
//! loses them (they are in the agent's standard error too).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::plugin::{Emitter, KeyDoc, KeyKind, Source, SourceContext, SourcePlugin};
use petrel_core::{
    AckReceiver, BatchAck, Event, EventBatch, Key, LazyCounter, MemoryCharge, PipelineBudget,
    SourceInfo, Span, Value,
};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// Keys accepted by the internal_logs source.
pub const KEYS: &[&str] = &["type", "id", "rate_limit"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"The agent's own log records (what `--log-level` lets through) as events: `message`, `level`, `target` and the record's fields, to ship them like any other log. At most `rate_limit` records per second and a bounded queue: a pipeline whose failures log cannot feed itself without bound; what is dropped is counted (`rate_limited`, `queue_full`). One per agent."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "rate_limit",
        kind: KeyKind::Int,
        default: Some("100"),
        doc: r#"Records taken per second (bursts up to as many); more are dropped and counted as `rate_limited`. 1 to 100000."#,
    },
];

/// Registration of `type: internal_logs`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "internal_logs",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| InternalLogsConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Records the queue holds at most.
pub const QUEUE: usize = 1024;
/// Batches in flight at most; beyond, the queue is not drained (and fills).
const MAX_IN_FLIGHT: usize = 16;
/// Records per batch at most.
const BATCH: usize = 256;
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Configuration of the internal_logs source.
#[derive(Debug, Clone)]
pub struct InternalLogsConfig {
    /// Records per second.
    pub rate_limit: u64,
}

impl InternalLogsConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let rate_limit = map.u64("rate_limit", false).unwrap_or(100);
        if !(1..=100_000).contains(&rate_limit) {
            if let Some(n) = map.get("rate_limit") {
                n.error("`rate_limit` must be between 1 and 100000 records per second");
            }
            return None;
        }
        Some(Self { rate_limit })
    }
}

/// One log record.
struct Record {
    time_ns: i64,
    level: &'static str,
    target: &'static str,
    message: String,
    fields: Vec<(&'static str, String)>,
}

/// What the layer and the source share.
struct Hub {
    /// An internal_logs source runs: the layer copies records.
    active: AtomicBool,
    tx: crossbeam_channel::Sender<Record>,
    rx: crossbeam_channel::Receiver<Record>,
    /// Token bucket: (tokens, last refill, rate).
    bucket: Mutex<(f64, Instant, f64)>,
    rate_limited: AtomicU64,
    queue_full: AtomicU64,
}

fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        Hub {
            active: AtomicBool::new(false),
            tx,
            rx,
            bucket: Mutex::new((0.0, Instant::now(), 100.0)),
            rate_limited: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
        }
    })
}

/// The `tracing` layer that feeds `internal_logs` sources; installed once
/// with the agent's logging. Costs one atomic load per record while no
/// such source runs.
pub fn layer() -> InternalLogsLayer {
    InternalLogsLayer
}

/// See [`layer`].
pub struct InternalLogsLayer;

#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.fields.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.fields.push((field.name(), format!("{value:?}")));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for InternalLogsLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let h = hub();
        if !h.active.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut b = h.bucket.lock();
            let now = Instant::now();
            let rate = b.2;
            b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * rate).min(rate);
            b.1 = now;
            if b.0 < 1.0 {
                h.rate_limited.fetch_add(1, Ordering::Relaxed);
                return;
            }
            b.0 -= 1.0;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let meta = event.metadata();
        let level = match *meta.level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "trace",
        };
        let rec = Record {
            time_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0),
            level,
            target: meta.target(),
            message: f.message,
            fields: f.fields,
        };
        if h.tx.try_send(rec).is_err() {
            h.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Only one source may drain the queue.
#[derive(Default)]
struct Claim(AtomicBool);

impl petrel_core::plugin::SourceConfig for InternalLogsConfig {
    fn type_name(&self) -> &'static str {
        "internal_logs"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let claim = ctx.shared.get_or_try_init(|| Ok(Claim::default()))?;
        if claim.0.swap(true, Ordering::SeqCst) {
            anyhow::bail!(
                "the agent's logs are already read by another `internal_logs` source; keep one"
            );
        }
        let h = hub();
        {
            let mut b = h.bucket.lock();
            *b = (
                self.rate_limit as f64,
                Instant::now(),
                self.rate_limit as f64,
            );
        }
        // Counted from now on, by this source.
        h.rate_limited.swap(0, Ordering::Relaxed);
        h.queue_full.swap(0, Ordering::Relaxed);
        h.active.store(true, Ordering::SeqCst);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            retained: Mutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(0),
        });
        let mut reader = Reader {
            shared: shared.clone(),
            emitter: ctx.emitter.clone(),
            budget: ctx.budget.clone(),
            info: Arc::new(SourceInfo {
                path: "".into(),
                meta: ctx.meta.clone(),
                source_type: "internal_logs",
            }),
            sent_events: ctx.metrics.sent_events.clone(),
            sent_bytes: ctx.metrics.sent_bytes.clone(),
            rate_limited: ctx.metrics.discarded_counter("rate_limited"),
            queue_full: ctx.metrics.discarded_counter("queue_full"),
        };
        let handle = std::thread::Builder::new()
            .name("petrel-internal-logs".into())
            .spawn(move || reader.run())?;
        Ok(Box::new(Running {
            shared,
            handle: Some(handle),
            claim,
        }))
    }
}

/// A batch kept until every sink acknowledged it.
struct Retained {
    buf: Bytes,
    events: Vec<Event>,
    input_bytes: u64,
    _charge: MemoryCharge,
    retry_at: Option<Instant>,
    backoff: Duration,
}

struct Shared {
    stop: AtomicBool,
    retained: Mutex<BTreeMap<u64, Retained>>,
    next_seq: AtomicU64,
}

impl AckReceiver for Shared {
    fn complete(&self, seq: u64, delivered: bool) {
        let mut r = self.retained.lock();
        if delivered {
            r.remove(&seq);
        } else if let Some(b) = r.get_mut(&seq) {
            b.backoff = (b.backoff * 2).clamp(MIN_RETRY, MAX_RETRY);
            b.retry_at = Some(Instant::now() + b.backoff);
        }
    }
}

struct Reader {
    shared: Arc<Shared>,
    emitter: Arc<dyn Emitter>,
    budget: Arc<PipelineBudget>,
    info: Arc<SourceInfo>,
    sent_events: prometheus_client::metrics::counter::Counter,
    sent_bytes: prometheus_client::metrics::counter::Counter,
    rate_limited: LazyCounter,
    queue_full: LazyCounter,
}

impl Reader {
    fn run(&mut self) {
        let h = hub();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.count_drops();
            self.resend_failed();
            if self.shared.retained.lock().len() >= MAX_IN_FLIGHT {
                // Delivery is stuck or failing: the queue fills and the
                // layer drops (counted) instead of memory growing.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let first = match h.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(r) => r,
                Err(_) => continue,
            };
            let mut records = vec![first];
            while records.len() < BATCH {
                match h.rx.try_recv() {
                    Ok(r) => records.push(r),
                    Err(_) => break,
                }
            }
            self.emit(records);
        }
        self.count_drops();
    }

    fn count_drops(&self) {
        let h = hub();
        let n = h.rate_limited.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.rate_limited.inc_by(n);
        }
        let n = h.queue_full.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.queue_full.inc_by(n);
        }
    }

    fn emit(&self, records: Vec<Record>) {
        let mut buf = Vec::new();
        let mut events = Vec::with_capacity(records.len());
        for r in records {
            let start = buf.len();
            buf.extend_from_slice(r.message.as_bytes());
            let mut ev = Event::from_span(Span::new(start, r.message.len()));
            ev.time_ns = Some(r.time_ns);
            ev.fields
                .push((Key::Borrowed("level"), Value::Str(r.level.into())));
            ev.fields
                .push((Key::Borrowed("target"), Value::Str(r.target.into())));
            for (k, v) in r.fields {
                let s = buf.len();
                buf.extend_from_slice(v.as_bytes());
                ev.set(Key::Borrowed(k), Value::Span(Span::new(s, v.len())));
            }
            events.push(ev);
        }
        let input_bytes = buf.len() as u64;
        // Small and already in memory: charged without waiting (the
        // queue, not the budget, bounds it).
        let charge = self
            .budget
            .try_charge(self.budget.reservation(buf.len()))
            .unwrap_or_else(MemoryCharge::none);
        let buf = Bytes::from(buf);
        let seq = self.shared.next_seq.fetch_add(1, Ordering::SeqCst);
        self.shared.retained.lock().insert(
            seq,
            Retained {
                buf: buf.clone(),
                events: events.clone(),
                input_bytes,
                _charge: MemoryCharge::none(),
                retry_at: None,
                backoff: Duration::ZERO,
            },
        );
        self.sent_events.inc_by(events.len() as u64);
        self.sent_bytes.inc_by(input_bytes);
        self.send(seq, buf, events, input_bytes, charge);
    }

    fn send(&self, seq: u64, buf: Bytes, events: Vec<Event>, input: u64, charge: MemoryCharge) {
        let mut batch = EventBatch::new(buf, self.info.clone());
        batch.events = events;
        batch.input_bytes = input;
        batch.charge = charge;
        batch.ack = Some(BatchAck::start(self.shared.clone(), seq));
        self.emitter.emit(batch);
    }

    fn resend_failed(&self) {
        let now = Instant::now();
        let due: Vec<u64> = self
            .shared
            .retained
            .lock()
            .iter()
            .filter(|(_, b)| b.retry_at.is_some_and(|t| t <= now))
            .map(|(s, _)| *s)
            .collect();
        for old in due {
            let Some(mut b) = self.shared.retained.lock().remove(&old) else {
                continue;
            };
            b.retry_at = None;
            let seq = self.shared.next_seq.fetch_add(1, Ordering::SeqCst);
            let (buf, events, input) = (b.buf.clone(), b.events.clone(), b.input_bytes);
            self.shared.retained.lock().insert(seq, b);
            self.send(seq, buf, events, input, MemoryCharge::none());
        }
    }
}

struct Running {
    shared: Arc<Shared>,
    handle: Option<std::thread::JoinHandle<()>>,
    claim: Arc<Claim>,
}

impl Source for Running {
    fn begin_stop(&mut self, _deadline: Instant) {}

    fn wait_stopped(mut self: Box<Self>, deadline: Instant) -> anyhow::Result<()> {
        hub().active.store(false, Ordering::SeqCst);
        while Instant::now() < deadline && !self.shared.retained.lock().is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.claim.0.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
            || self.shared.stop.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn the_layer_is_rate_limited_and_bounded() {
        let h = hub();
        *h.bucket.lock() = (10.0, Instant::now(), 10.0);
        h.active.store(true, Ordering::SeqCst);
        let sub = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(sub, || {
            for i in 0..50 {
                tracing::warn!(n = i, "record {i}");
            }
        });
        h.active.store(false, Ordering::SeqCst);
        let got: Vec<Record> = h.rx.try_iter().collect();
        // A burst of 10 (and the little the bucket refilled meanwhile).
        assert!((10..50).contains(&got.len()), "{}", got.len());
        assert_eq!(
            got.len() as u64 + h.rate_limited.swap(0, Ordering::SeqCst),
            50
        );
        assert_eq!(got[0].message, "record 0");
        assert_eq!(got[0].level, "warn");
        assert_eq!(got[0].fields, vec![("n", "0".to_string())]);
        assert!(got[0].target.contains("internal_logs"));
    }
}
