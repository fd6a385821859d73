//! `type: kafka` — reads topics as a member of a consumer group (the
//! aggregator role: node agents → Kafka → Petrel → stores).
//!
//! ```yaml
//! sources:
//!   - type: kafka
//!     brokers: ["127.0.0.1:9092"]
//!     topics: ["app-logs", "^audit-.*"]   # names, or regexes starting with ^
//!     group_id: petrel-aggregator
//!     start: earliest                      # earliest | latest, or {replay: earliest | latest}
//!     decoding: text                       # text | json
//!     drain_timeout_ms: 10000
//!     commit_interval_ms: 250
//!     librdkafka: { }                      # any consumer setting
//! ```
//!
//! Each record becomes an event: `message` is its value; `kafka.offset`,
//! `kafka.timestamp` (milliseconds, also the event time), `kafka.key` and
//! `kafka.headers` (an object) are fields, `kafka.topic` and
//! `kafka.partition` are source metadata, written like fields. With
//! `decoding: json` the value's object becomes fields, as `parse_json`
//! would make them; a value that is not a JSON object is counted
//! (`error_type="decode_failed"`) and sent on as text.
//!
//! **Delivery.** A partition's offset is committed only up to the first
//! record not yet acknowledged by every sink it was routed to: answers that
//! arrive out of order wait until the gap closes. Commits are made every
//! `commit_interval_ms` and when partitions are revoked or the agent stops.
//! A crash therefore re-reads at most what was read and not committed: the
//! records in flight (bounded by the memory limit) plus at most
//! `commit_interval_ms` of delivered ones. A batch whose delivery failed
//! makes the partition read again from its watermark.
//!
//! **Rebalances.** Assignment is cooperative-sticky by default. When
//! partitions are revoked, the source stops taking their records, waits up
//! to `drain_timeout_ms` for what is in flight, commits, then releases
//! them; what is still unacknowledged then is left uncommitted for the new
//! owner (read twice, never lost).
//!
//! **Where reading starts** follows Kafka's own meaning, as
//! `auto.offset.reset` does in librdkafka, Vector and the Collector: a
//! partition with a committed offset of the group always resumes there;
//! `start: earliest` (the default; `committed` is the same) or `latest`
//! chooses only where a partition *without* one begins. So a restart, a
//! second instance joining, or a reload never reads again what was
//! committed. A forced replay is its own value, `start: {replay: earliest}`
//! (or `latest`, to skip a backlog): on a partition's first assignment in
//! this process's life the committed offset is ignored, on every start;
//! `validate` warns when a sink's `exactly_once` is combined with it.
//!
//! **Back-pressure.** When the pipeline's memory budget is full, the source
//! waits for the sinks to free some (the record that found no room is
//! held, as librdkafka holds what it prefetched); when that lasts a second
//! (a slow or stopped sink), the assigned partitions are paused rather than
//! buffered, and the consumer keeps polling, so it stays in its group
//! however long the stall lasts.
//!
//! Metrics: `petrel_source_partition_lag_records` and
//! `petrel_source_partition_committed_offset` per topic and partition,
//! `petrel_source_rebalances_total{kind}`, `petrel_source_paused_partitions`.

pub mod link;
pub mod tracker;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use petrel_core::ack::{AckReceiver, BatchAck};
use petrel_core::config::Map;
use petrel_core::plugin::{Emitter, Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{
    ComponentMetrics, Event, EventBatch, Key, Origin, PipelineBudget, SourceInfo, Span, Value,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::bindings as rd;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata, RebalanceProtocol,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;

use self::link::{ConsumerLink, GroupMember};
use self::tracker::{Tp, Tracker, TrackerAcks};
use crate::kafka_client::{valid_topic, Settings, SettingsBuilder};
use crate::processors::parse_json::JsonParser;

/// Keys accepted by the kafka source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "brokers",
    "topics",
    "group_id",
    "start",
    "decoding",
    "drain_timeout_ms",
    "commit_interval_ms",
    "tls",
    "sasl",
    "librdkafka",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Reads Kafka topics as a member of a consumer group (the aggregator role); instances with the same `group_id` share the partitions. Each record becomes an event: `message` is its value; `kafka.offset`, `kafka.timestamp` (ms, also the event time), `kafka.key` and `kafka.headers` are fields; `kafka.topic` and `kafka.partition` are source metadata. A partition's offset is committed only up to the first record not yet acknowledged by every sink it was routed to; a crash re-reads at most the records in flight plus `commit_interval_ms` of delivered ones. When the memory limit stays reached for a second the partitions are paused, and the consumer stays in its group."#;

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
        name: "topics",
        kind: petrel_core::plugin::KeyKind::List,
        default: None,
        doc: r#"Required: topic names, or regexes starting with `^` (`^audit-.*`); topics created later that match a regex are picked up within 10 s."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "group_id",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: the consumer group. Its committed offsets are where reading resumes; another pipeline reading the same topics independently uses another group."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "start",
        kind: petrel_core::plugin::KeyKind::OneOf(STARTS),
        default: Some(r#"earliest"#),
        doc: r#"Where a partition *without* a committed offset of the group begins, as Kafka's `auto.offset.reset`: `earliest` (its first record; `committed` means the same) or `latest` (its end). A partition with a committed offset always resumes there, so restarts and new instances read nothing twice. `{replay: earliest | latest}` forces a replay: on a partition's first assignment in this process's life, on every start, the committed offset is ignored (`validate` warns when a sink has `exactly_once`); later reassignments resume from the commits."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "decoding",
        kind: petrel_core::plugin::KeyKind::OneOf(DECODINGS),
        default: Some(r#"text"#),
        doc: r#"`json`: the value's JSON object becomes fields, as `parse_json` makes them; a value that is not a JSON object is counted (`error_type="decode_failed"`) and sent on as text."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "drain_timeout_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"10000"#),
        doc: r#"When partitions are revoked in a rebalance: how long to wait for their records in flight to be delivered before committing and releasing them; what is still undelivered is read again by the new owner."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "commit_interval_ms",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"250"#),
        doc: r#"How often delivered offsets are committed (besides at revocation and shutdown); at least 10. A member that crashes makes the group read again at most the records in flight plus this interval's delivered records (an asynchronous commit each time: four a second cost nothing measurable)."#,
    },
    crate::kafka_client::TLS_DOC,
    crate::kafka_client::SASL_DOC,
    petrel_core::plugin::KeyDoc {
        name: "librdkafka",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"librdkafka consumer settings (`session.timeout.ms`, `partition.assignment.strategy`...). Applied last: they win over `tls`, `sasl` and the source's own. Checked when the configuration is loaded, in the order written, every refusal reported at its key. `enable.auto.commit` is refused. `sasl.oauthbearer.method: oidc` and its `sasl.oauthbearer.token.endpoint.url`, `client.id`, `client.secret`, `scope` are served by Petrel (librdkafka's own OIDC needs libcurl, not in the build). Set by the source unless given here: `isolation.level: read_committed`, `partition.assignment.strategy: cooperative-sticky`, and, sized from the pipeline's share of `--memory-limit` (L) so that what librdkafka prefetches outside the limit stays bounded (about L/8 of records): `queued.max.messages.kbytes` L/16 (1 MiB at the default 16 MiB; 256 KiB to 64 MiB), `fetch.max.bytes` L/16 (at least 1 MiB), `max.partition.fetch.bytes` L/64 (64 KiB to 1 MiB), `fetch.queue.backoff.ms: 2`."#,
    },
];

/// Registration of `type: kafka` (source).
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "kafka",
    doc: DOC,
    key_docs: KEY_DOCS,
    keys: KEYS,
    parse: |m| KafkaSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

const STARTS: &[&str] = &["committed", "earliest", "latest"];
const DECODINGS: &[&str] = &["text", "json"];

/// Where partitions begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The group's committed offset, else the earliest record.
    Earliest,
    /// The group's committed offset, else the end of the partition.
    Latest,
    /// Ignore the committed offset on a partition's first assignment in
    /// this process: its earliest record (`true`) or its end (`false`).
    Replay {
        /// From the earliest record rather than the end.
        earliest: bool,
        /// Where the config says so (line, column), for the warning.
        at: (usize, usize),
    },
}

impl Start {
    /// Reads `start:`: a word, or `{replay: earliest | latest}`.
    fn parse(map: &Map<'_>) -> Option<Start> {
        let Some(n) = map.get("start") else {
            return Some(Start::Earliest);
        };
        if n.as_map_quiet().is_some() {
            let m = n.as_map(&["replay"])?;
            let r = m.required("replay", "earliest")?;
            let earliest = r.as_choice(&["earliest", "latest"])? == "earliest";
            return Some(Start::Replay {
                earliest,
                at: n.position(),
            });
        }
        Some(match n.as_choice(STARTS)? {
            "latest" => Start::Latest,
            _ => Start::Earliest,
        })
    }

    /// Whether a partition without a committed offset (or a replayed one)
    /// begins at its end.
    fn begins_at_end(self) -> bool {
        matches!(
            self,
            Start::Latest
                | Start::Replay {
                    earliest: false,
                    ..
                }
        )
    }
}

/// Configuration of the kafka source.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    topics: Vec<String>,
    start: Start,
    json: bool,
    drain_timeout: Duration,
    commit_interval: Duration,
    /// librdkafka settings, the user's last.
    client: Settings,
}

