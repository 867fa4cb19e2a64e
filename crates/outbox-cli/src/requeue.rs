//! `outbox requeue`: put FAILED / CANCELLED (and, on request, DONE) rows back
//! to PENDING, consistently and with history.
//!
//! This module holds the policy ([`refusal`], [`plan`]) and one transaction
//! of requeues ([`execute`]); [`bulk`] selects by filters and runs in
//! batches; [`command`] is the `outbox requeue` command itself.

pub mod bulk;
pub mod command;

use anyhow::{Context, Result};
use diesel::sql_types::{Array, Nullable, Text, Uuid as SqlUuid};
use diesel::{Queryable, QueryableByName, Selectable};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxStatus;
use outbox_model::schema::outbox_event;
use outbox_queue::{
    MAX_RETRY_ROUNDS, QueueNamespace, apalis_config, idempotency_prefix, queues, retry_task_id,
    task_id,
};
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

/// The columns the requeue policy looks at: no payload, so that a batch of
/// thousands of rows stays small.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = outbox_event)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Candidate {
    /// The row.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its event type.
    pub event_type: String,
    /// Its status.
    pub status: OutboxStatus,
    /// Its retries.
    pub retries: i32,
    /// Its last error.
    pub last_error: Option<String>,
}

/// Why a row with `status` is not requeued, or `None` when it is: PENDING
/// and PROCESSING are refused, DONE only without `replay`.
#[must_use]
pub fn refusal(status: OutboxStatus, replay: bool) -> Option<&'static str> {
    match status {
        OutboxStatus::Pending => Some("already PENDING: it will be dispatched as it is"),
        OutboxStatus::Processing => Some("PROCESSING: a dispatcher holds it right now"),
        OutboxStatus::Done if !replay => {
            Some("DONE: its side effect was handed off already; pass --replay to run it again")
        }
        _ => None,
    }
}

/// The statuses a requeue changes ([`refusal`] is `None`).
#[must_use]
pub fn requeueable(replay: bool) -> Vec<OutboxStatus> {
    OutboxStatus::ALL
        .into_iter()
        .filter(|status| refusal(*status, replay).is_none())
        .collect()
}

/// Classifies `rows` by [`refusal`].
#[must_use]
pub fn plan(rows: Vec<Candidate>, replay: bool) -> Plan {
    let mut plan = Plan::default();
    for row in rows {
        let refused = refusal(row.status, replay).map(str::to_owned);
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
struct Locked {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

#[derive(QueryableByName)]
struct ReplayRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Text)]
    tenant_id: String,
    #[diesel(sql_type = Nullable<Text>)]
    target_queue: Option<String>,
}

#[derive(QueryableByName)]
struct TenantTarget {
    #[diesel(sql_type = Text)]
    tenant_id: String,
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// What [`execute`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Executed {
    /// The rows requeued.
    pub requeued: Vec<Uuid>,
    /// Finished jobs and idempotency records of replayed rows removed from Redis.
    pub cleared: usize,
}

/// Redis access for replays.
pub struct ReplayRedis<'a> {
    /// The connection.
    pub conn: &'a mut redis::aio::ConnectionManager,
    /// The queues' namespace.
    pub namespace: &'a QueueNamespace,
}

/// What one replayed event may have left in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayTarget {
    /// The event.
    pub id: Uuid,
    /// The queue it was handed to.
    pub target_queue: Option<String>,
    /// The tenant's webhook endpoints (per-endpoint delivery records).
    pub endpoints: Vec<Uuid>,
    /// The tenant's plugin subscriptions (per-plugin invocations).
    pub subscriptions: Vec<Uuid>,
}

