//! `cargo xtask bench --only priority`: how long an urgent event waits
//! behind a backlog of its own queue, with and without priority.
//!
//! Each variant starts from an empty database and Redis prefix, writes a
//! backlog of `audit.user.login` events by plain SQL (the audit queue),
//! starts a release `worker-general` (dispatcher and audit subscriber),
//! waits until the backlog is moving (its first audit rows are written),
//! then publishes one more `audit.user.login` event in its own transaction
//! and measures from the commit returning to its audit row's `recorded_at`
//! (the handler's statement), as the latency stage does. With priority the
//! backlog is `Priority::LOWEST` and the probe `Priority::HIGHEST`; without,
//! both are normal. The line also gives the probe's hand-off (`processed_at`
//! minus the commit) and how much of the backlog was still waiting in
//! Postgres and had not yet run when the probe was committed.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_publish::{NewOutboxEvent, OutboxTx, Priority, PublishError, publish_outbox_event};
use serde_json::json;

use crate::bench::kit::{Run, Scratch, clear_redis, line, stage};
use crate::bench::process;

/// What to measure.
pub struct Plan {
    /// Events in the backlog.
    pub backlog: usize,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Probe {
    /// The audit row's `recorded_at`, µs since the epoch.
    #[diesel(sql_type = Nullable<BigInt>)]
    recorded_us: Option<i64>,
    /// The event's `processed_at`, µs since the epoch.
    #[diesel(sql_type = Nullable<BigInt>)]
    handed_off_us: Option<i64>,
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> Result<i64> {
    let count: Count = diesel::sql_query(sql).get_result(conn).await?;
    Ok(count.n)
}

/// Runs the variant with priority, then the one without.
pub async fn run(run: &Run, binary: &Path, plan: &Plan) -> Result<()> {
    let mut scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_priority"),
    )
    .await?;
    let prefix = run.stage_prefix("priority");
    for prioritised in [true, false] {
        stage(&format!(
            "priority: one event behind {} of its queue, {}",
            plan.backlog,
            if prioritised {
                "highest behind lowest"
            } else {
                "all normal"
            }
        ));
        clear_redis(&run.found.redis_url, &prefix).await?;
        let copy = run.database("outbox_bench_priority_run");
        let url = scratch.copy(&copy).await?;
        let result = variant(run, binary, plan, &url, &prefix, prioritised).await;
        scratch.remove_copy(&copy).await?;
        result?;
    }
    clear_redis(&run.found.redis_url, &prefix).await?;
    scratch.remove().await
}

async fn variant(
    run: &Run,
    binary: &Path,
    plan: &Plan,
    url: &str,
    prefix: &str,
    prioritised: bool,
) -> Result<()> {
    let (backlog_level, probe_level) = if prioritised {
        (Priority::LOWEST, Priority::HIGHEST)
    } else {
        (Priority::NORMAL, Priority::NORMAL)
    };
    let mut conn = outbox_pg::establish(url).await?;
    conn.batch_execute(&format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, priority)
         SELECT 'tenant-' || (g % 17), 'audit.user.login',
                jsonb_build_object('n', g, 'actor', 'user-42', 'note', 'backlog'), {backlog_level}
         FROM generate_series(1, {}) AS g;
         ANALYZE outbox_event",
        plan.backlog
    ))
    .await?;
    let mut children = vec![process::spawn(run, (url, prefix), binary, &[])?];
    let result = async {
        // The backlog is moving: the worker is up and has run the first jobs.
        process::wait_for_count(
            &mut conn,
            &mut children,
            "SELECT count(*) AS n FROM audit_log",
            1,
            Duration::from_secs(120),
        )
        .await
        .context("the backlog did not start to run")?;
        let waiting = count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_event WHERE status <> 'DONE'",
        )
        .await?;
        let not_run =
            plan.backlog as i64 - count(&mut conn, "SELECT count(*) AS n FROM audit_log").await?;
        let id = publish_probe(&mut conn, probe_level).await?;
        let committed = now_us();
        process::wait_for_count(
            &mut conn,
            &mut children,
            &format!("SELECT count(*) AS n FROM audit_log WHERE outbox_event_id = '{id}'"),
            1,
            Duration::from_secs(600),
        )
        .await
        .context("the probe's audit row did not appear")?;
        // The worker may run the job before the dispatcher records the
        // hand-off it made.
        process::wait_for_count(
            &mut conn,
            &mut children,
            &format!(
                "SELECT count(*) AS n FROM outbox_event WHERE id = '{id}' AND processed_at IS NOT NULL"
            ),
            1,
            Duration::from_secs(60),
        )
        .await
        .context("the probe's hand-off was not recorded")?;
        let probe: Probe = diesel::sql_query(format!(
            "SELECT (SELECT (extract(epoch FROM recorded_at) * 1000000)::bigint
                     FROM audit_log WHERE outbox_event_id = '{id}') AS recorded_us,
                    (SELECT (extract(epoch FROM processed_at) * 1000000)::bigint
                     FROM outbox_event WHERE id = '{id}') AS handed_off_us"
        ))
        .get_result(&mut conn)
        .await?;
        let ms = |us: Option<i64>| us.map(|us| round2((us - committed) as f64 / 1000.0));
        line(json!({
            "bench": "priority_latency_ms",
            "prioritised": prioritised,
            "backlog": plan.backlog,
            "backlog_priority": backlog_level.get(),
            "probe_priority": probe_level.get(),
            "backlog_not_handed_off_at_commit": waiting,
            "backlog_not_run_at_commit": not_run,
            "commit_to_handler": ms(probe.recorded_us),
            "commit_to_hand_off": ms(probe.handed_off_us),
        }));
        Ok::<_, anyhow::Error>(())
    }
    .await;
    process::stop_all(children)?;
    result
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Publishes the probe in its own transaction; returns its id.
async fn publish_probe(conn: &mut AsyncPgConnection, priority: Priority) -> Result<String> {
    let outcome = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(
                &tx,
                NewOutboxEvent::new(
                    "tenant-0",
                    "audit.user.login",
                    json!({ "actor": "user-7", "note": "password reset" }),
                )
                .priority(priority),
            )
            .await
        })
        .await?;
    Ok(outcome.id().to_string())
}
