//! `type: elasticsearch` — indexes events through the bulk API of
//! Elasticsearch 7/8 and OpenSearch 1/2/3.
//!
//! Encoding (on the processing pool) writes each event as an action line
//! and the document, with the shared JSON writer of the `ndjson` encoding.
//! Delivery runs through the driver ([`super::driver`]: batching,
//! congestion window, retries and acknowledgements); the sink's
//! classification reads a bulk answer per item: 2xx delivered; 409 on
//! `create` means our own id is already there (a copy sent again after a
//! crash or a lost answer), so it is delivered and counted in
//! `component_duplicates_skipped_total`; 408, 429 and 5xx items are sent
//! again alone after a backoff; 401, 403 and 404 items wait, loudly, for an
//! operator; any other 4xx item (mapping conflict, parse error) goes to
//! `dead_letter` with the server's reason, or without one is retried
//! loudly, never dropped. A whole request answered 413 is split in halves.
//!
//! Ids: by default (`id: auto`) each event's `_id` is derived from where it
//! was read (the batch [`petrel_core::Origin`]: the file's identity and the
//! offset of the event's first byte), so a batch read and sent again lands
//! on the same documents.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use petrel_core::config::Map;
use petrel_core::encode::{write_json_str, EncodeStats, JsonShape};
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};
use prometheus_client::metrics::counter::Counter;
use reqwest::header::{CONTENT_ENCODING, CONTENT_TYPE};

use super::client::{
    answer_text, failed_answer, parse_auth, parse_tls, retry_after, send_failure, unanswered,
    usually_transient, Auth, Tls,
};
use super::driver::{
    self, Answer, Batch, Compression, DeadRecord, Framing, Item, RequestSink, Selection, Settings,
    Wording,
};
use super::origin::{id_text, origin_id};
use super::template::{Template, TimeTemplate};

