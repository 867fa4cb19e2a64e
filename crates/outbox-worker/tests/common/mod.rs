//! A running stack for end-to-end tests: a database, a Redis namespace, an
//! SMTP sink, an HTTP sink, and the two worker binaries as real processes.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event};
use outbox_queue::{QueueNamespace, QueueStats, RedisSettings};
use outbox_test_support::{
    ChildOutput, HttpSink, ReceivedRequest, SmtpSink, TestDatabase, TestRedis, eventually,
};

/// How long an end-to-end test waits for an effect.
const WAIT: Duration = Duration::from_secs(60);
/// `WORKER_SHUTDOWN_GRACE_MS` of the stack's workers.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
use uuid::Uuid;

pub const GENERAL: &str = env!("CARGO_BIN_EXE_worker-general");
pub const MAIL: &str = env!("CARGO_BIN_EXE_worker-mail");
pub const BRIDGE: &str = env!("CARGO_BIN_EXE_workflow-bridge");
/// The bridge secret of the tests.
pub const BRIDGE_SECRET: &str = "e2e-bridge-secret-of-at-least-32-bytes";

pub fn free_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

pub struct Worker {
    pub child: Child,
    pub addr: String,
    /// The binary's path, for messages.
    binary: String,
    /// Everything the process wrote to stdout and stderr, line by line.
    output: ChildOutput,
}

impl Worker {
    /// What the process has written to stdout and stderr so far.
    pub fn output(&self) -> String {
        self.output.text()
    }

    /// Waits until the process has written `text` (a log line, a message).
    pub async fn wait_output(&self, text: &str) -> String {
        eventually(
            &format!("worker output containing {text:?}"),
            WAIT,
            async || self.output().contains(text),
        )
        .await;
        self.output()
    }

    /// Waits until the process has written a line holding `text`, and
    /// returns the first such line.
    pub async fn wait_line(&self, text: &str) -> String {
        let output = self.wait_output(text).await;
        let line = output.lines().find(|line| line.contains(text));
        line.expect("the output holds the text").to_owned()
    }

    /// Waits until `/readyz` answers 200, failing if the process exits first.
    pub async fn wait_ready(&mut self) {
        if let Err(status) = self.try_ready().await {
            panic!("{} exited during start-up: {status}", self.binary);
        }
    }

    /// Whether the process exited during start-up because another process
    /// took its HTTP port between the stack choosing it and the worker
    /// binding it (tests run in parallel).
    fn lost_its_port(&self) -> bool {
        self.output().contains("Address already in use")
    }

    /// Waits until `/readyz` answers 200; the exit status when the process
    /// exits first. Fails after 30 s.
    async fn try_ready(&mut self) -> Result<(), ExitStatus> {
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = client
                .get(format!("http://{}/readyz", self.addr))
                .send()
                .await
                && response.status().is_success()
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(status);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} not ready within 30 s",
                self.binary
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit and for its output to be read to the
    /// end (so that [`Worker::output`] holds its last lines), failing after
    /// `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap()
                && self.output.closed()
            {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "worker did not exit (and close its output) within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Stack {
    pub db: TestDatabase,
    pub redis: TestRedis,
    pub namespace: QueueNamespace,
    pub smtp: SmtpSink,
    pub http: HttpSink,
}

impl Stack {
    /// The OTLP/HTTP requests at the sink's `/collector/v1/traces` that
    /// carry spans of the trace `trace_id` (32 hex digits), waiting up to
    /// 60 s for the first, named `what` if none comes. In protobuf a span's
    /// trace id is its 16 raw bytes; span names are plain strings.
    pub async fn exported_spans_of(&self, trace_id: &str, what: &str) -> Vec<ReceivedRequest> {
        let raw: Vec<u8> = (0..trace_id.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&trace_id[i..i + 2], 16).unwrap())
            .collect();
        let exported = || {
            self.http
                .requests_to("/collector/v1/traces")
                .into_iter()
                .filter(|r| r.body.windows(raw.len()).any(|w| w == raw))
                .collect::<Vec<_>>()
        };
        eventually(what, Duration::from_secs(60), async || {
            !exported().is_empty()
        })
        .await;
        exported()
    }

