//! `cargo xtask bench --only handoff`: how fast one `worker-general` process
//! hands a preloaded backlog over to Redis, per `OUTBOX_DISPATCH_BATCH_SIZE`.
//!
//! Each measurement starts from the same state: `rows` due `PENDING` rows on
//! five queues that no `worker-general` handler consumes (so the figure is
//! the hand-off alone: claim, push, DONE), statistics taken before the
//! dispatcher starts, an empty Redis prefix. The worker binary runs with the
//! dispatcher on and the batch size under test until every row is `DONE`.
//! The rate is read from the rows themselves: rows marked after the first
//! `DONE` statement, divided by the time from that statement to the last
//! (`processed_at`), so process start-up and polling do not count.
//!
//! Two baselines run in the same rounds, on the same backlog:
//!
//! - `sql_only`: two connections repeat one statement that claims 100 due
//!   rows through the claim index and marks them `DONE` (no Redis): the
//!   Postgres side of the work at its cheapest;
//! - `redis_only`: the same jobs pushed into Redis by one process, in the
//!   dispatcher's units (500 jobs per push, 10 pushes in flight), without
//!   Postgres: the Redis side.
//!
//! The summary gives each hand-off median as a ratio of each baseline's
//! median.
//!
//! Several binaries can be compared in one run (`--handoff-bin
//! label=path`, e.g. a build of the previous commit): the measurements are
//! interleaved (every binary at one batch size, then the next size, for each
//! round) so that the load of a shared machine falls on all of them alike.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures::{StreamExt, TryStreamExt};
use outbox_dispatch::Router;
use outbox_model::OutboxEvent;
use outbox_queue::{OutboxJob, QueueNamespace, RedisSettings, push_jobs};
use serde_json::json;

use crate::bench::{Run, Scratch, clear_redis, preload_pending};

/// Event types on five queues that `worker-general` does not consume
/// (mail, webhook, search index, RAG index, marketing).
pub const HANDOFF_TYPES: [&str; 5] = [
    "mail.user.welcome",
    "webhook.order.created",
    "search.index.product.updated",
    "rag.index.document.updated",
    "marketing.lead.created",
];

/// What to measure.
pub struct Handoff {
    /// `(label, worker-general binary)` pairs.
    pub binaries: Vec<(String, PathBuf)>,
    /// Preloaded rows per measurement.
    pub rows: usize,
    /// `OUTBOX_DISPATCH_BATCH_SIZE` values.
    pub batch_sizes: Vec<u32>,
    /// Rounds over every (batch size, binary).
    pub rounds: usize,
}

#[derive(QueryableByName)]
struct Progress {
    #[diesel(sql_type = BigInt)]
    open: i64,
}

#[derive(QueryableByName)]
struct Span {
    #[diesel(sql_type = BigInt)]
    done: i64,
    #[diesel(sql_type = BigInt)]
    first: i64,
    #[diesel(sql_type = Double)]
    seconds: f64,
}

