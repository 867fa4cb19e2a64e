//! Finding Postgres and Redis, or starting private ones.
//!
//! Order: `DATABASE_URL` / `REDIS_URL` when they answer; else the standard
//! local ports (Postgres 5432 as user `postgres`, Redis 6379); else private
//! servers under `target/services/`, started from the system's binaries on
//! free ports and reused by later runs. Missing binaries are installed
//! when the caller allows it and the machine can, or end with the exact
//! command to install them (see [`crate::install`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cmd::{probe, target_dir};
use crate::install::{Install, Server, is_root, postgres_bin_dir};

const STANDARD_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const STANDARD_REDIS: &str = "redis://127.0.0.1:6379";

/// The servers to use.
pub struct Services {
    /// A Postgres URL (its database is `postgres` unless the caller's URL said otherwise).
    pub database_url: String,
    /// A Redis URL.
    pub redis_url: String,
    /// The private servers this call started (not those it found running).
    pub started: Vec<Started>,
}

impl Services {
    /// The environment of test processes: these services' URLs under the
    /// names the test suites read.
    pub fn test_env(&self) -> [(&'static str, String); 4] {
        [
            ("DATABASE_URL", self.database_url.clone()),
            ("REDIS_URL", self.redis_url.clone()),
            ("OUTBOX_TEST_DATABASE_URL", self.database_url.clone()),
            ("OUTBOX_TEST_REDIS_URL", self.redis_url.clone()),
        ]
    }
}

/// A private server started by this process, and how to stop it.
pub enum Started {
    /// A Postgres cluster, stopped with `pg_ctl stop`.
    Postgres {
        /// The server binaries' directory.
        bin: PathBuf,
        /// The data directory.
        data: PathBuf,
        /// The user it runs as (when xtask runs as root).
        run_as: Option<&'static str>,
    },
    /// A Redis server, stopped with SIGTERM to the pid in its pid file.
    Redis {
        /// Its pid file.
        pid_file: PathBuf,
    },
}

impl Started {
    /// What it is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Postgres { .. } => "the private Postgres",
            Self::Redis { .. } => "the private Redis",
        }
    }

    /// Stops the server (fast shutdown; its data stays for the next run).
    pub fn stop(&self) -> Result<()> {
        match self {
            Self::Postgres { bin, data, run_as } => crate::cmd::run(
                "pg_ctl stop",
                pg_command(bin, "pg_ctl", *run_as)
                    .arg("-D")
                    .arg(data)
                    .args(["-m", "fast", "-w", "stop"])
                    .stdout(std::process::Stdio::null()),
            ),
            Self::Redis { pid_file } => {
                let pid = std::fs::read_to_string(pid_file)
                    .with_context(|| format!("cannot read {}", pid_file.display()))?;
                crate::cmd::run(
                    "stop redis-server",
                    Command::new("kill").args(["-TERM", pid.trim()]),
                )
            }
        }
    }
}

/// Test databases older than this with no session are abandoned.
const ABANDONED_DATABASE_AGE: Duration = Duration::from_secs(3_600);

/// Drops the test databases that killed test processes left on the server
/// of `database_url` (more than an hour old, no session connected) and the
/// template databases of other migrations; warns instead of failing, since
/// the run can go on without it.
pub async fn sweep_abandoned_databases(database_url: &str) {
    match outbox_test_support::sweep_abandoned_databases(database_url, ABANDONED_DATABASE_AGE).await
    {
        Ok(dropped) if !dropped.is_empty() => eprintln!(
            "xtask: dropped {} databases left behind (test databases of killed test processes, templates of other migrations): {}",
            dropped.len(),
            dropped.join(", ")
        ),
        Ok(_) => {}
        Err(e) => eprintln!("xtask: warning: cannot sweep abandoned test databases: {e}"),
    }
}

/// Finds or starts both services; never installs packages.
pub async fn ensure() -> Result<Services> {
    ensure_with(Install::Refused).await
}

/// Finds or starts both services; when a private server must be started
/// and its binaries are missing, installs them if `install` allows (see
/// [`crate::install`]).
pub async fn ensure_with(install: Install) -> Result<Services> {
    let mut started = Vec::new();
    let database_url = ensure_postgres(install, &mut started).await?;
    let redis_url = ensure_redis(install, &mut started).await?;
    Ok(Services {
        database_url,
        redis_url,
        started,
    })
}

/// Uses (or starts) the private servers only.
pub async fn ensure_private() -> Result<Services> {
    let dir = services_dir();
    let mut started = Vec::new();
    let database_url = match read_port(&dir.join("postgres.port")).map(private_postgres_url) {
        Some(url) if postgres_answers(&url).await => url,
        _ => start_private_postgres(&dir, Install::Refused, &mut started).await?,
    };
    let redis_url =
        match read_port(&dir.join("redis.port")).map(|p| format!("redis://127.0.0.1:{p}")) {
            Some(url) if redis_answers(&url).await => url,
            _ => start_private_redis(&dir, Install::Refused, &mut started).await?,
        };
    Ok(Services {
        database_url,
        redis_url,
        started,
    })
}

fn services_dir() -> PathBuf {
    target_dir().join("services")
}

async fn postgres_answers(url: &str) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(3), outbox_pg::establish(url)).await,
        Ok(Ok(_))
    )
}

async fn redis_answers(url: &str) -> bool {
    let Ok(client) = outbox_queue::redis_client(url, None) else {
        return false;
    };
    let ping = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), ping).await,
        Ok(Ok(_))
    )
}

