//! What each native block does inside its transaction.

use std::collections::BTreeMap;

use chrono::{Duration, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_model::schema::entity_row;
use outbox_publish::{NewOutboxEvent, OutboxTx, publish_outbox_event};
use outbox_workflow_model::{
    Block, BlockParams, EmailParams, IfParams, LogLevel, LogParams, Operand, SwitchParams,
    TextTemplate, WaitForInputParams, labels,
};
use outbox_workflow_store::producers::{self, EventContext, ProducerError};
use outbox_workflow_store::{EntityRow, WorkflowExecution};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::RunError;

/// The `mail.*` event an `email` block publishes.
pub const EMAIL_EVENT: &str = "mail.workflow.email";

/// What a block's transaction produced.
#[derive(Debug)]
pub(super) enum Effect {
    /// The block completed with `output`; the run follows `label`.
    Next { output: Value, label: String },
    /// The block suspends the run (`waitForInput`).
    Wait,
}

/// Why a block's transaction did not complete it.
#[derive(Debug)]
pub(super) enum StepError {
    /// The block failed: the run ends in `error` with this reason.
    Block(String),
    /// The database (or a producer) failed: nothing of the block stays.
    Run(RunError),
}

impl From<diesel::result::Error> for StepError {
    fn from(error: diesel::result::Error) -> Self {
        Self::Run(error.into())
    }
}

impl From<RunError> for StepError {
    fn from(error: RunError) -> Self {
        Self::Run(error)
    }
}

impl From<ProducerError> for StepError {
    fn from(error: ProducerError) -> Self {
        Self::Run(error.into())
    }
}

fn next(output: Value) -> Effect {
    Effect::Next {
        output,
        label: labels::NEXT.to_owned(),
    }
}

/// The output label a completed block took, read from its recorded output
/// (see [`apply`] for the outputs of `if`, `switch` and `waitForInput`).
pub(super) fn label_of(block: &Block, output: &Value) -> String {
    let label = match &block.params {
        BlockParams::If(_) => match output.get("result").and_then(Value::as_bool) {
            Some(true) => Some(labels::TRUE),
            _ => Some(labels::FALSE),
        },
        BlockParams::Switch(_) => output.get("case").and_then(Value::as_str),
        BlockParams::WaitForInput(_) => output.get("kind").and_then(Value::as_str),
        _ => None,
    };
    label.unwrap_or(labels::NEXT).to_owned()
}

fn resolve_map(map: &BTreeMap<String, Operand>, ctx: &Value) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), v.resolve(ctx).clone()))
            .collect::<Map<_, _>>(),
    )
}

fn row_id(id: &Operand, ctx: &Value) -> Result<Uuid, StepError> {
    let value = id.resolve(ctx);
    value
        .as_str()
        .and_then(|s| Uuid::parse_str(s).ok())
        .ok_or_else(|| StepError::Block(format!("{value} is not a row id (a UUID)")))
}

