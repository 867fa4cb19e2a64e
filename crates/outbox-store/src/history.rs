//! The operator's and the application's changes of state, each with its
//! history row in `outbox_event_requeue`: requeue (and replay of DONE
//! rows), cancel, and the reschedule of a pending row.
//!
//! # Transactions and locks
//!
//! Requeue is one transaction, cancel and reschedule one statement each:
//! each locks the rows that still have an allowed status (`FOR UPDATE`, so
//! a dispatcher's claim and a second operator wait for it), writes one
//! history row per locked row (with the status, retries, last error and
//! `scheduled_at` the row had), then changes them. A row whose status
//! changed since the caller read it is left alone; if anything fails,
//! nothing changed. Cancel and reschedule run inside the caller's
//! transaction when given one (`outbox_publish::cancel`,
//! `outbox_publish::reschedule`), and then commit or roll back with it.
//! The statements stay raw SQL: the history row is an `INSERT … SELECT` of
//! the row's own values.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, Bool, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::{NOTIFY_CHANNEL, OutboxStatus};
use tracing::instrument;
use uuid::Uuid;

use crate::{EventKey, Result, StoreError};

/// Who asks for a change of state, and why: kept in each history row.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    /// The rows.
    pub ids: &'a [Uuid],
    /// Only rows with one of these statuses change (the caller's policy).
    pub allowed: &'a [OutboxStatus],
    /// Why (the operator's `--reason`).
    pub reason: &'a str,
    /// Who, when known.
    pub requested_by: Option<&'a str>,
}

impl Change<'_> {
    pub(crate) fn allowed(&self) -> Vec<&'static str> {
        self.allowed.iter().map(|s| s.as_str()).collect()
    }
}

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Bool)]
    done: bool,
}

/// What [`requeue`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requeued {
    /// The rows requeued.
    pub ids: Vec<Uuid>,
    /// Of those, the DONE rows that started a new delivery generation.
    pub replayed: usize,
}

