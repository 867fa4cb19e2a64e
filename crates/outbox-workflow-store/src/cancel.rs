//! [`cancel_execution`]: a person stops a run that has not finished.
//!
//! # Transactions and locks
//!
//! One transaction (a savepoint inside the caller's) locks the execution
//! row (`SELECT … FOR UPDATE`), checks its status, writes the final state
//! and publishes the plugin hook. The runner takes the same row lock in
//! each block's transaction and in its final write, and re-reads the
//! status there, so the two take turns: a cancel that commits first stops
//! the run at its next block (the runner finds it no longer `running`); a
//! run whose final write committed first is refused here as finished. A
//! run never gets two final states, nor two hooks.

use diesel::dsl::now;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow_block_execution, workflow_execution};
use outbox_publish::{
    NewOutboxEvent, NotInTransaction, OutboxTx, PublishError, PublishOutcome, publish_outbox_event,
};
use serde_json::json;
use uuid::Uuid;

use crate::{BlockExecutionStatus, ExecutionStatus, WorkflowExecution};

/// `plugin.hook.*` event published when a run ends in `success` (by the
/// runner).
pub const HOOK_EXECUTED: &str = "plugin.hook.workflow.executed";
/// `plugin.hook.*` event published when a run ends in `error` or
/// `rejected` (by the runner), or is cancelled ([`cancel_execution`]).
pub const HOOK_FAILED: &str = "plugin.hook.workflow.failed";

/// Why [`cancel_execution`] refused or failed. The refusals
/// ([`ExecutionNotFound`](Self::ExecutionNotFound),
/// [`Finished`](Self::Finished)) write nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// The tenant has no such execution.
    #[error("no execution {execution_id}")]
    ExecutionNotFound {
        /// The id asked for.
        execution_id: Uuid,
    },
    /// The run already ended; only `queued`, `running` and `waiting` runs
    /// can be cancelled.
    #[error("execution {execution_id} already finished: it is {status}")]
    Finished {
        /// The execution.
        execution_id: Uuid,
        /// Its final status.
        status: ExecutionStatus,
    },
    /// The hook could not be published.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The database refused the statement or could not be reached; the
    /// transaction is rolled back.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),
}

impl CancelError {
    /// True for the refusals (no such execution, already finished), which
    /// write nothing; false when the database or the publisher failed.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::ExecutionNotFound { .. } | Self::Finished { .. })
    }
}

impl From<NotInTransaction> for CancelError {
    fn from(error: NotInTransaction) -> Self {
        Self::Publish(error.into())
    }
}

/// What [`cancel_execution`] did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CancelledExecution {
    /// The status the run had: `queued`, `running` or `waiting`.
    pub previous: ExecutionStatus,
    /// The run as cancelled.
    pub execution: WorkflowExecution,
}

/// The run's `error` after a cancel by `by`.
#[must_use]
pub fn cancelled_by(by: &str) -> String {
    format!("cancelled by {by}")
}

/// Cancels the execution `id` of `tenant_id`, which must be `queued`,
/// `running` or `waiting`: it becomes `cancelled`, with `error`
/// `cancelled by <by>`, no `waiting_block`, and `finished_at` and
/// `updated_at` now; the plugin hook [`HOOK_FAILED`] is published with it
/// (payload `{executionId, workflowId, status: "cancelled", error}`,
/// dispatch key `wf-hook:<execution>`, as for a run that failed). Returns
/// the status it had and the execution as cancelled.
///
/// A `running` run stops at its next write: a block whose transaction had
/// not committed is not recorded and has no effect on this database; a
/// block claimed for its call (`running` row) is recorded as an `error`
/// with the same reason (its call may have been made). Continuations
/// already requested for a `waiting` run are ignored when they arrive (the
/// run no longer waits).
///
/// # Errors
///
/// [`CancelError::ExecutionNotFound`] when the tenant has no such
/// execution; [`CancelError::Finished`] (naming the status) when it already
/// ended; [`CancelError::Database`] or [`CancelError::Publish`] otherwise.
/// See the module for the locks.
#[tracing::instrument(skip(conn), fields(tenant = tenant_id, execution = %id), err)]
pub async fn cancel_execution(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    id: Uuid,
    by: &str,
) -> Result<CancelledExecution, CancelError> {
    let error = cancelled_by(by);
    conn.transaction::<_, CancelError, _>(async |conn| {
        let status: String = workflow_execution::table
            .find(id)
            .filter(workflow_execution::tenant_id.eq(tenant_id))
            .select(workflow_execution::status)
            .for_update()
            .get_result(conn)
            .await
            .optional()?
            .ok_or(CancelError::ExecutionNotFound { execution_id: id })?;
        let status: ExecutionStatus = status.parse().map_err(|e| {
            CancelError::Database(diesel::result::Error::DeserializationError(Box::new(e)))
        })?;
        if status.is_finished() {
            return Err(CancelError::Finished {
                execution_id: id,
                status,
            });
        }
        let execution: WorkflowExecution = diesel::update(workflow_execution::table.find(id))
            .set((
                workflow_execution::status.eq(ExecutionStatus::Cancelled.as_str()),
                workflow_execution::error.eq(&error),
                workflow_execution::waiting_block.eq(None::<String>),
                workflow_execution::finished_at.eq(now),
                workflow_execution::updated_at.eq(now),
                // A holder still working finds the run no longer running
                // at its next write (its lease is of no use any more).
                workflow_execution::lease_owner.eq(None::<Uuid>),
                workflow_execution::lease_until.eq(None::<chrono::DateTime<chrono::Utc>>),
            ))
            .returning(WorkflowExecution::as_returning())
            .get_result(conn)
            .await?;
        // A call claimed and not recorded gets no result any more.
        diesel::update(
            workflow_block_execution::table
                .filter(workflow_block_execution::execution_id.eq(id))
                .filter(
                    workflow_block_execution::status.eq(BlockExecutionStatus::Running.as_str()),
                ),
        )
        .set((
            workflow_block_execution::status.eq(BlockExecutionStatus::Error.as_str()),
            workflow_block_execution::error.eq(&error),
            workflow_block_execution::finished_at.eq(now),
        ))
        .execute(conn)
        .await?;
        let mut tx = OutboxTx::new(conn)?;
        publish_hook(&mut tx, &execution, &error).await?;
        Ok(CancelledExecution {
            previous: status,
            execution,
        })
    })
    .await
}

/// Publishes the terminal hook of the cancelled run, keyed as the runner
/// keys its own so that one run has one hook.
async fn publish_hook(
    tx: &mut OutboxTx<'_>,
    execution: &WorkflowExecution,
    error: &str,
) -> Result<PublishOutcome, CancelError> {
    let payload = json!({
        "executionId": execution.id,
        "workflowId": execution.workflow_id,
        "status": ExecutionStatus::Cancelled.as_str(),
        "error": error,
    });
    Ok(publish_outbox_event(
        tx,
        NewOutboxEvent::new(&execution.tenant_id, HOOK_FAILED, payload)
            .dispatch_key(format!("wf-hook:{}", execution.id)),
    )
    .await?)
}
