//! `outbox probe`: a live drain probe of a real deployment.
//!
//! It publishes one `audit.outbox.probe` event through the real publisher
//! (in a transaction, like any application) and watches it go through:
//! **published** (committed), **handed off** (a dispatcher set the row
//! `DONE`), **handled** (the audit subscriber wrote the `audit_log` row of
//! the event). With `--workflow` it also makes sure the tenant has the live
//! workflow `outbox-probe` (manual trigger, then one `log` block), requests a
//! manual run through the producer, and watches **run requested**, **run
//! started** and **run succeeded**.
//!
//! Every stage is printed as it is reached, with the time since the probe
//! began. The probe polls Postgres every 200 ms up to `--timeout`; then it
//! exits 1 and says, for each missing stage, what is missing and the likely
//! cause (no dispatcher, no worker on the queue, …). A run that ends
//! `error` or `rejected`, or an event that goes `FAILED` or `CANCELLED`,
//! fails the probe at once. Unlike the readiness gate (which runs tests),
//! this writes to the environment it probes: one outbox row and one
//! `audit_log` row per probe, and with `--workflow` one execution of the
//! probe workflow, all under the probe tenant.

use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxStatus;
use outbox_model::schema::{audit_log, workflow, workflow_version};
use outbox_publish::{NewOutboxEvent, OutboxTx, publish_outbox_event};
use outbox_queue::queues;
use outbox_store::{DeliveryState as RowState, EventKey};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_model::events::execution_requested_key;
use outbox_workflow_store::producers::{self, RunTrigger};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowExecution, WorkflowStatus};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use uuid::Uuid;

use crate::render::span;
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// The event type of the probe event (routed to `outbox.audit`).
pub const PROBE_EVENT_TYPE: &str = "audit.outbox.probe";
/// The name of the probe workflow, per tenant.
pub const PROBE_WORKFLOW: &str = "outbox-probe";
/// Default of `--tenant`.
const DEFAULT_TENANT: &str = "outbox-probe";
/// Default of `--timeout`.
const DEFAULT_TIMEOUT: &str = "60s";
/// How often the probe looks at Postgres.
const POLL: Duration = Duration::from_millis(200);

/// `outbox probe` arguments.
#[derive(Args)]
pub struct ProbeArgs {
    /// Give up after this long (30s, 2m): exit 1 naming what is missing.
    #[arg(long, default_value = DEFAULT_TIMEOUT, value_parser = crate::filters::parse_duration)]
    timeout: Duration,
    /// The tenant of the probe event (and of the probe workflow).
    #[arg(long, default_value = DEFAULT_TENANT, value_parser = parse_tenant)]
    tenant: String,
    /// Also run the tenant's workflow `outbox-probe` (created or updated when missing or different) and wait for it to succeed.
    #[arg(long)]
    workflow: bool,
}

/// A tenant the publisher accepts: not empty, no NUL.
fn parse_tenant(raw: &str) -> Result<String, String> {
    if raw.is_empty() {
        return Err("the tenant must not be empty".into());
    }
    if raw.contains('\0') {
        return Err("the tenant must not contain a NUL character".into());
    }
    Ok(raw.to_owned())
}

/// The probe workflow: a manual trigger, then a log line naming the probe.
fn probe_definition() -> anyhow::Result<WorkflowDefinition> {
    Ok(WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger", "name": "Probe requested" },
            { "id": "log", "type": "log", "name": "Probe ran",
              "params": { "message": "probe {{ input.probeId }}" } }
        ],
        "edges": [ { "from": "start", "to": "log" } ]
    }))?)
}

/// A point the probe waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Stage {
    /// The probe event is committed.
    Published,
    /// A dispatcher handed it to its queue (row `DONE`).
    HandedOff,
    /// A worker handled it (its `audit_log` row exists).
    Handled,
    /// The run is requested (execution `queued`, request event committed).
    RunRequested,
    /// A worker started the run.
    RunStarted,
    /// The run ended `success`.
    RunSucceeded,
}

impl Stage {
    fn label(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::HandedOff => "handed off",
            Self::Handled => "handled",
            Self::RunRequested => "run requested",
            Self::RunStarted => "run started",
            Self::RunSucceeded => "run succeeded",
        }
    }
}

