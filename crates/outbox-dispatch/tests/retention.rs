//! The `outbox-done-retention` job deletes exactly the old DONE rows, and
//! never the requeue history (an audit trail, docs/operations/retention.md "Retention").

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, exec};
use diesel_async::RunQueryDsl;
use outbox_dispatch::{RetentionConfig, purge_done};
use outbox_model::OutboxStatus;

// The seven old rows share one `processed_at`, so batches of three meet
// rows of the timestamp the batch before ended at.
// Break checked: the next batch starting after that timestamp (`>` for
// `>=` in `db::purge_done_batch`) deletes 3 of the 7.
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

/// The workers' retention task on `h`'s database, run every `every`, once
/// its first run purged the old rows there are.
async fn retention_task(
    h: &Harness,
    every: Duration,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(outbox_dispatch::run_retention(
        h.db.pool().clone(),
        RetentionConfig::default(),
        every,
        None,
        shutdown.clone(),
    ));
    outbox_test_support::eventually(
        "the first run to purge the old rows",
        Duration::from_secs(30),
        async || h.rows().await.is_empty(),
    )
    .await;
    (shutdown, task)
}

/// Stops the retention task and waits for it to end.
async fn stop_retention(
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the task ends once the worker stops")
        .unwrap();
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
    let (shutdown, task) = retention_task(&h, Duration::from_millis(100)).await;
    // Rows that grow old later go at a later run.
    old_done_rows(&mut conn, "later", 3).await;
    outbox_test_support::eventually(
        "a later run to purge the rows that came after",
        Duration::from_secs(30),
        async || h.rows().await.is_empty(),
    )
    .await;
    stop_retention(shutdown, task).await;
}

/// Between two runs the task waits its period: rows that grow old after a
/// run stay until the next one.
// Break checked: with the next run due a period before now instead of
// after (`-` for `+` in `run_retention`, a miss of the pinned mutation
// shard 6) the runs follow each other at once and this fails with "no
// longer true: the rows wait for the next run".
#[tokio::test]
async fn the_retention_task_waits_its_period_between_runs() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    old_done_rows(&mut conn, "first", 2).await;
    let (shutdown, task) = retention_task(&h, Duration::from_secs(3600)).await;
    old_done_rows(&mut conn, "later", 3).await;
    outbox_test_support::consistently(
        "the rows wait for the next run",
        Duration::from_secs(2),
        async || h.rows().await.len() == 3,
    )
    .await;
    stop_retention(shutdown, task).await;
}

/// A row another transaction holds (a replay updating it, say) is skipped,
/// not waited on; the run deletes the rest, and the next run, which starts
/// again from the oldest row, deletes it.
// Break checked: `FOR UPDATE` without `SKIP LOCKED` in the batch's statement
// waits for the holder: "retention does not wait for the held row".
#[tokio::test]
async fn a_row_another_transaction_holds_is_skipped_and_goes_at_the_next_run() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
         VALUES ('held', 'audit.user.login', '{}', 'DONE', now() - interval '40 days', now() - interval '40 days');
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
         SELECT 'free', 'audit.user.login', '{}', 'DONE', now() - interval '31 days' - g * interval '1 second',
                now() - interval '31 days'
         FROM generate_series(1, 5) AS g",
    )
    .await;
    let mut holder = h.conn().await;
    exec(
        &mut holder,
        "BEGIN; SELECT 1 FROM outbox_event WHERE tenant_id = 'held' FOR UPDATE",
    )
    .await;
    let config = RetentionConfig::new(Duration::from_secs(720 * 3600), 2);

    let deleted = tokio::time::timeout(Duration::from_secs(30), purge_done(h.db.pool(), config))
        .await
        .expect("retention does not wait for the held row")
        .unwrap();

    assert_eq!(deleted, 5, "every row but the held one");
    let left: Vec<String> = h.rows().await.into_iter().map(|r| r.tenant_id).collect();
    assert_eq!(left, ["held"]);
    exec(&mut holder, "COMMIT").await;
    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 1);
    assert!(
        h.rows().await.is_empty(),
        "the next run deletes the held row"
    );
}