impl KafkaSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let brokers_node = map.required("brokers", "[\"127.0.0.1:9092\"]")?;
        let brokers: Vec<&str> = brokers_node
            .as_str_list()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        if brokers.is_empty() {
            brokers_node.error("`brokers` needs at least one `host:port`");
            return None;
        }
        let topics_node = map.required("topics", "[\"app-logs\", \"^audit-.*\"]")?;
        let mut topics = Vec::new();
        for (t, n) in topics_node.as_str_list() {
            if let Some(re) = t.strip_prefix('^') {
                if let Err(e) = regex::Regex::new(re) {
                    n.error(format!(
                        "`{t}` starts with `^`, so it is a regex, and it does not compile: {}",
                        crate::processors::common::regex_error(&e)
                    ));
                    return None;
                }
            } else if !valid_topic(t) {
                n.error(format!(
                    "`{t}` is not a valid Kafka topic name (1 to 249 of letters, digits, `.`, `_` and `-`); start it with `^` for a regex"
                ));
                return None;
            }
            topics.push(t.to_string());
        }
        if topics.is_empty() {
            topics_node.error("`topics` needs at least one topic name or `^regex`");
            return None;
        }
        let group_node = map.required("group_id", "petrel-aggregator")?;
        let group = group_node.as_str()?;
        if group.is_empty() {
            group_node.error(
                "`group_id` must not be empty: instances with the same group share the partitions",
            );
            return None;
        }
        let start = Start::parse(&map)?;
        let json = map.choice("decoding", DECODINGS) == Some("json");
        let drain_timeout =
            Duration::from_millis(map.u64("drain_timeout_ms", false).unwrap_or(10_000));
        let commit_interval =
            Duration::from_millis(map.u64("commit_interval_ms", false).unwrap_or(250).max(10));
        let client = SettingsBuilder::new(vec![
            ("bootstrap.servers".into(), brokers.join(",")),
            ("group.id".into(), group.into()),
            // Offsets are committed by the source after delivery, never by
            // librdkafka on its own.
            ("enable.auto.commit".into(), "false".into()),
            ("enable.auto.offset.store".into(), "false".into()),
            (
                "auto.offset.reset".into(),
                if start.begins_at_end() {
                    "latest"
                } else {
                    "earliest"
                }
                .into(),
            ),
            (
                "partition.assignment.strategy".into(),
                "cooperative-sticky".into(),
            ),
            // The prefetch queue, the fetch sizes and the fetch backoff
            // (librdkafka's 1 s capped the source at 46,000 records/s) come
            // from the memory limit, at start: see `fetch_sizes`.
            // Transactions of upstream producers: only committed records.
            ("isolation.level".into(), "read_committed".into()),
            // Lag metrics come from librdkafka's statistics.
            ("statistics.interval.ms".into(), "5000".into()),
            // New topics matching a `^regex` are found this soon.
            ("topic.metadata.refresh.interval.ms".into(), "10000".into()),
        ]);
        let client = client.finish(
            &map,
            &[(
                "enable.auto.commit",
                "the source commits offsets itself, after delivery",
            )],
        )?;
        Some(Self {
            topics,
            start,
            json,
            drain_timeout,
            commit_interval,
            client,
        })
    }
}

/// librdkafka's prefetch sized from the pipeline's memory `limit`.
///
/// What librdkafka fetched sits outside the memory budget, and it is more
/// than the bytes: each record is an op of a few hundred bytes beside its
/// payload, and a record keeps the whole fetch response it came in alive
/// until it is consumed. With a 4 MiB queue and librdkafka's fetch sizes
/// (50 MiB per fetch, 1 MiB per partition) an aggregator reading into a
/// file peaked at 58-70 MB under the 16 MiB default limit; with the sizes
/// below, at 41-49 MB (bench/aggregator.py, BENCHMARKS.md section 20).
/// With `limit` L:
/// - `queued.max.messages.kbytes`: L/16 (1 MiB at 16 MiB; 256 KiB to 64
///   MiB), the queue librdkafka refills up to;
/// - `fetch.max.bytes`: L/16, at least 1 MiB (librdkafka raises it to
///   `message.max.bytes` anyway): one fetch response;
/// - `max.partition.fetch.bytes` (`fetch.message.max.bytes`): L/64, 64
///   KiB to 1 MiB (librdkafka's default); a larger record is still
///   fetched, librdkafka grows the request;
/// - `fetch.queue.backoff.ms`: 2, how long librdkafka waits to fetch again
///   when that queue is full; a queue this small drains in a few
///   milliseconds at a million records a second.
///
/// In all, about L/8 of payloads, with their ops, outside the budget.
pub fn fetch_sizes(limit: usize) -> Vec<(String, String)> {
    let queue_kb = (limit / 16 / 1024).clamp(256, 64 << 10);
    let fetch = (limit / 16).clamp(1 << 20, 50 << 20);
    let partition = (limit / 64).clamp(64 << 10, 1 << 20);
    vec![
        ("queued.max.messages.kbytes".into(), queue_kb.to_string()),
        ("fetch.max.bytes".into(), fetch.to_string()),
        ("max.partition.fetch.bytes".into(), partition.to_string()),
        ("fetch.queue.backoff.ms".into(), "2".into()),
    ]
}

