//! The delivery driver of the request/response sinks (http,
//! elasticsearch, loki, opentelemetry): one implementation of everything
//! between a sink's encoded payloads and its destination's answers.
//!
//! The driver owns the sequence:
//! 1. **batch**: payloads are gathered into requests of at most
//!    `max_bytes` and `max_events`, sent at the latest `linger` after their
//!    first event waited ([`batch`]);
//! 2. **encode**: the sink turns the request's records (or a part of them)
//!    into a body ([`RequestSink::build_request`]);
//! 3. **send**: as many requests at once as the AIMD window of
//!    [`super::congestion`] allows ([`RequestSink::send`]);
//! 4. **classify**: the sink reads the answer into an [`Answer`], for the
//!    whole request or per item;
//! 5. **act**: deliver, retry with backoff or the server's `Retry-After`,
//!    hold loudly on 401/403/404, split in halves, set refused items aside
//!    in the dead-letter file, and acknowledge the payloads once every
//!    item is delivered or set aside;
//! 6. **record**: sent events and bytes, retries, errors by type,
//!    discards, the window, the latency and the component's health.
//!
//! A sink gives only its encoding, its request and its classification of
//! answers, through [`RequestSink`]; "Writing a plugin" in the book has an
//! example.

mod batch;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use petrel_core::plugin::{BoxFuture, PayloadReceiver};
use petrel_core::{ComponentMetrics, DeliveryMetrics, MemoryCharge};
use prometheus_client::metrics::counter::Counter;

#[cfg(test)]
pub(crate) use batch::RequestAcks;
pub(crate) use batch::SharedAck;
pub use batch::{Batch, Compression, Framing, Selection};

use super::congestion::{Backoff, Window};
use super::dead_letter::{self, Refusal};
use batch::{Builder, Request};

/// Longest wait between attempts while a destination refuses outright
/// (401/403/404, a refused item without a dead letter).
pub const MAX_REFUSED_BACKOFF: Duration = Duration::from_secs(30);
/// The first of those waits.
const FIRST_REFUSED_BACKOFF: Duration = Duration::from_millis(500);
/// At most one loud log line per this period and kind.
const LOUD_EVERY: Duration = Duration::from_secs(10);

/// A request/response sink, as the driver sees it.
///
/// Items are what the sink counts and sets aside one by one: a request's
/// records unless [`RequestSink::plan`] makes something else of them
/// (Loki: its entries, grouped by stream and sorted by time).
pub trait RequestSink: Send + Sync + 'static {
    /// What [`RequestSink::plan`] makes of a request, kept while it is
    /// being delivered (`()` where items are records).
    type Plan<'b>: Send + Sync + Default;

    /// Words of the log lines and health texts.
    const WORDING: Wording;

    /// Prepares a request once, before its first attempt: its plan and
    /// how many items it has. By default its items are its records.
    fn plan<'b>(&self, batch: &'b Batch) -> (Self::Plan<'b>, usize) {
        (Default::default(), batch.len())
    }

    /// The body that delivers `items` of the request (encoded and
    /// compressed). An error fails the request: its payloads are read
    /// again.
    fn build_request(
        &self,
        batch: &Batch,
        plan: &Self::Plan<'_>,
        items: Selection<'_>,
    ) -> anyhow::Result<Bytes>;

    /// Sends `body`, which carries `items` items, and classifies the
    /// answer.
    fn send(&self, body: Bytes, items: usize) -> impl std::future::Future<Output = Answer> + Send;

    /// The record that item `item` of the request came from. By default
    /// items are records.
    fn item_record<'a>(&self, batch: &'a Batch, plan: &Self::Plan<'_>, item: usize) -> &'a [u8] {
        let _ = plan;
        batch.record(item)
    }

    /// How `record`, refused with `answer`, is written to the dead letter
    /// file. By default: as encoded, with the answer.
    fn dead_letter_record<'a>(&self, record: &'a [u8], answer: &'a str) -> DeadRecord<'a> {
        DeadRecord {
            record: record.into(),
            answer: answer.into(),
        }
    }

    /// The counter of items the destination already had
    /// ([`Item::Duplicate`]).
    fn duplicates(&self) -> Option<&Counter> {
        None
    }

    /// What the destination said about itself, for the loud log lines.
    fn server(&self) -> Option<String> {
        None
    }
}

/// The words a sink's log lines use.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    /// Prefix of every log line: `http sink`.
    pub sink: &'static str,
    /// Who answers: `the endpoint`, `Loki`.
    pub peer: &'static str,
    /// One item and several: `("entry", "entries")`.
    pub items: (&'static str, &'static str),
    /// What an operator fixes when the destination answers 401, 403 or
    /// 404: `the credentials or the URL`.
    pub hold_fix: &'static str,
}

