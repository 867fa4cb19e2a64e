//! Workflows without Rust: what a person does with a workflow, one function
//! per action, for every interface that offers them (the `outbox workflow`
//! commands today, a console or an HTTP API later), so that each calls the
//! same code and gets the same refusals.
//!
//! - [`DocumentSource`] reads a JSON document (a definition, a run's input)
//!   from a file or standard input.
//! - [`save_document`] parses, validates and saves a definition;
//!   [`publish_workflow`] makes a workflow live; [`list_versions`] lists
//!   its versions. A workflow is named by id or by name within its tenant
//!   ([`WorkflowRef`]).
//! - [`start_run`] requests a manual run and [`answer_run`] answers a
//!   waiting one: each publishes its `workflow.*` event in a transaction of
//!   its own through [`producers`] and runs nothing.
//! - Cancelling is [`crate::cancel_execution`].
//!
//! [`AdminError::is_refusal`] tells a refusal (the request was wrong or
//! came too late; nothing was written) from a failure (the database).

use std::fmt;
use std::io::Read as _;
use std::path::PathBuf;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow, workflow_block_execution, workflow_execution};
use outbox_publish::{NotInTransaction, OutboxTx, PublishOutcome};
use outbox_workflow_model::{DefinitionError, WorkflowDefinition};
use serde_json::Value;
use uuid::Uuid;

use crate::producers::{self, ProducerError, RunTrigger};
use crate::row::ANSWERED_BY;
use crate::{
    BlockExecutionStatus, SavedWorkflow, StoreError, VersionSummary, Workflow, WorkflowRef,
    WorkflowStatus,
};

/// Why an action refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The document could not be read.
    #[error("cannot read {source_name}: {error}")]
    Read {
        /// The file, or `standard input`.
        source_name: String,
        /// Why.
        error: std::io::Error,
    },
    /// The definition was refused; the error names the block or edge at
    /// fault. Nothing was written.
    #[error("invalid workflow definition: {0}")]
    Definition(Box<DefinitionError>),
    /// The store refused (no such workflow, an invalid definition) or
    /// failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The producer refused (no such execution, not waiting) or failed.
    #[error(transparent)]
    Producer(#[from] ProducerError),
}

impl AdminError {
    /// True when the request itself was refused (an invalid definition, no
    /// such workflow or execution, a run that is not waiting) and nothing
    /// was written; false when reading the document or the database failed.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Read { .. } => false,
            Self::Definition(_) => true,
            Self::Store(error) => store_refusal(error),
            Self::Producer(error) => match error {
                ProducerError::ExecutionNotFound { .. }
                | ProducerError::NotWaiting { .. }
                | ProducerError::InvalidEntity { .. }
                | ProducerError::DataNotObject => true,
                ProducerError::Store(error) => store_refusal(error),
                _ => false,
            },
        }
    }
}

fn store_refusal(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Definition(_)
            | StoreError::WorkflowNotFound { .. }
            | StoreError::WorkflowNotFoundByRef { .. }
            | StoreError::VersionNotFound { .. }
    )
}

impl From<DefinitionError> for AdminError {
    fn from(error: DefinitionError) -> Self {
        Self::Definition(Box::new(error))
    }
}

impl From<diesel::result::Error> for AdminError {
    fn from(error: diesel::result::Error) -> Self {
        Self::Store(error.into())
    }
}

impl From<NotInTransaction> for AdminError {
    fn from(error: NotInTransaction) -> Self {
        Self::Producer(error.into())
    }
}

/// Where a JSON document comes from: a file, or standard input (`-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentSource {
    /// Standard input, read to its end.
    Stdin,
    /// A file.
    File(PathBuf),
}

impl From<&str> for DocumentSource {
    /// `-` is standard input; anything else a file path.
    fn from(arg: &str) -> Self {
        if arg == "-" {
            Self::Stdin
        } else {
            Self::File(arg.into())
        }
    }
}

