//! Retention: batches that delete old DONE rows and nothing else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, holding, insert_with, row, sorted};
use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::{list_events, purge_done_batch};
use uuid::Uuid;

const ONE_DAY_SECS: f64 = 86_400.0;

#[tokio::test]
async fn retention_deletes_only_done_rows_handed_off_before_the_cut_off() {
    let (_db, mut conn) = database().await;
    let old_done = [
        insert_with(
            &mut conn,
            "status = 'DONE', processed_at = now() - interval '3 days'",
        )
        .await,
        insert_with(
            &mut conn,
            "status = 'DONE', processed_at = now() - interval '2 days'",
        )
        .await,
    ];
    let kept = [
        insert_with(&mut conn, "status = 'DONE', processed_at = now() - interval '1 hour'").await,
        insert_with(&mut conn, "status = 'DONE', processed_at = NULL, created_at = now() - interval '9 days'").await,
        insert_with(&mut conn, "status = 'FAILED', processed_at = now() - interval '9 days', failed_at = now() - interval '9 days'").await,
        insert_with(&mut conn, "status = 'CANCELLED', processed_at = now() - interval '9 days'").await,
        insert_with(&mut conn, "processed_at = now() - interval '9 days', created_at = now() - interval '9 days'").await,
    ];

    let newest_old = row(&mut conn, old_done[1]).await.processed_at;

    let batch = purge_done_batch(&mut conn, ONE_DAY_SECS, 100, None)
        .await
        .unwrap();

    assert_eq!(batch.deleted, 2);
    assert_eq!(
        batch.last_processed_at, newest_old,
        "where the next batch starts"
    );
    assert_eq!(remaining(&mut conn).await, sorted(kept.to_vec()));
}

#[tokio::test]
async fn a_batch_deletes_the_oldest_rows_up_to_its_limit_and_the_next_starts_where_it_ended() {
    let (_db, mut conn) = database().await;
    let mut ids = Vec::new();
    for days in [4, 3, 2] {
        let assignments = format!("status = 'DONE', processed_at = now() - interval '{days} days'");
        ids.push(insert_with(&mut conn, &assignments).await);
    }

    let first = purge_done_batch(&mut conn, ONE_DAY_SECS, 2, None)
        .await
        .unwrap();
    assert_eq!(first.deleted, 2);
    assert_eq!(remaining(&mut conn).await, [ids[2]]);

    let next = purge_done_batch(&mut conn, ONE_DAY_SECS, 2, first.last_processed_at)
        .await
        .unwrap();
    assert_eq!(next.deleted, 1);
    assert!(remaining(&mut conn).await.is_empty());
    let last = purge_done_batch(&mut conn, ONE_DAY_SECS, 2, next.last_processed_at)
        .await
        .unwrap();
    assert_eq!((last.deleted, last.last_processed_at), (0, None));
}

#[tokio::test]
async fn retention_skips_done_rows_another_transaction_holds() {
    let (db, mut conn) = database().await;
    let held = insert_with(
        &mut conn,
        "status = 'DONE', processed_at = now() - interval '3 days'",
    )
    .await;
    let free = insert_with(
        &mut conn,
        "status = 'DONE', processed_at = now() - interval '2 days'",
    )
    .await;
    let holder = holding(&db, &[held]).await;

    let batch = purge_done_batch(&mut conn, ONE_DAY_SECS, 100, None)
        .await
        .unwrap();

    assert_eq!(batch.deleted, 1);
    drop(holder);
    assert_eq!(remaining(&mut conn).await, [held]);
    assert!(
        outbox_store::event(&mut conn, free)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(row(&mut conn, held).await.status, OutboxStatus::Done);
}

/// The ids of every row left, sorted.
async fn remaining(conn: &mut AsyncPgConnection) -> Vec<Uuid> {
    let rows = list_events(conn, &Default::default(), 1_000).await.unwrap();
    sorted(rows.into_iter().map(|e| e.id).collect())
}
