//! The demo's verdict: from what was observed at the end (outbox rows,
//! effect rows, Redis jobs, the sinks' mails and calls, workflow
//! executions) and what the demo committed, whether every event was
//! delivered where it should be, once; else exactly what is missing or
//! doubled.
//!
//! Effects this system owns (the hand-off, audit and notification rows,
//! workflow executions) must happen exactly once. Effects on other systems
//! (SMTP, webhooks, plugin calls, a workflow's `httpRequest`) happen at
//! least once: a process killed between the call and recording it calls
//! again with the same `Message-ID` / `webhook-id`. After the demo's SIGKILL
//! of `worker-general`, an effect that process performs (plugin calls,
//! `httpRequest` blocks) seen exactly twice is that documented window and
//! is reported as such; any other repeat fails the verdict.

use std::collections::{BTreeMap, HashMap, HashSet};

use outbox_queue::JobStateKind;
use uuid::Uuid;

/// How the demo set things up: where each effect is expected.
#[derive(Debug, Default)]
pub struct Setup {
    /// Per tenant, the sink paths of its webhook endpoints (every
    /// `webhook.*` event goes to each).
    pub webhook_paths: HashMap<String, Vec<String>>,
    /// Per (tenant, hook), the sink paths of the subscribed plugins.
    pub plugin_paths: HashMap<(String, String), Vec<String>>,
    /// The queues some worker consumes; jobs on the others wait.
    pub subscribed: HashSet<String>,
    /// Whether `worker-general` was killed with SIGKILL during the run.
    pub chaos: bool,
}

/// What the demo committed, and so expects to find.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// Every event the demo committed (ids from the publisher and from the
    /// plain SQL's `RETURNING`), including those below.
    pub committed: HashSet<Uuid>,
    /// The events without a route: they must end `FAILED`.
    pub unroutable: Vec<Uuid>,
    /// The events scheduled for later: they must still be `PENDING`.
    pub scheduled: Vec<Uuid>,
    /// Dispatch keys published more than once: each must be on one row.
    pub repeated_keys: Vec<String>,
    /// Entity rows whose creation triggers the live order workflow.
    pub orders: Vec<Uuid>,
    /// The execution that waited for input and was continued.
    pub approval: Option<Uuid>,
}

/// One outbox row at the end.
#[derive(Debug, Clone)]
pub struct Row {
    /// The event id.
    pub id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Its type.
    pub event_type: String,
    /// `PENDING`, `PROCESSING`, `DONE`, `FAILED` or `CANCELLED`.
    pub status: String,
    /// The queue it was handed to.
    pub target_queue: Option<String>,
    /// Whether its `scheduled_at` has passed.
    pub due: bool,
}

/// One workflow execution at the end.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Its id.
    pub id: Uuid,
    /// The workflow's name.
    pub workflow: String,
    /// Its status.
    pub status: String,
    /// `input.order.id` (runs of the order workflow).
    pub order: Option<Uuid>,
    /// The blocks it ran, in order.
    pub blocks: Vec<String>,
}

/// Everything observed at the end of the run.
#[derive(Debug, Default)]
pub struct Observed {
    /// Every outbox row.
    pub rows: Vec<Row>,
    /// Rows per repeated dispatch key.
    pub key_rows: HashMap<String, usize>,
    /// Rows or orders written by the rolled-back transaction (must be 0).
    pub rolled_back: usize,
    /// The state of each `DONE` row's first-delivery job on its queue.
    pub jobs: HashMap<Uuid, JobStateKind>,
    /// First-delivery job bodies per outbox queue.
    pub queue_jobs: BTreeMap<String, usize>,
    /// `audit_log` rows per event.
    pub audit: HashMap<Uuid, usize>,
    /// `notification` rows per event.
    pub notifications: HashMap<Uuid, usize>,
    /// Mails at the SMTP sink per event (from their `Message-ID`).
    pub mails: HashMap<Uuid, usize>,
    /// Mails whose `Message-ID` names no event.
    pub foreign_mails: usize,
    /// Signed calls at the HTTP sink per (path, `webhook-id`).
    pub calls: HashMap<(String, String), usize>,
    /// Calls whose signature did not verify, described.
    pub bad_signatures: Vec<String>,
    /// Workflow executions.
    pub executions: Vec<Execution>,
    /// Calls of the order workflow's `httpRequest` block per order.
    pub crm_calls: HashMap<Uuid, usize>,
    /// Dead jobs per queue.
    pub dead: BTreeMap<String, u64>,
}