/// The consumer's settings, with librdkafka's own log at warnings and above.
fn client_config(pairs: &[(String, String)]) -> ClientConfig {
    let mut c = crate::kafka_client::client_config(pairs);
    c.set_log_level(RDKafkaLogLevel::Warning);
    c
}

impl petrel_core::plugin::SourceConfig for KafkaSourceConfig {
    fn type_name(&self) -> &'static str {
        "kafka"
    }

    fn replays_on_start(&self) -> Option<(usize, usize)> {
        match self.start {
            Start::Replay { at, .. } => Some(at),
            _ => None,
        }
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let tracker = Arc::new(Tracker::default());
        let shared = Arc::new(Shared {
            tracker: tracker.clone(),
            paused: AtomicBool::new(false),
            start: self.start,
            first_assignments: Mutex::new(HashSet::new()),
            drain_timeout: self.drain_timeout,
            gauges: Mutex::new(HashMap::new()),
            committed: Mutex::new(HashMap::new()),
            link: Mutex::new(None),
            fetch_queue: AtomicPtr::new(std::ptr::null_mut()),
            revoked_since: Mutex::new(Vec::new()),
            paused_gauge: ctx.metrics.paused_partitions(),
            assigned: ctx.metrics.rebalances("assign"),
            revoked: ctx.metrics.rebalances("revoke"),
            lost: ctx.metrics.rebalances("lost"),
            errors: ctx.metrics.error_counter("consumer"),
            metrics: ctx.metrics.clone(),
            key: ctx.key.clone(),
            oidc: crate::kafka_client::Oidc::from_settings(&self.client),
            logged: Mutex::new(HashMap::new()),
        });
        // Sized from the limit first, so that the user's settings win.
        let mut pairs = fetch_sizes(ctx.budget.limit());
        pairs.extend(self.client.iter().cloned());
        let consumer: BaseConsumer<Ctx> = client_config(&pairs)
            .create_with_context(Ctx(shared.clone()))
            .map_err(|e| anyhow::anyhow!("cannot create the Kafka consumer: {e}"))?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| anyhow::anyhow!("cannot subscribe to {topics:?}: {e}"))?;
        let fetch = FetchQueue::new(&consumer)?;
        shared
            .fetch_queue
            .store(fetch.0.as_ptr(), Ordering::Release);
        let consumer = Arc::new(consumer);
        let link = Arc::new(ConsumerLink {
            member: Arc::new(Member(consumer.clone(), tracker.clone())),
            transactional: AtomicBool::new(false),
        });
        link::register(&ctx.pipeline, &link);
        *shared.link.lock() = Some(link.clone());
        let stop = Arc::new(StopFlag::default());
        let mut reader = Reader {
            held: VecDeque::new(),
            fetched: Vec::with_capacity(BURST),
            fetch,
            consumer,
            shared: shared.clone(),
            acks: Arc::new(TrackerAcks(tracker.clone())),
            emitter: ctx.emitter.clone(),
            budget: ctx.budget.clone(),
            metrics: ctx.metrics.clone(),
            meta: ctx.meta.clone(),
            infos: HashMap::new(),
            builders: HashMap::default(),
            carry: None,
            current: None,
            json: self.json.then(|| JsonParser::new(None)),
            decode_failed: ctx.metrics.error_counter("decode_failed"),
            emitted: 0,
            commit_interval: self.commit_interval,
            stop: stop.clone(),
            link,
        };
        let certificate = self.client.get("ssl.certificate.location").and_then(|f| {
            crate::tls::report_certificate_file(
                &crate::tls::Owner::of(&ctx.metrics),
                std::path::Path::new(f),
            )
        });
        let thread = std::thread::Builder::new()
            .name(format!("petrel-kafka-{}", ctx.id))
            .spawn(move || {
                // The certificate's expiry is reported while the source runs.
                let _certificate = certificate;
                reader.run()
            })?;
        tracing::info!(source = %ctx.key, topics = ?self.topics, "consuming Kafka");
        Ok(Box::new(RunningKafka {
            stop,
            thread: Some(thread),
        }))
    }
}

/// Asked to stop, and by when everything must be committed.
#[derive(Default)]
struct StopFlag {
    asked: AtomicBool,
    deadline: Mutex<Option<Instant>>,
}

struct RunningKafka {
    stop: Arc<StopFlag>,
    thread: Option<JoinHandle<()>>,
}

impl Source for RunningKafka {
    fn begin_stop(&mut self, deadline: Instant) {
        *self.stop.deadline.lock() = Some(deadline);
        self.stop.asked.store(true, Ordering::Release);
    }

    fn wait_stopped(mut self: Box<Self>, deadline: Instant) -> anyhow::Result<()> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        // The thread ends by its own deadline; a bounded join keeps a stuck
        // librdkafka call from holding the agent.
        while !t.is_finished() {
            if Instant::now() >= deadline + Duration::from_secs(2) {
                anyhow::bail!(
                    "the kafka source did not stop in time; uncommitted records will be read again"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = t.join();
        Ok(())
    }

    fn is_alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
            || self.stop.asked.load(Ordering::Acquire)
    }
}

/// State the consumer thread shares with librdkafka's callbacks (which
/// run on the same thread, inside `poll`).
struct Shared {
    tracker: Arc<Tracker>,
    paused: AtomicBool,
    start: Start,
    /// Partitions assigned before in this process (for `start`).
    first_assignments: Mutex<HashSet<Tp>>,
    drain_timeout: Duration,
    /// Lag and committed-offset gauges per assigned partition.
    gauges: Mutex<HashMap<Tp, (Gauge, Gauge)>>,
    /// Offsets committed so far, to commit only what moved.
    committed: Mutex<HashMap<Tp, i64>>,
    link: Mutex<Option<Arc<ConsumerLink>>>,
    /// The queue the reader takes records from in batches (see
    /// [`FetchQueue`]); null until the reader made it and after it is gone.
    fetch_queue: AtomicPtr<rd::rd_kafka_queue_t>,
    /// Partitions revoked since the reader last looked: records of theirs
    /// it holds (fetched, not yet in a batch) must go, or a partition
    /// assigned again would get them before the records from its
    /// committed offset, out of order.
    revoked_since: Mutex<Vec<Tp>>,
    paused_gauge: Gauge,
    assigned: Counter,
    revoked: Counter,
    lost: Counter,
    errors: LazyCounter,
    metrics: ComponentMetrics,
    key: String,
    /// OAUTHBEARER tokens from OIDC client credentials, when configured.
    oidc: Option<crate::kafka_client::Oidc>,
    /// When each explained refusal (credentials, certificates) was last
    /// logged: once every 30 s while it lasts.
    logged: Mutex<HashMap<&'static str, Instant>>,
}

impl Shared {
    fn transactional(&self) -> bool {
        self.link
            .lock()
            .as_ref()
            .is_some_and(|l| l.is_transactional())
    }

