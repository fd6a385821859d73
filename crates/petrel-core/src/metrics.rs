//! Metrics in Prometheus/OpenMetrics text form.
//!
//! Components take cheap handles ([`ComponentMetrics`]) at build time and
//! bump atomics per batch on the hot path; label lookups happen only on cold
//! paths (a new discard reason, a new file).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::health::Health;

/// Label pairs of a metric sample.
pub type Labels = Vec<(String, String)>;

/// The labels every series of one component carries.
#[derive(Debug, Default, Hash, PartialEq, Eq)]
struct ComponentId {
    pipeline: String,
    kind: String,
    id: String,
    type_: String,
}

/// Label set of a component's series: the component's labels, shared by
/// all its series, and the pairs particular to one series (`error_type`,
/// `reason`, `topic`...).
///
/// Each family entry used to hold its own copy of the four label strings,
/// about 450 bytes, for a dozen entries per pipeline (issue 22); an entry
/// now costs a pointer and, for most families, an empty `Vec`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct ComponentLabels {
    component: Arc<ComponentId>,
    extra: Vec<(&'static str, Cow<'static, str>)>,
}

impl ComponentLabels {
    fn with(&self, key: &'static str, value: Cow<'static, str>) -> Self {
        let mut l = self.clone();
        l.extra.push((key, value));
        l
    }
}

impl EncodeLabelSet for ComponentLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let c = &*self.component;
        [
            ("pipeline", c.pipeline.as_str()),
            ("component_kind", c.kind.as_str()),
            ("component_id", c.id.as_str()),
            ("component_type", c.type_.as_str()),
        ]
        .encode(encoder)?;
        self.extra.as_slice().encode(encoder)
    }
}

/// All metric families of the agent.
pub struct Metrics {
    registry: Mutex<Registry>,
    received_events: Family<ComponentLabels, Counter>,
    received_bytes: Family<ComponentLabels, Counter>,
    sent_events: Family<ComponentLabels, Counter>,
    sent_bytes: Family<ComponentLabels, Counter>,
    errors: Family<ComponentLabels, Counter>,
    discarded: Family<ComponentLabels, Counter>,
    /// Read offset per pipeline and file.
    pub file_read_offset: Family<Labels, Gauge>,
    /// Acknowledged (committed) offset per pipeline and file.
    pub file_committed_offset: Family<Labels, Gauge>,
    /// Size per pipeline and file.
    pub file_size: Family<Labels, Gauge>,
    /// Bytes not yet acknowledged per pipeline and file.
    pub file_lag: Family<Labels, Gauge>,
    /// Files open per pipeline.
    pub files_open: Family<Labels, Gauge>,
    /// Open connections per receiving source.
    source_connections: Family<ComponentLabels, Gauge>,
    /// Bytes in a source's disk spool.
    spool_bytes: Family<ComponentLabels, Gauge>,
    /// A sink's disk buffer: events, bytes, capacity, oldest age.
    buffer_events: Family<ComponentLabels, Gauge>,
    buffer_bytes: Family<ComponentLabels, Gauge>,
    buffer_max_bytes: Family<ComponentLabels, Gauge>,
    buffer_oldest_seconds: Family<ComponentLabels, Gauge>,
    /// Damage found in a disk buffer or spool: records and bytes skipped.
    buffer_damaged_records: Family<ComponentLabels, Counter>,
    buffer_damaged_bytes: Family<ComponentLabels, Counter>,
    /// Checkpoint file writes.
    pub checkpoint_writes: Counter,
    /// Checkpoint writes that failed (the previous checkpoint stays).
    pub checkpoint_errors: Counter,
    /// Configuration reloads by `result` (`applied`, `unchanged`, `failed`).
    pub config_reloads: Family<Labels, Counter>,
    /// API connections closed at accept because too many were open.
    pub api_refused_connections: Counter,
    /// When the TLS certificate each component presents expires (Unix
    /// seconds), by `component`.
    pub tls_certificate_expiry: Family<Labels, Gauge>,
    /// Directory listings that failed (the previous view was kept).
    pub list_errors: Counter,
    /// Open problems reported by `/health`.
    pub health: Arc<Health>,
    /// Memory charged for in-flight data.
    pub memory_used: Gauge,
    /// The configured memory limit.
    pub memory_limit: Gauge,
    /// Times a reader paused because its memory budget was full.
    pub backpressure_pauses: Family<Labels, Counter>,
    retried_events: Family<ComponentLabels, Counter>,
    duplicates_skipped: Family<ComponentLabels, Counter>,
    cache_evictions: Family<ComponentLabels, Counter>,
    stream_overflow: Family<ComponentLabels, Counter>,
    out_of_order: Family<ComponentLabels, Counter>,
    in_flight: Family<ComponentLabels, Gauge>,
    window: Family<ComponentLabels, Gauge>,
    partition_lag: Family<ComponentLabels, Gauge>,
    partition_committed: Family<ComponentLabels, Gauge>,
    rebalances: Family<ComponentLabels, Counter>,
    paused_partitions: Family<ComponentLabels, Gauge>,
    latency: Family<ComponentLabels, Histogram, fn() -> Histogram>,
    /// Open taps (`petrel tap`) and the events they skipped.
    pub taps: crate::tap::Taps,
    /// Counter families that plugins register by name (see
    /// [`Metrics::named_counters`]), so that the core names none of them.
    named: Mutex<HashMap<&'static str, Family<Labels, Counter>>>,
    /// Gauge families that plugins register by name.
    named_gauges: Mutex<HashMap<&'static str, Family<Labels, Gauge>>>,
}

