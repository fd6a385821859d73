//! The HTTP API: `GET /metrics` (OpenMetrics text), the health checks,
//! `POST /reload` and `GET /tap` (a stream of sampled events as ndjson,
//! for `petrel tap`).
//!
//! The health checks answer 200, or 503 with the problems as JSON:
//! `GET /health/live` (liveness: no internal thread dead or stuck; a
//! restart would help), `GET /health/ready` (readiness: the pipelines run
//! and every problem of `/health` is clear) and `GET /health` (the combined
//! view, as before the split: every open problem, whatever the phase).
//!
//! `/metrics` and the health checks are open to anyone who reaches the
//! address: kubelet probes carry no token and name the pod's IP as Host.
//! `/reload` (control) and `/tap` (log contents) are guarded by
//! `authorize`: on loopback, requests must name a loopback `Host` and
//! come from no cross-site `Origin` (a web page in the operator's browser
//! can reach 127.0.0.1; without these checks a DNS-rebinding page read the
//! logs through `/tap`); with `PETREL_API_TOKEN` set they need it as a
//! bearer token, and off loopback they are refused without one.
//!
//! It listens on loopback by default and is built to survive hostile
//! clients: headers must arrive within [`HEADER_TIMEOUT`], at most
//! [`MAX_CONNECTIONS`] connections are served at once (more are closed at
//! accept), and a connection lives at most [`MAX_CONNECTION_LIFETIME`].

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use petrel_core::{MemoryBudget, Metrics};

/// Time allowed for a client to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; further ones are closed at accept.
pub const MAX_CONNECTIONS: usize = 128;
/// A connection is closed after this long, whatever it does.
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// A reload request from the API; answered with a summary or the errors.
pub type ReloadRequest = tokio::sync::oneshot::Sender<Result<String, String>>;

/// Which endpoints need the bearer token (`--api-auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthScope {
    /// `/reload` and `/tap` (control and log contents).
    Control,
    /// Also `/metrics` and `/health`; the probes stay open.
    Metrics,
    /// Every endpoint, the probes `/health/live` and `/health/ready` too.
    All,
}

impl AuthScope {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AuthScope::Control => "control",
            AuthScope::Metrics => "metrics",
            AuthScope::All => "all",
        }
    }
}

/// How the API is reached: TLS, the token and what it guards.
#[derive(Clone)]
pub struct Access {
    /// Serve TLS with this configuration (its files followed as they
    /// change; with a client CA, mutual TLS).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The bearer token (`PETREL_API_TOKEN` or `--api-token-file`).
    pub token: Option<Arc<str>>,
    /// Which endpoints need it.
    pub scope: AuthScope,
}

/// The API's bearer token: the content of `file` (a final newline
/// removed), else `PETREL_API_TOKEN`; `None` when neither is set.
pub fn token(file: Option<&std::path::Path>) -> anyhow::Result<Option<Arc<str>>> {
    if let Some(f) = file {
        let t = std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("--api-token-file {}: {e}", f.display()))?;
        let t = t.trim_end_matches(['\n', '\r']);
        if t.is_empty() {
            anyhow::bail!("--api-token-file {} is empty", f.display());
        }
        return Ok(Some(Arc::from(t)));
    }
    Ok(std::env::var("PETREL_API_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .map(Arc::from))
}

#[derive(Clone)]
struct ApiState {
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
    reload: crossbeam_channel::Sender<ReloadRequest>,
    /// The API listens on a loopback address only.
    loopback: bool,
    /// `PETREL_API_TOKEN`: when set, `/reload` and `/tap` need it as a
    /// bearer token; on a non-loopback address they are refused without
    /// it.
    token: Option<Arc<str>>,
    /// The managed state (fleet management over OpAMP), when on.
    managed: Option<Arc<parking_lot::Mutex<crate::fleet::View>>>,
    /// Which endpoints need the token.
    scope: AuthScope,
}

/// Lines a tap client may leave unread before events are skipped.
const TAP_CAPACITY: usize = 1024;

/// Serves the API on `listener` until the runtime stops. Reload requests
/// go to `reload` (the agent's main loop applies them).
pub async fn serve(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
    reload: crossbeam_channel::Sender<ReloadRequest>,
    access: Access,
    managed: Option<Arc<parking_lot::Mutex<crate::fleet::View>>>,
) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|_| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "API listener failed");
            return;
        }
    };
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    serve_with(
        listener,
        ApiState {
            metrics,
            budget,
            reload,
            loopback,
            token: access.token,
            scope: access.scope,
            managed,
        },
        access.tls,
    )
    .await;
}

