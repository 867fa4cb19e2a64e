//! When a row goes FAILED, the dispatcher records the instant in `failed_at`,
//! whatever the reason; rows it hands off or puts back for a retry keep it
//! empty.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Harness, exec, no_route_grace, quick_config};
use outbox_dispatch::DispatcherConfig;
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use serde_json::json;

/// Nothing listens there: every hand-off fails at once.
const UNREACHABLE_REDIS: &str = "redis://127.0.0.1:1";

#[tokio::test]
async fn failed_at_is_set_when_a_row_is_dead_lettered_and_only_then() {
    let h = Harness::new().await;
    let ids = h
        .publish(vec![
            NewOutboxEvent::new("acme", "audit.user.login", json!({ "userId": 1 })),
            NewOutboxEvent::new("globex", "legacy.report.generated", json!({})),
        ])
        .await;
    let (routed, unroutable) = (ids[0], ids[1]);

    let before = h.db_now().await;
    let report = h.dispatcher(no_route_grace()).tick().await.unwrap();
    let after = h.db_now().await;
    assert_eq!((report.dispatched, report.unrouted), (1, 1), "{report:?}");

    let done = h.row(routed).await;
    assert_eq!(done.status, OutboxStatus::Done);
    assert_eq!(done.failed_at, None, "a handed-off row never failed");
    let unrouted = h.row(unroutable).await;
    assert_eq!(unrouted.status, OutboxStatus::Failed);
    let failed_at = unrouted
        .failed_at
        .expect("an unroutable row gets failed_at");
    assert!(
        before <= failed_at && failed_at <= after,
        "failed_at {failed_at} is not the tick's time [{before}, {after}]"
    );

    // A routable event whose hand-off keeps failing: one retry, then FAILED.
    let mail = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({ "to": "ada@example.com" }),
        )])
        .await[0];
    let broken = h.dispatcher_on(
        UNREACHABLE_REDIS,
        DispatcherConfig {
            max_retries: 1,
            ..quick_config()
        },
    );
    assert_eq!(broken.tick().await.unwrap().retried, 1);
    let retried = h.row(mail).await;
    assert_eq!(
        (retried.status, retried.failed_at),
        (OutboxStatus::Pending, None),
        "a row waiting for its retry has not failed"
    );

    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "UPDATE outbox_event SET scheduled_at = now() WHERE status = 'PENDING'",
    )
    .await;
    let before = h.db_now().await;
    assert_eq!(broken.tick().await.unwrap().failed, 1);
    let after = h.db_now().await;
    let exhausted = h.row(mail).await;
    assert_eq!(
        (exhausted.status, exhausted.retries),
        (OutboxStatus::Failed, 2)
    );
    let failed_at = exhausted
        .failed_at
        .expect("a row out of retries gets failed_at");
    assert!(
        before <= failed_at && failed_at <= after,
        "failed_at {failed_at} is not the last tick's time [{before}, {after}]"
    );
    assert_eq!(
        h.row(unroutable).await.failed_at,
        unrouted.failed_at,
        "a FAILED row is not touched again"
    );
}
