//! The publisher for applications on sqlx (feature `sqlx`): the same
//! functions as the crate's diesel ones, taking the application's open
//! `sqlx::Transaction<'_, Postgres>` instead of an [`OutboxTx`](crate::OutboxTx).
//!
//! ```toml
//! [dependencies]
//! outbox-publish = { git = "https://example.invalid/outbox", tag = "v0.1.0", features = ["sqlx"] }
//! ```
//!
//! Every function takes `&mut sqlx::Transaction<'_, sqlx::Postgres>`, so
//! an event cannot be written outside the caller's transaction: a pool
//! (`PgPool`) or a bare connection (`PgConnection`) does not compile. The
//! event exists exactly when the transaction commits; roll back (or drop
//! the transaction) and it never existed. Business writes go through the
//! same transaction (`&mut *tx`).
//!
//! What the diesel publisher guarantees holds here, tested by one
//! conformance suite run against both: the same refusals before any SQL
//! (the table in the crate documentation; a refused event leaves the
//! transaction usable), the same columns written (a UUIDv7 id, the trace
//! context of the `outbox.publish` span, `scheduled_at` or the
//! transaction's `now()`), and the same dispatch-key behaviour
//! ([`PublishOutcome::Duplicate`] with the holder's id, never an error that
//! aborts the transaction). The statements are `outbox-store`'s texts, kept
//! prepared on the connection: a publish is one round trip, a second one
//! to read the holder's id when the dispatch key is taken (and replace
//! mode runs again when another transaction wrote the key's first row
//! meanwhile). A database error is [`PublishError::Sqlx`].
//!
//! Needs sqlx 0.9 (and so Rust 1.94) with its `postgres` and
//! `runtime-tokio` features; the application's own TLS feature of sqlx
//! applies, as features unify.
//!
//! # Example
//!
//! ```no_run
//! use outbox_publish::{NewOutboxEvent, OutboxEvent, PublishError};
//!
//! #[derive(serde::Serialize, OutboxEvent)]
//! #[outbox(event_type = "orders.order.created")]
//! struct OrderCreated {
//!     order_id: i64,
//!     total_cents: i64,
//! }
//!
//! # async fn demo(pool: &sqlx::PgPool) -> Result<(), PublishError> {
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET placed = true WHERE id = $1")
//!     .bind(7_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! // A typed event:
//! outbox_publish::sqlx::publish(&mut tx, "tenant-1", &OrderCreated { order_id: 7, total_cents: 1999 })
//!     .await?;
//! // An event built by hand, with a producer idempotency key:
//! outbox_publish::sqlx::publish_outbox_event(
//!     &mut tx,
//!     NewOutboxEvent::new("tenant-1", "webhook.order.placed", serde_json::json!({ "orderId": 7 }))
//!         .dispatch_key("order-7-placed"),
//! )
//! .await?;
//! tx.commit().await?;
//! # Ok(())
//! # }
//! ```

use ::sqlx::{Postgres, Transaction};
use chrono::{DateTime, Utc};
use outbox_model::TypedEvent;
use serde::Serialize;
use tracing::instrument;
use uuid::Uuid;

use crate::change::{cancel_of, cancelled, check, reschedule_of, rescheduled};
use crate::publish::{
    batch_outcomes, has_replace, keys_not_inserted, outcome, prepare, prepare_batch, published,
    recorded,
};
use crate::{ChangeError, EventRef, EventRoutes, NewOutboxEvent, PublishError, PublishOutcome};

/// Records one event in the caller's sqlx transaction: what
/// [`crate::publish_outbox_event`] does for diesel, in an `outbox.publish`
/// span with the same fields.
///
/// The event is validated first; an invalid event returns an error without
/// running any SQL, so the transaction stays usable. The id is a fresh
/// UUIDv7. An event whose dispatch key a row already holds (committed, or
/// earlier in this transaction) writes nothing and returns
/// [`PublishOutcome::Duplicate`] with that row's id.
///
/// # Errors
///
/// A validation variant of [`PublishError`] for a bad event (the
/// transaction is untouched), or [`PublishError::Sqlx`] when Postgres fails
/// (the transaction is aborted).
///
/// # Example
///
/// See [the module](self).
#[instrument(
    name = "outbox.publish",
    skip_all,
    fields(tenant_id = %event.tenant_id, event_type = %event.event_type, event_id, duplicate, replaced),
    err
)]
pub async fn publish_outbox_event(
    tx: &mut Transaction<'_, Postgres>,
    event: NewOutboxEvent,
) -> Result<PublishOutcome, PublishError> {
    let row = prepare(event)?;
    let inserted = outbox_store::sqlx::insert_event(tx, &row).await?;
    Ok(recorded(inserted))
}

