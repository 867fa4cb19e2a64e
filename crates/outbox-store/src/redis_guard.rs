//! The Redis guard's tables: the marker's epoch per namespace
//! (`outbox_redis_epoch`), each queue's safe point and pending
//! reconciliation (`outbox_redis_safe_point`), and the reconciliation lease.
//!
//! # Transactions and locks
//!
//! [`lock_namespace`] and [`try_lock_namespace`] take a transaction-scoped
//! advisory lock: call them inside the transaction whose checks they
//! serialise. Everything else is a
//! single statement.

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tracing::instrument;
use uuid::Uuid;

use crate::Result;

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
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn db_now(conn: &mut AsyncPgConnection) -> Result<DateTime<Utc>> {
    Ok(diesel::sql_query("SELECT now() AS now")
        .get_result::<NowRow>(conn)
        .await
        .map(|row| row.now)?)
}

#[derive(QueryableByName)]
struct OldestOpen {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    since: Option<DateTime<Utc>>,
}

/// When the oldest transaction still open that writes to `outbox_event`
/// (other than this connection's, among the sessions this role may see)
/// began; `None` when there is none.
///
/// A row's `processed_at` is the start of the transaction that marked it
/// `DONE` (`now()`), which may wait on a row lock and commit much later: the
/// Redis guard never moves a safe point past this instant, so a hand-off
/// committed after a check always lands after the safe point. Such a
/// transaction holds `ROW EXCLUSIVE` on `outbox_event` from its statement's
/// start, before it waits on any row; sessions that hold no such lock (a
/// dispatcher's wake-up gate waiting on its advisory lock, a reader) do not
/// count. Producers' transactions that wrote an event count while they
/// stay open. Sessions of other roles show their start only to a role with
/// `pg_read_all_stats`: the dispatchers of one namespace connect as one
/// role.
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// let now = outbox_store::db_now(conn).await?;
/// let lagging = now - chrono::Duration::seconds(5);
/// // A safe point may move no closer to now than this.
/// let bound = match outbox_store::oldest_open_transaction(conn).await? {
///     Some(since) => lagging.min(since),
///     None => lagging,
/// };
/// # let _ = bound;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn oldest_open_transaction(
    conn: &mut AsyncPgConnection,
) -> Result<Option<DateTime<Utc>>> {
    Ok(diesel::sql_query(
        "SELECT min(a.xact_start) AS since
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'relation' AND l.relation = 'outbox_event'::regclass
           AND l.mode = 'RowExclusiveLock'
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL",
    )
    .get_result::<OldestOpen>(conn)
    .await
    .map(|row| row.since)?)
}

/// Serialises the checks of one namespace until the transaction ends
/// (a transaction-scoped advisory lock, so a pooled connection never keeps it).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn lock_namespace(conn: &mut AsyncPgConnection, namespace: &str) -> Result<()> {
    Ok(diesel::sql_query(
        "SELECT pg_advisory_xact_lock(hashtextextended('outbox_redis_epoch:' || $1, 0))",
    )
    .bind::<Text, _>(namespace)
    .execute(conn)
    .await
    .map(|_| ())?)
}

#[derive(QueryableByName)]
struct Taken {
    #[diesel(sql_type = Bool)]
    taken: bool,
}

/// [`lock_namespace`] without waiting: whether the lock was free and is
/// now this transaction's. A check that waits in Postgres for another's
/// lock keeps its statement's snapshot open all that time, and with it
/// the oldest row version the server must keep visible: the claim index
/// entries of every row handed off meanwhile cannot be marked dead, and
/// each claim walks over them. When N processes start together their
/// checks queue one behind the other, so this cost grew with N
/// (docs/history/scaling-2026-12-07.md, the old "Why more processes
/// were slower"). Waiting outside
/// the transaction, between tries, holds no snapshot.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn try_lock_namespace(conn: &mut AsyncPgConnection, namespace: &str) -> Result<bool> {
    let row: Taken = diesel::sql_query(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox_redis_epoch:' || $1, 0)) AS taken",
    )
    .bind::<Text, _>(namespace)
    .get_result(conn)
    .await?;
    Ok(row.taken)
}

