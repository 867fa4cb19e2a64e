//! The demo's processes: building `worker-general`, `worker-mail` and
//! `outbox` (a progress line while cargo compiles), or taking them from a
//! container image (`--image`), and running the two workers as child
//! processes (or containers on the host's network) against the demo's
//! database, Redis prefix and sinks; killing one with SIGKILL and starting
//! it again.

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

/// Where the demo's binaries (`worker-general`, `worker-mail`, `outbox`)
/// come from.
#[derive(Debug, Clone)]
pub enum Binaries {
    /// Built on this machine, in this directory.
    Host(PathBuf),
    /// In this container image (`cargo xtask image`), run by podman on the
    /// host's network, so that the loopback addresses of the database,
    /// Redis and the sinks mean the same inside.
    Image(String),
}

impl Binaries {
    /// The command that runs `binary` with `env` (the container, when an
    /// image, is named `container` and replaces one of that name).
    fn command(&self, binary: &str, env: &[(String, String)], container: &str) -> Command {
        match self {
            Self::Host(dir) => {
                let mut command = Command::new(dir.join(binary));
                command.envs(env.iter().map(|(k, v)| (k, v)));
                command
            }
            Self::Image(image) => {
                let mut command = Command::new("podman");
                command
                    .args(["run", "--rm", "--replace", "--network", "host", "--name"])
                    .arg(container);
                // `-e NAME` passes podman's own value of NAME: the values
                // stay out of the command line.
                for (name, value) in env {
                    command.arg("-e").arg(name).env(name, value);
                }
                command.args([image, binary]);
                command
            }
        }
    }

    /// The command line that runs the operator CLI, for a person to type.
    pub fn cli(&self) -> String {
        match self {
            Self::Host(dir) => dir.join("outbox").display().to_string(),
            Self::Image(image) => format!("podman run --rm --network host {image} outbox"),
        }
    }
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
    Ok(Binaries::Host(crate::cmd::target_dir().join(
        match profile {
            Profile::Release => "release",
            Profile::Debug => "debug",
        },
    )))
}

/// The binaries of the container image `image`, which podman must hold.
pub fn image(image: &str) -> Result<Binaries> {
    if !crate::image::podman_has(image) {
        bail!(
            "podman holds no image {image:?} (or podman is missing); build it with \
             `cargo xtask image --tag {image}`"
        );
    }
    Ok(Binaries::Image(image.to_owned()))
}

/// A free loopback address for a worker's HTTP server.
pub fn free_addr() -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.to_string())
}

/// One worker process.
pub struct Worker {
    /// `worker-general` or `worker-mail`: the binary.
    pub name: &'static str,
    binaries: Binaries,
    /// The container's name, when it runs in one.
    container: String,
    env: Vec<(String, String)>,
    /// Where it serves `/healthz`, `/readyz` and `/metrics`.
    pub addr: String,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    child: Child,
}

impl Worker {
    /// Starts the binary `name` of `binaries` with `env` and waits until
    /// `/readyz` answers 200; a container is named `container`.
    pub async fn start(
        name: &'static str,
        binaries: &Binaries,
        env: Vec<(String, String)>,
        log_dir: &Path,
        container: String,
    ) -> Result<Self> {
        let addr = free_addr()?;
        let log = log_dir.join(format!("{name}.log"));
        let child = spawn(binaries, name, &env, &addr, &log, &container)?;
        let mut worker = Self {
            name,
            binaries: binaries.clone(),
            container,
            env,
            addr,
            log,
            child,
        };
        worker.wait_ready().await?;
        Ok(worker)
    }

    /// Which process it is: `pid <n>`, or `container <name>`.
    pub fn which(&self) -> String {
        match self.binaries {
            Binaries::Host(_) => format!("pid {}", self.child.id().unwrap_or(0)),
            Binaries::Image(_) => format!("container {}", self.container),
        }
    }

    /// SIGKILL to the process (in its container, when it runs in one; the
    /// podman client that waits for it then exits).
    async fn kill(&mut self) -> Result<()> {
        if let Binaries::Image(_) = self.binaries {
            let _ = Command::new("podman")
                .args(["kill", "--signal", "KILL", &self.container])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
        }
        // The process may have exited already: the wait tells.
        let _ = self.child.start_kill();
        self.child.wait().await?;
        Ok(())
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
        self.kill().await?;
        self.addr = free_addr()?;
        self.child = spawn(
            &self.binaries,
            self.name,
            &self.env,
            &self.addr,
            &self.log,
            &self.container,
        )?;
        self.wait_ready().await
    }

    /// SIGTERM (podman passes it on to the container), then waits for the
    /// graceful stop (SIGKILL after 30 s).
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
            self.kill().await?;
        }
        Ok(())
    }
}

impl Drop for Worker {
    /// A container outlives its podman client (which `kill_on_drop`
    /// kills): remove it, so that a failed run leaves none behind.
    fn drop(&mut self) {
        if let Binaries::Image(_) = self.binaries {
            let _ = std::process::Command::new("podman")
                .args(["rm", "--force", "--ignore", "--time", "0", &self.container])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn spawn(
    binaries: &Binaries,
    binary: &str,
    env: &[(String, String)],
    addr: &str,
    log: &Path,
    container: &str,
) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out.try_clone()?;
    let mut env = env.to_vec();
    env.push(("WORKER_HTTP_ADDR".to_owned(), addr.to_owned()));
    binaries
        .command(binary, &env, container)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {binary} ({binaries:?})"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_from_the_image_runs_on_the_host_network_with_variable_names_only_on_its_command_line()
     {
        let env = [(
            "DATABASE_URL".to_owned(),
            "postgres://secret@db/x".to_owned(),
        )];
        let command = Binaries::Image("outbox:local".into()).command("worker-mail", &env, "c1");
        let command = command.as_std();
        assert_eq!(command.get_program(), "podman");
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args,
            [
                "run",
                "--rm",
                "--replace",
                "--network",
                "host",
                "--name",
                "c1",
                "-e",
                "DATABASE_URL",
                "outbox:local",
                "worker-mail",
            ]
        );
        let passed: Vec<_> = command.get_envs().collect();
        assert_eq!(
            passed,
            [(
                std::ffi::OsStr::new("DATABASE_URL"),
                Some(std::ffi::OsStr::new("postgres://secret@db/x"))
            )]
        );
        let host = Binaries::Host(PathBuf::from("/t/release")).command("worker-mail", &env, "c1");
        assert_eq!(host.as_std().get_program(), "/t/release/worker-mail");
        assert_eq!(host.as_std().get_args().count(), 0);
    }
}
