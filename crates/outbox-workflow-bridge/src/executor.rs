//! Where executions run: [`Executor`], chosen by `WORKFLOW_EXECUTOR`.
//!
//! - `native`: in the worker, with the native [`Runner`]; a workflow that
//!   fails the native preflight is recorded `rejected` with the reason,
//!   before any block runs.
//! - `http`: every run and continuation is posted to the signed bridge
//!   ([`BridgeClient`]), which runs it.
//! - `hybrid`: natively when the native preflight passes, else on the
//!   bridge. For a continuation only the blocks still reachable from the
//!   waiting block are preflighted: the `waitForInput` boundary the run
//!   already crossed is the one tolerated gap.
//!
//! Runs are always durable: the worker calls the executor from the
//! `outbox.workflow` subscriber, so a run or continuation is an outbox
//! event first. Nothing here creates executions.

use std::fmt;
use std::str::FromStr;

use diesel_async::AsyncPgConnection;
use outbox_env::{Text, VariableError};
use outbox_workflow_model::events::ContinueKind;
use outbox_workflow_runner::{RunError, RunOutcome, Runner};
use outbox_workflow_store::{self as store, StoreError, WorkflowExecution};
use serde_json::Value;
use uuid::Uuid;

use crate::{BridgeCallError, BridgeClient};

/// `WORKFLOW_EXECUTOR`: the [`ExecutorMode`]
/// ([`ExecutorMode::from_lookup`]).
pub const WORKFLOW_EXECUTOR: Text = Text {
    name: "WORKFLOW_EXECUTOR",
    default: ExecutorMode::Native.as_str(),
    form: "native, hybrid, http",
    meaning: "where workflow executions run",
};

/// `WORKFLOW_BRIDGE_URL`: the base URL of the [`BridgeClient`] of the
/// `hybrid` and `http` modes.
pub const WORKFLOW_BRIDGE_URL: Text = Text {
    name: "WORKFLOW_BRIDGE_URL",
    default: "unset (required by hybrid and http)",
    form: "http(s)://host:port",
    meaning: "the workflow bridge",
};

/// `WORKFLOW_EXECUTOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ExecutorMode {
    /// Runs in the worker; the native preflight rejects what cannot.
    #[default]
    Native,
    /// Native when the preflight passes, else the bridge.
    Hybrid,
    /// Always the bridge.
    Http,
}

impl ExecutorMode {
    /// `native`, `hybrid` or `http`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Hybrid => "hybrid",
            Self::Http => "http",
        }
    }

    /// Whether the mode needs the bridge (`WORKFLOW_BRIDGE_URL` and
    /// `WORKFLOW_BRIDGE_SECRET`).
    #[must_use]
    pub const fn needs_bridge(self) -> bool {
        !matches!(self, Self::Native)
    }
}

impl ExecutorMode {
    /// [`WORKFLOW_EXECUTOR`] read through `get`, [`ExecutorMode::Native`]
    /// when unset.
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming the variable for any other word.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, VariableError> {
        match WORKFLOW_EXECUTOR.read(get) {
            None => Ok(Self::default()),
            Some(value) => value.trim().parse().map_err(|e: UnknownExecutor| {
                WORKFLOW_EXECUTOR.refuse(value.clone(), format!("is not an executor: {e}"))
            }),
        }
    }
}

impl fmt::Display for ExecutorMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `WORKFLOW_EXECUTOR` value that is not a mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an executor; expected native, hybrid or http")]
pub struct UnknownExecutor(pub String);

impl FromStr for ExecutorMode {
    type Err = UnknownExecutor;

    fn from_str(s: &str) -> Result<Self, UnknownExecutor> {
        match s {
            "native" => Ok(Self::Native),
            "hybrid" => Ok(Self::Hybrid),
            "http" => Ok(Self::Http),
            other => Err(UnknownExecutor(other.to_owned())),
        }
    }
}

/// An executor that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "WORKFLOW_EXECUTOR={mode} needs the bridge (WORKFLOW_BRIDGE_URL and WORKFLOW_BRIDGE_SECRET)"
)]
pub struct MissingBridge {
    /// The mode asked for.
    pub mode: ExecutorMode,
}

/// Where one call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The native runner, in this process.
    Native,
    /// The bridge.
    Bridge,
}

/// A run or continuation that did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecuteError {
    /// The native runner's error.
    #[error(transparent)]
    Run(#[from] RunError),
    /// Reading the execution or its workflow failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bridge did not run it.
    #[error(transparent)]
    Bridge(#[from] BridgeCallError),
    /// No such execution.
    #[error("execution {execution_id} not found")]
    ExecutionNotFound {
        /// The id asked for.
        execution_id: Uuid,
    },
}

impl ExecuteError {
    /// Whether trying again later may succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Run(error) => error.is_transient(),
            Self::Store(error) => matches!(error, StoreError::Database(_)),
            Self::Bridge(error) => error.is_transient(),
            Self::ExecutionNotFound { .. } => false,
        }
    }
}