/// One stage in the report.
#[derive(Serialize)]
struct StageReport {
    stage: Stage,
    reached: bool,
    /// Since the probe began.
    elapsed_ms: Option<u64>,
    #[serde(skip)]
    elapsed: Option<Duration>,
}

/// How the probe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    /// Every stage was reached.
    Ok,
    /// The timeout passed first.
    Timeout,
    /// Something ended badly before the timeout (a failed run, a FAILED row).
    Failed,
}

/// The stages and when each was reached; prints each one as it is reached
/// unless the output is JSON.
struct Progress {
    began: Instant,
    stages: Vec<StageReport>,
    print: bool,
}

impl Progress {
    fn new(began: Instant, workflow: bool, print: bool) -> Self {
        let mut stages = vec![Stage::Published, Stage::HandedOff, Stage::Handled];
        if workflow {
            stages.extend([Stage::RunRequested, Stage::RunStarted, Stage::RunSucceeded]);
        }
        Self {
            began,
            stages: stages
                .into_iter()
                .map(|stage| StageReport {
                    stage,
                    reached: false,
                    elapsed_ms: None,
                    elapsed: None,
                })
                .collect(),
            print,
        }
    }

    /// Marks `stage` reached now, once; prints it with `detail`.
    fn reach(&mut self, stage: Stage, detail: &str) {
        let elapsed = self.began.elapsed();
        let Some(report) = self
            .stages
            .iter_mut()
            .find(|r| r.stage == stage && !r.reached)
        else {
            return;
        };
        report.reached = true;
        report.elapsed = Some(elapsed);
        report.elapsed_ms = Some(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        if self.print {
            println!("{:<14}  {:>9}  {detail}", stage.label(), span(elapsed));
        }
    }

    fn all_reached(&self) -> bool {
        self.stages.iter().all(|r| r.reached)
    }

    fn missing(&self) -> Vec<&'static str> {
        self.stages
            .iter()
            .filter(|r| !r.reached)
            .map(|r| r.stage.label())
            .collect()
    }
}

/// One look at Postgres.
#[derive(Debug, Clone, Default)]
struct Observed {
    /// The probe event's row (`None`: gone).
    event: Option<RowState>,
    /// The audit row of the probe event exists.
    handled: bool,
    /// The probe run.
    execution: Option<WorkflowExecution>,
    /// The row of the run's `workflow.execution.requested` event.
    request: Option<RowState>,
}

/// The ids an operator follows up with.
#[derive(Debug, Clone, Copy)]
struct Ids {
    event: Uuid,
    execution: Option<Uuid>,
}

const NO_DISPATCHER: &str =
    "no dispatcher is running (worker-general with OUTBOX_DISPATCHER_ENABLED=true)";

/// Why a row that should have been handed off by now is not, or `None`
/// when it was (`DONE`). `what` names the row ("the event", "the run
/// request").
fn hand_off_problem(what: &str, row: Option<&RowState>, waited: &str) -> Option<String> {
    let Some(row) = row else {
        return Some(format!("{what} row is gone (deleted while the probe ran?)"));
    };
    match row.status {
        OutboxStatus::Done => None,
        OutboxStatus::Pending if row.retries == 0 => Some(format!(
            "{what} is still PENDING after {waited}: {NO_DISPATCHER}"
        )),
        OutboxStatus::Pending => Some(format!(
            "{what} is still PENDING after {waited}: the dispatcher tried to hand it off {} time(s) and failed (last error: {}); next try at {}: is Redis reachable from worker-general?",
            row.retries,
            row.last_error.as_deref().unwrap_or("-"),
            row.scheduled_at.to_rfc3339(),
        )),
        OutboxStatus::Processing => Some(format!(
            "{what} is still PROCESSING after {waited}: a dispatcher claimed it but has not recorded the hand-off (stuck or killed mid-batch; another takes it over once the lease, OUTBOX_LOCK_TIMEOUT_MS, runs out)"
        )),
        OutboxStatus::Failed => Some(format!(
            "{what} went FAILED: the dispatcher gave up handing it off ({})",
            row.last_error.as_deref().unwrap_or("no error recorded")
        )),
        OutboxStatus::Cancelled => Some(format!("{what} was CANCELLED (by an operator?)")),
    }
}