    /// Commits the watermarks of `only` (or of every partition) that moved
    /// since the last commit. Synchronous commits are for revocations and
    /// shutdown, where the next owner must see them.
    fn commit(&self, c: &BaseConsumer<Ctx>, only: Option<&[Tp]>, mode: CommitMode) {
        if self.transactional() {
            return;
        }
        let marks = self.tracker.watermarks();
        let mut tpl = TopicPartitionList::new();
        let mut moved = Vec::new();
        {
            let done = self.committed.lock();
            for (tp, w) in marks {
                if only.is_some_and(|o| !o.contains(&tp)) {
                    continue;
                }
                if done.get(&tp) == Some(&w) {
                    continue;
                }
                if tpl
                    .add_partition_offset(&tp.0, tp.1, Offset::Offset(w))
                    .is_ok()
                {
                    moved.push((tp, w));
                }
            }
        }
        if moved.is_empty() {
            return;
        }
        match c.commit(&tpl, mode) {
            Ok(()) => {
                let gauges = self.gauges.lock();
                let mut done = self.committed.lock();
                for (tp, w) in moved {
                    if let Some((_, g)) = gauges.get(&tp) {
                        g.set(w);
                    }
                    done.insert(tp, w);
                }
            }
            Err(e) => {
                self.errors.inc();
                tracing::warn!(source = %self.key, error = %e, "kafka: offset commit failed; retrying at the next commit");
            }
        }
    }

    fn on_assign(&self, c: &BaseConsumer<Ctx>, tpl: &mut TopicPartitionList) {
        let mut firsts = self.first_assignments.lock();
        let mut reset = Vec::new();
        for e in tpl.elements() {
            let tp: Tp = (e.topic().into(), e.partition());
            self.tracker.assign(tp.clone());
            self.gauges.lock().insert(
                tp.clone(),
                self.metrics.partition_gauges(e.topic(), e.partition()),
            );
            self.committed.lock().remove(&tp);
            if firsts.insert(tp.clone()) && matches!(self.start, Start::Replay { .. }) {
                reset.push(tp);
            }
        }
        drop(firsts);
        let to = if self.start.begins_at_end() {
            Offset::End
        } else {
            Offset::Beginning
        };
        for (t, p) in &reset {
            let _ = tpl.set_partition_offset(t, *p, to);
        }
        self.forward_to_fetch_queue(c, tpl);
        self.assigned.inc_by(tpl.count() as u64);
        let r = match c.rebalance_protocol() {
            RebalanceProtocol::Cooperative => c.incremental_assign(tpl),
            _ => c.assign(tpl),
        };
        if let Err(e) = r {
            self.errors.inc();
            tracing::error!(source = %self.key, error = %e, "kafka: assigning partitions failed");
        }
        if self.paused.load(Ordering::Acquire) {
            let _ = c.pause(tpl);
        }
        tracing::info!(source = %self.key, partitions = %names(tpl), "kafka: partitions assigned");
    }

    /// Sends the records of the partitions of `tpl` to the reader's fetch
    /// queue. Done before they are assigned: librdkafka then leaves the
    /// forwarding in place when it starts fetching (else it forwards to the
    /// consumer's queue), and when it stops fetching a revoked partition it
    /// clears it, so each assignment forwards again.
    fn forward_to_fetch_queue(&self, c: &BaseConsumer<Ctx>, tpl: &TopicPartitionList) {
        let fq = self.fetch_queue.load(Ordering::Acquire);
        if fq.is_null() {
            return;
        }
        for e in tpl.elements() {
            let Ok(topic) = std::ffi::CString::new(e.topic()) else {
                continue;
            };
            // SAFETY: the client is alive (we are inside its poll); `fq`
            // is the reader's queue, destroyed only after the reader set
            // `fetch_queue` back to null, on this same thread. The
            // partition queue handle is released at once; the forwarding
            // is kept by librdkafka's partition.
            unsafe {
                let pq = rd::rd_kafka_queue_get_partition(
                    c.client().native_ptr(),
                    topic.as_ptr(),
                    e.partition(),
                );
                if !pq.is_null() {
                    rd::rd_kafka_queue_forward(pq, fq);
                    rd::rd_kafka_queue_destroy(pq);
                }
            }
        }
    }

    fn on_revoke(&self, c: &BaseConsumer<Ctx>, tpl: &TopicPartitionList) {
        let tps: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().into(), e.partition()))
            .collect();
        let lost = c.assignment_lost();
        if lost {
            // The group moved on without us: a commit would be refused and
            // the new owner reads from the last commit anyway.
            self.lost.inc_by(tps.len() as u64);
            tracing::warn!(source = %self.key, partitions = %names(tpl), "kafka: partitions lost; their uncommitted records will be read by the new owner");
        } else {
            self.revoked.inc_by(tps.len() as u64);
            let deadline = Instant::now() + self.drain_timeout;
            if !self.tracker.wait_drained(&tps, deadline) {
                tracing::warn!(source = %self.key, partitions = %names(tpl),
                    "kafka: records of revoked partitions still undelivered after drain_timeout_ms; the new owner reads them again");
            }
            self.commit(c, Some(&tps), CommitMode::Sync);
        }
        self.revoked_since.lock().extend(tps.iter().cloned());
        for tp in &tps {
            self.tracker.revoke(tp);
            self.committed.lock().remove(tp);
            self.gauges.lock().remove(tp);
            self.metrics.forget_partition(&tp.0, tp.1);
        }
        let r = match c.rebalance_protocol() {
            RebalanceProtocol::Cooperative => c.incremental_unassign(tpl),
            _ => c.unassign(),
        };
        if let Err(e) = r {
            tracing::warn!(source = %self.key, error = %e, "kafka: releasing partitions failed");
        }
        tracing::info!(source = %self.key, partitions = %names(tpl), "kafka: partitions released");
    }
}

fn names(tpl: &TopicPartitionList) -> String {
    let v: Vec<String> = tpl
        .elements()
        .iter()
        .map(|e| format!("{}/{}", e.topic(), e.partition()))
        .collect();
    v.join(",")
}

/// librdkafka's callbacks.
struct Ctx(Arc<Shared>);

