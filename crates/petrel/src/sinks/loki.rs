//! `type: loki` — pushes events to the Loki push API (Grafana Loki and the
//! stores that speak it, such as VictoriaLogs).
//!
//! Encoding (on the processing pool) renders each event's stream labels
//! from the `labels` templates, applies the cardinality guard, and writes
//! one record: the label set, the entry time and the entry already in the
//! wire encoding (the protobuf `EntryAdapter` fields after the timestamp,
//! or the JSON `values` item after it). Delivery runs through the driver
//! ([`super::driver`]: batching, congestion window, retries and
//! acknowledgements); the sink's plan of a request groups its records by
//! stream, sorts each stream's entries by time and handles entries older
//! than what was already sent for their stream (`out_of_order`), and its
//! body is the push request: protobuf compressed with snappy (the default)
//! or JSON.
//!
//! Answers: 2xx delivered; connection errors, 408, 429 and 5xx retried with
//! backoff and `Retry-After`; 401/403/404 hold the data loudly until an
//! operator fixes the sink; 413 splits the request; any other 4xx (400:
//! invalid labels, entries too old, line too long) sets the request's
//! entries aside in `dead_letter` with the server's answer, or without one
//! retries them loudly: nothing is committed silently.
//!
//! The cardinality guard: at most `max_streams` label sets are in use at
//! once (a set unused for [`STREAM_IDLE`] no longer counts). An event whose
//! set would exceed it keeps its label names with every value replaced by
//! [`OVERFLOW_VALUE`], and is counted in
//! `petrel_component_stream_overflow_events_total`: a runaway label value
//! (a request id, a pod hash) cannot create unbounded streams.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use petrel_core::config::Map;
use petrel_core::encode::{write_json_str, EncodeStats, JsonShape};
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, EventBatch};
use prometheus_client::metrics::counter::Counter;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE};

use super::client::{
    env_str, failed_answer, parse_auth, parse_tls, unanswered, usually_transient, Auth, Tls,
};
use super::driver::{
    self, Answer, Batch, Compression, DeadRecord, Framing, RequestSink, Selection, Settings,
    Wording,
};
use super::template::Template;

