//! `cargo xtask bench --only peers`: this project next to River for Rust
//! (`riverqueue`), the library a team would otherwise pick for jobs in its
//! Postgres transaction, doing the same work in the same run.
//!
//! Three arms, run in interleaved order (per measurement, each arm in
//! turn, so that the machine's load falls on each alike):
//!
//! - `river_defaults`: River's default configuration (fetch cooldown
//!   100 ms, fetch poll 1 s, LISTEN/NOTIFY on) with 1,000 workers on the
//!   queue (River has no default worker count; the first
//!   measurement used 1,000);
//! - `river_low_latency`: River's documented low-latency setting, a fetch
//!   cooldown of 1 ms (its minimum) on the client, with 100 workers;
//! - `this`: this project with its defaults: a bare worker
//!   (`WorkerBuilder::bare`) in the bench's process, dispatcher on, one
//!   no-op typed handler on a queue of its own. Its handler path includes
//!   the hand-off through Redis (dispatcher claim, push, the queue
//!   worker's fetch); River's worker fetches from Postgres directly.
//!
//! Each arm drains a backlog of no-op jobs (`--peer-drain-jobs`, 50,000,
//! inserted before the worker starts; the rate counts from the first
//! handler call to the last, and `from_start_per_second` from the worker's
//! start, see [`drain_rates`]) and measures commit → handler entry at each of
//! `--peer-loads` (500 and 2,000 a second, `--peer-seconds` each, 32
//! publishers committing one job per transaction on an open-loop
//! schedule, as the latency stage). River's side runs in its own binary,
//! `river-peer` (`xtask/peers/river`, a workspace of its own so that the
//! product never compiles River), built here in release; publishers and
//! worker share one process in both, and each arm's measurement gets a
//! scratch database of its own.
//!
//! Lines: `peers_drain` and `peers_latency_ms` per arm, measurement and
//! round, then `peers_summary`: this project's figures as ratios to each
//! River arm (drain rate: above 1 is faster here; p50 and p99 per load:
//! below 1 is faster here), from the medians of the rounds.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_publish::{NewOutboxEvent, OutboxEvent, TypedEvent};
use outbox_subscriber::{EventContext, JobError, TypedHandlers};
use outbox_worker::{WorkerBuilder, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bench::handoff::median;
use crate::bench::kit::{Run, Scratch, clear_redis, line, preload_pending, stage};
use crate::bench::latency::{Published, publish_at, publish_one};
use crate::bench::open_loop::{drain_rates, latency_fields, merge, now_us};

/// The peer crate, relative to the workspace root.
const PEER_DIR: &str = "xtask/peers/river";

/// This project's path from commit to handler, in its lines.
const HANDLER_PATH: &str = "dispatcher → Redis → queue worker";

/// The queue of this project's no-op handler.
const QUEUE: &str = "bench.peer";

/// The no-op event of this project's arm (its own queue, routed by the
/// typed handler's rule).
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "bench.peer.noop")]
struct PeerNoop {
    n: u64,
}

fn event(n: usize) -> NewOutboxEvent {
    NewOutboxEvent::new(
        format!("tenant-{}", n % 17),
        PeerNoop::EVENT_TYPE,
        json!({ "n": n }),
    )
}

/// What the stage runs.
pub struct Plan {
    /// Offered loads of the latency measurement, events per second.
    pub loads: Vec<u32>,
    /// How long each load runs.
    pub duration: Duration,
    /// Jobs in each drain's backlog.
    pub drain_jobs: usize,
    /// Rounds; each runs every arm once per measurement.
    pub rounds: usize,
    /// Whether River's arms run: a smoke run leaves them out (the peer's
    /// cold build takes minutes), and so does `--peer-without-river`.
    pub river: bool,
}

