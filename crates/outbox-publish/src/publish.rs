//! Publishing: validation and trace stamping here, the statements in
//! `outbox-store`.

use std::collections::{HashMap, HashSet};

use outbox_model::NewOutboxEventRow;
use outbox_store::Inserted;
use outbox_trace::TraceContext;
use tracing::instrument;
use uuid::Uuid;

use crate::event::drop_without_recursion;
use crate::{NewOutboxEvent, OutboxTx, PublishError};

/// What publishing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PublishOutcome {
    /// A new event was written with this id.
    Published(Uuid),
    /// An event with the same dispatch key already exists (committed earlier,
    /// or earlier in this transaction or batch); this is its id. Nothing was
    /// written and the transaction is intact.
    Duplicate(Uuid),
}

impl PublishOutcome {
    /// The id of the event, new or existing.
    #[must_use]
    pub fn id(self) -> Uuid {
        match self {
            Self::Published(id) | Self::Duplicate(id) => id,
        }
    }

    /// True when this call wrote nothing because of the dispatch key.
    #[must_use]
    pub fn is_duplicate(self) -> bool {
        matches!(self, Self::Duplicate(_))
    }
}

/// Records one event in the caller's transaction.
///
/// The event is validated first (tenant, event type, dispatch key, payload
/// kind, contents, depth and size; see the crate documentation for every
/// refusal); an invalid event returns an error without running any SQL, so
/// the caller's transaction stays usable. The id is a fresh UUIDv7.
///
/// # Errors
///
/// A validation variant of [`PublishError`] for a bad event (the transaction
/// is untouched), or [`PublishError::Database`] when Postgres fails (the
/// transaction is aborted).
///
/// # Example
///
/// See [`OutboxTx`].
#[instrument(
    name = "outbox.publish",
    skip_all,
    fields(tenant_id = %event.tenant_id, event_type = %event.event_type, event_id, duplicate),
    err
)]
pub async fn publish_outbox_event(
    tx: &mut OutboxTx<'_>,
    event: NewOutboxEvent,
) -> Result<PublishOutcome, PublishError> {
    let mut row = event.into_row()?;
    stamp(&mut row, TraceContext::current().as_ref());
    let outcome = match outbox_store::insert_event(tx.conn(), &row).await? {
        Inserted::New(id) => PublishOutcome::Published(id),
        Inserted::Existing(id) => PublishOutcome::Duplicate(id),
    };
    let span = tracing::Span::current();
    span.record("event_id", tracing::field::display(outcome.id()));
    span.record("duplicate", outcome.is_duplicate());
    Ok(outcome)
}

/// Records many events in the caller's transaction with one INSERT statement
/// (one per 5,000 events), returning one outcome per event, in order.
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
/// [`PublishError::Database`] when Postgres fails.
#[instrument(
    name = "outbox.publish_batch",
    skip_all,
    fields(events, published),
    err
)]
pub async fn publish_outbox_events(
    tx: &mut OutboxTx<'_>,
    events: impl IntoIterator<Item = NewOutboxEvent>,
) -> Result<Vec<PublishOutcome>, PublishError> {
    let mut events = events.into_iter().enumerate();
    let mut rows = Vec::with_capacity(events.size_hint().0);
    for (index, event) in events.by_ref() {
        match event.into_row() {
            Ok(row) => rows.push(row),
            Err(e) => {
                // The events after it are dropped unchecked: their payloads
                // may be nested too deep to drop recursively.
                for (_, rest) in events {
                    drop_without_recursion(rest.payload);
                }
                return Err(PublishError::InvalidBatchItem {
                    index,
                    source: Box::new(e),
                });
            }
        }
    }
    tracing::Span::current().record("events", rows.len());
    let trace = TraceContext::current();
    for row in &mut rows {
        stamp(row, trace.as_ref());
    }

    let inserted = outbox_store::insert_events(tx.conn(), &rows).await?;
    tracing::Span::current().record("published", inserted.len());

    let holders = existing_holders(tx, &rows, &inserted).await?;
    rows.iter()
        .map(|row| {
            if inserted.contains(&row.id) {
                return Ok(PublishOutcome::Published(row.id));
            }
            row.dispatch_key
                .as_ref()
                .and_then(|key| holders.get(key))
                .map(|id| PublishOutcome::Duplicate(*id))
                // A row that was neither inserted nor blocked by its dispatch
                // key cannot happen: ON CONFLICT only skips on that key.
                .ok_or(PublishError::Database(diesel::result::Error::NotFound))
        })
        .collect()
}

/// Records the trace context the row is published in (the publishing span's,
/// so the dispatcher's span becomes its child), if there is one.
fn stamp(row: &mut NewOutboxEventRow, trace: Option<&TraceContext>) {
    row.traceparent = trace.map(|cx| cx.traceparent().to_owned());
    row.tracestate = trace.and_then(|cx| cx.tracestate().map(str::to_owned));
}

/// The ids of the rows holding the dispatch keys of events not inserted.
async fn existing_holders(
    tx: &mut OutboxTx<'_>,
    rows: &[NewOutboxEventRow],
    inserted: &HashSet<Uuid>,
) -> Result<HashMap<String, Uuid>, PublishError> {
    let keys: Vec<&str> = rows
        .iter()
        .filter(|row| !inserted.contains(&row.id))
        .filter_map(|row| row.dispatch_key.as_deref())
        .collect();
    Ok(outbox_store::dispatch_key_holders(tx.conn(), &keys).await?)
}