fn row_output(row: &EntityRow) -> Value {
    let mut out = match &row.data {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    out.insert("id".into(), Value::String(row.id.to_string()));
    Value::Object(out)
}

/// The `mail.*` request payload of an `email` block, as the mail
/// subscriber reads it: `{to, cc?, subject, text?, html?}` or
/// `{to, cc?, template, vars}`.
pub(super) fn email_payload(params: &EmailParams, ctx: &Value) -> Value {
    let render =
        |list: &[TextTemplate]| -> Vec<String> { list.iter().map(|t| t.render(ctx)).collect() };
    let mut payload = Map::new();
    payload.insert("to".into(), json!(render(&params.to)));
    if !params.cc.is_empty() {
        payload.insert("cc".into(), json!(render(&params.cc)));
    }
    if let Some(template) = &params.template {
        payload.insert("template".into(), json!(template));
        payload.insert("vars".into(), resolve_map(&params.vars, ctx));
    } else {
        for (key, text) in [
            ("subject", &params.subject),
            ("text", &params.text),
            ("html", &params.html),
        ] {
            if let Some(text) = text {
                payload.insert(key.into(), json!(text.render(ctx)));
            }
        }
    }
    Value::Object(payload)
}

/// Runs `block` in the caller's transaction. `http` is the result of the
/// block's work made before the transaction: the HTTP call of
/// `httpRequest`, or, in a bridge runner, the sandboxed script of `code`
/// (and the refusal of `aiAgent`).
///
/// Outputs: triggers, the input; `if`, `{"result": bool}`; `switch`,
/// `{"case": label}`; `log`, `{"level", "message"}`; `variable`, the
/// value; row blocks as documented; `email`, the mail event's id; `code`,
/// what the script returned.
pub(super) async fn apply(
    tx: &mut OutboxTx<'_>,
    execution: &WorkflowExecution,
    block: &Block,
    ctx: &Value,
    vars: &mut Map<String, Value>,
    http: Option<Result<Value, String>>,
) -> Result<Effect, StepError> {
    let tenant = execution.tenant_id.as_str();
    let effect = match &block.params {
        BlockParams::ManualTrigger(_)
        | BlockParams::ApiTrigger(_)
        | BlockParams::EventTrigger(_) => next(execution.input.clone()),
        BlockParams::If(p) => branch_if(p, ctx)?,
        BlockParams::Switch(p) => branch_switch(p, ctx)?,
        BlockParams::Log(p) => log(p, execution, block, ctx),
        BlockParams::Variable(p) => {
            let value = p.value.resolve(ctx).clone();
            vars.insert(p.name.clone(), value.clone());
            next(value)
        }
        BlockParams::RowGet(_)
        | BlockParams::RowCreate(_)
        | BlockParams::RowUpdate(_)
        | BlockParams::RowDelete(_) => apply_row(tx, execution, block, ctx).await?,
        BlockParams::Email(p) => {
            let event = NewOutboxEvent::new(tenant, EMAIL_EVENT, email_payload(p, ctx))
                .dispatch_key(format!("wf-email:{}:{}", execution.id, block.id));
            let outcome = publish_outbox_event(tx, event)
                .await
                .map_err(RunError::from)?;
            next(Value::String(outcome.id().to_string()))
        }
        BlockParams::HttpRequest(_) => made_before(http, || "the HTTP call was not made".into())?,
        BlockParams::WaitForInput(p) => wait_for_input(tx, execution, block, p, vars).await?,
        // A bridge runner ran the code (or refused `aiAgent`) before the
        // transaction; a native one did not.
        BlockParams::Code(_) | BlockParams::AiAgent(_) => made_before(http, || {
            format!("block type {} does not run natively", block.kind().id())
        })?,
    };
    Ok(effect)
}

/// The result of work made before the transaction (`http`), or the block's
/// failure `missing` names when none was made. NUL characters of the
/// output (an HTTP answer, what a script returned) and of the reason (what
/// a script threw) become U+FFFD: Postgres refuses them in `jsonb` and
/// `text`, and a result that cannot be recorded would have its work made
/// again.
fn made_before(
    http: Option<Result<Value, String>>,
    missing: impl FnOnce() -> String,
) -> Result<Effect, StepError> {
    match http {
        Some(Ok(mut output)) => {
            crate::call::storable(&mut output);
            Ok(next(output))
        }
        Some(Err(reason)) => Err(StepError::Block(crate::call::storable_text(reason))),
        None => Err(StepError::Block(missing())),
    }
}

/// `if`: the `true` or `false` branch.
fn branch_if(p: &IfParams, ctx: &Value) -> Result<Effect, StepError> {
    let result = p
        .condition
        .evaluate(ctx)
        .map_err(|e| StepError::Block(format!("condition: {e}")))?;
    let label = if result { labels::TRUE } else { labels::FALSE };
    Ok(Effect::Next {
        output: json!({ "result": result }),
        label: label.to_owned(),
    })
}

/// `switch`: the first case that holds, else `default`.
fn branch_switch(p: &SwitchParams, ctx: &Value) -> Result<Effect, StepError> {
    let mut taken = labels::DEFAULT;
    for case in &p.cases {
        let holds = case
            .condition
            .evaluate(ctx)
            .map_err(|e| StepError::Block(format!("case {:?}: {e}", case.label)))?;
        if holds {
            taken = &case.label;
            break;
        }
    }
    Ok(Effect::Next {
        output: json!({ "case": taken }),
        label: taken.to_owned(),
    })
}

/// `log`: one log line at the block's level.
fn log(p: &LogParams, execution: &WorkflowExecution, block: &Block, ctx: &Value) -> Effect {
    let message = p.message.render(ctx);
    let (id, block_id) = (execution.id, block.id.as_str());
    match p.level {
        LogLevel::Debug => tracing::debug!(execution = %id, block = block_id, "{message}"),
        LogLevel::Info => tracing::info!(execution = %id, block = block_id, "{message}"),
        LogLevel::Warn => tracing::warn!(execution = %id, block = block_id, "{message}"),
        _ => tracing::error!(execution = %id, block = block_id, "{message}"),
    }
    next(json!({ "level": p.level, "message": message }))
}

/// The row blocks (`rowGet`, `rowCreate`, `rowUpdate`, `rowDelete`), in
/// the caller's transaction; changes publish their row events with it.
async fn apply_row(
    tx: &mut OutboxTx<'_>,
    execution: &WorkflowExecution,
    block: &Block,
    ctx: &Value,
) -> Result<Effect, StepError> {
    let tenant = execution.tenant_id.as_str();
    let origin = || EventContext::Workflow {
        execution_id: execution.id,
        block_id: block.id.clone(),
    };
    let output = match &block.params {
        BlockParams::RowGet(p) => {
            let id = row_id(&p.id, ctx)?;
            let row: Option<EntityRow> = entity_row::table
                .find(id)
                .filter(entity_row::tenant_id.eq(tenant))
                .filter(entity_row::entity.eq(&p.entity))
                .filter(entity_row::deleted_at.is_null())
                .select(EntityRow::as_select())
                .get_result(tx.conn())
                .await
                .optional()?;
            row.as_ref().map_or(Value::Null, row_output)
        }
        BlockParams::RowCreate(p) => {
            let data = resolve_map(&p.values, ctx);
            let change = producers::create_row(tx, tenant, &p.entity, &data, &origin()).await?;
            row_output(&change.row)
        }
        BlockParams::RowUpdate(p) => {
            let id = row_id(&p.id, ctx)?;
            let patch = resolve_map(&p.patch, ctx);
            let change =
                producers::update_row(tx, tenant, &p.entity, id, &patch, &origin()).await?;
            change.map_or(Value::Null, |c| row_output(&c.row))
        }
        BlockParams::RowDelete(p) => {
            let id = row_id(&p.id, ctx)?;
            let change = producers::delete_row(tx, tenant, &p.entity, id, &origin()).await?;
            Value::Bool(change.is_some())
        }
        other => {
            return Err(StepError::Block(format!(
                "block type {} is not a row block",
                other.kind().id()
            )));
        }
    };
    Ok(next(output))
}

/// `waitForInput`: the run waits, its variables kept; with a timeout, a
/// continuation is published for the deadline.
async fn wait_for_input(
    tx: &mut OutboxTx<'_>,
    execution: &WorkflowExecution,
    block: &Block,
    p: &WaitForInputParams,
    vars: &Map<String, Value>,
) -> Result<Effect, StepError> {
    let state = Value::Object(vars.clone());
    let status = outbox_workflow_store::ExecutionStatus::Waiting;
    crate::db::set_state(tx.conn(), execution.id, status, Some(&block.id), &state).await?;
    if let Some(ms) = p.timeout_ms {
        let deadline = Utc::now() + Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX));
        producers::request_continuation(
            tx,
            execution.tenant_id.as_str(),
            execution.id,
            &Value::Null,
            Some(deadline),
        )
        .await?;
    }
    Ok(Effect::Wait)
}
