//! The native runner: runs an execution block by block, each block durable,
//! one writer per run.
//!
//! **One writer.** Every call that advances a run ([`Runner::run`],
//! [`Runner::resume`]) first takes the run's lease (see `lease.rs`): a fresh
//! owner id and an expiry by the database's clock, taken only when nobody
//! holds the run. A call that finds the lease live leaves the run alone
//! without running anything ([`RunOutcome::Taken`]). Each block's
//! transaction locks the execution and checks that the lease is still its
//! own before it writes, then moves the expiry on; a holder whose lease was
//! taken over stops. The lease is released when the run waits, ends, or the
//! call fails, and expires by itself when the holder dies; the sweep
//! ([`outbox_workflow_store::sweep`]) resumes runs left `running` with an
//! expired lease.
//!
//! **Durable blocks.** Every block's effect, its `workflow_block_execution`
//! row and the execution's variables commit in one transaction. Running an
//! execution again walks the path from the trigger, skips every block that
//! has a success row (reading its recorded output) and continues at the
//! first unfinished one, so no block's effect on this database happens
//! twice.
//!
//! **Calls after claims.** A block whose work happens before its
//! transaction (`httpRequest`'s call, a bridge runner's `code`) is claimed
//! first: a `running` block row committed with a lease that covers the
//! call's timeout. So a call is made only by the holder, and a second job
//! cannot take the run while the call may still be in flight. The call is
//! at least once: a holder that dies between the call and its transaction
//! leaves the `running` row, and the next holder calls again (the row's
//! `attempt` counts the claims), with the same `Idempotency-Key` header
//! ([`idempotency_key`]).
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
//! in the same transaction. See `docs/workflows/running.md`, "Runner and
//! subscriber".
//!
//! A runner made [`with_bridge_blocks`](Runner::with_bridge_blocks) (the
//! bridge process's) also runs `code` blocks, in the [`CodeSandbox`] it is
//! given, claimed and computed before the block's transaction like an HTTP
//! call.
//!
//! This crate runs workflows; it does not define them
//! (`outbox-workflow-model`), store them or publish their events
//! (`outbox-workflow-store`), embed the JavaScript engine
//! (`outbox-workflow-sandbox`) or serve the bridge
//! (`outbox-workflow-bridge`).

mod blocks;
mod call;
mod db;
mod end;
mod error;
mod lease;
mod sandbox;

use std::sync::Arc;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_http_guard::GuardedClient;
use outbox_publish::OutboxTx;
use outbox_workflow_model::events::ContinueKind;
use outbox_workflow_model::{Block, BlockParams, ValidatedWorkflow};
use outbox_workflow_store::{
    self as store, BlockExecutionStatus, ExecutionStatus, StoreError, WorkflowExecution,
};
use serde_json::{Map, Value, json};
use uuid::Uuid;

pub use blocks::EMAIL_EVENT;
pub use call::{IDEMPOTENCY_KEY_HEADER, MAX_ANSWER_BYTES, idempotency_key};
pub use error::{HttpRequestError, RunError};
pub use outbox_http_guard::AddressPolicy;
/// The plugin hooks a run's end publishes (the store's cancel publishes
/// the second too).
pub use outbox_workflow_store::{HOOK_EXECUTED, HOOK_FAILED};
pub use sandbox::{CodeRun, CodeSandbox};

use self::blocks::{Effect, StepError, apply, label_of};
use self::end::{End, finish};

/// How many times a block with work before its transaction (an HTTP call)
/// is claimed at most: a claim past this fails the block without calling,
/// so a result that cannot be recorded, or a block that kills every
/// holder, does not repeat its call for ever.
pub const MAX_CLAIMS: i32 = 5;

/// How long a holder keeps a run without writing, by default: defined
/// beside the sweep that finds expired leases, so that `outbox health`
/// reads it without depending on the runner.
pub use outbox_workflow_store::sweep::DEFAULT_LEASE;

