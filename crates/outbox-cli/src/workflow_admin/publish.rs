//! `outbox workflow publish --tenant T WORKFLOW`: makes the workflow (id or
//! name) live on its current version.

use clap::Args;
use outbox_workflow_store::admin;
use outbox_workflow_store::{Workflow, WorkflowRef};
use serde_json::json;

use super::failure;
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Examples:\n  outbox workflow publish --tenant acme order-flow\n\nExit codes: 0 live; 1 the tenant has no such workflow; 2 a usage, configuration or connection error.";

/// `outbox workflow publish` arguments.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The tenant the workflow belongs to.
    #[arg(long)]
    tenant: String,
    /// The workflow: its id or its name.
    #[arg(value_name = "WORKFLOW")]
    workflow: String,
}

/// Runs `outbox workflow publish`.
pub async fn run(cli: &Cli, args: &PublishArgs) -> Outcome {
    let reference: WorkflowRef = args.workflow.parse()?;
    let mut conn = connect(cli).await?;
    let workflow = admin::publish_workflow(&mut conn, &args.tenant, &reference)
        .await
        .map_err(failure)?;
    render(cli, &workflow)?;
    Ok(ExitStatus::Ok)
}

fn render(cli: &Cli, workflow: &Workflow) -> anyhow::Result<()> {
    if cli.json {
        return print_json(&json!({
            "workflow_id": workflow.id,
            "tenant_id": workflow.tenant_id,
            "name": workflow.name,
            "status": workflow.status,
            "current_version": workflow.current_version,
        }));
    }
    println!(
        "workflow {:?} ({}) is {} on version {}",
        workflow.name, workflow.id, workflow.status, workflow.current_version
    );
    Ok(())
}
