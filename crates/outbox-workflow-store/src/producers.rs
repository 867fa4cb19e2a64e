//! The producers of `workflow.*` outbox events: each call is part of the
//! caller's transaction ([`OutboxTx`]), so the business write and the event
//! commit or roll back together. Nothing here runs a workflow; the workflow
//! subscriber does, on the `outbox.workflow` queue.
//!
//! - Row mutations ([`create_row`], [`update_row`], [`delete_row`]) write
//!   an `entity_row` and, with a request or workflow [`EventContext`], an
//!   `application_event` and a [`TRIGGER_EVENT`].
//! - [`request_execution`] creates a `queued` manual or API run and
//!   publishes [`EXECUTION_REQUESTED`].
//! - [`request_continuation`] asks a `waiting` run to resume, now or at a
//!   deadline, with [`CONTINUE_REQUESTED`].
//!
//! See `docs/workflows/running.md`, "Producers".

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_model::schema::{application_event, entity_row, workflow_execution};
use outbox_publish::{
    NewOutboxEvent, NotInTransaction, OutboxTx, PublishError, PublishOutcome, publish_outbox_event,
};
use outbox_workflow_model::events::{
    CONTINUE_REQUESTED, ContinueKind, ContinueRequestedPayload, EXECUTION_REQUESTED,
    ExecutionRequestedPayload, TRIGGER_EVENT, TriggerEventPayload, WorkflowOrigin,
    execution_requested_key,
};
use outbox_workflow_model::is_identifier;
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{EntityRow, ExecutionStatus, NewExecution, StoreError, TriggerKind, UnknownValue};

/// `application_event.event` of a created row.
pub const ROW_CREATED: &str = "row.created";
/// `application_event.event` of an updated row.
pub const ROW_UPDATED: &str = "row.updated";
/// `application_event.event` of a deleted row.
pub const ROW_DELETED: &str = "row.deleted";

/// Why a producer refused or failed. A refusal (every variant but
/// [`Database`](Self::Database), [`Store`](Self::Store) with a database
/// error, and [`Publish`](Self::Publish) with a database error) writes
/// nothing and leaves the transaction usable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// The entity name is not an identifier.
    #[error(
        "invalid entity name {entity:?}: expected an identifier (a letter or `_`, then letters, digits or `_`)"
    )]
    InvalidEntity {
        /// The name given.
        entity: String,
    },
    /// Row data (or a patch) is not a JSON object.
    #[error("row data must be a JSON object")]
    DataNotObject,
    /// The tenant has no such execution.
    #[error("no execution {execution_id}")]
    ExecutionNotFound {
        /// The id asked for.
        execution_id: Uuid,
    },
    /// The execution is not `waiting`, so it cannot be continued.
    #[error("execution {execution_id} is {status}, not waiting")]
    NotWaiting {
        /// The execution.
        execution_id: Uuid,
        /// Its status.
        status: ExecutionStatus,
    },
    /// A stored execution status is unknown to this version.
    #[error(transparent)]
    UnknownValue(#[from] UnknownValue),
    /// The store refused or failed (e.g. no such workflow).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The publisher refused or failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A payload could not be turned into JSON (does not happen with the
    /// payload types of [`events`](outbox_workflow_model::events)).
    #[error("cannot serialize the payload: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The database refused the statement or could not be reached; the
    /// transaction is aborted.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),
}

impl From<NotInTransaction> for ProducerError {
    fn from(error: NotInTransaction) -> Self {
        Self::Publish(error.into())
    }
}

/// Who causes a row mutation, and so which events it produces.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventContext {
    /// A request from the application: writes the row, an
    /// `application_event` and a trigger event whose runs may make
    /// external callouts.
    Request {
        /// Who made the request, if known; carried in the payload.
        actor: Option<String>,
    },
    /// A workflow's row block: the same three writes, but runs started by
    /// the event make no external callouts, and the payload names the
    /// origin.
    Workflow {
        /// The execution running the block.
        execution_id: Uuid,
        /// The row block.
        block_id: String,
    },
    /// An internal mutation: only the row, no event.
    None,
}

/// What a row mutation wrote.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RowChange {
    /// The row after the mutation (for a delete, with `deleted_at` set).
    pub row: EntityRow,
    /// The `application_event` written, unless the context was
    /// [`EventContext::None`].
    pub application_event_id: Option<Uuid>,
    /// The trigger event published, unless the context was
    /// [`EventContext::None`].
    pub outbox_event: Option<PublishOutcome>,
}

/// Creates an `entity_row` of `entity` with `data` (a JSON object), and the
/// events `context` asks for (`row.created`).
///
/// # Errors
///
/// [`ProducerError::InvalidEntity`], [`ProducerError::DataNotObject`]
/// (nothing written); [`ProducerError::Database`] or
/// [`ProducerError::Publish`].
pub async fn create_row(
    tx: &mut OutboxTx<'_>,
    tenant_id: &str,
    entity: &str,
    data: &Value,
    context: &EventContext,
) -> Result<RowChange, ProducerError> {
    check_entity(entity)?;
    check_object(data)?;
    let row = diesel::insert_into(entity_row::table)
        .values((
            entity_row::tenant_id.eq(tenant_id),
            entity_row::entity.eq(entity),
            entity_row::data.eq(data),
        ))
        .returning(EntityRow::as_returning())
        .get_result(tx.conn())
        .await?;
    emit(tx, row, ROW_CREATED, context).await
}