/// Requeues the rows of `change` in one transaction: each row goes back to
/// PENDING with retries 0, due now, no lease, no processed_at, no
/// failed_at, no last_error, no target_queue, no unrouted_since; one history row per
/// requeued row; and a NOTIFY that wakes the dispatchers.
///
/// A replayed (DONE) row starts a new delivery generation (`generation + 1`,
/// recorded in its history row). A CANCELLED row with an ordering key
/// its key has moved past takes the key's next position (the table's
/// trigger does it), so that it runs after the key's events published
/// before the requeue; one the key has not reached keeps its place.
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
#[instrument(level = "debug", skip_all, fields(events = change.ids.len()), err(level = "debug"))]
pub async fn requeue(conn: &mut AsyncPgConnection, change: Change<'_>) -> Result<Requeued> {
    let allowed = change.allowed();
    conn.transaction::<_, StoreError, _>(async |conn| {
        // The ordering keys of the rows first, in a fixed order: a
        // requeued CANCELLED event's trigger takes its key's row after the
        // event's, while a worker's advance takes the key's row and then
        // the next event's; locked up front, they cannot deadlock.
        diesel::sql_query(
            "SELECT 1 FROM outbox_ordering_key
             WHERE ordering_key IN (SELECT ordering_key FROM outbox_event
                                    WHERE id = ANY($1) AND status = 'CANCELLED')
             ORDER BY ordering_key FOR UPDATE",
        )
        .bind::<Array<SqlUuid>, _>(change.ids)
        .execute(conn)
        .await?;
        let locked: Vec<Locked> = diesel::sql_query(
            "SELECT id, status = 'DONE' AS done FROM outbox_event
             WHERE id = ANY($1) AND status = ANY($2) FOR UPDATE",
        )
        .bind::<Array<SqlUuid>, _>(change.ids)
        .bind::<Array<Text>, _>(&allowed)
        .load(conn)
        .await?;
        let locked_ids: Vec<Uuid> = locked.iter().map(|row| row.id).collect();
        diesel::sql_query(
            "INSERT INTO outbox_event_requeue
                 (outbox_event_id, reason, requested_by, previous_status, previous_retries,
                  previous_last_error, previous_scheduled_at, replay, generation)
             SELECT id, $2, $3, status, retries, last_error, scheduled_at, status = 'DONE',
                    CASE WHEN status = 'DONE' THEN generation + 1 END
             FROM outbox_event WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
        .bind::<Text, _>(change.reason)
        .bind::<Nullable<Text>, _>(change.requested_by)
        .execute(conn)
        .await?;
        // CANCELLED events with an ordering key one at a time, in their
        // key's order: one its key has moved past takes the key's next
        // position as it goes back to PENDING (the table's trigger), so
        // several of one key come back in the order they had.
        #[derive(QueryableByName)]
        struct Id {
            #[diesel(sql_type = SqlUuid)]
            id: Uuid,
        }
        let ordered: Vec<Id> = diesel::sql_query(
            "SELECT id FROM outbox_event
             WHERE id = ANY($1) AND status = 'CANCELLED' AND ordering_key IS NOT NULL
             ORDER BY ordering_key, ordering_position",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
        .load(conn)
        .await?;
        for row in &ordered {
            diesel::sql_query(REQUEUE_ROWS_SQL)
                .bind::<Array<SqlUuid>, _>(vec![row.id])
                .execute(conn)
                .await?;
        }
        let rest: Vec<Uuid> = locked_ids
            .iter()
            .copied()
            .filter(|id| !ordered.iter().any(|row| row.id == *id))
            .collect();
        diesel::sql_query(REQUEUE_ROWS_SQL)
            .bind::<Array<SqlUuid>, _>(&rest)
            .execute(conn)
            .await?;
        diesel::sql_query("SELECT pg_notify($1, 'requeue')")
            .bind::<Text, _>(NOTIFY_CHANNEL)
            .execute(conn)
            .await?;
        Ok(Requeued {
            replayed: locked.iter().filter(|row| row.done).count(),
            ids: locked_ids,
        })
    })
    .await
}

/// What a requeue sets on the rows `$1`.
const REQUEUE_ROWS_SQL: &str = "UPDATE outbox_event
     SET status = 'PENDING', retries = 0, scheduled_at = now(), locked_until = NULL,
         processed_at = NULL, failed_at = NULL, last_error = NULL, target_queue = NULL,
         unrouted_since = NULL,
         generation = generation + CASE WHEN status = 'DONE' THEN 1 ELSE 0 END
     WHERE id = ANY($1)";

/// A change of state with its history row, as one statement: it locks the
/// rows found (`$1` ids or `$2` dispatch keys) whose status is one of `$3`
/// (`FOR UPDATE`), writes one history row each (`action`, the reason and
/// requested-by parameters named, and the status, retries, last error and
/// `scheduled_at` the row had), applies `set` to them, and returns every
/// row found as `(id, status, changed)`: its status when locked (before the
/// change) and whether it changed. Only the rows with an allowed status
/// are locked (a
/// dispatcher's hand-off of another row found never waits for the
/// caller's transaction). A row whose status changed to one not allowed
/// since the statement's snapshot (a dispatcher claimed it meanwhile) is
/// left alone, gets no history row, and comes back with the status of the
/// snapshot: [`cancel_event`] and [`reschedule_event`] read its status
/// again, and run the statement again when it has become one they may
/// change (a dispatcher's retry put it back to PENDING).
macro_rules! change_with_history_sql {
    (reason: $reason:literal, requested_by: $by:literal, action: $action:literal, set: $set:literal) => {
        concat!(
            "WITH found AS (
         SELECT id, status FROM outbox_event
         WHERE id = ANY($1) OR dispatch_key = ANY($2)
     ), target AS (
         SELECT id, status, retries, last_error, scheduled_at FROM outbox_event
         WHERE id IN (SELECT id FROM found) AND status = ANY($3)
         FOR UPDATE
     ), entry AS (
         INSERT INTO outbox_event_requeue
             (outbox_event_id, reason, requested_by, previous_status, previous_retries,
              previous_last_error, previous_scheduled_at, action)
         SELECT id, ",
            $reason,
            ", ",
            $by,
            ", status, retries, last_error, scheduled_at, '",
            $action,
            "' FROM target
     ), changed AS (
         UPDATE outbox_event e SET ",
            $set,
            "
         FROM target WHERE e.id = target.id
         RETURNING e.id
     )
     SELECT found.id, COALESCE(target.status, found.status) AS status,
            changed.id IS NOT NULL AS changed
     FROM found
     LEFT JOIN target ON target.id = found.id
     LEFT JOIN changed ON changed.id = found.id"
        )
    };
}

/// The cancel of some rows as SQL text, one statement: it locks the rows
/// found (by id or by dispatch key) whose status is allowed (`FOR UPDATE`),
/// writes one history row each (action `cancel`, with the status, retries,
/// last error and `scheduled_at` the row had), sets them CANCELLED
/// without a lease, and returns every row found with its status and
/// whether it was cancelled. A row whose status changed to one not allowed
/// since the statement's snapshot is left alone, with its new status.
///
/// Parameters, in order: `$1` uuid[] (ids), `$2` text[] (dispatch keys),
/// `$3` text[] (the allowed statuses), `$4` text (reason), `$5` text or
/// NULL (requested by). Returns `(id uuid, status text, changed bool)`.
pub const CANCEL_SQL: &str = change_with_history_sql!(
    reason: "$4",
    requested_by: "$5",
    action: "cancel",
    set: "status = 'CANCELLED', locked_until = NULL"
);

/// The reschedule of one row as SQL text, one statement, built as
/// [`CANCEL_SQL`]: it locks the row found (by id or by dispatch key) if its
/// status is allowed (`FOR UPDATE`), writes its history row (action
/// `reschedule`, with the status, retries, last error and `scheduled_at`
/// the row had), sets its `scheduled_at` to `$4`, and returns the row found
/// with its status and whether it changed. A row whose status changed to
/// one not allowed since the statement's snapshot is left alone, with its
/// new status, and gets no history row.
///
/// Parameters, in order: `$1` uuid[] (ids), `$2` text[] (dispatch keys),
/// `$3` text[] (the allowed statuses), `$4` timestamptz (the new due
/// time), `$5` text (reason), `$6` text or NULL (requested by). Returns
/// `(id uuid, status text, changed bool)`.
pub const RESCHEDULE_SQL: &str = change_with_history_sql!(
    reason: "$5",
    requested_by: "$6",
    action: "reschedule",
    set: "scheduled_at = $4"
);

/// A row a cancel or a reschedule found, and what it did to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct Found {
    /// The row.
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    /// Its status before the statement changed it; for a row a
    /// concurrent change took first (a dispatcher's claim), the status
    /// that change left.
    #[diesel(sql_type = Text)]
    pub status: OutboxStatus,
    /// Whether the statement changed it (its status was allowed).
    #[diesel(sql_type = Bool)]
    pub changed: bool,
}

