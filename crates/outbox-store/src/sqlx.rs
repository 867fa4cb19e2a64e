//! The publisher's statements on an sqlx connection (feature `sqlx`): the
//! same three operations as [`crate::insert_event`], [`crate::insert_events`]
//! and [`crate::dispatch_key_holders`], for `outbox_publish::sqlx`, with
//! the statement texts this crate exports ([`INSERT_EVENT_SQL`],
//! [`INSERT_EVENTS_SQL`], [`DISPATCH_KEY_HOLDERS_SQL`]). sqlx keeps each
//! text prepared on the connection, so a publish is one round trip.
//!
//! Each operation takes the connection of the caller's transaction
//! (`&mut **tx` for an `sqlx::Transaction<'_, Postgres>`), as the diesel
//! ones do; the publisher's transaction guard stays in `outbox-publish`.

use std::collections::{HashMap, HashSet};

use ::sqlx::PgConnection;
use ::sqlx::types::Json;
use outbox_model::NewOutboxEventRow;
use tracing::instrument;
use uuid::Uuid;

use crate::{
    DISPATCH_KEY_HOLDERS_SQL, INSERT_EVENT_SQL, INSERT_EVENTS_SQL, Inserted, ROWS_PER_STATEMENT,
    Result,
};

/// Inserts one row, as [`crate::insert_event`] does: a row with a dispatch
/// key that another row holds is not written (the caller's transaction
/// survives) and the holder's id comes back.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(name = "insert_event", level = "debug", skip_all, err(level = "debug"))]
pub async fn insert_event(conn: &mut PgConnection, row: &NewOutboxEventRow) -> Result<Inserted> {
    let inserted: Option<Uuid> = ::sqlx::query_scalar(INSERT_EVENT_SQL)
        .bind(row.id)
        .bind(row.tenant_id.as_str())
        .bind(row.event_type.as_str())
        .bind(Json(&row.payload))
        .bind(row.dispatch_key.as_deref())
        .bind(row.scheduled_at)
        .bind(row.traceparent.as_deref())
        .bind(row.tracestate.as_deref())
        .bind(row.ordering_key.as_deref())
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(id) = inserted {
        return Ok(Inserted::New(id));
    }
    // Only the dispatch key's unique index makes ON CONFLICT skip a row.
    let Some(key) = row.dispatch_key.as_deref() else {
        return Err(::sqlx::Error::RowNotFound.into());
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
