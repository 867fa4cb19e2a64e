//! `cargo xtask bench --only partitioned`: the hand-off, the latency from
//! commit to hand-off, and retention with a large table (10,000,000 rows
//! by default), one table against a table partitioned by day, in the same
//! run.
//!
//! Each arm has its own scratch database holding `rows` `DONE` rows
//! created over the `days` whole days before today (UTC). The
//! partitioned arm is converted while empty, then given one partition per
//! day of that span, as a deployment partitioned for that long would have:
//! its rows are spread over the daily partitions. Then, per round and arm:
//!
//! - `partitioned_handoff`: one `worker-general` hands a backlog of
//!   `backlog` due rows (on five queues no handler consumes) over to Redis;
//!   the rate from the rows' `processed_at`, as `--only handoff`;
//! - `partitioned_latency_ms`: events published at `rate` a second for
//!   `seconds` (one per transaction) while the worker runs; p50 / p99 / max
//!   from the clock before `COMMIT` to the dispatcher's `processed_at`;
//! - `partitioned_retention`: one run of the retention job that removes the
//!   oldest day of rows: deleted row by row in the one table, a dropped
//!   partition in the other; the time it took.
//!
//! The summary gives the medians and the partitioned arm's ratio to the
//! one table.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use chrono::Timelike;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_dispatch::RetentionConfig;
use outbox_publish::NewOutboxEvent;
use serde_json::json;

use crate::bench::handoff::{HANDOFF_TYPES, done_rate_where, median, ratio, wait_until_done};
use crate::bench::kit::{Run, Scratch, clear_redis, line, preload_pending, stage};

/// This stage's name, and its Redis key prefix under the run's.
const STAGE: &str = "partitioned";

/// The backlog's and the latency load's rows, told from the old ones (all
/// `audit.user.login`).
const BACKLOG: &str = "event_type <> 'audit.user.login'";

/// What to measure.
pub struct Plan {
    /// The `worker-general` binary.
    pub binary: std::path::PathBuf,
    /// Old `DONE` rows in each arm's table.
    pub rows: usize,
    /// Days the old rows span (one partition each in the partitioned arm).
    pub days: u32,
    /// Due rows per hand-off.
    pub backlog: usize,
    /// Events a second of the latency load, and its length.
    pub rate: u32,
    /// How long the latency load lasts.
    pub seconds: u64,
    /// Rounds over both arms (each round's retention removes one more day).
    pub rounds: usize,
}

#[derive(Default)]
struct Figures {
    handoff: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    retention_s: Vec<f64>,
}

