//! The `outbox-done-retention` job deletes exactly the old DONE rows, and
//! never the requeue history (an audit trail, docs/operations.md "Retention").

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, exec};
use diesel_async::RunQueryDsl;
use outbox_dispatch::{RetentionConfig, purge_done};
use outbox_model::OutboxStatus;

#[tokio::test]
async fn retention_deletes_only_done_rows_past_the_window() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at, last_error)
         SELECT 'old-done', 'audit.user.login', '{}', 'DONE', now() - interval '31 days', now() - interval '31 days', NULL
         FROM generate_series(1, 7);
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         SELECT 'recent-done', 'audit.user.login', '{}', 'DONE', now() - interval '29 days'
         FROM generate_series(1, 2);
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
         VALUES ('done-no-processed-at', 'audit.user.login', '{}', 'DONE', NULL, now() - interval '90 days'),
                ('old-failed', 'audit.user.login', '{}', 'FAILED', now() - interval '90 days', now() - interval '90 days'),
                ('old-cancelled', 'audit.user.login', '{}', 'CANCELLED', now() - interval '90 days', now() - interval '90 days'),
                ('old-pending', 'audit.user.login', '{}', 'PENDING', now() - interval '90 days', now() - interval '90 days');
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, locked_until, processed_at, created_at)
         VALUES ('old-processing', 'audit.user.login', '{}', 'PROCESSING', now() + interval '5 minutes',
                 now() - interval '90 days', now() - interval '90 days')",
    )
    .await;

    // Batches of 3 (7 rows → 3 + 3 + 1 statements), 720 hours = 30 days.
    let config = RetentionConfig::new(Duration::from_secs(720 * 3600), 3);
    let stopped = tokio_util::sync::CancellationToken::new();
    stopped.cancel();
    assert_eq!(
        outbox_dispatch::purge_done_until(h.db.pool(), config, &stopped)
            .await
            .unwrap(),
        0,
        "a stopping worker starts no batch"
    );
    let deleted = purge_done(h.db.pool(), config).await.unwrap();

    assert_eq!(deleted, 7);
    let mut left: Vec<(String, OutboxStatus)> = h
        .rows()
        .await
        .into_iter()
        .map(|r| (r.tenant_id, r.status))
        .collect();
    left.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        left,
        vec![
            ("done-no-processed-at".into(), OutboxStatus::Done),
            ("old-cancelled".into(), OutboxStatus::Cancelled),
            ("old-failed".into(), OutboxStatus::Failed),
            ("old-pending".into(), OutboxStatus::Pending),
            ("old-processing".into(), OutboxStatus::Processing),
            ("recent-done".into(), OutboxStatus::Done),
            ("recent-done".into(), OutboxStatus::Done),
        ]
    );
    assert_eq!(
        purge_done(h.db.pool(), config).await.unwrap(),
        0,
        "a second run finds nothing"
    );
}

#[derive(diesel::QueryableByName, Debug, PartialEq)]
struct HistoryRow {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    outbox_event_id: uuid::Uuid,
    #[diesel(sql_type = diesel::sql_types::Text)]
    reason: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    previous_status: String,
}

async fn history(conn: &mut diesel_async::AsyncPgConnection) -> Vec<HistoryRow> {
    diesel::sql_query(
        "SELECT outbox_event_id, reason, previous_status FROM outbox_event_requeue
         ORDER BY requeued_at, reason",
    )
    .load(conn)
    .await
    .unwrap()
}

// Break checked: retention also deleting the history of the rows it purged
// (`DELETE FROM outbox_event_requeue WHERE outbox_event_id NOT IN (SELECT id
// FROM outbox_event)` after each batch in `purge_done_until`) fails with
// "retention deleted requeue history", left: [] (or only the kept row's
// entry), right: the three entries.
#[tokio::test]
async fn retention_keeps_the_requeue_history_of_the_rows_it_deletes() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
         VALUES ('old-done', 'audit.user.login', '{}', 'DONE', now() - interval '31 days', now() - interval '40 days'),
                ('recent-done', 'audit.user.login', '{}', 'DONE', now() - interval '1 day', now() - interval '2 days')",
    )
    .await;
    // The old row was requeued after it failed, then replayed during an
    // incident; the recent one was requeued once.
    exec(
        &mut conn,
        "INSERT INTO outbox_event_requeue (outbox_event_id, requeued_at, reason, previous_status, previous_retries, replay)
         SELECT id, now() - interval '35 days', 'receiver fixed', 'FAILED', 7, false FROM outbox_event WHERE tenant_id = 'old-done';
         INSERT INTO outbox_event_requeue (outbox_event_id, requeued_at, reason, previous_status, previous_retries, replay)
         SELECT id, now() - interval '33 days', 'replayed during an incident', 'DONE', 0, true FROM outbox_event WHERE tenant_id = 'old-done';
         INSERT INTO outbox_event_requeue (outbox_event_id, requeued_at, reason, previous_status, previous_retries, replay)
         SELECT id, now() - interval '2 days', 'peer back', 'FAILED', 3, false FROM outbox_event WHERE tenant_id = 'recent-done'",
    )
    .await;
    let before = history(&mut conn).await;
    assert_eq!(before.len(), 3);

    let deleted = purge_done(h.db.pool(), RetentionConfig::default())
        .await
        .unwrap();

    assert_eq!(deleted, 1, "the old DONE row is purged");
    let left: Vec<String> = h.rows().await.into_iter().map(|r| r.tenant_id).collect();
    assert_eq!(left, ["recent-done"]);
    assert_eq!(
        history(&mut conn).await,
        before,
        "retention deleted requeue history"
    );
}

/// Old DONE rows, `tenant` their tenant.
async fn old_done_rows(conn: &mut diesel_async::AsyncPgConnection, tenant: &str, n: usize) {
    exec(
        conn,
        &format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
             SELECT '{tenant}', 'audit.user.login', '{{}}', 'DONE', now() - interval '31 days', now() - interval '31 days'
             FROM generate_series(1, {n})"
        ),
    )
    .await;
}

/// The workers' retention task purges old DONE rows, again every period,
/// until the worker stops.
// Break checked: a task that does nothing (`run_retention` emptied) leaves
// the old rows in place and fails here.
#[tokio::test]
async fn the_retention_task_purges_every_period_until_shutdown() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    old_done_rows(&mut conn, "first", 4).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(outbox_dispatch::run_retention(
        h.db.pool().clone(),
        RetentionConfig::default(),
        Duration::from_millis(100),
        shutdown.clone(),
    ));
    outbox_test_support::eventually(
        "the first run to purge the old rows",
        Duration::from_secs(30),
        async || h.rows().await.is_empty(),
    )
    .await;
    // Rows that grow old later go at a later run.
    old_done_rows(&mut conn, "later", 3).await;
    outbox_test_support::eventually(
        "a later run to purge the rows that came after",
        Duration::from_secs(30),
        async || h.rows().await.is_empty(),
    )
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the task ends once the worker stops")
        .unwrap();
}
