//! The dispatcher keeps the dead entries its own hand-offs leave out of the
//! claim index: it vacuums `outbox_event` after every `vacuum_every`
//! claimed rows (`OUTBOX_DISPATCH_VACUUM_EVERY`), whether or not the server
//! runs autovacuum.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Harness, quick_config};
use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use outbox_dispatch::{Dispatcher, DispatcherConfig};
use outbox_publish::NewOutboxEvent;
use outbox_queue::RedisSettings;
use outbox_test_support::{LogCapture, database_server_url, with_database};
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
        // The table's, or the most of its partitions' when it is partitioned.
        "SELECT COALESCE(max(s.vacuum_count), 0) AS n
         FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
         WHERE c.relkind = 'r'
           AND c.oid IN (SELECT relid FROM pg_partition_tree('outbox_event')
                         UNION ALL SELECT 'outbox_event'::regclass)",
    )
    .get_result::<Vacuums>(&mut conn)
    .await
    .unwrap()
    .n
}

/// Turns autovacuum off for `outbox_event` in `h`'s database: a round that
/// finds autovacuum at the table is skipped (`SKIP_LOCKED`), which would
/// leave a test waiting for it.
async fn without_autovacuum(h: &Harness) {
    common::without_autovacuum(&mut h.conn().await).await;
}

// Break checked: a dispatcher that never starts its upkeep task leaves
// `vacuum_count` at 0 and the wait times out.
#[tokio::test]
async fn the_dispatcher_vacuums_the_table_after_every_so_many_claimed_rows() {
    let h = Harness::new().await;
    without_autovacuum(&h).await;
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
    h.wait_all_done("every event to be handed off", deadline)
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

/// With the default gap of 20,000 rows, the first round still comes after
/// the first 1,000 (`FIRST_VACUUM_ROUND`): a `VACUUM` is also what makes
/// the dispatcher's connections plan their statements again, and the plans
/// made while the table was nearly empty read it whole (docs/performance.md,
/// "Plans that go stale").
// Break checked: an upkeep whose first gap is `vacuum_every` runs no round
// in these 1,200 rows and the wait times out.
#[tokio::test]
async fn the_first_vacuum_comes_after_the_first_thousand_claimed_rows_whatever_the_gap() {
    assert_eq!(outbox_dispatch::FIRST_VACUUM_ROUND, 1_000);
    let h = Harness::new().await;
    without_autovacuum(&h).await;
    assert_eq!(manual_vacuums(&h).await, 0, "a new database");
    let events = (0..1_200)
        .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
        .collect();
    h.publish(events).await;

    let config = DispatcherConfig {
        batch_size: 100,
        ..quick_config()
    };
    assert_eq!(
        config.vacuum_every,
        outbox_dispatch::DEFAULT_VACUUM_EVERY,
        "the default gap"
    );
    let shutdown = CancellationToken::new();
    let handle = h.dispatcher(config).spawn(shutdown.clone());
    let deadline = Duration::from_secs(30);
    h.wait_all_done("every event to be handed off", deadline)
        .await;
    h.wait_for(
        "the dispatcher's first vacuum of outbox_event",
        deadline,
        async || manual_vacuums(&h).await >= 1,
    )
    .await;

    shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// After a round the gap to the next is the rows the table holds (at least
/// 1,000, at most the setting): here about 6,200 rows after the first
/// round, so 2,300 more claimed rows make no round due, and 7,300 make
/// one.
// Break checked: a gap that stays at 1,000, or doubles to 2,000, runs a
// second round within the 2,300 rows and fails the count of one (or, if
// that round had not finished, the final count of two).
#[tokio::test]
async fn after_a_round_the_next_comes_once_the_claimed_rows_match_the_tables_size() {
    let h = Harness::new().await;
    without_autovacuum(&h).await;
    let mut conn = h.conn().await;
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         SELECT 't', 'audit.user.login', '{}', 'DONE', now() FROM generate_series(1, 5000)",
    )
    .await
    .unwrap();
    let events = |from: usize, n: usize| {
        (from..from + n)
            .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
            .collect()
    };
    h.publish(events(0, 1_200)).await;
    let config = DispatcherConfig {
        batch_size: 100,
        ..quick_config()
    };
    let shutdown = CancellationToken::new();
    let handle = h.dispatcher(config).spawn(shutdown.clone());
    let deadline = Duration::from_secs(60);
    h.wait_all_done("the first 1,200 events", deadline).await;
    h.wait_for("the first round", deadline, async || {
        manual_vacuums(&h).await >= 1
    })
    .await;

    h.publish(events(1_200, 2_100)).await;
    h.wait_all_done("2,100 more events", deadline).await;
    // No round is due here, so the count is exact; a smaller gap would have
    // made rounds due within these rows (most of them done by now, and the
    // final count below catches any that were not).
    assert_eq!(
        manual_vacuums(&h).await,
        1,
        "no round before 6,200 claimed rows"
    );

    // 5,000 more: past the gap of about 6,200 with room for the rows that
    // were claimed while the first round ran and for `reltuples` being an
    // estimate (a few hundred either way).
    h.publish(events(3_300, 5_000)).await;
    h.wait_all_done("5,000 more events", deadline).await;
    h.wait_for("the second round", deadline, async || {
        manual_vacuums(&h).await >= 2
    })
    .await;
    // The rows after the second round (about 1,000) stay below the next gap
    // (the table's 13,000 rows): two rounds in all, where a gap of 1,000
    // or 2,000 made several more during the three batches.
    assert_eq!(
        manual_vacuums(&h).await,
        2,
        "one round per gap of the table's size"
    );
    shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// A role of its own that owns nothing: the dispatcher's connections act
/// as it through the URL's `options=-c role=…` (so the server needs no
/// login for it). Dropped with the value, after the test's database, whose
/// grants would otherwise keep it.
struct Role {
    name: String,
}

impl Role {
    async fn create() -> Self {
        let name = format!("outbox_test_role_{}", uuid::Uuid::new_v4().simple());
        let mut admin = outbox_pg::establish(&with_database(&database_server_url(), "postgres"))
            .await
            .unwrap();
        admin
            .batch_execute(&format!("CREATE ROLE {name} NOLOGIN"))
            .await
            .unwrap();
        Self { name }
    }

    /// Lets the role read and write every table of `h`'s database.
    async fn grant(&self, h: &Harness) {
        let name = &self.name;
        h.conn()
            .await
            .batch_execute(&format!(
                "GRANT USAGE ON SCHEMA public TO {name};
                 GRANT ALL ON ALL TABLES IN SCHEMA public TO {name};
                 GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {name};"
            ))
            .await
            .unwrap();
    }

    /// `url` with its sessions acting as this role.
    fn url(&self, url: &str) -> String {
        let joint = if url.contains('?') { '&' } else { '?' };
        format!("{url}{joint}options=-c%20role%3D{}", self.name)
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin_url = with_database(&database_server_url(), "postgres");
        // As the test database's own drop: a thread with its own runtime.
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut admin = outbox_pg::establish(&admin_url).await.unwrap();
                admin
                    .batch_execute(&format!("DROP ROLE IF EXISTS {name}"))
                    .await
                    .unwrap();
            });
        });
        let _ = dropper.join();
    }
}

