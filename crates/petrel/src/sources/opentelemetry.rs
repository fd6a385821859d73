//! `type: opentelemetry` — receives OTLP logs over gRPC and/or HTTP.
//!
//! ```yaml
//! sources:
//!   - type: opentelemetry
//!     grpc_address: 127.0.0.1:4317     # LogsService/Export
//!     http_address: 127.0.0.1:4318     # POST /v1/logs, protobuf or JSON, gzip
//!     max_body_bytes: 10MiB
//!     tls: { cert_file: server.pem, key_file: server.key }   # both servers; ca_file: mutual TLS
//!     auth: { bearer_token: "${OTLP_TOKEN}" }                 # both servers
//!     max_connections: 1024            # per listener
//!     idle_timeout_secs: 600
//!     buffer: { type: disk, max_size: 256MiB }   # disk is the default
//! ```
//! Both listeners accept through the receiving sources' shared machinery
//! (`super::net::server`): connections beyond `max_connections`, or that
//! would leave the agent short of descriptors for its API and files, are
//! closed at once and counted; silent ones are closed after
//! `idle_timeout_secs`.
//! A request is answered with success only once its records are in the
//! buffer (with the default `buffer.type: disk`, durable in the spool).
//! When the buffer is full the answer is HTTP 429 with `Retry-After` or
//! gRPC UNAVAILABLE, both of which OTLP clients retry; nothing is buffered
//! beyond the limit.
//!
//! Each request is spooled as one protobuf `ExportLogsServiceRequest` and
//! turned into events when read from the spool, one per `LogRecord`: the
//! body is the message, `time_unix_nano` the event time, and what else
//! the record carries goes into the fields named in
//! [`crate::sinks::opentelemetry::fields`] (`resource`, `scope`,
//! `attributes`, `trace_id`, `span_id`, `flags`, `severity_text`,
//! `severity_number`, `observed_time_unix_nano`, ...), which the
//! `opentelemetry` sink maps back exactly.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{Event, EventBatch, Key, Span, Value};
use prost::Message;

use super::net::body;
use super::net::intake::{self, Admission, Intake};
use super::net::server;
use super::net::stream::StreamCounters;
use super::net::tls::TlsOptions;
use super::net::{now_ns, Block, BufferOptions, ConnLimits, NetRuntime, Receiver, RunningNet};
use crate::sinks::opentelemetry::fields;

/// Keys accepted by the opentelemetry source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "grpc_address",
    "http_address",
    "max_body_bytes",
    "tls",
    "auth",
    "max_connections",
    "idle_timeout_secs",
    "buffer",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"An OTLP logs receiver over gRPC and/or HTTP; a request is answered with success only once its records are in the buffer, and each `LogRecord` becomes one event keeping its resource, scope, attributes and trace context. Cargo feature `opentelemetry` (default)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "grpc_address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"`ip:port` of the OTLP/gRPC server (gzip accepted). At least one of the two addresses is required."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "http_address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"`ip:port` of the OTLP/HTTP server: `POST /v1/logs`, protobuf or JSON, gzip accepted."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_body_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"10MiB"#),
        doc: r#"Largest request, after decompression."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "tls",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"`{cert_file, key_file}` (PEM) serves both gRPC and HTTP over TLS; with `ca_file`, clients must present a certificate signed by it."#,
    },
    crate::sources::net::server::AUTH_DOC,
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    petrel_core::plugin::KeyDoc {
        name: "buffer",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{type: disk}"#),
        doc: r#"As for the receiving sources, but disk by default: success means the records are durable in the spool. `max_size` must be at least twice `max_body_bytes`."#,
    },
];

/// Registration of `type: opentelemetry`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "opentelemetry",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| OtlpSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// How long a request waits for admission before it is refused as full.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Reading a body may take this long.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Seconds a refused client is asked to wait.
const RETRY_AFTER_SECS: &str = "1";

/// Configuration of the opentelemetry source.
#[derive(Debug, Clone)]
pub struct OtlpSourceConfig {
    grpc_address: Option<std::net::SocketAddr>,
    http_address: Option<std::net::SocketAddr>,
    max_body_bytes: usize,
    tls: Option<TlsOptions>,
    bearer_token: Option<String>,
    limits: ConnLimits,
    buffer: BufferOptions,
}

