//! Crash recovery: dead dispatchers, crashes between push and DONE, and the
//! fence that keeps a late dispatcher from overwriting a row it lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, quick_config};
use diesel_async::AsyncPgConnection;
use outbox_dispatch::DispatcherConfig;
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_publish::NewOutboxEvent;
use outbox_queue::{OutboxJob, RedisSettings, push_jobs};
use outbox_store::{self as db, Failure, Lease, Retry};
use serde_json::json;
use uuid::Uuid;

/// A one-second lease so that tests wait for expiry briefly.
const SHORT_LEASE_MS: i64 = 1000;

fn short_lease_config() -> DispatcherConfig {
    DispatcherConfig {
        lock_timeout: Duration::from_millis(SHORT_LEASE_MS as u64),
        ..quick_config()
    }
}

#[tokio::test]
async fn rows_of_a_dispatcher_that_died_are_recovered_after_the_lease() {
    let h = Harness::new().await;
    let ids = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({}),
        )])
        .await;
    // A dispatcher claims the row, then its process dies.
    let mut dead = h.conn().await;
    let claimed = db::claim(&mut dead, 10, SHORT_LEASE_MS).await.unwrap();
    assert_eq!(claimed.len(), 1);
    drop(dead);

    let survivor = h.dispatcher(short_lease_config());
    assert_eq!(
        survivor.tick().await.unwrap().claimed,
        0,
        "the lease still protects the row"
    );
    assert_eq!(h.row(ids[0]).await.status, OutboxStatus::Processing);

    h.wait_for(
        "the survivor to re-claim and dispatch the row",
        Duration::from_secs(30),
        async || survivor.tick().await.unwrap().dispatched == 1,
    )
    .await;
    let row = h.row(ids[0]).await;
    assert_eq!(row.status, OutboxStatus::Done);
    assert_eq!(
        h.task_ids("outbox.mail").await,
        vec![format!("outbox:{}", ids[0])]
    );
}

#[tokio::test]
async fn a_crash_after_the_push_but_before_done_makes_no_second_job() {
    let h = Harness::new().await;
    let ids = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "webhook.order.created",
            json!({ "n": 1 }),
        )])
        .await;
    // The first dispatcher claims and pushes, then dies before recording DONE.
    let mut dead = h.conn().await;
    let claimed = db::claim(&mut dead, 10, SHORT_LEASE_MS).await.unwrap();
    let mut redis = outbox_queue::connect(&RedisSettings::new(h.redis.url())).unwrap();
    let jobs: Vec<OutboxJob> = claimed.iter().map(OutboxJob::from_event).collect();
    let pushed = push_jobs(&mut redis, &h.namespace, "outbox.webhook", &jobs)
        .await
        .unwrap();
    assert_eq!(pushed.new, 1);
    drop(dead);

    let survivor = h.dispatcher(short_lease_config());
    let mut report = Default::default();
    h.wait_for(
        "the re-claim after the lease",
        Duration::from_secs(30),
        async || {
            report = survivor.tick().await.unwrap();
            report.claimed == 1
        },
    )
    .await;

    assert_eq!((report.dispatched, report.duplicates), (1, 1), "{report:?}");
    assert_eq!(h.row(ids[0]).await.status, OutboxStatus::Done);
    let counts = h.tasks_per_id().await;
    assert_eq!(counts.len(), 1);
    assert_eq!(
        counts[&format!("outbox:{}", ids[0])],
        1,
        "still exactly one job"
    );
}

#[tokio::test]
async fn a_dispatcher_that_lost_its_lease_cannot_change_the_row() {
    let h = Harness::new().await;
    let ids = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({}),
        )])
        .await;
    let mut slow = h.conn().await;
    let claimed = db::claim(&mut slow, 10, SHORT_LEASE_MS).await.unwrap();
    let stale = Lease::of(&claimed[0]).unwrap();

    // The slow dispatcher stalls past its lease; another takes over and finishes.
    let other = h.dispatcher(short_lease_config());
    h.wait_for("the takeover", Duration::from_secs(30), async || {
        other.tick().await.unwrap().dispatched == 1
    })
    .await;

    // The slow one wakes up and tries to record a failure, then success, then release.
    let retry = Retry {
        lease: stale,
        delay_ms: 60_000,
        error: "late".into(),
        queue: "outbox.audit".into(),
    };
    assert!(
        db::mark_retry(&mut slow, &[retry])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        db::mark_done(&mut slow, &[(stale, "outbox.audit".into())])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(db::release(&mut slow, &[stale]).await.unwrap().is_empty());

    let row = h.row(ids[0]).await;
    assert_eq!(row.status, OutboxStatus::Done);
    assert_eq!((row.retries, row.last_error), (0, None));
}

