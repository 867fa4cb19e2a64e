//! `cargo xtask bench --only handoff`: how fast 1, 2 or 4 `worker-general`
//! processes hand a preloaded backlog over to Redis, per
//! `OUTBOX_DISPATCH_BATCH_SIZE`.
//!
//! Each measurement starts from the same state: `rows` due `PENDING` rows on
//! five queues that no `worker-general` handler consumes (so the figure is
//! the hand-off alone: claim, push, DONE), statistics taken before the
//! dispatcher starts, an empty Redis prefix. The worker processes run with
//! the dispatcher on and the batch size under test until every row is
//! `DONE`.
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
//! interleaved (every binary and process count at one batch size, then the
//! next size, for each round) so that the load of a shared machine falls on
//! all of them alike.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures::{StreamExt, TryStreamExt};
use outbox_model::OutboxEvent;
use outbox_queue::{OutboxJob, QueueNamespace, RedisSettings, push_jobs};
use serde_json::json;

use crate::bench::kit::{Run, Scratch, clear_redis, preload_pending, preload_pending_due_in};
use crate::bench::process::Cpu;

/// Event types on five queues that `worker-general` does not consume
/// (mail, webhook, search index, RAG index, marketing).
pub const HANDOFF_TYPES: [&str; 5] = [
    "mail.user.welcome",
    "webhook.order.created",
    "search.index.product.updated",
    "rag.index.document.updated",
    "marketing.lead.created",
];

/// This stage's name, and its Redis key prefix under the run's.
const STAGE: &str = "handoff";

/// What to measure.
pub struct Handoff {
    /// `(label, worker-general binary)` pairs.
    pub binaries: Vec<(String, PathBuf)>,
    /// Preloaded rows per measurement.
    pub rows: usize,
    /// `OUTBOX_DISPATCH_BATCH_SIZE` values.
    pub batch_sizes: Vec<u32>,
    /// How many `worker-general` processes dispatch at once.
    pub processes: Vec<usize>,
    /// Rounds over every (batch size, binary).
    pub rounds: usize,
    /// When the backlog falls due for the processes.
    pub start: Start,
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
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    let mut rates = Rates::default();
    let total =
        plan.rounds * (plan.batch_sizes.len() * plan.processes.len() * plan.binaries.len() + 2);
    let mut step = 0;
    let mut progress = |what: &str, round: usize| {
        step += 1;
        crate::bench::kit::stage(&format!(
            "handoff {step}/{total}: {what}, round {round}, {} rows",
            plan.rows
        ));
    };
    for round in 1..=plan.rounds {
        let at = Round {
            run,
            plan,
            url: &scratch.url,
            round,
        };
        measure_round(&at, &mut conn, &mut progress, &mut rates).await?;
    }
    for summary in summaries(plan, rates) {
        crate::bench::kit::line(summary);
    }
    drop(conn);
    clear_redis(&run.found.redis_url, &run.stage_prefix(STAGE)).await?;
    scratch.remove().await
}

/// The rates measured so far: each configuration's per round, and the
/// baselines'.
#[derive(Default)]
struct Rates {
    /// `(label, batch size, processes, rate)`.
    configurations: Vec<(String, u32, usize, f64)>,
    sql_only: Vec<f64>,
    redis_only: Vec<f64>,
}

/// Where a round measures.
struct Round<'a> {
    run: &'a Run,
    plan: &'a Handoff,
    url: &'a str,
    round: usize,
}

