//! The agent's own telemetry, sent where the OpAMP server offers
//! (`ConnectionSettingsOffers.own_logs` and `own_metrics`, each an OTLP/HTTP
//! protobuf endpoint with headers and optional TLS settings).
//!
//! - **Logs** run as one more pipeline, [`OWN_LOGS`]: the `internal_logs`
//!   source into the `opentelemetry` sink, built from the offer and put
//!   through the reload machinery like any pipeline. It has the sink's
//!   batching, retries, acknowledgements and counters, and its loop safety
//!   (a failing destination logs, and those records are rate-limited by
//!   the source).
//! - **Metrics**: every `opamp.own_metrics_interval_secs` the registry that
//!   `/metrics` serves is read back ([`petrel_core::exposition`]) and sent
//!   as one `ExportMetricsServiceRequest`, with the HTTP client and TLS
//!   settings of the `opentelemetry` sink. Counters are cumulative
//!   monotonic sums, gauges gauges, histograms explicit-bucket histograms;
//!   the process metrics take the semantic conventions' names
//!   (`process.cpu.time`, `process.memory.usage`). A send that fails is
//!   counted and logged, and the next interval sends the values of then
//!   (cumulative: nothing is lost by skipping one).
//!
//! Both carry the resource the specification asks for: the agent's
//! identifying attributes (`service.name`, `service.version`,
//! `service.instance.id`) and its non-identifying ones.
//!
//! An offer is checked like a remote sink: the host against
//! `limits.destinations`, the type `opentelemetry` against
//! `limits.sink_types`. The server cannot turn verification of the
//! destination's certificate off, nor send through a proxy: such an offer
//! is FAILED, with the reason, in `ConnectionSettingsStatus`. An offered
//! client certificate and authority are written (mode 0600) beside the
//! fleet state and used. `opamp.own_telemetry: false` refuses every offer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use petrel_core::exposition::{Kind, MetricFamily, Sample};
use petrel_core::Metrics;
use petrel_opamp::proto;
use prost::Message;

use super::agent_file::Limits;
use super::OWN_LOGS;
use crate::config::PipelineConfig;
use crate::sinks::tls::Tls;
use crate::topology::Topology;

/// TLS files written from an offer: the authority, and the client
/// certificate with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    /// The offered authority (`tls.ca_pem_contents`).
    pub ca: Option<PathBuf>,
    /// The offered client certificate and key (`certificate`).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// One checked destination.
#[derive(Debug, Clone, PartialEq)]
pub struct Destination {
    /// The OTLP/HTTP URL, path included.
    pub url: reqwest::Url,
    /// Headers of every request.
    pub headers: Vec<(String, String)>,
    /// Client certificate and authority files written from the offer.
    pub tls: Option<TlsFiles>,
}

/// What an offer asks for one kind of telemetry.
#[derive(Debug, Clone, PartialEq)]
pub enum Wanted {
    /// The field was not set: keep what runs.
    Unchanged,
    /// An empty endpoint: stop sending.
    Off,
    /// Send there.
    To(Destination),
}