/// Keys accepted by the loki sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "endpoint",
    "path",
    "encoding",
    "compression",
    "labels",
    "structured_metadata",
    "remove_label_fields",
    "line_format",
    "tenant_id",
    "headers",
    "auth",
    "tls",
    "dead_letter",
    "retry",
    "max_streams",
    "out_of_order",
    "batch",
    "timeout_ms",
    "max_in_flight_requests",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"The Loki push API (Grafana Loki, VictoriaLogs): entries grouped by stream and sorted by time, with a guard on the number of label sets. Cargo feature `loki` (default)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "endpoint",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: an `http://` or `https://` base URL (a path prefix is kept)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "path",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"/loki/api/v1/push"#),
        doc: r#"Appended to `endpoint` (VictoriaLogs: `/insert/loki/api/v1/push`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "encoding",
        kind: petrel_core::plugin::KeyKind::OneOf(&["protobuf", "json"]),
        default: Some(r#"protobuf"#),
        doc: r#"`protobuf`: Loki's `PushRequest`, snappy-compressed; `json`: the JSON push body."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "compression",
        kind: petrel_core::plugin::KeyKind::OneOf(&["none", "gzip"]),
        default: Some(r#"none"#),
        doc: r#"`gzip` for `encoding: json` (protobuf bodies are always snappy)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "labels",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{agent: petrel}"#),
        doc: r#"Stream labels: name (letters, digits, `_`) to a `{{ field }}` template or a constant; a label whose field is missing is left out (counted `template_field_missing`); an event with no label gets `agent="petrel"`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "structured_metadata",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"Per-entry metadata (Loki 3), name to template; empty values are left out."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "remove_label_fields",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"false"#),
        doc: r#"Leave the fields the label templates read out of a `json` line."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "line_format",
        kind: petrel_core::plugin::KeyKind::OneOf(&["json", "text"]),
        default: Some(r#"json"#),
        doc: r#"`json`: the `ndjson` object of the event; `text`: the message only."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "tenant_id",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Sent as `X-Scope-OrgID`; `${ENV}` expanded."#,
    },
    crate::sinks::http::HEADERS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "auth",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"As for the `elasticsearch` sink: `basic`, `bearer`, `api_key`."#,
    },
    crate::sinks::tls::TLS_DOC,
    crate::sinks::http::DEAD_LETTER_DOC,
    crate::sinks::http::RETRY_DOC,
    petrel_core::plugin::KeyDoc {
        name: "max_streams",
        kind: petrel_core::plugin::KeyKind::Int,
        default: Some(r#"1000"#),
        doc: r#"Label sets in use at once (unused for 10 minutes: no longer counted); beyond it an event's label values become `petrel_overflow` (counted in `stream_overflow_events_total`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "out_of_order",
        kind: petrel_core::plugin::KeyKind::OneOf(&["accept", "rewrite_timestamp", "drop"]),
        default: Some(r#"accept"#),
        doc: r#"An entry older than the newest sent for its stream: sent as is, sent with that newest time, or dropped (counted `reason=out_of_order`)."#,
    },
    crate::sinks::http::batch_doc(r#"{max_bytes: 1MiB, max_events: 10000, timeout_ms: 1000}"#),
    crate::sinks::http::timeout_doc(r#"30000"#),
    crate::sinks::http::max_in_flight_doc(r#"8"#),
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// The value every label of an event over the cardinality guard gets.
pub const OVERFLOW_VALUE: &str = "petrel_overflow";
/// A label set unused for this long no longer counts against `max_streams`.
pub const STREAM_IDLE: Duration = Duration::from_secs(600);
/// The label set of events for which no label template gave a value: a
/// Loki stream needs at least one label.
const FALLBACK_LABEL: (&str, &str) = ("agent", "petrel");

/// Wire encoding of push requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireEncoding {
    /// `application/x-protobuf`, snappy-compressed (Loki's own clients).
    Protobuf,
    /// `application/json`.
    Json,
}

/// What the entry line holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// The whole event as a JSON object (as the `ndjson` encoding writes it).
    Json,
    /// The message text only.
    Text,
}

/// What happens to an entry older than what was already sent for its
/// stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfOrder {
    /// Sent as it is (Loki 2.4 and later accept out-of-order writes within
    /// its window).
    Accept,
    /// Sent with the newest time already sent for its stream.
    RewriteTimestamp,
    /// Not sent, counted in `discarded_events_total{reason="out_of_order"}`.
    Drop,
}

/// Configuration of the loki sink.
#[derive(Debug, Clone)]
pub struct LokiConfig {
    /// The push URL (`endpoint` joined with `path`).
    pub url: reqwest::Url,
    /// Wire encoding.
    pub encoding: WireEncoding,
    /// Compression of JSON bodies (protobuf bodies are always snappy).
    pub compression: Compression,
    /// Stream labels: name and value template, in config order.
    pub labels: Vec<(String, Template)>,
    /// Structured metadata of each entry: name and value template.
    pub structured_metadata: Vec<(String, Template)>,
    /// Leave the fields read by label templates out of a JSON line.
    pub remove_label_fields: bool,
    /// What the line holds.
    pub line_format: LineFormat,
    /// `X-Scope-OrgID`.
    pub tenant_id: Option<String>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Credentials.
    pub auth: Auth,
    /// TLS settings.
    pub tls: Tls,
    /// Where refused entries are written.
    pub dead_letter: Option<std::path::PathBuf>,
    /// When transient failures are given up (into `dead_letter`).
    pub retry: super::driver::RetryLimit,
    /// Most label sets in use at once.
    pub max_streams: usize,
    /// Entries older than their stream's newest sent entry.
    pub out_of_order: OutOfOrder,
    /// Largest request before compression.
    pub max_bytes: usize,
    /// Most entries per request.
    pub max_events: usize,
    /// Longest wait before a partial request is sent.
    pub linger: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
    /// Upper bound of the congestion window, in requests.
    pub max_in_flight: usize,
    /// What a JSON line holds (and which structured metadata pairs are
    /// written): the fields, their names and shape.
    pub output: Arc<petrel_core::schema::Output>,
}

/// Loki label names: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn valid_label_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_templates(
    map: &Map<'_>,
    key: &str,
    check_names: bool,
) -> Option<Option<Vec<(String, Template)>>> {
    let Some(n) = map.get(key) else {
        return Some(None);
    };
    let Some(m) = n.as_map_quiet() else {
        n.error(format!(
            "`{key}` must be a mapping of names to templates, e.g. `{{ app: \"{{{{ k8s.labels.app }}}}\", level: \"{{{{ level }}}}\" }}`"
        ));
        return None;
    };
    let mut out = Vec::new();
    for (name, v) in m.entries() {
        if check_names && !valid_label_name(name) {
            v.error(format!(
                "`{name}` is not a valid Loki label name: use letters, digits and `_`, not starting with a digit (e.g. `{}`)",
                name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            ));
            continue;
        }
        let text = v.as_str()?;
        out.push((name.to_string(), Template::parse(text, v)?));
    }
    Some(Some(out))
}

impl LokiConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let ep_node = map.required("endpoint", "http://127.0.0.1:3100")?;
        let ep_text = ep_node.as_str()?;
        let mut url = match reqwest::Url::parse(ep_text) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => u,
            Ok(u) => {
                ep_node.error(format!(
                    "`endpoint` must be http:// or https://, found `{}`",
                    u.scheme()
                ));
                return None;
            }
            Err(e) => {
                ep_node.error(format!("`endpoint` is not a valid URL ({e}): `{ep_text}`"));
                return None;
            }
        };
        let path = map.str("path").unwrap_or("/loki/api/v1/push");
        if !path.starts_with('/') {
            if let Some(n) = map.get("path") {
                n.error(format!(
                    "`path` must start with `/`, e.g. `/loki/api/v1/push`; found `{path}`"
                ));
            }
            return None;
        }
        let joined = format!("{}{}", url.path().trim_end_matches('/'), path);
        url.set_path(&joined);
        let encoding = match map.choice("encoding", &["protobuf", "json"]) {
            Some("json") => WireEncoding::Json,
            Some(_) => WireEncoding::Protobuf,
            None if map.get("encoding").is_some() => return None,
            None => WireEncoding::Protobuf,
        };
        let compression = match map.choice("compression", &["none", "gzip"]) {
            Some("gzip") if encoding == WireEncoding::Protobuf => {
                if let Some(n) = map.get("compression") {
                    n.error("protobuf push requests are always snappy-compressed; `compression: gzip` applies to `encoding: json`");
                }
                return None;
            }
            Some("gzip") => Compression::Gzip,
            Some(_) => Compression::None,
            None if map.get("compression").is_some() => return None,
            None => Compression::None,
        };
        let labels = parse_templates(&map, "labels", true)?.unwrap_or_default();
        let structured_metadata =
            parse_templates(&map, "structured_metadata", false)?.unwrap_or_default();
        let line_format = match map.choice("line_format", &["json", "text"]) {
            Some("text") => LineFormat::Text,
            Some(_) => LineFormat::Json,
            None if map.get("line_format").is_some() => return None,
            None => LineFormat::Json,
        };
        let tenant_id = match map.get("tenant_id") {
            Some(n) => Some(env_str(n, "tenant_id")?),
            None => None,
        };
        let headers = super::http::parse_headers(&map);
        let auth = match map.get("auth") {
            Some(n) => parse_auth(n)?,
            None => Auth::None,
        };
        let tls = match map.get("tls") {
            Some(n) => parse_tls(n)?,
            None => Tls {
                verify: true,
                ..Tls::default()
            },
        };
        let out_of_order =
            match map.choice("out_of_order", &["accept", "rewrite_timestamp", "drop"]) {
                Some("rewrite_timestamp") => OutOfOrder::RewriteTimestamp,
                Some("drop") => OutOfOrder::Drop,
                Some(_) => OutOfOrder::Accept,
                None if map.get("out_of_order").is_some() => return None,
                None => OutOfOrder::Accept,
            };
        let max_streams = match map.u64("max_streams", false) {
            Some(0) => {
                if let Some(n) = map.get("max_streams") {
                    n.error("`max_streams` must be at least 1 (default 1000)");
                }
                return None;
            }
            Some(v) => v as usize,
            None => 1000,
        };
        let (max_bytes, max_events, linger) =
            super::http::parse_batch(&map, (1 << 20, 10_000, 1000));
        let dead_letter = super::http::parse_dead_letter(&map, "/var/lib/petrel/loki-dead.ndjson")?;
        let retry = super::http::parse_retry(&map, &dead_letter)?;
        let output = Arc::new(super::parse_output(&map, true)?);
        Some(Self {
            output,
            url,
            encoding,
            compression,
            labels,
            structured_metadata,
            remove_label_fields: map.bool("remove_label_fields").unwrap_or(false),
            line_format,
            tenant_id,
            headers,
            auth,
            tls,
            dead_letter,
            retry,
            max_streams,
            out_of_order,
            max_bytes,
            max_events,
            linger,
            timeout: Duration::from_millis(map.u64("timeout_ms", false).unwrap_or(30_000)),
            max_in_flight: map
                .u64("max_in_flight_requests", false)
                .unwrap_or(8)
                .clamp(1, 1024) as usize,
        })
    }
}

