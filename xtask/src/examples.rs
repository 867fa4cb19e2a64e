//! The applications under `examples/` with a workspace of their own: they
//! depend on the crates by path as an adopter does, outside this
//! workspace's dependency resolution and feature unification. `cargo xtask
//! test` checks their formatting and runs their tests, in one target
//! directory under the main one that the examples share (the dependencies
//! they have in common build once, and CI's warm target directory keeps
//! them warm).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::cmd::{cargo, run as step, target_dir, workspace_root};

/// The manifests of `examples/*/Cargo.toml` that declare `[workspace]`.
///
/// # Errors
///
/// When `examples/` or a manifest cannot be read.
pub fn standalone() -> Result<Vec<PathBuf>> {
    let dir = workspace_root().join("examples");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
        let manifest = entry?.path().join("Cargo.toml");
        if manifest.is_file() && has_own_workspace(&std::fs::read_to_string(&manifest)?) {
            found.push(manifest);
        }
    }
    found.sort();
    Ok(found)
}

/// Whether a manifest's text declares a workspace of its own.
fn has_own_workspace(manifest: &str) -> bool {
    manifest.lines().any(|line| line.trim() == "[workspace]")
}

/// The example's name: its directory's.
fn name(manifest: &Path) -> String {
    manifest
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A cargo command on the example `manifest`, in the examples' target
/// directory.
fn cargo_on(manifest: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = cargo();
    cmd.args(args)
        .arg("--manifest-path")
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target_dir().join("examples"));
    cmd
}

/// `cargo fmt --check` on each example. Not clippy: its check build of
/// every dependency would double what a cold run spends on the examples
/// (about six minutes each on a busy 2-core machine); run it by hand
/// after changing an example.
///
/// # Errors
///
/// The first example that fails.
pub fn lint() -> Result<()> {
    for manifest in standalone()? {
        step(
            &format!("cargo fmt --check (examples/{})", name(&manifest)),
            cargo_on(&manifest, &["fmt"]).args(["--", "--check"]),
        )?;
    }
    Ok(())
}

/// Each example's tests, with the services' environment `env`.
///
/// # Errors
///
/// The first example whose tests fail.
pub fn test(env: &[(&'static str, String)]) -> Result<()> {
    for manifest in standalone()? {
        step(
            &format!("cargo test (examples/{})", name(&manifest)),
            cargo_on(&manifest, &["test"]).envs(env.iter().cloned()),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_example_with_its_own_workspace_is_found_and_a_member_is_not() {
        let found: Vec<String> = standalone().unwrap().iter().map(|m| name(m)).collect();
        assert!(found.contains(&"axum-diesel".to_owned()), "{found:?}");
        assert!(found.contains(&"axum-sqlx".to_owned()), "{found:?}");
        assert!(!found.contains(&"custom-worker".to_owned()), "{found:?}");
        assert!(has_own_workspace("[package]\n\n[workspace]\n"));
        assert!(!has_own_workspace("[package]\nversion.workspace = true\n"));
    }
}
