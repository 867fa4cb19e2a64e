//! `cargo xtask mutants`: mutation testing of the crates whose promises
//! matter most, with a time budget, and a caught ratio per crate.
//!
//! cargo-mutants changes the code one small way at a time (a condition
//! inverted, a function body replaced by a default) and runs the tests; a
//! mutant no test notices ("missed") is a behaviour no test pins down. The
//! results land in `target/mutants/mutants.out/` (`caught.txt`,
//! `missed.txt`, `timeout.txt`, `unviable.txt`, one mutant per line,
//! written as the run goes), which this command summarises, also after the
//! budget cut a run short.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cmd::{cargo, probe, target_dir, workspace_root};
use crate::services;

/// The crates mutation runs cover by default.
pub const DEFAULT_CRATES: &[&str] = &[
    "outbox-dispatch",
    "outbox-queue",
    "outbox-idempotency",
    "outbox-publish",
    "outbox-subscriber",
    "outbox-subscriber-audit",
    "outbox-subscriber-mail",
    "outbox-subscriber-webhook",
    "outbox-subscriber-workflow",
    "outbox-cli",
    "outbox-operator",
];

/// Options of `cargo xtask mutants`.
#[derive(Args, Debug)]
pub struct MutantsArgs {
    /// A crate to mutate (repeatable); default: the dispatcher, queue,
    /// idempotency, publish, subscriber, CLI and operator crates.
    #[arg(long = "crate", value_name = "CRATE")]
    pub crates: Vec<String>,
    /// Stop starting new mutants after this many minutes and report what
    /// ran.
    #[arg(long, default_value_t = 120)]
    pub budget_minutes: u64,
    /// Only mutate files whose path contains this (e.g. `claim.rs`).
    #[arg(long)]
    pub file: Option<String>,
    /// Also run this package's tests against each mutant (repeatable).
    /// Behaviour of a library is often tested from the crates that use it
    /// (the queue's worker store from the subscriber and dispatcher
    /// tests); without this only the mutated crate's own tests run.
    #[arg(long = "test-package", value_name = "CRATE")]
    pub test_packages: Vec<String>,
    /// Mutate the checkout itself instead of a copy, and build in the
    /// usual target directory: no cold build of a copy first. Each file is
    /// restored after its mutant; do not edit the tree while it runs (use
    /// a separate `git worktree`).
    #[arg(long)]
    pub in_place: bool,
    /// Only summarise the last run's results.
    #[arg(long)]
    pub report_only: bool,
    /// Test one mutant in every N, spread evenly over the crates' files
    /// (cargo-mutants' round-robin shard 0 of N): an estimate of the caught
    /// ratio in a 1/N of the time of a full run.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    pub sample: Option<u32>,
    /// Which of the `--sample` shards to test, from 0 to N-1: another
    /// shard draws other mutants, for a fresh estimate after tests were
    /// added for the misses of an earlier one.
    #[arg(long, value_name = "K", default_value_t = 0, requires = "sample")]
    pub sample_shard: u32,
    /// The least time a mutant's tests get before they count as timed out.
    /// cargo-mutants sets the limit from the unmutated run; on a busy
    /// machine the same tests later run several times slower, and a
    /// passing suite cut short would be counted as a caught mutant.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_MIN_TEST_TIMEOUT)]
    pub min_test_timeout: u64,
    /// Only the mutants whose name (as `cargo mutants --list` shows it)
    /// matches this regular expression, e.g. to test again the ones an
    /// earlier run timed out on.
    #[arg(long, value_name = "REGEX")]
    pub only: Option<String>,
}

/// The nextest option that ends a mutant's test run at its first failure,
/// without waiting for the tests still running.
pub const IMMEDIATE_STOP: &str = "--max-fail=1:immediate";

/// Default of `--min-test-timeout`, in seconds.
pub const DEFAULT_MIN_TEST_TIMEOUT: u64 = 300;

