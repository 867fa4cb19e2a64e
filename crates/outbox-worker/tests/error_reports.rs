//! Error reports: with `SENTRY_DSN` pointing at a local HTTP endpoint, an
//! unrouted event reaches it as a Sentry event of level error, tagged with
//! the event id, tenant and release, and without the database password.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, Stack};
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
            &[("SENTRY_DSN", &dsn), ("DATABASE_URL", &database_url)],
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