/// A label set in use: when it was last seen (for the guard) and the
/// newest entry time sent for it (for `out_of_order`).
struct StreamState {
    last_seen: Instant,
    newest: i64,
}

/// The label sets in use, keyed by their encoded form.
struct Streams {
    map: HashMap<Box<[u8]>, StreamState>,
    /// When idle sets were last forgotten.
    last_sweep: Instant,
}

impl Streams {
    /// Whether `labels` may be used: known, or room for one more set
    /// (after forgetting sets idle for [`STREAM_IDLE`]).
    fn admit(&mut self, labels: &[u8], max: usize, now: Instant) -> bool {
        if let Some(s) = self.map.get_mut(labels) {
            s.last_seen = now;
            return true;
        }
        if self.map.len() >= max && now.duration_since(self.last_sweep) >= Duration::from_secs(10) {
            self.last_sweep = now;
            self.map
                .retain(|_, s| now.duration_since(s.last_seen) < STREAM_IDLE);
        }
        if self.map.len() >= max {
            return false;
        }
        self.map.insert(
            labels.into(),
            StreamState {
                last_seen: now,
                newest: i64::MIN,
            },
        );
        true
    }
}

/// The running loki sink.
pub struct LokiSink {
    config: LokiConfig,
    client: reqwest::Client,
    metrics: ComponentMetrics,
    streams: parking_lot::Mutex<Streams>,
    overflow: Counter,
    /// Entries older than their stream's newest sent entry.
    out_of_order: Counter,
    /// Of those, the ones dropped (`out_of_order: drop`).
    out_of_order_dropped: LazyCounter,
    /// Field names the label templates read, left out of JSON lines with
    /// `remove_label_fields`.
    label_fields: Vec<String>,
    last_loud: parking_lot::Mutex<Option<Instant>>,
    /// The snappy encoder and its output buffer, kept between requests:
    /// `compress_vec` allocated and zeroed a buffer of the body's
    /// worst-case size for every request (with the encoder's table, 9 %
    /// of the agent's instructions in the profile, BENCHMARKS.md §22);
    /// copying the compressed body out is about a third of that.
    snappy: parking_lot::Mutex<(snap::raw::Encoder, Vec<u8>)>,
}

impl LokiSink {
    /// Builds the HTTP client.
    pub fn new(c: &LokiConfig, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        let label_fields = if c.remove_label_fields {
            let mut v: Vec<String> = Vec::new();
            for (_, t) in &c.labels {
                for f in t.fields() {
                    if !v.iter().any(|x| x == f) {
                        v.push(f.to_string());
                    }
                }
            }
            v
        } else {
            Vec::new()
        };
        Ok(Self {
            config: c.clone(),
            client: super::client::build_client(
                &c.tls,
                c.timeout,
                &crate::tls::Owner::of(&metrics),
            )?,
            streams: parking_lot::Mutex::new(Streams {
                map: HashMap::new(),
                last_sweep: Instant::now(),
            }),
            overflow: metrics.stream_overflow(),
            out_of_order: metrics.out_of_order(),
            out_of_order_dropped: metrics.discarded_counter("out_of_order"),
            metrics,
            label_fields,
            last_loud: parking_lot::Mutex::new(None),
            snappy: parking_lot::Mutex::new((snap::raw::Encoder::new(), Vec::new())),
        })
    }

