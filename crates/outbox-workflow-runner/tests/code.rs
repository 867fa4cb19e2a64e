//! The `code` block on real Postgres: a bridge runner
//! ([`Runner::with_bridge_blocks`]) runs its JavaScript in the sandbox and
//! records what it returns; a native runner rejects the workflow; a throw,
//! an endless loop, a missing host function or a huge allocation fails the
//! block with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runs;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::workflow_execution;
use outbox_test_support::TestDatabase;
use outbox_workflow_runner::{HOOK_EXECUTED, HOOK_FAILED, NO_MODEL_PROVIDER, RunOutcome, Runner};
use outbox_workflow_store::ExecutionStatus;
use runs::{block_results, execution, outbox, queued};
use serde_json::{Value, json};
use uuid::Uuid;

const SUM: &str =
    "return { total: input.items.reduce((a, b) => a + b, 0), who: vars.name ?? null }";

/// manualTrigger → variable `name` → code `js` (`source`) → if
/// `blocks.js.output.total >= 10` → true: log.
fn code_workflow(source: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "name", "type": "variable", "params": {
                "name": "name", "value": { "var": "input.customer" } } },
            { "id": "js", "type": "code", "params": { "language": "javascript", "source": source } },
            { "id": "big", "type": "if", "params": { "condition":
                { "left": { "var": "blocks.js.output.total" }, "op": "gte", "right": 10 } } },
            { "id": "note", "type": "log", "params": {
                "message": "{{ blocks.js.output.who }}: {{ blocks.js.output.total }}" } }
        ],
        "edges": [
            { "from": "start", "to": "name" },
            { "from": "name", "to": "js" },
            { "from": "js", "to": "big" },
            { "from": "big", "to": "note", "label": "true" }
        ]
    })
}

fn bridge() -> Runner {
    Runner::new()
        .unwrap()
        .with_bridge_blocks(std::sync::Arc::new(outbox_workflow_sandbox::QuickJs))
}

/// Runs `source` as the `js` block with a bridge runner; the run must end
/// in `error` at that block. Returns the block's recorded error without its
/// `block js: ` prefix.
async fn failing(conn: &mut AsyncPgConnection, source: &str) -> String {
    let input = json!({ "items": [1, 2], "customer": "ada" });
    let id = queued(conn, code_workflow(source), input).await;
    let outcome = bridge().run(conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));
    let rows = block_results(conn, id).await;
    let statuses: Vec<(&str, &str)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(
        statuses,
        [("start", "success"), ("name", "success"), ("js", "error")]
    );
    let (_, _, output, error) = rows.into_iter().nth(2).unwrap();
    assert_eq!(output, None);
    // The block row and the execution carry the same reason.
    let error = error.unwrap();
    assert_eq!(execution(conn, id).await.error.as_ref(), Some(&error));
    let types: Vec<String> = outbox(conn).await.into_iter().map(|e| e.0).collect();
    assert_eq!(types, [HOOK_FAILED]);
    error
        .strip_prefix("block js: ")
        .unwrap_or_else(|| panic!("{error}"))
        .to_owned()
}

#[tokio::test]
async fn a_bridge_runner_runs_the_code_and_records_its_output() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let input = json!({ "items": [4, 5, 6], "customer": "ada" });
    let id = queued(&mut conn, code_workflow(SUM), input).await;
    let runner = bridge();

    let outcome = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let rows = block_results(&mut conn, id).await;
    let js = rows.iter().find(|r| r.0 == "js").unwrap();
    assert_eq!(
        js,
        &(
            "js".to_owned(),
            "success".to_owned(),
            Some(json!({ "total": 15, "who": "ada" })),
            None
        )
    );
    let ids: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(ids, ["start", "name", "js", "big", "note"]);
    let run = execution(&mut conn, id).await;
    assert_eq!(run.status, ExecutionStatus::Success);
    assert_eq!(run.output.unwrap()["message"], "ada: 15");
    let types: Vec<String> = outbox(&mut conn).await.into_iter().map(|e| e.0).collect();
    assert_eq!(types, [HOOK_EXECUTED]);

    // A redelivered job reads the recorded output: nothing runs again.
    let again = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(again, RunOutcome::Unchanged(ExecutionStatus::Success));
    assert_eq!(block_results(&mut conn, id).await, rows);
}

#[tokio::test]
async fn a_missing_variable_is_null_and_the_false_branch_ends_the_run() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, code_workflow(SUM), json!({ "items": [1, 2] })).await;
    let outcome = bridge().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let rows = block_results(&mut conn, id).await;
    let js = rows.iter().find(|r| r.0 == "js").unwrap();
    assert_eq!(js.2, Some(json!({ "total": 3, "who": null })));
    assert_eq!(
        execution(&mut conn, id).await.output,
        Some(json!({ "result": false }))
    );
}

