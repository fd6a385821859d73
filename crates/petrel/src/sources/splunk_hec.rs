//! `type: splunk_hec` — the Splunk HTTP Event Collector protocol.
//!
//! ```yaml
//! sources:
//!   - type: splunk_hec
//!     address: 0.0.0.0:8088
//!     tokens:
//!       - "${HEC_TOKEN}"
//!       - { token: "${TEAM_A_TOKEN}", fields: { team: a } }
//!     ack: { enabled: true }
//!     buffer: { type: disk }
//! ```
//! Endpoints: `/services/collector/event` (and `/services/collector`):
//! JSON event objects, concatenated or separated by whitespace;
//! `/services/collector/raw`: text, one event per line;
//! `/services/collector/ack`: indexer acknowledgement queries;
//! `/services/collector/health`. Answers carry HEC's own codes and JSON
//! (`{"text":"Success","code":0}`).
//!
//! A request is accepted whole or not at all: one bad event (invalid JSON,
//! no `event`) refuses the request with HEC's code and the event's index,
//! so a client that fixes and resends it never duplicates the good ones.
//!
//! Each request's context (the channel, the token's fields, the `host`,
//! `source`, `sourcetype` and `index` query parameters) travels inside its
//! frames, so that a disk buffer replays them exactly: a frame is the event
//! object as sent, or `0x1E <context JSON> 0x1E <event or line>` (JSON never
//! holds a raw 0x1E).
//!
//! Indexer acknowledgement: with `ack.enabled` an answer carries an
//! `ackId`, counted per channel (`X-Splunk-Request-Channel` or the
//! `channel` query parameter), which turns true once every sink delivered
//! the request's events (memory buffer) or once they are durable in the
//! spool (disk buffer).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use petrel_core::config::{Map, Node};
use petrel_core::plugin::{KeyDoc, KeyKind, Source, SourceContext, SourcePlugin};
use petrel_core::LazyCounter;
use petrel_core::{Event, EventBatch, Key, Span, Value};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::net::body;
use super::net::intake::{self, Admission, Intake, OnDelivered};
use super::net::server;
use super::net::stream::StreamCounters;
use super::net::tls::TlsOptions;
use super::net::{
    now_ns, parse_address, Block, BufferOptions, ConnLimits, Decode, ListenAddr, NetRuntime,
    Receiver, RunningNet,
};
use crate::processors::parse_json::JsonParser;

/// Keys accepted by the splunk_hec source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "address",
    "tokens",
    "tokens_file",
    "allow_query_token",
    "ack",
    "max_body_bytes",
    "max_connections",
    "idle_timeout_secs",
    "tls",
    "buffer",
];

