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
///
/// Non-exhaustive: match the cases you act on and `_` for the rest (or use
/// [`PublishOutcome::id`] and [`PublishOutcome::is_duplicate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PublishOutcome {
    /// A new event was written with this id.
    Published(Uuid),
    /// An event with the same dispatch key already exists (committed earlier,
    /// or earlier in this transaction or batch); this is its id. Nothing was
    /// written and the transaction is intact.
    Duplicate(Uuid),
    /// Replace mode ([`NewOutboxEvent::replace_pending`]): the PENDING
    /// event holding the dispatch key, with this id, now has the new
    /// payload (and schedule, when given). No row was written.
    Replaced(Uuid),
}

impl PublishOutcome {
    /// The id of the event, new or existing.
    #[must_use]
    pub fn id(self) -> Uuid {
        match self {
            Self::Published(id) | Self::Duplicate(id) | Self::Replaced(id) => id,
        }
    }

    /// True when this call wrote nothing because of the dispatch key (a
    /// replaced holder is not a duplicate: its payload was written).
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
    fields(tenant_id = %event.tenant_id, event_type = %event.event_type, event_id, duplicate, replaced),
    err
)]
pub async fn publish_outbox_event(
    tx: &OutboxTx<'_>,
    event: NewOutboxEvent,
) -> Result<PublishOutcome, PublishError> {
    let row = prepare(event)?;
    let inserted = outbox_store::insert_event(tx, &row).await?;
    Ok(recorded(inserted))
}

/// Records many events in the caller's transaction with one INSERT statement
/// (one per 5,000 events), returning one outcome per event, in order.
///
/// Every event is validated before anything is written: one invalid event
/// fails the whole call with [`PublishError::InvalidBatchItem`] and writes
/// nothing. Events that repeat a dispatch key (of an existing row, or of an
/// earlier event in the same batch) come back as
/// [`PublishOutcome::Duplicate`] with the id of the row that holds the key.
/// A batch with an event in replace mode
/// ([`NewOutboxEvent::replace_pending`]) is written one statement per
/// event, in order, so that each event meets the ones before it.
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
    tx: &OutboxTx<'_>,
    events: impl IntoIterator<Item = NewOutboxEvent>,
) -> Result<Vec<PublishOutcome>, PublishError> {
    let rows = prepare_batch(events)?;
    if has_replace(&rows) {
        let mut outcomes = Vec::with_capacity(rows.len());
        for row in &rows {
            outcomes.push(outcome(outbox_store::insert_event(tx, row).await?));
        }
        return Ok(published(outcomes));
    }
    let inserted = outbox_store::insert_events(tx, &rows).await?;
    let keys = keys_not_inserted(&rows, &inserted);
    let holders = outbox_store::dispatch_key_holders(tx, &keys).await?;
    batch_outcomes(&rows, &inserted, &holders)
        // A row that was neither inserted nor blocked by its dispatch key
        // cannot happen: ON CONFLICT only skips on that key.
        .ok_or(PublishError::Database(diesel::result::Error::NotFound))
}

// The steps both drivers share (this module's diesel publisher and
// `crate::sqlx`): everything but the statements, so that both validate,
// stamp and report alike.

/// The row of a validated event, stamped with the current trace context.
/// Called inside the `outbox.publish` span.
pub(crate) fn prepare(event: NewOutboxEvent) -> Result<NewOutboxEventRow, PublishError> {
    let mut row = event.into_row()?;
    stamp(&mut row, TraceContext::current().as_ref());
    Ok(row)
}

/// What inserting one row did.
pub(crate) fn outcome(inserted: Inserted) -> PublishOutcome {
    match inserted {
        Inserted::New(id) => PublishOutcome::Published(id),
        Inserted::Existing(id) => PublishOutcome::Duplicate(id),
        Inserted::Replaced(id) => PublishOutcome::Replaced(id),
    }
}

/// What inserting one row did, recorded on the current (`outbox.publish`) span.
pub(crate) fn recorded(inserted: Inserted) -> PublishOutcome {
    let outcome = outcome(inserted);
    let span = tracing::Span::current();
    span.record("event_id", tracing::field::display(outcome.id()));
    span.record("duplicate", outcome.is_duplicate());
    span.record("replaced", matches!(outcome, PublishOutcome::Replaced(_)));
    outcome
}

/// Whether a batch has an event in replace mode (written one by one).
pub(crate) fn has_replace(rows: &[NewOutboxEventRow]) -> bool {
    rows.iter().any(|row| row.replace_pending)
}

/// The outcomes of a batch written one by one, recorded on the current
/// (`outbox.publish_batch`) span.
pub(crate) fn published(outcomes: Vec<PublishOutcome>) -> Vec<PublishOutcome> {
    let written = outcomes
        .iter()
        .filter(|o| matches!(o, PublishOutcome::Published(_)))
        .count();
    tracing::Span::current().record("published", written);
    outcomes
}

/// The rows of a batch, every event validated before any is returned,
/// each stamped with the current trace context. Called inside the
/// `outbox.publish_batch` span.
pub(crate) fn prepare_batch(
    events: impl IntoIterator<Item = NewOutboxEvent>,
) -> Result<Vec<NewOutboxEventRow>, PublishError> {
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
    Ok(rows)
}

/// The dispatch keys of the rows a batch insert skipped.
pub(crate) fn keys_not_inserted<'r>(
    rows: &'r [NewOutboxEventRow],
    inserted: &HashSet<Uuid>,
) -> Vec<&'r str> {
    rows.iter()
        .filter(|row| !inserted.contains(&row.id))
        .filter_map(|row| row.dispatch_key.as_deref())
        .collect()
}

/// One outcome per row of a batch, in order, recorded on the current
/// (`outbox.publish_batch`) span; `None` when a row was skipped that no
/// holder of its dispatch key explains.
pub(crate) fn batch_outcomes(
    rows: &[NewOutboxEventRow],
    inserted: &HashSet<Uuid>,
    holders: &HashMap<String, Uuid>,
) -> Option<Vec<PublishOutcome>> {
    tracing::Span::current().record("published", inserted.len());
    rows.iter()
        .map(|row| {
            if inserted.contains(&row.id) {
                return Some(PublishOutcome::Published(row.id));
            }
            row.dispatch_key
                .as_ref()
                .and_then(|key| holders.get(key))
                .map(|id| PublishOutcome::Duplicate(*id))
        })
        .collect()
}

/// Records the trace context the row is published in (the publishing span's,
/// so the dispatcher's span becomes its child), if there is one.
fn stamp(row: &mut NewOutboxEventRow, trace: Option<&TraceContext>) {
    row.traceparent = trace.map(|cx| cx.traceparent().to_owned());
    row.tracestate = trace.and_then(|cx| cx.tracestate().map(str::to_owned));
}