/// Buckets of the delivery latency histogram: 1 ms to about 65 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Counters and gauges of a sink's delivery loop.
#[derive(Clone, Debug)]
pub struct DeliveryMetrics {
    /// Events sent again after a failed attempt.
    pub retried_events: Counter,
    /// Payloads (batches) being delivered now.
    pub in_flight: Gauge,
    /// Current congestion window, in payloads.
    pub window: Gauge,
    /// Seconds from hand-over to the sink until acknowledged delivery.
    pub latency: Histogram,
}

/// Gauges of a sink's disk buffer.
#[derive(Clone, Debug)]
pub struct BufferGauges {
    /// Events written and not yet delivered.
    pub events: Gauge,
    /// Bytes written and not yet delivered.
    pub bytes: Gauge,
    /// The buffer's `max_size`.
    pub max_bytes: Gauge,
    /// Age in seconds of the oldest data handed to the sink and not yet
    /// delivered.
    pub oldest_seconds: Gauge,
}

/// A counter registered in its family at its first increment.
///
/// Sources and sinks take one per error type or discard reason at start;
/// registering them all up front cost hundreds of bytes each (a family
/// entry with its own copy of the labels) and filled `/metrics` with
/// zero-valued series for every component, most of which never count
/// anything (issue 22). After the first increment the series is the same
/// as one from [`ComponentMetrics::error`], and is never removed.
///
/// An unused handle allocates nothing: it holds the component's shared
/// labels and the registry (two reference counts) and a static name; a
/// thousand pipelines with half a dozen handles each used to spend 120
/// bytes of heap per handle (issue 33). A clone made before the first
/// increment registers on its own first increment, into the same series.
/// `LazyCounter::default()` counts in a counter registered nowhere
/// (tests), shared by its clones.
#[derive(Clone, Debug)]
pub struct LazyCounter {
    /// The registry and the component whose series this is; `None`:
    /// detached (registered nowhere).
    home: Option<(Arc<Metrics>, Arc<ComponentId>)>,
    kind: LazyKind,
    value: &'static str,
    counter: OnceLock<Counter>,
}

/// The family of a [`LazyCounter`], and so its labels.
#[derive(Clone, Copy, Debug, Default)]
enum LazyKind {
    /// `petrel_component_errors_total`, `error_type` = the value.
    #[default]
    Error,
    /// `petrel_component_discarded_events_total`, `reason` = the value.
    Discarded,
    /// `petrel_backpressure_pauses_total` of the component's pipeline
    /// (labelled by the pipeline alone).
    PipelinePauses,
}

impl Default for LazyCounter {
    /// A detached counter: registered nowhere, its clones count together
    /// (the counter exists from the start, since no registry would find
    /// a clone's increments).
    fn default() -> Self {
        Self {
            home: None,
            kind: LazyKind::default(),
            value: "",
            counter: OnceLock::from(Counter::default()),
        }
    }
}

impl LazyCounter {
    fn new(
        labels: &ComponentLabels,
        metrics: &Arc<Metrics>,
        kind: LazyKind,
        value: &'static str,
    ) -> Self {
        Self {
            home: Some((metrics.clone(), labels.component.clone())),
            kind,
            value,
            counter: OnceLock::new(),
        }
    }

