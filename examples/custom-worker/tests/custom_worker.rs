//! The example worker as a process, against real Postgres and Redis: the
//! application's handler indexes `search.index.*` events, the
//! application's routing rule sends urgent ones to their own queue, the
//! worker serves health and metrics under its own name, and SIGTERM stops
//! it cleanly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use diesel_async::AsyncConnection;
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event};
use outbox_test_support::{ChildOutput, TestDatabase, TestRedis, eventually};
use uuid::Uuid;

/// How long the test waits for an effect.
const WAIT: Duration = Duration::from_secs(60);

/// A directory of the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("search-index-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// The document the indexer wrote for `event`, once it is there.
    fn document(&self, event: Uuid) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.0.join(format!("{event}.json"))).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The worker process, killed on drop if the test did not stop it.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn start(
    db: &TestDatabase,
    redis: &TestRedis,
    dir: Option<&Path>,
    addr: &str,
) -> (Worker, ChildOutput) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_custom-worker"));
    command.env_remove("SEARCH_INDEX_DIR");
    if let Some(dir) = dir {
        command.env("SEARCH_INDEX_DIR", dir);
    }
    let mut child = command
        .env("DATABASE_URL", db.url())
        .env("REDIS_URL", redis.url())
        .env("OUTBOX_QUEUE_PREFIX", redis.prefix())
        .env("OUTBOX_DISPATCHER_ENABLED", "true")
        .env("OUTBOX_DISPATCH_INTERVAL_MS", "200")
        .env("WORKER_HTTP_ADDR", addr)
        .env("WORKER_HEARTBEAT_MS", "1000")
        .env("WORKER_POLL_INTERVAL_MS", "200")
        .env("WORKER_SHUTDOWN_GRACE_MS", "3000")
        .env("DATABASE_POOL_SIZE", "3")
        .env(
            "RUST_LOG",
            "info,apalis=warn,apalis_core=warn,apalis_redis=warn",
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = ChildOutput::capture(&mut child);
    (Worker(child), output)
}

async fn publish(db: &TestDatabase, event_type: &str, payload: serde_json::Value) -> Uuid {
    let mut conn = db.conn().await;
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        publish_outbox_event(&tx, NewOutboxEvent::new("acme", event_type, payload)).await
    })
    .await
    .unwrap()
    .id()
}

/// The operator CLI `outbox` (another package's binary, next to this
/// one's), as the workspace's test build makes it: under `cargo nextest
/// run --workspace` that build is done and this finds it fresh at once.
/// A `cargo build` of the CLI alone would resolve other features, build
/// it again (more than a minute) and swap the binary the CLI's own tests
/// are running.
fn outbox_cli() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<this test> → target/<profile>/outbox, built
    // with the profile this test was built with.
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let mut build = Command::new(env!("CARGO"));
    build.args(["test", "--no-run", "--workspace", "--quiet"]);
    match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            build.arg("--release");
        }
        Some(other) => {
            build.args(["--profile", other]);
        }
    }
    let status = build.status().unwrap();
    assert!(
        status.success(),
        "cargo's test build of the workspace failed"
    );
    profile_dir.join("outbox")
}

