//! `type: opentelemetry` — sends events as OTLP logs, over HTTP
//! (protobuf or JSON) or gRPC.
//!
//! Each event becomes one `LogRecord`, encoded on the processing pool:
//! the message is the body, the parsed time `time_unix_nano`, the encode
//! time `observed_time_unix_nano`, a `level` (or `severity`) field gives
//! the severity text and number, and the other fields become attributes
//! (objects as key-value lists, arrays as array values, numbers and
//! booleans typed). The resource is built from the batch's metadata per
//! the semantic conventions (`host.name`, `k8s.*`, `container.id`,
//! `log.file.path`), a `service` field (`service.name`) and the
//! configured `resource:`. Events read by the `opentelemetry` source
//! carry their original resource, scope and record fields (see
//! [`crate::sources::opentelemetry`]) and are sent back exactly.
//!
//! A record is kept in the encoded payload as `varint len, ResourceLogs
//! (resource and schema url only), varint len, ScopeLogs (scope and schema
//! url only), LogRecord, b'\n'`: at send time the records of a request are
//! grouped by resource and scope and their bytes concatenated into an
//! `ExportLogsServiceRequest` without decoding them. Requests are batched,
//! sent, retried and acknowledged by the driver ([`super::driver`]).
//!
//! Answers: success delivered (`partial_success.rejected_log_records`
//! counted as discarded, reason `rejected`, and logged); HTTP 429, 502,
//! 503, 504, gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED,
//! DEADLINE_EXCEEDED, CANCELLED, OUT_OF_RANGE, DATA_LOSS and connection
//! errors retried with backoff (`Retry-After` honoured); 401, 403, 404
//! (gRPC UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED) held and
//! retried loudly; anything else refuses some record: the request is split
//! until the refused records are alone, and those go to `dead_letter`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use petrel_core::config::Map;
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, Event, EventBatch, Value};
use prost::encoding::{decode_varint, encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};

use super::client::{failed_answer, unanswered};
use super::driver::{
    self, Answer, Batch, Compression, DeadRecord, Framing, RequestSink, Selection, Settings,
    Wording,
};
use super::http::parse_headers;
use super::tls::{parse_tls, Tls};

/// Keys accepted by the opentelemetry sink.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "endpoint",
    "protocol",
    "encoding",
    "compression",
    "headers",
    "tls",
    "resource",
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
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"OTLP logs over HTTP (protobuf or JSON) or gRPC: each event becomes one `LogRecord`, with resource attributes derived from the sources' metadata. Cargo feature `opentelemetry` (default)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "endpoint",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required. `protocol: http`: the full URL, path included (`.../v1/logs`); `grpc`: the server's URL (`http://host:4317`, `https://` for TLS)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "protocol",
        kind: petrel_core::plugin::KeyKind::OneOf(&["http", "grpc"]),
        default: Some(r#"http"#),
        doc: r#"`http` (POST) or `grpc` (`LogsService/Export`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "encoding",
        kind: petrel_core::plugin::KeyKind::OneOf(&["protobuf", "json"]),
        default: Some(r#"protobuf"#),
        doc: r#"HTTP only: `application/x-protobuf`, or `application/json` (the OTLP JSON mapping)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "compression",
        kind: petrel_core::plugin::KeyKind::OneOf(&["none", "gzip"]),
        default: Some(r#"none"#),
        doc: r#"`gzip`: HTTP `Content-Encoding` or gRPC message compression."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "headers",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{}"#),
        doc: r#"Extra HTTP headers, or gRPC metadata; `${ENV}` and `${ENV:-default}` expanded at load."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "tls",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"Servers are verified against Mozilla's roots; `ca_file`, `cert_file` + `key_file`, `verify: false` (HTTP only), as for the `elasticsearch` sink."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "resource",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{}"#),
        doc: r#"Resource attributes added to every derived resource."#,
    },
    crate::sinks::http::batch_doc(r#"{max_bytes: 1MiB, max_events: 10000, timeout_ms: 1000}"#),
    crate::sinks::http::timeout_doc(r#"30000"#),
    crate::sinks::http::max_in_flight_doc(r#"16"#),
    crate::sinks::http::DEAD_LETTER_DOC,
    crate::sinks::http::RETRY_DOC,
    super::METADATA_DOC,
    super::ONLY_FIELDS_DOC,
    super::EXCEPT_FIELDS_DOC,
    super::TIMESTAMP_FORMAT_DOC,
    super::TIMESTAMP_KEY_DOC,
];

/// Event fields through which the `opentelemetry` source hands over what
/// an OTLP record carries besides its body and time; this sink reads them
/// back, so OTLP in, OTLP out loses nothing.
pub(crate) mod fields {
    /// Object: the resource's attributes.
    pub const RESOURCE: &str = "resource";
    /// Text: the resource's schema URL.
    pub const RESOURCE_SCHEMA_URL: &str = "resource_schema_url";
    /// Object: `name`, `version`, `attributes` (object),
    /// `dropped_attributes_count` of the instrumentation scope.
    pub const SCOPE: &str = "scope";
    /// Text: the scope's schema URL.
    pub const SCOPE_SCHEMA_URL: &str = "scope_schema_url";
    /// Object: the record's attributes.
    pub const ATTRIBUTES: &str = "attributes";
    /// Text, 32 hex digits.
    pub const TRACE_ID: &str = "trace_id";
    /// Text, 16 hex digits.
    pub const SPAN_ID: &str = "span_id";
    /// Integer: the trace flags.
    pub const FLAGS: &str = "flags";
    /// Text.
    pub const SEVERITY_TEXT: &str = "severity_text";
    /// Integer, 1 to 24.
    pub const SEVERITY_NUMBER: &str = "severity_number";
    /// Integer, nanoseconds since the epoch.
    pub const OBSERVED_TIME: &str = "observed_time_unix_nano";
    /// Integer.
    pub const DROPPED_ATTRIBUTES: &str = "dropped_attributes_count";
    /// Text.
    pub const EVENT_NAME: &str = "event_name";
}

/// How requests travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP: POST to the endpoint URL.
    Http,
    /// OTLP/gRPC: `LogsService/Export`.
    Grpc,
}

/// OTLP/HTTP body encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpEncoding {
    /// `application/x-protobuf`.
    Protobuf,
    /// `application/json`, the OTLP JSON mapping.
    Json,
}

/// Configuration of the opentelemetry sink.
#[derive(Debug, Clone)]
pub struct OtlpSinkConfig {
    /// Full URL (`http`) or the server's base URL (`grpc`).
    pub endpoint: reqwest::Url,
    /// HTTP or gRPC.
    pub protocol: Protocol,
    /// HTTP only.
    pub encoding: OtlpEncoding,
    /// None or gzip.
    pub compression: Compression,
    /// Extra headers (gRPC: metadata), `${ENV}` expanded.
    pub headers: Vec<(String, String)>,
    /// TLS for https endpoints.
    pub tls: Tls,
    /// Resource attributes added to every event's resource.
    pub resource: Vec<(String, String)>,
    /// Largest request before compression.
    pub max_bytes: usize,
    /// Most records per request.
    pub max_events: usize,
    /// Longest wait before a partial request is sent.
    pub linger: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
    /// Upper bound of the congestion window, in requests.
    pub max_in_flight: usize,
    /// Where refused records are written.
    pub dead_letter: Option<std::path::PathBuf>,
    /// When transient failures are given up (into `dead_letter`).
    pub retry: super::driver::RetryLimit,
    /// How the metadata is named (`otel` by default: semantic
    /// conventions, into the resource) and which fields are written.
    pub output: Arc<petrel_core::schema::Output>,
}

impl OtlpSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let protocol = match map.choice("protocol", &["http", "grpc"]) {
            Some("grpc") => Protocol::Grpc,
            Some(_) => Protocol::Http,
            None if map.get("protocol").is_some() => return None,
            None => Protocol::Http,
        };
        let example = match protocol {
            Protocol::Http => "http://127.0.0.1:4318/v1/logs",
            Protocol::Grpc => "http://127.0.0.1:4317",
        };
        let node = map.required("endpoint", example)?;
        let text = node.as_str()?;
        let endpoint = match reqwest::Url::parse(text) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => u,
            Ok(u) => {
                node.error(format!(
                    "`endpoint` must be http:// or https://, found `{}`",
                    u.scheme()
                ));
                return None;
            }
            Err(e) => {
                node.error(format!(
                    "`endpoint` is not a valid URL ({e}): `{text}`; e.g. `{example}`"
                ));
                return None;
            }
        };
        if protocol == Protocol::Http && endpoint.path() == "/" {
            node.error(format!(
                "`endpoint` is the full URL for `protocol: http`, path included, e.g. `{example}`"
            ));
            return None;
        }
        let encoding = match map.choice("encoding", &["protobuf", "json"]) {
            Some("json") => OtlpEncoding::Json,
            Some(_) => OtlpEncoding::Protobuf,
            None if map.get("encoding").is_some() => return None,
            None => OtlpEncoding::Protobuf,
        };
        if protocol == Protocol::Grpc && encoding == OtlpEncoding::Json {
            if let Some(n) = map.get("encoding") {
                n.error("`encoding: json` is for `protocol: http`; gRPC always sends protobuf");
            }
            return None;
        }
        let compression = match map.choice("compression", &["none", "gzip"]) {
            Some("gzip") => Compression::Gzip,
            Some(_) => Compression::None,
            None if map.get("compression").is_some() => return None,
            None => Compression::None,
        };
        let headers = parse_headers(&map);
        let tls = match map.get("tls") {
            None => Tls {
                verify: true,
                ..Tls::default()
            },
            Some(n) => {
                let t = parse_tls(n)?;
                if protocol == Protocol::Grpc && !t.verify {
                    n.error("`tls.verify: false` is not available with `protocol: grpc`; give the server's authority in `tls.ca_file`");
                    return None;
                }
                t
            }
        };
        let mut resource = Vec::new();
        if let Some(n) = map.get("resource") {
            match n.as_map_quiet() {
                Some(m) => {
                    for (k, v) in m.entries() {
                        if let Some(value) = v.as_str() {
                            resource.push((k.to_string(), value.to_string()));
                        }
                    }
                }
                None => n.error(
                    "`resource` must be a mapping of attributes, e.g. `{ service.name: checkout }`",
                ),
            }
        }
        let (max_bytes, max_events, linger) =
            super::http::parse_batch(&map, (1 << 20, 10_000, 1000));
        let dead_letter = super::http::parse_dead_letter(&map, "/var/lib/petrel/otlp-dead.ndjson")?;
        let retry = super::http::parse_retry(&map, &dead_letter)?;
        let output = Arc::new(super::parse_output_for(
            &map,
            true,
            petrel_core::schema::Layout::Otel,
        )?);
        Some(Self {
            output,
            endpoint,
            protocol,
            encoding,
            compression,
            headers,
            tls,
            resource,
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

// ---------------------------------------------------------------------
// Mapping events to records.

/// The OTLP severity number of a level name (`0`: unknown).
pub fn severity_number(level: &str) -> i32 {
    let l = level.trim();
    let eq = |s: &str| l.eq_ignore_ascii_case(s);
    if eq("trace") {
        1
    } else if eq("debug") || eq("dbg") {
        5
    } else if eq("info") || eq("informational") || eq("information") {
        9
    } else if eq("notice") {
        10
    } else if eq("warn") || eq("warning") {
        13
    } else if eq("error") || eq("err") {
        17
    } else if eq("crit") || eq("critical") {
        18
    } else if eq("alert") {
        19
    } else if eq("fatal") || eq("emerg") || eq("emergency") || eq("panic") {
        21
    } else {
        0
    }
}

fn string_value(s: String) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s)),
    }
}

