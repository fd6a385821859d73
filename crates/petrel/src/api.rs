//! The HTTP API: `GET /metrics` (OpenMetrics text), `GET /health` (200, or
//! 503 with the open problems as JSON) and `POST /reload`.
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
}

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
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/health", get(health))
        .route("/reload", post(reload_handler))
        .with_state(ApiState {
            metrics: metrics.clone(),
            budget,
            reload,
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
