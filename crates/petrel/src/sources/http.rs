//! `type: http` — events POSTed over HTTP/1.1 (optionally TLS).
//!
//! ```yaml
//! sources:
//!   - type: http
//!     address: 127.0.0.1:8088
//!     path: /ingest
//!     max_body_bytes: 10MiB          # larger bodies (also after decompression): 413
//!     auth: { bearer_token: "${PETREL_HTTP_TOKEN}" }
//!     buffer: { type: disk }
//! ```
//! The body is read by its `Content-Type`: `application/json` holds one
//! object, a JSON array of objects, or objects one per line;
//! `application/x-ndjson` (or `jsonl`) objects one per line; anything else
//! is text, one event per line. Each object's fields become the event's
//! fields (`message` included when present). `Content-Encoding: gzip` and
//! `zstd` are accepted.
//!
//! A 200 answer means accepted: admitted to the memory budget, or with
//! `buffer: {type: disk}` durable in the spool. When the buffer is full the
//! answer is 503 with `Retry-After`, never a connection held open.

use std::convert::Infallible;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{Event, EventBatch, Span, Value};
use tokio::sync::{watch, Semaphore};

use super::net::intake::{self, Admission, Intake};
use super::net::stream::StreamCounters;
use super::net::tls::TlsOptions;
use super::net::{
    now_ns, parse_address, Block, BufferOptions, ConnLimits, Decode, ListenAddr, NetRuntime,
    OtherReceiver, Receiver, RunningNet,
};
use crate::processors::parse_json::JsonParser;

/// Keys accepted by the http source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "path",
    "max_body_bytes",
    "max_connections",
    "idle_timeout_secs",
    "tls",
    "auth",
    "buffer",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Receives events by HTTP POST: JSON (an object, an array of objects, or one per line), ndjson, or text lines; gzip, zstd or lz4 bodies. Answers 200 `{"accepted":N}` once the data is accepted, 503 with `Retry-After` when the buffer is full."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "address",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: `host:port` to listen on."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "path",
        kind: petrel_core::plugin::KeyKind::String,
        default: Some(r#"/"#),
        doc: r#"The only path served (other paths: 404); must start with `/`."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_body_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"10MiB"#),
        doc: r#"Largest request body, also after decompression (413 beyond)."#,
    },
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    crate::sources::net::tls::TLS_DOC,
    petrel_core::plugin::KeyDoc {
        name: "auth",
        kind: petrel_core::plugin::KeyKind::Map,
        default: None,
        doc: r#"`{bearer_token}`: requests must carry `Authorization: Bearer <token>` (401 otherwise); `${ENV}` expanded at load."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "buffer",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{type: memory}"#),
        doc: r#"Where received data waits until every sink acknowledged it: `{type, max_bytes, when_full, sync_interval_ms}`. `type: memory` (the default) charges it to the pipeline's memory budget (lost if the agent is killed); `type: disk` appends it to a spool under the data dir before it counts as accepted. `max_bytes` (disk only, default `256MiB`, at least `1MiB`) bounds undelivered data; `when_full`: `block` (default: stop reading, HTTP answers 503) or `drop_newest` (counted, `reason=buffer_full`); `sync_interval_ms` (disk only, default `100`, at most 60000): socket data is synced within this time. See the delivery guarantee chapter of the book. With `type: disk`, `max_bytes` must be at least twice `max_body_bytes`."#,
    },
];

/// Registration of `type: http`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "http",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| HttpSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Reading a request's headers may take this long (slow clients).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading a body may take this long.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request waits for admission before 503.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Configuration of the http source.
#[derive(Debug, Clone)]
pub struct HttpSourceConfig {
    address: std::net::SocketAddr,
    path: String,
    max_body_bytes: usize,
    limits: ConnLimits,
    tls: Option<TlsOptions>,
    bearer_token: Option<String>,
    buffer: BufferOptions,
}

