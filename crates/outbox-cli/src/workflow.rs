//! `outbox workflow executions | show`: the runs of workflows and the block
//! runs of one; and the workflow section of `outbox health` (executions
//! stuck in `queued` or `running`).
//!
//! Everything here reads through `outbox_workflow_store`; nothing writes.
//! The commands that change workflows and runs (`validate`, `save`,
//! `publish`, `versions`, `start`, `answer`, `cancel`) are dispatched from
//! here to their modules in `workflow_admin`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::{DateTime, Utc};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use diesel_async::AsyncPgConnection;
use outbox_store::{EventKey, EventSummary};
use outbox_workflow_model::events::execution_requested_key;
use outbox_workflow_store::{
    self as store, ExecutionFilter, ExecutionStatus, TriggerKind, WorkflowBlockExecution,
    WorkflowExecution,
};
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::render::{first_line, showing_of, span, truncated};
use crate::workflow_admin;
use crate::{
    Cli, DEFAULT_LIST_LIMIT, ExitStatus, Failure, MAX_LIST_LIMIT, Outcome, connect, print_json,
};

/// Default of `health --stuck-after`.
pub const DEFAULT_STUCK_AFTER: &str = "15m";

/// The widest block output `workflow show` prints in its table (`--json`
/// has all of it).
const OUTPUT_CELL: usize = 120;

/// `outbox workflow` arguments.
#[derive(Args)]
pub struct WorkflowArgs {
    #[command(subcommand)]
    command: WorkflowCommand,
}

#[derive(Subcommand)]
enum WorkflowCommand {
    /// Recent executions, newest first; says how many match when it shows fewer.
    #[command(after_help = crate::EXIT_CODES)]
    Executions(ExecutionsArgs),
    /// One execution (input, output, error, timings) and its block runs in order.
    #[command(after_help = crate::EXIT_CODES)]
    Show {
        /// The execution id.
        id: Uuid,
    },
    /// Check a definition (JSON) against every rule; prints ok or the first rule broken, naming the block or edge. Touches no database.
    #[command(after_help = workflow_admin::validate::AFTER_HELP)]
    Validate(workflow_admin::validate::ValidateArgs),
    /// Validate and save a definition as a tenant's named workflow (version 1 on the first save); prints its id, version and status.
    #[command(after_help = workflow_admin::save::AFTER_HELP)]
    Save(workflow_admin::save::SaveArgs),
    /// Make a workflow (id or name) live: triggers start runs on its current version.
    #[command(after_help = workflow_admin::publish::AFTER_HELP)]
    Publish(workflow_admin::publish::PublishArgs),
    /// List the saved versions of a workflow (id or name), the current one marked.
    #[command(after_help = workflow_admin::versions::AFTER_HELP)]
    Versions(workflow_admin::versions::VersionsArgs),
    /// Request a manual run of a workflow (id or name) on its current version; prints the execution id. A worker runs it.
    #[command(after_help = workflow_admin::start::AFTER_HELP)]
    Start(workflow_admin::start::StartArgs),
    /// Answer a run waiting in a waitForInput block; the answer becomes the block's output. A worker resumes the run.
    #[command(after_help = workflow_admin::answer::AFTER_HELP)]
    Answer(workflow_admin::answer::AnswerArgs),
    /// Cancel a run that is queued, running or waiting: it ends cancelled and the plugin hook plugin.hook.workflow.failed is published. A running run stops at its next block.
    #[command(after_help = workflow_admin::cancel::AFTER_HELP)]
    Cancel(workflow_admin::cancel::CancelArgs),
}

/// `outbox workflow executions` arguments.
#[derive(Args)]
struct ExecutionsArgs {
    /// Only executions with this status (repeatable).
    #[arg(long = "status", value_name = "STATUS", value_parser = status_parser(), ignore_case = true)]
    statuses: Vec<ExecutionStatus>,
    /// Only this tenant's executions.
    #[arg(long)]
    tenant: Option<String>,
    /// Only executions of this workflow (its id).
    #[arg(long)]
    workflow: Option<Uuid>,
    /// At most this many executions, newest first.
    #[arg(long, default_value_t = DEFAULT_LIST_LIMIT, value_parser = clap::value_parser!(u64).range(1..=MAX_LIST_LIMIT))]
    limit: u64,
}

