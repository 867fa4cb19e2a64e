//! `cargo xtask bench --only retention`: what deleting old `DONE` rows costs
//! the dispatcher.
//!
//! A database holds 1,000,000 `DONE` rows processed 60 days ago, vacuumed
//! and analyzed as a table that retention keeps at that size would be.
//! Each arm runs on a fresh copy of it (`CREATE DATABASE … TEMPLATE`), so
//! both start from the same table: a backlog of due `PENDING` rows is
//! loaded (on the hand-off stage's five queues, which no `worker-general`
//! handler consumes) and one release `worker-general` hands it off, once
//! with `OUTBOX_DONE_RETENTION_HOURS=1000000` (nothing is old enough to
//! delete) and once with the default 720 hours, so that its retention job,
//! which runs at start, deletes the old rows (1,000 a statement) while the
//! dispatcher works. The rounds alternate the order of the two arms
//! (without first, then with first, …), so that neither always runs on a
//! machine warmed or loaded by the other. The hand-off rate is read from
//! the backlog's own `processed_at` as in the hand-off stage; each round's
//! line says how many old rows were deleted by the time the backlog was
//! handed off, so that the overlap shows, and the machine's CPU shares over
//! the hand-off (`cpu_share`); the summary gives the medians and their
//! ratio.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::json;

use crate::bench::handoff::{HANDOFF_TYPES, done_rate_where, median, ratio};
use crate::bench::kit::{Run, Scratch, clear_redis, line, preload_pending, stage};
use crate::bench::process;

/// The backlog's rows: `DONE` within the last day (the old rows are 60 days
/// old).
const RECENT: &str = "processed_at > now() - interval '1 day'";

/// What to measure.
pub struct Plan {
    /// Old `DONE` rows.
    pub done_rows: usize,
    /// The backlog handed off while they are deleted.
    pub pending_rows: usize,
    /// Rounds, each running both arms.
    pub rounds: usize,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Measures the hand-off without and with retention running.
pub async fn run(run: &Run, binary: &Path, plan: &Plan) -> Result<()> {
    let mut scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_retention"),
    )
    .await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    stage(&format!(
        "retention: loading {} old DONE rows",
        plan.done_rows
    ));
    conn.batch_execute(&format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, created_at,
                                   scheduled_at, processed_at, target_queue)
         SELECT 'tenant-' || (g % 17), 'audit.user.login',
                jsonb_build_object('n', g, 'note', 'benchmark'), 'DONE', ts, ts, ts,
                'outbox.audit'
         FROM (SELECT g, now() - interval '60 days' + g * interval '1 ms' AS ts
               FROM generate_series(1, {}) AS g) AS s",
        plan.done_rows
    ))
    .await?;
    conn.batch_execute("VACUUM ANALYZE outbox_event").await?;
    // The copies need the database to themselves.
    drop(conn);
    let arm_db = run.database("outbox_bench_retention_arm");
    let prefix = run.stage_prefix("retention");
    let mut rates = [Vec::new(), Vec::new()];
    for round in 1..=plan.rounds {
        let order = if round % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for retention in order {
            stage(&format!(
                "retention: round {round}/{}, handing off {} rows over {} old DONE rows, retention {}",
                plan.rounds,
                plan.pending_rows,
                plan.done_rows,
                if retention { "deleting them" } else { "idle" }
            ));
            let url = scratch.copy(&arm_db).await?;
            let measured = arm(run, binary, plan, (&url, &prefix), retention).await;
            scratch.remove_copy(&arm_db).await?;
            let (rate, old_before, old_after, cpu) = measured?;
            line(json!({
                "bench": "retention_round", "round": round, "retention": retention,
                "events": plan.pending_rows, "per_second": rate.round(),
                "old_done_rows_before": old_before,
                "old_done_rows_deleted_during_handoff": old_before - old_after,
                "cpu_share": cpu,
            }));
            rates[usize::from(retention)].push(rate);
        }
    }
    let [without, with] = rates.map(median);
    line(json!({
        "bench": "retention", "done_rows": plan.done_rows, "events": plan.pending_rows,
        "rounds": plan.rounds,
        "without_per_second": without.round(), "with_per_second": with.round(),
        "ratio": ratio(with, without),
    }));
    clear_redis(&run.found.redis_url, &prefix).await?;
    scratch.remove().await
}

/// One arm on the copy at `url`: the hand-off rate, the old rows before and
/// after, and the CPU shares over the hand-off.
async fn arm(
    run: &Run,
    binary: &Path,
    plan: &Plan,
    (url, prefix): (&str, &str),
    retention: bool,
) -> Result<(f64, i64, i64, serde_json::Value)> {
    let mut conn = outbox_pg::establish(url).await?;
    clear_redis(&run.found.redis_url, prefix).await?;
    preload_pending(&mut conn, plan.pending_rows, &HANDOFF_TYPES).await?;
    let old_before = old_rows(&mut conn).await?;
    let hours = if retention { "720" } else { "1000000" };
    let vars = [("OUTBOX_DONE_RETENTION_HOURS", hours.to_owned())];
    let mut children = vec![process::spawn(run, (url, prefix), binary, &vars)?];
    let before = process::Cpu::sample(&children);
    let done = process::wait_for_count(
        &mut conn,
        &mut children,
        &format!("SELECT count(*) AS n FROM outbox_event WHERE status = 'DONE' AND {RECENT}"),
        plan.pending_rows as i64,
        Duration::from_secs(900),
    )
    .await;
    let cpu = before.shares(&process::Cpu::sample(&children));
    let old_after = old_rows(&mut conn).await;
    process::stop_all(children)?;
    done?;
    let old_after = old_after?;
    let rate = done_rate_where(&mut conn, plan.pending_rows, RECENT).await?;
    Ok((rate, old_before, old_after, cpu))
}

async fn old_rows(conn: &mut AsyncPgConnection) -> Result<i64> {
    let count: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM outbox_event
         WHERE status = 'DONE' AND processed_at < now() - interval '30 days'",
    )
    .get_result(conn)
    .await?;
    Ok(count.n)
}
