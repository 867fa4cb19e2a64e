//! How a run ends: the terminal write, fenced by the holder's lease, with
//! the failed block's row and the plugin hook in one transaction.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::OutboxTx;
use outbox_workflow_store::{BlockExecutionStatus, ExecutionStatus, WorkflowExecution};
use serde_json::Value;
use uuid::Uuid;

use crate::{RunError, RunOutcome, db};

/// How a run ends.
pub(super) struct End<'a> {
    status: ExecutionStatus,
    output: Option<&'a Value>,
    error: Option<&'a str>,
    failed_block: Option<&'a str>,
}

impl<'a> End<'a> {
    pub(super) fn new(status: ExecutionStatus) -> Self {
        Self {
            status,
            output: None,
            error: None,
            failed_block: None,
        }
    }

    pub(super) fn output(self, output: &'a Value) -> Self {
        Self {
            output: Some(output),
            ..self
        }
    }

    pub(super) fn error(self, error: &'a str) -> Self {
        Self {
            error: Some(error),
            ..self
        }
    }

    pub(super) fn failed_block(self, block: &'a str) -> Self {
        Self {
            failed_block: Some(block),
            ..self
        }
    }
}

/// Ends the run, if `owner` still holds it, recording the failed block's
/// error row with the reason, in one transaction with the hook.
pub(super) async fn finish(
    conn: &mut AsyncPgConnection,
    execution: &WorkflowExecution,
    owner: Uuid,
    end: End<'_>,
) -> Result<RunOutcome, RunError> {
    conn.transaction::<_, RunError, _>(async |conn| {
        let current =
            db::lock_execution(conn, execution.id)
                .await?
                .ok_or(RunError::ExecutionNotFound {
                    execution_id: execution.id,
                })?;
        if !matches!(
            current.status,
            ExecutionStatus::Queued | ExecutionStatus::Running
        ) {
            return Ok(RunOutcome::Unchanged(current.status));
        }
        if current.lease_owner != Some(owner) {
            return Ok(RunOutcome::Taken);
        }
        if let Some(block) = end.failed_block {
            let failed = BlockExecutionStatus::Error;
            db::record_block(conn, execution.id, block, failed, None, end.error).await?;
        }
        let mut tx = OutboxTx::new(conn)?;
        db::finish(&mut tx, &current, end.status, end.output, end.error).await?;
        Ok(RunOutcome::Finished(end.status))
    })
    .await
}
