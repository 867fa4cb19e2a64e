//! The figures operators and the dispatcher's gauges read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, insert, insert_with};
use diesel_async::SimpleAsyncConnection;
use outbox_store::{
    GroupCount, MaybeEstimated, StatusQueueCount, group_counts, overview_counts, pending_figures,
    status_queue_counts, unfinished_count,
};

#[tokio::test]
async fn pending_figures_count_due_overdue_and_processing_rows() {
    let (_db, mut conn) = database().await;
    insert(&mut conn, "audit.user.login").await;
    insert_with(&mut conn, "scheduled_at = now() - interval '5 minutes'").await;
    insert_with(&mut conn, "scheduled_at = now() + interval '1 hour'").await;
    insert_with(
        &mut conn,
        "status = 'PROCESSING', locked_until = now() + interval '1 hour'",
    )
    .await;
    insert_with(
        &mut conn,
        "status = 'DONE', scheduled_at = now() - interval '1 day'",
    )
    .await;

    let figures = pending_figures(&mut conn).await.unwrap();

    assert_eq!(
        (figures.due, figures.overdue, figures.processing),
        (2, 1, 1)
    );
    let oldest = figures.oldest_due_age_secs.unwrap();
    assert!((300.0..3_600.0).contains(&oldest), "oldest due {oldest} s");
    assert!(!figures.alert());
}

#[tokio::test]
async fn with_nothing_due_the_pending_figures_are_zero_and_have_no_oldest_age() {
    let (_db, mut conn) = database().await;
    insert_with(&mut conn, "scheduled_at = now() + interval '1 hour'").await;

    let figures = pending_figures(&mut conn).await.unwrap();

    assert_eq!(
        (figures.due, figures.overdue, figures.processing),
        (0, 0, 0)
    );
    assert_eq!(figures.oldest_due_age_secs, None);
}

#[tokio::test]
async fn group_counts_count_rows_per_status_event_type_and_queue() {
    let (_db, mut conn) = database().await;
    for _ in 0..2 {
        insert_with(&mut conn, "status = 'DONE', target_queue = 'outbox.audit'").await;
    }
    insert_with(&mut conn, "status = 'FAILED'").await;
    insert(&mut conn, "mail.user.welcome").await;

    let mut counts = group_counts(&mut conn).await.unwrap();
    counts.sort_by(|a, b| (&a.status, &a.event_type).cmp(&(&b.status, &b.event_type)));

    let count = |status: &str, event_type: &str, queue: Option<&str>, n| GroupCount {
        status: status.to_owned(),
        event_type: event_type.to_owned(),
        target_queue: queue.map(str::to_owned),
        n,
    };
    assert_eq!(
        counts,
        [
            count("DONE", "audit.user.login", Some("outbox.audit"), 2),
            count("FAILED", "audit.user.login", None, 1),
            count("PENDING", "mail.user.welcome", None, 1),
        ]
    );
}

#[tokio::test]
async fn status_queue_counts_name_rows_scheduled_for_later_and_rows_not_routed() {
    let (_db, mut conn) = database().await;
    insert_with(&mut conn, "status = 'DONE', target_queue = 'outbox.audit'").await;
    insert_with(&mut conn, "status = 'FAILED'").await;
    insert(&mut conn, "audit.user.login").await;
    insert_with(&mut conn, "scheduled_at = now() + interval '1 hour'").await;

    let counts = status_queue_counts(&mut conn).await.unwrap();

    let count = |status: &str, queue: &str| StatusQueueCount {
        status: status.to_owned(),
        queue: queue.to_owned(),
        n: 1,
    };
    assert_eq!(
        counts,
        [
            count("DONE", "outbox.audit"),
            count("FAILED", "(no route)"),
            count("PENDING", "(no route)"),
            count("PENDING", "(scheduled for later)"),
        ]
    );
}

#[tokio::test]
async fn unfinished_count_counts_every_row_not_done() {
    let (_db, mut conn) = database().await;
    for status in ["PENDING", "FAILED", "CANCELLED", "DONE", "DONE"] {
        insert_with(&mut conn, &format!("status = '{status}'")).await;
    }

    assert_eq!(unfinished_count(&mut conn).await.unwrap(), 3);
}

#[tokio::test]
async fn overview_counts_are_exact_but_for_done_rows_estimated_from_the_catalog_once_analyzed() {
    let (_db, mut conn) = database().await;
    for _ in 0..3 {
        insert_with(&mut conn, "status = 'DONE', target_queue = 'outbox.audit'").await;
    }
    insert_with(
        &mut conn,
        "status = 'FAILED', target_queue = 'outbox.audit'",
    )
    .await;
    insert_with(&mut conn, "status = 'CANCELLED'").await;
    insert_with(&mut conn, "scheduled_at = now() + interval '1 hour'").await;
    insert_with(
        &mut conn,
        "status = 'PROCESSING', target_queue = 'outbox.audit', locked_until = now() + interval '1 hour'",
    )
    .await;
    insert_with(
        &mut conn,
        "ordering_key = 'order-1', ordering_blocked = true, target_queue = 'outbox.audit'",
    )
    .await;
    let row = |status: &str, queue: &str, n| StatusQueueCount {
        status: status.into(),
        queue: queue.into(),
        n,
    };
    let unfinished = vec![
        row("CANCELLED", "(no route)", 1),
        row("FAILED", "outbox.audit", 1),
        row("PENDING", "(scheduled for later)", 1),
        row("PENDING", "outbox.audit", 1),
        row("PROCESSING", "outbox.audit", 1),
    ];

    // Never analyzed: the DONE rows are counted.
    let counts = overview_counts(&mut conn).await.unwrap();
    assert_eq!(counts.unfinished, unfinished);
    assert_eq!(
        counts.done,
        MaybeEstimated {
            n: 3,
            estimated: false
        }
    );

    // Analyzed: the catalog's row count minus the others, said estimated.
    conn.batch_execute("ANALYZE outbox_event").await.unwrap();
    let counts = overview_counts(&mut conn).await.unwrap();
    assert_eq!(counts.unfinished, unfinished);
    assert_eq!(
        counts.done,
        MaybeEstimated {
            n: 3,
            estimated: true
        }
    );
}