    /// The registered counter, registering it on the first call.
    fn counter(&self) -> &Counter {
        self.counter
            .get_or_init(|| self.find(true).unwrap_or_default())
    }

    /// The counter of this series in its family, created when `create`.
    fn find(&self, create: bool) -> Option<Counter> {
        let (metrics, component) = self.home.as_ref()?;
        let labels = || ComponentLabels {
            component: component.clone(),
            extra: vec![(
                match self.kind {
                    LazyKind::Error => "error_type",
                    _ => "reason",
                },
                Cow::Borrowed(self.value),
            )],
        };
        let family = match self.kind {
            LazyKind::Error => &metrics.errors,
            LazyKind::Discarded => &metrics.discarded,
            LazyKind::PipelinePauses => {
                let labels = vec![("pipeline".to_string(), component.pipeline.clone())];
                return if create {
                    Some(metrics.backpressure_pauses.get_or_create(&labels).clone())
                } else {
                    metrics.backpressure_pauses.get(&labels).map(|c| c.clone())
                };
            }
        };
        if create {
            Some(family.get_or_create(&labels()).clone())
        } else {
            family.get(&labels()).map(|c| c.clone())
        }
    }

    /// Adds one; returns the previous value.
    pub fn inc(&self) -> u64 {
        self.counter().inc()
    }

    /// Adds `n`; returns the previous value.
    pub fn inc_by(&self, n: u64) -> u64 {
        self.counter().inc_by(n)
    }

    /// The current value: 0 until the series exists (incremented through
    /// this handle or any other with the same labels).
    pub fn get(&self) -> u64 {
        if let Some(c) = self.counter.get() {
            return c.get();
        }
        self.find(false).map_or(0, |c| c.get())
    }
}

