//! Every SQL statement of the dispatcher and of retention, in one place.
//!
//! Outcome updates are *fenced*: they match a row only while it is still
//! `PROCESSING` under the lease (`locked_until`) that this dispatcher's claim
//! set. A dispatcher whose lease expired and whose row was re-claimed by
//! another cannot change the row afterwards; its update matches nothing.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{
    Array, BigInt, Double, Int4, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures::future::try_join_all;
use outbox_model::{OutboxEvent, prepared};
use serde_json::{Map, Value};
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
///
/// The claimed ids come back to the `UPDATE` as one array (`= ANY(ARRAY(…))`)
/// rather than through a join: the join planned a hash join over a
/// sequential scan of the whole table from about 500 rows on, while the
/// array is always looked up through the primary key, at a cost linear in
/// the batch (docs/performance.md, "Batch size").
///
/// Every row of one claim gets the same lease, `now()` (the statement's
/// transaction time) plus `lease_ms`, so the outcome statements can fence a
/// whole claim with one value instead of joining a per-row list. The fence
/// stays strict: a row is re-claimed only once `locked_until <= now()`, so
/// the next claim's lease is always later than the one it replaces.
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
    locked_until = now() + make_interval(secs => $2 / 1000.0)
WHERE e.id = ANY(ARRAY(SELECT id FROM due))
RETURNING e.*";

/// Claims rows; see [`CLAIM_SQL`]. The result is sorted by `created_at`
/// (Postgres does not order `RETURNING`).
pub async fn claim(
    conn: &mut AsyncPgConnection,
    limit: u32,
    lease_ms: i64,
) -> diesel::QueryResult<Vec<OutboxEvent>> {
    let mut rows: Vec<OutboxEvent> = prepared(CLAIM_SQL)
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
    /// Its `locked_until` as claimed (the same for every row of one claim).
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

/// The fence shared by the outcome statements: `$1` is the ids, `$2` the
/// lease they were claimed under. No join, so no plan that rescans a list
/// once per row: the ids are looked up through the primary key (one index
/// descent per id, the array sorted once) and the status and lease are
/// checked on each row found, a cost linear in the batch (docs/performance.md,
/// "Batch size").
///
/// The status test is written `(status = 'PROCESSING') IS TRUE`, which means
/// the same in a `WHERE` (the column is `NOT NULL`), so that the planner cannot
/// match it to the claim index's predicate (`status IN ('PENDING',
/// 'PROCESSING')`). Written as a plain `status = 'PROCESSING'`, statistics
/// taken while few rows were due made the planner read the rows through the
/// claim index instead of the primary key: every outcome statement then
/// walked every due row's entry (5 ms a statement with 50,000 rows waiting,
/// against 0.04 ms through the key; docs/performance.md, "Plans that go
/// stale"). That rests on the planner not seeing through `IS TRUE`; the
/// test `the_outcome_statements_use_the_primary_key_when_a_backlog_outgrew_the_statistics`
/// fails if a Postgres version starts to.
macro_rules! fenced {
    () => {
        "WHERE id = ANY($1) AND (status = 'PROCESSING') IS TRUE AND locked_until = $2
         RETURNING id"
    };
}

/// Marks handed-off rows `DONE`; one statement per lease (a claim has one).
/// `$3` maps each id (as text) to its queue: a JSON object, whose keys
/// Postgres keeps sorted, so each row's queue is a binary search, not a scan
/// of a list. See [`mark_done`].
pub const DONE_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'DONE', processed_at = now(), locked_until = NULL,
         last_error = NULL, target_queue = $3 ->> id::text
     ",
    fenced!()
);

/// Puts rows back to `PENDING` after a failed hand-off; one statement per
/// lease, delay in milliseconds (`$3`), error (`$4`) and queue (`$5`). See
/// [`mark_retry`].
pub const RETRY_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'PENDING', retries = retries + 1, locked_until = NULL,
         scheduled_at = now() + make_interval(secs => $3 / 1000.0),
         last_error = $4, target_queue = $5
     ",
    fenced!()
);

