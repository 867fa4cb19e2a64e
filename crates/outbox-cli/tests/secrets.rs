//! Secrets never reach the `outbox` CLI's output: with a password in
//! `DATABASE_URL` and `REDIS_URL` (a Redis that requires it), every command
//! and every connection error prints the URLs with the password hidden, and
//! `outbox dead` shows a dead job's endpoint by its origin, even when the
//! reason was stored with the full URL and its token (as older workers did).
//!
//! The worker side (real worker binaries, their logs and what they store) is
//! `crates/outbox-worker/tests/secrets.rs`: Cargo gives a test the path of
//! the binaries of its own package only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use diesel_async::RunQueryDsl;
use outbox_queue::{QueueNamespace, RedisSettings, push_raw, queues};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, WorkerSettings};
use outbox_test_support::{RedisProcess, TestDatabase, eventually, with_database};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const DB_PASSWORD: &str = "s3cr3t-db-pw";
const REDIS_PASSWORD: &str = "s3cr3t-redis-pw";
const TOKEN: &str = "tok-9f8e7d";
const SECRETS: [&str; 3] = [DB_PASSWORD, REDIS_PASSWORD, TOKEN];

/// `url` (`postgres://user@host/db`) with `password` for its user.
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    match rest.split_once('@') {
        Some((user, host)) => format!("{scheme}://{user}:{password}@{host}"),
        None => format!("{scheme}://postgres:{password}@{rest}"),
    }
}

/// Dead-letters every job with a reason that names the full endpoint URL.
struct LegacyWebhook;

impl JobHandler for LegacyWebhook {
    type Job = Value;

    fn queue(&self) -> &str {
        queues::WEBHOOK
    }

    async fn handle(&self, _job: Value, _meta: &JobMeta) -> Result<(), JobError> {
        Err(JobError::permanent(format!(
            "https://hooks.example.com/services/{TOKEN}?token={TOKEN}: peer answered 410"
        )))
    }
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: uuid::Uuid,
}

/// Runs `outbox` with `env`; returns its exit code and everything it printed.
fn outbox(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "`outbox {what}` printed the secret {secret:?}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_cli_output() {
    let db = TestDatabase::new().await;
    let redis = RedisProcess::start_with_password(REDIS_PASSWORD).await;
    let namespace = QueueNamespace::prefixed("cli-secrets:");
    let database_url = with_password(db.url(), DB_PASSWORD);
    let redis_url = redis.url();

    // One dead webhook job, its reason naming the URL with its token.
    let conn = outbox_queue::connect(&RedisSettings::new(redis_url.as_str())).unwrap();
    let mut push = conn.clone();
    push_raw(
        &mut push,
        &namespace,
        queues::WEBHOOK,
        &[("outbox:legacy".into(), b"{}".to_vec())],
    )
    .await
    .unwrap();
    let group = HandlerGroup::new().with(LegacyWebhook).unwrap();
    let settings = WorkerSettings {
        poll_interval: Duration::from_millis(50),
        ..WorkerSettings::default()
    };
    let shutdown = CancellationToken::new();
    let worker = {
        let (namespace, token) = (namespace.clone(), shutdown.clone());
        tokio::spawn(async move { group.run(conn, &namespace, &settings, token).await })
    };
    let mut reader = outbox_queue::connect(&RedisSettings::new(redis_url.as_str())).unwrap();
    eventually(
        "the webhook job to die",
        Duration::from_secs(30),
        async || {
            outbox_queue::dead_jobs(&mut reader, &namespace, queues::WEBHOOK, 10)
                .await
                .unwrap()
                .len()
                == 1
        },
    )
    .await;
    shutdown.cancel();
    worker.await.unwrap().unwrap();

    // One FAILED row, for list and show.
    let id = diesel::sql_query(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, retries, last_error)
         VALUES ('acme', 'webhook.order.created', '{}', 'FAILED', 7, 'hand-off failed: Redis error: connection refused')
         RETURNING id",
    )
    .get_result::<IdRow>(&mut db.conn().await)
    .await
    .unwrap()
    .id
    .to_string();

    let secret_env = [
        ("DATABASE_URL", database_url.as_str()),
        ("REDIS_URL", redis_url.as_str()),
        ("OUTBOX_QUEUE_PREFIX", namespace.prefix()),
    ];
    let (code, dead) = outbox(&secret_env, &["dead", queues::WEBHOOK]);
    assert_eq!(code, 0, "{dead}");
    assert!(
        dead.contains("outbox:legacy")
            && dead.contains("https://hooks.example.com/…: peer answered 410"),
        "{dead}"
    );
    assert_no_secret("dead", &dead);
    let (code, dead_json) = outbox(&secret_env, &["dead", queues::WEBHOOK, "--json"]);
    assert_eq!(code, 0, "{dead_json}");
    let json: Value = serde_json::from_str(&dead_json).unwrap();
    assert_eq!(
        json["dead"][0]["reason"].as_str().unwrap(),
        "{\"Err\":\"AbortError: https://hooks.example.com/…: peer answered 410\"}"
    );
    assert_no_secret("dead --json", &dead_json);

    for args in [
        vec!["health"],
        vec!["health", "--json"],
        vec!["stats"],
        vec!["list", "--status", "failed"],
        vec!["list", "--json"],
        vec!["show", id.as_str()],
        vec!["show", id.as_str(), "--json"],
    ] {
        let (code, output) = outbox(&secret_env, &args);
        assert!(code == 0 || code == 1, "{args:?}: {output}");
        assert_no_secret(&args.join(" "), &output);
    }
    let (_, health) = outbox(&secret_env, &["health"]);
    assert!(health.contains("1 dead job(s)"), "{health}");
    let (_, list) = outbox(&secret_env, &["list", "--status", "failed"]);
    assert!(list.contains(&id), "{list}");

    // Connection errors name the server, password hidden.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let missing_database = with_database(&database_url, "outbox_no_such_database");
    let unreachable_redis = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{closed}");
    let invalid_redis = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:notaport");
    // (environment, arguments, what the error shows)
    let cases = [
        (
            vec![("DATABASE_URL", missing_database.as_str())],
            vec!["list"],
            "cannot connect to Postgres at postgres://postgres:***@",
        ),
        (
            vec![],
            vec![
                "--database-url",
                missing_database.as_str(),
                "show",
                id.as_str(),
            ],
            "cannot connect to Postgres at postgres://postgres:***@",
        ),
        (
            vec![("REDIS_URL", unreachable_redis.as_str())],
            vec!["health"],
            "from Redis at redis://:***@127.0.0.1:",
        ),
        (
            vec![("REDIS_URL", unreachable_redis.as_str())],
            vec!["dead", queues::WEBHOOK],
            "from Redis at redis://:***@127.0.0.1:",
        ),
        (
            vec![("REDIS_URL", invalid_redis.as_str())],
            vec!["health"],
            "invalid Redis URL \"redis://:***@127.0.0.1:notaport\"",
        ),
    ];
    for (env, args, shown) in cases {
        let (code, output) = outbox(&env, &args);
        assert_eq!(code, 2, "{args:?}: {output}");
        assert!(output.contains(shown), "{args:?}: {output}");
        assert_no_secret(&args.join(" "), &output);
    }
}