/// `b` as a string; invalid UTF-8 replaced (the fast check first: most
/// text is valid).
fn utf8(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

fn text(batch: &EventBatch, v: &Value) -> Option<String> {
    match v {
        Value::Str(s) => Some(s.to_string()),
        Value::Span(_) => batch.bytes_of(v).map(utf8),
        _ => None,
    }
}

/// The OTLP value of a field value.
pub fn any_value(batch: &EventBatch, v: &Value) -> AnyValue {
    use any_value::Value as V;
    let value = match v {
        Value::Str(s) => Some(V::StringValue(s.to_string())),
        Value::Span(_) => Some(V::StringValue(utf8(batch.bytes_of(v).unwrap_or_default()))),
        Value::Bytes(b) => Some(V::BytesValue(b.to_vec())),
        Value::Int(i) => Some(V::IntValue(*i)),
        Value::Float(f) => Some(V::DoubleValue(*f)),
        Value::Bool(b) => Some(V::BoolValue(*b)),
        Value::Null => None,
        Value::Array(a) => Some(V::ArrayValue(ArrayValue {
            values: a.iter().map(|x| any_value(batch, x)).collect(),
        })),
        Value::Object(o) => Some(V::KvlistValue(KeyValueList {
            values: key_values(batch, o),
        })),
    };
    AnyValue { value }
}

fn key_values(batch: &EventBatch, o: &[(petrel_core::event::Key, Value)]) -> Vec<KeyValue> {
    o.iter()
        .map(|(k, v)| KeyValue {
            key: k.to_string(),
            value: Some(any_value(batch, v)),
            ..Default::default()
        })
        .collect()
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// What an event's resource and scope depend on, besides its batch.
#[derive(Default)]
struct Grouping<'a> {
    resource: Option<&'a [(petrel_core::event::Key, Value)]>,
    resource_schema_url: Option<&'a Value>,
    scope: Option<&'a [(petrel_core::event::Key, Value)]>,
    scope_schema_url: Option<&'a Value>,
    service: Option<&'a Value>,
}

/// Maps events to records. Separate from the sink so that tests can run
/// it alone.
pub struct Mapper {
    resource: Vec<(String, String)>,
    output: Arc<petrel_core::schema::Output>,
}

impl Mapper {
    /// A mapper adding `resource` to every derived resource, with the
    /// metadata named and selected as `output` says (in the resource).
    pub fn new(resource: Vec<(String, String)>, output: Arc<petrel_core::schema::Output>) -> Self {
        Self { resource, output }
    }

    /// The resource of an event `ev` of `batch` without a `resource`
    /// field: the batch's metadata as the event has it, in the output's
    /// names (semantic conventions by default, as the Collector's
    /// `k8sattributes` and `filelog` put them), then `resource:`.
    fn derived_resource(
        &self,
        plan: &petrel_core::schema::Plan<'_>,
        batch: &EventBatch,
        ev: &Event,
        service: Option<String>,
    ) -> Resource {
        let mut attrs: Vec<KeyValue> = Vec::new();
        let put = |attrs: &mut Vec<KeyValue>, k: &str, v: String| {
            if let Some(slot) = attrs.iter_mut().find(|kv| kv.key == k) {
                slot.value = Some(string_value(v));
            } else {
                attrs.push(KeyValue {
                    key: k.to_string(),
                    value: Some(string_value(v)),
                    ..Default::default()
                });
            }
        };
        plan.for_each_meta(batch, ev, |name, value, resource| {
            if !resource {
                return;
            }
            let v = match value {
                petrel_core::schema::MetaValue::Text(t) => string_value(t.to_string()),
                petrel_core::schema::MetaValue::Own(v) => any_value(batch, v),
            };
            if let Some(slot) = attrs.iter_mut().find(|kv| kv.key == name) {
                slot.value = Some(v);
            } else {
                attrs.push(KeyValue {
                    key: name,
                    value: Some(v),
                    ..Default::default()
                });
            }
        });
        for (k, v) in &self.resource {
            put(&mut attrs, k, v.clone());
        }
        if let Some(s) = service {
            put(&mut attrs, "service.name", s);
        }
        Resource {
            attributes: attrs,
            ..Default::default()
        }
    }

    /// Appends one record per event of `batch` to `out`.
    pub fn encode(&self, batch: &EventBatch, out: &mut Encoded, now: u64) {
        // The resource and scope headers of the previous event: most
        // events of a batch share them.
        let mut last_key: Option<(Option<Value>, Option<Value>, Option<Value>)> = None;
        let mut header: Vec<u8> = Vec::new();
        let plan = self.output.plan(&batch.source);
        for ev in &batch.events {
            let g = grouping(ev);
            // Events from the opentelemetry source carry their resource
            // and scope; they are encoded per event (rare to be mixed), as
            // are events whose metadata a processor changed.
            let simple = g.resource.is_none()
                && g.scope.is_none()
                && ev.hidden.is_empty()
                && !ev
                    .fields
                    .iter()
                    .any(|(k, _)| batch.source.find(k).is_some());
            let key = (
                g.service.cloned(),
                g.resource_schema_url.cloned(),
                g.scope_schema_url.cloned(),
            );
            if !simple || last_key.as_ref() != Some(&key) {
                header.clear();
                let resource = match g.resource {
                    Some(attrs) => Resource {
                        attributes: key_values(batch, attrs),
                        ..Default::default()
                    },
                    None => self.derived_resource(
                        &plan,
                        batch,
                        ev,
                        g.service.and_then(|v| text(batch, v)),
                    ),
                };
                let rl = ResourceLogs {
                    resource: Some(resource),
                    scope_logs: Vec::new(),
                    schema_url: g
                        .resource_schema_url
                        .and_then(|v| text(batch, v))
                        .unwrap_or_default(),
                };
                let sl = ScopeLogs {
                    scope: g.scope.map(|s| scope(batch, s)),
                    log_records: Vec::new(),
                    schema_url: g
                        .scope_schema_url
                        .and_then(|v| text(batch, v))
                        .unwrap_or_default(),
                };
                encode_varint(rl.encoded_len() as u64, &mut header);
                rl.encode_raw(&mut header);
                encode_varint(sl.encoded_len() as u64, &mut header);
                sl.encode_raw(&mut header);
                last_key = if simple { Some(key) } else { None };
            }
            out.bytes.extend_from_slice(&header);
            write_record(
                &plan,
                batch,
                ev,
                &g,
                now,
                &mut out.bytes,
                &mut out.invalid_utf8,
            );
            // A sentinel: the request builder strips one trailing newline
            // from every record.
            out.bytes.push(b'\n');
            out.record_ends.push(out.bytes.len() as u32);
        }
    }
}

/// What the resource and scope of `ev` depend on: the fields that
/// [`write_record`] leaves out of the record for them.
fn grouping(ev: &Event) -> Grouping<'_> {
    use fields::*;
    let mut g = Grouping::default();
    let is_text = |v: &Value| matches!(v, Value::Str(_) | Value::Span(_));
    let mut service = None;
    let mut has_resource = false;
    for (k, v) in &ev.fields {
        match (k.as_ref(), v) {
            (RESOURCE, Value::Object(o)) => {
                g.resource = Some(o);
                has_resource = true;
            }
            (SCOPE, Value::Object(o)) => g.scope = Some(o),
            (RESOURCE_SCHEMA_URL, _) if is_text(v) => g.resource_schema_url = Some(v),
            (SCOPE_SCHEMA_URL, _) if is_text(v) => g.scope_schema_url = Some(v),
            ("service", _) if is_text(v) => service = Some(v),
            _ => {}
        }
    }
    // An event with its own resource (from the opentelemetry source)
    // keeps a `service` field as an ordinary attribute.
    if !has_resource {
        g.service = service;
    }
    g
}