/// Keys accepted by the elasticsearch sink. `id` is the document id
/// setting, so the component's own id is `component_id`.
pub const KEYS: &[&str] = &[
    "type",
    "component_id",
    "id",
    "endpoints",
    "index",
    "mode",
    "data_stream",
    "dead_letter",
    "retry",
    "compression",
    "auth",
    "tls",
    "pipeline",
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
pub const DOC: &str = r#"Elasticsearch 7/8 and OpenSearch 1/2/3 through the bulk API, answers read per item; with `mode: create` and the default ids a batch sent again leaves no duplicate. Cargo feature `elasticsearch` (default)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc {
        name: "component_id",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"elasticsearch_<index>"#),
        doc: r#"The sink's component id (metrics, checkpoints): `id` is the document id here."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "id",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"auto"#),
        doc: r#"The document id: `auto` (derived from where the event was read, server-assigned where the source has no stable positions), `none` (server-assigned), or a `{{ field }}` template."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "endpoints",
        kind: petrel_core::plugin::KeyKind::List,
        default: None,
        doc: r#"Required: base URLs (`http://` or `https://`, a path prefix is kept), used in turn; after a connection error or 5xx an endpoint is skipped for 0.25 s doubling to 30 s."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "index",
        kind: petrel_core::plugin::KeyKind::Template,
        default: Some(r#"petrel-%Y.%m.%d"#),
        doc: r#"Index name: `{{ field }}` templates and `%Y %y %m %d %H %M %S %j %%` of the event time in UTC; a missing field renders empty (counted `template_field_missing`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "mode",
        kind: petrel_core::plugin::KeyKind::OneOf(&["create", "index", "data_stream"]),
        default: Some(r#"create"#),
        doc: r#"`create` (an existing id is answered 409: counted as a skipped duplicate), `index` (creates or overwrites), `data_stream` (`create` into `{type}-{dataset}-{namespace}`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "data_stream",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{type: logs, dataset: generic, namespace: default}"#),
        doc: r#"With `mode: data_stream` only; each part may be a template."#,
    },
    crate::sinks::http::DEAD_LETTER_DOC,
    crate::sinks::http::RETRY_DOC,
    petrel_core::plugin::KeyDoc {
        name: "compression",
        kind: petrel_core::plugin::KeyKind::OneOf(&["none", "gzip"]),
        default: Some(r#"none"#),
        doc: r#"`gzip`: `Content-Encoding: gzip`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "auth",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"`{strategy: basic, user, password}`, `{strategy: api_key, api_key}` (the encoded key, sent as `Authorization: ApiKey ...`) or `{strategy: bearer, token}`; `${ENV}` expanded at load."#,
    },
    crate::sinks::tls::TLS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "pipeline",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Ingest pipeline for every document."#,
    },
    crate::sinks::http::batch_doc(r#"{max_bytes: 5MiB, max_events: 10000, timeout_ms: 1000}"#),
    crate::sinks::http::timeout_doc(r#"60000"#),
    crate::sinks::http::max_in_flight_doc(r#"8"#),
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// The bulk operation each event becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `index`: creates or replaces the document with the id.
    Index,
    /// `create`: creates the document; an existing id is answered 409.
    Create,
    /// `create` into a data stream (`{type}-{dataset}-{namespace}`).
    DataStream,
}

/// How each document's `_id` is chosen.
#[derive(Debug, Clone)]
pub enum DocId {
    /// Derived from where the event was read; none (server-assigned) for
    /// sources without stable positions.
    Auto,
    /// Always server-assigned.
    None,
    /// A `{{ field }}` template; server-assigned when a field is missing.
    Template(Template),
}

/// An index name: `{{ field }}` templates, and strftime (`%Y.%m.%d`) of
/// the event time in its literal text.
pub type IndexName = TimeTemplate;

/// Configuration of the elasticsearch sink.
#[derive(Debug, Clone)]
pub struct ElasticsearchConfig {
    /// Base URLs of the nodes, used in turn.
    pub endpoints: Vec<reqwest::Url>,
    /// Target index (or data stream) name.
    pub index: IndexName,
    /// Bulk operation.
    pub mode: Mode,
    /// Document ids.
    pub id: DocId,
    /// Where refused documents are written.
    pub dead_letter: Option<std::path::PathBuf>,
    /// When transient failures are given up (into `dead_letter`).
    pub retry: super::driver::RetryLimit,
    /// Request body compression.
    pub compression: Compression,
    /// Credentials.
    pub auth: Auth,
    /// TLS settings.
    pub tls: Tls,
    /// Ingest pipeline applied to every document.
    pub pipeline: Option<String>,
    /// Largest bulk body before compression.
    pub max_bytes: usize,
    /// Most documents per bulk request.
    pub max_events: usize,
    /// Longest wait before a partial request is sent.
    pub linger: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
    /// Upper bound of the congestion window, in requests.
    pub max_in_flight: usize,
    /// What each document holds: the fields, their names and shape.
    pub output: Arc<petrel_core::schema::Output>,
}

impl ElasticsearchConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let ep_node = map.required("endpoints", "[\"http://127.0.0.1:9200\"]")?;
        let mut endpoints = Vec::new();
        let listed = ep_node.as_str_list();
        for (text, n) in &listed {
            match reqwest::Url::parse(text) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => endpoints.push(u),
                Ok(u) => n.error(format!(
                    "endpoints must be http:// or https://, found `{}`",
                    u.scheme()
                )),
                Err(e) => n.error(format!("`{text}` is not a valid URL ({e})")),
            }
        }
        if endpoints.len() < listed.len() {
            // Each bad URL was reported where it stands.
            return None;
        }
        if endpoints.is_empty() {
            ep_node.error("`endpoints` needs at least one URL, e.g. `[\"http://127.0.0.1:9200\"]`");
            return None;
        }
        let mode = match map.choice("mode", &["create", "index", "data_stream"]) {
            Some("index") => Mode::Index,
            Some("data_stream") => Mode::DataStream,
            Some(_) => Mode::Create,
            None if map.get("mode").is_some() => return None,
            None => Mode::Create,
        };
        let index = if mode == Mode::DataStream {
            if let Some(n) = map.get("index") {
                n.error("`index` does not apply to `mode: data_stream`; the stream is `{type}-{dataset}-{namespace}` of `data_stream`");
                return None;
            }
            let (mut ty, mut dataset, mut namespace) = ("logs", "generic", "default");
            let ds_node = map.get("data_stream");
            if let Some(n) = ds_node {
                let m = n.as_map(&["type", "dataset", "namespace"])?;
                ty = m.str("type").unwrap_or(ty);
                dataset = m.str("dataset").unwrap_or(dataset);
                namespace = m.str("namespace").unwrap_or(namespace);
            }
            IndexName::parse(
                &format!("{ty}-{dataset}-{namespace}"),
                ds_node.unwrap_or(map.node()),
                "index",
            )?
        } else {
            if let Some(n) = map.get("data_stream") {
                n.error("`data_stream` needs `mode: data_stream`");
                return None;
            }
            match map.get("index") {
                Some(n) => IndexName::parse(n.as_str()?, n, "index")?,
                None => IndexName::parse("petrel-%Y.%m.%d", map.node(), "index")?,
            }
        };
        let id = match map.get("id") {
            None => DocId::Auto,
            Some(n) => match n.as_str()? {
                "auto" => DocId::Auto,
                "none" => DocId::None,
                t if t.contains("{{") => DocId::Template(Template::parse(t, n)?),
                other => {
                    n.error(format!(
                        "`id` must be `auto`, `none` or a template such as `\"{{{{ request_id }}}}\"`, found `{other}`"
                    ));
                    return None;
                }
            },
        };
        let compression = match map.choice("compression", &["none", "gzip"]) {
            Some("gzip") => Compression::Gzip,
            Some(_) => Compression::None,
            None if map.get("compression").is_some() => return None,
            None => Compression::None,
        };
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
        let (max_bytes, max_events, linger) =
            super::http::parse_batch(&map, (5 << 20, 10_000, 1000));
        let dead_letter = super::http::parse_dead_letter(&map, "/var/lib/petrel/es-dead.ndjson")?;
        let retry = super::http::parse_retry(&map, &dead_letter)?;
        let output = Arc::new(super::parse_output(&map, true)?);
        Some(Self {
            output,
            endpoints,
            index,
            mode,
            id,
            dead_letter,
            retry,
            compression,
            auth,
            tls,
            pipeline: map.str("pipeline").map(str::to_string),
            max_bytes,
            max_events,
            linger,
            timeout: Duration::from_millis(map.u64("timeout_ms", false).unwrap_or(60_000)),
            max_in_flight: map
                .u64("max_in_flight_requests", false)
                .unwrap_or(8)
                .clamp(1, 1024) as usize,
        })
    }
}

/// One node: its bulk URL and whether it is being skipped after failures.
struct Endpoint {
    base: reqwest::Url,
    bulk: reqwest::Url,
    /// Failures in a row; the node is skipped for a time growing with it.
    failures: AtomicU32,
    down_until: parking_lot::Mutex<Option<Instant>>,
}

/// What the server said about itself (`GET /`).
#[derive(Debug, Clone)]
struct ServerInfo {
    distribution: String,
    version: String,
}

/// The running elasticsearch sink.
pub struct ElasticsearchSink {
    config: ElasticsearchConfig,
    client: reqwest::Client,
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    server: OnceLock<ServerInfo>,
    metrics: ComponentMetrics,
    duplicates: Counter,
}

fn bulk_url(base: &reqwest::Url, pipeline: Option<&str>) -> reqwest::Url {
    let mut u = base.clone();
    if let Ok(mut segs) = u.path_segments_mut() {
        segs.pop_if_empty().push("_bulk");
    }
    {
        let mut q = u.query_pairs_mut();
        // Only what the per-item decisions need: the answer to 10,000
        // successful items stays a few hundred KB instead of megabytes.
        q.append_pair(
            "filter_path",
            "errors,items.*.status,items.*.error.type,items.*.error.reason",
        );
        if let Some(p) = pipeline {
            q.append_pair("pipeline", p);
        }
    }
    u
}

impl ElasticsearchSink {
    /// Builds the HTTP client (TLS settings, timeouts).
    pub fn new(c: &ElasticsearchConfig, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        let client =
            super::client::build_client(&c.tls, c.timeout, &crate::tls::Owner::of(&metrics))?;
        let endpoints = c
            .endpoints
            .iter()
            .map(|u| Endpoint {
                base: u.clone(),
                bulk: bulk_url(u, c.pipeline.as_deref()),
                failures: AtomicU32::new(0),
                down_until: parking_lot::Mutex::new(None),
            })
            .collect();
        Ok(Self {
            config: c.clone(),
            client,
            endpoints,
            next: AtomicUsize::new(0),
            server: OnceLock::new(),
            duplicates: metrics.duplicates_skipped(),
            metrics,
        })
    }

    /// The next endpoint in turn that is not being skipped; when all are,
    /// the one whose pause ends first.
    fn pick(&self) -> &Endpoint {
        let n = self.endpoints.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut soonest: Option<(&Endpoint, Instant)> = None;
        for i in 0..n {
            let e = &self.endpoints[(start + i) % n];
            match *e.down_until.lock() {
                None => return e,
                Some(t) if t <= now => return e,
                Some(t) => {
                    if soonest.is_none_or(|(_, s)| t < s) {
                        soonest = Some((e, t));
                    }
                }
            }
        }
        soonest.map_or(&self.endpoints[start % n], |(e, _)| e)
    }

    fn endpoint_failed(&self, e: &Endpoint) {
        let f = e.failures.fetch_add(1, Ordering::Relaxed).min(8);
        let pause = Duration::from_millis(250 << f).min(Duration::from_secs(30));
        *e.down_until.lock() = Some(Instant::now() + pause);
    }

    fn endpoint_ok(&self, e: &Endpoint) {
        if e.failures.swap(0, Ordering::Relaxed) > 0 {
            *e.down_until.lock() = None;
        }
    }

    fn with_auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        self.config.auth.apply(rb)
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl Sink for ElasticsearchSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        // Events without a parsed time are stamped with the time they are
        // encoded, for `@timestamp` (data streams require one) and the
        // index date.
        let now = now_ns();
        let mut now_text = Vec::with_capacity(32);
        petrel_time::write_rfc3339(now, &mut now_text);
        let shape = JsonShape {
            time_key: Some("@timestamp"),
            default_time: Some(&now_text),
            default_ns: Some(now),
            skip: &[],
        };
        let plan = self.config.output.plan(&batch.source);
        // A name without fields depends only on the time, to the second:
        // rendered and escaped once per second that occurs in the batch
        // rather than once per event (most events share one).
        let static_index = self.config.index.is_static();
        let mut index_json: Vec<u8> = Vec::new();
        let mut index_second: Option<i64> = None;
        let op: &[u8] = match self.config.mode {
            Mode::Index => b"{\"index\":{\"_index\":",
            Mode::Create | Mode::DataStream => b"{\"create\":{\"_index\":",
        };
        let mut stats = EncodeStats::default();
        let mut index = String::new();
        let mut id = String::new();
        let mut missing = 0u64;
        let bytes = &mut out.bytes;
        for ev in &batch.events {
            let t = ev.time_ns.unwrap_or(now);
            let second = t.div_euclid(1_000_000_000);
            if !static_index || index_second != Some(second) {
                if !self.config.index.render(ev, batch, t, &mut index) {
                    missing += 1;
                }
                index_json.clear();
                write_json_str(&mut index_json, &index);
                index_second = Some(second);
            }
            bytes.extend_from_slice(op);
            bytes.extend_from_slice(&index_json);
            match &self.config.id {
                DocId::Auto => {
                    if let Some((stream, offset)) = batch.event_origin(ev) {
                        bytes.extend_from_slice(b",\"_id\":\"");
                        id_text(origin_id(stream, offset), bytes);
                        bytes.push(b'"');
                    }
                }
                DocId::None => {}
                DocId::Template(t) => {
                    if t.render(ev, batch, &mut id) {
                        bytes.extend_from_slice(b",\"_id\":");
                        write_json_str(bytes, &id);
                    } else {
                        missing += 1;
                    }
                }
            }
            bytes.extend_from_slice(b"}}\n");
            plan.write_json(batch, ev, shape, bytes, &mut stats);
            bytes.push(b'\n');
            out.record_ends.push(bytes.len() as u32);
        }
        if missing > 0 {
            self.metrics.error("template_field_missing", missing);
        }
        out.invalid_utf8 = stats.invalid_utf8;
    }

    fn expansion_hint(&self) -> usize {
        // Measured: 20-byte lines become ~220 bytes (action line with
        // index and id, field names, @timestamp): 11x, and more with
        // metadata fields.
        14_000
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        let c = &self.config;
        // Dead letters name the first node: the one an operator knows.
        let settings = Settings::new(
            Framing::NDJSON,
            self.endpoints[0].base.to_string(),
            c.dead_letter.clone(),
        )
        .limits(c.max_bytes, c.max_events, c.linger, c.max_in_flight)
        .retry(c.retry);
        let metrics = self.metrics.clone();
        driver::run(self, rx, settings, metrics)
    }
}

