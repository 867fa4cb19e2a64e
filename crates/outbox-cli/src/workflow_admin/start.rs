//! `outbox workflow start --tenant T WORKFLOW [--input JSON|--input-file F]`:
//! requests a manual run of the workflow's current version (a `queued`
//! execution and its `workflow.execution.requested` event, one
//! transaction) and prints the execution id. It runs nothing itself: a
//! worker consuming `outbox.workflow` does.

use clap::Args;
use outbox_workflow_store::admin::{self, StartedRun};
use outbox_workflow_store::{ExecutionStatus, WorkflowRef};
use serde_json::json;

use super::{InputArgs, failure};
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Examples:\n  outbox workflow start --tenant acme order-flow --input '{\"order\": {\"id\": 7, \"total\": 120}}'\n  outbox workflow start --tenant acme order-flow --input-file input.json --json\n\nExit codes: 0 requested; 1 the tenant has no such workflow; 2 input that is not JSON, a usage, configuration or connection error.";

/// `outbox workflow start` arguments.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// The tenant the workflow belongs to.
    #[arg(long)]
    tenant: String,
    /// The workflow: its id or its name.
    #[arg(value_name = "WORKFLOW")]
    workflow: String,
    #[command(flatten)]
    input: InputArgs,
}

/// Runs `outbox workflow start`.
pub async fn run(cli: &Cli, args: &StartArgs) -> Outcome {
    let reference: WorkflowRef = args.workflow.parse()?;
    let input = args.input.value()?;
    let mut conn = connect(cli).await?;
    let started = admin::start_run(&mut conn, &args.tenant, &reference, &input)
        .await
        .map_err(failure)?;
    render(cli, &started)?;
    Ok(ExitStatus::Ok)
}

fn render(cli: &Cli, started: &StartedRun) -> anyhow::Result<()> {
    let workflow = &started.workflow;
    if cli.json {
        return print_json(&json!({
            "execution_id": started.execution_id,
            "workflow_id": workflow.id,
            "name": workflow.name,
            "version": workflow.current_version,
            "status": ExecutionStatus::Queued,
        }));
    }
    println!(
        "queued execution {} of workflow {:?} version {}; follow it with `outbox workflow show {}`",
        started.execution_id, workflow.name, workflow.current_version, started.execution_id
    );
    Ok(())
}
