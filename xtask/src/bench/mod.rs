//! `cargo xtask bench`: performance figures as JSON lines on stdout, a
//! progress line per stage on stderr.
//!
//! Runs against the services `cargo xtask services` finds, in fresh scratch
//! databases (`outbox_bench`, `outbox_bench_handoff`, and one per stage of
//! the real workers: `outbox_bench_drain_audit`, `outbox_bench_latency`,
//! `outbox_bench_priority`, `outbox_bench_publish`, `outbox_bench_retention`, `outbox_bench_soak`,
//! `outbox_bench_peers`, `outbox_bench_scaling`, `outbox_bench_scaling_drain`) and an `outbox-bench:`
//! Redis prefix (all removed first). `--chart FILE` draws the run's lines as
//! an SVG. Each line is one measurement:
//! `{"bench": …, "events": …, "seconds": …, "per_second": …}`, latency
//! percentiles in milliseconds, or a median with its ratio to the baselines.
//! Numbers from a shared machine are noisy: compare runs on the same host,
//! and measurements in one run.
//!
//! The figures are the product's only from a release build: started from a
//! debug build (the `cargo xtask` alias), the command builds and runs the
//! release build of itself. `--smoke` runs every stage at tiny sizes in any
//! build, with names unique to the process: `cargo xtask test` does that so
//! the bench never rots; no timing is checked.

