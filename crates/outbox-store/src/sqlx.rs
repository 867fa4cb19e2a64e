//! The publisher's statements on an sqlx connection (feature `sqlx`): the
//! same operations as [`crate::insert_event`], [`crate::insert_events`],
//! [`crate::dispatch_key_holders`], [`crate::cancel_event`] and
//! [`crate::reschedule_event`], for `outbox_publish::sqlx`, with
//! the statement texts this crate exports ([`INSERT_EVENT_SQL`],
//! [`INSERT_EVENTS_SQL`], [`DISPATCH_KEY_HOLDERS_SQL`], [`CANCEL_SQL`],
//! [`RESCHEDULE_SQL`]). sqlx keeps each
//! text prepared on the connection, so a publish is one round trip.
//!
//! Each operation takes the connection of the caller's transaction
//! (`&mut **tx` for an `sqlx::Transaction<'_, Postgres>`), as the diesel
//! ones do; the publisher's transaction guard stays in `outbox-publish`.

use std::collections::{HashMap, HashSet};

use ::sqlx::PgConnection;
use ::sqlx::types::Json;
use outbox_model::{NewOutboxEventRow, OutboxStatus};
use tracing::instrument;
use uuid::Uuid;

use crate::history::{CHANGE_ATTEMPTS, changed_under_it, targets};
use crate::insert::written;
use crate::{
    CANCEL_SQL, CancelEvent, DISPATCH_KEY_HOLDERS_SQL, Found, INSERT_EVENT_SQL, INSERT_EVENTS_SQL,
    Inserted, REPLACE_EVENT_SQL, RESCHEDULE_SQL, ROWS_PER_STATEMENT, RescheduleEvent, Result,
};

/// Inserts one row, as [`crate::insert_event`] does: a row with a dispatch
/// key that another row holds is not written (the caller's transaction
/// survives) and the holder's id comes back; in replace mode
/// ([`REPLACE_EVENT_SQL`]) a PENDING holder takes the row's payload.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(name = "insert_event", level = "debug", skip_all, err(level = "debug"))]
pub async fn insert_event(conn: &mut PgConnection, row: &NewOutboxEventRow) -> Result<Inserted> {
    let text = if row.replace_pending {
        REPLACE_EVENT_SQL
    } else {
        INSERT_EVENT_SQL
    };
    let once = async |conn: &mut PgConnection| -> Result<Option<Uuid>> {
        Ok(::sqlx::query_scalar(text)
            .bind(row.id)
            .bind(row.tenant_id.as_str())
            .bind(row.event_type.as_str())
            .bind(Json(&row.payload))
            .bind(row.dispatch_key.as_deref())
            .bind(row.scheduled_at)
            .bind(row.traceparent.as_deref())
            .bind(row.tracestate.as_deref())
            .bind(row.dedupe_for.map(interval))
            .bind(row.dedupe_while_pending)
            .bind(row.priority.get())
            .bind(row.ordering_key.as_deref())
            .fetch_optional(&mut *conn)
            .await?)
    };
    let mut inserted = once(conn).await?;
    if inserted.is_none() && row.replace_pending {
        // Another transaction may have written the key's first row
        // meanwhile: a second run sees it (see REPLACE_EVENT_SQL).
        inserted = once(conn).await?;
    }
    if let Some(id) = inserted {
        return Ok(written(row, id));
    }
    // A held dispatch key makes the insert skip a row, and so does a row
    // with the same id (`ON CONFLICT DO NOTHING` names no index, so that a
    // partitioned table takes it too).
    let Some(key) = row.dispatch_key.as_deref() else {
        return Err(crate::StoreError::duplicate_id(row.id));
    };
    let holders = dispatch_key_holders(conn, &[key]).await?;
    holders
        .get(key)
        .map(|id| Inserted::Existing(*id))
        .ok_or(::sqlx::Error::RowNotFound.into())
}

/// Inserts `rows` with one statement per [`ROWS_PER_STATEMENT`] rows, as
/// [`crate::insert_events`] does, skipping those whose dispatch key
/// another row holds. Returns the ids written.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(
    name = "insert_events",
    level = "debug",
    skip_all,
    err(level = "debug")
)]
pub async fn insert_events(
    conn: &mut PgConnection,
    rows: &[NewOutboxEventRow],
) -> Result<HashSet<Uuid>> {
    let mut inserted: HashSet<Uuid> = HashSet::with_capacity(rows.len());
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let text = |f: fn(&NewOutboxEventRow) -> &str| chunk.iter().map(f).collect::<Vec<_>>();
        let optional =
            |f: fn(&NewOutboxEventRow) -> Option<&str>| chunk.iter().map(f).collect::<Vec<_>>();
        let ids: Vec<Uuid> = ::sqlx::query_scalar(INSERT_EVENTS_SQL)
            .bind(chunk.iter().map(|row| row.id).collect::<Vec<_>>())
            .bind(text(|row| &row.tenant_id))
            .bind(text(|row| &row.event_type))
            .bind(
                chunk
                    .iter()
                    .map(|row| Json(&row.payload))
                    .collect::<Vec<_>>(),
            )
            .bind(optional(|row| row.dispatch_key.as_deref()))
            .bind(chunk.iter().map(|row| row.scheduled_at).collect::<Vec<_>>())
            .bind(optional(|row| row.traceparent.as_deref()))
            .bind(optional(|row| row.tracestate.as_deref()))
            .bind(
                chunk
                    .iter()
                    .map(|row| row.dedupe_for.map(interval))
                    .collect::<Vec<_>>(),
            )
            .bind(
                chunk
                    .iter()
                    .map(|row| row.dedupe_while_pending)
                    .collect::<Vec<_>>(),
            )
            .bind(
                chunk
                    .iter()
                    .map(|row| row.priority.get())
                    .collect::<Vec<_>>(),
            )
            .bind(optional(|row| row.ordering_key.as_deref()))
            .fetch_all(&mut *conn)
            .await?;
        inserted.extend(ids);
    }
    Ok(inserted)
}

