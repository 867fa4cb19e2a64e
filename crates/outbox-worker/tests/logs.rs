//! `LOG_FORMAT=json`: every log line is a JSON object, and a job's lines
//! carry its queue, task id, event id, tenant and attempt.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{GENERAL, Stack};
use outbox_publish::NewOutboxEvent;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_name_the_event_tenant_queue_and_attempt_of_each_job_line() {
    let stack = Stack::new().await;
    let general = stack.start(GENERAL, &[("LOG_FORMAT", "json")]).await;
    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "user": "ada" }),
        ))
        .await;
    let output = general.wait_output("job done").await;
    let lines: Vec<Value> = output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let done = lines
        .iter()
        .find(|l| l["fields"]["message"] == "job done")
        .expect("a job done line");
    let span = &done["span"];
    assert_eq!(span["queue"], "outbox.audit", "{done}");
    assert_eq!(span["event_id"], id.to_string(), "{done}");
    assert_eq!(span["tenant_id"], "acme", "{done}");
    assert_eq!(span["attempt"], 1, "{done}");
    assert!(span["task_id"].as_str().unwrap().contains(&id.to_string()));
    assert!(
        done["level"] == "INFO" && done["timestamp"].is_string(),
        "{done}"
    );
}

#[test]
fn an_unknown_log_format_stops_start_up_with_exit_code_2() {
    let output = std::process::Command::new(GENERAL)
        .env("LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("LOG_FORMAT") && stderr.contains("text or json"),
        "{stderr}"
    );
}
