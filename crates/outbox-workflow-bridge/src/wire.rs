//! The bridge's request and response bodies (JSON, camelCase).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use outbox_workflow_model::events::ContinueKind;
use outbox_workflow_runner::RunOutcome;
use outbox_workflow_store::ExecutionStatus;

/// `POST /v1/executions/run`: run a queued (or resume a running) execution.
pub const RUN_PATH: &str = "/v1/executions/run";
/// `POST /v1/executions/continue`: continue a waiting execution.
pub const CONTINUE_PATH: &str = "/v1/executions/continue";
/// `POST /v1/executions/stream`: start a stream run, answered with
/// server-sent events.
pub const STREAM_PATH: &str = "/v1/executions/stream";

/// The body of [`RUN_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRequest {
    /// The tenant that owns the execution.
    pub tenant_id: String,
    /// The execution.
    pub execution_id: Uuid,
}

/// The body of [`CONTINUE_PATH`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContinueRequest {
    /// The tenant that owns the execution.
    pub tenant_id: String,
    /// The waiting execution.
    pub execution_id: Uuid,
    /// The `waitForInput` block it waits in.
    pub waiting_block: String,
    /// An answer or the timeout.
    pub kind: ContinueKind,
    /// The answer (`null` for a timeout).
    #[serde(default)]
    pub input: Value,
}

/// The body of [`STREAM_PATH`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StreamRequest {
    /// The tenant that owns the workflow.
    pub tenant_id: String,
    /// The workflow to run, on its current version.
    pub workflow_id: Uuid,
    /// The run's input.
    #[serde(default)]
    pub input: Value,
}

/// What a run or continue request left the execution in: the wire form of
/// [`RunOutcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeBody {
    /// `finished`, `waiting`, `unchanged`, `taken` (another job holds the
    /// run) or `paused`.
    pub outcome: String,
    /// The execution's status (`finished`, `unchanged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The block it waits in (`waiting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_block: Option<String>,
}

impl From<&RunOutcome> for OutcomeBody {
    fn from(outcome: &RunOutcome) -> Self {
        let (kind, status, waiting_block) = match outcome {
            RunOutcome::Finished(status) => ("finished", Some(status.as_str()), None),
            RunOutcome::Waiting(block) => ("waiting", None, Some(block.clone())),
            RunOutcome::Unchanged(status) => ("unchanged", Some(status.as_str()), None),
            RunOutcome::Taken => ("taken", None, None),
            RunOutcome::Paused => ("paused", None, None),
        };
        Self {
            outcome: kind.to_owned(),
            status: status.map(str::to_owned),
            waiting_block,
        }
    }
}

impl TryFrom<OutcomeBody> for RunOutcome {
    type Error = String;

    fn try_from(body: OutcomeBody) -> Result<Self, String> {
        let status = |body: &OutcomeBody| -> Result<ExecutionStatus, String> {
            body.status
                .as_deref()
                .ok_or_else(|| format!("outcome {} without a status", body.outcome))?
                .parse()
                .map_err(|e| format!("{e}"))
        };
        match body.outcome.as_str() {
            "finished" => Ok(Self::Finished(status(&body)?)),
            "unchanged" => Ok(Self::Unchanged(status(&body)?)),
            "waiting" => Ok(Self::Waiting(
                body.waiting_block
                    .ok_or("outcome waiting without a block")?,
            )),
            "taken" => Ok(Self::Taken),
            "paused" => Ok(Self::Paused),
            other => Err(format!("unknown outcome {other:?}")),
        }
    }
}

/// An error answer of the bridge: `{ "error": "..." }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}
