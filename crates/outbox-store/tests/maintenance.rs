//! The upkeep of the table: vacuum rounds and what they look up first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, insert_due};
use diesel_async::SimpleAsyncConnection;
use outbox_store::{may_vacuum, table_rows, vacuum, vacuum_analyze};

#[tokio::test]
async fn after_a_vacuum_analyze_the_catalog_counts_the_tables_rows() {
    let (_db, mut conn) = database().await;
    insert_due(&mut conn, 3).await;

    vacuum(&mut conn).await.unwrap();
    vacuum_analyze(&mut conn).await.unwrap();

    assert_eq!(table_rows(&mut conn).await.unwrap(), 3.0);
}

#[tokio::test]
async fn only_a_superuser_or_a_member_of_the_owner_role_may_vacuum() {
    let (_db, mut conn) = database().await;
    assert!(may_vacuum(&mut conn).await.unwrap(), "the test's superuser");

    let role = format!("outbox_store_test_{}", uuid::Uuid::new_v4().simple());
    conn.batch_execute(&format!("CREATE ROLE {role} NOLOGIN; SET ROLE {role}"))
        .await
        .unwrap();
    let stranger = may_vacuum(&mut conn).await;
    conn.batch_execute(&format!("RESET ROLE; DROP ROLE {role}"))
        .await
        .unwrap();

    assert!(
        !stranger.unwrap(),
        "a role that neither owns nor is a superuser"
    );
}