/// The name of the live event-trigger workflow.
pub const ORDER_WORKFLOW: &str = "order follow-up";
/// The name of the workflow that waits for input.
pub const APPROVAL_WORKFLOW: &str = "refund approval";

/// The outcome.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Effects checked, by kind, and how many were as expected.
    pub checked: BTreeMap<&'static str, usize>,
    /// What is missing, doubled, stuck or unexpected; empty means passed.
    pub problems: Vec<String>,
    /// Repeats inside the documented at-least-once window.
    pub windows: Vec<String>,
}

impl Verdict {
    /// True when nothing is missing, doubled or unexpected.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    fn ok(&mut self, kind: &'static str) {
        *self.checked.entry(kind).or_default() += 1;
    }

    /// An effect expected once: missing, once, doubled, or (when
    /// `window`) seen twice inside the at-least-once window.
    fn once(
        &mut self,
        kind: &'static str,
        what: impl FnOnce() -> String,
        seen: usize,
        window: bool,
    ) {
        match seen {
            1 => self.ok(kind),
            0 => self.problems.push(format!("missing: {}", what())),
            2 if window => {
                self.ok(kind);
                self.windows.push(format!(
                    "{} seen twice (same id): the at-least-once window of the SIGKILL",
                    what()
                ));
            }
            n => self
                .problems
                .push(format!("doubled: {} seen {n} times", what())),
        }
    }
}

/// Judges `seen` against `setup` and `ledger`.
pub fn judge(setup: &Setup, ledger: &Ledger, seen: &Observed) -> Verdict {
    let mut v = Verdict::default();
    judge_commits(ledger, seen, &mut v);
    let expected = judge_rows(setup, ledger, seen, &mut v);
    judge_queues(seen, &expected.handed, &mut v);
    judge_sinks(seen, &expected, &mut v);
    for (queue, dead) in &seen.dead {
        if *dead > 0 {
            v.problems.push(format!("dead: {dead} job(s) on {queue}"));
        }
    }
    judge_workflows(setup, ledger, seen, &mut v);
    v
}

/// What the rows lead to expect elsewhere: mails, calls, and the events
/// handed off per queue.
#[derive(Default)]
struct Expected<'a> {
    mails: HashSet<Uuid>,
    calls: HashSet<(String, String)>,
    handed: BTreeMap<&'a str, usize>,
}

/// Every committed event has a row, the rolled-back transaction has none,
/// and a repeated dispatch key made one row.
fn judge_commits(ledger: &Ledger, seen: &Observed, v: &mut Verdict) {
    let rows: HashSet<Uuid> = seen.rows.iter().map(|r| r.id).collect();
    let mut missing_rows: Vec<&Uuid> = ledger
        .committed
        .iter()
        .filter(|id| !rows.contains(id))
        .collect();
    missing_rows.sort();
    for id in missing_rows {
        v.problems
            .push(format!("missing: event {id} was committed but has no row"));
    }
    if seen.rolled_back > 0 {
        v.problems.push(format!(
            "present: {} row(s) of the rolled-back transaction",
            seen.rolled_back
        ));
    } else {
        v.ok("rolled-back transaction absent");
    }
    for key in &ledger.repeated_keys {
        let n = seen.key_rows.get(key).copied().unwrap_or(0);
        v.once(
            "dispatch key on one row",
            || format!("a row with dispatch key {key}"),
            n,
            false,
        );
    }
}

/// Each row: its status, its job, and the effects of its queue.
fn judge_rows<'a>(
    setup: &Setup,
    ledger: &Ledger,
    seen: &'a Observed,
    v: &mut Verdict,
) -> Expected<'a> {
    let unroutable: HashSet<&Uuid> = ledger.unroutable.iter().collect();
    let scheduled: HashSet<&Uuid> = ledger.scheduled.iter().collect();
    let mut expected = Expected::default();
    for row in &seen.rows {
        let Some(queue) = judge_status(ledger, &unroutable, &scheduled, row, v) else {
            continue;
        };
        *expected.handed.entry(queue).or_default() += 1;
        judge_job(setup, seen, row, queue, v);
        judge_effects(setup, seen, row, queue, &mut expected, v);
    }
    expected
}

