//! The dispatcher keeps the dead entries its own hand-offs leave out of the
//! claim index: it vacuums `outbox_event` after every `vacuum_every`
//! claimed rows (`OUTBOX_DISPATCH_VACUUM_EVERY`), whether or not the server
//! runs autovacuum.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, quick_config};
use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use outbox_dispatch::DispatcherConfig;
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(QueryableByName)]
struct Vacuums {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Manual vacuums of `outbox_event` in this test's database, as the
/// server's statistics count them (autovacuum's are counted apart).
async fn manual_vacuums(h: &Harness) -> i64 {
    let mut conn = h.conn().await;
    diesel::sql_query(
        "SELECT vacuum_count AS n FROM pg_stat_user_tables WHERE relname = 'outbox_event'",
    )
    .get_result::<Vacuums>(&mut conn)
    .await
    .unwrap()
    .n
}

// Break checked: a dispatcher that never starts its upkeep task leaves
// `vacuum_count` at 0 and the wait times out.
#[tokio::test]
async fn the_dispatcher_vacuums_the_table_after_every_so_many_claimed_rows() {
    let h = Harness::new().await;
    assert_eq!(manual_vacuums(&h).await, 0, "a new database");
    let events = (0..120)
        .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
        .collect();
    h.publish(events).await;

    let config = DispatcherConfig {
        batch_size: 10,
        vacuum_every: 50,
        ..quick_config()
    };
    let shutdown = CancellationToken::new();
    let handle = h.dispatcher(config).spawn(shutdown.clone());
    let deadline = Duration::from_secs(30);
    h.wait_for("every event to be handed off", deadline, async || {
        h.rows()
            .await
            .iter()
            .all(|r| r.status == OutboxStatus::Done)
    })
    .await;
    h.wait_for(
        "the dispatcher to vacuum outbox_event",
        deadline,
        async || manual_vacuums(&h).await >= 1,
    )
    .await;

    shutdown.cancel();
    handle.await.unwrap().unwrap();
}
