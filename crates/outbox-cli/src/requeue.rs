//! `outbox requeue`: put FAILED / CANCELLED (and, on request, DONE) rows back
//! to PENDING, consistently and with history.

use anyhow::{Context, Result};
use diesel::QueryableByName;
use diesel::sql_types::{Array, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_queue::{QueueNamespace, apalis_config, idempotency_prefix, queues, task_id};
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
struct Locked {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    target_queue: Option<String>,
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

/// Requeues the planned rows in one transaction: each row goes back to
/// PENDING with retries 0, due now, no lease, no processed_at, no
/// last_error, no target_queue; one `outbox_event_requeue` history row per
/// requeued row; and a NOTIFY that wakes the dispatchers. Rows whose status
/// changed since the plan are skipped.
///
/// For replayed (DONE) rows, what the previous run left in Redis is cleared
/// *before* the commit (see [`clear_replayed`]); if Redis fails, nothing is
/// committed. Otherwise the new hand-off would be deduplicated against the
/// finished job, and the receivers' idempotency records would suppress the
/// side effect.
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
    mut redis: Option<ReplayRedis<'_>>,
) -> Result<Executed> {
    let ids: Vec<Uuid> = plan.requeue.iter().map(|r| r.id).collect();
    let mut allowed = vec!["FAILED".to_owned(), "CANCELLED".to_owned()];
    if replay {
        allowed.push("DONE".to_owned());
    }
    conn.transaction::<_, anyhow::Error, _>(async |conn| {
        let locked: Vec<Locked> = diesel::sql_query(
            "SELECT id, status, target_queue FROM outbox_event
             WHERE id = ANY($1) AND status = ANY($2) FOR UPDATE",
        )
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&allowed)
        .load(conn)
        .await?;
        let replayed: Vec<(Uuid, Option<String>)> = locked
            .iter()
            .filter(|row| row.status == "DONE")
            .map(|row| (row.id, row.target_queue.clone()))
            .collect();
        let mut cleared = 0;
        if !replayed.is_empty() {
            let redis = redis
                .as_mut()
                .context("a replay must clear the previous run from Redis: set REDIS_URL or pass --redis-url")?;
            cleared = clear_replayed(redis.conn, redis.namespace, &replayed)
                .await
                .context("cannot clear the previous run from Redis; nothing was requeued")?;
        }
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
                 processed_at = NULL, last_error = NULL, target_queue = NULL
             WHERE id = ANY($1)",
        )
        .bind::<Array<SqlUuid>, _>(&locked_ids)
        .execute(conn)
        .await?;
        diesel::sql_query("SELECT pg_notify('outbox_event', 'requeue')")
            .execute(conn)
            .await?;
        Ok(Executed { requeued: locked_ids, cleared })
    })
    .await
}

/// Removes from Redis what the previous run of each replayed event left
/// behind, so that the replay runs again end to end:
///
/// - its finished job on its queue (`outbox:<id>` and retry copies), and the
///   finished downstream jobs derived from it (`email:<id>`,
///   `plugin-invoke:<id>:<subscription>`), but only jobs in the done or dead
///   set: a job still waiting or running is left alone (it will run anyway);
/// - the receivers' completed idempotency records for the event (a record
///   of a delivery still in progress is left alone).
///
/// Returns how many entries were removed.
///
/// # Errors
///
/// When Redis fails.
pub async fn clear_replayed(
    redis: &mut redis::aio::ConnectionManager,
    namespace: &QueueNamespace,
    replayed: &[(Uuid, Option<String>)],
) -> Result<usize> {
    let mut cleared = 0;
    for (id, queue) in replayed {
        let mut targets: Vec<(String, String)> = vec![
            (queues::TOOLCTRL_EMAIL.to_owned(), format!("email:{id}*")),
            (
                queues::TOOLCTRL_PLUGIN_INVOKE.to_owned(),
                format!("plugin-invoke:{id}:*"),
            ),
        ];
        if let Some(queue) = queue {
            targets.push((queue.clone(), format!("{}*", task_id(*id))));
        }
        for (queue, pattern) in targets {
            let config = apalis_config(namespace, &queue);
            let tasks: Vec<String> = hscan_keys(redis, &config.job_data_hash(), &pattern).await?;
            for task in tasks {
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
        }
        let pattern = format!("{}*{id}*", idempotency_prefix(namespace));
        for key in scan_keys(redis, &pattern).await? {
            let record: Option<String> = redis::cmd("GET").arg(&key).query_async(redis).await?;
            if record.is_some_and(|r| r.contains("\"completed\"")) {
                let _: () = redis::cmd("DEL").arg(&key).query_async(redis).await?;
                cleared += 1;
            }
        }
    }
    Ok(cleared)
}

async fn hscan_keys(
    redis: &mut redis::aio::ConnectionManager,
    hash: &str,
    pattern: &str,
) -> Result<Vec<String>> {
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, chunk): (u64, Vec<(String, Vec<u8>)>) = redis::cmd("HSCAN")
            .arg(hash)
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await?;
        found.extend(chunk.into_iter().map(|(field, _)| field));
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

async fn scan_keys(
    redis: &mut redis::aio::ConnectionManager,
    pattern: &str,
) -> Result<Vec<String>> {
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, chunk): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await?;
        found.extend(chunk);
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}
