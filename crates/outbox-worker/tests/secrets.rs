//! Secrets never leave the worker processes: both binaries run a full
//! pipeline with a password in every connection URL and a token in the path
//! and query of a webhook endpoint, and nothing they print, and nothing they
//! store in Redis or Postgres, contains one of those secrets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{GENERAL, MAIL, Stack, free_addr};
use outbox_publish::NewOutboxEvent;
use outbox_queue::{QueueNamespace, RedisSettings, queues};
use outbox_test_support::{RedisProcess, SmtpSink, eventually};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

const DB_PASSWORD: &str = "s3cr3t-db-pw";
const REDIS_PASSWORD: &str = "s3cr3t-redis-pw";
const SMTP_PASSWORD: &str = "s3cr3t-smtp-pw";
const TOKEN: &str = "tok-9f8e7d";
const SECRETS: [&str; 4] = [DB_PASSWORD, REDIS_PASSWORD, SMTP_PASSWORD, TOKEN];

/// `url` (`postgres://user@host/db`) with `password` for its user.
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    match rest.split_once('@') {
        Some((user, host)) => format!("{scheme}://{user}:{password}@{host}"),
        None => format!("{scheme}://postgres:{password}@{rest}"),
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} contains the secret {secret:?}:\n{text}"
        );
    }
}

/// Every key and value in the Redis at `url`.
async fn redis_dump(url: &str) -> String {
    let mut conn = outbox_queue::connect(&RedisSettings::new(url)).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut dump = String::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let values: Vec<String> = match kind.as_str() {
            "string" => vec![
                redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap(),
            ],
            "hash" => redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap(),
            "list" => redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap(),
            "set" => redis::cmd("SMEMBERS")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap(),
            "zset" => redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap(),
            _ => Vec::new(),
        };
        dump.push_str(&format!("{key} ({kind}): {}\n", values.join(" | ")));
    }
    dump
}

