//! The SQL of the workflow store, in diesel's DSL.

use chrono::{DateTime, Utc};
use diesel::dsl::{exists, now};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{application_event, workflow, workflow_execution, workflow_version};
use outbox_workflow_model::events::TriggerEventPayload;
use outbox_workflow_model::{BlockParams, ValidatedWorkflow, WorkflowDefinition};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::{
    ExecutionStatus, StoreError, TriggerKind, Workflow, WorkflowExecution, WorkflowStatus,
};

/// What [`save_workflow`] did.
#[derive(Debug, Clone)]
pub struct SavedWorkflow {
    /// The workflow row after the save.
    pub workflow: Workflow,
    /// The version the definition was saved as (now the current one).
    pub version: i32,
    /// True when a new version row was written; false when the current
    /// draft version was overwritten in place.
    pub new_version: bool,
    /// The definition as validated and stored.
    pub definition: ValidatedWorkflow,
}

/// Saves `definition` as workflow `name` of `tenant_id` with status
/// `status`, creating the workflow on its first save.
///
/// The definition is validated first; a refused definition writes nothing.
/// Then, in one transaction (a savepoint inside the caller's):
///
/// - a new workflow gets version 1;
/// - a workflow that is a draft and stays a draft has its current version
///   overwritten in place, unless an execution already started on it;
/// - otherwise (it is or becomes live, or its draft version is in use) the
///   definition is appended as version n+1.
///
/// The saved version becomes the current one and the status is set. The
/// workflow row is locked for the save, so concurrent saves of one
/// workflow take turns and each gets its own version.
///
/// # Errors
///
/// [`StoreError::Definition`] (naming the block at fault) when validation
/// refuses the definition; [`StoreError::Database`] otherwise.
pub async fn save_workflow(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    name: &str,
    status: WorkflowStatus,
    definition: &WorkflowDefinition,
) -> Result<SavedWorkflow, StoreError> {
    let validated = definition.validate()?;
    let json = serde_json::to_value(&validated)?;
    conn.transaction::<_, StoreError, _>(async move |conn| {
        // Create the row on the first save (version 1, its version row
        // follows: the foreign key to it is deferred); lock it either way.
        let inserted: Option<Uuid> = diesel::insert_into(workflow::table)
            .values((
                workflow::tenant_id.eq(tenant_id),
                workflow::name.eq(name),
                workflow::status.eq(status.as_str()),
                workflow::current_version.eq(1),
            ))
            .on_conflict((workflow::tenant_id, workflow::name))
            .do_nothing()
            .returning(workflow::id)
            .get_result(conn)
            .await
            .optional()?;
        let (version, new_version) = if let Some(id) = inserted {
            insert_version(conn, id, 1, &json).await?;
            (1, true)
        } else {
            save_over(conn, tenant_id, name, status, &json).await?
        };
        let workflow: Workflow = diesel::update(workflow::table)
            .filter(workflow::tenant_id.eq(tenant_id))
            .filter(workflow::name.eq(name))
            .set((
                workflow::status.eq(status.as_str()),
                workflow::current_version.eq(version),
                workflow::updated_at.eq(now),
            ))
            .returning(Workflow::as_returning())
            .get_result(conn)
            .await?;
        Ok(SavedWorkflow {
            workflow,
            version,
            new_version,
            definition: validated,
        })
    })
    .await
}

/// A draft saved over a draft that no run uses replaces its version; any
/// other save makes a new version.
fn overwrites(current: WorkflowStatus, saved: WorkflowStatus, in_use: bool) -> bool {
    current == WorkflowStatus::Draft && saved == WorkflowStatus::Draft && !in_use
}