/// Checks the offered settings of `kind` (`logs`, `metrics`) against the
/// limits, and writes offered certificates under `dir`.
pub fn check(
    kind: &str,
    s: Option<&proto::TelemetryConnectionSettings>,
    limits: &Limits,
    dir: &Path,
) -> Result<Wanted, String> {
    let Some(s) = s else {
        return Ok(Wanted::Unchanged);
    };
    if s.destination_endpoint.is_empty() {
        return Ok(Wanted::Off);
    }
    let url = reqwest::Url::parse(&s.destination_endpoint)
        .map_err(|e| format!("own_{kind}: `{}` is not a URL: {e}", s.destination_endpoint))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "own_{kind}: `{url}` is not an OTLP/HTTP endpoint (http:// or https://)"
        ));
    }
    let host = url.host_str().unwrap_or_default().to_string();
    if !limits.destinations.iter().any(|d| d == "*")
        && !super::limits::host_allowed(&host, &limits.destinations)
    {
        return Err(format!(
            "own_{kind}: sends to `{host}`, which no pattern of `limits.destinations` ({}) in the agent file allows",
            limits.destinations.join(", ")
        ));
    }
    if let Some(types) = &limits.sink_types {
        if !types.iter().any(|t| t == "opentelemetry") {
            return Err(format!(
                "own_{kind}: the agent's telemetry goes through the `opentelemetry` sink, which is not among `limits.sink_types` ({}) in the agent file",
                types.join(", ")
            ));
        }
    }
    if s.proxy.as_ref().is_some_and(|p| !p.url.is_empty()) {
        return Err(format!(
            "own_{kind}: sending through a proxy is not supported; offer a destination the agent reaches directly"
        ));
    }
    let mut headers = Vec::new();
    for h in s.headers.iter().flat_map(|h| &h.headers) {
        if reqwest::header::HeaderName::from_bytes(h.key.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(&h.value).is_err()
        {
            return Err(format!(
                "own_{kind}: header `{}` is not a valid HTTP header",
                h.key
            ));
        }
        headers.push((h.key.clone(), h.value.clone()));
    }
    let mut ca = None;
    if let Some(t) = &s.tls {
        if t.insecure_skip_verify {
            return Err(format!(
                "own_{kind}: the server asks to skip verifying the destination's certificate; the agent does not turn verification off on the server's word (set an authority with `ca_pem_contents` instead)"
            ));
        }
        if !t.ca_pem_contents.is_empty() {
            let p = dir.join(format!("own_{kind}_ca.pem"));
            write_private(&p, t.ca_pem_contents.as_bytes())
                .map_err(|e| format!("own_{kind}: cannot keep the offered authority: {e}"))?;
            ca = Some(p);
        }
    }
    let mut client = None;
    if let Some(c) = &s.certificate {
        if !c.cert.is_empty() || !c.private_key.is_empty() {
            if c.cert.is_empty() || c.private_key.is_empty() {
                return Err(format!(
                    "own_{kind}: the offered client certificate needs both `cert` and `private_key`"
                ));
            }
            let cert = dir.join(format!("own_{kind}_client.pem"));
            let key = dir.join(format!("own_{kind}_client.key"));
            write_private(&cert, &c.cert)
                .and_then(|()| write_private(&key, &c.private_key))
                .map_err(|e| format!("own_{kind}: cannot keep the offered certificate: {e}"))?;
            client = Some((cert, key));
        }
    }
    let tls = (ca.is_some() || client.is_some()).then_some(TlsFiles { ca, client });
    Ok(Wanted::To(Destination { url, headers, tls }))
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The resource attributes of the agent's telemetry: the description's
/// identifying and non-identifying attributes, as strings.
pub fn resource_attributes(d: &proto::AgentDescription) -> Vec<(String, String)> {
    d.identifying_attributes
        .iter()
        .chain(&d.non_identifying_attributes)
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            proto::any_value::Value::StringValue(s) => Some((kv.key.clone(), s.clone())),
            proto::any_value::Value::IntValue(i) => Some((kv.key.clone(), i.to_string())),
            proto::any_value::Value::BoolValue(b) => Some((kv.key.clone(), b.to_string())),
            _ => None,
        })
        .collect()
}

