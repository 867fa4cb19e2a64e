//! The workflow path end to end, with the real binaries: application row
//! mutations and run requests go through the outbox, the dispatcher and the
//! `outbox.workflow` subscriber of worker-general; mails go out through
//! worker-mail, calls reach an HTTP sink, and the terminal hooks reach the
//! subscribed plugins through `toolctrl.plugin-invoke`.
//!
//! The database server comes from `WORKFLOW_TRIGGER_E2E_DATABASE_URL`, then
//! `OUTBOX_E2E_DATABASE_URL`, then the suite's usual server; each test gets
//! its own database there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod workflow_support;

use std::collections::HashMap;

use common::{GENERAL, MAIL, Stack};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use outbox_model::OutboxEvent;
use outbox_model::schema::outbox_event;
use outbox_publish::OutboxTx;
use outbox_queue::{OutboxJob, RedisSettings, push_raw, queues};
use outbox_worker::{Group, WorkerConfig, handler_group};
use outbox_workflow_store::producers::{self, EventContext, ProducerError};
use outbox_workflow_store::{ExecutionStatus, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;
use workflow_support::{
    WAIT, block_rows, continue_run, execution, request_run, save, settled_subjects, stack,
    successes, wait_status,
};

/// Subscribes the plugin `plugin` of `acme` to `hook` at the sink's `path`.
async fn subscribe(stack: &Stack, plugin: &str, hook: &str, path: &str) {
    stack
        .sql(&format!(
            "INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret)
             VALUES ('acme', '{plugin}', '{hook}', '{}', 'k')",
            stack.http.url_for(path)
        ))
        .await;
}

/// Creates an `acme` row of `entity` as the application would, on a request.
async fn create_row(stack: &Stack, entity: &str, data: Value) -> Uuid {
    let mut conn = stack.db.conn().await;
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        let context = EventContext::Request {
            actor: Some("user-1".into()),
        };
        producers::create_row(&mut tx, "acme", entity, &data, &context).await
    })
    .await
    .unwrap()
    .row
    .id
}

/// eventTrigger(order created) → if total > 100 → email → httpRequest →
/// rowUpdate.
fn order_workflow(crm: &str) -> Value {
    json!({
        "blocks": [
            { "id": "created", "type": "eventTrigger",
              "params": { "entity": "order", "event": "row.created" } },
            { "id": "big", "type": "if", "params": { "condition":
                { "left": { "var": "input.order.total" }, "op": "gt", "right": 100 } } },
            { "id": "thank", "type": "email", "params": {
                "to": ["{{ input.order.email }}"],
                "subject": "Thank you for order {{ input.order.id }}",
                "text": "We received your order of {{ input.order.total }} EUR." } },
            { "id": "crm", "type": "httpRequest", "params": {
                "method": "POST", "url": crm,
                "body": { "var": "input.order" }, "timeoutMs": 5000 } },
            { "id": "mark", "type": "rowUpdate", "params": {
                "entity": "order", "id": { "var": "input.order.id" },
                "patch": { "crmStatus": { "var": "blocks.crm.output.status" } } } }
        ],
        "edges": [
            { "from": "created", "to": "big" },
            { "from": "big", "to": "thank", "label": "true" },
            { "from": "thank", "to": "crm" },
            { "from": "crm", "to": "mark" }
        ]
    })
}

