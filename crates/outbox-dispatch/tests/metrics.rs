//! The dispatcher's metrics, as a Prometheus scrape would see them: recorded
//! through the `metrics` facade into a recorder installed for this test.
//! Each counter is checked where its event happens: a lease taken over, a
//! job already in Redis, a claim given back on stop, a listener reconnect.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Harness, PausableRedis, exec, no_route_grace, quick_config};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_dispatch::DispatcherConfig;
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use outbox_queue::push_raw;
use outbox_store as db;
use outbox_test_support::{LogCapture, with_metrics_recorder};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// name{labels} → value, for counters and gauges; histograms give their sample count.
fn snapshot(recorder: &DebuggingRecorder) -> HashMap<String, f64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = if labels.is_empty() {
                key.name().to_owned()
            } else {
                format!("{}{{{}}}", key.name(), labels.join(","))
            };
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (name, value)
        })
        .collect()
}

/// A current-thread runtime (the recorder is thread-local: ticks run on
/// the test's thread), a recorder and a harness made on that runtime.
fn recorded() -> (tokio::runtime::Runtime, DebuggingRecorder, Harness) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h = runtime.block_on(Harness::new());
    (runtime, DebuggingRecorder::new(), h)
}

#[test]
fn a_tick_counts_claims_hand_offs_and_dead_letters() {
    let (runtime, recorder, h) = recorded();
    runtime.block_on(async {
        h.publish(vec![
            NewOutboxEvent::new("acme", "mail.user.welcome", json!({})),
            NewOutboxEvent::new("acme", "mail.user.goodbye", json!({})),
            NewOutboxEvent::new("acme", "audit.user.login", json!({})),
        ])
        .await;
        let mut conn = h.conn().await;
        exec(
            &mut conn,
            "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('t', 'legacy.report.generated', '{}')",
        )
        .await;
    });
    let dispatcher = {
        let _runtime = runtime.enter();
        h.dispatcher(no_route_grace())
    };

    // The recorder is thread-local; the current-thread runtime keeps the tick on this thread.
    metrics::with_local_recorder(&recorder, || runtime.block_on(dispatcher.tick())).unwrap();

    let m = snapshot(&recorder);
    assert_eq!(m["outbox_dispatch_claimed_total"], 4.0, "{m:?}");
    assert_eq!(
        m["outbox_dispatch_dispatched_total{queue=outbox.mail}"],
        2.0
    );
    assert_eq!(
        m["outbox_dispatch_dispatched_total{queue=outbox.audit}"],
        1.0
    );
    assert_eq!(m["outbox_dispatch_unrouted_total"], 1.0);
    assert_eq!(m["outbox_dispatch_failed_total{reason=unrouted}"], 1.0);
    assert_eq!(
        m["outbox_dispatch_failed_total{reason=retries_exhausted}"],
        0.0
    );
    assert_eq!(m["outbox_dispatch_retried_total"], 0.0);
    assert_eq!(
        m["outbox_dispatch_handoff_latency_seconds{queue=outbox.mail}"], 2.0,
        "two samples"
    );
    assert_eq!(m["outbox_pending_due"], 4.0, "gauge read before the claim");
}

/// The pending gauge is read at most once in five seconds (a count of the
/// claim index per tick would cost more than the gauge is worth), and read
/// again at the first tick after that: it follows the table.
// Break checked: with the refresh condition inverted (`>` for `<`, a miss
// of the pinned mutation shard 6) the later tick leaves the gauge at the
// first count and this fails.
#[test]
fn the_pending_gauge_is_read_again_at_the_first_tick_after_five_seconds() {
    let (runtime, recorder, h) = recorded();
    let publish = |n: usize| {
        runtime.block_on(
            h.publish(
                (0..n)
                    .map(|i| NewOutboxEvent::new("acme", "audit.user.login", json!({ "i": i })))
                    .collect(),
            ),
        )
    };
    let dispatcher = {
        let _runtime = runtime.enter();
        h.dispatcher(quick_config())
    };
    let tick =
        || metrics::with_local_recorder(&recorder, || runtime.block_on(dispatcher.tick())).unwrap();
    publish(2);
    tick();
    let counted = std::time::Instant::now();
    assert_eq!(snapshot(&recorder)["outbox_pending_due"], 2.0);
    publish(3);
    // The gauge's own interval has to pass: the condition is the clock.
    runtime.block_on(outbox_test_support::eventually(
        "five seconds since the first count",
        Duration::from_secs(30),
        async || counted.elapsed() > Duration::from_millis(5_100),
    ));
    tick();
    assert_eq!(
        snapshot(&recorder)["outbox_pending_due"],
        3.0,
        "the gauge read again before the later tick's claim"
    );
}