/// A save of the existing workflow `name` (locked here): its current
/// version replaced or a new one after the newest ([`overwrites`]).
/// Returns the version and whether it is new.
async fn save_over(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    name: &str,
    status: WorkflowStatus,
    json: &serde_json::Value,
) -> Result<(i32, bool), StoreError> {
    let current: Workflow = workflow::table
        .filter(workflow::tenant_id.eq(tenant_id))
        .filter(workflow::name.eq(name))
        .select(Workflow::as_select())
        .for_update()
        .get_result(conn)
        .await?;
    // A run being created on the current version holds a key-share lock
    // on its row (the foreign key's check) until it commits: this waits for
    // it, so that the check below sees the run and the draft is not
    // overwritten under it.
    workflow_version::table
        .filter(workflow_version::workflow_id.eq(current.id))
        .filter(workflow_version::version.eq(current.current_version))
        .select(workflow_version::version)
        .for_update()
        .get_result::<i32>(conn)
        .await?;
    let in_use: bool = diesel::select(exists(
        workflow_execution::table
            .filter(workflow_execution::workflow_id.eq(current.id))
            .filter(workflow_execution::workflow_version.eq(current.current_version)),
    ))
    .get_result(conn)
    .await?;
    if overwrites(current.status, status, in_use) {
        diesel::update(workflow_version::table)
            .filter(workflow_version::workflow_id.eq(current.id))
            .filter(workflow_version::version.eq(current.current_version))
            .set((
                workflow_version::definition.eq(json),
                workflow_version::created_at.eq(now),
            ))
            .execute(conn)
            .await?;
        return Ok((current.current_version, false));
    }
    // After the newest version, not the current one: versions are never
    // reused.
    let newest: Option<i32> = workflow_version::table
        .filter(workflow_version::workflow_id.eq(current.id))
        .select(diesel::dsl::max(workflow_version::version))
        .get_result(conn)
        .await?;
    let next = newest.unwrap_or(0) + 1;
    insert_version(conn, current.id, next, json).await?;
    Ok((next, true))
}