/// Merges `patch` (a JSON object; top-level keys replace the row's) into
/// the live row `id` of `entity`, with the events `context` asks for
/// (`row.updated`). `None` when the tenant has no such live row; then
/// nothing is written.
///
/// # Errors
///
/// As [`create_row`].
pub async fn update_row(
    tx: &mut OutboxTx<'_>,
    tenant_id: &str,
    entity: &str,
    id: Uuid,
    patch: &Value,
    context: &EventContext,
) -> Result<Option<RowChange>, ProducerError> {
    check_entity(entity)?;
    check_object(patch)?;
    let row = diesel::update(live_row(tenant_id, entity, id))
        .set((
            entity_row::data.eq(entity_row::data.concat(patch)),
            entity_row::updated_at.eq(diesel::dsl::now),
        ))
        .returning(EntityRow::as_returning())
        .get_result(tx.conn())
        .await
        .optional()?;
    match row {
        Some(row) => Ok(Some(emit(tx, row, ROW_UPDATED, context).await?)),
        None => Ok(None),
    }
}

/// Deletes the live row `id` of `entity` (sets `deleted_at`; the row is no
/// longer found), with the events `context` asks for (`row.deleted`, with
/// the row's last data). `None` when the tenant has no such live row; then
/// nothing is written.
///
/// # Errors
///
/// [`ProducerError::InvalidEntity`]; [`ProducerError::Database`] or
/// [`ProducerError::Publish`].
pub async fn delete_row(
    tx: &mut OutboxTx<'_>,
    tenant_id: &str,
    entity: &str,
    id: Uuid,
    context: &EventContext,
) -> Result<Option<RowChange>, ProducerError> {
    check_entity(entity)?;
    let row = diesel::update(live_row(tenant_id, entity, id))
        .set((
            entity_row::deleted_at.eq(diesel::dsl::now),
            entity_row::updated_at.eq(diesel::dsl::now),
        ))
        .returning(EntityRow::as_returning())
        .get_result(tx.conn())
        .await
        .optional()?;
    match row {
        Some(row) => Ok(Some(emit(tx, row, ROW_DELETED, context).await?)),
        None => Ok(None),
    }
}

/// How a manual or API run is requested: the run's `trigger_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunTrigger {
    /// A person started it (manualTrigger).
    Manual,
    /// An API request started it (apiTrigger).
    Api,
}

impl From<RunTrigger> for TriggerKind {
    fn from(trigger: RunTrigger) -> Self {
        match trigger {
            RunTrigger::Manual => Self::Manual,
            RunTrigger::Api => Self::Api,
        }
    }
}

/// Creates a `queued` execution of the workflow's current version with
/// `input`, and publishes [`EXECUTION_REQUESTED`] for it; returns the
/// execution's id. Runs nothing: the workflow subscriber picks the run up
/// once the transaction commits.
///
/// # Errors
///
/// [`ProducerError::Store`] with [`StoreError::WorkflowNotFound`] when the
/// tenant has no such workflow; [`ProducerError::Database`],
/// [`ProducerError::Publish`].
pub async fn request_execution(
    tx: &mut OutboxTx<'_>,
    tenant_id: &str,
    workflow_id: Uuid,
    trigger: RunTrigger,
    input: &Value,
) -> Result<Uuid, ProducerError> {
    let new = NewExecution {
        tenant_id,
        workflow_id,
        trigger_kind: trigger.into(),
        input,
        trigger_event_id: None,
        allow_external_callouts: true,
    };
    // Without a trigger event, create_execution always inserts.
    let execution = crate::create_execution(tx.conn(), &new)
        .await?
        .ok_or(diesel::result::Error::NotFound)?;
    let payload = ExecutionRequestedPayload {
        execution_id: execution.id,
        tenant_id: tenant_id.to_owned(),
        workflow_id,
    };
    let event = NewOutboxEvent::new(tenant_id, EXECUTION_REQUESTED, to_json(&payload)?)
        .dispatch_key(execution_requested_key(execution.id));
    publish_outbox_event(tx, event).await?;
    Ok(execution.id)
}