    /// `raw` compressed with snappy (raw block format, as Loki reads it).
    fn snappy(&self, raw: &[u8]) -> anyhow::Result<Bytes> {
        let mut guard = self.snappy.lock();
        let (encoder, out) = &mut *guard;
        let need = snap::raw::max_compress_len(raw.len());
        if need == 0 {
            anyhow::bail!(
                "a push request of {} bytes is too large to compress",
                raw.len()
            );
        }
        if out.len() < need {
            out.resize(need, 0);
        }
        let n = encoder.compress(raw, out)?;
        let body = Bytes::copy_from_slice(&out[..n]);
        // A buffer grown by one huge request is not kept.
        if out.len() > 4 * need.max(1 << 20) {
            *out = Vec::new();
        }
        Ok(body)
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Appends one label to a label set in the wire's form: `name="value"`
/// inside `{}` for protobuf (Loki's label string, with `\`, `"` and
/// newlines escaped), `"name":"value"` inside a JSON object for JSON.
fn push_label(enc: WireEncoding, out: &mut Vec<u8>, name: &str, value: &str) {
    let first = out.is_empty();
    match enc {
        WireEncoding::Protobuf => {
            out.extend_from_slice(if first { b"{" } else { b", " });
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"=\"");
            for b in value.bytes() {
                match b {
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    _ => out.push(b),
                }
            }
            out.push(b'"');
        }
        WireEncoding::Json => {
            out.push(if first { b'{' } else { b',' });
            write_json_str(out, name);
            out.push(b':');
            write_json_str(out, value);
        }
    }
}

/// Appends a length-delimited protobuf field.
fn put_bytes_field(tag: u32, value: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

/// Splits a record written by [`LokiSink::encode`] into its label set, time
/// and entry payload. `None` only if the record is not one of ours.
fn split_record(rec: &[u8]) -> Option<(&[u8], i64, &[u8])> {
    let n = u32::from_le_bytes(rec.get(..4)?.try_into().ok()?) as usize;
    let labels = rec.get(4..4 + n)?;
    let ts = i64::from_le_bytes(rec.get(4 + n..12 + n)?.try_into().ok()?);
    Some((labels, ts, rec.get(12 + n..)?))
}

impl Sink for LokiSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        let now = now_ns();
        let enc = self.config.encoding;
        let skip: Vec<&str> = self.label_fields.iter().map(String::as_str).collect();
        let shape = JsonShape {
            time_key: None,
            default_time: None,
            default_ns: None,
            skip: &skip,
        };
        let plan = self.config.output.plan(&batch.source);
        let mut stats = EncodeStats::default();
        let mut labels: Vec<u8> = Vec::with_capacity(128);
        let mut overflow_labels: Vec<u8> = Vec::new();
        // The label set of the previous event and whether the guard let
        // it through: consecutive events mostly share one, so the shared
        // stream table is locked once per change, not once per event.
        let mut last: Option<(Vec<u8>, bool)> = None;
        let mut value = String::new();
        let mut line: Vec<u8> = Vec::with_capacity(1024);
        let mut meta: Vec<u8> = Vec::new();
        let mut overflowed = 0u64;
        let mut missing = 0u64;
        let bytes = &mut out.bytes;
        for ev in &batch.events {
            labels.clear();
            overflow_labels.clear();
            for (name, t) in &self.config.labels {
                if t.render(ev, batch, &mut value) && !value.is_empty() {
                    push_label(enc, &mut labels, name, &value);
                    push_label(enc, &mut overflow_labels, name, OVERFLOW_VALUE);
                } else if t.fields().next().is_some() {
                    missing += 1;
                }
            }
            if labels.is_empty() {
                push_label(enc, &mut labels, FALLBACK_LABEL.0, FALLBACK_LABEL.1);
            }
            labels.push(b'}');
            let admitted = match &last {
                Some((l, ok)) if *l == labels => *ok,
                _ => {
                    let ok =
                        self.streams
                            .lock()
                            .admit(&labels, self.config.max_streams, Instant::now());
                    last = Some((labels.clone(), ok));
                    ok
                }
            };
            let set: &[u8] = if admitted {
                &labels
            } else {
                overflowed += 1;
                overflow_labels.push(b'}');
                &overflow_labels
            };
            // The line.
            line.clear();
            match self.config.line_format {
                LineFormat::Json => plan.write_json(batch, ev, shape, &mut line, &mut stats),
                LineFormat::Text => match batch.bytes_of(&ev.message) {
                    Some(b) => match std::str::from_utf8(b) {
                        Ok(_) => line.extend_from_slice(b),
                        Err(_) => {
                            // Protobuf strings and JSON must be UTF-8.
                            stats.invalid_utf8 += 1;
                            line.extend_from_slice(String::from_utf8_lossy(b).as_bytes());
                        }
                    },
                    None => {
                        let mut j = Vec::new();
                        petrel_core::encode::write_json_value(
                            batch,
                            &ev.message,
                            &mut j,
                            &mut stats,
                        );
                        line.extend_from_slice(&j);
                    }
                },
            }
            // The structured metadata.
            meta.clear();
            let mut pairs = 0;
            for (name, t) in &self.config.structured_metadata {
                if !self.config.output.selects(name) {
                    continue;
                }
                if !t.render(ev, batch, &mut value) || value.is_empty() {
                    continue;
                }
                pairs += 1;
                match enc {
                    WireEncoding::Protobuf => {
                        let mut pair = Vec::with_capacity(name.len() + value.len() + 4);
                        put_bytes_field(1, name.as_bytes(), &mut pair);
                        put_bytes_field(2, value.as_bytes(), &mut pair);
                        put_bytes_field(3, &pair, &mut meta);
                    }
                    WireEncoding::Json => {
                        meta.push(if pairs == 1 { b'{' } else { b',' });
                        write_json_str(&mut meta, name);
                        meta.push(b':');
                        write_json_str(&mut meta, &value);
                    }
                }
            }
            // The record.
            bytes.extend_from_slice(&(set.len() as u32).to_le_bytes());
            bytes.extend_from_slice(set);
            bytes.extend_from_slice(&ev.time_ns.unwrap_or(now).to_le_bytes());
            match enc {
                WireEncoding::Protobuf => {
                    put_bytes_field(2, &line, bytes);
                    bytes.extend_from_slice(&meta);
                }
                WireEncoding::Json => {
                    bytes.push(b',');
                    // `line` is valid UTF-8 (checked or written above):
                    // the lossy view borrows it.
                    write_json_str(bytes, &String::from_utf8_lossy(&line));
                    if pairs > 0 {
                        meta.push(b'}');
                        bytes.push(b',');
                        bytes.extend_from_slice(&meta);
                    }
                }
            }
            // A sentinel newline: the request builder strips one from
            // every record, so the record's range stays exact.
            bytes.push(b'\n');
            out.record_ends.push(bytes.len() as u32);
        }
        if overflowed > 0 {
            self.overflow.inc_by(overflowed);
            self.loud(
                0,
                "",
                &format!(
                    "more than max_streams ({}) label sets in use: {overflowed} events were sent with every label value set to `{OVERFLOW_VALUE}`; check the `labels` templates for values with unbounded cardinality",
                    self.config.max_streams
                ),
            );
        }
        if missing > 0 {
            self.metrics.error("template_field_missing", missing);
        }
        out.invalid_utf8 = stats.invalid_utf8;
    }

