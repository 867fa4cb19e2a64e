//! Error reports: with `SENTRY_DSN` pointing at a local HTTP endpoint, an
//! unrouted event reaches it as a Sentry event of level error, tagged with
//! the event id, tenant and release, and without the database password.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use serde_json::{Value, json};

/// The event items of a Sentry envelope (newline-separated JSON: the
/// envelope header, then an item header and its payload per item).
fn events(envelope: &str) -> Vec<Value> {
    let lines: Vec<Value> = envelope
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    lines
        .windows(2)
        .filter(|w| w[0]["type"] == "event")
        .map(|w| w[1].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrouted_event_is_reported_to_sentry_with_its_tags_and_no_password() {
    let stack = Stack::new().await;
    let password = "db-password-never-sent";
    // Postgres trusts local connections: the password is carried, not checked.
    let database_url =
        stack
            .db
            .url()
            .replacen("://postgres@", &format!("://postgres:{password}@"), 1);
    assert!(database_url.contains(password), "{database_url}");
    let dsn = format!("http://publickey@127.0.0.1:{}/42", stack.http.port());
    let _general = stack
        .start(
            GENERAL,
            &[
                ("SENTRY_DSN", &dsn),
                ("DATABASE_URL", &database_url),
                // Dead-lettered at once, not after waiting for a route.
                ("OUTBOX_UNROUTED_GRACE_SECONDS", "0"),
            ],
        )
        .await;
    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "nobody.routes.this",
            json!({ "note": "no rule" }),
        ))
        .await;

    let requests = stack
        .http
        .wait_for_requests("/api/42/envelope/", 1, Duration::from_secs(60))
        .await;
    let bodies: Vec<String> = requests.iter().map(|r| r.body_text()).collect();
    let reported: Vec<Value> = bodies.iter().flat_map(|b| events(b)).collect();
    let unrouted = reported
        .iter()
        .find(|e| {
            e["message"]
                .as_str()
                .or_else(|| e["logentry"]["message"].as_str())
                .is_some_and(|m| m.contains("no routing rule"))
        })
        .unwrap_or_else(|| panic!("no unrouted event among {bodies:?}"));
    // The protocol leaves the level out when it is `error`, its default.
    assert_eq!(
        unrouted["level"].as_str().unwrap_or("error"),
        "error",
        "{unrouted}"
    );
    assert_eq!(
        unrouted["tags"]["outbox.event_id"],
        id.to_string(),
        "{unrouted}"
    );
    assert_eq!(unrouted["tags"]["tenant"], "acme", "{unrouted}");
    assert_eq!(
        unrouted["extra"]["event_type"], "nobody.routes.this",
        "{unrouted}"
    );
    assert!(
        unrouted["release"]
            .as_str()
            .is_some_and(|r| r.starts_with("worker-general@")),
        "{unrouted}"
    );
    for body in &bodies {
        assert!(!body.contains(password), "the password was sent: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_carry_the_trace_id_of_the_row_or_job_they_concern() {
    let stack = Stack::new().await;
    let dsn = format!("http://publickey@127.0.0.1:{}/42", stack.http.port());
    stack.http.set_default("/gone", 410);
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (id, tenant_id, url, secret) \
             VALUES (gen_random_uuid(), 'acme', '{}', 's')",
            stack.http.url_for("/gone")
        ))
        .await;
    let _general = stack
        .start(
            GENERAL,
            &[("SENTRY_DSN", &dsn), ("OUTBOX_UNROUTED_GRACE_SECONDS", "0")],
        )
        .await;
    let _mail = stack.start(MAIL, &[("SENTRY_DSN", &dsn)]).await;
    // Written by plain SQL with the producers' trace contexts: one no rule
    // routes (the dispatcher reports it), one whose endpoint answers 410
    // (the job dies; the mail worker reports it).
    let unrouted_trace = "0af7651916cd43dd8448eb211c80319c";
    let dead_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, traceparent) VALUES \
             ('acme', 'nobody.routes.this', '{{}}', '00-{unrouted_trace}-b7ad6b7169203331-01'), \
             ('acme', 'webhook.order.created', '{{}}', '00-{dead_trace}-00f067aa0ba902b7-01')"
        ))
        .await;

    let reported = || {
        stack
            .http
            .requests_to("/api/42/envelope/")
            .iter()
            .flat_map(|r| events(&r.body_text()))
            .collect::<Vec<Value>>()
    };
    let message_of = |e: &Value| {
        e["message"]
            .as_str()
            .or_else(|| e["logentry"]["message"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    outbox_test_support::eventually("both reports", Duration::from_secs(60), async || {
        let all = reported();
        all.iter()
            .any(|e| message_of(e).contains("no routing rule"))
            && all
                .iter()
                .any(|e| message_of(e).contains("moved to the dead set"))
    })
    .await;
    let all = reported();
    let unrouted = all
        .iter()
        .find(|e| message_of(e).contains("no routing rule"))
        .unwrap();
    assert_eq!(unrouted["tags"]["trace_id"], unrouted_trace, "{unrouted}");
    let dead = all
        .iter()
        .find(|e| message_of(e).contains("moved to the dead set"))
        .unwrap();
    assert_eq!(dead["tags"]["trace_id"], dead_trace, "{dead}");
    assert_eq!(dead["tags"]["queue"], "outbox.webhook", "{dead}");
}
