//! Every SQL statement of the dispatcher and of retention, in one place.
//!
//! Outcome updates are *fenced*: they match a row only while it is still
//! `PROCESSING` under the lease (`locked_until`) that this dispatcher's claim
//! set. A dispatcher whose lease expired and whose row was re-claimed by
//! another cannot change the row afterwards; its update matches nothing.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxEvent;
use uuid::Uuid;

/// Claims up to `limit` claimable rows in one round trip: `PENDING` rows whose
/// `scheduled_at` has passed and `PROCESSING` rows whose lease expired (a
/// dispatcher died holding them), oldest first. They become `PROCESSING`
/// with a fresh lease of `lease_ms`. `SKIP LOCKED` lets concurrent
/// dispatchers claim disjoint sets without waiting on each other.
///
/// The `CASE` expression is the one the partial index
/// `outbox_event_claimable_idx` is built on, so the scan is an index range
/// scan over due rows only.
pub const CLAIM_SQL: &str = "\
WITH due AS (
    SELECT id FROM outbox_event
    WHERE status IN ('PENDING', 'PROCESSING')
      AND (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END) <= now()
    ORDER BY (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END)
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_event e
SET status = 'PROCESSING',
    locked_until = clock_timestamp() + make_interval(secs => $2 / 1000.0)
FROM due
WHERE e.id = due.id
RETURNING e.*";

/// Claims rows; see [`CLAIM_SQL`]. The result is sorted by `created_at`
/// (Postgres does not order `RETURNING`).
pub async fn claim(
    conn: &mut AsyncPgConnection,
    limit: u32,
    lease_ms: i64,
) -> diesel::QueryResult<Vec<OutboxEvent>> {
    let mut rows: Vec<OutboxEvent> = diesel::sql_query(CLAIM_SQL)
        .bind::<BigInt, _>(i64::from(limit))
        .bind::<BigInt, _>(lease_ms)
        .load(conn)
        .await?;
    rows.sort_by_key(|row| (row.created_at, row.id));
    Ok(rows)
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// A claimed row's identity for a fenced update: id and the lease the claim set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The row.
    pub id: Uuid,
    /// Its `locked_until` as claimed.
    pub locked_until: DateTime<Utc>,
}

impl Lease {
    /// The lease of a claimed row (`None` when the row carries no lease).
    #[must_use]
    pub fn of(event: &OutboxEvent) -> Option<Self> {
        event.locked_until.map(|locked_until| Self {
            id: event.id,
            locked_until,
        })
    }
}

fn split(leases: &[Lease]) -> (Vec<Uuid>, Vec<DateTime<Utc>>) {
    leases.iter().map(|l| (l.id, l.locked_until)).unzip()
}

fn ids(rows: Vec<IdRow>) -> Vec<Uuid> {
    rows.into_iter().map(|row| row.id).collect()
}

/// Marks handed-off rows `DONE` (one statement), recording the queue.
/// Returns the ids actually updated; a missing id lost its lease.
pub async fn mark_done(
    conn: &mut AsyncPgConnection,
    done: &[(Lease, String)],
) -> diesel::QueryResult<Vec<Uuid>> {
    if done.is_empty() {
        return Ok(Vec::new());
    }
    let (leases, queues): (Vec<Lease>, Vec<String>) = done.iter().cloned().unzip();
    let (id, lease) = split(&leases);
    diesel::sql_query(
        "UPDATE outbox_event e
         SET status = 'DONE', processed_at = now(), locked_until = NULL,
             last_error = NULL, target_queue = v.queue
         FROM unnest($1::uuid[], $2::timestamptz[], $3::text[]) AS v(id, lease, queue)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id",
    )
    .bind::<Array<SqlUuid>, _>(id)
    .bind::<Array<Timestamptz>, _>(lease)
    .bind::<Array<Text>, _>(queues)
    .load(conn)
    .await
    .map(ids)
}

/// A failed hand-off to retry later.
#[derive(Debug, Clone)]
pub struct Retry {
    /// The claimed row.
    pub lease: Lease,
    /// Delay before the row is due again, in milliseconds.
    pub delay_ms: i64,
    /// Why the hand-off failed.
    pub error: String,
    /// The queue it was routed to.
    pub queue: String,
}

