//! `outbox workflow cancel --tenant T EXECUTION [--by WHO]`: cancels a run
//! that is `queued`, `running` or `waiting` (it ends `cancelled`, its
//! `error` `cancelled by WHO`, and the `plugin.hook.workflow.failed` hook
//! is published); a finished run is refused with its status. A running run
//! stops at its next block.

use clap::Args;
use outbox_workflow_store::{self as store, CancelError, CancelledExecution};
use serde_json::json;
use uuid::Uuid;

use crate::{Cli, ExitStatus, Failure, Outcome, connect, print_json};

/// Who cancels or answers when neither `--by` nor `USER` says.
pub(super) const DEFAULT_BY: &str = "operator";

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Examples:\n  outbox workflow cancel --tenant acme <execution id> --by alice\n\nExit codes: 0 cancelled; 1 no such execution, or the run already finished (the message names its status); 2 a usage, configuration or connection error.";

/// `outbox workflow cancel` arguments.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The tenant the execution belongs to.
    #[arg(long)]
    tenant: String,
    /// The execution's id.
    #[arg(value_name = "EXECUTION")]
    execution: Uuid,
    /// Who cancels, kept in the run's error (default: $USER, else `operator`).
    #[arg(long, value_name = "WHO")]
    by: Option<String>,
}

/// Runs `outbox workflow cancel`.
pub async fn run(cli: &Cli, args: &CancelArgs) -> Outcome {
    let by = match &args.by {
        Some(by) => by.clone(),
        None => std::env::var("USER").unwrap_or_else(|_| DEFAULT_BY.to_owned()),
    };
    let mut conn = connect(cli).await?;
    let cancelled = store::cancel_execution(&mut conn, &args.tenant, args.execution, &by)
        .await
        .map_err(failure)?;
    render(cli, &cancelled)?;
    Ok(ExitStatus::Ok)
}

/// A refusal (no such execution, already finished) exits 1; anything else 2.
fn failure(error: CancelError) -> Failure {
    Failure {
        status: if error.is_refusal() {
            ExitStatus::Alert
        } else {
            ExitStatus::Error
        },
        error: error.into(),
    }
}

fn render(cli: &Cli, cancelled: &CancelledExecution) -> anyhow::Result<()> {
    let execution = &cancelled.execution;
    if cli.json {
        return print_json(&json!({
            "execution_id": execution.id,
            "previous_status": cancelled.previous,
            "status": execution.status,
            "error": execution.error,
        }));
    }
    println!(
        "cancelled execution {} (it was {}){}",
        execution.id,
        cancelled.previous,
        if cancelled.previous == store::ExecutionStatus::Running {
            "; it stops at its next block"
        } else {
            ""
        }
    );
    Ok(())
}
