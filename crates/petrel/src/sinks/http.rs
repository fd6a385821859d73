//! `type: http` — POSTs batches of events to an HTTP endpoint.
//!
//! Events are gathered into requests of at most `batch.max_bytes` bytes and
//! `batch.max_events` events, sent at the latest `batch.timeout_ms` after
//! the first event waited. A batch is acknowledged to its source when every
//! request carrying its events got a 2xx answer; a request that is
//! cancelled or whose task panics reports a failure, never a delivery.
//!
//! Answers are classified: 2xx delivered; connection errors, 408, 429 and
//! 5xx retried with exponential backoff (429 and 503 honour `Retry-After`);
//! 401, 403 and 404 retried with backoff too (an operator fixes a token or
//! a URL; the data waits) with a loud, rate-limited error and
//! `error_type="unauthorized"|"forbidden"|"not_found"`; any other 4xx
//! (400, 413, 422, ...) means the endpoint refuses some record: the request
//! is split in halves until the refused records are alone, and each goes to
//! the `dead_letter` file (ndjson, with the status and the answer) and is
//! counted (`reason="dead_letter"`). Without `dead_letter`, a refused
//! record is retried with backoff like a 401: nothing is committed
//! silently. TLS (https) uses rustls with the Mozilla root certificates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::config::Map;
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, Payload, PayloadReceiver, Sink};
use petrel_core::{AckPart, ComponentMetrics, DeliveryMetrics, EventBatch};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};

use super::congestion::{Backoff, Window};

/// Keys accepted by the HTTP sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "url",
    "encoding",
    "compression",
    "headers",
    "batch",
    "timeout_ms",
    "max_in_flight_requests",
    "dead_letter",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"POSTs batches of events to an HTTP endpoint; a batch is acknowledged when every request carrying its events got a 2xx, retryable failures are retried without limit, and refused records are isolated by halving."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "url",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: an `http://` or `https://` endpoint (TLS by rustls, Mozilla roots)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "encoding",
        kind: petrel_core::plugin::KeyKind::OneOf(&["ndjson", "json_array"]),
        default: Some(r#"ndjson"#),
        doc: r#"One object per line, or one JSON array."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "compression",
        kind: petrel_core::plugin::KeyKind::OneOf(&["none", "gzip", "zstd"]),
        default: Some(r#"none"#),
        doc: r#"Body compression, with `Content-Encoding`."#,
    },
    HEADERS_DOC,
    crate::sinks::http::batch_doc(r#"{max_bytes: 1MiB, max_events: 10000, timeout_ms: 1000}"#),
    crate::sinks::http::timeout_doc(r#"30000"#),
    crate::sinks::http::max_in_flight_doc(r#"16"#),
    DEAD_LETTER_DOC,
];

/// The `headers` key, documented once for every plugin that reads it.
pub const HEADERS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "headers",
    kind: petrel_core::plugin::KeyKind::Map,
    default: Some(r#"{}"#),
    doc: r#"Extra HTTP headers, name to value; `${ENV}` and `${ENV:-default}` are expanded at load."#,
};

/// The `dead_letter` key, documented once for every plugin that reads it.
pub const DEAD_LETTER_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "dead_letter",
    kind: petrel_core::plugin::KeyKind::String,
    default: None,
    doc: r#"A file (ndjson, fsynced) where records the server refuses are set aside as `{"reason", "status", "answer", "sink", "url", "record"}` and counted as `discarded_events_total{reason="dead_letter"}`. Without it a refused record is retried with backoff (`error_type="rejected"`, a loud error): nothing is committed silently."#,
};

/// The `batch` key of the HTTP-based sinks, with their `default`.
pub const fn batch_doc(default: &'static str) -> petrel_core::plugin::KeyDoc {
    petrel_core::plugin::KeyDoc {
        name: "batch",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(default),
        doc: "`{max_bytes, max_events, timeout_ms}`: a request is sent when it holds `max_bytes` or `max_events`, or `timeout_ms` after its first event waited.",
    }
}

/// The `timeout_ms` key of the HTTP-based sinks, with their `default`.
pub const fn timeout_doc(default: &'static str) -> petrel_core::plugin::KeyDoc {
    petrel_core::plugin::KeyDoc {
        name: "timeout_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(default),
        doc: "Timeout of one request.",
    }
}

/// The `max_in_flight_requests` key of the HTTP-based sinks, with their
/// `default`.
pub const fn max_in_flight_doc(default: &'static str) -> petrel_core::plugin::KeyDoc {
    petrel_core::plugin::KeyDoc {
        name: "max_in_flight_requests",
        kind: petrel_core::plugin::KeyKind::Int,
        default: Some(default),
        doc:
            "Upper bound of the congestion window (AIMD: a failure halves it, a success widens it).",
    }
}

/// How events are laid out in a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEncoding {
    /// One JSON object per line.
    Ndjson,
    /// One JSON array of objects.
    JsonArray,
}

/// Request body compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// As is.
    None,
    /// `Content-Encoding: gzip`.
    Gzip,
    /// `Content-Encoding: zstd`.
    Zstd,
}

