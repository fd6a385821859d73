//! `type: stdin` — lines from the agent's standard input, for
//! `app | petrel run --config pipe.yaml`.
//!
//! ```yaml
//! sources:
//!   - type: stdin
//!     max_line_bytes: 1MiB   # longer lines are split (counted as line_too_long)
//! ```
//!
//! Standard input cannot be read twice, so what was read is kept in memory
//! (charged to the pipeline's budget) until every sink acknowledged it, and
//! sent again after a failed delivery. When the budget is full, reading
//! pauses and the writer blocks on the full pipe: backpressure, never loss.
//! At end of input the last line (even without a newline) is emitted, and
//! once everything was delivered the source is finished; when it is the
//! agent's only source the agent stops and exits 0.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::plugin::{Emitter, Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{
    AckReceiver, BatchAck, Event, EventBatch, MemoryCharge, PipelineBudget, SourceInfo, Span,
};
use prometheus_client::metrics::counter::Counter;

/// Keys accepted by the stdin source.
pub const KEYS: &[&str] = &["type", "id", "max_line_bytes"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Reads standard input, one event per line, for `app | petrel run`; what was read stays in memory until delivered, and the agent stops once every source has ended and its data was delivered. One per agent."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "max_line_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"1MiB"#),
        doc: r#"Longer lines are split (counted as `line_too_long`); 64 to 1GiB."#,
    },
];

/// Registration of `type: stdin`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "stdin",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| StdinSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Bytes asked of one `read` of standard input.
const READ_BYTES: usize = 256 << 10;
/// First wait before sending a batch again after a failed delivery; doubled
/// per failure up to [`MAX_RETRY`].
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Configuration of the stdin source.
#[derive(Debug, Clone)]
pub struct StdinSourceConfig {
    /// Lines longer than this are split into pieces.
    pub max_line_bytes: usize,
}

impl StdinSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let max_line_bytes = map.u64("max_line_bytes", true).unwrap_or(1 << 20) as usize;
        if max_line_bytes < 64 {
            if let Some(n) = map.get("max_line_bytes") {
                n.error("`max_line_bytes` must be at least 64");
            }
            return None;
        }
        Some(Self {
            max_line_bytes: max_line_bytes.min(1 << 30),
        })
    }
}

/// Only one source may read the process's standard input.
#[derive(Default)]
struct StdinClaim(AtomicBool);

impl petrel_core::plugin::SourceConfig for StdinSourceConfig {
    fn type_name(&self) -> &'static str {
        "stdin"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let claim = ctx.shared.get_or_try_init(|| Ok(StdinClaim::default()))?;
        if claim.0.swap(true, Ordering::SeqCst) {
            anyhow::bail!(
                "standard input is already read by another `stdin` source; keep one (pipelines can share it only through a file)"
            );
        }
        let shared = Arc::new(Shared {
            stop_reading: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            retained: Mutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(0),
        });
        let mut reader = StdinReader {
            shared: shared.clone(),
            emitter: ctx.emitter.clone(),
            budget: ctx.budget.clone(),
            info: Arc::new(SourceInfo {
                path: "".into(),
                meta: ctx.meta.clone(),
                source_type: "stdin",
            }),
            max_line_bytes: self.max_line_bytes,
            sent_events: ctx.metrics.sent_events.clone(),
            sent_bytes: ctx.metrics.sent_bytes.clone(),
            split_lines: ctx.metrics.error_counter("line_too_long"),
            read_errors: ctx.metrics.error_counter("read_failed"),
            carry: Vec::new(),
            in_long_line: false,
        };
        let key = ctx.key.clone();
        let handle = std::thread::Builder::new()
            .name("petrel-stdin".into())
            .spawn(move || reader.run())?;
        Ok(Box::new(RunningStdin {
            shared,
            handle: Some(handle),
            key,
            claim,
        }))
    }
}

/// A batch kept until every sink acknowledged it.
struct Retained {
    buf: Bytes,
    spans: Vec<Span>,
    input_bytes: u64,
    /// Memory of the kept data, released with it.
    _charge: MemoryCharge,
    /// Failed delivery: send again at this time.
    retry_at: Option<Instant>,
    backoff: Duration,
}

struct Shared {
    /// No more reading (the source is being stopped); retries go on.
    stop_reading: AtomicBool,
    /// The thread ends.
    stop: AtomicBool,
    finished: AtomicBool,
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

struct StdinReader {
    shared: Arc<Shared>,
    emitter: Arc<dyn Emitter>,
    budget: Arc<PipelineBudget>,
    info: Arc<SourceInfo>,
    max_line_bytes: usize,
    sent_events: Counter,
    sent_bytes: Counter,
    split_lines: LazyCounter,
    read_errors: LazyCounter,
    /// Bytes after the last newline.
    carry: Vec<u8>,
    in_long_line: bool,
}

impl StdinReader {
    fn run(&mut self) {
        let mut stdin = std::io::stdin().lock();
        let mut eof = false;
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.resend_failed();
            if eof || self.shared.stop_reading.load(Ordering::SeqCst) {
                if eof && self.shared.retained.lock().is_empty() {
                    self.shared.finished.store(true, Ordering::SeqCst);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if !readable(Duration::from_millis(100)) {
                continue;
            }
            // Reserve before reading; while the budget is full the pipe
            // fills and the writer waits (backpressure).
            let want = self.budget.reservation(READ_BYTES + self.carry.len());
            let Some(mut charge) = self
                .budget
                .charge_blocking(want, Instant::now() + Duration::from_millis(100))
            else {
                continue;
            };
            let mut buf = std::mem::take(&mut self.carry);
            buf.reserve(READ_BYTES);
            let n = match (&mut stdin).take(READ_BYTES as u64).read_to_end(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    self.carry = buf;
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read standard input; treating it as ended");
                    self.read_errors.inc();
                    0
                }
            };
            if n == 0 {
                eof = true;
                if !buf.is_empty() {
                    // A last line without newline.
                    let len = buf.len();
                    charge.shrink_to(self.budget.reservation(len));
                    self.emit(buf, vec![Span::new(0, len)], len as u64, charge);
                }
                tracing::info!("standard input ended; delivering what was read");
                continue;
            }
            let (spans, used) = self.split(&buf);
            self.carry = buf[used..].to_vec();
            buf.truncate(used);
            if spans.is_empty() {
                continue;
            }
            charge.shrink_to(self.budget.reservation(buf.len()));
            self.emit(buf, spans, used as u64, charge);
        }
    }

