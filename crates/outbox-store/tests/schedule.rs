//! The periodic events' table: a schedule's row advances only forward, one
//! of several racing transactions advances it to a tick, and the first
//! start's anchor never moves a row that exists.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::{DateTime, Utc};
use common::database;
use diesel_async::AsyncConnection;
use outbox_store::{advance_schedule, anchor_schedule, schedule_row, schedule_rows};

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
}

#[tokio::test]
async fn a_schedule_advances_only_to_a_later_tick() {
    let (_db, mut conn) = database().await;
    assert!(schedule_row(&mut conn, "nightly").await.unwrap().is_none());

    assert!(
        advance_schedule(&mut conn, "nightly", at(10))
            .await
            .unwrap()
    );
    assert!(
        !advance_schedule(&mut conn, "nightly", at(10))
            .await
            .unwrap()
    );
    assert!(!advance_schedule(&mut conn, "nightly", at(5)).await.unwrap());
    assert!(
        advance_schedule(&mut conn, "nightly", at(20))
            .await
            .unwrap()
    );

    let row = schedule_row(&mut conn, "nightly").await.unwrap().unwrap();
    assert_eq!((row.name.as_str(), row.last_tick), ("nightly", at(20)));
}

#[tokio::test]
async fn an_anchor_is_written_once_and_never_moves_a_row() {
    let (_db, mut conn) = database().await;
    assert!(anchor_schedule(&mut conn, "hourly", at(100)).await.unwrap());
    assert!(!anchor_schedule(&mut conn, "hourly", at(200)).await.unwrap());
    assert!(!anchor_schedule(&mut conn, "hourly", at(50)).await.unwrap());
    advance_schedule(&mut conn, "daily", at(7)).await.unwrap();

    let rows = schedule_rows(&mut conn).await.unwrap();
    let rows: Vec<_> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.last_tick))
        .collect();
    assert_eq!(rows, [("daily", at(7)), ("hourly", at(100))]);
}

#[tokio::test]
async fn of_concurrent_transactions_advancing_to_one_tick_exactly_one_advances() {
    let (db, mut conn) = database().await;
    advance_schedule(&mut conn, "race", at(0)).await.unwrap();
    let tick = at(60);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let mut conn = db.conn().await;
        tasks.push(tokio::spawn(async move {
            conn.transaction::<_, outbox_store::StoreError, _>(async |conn| {
                let advanced = advance_schedule(conn, "race", tick).await?;
                // Hold the row a moment, as the publishing insert would.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                Ok(advanced)
            })
            .await
            .unwrap()
        }));
    }
    let mut advanced = 0;
    for task in tasks {
        advanced += usize::from(task.await.unwrap());
    }
    assert_eq!(advanced, 1);
    let row = schedule_row(&mut conn, "race").await.unwrap().unwrap();
    assert_eq!(row.last_tick, tick);
}
