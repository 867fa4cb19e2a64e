//! The `outbox.workflow` subscriber: [`WorkflowHandler`] consumes the
//! `workflow.*` events and runs executions through an
//! [`outbox_workflow_bridge::executor::Executor`]: natively, on the signed
//! bridge, or either (`WORKFLOW_EXECUTOR=native|http|hybrid`).
//!
//! - `workflow.trigger.event`: for each of the tenant's live workflows whose
//!   `eventTrigger` matches the entity and event, creates an execution (the
//!   outbox event id is the fan-out key, so a redelivery creates none and
//!   finishes the ones it created) and runs it.
//! - `workflow.execution.requested`: runs the queued execution.
//! - `workflow.execution.continue.requested`: resumes the waiting execution
//!   at its waiting block, with the input (kind `input`) or along output
//!   `timeout` (kind `timeout`). The first continuation wins; when the
//!   execution no longer waits in that block, the job does nothing.
//!
//! A job that finds its run held by another job (a live lease, see
//! [`outbox_workflow_runner`]) leaves it alone. Runs whose holder died
//! are resumed by [`sweep`], which the general group runs beside the
//! handler.
//!
//! Any other event type, a payload that does not parse, or a missing
//! execution fails the job permanently with the reason; database errors
//! and an unreachable bridge are retried (the run resumes at the first
//! unfinished block).
//!
//! What these handlers consume, feed and deduplicate on is described
//! once, as plain data, in `outbox_catalog::built_in` (`WORKFLOW`), which
//! the worker pairs with them.

use outbox_pg::PgPool;
use outbox_queue::{OutboxJob, queues};
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use outbox_workflow_bridge::executor::{ExecuteError, Executor};
use outbox_workflow_model::events::{
    CONTINUE_REQUESTED, ContinueRequestedPayload, EXECUTION_REQUESTED, ExecutionRequestedPayload,
    TRIGGER_EVENT, TriggerEventPayload,
};
use outbox_workflow_runner::RunOutcome;
use outbox_workflow_store::{self as store, StoreError};

/// `outbox.workflow`: runs workflows where the executor says.
#[derive(Clone)]
pub struct WorkflowHandler {
    pool: PgPool,
    executor: Executor,
}

impl WorkflowHandler {
    /// A handler running executions through `pool` with `executor`.
    #[must_use]
    pub fn new(pool: PgPool, executor: Executor) -> Self {
        Self { pool, executor }
    }
}

fn run_error(error: &ExecuteError) -> JobError {
    if error.is_transient() {
        JobError::retry(error)
    } else {
        JobError::permanent(error)
    }
}

fn store_error(error: &StoreError) -> JobError {
    match error {
        StoreError::Database(_) => JobError::retry(error),
        _ => JobError::permanent(error),
    }
}

fn parse<T: serde::de::DeserializeOwned>(job: &OutboxJob) -> Result<T, JobError> {
    job.payload
        .parse::<T>()
        .map_err(|e| JobError::permanent(format!("invalid {} payload: {e}", job.event_type)))
}

fn log_outcome(execution: uuid::Uuid, outcome: &RunOutcome) {
    match outcome {
        RunOutcome::Taken => tracing::info!(
            %execution,
            "workflow execution held by another job: left alone"
        ),
        _ => tracing::info!(%execution, outcome = ?outcome, "workflow execution advanced"),
    }
}

/// Every `every`, until `shutdown`: requests the resume of the runs left
/// `running` whose lease (`lease`, the runners') expired
/// ([`outbox_workflow_store::sweep::resume_orphans`]). Several workers may sweep
/// at once: each dead holder's run gets one resume event. Counts
/// `outbox_workflow_runs_resumed_total` and logs what it found.
pub async fn sweep(
    pool: PgPool,
    lease: std::time::Duration,
    every: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let pass = match pool.get().await {
            Ok(mut conn) => outbox_workflow_store::sweep::resume_orphans(&mut conn, lease)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("database error: {e}")),
        };
        match pass {
            Ok(pass) => {
                if pass.published > 0 {
                    metrics::counter!("outbox_workflow_runs_resumed_total")
                        .increment(pass.published as u64);
                }
                if pass.orphaned > 0 {
                    tracing::info!(
                        orphaned = pass.orphaned,
                        published = pass.published,
                        "workflow sweep: runs left running with nobody holding them"
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "workflow sweep failed; trying again later"),
        }
    }
}

impl JobHandler for WorkflowHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::WORKFLOW
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(|e| JobError::retry(format!("database error: {e}")))?;
        match job.event_type.as_str() {
            TRIGGER_EVENT => {
                let payload: TriggerEventPayload = parse(&job)?;
                if payload.tenant_id != job.tenant_id {
                    return Err(JobError::permanent(
                        "the payload's tenant is not the event's",
                    ));
                }
                let executions = store::event_executions(&mut conn, &payload, job.outbox_event_id)
                    .await
                    .map_err(|e| store_error(&e))?;
                for execution in executions {
                    let outcome = self
                        .executor
                        .run(&mut conn, execution.id)
                        .await
                        .map_err(|e| run_error(&e))?;
                    log_outcome(execution.id, &outcome);
                }
                Ok(())
            }
            EXECUTION_REQUESTED => {
                let payload: ExecutionRequestedPayload = parse(&job)?;
                let outcome = self
                    .executor
                    .run(&mut conn, payload.execution_id)
                    .await
                    .map_err(|e| run_error(&e))?;
                log_outcome(payload.execution_id, &outcome);
                Ok(())
            }
            CONTINUE_REQUESTED => {
                let payload: ContinueRequestedPayload = parse(&job)?;
                let outcome = self
                    .executor
                    .resume(
                        &mut conn,
                        payload.execution_id,
                        &payload.waiting_block,
                        payload.kind,
                        &payload.input,
                    )
                    .await
                    .map_err(|e| run_error(&e))?;
                log_outcome(payload.execution_id, &outcome);
                Ok(())
            }
            other => Err(JobError::permanent(format!(
                "{other} is not a workflow event (expected {TRIGGER_EVENT}, {EXECUTION_REQUESTED} or {CONTINUE_REQUESTED})"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database that fails while a workflow job runs is a blip: the job
    /// is retried, not dead-lettered; a workflow that does not exist never
    /// will, so that job goes to the dead set at once.
    // Break checked: the `Database` arm deleted (every store error
    // permanent) fails here.
    #[test]
    fn a_database_error_is_retried_and_a_missing_workflow_is_not() {
        let database = StoreError::Database(diesel::result::Error::BrokenTransactionManager);
        assert!(
            matches!(store_error(&database), JobError::Retry(_)),
            "{database}"
        );
        let missing = StoreError::WorkflowNotFound {
            workflow_id: uuid::Uuid::nil(),
        };
        assert!(
            matches!(store_error(&missing), JobError::Permanent(_)),
            "{missing}"
        );
    }
}