mod chart;
mod cluster;
mod console;
mod drain;
mod drain_audit;
pub(crate) mod handoff;
pub(crate) mod kit;
mod latency;
pub(crate) mod open_loop;
mod ordering;
mod partitioned;
mod peers;
mod priority;
mod process;
mod publish;
mod retention;
mod scaling;
mod soak;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_dispatch::{Dispatcher, DispatcherConfig};
use outbox_publish::{
    NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event, publish_outbox_events,
};
use outbox_queue::{QueueNamespace, RedisSettings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::services;
use kit::{Run, Scratch, clear_redis, line, printed, rate, stage};

fn event(n: usize) -> NewOutboxEvent {
    let types = [
        "mail.user.welcome",
        "webhook.order.created",
        "audit.user.login",
        "billing.invoice.paid",
    ];
    NewOutboxEvent::new(
        format!("tenant-{}", n % 17),
        types[n % types.len()],
        json!({ "n": n, "note": "benchmark" }),
    )
}

async fn count_open(conn: &mut AsyncPgConnection) -> Result<i64> {
    Ok(outbox_store::unfinished_count(conn).await?)
}

/// The benchmarks of the dispatch pipeline; they run in this order, each on
/// what the one before left.
const PIPELINE: [&str; 5] = [
    "publish_one_per_transaction",
    "publish_batch_1000",
    "dispatch_4_dispatchers_batch_500",
    "tick_500_over_42000_done_rows",
    "publish_to_done_latency_ms",
];

/// Options of `cargo xtask bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Run only the benchmarks whose name starts with this (e.g.
    /// `queue_drain`; `peers` for this project next to River for Rust).
    #[arg(long)]
    pub only: Option<String>,
    /// A `worker-general` binary for the hand-off stage, as `label=path`;
    /// repeat to compare builds in one run. Default: this tree's release
    /// build, built first.
    #[arg(long = "handoff-bin", value_name = "LABEL=PATH")]
    pub handoff_bins: Vec<String>,
    /// A `worker-general` binary for the `drain_audit` stage, as
    /// `label=path`; repeat to compare builds in one run (their rounds are
    /// interleaved, so that the machine's load falls on each alike).
    /// Default: the first `--handoff-bin`, else this tree's release build.
    #[arg(long = "drain-bin", value_name = "LABEL=PATH")]
    pub drain_bins: Vec<String>,
    /// Rounds of the `drain_audit` stage (the median is reported).
    #[arg(long, default_value_t = 1)]
    pub drain_rounds: usize,
    /// Preloaded rows per hand-off measurement.
    #[arg(long, default_value_t = 200_000)]
    pub handoff_rows: usize,
    /// `OUTBOX_DISPATCH_BATCH_SIZE` values of the hand-off stage.
    #[arg(long, value_delimiter = ',', default_values_t = [500])]
    pub handoff_batch_sizes: Vec<u32>,
    /// Numbers of `worker-general` processes dispatching at once in the
    /// hand-off stage.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    pub handoff_processes: Vec<usize>,
    /// Write an SVG chart of the run's figures to this file.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// Rounds of the hand-off stage (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub handoff_rounds: usize,
    /// When the hand-off stage's backlog falls due: `together` (as the
    /// processes start) or `running` (once every process's dispatcher
    /// listens), as in the scaling stage.
    #[arg(long, value_enum, default_value_t = handoff::Start::Together)]
    pub handoff_start: handoff::Start,
    /// Offered loads of the latency stage, events per second.
    #[arg(long, value_delimiter = ',', default_values_t = [500, 1_000, 2_000])]
    pub latency_loads: Vec<u32>,
    /// The latency stage runs with wake-ups on only, not polling only too.
    #[arg(long)]
    pub latency_wakeups_only: bool,
    /// Events per second of the soak stage.
    #[arg(long, default_value_t = 500)]
    pub soak_rate: usize,
    /// Length of the soak stage, in seconds.
    #[arg(long, default_value_t = 600)]
    pub soak_seconds: u64,
    /// Arms of the `publish_overhead` stage: `default` (the publisher, its
    /// SQL alone, the SQL into a copy of the table without its checks and
    /// triggers) or `all` (then also one copy of the table per check,
    /// column rule, insert trigger and index, without that piece, and the
    /// store's insert without the publisher).
    #[arg(long, value_enum, default_value = "default")]
    pub publish_arms: publish::Arms,
    /// Offered loads of the peers stage, events per second.
    #[arg(long, value_delimiter = ',', default_values_t = [500, 2_000])]
    pub peer_loads: Vec<u32>,
    /// Length of each load of the peers stage, in seconds.
    #[arg(long, default_value_t = 20)]
    pub peer_seconds: u64,
    /// Jobs in each drain of the peers stage.
    #[arg(long, default_value_t = 50_000)]
    pub peer_drain_jobs: usize,
    /// Rounds of the peers stage (the summary gives the medians).
    #[arg(long, default_value_t = 1)]
    pub peer_rounds: usize,
    /// The peers stage without River's arms: this project's figures alone,
    /// for comparing builds of this project.
    #[arg(long)]
    pub peer_without_river: bool,
    /// Events in the table of the console stage.
    #[arg(long, default_value_t = 1_000_000)]
    pub console_rows: usize,
    /// Measured requests per page of the console stage.
    #[arg(long, default_value_t = 5)]
    pub console_requests: usize,
    /// Workflow runs in the tables of the console stage (its workflow pages).
    #[arg(long, default_value_t = 200_000)]
    pub console_runs: usize,
    /// Preloaded rows per hand-off of the cluster stage.
    #[arg(long, default_value_t = 50_000)]
    pub cluster_rows: usize,
    /// Jobs per drain of the cluster stage.
    #[arg(long, default_value_t = 50_000)]
    pub cluster_jobs: usize,
    /// Rounds of the cluster stage (the summary gives the medians).
    #[arg(long, default_value_t = 3)]
    pub cluster_rounds: usize,
    /// Old DONE rows in each arm's table of the partitioned stage.
    #[arg(long, default_value_t = 10_000_000)]
    pub partition_rows: usize,
    /// Days the partitioned stage's old rows span (a partition each).
    #[arg(long, default_value_t = 10)]
    pub partition_days: u32,
    /// Due rows per hand-off of the partitioned stage.
    #[arg(long, default_value_t = 100_000)]
    pub partition_backlog: usize,
    /// Rounds of the partitioned stage (each round's retention removes a day).
    #[arg(long, default_value_t = 3)]
    pub partition_rounds: usize,
    /// Process counts of the scaling stage's hand-off.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    pub scaling_handoff_processes: Vec<usize>,
    /// When the scaling stage's hand-off backlog falls due: `together` (as
    /// the processes start, so their start-up runs during the hand-off) and
    /// `running` (once every process's dispatcher listens).
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [handoff::Start::Together, handoff::Start::Running])]
    pub scaling_start: Vec<handoff::Start>,
    /// Process counts of the scaling stage's end-to-end drain.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    pub scaling_drain_processes: Vec<usize>,
    /// Preloaded rows per hand-off of the scaling stage.
    #[arg(long, default_value_t = 200_000)]
    pub scaling_rows: usize,
    /// Audit events per drain of the scaling stage.
    #[arg(long, default_value_t = 50_000)]
    pub scaling_drain_events: usize,
    /// Rounds of the scaling stage (the summary gives the medians).
    #[arg(long, default_value_t = 3)]
    pub scaling_rounds: usize,
    /// Every stage at tiny sizes (the `--handoff-*` sizes are ignored), in
    /// whatever build runs it: checks that the bench still works (`cargo
    /// xtask test` runs it); the figures mean nothing.
    #[arg(long)]
    pub smoke: bool,
}