/// One round: both baselines, then every configuration, a JSON line each.
async fn measure_round(
    at: &Round<'_>,
    conn: &mut AsyncPgConnection,
    progress: &mut impl FnMut(&str, usize),
    rates: &mut Rates,
) -> Result<()> {
    let Round {
        run,
        plan,
        url,
        round,
    } = *at;
    progress("baseline sql_only", round);
    let rate = sql_only_rate(url, conn, plan.rows).await?;
    crate::bench::kit::line(json!({
        "bench": "handoff_baseline_sql_only", "round": round,
        "events": plan.rows, "per_second": rate.round(),
    }));
    rates.sql_only.push(rate);
    progress("baseline redis_only", round);
    let rate = redis_only_rate(run, conn, plan.rows).await?;
    crate::bench::kit::line(json!({
        "bench": "handoff_baseline_redis_only", "round": round,
        "events": plan.rows, "per_second": rate.round(),
    }));
    rates.redis_only.push(rate);
    for &batch in &plan.batch_sizes {
        for &processes in &plan.processes {
            for (label, binary) in &plan.binaries {
                progress(
                    &format!("{label}, batch {batch}, {processes} process(es)"),
                    round,
                );
                let setup = Setup {
                    binary,
                    batch,
                    processes,
                    rows: plan.rows,
                    stage: STAGE,
                    start: plan.start,
                };
                let measured = measure(run, url, conn, &setup).await.with_context(|| {
                    format!("{label} at batch {batch}, {processes} process(es)")
                })?;
                crate::bench::kit::line(json!({
                    "bench": "handoff", "binary": label, "batch_size": batch,
                    "processes": processes, "start": plan.start.name(), "round": round, "events": plan.rows,
                    "per_second": measured.rate.round(), "cpu_share": measured.cpu,
                    "work": measured.work,
                }));
                rates
                    .configurations
                    .push((label.clone(), batch, processes, measured.rate));
            }
        }
    }
    Ok(())
}

/// The summary lines: the baselines' medians, then each configuration's
/// median, range and ratios to the baselines.
fn summaries(plan: &Handoff, rates: Rates) -> Vec<serde_json::Value> {
    let sql_only = median(rates.sql_only);
    let redis_only = median(rates.redis_only);
    let mut lines = vec![json!({
        "bench": "handoff_baselines_median", "rounds": plan.rounds,
        "sql_only_per_second": sql_only.round(), "redis_only_per_second": redis_only.round(),
    })];
    for &batch in &plan.batch_sizes {
        for &processes in &plan.processes {
            for (label, _) in &plan.binaries {
                let found: Vec<f64> = rates
                    .configurations
                    .iter()
                    .filter(|(l, b, p, _)| l == label && *b == batch && *p == processes)
                    .map(|(_, _, _, r)| *r)
                    .collect();
                let (min, max) = (
                    found.iter().copied().fold(f64::INFINITY, f64::min),
                    found.iter().copied().fold(0.0, f64::max),
                );
                let rate = median(found);
                lines.push(json!({
                    "bench": "handoff_median", "binary": label, "batch_size": batch,
                    "processes": processes, "rounds": plan.rounds, "per_second": rate.round(),
                    "min": min.round(), "max": max.round(),
                    "ratio_to_sql_only": ratio(rate, sql_only),
                    "ratio_to_redis_only": ratio(rate, redis_only),
                }));
            }
        }
    }
    lines
}

/// `value / base`, rounded to two decimals.
pub fn ratio(value: f64, base: f64) -> f64 {
    (value / base * 100.0).round() / 100.0
}

/// The median of `values` (the upper one of an even count; NaN if empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rows marked `DONE` after the first statement that marked any, per second
/// from that statement to the last (`processed_at` is the statement's
/// transaction time); fails unless exactly `rows` rows are `DONE`.
pub async fn done_rate(conn: &mut AsyncPgConnection, rows: usize) -> Result<f64> {
    done_rate_where(conn, rows, "TRUE").await
}