    fn expansion_hint(&self) -> usize {
        // A short line's record: its label set, the time and a JSON line
        // with field names and metadata, ~7x a 20-byte line.
        8_000
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        let c = &self.config;
        let settings = Settings::new(Framing::NDJSON, c.url.to_string(), c.dead_letter.clone())
            .limits(c.max_bytes, c.max_events, c.linger, c.max_in_flight)
            .retry(c.retry);
        let metrics = self.metrics.clone();
        driver::run(self, rx, settings, metrics)
    }
}

impl RequestSink for LokiSink {
    /// The label sets of the request and its entries in push order.
    type Plan<'b> = (Vec<&'b [u8]>, Vec<Entry>);

    const WORDING: Wording = Wording {
        sink: "loki sink",
        peer: "Loki",
        items: ("entry", "entries"),
        hold_fix: "the credentials, the tenant or the URL",
    };

    fn plan<'b>(&self, batch: &'b Batch) -> (Self::Plan<'b>, usize) {
        let (sets, entries) = self.prepare(Records::of(batch));
        let n = entries.len();
        ((sets, entries), n)
    }

    fn build_request(
        &self,
        batch: &Batch,
        (sets, entries): &Self::Plan<'_>,
        items: Selection<'_>,
    ) -> anyhow::Result<Bytes> {
        let recs = Records::of(batch);
        let raw = if items.is_all() {
            self.body(recs, sets, entries)
        } else {
            // A subset in push order is still grouped and sorted.
            let some: Vec<Entry> = items.iter().map(|i| entries[i]).collect();
            self.body(recs, sets, &some)
        };
        Ok(match self.config.encoding {
            WireEncoding::Protobuf => self.snappy(&raw)?,
            WireEncoding::Json => self.config.compression.apply(raw.into())?,
        })
    }

    async fn send(&self, body: Bytes, _items: usize) -> Answer {
        let (content_type, encoding) = match self.config.encoding {
            WireEncoding::Protobuf => ("application/x-protobuf", None),
            WireEncoding::Json => (
                "application/json",
                self.config.compression.content_encoding(),
            ),
        };
        let mut rb = self
            .client
            .post(self.config.url.clone())
            .header(CONTENT_TYPE, content_type)
            .body(body);
        if let Some(e) = encoding {
            rb = rb.header(CONTENT_ENCODING, e);
        }
        if let Some(t) = &self.config.tenant_id {
            rb = rb.header("X-Scope-OrgID", t);
        }
        for (k, v) in &self.config.headers {
            rb = rb.header(k.as_str(), v.as_str());
        }
        rb = self.config.auth.apply(rb);
        match rb.send().await {
            Err(e) => unanswered(&e, self.config.url.as_str(), self.config.timeout),
            Ok(r) if r.status().is_success() => Answer::Delivered,
            // Too large: halved until an entry alone is too large.
            Ok(r) if r.status().as_u16() == 413 => Answer::Refused {
                status: 413,
                text: "request too large".to_string(),
                split: true,
            },
            // Loki refuses a push for what holds for all its entries
            // (labels, age, line length): set aside together.
            Ok(r) => match failed_answer(r, usually_transient).await {
                Answer::Refused { status, text, .. } => Answer::Refused {
                    status,
                    text,
                    split: false,
                },
                other => other,
            },
        }
    }

    fn item_record<'a>(
        &self,
        batch: &'a Batch,
        (_, entries): &Self::Plan<'_>,
        item: usize,
    ) -> &'a [u8] {
        batch.record(entries[item].record as usize)
    }

    fn dead_letter_record<'a>(&self, record: &'a [u8], answer: &'a str) -> DeadRecord<'a> {
        DeadRecord {
            record: self.dead_record(record).into(),
            answer: answer.into(),
        }
    }
}

/// The records of a request: its body and each record's range in it.
#[derive(Clone, Copy)]
struct Records<'a> {
    body: &'a [u8],
    ranges: &'a [std::ops::Range<usize>],
}

impl<'a> Records<'a> {
    fn of(batch: &'a Batch) -> Self {
        Self {
            body: &batch.body,
            ranges: &batch.records,
        }
    }
}

/// One entry of a request, in the order the push body lists them: by
/// stream (first appearance), then by time. Public only as part of the
/// sink's plan of a request ([`RequestSink::Plan`]).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    stream: u32,
    ts: i64,
    record: u32,
}