fn address(map: &Map<'_>, key: &str) -> Option<Option<std::net::SocketAddr>> {
    let Some(n) = map.get(key) else {
        return Some(None);
    };
    let text = n.as_str()?;
    match text.parse() {
        Ok(a) => Some(Some(a)),
        Err(_) => {
            n.error(format!(
                "`{key}` must be an IP address and port, e.g. `127.0.0.1:{}`; got `{text}`",
                if key == "grpc_address" { 4317 } else { 4318 }
            ));
            None
        }
    }
}

impl OtlpSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let grpc_address = address(&map, "grpc_address");
        let http_address = address(&map, "http_address");
        let max_body_bytes = map.u64("max_body_bytes", true).unwrap_or(10 << 20) as usize;
        let tls = TlsOptions::parse(&map);
        let bearer_token = server::parse_bearer_auth(&map);
        // Disk unless said otherwise: success means durable.
        let disk_default = map
            .get("buffer")
            .and_then(|n| n.as_map_quiet())
            .is_none_or(|m| m.get("type").is_none());
        let mut buffer = BufferOptions::parse(&map)?;
        if disk_default {
            buffer.disk = true;
        }
        let (grpc_address, http_address) = (grpc_address?, http_address?);
        if grpc_address.is_none() && http_address.is_none() {
            map.node().error(
                "give `grpc_address` (e.g. `127.0.0.1:4317`), `http_address` (e.g. `127.0.0.1:4318`) or both",
            );
            return None;
        }
        if buffer.disk && max_body_bytes as u64 > buffer.max_bytes / 2 {
            map.get("max_body_bytes")
                .unwrap_or_else(|| map.node())
                .error(format!(
                    "`buffer.max_size` ({}) must be at least twice `max_body_bytes` ({max_body_bytes}): every request is one spool record",
                    buffer.max_bytes
                ));
            return None;
        }
        Some(Self {
            grpc_address,
            http_address,
            max_body_bytes: max_body_bytes.max(1024),
            tls: tls?,
            bearer_token: bearer_token?,
            limits: ConnLimits::parse(&map),
            buffer,
        })
    }
}

// ---------------------------------------------------------------------
// Records to events.

fn value(v: Option<&AnyValue>) -> Value {
    use any_value::Value as V;
    match v.and_then(|a| a.value.as_ref()) {
        None => Value::Null,
        Some(V::StringValue(s)) => Value::Str(s.as_str().into()),
        Some(V::BoolValue(b)) => Value::Bool(*b),
        Some(V::IntValue(i)) => Value::Int(*i),
        Some(V::DoubleValue(f)) => Value::Float(*f),
        Some(V::BytesValue(b)) => Value::Bytes(b.clone().into_boxed_slice()),
        Some(V::ArrayValue(a)) => Value::Array(a.values.iter().map(|x| value(Some(x))).collect()),
        Some(V::KvlistValue(kv)) => object(&kv.values),
        Some(V::StringValueStrindex(i)) => Value::Int(*i as i64),
    }
}

fn object(kvs: &[KeyValue]) -> Value {
    Value::Object(
        kvs.iter()
            .map(|kv| (Key::from(kv.key.clone()), value(kv.value.as_ref())))
            .collect(),
    )
}

fn hex(b: &[u8]) -> Value {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    Value::Str(s.into())
}

fn str_field(ev: &mut Event, k: &'static str, s: &str) {
    if !s.is_empty() {
        ev.fields.push((Key::Borrowed(k), Value::Str(s.into())));
    }
}

fn int_field(ev: &mut Event, k: &'static str, i: i64) {
    if i != 0 {
        ev.fields.push((Key::Borrowed(k), Value::Int(i)));
    }
}

