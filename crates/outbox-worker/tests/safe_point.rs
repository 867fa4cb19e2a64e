//! The Redis guard's safe point against the real binaries: a webhook job
//! that `worker-mail` is running (its request held open by the sink) holds
//! the safe point of `outbox.webhook` at its hand-off while a later webhook
//! is delivered; once it finished, the safe point passes both. What the
//! guard reads here is what the real workers leave in Redis: their
//! registration and in-flight sets, not a test's imitation of them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use outbox_test_support::eventually;
use serde_json::json;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);
/// How long the sink holds the slow webhook's request open: longer than the
/// guard's lag (5 s) past the fast webhook's hand-off, so that the safe
/// point would have passed the slow one by then if its running job did not
/// hold it.
const HOLD: Duration = Duration::from_secs(15);

async fn at(stack: &Stack, sql: &str) -> DateTime<Utc> {
    stack.timestamp(sql).await.expect("a timestamp")
}

async fn handed_off_at(stack: &Stack, id: Uuid) -> DateTime<Utc> {
    at(
        stack,
        &format!(
            "SELECT processed_at AS at FROM outbox_event WHERE id = '{id}' AND status = 'DONE'"
        ),
    )
    .await
}

async fn safe_point(stack: &Stack) -> DateTime<Utc> {
    at(
        stack,
        &format!(
            "SELECT drained_before AS at FROM outbox_redis_safe_point
             WHERE namespace = '{}' AND queue = 'outbox.webhook'",
            stack.namespace.prefix()
        ),
    )
    .await
}

// Break checked: `unfinished.lua` without the in-flight sets (neither
// counted nor read) lets the safe point move past the running webhook, and
// the first wait times out.
#[tokio::test]
async fn a_webhook_still_running_holds_the_safe_point_until_it_finished() {
    let stack = Stack::new().await;
    stack.http.respond_after("/slow", HOLD);
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES
             ('slow', '{}', 'whsec-slow'), ('fast', '{}', 'whsec-fast')",
            stack.http.url_for("/slow"),
            stack.http.url_for("/fast")
        ))
        .await;
    let env = [
        ("OUTBOX_REDIS_CHECK_INTERVAL_MS", "200"),
        ("WEBHOOK_TIMEOUT_MS", "60000"),
        ("DELIVERY_LEASE_MS", "60000"),
    ];
    let _general = stack.start(GENERAL, &env).await;
    let _mail = stack.start(MAIL, &env).await;

    let slow = stack
        .publish(NewOutboxEvent::new(
            "slow",
            "webhook.order.created",
            json!({ "order": 1 }),
        ))
        .await;
    stack.http.wait_for_requests("/slow", 1, WAIT).await;
    let fast = stack
        .publish(NewOutboxEvent::new(
            "fast",
            "webhook.order.created",
            json!({ "order": 2 }),
        ))
        .await;
    stack.http.wait_for_requests("/fast", 1, WAIT).await;
    let slow_at = handed_off_at(&stack, slow).await;
    let fast_at = handed_off_at(&stack, fast).await;
    assert!(slow_at < fast_at);

    // Past the lag, a check holds the safe point at the running job (the
    // request is still open: the sink answers after HOLD).
    eventually(
        "the safe point to stop at the running webhook",
        WAIT,
        async || safe_point(&stack).await == slow_at,
    )
    .await;
    assert!(
        stack.http.requests_to("/slow").len() == 1,
        "the slow webhook was not tried again meanwhile"
    );
    // Once its response arrived and its job finished, the safe point moves
    // past both.
    eventually("the safe point to pass both webhooks", WAIT, async || {
        safe_point(&stack).await > fast_at
    })
    .await;
}