/// The hand-off latency is counted in seconds from when the row became due
/// (`scheduled_at`), not from when it was written: a row written a day ago
/// and due 90 seconds ago records about 90.
// Break checked: dividing the milliseconds with `%` instead of `/` records
// a fraction of a second and fails this.
#[test]
fn the_handoff_latency_counts_seconds_from_when_the_row_became_due() {
    let recorder = DebuggingRecorder::new();
    with_metrics_recorder(&recorder, async || {
        let h = Harness::new().await;
        let mut conn = h.conn().await;
        exec(
            &mut conn,
            "INSERT INTO outbox_event (tenant_id, event_type, payload, created_at, scheduled_at)
             VALUES ('t', 'audit.user.login', '{}', now() - interval '1 day', now() - interval '90 seconds')",
        )
        .await;
        h.dispatcher(quick_config()).tick().await.unwrap();
    });

    let samples: Vec<f64> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == "outbox_dispatch_handoff_latency_seconds")
        .flat_map(|(_, _, _, value)| match value {
            DebugValue::Histogram(samples) => samples.into_iter().map(|s| s.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert!(
        (90.0..3600.0).contains(&samples[0]),
        "latency {} s for a row due 90 s ago",
        samples[0]
    );
}

/// A counter's value in a snapshot; 0 when it was never recorded.
fn counter(snapshot: &HashMap<String, f64>, name: &str) -> f64 {
    snapshot.get(name).copied().unwrap_or(0.0)
}

// Breaks checked: `report.lost_leases` left at 0 in `tick_until` fails with
// "the taken-over row is counted as lost ... left: (1, 0, 0) right: (1, 0, 1)";
// `outbox_dispatch_lost_leases_total` incremented by 0 fails with "left: 0.0,
// right: 1.0"; the warning written on `lost_leases == 0` instead of `> 0`
// fails here (no warning) and in the duplicate test below (a warning on a
// healthy tick).
#[test]
fn a_lease_taken_over_while_the_push_hangs_is_counted_as_lost_not_dispatched() {
    let recorder = DebuggingRecorder::new();
    let log = LogCapture::start();
    with_metrics_recorder(&recorder, async || {
        let h = Harness::new().await;
        // A Redis of its own, to pause without disturbing other tests.
        let mut redis = PausableRedis::start().await;
        let id = h.publish_one("audit.user.login").await;
        let dispatcher = h.dispatcher_on(
            &redis.process.url(),
            DispatcherConfig {
                lock_timeout: Duration::from_secs(1),
                ..quick_config()
            },
        );
        redis.pause_writes().await;

        // The tick claims the row, then its push waits on the paused Redis.
        let tick = tokio::spawn({
            let dispatcher = dispatcher.clone();
            async move { dispatcher.tick().await }
        });
        h.wait_for(
            "the tick to claim the row",
            Duration::from_secs(30),
            async || h.row(id).await.status == OutboxStatus::Processing,
        )
        .await;
        // Its lease runs out; another dispatcher takes the row over.
        let mut other = h.conn().await;
        h.wait_for(
            "the lease to expire and the row to be taken over",
            Duration::from_secs(30),
            async || !db::claim(&mut other, 10, 60_000).await.unwrap().is_empty(),
        )
        .await;
        let taken_over = h.row(id).await;
        redis.unpause().await;

        let report = tick.await.unwrap().unwrap();
        assert_eq!(
            (report.claimed, report.dispatched, report.lost_leases),
            (1, 0, 1),
            "the taken-over row is counted as lost, not as dispatched: {report:?}"
        );
        assert_eq!(
            h.row(id).await,
            taken_over,
            "the new owner's row is untouched"
        );
    });
    assert_eq!(
        log.count("leases expired before the outcome was recorded"),
        1,
        "one warning names the lost lease: {}",
        log.text()
    );
    let m = snapshot(&recorder);
    assert_eq!(counter(&m, "outbox_dispatch_lost_leases_total"), 1.0);
    assert_eq!(
        counter(&m, "outbox_dispatch_dispatched_total{queue=outbox.audit}"),
        0.0
    );
}

// Break checked: `outbox_dispatch_duplicates_total` incremented by 0 fails
// with "left: 0.0, right: 1.0". (`TickReport.duplicates` itself is asserted
// by recovery.rs `a_crash_after_the_push_but_before_done_makes_no_second_job`.)
#[test]
fn a_job_already_in_redis_is_counted_as_a_duplicate_hand_off() {
    let recorder = DebuggingRecorder::new();
    let log = LogCapture::start();
    let report = with_metrics_recorder(&recorder, async || {
        let h = Harness::new().await;
        let ids = h
            .publish(vec![
                NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": 1 })),
                NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": 2 })),
            ])
            .await;
        // A dispatcher that died after its push left the first job in Redis.
        let mut redis = h.redis.conn().await;
        push_raw(
            &mut redis,
            &h.namespace,
            "outbox.audit",
            &[(format!("outbox:{}", ids[0]), b"{}".to_vec())],
        )
        .await
        .unwrap();
        h.dispatcher(quick_config()).tick().await.unwrap()
    });
    let m = snapshot(&recorder);
    assert_eq!((report.dispatched, report.duplicates), (2, 1), "{report:?}");
    assert_eq!(
        log.count("leases expired"),
        0,
        "a tick that lost no lease warns of none: {}",
        log.text()
    );
    assert_eq!(counter(&m, "outbox_dispatch_duplicates_total"), 1.0);
    assert_eq!(
        counter(&m, "outbox_dispatch_dispatched_total{queue=outbox.audit}"),
        2.0
    );
}

// Break checked: `outbox_dispatch_released_total` incremented by 0 fails with
// "left: 0.0, right: 5.0". (`TickReport.released` itself is asserted by
// dispatch.rs `stopping_mid_tick_releases_the_unhanded_claim`.)
#[test]
fn a_stopping_dispatcher_counts_the_claims_it_gives_back() {
    let recorder = DebuggingRecorder::new();
    let report = with_metrics_recorder(&recorder, async || {
        let h = Harness::new().await;
        let events = (0..5)
            .map(|i| NewOutboxEvent::new("acme", "webhook.order.created", json!({ "n": i })))
            .collect();
        h.publish(events).await;
        let stop = CancellationToken::new();
        stop.cancel();
        h.dispatcher(quick_config())
            .tick_until(&stop)
            .await
            .unwrap()
    });
    let m = snapshot(&recorder);
    assert_eq!((report.claimed, report.released), (5, 5), "{report:?}");
    assert_eq!(counter(&m, "outbox_dispatch_released_total"), 5.0);
    assert_eq!(counter(&m, "outbox_dispatch_claimed_total"), 5.0);
}

// Break checked: the `outbox_dispatch_listener_reconnects_total` increment
// removed from the listener fails with "left: 0.0, right: 1.0".
#[test]
fn a_killed_listener_connection_is_counted_as_a_reconnect() {
    let recorder = DebuggingRecorder::new();
    with_metrics_recorder(&recorder, async || {
        let h = Harness::new().await;
        let config = DispatcherConfig {
            interval: Duration::from_secs(60),
            listen: true,
            ..quick_config()
        };
        let shutdown = CancellationToken::new();
        let handle = h.dispatcher(config).spawn(shutdown.clone());
        let mut first = None;
        h.wait_for(
            "the listener to connect",
            Duration::from_secs(20),
            async || {
                first = h.listener_pid().await;
                first.is_some()
            },
        )
        .await;
        // (A snapshot drains the counters: the one below counts from here.)
        assert_eq!(
            counter(
                &snapshot(&recorder),
                "outbox_dispatch_listener_reconnects_total"
            ),
            0.0,
            "the first connection is no reconnect"
        );

        let mut conn = h.conn().await;
        exec(
            &mut conn,
            &format!("SELECT pg_terminate_backend({})", first.unwrap()),
        )
        .await;
        h.wait_for(
            "a new listener connection",
            Duration::from_secs(20),
            async || h.listener_pid().await.is_some_and(|pid| Some(pid) != first),
        )
        .await;
        shutdown.cancel();
        handle.await.unwrap().unwrap();
    });
    let m = snapshot(&recorder);
    assert_eq!(
        counter(&m, "outbox_dispatch_listener_reconnects_total"),
        1.0
    );
}

/// After requeueing the `FAILED (unrouted)` events a new route matches,
/// `outbox_unrouted_failed` shows the ones still without a route.
// Break checked: the gauge set to the failed plus the revived (a mutation
// run's shard 0 of `outbox-dispatch`) fails with 7 against 3.
#[test]
fn after_a_revive_the_unrouted_gauge_counts_only_the_events_still_without_a_route() {
    let recorder = DebuggingRecorder::new();
    let revived = with_metrics_recorder(&recorder, async || {
        let h = Harness::new().await;
        let mut conn = h.conn().await;
        exec(
            &mut conn,
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             SELECT 't', 'legacy.report.generated', '{}' FROM generate_series(1, 2);
             INSERT INTO outbox_event (tenant_id, event_type, payload)
             SELECT 't', 'legacy.other.happened', '{}' FROM generate_series(1, 3)",
        )
        .await;
        // No route for either type and no grace: all five are dead-lettered.
        h.dispatcher(no_route_grace()).tick().await.unwrap();
        let router = outbox_dispatch::Router::empty()
            .with_rule("legacy.report.", "app.reports")
            .unwrap();
        outbox_dispatch::revive_routable(&mut conn, &router)
            .await
            .unwrap()
    });
    assert_eq!(revived, 2);
    let m = snapshot(&recorder);
    assert_eq!(m["outbox_unrouted_failed"], 3.0, "{m:?}");
    assert_eq!(m["outbox_dispatch_unrouted_revived_total"], 2.0);
}