/// Appends one event per log record of `req` to `out`.
pub fn events(req: &ExportLogsServiceRequest, out: &mut Vec<Event>) {
    for rl in &req.resource_logs {
        let resource = object(rl.resource.as_ref().map_or(&[][..], |r| &r.attributes));
        for sl in &rl.scope_logs {
            let scope = sl.scope.as_ref().map(|s| {
                let mut o: Vec<(Key, Value)> = Vec::new();
                if !s.name.is_empty() {
                    o.push(("name".into(), Value::Str(s.name.as_str().into())));
                }
                if !s.version.is_empty() {
                    o.push(("version".into(), Value::Str(s.version.as_str().into())));
                }
                if !s.attributes.is_empty() {
                    o.push(("attributes".into(), object(&s.attributes)));
                }
                if s.dropped_attributes_count != 0 {
                    o.push((
                        "dropped_attributes_count".into(),
                        Value::Int(s.dropped_attributes_count as i64),
                    ));
                }
                Value::Object(o)
            });
            for r in &sl.log_records {
                let mut ev = Event {
                    message: value(r.body.as_ref()),
                    fields: Vec::with_capacity(8),
                    time_ns: (r.time_unix_nano != 0).then_some(r.time_unix_nano as i64),
                    hidden: petrel_core::Hidden::NONE,
                };
                ev.fields
                    .push((Key::Borrowed(fields::RESOURCE), resource.clone()));
                str_field(&mut ev, fields::RESOURCE_SCHEMA_URL, &rl.schema_url);
                if let Some(s) = &scope {
                    ev.fields.push((Key::Borrowed(fields::SCOPE), s.clone()));
                }
                str_field(&mut ev, fields::SCOPE_SCHEMA_URL, &sl.schema_url);
                int_field(
                    &mut ev,
                    fields::OBSERVED_TIME,
                    r.observed_time_unix_nano as i64,
                );
                str_field(&mut ev, fields::SEVERITY_TEXT, &r.severity_text);
                int_field(&mut ev, fields::SEVERITY_NUMBER, r.severity_number as i64);
                if !r.trace_id.is_empty() {
                    ev.fields
                        .push((Key::Borrowed(fields::TRACE_ID), hex(&r.trace_id)));
                }
                if !r.span_id.is_empty() {
                    ev.fields
                        .push((Key::Borrowed(fields::SPAN_ID), hex(&r.span_id)));
                }
                int_field(&mut ev, fields::FLAGS, r.flags as i64);
                int_field(
                    &mut ev,
                    fields::DROPPED_ATTRIBUTES,
                    r.dropped_attributes_count as i64,
                );
                str_field(&mut ev, fields::EVENT_NAME, &r.event_name);
                if !r.attributes.is_empty() {
                    ev.fields
                        .push((Key::Borrowed(fields::ATTRIBUTES), object(&r.attributes)));
                }
                out.push(ev);
            }
        }
    }
}

/// Spooled frames are protobuf requests.
struct OtlpDecode {
    bad: LazyCounter,
}

impl super::net::Decode for OtlpDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        for s in &block.frames {
            match ExportLogsServiceRequest::decode(s.get(&block.buf)) {
                Ok(req) => events(&req, &mut batch.events),
                Err(e) => {
                    // Only requests that decoded are spooled: a damaged
                    // record. Counted, never silently.
                    self.bad.inc();
                    tracing::error!(error = %e, "opentelemetry source: a spooled request does not decode");
                }
            }
        }
    }
}

fn log_records(req: &ExportLogsServiceRequest) -> usize {
    req.resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .map(|s| s.log_records.len())
        .sum()
}

/// Submits a decoded request: re-encoded as protobuf, one spool record.
async fn submit(
    intake: &Intake,
    req: &ExportLogsServiceRequest,
    peer: Option<Arc<str>>,
) -> Admission {
    if log_records(req) == 0 {
        return Admission::Accepted;
    }
    let buf: Bytes = req.encode_to_vec().into();
    let block = Block {
        frames: vec![Span::new(0, buf.len())],
        buf,
        peer,
        received_ns: now_ns(),
        json: false,
    };
    intake.submit_and_wait(block, ADMIT_TIMEOUT).await
}

// ---------------------------------------------------------------------
// gRPC.

struct Grpc {
    intake: Intake,
    full: LazyCounter,
    /// `Bearer <token>` the requests must carry.
    auth: Option<HeaderValue>,
    unauthorized: LazyCounter,
}

#[tonic::async_trait]
impl LogsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        if let Some(want) = &self.auth {
            let ok = request
                .metadata()
                .get("authorization")
                .is_some_and(|got| server::same_secret(got.as_bytes(), want.as_bytes()));
            if !ok {
                self.unauthorized.inc();
                return Err(tonic::Status::unauthenticated(
                    "missing or wrong bearer token",
                ));
            }
        }
        let peer: Option<Arc<str>> = request.remote_addr().map(|a| a.to_string().into());
        let req = request.into_inner();
        match submit(&self.intake, &req, peer).await {
            Admission::Accepted => Ok(tonic::Response::new(ExportLogsServiceResponse {
                partial_success: None,
            })),
            Admission::Full => {
                self.full.inc();
                // With RetryInfo, as OTLP asks of a server that is
                // throttling.
                let msg = "buffer full; retry later";
                let details = crate::sinks::opentelemetry::rpc::retry_after(
                    tonic::Code::Unavailable as i32,
                    msg,
                    Duration::from_secs(1),
                );
                Err(tonic::Status::with_details(
                    tonic::Code::Unavailable,
                    msg,
                    details.into(),
                ))
            }
            Admission::Failed(why) => Err(tonic::Status::unavailable(why)),
        }
    }
}