/// Runs the rounds and prints a line per measurement, then the summary.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    if plan.rounds as u32 >= plan.days {
        bail!(
            "partitioned: --partition-rounds must be below --partition-days (each round's retention removes a day)"
        );
    }
    let mut arms = Vec::new();
    for (arm, partitioned) in [("one_table", false), ("partitioned", true)] {
        let scratch = Scratch::create(
            &run.found.database_url,
            run.database(&format!("outbox_bench_{arm}")),
        )
        .await?;
        stage(&format!(
            "partitioned: {} old DONE rows over {} days into the {arm} arm",
            plan.rows, plan.days
        ));
        let started = Instant::now();
        fill(&scratch.url, plan, partitioned).await?;
        line(
            json!({ "bench": "partitioned_fill", "arm": arm, "rows": plan.rows,
                     "seconds": started.elapsed().as_secs_f64().round() }),
        );
        arms.push((arm, scratch, Figures::default()));
    }
    let prefix = run.stage_prefix(STAGE);
    for round in 1..=plan.rounds {
        for (arm, scratch, figures) in &mut arms {
            let mut conn = outbox_pg::establish(&scratch.url).await?;
            clear_redis(&run.found.redis_url, &prefix).await?;
            stage(&format!("partitioned: hand-off, {arm}, round {round}"));
            preload_pending(&mut conn, plan.backlog, &HANDOFF_TYPES).await?;
            let mut children = crate::bench::process::spawn_many(
                run,
                (&scratch.url, &prefix),
                &plan.binary,
                &[],
                1,
            )?;
            let measured = async {
                wait_until_done(&mut conn, &mut children).await?;
                let rate = done_rate_where(&mut conn, plan.backlog, BACKLOG).await?;
                conn.batch_execute(&format!("DELETE FROM outbox_event WHERE {BACKLOG}"))
                    .await?;
                stage(&format!("partitioned: latency, {arm}, round {round}"));
                let latency = latency(&scratch.url, &mut conn, plan).await?;
                Ok::<_, anyhow::Error>((rate, latency))
            }
            .await;
            crate::bench::process::stop_all(children)?;
            let (rate, (p50, p99, max)) = measured?;
            line(
                json!({ "bench": "partitioned_handoff", "arm": arm, "round": round,
                         "rows_in_table": plan.rows, "backlog": plan.backlog,
                         "per_second": rate.round() }),
            );
            line(
                json!({ "bench": "partitioned_latency_ms", "arm": arm, "round": round,
                         "rate": plan.rate, "seconds": plan.seconds,
                         "p50": p50, "p99": p99, "max": max }),
            );
            stage(&format!(
                "partitioned: retention of a day, {arm}, round {round}"
            ));
            // The window ends where round `round`'s oldest day ends.
            let keep_days = u64::from(plan.days) - round as u64;
            let since_midnight = u64::from(chrono::Utc::now().num_seconds_from_midnight());
            let config = RetentionConfig::new(
                Duration::from_secs(keep_days * 86_400 + since_midnight),
                RetentionConfig::DEFAULT_BATCH,
            );
            let pool = outbox_pg::connect_pool(&scratch.url, 2).await?;
            let started = Instant::now();
            let deleted = outbox_dispatch::purge_done(&pool, config).await?;
            let seconds = started.elapsed().as_secs_f64();
            let partitions = partitions_left(&mut conn).await?;
            line(
                json!({ "bench": "partitioned_retention", "arm": arm, "round": round,
                         "rows_deleted": deleted, "partitions_left": partitions,
                         "seconds": (seconds * 1000.0).round() / 1000.0 }),
            );
            figures.handoff.push(rate);
            figures.p50.push(p50);
            figures.p99.push(p99);
            figures.retention_s.push(seconds);
        }
    }
    clear_redis(&run.found.redis_url, &prefix).await?;
    let mut medians = Vec::new();
    for (arm, scratch, figures) in arms {
        let m = [
            median(figures.handoff),
            median(figures.p50),
            median(figures.p99),
            median(figures.retention_s),
        ];
        line(
            json!({ "bench": "partitioned_median", "arm": arm, "rounds": plan.rounds,
                     "handoff_per_second": m[0].round(), "latency_p50_ms": m[1],
                     "latency_p99_ms": m[2], "retention_seconds": m[3] }),
        );
        medians.push(m);
        scratch.remove().await?;
    }
    if let [one, parted] = medians.as_slice() {
        line(json!({ "bench": "partitioned_summary",
                     "handoff_ratio": ratio(parted[0], one[0]),
                     "latency_p50_ratio": ratio(parted[1], one[1]),
                     "latency_p99_ratio": ratio(parted[2], one[2]),
                     "retention_time_ratio": ratio(parted[3], one[3]) }));
    }
    Ok(())
}

