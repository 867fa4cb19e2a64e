//! The `outbox_event` table as other producers see it: plain SQL, defaults,
//! constraints, and the migrations themselves.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::schema::outbox_event;
use outbox_model::{EventType, OutboxEvent, OutboxStatus};
use outbox_test_support::TestDatabase;
use serde_json::json;

async fn events(conn: &mut AsyncPgConnection) -> Vec<OutboxEvent> {
    outbox_event::table
        .select(OutboxEvent::as_select())
        .load(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn plain_sql_insert_gets_defaults_and_is_a_valid_event() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('tenant-9', 'notification.user.mentioned', '{\"userId\": 7}')",
    )
    .await
    .unwrap();

    let rows = events(&mut conn).await;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.status, OutboxStatus::Pending);
    assert_eq!(row.retries, 0);
    assert_eq!(row.payload.value().unwrap(), json!({ "userId": 7 }));
    assert_eq!(row.id.get_version_num(), 4, "gen_random_uuid() default");
    assert!(row.scheduled_at <= chrono::Utc::now());
    assert_eq!(
        row.scheduled_at, row.created_at,
        "both default to the transaction's now()"
    );
    assert_eq!(
        (&row.dispatch_key, &row.locked_until, &row.processed_at),
        (&None, &None, &None)
    );
    assert!(EventType::parse(row.event_type.clone()).is_ok());
}

#[tokio::test]
async fn table_constraints_reject_what_the_publisher_rejects() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let cases = [
        (
            "'t', 'Mail.user.welcome', '{}'",
            "outbox_event_event_type_check",
        ),
        ("'t', 'mail.welcome', '{}'", "outbox_event_event_type_check"),
        (
            "'t', 'mail..welcome', '{}'",
            "outbox_event_event_type_check",
        ),
        (
            "'t', 'mail.user_x.welcome', '{}'",
            "outbox_event_event_type_check",
        ),
        (
            "'t', 'mail.1user.welcome', '{}'",
            "outbox_event_event_type_check",
        ),
        (
            "'t', 'mail.user.welcome', '[1]'",
            "outbox_event_payload_check",
        ),
        (
            "'', 'mail.user.welcome', '{}'",
            "outbox_event_tenant_id_check",
        ),
    ];
    for (values, constraint) in cases {
        let err = conn
            .batch_execute(&format!(
                "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ({values})"
            ))
            .await
            .expect_err(values);
        assert!(err.to_string().contains(constraint), "{values}: {err}");
    }
    let too_long = format!("a.b.{}", "c".repeat(252));
    let err = conn
        .batch_execute(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('t', '{too_long}', '{{}}')"
        ))
        .await
        .expect_err("256 characters");
    assert!(
        err.to_string().contains("outbox_event_event_type_check"),
        "{err}"
    );

    let bad_status = conn
        .batch_execute(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, status)
             VALUES ('t', 'mail.user.welcome', '{}', 'LOST')",
        )
        .await
        .expect_err("unknown status");
    assert!(
        bad_status.to_string().contains("outbox_event_status_check"),
        "{bad_status}"
    );
    let leaseless = conn
        .batch_execute(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, status)
             VALUES ('t', 'mail.user.welcome', '{}', 'PROCESSING')",
        )
        .await
        .expect_err("PROCESSING without a lease");
    assert!(
        leaseless.to_string().contains("outbox_event_lease_check"),
        "{leaseless}"
    );
    assert!(events(&mut conn).await.is_empty());
}

#[tokio::test]
async fn migrations_are_idempotent_on_a_migrated_database() {
    let db = TestDatabase::new().await;
    let applied = outbox_model::run_migrations(db.conn().await).await.unwrap();
    assert!(
        applied.is_empty(),
        "template was already migrated, got {applied:?}"
    );
}
