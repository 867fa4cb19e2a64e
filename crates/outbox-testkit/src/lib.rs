//! A test kit for applications on the outbox: a migrated Postgres database
//! per test, assertions on the events a test published, and handlers run
//! in-process on an event with their idempotency. Add it as a
//! dev-dependency; it is test code (it panics on failure and reads the
//! environment), never for production.
//!
//! Everything runs against real servers: nothing here mocks Postgres or
//! Redis.
//!
//! # A database per test: [`TestDatabase`]
//!
//! [`TestDatabase::new`] creates a fresh database with the outbox's tables,
//! cloned in milliseconds from a template that is migrated once per
//! version of the migrations, and drops it when the value is dropped (also
//! when the test panics). Run your own migrations on it ([`TestDatabase::url`],
//! [`TestDatabase::conn`]) as your application does at start.
//!
//! The server comes from `OUTBOX_TEST_DATABASE_URL`, else `DATABASE_URL`,
//! else `postgres://postgres@127.0.0.1:5432/postgres` (only its server part
//! matters: [`database_server_url`]). The role needs `CREATEDB`. With
//! `OUTBOX_TEST_PARTITIONED=1` the databases are cloned from a template
//! whose `outbox_event` is partitioned by day, to run the same tests on
//! that layout.
//! [`sweep_abandoned_databases`] drops what killed test processes left.
//!
//! ```no_run
//! use outbox_testkit::TestDatabase;
//!
//! # async fn example() {
//! let db = TestDatabase::new().await;
//! let mut conn = db.conn().await;
//! // Your application's own migrations, then the code under test, on `conn`
//! // or on a pool of `db.url()`.
//! # let _ = &mut conn;
//! # }
//! ```
//!
//! # What a test published
//!
//! [`published`] reads the events of one typed event struct (an
//! [`outbox_model::TypedEvent`], usually `#[derive(OutboxEvent)]`) with
//! their payloads decoded, [`published_events`] every event untyped.
//! [`require_published`] returns the one event equal to the expected value
//! and [`require_published_where`] the one matching a predicate; both panic
//! when none or several match, listing every event that was published
//! (type, payload, tenant, id), and [`require_not_published`] panics when
//! an event of the type was published.
//!
//! They read through any [`OutboxConnection`]: inside the transaction the
//! code under test published in (an `OutboxTx` or its connection) they see
//! its uncommitted events, on a plain connection what was committed.
//!
//! ```no_run
//! use diesel_async::{AsyncConnection, AsyncPgConnection};
//! use outbox_publish::{OutboxEvent, OutboxTx, PublishError, publish};
//! use outbox_testkit::{TestDatabase, published, require_not_published, require_published};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
//! #[outbox(event_type = "orders.order.created")]
//! struct OrderCreated {
//!     order_id: u64,
//! }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
//! #[outbox(event_type = "orders.order.cancelled")]
//! struct OrderCancelled {
//!     order_id: u64,
//! }
//!
//! /// The code under test.
//! async fn place_order(tx: &mut OutboxTx<'_>, order_id: u64) -> Result<(), PublishError> {
//!     publish(tx, "tenant-1", &OrderCreated { order_id }).await?;
//!     Ok(())
//! }
//!
//! # async fn example() -> Result<(), PublishError> {
//! let db = TestDatabase::new().await;
//! let mut conn = db.conn().await;
//! conn.transaction::<_, PublishError, _>(async |conn| {
//!     let mut tx = OutboxTx::new(conn)?;
//!     place_order(&mut tx, 7).await?;
//!     // Inside the transaction: the event is not committed yet.
//!     let created = require_published(&mut tx, &OrderCreated { order_id: 7 }).await;
//!     assert_eq!(created.tenant_id, "tenant-1");
//!     require_not_published::<OrderCancelled>(&mut tx).await;
//!     Ok(())
//! })
//! .await?;
//! // After the commit, on a plain connection.
//! let all = published::<OrderCreated>(&mut conn).await;
//! assert_eq!(all.len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! With the `sqlx` feature the same functions read through sqlx's
//! `PgConnection` and `Transaction<'_, Postgres>`, for an application that
//! publishes with plain SQL in its sqlx transactions:
//!
//! ```no_run
//! # #[cfg(feature = "sqlx")]
//! # async fn example() -> Result<(), sqlx::Error> {
//! use outbox_testkit::{TestDatabase, require_published_where};
//! use sqlx::Connection;
//!
//! #[derive(Debug, serde::Deserialize)]
//! struct OrderCreated {
//!     order_id: u64,
//! }
//!
//! impl outbox_model::TypedEvent for OrderCreated {
//!     const EVENT_TYPE: &'static str = "orders.order.created";
//! }
//!
//! let db = TestDatabase::new().await;
//! let mut conn = sqlx::PgConnection::connect(db.url()).await?;
//! let mut tx = conn.begin().await?;
//! sqlx::query("INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ($1, $2, $3::jsonb)")
//!     .bind("tenant-1")
//!     .bind("orders.order.created")
//!     .bind(r#"{"order_id": 7}"#)
//!     .execute(&mut *tx)
//!     .await?;
//! require_published_where::<OrderCreated>(&mut tx, |e| e.event.order_id == 7).await;
//! # Ok(())
//! # }
//! ```
//!
//! # Running a handler on an event: [`run_handler`]
//!
//! [`run_handler`] runs a handler ([`outbox_subscriber::JobHandler`],
//! [`outbox_subscriber::TypedHandlers`] among them) once on a job, in the
//! test's task, as a worker runs a first attempt, and says what came of it
//! ([`HandlerOutcome`]: done, a duplicate its idempotency guard skipped, a
//! retry with the reason and the wait it asked for, or dead-lettered with
//! the reason). The job is the one a dispatch makes of an event, with the
//! task id and delivery id production derives: [`dispatched`] for a typed
//! event value, [`PublishedEvent::dispatched`] / [`Published::dispatched`]
//! for one the code under test published. Running the same job twice is a
//! redelivery of the same event.
//!
//! The handler's idempotency is its own, as in production, on real
//! servers: a Redis idempotency store on a [`TestRedis`] namespace, or a
//! unique row in the [`TestDatabase`]. A redelivery that
//! `outbox_idempotency::with_outbox_idempotency` recognises comes back as
//! [`HandlerOutcome::Duplicate`]; a handler that deduplicates by a unique
//! row reports [`HandlerOutcome::Done`] again, and the test counts its rows.
//!
//! [`TestRedis`] is a key prefix of its own on the Redis of
//! `OUTBOX_TEST_REDIS_URL`, else `REDIS_URL`, else `redis://127.0.0.1:6379`
//! ([`redis_server_url`]), whose keys are deleted on drop.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! use outbox_idempotency::{IdempotencyOptions, RedisIdempotencyStore, with_outbox_idempotency};
//! use outbox_publish::OutboxEvent;
//! use outbox_subscriber::{EventContext, JobError, TypedHandlers};
//! use outbox_testkit::{HandlerOutcome, TestRedis, dispatched, run_handler};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize, OutboxEvent)]
//! #[outbox(event_type = "orders.order.created")]
//! struct OrderCreated {
//!     order_id: u64,
//! }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = TestRedis::new().await;
//! let store = RedisIdempotencyStore::new(redis.conn().await).with_prefix(redis.prefix());
//! let mails = Arc::new(AtomicUsize::new(0));
//! let handlers = TypedHandlers::new("app.orders").on({
//!     let mails = Arc::clone(&mails);
//!     move |order: OrderCreated, cx: EventContext| {
//!         let (store, mails) = (store.clone(), Arc::clone(&mails));
//!         async move {
//!             // The effect runs once per event, whatever the deliveries.
//!             let _ran_or_cached = with_outbox_idempotency(&store, cx.event_id, IdempotencyOptions::default(), async || {
//!                 mails.fetch_add(1, Ordering::SeqCst);
//!                 println!("confirmation for order {}", order.order_id);
//!                 Ok::<_, std::convert::Infallible>(())
//!             })
//!             .await
//!             .map_err(JobError::retry)?;
//!             Ok(())
//!         }
//!     }
//! })?;
//!
//! let job = dispatched("tenant-1", &OrderCreated { order_id: 7 });
//! assert_eq!(run_handler(&handlers, &job).await, HandlerOutcome::Done);
//! assert_eq!(run_handler(&handlers, &job).await, HandlerOutcome::Duplicate);
//! assert_eq!(mails.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Waiting for an effect
//!
//! A worker hands events off and runs handlers on its own tasks, so a test
//! waits for their effect rather than sleeping: [`eventually`] re-checks a
//! condition every [`POLL`] until it holds and fails naming what it waited
//! for when the limit passes; [`consistently`] checks that something stays
//! true for a window; [`eventually_reaching`] waits for a count and fails
//! as soon as the count stops moving.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use outbox_testkit::eventually;
//!
//! # async fn example(confirmed: impl AsyncFn() -> bool) {
//! eventually("the order's confirmation", Duration::from_secs(30), async || confirmed().await).await;
//! # }
//! ```

mod connection;
mod database;
mod event;
mod eventually;
mod guard;
mod handler;
mod published;
mod redis_ns;
#[cfg(feature = "sqlx")]
mod sqlx_reads;
mod url;

pub use connection::OutboxConnection;
pub use database::{TestDatabase, sweep_abandoned_databases};
pub use event::{Published, PublishedEvent};
pub use eventually::{POLL, consistently, eventually, eventually_reaching};
pub use handler::{HandlerOutcome, dispatched, run_handler, run_handler_attempt};
pub use published::{
    published, published_events, require_not_published, require_published, require_published_where,
};
pub use redis_ns::{Swept, TestRedis, sweep_abandoned_namespaces};
pub use url::{database_server_url, redis_server_url, with_database};
