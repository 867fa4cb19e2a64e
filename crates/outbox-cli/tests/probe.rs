//! `outbox probe`, run as the real binary: with nothing running it names
//! the missing dispatcher; with a real `worker-general` it sees the probe
//! event handed off and handled and the probe workflow succeed; a run that
//! ends in error fails it at once; bad values are usage errors.
//!
//! Where `worker-general` comes from: Cargo gives a test the path of the
//! binaries of its own package only (`CARGO_BIN_EXE_outbox` here), and
//! artifact dependencies are not stable. The test lives here rather than in
//! `outbox-worker` because the binary under test, `outbox`, must be the one
//! just built; `worker-general` is only the environment. It is taken from
//! next to this test's executable (`target/debug/`), where any workspace run
//! (`cargo nextest run --workspace`, `cargo xtask test`, CI) has built it
//! fresh before the first test starts (the worker's own tests need it). Run
//! alone (`-p outbox-cli`), build it first: `cargo build -p outbox-worker
//! --bin worker-general`; `OUTBOX_TEST_WORKER_GENERAL` names another path.
//! The test fails, naming that command, when the binary is missing. It does
//! not run `cargo build` itself: a build of one package resolves features
//! differently from the workspace build and would rebuild and replace the
//! binary while other tests run it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_model::schema::{outbox_event, workflow_execution};
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_test_support::{ChildOutput, eventually};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::common::{Env, Run};

/// How long a test waits for something a process does.
const WAIT: Duration = Duration::from_secs(60);

/// The ids a JSON report names.
fn id(report: &Value, key: &str) -> Uuid {
    report[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key}: {report}"))
        .parse()
        .unwrap()
}

/// The stages of a JSON report that were reached, in order.
fn reached(report: &Value) -> Vec<&str> {
    report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["reached"] == true)
        .map(|s| s["stage"].as_str().unwrap())
        .collect()
}

impl Env {
    async fn event(&self, id: Uuid) -> OutboxEvent {
        let mut conn = self.db.conn().await;
        outbox_event::table
            .find(id)
            .select(OutboxEvent::as_select())
            .get_result(&mut conn)
            .await
            .unwrap()
    }

    /// The number `sql` (a `SELECT count(*) …`) returns.
    async fn count(&self, sql: &str) -> i64 {
        let mut conn = self.db.conn().await;
        diesel::dsl::sql::<diesel::sql_types::BigInt>(sql)
            .get_result(&mut conn)
            .await
            .unwrap()
    }

    async fn execution_status(&self, id: Uuid) -> ExecutionStatus {
        let mut conn = self.db.conn().await;
        store::get_execution(&mut conn, id)
            .await
            .unwrap()
            .unwrap()
            .status
    }

    /// `outbox probe args` started in the background, its output piped.
    fn spawn_outbox(&self, args: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(args)
            .env("DATABASE_URL", self.db.url())
            .env("REDIS_URL", self.redis.url())
            .env("OUTBOX_QUEUE_PREFIX", self.namespace.prefix())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// A real `worker-general` on this database and these queues, with
    /// the dispatcher on.
    fn worker_general(&self) -> Worker {
        let binary = worker_general_binary();
        let mut child = Command::new(&binary)
            .env("DATABASE_URL", self.db.url())
            .env("REDIS_URL", self.redis.url())
            .env("OUTBOX_QUEUE_PREFIX", self.namespace.prefix())
            .env("OUTBOX_DISPATCHER_ENABLED", "true")
            .env("OUTBOX_DISPATCH_INTERVAL_MS", "200")
            .env("WORKER_HTTP_ADDR", "127.0.0.1:0")
            .env("WORKER_HEARTBEAT_MS", "1000")
            .env("WORKER_POLL_INTERVAL_MS", "200")
            .env("WORKER_GAUGE_INTERVAL_MS", "1000")
            .env("WORKER_SHUTDOWN_GRACE_MS", "3000")
            .env("DATABASE_POOL_SIZE", "6")
            .env(
                "RUST_LOG",
                "info,apalis=warn,apalis_core=warn,apalis_redis=warn",
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let output = ChildOutput::capture(&mut child);
        Worker { child, output }
    }
}

/// The `worker-general` binary: `OUTBOX_TEST_WORKER_GENERAL`, else the one
/// next to this test's executable (see the file's header).
fn worker_general_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_TEST_WORKER_GENERAL") {
        return PathBuf::from(path);
    }
    // target/debug/deps/probe-<hash> → target/debug/worker-general
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join(format!("worker-general{}", std::env::consts::EXE_SUFFIX)))
        .unwrap();
    assert!(
        path.is_file(),
        "no worker-general at {}: run the workspace's tests (cargo nextest run --workspace), \
         or build it first with `cargo build -p outbox-worker --bin worker-general`, \
         or set OUTBOX_TEST_WORKER_GENERAL to its path",
        path.display()
    );
    path
}

