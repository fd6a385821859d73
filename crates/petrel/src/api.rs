//! The HTTP API: `GET /metrics` (OpenMetrics text), `GET /health` (200, or
//! 503 with the open problems as JSON), `POST /reload` and `GET /tap`
//! (a stream of sampled events as ndjson, for `petrel tap`).
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

#[derive(Clone)]
struct ApiState {
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
    reload: crossbeam_channel::Sender<ReloadRequest>,
    /// The API listens on a loopback address only.
    loopback: bool,
    /// `PETREL_API_TOKEN`: when set, `/tap` needs it as a bearer token;
    /// on a non-loopback address `/tap` is refused without it.
    token: Option<Arc<str>>,
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
    let token = std::env::var("PETREL_API_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .map(Arc::from);
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/health", get(health))
        .route("/reload", post(reload_handler))
        .route("/tap", get(tap_handler))
        .with_state(ApiState {
            metrics: metrics.clone(),
            budget,
            reload,
            loopback,
            token,
        });
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
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(MAX_CONNECTION_LIFETIME, conn).await;
            drop(permit);
        });
    }
}

async fn metrics_handler(
    axum::extract::State(s): axum::extract::State<ApiState>,
) -> impl IntoResponse {
    s.metrics.memory_used.set(s.budget.used() as i64);
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn health(axum::extract::State(s): axum::extract::State<ApiState>) -> impl IntoResponse {
    let problems = s.metrics.health.report();
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
    let list: Vec<serde_json::Value> = problems
        .iter()
        .map(|u| {
            serde_json::json!({
                "component": u.component,
                "reason": u.reason,
                "for_secs": u.for_secs,
            })
        })
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(CONTENT_TYPE, "application/json")],
        json(serde_json::json!({"status": "unhealthy", "problems": list})),
    )
}

async fn reload_handler(
    axum::extract::State(s): axum::extract::State<ApiState>,
) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if s.reload.send(tx).is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is stopping\n".to_string(),
        );
    }
    match rx.await {
        Ok(Ok(summary)) => (StatusCode::OK, format!("{summary}\n")),
        Ok(Err(errors)) => (StatusCode::UNPROCESSABLE_ENTITY, format!("{errors}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is stopping\n".to_string(),
        ),
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
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    let text = |code: StatusCode, msg: String| (code, format!("{msg}\n")).into_response();
    match (&s.token, s.loopback) {
        (None, false) => {
            return text(
                StatusCode::FORBIDDEN,
                "tap is served on a loopback API address only; set PETREL_API_TOKEN for the agent (and the client) to allow it here".into(),
            )
        }
        (Some(t), _) => {
            let ok = headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|v| v == &**t);
            if !ok {
                return text(
                    StatusCode::UNAUTHORIZED,
                    "tap needs `Authorization: Bearer $PETREL_API_TOKEN`".into(),
                );
            }
        }
        (None, true) => {}
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
    #[test]
    fn query_values_are_percent_decoded_without_panicking() {
        assert_eq!(super::percent_decode("a%2Fb+c"), "a/b c");
        assert_eq!(super::percent_decode("%zz%"), "%zz%");
        assert_eq!(super::percent_decode("%\u{e9}x"), "%\u{e9}x");
    }
}