impl HttpSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let address = parse_address(&map, false, "127.0.0.1:8088");
        let path = match map.get("path") {
            None => Some("/".to_string()),
            Some(n) => match n.as_str() {
                Some(p) if p.starts_with('/') => Some(p.to_string()),
                Some(p) => {
                    n.error(format!(
                        "`path` must start with `/`, e.g. `/ingest`; got `{p}`"
                    ));
                    None
                }
                None => None,
            },
        };
        let max_body_bytes = map.u64("max_body_bytes", true).unwrap_or(10 << 20) as usize;
        let tls = TlsOptions::parse(&map);
        let mut token_ok = true;
        let bearer_token = match map.get("auth") {
            None => None,
            Some(n) => match n.as_map(&["bearer_token"]) {
                Some(m) => match m.required("bearer_token", "\"${PETREL_HTTP_TOKEN}\"") {
                    Some(t) => match t.as_str().map(|s| {
                        petrel_core::config::expand_env(s, |name| std::env::var(name).ok())
                    }) {
                        Some(Err(e)) => {
                            t.error(e);
                            token_ok = false;
                            None
                        }
                        Some(Ok(s)) if !s.is_empty() => Some(s.into_owned()),
                        Some(_) => {
                            t.error("`bearer_token` is empty (an unset environment variable?); set it or remove `auth`");
                            token_ok = false;
                            None
                        }
                        None => {
                            token_ok = false;
                            None
                        }
                    },
                    None => {
                        token_ok = false;
                        None
                    }
                },
                None => {
                    token_ok = false;
                    None
                }
            },
        };
        let buffer = BufferOptions::parse(&map);
        if let Some(b) = buffer.as_ref().filter(|b| b.disk) {
            // A request is one spool record: a body that cannot fit (with
            // room for the others in flight) would be refused forever.
            if max_body_bytes as u64 > b.max_bytes / 2 {
                let node = map
                    .get("buffer")
                    .and_then(|n| n.as_map_quiet())
                    .and_then(|m| m.get("max_bytes"))
                    .or_else(|| map.get("max_body_bytes"))
                    .unwrap_or_else(|| map.node());
                node.error(format!(
                    "`buffer.max_bytes` ({}) must be at least twice `max_body_bytes` ({max_body_bytes}): every request is one spool record; raise `buffer.max_bytes` or lower `max_body_bytes`",
                    b.max_bytes
                ));
                return None;
            }
        }
        let address = match address? {
            ListenAddr::Inet(a) => a,
            ListenAddr::Unix(_) => return None,
        };
        if !token_ok {
            return None;
        }
        Some(Self {
            address,
            path: path?,
            max_body_bytes: max_body_bytes.max(1024),
            limits: ConnLimits::parse(&map),
            tls: tls?,
            bearer_token,
            buffer: buffer?,
        })
    }
}

/// Counters of the HTTP source.
#[derive(Clone)]
struct HttpCounters {
    stream: StreamCounters,
    unauthorized: LazyCounter,
    too_large: LazyCounter,
    bad_request: LazyCounter,
    full: LazyCounter,
    timeouts: LazyCounter,
}

struct Shared {
    path: String,
    max_body: usize,
    /// `Bearer <token>`.
    auth: Option<HeaderValue>,
    intake: Intake,
    counters: HttpCounters,
}

impl petrel_core::plugin::SourceConfig for HttpSourceConfig {
    fn type_name(&self) -> &'static str {
        "http"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let rt = NetRuntime::get(&ctx)?;
        let decode = Arc::new(HttpDecode {
            parse_failed: ctx.metrics.error_counter("parse_failed"),
        });
        let (intake, runner) = intake::start(&ctx, decode, &self.buffer, "http")?;
        let started = (|| -> anyhow::Result<HttpServer> {
            let tls = self.tls.as_ref().map(|t| t.server_config()).transpose()?;
            let m = &ctx.metrics;
            let shared = Arc::new(Shared {
                path: self.path.clone(),
                max_body: self.max_body_bytes,
                auth: self
                    .bearer_token
                    .as_ref()
                    .map(|t| HeaderValue::from_str(&format!("Bearer {t}")))
                    .transpose()?,
                intake,
                counters: HttpCounters {
                    stream: StreamCounters::new(&ctx),
                    unauthorized: m.error_counter("unauthorized"),
                    too_large: m.error_counter("body_too_large"),
                    bad_request: m.error_counter("bad_request"),
                    full: m.error_counter("buffer_full"),
                    timeouts: m.error_counter("body_timeout"),
                },
            });
            serve(rt.handle(), self.address, tls, self.limits, shared)
        })();
        let server = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = runner.wait_stopped(std::time::Instant::now());
                return Err(e);
            }
        };
        tracing::info!(source = %ctx.key, address = %self.address, path = %self.path, "listening (http)");
        Ok(Box::new(RunningNet::new(
            vec![Receiver::Other(Box::new(server))],
            runner,
            Some(rt),
        )))
    }
}

