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
    let rows: HashMap<Uuid, &Row> = seen.rows.iter().map(|r| (r.id, r)).collect();
    let mut missing_rows: Vec<&Uuid> = ledger
        .committed
        .iter()
        .filter(|id| !rows.contains_key(id))
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

    let unroutable: HashSet<&Uuid> = ledger.unroutable.iter().collect();
    let scheduled: HashSet<&Uuid> = ledger.scheduled.iter().collect();
    let mut expected_mails: HashSet<Uuid> = HashSet::new();
    let mut expected_calls: HashSet<(String, String)> = HashSet::new();
    let mut handed: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &seen.rows {
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
            continue;
        }
        if row.status == "PENDING" && !row.due {
            if scheduled.contains(&row.id) || !ledger.committed.contains(&row.id) {
                v.ok("scheduled event waits");
            } else {
                v.problems
                    .push(format!("{} is scheduled for later, unexpectedly", what()));
            }
            continue;
        }
        if scheduled.contains(&row.id) {
            v.problems.push(format!(
                "{} was scheduled for later but is {}",
                what(),
                row.status
            ));
            continue;
        }
        if row.status != "DONE" {
            v.problems
                .push(format!("stuck: {} is {}", what(), row.status));
            continue;
        }
        let Some(queue) = row.target_queue.as_deref() else {
            v.problems
                .push(format!("{} is DONE without a target queue", what()));
            continue;
        };
        *handed.entry(queue).or_default() += 1;
        let subscribed = setup.subscribed.contains(queue);
        match (seen.jobs.get(&row.id), subscribed) {
            (Some(JobStateKind::Done), true) | (Some(JobStateKind::Waiting), false) => {
                v.ok("handed off once");
            }
            (state, _) => v.problems.push(format!(
                "{}: its job on {queue} is {}",
                what(),
                match state {
                    None | Some(JobStateKind::Missing) => "missing",
                    Some(JobStateKind::Waiting) => "still waiting",
                    Some(JobStateKind::Done) => "done although no worker consumes the queue",
                    Some(JobStateKind::Dead) => "dead",
                }
            )),
        }
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
                expected_mails.insert(row.id);
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
                    expected_calls.insert(key);
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
                    expected_calls.insert(key);
                }
            }
            _ => {}
        }
    }
    for (queue, jobs) in &seen.queue_jobs {
        let rows = handed.get(queue.as_str()).copied().unwrap_or(0);
        if *jobs > rows {
            v.problems.push(format!(
                "doubled: {queue} holds {jobs} jobs for {rows} handed-off events"
            ));
        }
    }
    for (id, n) in &seen.mails {
        if !expected_mails.contains(id) {
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
        .filter(|key| !expected_calls.contains(*key) && !key.0.starts_with(CRM_PATH))
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
    for (queue, dead) in &seen.dead {
        if *dead > 0 {
            v.problems.push(format!("dead: {dead} job(s) on {queue}"));
        }
    }
    judge_workflows(setup, ledger, seen, &mut v);
    v
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A small run where every effect happened once.
    struct Case {
        setup: Setup,
        ledger: Ledger,
        seen: Observed,
        ids: HashMap<&'static str, Uuid>,
    }

    fn row(id: Uuid, event_type: &str, status: &str, queue: Option<&str>, due: bool) -> Row {
        Row {
            id,
            tenant: "acme".into(),
            event_type: event_type.into(),
            status: status.into(),
            target_queue: queue.map(Into::into),
            due,
        }
    }

    fn complete() -> Case {
        let names = [
            "mail", "webhook", "audit", "note", "plugin", "search", "legacy", "later", "trigger",
        ];
        let ids: HashMap<&'static str, Uuid> = names.iter().map(|n| (*n, Uuid::new_v4())).collect();
        let order = Uuid::new_v4();
        let approval = Uuid::new_v4();
        let mut setup = Setup::default();
        setup
            .webhook_paths
            .insert("acme".into(), vec!["/acme/webhooks".into()]);
        setup.plugin_paths.insert(
            ("acme".into(), "order.shipped".into()),
            vec!["/plugins/erp".into()],
        );
        for q in [
            "outbox.mail",
            "outbox.webhook",
            "outbox.audit",
            "outbox.notification",
            "outbox.plugin-hook",
            "outbox.workflow",
        ] {
            setup.subscribed.insert(q.into());
        }
        let ledger = Ledger {
            committed: ids.values().copied().collect(),
            unroutable: vec![ids["legacy"]],
            scheduled: vec![ids["later"]],
            repeated_keys: vec!["stripe:evt_1".into()],
            orders: vec![order],
            approval: Some(approval),
        };
        let done = [
            ("mail", "mail.order.confirmation", "outbox.mail"),
            ("webhook", "webhook.order.created", "outbox.webhook"),
            ("audit", "audit.order.created", "outbox.audit"),
            (
                "note",
                "billing.subscription.updated",
                "outbox.notification",
            ),
            ("plugin", "plugin.hook.order.shipped", "outbox.plugin-hook"),
            (
                "search",
                "search.index.product.updated",
                "outbox.search-index",
            ),
            ("trigger", "workflow.trigger.event", "outbox.workflow"),
        ];
        let mut seen = Observed::default();
        for (name, event_type, queue) in done {
            let id = ids[name];
            seen.rows
                .push(row(id, event_type, "DONE", Some(queue), true));
            let state = if queue == "outbox.search-index" {
                JobStateKind::Waiting
            } else {
                JobStateKind::Done
            };
            seen.jobs.insert(id, state);
            seen.queue_jobs.insert(queue.into(), 1);
        }
        seen.rows.push(row(
            ids["legacy"],
            "legacy.report.generated",
            "FAILED",
            None,
            true,
        ));
        seen.rows.push(row(
            ids["later"],
            "mail.order.review-reminder",
            "PENDING",
            None,
            false,
        ));
        seen.key_rows.insert("stripe:evt_1".into(), 1);
        seen.mails.insert(ids["mail"], 1);
        seen.audit.insert(ids["audit"], 1);
        seen.notifications.insert(ids["note"], 1);
        seen.calls
            .insert(("/acme/webhooks".into(), ids["webhook"].to_string()), 1);
        seen.calls
            .insert(("/plugins/erp".into(), ids["plugin"].to_string()), 1);
        seen.crm_calls.insert(order, 1);
        seen.executions.push(Execution {
            id: Uuid::new_v4(),
            workflow: ORDER_WORKFLOW.into(),
            status: "success".into(),
            order: Some(order),
            blocks: vec!["created".into(), "crm".into()],
        });
        seen.executions.push(Execution {
            id: approval,
            workflow: APPROVAL_WORKFLOW.into(),
            status: "success".into(),
            order: None,
            blocks: vec![
                "start".into(),
                "ask".into(),
                "ask".into(),
                "approved".into(),
            ],
        });
        Case {
            setup,
            ledger,
            seen,
            ids,
        }
    }

    type Change = fn(&mut Case);

    #[test]
    fn the_verdict_fails_on_whatever_is_missing_doubled_or_stuck_and_only_then() {
        let cases: Vec<(&str, Change, bool, usize)> = vec![
            ("everything once", |_| {}, true, 0),
            (
                "a mail missing",
                |c| {
                    c.seen.mails.clear();
                },
                false,
                0,
            ),
            (
                "a mail doubled",
                |c| {
                    c.seen.mails.insert(c.ids["mail"], 2);
                },
                false,
                0,
            ),
            (
                "a mail doubled after the kill (worker-mail was not killed)",
                |c| {
                    c.setup.chaos = true;
                    c.seen.mails.insert(c.ids["mail"], 2);
                },
                false,
                0,
            ),
            (
                "an audit row doubled",
                |c| {
                    c.seen.audit.insert(c.ids["audit"], 2);
                },
                false,
                0,
            ),
            (
                "a notification missing",
                |c| {
                    c.seen.notifications.clear();
                },
                false,
                0,
            ),
            (
                "a webhook call missing",
                |c| {
                    c.seen
                        .calls
                        .remove(&("/acme/webhooks".into(), c.ids["webhook"].to_string()));
                },
                false,
                0,
            ),
            (
                "a plugin call twice without a kill",
                |c| {
                    c.seen
                        .calls
                        .insert(("/plugins/erp".into(), c.ids["plugin"].to_string()), 2);
                },
                false,
                0,
            ),
            (
                "a plugin call twice after the kill",
                |c| {
                    c.setup.chaos = true;
                    c.seen
                        .calls
                        .insert(("/plugins/erp".into(), c.ids["plugin"].to_string()), 2);
                },
                true,
                1,
            ),
            (
                "a plugin call three times after the kill",
                |c| {
                    c.setup.chaos = true;
                    c.seen
                        .calls
                        .insert(("/plugins/erp".into(), c.ids["plugin"].to_string()), 3);
                },
                false,
                0,
            ),
            (
                "a CRM call twice after the kill",
                |c| {
                    c.setup.chaos = true;
                    let order = c.ledger.orders[0];
                    c.seen.crm_calls.insert(order, 2);
                },
                true,
                1,
            ),
            (
                "a call nobody expects",
                |c| {
                    c.seen
                        .calls
                        .insert(("/acme/webhooks".into(), Uuid::new_v4().to_string()), 1);
                },
                false,
                0,
            ),
            (
                "a bad signature",
                |c| {
                    c.seen.bad_signatures.push("POST /acme/webhooks".into());
                },
                false,
                0,
            ),
            (
                "a committed event without its row",
                |c| {
                    c.ledger.committed.insert(Uuid::new_v4());
                },
                false,
                0,
            ),
            (
                "the rolled-back transaction present",
                |c| {
                    c.seen.rolled_back = 1;
                },
                false,
                0,
            ),
            (
                "a repeated dispatch key on two rows",
                |c| {
                    c.seen.key_rows.insert("stripe:evt_1".into(), 2);
                },
                false,
                0,
            ),
            (
                "the unroutable event DONE",
                |c| {
                    c.seen
                        .rows
                        .iter_mut()
                        .find(|r| r.id == c.ids["legacy"])
                        .unwrap()
                        .status = "DONE".into();
                },
                false,
                0,
            ),
            (
                "the scheduled event dispatched early",
                |c| {
                    let r = c
                        .seen
                        .rows
                        .iter_mut()
                        .find(|r| r.id == c.ids["later"])
                        .unwrap();
                    r.status = "DONE".into();
                    r.due = true;
                },
                false,
                0,
            ),
            (
                "an event stuck PROCESSING",
                |c| {
                    c.seen
                        .rows
                        .iter_mut()
                        .find(|r| r.id == c.ids["audit"])
                        .unwrap()
                        .status = "PROCESSING".into();
                },
                false,
                0,
            ),
            (
                "a handed-off job missing from Redis",
                |c| {
                    c.seen.jobs.remove(&c.ids["mail"]);
                },
                false,
                0,
            ),
            (
                "two jobs for one handed-off event",
                |c| {
                    c.seen.queue_jobs.insert("outbox.audit".into(), 2);
                },
                false,
                0,
            ),
            (
                "a dead job",
                |c| {
                    c.seen.dead.insert("outbox.webhook".into(), 1);
                },
                false,
                0,
            ),
            (
                "the order workflow run twice",
                |c| {
                    let again = c.seen.executions[0].clone();
                    c.seen.executions.push(Execution {
                        id: Uuid::new_v4(),
                        ..again
                    });
                },
                false,
                0,
            ),
            (
                "the waiting run never continued",
                |c| {
                    let run = c
                        .seen
                        .executions
                        .iter_mut()
                        .find(|e| e.workflow == APPROVAL_WORKFLOW)
                        .unwrap();
                    run.status = "waiting".into();
                    run.blocks.pop();
                },
                false,
                0,
            ),
        ];
        for (name, change, passes, windows) in cases {
            let mut case = complete();
            change(&mut case);
            let verdict = judge(&case.setup, &case.ledger, &case.seen);
            assert_eq!(verdict.passed(), passes, "{name}: {:?}", verdict.problems);
            assert_eq!(
                verdict.windows.len(),
                windows,
                "{name}: {:?}",
                verdict.windows
            );
        }
    }

    #[test]
    fn a_complete_run_counts_each_kind_of_effect() {
        let case = complete();
        let verdict = judge(&case.setup, &case.ledger, &case.seen);
        assert_eq!(verdict.checked["mail"], 1);
        assert_eq!(verdict.checked["plugin call"], 1);
        assert_eq!(verdict.checked["handed off once"], 7);
        assert_eq!(verdict.checked["unroutable event FAILED"], 1);
    }
}
