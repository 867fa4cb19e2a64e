//! `cargo xtask verify-workflow-outbox-native`: the workflow readiness gate.
//!
//! Composes focused tests, one [`Part`] per claim about the workflow path,
//! and prints a pass/fail table with a total. A part passes when its
//! nextest filterset matches at least one test and every test it matches
//! passes, so a renamed or deleted test fails its part instead of passing
//! it silently (a filterset naming a test binary that does not exist is
//! refused by nextest, which fails the part too). It proves what those tests prove; it is not a probe of a
//! live deployment's queues.
//!
//! How it runs: one `cargo nextest list` per part says which tests the
//! part has (listing is cheap and nextest alone evaluates filtersets
//! exactly), then a single `cargo nextest run` of the union runs each test
//! once, in parallel, after one build; its libtest-json lines give each
//! test's result, which is credited to the parts that listed it. Running
//! each part separately would be simpler to write but builds, lists and
//! schedules nine times and runs shared tests twice.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cmd::{cargo, run as step};
use crate::services;

/// One claim of the gate: a name and the nextest filterset of its tests.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    /// What the tests show, as the table prints it.
    pub name: &'static str,
    /// A nextest filterset (`cargo nextest run --workspace -E '<filter>'`).
    pub filter: &'static str,
}

/// The parts of the gate, in the order of the table.
pub const PARTS: &[Part] = &[
    Part {
        name: "outbox.workflow routing",
        filter: "(binary_id(=outbox-catalog) \
                   & test(=tests::standard_table_routes_as_the_contract_says)) \
                 | (binary_id(=outbox-dispatch::router_props) \
                   & test(=standard_table_routes_by_the_contract)) \
                 | (binary_id(=outbox-workflow-store::producers) \
                   & test(=every_workflow_event_routes_to_the_workflow_queue))",
    },
    Part {
        name: "subscriber start-up in the general group",
        filter: "binary_id(=outbox-worker::workflow) \
                 & test(=the_general_group_starts_the_workflow_subscriber_and_the_mail_group_does_not)",
    },
    Part {
        name: "native/hybrid/http selection",
        filter: "binary_id(=outbox-workflow-bridge::executor)",
    },
    Part {
        name: "credential-free native boundaries",
        filter: "(binary_id(=outbox-workflow-model::definitions) \
                   & (test(=the_realistic_workflow_is_valid_and_walkable) \
                      | test(=preflight_names_the_first_bridge_block_in_order))) \
                 | (binary_id(=outbox-workflow-runner::runner) \
                   & test(=a_bridge_only_block_rejects_the_run_before_its_first_block))",
    },
    Part {
        name: "worker fail-loud settings",
        filter: "(binary_id(=outbox-worker) & test(/^config::tests::/)) \
                 | (binary_id(=outbox-worker::e2e) \
                   & test(=a_bad_batch_size_stops_start_up_with_a_clear_message)) \
                 | (binary_id(=outbox-worker::dedupe) \
                   & test(=receivers_that_would_forget_before_the_queue_stop_start_up))",
    },
    Part {
        name: "manual/API/continuation producers",
        filter: "binary_id(=outbox-workflow-store::producers)",
    },
    Part {
        name: "source inventory",
        filter: "binary_id(=xtask::bin/xtask) & test(/^verify::inventory::tests::/)",
    },
    Part {
        name: "capability matrix",
        filter: "binary_id(=outbox-workflow-model::registry_matrix)",
    },
    Part {
        name: "bridge signature checks",
        filter: "binary_id(=outbox-workflow-bridge::bridge)",
    },
    Part {
        name: "one writer per run, resumed after kills",
        filter: "binary_id(=outbox-workflow-runner::lease) | binary_id(=outbox-worker::workflow_kills)",
    },
];

/// `cargo xtask verify-workflow-outbox-native`: finds the services, then
/// [`verify`].
pub async fn run() -> Result<()> {
    let found = services::ensure().await?;
    verify(&found.test_env())
}

