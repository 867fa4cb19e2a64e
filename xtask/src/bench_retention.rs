//! `cargo xtask bench --only retention`: what deleting old `DONE` rows costs
//! the dispatcher.
//!
//! The table holds 1,000,000 `DONE` rows processed 60 days ago and a backlog
//! of due `PENDING` rows (on the hand-off stage's five queues, which no
//! `worker-general` handler consumes). One release `worker-general` hands
//! the backlog off twice from the same state: first with
//! `OUTBOX_DONE_RETENTION_HOURS=1000000` (nothing is old enough to delete),
//! then with the default 720 hours, so that its retention job, which runs
//! at start, deletes the old rows (1,000 a statement) while the dispatcher
//! works. The hand-off rate is read from the backlog's own `processed_at`
//! as in the hand-off stage; the line says how many old rows were deleted
//! by the time the backlog was handed off, so that the overlap shows.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::json;

use crate::bench::{Run, Scratch, clear_redis, line, preload_pending, stage};
use crate::bench_handoff::{HANDOFF_TYPES, done_rate_where, ratio};
use crate::bench_process;

/// The backlog's rows: `DONE` within the last day (the old rows are 60 days
/// old).
const RECENT: &str = "processed_at > now() - interval '1 day'";

/// What to measure.
pub struct Plan {
    /// Old `DONE` rows.
    pub done_rows: usize,
    /// The backlog handed off while they are deleted.
    pub pending_rows: usize,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Measures the hand-off without and with retention running.
pub async fn run(run: &Run, binary: &Path, plan: &Plan) -> Result<()> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_retention"),
    )
    .await?;
    let mut conn = outbox_model::establish(&scratch.url).await?;
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
    let mut rates = Vec::new();
    let prefix = run.stage_prefix("retention");
    for (retention, hours) in [(false, "1000000"), (true, "720")] {
        stage(&format!(
            "retention: handing off {} rows over {} old DONE rows, retention {}",
            plan.pending_rows,
            plan.done_rows,
            if retention { "deleting them" } else { "idle" }
        ));
        conn.batch_execute(&format!("DELETE FROM outbox_event WHERE {RECENT}"))
            .await?;
        clear_redis(&run.found.redis_url, &prefix).await?;
        preload_pending(&mut conn, plan.pending_rows, &HANDOFF_TYPES).await?;
        let old_before = old_rows(&mut conn).await?;
        let vars = [("OUTBOX_DONE_RETENTION_HOURS", hours.to_owned())];
        let target = (scratch.url.as_str(), prefix.as_str());
        let mut children = vec![bench_process::spawn(run, target, binary, &vars)?];
        let done = bench_process::wait_for_count(
            &mut conn,
            &mut children,
            &format!("SELECT count(*) AS n FROM outbox_event WHERE status = 'DONE' AND {RECENT}"),
            plan.pending_rows as i64,
            Duration::from_secs(900),
        )
        .await;
        let old_after = old_rows(&mut conn).await;
        bench_process::stop_all(children)?;
        done?;
        let old_after = old_after?;
        let rate = done_rate_where(&mut conn, plan.pending_rows, RECENT).await?;
        line(json!({
            "bench": "retention_round", "retention": retention,
            "events": plan.pending_rows, "per_second": rate.round(),
            "old_done_rows_before": old_before,
            "old_done_rows_deleted_during_handoff": old_before - old_after,
        }));
        rates.push(rate);
    }
    line(json!({
        "bench": "retention", "done_rows": plan.done_rows, "events": plan.pending_rows,
        "without_per_second": rates[0].round(), "with_per_second": rates[1].round(),
        "ratio": ratio(rates[1], rates[0]),
    }));
    drop(conn);
    clear_redis(&run.found.redis_url, &prefix).await?;
    scratch.remove().await
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