/// Runs and continues executions where [`ExecutorMode`] says. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Executor {
    mode: ExecutorMode,
    runner: Runner,
    bridge: Option<BridgeClient>,
}

impl Executor {
    /// The `native` executor.
    #[must_use]
    pub fn native(runner: Runner) -> Self {
        Self {
            mode: ExecutorMode::Native,
            runner,
            bridge: None,
        }
    }

    /// The executor of `mode`; `bridge` is required for `hybrid` and
    /// `http` (and unused by `native`).
    ///
    /// # Errors
    ///
    /// [`MissingBridge`] when the mode needs the bridge and there is none.
    pub fn new(
        mode: ExecutorMode,
        runner: Runner,
        bridge: Option<BridgeClient>,
    ) -> Result<Self, MissingBridge> {
        if mode.needs_bridge() && bridge.is_none() {
            return Err(MissingBridge { mode });
        }
        Ok(Self {
            mode,
            runner,
            bridge,
        })
    }

    /// The mode.
    #[must_use]
    pub fn mode(&self) -> ExecutorMode {
        self.mode
    }

    async fn execution(
        conn: &mut AsyncPgConnection,
        id: Uuid,
    ) -> Result<WorkflowExecution, ExecuteError> {
        store::get_execution(conn, id)
            .await?
            .ok_or(ExecuteError::ExecutionNotFound { execution_id: id })
    }

    /// Where a run of `execution` goes (from the start or resumed), or, with
    /// `waiting_block`, a continuation from that block.
    ///
    /// # Errors
    ///
    /// [`ExecuteError::Store`] when the workflow version cannot be read.
    pub async fn route(
        &self,
        conn: &mut AsyncPgConnection,
        execution: &WorkflowExecution,
        waiting_block: Option<&str>,
    ) -> Result<Route, ExecuteError> {
        match self.mode {
            ExecutorMode::Native => Ok(Route::Native),
            ExecutorMode::Http => Ok(Route::Bridge),
            ExecutorMode::Hybrid => {
                let workflow = match store::load_version(
                    conn,
                    execution.workflow_id,
                    execution.workflow_version,
                )
                .await
                {
                    Ok(workflow) => workflow,
                    // The native runner records why the stored
                    // definition cannot run.
                    Err(
                        StoreError::StoredDefinition { .. } | StoreError::VersionNotFound { .. },
                    ) => {
                        return Ok(Route::Native);
                    }
                    Err(error) => return Err(error.into()),
                };
                // No credential store in the worker yet.
                let none = |_: &str| false;
                let native = match waiting_block {
                    Some(block) => workflow.preflight_continuation(block, true, &none),
                    None => workflow.preflight(true, &none),
                };
                Ok(if native.is_ok() {
                    Route::Native
                } else {
                    Route::Bridge
                })
            }
        }
    }

    fn bridge(&self) -> &BridgeClient {
        // `new` refuses a bridge mode without a client, and `native` never
        // routes to the bridge.
        #[allow(clippy::expect_used)]
        self.bridge.as_ref().expect("a bridge mode has a client")
    }

    /// Runs execution `id` from where it stands (as [`Runner::run`]),
    /// natively or on the bridge.
    ///
    /// # Errors
    ///
    /// [`ExecuteError`].
    pub async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        id: Uuid,
    ) -> Result<RunOutcome, ExecuteError> {
        let execution = Self::execution(conn, id).await?;
        match self.route(conn, &execution, None).await? {
            Route::Native => Ok(self.runner.run(conn, id).await?),
            Route::Bridge => {
                tracing::info!(execution = %id, mode = %self.mode, "running on the bridge");
                Ok(self.bridge().run(&execution.tenant_id, id).await?)
            }
        }
    }

    /// Continues the execution waiting in `waiting_block` (as
    /// [`Runner::resume`]), natively or on the bridge.
    ///
    /// # Errors
    ///
    /// [`ExecuteError`].
    pub async fn resume(
        &self,
        conn: &mut AsyncPgConnection,
        id: Uuid,
        waiting_block: &str,
        kind: ContinueKind,
        input: &Value,
    ) -> Result<RunOutcome, ExecuteError> {
        let execution = Self::execution(conn, id).await?;
        match self.route(conn, &execution, Some(waiting_block)).await? {
            Route::Native => Ok(self
                .runner
                .resume(conn, id, waiting_block, kind, input)
                .await?),
            Route::Bridge => {
                tracing::info!(execution = %id, mode = %self.mode, "continuing on the bridge");
                Ok(self
                    .bridge()
                    .resume(&execution.tenant_id, id, waiting_block, kind, input)
                    .await?)
            }
        }
    }
}