impl ClientContext for Ctx {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if let Some(cause) = crate::kafka_client::explain_log(fac, log_message) {
            tracing::error!(source = %self.0.key, facility = fac,
                "kafka source {}: {cause}: {log_message}", self.0.key);
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(source = %self.0.key, facility = fac, "librdkafka: {log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(source = %self.0.key, facility = fac, "librdkafka: {log_message}")
            }
            _ => tracing::debug!(source = %self.0.key, facility = fac, "librdkafka: {log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.errors.inc();
        let Some(cause) = crate::kafka_client::explain(&error, reason) else {
            tracing::warn!(source = %self.0.key, error = %error, "kafka consumer: {reason}");
            return;
        };
        let now = Instant::now();
        let mut logged = self.0.logged.lock();
        if logged
            .get(cause)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(30))
        {
            return;
        }
        logged.insert(cause, now);
        tracing::error!(source = %self.0.key, error = %error, reason,
            "kafka source {}: cannot connect: {cause}; nothing is read until it can (repeats are logged every 30 s)", self.0.key);
    }

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        let Some(oidc) = &self.0.oidc else {
            return Err("no OAUTHBEARER token source (sasl.oauthbearer.method: oidc)".into());
        };
        oidc.token().map_err(|e| {
            tracing::error!(source = %self.0.key, "kafka source {}: cannot get an OAUTHBEARER token: {e}", self.0.key);
            e.into()
        })
    }

    fn stats(&self, statistics: Statistics) {
        let gauges = self.0.gauges.lock();
        for (topic, t) in &statistics.topics {
            for (p, s) in &t.partitions {
                if let Some((lag, _)) = gauges.get(&(Arc::from(topic.as_str()), *p)) {
                    if s.consumer_lag >= 0 {
                        lag.set(s.consumer_lag);
                    }
                }
            }
        }
    }
}

impl ConsumerContext for Ctx {
    fn rebalance(
        &self,
        base_consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.0.on_assign(base_consumer, tpl)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.0.on_revoke(base_consumer, tpl)
            }
            other => {
                self.0.errors.inc();
                tracing::error!(source = %self.0.key, error = ?other, "kafka: rebalance error");
                let _ = base_consumer.unassign();
            }
        }
    }
}

struct Member(Arc<BaseConsumer<Ctx>>, Arc<Tracker>);

impl GroupMember for Member {
    fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        self.0.group_metadata()
    }

    fn owns(&self, topic: &str, partition: i32) -> bool {
        self.1.is_assigned(&(Arc::from(topic), partition))
    }
}

/// Hashes a partition's key by its number alone: the builders are looked
/// up twice per record, and SipHash over the topic name was 4 % of the
/// source thread (perf, bench/aggregator.py). Keys of one partition number
/// in several topics share a hash; `Eq` still tells them apart.
type ByPartition = std::hash::BuildHasherDefault<PartitionHasher>;

/// See [`ByPartition`].
#[derive(Default)]
struct PartitionHasher(u64);