/// A running `worker-general`, killed on drop (before the test database is
/// dropped: declare it after the [`Env`]).
struct Worker {
    child: Child,
    output: ChildOutput,
}

impl Worker {
    /// Everything it wrote so far.
    fn output(&self) -> String {
        self.output.text()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn with_nothing_running_the_probe_names_the_missing_dispatcher() {
    let env = Env::new().await;

    let run = env.outbox(&["probe", "--timeout", "1s"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.line("published").contains("audit.outbox.probe"));
    assert!(
        run.stdout.contains(
            "the event is still PENDING after 1.0 s: no dispatcher is running \
             (worker-general with OUTBOX_DISPATCHER_ENABLED=true)"
        ),
        "{}",
        run.stdout
    );
    assert!(run.line("not reached").contains("handed off, handled"));
    let follow_up = run.line("follow up:");
    let event: Uuid = follow_up
        .trim_start_matches("follow up: outbox show ")
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {follow_up}"));
    let row = env.event(event).await;
    assert_eq!(row.status, OutboxStatus::Pending);
    assert_eq!(row.tenant_id, "outbox-probe");
    assert_eq!(row.event_type, "audit.outbox.probe");
    let payload = row.payload.value().unwrap();
    assert!(payload["probeId"].is_string() && payload["at"].is_string());

    // With --workflow and --json: the run is requested and stays queued.
    let run = env.outbox(&[
        "probe",
        "--workflow",
        "--timeout",
        "1s",
        "--tenant",
        "acme-probe",
        "--json",
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(report["verdict"], "timeout");
    assert_eq!(report["tenant"], "acme-probe");
    assert_eq!(reached(&report), ["published", "run_requested"]);
    assert_eq!(report["stages"].as_array().unwrap().len(), 6);
    assert!(report["stages"][0]["elapsed_ms"].is_u64());
    assert_eq!(report["timeout_ms"], 1000);
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0]
            .as_str()
            .unwrap()
            .contains("still PENDING after 1.0 s: no dispatcher is running"),
        "{problems:?}"
    );
    assert!(
        problems[1].as_str().unwrap().starts_with(
            "the run is still queued: the run request is still PENDING after 1.0 s: no dispatcher"
        ),
        "{problems:?}"
    );
    let execution = id(&report, "execution_id");
    assert_eq!(
        env.execution_status(execution).await,
        ExecutionStatus::Queued
    );
    assert_eq!(
        env.event(id(&report, "event_id")).await.tenant_id,
        "acme-probe"
    );
    let workflow = &report["workflow"];
    assert_eq!(workflow["name"], "outbox-probe");
    assert_eq!(
        (&workflow["saved"], &workflow["version"]),
        (&json!(true), &json!(1))
    );
    let workflow_id = id(workflow, "id");
    let versions =
        format!("SELECT count(*) FROM workflow_version WHERE workflow_id = '{workflow_id}'");

    // The workflow is saved only when missing or different.
    let probe_at_once = || {
        let args = [
            "probe",
            "--workflow",
            "--timeout",
            "0s",
            "--tenant",
            "acme-probe",
            "--json",
        ];
        let run = env.outbox(&args);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        run.json()["workflow"].clone()
    };
    let again = probe_at_once();
    assert_eq!(
        (&again["saved"], &again["version"]),
        (&json!(false), &json!(1))
    );
    assert_eq!(env.count(&versions).await, 1);
    let other = WorkflowDefinition::from_value(json!({
        "blocks": [{ "id": "start", "type": "manualTrigger" }], "edges": []
    }))
    .unwrap();
    let mut conn = env.db.conn().await;
    store::save_workflow(
        &mut conn,
        "acme-probe",
        "outbox-probe",
        WorkflowStatus::Live,
        &other,
    )
    .await
    .unwrap();
    let changed = probe_at_once();
    assert_eq!(
        (&changed["saved"], &changed["version"]),
        (&json!(true), &json!(3))
    );
    assert_eq!(env.count(&versions).await, 3);
}

#[tokio::test]
async fn a_run_that_ends_in_error_fails_the_probe_at_once_with_its_error() {
    let env = Env::new().await;
    let mut probe = env.spawn_outbox(&["probe", "--workflow", "--timeout", "60s", "--json"]);

    let mut conn = env.db.conn().await;
    let mut execution = None;
    eventually("the probe's run to be requested", WAIT, async || {
        execution = workflow_execution::table
            .filter(workflow_execution::tenant_id.eq("outbox-probe"))
            .select(workflow_execution::id)
            .get_result::<Uuid>(&mut conn)
            .await
            .optional()
            .unwrap();
        execution.is_some()
    })
    .await;
    let execution = execution.unwrap();
    // As a runner records a failed block.
    env.sql(&format!(
        "UPDATE workflow_execution SET status = 'error', error = 'block log: boom',
                started_at = now(), finished_at = now(), updated_at = now()
          WHERE id = '{execution}'"
    ))
    .await;

    let mut status = None;
    eventually("the probe to exit", WAIT, async || {
        status = probe.try_wait().unwrap();
        status.is_some()
    })
    .await;
    let mut stdout = String::new();
    probe
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!(status.unwrap().code(), Some(1), "{stdout}");
    let report = Run {
        code: 1,
        stdout,
        stderr: String::new(),
    }
    .json();
    assert_eq!(report["verdict"], "failed");
    assert_eq!(id(&report, "execution_id"), execution);
    assert_eq!(
        report["problems"],
        json!(["the run ended error: block log: boom"])
    );
    assert!(
        report["elapsed_ms"].as_u64().unwrap() < 60_000,
        "it did not wait for the timeout: {report}"
    );
}

#[tokio::test]
async fn a_real_worker_general_hands_off_handles_and_runs_the_probe() {
    let env = Env::new().await;
    let worker = env.worker_general();

    let run = env.outbox(&["probe", "--workflow", "--timeout", "60s"]);
    assert_eq!(
        run.code,
        0,
        "{}{}\nworker-general:\n{}",
        run.stdout,
        run.stderr,
        worker.output()
    );
    for stage in [
        "published",
        "run requested",
        "handed off",
        "handled",
        "run started",
        "run succeeded",
    ] {
        let line = run.line(stage);
        assert!(
            line.contains(" ms") || line.contains(" s"),
            "{stage} without its time: {line}"
        );
    }
    assert!(run.line("handed off").contains("outbox.audit"));
    assert!(
        run.line("workflow outbox-probe")
            .contains("saved as version 1")
    );
    assert!(run.stdout.contains("probe passed in"), "{}", run.stdout);

    let run = env.outbox(&["probe", "--workflow", "--timeout", "60s", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(report["verdict"], "ok");
    assert_eq!(report["problems"], json!([]));
    assert_eq!(
        report["workflow"]["saved"], false,
        "unchanged the second time"
    );
    assert_eq!(
        reached(&report),
        [
            "published",
            "handed_off",
            "handled",
            "run_requested",
            "run_started",
            "run_succeeded"
        ]
    );
    let event = id(&report, "event_id");
    assert_eq!(env.event(event).await.status, OutboxStatus::Done);
    let audited = format!("SELECT count(*) FROM audit_log WHERE outbox_event_id = '{event}'");
    assert_eq!(env.count(&audited).await, 1);
    let execution = id(&report, "execution_id");
    assert_eq!(
        env.execution_status(execution).await,
        ExecutionStatus::Success
    );
    drop(worker);
}

#[tokio::test]
async fn bad_values_are_usage_errors_naming_the_flag() {
    let env = Env::new().await;
    for (args, flag) in [
        (&["probe", "--timeout", "soon"][..], "--timeout"),
        (&["probe", "--timeout", "5é"][..], "--timeout"),
        (
            &["probe", "--timeout", "99999999999999999999s"][..],
            "--timeout",
        ),
        (&["probe", "--tenant", ""][..], "--tenant"),
    ] {
        let run = env.outbox(args);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(flag), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }

    // No Postgres: a connection error, exit 2, nothing published.
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["probe", "--timeout", "1s"])
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nowhere")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot connect to Postgres"), "{stderr}");
}