/// Dead-letters rows; one statement per lease, retry increment (`$3`), error
/// (`$4`) and queue (`$5`). See [`mark_failed`].
pub const FAILED_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'FAILED', retries = retries + $3, locked_until = NULL,
         last_error = $4, target_queue = $5, failed_at = now()
     ",
    fenced!()
);

/// Gives rows back to `PENDING`, due at once; one statement per lease. See
/// [`release`].
pub const RELEASE_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'PENDING', locked_until = NULL
     ",
    fenced!()
);

/// Groups ids by the values their outcome statement binds besides the ids.
fn group<K: Ord>(items: impl IntoIterator<Item = (K, Uuid)>) -> Vec<(K, Vec<Uuid>)> {
    let mut groups: BTreeMap<K, Vec<Uuid>> = BTreeMap::new();
    for (key, id) in items {
        groups.entry(key).or_default().push(id);
    }
    groups.into_iter().collect()
}

/// The ids the pipelined statements of [`mark_done`] and its siblings updated.
fn updated(groups: Vec<Vec<IdRow>>) -> Vec<Uuid> {
    groups.into_iter().flatten().map(|row| row.id).collect()
}

/// Marks handed-off rows `DONE`, recording the queue: one [`DONE_SQL`] per
/// lease (a claim has one lease, so one statement a tick), pipelined when
/// there are several. Returns the ids actually updated; a missing id lost
/// its lease.
pub async fn mark_done(
    conn: &mut AsyncPgConnection,
    done: &[(Lease, String)],
) -> diesel::QueryResult<Vec<Uuid>> {
    /// The ids of one lease and the queue of each.
    type Batch = (Vec<Uuid>, Map<String, Value>);
    let mut groups: BTreeMap<DateTime<Utc>, Batch> = BTreeMap::new();
    for (lease, queue) in done {
        let (ids, queues) = groups.entry(lease.locked_until).or_default();
        ids.push(lease.id);
        queues.insert(lease.id.to_string(), Value::String(queue.clone()));
    }
    let conn: &AsyncPgConnection = conn;
    let statements = groups.into_iter().map(|(lease, (ids, queues))| async move {
        let mut conn = conn;
        prepared(DONE_SQL)
            .bind::<Array<SqlUuid>, _>(ids)
            .bind::<Timestamptz, _>(lease)
            .bind::<Jsonb, _>(Value::Object(queues))
            .load::<IdRow>(&mut conn)
            .await
    });
    try_join_all(statements).await.map(updated)
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
/// delay`: one [`RETRY_SQL`] per lease, delay, error and queue, pipelined.
/// Returns the ids actually updated.
pub async fn mark_retry(
    conn: &mut AsyncPgConnection,
    retries: &[Retry],
) -> diesel::QueryResult<Vec<Uuid>> {
    let groups = group(retries.iter().map(|r| {
        let key = (
            r.lease.locked_until,
            r.delay_ms,
            r.error.clone(),
            r.queue.clone(),
        );
        (key, r.lease.id)
    }));
    let conn: &AsyncPgConnection = conn;
    let statements = groups
        .into_iter()
        .map(|((lease, delay_ms, error, queue), ids)| async move {
            let mut conn = conn;
            prepared(RETRY_SQL)
                .bind::<Array<SqlUuid>, _>(ids)
                .bind::<Timestamptz, _>(lease)
                .bind::<BigInt, _>(delay_ms)
                .bind::<Text, _>(error)
                .bind::<Text, _>(queue)
                .load::<IdRow>(&mut conn)
                .await
        });
    try_join_all(statements).await.map(updated)
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

/// Moves rows to `FAILED`, stamping `failed_at = now()`: one [`FAILED_SQL`]
/// per lease, increment, error and queue, pipelined. This is the only
/// statement that dead-letters a row, whether unroutable or out of retries.
/// Returns the ids actually updated.
pub async fn mark_failed(
    conn: &mut AsyncPgConnection,
    failures: &[Failure],
) -> diesel::QueryResult<Vec<Uuid>> {
    let groups = group(failures.iter().map(|f| {
        let key = (
            f.lease.locked_until,
            f.retry_increment,
            f.error.clone(),
            f.queue.clone(),
        );
        (key, f.lease.id)
    }));
    let conn: &AsyncPgConnection = conn;
    let statements = groups
        .into_iter()
        .map(|((lease, increment, error, queue), ids)| async move {
            let mut conn = conn;
            prepared(FAILED_SQL)
                .bind::<Array<SqlUuid>, _>(ids)
                .bind::<Timestamptz, _>(lease)
                .bind::<Int4, _>(increment)
                .bind::<Text, _>(error)
                .bind::<Nullable<Text>, _>(queue)
                .load::<IdRow>(&mut conn)
                .await
        });
    try_join_all(statements).await.map(updated)
}

/// Gives claimed rows back: `PENDING`, no lease, retries unchanged, due at
/// once (graceful stop): one [`RELEASE_SQL`] per lease. Returns the ids
/// actually released.
pub async fn release(
    conn: &mut AsyncPgConnection,
    leases: &[Lease],
) -> diesel::QueryResult<Vec<Uuid>> {
    let groups = group(leases.iter().map(|l| (l.locked_until, l.id)));
    let conn: &AsyncPgConnection = conn;
    let statements = groups.into_iter().map(|(lease, ids)| async move {
        let mut conn = conn;
        prepared(RELEASE_SQL)
            .bind::<Array<SqlUuid>, _>(ids)
            .bind::<Timestamptz, _>(lease)
            .load::<IdRow>(&mut conn)
            .await
    });
    try_join_all(statements).await.map(updated)
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
pub async fn purge_done_batch(
    conn: &mut AsyncPgConnection,
    older_than_secs: f64,
    limit: u32,
    from: Option<DateTime<Utc>>,
) -> diesel::QueryResult<PurgedBatch> {
    diesel::sql_query(
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
    .await
}

// --- Redis loss: the marker's epoch, the safe points, reconciliation ---

/// What the dispatchers remember of a namespace's Redis marker.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct EpochRow {
    /// The marker's epoch id.
    #[diesel(sql_type = SqlUuid)]
    pub epoch: Uuid,
    /// The Redis run at the last check.
    #[diesel(sql_type = Text)]
    pub run_id: String,
    /// The last check that found the marker intact.
    #[diesel(sql_type = Timestamptz)]
    pub checked_at: DateTime<Utc>,
}

/// One queue's safe point and pending reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct SafePointRow {
    /// The queue.
    #[diesel(sql_type = Text)]
    pub queue: String,
    /// Every job handed off before this had finished at the last check.
    #[diesel(sql_type = Timestamptz)]
    pub drained_before: DateTime<Utc>,
    /// A reconciliation is due from here on.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub pending_since: Option<DateTime<Utc>>,
    /// With `pending_since`, the id of the last row reconciled.
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub pending_after_id: Option<Uuid>,
}

#[derive(QueryableByName)]
struct NowRow {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// Postgres' `now()`: every time the Redis guard compares is Postgres
/// time, as `processed_at` is.
pub async fn db_now(conn: &mut AsyncPgConnection) -> diesel::QueryResult<DateTime<Utc>> {
    diesel::sql_query("SELECT now() AS now")
        .get_result::<NowRow>(conn)
        .await
        .map(|row| row.now)
}

/// Serialises the checks of one namespace until the transaction ends
/// (a transaction-scoped advisory lock, so a pooled connection never keeps it).
pub async fn lock_namespace(
    conn: &mut AsyncPgConnection,
    namespace: &str,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "SELECT pg_advisory_xact_lock(hashtextextended('outbox_redis_epoch:' || $1, 0))",
    )
    .bind::<Text, _>(namespace)
    .execute(conn)
    .await
    .map(|_| ())
}

/// The remembered marker of `namespace`, if any.
pub async fn remembered_epoch(
    conn: &mut AsyncPgConnection,
    namespace: &str,
) -> diesel::QueryResult<Option<EpochRow>> {
    use diesel::OptionalExtension;
    diesel::sql_query(
        "SELECT epoch, run_id, checked_at FROM outbox_redis_epoch WHERE namespace = $1",
    )
    .bind::<Text, _>(namespace)
    .get_result::<EpochRow>(conn)
    .await
    .optional()
}

/// Remembers `epoch` seen in the server run `run_id`, checked now.
pub async fn save_epoch(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    epoch: Uuid,
    run_id: &str,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO outbox_redis_epoch (namespace, epoch, run_id, checked_at)
         VALUES ($1, $2, $3, now())
         ON CONFLICT (namespace) DO UPDATE
         SET epoch = EXCLUDED.epoch, run_id = EXCLUDED.run_id, checked_at = EXCLUDED.checked_at",
    )
    .bind::<Text, _>(namespace)
    .bind::<SqlUuid, _>(epoch)
    .bind::<Text, _>(run_id)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Creates the safe point of every queue of `queues` that has none, at
/// `floor` (nothing is known before it).
pub async fn ensure_safe_points(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    queues: &[String],
    floor: DateTime<Utc>,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO outbox_redis_safe_point (namespace, queue, drained_before)
         SELECT $1, q, $3 FROM unnest($2::text[]) AS q
         ON CONFLICT (namespace, queue) DO NOTHING",
    )
    .bind::<Text, _>(namespace)
    .bind::<Array<Text>, _>(queues)
    .bind::<Timestamptz, _>(floor)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Every queue's safe point in `namespace`.
pub async fn safe_points(
    conn: &mut AsyncPgConnection,
    namespace: &str,
) -> diesel::QueryResult<Vec<SafePointRow>> {
    diesel::sql_query(
        "SELECT queue, drained_before, pending_since, pending_after_id
         FROM outbox_redis_safe_point WHERE namespace = $1 ORDER BY queue",
    )
    .bind::<Text, _>(namespace)
    .load(conn)
    .await
}

/// After a loss: a reconciliation becomes due for every queue of
/// `namespace` from its safe point (never before `floor`). A queue whose
/// reconciliation is already due from an earlier point keeps it; one due
/// from a later point starts again from the earlier one. Returns the
/// queues and where their reconciliation starts.
pub async fn mark_pending(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    floor: DateTime<Utc>,
) -> diesel::QueryResult<Vec<SafePointRow>> {
    diesel::sql_query(
        "UPDATE outbox_redis_safe_point SET
             pending_after_id = CASE
                 WHEN pending_since IS NOT NULL AND pending_since <= GREATEST(drained_before, $2)
                 THEN pending_after_id END,
             pending_since = CASE
                 WHEN pending_since IS NOT NULL AND pending_since <= GREATEST(drained_before, $2)
                 THEN pending_since ELSE GREATEST(drained_before, $2) END
         WHERE namespace = $1
         RETURNING queue, drained_before, pending_since, pending_after_id",
    )
    .bind::<Text, _>(namespace)
    .bind::<Timestamptz, _>(floor)
    .load(conn)
    .await
}

/// Moves the safe point of `queue` forward to `mark` (never back), unless a
/// reconciliation of the queue is due or the marker's epoch is no longer
/// `epoch` (a loss was detected since the scan began): then it leaves it.
pub async fn advance_drained(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    queue: &str,
    epoch: Uuid,
    mark: DateTime<Utc>,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "UPDATE outbox_redis_safe_point s SET drained_before = GREATEST(s.drained_before, $4)
         WHERE s.namespace = $1 AND s.queue = $2 AND s.pending_since IS NULL
           AND EXISTS (SELECT 1 FROM outbox_redis_epoch e WHERE e.namespace = $1 AND e.epoch = $3)",
    )
    .bind::<Text, _>(namespace)
    .bind::<Text, _>(queue)
    .bind::<SqlUuid, _>(epoch)
    .bind::<Timestamptz, _>(mark)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Moves a queue's pending reconciliation from the cursor `from` to `to`
/// (`None`: done), if nothing else changed it meanwhile (a new loss sets it
/// back). Returns whether it did.
pub async fn advance_pending(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    queue: &str,
    from: (DateTime<Utc>, Option<Uuid>),
    to: Option<(DateTime<Utc>, Uuid)>,
) -> diesel::QueryResult<bool> {
    diesel::sql_query(
        "UPDATE outbox_redis_safe_point SET pending_since = $5, pending_after_id = $6
         WHERE namespace = $1 AND queue = $2
           AND pending_since = $3 AND pending_after_id IS NOT DISTINCT FROM $4",
    )
    .bind::<Text, _>(namespace)
    .bind::<Text, _>(queue)
    .bind::<Timestamptz, _>(from.0)
    .bind::<Nullable<SqlUuid>, _>(from.1)
    .bind::<Nullable<Timestamptz>, _>(to.map(|(at, _)| at))
    .bind::<Nullable<SqlUuid>, _>(to.map(|(_, id)| id))
    .execute(conn)
    .await
    .map(|n| n > 0)
}

/// Takes the namespace's reconciliation lease for `lease_ms` when no one
/// holds it. Returns whether the caller holds it now.
pub async fn take_reconcile_lease(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    lease_ms: i64,
) -> diesel::QueryResult<bool> {
    diesel::sql_query(
        "UPDATE outbox_redis_epoch
         SET reconcile_lease_until = clock_timestamp() + make_interval(secs => $2 / 1000.0)
         WHERE namespace = $1
           AND (reconcile_lease_until IS NULL OR reconcile_lease_until < clock_timestamp())",
    )
    .bind::<Text, _>(namespace)
    .bind::<BigInt, _>(lease_ms)
    .execute(conn)
    .await
    .map(|n| n > 0)
}

/// Extends the namespace's reconciliation lease held by the caller.
pub async fn renew_reconcile_lease(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    lease_ms: i64,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "UPDATE outbox_redis_epoch
         SET reconcile_lease_until = clock_timestamp() + make_interval(secs => $2 / 1000.0)
         WHERE namespace = $1",
    )
    .bind::<Text, _>(namespace)
    .bind::<BigInt, _>(lease_ms)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Gives the namespace's reconciliation lease back.
pub async fn release_reconcile_lease(
    conn: &mut AsyncPgConnection,
    namespace: &str,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "UPDATE outbox_redis_epoch SET reconcile_lease_until = NULL WHERE namespace = $1",
    )
    .bind::<Text, _>(namespace)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Up to `limit` DONE rows of `queue` after the cursor `(processed_at, id)`,
/// in hand-off order (the index `outbox_event_done_queue_idx`).
pub async fn done_rows_after(
    conn: &mut AsyncPgConnection,
    queue: &str,
    after: (DateTime<Utc>, Uuid),
    limit: usize,
) -> diesel::QueryResult<Vec<OutboxEvent>> {
    diesel::sql_query(
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
    .await
}

/// As [`done_rows_after`], only rows handed off before `before`: the
/// safe-point scan, which cannot move a safe point past `before` whatever
/// it finds later, reads no further.
pub async fn done_rows_between(
    conn: &mut AsyncPgConnection,
    queue: &str,
    after: (DateTime<Utc>, Uuid),
    before: DateTime<Utc>,
    limit: usize,
) -> diesel::QueryResult<Vec<OutboxEvent>> {
    diesel::sql_query(
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
    .await
}

/// The earliest hand-off (`processed_at`) at or after `from` among the
/// `DONE` rows of `queue` whose ids are in `event_ids`; `None` when there
/// is none.
pub async fn first_handed_off(
    conn: &mut AsyncPgConnection,
    queue: &str,
    event_ids: &[Uuid],
    from: DateTime<Utc>,
) -> diesel::QueryResult<Option<DateTime<Utc>>> {
    #[derive(QueryableByName)]
    struct First {
        #[diesel(sql_type = Nullable<Timestamptz>)]
        at: Option<DateTime<Utc>>,
    }
    if event_ids.is_empty() {
        return Ok(None);
    }
    diesel::sql_query(
        "SELECT min(processed_at) AS at FROM outbox_event
         WHERE id = ANY($1) AND status = 'DONE' AND target_queue = $2 AND processed_at >= $3",
    )
    .bind::<Array<SqlUuid>, _>(event_ids)
    .bind::<Text, _>(queue)
    .bind::<Timestamptz, _>(from)
    .get_result::<First>(conn)
    .await
    .map(|first| first.at)
}

/// Of `event_ids`, those that have a row in `table` (one row per event,
/// keyed by the event id): events whose handler already wrote what it
/// writes.
pub async fn events_with_rows(
    conn: &mut AsyncPgConnection,
    table: RowTable,
    event_ids: &[Uuid],
) -> diesel::QueryResult<Vec<Uuid>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    // Both names passed `RowTable::parse` (lower-case letters, digits and
    // underscores only) and are quoted besides.
    let sql = format!(
        "SELECT \"{column}\" AS id FROM \"{table}\" WHERE \"{column}\" = ANY($1)",
        column = table.column(),
        table = table.table(),
    );
    diesel::sql_query(sql)
        .bind::<Array<SqlUuid>, _>(event_ids)
        .load::<IdRow>(conn)
        .await
        .map(|rows| rows.into_iter().map(|row| row.id).collect())
}

/// A table whose row is the whole effect of a handler, one per event,
/// found by the event id in one of its columns (`audit_log.outbox_event_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowTable {
    table: &'static str,
    column: &'static str,
}

impl RowTable {
    /// The column that holds the event id in a table whose rows are one
    /// per event.
    pub const EVENT_ID_COLUMN: &'static str = "outbox_event_id";

    /// Reads `table.outbox_event_id` (as a subscriber description records
    /// it): a table whose rows are one per event, keyed by the event id.
    /// `None` for any other column, or for names that are not plain
    /// lower-case SQL identifiers.
    ///
    /// ```
    /// use outbox_dispatch::db::RowTable;
    /// let audit = RowTable::parse("audit_log.outbox_event_id").unwrap();
    /// assert_eq!((audit.table(), audit.column()), ("audit_log", "outbox_event_id"));
    /// assert_eq!(RowTable::parse("workflow_execution.trigger_event_id"), None);
    /// assert_eq!(RowTable::parse("idempotency store"), None);
    /// assert_eq!(RowTable::parse("a\"; DROP TABLE x; --.outbox_event_id"), None);
    /// ```
    #[must_use]
    pub fn parse(recorded_in: &'static str) -> Option<Self> {
        let (table, column) = recorded_in.rsplit_once('.')?;
        let plain = |name: &str| {
            name.chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        (column == Self::EVENT_ID_COLUMN && plain(table)).then_some(Self { table, column })
    }

    /// The table (`audit_log`).
    #[must_use]
    pub fn table(&self) -> &'static str {
        self.table
    }

    /// The column holding the event id (`outbox_event_id`).
    #[must_use]
    pub fn column(&self) -> &'static str {
        self.column
    }
}

/// An enabled plugin hook subscription.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct HookSubscription {
    /// The subscription.
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    /// Its tenant.
    #[diesel(sql_type = Text)]
    pub tenant_id: String,
    /// The hook (`workflow.executed`).
    #[diesel(sql_type = Text)]
    pub hook: String,
    /// When it was created: a fan-out before that did not include it.
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
}

