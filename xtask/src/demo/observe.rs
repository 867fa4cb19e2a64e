//! What the demo sees: progress while it runs (rows, queues, sinks) and,
//! at the end, every observation the verdict is computed from.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxEvent;
use outbox_model::schema::outbox_event;
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, apalis_config, job_states, queue_stats, task_id};
use outbox_test_support::{HttpSink, SmtpSink};
use uuid::Uuid;

use crate::demo::publish::{ENDPOINTS, ROLLED_BACK_EMAIL};
use crate::demo::verdict::{CRM_PATH, Execution, Ledger, Observed, Row};

/// A worker counts as stalled after this long without a heartbeat (only
/// shown, never judged).
const STALL_AFTER: Duration = Duration::from_secs(60);

/// Rows and queues at one instant.
#[derive(Debug, Default, Clone, Copy)]
pub struct Snapshot {
    /// Rows whose time has come (not scheduled for later).
    pub due: u64,
    /// Rows `DONE` or `FAILED`.
    pub dispatched: u64,
    /// Rows `PENDING` and due, or `PROCESSING`.
    pub open: u64,
    /// Rows handed to a queue some worker consumes.
    pub to_subscribed: u64,
    /// Jobs finished (done or dead) on those queues.
    pub handled: u64,
    /// Every consumed queue, downstream ones included, has nothing waiting
    /// or running.
    pub idle: bool,
    /// Workflow executions `queued` or `running`.
    pub running_executions: u64,
}

#[derive(diesel::QueryableByName)]
struct Counts {
    #[diesel(sql_type = BigInt)]
    due: i64,
    #[diesel(sql_type = BigInt)]
    dispatched: i64,
    #[diesel(sql_type = BigInt)]
    open: i64,
    #[diesel(sql_type = BigInt)]
    to_subscribed: i64,
    #[diesel(sql_type = BigInt)]
    running_executions: i64,
}

/// Reads rows, queues and sinks while the demo runs.
pub struct Watch<'a> {
    /// The demo database.
    pub conn: AsyncPgConnection,
    /// The demo's Redis.
    pub redis: RedisConnection,
    /// The demo's queue prefix.
    pub namespace: QueueNamespace,
    /// The queues some worker consumes.
    pub subscribed: Vec<String>,
    /// The SMTP sink.
    pub smtp: &'a SmtpSink,
    /// The HTTP sink.
    pub http: &'a HttpSink,
    /// When each event's first mail or call reached a sink (as seen by
    /// this polling).
    pub first_seen: HashMap<Uuid, DateTime<Utc>>,
    mails_seen: usize,
    calls_seen: usize,
}

impl<'a> Watch<'a> {
    /// A watch over the demo's database, Redis and sinks.
    pub fn new(
        conn: AsyncPgConnection,
        redis: RedisConnection,
        namespace: QueueNamespace,
        subscribed: Vec<String>,
        smtp: &'a SmtpSink,
        http: &'a HttpSink,
    ) -> Self {
        Self {
            conn,
            redis,
            namespace,
            subscribed,
            smtp,
            http,
            first_seen: HashMap::new(),
            mails_seen: 0,
            calls_seen: 0,
        }
    }

    /// Rows and queues now; also notes the sinks' new arrivals.
    pub async fn snapshot(&mut self) -> Result<Snapshot> {
        self.note_arrivals();
        let counts: Counts = diesel::sql_query(
            "SELECT count(*) FILTER (WHERE NOT (status = 'PENDING' AND scheduled_at > now())) AS due,
                    count(*) FILTER (WHERE status IN ('DONE', 'FAILED')) AS dispatched,
                    count(*) FILTER (WHERE (status = 'PENDING' AND scheduled_at <= now())
                                        OR status = 'PROCESSING') AS open,
                    count(*) FILTER (WHERE status = 'DONE' AND target_queue = ANY($1)) AS to_subscribed,
                    (SELECT count(*) FROM workflow_execution
                     WHERE status IN ('queued', 'running')) AS running_executions
             FROM outbox_event",
        )
        .bind::<Array<Text>, _>(&self.subscribed)
        .get_result(&mut self.conn)
        .await?;
        let mut handled = 0;
        let mut idle = true;
        let downstream = outbox_catalog::Catalog::built_in().downstream_queues();
        for queue in self
            .subscribed
            .iter()
            .map(String::as_str)
            .chain(downstream.iter().copied())
        {
            let stats = queue_stats(&mut self.redis, &self.namespace, queue, STALL_AFTER).await?;
            if !downstream.contains(&queue) {
                handled += stats.done + stats.dead;
            }
            idle &= stats.backlog == 0 && stats.running == 0;
        }
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(Snapshot {
            due: n(counts.due),
            dispatched: n(counts.dispatched),
            open: n(counts.open),
            to_subscribed: n(counts.to_subscribed),
            handled: handled.min(n(counts.to_subscribed)),
            idle,
            running_executions: n(counts.running_executions),
        })
    }