    pub async fn new() -> Self {
        Self::with_database(TestDatabase::new().await).await
    }

    /// A stack around `db` (a database on a server of the suite's choice).
    pub async fn with_database(db: TestDatabase) -> Self {
        outbox_test_support::init_tracing();
        let redis = TestRedis::new().await;
        let namespace = QueueNamespace::prefixed(redis.prefix());
        Self {
            db,
            redis,
            namespace,
            smtp: SmtpSink::start().await,
            http: HttpSink::start().await,
        }
    }

    /// The environment both binaries get.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("DATABASE_URL", self.db.url().to_owned()),
            ("REDIS_URL", self.redis.url().to_owned()),
            ("OUTBOX_QUEUE_PREFIX", self.namespace.prefix().to_owned()),
            ("OUTBOX_DISPATCHER_ENABLED", "true".to_owned()),
            ("OUTBOX_DISPATCH_INTERVAL_MS", "200".to_owned()),
            ("SMTP_URL", self.smtp.url()),
            ("MAIL_FROM", "outbox@example.test".to_owned()),
            ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true".to_owned()),
            ("WEBHOOK_TIMEOUT_MS", "2000".to_owned()),
            ("DELIVERY_LEASE_MS", "3000".to_owned()),
            ("WORKER_HEARTBEAT_MS", "1000".to_owned()),
            ("WORKER_RETRIES", "2".to_owned()),
            ("DATABASE_POOL_SIZE", "6".to_owned()),
            (
                "WORKER_SHUTDOWN_GRACE_MS",
                SHUTDOWN_GRACE.as_millis().to_string(),
            ),
            ("WORKER_GAUGE_INTERVAL_MS", "200".to_owned()),
            ("WORKER_POLL_INTERVAL_MS", "200".to_owned()),
            (
                "RUST_LOG",
                "info,apalis=warn,apalis_core=warn,apalis_redis=warn".to_owned(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Starts a binary with the stack's environment plus `extra`, without
    /// waiting for it to be ready; its output is collected (see
    /// [`Worker::output`]).
    pub fn spawn(&self, binary: &str, extra: &[(&str, &str)]) -> Worker {
        self.spawn_without(binary, &[], extra)
    }

    /// [`Stack::spawn`] with the variables `unset` left out of the stack's
    /// environment (so that the binary runs with their defaults).
    pub fn spawn_without(&self, binary: &str, unset: &[&str], extra: &[(&str, &str)]) -> Worker {
        let addr = free_addr();
        let mut command = Command::new(binary);
        // Workers serve on WORKER_HTTP_ADDR, the bridge on WORKFLOW_BRIDGE_ADDR.
        command
            .envs(self.env())
            .env("WORKER_HTTP_ADDR", &addr)
            .env("WORKFLOW_BRIDGE_ADDR", &addr);
        for k in unset {
            command.env_remove(k);
        }
        for (k, v) in extra {
            command.env(k, v);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = ChildOutput::capture(&mut child);
        Worker {
            child,
            addr,
            binary: binary.to_owned(),
            output,
        }
    }

    /// Starts a binary with the stack's environment plus `extra`, and waits
    /// until it is ready.
    pub async fn start(&self, binary: &str, extra: &[(&str, &str)]) -> Worker {
        self.start_without(binary, &[], extra).await
    }

    /// [`Stack::start`] with the variables `unset` left out of the stack's
    /// environment.
    pub async fn start_without(
        &self,
        binary: &str,
        unset: &[&str],
        extra: &[(&str, &str)],
    ) -> Worker {
        // A port chosen free may be taken by a parallel test before the
        // worker binds it: start again on another, twice at most.
        for _ in 0..2 {
            let mut worker = self.spawn_without(binary, unset, extra);
            match worker.try_ready().await {
                Ok(()) => return worker,
                Err(_) if worker.lost_its_port() => continue,
                Err(status) => panic!("{binary} exited during start-up: {status}"),
            }
        }
        let mut worker = self.spawn_without(binary, unset, extra);
        worker.wait_ready().await;
        worker
    }

    pub async fn publish(&self, event: NewOutboxEvent) -> Uuid {
        let mut conn = self.db.conn().await;
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, event).await
        })
        .await
        .unwrap()
        .id()
    }