/// The enabled plugin hook subscriptions of `tenants`.
pub async fn hook_subscriptions(
    conn: &mut AsyncPgConnection,
    tenants: &[String],
) -> diesel::QueryResult<Vec<HookSubscription>> {
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    diesel::sql_query(
        "SELECT id, tenant_id, hook, created_at FROM plugin_hook_subscription
         WHERE enabled AND tenant_id = ANY($1)",
    )
    .bind::<Array<Text>, _>(tenants)
    .load(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::RowTable;

    // The same cases as `RowTable::parse`'s doctest, as a unit test: a
    // mutation run does not run doctests, and a `||` for the `&&` there let
    // any name ending in `.outbox_event_id`, an SQL injection among them,
    // into the statements the table name is pasted into.
    #[test]
    fn only_a_plain_table_with_the_event_id_column_is_a_row_table() {
        let audit = RowTable::parse("audit_log.outbox_event_id").unwrap();
        assert_eq!(
            (audit.table(), audit.column()),
            ("audit_log", "outbox_event_id")
        );
        assert!(RowTable::parse("_t2.outbox_event_id").is_some());
        for refused in [
            "workflow_execution.trigger_event_id",
            "idempotency store",
            "a\"; DROP TABLE x; --.outbox_event_id",
            "Audit.outbox_event_id",
            "2fa.outbox_event_id",
            ".outbox_event_id",
        ] {
            assert_eq!(RowTable::parse(refused), None, "{refused}");
        }
    }
}
