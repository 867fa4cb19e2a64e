//! What operators read: `LOG_FORMAT=json` lines carry a job's queue, task
//! id, event id, tenant and attempt; `/metrics` describes every metric it
//! serves (help, type, histogram buckets) as the catalog and the docs say.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use outbox_worker::catalog::{Kind, METRICS};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_store::{self as store, NewExecution, TriggerKind, WorkflowStatus};
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

/// A trace context a plain-SQL producer writes.
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// A pool no larger than the dispatcher's loops is named at start-up: under
/// a backlog every pooled connection could be a loop's, and handlers would
/// wait. With the defaults (10 connections, 4 loops) nothing is said.
// Break checked: with the warning's condition inverted, the first start
// says nothing and the test fails waiting for its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_no_larger_than_the_dispatch_loops_is_named_at_start_up() {
    let stack = Stack::new().await;
    let small = stack
        .start(
            GENERAL,
            &[("LOG_FORMAT", "text"), ("DATABASE_POOL_SIZE", "4")],
        )
        .await;
    let line = small
        .wait_line("OUTBOX_DISPATCH_LOOPS is not below DATABASE_POOL_SIZE")
        .await;
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("loops=4") && line.contains("pool_size=4"),
        "{line}"
    );
    drop(small);

    let default = stack
        .start_without(GENERAL, &["DATABASE_POOL_SIZE"], &[("LOG_FORMAT", "text")])
        .await;
    let output = default.wait_output("dispatcher started").await;
    assert!(
        !output.contains("OUTBOX_DISPATCH_LOOPS"),
        "warned with the default pool: {output}"
    );
}

/// A `WORKER_CONCURRENCY` above `DATABASE_POOL_SIZE` is named at start-up
/// with the numbers: the jobs of one database-using queue alone could ask
/// for more connections than the pool holds (300 against 10 made workflow
/// jobs fail with "Timed out in bb8"). With the defaults (10 jobs per
/// queue, 10 connections) nothing is said.
// Break checked: with the condition made `concurrency >= pool` the default
// start warns and the test fails on its last assertion; with the warning
// never given it fails waiting for the first line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_above_the_pool_is_named_at_start_up_with_the_numbers() {
    let stack = Stack::new().await;
    for (binary, expected) in [
        (
            GENERAL,
            "lets up to 900 jobs of the general group's database-using queues \
             (outbox.workflow, outbox.plugin-hook, toolctrl.plugin-invoke) hold a Postgres \
             connection at once, 300 of one queue alone, but DATABASE_POOL_SIZE=10, and the \
             dispatcher's 4 loops also take one each",
        ),
        (
            MAIL,
            "lets up to 600 jobs of the mail group's database-using queues \
             (outbox.webhook, outbox.marketing) hold a Postgres connection at once, 300 of one \
             queue alone, but DATABASE_POOL_SIZE=10: jobs past the pool wait",
        ),
    ] {
        let worker = stack
            .start(
                binary,
                &[
                    ("LOG_FORMAT", "text"),
                    ("WORKER_CONCURRENCY", "300"),
                    ("DATABASE_POOL_SIZE", "10"),
                ],
            )
            .await;
        let line = worker.wait_line("WORKER_CONCURRENCY=300 lets up to").await;
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains(expected), "{binary}: {line}");
        assert!(line.contains("Timed out in bb8"), "{line}");
    }

    let default = stack
        .start_without(GENERAL, &["DATABASE_POOL_SIZE"], &[("LOG_FORMAT", "text")])
        .await;
    let output = default.wait_output("dispatcher started").await;
    assert!(
        !output.contains("WORKER_CONCURRENCY="),
        "warned with the default pool and concurrency: {output}"
    );
}

/// Text logs written to a pipe or a file carry no terminal colour codes:
/// a log collector would store them as text, and a search for
/// `deleted=100` would not find `deleted\x1b[2m=\x1b[0m100`.
// Break checked: the text layer without `with_ansi(…is_terminal())` writes
// escape codes around each field name here, and the line no longer holds
// `group="general"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_on_a_pipe_carry_no_colour_codes() {
    let stack = Stack::new().await;
    let general = stack.start(GENERAL, &[("LOG_FORMAT", "text")]).await;

    let line = general.wait_line("worker started").await;
    assert!(line.contains(" group=\"general\""), "{line}");
    assert!(
        !general.output().contains('\u{1b}'),
        "a colour code in piped text logs: {line:?}"
    );
}

