//! The sweeps that remove what killed test processes left behind, on the
//! real servers: a swept Redis namespace or Postgres database is one whose
//! test is gone, and a live test's keys and database are never touched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::sql_types::{Bool, Text};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use outbox_test_support::{
    TestDatabase, TestRedis, database_server_url, sweep_abandoned_databases,
    sweep_abandoned_namespaces, with_database,
};
use redis::AsyncCommands;

#[tokio::test]
async fn keys_of_a_namespace_without_liveness_key_are_swept_and_a_live_namespace_keeps_its_own() {
    let live = TestRedis::new().await;
    let mut conn = live.conn().await;
    let _: () = conn.set(live.key("kept"), "1").await.unwrap();
    // What a killed test leaves: keys under a namespace whose liveness key
    // is gone.
    let killed = format!("outbox-test:{}:", uuid::Uuid::new_v4().simple());
    for name in ["jobs", "done", "meta"] {
        let _: () = conn.set(format!("{killed}{name}"), "x").await.unwrap();
    }

    let swept = sweep_abandoned_namespaces(live.url()).unwrap();

    let left: Vec<String> = conn.keys(format!("{killed}*")).await.unwrap();
    assert!(left.is_empty(), "abandoned keys left: {left:?}");
    // Other suites on the server may have left namespaces too: at least ours.
    assert!(swept.namespaces >= 1 && swept.keys >= 3, "{swept:?}");
    assert_eq!(live.keys().await, vec![live.key("kept")]);
}

#[derive(diesel::QueryableByName)]
struct Exists {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

async fn database_exists(admin: &mut diesel_async::AsyncPgConnection, name: &str) -> bool {
    diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS exists")
        .bind::<Text, _>(name)
        .get_result::<Exists>(admin)
        .await
        .unwrap()
        .exists
}

#[tokio::test]
async fn an_old_test_database_nobody_uses_is_dropped_and_a_used_or_recent_one_is_kept() {
    let server = database_server_url();
    let admin_url = with_database(&server, "postgres");
    let mut admin = outbox_model::establish(&admin_url).await.unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
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
    let user = outbox_model::establish(&with_database(&server, &in_use))
        .await
        .unwrap();
    // A live test's database.
    let live = TestDatabase::new().await;

    let dropped = sweep_abandoned_databases(&server, Duration::from_secs(3_600))
        .await
        .unwrap();

    assert!(dropped.contains(&abandoned), "{dropped:?}");
    assert!(!database_exists(&mut admin, &abandoned).await);
    for kept in [&in_use, &recent] {
        assert!(!dropped.contains(kept), "{kept} dropped: {dropped:?}");
        assert!(database_exists(&mut admin, kept).await, "{kept} is gone");
    }
    assert!(database_exists(&mut admin, live.name()).await);
    drop(user);
    for name in [&in_use, &recent] {
        admin
            .batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
            .await
            .unwrap();
    }
}