#[derive(diesel::QueryableByName)]
struct IndexBlocks {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    blocks: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    indexes: i64,
}

/// The blocks of each index of `outbox_event` read so far (shared buffer
/// hits and reads), from the server's statistics, with how many indexes
/// that is (one, or one per partition). `conn`'s own counts are sent to
/// them first.
async fn index_blocks(
    conn: &mut diesel_async::AsyncPgConnection,
) -> std::collections::HashMap<String, (i64, i64)> {
    flush_statistics(conn).await;
    // On a partitioned table, each partition's index counts as the
    // table's index it belongs to, and the former table's own primary key
    // (on the partition `outbox_event_legacy`) as the primary key.
    diesel::sql_query(
        "SELECT CASE WHEN s.indexrelname = 'outbox_event_legacy_pkey' THEN 'outbox_event_pkey'
                     ELSE coalesce(pg_partition_root(s.indexrelid)::text, s.indexrelname::text)
                END AS name,
                sum(s.idx_blks_hit + s.idx_blks_read)::bigint AS blocks,
                count(*) AS indexes
         FROM pg_statio_user_indexes s
         WHERE s.relid IN (SELECT relid FROM pg_partition_tree('outbox_event')
                           UNION ALL SELECT 'outbox_event'::regclass)
         GROUP BY 1",
    )
    .load::<IndexBlocks>(conn)
    .await
    .unwrap()
    .into_iter()
    .map(|row| (row.name, (row.blocks, row.indexes)))
    .collect()
}

/// Makes the session send its statistics to the server as it goes idle
/// after this statement (Postgres otherwise waits up to a second or more).
async fn flush_statistics(conn: &mut diesel_async::AsyncPgConnection) {
    exec(conn, "SELECT pg_stat_force_next_flush()").await;
}

/// A long run costs each batch the same: each one starts where the batch
/// before ended instead of walking, from the head of the `processed_at`
/// index, the entries of every row deleted before it (they stay there until
/// a `VACUUM`), and the rows are deleted where the lock found them, without
/// a lookup through the primary key.
// Break checked: each batch starting from the oldest row again (`from`
// left `None` in `purge_done_until`) read 10,275 blocks of the
// `processed_at` index for the 20,000 rows here, against 700; deleting the
// locked rows by id (`id = ANY (ARRAY(SELECT id …))`) read 40,001 blocks of
// the primary key, against 1.
#[tokio::test]
async fn a_retention_run_reads_each_index_entry_once_and_never_the_primary_key() {
    const ROWS: i64 = 20_000;
    const BATCH: u32 = 100;
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    // No autovacuum of its own in the middle (a server may run one).
    common::without_autovacuum(&mut conn).await;
    exec(
        &mut conn,
        &format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
             SELECT 'old', 'audit.user.login', '{{}}', 'DONE', now() - interval '31 days' - g * interval '1 ms',
                    now() - interval '31 days'
             FROM generate_series(1, {ROWS}) AS g"
        ),
    )
    .await;
    exec(&mut conn, "VACUUM ANALYZE outbox_event").await;
    let before = index_blocks(&mut conn).await;
    let pool = outbox_pg::connect_pool(h.db.url(), 1).await.unwrap();

    let deleted = purge_done(
        &pool,
        RetentionConfig::new(Duration::from_secs(720 * 3600), BATCH),
    )
    .await
    .unwrap();
    flush_statistics(&mut pool.get().await.unwrap()).await;

    assert_eq!(deleted, ROWS as u64);
    let after = index_blocks(&mut conn).await;
    let read = |index: &str| after[index].0 - before[index].0;
    // The planner reads each index's metapage once a session: on a
    // partitioned table, the index of each partition.
    let pkey = read("outbox_event_pkey");
    let pkeys = after["outbox_event_pkey"].1;
    assert!(
        pkey <= 2 * pkeys,
        "{pkey} blocks of the primary key ({pkeys} indexes) read: the deleted rows were looked up through it"
    );
    // Each of the 201 batches descends the index once (its root and inner
    // page, a leaf or two); the index's 20,000 entries fill about 60
    // leaves, so a run that walks them again at every batch reads thousands.
    let batches = ROWS / i64::from(BATCH) + 1;
    let processed_at = read("outbox_event_done_processed_at_idx");
    assert!(
        processed_at <= 5 * batches,
        "{processed_at} blocks of the processed_at index read by {batches} batches"
    );
}