impl fmt::Display for DocumentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdin => f.write_str("standard input"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

impl DocumentSource {
    /// The whole document as text.
    ///
    /// # Errors
    ///
    /// [`AdminError::Read`], naming the file.
    pub fn read(&self) -> Result<String, AdminError> {
        let read = match self {
            Self::Stdin => {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).map(|_| text)
            }
            Self::File(path) => std::fs::read_to_string(path),
        };
        read.map_err(|error| AdminError::Read {
            source_name: self.to_string(),
            error,
        })
    }
}

/// Parses and validates the definition `text` and saves it as workflow
/// `name` of `tenant_id` with [`crate::save_workflow`] (see there which
/// saves append a version and which overwrite a draft's).
///
/// `status` is what the workflow becomes; `None` keeps the status it has
/// (a new workflow is a draft). Saving a live workflow as a draft takes it
/// out of service: triggers stop starting it until it is published again.
///
/// # Errors
///
/// [`AdminError::Definition`] (nothing written) when the definition is
/// refused; [`AdminError::Store`] when the database fails.
#[tracing::instrument(skip(conn, text), fields(tenant = tenant_id), err)]
pub async fn save_document(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    name: &str,
    status: Option<WorkflowStatus>,
    text: &str,
) -> Result<SavedWorkflow, AdminError> {
    let definition = WorkflowDefinition::from_json(text)?;
    definition.validate()?;
    conn.transaction::<_, AdminError, _>(async |conn| {
        let status = match status {
            Some(status) => status,
            // Locked as the save locks it next (`FOR UPDATE`; a run being
            // created locks its version's row, not this one): a publish
            // committing meanwhile would otherwise be undone by this save
            // writing the status it read before.
            None => workflow::table
                .filter(workflow::tenant_id.eq(tenant_id))
                .filter(workflow::name.eq(name))
                .select(workflow::status)
                .for_update()
                .get_result::<String>(conn)
                .await
                .optional()?
                .map_or(Ok(WorkflowStatus::Draft), |s| s.parse())
                .map_err(|e| diesel::result::Error::DeserializationError(Box::new(e)))?,
        };
        Ok(crate::save_workflow(conn, tenant_id, name, status, &definition).await?)
    })
    .await
}

/// Makes the workflow `reference` of `tenant_id` live on its current
/// version ([`crate::publish`]); publishing a live workflow changes nothing
/// but `updated_at`.
///
/// # Errors
///
/// [`StoreError::WorkflowNotFoundByRef`] (in [`AdminError::Store`]) when
/// the tenant has no such workflow; [`AdminError::Store`] when the
/// database fails.
#[tracing::instrument(skip(conn), fields(tenant = tenant_id, workflow = %reference), err)]
pub async fn publish_workflow(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    reference: &WorkflowRef,
) -> Result<Workflow, AdminError> {
    conn.transaction::<_, AdminError, _>(async |conn| {
        let found = crate::find_workflow(conn, tenant_id, reference).await?;
        Ok(crate::publish(conn, tenant_id, found.id).await?)
    })
    .await
}

/// The workflow `reference` of `tenant_id` and its versions, oldest first,
/// the current one marked ([`crate::workflow_versions`]).
///
/// # Errors
///
/// As [`publish_workflow`].
#[tracing::instrument(skip(conn), fields(tenant = tenant_id, workflow = %reference), err)]
pub async fn list_versions(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    reference: &WorkflowRef,
) -> Result<(Workflow, Vec<VersionSummary>), AdminError> {
    let found = crate::find_workflow(conn, tenant_id, reference).await?;
    let versions = crate::workflow_versions(conn, found.id).await?;
    Ok((found, versions))
}

/// A run requested by [`start_run`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StartedRun {
    /// The new execution, `queued`.
    pub execution_id: Uuid,
    /// The workflow it runs (its `current_version` is the run's version).
    pub workflow: Workflow,
}

