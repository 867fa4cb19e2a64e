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
/// other status. On a partitioned `outbox_event` it goes partition by
/// partition, oldest first, until `limit` rows are deleted.
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
    if crate::partitioning(conn).await?.is_none() {
        return purge_done_batch_in(conn, "outbox_event", older_than_secs, limit, from).await;
    }
    // Partition by partition, oldest first, until the batch is full.
    let mut batch = PurgedBatch {
        deleted: 0,
        last_processed_at: None,
    };
    for partition in crate::partitions(conn).await? {
        let left = limit.saturating_sub(u32::try_from(batch.deleted).unwrap_or(u32::MAX));
        if left == 0 {
            break;
        }
        let part = purge_done_batch_in(conn, &partition.name, older_than_secs, left, from).await?;
        batch.deleted += part.deleted;
        batch.last_processed_at = batch.last_processed_at.max(part.last_processed_at);
    }
    Ok(batch)
}

/// [`purge_done_batch`] on one table: `outbox_event`, or one partition of a
/// partitioned `outbox_event` ([`crate::partitions`]). A row's position
/// (`ctid`) is unique within one table only, so on a partitioned
/// `outbox_event` the batch must name a partition: a batch on the
/// partitioned table itself deletes nothing.
///
/// # Errors
///
/// When Postgres fails (a table that does not exist among the causes).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn purge_done_batch_in(
    conn: &mut AsyncPgConnection,
    table: &str,
    older_than_secs: f64,
    limit: u32,
    from: Option<DateTime<Utc>>,
) -> Result<PurgedBatch> {
    let table = format!("\"{}\"", table.replace('"', "\"\""));
    Ok(diesel::sql_query(format!(
        "WITH doomed AS (
             SELECT ctid FROM {table}
             WHERE status = 'DONE' AND processed_at IS NOT NULL
               AND processed_at >= COALESCE($3, '-infinity'::timestamptz)
               AND processed_at < now() - make_interval(secs => $1)
               AND tableoid = '{table}'::regclass
             ORDER BY processed_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         ), gone AS (
             DELETE FROM {table}
             WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
             RETURNING processed_at
         )
         SELECT count(*) AS deleted, max(processed_at) AS last_processed_at FROM gone"
    ))
    .bind::<Double, _>(older_than_secs)
    .bind::<BigInt, _>(i64::from(limit))
    .bind::<Nullable<Timestamptz>, _>(from)
    .get_result(conn)
    .await?)
}

/// How long `DONE` rows must stay for the Redis guard: from the oldest
/// point a guard may still push rows again from to now. That is a queue's
/// safe point (`outbox_redis_safe_point.drained_before`), held back no
/// further than `reach` (the guard never reaches back further than the
/// queue's own retention of finished jobs, so a queue no longer routed
/// holds nothing back for longer), or the cursor of a reconciliation
/// under way (`pending_since`), however old: it pushes from there. Only
/// namespaces whose guard checked within `reach` count (a namespace no
/// dispatcher checks any more holds nothing back). Zero when no safe
/// point counts.
///
/// Retention deleting a `DONE` row after that point would leave a job that
/// Redis then loses with nothing to push it again from.
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// use std::time::Duration;
/// let retention = Duration::from_secs(3600);
/// // QUEUE_DONE_RETENTION_HOURS: the guard reaches no further back.
/// let hold = outbox_store::redis_guard_hold(conn, Duration::from_secs(24 * 3600)).await?;
/// let older_than = retention.max(hold).as_secs_f64();
/// let batch = outbox_store::purge_done_batch(conn, older_than, 1000, None).await?;
/// println!("deleted {}", batch.deleted);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn redis_guard_hold(
    conn: &mut AsyncPgConnection,
    reach: std::time::Duration,
) -> Result<std::time::Duration> {
    #[derive(QueryableByName)]
    struct Hold {
        #[diesel(sql_type = Double)]
        secs: f64,
    }
    let hold: Hold = diesel::sql_query(
        "SELECT CASE WHEN drained IS NULL THEN 0
                ELSE GREATEST(0, EXTRACT(EPOCH FROM now() - LEAST(pending,
                         GREATEST(drained, now() - make_interval(secs => $1)))))
                END::float8 AS secs
         FROM (SELECT min(s.drained_before) AS drained, min(s.pending_since) AS pending
               FROM outbox_redis_safe_point s
               JOIN outbox_redis_epoch e ON e.namespace = s.namespace
               WHERE e.checked_at > now() - make_interval(secs => $1)) AS points",
    )
    .bind::<Double, _>(reach.as_secs_f64())
    .get_result(conn)
    .await?;
    Ok(std::time::Duration::try_from_secs_f64(hold.secs).unwrap_or(reach))
}