/// Writes the `LogRecord` of `ev` (its protobuf fields, without the
/// outer length) to `out`; `g` is its [`grouping`], whose fields are
/// not attributes.
///
/// Written straight from the event's fields: building prost's
/// `LogRecord` first allocated and copied every key and value once
/// more before encoding them, the largest share of this sink's CPU in
/// the profile (BENCHMARKS.md §22). The resource and scope headers,
/// once per group, still go through prost.
fn write_record(
    plan: &petrel_core::schema::Plan<'_>,
    batch: &EventBatch,
    ev: &Event,
    g: &Grouping<'_>,
    now: u64,
    out: &mut Vec<u8>,
    invalid_utf8: &mut u64,
) {
    use fields::*;
    use wire::*;
    if !matches!(ev.message, Value::Null) && plan.message_selected() {
        write_any_value_field(out, 5, batch, &ev.message, invalid_utf8);
    }
    // Metadata the Collector keeps on the record (`log.file.path`,
    // `log.iostream`), not in the resource.
    plan.for_each_meta(batch, ev, |name, value, resource| {
        if resource {
            return;
        }
        match value {
            petrel_core::schema::MetaValue::Text(t) => {
                let v = Value::Str(t.into());
                write_key_value(out, 6, batch, &name, &v, invalid_utf8);
            }
            petrel_core::schema::MetaValue::Own(v) => {
                write_key_value(out, 6, batch, &name, v, invalid_utf8)
            }
        }
    });
    let mut observed = now;
    let mut number: i32 = 0;
    let mut severity_text: Option<&Value> = None;
    let mut event_name: Option<&Value> = None;
    let mut dropped: u32 = 0;
    let mut flags: u32 = 0;
    let mut trace_id: Vec<u8> = Vec::new();
    let mut span_id: Vec<u8> = Vec::new();
    let mut level: Option<&Value> = None;
    let has_severity = ev
        .fields
        .iter()
        .any(|(k, _)| k == SEVERITY_TEXT || k == SEVERITY_NUMBER);
    let is_text = |v: &Value| matches!(v, Value::Str(_) | Value::Span(_));
    for (k, v) in &ev.fields {
        let done = match (k.as_ref(), v) {
            // What the resource and scope are made of (`grouping`).
            (RESOURCE | SCOPE, Value::Object(_)) => true,
            (RESOURCE_SCHEMA_URL | SCOPE_SCHEMA_URL, _) if is_text(v) => true,
            ("service", _) if g.service.is_some() && is_text(v) => true,
            (ATTRIBUTES, Value::Object(o)) => {
                for (k, v) in o {
                    write_key_value(out, 6, batch, k, v, invalid_utf8);
                }
                true
            }
            (TRACE_ID | SPAN_ID, _) => match text(batch, v).and_then(|t| hex_bytes(&t)) {
                Some(b) => {
                    if k == TRACE_ID {
                        trace_id = b;
                    } else {
                        span_id = b;
                    }
                    true
                }
                None => false,
            },
            (FLAGS, Value::Int(i)) => {
                flags = *i as u32;
                true
            }
            (SEVERITY_NUMBER, Value::Int(i)) => {
                number = *i as i32;
                true
            }
            (SEVERITY_TEXT, _) if is_text(v) => {
                severity_text = Some(v);
                true
            }
            (OBSERVED_TIME, Value::Int(i)) if *i > 0 => {
                observed = *i as u64;
                true
            }
            (DROPPED_ATTRIBUTES, Value::Int(i)) => {
                dropped = *i as u32;
                true
            }
            (EVENT_NAME, _) if is_text(v) => {
                event_name = Some(v);
                true
            }
            ("level" | "severity", _) if !has_severity && level.is_none() && is_text(v) => {
                level = Some(v);
                true
            }
            _ => false,
        };
        // Own fields that took a metadata entry's place went into the
        // resource with it; fields the output leaves out are not written.
        if !done && plan.own_selected(batch, k) {
            write_key_value(out, 6, batch, k, v, invalid_utf8);
        }
    }
    if let Some(l) = level {
        let l = text_of(batch, l, invalid_utf8);
        number = severity_number(&l);
        write_str(out, 3, &l);
    } else if let Some(t) = severity_text {
        write_str(out, 3, &text_of(batch, t, invalid_utf8));
    }
    if let Some(t) = ev.time_ns.filter(|t| *t > 0) {
        write_fixed64(out, 1, t as u64);
    }
    if observed != 0 {
        write_fixed64(out, 11, observed);
    }
    if number != 0 {
        encode_key(2, WireType::Varint, out);
        // int32: negative numbers sign-extended, as prost does.
        encode_varint(number as u64, out);
    }
    if dropped != 0 {
        encode_key(7, WireType::Varint, out);
        encode_varint(u64::from(dropped), out);
    }
    if flags != 0 {
        encode_key(8, WireType::ThirtyTwoBit, out);
        out.extend_from_slice(&flags.to_le_bytes());
    }
    write_bytes(out, 9, &trace_id);
    write_bytes(out, 10, &span_id);
    if let Some(n) = event_name {
        write_str(out, 12, &text_of(batch, n, invalid_utf8));
    }
}

/// The protobuf wire format written directly, for [`Mapper::write_record`].
mod wire {
    use std::borrow::Cow;

    use petrel_core::{EventBatch, Value};
    use prost::encoding::{encoded_len_varint, WireType};

    /// A varint. prost's `encode_varint` writes through `BufMut` a byte at
    /// a time; a record here writes about a hundred varints (keys, short
    /// lengths), nearly all of one byte, and they were 6.5 % of the agent's
    /// instructions in this sink's profile (cachegrind, BENCHMARKS.md §22):
    /// the one-byte case is inlined, the rest out of line.
    #[inline(always)]
    pub fn encode_varint(v: u64, out: &mut Vec<u8>) {
        if v < 0x80 {
            out.push(v as u8);
        } else {
            encode_long_varint(v, out);
        }
    }

    #[inline(never)]
    fn encode_long_varint(mut v: u64, out: &mut Vec<u8>) {
        let mut buf = [0u8; 10];
        let mut n = 0;
        while v >= 0x80 {
            buf[n] = (v as u8) | 0x80;
            v >>= 7;
            n += 1;
        }
        buf[n] = v as u8;
        out.extend_from_slice(&buf[..=n]);
    }

    /// A field key: the tag and wire type as a varint.
    #[inline(always)]
    pub fn encode_key(tag: u32, wire_type: WireType, out: &mut Vec<u8>) {
        encode_varint(u64::from(tag << 3 | wire_type as u32), out);
    }