impl Observed {
    /// A failure that no waiting can mend: the probe event went `FAILED`
    /// or `CANCELLED`, or the run ended `error`, `rejected` or `cancelled`.
    fn failure(&self) -> Option<String> {
        if let Some(event) = &self.event
            && matches!(event.status, OutboxStatus::Failed | OutboxStatus::Cancelled)
        {
            return hand_off_problem("the event", Some(event), "");
        }
        let execution = self.execution.as_ref()?;
        matches!(
            execution.status,
            ExecutionStatus::Error | ExecutionStatus::Rejected | ExecutionStatus::Cancelled
        )
        .then(|| {
            format!(
                "the run ended {}: {}",
                execution.status,
                execution.error.as_deref().unwrap_or("no error recorded")
            )
        })
    }

    /// What is missing once the timeout has passed, and the likely cause of
    /// each; `waited` is the timeout as people read it.
    fn diagnose(&self, ids: Ids, waited: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.handled {
            match hand_off_problem("the event", self.event.as_ref(), waited) {
                Some(problem) => problems.push(problem),
                None => problems.push(format!(
                    "the event was handed off to {} but not handled after {waited}: is a worker consuming {} (worker-general)? See `outbox health` (workers, backlog) and `outbox dead {}`",
                    self.event
                        .as_ref()
                        .and_then(|e| e.target_queue.as_deref())
                        .unwrap_or(queues::AUDIT),
                    queues::AUDIT,
                    queues::AUDIT,
                )),
            }
        }
        let Some(execution_id) = ids.execution else {
            return problems;
        };
        let Some(execution) = &self.execution else {
            problems.push(format!(
                "the run {execution_id} is gone (deleted while the probe ran?)"
            ));
            return problems;
        };
        match execution.status {
            ExecutionStatus::Success
            | ExecutionStatus::Error
            | ExecutionStatus::Rejected
            | ExecutionStatus::Cancelled => {}
            ExecutionStatus::Queued => {
                match hand_off_problem("the run request", self.request.as_ref(), waited) {
                    Some(problem) => {
                        problems.push(format!("the run is still queued: {problem}"));
                    }
                    None => problems.push(format!(
                        "the run is still queued after {waited} although its request was handed off: is worker-general consuming {}? See `outbox health` and `outbox dead {}`",
                        queues::WORKFLOW,
                        queues::WORKFLOW,
                    )),
                }
            }
            ExecutionStatus::Running => problems.push(format!(
                "the run started but has not finished after {waited}: a worker may have died mid-run (its job comes back once the worker counts as stalled); see `outbox workflow show {execution_id}`"
            )),
            ExecutionStatus::Waiting => problems.push(format!(
                "the run waits in block {}, which the probe workflow does not have: was the workflow changed meanwhile? See `outbox workflow show {execution_id}`",
                execution.waiting_block.as_deref().unwrap_or("-")
            )),
        }
        problems
    }
}

/// The probe workflow as found or saved.
#[derive(Debug, Clone, Copy, Serialize)]
struct ProbeWorkflow {
    id: Uuid,
    version: i32,
    /// True when this probe saved it (it was missing or different).
    saved: bool,
}

/// Makes sure `tenant` has the live workflow [`PROBE_WORKFLOW`] with the
/// probe definition as its current version; saves it only when it is
/// missing, not live, or different.
async fn ensure_workflow(
    conn: &mut AsyncPgConnection,
    tenant: &str,
) -> anyhow::Result<ProbeWorkflow> {
    let definition = probe_definition()?;
    let wanted = serde_json::to_value(definition.validate()?)?;
    let current: Option<(Uuid, String, i32)> = workflow::table
        .filter(workflow::tenant_id.eq(tenant))
        .filter(workflow::name.eq(PROBE_WORKFLOW))
        .select((workflow::id, workflow::status, workflow::current_version))
        .get_result(conn)
        .await
        .optional()?;
    if let Some((id, status, version)) = current
        && status == WorkflowStatus::Live.as_str()
    {
        let stored: Option<Value> = workflow_version::table
            .find((id, version))
            .select(workflow_version::definition)
            .get_result(conn)
            .await
            .optional()?;
        if stored.as_ref() == Some(&wanted) {
            return Ok(ProbeWorkflow {
                id,
                version,
                saved: false,
            });
        }
    }
    let saved = store::save_workflow(
        conn,
        tenant,
        PROBE_WORKFLOW,
        WorkflowStatus::Live,
        &definition,
    )
    .await?;
    Ok(ProbeWorkflow {
        id: saved.workflow.id,
        version: saved.version,
        saved: true,
    })
}

