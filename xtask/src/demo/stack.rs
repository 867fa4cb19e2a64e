//! The demo's processes: building `worker-general`, `worker-mail` and
//! `outbox` (a progress line while cargo compiles), and running the two
//! workers as child processes against the demo's database, Redis prefix
//! and sinks; killing one with SIGKILL and starting it again.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::demo::progress::Progress;

/// Which build of the binaries the demo runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `cargo build --release` (the default: the product's performance).
    Release,
    /// The debug build (`--debug`): what `cargo xtask test` already built.
    Debug,
}

/// The binaries the demo runs.
pub struct Binaries {
    /// `worker-general`.
    pub general: PathBuf,
    /// `worker-mail`.
    pub mail: PathBuf,
    /// The operator CLI `outbox`.
    pub cli: PathBuf,
}

/// Builds the binaries, showing the crate being compiled on one line.
pub async fn build(profile: Profile, progress: &Progress) -> Result<Binaries> {
    let mut args = vec![
        "build",
        "-p",
        "outbox-worker",
        "--bin",
        "worker-general",
        "--bin",
        "worker-mail",
        "-p",
        "outbox-cli",
        "--bin",
        "outbox",
    ];
    if profile == Profile::Release {
        args.insert(1, "--release");
    }
    let line = progress.spinner(&format!("cargo {}", args.join(" ")));
    let mut cargo: Command = crate::cmd::cargo().into();
    let mut child = cargo
        .args(&args)
        .env("CARGO_TERM_COLOR", "never")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start cargo build")?;
    let stderr = child.stderr.take().context("cargo's stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut compiled = 0usize;
    let mut log = Vec::new();
    while let Some(text) = lines.next_line().await? {
        let text = text.trim().to_owned();
        if let Some(krate) = text.strip_prefix("Compiling ") {
            compiled += 1;
            line.message(&format!("compiling {krate} ({compiled} crates so far)"));
        }
        log.push(text);
    }
    let status = child.wait().await?;
    if !status.success() {
        line.finish("build failed");
        for text in log.iter().rev().take(40).rev() {
            eprintln!("{text}");
        }
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    line.finish(&format!("built ({compiled} crates compiled)"));
    let dir = crate::cmd::target_dir().join(match profile {
        Profile::Release => "release",
        Profile::Debug => "debug",
    });
    Ok(Binaries {
        general: dir.join("worker-general"),
        mail: dir.join("worker-mail"),
        cli: dir.join("outbox"),
    })
}

/// A free loopback address for a worker's HTTP server.
pub fn free_addr() -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.to_string())
}

/// One worker process.
pub struct Worker {
    /// `worker-general` or `worker-mail`.
    pub name: &'static str,
    binary: PathBuf,
    env: Vec<(String, String)>,
    /// Where it serves `/healthz`, `/readyz` and `/metrics`.
    pub addr: String,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    child: Child,
}

impl Worker {
    /// Starts `binary` with `env` and waits until `/readyz` answers 200.
    pub async fn start(
        name: &'static str,
        binary: &Path,
        env: Vec<(String, String)>,
        log_dir: &Path,
    ) -> Result<Self> {
        let addr = free_addr()?;
        let log = log_dir.join(format!("{name}.log"));
        let child = spawn(binary, &env, &addr, &log)?;
        let mut worker = Self {
            name,
            binary: binary.to_owned(),
            env,
            addr,
            log,
            child,
        };
        worker.wait_ready().await?;
        Ok(worker)
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if http_status(&self.addr, "/readyz").await == Some(200) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited during start-up ({status}); see {}",
                    self.name,
                    self.log.display()
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{} not ready within 60 s; see {}",
                    self.name,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); see {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }

    /// SIGKILL (no chance to finish anything), then the same binary with
    /// the same environment again, ready.
    pub async fn kill_and_restart(&mut self) -> Result<()> {
        self.child.start_kill().context("SIGKILL")?;
        self.child.wait().await?;
        self.addr = free_addr()?;
        self.child = spawn(&self.binary, &self.env, &self.addr, &self.log)?;
        self.wait_ready().await
    }

    /// SIGTERM, then waits for the graceful stop (SIGKILL after 30 s).
    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            self.child.start_kill()?;
            self.child.wait().await?;
        }
        Ok(())
    }
}

fn spawn(binary: &Path, env: &[(String, String)], addr: &str, log: &Path) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out.try_clone()?;
    Command::new(binary)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("WORKER_HTTP_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))
}

/// The status code of `GET path` on `addr`, or `None` when nothing answers.
pub async fn http_status(addr: &str, path: &str) -> Option<u16> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = vec![0u8; 64];
        let n = stream.read(&mut head).await.ok()?;
        let text = String::from_utf8_lossy(&head[..n]);
        text.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}
