//! `type: kafka` — one Kafka message per event, through librdkafka.
//!
//! A batch is acknowledged to its source only when the delivery report of
//! every one of its messages succeeded. Failed messages are sent again with
//! exponential backoff, never dropped; only a message the broker can never
//! take (larger than its size limit) is counted as rejected and logged.
//! An AIMD window bounds the batches in flight per sink, so a broker outage
//! soon leaves one batch being retried while the source waits on disk.
//! Producers are shared by every sink with the same settings, so many
//! pipelines writing to one cluster do not each start librdkafka threads.

mod producer;
pub mod transactional;

use std::sync::Arc;
use std::time::Instant;

use petrel_core::config::Map;
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, Payload, PayloadReceiver, Sink};
use petrel_core::LazyCounter;
use petrel_core::{ComponentMetrics, DeliveryMetrics, EventBatch};

use self::producer::{Routes, SharedProducer};
use super::congestion::{Backoff, Window};
use super::template::Template;
pub use crate::kafka_client::valid_topic;
use crate::kafka_client::{Settings, SettingsBuilder};

/// Keys accepted by the Kafka sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "brokers",
    "topic",
    "fallback_topic",
    "key_field",
    "headers",
    "encoding",
    "compression",
    "acks",
    "batch",
    "tls",
    "sasl",
    "librdkafka",
    "max_in_flight_batches",
    "max_buffered_bytes",
    "exactly_once",
    "transactional_id",
    "metadata",
    "only_fields",
    "except_fields",
    "timestamp_format",
    "timestamp_key",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Produces one Kafka message per event through librdkafka; a batch is acknowledged only when every message's delivery report succeeded, and failed messages are sent again with backoff without limit."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "brokers",
        kind: petrel_core::plugin::KeyKind::List,
        default: None,
        doc: r#"Required: bootstrap brokers, `host:port`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "topic",
        kind: petrel_core::plugin::KeyKind::Template,
        default: None,
        doc: r#"Required: the topic; `{{ field }}` is replaced by the event's field (`file` included)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "fallback_topic",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"petrel-unrouted"#),
        doc: r#"Topic of events whose template field is missing or empty (`topic_field_missing`), whose rendered topic is not a valid Kafka name, or whose topic the broker reports unknown or not writable (both `invalid_topic`; a valid name is 1 to 249 of `[a-zA-Z0-9._-]`): one bad event never stalls the sink."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "key_field",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Field used as message key (librdkafka's key hash picks the partition); without it each batch goes to one partition, the partitions with a leader in turn (librdkafka's partitioner until the topic's metadata is known; refreshed every 60 s and after a failed delivery)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "headers",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"Message headers from the event: `name: template`, e.g. `{trace_id: "{{ trace_id }}", source: "{{ host }}"}`; a header whose template renders empty (a missing field) is left out and counted (`template_field_missing`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "encoding",
        kind: petrel_core::plugin::KeyKind::OneOf(&["text", "ndjson", "map"]),
        default: Some(r#"text"#),
        doc: r#"One message per event: the message bytes, a JSON object with every field, or `{codec: text, template: ...}` a line template (see the file sink's `encoding`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "compression",
        kind: petrel_core::plugin::KeyKind::OneOf(COMPRESSIONS),
        default: Some(r#"none"#),
        doc: r#"librdkafka `compression.type`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "acks",
        kind: petrel_core::plugin::KeyKind::OneOf(ACKS),
        default: Some(r#"all"#),
        doc: r#"With `all`, the idempotent producer is on."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "batch",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{linger_ms: 50}"#),
        doc: r#"`{max_bytes, linger_ms}`: librdkafka `batch.size` (by default a quarter of `max_buffered_bytes`, 64 KiB to 1 MB) and `linger.ms`; a 50 ms linger keeps the idempotent producer from busy-polling."#,
    },
    crate::kafka_client::TLS_DOC,
    crate::kafka_client::SASL_DOC,
    petrel_core::plugin::KeyDoc {
        name: "librdkafka",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{}"#),
        doc: r#"Any librdkafka producer setting. Applied last: they win over `tls`, `sasl` and the settings the sink sizes from `--memory-limit` (`batch.size`, `queue.buffering.max.kbytes`: twice `max_buffered_bytes`), which bound librdkafka's buffers, outside the memory limit. Checked when the configuration is loaded, in the order written, every refusal reported at its key. `sasl.oauthbearer.method: oidc` and its `sasl.oauthbearer.token.endpoint.url`, `client.id`, `client.secret`, `scope` are served by Petrel (librdkafka's own OIDC needs libcurl, not in the build)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_in_flight_batches",
        kind: petrel_core::plugin::KeyKind::Int,
        default: Some(r#"64"#),
        doc: r#"Upper bound of the congestion window, 1 to 4096."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_buffered_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"--memory-limit / 4, 256KiB to 4MiB"#),
        doc: r#"Bytes handed to librdkafka and not yet confirmed, per shared producer (with `exactly_once`, per sink): 4 MiB at the default 16 MiB limit. The bytes themselves are within `--memory-limit` (librdkafka points into them); librdkafka's message headers and the produce requests' copies of them, up to about as much again, are not."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "exactly_once",
        kind: petrel_core::plugin::KeyKind::Bool,
        default: Some(r#"false"#),
        doc: r#"Write in Kafka transactions that also commit the offsets the pipeline's `kafka` source consumed (with its consumer group's metadata, so an instance that lost its partitions is fenced): a `read_committed` consumer of the output sees each input record once, through crashes, broker restarts and rebalances. Needs exactly one `kafka` source in the pipeline, this sink as the pipeline's only sink without `when`, and `acks: all`; `fallback_topic` is not used. A failed transaction is aborted and its records sent again in a new one."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "transactional_id",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"petrel-<host>-<pipeline>-<sink id>"#),
        doc: r#"With `exactly_once`: the producer's `transactional.id`. It must stay the same across restarts of one instance (a restart then aborts the transaction a crash left open at once, instead of after its 60 s timeout) and differ between instances; set it when instances share a host name."#,
    },
    crate::sinks::METADATA_DOC,
    crate::sinks::ONLY_FIELDS_DOC,
    crate::sinks::EXCEPT_FIELDS_DOC,
    crate::sinks::TIMESTAMP_FORMAT_DOC,
    crate::sinks::TIMESTAMP_KEY_DOC,
];

/// Largest default of `max_buffered_bytes`: a few librdkafka batches
/// (`batch.size` 1 MB), enough to keep several partitions busy; see
/// [`SharedProducer::get`] for why it is not larger.
const MAX_DEFAULT_BUFFERED_BYTES: usize = 4 << 20;

/// What the producer buffers, sized from the agent's `--memory-limit`
/// `limit` unless set: `max_buffered_bytes` (the bytes handed to
/// librdkafka and not yet delivered) and librdkafka's own settings, to be
/// applied before the user's.
///
/// librdkafka's buffers are outside the memory budget and larger than the
/// bytes they hold: each message has a header of a few hundred bytes, and
/// a produce request copies the messages it carries. So
/// `max_buffered_bytes` defaults to limit/4 (4 MiB at the default 16 MiB;
/// 256 KiB to 4 MiB), `batch.size` to a quarter of that (at least 64 KiB,
/// at most librdkafka's 1 MB) and librdkafka's queue to twice it
/// (`queue.buffering.max.kbytes`, a bound the sink never reaches). Not
/// less at 16 MiB: a payload's last messages wait for `linger.ms` (50 ms),
/// so the bytes in flight bound the rate, and 2 MiB cut Kafka → Kafka to
/// 0.45x the records/s of 4 MiB (BENCHMARKS.md section 20).
pub fn producer_sizes(
    limit: usize,
    max_buffered_bytes: Option<usize>,
) -> (usize, Vec<(String, String)>) {
    let buffered = max_buffered_bytes
        .unwrap_or_else(|| (limit / 4).clamp(256 << 10, MAX_DEFAULT_BUFFERED_BYTES));
    let batch = (buffered / 4).clamp(64 << 10, 1_000_000);
    let queue_kb = (buffered * 2 / 1024).max(1024);
    (
        buffered,
        vec![
            ("batch.size".into(), batch.to_string()),
            ("queue.buffering.max.kbytes".into(), queue_kb.to_string()),
        ],
    )
}

/// Default of `batch.linger_ms`.
const DEFAULT_LINGER_MS: u64 = 50;

/// The agent's default `--memory-limit`, for a sink built without the
/// agent's settings.
const DEFAULT_MEMORY_LIMIT: usize = 16 << 20;

const COMPRESSIONS: &[&str] = &["none", "gzip", "snappy", "lz4", "zstd"];
const ACKS: &[&str] = &["all", "1", "0"];

/// Configuration of the Kafka sink.
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// Bootstrap brokers.
    pub brokers: Vec<String>,
    /// Topic template, e.g. `app-{{ level }}`.
    pub topic: Template,
    /// Topic for events missing a template field (counted).
    pub fallback_topic: String,
    /// Field whose value is the message key (same key → same partition).
    pub key_field: Option<String>,
    /// Message headers: name and value template, in config order.
    pub headers: Vec<(String, Template)>,
    /// `text` or `ndjson`.
    pub encoding: Encoding,
    /// librdkafka settings, the pass-through ones last.
    pub client: Settings,
    /// Upper bound of the congestion window, in batches.
    pub max_in_flight: usize,
    /// Bytes handed to librdkafka before their delivery reports, at most,
    /// when set (else sized from the memory limit, see [`producer_sizes`]).
    pub max_buffered_bytes: Option<usize>,
    /// Transactions that also commit the `kafka` source's offsets.
    pub exactly_once: bool,
    /// The producer's `transactional.id` (default from host, pipeline and
    /// sink id: stable across restarts, different per instance).
    pub transactional_id: Option<String>,
}

impl KafkaSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let brokers_node = map.required("brokers", "[\"127.0.0.1:9092\"]")?;
        let brokers: Vec<String> = brokers_node
            .as_str_list()
            .into_iter()
            .map(|(s, _)| s.to_string())
            .collect();
        if brokers.is_empty() {
            brokers_node.error("`brokers` needs at least one `host:port`");
            return None;
        }
        let topic_node = map.required("topic", "app-logs")?;
        let topic = Template::parse(topic_node.as_str()?, topic_node)?;
        let fallback_topic = map
            .str("fallback_topic")
            .unwrap_or("petrel-unrouted")
            .to_string();
        for (key, name) in [
            ("topic", topic.as_static()),
            ("fallback_topic", Some(fallback_topic.as_str())),
        ] {
            if let (Some(name), Some(n)) = (name, map.get(key)) {
                if !valid_topic(name) {
                    n.error(format!(
                        "`{name}` is not a valid Kafka topic name: 1 to 249 of letters, digits, `.`, `_` and `-`"
                    ));
                    return None;
                }
            }
        }
        let compression = map.choice("compression", COMPRESSIONS).unwrap_or("none");
        let acks = map.choice("acks", ACKS).unwrap_or("all");
        let mut client = SettingsBuilder::new(vec![
            ("bootstrap.servers".into(), brokers.join(",")),
            ("compression.type".into(), compression.into()),
            ("acks".into(), acks.into()),
            // Exactly-once per partition session and ordering across
            // internal retries; requires acks=all.
            ("enable.idempotence".into(), (acks == "all").to_string()),
            // A message librdkafka could not deliver within this time is
            // reported failed and sent again by the sink's own retry loop,
            // which keeps backing off without limit and shrinks the
            // congestion window; a short timeout makes an outage visible
            // to that loop soon.
            ("message.timeout.ms".into(), "10000".into()),
        ]);
        // Longer than a produce round trip under load, so that librdkafka's
        // idempotent producer does not busy-poll (see
        // `SharedProducer::get`); a full batch (`batch.size`) is sent at
        // once, so the linger only delays the tail of a burst.
        let mut linger = DEFAULT_LINGER_MS;
        if let Some(b) = map.get("batch") {
            if let Some(bm) = b.as_map(&["max_bytes", "linger_ms"]) {
                if let Some(v) = bm.u64("max_bytes", true) {
                    client.push("batch.size", v.to_string());
                }
                if let Some(v) = bm.u64("linger_ms", false) {
                    linger = v;
                }
            }
        }
        client.push("linger.ms", linger.to_string());
        let client = client.finish(&map, &[])?;
        let mut headers = Vec::new();
        if let Some(n) = map.get("headers") {
            match n.as_map_quiet() {
                Some(m) => {
                    for (name, v) in m.entries() {
                        if name.is_empty() {
                            v.error("a header needs a name");
                            return None;
                        }
                        headers.push((name.to_string(), Template::parse(v.as_str()?, v)?));
                    }
                }
                None => {
                    n.error("`headers` maps header names to templates, e.g. `{ trace_id: \"{{ trace_id }}\" }`");
                    return None;
                }
            }
        }
        let exactly_once = map.bool("exactly_once").unwrap_or(false);
        if exactly_once && acks != "all" {
            if let Some(n) = map.get("acks") {
                n.error("`exactly_once: true` needs `acks: all` (transactions are idempotent)");
                return None;
            }
        }
        let transactional_id = map.str("transactional_id").map(str::to_string);
        if transactional_id.is_some() && !exactly_once {
            if let Some(n) = map.get("transactional_id") {
                n.error("`transactional_id` is used only with `exactly_once: true`");
                return None;
            }
        }
        Some(Self {
            exactly_once,
            transactional_id,
            brokers,
            topic,
            fallback_topic,
            key_field: map.str("key_field").map(str::to_string),
            headers,
            encoding: super::parse_encoding(&map)?,
            client,
            max_in_flight: map
                .u64("max_in_flight_batches", false)
                .unwrap_or(64)
                .clamp(1, 4096) as usize,
            max_buffered_bytes: map
                .u64("max_buffered_bytes", true)
                .map(|b| b.clamp(64 << 10, u32::MAX as u64) as usize),
        })
    }
}

