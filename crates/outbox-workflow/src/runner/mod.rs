//! The native runner: runs an execution block by block, each block durable.
//!
//! Every block's effect, its `workflow_block_execution` row and the
//! execution's variables commit in one transaction. Running an execution
//! again (a redelivered job, a worker that died mid-run) walks the path
//! from the trigger, skips every block that has a success row (reading its
//! recorded output) and continues at the first unfinished one, so no
//! block's effect happens twice. The one exception is `httpRequest`: its
//! call happens before the transaction that records it, so it is at least
//! once.
//!
//! `httpRequest` calls go through the address guard of
//! [`outbox_http_guard`] (the webhook subscriber's): internal addresses are
//! refused on the resolution the connection uses, unless the runner was
//! built with [`AddressPolicy::AllowInternal`]. A run started by an event
//! a workflow's own row block caused
//! ([`WorkflowExecution::allow_external_callouts`] false) makes no calls at
//! all: its `httpRequest` blocks fail with
//! [`HttpRequestError::CalloutsDisabled`].
//!
//! A run ends in `success` (the last block's output), `error` (a block
//! failed, or cannot run natively), or `rejected` (the preflight refused
//! the workflow before its first block: a `code` or `aiAgent` block, or a
//! credential the native runner does not have). The terminal write
//! publishes `plugin.hook.workflow.executed` or `plugin.hook.workflow.failed`
//! in the same transaction. See `docs/workflows.md`, "Runner and
//! subscriber".
//!
//! A runner made [`with_bridge_blocks`](Runner::with_bridge_blocks) (the
//! bridge process's) also runs `code` blocks, in the sandbox of
//! [`crate::code`], computed before the block's transaction like an HTTP
//! call.

mod blocks;
mod db;
mod error;

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_http_guard::{GuardError, GuardedClient};
use outbox_publish::OutboxTx;
use serde_json::{Map, Value, json};
use tracing::Instrument;
use uuid::Uuid;

pub use blocks::EMAIL_EVENT;
pub use db::{HOOK_EXECUTED, HOOK_FAILED};
pub use error::{HttpRequestError, RunError};
pub use outbox_http_guard::AddressPolicy;

use self::blocks::{Effect, StepError, apply, label_of};
use crate::events::ContinueKind;
use crate::store::{self, BlockExecutionStatus, ExecutionStatus, StoreError, WorkflowExecution};
use crate::{Block, BlockParams, HttpRequestParams, ValidatedWorkflow};

/// Why an `aiAgent` block fails in a bridge runner
/// ([`Runner::with_bridge_blocks`]): there is no model provider integration.
pub const NO_MODEL_PROVIDER: &str = "aiAgent needs a model provider; none is configured";

/// What a call of the runner left the execution in.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunOutcome {
    /// The run ended now with this status (`success`, `error` or
    /// `rejected`).
    Finished(ExecutionStatus),
    /// The run waits in this `waitForInput` block.
    Waiting(String),
    /// Nothing to do: the execution was already in this status (finished,
    /// or waiting and not continued), or it no longer waits in the block a
    /// continuation named.
    Unchanged(ExecutionStatus),
    /// The run stopped after [`Runner::stop_after`] blocks (tests).
    Paused,
}

/// Runs executions natively. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runner {
    http: GuardedClient,
    stop_after: Option<usize>,
    progress: Option<tokio::sync::mpsc::UnboundedSender<BlockProgress>>,
    bridge_blocks: bool,
}

/// A block the runner just ran (committed), for an observer: the bridge's
/// stream runs report these as they happen.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockProgress {
    /// The block's id.
    pub block_id: String,
    /// Its type.
    pub kind: crate::BlockKind,
    /// `success`, `error` or `waiting`.
    pub status: BlockExecutionStatus,
    /// The output it took (`success`).
    pub output: Option<Value>,
    /// Why it failed (`error`).
    pub error: Option<String>,
}

impl Runner {
    /// A runner whose `httpRequest` blocks refuse internal addresses
    /// (loopback, private, link-local…, as the webhook subscriber does).
    ///
    /// # Errors
    ///
    /// The HTTP client cannot be built (no TLS backend).
    pub fn new() -> Result<Self, reqwest::Error> {
        Self::with_address_policy(AddressPolicy::PublicOnly)
    }

