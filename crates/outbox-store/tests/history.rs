//! The operator's requeue and cancel: what they change, the history row
//! each writes (with the due time the row had), and the rows they leave
//! alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{database, insert_with, now, row};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures::StreamExt;
use outbox_model::OutboxStatus;
use outbox_store::{Change, HistoryEntry, Requeued, cancel, claim, history, requeue};
use uuid::Uuid;

const FAILED: &str = "status = 'FAILED', retries = 5, last_error = 'smtp refused', \
                      target_queue = 'outbox.mail', failed_at = now(), \
                      scheduled_at = now() - interval '1 hour'";
const DONE: &str = "status = 'DONE', processed_at = now(), target_queue = 'outbox.audit'";

fn change<'a>(ids: &'a [Uuid], allowed: &'a [OutboxStatus]) -> Change<'a> {
    Change {
        ids,
        allowed,
        reason: "smtp fixed",
        requested_by: Some("ops@example.com"),
    }
}

/// Requeues the row `id` if its status is `allowed`.
async fn requeue_one(conn: &mut AsyncPgConnection, id: Uuid, allowed: OutboxStatus) -> Requeued {
    requeue(conn, change(&[id], &[allowed])).await.unwrap()
}

#[tokio::test]
async fn requeue_puts_a_failed_row_back_as_new_and_records_what_it_was() {
    let (_db, mut conn) = database().await;
    let id = insert_with(&mut conn, FAILED).await;
    let was_due = row(&mut conn, id).await.scheduled_at;

    let before = now(&mut conn).await;
    let requeued = requeue_one(&mut conn, id, OutboxStatus::Failed).await;

    assert_eq!((requeued.ids, requeued.replayed), (vec![id], 0));
    let again = row(&mut conn, id).await;
    assert_eq!((again.status, again.retries), (OutboxStatus::Pending, 0));
    assert_eq!((again.last_error, again.target_queue), (None, None));
    assert_eq!(
        (again.failed_at, again.processed_at, again.locked_until),
        (None, None, None)
    );
    assert_eq!(again.generation, 0);
    assert!(again.scheduled_at >= before, "due from the requeue on");
    let entries = history(&mut conn, id).await.unwrap();
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(
        (
            entry.reason.as_str(),
            entry.requested_by.as_deref(),
            entry.action.as_str()
        ),
        ("smtp fixed", Some("ops@example.com"), "requeue")
    );
    assert_eq!(
        (
            entry.previous_status.as_str(),
            entry.previous_retries,
            entry.previous_last_error.as_deref()
        ),
        ("FAILED", 5, Some("smtp refused"))
    );
    assert_eq!(entry.previous_scheduled_at, Some(was_due));
    assert_eq!((entry.replay, entry.generation), (false, None));
    assert_eq!(
        claim(&mut conn, 10, 60_000).await.unwrap()[0].id,
        id,
        "claimable at once"
    );
}

#[tokio::test]
async fn each_replay_of_a_done_row_starts_the_next_delivery_generation() {
    let (_db, mut conn) = database().await;
    let id = insert_with(&mut conn, DONE).await;

    for generation in 1..=2 {
        let requeued = requeue_one(&mut conn, id, OutboxStatus::Done).await;
        assert_eq!((requeued.ids, requeued.replayed), (vec![id], 1));
        assert_eq!(row(&mut conn, id).await.generation, generation);
        common::set(&mut conn, id, DONE).await;
    }

    let replays: Vec<(bool, Option<i32>)> = history(&mut conn, id)
        .await
        .unwrap()
        .iter()
        .map(|entry| (entry.replay, entry.generation))
        .collect();
    assert_eq!(replays, [(true, Some(1)), (true, Some(2))]);
}