/// [`done_rate`] over the `DONE` rows that also match `filter` (an SQL
/// condition on `outbox_event`).
pub async fn done_rate_where(
    conn: &mut AsyncPgConnection,
    rows: usize,
    filter: &str,
) -> Result<f64> {
    let span: Span = diesel::sql_query(format!(
        "WITH done AS (SELECT processed_at FROM outbox_event WHERE status = 'DONE' AND ({filter}))
         SELECT count(*) AS done,
                count(*) FILTER (WHERE processed_at = (SELECT min(processed_at) FROM done)) AS first,
                coalesce(extract(epoch FROM max(processed_at) - min(processed_at)), 0)::float8
                    AS seconds
         FROM done"
    ))
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

/// The statement of the `sql_only` baseline: claim 100 due rows as the
/// dispatcher's claim chooses them (through the claim index, level by
/// level) and mark them `DONE`, in one statement.
fn claim_and_done_sql() -> String {
    format!(
        "{}
UPDATE outbox_event
SET status = 'DONE', processed_at = now(), locked_until = NULL, target_queue = 'baseline'
WHERE id = ANY(ARRAY(SELECT id FROM due))",
        outbox_store::CLAIM_DUE_IDS_SQL.replace("$1", "100")
    )
}

async fn sql_only_rate(url: &str, conn: &mut AsyncPgConnection, rows: usize) -> Result<f64> {
    conn.batch_execute("TRUNCATE outbox_event").await?;
    preload_pending(conn, rows, &HANDOFF_TYPES).await?;
    let sql = claim_and_done_sql();
    let clients = (0..2).map(|_| async {
        let mut conn = outbox_pg::establish(url).await?;
        while diesel::sql_query(&sql).execute(&mut conn).await? > 0 {}
        Ok::<_, anyhow::Error>(())
    });
    futures::future::try_join_all(clients).await?;
    done_rate(conn, rows).await
}

async fn redis_only_rate(run: &Run, conn: &mut AsyncPgConnection, rows: usize) -> Result<f64> {
    conn.batch_execute("TRUNCATE outbox_event").await?;
    clear_redis(&run.found.redis_url, &run.stage_prefix(STAGE)).await?;
    preload_pending(conn, rows, &HANDOFF_TYPES).await?;
    let events: Vec<OutboxEvent> = diesel::sql_query("SELECT * FROM outbox_event")
        .load(conn)
        .await?;
    let router = outbox_catalog::standard_router()?;
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
    let namespace = QueueNamespace::prefixed(run.stage_prefix(STAGE));
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

/// One hand-off configuration.
pub(crate) struct Setup<'a> {
    /// The `worker-general` binary.
    pub binary: &'a PathBuf,
    /// `OUTBOX_DISPATCH_BATCH_SIZE`.
    pub batch: u32,
    /// Processes started at once.
    pub processes: usize,
    /// Preloaded rows.
    pub rows: usize,
    /// The stage measuring (its Redis key prefix).
    pub stage: &'a str,
    /// When the backlog falls due for the processes.
    pub start: Start,
}

/// When a hand-off's backlog falls due for the processes measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Start {
    /// The rows are due as the processes start, so their start-up (pools,
    /// the Redis checks, the guard's first check, one after another) runs
    /// during the hand-off: a restart with a backlog waiting.
    Together,
    /// The rows fall due [`RUNNING_DUE_IN`] after they are written, by
    /// when every process's dispatcher listens for wake-ups: the hand-off
    /// of processes already running when a backlog arrives.
    Running,
}

impl Start {
    /// Its name in the bench's lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Together => "together",
            Self::Running => "running",
        }
    }
}

/// With [`Start::Running`], how long after the preload's `INSERT` the rows
/// fall due: the preload's own `VACUUM ANALYZE`, then every process's start.
pub const RUNNING_DUE_IN: Duration = Duration::from_secs(10);

/// What one hand-off measurement saw.
pub(crate) struct Measured {
    /// Rows per second (see [`done_rate`]).
    pub rate: f64,
    /// `cpu_share` over the hand-off.
    pub cpu: serde_json::Value,
    /// Where the work went, per handed-off row (see [`Counters`]).
    pub work: serde_json::Value,
}