/// Requeues the planned rows in one transaction: each row goes back to
/// PENDING with retries 0, due now, no lease, no processed_at, no
/// failed_at, no last_error, no target_queue; one `outbox_event_requeue` history row per
/// requeued row; and a NOTIFY that wakes the dispatchers. Rows whose status
/// changed since the plan are skipped.
///
/// For replayed (DONE) rows, what the previous run left in Redis is cleared
/// first (see [`clear_replayed`]); if Redis fails, nothing is committed.
/// Otherwise the new hand-off would be deduplicated against the finished
/// job, and the receivers' idempotency records would suppress the side
/// effect. Clearing before the transaction keeps row locks short; it only
/// removes finished jobs and completed records, so it is harmless if the
/// requeue then does not happen.
///
/// # Errors
///
/// When Postgres or Redis fails, or a replay has no Redis (nothing changes then).
pub async fn execute(
    conn: &mut AsyncPgConnection,
    plan: &Plan,
    reason: &str,
    requested_by: Option<&str>,
    replay: bool,
    redis: Option<ReplayRedis<'_>>,
) -> Result<Executed> {
    let ids: Vec<Uuid> = plan.requeue.iter().map(|r| r.id).collect();
    let allowed: Vec<&str> = requeueable(replay)
        .into_iter()
        .map(OutboxStatus::as_str)
        .collect();
    let mut cleared = 0;
    if replay {
        let targets = replay_targets(conn, &ids).await?;
        if !targets.is_empty() {
            let redis =
                redis.context("a replay must clear the previous run from Redis: set REDIS_URL or pass --redis-url")?;
            cleared = clear_replayed(redis.conn, redis.namespace, &targets)
                .await
                .context("cannot clear the previous run from Redis; nothing was requeued")?;
        }
    }
    conn.transaction::<_, anyhow::Error, _>(async |conn| {
        let locked: Vec<Locked> = diesel::sql_query(
            "SELECT id FROM outbox_event WHERE id = ANY($1) AND status = ANY($2) FOR UPDATE",
        )
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&allowed)
        .load(conn)
        .await?;
        let locked_ids: Vec<Uuid> = locked.iter().map(|row| row.id).collect();
        diesel::sql_query(
            "INSERT INTO outbox_event_requeue
                 (outbox_event_id, reason, requested_by, previous_status, previous_retries,
                  previous_last_error, replay)
             SELECT id, $2, $3, status, retries, last_error, status = 'DONE'
             FROM outbox_event WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
        .bind::<Text, _>(reason)
        .bind::<Nullable<Text>, _>(requested_by)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "UPDATE outbox_event
             SET status = 'PENDING', retries = 0, scheduled_at = now(), locked_until = NULL,
                 processed_at = NULL, failed_at = NULL, last_error = NULL, target_queue = NULL
             WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
        .execute(conn)
        .await?;
        diesel::sql_query("SELECT pg_notify('outbox_event', 'requeue')")
            .execute(conn)
            .await?;
        Ok(Executed {
            requeued: locked_ids,
            cleared,
        })
    })
    .await
}