/// The remembered marker of `namespace`, if any.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn remembered_epoch(
    conn: &mut AsyncPgConnection,
    namespace: &str,
) -> Result<Option<EpochRow>> {
    Ok(diesel::sql_query(
        "SELECT epoch, run_id, checked_at FROM outbox_redis_epoch WHERE namespace = $1",
    )
    .bind::<Text, _>(namespace)
    .get_result::<EpochRow>(conn)
    .await
    .optional()?)
}

/// Remembers `epoch` seen in the server run `run_id`, checked now.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn save_epoch(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    epoch: Uuid,
    run_id: &str,
) -> Result<()> {
    Ok(diesel::sql_query(
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
    .map(|_| ())?)
}

/// Creates the safe point of every queue of `queues` that has none, at
/// `floor` (nothing is known before it).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn ensure_safe_points(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    queues: &[String],
    floor: DateTime<Utc>,
) -> Result<()> {
    Ok(diesel::sql_query(
        "INSERT INTO outbox_redis_safe_point (namespace, queue, drained_before)
         SELECT $1, q, $3 FROM unnest($2::text[]) AS q
         ON CONFLICT (namespace, queue) DO NOTHING",
    )
    .bind::<Text, _>(namespace)
    .bind::<Array<Text>, _>(queues)
    .bind::<Timestamptz, _>(floor)
    .execute(conn)
    .await
    .map(|_| ())?)
}

/// Every queue's safe point in `namespace`.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn safe_points(
    conn: &mut AsyncPgConnection,
    namespace: &str,
) -> Result<Vec<SafePointRow>> {
    Ok(diesel::sql_query(
        "SELECT queue, drained_before, pending_since, pending_after_id
         FROM outbox_redis_safe_point WHERE namespace = $1 ORDER BY queue",
    )
    .bind::<Text, _>(namespace)
    .load(conn)
    .await?)
}

/// After a loss: a reconciliation becomes due for every queue of
/// `namespace` from its safe point (never before `floor`). A queue whose
/// reconciliation is already due from an earlier point keeps that point;
/// one due from a later point starts again from the earlier one. Either
/// way it starts from the beginning of that instant (`pending_after_id`
/// cleared): what it pushed again before this loss went into the Redis
/// just lost. Returns the queues and where their reconciliation starts.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn mark_pending(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    floor: DateTime<Utc>,
) -> Result<Vec<SafePointRow>> {
    Ok(diesel::sql_query(
        "UPDATE outbox_redis_safe_point SET
             pending_after_id = NULL,
             pending_since = CASE
                 WHEN pending_since IS NOT NULL AND pending_since <= GREATEST(drained_before, $2)
                 THEN pending_since ELSE GREATEST(drained_before, $2) END
         WHERE namespace = $1
         RETURNING queue, drained_before, pending_since, pending_after_id",
    )
    .bind::<Text, _>(namespace)
    .bind::<Timestamptz, _>(floor)
    .load(conn)
    .await?)
}