/// One measurement: preload, run the workers until every row is DONE, stop
/// them.
pub(crate) async fn measure(
    run: &Run,
    url: &str,
    conn: &mut AsyncPgConnection,
    setup: &Setup<'_>,
) -> Result<Measured> {
    let prefix = run.stage_prefix(setup.stage);
    clear_redis(&run.found.redis_url, &prefix).await?;
    let due_in = (setup.start == Start::Running).then_some(RUNNING_DUE_IN);
    reset_backlog_due_in(conn, setup.rows, due_in).await?;
    let vars = [("OUTBOX_DISPATCH_BATCH_SIZE", setup.batch.to_string())];
    let mut counted = Counters::read(conn).await?;
    let mut children = crate::bench::process::spawn_many(
        run,
        (url, &prefix),
        setup.binary,
        &vars,
        setup.processes,
    )?;
    if due_in.is_some() {
        if let Err(e) = wait_until_running(conn, &mut children, setup.processes).await {
            crate::bench::process::stop_all(children)?;
            return Err(e);
        }
        counted = Counters::read(conn).await?;
    }
    let before = Cpu::sample(&children);
    let finished = wait_until_done(conn, &mut children).await;
    let after = Cpu::sample(&children);
    crate::bench::process::stop_all(children)?;
    finished?;
    // The stopped workers' backends report their statistics as they exit:
    // wait until they are gone (at most 5 s).
    let deadline = Instant::now() + Duration::from_secs(5);
    while others_connected(conn).await? > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let work = counted.per_row(&Counters::read(conn).await?, setup.rows, (&before, &after));
    Ok(Measured {
        rate: done_rate(conn, setup.rows).await?,
        cpu: before.shares(&after),
        work,
    })
}

/// Counters of the scratch database's statistics (`pg_stat_*`), read before
/// and after a hand-off: the difference says how the claim spent its work.
#[derive(QueryableByName)]
pub(crate) struct Counters {
    /// Scans of the claim index (one per priority level a claim reads; the
    /// bench's own progress query adds one every 100 ms).
    #[diesel(sql_type = BigInt)]
    scans: i64,
    /// Claim index entries read: the rows claimed, and those a claim
    /// stepped over (locked by another claim, or dead versions).
    #[diesel(sql_type = BigInt)]
    entries: i64,
    /// Committed transactions in the database (each of the dispatcher's
    /// statements is one).
    #[diesel(sql_type = BigInt)]
    commits: i64,
    /// The server's write-ahead log position, in bytes (every database's
    /// writes: the figure is this hand-off's only on an otherwise idle
    /// server).
    #[diesel(sql_type = BigInt)]
    wal: i64,
}

impl Counters {
    /// Reads the counters now (after the statistics of ended sessions
    /// arrived).
    pub async fn read(conn: &mut AsyncPgConnection) -> Result<Self> {
        conn.batch_execute("SELECT pg_stat_clear_snapshot()")
            .await?;
        Ok(diesel::sql_query(
            "SELECT (SELECT coalesce(sum(idx_scan), 0)::int8 FROM pg_stat_user_indexes
                     WHERE indexrelname = 'outbox_event_claimable_idx') AS scans,
                    (SELECT coalesce(sum(idx_tup_read), 0)::int8 FROM pg_stat_user_indexes
                     WHERE indexrelname = 'outbox_event_claimable_idx') AS entries,
                    (SELECT xact_commit FROM pg_stat_database
                     WHERE datname = current_database()) AS commits,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8 AS wal",
        )
        .get_result(conn)
        .await?)
    }

    /// The work between `self` and `later`, per `rows` handed off, with
    /// the context switches of the two CPU samples: claim index scans and
    /// statements per 1,000 rows, index entries read and bytes of
    /// write-ahead log per row, and the context switches of the workers
    /// and of Postgres per 1,000 rows.
    pub fn per_row(&self, later: &Self, rows: usize, cpu: (&Cpu, &Cpu)) -> serde_json::Value {
        let per =
            |n: i64, unit: f64| (n as f64 / rows.max(1) as f64 * unit * 100.0).round() / 100.0;
        let (workers, postgres) = cpu.0.switches(cpu.1);
        json!({
            "claim_index_scans_per_1000": per(later.scans - self.scans, 1000.0),
            "claim_index_entries_per_row": per(later.entries - self.entries, 1.0),
            "statements_per_1000": per(later.commits - self.commits, 1000.0),
            "wal_bytes_per_row": per(later.wal - self.wal, 1.0).round(),
            "worker_switches_per_1000": per(workers as i64, 1000.0),
            "postgres_switches_per_1000": per(postgres as i64, 1000.0),
        })
    }
}

