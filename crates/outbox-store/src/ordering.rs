//! Per-key ordered delivery (`outbox_event.ordering_key`): the statements
//! the worker runs around an ordered job's handler, and the operator's view
//! of held keys.
//!
//! The insert trigger numbers each ordered event within its key and blocks
//! it while an earlier event of the key is unfinished; the claim never
//! takes a blocked row (see [`crate::CLAIM_SQL`]). What moves a key on is
//! [`advance`]: the worker calls it once the handler of the event at the
//! key's head succeeded, and it unblocks the next event. [`hold`] records
//! why a key stopped when its head failed for good.
//!
//! # Transactions and locks
//!
//! [`advance`], [`hold`] and [`clear_hold`] are single statements that take
//! the key's row lock (`outbox_ordering_key`) for their transaction, as
//! the insert trigger does: a writer of the key and an advance of the key
//! wait for each other, so an event committed while the key advances is
//! never left blocked. [`skip_held`] is one transaction.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tracing::instrument;
use uuid::Uuid;

use crate::{Result, StoreError};

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

/// Records that the event at `position` of `key` is finished: the key's
/// `done_position` moves to it, a hold is lifted, and the next event of the
/// key (past cancelled ones) becomes claimable, waking the dispatchers.
/// Returns false, changing nothing, when the key is already past
/// `position` (a duplicate delivery, a replay).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn advance(conn: &mut AsyncPgConnection, key: &str, position: i64) -> Result<bool> {
    let row: Flag = diesel::sql_query("SELECT outbox_ordering_advance($1, $2) AS flag")
        .bind::<Text, _>(key)
        .bind::<BigInt, _>(position)
        .get_result(conn)
        .await?;
    Ok(row.flag)
}

/// Whether the event at `position` of `key` is finished already (the key's
/// `done_position` reached it): a delivery of it is a duplicate.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn is_finished(conn: &mut AsyncPgConnection, key: &str, position: i64) -> Result<bool> {
    let row: Flag = diesel::sql_query(
        "SELECT EXISTS (SELECT 1 FROM outbox_ordering_key
                        WHERE ordering_key = $1 AND done_position >= $2) AS flag",
    )
    .bind::<Text, _>(key)
    .bind::<BigInt, _>(position)
    .get_result(conn)
    .await?;
    Ok(row.flag)
}

/// [`is_finished`] for many (key, position) pairs at once, in the order
/// given: whether each key's `done_position` reached the position (the
/// handler succeeded, or the key was moved past the event). A first
/// delivery of such an event is acknowledged without running its handler.
///
/// # Errors
///
/// When Postgres fails.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// let finished = outbox_store::are_finished(conn, &[("order-7", 3), ("order-8", 1)]).await?;
/// println!("order-7 at 3: {}, order-8 at 1: {}", finished[0], finished[1]);
/// # Ok(()) }
/// ```
#[instrument(level = "debug", skip_all, fields(positions = positions.len()), err(level = "debug"))]
pub async fn are_finished(
    conn: &mut AsyncPgConnection,
    positions: &[(&str, i64)],
) -> Result<Vec<bool>> {
    if positions.is_empty() {
        return Ok(Vec::new());
    }
    let (keys, at): (Vec<&str>, Vec<i64>) = positions.iter().copied().unzip();
    let rows: Vec<Flag> = diesel::sql_query(
        "SELECT coalesce(k.done_position >= p.position, false) AS flag
         FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS p(ordering_key, position, n)
         LEFT JOIN outbox_ordering_key k ON k.ordering_key = p.ordering_key
         ORDER BY p.n",
    )
    .bind::<diesel::sql_types::Array<Text>, _>(&keys)
    .bind::<diesel::sql_types::Array<BigInt>, _>(&at)
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|row| row.flag).collect())
}

