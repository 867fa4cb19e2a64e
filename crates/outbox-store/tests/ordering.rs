//! Ordering keys in the table: how the insert trigger numbers the events of
//! a key (dense, in commit order, a second writer waiting for the first
//! one's commit) and how `advance` moves a key on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::NewOutboxEventRow;
use outbox_test_support::{TestDatabase, eventually};
use tokio::task::JoinHandle;
use uuid::Uuid;

use common::{database, new_row};

fn ordered(key: &str) -> NewOutboxEventRow {
    NewOutboxEventRow {
        ordering_key: Some(key.to_owned()),
        ..new_row("audit.order.step")
    }
}

#[derive(diesel::QueryableByName)]
struct Placed {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
    #[diesel(sql_type = BigInt)]
    position: i64,
}

async fn positions(conn: &mut AsyncPgConnection, key: &str) -> BTreeMap<Uuid, i64> {
    let rows: Vec<Placed> = diesel::sql_query(
        "SELECT id, ordering_position AS position FROM outbox_event WHERE ordering_key = $1",
    )
    .bind::<Text, _>(key)
    .load(conn)
    .await
    .unwrap();
    rows.into_iter().map(|r| (r.id, r.position)).collect()
}

/// Two writers of `acct-1`: the first inserted in a transaction still
/// open (its connection and event id), the second inserting in a task that
/// waits for the first one's row lock (this returns once it waits).
async fn two_writers(
    db: &TestDatabase,
    conn: &mut AsyncPgConnection,
) -> (AsyncPgConnection, Uuid, JoinHandle<Uuid>) {
    let mut first = db.conn().await;
    first.batch_execute("BEGIN").await.unwrap();
    let first_id = common::insert_row(&mut first, ordered("acct-1")).await;
    let mut second = db.conn().await;
    let second =
        tokio::spawn(async move { common::insert_row(&mut second, ordered("acct-1")).await });
    eventually(
        "the second writer to wait",
        Duration::from_secs(30),
        async || common::someone_waits_for_a_lock(conn).await,
    )
    .await;
    (first, first_id, second)
}

// What it guards (not break-checked yet): the trigger's upsert replaced by a read of
// max(ordering_position) + 1 without the key row's lock gives two open
// transactions the same position, and fails here.
#[tokio::test]
async fn a_second_writer_of_a_key_waits_for_the_first_ones_commit_and_gets_the_next_position() {
    let (db, mut conn) = database().await;
    let (mut first, first_id, second) = two_writers(&db, &mut conn).await;
    // Another key does not wait.
    let other = common::insert_row(&mut conn, ordered("acct-2")).await;
    assert_eq!(positions(&mut conn, "acct-2").await[&other], 1);
    assert!(
        !second.is_finished(),
        "the second writer went ahead of the first's commit"
    );

    first.batch_execute("COMMIT").await.unwrap();
    let second_id = second.await.unwrap();
    let placed = positions(&mut conn, "acct-1").await;
    assert_eq!(placed[&first_id], 1);
    assert_eq!(placed[&second_id], 2);
}

#[tokio::test]
async fn a_rolled_back_writer_leaves_no_gap_in_its_key() {
    let (db, mut conn) = database().await;
    let (mut first, _, second) = two_writers(&db, &mut conn).await;
    first.batch_execute("ROLLBACK").await.unwrap();
    let second_id = second.await.unwrap();
    let placed = positions(&mut conn, "acct-1").await;
    assert_eq!(placed.len(), 1);
    assert_eq!(
        placed[&second_id], 1,
        "the rolled-back position is given again"
    );
}

#[tokio::test]
async fn concurrent_writers_of_one_key_get_dense_positions_in_each_writer_s_commit_order() {
    const WRITERS: usize = 8;
    const EACH: usize = 40;
    let (db, mut conn) = database().await;
    let mut writers = Vec::new();
    for _ in 0..WRITERS {
        let mut conn = db.conn().await;
        writers.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(EACH);
            for _ in 0..EACH {
                ids.push(common::insert_row(&mut conn, ordered("hot")).await);
            }
            ids
        }));
    }
    let mut written = Vec::new();
    for writer in writers {
        written.push(writer.await.unwrap());
    }
    let placed = positions(&mut conn, "hot").await;
    let mut all: Vec<i64> = placed.values().copied().collect();
    all.sort_unstable();
    let total = i64::try_from(WRITERS * EACH).unwrap();
    assert_eq!(all, (1..=total).collect::<Vec<_>>(), "dense, no duplicate");
    for ids in written {
        let mine: Vec<i64> = ids.iter().map(|id| placed[id]).collect();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "one writer's commits are numbered in their order: {mine:?}"
        );
    }
}

/// The ids one claim takes now.
async fn claim_ids(conn: &mut AsyncPgConnection) -> Vec<Uuid> {
    outbox_store::claim(conn, 100, 60_000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect()
}

#[tokio::test]
async fn only_the_head_of_a_key_is_claimable_and_advance_unblocks_the_next_past_cancelled_ones() {
    let (_db, mut conn) = database().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(common::insert_row(&mut conn, ordered("acct-1")).await);
    }
    let unordered = common::insert(&mut conn, "audit.user.login").await;
    let claimed: Vec<Uuid> = claim_ids(&mut conn).await;
    assert_eq!(claimed.len(), 2);
    assert!(claimed.contains(&ids[0]) && claimed.contains(&unordered));

    // The second event is cancelled while it waits: the key skips it.
    conn.batch_execute(&format!(
        "UPDATE outbox_event SET status = 'CANCELLED' WHERE id = '{}'",
        ids[1]
    ))
    .await
    .unwrap();
    assert!(outbox_store::advance(&mut conn, "acct-1", 1).await.unwrap());
    assert!(
        !outbox_store::advance(&mut conn, "acct-1", 1).await.unwrap(),
        "advance is idempotent"
    );
    assert!(
        outbox_store::is_finished(&mut conn, "acct-1", 2)
            .await
            .unwrap()
    );
    assert!(
        !outbox_store::is_finished(&mut conn, "acct-1", 3)
            .await
            .unwrap()
    );
    let claimed: Vec<Uuid> = claim_ids(&mut conn).await;
    assert_eq!(claimed, [ids[2]]);
}