/// Moves the safe point of `queue` forward to `mark` (never back), unless a
/// reconciliation of the queue is due or the marker's epoch is no longer
/// `epoch` (a loss was detected since the scan began): then it leaves it.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn advance_drained(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    queue: &str,
    epoch: Uuid,
    mark: DateTime<Utc>,
) -> Result<()> {
    Ok(diesel::sql_query(
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
    .map(|_| ())?)
}

/// Moves a queue's pending reconciliation from the cursor `from` to `to`
/// (`None`: done), if nothing else changed it meanwhile: the cursor still
/// stands at `from` and the namespace's remembered epoch is still `epoch`,
/// the one read before the batch. A loss noticed meanwhile saves a new
/// epoch, so it sets the reconciliation back even where it leaves the
/// cursor as it was (a first batch from the start of the window, whose
/// re-pushed jobs the second loss took too). Returns whether it moved.
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// // Before the batch: the epoch, then the cursor.
/// let Some(remembered) = outbox_store::remembered_epoch(conn, "").await? else {
///     return Ok(());
/// };
/// for point in outbox_store::safe_points(conn, "").await? {
///     let Some(since) = point.pending_since else { continue };
///     // ... push again what Redis lost from (since, pending_after_id) on;
///     // the batch ended at the end of the window here, so it is done.
///     let from = (since, point.pending_after_id);
///     if !outbox_store::advance_pending(conn, "", &point.queue, remembered.epoch, from, None).await? {
///         // A new loss set the reconciliation back: start it again.
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn advance_pending(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    queue: &str,
    epoch: Uuid,
    from: (DateTime<Utc>, Option<Uuid>),
    to: Option<(DateTime<Utc>, Uuid)>,
) -> Result<bool> {
    Ok(diesel::sql_query(
        "UPDATE outbox_redis_safe_point SET pending_since = $5, pending_after_id = $6
         WHERE namespace = $1 AND queue = $2
           AND pending_since = $3 AND pending_after_id IS NOT DISTINCT FROM $4
           AND EXISTS (SELECT 1 FROM outbox_redis_epoch e
                       WHERE e.namespace = $1 AND e.epoch = $7)",
    )
    .bind::<Text, _>(namespace)
    .bind::<Text, _>(queue)
    .bind::<Timestamptz, _>(from.0)
    .bind::<Nullable<SqlUuid>, _>(from.1)
    .bind::<Nullable<Timestamptz>, _>(to.map(|(at, _)| at))
    .bind::<Nullable<SqlUuid>, _>(to.map(|(_, id)| id))
    .bind::<SqlUuid, _>(epoch)
    .execute(conn)
    .await
    .map(|n| n > 0)?)
}

/// The namespace's reconciliation lease as one holder took it: its expiry,
/// which is also its fence. Renewing or giving it back only acts while the
/// row still holds this expiry, so a holder whose lease ran out (and was
/// taken by another) changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileLease {
    until: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct LeaseRow {
    #[diesel(sql_type = Timestamptz)]
    until: DateTime<Utc>,
}

/// Takes the namespace's reconciliation lease for `lease_ms` when no one
/// holds it. Returns the lease when the caller holds it now.
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// if let Some(mut lease) = outbox_store::take_reconcile_lease(conn, "", 120_000).await? {
///     // ... a batch of work, then:
///     if outbox_store::renew_reconcile_lease(conn, "", &mut lease, 120_000).await? {
///         // ... still the holder: go on.
///     }
///     outbox_store::release_reconcile_lease(conn, "", lease).await?;
/// }
/// # Ok(()) }
/// ```
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn take_reconcile_lease(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    lease_ms: i64,
) -> Result<Option<ReconcileLease>> {
    let taken: Option<LeaseRow> = diesel::sql_query(
        "UPDATE outbox_redis_epoch
         SET reconcile_lease_until = clock_timestamp() + make_interval(secs => $2 / 1000.0)
         WHERE namespace = $1
           AND (reconcile_lease_until IS NULL OR reconcile_lease_until < clock_timestamp())
         RETURNING reconcile_lease_until AS until",
    )
    .bind::<Text, _>(namespace)
    .bind::<BigInt, _>(lease_ms)
    .get_result(conn)
    .await
    .optional()?;
    Ok(taken.map(|row| ReconcileLease { until: row.until }))
}

/// Extends the namespace's reconciliation lease `lease` by `lease_ms` from
/// now. Returns false, changing nothing, when the caller no longer holds
/// it (it ran out and another holder took it): the caller stops.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn renew_reconcile_lease(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    lease: &mut ReconcileLease,
    lease_ms: i64,
) -> Result<bool> {
    let renewed: Option<LeaseRow> = diesel::sql_query(
        "UPDATE outbox_redis_epoch
         SET reconcile_lease_until = clock_timestamp() + make_interval(secs => $2 / 1000.0)
         WHERE namespace = $1 AND reconcile_lease_until = $3
         RETURNING reconcile_lease_until AS until",
    )
    .bind::<Text, _>(namespace)
    .bind::<BigInt, _>(lease_ms)
    .bind::<Timestamptz, _>(lease.until)
    .get_result(conn)
    .await
    .optional()?;
    Ok(match renewed {
        Some(row) => {
            lease.until = row.until;
            true
        }
        None => false,
    })
}

/// Gives the namespace's reconciliation lease `lease` back (nothing when
/// another holder has it now).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn release_reconcile_lease(
    conn: &mut AsyncPgConnection,
    namespace: &str,
    lease: ReconcileLease,
) -> Result<()> {
    Ok(diesel::sql_query(
        "UPDATE outbox_redis_epoch SET reconcile_lease_until = NULL
         WHERE namespace = $1 AND reconcile_lease_until = $2",
    )
    .bind::<Text, _>(namespace)
    .bind::<Timestamptz, _>(lease.until)
    .execute(conn)
    .await
    .map(|_| ())?)
}