    /// A runner whose `httpRequest` blocks follow `policy`:
    /// [`AddressPolicy::AllowInternal`] lets them call internal addresses
    /// (tests, trusted deployments; `WEBHOOK_ALLOW_PRIVATE_ADDRESSES`).
    ///
    /// # Errors
    ///
    /// The HTTP client cannot be built (no TLS backend).
    pub fn with_address_policy(policy: AddressPolicy) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: GuardedClient::new(policy)?,
            stop_after: None,
            progress: None,
            bridge_blocks: false,
        })
    }

    /// Runs the bridge-only blocks too, for the bridge process only: the
    /// preflight no longer refuses `code` and `aiAgent`, and a `code` block
    /// runs its JavaScript in the sandbox ([`crate::code::run`]) before its
    /// transaction, which records the output. `aiAgent` fails its block
    /// ([`NO_MODEL_PROVIDER`]).
    #[must_use]
    pub fn with_bridge_blocks(mut self) -> Self {
        self.bridge_blocks = true;
        self
    }

    /// Stops each call after `blocks` newly run blocks, as a crash would
    /// (tests of resumption); the execution stays `running`.
    #[must_use]
    pub fn stop_after(mut self, blocks: usize) -> Self {
        self.stop_after = Some(blocks);
        self
    }

    /// Reports each block this runner runs to `progress`, once its result
    /// committed (a closed receiver is ignored).
    #[must_use]
    pub fn with_progress(
        mut self,
        progress: tokio::sync::mpsc::UnboundedSender<BlockProgress>,
    ) -> Self {
        self.progress = Some(progress);
        self
    }

    fn report(
        &self,
        block: &Block,
        status: BlockExecutionStatus,
        output: Option<&Value>,
        error: Option<&str>,
    ) {
        if let Some(progress) = &self.progress {
            let _ = progress.send(BlockProgress {
                block_id: block.id.clone(),
                kind: block.kind(),
                status,
                output: output.cloned(),
                error: error.map(str::to_owned),
            });
        }
    }

    /// Runs execution `id` from where it stands: a `queued` run is
    /// preflighted and started, a `running` one resumes at its first
    /// unfinished block; a waiting or finished one is left alone.
    ///
    /// # Errors
    ///
    /// [`RunError`] when the database fails (the execution stays where its
    /// last committed block left it) or there is no such execution.
    pub async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        id: Uuid,
    ) -> Result<RunOutcome, RunError> {
        let execution = store::get_execution(conn, id)
            .await?
            .ok_or(RunError::ExecutionNotFound { execution_id: id })?;
        let status = execution.status;
        if !matches!(status, ExecutionStatus::Queued | ExecutionStatus::Running) {
            return Ok(RunOutcome::Unchanged(status));
        }
        let workflow = match store::load_version(
            conn,
            execution.workflow_id,
            execution.workflow_version,
        )
        .await
        {
            Ok(workflow) => workflow,
            Err(
                error @ (StoreError::StoredDefinition { .. } | StoreError::VersionNotFound { .. }),
            ) => {
                let reason = error.to_string();
                return finish(
                    conn,
                    &execution,
                    ExecutionStatus::Error,
                    None,
                    Some(&reason),
                    None,
                )
                .await;
            }
            Err(error) => return Err(error.into()),
        };
        if status == ExecutionStatus::Queued {
            // No credential store yet: a block naming a credential cannot
            // run natively.
            if let Err(error) = workflow.preflight(!self.bridge_blocks, &|_| false) {
                let reason = error.to_string();
                return finish(
                    conn,
                    &execution,
                    ExecutionStatus::Rejected,
                    None,
                    Some(&reason),
                    None,
                )
                .await;
            }
            db::start(conn, id).await?;
        }
        self.walk(conn, execution, &workflow).await
    }

    /// Continues execution `id`, waiting in `waiting_block`: with the
    /// answer `input` (output `input`) or, for [`ContinueKind::Timeout`],
    /// along output `timeout`. The first continuation wins; when the
    /// execution no longer waits in that block, nothing changes.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn resume(
        &self,
        conn: &mut AsyncPgConnection,
        id: Uuid,
        waiting_block: &str,
        kind: ContinueKind,
        input: &Value,
    ) -> Result<RunOutcome, RunError> {
        let output = json!({ "kind": kind.as_str(), "answer": input });
        let resumed = conn
            .transaction::<_, RunError, _>(async |conn| {
                let execution = db::lock_execution(conn, id)
                    .await?
                    .ok_or(RunError::ExecutionNotFound { execution_id: id })?;
                if execution.status != ExecutionStatus::Waiting
                    || execution.waiting_block.as_deref() != Some(waiting_block)
                {
                    return Ok(Err(execution.status));
                }
                let success = BlockExecutionStatus::Success;
                db::record_block(conn, id, waiting_block, success, Some(&output), None).await?;
                db::set_state(conn, id, ExecutionStatus::Running, None, &execution.vars).await?;
                Ok(Ok(()))
            })
            .await?;
        match resumed {
            Ok(()) => self.run(conn, id).await,
            Err(status) => Ok(RunOutcome::Unchanged(status)),
        }
    }

    async fn walk(
        &self,
        conn: &mut AsyncPgConnection,
        execution: WorkflowExecution,
        workflow: &ValidatedWorkflow,
    ) -> Result<RunOutcome, RunError> {
        let done = db::completed_blocks(conn, execution.id).await?;
        let mut vars = match &execution.vars {
            Value::Object(map) => map.clone(),
            _ => Map::new(),
        };
        let mut outputs = Map::new();
        let mut last = Value::Null;
        let mut ran = 0;
        let mut current = Some(workflow.trigger_block());
        while let Some(block) = current {
            let (output, label) = if let Some(output) = done.get(&block.id) {
                (output.clone(), label_of(block, output))
            } else {
                if self.stop_after.is_some_and(|n| ran >= n) {
                    return Ok(RunOutcome::Paused);
                }
                let ctx = json!({ "input": execution.input, "vars": vars, "blocks": outputs });
                let http = match &block.params {
                    BlockParams::HttpRequest(p) => Some(
                        self.call(&execution, &block.id, p, &ctx)
                            .await
                            .map_err(|e| e.to_string()),
                    ),
                    BlockParams::Code(p) if self.bridge_blocks => {
                        Some(crate::code::run(p, &ctx).await.map_err(|e| e.to_string()))
                    }
                    BlockParams::AiAgent(_) if self.bridge_blocks => {
                        Some(Err(NO_MODEL_PROVIDER.to_owned()))
                    }
                    _ => None,
                };
                let step = conn
                    .transaction::<_, StepError, _>(async |conn| {
                        step(conn, execution.id, block, &ctx, vars.clone(), http).await
                    })
                    .await;
                ran += 1;
                match step {
                    Ok(Some((Effect::Next { output, label }, new_vars))) => {
                        self.report(block, BlockExecutionStatus::Success, Some(&output), None);
                        vars = new_vars;
                        (output, label)
                    }
                    Ok(Some((Effect::Wait, _))) => {
                        self.report(block, BlockExecutionStatus::Waiting, None, None);
                        return Ok(RunOutcome::Waiting(block.id.clone()));
                    }
                    // Another runner got there first: start over.
                    Ok(None) => return Box::pin(self.run(conn, execution.id)).await,
                    Err(StepError::Run(error)) => return Err(error),
                    Err(StepError::Block(reason)) => {
                        self.report(block, BlockExecutionStatus::Error, None, Some(&reason));
                        let reason = format!("block {}: {reason}", block.id);
                        let failed = Some(block.id.as_str());
                        return finish(
                            conn,
                            &execution,
                            ExecutionStatus::Error,
                            None,
                            Some(&reason),
                            failed,
                        )
                        .await;
                    }
                }
            };
            outputs.insert(block.id.clone(), json!({ "output": output }));
            last = output;
            current = workflow.next(&block.id, &label);
        }
        finish(
            conn,
            &execution,
            ExecutionStatus::Success,
            Some(&last),
            None,
            None,
        )
        .await
    }

    /// The HTTP call of an `httpRequest` block: its output
    /// `{status, headers, body}`, or why it failed. A run that may not call
    /// out fails before anything is rendered or sent.
    ///
    /// The call runs in an `outbox.http.request` span (a child of the
    /// current span: a worker's `outbox.job`, or the bridge's
    /// `outbox.bridge.request`) and carries the W3C `traceparent` (and
    /// `tracestate`) of that span, or of the context passed on when the
    /// process has no OpenTelemetry layer, unless the block sets those
    /// headers itself.
    async fn call(
        &self,
        execution: &WorkflowExecution,
        block_id: &str,
        params: &HttpRequestParams,
        ctx: &Value,
    ) -> Result<Value, HttpRequestError> {
        let span = tracing::info_span!(
            "outbox.http.request",
            otel.kind = "client",
            block_id,
            http.request.method = tracing::field::Empty,
            server.origin = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let result = self
            .send(execution, params, ctx)
            .instrument(span.clone())
            .await;
        // A call without an answer, or answered with a 4xx or 5xx.
        let failed = match &result {
            Ok(output) => output["status"].as_u64().is_none_or(|status| status >= 400),
            Err(_) => true,
        };
        if failed {
            span.record("otel.status_code", "ERROR");
        }
        result
    }

    /// [`Runner::call`] inside its span.
    async fn send(
        &self,
        execution: &WorkflowExecution,
        params: &HttpRequestParams,
        ctx: &Value,
    ) -> Result<Value, HttpRequestError> {
        if !execution.allow_external_callouts {
            return Err(HttpRequestError::CalloutsDisabled);
        }
        let url = params.url.render(ctx);
        let parsed =
            url::Url::parse(&url).map_err(|source| HttpRequestError::InvalidUrl { url, source })?;
        let method = serde_json::to_value(params.method)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| HttpRequestError::InvalidMethod { method })?;
        let span = tracing::Span::current();
        span.record("http.request.method", method.as_str());
        // Scheme, host and port only: a URL's path and query may hold secrets.
        span.record("server.origin", parsed.origin().ascii_serialization());
        let mut request = self
            .http
            .request(method, parsed)?
            .timeout(Duration::from_millis(params.timeout_ms()));
        // The run's trace goes on to the peer, unless the block sets these
        // headers itself.
        if let Some(trace) = outbox_trace::TraceContext::current() {
            for (name, value) in trace.headers() {
                if !params
                    .headers
                    .keys()
                    .any(|set| set.eq_ignore_ascii_case(name))
                {
                    request = request.header(name, value);
                }
            }
        }
        for (name, value) in &params.headers {
            request = request.header(name, value.render(ctx));
        }
        if let Some(body) = &params.body {
            request = request.json(body.resolve(ctx));
        }
        let response = request
            .send()
            .await
            .map_err(|e| match GuardError::find(&e) {
                Some(refused) => HttpRequestError::Refused(refused.clone()),
                None => HttpRequestError::Request(e),
            })?;
        let status = response.status().as_u16();
        tracing::Span::current().record("http.response.status_code", status);
        let headers: Map<String, Value> = response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.to_string(), Value::String(v.to_str().ok()?.to_owned()))))
            .collect();
        let text = response.text().await.map_err(HttpRequestError::Body)?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(json!({ "status": status, "headers": headers, "body": body }))
    }
}

