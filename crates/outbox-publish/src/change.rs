//! Cancel and reschedule from code, in the caller's transaction: the rules
//! here, the statements in `outbox-store`.

use std::fmt;

use chrono::{DateTime, Utc};
use outbox_model::OutboxStatus;
use outbox_store::{CancelEvent, EventKey, Found, RescheduleEvent};
use tracing::instrument;
use uuid::Uuid;

use crate::{NotInTransaction, OutboxTx};

/// Which event to change: by its id, or by the dispatch key it holds.
///
/// A key finds the row that holds it now; a key released by a dedupe
/// window (see [`crate::Dedupe`]) finds the newer holder, or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventRef {
    /// The event's id, as publishing returned it.
    Id(Uuid),
    /// The producer idempotency key given with
    /// [`NewOutboxEvent::dispatch_key`](crate::NewOutboxEvent::dispatch_key).
    DispatchKey(String),
}

impl EventRef {
    /// The store's key of the row.
    pub(crate) fn key(&self) -> EventKey<'_> {
        match self {
            Self::Id(id) => EventKey::Id(*id),
            Self::DispatchKey(key) => EventKey::DispatchKey(key),
        }
    }
}

impl fmt::Display for EventRef {
    /// `event 0190…` or `the event with dispatch key "…"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(id) => write!(f, "event {id}"),
            Self::DispatchKey(key) => write!(f, "the event with dispatch key {key:?}"),
        }
    }
}

impl From<Uuid> for EventRef {
    fn from(id: Uuid) -> Self {
        Self::Id(id)
    }
}

/// The statuses [`reschedule`] changes: a row not claimed yet.
pub(crate) const RESCHEDULABLE: [OutboxStatus; 1] = [OutboxStatus::Pending];

