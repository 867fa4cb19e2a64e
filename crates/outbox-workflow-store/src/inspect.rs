//! Reads for operators (`outbox workflow`, `outbox health`, the console):
//! the workflows, one by id, a stored version's definition as saved, an
//! execution's block runs in order, the block types of a stored version,
//! workflow names, and the executions stuck in `queued` or `running`.
//! Nothing here writes.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow, workflow_block_execution, workflow_version};
use serde_json::Value;
use uuid::Uuid;

use super::{ExecutionStatus, StoreError, Workflow, WorkflowBlockExecution};

/// The workflows of `tenant_id` (of every tenant when `None`), by tenant
/// then name, at most `limit` of them.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn list_workflows(
    conn: &mut AsyncPgConnection,
    tenant_id: Option<&str>,
    limit: i64,
) -> Result<Vec<Workflow>, StoreError> {
    let mut query = workflow::table
        .select(Workflow::as_select())
        .order((workflow::tenant_id, workflow::name))
        .limit(limit)
        .into_boxed();
    if let Some(tenant_id) = tenant_id {
        query = query.filter(workflow::tenant_id.eq(tenant_id));
    }
    Ok(query.load(conn).await?)
}

/// The workflow `id`, whatever its tenant, if it exists (a tenant's
/// workflow by id or name is [`find_workflow`](crate::find_workflow)).
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn get_workflow(
    conn: &mut AsyncPgConnection,
    id: Uuid,
) -> Result<Option<Workflow>, StoreError> {
    Ok(workflow::table
        .find(id)
        .select(Workflow::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

/// The definition of version `version` of workflow `workflow_id` as it was
/// saved, without validating it again (so a version the block registry no
/// longer accepts can still be shown); `None` when there is no such
/// version. [`load_version`](crate::load_version) validates it.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn version_definition(
    conn: &mut AsyncPgConnection,
    workflow_id: Uuid,
    version: i32,
) -> Result<Option<Value>, StoreError> {
    Ok(workflow_version::table
        .find((workflow_id, version))
        .select(workflow_version::definition)
        .get_result(conn)
        .await
        .optional()?)
}

/// The block runs of execution `execution_id`, in the order they were
/// recorded (`started_at`, then `sequence`): a block that waited and then
/// resumed appears twice, its `waiting` row first. Empty when the execution
/// ran no block yet, or does not exist.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn block_executions(
    conn: &mut AsyncPgConnection,
    execution_id: Uuid,
) -> Result<Vec<WorkflowBlockExecution>, StoreError> {
    Ok(workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(execution_id))
        .order((
            workflow_block_execution::started_at,
            workflow_block_execution::sequence,
            workflow_block_execution::block_id,
        ))
        .select(WorkflowBlockExecution::as_select())
        .load(conn)
        .await?)
}

/// The type of each block of version `version` of workflow `workflow_id`,
/// by block id, as stored (`"log"`, `"httpRequest"`, …). The definition is
/// read without validating it again, so this works for a version the block
/// registry no longer accepts. Empty when there is no such version.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn block_types(
    conn: &mut AsyncPgConnection,
    workflow_id: Uuid,
    version: i32,
) -> Result<HashMap<String, String>, StoreError> {
    let definition = version_definition(conn, workflow_id, version).await?;
    let blocks = definition
        .as_ref()
        .and_then(|d| d.get("blocks"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    Ok(blocks
        .iter()
        .filter_map(|block| {
            let id = block.get("id")?.as_str()?;
            let kind = block.get("type")?.as_str()?;
            Some((id.to_owned(), kind.to_owned()))
        })
        .collect())
}

/// The names of the workflows `ids`, by id; ids without a workflow are
/// left out.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn workflow_names(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, String>, StoreError> {
    let rows: Vec<(Uuid, String)> = workflow::table
        .filter(workflow::id.eq_any(ids))
        .select((workflow::id, workflow::name))
        .load(conn)
        .await?;
    Ok(rows.into_iter().collect())
}

/// The executions of one status that have been `queued` or `running`,
/// unchanged, for longer than a threshold (see [`stuck_executions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StuckExecutions {
    /// `queued` or `running`.
    pub status: ExecutionStatus,
    /// How many executions of that status are stuck.
    pub count: i64,
    /// The one unchanged the longest.
    pub oldest_id: Uuid,
    /// Its `updated_at`: its last change of status, or the last block a
    /// running execution completed.
    pub oldest_updated_at: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct StuckRow {
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = BigInt)]
    count: i64,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    oldest_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    oldest_updated_at: DateTime<Utc>,
}

/// The executions stuck in `queued` or `running`: whose `updated_at` is
/// older than `older_than` by the database's clock. One entry per status
/// that has any, `queued` before `running`.
///
/// A `queued` execution's `updated_at` is its creation (the runner never
/// picked it up); a `running` one's moves with every completed block, so a
/// run that still makes progress is not stuck however long it takes.
/// `waiting` executions are never stuck: they wait for input by design.
/// Reads the partial index on `(status, updated_at)` of those two statuses.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn stuck_executions(
    conn: &mut AsyncPgConnection,
    older_than: Duration,
) -> Result<Vec<StuckExecutions>, StoreError> {
    // The statuses are literals so that the planner matches the partial
    // index `workflow_execution_stuck_idx`, whose predicate they repeat.
    let rows: Vec<StuckRow> = diesel::sql_query(
        "SELECT DISTINCT ON (status)
                status,
                count(*) OVER (PARTITION BY status) AS count,
                id AS oldest_id,
                updated_at AS oldest_updated_at
         FROM workflow_execution
         WHERE status IN ('queued', 'running')
           AND updated_at < now() - make_interval(secs => $1)
         ORDER BY status, updated_at, id",
    )
    .bind::<Double, _>(older_than.as_secs_f64())
    .load(conn)
    .await?;
    rows.into_iter()
        .map(|row| {
            let status = row.status.parse::<ExecutionStatus>().map_err(|e| {
                StoreError::Database(diesel::result::Error::DeserializationError(Box::new(e)))
            })?;
            Ok(StuckExecutions {
                status,
                count: row.count,
                oldest_id: row.oldest_id,
                oldest_updated_at: row.oldest_updated_at,
            })
        })
        .collect()
}
