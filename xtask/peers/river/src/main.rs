//! `river-peer`: River for Rust (`riverqueue`) doing the work of
//! `cargo xtask bench --only peers`, so that its figures stand next to
//! this project's from the same run on the same machine. One JSON line per
//! measurement on stdout; progress and River's own errors on stderr.
//!
//! - `drain`: creates River's schema (River's migrations, through the
//!   crate), inserts a backlog of no-op jobs in batches before the client
//!   starts, starts a client with a no-op worker and times from the start
//!   to the last call of the worker (counted in this process), then to
//!   the last job recorded `completed`.
//! - `latency`: starts a client with a no-op worker; publishers (32
//!   connections) commit one job per transaction on an open-loop schedule
//!   (job *i* due at *i* / rate seconds). Each job carries its sequence
//!   number; the publisher notes the wall-clock time right after `COMMIT`
//!   returns, the worker on entry to its function: one process, one clock.
//!
//! Options left out keep River's defaults (fetch cooldown 100 ms, fetch
//! poll interval 1 s); the pool is SQLx's default size (10) unless given.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use riverqueue::migrate::PostgresMigrator;
use riverqueue::sqlx::postgres::PgPoolOptions;
use riverqueue::sqlx::{self, Connection, PgConnection, PgPool};
use riverqueue::{
    BoxError, Client, InsertOpts, Job, JobArgs, QueueConfig, WorkContext, WorkOutcome, Workers,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

// The open-loop load and the latency line's figures, shared with the
// bench's own latency stages (the peer cannot depend on xtask).
#[path = "../../../src/bench/open_loop.rs"]
mod open_loop;

use open_loop::{PUBLISHERS, drain_rates, latency_fields, merge, now_us};

/// The queue the peer's jobs go to.
const QUEUE: &str = "bench";

/// Jobs per `insert_many` of the drain's backlog.
const INSERT_BATCH: usize = 1_000;

#[derive(Parser)]
#[command(
    name = "river-peer",
    about = "River for Rust doing the bench's peer work"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Drains a backlog of no-op jobs inserted before the client starts.
    Drain {
        #[command(flatten)]
        river: RiverOptions,
        /// Jobs in the backlog.
        #[arg(long, default_value_t = 50_000)]
        jobs: usize,
    },
    /// Commit-to-worker latency at a steady offered load.
    Latency {
        #[command(flatten)]
        river: RiverOptions,
        /// Offered load, jobs per second.
        #[arg(long, default_value_t = 500)]
        rate: u32,
        /// How long the load runs, in seconds (fractions allowed).
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
}

/// How the River client is configured.
#[derive(Args, Clone)]
struct RiverOptions {
    /// A Postgres URL; River's schema is created in its database.
    #[arg(long)]
    database_url: String,
    /// Maximum workers of the queue.
    #[arg(long, default_value_t = 1_000)]
    workers: usize,
    /// The client's fetch cooldown in ms (the value every queue uses unless
    /// it sets its own, and the pacing of insert notifications); River's
    /// default (100 ms) when left out.
    #[arg(long)]
    fetch_cooldown_ms: Option<u64>,
    /// The queue's fetch poll interval in ms; River's default (1 s) when
    /// left out.
    #[arg(long)]
    fetch_poll_interval_ms: Option<u64>,
    /// Connections in the client's pool (SQLx's default: 10).
    #[arg(long, default_value_t = 10)]
    pool_size: u32,
}

impl RiverOptions {
    /// The options as they appear in the output line: River's values where
    /// none was given.
    fn json(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "fetch_cooldown_ms": self.fetch_cooldown().as_secs_f64() * 1000.0,
            "fetch_poll_interval_ms": self.fetch_poll_interval().as_secs_f64() * 1000.0,
            "pool_size": self.pool_size,
        })
    }

    fn fetch_cooldown(&self) -> Duration {
        self.fetch_cooldown_ms
            .map_or(riverqueue::FETCH_COOLDOWN_DEFAULT, Duration::from_millis)
    }

    fn fetch_poll_interval(&self) -> Duration {
        self.fetch_poll_interval_ms.map_or(
            riverqueue::FETCH_POLL_INTERVAL_DEFAULT,
            Duration::from_millis,
        )
    }

    /// A pool on the database, with River's schema migrated up.
    async fn pool(&self) -> Result<PgPool> {
        let pool = PgPoolOptions::new()
            .max_connections(self.pool_size)
            .connect(&self.database_url)
            .await
            .with_context(|| format!("cannot connect to {}", self.database_url))?;
        PostgresMigrator::new(pool.clone())
            .migrate_up()
            .await
            .context("River's migrations")?;
        Ok(pool)
    }

    /// A client on `pool` working [`QUEUE`] with `workers`.
    fn client(&self, pool: PgPool, workers: Workers) -> Result<Client> {
        let mut queue = QueueConfig::new(self.workers);
        if let Some(ms) = self.fetch_poll_interval_ms {
            queue = queue.with_fetch_poll_interval(Duration::from_millis(ms));
        }
        let mut builder = Client::builder(pool).workers(workers).queue(QUEUE, queue);
        if let Some(ms) = self.fetch_cooldown_ms {
            builder = builder.fetch_cooldown(Duration::from_millis(ms));
        }
        Ok(builder.build()?)
    }
}

