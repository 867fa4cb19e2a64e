//! The dispatcher's statements: the claim, and the fenced outcome updates
//! (DONE, retry with backoff, FAILED, released).
//!
//! Outcome updates are *fenced*: they match a row only while it is still
//! `PROCESSING` under the lease (`locked_until`) that this dispatcher's claim
//! set. A dispatcher whose lease expired and whose row was re-claimed by
//! another cannot change the row afterwards; its update matches nothing.
//!
//! # Transactions and locks
//!
//! The claim and each outcome update are single autocommit statements; row
//! locks last for the statement only, and the lease keeps other dispatchers
//! away in between.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{
    Array, BigInt, Bool, Int4, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::future::try_join_all;
use outbox_model::{OutboxEvent, prepared};
use serde_json::{Map, Value};
use tracing::instrument;
use uuid::Uuid;

use crate::Result;

/// The instant a row becomes claimable (a `PENDING` row from its
/// `scheduled_at`, a `PROCESSING` one from the end of its lease): the
/// expression `outbox_event_claimable_idx` is built on, after the priority.
macro_rules! due {
    () => {
        "(CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END)"
    };
}

/// The due rows of one priority level, oldest first, at most `$1`, locked
/// (`SKIP LOCKED`): one range of the claim index, `priority = <level> AND
/// due <= now()`, walked in due order. A level with no due row costs one
/// index descent; rows scheduled for later are never read.
///
/// `FOR UPDATE` is not allowed in a branch of a `UNION` itself, so each
/// level is a subquery in `FROM`.
///
/// `NOT ordering_blocked` repeats the rest of the index's predicate: an
/// ordered event waiting for an earlier one of its key is not in the index,
/// and never claimed.
macro_rules! level {
    ($priority:literal) => {
        concat!(
            "SELECT id, created_at FROM (
        SELECT id, created_at FROM outbox_event
        WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked
          AND priority = ",
            $priority,
            "
          AND ",
            due!(),
            " <= now()
        ORDER BY ",
            due!(),
            "
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ) AS p"
        )
    };
}

/// `WITH due AS (…)`: the ids of up to `$1` claimable rows, level by level,
/// highest first.
// One branch per level of `outbox_model::Priority::ALL`, in that order
// (a unit test holds the two together).
macro_rules! due_ids {
    () => {
        concat!(
            "WITH due AS (
    ",
            level!("2"),
            "
    UNION ALL
    ",
            level!("1"),
            "
    UNION ALL
    ",
            level!("0"),
            "
    UNION ALL
    ",
            level!("-1"),
            "
    UNION ALL
    ",
            level!("-2"),
            "
    LIMIT $1
)"
        )
    };
}

/// Claims up to `limit` claimable rows in one round trip: `PENDING` rows whose
/// `scheduled_at` has passed and `PROCESSING` rows whose lease expired (a
/// dispatcher died holding them), the highest [`Priority`] first and, within
/// a priority, oldest first. They become `PROCESSING` with a fresh lease of
/// `lease_ms`. `SKIP LOCKED` lets concurrent dispatchers claim disjoint sets
/// without waiting on each other.
///
/// The priorities are read one level at a time, highest first (a `UNION ALL`
/// of one index range scan per level, see `level!`), and the outer `LIMIT`
/// stops reading, and locking, as soon as the batch is full: a batch that
/// the highest levels fill never touches the lower ones. Each level walks the
/// partial index `outbox_event_claimable_idx` on `(priority, due)`, over due
/// rows only.
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
///
/// [`Priority`]: outbox_model::Priority
pub const CLAIM_SQL: &str = concat!(
    due_ids!(),
    "
UPDATE outbox_event e
SET status = 'PROCESSING',
    locked_until = now() + make_interval(secs => $2 / 1000.0)
WHERE e.id = ANY(ARRAY(SELECT id FROM due))
  AND e.created_at >= (SELECT min(created_at) FROM due)
  AND e.created_at <= (SELECT max(created_at) FROM due)
RETURNING e.*"
);

/// The claim's choice of rows as a `WITH due AS (…)` clause, for a
/// statement that follows it with its own use of `due` (the bench's
/// SQL-only baseline): the up to `$1` claimable rows of [`CLAIM_SQL`],
/// highest priority first, locked.
pub const CLAIM_DUE_IDS_SQL: &str = due_ids!();

