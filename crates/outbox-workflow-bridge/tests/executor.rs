//! Executor selection (`WORKFLOW_EXECUTOR=native|hybrid|http`) on real
//! Postgres with a real bridge: which runs go where, and what each mode
//! does with a workflow the native runner cannot run.
//!
//! The bridge in these tests may call internal addresses and the worker's
//! native runner may not, so where a run went shows in what its
//! `httpRequest` block did to the HTTP sink.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{SECRET, client, serve_bridge};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::OutboxTx;
use outbox_test_support::{HttpSink, TestDatabase};
use outbox_workflow_bridge::BridgeSecret;
use outbox_workflow_bridge::executor::{Executor, ExecutorMode, MissingBridge, Route};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_model::events::ContinueKind;
use outbox_workflow_runner::{AddressPolicy, RunOutcome, Runner};
use outbox_workflow_store::producers::{self, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;

async fn queued(conn: &mut AsyncPgConnection, definition: Value) -> Uuid {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    let workflow = store::save_workflow(conn, "t1", "wf", WorkflowStatus::Live, &definition)
        .await
        .unwrap()
        .workflow
        .id;
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        producers::request_execution(&mut tx, "t1", workflow, RunTrigger::Manual, &json!({})).await
    })
    .await
    .unwrap()
}

/// manualTrigger → httpRequest to `url`.
fn calls(url: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "call", "type": "httpRequest", "params": { "method": "POST", "url": url } }
        ],
        "edges": [{ "from": "start", "to": "call" }]
    })
}

/// The worker's runner: internal addresses refused.
fn worker_runner() -> Runner {
    Runner::new().unwrap()
}

/// A bridge that may call the sink; an executor of `mode` using it.
async fn executor(db: &TestDatabase, mode: ExecutorMode) -> Executor {
    let bridge_runner = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    let url = serve_bridge(db.pool().clone(), bridge_runner, &[SECRET]).await;
    Executor::new(mode, worker_runner(), Some(client(&url, SECRET))).unwrap()
}

async fn status(conn: &mut AsyncPgConnection, id: Uuid) -> ExecutionStatus {
    store::get_execution(conn, id)
        .await
        .unwrap()
        .unwrap()
        .status
}

#[test]
fn executor_modes_parse_and_a_bridge_mode_needs_a_bridge() {
    assert_eq!("native".parse(), Ok(ExecutorMode::Native));
    assert_eq!("hybrid".parse(), Ok(ExecutorMode::Hybrid));
    assert_eq!("http".parse(), Ok(ExecutorMode::Http));
    let error = "remote".parse::<ExecutorMode>().unwrap_err();
    assert!(
        error.to_string().contains("native, hybrid or http"),
        "{error}"
    );
    assert_eq!(ExecutorMode::default(), ExecutorMode::Native);
    for mode in [ExecutorMode::Hybrid, ExecutorMode::Http] {
        let refused = Executor::new(mode, worker_runner(), None).unwrap_err();
        assert_eq!(refused, MissingBridge { mode });
        assert!(refused.to_string().contains("WORKFLOW_BRIDGE_URL"));
    }
    assert!(Executor::new(ExecutorMode::Native, worker_runner(), None).is_ok());
}

#[tokio::test]
async fn native_mode_rejects_a_workflow_with_a_bridge_only_block_before_any_block_runs() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(
        &mut conn,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "js", "type": "code", "params": { "language": "javascript", "source": "return 1" } }
            ],
            "edges": [{ "from": "start", "to": "js" }]
        }),
    )
    .await;
    let executor = Executor::native(worker_runner());
    let outcome = executor.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Rejected));
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert!(run.error.unwrap().contains("js"));
}

