//! `/healthz`, `/readyz` and `/metrics`: served by the worker on
//! `WORKER_HTTP_ADDR`, or by the application that merges them into its own
//! router ([`crate::WorkerBuilder::http_routes`]).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use diesel_async::RunQueryDsl;
use metrics_exporter_prometheus::PrometheusHandle;
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;

/// The connections `/readyz` checks: none until a run of the worker has
/// connected, and none again once that run has stopped.
#[derive(Clone, Default)]
pub(crate) struct Readiness(Arc<RwLock<Option<(PgPool, RedisConnection)>>>);

impl Readiness {
    /// `/readyz` checks `pool` and `redis` until the returned guard is
    /// dropped (the run ends).
    pub fn running(&self, pool: PgPool, redis: RedisConnection) -> Running {
        self.set(Some((pool, redis)));
        Running(self.clone())
    }

    fn set(&self, connections: Option<(PgPool, RedisConnection)>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = connections;
    }

    fn get(&self) -> Option<(PgPool, RedisConnection)> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A run in progress, for `/readyz`; see [`Readiness::running`].
pub(crate) struct Running(Readiness);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

/// `/healthz` (the process answers), `/readyz` (the run's Postgres and
/// Redis answer) and, with the worker's own recorder, `/metrics`.
pub(crate) fn routes(readiness: Readiness, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
        .merge(metrics_route(metrics))
}

/// `/metrics` rendered from `metrics`, or no route when the metrics go to
/// the application's recorder (`None`).
pub(crate) fn metrics_route(metrics: Option<PrometheusHandle>) -> Router {
    let Some(handle) = metrics else {
        return Router::new();
    };
    Router::new().route(
        "/metrics",
        get(move || {
            let body = handle.render();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    body,
                )
            }
        }),
    )
}

async fn postgres_ready(pool: &PgPool) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    diesel::sql_query("SELECT 1")
        .execute(&mut conn)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn redis_ready(redis: &RedisConnection) -> Result<(), String> {
    let mut redis = redis.clone();
    redis::cmd("PING")
        .query_async::<String>(&mut redis)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    let Some((pool, redis)) = readiness.get() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "worker": "not running" })),
        );
    };
    let limit = Duration::from_secs(3);
    let postgres = tokio::time::timeout(limit, postgres_ready(&pool))
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    let redis = tokio::time::timeout(limit, redis_ready(&redis))
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