/// Asks the `waiting` execution `execution_id` to resume from its
/// `waitForInput` block: publishes [`CONTINUE_REQUESTED`].
///
/// Without `scheduled_at` it is the answer (`kind: "input"`, `input` the
/// block's output), delivered at once. With `scheduled_at` it is the
/// block's timeout (`kind: "timeout"`), not delivered before that instant.
/// The dispatch key `wf-continue:<execution>:<block>:<kind>` makes a
/// repeated request a [`PublishOutcome::Duplicate`] that writes nothing.
///
/// # Errors
///
/// [`ProducerError::ExecutionNotFound`] when the tenant has no such
/// execution, [`ProducerError::NotWaiting`] when it is not waiting
/// (nothing written); [`ProducerError::Database`],
/// [`ProducerError::Publish`].
pub async fn request_continuation(
    tx: &mut OutboxTx<'_>,
    tenant_id: &str,
    execution_id: Uuid,
    input: &Value,
    scheduled_at: Option<DateTime<Utc>>,
) -> Result<PublishOutcome, ProducerError> {
    let found: Option<(String, Option<String>)> = workflow_execution::table
        .filter(workflow_execution::id.eq(execution_id))
        .filter(workflow_execution::tenant_id.eq(tenant_id))
        .select((
            workflow_execution::status,
            workflow_execution::waiting_block,
        ))
        .for_share()
        .get_result(tx.conn())
        .await
        .optional()?;
    let (status, waiting_block) = found.ok_or(ProducerError::ExecutionNotFound { execution_id })?;
    let status: ExecutionStatus = status.parse()?;
    let waiting_block = match (status, waiting_block) {
        (ExecutionStatus::Waiting, Some(block)) => block,
        _ => {
            return Err(ProducerError::NotWaiting {
                execution_id,
                status,
            });
        }
    };
    let kind = if scheduled_at.is_some() {
        ContinueKind::Timeout
    } else {
        ContinueKind::Input
    };
    let key = format!(
        "wf-continue:{execution_id}:{waiting_block}:{}",
        kind.as_str()
    );
    let payload = ContinueRequestedPayload {
        execution_id,
        tenant_id: tenant_id.to_owned(),
        waiting_block,
        input: input.clone(),
        kind,
    };
    let mut event =
        NewOutboxEvent::new(tenant_id, CONTINUE_REQUESTED, to_json(&payload)?).dispatch_key(key);
    if let Some(at) = scheduled_at {
        event = event.scheduled_at(at);
    }
    Ok(publish_outbox_event(tx, event).await?)
}

/// The tenant's live (not deleted) row `id` of `entity`.
#[diesel::dsl::auto_type(no_type_alias)]
fn live_row<'a>(tenant_id: &'a str, entity: &'a str, id: Uuid) -> _ {
    entity_row::table
        .find(id)
        .filter(entity_row::tenant_id.eq(tenant_id))
        .filter(entity_row::entity.eq(entity))
        .filter(entity_row::deleted_at.is_null())
}

/// Writes the application event and publishes the trigger event for a
/// mutated row, as `context` asks.
async fn emit(
    tx: &mut OutboxTx<'_>,
    row: EntityRow,
    event: &str,
    context: &EventContext,
) -> Result<RowChange, ProducerError> {
    let (allow_external_callouts, actor, origin) = match context {
        EventContext::None => {
            return Ok(RowChange {
                row,
                application_event_id: None,
                outbox_event: None,
            });
        }
        EventContext::Request { actor } => (true, actor.clone(), None),
        EventContext::Workflow {
            execution_id,
            block_id,
        } => (
            false,
            None,
            Some(WorkflowOrigin::new(*execution_id, block_id.clone())),
        ),
    };
    let application_event_id: Uuid = diesel::insert_into(application_event::table)
        .values((
            application_event::tenant_id.eq(&row.tenant_id),
            application_event::entity.eq(&row.entity),
            application_event::event.eq(event),
            application_event::row_id.eq(Some(row.id)),
            application_event::data.eq(event_data(&row)),
        ))
        .returning(application_event::id)
        .get_result(tx.conn())
        .await?;
    let payload = TriggerEventPayload {
        tenant_id: row.tenant_id.clone(),
        entity: row.entity.clone(),
        event: event.to_owned(),
        row_id: Some(row.id),
        row: row.data.clone(),
        application_event_id,
        allow_external_callouts,
        actor,
        origin,
    };
    let outbox_event = publish_outbox_event(
        tx,
        NewOutboxEvent::new(&row.tenant_id, TRIGGER_EVENT, to_json(&payload)?)
            .dispatch_key(format!("app-event:{application_event_id}")),
    )
    .await?;
    Ok(RowChange {
        row,
        application_event_id: Some(application_event_id),
        outbox_event: Some(outbox_event),
    })
}

/// The `application_event.data` of a row event, the input of the runs it
/// starts: `{ "<entity>": { "id": "<row id>", …the row's fields } }`.
fn event_data(row: &EntityRow) -> Value {
    let mut fields = match &row.data {
        Value::Object(fields) => fields.clone(),
        _ => Map::new(),
    };
    fields.insert("id".to_owned(), Value::String(row.id.to_string()));
    let mut data = Map::new();
    data.insert(row.entity.clone(), Value::Object(fields));
    Value::Object(data)
}

fn to_json(payload: &impl Serialize) -> Result<Value, ProducerError> {
    Ok(serde_json::to_value(payload)?)
}

fn check_entity(entity: &str) -> Result<(), ProducerError> {
    if is_identifier(entity) {
        Ok(())
    } else {
        Err(ProducerError::InvalidEntity {
            entity: entity.to_owned(),
        })
    }
}

fn check_object(data: &Value) -> Result<(), ProducerError> {
    if data.is_object() {
        Ok(())
    } else {
        Err(ProducerError::DataNotObject)
    }
}
