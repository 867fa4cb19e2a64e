//! Both worker binaries on a Redis Cluster (three primaries with a replica
//! each, started by the test from the system's `redis-server`), with the
//! cluster form of `REDIS_URL`: audit rows, mails and webhooks of committed
//! events arrive, each once, through queues that live on different
//! primaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use outbox_test_support::RedisCluster;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const EVENTS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_audit_mail_and_webhook_event_takes_effect_once() {
    let cluster = RedisCluster::start(3, 1).await;
    let url = cluster.url();
    let stack = Stack::new().await;
    let env = [("REDIS_URL", url.as_str())];
    let _general = stack.start(GENERAL, &env).await;
    let _mail = stack.start(MAIL, &env).await;
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret, event_types) \
             VALUES ('acme', '{}', 'secret', '{{webhook.order.*}}')",
            stack.http.url_for("/hook")
        ))
        .await;

    for n in 0..EVENTS {
        stack
            .publish(NewOutboxEvent::new(
                "acme",
                "audit.user.login",
                json!({ "actor": format!("actor-{n}") }),
            ))
            .await;
        stack
            .publish(NewOutboxEvent::new(
                "acme",
                "mail.user.welcome",
                json!({ "to": format!("user{n}@example.com"), "template": "welcome", "vars": { "name": "Ada" } }),
            ))
            .await;
        stack
            .publish(NewOutboxEvent::new(
                "acme",
                "webhook.order.paid",
                json!({ "order": n }),
            ))
            .await;
    }

    stack
        .wait_count("SELECT count(DISTINCT actor) FROM audit_log", EVENTS as i64)
        .await;
    stack
        .wait_count("SELECT count(*) FROM audit_log", EVENTS as i64)
        .await;
    let mails = stack.smtp.wait_for_messages(EVENTS, WAIT).await;
    let hooks = stack.http.wait_for_requests("/hook", EVENTS, WAIT).await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DONE'",
            (3 * EVENTS) as i64,
        )
        .await;
    // Nothing more arrives: each effect happened once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(stack.smtp.messages().len(), EVENTS, "one mail per event");
    assert_eq!(
        stack.http.requests_to("/hook").len(),
        EVENTS,
        "one webhook per event"
    );
    assert_eq!(mails.len(), EVENTS);
    assert_eq!(hooks.len(), EVENTS);
}
