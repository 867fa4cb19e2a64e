//! Redis unreachable: rows follow the backoff schedule, end FAILED past the
//! retry limit, and a requeue delivers them once Redis is back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::Duration as ChronoDuration;
use common::{Harness, exec, quick_config};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_cli::requeue::{Candidate, execute, plan};
use outbox_dispatch::DispatcherConfig;
use outbox_model::OutboxStatus;
use outbox_model::schema::outbox_event;
use outbox_publish::NewOutboxEvent;
use outbox_test_support::RedisProcess;
use serde_json::json;

#[tokio::test]
async fn redis_outage_backs_off_then_dead_letters_then_requeue_delivers() {
    let h = Harness::new().await;
    let mut redis = RedisProcess::start().await;
    let config = DispatcherConfig {
        max_retries: 6,
        ..quick_config()
    };
    let dispatcher = h.dispatcher_on(&redis.url(), config.clone());
    redis.stop();
    let ids = h
        .publish(vec![
            NewOutboxEvent::new("acme", "mail.user.welcome", json!({ "n": 1 })),
            NewOutboxEvent::new("acme", "webhook.order.created", json!({ "n": 2 })),
        ])
        .await;
    let mut conn = h.conn().await;
    let expected_minutes = [1, 2, 4, 8, 16, 32];

    for (attempt, minutes) in (1..=6).zip(expected_minutes) {
        let before = h.db_now().await;
        let report = dispatcher.tick().await.unwrap();
        let after = h.db_now().await;
        assert_eq!(
            (report.claimed, report.retried, report.lost_leases),
            (2, 2, 0),
            "attempt {attempt}: {report:?}"
        );
        for id in &ids {
            let row = h.row(*id).await;
            assert_eq!(row.status, OutboxStatus::Pending, "attempt {attempt}");
            assert_eq!(row.retries, attempt);
            assert_eq!(row.locked_until, None);
            let backoff = ChronoDuration::minutes(minutes);
            assert!(
                row.scheduled_at >= before + backoff && row.scheduled_at <= after + backoff,
                "attempt {attempt}: scheduled_at {} not {minutes} min after the tick [{before}, {after}]",
                row.scheduled_at
            );
            assert!(
                row.last_error.as_deref().unwrap().contains("hand-off to"),
                "{:?}",
                row.last_error
            );
        }
        // Nothing is due before the backoff has passed.
        assert_eq!(dispatcher.tick().await.unwrap().claimed, 0);
        // Let the backoff "pass".
        exec(
            &mut conn,
            "UPDATE outbox_event SET scheduled_at = now() WHERE status = 'PENDING'",
        )
        .await;
    }

    let report = dispatcher.tick().await.unwrap();
    assert_eq!((report.claimed, report.failed), (2, 2), "{report:?}");
    for id in &ids {
        let row = h.row(*id).await;
        assert_eq!(row.status, OutboxStatus::Failed);
        assert_eq!(row.retries, 7, "past OUTBOX_MAX_RETRIES=6");
        assert!(row.last_error.as_deref().unwrap().contains("hand-off to"));
    }
    assert_eq!(
        dispatcher.tick().await.unwrap().claimed,
        0,
        "dead-lettered rows stay put"
    );

    // Redis comes back; an operator requeues the dead letters (`outbox
    // requeue --status failed`: the CLI's policy and transaction; its binary
    // is not built for this crate's tests).
    redis.restart().await;
    let failed: Vec<Candidate> = outbox_event::table
        .filter(outbox_event::status.eq(OutboxStatus::Failed))
        .select(Candidate::as_select())
        .load(&mut conn)
        .await
        .unwrap();
    let plan = plan(failed, false);
    let executed = execute(&mut conn, &plan, "Redis is back", Some("ops"), false)
        .await
        .unwrap();
    assert_eq!(executed.requeued.len(), 2, "{plan:?}");
    let report = dispatcher.tick().await.unwrap();
    assert_eq!((report.claimed, report.dispatched), (2, 2), "{report:?}");
    for id in &ids {
        assert_eq!(h.row(*id).await.status, OutboxStatus::Done);
    }
    // The jobs landed on the restarted Redis, once each.
    let client = redis::Client::open(redis.url().as_str()).unwrap();
    let mut rc = client.get_multiplexed_async_connection().await.unwrap();
    for (queue, id) in [("outbox.mail", ids[0]), ("outbox.webhook", ids[1])] {
        let keys: Vec<String> = redis::cmd("HKEYS")
            .arg(format!("{}:data", h.namespace.queue(queue)))
            .query_async(&mut rc)
            .await
            .unwrap();
        assert_eq!(keys, vec![format!("outbox:{id}")]);
    }
}
