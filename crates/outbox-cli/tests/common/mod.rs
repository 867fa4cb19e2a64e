//! What the tests of the real `outbox` binary share: running it against a
//! test database and Redis namespace, and reading what it printed.

// Each test file uses the part it needs.
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::process::{Child, Command, Output, Stdio};

use diesel_async::SimpleAsyncConnection;
use outbox_queue::QueueNamespace;
use outbox_test_support::{TestDatabase, TestRedis};
use serde_json::Value;

/// A test database and a Redis namespace of their own, and the binary run
/// on them.
pub struct Env {
    pub db: TestDatabase,
    pub redis: TestRedis,
    pub namespace: QueueNamespace,
}

impl Env {
    pub async fn new() -> Self {
        let db = TestDatabase::new().await;
        let redis = TestRedis::new().await;
        let namespace = QueueNamespace::prefixed(redis.prefix());
        Self {
            db,
            redis,
            namespace,
        }
    }

    /// Runs `outbox args` on this database and these queues.
    pub fn outbox(&self, args: &[&str]) -> Run {
        outbox(&self.db, &self.redis, &self.namespace, args)
    }

    /// Runs `outbox args` as the user `user` (`$USER`, which the CLI
    /// records as who asked).
    pub fn outbox_as(&self, user: &str, args: &[&str]) -> Run {
        Run::from(
            command(&self.db, &self.redis, &self.namespace, args)
                .env("USER", user)
                .output()
                .unwrap(),
        )
    }

    /// Runs `outbox args` with the variables `vars` set as well.
    pub fn outbox_with(&self, vars: &[(&str, &str)], args: &[&str]) -> Run {
        Run::from(
            command(&self.db, &self.redis, &self.namespace, args)
                .envs(vars.iter().copied())
                .output()
                .unwrap(),
        )
    }

    /// Starts `outbox args` on this database and these queues without
    /// waiting for it; [`Started::finish`] waits and collects its output.
    pub fn start(&self, args: &[&str]) -> Started {
        Started(
            command(&self.db, &self.redis, &self.namespace, args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    /// Runs `sql` (any number of statements) on the test database.
    pub async fn sql(&self, sql: &str) {
        self.db.conn().await.batch_execute(sql).await.unwrap();
    }
}

/// A run of `outbox` under way.
pub struct Started(Child);

impl Started {
    /// Waits for the run to end (off the async runtime) and returns it.
    pub async fn finish(self) -> Run {
        let output = tokio::task::spawn_blocking(move || self.0.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        Run::from(output)
    }
}

/// One run of `outbox`: its exit code and output.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stdout as JSON; panics with the output when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}{}", self.stdout, self.stderr))
    }

    /// The first line of stdout that starts with `start`, leading spaces
    /// aside; panics with the output when there is none.
    pub fn line(&self, start: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?}:\n{}", self.stdout))
    }
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// `outbox args` on `db` and the queues of `namespace` in `redis`.
fn command(
    db: &TestDatabase,
    redis: &TestRedis,
    namespace: &QueueNamespace,
    args: &[&str],
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .args(args)
        .env("DATABASE_URL", db.url())
        .env("REDIS_URL", redis.url())
        .env("OUTBOX_QUEUE_PREFIX", namespace.prefix())
        .env_remove("USER")
        // The workers' lease, read by `health`: its default unless a test sets it.
        .env_remove("WORKFLOW_RUN_LEASE_MS");
    command
}

/// Runs `outbox args` on `db` and the queues of `namespace` in `redis`.
fn outbox(db: &TestDatabase, redis: &TestRedis, namespace: &QueueNamespace, args: &[&str]) -> Run {
    Run::from(command(db, redis, namespace, args).output().unwrap())
}