/// Counters of one component (source, processor or sink) in one pipeline.
#[derive(Clone, Debug)]
pub struct ComponentMetrics {
    labels: ComponentLabels,
    health_key: Arc<str>,
    metrics: Arc<Metrics>,
    /// Events that entered the component.
    pub received_events: Counter,
    /// Bytes that entered the component.
    pub received_bytes: Counter,
    /// Events the component passed on or delivered.
    pub sent_events: Counter,
    /// Bytes the component passed on or delivered.
    pub sent_bytes: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Creates and registers every family.
    pub fn new() -> Arc<Self> {
        let mut r = Registry::with_prefix("petrel");
        let tap_skipped = Counter::default();
        let tap_open = Gauge::default();
        let m = Self {
            received_events: Family::default(),
            received_bytes: Family::default(),
            sent_events: Family::default(),
            sent_bytes: Family::default(),
            errors: Family::default(),
            discarded: Family::default(),
            file_read_offset: Family::default(),
            file_committed_offset: Family::default(),
            file_size: Family::default(),
            file_lag: Family::default(),
            files_open: Family::default(),
            source_connections: Family::default(),
            spool_bytes: Family::default(),
            buffer_events: Family::default(),
            buffer_bytes: Family::default(),
            buffer_max_bytes: Family::default(),
            buffer_oldest_seconds: Family::default(),
            buffer_damaged_records: Family::default(),
            buffer_damaged_bytes: Family::default(),
            checkpoint_writes: Counter::default(),
            checkpoint_errors: Counter::default(),
            config_reloads: Family::default(),
            tls_certificate_expiry: Family::default(),
            api_refused_connections: Counter::default(),
            list_errors: Counter::default(),
            health: Arc::new(Health::default()),
            memory_used: Gauge::default(),
            memory_limit: Gauge::default(),
            backpressure_pauses: Family::default(),
            retried_events: Family::default(),
            duplicates_skipped: Family::default(),
            cache_evictions: Family::default(),
            stream_overflow: Family::default(),
            out_of_order: Family::default(),
            in_flight: Family::default(),
            partition_lag: Family::default(),
            partition_committed: Family::default(),
            rebalances: Family::default(),
            paused_partitions: Family::default(),
            window: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            taps: crate::tap::Taps::new(tap_skipped.clone(), tap_open.clone()),
            registry: Mutex::new(Registry::default()),
            named: Mutex::new(HashMap::new()),
            named_gauges: Mutex::new(HashMap::new()),
        };
        r.register(
            "component_received_events",
            "Events received by a component",
            m.received_events.clone(),
        );
        r.register(
            "component_received_bytes",
            "Bytes received by a component",
            m.received_bytes.clone(),
        );
        r.register(
            "component_sent_events",
            "Events sent (delivered, for sinks) by a component",
            m.sent_events.clone(),
        );
        r.register(
            "component_sent_bytes",
            "Bytes sent (delivered, for sinks) by a component",
            m.sent_bytes.clone(),
        );
        r.register(
            "component_errors",
            "Errors by component and error type",
            m.errors.clone(),
        );
        r.register(
            "component_discarded_events",
            "Events discarded, split or altered on purpose, by reason",
            m.discarded.clone(),
        );
        r.register(
            "file_read_offset_bytes",
            "Offset read so far",
            m.file_read_offset.clone(),
        );
        r.register(
            "file_committed_offset_bytes",
            "Offset acknowledged by every sink and checkpointed",
            m.file_committed_offset.clone(),
        );
        r.register("file_size_bytes", "File size", m.file_size.clone());
        r.register(
            "file_lag_bytes",
            "Bytes of the file not yet acknowledged by the sinks",
            m.file_lag.clone(),
        );
        r.register("files_open", "Files held open", m.files_open.clone());
        r.register(
            "source_connections",
            "Connections open to a receiving source",
            m.source_connections.clone(),
        );
        r.register(
            "source_spool_bytes",
            "Bytes in a source's disk spool (accepted, not yet delivered and deleted)",
            m.spool_bytes.clone(),
        );
        r.register(
            "component_buffer_events",
            "Events in a sink's disk buffer, written and not yet delivered (counted from this start of the agent: events left by an earlier run count once read back)",
            m.buffer_events.clone(),
        );
        r.register(
            "component_buffer_bytes",
            "Bytes in a sink's disk buffer, written and not yet delivered",
            m.buffer_bytes.clone(),
        );
        r.register(
            "component_buffer_max_bytes",
            "The max_size of a sink's disk buffer",
            m.buffer_max_bytes.clone(),
        );
        r.register(
            "component_buffer_oldest_seconds",
            "Age of the oldest undelivered data a sink's disk buffer has handed to the sink (0 when it has none in flight)",
            m.buffer_oldest_seconds.clone(),
        );
        r.register(
            "component_buffer_damaged_records",
            "Damaged places found in a sink's disk buffer or a source's spool (a record with a wrong length or checksum, a segment ending inside a record, a damaged read position): skipped, logged with the file and offset",
            m.buffer_damaged_records.clone(),
        );
        r.register(
            "component_buffer_damaged_bytes",
            "Bytes skipped as damaged in a sink's disk buffer or a source's spool",
            m.buffer_damaged_bytes.clone(),
        );
        r.register(
            "checkpoint_writes",
            "Checkpoint file writes",
            m.checkpoint_writes.clone(),
        );
        r.register(
            "checkpoint_errors",
            "Checkpoint writes that failed; offsets stay at the last good checkpoint",
            m.checkpoint_errors.clone(),
        );
        r.register(
            "config_reload",
            "Configuration reloads by result",
            m.config_reloads.clone(),
        );
        r.register(
            "tls_certificate_expiry_seconds",
            "When the TLS certificate a component presents (a server's, or a client certificate) expires, as Unix seconds (its notAfter); follows the certificate as it is reloaded",
            m.tls_certificate_expiry.clone(),
        );
        r.register(
            "tap_skipped_events",
            "Events a `petrel tap` client was too slow to take (skipped; the pipeline never waits for a tap)",
            tap_skipped,
        );
        r.register("tap_open", "Taps (`petrel tap`) open now", tap_open);
        r.register(
            "api_refused_connections",
            "API connections closed at accept because too many were open",
            m.api_refused_connections.clone(),
        );
        r.register(
            "directory_list_errors",
            "Directory listings that failed; the files known there were kept",
            m.list_errors.clone(),
        );
        r.register(
            "memory_used_bytes",
            "Memory charged for in-flight data",
            m.memory_used.clone(),
        );
        r.register(
            "memory_limit_bytes",
            "Configured memory limit",
            m.memory_limit.clone(),
        );
        r.register(
            "backpressure_pauses",
            "Times a source paused because its memory budget was full",
            m.backpressure_pauses.clone(),
        );
        r.register(
            "component_retried_events",
            "Events sent again after a failed delivery attempt",
            m.retried_events.clone(),
        );
        r.register(
            "component_duplicates_skipped",
            "Events a sink found already delivered (a copy sent again after a crash or a lost answer) and did not write twice",
            m.duplicates_skipped.clone(),
        );
        r.register(
            "component_cache_evictions",
            "Entries a processor's bounded cache (throttle keys, dedupe hashes) evicted to stay within its size",
            m.cache_evictions.clone(),
        );
        r.register(
            "component_stream_overflow_events",
            "Events sent with overflow label values because the sink's label sets reached max_streams",
            m.stream_overflow.clone(),
        );
        r.register(
            "component_out_of_order_events",
            "Entries older than what the sink already sent for their stream",
            m.out_of_order.clone(),
        );
        r.register(
            "component_in_flight_batches",
            "Batches a sink is delivering now",
            m.in_flight.clone(),
        );
        r.register(
            "source_partition_lag_records",
            "Records in a partition after the consumer's position (the broker's high watermark minus the position)",
            m.partition_lag.clone(),
        );
        r.register(
            "source_partition_committed_offset",
            "Offset committed for a partition: every record before it was delivered",
            m.partition_committed.clone(),
        );
        r.register(
            "source_rebalances",
            "Partition assignments and revocations a consumer-group source went through, by kind",
            m.rebalances.clone(),
        );
        r.register(
            "source_paused_partitions",
            "Partitions a source paused because its memory budget was full or a sink held its data",
            m.paused_partitions.clone(),
        );
        r.register(
            "component_window_batches",
            "Congestion window of a sink, in batches",
            m.window.clone(),
        );
        r.register(
            "component_delivery_latency_seconds",
            "Time from hand-over to a sink until acknowledged delivery",
            m.latency.clone(),
        );
        *m.registry.lock() = r;
        Arc::new(m)
    }