/// Keys of `ack:`.
const ACK_KEYS: &[&str] = &["enabled", "max_pending_acks_per_channel", "max_channels"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Receives the Splunk HTTP Event Collector protocol (what Splunk logging libraries, the OpenTelemetry Collector's `splunk_hec` exporter and Splunk forwarders send): `/services/collector/event` (JSON events, batched or concatenated), `/services/collector/raw` (lines), `/services/collector/ack` (indexer acknowledgement), `/services/collector/health`; `Authorization: Splunk <token>`; gzip bodies. `event` text becomes the message; an `event` object becomes fields (its `message` or `log` the message, else its JSON); `time` (epoch seconds) the event time; `host`, `source`, `sourcetype`, `index` the fields `splunk.host`, `splunk.source`, `splunk.sourcetype`, `splunk.index`; `fields` fields; the channel `splunk.channel`. A request is accepted whole or refused whole with HEC's error code."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "address",
        kind: KeyKind::String,
        default: None,
        doc: r#"Required: `host:port` to listen on (HEC's usual port is 8088)."#,
    },
    KeyDoc {
        name: "tokens",
        kind: KeyKind::List,
        default: None,
        doc: r#"Accepted tokens: strings, or `{token, fields}` whose `fields` (a map of strings) are added to every event sent with that token. `${ENV}` is expanded at load. Without `tokens` and `tokens_file`, requests need no token (trusted networks only)."#,
    },
    KeyDoc {
        name: "tokens_file",
        kind: KeyKind::String,
        default: None,
        doc: r#"A file of more accepted tokens, one per line (blank lines and `#` comments skipped), read at load and on reload."#,
    },
    KeyDoc {
        name: "allow_query_token",
        kind: KeyKind::Bool,
        default: Some("false"),
        doc: r#"Also accept the token as the `token` query parameter (HEC's `allowQueryStringAuth`); when false such a request gets HEC code 16."#,
    },
    KeyDoc {
        name: "ack",
        kind: KeyKind::Map,
        default: Some("{enabled: false}"),
        doc: r#"Indexer acknowledgement: `{enabled, max_pending_acks_per_channel, max_channels}`. When enabled, `/event` and `/raw` need a channel (`X-Splunk-Request-Channel` header or `channel` query parameter; HEC code 10 otherwise) and answer `{"text":"Success","code":0,"ackId":N}`; `POST /services/collector/ack` with `{"acks":[N,...]}` answers `{"acks":{"N":true|false}}`, true once the request's events were delivered by every sink (memory buffer) or are durable in the spool (disk buffer); a status reported true is forgotten. A channel keeps at most `max_pending_acks_per_channel` (default `1000`) statuses not yet reported true, dropping the oldest beyond (counted `ack_status_dropped`: the client sees false and sends again, a duplicate, never a loss); at most `max_channels` (default `1000`) channels are kept, the least recently used one forgotten beyond (counted `ack_channel_evicted`)."#,
    },
    KeyDoc {
        name: "max_body_bytes",
        kind: KeyKind::Bytes,
        default: Some(r#"10MiB"#),
        doc: r#"Largest request body, also after decompression (413 beyond)."#,
    },
    crate::sources::net::MAX_CONNECTIONS_DOC,
    crate::sources::net::IDLE_TIMEOUT_DOC,
    crate::sources::net::tls::TLS_DOC,
    KeyDoc {
        name: "buffer",
        kind: KeyKind::Map,
        default: Some(r#"{type: memory}"#),
        doc: r#"Where received data waits until every sink acknowledged it: `{type, max_size, when_full, sync_interval_ms}`. `type: memory` (the default) charges it to the pipeline's memory budget (lost if the agent is killed); `type: disk` appends it to a spool under the data dir before the request is answered. `max_size` (disk only, default `256MiB`, at least `1MiB`; `max_bytes` is its deprecated name, at least twice `max_body_bytes`) bounds undelivered data; `when_full`: `block` (default: HEC code 9, HTTP 503) or `drop_newest`; `sync_interval_ms` (disk only, default `100`). See the delivery guarantee chapter of the book."#,
    },
];

/// Registration of `type: splunk_hec`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "splunk_hec",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| HecConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Reading a body may take this long.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request waits for admission before 503.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest channel name accepted (HEC's are GUIDs, 36 characters).
const MAX_CHANNEL_LEN: usize = 128;
/// Separates a frame's context from its payload.
const CTX_MARK: u8 = 0x1e;

/// An accepted token and the fields it adds.
#[derive(Debug, Clone)]
struct Token {
    token: String,
    fields: Vec<(String, String)>,
}

/// Configuration of the splunk_hec source.
#[derive(Debug, Clone)]
pub struct HecConfig {
    address: std::net::SocketAddr,
    tokens: Vec<Token>,
    allow_query_token: bool,
    ack: Option<AckLimits>,
    max_body_bytes: usize,
    limits: ConnLimits,
    tls: Option<TlsOptions>,
    buffer: BufferOptions,
}

/// Bounds of the acknowledgement state.
#[derive(Debug, Clone, Copy)]
struct AckLimits {
    max_pending: usize,
    max_channels: usize,
}

fn expand(n: &Node<'_>) -> Option<String> {
    match n.as_str()? {
        "" => {
            n.error("the token is empty (an unset environment variable?); set it or remove it");
            None
        }
        v => Some(v.to_string()),
    }
}

fn parse_token(n: Node<'_>) -> Option<Token> {
    if n.as_map_quiet().is_none() {
        return Some(Token {
            token: expand(&n)?,
            fields: Vec::new(),
        });
    }
    let m = n.as_map(&["token", "fields"])?;
    let token = expand(&m.required("token", "\"${HEC_TOKEN}\"")?)?;
    let mut fields = Vec::new();
    let mut ok = true;
    if let Some(f) = m.get("fields") {
        match f.as_map_quiet() {
            Some(fm) => {
                for (k, v) in fm.entries() {
                    match v.as_str() {
                        Some(v) => fields.push((k.to_string(), v.to_string())),
                        None => ok = false,
                    }
                }
            }
            None => {
                f.error("`fields` must be a map of names to strings, e.g. `fields: { team: a }`");
                ok = false;
            }
        }
    }
    ok.then_some(Token { token, fields })
}

impl HecConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let address = parse_address(&map, false, "0.0.0.0:8088");
        let mut ok = true;
        let mut tokens = Vec::new();
        if let Some(n) = map.get("tokens") {
            for item in n.as_list() {
                match parse_token(item) {
                    Some(t) => tokens.push(t),
                    None => ok = false,
                }
            }
        }
        if let Some(n) = map.get("tokens_file") {
            if let Some(path) = n.as_str() {
                match std::fs::read_to_string(path) {
                    Ok(text) => tokens.extend(
                        text.lines()
                            .map(str::trim)
                            .filter(|l| !l.is_empty() && !l.starts_with('#'))
                            .map(|l| Token {
                                token: l.to_string(),
                                fields: Vec::new(),
                            }),
                    ),
                    Err(e) => {
                        n.error(format!(
                            "cannot read the tokens file `{path}`: {e}; fix the path or its permissions"
                        ));
                        ok = false;
                    }
                }
            } else {
                ok = false;
            }
        }
        let allow_query_token = map.bool("allow_query_token").unwrap_or(false);
        let ack = match map.get("ack") {
            None => None,
            Some(n) => match n.as_map(ACK_KEYS) {
                Some(m) => {
                    let enabled = m.bool("enabled").unwrap_or(false);
                    let limits = AckLimits {
                        max_pending: m
                            .u64("max_pending_acks_per_channel", false)
                            .unwrap_or(1000)
                            .max(1) as usize,
                        max_channels: m.u64("max_channels", false).unwrap_or(1000).max(1) as usize,
                    };
                    enabled.then_some(limits)
                }
                None => {
                    ok = false;
                    None
                }
            },
        };
        let max_body_bytes = map.u64("max_body_bytes", true).unwrap_or(10 << 20) as usize;
        let tls = TlsOptions::parse(&map);
        let buffer = BufferOptions::parse(&map);
        if let Some(b) = buffer.as_ref().filter(|b| b.disk) {
            if max_body_bytes as u64 > b.max_bytes / 2 {
                map.get("buffer").unwrap_or_else(|| map.node()).error(format!(
                    "`buffer.max_size` ({}) must be at least twice `max_body_bytes` ({max_body_bytes}): every request is one spool record; raise `buffer.max_size` or lower `max_body_bytes`",
                    b.max_bytes
                ));
                ok = false;
            }
        }
        let address = match address? {
            ListenAddr::Inet(a) => a,
            ListenAddr::Unix(_) => return None,
        };
        if !ok {
            return None;
        }
        Some(Self {
            address,
            tokens,
            allow_query_token,
            ack,
            max_body_bytes: max_body_bytes.max(1024),
            limits: ConnLimits::parse(&map),
            tls: tls?,
            buffer: buffer?,
        })
    }
}