impl BenchArgs {
    /// The smoke run of `cargo xtask test`: every stage, tiny sizes (the
    /// sizes of a smoke run are fixed; the `handoff_*` values are ignored).
    pub fn smoke() -> Self {
        Self {
            only: None,
            handoff_bins: Vec::new(),
            drain_bins: Vec::new(),
            drain_rounds: 0,
            handoff_rows: 0,
            handoff_batch_sizes: Vec::new(),
            handoff_processes: Vec::new(),
            chart: None,
            handoff_rounds: 0,
            handoff_start: handoff::Start::Together,
            latency_loads: Vec::new(),
            latency_wakeups_only: false,
            soak_rate: 0,
            soak_seconds: 0,
            publish_arms: publish::Arms::All,
            peer_loads: Vec::new(),
            peer_seconds: 0,
            peer_drain_jobs: 0,
            peer_without_river: false,
            console_rows: 0,
            console_requests: 0,
            console_runs: 0,
            cluster_rows: 0,
            cluster_jobs: 0,
            cluster_rounds: 0,
            partition_rows: 0,
            partition_days: 0,
            partition_backlog: 0,
            partition_rounds: 0,
            peer_rounds: 0,
            scaling_handoff_processes: Vec::new(),
            scaling_drain_processes: Vec::new(),
            scaling_rows: 0,
            scaling_drain_events: 0,
            scaling_rounds: 0,
            scaling_start: Vec::new(),
            smoke: true,
        }
    }
}

/// Runs `cargo xtask bench` again as the release build of xtask, with the
/// same arguments: the figures of a debug build are not the product's.
pub fn rerun_in_release() -> Result<()> {
    stage("building the release build of xtask and running the bench with it");
    crate::cmd::run(
        "cargo run --release -p xtask -- bench",
        crate::cmd::cargo()
            .args(["run", "--release", "--quiet", "-p", "xtask", "--"])
            .args(std::env::args_os().skip(1)),
    )
}

/// Runs every benchmark whose name starts with `--only` (all without it).
pub async fn run(args: BenchArgs) -> Result<()> {
    let run = Run::new(services::ensure().await?, args.smoke);
    let only = args.only.as_deref();
    let wants = |name: &str| only.is_none_or(|prefix| name.starts_with(prefix));
    if PIPELINE.iter().any(|name| wants(name)) {
        pipeline(&run).await?;
    }
    let drain_needs_default = wants("drain_audit") && args.drain_bins.is_empty();
    let workers = [
        "handoff",
        "latency",
        "priority",
        "retention",
        "soak",
        "cluster",
        "partitioned",
        "scaling",
    ];
    let binaries = if drain_needs_default || workers.iter().any(|name| wants(name)) {
        handoff_binaries(&args.handoff_bins, args.smoke)?
    } else {
        Vec::new()
    };
    if wants("handoff") {
        let plan = handoff::Handoff {
            binaries: binaries.clone(),
            rows: run.size(args.handoff_rows, 2_000),
            batch_sizes: run.size(args.handoff_batch_sizes.clone(), vec![100, 500]),
            processes: run.size(args.handoff_processes.clone(), vec![2]),
            rounds: run.size(args.handoff_rounds.max(1), 1),
            start: args.handoff_start,
        };
        handoff::run(&run, &plan).await?;
    }
    drain::run(&run, &wants).await?;
    more_stages(&run, &args, &wants, &binaries).await
}