/// The no-op job: its sequence number and nothing else.
#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
#[river(kind = "bench_noop", queue = "bench")]
struct Noop {
    seq: usize,
}

/// What the worker function shares with the measurement.
struct Seen {
    /// Worker calls so far.
    calls: AtomicUsize,
    /// Calls after which `done` is notified.
    target: usize,
    done: Notify,
    /// The wall-clock time of each sequence number's first call, µs since
    /// the epoch (0 until called).
    entered: Vec<AtomicI64>,
    /// The first and the last call's wall-clock time, µs since the epoch.
    first_us: AtomicI64,
    last_us: AtomicI64,
}

impl Seen {
    fn new(target: usize, slots: usize) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            target,
            done: Notify::new(),
            entered: (0..slots).map(|_| AtomicI64::new(0)).collect(),
            first_us: AtomicI64::new(i64::MAX),
            last_us: AtomicI64::new(0),
        })
    }

    /// Notes the call of job `seq`, now.
    fn enter(&self, seq: usize) {
        let at = now_us();
        if let Some(slot) = self.entered.get(seq) {
            let _ = slot.compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.first_us.fetch_min(at, Ordering::Relaxed);
        self.last_us.fetch_max(at, Ordering::Relaxed);
        if self.calls.fetch_add(1, Ordering::AcqRel) + 1 == self.target {
            self.done.notify_one();
        }
    }
}

/// The no-op worker, noting each call in `seen`.
fn workers(seen: &Arc<Seen>) -> Result<Workers> {
    let mut workers = Workers::new();
    let seen = Arc::clone(seen);
    workers.add_fn(move |_: WorkContext, job: Job<Noop>| {
        seen.enter(job.args.seq);
        async { Ok::<_, BoxError>(WorkOutcome::Complete) }
    })?;
    Ok(workers)
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Drain { river, jobs } => drain(&river, jobs).await,
        Command::Latency {
            river,
            rate,
            seconds,
        } => latency(&river, rate, Duration::from_secs_f64(seconds)).await,
    }
}

/// Jobs not yet `completed` in River's table.
async fn unfinished(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM river_job WHERE state <> 'completed'")
            .fetch_one(pool)
            .await?,
    )
}

