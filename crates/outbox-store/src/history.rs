//! The operator's changes of state, each with its history row in
//! `outbox_event_requeue`: requeue (and replay of DONE rows) and cancel.
//!
//! # Transactions and locks
//!
//! Each operation is one transaction: it locks the rows that still have an
//! allowed status (`FOR UPDATE`, so a dispatcher's claim and a second
//! operator wait for it), writes one history row per locked row, then
//! changes them. A row whose status changed since the caller read it is
//! left alone; if anything fails, nothing changed. The statements stay raw
//! SQL: the history row is an `INSERT … SELECT` of the row's own values.

use diesel::QueryableByName;
use diesel::sql_types::{Array, Bool, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::{NOTIFY_CHANNEL, OutboxStatus};
use tracing::instrument;
use uuid::Uuid;

use crate::{Result, StoreError};

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
    fn allowed(&self) -> Vec<&'static str> {
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
/// recorded in its history row).
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
#[instrument(level = "debug", skip_all, fields(events = change.ids.len()), err(level = "debug"))]
pub async fn requeue(conn: &mut AsyncPgConnection, change: Change<'_>) -> Result<Requeued> {
    let allowed = change.allowed();
    conn.transaction::<_, StoreError, _>(async |conn| {
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
                  previous_last_error, replay, generation)
             SELECT id, $2, $3, status, retries, last_error, status = 'DONE',
                    CASE WHEN status = 'DONE' THEN generation + 1 END
             FROM outbox_event WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
        .bind::<Text, _>(change.reason)
        .bind::<Nullable<Text>, _>(change.requested_by)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "UPDATE outbox_event
             SET status = 'PENDING', retries = 0, scheduled_at = now(), locked_until = NULL,
                 processed_at = NULL, failed_at = NULL, last_error = NULL, target_queue = NULL,
                 unrouted_since = NULL,
                 generation = generation + CASE WHEN status = 'DONE' THEN 1 ELSE 0 END
             WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
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

#[derive(QueryableByName)]
struct Cancelled {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// Cancels the rows of `change` in one transaction, each with its history
/// entry (action `cancel`): status CANCELLED, no lease. Returns the ids
/// cancelled.
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
#[instrument(level = "debug", skip_all, fields(events = change.ids.len()), err(level = "debug"))]
pub async fn cancel(conn: &mut AsyncPgConnection, change: Change<'_>) -> Result<Vec<Uuid>> {
    let allowed = change.allowed();
    conn.transaction::<_, StoreError, _>(async |conn| {
        let locked: Vec<Cancelled> = diesel::sql_query(
            "SELECT id FROM outbox_event WHERE id = ANY($1) AND status = ANY($2) FOR UPDATE",
        )
        .bind::<Array<SqlUuid>, _>(change.ids)
        .bind::<Array<Text>, _>(&allowed)
        .load(conn)
        .await?;
        let locked: Vec<Uuid> = locked.into_iter().map(|row| row.id).collect();
        diesel::sql_query(
            "INSERT INTO outbox_event_requeue
                 (outbox_event_id, reason, requested_by, previous_status, previous_retries,
                  previous_last_error, action)
             SELECT id, $2, $3, status, retries, last_error, 'cancel'
             FROM outbox_event WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked)
        .bind::<Text, _>(change.reason)
        .bind::<Nullable<Text>, _>(change.requested_by)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "UPDATE outbox_event SET status = 'CANCELLED', locked_until = NULL WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked)
        .execute(conn)
        .await?;
        Ok(locked)
    })
    .await
}