/// Puts rows back to `PENDING` with `retries + 1` and `scheduled_at = now() +
/// delay` (one statement). Returns the ids actually updated.
pub async fn mark_retry(
    conn: &mut AsyncPgConnection,
    retries: &[Retry],
) -> diesel::QueryResult<Vec<Uuid>> {
    if retries.is_empty() {
        return Ok(Vec::new());
    }
    let (id, lease) = split(&retries.iter().map(|r| r.lease).collect::<Vec<_>>());
    diesel::sql_query(
        "UPDATE outbox_event e
         SET status = 'PENDING', retries = e.retries + 1, locked_until = NULL,
             scheduled_at = now() + make_interval(secs => v.delay_ms / 1000.0),
             last_error = v.error, target_queue = v.queue
         FROM unnest($1::uuid[], $2::timestamptz[], $3::bigint[], $4::text[], $5::text[])
              AS v(id, lease, delay_ms, error, queue)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id",
    )
    .bind::<Array<SqlUuid>, _>(id)
    .bind::<Array<Timestamptz>, _>(lease)
    .bind::<Array<BigInt>, _>(retries.iter().map(|r| r.delay_ms).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(retries.iter().map(|r| r.error.clone()).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(retries.iter().map(|r| r.queue.clone()).collect::<Vec<_>>())
    .load(conn)
    .await
    .map(ids)
}

/// A row to dead-letter.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The claimed row.
    pub lease: Lease,
    /// Added to `retries` (1 for a failed attempt, 0 for an unroutable event).
    pub retry_increment: i32,
    /// Why.
    pub error: String,
    /// The queue, when it was routed.
    pub queue: Option<String>,
}

/// Moves rows to `FAILED` (one statement), stamping `failed_at = now()`:
/// this is the only statement that dead-letters a row, whether unroutable or
/// out of retries. Returns the ids actually updated.
pub async fn mark_failed(
    conn: &mut AsyncPgConnection,
    failures: &[Failure],
) -> diesel::QueryResult<Vec<Uuid>> {
    if failures.is_empty() {
        return Ok(Vec::new());
    }
    let (id, lease) = split(&failures.iter().map(|f| f.lease).collect::<Vec<_>>());
    diesel::sql_query(
        "UPDATE outbox_event e
         SET status = 'FAILED', retries = e.retries + v.increment, locked_until = NULL,
             last_error = v.error, target_queue = v.queue, failed_at = now()
         FROM unnest($1::uuid[], $2::timestamptz[], $3::int[], $4::text[], $5::text[])
              AS v(id, lease, increment, error, queue)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id",
    )
    .bind::<Array<SqlUuid>, _>(id)
    .bind::<Array<Timestamptz>, _>(lease)
    .bind::<Array<diesel::sql_types::Int4>, _>(
        failures
            .iter()
            .map(|f| f.retry_increment)
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Text>, _>(failures.iter().map(|f| f.error.clone()).collect::<Vec<_>>())
    .bind::<Array<Nullable<Text>>, _>(failures.iter().map(|f| f.queue.clone()).collect::<Vec<_>>())
    .load(conn)
    .await
    .map(ids)
}

/// Gives claimed rows back: `PENDING`, no lease, retries unchanged, due at
/// once (graceful stop). Returns the ids actually released.
pub async fn release(
    conn: &mut AsyncPgConnection,
    leases: &[Lease],
) -> diesel::QueryResult<Vec<Uuid>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (id, lease) = split(leases);
    diesel::sql_query(
        "UPDATE outbox_event e
         SET status = 'PENDING', locked_until = NULL
         FROM unnest($1::uuid[], $2::timestamptz[]) AS v(id, lease)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id",
    )
    .bind::<Array<SqlUuid>, _>(id)
    .bind::<Array<Timestamptz>, _>(lease)
    .load(conn)
    .await
    .map(ids)
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How many `PENDING` rows are due now (walks the claim index).
pub async fn due_pending_count(conn: &mut AsyncPgConnection) -> diesel::QueryResult<i64> {
    diesel::sql_query(
        "SELECT count(*) AS n FROM outbox_event
         WHERE status IN ('PENDING', 'PROCESSING')
           AND (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END) <= now()
           AND status = 'PENDING'",
    )
    .get_result::<CountRow>(conn)
    .await
    .map(|row| row.n)
}

/// Deletes up to `limit` `DONE` rows whose `processed_at` is older than
/// `older_than_secs`, skipping rows another transaction holds. Never touches
/// any other status. Returns how many rows it deleted.
pub async fn purge_done_batch(
    conn: &mut AsyncPgConnection,
    older_than_secs: f64,
    limit: u32,
) -> diesel::QueryResult<usize> {
    diesel::sql_query(
        "WITH doomed AS (
             SELECT id FROM outbox_event
             WHERE status = 'DONE' AND processed_at IS NOT NULL
               AND processed_at < now() - make_interval(secs => $1)
             ORDER BY processed_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         )
         DELETE FROM outbox_event e USING doomed WHERE e.id = doomed.id",
    )
    .bind::<Double, _>(older_than_secs)
    .bind::<BigInt, _>(i64::from(limit))
    .execute(conn)
    .await
}
