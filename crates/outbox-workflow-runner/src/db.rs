//! The runner's SQL: block rows, the execution's state, and the terminal
//! write with its plugin hook.

use std::collections::HashMap;

use diesel::dsl::now;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow_block_execution, workflow_execution};
use outbox_publish::{NewOutboxEvent, OutboxTx, publish_outbox_event};
use outbox_workflow_store::{
    BlockExecutionStatus, ExecutionStatus, HOOK_EXECUTED, HOOK_FAILED, WorkflowExecution,
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::RunError;

/// The execution `id`, locked for the rest of the transaction.
pub(super) async fn lock_execution(
    conn: &mut AsyncPgConnection,
    id: Uuid,
) -> Result<Option<WorkflowExecution>, RunError> {
    Ok(workflow_execution::table
        .find(id)
        .select(WorkflowExecution::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?)
}

/// The outputs of the blocks that completed, by block id.
pub(super) async fn completed_blocks(
    conn: &mut AsyncPgConnection,
    id: Uuid,
) -> Result<HashMap<String, Value>, RunError> {
    let rows: Vec<(String, Option<Value>)> = workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .filter(workflow_block_execution::status.eq(BlockExecutionStatus::Success.as_str()))
        .select((
            workflow_block_execution::block_id,
            workflow_block_execution::output,
        ))
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(block, output)| (block, output.unwrap_or(Value::Null)))
        .collect())
}

/// Records the result of `block`: on the `running` row its claim left
/// (see [`crate::lease::claim_block`]), or as a new run of the block (the
/// next sequence number for it).
pub(super) async fn record_block(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    block: &str,
    status: BlockExecutionStatus,
    output: Option<&Value>,
    error: Option<&str>,
) -> Result<(), RunError> {
    let finished = finished_at(status);
    let claimed = diesel::update(
        workflow_block_execution::table
            .filter(workflow_block_execution::execution_id.eq(id))
            .filter(workflow_block_execution::block_id.eq(block))
            .filter(workflow_block_execution::status.eq(BlockExecutionStatus::Running.as_str())),
    )
    .set((
        workflow_block_execution::status.eq(status.as_str()),
        workflow_block_execution::output.eq(output),
        workflow_block_execution::error.eq(error),
        workflow_block_execution::finished_at.eq(finished),
    ))
    .execute(conn)
    .await?;
    if claimed == 0 {
        insert_block(conn, id, block, status, output, error).await?;
    }
    Ok(())
}

/// When a block row of `status` ends: now for a result, never for a
/// claim or a wait.
fn finished_at(status: BlockExecutionStatus) -> Option<chrono::DateTime<chrono::Utc>> {
    matches!(
        status,
        BlockExecutionStatus::Success | BlockExecutionStatus::Error
    )
    .then(chrono::Utc::now)
}

/// Inserts one run of `block` (the next sequence number for it).
pub(super) async fn insert_block(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    block: &str,
    status: BlockExecutionStatus,
    output: Option<&Value>,
    error: Option<&str>,
) -> Result<(), RunError> {
    let last: Option<i32> = workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .filter(workflow_block_execution::block_id.eq(block))
        .select(diesel::dsl::max(workflow_block_execution::sequence))
        .get_result(conn)
        .await?;
    let finished = finished_at(status);
    diesel::insert_into(workflow_block_execution::table)
        .values((
            workflow_block_execution::execution_id.eq(id),
            workflow_block_execution::block_id.eq(block),
            workflow_block_execution::sequence.eq(last.unwrap_or(0) + 1),
            workflow_block_execution::status.eq(status.as_str()),
            workflow_block_execution::output.eq(output),
            workflow_block_execution::error.eq(error),
            workflow_block_execution::finished_at.eq(finished),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets the execution's status (and `waiting_block`, set exactly when
/// `waiting`) and its variables. A `waiting` run has no holder: its lease
/// is cleared.
pub(super) async fn set_state(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    status: ExecutionStatus,
    waiting_block: Option<&str>,
    vars: &Value,
) -> Result<(), RunError> {
    let target = workflow_execution::table.find(id);
    let state = (
        workflow_execution::status.eq(status.as_str()),
        workflow_execution::waiting_block.eq(waiting_block),
        workflow_execution::vars.eq(vars),
        workflow_execution::updated_at.eq(now),
    );
    if status == ExecutionStatus::Waiting {
        diesel::update(target)
            .set((
                state,
                workflow_execution::lease_owner.eq(None::<Uuid>),
                workflow_execution::lease_until.eq(None::<chrono::DateTime<chrono::Utc>>),
            ))
            .execute(conn)
            .await?;
    } else {
        diesel::update(target).set(state).execute(conn).await?;
    }
    Ok(())
}

/// Moves a `queued` execution to `running` and stamps `started_at`.
pub(super) async fn start(conn: &mut AsyncPgConnection, id: Uuid) -> Result<(), RunError> {
    diesel::update(workflow_execution::table.find(id))
        .filter(workflow_execution::status.eq(ExecutionStatus::Queued.as_str()))
        .set((
            workflow_execution::status.eq(ExecutionStatus::Running.as_str()),
            workflow_execution::started_at.eq(now),
            workflow_execution::updated_at.eq(now),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Ends the execution with `status` (`success`, `error` or `rejected`) and
/// publishes its plugin hook in the same transaction (dispatch key
/// `wf-hook:<execution>`).
pub(super) async fn finish(
    tx: &mut OutboxTx<'_>,
    execution: &WorkflowExecution,
    status: ExecutionStatus,
    output: Option<&Value>,
    error: Option<&str>,
) -> Result<(), RunError> {
    diesel::update(workflow_execution::table.find(execution.id))
        .set((
            workflow_execution::status.eq(status.as_str()),
            workflow_execution::output.eq(output),
            workflow_execution::error.eq(error),
            workflow_execution::waiting_block.eq(None::<String>),
            workflow_execution::finished_at.eq(now),
            workflow_execution::updated_at.eq(now),
            workflow_execution::lease_owner.eq(None::<Uuid>),
            workflow_execution::lease_until.eq(None::<chrono::DateTime<chrono::Utc>>),
        ))
        .execute(tx.conn())
        .await?;
    let mut payload = json!({
        "executionId": execution.id,
        "workflowId": execution.workflow_id,
        "status": status.as_str(),
    });
    if let (Some(error), Some(object)) = (error, payload.as_object_mut()) {
        object.insert("error".into(), Value::String(error.to_owned()));
    }
    let event_type = if status == ExecutionStatus::Success {
        HOOK_EXECUTED
    } else {
        HOOK_FAILED
    };
    publish_outbox_event(
        tx,
        NewOutboxEvent::new(&execution.tenant_id, event_type, payload)
            .dispatch_key(format!("wf-hook:{}", execution.id)),
    )
    .await?;
    Ok(())
}
