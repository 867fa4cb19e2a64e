//! The Redis guard and reconciliation against real Postgres and Redis: a
//! loss is noticed (FLUSHALL, a restart without persistence, a restart with
//! `appendfsync everysec`), a restart with `appendfsync always` is not one,
//! the lost jobs are pushed again and nothing else is, a finished parent
//! whose derived job is gone runs again, and the safe point keeps jobs that
//! had finished before a loss out of its window.
//!
//! Tests that flush or restart Redis use a private `redis-server` each
//! ([`RedisProcess`]); the others a key namespace on the shared one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_catalog::Catalog;
use outbox_dispatch::{
    Assessment, Dispatcher, DispatcherConfig, LossReason, ReconcileOptions, ReconcileReport,
    Reconciler, RedisGuardSettings, SafePointPass, Standing,
};
use outbox_model::OutboxEvent;
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use outbox_queue::RedisConnection;
use outbox_queue::{
    JobStateKind, QueueNamespace, RedisSettings, apalis_config, generation_task_id, job_states,
    queues, task_id,
};
use outbox_store as db;
use outbox_subscriber::{ConsumedQueue, DerivedTaskIds, DownstreamQueue, SubscriberDescription};
use outbox_test_support::{LogCapture, RedisProcess, TestDatabase, TestRedis};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const TENANT: &str = "acme";

/// A database, a Redis (private or a namespace on the shared one) and a
/// dispatcher with its guard on them.
struct Rig {
    db: TestDatabase,
    redis_url: String,
    namespace: QueueNamespace,
    dispatcher: Dispatcher,
    /// Keeps the shared Redis namespace alive (and cleans it up).
    _shared: Option<TestRedis>,
}

/// A dispatcher with its Redis guard on `db` and the Redis at `redis_url`.
fn guarded_dispatcher(
    db: &TestDatabase,
    redis_url: &str,
    namespace: &QueueNamespace,
) -> Dispatcher {
    guarded_dispatcher_with(db, redis_url, namespace, RedisGuardSettings::default())
}

/// [`guarded_dispatcher`] whose guard has `settings` (the safe point lag
/// set to zero).
fn guarded_dispatcher_with(
    db: &TestDatabase,
    redis_url: &str,
    namespace: &QueueNamespace,
    settings: RedisGuardSettings,
) -> Dispatcher {
    let settings = RedisGuardSettings {
        // Rows handed off a moment ago may move the safe point at once.
        safe_point_lag: Duration::ZERO,
        ..settings
    };
    dispatcher_guarded_as(db, redis_url, namespace, settings)
}

/// A dispatcher whose guard has exactly `settings`.
fn dispatcher_guarded_as(
    db: &TestDatabase,
    redis_url: &str,
    namespace: &QueueNamespace,
    settings: RedisGuardSettings,
) -> Dispatcher {
    let redis = outbox_queue::connect(&RedisSettings::new(redis_url)).unwrap();
    Dispatcher::new(
        db.pool().clone(),
        db.url(),
        redis,
        namespace.clone(),
        outbox_catalog::standard_router().unwrap(),
        DispatcherConfig {
            listen: false,
            ..DispatcherConfig::default()
        },
    )
    .unwrap()
    .with_redis_guard(settings, Catalog::built_in().receivers())
}

impl Rig {
    async fn on(redis_url: String, namespace: QueueNamespace, shared: Option<TestRedis>) -> Self {
        Self::on_with(redis_url, namespace, shared, RedisGuardSettings::default()).await
    }

    async fn on_with(
        redis_url: String,
        namespace: QueueNamespace,
        shared: Option<TestRedis>,
        settings: RedisGuardSettings,
    ) -> Self {
        outbox_test_support::init_tracing();
        let db = TestDatabase::new().await;
        let dispatcher = guarded_dispatcher_with(&db, &redis_url, &namespace, settings);
        Self {
            db,
            redis_url,
            namespace,
            dispatcher,
            _shared: shared,
        }
    }

    async fn private(redis: &RedisProcess) -> Self {
        Self::on(redis.url(), QueueNamespace::root(), None).await
    }

    /// A rig on a private server whose guard always scans (the unfinished
    /// jobs' list turned off).
    async fn private_scanning(redis: &RedisProcess) -> Self {
        Self::on_with(
            redis.url(),
            QueueNamespace::root(),
            None,
            RedisGuardSettings {
                unfinished_limit: 0,
                ..RedisGuardSettings::default()
            },
        )
        .await
    }

    async fn shared() -> Self {
        let redis = TestRedis::new().await;
        let namespace = QueueNamespace::prefixed(redis.prefix());
        Self::on(redis.url().to_owned(), namespace, Some(redis)).await
    }

    fn redis(&self) -> RedisConnection {
        outbox_queue::connect(&RedisSettings::new(&self.redis_url)).unwrap()
    }

    fn reconciler(&self) -> Reconciler {
        self.reconciler_of(&Catalog::built_in())
    }

    /// A reconciler reading what each queue's handler leaves behind from
    /// `catalog`'s descriptions.
    fn reconciler_of(&self, catalog: &Catalog) -> Reconciler {
        Reconciler::new(self.redis(), self.namespace.clone(), catalog.receivers())
    }

    /// `outbox reconcile --since 1h` of `queues`, as a library call.
    async fn reconcile(&self, queues: &[&str], dry_run: bool) -> ReconcileReport {
        self.reconcile_as(&Catalog::built_in(), queues, dry_run)
            .await
    }

    /// [`Rig::reconcile`] with what `catalog` describes.
    async fn reconcile_as(
        &self,
        catalog: &Catalog,
        queues: &[&str],
        dry_run: bool,
    ) -> ReconcileReport {
        let mut conn = self.db.conn().await;
        self.reconciler_of(catalog)
            .reconcile(
                &mut conn,
                &ReconcileOptions {
                    since: Utc::now() - chrono::Duration::hours(1),
                    queues: queues.iter().map(|q| (*q).to_owned()).collect(),
                    dry_run,
                },
            )
            .await
            .unwrap()
    }

