//! `outbox workflow validate | save | publish | versions | start | answer |
//! cancel`, run as the real binary against Postgres: what each changes in
//! the workflow tables and the outbox, what it prints, and its exit code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{outbox_event, workflow, workflow_execution, workflow_version};
use outbox_workflow_runner::{RunOutcome, Runner};
use outbox_workflow_store::{self as store, ExecutionStatus};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::common::{Env, Run};

/// manualTrigger → waitForInput `ask` → log.
const WAITS: &str = r#"{
  "blocks": [
    { "id": "start", "type": "manualTrigger" },
    { "id": "ask", "type": "waitForInput", "params": { "prompt": "Approve order {{ input.order }}?" } },
    { "id": "done", "type": "log", "params": { "message": "approved: {{ blocks.ask.output.answer.approved }}" } }
  ],
  "edges": [
    { "from": "start", "to": "ask" },
    { "from": "ask", "to": "done", "label": "input" }
  ]
}"#;

/// manualTrigger → log: ends `success` at once.
const LOGS: &str = r#"{
  "blocks": [
    { "id": "start", "type": "manualTrigger" },
    { "id": "note", "type": "log", "params": { "message": "hello" } }
  ],
  "edges": [{ "from": "start", "to": "note" }]
}"#;

/// A definition file under the temporary directory, removed on drop.
struct File(PathBuf);

impl File {
    fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("outbox-workflow-{}.json", Uuid::new_v4()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `outbox args` with no database configured at all, `stdin` on its input.
fn outbox_without_database(args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    Run::from(child.wait_with_output().unwrap())
}

/// The outbox rows of `event_type` whose payload names `execution`.
async fn events(conn: &mut AsyncPgConnection, event_type: &str, execution: Uuid) -> Vec<Value> {
    let payloads: Vec<Value> = outbox_event::table
        .filter(outbox_event::event_type.eq(event_type))
        .select(outbox_event::payload)
        .load(conn)
        .await
        .unwrap();
    payloads
        .into_iter()
        .filter(|p| p["executionId"] == execution.to_string())
        .collect()
}

async fn outbox_rows(conn: &mut AsyncPgConnection) -> i64 {
    outbox_event::table.count().get_result(conn).await.unwrap()
}

/// `outbox workflow save` of `definition` as `name` of `acme`, with
/// `flags`; panics unless it exits 0. Returns its JSON.
fn save(env: &Env, name: &str, definition: &str, flags: &[&str]) -> Value {
    let file = File::new(definition);
    let mut args = vec!["workflow", "save", "--tenant", "acme", "--name", name];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--json", file.path()]);
    let run = env.outbox(&args);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    run.json()
}

/// `outbox workflow start` of `workflow` of `acme` with `input`; panics
/// unless it exits 0. Returns the execution id.
fn start(env: &Env, workflow: &str, input: &str) -> Uuid {
    let run = env.outbox(&[
        "workflow", "start", "--tenant", "acme", workflow, "--input", input, "--json",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    run.json()["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn execution(conn: &mut AsyncPgConnection, id: Uuid) -> store::WorkflowExecution {
    store::get_execution(conn, id).await.unwrap().unwrap()
}

/// A valid definition the native runner refuses gets a note that says
/// what would run it: the bridge for a bridge-only block; nothing yet for
/// a credential, as there is no credential store.
// Break checked: the former note (the bridge's executors named for every
// refusal) fails the credential's case.
#[test]
fn validate_notes_what_a_refused_definition_needs_the_bridge_or_a_credential_store() {
    let bridge_only = r#"{ "blocks": [
        { "id": "start", "type": "manualTrigger" },
        { "id": "script", "type": "code", "params": { "language": "javascript", "source": "return 1;" } } ],
      "edges": [ { "from": "start", "to": "script" } ] }"#;
    let with_credential = r#"{ "blocks": [
        { "id": "start", "type": "manualTrigger" },
        { "id": "call", "type": "httpRequest",
          "params": { "method": "GET", "url": "https://crm.example.test/x", "credentialId": "crm-token" } } ],
      "edges": [ { "from": "start", "to": "call" } ] }"#;
    for (definition, refusal, hint) in [
        (
            bridge_only,
            "cannot run natively",
            "it needs WORKFLOW_EXECUTOR hybrid or http",
        ),
        (
            with_credential,
            "needs credential \"crm-token\"",
            "no executor has a credential store yet: a run of it ends rejected",
        ),
    ] {
        let run = outbox_without_database(&["workflow", "validate", "-"], Some(definition));
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let note = run
            .stdout
            .lines()
            .find(|l| l.starts_with("note: the native runner refuses it"))
            .unwrap_or_else(|| panic!("no note in {}", run.stdout));
        assert!(note.contains(refusal) && note.ends_with(hint), "{note}");
    }
}

#[test]
fn validate_accepts_a_good_definition_and_names_the_block_or_edge_of_a_bad_one_without_a_database()
{
    let good = File::new(WAITS);
    let run = outbox_without_database(&["workflow", "validate", good.path()], None);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.starts_with("ok: "), "{}", run.stdout);
    assert!(
        run.stdout.contains("3 block(s), 2 edge(s)"),
        "{}",
        run.stdout
    );