#[derive(serde::Deserialize)]
struct BulkAnswer {
    #[serde(default)]
    items: Vec<std::collections::HashMap<String, BulkItem>>,
}

#[derive(serde::Deserialize)]
struct BulkItem {
    status: u16,
    #[serde(default)]
    error: Option<BulkError>,
}

#[derive(serde::Deserialize)]
struct BulkError {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    reason: String,
}

impl ElasticsearchSink {
    /// Reads the server's flavour and version once (`GET /`), for the log
    /// and for the checks that depend on it.
    async fn discover(&self, e: &Endpoint) -> Result<(), Answer> {
        if self.server.get().is_some() {
            return Ok(());
        }
        let resp = match self.with_auth(self.client.get(e.base.clone())).send().await {
            Ok(r) => r,
            Err(err) => {
                let f = send_failure(&err, e.base.as_str(), self.config.timeout);
                tracing::warn!(
                    error_type = f.error_type,
                    "elasticsearch sink: cannot reach the server: {}",
                    f.message
                );
                self.endpoint_failed(e);
                return Err(Answer::Retry {
                    after: None,
                    error_type: f.error_type,
                    why: f.message,
                });
            }
        };
        let status = resp.status().as_u16();
        if matches!(status, 401 | 403) {
            return Err(Answer::Hold {
                status,
                text: answer_text(resp).await,
            });
        }
        if !resp.status().is_success() {
            self.endpoint_failed(e);
            return Err(Answer::Retry {
                after: retry_after(&resp),
                error_type: "request_failed",
                why: format!("{} answered {status}", e.base),
            });
        }
        let v: serde_json::Value = match resp.bytes().await {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        let version = v["version"]["number"].as_str().unwrap_or("").to_string();
        let distribution = v["version"]["distribution"]
            .as_str()
            .unwrap_or("elasticsearch")
            .to_string();
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if distribution == "elasticsearch" && major < 7 {
            // Indices there still have mapping types, which the action
            // lines no longer name.
            tracing::error!(version = %version, "elasticsearch sink: Elasticsearch before 7 is not supported; bulk requests may be refused");
        }
        tracing::info!(distribution = %distribution, version = %version, url = %e.base, "elasticsearch sink: connected");
        let _ = self.server.set(ServerInfo {
            distribution,
            version,
        });
        Ok(())
    }

    async fn bulk(&self, body: Bytes, items: usize) -> Answer {
        let e = self.pick();
        if let Err(a) = self.discover(e).await {
            return a;
        }
        let mut rb = self
            .client
            .post(e.bulk.clone())
            .header(CONTENT_TYPE, "application/x-ndjson")
            .body(body);
        if let Some(enc) = self.config.compression.content_encoding() {
            rb = rb.header(CONTENT_ENCODING, enc);
        }
        let resp = match self.with_auth(rb).send().await {
            Ok(r) => r,
            Err(err) => {
                self.endpoint_failed(e);
                return unanswered(&err, e.bulk.as_str(), self.config.timeout);
            }
        };
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            let text = match resp.bytes().await {
                Ok(t) => t,
                Err(err) => {
                    self.endpoint_failed(e);
                    return Answer::Retry {
                        after: None,
                        error_type: "request_failed",
                        why: format!("bulk answer cut short: {err}"),
                    };
                }
            };
            self.endpoint_ok(e);
            // `errors: false` means every item succeeded: the per-item
            // statuses (10,000 objects) need no reading.
            if text.starts_with(b"{\"errors\":false") {
                return Answer::Delivered;
            }
            return match serde_json::from_slice::<BulkAnswer>(&text) {
                Ok(a) if a.items.len() == items => {
                    Answer::Items(a.items.into_iter().map(|m| self.item(m)).collect())
                }
                Ok(a) => Answer::Retry {
                    after: None,
                    error_type: "request_failed",
                    why: format!(
                        "the bulk answer does not match the request ({items} sent, {} answered)",
                        a.items.len()
                    ),
                },
                Err(err) => Answer::Retry {
                    after: None,
                    error_type: "request_failed",
                    why: format!("unreadable bulk answer: {err}"),
                },
            };
        }
        if usually_transient(status) && status != 429 {
            // The node itself is in trouble: try the others first.
            self.endpoint_failed(e);
        }
        if status == 413 {
            self.metrics.error("request_too_large", 1);
            return Answer::Refused {
                status,
                text:
                    "413: one document is larger than the server accepts (http.max_content_length)"
                        .to_string(),
                split: true,
            };
        }
        failed_answer(resp, usually_transient).await
    }