/// The stages of the real workers after the hand-off (drain through the
/// audit subscriber, latency, retention; the first `--handoff-bin` runs
/// them, the `--drain-bin` binaries the drain when given), publish
/// overhead, and the chart.
async fn more_stages(
    run: &Run,
    args: &BenchArgs,
    wants: &dyn Fn(&str) -> bool,
    binaries: &[(String, PathBuf)],
) -> Result<()> {
    let binary = binaries.first().map(|(_, path)| path.as_path());
    if wants("drain_audit") {
        let binaries = if args.drain_bins.is_empty() {
            binaries.iter().take(1).cloned().collect()
        } else {
            labelled_binaries("--drain-bin", &args.drain_bins)?
        };
        let plan = drain_audit::Plan {
            binaries,
            events: run.size(50_000, 1_500),
            rounds: run.size(args.drain_rounds.max(1), 1),
        };
        drain_audit::run(run, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("scaling")) {
        let plan = scaling::Plan {
            binary: binary.to_path_buf(),
            handoff_processes: run.size(args.scaling_handoff_processes.clone(), vec![1, 2]),
            starts: run.size(args.scaling_start.clone(), vec![handoff::Start::Running]),
            rows: run.size(args.scaling_rows, 2_000),
            drain_processes: run.size(args.scaling_drain_processes.clone(), vec![1, 2]),
            events: run.size(args.scaling_drain_events, 1_500),
            rounds: run.size(args.scaling_rounds.max(1), 1),
        };
        scaling::run(run, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("latency")) {
        let plan = latency::Plan {
            loads: run.size(args.latency_loads.clone(), vec![50]),
            wakeups: if args.latency_wakeups_only {
                &[true]
            } else {
                &[true, false]
            },
            duration: run.size(Duration::from_secs(20), Duration::from_secs(1)),
        };
        latency::run(run, binary, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("priority")) {
        let plan = priority::Plan {
            backlog: run.size(100_000, 300),
        };
        priority::run(run, binary, &plan).await?;
    }
    if wants("ordering") {
        ordering::run(run).await?;
    }
    if wants("publish_overhead") {
        let plan = publish::Plan {
            rounds: run.size(3, 1),
            duration: run.size(Duration::from_secs(5), Duration::from_millis(300)),
            arms: args.publish_arms,
            loop_rows: run.size(3_000, 20),
            loop_rounds: run.size(5, 1),
        };
        publish::run(run, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("retention")) {
        let plan = retention::Plan {
            done_rows: run.size(1_000_000, 3_000),
            pending_rows: run.size(200_000, 2_000),
            rounds: run.size(3, 1),
        };
        retention::run(run, binary, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("soak")) {
        let plan = soak::Soak {
            binary: binary.to_path_buf(),
            rate: run.size(args.soak_rate, 100),
            duration: Duration::from_secs(run.size(args.soak_seconds, 5)),
            sample_every: run.size(Duration::from_secs(10), Duration::from_secs(1)),
        };
        soak::run(run, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("cluster")) {
        let plan = cluster::Plan {
            binary: binary.to_path_buf(),
            rows: run.size(args.cluster_rows, 2_000),
            jobs: run.size(args.cluster_jobs, 2_000),
            rounds: run.size(args.cluster_rounds.max(1), 1),
        };
        cluster::run(run, &plan).await?;
    }
    if let Some(binary) = binary.filter(|_| wants("partitioned")) {
        let plan = partitioned::Plan {
            binary: binary.to_path_buf(),
            rows: run.size(args.partition_rows, 3_000),
            days: run.size(args.partition_days, 3),
            backlog: run.size(args.partition_backlog, 1_000),
            rate: run.size(500, 100),
            seconds: run.size(20, 2),
            rounds: run.size(args.partition_rounds.max(1), 1),
        };
        partitioned::run(run, &plan).await?;
    }
    if wants("console") {
        let plan = console::Plan {
            rows: run.size(args.console_rows, 2_000),
            requests: run.size(args.console_requests.max(1), 1),
            runs: run.size(args.console_runs, 1_700),
        };
        console::run(run, &plan).await?;
    }
    if wants("peers") {
        let plan = peers::Plan {
            loads: run.size(args.peer_loads.clone(), vec![50]),
            duration: run.size(
                Duration::from_secs(args.peer_seconds),
                Duration::from_secs(1),
            ),
            drain_jobs: run.size(args.peer_drain_jobs, 500),
            rounds: run.size(args.peer_rounds.max(1), 1),
            // River's cold debug build takes over 3 minutes here: the smoke
            // run (CI) leaves its arms out.
            river: !run.smoke && !args.peer_without_river,
        };
        peers::run(run, &plan).await?;
    }
    write_chart(run, args.chart.as_deref())
}

/// Draws the chart of the lines printed so far into `path`; a smoke run
/// draws it into a temporary file and removes it.
fn write_chart(run: &Run, path: Option<&std::path::Path>) -> Result<()> {
    let printed = printed();
    let title = format!(
        "cargo xtask bench{}, {}",
        if run.smoke { " --smoke" } else { "" },
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    let Some(svg) = chart::render(&printed, &title) else {
        return Ok(());
    };
    match path {
        Some(path) => {
            std::fs::write(path, svg)
                .with_context(|| format!("cannot write {}", path.display()))?;
            stage(&format!("chart written to {}", path.display()));
        }
        None if run.smoke => {
            let scratch = std::env::temp_dir().join(format!("outbox-bench{}.svg", run.tag));
            std::fs::write(&scratch, svg)?;
            std::fs::remove_file(&scratch)?;
        }
        None => {}
    }
    Ok(())
}

/// The `--handoff-bin` binaries, or this tree's `worker-general` (built now:
/// the release build, or for a smoke run the debug one).
fn handoff_binaries(specs: &[String], smoke: bool) -> Result<Vec<(String, PathBuf)>> {
    if specs.is_empty() {
        let mut build = vec!["build", "-p", "outbox-worker", "--bin", "worker-general"];
        if !smoke {
            build.insert(1, "--release");
        }
        crate::cmd::run(
            &format!("cargo {}", build.join(" ")),
            crate::cmd::cargo().args(&build),
        )?;
        let profile = if smoke { "debug" } else { "release" };
        let binary = crate::cmd::target_dir()
            .join(profile)
            .join("worker-general");
        return Ok(vec![("this".to_owned(), binary)]);
    }
    labelled_binaries("--handoff-bin", specs)
}

/// The binaries named by `option` as `label=path`.
fn labelled_binaries(option: &str, specs: &[String]) -> Result<Vec<(String, PathBuf)>> {
    specs
        .iter()
        .map(|spec| {
            let (label, path) = spec
                .split_once('=')
                .with_context(|| format!("{option} {spec}: expected label=path"))?;
            let path = PathBuf::from(path);
            if !path.is_file() {
                bail!("{option} {spec}: no such file");
            }
            Ok((label.to_owned(), path))
        })
        .collect()
}

/// Publishing and dispatching, through Postgres and Redis.
async fn pipeline(run: &Run) -> Result<()> {
    let found = &run.found;
    let prefix = run.stage_prefix("pipeline");
    let scratch = Scratch::create(&found.database_url, run.database("outbox_bench")).await?;
    let url = scratch.url.clone();
    clear_redis(&found.redis_url, &prefix).await?;
    let mut conn = outbox_pg::establish(&url).await?;

    let published = publish_one_per_transaction(run, &mut conn).await?;
    let pending = published + publish_batches(run, &mut conn).await?;

    let pool = outbox_pg::connect_pool(&url, 8).await?;
    let namespace = QueueNamespace::prefixed(prefix.clone());
    let make = |config: DispatcherConfig| -> Result<Arc<Dispatcher>> {
        let redis = outbox_queue::connect(&RedisSettings::new(&found.redis_url))?;
        Ok(Arc::new(Dispatcher::new(
            pool.clone(),
            url.clone(),
            redis,
            namespace.clone(),
            outbox_catalog::standard_router()?,
            config,
        )?))
    };
    dispatch_with_four(&make, &mut conn, pending).await?;
    tick_over_done_rows(run, &make, &mut conn).await?;
    wake_up_latency(run, &make, &mut conn).await?;

    clear_redis(&found.redis_url, &prefix).await?;
    drop(conn);
    scratch.remove().await
}

/// Builds a dispatcher of the pipeline stage with `config`.
type MakeDispatcher<'a> = dyn Fn(DispatcherConfig) -> Result<Arc<Dispatcher>> + 'a;

/// 1. One event per business transaction, one connection; returns how many.
async fn publish_one_per_transaction(run: &Run, conn: &mut AsyncPgConnection) -> Result<usize> {
    stage("publish_one_per_transaction");
    let n = run.size(2_000, 20);
    let started = Instant::now();
    for i in 0..n {
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, event(i)).await
        })
        .await?;
    }
    rate("publish_one_per_transaction", n, started.elapsed());
    Ok(n)
}

/// 2. Batches of 1000 events per transaction; returns how many events.
async fn publish_batches(run: &Run, conn: &mut AsyncPgConnection) -> Result<usize> {
    stage("publish_batch_1000");
    let (batches, batch) = run.size((40, 1_000), (2, 100));
    let started = Instant::now();
    for b in 0..batches {
        let events: Vec<_> = (0..batch).map(|i| event(b * batch + i)).collect();
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, events).await
        })
        .await?;
    }
    rate("publish_batch_1000", batches * batch, started.elapsed());
    Ok(batches * batch)
}

/// 3. Dispatch the `pending` events with four dispatchers.
async fn dispatch_with_four(
    make: &MakeDispatcher<'_>,
    conn: &mut AsyncPgConnection,
    pending: usize,
) -> Result<()> {
    stage("dispatch_4_dispatchers_batch_500");
    let config = DispatcherConfig {
        batch_size: 500,
        listen: false,
        interval: Duration::from_millis(50),
        ..DispatcherConfig::default()
    };
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|_| make(config.clone()).map(|d| d.spawn(shutdown.clone())))
        .collect::<Result<_>>()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while count_open(conn).await? > 0 {
        if Instant::now() > deadline {
            bail!("dispatching did not finish within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rate(
        "dispatch_4_dispatchers_batch_500",
        pending,
        started.elapsed(),
    );
    shutdown.cancel();
    for handle in handles {
        handle.await.context("dispatcher panicked")??;
    }
    Ok(())
}

/// 4. The claim on a table full of DONE rows: one tick of 500 after 42,000 DONE.
async fn tick_over_done_rows(
    run: &Run,
    make: &MakeDispatcher<'_>,
    conn: &mut AsyncPgConnection,
) -> Result<()> {
    stage("tick_500_over_42000_done_rows");
    let events: Vec<_> = (0..run.size(500, 50)).map(event).collect();
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        publish_outbox_events(&tx, events).await
    })
    .await?;
    let single = make(DispatcherConfig {
        batch_size: 500,
        listen: false,
        ..DispatcherConfig::default()
    })?;
    let started = Instant::now();
    let report = single.tick().await?;
    rate(
        "tick_500_over_42000_done_rows",
        report.dispatched,
        started.elapsed(),
    );
    Ok(())
}

