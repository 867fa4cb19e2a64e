//! Wake-ups: with a one-minute poll interval, a new event is still
//! dispatched promptly through LISTEN/NOTIFY, and again after the listening
//! connection is killed; without LISTEN, `Dispatcher::wake` starts a tick.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, exec};
use outbox_dispatch::DispatcherConfig;
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn insert_notification_wakes_the_dispatcher_even_after_the_listener_is_killed() {
    let h = Harness::new().await;
    let config = DispatcherConfig {
        interval: Duration::from_secs(60),
        listen: true,
        ..DispatcherConfig::default()
    };
    let dispatcher = h.dispatcher(config);
    let shutdown = CancellationToken::new();
    let handle = dispatcher.spawn(shutdown.clone());

    // The deadlines below are far shorter than the 60 s poll interval: only
    // a wake-up can meet them.
    let deadline = Duration::from_secs(20);
    let mut first_pid = None;
    h.wait_for("the listener to connect", deadline, async || {
        first_pid = h.listener_pid().await;
        first_pid.is_some()
    })
    .await;
    // Plain SQL from "another language" wakes it just the same.
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('t', 'audit.user.login', '{}')",
    )
    .await;
    h.wait_for(
        "the plain-SQL event to be dispatched",
        deadline,
        async || {
            h.rows()
                .await
                .iter()
                .all(|r| r.status == OutboxStatus::Done)
        },
    )
    .await;

    // Kill the listening connection; the dispatcher must reconnect and LISTEN again.
    exec(
        &mut conn,
        &format!("SELECT pg_terminate_backend({})", first_pid.unwrap()),
    )
    .await;
    h.wait_for("a new listener connection", deadline, async || {
        h.listener_pid()
            .await
            .is_some_and(|pid| Some(pid) != first_pid)
    })
    .await;
    let ids = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({}),
        )])
        .await;
    h.wait_for(
        "the event published after the reconnect to be dispatched",
        deadline,
        async || h.row(ids[0]).await.status == OutboxStatus::Done,
    )
    .await;

    shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// A program that embeds the dispatcher and knows it just wrote events can
/// wake it without `LISTEN`: `Dispatcher::wake` starts a tick at once.
// Break checked: `wake` doing nothing leaves the second event waiting for
// the hour-long poll, and the test fails at its deadline.
#[tokio::test]
async fn wake_starts_a_tick_at_once_without_listen() {
    let h = Harness::new().await;
    let config = DispatcherConfig {
        interval: Duration::from_secs(3600),
        listen: false,
        loops: 1,
        ..DispatcherConfig::default()
    };
    let dispatcher = h.dispatcher(config);
    // Published before the start: the loop's first tick takes it, then the
    // loop waits (an hour, unless woken).
    let first = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({}),
        )])
        .await;
    let shutdown = CancellationToken::new();
    let handle = dispatcher.clone().spawn(shutdown.clone());
    let deadline = Duration::from_secs(20);
    h.wait_for("the first tick", deadline, async || {
        h.row(first[0]).await.status == OutboxStatus::Done
    })
    .await;

    let second = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({}),
        )])
        .await;
    dispatcher.wake();
    h.wait_for(
        "the woken tick to dispatch the second event",
        deadline,
        async || h.row(second[0]).await.status == OutboxStatus::Done,
    )
    .await;

    shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// Whether the dispatcher's wake gate connection waits for a lock.
async fn gate_waits_for_a_lock(h: &Harness) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Waiting {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        waiting: bool,
    }
    let mut conn = h.conn().await;
    diesel_async::RunQueryDsl::get_result::<Waiting>(
        diesel::sql_query(
            "SELECT count(*) > 0 AS waiting FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1
               AND wait_event_type = 'Lock'",
        )
        .bind::<diesel::sql_types::Text, _>(outbox_dispatch::GATE_APPLICATION_NAME),
        &mut conn,
    )
    .await
    .unwrap()
    .waiting
}

/// An event inserted while no dispatcher waited sends no `NOTIFY` (its
/// transaction holds the wake gate shared instead). A dispatcher that then
/// finds nothing to claim queues for the gate behind that transaction, and
/// once it commits claims again and hands the event off, long before its
/// hour-long poll.
// Break checked: not waking a loop when the gate is granted leaves the
// event PENDING past the deadline.
#[tokio::test]
async fn an_event_committed_without_a_notification_is_handed_off_without_waiting_for_the_poll() {
    let h = Harness::new().await;
    let mut publisher = h.conn().await;
    exec(
        &mut publisher,
        "BEGIN; INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('t', 'audit.user.login', '{}')",
    )
    .await;

    let config = DispatcherConfig {
        interval: Duration::from_secs(3600),
        listen: true,
        ..DispatcherConfig::default()
    };
    let shutdown = CancellationToken::new();
    let handle = h.dispatcher(config).spawn(shutdown.clone());
    let deadline = Duration::from_secs(20);
    h.wait_for(
        "the dispatcher to queue for the wake gate behind the open transaction",
        deadline,
        async || gate_waits_for_a_lock(&h).await,
    )
    .await;
    exec(&mut publisher, "COMMIT").await;
    h.wait_for("the event to be handed off", deadline, async || {
        h.rows()
            .await
            .iter()
            .all(|r| r.status == OutboxStatus::Done)
    })
    .await;
    assert_eq!(h.rows().await.len(), 1);

    shutdown.cancel();
    handle.await.unwrap().unwrap();
}