    /// Handles for component `id` of `kind` (source, processor, sink) and
    /// plugin `type_` in `pipeline`.
    pub fn component(
        self: &Arc<Self>,
        pipeline: &str,
        kind: &str,
        id: &str,
        type_: &str,
    ) -> ComponentMetrics {
        let labels = ComponentLabels {
            component: Arc::new(ComponentId {
                pipeline: pipeline.into(),
                kind: kind.into(),
                id: id.into(),
                type_: type_.into(),
            }),
            extra: Vec::new(),
        };
        ComponentMetrics {
            health_key: format!("{pipeline}/{kind}/{id}").into(),
            received_events: self.received_events.get_or_create(&labels).clone(),
            received_bytes: self.received_bytes.get_or_create(&labels).clone(),
            sent_events: self.sent_events.get_or_create(&labels).clone(),
            sent_bytes: self.sent_bytes.get_or_create(&labels).clone(),
            labels,
            metrics: self.clone(),
        }
    }

    /// The counter family `petrel_<name>_total`, registered on the first
    /// call and shared by every later one (a plugin's agent-wide counters,
    /// such as the Kubernetes API client's errors, which belong to no one
    /// component).
    pub fn named_counters(
        &self,
        name: &'static str,
        help: &'static str,
    ) -> Family<Labels, Counter> {
        let mut named = self.named.lock();
        if let Some(f) = named.get(name) {
            return f.clone();
        }
        let f = Family::<Labels, Counter>::default();
        self.registry.lock().register(name, help, f.clone());
        named.insert(name, f.clone());
        f
    }

    /// The gauge family `petrel_<name>`, registered on the first call and
    /// shared by every later one (as [`Metrics::named_counters`]).
    pub fn named_gauges(&self, name: &'static str, help: &'static str) -> Family<Labels, Gauge> {
        let mut named = self.named_gauges.lock();
        if let Some(f) = named.get(name) {
            return f.clone();
        }
        let f = Family::<Labels, Gauge>::default();
        self.registry.lock().register(name, help, f.clone());
        named.insert(name, f.clone());
        f
    }

    /// Renders every metric as OpenMetrics text, process metrics included.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let _ = encode_registry(&mut out, &self.registry.lock());
        process_metrics(&mut out);
        let _ = encode_eof(&mut out);
        out
    }
}

impl ComponentMetrics {
    /// Adds `n` to the error counter for `error_type`.
    pub fn error(&self, error_type: &str, n: u64) {
        let l = self.labels.with("error_type", error_type.to_owned().into());
        self.metrics.errors.get_or_create(&l).inc_by(n);
    }