/// Inserts a `webhook.order.created` event of `acme` by plain SQL, with
/// [`TRACEPARENT`].
async fn insert_traced_webhook_event(stack: &Stack) {
    stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, traceparent) \
             VALUES ('acme', 'webhook.order.created', '{{\"orderId\": 7}}', '{TRACEPARENT}')"
        ))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_export_the_producers_trace_reaches_the_job_lines_and_the_webhook() {
    let stack = Stack::new().await;
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (id, tenant_id, url, secret) \
             VALUES (gen_random_uuid(), 'acme', '{}', 's')",
            stack.http.url_for("/hook")
        ))
        .await;
    let mail = stack.start(MAIL, &[("LOG_FORMAT", "json")]).await;
    let _general = stack.start(GENERAL, &[]).await;
    insert_traced_webhook_event(&stack).await;

    let requests = stack
        .http
        .wait_for_requests("/hook", 1, Duration::from_secs(60))
        .await;
    // Neither worker exports spans: the producer's context is passed on as is.
    assert_eq!(requests[0].header("traceparent"), Some(TRACEPARENT));
    let output = mail.wait_output("webhook delivered").await;
    let delivered = output
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "webhook delivered")
        .expect("a webhook delivered line");
    assert_eq!(delivered["span"]["trace_id"], TRACE_ID, "{delivered}");
    assert_eq!(delivered["span"]["queue"], "outbox.webhook", "{delivered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_otlp_endpoint_the_worker_exports_the_spans_of_the_trace() {
    let stack = Stack::new().await;
    let collector = stack.http.url_for("/collector");
    let _general = stack
        .start(
            GENERAL,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()),
                // The SDK's batch delay (5 s by default), for a quicker test.
                ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ],
        )
        .await;
    // An audit event: the general worker dispatches and handles it.
    stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, traceparent) \
             VALUES ('acme', 'audit.user.login', '{{\"user\": \"ada\"}}', '{TRACEPARENT}')"
        ))
        .await;
    let exported = stack
        .exported_spans_of(TRACE_ID, "spans of the producer's trace at the collector")
        .await;
    let request = &exported[0];
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.header("content-type"),
        Some("application/x-protobuf")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_help_types_and_buckets_as_the_catalog_lists_them() {
    let stack = Stack::new().await;
    let general = stack.start(GENERAL, &[]).await;
    stack
        .publish(NewOutboxEvent::new("acme", "audit.user.login", json!({})))
        .await;
    // A hand-off and a handled job: both histograms have samples.
    let body = stack
        .wait_metric(&general, "outbox_subscriber_job_duration_seconds_bucket")
        .await;
    let body = if body.contains("outbox_dispatch_handoff_latency_seconds_bucket") {
        body
    } else {
        stack
            .wait_metric(&general, "outbox_dispatch_handoff_latency_seconds_bucket")
            .await
    };
    // The first delivery of the event also timed commit to handler start.
    assert!(
        body.contains("outbox_subscriber_commit_to_start_seconds_count{queue=\"outbox.audit\"} 1"),
        "{body}"
    );
    let mut typed = 0;
    for line in body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split_whitespace().skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        let (_, expected, _) = METRICS
            .iter()
            .find(|(n, _, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is served but not in the catalog"));
        assert_eq!(kind, expected.as_str(), "{name}");
        assert!(
            body.contains(&format!("# HELP {name} ")),
            "{name} has no help text"
        );
        typed += 1;
    }
    assert!(typed >= 10, "only {typed} metrics served:\n{body}");
    for (name, kind, _) in METRICS {
        if *kind == Kind::Histogram && body.contains(&format!("# TYPE {name} ")) {
            assert!(
                body.contains(&format!("{name}_bucket{{")) && body.contains("le=\"0.001\""),
                "{name} has no buckets:\n{body}"
            );
        }
    }
    assert!(
        body.lines().any(|l| l.starts_with("outbox_build_info{")
            && l.contains("binary=\"worker-general\"")
            && l.ends_with(" 1")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_run_unchanged_for_an_hour_shows_in_the_gauges_of_running_executions() {
    let stack = Stack::new().await;
    let mut conn = stack.db.conn().await;
    let definition = WorkflowDefinition::from_value(json!({
        "blocks": [{ "id": "start", "type": "manualTrigger" }],
        "edges": []
    }))
    .unwrap();
    let workflow =
        store::save_workflow(&mut conn, "acme", "sync", WorkflowStatus::Live, &definition)
            .await
            .unwrap()
            .workflow
            .id;
    // A run left `running` by a crashed worker an hour ago (no outbox event:
    // nothing picks it up).
    let execution = store::create_execution(
        &mut conn,
        &NewExecution {
            tenant_id: "acme",
            workflow_id: workflow,
            trigger_kind: TriggerKind::Manual,
            input: &json!({}),
            trigger_event_id: None,
            allow_external_callouts: true,
        },
    )
    .await
    .unwrap()
    .unwrap();
    stack
        .sql(&format!(
            "UPDATE workflow_execution SET status = 'running', started_at = now() - interval '1 hour',
                    updated_at = now() - interval '1 hour' WHERE id = '{}'",
            execution.id
        ))
        .await;
    // No sweep during the test: it would resume the run.
    let general = stack
        .start(GENERAL, &[("WORKFLOW_SWEEP_INTERVAL_MS", "3600000")])
        .await;
    let value = |body: &str, series: &str| -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    };
    let body = common::metrics_where(&general, "the running execution in the gauges", |l| {
        value(l, "workflow_executions_active{status=\"running\"}") == Some(1.0)
    })
    .await;
    let age = value(
        &body,
        "workflow_execution_oldest_unchanged_seconds{status=\"running\"}",
    )
    .unwrap();
    assert!((3600.0..4000.0).contains(&age), "{body}");
    assert_eq!(
        value(&body, "workflow_executions_active{status=\"queued\"}"),
        Some(0.0),
        "{body}"
    );
}
