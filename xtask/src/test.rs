//! `cargo xtask test`: everything CI runs, in the order that fails fastest,
//! including the examples with workspaces of their own, a smoke run of
//! `cargo xtask bench` (tiny sizes, no timings) and `cargo xtask demo` at
//! 300 events on the debug binaries.

use anyhow::Result;
use clap::Args;

use crate::cmd::{cargo, probe, run as step};
use crate::services;

/// Options of `cargo xtask test`.
#[derive(Args, Default)]
pub struct TestArgs {
    /// Skip fmt, clippy and docs (tests and the schema check only).
    #[arg(long)]
    pub quick: bool,
    /// Never install missing Postgres or Redis binaries; print the command
    /// instead (by default they are installed when running as root with
    /// apt-get).
    #[arg(long)]
    pub no_install: bool,
    /// Arguments passed on to the test runner (a filter, for example); with
    /// any, the workflow readiness gate is skipped.
    #[arg(last = true)]
    pub runner_args: Vec<String>,
}

/// Runs the pipeline; the first failing step fails the command.
pub async fn run(args: TestArgs) -> Result<()> {
    let env = prepare_services(args.no_install).await?;
    if !args.quick {
        lint()?;
    }
    eprintln!("\n==> schema drift check");
    crate::schema::run(true).await?;

    let nextest = probe("cargo", &["nextest", "--version"]);
    run_tests(nextest, &args.runner_args, &env)?;
    if nextest && args.runner_args.is_empty() {
        run_partitioned_tests(&env)?;
    }
    match gate(nextest, !args.runner_args.is_empty()) {
        Gate::Run => {
            // Only the gate's tests again, already built: cheap.
            eprintln!("\n==> workflow readiness gate");
            crate::verify::workflow::verify(&env)?;
        }
        Gate::SkipFiltered => {
            eprintln!("\nxtask: workflow readiness gate skipped (the tests were filtered)");
        }
        Gate::SkipWithoutNextest => {
            eprintln!("\nxtask: workflow readiness gate skipped (it needs cargo-nextest)");
        }
    }
    if args.runner_args.is_empty() {
        crate::examples::test(&env)?;
        smoke_runs().await?;
    } else {
        eprintln!(
            "\nxtask: the examples' tests, bench smoke run and demo skipped (the tests were filtered)"
        );
    }
    if nextest {
        // nextest does not run doctests; plain `cargo test` above already did.
        step(
            "cargo test --doc",
            cargo()
                .args(["test", "--workspace", "--doc"])
                .envs(env.iter().cloned()),
        )?;
    }
    if !args.quick {
        docs_and_package()?;
    }
    eprintln!("\nxtask: all checks passed");
    Ok(())
}

/// Whether the workflow readiness gate runs after the tests.
#[derive(Debug, PartialEq, Eq)]
enum Gate {
    /// It runs.
    Run,
    /// Skipped: the tests were filtered, so the gate's may not have run.
    SkipFiltered,
    /// Skipped: the gate needs cargo-nextest.
    SkipWithoutNextest,
}

/// The gate runs with nextest on an unfiltered run only.
fn gate(nextest: bool, filtered: bool) -> Gate {
    match (nextest, filtered) {
        (true, false) => Gate::Run,
        (true, true) => Gate::SkipFiltered,
        (false, _) => Gate::SkipWithoutNextest,
    }
}