/// Holds `key` on the event `event_id` at `position`, whose job failed for
/// good: the key's later events wait until the event is retried
/// successfully, skipped or released. Returns false when the key is
/// already past the position.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn, reason), err(level = "debug"))]
pub async fn hold(
    conn: &mut AsyncPgConnection,
    key: &str,
    position: i64,
    event_id: Uuid,
    reason: &str,
) -> Result<bool> {
    let held = diesel::sql_query(
        "UPDATE outbox_ordering_key
         SET held_event_id = $3, held_since = now(), held_reason = $4, updated_at = now()
         WHERE ordering_key = $1 AND done_position < $2",
    )
    .bind::<Text, _>(key)
    .bind::<BigInt, _>(position)
    .bind::<SqlUuid, _>(event_id)
    .bind::<Text, _>(reason)
    .execute(conn)
    .await?;
    Ok(held == 1)
}

/// Lifts the hold of `key` (its events still wait for the held one to
/// finish). Returns false when the key was not held.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn clear_hold(conn: &mut AsyncPgConnection, key: &str) -> Result<bool> {
    let cleared = diesel::sql_query(
        "UPDATE outbox_ordering_key
         SET held_event_id = NULL, held_since = NULL, held_reason = NULL, updated_at = now()
         WHERE ordering_key = $1 AND held_event_id IS NOT NULL",
    )
    .bind::<Text, _>(key)
    .execute(conn)
    .await?;
    Ok(cleared == 1)
}

/// Lets `key` go on past a held event whose row is gone (retention deleted
/// it, `DONE` for longer than `OUTBOX_DONE_RETENTION_HOURS` while its job
/// lay dead): the hold is lifted and the key's first unfinished event
/// after it unblocked, the missing position stepped over as the table's
/// readers step over any gap. Returns the event the hold named, or `None`
/// when the key is not held on a missing row (nothing changes then).
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// match outbox_store::release_deleted_hold(conn, "order-7").await? {
///     Some(event) => println!("order-7 steps over its deleted event {event}"),
///     None => println!("order-7 is not held on a deleted event"),
/// }
/// # Ok(()) }
/// ```
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn release_deleted_hold(conn: &mut AsyncPgConnection, key: &str) -> Result<Option<Uuid>> {
    conn.transaction::<_, StoreError, _>(async |conn| {
        let Some(HeldRow {
            event_id,
            position: None,
        }) = locked_hold(conn, key).await?
        else {
            return Ok(None);
        };
        clear_hold(conn, key).await?;
        diesel::sql_query("SELECT outbox_ordering_unblock_head($1)")
            .bind::<Text, _>(key)
            .execute(conn)
            .await?;
        Ok(Some(event_id))
    })
    .await
}

/// A key whose head event failed for good, as `outbox ordering list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct HeldKey {
    /// The ordering key.
    #[diesel(sql_type = Text)]
    pub ordering_key: String,
    /// The event it waits on.
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    /// That event's position.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub position: Option<i64>,
    /// That event's status (`FAILED` when the dispatcher dead-lettered it,
    /// `DONE` when its job died in the queue).
    #[diesel(sql_type = Nullable<Text>)]
    pub status: Option<String>,
    /// Since when.
    #[diesel(sql_type = Timestamptz)]
    pub since: DateTime<Utc>,
    /// Why the event failed.
    #[diesel(sql_type = Text)]
    pub reason: String,
    /// Events of the key written after it, waiting.
    #[diesel(sql_type = BigInt)]
    pub waiting: i64,
}

/// Held keys, oldest hold first, at most `limit`.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn held_keys(conn: &mut AsyncPgConnection, limit: i64) -> Result<Vec<HeldKey>> {
    Ok(diesel::sql_query(
        "SELECT k.ordering_key, k.held_event_id AS event_id, e.ordering_position AS position,
                e.status, k.held_since AS since, coalesce(k.held_reason, '') AS reason,
                greatest(k.last_position - coalesce(e.ordering_position, k.done_position + 1), 0)
                    AS waiting
         FROM outbox_ordering_key k
         LEFT JOIN outbox_event e ON e.id = k.held_event_id
         WHERE k.held_event_id IS NOT NULL
         ORDER BY k.held_since, k.ordering_key
         LIMIT $1",
    )
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await?)
}