impl petrel_core::plugin::SourceConfig for HecConfig {
    fn type_name(&self) -> &'static str {
        "splunk_hec"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let rt = NetRuntime::get(&ctx)?;
        let decode = Arc::new(HecDecode {
            parse_failed: ctx.metrics.error_counter("parse_failed"),
        });
        let (intake, runner) = intake::start(&ctx, decode, &self.buffer, "splunk_hec")?;
        let started = (|| -> anyhow::Result<_> {
            let tls = self
                .tls
                .as_ref()
                .map(|t| t.server_config(&crate::tls::Owner::of(&ctx.metrics)))
                .transpose()?;
            let m = &ctx.metrics;
            let shared = Arc::new(Shared {
                tokens: self.tokens.clone(),
                allow_query_token: self.allow_query_token,
                max_body: self.max_body_bytes,
                disk: self.buffer.disk,
                acks: self.ack.map(|limits| {
                    Arc::new(AckState {
                        limits,
                        channels: Mutex::new(HashMap::new()),
                        dropped: m.error_counter("ack_status_dropped"),
                        evicted: m.error_counter("ack_channel_evicted"),
                    })
                }),
                intake,
                counters: Counters {
                    stream: StreamCounters::new(&ctx),
                    token_required: m.error_counter("token_required"),
                    invalid_token: m.error_counter("invalid_token"),
                    invalid_data: m.error_counter("invalid_data"),
                    too_large: m.error_counter("body_too_large"),
                    timeouts: m.error_counter("body_timeout"),
                    full: m.error_counter("buffer_full"),
                },
            });
            let counters = shared.counters.stream.clone();
            let handler: server::Handler = Arc::new(move |req, peer| {
                let shared = shared.clone();
                Box::pin(async move { shared.handle(req, peer).await })
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
                let _ = runner.wait_stopped(Instant::now());
                return Err(e);
            }
        };
        tracing::info!(source = %ctx.key, address = %self.address, ack = self.ack.is_some(), "listening (splunk_hec)");
        Ok(Box::new(RunningNet::new(
            vec![Receiver::Other(Box::new(server))],
            runner,
            Some(rt),
        )))
    }
}

#[derive(Clone)]
struct Counters {
    stream: StreamCounters,
    token_required: LazyCounter,
    invalid_token: LazyCounter,
    invalid_data: LazyCounter,
    too_large: LazyCounter,
    timeouts: LazyCounter,
    full: LazyCounter,
}

struct Shared {
    tokens: Vec<Token>,
    allow_query_token: bool,
    max_body: usize,
    disk: bool,
    acks: Option<Arc<AckState>>,
    intake: Intake,
    counters: Counters,
}

// ---------------------------------------------------------------------------
// Indexer acknowledgement

/// Ack statuses by channel.
struct AckState {
    limits: AckLimits,
    channels: Mutex<HashMap<String, Channel>>,
    dropped: LazyCounter,
    evicted: LazyCounter,
}

struct Channel {
    next_id: u64,
    /// Statuses not yet reported true: delivered or not.
    status: BTreeMap<u64, bool>,
    last_used: Instant,
}

impl AckState {
    /// A new ack id on `channel`, false until [`set`](Self::set).
    fn allocate(&self, channel: &str) -> u64 {
        let mut chans = self.channels.lock();
        if !chans.contains_key(channel) && chans.len() >= self.limits.max_channels {
            let oldest = chans
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                chans.remove(&k);
                self.evicted.inc();
            }
        }
        let c = chans.entry(channel.to_string()).or_insert_with(|| Channel {
            next_id: 0,
            status: BTreeMap::new(),
            last_used: Instant::now(),
        });
        c.last_used = Instant::now();
        while c.status.len() >= self.limits.max_pending {
            c.status.pop_first();
            self.dropped.inc();
        }
        let id = c.next_id;
        c.next_id += 1;
        c.status.insert(id, false);
        id
    }