impl std::hash::Hasher for PartitionHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// The topic's bytes (and `str`'s terminator): left to `Eq`.
    fn write(&mut self, _bytes: &[u8]) {}

    fn write_i32(&mut self, partition: i32) {
        // Spread over the high bits too (hashbrown takes both ends).
        self.0 = (partition as u32 as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Records of one partition collected into one batch.
struct Builder {
    buf: Vec<u8>,
    events: Vec<Event>,
    /// Per record: buffer position, offset minus `first`.
    starts: Vec<(u32, u32, u8)>,
    first: i64,
    last: i64,
    opened: Instant,
}

/// Largest batch taken from one partition.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Batches of at most [`WARM_UP_BYTES`] a source emits first.
const WARM_UP_BATCHES: u64 = 8;
/// The size of the first batches, while the pipeline learns how much
/// memory a byte read needs.
const WARM_UP_BYTES: usize = 32 << 10;
/// Records taken from librdkafka's queue between two rounds of checks.
const BURST: usize = 256;

/// The memory budget had no room for a record's batch.
struct NoRoom;

/// How long the memory budget may stay full before the partitions are
/// paused; shorter waits are the sinks catching up.
const PAUSE_AFTER: Duration = Duration::from_secs(1);
/// A partition's records wait at most this long for more to join them.
const LINGER: Duration = Duration::from_millis(50);

struct Reader {
    // Declared before `consumer`: the records and the queue go before the
    // client (fields drop in order).
    /// Records taken from the fetch queue and not yet added to a batch
    /// (they are at the next round's start, or stay while the budget has
    /// no room), in order.
    held: VecDeque<RawMessage>,
    /// The array `rd_kafka_consume_batch_queue` fills.
    fetched: Vec<*mut rd::rd_kafka_message_t>,
    fetch: FetchQueue,
    consumer: Arc<BaseConsumer<Ctx>>,
    shared: Arc<Shared>,
    acks: Arc<dyn AckReceiver>,
    emitter: Arc<dyn Emitter>,
    budget: Arc<PipelineBudget>,
    metrics: ComponentMetrics,
    meta: Arc<[(Key, Arc<str>)]>,
    infos: HashMap<Tp, Arc<SourceInfo>>,
    builders: HashMap<Tp, Builder, ByPartition>,
    /// A record read from the consumer's queue while the budget had no
    /// room for its batch.
    carry: Option<OwnedMessage>,
    /// The partition of the last record taken, known assigned at this
    /// [`Tracker::assignment_epoch`], with its librdkafka topic handle.
    current: Option<(Tp, u64, *const rd::rd_kafka_topic_t)>,
    json: Option<JsonParser>,
    decode_failed: LazyCounter,
    /// Batches emitted so far (for the warm-up size).
    emitted: u64,
    commit_interval: Duration,
    stop: Arc<StopFlag>,
    /// Kept so the link lives as long as the source.
    #[allow(dead_code)]
    link: Arc<ConsumerLink>,
}

// SAFETY: the raw pointers are librdkafka messages and topic handles owned
// by this reader (messages) or only compared (topic handles); librdkafka
// objects may be used from any thread.
unsafe impl Send for Reader {}

impl Drop for Reader {
    fn drop(&mut self) {
        // No more forwarding to the queue once it is destroyed (with the
        // fields, right after this).
        self.shared
            .fetch_queue
            .store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// The queue every assigned partition's records are forwarded to (see
/// [`Shared::forward_to_fetch_queue`]), read with
/// `rd_kafka_consume_batch_queue`: up to [`BURST`] records per call,
/// without the event and the reference-counted wrapper per record of
/// rust-rdkafka's `poll` (three allocations per record with librdkafka's
/// own). The consumer's queue keeps what is not a record (rebalances,
/// commit results, statistics, errors), served by `poll` each round: a
/// batch call on it would serve a rebalance by itself (librdkafka's
/// forced unassign), bypassing the source's drain and commit.
struct FetchQueue(std::ptr::NonNull<rd::rd_kafka_queue_t>);

impl FetchQueue {
    fn new(c: &BaseConsumer<Ctx>) -> anyhow::Result<Self> {
        // SAFETY: a valid client; the queue is destroyed before it.
        let q = unsafe { rd::rd_kafka_queue_new(c.client().native_ptr()) };
        std::ptr::NonNull::new(q)
            .map(FetchQueue)
            .ok_or_else(|| anyhow::anyhow!("cannot create the Kafka fetch queue"))
    }
}

impl Drop for FetchQueue {
    fn drop(&mut self) {
        // SAFETY: made by rd_kafka_queue_new, destroyed once, before the
        // client (see `Reader`).
        unsafe { rd::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}

/// A record returned by `rd_kafka_consume_batch_queue`, owned: destroyed
/// when dropped.
struct RawMessage(std::ptr::NonNull<rd::rd_kafka_message_t>);

impl RawMessage {
    fn get(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: valid until destroyed in `drop`.
        unsafe { self.0.as_ref() }
    }

    fn topic(&self) -> &str {
        // SAFETY: a fetched message's topic handle is valid while the
        // message is; its name is a NUL-terminated string.
        unsafe {
            let name = rd::rd_kafka_topic_name(self.get().rkt);
            if name.is_null() {
                return "";
            }
            std::ffi::CStr::from_ptr(name).to_str().unwrap_or("")
        }
    }

    fn bytes(p: *mut std::ffi::c_void, len: usize) -> Option<&'static [u8]> {
        // SAFETY: librdkafka's payload and key pointers are valid for
        // `len` bytes while the message is (the lifetime is narrowed by
        // the callers to the message's).
        (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p as *const u8, len) })
    }

    fn payload(&self) -> &[u8] {
        let m = self.get();
        Self::bytes(m.payload, m.len).unwrap_or_default()
    }

    fn key(&self) -> Option<&[u8]> {
        let m = self.get();
        Self::bytes(m.key, m.key_len)
    }

    fn timestamp_ms(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a valid message.
        let ms = unsafe { rd::rd_kafka_message_timestamp(self.get(), &mut kind) };
        (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE).then_some(ms)
    }

    /// The headers as `kafka.headers`' object, when the record has any
    /// (a header name that is not UTF-8 is written lossily).
    fn headers(&self) -> Option<Value> {
        let mut h: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: a valid message; the headers belong to it.
        let err = unsafe { rd::rd_kafka_message_headers(self.get(), &mut h) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || h.is_null() {
            return None;
        }
        let mut obj = Vec::new();
        for i in 0.. {
            let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0usize);
            // SAFETY: valid headers; out-pointers to locals.
            let err =
                unsafe { rd::rd_kafka_header_get_all(h, i, &mut name, &mut value, &mut size) };
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                break;
            }
            // SAFETY: a NUL-terminated name and `size` bytes of value.
            let key = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
            let v = Self::bytes(value as *mut _, size);
            obj.push((Key::Owned(key.into_owned()), header_value(v)));
        }
        Some(Value::Object(obj))
    }
}

impl Drop for RawMessage {
    fn drop(&mut self) {
        // SAFETY: returned by rd_kafka_consume_batch_queue, destroyed once.
        unsafe { rd::rd_kafka_message_destroy(self.0.as_ptr()) }
    }
}

/// A header's value as a field value: text when it is UTF-8.
fn header_value(v: Option<&[u8]>) -> Value {
    match v {
        Some(v) => match std::str::from_utf8(v) {
            Ok(s) => Value::Str(s.into()),
            Err(_) => Value::Bytes(v.into()),
        },
        None => Value::Null,
    }
}

/// What a batch keeps of one record.
struct Record<'a> {
    offset: i64,
    value: &'a [u8],
    key: Option<&'a [u8]>,
    timestamp_ms: Option<i64>,
    headers: Option<Value>,
}

impl Reader {
    fn run(&mut self) {
        let mut last_commit = Instant::now();
        let mut idle = false;
        // Since when the memory budget has had no room, if it has none.
        let mut blocked_since: Option<Instant> = None;
        while !self.stop.asked.load(Ordering::Acquire) {
            self.rewind();
            // The first batches stay small: a record's event carries its
            // kafka.* fields, so encoded output can be many times the
            // values read, and until the pipeline has measured a batch a
            // full-size one would overshoot the memory limit.
            let cap = if self.emitted < WARM_UP_BATCHES {
                WARM_UP_BYTES
            } else {
                MAX_BATCH_BYTES
            };
            let target = self.budget.largest_read().min(cap);
            let epoch = self.budget.global().release_epoch();
            let mut blocked = !self.flush(idle, target);
            if !blocked {
                if let Some(m) = self.carry.take() {
                    if self.take(&m, target).is_err() {
                        self.carry = Some(m);
                        blocked = true;
                    }
                }
            }
            if !blocked {
                blocked = self.take_held(target).is_err();
            }
            if !blocked {
                blocked_since = None;
                self.set_paused(false);
            } else {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() < PAUSE_AFTER {
                    // The sinks catching up: wait for memory without
                    // polling, which leaves librdkafka's prefetched records
                    // in place. Pausing drops them, and partitions resumed
                    // after a pause took ~0.6 s to deliver again (117,000
                    // records/s into Kafka at 16 MiB, 3× below this way).
                    self.budget
                        .global()
                        .wait_for_release(epoch, Duration::from_millis(10));
                    self.commit_due(&mut last_commit);
                    continue;
                }
                // A stall that lasts (a sink down): pause, and keep polling
                // so that the consumer stays in its group.
                self.set_paused(true);
            }
            let timeout = if !blocked && !self.builders.is_empty() {
                Duration::from_millis(5)
            } else {
                Duration::from_millis(100)
            };
            idle = self.poll_events(target);
            self.forget_revoked();
            if !blocked && self.carry.is_none() {
                idle &= self.consume(timeout);
            } else {
                // Paused on a full budget: nothing to take, so wait for
                // memory (or the next round's events) instead of spinning.
                self.budget.global().wait_for_release(epoch, timeout);
            }
            self.commit_due(&mut last_commit);
        }
        self.finish();
    }

    /// Serves the consumer's queue without waiting: rebalances (their
    /// callbacks run here), commit results, statistics and errors, and the
    /// odd record fetched before its partition was forwarded to the fetch
    /// queue. True when it held nothing.
    fn poll_events(&mut self, target: usize) -> bool {
        // A message borrows the consumer, not the reader.
        let consumer = self.consumer.clone();
        for _ in 0..BURST {
            match consumer.poll(Duration::ZERO) {
                Some(Ok(m)) => {
                    if self.carry.is_some() || self.take(&m, target).is_err() {
                        // No room for it: held (one record) until there
                        // is, as the records librdkafka prefetched are.
                        self.carry = Some(m.detach());
                        return false;
                    }
                }
                Some(Err(e)) => {
                    self.shared.errors.inc();
                    tracing::warn!(source = %self.shared.key, error = %e, "kafka: consume error");
                    return false;
                }
                None => return true,
            }
        }
        false
    }

    /// Drops what the reader holds of partitions revoked since it last
    /// looked: records fetched but not in a batch, and unsent batches (not
    /// yet tracked, so their records are read again from the commit).
    fn forget_revoked(&mut self) {
        let revoked = std::mem::take(&mut *self.shared.revoked_since.lock());
        if revoked.is_empty() {
            return;
        }
        let gone = |topic: &str, partition: i32| {
            revoked
                .iter()
                .any(|tp| tp.1 == partition && &*tp.0 == topic)
        };
        self.held.retain(|m| !gone(m.topic(), m.get().partition));
        if self
            .carry
            .as_ref()
            .is_some_and(|m| gone(m.topic(), m.partition()))
        {
            self.carry = None;
        }
        self.builders.retain(|tp, _| !gone(&tp.0, tp.1));
        self.current = None;
    }

    /// Takes up to [`BURST`] records from the fetch queue into `held`,
    /// waiting up to `wait` for the first one; what librdkafka already
    /// holds is taken in one call, before the round's checks (clock reads,
    /// locks, a look at every partition's batch): per record they cost as
    /// much as the record. True when nothing came.
    fn consume(&mut self, wait: Duration) -> bool {
        let mut n = self.consume_batch(0, BURST);
        if n == 0 {
            // Nothing there: wait for one record only (a batch call waits
            // until its array is full), then take the rest at once.
            n = self.consume_batch(wait.as_millis().min(1000) as i32, 1);
            if n > 0 {
                n += self.consume_batch(0, BURST - 1);
            }
        }
        n == 0
    }

    /// One `rd_kafka_consume_batch_queue` call into `held`; the count.
    fn consume_batch(&mut self, timeout_ms: i32, max: usize) -> usize {
        self.fetched.clear();
        self.fetched.reserve(max);
        // SAFETY: the queue is alive; the array has room for `max`
        // pointers, of which the call fills the first `n`.
        let n = unsafe {
            let n = rd::rd_kafka_consume_batch_queue(
                self.fetch.0.as_ptr(),
                timeout_ms,
                self.fetched.as_mut_ptr(),
                max,
            );
            let n = n.clamp(0, max as isize) as usize;
            self.fetched.set_len(n);
            n
        };
        for &m in &self.fetched {
            let Some(m) = std::ptr::NonNull::new(m).map(RawMessage) else {
                continue;
            };
            let err = m.get().err;
            if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                self.held.push_back(m);
            } else if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
                self.shared.errors.inc();
                let e = KafkaError::MessageConsumption(err.into());
                tracing::warn!(source = %self.shared.key, error = %e, topic = m.topic(), partition = m.get().partition, "kafka: consume error");
            }
        }
        self.fetched.clear();
        n
    }

    /// Adds the held records to their batches, in order, until the budget
    /// has no room for one.
    fn take_held(&mut self, target: usize) -> Result<(), NoRoom> {
        while let Some(m) = self.held.pop_front() {
            if self.take_raw(&m, target).is_err() {
                self.held.push_front(m);
                return Err(NoRoom);
            }
        }
        Ok(())
    }

    fn commit_due(&self, last_commit: &mut Instant) {
        if last_commit.elapsed() >= self.commit_interval {
            self.shared.commit(&self.consumer, None, CommitMode::Async);
            *last_commit = Instant::now();
        }
    }

    /// Stops: emits what is collected if memory allows, waits for what is
    /// in flight, commits, and leaves the group.
    fn finish(&mut self) {
        let deadline = self
            .stop
            .deadline
            .lock()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(30));
        self.set_paused(true);
        let _ = self.flush(true, 0);
        self.builders.clear();
        self.carry = None;
        self.held.clear();
        if !self.shared.tracker.wait_all_drained(deadline) {
            tracing::warn!(source = %self.shared.key, "kafka: records still undelivered at shutdown; they will be read again");
        }
        self.shared.commit(&self.consumer, None, CommitMode::Sync);
        // Leaving the group now hands the partitions over at once rather
        // than after the session timeout; the revocation this causes finds
        // nothing in flight.
        self.consumer.unsubscribe();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until && self.consumer.assignment().is_ok_and(|a| a.count() > 0) {
            let _ = self.consumer.poll(Duration::from_millis(50));
        }
        tracing::info!(source = %self.shared.key, "kafka source stopped");
    }

    /// Reads again partitions whose batch failed, from their watermark.
    fn rewind(&mut self) {
        for (tp, from) in self.shared.tracker.take_rewinds() {
            self.builders.remove(&tp);
            if self
                .carry
                .as_ref()
                .is_some_and(|m| m.partition() == tp.1 && m.topic() == &*tp.0)
            {
                self.carry = None;
            }
            self.held
                .retain(|m| !(m.get().partition == tp.1 && m.topic() == &*tp.0));
            tracing::warn!(source = %self.shared.key, topic = %tp.0, partition = tp.1, offset = from,
                "kafka: delivery failed; reading the partition again from its last delivered record");
            if let Err(e) =
                self.consumer
                    .seek(&tp.0, tp.1, Offset::Offset(from), Duration::from_secs(5))
            {
                self.shared.errors.inc();
                tracing::error!(source = %self.shared.key, error = %e, "kafka: seek failed");
            }
        }
    }

    fn set_paused(&self, pause: bool) {
        if self.shared.paused.load(Ordering::Acquire) == pause {
            return;
        }
        let Ok(assigned) = self.consumer.assignment() else {
            return;
        };
        let r = if pause {
            self.consumer.pause(&assigned)
        } else {
            self.consumer.resume(&assigned)
        };
        if let Err(e) = r {
            tracing::warn!(source = %self.shared.key, error = %e, "kafka: pause/resume failed");
            return;
        }
        self.shared.paused.store(pause, Ordering::Release);
        self.shared
            .paused_gauge
            .set(if pause { assigned.count() as i64 } else { 0 });
        if pause {
            self.metrics
                .metrics()
                .backpressure_pauses
                .get_or_create(&self.metrics.labels())
                .inc();
        }
    }

    /// Emits the batches that are due (all when `all`, else the full or
    /// old ones). False when the memory budget had no room for one.
    fn flush(&mut self, all: bool, target: usize) -> bool {
        let due: Vec<Tp> = self
            .builders
            .iter()
            .filter(|(_, b)| all || b.buf.len() >= target || b.opened.elapsed() >= LINGER)
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in due {
            let Some(b) = self.builders.get(&tp) else {
                continue;
            };
            let need = self.budget.reservation(b.buf.len());
            let Some(charge) = self.budget.try_charge(need) else {
                return false;
            };
            if let Some(b) = self.builders.remove(&tp) {
                self.emit(&tp, b, charge);
            }
        }
        true
    }

    fn emit(&mut self, tp: &Tp, b: Builder, charge: petrel_core::MemoryCharge) {
        self.emitted += 1;
        let Some(seq) = self.shared.tracker.emitted(tp, b.first, b.last + 1) else {
            // Revoked meanwhile: the next owner reads these records.
            return;
        };
        let info = self
            .infos
            .entry(tp.clone())
            .or_insert_with(|| {
                let mut meta: Vec<(Key, Arc<str>)> = self.meta.to_vec();
                meta.push((Key::Borrowed("kafka.topic"), tp.0.clone()));
                meta.push((Key::Borrowed("kafka.partition"), tp.1.to_string().into()));
                Arc::new(SourceInfo {
                    path: "".into(),
                    meta: meta.into(),
                    source_type: "kafka",
                })
            })
            .clone();
        let input = b.buf.len() as u64;
        let n = b.events.len() as u64;
        let mut batch = EventBatch::new(Bytes::from(b.buf), info);
        batch.events = b.events;
        batch.input_bytes = input;
        batch.charge = charge;
        batch.origin = Some(Origin {
            stream: stream_id(tp),
            base: b.first.max(0) as u64,
            starts: Some(b.starts.into()),
            per_record: true,
        });
        batch.ack = Some(BatchAck::start(self.acks.clone(), seq));
        self.metrics.received_events.inc_by(n);
        self.metrics.received_bytes.inc_by(input);
        self.metrics.sent_events.inc_by(n);
        self.metrics.sent_bytes.inc_by(input);
        self.emitter.emit(batch);
    }

    /// The partition of a record if it is assigned, the last one's
    /// without a lock or a string compare when unchanged (`rkt`: the
    /// record's librdkafka topic handle, when it has one).
    fn partition_of(
        &mut self,
        topic: impl FnOnce() -> Arc<str>,
        partition: i32,
        rkt: *const rd::rd_kafka_topic_t,
        same_topic: impl FnOnce(&str) -> bool,
    ) -> Option<Tp> {
        let epoch = self.shared.tracker.assignment_epoch();
        if let Some((tp, e, t)) = &self.current {
            // A topic handle compared by address is only trusted within
            // one assignment epoch (a new topic is a new assignment).
            if *e == epoch
                && tp.1 == partition
                && ((!rkt.is_null() && *t == rkt) || same_topic(&tp.0))
            {
                return Some(tp.clone());
            }
        }
        let tp: Tp = (topic(), partition);
        if !self.shared.tracker.is_assigned(&tp) {
            return None;
        }
        self.current = Some((tp.clone(), epoch, rkt));
        Some(tp)
    }

    /// Adds a record of the consumer's queue to its partition's batch.
    fn take<M: Message>(&mut self, m: &M, target: usize) -> Result<(), NoRoom> {
        let Some(tp) = self.partition_of(
            || m.topic().into(),
            m.partition(),
            std::ptr::null(),
            |t| t == m.topic(),
        ) else {
            return Ok(());
        };
        let headers = m.headers().map(|h| {
            let mut obj = Vec::with_capacity(h.count());
            for i in 0..h.count() {
                if let Some(hd) = h.try_get(i) {
                    obj.push((Key::Owned(hd.key.to_string()), header_value(hd.value)));
                }
            }
            Value::Object(obj)
        });
        let r = Record {
            offset: m.offset(),
            value: m.payload().unwrap_or_default(),
            key: m.key(),
            timestamp_ms: m.timestamp().to_millis(),
            headers,
        };
        self.add(tp, r, target)
    }

    /// Adds a record of the fetch queue to its partition's batch: its
    /// fields read straight from librdkafka's message.
    fn take_raw(&mut self, m: &RawMessage, target: usize) -> Result<(), NoRoom> {
        let raw = m.get();
        let Some(tp) = self.partition_of(
            || m.topic().into(),
            raw.partition,
            raw.rkt,
            |t| t == m.topic(),
        ) else {
            return Ok(());
        };
        let r = Record {
            offset: raw.offset,
            value: m.payload(),
            key: m.key(),
            timestamp_ms: m.timestamp_ms(),
            headers: m.headers(),
        };
        self.add(tp, r, target)
    }

    /// Adds a record to its partition's batch; gives it back when the
    /// partition's batch is full and the memory budget has no room to emit
    /// it.
    fn add(&mut self, tp: Tp, r: Record<'_>, target: usize) -> Result<(), NoRoom> {
        let offset = r.offset;
        // Positions in a batch are offsets from its first record, in 32
        // bits; a gap that large (compaction) starts a new batch.
        let split = self
            .builders
            .get(&tp)
            .is_some_and(|b| offset - b.first > u32::MAX as i64 || b.buf.len() >= target.max(1));
        if split {
            let need = self
                .builders
                .get(&tp)
                .map_or(0, |b| self.budget.reservation(b.buf.len()));
            let Some(charge) = self.budget.try_charge(need) else {
                return Err(NoRoom);
            };
            if let Some(full) = self.builders.remove(&tp) {
                self.emit(&tp, full, charge);
            }
        }
        let b = self.builders.entry(tp).or_insert_with(|| Builder {
            buf: Vec::with_capacity(target.min(64 << 10)),
            events: Vec::new(),
            starts: Vec::new(),
            first: offset,
            last: offset,
            opened: Instant::now(),
        });
        let value = r.value;
        let at = b.buf.len();
        b.buf.extend_from_slice(value);
        let mut ev = Event::from_span(Span::new(at, value.len()));
        if let Some(parser) = &self.json {
            if parser
                .parse(value, Some(at as u32), &mut ev.fields)
                .is_err()
            {
                ev.fields.clear();
                self.decode_failed.inc();
            }
        }
        ev.fields
            .push((Key::Borrowed("kafka.offset"), Value::Int(offset)));
        if let Some(ms) = r.timestamp_ms {
            ev.fields
                .push((Key::Borrowed("kafka.timestamp"), Value::Int(ms)));
            ev.time_ns = ms.checked_mul(1_000_000);
        }
        if let Some(k) = r.key {
            let kat = b.buf.len();
            b.buf.extend_from_slice(k);
            ev.fields.push((
                Key::Borrowed("kafka.key"),
                Value::Span(Span::new(kat, k.len())),
            ));
        }
        if let Some(h) = r.headers {
            ev.fields.push((Key::Borrowed("kafka.headers"), h));
        }
        b.starts
            .push((at as u32, (offset - b.first).max(0) as u32, 0));
        b.last = offset;
        b.events.push(ev);
        Ok(())
    }
}

/// The identity of a partition's record stream, for stable event ids.
fn stream_id(tp: &Tp) -> u128 {
    let mut key = Vec::with_capacity(tp.0.len() + 16);
    key.extend_from_slice(b"kafka\0");
    key.extend_from_slice(tp.0.as_bytes());
    key.push(0);
    key.extend_from_slice(&tp.1.to_le_bytes());
    twox_hash::XxHash3_128::oneshot(&key)
}