/// Accepts the execution statuses (any case) and lists them in `--help` and in
/// the message for any other value.
fn status_parser() -> impl TypedValueParser<Value = ExecutionStatus> {
    PossibleValuesParser::new(ExecutionStatus::ALL.iter().map(|s| s.as_str()))
        .try_map(|raw| raw.to_ascii_lowercase().parse::<ExecutionStatus>())
}

/// Runs `outbox workflow …`.
pub async fn run(cli: &Cli, args: &WorkflowArgs) -> Outcome {
    match &args.command {
        WorkflowCommand::Executions(args) => executions(cli, args).await,
        WorkflowCommand::Show { id } => show(cli, *id).await,
        WorkflowCommand::Validate(args) => workflow_admin::validate::run(cli, args).await,
        WorkflowCommand::Save(args) => workflow_admin::save::run(cli, args).await,
        WorkflowCommand::Publish(args) => workflow_admin::publish::run(cli, args).await,
        WorkflowCommand::Versions(args) => workflow_admin::versions::run(cli, args).await,
        WorkflowCommand::Start(args) => workflow_admin::start::run(cli, args).await,
        WorkflowCommand::Answer(args) => workflow_admin::answer::run(cli, args).await,
        WorkflowCommand::Cancel(args) => workflow_admin::cancel::run(cli, args).await,
    }
}

/// One execution as `executions` lists it.
#[derive(Serialize)]
struct ExecutionRow<'a> {
    id: Uuid,
    tenant_id: &'a str,
    workflow_id: Uuid,
    workflow_name: Option<&'a str>,
    workflow_version: i32,
    trigger_kind: TriggerKind,
    status: ExecutionStatus,
    waiting_block: Option<&'a str>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    error: Option<&'a str>,
}

impl<'a> ExecutionRow<'a> {
    fn new(execution: &'a WorkflowExecution, names: &'a HashMap<Uuid, String>) -> Self {
        Self {
            id: execution.id,
            tenant_id: &execution.tenant_id,
            workflow_id: execution.workflow_id,
            workflow_name: names.get(&execution.workflow_id).map(String::as_str),
            workflow_version: execution.workflow_version,
            trigger_kind: execution.trigger_kind,
            status: execution.status,
            waiting_block: execution.waiting_block.as_deref(),
            created_at: execution.created_at,
            started_at: execution.started_at,
            finished_at: execution.finished_at,
            updated_at: execution.updated_at,
            error: execution.error.as_deref(),
        }
    }
}

fn timestamp(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), crate::render::utc)
}

async fn executions(cli: &Cli, args: &ExecutionsArgs) -> Outcome {
    let mut conn = connect(cli).await?;
    let filter = ExecutionFilter {
        tenant_id: args.tenant.as_deref(),
        workflow_id: args.workflow,
        statuses: &args.statuses,
        limit: Some(i64::try_from(args.limit).unwrap_or(i64::MAX)),
        after: None,
    };
    let executions = store::list_executions(&mut conn, &filter).await?;
    let shown = executions.len() as u64;
    // Only a full page can hide more executions; count them then.
    let matching = if shown == args.limit {
        store::count_executions(&mut conn, &filter).await?
    } else {
        shown
    };
    let mut ids: Vec<Uuid> = executions.iter().map(|e| e.workflow_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let names = store::workflow_names(&mut conn, &ids).await?;
    let rows: Vec<ExecutionRow> = executions
        .iter()
        .map(|e| ExecutionRow::new(e, &names))
        .collect();
    if cli.json {
        // stdout stays a plain array; the note is for the operator.
        print_json(&rows)?;
        if let Some(showing) = showing_of(shown, matching, "executions") {
            eprintln!("outbox: {showing}");
        }
    } else {
        println!(
            "{:<36}  {:<9}  {:<12}  {:<24}  {:>4}  {:<7}  {:<19}  {:<19}  {:<19}  WAITING IN / ERROR",
            "ID",
            "STATUS",
            "TENANT",
            "WORKFLOW",
            "VER",
            "TRIGGER",
            "CREATED",
            "STARTED",
            "FINISHED"
        );
        for r in &rows {
            let note = match (r.waiting_block, r.error) {
                (Some(block), _) => block,
                (None, Some(error)) => first_line(error),
                (None, None) => "-",
            };
            println!(
                "{:<36}  {:<9}  {:<12}  {:<24}  {:>4}  {:<7}  {:<19}  {:<19}  {:<19}  {note}",
                r.id,
                r.status,
                r.tenant_id,
                r.workflow_name.unwrap_or("-"),
                r.workflow_version,
                r.trigger_kind,
                timestamp(Some(r.created_at)),
                timestamp(r.started_at),
                timestamp(r.finished_at),
            );
        }
        match showing_of(shown, matching, "executions") {
            Some(showing) => println!("{showing}"),
            None => println!("{} execution(s)", rows.len()),
        }
    }
    Ok(ExitStatus::alert_if(rows.is_empty()))
}

/// The outbox row that started `execution`, while it exists (retention
/// deletes `DONE` rows): its trigger event, or the run request of a manual
/// or API run.
async fn started_by(
    conn: &mut AsyncPgConnection,
    execution: &WorkflowExecution,
) -> anyhow::Result<Option<EventSummary>> {
    let requested_key;
    let key = match execution.trigger_event_id {
        Some(id) => EventKey::Id(id),
        None => {
            requested_key = execution_requested_key(execution.id);
            EventKey::DispatchKey(&requested_key)
        }
    };
    Ok(outbox_store::summary(conn, key).await?)
}

/// One block run as `show` prints it.
#[derive(Serialize)]
struct BlockRow<'a> {
    block_id: &'a str,
    block_type: Option<&'a str>,
    sequence: i32,
    status: store::BlockExecutionStatus,
    started_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    duration_ms: Option<i64>,
    output: Option<&'a Value>,
    error: Option<&'a str>,
}

