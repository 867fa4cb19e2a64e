//! `outbox workflow answer --tenant T EXECUTION [--input JSON|--input-file F] [--by WHO]`:
//! answers a run waiting in a `waitForInput` block (the answer becomes the
//! block's output) by publishing `workflow.execution.continue.requested`;
//! a worker resumes the run. Who answered is kept on the waiting block run
//! (`outbox workflow show` prints it). A run that is not waiting is refused
//! with its status; a second answer to the same wait writes nothing.

use clap::Args;
use outbox_publish::PublishOutcome;
use outbox_workflow_store::admin::{self, AnsweredRun};
use serde_json::json;
use uuid::Uuid;

use super::{InputArgs, failure};
use crate::workflow_admin::cancel::DEFAULT_BY;
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// What `--help` shows after the flags: examples and the exit codes.
pub const AFTER_HELP: &str = "Examples:\n  outbox workflow answer --tenant acme <execution id> --input '{\"approved\": true}'\n\nExit codes: 0 answered; 1 no such execution, the run is not waiting (the message names its status), or the wait was already answered (nothing written); 2 input that is not JSON, a usage, configuration or connection error.";

/// `outbox workflow answer` arguments.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The tenant the execution belongs to.
    #[arg(long)]
    tenant: String,
    /// The waiting execution's id.
    #[arg(value_name = "EXECUTION")]
    execution: Uuid,
    #[command(flatten)]
    input: InputArgs,
    /// Who answers, kept on the waiting block run (default: $USER, else `operator`).
    #[arg(long, value_name = "WHO")]
    by: Option<String>,
}

/// Runs `outbox workflow answer`.
pub async fn run(cli: &Cli, args: &AnswerArgs) -> Outcome {
    let input = args.input.value()?;
    let by = match &args.by {
        Some(by) => by.clone(),
        None => std::env::var("USER").unwrap_or_else(|_| DEFAULT_BY.to_owned()),
    };
    let mut conn = connect(cli).await?;
    let answered = admin::answer_run(&mut conn, &args.tenant, args.execution, &input, &by)
        .await
        .map_err(failure)?;
    render(cli, args.execution, &answered)?;
    // A repeated answer changed nothing: the first one stands.
    Ok(ExitStatus::alert_if(matches!(
        answered.event,
        PublishOutcome::Duplicate(_)
    )))
}

fn render(cli: &Cli, execution: Uuid, answered: &AnsweredRun) -> anyhow::Result<()> {
    let (event, duplicate) = (answered.event.id(), answered.event.is_duplicate());
    if cli.json {
        return print_json(&json!({
            "execution_id": execution,
            "waiting_block": answered.waiting_block,
            "event_id": event,
            "duplicate": duplicate,
        }));
    }
    if duplicate {
        println!(
            "execution {execution} already has an answer for block {:?} (outbox event {event}); nothing written",
            answered.waiting_block
        );
    } else {
        println!(
            "answered execution {execution} waiting in block {:?} (outbox event {event}); a worker resumes it",
            answered.waiting_block
        );
    }
    Ok(())
}
