//! `outbox workflow validate FILE|-`: checks a definition against every
//! rule and prints `ok` with its shape, or the first rule broken (naming
//! the block or edge). Touches no database. Exit 0 valid, 1 invalid, 2 the
//! file cannot be read.

use clap::Args;
use outbox_workflow_model::{PreflightError, ValidatedWorkflow};
use outbox_workflow_store::admin::DocumentSource;
use serde::Serialize;

use crate::{Cli, ExitStatus, Failure, Outcome, print_json};

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Examples:\n  outbox workflow validate order-flow.json\n  cat order-flow.json | outbox workflow validate - --json\n\nExit codes: 0 valid; 1 invalid; 2 the file cannot be read or a usage error.";

/// `outbox workflow validate` arguments.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The definition (JSON); `-` reads standard input.
    #[arg(value_name = "FILE|-")]
    file: String,
}

/// What `validate` reports.
#[derive(Serialize)]
struct Report {
    valid: bool,
    /// The first rule broken, when invalid.
    error: Option<String>,
    blocks: Option<usize>,
    edges: Option<usize>,
    /// The trigger block's id, when valid.
    trigger: Option<String>,
    /// Why the native runner would refuse it (a bridge-only block or a
    /// credential); `None` when it runs natively. Not a validation error.
    native_refusal: Option<String>,
    /// What the refusal leaves: the bridge runs a bridge-only block, but
    /// no executor has credentials yet.
    #[serde(skip)]
    refusal_hint: &'static str,
}

impl Report {
    fn of(result: &Result<ValidatedWorkflow, outbox_workflow_model::DefinitionError>) -> Self {
        match result {
            Ok(workflow) => {
                let refusal = workflow.preflight(true, &|_| false).err();
                Self {
                    valid: true,
                    error: None,
                    blocks: Some(workflow.blocks().len()),
                    edges: Some(workflow.edges().len()),
                    trigger: Some(workflow.trigger_block().id.clone()),
                    native_refusal: refusal.as_ref().map(ToString::to_string),
                    refusal_hint: match refusal {
                        Some(PreflightError::NotNative { .. }) => {
                            "it needs WORKFLOW_EXECUTOR hybrid or http"
                        }
                        _ => "no executor has a credential store yet: a run of it ends rejected",
                    },
                }
            }
            Err(error) => Self {
                valid: false,
                error: Some(format!("invalid workflow definition: {error}")),
                blocks: None,
                edges: None,
                trigger: None,
                native_refusal: None,
                refusal_hint: "",
            },
        }
    }
}

/// Runs `outbox workflow validate`.
pub async fn run(cli: &Cli, args: &ValidateArgs) -> Outcome {
    let source = DocumentSource::from(args.file.as_str());
    let text = source.read()?;
    let report = Report::of(&ValidatedWorkflow::from_json(&text));
    if cli.json {
        print_json(&report)?;
        return Ok(ExitStatus::alert_if(!report.valid));
    }
    if let Some(error) = report.error {
        return Err(Failure {
            status: ExitStatus::Alert,
            error: anyhow::anyhow!("{source}: {error}"),
        });
    }
    println!(
        "ok: {source}: {} block(s), {} edge(s), trigger {:?}",
        report.blocks.unwrap_or_default(),
        report.edges.unwrap_or_default(),
        report.trigger.unwrap_or_default()
    );
    if let Some(refusal) = report.native_refusal {
        println!(
            "note: the native runner refuses it ({refusal}); {}",
            report.refusal_hint
        );
    }
    Ok(ExitStatus::Ok)
}