    /// Adds `n` to the discarded counter for `reason`.
    pub fn discarded(&self, reason: &str, n: u64) {
        let l = self.labels.with("reason", reason.to_owned().into());
        self.metrics.discarded.get_or_create(&l).inc_by(n);
    }

    /// Events discarded so far for `reason` (0 if none), without creating
    /// the series.
    pub fn discarded_count(&self, reason: &str) -> u64 {
        let l = self.labels.with("reason", reason.to_owned().into());
        self.metrics.discarded.get(&l).map_or(0, |c| c.get())
    }

    /// A counter for `reason`, to keep on a hot path; its series appears
    /// at the first increment.
    pub fn discarded_counter(&self, reason: &'static str) -> LazyCounter {
        LazyCounter::new(&self.labels, &self.metrics, LazyKind::Discarded, reason)
    }

    /// A counter for `error_type`, to keep on a hot path; its series
    /// appears at the first increment.
    pub fn error_counter(&self, error_type: &'static str) -> LazyCounter {
        LazyCounter::new(&self.labels, &self.metrics, LazyKind::Error, error_type)
    }

    /// The `petrel_backpressure_pauses_total` counter of this component's
    /// pipeline, to keep on a hot path; its series appears at the first
    /// pause (a zero-valued series per pipeline is not worth its memory
    /// and `/metrics` lines, issue 33).
    pub fn backpressure_pauses(&self) -> LazyCounter {
        LazyCounter::new(&self.labels, &self.metrics, LazyKind::PipelinePauses, "")
    }

    /// The open-connections gauge of this (receiving) source.
    pub fn connections_gauge(&self) -> Gauge {
        self.metrics
            .source_connections
            .get_or_create(&self.labels)
            .clone()
    }

    /// The spool-size gauge of this source.
    pub fn spool_bytes_gauge(&self) -> Gauge {
        self.metrics.spool_bytes.get_or_create(&self.labels).clone()
    }

    /// The gauges of this sink's disk buffer.
    pub fn buffer_gauges(&self) -> BufferGauges {
        let m = &self.metrics;
        BufferGauges {
            events: m.buffer_events.get_or_create(&self.labels).clone(),
            bytes: m.buffer_bytes.get_or_create(&self.labels).clone(),
            max_bytes: m.buffer_max_bytes.get_or_create(&self.labels).clone(),
            oldest_seconds: m.buffer_oldest_seconds.get_or_create(&self.labels).clone(),
        }
    }

    /// The reporter of damage found in this component's disk buffer or
    /// spool.
    pub fn damage_reporter(&self) -> DamageReporter {
        let m = &self.metrics;
        DamageReporter {
            records: m.buffer_damaged_records.get_or_create(&self.labels).clone(),
            bytes: m.buffer_damaged_bytes.get_or_create(&self.labels).clone(),
            health: self.metrics.health.clone(),
            key: format!("{}/damage", self.health_key),
            last: None,
        }
    }

    /// The process-wide health register (to report this component).
    pub fn health(&self) -> &Health {
        &self.metrics.health
    }

    /// Handles for a sink's delivery loop.
    pub fn delivery(&self) -> DeliveryMetrics {
        let m = &self.metrics;
        DeliveryMetrics {
            retried_events: m.retried_events.get_or_create(&self.labels).clone(),
            in_flight: m.in_flight.get_or_create(&self.labels).clone(),
            window: m.window.get_or_create(&self.labels).clone(),
            latency: m.latency.get_or_create(&self.labels).clone(),
        }
    }

    /// The counter of events this sink found already delivered.
    pub fn duplicates_skipped(&self) -> Counter {
        self.metrics
            .duplicates_skipped
            .get_or_create(&self.labels)
            .clone()
    }

    /// The counter of entries this processor's bounded cache evicted.
    pub fn cache_evictions(&self) -> Counter {
        self.metrics
            .cache_evictions
            .get_or_create(&self.labels)
            .clone()
    }

    /// The counter of events a sink sent under overflow labels.
    pub fn stream_overflow(&self) -> Counter {
        self.metrics
            .stream_overflow
            .get_or_create(&self.labels)
            .clone()
    }

    /// The counter of entries older than their stream's newest sent one.
    pub fn out_of_order(&self) -> Counter {
        self.metrics
            .out_of_order
            .get_or_create(&self.labels)
            .clone()
    }