/// The status of `row`: the queue it was handed off to when it is `DONE`
/// as it should be, `None` when there is nothing more to check.
fn judge_status<'a>(
    ledger: &Ledger,
    unroutable: &HashSet<&Uuid>,
    scheduled: &HashSet<&Uuid>,
    row: &'a Row,
    v: &mut Verdict,
) -> Option<&'a str> {
    let what = || format!("event {} ({})", row.id, row.event_type);
    if unroutable.contains(&row.id) {
        if row.status == "FAILED" {
            v.ok("unroutable event FAILED");
        } else {
            v.problems.push(format!(
                "{} has no route but is {}, not FAILED",
                what(),
                row.status
            ));
        }
        return None;
    }
    if row.status == "PENDING" && !row.due {
        if scheduled.contains(&row.id) || !ledger.committed.contains(&row.id) {
            v.ok("scheduled event waits");
        } else {
            v.problems
                .push(format!("{} is scheduled for later, unexpectedly", what()));
        }
        return None;
    }
    if scheduled.contains(&row.id) {
        v.problems.push(format!(
            "{} was scheduled for later but is {}",
            what(),
            row.status
        ));
        return None;
    }
    if row.status != "DONE" {
        v.problems
            .push(format!("stuck: {} is {}", what(), row.status));
        return None;
    }
    let queue = row.target_queue.as_deref();
    if queue.is_none() {
        v.problems
            .push(format!("{} is DONE without a target queue", what()));
    }
    queue
}

/// The job of a row handed off to `queue`: done when a worker consumes
/// the queue, waiting when none does.
fn judge_job(setup: &Setup, seen: &Observed, row: &Row, queue: &str, v: &mut Verdict) {
    let subscribed = setup.subscribed.contains(queue);
    match (seen.jobs.get(&row.id), subscribed) {
        (Some(JobStateKind::Done), true) | (Some(JobStateKind::Waiting), false) => {
            v.ok("handed off once");
        }
        (state, _) => v.problems.push(format!(
            "event {} ({}): its job on {queue} is {}",
            row.id,
            row.event_type,
            match state {
                None | Some(JobStateKind::Missing) => "missing",
                Some(JobStateKind::Waiting) => "still waiting",
                Some(JobStateKind::Done) => "done although no worker consumes the queue",
                Some(JobStateKind::Dead) => "dead",
            }
        )),
    }
}

/// The effect a row handed off to `queue` should have had, once.
fn judge_effects(
    setup: &Setup,
    seen: &Observed,
    row: &Row,
    queue: &str,
    expected: &mut Expected<'_>,
    v: &mut Verdict,
) {
    let what = || format!("event {} ({})", row.id, row.event_type);
    match queue {
        "outbox.audit" => {
            let n = seen.audit.get(&row.id).copied().unwrap_or(0);
            v.once("audit row", || format!("audit row of {}", what()), n, false);
        }
        "outbox.notification" => {
            let n = seen.notifications.get(&row.id).copied().unwrap_or(0);
            v.once(
                "notification row",
                || format!("notification of {}", what()),
                n,
                false,
            );
        }
        // Sent by worker-mail, which is never killed: no window.
        "outbox.mail" | "outbox.marketing" => {
            expected.mails.insert(row.id);
            let n = seen.mails.get(&row.id).copied().unwrap_or(0);
            v.once("mail", || format!("mail of {}", what()), n, false);
        }
        "outbox.webhook" => {
            for path in setup.webhook_paths.get(&row.tenant).into_iter().flatten() {
                let key = (path.clone(), row.id.to_string());
                let n = seen.calls.get(&key).copied().unwrap_or(0);
                v.once(
                    "webhook call",
                    || format!("webhook {path} of {}", what()),
                    n,
                    false,
                );
                expected.calls.insert(key);
            }
        }
        // Fanned out and called by worker-general: the killed process.
        "outbox.plugin-hook" => {
            let hook = row.event_type.trim_start_matches("plugin.hook.").to_owned();
            let paths = setup.plugin_paths.get(&(row.tenant.clone(), hook));
            for path in paths.into_iter().flatten() {
                let key = (path.clone(), row.id.to_string());
                let n = seen.calls.get(&key).copied().unwrap_or(0);
                v.once(
                    "plugin call",
                    || format!("plugin call {path} of {}", what()),
                    n,
                    setup.chaos,
                );
                expected.calls.insert(key);
            }
        }
        _ => {}
    }
}