/// Other sessions connected to this database (the stopped workers'
/// backends until they have exited).
async fn others_connected(conn: &mut AsyncPgConnection) -> Result<i64> {
    #[derive(QueryableByName)]
    struct Others {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let others: Others = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .get_result(conn)
    .await?;
    Ok(others.n)
}

/// Empties the table and preloads `rows` due rows on the queues of
/// [`HANDOFF_TYPES`]: where every hand-off measurement starts. The Redis
/// guard's memory goes too: the measurement's Redis prefix starts empty,
/// and a guard that remembered the marker of the measurement before would
/// take it for a lost Redis and reconcile during the hand-off.
pub async fn reset_backlog(conn: &mut AsyncPgConnection, rows: usize) -> Result<()> {
    reset_backlog_due_in(conn, rows, None).await
}

/// As [`reset_backlog`], the rows falling due `due_in` from now when given.
async fn reset_backlog_due_in(
    conn: &mut AsyncPgConnection,
    rows: usize,
    due_in: Option<Duration>,
) -> Result<()> {
    conn.batch_execute("TRUNCATE outbox_event, outbox_redis_epoch, outbox_redis_safe_point")
        .await?;
    preload_pending_due_in(conn, rows, &HANDOFF_TYPES, due_in).await
}

/// With [`Start::Running`]: waits until each of the `processes` has its
/// dispatcher's listening connection open, then until the backlog is due.
/// Fails when a process exits, or when the rows fell due before every
/// process listened (a machine too busy to start them within
/// [`RUNNING_DUE_IN`]): that hand-off would not be one of running processes.
async fn wait_until_running(
    conn: &mut AsyncPgConnection,
    children: &mut [Child],
    processes: usize,
) -> Result<()> {
    #[derive(QueryableByName)]
    struct Ready {
        #[diesel(sql_type = BigInt)]
        listening: i64,
        /// Milliseconds until the first row is due (negative once due).
        #[diesel(sql_type = Double)]
        due_in_ms: f64,
    }
    loop {
        crate::bench::process::check_running(children)?;
        let ready: Ready = diesel::sql_query(
            "SELECT (SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = $1) AS listening,
                    (SELECT extract(epoch FROM min(scheduled_at) - clock_timestamp()) * 1000
                     FROM outbox_event)::float8 AS due_in_ms",
        )
        .bind::<diesel::sql_types::Text, _>(outbox_dispatch::LISTENER_APPLICATION_NAME)
        .get_result(conn)
        .await?;
        let listening = usize::try_from(ready.listening).unwrap_or(0);
        if ready.due_in_ms <= 0.0 {
            bail!(
                "the backlog fell due with {listening} of {processes} dispatchers listening: \
                 the processes took longer than {RUNNING_DUE_IN:?} to start (a busy machine?)"
            );
        }
        if listening >= processes {
            tokio::time::sleep(Duration::from_secs_f64(ready.due_in_ms / 1000.0)).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no row is PENDING or PROCESSING, while every worker runs.
pub async fn wait_until_done(conn: &mut AsyncPgConnection, children: &mut [Child]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        crate::bench::process::check_running(children)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summaries_give_each_configuration_its_median_and_ratios() {
        let plan = Handoff {
            binaries: vec![("this".to_owned(), PathBuf::from("w"))],
            rows: 10,
            batch_sizes: vec![500],
            processes: vec![1],
            rounds: 3,
            start: Start::Together,
        };
        let rates = Rates {
            configurations: vec![
                ("this".to_owned(), 500, 1, 30.0),
                ("this".to_owned(), 500, 1, 10.0),
                ("this".to_owned(), 500, 1, 20.0),
            ],
            sql_only: vec![40.0, 40.0, 40.0],
            redis_only: vec![80.0, 80.0, 80.0],
        };
        let lines = summaries(&plan, rates);
        assert_eq!(lines[0]["sql_only_per_second"], json!(40.0));
        assert_eq!(
            lines[1],
            json!({
                "bench": "handoff_median", "binary": "this", "batch_size": 500,
                "processes": 1, "rounds": 3, "per_second": 20.0,
                "min": 10.0, "max": 30.0,
                "ratio_to_sql_only": 0.5, "ratio_to_redis_only": 0.25,
            })
        );
    }
}
