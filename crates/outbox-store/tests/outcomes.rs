//! The fenced outcomes of a claim: DONE, retry, FAILED and release, each
//! recorded only while the row is still held under the claim's lease.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::TimeDelta;
use common::{database, insert_due, now, row, set, sorted};
use diesel_async::AsyncPgConnection;
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_store::{
    Change, Failure, Lease, Retry, cancel, claim, mark_done, mark_failed, mark_retry, release,
};

const LEASE_MS: i64 = 60_000;

#[tokio::test]
async fn done_records_the_queue_and_the_hand_off_time_and_clears_lease_and_error() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 1).await;
    set(
        &mut conn,
        ids[0],
        "last_error = 'an earlier attempt failed'",
    )
    .await;
    let lease = claim_one(&mut conn).await;

    let before = now(&mut conn).await;
    let updated = mark_done(&mut conn, &[(lease, "outbox.audit".to_owned())])
        .await
        .unwrap();
    let after = now(&mut conn).await;

    assert_eq!(updated, ids);
    let done = row(&mut conn, ids[0]).await;
    assert_eq!(done.status, OutboxStatus::Done);
    assert_eq!(done.target_queue.as_deref(), Some("outbox.audit"));
    assert_eq!((done.locked_until, done.last_error), (None, None));
    let processed = done.processed_at.unwrap();
    assert!(before <= processed && processed <= after, "{processed}");
}

#[tokio::test]
async fn done_records_each_rows_queue_across_several_claims() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 2).await;
    let first = claim_one(&mut conn).await;
    let second = claim_one(&mut conn).await;
    assert_ne!(first.locked_until, second.locked_until, "two leases");

    let updated = mark_done(
        &mut conn,
        &[
            (first, "outbox.audit".to_owned()),
            (second, "outbox.mail".to_owned()),
        ],
    )
    .await
    .unwrap();

    assert_eq!(sorted(updated), sorted(ids.clone()));
    assert_eq!(
        row(&mut conn, ids[0]).await.target_queue.as_deref(),
        Some("outbox.audit")
    );
    assert_eq!(
        row(&mut conn, ids[1]).await.target_queue.as_deref(),
        Some("outbox.mail")
    );
}

#[tokio::test]
async fn a_retry_sets_the_next_due_time_and_counts_the_attempt() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 1).await;
    let lease = claim_one(&mut conn).await;
    let retry = Retry {
        lease,
        delay_ms: 30_000,
        error: "redis refused".to_owned(),
        queue: "outbox.audit".to_owned(),
    };

    let before = now(&mut conn).await;
    assert_eq!(mark_retry(&mut conn, &[retry]).await.unwrap(), ids);
    let after = now(&mut conn).await;

    let retried = row(&mut conn, ids[0]).await;
    assert_eq!(retried.status, OutboxStatus::Pending);
    assert_eq!(retried.retries, 1);
    assert_eq!(retried.last_error.as_deref(), Some("redis refused"));
    assert_eq!(retried.target_queue.as_deref(), Some("outbox.audit"));
    assert_eq!(retried.locked_until, None);
    let delay = TimeDelta::milliseconds(30_000);
    let due = retried.scheduled_at;
    assert!(
        before + delay <= due && due <= after + delay,
        "due at {due}"
    );
    assert!(
        claim(&mut conn, 10, LEASE_MS).await.unwrap().is_empty(),
        "not claimable before its next due time"
    );
}

#[tokio::test]
async fn a_failure_dead_letters_the_row_with_its_error_and_increment() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 2).await;
    set(&mut conn, ids[0], "retries = 4").await;
    let claimed = claim(&mut conn, 10, LEASE_MS).await.unwrap();
    let lease = |i: usize| Lease::of(&claimed[i]).unwrap();
    let failures = [
        Failure {
            lease: lease(0),
            retry_increment: 1,
            error: "out of retries".to_owned(),
            queue: Some("outbox.audit".to_owned()),
            unrouted: false,
        },
        Failure {
            lease: lease(1),
            retry_increment: 0,
            error: "no route".to_owned(),
            queue: None,
            unrouted: true,
        },
    ];

    let updated = mark_failed(&mut conn, &failures).await.unwrap();

    assert_eq!(sorted(updated), sorted(ids.clone()));
    let exhausted = row(&mut conn, ids[0]).await;
    let unroutable = row(&mut conn, ids[1]).await;
    for (failed, retries, error, queue) in [
        (&exhausted, 5, "out of retries", Some("outbox.audit")),
        (&unroutable, 0, "no route", None),
    ] {
        assert_eq!(failed.status, OutboxStatus::Failed);
        assert_eq!(failed.retries, retries);
        assert_eq!(failed.last_error.as_deref(), Some(error));
        assert_eq!(failed.target_queue.as_deref(), queue);
        assert_eq!(failed.locked_until, None);
        assert!(failed.failed_at.is_some());
    }
    assert_eq!(exhausted.unrouted_since, None);
    assert!(
        unroutable.unrouted_since.is_some(),
        "an unrouted failure is marked, so that a route revives it"
    );
}

