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

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{Event, EventBatch, Span, Value};

use super::net::body;
use super::net::intake::{self, Admission, Intake};
use super::net::server;
use super::net::stream::StreamCounters;
use super::net::tls::TlsOptions;
use super::net::{
    now_ns, parse_address, Block, BufferOptions, ConnLimits, Decode, ListenAddr, NetRuntime,
    Receiver, RunningNet,
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
    crate::sources::net::server::AUTH_DOC,
    petrel_core::plugin::KeyDoc {
        name: "buffer",
        kind: petrel_core::plugin::KeyKind::Map,
        default: Some(r#"{type: memory}"#),
        doc: r#"Where received data waits until every sink acknowledged it: `{type, max_size, when_full, sync_interval_ms}`. `type: memory` (the default) charges it to the pipeline's memory budget (lost if the agent is killed); `type: disk` appends it to a spool under the data dir before it counts as accepted. `max_size` (disk only, default `256MiB`, at least `1MiB`; `max_bytes` is its deprecated name) bounds undelivered data; `when_full`: `block` (default: stop reading, HTTP answers 503) or `drop_newest` (counted, `reason=buffer_full`); `sync_interval_ms` (disk only, default `100`, at most 60000): socket data is synced within this time. See the delivery guarantee chapter of the book. With `type: disk`, `max_size` must be at least twice `max_body_bytes`."#,
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

/// Reading a body may take this long.
/// Reading a body may take this long, and at most `idle_timeout_secs`:
/// a client trickling a byte now and then is never idle, so this is what
/// cuts it off.
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
        let bearer_token = server::parse_bearer_auth(&map);
        let buffer = BufferOptions::parse(&map);
        if let Some(b) = buffer.as_ref().filter(|b| b.disk) {
            // A request is one spool record: a body that cannot fit (with
            // room for the others in flight) would be refused forever.
            if max_body_bytes as u64 > b.max_bytes / 2 {
                let node = map
                    .get("buffer")
                    .and_then(|n| n.as_map_quiet())
                    .and_then(|m| m.get("max_size").or_else(|| m.get("max_bytes")))
                    .or_else(|| map.get("max_body_bytes"))
                    .unwrap_or_else(|| map.node());
                node.error(format!(
                    "`buffer.max_size` ({}) must be at least twice `max_body_bytes` ({max_body_bytes}): every request is one spool record; raise `buffer.max_size` or lower `max_body_bytes`",
                    b.max_bytes
                ));
                return None;
            }
        }
        let address = match address? {
            ListenAddr::Inet(a) => a,
            ListenAddr::Unix(_) => return None,
        };
        Some(Self {
            address,
            path: path?,
            max_body_bytes: max_body_bytes.max(1024),
            limits: ConnLimits::parse(&map),
            tls: tls?,
            bearer_token: bearer_token?,
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
    body_timeout: Duration,
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
        let started = (|| -> anyhow::Result<server::ServerHandle> {
            let tls = self
                .tls
                .as_ref()
                .map(|t| t.server_config(&crate::tls::Owner::of(&ctx.metrics)))
                .transpose()?;
            let m = &ctx.metrics;
            let shared = Arc::new(Shared {
                path: self.path.clone(),
                max_body: self.max_body_bytes,
                body_timeout: BODY_TIMEOUT.min(self.limits.idle_timeout),
                auth: match &self.bearer_token {
                    None => None,
                    Some(t) => Some(server::bearer_header(t).ok_or_else(|| {
                        anyhow::anyhow!("`auth.bearer_token` is not a valid header value")
                    })?),
                },
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
            let counters = shared.counters.stream.clone();
            let handler: server::Handler = Arc::new(move |req, peer| {
                let shared = shared.clone();
                Box::pin(async move { handle(req, &shared, peer).await })
            });
            server::serve_http(
                rt.handle(),
                self.address,
                tls,
                self.limits,
                counters,
                handler,
            )
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
    if !server::authorized(req.headers(), s.auth.as_ref()) {
        c.unauthorized.inc();
        let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
        return r;
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
    let encoding = match body::Encoding::parse(
        req.headers()
            .get(hyper::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok()),
        &[
            body::Encoding::Gzip,
            body::Encoding::Zstd,
            body::Encoding::Lz4,
        ],
    ) {
        Ok(e) => e,
        Err(other) => {
            c.bad_request.inc();
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding `{other}`; use gzip, zstd, lz4 or none"),
            );
        }
    };
    let body = match body::read(req.into_body(), s.max_body, s.body_timeout).await {
        Ok(b) => b,
        Err(body::ReadError::Timeout) => {
            c.timeouts.inc();
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "the body took too long to arrive",
            );
        }
        Err(body::ReadError::TooLarge) => {
            c.too_large.inc();
            return too_large(s.max_body);
        }
        Err(body::ReadError::Failed) => {
            c.stream.read_errors.inc();
            return error(StatusCode::BAD_REQUEST, "cannot read the body");
        }
    };
    let body = match body::decode(encoding, body, s.max_body) {
        Ok(b) => b,
        Err(e) => return decode_error(e, c, s.max_body),
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

fn decode_error(e: body::Inflate, c: &HttpCounters, max: usize) -> Response<Full<Bytes>> {
    match e {
        body::Inflate::TooLarge => {
            c.too_large.inc();
            too_large(max)
        }
        body::Inflate::Invalid(_) => {
            c.bad_request.inc();
            error(StatusCode::BAD_REQUEST, &e.message(max))
        }
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
                        hidden: petrel_core::Hidden::NONE,
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
}