/// Requests a manual run of the workflow `reference` of `tenant_id` on its
/// current version (a draft too: a test run) with `input`, in one
/// transaction: a `queued` execution and its
/// `workflow.execution.requested` event ([`producers::request_execution`]).
/// Runs nothing: a worker picks the run up once the transaction commits.
///
/// # Errors
///
/// As [`publish_workflow`]; [`AdminError::Producer`] when publishing
/// fails.
#[tracing::instrument(skip(conn, input), fields(tenant = tenant_id, workflow = %reference), err)]
pub async fn start_run(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    reference: &WorkflowRef,
    input: &Value,
) -> Result<StartedRun, AdminError> {
    conn.transaction::<_, AdminError, _>(async |conn| {
        let found = crate::find_workflow(conn, tenant_id, reference).await?;
        let mut tx = OutboxTx::new(conn)?;
        let execution_id =
            producers::request_execution(&mut tx, tenant_id, found.id, RunTrigger::Manual, input)
                .await?;
        Ok(StartedRun {
            execution_id,
            workflow: found,
        })
    })
    .await
}

/// An answer requested by [`answer_run`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AnsweredRun {
    /// The `workflow.execution.continue.requested` event: `Published`, or
    /// `Duplicate` when an answer to this wait was already requested (then
    /// nothing was written and the first answer stands).
    pub event: PublishOutcome,
    /// The `waitForInput` block the answer is for.
    pub waiting_block: String,
}

/// Answers the `waiting` execution `execution_id` of `tenant_id` with
/// `input` (the `waitForInput` block's output), in one transaction
/// ([`producers::request_continuation`], delivered at once). Runs nothing:
/// a worker resumes the run when the event reaches it.
///
/// Who answered (`answered_by`) and when are kept in the same transaction
/// on the block run that waits, as its output `{"answeredBy": …,
/// "answeredAt": …}` (a waiting block run has no output of its own; the
/// runner reads only the outputs of finished ones), so that the run's
/// timeline shows them: [`crate::WorkflowBlockExecution::answered_by`]. A
/// duplicate answer changes nothing there either.
///
/// # Errors
///
/// [`ProducerError::ExecutionNotFound`] or [`ProducerError::NotWaiting`]
/// (naming the status), in [`AdminError::Producer`], when the run cannot
/// be answered (nothing written); [`AdminError::Producer`] when the
/// database fails.
#[tracing::instrument(skip(conn, input), fields(tenant = tenant_id, execution = %execution_id), err)]
pub async fn answer_run(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    execution_id: Uuid,
    input: &Value,
    answered_by: &str,
) -> Result<AnsweredRun, AdminError> {
    conn.transaction::<_, AdminError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        let event =
            producers::request_continuation(&mut tx, tenant_id, execution_id, input, None).await?;
        // request_continuation holds the row (FOR SHARE) until commit: the
        // run still waits in this block.
        let waiting_block: Option<String> = workflow_execution::table
            .find(execution_id)
            .select(workflow_execution::waiting_block)
            .get_result(tx.conn())
            .await?;
        let waiting_block = waiting_block.unwrap_or_default();
        if !event.is_duplicate() {
            record_answerer(tx.conn(), execution_id, &waiting_block, answered_by).await?;
        }
        Ok(AnsweredRun {
            event,
            waiting_block,
        })
    })
    .await
}

/// Writes who answered on the latest run of `block`, when it waits and
/// has no output yet.
async fn record_answerer(
    conn: &mut AsyncPgConnection,
    execution_id: Uuid,
    block: &str,
    answered_by: &str,
) -> Result<(), AdminError> {
    let runs_of_block = || {
        workflow_block_execution::table
            .filter(workflow_block_execution::execution_id.eq(execution_id))
            .filter(workflow_block_execution::block_id.eq(block))
    };
    let latest: Option<i32> = runs_of_block()
        .select(diesel::dsl::max(workflow_block_execution::sequence))
        .get_result(conn)
        .await?;
    let Some(latest) = latest else {
        return Ok(());
    };
    // The database's clock, as every other time of the run.
    let at: chrono::DateTime<chrono::Utc> =
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamptz>("now()"))
            .get_result(conn)
            .await?;
    diesel::update(
        runs_of_block()
            .filter(workflow_block_execution::sequence.eq(latest))
            .filter(workflow_block_execution::status.eq(BlockExecutionStatus::Waiting.as_str()))
            .filter(workflow_block_execution::output.is_null()),
    )
    .set(workflow_block_execution::output.eq(Some(serde_json::json!({
        ANSWERED_BY: answered_by,
        "answeredAt": at.to_rfc3339(),
    }))))
    .execute(conn)
    .await?;
    Ok(())
}