/// Runs the gate, passing `env` to the test processes, and prints the
/// table.
///
/// # Errors
///
/// When a part fails, or the tests cannot be built or run.
pub fn verify(env: &[(&'static str, String)]) -> Result<()> {
    step(
        "build the test binaries",
        cargo()
            .args(["nextest", "run", "--workspace", "--no-run"])
            .envs(env.iter().cloned()),
    )?;
    let listings: Vec<Listing> = PARTS.iter().map(|part| list(part.filter, env)).collect();
    let listed: BTreeSet<&str> = listings
        .iter()
        .filter_map(|l| match l {
            Listing::Tests(tests) => Some(tests.iter().map(String::as_str)),
            Listing::Error(_) => None,
        })
        .flatten()
        .collect();
    let results = if listed.is_empty() {
        BTreeMap::new()
    } else {
        let union: Vec<String> = PARTS
            .iter()
            .zip(&listings)
            .filter(|(_, l)| matches!(l, Listing::Tests(t) if !t.is_empty()))
            .map(|(part, _)| format!("({})", part.filter))
            .collect();
        run_tests(&union.join(" | "), env)?
    };
    let rows: Vec<Row> = PARTS
        .iter()
        .zip(&listings)
        .map(|(part, listing)| evaluate(part, listing, &results))
        .collect();
    print!("{}", render(&rows));
    let failed = rows.iter().filter(|r| !r.passed()).count();
    if failed > 0 {
        bail!(
            "workflow readiness gate: {failed} of {} parts failed",
            rows.len()
        );
    }
    Ok(())
}

/// The tests a part's filterset matches, or why nextest could not say.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listing {
    /// Test ids, `<package>::<binary name>$<test name>` (maybe none).
    Tests(BTreeSet<String>),
    /// nextest refused the filterset or the listing failed.
    Error(String),
}

/// Lists the (non-ignored) tests `filter` matches.
fn list(filter: &str, env: &[(&'static str, String)]) -> Listing {
    let output = cargo()
        .args(["nextest", "list", "--workspace", "--message-format", "json"])
        .args(["-E", filter])
        .envs(env.iter().cloned())
        .stderr(Stdio::piped())
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) => return Listing::Error(format!("cannot run cargo nextest list: {e}")),
    };
    if !output.status.success() {
        return Listing::Error(nextest_errors(&String::from_utf8_lossy(&output.stderr)));
    }
    match serde_json::from_slice::<Value>(&output.stdout) {
        Ok(listing) => Listing::Tests(matching_tests(&listing)),
        Err(e) => Listing::Error(format!("unreadable nextest listing: {e}")),
    }
}

/// The `error:` lines of nextest's (or cargo's) stderr, joined: for a
/// filterset naming a test binary that does not exist, "operator didn't
/// match any binary IDs; failed to parse filterset".
fn nextest_errors(stderr: &str) -> String {
    let errors: Vec<&str> = stderr
        .lines()
        .filter_map(|line| line.trim().strip_prefix("error:"))
        .map(str::trim)
        .take(3)
        .collect();
    if errors.is_empty() {
        "cargo nextest list failed".to_owned()
    } else {
        errors.join("; ")
    }
}

/// The ids of the tests a `cargo nextest list --message-format json`
/// listing marks as matching its filter, as libtest-json names them:
/// `<package>::<binary name>$<test name>` (not the binary id: a library's
/// tests are `outbox-worker::outbox_worker$…`, a binary's `xtask::xtask$…`).
fn matching_tests(listing: &Value) -> BTreeSet<String> {
    let Some(suites) = listing["rust-suites"].as_object() else {
        return BTreeSet::new();
    };
    suites
        .values()
        .flat_map(|suite| {
            let binary = format!(
                "{}::{}",
                suite["package-name"].as_str().unwrap_or_default(),
                suite["binary-name"].as_str().unwrap_or_default()
            );
            let cases = suite["testcases"].as_object().into_iter().flatten();
            cases
                .filter(|(_, case)| case["filter-match"]["status"] == "matches")
                .map(move |(name, _)| format!("{binary}${name}"))
        })
        .collect()
}

/// Runs the tests `filter` matches once; each test id with whether it
/// passed.
fn run_tests(filter: &str, env: &[(&'static str, String)]) -> Result<BTreeMap<String, bool>> {
    eprintln!("\n==> cargo nextest run (the gate's tests)");
    let mut child = cargo()
        .args(["nextest", "run", "--workspace", "--no-fail-fast"])
        .args(["--message-format", "libtest-json", "-E", filter])
        .env("NEXTEST_EXPERIMENTAL_LIBTEST_JSON", "1")
        .envs(env.iter().cloned())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo nextest run")?;
    let stdout = child.stdout.take().context("no stdout from nextest")?;
    let mut results = BTreeMap::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("cannot read nextest's output")?;
        if let Some((test, passed)) = test_result(&line) {
            results.insert(test, passed);
        }
    }
    // Its exit status says nothing the results do not: a failed test is
    // reported by its part.
    child.wait().context("cargo nextest run did not finish")?;
    Ok(results)
}

/// A libtest-json line's test result: (`<package>::<binary name>$<test
/// name>`, passed).
fn test_result(line: &str) -> Option<(String, bool)> {
    let event: Value = serde_json::from_str(line).ok()?;
    if event["type"] != "test" {
        return None;
    }
    let name = event["name"].as_str()?.to_owned();
    match event["event"].as_str()? {
        "started" => None,
        "ok" => Some((name, true)),
        _ => Some((name, false)),
    }
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    name: &'static str,
    /// Tests that passed.
    passed: usize,
    /// Tests the part matched.
    total: usize,
    /// Why the part failed.
    problem: Option<String>,
}

impl Row {
    fn passed(&self) -> bool {
        self.problem.is_none()
    }
}

/// A part's row: it passes when it matched tests and every one passed.
fn evaluate(part: &Part, listing: &Listing, results: &BTreeMap<String, bool>) -> Row {
    let row = |passed, total, problem| Row {
        name: part.name,
        passed,
        total,
        problem,
    };
    let tests = match listing {
        Listing::Error(e) => return row(0, 0, Some(format!("nextest: {e}"))),
        Listing::Tests(tests) if tests.is_empty() => {
            return row(0, 0, Some("no test matches its filterset".into()));
        }
        Listing::Tests(tests) => tests,
    };
    let failed: Vec<&str> = tests
        .iter()
        .filter(|t| results.get(*t) != Some(&true))
        .map(String::as_str)
        .collect();
    let problem = (!failed.is_empty()).then(|| {
        let not_run = failed.iter().filter(|t| !results.contains_key(**t)).count();
        let mut text = format!("failed: {}", failed.join(", "));
        if not_run > 0 {
            text.push_str(&format!(" ({not_run} not run)"));
        }
        text
    });
    row(tests.len() - failed.len(), tests.len(), problem)
}

/// The table: one line per part, then the total.
fn render(rows: &[Row]) -> String {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let mut out = format!(
        "\nworkflow readiness gate\n{:<width$}  {:>7}  result\n",
        "part", "tests"
    );
    for row in rows {
        let tests = format!("{}/{}", row.passed, row.total);
        let result = if row.passed() { "PASS" } else { "FAIL" };
        out.push_str(&format!("{:<width$}  {tests:>7}  {result}", row.name));
        if let Some(problem) = &row.problem {
            out.push_str(&format!("  {problem}"));
        }
        out.push('\n');
    }
    let passed = rows.iter().filter(|r| r.passed()).count();
    let verdict = if passed == rows.len() { "PASS" } else { "FAIL" };
    out.push_str(&format!(
        "{:<width$}  {:>7}  {verdict}\n",
        "total (parts passed)",
        format!("{passed}/{}", rows.len())
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PART: Part = Part {
        name: "producers",
        filter: "binary_id(=outbox-workflow-store::producers)",
    };

    fn tests(ids: &[&str]) -> Listing {
        Listing::Tests(ids.iter().map(|t| (*t).to_owned()).collect())
    }

    fn results(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(t, p)| ((*t).to_owned(), *p)).collect()
    }

    #[test]
    fn a_part_without_tests_fails() {
        let row = evaluate(&PART, &tests(&[]), &results(&[]));
        assert_eq!(
            row.problem.as_deref(),
            Some("no test matches its filterset")
        );
        let row = evaluate(&PART, &Listing::Error("bad".into()), &results(&[]));
        assert!(!row.passed());
    }

    #[test]
    fn a_part_passes_only_when_each_of_its_tests_passed() {
        let listing = tests(&["p$a", "p$b"]);
        let all = results(&[("p$a", true), ("p$b", true), ("q$c", false)]);
        assert_eq!(
            evaluate(&PART, &listing, &all),
            Row {
                name: "producers",
                passed: 2,
                total: 2,
                problem: None
            }
        );
        let one_failed = results(&[("p$a", true), ("p$b", false)]);
        let row = evaluate(&PART, &listing, &one_failed);
        assert_eq!((row.passed, row.total), (1, 2));
        assert_eq!(row.problem.as_deref(), Some("failed: p$b"));
        let one_missing = results(&[("p$a", true)]);
        let row = evaluate(&PART, &listing, &one_missing);
        assert_eq!(row.problem.as_deref(), Some("failed: p$b (1 not run)"));
    }

    #[test]
    fn the_table_has_a_line_per_part_and_a_total() {
        let rows = [
            evaluate(&PART, &tests(&["p$a"]), &results(&[("p$a", true)])),
            evaluate(&PART, &tests(&[]), &results(&[])),
        ];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 5, "{table}");
        assert!(
            lines[2].contains("1/1") && lines[2].contains("PASS"),
            "{table}"
        );
        assert!(
            lines[3].contains("0/0") && lines[3].contains("FAIL"),
            "{table}"
        );
        assert!(
            lines[4].contains("1/2") && lines[4].ends_with("FAIL"),
            "{table}"
        );
    }

    #[test]
    fn listings_and_libtest_lines_are_read() {
        let listing = serde_json::json!({ "rust-suites": {
            "outbox-worker": {
                "package-name": "outbox-worker", "binary-name": "outbox_worker",
                "testcases": {
                    "a": { "filter-match": { "status": "matches" } },
                    "b": { "filter-match": { "status": "mismatch", "reason": "ignored" } }
                }
            },
            "outbox-worker::e2e": {
                "package-name": "outbox-worker", "binary-name": "e2e",
                "testcases": { "c": { "filter-match": { "status": "matches" } } }
            }
        } });
        assert_eq!(
            matching_tests(&listing),
            BTreeSet::from([
                "outbox-worker::e2e$c".to_owned(),
                "outbox-worker::outbox_worker$a".to_owned()
            ])
        );
        let ok = r#"{"type":"test","event":"ok","name":"x::y$t","exec_time":0.1}"#;
        assert_eq!(test_result(ok), Some(("x::y$t".to_owned(), true)));
        let failed = r#"{"type":"test","event":"failed","name":"x::y$t"}"#;
        assert_eq!(test_result(failed), Some(("x::y$t".to_owned(), false)));
        let started = r#"{"type":"test","event":"started","name":"x::y$t"}"#;
        assert_eq!(test_result(started), None);
        assert_eq!(test_result(r#"{"type":"suite","event":"ok"}"#), None);
        let missing_binary = "  error: operator didn't match any binary IDs\n   ╭────\n\
                              error: failed to parse filterset\n";
        assert_eq!(
            nextest_errors(missing_binary),
            "operator didn't match any binary IDs; failed to parse filterset"
        );
    }

    #[test]
    fn parts_have_distinct_names_and_filters() {
        let names: BTreeSet<&str> = PARTS.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), PARTS.len());
        assert!(PARTS.iter().all(|p| !p.filter.trim().is_empty()));
    }
}