async fn insert_version(
    conn: &mut AsyncPgConnection,
    workflow_id: Uuid,
    version: i32,
    definition: &Value,
) -> Result<(), StoreError> {
    diesel::insert_into(workflow_version::table)
        .values((
            workflow_version::workflow_id.eq(workflow_id),
            workflow_version::version.eq(version),
            workflow_version::definition.eq(definition),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets the status of workflow `workflow_id` of `tenant_id`; the current
/// version stays. Setting the status it already has changes nothing but
/// `updated_at`.
///
/// # Errors
///
/// [`StoreError::WorkflowNotFound`] when the tenant has no such workflow.
pub async fn set_status(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    workflow_id: Uuid,
    status: WorkflowStatus,
) -> Result<Workflow, StoreError> {
    diesel::update(workflow::table)
        .filter(workflow::id.eq(workflow_id))
        .filter(workflow::tenant_id.eq(tenant_id))
        .set((
            workflow::status.eq(status.as_str()),
            workflow::updated_at.eq(now),
        ))
        .returning(Workflow::as_returning())
        .get_result(conn)
        .await
        .optional()?
        .ok_or(StoreError::WorkflowNotFound { workflow_id })
}

/// Makes the workflow live: [`set_status`] with [`WorkflowStatus::Live`].
/// Its current version is what triggers start from now on.
///
/// # Errors
///
/// As [`set_status`].
pub async fn publish(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    workflow_id: Uuid,
) -> Result<Workflow, StoreError> {
    set_status(conn, tenant_id, workflow_id, WorkflowStatus::Live).await
}

/// Loads version `version` of workflow `workflow_id`, validated again.
///
/// # Errors
///
/// [`StoreError::VersionNotFound`] when there is no such version;
/// [`StoreError::StoredDefinition`] when the stored definition no longer
/// validates.
pub async fn load_version(
    conn: &mut AsyncPgConnection,
    workflow_id: Uuid,
    version: i32,
) -> Result<ValidatedWorkflow, StoreError> {
    let definition: Value = workflow_version::table
        .find((workflow_id, version))
        .select(workflow_version::definition)
        .get_result(conn)
        .await
        .optional()?
        .ok_or(StoreError::VersionNotFound {
            workflow_id,
            version,
        })?;
    validate_stored(workflow_id, version, definition)
}

fn validate_stored(
    workflow_id: Uuid,
    version: i32,
    definition: Value,
) -> Result<ValidatedWorkflow, StoreError> {
    WorkflowDefinition::from_value(definition)
        .and_then(ValidatedWorkflow::try_from)
        .map_err(|source| StoreError::StoredDefinition {
            workflow_id,
            version,
            source: Box::new(source),
        })
}

/// A live workflow whose trigger matched, with the version a run would
/// start on.
#[derive(Debug, Clone)]
pub struct LiveWorkflow {
    /// The workflow row.
    pub workflow: Workflow,
    /// Its current version.
    pub version: i32,
    /// That version's definition.
    pub definition: ValidatedWorkflow,
}

/// The live workflows of `tenant_id` whose `eventTrigger` listens to
/// `event` on `entity` (exact match of both), on their current version,
/// ordered by name. Drafts and other tenants' workflows never match.
///
/// # Errors
///
/// [`StoreError::StoredDefinition`] when a candidate's stored definition no
/// longer validates; [`StoreError::Database`].
pub async fn live_event_workflows(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    entity: &str,
    event: &str,
) -> Result<Vec<LiveWorkflow>, StoreError> {
    let candidates = event_candidates(conn, tenant_id, entity, event).await?;
    let mut matched = Vec::with_capacity(candidates.len());
    for (workflow, definition) in candidates {
        let version = workflow.current_version;
        let definition = validate_stored(workflow.id, version, definition)?;
        if fires_on(&definition, entity, event) {
            matched.push(LiveWorkflow {
                workflow,
                version,
                definition,
            });
        }
    }
    Ok(matched)
}

/// Whether the definition's trigger is an `eventTrigger` of `event` on
/// `entity`.
fn fires_on(definition: &ValidatedWorkflow, entity: &str, event: &str) -> bool {
    matches!(
        &definition.trigger_block().params,
        BlockParams::EventTrigger(trigger) if trigger.matches(entity, event)
    )
}

/// The tenant's live workflows whose current version's definition holds
/// an `eventTrigger` with that `entity` and `event` (by containment, in
/// SQL), by name, with that definition as stored.
async fn event_candidates(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    entity: &str,
    event: &str,
) -> Result<Vec<(Workflow, Value)>, StoreError> {
    use diesel::PgJsonbExpressionMethods as _;

    let pattern = json!({ "blocks": [{
        "type": "eventTrigger",
        "params": { "entity": entity, "event": event },
    }] });
    Ok(workflow::table
        .inner_join(
            workflow_version::table.on(workflow_version::workflow_id
                .eq(workflow::id)
                .and(workflow_version::version.eq(workflow::current_version))),
        )
        .filter(workflow::tenant_id.eq(tenant_id))
        .filter(workflow::status.eq(WorkflowStatus::Live.as_str()))
        .filter(workflow_version::definition.contains(pattern))
        .order(workflow::name)
        .select((Workflow::as_select(), workflow_version::definition))
        .load(conn)
        .await?)
}

/// The workflows a trigger event starts: those of
/// [`live_event_workflows`], and those whose stored definition no longer
/// validates but names the entity and event in an `eventTrigger` (their
/// run is created and the runner ends it in `error` with the reason, so
/// that one unreadable workflow is seen without keeping the others from
/// starting).
async fn triggered_workflows(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    entity: &str,
    event: &str,
) -> Result<Vec<Uuid>, StoreError> {
    let candidates = event_candidates(conn, tenant_id, entity, event).await?;
    let mut ids = Vec::with_capacity(candidates.len());
    for (workflow, definition) in candidates {
        match validate_stored(workflow.id, workflow.current_version, definition) {
            Ok(definition) => {
                if fires_on(&definition, entity, event) {
                    ids.push(workflow.id);
                }
            }
            Err(error) => {
                tracing::warn!(workflow_id = %workflow.id, version = workflow.current_version,
                    %error, "a live workflow's stored definition does not validate; its run ends in error");
                ids.push(workflow.id);
            }
        }
    }
    Ok(ids)
}

/// A run to create with [`create_execution`].
#[derive(Debug, Clone)]
pub struct NewExecution<'a> {
    /// The tenant; must own the workflow.
    pub tenant_id: &'a str,
    /// The workflow to run, on its current version.
    pub workflow_id: Uuid,
    /// What starts it.
    pub trigger_kind: TriggerKind,
    /// The trigger's data (the run's `input`).
    pub input: &'a Value,
    /// The outbox event that starts it, if any: the fan-out key.
    pub trigger_event_id: Option<Uuid>,
    /// Whether its `httpRequest` blocks may call out: the trigger event's
    /// `allowExternalCallouts`; true for manual and API runs.
    pub allow_external_callouts: bool,
}

/// Creates a `queued` execution of the workflow's current version.
///
/// Returns `None`, writing nothing, when `trigger_event_id` already started
/// this workflow (a redelivered trigger event fans out once).
///
/// # Errors
///
/// [`StoreError::WorkflowNotFound`] when the tenant has no such workflow;
/// [`StoreError::Database`].
pub async fn create_execution(
    conn: &mut AsyncPgConnection,
    new: &NewExecution<'_>,
) -> Result<Option<WorkflowExecution>, StoreError> {
    let version: i32 = workflow::table
        .filter(workflow::id.eq(new.workflow_id))
        .filter(workflow::tenant_id.eq(new.tenant_id))
        .select(workflow::current_version)
        .get_result(conn)
        .await
        .optional()?
        .ok_or(StoreError::WorkflowNotFound {
            workflow_id: new.workflow_id,
        })?;
    let execution = diesel::insert_into(workflow_execution::table)
        .values((
            workflow_execution::tenant_id.eq(new.tenant_id),
            workflow_execution::workflow_id.eq(new.workflow_id),
            workflow_execution::workflow_version.eq(version),
            workflow_execution::trigger_kind.eq(new.trigger_kind.as_str()),
            workflow_execution::status.eq(ExecutionStatus::Queued.as_str()),
            workflow_execution::input.eq(new.input),
            workflow_execution::trigger_event_id.eq(new.trigger_event_id),
            workflow_execution::allow_external_callouts.eq(new.allow_external_callouts),
        ))
        .on_conflict((
            workflow_execution::workflow_id,
            workflow_execution::trigger_event_id,
        ))
        .do_nothing()
        .returning(WorkflowExecution::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    Ok(execution)
}

/// The execution `id`, if it exists.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn get_execution(
    conn: &mut AsyncPgConnection,
    id: Uuid,
) -> Result<Option<WorkflowExecution>, StoreError> {
    Ok(workflow_execution::table
        .find(id)
        .select(WorkflowExecution::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

/// Which executions [`list_executions`], [`count_executions`] and
/// [`count_executions_up_to`] select.
#[derive(Debug, Clone, Default)]
pub struct ExecutionFilter<'a> {
    /// Only this tenant's.
    pub tenant_id: Option<&'a str>,
    /// Only this workflow's.
    pub workflow_id: Option<Uuid>,
    /// Only those with one of these statuses (any status when empty).
    pub statuses: &'a [ExecutionStatus],
    /// At most this many (all when `None`); [`count_executions`] ignores it.
    pub limit: Option<i64>,
    /// Only those after this one in the listing's order (newest first:
    /// created earlier, or at the same time with a smaller id), so that a
    /// listing pages by keyset; [`count_executions`] ignores it.
    pub after: Option<ExecutionPosition>,
}

/// A position in the listing of executions (newest first by
/// `created_at`, then id): the next page starts after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionPosition {
    /// The `created_at` of the last execution shown.
    pub created_at: DateTime<Utc>,
    /// Its id.
    pub id: Uuid,
}

impl ExecutionPosition {
    /// The position of `execution`: the next page starts after it.
    #[must_use]
    pub fn of(execution: &WorkflowExecution) -> Self {
        Self {
            created_at: execution.created_at,
            id: execution.id,
        }
    }
}

/// The executions `filter` selects, in no particular order and without its
/// limit.
fn filtered<'a>(filter: &ExecutionFilter<'a>) -> workflow_execution::BoxedQuery<'a, Pg> {
    let mut query = workflow_execution::table.into_boxed();
    if let Some(tenant_id) = filter.tenant_id {
        query = query.filter(workflow_execution::tenant_id.eq(tenant_id));
    }
    if let Some(workflow_id) = filter.workflow_id {
        query = query.filter(workflow_execution::workflow_id.eq(workflow_id));
    }
    if !filter.statuses.is_empty() {
        let statuses: Vec<&'static str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        query = query.filter(workflow_execution::status.eq_any(statuses));
    }
    query
}

/// Executions matching `filter`, newest first (`created_at`, then id),
/// after `filter.after` when it is set: a page of a listing that pages by
/// keyset starts after [`ExecutionPosition::of`] the last row of the page
/// before, and no execution repeats or is skipped from one page to the
/// next.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn list_executions(
    conn: &mut AsyncPgConnection,
    filter: &ExecutionFilter<'_>,
) -> Result<Vec<WorkflowExecution>, StoreError> {
    let mut query = filtered(filter);
    if let Some(after) = filter.after {
        // `created_at <= t` is the range an index on created_at can read;
        // the rest breaks the ties within one instant by id.
        query = query.filter(
            workflow_execution::created_at.le(after.created_at).and(
                workflow_execution::created_at
                    .lt(after.created_at)
                    .or(workflow_execution::id.lt(after.id)),
            ),
        );
    }
    let mut query = query.select(WorkflowExecution::as_select()).order((
        workflow_execution::created_at.desc(),
        workflow_execution::id.desc(),
    ));
    if let Some(limit) = filter.limit {
        query = query.limit(limit);
    }
    Ok(query.load(conn).await?)
}