/// 5. Wake-up latency: publish, then time until DONE, with a 60 s poll interval.
async fn wake_up_latency(
    run: &Run,
    make: &MakeDispatcher<'_>,
    conn: &mut AsyncPgConnection,
) -> Result<()> {
    stage("publish_to_done_latency_ms");
    let listening = make(DispatcherConfig {
        listen: true,
        interval: Duration::from_secs(60),
        ..DispatcherConfig::default()
    })?;
    let shutdown = CancellationToken::new();
    let handle = listening.spawn(shutdown.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies = Vec::new();
    for i in 0..run.size(50, 3) {
        let started = Instant::now();
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, event(i)).await
        })
        .await?;
        while count_open(conn).await? > 0 {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("a published event was not dispatched within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    shutdown.cancel();
    handle.await.context("dispatcher panicked")??;
    line(latency_line(latencies));
    Ok(())
}

/// The wake-up latency line: the samples' p50, p95 and max in
/// milliseconds, to a tenth.
fn latency_line(mut latencies: Vec<f64>) -> serde_json::Value {
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    json!({ "bench": "publish_to_done_latency_ms", "samples": latencies.len(),
             "p50": (pct(0.5) * 10.0).round() / 10.0, "p95": (pct(0.95) * 10.0).round() / 10.0,
             "max": (pct(1.0) * 10.0).round() / 10.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_line_rounds_its_percentiles_to_a_tenth() {
        let samples = (1..=20).map(|n| f64::from(n) + 0.04).collect();
        assert_eq!(
            latency_line(samples),
            json!({ "bench": "publish_to_done_latency_ms", "samples": 20,
                     "p50": 11.0, "p95": 19.0, "max": 20.0 })
        );
    }
}