/// `outbox <args> --json` against the test's database and Redis, parsed.
fn outbox_json(db: &TestDatabase, redis: &TestRedis, args: &[&str]) -> serde_json::Value {
    let output = Command::new(outbox_cli())
        .args(args)
        .arg("--json")
        .env("DATABASE_URL", db.url())
        .env("REDIS_URL", redis.url())
        .env("OUTBOX_QUEUE_PREFIX", redis.prefix())
        .env_remove("OUTBOX_ROUTES_FILE")
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "outbox {args:?}: {e}; stdout {} stderr {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The body of `GET http://<addr><path>` when it answers 200.
async fn get(addr: &str, path: &str) -> Option<String> {
    let response = reqwest::get(format!("http://{addr}{path}")).await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_indexes_search_events_through_its_handler_and_its_route() {
    let (db, redis, dir) = (
        TestDatabase::new().await,
        TestRedis::new().await,
        TempDir::new(),
    );
    let addr = free_addr();
    let (mut worker, output) = start(&db, &redis, Some(&dir.0), &addr);
    eventually("the worker to be ready", WAIT, async || {
        get(&addr, "/readyz").await.is_some()
    })
    .await;

    let bulk = publish(
        &db,
        "search.index.document.updated",
        serde_json::json!({ "documentId": 7, "title": "Hello" }),
    )
    .await;
    let urgent = publish(
        &db,
        "search.index.urgent.takedown",
        serde_json::json!({ "documentId": 8 }),
    )
    .await;
    // A built-in handler of the general group still runs beside them.
    let audit = publish(
        &db,
        "audit.user.login",
        serde_json::json!({ "userId": "u1" }),
    )
    .await;

    eventually("both documents to be indexed", WAIT, async || {
        dir.document(bulk).is_some() && dir.document(urgent).is_some()
    })
    .await;
    let document = dir.document(bulk).unwrap();
    assert_eq!(document["queue"], "outbox.search-index");
    assert_eq!(document["event_type"], "search.index.document.updated");
    assert_eq!(document["payload"]["title"], "Hello");
    assert_eq!(
        dir.document(urgent).unwrap()["queue"],
        custom_worker::URGENT_QUEUE
    );

    let mut conn = db.conn().await;
    eventually("the audit entry", WAIT, async || {
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        use outbox_model::schema::audit_log;
        audit_log::table
            .filter(audit_log::outbox_event_id.eq(audit))
            .count()
            .get_result::<i64>(&mut conn)
            .await
            .unwrap()
            == 1
    })
    .await;

    // The operator CLI, told nothing of the application, follows its
    // queue: the worker recorded its subscriber at start.
    let health = outbox_json(&db, &redis, &["health"]);
    let urgent_health = health["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == custom_worker::URGENT_QUEUE)
        .unwrap_or_else(|| panic!("outbox health lacks the application's queue: {health}"));
    assert_eq!(urgent_health["done"], 1, "{urgent_health}");
    let reconcile = outbox_json(&db, &redis, &["reconcile", "--dry-run"]);
    let urgent_reconcile = reconcile["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == custom_worker::URGENT_QUEUE)
        .unwrap_or_else(|| panic!("outbox reconcile lacks the application's queue: {reconcile}"));
    assert_eq!(urgent_reconcile["counts"]["checked"], 1, "{reconcile}");
    assert_eq!(urgent_reconcile["counts"]["missing"], 0, "{reconcile}");

    let metrics = get(&addr, "/metrics").await.unwrap();
    assert!(
        metrics.contains("binary=\"custom-worker\""),
        "the build info names the application's binary"
    );
    assert!(
        metrics.contains(&format!("queue=\"{}\"", custom_worker::URGENT_QUEUE)),
        "the application's queue is measured"
    );

    let status = Command::new("kill")
        .args(["-TERM", &worker.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exit = None;
    eventually("the worker to exit", WAIT, async || {
        exit = worker.0.try_wait().unwrap();
        exit.is_some()
    })
    .await;
    assert_eq!(exit.unwrap().code(), Some(0), "{}", output.text());
    assert!(
        output.text().contains("worker stopped cleanly"),
        "{}",
        output.text()
    );
}

#[test]
fn the_help_names_the_application_and_lists_the_worker_variables() {
    let output = Command::new(env!("CARGO_BIN_EXE_custom-worker"))
        .env_remove("SEARCH_INDEX_DIR")
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("custom-worker"), "{help}");
    assert!(help.contains("OUTBOX_DISPATCHER_ENABLED"), "{help}");
    // The subscriber's registration names its queues in the help.
    assert!(
        help.contains(&format!(
            "Added by the application: the queues outbox.search-index, {}.",
            custom_worker::URGENT_QUEUE
        )),
        "{help}"
    );
}

#[tokio::test]
async fn a_missing_index_directory_stops_start_up_naming_the_variable() {
    let (db, redis) = (TestDatabase::new().await, TestRedis::new().await);
    let (mut worker, output) = start(&db, &redis, None, &free_addr());
    let mut exit = None;
    eventually("the worker to exit", WAIT, async || {
        exit = worker.0.try_wait().unwrap();
        exit.is_some()
    })
    .await;
    assert_eq!(exit.unwrap().code(), Some(2), "{}", output.text());
    eventually("the message", WAIT, async || {
        output.text().contains("SEARCH_INDEX_DIR")
    })
    .await;
}