#[tokio::test]
async fn requeue_leaves_rows_whose_status_it_may_not_touch_without_history() {
    let (_db, mut conn) = database().await;
    let failed = insert_with(&mut conn, FAILED).await;
    let claimed = insert_with(
        &mut conn,
        "status = 'PROCESSING', locked_until = now() + interval '1 hour'",
    )
    .await;
    let before = row(&mut conn, claimed).await;

    let requeued = requeue(
        &mut conn,
        change(&[failed, claimed], &[OutboxStatus::Failed]),
    )
    .await
    .unwrap();

    assert_eq!(requeued.ids, [failed]);
    assert_eq!(row(&mut conn, claimed).await, before);
    assert!(history(&mut conn, claimed).await.unwrap().is_empty());
}

#[tokio::test]
async fn requeue_wakes_the_listening_dispatchers() {
    let (db, mut conn) = database().await;
    let id = insert_with(&mut conn, FAILED).await;
    let mut listener = db.conn().await;
    listener
        .batch_execute(&format!("LISTEN {}", outbox_model::NOTIFY_CHANNEL))
        .await
        .unwrap();
    let mut notifications = Box::pin(listener.notifications_stream());

    requeue_one(&mut conn, id, OutboxStatus::Failed).await;

    let woken = tokio::time::timeout(Duration::from_secs(30), notifications.next())
        .await
        .expect("a notification after the requeue committed")
        .expect("the listener's stream is open")
        .unwrap();
    assert_eq!(woken.channel, outbox_model::NOTIFY_CHANNEL);
}

#[tokio::test]
async fn cancel_withdraws_the_row_for_good_and_records_what_it_was() {
    let (_db, mut conn) = database().await;
    let id = insert_with(&mut conn, "retries = 1, last_error = 'timeout'").await;

    let cancelled = cancel(
        &mut conn,
        change(&[id], &[OutboxStatus::Pending, OutboxStatus::Failed]),
    )
    .await
    .unwrap();

    assert_eq!(cancelled, [id]);
    let withdrawn = row(&mut conn, id).await;
    assert_eq!(
        (withdrawn.status, withdrawn.locked_until),
        (OutboxStatus::Cancelled, None)
    );
    let entries = history(&mut conn, id).await.unwrap();
    let entry: &HistoryEntry = &entries[0];
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (
            entry.action.as_str(),
            entry.previous_status.as_str(),
            entry.previous_retries
        ),
        ("cancel", "PENDING", 1)
    );
    assert_eq!(entry.previous_last_error.as_deref(), Some("timeout"));
    assert!(
        claim(&mut conn, 10, 60_000).await.unwrap().is_empty(),
        "never claimed"
    );
}

#[tokio::test]
async fn cancel_leaves_rows_whose_status_it_may_not_touch_without_history() {
    let (_db, mut conn) = database().await;
    let done = insert_with(&mut conn, DONE).await;
    let before = row(&mut conn, done).await;

    let cancelled = cancel(&mut conn, change(&[done], &[OutboxStatus::Pending]))
        .await
        .unwrap();

    assert!(cancelled.is_empty());
    assert_eq!(row(&mut conn, done).await, before);
    assert!(history(&mut conn, done).await.unwrap().is_empty());
}

/// A cancel that waits for a dispatcher's claim of its row answers with
/// the status the claim left (PROCESSING), not the PENDING it read first:
/// "is PENDING and cannot be cancelled: only PENDING and FAILED events
/// can" never comes back.
// Break checked: without the status read again after the statement
// (`settled`), the cancel answers PENDING.
#[tokio::test]
async fn a_cancel_that_loses_its_row_to_a_claim_answers_with_the_claimed_status() {
    let (db, mut conn) = database().await;
    let id = insert_with(&mut conn, "scheduled_at = now() - interval '1 second'").await;
    let mut claimer = db.conn().await;
    claimer.batch_execute("BEGIN").await.unwrap();
    assert_eq!(claim(&mut claimer, 10, 60_000).await.unwrap().len(), 1);
    let mut canceller = db.conn().await;
    let cancelling = tokio::spawn(async move {
        outbox_store::cancel_event(
            &mut canceller,
            outbox_store::CancelEvent {
                key: outbox_store::EventKey::Id(id),
                allowed: &[OutboxStatus::Pending, OutboxStatus::Failed],
                reason: "order paid",
                requested_by: None,
            },
        )
        .await
        .unwrap()
    });
    outbox_test_support::eventually(
        "the cancel to wait for the claim's lock",
        Duration::from_secs(30),
        async || common::someone_waits_for_a_lock(&mut conn).await,
    )
    .await;
    claimer.batch_execute("COMMIT").await.unwrap();

    let found = cancelling.await.unwrap().expect("the row is found");
    assert_eq!(
        (found.status, found.changed),
        (OutboxStatus::Processing, false)
    );
    assert!(history(&mut conn, id).await.unwrap().is_empty());
}

