//! `type: http` — POSTs batches of events to an HTTP endpoint.
//!
//! Events are gathered into requests of at most `batch.max_bytes` bytes and
//! `batch.max_events` events, sent at the latest `batch.timeout_ms` after
//! the first event waited. A batch is acknowledged to its source when every
//! request carrying its events got a 2xx answer. Connection errors, 5xx and
//! 429 are retried with exponential backoff (429 and 503 honour
//! `Retry-After`); any other 4xx means the endpoint will never take that
//! request: its events are counted as discarded (`http_rejected`) and the
//! response body is logged. TLS (https) uses rustls with the Mozilla root
//! certificates.

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
];

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
        let mut headers = Vec::new();
        if let Some(n) = map.get("headers") {
            match n.as_map_quiet() {
                Some(hm) => {
                    for (k, v) in hm.entries() {
                        let Some(raw) = v.as_str() else { continue };
                        let value = match petrel_core::config::expand_env(raw, |name| {
                            std::env::var(name).ok()
                        }) {
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
        let (mut max_bytes, mut max_events, mut linger_ms) = (1 << 20, 10_000, 1000);
        if let Some(b) = map.get("batch") {
            if let Some(bm) = b.as_map(&["max_bytes", "max_events", "timeout_ms"]) {
                max_bytes = bm.u64("max_bytes", true).unwrap_or(max_bytes as u64) as usize;
                max_events = bm.u64("max_events", false).unwrap_or(max_events as u64) as usize;
                linger_ms = bm.u64("timeout_ms", false).unwrap_or(linger_ms);
            }
        }
        Some(Self {
            url,
            encoding,
            compression,
            headers,
            max_bytes: max_bytes.max(1024),
            max_events: max_events.max(1),
            linger: Duration::from_millis(linger_ms),
            timeout: Duration::from_millis(map.u64("timeout_ms", false).unwrap_or(30_000)),
            max_in_flight: map
                .u64("max_in_flight_requests", false)
                .unwrap_or(16)
                .clamp(1, 1024) as usize,
        })
    }
}

/// The running HTTP sink.
pub struct HttpSink {
    config: HttpSinkConfig,
    client: reqwest::Client,
    metrics: ComponentMetrics,
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
        })
    }
}

/// One request: its body (uncompressed) and the acknowledgements it
/// completes. A source batch split over several requests is acknowledged
/// through a shared part that each of its requests holds.
struct Request {
    body: Vec<u8>,
    events: u64,
    acks: Vec<Arc<SharedAck>>,
}

/// An acknowledgement shared by the requests carrying one payload's events.
/// Delivered when the last holder drops it after success; a rejected or
/// abandoned request leaves the failure flag set.
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

    fn run(self: Arc<Self>, mut rx: PayloadReceiver) -> BoxFuture {
        Box::pin(async move {
            let dm = self.metrics.delivery();
            let window = Window::new(2, self.config.max_in_flight, dm.clone());
            let mut tasks = tokio::task::JoinSet::new();
            let mut open = true;
            let mut builder = Builder::new(&self.config);
            while open || !builder.is_empty() {
                // Wait for more data, but no longer than the linger time of
                // the oldest event waiting.
                let deadline = builder.deadline(self.config.linger);
                let got = match deadline {
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
                        .deadline(self.config.linger)
                        .is_some_and(|d| d <= Instant::now());
                while let Some(req) = builder.take(flush_all) {
                    window.acquire().await;
                    let (sink, window, dm) = (self.clone(), window.clone(), dm.clone());
                    tasks.spawn(async move {
                        sink.send(req, &window, &dm).await;
                        window.release();
                    });
                }
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        })
    }
}

/// Gathers payloads into requests.
struct Builder {
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
    fn new(c: &HttpSinkConfig) -> Self {
        Self {
            encoding: c.encoding,
            max_bytes: c.max_bytes,
            max_events: c.max_events,
            queue: Default::default(),
            bytes: 0,
            events: 0,
            since: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn deadline(&self, linger: Duration) -> Option<Instant> {
        self.since.map(|s| s + linger)
    }

    fn push(&mut self, mut p: Payload) {
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
    fn take(&mut self, all: bool) -> Option<Request> {
        if self.queue.is_empty()
            || (!all && self.bytes < self.max_bytes && self.events < self.max_events)
        {
            return None;
        }
        let mut req = Request {
            body: Vec::with_capacity(self.bytes.min(self.max_bytes) + 2),
            events: 0,
            acks: Vec::new(),
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
                match self.encoding {
                    BodyEncoding::Ndjson => req.body.extend_from_slice(&p.data.bytes[start..end]),
                    BodyEncoding::JsonArray => {
                        if req.events > 0 {
                            req.body.push(b',');
                        }
                        // Records end with a newline; an array wants none.
                        req.body.extend_from_slice(
                            &p.data.bytes[start..end.saturating_sub(1).max(start)],
                        );
                    }
                }
                req.events += 1;
                self.bytes = self.bytes.saturating_sub(len);
                self.events = self.events.saturating_sub(1);
                added = true;
                i += 1;
            }
            *next = i;
            if added {
                req.acks.push(ack.clone());
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
    Retry(Option<Duration>),
    Rejected(u16, String),
}

impl HttpSink {
    async fn send(&self, req: Request, window: &Window, dm: &DeliveryMetrics) {
        let started = Instant::now();
        let body = match compress(self.config.compression, &req.body) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "http sink: compression failed; the batch will be read again");
                for a in &req.acks {
                    a.failed.store(true, std::sync::atomic::Ordering::Release);
                }
                return;
            }
        };
        let mut backoff = Backoff::default();
        loop {
            let mut rb = self.client.post(self.config.url.clone()).body(body.clone());
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
            let outcome = match rb.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    if status.is_success() {
                        Outcome::Delivered
                    } else if status.as_u16() == 429 || status.is_server_error() {
                        let after = resp
                            .headers()
                            .get(reqwest::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|s| s.trim().parse::<u64>().ok())
                            .map(|s| Duration::from_secs(s.min(300)));
                        tracing::warn!(
                            status = status.as_u16(),
                            "http sink: endpoint answered with a retryable status"
                        );
                        Outcome::Retry(after)
                    } else {
                        let text = resp.text().await.unwrap_or_default();
                        Outcome::Rejected(status.as_u16(), text.chars().take(1024).collect())
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "http sink: request failed");
                    Outcome::Retry(None)
                }
            };
            match outcome {
                Outcome::Delivered => {
                    window.on_success();
                    dm.latency.observe(started.elapsed().as_secs_f64());
                    self.metrics.sent_events.inc_by(req.events);
                    self.metrics.sent_bytes.inc_by(body.len() as u64);
                    return;
                }
                Outcome::Rejected(status, text) => {
                    tracing::error!(status, body = %text, events = req.events,
                        "http sink: endpoint rejected the request; its events are counted as discarded `http_rejected`");
                    self.metrics.discarded("http_rejected", req.events);
                    return;
                }
                Outcome::Retry(after) => {
                    self.metrics.error("request_failed", 1);
                    dm.retried_events.inc_by(req.events);
                    window.on_failure();
                    let d = after.unwrap_or_else(|| backoff.next_delay());
                    tokio::time::sleep(d).await;
                }
            }
        }
    }
}

fn compress(c: Compression, body: &[u8]) -> std::io::Result<Vec<u8>> {
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
    keys: KEYS,
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