/// One block in its transaction: `None` when the execution is no longer
/// running or the block already completed (another runner).
async fn step(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    block: &Block,
    ctx: &Value,
    mut vars: Map<String, Value>,
    http: Option<Result<Value, String>>,
) -> Result<Option<(Effect, Map<String, Value>)>, StepError> {
    let Some(execution) = db::lock_execution(conn, id).await? else {
        return Ok(None);
    };
    if execution.status != ExecutionStatus::Running
        || db::block_completed(conn, id, &block.id).await?
    {
        return Ok(None);
    }
    let mut tx = OutboxTx::new(conn).map_err(RunError::from)?;
    let effect = apply(&mut tx, &execution, block, ctx, &mut vars, http).await?;
    let state = Value::Object(vars.clone());
    match &effect {
        Effect::Next { output, .. } => {
            let success = BlockExecutionStatus::Success;
            db::record_block(tx.conn(), id, &block.id, success, Some(output), None).await?;
            db::set_state(tx.conn(), id, ExecutionStatus::Running, None, &state).await?;
        }
        Effect::Wait => {
            let waiting = BlockExecutionStatus::Waiting;
            db::record_block(tx.conn(), id, &block.id, waiting, None, None).await?;
        }
    }
    Ok(Some((effect, vars)))
}

/// Ends the run (unless it already ended), recording `failed_block`'s
/// error row with the reason, in one transaction with the hook.
async fn finish(
    conn: &mut AsyncPgConnection,
    execution: &WorkflowExecution,
    status: ExecutionStatus,
    output: Option<&Value>,
    error: Option<&str>,
    failed_block: Option<&str>,
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
        if let Some(block) = failed_block {
            let failed = BlockExecutionStatus::Error;
            db::record_block(conn, execution.id, block, failed, None, error).await?;
        }
        let mut tx = OutboxTx::new(conn)?;
        db::finish(&mut tx, &current, status, output, error).await?;
        Ok(RunOutcome::Finished(status))
    })
    .await
}