async fn drain(river: &RiverOptions, jobs: usize) -> Result<()> {
    if jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let pool = river.pool().await?;
    let seen = Seen::new(jobs, 0);
    let client = river.client(pool.clone(), workers(&seen)?)?;
    for first in (0..jobs).step_by(INSERT_BATCH) {
        let batch = (first..jobs.min(first + INSERT_BATCH))
            .map(|seq| (Noop { seq }, InsertOpts::default()));
        client.insert_many(batch).await?;
    }
    let started = Instant::now();
    let started_us = now_us();
    let mut run = client.start()?;
    let done = seen.done.notified();
    tokio::pin!(done);
    // The notification is missed if every call happened before it was
    // asked for: check the count after enabling it.
    done.as_mut().enable();
    if seen.calls.load(Ordering::Acquire) < jobs {
        tokio::time::timeout(Duration::from_secs(900), done)
            .await
            .context("the backlog was not worked within 15 minutes")?;
    }
    let handled = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    while unfinished(&pool).await? > 0 {
        if Instant::now() > deadline {
            bail!("jobs were worked but not all recorded completed within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let completed = started.elapsed();
    run.stop().await?;
    let seconds = handled.as_secs_f64();
    let mut out = json!({
        "bench": "peer_drain", "peer": "river", "jobs": jobs,
        "seconds": (seconds * 1000.0).round() / 1000.0,
        "completed_seconds": (completed.as_secs_f64() * 1000.0).round() / 1000.0,
    });
    merge(
        &mut out,
        drain_rates(
            jobs,
            seconds,
            seen.first_us.load(Ordering::Relaxed),
            seen.last_us.load(Ordering::Relaxed),
            started_us,
        ),
    );
    merge(&mut out, river.json());
    println!("{out}");
    Ok(())
}

async fn latency(river: &RiverOptions, rate: u32, duration: Duration) -> Result<()> {
    if rate == 0 {
        bail!("--rate must be at least 1");
    }
    let total = (f64::from(rate) * duration.as_secs_f64()).round() as usize;
    if total == 0 {
        bail!("--rate × --seconds must make at least one job");
    }
    let pool = river.pool().await?;
    // Slot `total` is the warm-up job's.
    let seen = Seen::new(total + 1, total + 1);
    let client = river.client(pool, workers(&seen)?)?;
    let mut run = client.start()?;
    run.wait_ready().await?;
    let mut conns = Vec::with_capacity(PUBLISHERS);
    for _ in 0..PUBLISHERS {
        conns.push(PgConnection::connect(&river.database_url).await?);
    }
    // Warm-up: one job through, so the client is working.
    publish_one(&client, &mut conns[0], total).await?;
    let warm = Instant::now() + Duration::from_secs(60);
    while seen.calls.load(Ordering::Acquire) == 0 {
        if Instant::now() > warm {
            bail!("the warm-up job was not worked within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let done = seen.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();

    let load = open_loop::publish(conns, rate, total, async |conn, seq| {
        publish_one(&client, conn, seq).await?;
        Ok((seq, now_us()))
    })
    .await?;
    if seen.calls.load(Ordering::Acquire) < total + 1 {
        tokio::time::timeout(Duration::from_secs(120), done)
            .await
            .context("not every published job was worked within 2 minutes of the load")?;
    }
    run.stop().await?;

    let mut latencies = Vec::with_capacity(total);
    for &(seq, committed) in &load.results {
        let entered = seen.entered[seq].load(Ordering::Relaxed);
        if entered == 0 {
            bail!("job {seq} was never worked");
        }
        latencies.push((entered - committed) as f64 / 1000.0);
    }
    let mut out = latency_fields(rate, latencies, load.late_ms, load.elapsed);
    merge(
        &mut out,
        json!({ "bench": "peer_latency_ms", "peer": "river" }),
    );
    merge(&mut out, river.json());
    println!("{out}");
    Ok(())
}

/// Commits job `seq` in a transaction of its own on `conn`.
async fn publish_one(client: &Client, conn: &mut PgConnection, seq: usize) -> Result<()> {
    let mut tx = conn.begin().await?;
    client.insert(Noop { seq }).tx(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}