/// Configuration of the HTTP sink.
#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    /// Endpoint.
    pub url: reqwest::Url,
    /// Body layout.
    pub encoding: BodyEncoding,
    /// Body compression.
    pub compression: Compression,
    /// Extra headers, `${ENV}` expanded.
    pub headers: Vec<(String, String)>,
    /// Largest request body before compression.
    pub max_bytes: usize,
    /// Most events per request.
    pub max_events: usize,
    /// Longest wait before a partial request is sent.
    pub linger: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
    /// Upper bound of the congestion window, in requests.
    pub max_in_flight: usize,
    /// Where records the endpoint refuses (400, 413, 422, ...) are written.
    pub dead_letter: Option<std::path::PathBuf>,
}

impl HttpSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let url_node = map.required("url", "http://127.0.0.1:8080/ingest")?;
        let url_text = url_node.as_str()?;
        let url = match reqwest::Url::parse(url_text) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => u,
            Ok(u) => {
                url_node.error(format!(
                    "`url` must be http:// or https://, found `{}`",
                    u.scheme()
                ));
                return None;
            }
            Err(e) => {
                url_node.error(format!("`url` is not a valid URL ({e}): `{url_text}`"));
                return None;
            }
        };
        let encoding = match map.choice("encoding", &["ndjson", "json_array"]) {
            Some("json_array") => BodyEncoding::JsonArray,
            Some(_) => BodyEncoding::Ndjson,
            None if map.get("encoding").is_some() => return None,
            None => BodyEncoding::Ndjson,
        };
        let compression = match map.choice("compression", &["none", "gzip", "zstd"]) {
            Some("gzip") => Compression::Gzip,
            Some("zstd") => Compression::Zstd,
            Some(_) => Compression::None,
            None if map.get("compression").is_some() => return None,
            None => Compression::None,
        };
        let headers = parse_headers(&map);
        let (max_bytes, max_events, linger) =
            super::http::parse_batch(&map, (1 << 20, 10_000, 1000));
        let dead_letter =
            super::http::parse_dead_letter(&map, "/var/lib/petrel/dead-letter.ndjson")?;
        Some(Self {
            url,
            encoding,
            compression,
            headers,
            max_bytes,
            max_events,
            linger,
            timeout: Duration::from_millis(map.u64("timeout_ms", false).unwrap_or(30_000)),
            max_in_flight: map
                .u64("max_in_flight_requests", false)
                .unwrap_or(16)
                .clamp(1, 1024) as usize,
            dead_letter,
        })
    }
}

/// Reads `batch: { max_bytes, max_events, timeout_ms }` over `defaults`
/// (bytes, events, milliseconds): at least 1 KiB and one event per request.
pub(super) fn parse_batch(
    map: &Map<'_>,
    defaults: (usize, usize, u64),
) -> (usize, usize, Duration) {
    let (mut max_bytes, mut max_events, mut linger_ms) = defaults;
    if let Some(b) = map.get("batch") {
        if let Some(bm) = b.as_map(&["max_bytes", "max_events", "timeout_ms"]) {
            max_bytes = bm.u64("max_bytes", true).unwrap_or(max_bytes as u64) as usize;
            max_events = bm.u64("max_events", false).unwrap_or(max_events as u64) as usize;
            linger_ms = bm.u64("timeout_ms", false).unwrap_or(linger_ms);
        }
    }
    (
        max_bytes.max(1024),
        max_events.max(1),
        Duration::from_millis(linger_ms),
    )
}