/// Converts `outbox_event` to daily partitions unless it is partitioned
/// already (the partitioned run).
async fn partitioned(conn: &mut diesel_async::AsyncPgConnection) {
    if outbox_store::partitioning(conn).await.unwrap().is_none() {
        outbox_store::convert_to_partitioned(conn, outbox_store::PartitionUnit::Day, 3)
            .await
            .unwrap();
    }
}

/// On a partitioned table a retention run creates the partitions ahead that
/// are missing, and deletes the old DONE rows of the partitions it keeps.
#[tokio::test]
async fn a_retention_run_on_a_partitioned_table_creates_the_partitions_ahead_and_deletes_old_rows()
{
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    partitioned(&mut conn).await;
    let ahead = |parts: Vec<outbox_store::PartitionInfo>| {
        parts
            .into_iter()
            .map(|p| p.name)
            .filter(|n| n != outbox_store::LEGACY_PARTITION && n != outbox_store::DEFAULT_PARTITION)
            .collect::<Vec<_>>()
    };
    let before = ahead(outbox_store::partitions(&mut conn).await.unwrap());
    let newest = before.last().expect("partitions ahead").clone();
    exec(&mut conn, &format!("DROP TABLE \"{newest}\"")).await;
    old_done_rows(&mut conn, "old-done", 3).await;

    let deleted = purge_done(
        h.db.pool(),
        RetentionConfig::new(RetentionConfig::DEFAULT_RETENTION, 2),
    )
    .await
    .unwrap();

    assert_eq!(deleted, 3);
    assert_eq!(
        ahead(outbox_store::partitions(&mut conn).await.unwrap()),
        before
    );
}

/// On a partitioned table a retention run drops a partition that holds
/// only DONE rows older than the window, instead of deleting its rows, and
/// keeps the partitions that are not over.
// Break checked: with the run's loop over `drop_finished_partition` not
// entered (its `!` deleted, a miss of the pinned mutation shard 4) the old
// partition stays and this fails.
#[tokio::test]
async fn a_retention_run_drops_a_partition_that_holds_only_old_done_rows() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    partitioned(&mut conn).await;
    // A day 60 days ago gets a partition of its own: the legacy partition,
    // which holds every instant before the conversion, makes way for it.
    let from = chrono::Utc::now() - chrono::TimeDelta::days(61);
    let to = from + chrono::TimeDelta::days(1);
    exec(
        &mut conn,
        &format!(
            "ALTER TABLE outbox_event DETACH PARTITION {legacy};
             CREATE TABLE outbox_event_old_day PARTITION OF outbox_event
                 FOR VALUES FROM ('{from}') TO ('{to}');
             INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, created_at)
             SELECT 'old-day', 'audit.user.login', '{{}}', 'DONE', '{at}', '{at}'
             FROM generate_series(1, 3)",
            legacy = outbox_store::LEGACY_PARTITION,
            from = from.to_rfc3339(),
            to = to.to_rfc3339(),
            at = (from + chrono::TimeDelta::hours(12)).to_rfc3339(),
        ),
    )
    .await;
    let names = async |conn: &mut diesel_async::AsyncPgConnection| {
        outbox_store::partitions(conn)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
    };
    let before = names(&mut conn).await;
    assert!(
        before.contains(&"outbox_event_old_day".to_owned()),
        "{before:?}"
    );

    purge_done(h.db.pool(), RetentionConfig::default())
        .await
        .unwrap();

    let after = names(&mut conn).await;
    let expected: Vec<String> = before
        .into_iter()
        .filter(|name| name != "outbox_event_old_day")
        .collect();
    assert_eq!(after, expected, "only the old day's partition is dropped");
    assert!(
        h.rows().await.iter().all(|row| row.tenant_id != "old-day"),
        "its rows went with it"
    );
}