/// Why an `aiAgent` block fails in a bridge runner
/// ([`Runner::with_bridge_blocks`]): there is no model provider integration.
pub const NO_MODEL_PROVIDER: &str = "aiAgent needs a model provider; none is configured";

/// What a call of the runner left the execution in.
///
/// Not `#[non_exhaustive]`: the bridge's wire form
/// (`outbox_workflow_bridge::wire::OutcomeBody`) names every outcome, and a
/// new one must fail its build until it has a name there.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Another job holds the run (its lease is live), or took it over
    /// while this call worked: this call left the run alone from then on.
    Taken,
    /// The run stopped after [`Runner::stop_after`] blocks (tests), its
    /// lease released as after a crash once the lease expired.
    Paused,
}

/// Runs executions natively. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runner {
    http: GuardedClient,
    stop_after: Option<usize>,
    progress: Option<tokio::sync::mpsc::UnboundedSender<BlockProgress>>,
    /// The sandbox of `code` blocks: set in a bridge runner only.
    bridge_blocks: Option<Arc<dyn CodeSandbox>>,
    lease: Duration,
}

/// A block the runner just ran (committed), for an observer: the bridge's
/// stream runs report these as they happen.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockProgress {
    /// The block's id.
    pub block_id: String,
    /// Its type.
    pub kind: outbox_workflow_model::BlockKind,
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
            bridge_blocks: None,
            lease: DEFAULT_LEASE,
        })
    }

    /// Holds runs with leases of `lease` instead of [`DEFAULT_LEASE`]: how
    /// long a run stays taken after its holder's last write, so how soon
    /// another job (or the sweep) may resume a run whose holder died.
    /// Longer than any pause of a live holder between two writes (a
    /// database round trip; calls are covered by their own limits).
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The lease this runner takes runs with.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Runs the bridge-only blocks too, for the bridge process only: the
    /// preflight no longer refuses `code` and `aiAgent`, and a `code` block
    /// runs its JavaScript in `sandbox` before its transaction, which
    /// records the output. `aiAgent` fails its block
    /// ([`NO_MODEL_PROVIDER`]).
    #[must_use]
    pub fn with_bridge_blocks(mut self, sandbox: Arc<dyn CodeSandbox>) -> Self {
        self.bridge_blocks = Some(sandbox);
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
    /// unfinished block; a waiting or finished one is left alone, and so is
    /// one another job holds ([`RunOutcome::Taken`]).
    ///
    /// # Errors
    ///
    /// [`RunError`] when the database fails (the execution stays where its
    /// last committed block left it, its lease released) or there is no
    /// such execution.
    pub async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        id: Uuid,
    ) -> Result<RunOutcome, RunError> {
        let owner = Uuid::new_v4();
        let Some(execution) = lease::take(conn, id, owner, self.lease).await? else {
            return left_alone(conn, id).await;
        };
        self.hold(conn, execution, owner).await
    }

    /// Continues execution `id`, waiting in `waiting_block`: with the
    /// answer `input` (output `input`) or, for [`ContinueKind::Timeout`],
    /// along output `timeout`. The first continuation wins: when the
    /// execution waits elsewhere or has ended, nothing changes. When it is
    /// `running` (a continuation redelivered after its holder died, or the
    /// other continuation of the same wait), it is run as by
    /// [`run`](Self::run): resumed at its first unfinished block unless
    /// another job holds it.
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
        let owner = Uuid::new_v4();
        let lease = self.lease;
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
                Ok(Ok(lease::take(conn, id, owner, lease).await?))
            })
            .await?;
        match resumed {
            Ok(Some(execution)) => self.hold(conn, execution, owner).await,
            // Not under the lock: a waiting run has no holder.
            Ok(None) => left_alone(conn, id).await,
            Err(ExecutionStatus::Running) => self.run(conn, id).await,
            Err(status) => Ok(RunOutcome::Unchanged(status)),
        }
    }

    /// Advances `execution`, whose lease `owner` holds, and gives the lease
    /// up when the call stops without the run waiting or ending.
    async fn hold(
        &self,
        conn: &mut AsyncPgConnection,
        execution: WorkflowExecution,
        owner: Uuid,
    ) -> Result<RunOutcome, RunError> {
        let id = execution.id;
        let outcome = self.advance(conn, execution.clone(), owner).await;
        let outcome = match outcome {
            // An error no retry changes (a stored value this version cannot
            // read, an event the outbox refuses): the run ends here, instead
            // of being resumed, and failing, again and again.
            Err(error) if !error.is_transient() => {
                let reason = format!("the run cannot go on: {error}");
                tracing::error!(execution = %id, %error, "workflow run ended in error");
                let end = End::new(ExecutionStatus::Error).error(&reason);
                finish(conn, &execution, owner, end).await
            }
            other => other,
        };
        if matches!(outcome, Err(_) | Ok(RunOutcome::Paused)) {
            // Best effort: a lease not released expires by itself.
            if let Err(error) = lease::release(conn, id, owner).await {
                tracing::warn!(execution = %id, %error, "cannot release the run's lease");
            }
        }
        outcome
    }

    async fn advance(
        &self,
        conn: &mut AsyncPgConnection,
        execution: WorkflowExecution,
        owner: Uuid,
    ) -> Result<RunOutcome, RunError> {
        let id = execution.id;
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
                let end = End::new(ExecutionStatus::Error).error(&reason);
                return finish(conn, &execution, owner, end).await;
            }
            Err(error) => return Err(error.into()),
        };
        if execution.status == ExecutionStatus::Queued {
            // No credential store yet: a block naming a credential cannot
            // run natively.
            if let Err(error) = workflow.preflight(self.bridge_blocks.is_none(), &|_| false) {
                let reason = error.to_string();
                let end = End::new(ExecutionStatus::Rejected).error(&reason);
                return finish(conn, &execution, owner, end).await;
            }
            db::start(conn, id).await?;
        }
        self.walk(conn, execution, &workflow, owner).await
    }

    async fn walk(
        &self,
        conn: &mut AsyncPgConnection,
        execution: WorkflowExecution,
        workflow: &ValidatedWorkflow,
        owner: Uuid,
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
                let early = match self
                    .before_transaction(conn, &execution, block, &ctx, owner)
                    .await?
                {
                    Early::Lost => return left_alone(conn, execution.id).await,
                    Early::Done(result) => Some(result),
                    Early::Nothing => None,
                };
                let lease = self.lease;
                let step = conn
                    .transaction::<_, StepError, _>(async |conn| {
                        step(
                            conn,
                            execution.id,
                            owner,
                            lease,
                            block,
                            &ctx,
                            vars.clone(),
                            early,
                        )
                        .await
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
                    // Taken over, cancelled or ended meanwhile: this call
                    // writes nothing more.
                    Ok(None) => return left_alone(conn, execution.id).await,
                    Err(StepError::Run(error)) => return Err(error),
                    Err(StepError::Block(reason)) => {
                        self.report(block, BlockExecutionStatus::Error, None, Some(&reason));
                        let reason = format!("block {}: {reason}", block.id);
                        let end = End::new(ExecutionStatus::Error)
                            .error(&reason)
                            .failed_block(&block.id);
                        return finish(conn, &execution, owner, end).await;
                    }
                }
            };
            outputs.insert(block.id.clone(), json!({ "output": output }));
            last = output;
            current = workflow.next(&block.id, &label);
        }
        let end = End::new(ExecutionStatus::Success).output(&last);
        finish(conn, &execution, owner, end).await
    }

    /// The work of `block` that happens before its transaction: the HTTP
    /// call of `httpRequest` and, in a bridge runner, the script of `code`
    /// (and the refusal of `aiAgent`). A call is made only once the block
    /// is claimed under `owner`'s lease, held long enough to cover it.
    async fn before_transaction(
        &self,
        conn: &mut AsyncPgConnection,
        execution: &WorkflowExecution,
        block: &Block,
        ctx: &Value,
        owner: Uuid,
    ) -> Result<Early, RunError> {
        let sandbox = self.bridge_blocks.as_deref();
        let limit = match (&block.params, sandbox) {
            (BlockParams::HttpRequest(p), _) => Duration::from_millis(p.timeout_ms()),
            (BlockParams::Code(_), Some(sandbox)) => sandbox.time_limit(),
            (BlockParams::AiAgent(_), Some(_)) => {
                return Ok(Early::Done(Err(NO_MODEL_PROVIDER.to_owned())));
            }
            _ => return Ok(Early::Nothing),
        };
        let hold = limit + self.lease;
        let Some(attempt) = lease::claim_block(conn, execution.id, owner, &block.id, hold).await?
        else {
            return Ok(Early::Lost);
        };
        if attempt > MAX_CLAIMS {
            return Ok(Early::Done(Err(format!(
                "claimed {MAX_CLAIMS} times without a recorded result (each holder died or \
                 could not record it); not called again"
            ))));
        }
        if attempt > 1 {
            tracing::warn!(
                execution = %execution.id,
                block = %block.id,
                attempt,
                "this block was claimed before without a recorded result: its work runs again"
            );
        }
        let result = match (&block.params, sandbox) {
            (BlockParams::HttpRequest(p), _) => self
                .call(execution, &block.id, p, ctx)
                .await
                .map_err(|e| e.to_string()),
            (BlockParams::Code(p), Some(sandbox)) => sandbox.run(p, ctx).await,
            _ => return Ok(Early::Nothing),
        };
        Ok(Early::Done(result))
    }
}

