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

use crate::bench::Run;

/// Starts `binary` as a general-group worker on `url` with the dispatcher
/// on, `RUST_LOG=warn`, an ephemeral HTTP port, and `vars` on top.
pub fn spawn(run: &Run, url: &str, binary: &Path, vars: &[(&str, String)]) -> Result<Child> {
    Command::new(binary)
        .env("DATABASE_URL", url)
        .env("REDIS_URL", &run.found.redis_url)
        .env("OUTBOX_QUEUE_PREFIX", run.prefix())
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
    url: &str,
    binary: &Path,
    vars: &[(&str, String)],
    n: usize,
) -> Result<Vec<Child>> {
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        match spawn(run, url, binary, vars) {
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