/// A conversion to partitions whose connection died leaves its bound
/// constraint (which refuses rows created past it) and its copy of the
/// held keys; the next retention run removes them. Break checked: without the retention run's call of
/// `outbox_store::remove_conversion_leftovers`, the constraint stays and the
/// row created past it is refused.
#[tokio::test]
async fn a_retention_run_removes_what_a_failed_partition_conversion_left_so_later_rows_go_in() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    if outbox_store::partitioning(&mut conn)
        .await
        .unwrap()
        .is_some()
    {
        // The partitioned run: nothing of a conversion is left on one table.
        return;
    }
    exec(
        &mut conn,
        "ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_partition_bound
             CHECK (created_at < now() + interval '1 day') NOT VALID;
         INSERT INTO outbox_dispatch_key (dispatch_key, event_id, created_at)
             VALUES ('cart-1', gen_random_uuid(), now())",
    )
    .await;

    purge_done(h.db.pool(), RetentionConfig::default())
        .await
        .unwrap();

    // A producer's row created two days ahead.
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, created_at)
         VALUES ('acme', 'mail.cart.reminder', '{}', now() + interval '2 days')",
    )
    .await;
    assert_eq!(
        outbox_store::remove_conversion_leftovers(&mut conn)
            .await
            .unwrap(),
        outbox_store::ConversionLeftovers::default(),
        "the retention run left nothing to remove"
    );
}

/// A database with a Redis guard's namespace, `retention-test`, checked
/// now, and what `sql` adds (safe points of its queues, rows).
async fn guarded(sql: &str) -> (Harness, diesel_async::AsyncPgConnection) {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_redis_epoch (namespace, epoch, run_id, checked_at)
         VALUES ('retention-test', gen_random_uuid(), 'run', now())",
    )
    .await;
    exec(&mut conn, sql).await;
    (h, conn)
}

/// A retention of one hour, held back by the Redis guard for at most four.
fn one_hour_within_a_four_hour_reach() -> RetentionConfig {
    RetentionConfig {
        guard_reach: Duration::from_secs(4 * 3600),
        ..RetentionConfig::new(Duration::from_secs(3600), 1000)
    }
}

/// The tenants of the DONE rows left, sorted.
async fn done_left(h: &Harness) -> Vec<String> {
    let mut left: Vec<String> = h
        .rows()
        .await
        .into_iter()
        .filter(|r| r.status == OutboxStatus::Done)
        .map(|r| r.tenant_id)
        .collect();
    left.sort();
    left
}