fn serve_grpc(
    rt: &tokio::runtime::Handle,
    addr: std::net::SocketAddr,
    max_body: usize,
    tls: Option<&TlsOptions>,
    limits: ConnLimits,
    counters: StreamCounters,
    svc: Grpc,
) -> anyhow::Result<server::ServerHandle> {
    // Requests decoded and waiting for the buffer at once, per connection.
    let mut builder = tonic::transport::Server::builder().concurrency_limit_per_connection(32);
    if let Some(t) = tls {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("tls: {}: {e}", p.display()))
        };
        let mut cfg = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(read(&t.cert_file)?, read(&t.key_file)?),
        );
        if let Some(ca) = &t.ca_file {
            cfg = cfg.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
        }
        builder = builder.tls_config(cfg)?;
    }
    let listener = server::bind(rt, addr)?;
    let (handle, mut stop_rx, alive) = server::ServerHandle::new();
    let service = LogsServiceServer::new(svc)
        .max_decoding_message_size(max_body)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    rt.spawn(async move {
        let incoming = server::grpc_incoming(listener, limits, counters, stop_rx.clone());
        let r = builder
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.changed().await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "opentelemetry source: the gRPC server stopped");
        }
        alive.store(false, Ordering::SeqCst);
    });
    Ok(handle)
}

// ---------------------------------------------------------------------
// HTTP.

struct Http {
    intake: Intake,
    max_body: usize,
    full: LazyCounter,
    bad_request: LazyCounter,
    too_large: LazyCounter,
    /// `Bearer <token>` the requests must carry.
    auth: Option<HeaderValue>,
    unauthorized: LazyCounter,
}

fn reply(status: StatusCode, json: bool, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(if json {
            "application/json"
        } else {
            "application/x-protobuf"
        }),
    );
    r
}

/// An error answer: a `google.rpc.Status` in the request's encoding.
fn error(status: StatusCode, json: bool, msg: &str) -> Response<Full<Bytes>> {
    #[derive(prost::Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    let body = if json {
        serde_json::json!({ "code": 0, "message": msg })
            .to_string()
            .into_bytes()
    } else {
        RpcStatus {
            code: 0,
            message: msg.to_string(),
        }
        .encode_to_vec()
    };
    reply(status, json, body)
}

async fn handle(req: hyper::Request<Incoming>, s: &Http, peer: Arc<str>) -> Response<Full<Bytes>> {
    let ct = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let json = ct == "application/json";
    if req.uri().path() != "/v1/logs" {
        return error(
            StatusCode::NOT_FOUND,
            json,
            "no such path; POST logs to /v1/logs",
        );
    }
    if req.method() != hyper::Method::POST {
        let mut r = error(StatusCode::METHOD_NOT_ALLOWED, json, "use POST");
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    if !server::authorized(req.headers(), s.auth.as_ref()) {
        s.unauthorized.inc();
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            json,
            "missing or wrong bearer token",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    if !json && ct != "application/x-protobuf" {
        s.bad_request.inc();
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            false,
            "Content-Type must be application/x-protobuf or application/json",
        );
    }
    let encoding = match body::Encoding::parse(
        req.headers()
            .get(hyper::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok()),
        &[body::Encoding::Gzip],
    ) {
        Ok(e) => e,
        Err(other) => {
            s.bad_request.inc();
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                json,
                &format!("unsupported Content-Encoding `{other}`; use gzip or none"),
            );
        }
    };
    let body = match body::read(req.into_body(), s.max_body, BODY_TIMEOUT).await {
        Ok(b) => b,
        Err(body::ReadError::Timeout) => {
            return error(StatusCode::REQUEST_TIMEOUT, json, "the body took too long");
        }
        Err(body::ReadError::TooLarge) => {
            s.too_large.inc();
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                json,
                "body larger than max_body_bytes",
            );
        }
        Err(body::ReadError::Failed) => {
            return error(StatusCode::BAD_REQUEST, json, "cannot read the body");
        }
    };
    let body: Bytes = match body::decode(encoding, body, s.max_body) {
        Ok(b) => b,
        Err(e) => {
            if e == body::Inflate::TooLarge {
                s.too_large.inc();
                return error(StatusCode::PAYLOAD_TOO_LARGE, json, &e.message(s.max_body));
            }
            s.bad_request.inc();
            return error(StatusCode::BAD_REQUEST, json, &e.message(s.max_body));
        }
    };
    let decoded = if json {
        serde_json::from_slice::<ExportLogsServiceRequest>(&body).map_err(|e| e.to_string())
    } else {
        ExportLogsServiceRequest::decode(&body[..]).map_err(|e| e.to_string())
    };
    let req = match decoded {
        Ok(r) => r,
        Err(e) => {
            s.bad_request.inc();
            return error(
                StatusCode::BAD_REQUEST,
                json,
                &format!("not an ExportLogsServiceRequest: {e}"),
            );
        }
    };
    match submit(&s.intake, &req, Some(peer)).await {
        Admission::Accepted => {
            let ok = ExportLogsServiceResponse {
                partial_success: None,
            };
            let body = if json {
                b"{}".to_vec()
            } else {
                ok.encode_to_vec()
            };
            reply(StatusCode::OK, json, body)
        }
        Admission::Full => {
            s.full.inc();
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                json,
                "buffer full; retry later",
            );
            r.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
            r
        }
        Admission::Failed(why) => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, json, &why);
            r.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
            r
        }
    }
}