/// Reads `dead_letter:` (a file path; `example` for the message when it is
/// empty): `None` after reporting an error, `Some(None)` when not set.
pub(super) fn parse_dead_letter(
    map: &Map<'_>,
    example: &str,
) -> Option<Option<std::path::PathBuf>> {
    let Some(n) = map.get("dead_letter") else {
        return Some(None);
    };
    match n.as_str()? {
        "" => {
            n.error(format!(
                "`dead_letter` must be a file path, e.g. `{example}`"
            ));
            None
        }
        p => Some(Some(crate::paths::resolve_path(n, p))),
    }
}

/// Reads `headers:` (a map of names to values, `${ENV}` expanded);
/// invalid entries are reported and left out.
pub(super) fn parse_headers(map: &Map<'_>) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    if let Some(n) = map.get("headers") {
        match n.as_map_quiet() {
            Some(hm) => {
                for (k, v) in hm.entries() {
                    let Some(raw) = v.as_str() else { continue };
                    let value =
                        match petrel_core::config::expand_env(raw, |name| std::env::var(name).ok())
                        {
                            Ok(s) => s.into_owned(),
                            Err(e) => {
                                v.error(format!("header `{k}`: {e}"));
                                continue;
                            }
                        };
                    if HeaderName::from_bytes(k.as_bytes()).is_err() {
                        v.error(format!("`{k}` is not a valid header name"));
                    } else if HeaderValue::from_str(&value).is_err() {
                        v.error(format!(
                            "header `{k}` has a value that is not valid in HTTP"
                        ));
                    } else {
                        headers.push((k.to_string(), value));
                    }
                }
            }
            None => n.error(
                "`headers` must be a mapping, e.g. `{ Authorization: \"Bearer ${TOKEN}\" }`",
            ),
        }
    }
    headers
}

/// The running HTTP sink.
pub struct HttpSink {
    config: HttpSinkConfig,
    client: reqwest::Client,
    metrics: ComponentMetrics,
    /// Rate limit of the loud log line for 401/403/404.
    last_auth_log: parking_lot::Mutex<Option<Instant>>,
}

impl HttpSink {
    /// Builds the client.
    pub fn new(c: &HttpSinkConfig, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        for (k, v) in &c.headers {
            headers.insert(
                HeaderName::from_bytes(k.as_bytes())?,
                HeaderValue::from_str(v)?,
            );
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(c.timeout)
            .build()?;
        Ok(Self {
            config: c.clone(),
            client,
            metrics,
            last_auth_log: parking_lot::Mutex::new(None),
        })
    }
}

/// One request: its body (uncompressed), where each record is in it, and
/// the acknowledgements it completes. A source batch split over several
/// requests is acknowledged through a part that each of its requests
/// holds.
pub(super) struct Request {
    pub(super) body: Vec<u8>,
    /// Each record's JSON text in `body` (without separator or newline).
    pub(super) records: Vec<std::ops::Range<usize>>,
    events: u64,
    pub(super) acks: RequestAcks,
}

/// The acknowledgements a request holds. Unless the request marks itself
/// delivered, dropping it (an error, a cancelled or panicking task) marks
/// every payload it carries as failed: undelivered data is never reported
/// as delivered.
pub(super) struct RequestAcks {
    acks: Vec<Arc<SharedAck>>,
    pub(super) delivered: bool,
}

impl Drop for RequestAcks {
    fn drop(&mut self) {
        if !self.delivered {
            for a in &self.acks {
                a.failed.store(true, std::sync::atomic::Ordering::Release);
            }
        }
    }
}

/// An acknowledgement shared by the requests carrying one payload's events.
/// Answered when the last holder drops it: delivered only if no request
/// carrying its events failed.
struct SharedAck {
    part: parking_lot::Mutex<Option<AckPart>>,
    failed: std::sync::atomic::AtomicBool,
    _charge: petrel_core::MemoryCharge,
}

impl Drop for SharedAck {
    fn drop(&mut self) {
        if let Some(p) = self.part.lock().take() {
            if self.failed.load(std::sync::atomic::Ordering::Acquire) {
                p.nack();
            } else {
                p.ack();
            }
        }
    }
}

/// How requests are cut and sent by [`run_batched`].
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchShape {
    /// Body layout.
    pub encoding: BodyEncoding,
    /// Largest request body before compression.
    pub max_bytes: usize,
    /// Most events per request.
    pub max_events: usize,
    /// Longest wait of the first event of a request.
    pub linger: Duration,
    /// Upper bound of the congestion window.
    pub max_in_flight: usize,
}

/// A sink that delivers the requests [`run_batched`] builds.
pub(super) trait RequestSender: Send + Sync + 'static {
    /// Delivers `req` (retrying as the sink's answers table says) and
    /// acknowledges its payloads.
    fn send_request(
        self: Arc<Self>,
        req: Request,
        window: Arc<Window>,
        dm: DeliveryMetrics,
    ) -> impl std::future::Future<Output = ()> + Send;
}