    /// A length-delimited field `tag` whose content `f` writes. The length
    /// is written as one byte and widened afterwards when the content is
    /// 128 bytes or more (most keys and values are shorter), so the
    /// content is neither measured first nor built elsewhere.
    pub fn nested(out: &mut Vec<u8>, tag: u32, f: impl FnOnce(&mut Vec<u8>)) {
        encode_key(tag, WireType::LengthDelimited, out);
        let at = out.len();
        out.push(0);
        f(out);
        let len = out.len() - at - 1;
        if len < 0x80 {
            out[at] = len as u8;
        } else {
            let mut prefix = Vec::with_capacity(10);
            encode_varint(len as u64, &mut prefix);
            debug_assert_eq!(prefix.len(), encoded_len_varint(len as u64));
            out.splice(at..at + 1, prefix);
        }
    }

    /// A string or bytes field; an empty one is left out, as prost does.
    pub fn write_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    /// A string field; an empty one is left out.
    pub fn write_str(out: &mut Vec<u8>, tag: u32, s: &str) {
        write_bytes(out, tag, s.as_bytes());
    }

    /// A `fixed64` field.
    pub fn write_fixed64(out: &mut Vec<u8>, tag: u32, v: u64) {
        encode_key(tag, WireType::SixtyFourBit, out);
        out.extend_from_slice(&v.to_le_bytes());
    }

    /// The text of a text value (empty for others), invalid UTF-8
    /// replaced by U+FFFD and counted.
    pub fn text_of<'a>(
        batch: &'a EventBatch,
        v: &'a Value,
        invalid_utf8: &mut u64,
    ) -> Cow<'a, str> {
        match v {
            Value::Str(s) => Cow::Borrowed(s),
            Value::Span(_) => {
                let b = batch.bytes_of(v).unwrap_or_default();
                // simdutf8's check: several times the standard library's
                // on long values, and every value is checked here.
                match simdutf8::basic::from_utf8(b) {
                    Ok(s) => Cow::Borrowed(s),
                    Err(_) => {
                        *invalid_utf8 += 1;
                        String::from_utf8_lossy(b)
                    }
                }
            }
            _ => Cow::Borrowed(""),
        }
    }

    /// A value that is not a list or an object, ready to write: its
    /// length is known before it is written.
    pub enum Scalar<'a> {
        Text(Cow<'a, str>),
        Bytes(&'a [u8]),
        Int(i64),
        Float(f64),
        Bool(bool),
        Null,
    }

    impl Scalar<'_> {
        /// The length of the `AnyValue` fields of this value.
        fn len(&self) -> usize {
            let delimited = |n: usize| 1 + encoded_len_varint(n as u64) + n;
            match self {
                Scalar::Text(s) => delimited(s.len()),
                Scalar::Bytes(b) => delimited(b.len()),
                Scalar::Int(i) => 1 + encoded_len_varint(*i as u64),
                Scalar::Float(_) => 9,
                Scalar::Bool(_) => 2,
                Scalar::Null => 0,
            }
        }

        /// Writes the `AnyValue` fields; a oneof member is written even
        /// when empty or zero.
        fn write(&self, out: &mut Vec<u8>) {
            match self {
                Scalar::Text(s) => {
                    encode_key(1, WireType::LengthDelimited, out);
                    encode_varint(s.len() as u64, out);
                    out.extend_from_slice(s.as_bytes());
                }
                Scalar::Bytes(b) => {
                    encode_key(7, WireType::LengthDelimited, out);
                    encode_varint(b.len() as u64, out);
                    out.extend_from_slice(b);
                }
                Scalar::Int(i) => {
                    encode_key(3, WireType::Varint, out);
                    encode_varint(*i as u64, out);
                }
                Scalar::Float(f) => write_fixed64(out, 4, f.to_bits()),
                Scalar::Bool(b) => {
                    encode_key(2, WireType::Varint, out);
                    encode_varint(u64::from(*b), out);
                }
                Scalar::Null => {}
            }
        }
    }

    /// `v` as a [`Scalar`], or `None` for a list or an object.
    pub fn scalar<'a>(
        batch: &'a EventBatch,
        v: &'a Value,
        invalid_utf8: &mut u64,
    ) -> Option<Scalar<'a>> {
        Some(match v {
            Value::Str(_) | Value::Span(_) => Scalar::Text(text_of(batch, v, invalid_utf8)),
            Value::Bytes(b) => Scalar::Bytes(b),
            Value::Int(i) => Scalar::Int(*i),
            Value::Float(f) => Scalar::Float(*f),
            Value::Bool(b) => Scalar::Bool(*b),
            Value::Null => Scalar::Null,
            Value::Array(_) | Value::Object(_) => return None,
        })
    }

    /// The fields of the `AnyValue` of `v` (`v` itself, typed).
    pub fn write_any_value(
        out: &mut Vec<u8>,
        batch: &EventBatch,
        v: &Value,
        invalid_utf8: &mut u64,
    ) {
        match v {
            Value::Array(a) => nested(out, 5, |o| {
                for x in a {
                    write_any_value_field(o, 1, batch, x, invalid_utf8);
                }
            }),
            Value::Object(kv) => nested(out, 6, |o| {
                for (k, v) in kv {
                    write_key_value(o, 1, batch, k, v, invalid_utf8);
                }
            }),
            _ => {
                if let Some(s) = scalar(batch, v, invalid_utf8) {
                    s.write(out);
                }
            }
        }
    }

    /// The `AnyValue` of `v` as field `tag`: lengths computed for a
    /// scalar (most values), the content widened for lists and objects.
    pub fn write_any_value_field(
        out: &mut Vec<u8>,
        tag: u32,
        batch: &EventBatch,
        v: &Value,
        invalid_utf8: &mut u64,
    ) {
        match scalar(batch, v, invalid_utf8) {
            Some(s) => {
                encode_key(tag, WireType::LengthDelimited, out);
                encode_varint(s.len() as u64, out);
                s.write(out);
            }
            None => nested(out, tag, |o| write_any_value(o, batch, v, invalid_utf8)),
        }
    }

    /// A `KeyValue` as field `tag`.
    pub fn write_key_value(
        out: &mut Vec<u8>,
        tag: u32,
        batch: &EventBatch,
        k: &str,
        v: &Value,
        invalid_utf8: &mut u64,
    ) {
        match scalar(batch, v, invalid_utf8) {
            Some(s) => {
                let key_len = if k.is_empty() {
                    0
                } else {
                    1 + encoded_len_varint(k.len() as u64) + k.len()
                };
                let value_len = s.len();
                let len = key_len + 1 + encoded_len_varint(value_len as u64) + value_len;
                encode_key(tag, WireType::LengthDelimited, out);
                encode_varint(len as u64, out);
                write_str(out, 1, k);
                encode_key(2, WireType::LengthDelimited, out);
                encode_varint(value_len as u64, out);
                s.write(out);
            }
            None => nested(out, tag, |o| {
                write_str(o, 1, k);
                nested(o, 2, |o| write_any_value(o, batch, v, invalid_utf8));
            }),
        }
    }
}

fn scope(batch: &EventBatch, o: &[(petrel_core::event::Key, Value)]) -> InstrumentationScope {
    let mut s = InstrumentationScope::default();
    for (k, v) in o {
        match k.as_ref() {
            "name" => s.name = text(batch, v).unwrap_or_default(),
            "version" => s.version = text(batch, v).unwrap_or_default(),
            "attributes" => {
                if let Value::Object(a) = v {
                    s.attributes = key_values(batch, a);
                }
            }
            "dropped_attributes_count" => s.dropped_attributes_count = int(v).unwrap_or(0) as u32,
            _ => {}
        }
    }
    s
}

// ---------------------------------------------------------------------
// Requests.

/// One record of an encoded payload: its resource and scope headers and
/// the LogRecord bytes.
struct Parts<'a> {
    resource: &'a [u8],
    scope: &'a [u8],
    record: &'a [u8],
}

fn split_record(mut b: &[u8]) -> Option<Parts<'_>> {
    let take = |b: &mut &[u8]| -> Option<usize> {
        let n = decode_varint(b).ok()? as usize;
        (n <= b.len()).then_some(n)
    };
    let n = take(&mut b)?;
    let (resource, rest) = b.split_at(n);
    b = rest;
    let n = take(&mut b)?;
    let (scope, record) = b.split_at(n);
    Some(Parts {
        resource,
        scope,
        record,
    })
}

/// The records of one resource, by scope: (resource header, [(scope
/// header, records)]).
type ResourceGroup<'a> = (&'a [u8], Vec<(&'a [u8], Vec<&'a [u8]>)>);