/// The own-logs pipeline file for `d`: `internal_logs` into
/// `opentelemetry`. Written as JSON, which is YAML, so that no offered
/// value can change its structure.
pub fn logs_pipeline(d: &Destination, resource: &[(String, String)]) -> String {
    let mut sink = serde_json::json!({
        "type": "opentelemetry",
        "id": "own_logs",
        "endpoint": d.url.as_str(),
        "protocol": "http",
        "headers": d.headers.iter().cloned().collect::<BTreeMap<String, String>>(),
        "resource": resource.iter().cloned().collect::<BTreeMap<String, String>>(),
        "batch": {"timeout_ms": 1000},
    });
    if let Some(TlsFiles { ca, client }) = &d.tls {
        let mut tls = serde_json::Map::new();
        if let Some(ca) = ca {
            tls.insert("ca_file".into(), ca.display().to_string().into());
        }
        if let Some((cert, key)) = client {
            tls.insert("cert_file".into(), cert.display().to_string().into());
            tls.insert("key_file".into(), key.display().to_string().into());
        }
        sink["tls"] = tls.into();
    }
    let p = serde_json::json!({
        "sources": [{"type": "internal_logs", "id": "agent"}],
        "sinks": [sink],
    });
    let mut text = String::from(
        "# Made by the agent from the OpAMP server's own_logs offer; replaced at each offer.\n",
    );
    text.push_str(&serde_json::to_string_pretty(&p).unwrap_or_default());
    text.push('\n');
    text
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_string())),
        }),
        ..Default::default()
    }
}

fn attributes(s: &Sample, skip: &str) -> Vec<KeyValue> {
    s.labels
        .iter()
        .filter(|(k, _)| k != skip)
        .map(|(k, v)| kv(k, v))
        .collect()
}

fn number(v: f64) -> number_data_point::Value {
    // Counts are integers in the registry; OTLP keeps them exact as ints.
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        number_data_point::Value::AsInt(v as i64)
    } else {
        number_data_point::Value::AsDouble(v)
    }
}

/// The semantic conventions' name, unit and kind of the process metrics.
fn semconv(name: &str) -> Option<(&'static str, &'static str, bool)> {
    match name {
        "process_cpu_seconds" => Some(("process.cpu.time", "s", true)),
        "process_resident_memory_bytes" => Some(("process.memory.usage", "By", false)),
        _ => None,
    }
}

