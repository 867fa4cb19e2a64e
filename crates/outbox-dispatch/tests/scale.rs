//! Four dispatchers racing over 20,000 events: every event becomes exactly
//! one job and every row ends DONE.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Harness, quick_config};
use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use outbox_dispatch::DispatcherConfig;
use outbox_publish::NewOutboxEvent;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const EVENTS: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_dispatchers_turn_twenty_thousand_events_into_one_job_each() {
    let h = Harness::with_pool_size(8).await;
    let types = [
        "mail.user.welcome",
        "webhook.order.created",
        "audit.user.login",
        "billing.invoice.paid",
        "workflow.trigger.event",
        "search.index.product.updated",
        "plugin.hook.workflow.executed",
    ];
    let mut ids = Vec::with_capacity(EVENTS);
    for chunk in 0..(EVENTS / 5_000) {
        let events = (0..5_000)
            .map(|i| {
                let n = chunk * 5_000 + i;
                NewOutboxEvent::new(
                    format!("tenant-{}", n % 13),
                    types[n % types.len()],
                    json!({ "n": n }),
                )
            })
            .collect();
        ids.extend(h.publish(events).await);
    }
    assert_eq!(ids.len(), EVENTS);

    let shutdown = CancellationToken::new();
    let config = DispatcherConfig {
        batch_size: 250,
        concurrency: 4,
        ..quick_config()
    };
    let handles: Vec<_> = (0..4)
        .map(|_| h.dispatcher(config.clone()).spawn(shutdown.clone()))
        .collect();

    let mut conn = h.conn().await;
    h.wait_for(
        "every row to be DONE",
        Duration::from_secs(300),
        async || {
            let open: i64 = diesel::dsl::sql::<BigInt>(
                "SELECT count(*) FROM outbox_event WHERE status <> 'DONE'",
            )
            .get_result(&mut conn)
            .await
            .unwrap();
            open == 0
        },
    )
    .await;
    shutdown.cancel();
    for handle in handles {
        handle.await.unwrap().unwrap();
    }

    let counts = h.tasks_per_id().await;
    assert_eq!(counts.len(), EVENTS, "one task per event");
    let duplicated: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        duplicated.is_empty(),
        "tasks present more than once: {duplicated:?}"
    );
    let expected: HashSet<String> = ids.iter().map(|id| format!("outbox:{id}")).collect();
    let actual: HashSet<String> = counts.into_keys().collect();
    assert_eq!(actual, expected);
}