/// No queue holds more jobs than events were handed off to it.
fn judge_queues(seen: &Observed, handed: &BTreeMap<&str, usize>, v: &mut Verdict) {
    for (queue, jobs) in &seen.queue_jobs {
        let rows = handed.get(queue.as_str()).copied().unwrap_or(0);
        if *jobs > rows {
            v.problems.push(format!(
                "doubled: {queue} holds {jobs} jobs for {rows} handed-off events"
            ));
        }
    }
}

/// The sinks received nothing unexpected, and every call was signed.
fn judge_sinks(seen: &Observed, expected: &Expected<'_>, v: &mut Verdict) {
    for (id, n) in &seen.mails {
        if !expected.mails.contains(id) {
            v.problems.push(format!(
                "unexpected: {n} mail(s) for event {id}, which should send none"
            ));
        }
    }
    if seen.foreign_mails > 0 {
        v.problems.push(format!(
            "unexpected: {} mail(s) without the Message-ID of an event",
            seen.foreign_mails
        ));
    }
    let mut unexpected: Vec<_> = seen
        .calls
        .keys()
        .filter(|key| !expected.calls.contains(*key) && !key.0.starts_with(CRM_PATH))
        .collect();
    unexpected.sort();
    for (path, id) in unexpected {
        v.problems
            .push(format!("unexpected: a call to {path} with webhook-id {id}"));
    }
    for bad in &seen.bad_signatures {
        v.problems.push(format!("bad signature: {bad}"));
    }
    let signed: usize = seen.calls.values().sum();
    if seen.bad_signatures.is_empty() && signed > 0 {
        *v.checked.entry("signature verified").or_default() += signed;
    }
}

/// The path of the order workflow's `httpRequest` block at the HTTP sink.
pub const CRM_PATH: &str = "/crm/orders";

fn judge_workflows(setup: &Setup, ledger: &Ledger, seen: &Observed, v: &mut Verdict) {
    for order in &ledger.orders {
        let runs: Vec<&Execution> = seen
            .executions
            .iter()
            .filter(|e| e.workflow == ORDER_WORKFLOW && e.order == Some(*order))
            .collect();
        v.once(
            "workflow run",
            || format!("run of {ORDER_WORKFLOW:?} for order {order}"),
            runs.len(),
            false,
        );
        let n = seen.crm_calls.get(order).copied().unwrap_or(0);
        // The httpRequest block runs in worker-general, the killed process.
        v.once(
            "workflow httpRequest",
            || format!("CRM call for order {order}"),
            n,
            setup.chaos,
        );
    }
    let orders: HashSet<&Uuid> = ledger.orders.iter().collect();
    for (order, _) in seen.crm_calls.iter().filter(|(o, _)| !orders.contains(o)) {
        v.problems.push(format!(
            "unexpected: a CRM call for order {order}, which the demo never created"
        ));
    }
    match ledger.approval.and_then(|id| seen.executions.iter().find(|e| e.id == id)) {
        Some(run) if run.status == "success" && run.blocks.iter().any(|b| b == "approved") => {
            v.ok("waiting workflow continued");
        }
        Some(run) => v.problems.push(format!(
            "the waiting run {} of {APPROVAL_WORKFLOW:?} is {} after blocks {:?}, not continued to success",
            run.id, run.status, run.blocks
        )),
        None if ledger.approval.is_some() => v
            .problems
            .push(format!("missing: the run of {APPROVAL_WORKFLOW:?}")),
        None => {}
    }
    for run in &seen.executions {
        if run.status != "success" {
            v.problems.push(format!(
                "workflow run {} of {:?} ended {}",
                run.id, run.workflow, run.status
            ));
        }
    }
}

#[cfg(test)]
mod tests;