/// One arm of the comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arm {
    RiverDefaults,
    RiverLowLatency,
    This,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Self::RiverDefaults => "river_defaults",
            Self::RiverLowLatency => "river_low_latency",
            Self::This => "this",
        }
    }

    /// The options of `river-peer` for this arm; `None` for this project.
    fn river_options(self) -> Option<&'static [&'static str]> {
        match self {
            Self::RiverDefaults => Some(&["--workers", "1000"]),
            Self::RiverLowLatency => {
                Some(&["--workers", LOW_LATENCY_WORKERS, "--fetch-cooldown-ms", "1"])
            }
            Self::This => None,
        }
    }
}

/// Jobs at once in River's low-latency arm (its workers) and in this
/// project's arm (`WORKER_CONCURRENCY`, which also sets the queue worker's
/// fetch batch): both sides work up to as many jobs at once.
const LOW_LATENCY_WORKERS: &str = "100";

/// [`LOW_LATENCY_WORKERS`] as a number, for this project's lines (River's
/// carry their `workers`).
fn worker_count() -> u64 {
    LOW_LATENCY_WORKERS.parse().unwrap_or_default()
}

/// One measurement of the stage.
#[derive(Clone, Copy)]
enum Measurement {
    Drain,
    Latency(u32),
}

/// Runs the stage: checks the toolchain, builds the peer, then every
/// measurement of every round with the arms in turn, and the summary.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    let mut arms = Vec::new();
    let mut river = None;
    if !plan.river {
        stage(
            "peers: River's arms left out (a smoke run, where its cold build takes \
             minutes, or --peer-without-river); `cargo xtask bench --only peers` runs them",
        );
    } else if let Some(binary) = river_peer()? {
        river = Some(binary);
        arms.extend([Arm::RiverDefaults, Arm::RiverLowLatency]);
    }
    arms.push(Arm::This);
    let measurements: Vec<Measurement> = std::iter::once(Measurement::Drain)
        .chain(plan.loads.iter().map(|&load| Measurement::Latency(load)))
        .collect();
    let mut lines: Vec<(Arm, Value)> = Vec::new();
    for round in 1..=plan.rounds {
        for &measurement in &measurements {
            for &arm in &arms {
                let mut out = measure(run, plan, arm, measurement, river.as_deref())
                    .await
                    .with_context(|| format!("peers: {}, round {round}", arm.name()))?;
                if let Some(fields) = out.as_object_mut() {
                    fields.insert("arm".into(), arm.name().into());
                    fields.insert("round".into(), round.into());
                }
                line(out.clone());
                lines.push((arm, out));
            }
        }
    }
    line(summary(&arms, &plan.loads, &lines));
    Ok(())
}

/// Runs one arm's measurement in a scratch database of its own; returns
/// its line (without arm and round).
async fn measure(
    run: &Run,
    plan: &Plan,
    arm: Arm,
    measurement: Measurement,
    river: Option<&Path>,
) -> Result<Value> {
    let what = match measurement {
        Measurement::Drain => format!("a backlog of {} no-op jobs drained", plan.drain_jobs),
        Measurement::Latency(load) => format!(
            "commit → handler at {load} jobs/s for {} s",
            plan.duration.as_secs_f64()
        ),
    };
    stage(&format!("peers: {}, {what}", arm.name()));
    let scratch =
        Scratch::create(&run.found.database_url, run.database("outbox_bench_peers")).await?;
    let out = match (arm.river_options(), river) {
        (Some(options), Some(binary)) => {
            let mut args: Vec<String> = match measurement {
                Measurement::Drain => {
                    vec!["drain".into(), "--jobs".into(), plan.drain_jobs.to_string()]
                }
                Measurement::Latency(load) => vec![
                    "latency".into(),
                    "--rate".into(),
                    load.to_string(),
                    "--seconds".into(),
                    plan.duration.as_secs_f64().to_string(),
                ],
            };
            args.extend(["--database-url".into(), scratch.url.clone()]);
            args.extend(options.iter().map(|o| (*o).to_owned()));
            run_peer(binary, &args)
        }
        (Some(_), None) => bail!("River's arm without its binary"),
        (None, _) => this_project(run, &scratch.url, plan, measurement).await,
    };
    scratch.remove().await?;
    let mut out = out?;
    if let Some(fields) = out.as_object_mut() {
        // The peer's names, as the stage's lines.
        let bench = match measurement {
            Measurement::Drain => "peers_drain",
            Measurement::Latency(_) => "peers_latency_ms",
        };
        fields.insert("bench".into(), bench.into());
        fields.remove("peer");
    }
    Ok(out)
}