/// Claims rows; see [`CLAIM_SQL`]. The result is sorted by `created_at`
/// (Postgres does not order `RETURNING`).
#[instrument(level = "debug", skip(conn), fields(claimed), err(level = "debug"))]
pub async fn claim(
    conn: &mut AsyncPgConnection,
    limit: u32,
    lease_ms: i64,
) -> Result<Vec<OutboxEvent>> {
    let mut rows: Vec<OutboxEvent> = prepared(CLAIM_SQL)
        .bind::<BigInt, _>(i64::from(limit))
        .bind::<BigInt, _>(lease_ms)
        .load(conn)
        .await?;
    rows.sort_by_key(|row| (row.created_at, row.id));
    tracing::Span::current().record("claimed", rows.len());
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
    /// Its `created_at`: the outcome statements bound the rows' creation
    /// times, so that on a partitioned table they read only the partitions
    /// that hold them.
    pub created_at: DateTime<Utc>,
}

impl Lease {
    /// The lease of a claimed row (`None` when the row carries no lease).
    #[must_use]
    pub fn of(event: &OutboxEvent) -> Option<Self> {
        event.locked_until.map(|locked_until| Self {
            id: event.id,
            locked_until,
            created_at: event.created_at,
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
///
/// `created_at` between the two parameters named (the least and the greatest
/// of the rows') adds nothing on one table; on a partitioned one it lets
/// Postgres read only the partitions that hold the rows, instead of
/// looking every id up in every partition's primary key.
macro_rules! fenced {
    ($from:literal, $to:literal) => {
        concat!(
            "WHERE id = ANY($1) AND created_at >= ",
            $from,
            " AND created_at <= ",
            $to,
            "
           AND (status = 'PROCESSING') IS TRUE AND locked_until = $2
         RETURNING id"
        )
    };
}

/// Marks handed-off rows `DONE`; one statement per lease (a claim has one).
/// `$3` maps each id (as text) to its queue: a JSON object, whose keys
/// Postgres keeps sorted, so each row's queue is a binary search, not a scan
/// of a list. See [`mark_done`].
pub const DONE_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'DONE', processed_at = now(), locked_until = NULL,
         last_error = NULL, target_queue = $3 ->> id::text, unrouted_since = NULL
     ",
    fenced!("$4", "$5")
);

/// Puts rows back to `PENDING` after a failed hand-off; one statement per
/// lease, delay in milliseconds (`$3`), error (`$4`) and queue (`$5`). See
/// [`mark_retry`].
pub const RETRY_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'PENDING', retries = retries + 1, locked_until = NULL,
         scheduled_at = now() + make_interval(secs => $3 / 1000.0),
         last_error = $4, target_queue = $5, unrouted_since = NULL
     ",
    fenced!("$6", "$7")
);

/// Dead-letters rows; one statement per lease, retry increment (`$3`), error
/// (`$4`), queue (`$5`) and whether no route matched (`$6`: the row keeps or
/// gets its `unrouted_since`, so that a later route revives it). See
/// [`mark_failed`].
pub const FAILED_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'FAILED', retries = retries + $3, locked_until = NULL,
         last_error = $4, target_queue = $5, failed_at = now(),
         unrouted_since = CASE WHEN $6 THEN coalesce(unrouted_since, now()) END
     ",
    fenced!("$7", "$8")
);

/// Puts rows that no routing rule matches back to `PENDING` to wait for a
/// route: due again after `$3` milliseconds, retries unchanged, `$4` as the
/// last error, and `unrouted_since` stamped the first time. See
/// [`mark_waiting_for_route`].
pub const WAIT_FOR_ROUTE_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'PENDING', locked_until = NULL,
         scheduled_at = now() + make_interval(secs => $3 / 1000.0),
         last_error = $4, unrouted_since = coalesce(unrouted_since, now())
     ",
    fenced!("$5", "$6")
);

/// Gives rows back to `PENDING`, due at once; one statement per lease. See
/// [`release`].
pub const RELEASE_SQL: &str = concat!(
    "UPDATE outbox_event
     SET status = 'PENDING', locked_until = NULL
     ",
    fenced!("$3", "$4")
);

/// The rows of one outcome statement: their ids, and the least and the
/// greatest of their `created_at` (see `fenced!`).
#[derive(Debug, Default)]
struct Rows {
    ids: Vec<Uuid>,
    bounds: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

impl Rows {
    fn push(&mut self, lease: &Lease) {
        self.ids.push(lease.id);
        let at = lease.created_at;
        self.bounds = Some(match self.bounds {
            None => (at, at),
            Some((from, to)) => (from.min(at), to.max(at)),
        });
    }

