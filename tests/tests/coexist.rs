//! The outbox's migrations next to an application's own diesel migrations
//! (`tests/fixtures/app_migrations`, an `orders` table): both share
//! `__diesel_schema_migrations`, in either order, and neither sees the
//! other's as pending.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

use diesel::Connection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};
use outbox_test_support::TestDatabase;

const APP_MIGRATIONS: EmbeddedMigrations = embed_migrations!("fixtures/app_migrations");

/// Applies the application's migrations to `url`; returns how many ran,
/// then how many the application still sees pending.
async fn app_migrate(url: &str) -> (usize, usize) {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut conn =
            <AsyncConnectionWrapper<AsyncPgConnection> as Connection>::establish(&url).unwrap();
        let ran = conn.run_pending_migrations(APP_MIGRATIONS).unwrap().len();
        let pending = conn.pending_migrations(APP_MIGRATIONS).unwrap().len();
        (ran, pending)
    })
    .await
    .unwrap()
}

/// Both schemas are usable: the application's table and the outbox's.
async fn both_tables_answer(url: &str) {
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    conn.batch_execute(
        "INSERT INTO orders (id) VALUES (1);
         INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('t', 'webhook.order.shipped', '{\"orderId\": 1}');",
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn application_migrations_after_the_outbox_s_coexist() {
    let db = TestDatabase::new().await; // the outbox's migrations applied
    assert_eq!(app_migrate(db.url()).await, (1, 0));
    assert!(
        outbox_model::run_migrations(db.conn().await)
            .await
            .unwrap()
            .is_empty()
    );
    both_tables_answer(db.url()).await;
}

#[tokio::test]
async fn the_outbox_s_migrations_after_the_application_s_coexist() {
    let db = TestDatabase::new().await;
    // An empty database next to the test's own, on the same server.
    let name = format!("{}_blank", db.name());
    let url = outbox_test_support::with_database(db.url(), &name);
    let mut admin = db.conn().await;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    assert_eq!(app_migrate(&url).await, (1, 0));
    let conn = outbox_pg::establish(&url).await.unwrap();
    assert!(!outbox_model::run_migrations(conn).await.unwrap().is_empty());
    assert_eq!(app_migrate(&url).await, (0, 0));
    both_tables_answer(&url).await;
    admin
        .batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .await
        .unwrap();
}
