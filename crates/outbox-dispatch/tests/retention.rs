//! The `outbox-done-retention` job deletes exactly the old DONE rows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, exec};
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

    // An operator once replayed one of the old rows: its history must outlive it.
    exec(
        &mut conn,
        "INSERT INTO outbox_event_requeue (outbox_event_id, reason, previous_status, previous_retries)
         SELECT id, 'replayed during an incident', 'DONE', 0 FROM outbox_event WHERE tenant_id = 'old-done' LIMIT 1",
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
