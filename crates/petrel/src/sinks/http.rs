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
use std::time::Duration;

use bytes::Bytes;
use petrel_core::config::Map;
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};

use super::client::{failed_answer, unanswered, usually_transient};
pub use super::driver::Compression;
use super::driver::{self, Answer, Batch, Framing, RequestSink, Selection, Settings, Wording};
// The acknowledgement rules of the driver are tested below, where they
// were first written for this sink.
#[cfg(test)]
use super::driver::{RequestAcks, SharedAck};

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
    "retry",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
    "tls",
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
        doc: r#"Required: an `http://` or `https://` endpoint (TLS by rustls, Mozilla roots and `tls`)."#,
    },
    crate::sinks::tls::TLS_DOC,
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
    RETRY_DOC,
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
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

/// Configuration of the HTTP sink.
#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    /// Endpoint.
    pub url: reqwest::Url,
    /// Body layout.
    pub encoding: BodyEncoding,
    /// What each record holds: the fields, their names and shape.
    pub output: Arc<petrel_core::schema::Output>,
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
    /// When transient failures are given up (into `dead_letter`).
    pub retry: super::driver::RetryLimit,
    /// TLS of an `https://` endpoint.
    pub tls: super::tls::Tls,
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
        let output = Arc::new(super::parse_output(&map, true)?);
        let (max_bytes, max_events, linger) =
            super::http::parse_batch(&map, (1 << 20, 10_000, 1000));
        let dead_letter =
            super::http::parse_dead_letter(&map, "/var/lib/petrel/dead-letter.ndjson")?;
        let retry = super::http::parse_retry(&map, &dead_letter)?;
        let tls = match map.get("tls") {
            Some(n) => super::tls::parse_tls(n)?,
            None => super::tls::Tls {
                verify: true,
                ..Default::default()
            },
        };
        Some(Self {
            tls,
            url,
            encoding,
            output,
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
            retry,
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

/// The `retry` key of the request sinks, documented once.
pub const RETRY_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "retry",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"`{max_attempts, max_duration}` (e.g. `{max_attempts: 5, max_duration: 10m}`): a request that keeps failing transiently (no answer, 408, 429, 5xx) is given up after this many attempts or this long after its first failure, and its records go to `dead_letter` (required with `retry`) with the reason `retries exhausted`, counted in `discarded_events_total{reason="retries_exhausted"}`; the source goes on. Without it a request is retried until it is delivered. Held requests (401, 403, 404) wait for an operator either way."#,
};

/// Reads `retry:`; limits need a `dead_letter` file, where what they give
/// up on goes (reported at the key otherwise).
pub(super) fn parse_retry(
    map: &Map<'_>,
    dead_letter: &Option<std::path::PathBuf>,
) -> Option<super::driver::RetryLimit> {
    let Some(n) = map.get("retry") else {
        return Some(Default::default());
    };
    if n.as_map_quiet().is_none() {
        n.error("`retry` is a mapping, e.g. `retry: {max_attempts: 5, max_duration: 10m}`");
        return None;
    }
    let m = n.as_map(&["max_attempts", "max_duration"])?;
    let max_attempts = match m.get("max_attempts") {
        None => None,
        Some(a) => match a.as_u64(false)? {
            0 => {
                a.error("`max_attempts` counts the first attempt too: at least 1");
                return None;
            }
            v => Some(v.min(u32::MAX as u64) as u32),
        },
    };
    let max_duration = match m.get("max_duration") {
        None => None,
        Some(d) => Some(d.as_duration()?),
    };
    if max_attempts.is_none() && max_duration.is_none() {
        n.error("`retry` needs `max_attempts`, `max_duration` or both");
        return None;
    }
    if dead_letter.is_none() {
        n.error("`retry` limits set records aside when they are reached: add `dead_letter: /var/lib/petrel/dead-letter.ndjson` (nothing is dropped silently), or remove `retry` to retry until delivered");
        return None;
    }
    Some(super::driver::RetryLimit {
        max_attempts,
        max_duration,
    })
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
                    let value = raw.to_string();
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
    /// `ndjson` with the sink's output: each record's JSON.
    ndjson: Encoding,
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
        let client = c
            .tls
            .apply(
                reqwest::Client::builder()
                    .default_headers(headers)
                    .timeout(c.timeout),
                &crate::tls::Owner::of(&metrics),
            )?
            .build()?;
        Ok(Self {
            config: c.clone(),
            ndjson: Encoding::Ndjson(c.output.clone()),
            client,
            metrics,
        })
    }

    fn framing(&self) -> Framing {
        match self.config.encoding {
            BodyEncoding::Ndjson => Framing::NDJSON,
            BodyEncoding::JsonArray => Framing::JSON_ARRAY,
        }
    }
}

impl RequestSink for HttpSink {
    type Plan<'b> = ();

    const WORDING: Wording = Wording {
        sink: "http sink",
        peer: "the endpoint",
        items: ("record", "records"),
        hold_fix: "the credentials or the URL",
    };

    fn build_request(&self, batch: &Batch, _: &(), items: Selection<'_>) -> anyhow::Result<Bytes> {
        Ok(self
            .config
            .compression
            .apply(batch.framed(items, self.framing()))?)
    }

    async fn send(&self, body: Bytes, _items: usize) -> Answer {
        let content_type = match self.config.encoding {
            BodyEncoding::Ndjson => "application/x-ndjson",
            BodyEncoding::JsonArray => "application/json",
        };
        let mut rb = self
            .client
            .post(self.config.url.clone())
            .header(CONTENT_TYPE, content_type)
            .body(body);
        if let Some(e) = self.config.compression.content_encoding() {
            rb = rb.header(CONTENT_ENCODING, e);
        }
        match rb.send().await {
            Err(e) => unanswered(&e, self.config.url.as_str(), self.config.timeout),
            Ok(r) if r.status().is_success() => Answer::Delivered,
            Ok(r) => failed_answer(r, usually_transient).await,
        }
    }
}

impl Sink for HttpSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        out.invalid_utf8 = encode_batch(
            &self.ndjson,
            batch,
            &mut out.bytes,
            Some(&mut out.record_ends),
        )
        .invalid_utf8;
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        let c = &self.config;
        let settings = Settings::new(self.framing(), c.url.to_string(), c.dead_letter.clone())
            .limits(c.max_bytes, c.max_events, c.linger, c.max_in_flight)
            .retry(c.retry);
        let metrics = self.metrics.clone();
        driver::run(self, rx, settings, metrics)
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
    fn destinations(&self) -> Option<Vec<String>> {
        Some(vec![self.url.host_str().unwrap_or_default().to_string()])
    }
    fn local_writes(&self) -> Vec<std::path::PathBuf> {
        self.dead_letter.iter().cloned().collect()
    }

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
            charge: petrel_core::MemoryCharge::none(),
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