/// Why an event was not cancelled or rescheduled. Every variant but the
/// database ones is found without aborting the caller's transaction: the
/// caller may handle it and go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    /// No event has this id or dispatch key.
    #[error("no outbox event found: {event}")]
    NotFound {
        /// What was looked for.
        event: EventRef,
    },
    /// The event's status is not one a cancel changes
    /// ([`OutboxStatus::CANCELLABLE`]: PENDING and FAILED).
    #[error(
        "{event} ({id}) is {status} and cannot be cancelled: only PENDING and FAILED events can"
    )]
    NotCancellable {
        /// What was looked for.
        event: EventRef,
        /// The event's id.
        id: Uuid,
        /// Its status.
        status: OutboxStatus,
    },
    /// The event is not PENDING: a PROCESSING one is being handed off by a
    /// dispatcher right now, and a DONE, FAILED or CANCELLED one is never
    /// dispatched again by itself.
    #[error("{event} ({id}) is {status} and cannot be rescheduled: only PENDING events can")]
    NotReschedulable {
        /// What was looked for.
        event: EventRef,
        /// The event's id.
        id: Uuid,
        /// Its status.
        status: OutboxStatus,
    },
    /// The dispatch key looked for contains NUL, which no stored key does.
    #[error("the dispatch key contains a NUL character (U+0000) at byte {position}")]
    DispatchKeyContainsNul {
        /// Byte offset of the first NUL.
        position: usize,
    },
    /// The reason contains NUL, which Postgres `text` cannot store.
    #[error("the reason contains a NUL character (U+0000) at byte {position}")]
    ReasonContainsNul {
        /// Byte offset of the first NUL.
        position: usize,
    },
    /// The handle was not inside a transaction (see [`OutboxTx::new`]).
    #[error(transparent)]
    NotInTransaction(#[from] NotInTransaction),
    /// Postgres refused the statement or the connection failed. The
    /// caller's transaction is aborted and must be rolled back.
    #[error("database error while changing an outbox event: {0}")]
    Database(#[from] diesel::result::Error),
    /// Postgres refused a statement of the sqlx form ([`crate::sqlx`],
    /// feature `sqlx`) or the connection failed. The caller's transaction
    /// is aborted and must be rolled back.
    #[cfg(feature = "sqlx")]
    #[error("database error while changing an outbox event: {0}")]
    Sqlx(#[from] ::sqlx::Error),
}

impl From<outbox_store::StoreError> for ChangeError {
    fn from(error: outbox_store::StoreError) -> Self {
        #[cfg(feature = "sqlx")]
        if let outbox_store::StoreError::Sqlx(error) = error {
            return Self::Sqlx(error);
        }
        Self::Database(error.into_diesel())
    }
}

/// Cancels one event in the caller's transaction, as `outbox cancel` does:
/// a PENDING or FAILED event ([`OutboxStatus::CANCELLABLE`]) goes
/// CANCELLED and is never dispatched; its history (`outbox show`, table
/// `outbox_event_requeue`) gets an entry with action `cancel`, `reason`,
/// the status, retries and last error it had, and no `requested_by`. An
/// operator can bring it back with `outbox requeue`. Returns the event's id.
///
/// The change commits or rolls back with the caller's transaction; until
/// then the row stays locked, so a dispatcher skips it. A cancelled event
/// keeps its dispatch key (see [`crate::Dedupe`] for when it is freed).
///
/// # Errors
///
/// [`ChangeError::NotFound`], [`ChangeError::NotCancellable`] (with the
/// status), [`ChangeError::DispatchKeyContainsNul`] or
/// [`ChangeError::ReasonContainsNul`] leave the transaction usable;
/// [`ChangeError::Database`] means it is aborted.
///
/// # Example
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
/// use outbox_publish::{ChangeError, EventRef, OutboxTx, cancel};
///
/// # async fn demo(conn: &mut AsyncPgConnection) -> Result<(), ChangeError> {
/// conn.transaction::<_, ChangeError, _>(async |conn| {
///     let mut tx = OutboxTx::new(conn)?;
///     let key = EventRef::DispatchKey("order-7-reminder".to_owned());
///     match cancel(&mut tx, key, "order paid before the reminder").await {
///         Ok(_) | Err(ChangeError::NotCancellable { .. } | ChangeError::NotFound { .. }) => Ok(()),
///         Err(other) => Err(other),
///     }
/// })
/// .await
/// # }
/// ```
#[instrument(name = "outbox.cancel", skip_all, fields(event = %event, event_id), err)]
pub async fn cancel(
    tx: &mut OutboxTx<'_>,
    event: EventRef,
    reason: &str,
) -> Result<Uuid, ChangeError> {
    check(&event, reason)?;
    let found = outbox_store::cancel_event(tx.conn(), cancel_of(&event, reason)).await?;
    cancelled(event, found)
}

/// Moves one PENDING event's dispatch to `at` (earlier or later; a past
/// instant makes it due now), in the caller's transaction. Returns the
/// event's id. The dispatcher claims it at its first poll or wake-up after
/// `at`. Its history (`outbox show`, table `outbox_event_requeue`) gets an
/// entry with action `reschedule`, `reason`, the due time it had
/// (`previous_scheduled_at`), its status, retries and last error, and no
/// `requested_by`.
///
/// Only a PENDING event changes. A PROCESSING one is being handed off by a
/// dispatcher right now: it is refused with
/// [`ChangeError::NotReschedulable`], is handed off as it was and gets no
/// history entry (to retry later, wait for it to go back to PENDING or
/// cancel it instead). The change and its entry commit or roll back with
/// the caller's transaction.
///
/// # Errors
///
/// [`ChangeError::NotFound`], [`ChangeError::NotReschedulable`] (with the
/// status), [`ChangeError::DispatchKeyContainsNul`] or
/// [`ChangeError::ReasonContainsNul`] leave the transaction usable;
/// [`ChangeError::Database`] means it is aborted.
///
/// # Example
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
/// use outbox_publish::{ChangeError, EventRef, OutboxTx, reschedule};
///
/// # async fn demo(conn: &mut AsyncPgConnection, id: uuid::Uuid) -> Result<(), ChangeError> {
/// let later = chrono::Utc::now() + chrono::Duration::hours(1);
/// conn.transaction::<_, ChangeError, _>(async |conn| {
///     let mut tx = OutboxTx::new(conn)?;
///     reschedule(&mut tx, EventRef::Id(id), later, "customer asked for the evening").await?;
///     Ok(())
/// })
/// .await
/// # }
/// ```
#[instrument(name = "outbox.reschedule", skip_all, fields(event = %event, event_id, %at), err)]
pub async fn reschedule(
    tx: &mut OutboxTx<'_>,
    event: EventRef,
    at: DateTime<Utc>,
    reason: &str,
) -> Result<Uuid, ChangeError> {
    check(&event, reason)?;
    let found =
        outbox_store::reschedule_event(tx.conn(), reschedule_of(&event, at, reason)).await?;
    rescheduled(event, found)
}

// The steps both drivers share (the diesel functions above and
// `crate::sqlx`): everything but the statements.

/// Refuses what Postgres would refuse with an error that aborts the
/// transaction, before any SQL.
pub(crate) fn check(event: &EventRef, reason: &str) -> Result<(), ChangeError> {
    if let EventRef::DispatchKey(key) = event
        && let Some(position) = key.find('\0')
    {
        return Err(ChangeError::DispatchKeyContainsNul { position });
    }
    if let Some(position) = reason.find('\0') {
        return Err(ChangeError::ReasonContainsNul { position });
    }
    Ok(())
}

/// The store's cancel of `event`, under the shared rule.
pub(crate) fn cancel_of<'a>(event: &'a EventRef, reason: &'a str) -> CancelEvent<'a> {
    CancelEvent {
        key: event.key(),
        allowed: &OutboxStatus::CANCELLABLE,
        reason,
        requested_by: None,
    }
}

/// The store's reschedule of `event` to `at`, under the shared rule.
pub(crate) fn reschedule_of<'a>(
    event: &'a EventRef,
    at: DateTime<Utc>,
    reason: &'a str,
) -> RescheduleEvent<'a> {
    RescheduleEvent {
        key: event.key(),
        allowed: &RESCHEDULABLE,
        at,
        reason,
        requested_by: None,
    }
}

/// What a cancel found, as the caller's result.
pub(crate) fn cancelled(event: EventRef, found: Option<Found>) -> Result<Uuid, ChangeError> {
    match found {
        None => Err(ChangeError::NotFound { event }),
        Some(found) if found.changed => Ok(recorded(found.id)),
        Some(Found { id, status, .. }) => Err(ChangeError::NotCancellable { event, id, status }),
    }
}

/// What a reschedule found, as the caller's result.
pub(crate) fn rescheduled(event: EventRef, found: Option<Found>) -> Result<Uuid, ChangeError> {
    match found {
        None => Err(ChangeError::NotFound { event }),
        Some(found) if found.changed => Ok(recorded(found.id)),
        Some(Found { id, status, .. }) => Err(ChangeError::NotReschedulable { event, id, status }),
    }
}

/// The id changed, recorded on the current span.
fn recorded(id: Uuid) -> Uuid {
    tracing::Span::current().record("event_id", tracing::field::display(id));
    id
}
