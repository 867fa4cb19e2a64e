//! `outbox workflow save --tenant T --name N [--live|--draft] FILE|-`:
//! validates the definition and saves it (a new version, or the draft's
//! current version overwritten); prints the workflow id, the version and
//! the status.

use clap::Args;
use outbox_workflow_store::admin::{self, DocumentSource};
use outbox_workflow_store::{SavedWorkflow, WorkflowStatus};
use serde_json::json;

use super::failure;
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Without --live or --draft the workflow keeps its status (a new one is a draft). Saving a live workflow appends a version; runs in flight keep theirs.\n\nExamples:\n  outbox workflow save --tenant acme --name order-flow order-flow.json\n  outbox workflow save --tenant acme --name order-flow --live order-flow.json\n\nExit codes: 0 saved; 1 the definition is invalid (nothing saved); 2 the file cannot be read, a usage, configuration or connection error.";

/// `outbox workflow save` arguments.
#[derive(Debug, Args)]
pub struct SaveArgs {
    /// The tenant the workflow belongs to.
    #[arg(long)]
    tenant: String,
    /// The workflow's name, unique within the tenant; the first save creates it.
    #[arg(long)]
    name: String,
    /// Make the workflow live: triggers start runs on this version.
    #[arg(long, conflicts_with = "draft")]
    live: bool,
    /// Make the workflow a draft: triggers stop starting it until `publish` (a live workflow goes out of service).
    #[arg(long)]
    draft: bool,
    /// The definition (JSON); `-` reads standard input.
    #[arg(value_name = "FILE|-")]
    file: String,
}

impl SaveArgs {
    /// The status asked for; `None` keeps the workflow's (draft when new).
    fn status(&self) -> Option<WorkflowStatus> {
        match (self.live, self.draft) {
            (true, _) => Some(WorkflowStatus::Live),
            (_, true) => Some(WorkflowStatus::Draft),
            _ => None,
        }
    }
}

/// Runs `outbox workflow save`.
pub async fn run(cli: &Cli, args: &SaveArgs) -> Outcome {
    let text = DocumentSource::from(args.file.as_str()).read()?;
    let mut conn = connect(cli).await?;
    let saved = admin::save_document(&mut conn, &args.tenant, &args.name, args.status(), &text)
        .await
        .map_err(failure)?;
    render(cli, &saved)?;
    Ok(ExitStatus::Ok)
}

fn render(cli: &Cli, saved: &SavedWorkflow) -> anyhow::Result<()> {
    let workflow = &saved.workflow;
    if cli.json {
        return print_json(&json!({
            "workflow_id": workflow.id,
            "tenant_id": workflow.tenant_id,
            "name": workflow.name,
            "version": saved.version,
            "new_version": saved.new_version,
            "status": workflow.status,
        }));
    }
    let how = if saved.new_version {
        "new version"
    } else {
        "draft overwritten"
    };
    println!(
        "saved workflow {:?} ({}) version {} ({how}), status {}",
        workflow.name, workflow.id, saved.version, workflow.status
    );
    Ok(())
}
