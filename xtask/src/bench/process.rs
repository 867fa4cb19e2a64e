//! Release `worker-general` processes for the bench stages that measure the
//! real workers: started with the scratch database, the run's Redis prefix
//! and extra variables, stopped with SIGTERM.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::bench::kit::Run;

/// Starts `binary` as a general-group worker on `url` and the Redis key
/// prefix `prefix`, with the dispatcher on, `RUST_LOG=warn`, an ephemeral
/// HTTP port, and `vars` on top.
pub fn spawn(
    run: &Run,
    (url, prefix): (&str, &str),
    binary: &Path,
    vars: &[(&str, String)],
) -> Result<Child> {
    Command::new(binary)
        .env("DATABASE_URL", url)
        .env("REDIS_URL", &run.found.redis_url)
        .env("OUTBOX_QUEUE_PREFIX", prefix)
        .env("OUTBOX_DISPATCHER_ENABLED", "true")
        .env("WORKER_HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))
}

/// Starts `n` workers like [`spawn`]; stops those started if one fails.
pub fn spawn_many(
    run: &Run,
    target: (&str, &str),
    binary: &Path,
    vars: &[(&str, String)],
    n: usize,
) -> Result<Vec<Child>> {
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        match spawn(run, target, binary, vars) {
            Ok(child) => children.push(child),
            Err(e) => {
                let _ = stop_all(children);
                return Err(e);
            }
        }
    }
    Ok(children)
}

/// Fails when a worker has exited.
pub fn check_running(children: &mut [Child]) -> Result<()> {
    for child in children {
        if let Some(status) = child.try_wait()? {
            bail!("a worker exited early ({status})");
        }
    }
    Ok(())
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Polls `count_sql` (a query returning one `n`) every 50 ms until it
/// reaches `target`, while every worker still runs; fails after `limit`.
pub async fn wait_for_count(
    conn: &mut AsyncPgConnection,
    children: &mut [Child],
    count_sql: &str,
    target: i64,
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        check_running(children)?;
        let count: Count = diesel::sql_query(count_sql).get_result(conn).await?;
        if count.n >= target {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} of {target} after {limit:?} ({count_sql})", count.n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM, then wait for the graceful stop (SIGKILL after 30 s).
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

/// Stops every worker; the first error wins.
pub fn stop_all(children: Vec<Child>) -> Result<()> {
    let mut first = Ok(());
    for child in children {
        let stopped = stop(child);
        if first.is_ok() {
            first = stopped;
        }
    }
    first
}

/// CPU time, in clock ticks (`/proc`): the machine's, split into who used
/// it, so that a figure shows which side was saturated.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// Every core's ticks, busy or idle.
    total: u64,
    /// Busy ticks (everything but idle and I/O wait).
    busy: u64,
    /// Ticks of the `worker-general` processes under test.
    workers: u64,
    /// Ticks of every `postgres` process (the server is shared).
    postgres: u64,
    /// Ticks of every `redis-server` process.
    redis: u64,
    /// Ticks of this process (the bench: its publishers and its queries).
    bench: u64,
    /// Context switches (voluntary and not) of the workers under test.
    worker_switches: u64,
    /// Context switches of the `postgres` processes that are running.
    postgres_switches: u64,
}

/// Voluntary plus involuntary context switches of one process so far
/// (`/proc/<pid>/status`); 0 when it cannot be read.
fn process_switches(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// User plus system ticks of one process (`/proc/<pid>/stat`), and those
/// of its children that ended and were waited for. A Postgres backend ends
/// with its connection (the publishers of a load close theirs), and its
/// ticks then count in the postmaster's children's ticks, so the server's
/// share is its processes' own ticks plus their children's.
fn process_ticks(pid: &str) -> Option<(String, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15, cutime 16
    // and cstime 17.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some((comm, field(14)? + field(15)?, field(16)? + field(17)?))
}

impl Cpu {
    /// Reads the counters now; zeros where `/proc` cannot be read.
    pub fn sample(workers: &[Child]) -> Self {
        let mut cpu = Self::default();
        if let Ok(stat) = std::fs::read_to_string("/proc/stat")
            && let Some(line) = stat.lines().next()
        {
            let ticks: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|t| t.parse().ok())
                .collect();
            cpu.total = ticks.iter().take(8).sum();
            let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
            cpu.busy = cpu.total.saturating_sub(idle);
        }
        for child in workers {
            let pid = child.id().to_string();
            if let Some((_, ticks, _)) = process_ticks(&pid) {
                cpu.workers += ticks;
            }
            cpu.worker_switches += process_switches(&pid);
        }
        if let Some((_, ticks, _)) = process_ticks("self") {
            cpu.bench = ticks;
        }
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                match process_ticks(pid) {
                    Some((comm, ticks, ended)) if comm == "postgres" => {
                        cpu.postgres += ticks + ended;
                        cpu.postgres_switches += process_switches(pid);
                    }
                    Some((comm, ticks, _)) if comm == "redis-server" => cpu.redis += ticks,
                    _ => {}
                }
            }
        }
        cpu
    }

    /// Context switches between `self` and `later`: the workers' and those
    /// of the Postgres processes alive at both samples (a backend that
    /// started in between counts from 0, one that ended is missing).
    pub fn switches(&self, later: &Self) -> (u64, u64) {
        (
            later.worker_switches.saturating_sub(self.worker_switches),
            later
                .postgres_switches
                .saturating_sub(self.postgres_switches),
        )
    }

    /// The shares of the machine's CPU time between `self` and `later`, as
    /// JSON: `busy` (all of it), and the parts used by the workers under
    /// test, Postgres, Redis and this bench (its publishers, where a stage
    /// publishes); the rest of `busy` is whatever else runs on the machine.
    /// Processes that ended in between are not counted, except Postgres
    /// backends (see [`process_ticks`]). A share of 1.0 is every core; on
    /// 2 cores, 0.5 is one core's worth.
    pub fn shares(&self, later: &Self) -> serde_json::Value {
        let total = later.total.saturating_sub(self.total).max(1) as f64;
        let share = |a: u64, b: u64| (b.saturating_sub(a) as f64 / total * 100.0).round() / 100.0;
        serde_json::json!({
            "busy": share(self.busy, later.busy),
            "workers": share(self.workers, later.workers),
            "postgres": share(self.postgres, later.postgres),
            "redis": share(self.redis, later.redis),
            "bench": share(self.bench, later.bench),
        })
    }
}