/// The `ExportLogsServiceRequest` of `records`, grouped by resource and
/// then scope in the order they first occur.
pub fn assemble<'a>(records: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    // resource header -> (scope header -> record list)
    let mut groups: Vec<ResourceGroup<'_>> = Vec::new();
    let mut index: HashMap<&[u8], usize> = HashMap::new();
    // The group of the previous record: most records share it, and
    // comparing is cheaper than hashing.
    let mut last: Option<(&[u8], &[u8], usize, usize)> = None;
    let mut size = 0;
    for r in records {
        let Some(p) = split_record(r) else { continue };
        size += r.len() + 16;
        if let Some((res, scope, gi, si)) = last {
            if res == p.resource && scope == p.scope {
                groups[gi].1[si].1.push(p.record);
                continue;
            }
        }
        let gi = *index.entry(p.resource).or_insert_with(|| {
            groups.push((p.resource, Vec::new()));
            groups.len() - 1
        });
        let scopes = &mut groups[gi].1;
        let si = match scopes.iter().position(|(s, _)| *s == p.scope) {
            Some(si) => si,
            None => {
                scopes.push((p.scope, Vec::new()));
                scopes.len() - 1
            }
        };
        scopes[si].1.push(p.record);
        last = Some((p.resource, p.scope, gi, si));
    }
    let field_len = |n: usize| 1 + encoded_len_varint(n as u64) + n;
    let mut out = Vec::with_capacity(size);
    for (resource, scopes) in &groups {
        let scope_lens: Vec<usize> = scopes
            .iter()
            .map(|(s, recs)| s.len() + recs.iter().map(|r| field_len(r.len())).sum::<usize>())
            .collect();
        let rl_len = resource.len() + scope_lens.iter().map(|&n| field_len(n)).sum::<usize>();
        // ExportLogsServiceRequest.resource_logs = 1
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(rl_len as u64, &mut out);
        out.extend_from_slice(resource);
        for ((scope, recs), len) in scopes.iter().zip(&scope_lens) {
            // ResourceLogs.scope_logs = 2
            encode_key(2, WireType::LengthDelimited, &mut out);
            encode_varint(*len as u64, &mut out);
            out.extend_from_slice(scope);
            for r in recs {
                // ScopeLogs.log_records = 2
                encode_key(2, WireType::LengthDelimited, &mut out);
                encode_varint(r.len() as u64, &mut out);
                out.extend_from_slice(r);
            }
        }
    }
    out
}

/// The OTLP JSON of an encoded request.
pub fn to_json(protobuf: &[u8]) -> anyhow::Result<Vec<u8>> {
    let req = ExportLogsServiceRequest::decode(protobuf)?;
    Ok(serde_json::to_vec(&req)?)
}

/// A record as JSON, for the dead-letter file: its resource logs with the
/// record alone.
fn record_json(record: &[u8]) -> Vec<u8> {
    let body = assemble(std::iter::once(record));
    match ExportLogsServiceRequest::decode(&body[..]) {
        Ok(mut r) if r.resource_logs.len() == 1 => {
            serde_json::to_vec(&r.resource_logs.remove(0)).unwrap_or_default()
        }
        _ => b"\"(undecodable record)\"".to_vec(),
    }
}

/// The number in `partial_success.rejected_log_records` of an answer.
fn rejected_in(body: &[u8], json: bool) -> (i64, String) {
    if json {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let ps = &v["partialSuccess"];
        let n = match &ps["rejectedLogRecords"] {
            serde_json::Value::Number(n) => n.as_i64().unwrap_or(0),
            serde_json::Value::String(s) => s.parse().unwrap_or(0),
            _ => 0,
        };
        (
            n,
            ps["errorMessage"].as_str().unwrap_or_default().to_string(),
        )
    } else {
        match ExportLogsServiceResponse::decode(body) {
            Ok(r) => r
                .partial_success
                .map(|p| (p.rejected_log_records, p.error_message))
                .unwrap_or_default(),
            Err(_) => (0, String::new()),
        }
    }
}

/// `google.rpc.Status` with its `RetryInfo` detail: how a gRPC server says
/// when to try again (the gRPC peer of `Retry-After`).
pub(crate) mod rpc {
    /// `google.rpc.Status`, carried in `grpc-status-details-bin`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        /// The gRPC code.
        #[prost(int32, tag = "1")]
        pub code: i32,
        /// The message.
        #[prost(string, tag = "2")]
        pub message: String,
        /// Typed details.
        #[prost(message, repeated, tag = "3")]
        pub details: Vec<Any>,
    }

    /// `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        /// The type of `value`.
        #[prost(string, tag = "1")]
        pub type_url: String,
        /// The encoded message.
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    /// `google.rpc.RetryInfo`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RetryInfo {
        /// How long to wait.
        #[prost(message, optional, tag = "1")]
        pub retry_delay: Option<Duration>,
    }

    /// `google.protobuf.Duration`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Duration {
        /// Seconds.
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        /// Nanoseconds.
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }

    const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";

    /// The retry delay in a status's details, at most 5 minutes.
    pub fn retry_delay(details: &[u8]) -> Option<std::time::Duration> {
        use prost::Message;
        let st = Status::decode(details).ok()?;
        let d = st
            .details
            .iter()
            .find(|a| a.type_url == RETRY_INFO)
            .and_then(|a| RetryInfo::decode(&a.value[..]).ok())?
            .retry_delay?;
        let d = std::time::Duration::from_secs(d.seconds.clamp(0, 300) as u64)
            + std::time::Duration::from_nanos(d.nanos.clamp(0, 999_999_999) as u64);
        Some(d.min(std::time::Duration::from_secs(300)))
    }

    /// Status details asking to retry after `delay`.
    pub fn retry_after(code: i32, message: &str, delay: std::time::Duration) -> Vec<u8> {
        use prost::Message;
        Status {
            code,
            message: message.to_string(),
            details: vec![Any {
                type_url: RETRY_INFO.to_string(),
                value: RetryInfo {
                    retry_delay: Some(Duration {
                        seconds: delay.as_secs() as i64,
                        nanos: delay.subsec_nanos() as i32,
                    }),
                }
                .encode_to_vec(),
            }],
        }
        .encode_to_vec()
    }
}

/// gRPC: requests carrying already encoded protobuf.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;

