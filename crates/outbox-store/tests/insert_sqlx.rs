//! The publisher's statements on sqlx (feature `sqlx`) write what the
//! diesel ones write: the same rows, column for column, one at a time and
//! in a batch, and the same answer for a dispatch key already held.

#![cfg(feature = "sqlx")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::{DateTime, Utc};
use diesel::pg::data_types::PgInterval;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::outbox_event;
use outbox_model::{NewOutboxEventRow, OutboxEvent};
use outbox_store::{ErrorKind, Inserted, StoreError};
use outbox_test_support::TestDatabase;
use sqlx::Connection as _;

/// Rows with every optional column absent and present (both dedupe
/// windows among them), and a dispatch key repeated (the second of the
/// pair is skipped).
fn rows() -> Vec<NewOutboxEventRow> {
    let later = DateTime::parse_from_rfc3339("2031-05-06T07:08:09.123456Z")
        .unwrap()
        .with_timezone(&Utc);
    let base = common::new_row("audit.user.login");
    let row = |f: &dyn Fn(&mut NewOutboxEventRow)| {
        let mut row = NewOutboxEventRow {
            id: uuid::Uuid::now_v7(),
            ..base.clone()
        };
        f(&mut row);
        row
    };
    vec![
        row(&|_| {}),
        row(&|r| {
            r.tenant_id = "tenant-2".to_owned();
            r.event_type = "mail.user.welcome".to_owned();
            r.payload = serde_json::json!({ "n": 1.5, "s": "é\u{1F600}", "a": [null, true, {}] });
            r.dispatch_key = Some("key-1".to_owned());
            r.scheduled_at = Some(later);
            r.traceparent =
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned());
            r.tracestate = Some("vendor=x".to_owned());
            r.dedupe_for = Some(PgInterval::from_microseconds(90_000_000));
            r.priority = outbox_model::Priority::HIGHEST;
        }),
        row(&|r| r.dispatch_key = Some("key-1".to_owned())),
        row(&|r| r.traceparent = Some("not a traceparent".to_owned())),
        row(&|r| {
            r.dispatch_key = Some("key-2".to_owned());
            r.dedupe_while_pending = true;
        }),
    ]
}

async fn stored(conn: &mut AsyncPgConnection) -> Vec<OutboxEvent> {
    outbox_event::table
        .order(outbox_event::id)
        .select(OutboxEvent::as_select())
        .load(conn)
        .await
        .unwrap()
}

/// The rows as both drivers must have written them: an absent schedule is
/// the transaction's `now()`, so it equals `created_at`, and that instant
/// (which differs between the two databases) is set aside.
fn comparable(mut events: Vec<OutboxEvent>) -> Vec<OutboxEvent> {
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    for event in &mut events {
        if event.scheduled_at == event.created_at {
            event.scheduled_at = epoch;
        }
        event.created_at = epoch;
    }
    events
}

async fn sqlx_conn(db: &TestDatabase) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(db.url()).await.unwrap()
}

#[tokio::test]
async fn one_at_a_time_both_drivers_write_the_same_rows_and_answer_the_same() {
    let rows = rows();
    let (_diesel_db, mut diesel) = common::database().await;
    let sqlx_db = TestDatabase::new().await;
    let mut sqlx = sqlx_conn(&sqlx_db).await;

    let by_diesel = diesel
        .transaction::<_, StoreError, _>(async |conn| {
            let mut answers = Vec::new();
            for row in &rows {
                answers.push(outbox_store::insert_event(conn, row).await?);
            }
            Ok(answers)
        })
        .await
        .unwrap();
    let mut tx = sqlx.begin().await.unwrap();
    let mut by_sqlx = Vec::new();
    for row in &rows {
        by_sqlx.push(
            outbox_store::sqlx::insert_event(&mut tx, row)
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();

    assert_eq!(by_sqlx, by_diesel);
    assert_eq!(by_sqlx[2], Inserted::Existing(rows[1].id));
    let written = stored(&mut diesel).await;
    assert_eq!(written.len(), 4, "the repeated dispatch key is skipped");
    assert_eq!(
        comparable(stored(&mut sqlx_db.conn().await).await),
        comparable(written)
    );
}

#[tokio::test]
async fn in_a_batch_both_drivers_write_the_same_rows() {
    let rows = rows();
    let (_diesel_db, mut diesel) = common::database().await;
    let sqlx_db = TestDatabase::new().await;
    let mut sqlx = sqlx_conn(&sqlx_db).await;

    let by_diesel = outbox_store::insert_events(&diesel, &rows).await.unwrap();
    let by_sqlx = outbox_store::sqlx::insert_events(&mut sqlx, &rows)
        .await
        .unwrap();

    assert_eq!(by_sqlx, by_diesel);
    assert!(
        !by_sqlx.contains(&rows[2].id),
        "the first event of a batch with a dispatch key wins"
    );
    let keys = ["key-1", "key-unknown"];
    assert_eq!(
        outbox_store::sqlx::dispatch_key_holders(&mut sqlx, &keys)
            .await
            .unwrap(),
        outbox_store::dispatch_key_holders(&diesel, &keys)
            .await
            .unwrap()
    );
    assert_eq!(
        comparable(stored(&mut sqlx_db.conn().await).await),
        comparable(stored(&mut diesel).await)
    );
}

/// Each form of the sqlx insert is prepared once per connection: a publish
/// is one round trip, as with diesel.
#[tokio::test]
async fn the_sqlx_statements_stay_prepared_on_the_connection() {
    let db = TestDatabase::new().await;
    let mut conn = sqlx_conn(&db).await;
    for _ in 0..3 {
        for row in &rows() {
            outbox_store::sqlx::insert_event(&mut conn, row)
                .await
                .unwrap();
        }
        outbox_store::sqlx::insert_events(&mut conn, &rows()[..1])
            .await
            .unwrap();
    }
    let prepared: Vec<String> = sqlx::query_scalar(
        "SELECT statement FROM pg_prepared_statements WHERE statement LIKE 'INSERT%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut expected = vec![
        outbox_store::INSERT_EVENT_SQL.to_owned(),
        outbox_store::INSERT_EVENTS_SQL.to_owned(),
    ];
    expected.sort();
    let mut prepared = prepared;
    prepared.sort();
    assert_eq!(prepared, expected);
}

/// What Postgres refuses on the sqlx path has the kind callers match, as
/// on the diesel path.
#[tokio::test]
async fn a_refused_sqlx_insert_has_the_kind_callers_match() {
    let db = TestDatabase::new().await;
    let mut conn = sqlx_conn(&db).await;
    let row = common::new_row("audit.user.login");
    outbox_store::sqlx::insert_event(&mut conn, &row)
        .await
        .unwrap();

    let same_id = outbox_store::sqlx::insert_event(&mut conn, &row)
        .await
        .unwrap_err();
    assert_eq!(same_id.kind(), ErrorKind::UniqueViolation, "{same_id}");
    let bad_type =
        outbox_store::sqlx::insert_event(&mut conn, &common::new_row("Audit.user.login"))
            .await
            .unwrap_err();
    assert_eq!(
        bad_type.kind(),
        ErrorKind::ConstraintViolation,
        "{bad_type}"
    );
    let not_found = StoreError::from(sqlx::Error::RowNotFound);
    assert_eq!(not_found.kind(), ErrorKind::NotFound);
}
