//! The publisher's inserts: rows due at once or later, and dispatch keys
//! that keep a second row with the same key out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, insert_row, new_row, now, row};
use outbox_model::{NewOutboxEventRow, OutboxStatus};
use outbox_store::{
    ErrorKind, Inserted, claim, dispatch_key_holders, insert_event, insert_events, list_events,
};

fn keyed(key: &str) -> NewOutboxEventRow {
    NewOutboxEventRow {
        dispatch_key: Some(key.to_owned()),
        ..new_row("mail.user.welcome")
    }
}

#[tokio::test]
async fn an_inserted_row_is_pending_and_due_at_once_unless_scheduled_later() {
    let (_db, mut conn) = database().await;
    let at_once = insert_row(&mut conn, new_row("audit.user.login")).await;
    let in_an_hour = now(&mut conn).await + chrono::TimeDelta::hours(1);
    let later = insert_row(
        &mut conn,
        NewOutboxEventRow {
            scheduled_at: Some(in_an_hour),
            ..new_row("audit.user.login")
        },
    )
    .await;

    let stored = row(&mut conn, at_once).await;
    assert_eq!((stored.status, stored.retries), (OutboxStatus::Pending, 0));
    assert_eq!(row(&mut conn, later).await.scheduled_at, in_an_hour);
    let claimed = claim(&mut conn, 10, 60_000).await.unwrap();
    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), [at_once]);
}

#[tokio::test]
async fn an_insert_with_a_taken_dispatch_key_writes_nothing_and_returns_the_holder() {
    let (_db, mut conn) = database().await;
    let holder = insert_row(&mut conn, keyed("welcome-7")).await;

    let second = insert_event(&conn, &keyed("welcome-7")).await.unwrap();

    assert_eq!(second, Inserted::Existing(holder));
    let rows = list_events(&mut conn, &Default::default(), 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
}

#[tokio::test]
async fn a_batch_insert_writes_the_rows_whose_dispatch_key_is_free() {
    let (_db, mut conn) = database().await;
    let holder = insert_row(&mut conn, keyed("taken")).await;
    let batch = [keyed("taken"), keyed("free"), new_row("audit.user.login")];

    let written = insert_events(&conn, &batch).await.unwrap();

    assert_eq!(written.len(), 2);
    assert!(written.contains(&batch[1].id) && written.contains(&batch[2].id));
    let holders = dispatch_key_holders(&conn, &["taken", "free", "unknown"])
        .await
        .unwrap();
    assert_eq!(holders.len(), 2);
    assert_eq!(holders["taken"], holder);
    assert_eq!(holders["free"], batch[1].id);
}

#[tokio::test]
async fn a_row_the_table_refuses_fails_as_a_constraint_violation() {
    let (_db, conn) = database().await;

    let error = insert_event(&conn, &new_row("Not A Type"))
        .await
        .unwrap_err();

    assert_eq!(error.kind(), ErrorKind::ConstraintViolation, "{error}");
}
