//! The test harness itself: isolation between tests is what lets the suite
//! run in parallel, so it is tested like any other feature.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

use diesel::sql_types::BigInt;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use outbox_test_support::{
    TestDatabase, TestRedis, database_server_url, sweep_abandoned_databases,
    sweep_abandoned_namespaces, with_database,
};
use redis::AsyncCommands;

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn database_count(name: &str) -> i64 {
    let mut admin = outbox_pg::establish(&with_database(&database_server_url(), "postgres"))
        .await
        .unwrap();
    diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
        .bind::<diesel::sql_types::Text, _>(name)
        .get_result::<Count>(&mut admin)
        .await
        .unwrap()
        .n
}

#[tokio::test]
async fn each_test_database_is_isolated_and_dropped() {
    let a = TestDatabase::new().await;
    let b = TestDatabase::new().await;
    assert_ne!(a.name(), b.name());
    let mut conn_a = a.conn().await;
    conn_a
        .batch_execute("INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('t', 'audit.a.b', '{}')")
        .await
        .unwrap();
    let mut conn_b = b.conn().await;
    let in_b: Count = diesel::sql_query("SELECT count(*) AS n FROM outbox_event")
        .get_result(&mut conn_b)
        .await
        .unwrap();
    assert_eq!(
        in_b.n, 0,
        "a row written in one test database is not seen in another"
    );

    let name = a.name().to_owned();
    assert_eq!(database_count(&name).await, 1);
    drop(conn_a);
    drop(a);
    assert_eq!(
        database_count(&name).await,
        0,
        "dropping the handle drops the database"
    );
}

#[tokio::test]
async fn redis_namespace_is_unique_and_cleaned_up() {
    let a = TestRedis::new().await;
    let b = TestRedis::new().await;
    assert_ne!(a.prefix(), b.prefix());
    let mut conn = a.conn().await;
    let _: () = conn.set(a.key("one"), 1).await.unwrap();
    let _: () = conn.set(a.key("two"), 2).await.unwrap();
    assert_eq!(a.keys().await, vec![a.key("one"), a.key("two")]);
    assert!(b.keys().await.is_empty(), "namespaces do not overlap");

    let probe = a.key("one");
    drop(a);
    let exists: bool = conn.exists(&probe).await.unwrap();
    assert!(!exists, "dropping the namespace deletes its keys");
}

/// The keys of test namespaces whose process was killed (no liveness key
/// any more) are removed: by a new namespace in the background, at most
/// once a minute per server, and by an explicit sweep (`cargo xtask test`
/// runs one first); live namespaces are kept. One test, so that no other
/// test's explicit sweep can stand in for the background one.
#[tokio::test]
async fn namespaces_left_by_killed_tests_are_swept_and_live_ones_are_kept() {
    let live = TestRedis::new().await;
    let mut conn = live.conn().await;
    let _: () = conn.set(live.key("job"), 1).await.unwrap();
    // What a test process killed mid-run leaves: keys under its namespace,
    // and no liveness key any more (it expired when the renewals stopped).
    let abandon = async |conn: &mut outbox_queue::RedisConnection, n: usize| {
        let prefix = format!("outbox-test:{}:", uuid::Uuid::new_v4().simple());
        for i in 0..n {
            let _: () = conn.set(format!("{prefix}q:data:{i}"), i).await.unwrap();
        }
        prefix
    };
    let left = async |conn: &mut outbox_queue::RedisConnection, prefix: &str| {
        let keys: Vec<String> = conn.keys(format!("{prefix}*")).await.unwrap();
        keys.len()
    };

    let first = abandon(&mut conn, 10).await;
    // The once-a-minute lock released, as when the last sweep is over a
    // minute old: the next namespace (this one or another test's) sweeps.
    let _: () = conn.del("outbox-test-sweep").await.unwrap();
    let _next = TestRedis::new().await;
    outbox_test_support::eventually(
        "the abandoned namespace to be swept in the background",
        std::time::Duration::from_secs(30),
        async || left(&mut conn, &first).await == 0,
    )
    .await;

    let second = abandon(&mut conn, 1500).await;
    sweep_abandoned_namespaces(live.url()).unwrap();
    assert_eq!(left(&mut conn, &second).await, 0);
    assert_eq!(
        live.keys().await,
        vec![live.key("job")],
        "a live namespace is kept"
    );
}

#[tokio::test]
async fn an_old_test_database_nobody_uses_is_dropped_and_a_used_or_recent_one_is_kept() {
    let server = database_server_url();
    let mut admin = outbox_pg::establish(&with_database(&server, "postgres"))
        .await
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let id = || uuid::Uuid::new_v4().simple().to_string();
    // Left by a test killed two hours ago.
    let abandoned = format!("outbox_test_{}_{}", now - 7_200, id());
    // Two hours old too, but a session is still connected to it.
    let in_use = format!("outbox_test_{}_{}", now - 7_200, id());
    // Created a minute ago, no session yet (a test about to connect).
    let recent = format!("outbox_test_{}_{}", now - 60, id());
    for name in [&abandoned, &in_use, &recent] {
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
    }
    let user = outbox_pg::establish(&with_database(&server, &in_use))
        .await
        .unwrap();
    let live = TestDatabase::new().await;

    let dropped = sweep_abandoned_databases(&server, std::time::Duration::from_secs(3_600))
        .await
        .unwrap();

    assert!(dropped.contains(&abandoned), "{dropped:?}");
    assert_eq!(database_count(&abandoned).await, 0);
    for kept in [&in_use, &recent, &live.name().to_owned()] {
        assert!(!dropped.contains(kept), "{kept} dropped: {dropped:?}");
        assert_eq!(database_count(kept).await, 1, "{kept} is gone");
    }
    drop(user);
    // `IF EXISTS`: once its user is gone, `in_use` is an old database
    // nobody uses, which a sweep running at the same time (another
    // `cargo xtask test` on the same server) may drop first.
    for name in [&in_use, &recent] {
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await
            .unwrap();
    }
}

/// A template left by other migrations (each change of the migrations
/// builds a new one) goes; the template of these migrations stays, and new
/// test databases are still cloned from it.
// Break checked: the template sweep left out (only test databases dropped)
// keeps the old template and fails here.
#[tokio::test]
async fn a_template_of_other_migrations_is_dropped_and_the_current_one_is_kept() {
    let server = database_server_url();
    // Makes sure the current template exists.
    let before = TestDatabase::new().await;
    let mut admin = outbox_pg::establish(&with_database(&server, "postgres"))
        .await
        .unwrap();
    let old = format!("outbox_tpl_{}", uuid::Uuid::new_v4().simple());
    admin
        .batch_execute(&format!("CREATE DATABASE \"{old}\" IS_TEMPLATE true"))
        .await
        .unwrap();

    // Test databases of any age are left to the other sweeping test, whose
    // old database this sweep would otherwise drop first.
    let forever = std::time::Duration::from_secs(u64::from(u32::MAX));
    sweep_abandoned_databases(&server, forever).await.unwrap();

    assert_eq!(database_count(&old).await, 0, "{old} is still there");
    let current = format!("outbox_tpl_{}", outbox_model::schema_fingerprint());
    assert_eq!(database_count(&current).await, 1, "{current} is gone");
    let after = TestDatabase::new().await;
    assert_eq!(database_count(after.name()).await, 1);
    drop(before);
}