/// Gathers payloads into requests of `shape` and sends each through
/// `sink`, as many at once as the congestion window allows, until the
/// queue closes and everything was answered.
pub(super) async fn run_batched<S: RequestSender>(
    sink: Arc<S>,
    mut rx: PayloadReceiver,
    shape: BatchShape,
    dm: DeliveryMetrics,
) {
    let window = Window::new(2, shape.max_in_flight, dm.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let mut open = true;
    let mut builder = Builder::new(shape.encoding, shape.max_bytes, shape.max_events);
    while open || !builder.is_empty() {
        // Wait for more data, but no longer than the linger time of the
        // oldest event waiting.
        let got = match builder.deadline(shape.linger) {
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
                .deadline(shape.linger)
                .is_some_and(|d| d <= Instant::now());
        while let Some(req) = builder.take(flush_all) {
            window.acquire().await;
            let (sink, window, dm) = (sink.clone(), window.clone(), dm.clone());
            tasks.spawn(async move {
                sink.send_request(req, window.clone(), dm).await;
                window.release();
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

impl RequestSender for HttpSink {
    async fn send_request(self: Arc<Self>, req: Request, window: Arc<Window>, dm: DeliveryMetrics) {
        self.send(req, &window, &dm).await
    }
}

impl Sink for HttpSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        out.invalid_utf8 = encode_batch(
            Encoding::Ndjson,
            batch,
            &mut out.bytes,
            Some(&mut out.record_ends),
        )
        .invalid_utf8;
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        let shape = BatchShape {
            encoding: self.config.encoding,
            max_bytes: self.config.max_bytes,
            max_events: self.config.max_events,
            linger: self.config.linger,
            max_in_flight: self.config.max_in_flight,
        };
        let dm = self.metrics.delivery();
        Box::pin(run_batched(self, rx, shape, dm))
    }
}

/// Gathers payloads into requests.
pub(super) struct Builder {
    encoding: BodyEncoding,
    max_bytes: usize,
    max_events: usize,
    /// (payload bytes, record ends, next record, shared ack) waiting.
    queue: std::collections::VecDeque<(Payload, usize, Arc<SharedAck>)>,
    bytes: usize,
    events: usize,
    since: Option<Instant>,
}

impl Builder {
    pub(super) fn new(encoding: BodyEncoding, max_bytes: usize, max_events: usize) -> Self {
        Self {
            encoding,
            max_bytes,
            max_events,
            queue: Default::default(),
            bytes: 0,
            events: 0,
            since: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn deadline(&self, linger: Duration) -> Option<Instant> {
        self.since.map(|s| s + linger)
    }

    pub(super) fn push(&mut self, mut p: Payload) {
        let ack = std::mem::replace(&mut p.ack, AckPart::detached());
        let charge = std::mem::take(&mut p.charge);
        if p.data.record_ends.is_empty() {
            // Nothing to send (every event filtered out): done at once.
            ack.ack();
            return;
        }
        self.bytes += p.data.bytes.len();
        self.events += p.data.record_ends.len();
        self.since.get_or_insert_with(Instant::now);
        let shared = Arc::new(SharedAck {
            part: parking_lot::Mutex::new(Some(ack)),
            failed: Default::default(),
            _charge: charge,
        });
        self.queue.push_back((p, 0, shared));
    }

    /// The next request if one is full, or any waiting data when `all`.
    pub(super) fn take(&mut self, all: bool) -> Option<Request> {
        if self.queue.is_empty()
            || (!all && self.bytes < self.max_bytes && self.events < self.max_events)
        {
            return None;
        }
        let mut req = Request {
            body: Vec::with_capacity(self.bytes.min(self.max_bytes) + 2),
            records: Vec::new(),
            events: 0,
            acks: RequestAcks {
                acks: Vec::new(),
                delivered: false,
            },
        };
        if self.encoding == BodyEncoding::JsonArray {
            req.body.push(b'[');
        }
        while let Some((p, next, ack)) = self.queue.front_mut() {
            let ends = &p.data.record_ends;
            let mut i = *next;
            let mut added = false;
            while i < ends.len() {
                let start = if i == 0 { 0 } else { ends[i - 1] as usize };
                let end = ends[i] as usize;
                let len = end - start;
                let full =
                    req.events as usize >= self.max_events || req.body.len() + len > self.max_bytes;
                if full && req.events > 0 {
                    break;
                }
                // Records end with a newline; an array wants none.
                let text_end = if p.data.bytes[start..end].ends_with(b"\n") {
                    end - 1
                } else {
                    end
                };
                if self.encoding == BodyEncoding::JsonArray && req.events > 0 {
                    req.body.push(b',');
                }
                let at = req.body.len();
                req.body.extend_from_slice(&p.data.bytes[start..text_end]);
                req.records.push(at..req.body.len());
                if self.encoding == BodyEncoding::Ndjson {
                    req.body.push(b'\n');
                }
                req.events += 1;
                self.bytes = self.bytes.saturating_sub(len);
                self.events = self.events.saturating_sub(1);
                added = true;
                i += 1;
            }
            *next = i;
            if added {
                req.acks.acks.push(ack.clone());
            }
            if i >= ends.len() {
                self.queue.pop_front();
            } else {
                break; // request full
            }
        }
        if self.encoding == BodyEncoding::JsonArray {
            req.body.push(b']');
        }
        self.since = if self.queue.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        Some(req)
    }
}

/// What to do after a response.
enum Outcome {
    Delivered,
    /// Transient (connection error, 408, 429, 5xx): retry after a backoff
    /// or the `Retry-After` the endpoint asked for.
    Retry(Option<Duration>, &'static str),
    /// 401, 403, 404: the data waits until an operator fixes the sink.
    Auth(u16, &'static str, String),
    /// Another 4xx: the endpoint refuses some record of the request.
    Refused(u16, String),
}

/// Longest wait between attempts while an endpoint refuses a request
/// outright (401/403/404, a refused record without a dead letter).
const MAX_REFUSED_BACKOFF: Duration = Duration::from_secs(30);
/// At most one loud log line per this period for refused requests.
const LOUD_EVERY: Duration = Duration::from_secs(10);

impl HttpSink {
    async fn post(&self, body: bytes::Bytes) -> Outcome {
        let mut rb = self.client.post(self.config.url.clone()).body(body);
        rb = rb.header(
            CONTENT_TYPE,
            match self.config.encoding {
                BodyEncoding::Ndjson => "application/x-ndjson",
                BodyEncoding::JsonArray => "application/json",
            },
        );
        match self.config.compression {
            Compression::Gzip => rb = rb.header(CONTENT_ENCODING, "gzip"),
            Compression::Zstd => rb = rb.header(CONTENT_ENCODING, "zstd"),
            Compression::None => {}
        }
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => {
                let f =
                    super::client::send_failure(&e, self.config.url.as_str(), self.config.timeout);
                tracing::warn!(
                    error_type = f.error_type,
                    "http sink: request failed: {}",
                    f.message
                );
                return Outcome::Retry(None, f.error_type);
            }
        };
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            return Outcome::Delivered;
        }
        if matches!(status, 408 | 429) || resp.status().is_server_error() {
            let after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s.min(300)));
            tracing::warn!(
                status,
                "http sink: endpoint answered with a retryable status"
            );
            return Outcome::Retry(after, "request_failed");
        }
        let text: String = resp
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(1024)
            .collect();
        match status {
            401 => Outcome::Auth(status, "unauthorized", text),
            403 => Outcome::Auth(status, "forbidden", text),
            404 => Outcome::Auth(status, "not_found", text),
            _ => Outcome::Refused(status, text),
        }
    }

    /// Logs `msg` as an error at most once per [`LOUD_EVERY`].
    fn loud(&self, status: u16, text: &str, msg: &str) {
        let mut last = self.last_auth_log.lock();
        if last.is_none_or(|t| t.elapsed() >= LOUD_EVERY) {
            *last = Some(Instant::now());
            tracing::error!(status, body = %text, url = %self.config.url, "http sink: {msg}");
        }
    }

    /// The body of records `range` of `req`, in the sink's encoding.
    fn body_of(
        &self,
        req: &Request,
        whole: &bytes::Bytes,
        range: std::ops::Range<usize>,
    ) -> bytes::Bytes {
        if range == (0..req.records.len()) {
            return whole.clone();
        }
        let mut body = Vec::new();
        if self.config.encoding == BodyEncoding::JsonArray {
            body.push(b'[');
        }
        for (n, r) in req.records[range].iter().enumerate() {
            if self.config.encoding == BodyEncoding::JsonArray && n > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&whole[r.clone()]);
            if self.config.encoding == BodyEncoding::Ndjson {
                body.push(b'\n');
            }
        }
        if self.config.encoding == BodyEncoding::JsonArray {
            body.push(b']');
        }
        body.into()
    }

    /// Appends a refused record to the dead-letter file.
    fn dead_letter(
        &self,
        path: &std::path::Path,
        record: &[u8],
        status: u16,
        answer: &str,
    ) -> std::io::Result<()> {
        super::dead_letter::write(
            path,
            [record],
            super::dead_letter::Refusal {
                status,
                answer,
                sink: self.metrics.health_key(),
                url: self.config.url.as_str(),
            },
        )
    }

    async fn send(&self, mut req: Request, window: &Window, dm: &DeliveryMetrics) {
        let started = Instant::now();
        // Record ranges still to deliver; a refused request is split in
        // halves until each refused record is alone.
        // The body as the builder wrote it: shared by every attempt that
        // sends all of it, never copied.
        let whole = bytes::Bytes::from(std::mem::take(&mut req.body));
        let mut todo: Vec<std::ops::Range<usize>> = Vec::new();
        todo.push(0..req.records.len());
        let mut backoff = Backoff::default();
        let mut refused_backoff = Duration::from_millis(500);
        while let Some(range) = todo.pop() {
            let raw = self.body_of(&req, &whole, range.clone());
            let body = match compress_shared(self.config.compression, raw) {
                Ok(b) => b,
                Err(e) => {
                    // Dropping the request reports the failure.
                    tracing::error!(error = %e, "http sink: compression failed; the batch will be read again");
                    return;
                }
            };
            loop {
                match self.post(body.clone()).await {
                    Outcome::Delivered => {
                        window.on_success();
                        self.metrics.recovered();
                        self.metrics.sent_events.inc_by(range.len() as u64);
                        self.metrics.sent_bytes.inc_by(body.len() as u64);
                        break;
                    }
                    Outcome::Retry(after, reason) => {
                        self.metrics.error(reason, 1);
                        self.metrics
                            .failing(format!("deliveries to {} fail", self.config.url));
                        dm.retried_events.inc_by(range.len() as u64);
                        window.on_failure();
                        tokio::time::sleep(after.unwrap_or_else(|| backoff.next_delay())).await;
                    }
                    Outcome::Auth(status, reason, text) => {
                        self.metrics.error(reason, 1);
                        self.metrics
                            .failing(format!("{status} ({reason}) from {}", self.config.url));
                        dm.retried_events.inc_by(range.len() as u64);
                        self.loud(status, &text, &format!(
                            "endpoint answers {status} ({reason}); the data waits and is retried: fix the credentials or the URL"
                        ));
                        tokio::time::sleep(refused_backoff).await;
                        refused_backoff = (refused_backoff * 2).min(MAX_REFUSED_BACKOFF);
                    }
                    Outcome::Refused(status, text) => {
                        if range.len() > 1 {
                            // Find the refused records: each half alone.
                            let mid = range.start + range.len() / 2;
                            todo.push(mid..range.end);
                            todo.push(range.start..mid);
                            break;
                        }
                        let record = &whole[req.records[range.start].clone()];
                        let Some(path) = self.config.dead_letter.clone() else {
                            self.metrics.error("rejected", 1);
                            self.metrics
                                .failing(format!("{status} from {} for a record", self.config.url));
                            self.loud(status, &text, &format!(
                                "endpoint refuses a record with {status}; it is retried: configure `dead_letter` to set such records aside"
                            ));
                            tokio::time::sleep(refused_backoff).await;
                            refused_backoff = (refused_backoff * 2).min(MAX_REFUSED_BACKOFF);
                            continue;
                        };
                        match self.dead_letter(&path, record, status, &text) {
                            Ok(()) => {
                                tracing::warn!(status, path = %path.display(), "http sink: a record refused by the endpoint was written to the dead letter file");
                                self.metrics.discarded("dead_letter", 1);
                                break;
                            }
                            Err(e) => {
                                self.metrics.error("dead_letter_failed", 1);
                                self.metrics.failing(format!(
                                    "cannot write the dead letter file {}: {e}",
                                    path.display()
                                ));
                                self.loud(status, &text, &format!(
                                    "cannot write the dead letter file {}: {e}; the record is retried", path.display()
                                ));
                                tokio::time::sleep(refused_backoff).await;
                                refused_backoff = (refused_backoff * 2).min(MAX_REFUSED_BACKOFF);
                            }
                        }
                    }
                }
            }
        }
        dm.latency.observe(started.elapsed().as_secs_f64());
        req.acks.delivered = true;
    }
}

/// Like [`compress`], for a body that may be sent as it is: without
/// compression it is passed on, not copied.
pub(super) fn compress_shared(c: Compression, body: bytes::Bytes) -> std::io::Result<bytes::Bytes> {
    match c {
        Compression::None => Ok(body),
        _ => compress(c, &body).map(Into::into),
    }
}

pub(super) fn compress(c: Compression, body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    match c {
        Compression::None => Ok(body.to_vec()),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 4),
                flate2::Compression::fast(),
            );
            e.write_all(body)?;
            e.finish()
        }
        Compression::Zstd => zstd::bulk::compress(body, 3),
    }
}

/// Registration of `type: http`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "http",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| HttpSinkConfig::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for HttpSinkConfig {
    fn type_name(&self) -> &'static str {
        "http"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        Ok(std::sync::Arc::new(HttpSink::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::{AckReceiver, BatchAck};
    use std::sync::atomic::{AtomicI32, Ordering};

    /// 1 delivered, -1 failed, 0 not answered.
    #[derive(Default)]
    struct Outcome(AtomicI32);

    impl AckReceiver for Outcome {
        fn complete(&self, _seq: u64, delivered: bool) {
            self.0
                .store(if delivered { 1 } else { -1 }, Ordering::SeqCst);
        }
    }

    fn shared(o: &Arc<Outcome>) -> Arc<SharedAck> {
        Arc::new(SharedAck {
            part: parking_lot::Mutex::new(Some(BatchAck::start(o.clone(), 0))),
            failed: Default::default(),
            _charge: petrel_core::MemoryCharge::none(),
        })
    }

    #[test]
    fn a_request_dropped_without_delivery_fails_its_batches() {
        // A send task cancelled or panicking drops its request unanswered.
        let o = Arc::new(Outcome::default());
        let a = shared(&o);
        let delivered = RequestAcks {
            acks: vec![a.clone()],
            delivered: true,
        };
        let abandoned = RequestAcks {
            acks: vec![a.clone()],
            delivered: false,
        };
        drop(delivered);
        drop(abandoned);
        assert_eq!(
            o.0.load(Ordering::SeqCst),
            0,
            "answered only when the last holder goes"
        );
        drop(a);
        assert_eq!(
            o.0.load(Ordering::SeqCst),
            -1,
            "one abandoned request fails the batch"
        );
    }

    #[test]
    fn a_batch_is_delivered_when_all_its_requests_are() {
        let o = Arc::new(Outcome::default());
        let a = shared(&o);
        for _ in 0..3 {
            drop(RequestAcks {
                acks: vec![a.clone()],
                delivered: true,
            });
        }
        drop(a);
        assert_eq!(o.0.load(Ordering::SeqCst), 1);
    }
}