/// The ids and dispatch keys a statement looks for: what `key` finds.
pub(crate) fn targets(key: EventKey<'_>) -> (Vec<Uuid>, Vec<&str>) {
    match key {
        EventKey::Id(id) => (vec![id], Vec::new()),
        EventKey::DispatchKey(key) => (Vec::new(), vec![key]),
    }
}

/// Cancels the rows of `change` with one statement ([`CANCEL_SQL`]), each
/// with its history entry (action `cancel`): status CANCELLED, no lease.
/// Returns the ids cancelled.
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
#[instrument(level = "debug", skip_all, fields(events = change.ids.len()), err(level = "debug"))]
pub async fn cancel(conn: &mut AsyncPgConnection, change: Change<'_>) -> Result<Vec<Uuid>> {
    let found = run_cancel(conn, change.ids, &[], change).await?;
    Ok(found
        .into_iter()
        .filter(|row| row.changed)
        .map(|row| row.id)
        .collect())
}

/// What [`cancel_event`] cancels: one row, by id or by dispatch key.
#[derive(Debug, Clone, Copy)]
pub struct CancelEvent<'a> {
    /// The row.
    pub key: EventKey<'a>,
    /// Only a row with one of these statuses changes (the caller's policy).
    pub allowed: &'a [OutboxStatus],
    /// Why, kept in the history row.
    pub reason: &'a str,
    /// Who, when known.
    pub requested_by: Option<&'a str>,
}

