//! Shared fixtures of the store's tests: a migrated database per test, rows
//! written through the store's own insert, rows put into a chosen state by
//! plain SQL (what another dispatcher or an operator would have left), and
//! the row as a caller reads it back.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use chrono::{DateTime, Utc};
use diesel_async::{
    AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
    TransactionManager,
};
use outbox_model::{NewOutboxEventRow, OutboxEvent};
use outbox_test_support::TestDatabase;
use uuid::Uuid;

/// A fresh database cloned from the migrated template, and a connection to it.
pub async fn database() -> (TestDatabase, AsyncPgConnection) {
    outbox_test_support::init_tracing();
    let db = TestDatabase::new().await;
    let conn = db.conn().await;
    (db, conn)
}

/// A row of `event_type` for tenant `acme`, due now, without a dispatch key.
pub fn new_row(event_type: &str) -> NewOutboxEventRow {
    NewOutboxEventRow {
        id: Uuid::now_v7(),
        tenant_id: "acme".to_owned(),
        event_type: event_type.to_owned(),
        payload: serde_json::json!({}),
        dispatch_key: None,
        scheduled_at: None,
        traceparent: None,
        tracestate: None,
        dedupe_for: None,
        dedupe_while_pending: false,
        replace_pending: false,
        priority: outbox_model::Priority::NORMAL,
        ordering_key: None,
    }
}

/// Inserts a due row of `event_type` through the store; returns its id.
pub async fn insert(conn: &mut AsyncPgConnection, event_type: &str) -> Uuid {
    insert_row(conn, new_row(event_type)).await
}

/// Inserts `row` through the store; returns its id.
pub async fn insert_row(conn: &mut AsyncPgConnection, row: NewOutboxEventRow) -> Uuid {
    match outbox_store::insert_event(conn, &row).await.unwrap() {
        outbox_store::Inserted::New(id) => id,
        other => panic!("expected a new row, got {other:?}"),
    }
}

/// Inserts `n` due rows of `audit.user.login`, oldest first: each one's
/// `created_at` and `scheduled_at` a second after the one before.
pub async fn insert_due(conn: &mut AsyncPgConnection, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = insert(conn, "audit.user.login").await;
        let age = n - i;
        set(
            conn,
            id,
            &format!(
                "created_at = now() - interval '{age} seconds', \
                 scheduled_at = now() - interval '{age} seconds'"
            ),
        )
        .await;
        ids.push(id);
    }
    ids
}

/// Runs `UPDATE outbox_event SET <assignments> WHERE id = <id>`: a fixture
/// that puts a row into the state a test starts from.
pub async fn set(conn: &mut AsyncPgConnection, id: Uuid, assignments: &str) {
    conn.batch_execute(&format!(
        "UPDATE outbox_event SET {assignments} WHERE id = '{id}'"
    ))
    .await
    .unwrap();
}

/// Inserts a row and puts it into the state of `assignments` (see [`set`]).
pub async fn insert_with(conn: &mut AsyncPgConnection, assignments: &str) -> Uuid {
    let id = insert(conn, "audit.user.login").await;
    set(conn, id, assignments).await;
    id
}

/// The row `id` as the store reads it.
pub async fn row(conn: &mut AsyncPgConnection, id: Uuid) -> OutboxEvent {
    outbox_store::event(conn, id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no row {id}"))
}

/// Postgres' clock, which every time the store writes comes from.
pub async fn now(conn: &mut AsyncPgConnection) -> DateTime<Utc> {
    outbox_store::db_now(conn).await.unwrap()
}

/// `ids`, sorted: for comparing sets of ids.
pub fn sorted(mut ids: Vec<Uuid>) -> Vec<Uuid> {
    ids.sort();
    ids
}

/// A connection whose open transaction holds the rows `ids` locked (`FOR
/// UPDATE`), as another dispatcher's or an operator's statement would,
/// until the connection is dropped.
pub async fn holding(db: &TestDatabase, ids: &[Uuid]) -> AsyncPgConnection {
    let mut holder = db.conn().await;
    AnsiTransactionManager::begin_transaction(&mut holder)
        .await
        .unwrap();
    diesel::sql_query("SELECT id FROM outbox_event WHERE id = ANY($1) FOR UPDATE")
        .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(ids)
        .execute(&mut holder)
        .await
        .unwrap();
    holder
}

/// Whether a session of this test's database waits for a lock.
pub async fn someone_waits_for_a_lock(conn: &mut AsyncPgConnection) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let row: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .get_result(conn)
    .await
    .unwrap();
    row.n > 0
}
