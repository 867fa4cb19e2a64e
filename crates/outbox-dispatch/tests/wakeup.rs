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