// A retention shorter than the time a queue's jobs take to finish (workers
// down for an hour, say) must not delete the DONE rows of jobs still in
// Redis: after a loss, those rows are all the Redis guard has to push the
// jobs again from.
// Break checked: `purge` deleting by `config.retention` alone (the hold
// ignored) fails the first run's count (and the next test: 2 instead of 1).
#[tokio::test]
async fn retention_keeps_done_rows_the_redis_guard_may_still_push_again_however_short_the_window() {
    // Queue `a` is known to have finished everything handed off up to 10
    // minutes ago; queue `b`, up to a minute ago, but a reconciliation of it
    // after a loss still has to push again what was handed off in the last
    // 90 minutes.
    let (h, mut conn) = guarded(
        "INSERT INTO outbox_redis_safe_point (namespace, queue, drained_before, pending_since)
         VALUES ('retention-test', 'a', now() - interval '10 minutes', NULL),
                ('retention-test', 'b', now() - interval '1 minute', now() - interval '90 minutes');
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         VALUES ('handed-off-3h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '3 hours 5 minutes'),
                ('handed-off-2h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '2 hours'),
                ('handed-off-40m-ago', 'audit.user.login', '{}', 'DONE', now() - interval '40 minutes')",
    )
    .await;
    // Retention of 0 hours: every DONE row is old enough, but the
    // reconciliation of `b` still needs the one handed off 40 minutes ago.
    let config = RetentionConfig::new(Duration::ZERO, 1000);

    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 2);
    assert_eq!(done_left(&h).await, ["handed-off-40m-ago"]);

    // The reconciliation is done: nothing before the safe points (10 and 1
    // minutes ago) is needed any more.
    exec(
        &mut conn,
        "UPDATE outbox_redis_safe_point SET pending_since = NULL",
    )
    .await;
    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 1);
    assert_eq!(done_left(&h).await, Vec::<String>::new());
}

// A queue that is no longer checked (its route removed) keeps its old
// safe point; it holds rows back for no longer than the guard reaches.
// Break checked: `redis_guard_hold` without its `reach` bound deletes
// neither row: 0 instead of 1.
#[tokio::test]
async fn an_old_safe_point_holds_done_rows_back_no_longer_than_the_guard_reaches() {
    let (h, _conn) = guarded(
        "INSERT INTO outbox_redis_safe_point (namespace, queue, drained_before)
         VALUES ('retention-test', 'gone', now() - interval '30 days');
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         VALUES ('handed-off-5h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '5 hours'),
                ('handed-off-3h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '3 hours')",
    )
    .await;
    let config = one_hour_within_a_four_hour_reach();

    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 1);
    assert_eq!(done_left(&h).await, ["handed-off-3h-ago"]);
}

// A reconciliation under way pushes from its cursor however far back it
// is (it started within the reach and took long); a namespace no
// dispatcher has checked within the reach holds nothing back.
// Break checked: the reconciliation's cursor capped at the reach as safe
// points are (`LEAST` of both under the reach's `GREATEST`) deletes the row
// handed off 5 hours ago at the first run: 2 instead of 1; the namespace's
// last check not looked at keeps the last row: 0 instead of 1.
#[tokio::test]
async fn a_reconciliation_under_way_holds_rows_past_the_reach_and_an_unchecked_namespace_none() {
    let (h, mut conn) = guarded(
        "INSERT INTO outbox_redis_safe_point (namespace, queue, drained_before, pending_since)
         VALUES ('retention-test', 'a', now() - interval '1 minute', now() - interval '6 hours');
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         VALUES ('handed-off-7h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '7 hours'),
                ('handed-off-5h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '5 hours'),
                ('handed-off-3h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '3 hours')",
    )
    .await;
    let config = one_hour_within_a_four_hour_reach();

    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 1);
    assert_eq!(
        done_left(&h).await,
        ["handed-off-3h-ago", "handed-off-5h-ago"]
    );

    // The reconciliation is done: back to the safe point, a minute ago.
    exec(
        &mut conn,
        "UPDATE outbox_redis_safe_point SET pending_since = NULL",
    )
    .await;
    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 2);
    assert_eq!(done_left(&h).await, Vec::<String>::new());

    // A reconciliation left by a namespace nobody checks any more.
    exec(
        &mut conn,
        "UPDATE outbox_redis_safe_point SET pending_since = now() - interval '6 hours';
         UPDATE outbox_redis_epoch SET checked_at = now() - interval '5 hours';
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         VALUES ('handed-off-2h-ago', 'audit.user.login', '{}', 'DONE', now() - interval '2 hours')",
    )
    .await;
    assert_eq!(purge_done(h.db.pool(), config).await.unwrap(), 1);
}