/// The running Kafka sink.
pub struct KafkaSink {
    encoding: Encoding,
    topic: Template,
    fallback_topic: String,
    key_field: Option<String>,
    headers: Vec<(String, Template)>,
    /// The shared producer (none with `exactly_once`).
    producer: Option<Arc<SharedProducer>>,
    max_in_flight: usize,
    metrics: ComponentMetrics,
    fallback: LazyCounter,
    invalid_topic: LazyCounter,
    /// Set with `exactly_once: true`.
    transactional: Option<Arc<transactional::Transactional>>,
    /// The client certificate's expiry, reported while the sink runs.
    _certificate: Option<crate::tls::ExpiryGauge>,
}

impl KafkaSink {
    /// Creates (or shares) the producer, its buffers sized from the
    /// agent's memory limit `limit` (see [`producer_sizes`]).
    pub fn new(
        c: &KafkaSinkConfig,
        metrics: ComponentMetrics,
        limit: usize,
    ) -> anyhow::Result<Self> {
        let (buffered, mut client) = producer_sizes(limit, c.max_buffered_bytes);
        client.extend(c.client.iter().cloned());
        let label = |name: &str| {
            metrics
                .labels()
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let transactional = c.exactly_once.then(|| {
            let pipeline = label("pipeline");
            let id = c.transactional_id.clone().unwrap_or_else(|| {
                format!(
                    "petrel-{}-{pipeline}-{}",
                    crate::host::hostname(),
                    label("component_id")
                )
            });
            Arc::new(transactional::Transactional::new(
                &client,
                &id,
                &pipeline,
                buffered,
                metrics.clone(),
            ))
        });
        let certificate = c.client.get("ssl.certificate.location").and_then(|f| {
            crate::tls::report_certificate_file(
                &crate::tls::Owner::of(&metrics),
                std::path::Path::new(f),
            )
        });
        Ok(Self {
            _certificate: certificate,
            transactional,
            encoding: c.encoding.clone(),
            topic: c.topic.clone(),
            fallback_topic: c.fallback_topic.clone(),
            key_field: c.key_field.clone(),
            headers: c.headers.clone(),
            // The transactional side has a producer of its own.
            producer: match c.exactly_once {
                true => None,
                false => Some(SharedProducer::get(
                    &client,
                    buffered,
                    metrics.health_key(),
                )?),
            },
            max_in_flight: c.max_in_flight,
            fallback: metrics.error_counter("topic_field_missing"),
            invalid_topic: metrics.error_counter("invalid_topic"),
            metrics,
        })
    }

    fn routes(&self, batch: &EventBatch) -> Routes {
        let n = batch.events.len();
        let mut r = Routes {
            topic_of: Vec::with_capacity(n),
            topics: Vec::new(),
            keys: Vec::new(),
            key_ranges: Vec::new(),
            headers: Vec::new(),
            header_ranges: Vec::new(),
        };
        let mut header_missing = 0u64;
        let static_topic = self.topic.as_static();
        if let Some(t) = static_topic {
            r.topics.push(t.to_string());
        }
        let mut name = String::new();
        let mut missing = 0;
        let mut invalid = 0;
        for ev in &batch.events {
            let idx = match static_topic {
                Some(_) => 0,
                None => {
                    if !self.topic.render(ev, batch, &mut name) {
                        missing += 1;
                        name.clear();
                        name.push_str(&self.fallback_topic);
                    } else if !valid_topic(&name) {
                        invalid += 1;
                        name.clear();
                        name.push_str(&self.fallback_topic);
                    }
                    match r.topics.iter().position(|t| *t == name) {
                        Some(i) => i,
                        None => {
                            r.topics.push(name.clone());
                            r.topics.len() - 1
                        }
                    }
                }
            };
            r.topic_of.push(idx.min(u16::MAX as usize) as u16);
            if let Some(k) = &self.key_field {
                let range = batch.field_bytes(ev, k).map(|b| {
                    let start = r.keys.len() as u32;
                    r.keys.extend_from_slice(b);
                    (start, r.keys.len() as u32)
                });
                r.key_ranges.push(range);
            }
            if !self.headers.is_empty() {
                let start = r.headers.len() as u32;
                for (h, t) in &self.headers {
                    if t.render(ev, batch, &mut name) && !name.is_empty() {
                        producer::push_header(&mut r.headers, h, name.as_bytes());
                    } else {
                        header_missing += 1;
                    }
                }
                r.header_ranges.push((start, r.headers.len() as u32));
            }
        }
        if header_missing > 0 {
            self.metrics.error("template_field_missing", header_missing);
        }
        if missing > 0 {
            self.fallback.inc_by(missing);
        }
        if invalid > 0 {
            self.invalid_topic.inc_by(invalid);
        }
        r
    }
}

impl Sink for KafkaSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        out.invalid_utf8 = encode_batch(
            &self.encoding,
            batch,
            &mut out.bytes,
            Some(&mut out.record_ends),
        )
        .invalid_utf8;
        let routes = self.routes(batch);
        out.attachment = Some(match self.transactional {
            Some(_) => Box::new(transactional::Attachment {
                routes,
                offset: transactional::SourceOffset::of(batch),
            }),
            None => Box::new(routes),
        });
    }

    fn write_attachment(
        &self,
        attachment: &(dyn std::any::Any + Send + Sync),
        out: &mut Vec<u8>,
    ) -> bool {
        // Only plain routes: a transactional sink takes no disk buffer
        // (the config refuses it), its offsets must stay with the source.
        match attachment.downcast_ref::<Routes>() {
            Some(r) => {
                r.write(out);
                true
            }
            None => false,
        }
    }

    fn read_attachment(&self, bytes: &[u8]) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        Routes::read(bytes).map(|r| Box::new(r) as Box<dyn std::any::Any + Send + Sync>)
    }

    fn run(self: Arc<Self>, mut rx: PayloadReceiver) -> BoxFuture {
        if let Some(t) = self.transactional.clone() {
            return Box::pin(t.run(rx));
        }
        Box::pin(async move {
            let dm = self.metrics.delivery();
            let window = Window::new(4, self.max_in_flight, dm.clone());
            let mut tasks = tokio::task::JoinSet::new();
            while let Some(p) = rx.recv().await {
                window.acquire().await;
                let (sink, window, dm) = (self.clone(), window.clone(), dm.clone());
                tasks.spawn(async move {
                    sink.deliver(p, &window, &dm).await;
                    window.release();
                });
                // Reap finished tasks so the set does not grow.
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        })
    }
}