/// Cancels the one row `cancel.key` finds, as [`cancel`] does (the same
/// statement, the same history entry), if its status is allowed. Returns
/// the row found, its status and whether it was cancelled; `None` when no
/// row has the key. Inside the caller's transaction, it commits or rolls
/// back with it.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn cancel_event(
    conn: &mut AsyncPgConnection,
    cancel: CancelEvent<'_>,
) -> Result<Option<Found>> {
    let (ids, keys) = targets(cancel.key);
    let change = Change {
        ids: &ids,
        allowed: cancel.allowed,
        reason: cancel.reason,
        requested_by: cancel.requested_by,
    };
    let mut found = None;
    for _ in 0..CHANGE_ATTEMPTS {
        let answer = run_cancel(conn, &ids, &keys, change).await?.pop();
        found = settled(conn, answer).await?;
        if !changed_under_it(found.as_ref(), cancel.allowed) {
            break;
        }
    }
    Ok(found)
}

/// How many times [`cancel_event`] and [`reschedule_event`] run their
/// statement while the row keeps changing under it to a status they may
/// change.
pub(crate) const CHANGE_ATTEMPTS: usize = 3;

/// Whether the statement left `found` alone although its status, read
/// again, is one it may change: a concurrent change put it there while
/// the statement ran, and running it again changes the row.
pub(crate) fn changed_under_it(found: Option<&Found>, allowed: &[OutboxStatus]) -> bool {
    found.is_some_and(|found| !found.changed && allowed.contains(&found.status))
}

/// `found` with its status read again when the statement left it alone:
/// a concurrent change (a dispatcher's claim) may have come first, and the
/// caller is told the status that change left, not the one the
/// statement's snapshot held. A new statement sees what committed since
/// (read committed).
async fn settled(conn: &mut AsyncPgConnection, found: Option<Found>) -> Result<Option<Found>> {
    #[derive(QueryableByName)]
    struct Now {
        #[diesel(sql_type = Text)]
        status: OutboxStatus,
    }
    let Some(found) = found else {
        return Ok(None);
    };
    if found.changed {
        return Ok(Some(found));
    }
    let now: Vec<Now> =
        diesel::sql_query("SELECT status::text AS status FROM outbox_event WHERE id = $1")
            .bind::<SqlUuid, _>(found.id)
            .load(conn)
            .await?;
    Ok(Some(Found {
        status: now
            .as_slice()
            .first()
            .map_or(found.status, |row| row.status),
        ..found
    }))
}

/// [`CANCEL_SQL`] for the rows with `ids` or `keys`.
async fn run_cancel(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
    keys: &[&str],
    change: Change<'_>,
) -> Result<Vec<Found>> {
    Ok(diesel::sql_query(CANCEL_SQL)
        .bind::<Array<SqlUuid>, _>(ids)
        .bind::<Array<Text>, _>(keys)
        .bind::<Array<Text>, _>(change.allowed())
        .bind::<Text, _>(change.reason)
        .bind::<Nullable<Text>, _>(change.requested_by)
        .load(conn)
        .await?)
}

/// What [`reschedule_event`] moves: one row, by id or by dispatch key, and
/// where to.
#[derive(Debug, Clone, Copy)]
pub struct RescheduleEvent<'a> {
    /// The row.
    pub key: EventKey<'a>,
    /// Only a row with one of these statuses changes (the caller's policy).
    pub allowed: &'a [OutboxStatus],
    /// The row's new `scheduled_at`.
    pub at: DateTime<Utc>,
    /// Why, kept in the history row.
    pub reason: &'a str,
    /// Who, when known.
    pub requested_by: Option<&'a str>,
}

/// Sets the `scheduled_at` of the one row `reschedule.key` finds to
/// `reschedule.at`, if its status is allowed, with its history entry
/// (action `reschedule`, the due time it had in `previous_scheduled_at`):
/// one statement, [`RESCHEDULE_SQL`]. Returns the row found, its status
/// and whether it changed; `None` when no row has the key. Inside the
/// caller's transaction, it commits or rolls back with it.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn reschedule_event(
    conn: &mut AsyncPgConnection,
    reschedule: RescheduleEvent<'_>,
) -> Result<Option<Found>> {
    let (ids, keys) = targets(reschedule.key);
    let allowed: Vec<&str> = reschedule.allowed.iter().map(|s| s.as_str()).collect();
    let mut found = None;
    for _ in 0..CHANGE_ATTEMPTS {
        let mut answer: Vec<Found> = diesel::sql_query(RESCHEDULE_SQL)
            .bind::<Array<SqlUuid>, _>(&ids)
            .bind::<Array<Text>, _>(&keys)
            .bind::<Array<Text>, _>(&allowed)
            .bind::<Timestamptz, _>(reschedule.at)
            .bind::<Text, _>(reschedule.reason)
            .bind::<Nullable<Text>, _>(reschedule.requested_by)
            .load(conn)
            .await?;
        found = settled(conn, answer.pop()).await?;
        if !changed_under_it(found.as_ref(), reschedule.allowed) {
            break;
        }
    }
    Ok(found)
}