/// `outbox.workflow` is consumed by the general group: its handler group,
/// built from the configuration as the binary builds it, has the queue (the
/// mail group's has not), and worker-general lists it among its queues when
/// it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_general_group_starts_the_workflow_subscriber_and_the_mail_group_does_not() {
    let stack = stack().await;
    let env: HashMap<String, String> = stack.env().into_iter().collect();
    let redis = stack.redis.conn().await;
    for (group, consumes) in [(Group::General, true), (Group::Mail, false)] {
        let config = WorkerConfig::from_lookup(group, &|name| env.get(name).cloned()).unwrap();
        let handlers =
            handler_group(group, &config, stack.db.pool(), &redis, &stack.namespace).unwrap();
        assert_eq!(
            handlers.queues().contains(&queues::WORKFLOW),
            consumes,
            "{}: {:?}",
            group.as_str(),
            handlers.queues()
        );
    }
    let general = stack.start(GENERAL, &[]).await;
    let started = general.wait_line("worker started").await;
    assert!(started.contains(queues::WORKFLOW), "{started}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_order_runs_its_live_workflow_once_even_when_its_job_is_redelivered() {
    let stack = stack().await;
    save(
        &stack,
        "big orders",
        WorkflowStatus::Live,
        order_workflow(&stack.http.url_for("/crm")),
    )
    .await;
    subscribe(&stack, "slack", "workflow.executed", "/executed").await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;

    let order = create_row(
        &stack,
        "order",
        json!({ "total": 150, "email": "ada@example.com" }),
    )
    .await;

    let mails = stack.smtp.wait_for_messages(1, WAIT).await;
    assert_eq!(mails[0].to, vec!["ada@example.com"]);
    let subject = format!("Thank you for order {order}");
    assert_eq!(
        mails[0].header("subject").as_deref(),
        Some(subject.as_str())
    );
    assert!(
        mails[0].data.contains("order of 150 EUR"),
        "{}",
        mails[0].data
    );
    let crm = stack.http.wait_for_requests("/crm", 1, WAIT).await;
    assert_eq!(crm[0].json()["total"], 150);
    assert_eq!(crm[0].json()["id"], order.to_string());

    // The terminal hook reaches the subscribed plugin.
    let hooks = stack.http.wait_for_requests("/executed", 1, WAIT).await;
    let hook = hooks[0].json();
    assert_eq!(hook["hook"], "workflow.executed");
    assert_eq!(hook["data"]["status"], "success");
    let execution_id: Uuid = hook["data"]["executionId"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let run = execution(&stack, execution_id).await;
    assert_eq!(run.status, ExecutionStatus::Success);
    assert_eq!(
        block_rows(&stack, execution_id).await,
        successes(&["created", "big", "thank", "crm", "mark"])
    );
    stack
        .wait_count(
            &format!(
                "SELECT count(*) FROM entity_row WHERE id = '{order}' AND data->>'crmStatus' = '200'"
            ),
            1,
        )
        .await;

    // Redeliver the trigger job: the same envelope under another id, a
    // redelivery the queue cannot recognise.
    let trigger = {
        let mut conn = stack.db.conn().await;
        outbox_event::table
            .filter(outbox_event::event_type.eq("workflow.trigger.event"))
            .filter(outbox_event::id.eq(run.trigger_event_id.unwrap()))
            .select(OutboxEvent::as_select())
            .first(&mut conn)
            .await
            .unwrap()
    };
    let all = [
        queues::WORKFLOW,
        queues::MAIL,
        queues::TOOLCTRL_EMAIL,
        queues::PLUGIN_HOOK,
        queues::TOOLCTRL_PLUGIN_INVOKE,
    ];
    stack.wait_idle(&all).await;
    let workflow_jobs = stack.stats(queues::WORKFLOW).await.done;
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let job = OutboxJob::from_event(&trigger);
    push_raw(
        &mut redis,
        &stack.namespace,
        queues::WORKFLOW,
        &[(
            "trigger-redelivery".into(),
            serde_json::to_vec(&job).unwrap(),
        )],
    )
    .await
    .unwrap();
    stack.wait_done(queues::WORKFLOW, workflow_jobs + 1).await;
    stack.wait_idle(&all).await;

    // Nothing changed: one execution, one mail, one call, one hook.
    stack
        .wait_count("SELECT count(*) FROM workflow_execution", 1)
        .await;
    assert_eq!(stack.smtp.messages().len(), 1);
    assert_eq!(stack.http.requests_to("/crm").len(), 1);
    assert_eq!(stack.http.requests_to("/executed").len(), 1);
    assert_eq!(
        block_rows(&stack, execution_id).await,
        successes(&["created", "big", "thank", "crm", "mark"])
    );
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE event_type = 'plugin.hook.workflow.executed'",
            1,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_rejected_runs_reach_the_plugins_subscribed_to_workflow_failed() {
    let stack = stack().await;
    // A live workflow with a block the native runner cannot run: the
    // preflight rejects the run before its first block.
    save(
        &stack,
        "scripted",
        WorkflowStatus::Live,
        json!({
            "blocks": [
                { "id": "created", "type": "eventTrigger",
                  "params": { "entity": "ticket", "event": "row.created" } },
                { "id": "note", "type": "log", "params": { "message": "ticket" } },
                { "id": "js", "type": "code",
                  "params": { "language": "javascript", "source": "return 1" } }
            ],
            "edges": [{ "from": "created", "to": "note" }, { "from": "note", "to": "js" }]
        }),
    )
    .await;
    // A workflow whose second block fails when it runs.
    let broken = save(
        &stack,
        "broken",
        WorkflowStatus::Live,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "note", "type": "log", "params": { "message": "start" } },
                { "id": "mark", "type": "rowUpdate", "params": {
                    "entity": "ticket", "id": "not-a-uuid", "patch": { "seen": true } } }
            ],
            "edges": [{ "from": "start", "to": "note" }, { "from": "note", "to": "mark" }]
        }),
    )
    .await;
    subscribe(&stack, "pager", "workflow.failed", "/failed").await;
    subscribe(&stack, "slack", "workflow.executed", "/executed").await;
    let _general = stack.start(GENERAL, &[]).await;

    create_row(&stack, "ticket", json!({ "title": "printer on fire" })).await;
    let failing = request_run(&stack, broken, json!({})).await;

    let hooks = stack.http.wait_for_requests("/failed", 2, WAIT).await;
    let mut statuses: Vec<(String, String)> = hooks
        .iter()
        .map(|r| {
            let body = r.json();
            assert_eq!(body["hook"], "workflow.failed");
            (
                body["data"]["status"].as_str().unwrap().to_owned(),
                body["data"]["error"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    statuses.sort();
    assert_eq!(statuses[0].0, "error");
    assert!(statuses[0].1.contains("mark"), "{}", statuses[0].1);
    assert_eq!(statuses[1].0, "rejected");
    assert!(statuses[1].1.contains("js"), "{}", statuses[1].1);

    let run = wait_status(&stack, failing, ExecutionStatus::Error).await;
    assert!(run.error.unwrap().contains("not a row id"));
    assert_eq!(
        block_rows(&stack, failing).await,
        vec![
            ("start".to_owned(), 1, "success".to_owned()),
            ("note".to_owned(), 1, "success".to_owned()),
            ("mark".to_owned(), 1, "error".to_owned()),
        ]
    );
    stack
        .wait_count(
            "SELECT count(*) FROM workflow_execution e JOIN workflow w ON w.id = e.workflow_id
             WHERE w.name = 'scripted' AND e.status = 'rejected'
               AND NOT EXISTS (SELECT 1 FROM workflow_block_execution b WHERE b.execution_id = e.id)",
            1,
        )
        .await;
    stack
        .wait_idle(&[
            queues::WORKFLOW,
            queues::PLUGIN_HOOK,
            queues::TOOLCTRL_PLUGIN_INVOKE,
        ])
        .await;
    assert!(stack.http.requests_to("/executed").is_empty());
    assert_eq!(stack.http.requests_to("/failed").len(), 2);
}

/// manualTrigger → waitForInput (`timeout_ms`) → `answered` email on input,
/// `late` email on timeout; `version` shows in the answered subject.
fn approval_workflow(timeout_ms: u64, version: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput",
              "params": { "prompt": "Approve?", "timeoutMs": timeout_ms } },
            { "id": "answered", "type": "email", "params": {
                "to": ["boss@example.com"],
                "subject": format!("Answered ({version}): {{{{ blocks.ask.output.answer.approved }}}}"),
                "text": "thanks" } },
            { "id": "late", "type": "email", "params": {
                "to": ["boss@example.com"], "subject": "No answer", "text": "timed out" } }
        ],
        "edges": [
            { "from": "start", "to": "ask" },
            { "from": "ask", "to": "answered", "label": "input" },
            { "from": "ask", "to": "late", "label": "timeout" }
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_resumes_on_its_own_version_and_another_takes_its_timeout_branch() {
    let stack = stack().await;
    let approval = save(
        &stack,
        "approval",
        WorkflowStatus::Live,
        approval_workflow(3_600_000, "v1"),
    )
    .await;
    let hurried = save(
        &stack,
        "hurried",
        WorkflowStatus::Live,
        approval_workflow(1_500, "v1"),
    )
    .await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;

    let waiting = request_run(&stack, approval, json!({})).await;
    let run = wait_status(&stack, waiting, ExecutionStatus::Waiting).await;
    assert_eq!(run.waiting_block.as_deref(), Some("ask"));
    assert_eq!(run.workflow_version, 1);

    // Edit the workflow while the run waits: the run resumes on version 1.
    save(
        &stack,
        "approval",
        WorkflowStatus::Live,
        approval_workflow(3_600_000, "v2"),
    )
    .await;
    continue_run(&stack, waiting, json!({ "approved": true }))
        .await
        .unwrap();
    let run = wait_status(&stack, waiting, ExecutionStatus::Success).await;
    assert_eq!(run.workflow_version, 1);
    assert_eq!(
        block_rows(&stack, waiting).await,
        vec![
            ("start".to_owned(), 1, "success".to_owned()),
            ("ask".to_owned(), 1, "waiting".to_owned()),
            ("ask".to_owned(), 2, "success".to_owned()),
            ("answered".to_owned(), 1, "success".to_owned()),
        ]
    );
    // The first continuation won: another answer is refused, and the
    // scheduled timeout, when it comes, finds nothing waiting.
    assert!(matches!(
        continue_run(&stack, waiting, json!({ "approved": false })).await,
        Err(ProducerError::NotWaiting { .. })
    ));

    // Nobody answers the other run: its timeout continuation, scheduled at
    // the deadline, takes the timeout branch.
    let timed_out = request_run(&stack, hurried, json!({})).await;
    let run = wait_status(&stack, timed_out, ExecutionStatus::Success).await;
    let blocks: Vec<String> = block_rows(&stack, timed_out)
        .await
        .into_iter()
        .map(|(block, _, _)| block)
        .collect();
    assert_eq!(blocks, vec!["start", "ask", "ask", "late"]);
    assert_eq!(run.waiting_block, None);

    assert_eq!(
        settled_subjects(&stack, 2).await,
        vec!["Answered (v1): true", "No answer"]
    );
}