/// Serves the API with `state`, whose `loopback` and `token` the caller
/// decided (the unit tests serve a non-loopback API on 127.0.0.1).
async fn serve_with(
    listener: tokio::net::TcpListener,
    state: ApiState,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let metrics = state.metrics.clone();
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/health", get(health))
        .route("/health/live", get(health_live))
        .route("/health/ready", get(health_ready))
        .route("/reload", post(reload_handler))
        .route("/tap", get(tap_handler))
        .with_state(state);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: wait instead of spinning.
                tracing::warn!(error = %e, "API accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics.api_refused_connections.inc();
            drop(stream);
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let acceptor = tls.clone().map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            match acceptor {
                None => {
                    let conn = b.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                    let _ = tokio::time::timeout(MAX_CONNECTION_LIFETIME, conn).await;
                }
                Some(a) => {
                    // The handshake counts against the header timeout: a
                    // client that connects and says nothing is let go.
                    match tokio::time::timeout(HEADER_TIMEOUT, a.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let conn = b.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
                            let _ = tokio::time::timeout(MAX_CONNECTION_LIFETIME, conn).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "API: TLS handshake failed"),
                        Err(_) => tracing::debug!("API: TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
}

async fn metrics_handler(
    axum::extract::State(s): axum::extract::State<ApiState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if s.scope != AuthScope::Control {
        if let Some(refused) = bearer_check(&s, &headers, "GET /metrics") {
            return refused;
        }
    }
    s.metrics.memory_used.set(s.budget.used() as i64);
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

/// `GET /health`: every open problem (see [`petrel_core::health`]), and
/// the managed state under `managed` when the agent is managed over OpAMP
/// (server, connected, transport, the last remote configuration's hash
/// and status, each remote pipeline's status).
async fn health(
    axum::extract::State(s): axum::extract::State<ApiState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if s.scope != AuthScope::Control {
        if let Some(refused) = bearer_check(&s, &headers, "GET /health") {
            return refused;
        }
    }
    let problems = s.metrics.health.report();
    let (code, mut body) = if problems.is_empty() {
        let degraded = s.metrics.health.degradations();
        if degraded.is_empty() {
            (StatusCode::OK, serde_json::json!({"status": "ok"}))
        } else {
            // Working with less (metadata missing): 200, so that nothing
            // restarts or pages, but visible.
            (
                StatusCode::OK,
                serde_json::json!({"status": "degraded", "problems": problems_json(&degraded)}),
            )
        }
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "unhealthy", "problems": problems_json(&problems)}),
        )
    };
    if let (Some(m), Some(obj)) = (&s.managed, body.as_object_mut()) {
        obj.insert("managed".into(), m.lock().json());
    }
    let mut t = body.to_string();
    t.push('\n');
    (code, [(CONTENT_TYPE, "application/json")], t).into_response()
}

/// The problems of a health answer, as its JSON list.
fn problems_json(list: &[petrel_core::health::Unhealthy]) -> Vec<serde_json::Value> {
    list.iter()
        .map(|u| {
            serde_json::json!({
                "component": u.component,
                "reason": u.reason,
                "for_secs": u.for_secs,
            })
        })
        .collect()
}

/// `GET /health/live`: dead or stuck threads only.
async fn health_live(
    axum::extract::State(s): axum::extract::State<ApiState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if s.scope == AuthScope::All {
        if let Some(refused) = bearer_check(&s, &headers, "GET /health/live") {
            return refused;
        }
    }
    health_answer(s.metrics.health.liveness()).into_response()
}

/// `GET /health/ready`: the problems of `/health`, and the phase.
async fn health_ready(
    axum::extract::State(s): axum::extract::State<ApiState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if s.scope == AuthScope::All {
        if let Some(refused) = bearer_check(&s, &headers, "GET /health/ready") {
            return refused;
        }
    }
    health_answer(s.metrics.health.readiness()).into_response()
}

/// The refusal of a request to `what` without the token, or `None`
/// (the token is required to be set when the scope asks for it).
fn bearer_check(
    s: &ApiState,
    headers: &axum::http::HeaderMap,
    what: &str,
) -> Option<axum::response::Response> {
    use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
    let t = s.token.as_ref()?;
    let ok = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .is_some_and(|(scheme, v)| {
            // The scheme is case-insensitive (RFC 9110).
            scheme.eq_ignore_ascii_case("bearer") && same_secret(v.trim().as_bytes(), t.as_bytes())
        });
    if ok {
        return None;
    }
    let mut r = (
        StatusCode::UNAUTHORIZED,
        format!("{what} needs `Authorization: Bearer $PETREL_API_TOKEN`\n"),
    )
        .into_response();
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    Some(r)
}

/// 200 with `{"status":"ok"}`, or 503 with the problems.
fn health_answer(problems: Vec<petrel_core::health::Unhealthy>) -> impl IntoResponse {
    let json = |v: serde_json::Value| {
        let mut t = v.to_string();
        t.push('\n');
        t
    };
    if problems.is_empty() {
        return (
            StatusCode::OK,
            [(CONTENT_TYPE, "application/json")],
            json(serde_json::json!({"status": "ok"})),
        );
    }
    let list = problems_json(&problems);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(CONTENT_TYPE, "application/json")],
        json(serde_json::json!({"status": "unhealthy", "problems": list})),
    )
}

