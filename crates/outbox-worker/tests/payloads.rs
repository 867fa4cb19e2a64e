//! Payloads arrive as the exact JSON text Postgres holds, through the real
//! binaries: integers past 64 bits and long decimals keep every digit in
//! `audit_log` and in webhook bodies, and payloads `serde_json::Value`
//! cannot hold at all (200 levels of nesting, `1e400`) stall nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use outbox_queue::queues;

const WAIT: Duration = Duration::from_secs(60);

const PRECISE: &str = r#"{"actor": "ada", "id": 123456789012345678901234567, "amount": 0.1000000000000000055511151231257827}"#;

fn deep() -> String {
    format!(
        r#"{{"actor": "bob", "deep": {}1{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    )
}

const HUGE: &str = r#"{"actor": "cy", "huge": 1e400}"#;

#[derive(diesel::QueryableByName)]
struct Pair {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    copy: String,
}

async fn insert(stack: &Stack, event_type: &str, payload: &str) {
    let mut conn = stack.db.conn().await;
    diesel::sql_query(
        "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('acme', $1, $2::jsonb)",
    )
    .bind::<Text, _>(event_type)
    .bind::<Text, _>(payload)
    .execute(&mut conn)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_keep_the_exact_payload_and_awkward_payloads_stall_nothing() {
    let stack = Stack::new().await;
    let _general = stack.start(GENERAL, &[]).await;
    let deep = deep();
    for payload in [PRECISE, deep.as_str(), HUGE, r#"{"actor": "dee"}"#] {
        insert(&stack, "audit.user.login", payload).await;
    }
    stack.wait_count("SELECT count(*) FROM audit_log", 4).await;

    let mut conn = stack.db.conn().await;
    let pairs: Vec<Pair> = diesel::sql_query(
        "SELECT e.payload::text AS source, a.payload::text AS copy
         FROM outbox_event e JOIN audit_log a ON a.outbox_event_id = e.id",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(pairs.len(), 4);
    for pair in &pairs {
        assert_eq!(
            pair.copy, pair.source,
            "audit_log keeps the payload exactly"
        );
    }
    assert!(
        pairs
            .iter()
            .any(|p| p.copy.contains("123456789012345678901234567")
                && p.copy.contains("0.1000000000000000055511151231257827")),
        "{:?}",
        pairs.iter().map(|p| &p.copy).collect::<Vec<_>>()
    );
    // The actor is read from every payload serde_json can decode; the
    // others are still recorded, without it.
    stack
        .wait_count(
            "SELECT count(*) FROM audit_log WHERE actor IN ('ada', 'dee')",
            2,
        )
        .await;
    stack
        .wait_count("SELECT count(*) FROM outbox_event WHERE status = 'DONE'", 4)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_bodies_carry_the_exact_payload() {
    let stack = Stack::new().await;
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret, event_types)
             VALUES ('acme', '{}', 'secret-a', '{{}}')",
            stack.http.url_for("/hook")
        ))
        .await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;
    let deep = deep();
    insert(&stack, "webhook.order.created", PRECISE).await;
    insert(&stack, "webhook.order.shipped", &deep).await;
    stack.wait_done(queues::WEBHOOK, 2).await;
    stack.http.wait_for_requests("/hook", 2, WAIT).await;

    let mut conn = stack.db.conn().await;
    let stored: Vec<Pair> =
        diesel::sql_query("SELECT event_type AS source, payload::text AS copy FROM outbox_event")
            .load(&mut conn)
            .await
            .unwrap();
    let requests = stack.http.requests_to("/hook");
    assert_eq!(requests.len(), 2);
    for row in stored {
        let request = requests
            .iter()
            .find(|r| r.body_text().contains(&row.source))
            .unwrap_or_else(|| panic!("no request for {}", row.source));
        assert!(
            request
                .body_text()
                .contains(&format!(r#""data":{}"#, row.copy)),
            "the body carries the payload text unchanged:\nrow: {}\nbody: {}",
            row.copy,
            request.body_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_request_serde_json_cannot_read_is_dead_lettered_with_the_reason() {
    let stack = Stack::new().await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;
    insert(
        &stack,
        "mail.user.welcome",
        r#"{"to": "ada@example.com", "subject": "Hi", "text": "Hello", "n": 1e400}"#,
    )
    .await;
    insert(
        &stack,
        "mail.user.welcome",
        r#"{"to": "bob@example.com", "subject": "Hi", "text": "Hello"}"#,
    )
    .await;
    stack.wait_dead(queues::MAIL, 1).await;
    let mails = stack.smtp.wait_for_messages(1, WAIT).await;
    assert_eq!(
        mails[0].to,
        vec!["bob@example.com"],
        "the readable one went out"
    );
    let mut redis =
        outbox_queue::connect(&outbox_queue::RedisSettings::new(stack.redis.url())).unwrap();
    let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, queues::MAIL, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let reason = dead[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("mail request payload cannot be read")
            && reason.contains("number out of range"),
        "{reason}"
    );
}