struct ResponseDecoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = bytes::Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for ResponseDecoder {
    type Item = ExportLogsServiceResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ExportLogsServiceResponse>, tonic::Status> {
        ExportLogsServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = bytes::Bytes;
    type Decode = ExportLogsServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

/// The running opentelemetry sink.
pub struct OtlpSink {
    config: OtlpSinkConfig,
    mapper: Mapper,
    http: Option<reqwest::Client>,
    /// gRPC: where to connect; the channel is made on the sink's runtime
    /// at the first request.
    grpc: Option<tonic::transport::Endpoint>,
    channel: std::sync::OnceLock<tonic::client::Grpc<tonic::transport::Channel>>,
    metadata: Vec<(
        tonic::metadata::MetadataKey<tonic::metadata::Ascii>,
        tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    )>,
    metrics: ComponentMetrics,
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl OtlpSink {
    /// Builds the client.
    pub fn new(c: &OtlpSinkConfig, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        let mut http = None;
        let mut grpc = None;
        let mut metadata = Vec::new();
        match c.protocol {
            Protocol::Http => {
                let mut headers = HeaderMap::new();
                for (k, v) in &c.headers {
                    headers.insert(
                        HeaderName::from_bytes(k.as_bytes())?,
                        HeaderValue::from_str(v)?,
                    );
                }
                let b = reqwest::Client::builder()
                    .default_headers(headers)
                    .timeout(c.timeout);
                http = Some(c.tls.apply(b, &crate::tls::Owner::of(&metrics))?.build()?);
            }
            Protocol::Grpc => {
                let mut ep = tonic::transport::Endpoint::from_shared(c.endpoint.to_string())?
                    .timeout(c.timeout)
                    .connect_timeout(c.timeout.min(Duration::from_secs(10)))
                    .tcp_nodelay(true);
                if c.endpoint.scheme() == "https" {
                    let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
                    if let Some(ca) = &c.tls.ca_file {
                        let pem = std::fs::read(ca)
                            .map_err(|e| anyhow::anyhow!("tls.ca_file {}: {e}", ca.display()))?;
                        tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
                    }
                    if let (Some(cert), Some(key)) = (&c.tls.cert_file, &c.tls.key_file) {
                        let cert = std::fs::read(cert).map_err(|e| {
                            anyhow::anyhow!("tls.cert_file {}: {e}", cert.display())
                        })?;
                        let key = std::fs::read(key)
                            .map_err(|e| anyhow::anyhow!("tls.key_file {}: {e}", key.display()))?;
                        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
                    }
                    ep = ep.tls_config(tls)?;
                }
                grpc = Some(ep);
                for (k, v) in &c.headers {
                    metadata.push((
                        tonic::metadata::MetadataKey::from_bytes(
                            k.to_ascii_lowercase().as_bytes(),
                        )?,
                        v.parse()?,
                    ));
                }
            }
        }
        Ok(Self {
            config: c.clone(),
            mapper: Mapper::new(c.resource.clone(), c.output.clone()),
            http,
            grpc,
            channel: std::sync::OnceLock::new(),
            metadata,
            metrics,
        })
    }

    async fn post(&self, body: Bytes) -> Answer {
        let Some(client) = &self.http else {
            return Answer::Retry {
                after: None,
                error_type: "request_failed",
                why: "no client".into(),
            };
        };
        let json = self.config.encoding == OtlpEncoding::Json;
        let mut rb = client
            .post(self.config.endpoint.clone())
            .header(
                CONTENT_TYPE,
                if json {
                    "application/json"
                } else {
                    "application/x-protobuf"
                },
            )
            .body(body);
        if self.config.compression == Compression::Gzip {
            rb = rb.header(CONTENT_ENCODING, "gzip");
        }
        match rb.send().await {
            Err(e) => unanswered(&e, self.config.endpoint.as_str(), self.config.timeout),
            Ok(r) if r.status().is_success() => {
                let body = r.bytes().await.unwrap_or_default();
                let (rejected, message) = rejected_in(&body, json);
                partial(rejected, message)
            }
            // The OTLP specification's retryable statuses.
            Ok(r) => failed_answer(r, |s| matches!(s, 429 | 502..=504)).await,
        }
    }

    /// The `error_type` and log text of a retryable gRPC status: a status
    /// the client made up for a transport failure (no connection, the
    /// request timeout) says which; one the server answered is
    /// `request_failed` with its text.
    fn grpc_failure(&self, s: &tonic::Status, text: String) -> (&'static str, String) {
        let timed_out = s.code() == tonic::Code::DeadlineExceeded
            || s.message().to_ascii_lowercase().contains("timeout expired");
        if timed_out || std::error::Error::source(s).is_some() {
            let f = super::client::classify_failure(
                timed_out,
                false,
                s,
                self.config.endpoint.as_str(),
                self.config.timeout,
            );
            return (f.error_type, f.message);
        }
        ("request_failed", text)
    }

    async fn export(&self, body: Bytes) -> Answer {
        use tonic::Code;
        let Some(ep) = &self.grpc else {
            return Answer::Retry {
                after: None,
                error_type: "request_failed",
                why: "no client".into(),
            };
        };
        let mut g = self
            .channel
            .get_or_init(|| {
                let mut g = tonic::client::Grpc::new(ep.connect_lazy());
                if self.config.compression == Compression::Gzip {
                    g = g.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                g.accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                    .max_decoding_message_size(4 << 20)
            })
            .clone();
        if let Err(e) = g.ready().await {
            let f = super::client::classify_failure(
                false,
                true,
                &e,
                self.config.endpoint.as_str(),
                self.config.timeout,
            );
            return Answer::Retry {
                after: None,
                error_type: f.error_type,
                why: f.message,
            };
        }
        let mut req = tonic::Request::new(body);
        for (k, v) in &self.metadata {
            req.metadata_mut().insert(k.clone(), v.clone());
        }
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
        );
        match g.unary(req, path, RawCodec).await {
            Ok(r) => {
                let (rejected, message) = r
                    .into_inner()
                    .partial_success
                    .map(|p| (p.rejected_log_records, p.error_message))
                    .unwrap_or_default();
                partial(rejected, message)
            }
            Err(s) => {
                let text = format!("{:?}: {}", s.code(), s.message());
                // The HTTP peers of the statuses, for the log and the
                // dead letter.
                match s.code() {
                    Code::Unavailable
                    | Code::ResourceExhausted
                    | Code::Aborted
                    | Code::DeadlineExceeded
                    | Code::Cancelled
                    | Code::OutOfRange
                    | Code::DataLoss => {
                        let (error_type, why) = self.grpc_failure(&s, text);
                        Answer::Retry {
                            after: rpc::retry_delay(s.details()),
                            error_type,
                            why,
                        }
                    }
                    Code::Unauthenticated => Answer::Hold { status: 401, text },
                    Code::PermissionDenied => Answer::Hold { status: 403, text },
                    Code::Unimplemented => Answer::Hold { status: 404, text },
                    Code::InvalidArgument | Code::FailedPrecondition => Answer::Refused {
                        status: 400,
                        text,
                        split: true,
                    },
                    _ => Answer::Refused {
                        status: 500,
                        text,
                        split: true,
                    },
                }
            }
        }
    }
}

/// A success, with the records the server rejected anyway, if any.
fn partial(rejected: i64, message: String) -> Answer {
    if rejected == 0 {
        Answer::Delivered
    } else {
        Answer::PartialSuccess { rejected, message }
    }
}

impl RequestSink for OtlpSink {
    type Plan<'b> = ();

    const WORDING: Wording = Wording {
        sink: "opentelemetry sink",
        peer: "the OTLP endpoint",
        items: ("record", "records"),
        hold_fix: "the credentials or the endpoint",
    };

    fn build_request(&self, batch: &Batch, _: &(), items: Selection<'_>) -> anyhow::Result<Bytes> {
        let pb = assemble(items.iter().map(|i| batch.record(i)));
        Ok(match self.config.protocol {
            Protocol::Http => {
                let raw = match self.config.encoding {
                    OtlpEncoding::Json => to_json(&pb)?,
                    OtlpEncoding::Protobuf => pb,
                };
                self.config.compression.apply(raw.into())?
            }
            // gRPC compresses in its own framing.
            Protocol::Grpc => pb.into(),
        })
    }

    async fn send(&self, body: Bytes, _items: usize) -> Answer {
        match self.config.protocol {
            Protocol::Http => self.post(body).await,
            Protocol::Grpc => self.export(body).await,
        }
    }

    fn dead_letter_record<'a>(&self, record: &'a [u8], answer: &'a str) -> DeadRecord<'a> {
        DeadRecord {
            record: record_json(record).into(),
            answer: answer.into(),
        }
    }
}

impl Sink for OtlpSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        self.mapper.encode(batch, out, now_ns());
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        let c = &self.config;
        let settings = Settings::new(
            Framing::NDJSON,
            c.endpoint.to_string(),
            c.dead_letter.clone(),
        )
        .limits(c.max_bytes, c.max_events, c.linger, c.max_in_flight)
        .retry(c.retry);
        let metrics = self.metrics.clone();
        driver::run(self, rx, settings, metrics)
    }
}

/// Registration of `type: opentelemetry`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "opentelemetry",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| OtlpSinkConfig::parse(m).map(|c| Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for OtlpSinkConfig {
    fn destinations(&self) -> Option<Vec<String>> {
        Some(vec![self
            .endpoint
            .host_str()
            .unwrap_or_default()
            .to_string()])
    }
    fn local_writes(&self) -> Vec<std::path::PathBuf> {
        self.dead_letter.iter().cloned().collect()
    }