impl petrel_core::plugin::SourceConfig for OtlpSourceConfig {
    fn type_name(&self) -> &'static str {
        "opentelemetry"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let rt = NetRuntime::get(&ctx)?;
        let decode = Arc::new(OtlpDecode {
            bad: ctx.metrics.error_counter("spool_bad_request"),
        });
        let (intake, runner) = intake::start(&ctx, decode, &self.buffer, "opentelemetry")?;
        let m = &ctx.metrics;
        let full = m.error_counter("buffer_full");
        let unauthorized = m.error_counter("unauthorized");
        let counters = StreamCounters::new(&ctx);
        let mut receivers = Vec::new();
        let started = (|| -> anyhow::Result<()> {
            let auth = match &self.bearer_token {
                None => None,
                Some(t) => Some(server::bearer_header(t).ok_or_else(|| {
                    anyhow::anyhow!("`auth.bearer_token` is not a valid header value")
                })?),
            };
            if let Some(a) = self.grpc_address {
                let svc = Grpc {
                    intake: intake.clone(),
                    full: full.clone(),
                    auth: auth.clone(),
                    unauthorized: unauthorized.clone(),
                };
                receivers.push(Receiver::Other(Box::new(serve_grpc(
                    rt.handle(),
                    a,
                    self.max_body_bytes,
                    self.tls.as_ref(),
                    self.limits,
                    counters.clone(),
                    svc,
                )?)));
                tracing::info!(source = %ctx.key, address = %a, "listening (OTLP/gRPC)");
            }
            if let Some(a) = self.http_address {
                let shared = Arc::new(Http {
                    intake: intake.clone(),
                    max_body: self.max_body_bytes,
                    full: full.clone(),
                    bad_request: m.error_counter("bad_request"),
                    too_large: m.error_counter("body_too_large"),
                    auth: auth.clone(),
                    unauthorized: unauthorized.clone(),
                });
                let tls = self
                    .tls
                    .as_ref()
                    .map(|t| t.server_config(&crate::tls::Owner::of(&ctx.metrics)))
                    .transpose()?;
                let handler: server::Handler = Arc::new(move |req, peer| {
                    let shared = shared.clone();
                    Box::pin(async move { handle(req, &shared, peer).await })
                });
                receivers.push(Receiver::Other(Box::new(server::serve_http(
                    rt.handle(),
                    a,
                    tls,
                    self.limits,
                    counters.clone(),
                    handler,
                )?)));
                tracing::info!(source = %ctx.key, address = %a, "listening (OTLP/HTTP, POST /v1/logs)");
            }
            Ok(())
        })();
        if let Err(e) = started {
            for r in &mut receivers {
                if let Receiver::Other(o) = r {
                    o.stop();
                }
            }
            let _ = runner.wait_stopped(std::time::Instant::now());
            return Err(e);
        }
        Ok(Box::new(RunningNet::new(receivers, runner, Some(rt))))
    }
}
