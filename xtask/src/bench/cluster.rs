//! `cargo xtask bench --only cluster`: the hand-off and a queue's drain
//! against one Redis server and against a Redis Cluster, in the same run.
//!
//! The cluster is started by the stage from the system's `redis-server`
//! (three primaries with a replica each, on this machine beside
//! everything else), the server is the one the run uses. Each round
//! measures, for each of the two:
//!
//! - `cluster_handoff`: one `worker-general` (dispatcher on) hands a
//!   preloaded backlog of due rows on five queues no handler consumes over
//!   to Redis (rate from the rows' `processed_at`, as `--only handoff`);
//! - `cluster_drain`: one queue's backlog of no-op jobs drained by a worker
//!   with the production settings (as `queue_drain_*_waiting`).
//!
//! The summary gives the medians and the cluster's ratio to the server.
//! On one machine the cluster's six processes share the cores with the
//! rest: the figures say what the cluster's routing and scripts cost, not
//! what more machines would add.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_queue::{QueueNamespace, RedisSettings, push_raw};
use outbox_subscriber::{HandlerGroup, WorkerSettings};
use outbox_test_support::RedisCluster;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::bench::drain::{Count, QUEUE};
use crate::bench::handoff::{done_rate, median, ratio, reset_backlog, wait_until_done};
use crate::bench::kit::{Run, Scratch, clear_redis, line, stage};

/// This stage's name, and its Redis key prefix under the run's.
const STAGE: &str = "cluster";

/// What to measure.
pub struct Plan {
    /// The `worker-general` binary of the hand-off.
    pub binary: std::path::PathBuf,
    /// Preloaded rows per hand-off.
    pub rows: usize,
    /// Jobs per drain.
    pub jobs: usize,
    /// Rounds over both targets.
    pub rounds: usize,
}

/// Runs the rounds and prints a line per measurement, then the summary.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    stage("cluster: starting a Redis Cluster of 3 primaries with a replica each");
    let cluster = RedisCluster::start(3, 1).await;
    let targets = [
        ("server", run.found.redis_url.clone()),
        ("cluster", cluster.url()),
    ];
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_cluster"),
    )
    .await?;
    let mut handoffs: [Vec<f64>; 2] = Default::default();
    let mut drains: [Vec<f64>; 2] = Default::default();
    for round in 1..=plan.rounds {
        for (n, (redis, url)) in targets.iter().enumerate() {
            stage(&format!("cluster: hand-off to the {redis}, round {round}"));
            let rate = handoff(run, &scratch.url, url, &plan.binary, plan.rows).await?;
            line(
                json!({ "bench": "cluster_handoff", "redis": redis, "round": round,
                         "rows": plan.rows, "per_second": rate.round() }),
            );
            handoffs[n].push(rate);
            stage(&format!("cluster: drain on the {redis}, round {round}"));
            let rate = drain(run, url, plan.jobs).await?;
            line(
                json!({ "bench": "cluster_drain", "redis": redis, "round": round,
                         "jobs": plan.jobs, "per_second": rate.round() }),
            );
            drains[n].push(rate);
        }
    }
    for (bench, [server, cluster]) in [("cluster_handoff", handoffs), ("cluster_drain", drains)] {
        let (server, cluster) = (median(server), median(cluster));
        line(
            json!({ "bench": format!("{bench}_median"), "rounds": plan.rounds,
                     "server_per_second": server.round(), "cluster_per_second": cluster.round(),
                     "cluster_to_server": ratio(cluster, server) }),
        );
    }
    scratch.remove().await
}

/// One hand-off of `rows` preloaded rows by one `worker-general` whose
/// `REDIS_URL` is `redis_url`; the rate in rows per second.
async fn handoff(
    run: &Run,
    database_url: &str,
    redis_url: &str,
    binary: &Path,
    rows: usize,
) -> Result<f64> {
    let prefix = run.stage_prefix(STAGE);
    let mut conn = outbox_pg::establish(database_url).await?;
    clear_redis(redis_url, &prefix).await?;
    reset_backlog(&mut conn, rows).await?;
    let vars = [("REDIS_URL", redis_url.to_owned())];
    let mut children =
        crate::bench::process::spawn_many(run, (database_url, &prefix), binary, &vars, 1)?;
    let finished = wait_until_done(&mut conn, &mut children).await;
    crate::bench::process::stop_all(children)?;
    finished?;
    let rate = done_rate(&mut conn, rows).await?;
    clear_redis(redis_url, &prefix).await?;
    Ok(rate)
}

/// One drain of `jobs` waiting no-op jobs on the Redis of `redis_url`; the
/// rate in jobs per second from the worker's start.
async fn drain(run: &Run, redis_url: &str, jobs: usize) -> Result<f64> {
    let prefix = format!("{}drain:", run.stage_prefix(STAGE));
    let namespace = QueueNamespace::for_redis(prefix.clone(), redis_url);
    let conn = outbox_queue::connect(&RedisSettings::new(redis_url))?;
    let mut push = conn.clone();
    for start in (0..jobs).step_by(1_000) {
        let batch: Vec<_> = (start..(start + 1_000).min(jobs))
            .map(|n| (format!("outbox:bench-{n}"), b"{\"n\":1}".to_vec()))
            .collect();
        push_raw(&mut push, &namespace, QUEUE, &batch).await?;
    }
    let count = Count::default();
    let group = HandlerGroup::new().with(count.clone())?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let worker = {
        let (shutdown, namespace) = (shutdown.clone(), namespace.clone());
        let settings = WorkerSettings::default();
        tokio::spawn(async move { group.run(conn, &namespace, &settings, shutdown).await })
    };
    let deadline = started + Duration::from_secs(600);
    while count.0.load(Ordering::Relaxed) < jobs {
        if Instant::now() > deadline {
            bail!(
                "cluster_drain: {} of {jobs} jobs after 10 minutes",
                count.0.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    shutdown.cancel();
    worker.await.context("queue worker panicked")??;
    clear_redis(redis_url, &prefix).await?;
    Ok(jobs as f64 / elapsed)
}
