//! Reads of handed-off (`DONE`) rows for reconciliation after a Redis loss
//! and for the Redis guard's safe points. Read-only.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxEvent;
use tracing::instrument;
use uuid::Uuid;

use crate::Result;

/// Up to `limit` DONE rows of `queue` after the cursor `(processed_at, id)`,
/// in hand-off order (the index `outbox_event_done_queue_idx`).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn done_rows_after(
    conn: &mut AsyncPgConnection,
    queue: &str,
    after: (DateTime<Utc>, Uuid),
    limit: usize,
) -> Result<Vec<OutboxEvent>> {
    Ok(diesel::sql_query(
        "SELECT * FROM outbox_event
         WHERE status = 'DONE' AND target_queue = $1
           AND (processed_at, id) > ($2, $3)
         ORDER BY processed_at, id
         LIMIT $4",
    )
    .bind::<Text, _>(queue)
    .bind::<Timestamptz, _>(after.0)
    .bind::<SqlUuid, _>(after.1)
    .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
    .load(conn)
    .await?)
}

/// As [`done_rows_after`], only rows handed off before `before`: the
/// safe-point scan, which cannot move a safe point past `before` whatever
/// it finds later, reads no further.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn done_rows_between(
    conn: &mut AsyncPgConnection,
    queue: &str,
    after: (DateTime<Utc>, Uuid),
    before: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<OutboxEvent>> {
    Ok(diesel::sql_query(
        "SELECT * FROM outbox_event
         WHERE status = 'DONE' AND target_queue = $1
           AND (processed_at, id) > ($2, $3) AND processed_at < $4
         ORDER BY processed_at, id
         LIMIT $5",
    )
    .bind::<Text, _>(queue)
    .bind::<Timestamptz, _>(after.0)
    .bind::<SqlUuid, _>(after.1)
    .bind::<Timestamptz, _>(before)
    .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
    .load(conn)
    .await?)
}

/// The earliest hand-off (`processed_at`) at or after `from` among the
/// `DONE` rows of `queue` whose ids are in `event_ids`; `None` when there
/// is none.
#[instrument(level = "debug", skip(conn, event_ids), fields(events = event_ids.len()), err(level = "debug"))]
pub async fn first_handed_off(
    conn: &mut AsyncPgConnection,
    queue: &str,
    event_ids: &[Uuid],
    from: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>> {
    #[derive(QueryableByName)]
    struct First {
        #[diesel(sql_type = Nullable<Timestamptz>)]
        at: Option<DateTime<Utc>>,
    }
    if event_ids.is_empty() {
        return Ok(None);
    }
    Ok(diesel::sql_query(
        "SELECT min(processed_at) AS at FROM outbox_event
         WHERE id = ANY($1) AND status = 'DONE' AND target_queue = $2 AND processed_at >= $3",
    )
    .bind::<Array<SqlUuid>, _>(event_ids)
    .bind::<Text, _>(queue)
    .bind::<Timestamptz, _>(from)
    .get_result::<First>(conn)
    .await
    .map(|first| first.at)?)
}
