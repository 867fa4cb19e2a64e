//! Reads of handed-off rows: the reconciliation's pages and the safe-point scan.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::{DateTime, TimeDelta, Utc};
use common::{database, insert_with, now, row};
use diesel_async::AsyncPgConnection;
use outbox_store::{done_rows_after, done_rows_between, first_handed_off};
use uuid::Uuid;

/// Three DONE rows of `outbox.mail` handed off 3, 2 and 1 minutes ago, and
/// one of `outbox.audit` and one FAILED row of `outbox.mail` in between;
/// the mail rows' ids, in hand-off order.
async fn handed_off(conn: &mut AsyncPgConnection) -> Vec<Uuid> {
    let mut mail = Vec::new();
    for minutes in [3, 2, 1] {
        mail.push(
            insert_with(
                conn,
                &format!(
                    "status = 'DONE', target_queue = 'outbox.mail', \
                     processed_at = now() - interval '{minutes} minutes'"
                ),
            )
            .await,
        );
    }
    insert_with(
        conn,
        "status = 'DONE', target_queue = 'outbox.audit', processed_at = now() - interval '2 minutes'",
    )
    .await;
    insert_with(
        conn,
        "status = 'FAILED', target_queue = 'outbox.mail', processed_at = now() - interval '2 minutes'",
    )
    .await;
    mail
}

fn ids(rows: Vec<outbox_model::OutboxEvent>) -> Vec<Uuid> {
    rows.into_iter().map(|e| e.id).collect()
}

#[tokio::test]
async fn done_rows_after_pages_through_a_queues_hand_offs_in_order() {
    let (_db, mut conn) = database().await;
    let mail = handed_off(&mut conn).await;
    let start = (DateTime::<Utc>::UNIX_EPOCH, Uuid::nil());

    let first = done_rows_after(&mut conn, "outbox.mail", start, 2)
        .await
        .unwrap();
    let last = first.last().unwrap();
    let cursor = (last.processed_at.unwrap(), last.id);
    let second = done_rows_after(&mut conn, "outbox.mail", cursor, 2)
        .await
        .unwrap();

    assert_eq!(ids(first), mail[..2]);
    assert_eq!(ids(second), mail[2..]);
}

#[tokio::test]
async fn done_rows_between_stops_before_its_bound() {
    let (_db, mut conn) = database().await;
    let mail = handed_off(&mut conn).await;
    let start = (DateTime::<Utc>::UNIX_EPOCH, Uuid::nil());
    let bound = row(&mut conn, mail[2]).await.processed_at.unwrap();

    let rows = done_rows_between(&mut conn, "outbox.mail", start, bound, 10)
        .await
        .unwrap();

    assert_eq!(ids(rows), mail[..2]);
}

#[tokio::test]
async fn first_handed_off_is_the_earliest_hand_off_of_the_given_rows_from_a_time_on() {
    let (_db, mut conn) = database().await;
    let mail = handed_off(&mut conn).await;
    let two_and_a_half_minutes_ago = now(&mut conn).await - TimeDelta::seconds(150);

    let first = first_handed_off(&mut conn, "outbox.mail", &mail, two_and_a_half_minutes_ago)
        .await
        .unwrap();

    assert_eq!(first, row(&mut conn, mail[1]).await.processed_at);
    let none = first_handed_off(
        &mut conn,
        "outbox.audit",
        &mail,
        DateTime::<Utc>::UNIX_EPOCH,
    )
    .await
    .unwrap();
    assert_eq!(none, None, "not rows of that queue");
    assert_eq!(
        first_handed_off(&mut conn, "outbox.mail", &[], DateTime::<Utc>::UNIX_EPOCH)
            .await
            .unwrap(),
        None
    );
}