    /// Publishes `events` in one transaction and hands them off (one tick).
    async fn hand_off(&self, events: Vec<NewOutboxEvent>) -> Vec<Uuid> {
        let mut conn = self.db.conn().await;
        let ids: Vec<Uuid> = conn
            .transaction::<_, PublishError, _>(async |conn| {
                let tx = OutboxTx::new(conn)?;
                publish_outbox_events(&tx, events).await
            })
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.id())
            .collect();
        let report = self.dispatcher.tick().await.unwrap();
        assert_eq!(report.dispatched, ids.len(), "{report:?}");
        ids
    }

    /// One check; a check that fails (the first command after a Redis
    /// restart finds the old connection broken) is tried again, as the
    /// guard does.
    async fn check(&self) -> Assessment {
        let guard = self.dispatcher.redis_guard().unwrap();
        let mut verdict = None;
        outbox_test_support::eventually(
            "a check that succeeds",
            Duration::from_secs(10),
            async || {
                verdict = guard.check().await.ok().map(|report| report.assessment);
                verdict.is_some()
            },
        )
        .await;
        verdict.unwrap()
    }

    /// Runs the guard's reconciliation (and safe points) until nothing is due.
    async fn repair(&self) {
        let guard = self.dispatcher.redis_guard().unwrap();
        let stop = CancellationToken::new();
        while guard.reconcile_pending(&stop).await.unwrap() {}
        guard.advance_safe_points(&stop).await.unwrap();
    }

    async fn state(&self, queue: &str, task_id: &str) -> JobStateKind {
        let mut redis = self.redis();
        job_states(&mut redis, &self.namespace, queue, &[task_id.to_owned()])
            .await
            .unwrap()[0]
            .kind
    }

    /// `FLUSHALL` on the rig's Redis (only for a private server).
    async fn flush_all(&self) {
        let mut redis = self.redis();
        let () = redis::cmd("FLUSHALL")
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    /// Asserts that the job of each of `ids` waits on `queue`.
    async fn assert_waiting(&self, queue: &str, ids: &[Uuid]) {
        for id in ids {
            assert_eq!(
                self.state(queue, &task_id(*id)).await,
                JobStateKind::Waiting,
                "the job of {id} does not wait on {queue}"
            );
        }
    }

    /// What the mail worker leaves when it delivered each of `ids`: the
    /// mail job and its send job finished.
    async fn deliver_mails(&self, ids: &[Uuid]) {
        let mut redis = self.redis();
        for id in ids {
            self.finish(queues::MAIL, &task_id(*id)).await;
            let send = format!("email:{id}");
            outbox_queue::push_raw(
                &mut redis,
                &self.namespace,
                queues::TOOLCTRL_EMAIL,
                &[(send.clone(), b"{}".to_vec())],
            )
            .await
            .unwrap();
            self.finish(queues::TOOLCTRL_EMAIL, &send).await;
        }
    }

    /// What the mail worker leaves when it ran the mail job of `id` but its
    /// send job has not run yet: the mail job finished, the send job
    /// waiting on `toolctrl.email`.
    async fn derive_send_job(&self, id: Uuid) {
        self.finish(queues::MAIL, &task_id(id)).await;
        let mut redis = self.redis();
        outbox_queue::push_raw(
            &mut redis,
            &self.namespace,
            queues::TOOLCTRL_EMAIL,
            &[(format!("email:{id}"), b"{}".to_vec())],
        )
        .await
        .unwrap();
    }

    /// What the fetch script does when the worker `worker` takes `task_id`:
    /// off the queue, into its in-flight set.
    async fn start_running(&self, queue: &str, task_id: &str, worker: &str) {
        let config = apalis_config(&self.namespace, queue);
        let mut redis = self.redis();
        let () = redis::pipe()
            .zadd(config.workers_set(), worker, Utc::now().timestamp())
            .ignore()
            .zrem(config.scheduled_jobs_set(), task_id)
            .ignore()
            .lrem(config.active_jobs_list(), 0, task_id)
            .ignore()
            .sadd(format!("{}:{worker}", config.inflight_jobs_set()), task_id)
            .ignore()
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    /// What a worker does when a running job asks for a later retry: a
    /// copy `<task id>~retry1` due in an hour, and the job itself done.
    async fn retry_later(&self, queue: &str, task_id: &str, worker: &str) {
        let config = apalis_config(&self.namespace, queue);
        let mut redis = self.redis();
        outbox_queue::push_raw_at(
            &mut redis,
            &self.namespace,
            queue,
            &[(outbox_queue::retry_task_id(task_id, 1), b"{}".to_vec())],
            Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
        )
        .await
        .unwrap();
        let () = redis::pipe()
            .srem(format!("{}:{worker}", config.inflight_jobs_set()), task_id)
            .ignore()
            .query_async(&mut redis)
            .await
            .unwrap();
        self.finish(queue, task_id).await;
    }

    /// One move of the safe points by the rig's guard, tried again while
    /// it fails (the first command after a Redis restart finds the old
    /// connection broken).
    async fn advance(&self) -> SafePointPass {
        let guard = self.dispatcher.redis_guard().unwrap();
        let stop = CancellationToken::new();
        let mut pass = None;
        outbox_test_support::eventually(
            "a move of the safe points that succeeds",
            Duration::from_secs(10),
            async || {
                pass = guard.advance_safe_points(&stop).await.ok();
                pass.is_some()
            },
        )
        .await;
        pass.unwrap()
    }

    /// `report` found one job missing, a derived one, and ran its parent
    /// `parent` (on `queue`) again: the parent waits again.
    async fn assert_ran_again_alone(&self, report: &ReconcileReport, queue: &str, parent: &str) {
        assert_eq!(report.missing_total(), 1, "{report:?}");
        assert_eq!(report.repushed_total(), 1, "{report:?}");
        assert_eq!(report.missing[0].derived_from.as_deref(), Some(parent));
        assert_eq!(
            self.state(queue, parent).await,
            JobStateKind::Waiting,
            "runs again"
        );
    }

    /// A job `task_id` waiting on `queue` (its body does not matter here).
    async fn push_job(&self, queue: &str, task_id: &str) {
        let mut redis = self.redis();
        outbox_queue::push_raw(
            &mut redis,
            &self.namespace,
            queue,
            &[(task_id.to_owned(), b"{}".to_vec())],
        )
        .await
        .unwrap();
    }

    /// What a receiver records once its job did its work: `key` completed
    /// in the idempotency store.
    async fn record_completed(&self, key: &str) {
        let mut redis = self.redis();
        let () = redis::cmd("SET")
            .arg(format!(
                "{}{key}",
                outbox_queue::idempotency_prefix(&self.namespace)
            ))
            .arg(r#"{"state":"completed","result":null}"#)
            .arg("EX")
            .arg(60)
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    /// What a worker does when a job ran: out of the queue, into the done set.
    async fn finish(&self, queue: &str, task_id: &str) {
        self.settle(queue, task_id, false).await;
    }

    /// What a worker does when a job failed its last round: out of the
    /// queue, into the dead set.
    async fn kill(&self, queue: &str, task_id: &str) {
        self.settle(queue, task_id, true).await;
    }

    /// Takes `task_id` off `queue` into the done set (or the dead set),
    /// finished now.
    async fn settle(&self, queue: &str, task_id: &str, dead: bool) {
        let config = apalis_config(&self.namespace, queue);
        let (set, status) = if dead {
            (config.dead_jobs_set(), "Killed")
        } else {
            (config.done_jobs_set(), "Done")
        };
        let mut redis = self.redis();
        let now = Utc::now().timestamp();
        let () = redis::pipe()
            .zrem(config.scheduled_jobs_set(), task_id)
            .lrem(config.active_jobs_list(), 0, task_id)
            .sadd(set, task_id)
            .hset_multiple(
                format!("{}:{task_id}", config.job_meta_hash()),
                &[("status", status.to_owned()), ("done_at", now.to_string())],
            )
            .ignore()
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    /// When the row of `id` on `queue` was handed off (its `processed_at`).
    async fn handed_off_at(&self, queue: &str, id: Uuid) -> DateTime<Utc> {
        self.rows(queue)
            .await
            .into_iter()
            .find(|r| r.id == id)
            .and_then(|r| r.processed_at)
            .expect("the row was handed off")
    }

    async fn rows(&self, queue: &str) -> Vec<OutboxEvent> {
        let mut conn = self.db.conn().await;
        outbox_store::done_rows_after(
            &mut conn,
            queue,
            (DateTime::from_timestamp(0, 0).unwrap(), Uuid::nil()),
            10_000,
        )
        .await
        .unwrap()
    }

    async fn safe_point(&self, queue: &str) -> (DateTime<Utc>, Option<DateTime<Utc>>) {
        #[derive(diesel::QueryableByName)]
        struct Point {
            #[diesel(sql_type = Timestamptz)]
            drained_before: DateTime<Utc>,
            #[diesel(sql_type = Nullable<Timestamptz>)]
            pending_since: Option<DateTime<Utc>>,
        }
        let mut conn = self.db.conn().await;
        let point: Point = diesel::sql_query(
            "SELECT drained_before, pending_since FROM outbox_redis_safe_point
             WHERE namespace = $1 AND queue = $2",
        )
        .bind::<Text, _>(self.namespace.prefix())
        .bind::<Text, _>(queue)
        .get_result(&mut conn)
        .await
        .unwrap();
        (point.drained_before, point.pending_since)
    }

    /// How many queues before `queue` (in name order) have a reconciliation
    /// due.
    async fn pending_queues_before(&self, queue: &str) -> usize {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn = self.db.conn().await;
        let count: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM outbox_redis_safe_point
             WHERE namespace = $1 AND queue < $2 AND pending_since IS NOT NULL",
        )
        .bind::<Text, _>(self.namespace.prefix())
        .bind::<Text, _>(queue)
        .get_result(&mut conn)
        .await
        .unwrap();
        usize::try_from(count.n).unwrap()
    }

    async fn sql(&self, sql: &str) {
        self.db.conn().await.batch_execute(sql).await.unwrap();
    }
}

fn mail(n: usize) -> NewOutboxEvent {
    NewOutboxEvent::new(
        TENANT,
        "mail.user.welcome",
        json!({ "to": format!("u{n}@example.com"), "subject": "Hi", "text": "Hello" }),
    )
}

fn webhook(n: usize) -> NewOutboxEvent {
    NewOutboxEvent::new(TENANT, "webhook.order.created", json!({ "order": n }))
}

fn audit(n: usize) -> NewOutboxEvent {
    NewOutboxEvent::new(
        TENANT,
        "audit.user.login",
        json!({ "actor": "ada", "n": n }),
    )
}

/// One counter as a scrape would show it.
struct Counter {
    name: String,
    labels: Vec<(String, String)>,
    value: u64,
}

/// The counters of a recorder, read once.
struct Metrics(Vec<Counter>);

impl Metrics {
    fn read(recorder: &DebuggingRecorder) -> Self {
        Self(
            recorder
                .snapshotter()
                .snapshot()
                .into_vec()
                .into_iter()
                .filter_map(|(key, _, _, value)| match value {
                    DebugValue::Counter(value) => Some(Counter {
                        name: key.key().name().to_owned(),
                        labels: key
                            .key()
                            .labels()
                            .map(|l| (l.key().to_owned(), l.value().to_owned()))
                            .collect(),
                        value,
                    }),
                    _ => None,
                })
                .collect(),
        )
    }

    fn counter(&self, name: &str, label: (&str, &str)) -> u64 {
        self.0
            .iter()
            .filter(|c| {
                c.name == name && c.labels.iter().any(|(k, v)| k == label.0 && v == label.1)
            })
            .map(|c| c.value)
            .sum()
    }
}

#[tokio::test]
async fn nothing_is_pushed_again_when_nothing_was_lost() {
    let rig = Rig::shared().await;
    rig.hand_off((0..5).map(mail).chain((0..5).map(webhook)).collect())
        .await;
    rig.hand_off((0..5).map(audit).collect()).await;

    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.repair().await;
    assert_eq!(rig.check().await, Assessment::Intact);

    let report = rig
        .reconcile(&[queues::MAIL, queues::WEBHOOK, queues::AUDIT], false)
        .await;
    assert_eq!(report.missing_total(), 0, "{report:?}");
    assert_eq!(report.repushed_total(), 0, "{report:?}");
    assert!(report.missing.is_empty());
    assert_eq!(report.queues[queues::MAIL].checked, 5);
    assert_eq!(report.queues[queues::MAIL].found, 5);
    assert_eq!(report.queues[queues::AUDIT].found, 5);
    assert_eq!(
        rig.safe_point(queues::MAIL).await.1,
        None,
        "no reconciliation is due"
    );
}

#[tokio::test]
async fn a_flushall_is_detected_counted_and_every_lost_job_pushed_again() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let logs = LogCapture::start();
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let mails = rig.hand_off((0..20).map(mail).collect()).await;
    let hooks = rig.hand_off((0..10).map(webhook).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    assert_eq!(rig.check().await, Assessment::Intact);

    rig.flush_all().await;
    assert_eq!(
        rig.state(queues::MAIL, &task_id(mails[0])).await,
        JobStateKind::Missing
    );

    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    let (_, pending) = rig.safe_point(queues::MAIL).await;
    assert!(pending.is_some(), "a reconciliation is due for outbox.mail");
    rig.repair().await;
    rig.assert_waiting(queues::MAIL, &mails).await;
    rig.assert_waiting(queues::WEBHOOK, &hooks).await;
    assert_eq!(rig.safe_point(queues::MAIL).await.1, None, "done");
    // Each queue's reconciliation ends with one warning saying what came back.
    let finished = |queue: &str, missing: usize| {
        logs.text()
            .lines()
            .filter(|l| {
                l.contains("WARN")
                    && l.contains("jobs Redis had lost were pushed again")
                    && l.contains(&format!("queue={queue} "))
                    && l.contains(&format!("missing={missing} "))
            })
            .count()
    };
    assert_eq!(
        (finished(queues::MAIL, 20), finished(queues::WEBHOOK, 10)),
        (1, 1),
        "{}",
        logs.text()
    );
    // A queue whose window held nothing gets no line. (Break checked:
    // `checked > 0` as `>= 0` in `reconcile_due` logs "nothing was missing"
    // with `checked=0` for each of the other queues.)
    let empty_windows = logs
        .text()
        .lines()
        .filter(|l| l.contains("reconciliation finished") && l.contains("checked=0 "))
        .count();
    assert_eq!(empty_windows, 0, "{}", logs.text());
    // The marker was written again: the next check finds Redis intact.
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.repair().await;
    // One snapshot (reading the recorder resets its counters).
    let metrics = Metrics::read(&recorder);
    assert_eq!(
        metrics.counter(
            "outbox_redis_loss_detected_total",
            ("reason", "marker_missing")
        ),
        1
    );
    assert_eq!(
        metrics.counter("outbox_reconcile_repushed_total", ("queue", queues::MAIL)),
        20,
        "each lost mail once, nothing more"
    );
    assert_eq!(
        metrics.counter(
            "outbox_reconcile_repushed_total",
            ("queue", queues::WEBHOOK)
        ),
        10
    );
}

/// The guard's own reconciliation after a loss goes through every batch,
/// in one pass: with two rows per batch, all five jobs a `FLUSHALL` took
/// come back.
// Break checked: a batch counted as the last when it is full (`>=` turned
// into `<` in `reconcile_due`) ends the reconciliation after two jobs and
// fails here; so does a pass that ends after each batch that moved the
// cursor (`!moved` turned into `moved`).
#[tokio::test]
async fn the_guard_reconciles_every_batch_of_a_loss() {
    let server = RedisProcess::start().await;
    let (rig, hooks) = rig_with_a_lost_backlog(&server, 5, 2).await;
    // One pass goes through all three batches: the guard waits its check
    // interval between passes, so a pass that stopped after each batch
    // would bring a large loss back one batch per interval.
    let guard = rig.dispatcher.redis_guard().unwrap();
    let still_due = guard
        .reconcile_pending(&CancellationToken::new())
        .await
        .unwrap();
    assert!(!still_due, "one pass reconciles 5 jobs in batches of 2");
    rig.assert_waiting(queues::WEBHOOK, &hooks).await;
    rig.repair().await;
    assert_eq!(rig.safe_point(queues::WEBHOOK).await.1, None, "done");
}

/// How many of `ids` have a job waiting on `queue`.
async fn waiting_count(rig: &Rig, queue: &str, ids: &[Uuid]) -> usize {
    let mut waiting = 0;
    for id in ids {
        if rig.state(queue, &task_id(*id)).await == JobStateKind::Waiting {
            waiting += 1;
        }
    }
    waiting
}

/// A rig whose guard reconciles `batch_size` rows a batch, with the jobs
/// of `n` webhook events handed off and then lost to a `FLUSHALL`.
async fn rig_with_a_lost_backlog(
    server: &RedisProcess,
    n: usize,
    batch_size: usize,
) -> (Rig, Vec<Uuid>) {
    let mut rig = Rig::private(server).await;
    rig.dispatcher = guarded_dispatcher_with(
        &rig.db,
        &rig.redis_url,
        &rig.namespace,
        RedisGuardSettings {
            batch_size,
            ..RedisGuardSettings::default()
        },
    );
    let hooks = rig.hand_off((0..n).map(webhook).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    rig.flush_all().await;
    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    (rig, hooks)
}

// Break checked: `||` turned into `&&` in `reconcile_due`'s stop test (a
// mutation run's shard 6) goes on through every batch although the worker
// is stopping, and fails here.
#[tokio::test]
async fn a_stopping_guard_leaves_a_pending_reconciliation_for_its_next_start() {
    let server = RedisProcess::start().await;
    let (rig, hooks) = rig_with_a_lost_backlog(&server, 5, 2).await;
    let guard = rig.dispatcher.redis_guard().unwrap();
    let stopping = CancellationToken::new();
    stopping.cancel();
    assert!(
        guard.reconcile_pending(&stopping).await.unwrap(),
        "a pass asked to stop reports the reconciliation still due"
    );
    assert_eq!(
        waiting_count(&rig, queues::WEBHOOK, &hooks).await,
        0,
        "no batch is pushed again once the worker is stopping"
    );
    assert!(
        rig.safe_point(queues::WEBHOOK).await.1.is_some(),
        "the reconciliation stays pending"
    );
    // The next start takes it up.
    rig.repair().await;
    rig.assert_waiting(queues::WEBHOOK, &hooks).await;
}

// Break checked: the same `&&` makes one pass go on past its 40 batches
// (the guard checks the marker between passes), and `>=` turned into `>`
// there does one batch more; each fails here.
#[tokio::test]
async fn one_guard_pass_reconciles_at_most_forty_batches_and_the_next_pass_goes_on() {
    let server = RedisProcess::start().await;
    let (rig, hooks) = rig_with_a_lost_backlog(&server, 45, 1).await;
    // The loss made every queue's reconciliation due; the pass takes them
    // in the order of their names, and each queue before the webhook queue
    // costs one batch (an empty one: its jobs were not lost).
    let before = rig.pending_queues_before(queues::WEBHOOK).await;
    assert!(before < 40, "{before} queues before the webhook queue");
    let guard = rig.dispatcher.redis_guard().unwrap();
    let stop = CancellationToken::new();
    assert!(
        guard.reconcile_pending(&stop).await.unwrap(),
        "45 jobs in batches of 1 take more than one pass"
    );
    assert_eq!(
        waiting_count(&rig, queues::WEBHOOK, &hooks).await,
        40 - before,
        "one pass does 40 batches of 1, {before} of them on the queues before"
    );
    assert!(
        !guard.reconcile_pending(&stop).await.unwrap(),
        "the second pass ends it"
    );
    rig.assert_waiting(queues::WEBHOOK, &hooks).await;
}

#[tokio::test]
async fn a_restart_without_persistence_is_a_loss_and_the_backlog_comes_back() {
    let mut server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let mails = rig.hand_off((0..30).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    assert_eq!(rig.check().await, Assessment::Intact);

    server.restart().await;
    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    rig.repair().await;
    rig.assert_waiting(queues::MAIL, &mails).await;
}

/// A push that fails wakes the Redis guard at once: when Redis comes back
/// empty, the jobs it lost are pushed again without waiting for the next
/// scheduled check (an hour here).
// Break checked: `RedisGuard::poke` doing nothing leaves the lost jobs
// missing until the scheduled check, and this times out.
#[tokio::test]
async fn a_failed_push_wakes_the_guard_and_a_redis_back_empty_gets_its_jobs_again() {
    let mut server = RedisProcess::start().await;
    outbox_test_support::init_tracing();
    let db = TestDatabase::new().await;
    let namespace = QueueNamespace::root();
    let redis = outbox_queue::connect(&RedisSettings::new(server.url())).unwrap();
    let dispatcher = std::sync::Arc::new(
        Dispatcher::new(
            db.pool().clone(),
            db.url(),
            redis.clone(),
            namespace.clone(),
            outbox_catalog::standard_router().unwrap(),
            DispatcherConfig {
                listen: false,
                interval: Duration::from_millis(100),
                ..DispatcherConfig::default()
            },
        )
        .unwrap()
        .with_redis_guard(
            RedisGuardSettings {
                check_every: Duration::from_secs(3600),
                safe_point_lag: Duration::ZERO,
                ..RedisGuardSettings::default()
            },
            Catalog::built_in().receivers(),
        ),
    );
    let mut conn = db.conn().await;
    let ids: Vec<Uuid> = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, (0..3).map(mail)).await
        })
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id())
        .collect();
    let stop = CancellationToken::new();
    let run = tokio::spawn(dispatcher.clone().run(stop.clone()));
    let count = async |sql: &str| -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn = db.conn().await;
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .await
            .unwrap()
            .n
    };
    let wait = Duration::from_secs(30);
    // The guard's first round (a first sight of this Redis, checked once)
    // must be over, or the stop below fails it and it retries every second
    // whether poked or not.
    outbox_test_support::eventually(
        "the hand-off and the guard's first round",
        wait,
        async || {
            count("SELECT count(*) AS n FROM outbox_event WHERE status = 'DONE'").await == 3
                && count("SELECT count(*) AS n FROM outbox_redis_epoch").await == 1
                && count(
                    "SELECT CASE WHEN count(*) > 0
                        AND count(*) FILTER (WHERE pending_since IS NOT NULL) = 0
                     THEN 1::bigint ELSE 0::bigint END AS n FROM outbox_redis_safe_point",
                )
                .await
                    == 1
        },
    )
    .await;

    // Redis goes away; the next push fails.
    server.stop();
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        publish_outbox_events(&tx, vec![mail(3)]).await
    })
    .await
    .unwrap();
    outbox_test_support::eventually("a failed push", wait, async || {
        count("SELECT count(*) AS n FROM outbox_event WHERE retries > 0").await == 1
    })
    .await;
    // It comes back empty.
    server.restart().await;

    let states = async || -> Vec<JobStateKind> {
        let mut redis = outbox_queue::connect(&RedisSettings::new(server.url())).unwrap();
        let ids: Vec<String> = ids.iter().map(|id| task_id(*id)).collect();
        job_states(&mut redis, &namespace, queues::MAIL, &ids)
            .await
            .map(|states| states.into_iter().map(|s| s.kind).collect())
            .unwrap_or_default()
    };
    outbox_test_support::eventually("the lost jobs pushed again", wait, async || {
        states().await == vec![JobStateKind::Waiting; 3]
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
}

/// A directory for a private Redis' append-only file, removed at the end.
struct AofDir(PathBuf);

impl AofDir {
    fn new() -> Self {
        let path =
            std::env::temp_dir().join(format!("outbox-reconcile-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for AofDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_restart_with_appendfsync_always_loses_nothing_and_everysec_is_checked() {
    let logs = LogCapture::start();
    for (fsync, expected) in [("always", true), ("everysec", false)] {
        let dir = AofDir::new();
        let mut server = RedisProcess::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            fsync,
            "--dir",
            dir.path(),
        ])
        .await;
        let rig = Rig::private(&server).await;
        let mails = rig.hand_off((0..10).map(mail).collect()).await;
        assert_eq!(rig.check().await, Assessment::FirstSight);
        rig.repair().await;
        assert_eq!(rig.check().await, Assessment::Intact);
        // A graceful restart: the append-only file has everything.
        let client = redis::Client::open(server.url().as_str()).unwrap();
        let mut plain = client.get_multiplexed_async_connection().await.unwrap();
        let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut plain).await;
        server.restart().await;
        let verdict = rig.check().await;
        if expected {
            assert_eq!(verdict, Assessment::RestartedSafely, "appendfsync {fsync}");
            assert_eq!(rig.safe_point(queues::MAIL).await.1, None);
            assert_eq!(
                rig.check().await,
                Assessment::Intact,
                "the marker now names the new server run, so the next check finds all in order"
            );
        } else {
            assert!(
                matches!(verdict, Assessment::Lost(LossReason::Restarted { .. })),
                "appendfsync {fsync}: {verdict:?}"
            );
        }
        rig.repair().await;
        for id in &mails {
            assert_eq!(
                rig.state(queues::MAIL, &task_id(*id)).await,
                JobStateKind::Waiting,
                "appendfsync {fsync}: the jobs survived"
            );
        }
        let report = rig.reconcile(&[queues::MAIL], true).await;
        assert_eq!(report.missing_total(), 0, "appendfsync {fsync}: {report:?}");
    }
    // The everysec restart's reconciliation says it found nothing missing,
    // not that it pushed lost jobs again.
    // Break checked: `total.missing > 0` as `>=` in `reconcile_due` (a miss
    // of the pinned dispatch shard 3) logs "pushed again" and fails here.
    assert!(
        logs.count("reconciliation finished: nothing was missing") >= 1,
        "no reconciliation reported nothing missing"
    );
    assert_eq!(logs.count("jobs Redis had lost were pushed again"), 0);
}

#[tokio::test]
async fn a_finished_mail_whose_derived_send_job_is_gone_runs_again() {
    let rig = Rig::shared().await;
    let ids = rig.hand_off((0..3).map(mail).collect()).await;
    let rows = rig.rows(queues::MAIL).await;
    let parents: Vec<String> = ids.iter().map(|id| task_id(*id)).collect();
    for parent in &parents {
        rig.finish(queues::MAIL, parent).await;
    }
    // Mail 0: its send job exists. Mail 1: the send job is gone but the
    // receiver recorded the mail as sent. Mail 2: both gone.
    rig.push_job(queues::TOOLCTRL_EMAIL, &format!("email:{}", ids[0]))
        .await;
    rig.record_completed(&format!("email:{}", ids[1])).await;

    let mut conn = rig.db.conn().await;
    let standings = rig
        .reconciler()
        .classify(&mut conn, queues::MAIL, &rows)
        .await
        .unwrap();
    let by_id: Vec<(Uuid, Standing)> = rows.iter().map(|r| r.id).zip(standings).collect();
    let standing = |id: Uuid| by_id.iter().find(|(i, _)| *i == id).unwrap().1.clone();
    assert_eq!(standing(ids[0]), Standing::Present { finished: false });
    assert_eq!(standing(ids[1]), Standing::Present { finished: true });
    match standing(ids[2]) {
        Standing::DerivedMissing { parent, derived } => {
            assert_eq!(parent, parents[2]);
            assert_eq!(derived.len(), 1);
            assert_eq!(derived[0].queue, queues::TOOLCTRL_EMAIL);
            assert_eq!(derived[0].task_id, format!("email:{}", ids[2]));
        }
        other => panic!("mail 2 should miss its send job: {other:?}"),
    }

    let report = rig.reconcile(&[queues::MAIL], false).await;
    rig.assert_ran_again_alone(&report, queues::MAIL, &parents[2])
        .await;
    assert_eq!(
        rig.state(queues::MAIL, &parents[0]).await,
        JobStateKind::Done
    );
    assert_eq!(
        rig.state(queues::MAIL, &parents[1]).await,
        JobStateKind::Done
    );
}

/// An application's subscriber that derives jobs (one per delivery,
/// `refresh:<delivery id>`) is reconciled from its description as the mail
/// handler is: a finished parent whose derived job is gone, and not
/// recorded done by its receiver, runs again; the others are left alone.
#[tokio::test]
async fn a_finished_job_of_an_application_subscriber_whose_derived_job_is_gone_runs_again() {
    const SEARCH: SubscriberDescription = SubscriberDescription {
        name: "app-search",
        consumes: &[ConsumedQueue {
            queue: queues::SEARCH_INDEX,
            routes: &[],
            payload: "`page`",
        }],
        feeds: &[DownstreamQueue {
            queue: REFRESH,
            derived_from: &[queues::SEARCH_INDEX],
            task_id: DerivedTaskIds::per_delivery("refresh:"),
        }],
        dedup: &[],
    };
    const REFRESH: &str = "app.search-refresh";
    let rig = Rig::shared().await;
    let pages = (0..3)
        .map(|n| NewOutboxEvent::new(TENANT, "search.index.page.updated", json!({ "page": n })))
        .collect();
    let ids = rig.hand_off(pages).await;
    let parents: Vec<String> = ids.iter().map(|id| task_id(*id)).collect();
    for parent in &parents {
        rig.finish(queues::SEARCH_INDEX, parent).await;
    }
    // Page 0: its refresh job exists. Page 1: the refresh job is gone but
    // its receiver recorded it done. Page 2: both gone.
    rig.push_job(REFRESH, &format!("refresh:{}", ids[0])).await;
    rig.record_completed(&format!("refresh:{}", ids[1])).await;

    let catalog = Catalog::built_in().with(SEARCH);
    let report = rig
        .reconcile_as(&catalog, &[queues::SEARCH_INDEX], false)
        .await;
    rig.assert_ran_again_alone(&report, queues::SEARCH_INDEX, &parents[2])
        .await;
    assert_eq!(report.missing[0].queue, REFRESH);
    assert_eq!(report.missing[0].task_id, format!("refresh:{}", ids[2]));
    for parent in &parents[..2] {
        assert_eq!(
            rig.state(queues::SEARCH_INDEX, parent).await,
            JobStateKind::Done
        );
    }
}

#[tokio::test]
async fn audit_events_whose_rows_exist_are_not_lost_even_without_their_jobs() {
    let rig = Rig::shared().await;
    let ids = rig.hand_off((0..2).map(audit).collect()).await;
    rig.sql(&format!(
        "INSERT INTO audit_log (outbox_event_id, tenant_id, event_type, payload, occurred_at)
         VALUES ('{}', '{TENANT}', 'audit.user.login', '{{}}', now())",
        ids[0]
    ))
    .await;
    let config = apalis_config(&rig.namespace, queues::AUDIT);
    let mut redis = rig.redis();
    let () = redis::cmd("DEL")
        .arg(config.job_data_hash())
        .query_async(&mut redis)
        .await
        .unwrap();
    let report = rig.reconcile(&[queues::AUDIT], true).await;
    assert_eq!(report.queues[queues::AUDIT].found, 1);
    assert_eq!(report.queues[queues::AUDIT].missing, 1);
    assert_eq!(report.missing[0].event_id, ids[1]);
    assert_eq!(report.repushed_total(), 0, "a dry run");
    assert_eq!(
        rig.state(queues::AUDIT, &task_id(ids[1])).await,
        JobStateKind::Missing
    );
}

/// A replayed row (generation 1) whose job is lost is pushed again under
/// its own generation's task id, not the first delivery's.
// Break checked: reading every row as generation 0 in the reconciler finds
// the first delivery's job, calls nothing missing and leaves the replay's
// job lost.
/// `outbox reconcile` goes through every batch of its window: with two
/// rows per batch, all five lost jobs come back, not only the first two.
// Break checked: stopping after a full batch (`rows.len() < batch_size`
// turned into `==`) leaves three jobs missing and fails here.
#[tokio::test]
async fn a_reconciliation_goes_through_every_batch_of_its_window() {
    let rig = Rig::shared().await;
    let ids = rig.hand_off((0..5).map(webhook).collect()).await;
    let config = apalis_config(&rig.namespace, queues::WEBHOOK);
    let mut redis = rig.redis();
    for id in &ids {
        let () = redis::cmd("HDEL")
            .arg(config.job_data_hash())
            .arg(task_id(*id))
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    let mut conn = rig.db.conn().await;
    let report = rig
        .reconciler()
        .with_batch_size(2)
        .reconcile(
            &mut conn,
            &ReconcileOptions {
                since: Utc::now() - chrono::Duration::hours(1),
                queues: vec![queues::WEBHOOK.to_owned()],
                dry_run: false,
            },
        )
        .await
        .unwrap();

    assert_eq!(report.queues[queues::WEBHOOK].checked, 5, "{report:?}");
    assert_eq!(report.repushed_total(), 5, "{report:?}");
    rig.assert_waiting(queues::WEBHOOK, &ids).await;
}

#[tokio::test]
async fn a_lost_job_of_a_replayed_row_comes_back_under_its_generations_task_id() {
    let rig = Rig::shared().await;
    let ids = rig.hand_off(vec![webhook(1)]).await;
    rig.sql(&format!(
        "UPDATE outbox_event SET generation = 1, status = 'PENDING' WHERE id = '{}'",
        ids[0]
    ))
    .await;
    assert_eq!(rig.dispatcher.tick().await.unwrap().dispatched, 1);
    let replay = generation_task_id(ids[0], 1);
    assert_eq!(
        rig.state(queues::WEBHOOK, &replay).await,
        JobStateKind::Waiting
    );
    // Only the replay's job is lost; the first delivery's is still there.
    let config = apalis_config(&rig.namespace, queues::WEBHOOK);
    let mut redis = rig.redis();
    let () = redis::cmd("HDEL")
        .arg(config.job_data_hash())
        .arg(&replay)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        rig.state(queues::WEBHOOK, &replay).await,
        JobStateKind::Missing
    );
    assert_ne!(
        rig.state(queues::WEBHOOK, &task_id(ids[0])).await,
        JobStateKind::Missing
    );

    let report = rig.reconcile(&[queues::WEBHOOK], false).await;

    assert_eq!(report.missing.len(), 1, "{report:?}");
    assert_eq!(report.repushed_total(), 1, "{report:?}");
    assert_eq!(
        rig.state(queues::WEBHOOK, &replay).await,
        JobStateKind::Waiting,
        "the replay's job is back"
    );
}

#[tokio::test]
async fn the_safe_point_keeps_jobs_that_had_finished_out_of_the_window() {
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let first = rig.hand_off((0..3).map(mail).collect()).await;
    let second = rig.hand_off((3..6).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    // The first batch is delivered (the mail jobs and their send jobs finish).
    rig.deliver_mails(&first).await;
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.repair().await;
    let (drained, _) = rig.safe_point(queues::MAIL).await;
    assert_eq!(
        drained,
        rig.handed_off_at(queues::MAIL, second[0]).await,
        "the safe point stops at the first job still waiting"
    );

    rig.flush_all().await;
    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    assert_eq!(rig.safe_point(queues::MAIL).await.1, Some(drained));
    rig.repair().await;
    for id in &first {
        assert_eq!(
            rig.state(queues::MAIL, &task_id(*id)).await,
            JobStateKind::Missing,
            "delivered before the safe point: not sent again"
        );
    }
    rig.assert_waiting(queues::MAIL, &second).await;
}

// Break checked: the scan taking a full page for the last one
// (`rows.len() < limit` → `<=` in `advance_safe_points`) moves the safe
// point past the waiting jobs and fails here: after a loss they would not
// be pushed again. So do pages that shrink instead of growing (`limit * 4`
// → `limit / 4`: pages of 16, 4, 1, then none, read as the end).
#[tokio::test]
async fn the_safe_point_scan_stops_at_a_waiting_job_past_its_first_page_of_finished_ones() {
    let server = RedisProcess::start().await;
    let rig = Rig::private_scanning(&server).await;
    // More delivered jobs than the scan's first pages (16, then 64) would
    // reach if they did not grow, then waiting ones.
    let delivered = rig.hand_off((0..25).map(mail).collect()).await;
    let waiting = rig.hand_off((25..28).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    rig.deliver_mails(&delivered).await;
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.repair().await;
    let first_waiting = rig.handed_off_at(queues::MAIL, waiting[0]).await;
    assert_eq!(
        rig.safe_point(queues::MAIL).await.0,
        first_waiting,
        "the safe point stops at the first job still waiting"
    );
}

/// The safe-point scan reads only rows handed off before the closest a
/// safe point may come to now: later rows cannot move it, and under load
/// they were a third of every check's reading.
// Break checked: the scan without its upper bound (`done_rows_after` in
// `RedisGuard::scan`, as before) reads the five rows through the lagging
// guard too, and fails the first assertion.
#[tokio::test]
async fn the_safe_point_scan_reads_no_row_handed_off_within_the_lag() {
    let rig = Rig::shared().await;
    let delivered = rig.hand_off((0..5).map(mail).collect()).await;
    rig.deliver_mails(&delivered).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    let stop = CancellationToken::new();
    let guard = rig.dispatcher.redis_guard().unwrap();
    while guard.reconcile_pending(&stop).await.unwrap() {}

    // Scanning guards of the same namespace: one whose safe points stay an
    // hour behind, one without a lag.
    let scanning = |safe_point_lag| {
        dispatcher_guarded_as(
            &rig.db,
            &rig.redis_url,
            &rig.namespace,
            RedisGuardSettings {
                safe_point_lag,
                unfinished_limit: 0,
                ..RedisGuardSettings::default()
            },
        )
    };
    let lagging = scanning(Duration::from_secs(3600));
    let pass = lagging
        .redis_guard()
        .unwrap()
        .advance_safe_points(&stop)
        .await
        .unwrap();
    assert!(pass.queues_scanned > 0, "{pass:?}");
    assert_eq!(
        pass.rows_read, 0,
        "rows handed off within the lag were read"
    );
    // Without the lag it reads all five and moves past them.
    let eager = scanning(Duration::ZERO);
    let pass = eager
        .redis_guard()
        .unwrap()
        .advance_safe_points(&stop)
        .await
        .unwrap();
    assert_eq!(pass.rows_read, 5, "{pass:?}");
    let (drained, pending) = rig.safe_point(queues::MAIL).await;
    assert_eq!(pending, None);
    assert!(drained >= rig.handed_off_at(queues::MAIL, delivered[4]).await);
}

/// `finished` mails handed off and delivered, then `waiting` mails handed
/// off and left waiting: after a check and its reconciliation, one move
/// of the safe points goes by the unfinished jobs (no row read) and stops
/// at the first waiting mail.
async fn assert_safe_point_stops_at_first_waiting_mail_unread(
    rig: &Rig,
    finished: std::ops::Range<usize>,
    waiting: std::ops::Range<usize>,
) {
    let delivered = rig.hand_off(finished.map(mail).collect()).await;
    let waiting = rig.hand_off(waiting.map(mail).collect()).await;
    rig.deliver_mails(&delivered).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    let stop = CancellationToken::new();
    let guard = rig.dispatcher.redis_guard().unwrap();
    while guard.reconcile_pending(&stop).await.unwrap() {}

    let pass = rig.advance().await;
    assert!(pass.queues_by_unfinished > 0, "{pass:?}");
    assert_eq!((pass.queues_scanned, pass.rows_read), (0, 0), "{pass:?}");
    assert_eq!(
        rig.safe_point(queues::MAIL).await,
        (rig.handed_off_at(queues::MAIL, waiting[0]).await, None),
        "the safe point stops at the first job still waiting"
    );
}

/// With consumers keeping up, the safe point moves to the first job still
/// waiting by the list of the queue's unfinished jobs that Redis keeps:
/// none of the finished jobs before it is read or asked about.
// Break checked: the listed ids not looked up (`events` empty in
// `advance_safe_points`) moves the safe point past the waiting jobs and
// fails the last assertion; the guard never listing (`unfinished_limit`
// read as 0) scans the rows and fails the second.
#[tokio::test]
async fn the_safe_point_moves_past_finished_jobs_without_reading_them() {
    let rig = Rig::shared().await;
    assert_safe_point_stops_at_first_waiting_mail_unread(&rig, 0..200, 200..203).await;
}

/// On a Redis Cluster the guard reads each queue's unfinished jobs beside
/// the copy of its marker that the check left in the queue's hash slot:
/// the safe point moves past finished mails to the first waiting one
/// without reading a row, as on one server.
// Break checked: the condition in `read_unfinished` negated (queues with a
// copy of the marker scanned, those without read) scans `outbox.mail` and
// fails the first assertion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_safe_point_moves_by_the_unfinished_jobs_without_a_scan() {
    let cluster = outbox_test_support::RedisCluster::start(3, 0).await;
    let url = cluster.url();
    let namespace = QueueNamespace::for_redis("", &url);
    assert!(namespace.hash_tags(), "a cluster's namespace has hash tags");
    let rig = Rig::on(url, namespace, None).await;
    assert_safe_point_stops_at_first_waiting_mail_unread(&rig, 0..20, 20..22).await;
}

/// A mail whose job finished but whose send job has not run yet is not
/// finished: the safe point of `outbox.mail` stops at it.
// Break checked: the guard listing only the queue's own jobs (the
// `derives_on` queue not added in `advance_safe_points`) moves the safe
// point past the first mail and fails here.
#[tokio::test]
async fn a_send_job_still_waiting_holds_the_safe_point_of_its_mail() {
    let rig = Rig::shared().await;
    let first = rig.hand_off(vec![mail(0)]).await;
    let later = rig.hand_off((1..3).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    rig.derive_send_job(first[0]).await;
    rig.deliver_mails(&later).await;
    assert_eq!(
        rig.state(queues::MAIL, &task_id(first[0])).await,
        JobStateKind::Done
    );
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.advance().await;
    assert_eq!(
        rig.safe_point(queues::MAIL).await.0,
        rig.handed_off_at(queues::MAIL, first[0]).await,
        "the mail's send job still waits"
    );
}

/// A job a worker is running, and then a job waiting as a retry copy due
/// later, hold the safe point; once the copy finished it moves on.
// Break checked: `unfinished.lua` without the in-flight sets (neither
// counted nor read) moves the safe point to the job after the running one
// and fails the first assertion.
#[tokio::test]
async fn a_running_job_and_its_retry_copy_hold_the_safe_point() {
    let rig = Rig::shared().await;
    // One tick each: three hand-off times.
    let done = rig.hand_off(vec![webhook(0)]).await[0];
    let running = rig.hand_off(vec![webhook(1)]).await[0];
    let waiting = rig.hand_off(vec![webhook(2)]).await[0];
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    rig.finish(queues::WEBHOOK, &task_id(done)).await;
    rig.start_running(queues::WEBHOOK, &task_id(running), "worker-1")
        .await;
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.advance().await;
    let running_at = rig.handed_off_at(queues::WEBHOOK, running).await;
    assert_eq!(
        rig.safe_point(queues::WEBHOOK).await.0,
        running_at,
        "the running job holds the safe point"
    );

    rig.retry_later(queues::WEBHOOK, &task_id(running), "worker-1")
        .await;
    assert_eq!(
        rig.state(queues::WEBHOOK, &task_id(running)).await,
        JobStateKind::Waiting,
        "its retry copy waits"
    );
    rig.advance().await;
    assert_eq!(rig.safe_point(queues::WEBHOOK).await.0, running_at);

    let copy = outbox_queue::retry_task_id(&task_id(running), 1);
    rig.finish(queues::WEBHOOK, &copy).await;
    rig.advance().await;
    assert_eq!(
        rig.safe_point(queues::WEBHOOK).await.0,
        rig.handed_off_at(queues::WEBHOOK, waiting).await,
        "the retry copy finished: the safe point moves to the next job waiting"
    );
}

/// A queue holding more unfinished jobs than the guard lists at once (a
/// backlog) is scanned from its safe point instead, and the scan stops at
/// the first of them.
// Break checked: the limit ignored (`count <= limit` → `true` in
// `unfinished.lua`, and `Some(ids)` in `unfinished_jobs`) lists the queue
// and fails the first assertion.
#[tokio::test]
async fn a_queue_holding_more_unfinished_jobs_than_the_limit_is_scanned() {
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let rig = Rig::on_with(
        redis.url().to_owned(),
        namespace,
        Some(redis),
        RedisGuardSettings {
            unfinished_limit: 3,
            ..RedisGuardSettings::default()
        },
    )
    .await;
    let delivered = rig.hand_off((0..2).map(mail).collect()).await;
    let waiting = rig.hand_off((2..7).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    let stop = CancellationToken::new();
    let guard = rig.dispatcher.redis_guard().unwrap();
    while guard.reconcile_pending(&stop).await.unwrap() {}
    rig.deliver_mails(&delivered).await;

    let pass = rig.advance().await;
    assert_eq!(
        pass.queues_scanned, 1,
        "only outbox.mail holds more than 3: {pass:?}"
    );
    assert!(pass.rows_read > 0, "{pass:?}");
    assert_eq!(
        rig.safe_point(queues::MAIL).await.0,
        rig.handed_off_at(queues::MAIL, waiting[0]).await,
        "the scan stops at the first job still waiting"
    );
}

/// Redis flushed between the check and the move of the safe points: the
/// list of unfinished jobs is empty, but it comes without the marker, so no
/// safe point moves, and the next check reconciles the waiting jobs.
// Break checked: the marker read with the jobs not compared (the epoch
// arm disabled in `advance_safe_points`) moves the safe point past the
// waiting jobs and fails the first assertion.
#[tokio::test]
async fn a_flush_between_the_check_and_the_safe_points_moves_none() {
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let waiting = rig.hand_off((0..3).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    assert_eq!(rig.check().await, Assessment::Intact);
    let before = rig.safe_point(queues::MAIL).await.0;
    assert!(before <= rig.handed_off_at(queues::MAIL, waiting[0]).await);

    rig.flush_all().await;
    rig.advance().await;
    assert_eq!(rig.safe_point(queues::MAIL).await.0, before);

    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    rig.repair().await;
    rig.assert_waiting(queues::MAIL, &waiting).await;
}

/// Redis restarted from an older snapshot between the check and the move
/// of the safe points: the marker survived, the jobs pushed after the
/// snapshot did not, so the list misses them. The server's run differs
/// from the one the check saw, so no safe point moves, and the next check
/// finds the restart and pushes the lost jobs again.
// Break checked: the run not compared (the `run_id` test disabled in
// `advance_safe_points`) moves the safe point past the lost jobs and
// fails the first assertion.
#[tokio::test]
async fn a_restart_between_the_check_and_the_safe_points_moves_none() {
    let dir = AofDir::new();
    let mut server = RedisProcess::start_with(&["--dir", dir.path()]).await;
    let rig = Rig::private(&server).await;
    let delivered = rig.hand_off((0..2).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    rig.deliver_mails(&delivered).await;
    let mut redis = rig.redis();
    let () = redis::cmd("SAVE").query_async(&mut redis).await.unwrap();
    // Handed off after the snapshot: lost with the restart.
    let lost = rig.hand_off((2..5).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::Intact);
    let before = rig.safe_point(queues::MAIL).await.0;
    assert!(before <= rig.handed_off_at(queues::MAIL, lost[0]).await);

    server.restart().await;
    rig.advance().await;
    assert_eq!(rig.safe_point(queues::MAIL).await.0, before);

    assert!(
        matches!(
            rig.check().await,
            Assessment::Lost(LossReason::Restarted { .. })
        ),
        "the restart from a snapshot is a loss"
    );
    rig.repair().await;
    rig.assert_waiting(queues::MAIL, &lost).await;
}

/// The guard's round (the check, a reconciliation pass when one is due,
/// else the safe points' move) moves the safe point once nothing is due:
/// the window a later loss must walk stays short.
// Break checked: the round moving the safe points only while a
// reconciliation is due (`!` deleted in `check_and_repair`) leaves it at
// the first sight and fails here.
#[tokio::test]
async fn the_guards_rounds_move_the_safe_point_past_finished_jobs() {
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let delivered = rig.hand_off((0..3).map(mail).collect()).await;
    let waiting = rig.hand_off((3..4).map(mail).collect()).await;
    rig.deliver_mails(&delivered).await;
    let guard = rig.dispatcher.redis_guard().unwrap();
    let stop = CancellationToken::new();
    for _ in 0..3 {
        guard.check_and_repair(&stop).await.unwrap();
    }
    assert_eq!(
        rig.safe_point(queues::MAIL).await,
        (rig.handed_off_at(queues::MAIL, waiting[0]).await, None),
        "nothing due, and the safe point at the first job still waiting"
    );
}

// Break checked: a dead job read as waiting (the `3 => Dead` arm of
// `job_states` deleted) keeps the safe point at the first dead job, and
// fails here.
#[tokio::test]
async fn the_safe_point_moves_past_dead_lettered_jobs_as_past_finished_ones() {
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let dead = rig.hand_off((0..2).map(mail).collect()).await;
    let waiting = rig.hand_off((2..4).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    for id in &dead {
        rig.kill(queues::MAIL, &task_id(*id)).await;
        assert_eq!(
            rig.state(queues::MAIL, &task_id(*id)).await,
            JobStateKind::Dead
        );
    }
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.repair().await;
    let first_waiting = rig.handed_off_at(queues::MAIL, waiting[0]).await;
    assert_eq!(
        rig.safe_point(queues::MAIL).await.0,
        first_waiting,
        "dead jobs have nothing left to lose: the safe point stops at the first waiting one"
    );
}

#[tokio::test]
async fn a_finished_plugin_hook_runs_again_for_a_lost_invocation_of_a_subscription_it_knew_unless_recorded_as_sent()
 {
    let rig = Rig::shared().await;
    let known = Uuid::new_v4();
    let later = Uuid::new_v4();
    // Besides the one it knew: another tenant's subscription to the same
    // hook and this tenant's to another hook, neither part of its fan-out.
    // Break checked: matching tenant *or* hook expects their invocations too.
    rig.sql(&format!(
        "INSERT INTO plugin_hook_subscription (id, tenant_id, plugin, hook, endpoint, secret)
         VALUES ('{known}', '{TENANT}', 'jira', 'workflow.executed', 'http://127.0.0.1:9/p', 'k'),
                ('{}', 'globex', 'jira', 'workflow.executed', 'http://127.0.0.1:9/g', 'k'),
                ('{}', '{TENANT}', 'jira', 'workflow.failed', 'http://127.0.0.1:9/f', 'k')",
        Uuid::new_v4(),
        Uuid::new_v4()
    ))
    .await;
    let ids = rig
        .hand_off(vec![NewOutboxEvent::new(
            TENANT,
            "plugin.hook.workflow.executed",
            json!({ "workflowId": "w1" }),
        )])
        .await;
    let parent = task_id(ids[0]);
    rig.finish(queues::PLUGIN_HOOK, &parent).await;
    // Subscribed after the fan-out ran: never part of it.
    rig.sql(&format!(
        "INSERT INTO plugin_hook_subscription (id, tenant_id, plugin, hook, endpoint, secret, created_at)
         VALUES ('{later}', '{TENANT}', 'slack', 'workflow.executed', 'http://127.0.0.1:9/q', 'k',
                 now() + interval '1 hour')"
    ))
    .await;
    let rows = rig.rows(queues::PLUGIN_HOOK).await;
    let mut conn = rig.db.conn().await;
    let reconciler = rig.reconciler();
    let mut standing = async || {
        reconciler
            .classify(&mut conn, queues::PLUGIN_HOOK, &rows)
            .await
            .unwrap()
            .remove(0)
    };
    let expected = format!("plugin-invoke:{}:{known}", ids[0]);
    match &standing().await {
        Standing::DerivedMissing { parent: p, derived } => {
            assert_eq!(p, &parent);
            let lost: Vec<&str> = derived.iter().map(|d| d.task_id.as_str()).collect();
            assert_eq!(lost, [expected.as_str()], "only the subscription it knew");
        }
        other => panic!("the invocation is gone: {other:?}"),
    }
    // Recorded as sent by the plugin receiver, it does not run again.
    // Break checked: the receiver's key not looked up for a derived job
    // (`plugin-invoke:` records ignored) leaves it missing here.
    rig.record_completed(&expected).await;
    assert_eq!(standing().await, Standing::Present { finished: true });
    let mut redis = rig.redis();
    let () = redis::cmd("DEL")
        .arg(format!(
            "{}{expected}",
            outbox_queue::idempotency_prefix(&rig.namespace)
        ))
        .query_async(&mut redis)
        .await
        .unwrap();
    outbox_queue::push_raw(
        &mut redis,
        &rig.namespace,
        queues::TOOLCTRL_PLUGIN_INVOKE,
        &[(expected, b"{}".to_vec())],
    )
    .await
    .unwrap();
    assert_eq!(standing().await, Standing::Present { finished: false });
}

#[tokio::test]
async fn two_dispatchers_notice_one_loss_once_and_push_each_lost_job_once() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let other = guarded_dispatcher(&rig.db, &rig.redis_url, &rig.namespace);
    let mails = rig.hand_off((0..40).map(mail).collect()).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    assert_eq!(rig.check().await, Assessment::Intact);

    rig.flush_all().await;
    let (first, second) = tokio::join!(
        rig.dispatcher.redis_guard().unwrap().check(),
        other.redis_guard().unwrap().check()
    );
    let mut verdicts = [first.unwrap().assessment, second.unwrap().assessment];
    verdicts.sort_by_key(|v| matches!(v, Assessment::Intact));
    assert_eq!(
        verdicts,
        [
            Assessment::Lost(LossReason::MarkerMissing),
            Assessment::Intact
        ],
        "one of them notices; the other finds the new marker"
    );
    let stop = CancellationToken::new();
    let (a, b) = tokio::join!(
        rig.dispatcher
            .redis_guard()
            .unwrap()
            .reconcile_pending(&stop),
        other.redis_guard().unwrap().reconcile_pending(&stop)
    );
    a.unwrap();
    b.unwrap();
    rig.repair().await;
    rig.assert_waiting(queues::MAIL, &mails).await;
    let metrics = Metrics::read(&recorder);
    assert_eq!(
        metrics.counter(
            "outbox_redis_loss_detected_total",
            ("reason", "marker_missing")
        ),
        1
    );
    assert_eq!(
        metrics.counter("outbox_reconcile_repushed_total", ("queue", queues::MAIL)),
        40,
        "each lost job pushed once, by one of them"
    );
    assert_eq!(
        metrics.counter("outbox_reconcile_checked_total", ("queue", queues::MAIL)),
        40 + 40,
        "the first sight and the loss: each row checked once each time"
    );
}

/// Counts the guard's checks in `rig`'s database from now on: each check
/// writes the namespace's `checked_at` (the check's transaction time), and
/// a trigger adds a row to `guard_checks` for each new one.
async fn count_checks(rig: &Rig) {
    rig.sql(
        "CREATE TABLE guard_checks (n bigserial);
         CREATE FUNCTION count_check() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF TG_OP = 'INSERT' OR OLD.checked_at IS DISTINCT FROM NEW.checked_at THEN
                 INSERT INTO guard_checks DEFAULT VALUES;
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER count_check AFTER INSERT OR UPDATE ON outbox_redis_epoch
             FOR EACH ROW EXECUTE FUNCTION count_check();",
    )
    .await;
}

/// The checks counted since [`count_checks`].
async fn checks(rig: &Rig) -> u64 {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = rig.db.conn().await;
    let count: Count = diesel::sql_query("SELECT count(*) AS n FROM guard_checks")
        .get_result(&mut conn)
        .await
        .unwrap();
    u64::try_from(count.n).unwrap()
}

/// A dispatcher guarding a queue the others do not (a route added in a
/// rolling deploy) gives it a safe point at its first check, though the
/// queue's safe point is not moved by theirs: a loss that one of the
/// others notices then marks that queue for reconciliation too.
// Break checked: without `ensure_safe_points` on an intact check, the
// queue has no safe point and the query for it finds no row.
#[tokio::test]
async fn a_loss_noticed_by_another_dispatcher_marks_the_queue_only_a_newer_one_guards() {
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;
    let newer = outbox_dispatch::RedisGuard::new(
        rig.db.pool().clone(),
        rig.redis(),
        rig.namespace.clone(),
        vec![queues::MAIL.to_owned(), "outbox.added".to_owned()],
        Catalog::built_in().receivers(),
        RedisGuardSettings::default(),
    );
    assert_eq!(newer.check().await.unwrap().assessment, Assessment::Intact);
    rig.flush_all().await;
    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    assert!(
        rig.safe_point("outbox.added").await.1.is_some(),
        "the added queue's reconciliation is due"
    );
}

/// Four dispatchers sharing a namespace check Redis once per interval
/// between them, not once each: the scheduled check is taken in turn
/// (a key in Redis that expires after the interval).
// Break checked: `take_turn` answering always `true` (every dispatcher
// checks every interval) makes about 4 checks per interval, and fails here
// with "no longer true".
#[tokio::test]
async fn four_dispatchers_sharing_a_namespace_check_redis_once_per_interval_between_them() {
    let rig = Rig::shared().await;
    count_checks(&rig).await;
    let every = Duration::from_millis(300);
    let settings = RedisGuardSettings {
        check_every: every,
        ..RedisGuardSettings::default()
    };
    let shutdown = CancellationToken::new();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let dispatcher = std::sync::Arc::new(guarded_dispatcher_with(
                &rig.db,
                &rig.redis_url,
                &rig.namespace,
                settings.clone(),
            ));
            tokio::spawn(dispatcher.run(shutdown.clone()))
        })
        .collect();
    outbox_test_support::eventually(
        "each dispatcher's first check",
        Duration::from_secs(30),
        async || checks(&rig).await >= 4,
    )
    .await;
    // A first check still under way (a slow start) comes within this.
    tokio::time::sleep(every * 2).await;
    let since = std::time::Instant::now();
    let first = checks(&rig).await;
    // One turn per interval, so at most one check per interval passed,
    // one for the interval under way, and one first check that came late
    // after all.
    outbox_test_support::consistently(
        "at most one check per interval among the four",
        Duration::from_secs(3),
        async || {
            let allowed = since.elapsed().as_millis() / every.as_millis() + 2;
            u128::from(checks(&rig).await - first) <= allowed
        },
    )
    .await;
    outbox_test_support::eventually(
        "the scheduled checks go on",
        Duration::from_secs(30),
        async || checks(&rig).await >= first + 3,
    )
    .await;
    shutdown.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
}

/// The turn's key is the same in every build and version (a rolling
/// deploy runs two side by side, which must share one turn), so its
/// hash is pinned here: FNV-1a over the queue names, each ended by a
/// newline.
// Break checked: the hash's `^=` as `|=` (a miss of the mutation run on
// fbea9ef) changes the key and fails here.
#[test]
fn the_turn_key_of_a_namespace_and_its_queues_is_the_same_in_every_version() {
    let ns = QueueNamespace::prefixed("adopt-app:");
    assert_eq!(
        outbox_dispatch::guard_turn_key(&ns, &["outbox.audit", "outbox.mail"]),
        "adopt-app:outbox:redis-guard:turn:e9c09095655ed2a1"
    );
}

/// The turn belongs to a namespace (and its set of queues): another
/// namespace's dispatcher holding its own turn on the same Redis, for the
/// whole test, leaves this namespace's scheduled checks going.
// Break checked: `guard_turn_key` naming one key for every namespace
// (a mutation run's "xyzzy") stops this namespace's checks after the
// first, and "scheduled checks after the first" times out.
#[tokio::test]
async fn a_turn_held_in_another_namespace_leaves_this_ones_scheduled_checks_going() {
    let rig = Rig::shared().await;
    count_checks(&rig).await;
    let settings = RedisGuardSettings {
        check_every: Duration::from_millis(100),
        ..RedisGuardSettings::default()
    };
    let other = QueueNamespace::prefixed(format!("{}other:", rig.namespace.prefix()));
    let elsewhere = guarded_dispatcher_with(&rig.db, &rig.redis_url, &other, settings.clone());
    let held = elsewhere.redis_guard().unwrap().turn_key();
    hold_turn(&rig, &held).await;
    let dispatcher = std::sync::Arc::new(guarded_dispatcher_with(
        &rig.db,
        &rig.redis_url,
        &rig.namespace,
        settings,
    ));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(dispatcher.run(shutdown.clone()));
    outbox_test_support::eventually(
        "scheduled checks after the first",
        Duration::from_secs(30),
        async || checks(&rig).await >= 3,
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&held)
        .query_async(&mut rig.redis())
        .await
        .unwrap();
}

/// Holds the guard's turn `key` for ten minutes, as a dispatcher that
/// took it would.
async fn hold_turn(rig: &Rig, key: &str) {
    let () = redis::cmd("SET")
        .arg(key)
        .arg(1)
        .arg("PX")
        .arg(600_000)
        .query_async(&mut rig.redis())
        .await
        .unwrap();
}

/// A dispatcher whose scheduled round finds the turn taken checks
/// nothing, but goes on with a reconciliation that is due: after a loss,
/// each dispatcher still takes its passes (under the namespace's lease),
/// not only the one with the turn. Poked (a failed hand-off), it checks
/// whoever holds the turn.
// Break checked: a round without the turn doing nothing leaves the
// reconciliation after its first pass, and "every lost job pushed again"
// times out.
#[tokio::test]
async fn a_dispatcher_without_the_turn_checks_only_when_poked_but_goes_on_with_a_due_reconciliation()
 {
    let server = RedisProcess::start().await;
    // 200 lost jobs in batches of 1: five passes of at most 40 batches.
    let (rig, hooks) = rig_with_a_lost_backlog(&server, 200, 1).await;
    count_checks(&rig).await;
    let dispatcher = std::sync::Arc::new(guarded_dispatcher_with(
        &rig.db,
        &rig.redis_url,
        &rig.namespace,
        RedisGuardSettings {
            check_every: Duration::from_millis(100),
            batch_size: 1,
            ..RedisGuardSettings::default()
        },
    ));
    // Another dispatcher holds the turn for the whole test.
    let guard = dispatcher.redis_guard().unwrap().clone();
    hold_turn(&rig, &guard.turn_key()).await;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(dispatcher.run(shutdown.clone()));
    outbox_test_support::eventually(
        "every lost job pushed again",
        Duration::from_secs(60),
        async || waiting_count(&rig, queues::WEBHOOK, &hooks).await == hooks.len(),
    )
    .await;
    assert_eq!(
        checks(&rig).await,
        1,
        "the first round checks; the scheduled ones, without the turn, do not"
    );
    guard.poke();
    outbox_test_support::eventually(
        "the poked round checks",
        Duration::from_secs(30),
        async || checks(&rig).await == 2,
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[derive(diesel::QueryableByName, Debug, PartialEq)]
struct PendingCursor {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pending_since: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Uuid>)]
    pending_after_id: Option<Uuid>,
}

// Break checked: `advance_pending` answering "moved" when it did not
// (`n > 0` → `n == 0`) fails here; the guard then goes on reconciling
// from a cursor a new loss has set back, or stops after one batch.
#[tokio::test]
async fn a_reconciliation_cursor_moves_only_from_where_it_stands() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    conn.batch_execute(
        "INSERT INTO outbox_redis_epoch (namespace, epoch, run_id, checked_at) \
         VALUES ('ns:', gen_random_uuid(), 'run', now()); \
         INSERT INTO outbox_redis_safe_point (namespace, queue, drained_before, pending_since) \
         VALUES ('ns:', 'outbox.audit', now(), '2026-11-30 10:00:00+00')",
    )
    .await
    .unwrap();
    let cursor = async |conn: &mut diesel_async::AsyncPgConnection| {
        diesel::sql_query(
            "SELECT pending_since, pending_after_id FROM outbox_redis_safe_point \
             WHERE namespace = 'ns:' AND queue = 'outbox.audit'",
        )
        .get_result::<PendingCursor>(conn)
        .await
        .unwrap()
    };
    let start: DateTime<Utc> = "2026-11-30T10:00:00Z".parse().unwrap();
    let next = ("2026-11-30T10:05:00Z".parse().unwrap(), Uuid::now_v7());
    let epoch = db::remembered_epoch(&mut conn, "ns:")
        .await
        .unwrap()
        .unwrap()
        .epoch;

    let moved = db::advance_pending(
        &mut conn,
        "ns:",
        "outbox.audit",
        epoch,
        (start, None),
        Some(next),
    )
    .await
    .unwrap();
    assert!(moved, "the cursor stood where the caller said: it moves");
    let moved_to = PendingCursor {
        pending_since: Some(next.0),
        pending_after_id: Some(next.1),
    };
    assert_eq!(cursor(&mut conn).await, moved_to);

    // A caller still at the old place (a new loss, another dispatcher) is
    // told so and changes nothing.
    let stale = db::advance_pending(&mut conn, "ns:", "outbox.audit", epoch, (start, None), None)
        .await
        .unwrap();
    assert!(!stale, "the cursor had moved on: nothing moves");
    assert_eq!(cursor(&mut conn).await, moved_to);

    let done = db::advance_pending(
        &mut conn,
        "ns:",
        "outbox.audit",
        epoch,
        (next.0, Some(next.1)),
        None,
    )
    .await
    .unwrap();
    assert!(done, "the last batch ends the reconciliation");
    assert_eq!(
        cursor(&mut conn).await,
        PendingCursor {
            pending_since: None,
            pending_after_id: None
        }
    );
}

// Break checked: the reconciler's `Debug` replaced by an empty result (a
// mutation run's shard 7) fails here.
#[tokio::test]
async fn a_reconciler_in_a_log_line_names_its_namespace_and_batch_size() {
    let rig = Rig::shared().await;
    let shown = format!("{:?}", rig.reconciler().with_batch_size(7));
    assert!(shown.starts_with("Reconciler"), "{shown}");
    assert!(shown.contains(rig.namespace.prefix()), "{shown}");
    assert!(shown.contains("batch_size: 7"), "{shown}");
}

// Break checked: the guard's `Debug` replaced by an empty result (a miss
// of the pinned dispatch shard 1) fails here.
#[tokio::test]
async fn a_redis_guard_in_a_log_line_names_its_namespace_queues_and_settings() {
    let rig = Rig::shared().await;
    let guarded = guarded_dispatcher_with(
        &rig.db,
        &rig.redis_url,
        &rig.namespace,
        RedisGuardSettings {
            unfinished_limit: 77,
            ..RedisGuardSettings::default()
        },
    );
    let shown = format!("{:?}", guarded.redis_guard().unwrap());
    assert!(shown.starts_with("RedisGuard"), "{shown}");
    assert!(shown.contains(rig.namespace.prefix()), "{shown}");
    assert!(shown.contains(queues::MAIL), "{shown}");
    assert!(shown.contains("unfinished_limit: 77"), "{shown}");
}

/// A guard whose checks keep failing (its Redis refuses connections) says
/// so once, at the first failure, not at every retry.
// Break checked: the warning logged only while already failing (`!failing`
// as `failing` in `RedisGuard::run`, a miss of a mutation run) fails with
// "no longer true: one warning".
#[tokio::test]
async fn a_guard_whose_checks_keep_failing_warns_once_at_the_first_failure() {
    let logs = LogCapture::start();
    outbox_test_support::init_tracing();
    let db = TestDatabase::new().await;
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://{}", listener.local_addr().unwrap())
    };
    let dispatcher =
        std::sync::Arc::new(guarded_dispatcher(&db, &refused, &QueueNamespace::root()));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(dispatcher.run(shutdown.clone()));
    let warnings = || logs.count("Redis guard: check failed");
    outbox_test_support::eventually("the first warning", Duration::from_secs(30), async || {
        warnings() >= 1
    })
    .await;
    // The guard retries every second; three more failures say nothing.
    outbox_test_support::consistently("one warning", Duration::from_secs(3), async || {
        warnings() == 1
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// A hand-off whose `DONE` statement waited on a lock (a producer's, say)
/// commits a `processed_at` from when it began, after checks ran
/// meanwhile: no safe point may have passed it, or a Redis loss afterwards
/// leaves its job lost for good.
// Break checked: `advance_safe_points` without the hold of the oldest open
// transaction (`held` answering its mark unchanged) moves the safe point
// past the slow hand-off and fails the first assertion (and, without it,
// the job is not pushed again: "Missing").
#[tokio::test]
async fn a_hand_off_committed_after_checks_passed_its_start_is_pushed_again_after_a_loss() {
    let server = RedisProcess::start().await;
    let rig = Rig::private(&server).await;
    let earlier = rig.hand_off((0..3).map(mail).collect()).await;
    rig.deliver_mails(&earlier).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;

    // The slow hand-off: its job is in Redis, its DONE statement has begun
    // and has not committed.
    let mut conn = rig.db.conn().await;
    let slow = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, vec![mail(3)]).await
        })
        .await
        .unwrap()[0]
        .id();
    rig.push_job(queues::MAIL, &task_id(slow)).await;
    let mut marking = rig.db.conn().await;
    marking
        .batch_execute(&format!(
            "BEGIN;
             UPDATE outbox_event SET status = 'DONE', processed_at = now(), target_queue = '{}'
             WHERE id = '{slow}'",
            queues::MAIL
        ))
        .await
        .unwrap();
    #[derive(diesel::QueryableByName)]
    struct Later {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        later: bool,
    }
    outbox_test_support::eventually(
        "the clock to pass the start of the open hand-off",
        Duration::from_secs(10),
        async || {
            diesel::sql_query(format!(
                "SELECT clock_timestamp() > (SELECT processed_at FROM outbox_event WHERE id = '{slow}') AS later"
            ))
            .get_result::<Later>(&mut marking)
            .await
            .unwrap()
            .later
        },
    )
    .await;
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.advance().await;
    marking.batch_execute("COMMIT").await.unwrap();
    let handed_off = rig.handed_off_at(queues::MAIL, slow).await;
    assert!(
        rig.safe_point(queues::MAIL).await.0 <= handed_off,
        "the safe point passed a hand-off still being recorded"
    );

    rig.flush_all().await;
    assert_eq!(
        rig.check().await,
        Assessment::Lost(LossReason::MarkerMissing)
    );
    rig.repair().await;
    rig.assert_waiting(queues::MAIL, &[slow]).await;
}

/// A session that stays in a transaction without writing to
/// `outbox_event` (another dispatcher's wake-up gate waiting on its
/// advisory lock, a report left open) holds no safe point back.
// Break checked: `oldest_open_transaction` counting every open client
// transaction (the `pg_locks` join dropped) keeps the safe point at the
// open session's start, before the two later mails: the assertion fails.
#[tokio::test]
async fn a_transaction_left_open_without_writing_events_holds_no_safe_point_back() {
    let rig = Rig::shared().await;
    let earlier = rig.hand_off((0..2).map(mail).collect()).await;
    rig.deliver_mails(&earlier).await;
    assert_eq!(rig.check().await, Assessment::FirstSight);
    rig.repair().await;

    let mut waiting = rig.db.conn().await;
    waiting
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(42)")
        .await
        .unwrap();
    let later = rig.hand_off((2..4).map(mail).collect()).await;
    rig.deliver_mails(&later).await;
    assert_eq!(rig.check().await, Assessment::Intact);
    rig.advance().await;
    assert!(
        rig.safe_point(queues::MAIL).await.0 >= rig.handed_off_at(queues::MAIL, later[1]).await,
        "the open session held the safe point back"
    );
    waiting.batch_execute("COMMIT").await.unwrap();
}
