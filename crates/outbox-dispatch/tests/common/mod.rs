//! Shared fixtures of the dispatcher tests: a database, a Redis namespace,
//! and helpers that read what a user would look at (rows and Redis jobs).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_dispatch::{Dispatcher, DispatcherConfig, LISTENER_APPLICATION_NAME, Router};
use outbox_model::OutboxEvent;
use outbox_model::schema::outbox_event;
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use outbox_queue::{QueueNamespace, RedisSettings};
use outbox_test_support::{TestDatabase, TestRedis};
use uuid::Uuid;

pub struct Harness {
    pub db: TestDatabase,
    pub redis: TestRedis,
    pub namespace: QueueNamespace,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_pool_size(4).await
    }

    pub async fn with_pool_size(pool_size: u32) -> Self {
        outbox_test_support::init_tracing();
        let db = TestDatabase::with_pool_size(pool_size).await;
        let redis = TestRedis::new().await;
        let namespace = QueueNamespace::prefixed(redis.prefix());
        Self {
            db,
            redis,
            namespace,
        }
    }

    /// A dispatcher on this database and Redis namespace.
    pub fn dispatcher(&self, config: DispatcherConfig) -> Arc<Dispatcher> {
        self.dispatcher_on(self.redis.url(), config)
    }

    /// A dispatcher pushing to the Redis at `redis_url`.
    pub fn dispatcher_on(&self, redis_url: &str, config: DispatcherConfig) -> Arc<Dispatcher> {
        self.dispatcher_routing(
            redis_url,
            outbox_catalog::standard_router().unwrap(),
            config,
        )
    }

    /// A dispatcher with its own routing table (a version of the
    /// application with other routes).
    pub fn dispatcher_with(&self, router: Router, config: DispatcherConfig) -> Arc<Dispatcher> {
        self.dispatcher_routing(self.redis.url(), router, config)
    }

    fn dispatcher_routing(
        &self,
        redis_url: &str,
        router: Router,
        config: DispatcherConfig,
    ) -> Arc<Dispatcher> {
        let redis = outbox_queue::connect(&RedisSettings::new(redis_url)).unwrap();
        Arc::new(
            Dispatcher::new(
                self.db.pool().clone(),
                self.db.url(),
                redis,
                self.namespace.clone(),
                router,
                config,
            )
            .unwrap(),
        )
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        self.db.conn().await
    }

    /// Publishes events in one committed transaction; returns their ids.
    pub async fn publish(&self, events: Vec<NewOutboxEvent>) -> Vec<Uuid> {
        let mut conn = self.conn().await;
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, events).await
        })
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id())
        .collect()
    }

    /// Publishes one event of `event_type` for tenant `acme`; returns its id.
    pub async fn publish_one(&self, event_type: &str) -> Uuid {
        self.publish(vec![NewOutboxEvent::new(
            "acme",
            event_type,
            serde_json::json!({}),
        )])
        .await[0]
    }

    pub async fn rows(&self) -> Vec<OutboxEvent> {
        let mut conn = self.conn().await;
        outbox_event::table
            .order(outbox_event::created_at)
            .select(OutboxEvent::as_select())
            .load(&mut conn)
            .await
            .unwrap()
    }

    pub async fn row(&self, id: Uuid) -> OutboxEvent {
        let mut conn = self.conn().await;
        outbox_event::table
            .find(id)
            .select(OutboxEvent::as_select())
            .first(&mut conn)
            .await
            .unwrap()
    }

    pub async fn db_now(&self) -> DateTime<Utc> {
        let mut conn = self.conn().await;
        diesel::select(diesel::dsl::now.into_sql::<diesel::sql_types::Timestamptz>())
            .get_result(&mut conn)
            .await
            .unwrap()
    }

    /// Task ids stored on `queue` (its data hash), sorted.
    pub async fn task_ids(&self, queue: &str) -> Vec<String> {
        let mut conn = self.redis.conn().await;
        let mut ids: Vec<String> = redis::cmd("HKEYS")
            .arg(format!("{}:data", self.namespace.queue(queue)))
            .query_async(&mut conn)
            .await
            .unwrap();
        ids.sort();
        ids
    }

    /// The job body stored for `task_id` on `queue`, as stored.
    pub async fn job_text(&self, queue: &str, task_id: &str) -> String {
        let mut conn = self.redis.conn().await;
        redis::cmd("HGET")
            .arg(format!("{}:data", self.namespace.queue(queue)))
            .arg(task_id)
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    /// The job body stored for `task_id` on `queue`.
    pub async fn job_body(&self, queue: &str, task_id: &str) -> serde_json::Value {
        let mut conn = self.redis.conn().await;
        let raw: Vec<u8> = redis::cmd("HGET")
            .arg(format!("{}:data", self.namespace.queue(queue)))
            .arg(task_id)
            .query_async(&mut conn)
            .await
            .unwrap();
        serde_json::from_slice(&raw).unwrap()
    }

    /// How many tasks per id exist across every standard queue.
    pub async fn tasks_per_id(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for queue in outbox_catalog::standard_router().unwrap().queues() {
            for id in self.task_ids(queue).await {
                *counts.entry(id).or_default() += 1;
            }
        }
        counts
    }

    /// The backend pid of the dispatcher's LISTEN connection, when one is connected.
    pub async fn listener_pid(&self) -> Option<i32> {
        #[derive(diesel::QueryableByName)]
        struct Pid {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1 AND query ILIKE '%LISTEN%'",
        )
        .bind::<diesel::sql_types::Text, _>(LISTENER_APPLICATION_NAME)
        .get_result::<Pid>(&mut conn)
        .await
        .ok()
        .map(|row| row.pid)
    }

    /// Waits until `check` holds, polling every 50 ms, failing after `limit`.
    pub async fn wait_for(&self, what: &str, limit: Duration, check: impl AsyncFnMut() -> bool) {
        outbox_test_support::eventually(what, limit, check).await;
    }

    /// Waits until every row is `DONE`.
    pub async fn wait_all_done(&self, what: &str, limit: Duration) {
        self.wait_for(what, limit, async || {
            self.rows()
                .await
                .iter()
                .all(|r| r.status == outbox_model::OutboxStatus::Done)
        })
        .await;
    }
}