/// Runs `river-peer` with `args`; returns the JSON line it printed.
fn run_peer(binary: &Path, args: &[String]) -> Result<Value> {
    let output = Command::new(binary)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    if !output.status.success() {
        bail!("river-peer {} failed ({})", args[0], output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout
        .lines()
        .last()
        .with_context(|| format!("river-peer {} printed nothing", args[0]))?;
    serde_json::from_str(last).with_context(|| format!("river-peer's line: {last}"))
}

/// `river-peer`, built now in release (`<target>/peers`), or `None` (with a
/// message) when the toolchain is older than River's `rust-version`.
fn river_peer() -> Result<Option<PathBuf>> {
    let root = crate::cmd::workspace_root();
    let manifest = root.join(PEER_DIR).join("Cargo.toml");
    let needed = rust_version(&manifest)?;
    let rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("--version")
        .output()
        .context("cannot run rustc --version")?;
    let version = String::from_utf8_lossy(&rustc.stdout).into_owned();
    let have = version
        .split_whitespace()
        .nth(1)
        .and_then(parse_version)
        .with_context(|| format!("cannot read the version in `{}`", version.trim()))?;
    if have < needed {
        stage(&format!(
            "peers: River skipped: it needs Rust {}.{}, this toolchain is {}",
            needed.0,
            needed.1,
            version.trim()
        ));
        return Ok(None);
    }
    let target = crate::cmd::target_dir().join("peers");
    crate::cmd::run(
        "cargo build --release --locked (the River peer)",
        crate::cmd::cargo()
            .args(["build", "--release", "--locked", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target),
    )?;
    Ok(Some(target.join("release").join("river-peer")))
}

/// The `rust-version` of the package in `manifest`, as (major, minor).
fn rust_version(manifest: &Path) -> Result<(u32, u32)> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version"))
        .and_then(|rest| rest.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"'))
        .with_context(|| format!("{} has no rust-version", manifest.display()))?;
    parse_version(value).with_context(|| format!("rust-version {value:?} is not major.minor"))
}

/// `1.95` or `1.95.0` as (1, 95).
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// What this project's no-op handler saw.
struct Seen {
    calls: AtomicUsize,
    /// The first and the last call's wall-clock time, µs since the epoch
    /// (`first_us` is `i64::MAX` until the first call).
    first_us: AtomicI64,
    last_us: AtomicI64,
    /// The first call per event id, µs since the epoch (the latency
    /// measurement's).
    entered: Mutex<HashMap<Uuid, i64>>,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            calls: AtomicUsize::new(0),
            first_us: AtomicI64::new(i64::MAX),
            last_us: AtomicI64::new(0),
            entered: Mutex::default(),
        }
    }
}

impl Seen {
    fn enter(&self, event_id: Uuid, record: bool) {
        let at = now_us();
        if record {
            self.entered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(event_id)
                .or_insert(at);
        }
        self.first_us.fetch_min(at, Ordering::Relaxed);
        self.last_us.fetch_max(at, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Release);
    }

    /// Waits until `n` calls were seen, while `worker` runs, for at most
    /// `limit`.
    async fn wait_for(
        &self,
        n: usize,
        worker: &tokio::task::JoinHandle<Result<()>>,
        limit: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let calls = self.calls.load(Ordering::Acquire);
            if calls >= n {
                return Ok(());
            }
            if worker.is_finished() {
                bail!("the worker stopped after {calls} of {n} handler calls");
            }
            if Instant::now() > deadline {
                bail!("{calls} of {n} handler calls after {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// This project's arm: a bare worker in this process with the no-op
/// handler, on the scratch database `url` and the stage's Redis keys.
async fn this_project(
    run: &Run,
    url: &str,
    plan: &Plan,
    measurement: Measurement,
) -> Result<Value> {
    let prefix = run.stage_prefix("peers");
    clear_redis(&run.found.redis_url, &prefix).await?;
    let record = matches!(measurement, Measurement::Latency(_));
    if let Measurement::Drain = measurement {
        let mut conn = outbox_pg::establish(url).await?;
        preload_pending(&mut conn, plan.drain_jobs, &[PeerNoop::EVENT_TYPE]).await?;
    }
    let seen = Arc::new(Seen::default());
    let handlers = {
        let seen = seen.clone();
        TypedHandlers::new(QUEUE).on(move |_: PeerNoop, context: EventContext| {
            seen.enter(context.event_id, record);
            std::future::ready(Ok::<(), JobError>(()))
        })?
    };
    let env: HashMap<&str, String> = HashMap::from([
        ("DATABASE_URL", url.to_owned()),
        ("REDIS_URL", run.found.redis_url.clone()),
        ("OUTBOX_QUEUE_PREFIX", prefix.clone()),
        ("OUTBOX_DISPATCHER_ENABLED", "true".to_owned()),
        ("WORKER_CONCURRENCY", LOW_LATENCY_WORKERS.to_owned()),
    ]);
    let config = WorkerConfig::from_lookup(outbox_worker::Group::General, &|name| {
        env.get(name).cloned()
    })?;
    let builder = WorkerBuilder::bare()
        .name("bench-peer")
        .without_http_listener()
        .typed(handlers);
    let stop = CancellationToken::new();
    let started_us = now_us();
    let worker = tokio::spawn(builder.run_until(config, stop.clone().cancelled_owned()));
    let result = async {
        match measurement {
            Measurement::Drain => {
                seen.wait_for(plan.drain_jobs, &worker, Duration::from_secs(900))
                    .await?;
                let last_us = seen.last_us.load(Ordering::Relaxed);
                let seconds = (last_us - started_us) as f64 / 1e6;
                let mut out = json!({
                    "jobs": plan.drain_jobs,
                    "seconds": (seconds * 1000.0).round() / 1000.0,
                    "path": HANDLER_PATH,
                    "workers": worker_count(),
                });
                merge(
                    &mut out,
                    drain_rates(
                        plan.drain_jobs,
                        seconds,
                        seen.first_us.load(Ordering::Relaxed),
                        last_us,
                        started_us,
                    ),
                );
                Ok(out)
            }
            Measurement::Latency(load) => {
                // Warm-up: one event through, so the worker is ready.
                let mut conn = outbox_pg::establish(url).await?;
                publish_one(&mut conn, event(0)).await?;
                seen.wait_for(1, &worker, Duration::from_secs(60)).await?;
                let published = publish_at(url, load, plan.duration, 1, event).await?;
                seen.wait_for(
                    1 + published.commits.len(),
                    &worker,
                    Duration::from_secs(120),
                )
                .await?;
                latency_line(load, published, &seen)
            }
        }
    }
    .await;
    stop.cancel();
    let stopped = worker.await.context("the worker panicked")?;
    clear_redis(&run.found.redis_url, &prefix).await?;
    let out = result?;
    stopped?;
    Ok(out)
}

/// The latency line of this project's arm, as `river-peer` prints River's.
fn latency_line(load: u32, published: Published, seen: &Seen) -> Result<Value> {
    let entered = seen.entered.lock().unwrap_or_else(PoisonError::into_inner);
    let mut latencies = Vec::with_capacity(published.commits.len());
    for (id, _, committed) in &published.commits {
        let id = Uuid::parse_str(id).with_context(|| format!("event id {id}"))?;
        let Some(at) = entered.get(&id) else {
            bail!("event {id} never reached the handler");
        };
        latencies.push((at - committed) as f64 / 1000.0);
    }
    let mut out = latency_fields(load, latencies, published.late_ms, published.elapsed);
    merge(
        &mut out,
        json!({ "path": HANDLER_PATH, "workers": worker_count() }),
    );
    Ok(out)
}

/// Each arm's medians over the rounds, and this project's figures as
/// ratios to each River arm.
fn summary(arms: &[Arm], loads: &[u32], lines: &[(Arm, Value)]) -> Value {
    let figure = |arm: Arm, bench: &str, load: Option<u32>, field: &str| -> f64 {
        median(
            lines
                .iter()
                .filter(|(a, l)| {
                    *a == arm
                        && l["bench"] == bench
                        && load.is_none_or(|load| l["offered_per_second"] == load)
                })
                .filter_map(|(_, l)| l[field].as_f64())
                .collect(),
        )
    };
    let figures = |arm: Arm| -> Value {
        let latency: BTreeMap<String, Value> = loads
            .iter()
            .map(|&load| {
                let at = |field| figure(arm, "peers_latency_ms", Some(load), field);
                (
                    load.to_string(),
                    json!({ "p50": at("p50"), "p99": at("p99") }),
                )
            })
            .collect();
        json!({
            "drain_per_second": figure(arm, "peers_drain", None, "per_second"),
            "latency_ms": latency,
        })
    };
    let ratio = |a: f64, b: f64| (a / b * 100.0).round() / 100.0;
    let this = figures(Arm::This);
    let mut arms_json = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    for &arm in arms {
        let theirs = figures(arm);
        if arm != Arm::This {
            let latency: BTreeMap<String, Value> = loads
                .iter()
                .map(|&load| {
                    let key = load.to_string();
                    let of = |v: &Value, field: &str| {
                        v["latency_ms"][&key][field].as_f64().unwrap_or(f64::NAN)
                    };
                    let pair = json!({
                        "p50": ratio(of(&this, "p50"), of(&theirs, "p50")),
                        "p99": ratio(of(&this, "p99"), of(&theirs, "p99")),
                    });
                    (key, pair)
                })
                .collect();
            let drain = |v: &Value| v["drain_per_second"].as_f64().unwrap_or(f64::NAN);
            ratios.insert(
                arm.name().into(),
                json!({ "drain_rate": ratio(drain(&this), drain(&theirs)), "latency": latency }),
            );
        }
        arms_json.insert(arm.name().into(), theirs);
    }
    json!({
        "bench": "peers_summary",
        "arms": arms_json,
        "this_to": ratios,
        "note": "drain_rate above 1 and latency below 1 favour this project; its handler path includes the Redis hand-off",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_crate_states_the_rust_version_river_needs() {
        let manifest = crate::cmd::workspace_root()
            .join(PEER_DIR)
            .join("Cargo.toml");
        assert_eq!(rust_version(&manifest).unwrap(), (1, 95));
        assert_eq!(parse_version("1.95.0"), Some((1, 95)));
        assert!(parse_version("1.95.0") >= parse_version("1.95"));
        assert!(parse_version("1.94.1") < parse_version("1.95"));
    }

    #[test]
    fn the_summary_gives_this_project_s_figures_as_ratios_to_each_river_arm() {
        let lines = vec![
            (
                Arm::RiverLowLatency,
                json!({"bench": "peers_drain", "per_second": 5000.0}),
            ),
            (
                Arm::This,
                json!({"bench": "peers_drain", "per_second": 10000.0}),
            ),
            (
                Arm::RiverLowLatency,
                json!({"bench": "peers_latency_ms", "offered_per_second": 500, "p50": 4.0, "p99": 10.0}),
            ),
            (
                Arm::This,
                json!({"bench": "peers_latency_ms", "offered_per_second": 500, "p50": 2.0, "p99": 15.0}),
            ),
        ];
        let summary = summary(&[Arm::RiverLowLatency, Arm::This], &[500], &lines);
        assert_eq!(
            summary["this_to"]["river_low_latency"],
            json!({"drain_rate": 2.0, "latency": {"500": {"p50": 0.5, "p99": 1.5}}})
        );
        assert_eq!(summary["arms"]["this"]["drain_per_second"], 10000.0);
    }
}