    fn note_arrivals(&mut self) {
        let now = Utc::now();
        let mails = self.smtp.messages();
        for mail in mails.iter().skip(self.mails_seen) {
            if let Some(id) = mail.header("message-id").as_deref().and_then(message_event) {
                self.first_seen.entry(id).or_insert(now);
            }
        }
        self.mails_seen = mails.len();
        let calls = self.http.requests();
        for call in calls.iter().skip(self.calls_seen) {
            if let Some(id) = call.header("webhook-id").and_then(|v| v.parse().ok()) {
                self.first_seen.entry(id).or_insert(now);
            }
        }
        self.calls_seen = calls.len();
    }

    /// Everything the verdict needs.
    pub async fn observe(&mut self, ledger: &Ledger) -> Result<Observed> {
        self.note_arrivals();
        let mut seen = Observed::default();
        self.observe_tables(ledger, &mut seen).await?;
        self.observe_queues(&mut seen).await?;
        self.observe_sinks(&mut seen);
        Ok(seen)
    }

    /// The outbox rows, the repeated keys, the rolled-back transaction, the
    /// subscribers' rows and the workflow executions.
    async fn observe_tables(&mut self, ledger: &Ledger, seen: &mut Observed) -> Result<()> {
        let conn = &mut self.conn;
        let rows: Vec<OutboxEvent> = outbox_event::table
            .select(OutboxEvent::as_select())
            .load(conn)
            .await?;
        let now = Utc::now();
        seen.rows = rows
            .into_iter()
            .map(|r| Row {
                id: r.id,
                due: r.scheduled_at <= now,
                tenant: r.tenant_id,
                event_type: r.event_type,
                status: r.status.to_string(),
                target_queue: r.target_queue,
            })
            .collect();
        let keys: Vec<KeyCount> = diesel::sql_query(
            "SELECT dispatch_key AS key, count(*) AS n FROM outbox_event
             WHERE dispatch_key = ANY($1) GROUP BY dispatch_key",
        )
        .bind::<Array<Text>, _>(&ledger.repeated_keys)
        .load(conn)
        .await?;
        seen.key_rows = keys.into_iter().map(|k| (k.key, count(k.n))).collect();
        let rolled: CountRow = diesel::sql_query(
            "SELECT (SELECT count(*) FROM outbox_event WHERE payload->>'to' = $1)
                  + (SELECT count(*) FROM shop_order WHERE customer_email = $1) AS n",
        )
        .bind::<Text, _>(ROLLED_BACK_EMAIL)
        .get_result(conn)
        .await?;
        seen.rolled_back = count(rolled.n);
        seen.audit = per_event(conn, "audit_log").await?;
        seen.notifications = per_event(conn, "notification").await?;
        let executions: Vec<ExecutionSql> = diesel::sql_query(
            "SELECT e.id, w.name, e.status, e.input->'order'->>'id' AS order_id,
                    (SELECT string_agg(b.block_id, ',' ORDER BY b.started_at, b.sequence)
                     FROM workflow_block_execution b WHERE b.execution_id = e.id) AS blocks
             FROM workflow_execution e JOIN workflow w ON w.id = e.workflow_id",
        )
        .load(conn)
        .await?;
        seen.executions = executions
            .into_iter()
            .map(|e| Execution {
                id: e.id,
                workflow: e.name,
                status: e.status,
                order: e.order_id.and_then(|o| o.parse().ok()),
                blocks: e
                    .blocks
                    .map(|b| b.split(',').map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
            .collect();
        Ok(())
    }

    /// The job of each handed-off row, the first-delivery jobs per routed
    /// queue and the dead jobs per queue.
    async fn observe_queues(&mut self, seen: &mut Observed) -> Result<()> {
        let mut by_queue: BTreeMap<&str, Vec<Uuid>> = BTreeMap::new();
        for row in seen.rows.iter().filter(|r| r.status == "DONE") {
            if let Some(queue) = row.target_queue.as_deref() {
                by_queue.entry(queue).or_default().push(row.id);
            }
        }
        for (queue, ids) in &by_queue {
            let task_ids: Vec<String> = ids.iter().map(|id| task_id(*id)).collect();
            let states = job_states(&mut self.redis, &self.namespace, queue, &task_ids).await?;
            for (id, state) in ids.iter().zip(states) {
                seen.jobs.insert(*id, state.kind);
            }
        }
        let catalog = outbox_catalog::Catalog::built_in();
        for queue in catalog.routed_queues() {
            let hash = apalis_config(&self.namespace, queue).job_data_hash();
            let ids: Vec<String> = redis::cmd("HKEYS")
                .arg(&hash)
                .query_async(&mut self.redis)
                .await?;
            let first = ids
                .iter()
                .filter(|id| id.starts_with("outbox:") && !id.contains('~'))
                .count();
            if first > 0 {
                seen.queue_jobs.insert(queue.to_owned(), first);
            }
        }
        for queue in catalog.queues() {
            let stats = queue_stats(&mut self.redis, &self.namespace, queue, STALL_AFTER).await?;
            seen.dead.insert(queue.to_owned(), stats.dead);
        }
        Ok(())
    }

    /// The mails and calls at the sinks, each call's signature checked.
    fn observe_sinks(&self, seen: &mut Observed) {
        for mail in self.smtp.messages() {
            match mail.header("message-id").as_deref().and_then(message_event) {
                Some(id) => *seen.mails.entry(id).or_default() += 1,
                None => seen.foreign_mails += 1,
            }
        }
        let secrets: HashMap<&str, &str> = ENDPOINTS.iter().map(|e| (e.2, e.3)).collect();
        for call in self.http.requests() {
            if call.path == CRM_PATH {
                let order = serde_json::from_slice::<serde_json::Value>(&call.body)
                    .ok()
                    .and_then(|body| body["id"].as_str().and_then(|id| id.parse().ok()));
                match order {
                    Some(order) => *seen.crm_calls.entry(order).or_default() += 1,
                    None => seen.bad_signatures.push(format!(
                        "a CRM call without an order id: {}",
                        call.body_text()
                    )),
                }
                continue;
            }
            let id = call.header("webhook-id").unwrap_or("").to_owned();
            let valid = secrets.get(call.path.as_str()).is_some_and(|secret| {
                let timestamp = call
                    .header("webhook-timestamp")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                outbox_subscriber_webhook::verify(
                    secret,
                    &id,
                    timestamp,
                    &call.body,
                    call.header("webhook-signature").unwrap_or(""),
                )
                .unwrap_or(false)
            });
            if !valid {
                seen.bad_signatures
                    .push(format!("{} {} webhook-id {id}", call.method, call.path));
            }
            *seen.calls.entry((call.path.clone(), id)).or_default() += 1;
        }
    }

    /// Hand-off latency (publish to `DONE`) and end-to-end latency
    /// (publish to the effect: an audit or notification row, a mail or a
    /// call at a sink) in milliseconds, each as (p50, p99, samples).
    pub async fn latencies(&mut self) -> Result<[(f64, f64, usize); 2]> {
        let handoff: Vec<Ms> = diesel::sql_query(
            "SELECT extract(epoch FROM processed_at - created_at)::float8 * 1000 AS ms
             FROM outbox_event WHERE status = 'DONE' AND processed_at IS NOT NULL",
        )
        .load(&mut self.conn)
        .await?;
        let mut effects: Vec<Ms> = diesel::sql_query(
            "SELECT extract(epoch FROM a.recorded_at - e.created_at)::float8 * 1000 AS ms
             FROM audit_log a JOIN outbox_event e ON e.id = a.outbox_event_id
             UNION ALL
             SELECT extract(epoch FROM n.created_at - e.created_at)::float8 * 1000
             FROM notification n JOIN outbox_event e ON e.id = n.outbox_event_id",
        )
        .load(&mut self.conn)
        .await?;
        let ids: Vec<Uuid> = self.first_seen.keys().copied().collect();
        let created: Vec<Created> =
            diesel::sql_query("SELECT id, created_at FROM outbox_event WHERE id = ANY($1)")
                .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
                .load(&mut self.conn)
                .await?;
        for row in created {
            if let Some(at) = self.first_seen.get(&row.id) {
                effects.push(Ms {
                    ms: (*at - row.created_at).num_microseconds().unwrap_or(0) as f64 / 1000.0,
                });
            }
        }
        Ok([percentiles(handoff), percentiles(effects)])
    }
}

fn percentiles(values: Vec<Ms>) -> (f64, f64, usize) {
    let mut ms: Vec<f64> = values.into_iter().map(|v| v.ms).collect();
    ms.sort_by(f64::total_cmp);
    let at = |p: f64| {
        ms.get(((ms.len().saturating_sub(1)) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    (at(0.5), at(0.99), ms.len())
}

/// The event id in a `Message-ID` of the mail subscriber:
/// `<{event id}.{generation}@{domain}>`.
pub fn message_event(message_id: &str) -> Option<Uuid> {
    let inner = message_id
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>');
    let (local, _) = inner.split_once('@')?;
    let (id, _generation) = local.rsplit_once('.')?;
    id.parse().ok()
}

fn count(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

async fn per_event(conn: &mut AsyncPgConnection, table: &str) -> Result<HashMap<Uuid, usize>> {
    let rows: Vec<PerEvent> = diesel::sql_query(format!(
        "SELECT outbox_event_id AS id, count(*) AS n FROM {table} GROUP BY outbox_event_id"
    ))
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, count(r.n))).collect())
}

#[derive(diesel::QueryableByName)]
struct KeyCount {
    #[diesel(sql_type = Text)]
    key: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct PerEvent {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct ExecutionSql {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    order_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    blocks: Option<String>,
}

#[derive(diesel::QueryableByName)]
struct Ms {
    #[diesel(sql_type = Double)]
    ms: f64,
}

#[derive(diesel::QueryableByName)]
struct Created {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_name_their_event() {
        let id = Uuid::new_v4();
        assert_eq!(message_event(&format!("<{id}.0@acme.test>")), Some(id));
        assert_eq!(message_event(&format!("<{id}.3@outbox.invalid>")), Some(id));
        assert_eq!(message_event("<random@mail.example>"), None);
        assert_eq!(message_event(""), None);
    }
}