    /// Marks `id` of `channel` delivered.
    fn set(&self, channel: &str, id: u64) {
        if let Some(c) = self.channels.lock().get_mut(channel) {
            if let Some(s) = c.status.get_mut(&id) {
                *s = true;
            }
        }
    }

    /// Forgets `id` (its request was not accepted).
    fn forget(&self, channel: &str, id: u64) {
        if let Some(c) = self.channels.lock().get_mut(channel) {
            c.status.remove(&id);
        }
    }

    /// The statuses of `ids`; those reported true are forgotten.
    fn query(&self, channel: &str, ids: &[u64]) -> serde_json::Map<String, serde_json::Value> {
        let mut chans = self.channels.lock();
        let mut c = chans.get_mut(channel);
        if let Some(c) = c.as_deref_mut() {
            c.last_used = Instant::now();
        }
        let mut out = serde_json::Map::new();
        for id in ids {
            let done = match c.as_deref_mut() {
                Some(c) if c.status.get(id) == Some(&true) => {
                    c.status.remove(id);
                    true
                }
                _ => false,
            };
            out.insert(id.to_string(), serde_json::Value::Bool(done));
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Requests

/// HEC's answer: `{"text":..,"code":..}` plus extra members.
fn hec(status: StatusCode, code: u32, text: &str) -> Response<Full<Bytes>> {
    hec_with(status, serde_json::json!({ "text": text, "code": code }))
}

fn hec_with(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn busy() -> Response<Full<Bytes>> {
    let mut r = hec(StatusCode::SERVICE_UNAVAILABLE, 9, "Server is busy");
    r.headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Event,
    Raw,
    Ack,
    Health,
}

fn endpoint(path: &str) -> Option<Endpoint> {
    let path = path.trim_end_matches('/');
    let rest = path.strip_prefix("/services/collector")?;
    let rest = rest.strip_suffix("/1.0").unwrap_or(rest);
    match rest {
        "" | "/event" => Some(Endpoint::Event),
        "/raw" => Some(Endpoint::Raw),
        "/ack" => Some(Endpoint::Ack),
        "/health" => Some(Endpoint::Health),
        _ => None,
    }
}

/// The query parameters of `req`, decoded.
fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    req.uri()
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// One event object of an `/event` body, as far as checking it needs.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    event: Option<&'a RawValue>,
    #[serde(borrow, default)]
    fields: Option<&'a RawValue>,
}

/// Why an `/event` body is refused: HEC code, text, event index.
type Refusal = (u32, &'static str, usize);

/// The byte ranges of the event objects of an `/event` body.
fn event_ranges(body: &[u8]) -> Result<Vec<(usize, usize)>, Refusal> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(body).into_iter::<Probe<'_>>();
    let mut pos = 0;
    loop {
        let start = pos
            + body[pos..]
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(body.len() - pos);
        if start == body.len() {
            break;
        }
        if body[start] != b'{' {
            return Err((6, "Invalid data format", out.len()));
        }
        match stream.next() {
            None => break,
            Some(Err(_)) => return Err((6, "Invalid data format", out.len())),
            Some(Ok(p)) => {
                match p.event.map(|e| e.get()) {
                    None => return Err((12, "Event field is required", out.len())),
                    Some("\"\"") => return Err((13, "Event field cannot be blank", out.len())),
                    Some(_) => {}
                }
                if p.fields.is_some_and(|f| !f.get().starts_with('{')) {
                    return Err((15, "Error in handling indexed fields", out.len()));
                }
                pos = stream.byte_offset();
                // Deeper than the parser goes: refused as invalid data now,
                // not stored as one unparsed message.
                if petrel_core::json::nesting_exceeds(
                    &body[start..pos],
                    petrel_core::json::MAX_JSON_DEPTH,
                ) {
                    return Err((6, "Invalid data format", out.len()));
                }
                out.push((start, pos));
            }
        }
    }
    Ok(out)
}

/// The lines of a `/raw` body.
fn raw_ranges(body: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut push = |s: usize, mut e: usize| {
        if e > s && body[e - 1] == b'\r' {
            e -= 1;
        }
        if body[s..e].iter().any(|b| !b.is_ascii_whitespace()) {
            out.push((s, e));
        }
    };
    for nl in memchr::memchr_iter(b'\n', body) {
        push(start, nl);
        start = nl + 1;
    }
    if start < body.len() {
        push(start, body.len());
    }
    out
}

impl Shared {
    /// The token of the request, checked: `Err` is HEC's answer.
    #[allow(clippy::result_large_err)]
    fn authorize(
        &self,
        req: &Request<Incoming>,
        q: &[(String, String)],
    ) -> Result<Option<&Token>, Response<Full<Bytes>>> {
        if self.tokens.is_empty() {
            return Ok(None);
        }
        let c = &self.counters;
        let header = req.headers().get(hyper::header::AUTHORIZATION);
        let given: &[u8] = match (header, param(q, "token")) {
            (Some(h), _) => {
                let h = h.as_bytes();
                let Some(t) = h
                    .strip_prefix(b"Splunk ")
                    .or_else(|| h.strip_prefix(b"splunk "))
                else {
                    c.invalid_token.inc();
                    return Err(hec(StatusCode::UNAUTHORIZED, 3, "Invalid authorization"));
                };
                t
            }
            (None, Some(_)) if !self.allow_query_token => {
                c.token_required.inc();
                return Err(hec(
                    StatusCode::BAD_REQUEST,
                    16,
                    "Query string authorization is not enabled",
                ));
            }
            (None, Some(t)) => t.as_bytes(),
            (None, None) => {
                c.token_required.inc();
                return Err(hec(StatusCode::UNAUTHORIZED, 2, "Token is required"));
            }
        };
        let given = given.trim_ascii();
        // Every token is compared, so the time taken says nothing of which
        // one came close.
        let mut found = None;
        for t in &self.tokens {
            if server::same_secret(t.token.as_bytes(), given) && found.is_none() {
                found = Some(t);
            }
        }
        match found {
            Some(t) => Ok(Some(t)),
            None => {
                c.invalid_token.inc();
                Err(hec(StatusCode::FORBIDDEN, 4, "Invalid token"))
            }
        }
    }

    async fn body(&self, req: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
        let c = &self.counters;
        let declared = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body as u64) {
            c.too_large.inc();
            return Err(self.too_large());
        }
        let encoding = match body::Encoding::parse(
            req.headers()
                .get(hyper::header::CONTENT_ENCODING)
                .and_then(|v| v.to_str().ok()),
            &[body::Encoding::Gzip],
        ) {
            Ok(e) => e,
            Err(_) => {
                c.invalid_data.inc();
                return Err(hec(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    6,
                    "Unsupported Content-Encoding; use gzip or none",
                ));
            }
        };
        let body = match body::read(req.into_body(), self.max_body, BODY_TIMEOUT).await {
            Ok(b) => b,
            Err(body::ReadError::Timeout) => {
                c.timeouts.inc();
                return Err(hec(
                    StatusCode::REQUEST_TIMEOUT,
                    6,
                    "The body took too long to arrive",
                ));
            }
            Err(body::ReadError::TooLarge) => {
                c.too_large.inc();
                return Err(self.too_large());
            }
            Err(body::ReadError::Failed) => {
                c.stream.read_errors.inc();
                return Err(hec(StatusCode::BAD_REQUEST, 6, "Invalid data format"));
            }
        };
        match body::decode(encoding, body, self.max_body) {
            Ok(b) => Ok(b),
            Err(body::Inflate::TooLarge) => {
                c.too_large.inc();
                Err(self.too_large())
            }
            Err(body::Inflate::Invalid(_)) => {
                c.invalid_data.inc();
                Err(hec(StatusCode::BAD_REQUEST, 6, "Invalid data format"))
            }
        }
    }

    fn too_large(&self) -> Response<Full<Bytes>> {
        hec_with(
            StatusCode::PAYLOAD_TOO_LARGE,
            serde_json::json!({
                "text": format!("Content too large (max_body_bytes is {} bytes, after decompression); send smaller batches", self.max_body),
                "code": 6,
            }),
        )
    }

    async fn handle(&self, req: Request<Incoming>, peer: Arc<str>) -> Response<Full<Bytes>> {
        let Some(ep) = endpoint(req.uri().path()) else {
            return hec(
                StatusCode::NOT_FOUND,
                404,
                "The requested URL was not found on this server.",
            );
        };
        if ep == Endpoint::Health {
            return hec(StatusCode::OK, 17, "HEC is healthy");
        }
        if req.method() != Method::POST {
            let mut r = hec(StatusCode::METHOD_NOT_ALLOWED, 404, "Use POST");
            r.headers_mut()
                .insert(hyper::header::ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        let q = query(&req);
        let token = match self.authorize(&req, &q) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let channel = req
            .headers()
            .get("x-splunk-request-channel")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| param(&q, "channel").map(str::to_string))
            .filter(|c| !c.is_empty());
        if channel
            .as_ref()
            .is_some_and(|c| c.len() > MAX_CHANNEL_LEN || c.bytes().any(|b| b < 0x20))
        {
            self.counters.invalid_data.inc();
            return hec(StatusCode::BAD_REQUEST, 11, "Invalid data channel");
        }
        if ep == Endpoint::Ack {
            return self.ack_query(req, channel.as_deref()).await;
        }
        if self.acks.is_some() && channel.is_none() {
            self.counters.invalid_data.inc();
            return hec(StatusCode::BAD_REQUEST, 10, "Data channel is missing");
        }
        let body = match self.body(req).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let ranges = if ep == Endpoint::Event {
            match event_ranges(&body) {
                Ok(r) => r,
                Err((code, text, n)) => {
                    self.counters.invalid_data.inc();
                    return hec_with(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"text": text, "code": code, "invalid-event-number": n}),
                    );
                }
            }
        } else {
            raw_ranges(&body)
        };
        if ranges.is_empty() {
            self.counters.invalid_data.inc();
            return hec(StatusCode::BAD_REQUEST, 5, "No data");
        }
        let context = context(token, channel.as_deref(), &q);
        let block = build_block(
            body,
            &ranges,
            context.as_deref(),
            ep == Endpoint::Event,
            peer,
        );
        self.submit(block, channel.as_deref()).await
    }

    async fn submit(&self, block: Block, channel: Option<&str>) -> Response<Full<Bytes>> {
        let ack = match (&self.acks, channel) {
            (Some(a), Some(ch)) => Some((a.clone(), ch.to_string(), a.allocate(ch))),
            _ => None,
        };
        let on_delivered: Option<OnDelivered> = match &ack {
            Some((a, ch, id)) if !self.disk => {
                let (a, ch, id) = (a.clone(), ch.clone(), *id);
                Some(Box::new(move || a.set(&ch, id)))
            }
            _ => None,
        };
        match self
            .intake
            .submit_tracked(block, ADMIT_TIMEOUT, on_delivered)
            .await
        {
            Admission::Accepted => match ack {
                Some((a, ch, id)) => {
                    if self.disk {
                        // Answered once durable in the spool.
                        a.set(&ch, id);
                    }
                    hec_with(
                        StatusCode::OK,
                        serde_json::json!({"text": "Success", "code": 0, "ackId": id}),
                    )
                }
                None => hec(StatusCode::OK, 0, "Success"),
            },
            Admission::Full => {
                if let Some((a, ch, id)) = ack {
                    a.forget(&ch, id);
                }
                self.counters.full.inc();
                busy()
            }
            Admission::Failed(why) => {
                if let Some((a, ch, id)) = ack {
                    a.forget(&ch, id);
                }
                tracing::warn!(reason = %why, "splunk_hec: request not accepted");
                hec_with(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({"text": format!("Server is busy: {why}"), "code": 9}),
                )
            }
        }
    }

    async fn ack_query(
        &self,
        req: Request<Incoming>,
        channel: Option<&str>,
    ) -> Response<Full<Bytes>> {
        let Some(acks) = &self.acks else {
            return hec(StatusCode::BAD_REQUEST, 14, "ACK is disabled");
        };
        let Some(channel) = channel else {
            self.counters.invalid_data.inc();
            return hec(StatusCode::BAD_REQUEST, 10, "Data channel is missing");
        };
        let body = match self.body(req).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        #[derive(Deserialize)]
        struct AckQuery {
            acks: Vec<u64>,
        }
        match serde_json::from_slice::<AckQuery>(&body) {
            Ok(q) => hec_with(
                StatusCode::OK,
                serde_json::json!({ "acks": acks.query(channel, &q.acks) }),
            ),
            Err(_) => {
                self.counters.invalid_data.inc();
                hec(StatusCode::BAD_REQUEST, 6, "Invalid data format")
            }
        }
    }
}

/// The context JSON of a request's frames: `d` defaults (the channel,
/// the query's `host`, `source`, `sourcetype`, `index`), `t` the token's
/// fields; `None` when there is none.
fn context(token: Option<&Token>, channel: Option<&str>, q: &[(String, String)]) -> Option<String> {
    let mut d = serde_json::Map::new();
    if let Some(ch) = channel {
        d.insert("splunk.channel".into(), ch.into());
    }
    for k in ["host", "source", "sourcetype", "index"] {
        if let Some(v) = param(q, k) {
            d.insert(format!("splunk.{k}"), v.into());
        }
    }
    let t: serde_json::Map<String, serde_json::Value> = token
        .map(|t| {
            t.fields
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
                .collect()
        })
        .unwrap_or_default();
    if d.is_empty() && t.is_empty() {
        return None;
    }
    Some(serde_json::json!({"d": d, "t": t}).to_string())
}

/// The block of a request: frames are the events as sent when there is no
/// context (and they are JSON objects), else context-prefixed copies.
fn build_block(
    body: Bytes,
    ranges: &[(usize, usize)],
    context: Option<&str>,
    json: bool,
    peer: Arc<str>,
) -> Block {
    let (buf, frames) = match (context, json) {
        (None, true) => (
            body,
            ranges.iter().map(|&(s, e)| Span::new(s, e - s)).collect(),
        ),
        (ctx, _) => {
            let ctx = ctx.unwrap_or("{}").as_bytes();
            let total: usize = ranges.iter().map(|(s, e)| e - s + ctx.len() + 2).sum();
            let mut buf = Vec::with_capacity(total);
            let mut frames = Vec::with_capacity(ranges.len());
            for &(s, e) in ranges {
                let start = buf.len();
                buf.push(CTX_MARK);
                buf.extend_from_slice(ctx);
                buf.push(CTX_MARK);
                buf.extend_from_slice(&body[s..e]);
                frames.push(Span::new(start, buf.len() - start));
            }
            (Bytes::from(buf), frames)
        }
    };
    Block {
        buf,
        frames,
        peer: Some(peer),
        received_ns: now_ns(),
        json,
    }
}

// ---------------------------------------------------------------------------
// Decoding

/// Frames to events (see the module documentation for their layout).
struct HecDecode {
    parse_failed: LazyCounter,
}

/// Latest `time` taken as epoch seconds (year 5138); later is not a time.
const MAX_SECS: i64 = 100_000_000_000;

/// `time` in seconds (a number or numeric text) as nanoseconds.
fn time_ns(v: &Value, buf: &[u8]) -> Option<i64> {
    let (secs, nanos) = match v {
        Value::Int(i) => (*i, 0),
        // An f64 near 1.7e9 resolves 0.24 µs: digits below the
        // microsecond are noise, so they are rounded away.
        Value::Float(f) if f.is_finite() && *f >= 0.0 => {
            let micros = (f.fract() * 1e6).round() as i64;
            (f.trunc() as i64, micros * 1000)
        }
        Value::Float(_) => return None,
        other => {
            // Text is read exactly: `1700000000.123` is .123 s.
            let t = std::str::from_utf8(other.as_bytes(buf)?).ok()?.trim();
            let (int, frac) = t.split_once('.').unwrap_or((t, ""));
            if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            if !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let mut nanos = 0i64;
            for (i, d) in frac.bytes().take(9).enumerate() {
                nanos += i64::from(d - b'0') * 10i64.pow(8 - i as u32);
            }
            (int.parse::<i64>().ok()?, nanos)
        }
    };
    (0..MAX_SECS)
        .contains(&secs)
        .then(|| secs * 1_000_000_000 + nanos)
}

impl HecDecode {
    /// Fills `ev` from one event object's top-level fields.
    fn apply_event(
        &self,
        batch: &EventBatch,
        top: Vec<(Key, Value)>,
        ev: &mut Event,
    ) -> Result<(), ()> {
        let mut saw_event = false;
        for (k, v) in top {
            match &*k {
                "event" => {
                    saw_event = true;
                    match v {
                        Value::Object(entries) => {
                            let mut message = None;
                            let mut log = None;
                            let mut rest = Vec::with_capacity(entries.len());
                            for (k, v) in entries {
                                match &*k {
                                    "message" if message.is_none() => message = Some(v),
                                    "log" if log.is_none() => log = Some(v),
                                    _ => rest.push((k, v)),
                                }
                            }
                            let msg = match (message, log) {
                                (Some(m), l) => {
                                    if let Some(l) = l {
                                        rest.push((Key::Borrowed("log"), l));
                                    }
                                    m
                                }
                                (None, Some(l)) => l,
                                (None, None) => {
                                    let mut out = Vec::new();
                                    let mut stats = petrel_core::encode::EncodeStats::default();
                                    petrel_core::encode::write_json_value(
                                        batch,
                                        &Value::Object(rest.clone()),
                                        &mut out,
                                        &mut stats,
                                    );
                                    Value::Str(String::from_utf8_lossy(&out).into())
                                }
                            };
                            ev.message = msg;
                            for (k, v) in rest {
                                ev.set(k, v);
                            }
                        }
                        v @ (Value::Span(_) | Value::Str(_) | Value::Bytes(_)) => ev.message = v,
                        other => {
                            let mut out = Vec::new();
                            let mut stats = petrel_core::encode::EncodeStats::default();
                            petrel_core::encode::write_json_value(
                                batch, &other, &mut out, &mut stats,
                            );
                            ev.message = Value::Str(String::from_utf8_lossy(&out).into());
                        }
                    }
                }
                "time" => match time_ns(&v, &batch.buf) {
                    Some(t) => ev.time_ns = Some(t),
                    None => ev.set(k, v),
                },
                "host" => ev.set(Key::Borrowed("splunk.host"), v),
                "source" => ev.set(Key::Borrowed("splunk.source"), v),
                "sourcetype" => ev.set(Key::Borrowed("splunk.sourcetype"), v),
                "index" => ev.set(Key::Borrowed("splunk.index"), v),
                "fields" => match v {
                    Value::Object(entries) => {
                        for (k, v) in entries {
                            ev.set(k, v);
                        }
                    }
                    other => ev.set(k, other),
                },
                _ => ev.set(k, v),
            }
        }
        if saw_event {
            Ok(())
        } else {
            Err(())
        }
    }
}

impl Decode for HecDecode {
    fn decode(&self, block: &Block, batch: &mut EventBatch) {
        let parser = JsonParser::new(None);
        let buf = &block.buf;
        let mut top = Vec::new();
        for s in &block.frames {
            let frame = s.get(buf);
            // The context, if any, and where the payload starts.
            let mut defaults = Vec::new();
            let mut token_fields = Vec::new();
            let mut payload_at = 0usize;
            if frame.first() == Some(&CTX_MARK) {
                let end = memchr::memchr(CTX_MARK, &frame[1..]).map(|i| i + 1);
                let Some(end) = end else {
                    self.parse_failed.inc();
                    batch.events.push(Event::from_span(*s));
                    continue;
                };
                top.clear();
                if parser
                    .parse(&frame[1..end], Some(s.start + 1), &mut top)
                    .is_ok()
                {
                    for (k, v) in top.drain(..) {
                        match (&*k, v) {
                            ("d", Value::Object(e)) => defaults = e,
                            ("t", Value::Object(e)) => token_fields = e,
                            _ => {}
                        }
                    }
                }
                payload_at = end + 1;
            }
            let payload = Span::new(s.start as usize + payload_at, s.len as usize - payload_at);
            let mut ev = Event {
                message: Value::Null,
                fields: Vec::with_capacity(defaults.len() + token_fields.len() + 4),
                time_ns: None,
                hidden: petrel_core::Hidden::NONE,
            };
            for (k, v) in defaults {
                ev.set(k, v);
            }
            if block.json {
                top.clear();
                let parsed = parser
                    .parse(payload.get(buf), Some(payload.start), &mut top)
                    .map_err(|_| ())
                    .and_then(|()| self.apply_event(batch, std::mem::take(&mut top), &mut ev));
                if parsed.is_err() {
                    // Checked when received, so only a damaged spool gets
                    // here: kept whole as the message, never dropped.
                    self.parse_failed.inc();
                    ev.message = Value::Span(payload);
                }
            } else {
                ev.message = Value::Span(payload);
            }
            for (k, v) in token_fields {
                ev.set(k, v);
            }
            batch.events.push(ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_bodies_are_cut_and_checked() {
        let body = br#" {"event":"a","time":1.5}{"event":{"x":1}}
  {"event":"c","fields":{"k":"v"}} "#;
        let r = event_ranges(body).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(&body[r[0].0..r[0].1], br#"{"event":"a","time":1.5}"#);
        assert_eq!(&body[r[1].0..r[1].1], br#"{"event":{"x":1}}"#);
        assert_eq!(
            event_ranges(br#"{"event":"a"}{"time":1}"#),
            Err((12, "Event field is required", 1))
        );
        assert_eq!(
            event_ranges(br#"{"event":""}"#),
            Err((13, "Event field cannot be blank", 0))
        );
        assert_eq!(
            event_ranges(br#"{"event":"a"} {"event":"#),
            Err((6, "Invalid data format", 1))
        );
        assert_eq!(
            event_ranges(br#"[{"event":"a"}]"#),
            Err((6, "Invalid data format", 0))
        );
        assert_eq!(
            event_ranges(br#"{"event":"a","fields":[1]}"#).map(|_| ()),
            Err((15, "Error in handling indexed fields", 0))
        );
        assert_eq!(event_ranges(b"  \n").unwrap().len(), 0);
        assert_eq!(raw_ranges(b"one\r\n\ntwo\n  \nthree").len(), 3);
    }

    #[test]
    fn times_are_epoch_seconds() {
        let b = b"1700000000.123 x 12";
        assert_eq!(
            time_ns(&Value::Span(Span::new(0, 14)), b),
            Some(1_700_000_000_123_000_000)
        );
        assert_eq!(time_ns(&Value::Span(Span::new(15, 1)), b), None);
        assert_eq!(
            time_ns(&Value::Span(Span::new(17, 2)), b),
            Some(12_000_000_000)
        );
        assert_eq!(
            time_ns(&Value::Float(1_700_000_000.25), b),
            Some(1_700_000_000_250_000_000)
        );
        assert_eq!(
            time_ns(&Value::Float(1_700_000_000.123), b),
            Some(1_700_000_000_123_000_000)
        );
        assert_eq!(time_ns(&Value::Int(5), b), Some(5_000_000_000));
        assert_eq!(time_ns(&Value::Int(-5), b), None);
        assert_eq!(time_ns(&Value::Float(f64::NAN), b), None);
    }

    #[test]
    fn endpoints_are_hecs() {
        assert!(endpoint("/services/collector") == Some(Endpoint::Event));
        assert!(endpoint("/services/collector/event/1.0") == Some(Endpoint::Event));
        assert!(endpoint("/services/collector/raw") == Some(Endpoint::Raw));
        assert!(endpoint("/services/collector/ack") == Some(Endpoint::Ack));
        assert!(endpoint("/services/collector/health/1.0") == Some(Endpoint::Health));
        assert!(endpoint("/services/other").is_none());
    }

    #[test]
    fn ack_ids_are_bounded_and_reported_once() {
        let a = AckState {
            limits: AckLimits {
                max_pending: 2,
                max_channels: 1,
            },
            channels: Mutex::new(HashMap::new()),
            dropped: LazyCounter::default(),
            evicted: LazyCounter::default(),
        };
        let (x, y, z) = (a.allocate("c"), a.allocate("c"), a.allocate("c"));
        assert_eq!((x, y, z), (0, 1, 2));
        a.set("c", 1);
        a.set("c", 2);
        let q = a.query("c", &[0, 1, 2]);
        assert_eq!(
            serde_json::Value::Object(q),
            serde_json::json!({"0": false, "1": true, "2": true})
        );
        let q = a.query("c", &[1]);
        assert_eq!(
            serde_json::Value::Object(q),
            serde_json::json!({"1": false})
        );
        a.allocate("d");
        assert!(a.channels.lock().get("c").is_none());
    }
}