#[tokio::test]
async fn a_release_gives_the_row_back_due_at_once_with_its_retries() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 1).await;
    set(&mut conn, ids[0], "retries = 2").await;
    let lease = claim_one(&mut conn).await;

    assert_eq!(release(&mut conn, &[lease]).await.unwrap(), ids);

    let released = row(&mut conn, ids[0]).await;
    assert_eq!(released.status, OutboxStatus::Pending);
    assert_eq!((released.retries, released.locked_until), (2, None));
    assert_eq!(claim_one(&mut conn).await.id, ids[0], "claimable at once");
}

// Break checked: a fence that leaves out `locked_until = $2` fails this test.
#[tokio::test]
async fn an_outcome_recorded_with_a_stale_claim_is_refused_and_changes_nothing() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 1).await;
    // A lease of 0 ms has run out by the next statement: the row is
    // claimed again at once, and the first claim's lease is stale.
    let stale = Lease::of(&claim(&mut conn, 1, 0).await.unwrap()[0]).unwrap();
    let current = claim_one(&mut conn).await;
    assert_eq!(current.id, stale.id);
    let held = row(&mut conn, ids[0]).await;

    let queue = || "outbox.audit".to_owned();
    let refused = [
        mark_done(&mut conn, &[(stale, queue())]).await.unwrap(),
        mark_retry(&mut conn, &[retry(stale)]).await.unwrap(),
        mark_failed(&mut conn, &[failure(stale)]).await.unwrap(),
        release(&mut conn, &[stale]).await.unwrap(),
    ];

    assert!(refused.iter().all(Vec::is_empty), "{refused:?}");
    assert_eq!(row(&mut conn, ids[0]).await, held);
    assert_eq!(
        mark_done(&mut conn, &[(current, queue())]).await.unwrap(),
        ids,
        "the current claim still records its outcome"
    );
}

#[tokio::test]
async fn an_outcome_for_a_row_cancelled_while_claimed_is_refused() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 1).await;
    let lease = claim_one(&mut conn).await;
    let change = Change {
        ids: &ids,
        allowed: &[OutboxStatus::Processing],
        reason: "withdrawn",
        requested_by: None,
    };
    assert_eq!(cancel(&mut conn, change).await.unwrap(), ids);
    let cancelled = row(&mut conn, ids[0]).await;

    let refused = [
        mark_done(&mut conn, &[(lease, "outbox.audit".to_owned())])
            .await
            .unwrap(),
        mark_retry(&mut conn, &[retry(lease)]).await.unwrap(),
        mark_failed(&mut conn, &[failure(lease)]).await.unwrap(),
        release(&mut conn, &[lease]).await.unwrap(),
    ];

    assert!(refused.iter().all(Vec::is_empty), "{refused:?}");
    assert_eq!(row(&mut conn, ids[0]).await, cancelled);
}

/// Claims exactly one row; its lease.
async fn claim_one(conn: &mut AsyncPgConnection) -> Lease {
    let claimed: Vec<OutboxEvent> = claim(conn, 1, LEASE_MS).await.unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    Lease::of(&claimed[0]).unwrap()
}

fn retry(lease: Lease) -> Retry {
    Retry {
        lease,
        delay_ms: 1_000,
        error: "late".to_owned(),
        queue: "outbox.audit".to_owned(),
    }
}

fn failure(lease: Lease) -> Failure {
    Failure {
        lease,
        retry_increment: 1,
        error: "late".to_owned(),
        queue: None,
        unrouted: false,
    }
}