    /// What the answer to one item of a bulk request means.
    fn item(&self, m: std::collections::HashMap<String, BulkItem>) -> Item {
        let Some(item) = m.into_values().next() else {
            return Item::Retry;
        };
        let text = || {
            item.error
                .as_ref()
                .map(|e| format!("{}: {}", e.kind, e.reason))
                .unwrap_or_default()
        };
        match item.status {
            200..=299 => Item::Delivered,
            // Only `create` answers 409, and only for an id that exists:
            // ours, sent before.
            409 if self.config.mode != Mode::Index => Item::Duplicate,
            s if usually_transient(s) => Item::Retry,
            status @ (401 | 403 | 404) => Item::Hold(status, text()),
            status => Item::Refused(status, text()),
        }
    }
}

impl RequestSink for ElasticsearchSink {
    type Plan<'b> = ();

    const WORDING: Wording = Wording {
        sink: "elasticsearch sink",
        peer: "the cluster",
        items: ("document", "documents"),
        hold_fix: "the credentials, the permissions, the index or the URL",
    };

    fn build_request(&self, batch: &Batch, _: &(), items: Selection<'_>) -> anyhow::Result<Bytes> {
        // The request's body is the bulk body of all its records.
        Ok(self
            .config
            .compression
            .apply(batch.framed(items, Framing::NDJSON))?)
    }