/// Dead jobs put back on their queue (`outbox retry-dead`, the console's
/// dead jobs page), for [`record_dead_jobs_put_back`].
#[derive(Debug, Clone, Copy)]
pub struct DeadJobsPutBack<'a> {
    /// The queue they went back on.
    pub queue: &'a str,
    /// Each job put back: the event it belongs to and its task id.
    pub jobs: &'a [(Uuid, &'a str)],
    /// Why, kept in each history row.
    pub reason: &'a str,
    /// Who, when known.
    pub requested_by: Option<&'a str>,
}

/// What the history keeps as the previous status of an event whose row
/// was gone (removed by retention) when one of its dead jobs went back.
pub const REMOVED_STATUS: &str = "REMOVED";

/// Records, in the history of each job's event, that its dead job went
/// back on the queue (action `retry_dead`, with the queue and the task id,
/// and the status, retries, last error and due time the row had; the row
/// itself does not change). An event whose row retention removed gets its
/// entry too, with previous status [`REMOVED_STATUS`]: the history outlives
/// the rows. One statement; returns the number of entries written.
///
/// Call it with the jobs Redis actually put back
/// (`outbox_queue::retry_dead` returns them).
///
/// # Example
///
/// ```no_run
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// use outbox_store::{DeadJobsPutBack, record_dead_jobs_put_back};
///
/// let event = uuid::Uuid::now_v7();
/// let task = format!("outbox:{event}");
/// let written = record_dead_jobs_put_back(
///     conn,
///     DeadJobsPutBack {
///         queue: "outbox.webhook",
///         jobs: &[(event, task.as_str())],
///         reason: "the receiver is back",
///         requested_by: Some("ana"),
///     },
/// )
/// .await?;
/// assert_eq!(written, 1);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// When Postgres fails (nothing is recorded then).
#[instrument(level = "debug", skip_all, fields(queue = put_back.queue, jobs = put_back.jobs.len()), err(level = "debug"))]
pub async fn record_dead_jobs_put_back(
    conn: &mut AsyncPgConnection,
    put_back: DeadJobsPutBack<'_>,
) -> Result<usize> {
    if put_back.jobs.is_empty() {
        return Ok(0);
    }
    let (events, tasks): (Vec<Uuid>, Vec<&str>) = put_back.jobs.iter().copied().unzip();
    Ok(diesel::sql_query(RECORD_DEAD_JOBS_SQL)
        .bind::<Array<SqlUuid>, _>(&events)
        .bind::<Array<Text>, _>(&tasks)
        .bind::<Text, _>(put_back.reason)
        .bind::<Nullable<Text>, _>(put_back.requested_by)
        .bind::<Text, _>(put_back.queue)
        .bind::<Text, _>(REMOVED_STATUS)
        .execute(conn)
        .await?)
}

/// The statement of [`record_dead_jobs_put_back`]: one history row per
/// (event id `$1[i]`, task id `$2[i]`), reason `$3`, who `$4`, queue `$5`,
/// the previous status `$6` for a row that is gone.
const RECORD_DEAD_JOBS_SQL: &str = "INSERT INTO outbox_event_requeue
         (outbox_event_id, reason, requested_by, previous_status, previous_retries,
          previous_last_error, previous_scheduled_at, action, queue, task_id)
     SELECT j.event_id, $3, $4, COALESCE(e.status, $6), COALESCE(e.retries, 0),
            e.last_error, e.scheduled_at, 'retry_dead', $5, j.task_id
     FROM unnest($1::uuid[], $2::text[]) AS j(event_id, task_id)
     LEFT JOIN outbox_event e ON e.id = j.event_id";