async fn ensure_postgres(install: Install, started: &mut Vec<Started>) -> Result<String> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        if postgres_answers(&url).await {
            return Ok(url);
        }
        eprintln!("xtask: DATABASE_URL={url} does not answer; looking further");
    }
    if postgres_answers(STANDARD_POSTGRES).await {
        return Ok(STANDARD_POSTGRES.to_owned());
    }
    let dir = services_dir();
    if let Some(port) = read_port(&dir.join("postgres.port")) {
        let url = private_postgres_url(port);
        if postgres_answers(&url).await {
            return Ok(url);
        }
    }
    start_private_postgres(&dir, install, started).await
}

async fn ensure_redis(install: Install, started: &mut Vec<Started>) -> Result<String> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        if redis_answers(&url).await {
            return Ok(url);
        }
        eprintln!("xtask: REDIS_URL={url} does not answer; looking further");
    }
    if redis_answers(STANDARD_REDIS).await {
        return Ok(STANDARD_REDIS.to_owned());
    }
    let dir = services_dir();
    if let Some(port) = read_port(&dir.join("redis.port")) {
        let url = format!("redis://127.0.0.1:{port}");
        if redis_answers(&url).await {
            return Ok(url);
        }
    }
    start_private_redis(&dir, install, started).await
}

fn private_postgres_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

fn read_port(path: &Path) -> Option<u16> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A command for a Postgres binary; as root it runs as the `postgres` (or
/// `nobody`) user, since initdb and postgres refuse to run as root.
fn pg_command(bin_dir: &Path, program: &str, run_as: Option<&str>) -> Command {
    let program = bin_dir.join(program);
    match run_as {
        Some(user) => {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", user, "--"]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

async fn start_private_postgres(
    dir: &Path,
    install: Install,
    started: &mut Vec<Started>,
) -> Result<String> {
    crate::install::ensure(&[Server::Postgres], install)
        .context("no Postgres answers (DATABASE_URL, 127.0.0.1:5432) and none can be started")?;
    let Some(bin) = postgres_bin_dir() else {
        bail!(
            "no Postgres answers (DATABASE_URL, 127.0.0.1:5432) and no server binaries \
             (initdb, pg_ctl) were found to start a private one.\n\
             Install them: `sudo apt-get install postgresql` (Debian/Ubuntu), \
             `sudo dnf install postgresql-server` (Fedora), `brew install postgresql@15` (macOS); \
             or set DATABASE_URL to a server you have."
        );
    };
    let run_as = if is_root() {
        let user = if probe("id", &["postgres"]) {
            "postgres"
        } else {
            "nobody"
        };
        Some(user)
    } else {
        None
    };
    let data = dir.join("postgres");
    let port = free_port()?;
    std::fs::create_dir_all(dir)?;
    if let Some(user) = run_as {
        // The unprivileged user must own everything the server writes.
        std::fs::create_dir_all(&data)?;
        crate::cmd::run(
            "chown services dir",
            Command::new("chown").args(["-R", user]).arg(dir),
        )?;
    }
    if !data.join("PG_VERSION").exists() {
        eprintln!(
            "xtask: initialising a private Postgres under {}",
            data.display()
        );
        crate::cmd::run(
            "initdb",
            pg_command(&bin, "initdb", run_as)
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
                .stdout(std::process::Stdio::null()),
        )?;
    }
    let options = format!(
        "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
        dir.display()
    );
    crate::cmd::run(
        "pg_ctl start",
        pg_command(&bin, "pg_ctl", run_as)
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("postgres.log"))
            .args(["-o", &options, "-w", "start"])
            .stdout(std::process::Stdio::null()),
    )?;
    std::fs::write(dir.join("postgres.port"), port.to_string())?;
    let url = private_postgres_url(port);
    if !postgres_answers(&url).await {
        bail!(
            "started a private Postgres on port {port} but it does not answer; see {}",
            dir.join("postgres.log").display()
        );
    }
    eprintln!(
        "xtask: private Postgres running at {url} (stop: pg_ctl -D {} stop)",
        data.display()
    );
    started.push(Started::Postgres { bin, data, run_as });
    Ok(url)
}

async fn start_private_redis(
    dir: &Path,
    install: Install,
    started: &mut Vec<Started>,
) -> Result<String> {
    crate::install::ensure(&[Server::Redis], install)
        .context("no Redis answers (REDIS_URL, 127.0.0.1:6379) and none can be started")?;
    if !probe("redis-server", &["--version"]) {
        bail!(
            "no Redis answers (REDIS_URL, 127.0.0.1:6379) and `redis-server` was not found to \
             start a private one.\n\
             Install it: `sudo apt-get install redis-server` (Debian/Ubuntu), \
             `sudo dnf install redis` (Fedora), `brew install redis` (macOS); \
             or set REDIS_URL to a server you have."
        );
    }
    let data = dir.join("redis");
    std::fs::create_dir_all(&data)?;
    let port = free_port()?;
    crate::cmd::run(
        "redis-server",
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            // What the workers require of any Redis (docs/operations.md,
            // "Redis must keep what it is given"): never evict, and keep
            // queued jobs across a restart (append-only file, fsync every
            // second; no RDB snapshots on top).
            .args(["--maxmemory-policy", "noeviction"])
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--save", ""])
            .args(["--daemonize", "yes"])
            .arg("--dir")
            .arg(&data)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .arg("--pidfile")
            .arg(dir.join("redis.pid")),
    )?;
    std::fs::write(dir.join("redis.port"), port.to_string())?;
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..50 {
        if redis_answers(&url).await {
            eprintln!("xtask: private Redis running at {url}");
            started.push(Started::Redis {
                pid_file: dir.join("redis.pid"),
            });
            return Ok(url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "started a private Redis on port {port} but it does not answer; see {}",
        dir.join("redis.log").display()
    )
}