/// How many keys are held, and since when the oldest hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct HeldFigures {
    /// Held keys.
    #[diesel(sql_type = BigInt)]
    pub held: i64,
    /// The oldest hold's start, when any key is held.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub oldest_since: Option<DateTime<Utc>>,
}

/// [`HeldFigures`], from the partial index of held keys.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn held_figures(conn: &mut AsyncPgConnection) -> Result<HeldFigures> {
    Ok(diesel::sql_query(
        "SELECT count(*) AS held, min(held_since) AS oldest_since
         FROM outbox_ordering_key WHERE held_event_id IS NOT NULL",
    )
    .get_result(conn)
    .await?)
}

#[derive(QueryableByName)]
struct HeldRow {
    #[diesel(sql_type = SqlUuid)]
    event_id: Uuid,
    #[diesel(sql_type = Nullable<BigInt>)]
    position: Option<i64>,
}

/// What [`skip_held`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    /// The event skipped.
    pub event_id: Uuid,
    /// Its position in the key.
    pub position: i64,
}

/// Moves `key` past the event it is held on, in one transaction: a history
/// row (action `skip`, with `reason` and `requested_by`) for the event; a
/// `FAILED` or `PENDING` event becomes `CANCELLED` (it will not be
/// delivered); the key's `done_position` moves past it, the hold is lifted
/// and the next event becomes claimable. `None` when the key is not held,
/// or is held on an event whose row no longer exists (nothing changes
/// then).
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
#[instrument(
    level = "debug",
    skip(conn, reason, requested_by),
    err(level = "debug")
)]
pub async fn skip_held(
    conn: &mut AsyncPgConnection,
    key: &str,
    reason: &str,
    requested_by: Option<&str>,
) -> Result<Option<Skipped>> {
    conn.transaction::<_, StoreError, _>(async |conn| {
        let held = locked_hold(conn, key).await?;
        let Some(HeldRow {
            event_id,
            position: Some(position),
        }) = held
        else {
            return Ok(None);
        };
        diesel::sql_query(
            "INSERT INTO outbox_event_requeue
                 (outbox_event_id, reason, requested_by, previous_status, previous_retries,
                  previous_last_error, previous_scheduled_at, action)
             SELECT id, $2, $3, status, retries, last_error, scheduled_at, 'skip'
             FROM outbox_event WHERE id = $1",
        )
        .bind::<SqlUuid, _>(event_id)
        .bind::<Text, _>(reason)
        .bind::<Nullable<Text>, _>(requested_by)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "UPDATE outbox_event SET status = 'CANCELLED', locked_until = NULL
             WHERE id = $1 AND status IN ('FAILED', 'PENDING')",
        )
        .bind::<SqlUuid, _>(event_id)
        .execute(conn)
        .await?;
        advance(conn, key, position).await?;
        clear_hold(conn, key).await?;
        Ok(Some(Skipped { event_id, position }))
    })
    .await
}

/// The event `key` is held on, with its position (`None` when its row is
/// gone), the key's row locked until the transaction ends; `None` when
/// the key is not held.
async fn locked_hold(conn: &mut AsyncPgConnection, key: &str) -> Result<Option<HeldRow>> {
    diesel::sql_query(
        "SELECT k.held_event_id AS event_id, e.ordering_position AS position
         FROM outbox_ordering_key k
         LEFT JOIN outbox_event e ON e.id = k.held_event_id
         WHERE k.ordering_key = $1 AND k.held_event_id IS NOT NULL
         FOR UPDATE OF k",
    )
    .bind::<Text, _>(key)
    .get_result(conn)
    .await
    .map(Some)
    .or_else(not_found_is_none)
}

fn not_found_is_none<T>(error: diesel::result::Error) -> Result<Option<T>> {
    match error {
        diesel::result::Error::NotFound => Ok(None),
        other => Err(other.into()),
    }
}