fn duration_ms(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Option<i64> {
    Some((to? - from?).num_milliseconds())
}

fn duration_text(ms: Option<i64>) -> String {
    ms.map_or_else(
        || "-".to_owned(),
        |ms| span(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
    )
}

async fn show(cli: &Cli, id: Uuid) -> Outcome {
    let mut conn = connect(cli).await?;
    let Some(execution) = store::get_execution(&mut conn, id).await? else {
        return Err(Failure {
            status: ExitStatus::Alert,
            error: anyhow!("no workflow execution {id}"),
        });
    };
    let names = store::workflow_names(&mut conn, &[execution.workflow_id]).await?;
    let workflow_name = names.get(&execution.workflow_id).map(String::as_str);
    let types =
        store::block_types(&mut conn, execution.workflow_id, execution.workflow_version).await?;
    let blocks: Vec<WorkflowBlockExecution> = store::block_executions(&mut conn, id).await?;
    let started_by = started_by(&mut conn, &execution)
        .await
        .context("cannot read the outbox event that started the execution")?;
    let block_rows: Vec<BlockRow> = blocks
        .iter()
        .map(|b| BlockRow {
            block_id: &b.block_id,
            block_type: types.get(&b.block_id).map(String::as_str),
            sequence: b.sequence,
            status: b.status,
            started_at: b.started_at,
            finished_at: b.finished_at,
            duration_ms: duration_ms(Some(b.started_at), b.finished_at),
            output: b.output.as_ref(),
            error: b.error.as_deref(),
        })
        .collect();
    let ran_ms = duration_ms(execution.started_at, execution.finished_at);
    if cli.json {
        print_json(&execution_json(
            &execution,
            workflow_name,
            started_by.as_ref(),
            ran_ms,
            &block_rows,
        ))?;
    } else {
        print_execution(&execution, workflow_name, started_by.as_ref(), ran_ms)?;
        print_blocks(&block_rows);
    }
    Ok(ExitStatus::Ok)
}

/// `outbox workflow show --json`: the execution and its block runs.
fn execution_json(
    execution: &WorkflowExecution,
    workflow_name: Option<&str>,
    started_by: Option<&EventSummary>,
    ran_ms: Option<i64>,
    block_rows: &[BlockRow<'_>],
) -> Value {
    json!({
        "execution": {
            "id": execution.id,
            "tenant_id": execution.tenant_id,
            "workflow_id": execution.workflow_id,
            "workflow_name": workflow_name,
            "workflow_version": execution.workflow_version,
            "trigger_kind": execution.trigger_kind,
            "status": execution.status,
            "waiting_block": execution.waiting_block,
            "input": execution.input,
            "output": execution.output,
            "error": execution.error,
            "vars": execution.vars,
            "trigger_event_id": execution.trigger_event_id,
            "started_by": started_by,
            "created_at": execution.created_at,
            "updated_at": execution.updated_at,
            "started_at": execution.started_at,
            "finished_at": execution.finished_at,
            "duration_ms": ran_ms,
        },
        "blocks": block_rows,
    })
}

/// The execution's fields, one per line, as `outbox workflow show` prints
/// them.
fn print_execution(
    execution: &WorkflowExecution,
    workflow_name: Option<&str>,
    started_by: Option<&EventSummary>,
    ran_ms: Option<i64>,
) -> anyhow::Result<()> {
    let time = |t: Option<DateTime<Utc>>| t.map_or("-".to_owned(), |t| t.to_rfc3339());
    let pretty = |v: Option<&Value>| -> anyhow::Result<String> {
        Ok(match v {
            Some(v) => serde_json::to_string_pretty(v)?,
            None => "-".to_owned(),
        })
    };
    println!("id             {}", execution.id);
    println!("tenant         {}", execution.tenant_id);
    println!(
        "workflow       {} ({}), version {}",
        workflow_name.unwrap_or("-"),
        execution.workflow_id,
        execution.workflow_version
    );
    println!("trigger        {}", execution.trigger_kind);
    println!("status         {}", execution.status);
    println!(
        "waiting block  {}",
        execution.waiting_block.as_deref().unwrap_or("-")
    );
    match started_by {
        Some(event) => println!(
            "started by     outbox event {} ({}, {})",
            event.id, event.event_type, event.status
        ),
        None => match execution.trigger_event_id {
            Some(event) => println!("started by     outbox event {event} (row no longer kept)"),
            None => println!("started by     - (no outbox row found)"),
        },
    }
    println!("created        {}", execution.created_at.to_rfc3339());
    println!("started        {}", time(execution.started_at));
    println!(
        "finished       {}{}",
        time(execution.finished_at),
        ran_ms.map_or(String::new(), |ms| format!(
            " (ran {})",
            duration_text(Some(ms))
        ))
    );
    println!("updated        {}", execution.updated_at.to_rfc3339());
    println!(
        "error          {}",
        execution.error.as_deref().unwrap_or("-")
    );
    println!("input\n{}", pretty(Some(&execution.input))?);
    println!("output\n{}", pretty(execution.output.as_ref())?);
    println!("vars\n{}", pretty(Some(&execution.vars))?);
    Ok(())
}

/// The block runs' table (or that none ran yet).
fn print_blocks(block_rows: &[BlockRow<'_>]) {
    if block_rows.is_empty() {
        println!("blocks         (none ran yet)");
        return;
    }
    println!("blocks");
    println!(
        "  {:<24}  {:<14}  {:>3}  {:<7}  {:<19}  {:<19}  {:>8}  OUTPUT / ERROR",
        "BLOCK", "TYPE", "RUN", "STATUS", "STARTED", "FINISHED", "DURATION"
    );
    for b in block_rows {
        let detail = match (b.error, b.output) {
            (Some(error), _) => error.to_owned(),
            (None, Some(output)) => truncated(&output.to_string(), OUTPUT_CELL),
            (None, None) => "-".to_owned(),
        };
        println!(
            "  {:<24}  {:<14}  {:>3}  {:<7}  {:<19}  {:<19}  {:>8}  {detail}",
            b.block_id,
            b.block_type.unwrap_or("-"),
            b.sequence,
            b.status,
            timestamp(Some(b.started_at)),
            timestamp(b.finished_at),
            duration_text(b.duration_ms),
        );
    }
}

/// Stuck executions of one status, as `health` reports them.
#[derive(Serialize)]
struct Stuck {
    status: ExecutionStatus,
    count: u64,
    oldest_id: Option<Uuid>,
    oldest_updated_at: Option<DateTime<Utc>>,
    /// The alert of this status, when any are stuck.
    #[serde(skip)]
    alert: Option<String>,
}

/// The workflow section of `outbox health`.
#[derive(Serialize)]
pub struct WorkflowHealth {
    /// Executions `queued` or `running` unchanged for longer than this are
    /// stuck.
    stuck_after_secs: u64,
    /// One entry for `queued`, one for `running`.
    stuck: Vec<Stuck>,
    /// Executions waiting for input: information, never stuck.
    waiting: u64,
    /// Executions `running` whose holder's lease expired over
    /// [`ORPHAN_ALERT_AFTER`] ago: worker-general's sweep resumes such runs
    /// within seconds, so these say that no sweep runs.
    orphaned: u64,
    /// Why the section alerts; empty when it does not.
    pub alerts: Vec<String>,
    #[serde(skip)]
    stuck_after: Duration,
}

/// How long a run may stay `running` with an expired lease before `health`
/// alerts: many sweeps of worker-general (every 10 s by default) should
/// have resumed it by then.
pub const ORPHAN_ALERT_AFTER: Duration = Duration::from_secs(120);

/// Reads the workflow section of `outbox health`: executions stuck in
/// `queued` or `running` for longer than `stuck_after`, counted by status,
/// with the oldest; each such status is an alert. Runs orphaned for over
/// [`ORPHAN_ALERT_AFTER`] (nobody holds them and no sweep resumed them,
/// judged as the workers' sweep judges them with their lease `run_lease`)
/// are an alert too.
///
/// # Errors
///
/// Postgres failing.
pub async fn health(
    conn: &mut AsyncPgConnection,
    stuck_after: Duration,
    run_lease: Duration,
) -> anyhow::Result<WorkflowHealth> {
    let found = store::stuck_executions(conn, stuck_after).await?;
    let waiting = store::count_executions(
        conn,
        &ExecutionFilter {
            statuses: &[ExecutionStatus::Waiting],
            ..ExecutionFilter::default()
        },
    )
    .await?;
    let stuck: Vec<Stuck> = [ExecutionStatus::Queued, ExecutionStatus::Running]
        .into_iter()
        .map(|status| {
            let of = found.iter().find(|s| s.status == status);
            let count = of.map_or(0, |s| u64::try_from(s.count).unwrap_or(0));
            Stuck {
                status,
                count,
                oldest_id: of.map(|s| s.oldest_id),
                oldest_updated_at: of.map(|s| s.oldest_updated_at),
                alert: of.map(|s| {
                    format!(
                        "{count} execution(s) {status} unchanged for over {}, oldest {}",
                        span(stuck_after),
                        s.oldest_id
                    )
                }),
            }
        })
        .collect();
    let orphaned =
        outbox_workflow_store::sweep::count_orphaned_runs(conn, run_lease, ORPHAN_ALERT_AFTER)
            .await?;
    let orphaned = u64::try_from(orphaned).unwrap_or(0);
    let mut alerts: Vec<String> = stuck.iter().filter_map(|s| s.alert.clone()).collect();
    if orphaned > 0 {
        alerts.push(format!(
            "{orphaned} execution(s) running with nobody holding them for over {}: is worker-general (its workflow sweep) running?",
            span(ORPHAN_ALERT_AFTER)
        ));
    }
    Ok(WorkflowHealth {
        stuck_after_secs: stuck_after.as_secs(),
        stuck,
        waiting,
        orphaned,
        alerts,
        stuck_after,
    })
}

/// The table form of the workflow section of `outbox health`.
pub fn print_health(health: &WorkflowHealth) {
    let now = Utc::now();
    println!(
        "{:<10} {:>6}  {:<36}  {:>13}  ALERTS",
        "WORKFLOW", "STUCK", "OLDEST STUCK", "UNCHANGED FOR"
    );
    for s in &health.stuck {
        let unchanged = s.oldest_updated_at.map_or("-".to_owned(), |at| {
            span((now - at).to_std().unwrap_or_default())
        });
        println!(
            "{:<10} {:>6}  {:<36}  {:>13}  {}",
            s.status.as_str(),
            s.count,
            s.oldest_id.map_or("-".to_owned(), |id| id.to_string()),
            unchanged,
            s.alert.as_deref().unwrap_or("-")
        );
    }
    println!(
        "stuck: queued or running, unchanged for over {}; {} execution(s) waiting for input (never stuck); {} running with nobody holding them for over {}",
        span(health.stuck_after),
        health.waiting,
        health.orphaned,
        span(ORPHAN_ALERT_AFTER)
    );
}
