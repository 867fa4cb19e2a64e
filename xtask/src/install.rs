//! The Postgres and Redis server binaries, and the headless browser of the
//! console's browser test (Chromium and ChromeDriver): finding them, and
//! installing them from the system's packages when they are missing.
//!
//! The one place that knows how: `cargo xtask test` (its tests start
//! `redis-server` themselves) and `cargo xtask demo` and `services` (when
//! they must start private servers) call it; `.ci/run` only calls `cargo
//! xtask test`. As root with `apt-get` on the PATH, and unless told not to
//! (`--no-install`), it says what it runs and runs `apt-get update` and
//! `apt-get install`; otherwise it fails with the exact command to run.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

use crate::cmd::probe;

/// May the command install missing packages?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// Yes, when it runs as root with `apt-get` (the default).
    Allowed,
    /// No (`--no-install`): print the command instead.
    Refused,
}

impl Install {
    /// `Refused` when `no_install` (the `--no-install` flag) is set.
    pub fn from_flag(no_install: bool) -> Self {
        if no_install {
            Self::Refused
        } else {
            Self::Allowed
        }
    }
}

/// A server (or program) whose binaries the commands may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `initdb` and `pg_ctl`.
    Postgres,
    /// `redis-server`.
    Redis,
    /// `chromium`, the console's browser test drives it headless.
    Chromium,
    /// `chromedriver`, the WebDriver server the browser test starts.
    ChromeDriver,
}

impl Server {
    /// The Debian/Ubuntu package that brings it.
    fn package(self) -> &'static str {
        match self {
            Self::Postgres => "postgresql",
            Self::Redis => "redis-server",
            Self::Chromium => "chromium",
            Self::ChromeDriver => "chromium-driver",
        }
    }

    /// Fedora's package and Homebrew's formula that bring it.
    fn elsewhere(self) -> (&'static str, &'static str) {
        match self {
            Self::Postgres => ("postgresql-server", "postgresql@16"),
            Self::Redis => ("redis", "redis"),
            Self::Chromium => ("chromium", "--cask chromium"),
            Self::ChromeDriver => ("chromedriver", "chromedriver"),
        }
    }

    fn present(self) -> bool {
        match self {
            Self::Postgres => postgres_bin_dir().is_some(),
            Self::Redis => probe("redis-server", &["--version"]),
            Self::Chromium => probe("chromium", &["--version"]),
            Self::ChromeDriver => probe("chromedriver", &["--version"]),
        }
    }
}

/// Where the Postgres server binaries are: on PATH (an empty path), or
/// Debian's newest versioned dir.
pub fn postgres_bin_dir() -> Option<PathBuf> {
    if probe("pg_ctl", &["--version"]) && probe("initdb", &["--version"]) {
        return Some(PathBuf::new());
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("pg_ctl").exists() && bin.join("initdb").exists())
        .collect();
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop()
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// The commands that install what `missing` names, one per line, for a
/// person to run.
fn manual_commands(missing: &[Server]) -> String {
    let list = |of: fn(Server) -> &'static str| {
        missing.iter().map(|s| of(*s)).collect::<Vec<_>>().join(" ")
    };
    format!(
        "  sudo apt-get update && sudo apt-get install -y {}   (Debian/Ubuntu)\n  \
         sudo dnf install {}   (Fedora)\n  \
         brew install {}   (macOS)",
        list(Server::package),
        list(|s| s.elsewhere().0),
        list(|s| s.elsewhere().1),
    )
}

/// What to do about the missing binaries.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Nothing is missing.
    Ready,
    /// Install these packages (space-separated).
    Install(String),
    /// Stop with this message, which names the command to run.
    Refuse(String),
}

/// The decision, from what is missing, what the user allows and whether
/// this process can install (root with `apt-get`).
fn plan(missing: &[Server], install: Install, can_install: bool) -> Plan {
    if missing.is_empty() {
        return Plan::Ready;
    }
    let packages = missing
        .iter()
        .map(|s| s.package())
        .collect::<Vec<_>>()
        .join(" ");
    match (install, can_install) {
        (Install::Allowed, true) => Plan::Install(packages),
        (Install::Refused, _) => Plan::Refuse(format!(
            "the server binaries of {packages} are missing and --no-install was given; install them:\n{}",
            manual_commands(missing)
        )),
        (Install::Allowed, false) => Plan::Refuse(format!(
            "the server binaries of {packages} are missing and this command installs packages only \
             as root with apt-get; install them:\n{}",
            manual_commands(missing)
        )),
    }
}