/// One cancel of several rows changes and answers every allowed one.
// Break checked: with the rows to change read from the table on their own
// (not from the rows found), a row the update changed dropped out of the
// rows found, and this answered one id of the two.
#[tokio::test]
async fn a_cancel_of_several_rows_cancels_and_answers_every_allowed_one() {
    let (_db, mut conn) = database().await;
    let failed = insert_with(&mut conn, FAILED).await;
    let pending = insert_with(&mut conn, "scheduled_at = now()").await;
    let done = insert_with(&mut conn, DONE).await;
    let mut cancelled = cancel(
        &mut conn,
        change(
            &[failed, pending, done],
            &[OutboxStatus::Pending, OutboxStatus::Failed],
        ),
    )
    .await
    .unwrap();
    cancelled.sort();
    let mut expected = vec![failed, pending];
    expected.sort();
    assert_eq!(cancelled, expected);
    assert_eq!(row(&mut conn, done).await.status, OutboxStatus::Done);
}

#[tokio::test]
async fn a_rows_history_lists_its_changes_oldest_first() {
    let (_db, mut conn) = database().await;
    let id = insert_with(&mut conn, FAILED).await;

    requeue_one(&mut conn, id, OutboxStatus::Failed).await;
    cancel(&mut conn, change(&[id], &[OutboxStatus::Pending]))
        .await
        .unwrap();

    let actions: Vec<(String, String)> = history(&mut conn, id)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| (entry.action, entry.previous_status))
        .collect();
    assert_eq!(
        actions,
        [
            ("requeue".to_owned(), "FAILED".to_owned()),
            ("cancel".to_owned(), "PENDING".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_dead_job_put_back_is_recorded_in_its_events_history_even_after_retention_removed_the_row()
 {
    let (_db, mut conn) = database().await;
    let kept = insert_with(&mut conn, DONE).await;
    let removed = Uuid::now_v7();
    let (kept_task, removed_task) = (format!("outbox:{kept}"), format!("outbox:{removed}:g1"));
    let written = outbox_store::record_dead_jobs_put_back(
        &mut conn,
        outbox_store::DeadJobsPutBack {
            queue: "outbox.audit",
            jobs: &[(kept, kept_task.as_str()), (removed, removed_task.as_str())],
            reason: "audit store back",
            requested_by: Some("ops@example.com"),
        },
    )
    .await
    .unwrap();
    assert_eq!(written, 2);

    let entries = history(&mut conn, kept).await.unwrap();
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(
        (
            entry.action.as_str(),
            entry.previous_status.as_str(),
            entry.queue.as_deref(),
            entry.task_id.as_deref(),
            entry.requested_by.as_deref(),
            entry.reason.as_str(),
            entry.replay,
        ),
        (
            "retry_dead",
            "DONE",
            Some("outbox.audit"),
            Some(kept_task.as_str()),
            Some("ops@example.com"),
            "audit store back",
            false,
        )
    );
    assert_eq!(
        entry.change(),
        format!("dead job {kept_task} put back on outbox.audit")
    );
    assert_eq!(
        row(&mut conn, kept).await.status,
        OutboxStatus::Done,
        "the row itself does not change"
    );
    let gone = history(&mut conn, removed).await.unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].previous_status, outbox_store::REMOVED_STATUS);
}