/// The request handler behind [`serve`]: one per source, shared by its
/// connections.
pub(crate) trait HttpHandler: Send + Sync + 'static {
    /// Answers one request from `peer`.
    fn handle(
        &self,
        req: Request<Incoming>,
        peer: Arc<str>,
    ) -> impl std::future::Future<Output = Response<Full<Bytes>>> + Send;
    /// The connection counters.
    fn stream_counters(&self) -> &StreamCounters;
}

impl HttpHandler for Shared {
    async fn handle(&self, req: Request<Incoming>, peer: Arc<str>) -> Response<Full<Bytes>> {
        handle(req, self, peer).await
    }

    fn stream_counters(&self) -> &StreamCounters {
        &self.counters.stream
    }
}

/// A running HTTP server (see [`serve`]).
pub(crate) struct HttpServer {
    stop: watch::Sender<bool>,
    alive: Arc<AtomicBool>,
}

impl OtherReceiver for HttpServer {
    fn stop(&mut self) {
        let _ = self.stop.send(true);
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// Serves HTTP/1.1 (TLS when `tls` is set) on `addr` with `shared`
/// answering requests: connection limits, slow-header and idle timeouts.
pub(crate) fn serve<H: HttpHandler>(
    rt: &tokio::runtime::Handle,
    addr: std::net::SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnLimits,
    shared: Arc<H>,
) -> anyhow::Result<HttpServer> {
    let std = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    std.set_nonblocking(true)?;
    let listener = {
        let _g = rt.enter();
        tokio::net::TcpListener::from_std(std)?
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let alive = Arc::new(AtomicBool::new(true));
    let alive2 = alive.clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    rt.spawn(async move {
        let mut stop = stop_rx.clone();
        loop {
            let (sock, peer) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stop.changed() => break,
            };
            let c = shared.stream_counters();
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                c.refused.inc();
                continue;
            };
            let peer: Arc<str> = peer.to_string().into();
            let (shared, acceptor, mut stop) = (shared.clone(), acceptor.clone(), stop_rx.clone());
            let idle = limits.idle_timeout;
            tokio::spawn(async move {
                let _permit = permit;
                let c = shared.stream_counters().clone();
                c.connections.inc();
                let svc = {
                    let (shared, peer) = (shared.clone(), peer.clone());
                    hyper::service::service_fn(move |req| {
                        let (shared, peer) = (shared.clone(), peer.clone());
                        async move { Ok::<_, Infallible>(shared.handle(req, peer).await) }
                    })
                };
                let builder = {
                    let mut b = hyper::server::conn::http1::Builder::new();
                    b.timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT);
                    b
                };
                match acceptor {
                    None => {
                        let conn =
                            builder.serve_connection(hyper_util::rt::TokioIo::new(sock), svc);
                        tokio::select! {
                            _ = tokio::time::timeout(idle, conn) => {}
                            _ = stop.changed() => {}
                        }
                    }
                    Some(a) => {
                        match tokio::time::timeout(Duration::from_secs(10), a.accept(sock)).await {
                            Ok(Ok(tls)) => {
                                let conn = builder
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
                                tokio::select! {
                                    _ = tokio::time::timeout(idle, conn) => {}
                                    _ = stop.changed() => {}
                                }
                            }
                            _ => {
                                c.tls_failed.inc();
                            }
                        }
                    }
                }
                c.connections.dec();
            });
        }
        alive2.store(false, Ordering::SeqCst);
    });
    Ok(HttpServer {
        stop: stop_tx,
        alive,
    })
}

fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    reply(status, &serde_json::json!({ "error": msg }).to_string())
}

