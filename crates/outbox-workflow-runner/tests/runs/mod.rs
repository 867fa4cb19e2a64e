//! Helpers of the runner tests on Postgres: a queued run of a definition,
//! and what a run left (the execution, its block rows, the outbox).
#![allow(dead_code, clippy::unwrap_used)]

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{outbox_event, workflow_block_execution};
use outbox_publish::OutboxTx;
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_store::producers::{self, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, WorkflowExecution, WorkflowStatus};
use serde_json::Value;
use uuid::Uuid;

/// (event type, payload, dispatch key) of every outbox row, oldest first.
pub async fn outbox(conn: &mut AsyncPgConnection) -> Vec<(String, Value, Option<String>)> {
    outbox_event::table
        .select((
            outbox_event::event_type,
            outbox_event::payload,
            outbox_event::dispatch_key,
        ))
        .order(outbox_event::id)
        .load(conn)
        .await
        .unwrap()
}

/// (block, sequence, status, output, error) of the execution's block rows,
/// in run order.
async fn block_columns(
    conn: &mut AsyncPgConnection,
    id: Uuid,
) -> Vec<(String, i32, String, Option<Value>, Option<String>)> {
    workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .select((
            workflow_block_execution::block_id,
            workflow_block_execution::sequence,
            workflow_block_execution::status,
            workflow_block_execution::output,
            workflow_block_execution::error,
        ))
        .order((
            workflow_block_execution::started_at,
            workflow_block_execution::sequence,
        ))
        .load(conn)
        .await
        .unwrap()
}

/// (block, sequence, status) of the execution's block rows, in run order.
pub async fn block_rows(conn: &mut AsyncPgConnection, id: Uuid) -> Vec<(String, i32, String)> {
    let rows = block_columns(conn, id).await;
    rows.into_iter().map(|r| (r.0, r.1, r.2)).collect()
}

/// The execution `id`, which must exist.
pub async fn execution(conn: &mut AsyncPgConnection, id: Uuid) -> WorkflowExecution {
    store::get_execution(conn, id).await.unwrap().unwrap()
}

/// Saves `definition` live and requests a manual run with `input`; the
/// outbox is emptied so the run's own events are all that remain.
pub async fn queued(conn: &mut AsyncPgConnection, definition: Value, input: Value) -> Uuid {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    let workflow = store::save_workflow(conn, "t1", "wf", WorkflowStatus::Live, &definition)
        .await
        .unwrap()
        .workflow
        .id;
    let id = conn
        .transaction::<_, ProducerError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            producers::request_execution(&mut tx, "t1", workflow, RunTrigger::Manual, &input).await
        })
        .await
        .unwrap();
    diesel::delete(outbox_event::table)
        .execute(conn)
        .await
        .unwrap();
    id
}

/// (block, status, output, error) of the execution's block rows, in run
/// order.
pub async fn block_results(
    conn: &mut AsyncPgConnection,
    id: Uuid,
) -> Vec<(String, String, Option<Value>, Option<String>)> {
    let rows = block_columns(conn, id).await;
    rows.into_iter().map(|r| (r.0, r.2, r.3, r.4)).collect()
}