    fn type_name(&self) -> &'static str {
        "opentelemetry"
    }

    fn build(&self, metrics: ComponentMetrics) -> anyhow::Result<Arc<dyn Sink>> {
        Ok(Arc::new(OtlpSink::new(self, metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use opentelemetry_proto::tonic::logs::v1::LogRecord;
    use petrel_core::config::{parse_yaml, ConfigErrors, Node};
    use petrel_core::{Key, SourceInfo, Span};

    /// The sink's default output: metadata in semantic-convention names.
    fn otel() -> Arc<petrel_core::schema::Output> {
        Arc::new(petrel_core::schema::Output {
            layout: petrel_core::schema::Layout::Otel,
            ..Default::default()
        })
    }

    fn config(yaml: &str) -> Result<OtlpSinkConfig, String> {
        let f: Arc<str> = "t.yaml".into();
        let raw = parse_yaml(&f, yaml).map_err(|e| e.to_string())?;
        let errs = ConfigErrors::new();
        let node = Node::root(&f, &raw, &errs);
        let map = node.as_map(KEYS).ok_or("not a map")?;
        let c = OtlpSinkConfig::parse(map);
        match (c, errs.is_empty()) {
            (Some(c), true) => Ok(c),
            _ => Err(format!("{:?}", errs.into_vec())),
        }
    }

    fn meta() -> Arc<[(Key, Arc<str>)]> {
        vec![
            (Key::Borrowed("host"), Arc::from("node-1")),
            (Key::Borrowed("k8s.namespace"), Arc::from("shop")),
            (Key::Borrowed("k8s.pod_name"), Arc::from("cart-7d")),
            (Key::Borrowed("k8s.pod_uid"), Arc::from("0c6a")),
            (Key::Borrowed("k8s.container_name"), Arc::from("cart")),
            (Key::Borrowed("container.id"), Arc::from("abc123")),
        ]
        .into()
    }

    fn batch() -> EventBatch {
        let mut b = EventBatch::new(
            bytes::Bytes::from_static(b"first line\nsecond\n"),
            Arc::new(SourceInfo::file("/var/log/pods/cart.log", meta())),
        );
        let mut a = Event::from_span(Span::new(0, 10));
        a.time_ns = Some(1_700_000_000_000_000_000);
        a.set("level".into(), Value::Str("Warning".into()));
        a.set("n".into(), Value::Int(42));
        a.set("ratio".into(), Value::Float(0.5));
        a.set("ok".into(), Value::Bool(true));
        a.set("none".into(), Value::Null);
        a.set(
            "tags".into(),
            Value::Array(vec![Value::Str("x".into()), Value::Int(2)]),
        );
        a.set(
            "user".into(),
            Value::Object(vec![("id".into(), Value::Int(7))]),
        );
        a.set(
            "trace_id".into(),
            Value::Str("5b8efff798038103d269b633813fc60c".into()),
        );
        b.events.push(a);
        let mut c = Event::from_span(Span::new(11, 6));
        c.set("service".into(), Value::Str("cart".into()));
        c.set("severity".into(), Value::Str("crit".into()));
        b.events.push(c);
        b.events.push(Event::from_span(Span::new(11, 6)));
        b
    }

    fn decode_all(out: &Encoded) -> ExportLogsServiceRequest {
        let mut start = 0;
        let mut recs = Vec::new();
        for &e in &out.record_ends {
            let e = e as usize;
            // As the request builder does: one trailing newline off.
            recs.push(&out.bytes[start..e - 1]);
            start = e;
        }
        ExportLogsServiceRequest::decode(&assemble(recs.into_iter())[..]).expect("decodes")
    }

    fn attr<'a>(kvs: &'a [KeyValue], k: &str) -> Option<&'a V> {
        kvs.iter()
            .find(|kv| kv.key == k)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    fn s(x: &str) -> V {
        V::StringValue(x.into())
    }

    /// Records are written without prost's message types: what they
    /// decode to must be the `LogRecord` prost would have encoded, with
    /// values long enough to widen a length to two and three bytes,
    /// nesting, every value type, and invalid UTF-8 replaced and counted.
    #[test]
    fn records_written_directly_decode_to_the_expected_log_record() {
        let long = "x".repeat(200);
        let longer = "y".repeat(20_000);
        let mut text = b"bad \xff byte\n".to_vec();
        let msg_start = text.len();
        text.extend_from_slice(longer.as_bytes());
        let mut b = EventBatch::new(
            bytes::Bytes::from(text),
            Arc::new(SourceInfo::file("/l.log", meta())),
        );
        let mut e = Event::from_span(Span::new(msg_start, longer.len()));
        e.time_ns = Some(5);
        e.set("bad".into(), Value::Span(Span::new(0, 10)));
        e.set("long".into(), Value::Str(long.clone().into()));
        e.set("neg".into(), Value::Int(-3));
        e.set("raw".into(), Value::Bytes(vec![0, 1, 255].into()));
        e.set(
            "deep".into(),
            Value::Array(vec![
                Value::Null,
                Value::Object(vec![
                    ("".into(), Value::Bool(false)),
                    ("s".into(), Value::Str(long.clone().into())),
                ]),
                Value::Array(vec![Value::Float(-1.5)]),
            ]),
        );
        e.set("severity_number".into(), Value::Int(-7));
        e.set("event_name".into(), Value::Str("ev".into()));
        e.set("flags".into(), Value::Int(1));
        e.set("span_id".into(), Value::Str("0011223344556677".into()));
        e.set(
            "attributes".into(),
            Value::Object(vec![("a".into(), Value::Str("".into()))]),
        );
        b.events.push(e);
        let mut out = Encoded::default();
        Mapper::new(Vec::new(), otel()).encode(&b, &mut out, 9);
        assert_eq!(out.invalid_utf8, 1);
        let req = decode_all(&out);
        let got = &req.resource_logs[0].scope_logs[0].log_records[0];
        let av = |v: Option<V>| AnyValue { value: v };
        let kv = |k: &str, v: Option<V>| KeyValue {
            key: k.into(),
            value: Some(av(v)),
            ..Default::default()
        };
        let expected = LogRecord {
            time_unix_nano: 5,
            observed_time_unix_nano: 9,
            severity_number: -7,
            body: Some(av(Some(s(&longer)))),
            attributes: vec![
                // The Collector keeps the file's path on the record.
                kv("log.file.path", Some(s("/l.log"))),
                kv("bad", Some(s("bad \u{fffd} byte"))),
                kv("long", Some(s(&long))),
                kv("neg", Some(V::IntValue(-3))),
                kv("raw", Some(V::BytesValue(vec![0, 1, 255]))),
                kv(
                    "deep",
                    Some(V::ArrayValue(ArrayValue {
                        values: vec![
                            av(None),
                            av(Some(V::KvlistValue(KeyValueList {
                                values: vec![
                                    kv("", Some(V::BoolValue(false))),
                                    kv("s", Some(s(&long))),
                                ],
                            }))),
                            av(Some(V::ArrayValue(ArrayValue {
                                values: vec![av(Some(V::DoubleValue(-1.5)))],
                            }))),
                        ],
                    })),
                ),
                kv("a", Some(s(""))),
            ],
            flags: 1,
            span_id: vec![0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77],
            event_name: "ev".into(),
            ..Default::default()
        };
        assert_eq!(got, &expected);
    }

    #[test]
    fn varints_are_prosts() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            wire::encode_varint(v, &mut ours);
            prost::encoding::encode_varint(v, &mut theirs);
            assert_eq!(ours, theirs, "{v}");
        }
    }

    #[test]
    fn severity_names_map_to_otlp_numbers() {
        for (name, n) in [
            ("trace", 1),
            ("DEBUG", 5),
            ("info", 9),
            ("notice", 10),
            ("warn", 13),
            ("Warning", 13),
            ("error", 17),
            ("err", 17),
            ("crit", 18),
            ("critical", 18),
            ("alert", 19),
            ("emerg", 21),
            ("fatal", 21),
            ("whatever", 0),
        ] {
            assert_eq!(severity_number(name), n, "{name}");
        }
    }

    #[test]
    fn events_become_typed_records_grouped_by_resource() {
        let m = Mapper::new(
            vec![("deployment.environment".into(), "prod".into())],
            otel(),
        );
        let mut out = Encoded::default();
        m.encode(&batch(), &mut out, 99);
        assert_eq!(out.record_ends.len(), 3);
        let req = decode_all(&out);
        // Two resources: the one with service.name = cart, and the rest.
        assert_eq!(req.resource_logs.len(), 2, "{req:?}");
        let r0 = &req.resource_logs[0];
        let ra = &r0.resource.as_ref().unwrap().attributes;
        assert_eq!(attr(ra, "host.name"), Some(&s("node-1")));
        assert_eq!(attr(ra, "k8s.namespace.name"), Some(&s("shop")));
        assert_eq!(attr(ra, "k8s.pod.name"), Some(&s("cart-7d")));
        assert_eq!(attr(ra, "k8s.pod.uid"), Some(&s("0c6a")));
        assert_eq!(attr(ra, "k8s.container.name"), Some(&s("cart")));
        assert_eq!(attr(ra, "container.id"), Some(&s("abc123")));
        // As the Collector's `filelog` puts it: on each record.
        assert_eq!(attr(ra, "log.file.path"), None);
        assert_eq!(attr(ra, "deployment.environment"), Some(&s("prod")));
        assert_eq!(attr(ra, "service.name"), None);
        let recs = &r0.scope_logs[0].log_records;
        assert_eq!(recs.len(), 2, "the first and third event share a resource");
        let a = &recs[0];
        assert_eq!(a.time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(a.observed_time_unix_nano, 99);
        assert_eq!(a.body.as_ref().unwrap().value, Some(s("first line")));
        assert_eq!(
            (a.severity_number, a.severity_text.as_str()),
            (13, "Warning")
        );
        assert_eq!(a.trace_id.len(), 16);
        assert_eq!(attr(&a.attributes, "n"), Some(&V::IntValue(42)));
        assert_eq!(
            attr(&a.attributes, "log.file.path"),
            Some(&s("/var/log/pods/cart.log"))
        );
        assert_eq!(attr(&a.attributes, "ratio"), Some(&V::DoubleValue(0.5)));
        assert_eq!(attr(&a.attributes, "ok"), Some(&V::BoolValue(true)));
        assert_eq!(attr(&a.attributes, "none"), None);
        assert!(a.attributes.iter().any(|kv| kv.key == "none"));
        assert!(
            matches!(attr(&a.attributes, "tags"), Some(V::ArrayValue(x)) if x.values.len() == 2)
        );
        assert!(
            matches!(attr(&a.attributes, "user"), Some(V::KvlistValue(x)) if x.values[0].key == "id")
        );
        assert!(
            attr(&a.attributes, "level").is_none() && attr(&a.attributes, "trace_id").is_none()
        );
        // No parsed time: only the observed time.
        assert_eq!(recs[1].time_unix_nano, 0);
        let r1 = &req.resource_logs[1];
        let ra = &r1.resource.as_ref().unwrap().attributes;
        assert_eq!(attr(ra, "service.name"), Some(&s("cart")));
        let c = &r1.scope_logs[0].log_records[0];
        assert_eq!((c.severity_number, c.severity_text.as_str()), (18, "crit"));
        let names: Vec<&str> = c.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(
            names,
            ["log.file.path"],
            "service and severity are consumed"
        );
    }

    #[test]
    fn otlp_fields_from_the_source_map_back_exactly() {
        let json = serde_json::json!({"resourceLogs": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "a"}},
                                        {"key": "n", "value": {"intValue": "3"}}]},
            "schemaUrl": "https://s/1",
            "scopeLogs": [{
                "scope": {"name": "lib", "version": "1", "attributes": [{"key": "k", "value": {"boolValue": true}}]},
                "schemaUrl": "https://s/2",
                "logRecords": [{
                    "timeUnixNano": "5", "observedTimeUnixNano": "6",
                    "severityNumber": 17, "severityText": "E",
                    "body": {"kvlistValue": {"values": [{"key": "x", "value": {"doubleValue": 1.5}}]}},
                    "attributes": [{"key": "level", "value": {"stringValue": "not the severity"}},
                                   {"key": "b", "value": {"bytesValue": "AQI="}}],
                    "flags": 1, "droppedAttributesCount": 2, "eventName": "ev",
                    "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174"
                }, {
                    "observedTimeUnixNano": "7", "body": {"stringValue": "plain"}
                }]
            }]
        }, {
            "resource": {},
            "scopeLogs": [{"logRecords": [{"observedTimeUnixNano": "8"}]}]
        }]});
        let want: ExportLogsServiceRequest = serde_json::from_value(json).expect("OTLP JSON");
        let mut b = EventBatch::new(
            bytes::Bytes::new(),
            Arc::new(SourceInfo {
                meta: meta(),
                ..Default::default()
            }),
        );
        crate::sources::opentelemetry::events(&want, &mut b.events);
        assert_eq!(b.events.len(), 3);
        let mut out = Encoded::default();
        Mapper::new(vec![("ignored".into(), "for such events".into())], otel())
            .encode(&b, &mut out, 1);
        let got = decode_all(&out);
        assert_eq!(got, want);
    }

    #[test]
    fn an_event_with_its_own_resource_keeps_service_as_an_attribute() {
        let mut b = EventBatch::new(
            bytes::Bytes::new(),
            Arc::new(SourceInfo {
                meta: meta(),
                ..Default::default()
            }),
        );
        let mut ev = Event {
            message: Value::Str("m".into()),
            fields: Vec::new(),
            time_ns: None,
            hidden: petrel_core::Hidden::NONE,
        };
        ev.set("service".into(), Value::Str("svc".into()));
        ev.set(
            "resource".into(),
            Value::Object(vec![("k".into(), Value::Str("v".into()))]),
        );
        b.events.push(ev);
        let mut out = Encoded::default();
        Mapper::new(vec![("x".into(), "y".into())], otel()).encode(&b, &mut out, 1);
        let req = decode_all(&out);
        let ra = &req.resource_logs[0].resource.as_ref().unwrap().attributes;
        assert_eq!(ra.len(), 1, "the event's resource alone: {ra:?}");
        assert_eq!(attr(ra, "k"), Some(&s("v")));
        let rec = &req.resource_logs[0].scope_logs[0].log_records[0];
        assert_eq!(attr(&rec.attributes, "service"), Some(&s("svc")));
    }

    #[test]
    fn json_encoding_follows_the_otlp_mapping() {
        let mut out = Encoded::default();
        Mapper::new(Vec::new(), otel()).encode(&batch(), &mut out, 1_700_000_000_000_000_123);
        let mut recs = Vec::new();
        let mut start = 0;
        for &e in &out.record_ends {
            recs.push(&out.bytes[start..e as usize - 1]);
            start = e as usize;
        }
        let json = to_json(&assemble(recs.into_iter())).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let rec = &v["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0];
        assert_eq!(rec["timeUnixNano"], "1700000000000000000", "{rec}");
        assert_eq!(rec["observedTimeUnixNano"], "1700000000000000123");
        assert_eq!(rec["traceId"], "5b8efff798038103d269b633813fc60c");
        assert_eq!(rec["severityNumber"], 13);
        assert_eq!(rec["body"]["stringValue"], "first line");
        let attrs = rec["attributes"].as_array().unwrap();
        let n = attrs.iter().find(|a| a["key"] == "n").unwrap();
        assert_eq!(n["value"]["intValue"], "42", "int64 as a string");
        let user = attrs.iter().find(|a| a["key"] == "user").unwrap();
        assert_eq!(user["value"]["kvlistValue"]["values"][0]["key"], "id");
        // And it reads back as the same request.
        let back: ExportLogsServiceRequest = serde_json::from_slice(&json).unwrap();
        assert_eq!(back.resource_logs[0].scope_logs[0].log_records.len(), 2);
    }

    #[test]
    fn answers_and_dead_letters() {
        assert_eq!(
            rejected_in(
                br#"{"partialSuccess":{"rejectedLogRecords":"4","errorMessage":"bad"}}"#,
                true
            ),
            (4, "bad".to_string())
        );
        assert_eq!(
            rejected_in(br#"{"partialSuccess":{"rejectedLogRecords":2}}"#, true).0,
            2
        );
        assert_eq!(rejected_in(b"{}", true).0, 0);
        let pb = ExportLogsServiceResponse {
            partial_success: Some(
                opentelemetry_proto::tonic::collector::logs::v1::ExportLogsPartialSuccess {
                    rejected_log_records: 3,
                    error_message: "x".into(),
                },
            ),
        }
        .encode_to_vec();
        assert_eq!(rejected_in(&pb, false).0, 3);
        assert_eq!(rejected_in(b"", false).0, 0);
        let mut out = Encoded::default();
        Mapper::new(Vec::new(), otel()).encode(&batch(), &mut out, 1);
        let first = &out.bytes[..out.record_ends[0] as usize - 1];
        let v: serde_json::Value = serde_json::from_slice(&record_json(first)).unwrap();
        assert_eq!(
            v["scopeLogs"][0]["logRecords"][0]["body"]["stringValue"],
            "first line"
        );
    }

    #[test]
    fn retry_info_gives_the_grpc_retry_delay() {
        let d = rpc::retry_after(14, "full", Duration::from_millis(1500));
        assert_eq!(rpc::retry_delay(&d), Some(Duration::from_millis(1500)));
        assert_eq!(rpc::retry_delay(b""), None);
        let far = rpc::retry_after(8, "x", Duration::from_secs(3600));
        assert_eq!(rpc::retry_delay(&far), Some(Duration::from_secs(300)));
    }

    #[test]
    fn config_errors_are_reported() {
        assert!(config("protocol: http").is_err(), "endpoint required");
        assert!(config("endpoint: ftp://x/v1/logs").is_err());
        assert!(
            config("endpoint: http://x:4318").is_err(),
            "http wants the full URL"
        );
        assert!(config("endpoint: http://x:4317\nprotocol: grpc\nencoding: json").is_err());
        assert!(config("endpoint: http://x:4318/v1/logs\nprotocol: smoke").is_err());
        assert!(config("endpoint: http://x:4318/v1/logs\ncompression: zstd").is_err());
        assert!(config("endpoint: http://x:4318/v1/logs\ntls: { cert_file: /a }").is_err());
        assert!(config("endpoint: http://x:4318/v1/logs\nresource: [a]").is_err());
        let c = config("endpoint: http://x:4318/v1/logs").expect("defaults");
        assert_eq!(
            (c.protocol, c.encoding, c.compression),
            (Protocol::Http, OtlpEncoding::Protobuf, Compression::None)
        );
        assert!(c.tls.verify);
        let c = config("endpoint: http://x:4317\nprotocol: grpc\nresource: { service.name: a }\nheaders: { x-token: t }").expect("grpc");
        assert_eq!(
            c.resource,
            vec![("service.name".to_string(), "a".to_string())]
        );
        assert_eq!(c.headers.len(), 1);
    }
}