/// What a sink made of the answer to one request.
#[derive(Debug)]
pub enum Answer {
    /// Every item delivered.
    Delivered,
    /// Accepted, but the destination rejected `rejected` items for good
    /// (OTLP partial success): counted as discarded, not sent again.
    PartialSuccess {
        /// How many.
        rejected: i64,
        /// The destination's explanation.
        message: String,
    },
    /// One answer per item, in the order they were sent.
    Items(Vec<Item>),
    /// Transient (no answer, 408, 429, 5xx): everything is sent again
    /// after `after` (the server's wish) or the backoff.
    Retry {
        /// The server's `Retry-After`.
        after: Option<Duration>,
        /// The metric's `error_type`.
        error_type: &'static str,
        /// What happened, for the log.
        why: String,
    },
    /// 401, 403 or 404 (or their peers): the data waits, loudly, until an
    /// operator fixes the sink.
    Hold {
        /// The HTTP status (or its peer).
        status: u16,
        /// The answer's text.
        text: String,
    },
    /// The destination refuses the request's items.
    Refused {
        /// The HTTP status (or its peer), for the dead letter.
        status: u16,
        /// The answer's text.
        text: String,
        /// The request is halved until each refused item is alone (some
        /// item is refused); without, all its items are set aside.
        split: bool,
    },
}

/// What the destination said about one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// Stored.
    Delivered,
    /// Already there (the same id sent before): delivered and counted.
    Duplicate,
    /// Transient: sent again, alone with the other retried items.
    Retry,
    /// 401, 403 or 404 for this item (the status, and why): it waits,
    /// loudly.
    Hold(u16, String),
    /// Refused for good (the status, and why): set aside in the dead
    /// letter file.
    Refused(u16, String),
}

/// One refused item as the dead letter file receives it.
#[derive(Debug)]
pub struct DeadRecord<'a> {
    /// The record (written as JSON when it is JSON, else as a string).
    pub record: Cow<'a, [u8]>,
    /// The destination's answer.
    pub answer: Cow<'a, str>,
}

/// How the driver batches and where refused items go.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How records are laid out in a request body.
    pub framing: Framing,
    /// Largest request body before compression.
    pub max_bytes: usize,
    /// Most events per request.
    pub max_events: usize,
    /// Longest wait of the first event of a request.
    pub linger: Duration,
    /// Upper bound of the congestion window, in requests.
    pub max_in_flight: usize,
    /// Where refused items are set aside; without it they are retried.
    pub dead_letter: Option<PathBuf>,
    /// Where requests go, for logs, health texts and dead letters.
    pub target: String,
    /// When to stop retrying transient failures and set the items aside.
    pub retry: RetryLimit,
}

/// Bounds on the retries of transient failures (`retry:`); beyond them
/// the items go to the dead letter file (which the sink then must have),
/// counted as `discarded_events_total{reason="retries_exhausted"}`.
/// Unbounded by default: a destination that is down holds its data.
/// Held requests (401, 403, 404) wait for an operator whatever these say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryLimit {
    /// Attempts of one request (the first included).
    pub max_attempts: Option<u32>,
    /// Time since a request's first failure.
    pub max_duration: Option<Duration>,
}

impl RetryLimit {
    /// True when a request sent `attempts` times, failing since
    /// `failing_since`, is to be set aside.
    fn exhausted(&self, attempts: u32, failing_since: Option<Instant>) -> bool {
        self.max_attempts.is_some_and(|m| attempts >= m)
            || matches!((self.max_duration, failing_since), (Some(d), Some(t)) if t.elapsed() >= d)
    }
}

impl Settings {
    /// Requests laid out by `framing`, sent to `target`, refused items set
    /// aside in `dead_letter`; requests of 1 MiB and 10,000 events at
    /// most, sent 1 s after their first event at the latest, 16 at once
    /// at most, until [`Settings::limits`] says otherwise.
    pub fn new(framing: Framing, target: String, dead_letter: Option<PathBuf>) -> Self {
        Self {
            framing,
            max_bytes: 1 << 20,
            max_events: 10_000,
            linger: Duration::from_secs(1),
            max_in_flight: 16,
            dead_letter,
            target,
            retry: RetryLimit::default(),
        }
    }

    /// The sink's `retry` limits.
    pub fn retry(mut self, retry: RetryLimit) -> Self {
        self.retry = retry;
        self
    }

    /// The sink's `batch` (`max_bytes`, `max_events`, `linger`) and
    /// `max_in_flight_requests`.
    pub fn limits(
        mut self,
        max_bytes: usize,
        max_events: usize,
        linger: Duration,
        max_in_flight: usize,
    ) -> Self {
        self.max_bytes = max_bytes;
        self.max_events = max_events;
        self.linger = linger;
        self.max_in_flight = max_in_flight;
        self
    }
}

/// Delivers the payloads of `rx` through `sink` until the queue closes
/// and every request was answered.
pub fn run<S: RequestSink>(
    sink: Arc<S>,
    rx: PayloadReceiver,
    settings: Settings,
    metrics: ComponentMetrics,
) -> BoxFuture {
    let dm = metrics.delivery();
    let window = Window::new(2, settings.max_in_flight, dm.clone());
    let calls = Calls::new(S::WORDING, settings.target.clone(), metrics.clone());
    let driver = Arc::new(Driver {
        sink,
        settings,
        metrics,
        dm,
        window,
        calls,
        partial_log: RateLimit::default(),
        bodies: Bodies::default(),
    });
    Box::pin(driver.run(rx))
}

/// One sink's delivery state, shared by its requests in flight.
struct Driver<S> {
    sink: Arc<S>,
    settings: Settings,
    metrics: ComponentMetrics,
    dm: DeliveryMetrics,
    window: Arc<Window>,
    /// The retry and hold policy, shared with sinks that make their own
    /// calls.
    calls: Calls,
    /// Of the partial successes.
    partial_log: RateLimit,
    /// Request bodies held by requests being sent.
    bodies: Bodies,
}

