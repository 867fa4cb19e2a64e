//! The workflow path end to end, with the real binaries: a row created by
//! the application starts a live workflow through the outbox, the
//! dispatcher and the `outbox.workflow` subscriber; its email goes out
//! through worker-mail once, and its `plugin.hook.workflow.executed` hook
//! is dispatched to the plugin-hook fan-out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use diesel_async::AsyncConnection;
use outbox_publish::OutboxTx;
use outbox_queue::queues;
use outbox_workflow::WorkflowDefinition;
use outbox_workflow::producers::{self, EventContext, ProducerError};
use outbox_workflow::store::{self, WorkflowStatus};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_order_runs_its_live_workflow_and_the_mail_arrives_once() {
    let stack = Stack::new().await;
    let mut conn = stack.db.conn().await;
    let definition = WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "created", "type": "eventTrigger",
              "params": { "entity": "order", "event": "row.created" } },
            { "id": "big", "type": "if", "params": { "condition":
                { "left": { "var": "input.order.total" }, "op": "gt", "right": 100 } } },
            { "id": "thank", "type": "email", "params": {
                "to": ["{{ input.order.email }}"],
                "subject": "Thank you for order {{ input.order.id }}",
                "text": "We received your order of {{ input.order.total }} EUR." } }
        ],
        "edges": [
            { "from": "created", "to": "big" },
            { "from": "big", "to": "thank", "label": "true" }
        ]
    }))
    .unwrap();
    store::save_workflow(
        &mut conn,
        "acme",
        "big orders",
        WorkflowStatus::Live,
        &definition,
    )
    .await
    .unwrap();
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;

    let row = conn
        .transaction::<_, ProducerError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let data = json!({ "total": 150, "email": "ada@example.com" });
            let context = EventContext::Request {
                actor: Some("user-1".into()),
            };
            producers::create_row(&mut tx, "acme", "order", &data, &context).await
        })
        .await
        .unwrap()
        .row;

    let mails = stack.smtp.wait_for_messages(1, WAIT).await;
    assert_eq!(mails[0].to, vec!["ada@example.com"]);
    let subject = format!("Thank you for order {}", row.id);
    assert_eq!(
        mails[0].header("subject").as_deref(),
        Some(subject.as_str())
    );
    assert!(
        mails[0].data.contains("order of 150 EUR"),
        "{}",
        mails[0].data
    );

    stack
        .wait_count(
            "SELECT count(*) FROM workflow_execution WHERE status = 'success' AND trigger_kind = 'event'",
            1,
        )
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE event_type = 'plugin.hook.workflow.executed' AND status = 'DONE'",
            1,
        )
        .await;
    stack.wait_done(queues::PLUGIN_HOOK, 1).await;
    stack.wait_done(queues::WORKFLOW, 1).await;
    stack
        .wait_count(
            "SELECT count(*) FROM workflow_block_execution WHERE status = 'success'",
            3,
        )
        .await;
    // Once every queue on the way is idle, nothing else can come: one
    // execution, one mail.
    stack.wait_done(queues::TOOLCTRL_EMAIL, 1).await;
    outbox_test_support::eventually(
        "the mail and workflow queues to be idle",
        WAIT,
        async || {
            let mut idle = true;
            for queue in [queues::WORKFLOW, queues::MAIL, queues::TOOLCTRL_EMAIL] {
                let stats = stack.stats(queue).await;
                idle &= stats.backlog == 0 && stats.running == 0;
            }
            idle
        },
    )
    .await;
    assert_eq!(stack.smtp.messages().len(), 1);
    assert_eq!(stack.stats(queues::TOOLCTRL_EMAIL).await.done, 1);
    stack
        .wait_count("SELECT count(*) FROM workflow_execution", 1)
        .await;
}
