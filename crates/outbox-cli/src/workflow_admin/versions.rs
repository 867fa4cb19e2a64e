//! `outbox workflow versions --tenant T WORKFLOW`: the saved versions of a
//! workflow (id or name), oldest first, the current one marked.

use clap::Args;
use outbox_workflow_store::admin;
use outbox_workflow_store::{VersionSummary, Workflow, WorkflowRef};
use serde_json::json;

use super::failure;
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Examples:\n  outbox workflow versions --tenant acme order-flow --json\n\nExit codes: 0 listed; 1 the tenant has no such workflow; 2 a usage, configuration or connection error.";

/// `outbox workflow versions` arguments.
#[derive(Debug, Args)]
pub struct VersionsArgs {
    /// The tenant the workflow belongs to.
    #[arg(long)]
    tenant: String,
    /// The workflow: its id or its name.
    #[arg(value_name = "WORKFLOW")]
    workflow: String,
}

/// Runs `outbox workflow versions`.
pub async fn run(cli: &Cli, args: &VersionsArgs) -> Outcome {
    let reference: WorkflowRef = args.workflow.parse()?;
    let mut conn = connect(cli).await?;
    let (workflow, versions) = admin::list_versions(&mut conn, &args.tenant, &reference)
        .await
        .map_err(failure)?;
    render(cli, &workflow, &versions)?;
    Ok(ExitStatus::Ok)
}

fn render(cli: &Cli, workflow: &Workflow, versions: &[VersionSummary]) -> anyhow::Result<()> {
    if cli.json {
        return print_json(&json!({
            "workflow_id": workflow.id,
            "tenant_id": workflow.tenant_id,
            "name": workflow.name,
            "status": workflow.status,
            "versions": versions,
        }));
    }
    println!(
        "workflow {:?} ({}), {}",
        workflow.name, workflow.id, workflow.status
    );
    println!("{:>7}  {:<20}  CURRENT", "VERSION", "CREATED");
    for v in versions {
        println!(
            "{:>7}  {:<20}  {}",
            v.version,
            crate::render::utc(v.created_at),
            if v.current { "*" } else { "-" }
        );
    }
    Ok(())
}