/// The request bodies a sink holds at once, charged to its pipeline's
/// memory budget.
///
/// Uncharged, they doubled the data held in flight: with 20-odd OTLP
/// requests in flight, their protobuf bodies took as much heap as the
/// encoded records the budget counted (heaptrack: 10.6 MB beside 10.5 MB
/// at the peak), and the resident size rose 10-18 MB above the limit's
/// share (BENCHMARKS.md section 24). A body is charged when the budget has
/// room; otherwise its request waits for another request's body to be
/// freed, so memory bounds how many requests are sent at once. A request
/// with no other being sent takes its charge regardless, so that delivery
/// always moves (the budget may be full of payloads waiting for it).
#[derive(Default)]
struct Bodies {
    /// Requests holding a body charge.
    sending: AtomicUsize,
    /// Notified when one of them lets its body go.
    freed: tokio::sync::Notify,
}

impl Bodies {
    /// Charges a body of `bytes` for the request holding `acks`, waiting
    /// while the budget is full and other bodies are held.
    async fn charge<'a>(&'a self, acks: &batch::RequestAcks, bytes: usize) -> BodyCharge<'a> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a release between the
            // check and the wait is not missed.
            freed.as_mut().enable();
            let alone = self.sending.load(Ordering::Acquire) == 0;
            if let Some(charge) = acks.charge(bytes, alone) {
                self.sending.fetch_add(1, Ordering::AcqRel);
                return BodyCharge {
                    bodies: self,
                    charge,
                };
            }
            freed.await;
        }
    }
}

/// A request body's share of the memory budget; released on drop.
struct BodyCharge<'a> {
    bodies: &'a Bodies,
    charge: MemoryCharge,
}

impl Drop for BodyCharge<'_> {
    fn drop(&mut self) {
        // The memory first, so that a woken request finds it free.
        drop(std::mem::take(&mut self.charge));
        self.bodies.sending.fetch_sub(1, Ordering::AcqRel);
        self.bodies.freed.notify_waiters();
    }
}

/// Lets through one event per [`LOUD_EVERY`].
#[derive(Default)]
struct RateLimit(parking_lot::Mutex<Option<Instant>>);

impl RateLimit {
    fn allow(&self) -> bool {
        let mut last = self.0.lock();
        if last.is_none_or(|t| t.elapsed() >= LOUD_EVERY) {
            *last = Some(Instant::now());
            return true;
        }
        false
    }
}

/// The waits of one request between its attempts, and its transient
/// failures so far (for `retry` limits).
struct Waits {
    backoff: Backoff,
    refused: Duration,
    /// Attempts that failed transiently.
    failures: u32,
    /// When the first of them happened.
    failing_since: Option<Instant>,
    /// What the last one was, for the dead letter.
    last_failure: String,
}

impl Waits {
    fn new() -> Self {
        Self {
            backoff: Backoff::default(),
            refused: FIRST_REFUSED_BACKOFF,
            failures: 0,
            failing_since: None,
            last_failure: String::new(),
        }
    }

    /// After a transient failure: the server's wish, else the backoff.
    fn transient(&mut self, after: Option<Duration>) -> Duration {
        self.failures += 1;
        self.failing_since.get_or_insert_with(Instant::now);
        after.unwrap_or_else(|| self.backoff.next_delay())
    }

    /// While the destination refuses: slower, since a person must act.
    fn refused(&mut self) -> Duration {
        let d = self.refused;
        self.refused = (d * 2).min(MAX_REFUSED_BACKOFF);
        d
    }
}

/// What one attempt sent.
struct Sent<'a, P> {
    /// The request.
    batch: &'a Batch,
    /// The sink's plan of it.
    plan: &'a P,
    /// The items sent (ascending).
    items: &'a [u32],
    /// The size of the body.
    bytes: usize,
}

/// What follows an answer.
enum Next {
    /// The items sent are delivered or set aside.
    Done,
    /// Send the same body again after the wait (a held request).
    Again(Duration),
    /// Send the same body again after the wait: a transient failure,
    /// within the `retry` limits.
    Retry(Duration),
    /// Send each half alone.
    Split,
    /// After the wait, send these items (fewer than before) alone; true
    /// when they failed transiently (not held).
    Narrow(Vec<u32>, Duration, bool),
}

/// `error_type` of a held request by its status.
fn hold_reason(status: u16) -> &'static str {
    match status {
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        _ => "refused",
    }
}