    /// The lag and committed-offset gauges of partition `partition` of
    /// `topic`, read by this source.
    pub fn partition_gauges(&self, topic: &str, partition: i32) -> (Gauge, Gauge) {
        let l = self.partition_labels(topic, partition);
        (
            self.metrics.partition_lag.get_or_create(&l).clone(),
            self.metrics.partition_committed.get_or_create(&l).clone(),
        )
    }

    /// Drops the gauges of a partition this source no longer reads.
    pub fn forget_partition(&self, topic: &str, partition: i32) {
        let l = self.partition_labels(topic, partition);
        self.metrics.partition_lag.remove(&l);
        self.metrics.partition_committed.remove(&l);
    }

    fn partition_labels(&self, topic: &str, partition: i32) -> ComponentLabels {
        self.labels
            .with("topic", topic.to_owned().into())
            .with("partition", partition.to_string().into())
    }

    /// The counter of rebalances of `kind` (`assign`, `revoke`, `lost`).
    pub fn rebalances(&self, kind: &str) -> Counter {
        let l = self.labels.with("kind", kind.to_owned().into());
        self.metrics.rebalances.get_or_create(&l).clone()
    }

    /// The gauge of partitions this source has paused.
    pub fn paused_partitions(&self) -> Gauge {
        self.metrics
            .paused_partitions
            .get_or_create(&self.labels)
            .clone()
    }

    /// The key of this component in [`Health`]: `pipeline/kind/id`.
    pub fn health_key(&self) -> &str {
        &self.health_key
    }

    /// Reports that this component is failing now (see [`Health::failing`]).
    pub fn failing(&self, reason: impl Into<String>) {
        self.metrics.health.failing(&self.health_key, reason);
    }

    /// Clears this component's problem in [`Health`].
    pub fn recovered(&self) {
        self.metrics.health.recovered(&self.health_key);
    }

    /// The labels identifying this component, as pairs (built on each
    /// call: for cold paths).
    pub fn labels(&self) -> Labels {
        let c = &*self.labels.component;
        vec![
            ("pipeline".into(), c.pipeline.clone()),
            ("component_kind".into(), c.kind.clone()),
            ("component_id".into(), c.id.clone()),
            ("component_type".into(), c.type_.clone()),
        ]
    }

    /// The metrics registry these handles belong to.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// Standard `process_*` metrics read from /proc.
fn process_metrics(out: &mut String) {
    use std::fmt::Write;
    let Some((cpu, rss)) = read_proc_self() else {
        return;
    };
    let _ = write!(
        out,
        "# HELP process_cpu_seconds Total user and system CPU time spent in seconds.\n\
         # TYPE process_cpu_seconds counter\n\
         process_cpu_seconds_total {cpu}\n\
         # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
         # TYPE process_resident_memory_bytes gauge\n\
         process_resident_memory_bytes {rss}\n"
    );
}

/// (CPU seconds, RSS bytes) of this process.
pub fn read_proc_self() -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall, rss (pages) the 24th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let rss_pages: u64 = f.get(21)?.parse().ok()?;
    // Linux reports USER_HZ = 100 and 4 KiB pages on every platform we target.
    Some(((utime + stime) / 100.0, rss_pages * 4096))
}

/// How long `/health` says a component is degraded after the last damage
/// found in its disk buffer or spool.
pub const DAMAGE_HEALTH: std::time::Duration = std::time::Duration::from_secs(600);

/// Reports damage found in a component's disk buffer or spool: every
/// damaged place is logged (the file, the offset, what it is), counted in
/// `petrel_component_buffer_damaged_{records,bytes}_total`, and the
/// component is degraded in `/health` for [`DAMAGE_HEALTH`] after the
/// last one. Damage is never silent.
pub struct DamageReporter {
    records: Counter,
    bytes: Counter,
    health: Arc<Health>,
    key: String,
    last: Option<std::time::Instant>,
}

impl DamageReporter {
    /// One damaged place: `bytes` skipped at `offset` of `path`
    /// (`records` damaged records; 0 for a damaged read position).
    pub fn report(
        &mut self,
        path: &std::path::Path,
        offset: u64,
        bytes: u64,
        records: u64,
        what: &str,
    ) {
        tracing::error!(
            file = %path.display(),
            offset,
            bytes,
            component = %self.key.trim_end_matches("/damage"),
            "disk buffer damage: {what}"
        );
        self.records.inc_by(records);
        self.bytes.inc_by(bytes);
        self.health.degraded(
            &self.key,
            format!(
                "damage in its disk buffer ({} at offset {offset}: {what}); see petrel_component_buffer_damaged_records_total",
                path.display()
            ),
        );
        self.last = Some(std::time::Instant::now());
    }

