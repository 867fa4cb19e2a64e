//! `store::cancel_execution` with the native runner on real Postgres: a
//! cancelled run runs no further block and has exactly one final hook;
//! refusals write nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runs;

use outbox_test_support::TestDatabase;
use outbox_workflow_runner::{HOOK_EXECUTED, HOOK_FAILED, RunOutcome, Runner};
use outbox_workflow_store::{self as store, CancelError, ExecutionStatus};
use runs::{block_rows, execution, outbox, queued};
use serde_json::{Value, json};

/// manualTrigger → log `one` → log `two`.
fn two_logs() -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "one", "type": "log", "params": { "message": "1" } },
            { "id": "two", "type": "log", "params": { "message": "2" } }
        ],
        "edges": [{ "from": "start", "to": "one" }, { "from": "one", "to": "two" }]
    })
}

fn succeeded(blocks: &[&str]) -> Vec<(String, i32, String)> {
    blocks
        .iter()
        .map(|b| ((*b).to_owned(), 1, "success".to_owned()))
        .collect()
}

#[tokio::test]
async fn a_running_run_cancelled_between_blocks_runs_no_further_block_and_has_one_failed_hook() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, two_logs(), json!({})).await;
    // A worker ran the trigger and `one`, and is about to run `two`.
    let outcome = Runner::new()
        .unwrap()
        .stop_after(2)
        .run(&mut conn, id)
        .await;
    assert_eq!(outcome.unwrap(), RunOutcome::Paused);
    assert_eq!(
        execution(&mut conn, id).await.status,
        ExecutionStatus::Running
    );

    let cancelled = store::cancel_execution(&mut conn, "t1", id, "alice")
        .await
        .unwrap();
    assert_eq!(cancelled.previous, ExecutionStatus::Running);
    assert_eq!(cancelled.execution.status, ExecutionStatus::Cancelled);
    assert_eq!(
        cancelled.execution.error.as_deref(),
        Some("cancelled by alice")
    );
    assert!(cancelled.execution.finished_at.is_some());

    // The worker goes on (or the job is redelivered): nothing more runs.
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Unchanged(ExecutionStatus::Cancelled));
    assert_eq!(
        block_rows(&mut conn, id).await,
        succeeded(&["start", "one"])
    );
    assert_eq!(
        outbox(&mut conn).await,
        [(
            HOOK_FAILED.to_owned(),
            json!({ "executionId": id, "workflowId": cancelled.execution.workflow_id,
                    "status": "cancelled", "error": "cancelled by alice" }),
            Some(format!("wf-hook:{id}")),
        )]
    );
}

#[tokio::test]
async fn cancel_refuses_another_tenant_s_run_and_a_finished_run_naming_its_status() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, two_logs(), json!({})).await;

    let refused = store::cancel_execution(&mut conn, "t2", id, "mallory").await;
    assert!(
        matches!(refused, Err(CancelError::ExecutionNotFound { execution_id }) if execution_id == id),
        "{refused:?}"
    );
    assert_eq!(
        execution(&mut conn, id).await.status,
        ExecutionStatus::Queued
    );

    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let refused = store::cancel_execution(&mut conn, "t1", id, "alice").await;
    let Err(error) = refused else {
        panic!("a finished run was cancelled: {refused:?}");
    };
    assert!(error.is_refusal());
    assert_eq!(
        error.to_string(),
        format!("execution {id} already finished: it is success")
    );
    let finished = execution(&mut conn, id).await;
    assert_eq!(finished.status, ExecutionStatus::Success);
    assert_eq!(finished.error, None);
    let hooks: Vec<String> = outbox(&mut conn).await.into_iter().map(|r| r.0).collect();
    assert_eq!(hooks, [HOOK_EXECUTED]);
}