#[tokio::test]
async fn http_mode_sends_runs_and_continuations_to_the_bridge() {
    let db = TestDatabase::new().await;
    let sink = HttpSink::start().await;
    let mut conn = db.conn().await;
    let id = queued(
        &mut conn,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "ask", "type": "waitForInput", "params": { "prompt": "go?" } },
                { "id": "call", "type": "httpRequest", "params": { "method": "POST", "url": sink.url_for("/hook") } }
            ],
            "edges": [{ "from": "start", "to": "ask" }, { "from": "ask", "to": "call", "label": "input" }]
        }),
    )
    .await;
    let executor = executor(&db, ExecutorMode::Http).await;
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(
        executor.route(&mut conn, &run, None).await.unwrap(),
        Route::Bridge
    );

    let outcome = executor.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Waiting("ask".into()));
    let outcome = executor
        .resume(
            &mut conn,
            id,
            "ask",
            ContinueKind::Input,
            &json!({ "go": true }),
        )
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    // Only the bridge may call the sink: the call went from there.
    assert_eq!(sink.requests_to("/hook").len(), 1);
}

#[tokio::test]
async fn hybrid_mode_runs_natively_what_passes_the_native_preflight() {
    let db = TestDatabase::new().await;
    let sink = HttpSink::start().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, calls(&sink.url_for("/hook"))).await;
    let executor = executor(&db, ExecutorMode::Hybrid).await;
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(
        executor.route(&mut conn, &run, None).await.unwrap(),
        Route::Native
    );

    // The native runner refuses the internal address: the run stayed here.
    let outcome = executor.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));
    assert!(sink.requests().is_empty());
}

#[tokio::test]
async fn hybrid_mode_continues_natively_when_only_the_finished_part_needed_the_bridge() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(
        &mut conn,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "js", "type": "code", "params": { "language": "javascript", "source": "return 1" } },
                { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?", "timeoutMs": 60000 } },
                { "id": "note", "type": "log", "params": { "message": "done" } },
                { "id": "ai", "type": "aiAgent", "params": {
                    "credentialId": "openai", "model": "m", "prompt": "p" } }
            ],
            "edges": [
                { "from": "start", "to": "js" },
                { "from": "js", "to": "ask" },
                { "from": "ask", "to": "note", "label": "input" },
                { "from": "ask", "to": "ai", "label": "timeout" }
            ]
        }),
    )
    .await;
    let executor = executor(&db, ExecutorMode::Hybrid).await;
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    // The whole workflow needs the bridge (code, aiAgent)…
    assert_eq!(
        executor.route(&mut conn, &run, None).await.unwrap(),
        Route::Bridge
    );
    // …and so does a continuation from `ask`, which can still reach aiAgent.
    assert_eq!(
        executor.route(&mut conn, &run, Some("ask")).await.unwrap(),
        Route::Bridge
    );

    let second = queued(
        &mut conn,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "js", "type": "code", "params": { "language": "javascript", "source": "return 1" } },
                { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?" } },
                { "id": "note", "type": "log", "params": { "message": "done" } }
            ],
            "edges": [
                { "from": "start", "to": "js" },
                { "from": "js", "to": "ask" },
                { "from": "ask", "to": "note", "label": "input" }
            ]
        }),
    )
    .await;
    let run = store::get_execution(&mut conn, second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        executor.route(&mut conn, &run, None).await.unwrap(),
        Route::Bridge
    );
    // Past the waitForInput boundary everything runs natively.
    assert_eq!(
        executor.route(&mut conn, &run, Some("ask")).await.unwrap(),
        Route::Native
    );
}

#[tokio::test]
async fn an_unreachable_bridge_is_a_transient_error_and_leaves_the_run_queued() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, calls("https://example.test/")).await;
    // A port nothing listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let bridge = outbox_workflow_bridge::BridgeClient::new(
        &format!("http://{closed}"),
        BridgeSecret::new(SECRET).unwrap(),
    )
    .unwrap();
    let executor = Executor::new(ExecutorMode::Http, worker_runner(), Some(bridge)).unwrap();
    let error = executor.run(&mut conn, id).await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("did not answer"), "{error}");
    assert_eq!(status(&mut conn, id).await, ExecutionStatus::Queued);
}
