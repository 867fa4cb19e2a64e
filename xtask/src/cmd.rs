//! Running child processes with clear failures.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The cargo target directory (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The cargo binary that runs xtask.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Runs `cmd`, inheriting stdio; fails with `what` when it exits non-zero.
pub fn run(what: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("\n==> {what}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start: {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// True when `program --version`-style probe `args` runs and exits 0.
pub fn probe(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `cargo metadata --no-deps` of the workspace, as JSON (offline: the
/// workspace's own packages need no index).
///
/// # Errors
///
/// When cargo cannot run or fails, or prints something else than JSON.
pub fn workspace_metadata() -> Result<serde_json::Value> {
    let output = cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .context("cannot run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("cargo metadata's JSON")
}