/// The ids of the rows holding `keys` (dispatch keys), by key, as
/// [`crate::dispatch_key_holders`] reads them.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(
    name = "dispatch_key_holders",
    level = "debug",
    skip_all,
    err(level = "debug")
)]
pub async fn dispatch_key_holders(
    conn: &mut PgConnection,
    keys: &[&str],
) -> Result<HashMap<String, Uuid>> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let found: Vec<(String, Uuid)> = ::sqlx::query_as(DISPATCH_KEY_HOLDERS_SQL)
        .bind(keys)
        .fetch_all(conn)
        .await?;
    Ok(found.into_iter().collect())
}

/// Cancels the one row `cancel.key` finds, as [`crate::cancel_event`]
/// does: the same statement ([`CANCEL_SQL`]), the same history entry.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(
    name = "cancel_event",
    level = "debug",
    skip(conn),
    err(level = "debug")
)]
pub async fn cancel_event(
    conn: &mut PgConnection,
    cancel: CancelEvent<'_>,
) -> Result<Option<Found>> {
    let (ids, keys) = targets(cancel.key);
    let mut found = None;
    for _ in 0..CHANGE_ATTEMPTS {
        let rows: Vec<(Uuid, String, bool)> = ::sqlx::query_as(CANCEL_SQL)
            .bind(&ids)
            .bind(&keys)
            .bind(statuses(cancel.allowed))
            .bind(cancel.reason)
            .bind(cancel.requested_by)
            .fetch_all(&mut *conn)
            .await?;
        found = settled(conn, last_found(rows)?).await?;
        if !changed_under_it(found.as_ref(), cancel.allowed) {
            break;
        }
    }
    Ok(found)
}

/// Moves the one row `reschedule.key` finds, as
/// [`crate::reschedule_event`] does: the same statement
/// ([`RESCHEDULE_SQL`]), the same history entry.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(
    name = "reschedule_event",
    level = "debug",
    skip(conn),
    err(level = "debug")
)]
pub async fn reschedule_event(
    conn: &mut PgConnection,
    reschedule: RescheduleEvent<'_>,
) -> Result<Option<Found>> {
    let (ids, keys) = targets(reschedule.key);
    let mut found = None;
    for _ in 0..CHANGE_ATTEMPTS {
        let rows: Vec<(Uuid, String, bool)> = ::sqlx::query_as(RESCHEDULE_SQL)
            .bind(&ids)
            .bind(&keys)
            .bind(statuses(reschedule.allowed))
            .bind(reschedule.at)
            .bind(reschedule.reason)
            .bind(reschedule.requested_by)
            .fetch_all(&mut *conn)
            .await?;
        found = settled(conn, last_found(rows)?).await?;
        if !changed_under_it(found.as_ref(), reschedule.allowed) {
            break;
        }
    }
    Ok(found)
}

/// `found` with its status read again when the statement left it alone,
/// as [`crate::cancel_event`] does it: a concurrent change may have come
/// first, and the caller is told the status that change left.
async fn settled(conn: &mut PgConnection, found: Option<Found>) -> Result<Option<Found>> {
    let Some(found) = found else {
        return Ok(None);
    };
    if found.changed {
        return Ok(Some(found));
    }
    let now: Option<(String,)> =
        ::sqlx::query_as("SELECT status::text FROM outbox_event WHERE id = $1")
            .bind(found.id)
            .fetch_optional(conn)
            .await?;
    let status = match now {
        Some((text,)) => text
            .parse()
            .map_err(|e| ::sqlx::Error::Decode(Box::new(e)))?,
        None => found.status,
    };
    Ok(Some(Found { status, ..found }))
}

fn statuses(allowed: &[OutboxStatus]) -> Vec<&'static str> {
    allowed.iter().map(|status| status.as_str()).collect()
}

/// The row a one-row statement found, its status text parsed.
fn last_found(rows: Vec<(Uuid, String, bool)>) -> Result<Option<Found>> {
    let Some((id, status, changed)) = rows.into_iter().last() else {
        return Ok(None);
    };
    let status: OutboxStatus = status
        .parse()
        .map_err(|e| ::sqlx::Error::Decode(Box::new(e)))?;
    Ok(Some(Found {
        id,
        status,
        changed,
    }))
}

/// diesel's interval (what the row holds) as sqlx's.
fn interval(value: diesel::pg::data_types::PgInterval) -> ::sqlx::postgres::types::PgInterval {
    ::sqlx::postgres::types::PgInterval {
        months: value.months,
        days: value.days,
        microseconds: value.microseconds,
    }
}