    let cycle = r#"{ "blocks": [
        { "id": "start", "type": "manualTrigger" },
        { "id": "a", "type": "log", "params": { "message": "a" } },
        { "id": "b", "type": "log", "params": { "message": "b" } } ],
      "edges": [ { "from": "start", "to": "a" }, { "from": "a", "to": "b" }, { "from": "b", "to": "a" } ] }"#;
    let unknown_type = r#"{ "blocks": [
        { "id": "start", "type": "manualTrigger" },
        { "id": "ping", "type": "slackMessage" } ],
      "edges": [ { "from": "start", "to": "ping" } ] }"#;
    let dangling = r#"{ "blocks": [
        { "id": "start", "type": "manualTrigger" },
        { "id": "note", "type": "log", "params": { "message": "n" } } ],
      "edges": [ { "from": "start", "to": "note" }, { "from": "note", "to": "ghost" } ] }"#;
    for (definition, names) in [
        (cycle, "the workflow has a cycle through block \"a\""),
        (
            unknown_type,
            "block \"ping\" has unknown type \"slackMessage\"",
        ),
        (
            dangling,
            "edge 1 (\"note\" -> \"ghost\"): no block \"ghost\"",
        ),
    ] {
        let file = File::new(definition);
        let run = outbox_without_database(&["workflow", "validate", file.path()], None);
        assert_eq!(run.code, 1, "{names}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(names), "{names}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
        // The same from standard input, as JSON on stdout.
        let run =
            outbox_without_database(&["workflow", "validate", "-", "--json"], Some(definition));
        assert_eq!(run.code, 1, "{names}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.json()["valid"], false);
        let error = run.json()["error"].as_str().unwrap().to_owned();
        assert!(error.contains(names), "{names}: {error}");
    }

    let run = outbox_without_database(&["workflow", "validate", "-", "--json"], Some(WAITS));
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["valid"], true);
    assert_eq!(run.json()["trigger"], "start");

    let run = outbox_without_database(&["workflow", "validate", "/nonexistent/flow.json"], None);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("/nonexistent/flow.json"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn save_creates_version_1_then_a_live_save_version_2_and_versions_marks_the_current_one() {
    let env = Env::new().await;
    let mut conn = env.db.conn().await;

    let first = save(&env, "approval", WAITS, &[]);
    assert_eq!(first["version"], 1);
    assert_eq!(first["status"], "draft");
    assert_eq!(first["new_version"], true);
    let second = save(&env, "approval", LOGS, &["--live"]);
    assert_eq!(second["version"], 2);
    assert_eq!(second["status"], "live");
    assert_eq!(second["workflow_id"], first["workflow_id"]);

    let id = first["workflow_id"].as_str().unwrap();
    let stored: Vec<i32> = workflow_version::table
        .select(workflow_version::version)
        .order(workflow_version::version)
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, [1, 2]);

    // By name and by id alike.
    for reference in ["approval", id] {
        let run = env.outbox(&[
            "workflow", "versions", "--tenant", "acme", reference, "--json",
        ]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let listed: Vec<(i64, bool)> = run.json()["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["version"].as_i64().unwrap(),
                    v["current"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(listed, [(1, false), (2, true)], "{reference}");
    }
    let table = env.outbox(&["workflow", "versions", "--tenant", "acme", "approval"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.line("2 ").trim_end().ends_with('*'),
        "{}",
        table.stdout
    );
    assert!(
        !table.line("1 ").trim_end().ends_with('*'),
        "{}",
        table.stdout
    );

    // An invalid definition saves nothing; another tenant sees no workflow.
    let bad = File::new(
        r#"{ "blocks": [ { "id": "note", "type": "log", "params": { "message": "n" } } ] }"#,
    );
    let run = env.outbox(&[
        "workflow",
        "save",
        "--tenant",
        "acme",
        "--name",
        "approval",
        bad.path(),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("no trigger block"), "{}", run.stderr);
    let versions: i64 = workflow_version::table
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(versions, 2);
    let run = env.outbox(&["workflow", "versions", "--tenant", "globex", "approval"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("has no workflow \"approval\""),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn publish_makes_a_draft_live_and_refuses_another_tenant_s_workflow() {
    let env = Env::new().await;
    let mut conn = env.db.conn().await;
    save(&env, "approval", WAITS, &["--draft"]);

    let run = env.outbox(&["workflow", "publish", "--tenant", "globex", "approval"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let status: String = workflow::table
        .select(workflow::status)
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(status, "draft");

    let run = env.outbox(&[
        "workflow", "publish", "--tenant", "acme", "approval", "--json",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.json()["status"], "live");
    assert_eq!(run.json()["current_version"], 1);
    let status: String = workflow::table
        .select(workflow::status)
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(status, "live");
}

#[tokio::test]
async fn start_queues_one_execution_with_its_input_and_publishes_exactly_one_execution_requested() {
    let env = Env::new().await;
    let mut conn = env.db.conn().await;
    save(&env, "approval", WAITS, &[]);

    let id = start(&env, "approval", r#"{"order": 7}"#);
    let run = execution(&mut conn, id).await;
    assert_eq!(run.status, ExecutionStatus::Queued);
    assert_eq!(run.input, json!({ "order": 7 }));
    assert_eq!(run.tenant_id, "acme");
    let requested = events(&mut conn, "workflow.execution.requested", id).await;
    assert_eq!(requested.len(), 1, "{requested:?}");
    assert_eq!(outbox_rows(&mut conn).await, 1, "nothing else published");

    // --input-file, from standard input here, as the run's input.
    let text = "{\"order\": 8}";
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args([
            "workflow",
            "start",
            "--tenant",
            "acme",
            "approval",
            "--input-file",
            "-",
            "--json",
        ])
        .env("DATABASE_URL", env.db.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let piped = Run::from(child.wait_with_output().unwrap());
    assert_eq!(piped.code, 0, "{}", piped.stderr);
    let second: Uuid = piped.json()["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        execution(&mut conn, second).await.input,
        json!({ "order": 8 })
    );

    // No such workflow, or input that is not JSON: nothing written.
    let run = env.outbox(&["workflow", "start", "--tenant", "acme", "nope"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let run = env.outbox(&[
        "workflow", "start", "--tenant", "acme", "approval", "--input", "{order",
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("--input"), "{}", run.stderr);
    assert_eq!(outbox_rows(&mut conn).await, 2);
}

#[tokio::test]
async fn answer_publishes_one_continue_request_for_a_waiting_run_and_refuses_a_queued_one_naming_its_status()
 {
    let env = Env::new().await;
    let mut conn = env.db.conn().await;
    save(&env, "approval", WAITS, &["--live"]);
    let waiting = start(&env, "approval", r#"{"order": 7}"#);
    let outcome = Runner::new()
        .unwrap()
        .run(&mut conn, waiting)
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Waiting("ask".into()));
    let queued = start(&env, "approval", "{}");

    let run = env.outbox(&[
        "workflow",
        "answer",
        "--tenant",
        "acme",
        &waiting.to_string(),
        "--input",
        r#"{"approved": true}"#,
        "--by",
        "alice",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("\"ask\""), "{}", run.stdout);
    let blocks = store::block_executions(&mut conn, waiting).await.unwrap();
    let asked = blocks.iter().find(|b| b.block_id == "ask").unwrap();
    assert_eq!(asked.answered_by().map(|(by, _)| by), Some("alice"));
    let continued = events(&mut conn, "workflow.execution.continue.requested", waiting).await;
    assert_eq!(continued.len(), 1, "{continued:?}");
    assert_eq!(continued[0]["waitingBlock"], "ask");
    assert_eq!(continued[0]["kind"], "input");
    assert_eq!(continued[0]["input"], json!({ "approved": true }));

    // The same wait answered again: the first answer stands.
    let run = env.outbox(&[
        "workflow",
        "answer",
        "--tenant",
        "acme",
        &waiting.to_string(),
        "--json",
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.json()["duplicate"], true);
    assert_eq!(
        events(&mut conn, "workflow.execution.continue.requested", waiting)
            .await
            .len(),
        1
    );

    let before = outbox_rows(&mut conn).await;
    let run = env.outbox(&[
        "workflow",
        "answer",
        "--tenant",
        "acme",
        &queued.to_string(),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("is queued, not waiting"),
        "{}",
        run.stderr
    );
    let run = env.outbox(&[
        "workflow",
        "answer",
        "--tenant",
        "globex",
        &waiting.to_string(),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(&format!("no execution {waiting}")),
        "{}",
        run.stderr
    );
    assert_eq!(
        outbox_rows(&mut conn).await,
        before,
        "a refusal writes nothing"
    );
}

#[tokio::test]
async fn cancel_ends_queued_and_waiting_runs_cancelled_with_one_failed_hook_each_and_refuses_a_finished_run()
 {
    let env = Env::new().await;
    let mut conn = env.db.conn().await;
    let runner = Runner::new().unwrap();
    save(&env, "approval", WAITS, &["--live"]);
    save(&env, "hello", LOGS, &["--live"]);
    let queued = start(&env, "approval", "{}");
    let waiting = start(&env, "approval", "{}");
    assert_eq!(
        runner.run(&mut conn, waiting).await.unwrap(),
        RunOutcome::Waiting("ask".into())
    );
    let finished = start(&env, "hello", "{}");
    assert_eq!(
        runner.run(&mut conn, finished).await.unwrap(),
        RunOutcome::Finished(ExecutionStatus::Success)
    );

    for (id, was) in [(queued, "queued"), (waiting, "waiting")] {
        let run = env.outbox(&[
            "workflow",
            "cancel",
            "--tenant",
            "acme",
            &id.to_string(),
            "--by",
            "alice",
            "--json",
        ]);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        assert_eq!(run.json()["previous_status"], was);
        let cancelled = execution(&mut conn, id).await;
        assert_eq!(cancelled.status, ExecutionStatus::Cancelled);
        assert_eq!(cancelled.error.as_deref(), Some("cancelled by alice"));
        assert_eq!(cancelled.waiting_block, None);
        assert!(cancelled.finished_at.is_some());
        let hooks = events(&mut conn, "plugin.hook.workflow.failed", id).await;
        assert_eq!(
            hooks,
            [json!({
                "executionId": id, "workflowId": cancelled.workflow_id,
                "status": "cancelled", "error": "cancelled by alice",
            })]
        );
    }
    // The cancelled waiting run no longer takes an answer, nor a second cancel.
    let run = env.outbox(&[
        "workflow",
        "answer",
        "--tenant",
        "acme",
        &waiting.to_string(),
    ]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("is cancelled, not waiting"),
        "{}",
        run.stderr
    );

    let before = outbox_rows(&mut conn).await;
    for (id, status) in [(finished, "success"), (queued, "cancelled")] {
        let run = env.outbox(&["workflow", "cancel", "--tenant", "acme", &id.to_string()]);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        assert!(
            run.stderr
                .contains(&format!("already finished: it is {status}")),
            "{}",
            run.stderr
        );
    }
    let run = env.outbox(&[
        "workflow",
        "cancel",
        "--tenant",
        "globex",
        &finished.to_string(),
    ]);
    assert_eq!(run.code, 1);
    assert_eq!(
        execution(&mut conn, finished).await.status,
        ExecutionStatus::Success
    );
    assert_eq!(
        outbox_rows(&mut conn).await,
        before,
        "a refusal writes nothing"
    );
    let cancelled: i64 = workflow_execution::table
        .filter(workflow_execution::status.eq("cancelled"))
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(cancelled, 2);
}

/// The reference of the CLI, `docs/operations/cli.md`.
const OPERATIONS: &str = include_str!("../../../docs/operations/cli.md");

#[test]
fn each_workflow_command_s_help_and_the_operations_reference_give_its_exit_codes() {
    for command in [
        "validate", "save", "publish", "versions", "start", "answer", "cancel",
    ] {
        let run = outbox_without_database(&["workflow", command, "--help"], None);
        assert_eq!(run.code, 0, "{command}: {}", run.stderr);
        let codes = run
            .stdout
            .split("Exit codes: ")
            .nth(1)
            .unwrap_or_else(|| panic!("{command}: no exit codes in\n{}", run.stdout));
        for code in ["0 ", "; 1 ", "; 2 "] {
            assert!(codes.contains(code), "{command}: {code:?} in {codes}");
        }
        let row = OPERATIONS
            .lines()
            .find(|line| line.starts_with(&format!("| `workflow {command} ")))
            .unwrap_or_else(|| panic!("{command}: no row in docs/operations/cli.md"));
        // what it does | exit 0 | exit 1 | exit 2
        assert_eq!(row.matches(" | ").count(), 4, "{command}: {row}");
    }
}