#[tokio::test]
async fn a_tick_reports_leases_lost_while_it_pushed() {
    let h = Harness::new().await;
    h.publish(vec![NewOutboxEvent::new(
        "acme",
        "audit.user.login",
        json!({}),
    )])
    .await;
    let mut conn = h.conn().await;
    let claimed = db::claim(&mut conn, 10, SHORT_LEASE_MS).await.unwrap();
    // Someone else re-claims after expiry: the original lease is now stale.
    let mut reclaimed = Vec::new();
    h.wait_for(
        "the lease to expire and the row to be re-claimed",
        Duration::from_secs(30),
        async || {
            reclaimed = db::claim(&mut conn, 10, 60_000).await.unwrap();
            !reclaimed.is_empty()
        },
    )
    .await;
    assert_eq!(reclaimed.len(), 1);
    assert_ne!(reclaimed[0].locked_until, claimed[0].locked_until);
    let done = db::mark_done(
        &mut conn,
        &[(Lease::of(&claimed[0]).unwrap(), "outbox.audit".into())],
    )
    .await
    .unwrap();
    assert!(done.is_empty(), "the stale lease matched nothing");
    let done = db::mark_done(
        &mut conn,
        &[(Lease::of(&reclaimed[0]).unwrap(), "outbox.audit".into())],
    )
    .await
    .unwrap();
    assert_eq!(done, vec![reclaimed[0].id]);
}

/// A row that dispatcher A claimed and then lost: A's lease expired and
/// dispatcher B claimed the row again, so it is PROCESSING under B's lease.
/// Returns A's stale lease and the row as B holds it.
async fn row_taken_over_from_a_stalled_dispatcher(h: &Harness) -> (Lease, OutboxEvent) {
    let id = h.publish_one("audit.user.login").await;
    let mut a = h.conn().await;
    let claimed = db::claim(&mut a, 10, SHORT_LEASE_MS).await.unwrap();
    let stale = Lease::of(&claimed[0]).unwrap();
    let mut b = h.conn().await;
    h.wait_for(
        "A's lease to expire and B to take the row over",
        Duration::from_secs(30),
        async || !db::claim(&mut b, 10, 60_000).await.unwrap().is_empty(),
    )
    .await;
    let held = h.row(id).await;
    assert_eq!(held.status, OutboxStatus::Processing);
    assert_ne!(held.locked_until, Some(stale.locked_until), "B's own lease");
    (stale, held)
}

/// Runs `record` with A's stale lease on a row B took over: it must match
/// nothing and leave B's row as it was, B's lease intact (B can still record
/// its hand-off).
async fn assert_a_stale_outcome_changes_nothing(
    what: &str,
    record: impl AsyncFnOnce(&mut AsyncPgConnection, Lease) -> Vec<Uuid>,
) {
    let h = Harness::new().await;
    let (stale, held) = row_taken_over_from_a_stalled_dispatcher(&h).await;
    let mut conn = h.conn().await;

    let matched = record(&mut conn, stale).await;

    assert!(matched.is_empty(), "{what} matched the row: {matched:?}");
    assert_eq!(
        h.row(held.id).await,
        held,
        "{what} changed a row another dispatcher owns"
    );
    let done = db::mark_done(
        &mut conn,
        &[(Lease::of(&held).unwrap(), "outbox.audit".into())],
    )
    .await
    .unwrap();
    assert_eq!(done, vec![held.id], "the new owner records its hand-off");
}

// Break checked: `AND locked_until = $2` removed from the fence that
// `db::mark_retry` shares with the other outcome statements (`fenced!` in db.rs)
// makes this fail with "a stale retry matched the row: [<id>]".
#[tokio::test]
async fn a_stalled_dispatchers_retry_cannot_put_back_a_row_another_dispatcher_took_over() {
    assert_a_stale_outcome_changes_nothing("a stale retry", async |conn, stale| {
        let retry = Retry {
            lease: stale,
            delay_ms: 60_000,
            error: "late".into(),
            queue: "outbox.audit".into(),
        };
        db::mark_retry(conn, &[retry]).await.unwrap()
    })
    .await;
}

// Break checked: `AND locked_until = $2` removed from the fence that
// `db::mark_failed` shares with the other outcome statements (`fenced!` in db.rs)
// makes this fail with "a stale failure matched the row: [<id>]".
#[tokio::test]
async fn a_stalled_dispatchers_failure_cannot_dead_letter_a_row_another_dispatcher_took_over() {
    assert_a_stale_outcome_changes_nothing("a stale failure", async |conn, stale| {
        let failure = Failure {
            lease: stale,
            retry_increment: 1,
            error: "hand-off to outbox.audit failed: late".into(),
            queue: Some("outbox.audit".into()),
            unrouted: false,
        };
        db::mark_failed(conn, &[failure]).await.unwrap()
    })
    .await;
}

// Break checked: `AND locked_until = $2` removed from the fence that
// `db::release` shares with the other outcome statements (`fenced!` in db.rs)
// makes this fail with "a stale release matched the row: [<id>]".
#[tokio::test]
async fn a_stalled_dispatchers_release_cannot_free_a_row_another_dispatcher_took_over() {
    assert_a_stale_outcome_changes_nothing("a stale release", async |conn, stale| {
        db::release(conn, &[stale]).await.unwrap()
    })
    .await;
}
