//! The HTTP API: `GET /metrics` (OpenMetrics text) and `GET /health`.

use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use petrel_core::{MemoryBudget, Metrics};

#[derive(Clone)]
struct ApiState {
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
}

/// Serves the API on `listener` until the runtime stops.
pub async fn serve(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
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
        .with_state(ApiState { metrics, budget });
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "API server stopped");
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

async fn health() -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "application/json")],
        "{\"status\":\"ok\"}\n",
    )
}
