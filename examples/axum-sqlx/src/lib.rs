//! A shop service on axum and sqlx that uses the transactional outbox the
//! way an application does:
//!
//! - `POST /orders` inserts an `orders` row and publishes a typed
//!   [`OrderPlaced`] event in the same sqlx transaction
//!   ([`orders::place`], with `outbox_publish::sqlx::publish`): the event
//!   exists exactly when the order does;
//! - the outbox worker runs inside the service ([`serve`]), in its runtime,
//!   stopped by its shutdown, its `/healthz`, `/readyz` and `/metrics` on
//!   the service's router;
//! - the service's own handler of [`OrderPlaced`] ([`confirmations`])
//!   records a confirmation, which `GET /orders/{id}` shows.
//!
//! The service's code is on sqlx. The outbox's tables come from
//! `outbox_model::run_migrations`, which takes one diesel-async connection
//! (the outbox's own driver, used once at start, [`migrate`]); the worker
//! opens its own connections from `DATABASE_URL`.
//!
//! The binary (`src/main.rs`) reads the environment and calls [`serve`];
//! the tests (`tests/orders.rs`) run the same [`serve`] against a database
//! and a Redis key prefix of their own.

pub mod orders;

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::OutboxEvent;
use outbox_subscriber::{EventContext, JobError, SubscriberError, TypedHandlers};
use outbox_worker::{WorkerBuilder, WorkerConfig};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The queue the service's own events go to. [`WorkerBuilder::typed`]
/// routes each event type of the handler here, so no routing rule is
/// written by hand.
pub const ORDERS_QUEUE: &str = "app.orders";

/// The service's own tables (`schema.sql`), created if missing.
const SCHEMA: &str = include_str!("../schema.sql");

/// Published in the transaction that inserts the order. The event type is
/// checked against the naming rule while the service compiles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "shop.order.placed")]
pub struct OrderPlaced {
    /// The `orders` row.
    pub order_id: i64,
    /// Who ordered.
    pub customer: String,
    /// The order's total, in cents.
    pub total_cents: i64,
}

/// Applies the outbox's migrations (on a diesel-async connection: the
/// outbox migrates with diesel, which records its versions in
/// `__diesel_schema_migrations`), then creates the service's own tables
/// with sqlx, on `database_url`.
///
/// # Errors
///
/// When Postgres cannot be reached or a migration fails.
pub async fn migrate(database_url: &str) -> anyhow::Result<()> {
    let conn = AsyncPgConnection::establish(database_url)
        .await
        .with_context(|| format!("cannot connect to Postgres at {database_url}"))?;
    outbox_model::run_migrations(conn)
        .await
        .context("the outbox's migrations")?;
    let pool = pool(database_url).await?;
    sqlx::raw_sql(SCHEMA)
        .execute(&pool)
        .await
        .context("the service's tables")?;
    pool.close().await;
    Ok(())
}

/// The service's pool on `database_url`.
///
/// # Errors
///
/// When Postgres cannot be reached.
pub async fn pool(database_url: &str) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(5)
        .connect(database_url)
        .await
        .with_context(|| format!("cannot connect to Postgres at {database_url}"))
}

/// The service's handler of its own queue: records one confirmation per
/// order. Delivery is at least once, so the insert is keyed on the order
/// and a redelivery changes nothing.
///
/// # Errors
///
/// Only when two functions take the same event type (not here).
pub fn confirmations(pool: PgPool) -> Result<TypedHandlers, SubscriberError> {
    TypedHandlers::new(ORDERS_QUEUE).on(move |event: OrderPlaced, cx: EventContext| {
        let pool = pool.clone();
        async move {
            orders::confirm(&pool, event.order_id, cx.event_id)
                .await
                .map_err(|e| JobError::retry(format!("order {}: {e}", event.order_id)))
        }
    })
}

/// Serves the shop on `listener` with the outbox worker running inside it,
/// until `stop` is cancelled; then both stop (the worker finishes what it
/// holds within `WORKER_SHUTDOWN_GRACE_MS`). A worker that fails (Postgres
/// unreachable at start, say) stops the service too.
///
/// # Errors
///
/// What the server or the worker failed with.
pub async fn serve(
    listener: TcpListener,
    pool: PgPool,
    config: WorkerConfig,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    // The dispatcher and this service's handler only: no built-in
    // subscriber (none is compiled in), and only the core tables needed.
    let worker = WorkerBuilder::bare()
        .name("shop")
        .typed(confirmations(pool.clone())?)
        .without_http_listener();
    let app = orders::routes(pool).merge(worker.http_routes()?);

    let worker = tokio::spawn({
        let stop_all = stop.clone().drop_guard();
        let stop = stop.clone();
        async move {
            let _stop_all = stop_all;
            worker.run_until(config, stop.cancelled_owned()).await
        }
    });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(stop.clone().cancelled_owned())
        .await;
    // The server stopped (asked to, or failed): the worker stops with it.
    stop.cancel();
    worker.await.context("the worker task")??;
    served.context("the HTTP server")
}