/// Runs the measurements and prints one JSON line each, then one summary
/// line per (binary, batch size) with the median.
pub async fn run(run: &Run, plan: &Handoff) -> Result<()> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_handoff"),
    )
    .await?;
    let mut conn = AsyncPgConnection::establish(&scratch.url).await?;
    let mut results: Vec<(String, u32, f64)> = Vec::new();
    let mut sql_only = Vec::new();
    let mut redis_only = Vec::new();
    let total = plan.rounds * (plan.batch_sizes.len() * plan.binaries.len() + 2);
    let mut step = 0;
    let mut progress = |what: &str, round: usize| {
        step += 1;
        crate::bench::stage(&format!(
            "handoff {step}/{total}: {what}, round {round}, {} rows",
            plan.rows
        ));
    };
    for round in 1..=plan.rounds {
        progress("baseline sql_only", round);
        let rate = sql_only_rate(&scratch.url, &mut conn, plan.rows).await?;
        crate::bench::line(json!({
            "bench": "handoff_baseline_sql_only", "round": round,
            "events": plan.rows, "per_second": rate.round(),
        }));
        sql_only.push(rate);
        progress("baseline redis_only", round);
        let rate = redis_only_rate(run, &mut conn, plan.rows).await?;
        crate::bench::line(json!({
            "bench": "handoff_baseline_redis_only", "round": round,
            "events": plan.rows, "per_second": rate.round(),
        }));
        redis_only.push(rate);
        for &batch in &plan.batch_sizes {
            for (label, binary) in &plan.binaries {
                progress(&format!("{label}, batch {batch}"), round);
                let rate = measure(run, &scratch.url, &mut conn, binary, batch, plan.rows)
                    .await
                    .with_context(|| format!("{label} at batch {batch}"))?;
                crate::bench::line(json!({
                    "bench": "handoff", "binary": label, "batch_size": batch,
                    "round": round, "events": plan.rows, "per_second": rate.round(),
                }));
                results.push((label.clone(), batch, rate));
            }
        }
    }
    let sql_only = median(sql_only);
    let redis_only = median(redis_only);
    crate::bench::line(json!({
        "bench": "handoff_baselines_median", "rounds": plan.rounds,
        "sql_only_per_second": sql_only.round(), "redis_only_per_second": redis_only.round(),
    }));
    for &batch in &plan.batch_sizes {
        for (label, _) in &plan.binaries {
            let rates: Vec<f64> = results
                .iter()
                .filter(|(l, b, _)| l == label && *b == batch)
                .map(|(_, _, r)| *r)
                .collect();
            let (min, max) = (
                rates.iter().copied().fold(f64::INFINITY, f64::min),
                rates.iter().copied().fold(0.0, f64::max),
            );
            let rate = median(rates);
            crate::bench::line(json!({
                "bench": "handoff_median", "binary": label, "batch_size": batch,
                "rounds": plan.rounds, "per_second": rate.round(),
                "min": min.round(), "max": max.round(),
                "ratio_to_sql_only": (rate / sql_only * 100.0).round() / 100.0,
                "ratio_to_redis_only": (rate / redis_only * 100.0).round() / 100.0,
            }));
        }
    }
    drop(conn);
    clear_redis(&run.found.redis_url, &run.prefix()).await?;
    scratch.remove().await
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rows marked `DONE` after the first statement that marked any, per second
/// from that statement to the last (`processed_at` is the statement's
/// transaction time); fails unless exactly `rows` rows are `DONE`.
async fn done_rate(conn: &mut AsyncPgConnection, rows: usize) -> Result<f64> {
    let span: Span = diesel::sql_query(
        "SELECT count(*) AS done,
                count(*) FILTER (WHERE processed_at = (SELECT min(processed_at) FROM outbox_event)) AS first,
                extract(epoch FROM max(processed_at) - min(processed_at))::float8 AS seconds
         FROM outbox_event WHERE status = 'DONE'",
    )
    .get_result(conn)
    .await?;
    if span.done != rows as i64 {
        bail!("{} of {rows} rows DONE", span.done);
    }
    if span.seconds <= 0.0 {
        bail!("every row was marked DONE by one statement: use more rows");
    }
    Ok((span.done - span.first) as f64 / span.seconds)
}

/// The statement of the `sql_only` baseline: claim 100 due rows through the
/// claim index and mark them `DONE`, in one statement.
const CLAIM_AND_DONE_SQL: &str = "\
WITH due AS (
    SELECT id FROM outbox_event
    WHERE status IN ('PENDING', 'PROCESSING')
      AND (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END) <= now()
    ORDER BY (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END)
    LIMIT 100
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_event
SET status = 'DONE', processed_at = now(), locked_until = NULL, target_queue = 'baseline'
WHERE id = ANY(ARRAY(SELECT id FROM due))";

async fn sql_only_rate(url: &str, conn: &mut AsyncPgConnection, rows: usize) -> Result<f64> {
    conn.batch_execute("TRUNCATE outbox_event").await?;
    preload_pending(conn, rows, &HANDOFF_TYPES).await?;
    let clients = (0..2).map(|_| async {
        let mut conn = AsyncPgConnection::establish(url).await?;
        while diesel::sql_query(CLAIM_AND_DONE_SQL)
            .execute(&mut conn)
            .await?
            > 0
        {}
        Ok::<_, anyhow::Error>(())
    });
    futures::future::try_join_all(clients).await?;
    done_rate(conn, rows).await
}