/// Runs `binary` with the stack's environment plus `extra` until it exits;
/// returns its exit code and everything it printed.
fn run_to_exit(stack: &Stack, binary: &str, extra: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(binary);
    command
        .envs(stack.env())
        .env("WORKER_HTTP_ADDR", free_addr());
    for (k, v) in extra {
        command.env(k, v);
    }
    let output = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_output_redis_or_postgres() {
    let stack = Stack::new().await;
    let redis = RedisProcess::start_with_password(REDIS_PASSWORD).await;
    let smtp = SmtpSink::start_with_auth("mailer", SMTP_PASSWORD).await;
    let database_url = with_password(stack.db.url(), DB_PASSWORD);
    let redis_url = redis.url();
    let smtp_url = format!("smtp://mailer:{SMTP_PASSWORD}@127.0.0.1:{}", smtp.port());
    assert!(redis_url.contains(REDIS_PASSWORD));

    // acme's endpoint answers 500, then 410: one retry, then the dead set.
    let hook_path = format!("/hooks/{TOKEN}");
    stack.http.respond(&hook_path, vec![500]);
    stack.http.set_default(&hook_path, 410);
    let hook = format!("{}?token={TOKEN}", stack.http.url_for(&hook_path));
    // globex's endpoint refuses connections: reqwest's error names the URL.
    let unreachable = format!("http://{}/hooks/{TOKEN}?token={TOKEN}", free_addr());
    // initech's endpoint and the jira plugin accept; the slack plugin's
    // endpoint does not parse.
    let ok_path = format!("/ok/{TOKEN}");
    let ok = format!("{}?token={TOKEN}", stack.http.url_for(&ok_path));
    let broken = format!("http://hooks example.com/{TOKEN}");
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES
               ('acme', '{hook}', 's1'), ('globex', '{unreachable}', 's2'), ('initech', '{ok}', 's3');
             INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret) VALUES
               ('acme', 'slack', 'workflow.executed', '{broken}', 'k1'),
               ('acme', 'jira', 'workflow.executed', '{ok}', 'k2')"
        ))
        .await;

    let secret_env = [
        ("DATABASE_URL", database_url.as_str()),
        ("REDIS_URL", redis_url.as_str()),
        ("SMTP_URL", smtp_url.as_str()),
    ];
    let mut general = stack.start(GENERAL, &secret_env).await;
    let mut mail = stack.start(MAIL, &secret_env).await;

    for (tenant, event_type, payload) in [
        ("acme", "webhook.invoice.paid", json!({ "n": 1 })),
        ("globex", "webhook.invoice.paid", json!({ "n": 2 })),
        ("initech", "webhook.invoice.paid", json!({ "n": 3 })),
        (
            "acme",
            "plugin.hook.workflow.executed",
            json!({ "workflowId": "w1" }),
        ),
        (
            "acme",
            "mail.user.welcome",
            json!({ "to": "ada@example.com", "subject": "Hi", "text": "Hello" }),
        ),
    ] {
        stack
            .publish(NewOutboxEvent::new(tenant, event_type, payload))
            .await;
    }

    // The mail went out through the sink that requires the password, so the
    // SMTP password was read from SMTP_URL and used.
    let mails = smtp.wait_for_messages(1, WAIT).await;
    assert_eq!(mails[0].to, vec!["ada@example.com"]);
    // The token-bearing URL was really called, query included.
    let requests = stack.http.wait_for_requests(&hook_path, 2, WAIT).await;
    assert_eq!(
        requests[0].query.as_deref(),
        Some(format!("token={TOKEN}").as_str())
    );

    let namespace = QueueNamespace::prefixed(stack.namespace.prefix());
    let mut conn = outbox_queue::connect(&RedisSettings::new(redis_url.as_str())).unwrap();
    let mut dead = Vec::new();
    eventually(
        "the webhook and the plugin invocation to die",
        WAIT,
        async || {
            dead = Vec::new();
            for queue in [queues::WEBHOOK, queues::TOOLCTRL_PLUGIN_INVOKE] {
                dead.extend(
                    outbox_queue::dead_jobs(&mut conn, &namespace, queue, 10)
                        .await
                        .unwrap(),
                );
            }
            dead.len() == 2
        },
    )
    .await;
    let reasons: Vec<String> = dead
        .iter()
        .map(|d| d.reason.clone().unwrap_or_default())
        .collect();
    let origin = format!("http://127.0.0.1:{}/…", stack.http.port());
    assert!(
        reasons
            .iter()
            .any(|r| r.contains(&origin) && r.contains("peer answered 410")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("<invalid URL>: invalid URL")),
        "{reasons:?}"
    );
    // The retries of both webhooks were logged with their reasons: the 500,
    // and reqwest's connection error (which names the URL unless stripped).
    mail.wait_output("peer answered 500").await;
    mail.wait_output("error sending request").await;
    // Successful deliveries are logged with their endpoint too.
    stack.http.wait_for_requests(&ok_path, 2, WAIT).await;
    mail.wait_output("webhook delivered").await;
    general.wait_output("plugin invoked").await;

    general.signal("TERM");
    mail.signal("TERM");
    assert!(general.wait_exit(WAIT).await.success());
    assert!(mail.wait_exit(WAIT).await.success());
    let general_output = general.output();
    let mail_output = mail.output();
    // The start-up logs name every server, passwords hidden.
    for output in [&general_output, &mail_output] {
        assert!(output.contains("postgres://postgres:***@"), "{output}");
        assert!(output.contains("redis://:***@127.0.0.1:"), "{output}");
    }
    assert!(
        mail_output.contains("smtp://mailer:***@127.0.0.1:"),
        "{mail_output}"
    );
    assert_no_secret("worker-general's output", &general_output);
    assert_no_secret("worker-mail's output", &mail_output);
    assert_no_secret("Redis", &redis_dump(&redis_url).await);
    let last_errors = {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Errors {
            #[diesel(sql_type = diesel::sql_types::Text)]
            errors: String,
        }
        let mut db = stack.db.conn().await;
        diesel::sql_query(
            "SELECT coalesce(string_agg(last_error, E'\\n'), '') AS errors FROM outbox_event",
        )
        .get_result::<Errors>(&mut db)
        .await
        .unwrap()
        .errors
    };
    assert_no_secret("outbox_event.last_error", &last_errors);

    // Configuration errors name the variable and its value, password hidden;
    // so does a database that refuses the connection.
    let missing_database = outbox_test_support::with_database(
        &with_password(stack.db.url(), DB_PASSWORD),
        "outbox_no_such_database",
    );
    let cases: [(&str, &str, String, &str); 4] = [
        (
            GENERAL,
            "DATABASE_URL",
            format!("mysql://app:{DB_PASSWORD}@db/x"),
            "mysql://app:***@db/x",
        ),
        (
            GENERAL,
            "REDIS_URL",
            format!("redis://:{REDIS_PASSWORD}@127.0.0.1:notaport"),
            "redis://:***@127.0.0.1:notaport",
        ),
        (
            MAIL,
            "SMTP_URL",
            format!("bogus://mailer:{SMTP_PASSWORD}@127.0.0.1"),
            "bogus://mailer:***@127.0.0.1",
        ),
        (
            GENERAL,
            "DATABASE_URL",
            missing_database.clone(),
            "postgres://postgres:***@",
        ),
    ];
    for (binary, variable, value, shown) in &cases {
        let (code, output) = run_to_exit(&stack, binary, &[(variable, value.as_str())]);
        assert_ne!(code, Some(0), "{output}");
        assert!(output.contains(variable), "{output}");
        assert!(output.contains(shown), "{output}");
        assert_no_secret(&format!("{binary} with a bad {variable}"), &output);
    }
}
