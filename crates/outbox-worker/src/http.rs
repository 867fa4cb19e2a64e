//! `/healthz`, `/readyz` and `/metrics`.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use diesel_async::RunQueryDsl;
use metrics_exporter_prometheus::PrometheusHandle;
use outbox_postgres::PgPool;
use redis::aio::ConnectionManager;

/// What the endpoints need.
#[derive(Clone)]
pub struct HttpState {
    /// Postgres, for readiness.
    pub pool: PgPool,
    /// Redis, for readiness.
    pub redis: ConnectionManager,
    /// The Prometheus recorder.
    pub metrics: PrometheusHandle,
}

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn postgres_ready(pool: &PgPool) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    diesel::sql_query("SELECT 1")
        .execute(&mut conn)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn redis_ready(redis: &ConnectionManager) -> Result<(), String> {
    let mut redis = redis.clone();
    redis::cmd("PING")
        .query_async::<String>(&mut redis)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    let limit = Duration::from_secs(3);
    let postgres = tokio::time::timeout(limit, postgres_ready(&state.pool))
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    let redis = tokio::time::timeout(limit, redis_ready(&state.redis))
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    let status = if postgres.is_ok() && redis.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let describe = |r: &Result<(), String>| match r {
        Ok(()) => serde_json::json!("ok"),
        Err(e) => serde_json::json!(e),
    };
    let body = serde_json::json!({ "postgres": describe(&postgres), "redis": describe(&redis) });
    (status, axum::Json(body))
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(),
    )
}