/// What happened before a block's transaction.
enum Early {
    /// The block has no such work.
    Nothing,
    /// Its result (the call's output, or why it failed).
    Done(Result<Value, String>),
    /// The lease was lost before the claim: nothing was done.
    Lost,
}

/// One block in its transaction, fenced by `owner`'s lease: `None` when the
/// run is no longer `owner`'s to advance (taken over, cancelled, ended).
#[allow(clippy::too_many_arguments)]
async fn step(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    owner: Uuid,
    lease: Duration,
    block: &Block,
    ctx: &Value,
    mut vars: Map<String, Value>,
    early: Option<Result<Value, String>>,
) -> Result<Option<(Effect, Map<String, Value>)>, StepError> {
    let Some(execution) = lease::fence(conn, id, owner).await? else {
        return Ok(None);
    };
    let mut tx = OutboxTx::new(conn).map_err(RunError::from)?;
    let effect = apply(&mut tx, &execution, block, ctx, &mut vars, early).await?;
    let state = Value::Object(vars.clone());
    match &effect {
        Effect::Next { output, .. } => {
            let success = BlockExecutionStatus::Success;
            db::record_block(tx.conn(), id, &block.id, success, Some(output), None).await?;
            db::set_state(tx.conn(), id, ExecutionStatus::Running, None, &state).await?;
            lease::renew(tx.conn(), id, lease).await?;
        }
        Effect::Wait => {
            let waiting = BlockExecutionStatus::Waiting;
            db::record_block(tx.conn(), id, &block.id, waiting, None, None).await?;
        }
    }
    Ok(Some((effect, vars)))
}

/// What a call that did not advance the run reports: the run's status when
/// it is no longer there to advance, else [`RunOutcome::Taken`].
async fn left_alone(conn: &mut AsyncPgConnection, id: Uuid) -> Result<RunOutcome, RunError> {
    let execution = store::get_execution(conn, id)
        .await?
        .ok_or(RunError::ExecutionNotFound { execution_id: id })?;
    Ok(match execution.status {
        ExecutionStatus::Queued | ExecutionStatus::Running => RunOutcome::Taken,
        status => RunOutcome::Unchanged(status),
    })
}