impl KafkaSink {
    /// Sends every record of `p` until each is delivered (or rejected for
    /// good), then acknowledges the payload.
    async fn deliver(&self, p: Payload, window: &Window, dm: &DeliveryMetrics) {
        let started = Instant::now();
        let Payload {
            data,
            events,
            ack,
            charge,
            ..
        } = p;
        // Shared with librdkafka's in-flight messages, which point into it.
        let data = Arc::new(data);
        let (Some(routes), Some(producer)) = (
            data.attachment
                .as_ref()
                .and_then(|a| a.downcast_ref::<Routes>()),
            self.producer.as_ref(),
        ) else {
            tracing::error!("kafka sink: payload without routing; not acknowledged");
            return;
        };
        let mut pending: Vec<u32> = (0..data.record_ends.len() as u32).collect();
        let mut backoff = Backoff::default();
        let mut rejected = 0u64;
        let failed_counter = self.metrics.error_counter("delivery_failed");
        // Records whose topic turned out not to exist go to the fallback
        // topic: a copy of the routes, made only then.
        let mut rerouted: Option<Routes> = None;
        loop {
            let r = rerouted.as_ref().unwrap_or(routes);
            let mut outcome = producer.produce(&data, r, &pending).await;
            rejected += outcome.rejected;
            if !outcome.unroutable.is_empty() {
                let mut new = r.clone();
                let fb = match new.topics.iter().position(|t| *t == self.fallback_topic) {
                    Some(i) => i,
                    None => {
                        new.topics.push(self.fallback_topic.clone());
                        new.topics.len() - 1
                    }
                } as u16;
                if new.topic_of.len() < data.record_ends.len() {
                    // A static topic: every record was on topic 0.
                    new.topic_of = vec![0; data.record_ends.len()];
                }
                let mut moved = 0u64;
                for &rec in &outcome.unroutable {
                    let t = &mut new.topic_of[rec as usize];
                    if *t == fb {
                        // Already on the fallback topic, which is missing
                        // too: retry with backoff, loudly.
                        outcome.failed.push(rec);
                    } else {
                        *t = fb;
                        moved += 1;
                    }
                }
                if moved > 0 {
                    self.invalid_topic.inc_by(moved);
                    tracing::warn!(records = moved, fallback = %self.fallback_topic,
                        "kafka: topic does not exist or may not be written; sending to the fallback topic");
                }
                let mut retry_now: Vec<u32> = outcome
                    .unroutable
                    .iter()
                    .copied()
                    .filter(|&rec| {
                        new.topic_of[rec as usize] == fb && !outcome.failed.contains(&rec)
                    })
                    .collect();
                rerouted = Some(new);
                if outcome.failed.is_empty() {
                    pending = std::mem::take(&mut retry_now);
                    continue;
                }
                outcome.failed.extend(retry_now);
                outcome.failed.sort_unstable();
                outcome.failed.dedup();
            }
            if outcome.failed.is_empty() {
                break;
            }
            let n = outcome.failed.len() as u64;
            failed_counter.inc_by(n);
            dm.retried_events.inc_by(n);
            window.on_failure();
            let d = backoff.next_delay();
            tracing::warn!(
                records = n,
                error = %outcome.first_error.map(|e| e.to_string()).unwrap_or_default(),
                retry_in_ms = d.as_millis() as u64,
                "kafka: delivery failed; retrying"
            );
            tokio::time::sleep(d).await;
            pending = outcome.failed;
        }
        if rejected > 0 {
            tracing::error!(
                messages = rejected,
                "kafka rejected messages larger than its size limit (message.max.bytes); counted as discarded `message_too_large`"
            );
            self.metrics.discarded("message_too_large", rejected);
        }
        window.on_success();
        dm.latency.observe(started.elapsed().as_secs_f64());
        self.metrics
            .sent_events
            .inc_by(events - rejected.min(events));
        self.metrics.sent_bytes.inc_by(data.bytes.len() as u64);
        ack.ack();
        drop(charge);
    }
}

/// Registration of `type: kafka`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "kafka",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| KafkaSinkConfig::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for KafkaSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(
            self.brokers
                .iter()
                .map(|b| crate::sinks::host_of(b))
                .collect(),
        )
    }

    fn type_name(&self) -> &'static str {
        "kafka"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        Ok(std::sync::Arc::new(KafkaSink::new(
            self,
            metrics,
            DEFAULT_MEMORY_LIMIT,
        )?))
    }

    fn build_with(
        &self,
        metrics: ComponentMetrics,
        engine: &petrel_core::plugin::EngineOptions,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        Ok(std::sync::Arc::new(KafkaSink::new(
            self,
            metrics,
            engine.memory_limit,
        )?))
    }

    fn commits_source_positions(&self) -> Option<&'static str> {
        self.exactly_once.then_some("exactly_once")
    }
}