impl<S: RequestSink> Driver<S> {
    async fn run(self: Arc<Self>, mut rx: PayloadReceiver) {
        let s = &self.settings;
        let mut tasks = tokio::task::JoinSet::new();
        let mut open = true;
        let mut builder = Builder::new(s.framing, s.max_bytes, s.max_events);
        while open || !builder.is_empty() {
            // Wait for more data, but no longer than the linger time of
            // the oldest event waiting.
            let got = match builder.deadline(s.linger) {
                Some(d) if open => tokio::time::timeout_at(d.into(), rx.recv()).await.ok(),
                None if open => Some(rx.recv().await),
                _ => Some(None),
            };
            match got {
                Some(Some(p)) => builder.push(p),
                Some(None) => open = false,
                None => {} // linger expired
            }
            let flush_all = !open
                || builder
                    .deadline(s.linger)
                    .is_some_and(|d| d <= Instant::now());
            while let Some(req) = builder.take(flush_all) {
                self.window.acquire().await;
                let me = self.clone();
                tasks.spawn(async move {
                    me.deliver(req).await;
                    me.window.release();
                });
            }
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Delivers one request; its payloads are acknowledged when it returns
    /// having marked it delivered, and failed when it returns early or is
    /// dropped.
    async fn deliver(&self, mut req: Request) {
        let started = Instant::now();
        let batch = Batch {
            body: Bytes::from(std::mem::take(&mut req.body)),
            records: std::mem::take(&mut req.records),
        };
        let (plan, total) = self.sink.plan(&batch);
        let mut waits = Waits::new();
        // Groups of items still to deliver; halves of a split request
        // wait here.
        let mut todo: Vec<Vec<u32>> = vec![(0..total as u32).collect()];
        while let Some(mut pending) = todo.pop() {
            while !pending.is_empty() {
                let items = Selection::new(&pending, total);
                let body = match self.sink.build_request(&batch, &plan, items) {
                    Ok(b) => b,
                    Err(e) => {
                        // Dropping the request reports the failure.
                        tracing::error!(error = %e, "{}: cannot encode a request; the batch will be read again", S::WORDING.sink);
                        return;
                    }
                };
                // A body of its own (protobuf, a JSON document, compressed
                // data) is a second copy of the records for as long as the
                // attempts last: charged like the encoded data, so that
                // `--memory-limit` bounds it too (see `Bodies`). The
                // batch's own body shares the charge its payloads hold.
                let _body_charge = if body.as_ptr() == batch.body.as_ptr() {
                    None
                } else {
                    Some(self.bodies.charge(&req.acks, body.len()).await)
                };
                let next = loop {
                    let answer = self.sink.send(body.clone(), pending.len()).await;
                    let sent = Sent {
                        batch: &batch,
                        plan: &plan,
                        items: &pending,
                        bytes: body.len(),
                    };
                    let next = self.act(answer, &sent, &mut waits);
                    // Past the `retry` limits, a transient failure sets
                    // the items aside instead of waiting again.
                    let give_up = match &next {
                        Next::Retry(_) | Next::Narrow(_, _, true) => self
                            .settings
                            .retry
                            .exhausted(waits.failures, waits.failing_since),
                        _ => false,
                    };
                    match next {
                        Next::Retry(_) if give_up => {
                            let all = pending.clone();
                            break self.exhausted(&sent, &all, &waits);
                        }
                        Next::Narrow(rest, _, true) if give_up => {
                            break self.exhausted(&sent, &rest, &waits);
                        }
                        Next::Again(wait) | Next::Retry(wait) => tokio::time::sleep(wait).await,
                        next => break next,
                    }
                };
                match next {
                    Next::Split => {
                        let back = pending.split_off(pending.len() / 2);
                        todo.push(back);
                        todo.push(std::mem::take(&mut pending));
                    }
                    Next::Narrow(rest, wait, _) => {
                        tokio::time::sleep(wait).await;
                        pending = rest;
                    }
                    Next::Done | Next::Again(_) | Next::Retry(_) => break,
                }
            }
        }
        self.dm.latency.observe(started.elapsed().as_secs_f64());
        req.acks.delivered = true;
    }

    /// Acts on the answer to what was `sent`.
    fn act(&self, answer: Answer, sent: &Sent<'_, S::Plan<'_>>, waits: &mut Waits) -> Next {
        let pending = sent.items;
        let w = S::WORDING;
        let target = &self.settings.target;
        let n = pending.len() as u64;
        match answer {
            Answer::Delivered => {
                self.delivered(n, sent.bytes);
                Next::Done
            }
            Answer::PartialSuccess { rejected, message } => {
                let rejected = rejected.clamp(0, n as i64) as u64;
                if rejected > 0 {
                    self.metrics.discarded("rejected", rejected);
                    if self.partial_log.allow() {
                        tracing::warn!(rejected, message = %message, target = %target, "{}: {} accepted the request but rejected some {} (partial success); they are not sent again", w.sink, w.peer, w.items.1);
                    }
                }
                self.delivered(n - rejected, sent.bytes);
                Next::Done
            }
            Answer::Items(items) if items.len() != pending.len() => {
                tracing::error!(
                    sent = pending.len(),
                    answered = items.len(),
                    "{}: the answer does not match the request; sending it again",
                    w.sink
                );
                self.transient(n, None, "request_failed", waits)
            }
            Answer::Items(items) => self.act_on_items(items, sent, waits),
            Answer::Retry {
                after,
                error_type,
                why,
            } => {
                tracing::warn!(error_type, target = %target, "{}: retryable failure: {why}", w.sink);
                waits.last_failure = why;
                self.transient(n, after, error_type, waits)
            }
            Answer::Hold { status, text } => {
                Next::Again(
                    self.calls
                        .hold(status, &text, n, waits, || self.sink.server()),
                )
            }
            Answer::Refused { split: true, .. } if pending.len() > 1 => Next::Split,
            Answer::Refused { status, text, .. } => {
                let refused: Vec<(u32, u16, &str)> = pending
                    .iter()
                    .map(|&i| (i, status, text.as_str()))
                    .collect();
                if self.set_aside(sent, &refused, 1) {
                    Next::Done
                } else {
                    Next::Again(waits.refused())
                }
            }
        }
    }

    /// `n` items delivered in a body of `sent_bytes`.
    fn delivered(&self, n: u64, sent_bytes: usize) {
        self.window.on_success();
        self.metrics.recovered();
        self.metrics.sent_events.inc_by(n);
        self.metrics.sent_bytes.inc_by(sent_bytes as u64);
    }

    /// `n` items to send again after a transient failure.
    fn transient(
        &self,
        n: u64,
        after: Option<Duration>,
        error_type: &'static str,
        waits: &mut Waits,
    ) -> Next {
        self.window.on_failure();
        Next::Retry(self.calls.transient(n, after, error_type, waits))
    }

    /// The `retry` limits are reached for `items` of what was `sent`: they
    /// go to the dead letter file (which a sink with limits always has),
    /// counted as `reason="retries_exhausted"`; when it cannot be written
    /// they are retried as before, loudly.
    fn exhausted(&self, sent: &Sent<'_, S::Plan<'_>>, items: &[u32], waits: &Waits) -> Next {
        let since = waits
            .failing_since
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let why = format!(
            "retries exhausted: {} attempts over {since:.1}s failed (`retry` limits); last failure: {}",
            waits.failures,
            if waits.last_failure.is_empty() {
                "a transient answer"
            } else {
                &waits.last_failure
            }
        );
        let refused: Vec<(u32, u16, &str)> = items.iter().map(|&i| (i, 0, why.as_str())).collect();
        if self.set_aside_as(sent, &refused, refused.len() as u64, "retries_exhausted") {
            Next::Done
        } else {
            Next::Retry(MAX_REFUSED_BACKOFF)
        }
    }

    /// Acts on one answer per item.
    fn act_on_items(
        &self,
        items: Vec<Item>,
        sent: &Sent<'_, S::Plan<'_>>,
        waits: &mut Waits,
    ) -> Next {
        let w = S::WORDING;
        let mut retry = Vec::new();
        let mut refused = Vec::new();
        let mut held = false;
        let (mut ok, mut dups) = (0u64, 0u64);
        for (&i, item) in sent.items.iter().zip(items) {
            match item {
                Item::Delivered => ok += 1,
                Item::Duplicate => dups += 1,
                Item::Retry => retry.push(i),
                Item::Hold(status, text) => {
                    held = true;
                    self.loud(
                        status,
                        &text,
                        &format!(
                            "{} answers {status} for {}; they wait and are retried: fix {}",
                            w.peer, w.items.1, w.hold_fix
                        ),
                    );
                    retry.push(i);
                }
                Item::Refused(status, text) => refused.push((i, status, text)),
            }
        }
        if !refused.is_empty() {
            let view: Vec<(u32, u16, &str)> = refused
                .iter()
                .map(|(i, s, t)| (*i, *s, t.as_str()))
                .collect();
            if !self.set_aside(sent, &view, view.len() as u64) {
                held = true;
                retry.extend(refused.iter().map(|r| r.0));
                // Items stay in request order, which `Selection` relies on.
                retry.sort_unstable();
            }
        }
        self.metrics.sent_events.inc_by(ok);
        if let Some(c) = self.sink.duplicates() {
            c.inc_by(dups);
        }
        if ok + dups > 0 {
            self.metrics.sent_bytes.inc_by(sent.bytes as u64);
        }
        if retry.is_empty() {
            self.window.on_success();
            self.metrics.recovered();
            return Next::Done;
        }
        self.dm.retried_events.inc_by(retry.len() as u64);
        self.window.on_failure();
        let wait = if held {
            waits.refused()
        } else {
            self.metrics.error("item_retried", retry.len() as u64);
            waits.last_failure = format!("{} answered retry for the item", w.peer);
            waits.transient(None)
        };
        Next::Narrow(retry, wait, !held)
    }

    /// Writes the `refused` items (item, status, answer) to the dead letter
    /// file in one write; false (they are retried) without one or when it
    /// cannot be written. Without a file, `rejected` errors are counted.
    fn set_aside(
        &self,
        sent: &Sent<'_, S::Plan<'_>>,
        refused: &[(u32, u16, &str)],
        rejected: u64,
    ) -> bool {
        self.set_aside_as(sent, refused, rejected, "dead_letter")
    }

    /// [`Driver::set_aside`], counted as discarded with `reason`.
    fn set_aside_as(
        &self,
        sent: &Sent<'_, S::Plan<'_>>,
        refused: &[(u32, u16, &str)],
        rejected: u64,
        reason: &'static str,
    ) -> bool {
        let w = S::WORDING;
        let target = &self.settings.target;
        let Some(&(_, status, text)) = refused.first() else {
            return true;
        };
        let n = refused.len();
        let (what, retried) = if n == 1 {
            (w.items.0, "it is retried")
        } else {
            (w.items.1, "they are retried")
        };
        let Some(path) = &self.settings.dead_letter else {
            self.metrics.error("rejected", rejected);
            self.metrics
                .failing(format!("{status} from {target} for {what}"));
            self.loud(status, text, &format!(
                "{} refuses {n} {what} with {status}; {retried}: configure `dead_letter` to set such {} aside",
                w.peer, w.items.1
            ));
            return false;
        };
        let records: Vec<(DeadRecord<'_>, u16)> = refused
            .iter()
            .map(|&(i, status, text)| {
                (
                    self.sink.dead_letter_record(
                        self.sink.item_record(sent.batch, sent.plan, i as usize),
                        text,
                    ),
                    status,
                )
            })
            .collect();
        let lines = records.iter().map(|(r, status)| {
            (
                &*r.record,
                Refusal {
                    reason: if reason == "retries_exhausted" {
                        "retries exhausted"
                    } else {
                        "refused by the endpoint"
                    },
                    status: *status,
                    answer: &r.answer,
                    sink: self.metrics.health_key(),
                    url: target,
                },
            )
        });
        match dead_letter::write_each(path, lines) {
            Ok(()) => {
                tracing::warn!(status, answer = %text, path = %path.display(), reason, "{}: {n} {what} set aside ({} refused them, or the retries were exhausted): written to the dead letter file", w.sink, w.peer);
                self.metrics.discarded(reason, n as u64);
                true
            }
            Err(e) => {
                self.metrics.error("dead_letter_failed", 1);
                self.metrics.failing(format!(
                    "cannot write the dead letter file {}: {e}",
                    path.display()
                ));
                self.loud(
                    status,
                    text,
                    &format!(
                        "cannot write the dead letter file {}: {e}; {retried}",
                        path.display()
                    ),
                );
                false
            }
        }
    }

    /// Logs `msg` as an error at most once per [`LOUD_EVERY`].
    fn loud(&self, status: u16, text: &str, msg: &str) {
        self.calls.loud(status, text, msg, || self.sink.server());
    }
}

/// The driver's policy for a sink that makes its own calls rather than
/// requests of records (the s3 sink: an object is several calls, and its
/// events are acknowledged only once the last one succeeded): each call
/// is made until it succeeds, with the retries, holds, loud errors and
/// metrics of the requests of [`run`].
pub struct Calls {
    wording: Wording,
    target: String,
    metrics: ComponentMetrics,
    dm: DeliveryMetrics,
    /// Of the errors an operator must act on.
    loud: RateLimit,
}

impl Calls {
    /// The policy of a sink worded `wording` that calls `target`.
    pub fn new(wording: Wording, target: String, metrics: ComponentMetrics) -> Self {
        let dm = metrics.delivery();
        Self {
            wording,
            target,
            metrics,
            dm,
            loud: RateLimit::default(),
        }
    }

    /// Makes `call` until it succeeds and returns what it gave. A call
    /// carrying `events` events answered [`Answer::Retry`] is made again
    /// after the server's wish or the backoff; [`Answer::Hold`] and
    /// [`Answer::Refused`] (a call cannot be split: an operator must act)
    /// wait loudly, retried from 0.5 s doubling to 30 s. `what` names the
    /// call in the log of a retry (an object's key); a held call's answer
    /// names it itself.
    pub async fn until_done<T, F, Fut>(&self, events: u64, what: &str, mut call: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Answer>>,
    {
        let mut waits = Waits::new();
        loop {
            let wait = match call().await {
                Ok(t) => {
                    self.metrics.recovered();
                    return t;
                }
                Err(Answer::Retry {
                    after,
                    error_type,
                    why,
                }) => {
                    tracing::warn!(error_type, target = %self.target, what, "{}: retryable failure: {why}", self.wording.sink);
                    self.transient(events, after, error_type, &mut waits)
                }
                Err(Answer::Hold { status, text } | Answer::Refused { status, text, .. }) => {
                    self.hold(status, &text, events, &mut waits, || None)
                }
                Err(other) => {
                    tracing::error!(answer = ?other, what, "{}: unexpected answer; retrying", self.wording.sink);
                    self.transient(events, None, "request_failed", &mut waits)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Counts `events` delivered in `bytes` sent, `started` ago.
    pub fn delivered(&self, events: u64, bytes: u64, started: Instant) {
        self.metrics.recovered();
        self.metrics.sent_events.inc_by(events);
        self.metrics.sent_bytes.inc_by(bytes);
        self.dm.latency.observe(started.elapsed().as_secs_f64());
    }

    /// The wait before `n` items are sent again after a transient
    /// failure, counted.
    fn transient(
        &self,
        n: u64,
        after: Option<Duration>,
        error_type: &'static str,
        waits: &mut Waits,
    ) -> Duration {
        self.metrics.error(error_type, 1);
        self.metrics
            .failing(format!("deliveries to {} fail", self.target));
        self.dm.retried_events.inc_by(n);
        waits.transient(after)
    }

    /// The wait before `n` items held by a `status` answer are sent
    /// again, counted and logged loudly.
    fn hold(
        &self,
        status: u16,
        text: &str,
        n: u64,
        waits: &mut Waits,
        server: impl FnOnce() -> Option<String>,
    ) -> Duration {
        let w = self.wording;
        let reason = hold_reason(status);
        self.metrics.error(reason, 1);
        self.metrics
            .failing(format!("{status} ({reason}) from {}", self.target));
        self.dm.retried_events.inc_by(n);
        self.loud(
            status,
            text,
            &format!(
                "{} answers {status} ({reason}); the data waits and is retried: fix {}",
                w.peer, w.hold_fix
            ),
            server,
        );
        waits.refused()
    }

    /// Logs `msg` as an error at most once per [`LOUD_EVERY`].
    fn loud(&self, status: u16, text: &str, msg: &str, server: impl FnOnce() -> Option<String>) {
        if self.loud.allow() {
            let server = server().unwrap_or_default();
            tracing::error!(status, answer = %text, target = %self.target, server = %server, sink = %self.metrics.health_key(), "{}: {msg}", self.wording.sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::plugin::{payload_channel, Encoded, Payload};
    use petrel_core::{AckReceiver, BatchAck, MemoryCharge, SourceInfo};
    use std::sync::atomic::{AtomicI32, Ordering};

    /// 1 delivered, -1 failed, 0 not answered.
    #[derive(Default)]
    struct Acked(AtomicI32);

    impl AckReceiver for Acked {
        fn complete(&self, _seq: u64, delivered: bool) {
            self.0
                .store(if delivered { 1 } else { -1 }, Ordering::SeqCst);
        }
    }

    /// How a test answers a body of so many items.
    type Script = Box<dyn Fn(&[u8], usize) -> Answer + Send + Sync>;

    /// A sink whose answers a test scripts from the body sent.
    struct Fake {
        answer: Script,
        sent: parking_lot::Mutex<Vec<String>>,
        duplicates: Counter,
        fail_encoding: bool,
    }

    impl RequestSink for Fake {
        type Plan<'b> = ();

        const WORDING: Wording = Wording {
            sink: "test sink",
            peer: "the store",
            items: ("record", "records"),
            hold_fix: "the test",
        };

        fn build_request(
            &self,
            batch: &Batch,
            _: &(),
            items: Selection<'_>,
        ) -> anyhow::Result<Bytes> {
            anyhow::ensure!(!self.fail_encoding, "cannot encode");
            Ok(batch.framed(items, Framing::NDJSON))
        }

        async fn send(&self, body: Bytes, items: usize) -> Answer {
            self.sent
                .lock()
                .push(String::from_utf8_lossy(&body).into_owned());
            (self.answer)(&body, items)
        }

        fn duplicates(&self) -> Option<&Counter> {
            Some(&self.duplicates)
        }
    }

    fn fake(answer: impl Fn(&[u8], usize) -> Answer + Send + Sync + 'static) -> Fake {
        Fake {
            answer: Box::new(answer),
            sent: Default::default(),
            duplicates: Counter::default(),
            fail_encoding: false,
        }
    }

    /// A sink that answers `first()` to the first request, `then()` after.
    fn first_then(first: fn() -> Answer, then: fn() -> Answer) -> Fake {
        let calls = AtomicI32::new(0);
        fake(move |_, _| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                first()
            } else {
                then()
            }
        })
    }

    /// Delivers one payload of `records` (one per line) through `sink`;
    /// returns how its acknowledgement was answered and the metrics.
    fn deliver(
        sink: Fake,
        records: &[&str],
        dead_letter: Option<PathBuf>,
    ) -> (i32, Arc<Fake>, ComponentMetrics) {
        let metrics = petrel_core::Metrics::new().component("p", "sink", "t", "test");
        let acked = Arc::new(Acked::default());
        let mut data = Encoded::default();
        for r in records {
            data.bytes.extend_from_slice(r.as_bytes());
            data.bytes.push(b'\n');
            data.record_ends.push(data.bytes.len() as u32);
        }
        let (tx, rx) = payload_channel();
        let sent = tx.send(Payload {
            data,
            events: records.len() as u64,
            input_bytes: 0,
            source: Arc::new(SourceInfo::default()),
            ack: BatchAck::start(acked.clone(), 0),
            charge: MemoryCharge::none(),
        });
        assert!(sent.is_ok());
        drop(tx);
        let sink = Arc::new(sink);
        let settings = Settings::new(Framing::NDJSON, "http://store".into(), dead_letter).limits(
            1 << 20,
            1000,
            Duration::from_millis(10),
            4,
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run(sink.clone(), rx, settings, metrics.clone()));
        (acked.0.load(Ordering::SeqCst), sink, metrics)
    }

    /// The value of the series of `name` whose labels contain `label`.
    fn metric(m: &ComponentMetrics, name: &str, label: &str) -> f64 {
        let text = m.metrics().render();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    }

    /// A request's body is charged to the pipeline's budget: a second
    /// body waits while the budget is full and another body is held, and
    /// takes its charge once that one is freed; a body with none other
    /// held is charged regardless, so delivery never waits on itself.
    #[tokio::test]
    async fn request_bodies_are_charged_and_wait_for_room() {
        use futures_util::FutureExt;
        use petrel_core::{AckPart, MemoryBudget, PipelineBudget};
        use std::sync::atomic::AtomicBool;
        let budget = PipelineBudget::new(MemoryBudget::new(1000), 1000);
        let payload = budget.try_charge(900).expect("room for the payload");
        let acks = batch::RequestAcks {
            acks: vec![Arc::new(batch::SharedAck {
                part: parking_lot::Mutex::new(Some(AckPart::detached())),
                failed: AtomicBool::new(false),
                charge: payload,
            })],
            delivered: true,
        };
        let bodies = Bodies::default();
        // Alone: charged past the limit.
        let first = bodies
            .charge(&acks, 500)
            .now_or_never()
            .expect("a lone body is charged at once");
        assert_eq!(budget.used(), 1400);
        let mut second = std::pin::pin!(bodies.charge(&acks, 50));
        assert!(futures_util::poll!(second.as_mut()).is_pending());
        assert_eq!(budget.used(), 1400);
        drop(first);
        assert_eq!(budget.used(), 900);
        let second = match futures_util::poll!(second.as_mut()) {
            std::task::Poll::Ready(c) => c,
            std::task::Poll::Pending => panic!("the freed body's room was not taken"),
        };
        assert_eq!(budget.used(), 950);
        drop(second);
        assert_eq!(budget.used(), 900);
        assert_eq!(bodies.sending.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_refused_record_is_isolated_and_set_aside_and_the_rest_delivered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dl = dir.path().join("dead.ndjson");
        let sink = fake(|body, _| {
            if body.windows(3).any(|w| w == b"bad") {
                Answer::Refused {
                    status: 400,
                    text: "no".into(),
                    split: true,
                }
            } else {
                Answer::Delivered
            }
        });
        let (acked, sink, m) = deliver(
            sink,
            &["{\"a\":1}", "bad", "{\"c\":3}", "{\"d\":4}"],
            Some(dl.clone()),
        );
        assert_eq!(acked, 1);
        let text = std::fs::read_to_string(&dl).expect("dead letter");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert_eq!(lines[0]["record"], "bad");
        assert_eq!(lines[0]["status"], 400);
        assert_eq!(lines[0]["url"], "http://store");
        let sent = sink.sent.lock().clone();
        // All, the first half, its halves, the second half.
        assert_eq!(sent.len(), 5, "{sent:?}");
        assert_eq!(metric(&m, "petrel_component_sent_events_total", ""), 3.0);
        assert_eq!(
            metric(&m, "petrel_component_discarded_events_total", "dead_letter"),
            1.0
        );
    }

    #[test]
    fn a_request_refused_as_a_whole_sets_all_its_items_aside_in_one_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dl = dir.path().join("dead.ndjson");
        let sink = fake(|_, _| Answer::Refused {
            status: 400,
            text: "too old".into(),
            split: false,
        });
        let (acked, sink, _) = deliver(sink, &["a", "b", "c"], Some(dl.clone()));
        assert_eq!(acked, 1);
        assert_eq!(sink.sent.lock().len(), 1);
        let text = std::fs::read_to_string(&dl).expect("dead letter");
        assert_eq!(text.lines().count(), 3, "{text}");
    }

    #[test]
    fn items_answered_retry_are_sent_again_alone() {
        let sink = fake(|_, items| {
            if items == 3 {
                Answer::Items(vec![Item::Delivered, Item::Retry, Item::Duplicate])
            } else {
                Answer::Items(vec![Item::Delivered])
            }
        });
        let (acked, sink, m) = deliver(sink, &["a", "b", "c"], None);
        assert_eq!(acked, 1);
        assert_eq!(*sink.sent.lock(), ["a\nb\nc\n", "b\n"]);
        assert_eq!(sink.duplicates.get(), 1);
        assert_eq!(
            metric(&m, "petrel_component_errors_total", "item_retried"),
            1.0
        );
        assert_eq!(metric(&m, "petrel_component_retried_events_total", ""), 1.0);
        assert_eq!(metric(&m, "petrel_component_sent_events_total", ""), 2.0);
    }

    #[test]
    fn a_refused_record_without_a_dead_letter_is_retried_until_accepted() {
        let refused = || Answer::Refused {
            status: 422,
            text: "no".into(),
            split: true,
        };
        let sink = first_then(refused, || Answer::Delivered);
        let (acked, sink, m) = deliver(sink, &["a"], None);
        assert_eq!(acked, 1);
        assert_eq!(sink.sent.lock().len(), 2);
        assert_eq!(metric(&m, "petrel_component_errors_total", "rejected"), 1.0);
    }

    #[test]
    fn a_retry_honours_the_wait_asked_for_and_counts_the_error() {
        let retry = || Answer::Retry {
            after: Some(Duration::from_millis(300)),
            error_type: "request_failed",
            why: "answered 503".into(),
        };
        let partial = || Answer::PartialSuccess {
            rejected: 1,
            message: "one".into(),
        };
        let sink = first_then(retry, partial);
        let started = Instant::now();
        let (acked, _, m) = deliver(sink, &["a", "b"], None);
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(acked, 1);
        assert_eq!(
            metric(&m, "petrel_component_errors_total", "request_failed"),
            1.0
        );
        assert_eq!(
            metric(&m, "petrel_component_discarded_events_total", "rejected"),
            1.0
        );
        assert_eq!(metric(&m, "petrel_component_sent_events_total", ""), 1.0);
    }

    #[test]
    fn a_request_that_cannot_be_encoded_fails_its_payloads() {
        let mut sink = fake(|_, _| Answer::Delivered);
        sink.fail_encoding = true;
        let (acked, sink, _) = deliver(sink, &["a"], None);
        assert_eq!(acked, -1);
        assert!(sink.sent.lock().is_empty());
    }

    #[test]
    fn framing_and_selections() {
        let batch = Batch {
            body: Bytes::from_static(b"[a,b,c]"),
            records: vec![1..2, 3..4, 5..6],
        };
        let all = [0, 1, 2];
        assert_eq!(
            &batch.framed(Selection::new(&all, 3), Framing::JSON_ARRAY)[..],
            b"[a,b,c]"
        );
        assert_eq!(
            &batch.framed(Selection::new(&[0, 2], 3), Framing::JSON_ARRAY)[..],
            b"[a,c]"
        );
        assert_eq!(
            &batch.framed(Selection::new(&[1], 3), Framing::NDJSON)[..],
            b"b\n"
        );
    }
}