/// Runs cargo-mutants (when not `--report-only`) and prints the summary;
/// fails when cargo-mutants is not installed.
pub async fn run(args: MutantsArgs) -> Result<()> {
    let out = target_dir().join("mutants");
    if !args.report_only {
        if !probe("cargo", &["mutants", "--version"]) {
            bail!(
                "cargo-mutants is not installed; install it with\n    cargo install cargo-mutants --locked\nand run again"
            );
        }
        std::fs::create_dir_all(&out)
            .with_context(|| format!("cannot create {}", out.display()))?;
        let found = services::ensure().await?;
        services::sweep_abandoned_databases(&found.database_url).await;
        let crates: Vec<String> = if args.crates.is_empty() {
            DEFAULT_CRATES.iter().map(|c| (*c).to_owned()).collect()
        } else {
            args.crates.clone()
        };
        let mut command = Command::new("cargo");
        command.current_dir(workspace_root());
        if !args.in_place {
            // cargo-mutants builds each copy of the tree in its own target
            // directory; a shared CARGO_TARGET_DIR would make the copies
            // overwrite each other's builds.
            command.env_remove("CARGO_TARGET_DIR");
        }
        command.args(mutants_args(&args, &crates, &out)?).envs([
            ("DATABASE_URL", found.database_url.clone()),
            ("REDIS_URL", found.redis_url.clone()),
            ("OUTBOX_TEST_DATABASE_URL", found.database_url.clone()),
            ("OUTBOX_TEST_REDIS_URL", found.redis_url.clone()),
        ]);
        if runs_tests_of(&crates, &args.test_packages, WORKER_GENERAL_USERS) {
            command.env("OUTBOX_TEST_WORKER_GENERAL", build_worker_general()?);
        }
        eprintln!(
            "==> cargo mutants on {} (budget {} min{})",
            crates.join(", "),
            args.budget_minutes,
            args.sample.map_or_else(String::new, |n| format!(
                ", one mutant in {n}, shard {}",
                args.sample_shard
            ))
        );
        run_within_budget(&mut command, args.budget_minutes).await?;
    }
    let summary = summarise(&out.join("mutants.out"))?;
    print!("{}", render(&summary));
    Ok(())
}

/// Crates whose tests start the `worker-general` binary, which a test run
/// of those crates alone does not build.
const WORKER_GENERAL_USERS: &[&str] = &["outbox-cli"];

/// Whether the run tests one of `users`: mutated, or named with
/// `--test-package`.
fn runs_tests_of(crates: &[String], test_packages: &[String], users: &[&str]) -> bool {
    crates
        .iter()
        .chain(test_packages)
        .any(|name| users.contains(&name.as_str()))
}

/// Builds the unmutated `worker-general` (debug) and returns its path, for
/// `OUTBOX_TEST_WORKER_GENERAL`: `cargo test -p outbox-cli` builds only
/// the CLI's binaries, and its probe tests start a worker.
fn build_worker_general() -> Result<std::path::PathBuf> {
    crate::cmd::run(
        "cargo build -p outbox-worker --bin worker-general (the CLI's probe tests start it)",
        cargo().args(["build", "-p", "outbox-worker", "--bin", "worker-general"]),
    )?;
    Ok(target_dir()
        .join("debug")
        .join(format!("worker-general{}", std::env::consts::EXE_SUFFIX)))
}

/// The arguments of `cargo`: `mutants` and its options for `args`, the
/// mutated `crates` and the output folder `out`.
fn mutants_args(args: &MutantsArgs, crates: &[String], out: &Path) -> Result<Vec<OsString>> {
    let mut list: Vec<OsString> = vec!["mutants".into()];
    if args.in_place {
        // One tree, one build at a time: the usual target directory is
        // safe, and warm.
        list.push("--in-place".into());
    }
    let mut push = |items: &[&str]| list.extend(items.iter().map(OsString::from));
    push(&["--test-tool", "nextest", "--no-shuffle", "--output"]);
    list.push(out.as_os_str().to_owned());
    for name in crates {
        list.extend(["--package".into(), name.into()]);
    }
    if !args.test_packages.is_empty() {
        // The mutated crates' own tests always run too.
        let mut tested: Vec<&String> = crates.iter().chain(&args.test_packages).collect();
        tested.dedup();
        for name in tested {
            list.extend(["--test-package".into(), name.into()]);
        }
    }
    if let Some(file) = &args.file {
        list.extend(["--file".into(), format!("**/*{file}*").into()]);
    }
    if let Some(n) = args.sample {
        if args.sample_shard >= n {
            bail!(
                "--sample-shard {} is out of range: with --sample {n} it is 0 to {}",
                args.sample_shard,
                n - 1
            );
        }
        list.extend(
            sample_args(args.sample_shard, n)
                .into_iter()
                .map(OsString::from),
        );
    }
    if let Some(only) = &args.only {
        list.extend(["--re".into(), only.into()]);
    }
    list.extend([
        "--minimum-test-timeout".into(),
        args.min_test_timeout.to_string().into(),
    ]);
    // A mutant is caught by its first failing test. By default nextest
    // then waits for the tests still running, and a test the mutant
    // broke in another way may wait out its whole deadline (a
    // reconciliation test waited over two minutes so): end them at once.
    // nextest signals each test's process group, so a private
    // `redis-server` a killed test started goes with it; the keys and
    // databases it leaves are swept as after any killed suite.
    list.push(format!("--cargo-test-arg={IMMEDIATE_STOP}").into());
    Ok(list)
}