/// Looks at the probe's rows once.
async fn observe(conn: &mut AsyncPgConnection, ids: Ids) -> anyhow::Result<Observed> {
    let event = outbox_store::delivery_state(conn, EventKey::Id(ids.event)).await?;
    let handled: bool = diesel::select(diesel::dsl::exists(
        audit_log::table.filter(audit_log::outbox_event_id.eq(ids.event)),
    ))
    .get_result(conn)
    .await?;
    let (execution, request) = match ids.execution {
        None => (None, None),
        Some(id) => {
            let execution = store::get_execution(conn, id).await?;
            let key = execution_requested_key(id);
            let request = outbox_store::delivery_state(conn, EventKey::DispatchKey(&key)).await?;
            (execution, request)
        }
    };
    Ok(Observed {
        event,
        handled,
        execution,
        request,
    })
}

/// Marks the stages `seen` shows as reached.
fn advance(progress: &mut Progress, seen: &Observed) {
    let queue = seen
        .event
        .as_ref()
        .and_then(|e| e.target_queue.clone())
        .unwrap_or_else(|| queues::AUDIT.to_owned());
    // A worker can handle the job before the dispatcher's DONE commits:
    // a handled event was handed off.
    if seen.handled
        || seen
            .event
            .as_ref()
            .is_some_and(|e| e.status == OutboxStatus::Done)
    {
        progress.reach(Stage::HandedOff, &format!("to {queue}"));
    }
    if seen.handled {
        progress.reach(
            Stage::Handled,
            "audit_log row written by the audit subscriber",
        );
    }
    if let Some(execution) = &seen.execution {
        let started = execution.status != ExecutionStatus::Queued || execution.started_at.is_some();
        if started {
            progress.reach(Stage::RunStarted, "picked up by a workflow worker");
        }
        if execution.status == ExecutionStatus::Success {
            progress.reach(Stage::RunSucceeded, "ended success");
        }
    }
}

/// Runs `outbox probe`.
pub async fn run(cli: &Cli, args: &ProbeArgs) -> Outcome {
    let began = Instant::now();
    let mut conn = connect(cli).await?;
    let print = !cli.json;
    let probe_id = Uuid::new_v4();
    if print {
        println!(
            "probe {probe_id}, tenant {}, waiting up to {}",
            args.tenant,
            span(args.timeout)
        );
    }
    let workflow = if args.workflow {
        Some(probe_workflow(&mut conn, &args.tenant, print).await?)
    } else {
        None
    };
    let ids = publish(&mut conn, &args.tenant, probe_id, workflow.as_ref()).await?;

    let mut progress = Progress::new(began, workflow.is_some(), print);
    if print {
        println!("{:<14}  {:>9}  DETAIL", "STAGE", "ELAPSED");
    }
    progress.reach(
        Stage::Published,
        &format!("event {} ({PROBE_EVENT_TYPE})", ids.event),
    );
    if let Some(execution) = ids.execution {
        progress.reach(
            Stage::RunRequested,
            &format!("execution {execution} of workflow {PROBE_WORKFLOW}"),
        );
    }
    let (verdict, problems) = watch(
        &mut conn,
        ids,
        &mut progress,
        began + args.timeout,
        args.timeout,
    )
    .await?;
    let elapsed = began.elapsed();
    if cli.json {
        print_json(&json!({
            "verdict": verdict,
            "tenant": args.tenant,
            "probe_id": probe_id,
            "event_id": ids.event,
            "event_type": PROBE_EVENT_TYPE,
            "workflow": workflow.map(|w| json!({
                "name": PROBE_WORKFLOW,
                "id": w.id,
                "version": w.version,
                "saved": w.saved,
            })),
            "execution_id": ids.execution,
            "timeout_ms": u64::try_from(args.timeout.as_millis()).unwrap_or(u64::MAX),
            "elapsed_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            "stages": progress.stages,
            "problems": problems,
        }))?;
    } else {
        print_outcome(verdict, &problems, &progress, ids, elapsed);
    }
    Ok(ExitStatus::alert_if(verdict != Verdict::Ok))
}