/// Makes sure the binaries of every server in `servers` exist, installing
/// the missing ones when `install` allows and the machine can (root and
/// `apt-get`); otherwise fails naming the exact command.
pub fn ensure(servers: &[Server], install: Install) -> Result<()> {
    let missing: Vec<Server> = servers.iter().copied().filter(|s| !s.present()).collect();
    let can_install = !missing.is_empty() && is_root() && probe("apt-get", &["--version"]);
    let packages = match plan(&missing, install, can_install) {
        Plan::Ready => return Ok(()),
        Plan::Refuse(message) => bail!(message),
        Plan::Install(packages) => packages,
    };
    crate::cmd::run(
        "apt-get update -qq (the package lists, to install missing server binaries)",
        Command::new("apt-get").args(["update", "-qq"]),
    )?;
    crate::cmd::run(
        &format!("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {packages}"),
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq"])
            .args(missing.iter().map(|s| s.package())),
    )?;
    if let Some(still) = missing.iter().find(|s| !s.present()) {
        bail!(
            "installed {packages}, but the binaries of {} are still not found",
            still.package()
        );
    }
    Ok(())
}

/// Prometheus' `promtool`, which the alert-rule tests of `deploy/` run
/// (they skip, saying so, without it). Installed like the servers when
/// `install` allows and the machine can (Debian's `prometheus` package,
/// without recommends; its service is not started); a failed install only
/// warns, since the tests can do without it.
pub fn offer_promtool(install: Install) {
    if probe("promtool", &["--version"]) {
        return;
    }
    let command = "apt-get install -y --no-install-recommends prometheus";
    if install == Install::Refused || !is_root() || !probe("apt-get", &["--version"]) {
        eprintln!(
            "xtask: promtool is not installed: the alert-rule tests of deploy/ will skip \
             (install it with `sudo {command}` on Debian/Ubuntu)"
        );
        return;
    }
    let result = crate::cmd::run(
        "apt-get update -qq (the package lists, to install promtool)",
        Command::new("apt-get").args(["update", "-qq"]),
    )
    .and_then(|()| {
        crate::cmd::run(
            &format!(
                "DEBIAN_FRONTEND=noninteractive {command} (promtool, for the alert-rule tests)"
            ),
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args([
                    "install",
                    "-y",
                    "-qq",
                    "--no-install-recommends",
                    "prometheus",
                ]),
        )
    });
    if let Err(e) = result {
        eprintln!("xtask: could not install promtool ({e:#}); the alert-rule tests will skip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_are_installed_only_when_allowed_and_possible_else_the_command_is_named() {
        use Server::{Postgres, Redis};
        assert_eq!(plan(&[], Install::Allowed, true), Plan::Ready);
        assert_eq!(plan(&[], Install::Refused, false), Plan::Ready);
        assert_eq!(
            plan(&[Postgres, Redis], Install::Allowed, true),
            Plan::Install("postgresql redis-server".into())
        );
        assert_eq!(
            plan(&[Redis], Install::Allowed, true),
            Plan::Install("redis-server".into())
        );
        let Plan::Refuse(browser) = plan(
            &[Server::Chromium, Server::ChromeDriver],
            Install::Allowed,
            false,
        ) else {
            panic!("expected a refusal");
        };
        assert!(
            browser.contains("sudo apt-get install -y chromium chromium-driver")
                && browser.contains("brew install --cask chromium chromedriver"),
            "{browser}"
        );
        for (install, can, why) in [
            (Install::Refused, true, "--no-install"),
            (Install::Refused, false, "--no-install"),
            (Install::Allowed, false, "only as root with apt-get"),
        ] {
            let Plan::Refuse(message) = plan(&[Postgres], install, can) else {
                panic!("{install:?}, can install {can}: expected a refusal");
            };
            assert!(message.contains(why), "{message}");
            assert!(
                message.contains("sudo apt-get install -y postgresql"),
                "{message}"
            );
        }
    }
}