impl LokiSink {
    /// Logs `msg` as an error at most once per 10 s.
    fn loud(&self, status: u16, text: &str, msg: &str) {
        let mut last = self.last_loud.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::error!(status, answer = %text, url = %self.config.url, sink = %self.metrics.health_key(), "loki sink: {msg}");
        }
    }

    /// Groups `req`'s records by stream, sorts each stream by time and
    /// applies `out_of_order` against what was already sent. Returns the
    /// label sets and the entries to send.
    fn prepare<'r>(&self, recs: Records<'r>) -> (Vec<&'r [u8]>, Vec<Entry>) {
        let mut sets: Vec<&[u8]> = Vec::new();
        let mut index: HashMap<&[u8], u32> = HashMap::new();
        let mut entries = Vec::with_capacity(recs.ranges.len());
        for (i, r) in recs.ranges.iter().enumerate() {
            let Some((labels, ts, _)) = split_record(&recs.body[r.clone()]) else {
                continue;
            };
            let stream = *index.entry(labels).or_insert_with(|| {
                sets.push(labels);
                (sets.len() - 1) as u32
            });
            entries.push(Entry {
                stream,
                ts,
                record: i as u32,
            });
        }
        // Stable: entries of one time keep their read order.
        entries.sort_by_key(|e| (e.stream, e.ts));
        let (mut dropped, mut late) = (0u64, 0u64);
        {
            let mut streams = self.streams.lock();
            let mut kept = Vec::with_capacity(entries.len());
            let mut i = 0;
            while i < entries.len() {
                let s = entries[i].stream;
                let state = streams
                    .map
                    .entry(sets[s as usize].into())
                    .or_insert(StreamState {
                        last_seen: Instant::now(),
                        newest: i64::MIN,
                    });
                while i < entries.len() && entries[i].stream == s {
                    let mut e = entries[i];
                    i += 1;
                    if e.ts < state.newest {
                        late += 1;
                        match self.config.out_of_order {
                            OutOfOrder::Accept => {}
                            OutOfOrder::RewriteTimestamp => e.ts = state.newest,
                            OutOfOrder::Drop => {
                                dropped += 1;
                                continue;
                            }
                        }
                    }
                    state.newest = state.newest.max(e.ts);
                    kept.push(e);
                }
            }
            entries = kept;
        }
        self.out_of_order.inc_by(late);
        self.out_of_order_dropped.inc_by(dropped);
        (sets, entries)
    }

    /// The push body of `entries` (uncompressed).
    fn body(&self, recs: Records<'_>, sets: &[&[u8]], entries: &[Entry]) -> Vec<u8> {
        let payload = |e: &Entry| {
            split_record(&recs.body[recs.ranges[e.record as usize].clone()])
                .map(|(_, _, p)| p)
                .unwrap_or_default()
        };
        let mut out = Vec::with_capacity(entries.iter().map(|e| payload(e).len() + 32).sum());
        let runs = entries.chunk_by(|a, b| a.stream == b.stream);
        match self.config.encoding {
            WireEncoding::Protobuf => {
                // PushRequest { repeated StreamAdapter streams = 1 }
                // StreamAdapter { string labels = 1; repeated EntryAdapter entries = 2 }
                // EntryAdapter { Timestamp timestamp = 1; string line = 2;
                //                repeated LabelPairAdapter structuredMetadata = 3 }
                // An entry's line and metadata were encoded with the event;
                // only the timestamp and the lengths are written here.
                let ts_msg_len = |ts: i64| {
                    let (s, n) = (ts.div_euclid(1_000_000_000), ts.rem_euclid(1_000_000_000));
                    let mut l = 0;
                    if s != 0 {
                        l += key_len(1) + encoded_len_varint(s as u64);
                    }
                    if n != 0 {
                        l += key_len(2) + encoded_len_varint(n as u64);
                    }
                    l
                };
                let entry_len = |e: &Entry| {
                    let t = ts_msg_len(e.ts);
                    key_len(1) + encoded_len_varint(t as u64) + t + payload(e).len()
                };
                for run in runs {
                    let labels = sets[run[0].stream as usize];
                    let entries_len: usize = run
                        .iter()
                        .map(|e| {
                            let l = entry_len(e);
                            key_len(2) + encoded_len_varint(l as u64) + l
                        })
                        .sum();
                    let stream_len = key_len(1)
                        + encoded_len_varint(labels.len() as u64)
                        + labels.len()
                        + entries_len;
                    encode_key(1, WireType::LengthDelimited, &mut out);
                    encode_varint(stream_len as u64, &mut out);
                    put_bytes_field(1, labels, &mut out);
                    for e in run {
                        encode_key(2, WireType::LengthDelimited, &mut out);
                        encode_varint(entry_len(e) as u64, &mut out);
                        encode_key(1, WireType::LengthDelimited, &mut out);
                        encode_varint(ts_msg_len(e.ts) as u64, &mut out);
                        let (s, n) = (
                            e.ts.div_euclid(1_000_000_000),
                            e.ts.rem_euclid(1_000_000_000),
                        );
                        if s != 0 {
                            encode_key(1, WireType::Varint, &mut out);
                            encode_varint(s as u64, &mut out);
                        }
                        if n != 0 {
                            encode_key(2, WireType::Varint, &mut out);
                            encode_varint(n as u64, &mut out);
                        }
                        out.extend_from_slice(payload(e));
                    }
                }
            }
            WireEncoding::Json => {
                out.extend_from_slice(b"{\"streams\":[");
                for (n, run) in runs.enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(b"{\"stream\":");
                    out.extend_from_slice(sets[run[0].stream as usize]);
                    out.extend_from_slice(b",\"values\":[");
                    for (k, e) in run.iter().enumerate() {
                        if k > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(b"[\"");
                        out.extend_from_slice(e.ts.to_string().as_bytes());
                        out.push(b'"');
                        out.extend_from_slice(payload(e));
                        out.push(b']');
                    }
                    out.extend_from_slice(b"]}");
                }
                out.extend_from_slice(b"]}");
            }
        }
        out
    }

    /// The JSON rendering of one record for the dead-letter file.
    fn dead_record(&self, rec: &[u8]) -> Vec<u8> {
        let Some((labels, ts, payload)) = split_record(rec) else {
            return rec.to_vec();
        };
        let labels_text = String::from_utf8_lossy(labels).into_owned();
        let (line, meta) = match self.config.encoding {
            WireEncoding::Protobuf => match <EntryFields as prost::Message>::decode(payload) {
                Ok(e) => (
                    e.line,
                    serde_json::Value::Object(
                        e.structured_metadata
                            .into_iter()
                            .map(|p| (p.name, serde_json::Value::String(p.value)))
                            .collect(),
                    ),
                ),
                Err(_) => (
                    String::from_utf8_lossy(payload).into_owned(),
                    serde_json::Value::Null,
                ),
            },
            WireEncoding::Json => {
                let mut text = b"[0".to_vec();
                text.extend_from_slice(payload);
                text.push(b']');
                match serde_json::from_slice::<Vec<serde_json::Value>>(&text) {
                    Ok(mut v) if v.len() >= 2 => {
                        let meta = if v.len() > 2 {
                            v.remove(2)
                        } else {
                            serde_json::Value::Null
                        };
                        (v[1].as_str().unwrap_or_default().to_string(), meta)
                    }
                    _ => (
                        String::from_utf8_lossy(payload).into_owned(),
                        serde_json::Value::Null,
                    ),
                }
            }
        };
        let mut j = serde_json::json!({
            "labels": labels_text,
            "timestamp_ns": ts.to_string(),
            "line": line,
        });
        if !meta.is_null() {
            j["structured_metadata"] = meta;
        }
        j.to_string().into_bytes()
    }
}