/// The probe workflow, saved when missing or changed; says which.
async fn probe_workflow(
    conn: &mut AsyncPgConnection,
    tenant: &str,
    print: bool,
) -> anyhow::Result<ProbeWorkflow> {
    let found = ensure_workflow(conn, tenant)
        .await
        .context("cannot make sure the probe workflow exists")?;
    if print {
        println!(
            "workflow {PROBE_WORKFLOW} ({}): {} version {}",
            found.id,
            if found.saved {
                "saved as"
            } else {
                "unchanged,"
            },
            found.version
        );
    }
    Ok(found)
}

/// Publishes the probe event, and the run of `workflow` when given, in one
/// transaction.
async fn publish(
    conn: &mut AsyncPgConnection,
    tenant: &str,
    probe_id: Uuid,
    workflow: Option<&ProbeWorkflow>,
) -> anyhow::Result<Ids> {
    let payload = json!({ "probeId": probe_id, "at": Utc::now().to_rfc3339() });
    let input = json!({ "probeId": probe_id });
    let workflow_id = workflow.map(|w| w.id);
    let (event, execution) = conn
        .transaction::<_, anyhow::Error, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let event = NewOutboxEvent::new(tenant, PROBE_EVENT_TYPE, payload);
            let event_id = publish_outbox_event(&tx, event).await?.id();
            let execution_id = match workflow_id {
                Some(id) => Some(
                    producers::request_execution(&mut tx, tenant, id, RunTrigger::Manual, &input)
                        .await?,
                ),
                None => None,
            };
            Ok((event_id, execution_id))
        })
        .await
        .context("cannot publish the probe")?;
    Ok(Ids { event, execution })
}