/// The DONE rows among `ids`, with their tenants' endpoints and subscriptions.
async fn replay_targets(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<Vec<ReplayTarget>> {
    let rows: Vec<ReplayRow> =
        diesel::sql_query("SELECT id, tenant_id, target_queue FROM outbox_event WHERE id = ANY($1) AND status = 'DONE'")
            .bind::<Array<SqlUuid>, _>(ids)
            .load(conn)
            .await?;
    let tenants: Vec<String> = rows.iter().map(|r| r.tenant_id.clone()).collect();
    let endpoints: Vec<TenantTarget> =
        diesel::sql_query("SELECT tenant_id, id FROM webhook_endpoint WHERE tenant_id = ANY($1)")
            .bind::<Array<Text>, _>(&tenants)
            .load(conn)
            .await?;
    let subscriptions: Vec<TenantTarget> = diesel::sql_query(
        "SELECT tenant_id, id FROM plugin_hook_subscription WHERE tenant_id = ANY($1)",
    )
    .bind::<Array<Text>, _>(&tenants)
    .load(conn)
    .await?;
    let of = |list: &[TenantTarget], tenant: &str| -> Vec<Uuid> {
        list.iter()
            .filter(|t| t.tenant_id == tenant)
            .map(|t| t.id)
            .collect()
    };
    Ok(rows
        .into_iter()
        .map(|row| ReplayTarget {
            id: row.id,
            endpoints: of(&endpoints, &row.tenant_id),
            subscriptions: of(&subscriptions, &row.tenant_id),
            target_queue: row.target_queue,
        })
        .collect())
}

/// Every task id a job and its retry rounds may have.
fn with_retries(task: String) -> Vec<String> {
    let mut all: Vec<String> = (1..=MAX_RETRY_ROUNDS)
        .map(|round| retry_task_id(&task, round))
        .collect();
    all.push(task);
    all
}

/// Removes from Redis what the previous run of each replayed event left
/// behind, so that the replay runs again end to end. It computes the exact
/// keys (no scans):
///
/// - the event's finished job on its queue (`outbox:<id>` and its retry
///   copies) and the finished downstream jobs derived from it
///   (`email:<id>`, `plugin-invoke:<id>:<subscription>`), but only jobs in
///   the done or dead set: a job still waiting or running is left alone;
/// - the receivers' completed idempotency records for the event
///   (`email:<id>`, `webhook:<id>:<endpoint>`, `plugin-invoke:<id>:<sub>`,
///   `<id>`); a record of a delivery still in progress is left alone.
///
/// Returns how many entries were removed.
///
/// # Errors
///
/// When Redis fails.
pub async fn clear_replayed(
    redis: &mut redis::aio::ConnectionManager,
    namespace: &QueueNamespace,
    targets: &[ReplayTarget],
) -> Result<usize> {
    let mut cleared = 0;
    for target in targets {
        let id = target.id;
        let mut jobs: Vec<(String, Vec<String>)> = vec![
            (
                queues::TOOLCTRL_EMAIL.to_owned(),
                with_retries(format!("email:{id}")),
            ),
            (
                queues::TOOLCTRL_PLUGIN_INVOKE.to_owned(),
                target
                    .subscriptions
                    .iter()
                    .flat_map(|sub| with_retries(format!("plugin-invoke:{id}:{sub}")))
                    .collect(),
            ),
        ];
        if let Some(queue) = &target.target_queue {
            jobs.push((queue.clone(), with_retries(task_id(id))));
        }
        for (queue, tasks) in jobs {
            if tasks.is_empty() {
                continue;
            }
            let config = apalis_config(namespace, &queue);
            let mut check = redis::pipe();
            for task in &tasks {
                check
                    .sismember(config.done_jobs_set(), task)
                    .sismember(config.dead_jobs_set(), task);
            }
            let membership: Vec<bool> = check.query_async(redis).await?;
            let mut clear = redis::pipe();
            let mut n = 0;
            for (task, member) in tasks.iter().zip(membership.chunks(2)) {
                if member.iter().any(|m| *m) {
                    clear
                        .hdel(config.job_data_hash(), task)
                        .del(format!("{}:{task}", config.job_meta_hash()))
                        .srem(config.done_jobs_set(), task)
                        .srem(config.dead_jobs_set(), task);
                    n += 1;
                }
            }
            if n > 0 {
                let _: () = clear.query_async(redis).await?;
                cleared += n;
            }
        }
        let prefix = idempotency_prefix(namespace);
        let mut keys = vec![format!("{prefix}email:{id}"), format!("{prefix}{id}")];
        keys.extend(
            target
                .endpoints
                .iter()
                .map(|e| format!("{prefix}webhook:{id}:{e}")),
        );
        keys.extend(
            target
                .subscriptions
                .iter()
                .map(|s| format!("{prefix}plugin-invoke:{id}:{s}")),
        );
        let records: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(redis).await?;
        for (key, record) in keys.iter().zip(records) {
            if record.is_some_and(|r| r.contains("\"completed\"")) {
                let _: () = redis::cmd("DEL").arg(key).query_async(redis).await?;
                cleared += 1;
            }
        }
    }
    Ok(cleared)
}