#[tokio::test]
async fn a_native_runner_rejects_the_workflow_before_any_block() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let input = json!({ "items": [4, 5, 6], "customer": "ada" });
    let id = queued(&mut conn, code_workflow(SUM), input).await;
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Rejected));
    let run = execution(&mut conn, id).await;
    let reason = run.error.unwrap();
    assert!(
        reason.contains("\"js\"") && reason.contains("code"),
        "{reason}"
    );
    assert!(block_results(&mut conn, id).await.is_empty());
    let types: Vec<String> = outbox(&mut conn).await.into_iter().map(|e| e.0).collect();
    assert_eq!(types, [HOOK_FAILED]);
}

/// Marks a queued run `running`, as if a preflight had passed: the runner
/// then walks it without preflighting (a resumed run).
async fn started(conn: &mut AsyncPgConnection, id: Uuid) {
    diesel::update(workflow_execution::table.find(id))
        .set(workflow_execution::status.eq("running"))
        .execute(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_native_runner_that_reaches_a_code_block_fails_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, code_workflow(SUM), json!({ "items": [1] })).await;
    started(&mut conn, id).await;
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));
    assert_eq!(
        execution(&mut conn, id).await.error.as_deref(),
        Some("block js: block type code does not run natively")
    );
}

#[tokio::test]
async fn a_thrown_error_fails_the_block_with_its_message() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let error = failing(
        &mut conn,
        "if (input.items.length < 3) throw new RangeError('too few items'); return 1",
    )
    .await;
    assert_eq!(error, "the code threw RangeError: too few items");
}

// Break checked: without the replacement in `made_before`, the result
// cannot be recorded (Postgres refuses NUL in jsonb and text), the run is
// released for a retry and these tests fail.
#[tokio::test]
async fn a_nul_character_in_what_the_code_returns_is_recorded_as_a_replacement_character() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let input = json!({ "items": [4, 5, 6], "customer": "ada" });
    let source = r#"return { total: 15, who: "a\u0000b", ["k\u0000"]: 1 }"#;
    let id = queued(&mut conn, code_workflow(source), input).await;

    let outcome = bridge().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let rows = block_results(&mut conn, id).await;
    let js = rows.iter().find(|r| r.0 == "js").unwrap();
    assert_eq!(
        js.2,
        Some(json!({ "total": 15, "who": "a\u{FFFD}b", "k\u{FFFD}": 1 }))
    );
}

#[tokio::test]
async fn a_nul_character_in_what_the_code_throws_ends_the_run_with_its_message() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let error = failing(&mut conn, r#"throw new Error("bad\u0000byte")"#).await;
    assert_eq!(error, "the code threw Error: bad\u{FFFD}byte");
}

#[tokio::test]
async fn an_endless_loop_fails_the_block_at_the_deadline() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let error = failing(&mut conn, "while (true) {}").await;
    assert_eq!(error, "code ran longer than 2 s");
}

#[tokio::test]
async fn require_and_fetch_do_not_exist() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let error = failing(
        &mut conn,
        "const fs = require('fs'); return fs.readFileSync('/etc/passwd')",
    )
    .await;
    assert_eq!(
        error,
        "the code threw ReferenceError: require is not defined"
    );
    let error = failing(&mut conn, "return fetch('http://127.0.0.1:1/')").await;
    assert_eq!(error, "the code threw ReferenceError: fetch is not defined");
}

#[tokio::test]
async fn a_huge_allocation_hits_the_memory_limit() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let error = failing(
        &mut conn,
        "const chunks = []; while (true) chunks.push(new Array(1e5).fill(input.items)); return 1",
    )
    .await;
    assert_eq!(error, "code used more than 32 MiB of memory");
}

#[tokio::test]
async fn a_result_without_json_form_fails_the_block() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let error = failing(&mut conn, "return () => input").await;
    assert_eq!(error, "the code's result is not JSON: a function");
}

fn ai_workflow() -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "aiAgent", "params": {
                "credentialId": "openai", "model": "m", "prompt": "{{ input.q }}" } }
        ],
        "edges": [{ "from": "start", "to": "ask" }]
    })
}

#[tokio::test]
async fn ai_agent_cannot_run_even_in_a_bridge_runner() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    // There is no credential store: the preflight refuses its credential.
    let id = queued(&mut conn, ai_workflow(), json!({ "q": "hi" })).await;
    let outcome = bridge().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Rejected));
    let reason = execution(&mut conn, id).await.error.unwrap();
    assert!(reason.contains("openai"), "{reason}");

    // Reached anyway, the block fails: there is no model provider.
    let id = queued(&mut conn, ai_workflow(), json!({ "q": "hi" })).await;
    started(&mut conn, id).await;
    let outcome = bridge().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));
    assert_eq!(
        execution(&mut conn, id).await.error,
        Some(format!("block ask: {NO_MODEL_PROVIDER}"))
    );
}