/// Reads the probe's rows until every stage is reached, one fails, or
/// `deadline` passes: the verdict and the problems found.
async fn watch(
    conn: &mut AsyncPgConnection,
    ids: Ids,
    progress: &mut Progress,
    deadline: Instant,
    timeout: Duration,
) -> anyhow::Result<(Verdict, Vec<String>)> {
    let waited = span(timeout);
    loop {
        let seen = observe(conn, ids)
            .await
            .context("cannot read the probe's rows")?;
        advance(progress, &seen);
        if let Some(failure) = seen.failure() {
            return Ok((Verdict::Failed, vec![failure]));
        }
        if progress.all_reached() {
            return Ok((Verdict::Ok, Vec::new()));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok((Verdict::Timeout, seen.diagnose(ids, &waited)));
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// The text form of the verdict, with the commands to follow up.
fn print_outcome(
    verdict: Verdict,
    problems: &[String],
    progress: &Progress,
    ids: Ids,
    elapsed: Duration,
) {
    let follow_up = match ids.execution {
        Some(execution) => format!(
            "outbox show {}; outbox workflow show {execution}",
            ids.event
        ),
        None => format!("outbox show {}", ids.event),
    };
    if verdict == Verdict::Ok {
        println!("probe passed in {}: {follow_up}", span(elapsed));
        return;
    }
    println!(
        "{:<14}  {:>9}  {}",
        "not reached",
        "-",
        progress.missing().join(", ")
    );
    println!(
        "PROBE FAILED after {} ({}):",
        span(elapsed),
        if verdict == Verdict::Timeout {
            "timed out"
        } else {
            "ended early"
        }
    );
    for problem in problems {
        println!("  - {problem}");
    }
    println!("follow up: {follow_up}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: OutboxStatus, retries: i32, last_error: Option<&str>) -> RowState {
        RowState {
            status,
            retries,
            last_error: last_error.map(str::to_owned),
            target_queue: (status == OutboxStatus::Done).then(|| queues::AUDIT.to_owned()),
            scheduled_at: Utc::now(),
        }
    }

    const IDS: Ids = Ids {
        event: Uuid::nil(),
        execution: None,
    };

    /// The stages `advance` marks as reached for `seen`.
    fn reached(seen: &Observed) -> Vec<Stage> {
        let mut progress = Progress::new(Instant::now(), seen.execution.is_some(), false);
        advance(&mut progress, seen);
        progress
            .stages
            .iter()
            .filter(|s| s.reached)
            .map(|s| s.stage)
            .collect()
    }

    #[test]
    fn a_done_row_or_a_handled_job_each_show_the_hand_off_alone() {
        let done = Observed {
            event: Some(row(OutboxStatus::Done, 0, None)),
            ..Observed::default()
        };
        assert_eq!(reached(&done), [Stage::HandedOff]);
        // The worker can write its row before the dispatcher's DONE commits.
        let handled_first = Observed {
            event: Some(row(OutboxStatus::Processing, 0, None)),
            handled: true,
            ..Observed::default()
        };
        assert_eq!(reached(&handled_first), [Stage::HandedOff, Stage::Handled]);
        let pending = Observed {
            event: Some(row(OutboxStatus::Pending, 0, None)),
            ..Observed::default()
        };
        assert_eq!(reached(&pending), []);
    }

    /// The probe run in `status`, started (`started_at` set) or not.
    fn run(status: ExecutionStatus, started: bool) -> WorkflowExecution {
        let now = Utc::now();
        WorkflowExecution {
            id: Uuid::nil(),
            tenant_id: "acme".to_owned(),
            workflow_id: Uuid::nil(),
            workflow_version: 1,
            trigger_kind: store::TriggerKind::Manual,
            status,
            input: json!({}),
            output: None,
            error: None,
            waiting_block: None,
            vars: json!({}),
            trigger_event_id: None,
            created_at: now,
            updated_at: now,
            started_at: started.then_some(now),
            finished_at: None,
            allow_external_callouts: true,
            lease_owner: None,
            lease_until: None,
        }
    }

    // Break checked: `||` turned into `&&` in `advance` (a mutation run's
    // shard 9 of the CLI) showed a run that a worker rejected in preflight,
    // which never starts a block, as not yet picked up.
    #[test]
    fn a_run_counts_as_picked_up_once_it_left_queued_or_started() {
        let with_run = |execution| Observed {
            execution: Some(execution),
            ..Observed::default()
        };
        let table = [
            (run(ExecutionStatus::Queued, false), vec![]),
            (run(ExecutionStatus::Running, true), vec![Stage::RunStarted]),
            (
                run(ExecutionStatus::Rejected, false),
                vec![Stage::RunStarted],
            ),
            (
                run(ExecutionStatus::Success, true),
                vec![Stage::RunStarted, Stage::RunSucceeded],
            ),
        ];
        for (execution, expected) in table {
            let status = execution.status;
            assert_eq!(reached(&with_run(execution)), expected, "{status:?}");
        }
    }

    #[test]
    fn a_pending_event_never_tried_names_the_missing_dispatcher() {
        let seen = Observed {
            event: Some(row(OutboxStatus::Pending, 0, None)),
            ..Observed::default()
        };
        assert_eq!(seen.failure(), None);
        assert_eq!(
            seen.diagnose(IDS, "1m"),
            [
                "the event is still PENDING after 1m: no dispatcher is running (worker-general with OUTBOX_DISPATCHER_ENABLED=true)"
            ]
        );
    }

    #[test]
    fn a_pending_event_with_failed_hand_offs_points_at_redis() {
        let seen = Observed {
            event: Some(row(OutboxStatus::Pending, 2, Some("connection refused"))),
            ..Observed::default()
        };
        let problems = seen.diagnose(IDS, "1m");
        assert!(
            problems[0].contains("2 time(s)")
                && problems[0].contains("connection refused")
                && problems[0].contains("Redis"),
            "{problems:?}"
        );
    }

    #[test]
    fn handed_off_but_not_handled_asks_for_a_worker_on_the_audit_queue() {
        let seen = Observed {
            event: Some(row(OutboxStatus::Done, 0, None)),
            ..Observed::default()
        };
        let problems = seen.diagnose(IDS, "1m");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("the event was handed off to outbox.audit but not handled")
                && problems[0].contains("is a worker consuming outbox.audit"),
            "{problems:?}"
        );
        let handled = Observed {
            handled: true,
            ..seen
        };
        assert!(handled.diagnose(IDS, "1m").is_empty());
    }

    #[test]
    fn a_failed_event_fails_the_probe_at_once_with_its_error() {
        let seen = Observed {
            event: Some(row(OutboxStatus::Failed, 7, Some("retries exhausted"))),
            ..Observed::default()
        };
        let failure = seen.failure().unwrap_or_default();
        assert!(
            failure.contains("FAILED") && failure.contains("retries exhausted"),
            "{failure}"
        );
    }
}