// Break checked: skipping the check (vacuuming as any role) logs no
// warning, and the wait for it times out (Postgres then skips each VACUUM
// with its own warning, which only the server's log shows).
#[tokio::test]
async fn a_role_that_may_not_vacuum_the_table_gets_one_warning_and_every_event_is_still_handed_off()
{
    let role = Role::create().await;
    let h = Harness::new().await;
    role.grant(&h).await;
    let logs = LogCapture::start();
    let events = (0..120)
        .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
        .collect();
    h.publish(events).await;

    let url = role.url(h.db.url());
    let pool = outbox_pg::connect_pool(&url, 4).await.unwrap();
    let redis = outbox_queue::connect(&RedisSettings::new(h.redis.url())).unwrap();
    let config = DispatcherConfig {
        batch_size: 10,
        vacuum_every: 30,
        ..quick_config()
    };
    let dispatcher = Arc::new(
        Dispatcher::new(
            pool,
            &url,
            redis,
            h.namespace.clone(),
            outbox_catalog::standard_router().unwrap(),
            config,
        )
        .unwrap(),
    );
    let shutdown = CancellationToken::new();
    let handle = dispatcher.spawn(shutdown.clone());
    let deadline = Duration::from_secs(30);
    h.wait_all_done("every event to be handed off", deadline)
        .await;
    let warning = "does not own outbox_event, so the dispatcher cannot vacuum it";
    h.wait_for("the warning that upkeep stops", deadline, async || {
        logs.count(warning) > 0
    })
    .await;

    // The upkeep stopped at its first round: rows claimed after it make
    // no round due, so the warning is not repeated, and nothing vacuumed.
    let more = (0..120)
        .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "more": n })))
        .collect();
    h.publish(more).await;
    h.wait_all_done("the second batch to be handed off", deadline)
        .await;
    assert_eq!(logs.count(warning), 1, "{}", logs.text());
    assert_eq!(manual_vacuums(&h).await, 0);
    shutdown.cancel();
    handle.await.unwrap().unwrap();
}