async fn handle(req: Request<Incoming>, s: &Shared, peer: Arc<str>) -> Response<Full<Bytes>> {
    let c = &s.counters;
    if req.uri().path() != s.path {
        return error(
            StatusCode::NOT_FOUND,
            "no such path; POST events to the configured `path`",
        );
    }
    if req.method() != hyper::Method::POST {
        let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    if let Some(want) = &s.auth {
        let ok = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .is_some_and(|got| constant_time_eq(got.as_bytes(), want.as_bytes()));
        if !ok {
            c.unauthorized.inc();
            let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    }
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.max_body as u64) {
        c.too_large.inc();
        return too_large(s.max_body);
    }
    let kind = body_kind(req.headers().get(CONTENT_TYPE));
    let encoding = req
        .headers()
        .get(hyper::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let body = Limited::new(req.into_body(), s.max_body);
    let body = match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Err(_) => {
            c.timeouts.inc();
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "the body took too long to arrive",
            );
        }
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                c.too_large.inc();
                return too_large(s.max_body);
            }
            c.stream.read_errors.inc();
            return error(StatusCode::BAD_REQUEST, "cannot read the body");
        }
        Ok(Ok(b)) => b.to_bytes(),
    };
    let body = match encoding.as_deref() {
        None | Some("identity") | Some("") => body,
        Some("gzip") | Some("x-gzip") => {
            match inflate(flate2::read::MultiGzDecoder::new(&body[..]), s.max_body) {
                Ok(b) => b,
                Err(r) => return decode_error(r, c, s.max_body),
            }
        }
        Some("zstd") => match zstd::stream::read::Decoder::new(&body[..]) {
            Ok(d) => match inflate(d, s.max_body) {
                Ok(b) => b,
                Err(r) => return decode_error(r, c, s.max_body),
            },
            Err(_) => return decode_error(Inflate::Invalid, c, s.max_body),
        },
        // The LZ4 frame format (what `lz4 -c` writes), as the producer SDK sends it.
        Some("lz4") => match inflate(lz4_flex::frame::FrameDecoder::new(&body[..]), s.max_body) {
            Ok(b) => b,
            Err(r) => return decode_error(r, c, s.max_body),
        },
        Some(other) => {
            c.bad_request.inc();
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding `{other}`; use gzip, zstd, lz4 or none"),
            );
        }
    };
    let frames = match frames(&body, kind) {
        Ok(f) => f,
        Err(msg) => {
            c.bad_request.inc();
            return error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let n = frames.len();
    if n == 0 {
        return reply(StatusCode::OK, "{\"accepted\":0}");
    }
    let block = Block {
        buf: body,
        frames,
        peer: Some(peer),
        received_ns: now_ns(),
        json: kind != Kind::Text,
    };
    match s.intake.submit_and_wait(block, ADMIT_TIMEOUT).await {
        Admission::Accepted => reply(StatusCode::OK, &format!("{{\"accepted\":{n}}}")),
        Admission::Full => {
            c.full.inc();
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "buffer full; retry later");
            r.headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Admission::Failed(why) => error(StatusCode::SERVICE_UNAVAILABLE, &why),
    }
}

fn too_large(max: usize) -> Response<Full<Bytes>> {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("body larger than max_body_bytes ({max} bytes, after decompression); send smaller batches"),
    )
}

/// Why a body could not be decompressed.
pub(crate) enum Inflate {
    /// Larger than the limit once decompressed.
    TooLarge,
    /// Not in the format its `Content-Encoding` names.
    Invalid,
}

fn decode_error(e: Inflate, c: &HttpCounters, max: usize) -> Response<Full<Bytes>> {
    match e {
        Inflate::TooLarge => {
            c.too_large.inc();
            too_large(max)
        }
        Inflate::Invalid => {
            c.bad_request.inc();
            error(
                StatusCode::BAD_REQUEST,
                "the body does not match its Content-Encoding",
            )
        }
    }
}