/// True for a `Host` (or URI authority) that names this machine's
/// loopback: `localhost`, `127.x.x.x` or `[::1]`, with or without a port.
/// A name that merely resolves to loopback is refused: that is what a
/// DNS-rebinding page's requests carry.
fn loopback_host(h: &str) -> bool {
    let (host, port) = match h.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, after)) => {
                let loopback = ip
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok_and(|a| a.is_loopback());
                if !loopback {
                    return false;
                }
                match after {
                    "" => ("localhost", None),
                    a => match a.strip_prefix(':') {
                        Some(p) => ("localhost", Some(p)),
                        None => return false,
                    },
                }
            }
            None => return false,
        },
        None => match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        },
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let host = host.strip_suffix('.').unwrap_or(host);
    port_ok
        && (host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| a.is_loopback()))
}

/// True for an `Origin` of a page served by this machine over loopback
/// (`http://localhost:3000`): same-site as the API. `null` (sandboxed
/// frames, `file:` pages) and every other site are not.
fn loopback_origin(o: &str) -> bool {
    let Some((scheme, rest)) = o.split_once("://") else {
        return false;
    };
    (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
        && !rest.contains('/')
        && loopback_host(rest)
}

/// Compares in time independent of where the first difference is, so
/// that the answer times do not reveal the token byte by byte.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Decides whether a request may use `what` (`/reload`, `/tap`): the
/// refusal to send, or `None`. The bodies say what to fix and reveal
/// nothing of the configuration.
fn authorize(
    s: &ApiState,
    headers: &axum::http::HeaderMap,
    uri: &axum::http::Uri,
    what: &str,
) -> Option<axum::response::Response> {
    use axum::http::header::{HOST, ORIGIN};
    let refuse = |code: StatusCode, msg: String| Some((code, format!("{msg}\n")).into_response());
    if s.loopback {
        // A missing Host is allowed: HTTP/1.0 clients may leave it out,
        // and browsers always send one. Two Hosts are ambiguous.
        let hosts: Vec<&axum::http::HeaderValue> = headers.get_all(HOST).iter().collect();
        let host_ok = match hosts.as_slice() {
            [] => true,
            [h] => h.to_str().is_ok_and(|h| loopback_host(h.trim())),
            _ => false,
        };
        let authority_ok = uri.authority().is_none_or(|a| loopback_host(a.as_str()));
        if !host_ok || !authority_ok {
            return refuse(
                StatusCode::FORBIDDEN,
                format!("{what} on a loopback API answers only requests whose Host is localhost, 127.x.x.x or [::1] (a browser page of another site may not use it)"),
            );
        }
        let origin_ok = headers
            .get_all(ORIGIN)
            .iter()
            .all(|o| o.to_str().is_ok_and(|o| loopback_origin(o.trim())));
        if !origin_ok {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "{what} refuses requests with a cross-site Origin (a web page may not use it)"
                ),
            );
        }
    }
    match &s.token {
        None if !s.loopback => refuse(
            StatusCode::FORBIDDEN,
            format!("{what} is served on a loopback API address only; set PETREL_API_TOKEN for the agent (and the client) to allow it here"),
        ),
        None => None,
        Some(_) => bearer_check(s, headers, what),
    }
}