/// A private Redis whose writes can be held: pushes hang while it is
/// paused, as they do on a Redis that stopped answering.
pub struct PausableRedis {
    pub process: outbox_test_support::RedisProcess,
    admin: redis::aio::MultiplexedConnection,
}

impl PausableRedis {
    pub async fn start() -> Self {
        let process = outbox_test_support::RedisProcess::start().await;
        let admin = process
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Self { process, admin }
    }

    /// Holds every write (pushes included) for up to a minute.
    pub async fn pause_writes(&mut self) {
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(60_000)
            .arg("WRITE")
            .query_async::<()>(&mut self.admin)
            .await
            .unwrap();
    }

    /// Lets the held writes through.
    pub async fn unpause(&mut self) {
        redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async::<()>(&mut self.admin)
            .await
            .unwrap();
    }
}

/// A config for tests: quick polling, no listener unless asked.
pub fn quick_config() -> DispatcherConfig {
    DispatcherConfig {
        interval: Duration::from_millis(100),
        listen: false,
        ..DispatcherConfig::default()
    }
}

/// [`quick_config`] without a grace period: an unrouted event is
/// dead-lettered by the tick that claims it.
pub fn no_route_grace() -> DispatcherConfig {
    DispatcherConfig {
        unrouted_grace: Duration::ZERO,
        ..quick_config()
    }
}

pub async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    diesel_async::SimpleAsyncConnection::batch_execute(conn, sql)
        .await
        .unwrap();
}

/// Turns autovacuum off for `outbox_event`: the table, or each of its
/// partitions when it is partitioned (a partitioned parent takes no
/// storage parameter).
pub async fn without_autovacuum(conn: &mut AsyncPgConnection) {
    exec(
        conn,
        "DO $$
         DECLARE t regclass;
         BEGIN
             FOR t IN SELECT c.oid FROM pg_class c
                      WHERE c.relkind = 'r'
                        AND c.oid IN (SELECT relid FROM pg_partition_tree('outbox_event')
                                      UNION ALL SELECT 'outbox_event'::regclass) LOOP
                 EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = off)', t);
             END LOOP;
         END $$",
    )
    .await;
}

/// Whether `outbox_event` is partitioned in this database
/// (`OUTBOX_TEST_PARTITIONED=1` runs).
pub async fn partitioned(conn: &mut AsyncPgConnection) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Kind {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        partitioned: bool,
    }
    diesel::sql_query(
        "SELECT relkind = 'p' AS partitioned FROM pg_class WHERE oid = 'outbox_event'::regclass",
    )
    .get_result::<Kind>(conn)
    .await
    .unwrap()
    .partitioned
}

/// What a statement read of `outbox_event` (or its partitions), measured
/// by running it under `EXPLAIN (ANALYZE, FORMAT JSON)` in a transaction
/// that is rolled back.
#[derive(Debug, Default)]
pub struct Reads {
    /// Rows its scans of the table read: returned plus filtered out.
    pub rows: f64,
    /// Of those, the rows sequential scans read.
    pub sequential: f64,
    /// The joins in its plan.
    pub joins: Vec<String>,
    /// The indexes its scans used.
    pub indexes: Vec<String>,
}

/// [`Reads`] of `sql` (a statement with no parameters left).
pub async fn reads(conn: &mut AsyncPgConnection, sql: &str) -> Reads {
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        json: String,
    }
    fn walk(node: &serde_json::Value, reads: &mut Reads) {
        let kind = node["Node Type"].as_str().unwrap_or_default();
        let relation = node["Relation Name"].as_str().unwrap_or_default();
        if kind.ends_with("Join") || kind == "Nested Loop" {
            reads.joins.push(kind.to_owned());
        }
        if relation.starts_with("outbox_event") && kind.contains("Scan") {
            let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
            let rows = (node["Actual Rows"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Filter"].as_f64().unwrap_or(0.0))
                * loops;
            reads.rows += rows;
            if kind == "Seq Scan" {
                reads.sequential += rows;
            }
            if let Some(index) = node["Index Name"].as_str() {
                reads.indexes.push(index.to_owned());
            }
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, reads);
        }
    }
    exec(conn, "BEGIN").await;
    let plan: Plan = diesel::sql_query(format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"))
        .get_result(conn)
        .await
        .unwrap();
    exec(conn, "ROLLBACK").await;
    let plan: serde_json::Value = serde_json::from_str(&plan.json).unwrap();
    let mut reads = Reads::default();
    walk(&plan[0]["Plan"], &mut reads);
    reads
}