/// Decompresses at most `max` bytes (a small bomb cannot grow past it).
pub(crate) fn inflate(r: impl Read, max: usize) -> Result<Bytes, Inflate> {
    let mut out = Vec::new();
    match r.take(max as u64 + 1).read_to_end(&mut out) {
        Ok(n) if n > max => Err(Inflate::TooLarge),
        Ok(_) => Ok(out.into()),
        Err(_) => Err(Inflate::Invalid),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// One object, an array of objects, or objects one per line.
    Json,
    /// Objects one per line.
    Ndjson,
    /// Text lines.
    Text,
}

fn body_kind(ct: Option<&HeaderValue>) -> Kind {
    let ct = ct.and_then(|v| v.to_str().ok()).map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    match ct.as_deref() {
        Some("application/json") => Kind::Json,
        Some(
            "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
            | "application/jsonlines",
        ) => Kind::Ndjson,
        _ => Kind::Text,
    }
}

/// The messages of a body.
fn frames(body: &[u8], kind: Kind) -> Result<Vec<Span>, String> {
    let first = body.iter().position(|b| !b.is_ascii_whitespace());
    if kind == Kind::Json && first.is_some_and(|i| body[i] == b'[') {
        let items: Vec<&serde_json::value::RawValue> =
            serde_json::from_slice(body).map_err(|e| format!("invalid JSON array: {e}"))?;
        let base = body.as_ptr() as usize;
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let t = it.get();
            if !t.starts_with('{') {
                return Err("a JSON array body must hold objects".into());
            }
            out.push(Span::new(t.as_ptr() as usize - base, t.len()));
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut push = |s: usize, e: usize| {
        let mut e = e;
        if e > s && body[e - 1] == b'\r' {
            e -= 1;
        }
        let line = &body[s..e];
        if kind == Kind::Text {
            if !line.is_empty() {
                out.push(Span::new(s, e - s));
            }
        } else if line.iter().any(|b| !b.is_ascii_whitespace()) {
            out.push(Span::new(s, e - s));
        }
    };
    for nl in memchr::memchr_iter(b'\n', body) {
        push(start, nl);
        start = nl + 1;
    }
    if start < body.len() {
        push(start, body.len());
    }
    Ok(out)
}

/// Compares secrets in a time that does not depend on where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// JSON frames become fields; text frames are messages.
struct HttpDecode {
    parse_failed: LazyCounter,
}

impl Decode for HttpDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        if !block.json {
            batch
                .events
                .extend(block.frames.iter().map(|s| Event::from_span(*s)));
            return;
        }
        let parser = JsonParser::new(None);
        let mut fields = Vec::new();
        for s in &block.frames {
            fields.clear();
            match parser.parse(s.get(&block.buf), Some(s.start), &mut fields) {
                Ok(()) => {
                    let mut ev = Event {
                        message: Value::Null,
                        fields: Vec::with_capacity(fields.len()),
                        time_ns: None,
                    };
                    for (k, v) in fields.drain(..) {
                        ev.set(k, v);
                    }
                    batch.events.push(ev);
                }
                Err(_) => {
                    // Kept whole as the message, never dropped.
                    self.parse_failed.inc();
                    batch.events.push(Event::from_span(*s));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(body: &[u8], kind: Kind) -> Vec<String> {
        frames(body, kind)
            .unwrap()
            .iter()
            .map(|s| String::from_utf8_lossy(s.get(body)).into_owned())
            .collect()
    }

    #[test]
    fn bodies_are_cut_by_content_type() {
        assert_eq!(
            texts(b" [{\"a\":1}, {\"b\":[1,2]}]", Kind::Json),
            vec!["{\"a\":1}", "{\"b\":[1,2]}"]
        );
        assert_eq!(
            texts(b"{\"a\":1}\r\n\n  \n{\"b\":2}", Kind::Json),
            vec!["{\"a\":1}", "{\"b\":2}"]
        );
        assert_eq!(
            texts(b"one\r\ntwo\n\nthree", Kind::Text),
            vec!["one", "two", "three"]
        );
        assert!(frames(b"[1,2]", Kind::Json).is_err());
        assert!(frames(b"[{\"a\":1}", Kind::Json).is_err());
        assert_eq!(
            body_kind(Some(&HeaderValue::from_static(
                "application/json; charset=utf-8"
            ))),
            Kind::Json
        );
        assert_eq!(body_kind(None), Kind::Text);
    }

    #[test]
    fn decompression_stops_at_the_limit() {
        let big = vec![b'a'; 100_000];
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &big).unwrap();
        let gz = gz.finish().unwrap();
        assert!(gz.len() < 1000);
        assert!(matches!(
            inflate(flate2::read::MultiGzDecoder::new(&gz[..]), 50_000),
            Err(Inflate::TooLarge)
        ));
        assert_eq!(
            inflate(flate2::read::MultiGzDecoder::new(&gz[..]), 100_000)
                .ok()
                .map(|b| b.len()),
            Some(100_000)
        );
        assert!(matches!(
            inflate(flate2::read::MultiGzDecoder::new(&b"not gzip"[..]), 100),
            Err(Inflate::Invalid)
        ));
    }

    #[test]
    fn lz4_frames_are_inflated_within_the_limit() {
        let body = b"{\"a\":1}\n".repeat(10_000);
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        std::io::Write::write_all(&mut enc, &body).unwrap();
        let lz = enc.finish().unwrap();
        assert!(lz.len() < body.len() / 10);
        let got = inflate(lz4_flex::frame::FrameDecoder::new(&lz[..]), body.len()).ok();
        assert_eq!(got.as_deref(), Some(&body[..]));
        assert!(matches!(
            inflate(lz4_flex::frame::FrameDecoder::new(&lz[..]), body.len() - 1),
            Err(Inflate::TooLarge)
        ));
        assert!(matches!(
            inflate(
                lz4_flex::frame::FrameDecoder::new(&b"not lz4 at all"[..]),
                100
            ),
            Err(Inflate::Invalid)
        ));
    }
}