async fn reload_handler(
    axum::extract::State(s): axum::extract::State<ApiState>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
) -> axum::response::Response {
    if let Some(refused) = authorize(&s, &headers, &uri, "POST /reload") {
        return refused;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    if s.reload.send(tx).is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is stopping\n".to_string(),
        )
            .into_response();
    }
    match rx.await {
        Ok(Ok(summary)) => (StatusCode::OK, format!("{summary}\n")).into_response(),
        // The errors name configuration files, lines and keys: what the
        // operator needs to fix the configuration, so they are sent whole.
        // Only a client `authorize` let through gets here: one with the
        // token, or, with no token set, a local one, who can read the
        // agent's command line and its log (which holds the same errors).
        Ok(Err(errors)) => {
            (StatusCode::UNPROCESSABLE_ENTITY, format!("{errors}\n")).into_response()
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is stopping\n".to_string(),
        )
            .into_response(),
    }
}

/// The events of a tap, as the response body.
struct TapStream(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl futures_core::Stream for TapStream {
    type Item = Result<bytes::Bytes, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

/// Decodes `%XX` and `+` in a query value.
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                // Bytes, not `&str` slicing: a multi-byte character after
                // `%` must not split.
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(c) => {
                        out.push(c);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /tap?pipeline=P[&component=ID][&limit=N][&rate=N]`: sampled
/// events leaving a component (a source: the pipeline's sources' output;
/// a processor: after it; a sink, or no component: the sinks' input), one
/// ndjson line each, until `limit` events or the client goes.
async fn tap_handler(
    axum::extract::State(s): axum::extract::State<ApiState>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    let text = |code: StatusCode, msg: String| (code, format!("{msg}\n")).into_response();
    if let Some(refused) = authorize(&s, &headers, &uri, "GET /tap") {
        return refused;
    }
    let mut params = std::collections::HashMap::new();
    for pair in query.as_deref().unwrap_or("").split('&') {
        if let Some((k, v)) = pair.split_once('=') {
            params.insert(k.to_string(), percent_decode(v));
        }
    }
    let Some(pipeline) = params.get("pipeline").filter(|p| !p.is_empty()) else {
        return text(StatusCode::BAD_REQUEST, "`pipeline` is required".into());
    };
    let number = |k: &str| -> Result<Option<u64>, String> {
        params
            .get(k)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("`{k}` must be a number, got `{v}`"))
            })
            .transpose()
    };
    let (limit, rate) = match (number("limit"), number("rate")) {
        (Ok(l), Ok(r)) => (l, r.unwrap_or(0)),
        (Err(e), _) | (_, Err(e)) => return text(StatusCode::BAD_REQUEST, e),
    };
    // The components that exist are the ones with counters.
    let rendered = s.metrics.render();
    if !rendered.contains(&format!("pipeline=\"{pipeline}\",component_kind=")) {
        return text(
            StatusCode::NOT_FOUND,
            format!("no pipeline `{pipeline}` is running"),
        );
    }
    let key = match params.get("component") {
        None => format!("{pipeline}/sink"),
        Some(c) => {
            let kind = ["source", "processor", "sink"].into_iter().find(|k| {
                rendered.contains(&format!(
                    "pipeline=\"{pipeline}\",component_kind=\"{k}\",component_id=\"{c}\""
                ))
            });
            match kind {
                Some("source") => format!("{pipeline}/source"),
                Some("processor") => format!("{pipeline}/processor/{c}"),
                Some(_) => format!("{pipeline}/sink"),
                None => {
                    return text(
                        StatusCode::NOT_FOUND,
                        format!("pipeline `{pipeline}` has no component `{c}`"),
                    )
                }
            }
        }
    };
    let rx = s.metrics.taps.open(&key, limit, rate, TAP_CAPACITY);
    (
        [(CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(TapStream(rx)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An API that is not on loopback as far as its rules go (it listens
    /// on 127.0.0.1, like every test service), whose reloads fail with an
    /// error naming a configuration file; returns its port, the runtime
    /// serving it, and the number of reloads that reached the agent.
    fn off_loopback_api(token: Option<&str>) -> (u16, tokio::runtime::Runtime, Arc<AtomicUsize>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let (tx, rx) = crossbeam_channel::unbounded::<super::ReloadRequest>();
        let reached = Arc::new(AtomicUsize::new(0));
        let r = reached.clone();
        std::thread::spawn(move || {
            for answer in rx {
                r.fetch_add(1, Ordering::SeqCst);
                let _ = answer.send(Err(
                    "/etc/petrel/pipelines/web.yaml:3:5: unknown key `x`".into()
                ));
            }
        });
        let state = super::ApiState {
            metrics: petrel_core::Metrics::new(),
            budget: petrel_core::MemoryBudget::new(1 << 20),
            reload: tx,
            loopback: false,
            token: token.map(Arc::from),
            managed: None,
            scope: super::AuthScope::Control,
        };
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            super::serve_with(l, state, None).await;
        });
        (port, rt, reached)
    }

    /// (status, body) of one HTTP/1.0 request with `headers`.
    fn request(port: u16, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .expect("timeout");
        let mut req = format!("{method} {path} HTTP/1.0\r\nContent-Length: 0\r\n");
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).expect("write");
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status");
        (status, body.to_string())
    }

    #[test]
    fn off_loopback_reload_and_tap_are_refused_without_a_token() {
        let (port, _rt, reached) = off_loopback_api(None);
        let host = "Host: 10.0.0.7:8686";
        let (st, body) = request(port, "POST", "/reload", &[host]);
        assert_eq!(st, 403, "{body}");
        assert!(body.contains("PETREL_API_TOKEN"), "{body}");
        assert!(!body.contains("/etc/petrel"), "{body}");
        let (st, body) = request(port, "GET", "/tap?pipeline=web", &[host]);
        assert_eq!(st, 403, "{body}");
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "no reload reached the agent"
        );
        // Monitoring stays open; kubelet's probes carry no token.
        assert_eq!(request(port, "GET", "/metrics", &[host]).0, 200);
        assert_eq!(request(port, "GET", "/health", &[host]).0, 200);
        assert_eq!(request(port, "GET", "/health/live", &[host]).0, 200);
        let (st, body) = request(port, "GET", "/health/ready", &[host]);
        assert_eq!(st, 503, "not started: {body}");
        assert!(body.contains("starting"), "{body}");
    }

    #[test]
    fn off_loopback_reload_and_tap_need_the_token() {
        let (port, _rt, reached) = off_loopback_api(Some("s3cret"));
        let host = "Host: 10.0.0.7:8686";
        for auth in [
            None,
            Some("Authorization: Bearer nope"),
            Some("Authorization: Basic s3cret"),
        ] {
            let headers: Vec<&str> = [host].into_iter().chain(auth).collect();
            let (st, body) = request(port, "POST", "/reload", &headers);
            assert_eq!(st, 401, "{auth:?}: {body}");
            assert!(!body.contains("/etc/petrel"), "{auth:?}: {body}");
            let (st, body) = request(port, "GET", "/tap?pipeline=web", &headers);
            assert_eq!(st, 401, "{auth:?}: {body}");
        }
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "no reload reached the agent"
        );
        let ok = [host, "Authorization: Bearer s3cret"];
        // An authenticated client gets the errors it needs to fix the
        // configuration.
        let (st, body) = request(port, "POST", "/reload", &ok);
        assert_eq!(st, 422, "{body}");
        assert!(body.contains("web.yaml:3:5"), "{body}");
        assert_eq!(reached.load(Ordering::SeqCst), 1);
        let (st, body) = request(port, "GET", "/tap?pipeline=web", &ok);
        assert_eq!(st, 404, "past the token check: {body}");
        let lower = [host, "Authorization: bearer s3cret"];
        let (st, body) = request(port, "GET", "/tap?pipeline=web", &lower);
        assert_eq!(st, 404, "the scheme is case-insensitive: {body}");
        assert_eq!(request(port, "GET", "/metrics", &[host]).0, 200);
        assert_eq!(request(port, "GET", "/health", &[host]).0, 200);
        assert_eq!(request(port, "GET", "/health/live", &[host]).0, 200);
    }

    #[test]
    fn loopback_hosts_and_origins_are_told_from_others() {
        for h in [
            "localhost",
            "LOCALHOST:8686",
            "localhost.",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8686",
        ] {
            assert!(super::loopback_host(h), "{h}");
        }
        for h in [
            "",
            "evil.example",
            "evil.example:8686",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1:8686",
            "0.0.0.0",
            "[::]:8686",
            "[::1",
            "::1",
            "localhost:",
            "localhost:80:80",
            "localhost:8o",
            "[::1]x",
        ] {
            assert!(!super::loopback_host(h), "{h}");
        }
        for o in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:8080",
        ] {
            assert!(super::loopback_origin(o), "{o}");
        }
        for o in [
            "null",
            "https://evil.example",
            "file://",
            "http://localhost.evil.example",
            "ftp://localhost",
            "http://localhost/x",
        ] {
            assert!(!super::loopback_origin(o), "{o}");
        }
    }

    #[test]
    fn query_values_are_percent_decoded_without_panicking() {
        assert_eq!(super::percent_decode("a%2Fb+c"), "a/b c");
        assert_eq!(super::percent_decode("%zz%"), "%zz%");
        assert_eq!(super::percent_decode("%\u{e9}x"), "%\u{e9}x");
    }
}