/// Sets the row `id` to CANCELLED, as `outbox cancel` does.
async fn cancel(conn: &mut AsyncPgConnection, id: Uuid) {
    conn.batch_execute(&format!(
        "UPDATE outbox_event SET status = 'CANCELLED' WHERE id = '{id}'"
    ))
    .await
    .unwrap();
}

/// Requeues the CANCELLED row `id`, as `outbox requeue` does.
async fn requeue_cancelled(conn: &mut AsyncPgConnection, id: Uuid) {
    let requeued = outbox_store::requeue(
        conn,
        outbox_store::Change {
            ids: &[id],
            allowed: &[outbox_model::OutboxStatus::Cancelled],
            reason: "brought back",
            requested_by: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(requeued.ids, [id]);
}

/// A cancelled head brought back by a requeue takes its key's next
/// position: it waits for the key's events published before the requeue,
/// and the key is not past it, so a worker runs its handler (it
/// acknowledges without running one an event whose key is past it).
// Break checked: without the requeue trigger of migration
// 2026-12-07-190001 the requeued event keeps position 1, which the key is
// past, and is claimed at once beside the second.
#[tokio::test]
async fn a_cancelled_head_requeued_runs_after_the_keys_later_events_and_the_key_is_not_past_it() {
    let (_db, mut conn) = database().await;
    let first = common::insert_row(&mut conn, ordered("acct-1")).await;
    let second = common::insert_row(&mut conn, ordered("acct-1")).await;
    cancel(&mut conn, first).await;
    requeue_cancelled(&mut conn, first).await;

    assert_eq!(positions(&mut conn, "acct-1").await[&first], 3);
    assert!(
        !outbox_store::is_finished(&mut conn, "acct-1", 3)
            .await
            .unwrap()
    );
    assert_eq!(claim_ids(&mut conn).await, [second]);
    assert!(outbox_store::advance(&mut conn, "acct-1", 2).await.unwrap());
    assert_eq!(claim_ids(&mut conn).await, [first]);
}

/// Several cancelled events of one key brought back by one requeue come
/// back in the order they had, after the key's other events.
// Break checked: with the rows requeued by one statement (as before),
// the two took the key's next positions in the order the update met
// them, the second before the first here.
#[tokio::test]
async fn cancelled_events_of_one_key_requeued_together_keep_their_order() {
    let (_db, mut conn) = database().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(common::insert_row(&mut conn, ordered("acct-1")).await);
    }
    // The second, then the head: the key moves past both.
    cancel(&mut conn, ids[1]).await;
    cancel(&mut conn, ids[0]).await;
    let requeued = outbox_store::requeue(
        &mut conn,
        outbox_store::Change {
            ids: &[ids[1], ids[0]],
            allowed: &[outbox_model::OutboxStatus::Cancelled],
            reason: "brought back",
            requested_by: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(requeued.ids.len(), 2);

    let placed = positions(&mut conn, "acct-1").await;
    assert_eq!((placed[&ids[0]], placed[&ids[1]]), (4, 5));
    for (position, id) in [(3, ids[2]), (4, ids[0]), (5, ids[1])] {
        assert_eq!(claim_ids(&mut conn).await, [id], "position {position}");
        assert!(
            outbox_store::advance(&mut conn, "acct-1", position)
                .await
                .unwrap()
        );
    }
}

/// A cancelled event brought back before its key reached it keeps its
/// place: it runs after the events before it and before those after it.
#[tokio::test]
async fn a_cancelled_event_requeued_before_its_key_reached_it_keeps_its_place() {
    let (_db, mut conn) = database().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(common::insert_row(&mut conn, ordered("acct-1")).await);
    }
    cancel(&mut conn, ids[1]).await;
    requeue_cancelled(&mut conn, ids[1]).await;

    assert_eq!(positions(&mut conn, "acct-1").await[&ids[1]], 2);
    for (position, id) in (1..).zip(&ids) {
        assert_eq!(claim_ids(&mut conn).await, [*id], "position {position}");
        assert!(
            outbox_store::advance(&mut conn, "acct-1", position)
                .await
                .unwrap()
        );
    }
}

#[tokio::test]
async fn the_table_refuses_an_empty_or_overlong_ordering_key() {
    let (_db, conn) = database().await;
    for key in [
        String::new(),
        "k".repeat(outbox_model::MAX_ORDERING_KEY_CHARS + 1),
    ] {
        let refused = outbox_store::insert_event(&conn, &ordered(&key)).await;
        let error = refused.expect_err("the CHECK constraint refuses it");
        assert_eq!(
            error.kind(),
            outbox_store::ErrorKind::ConstraintViolation,
            "{error}"
        );
    }
    let longest = "k".repeat(outbox_model::MAX_ORDERING_KEY_CHARS);
    outbox_store::insert_event(&conn, &ordered(&longest))
        .await
        .unwrap();
}