    pub async fn sql(&self, sql: &str) {
        self.db.conn().await.batch_execute(sql).await.unwrap();
    }

    /// The timestamp `sql` selects as `at` from its one row (`None` for
    /// NULL).
    pub async fn timestamp(&self, sql: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        #[derive(diesel::QueryableByName)]
        struct At {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>)]
            at: Option<chrono::DateTime<chrono::Utc>>,
        }
        let mut conn = self.db.conn().await;
        diesel_async::RunQueryDsl::get_result::<At>(diesel::sql_query(sql), &mut conn)
            .await
            .unwrap()
            .at
    }

    pub async fn stats(&self, queue: &str) -> QueueStats {
        let mut conn = outbox_queue::connect(&RedisSettings::new(self.redis.url())).unwrap();
        outbox_queue::queue_stats(&mut conn, &self.namespace, queue, Duration::from_secs(3600))
            .await
            .unwrap()
    }

    /// Waits until the worker's /metrics has a line starting with `line`.
    pub async fn wait_metric(&self, worker: &Worker, line: &str) -> String {
        metrics_where(worker, &format!("metric {line:?}"), |l| l.starts_with(line)).await
    }

    /// Waits until the worker's /metrics has the line `line` exactly (a
    /// series and its value, like `outbox_pending_due 2`).
    pub async fn wait_metric_line(&self, worker: &Worker, line: &str) -> String {
        metrics_where(worker, &format!("metric line {line:?}"), |l| l == line).await
    }

    /// Waits until none of `queues` has a job waiting or running: whatever
    /// they were given has had its effect.
    pub async fn wait_idle(&self, queues: &[&str]) {
        eventually(&format!("{queues:?} to be idle"), WAIT, async || {
            let mut idle = true;
            for queue in queues {
                let stats = self.stats(queue).await;
                idle &= stats.backlog == 0 && stats.running == 0;
            }
            idle
        })
        .await;
    }

    /// Waits until `queue` has `done` finished jobs.
    pub async fn wait_done(&self, queue: &str, done: u64) {
        let what = format!("{done} done job(s) on {queue}");
        eventually(&what, WAIT, async || self.stats(queue).await.done >= done).await;
    }

    /// Waits until `queue` has `dead` dead jobs.
    pub async fn wait_dead(&self, queue: &str, dead: u64) {
        let what = format!("{dead} dead job(s) on {queue}");
        eventually(&what, WAIT, async || self.stats(queue).await.dead >= dead).await;
    }

    /// Waits until the SQL count query returns `n`.
    pub async fn wait_count(&self, sql: &str, n: i64) {
        use diesel_async::RunQueryDsl;
        let mut conn = self.db.conn().await;
        eventually(&format!("{sql} = {n}"), WAIT, async || {
            let count: i64 = diesel::dsl::sql::<diesel::sql_types::BigInt>(sql)
                .get_result(&mut conn)
                .await
                .unwrap();
            count == n
        })
        .await;
    }
}

/// Waits until a line of the worker's /metrics satisfies `wanted`; returns the page.
/// Waits until the worker's /metrics has a line `wanted` accepts; returns
/// the whole body.
pub async fn metrics_where(worker: &Worker, what: &str, wanted: impl Fn(&str) -> bool) -> String {
    let mut body = String::new();
    eventually(what, WAIT, async || {
        body = reqwest::get(format!("http://{}/metrics", worker.addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        body.lines().any(&wanted)
    })
    .await;
    body
}