/// `rows` DONE rows over the `days` whole days before today (UTC), a
/// million per statement; the partitioned arm converted first and given a partition a
/// day.
async fn fill(url: &str, plan: &Plan, partitioned: bool) -> Result<()> {
    let mut conn = outbox_pg::establish(url).await?;
    if partitioned {
        outbox_store::convert_to_partitioned(&mut conn, outbox_store::PartitionUnit::Day, 2)
            .await?;
        // The empty legacy partition gives way to daily ones for the span.
        conn.batch_execute(&format!(
            "ALTER TABLE outbox_event DETACH PARTITION outbox_event_legacy;
             DROP TABLE outbox_event_legacy;
             DO $$
             DECLARE d timestamptz;
             BEGIN
                 FOR d IN SELECT generate_series(
                              date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '{days} days',
                              (SELECT legacy_until FROM outbox_partitioning) - interval '1 day',
                              interval '1 day') LOOP
                     EXECUTE format('CREATE TABLE %I PARTITION OF outbox_event FOR VALUES FROM (%L) TO (%L)',
                                    'outbox_event_p' || to_char(d AT TIME ZONE 'UTC', 'YYYYMMDD'),
                                    d, d + interval '1 day');
                 END LOOP;
             END $$;",
            days = plan.days + 1
        ))
        .await?;
    }
    let span_ms = u64::from(plan.days) * 86_400_000;
    let chunk = 1_000_000usize;
    for start in (0..plan.rows).step_by(chunk) {
        let end = (start + chunk).min(plan.rows);
        conn.batch_execute(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, status, created_at,
                                       scheduled_at, processed_at, target_queue)
             SELECT 'tenant-' || (g % 17), 'audit.user.login', '{{\"n\": 1}}', 'DONE', ts, ts,
                    ts, 'outbox.audit'
             FROM (SELECT g, date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '{span_ms} ms'
                             + ((g - 1)::float8 * {span_ms} / {rows}) * interval '1 ms' AS ts
                   FROM generate_series({first}, {last}) AS g) AS s",
            first = start + 1,
            last = end,
            rows = plan.rows,
        ))
        .await?;
    }
    conn.batch_execute("VACUUM ANALYZE outbox_event").await?;
    Ok(())
}

/// Publishes at the plan's rate and reads each event's time from the clock
/// before its `COMMIT` to its `processed_at`: (p50, p99, max) in ms.
async fn latency(url: &str, conn: &mut AsyncPgConnection, plan: &Plan) -> Result<(f64, f64, f64)> {
    fn event(n: usize) -> NewOutboxEvent {
        NewOutboxEvent::new(
            format!("tenant-{}", n % 17),
            "search.index.product.updated",
            json!({ "n": n, "note": "latency" }),
        )
    }
    let published = crate::bench::latency::publish_at(
        url,
        plan.rate,
        Duration::from_secs(plan.seconds),
        0,
        event,
    )
    .await?;
    let ids: Vec<String> = published
        .commits
        .iter()
        .map(|(id, ..)| id.clone())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    #[derive(QueryableByName)]
    struct Ms {
        #[diesel(sql_type = Double)]
        p50: f64,
        #[diesel(sql_type = Double)]
        p99: f64,
        #[diesel(sql_type = Double)]
        max: f64,
        #[diesel(sql_type = BigInt)]
        open: i64,
    }
    let before: Vec<String> = published
        .commits
        .iter()
        .map(|(id, before, _)| format!("('{id}'::uuid, {before})"))
        .collect();
    loop {
        let ms: Ms = diesel::sql_query(format!(
            "WITH c (id, before_us) AS (VALUES {}),
                  t AS (SELECT e.status, extract(epoch FROM e.processed_at) * 1000.0 - c.before_us / 1000.0 AS ms
                        FROM c JOIN outbox_event e ON e.id = c.id)
             SELECT COALESCE(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0) AS p50,
                    COALESCE(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0) AS p99,
                    COALESCE(max(ms), 0)::float8 AS max,
                    count(*) FILTER (WHERE status <> 'DONE') AS open
             FROM t",
            before.join(", ")
        ))
        .get_result(conn)
        .await?;
        if ms.open == 0 {
            conn.batch_execute(&format!("DELETE FROM outbox_event WHERE {BACKLOG}"))
                .await?;
            let round = |v: f64| (v * 100.0).round() / 100.0;
            return Ok((round(ms.p50), round(ms.p99), round(ms.max)));
        }
        if Instant::now() > deadline {
            bail!(
                "partitioned: {} of {} events not handed off after 2 minutes",
                ms.open,
                ids.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The partitions left after a retention run (0 for the one table).
async fn partitions_left(conn: &mut AsyncPgConnection) -> Result<i64> {
    if outbox_store::partitioning(conn).await?.is_none() {
        return Ok(0);
    }
    let n = outbox_store::partitions(conn).await?.len();
    Ok(i64::try_from(n).unwrap_or(0))
}
