//! The dispatcher's metrics, as a Prometheus scrape would see them: recorded
//! through the `metrics` facade into a recorder installed for this test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::{Harness, exec, quick_config};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_publish::NewOutboxEvent;
use serde_json::json;

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

#[test]
fn a_tick_counts_claims_hand_offs_and_dead_letters() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let h = runtime.block_on(Harness::new());
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
        h.dispatcher(quick_config())
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