/// The fields of Loki's `EntryAdapter` after the timestamp, for reading
/// an encoded entry back (dead letters, tests).
#[derive(Clone, PartialEq, prost::Message)]
struct EntryFields {
    #[prost(string, tag = "2")]
    line: String,
    #[prost(message, repeated, tag = "3")]
    structured_metadata: Vec<LabelPair>,
}

/// Loki's `LabelPairAdapter`.
#[derive(Clone, PartialEq, prost::Message)]
struct LabelPair {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// Registration of `type: loki`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "loki",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| LokiConfig::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for LokiConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(vec![self.url.host_str().unwrap_or_default().to_string()])
    }
    fn local_writes(&self) -> Vec<std::path::PathBuf> {
        self.dead_letter.iter().cloned().collect()
    }

    fn type_name(&self) -> &'static str {
        "loki"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(LokiSink::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};
    use petrel_core::{Event, SourceInfo, Span, Value};

    /// Loki's push request, as its `push.proto` declares it, for reading
    /// what the sink wrote.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        streams: Vec<StreamAdapter>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct StreamAdapter {
        #[prost(string, tag = "1")]
        labels: String,
        #[prost(message, repeated, tag = "2")]
        entries: Vec<EntryAdapter>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct EntryAdapter {
        #[prost(message, optional, tag = "1")]
        timestamp: Option<Timestamp>,
        #[prost(string, tag = "2")]
        line: String,
        #[prost(message, repeated, tag = "3")]
        structured_metadata: Vec<LabelPair>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Timestamp {
        #[prost(int64, tag = "1")]
        seconds: i64,
        #[prost(int32, tag = "2")]
        nanos: i32,
    }

    fn config(yaml: &str) -> Result<LokiConfig, String> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, yaml).map_err(|e| e.to_string())?;
        let errs = ConfigErrors::new();
        let node = Node::root(&f, &raw, &errs);
        let map = node.as_map(KEYS).ok_or("not a map")?;
        let c = LokiConfig::parse(map);
        match (c, errs.is_empty()) {
            (Some(c), true) => Ok(c),
            _ => Err(format!("{:?}", errs.into_vec())),
        }
    }

    fn sink(yaml: &str) -> LokiSink {
        let c = config(yaml).expect("valid config");
        let m = petrel_core::Metrics::new().component("p", "sink", "loki", "loki");
        LokiSink::new(&c, m).expect("sink")
    }

    /// Events `(message, level, time)` in one batch.
    fn batch(events: &[(&str, &str, i64)]) -> EventBatch {
        let text: String = events.iter().map(|(m, _, _)| format!("{m}\n")).collect();
        let mut b = EventBatch::new(
            bytes::Bytes::from(text),
            Arc::new(SourceInfo::file("/var/log/app.log", Arc::new([]))),
        );
        let mut at = 0;
        for (m, level, t) in events {
            let mut e = Event::from_span(Span::new(at, m.len()));
            at += m.len() + 1;
            e.time_ns = Some(*t);
            if !level.is_empty() {
                e.set("level".into(), Value::Str((*level).into()));
            }
            b.events.push(e);
        }
        b
    }

    /// Encodes `b` and builds the push body of all its records.
    fn push_body(s: &LokiSink, b: &EventBatch) -> Vec<u8> {
        let mut out = Encoded::default();
        s.encode(b, &mut out);
        let mut ranges = Vec::new();
        let mut start = 0;
        for &end in &out.record_ends {
            // The request builder strips the sentinel newline.
            ranges.push(start..end as usize - 1);
            start = end as usize;
        }
        let recs = Records {
            body: &out.bytes,
            ranges: &ranges,
        };
        let (sets, entries) = s.prepare(recs);
        s.body(recs, &sets, &entries)
    }

    fn decode(body: &[u8]) -> PushRequest {
        <PushRequest as prost::Message>::decode(body).expect("a push request")
    }

    const T: i64 = 1_700_000_000_123_456_789;

    #[test]
    fn protobuf_streams_group_by_labels_and_sort_by_time() {
        let s = sink(
            "endpoint: http://127.0.0.1:3100\nlabels: { level: \"{{ level }}\", app: web }\nline_format: text\nstructured_metadata: { path: \"{{ file }}\" }\n",
        );
        let b = batch(&[
            ("b", "info", T + 2),
            ("x", "warn", T),
            ("a", "info", T + 1),
            ("c", "", T + 3),
        ]);
        let req = decode(&push_body(&s, &b));
        let got: Vec<(String, Vec<(i64, String)>)> = req
            .streams
            .iter()
            .map(|st| {
                (
                    st.labels.clone(),
                    st.entries
                        .iter()
                        .map(|e| {
                            let ts = e.timestamp.as_ref().expect("timestamp");
                            (ts.seconds * 1_000_000_000 + ts.nanos as i64, e.line.clone())
                        })
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "{level=\"info\", app=\"web\"}".to_string(),
                    vec![(T + 1, "a".to_string()), (T + 2, "b".to_string())]
                ),
                (
                    "{level=\"warn\", app=\"web\"}".to_string(),
                    vec![(T, "x".to_string())]
                ),
                // A missing field leaves its label out.
                ("{app=\"web\"}".to_string(), vec![(T + 3, "c".to_string())]),
            ]
        );
        let meta = &req.streams[0].entries[0].structured_metadata;
        assert_eq!(meta.len(), 1);
        assert_eq!(
            (meta[0].name.as_str(), meta[0].value.as_str()),
            ("path", "/var/log/app.log")
        );
    }

    #[test]
    fn json_body_and_removed_label_fields() {
        let s = sink(
            "endpoint: http://127.0.0.1:3100\nencoding: json\nlabels: { level: \"{{ level }}\" }\nremove_label_fields: true\n",
        );
        let body = push_body(&s, &batch(&[("say \"hi\"", "info", T)]));
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            v["streams"][0]["stream"],
            serde_json::json!({"level": "info"})
        );
        assert_eq!(v["streams"][0]["values"][0][0], T.to_string());
        let line: serde_json::Value =
            serde_json::from_str(v["streams"][0]["values"][0][1].as_str().expect("line"))
                .expect("a JSON line");
        assert_eq!(line["message"], "say \"hi\"");
        assert!(line.get("level").is_none(), "label field removed: {line}");
    }

    #[test]
    fn the_guard_caps_label_sets_and_keeps_names() {
        let s = sink(
            "endpoint: http://127.0.0.1:3100\nlabels: { id: \"{{ message }}\" }\nmax_streams: 3\n",
        );
        let events: Vec<(String, i64)> = (0..10).map(|i| (format!("req-{i}"), T + i)).collect();
        let ev: Vec<(&str, &str, i64)> = events.iter().map(|(m, t)| (m.as_str(), "", *t)).collect();
        let req = decode(&push_body(&s, &batch(&ev)));
        let labels: Vec<&str> = req.streams.iter().map(|s| s.labels.as_str()).collect();
        assert_eq!(
            labels,
            vec![
                "{id=\"req-0\"}",
                "{id=\"req-1\"}",
                "{id=\"req-2\"}",
                "{id=\"petrel_overflow\"}"
            ]
        );
        assert_eq!(req.streams[3].entries.len(), 7);
        assert_eq!(s.overflow.get(), 7);
        // Known sets stay usable.
        let again = decode(&push_body(&s, &batch(&[("req-1", "", T + 20)])));
        assert_eq!(again.streams[0].labels, "{id=\"req-1\"}");
    }

    #[test]
    fn out_of_order_entries_are_handled_per_stream() {
        for (mode, want) in [
            ("accept", vec![T - 5, T + 10]),
            ("rewrite_timestamp", vec![T + 10, T + 10]),
            ("drop", vec![T + 10]),
        ] {
            let s = sink(&format!(
                "endpoint: http://127.0.0.1:3100\nlabels: {{ app: web }}\nout_of_order: {mode}\n"
            ));
            decode(&push_body(&s, &batch(&[("new", "", T + 10)])));
            let req = decode(&push_body(
                &s,
                &batch(&[("old", "", T - 5), ("same", "", T + 10)]),
            ));
            let times: Vec<i64> = req
                .streams
                .iter()
                .flat_map(|st| st.entries.iter())
                .map(|e| {
                    let ts = e.timestamp.as_ref().expect("timestamp");
                    ts.seconds * 1_000_000_000 + ts.nanos as i64
                })
                .collect();
            assert_eq!(times, want, "mode {mode}");
            assert_eq!(s.out_of_order.get(), 1, "mode {mode}");
            assert_eq!(s.out_of_order_dropped.get(), u64::from(mode == "drop"));
        }
    }

    #[test]
    fn dead_letter_records_are_readable() {
        for enc in ["protobuf", "json"] {
            let s = sink(&format!(
                "endpoint: http://127.0.0.1:3100\nencoding: {enc}\nline_format: text\nlabels: {{ app: web }}\nstructured_metadata: {{ k: v }}\n"
            ));
            let mut out = Encoded::default();
            s.encode(&batch(&[("hello", "", T)]), &mut out);
            let rec = &out.bytes[..out.bytes.len() - 1];
            let j: serde_json::Value = serde_json::from_slice(&s.dead_record(rec)).expect("JSON");
            assert_eq!(j["line"], "hello", "{enc}");
            assert_eq!(j["timestamp_ns"], T.to_string());
            assert_eq!(j["structured_metadata"]["k"], "v", "{enc}");
            assert!(j["labels"].as_str().unwrap_or_default().contains("web"));
        }
    }

    #[test]
    fn config_errors_are_reported() {
        assert!(config("labels: { a: b }\n")
            .unwrap_err()
            .contains("endpoint"));
        assert!(config("endpoint: http://x\nlabels: { bad-name: x }\n")
            .unwrap_err()
            .contains("not a valid Loki label name"));
        assert!(config("endpoint: http://x\ncompression: gzip\n")
            .unwrap_err()
            .contains("snappy"));
        assert!(config("endpoint: http://x\nmax_streams: 0\n")
            .unwrap_err()
            .contains("max_streams"));
        let c = config("endpoint: http://127.0.0.1:9428/insert/\npath: /loki/api/v1/push\n")
            .expect("ok");
        assert_eq!(
            c.url.as_str(),
            "http://127.0.0.1:9428/insert/loki/api/v1/push"
        );
    }
}