/// Records many events in the caller's sqlx transaction with one INSERT
/// statement (one per 5,000 events), returning one outcome per event, in
/// order: what [`crate::publish_outbox_events`] does for diesel.
///
/// Every event is validated before anything is written: one invalid event
/// fails the whole call with [`PublishError::InvalidBatchItem`] and writes
/// nothing. Events that repeat a dispatch key (of an existing row, or of an
/// earlier event in the same batch) come back as
/// [`PublishOutcome::Duplicate`] with the id of the row that holds the key.
///
/// # Errors
///
/// [`PublishError::InvalidBatchItem`] for an invalid event,
/// [`PublishError::Sqlx`] when Postgres fails.
#[instrument(
    name = "outbox.publish_batch",
    skip_all,
    fields(events, published),
    err
)]
pub async fn publish_outbox_events(
    tx: &mut Transaction<'_, Postgres>,
    events: impl IntoIterator<Item = NewOutboxEvent>,
) -> Result<Vec<PublishOutcome>, PublishError> {
    let rows = prepare_batch(events)?;
    if has_replace(&rows) {
        let mut outcomes = Vec::with_capacity(rows.len());
        for row in &rows {
            outcomes.push(outcome(outbox_store::sqlx::insert_event(tx, row).await?));
        }
        return Ok(published(outcomes));
    }
    let inserted = outbox_store::sqlx::insert_events(tx, &rows).await?;
    let keys = keys_not_inserted(&rows, &inserted);
    let holders = outbox_store::sqlx::dispatch_key_holders(tx, &keys).await?;
    batch_outcomes(&rows, &inserted, &holders)
        // A row that was neither inserted nor blocked by its dispatch key
        // cannot happen: ON CONFLICT only skips on that key.
        .ok_or(PublishError::Sqlx(::sqlx::Error::RowNotFound))
}

/// [`publish_outbox_event`] after [`NewOutboxEvent::check_route`]: an event
/// no rule of `routes` matches is refused with [`PublishError::Unrouted`]
/// before any SQL, so the transaction stays usable.
///
/// # Errors
///
/// [`PublishError::Unrouted`], or whatever [`publish_outbox_event`] returns.
pub async fn publish_routed_event(
    tx: &mut Transaction<'_, Postgres>,
    routes: &impl EventRoutes,
    event: NewOutboxEvent,
) -> Result<PublishOutcome, PublishError> {
    publish_outbox_event(tx, crate::routes::routed(event, routes)?).await
}

/// Records the typed `event` of `tenant_id` in the caller's sqlx
/// transaction: [`publish_outbox_event`] with
/// [`NewOutboxEvent::from_typed`]. For a dispatch key or a later dispatch,
/// build the event with [`NewOutboxEvent::from_typed`] and publish that.
///
/// # Errors
///
/// [`PublishError::PayloadNotSerializable`] when `event` does not
/// serialize, and everything [`publish_outbox_event`] returns.
///
/// # Example
///
/// See [the module](self).
pub async fn publish<E: TypedEvent + Serialize>(
    tx: &mut Transaction<'_, Postgres>,
    tenant_id: impl Into<String>,
    event: &E,
) -> Result<PublishOutcome, PublishError> {
    publish_outbox_event(tx, NewOutboxEvent::from_typed(tenant_id, event)?).await
}

/// Cancels one event in the caller's sqlx transaction: what
/// [`crate::cancel`] does for diesel (the same rule, statement and history
/// entry), in an `outbox.cancel` span.
///
/// # Errors
///
/// As [`crate::cancel`]; a database error is [`ChangeError::Sqlx`].
///
/// # Example
///
/// ```no_run
/// use outbox_publish::{ChangeError, EventRef};
///
/// # async fn demo(pool: &sqlx::PgPool) -> Result<(), ChangeError> {
/// let mut tx = pool.begin().await?;
/// let key = EventRef::DispatchKey("order-7-reminder".to_owned());
/// outbox_publish::sqlx::cancel(&mut tx, key, "order paid before the reminder").await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[instrument(name = "outbox.cancel", skip_all, fields(event = %event, event_id), err)]
pub async fn cancel(
    tx: &mut Transaction<'_, Postgres>,
    event: EventRef,
    reason: &str,
) -> Result<Uuid, ChangeError> {
    check(&event, reason)?;
    let found = outbox_store::sqlx::cancel_event(tx, cancel_of(&event, reason)).await?;
    cancelled(event, found)
}

/// Moves one PENDING event's dispatch to `at` in the caller's sqlx
/// transaction: what [`crate::reschedule`] does for diesel (the same rule,
/// statement and history entry), in an `outbox.reschedule` span.
///
/// # Errors
///
/// As [`crate::reschedule`]; a database error is [`ChangeError::Sqlx`].
///
/// # Example
///
/// ```no_run
/// use outbox_publish::{ChangeError, EventRef};
///
/// # async fn demo(pool: &sqlx::PgPool) -> Result<(), ChangeError> {
/// let mut tx = pool.begin().await?;
/// let key = EventRef::DispatchKey("order-7-survey".to_owned());
/// let later = chrono::Utc::now() + chrono::Duration::days(7);
/// outbox_publish::sqlx::reschedule(&mut tx, key, later, "delivery delayed").await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[instrument(name = "outbox.reschedule", skip_all, fields(event = %event, event_id, %at), err)]
pub async fn reschedule(
    tx: &mut Transaction<'_, Postgres>,
    event: EventRef,
    at: DateTime<Utc>,
    reason: &str,
) -> Result<Uuid, ChangeError> {
    check(&event, reason)?;
    let found = outbox_store::sqlx::reschedule_event(tx, reschedule_of(&event, at, reason)).await?;
    rescheduled(event, found)
}