fn metric(f: &MetricFamily, start: u64, now: u64) -> Option<Metric> {
    let point = |s: &Sample| NumberDataPoint {
        attributes: attributes(s, ""),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number(s.value)),
        ..Default::default()
    };
    let (name, unit) = match semconv(&f.name) {
        Some((n, u, _)) => (n.to_string(), u.to_string()),
        None => (f.name.clone(), String::new()),
    };
    let data = match (f.kind, semconv(&f.name)) {
        (_, Some((_, _, monotonic))) => metric::Data::Sum(Sum {
            data_points: f.samples.iter().map(point).collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: monotonic,
        }),
        (Kind::Counter, None) => metric::Data::Sum(Sum {
            data_points: f
                .samples
                .iter()
                .filter(|s| !s.name.ends_with("_created"))
                .map(point)
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        (Kind::Histogram, None) => metric::Data::Histogram(Histogram {
            data_points: histogram_points(f, start, now),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
        (Kind::Gauge | Kind::Other, None) => metric::Data::Gauge(Gauge {
            data_points: f.samples.iter().map(point).collect(),
        }),
    };
    let empty = match &data {
        metric::Data::Sum(s) => s.data_points.is_empty(),
        metric::Data::Gauge(g) => g.data_points.is_empty(),
        metric::Data::Histogram(h) => h.data_points.is_empty(),
        _ => false,
    };
    (!empty).then(|| Metric {
        name,
        description: f.help.clone(),
        unit,
        data: Some(data),
        ..Default::default()
    })
}

/// One data point per label set: the cumulative `_bucket` counts become
/// OTLP's per-bucket counts.
/// One histogram series: its buckets (upper bound, cumulative count), sum
/// and count.
type Series = (Vec<(f64, f64)>, f64, f64);

fn histogram_points(f: &MetricFamily, start: u64, now: u64) -> Vec<HistogramDataPoint> {
    let mut series: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
    for s in &f.samples {
        let key: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        let e = series.entry(key).or_default();
        if s.name.ends_with("_bucket") {
            let le = match s.label("le") {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or(f64::INFINITY),
            };
            e.0.push((le, s.value));
        } else if s.name.ends_with("_sum") {
            e.1 = s.value;
        } else if s.name.ends_with("_count") {
            e.2 = s.value;
        }
    }
    series
        .into_iter()
        .map(|(labels, (mut buckets, sum, count))| {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut bounds = Vec::new();
            let mut counts = Vec::new();
            let mut below = 0.0;
            for (le, cumulative) in &buckets {
                if le.is_finite() {
                    bounds.push(*le);
                }
                counts.push((cumulative - below).max(0.0) as u64);
                below = *cumulative;
            }
            if buckets.last().is_none_or(|(le, _)| le.is_finite()) {
                // No +Inf bucket written: the rest of the count is above
                // the last bound.
                counts.push((count - below).max(0.0) as u64);
            }
            HistogramDataPoint {
                attributes: labels.iter().map(|(k, v)| kv(k, v)).collect(),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: count as u64,
                sum: Some(sum),
                bucket_counts: counts,
                explicit_bounds: bounds,
                ..Default::default()
            }
        })
        .collect()
}

/// The registry's exposition `text` as one OTLP metrics request.
pub fn metrics_request(
    text: &str,
    resource: &[(String, String)],
    start_unix_nanos: u64,
    now_unix_nanos: u64,
) -> ExportMetricsServiceRequest {
    let metrics = petrel_core::exposition::parse_families(text)
        .iter()
        .filter_map(|f| metric(f, start_unix_nanos, now_unix_nanos))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| kv(k, v)).collect(),
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "petrel".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// The running metrics exporter.
pub struct MetricsExporter {
    /// Where it sends.
    pub destination: Destination,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsExporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts sending the agent's metrics to `d` every `interval`.
pub fn start_metrics(
    d: Destination,
    resource: Vec<(String, String)>,
    interval: Duration,
    metrics: Arc<Metrics>,
    start_unix_nanos: u64,
    rt: &tokio::runtime::Handle,
) -> anyhow::Result<MetricsExporter> {
    let mut tls = Tls {
        verify: true,
        ..Tls::default()
    };
    if let Some(TlsFiles { ca, client }) = &d.tls {
        tls.ca_file = ca.clone();
        if let Some((cert, key)) = client {
            tls.cert_file = Some(cert.clone());
            tls.key_file = Some(key.clone());
        }
    }
    let owner = crate::tls::Owner {
        component: "opamp/own_metrics".into(),
        metrics: Some(metrics.clone()),
    };
    let timeout = interval.min(Duration::from_secs(30));
    let client = crate::sinks::client::build_client(&tls, timeout, &owner)?;
    let failures = metrics.named_counters(
        "opamp_own_metrics_failures",
        "Sends of the agent's own metrics to the OpAMP-offered destination that failed, by reason",
    );
    let sent = metrics.named_counters(
        "opamp_own_metrics_sent",
        "Sends of the agent's own metrics to the OpAMP-offered destination that succeeded",
    );
    let url = d.url.clone();
    let headers = d.headers.clone();
    let task = rt.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let body = metrics_request(&metrics.render(), &resource, start_unix_nanos, now)
                .encode_to_vec();
            let mut rb = client
                .post(url.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
                .body(body);
            for (k, v) in &headers {
                rb = rb.header(k.as_str(), v.as_str());
            }
            let outcome = match rb.send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(("status", format!("answered HTTP {}", r.status().as_u16()))),
                Err(e) => Err(("connection", e.to_string())),
            };
            match outcome {
                Ok(()) => {
                    sent.get_or_create(&Vec::new()).inc();
                    if failing {
                        tracing::info!(url = %url, "own metrics are delivered again");
                    }
                    failing = false;
                }
                Err((reason, why)) => {
                    failures
                        .get_or_create(&vec![("reason".to_string(), reason.to_string())])
                        .inc();
                    // Logged when it starts failing, not every interval:
                    // the counter has the rest.
                    if !failing {
                        tracing::warn!(url = %url, "cannot send the agent's own metrics (the next interval tries again with the values of then): {why}");
                    }
                    failing = true;
                }
            }
        }
    });
    Ok(MetricsExporter {
        destination: d,
        task,
    })
}

/// What runs of the agent's own telemetry.
#[derive(Default)]
pub struct Own {
    /// The hash of the last connection settings applied or refused.
    hash: Vec<u8>,
    /// The own-logs pipeline and its destination.
    logs: Option<(Destination, PipelineConfig)>,
    /// The metrics exporter.
    metrics: Option<MetricsExporter>,
}

impl super::Fleet {
    /// The own-logs pipeline, to keep across a local reload.
    pub(super) fn own_logs_pipeline(&self) -> Option<PipelineConfig> {
        self.own.logs.as_ref().map(|(_, p)| p.clone())
    }

    fn own_status(&mut self, hash: Vec<u8>, result: Result<(), String>) {
        let (status, error) = match &result {
            Ok(()) => (proto::ConnectionSettingsStatuses::Applied, String::new()),
            Err(e) => (proto::ConnectionSettingsStatuses::Failed, e.clone()),
        };
        if let Err(e) = &result {
            self.counters
                .refused
                .get_or_create(&super::label("reason", "own_telemetry"))
                .inc();
            tracing::warn!(
                "own-telemetry settings of the OpAMP server refused; what ran before goes on: {e}"
            );
        }
        self.own.hash = hash.clone();
        {
            let mut v = self.view.lock();
            let mut to = Vec::new();
            if let Some((d, _)) = &self.own.logs {
                to.push(format!("logs → {}", d.url));
            }
            if let Some(m) = &self.own.metrics {
                to.push(format!("metrics → {}", m.destination.url));
            }
            v.own_telemetry = to.join(", ");
            v.own_telemetry_status = if result.is_ok() { "APPLIED" } else { "FAILED" }.into();
            v.own_telemetry_error = error.clone();
        }
        self.reporter
            .set_connection_settings_status(proto::ConnectionSettingsStatus {
                last_connection_settings_hash: hash,
                status: status as i32,
                error_message: error,
            });
    }

    /// Applies the server's own-telemetry destinations: both or neither
    /// (an offer that breaks a limit, or whose logs pipeline cannot start,
    /// changes nothing).
    pub(super) fn apply_connection_settings(
        &mut self,
        offers: proto::ConnectionSettingsOffers,
        topo: &mut Topology,
    ) {
        if !offers.hash.is_empty() && offers.hash == self.own.hash {
            return;
        }
        if offers.opamp.is_some() || !offers.other_connections.is_empty() {
            tracing::info!("the OpAMP server offered settings for its own connection or other connections; the agent keeps those of its agent file");
        }
        if offers.own_traces.is_some() {
            tracing::info!(
                "the OpAMP server offered an own_traces destination; the agent makes no traces"
            );
        }
        if offers.own_logs.is_none() && offers.own_metrics.is_none() {
            return self.own_status(offers.hash, Ok(()));
        }
        if !self.settings.own_telemetry {
            return self.own_status(
                offers.hash,
                Err("the agent file sets `opamp.own_telemetry: false`: the agent sends its own logs and metrics nowhere".into()),
            );
        }
        let dir = self.store.root.join("own-telemetry");
        let logs = check("logs", offers.own_logs.as_ref(), &self.file.limits, &dir);
        let metrics = check(
            "metrics",
            offers.own_metrics.as_ref(),
            &self.file.limits,
            &dir,
        );
        let (logs, metrics) = match (logs, metrics) {
            (Ok(l), Ok(m)) => (l, m),
            (l, m) => {
                let why: Vec<String> = [l.err(), m.err()].into_iter().flatten().collect();
                return self.own_status(offers.hash, Err(why.join("; ")));
            }
        };
        let resource = resource_attributes(&self.description());
        // Started first, kept only if the logs pipeline starts too.
        let new_metrics = match metrics {
            Wanted::To(d) if self.own.metrics.as_ref().map(|m| &m.destination) != Some(&d) => {
                let Some(rt) = self.rt.clone() else {
                    return self
                        .own_status(offers.hash, Err("the OpAMP client is not running".into()));
                };
                match start_metrics(
                    d,
                    resource.clone(),
                    self.settings.own_metrics_interval,
                    self.metrics.clone(),
                    self.started_unix_nanos,
                    &rt,
                ) {
                    Ok(m) => Some(Some(m)),
                    Err(e) => {
                        return self.own_status(offers.hash, Err(format!("own_metrics: {e:#}")))
                    }
                }
            }
            Wanted::Off => Some(None),
            _ => None,
        };
        let new_logs = match logs {
            Wanted::To(d) if self.own.logs.as_ref().map(|(o, _)| o) != Some(&d) => {
                let path = dir.join(format!("{OWN_LOGS}.yaml"));
                let text = logs_pipeline(&d, &resource);
                if let Err(e) = std::fs::create_dir_all(&dir)
                    .and_then(|()| std::fs::write(&path, text.as_bytes()))
                {
                    return self.own_status(
                        offers.hash,
                        Err(format!("own_logs: cannot write {}: {e}", path.display())),
                    );
                }
                match crate::config::load_file_as(&path, "opamp/own_logs.yaml".into()) {
                    Ok(p) => Some(Some((d, p))),
                    Err(errs) => {
                        let why: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
                        return self
                            .own_status(offers.hash, Err(format!("own_logs: {}", why.join("; "))));
                    }
                }
            }
            Wanted::Off => Some(None),
            _ => None,
        };
        if let Some(l) = new_logs {
            let mut set: Vec<PipelineConfig> = topo
                .configs()
                .into_iter()
                .filter(|p| p.name != OWN_LOGS)
                .collect();
            if let Some((_, p)) = &l {
                set.push(p.clone());
            }
            match topo.apply(set) {
                Ok(applied) => {
                    if let Some((_, why)) = applied.failed.iter().find(|(n, _)| n == OWN_LOGS) {
                        // Whatever ran before stays (the reload keeps a
                        // pipeline's previous version when the new one
                        // cannot start).
                        return self.own_status(
                            offers.hash,
                            Err(format!("own_logs: the pipeline cannot be started: {why}")),
                        );
                    }
                }
                Err(e) => return self.own_status(offers.hash, Err(format!("own_logs: {e:#}"))),
            }
            self.own.logs = l;
            self.refresh_effective(topo);
        }
        if let Some(m) = new_metrics {
            self.own.metrics = m;
        }
        tracing::info!(
            logs = %self.own.logs.as_ref().map_or("none".to_string(), |(d, _)| d.url.to_string()),
            metrics = %self.own.metrics.as_ref().map_or("none".to_string(), |m| m.destination.url.to_string()),
            "own telemetry goes where the OpAMP server offered"
        );
        self.own_status(offers.hash, Ok(()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> proto::TelemetryConnectionSettings {
        proto::TelemetryConnectionSettings {
            destination_endpoint: url.into(),
            ..Default::default()
        }
    }

    #[test]
    fn offers_are_checked_against_the_limits() {
        let dir = tempfile::tempdir().unwrap();
        let mut limits = Limits {
            destinations: vec!["*.example.com".into()],
            ..Limits::default()
        };
        let ok = settings("https://otlp.example.com:4318/v1/logs");
        assert!(matches!(
            check("logs", Some(&ok), &limits, dir.path()),
            Ok(Wanted::To(_))
        ));
        let far = settings("https://evil.test/v1/logs");
        let e = check("logs", Some(&far), &limits, dir.path()).unwrap_err();
        assert!(e.contains("limits.destinations"), "{e}");
        assert_eq!(
            check("logs", None, &limits, dir.path()),
            Ok(Wanted::Unchanged)
        );
        assert_eq!(
            check("logs", Some(&settings("")), &limits, dir.path()),
            Ok(Wanted::Off)
        );
        let mut insecure = ok.clone();
        insecure.tls = Some(proto::TlsConnectionSettings {
            insecure_skip_verify: true,
            ..Default::default()
        });
        let e = check("logs", Some(&insecure), &limits, dir.path()).unwrap_err();
        assert!(e.contains("verif"), "{e}");
        limits.sink_types = Some(vec!["kafka".into()]);
        let e = check("metrics", Some(&ok), &limits, dir.path()).unwrap_err();
        assert!(e.contains("limits.sink_types"), "{e}");
    }

    #[test]
    fn a_hostile_value_cannot_change_the_pipeline() {
        let d = Destination {
            url: reqwest::Url::parse("http://127.0.0.1:1/v1/logs").unwrap(),
            headers: vec![("X-A".into(), "\"}\nsources: [{type: exec}]".into())],
            tls: None,
        };
        let text = logs_pipeline(&d, &[("service.name".into(), "petrel".into())]);
        let v: serde_json::Value = serde_json::from_str(text.split_once('\n').unwrap().1).unwrap();
        assert_eq!(v["sources"].as_array().unwrap().len(), 1);
        assert_eq!(v["sources"][0]["type"], "internal_logs");
        assert_eq!(
            v["sinks"][0]["headers"]["X-A"],
            "\"}\nsources: [{type: exec}]"
        );
    }

    #[test]
    fn the_registry_becomes_otlp_metrics() {
        let text = "# HELP petrel_component_sent_events Events sent.\n# TYPE petrel_component_sent_events counter\npetrel_component_sent_events_total{pipeline=\"p\"} 12\n# TYPE petrel_memory_used_bytes gauge\npetrel_memory_used_bytes 1.5\n# TYPE petrel_lat_seconds histogram\npetrel_lat_seconds_sum{p=\"a\"} 0.75\npetrel_lat_seconds_count{p=\"a\"} 3\npetrel_lat_seconds_bucket{p=\"a\",le=\"0.1\"} 1\npetrel_lat_seconds_bucket{p=\"a\",le=\"1.0\"} 3\npetrel_lat_seconds_bucket{p=\"a\",le=\"+Inf\"} 3\n# HELP process_cpu_seconds CPU.\n# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 0.25\n# EOF\n";
        let r = metrics_request(text, &[("service.name".into(), "petrel".into())], 1, 2);
        let m = &r.resource_metrics[0].scope_metrics[0].metrics;
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "petrel_component_sent_events",
                "petrel_memory_used_bytes",
                "petrel_lat_seconds",
                "process.cpu.time"
            ]
        );
        let Some(metric::Data::Sum(s)) = &m[0].data else {
            panic!("{:?}", m[0])
        };
        assert!(s.is_monotonic);
        assert_eq!(
            s.data_points[0].value,
            Some(number_data_point::Value::AsInt(12))
        );
        assert_eq!(s.data_points[0].attributes[0].key, "pipeline");
        let Some(metric::Data::Histogram(h)) = &m[2].data else {
            panic!("{:?}", m[2])
        };
        assert_eq!(h.data_points[0].explicit_bounds, vec![0.1, 1.0]);
        assert_eq!(h.data_points[0].bucket_counts, vec![1, 2, 0]);
        assert_eq!(h.data_points[0].count, 3);
        assert_eq!(m[3].unit, "s");
        assert_eq!(
            r.resource_metrics[0].resource.as_ref().unwrap().attributes[0].key,
            "service.name"
        );
    }
}