/// Starts `command` and waits for it, killing it when the budget of
/// `minutes` runs out.
async fn run_within_budget(command: &mut Command, minutes: u64) -> Result<()> {
    let mut child = command.spawn().context("cannot start cargo mutants")?;
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);
    loop {
        if let Some(status) = child.try_wait()? {
            // cargo-mutants exits 2 when mutants were missed, 3 on
            // timeouts: results, not failures of this command.
            eprintln!("cargo mutants finished: {status}");
            return Ok(());
        }
        if Instant::now() >= deadline {
            eprintln!("budget reached: stopping cargo mutants; the summary covers what ran");
            let _ = child.kill();
            let _ = child.wait();
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The cargo-mutants arguments that test one mutant in every `n`: shard
/// `k` of `n`, dealt round-robin so that the sample covers every file
/// rather than the `k`-th `1/n` of the list.
#[must_use]
pub fn sample_args(k: u32, n: u32) -> [String; 4] {
    [
        "--shard".to_owned(),
        format!("{k}/{n}"),
        "--sharding".to_owned(),
        "round-robin".to_owned(),
    ]
}

/// Outcomes of one crate's mutants.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CrateOutcome {
    /// Noticed by a failing test.
    pub caught: usize,
    /// Not noticed.
    pub missed: Vec<String>,
    /// The tests did not finish in time (counted as caught by
    /// cargo-mutants' convention: the behaviour changed).
    pub timeout: usize,
    /// Did not compile.
    pub unviable: usize,
}

impl CrateOutcome {
    /// caught / (caught + missed), timeouts counted as caught; `None` when
    /// no viable mutant ran.
    #[must_use]
    pub fn ratio(&self) -> Option<f64> {
        let caught = self.caught + self.timeout;
        let total = caught + self.missed.len();
        (total > 0).then(|| caught as f64 / total as f64)
    }
}

/// The crate a mutant line (`crates/<crate>/src/...:line:col: ...`) is in.
fn crate_of(line: &str) -> String {
    let mut parts = line.split('/');
    match (parts.next(), parts.next()) {
        (Some("crates"), Some(name)) => name.to_owned(),
        (Some(first), _) => first.split(':').next().unwrap_or(first).to_owned(),
        _ => "?".to_owned(),
    }
}

/// Reads the outcome files of `dir` (missing files count as empty).
///
/// # Errors
///
/// When a file exists but cannot be read.
pub fn summarise(dir: &Path) -> Result<BTreeMap<String, CrateOutcome>> {
    let mut by_crate: BTreeMap<String, CrateOutcome> = BTreeMap::new();
    for (file, kind) in [
        ("caught.txt", 0),
        ("missed.txt", 1),
        ("timeout.txt", 2),
        ("unviable.txt", 3),
    ] {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let outcome = by_crate.entry(crate_of(line)).or_default();
            match kind {
                0 => outcome.caught += 1,
                1 => outcome.missed.push(line.to_owned()),
                2 => outcome.timeout += 1,
                _ => outcome.unviable += 1,
            }
        }
    }
    Ok(by_crate)
}