    /// The bounds (a group always has a row).
    fn span(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        self.bounds
            .unwrap_or((DateTime::UNIX_EPOCH, DateTime::UNIX_EPOCH))
    }
}

/// Groups leases by the values their outcome statement binds besides the ids.
fn group<'l, K: Ord>(items: impl IntoIterator<Item = (K, &'l Lease)>) -> Vec<(K, Rows)> {
    let mut groups: BTreeMap<K, Rows> = BTreeMap::new();
    for (key, lease) in items {
        groups.entry(key).or_default().push(lease);
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
#[instrument(level = "debug", skip_all, fields(rows = done.len()), err(level = "debug"))]
pub async fn mark_done(
    conn: &mut AsyncPgConnection,
    done: &[(Lease, String)],
) -> Result<Vec<Uuid>> {
    /// The ids of one lease and the queue of each.
    type Batch = (Rows, Map<String, Value>);
    let mut groups: BTreeMap<DateTime<Utc>, Batch> = BTreeMap::new();
    for (lease, queue) in done {
        let (rows, queues) = groups.entry(lease.locked_until).or_default();
        rows.push(lease);
        queues.insert(lease.id.to_string(), Value::String(queue.clone()));
    }
    let conn: &AsyncPgConnection = conn;
    let statements = groups
        .into_iter()
        .map(|(lease, (rows, queues))| async move {
            let mut conn = conn;
            let (from, to) = rows.span();
            prepared(DONE_SQL)
                .bind::<Array<SqlUuid>, _>(rows.ids)
                .bind::<Timestamptz, _>(lease)
                .bind::<Jsonb, _>(Value::Object(queues))
                .bind::<Timestamptz, _>(from)
                .bind::<Timestamptz, _>(to)
                .load::<IdRow>(&mut conn)
                .await
        });
    Ok(try_join_all(statements).await.map(updated)?)
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
#[instrument(level = "debug", skip_all, fields(rows = retries.len()), err(level = "debug"))]
pub async fn mark_retry(conn: &mut AsyncPgConnection, retries: &[Retry]) -> Result<Vec<Uuid>> {
    let groups = group(retries.iter().map(|r| {
        let key = (
            r.lease.locked_until,
            r.delay_ms,
            r.error.clone(),
            r.queue.clone(),
        );
        (key, &r.lease)
    }));
    let conn: &AsyncPgConnection = conn;
    let statements = groups
        .into_iter()
        .map(|((lease, delay_ms, error, queue), rows)| async move {
            let mut conn = conn;
            let (from, to) = rows.span();
            prepared(RETRY_SQL)
                .bind::<Array<SqlUuid>, _>(rows.ids)
                .bind::<Timestamptz, _>(lease)
                .bind::<BigInt, _>(delay_ms)
                .bind::<Text, _>(error)
                .bind::<Text, _>(queue)
                .bind::<Timestamptz, _>(from)
                .bind::<Timestamptz, _>(to)
                .load::<IdRow>(&mut conn)
                .await
        });
    Ok(try_join_all(statements).await.map(updated)?)
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
    /// True when no routing rule matched: the row is marked `FAILED
    /// (unrouted)` and a dispatcher with a route for it revives it.
    pub unrouted: bool,
}

/// Moves rows to `FAILED`, stamping `failed_at = now()`: one [`FAILED_SQL`]
/// per lease, increment, error and queue, pipelined. This is the only
/// statement that dead-letters a row, whether unroutable or out of retries.
/// Returns the ids actually updated.
#[instrument(level = "debug", skip_all, fields(rows = failures.len()), err(level = "debug"))]
pub async fn mark_failed(conn: &mut AsyncPgConnection, failures: &[Failure]) -> Result<Vec<Uuid>> {
    let groups = group(failures.iter().map(|f| {
        let key = (
            f.lease.locked_until,
            f.retry_increment,
            f.error.clone(),
            f.queue.clone(),
            f.unrouted,
        );
        (key, &f.lease)
    }));
    let conn: &AsyncPgConnection = conn;
    let statements = groups.into_iter().map(
        |((lease, increment, error, queue, unrouted), rows)| async move {
            let mut conn = conn;
            let (from, to) = rows.span();
            prepared(FAILED_SQL)
                .bind::<Array<SqlUuid>, _>(rows.ids)
                .bind::<Timestamptz, _>(lease)
                .bind::<Int4, _>(increment)
                .bind::<Text, _>(error)
                .bind::<Nullable<Text>, _>(queue)
                .bind::<Bool, _>(unrouted)
                .bind::<Timestamptz, _>(from)
                .bind::<Timestamptz, _>(to)
                .load::<IdRow>(&mut conn)
                .await
        },
    );
    Ok(try_join_all(statements).await.map(updated)?)
}

/// A claimed row no routing rule matches, to wait for a route.
#[derive(Debug, Clone)]
pub struct WaitForRoute {
    /// The claimed row.
    pub lease: Lease,
    /// Delay before the row is due again, in milliseconds.
    pub delay_ms: i64,
    /// Why it waits (kept as the row's last error).
    pub error: String,
}

/// Puts rows that no route matches back to `PENDING` to wait for one (see
/// [`WAIT_FOR_ROUTE_SQL`]): one statement per lease, delay and error,
/// pipelined. Returns the ids actually updated.
#[instrument(level = "debug", skip_all, fields(rows = waits.len()), err(level = "debug"))]
pub async fn mark_waiting_for_route(
    conn: &mut AsyncPgConnection,
    waits: &[WaitForRoute],
) -> Result<Vec<Uuid>> {
    let groups = group(waits.iter().map(|w| {
        (
            (w.lease.locked_until, w.delay_ms, w.error.clone()),
            &w.lease,
        )
    }));
    let conn: &AsyncPgConnection = conn;
    let statements = groups
        .into_iter()
        .map(|((lease, delay_ms, error), rows)| async move {
            let mut conn = conn;
            let (from, to) = rows.span();
            prepared(WAIT_FOR_ROUTE_SQL)
                .bind::<Array<SqlUuid>, _>(rows.ids)
                .bind::<Timestamptz, _>(lease)
                .bind::<BigInt, _>(delay_ms)
                .bind::<Text, _>(error)
                .bind::<Timestamptz, _>(from)
                .bind::<Timestamptz, _>(to)
                .load::<IdRow>(&mut conn)
                .await
        });
    Ok(try_join_all(statements).await.map(updated)?)
}

/// Gives claimed rows back: `PENDING`, no lease, retries unchanged, due at
/// once (graceful stop): one [`RELEASE_SQL`] per lease. Returns the ids
/// actually released.
#[instrument(level = "debug", skip_all, fields(rows = leases.len()), err(level = "debug"))]
pub async fn release(conn: &mut AsyncPgConnection, leases: &[Lease]) -> Result<Vec<Uuid>> {
    let groups = group(leases.iter().map(|l| (l.locked_until, l)));
    let conn: &AsyncPgConnection = conn;
    let statements = groups.into_iter().map(|(lease, rows)| async move {
        let mut conn = conn;
        let (from, to) = rows.span();
        prepared(RELEASE_SQL)
            .bind::<Array<SqlUuid>, _>(rows.ids)
            .bind::<Timestamptz, _>(lease)
            .bind::<Timestamptz, _>(from)
            .bind::<Timestamptz, _>(to)
            .load::<IdRow>(&mut conn)
            .await
    });
    Ok(try_join_all(statements).await.map(updated)?)
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How many `PENDING` rows are due now: the claim index's due range of
/// each priority level (the levels listed, so that the leading `priority`
/// column is one index descent per level rather than a walk of every entry,
/// rows scheduled for later included).
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn due_pending_count(conn: &mut AsyncPgConnection) -> Result<i64> {
    let row: CountRow = diesel::sql_query(concat!(
        "SELECT count(*) AS n FROM outbox_event
         WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked
           AND priority IN (2, 1, 0, -1, -2)
           AND ",
        due!(),
        " <= now()
           AND status = 'PENDING'"
    ))
    .get_result(conn)
    .await?;
    Ok(row.n)
}

#[cfg(test)]
mod tests {
    use outbox_model::Priority;

    use super::CLAIM_SQL;

    #[test]
    fn the_claim_reads_every_priority_level_highest_first() {
        let positions: Vec<usize> = Priority::ALL
            .iter()
            .map(|level| {
                let branch = format!("AND priority = {level}\n");
                assert_eq!(CLAIM_SQL.matches(&branch).count(), 1, "{branch}");
                CLAIM_SQL.find(&branch).unwrap_or_default()
            })
            .collect();
        assert!(positions.is_sorted(), "levels out of order: {CLAIM_SQL}");
    }
}