async fn redis_only_rate(run: &Run, conn: &mut AsyncPgConnection, rows: usize) -> Result<f64> {
    conn.batch_execute("TRUNCATE outbox_event").await?;
    clear_redis(&run.found.redis_url, &run.prefix()).await?;
    preload_pending(conn, rows, &HANDOFF_TYPES).await?;
    let events: Vec<OutboxEvent> = diesel::sql_query("SELECT * FROM outbox_event")
        .load(conn)
        .await?;
    let router = Router::standard();
    let mut by_queue: BTreeMap<&str, Vec<OutboxJob>> = BTreeMap::new();
    for event in &events {
        let queue = router
            .route(&event.event_type)
            .with_context(|| format!("no route for {}", event.event_type))?;
        by_queue
            .entry(queue)
            .or_default()
            .push(OutboxJob::from_event(event));
    }
    let units: Vec<(&str, &[OutboxJob])> = by_queue
        .iter()
        .flat_map(|(queue, jobs)| jobs.chunks(500).map(move |chunk| (*queue, chunk)))
        .collect();
    let redis = outbox_queue::connect(&RedisSettings::new(&run.found.redis_url))?;
    let namespace = QueueNamespace::prefixed(run.prefix());
    let started = Instant::now();
    let pushed: Vec<usize> = futures::stream::iter(units)
        .map(|(queue, jobs)| {
            let mut redis = redis.clone();
            let namespace = &namespace;
            async move {
                push_jobs(&mut redis, namespace, queue, jobs)
                    .await
                    .map(|report| report.new)
            }
        })
        .buffer_unordered(10)
        .try_collect()
        .await?;
    let elapsed = started.elapsed();
    let new: usize = pushed.iter().sum();
    if new != rows {
        bail!("{new} of {rows} jobs pushed as new");
    }
    Ok(rows as f64 / elapsed.as_secs_f64())
}

/// One measurement: preload, run the worker until every row is DONE, stop it.
async fn measure(
    run: &Run,
    url: &str,
    conn: &mut AsyncPgConnection,
    binary: &PathBuf,
    batch: u32,
    rows: usize,
) -> Result<f64> {
    conn.batch_execute("TRUNCATE outbox_event").await?;
    clear_redis(&run.found.redis_url, &run.prefix()).await?;
    preload_pending(conn, rows, &HANDOFF_TYPES).await?;
    let mut child = spawn_worker(run, url, binary, batch)?;
    let finished = wait_until_done(conn, &mut child).await;
    stop(child)?;
    finished?;
    done_rate(conn, rows).await
}

/// Starts `binary` (a `worker-general`) on the run's scratch database and
/// Redis prefix, with the dispatcher on at batch size `batch`.
pub fn spawn_worker(run: &Run, url: &str, binary: &PathBuf, batch: u32) -> Result<Child> {
    Command::new(binary)
        .env("DATABASE_URL", url)
        .env("REDIS_URL", &run.found.redis_url)
        .env("OUTBOX_QUEUE_PREFIX", run.prefix())
        .env("OUTBOX_DISPATCHER_ENABLED", "true")
        .env("OUTBOX_DISPATCH_BATCH_SIZE", batch.to_string())
        .env("WORKER_HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))
}

async fn wait_until_done(conn: &mut AsyncPgConnection, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(status) = child.try_wait()? {
            bail!("the worker exited early ({status})");
        }
        // Walks the claim index, which holds only PENDING and PROCESSING rows.
        let progress: Progress = diesel::sql_query(
            "SELECT count(*) AS open FROM (
                 SELECT 1 FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING') LIMIT 1
             ) AS any_open",
        )
        .get_result(conn)
        .await?;
        if progress.open == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the backlog was not handed off within 10 minutes");
        }
    }
}

/// SIGTERM, then wait for the graceful stop.
pub fn stop(mut child: Child) -> Result<()> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait()?;
    Ok(())
}