/// How many executions match `filter`, whatever its `limit` (so a listing
/// cut at the limit can say how many it left out).
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn count_executions(
    conn: &mut AsyncPgConnection,
    filter: &ExecutionFilter<'_>,
) -> Result<u64, StoreError> {
    let n: i64 = filtered(filter).count().get_result(conn).await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// How many executions match `filter` (whatever its `limit` and `after`),
/// counting no further than `cap`: `None` when more than `cap` match. The
/// work is bounded by `cap` however many executions the table holds, where
/// [`count_executions`] reads every matching one (a page says "more than
/// 10,000" rather than read a million rows).
///
/// # Example
///
/// ```no_run
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), outbox_workflow_store::StoreError> {
/// use outbox_workflow_store::{ExecutionFilter, ExecutionStatus, count_executions_up_to};
///
/// let waiting = ExecutionFilter {
///     tenant_id: Some("acme"),
///     statuses: &[ExecutionStatus::Waiting],
///     ..ExecutionFilter::default()
/// };
/// match count_executions_up_to(conn, &waiting, 10_000).await? {
///     Some(n) => println!("{n} runs wait for input"),
///     None => println!("more than 10,000 runs wait for input"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn count_executions_up_to(
    conn: &mut AsyncPgConnection,
    filter: &ExecutionFilter<'_>,
    cap: u64,
) -> Result<Option<u64>, StoreError> {
    let limit = i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX);
    let ids: Vec<Uuid> = filtered(filter)
        .select(workflow_execution::id)
        .limit(limit)
        .load(conn)
        .await?;
    let n = ids.len() as u64;
    Ok((n <= cap).then_some(n))
}

