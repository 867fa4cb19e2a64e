//! Group commit of the audit and notification handlers, against a real
//! Postgres: each job is answered only once its own row is committed, a
//! redelivery writes nothing, a row Postgres refuses fails alone, and a
//! database outage fails every job waiting on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use chrono::Utc;
use diesel::sql_types::{BigInt, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures::future::join_all;
use outbox_model::RawJson;
use outbox_pg::PgPool;
use outbox_queue::OutboxJob;
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use outbox_subscriber_audit::{AuditHandler, GROUP_COMMIT_CONCURRENCY, NotificationHandler};
use outbox_test_support::{
    LogCapture, TestDatabase, database_server_url, eventually, with_database,
};
use uuid::Uuid;

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn job(event_type: &str, payload: &str) -> OutboxJob {
    OutboxJob {
        outbox_event_id: Uuid::now_v7(),
        tenant_id: "acme".into(),
        event_type: event_type.into(),
        payload: RawJson::from_text(payload).expect("test payloads are JSON"),
        dispatch_key: None,
        created_at: Utc::now(),
        generation: 0,
        trace_context: None,
        priority: outbox_model::Priority::NORMAL,
        ordering_key: None,
        ordering_position: None,
    }
}

fn meta(queue: &str) -> JobMeta {
    JobMeta {
        queue: queue.into(),
        task_id: "test".into(),
        attempt: 1,
    }
}

async fn deliver<H: JobHandler<Job = OutboxJob>>(
    handler: &H,
    job: OutboxJob,
) -> Result<(), JobError> {
    handler.handle(job, &meta(handler.queue())).await
}

/// Rows of `table` recording `event`, seen through `pool`.
async fn rows_of(pool: &PgPool, table: &str, event: Uuid) -> i64 {
    let mut conn = pool.get().await.expect("observer connection");
    diesel::sql_query(format!(
        "SELECT count(*) AS n FROM {table} WHERE outbox_event_id = $1"
    ))
    .bind::<SqlUuid, _>(event)
    .get_result::<Count>(&mut conn)
    .await
    .expect("count rows")
    .n
}

async fn total(conn: &mut AsyncPgConnection, table: &str) -> i64 {
    diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
        .get_result::<Count>(conn)
        .await
        .expect("count rows")
        .n
}

/// A second pool on the same database: what another process would see.
async fn observer(db: &TestDatabase) -> PgPool {
    outbox_pg::connect_pool(db.url(), 2)
        .await
        .expect("observer pool")
}

/// Holds writes to `table` back (a `SHARE` lock in an open transaction)
/// until the returned connection commits, and waits until the writer task
/// is blocked on it: the rows handed over meanwhile form one batch.
async fn block_writes(db: &TestDatabase, table: &str) -> AsyncPgConnection {
    let mut lock = db.conn().await;
    lock.batch_execute(&format!("BEGIN; LOCK TABLE {table} IN SHARE MODE"))
        .await
        .expect("lock the table");
    lock
}

async fn wait_until_a_write_is_blocked(db: &TestDatabase) {
    eventually(
        "the writer to wait on the lock",
        Duration::from_secs(30),
        async || db.waits_on_a_lock("INSERT%").await,
    )
    .await;
}

#[tokio::test]
async fn concurrent_jobs_write_one_row_each_and_are_answered_after_it_is_committed() {
    let db = TestDatabase::new().await;
    let others = observer(&db).await;
    let audit = AuditHandler::new(db.pool().clone());
    let notifications = NotificationHandler::new(db.pool().clone());
    let audited: Vec<_> = (0..300)
        .map(|i| job("audit.user.login", &format!(r#"{{"actor":"user-{i}"}}"#)))
        .collect();
    let notified: Vec<_> = (0..100)
        .map(|i| {
            job(
                "notification.sent",
                &format!(r#"{{"title":"t{i}","userId":"u{i}"}}"#),
            )
        })
        .collect();
    let audit_calls = audited.iter().cloned().map(|job| {
        let (audit, others) = (&audit, &others);
        async move {
            let id = job.outbox_event_id;
            deliver(audit, job).await.expect("audit job succeeds");
            // Answered: the row must already be visible to anyone else.
            assert_eq!(rows_of(others, "audit_log", id).await, 1, "{id}");
        }
    });
    let notification_calls = notified.iter().cloned().map(|job| {
        let (notifications, others) = (&notifications, &others);
        async move {
            let id = job.outbox_event_id;
            deliver(notifications, job)
                .await
                .expect("notification job succeeds");
            assert_eq!(rows_of(others, "notification", id).await, 1, "{id}");
        }
    });
    futures::join!(join_all(audit_calls), join_all(notification_calls));
    let mut conn = db.conn().await;
    assert_eq!(total(&mut conn, "audit_log").await, 300);
    assert_eq!(total(&mut conn, "notification").await, 100);
    let actor: String =
        diesel::sql_query("SELECT actor AS t FROM audit_log WHERE outbox_event_id = $1")
            .bind::<SqlUuid, _>(audited[7].outbox_event_id)
            .get_result::<TextColumn>(&mut conn)
            .await
            .expect("the row")
            .t;
    assert_eq!(actor, "user-7");
}

/// One text column, `t`.
#[derive(diesel::QueryableByName)]
struct TextColumn {
    #[diesel(sql_type = Text)]
    t: String,
}

#[tokio::test]
async fn a_redelivered_job_writes_nothing_and_succeeds_also_within_one_batch() {
    let db = TestDatabase::new().await;
    let others = observer(&db).await;
    let audit = AuditHandler::new(db.pool().clone());
    let first = job("audit.user.login", r#"{"actor":"ada"}"#);
    deliver(&audit, first.clone())
        .await
        .expect("first delivery");
    deliver(&audit, first.clone()).await.expect("redelivery");
    assert_eq!(
        rows_of(&others, "audit_log", first.outbox_event_id).await,
        1
    );

    // Two deliveries of a new event and one of the old in the same statement.
    let opener = job("audit.user.login", "{}");
    let twice = job("audit.user.login", r#"{"actor":"bob"}"#);
    let batch = vec![opener.clone(), twice.clone(), twice.clone(), first.clone()];
    deliver_as_one_batch(&db, &audit, "audit_log", batch).await;
    for event in [&first, &opener, &twice] {
        assert_eq!(
            rows_of(&others, "audit_log", event.outbox_event_id).await,
            1
        );
    }
    assert_eq!(total(&mut db.conn().await, "audit_log").await, 3);
}

#[tokio::test]
async fn a_row_postgres_refuses_fails_alone_and_the_rest_of_its_batch_is_written_once() {
    let db = TestDatabase::new().await;
    let others = observer(&db).await;
    let audit = AuditHandler::new(db.pool().clone());
    let mut lock = block_writes(&db, "audit_log").await;
    let opener = job("audit.user.login", "{}");
    let good: Vec<_> = (0..20)
        .map(|i| job("audit.user.login", &format!(r#"{{"actor":"user-{i}"}}"#)))
        .collect();
    // jsonb cannot hold the NUL character: Postgres refuses this row.
    let bad = job("audit.user.login", r#"{"actor":"eve","note":"\u0000"}"#);
    let mut batch = good.clone();
    batch.insert(10, bad.clone());
    batch.push(good[3].clone());
    let mut opening = Box::pin(deliver(&audit, opener.clone()));
    assert!(futures::poll!(opening.as_mut()).is_pending());
    wait_until_a_write_is_blocked(&db).await;
    let mut calls: Vec<_> = batch
        .iter()
        .cloned()
        .map(|job| Box::pin(deliver(&audit, job)))
        .collect();
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    lock.batch_execute("COMMIT")
        .await
        .expect("release the lock");
    assert_eq!(opening.await, Ok(()));
    let results = join_all(calls).await;
    for (job, result) in batch.iter().zip(&results) {
        if job.outbox_event_id == bad.outbox_event_id {
            match result {
                Err(JobError::Retry(reason)) => {
                    assert!(reason.starts_with("database error"), "{reason}")
                }
                other => panic!("the refused row: {other:?}"),
            }
        } else {
            assert_eq!(result, &Ok(()), "{}", job.outbox_event_id);
        }
    }
    for job in &good {
        assert_eq!(rows_of(&others, "audit_log", job.outbox_event_id).await, 1);
    }
    assert_eq!(rows_of(&others, "audit_log", bad.outbox_event_id).await, 0);
    assert_eq!(total(&mut db.conn().await, "audit_log").await, 21);
}

/// Closes `db` to new connections and ends the open ones (`up: false`), or
/// opens it again.
async fn set_database_up(db: &TestDatabase, up: bool) {
    let mut admin =
        AsyncPgConnection::establish(&with_database(&database_server_url(), "postgres"))
            .await
            .expect("admin connection");
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" ALLOW_CONNECTIONS {up}",
            db.name()
        ))
        .await
        .expect("alter the database");
    if !up {
        diesel::sql_query(
            "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind::<Text, _>(db.name())
        .get_result::<Count>(&mut admin)
        .await
        .expect("end the database's connections");
    }
}

#[tokio::test]
async fn when_the_database_is_down_every_waiting_job_fails_and_succeeds_once_it_is_back() {
    let db = TestDatabase::new().await;
    // A pool that gives up on a connection quickly, so that the outage is
    // reported within the test.
    let pool: PgPool = bb8::Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::from_secs(2))
        .build_unchecked(
            diesel_async::pooled_connection::AsyncDieselConnectionManager::<AsyncPgConnection>::new(
                db.url(),
            ),
        );
    let audit = AuditHandler::new(pool);
    deliver(&audit, job("audit.user.login", "{}"))
        .await
        .expect("a job while the database is up");

    set_database_up(&db, false).await;
    let waiting: Vec<_> = (0..20).map(|_| job("audit.user.login", "{}")).collect();
    let results = join_all(waiting.iter().cloned().map(|job| deliver(&audit, job))).await;
    for result in &results {
        assert!(matches!(result, Err(JobError::Retry(_))), "{result:?}");
    }

    set_database_up(&db, true).await;
    let mut conn = db.conn().await;
    assert_eq!(
        total(&mut conn, "audit_log").await,
        1,
        "nothing of the failed jobs was written"
    );
    let later = job("audit.user.login", "{}");
    eventually(
        "a job to succeed once the database is back",
        Duration::from_secs(60),
        async || deliver(&audit, later.clone()).await.is_ok(),
    )
    .await;
    // The failed jobs, retried, are written once each.
    let retried = join_all(waiting.iter().cloned().map(|job| deliver(&audit, job))).await;
    assert!(retried.iter().all(Result::is_ok), "{retried:?}");
    assert_eq!(total(&mut conn, "audit_log").await, 22);
}

// Breaks checked (a mutation run's shard 6 of the subscriber crates): either
// handler's `concurrency` answering 0 (the worker then runs one job at a
// time, so no group commit ever holds more than one row), and either
// handler consuming another queue than the one the description gives the
// routing table, fail here.
#[tokio::test]
async fn both_handlers_consume_the_described_queues_and_run_a_group_commits_worth_of_jobs_at_once()
{
    let db = TestDatabase::new().await;
    let audit = AuditHandler::new(db.pool().clone());
    let notifications = NotificationHandler::new(db.pool().clone());
    let mut consumed = vec![audit.queue().to_owned(), notifications.queue().to_owned()];
    consumed.sort();
    let mut described: Vec<String> = [
        outbox_catalog::built_in::AUDIT,
        outbox_catalog::built_in::NOTIFICATION,
    ]
    .iter()
    .flat_map(|d| d.queues())
    .map(str::to_owned)
    .collect();
    described.sort();
    assert_eq!(consumed, described);
    for configured in [1, 8, GROUP_COMMIT_CONCURRENCY] {
        assert_eq!(audit.concurrency(configured), GROUP_COMMIT_CONCURRENCY);
        assert_eq!(
            notifications.concurrency(configured),
            GROUP_COMMIT_CONCURRENCY
        );
    }
    // A larger WORKER_CONCURRENCY is kept.
    assert_eq!(audit.concurrency(500), 500);
    assert_eq!(notifications.concurrency(500), 500);
}

#[derive(diesel::QueryableByName)]
struct Kept {
    #[diesel(sql_type = Text)]
    statement: String,
}

/// The statements `conn` keeps prepared that start with `prefix`.
async fn kept_on(conn: &mut AsyncPgConnection, prefix: &str) -> Vec<String> {
    let kept: Vec<Kept> = diesel::sql_query("SELECT statement FROM pg_prepared_statements")
        .load(conn)
        .await
        .expect("read the prepared statements");
    kept.into_iter()
        .map(|kept| kept.statement)
        .filter(|sql| sql.starts_with(prefix))
        .collect()
}

/// Delivers `jobs` so that they reach the writer together: the first write
/// waits on a lock of `table` until the rest are queued behind it.
async fn deliver_as_one_batch<H: JobHandler<Job = OutboxJob>>(
    db: &TestDatabase,
    handler: &H,
    table: &str,
    jobs: Vec<OutboxJob>,
) {
    let mut lock = block_writes(db, table).await;
    let mut calls: Vec<_> = jobs
        .into_iter()
        .map(|job| Box::pin(deliver(handler, job)))
        .collect();
    assert!(futures::poll!(calls[0].as_mut()).is_pending());
    wait_until_a_write_is_blocked(db).await;
    for call in &mut calls[1..] {
        // Polled once, the row is handed to the writer.
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    lock.batch_execute("COMMIT")
        .await
        .expect("release the lock");
    for result in join_all(calls).await {
        assert_eq!(result, Ok(()));
    }
}

// Batches of one, three and two rows through one pooled connection leave
// one prepared insert per table on it: the statement's text does not
// depend on the number of rows. Fails when the insert goes back to a
// multi-row `VALUES` list (a text per row count, none of them kept: every
// batch parsed and planned again).
#[tokio::test]
async fn batches_of_any_size_run_one_insert_the_connection_keeps_prepared() {
    let db = TestDatabase::with_pool_size(1).await;
    let audit = AuditHandler::new(db.pool().clone());
    let notifications = NotificationHandler::new(db.pool().clone());
    // Odd rows leave the optional columns out (NULL elements in the arrays).
    let audit_jobs: Vec<_> = (0..6)
        .map(|n| match n % 2 {
            0 => job("audit.user.login", &format!(r#"{{"actor":"user-{n}"}}"#)),
            _ => job("audit.user.login", "{}"),
        })
        .collect();
    let notification_jobs: Vec<_> = (0..6)
        .map(|n| match n % 2 {
            0 => job(
                "notification.user.mentioned",
                &format!(r#"{{"title":"Hello {n}","body":"b","userId":"u-{n}"}}"#),
            ),
            _ => job(
                "notification.user.mentioned",
                &format!(r#"{{"title":"Hello {n}"}}"#),
            ),
        })
        .collect();
    for (first, end) in [(0, 1), (1, 4), (4, 6)] {
        let batch = audit_jobs[first..end].to_vec();
        if batch.len() == 1 {
            deliver(&audit, batch[0].clone()).await.expect("audit");
        } else {
            deliver_as_one_batch(&db, &audit, "audit_log", batch).await;
        }
        let batch = notification_jobs[first..end].to_vec();
        if batch.len() == 1 {
            deliver(&notifications, batch[0].clone())
                .await
                .expect("notification");
        } else {
            deliver_as_one_batch(&db, &notifications, "notification", batch).await;
        }
    }
    // Every column of every row is the job's (the arrays line up).
    let mut observer = db.conn().await;
    for (n, job) in audit_jobs.iter().enumerate() {
        let row: TextColumn = diesel::sql_query(
            "SELECT concat_ws('|', tenant_id, event_type, coalesce(actor, 'NULL'),
                    payload::text, occurred_at = $2) AS t
             FROM audit_log WHERE outbox_event_id = $1",
        )
        .bind::<SqlUuid, _>(job.outbox_event_id)
        .bind::<diesel::sql_types::Timestamptz, _>(job.created_at)
        .get_result(&mut observer)
        .await
        .expect("the audit row");
        assert_eq!(
            row.t,
            match n % 2 {
                0 => format!(r#"acme|audit.user.login|user-{n}|{{"actor": "user-{n}"}}|t"#),
                _ => "acme|audit.user.login|NULL|{}|t".to_owned(),
            }
        );
    }
    for (n, job) in notification_jobs.iter().enumerate() {
        let row: TextColumn = diesel::sql_query(
            "SELECT concat_ws('|', tenant_id, coalesce(user_id, 'NULL'), kind, title,
                    coalesce(body, 'NULL'), data->>'title') AS t
             FROM notification WHERE outbox_event_id = $1",
        )
        .bind::<SqlUuid, _>(job.outbox_event_id)
        .get_result(&mut observer)
        .await
        .expect("the notification row");
        assert_eq!(
            row.t,
            match n % 2 {
                0 => format!("acme|u-{n}|notification.user.mentioned|Hello {n}|b|Hello {n}"),
                _ => format!("acme|NULL|notification.user.mentioned|Hello {n}|NULL|Hello {n}"),
            }
        );
    }
    assert_eq!(total(&mut observer, "audit_log").await, 6);
    assert_eq!(total(&mut observer, "notification").await, 6);

    let mut pooled = db.pool().get().await.expect("the pool's one connection");
    let audit_inserts = kept_on(&mut pooled, "INSERT INTO audit_log").await;
    assert_eq!(audit_inserts.len(), 1, "{audit_inserts:?}");
    let notification_inserts = kept_on(&mut pooled, "INSERT INTO notification").await;
    assert_eq!(notification_inserts.len(), 1, "{notification_inserts:?}");
}

// The log tells a redelivery from a first write: only the redelivery says
// its entry was already recorded, for audit entries and notifications
// alike. Break checked: with the handlers' `==` made `!=`, the first
// delivery logs it and the redelivery does not.
#[tokio::test]
async fn only_a_redelivery_logs_that_its_entry_was_already_recorded() {
    // A process-wide subscriber, so that tests logging the same line on
    // other threads (`cargo test` runs them in one process) do not make
    // tracing decide that nobody listens to it.
    outbox_test_support::init_tracing();
    let db = TestDatabase::new().await;
    let audit = AuditHandler::new(db.pool().clone());
    let notifications = NotificationHandler::new(db.pool().clone());
    let logs = LogCapture::start();
    for (handler, event, line) in [
        (
            &audit as &dyn Deliver,
            job("audit.user.login", r#"{"actor":"ada"}"#),
            "audit entry already recorded",
        ),
        (
            &notifications as &dyn Deliver,
            job("notification.sent", r#"{"userId":"u1","title":"Hi"}"#),
            "notification already written",
        ),
    ] {
        handler.deliver(event.clone()).await;
        assert_eq!(
            logs.count(line),
            0,
            "after the first delivery: {}",
            logs.text()
        );
        handler.deliver(event).await;
        assert_eq!(logs.count(line), 1, "after the redelivery: {}", logs.text());
    }
}

/// Delivers one job through either handler, expecting success.
trait Deliver {
    fn deliver(&self, job: OutboxJob) -> futures::future::LocalBoxFuture<'_, ()>;
}

impl<H: JobHandler<Job = OutboxJob>> Deliver for H {
    fn deliver(&self, job: OutboxJob) -> futures::future::LocalBoxFuture<'_, ()> {
        Box::pin(async move { deliver(self, job).await.expect("the job succeeds") })
    }
}