    /// Complete lines of `buf` (split at `max_line_bytes`), and how many
    /// bytes they cover.
    fn split(&mut self, buf: &[u8]) -> (Vec<Span>, usize) {
        let mut spans = Vec::new();
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', buf) {
            self.push_line(&mut spans, start, nl);
            start = nl + 1;
        }
        // An over-long unfinished line is emitted in pieces as it comes.
        while buf.len() - start >= self.max_line_bytes {
            spans.push(Span::new(start, self.max_line_bytes));
            if !self.in_long_line {
                self.split_lines.inc();
            }
            self.in_long_line = true;
            start += self.max_line_bytes;
        }
        (spans, start)
    }

    fn push_line(&mut self, spans: &mut Vec<Span>, mut start: usize, end: usize) {
        if end - start > self.max_line_bytes && !self.in_long_line {
            self.split_lines.inc();
        }
        while end - start > self.max_line_bytes {
            spans.push(Span::new(start, self.max_line_bytes));
            start += self.max_line_bytes;
        }
        spans.push(Span::new(start, end - start));
        self.in_long_line = false;
    }

    fn emit(&self, buf: Vec<u8>, spans: Vec<Span>, input_bytes: u64, mut charge: MemoryCharge) {
        let buf = Bytes::from(buf);
        // The kept copy is the same bytes; its share of the reservation
        // stays charged until every sink acknowledged.
        let kept = charge.split(buf.len());
        let seq = self.shared.next_seq.fetch_add(1, Ordering::SeqCst);
        self.shared.retained.lock().insert(
            seq,
            Retained {
                buf: buf.clone(),
                spans: spans.clone(),
                input_bytes,
                _charge: kept,
                retry_at: None,
                backoff: Duration::ZERO,
            },
        );
        self.sent_events.inc_by(spans.len() as u64);
        self.sent_bytes.inc_by(input_bytes);
        self.send(seq, buf, spans, input_bytes, charge);
    }

    fn send(&self, seq: u64, buf: Bytes, spans: Vec<Span>, input_bytes: u64, charge: MemoryCharge) {
        let mut batch = EventBatch::new(buf, self.info.clone());
        batch.events = spans.into_iter().map(Event::from_span).collect();
        batch.input_bytes = input_bytes;
        batch.charge = charge;
        batch.ack = Some(BatchAck::start(self.shared.clone(), seq));
        self.emitter.emit(batch);
    }

    /// Sends again the batches whose delivery failed and whose backoff
    /// passed. A new sequence number each time: the old one is answered.
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
            tracing::warn!(
                retry_in_ms = b.backoff.as_millis() as u64,
                "delivery of standard input data failed; sending it again"
            );
            b.retry_at = None;
            let seq = self.shared.next_seq.fetch_add(1, Ordering::SeqCst);
            let (buf, spans, input_bytes) = (b.buf.clone(), b.spans.clone(), b.input_bytes);
            self.shared.retained.lock().insert(seq, b);
            self.send(seq, buf, spans, input_bytes, MemoryCharge::none());
        }
    }
}

/// True when standard input has data (or end of input) within `timeout`.
fn readable(timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    rc > 0
}

/// The running stdin source.
struct RunningStdin {
    shared: Arc<Shared>,
    handle: Option<std::thread::JoinHandle<()>>,
    key: String,
    claim: Arc<StdinClaim>,
}

impl Source for RunningStdin {
    fn begin_stop(&mut self, _deadline: Instant) {
        // Reading stops; what was read is still delivered (retried) until
        // the deadline in `wait_stopped`.
        self.shared.stop_reading.store(true, Ordering::SeqCst);
    }

    fn wait_stopped(mut self: Box<Self>, deadline: Instant) -> anyhow::Result<()> {
        // Keep retrying failed batches until all are delivered or the
        // deadline passed; standard input cannot be read again later.
        while Instant::now() < deadline && !self.shared.retained.lock().is_empty() {
            if self.handle.as_ref().is_some_and(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.claim.0.store(false, Ordering::SeqCst);
        let left: usize = self
            .shared
            .retained
            .lock()
            .values()
            .map(|b| b.spans.len())
            .sum();
        if left > 0 {
            anyhow::bail!(
                "source {}: {left} line(s) read from standard input were not delivered before the deadline",
                self.key
            );
        }
        Ok(())
    }

    fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
            || self.shared.finished.load(Ordering::SeqCst)
            || self.shared.stop.load(Ordering::SeqCst)
    }

    fn is_finished(&self) -> bool {
        self.shared.finished.load(Ordering::SeqCst)
    }
}
