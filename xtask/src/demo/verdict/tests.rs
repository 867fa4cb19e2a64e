//! Table tests of the verdict: a small complete run, and one change per
//! case that must (or must not) fail it.

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