/// The summary table and the missed mutants.
#[must_use]
pub fn render(summary: &BTreeMap<String, CrateOutcome>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<30} {:>7} {:>7} {:>8} {:>9} {:>7}",
        "crate", "caught", "missed", "timeout", "unviable", "ratio"
    );
    let mut all = CrateOutcome::default();
    for (name, outcome) in summary {
        let ratio = outcome
            .ratio()
            .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
        let _ = writeln!(
            out,
            "{:<30} {:>7} {:>7} {:>8} {:>9} {:>7}",
            name,
            outcome.caught,
            outcome.missed.len(),
            outcome.timeout,
            outcome.unviable,
            ratio
        );
        all.caught += outcome.caught;
        all.timeout += outcome.timeout;
        all.unviable += outcome.unviable;
        all.missed.extend(outcome.missed.iter().cloned());
    }
    let ratio = all
        .ratio()
        .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
    let _ = writeln!(
        out,
        "{:<30} {:>7} {:>7} {:>8} {:>9} {:>7}",
        "total",
        all.caught,
        all.missed.len(),
        all.timeout,
        all.unviable,
        ratio
    );
    if !all.missed.is_empty() {
        let _ = writeln!(out, "\nmissed (no test noticed):");
        for line in &all.missed {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_name_the_crates_the_sample_and_the_immediate_stop() {
        let args = MutantsArgs {
            crates: Vec::new(),
            budget_minutes: 10,
            file: Some("claim".to_owned()),
            test_packages: vec!["outbox-tests".to_owned()],
            in_place: true,
            report_only: false,
            sample: Some(4),
            sample_shard: 1,
            min_test_timeout: DEFAULT_MIN_TEST_TIMEOUT,
            only: None,
        };
        let crates = ["outbox-dispatch".to_owned()];
        let list = mutants_args(&args, &crates, Path::new("/t/mutants")).unwrap();
        let list: Vec<String> = list
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut expected: Vec<String> = [
            "mutants",
            "--in-place",
            "--test-tool",
            "nextest",
            "--no-shuffle",
            "--output",
            "/t/mutants",
            "--package",
            "outbox-dispatch",
            "--test-package",
            "outbox-dispatch",
            "--test-package",
            "outbox-tests",
            "--file",
            "**/*claim*",
        ]
        .map(str::to_owned)
        .to_vec();
        expected.extend(sample_args(1, 4));
        expected.extend(
            [
                "--minimum-test-timeout",
                "300",
                "--cargo-test-arg=--max-fail=1:immediate",
            ]
            .map(str::to_owned),
        );
        assert_eq!(list, expected);
        let out_of_range = MutantsArgs {
            sample_shard: 4,
            ..args
        };
        assert!(mutants_args(&out_of_range, &crates, Path::new("/t")).is_err());
    }

    #[test]
    fn outcomes_are_counted_per_crate_with_timeouts_as_caught() {
        let dir = std::env::temp_dir().join(format!("mutants-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("caught.txt"),
            "crates/outbox-dispatch/src/claim.rs:10:5: replace a with b\n\
             crates/outbox-dispatch/src/claim.rs:12:5: replace c with d\n\
             crates/outbox-cli/src/main.rs:3:1: replace e with f\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("missed.txt"),
            "crates/outbox-dispatch/src/lease.rs:7:9: replace == with !=\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("timeout.txt"),
            "crates/outbox-cli/src/main.rs:9:1: x\n",
        )
        .unwrap();
        let summary = summarise(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let dispatch = &summary["outbox-dispatch"];
        assert_eq!(dispatch.caught, 2);
        assert_eq!(dispatch.missed.len(), 1);
        assert!((dispatch.ratio().unwrap() - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(summary["outbox-cli"].ratio(), Some(1.0));
        let table = render(&summary);
        assert!(table.contains("lease.rs:7:9"), "{table}");
        assert!(table.contains("80.0%"), "{table}");
    }

    #[test]
    fn a_sample_is_one_round_robin_shard_of_n() {
        assert_eq!(
            sample_args(3, 8),
            ["--shard", "3/8", "--sharding", "round-robin"].map(str::to_owned)
        );
    }

    #[test]
    fn no_results_is_no_ratio() {
        let summary = summarise(Path::new("/nonexistent/mutants.out")).unwrap();
        assert!(summary.is_empty());
        assert!(render(&summary).contains("total"));
    }

    /// A run mutating the CLI, or testing with its tests, builds the
    /// worker its probe tests start; other runs do not.
    #[test]
    fn only_runs_with_the_clis_tests_need_the_worker_binary() {
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert!(runs_tests_of(
            &names(&["outbox-cli"]),
            &[],
            WORKER_GENERAL_USERS
        ));
        assert!(runs_tests_of(
            &names(&["outbox-operator"]),
            &names(&["outbox-cli"]),
            WORKER_GENERAL_USERS
        ));
        assert!(!runs_tests_of(
            &names(&["outbox-dispatch"]),
            &names(&["outbox-subscriber"]),
            WORKER_GENERAL_USERS
        ));
    }
}
