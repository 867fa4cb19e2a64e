//! Every Redis key a deployment writes lives under its
//! `OUTBOX_QUEUE_PREFIX`, so that `--scan --pattern '<prefix>*'` finds all
//! of an environment's keys on a shared Redis and nothing of another's.
//! Both binaries run against a private `redis-server` that holds nothing
//! else, so any key outside the prefix is theirs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use outbox_test_support::{RedisProcess, eventually};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const PREFIX: &str = "adopt-app:";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_both_workers_leaves_no_redis_key_outside_its_prefix() {
    let redis = RedisProcess::start().await;
    let stack = Stack::new().await;
    let url = redis.url();
    let extra = [("REDIS_URL", url.as_str()), ("OUTBOX_QUEUE_PREFIX", PREFIX)];
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES ('acme', '{}', 's')",
            stack.http.url_for("/hook")
        ))
        .await;
    let mut general = stack.start(GENERAL, &extra).await;
    let mut mail = stack.start(MAIL, &extra).await;

    // Every kind of key: queues and their job records, the downstream send
    // queue, idempotency records (SMTP and webhook), worker registrations,
    // the Redis guard's marker.
    for (event_type, payload) in [
        (
            "mail.user.welcome",
            json!({ "to": "ada@example.com", "template": "welcome", "vars": { "name": "Ada" } }),
        ),
        ("webhook.order.created", json!({ "orderId": 7 })),
        ("audit.user.login", json!({ "actor": "ada" })),
        (
            "notification.user.mentioned",
            json!({ "title": "You were mentioned" }),
        ),
    ] {
        stack
            .publish(NewOutboxEvent::new("acme", event_type, payload))
            .await;
    }
    stack.smtp.wait_for_messages(1, WAIT).await;
    eventually("the webhook call", WAIT, async || {
        !stack.http.requests_to("/hook").is_empty()
    })
    .await;
    stack
        .wait_count("SELECT count(*) FROM audit_log WHERE actor = 'ada'", 1)
        .await;
    stack
        .wait_count("SELECT count(*) FROM notification", 1)
        .await;
    stack
        .wait_count("SELECT count(*) FROM outbox_event WHERE status = 'DONE'", 4)
        .await;

    for worker in [&mut general, &mut mail] {
        worker.signal("TERM");
        assert!(worker.wait_exit(WAIT).await.success());
    }

    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let outside: Vec<&String> = keys.iter().filter(|k| !k.starts_with(PREFIX)).collect();
    assert!(
        outside.is_empty(),
        "keys outside {PREFIX}: {outside:?} (all keys: {keys:?})"
    );
    for kind in [
        "adopt-app:outbox.audit:",
        "adopt-app:toolctrl.email:",
        "adopt-app:outbox:idempotency:",
        "adopt-app:outbox:redis-marker",
    ] {
        assert!(
            keys.iter().any(|k| k.starts_with(kind)),
            "no {kind}* key: the run did not write what this test means to check ({keys:?})"
        );
    }
}