    async fn send(&self, body: Bytes, items: usize) -> Answer {
        self.bulk(body, items).await
    }

    fn dead_letter_record<'a>(&self, record: &'a [u8], answer: &'a str) -> DeadRecord<'a> {
        // The record is the action line and the document: the document
        // goes to the file, the action's index in the answer text.
        let (action, doc) = match memchr::memchr(b'\n', record) {
            Some(nl) => (&record[..nl], &record[nl + 1..]),
            None => (&record[..0], record),
        };
        DeadRecord {
            record: doc.into(),
            answer: format!("{answer} (action {})", String::from_utf8_lossy(action)).into(),
        }
    }

    fn duplicates(&self) -> Option<&Counter> {
        Some(&self.duplicates)
    }

    fn server(&self) -> Option<String> {
        self.server
            .get()
            .map(|s| format!("{} {}", s.distribution, s.version))
    }
}

/// Registration of `type: elasticsearch`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "elasticsearch",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| ElasticsearchConfig::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for ElasticsearchConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(
            self.endpoints
                .iter()
                .map(|u| u.host_str().unwrap_or_default().to_string())
                .collect(),
        )
    }
    fn local_writes(&self) -> Vec<std::path::PathBuf> {
        self.dead_letter.iter().cloned().collect()
    }

    fn type_name(&self) -> &'static str {
        "elasticsearch"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(ElasticsearchSink::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};
    use petrel_core::{Event, Origin, SourceInfo, Span, Value};

    fn config(yaml: &str) -> Result<ElasticsearchConfig, String> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, yaml).map_err(|e| e.to_string())?;
        let errs = ConfigErrors::new();
        let node = Node::root(&f, &raw, &errs);
        let map = node.as_map(KEYS).ok_or("not a map")?;
        let c = ElasticsearchConfig::parse(map);
        match (c, errs.is_empty()) {
            (Some(c), true) => Ok(c),
            _ => Err(format!("{:?}", errs.into_vec())),
        }
    }

    fn sink(yaml: &str) -> ElasticsearchSink {
        let c = config(yaml).expect("valid config");
        let m = petrel_core::Metrics::new().component("p", "sink", "es", "elasticsearch");
        ElasticsearchSink::new(&c, m).expect("sink")
    }

    fn batch() -> EventBatch {
        let mut b = EventBatch::new(
            bytes::Bytes::from_static(b"first line\nsecond\n"),
            Arc::new(SourceInfo::file("/var/log/app.log", Arc::new([]))),
        );
        let mut a = Event::from_span(Span::new(0, 10));
        a.time_ns = Some(1_700_000_000_000_000_000); // 2023-11-14T22:13:20Z
        a.set("service".into(), Value::Str("api".into()));
        b.events.push(a);
        b.events.push(Event::from_span(Span::new(11, 6)));
        b
    }

    fn lines(out: &Encoded) -> Vec<serde_json::Value> {
        out.bytes
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("JSON line"))
            .collect()
    }

    #[test]
    fn action_lines_carry_index_and_ids_from_the_origin() {
        let s = sink("endpoints: [\"http://127.0.0.1:9\"]\nindex: \"logs-{{ service }}-%Y.%m.%d\"");
        let mut b = batch();
        let mut out = Encoded::default();
        s.encode(&b, &mut out);
        let l = lines(&out);
        assert_eq!(l.len(), 4);
        assert_eq!(out.record_ends.len(), 2);
        assert_eq!(l[0]["create"]["_index"], "logs-api-2023.11.14");
        assert!(l[0]["create"].get("_id").is_none(), "no origin, no id");
        assert_eq!(l[1]["message"], "first line");
        assert_eq!(l[1]["@timestamp"], "2023-11-14T22:13:20.000000000Z");
        assert_eq!(l[1]["file"], "/var/log/app.log");
        assert!(l[3]["@timestamp"].is_string(), "read time stands in");
        assert!(
            s.metrics
                .metrics()
                .render()
                .contains("error_type=\"template_field_missing\""),
            "the second event has no service"
        );

        b.origin = Some(Origin {
            stream: 42,
            base: 1000,
            starts: None,
            per_record: false,
        });
        let mut out = Encoded::default();
        s.encode(&b, &mut out);
        let first = lines(&out)[0]["create"]["_id"].as_str().map(str::to_string);
        let second = lines(&out)[2]["create"]["_id"].as_str().map(str::to_string);
        let first = first.expect("id");
        assert_eq!(first.len(), 22);
        assert!(first
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_ne!(Some(first.clone()), second);
        // The same line read again in another batch, cut elsewhere.
        let mut again = EventBatch::new(
            bytes::Bytes::from_static(b"xxfirst line\n"),
            Arc::new(SourceInfo::default()),
        );
        again.origin = Some(Origin {
            stream: 42,
            base: 998,
            starts: None,
            per_record: false,
        });
        again.events.push(Event::from_span(Span::new(2, 10)));
        let mut out = Encoded::default();
        s.encode(&again, &mut out);
        assert_eq!(lines(&out)[0]["create"]["_id"], first.as_str());
    }

    #[test]
    fn modes_and_id_choices() {
        let s = sink("endpoints: [\"http://127.0.0.1:9\"]\nmode: data_stream\ndata_stream: { dataset: app }\nid: none");
        let mut b = batch();
        b.origin = Some(Origin {
            stream: 1,
            base: 0,
            starts: None,
            per_record: false,
        });
        let mut out = Encoded::default();
        s.encode(&b, &mut out);
        let l = lines(&out);
        assert_eq!(l[0]["create"]["_index"], "logs-app-default");
        assert!(l[0]["create"].get("_id").is_none());

        let s = sink(
            "endpoints: [\"http://127.0.0.1:9\"]\nmode: index\nindex: plain\nid: \"{{ service }}\"",
        );
        let mut out = Encoded::default();
        s.encode(&b, &mut out);
        let l = lines(&out);
        assert_eq!(l[0]["index"]["_id"], "api");
        assert_eq!(l[0]["index"]["_index"], "plain");
        assert!(
            l[2]["index"].get("_id").is_none(),
            "missing field: server id"
        );
    }

    #[test]
    fn config_errors_are_reported() {
        assert!(config("endpoints: [\"ftp://x\"]").is_err());
        assert!(config("endpoints: [\"http://x\"]\nindex: \"a-%Q\"").is_err());
        assert!(config("endpoints: [\"http://x\"]\nid: fixed").is_err());
        assert!(config("endpoints: [\"http://x\"]\nmode: data_stream\nindex: a").is_err());
        assert!(config("endpoints: [\"http://x\"]\nauth: { strategy: basic, user: u }").is_err());
        assert!(config("endpoints: [\"http://x\"]\ntls: { cert_file: /a }").is_err());
        let c = config("endpoints: [\"http://x\"]").expect("defaults");
        assert_eq!(c.mode, Mode::Create);
        assert!(matches!(c.id, DocId::Auto));
        assert_eq!(c.max_bytes, 5 << 20);
    }

    #[test]
    fn bulk_url_keeps_a_path_prefix() {
        let u = bulk_url(
            &reqwest::Url::parse("http://h:9200/es/").expect("url"),
            Some("p1"),
        );
        assert_eq!(u.path(), "/es/_bulk");
        assert!(u
            .query()
            .is_some_and(|q| q.contains("pipeline=p1") && q.contains("filter_path=")));
    }
}
