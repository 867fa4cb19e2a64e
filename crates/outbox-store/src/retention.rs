//! Retention: deleting old `DONE` rows in batches.
//!
//! # Transactions and locks
//!
//! Each batch is one statement that locks its rows with `SKIP LOCKED`, so
//! retention never waits for a dispatcher and a dispatcher never waits for
//! retention.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double, Nullable, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tracing::instrument;

use crate::Result;

/// What one retention batch deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct PurgedBatch {
    /// Rows deleted.
    #[diesel(sql_type = BigInt)]
    pub deleted: i64,
    /// The latest `processed_at` among them: where the next batch starts.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_processed_at: Option<DateTime<Utc>>,
}

/// Deletes up to `limit` `DONE` rows whose `processed_at` is older than
/// `older_than_secs`, oldest first and from `from` on (`None`: from the
/// oldest), skipping rows another transaction holds. Never touches any
/// other status.
///
/// Two things keep a batch's cost flat over a long run:
///
/// - `from` (the previous batch's [`PurgedBatch::last_processed_at`]) starts
///   the scan of `outbox_event_done_processed_at_idx` where the last batch
///   ended. The entries of the rows deleted before stay in that index until
///   a `VACUUM`, and a scan from the index's head walked all of them: in a
///   run over 1,000,000 rows in batches of 1,000 the last batches took 1.6
///   times as long as the first, and the run 11.5 s against 4 to 4.6 s
///   now (docs/performance.md, "Retention").
/// - The locked rows are deleted by their position (`ctid`), which the lock
///   holds in place until the statement's transaction ends, instead of
///   being found again through the primary key (one index descent a row).
///
/// A row skipped because another transaction held it, older than `from`,
/// is left for the next run.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn purge_done_batch(
    conn: &mut AsyncPgConnection,
    older_than_secs: f64,
    limit: u32,
    from: Option<DateTime<Utc>>,
) -> Result<PurgedBatch> {
    Ok(diesel::sql_query(
        "WITH doomed AS (
             SELECT ctid FROM outbox_event
             WHERE status = 'DONE' AND processed_at IS NOT NULL
               AND processed_at >= COALESCE($3, '-infinity'::timestamptz)
               AND processed_at < now() - make_interval(secs => $1)
             ORDER BY processed_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         ), gone AS (
             DELETE FROM outbox_event
             WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
             RETURNING processed_at
         )
         SELECT count(*) AS deleted, max(processed_at) AS last_processed_at FROM gone",
    )
    .bind::<Double, _>(older_than_secs)
    .bind::<BigInt, _>(i64::from(limit))
    .bind::<Nullable<Timestamptz>, _>(from)
    .get_result(conn)
    .await?)
}