/// Makes sure Postgres and Redis answer (installing their binaries when
/// allowed), sweeps what killed test runs left behind, and returns the
/// environment each test child gets.
async fn prepare_services(no_install: bool) -> Result<[(&'static str, String); 4]> {
    // The tests start redis-server themselves, and a private Postgres is
    // started when none answers: both binaries are needed; so are Chromium
    // and ChromeDriver, which the console's browser test starts.
    let install = crate::install::Install::from_flag(no_install);
    crate::install::ensure(
        &[
            crate::install::Server::Postgres,
            crate::install::Server::Redis,
            crate::install::Server::Chromium,
            crate::install::Server::ChromeDriver,
        ],
        install,
    )?;
    crate::install::offer_promtool(install);
    let found = services::ensure_with(install).await?;
    eprintln!(
        "xtask: DATABASE_URL={} REDIS_URL={}",
        found.database_url, found.redis_url
    );
    // Keys of test processes killed in an earlier run (a timeout, an
    // interrupted mutation run) would slow every Redis call of this one.
    match outbox_test_support::sweep_abandoned_namespaces(&found.redis_url) {
        Ok(swept) if swept.namespaces > 0 => eprintln!(
            "xtask: removed {} keys of {} test namespaces whose test process was killed",
            swept.keys, swept.namespaces
        ),
        Ok(_) => {}
        Err(e) => eprintln!("xtask: warning: cannot sweep abandoned test keys: {e}"),
    }
    crate::services::sweep_abandoned_databases(&found.database_url).await;
    // Passed to each child rather than set on this process.
    Ok(found.test_env())
}

/// `cargo fmt --check` and clippy with warnings denied, on the workspace,
/// on a bare worker (`outbox-worker` without its features, built on its
/// own: a workspace build would unify the features back on), on the
/// publisher without its sqlx feature, and on the examples with workspaces
/// of their own.
fn lint() -> Result<()> {
    step(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    step(
        "cargo clippy (warnings denied)",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    step(
        "cargo clippy of a bare worker (outbox-worker --no-default-features, warnings denied)",
        cargo().args([
            "clippy",
            "--package",
            "outbox-worker",
            "--no-default-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The workspace's tests turn on the publisher's `sqlx` feature (its
    // dev-dependencies do); the libraries are checked as a diesel
    // application compiles them too.
    step(
        "cargo clippy of the publisher without its sqlx feature",
        cargo().args([
            "clippy",
            "-p",
            "outbox-publish",
            "-p",
            "outbox-store",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    crate::examples::lint()
}

/// The workspace's tests, through nextest when there is one.
fn run_tests(nextest: bool, runner_args: &[String], env: &[(&'static str, String)]) -> Result<()> {
    if nextest {
        step(
            "cargo nextest run",
            cargo()
                .args(["nextest", "run", "--workspace", "--no-fail-fast"])
                .args(runner_args)
                .envs(env.iter().cloned()),
        )
    } else {
        step(
            "cargo test",
            cargo()
                .args(["test", "--workspace", "--no-fail-fast"])
                .args(runner_args)
                .envs(env.iter().cloned()),
        )
    }
}

/// The tests of the crates that write `outbox_event` (the store, the
/// publisher, the dispatcher) once more, each test database with a
/// partitioned `outbox_event` (`OUTBOX_TEST_PARTITIONED=1`, see
/// `outbox_testkit`): every operation works on both forms of the table,
/// and the dispatcher's plan tests hold on both (they measure the rows a
/// claim reads, and count a partition's index as its table's). The same
/// binaries as the first run, so nothing is built again. Left out: the
/// publisher's compile-fail tests (no database).
pub const PARTITIONED_FILTER: &str = "(package(outbox-store) | package(outbox-publish) | package(outbox-dispatch)) \
     & !binary(compile_fail)";

fn run_partitioned_tests(env: &[(&'static str, String)]) -> Result<()> {
    step(
        "cargo nextest run (partitioned outbox_event)",
        cargo()
            .args(["nextest", "run", "--workspace", "--no-fail-fast", "-E"])
            .arg(PARTITIONED_FILTER)
            .env("OUTBOX_TEST_PARTITIONED", "1")
            .envs(env.iter().cloned()),
    )
}

/// Every bench stage at tiny sizes, so the bench never rots (its figures
/// are not looked at), and the demo at a small size on the debug binaries
/// the tests built: the real processes end to end, a SIGKILL, and its
/// verdict.
async fn smoke_runs() -> Result<()> {
    eprintln!("\n==> cargo xtask bench --smoke");
    crate::bench::run(crate::bench::BenchArgs::smoke()).await?;
    eprintln!("\n==> cargo xtask demo --events 300 --debug");
    crate::demo::run(crate::demo::DemoArgs::for_tests()).await
}

/// The docs with warnings denied, and the library crates as crates.io
/// would receive them (metadata, README and licence files, the migrations
/// outbox-model embeds).
fn docs_and_package() -> Result<()> {
    step(
        "cargo doc (warnings denied)",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // As docs.rs builds them (all features): the `sqlx` modules too.
    step(
        "cargo doc of the publisher with all features (warnings denied)",
        cargo()
            .args([
                "doc",
                "-p",
                "outbox-publish",
                "-p",
                "outbox-store",
                "--no-deps",
                "--all-features",
            ])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    crate::publish::package()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_runs_with_nextest_on_an_unfiltered_run_only() {
        assert_eq!(gate(true, false), Gate::Run);
        assert_eq!(gate(true, true), Gate::SkipFiltered);
        assert_eq!(gate(false, false), Gate::SkipWithoutNextest);
        assert_eq!(gate(false, true), Gate::SkipWithoutNextest);
    }
}
