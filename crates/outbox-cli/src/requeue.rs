//! `outbox requeue`: put FAILED / CANCELLED (and, on request, DONE) rows back
//! to PENDING, consistently and with history.

use anyhow::{Context, Result};
use diesel::QueryableByName;
use diesel::sql_types::{Array, Bool, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_queue::{QueueNamespace, apalis_config, task_id};
use serde::Serialize;
use uuid::Uuid;

/// What would happen (or happened) to one row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanRow {
    /// The row.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its event type.
    pub event_type: String,
    /// Status before.
    pub status: OutboxStatus,
    /// Retries before.
    pub retries: i32,
    /// Last error before.
    pub last_error: Option<String>,
    /// Why it is refused, when it is.
    pub refused: Option<String>,
    /// True when requeueing runs a side effect again (a DONE row).
    pub replay: bool,
}

/// The plan for a selection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    /// Rows that will be requeued.
    pub requeue: Vec<PlanRow>,
    /// Rows left alone, with the reason.
    pub refused: Vec<PlanRow>,
}

/// Classifies `rows`: PENDING and PROCESSING are refused, DONE only with `replay`.
#[must_use]
pub fn plan(rows: Vec<OutboxEvent>, replay: bool) -> Plan {
    let mut plan = Plan::default();
    for row in rows {
        let refused = match row.status {
            OutboxStatus::Pending => {
                Some("already PENDING: it will be dispatched as it is".to_owned())
            }
            OutboxStatus::Processing => {
                Some("PROCESSING: a dispatcher holds it right now".to_owned())
            }
            OutboxStatus::Done if !replay => Some(
                "DONE: its side effect was handed off already; pass --replay to run it again"
                    .to_owned(),
            ),
            _ => None,
        };
        let entry = PlanRow {
            id: row.id,
            tenant_id: row.tenant_id,
            event_type: row.event_type,
            status: row.status,
            retries: row.retries,
            last_error: row.last_error,
            replay: row.status == OutboxStatus::Done,
            refused: refused.clone(),
        };
        if refused.is_some() {
            plan.refused.push(entry);
        } else {
            plan.requeue.push(entry);
        }
    }
    plan
}

#[derive(QueryableByName)]
struct Requeued {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Nullable<Text>)]
    target_queue: Option<String>,
    #[diesel(sql_type = Bool)]
    replay: bool,
}

/// Requeues the planned rows in one transaction: each row goes back to
/// PENDING with retries 0, due now, no lease, no processed_at, no
/// last_error, no target_queue; one `outbox_event_requeue` history row per
/// requeued row; and a NOTIFY that wakes the dispatchers. Rows whose status
/// changed since the plan are skipped. Returns (id, target_queue, replay) of
/// the rows requeued.
///
/// # Errors
///
/// When Postgres fails (nothing is changed then).
pub async fn execute(
    conn: &mut AsyncPgConnection,
    plan: &Plan,
    reason: &str,
    requested_by: Option<&str>,
    replay: bool,
) -> Result<Vec<(Uuid, Option<String>, bool)>> {
    let ids: Vec<Uuid> = plan.requeue.iter().map(|r| r.id).collect();
    let mut allowed = vec!["FAILED".to_owned(), "CANCELLED".to_owned()];
    if replay {
        allowed.push("DONE".to_owned());
    }
    let rows: Vec<Requeued> = conn
        .transaction::<_, diesel::result::Error, _>(async |conn| {
            let rows = diesel::sql_query(
                "WITH target AS (
                     SELECT id, status, retries, last_error, target_queue FROM outbox_event
                     WHERE id = ANY($1) AND status = ANY($2)
                     FOR UPDATE
                 ), history AS (
                     INSERT INTO outbox_event_requeue
                         (outbox_event_id, reason, requested_by, previous_status, previous_retries,
                          previous_last_error, replay)
                     SELECT id, $3, $4, status, retries, last_error, status = 'DONE' FROM target
                 )
                 UPDATE outbox_event e
                 SET status = 'PENDING', retries = 0, scheduled_at = now(), locked_until = NULL,
                     processed_at = NULL, last_error = NULL, target_queue = NULL
                 FROM target
                 WHERE e.id = target.id
                 RETURNING e.id, target.target_queue, target.status = 'DONE' AS replay",
            )
            .bind::<Array<SqlUuid>, _>(&ids)
            .bind::<Array<Text>, _>(&allowed)
            .bind::<Text, _>(reason)
            .bind::<Nullable<Text>, _>(requested_by)
            .load(conn)
            .await?;
            diesel::sql_query("SELECT pg_notify('outbox_event', 'requeue')")
                .execute(conn)
                .await?;
            Ok(rows)
        })
        .await
        .context("requeue failed; nothing was changed")?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, r.target_queue, r.replay))
        .collect())
}

/// For replayed rows, removes the finished job of the previous hand-off from
/// Redis, so that the new hand-off makes a new job instead of being
/// deduplicated against the old task id. Only jobs in the done or dead set
/// are removed; a job still waiting or running is left alone (it will run
/// anyway). Returns how many old jobs were cleared.
///
/// # Errors
///
/// When Redis fails.
pub async fn clear_finished_jobs(
    redis: &mut redis::aio::ConnectionManager,
    namespace: &QueueNamespace,
    replayed: &[(Uuid, String)],
) -> Result<usize> {
    let mut cleared = 0;
    for (id, queue) in replayed {
        let config = apalis_config(namespace, queue);
        let task = task_id(*id);
        let (in_done, in_dead): (bool, bool) = redis::pipe()
            .sismember(config.done_jobs_set(), &task)
            .sismember(config.dead_jobs_set(), &task)
            .query_async(redis)
            .await?;
        if in_done || in_dead {
            let _: () = redis::pipe()
                .hdel(config.job_data_hash(), &task)
                .del(format!("{}:{task}", config.job_meta_hash()))
                .srem(config.done_jobs_set(), &task)
                .srem(config.dead_jobs_set(), &task)
                .query_async(redis)
                .await?;
            cleared += 1;
        }
    }
    Ok(cleared)
}
