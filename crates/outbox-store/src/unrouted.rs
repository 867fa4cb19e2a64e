//! Events no routing rule matched: those waiting for a route (`PENDING`
//! with `unrouted_since`) and those dead-lettered for the lack of one
//! (`FAILED` with `unrouted_since`). Both find their rows through the small
//! partial index `outbox_event_unrouted_idx` and read only those rows.

use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tracing::instrument;
use uuid::Uuid;

use crate::Result;

/// The events of one type that no route matched, by where they stand.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct UnroutedType {
    /// The event type.
    #[diesel(sql_type = Text)]
    pub event_type: String,
    /// `PENDING` rows waiting for a route (within their grace period).
    #[diesel(sql_type = BigInt)]
    pub waiting: i64,
    /// `FAILED (unrouted)` rows: their grace period ran out.
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
}

/// The event types that have rows waiting for a route or dead-lettered for
/// the lack of one, with their counts, sorted by type.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn unrouted_types(conn: &mut AsyncPgConnection) -> Result<Vec<UnroutedType>> {
    Ok(diesel::sql_query(
        "SELECT event_type,
                count(*) FILTER (WHERE status = 'PENDING') AS waiting,
                count(*) FILTER (WHERE status = 'FAILED') AS failed
         FROM outbox_event
         WHERE unrouted_since IS NOT NULL
         GROUP BY event_type
         ORDER BY event_type",
    )
    .load(conn)
    .await?)
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// Up to `limit` `FAILED (unrouted)` rows of the given types, oldest
/// first: the rows a dispatcher that now has a route for them requeues.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn failed_unrouted_ids(
    conn: &mut AsyncPgConnection,
    event_types: &[String],
    limit: i64,
) -> Result<Vec<Uuid>> {
    let rows: Vec<IdRow> = diesel::sql_query(
        "SELECT id FROM outbox_event
         WHERE unrouted_since IS NOT NULL AND status = 'FAILED' AND event_type = ANY($1)
         ORDER BY created_at
         LIMIT $2",
    )
    .bind::<Array<Text>, _>(event_types)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|row| row.id).collect())
}