/// The executions that the trigger event `trigger_event_id` starts: for
/// each live workflow of `payload`'s tenant whose `eventTrigger` matches its
/// entity and event, the execution created now (`queued`, input the
/// application event's data, `allow_external_callouts` the payload's) or,
/// when the event was delivered before, the one it created then; and the
/// executions an earlier delivery created for workflows that no longer
/// match (saved as a draft or changed since), so that a redelivery runs
/// every run it promised. A workflow
/// never starts on an event its own row blocks caused (`payload.origin`), so
/// it cannot trigger itself in a loop. A live workflow whose stored
/// definition no longer validates but names the entity and event in an
/// `eventTrigger` gets its execution too, which the runner ends in `error`
/// with the reason: one unreadable workflow does not keep the others from
/// starting.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn event_executions(
    conn: &mut AsyncPgConnection,
    payload: &TriggerEventPayload,
    trigger_event_id: Uuid,
) -> Result<Vec<WorkflowExecution>, StoreError> {
    let tenant = payload.tenant_id.as_str();
    let workflows = triggered_workflows(conn, tenant, &payload.entity, &payload.event).await?;
    // A redelivery also runs what an earlier delivery created for workflows
    // that no longer match (saved as a draft, or their trigger changed,
    // since): nothing else asks for those runs.
    let created_before: Vec<WorkflowExecution> = workflow_execution::table
        .filter(workflow_execution::trigger_event_id.eq(trigger_event_id))
        .filter(
            workflow_execution::workflow_id.eq_any(
                workflow::table
                    .filter(workflow::tenant_id.eq(tenant))
                    .select(workflow::id),
            ),
        )
        .filter(workflow_execution::workflow_id.ne_all(&workflows))
        .order(workflow_execution::created_at)
        .select(WorkflowExecution::as_select())
        .load(conn)
        .await?;
    if workflows.is_empty() {
        return Ok(created_before);
    }
    let origin_workflow: Option<Uuid> = match &payload.origin {
        Some(origin) => get_execution(conn, origin.execution_id)
            .await?
            .map(|e| e.workflow_id),
        None => None,
    };
    let input: Value = application_event::table
        .find(payload.application_event_id)
        .select(application_event::data)
        .get_result(conn)
        .await
        .optional()?
        .unwrap_or_else(|| json!({ payload.entity.clone(): payload.row }));
    let mut executions = Vec::with_capacity(workflows.len());
    for workflow_id in workflows {
        if origin_workflow == Some(workflow_id) {
            continue;
        }
        let new = NewExecution {
            tenant_id: tenant,
            workflow_id,
            trigger_kind: TriggerKind::Event,
            input: &input,
            trigger_event_id: Some(trigger_event_id),
            allow_external_callouts: payload.allow_external_callouts,
        };
        let execution = match create_execution(conn, &new).await? {
            Some(created) => created,
            None => {
                workflow_execution::table
                    .filter(workflow_execution::workflow_id.eq(workflow_id))
                    .filter(workflow_execution::trigger_event_id.eq(trigger_event_id))
                    .select(WorkflowExecution::as_select())
                    .get_result(conn)
                    .await?
            }
        };
        executions.push(execution);
    }
    executions.extend(created_before);
    Ok(executions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a draft saved over a draft no run has used keeps its version.
    #[test]
    fn only_a_draft_over_an_unused_draft_keeps_its_version() {
        use WorkflowStatus::{Draft, Live};
        let cases = [
            (Draft, Draft, false, true),
            (Draft, Draft, true, false),
            (Draft, Live, false, false),
            (Live, Draft, false, false),
            (Live, Live, false, false),
        ];
        for (current, saved, in_use, expected) in cases {
            assert_eq!(
                overwrites(current, saved, in_use),
                expected,
                "{current} then {saved}, in use {in_use}"
            );
        }
    }
}