    /// Clears the degraded state once [`DAMAGE_HEALTH`] passed without
    /// new damage.
    pub fn tick(&mut self) {
        if self.last.is_some_and(|t| t.elapsed() >= DAMAGE_HEALTH) {
            self.last = None;
            self.health.recovered(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_labels_and_process_metrics() {
        let m = Metrics::new();
        let c = m.component("p1", "sink", "out", "file");
        c.sent_events.inc_by(5);
        c.discarded("split_line", 2);
        let text = m.render();
        assert!(text.contains(
            "petrel_component_sent_events_total{pipeline=\"p1\",component_kind=\"sink\",component_id=\"out\",component_type=\"file\"} 5"
        ), "{text}");
        assert!(text.contains("reason=\"split_line\"} 2"), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn error_and_discard_series_appear_at_first_increment() {
        let m = Metrics::new();
        let a = m.component("p1", "source", "in", "file");
        let b = m.component("p2", "source", "in", "kubernetes_logs");
        let (ea, eb) = (
            a.error_counter("read_failed"),
            b.error_counter("read_failed"),
        );
        let filtered = a.discarded_counter("filtered");
        let text = m.render();
        assert!(!text.contains("petrel_component_errors_total{"), "{text}");
        assert!(
            !text.contains("petrel_component_discarded_events_total{"),
            "{text}"
        );
        assert_eq!(
            (ea.get(), filtered.get(), a.discarded_count("filtered")),
            (0, 0, 0)
        );

        ea.inc();
        eb.inc_by(2);
        let text = m.render();
        assert!(text.contains(
            "petrel_component_errors_total{pipeline=\"p1\",component_kind=\"source\",component_id=\"in\",component_type=\"file\",error_type=\"read_failed\"} 1\n"
        ), "{text}");
        assert!(text.contains(
            "petrel_component_errors_total{pipeline=\"p2\",component_kind=\"source\",component_id=\"in\",component_type=\"kubernetes_logs\",error_type=\"read_failed\"} 2\n"
        ), "{text}");
        assert!(
            !text.contains("petrel_component_discarded_events_total{"),
            "{text}"
        );

        // Every handle on a series counts into the same one.
        a.error("read_failed", 1);
        assert_eq!(ea.get(), 2);
        assert_eq!(a.error_counter("read_failed").get(), 2);
        filtered.inc();
        assert_eq!(a.discarded_count("filtered"), 1);
        assert_eq!(m.render().matches("error_type=\"read_failed\"").count(), 2);
    }

    #[test]
    fn backpressure_pauses_appear_at_the_first_pause() {
        let m = Metrics::new();
        let a = m.component("p1", "source", "in", "file");
        let b = m.component("p1", "source", "other", "file");
        let (pa, pb) = (a.backpressure_pauses(), b.backpressure_pauses());
        let early_clone = pa.clone();
        assert!(!m.render().contains("petrel_backpressure_pauses_total"));
        assert_eq!(pa.get(), 0);
        pa.inc();
        // One series per pipeline, whichever source paused.
        pb.inc();
        early_clone.inc();
        let text = m.render();
        assert!(
            text.contains("petrel_backpressure_pauses_total{pipeline=\"p1\"} 3\n"),
            "{text}"
        );
        assert_eq!(pb.get(), 3);
        // A detached handle counts without a series.
        let detached = LazyCounter::default();
        let detached_clone = detached.clone();
        detached.inc_by(4);
        assert_eq!(detached.get(), 4);
        // Its clones count together, whichever increments first.
        detached_clone.inc();
        assert_eq!((detached.get(), detached_clone.get()), (5, 5));
    }

    #[test]
    fn an_unused_lazy_counter_allocates_nothing() {
        // Its size is what a component pays per error type or reason: no
        // heap block behind it until the first increment.
        assert!(std::mem::size_of::<LazyCounter>() <= 56);
        let m = Metrics::new();
        let a = m.component("p1", "source", "in", "file");
        let c = a.error_counter("read_failed");
        let (metrics, component) = c.home.as_ref().unwrap();
        assert!(Arc::ptr_eq(metrics, &m));
        assert!(Arc::ptr_eq(component, &a.labels.component));
        assert!(c.counter.get().is_none());
    }
}
